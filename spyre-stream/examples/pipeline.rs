//! Copy in, compute, copy out across two pool streams, ordered by events
//! only: the host enqueues everything at once and waits once, at the end.
//! The README shows the part between the `README` markers.
//!
//! ```text
//! cargo run -p spyre-stream --example pipeline
//! ```

use spyre_stream::program::KernelDescriptor;
use spyre_stream::{Device, HostBuffer, LaunchOptions, SpyreEvent};

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn main() -> spyre_stream::Result<()> {
    const N: usize = 4096;
    let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let y = vec![1.0_f32; N];
    // README: begin
    let copy = spyre_stream::stream_from_pool(Device::CURRENT, 0)?;
    let compute = spyre_stream::stream_from_pool(Device::CURRENT, -1)?;
    let bytes = (N * 4) as u64;
    let x_dev = spyre_stream::allocate(Device::CURRENT, bytes)?;
    let y_dev = spyre_stream::allocate(Device::CURRENT, bytes)?;
    let out_dev = spyre_stream::allocate(Device::CURRENT, bytes)?;
    let program = spyre_stream::allocate(Device::CURRENT, 128)?;
    let axpy = KernelDescriptor::axpy(N as u64, 2.0, x_dev.start(), y_dev.start(), out_dev.start());

    // Copy in on one stream, and mark the point.
    let x_host = HostBuffer::from_vec(le_bytes(&x));
    let y_host = HostBuffer::from_vec(le_bytes(&y));
    let program_host = HostBuffer::from_vec(axpy.to_bytes().to_vec());
    copy.launch_h2d(&x_host, &x_dev, LaunchOptions::new())?;
    copy.launch_h2d(&y_host, &y_dev, LaunchOptions::new())?;
    copy.launch_h2d(&program_host, &program, LaunchOptions::new())?;
    let copied_in = SpyreEvent::with_timing()?;
    copied_in.record(copy)?;

    // Compute on another stream once the copies are done; the host does not wait.
    compute.wait_event(&copied_in)?;
    compute.launch_compute(&program, LaunchOptions::new())?;
    let computed = SpyreEvent::with_timing()?;
    computed.record(compute)?;

    // Copy out on the first stream once the compute is done.
    copy.wait_event(&computed)?;
    let out = HostBuffer::zeroed(N * 4);
    copy.launch_d2h(&out_dev, &out, LaunchOptions::new())?;
    copy.synchronize()?; // the one host wait (or `copy.synchronize_async()?.await`)

    let compute_time = copied_in.elapsed_time(&computed)?;
    println!("compute took {compute_time:?} on the device");
    // README: end
    let expected = le_bytes(
        &x.iter()
            .zip(&y)
            .map(|(x, y)| 2.0 * x + y)
            .collect::<Vec<_>>(),
    );
    assert_eq!(out.to_vec(), expected, "out = 2·x + y, bit for bit");
    for address in [&x_dev, &y_dev, &out_dev, &program] {
        spyre_stream::free(Device::CURRENT, address)?;
    }
    println!("verified {N} elements of 2·x + y");
    Ok(())
}

//! Copy in, compute, copy out across two pool streams, ordered by events
//! only: the host enqueues everything at once and waits once, at the end.
//! Device memory is held by buffers, freed when they are dropped. The
//! README shows the part between the `README` markers.
//!
//! ```text
//! cargo run -p spyre-stream --example pipeline
//! ```

use spyre_stream::program::{DESCRIPTOR_SIZE, KernelDescriptor};
use spyre_stream::{Device, DeviceBuffer, LaunchOptions, SpyreEvent};

fn main() -> spyre_stream::Result<()> {
    const N: usize = 4096;
    let x: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let y = vec![1.0_f32; N];
    // README: begin
    let copy = spyre_stream::stream_from_pool(Device::CURRENT, 0)?;
    let compute = spyre_stream::stream_from_pool(Device::CURRENT, -1)?;
    // Device buffers of `copy`, freed (in stream order) when dropped.
    let mut x_dev = DeviceBuffer::<f32>::new(copy, N)?;
    let mut y_dev = DeviceBuffer::<f32>::new(copy, N)?;
    let out_dev = DeviceBuffer::<f32>::new(copy, N)?;
    let mut program = DeviceBuffer::<u8>::new(copy, DESCRIPTOR_SIZE)?;
    let axpy = KernelDescriptor::axpy(
        N as u64,
        2.0,
        x_dev.operand()?,
        y_dev.operand()?,
        out_dev.operand()?,
    );

    // Copy in on one stream, and mark the point.
    x_dev.copy_from_host(copy, &x)?;
    y_dev.copy_from_host(copy, &y)?;
    program.copy_from_host(copy, &axpy.to_bytes())?;
    let copied_in = SpyreEvent::with_timing()?;
    copied_in.record(copy)?;

    // Compute on another stream once the copies are done; the host does not
    // wait. The compute reaches the buffers through its program: declare it.
    for buffer in [&x_dev, &y_dev, &out_dev] {
        buffer.record_stream(compute)?;
    }
    program.record_stream(compute)?;
    compute.wait_event(&copied_in)?;
    compute.launch_compute(program.address(), LaunchOptions::new())?;
    let computed = SpyreEvent::with_timing()?;
    computed.record(compute)?;

    // Copy out on the first stream once the compute is done.
    copy.wait_event(&computed)?;
    let out = out_dev.to_vec(copy)?; // the one host wait

    let compute_time = copied_in.elapsed_time(&computed)?;
    println!("compute took {compute_time:?} on the device");
    // README: end
    let expected: Vec<f32> = x.iter().zip(&y).map(|(x, y)| 2.0 * x + y).collect();
    assert_eq!(
        out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "out = 2·x + y, bit for bit"
    );
    drop((x_dev, y_dev, out_dev, program));
    assert_eq!(spyre_stream::memory_allocated(Device::CURRENT)?, 0);
    println!("verified {N} elements of 2·x + y");
    Ok(())
}

//! No engine thread outlives its runtime. The only test in this binary, so
//! the process-wide count is not disturbed by other tests running alongside.

use flex_rt::{Backend, DataFormat, HostBuffer, LaunchOptions};
use spyre_mock::{MockSystem, live_engine_threads};

#[test]
fn engine_threads_stop_when_their_runtimes_are_dropped() {
    let before = live_engine_threads();
    let system = MockSystem::builder()
        .devices(2)
        .engines(3)
        .memory_bytes(1 << 20)
        .region_bytes(1 << 18)
        .build()
        .unwrap();
    let runtimes: Vec<_> = (0..4)
        .map(|i| system.create_runtime(i % 2).unwrap())
        .collect();
    assert_eq!(live_engine_threads(), before + 12);
    for rt in &runtimes {
        let address = rt.allocate(1024).unwrap();
        let out = HostBuffer::zeroed(1024);
        let s = rt.default_stream();
        s.launch_fill(&address, 2.0, DataFormat::Fp32, LaunchOptions::new())
            .unwrap();
        s.launch_d2h(&address, &out, LaunchOptions::new()).unwrap();
        s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .unwrap();
        s.synchronize().unwrap();
        assert_eq!(&out.to_vec()[..4], &2.0f32.to_le_bytes());
    }
    // Pending work at drop time is fine too.
    runtimes[0]
        .default_stream()
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap();
    drop(runtimes);
    assert_eq!(live_engine_threads(), before);

    // Named as documented.
    let rt = system.create_runtime(1).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    rt.default_stream()
        .launch_host_callback(
            Box::new(move || {
                let _ = tx.send(std::thread::current().name().map(str::to_owned));
            }),
            LaunchOptions::new(),
        )
        .unwrap();
    let name = rx.recv().unwrap().unwrap();
    assert!(name.starts_with("spyre-mock-d1-e"), "{name}");
    drop(rt);
    assert_eq!(live_engine_threads(), before);
}

//! Fault injection and the timing model.

use std::time::{Duration, Instant};

use flex_rt::{
    Backend, HostBuffer, LaunchOptions, Runtime, Status, Stream, StreamMode, StreamPriority,
};

use super::*;

#[test]
fn runtime_creation_can_be_made_to_fail_and_cleared() {
    let system = system(1);
    let shared = system.clone();
    system.faults().set_fail_runtime_creation(true);
    let err = shared.create_runtime(0).unwrap_err();
    assert_eq!(err.status(), Status::RUNTIME_FAILED);
    assert!(err.message().contains("device 0"), "{err}");
    // A bad index is still NO_DEVICE.
    assert_eq!(
        shared.create_runtime(5).unwrap_err().status(),
        Status::NO_DEVICE
    );
    system.faults().set_fail_runtime_creation(false);
    assert!(shared.create_runtime(0).is_ok());
}

#[test]
fn stream_creation_can_be_made_to_fail() {
    let rt = runtime(1);
    rt.faults().fail_next_stream_creations(2);
    for _ in 0..2 {
        let err = rt
            .create_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
            .unwrap_err();
        assert_eq!(err.status(), Status::RUNTIME_FAILED);
    }
    let s = rt
        .create_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
        .unwrap();
    assert_eq!(s.id(), 1, "failed creations use no id");
    assert_eq!(rt.stream_count(), 2);
}

#[test]
fn the_nth_launch_can_be_refused() {
    let rt = runtime(1);
    let s = stream(&rt);
    let counters = Counters::default();
    s.fail_nth_launch(3);
    let mut results = Vec::new();
    for _ in 0..5 {
        results.push(
            s.launch_host_callback(Box::new(|| {}), counters.options())
                .map_err(|e| e.status()),
        );
    }
    assert_eq!(
        results,
        vec![Ok(()), Ok(()), Err(Status::LAUNCH_FAILED), Ok(()), Ok(())]
    );
    s.synchronize().unwrap();
    assert_eq!(counters.calls(), 4);
    assert_eq!(counters.drops(), 5);
    assert!(
        !rt.has_stream_error().unwrap(),
        "a refused launch does not fail the stream"
    );

    s.fail_nth_launch(1);
    s.fail_nth_launch(0);
    assert!(
        s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .is_ok()
    );
}

#[test]
fn a_stream_can_be_put_into_needs_shutdown() {
    let rt = runtime(1);
    let s = stream(&rt);
    assert!(!s.needs_shutdown().unwrap());
    let release = block(s);
    let counters = Counters::default();
    s.launch_host_callback(Box::new(|| panic!("must not run")), counters.options())
        .unwrap();
    s.set_needs_shutdown();
    assert!(s.needs_shutdown().unwrap());
    assert!(rt.has_stream_error().unwrap());
    let err = s
        .launch_host_callback(Box::new(|| {}), counters.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::SHUTDOWN);
    release.send(()).unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::SHUTDOWN);
    assert_eq!(counters.statuses(), vec![Status::SHUTDOWN]);
    assert_eq!(s.query().unwrap_err().status(), Status::SHUTDOWN);
    // Other streams still work.
    let other = stream(&rt);
    other
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap();
    other.synchronize().unwrap();
    assert!(!other.needs_shutdown().unwrap());
}

#[test]
fn a_failed_stream_that_needs_shutdown_keeps_its_first_error() {
    let rt = runtime(1);
    let s = stream(&rt);
    s.enqueue(Op::host_fn(|| Err("first".into())), LaunchOptions::new())
        .unwrap();
    assert!(s.synchronize().is_err());
    s.set_needs_shutdown();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
    assert_eq!(
        s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .unwrap_err()
            .status(),
        Status::SHUTDOWN
    );
}

fn elapsed(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

#[test]
fn a_stream_can_be_slowed_down() {
    let rt = runtime(2);
    let s = stream(&rt);
    s.set_slowdown(Duration::from_millis(30));
    let taken = elapsed(|| {
        for _ in 0..2 {
            s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                .unwrap();
        }
        s.synchronize().unwrap();
    });
    assert!(taken >= Duration::from_millis(60), "{taken:?}");
    s.set_slowdown(Duration::ZERO);
}

#[test]
fn the_timing_model_adds_latency_and_copy_time() {
    let rt = MockSystem::builder()
        .memory_bytes(1 << 20)
        .region_bytes(1 << 20)
        .op_latency(Duration::from_millis(20))
        .copy_bandwidth(1_000_000)
        .build()
        .unwrap()
        .create_mock_runtime(0)
        .unwrap();
    let s = rt.default_mock_stream();
    let latency_only = elapsed(|| {
        s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .unwrap();
        s.synchronize().unwrap();
    });
    assert!(
        latency_only >= Duration::from_millis(20),
        "{latency_only:?}"
    );
    let address = rt.allocate(30_000).unwrap();
    let copy = elapsed(|| {
        s.launch_h2d(&HostBuffer::zeroed(30_000), &address, LaunchOptions::new())
            .unwrap();
        s.synchronize().unwrap();
    });
    // 20 ms latency + 30 000 B at 1 MB/s = 50 ms.
    assert!(copy >= Duration::from_millis(50), "{copy:?}");
}

/// A stream that waits (device-side) for another stream's held work and is
/// then made to need shutdown fails at once: its synchronize and query give
/// `SHUTDOWN` without waiting for the other stream, as the wait holds
/// nothing of a failed stream. Before, its synchronize waited until the
/// other stream's work ended (found by attack: 5 s, the whole hold).
#[test]
fn a_stream_waiting_on_held_work_that_needs_shutdown_stops_waiting() {
    let rt = runtime(2);
    let (held, waiting) = (stream(&rt), stream(&rt));
    let release = block(held);
    let event = rt.create_event(false).unwrap();
    held.record_event(&*event, None).unwrap();
    waiting.wait_event(&*event).unwrap();
    waiting.set_needs_shutdown();
    let (result, taken) = {
        let start = Instant::now();
        (waiting.synchronize(), start.elapsed())
    };
    assert_eq!(result.unwrap_err().status(), Status::SHUTDOWN);
    assert!(
        taken < Duration::from_secs(5),
        "synchronize waited {taken:?} for the held stream"
    );
    assert!(!event.query().unwrap(), "the held stream is still held");
    drop(release);
    held.synchronize().unwrap();
}

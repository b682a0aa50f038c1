//! The system and runtime as a whole: backend, devices, fresh state,
//! stream ids, shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flex_rt::{Backend, LaunchOptions, Runtime, Status, Stream, StreamMode, StreamPriority};

use super::*;

#[test]
fn the_backend_counts_devices_and_refuses_others() {
    let system = MockSystem::builder()
        .devices(3)
        .memory_bytes(4096)
        .region_bytes(1024)
        .build()
        .unwrap();
    assert_eq!(system.name(), "mock");
    assert_eq!(system.device_count(), Ok(3));
    let rt = system.create_runtime(2).unwrap();
    assert_eq!(rt.logical_device(), 2);
    let err = system.create_runtime(3).unwrap_err();
    assert_eq!(err.status(), Status::NO_DEVICE);
    assert!(err.message().contains("logical device 3"), "{err}");
    assert!(err.message().contains("3 device(s)"), "{err}");
    assert_eq!(MockSystem::default().device_count(), Ok(1));
    let details = system.details();
    assert!(
        details.contains(&("devices", "3".to_string())),
        "{details:?}"
    );
    assert!(details.contains(&("copy_bandwidth", "unlimited".to_string())));
}

#[test]
fn every_runtime_has_fresh_state() {
    let system = system(1);
    let a = system.create_mock_runtime(0).unwrap();
    let _held = a.allocate(1000).unwrap();
    stream(&a);
    let b = system.create_mock_runtime(0).unwrap();
    assert_eq!(b.free_memory_bytes(), b.memory_bytes());
    assert_eq!(b.stream_count(), 1);
    assert_eq!(a.stream_count(), 2);
    assert!(a.free_memory_bytes() < a.memory_bytes());
}

#[test]
fn streams_have_ids_and_stable_addresses() {
    let rt = runtime(1);
    let default = rt.default_stream();
    assert_eq!(default.id(), 0);
    assert_eq!(default.priority(), StreamPriority::Normal);
    assert!(std::ptr::eq(
        rt.default_mock_stream(),
        rt.mock_stream(0).unwrap()
    ));
    let created: Vec<&dyn Stream> = (0..40)
        .map(|i| {
            let priority = if i % 2 == 0 {
                StreamPriority::High
            } else {
                StreamPriority::Normal
            };
            rt.create_stream(priority, StreamMode::StrictOrdering, i % 3 == 0)
                .unwrap()
        })
        .collect();
    for (i, s) in created.iter().enumerate() {
        assert_eq!(s.id(), i as u64 + 1);
        let mock = rt.mock_stream(s.id()).unwrap();
        assert_eq!(mock.tracks_hazards(), i % 3 == 0);
        assert_eq!(mock.mode(), StreamMode::StrictOrdering);
        assert_eq!(mock.logical_device(), 0);
        assert_eq!(Stream::priority(mock), s.priority());
    }
    assert!(rt.mock_stream(41).is_none());
    assert!(rt.mock_stream(u64::MAX).is_none());
    assert_eq!(rt.engines(), 1);
    assert!(!rt.has_stream_error().unwrap());
    assert!(format!("{rt:?}").contains("MockRuntime"));
}

#[test]
fn dropping_a_runtime_finishes_its_work_and_joins_its_engines() {
    let rt = runtime(2);
    let device = rt.device_weak();
    let calls = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let s = stream(&rt);
        s.set_slowdown(Duration::from_millis(2));
        for _ in 0..20 {
            let c = Arc::clone(&calls);
            s.launch_host_callback(
                Box::new(|| {}),
                LaunchOptions::new().on_complete(move |_| {
                    c.fetch_add(1, Ordering::SeqCst);
                }),
            )
            .unwrap();
        }
    }
    drop(rt);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        60,
        "pending work finished before the drop returned"
    );
    assert!(
        device.upgrade().is_none(),
        "engine threads still hold the device"
    );
}

/// A dropped runtime drains its work on every engine: an engine that
/// finds nothing ready while another runs work stays for what that work
/// makes ready. Here the first engine's work on `a` lets `b` go (its wait
/// on `a`'s record), then runs a host function that waits for `b`'s: on
/// one engine, `b` would run only after that host function gave up.
/// Before, the idle engine stopped at the drop's wake-up, and the host
/// function waited its 5 s in vain.
#[test]
fn a_dropped_runtime_drains_its_work_on_every_engine() {
    let rt = runtime(2);
    let (a, b) = (stream(&rt), stream(&rt));
    let event = rt.create_event(false).unwrap();
    let (started, a_running) = std::sync::mpsc::channel();
    let (b_ran, b_done) = std::sync::mpsc::channel::<()>();
    let waited = Arc::new(AtomicUsize::new(0));
    a.launch_host_callback(
        Box::new(move || {
            started.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }),
        LaunchOptions::new(),
    )
    .unwrap();
    a.record_event(&*event, None).unwrap();
    a.launch_host_callback(
        Box::new({
            let waited = Arc::clone(&waited);
            move || {
                let got = b_done.recv_timeout(Duration::from_secs(5)).is_ok();
                waited.store(if got { 1 } else { 2 }, Ordering::SeqCst);
            }
        }),
        LaunchOptions::new(),
    )
    .unwrap();
    b.wait_event(&*event).unwrap();
    b.launch_host_callback(
        Box::new(move || b_ran.send(()).unwrap()),
        LaunchOptions::new(),
    )
    .unwrap();
    // `a`'s first operation runs on one engine; the other is idle.
    a_running.recv().unwrap();
    drop(event);
    drop(rt);
    assert_eq!(
        waited.load(Ordering::SeqCst),
        1,
        "`b`'s work ran while `a`'s host function waited for it"
    );
}

/// Drops `rt` here and, once the returned sender sends, its last handle
/// inside a host callback of its own: on one of its engine threads.
fn drop_inside_its_own_callback(rt: Arc<crate::MockRuntime>) -> std::sync::mpsc::Sender<()> {
    let inner = Arc::clone(&rt);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    rt.default_mock_stream()
        .launch_host_callback(
            Box::new(move || {
                let _ = rx.recv_timeout(DEADLOCK);
                drop(inner);
            }),
            LaunchOptions::new(),
        )
        .unwrap();
    drop(rt);
    tx
}

#[test]
fn a_runtime_dropped_inside_its_own_callback_shuts_down() {
    let rt = Arc::new(runtime(2));
    let device = rt.device_weak();
    drop_inside_its_own_callback(rt).send(()).unwrap();
    let start = Instant::now();
    while device.upgrade().is_some() {
        assert!(start.elapsed() < DEADLOCK, "engines never stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A runtime dropped inside its own callback closes its device once its
/// engines have stopped, as a drop on another thread does: its events are
/// destroyed with it (flex.h), and their calls fail with `INVALID_HANDLE`.
/// (Before, only a drop that joined the engines closed the device: these
/// events answered for good.)
#[test]
fn a_runtime_dropped_inside_its_own_callback_destroys_its_events() {
    let rt = Arc::new(runtime(2));
    let event = rt.create_event(false).unwrap();
    let dropped = drop_inside_its_own_callback(rt);
    assert_eq!(event.query(), Ok(true), "the runtime lives in its callback");
    dropped.send(()).unwrap();
    let start = Instant::now();
    let closed = loop {
        match event.query() {
            Ok(_) => {
                assert!(start.elapsed() < DEADLOCK, "the event outlived its runtime");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(err) => break err,
        }
    };
    assert_eq!(closed.status(), Status::INVALID_HANDLE, "{closed}");
}

#[test]
fn from_env_uses_the_process_environment() {
    // Only checks that it runs: the variables are not set in tests, or set
    // by the person running them; the parsing itself is tested in `config`.
    match MockSystem::from_env() {
        Ok(system) => assert!(system.config().devices() >= 1),
        Err(err) => assert_eq!(err.status(), Status::INVALID_ARGUMENT),
    }
}

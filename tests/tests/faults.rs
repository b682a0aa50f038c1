//! Faults: each injected failure is returned as a named error, leaves the
//! pool usable, and does not spread to other streams.
//!
//! - the runtime cannot be created: `start_runtime` returns the error and a
//!   retry succeeds once the fault is cleared;
//! - a stream cannot be created during an assignment: the error is
//!   returned, nothing is inserted, the cursor stays, and the next
//!   assignment retries the same id (also with eight threads assigning);
//! - a launch is refused: `LAUNCH_FAILED`, the completion is released without
//!   being called, the stream and the pool keep working;
//! - a stream needs shutdown: its error state is `Shutdown`, the device
//!   state `StreamError`, its queued work completes with `SHUTDOWN`, other
//!   streams are fine;
//! - a host callback (or a completion) panics: `HOST_CALLBACK_FAILED` on that
//!   stream only; the process and the other streams go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use flex_rt::{DataFormat, FlexError, HostBuffer, LaunchOptions, Runtime, Status, Stream};
use spyre_mock::{MockRuntime, MockSystem};
use spyre_stream::{
    Device, DeviceState, Error, PoolConfig, SpyreStream, StreamErrorState, StreamId, StreamPool,
    device_state, runtime_info, set_backend, start_runtime, stream_from_pool, synchronize_device,
};
use spyre_tests::isolated;
use spyre_tests::reliability::{
    DropCounter, SpyBackend, bounded, quiet_deliberate_panics, run_bounded,
};

const RECV: Duration = Duration::from_secs(10);

fn leaked_runtime() -> &'static MockRuntime {
    let system = MockSystem::builder()
        .memory_bytes(1 << 20)
        .region_bytes(1 << 18)
        .build()
        .unwrap();
    Box::leak(Box::new(system.create_mock_runtime(0).unwrap()))
}

fn pool(runtime: &'static MockRuntime) -> StreamPool<'static> {
    StreamPool::new(runtime, PoolConfig::default()).unwrap()
}

/// The flex error inside a stream-layer error, or a failure naming what came instead.
fn flex(err: Error) -> FlexError {
    match err {
        Error::Flex(e) => e,
        other => panic!("expected the runtime's error, got {other:?}"),
    }
}

fn ids(pool: &StreamPool<'_>) -> Vec<i64> {
    pool.mapped_ids().iter().map(|id| id.get()).collect()
}

/// A stream that works: a host callback runs and the stream synchronizes.
fn assert_stream_works(pool: &StreamPool<'_>, stream: SpyreStream) {
    let (tx, rx) = mpsc::channel();
    let handle = pool.resolve(stream).unwrap();
    handle
        .launch_host_callback(Box::new(move || tx.send(()).unwrap()), LaunchOptions::new())
        .unwrap();
    handle.synchronize().unwrap();
    rx.recv_timeout(RECV).unwrap();
    assert!(pool.resolve(stream).unwrap().query().unwrap());
    assert_eq!(
        StreamErrorState::of(pool.resolve(stream).unwrap()).unwrap(),
        StreamErrorState::Success
    );
}

#[test]
fn runtime_creation_failure_is_returned_and_a_retry_succeeds_once_cleared() {
    isolated!(&[], || {
        let system = MockSystem::default();
        system.faults().set_fail_runtime_creation(true);
        set_backend(Box::new(system.clone())).unwrap();

        for attempt in 0..2 {
            let err = flex(start_runtime().unwrap_err());
            assert_eq!(err.status(), Status::RUNTIME_FAILED, "attempt {attempt}");
            assert_eq!(err.call(), "create_runtime");
            assert!(
                err.to_string()
                    .starts_with("create_runtime failed with FLEX_ERROR_RUNTIME_FAILED"),
                "{err}"
            );
            assert!(runtime_info().is_none());
            assert!(matches!(
                spyre_stream::global_pool(),
                Err(spyre_stream::Error::NotStarted)
            ));
            assert_eq!(device_state(), DeviceState::NotInitialized);
        }
        // Entry points that start the runtime return the same error.
        let err = flex(stream_from_pool(Device::CURRENT, 0).unwrap_err());
        assert_eq!(err.status(), Status::RUNTIME_FAILED);
        // Synchronizing a device that never started has nothing to do.
        synchronize_device(Device::CURRENT).unwrap();

        system.faults().set_fail_runtime_creation(false);
        start_runtime().unwrap();
        assert_eq!(device_state(), DeviceState::Ok);
        assert_eq!(runtime_info().unwrap().backend, "mock");
        // The failed attempts assigned nothing: the first id is 1.
        let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
        assert_eq!(stream.id(), StreamId(1));
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        stream
            .launch_host_callback(
                move || flag.store(true, Ordering::SeqCst),
                LaunchOptions::new(),
            )
            .unwrap();
        stream.synchronize().unwrap();
        assert!(ran.load(Ordering::SeqCst));
        // Faults set after the start do not touch the running runtime.
        system.faults().set_fail_runtime_creation(true);
        assert_eq!(
            stream_from_pool(Device::CURRENT, 0).unwrap().id(),
            StreamId(2)
        );
    },);
}

#[test]
fn a_failed_stream_creation_returns_the_error_inserts_nothing_and_the_id_is_retried() {
    let rt = leaked_runtime();
    let pool = pool(rt);
    let normal: Vec<i64> = (0..5)
        .map(|_| pool.stream_from_pool(0).unwrap().id().get())
        .collect();
    assert_eq!(normal, vec![1, 2, 3, 4, 5]);
    assert_eq!(pool.stream_from_pool(-1).unwrap().id(), StreamId(33));
    let mapped = ids(&pool);
    let created = rt.stream_count();
    assert_eq!(created, 1 + 4 + 6);

    // Two failing creations: two errors, both for id 6, nothing inserted.
    rt.faults().fail_next_stream_creations(2);
    for _ in 0..2 {
        let err = flex(pool.stream_from_pool(0).unwrap_err());
        assert_eq!(err.status(), Status::RUNTIME_FAILED);
        assert_eq!(err.call(), "create_stream");
        assert!(
            err.to_string()
                .starts_with("create_stream failed with FLEX_ERROR_RUNTIME_FAILED"),
            "{err}"
        );
        assert_eq!(ids(&pool), mapped, "nothing inserted");
        assert_eq!(rt.stream_count(), created, "nothing created");
        assert!(matches!(
            pool.resolve(SpyreStream::from_parts(0, StreamId(6))),
            Err(Error::NoHandle {
                id: StreamId(6),
                ..
            })
        ));
    }
    // The fault is spent: the same id is retried, then the round robin goes on.
    assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(6));
    assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(7));
    assert_eq!(rt.stream_count(), created + 2);

    // The high pool likewise, and its failure does not move the normal cursor.
    rt.faults().fail_next_stream_creations(1);
    let err = flex(pool.stream_from_pool(-1).unwrap_err());
    assert_eq!(err.status(), Status::RUNTIME_FAILED);
    assert_eq!(pool.stream_from_pool(-1).unwrap().id(), StreamId(34));
    assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(8));

    // An id that already has a handle needs no creation: with a creation
    // fault pending, assigning it still succeeds and leaves the fault pending.
    for expected in 9..=32 {
        assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(expected));
    }
    let created = rt.stream_count();
    rt.faults().fail_next_stream_creations(1);
    assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(1));
    assert_eq!(rt.faults().pending_stream_creation_failures(), 1);
    assert_eq!(rt.stream_count(), created);
    rt.faults().fail_next_stream_creations(0);

    // The pool is usable: old and new streams run work, the device syncs.
    for id in [1, 6, 33, 34] {
        assert_stream_works(&pool, SpyreStream::from_parts(0, StreamId(id)));
    }
    pool.synchronize_device().unwrap();
    assert!(!rt.has_stream_error().unwrap());
}

/// Eight threads assign while the runtime refuses five stream creations in
/// the middle: exactly five assignments fail, the ids handed out are still
/// the round robin's (a failed id is handed out again first, without the
/// cursor moving on for it), and the table holds one stream per id.
#[test]
fn concurrent_assignments_with_failing_creations_keep_the_table_consistent() {
    let rt = leaked_runtime();
    let pool: &'static StreamPool<'static> = Box::leak(Box::new(pool(rt)));
    pool.initialize().unwrap();
    rt.faults().fail_stream_creations_after(3, 5);
    let workers = (0..8)
        .map(|w| {
            Box::new(move || {
                let mut ok = Vec::new();
                let mut failed = 0u64;
                for i in 0..40 {
                    let priority = if (w + i) % 3 == 0 { -1 } else { 0 };
                    match pool.stream_from_pool(priority) {
                        Ok(s) => ok.push(s.id().get()),
                        Err(Error::Flex(e)) if e.status() == Status::RUNTIME_FAILED => failed += 1,
                        Err(other) => panic!("worker {w}: {other:?}"),
                    }
                }
                (ok, failed)
            }) as Box<dyn FnOnce() -> (Vec<i64>, u64) + Send>
        })
        .collect();
    let results = run_bounded("failing-creations", Duration::from_secs(60), workers);
    let failed: u64 = results.iter().map(|(_, f)| f).sum();
    assert_eq!(failed, 5, "one failed assignment per refused creation");
    let mut normal: Vec<i64> = results
        .iter()
        .flat_map(|(ok, _)| ok.iter().copied().filter(|id| *id <= 32))
        .collect();
    let mut high: Vec<i64> = results
        .iter()
        .flat_map(|(ok, _)| ok.iter().copied().filter(|id| *id > 32))
        .collect();
    normal.sort_unstable();
    high.sort_unstable();
    let prefix = |first: i64, n: usize| {
        let mut v: Vec<i64> = (0..n as i64).map(|i| first + i % 32).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(normal, prefix(1, normal.len()));
    assert_eq!(high, prefix(33, high.len()));
    assert_eq!(normal.len() + high.len() + 5, 8 * 40);
    // 320 assignments cover every pool id: all 64 exist, each created once.
    assert_eq!(ids(pool), (0..=68).collect::<Vec<_>>());
    assert_eq!(rt.stream_count(), 69);
    assert_eq!(rt.faults().pending_stream_creation_failures(), 0);
}

/// The operations of one launch kind, for the refused-launch test.
fn launch_kind(
    pool: &StreamPool<'static>,
    rt: &MockRuntime,
    stream: SpyreStream,
    kind: usize,
    options: LaunchOptions,
) -> (Result<(), FlexError>, Option<HostBuffer>) {
    let device = rt.allocate(128).unwrap();
    let stream = pool.resolve(stream).unwrap();
    match kind {
        0 => {
            let src = HostBuffer::zeroed(128);
            (stream.launch_h2d(&src, &device, options), Some(src))
        }
        1 => {
            let dst = HostBuffer::zeroed(128);
            (stream.launch_d2h(&device, &dst, options), Some(dst))
        }
        2 => (
            stream.launch_fill(&device, 1.0, DataFormat::Fp32, options),
            None,
        ),
        3 => {
            // A valid program: fill 32 f32 of `device` itself.
            let program = rt.allocate(128).unwrap();
            let descriptor = flex_rt::program::KernelDescriptor::fill(32, 3.0, device.start());
            let (tx, rx) = mpsc::channel();
            rt.default_mock_stream()
                .launch_h2d(
                    &HostBuffer::from_vec(descriptor.to_bytes().to_vec()),
                    &program,
                    LaunchOptions::new().on_complete(move |r| tx.send(r).unwrap()),
                )
                .unwrap();
            rx.recv_timeout(RECV).unwrap().unwrap();
            (stream.launch_compute(&program, options), None)
        }
        _ => (stream.launch_host_callback(Box::new(|| {}), options), None),
    }
}

const CALLS: [&str; 5] = [
    "launch_h2d",
    "launch_d2h",
    "launch_fill",
    "launch_compute",
    "launch_host_callback",
];

#[test]
fn a_refused_launch_names_launch_failed_releases_its_completion_and_the_stream_goes_on() {
    let rt = leaked_runtime();
    let pool: StreamPool<'static> = pool(rt);
    let other = pool.stream_from_pool(-1).unwrap();
    for (kind, call) in CALLS.iter().enumerate() {
        let stream = pool.stream_from_pool(0).unwrap();
        let mock = rt.mock_stream(pool.resolve(stream).unwrap().id()).unwrap();
        mock.fail_nth_launch(2);

        // One call counter and one drop counter per launch.
        let calls: [Arc<AtomicU64>; 3] = Default::default();
        let drops: [DropCounter; 3] = Default::default();
        let options = |n: usize| {
            let calls = Arc::clone(&calls[n]);
            let token = drops[n].token();
            LaunchOptions::new().on_complete(move |r| {
                assert!(r.is_ok());
                calls.fetch_add(1, Ordering::SeqCst);
                drop(token);
            })
        };
        let (first, _) = launch_kind(&pool, rt, stream, kind, options(0));
        first.unwrap();
        let (refused, buffer) = launch_kind(&pool, rt, stream, kind, options(1));
        let err = refused.unwrap_err();
        assert_eq!(err.status(), Status::LAUNCH_FAILED, "{call}");
        assert_eq!(err.call(), *call);
        assert!(
            err.to_string()
                .starts_with(&format!("{call} failed with FLEX_ERROR_LAUNCH_FAILED")),
            "{err}"
        );
        // Released by the time the launch returns, never called; the
        // caller's host buffer is free again.
        assert_eq!(
            drops[1].get(),
            1,
            "{call}: the refused completion was dropped"
        );
        if let Some(buffer) = buffer {
            assert!(
                buffer.lease_for_write("test").is_ok(),
                "{call}: the refused launch still holds the host buffer"
            );
        }
        let (third, _) = launch_kind(&pool, rt, stream, kind, options(2));
        third.unwrap();
        pool.resolve(stream).unwrap().synchronize().unwrap();
        let called: Vec<u64> = calls.iter().map(|c| c.load(Ordering::SeqCst)).collect();
        assert_eq!(called, vec![1, 0, 1], "{call}: completions called");
        let dropped: Vec<u64> = drops.iter().map(DropCounter::get).collect();
        assert_eq!(dropped, vec![1, 1, 1], "{call}: completions released");
        // A refusal does not fail the stream, the device, or anything else.
        assert!(pool.resolve(stream).unwrap().query().unwrap());
        assert_eq!(
            StreamErrorState::of(pool.resolve(stream).unwrap()).unwrap(),
            StreamErrorState::Success
        );
        assert!(!rt.has_stream_error().unwrap());
        assert_stream_works(&pool, stream);
        assert_stream_works(&pool, other);
    }
    pool.synchronize_device().unwrap();
}

#[test]
fn a_stream_that_needs_shutdown_reports_it_and_the_others_are_fine() {
    isolated!(&[], || {
        let backend = SpyBackend::new(MockSystem::default());
        set_backend(Box::new(backend.clone())).unwrap();
        let bad = stream_from_pool(Device::CURRENT, 0).unwrap();
        let good = stream_from_pool(Device::CURRENT, -1).unwrap();
        let rt = backend.runtime().expect("the runtime was created");
        let pool = spyre_stream::global_pool().unwrap();
        assert_eq!(device_state(), DeviceState::Ok);

        // Work queued behind a blocked callback when the stream goes bad.
        let (release, wait) = mpsc::channel::<()>();
        bad.launch_host_callback(move || wait.recv().unwrap(), LaunchOptions::new())
            .unwrap();
        let (tx, queued) = mpsc::channel();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        bad.launch_host_callback(
            move || flag.store(true, Ordering::SeqCst),
            LaunchOptions::new().on_complete(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        rt.mock_stream(pool.resolve(bad).unwrap().id())
            .unwrap()
            .set_needs_shutdown();
        release.send(()).unwrap();

        assert_eq!(bad.error().unwrap(), StreamErrorState::Shutdown);
        assert_eq!(StreamErrorState::Shutdown.as_str(), "Shutdown");
        assert_eq!(good.error().unwrap(), StreamErrorState::Success);
        assert_eq!(device_state(), DeviceState::StreamError);
        let queued = queued.recv_timeout(RECV).unwrap().unwrap_err();
        assert_eq!(queued.status(), Status::SHUTDOWN);
        assert!(!ran.load(Ordering::SeqCst), "queued work must not run");
        let refused = flex(
            bad.launch_host_callback(|| {}, LaunchOptions::new())
                .unwrap_err(),
        );
        assert_eq!(refused.status(), Status::SHUTDOWN);
        assert_eq!(
            flex(bad.synchronize().unwrap_err()).status(),
            Status::SHUTDOWN
        );
        assert_eq!(flex(bad.query().unwrap_err()).status(), Status::SHUTDOWN);

        // The device sync names the bad stream and still drains the others.
        let (tx, done) = mpsc::channel();
        good.launch_host_callback(move || tx.send(()).unwrap(), LaunchOptions::new())
            .unwrap();
        match synchronize_device(Device::CURRENT).unwrap_err() {
            Error::DeviceSynchronize { id, source } => {
                assert_eq!(id, bad.id());
                assert_eq!(source.status(), Status::SHUTDOWN);
            }
            other => panic!("{other:?}"),
        }
        done.try_recv().expect("the good stream was synchronized");

        // Other streams and the pool go on.
        assert_stream_works(pool, good);
        assert_stream_works(pool, spyre_stream::default_stream(Device::CURRENT).unwrap());
        let fresh = stream_from_pool(Device::CURRENT, 0).unwrap();
        assert_eq!(fresh.id(), StreamId(2));
        assert_stream_works(pool, fresh);
        assert_eq!(bad.error().unwrap(), StreamErrorState::Shutdown);
    },);
}

#[test]
fn a_panicking_host_callback_fails_only_its_stream() {
    isolated!(&[], || {
        quiet_deliberate_panics();
        let backend = SpyBackend::new(MockSystem::default());
        set_backend(Box::new(backend.clone())).unwrap();
        let callback = stream_from_pool(Device::CURRENT, 0).unwrap();
        let completion = stream_from_pool(Device::CURRENT, 0).unwrap();
        let good = stream_from_pool(Device::CURRENT, -1).unwrap();
        let engines = spyre_mock::live_engine_threads();

        let (tx, result) = mpsc::channel();
        callback
            .launch_host_callback(
                || panic!("deliberate panic in a host callback"),
                LaunchOptions::new().on_complete(move |r| tx.send(r).unwrap()),
            )
            .unwrap();
        let err = flex(callback.synchronize().unwrap_err());
        assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
        assert_eq!(err.call(), "launch_host_callback");
        assert!(
            err.message()
                .contains("deliberate panic in a host callback"),
            "{err}"
        );
        let completed = result.recv_timeout(RECV).unwrap().unwrap_err();
        assert_eq!(completed, err, "the completion saw the same error");
        assert_eq!(
            flex(callback.query().unwrap_err()).status(),
            Status::HOST_CALLBACK_FAILED
        );
        // Sticky: later launches on that stream are refused.
        let refused = flex(
            callback
                .launch_host_callback(|| {}, LaunchOptions::new())
                .unwrap_err(),
        );
        assert_eq!(refused.status(), Status::STREAM_FAILED);
        // Not a shutdown: the stream failed, it does not need one.
        assert_eq!(callback.error().unwrap(), StreamErrorState::Success);

        // A panicking completion fails its own stream the same way.
        completion
            .launch_host_callback(
                || {},
                LaunchOptions::new().on_complete(|_| panic!("deliberate panic in a completion")),
            )
            .unwrap();
        let err = flex(completion.synchronize().unwrap_err());
        assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
        assert!(
            err.message().contains("deliberate panic in a completion"),
            "{err}"
        );

        assert_eq!(device_state(), DeviceState::StreamError);
        // The process, the engines, the other streams and the pool go on.
        assert_eq!(spyre_mock::live_engine_threads(), engines);
        let p = spyre_stream::global_pool().unwrap();
        assert_stream_works(p, good);
        let fresh = stream_from_pool(Device::CURRENT, -1).unwrap();
        assert_stream_works(p, fresh);
        bounded("sync-after-panic", Duration::from_secs(30), || {
            let err = synchronize_device(Device::CURRENT).unwrap_err();
            assert!(
                matches!(&err, Error::DeviceSynchronize { id: StreamId(1), source }
                        if source.status() == Status::HOST_CALLBACK_FAILED),
                "{err:?}"
            );
        });
        let _ = backend;
    },);
}

/// The library returns a status flex.h does not define (the mock shared
/// library's `SPYRE_MOCK_UNDEFINED_STATUS` switch, status 977): each call
/// that gets it is an error naming the value and the call, a refused launch
/// releases its completion, and everything else keeps working.
#[test]
fn an_undefined_status_code_is_an_error_naming_it_and_the_pool_goes_on() {
    spyre_tests::mock_cdylib();
    isolated!(
        &[(
            "SPYRE_MOCK_UNDEFINED_STATUS",
            "flex_stream_query,flex_launch_fill,flex_stream_needs_shutdown,flex_runtime_has_stream_error",
        )],
        || {
            let backend = flex_rt::HardwareBackend::open(spyre_tests::mock_cdylib()).unwrap();
            set_backend(Box::new(backend)).unwrap();
            let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
            let undefined = |err: FlexError, call: &str| {
                assert_eq!(err.status(), Status(977), "{err}");
                assert!(!err.status().is_known());
                assert_eq!(err.call(), call);
                assert!(
                    err.to_string().starts_with(&format!(
                        "{call} failed with undefined status 977 (not in flex.h)"
                    )),
                    "{err}"
                );
            };
            undefined(flex(stream.query().unwrap_err()), "flex_stream_query");
            undefined(
                flex(stream.error().unwrap_err()),
                "flex_stream_needs_shutdown",
            );

            let runtime = spyre_stream::global_pool().unwrap().runtime();
            let device = runtime.allocate(64).unwrap();
            let drops = DropCounter::default();
            let token = drops.token();
            let called = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&called);
            let err = stream
                .launch_fill(
                    &device,
                    1.0,
                    DataFormat::Uint8,
                    LaunchOptions::new().on_complete(move |_| {
                        flag.store(true, Ordering::SeqCst);
                        drop(token);
                    }),
                )
                .unwrap_err();
            undefined(flex(err), "flex_launch_fill");
            assert_eq!(drops.get(), 1, "the refused launch released its completion");
            assert!(!called.load(Ordering::SeqCst));
            // A runtime that cannot tell whether a stream failed reports StreamError.
            assert_eq!(device_state(), DeviceState::StreamError);

            // Everything else works: copies, callbacks, synchronization, assignment.
            let input = HostBuffer::from_vec((0..64).collect());
            let output = HostBuffer::zeroed(64);
            stream
                .launch_h2d(&input, &device, LaunchOptions::new())
                .unwrap();
            stream
                .launch_d2h(&device, &output, LaunchOptions::new())
                .unwrap();
            let (tx, rx) = mpsc::channel();
            stream
                .launch_host_callback(move || tx.send(()).unwrap(), LaunchOptions::new())
                .unwrap();
            stream.synchronize().unwrap();
            rx.recv_timeout(RECV).unwrap();
            assert_eq!(output.to_vec(), (0..64).collect::<Vec<u8>>());
            synchronize_device(Device::CURRENT).unwrap();
            assert_eq!(
                stream_from_pool(Device::CURRENT, 0).unwrap().id(),
                StreamId(2)
            );
        },
    );
}

/// `synchronize_device` from a host callback of the device's runtime is
/// refused as a whole, naming the call: every stream's `synchronize` would
/// wait for the callback itself. Before, the refusal read as a failure of
/// stream 0, which had not failed.
#[test]
fn synchronize_device_from_a_host_callback_is_refused_not_blamed_on_a_stream() {
    isolated!(&[], || {
        set_backend(Box::new(SpyBackend::new(MockSystem::default()))).unwrap();
        let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
        let (tx, result) = mpsc::channel();
        stream
            .launch_host_callback(
                move || tx.send(synchronize_device(Device::CURRENT)).unwrap(),
                LaunchOptions::new(),
            )
            .unwrap();
        match result.recv_timeout(RECV).unwrap().unwrap_err() {
            Error::Flex(refused) => {
                assert_eq!(refused.status(), Status::UNSUPPORTED, "{refused}");
                assert_eq!(refused.call(), "synchronize_device", "{refused}");
                assert!(
                    refused.message().contains("would wait for itself"),
                    "{refused}"
                );
            }
            other => panic!("expected the refusal, got {other:?}"),
        }
        stream.synchronize().expect("nothing failed");
        assert_eq!(device_state(), DeviceState::Ok);
    });
}

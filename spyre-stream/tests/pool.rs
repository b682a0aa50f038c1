//! The pool against the software device: ids and round robin, ownership,
//! atomic initialization, errors, host-compute streams, device
//! synchronization, the launch surface, and that no lock is held while
//! waiting on the device.

use std::sync::mpsc;
use std::time::Duration;

use flex_rt::program::KernelDescriptor;
use flex_rt::{DataFormat, HostBuffer, LaunchOptions, Runtime, Status, StreamPriority};
use spyre_mock::{MockRuntime, MockSystem};
use spyre_stream::{Error, PoolConfig, SpyreStream, StreamErrorState, StreamId, StreamPool};

/// A fresh software device runtime, leaked like the process-wide one.
fn runtime() -> &'static MockRuntime {
    let system = MockSystem::builder().build().unwrap();
    Box::leak(Box::new(system.create_mock_runtime(0).unwrap()))
}

fn pool(runtime: &'static MockRuntime) -> StreamPool<'static> {
    StreamPool::new(runtime, PoolConfig::default()).unwrap()
}

fn handle_addr(pool: &StreamPool<'_>, stream: SpyreStream) -> *const () {
    (pool.resolve(stream).unwrap() as *const dyn flex_rt::Stream).cast()
}

#[test]
fn normal_ids_go_round_robin_from_1_to_32_and_wrap() {
    let pool = pool(runtime());
    let ids: Vec<i64> = (0..34)
        .map(|_| pool.stream_from_pool(0).unwrap().id().get())
        .collect();
    let expected: Vec<i64> = (1..=32).chain([1, 2]).collect();
    assert_eq!(ids, expected);
    // Positive priorities are normal too (torch.cuda.Stream and CUDA map a
    // priority past the lowest to the lowest).
    assert_eq!(pool.stream_from_pool(5).unwrap().id(), StreamId(3));
}

#[test]
fn high_ids_go_round_robin_from_33_to_64_and_wrap() {
    let pool = pool(runtime());
    let ids: Vec<i64> = (0..33)
        .map(|_| pool.stream_from_pool(-1).unwrap().id().get())
        .collect();
    let expected: Vec<i64> = (33..=64).chain([33]).collect();
    assert_eq!(ids, expected);
    assert_eq!(pool.stream_from_pool(i32::MIN).unwrap().id(), StreamId(34));
}

#[test]
fn priority_derives_from_the_id_and_the_runtime_priority_matches_the_pool() {
    let pool = pool(runtime());
    let normal = pool.stream_from_pool(1).unwrap();
    let high = pool.stream_from_pool(-1).unwrap();
    let host = pool.host_compute_stream().unwrap();
    let default = pool.default_stream().unwrap();
    assert_eq!(
        (
            default.priority(),
            normal.priority(),
            high.priority(),
            host.priority()
        ),
        (0, 0, -1, -1)
    );
    assert_eq!(
        pool.resolve(default).unwrap().priority(),
        StreamPriority::Normal
    );
    assert_eq!(
        pool.resolve(normal).unwrap().priority(),
        StreamPriority::Normal
    );
    assert_eq!(pool.resolve(high).unwrap().priority(), StreamPriority::High);
    assert_eq!(pool.resolve(host).unwrap().priority(), StreamPriority::High);
}

#[test]
fn each_id_maps_to_one_handle_created_once_for_the_life_of_the_pool() {
    let rt = runtime();
    let pool = pool(rt);
    let first: Vec<_> = (0..64)
        .map(|i| {
            let s = pool
                .stream_from_pool(if i % 2 == 0 { 0 } else { -1 })
                .unwrap();
            (s, handle_addr(&pool, s))
        })
        .collect();
    let created_after_first_round = rt.stream_count();
    for _ in 0..3 {
        for i in 0..64 {
            let s = pool
                .stream_from_pool(if i % 2 == 0 { 0 } else { -1 })
                .unwrap();
            let (_, addr) = first.iter().find(|(f, _)| *f == s).unwrap();
            assert_eq!(handle_addr(&pool, s), *addr, "{s} changed handle");
        }
    }
    // default + 4 host-compute + 64 pool streams, and nothing created later.
    assert_eq!(created_after_first_round, 1 + 4 + 64);
    assert_eq!(rt.stream_count(), created_after_first_round);
    let mapped: Vec<i64> = pool.mapped_ids().iter().map(|id| id.get()).collect();
    assert_eq!(mapped, (0..=68).collect::<Vec<_>>());
}

#[test]
fn initialization_maps_the_default_and_host_compute_streams() {
    let pool = pool(runtime());
    assert!(!pool.is_initialized());
    assert!(pool.mapped_ids().is_empty());
    pool.initialize().unwrap();
    pool.initialize().unwrap();
    let mapped: Vec<i64> = pool.mapped_ids().iter().map(|id| id.get()).collect();
    assert_eq!(mapped, vec![0, 65, 66, 67, 68]);
    assert_eq!(
        pool.resolve(pool.default_stream().unwrap()).unwrap().id(),
        0
    );
    assert_eq!(pool.default_stream_handle().unwrap().id(), 0);
}

#[test]
fn a_failed_initialization_publishes_nothing_and_a_retry_creates_only_the_rest() {
    let rt = runtime();
    let pool = pool(rt);
    // The third host-compute stream fails: two were created, none published.
    rt.faults().fail_stream_creations_after(2, 1);
    let err = pool.stream_from_pool(0).unwrap_err();
    assert!(
        matches!(&err, Error::Flex(e) if e.status() == Status::RUNTIME_FAILED),
        "{err:?}"
    );
    assert!(!pool.is_initialized());
    assert!(pool.mapped_ids().is_empty());
    assert!(matches!(
        pool.resolve(SpyreStream::from_parts(0, StreamId(0))),
        Err(Error::NoHandle { .. })
    ));
    // The fault is spent: the next call initializes and assigns id 1.
    assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(1));
    assert_eq!(pool.mapped_ids().len(), 6);
    // The two streams created before the failure are the ones published:
    // the default, four host-compute streams and id 1, each created once.
    assert_eq!(rt.stream_count(), 1 + 4 + 1);
}

#[test]
fn a_failed_stream_creation_inserts_nothing_and_the_same_id_is_retried() {
    let rt = runtime();
    let pool = pool(rt);
    pool.initialize().unwrap();
    rt.faults().fail_next_stream_creations(1);
    assert!(pool.stream_from_pool(0).is_err());
    assert!(matches!(
        pool.resolve(SpyreStream::from_parts(0, StreamId(1))),
        Err(Error::NoHandle { .. })
    ));
    assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(1));
    assert_eq!(pool.stream_from_pool(0).unwrap().id(), StreamId(2));
}

#[test]
fn resolving_an_unmapped_id_names_it() {
    let pool = pool(runtime());
    pool.initialize().unwrap();
    for id in [1, 33, 64, 69, 73, 1000, -1, i64::MAX, i64::MIN] {
        let err = pool
            .resolve(SpyreStream::from_parts(0, StreamId(id)))
            .unwrap_err();
        assert!(
            matches!(err, Error::NoHandle { id: StreamId(i), device: 0 } if i == id),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "SpyreStream: no flex handle for stream id {id} — was the stream pool initialized for this device? (device 0); "
            )),
            "{message}"
        );
    }
    // What the message adds, by the id's range.
    let advice = |id| {
        let message = pool
            .resolve(SpyreStream::from_parts(0, StreamId(id)))
            .unwrap_err()
            .to_string();
        message.split_once("(device 0); ").unwrap().1.to_owned()
    };
    assert_eq!(
        advice(33),
        "a pool id (1–64) gets its stream when stream_from_pool first hands it out; a SpyreStream made with from_parts for id 33 before that has none"
    );
    assert_eq!(
        advice(69),
        "host-compute ids run from 65 to 64+N, N from TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS (4 unless set, at most 8): an id above 64+N has no stream, and those up to it are mapped when the pool initializes"
    );
    assert_eq!(
        advice(73),
        "no stream has id 73: ids are 0 (the default stream), 1–32 (normal priority), 33–64 (high priority) and 65–72 (host compute)"
    );
    let err = pool
        .resolve(SpyreStream::from_parts(3, StreamId(0)))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongDevice {
                stream_device: 3,
                pool_device: 0
            }
        ),
        "{err:?}"
    );
}

#[test]
fn host_compute_streams_round_robin_and_by_id() {
    let pool = StreamPool::new(runtime(), PoolConfig::new(3, false).unwrap()).unwrap();
    let ids: Vec<i64> = (0..4)
        .map(|_| pool.host_compute_stream().unwrap().id().get())
        .collect();
    assert_eq!(ids, vec![65, 66, 67, 65]);
    assert_eq!(
        pool.host_compute_stream_by_id(67).unwrap().id(),
        StreamId(67)
    );
    for bad in [64, 68, 0, -1, 1000, i64::MAX] {
        let err = pool.host_compute_stream_by_id(bad).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("stream id {bad} is not a host compute stream id (valid range [65, 68))")
        );
    }
    assert!(matches!(
        PoolConfig::new(0, false),
        Err(Error::InvalidHostComputeStreams { count: 0 })
    ));
    assert!(matches!(
        PoolConfig::new(9, false),
        Err(Error::InvalidHostComputeStreams { count: 9 })
    ));
}

#[test]
fn runtime_errors_propagate_unchanged_and_states_are_reported() {
    let rt = runtime();
    let pool = pool(rt);
    let stream = pool.stream_from_pool(0).unwrap();
    // A compute op whose program is all zeros fails on the device.
    let program = rt.allocate(128).unwrap();
    pool.resolve(stream)
        .unwrap()
        .launch_fill(&program, 0.0, DataFormat::Uint8, LaunchOptions::new())
        .unwrap();
    pool.resolve(stream)
        .unwrap()
        .launch_compute(&program, LaunchOptions::new())
        .unwrap();
    let direct = rt.mock_stream(pool.resolve(stream).unwrap().id()).unwrap();
    let flex = pool.resolve(stream).unwrap().synchronize().unwrap_err();
    assert_eq!(flex.status(), Status::EXECUTION_FAILED);
    assert_eq!(
        flex_rt::Stream::synchronize(direct).unwrap_err(),
        flex,
        "unchanged"
    );
    assert!(
        matches!(pool.resolve(stream).unwrap().query(), Err(e) if e.status() == Status::EXECUTION_FAILED)
    );
    assert!(rt.has_stream_error().unwrap());

    let other = pool.stream_from_pool(0).unwrap();
    assert_eq!(
        StreamErrorState::of(pool.resolve(other).unwrap()).unwrap(),
        StreamErrorState::Success
    );
    rt.mock_stream(pool.resolve(other).unwrap().id())
        .unwrap()
        .set_needs_shutdown();
    assert_eq!(
        StreamErrorState::of(pool.resolve(other).unwrap()).unwrap(),
        StreamErrorState::Shutdown
    );
    let refused = pool
        .resolve(other)
        .unwrap()
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap_err();
    assert_eq!(refused.status(), Status::SHUTDOWN);
}

#[test]
fn launches_through_the_pool_compute_checked_numbers() {
    let rt = runtime();
    let pool = pool(rt);
    let stream = pool.stream_from_pool(-1).unwrap();
    let n = 1000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (dx, dy, dout) = (
        rt.allocate(4000).unwrap(),
        rt.allocate(4000).unwrap(),
        rt.allocate(4000).unwrap(),
    );
    let program = rt.allocate(128).unwrap();
    let descriptor = KernelDescriptor::axpy(n as u64, 2.0, dx.start(), dy.start(), dout.start());
    pool.resolve(stream)
        .unwrap()
        .launch_h2d(&HostBuffer::from_vec(bytes(&x)), &dx, LaunchOptions::new())
        .unwrap();
    pool.resolve(stream)
        .unwrap()
        .launch_h2d(&HostBuffer::from_vec(bytes(&y)), &dy, LaunchOptions::new())
        .unwrap();
    pool.resolve(stream)
        .unwrap()
        .launch_h2d(
            &HostBuffer::from_vec(descriptor.to_bytes().to_vec()),
            &program,
            LaunchOptions::new(),
        )
        .unwrap();
    let (tx, rx) = mpsc::channel();
    pool.resolve(stream)
        .unwrap()
        .launch_compute(
            &program,
            LaunchOptions::new().on_complete(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
    let out = HostBuffer::zeroed(4000);
    pool.resolve(stream)
        .unwrap()
        .launch_d2h(&dout, &out, LaunchOptions::new())
        .unwrap();
    pool.resolve(stream).unwrap().synchronize().unwrap();
    assert!(rx.recv().unwrap().is_ok());
    let got: Vec<f32> = out
        .to_vec()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // 2·i + 0.5·i = 2.5·i, exact in f32 for these values.
    let expected: Vec<f32> = (0..n).map(|i| 2.5 * i as f32).collect();
    assert_eq!(got, expected);
    assert!(pool.resolve(stream).unwrap().query().unwrap());
}

/// Blocks `stream` with a host callback until the returned sender is used.
fn block(pool: &StreamPool<'static>, stream: SpyreStream) -> mpsc::Sender<()> {
    let (release, wait) = mpsc::channel::<()>();
    pool.resolve(stream)
        .unwrap()
        .launch_host_callback(Box::new(move || wait.recv().unwrap()), LaunchOptions::new())
        .unwrap();
    release
}

#[test]
fn no_lock_is_held_while_a_stream_or_the_device_synchronizes() {
    let pool: &'static StreamPool<'static> = Box::leak(Box::new(pool(runtime())));
    let slow = pool.stream_from_pool(0).unwrap();
    let release = block(pool, slow);
    let (done_tx, done_rx) = mpsc::channel();
    let waiters: Vec<_> = [true, false]
        .into_iter()
        .map(|device_wide| {
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                let result = if device_wide {
                    pool.synchronize_device()
                } else {
                    pool.resolve(slow)
                        .unwrap()
                        .synchronize()
                        .map_err(Error::from)
                };
                done_tx.send(device_wide).unwrap();
                result
            })
        })
        .collect();
    // While both waits are blocked on the slow stream, assignment and
    // resolution still go through (neither waits for them).
    std::thread::sleep(Duration::from_millis(20));
    let fresh = pool.stream_from_pool(-1).unwrap();
    assert_eq!(fresh.id(), StreamId(33));
    pool.resolve(fresh).unwrap();
    pool.resolve(slow).unwrap();
    assert!(
        done_rx.try_recv().is_err(),
        "the synchronizations must still be waiting"
    );
    release.send(()).unwrap();
    for waiter in waiters {
        waiter.join().unwrap().unwrap();
    }
}

#[test]
fn synchronize_device_syncs_every_mapped_stream_once_and_reports_the_first_failure() {
    let rt = runtime();
    let pool = pool(rt);
    let a = pool.stream_from_pool(0).unwrap();
    let b = pool.stream_from_pool(-1).unwrap();
    let c = pool.stream_from_pool(0).unwrap();
    // b fails; a and c have work queued behind a blocked callback.
    let bad = rt.allocate(128).unwrap();
    pool.resolve(b)
        .unwrap()
        .launch_fill(&bad, 0.0, DataFormat::Uint8, LaunchOptions::new())
        .unwrap();
    pool.resolve(b)
        .unwrap()
        .launch_compute(&bad, LaunchOptions::new())
        .unwrap();
    let (tx, rx) = mpsc::channel();
    for s in [a, c] {
        let tx = tx.clone();
        pool.resolve(s)
            .unwrap()
            .launch_host_callback(
                Box::new(move || tx.send(s.id().get()).unwrap()),
                LaunchOptions::new(),
            )
            .unwrap();
    }
    let err = pool.synchronize_device().unwrap_err();
    assert!(
        matches!(&err, Error::DeviceSynchronize { id: StreamId(33), source } if source.status() == Status::EXECUTION_FAILED),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("synchronize_device: stream 33 failed"),
        "{err}"
    );
    // The streams after the failing one were still synchronized: their work is done.
    let mut ran: Vec<i64> = rx.try_iter().collect();
    ran.sort_unstable();
    assert_eq!(ran, vec![1, 2]);
    assert!(pool.resolve(a).unwrap().query().unwrap() && pool.resolve(c).unwrap().query().unwrap());
    // Each mapped stream was synchronized exactly once, in table order.
    let synced: Vec<u64> = rt.synchronize_log();
    let order: Vec<u64> = [0i64, 1, 2, 33, 65, 66, 67, 68]
        .iter()
        .map(|&id| {
            pool.resolve(SpyreStream::from_parts(0, StreamId(id)))
                .unwrap()
                .id()
        })
        .collect();
    assert_eq!(synced, order);
}

/// A no-op runtime whose next armed stream creation runs `first` (once).
fn runtime_with_first_creation(
    first: impl Fn() + Send + Sync + 'static,
) -> (
    &'static flex_rt::noop::NoopRuntime,
    &'static std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let armed: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let runtime = flex_rt::noop::NoopRuntime::new(0).with_creation_hook(Box::new(move |_| {
        if armed.swap(false, Ordering::SeqCst) {
            first();
        }
    }));
    (Box::leak(Box::new(runtime)), armed)
}

/// While id 1's creation is held, the round robin comes round to id 1
/// again, and that caller waits for the creation. Both creations fail: the
/// id is handed out again once per failure, so the next two assignments are
/// id 1 (created now) and id 1, and the cursor then goes on with id 2 — 33
/// hand-outs by the cursor, 33 successes once the retries are done.
#[test]
fn a_failed_creation_that_a_caller_of_the_same_id_waited_for_is_retried_once_per_failure() {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let entered_tx = Mutex::new(entered_tx);
    let (runtime, armed) = runtime_with_first_creation(move || {
        entered_tx.lock().unwrap().send(()).unwrap();
        release_rx.lock().unwrap().recv().unwrap();
    });
    let pool: &'static StreamPool<'static> = Box::leak(Box::new(
        StreamPool::new(runtime, PoolConfig::default()).unwrap(),
    ));
    pool.initialize().unwrap();
    armed.store(true, Ordering::SeqCst);
    let first = std::thread::spawn(|| pool.stream_from_pool(0));
    entered.recv().unwrap();
    let others: Vec<i64> = (0..31)
        .map(|_| pool.stream_from_pool(0).unwrap().id().get())
        .collect();
    assert_eq!(others, (2..=32).collect::<Vec<_>>());
    runtime.fail_next_stream_creations(2);
    let second = std::thread::spawn(|| pool.stream_from_pool(0));
    // Give the second caller time to be handed id 1 and wait for its creation.
    std::thread::sleep(Duration::from_millis(100));
    release.send(()).unwrap();
    for caller in [first, second] {
        let error = caller.join().unwrap().unwrap_err();
        assert!(
            matches!(&error, Error::Flex(e) if e.status() == Status::RUNTIME_FAILED),
            "{error:?}"
        );
    }
    let next: Vec<i64> = (0..3)
        .map(|_| pool.stream_from_pool(0).unwrap().id().get())
        .collect();
    assert_eq!(next, vec![1, 1, 2]);
}

/// A creation that panics publishes nothing and leaves its id to the next
/// assignment, as a failed one does.
#[test]
fn a_panicking_creation_leaves_its_id_to_the_next_assignment() {
    use std::sync::atomic::Ordering;
    let (runtime, armed) =
        runtime_with_first_creation(|| panic!("deliberate panic in create_stream"));
    let pool = StreamPool::new(runtime, PoolConfig::default()).unwrap();
    pool.initialize().unwrap();
    armed.store(true, Ordering::SeqCst);
    let panicked =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.stream_from_pool(0)));
    assert!(panicked.is_err());
    assert!(matches!(
        pool.resolve(SpyreStream::from_parts(0, StreamId(1))),
        Err(Error::NoHandle { .. })
    ));
    let ids: Vec<i64> = (0..2)
        .map(|_| pool.stream_from_pool(0).unwrap().id().get())
        .collect();
    assert_eq!(ids, vec![1, 2]);
}

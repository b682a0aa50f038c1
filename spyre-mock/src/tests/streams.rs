//! Execution semantics of streams: order, concurrency, priority, query and
//! synchronize, sticky errors, completions, callbacks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use flex_rt::{
    HostBuffer, LaunchOptions, Runtime, Status, Stream, StreamMode, StreamPriority, SyncPolicy,
};

use super::*;
use flex_rt::program::KernelDescriptor;

#[test]
fn one_stream_is_fifo_for_operations_and_completions() {
    let rt = runtime(4);
    let s = stream(&rt);
    let log = Log::default();
    for i in 0..100 {
        let (run, done) = (log.clone(), log.clone());
        s.launch_host_callback(
            Box::new(move || run.push(format!("run {i}"))),
            LaunchOptions::new().on_complete(move |r| {
                assert!(r.is_ok());
                done.push(format!("done {i}"));
            }),
        )
        .unwrap();
    }
    s.synchronize().unwrap();
    let expected: Vec<String> = (0..100)
        .flat_map(|i| [format!("run {i}"), format!("done {i}")])
        .collect();
    assert_eq!(log.take(), expected);
}

#[test]
fn copies_and_callbacks_keep_their_order() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    let address = rt.allocate(4).unwrap();
    let seen = HostBuffer::zeroed(4);
    for value in 1..=20u8 {
        s.launch_h2d(
            &HostBuffer::from_vec(vec![value; 4]),
            &address,
            LaunchOptions::new(),
        )
        .unwrap();
    }
    s.launch_d2h(&address, &seen, LaunchOptions::new()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(seen.to_vec(), vec![20; 4]);
}

/// Largest number of host functions ever running at once.
fn max_concurrency(engines: u32, streams: usize, ops_per_stream: usize) -> usize {
    let rt = runtime(engines);
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let all: Vec<&MockStream> = (0..streams).map(|_| stream(&rt)).collect();
    for _ in 0..ops_per_stream {
        for s in &all {
            let (running, peak) = (Arc::clone(&running), Arc::clone(&peak));
            s.launch_host_callback(
                Box::new(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    std::thread::yield_now();
                    running.fetch_sub(1, Ordering::SeqCst);
                }),
                LaunchOptions::new(),
            )
            .unwrap();
        }
    }
    for s in &all {
        s.synchronize().unwrap();
    }
    peak.load(Ordering::SeqCst)
}

#[test]
fn a_stream_runs_one_operation_at_a_time() {
    assert_eq!(max_concurrency(4, 1, 200), 1);
}

#[test]
fn engines_bound_how_many_streams_run_at_once() {
    assert_eq!(max_concurrency(1, 4, 20), 1);
    assert!(max_concurrency(2, 4, 20) <= 2);
}

#[test]
fn different_streams_run_concurrently() {
    let rt = runtime(2);
    let (a, b) = (stream(&rt), stream(&rt));
    let (a_tx, a_rx) = mpsc::channel::<()>();
    let (b_tx, b_rx) = mpsc::channel::<()>();
    // Each host function waits for the other to start: only possible if
    // both run at the same time.
    a.enqueue(
        Op::host_fn(move || {
            a_tx.send(()).map_err(|e| e.to_string())?;
            b_rx.recv_timeout(DEADLOCK)
                .map_err(|e| format!("b never ran alongside: {e}"))
        }),
        LaunchOptions::new(),
    )
    .unwrap();
    b.enqueue(
        Op::host_fn(move || {
            b_tx.send(()).map_err(|e| e.to_string())?;
            a_rx.recv_timeout(DEADLOCK)
                .map_err(|e| format!("a never ran alongside: {e}"))
        }),
        LaunchOptions::new(),
    )
    .unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
}

#[test]
fn high_priority_work_starts_first_under_contention() {
    let rt = runtime(1);
    let normal = rt
        .create_mock_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
        .unwrap();
    let high = rt
        .create_mock_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
        .unwrap();
    assert_eq!(high.priority(), StreamPriority::High);
    let release = block(rt.default_mock_stream());
    let log = Log::default();
    let l = log.clone();
    normal
        .launch_host_callback(Box::new(move || l.push("normal")), LaunchOptions::new())
        .unwrap();
    let l = log.clone();
    high.launch_host_callback(Box::new(move || l.push("high")), LaunchOptions::new())
        .unwrap();
    release.send(()).unwrap();
    normal.synchronize().unwrap();
    high.synchronize().unwrap();
    assert_eq!(log.take(), vec!["high", "normal"]);
}

#[test]
fn equal_priority_work_starts_oldest_first() {
    let rt = runtime(1);
    let streams: Vec<&MockStream> = (0..3).map(|_| stream(&rt)).collect();
    let release = block(rt.default_mock_stream());
    let log = Log::default();
    for index in [2, 0, 1] {
        let l = log.clone();
        streams[index]
            .launch_host_callback(
                Box::new(move || l.push(format!("s{index}"))),
                LaunchOptions::new(),
            )
            .unwrap();
    }
    release.send(()).unwrap();
    for s in &streams {
        s.synchronize().unwrap();
    }
    assert_eq!(log.take(), vec!["s2", "s0", "s1"]);
}

/// A launch on a stream whose operation is running takes no scheduler
/// lock (it waits in the stream's inbox), yet keeps its place in the ready
/// order: here it was launched before the other stream's, so it starts
/// first once the running operation ends.
#[test]
fn work_launched_behind_a_running_operation_keeps_its_place_in_the_ready_order() {
    let rt = runtime(1);
    let (busy, idle) = (stream(&rt), stream(&rt));
    let release = block(busy);
    let log = Log::default();
    for (name, s) in [("busy", busy), ("idle", idle)] {
        let l = log.clone();
        s.launch_host_callback(Box::new(move || l.push(name)), LaunchOptions::new())
            .unwrap();
    }
    assert_eq!(
        (busy.pending_operations(), idle.pending_operations()),
        (2, 1)
    );
    release.send(()).unwrap();
    busy.synchronize().unwrap();
    idle.synchronize().unwrap();
    assert_eq!(log.take(), vec!["busy", "idle"]);
}

#[test]
fn query_reports_completion_of_earlier_work() {
    let rt = runtime(2);
    let s = stream(&rt);
    assert_eq!(s.query(), Ok(true), "an idle stream is done");
    let release = block(s);
    let counters = Counters::default();
    s.launch_host_callback(Box::new(|| {}), counters.options())
        .unwrap();
    assert_eq!(s.query(), Ok(false));
    assert_eq!(s.pending_operations(), 2);
    release.send(()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(counters.calls(), 1, "synchronize waits for completions");
    assert_eq!(s.query(), Ok(true));
    assert_eq!(s.pending_operations(), 0);
}

#[test]
fn enqueued_operations_count_every_accepted_launch_and_never_fall() {
    let rt = runtime(2);
    let s = stream(&rt);
    assert_eq!(s.enqueued_operations(), 0);
    let release = block(s);
    s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap();
    assert_eq!(s.enqueued_operations(), 2, "the block and the callback");
    release.send(()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        (s.enqueued_operations(), s.pending_operations()),
        (2, 0),
        "completion lowers the pending count, not the enqueued one"
    );
    s.close();
    assert!(
        s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .is_err()
    );
    assert_eq!(
        s.enqueued_operations(),
        2,
        "a refused launch is not counted"
    );
}

#[test]
fn query_is_false_while_a_completion_runs() {
    let rt = runtime(2);
    let rt = Arc::new(rt);
    let s = rt.default_mock_stream();
    let (tx, rx) = mpsc::channel();
    let inner = Arc::clone(&rt);
    s.launch_host_callback(
        Box::new(|| {}),
        LaunchOptions::new().on_complete(move |_| {
            let _ = tx.send(inner.default_mock_stream().query());
        }),
    )
    .unwrap();
    assert_eq!(rx.recv_timeout(DEADLOCK).unwrap(), Ok(false));
    s.synchronize().unwrap();
    assert_eq!(s.query(), Ok(true));
}

#[test]
fn synchronize_waits_only_for_work_enqueued_before_it() {
    let rt = runtime(2);
    let s = stream(&rt);
    s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap();
    s.synchronize().unwrap();
    // Idle stream: returns at once, repeatedly.
    s.synchronize().unwrap();
    s.synchronize().unwrap();
}

fn bad_program(rt: &MockRuntime, s: &dyn Stream) -> flex_rt::CompositeAddress {
    let mut bytes = KernelDescriptor::fill(1, 0.0, rt.allocate(4).unwrap().start()).to_bytes();
    bytes[0] = b'X';
    upload(rt, s, bytes.to_vec())
}

#[test]
fn errors_are_sticky() {
    let rt = runtime(2);
    let s = stream(&rt);
    let program = bad_program(&rt, s);
    let counters = Counters::default();
    let release = block(s);
    s.launch_compute(&program, counters.options()).unwrap();
    s.launch_host_callback(Box::new(|| panic!("must not run")), counters.options())
        .unwrap();
    s.launch_fill(&program, 1.0, flex_rt::DataFormat::Fp32, counters.options())
        .unwrap();
    release.send(()).unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::EXECUTION_FAILED);
    assert_eq!(err.call(), "launch_compute");
    assert!(err.message().contains("bad magic"), "{err}");
    assert_eq!(
        counters.statuses(),
        vec![
            Status::EXECUTION_FAILED,
            Status::STREAM_FAILED,
            Status::STREAM_FAILED
        ]
    );
    // Sticky: the same first error from every later call.
    assert_eq!(s.synchronize().unwrap_err(), err);
    assert_eq!(s.query().unwrap_err(), err);
    let refused = s
        .launch_host_callback(Box::new(|| {}), counters.options())
        .unwrap_err();
    assert_eq!(refused.status(), Status::STREAM_FAILED);
    assert!(refused.message().contains("bad magic"), "{refused}");
    assert_eq!(counters.calls(), 3);
    assert!(rt.has_stream_error().unwrap());
    // Other streams are unaffected.
    let other = stream(&rt);
    other
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap();
    other.synchronize().unwrap();
}

#[test]
fn completions_are_called_exactly_once_and_refusals_drop_them() {
    let rt = runtime(2);
    let s = stream(&rt);
    let counters = Counters::default();
    let host_fn_drops = Arc::new(AtomicUsize::new(0));

    // 1. succeeds
    s.launch_host_callback(Box::new(|| {}), counters.options())
        .unwrap();
    // refused at launch: size mismatch
    let address = rt.allocate(8).unwrap();
    let wrong = HostBuffer::zeroed(7);
    let err = s
        .launch_h2d(&wrong, &address, counters.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    // refused at launch: injected fault
    s.fail_nth_launch(1);
    let err = s
        .launch_host_callback(Box::new(|| {}), counters.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::LAUNCH_FAILED);
    // 2. fails on the device (the stream is held so that 3. is queued
    // before 2. runs)
    let program = bad_program(&rt, s);
    let release = block(s);
    s.launch_compute(&program, counters.options()).unwrap();
    // 3. skipped: its host function is dropped without running
    let guard = super::DropCount(Arc::clone(&host_fn_drops));
    s.launch_host_callback(
        Box::new(move || {
            let _guard = guard;
            panic!("must not run");
        }),
        counters.options(),
    )
    .unwrap();
    release.send(()).unwrap();
    assert!(s.synchronize().is_err());
    // refused at launch: stream failed
    assert!(
        s.launch_host_callback(Box::new(|| {}), counters.options())
            .is_err()
    );

    assert_eq!(counters.calls(), 3);
    assert_eq!(
        counters.statuses(),
        vec![
            Status::SUCCESS,
            Status::EXECUTION_FAILED,
            Status::STREAM_FAILED
        ]
    );
    assert_eq!(
        counters.drops(),
        6,
        "every completion closure is dropped once"
    );
    assert_eq!(host_fn_drops.load(Ordering::SeqCst), 1);
}

#[test]
fn panicking_host_callback_fails_the_stream_not_the_engine() {
    let rt = runtime(1);
    let s = stream(&rt);
    let counters = Counters::default();
    s.launch_host_callback(Box::new(|| panic!("callback exploded")), counters.options())
        .unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
    assert!(err.message().contains("callback exploded"), "{err}");
    assert_eq!(counters.statuses(), vec![Status::HOST_CALLBACK_FAILED]);
    // The only engine still runs work.
    let other = stream(&rt);
    let ran = Arc::new(AtomicUsize::new(0));
    launch_counted(other, &ran);
    other.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn host_fn_errors_fail_the_stream() {
    let rt = runtime(1);
    let s = stream(&rt);
    s.enqueue(
        Op::host_fn(|| Err("status 42".into())),
        LaunchOptions::new(),
    )
    .unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
    assert!(err.message().contains("status 42"), "{err}");
}

#[test]
fn panicking_completion_fails_the_stream_not_the_engine() {
    let rt = runtime(1);
    let s = stream(&rt);
    s.launch_host_callback(
        Box::new(|| {}),
        LaunchOptions::new().on_complete(|_| panic!("completion exploded")),
    )
    .unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
    assert!(err.message().contains("completion exploded"), "{err}");
    let other = stream(&rt);
    other
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap();
    other.synchronize().unwrap();
}

/// A completion that panics with a payload whose own drop panics fails
/// its stream as any completion panic does: the second panic is stopped
/// too, and the engine finishes the stream (it unwound out of the engine,
/// and the stream's synchronize hung).
#[test]
fn a_completion_panic_whose_payload_panics_on_drop_still_fails_the_stream() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's drop exploded");
        }
    }
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = runtime(1);
        let s = stream(&rt);
        s.launch_host_callback(
            Box::new(|| {}),
            LaunchOptions::new().on_complete(|_| std::panic::panic_any(Bomb)),
        )
        .unwrap();
        let err = s.synchronize().unwrap_err();
        let other = stream(&rt);
        other
            .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .unwrap();
        let _ = done.send((err, other.synchronize()));
    });
    let (err, other) = finished
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("synchronize returned");
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED, "{err}");
    assert!(err.message().contains("non-string payload"), "{err}");
    assert_eq!(other, Ok(()), "the engine runs other streams");
    // A host callback's panic with such a payload is the callback's
    // failure, as any panic of it is (it was the device's INTERNAL error).
    let rt = runtime(1);
    let s = stream(&rt);
    s.launch_host_callback(
        Box::new(|| std::panic::panic_any(Bomb)),
        LaunchOptions::new(),
    )
    .unwrap();
    let err = s.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED, "{err}");
}

#[test]
fn callbacks_may_launch_but_not_synchronize_their_runtime() {
    let rt = Arc::new(runtime(1));
    let target = stream(&rt).id();
    let (tx, rx) = mpsc::channel();
    let inner = Arc::clone(&rt);
    let log = Log::default();
    let l = log.clone();
    rt.default_mock_stream()
        .launch_host_callback(
            Box::new(move || {
                let stream = inner.mock_stream(target).unwrap();
                let launched = stream
                    .launch_host_callback(Box::new(move || l.push("nested")), LaunchOptions::new());
                let sync = inner.default_mock_stream().synchronize();
                let _ = tx.send((launched, sync));
            }),
            LaunchOptions::new(),
        )
        .unwrap();
    let (launched, sync) = rx.recv_timeout(DEADLOCK).unwrap();
    launched.unwrap();
    assert_eq!(sync.unwrap_err().status(), Status::UNSUPPORTED);
    rt.default_mock_stream().synchronize().unwrap();
    rt.mock_stream(target).unwrap().synchronize().unwrap();
    assert_eq!(log.take(), vec!["nested"]);
}

#[test]
fn a_completion_can_read_the_buffer_its_copy_wrote() {
    let rt = runtime(2);
    let s = rt.default_mock_stream();
    let address = upload(&rt, s, vec![7, 8, 9]);
    let out = HostBuffer::zeroed(3);
    let (tx, rx) = mpsc::channel();
    let seen = out.clone();
    s.launch_d2h(
        &address,
        &out,
        LaunchOptions::new().on_complete(move |r| {
            let _ = tx.send((r, seen.to_vec()));
        }),
    )
    .unwrap();
    let (result, bytes) = rx.recv_timeout(DEADLOCK).unwrap();
    result.unwrap();
    assert_eq!(bytes, vec![7, 8, 9]);
}

#[test]
fn leases_are_held_until_the_copy_completes() {
    let rt = runtime(2);
    let s = stream(&rt);
    let address = rt.allocate(4).unwrap();
    let release = block(s);
    let out = HostBuffer::zeroed(4);
    s.launch_d2h(&address, &out, LaunchOptions::new()).unwrap();
    let err = s
        .launch_d2h(&address, &out, LaunchOptions::new())
        .unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(err.message().contains("cannot be written"), "{err}");
    assert_eq!(
        s.pending_operations(),
        2,
        "the refused launch enqueued nothing"
    );
    release.send(()).unwrap();
    s.synchronize().unwrap();
    assert!(out.lease_for_write("test").is_ok());
}

#[test]
fn launches_from_many_threads_are_serialized() {
    let rt = runtime(2);
    let s = stream(&rt);
    let log = Log::default();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let log = log.clone();
            scope.spawn(move || {
                for i in 0..100 {
                    let l = log.clone();
                    s.launch_host_callback(
                        Box::new(move || l.push(format!("{thread} {i}"))),
                        LaunchOptions::new(),
                    )
                    .unwrap();
                }
            });
        }
    });
    s.synchronize().unwrap();
    let events = log.take();
    assert_eq!(events.len(), 400);
    for thread in 0..4 {
        let mine: Vec<&String> = events
            .iter()
            .filter(|e| e.starts_with(&format!("{thread} ")))
            .collect();
        let expected: Vec<String> = (0..100).map(|i| format!("{thread} {i}")).collect();
        assert_eq!(mine, expected.iter().collect::<Vec<_>>());
    }
}

#[test]
fn pipeline_barrier_changes_nothing_observable() {
    let rt = runtime(2);
    let s = stream(&rt);
    let log = Log::default();
    for i in 0..10 {
        let l = log.clone();
        s.launch_host_callback(
            Box::new(move || l.push(i.to_string())),
            LaunchOptions::new().pipeline_barrier(i % 2 == 0),
        )
        .unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(
        log.take(),
        (0..10).map(|i| i.to_string()).collect::<Vec<_>>()
    );
}

#[test]
fn every_sync_policy_waits_for_the_work_and_reports_its_error() {
    for policy in [
        SyncPolicy::Auto,
        SyncPolicy::Spin,
        SyncPolicy::Yield,
        SyncPolicy::Blocking,
    ] {
        let rt = runtime_with_policy(crate::config::DEFAULT_ENGINES, policy);
        let s = rt.default_mock_stream();
        let ran = Arc::new(AtomicUsize::new(0));
        // Work longer than the automatic spin, so `Auto` blocks in the end.
        let sleep_then_count = |millis| {
            let ran = Arc::clone(&ran);
            s.launch_host_callback(
                Box::new(move || {
                    std::thread::sleep(std::time::Duration::from_millis(millis));
                    ran.fetch_add(1, Ordering::SeqCst);
                }),
                LaunchOptions::new(),
            )
            .unwrap();
        };
        for _ in 0..3 {
            sleep_then_count(2);
        }
        s.synchronize().unwrap();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            3,
            "{policy:?}: synchronize returned early"
        );
        // An event's wait, longer than the spin too, while another stream
        // completes work all along (its completions wake nobody waiting on
        // the first stream, and must not be taken for the awaited one).
        let other = stream(&rt);
        let event = rt.create_event(false).unwrap();
        sleep_then_count(5);
        s.record_event(&*event, None).unwrap();
        let busy = Arc::new(AtomicUsize::new(0));
        for _ in 0..50 {
            launch_counted(other, &busy);
        }
        event.synchronize().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 4, "{policy:?}: event wait");
        other.synchronize().unwrap();
        assert_eq!(busy.load(Ordering::SeqCst), 50, "{policy:?}");
        // Short work, many times: the spinning paths see each completion.
        for _ in 0..200 {
            s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                .unwrap();
            s.synchronize().unwrap();
        }
        s.launch_host_callback(
            Box::new(|| panic!("fails the stream")),
            LaunchOptions::new(),
        )
        .unwrap();
        let err = s.synchronize().unwrap_err();
        assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED, "{policy:?}");
    }
}

#[test]
fn under_auto_at_most_one_idle_engine_watches_for_work() {
    let rt = runtime_with_policy(4, SyncPolicy::Auto);
    let device = rt.device_weak().upgrade().unwrap();
    let streams: Vec<&MockStream> = (0..8).map(|_| stream(&rt)).collect();
    let ran = Arc::new(AtomicUsize::new(0));
    let mut most = 0;
    // Bursts over 8 streams: the four engines take work and run out of it
    // again and again, each time deciding whether to watch.
    for _ in 0..300 {
        for s in &streams {
            launch_counted(s, &ran);
        }
        for _ in 0..64 {
            most = most.max(device.scheduler.lock().watching);
            std::hint::spin_loop();
        }
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    assert_eq!(ran.load(Ordering::SeqCst), 300 * 8, "every launch ran");
    assert!(most <= 1, "{most} idle engines watched at once");
}

#[test]
fn under_auto_no_idle_engine_watches_while_another_is_busy() {
    let rt = runtime_with_policy(2, SyncPolicy::Auto);
    let device = rt.device_weak().upgrade().unwrap();
    let (blocked, busy) = (stream(&rt), stream(&rt));
    // One engine is held by a host function until the end.
    let release = block(blocked);
    // The other runs short work and runs out of it again and again; each
    // time it is idle while the first is busy, so it parks at once.
    let mut most = 0;
    // Fewer rounds under Miri: the held engine's host function waits
    // `DEADLOCK` at most, and 300 rounds there can take longer.
    for _ in 0..if cfg!(miri) { 30 } else { 300 } {
        busy.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .unwrap();
        busy.synchronize().unwrap();
        for _ in 0..16 {
            most = most.max(device.scheduler.lock().watching);
        }
    }
    release.send(()).unwrap();
    blocked.synchronize().unwrap();
    assert_eq!(most, 0, "an idle engine watched while the other was busy");
}

#[test]
fn engines_are_told_of_a_ready_stream_only_when_none_is_coming_for_it() {
    // Two engines, each held by a blocked stream; `c` and `d` get one
    // operation each. `c`'s launch makes the first stream ready and tells
    // the engines (the work epoch moves by one); `d`'s finds `c` ready,
    // which an engine is coming for already, so it moves nothing. When the
    // first engine is released it takes `c` with `d` still ready, and then
    // `d`: with the other engine busy and none idle, there is no one to
    // wake, so the epoch does not move either.
    let rt = runtime_with_policy(2, SyncPolicy::Blocking);
    let device = rt.device_weak().upgrade().unwrap();
    let epoch = || device.work_epoch.load(Ordering::SeqCst);
    let (a, b, c, d) = (stream(&rt), stream(&rt), stream(&rt), stream(&rt));
    let release_a = block(a);
    let release_b = block(b);
    let ran = Arc::new(AtomicUsize::new(0));
    let before = epoch();
    launch_counted(c, &ran);
    let after_c = epoch();
    launch_counted(d, &ran);
    let after_d = epoch();
    assert_eq!(
        (after_c - before, after_d - after_c),
        (1, 0),
        "the work epoch's moves by the launches on `c` and `d`"
    );
    release_a.send(()).unwrap();
    c.synchronize().unwrap();
    d.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert_eq!(
        epoch(),
        after_d,
        "the work epoch moved while every engine was busy"
    );
    release_b.send(()).unwrap();
    a.synchronize().unwrap();
    b.synchronize().unwrap();
}

#[test]
fn a_spinning_wait_ends_at_its_deadline_or_when_it_is_done() {
    use std::time::{Duration, Instant};

    for policy in [SyncPolicy::Auto, SyncPolicy::Spin, SyncPolicy::Yield] {
        let config = crate::MockSystemBuilder::new()
            .memory_bytes(1 << 20)
            .region_bytes(1 << 18)
            .sync_policy(policy)
            .build_config()
            .unwrap();
        let device = crate::engine::Device::new(0, &config);
        // Done already: returns at once.
        assert!(device.watch(None, || true), "{policy:?}");
        // Never done: ends at the deadline, however often it is called.
        let started = Instant::now();
        let deadline = started + Duration::from_millis(5);
        for _ in 0..3 {
            assert!(!device.watch(Some(deadline), || false), "{policy:?}");
        }
        let spent = started.elapsed();
        assert!(spent >= Duration::from_millis(5), "{policy:?}: {spent:?}");
        assert!(spent < Duration::from_millis(500), "{policy:?}: {spent:?}");
    }
    let blocking = crate::MockSystemBuilder::new()
        .memory_bytes(1 << 20)
        .region_bytes(1 << 18)
        .sync_policy(SyncPolicy::Blocking)
        .build_config()
        .unwrap();
    let device = crate::engine::Device::new(0, &blocking);
    assert!(!device.watch(None, || false), "blocking never spins");
    assert!(device.watch(None, || true), "but looks once");
}

/// `MockStream::close`: the work queued before it (here behind a held
/// operation, so the launches went to the inbox) still runs; every launch,
/// record and device-side wait after it is refused with `INVALID_HANDLE`,
/// and the stream stays healthy for `query` and `synchronize`.
#[test]
fn a_closed_stream_runs_what_was_queued_and_refuses_the_rest() {
    let rt = runtime(2);
    let s = stream(&rt);
    let other = rt
        .create_mock_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let release = block(s);
    for _ in 0..3 {
        launch_counted(s, &ran);
    }
    s.close();
    s.close();
    let refused = s
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .unwrap_err();
    assert_eq!(refused.status(), Status::INVALID_HANDLE);
    assert!(refused.to_string().contains("destroyed"), "{refused}");
    let event = rt.create_event(false).unwrap();
    assert_eq!(
        s.record_event(event.as_ref(), None).unwrap_err().status(),
        Status::INVALID_HANDLE
    );
    other.record_event(event.as_ref(), None).unwrap();
    assert_eq!(
        s.wait_event(event.as_ref()).unwrap_err().status(),
        Status::INVALID_HANDLE
    );
    release.send(()).unwrap();
    s.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    assert!(s.query().unwrap());
    assert!(!rt.has_stream_error().unwrap());
}

/// A caller holding a lock of its own made with the device's `sync::Mutex`
/// (public, for the C library) launches on an idle stream and spins in
/// `synchronize`: the parked engine is woken at once, not once the caller
/// releases its lock (which it never would: it spins for the engine).
#[test]
fn a_caller_holding_a_device_mutex_of_its_own_is_not_kept_waiting() {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = runtime_with_policy(1, SyncPolicy::Spin);
        let s = stream(&rt);
        // Idle past its watch, the engine blocks.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let own = crate::sync::Mutex::new(());
        let _held = own.lock();
        s.launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .unwrap();
        s.synchronize().unwrap();
        let _ = done.send(());
    });
    assert!(
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .is_ok(),
        "synchronize returned"
    );
}

/// A completion that panics with a payload whose drop ends another
/// runtime (its last handle): the payload is the caller's value and is
/// dropped without the scheduler lock, so that runtime's shutdown wakes
/// its parked engines and joins them. Dropped under the lock, the wake-ups
/// waited for its release, which waited for the join: the engine hung.
#[test]
fn a_completions_panic_payload_is_dropped_without_the_lock() {
    struct EndsRuntime {
        _runtime: MockRuntime,
    }
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = runtime(1);
        let s = stream(&rt);
        let other = runtime(1);
        // Idle past its watch, the other runtime's engine blocks.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let payload = std::sync::Mutex::new(Some(EndsRuntime { _runtime: other }));
        s.launch_host_callback(
            Box::new(|| {}),
            LaunchOptions::new().on_complete(move |_| {
                if let Some(ends) = payload.lock().unwrap().take() {
                    std::panic::panic_any(ends);
                }
            }),
        )
        .unwrap();
        let err = s.synchronize().unwrap_err();
        let _ = done.send(err);
    });
    let err = finished
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("synchronize returned");
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
    assert!(err.message().contains("non-string payload"), "{err}");
}

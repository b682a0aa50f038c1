//! Batches: an engine runs a stream's queued operations one after another
//! without the scheduler lock, at most `BATCH_LIMIT` while streams of its
//! priority wait, and stops wherever running them one at a time could
//! differ otherwise: a stream of higher priority made ready, a change of
//! the stream's state, a record's mark. And a thread blocked on the stream is woken by
//! the operation of a batch that completes what it waits for, not at the
//! batch's end (nor by each operation before it).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use flex_rt::{LaunchOptions, Runtime, Status, Stream, StreamMode, StreamPriority, SyncPolicy};

use super::{Counters, DEADLOCK, Log, block, launch_counted, runtime, runtime_with_policy, stream};
use crate::op::Op;
use crate::stream::MockStream;

/// Enqueues a host function that logs `name`, tells the test it runs, and
/// returns only once the test answers (or the sender is dropped).
fn handshake(
    s: &MockStream,
    log: &Log,
    name: &'static str,
) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (running_tx, running_rx) = mpsc::channel();
    let (answer_tx, answer_rx) = mpsc::channel::<()>();
    let log = log.clone();
    s.enqueue(
        Op::host_fn(move || {
            log.push(name);
            let _ = running_tx.send(());
            let _ = answer_rx.recv_timeout(DEADLOCK);
            Ok(())
        }),
        LaunchOptions::new(),
    )
    .unwrap();
    (running_rx, answer_tx)
}

/// Enqueues a host function that logs `name`.
fn logged(s: &MockStream, log: &Log, name: &'static str) {
    let log = log.clone();
    s.launch_host_callback(Box::new(move || log.push(name)), LaunchOptions::new())
        .unwrap();
}

/// One engine. While it runs `a1`, with `a2` and `a3` queued behind it (`a2`
/// taken with it: the engine's batches start at one more), a
/// high-priority stream gets work; with `others_ready`, a normal-priority
/// stream `n` is ready all along (launched after `a3`). Returns the order
/// the operations ran in.
fn high_priority_launch_during_a_batch(others_ready: bool) -> Vec<String> {
    let rt = runtime(1);
    let s = stream(&rt);
    let n = stream(&rt);
    let high = rt
        .create_mock_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
        .unwrap();
    let log = Log::default();
    let release = block(s);
    let (running, answer) = handshake(s, &log, "a1");
    logged(s, &log, "a2");
    logged(s, &log, "a3");
    if others_ready {
        logged(n, &log, "n");
    }
    drop(release);
    running.recv_timeout(DEADLOCK).unwrap();
    logged(high, &log, "high");
    answer.send(()).unwrap();
    for stream in [s, n, high] {
        stream.synchronize().unwrap();
    }
    log.take()
}

#[test]
fn a_high_priority_launch_during_a_batch_runs_before_the_rest_of_it() {
    // One at a time, the engine would take the high-priority work next;
    // the batch must stop after `a1` for the same order.
    assert_eq!(
        high_priority_launch_during_a_batch(false),
        ["a1", "high", "a2", "a3"]
    );
}

#[test]
fn a_high_priority_launch_stops_a_batch_while_other_streams_are_ready() {
    // A batch does not stop for `n`, but the high-priority launch, which
    // finds a stream ready and so tells no engine, must still stop it
    // after `a1`. Then `a2` and `a3`, older than `n`, run first.
    assert_eq!(
        high_priority_launch_during_a_batch(true),
        ["a1", "high", "a2", "a3", "n"]
    );
}

#[test]
fn a_high_priority_stream_made_ready_again_by_its_own_engine_stops_no_batch() {
    // The engine that finishes an operation of a high-priority stream with
    // more queued takes a high-priority stream before it lets the lock go
    // (`Scheduler::finish` says why batches running on other engines need
    // not stop for this one). This counts the epoch's moves only. Launching
    // `h`'s work moves the epoch once (the stream made ready); its
    // operations finishing with more queued behind them move it no more.
    let rt = runtime(1);
    let device = rt.device_weak().upgrade().unwrap();
    let epoch = || device.high_ready_epoch.load(Ordering::SeqCst);
    let h = rt
        .create_mock_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
        .unwrap();
    let before = epoch();
    assert_eq!(run_queued_behind_a_block(h, 3), 3);
    assert_eq!(epoch() - before, 1, "moves of the high-ready epoch");
}

/// Queues `count` operations on `s` behind a blocked one, releases it, and
/// waits for them; returns how many ran.
fn run_queued_behind_a_block(s: &MockStream, count: usize) -> usize {
    let release = block(s);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..count {
        launch_counted(s, &ran);
    }
    drop(release);
    s.synchronize().unwrap();
    ran.load(Ordering::SeqCst)
}

#[test]
fn an_equal_priority_stream_waits_for_one_batch_at_most() {
    // One engine. Stream `a` has 40 operations queued behind a blocked one,
    // and `b` one operation launched after `a`'s first: `b`'s is older
    // than `a`'s other 39, yet may wait for the batch taken with `a`'s
    // first (a device orders nothing between streams of one priority),
    // but for no more than that: exactly `BATCH_LIMIT` operations run
    // before it (`a0` and the 31 taken with it: the limit, and a batch of
    // one more would pass it), and `a`'s run in their order around it.
    // First 200 operations queued on a third stream let the engine's
    // batches grow to their largest.
    let rt = runtime(1);
    let (a, b, warm_up) = (stream(&rt), stream(&rt), stream(&rt));
    run_queued_behind_a_block(warm_up, 200);
    let log = Log::default();
    let release = block(a);
    let launch = |s: &MockStream, name: String| {
        let log = log.clone();
        s.launch_host_callback(Box::new(move || log.push(name)), LaunchOptions::new())
            .unwrap();
    };
    launch(a, "a0".to_owned());
    launch(b, "b".to_owned());
    for i in 1..40 {
        launch(a, format!("a{i}"));
    }
    drop(release);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    let ran = log.take();
    let b_at = ran.iter().position(|name| name == "b").unwrap();
    assert_eq!(
        b_at,
        crate::engine::BATCH_LIMIT,
        "operations of `a` before `b`: {ran:?}"
    );
    let a_order: Vec<String> = (0..40).map(|i| format!("a{i}")).collect();
    let ran_a: Vec<&String> = ran.iter().filter(|name| *name != "b").collect();
    assert_eq!(ran_a, a_order.iter().collect::<Vec<_>>());
}

#[test]
fn a_stream_waiting_on_a_marker_runs_before_the_work_queued_behind_the_marker() {
    // One engine. On stream `a`, a record with a completion (a marker
    // operation) and then `y`; stream `b` waits on that record, then `w`,
    // launched before `y`. When the marker finishes, `b` and `a` are both
    // ready and `w` was enqueued first: one operation at a time runs `w`
    // before `y`, so no batch may carry `y` along behind the marker.
    let rt = runtime(1);
    let a = stream(&rt);
    let b = stream(&rt);
    let log = Log::default();
    let event = rt.create_event(false).unwrap();
    let release = block(a);
    a.record_event(&*event, Some(Box::new(|_| {}))).unwrap();
    b.wait_event(&*event).unwrap();
    logged(b, &log, "w");
    logged(a, &log, "y");
    drop(release);
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_eq!(log.take(), ["w", "y"]);
}

/// 42 operations queued on a stream: a held one, 20 behind it, a second
/// held one, and 20 more ([`queue_42`]).
struct Queued42 {
    /// Releases the first held operation.
    release: mpsc::Sender<()>,
    /// Tells that the second held one runs, the 21 before it complete.
    running: mpsc::Receiver<()>,
    /// Releases the second held one.
    answer: mpsc::Sender<()>,
    /// How many of the 40 others have run.
    ran: Arc<AtomicUsize>,
}

/// Queues the [`Queued42`] operations on `s`, the first held.
fn queue_42(s: &MockStream) -> Queued42 {
    let ran = Arc::new(AtomicUsize::new(0));
    let launch_twenty = || {
        for _ in 0..20 {
            let ran = Arc::clone(&ran);
            s.launch_host_callback(
                Box::new(move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                }),
                LaunchOptions::new(),
            )
            .unwrap();
        }
    };
    let release = block(s);
    launch_twenty();
    let (running, answer) = handshake(s, &Log::default(), "middle");
    launch_twenty();
    Queued42 {
        release,
        running,
        answer,
        ran,
    }
}

/// Has a thread block in `wait` on `s` (of a one-engine `Blocking`
/// runtime), which no completion before the 42nd of the [`queue_42`]
/// operations ends: it blocks at once, the completion that ends its wait
/// wakes it, and none before that one does. Were sleepers woken by any
/// completion (or by the next one), the first held operation's would
/// wake it.
fn check_woken_once_by_the_completion_it_waits_for(
    s: &MockStream,
    queued: Queued42,
    wait: impl FnOnce() -> flex_rt::Result<()> + Send,
) {
    std::thread::scope(|scope| {
        let waiter = scope.spawn(wait);
        while !s.has_sleepers() {
            std::thread::yield_now();
        }
        drop(queued.release);
        queued.running.recv_timeout(DEADLOCK).unwrap();
        assert_eq!(queued.ran.load(Ordering::SeqCst), 20);
        assert_eq!(s.wakes(), 0, "woken before the completion it waits for");
        queued.answer.send(()).unwrap();
        waiter.join().unwrap().unwrap();
    });
    assert_eq!(queued.ran.load(Ordering::SeqCst), 40);
    assert_eq!(s.wakes(), 1);
}

#[test]
fn a_blocked_synchronize_is_woken_once_not_by_each_operation_before_its_last() {
    let rt = runtime_with_policy(1, SyncPolicy::Blocking);
    let s = stream(&rt);
    let queued = queue_42(s);
    check_woken_once_by_the_completion_it_waits_for(s, queued, || s.synchronize());
}

#[test]
fn a_blocked_event_synchronize_is_woken_once_by_the_operation_that_reaches_the_record() {
    // The record is a mark after the 42 operations (no completion, no
    // wait): the 42nd completion reaches it.
    let rt = runtime_with_policy(1, SyncPolicy::Blocking);
    let s = stream(&rt);
    let queued = queue_42(s);
    let event = rt.create_event(false).unwrap();
    s.record_event(&*event, None).unwrap();
    check_woken_once_by_the_completion_it_waits_for(s, queued, || event.synchronize());
}

#[test]
fn a_blocked_event_synchronize_is_woken_once_by_its_marker_operation() {
    // A record with a completion is a marker operation, the 43rd: its own
    // completion wakes the thread, the 42 before it wake nobody.
    let rt = runtime_with_policy(1, SyncPolicy::Blocking);
    let s = stream(&rt);
    let queued = queue_42(s);
    let event = rt.create_event(false).unwrap();
    let notified = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&notified);
    s.record_event(
        &*event,
        Some(Box::new(move |result| {
            assert!(result.is_ok());
            seen.store(true, Ordering::SeqCst);
        })),
    )
    .unwrap();
    check_woken_once_by_the_completion_it_waits_for(s, queued, || event.synchronize());
    assert!(notified.load(Ordering::SeqCst));
}

#[test]
fn a_thread_blocked_on_the_stream_is_woken_by_an_operation_inside_a_batch() {
    // `synchronize` waits for `a` only; `b`, enqueued after the call and
    // taken in one batch with `a`, runs only once that call has returned.
    // Woken at the end of the batch instead, the two would wait for each
    // other (until `b` gave up at the deadlock bound and failed the stream).
    // `a` holds the engine for a while once it runs, so that a waiter woken
    // early (by the blocked operation before it) would have blocked again.
    let rt = runtime_with_policy(1, SyncPolicy::Blocking);
    let s = stream(&rt);
    let log = Log::default();
    let release = block(s);
    let (running, answer) = handshake(s, &log, "a");
    let returned = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let result = s.synchronize();
            returned.store(true, Ordering::SeqCst);
            result
        });
        while !s.has_sleepers() {
            std::thread::yield_now();
        }
        let seen = Arc::clone(&returned);
        s.enqueue(
            Op::host_fn(move || {
                let deadline = std::time::Instant::now() + DEADLOCK;
                while !seen.load(Ordering::SeqCst) {
                    if std::time::Instant::now() > deadline {
                        return Err("synchronize never returned".into());
                    }
                    std::thread::yield_now();
                }
                Ok(())
            }),
            LaunchOptions::new(),
        )
        .unwrap();
        drop(release);
        running.recv_timeout(DEADLOCK).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        answer.send(()).unwrap();
        waiter.join().unwrap().unwrap();
    });
    s.synchronize().unwrap();
}

#[test]
fn needs_shutdown_set_during_a_batch_stops_the_operations_not_started() {
    // Set while `a1` runs: the operations behind it complete with SHUTDOWN
    // without running, as the stream's docs say, although the engine took
    // them with `a1`.
    let rt = runtime(1);
    let s = stream(&rt);
    let log = Log::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let counters = Counters::default();
    let release = block(s);
    let (running, answer) = handshake(s, &log, "a1");
    for _ in 0..2 {
        let runs = Arc::clone(&runs);
        s.launch_host_callback(
            Box::new(move || {
                runs.fetch_add(1, Ordering::SeqCst);
            }),
            counters.options(),
        )
        .unwrap();
    }
    drop(release);
    running.recv_timeout(DEADLOCK).unwrap();
    s.set_needs_shutdown();
    answer.send(()).unwrap();
    assert_eq!(s.synchronize().unwrap_err().status(), Status::SHUTDOWN);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(counters.statuses(), [Status::SHUTDOWN, Status::SHUTDOWN]);
}

#[test]
fn a_mark_between_queued_operations_is_reached_before_the_next_one_runs() {
    // The record sits between `a1` and `a2`, both queued behind a blocked
    // operation: it must be complete when `a2` runs, not only once the
    // engine has run everything it took.
    let rt = runtime(1);
    let s = stream(&rt);
    let event = rt.create_event(false).unwrap();
    let release = block(s);
    let count = Arc::new(AtomicUsize::new(0));
    launch_counted(s, &count);
    s.record_event(&*event, None).unwrap();
    let (seen_tx, seen_rx) = mpsc::channel();
    s.launch_host_callback(
        Box::new(move || {
            let _ = seen_tx.send(event.query());
        }),
        LaunchOptions::new(),
    )
    .unwrap();
    drop(release);
    s.synchronize().unwrap();
    assert!(seen_rx.recv_timeout(DEADLOCK).unwrap().unwrap());
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn a_batch_runs_queued_operations_in_order_and_counts_each() {
    // Ten operations queued behind a blocked one are taken together; they
    // run in launch order and the stream counts all of them complete.
    let rt = runtime(1);
    let s = stream(&rt);
    let log = Log::default();
    let release = block(s);
    let names = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    for name in names {
        logged(s, &log, name);
    }
    assert_eq!(s.pending_operations(), 11);
    drop(release);
    s.synchronize().unwrap();
    assert_eq!(log.take(), names);
    assert_eq!(s.pending_operations(), 0);
    assert!(s.query().unwrap());
}

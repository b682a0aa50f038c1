//! Events through the process-wide pool (`SpyreEvent`, the stream methods
//! `record_event` / `wait_event` / `wait_stream`, and the awaitable
//! `synchronize_async`), on the software device in process and through the
//! FFI path. Each test runs in a fresh process (the runtime starts once per
//! process).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flex_rt::HardwareBackend;
use spyre_stream::{
    Device, Error, EventRole, LaunchOptions, SpyreEvent, SpyreStream, Status, SynchronizeFuture,
    capabilities, set_backend, stream_from_pool,
};
use spyre_tests::conformance::{Gate, PATIENCE};
use spyre_tests::{isolated, mock_cdylib};

const MOCK: (&str, &str) = ("SPYRE_BACKEND", "mock");

fn pool_stream() -> SpyreStream {
    stream_from_pool(Device::CURRENT, 0).expect("stream_from_pool")
}

/// Holds `stream` until the returned gate opens.
fn hold(stream: SpyreStream) -> Arc<Gate> {
    Gate::hold_pool_stream(stream)
}

/// Makes `stream` fail once the returned gate opens: held at the gate,
/// behind which a host callback panics ("deliberate panic").
fn fail_once_opened(stream: SpyreStream) -> Arc<Gate> {
    let gate = hold(stream);
    stream
        .launch_host_callback(|| panic!("deliberate panic"), LaunchOptions::new())
        .unwrap();
    gate
}

fn log_on(stream: SpyreStream, log: &Arc<Mutex<Vec<&'static str>>>, entry: &'static str) {
    let log = Arc::clone(log);
    stream
        .launch_host_callback(
            move || log.lock().unwrap().push(entry),
            LaunchOptions::new(),
        )
        .expect("launch");
}

#[test]
fn wait_stream_orders_work_without_blocking_the_host() {
    isolated!(&[MOCK], || {
        assert!(capabilities(Device::CURRENT).unwrap().device_side_wait);
        let producer = pool_stream();
        let consumer = pool_stream();
        assert_ne!(producer, consumer);
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = hold(producer);
        log_on(producer, &log, "produced");
        consumer.wait_stream(producer).expect("returns at once");
        log_on(consumer, &log, "consumed");
        assert!(!consumer.query().unwrap(), "held behind the producer");
        gate.open();
        consumer.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["produced", "consumed"]);
        // Waiting on itself is a no-op.
        consumer.wait_stream(consumer).unwrap();
        consumer.synchronize().unwrap();
    });
}

/// PyTorch's `s.wait_stream(other); s.synchronize()` with nothing launched
/// on `s` after the wait: the synchronize covers `other`'s work, and a
/// timing event recorded on `other` can be read after it. Before the fix
/// the waiting stream's synchronize returned at once with the device
/// waiting on the device side (and waited with host-side waits).
#[test]
fn synchronize_after_wait_stream_covers_the_other_streams_work() {
    isolated!(&[MOCK], || {
        let (producer, consumer) = (pool_stream(), pool_stream());
        let start = SpyreEvent::with_timing().unwrap();
        let end = SpyreEvent::with_timing().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = hold(producer);
        start.record(producer).unwrap();
        log_on(producer, &log, "produced");
        end.record(producer).unwrap();
        consumer.wait_stream(producer).unwrap();
        assert!(!consumer.query().unwrap(), "the wait is pending");
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            gate.open();
        });
        consumer.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["produced"]);
        assert!(consumer.query().unwrap());
        start.elapsed_time(&end).expect("both events completed");
        opener.join().unwrap();
    });
}

#[test]
fn elapsed_time_names_the_event_whose_precondition_failed() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let untimed = SpyreEvent::new().unwrap();
        let start = SpyreEvent::with_timing().unwrap();
        let end = SpyreEvent::with_timing().unwrap();
        assert!(matches!(
            untimed.elapsed_time(&end),
            Err(Error::EventWithoutTiming {
                which: EventRole::Start
            })
        ));
        assert!(matches!(
            start.elapsed_time(&untimed),
            Err(Error::EventWithoutTiming {
                which: EventRole::End
            })
        ));
        assert!(matches!(
            start.elapsed_time(&end),
            Err(Error::EventNotRecorded {
                which: EventRole::Start
            })
        ));
        start.record(stream).unwrap();
        start.synchronize().unwrap();
        let gate = hold(stream);
        stream
            .launch_host_callback(
                || std::thread::sleep(Duration::from_millis(20)),
                LaunchOptions::new(),
            )
            .unwrap();
        end.record(stream).unwrap();
        let err = start.elapsed_time(&end).unwrap_err();
        assert!(
            matches!(
                err,
                Error::EventNotComplete {
                    which: EventRole::End
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "elapsed_time: the end event has not completed yet; synchronize (or await) it first"
        );
        gate.open();
        end.synchronize().unwrap();
        let elapsed = start.elapsed_time(&end).unwrap();
        assert!(elapsed >= Duration::from_millis(20), "{elapsed:?}");
        match end.elapsed_time(&start) {
            Err(Error::EventsOutOfOrder { by }) => assert_eq!(by, elapsed),
            other => panic!("expected EventsOutOfOrder, got {other:?}"),
        }
    });
}

/// `elapsed_time` with an end event whose record failed (its stream failed
/// before reaching it, the start event's stream did not) names the end
/// event and carries the record's error.
#[test]
fn elapsed_time_names_the_event_whose_record_failed() {
    isolated!(&[MOCK], || {
        let (healthy, failing) = (pool_stream(), pool_stream());
        let start = SpyreEvent::with_timing().unwrap();
        let end = SpyreEvent::with_timing().unwrap();
        start.record(healthy).unwrap();
        let gate = fail_once_opened(failing);
        end.record(failing).unwrap();
        gate.open();
        start.synchronize().unwrap();
        end.synchronize().unwrap_err();
        for (result, role) in [
            (start.elapsed_time(&end), EventRole::End),
            (end.elapsed_time(&start), EventRole::Start),
        ] {
            let err = result.unwrap_err();
            match &err {
                Error::EventFailed { which, source } => {
                    assert_eq!(*which, role, "{err}");
                    assert_eq!(source.status(), Status::STREAM_FAILED, "{err}");
                }
                other => panic!("expected EventFailed, got {other:?}"),
            }
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("elapsed_time: the {role} event's record failed")),
                "{text}"
            );
            assert!(text.contains("deliberate panic"), "{text}");
        }
    });
}

/// `elapsed_time` while another thread records the end event again and
/// again behind a little host work: every call gives a duration or
/// `EventNotComplete` naming the end event, never the runtime's
/// `NOT_READY` (before the fix, a record made between the completion check
/// and the timestamp read came out as `Error::Flex`).
#[test]
fn elapsed_time_racing_a_record_of_the_end_event_names_it() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let start = SpyreEvent::with_timing().unwrap();
        let end = SpyreEvent::with_timing().unwrap();
        start.record(stream).unwrap();
        end.record(stream).unwrap();
        end.synchronize().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (mut measured, mut pending) = (0, 0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    stream
                        .launch_host_callback(
                            || std::thread::sleep(Duration::from_micros(20)),
                            LaunchOptions::new(),
                        )
                        .unwrap();
                    end.record(stream).unwrap();
                    end.synchronize().unwrap();
                }
            });
            // At least 20 000 calls, and on until both sides of the race
            // were seen (the recording thread may start late on a loaded
            // machine), for at most 20 s.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let mut calls = 0;
            while calls < 20_000
                || (measured == 0 || pending == 0) && std::time::Instant::now() < deadline
            {
                calls += 1;
                match start.elapsed_time(&end) {
                    Ok(_) => measured += 1,
                    Err(Error::EventNotComplete {
                        which: EventRole::End,
                    }) => pending += 1,
                    other => {
                        stop.store(true, Ordering::Relaxed);
                        panic!("{other:?}");
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        // Both sides of the race were seen: the record pending (each is
        // behind a 20 µs callback) and complete between two records.
        assert!(
            measured > 0 && pending > 0,
            "{measured} measured, {pending} pending"
        );
    });
}

/// A runtime that answers `NOT_READY` for events its own queries report
/// complete (the no-op backend, told to), with no other thread recording
/// them: `elapsed_time` returns the runtime's error, the injected one,
/// instead of measuring again for ever.
#[test]
fn elapsed_time_returns_the_runtimes_error_when_it_contradicts_its_queries() {
    isolated!(&[MOCK], || {
        let backend =
            flex_rt::noop::NoopBackend::new(1).with_elapsed_time_failure(Status::NOT_READY);
        set_backend(Box::new(backend)).unwrap();
        let stream = pool_stream();
        let (start, end) = (
            SpyreEvent::with_timing().unwrap(),
            SpyreEvent::with_timing().unwrap(),
        );
        start.record(stream).unwrap();
        end.record(stream).unwrap();
        assert!(start.query().unwrap() && end.query().unwrap());
        match start.elapsed_time(&end) {
            Err(Error::Flex(source)) => {
                assert_eq!(source.status(), Status::NOT_READY, "{source}");
                assert!(
                    source.to_string().contains("with_elapsed_time_failure"),
                    "the injected error: {source}"
                );
            }
            other => panic!("expected the runtime's NOT_READY, got {other:?}"),
        }
    });
}

#[test]
fn a_thousand_awaits_on_one_current_thread_runtime_never_block_it() {
    isolated!(&[MOCK], || {
        const TASKS: usize = 1000;
        let stream = pool_stream();
        let gate = hold(stream);
        let event = Arc::new(SpyreEvent::new().unwrap());
        event.record(stream).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let executor = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        executor.block_on(async {
            let mut tasks = Vec::with_capacity(TASKS);
            for i in 0..TASKS {
                let done = Arc::clone(&done);
                // Half await the event, half the stream's work so far.
                let future = if i % 2 == 0 {
                    event.synchronize_async()
                } else {
                    stream.synchronize_async().unwrap()
                };
                tasks.push(tokio::spawn(async move {
                    future.await.expect("the work completes");
                    done.fetch_add(1, Ordering::SeqCst);
                }));
            }
            // Every task has run to its await and is pending: the executor,
            // a single thread, is not blocked by any of them.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert_eq!(done.load(Ordering::SeqCst), 0, "the stream is held");
            gate.open();
            for task in tasks {
                task.await.unwrap();
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), TASKS);
    });
}

#[test]
fn awaiting_works_on_another_executor_and_a_future_may_be_dropped_early() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let gate = hold(stream);
        let never = SpyreEvent::new().unwrap();
        futures_executor::block_on(never.synchronize_async()).expect("never recorded: ready");
        let dropped_early = stream.synchronize_async().unwrap();
        drop(dropped_early);
        let event = SpyreEvent::new().unwrap();
        event.record(stream).unwrap();
        let future = event.synchronize_async();
        let opened = Arc::new(AtomicBool::new(false));
        let opener = std::thread::spawn({
            let opened = Arc::clone(&opened);
            move || {
                std::thread::sleep(Duration::from_millis(20));
                opened.store(true, Ordering::SeqCst);
                gate.open();
            }
        });
        futures_executor::block_on(future).expect("completes");
        // Resolved only once the record could complete, and it has.
        assert!(
            opened.load(Ordering::SeqCst),
            "resolved before the gate opened"
        );
        assert!(event.query().unwrap());
        opener.join().unwrap();
    });
}

/// Counts its wakes; its strong count tells who still holds it.
struct CountingWaker(AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A future dropped while its record is pending lets its task's waker go
/// at once, not when the record settles: a `select!` with a timeout over a
/// long-pending record holds no task of its past rounds.
#[test]
fn a_dropped_future_releases_its_waker_at_once() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        let gate = hold(stream);
        let event = SpyreEvent::new().unwrap();
        event.record(stream).unwrap();
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(Arc::clone(&task));
        let mut future = event.synchronize_async();
        let polled = Pin::new(&mut future).poll(&mut std::task::Context::from_waker(&waker));
        assert!(polled.is_pending(), "the stream is held");
        drop(waker);
        assert_eq!(Arc::strong_count(&task), 2, "the pending record's waiter");
        drop(future);
        assert_eq!(Arc::strong_count(&task), 1, "released with the future");
        gate.open();
        event.synchronize().unwrap();
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            0,
            "nobody woke a dropped future"
        );
    });
}

#[test]
fn a_failed_stream_fails_its_awaits_and_its_waiters() {
    isolated!(&[MOCK], || {
        let failing = pool_stream();
        let waiter = pool_stream();
        let gate = fail_once_opened(failing);
        let event = SpyreEvent::new().unwrap();
        event.record(failing).unwrap();
        waiter.wait_event(&event).unwrap();
        let future = event.synchronize_async();
        gate.open();
        let err = futures_executor::block_on(future).unwrap_err();
        assert!(
            matches!(&err, Error::Flex(e) if e.status() == Status::STREAM_FAILED),
            "{err:?}"
        );
        waiter_fails_naming(waiter, failing);
        // A failed stream refuses a wait for itself too, though it enqueues
        // nothing (before, that was Ok).
        let itself = failing.wait_stream(failing).unwrap_err();
        assert!(
            itself.to_string().contains("deliberate panic"),
            "the stream's first error: {itself}"
        );
        // Waiting for the failed stream says which stream refused: before,
        // the error read as the waiting stream's own.
        let bystander = pool_stream();
        let refused = bystander.wait_stream(failing).unwrap_err();
        assert!(
            matches!(&refused, Error::Flex(e) if e.status() == Status::STREAM_FAILED && e.call() == "wait_stream"),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains(&format!(
                "the stream to wait for, {failing}, refused the record of its marker event"
            )),
            "{refused}"
        );
        assert!(bystander.query().unwrap(), "the bystander is unaffected");
    });
}

/// A stream's future and an event's future of work that failed resolve
/// with an error naming the stream's first error (as the event's query
/// does) and the host callback's panic that caused it, in process and
/// through the flex library, whose notification carries only a status
/// (before, its futures said only "the event's record awaited with
/// flex_event_notify did not complete"; then, through the library, the
/// first error without the panic).
fn failed_awaits_name_the_first_error() {
    let failing = pool_stream();
    let gate = fail_once_opened(failing);
    let futures = futures_of(failing);
    gate.open();
    futures_fail_naming(
        futures,
        &[
            "HOST_CALLBACK_FAILED",
            "launch_host_callback",
            "deliberate panic",
        ],
    );
}

/// The future of `stream` and that of an event recorded on it, both made
/// now (the future keeps what it awaits after the event is dropped).
fn futures_of(stream: SpyreStream) -> [SynchronizeFuture; 2] {
    let stream_future = stream.synchronize_async().unwrap();
    let event = SpyreEvent::new().unwrap();
    event.record(stream).unwrap();
    [stream_future, event.synchronize_async()]
}

/// Each of `futures` resolves with `STREAM_FAILED`, its message naming
/// each of `needles`.
fn futures_fail_naming(futures: impl IntoIterator<Item = SynchronizeFuture>, needles: &[&str]) {
    for future in futures {
        let err = futures_executor::block_on(future).unwrap_err();
        assert!(
            matches!(&err, Error::Flex(e) if e.status() == Status::STREAM_FAILED),
            "{err:?}"
        );
        let message = err.to_string();
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in {message}");
        }
    }
}

/// Runs `body` in a fresh process on the software device through its flex
/// library.
macro_rules! through_the_ffi_path {
    ($body:expr) => {
        isolated!(mock_cdylib; &[], || {
            set_backend(Box::new(HardwareBackend::open(mock_cdylib()).unwrap())).unwrap();
            $body();
        })
    };
}

#[test]
fn a_failed_await_names_the_first_error() {
    isolated!(&[MOCK], failed_awaits_name_the_first_error);
}

#[test]
fn a_failed_await_names_the_first_error_through_the_ffi_path() {
    through_the_ffi_path!(failed_awaits_name_the_first_error);
}

/// A record refused for its stream (one of another device) or by the
/// runtime (the stream has failed) leaves the event unchanged, and with it
/// the detail of a failed await made before: the future still names the
/// first error and its cause (through the flex library, the refused record
/// counted as a record begun since the future was made, and the future
/// gave the notification's status alone).
fn a_refused_record_keeps_the_detail_of_an_await() {
    let failing = pool_stream();
    let gate = fail_once_opened(failing);
    let event = SpyreEvent::new().unwrap();
    event.record(failing).unwrap();
    let future = event.synchronize_async();
    let other_device = SpyreStream::from_parts(5, failing.id());
    assert!(
        matches!(
            event.record(other_device),
            Err(Error::WrongDevice {
                stream_device: 5,
                pool_device: 0
            })
        ),
        "a stream of device 5 on device 0's runtime"
    );
    gate.open();
    assert!(failing.synchronize().is_err(), "the stream failed");
    let refused = event.record(failing).unwrap_err();
    assert!(
        matches!(&refused, Error::Flex(e) if e.status() == Status::STREAM_FAILED),
        "{refused:?}"
    );
    futures_fail_naming(
        [future],
        &[
            "HOST_CALLBACK_FAILED",
            "launch_host_callback",
            "deliberate panic",
        ],
    );
}

#[test]
fn a_refused_record_keeps_the_detail_of_an_await_in_process() {
    isolated!(&[MOCK], a_refused_record_keeps_the_detail_of_an_await);
}

#[test]
fn a_refused_record_keeps_the_detail_of_an_await_through_the_ffi_path() {
    through_the_ffi_path!(a_refused_record_keeps_the_detail_of_an_await);
}

/// A stream failed by an operation's completion that panicked after the
/// operation succeeded: its future and an event's, both made before the
/// panic, resolve with `STREAM_FAILED` naming the panic, as its
/// synchronize fails naming it, in process and through the flex library,
/// which is not told of such a panic (through it, both futures resolved
/// with `Ok` while synchronize failed).
fn awaits_fail_behind_a_completion_panic() {
    let failing = pool_stream();
    let gate = hold(failing);
    failing
        .launch_host_callback(
            || {},
            LaunchOptions::new().on_complete(|_| panic!("deliberate completion panic")),
        )
        .unwrap();
    let futures = futures_of(failing);
    gate.open();
    let err = failing.synchronize().unwrap_err();
    assert!(
        err.to_string().contains("deliberate completion panic"),
        "{err}"
    );
    futures_fail_naming(futures, &["deliberate completion panic"]);
}

#[test]
fn awaits_fail_behind_a_completion_panic_in_process() {
    isolated!(&[MOCK], awaits_fail_behind_a_completion_panic);
}

#[test]
fn awaits_fail_behind_a_completion_panic_through_the_ffi_path() {
    through_the_ffi_path!(awaits_fail_behind_a_completion_panic);
}

/// Work on `waiter` fails (at launch or on the device) with an error naming
/// `failing` by its runtime id.
fn waiter_fails_naming(waiter: SpyreStream, failing: SpyreStream) {
    let err = match waiter.launch_host_callback(|| {}, LaunchOptions::new()) {
        Ok(()) => waiter.synchronize().unwrap_err(),
        Err(refused) => refused,
    };
    let runtime_id = spyre_stream::global_pool()
        .unwrap()
        .resolve(failing)
        .unwrap()
        .id();
    let named = format!("event recorded on stream {runtime_id},");
    assert!(err.to_string().contains(&named), "{err}");
}

/// A future made of an event whose latest record failed, while another
/// thread records the event again on a healthy stream that is held: the
/// future is bound either to the failed record (it fails) or to the new
/// one (it is pending), never resolved `Ok`. Before, a future that found
/// its record settled asked the event's query which way, and a record made
/// in between made it report the new record's state: `Ok` for work that
/// failed. 4 000 rounds, swept over offsets between the two threads; fewer
/// if they take over half the held stream's gate's patience (a loaded
/// machine), so that the stream is held throughout: checked at the end.
fn a_future_of_a_failed_record_never_resolves_ok() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    const ROUNDS: usize = 4_000;
    let (failing, held) = (pool_stream(), pool_stream());
    // The rounds end at half the held stream's gate's patience, counted
    // from before the gate is set.
    let deadline = Instant::now() + PATIENCE / 2;
    let held_gate = hold(held);
    let failing_gate = fail_once_opened(failing);
    let events: Vec<SpyreEvent> = (0..ROUNDS)
        .map(|_| {
            let event = SpyreEvent::new().unwrap();
            event.record(failing).unwrap();
            event
        })
        .collect();
    failing_gate.open();
    assert!(failing.synchronize().is_err(), "the stream failed");
    // Spun on, not a barrier: the two threads start each round within a
    // few nanoseconds of each other, and the offsets sweep the record over
    // the future's making: one side or the other is delayed by 0 to 511
    // spins, in turn.
    let offsets = |round: usize| match round % 2 {
        0 => (0, round / 2 % 512),
        _ => (round / 2 % 512, 0),
    };
    let spin = |spins: usize| {
        for _ in 0..spins {
            std::hint::spin_loop();
        }
    };
    let (ready, start) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let stop = AtomicBool::new(false);
    let mut resolved_ok = 0;
    let mut outcomes = [0usize; 2];
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for (round, event) in events.iter().enumerate() {
                ready.store(round + 1, Ordering::Release);
                while start.load(Ordering::Acquire) != round + 1 {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    std::hint::spin_loop();
                }
                spin(offsets(round).1);
                event.record(held).unwrap();
            }
        });
        for (round, event) in events.iter().enumerate() {
            while ready.load(Ordering::Acquire) != round + 1 {
                std::hint::spin_loop();
            }
            if Instant::now() > deadline {
                stop.store(true, Ordering::Release);
                break;
            }
            start.store(round + 1, Ordering::Release);
            spin(offsets(round).0);
            let mut future = event.synchronize_async();
            match Pin::new(&mut future).poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(Ok(())) => resolved_ok += 1,
                Poll::Ready(Err(_)) => outcomes[0] += 1,
                Poll::Pending => outcomes[1] += 1,
            }
        }
    });
    // Else its gate gave up waiting, and the new records completed.
    assert!(!held.query().unwrap(), "the stream was held throughout");
    held_gate.open();
    held.synchronize().unwrap();
    assert_eq!(
        resolved_ok, 0,
        "futures of a failed record resolved Ok ({} failed, {} pending)",
        outcomes[0], outcomes[1]
    );
    // A future made before the new record is bound to the failed one and
    // resolves with its error at once (one that stayed pending would be a
    // lost completion): the rounds that delay the record make some.
    assert!(
        outcomes[0] > 0,
        "no future of the failed record failed ({} pending)",
        outcomes[1]
    );
}

#[test]
fn a_future_of_a_failed_record_never_resolves_ok_in_process() {
    isolated!(&[MOCK], a_future_of_a_failed_record_never_resolves_ok);
}

#[test]
fn a_future_of_a_failed_record_never_resolves_ok_through_the_ffi_path() {
    through_the_ffi_path!(a_future_of_a_failed_record_never_resolves_ok);
}

#[test]
fn events_through_the_ffi_path() {
    isolated!(mock_cdylib; &[], || {
        let backend = HardwareBackend::open(mock_cdylib()).unwrap();
        set_backend(Box::new(backend)).unwrap();
        let producer = pool_stream();
        let consumer = pool_stream();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = hold(producer);
        log_on(producer, &log, "produced");
        let event = SpyreEvent::with_timing().unwrap();
        event.record(producer).unwrap();
        consumer.wait_event(&event).unwrap();
        log_on(consumer, &log, "consumed");
        let future = consumer.synchronize_async().unwrap();
        gate.open();
        futures_executor::block_on(future).unwrap();
        assert_eq!(*log.lock().unwrap(), ["produced", "consumed"]);
        assert!(event.query().unwrap());
    });
}

/// On a device that cannot time events, `with_timing` says so at once, with
/// what to do instead, rather than at the first `elapsed_time`; untimed
/// events work.
fn a_device_without_event_timing_refuses_timed_events() {
    assert!(!capabilities(Device::CURRENT).unwrap().event_timing);
    let err = SpyreEvent::with_timing().unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported(inner) if inner.status() == Status::UNSUPPORTED),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("this device cannot time events (its event_timing capability is false)"),
        "{err}"
    );
    let event = SpyreEvent::new().unwrap();
    event.record(pool_stream()).unwrap();
    event.synchronize().unwrap();
}

const UNTIMED: (&str, &str) = ("SPYRE_MOCK_EVENT_TIMING", "0");

#[test]
fn a_device_without_event_timing_refuses_timed_events_in_process() {
    isolated!(
        &[MOCK, UNTIMED],
        a_device_without_event_timing_refuses_timed_events
    );
}

#[test]
fn a_device_without_event_timing_refuses_timed_events_through_the_ffi_path() {
    isolated!(mock_cdylib; &[UNTIMED], || {
        set_backend(Box::new(HardwareBackend::open(mock_cdylib()).unwrap())).unwrap();
        a_device_without_event_timing_refuses_timed_events();
    });
}

#[test]
fn a_flex_1_0_library_reports_events_unsupported_naming_the_function() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_ABI_VERSION", "1.0")], || {
        let backend = HardwareBackend::open(mock_cdylib()).unwrap();
        assert_eq!(backend.library().version().to_string(), "1.0");
        set_backend(Box::new(backend)).unwrap();
        let stream = pool_stream();
        stream.synchronize().expect("1.0 calls work");
        let err = SpyreEvent::new().unwrap_err();
        let Error::Unsupported(inner) = &err else {
            panic!("expected Error::Unsupported, got {err:?}");
        };
        assert_eq!(inner.status(), Status::UNSUPPORTED);
        let text = err.to_string();
        assert!(
            text.contains("unsupported by this flex library (ABI 1.0): `flex_event_create`"),
            "{text}"
        );
        let err = capabilities(Device::CURRENT).unwrap_err();
        assert!(
            err.to_string().contains("`flex_runtime_get_capability`"),
            "{err}"
        );
        let err = spyre_stream::memory_info(Device::CURRENT).unwrap_err();
        assert!(
            matches!(&err, Error::Unsupported(_))
                && err.to_string().contains("`flex_runtime_get_memory_info`"),
            "{err}"
        );
        // wait_stream needs an event: refused the same way, nothing
        // enqueued; on the stream itself too (it was `Ok` before).
        assert!(matches!(
            pool_stream().wait_stream(stream),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            stream.wait_stream(stream),
            Err(Error::Unsupported(_))
        ));
    });
}

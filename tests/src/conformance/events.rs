//! Conformance cases for events (flex.h ABI 1.1): the contract of
//! `flex_rt::Event`, `Stream::record_event` and `Stream::wait_event`, the
//! same for every backend, with and without device-side waits.
//!
//! Every case first asks the runtime for its capabilities. A library without
//! events (ABI 1.0) must say so with `UNSUPPORTED` from both
//! `capabilities` and `create_event`; the case checks that and ends there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use flex_rt::{
    Backend, Capabilities, Event, HostBuffer, HostCallback, LaunchOptions, Notification, Runtime,
    Status, Stream, StreamPriority,
};

use super::{
    Completions, Gate, PATIENCE, Profile, new_stream, occupy_every_engine, runtime, software_device,
};

/// The runtime's capabilities, checked against `profile` (the software
/// device's wait is device-side or host-blocking as configured); or `None`
/// for a library without events, after checking that events are refused
/// as unsupported consistently, as `profile` requires of a library that
/// reports ABI 1.0, and which the software device at ABI 1.1 never does.
fn capabilities(runtime: &dyn Runtime, profile: &Profile) -> Option<Capabilities> {
    match runtime.capabilities() {
        Ok(capabilities) => {
            assert!(
                !profile.abi_1_0,
                "an ABI 1.0 library has no events, yet reported {capabilities:?}"
            );
            if let Some(device) = profile.software_device {
                assert_eq!(
                    capabilities.device_side_wait, device.device_side_wait,
                    "the software device's wait as configured"
                );
            }
            Some(capabilities)
        }
        Err(err) => {
            assert!(
                profile.abi_1_0 || profile.software_device.is_none(),
                "the software device at ABI 1.1 has events: {err}"
            );
            assert_eq!(err.status(), Status::UNSUPPORTED, "{err}");
            let refused = runtime.create_event(false).unwrap_err();
            assert_eq!(refused.status(), Status::UNSUPPORTED, "{refused}");
            None
        }
    }
}

fn event(runtime: &dyn Runtime, timing: bool) -> Box<dyn Event> {
    runtime.create_event(timing).expect("create_event")
}

/// Holds `stream` at a gate: a host callback that waits until the gate
/// opens. Returns the gate.
fn hold(stream: &dyn Stream) -> Arc<Gate> {
    let gate = Gate::new();
    let g = Arc::clone(&gate);
    stream
        .launch_host_callback(Box::new(move || g.wait()), LaunchOptions::new())
        .expect("launch the holding callback");
    gate
}

/// Appends `entry` to `log` in stream order.
fn log_on(stream: &dyn Stream, log: &Arc<Mutex<Vec<&'static str>>>, entry: &'static str) {
    let log = Arc::clone(log);
    stream
        .launch_host_callback(
            Box::new(move || log.lock().unwrap().push(entry)),
            LaunchOptions::new(),
        )
        .expect("launch the logging callback");
}

/// Ends the process (exit code 101, the code of a failed test) if it is not
/// dropped within [`PATIENCE`]: for a case whose failure is a deadlock,
/// which would otherwise hang the test run instead of failing it.
struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    fn new(what: &'static str) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&done);
        thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < PATIENCE {
                if seen.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
            eprintln!("{what} did not finish within {PATIENCE:?}: a deadlock");
            std::process::exit(101);
        });
        Self { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Calls `wait_event`; without device-side waits the call blocks until the
/// event completes, so a helper thread opens `gate` after a moment (with
/// them, the gate is opened by the case, and the helper only guards against
/// a hang). Returns whether `wait_event` returned before the gate opened.
fn wait_while_held(
    capabilities: Capabilities,
    waiter: &dyn Stream,
    event: &dyn Event,
    gate: &Arc<Gate>,
) -> bool {
    let delay = if capabilities.device_side_wait {
        PATIENCE
    } else {
        Duration::from_millis(100)
    };
    let opener = {
        let gate = Arc::clone(gate);
        thread::spawn(move || {
            thread::sleep(delay);
            gate.open();
        })
    };
    waiter.wait_event(event).expect("wait_event");
    let returned_first = !gate.is_open();
    if capabilities.device_side_wait {
        // Detach the guard thread; the case opens the gate itself.
        drop(opener);
    } else {
        opener.join().expect("opener thread");
    }
    returned_first
}

/// A producer stream held at a gate, with "produced" logged behind the hold
/// and an event recorded after it, and a consumer stream that has waited
/// on that event ([`wait_while_held`]).
struct HeldProducer<'r> {
    producer: &'r dyn Stream,
    consumer: &'r dyn Stream,
    log: Arc<Mutex<Vec<&'static str>>>,
    gate: Arc<Gate>,
    event: Box<dyn Event>,
    /// Whether the consumer's `wait_event` returned before the gate opened.
    returned_first: bool,
}

/// Sets up a [`HeldProducer`] on `runtime`, with a timed event if `timing`.
fn consumer_waiting_on_held_producer(
    runtime: &dyn Runtime,
    capabilities: Capabilities,
    timing: bool,
) -> HeldProducer<'_> {
    let producer = new_stream(runtime, StreamPriority::Normal);
    let consumer = new_stream(runtime, StreamPriority::Normal);
    let log = Arc::new(Mutex::new(Vec::new()));
    let gate = hold(producer);
    log_on(producer, &log, "produced");
    let event = event(runtime, timing);
    producer.record_event(&*event, None).expect("record");
    let returned_first = wait_while_held(capabilities, consumer, &*event, &gate);
    HeldProducer {
        producer,
        consumer,
        log,
        gate,
        event,
        returned_first,
    }
}

/// flex.h, "Events": an event never recorded is complete — query is ready,
/// synchronize returns at once, a wait is a no-op — and has no time.
pub fn an_event_never_recorded_is_complete(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let never = event(&*runtime, true);
    assert_eq!(never.query(), Ok(true));
    assert_eq!(never.synchronize(), Ok(()));
    stream
        .wait_event(&*never)
        .expect("waiting on it is a no-op");
    let log = Arc::new(Mutex::new(Vec::new()));
    log_on(stream, &log, "ran");
    stream.synchronize().expect("the stream runs as before");
    assert_eq!(*log.lock().unwrap(), ["ran"]);
    let other = event(&*runtime, true);
    stream.record_event(&*other, None).expect("record");
    let err = never.elapsed_nanos(&*other).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    assert!(err.message().contains("never recorded"), "{err}");
}

/// On a failed stream a wait is refused with the stream's error whatever
/// the event (never recorded, recorded on this stream, or elsewhere), as
/// a record and every other enqueue are: the stream failed by a host
/// callback's panic, and by a completion's.
pub fn a_failed_stream_refuses_every_wait(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let failed_by: [(&str, LaunchOptions, HostCallback); 2] = [
        (
            "a host callback's panic",
            LaunchOptions::new(),
            Box::new(|| panic!("deliberate panic")),
        ),
        (
            "a completion's panic",
            LaunchOptions::new().on_complete(|_| panic!("deliberate completion panic")),
            Box::new(|| {}),
        ),
    ];
    for (how, options, callback) in failed_by {
        let stream = new_stream(&*runtime, StreamPriority::Normal);
        let own = event(&*runtime, false);
        stream
            .record_event(&*own, None)
            .expect("record before the failure");
        stream
            .launch_host_callback(callback, options)
            .expect("launch");
        stream.synchronize().expect_err("the stream has failed");
        let elsewhere = event(&*runtime, false);
        new_stream(&*runtime, StreamPriority::Normal)
            .record_event(&*elsewhere, None)
            .expect("record on a healthy stream");
        let never = event(&*runtime, false);
        // The status a failed stream refuses work with.
        let failed = stream.record_event(&*never, None).unwrap_err().status();
        for (which, event) in [
            ("never recorded", &never),
            ("recorded on this stream", &own),
            ("recorded elsewhere", &elsewhere),
        ] {
            let err = stream.wait_event(&**event).unwrap_err();
            assert_eq!(err.status(), failed, "{how}, an event {which}: {err}");
        }
    }
}

/// A record captures exactly the work enqueued before it: the event is not
/// ready while that work is held, and work launched after the record does
/// not delay it. Its completion is called exactly once.
pub fn a_record_captures_exactly_the_work_before_it(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let before = hold(stream);
    let marker = event(&*runtime, false);
    let completions = Completions::new();
    stream
        .record_event(&*marker, completions.options().completion)
        .expect("record");
    let after = hold(stream);
    assert_eq!(marker.query(), Ok(false), "the work before it is held");
    before.open();
    marker
        .synchronize()
        .expect("completes once the earlier work has");
    assert_eq!(
        marker.query(),
        Ok(true),
        "the later, still held work does not delay it"
    );
    assert_eq!(stream.query(), Ok(false));
    after.open();
    stream.synchronize().expect("synchronize");
    assert_eq!(completions.results(), vec![Ok(())]);
    assert_eq!(completions.drops(), 1);
}

/// `notify` calls back once when the latest record completes or fails, and
/// says "nothing to wait for" (dropping the callback uncalled) with the
/// record's outcome for an event never recorded (`Ok`), already complete
/// (`Ok`) or already failed (the record's error).
pub fn notify_calls_back_when_the_latest_record_settles(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let marker = event(&*runtime, false);
    let never = Completions::new();
    let notified = marker
        .notify(never.options().completion.expect("a completion"))
        .expect("notify");
    assert_eq!(
        notified,
        Notification::Settled(Ok(())),
        "never recorded: nothing to wait for"
    );
    assert_eq!((never.calls(), never.drops()), (0, 1));

    let gate = hold(stream);
    stream.record_event(&*marker, None).expect("record");
    let pending = Completions::new();
    let notified = marker
        .notify(pending.options().completion.expect("a completion"))
        .expect("notify");
    assert_eq!(notified, Notification::Pending, "the record is held");
    assert_eq!(pending.calls(), 0);
    gate.open();
    stream.synchronize().expect("synchronize");
    assert_eq!(pending.results(), vec![Ok(())]);
    assert_eq!(pending.drops(), 1);
    let late = Completions::new();
    assert_eq!(
        marker.notify(late.options().completion.expect("a completion")),
        Ok(Notification::Settled(Ok(())))
    );
    assert_eq!((late.calls(), late.drops()), (0, 1));

    // A record whose stream fails first: the callback gets the error.
    let failing = new_stream(&*runtime, StreamPriority::Normal);
    let gate = hold(failing);
    failing
        .launch_host_callback(
            Box::new(|| panic!("deliberate panic")),
            LaunchOptions::new(),
        )
        .expect("launch");
    failing.record_event(&*marker, None).expect("record");
    let failed = Completions::new();
    assert_eq!(
        marker.notify(failed.options().completion.expect("a completion")),
        Ok(Notification::Pending)
    );
    gate.open();
    let _ = failing.synchronize();
    assert_eq!(failed.results(), vec![Err(Status::STREAM_FAILED)]);
    // Once failed, the outcome comes back at once: the record's error.
    let too_late = Completions::new();
    match marker.notify(too_late.options().completion.expect("a completion")) {
        Ok(Notification::Settled(Err(err))) => {
            assert_eq!(err.status(), Status::STREAM_FAILED, "{err}");
            assert!(err.message().contains("deliberate panic"), "{err}");
        }
        other => panic!("expected the failed record's error, got {other:?}"),
    }
    assert_eq!((too_late.calls(), too_late.drops()), (0, 1));
}

/// A wait orders every later launch on the waiting stream after the event;
/// with device-side waits it does not block the caller, and every other
/// stream keeps running meanwhile (no engine is held while it waits).
pub fn a_wait_orders_later_work_after_the_event(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(capabilities) = capabilities(&*runtime, profile) else {
        return;
    };
    let HeldProducer {
        consumer,
        log,
        gate,
        event: _produced,
        returned_first,
        ..
    } = consumer_waiting_on_held_producer(&*runtime, capabilities, false);
    let bystander = new_stream(&*runtime, StreamPriority::Normal);
    assert_eq!(
        returned_first, capabilities.device_side_wait,
        "wait_event blocks the host exactly when the device cannot wait"
    );
    log_on(consumer, &log, "consumed");
    if capabilities.device_side_wait {
        log_on(bystander, &log, "bystander");
        bystander
            .synchronize()
            .expect("another stream runs while the consumer waits");
        assert_eq!(*log.lock().unwrap(), ["bystander"]);
        assert_eq!(consumer.query(), Ok(false), "the consumer is held");
        gate.open();
    }
    consumer.synchronize().expect("synchronize");
    let log = log.lock().unwrap();
    let position = |entry| log.iter().position(|e| *e == entry).unwrap();
    assert!(
        position("produced") < position("consumed"),
        "consumer ran before the event: {log:?}"
    );
}

/// flex.h, `flex_stream_wait_event`: a wait is work enqueued on the stream.
/// Until the event completes the waiting stream is not finished, even with
/// nothing launched or recorded after the wait: query says not ready, and
/// synchronize returns only once the producer's work before the event has
/// run (CUDA's `cudaStreamWaitEvent` then `cudaStreamSynchronize`;
/// PyTorch's `s.wait_stream(other); s.synchronize()`). Without device-side
/// waits the wait itself blocks the host until then.
pub fn a_pending_wait_is_unfinished_work_of_the_waiting_stream(
    backend: &dyn Backend,
    profile: &Profile,
) {
    let runtime = runtime(backend);
    let Some(capabilities) = capabilities(&*runtime, profile) else {
        return;
    };
    let HeldProducer {
        consumer,
        log,
        gate,
        event: _produced,
        ..
    } = consumer_waiting_on_held_producer(&*runtime, capabilities, false);
    if capabilities.device_side_wait {
        assert_eq!(consumer.query(), Ok(false), "the wait is pending");
        // Opened while the synchronize below blocks (or before it starts:
        // either way it must not return before the producer's work).
        let opener = {
            let gate = Arc::clone(&gate);
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                gate.open();
            })
        };
        consumer.synchronize().expect("synchronize");
        opener.join().expect("opener thread");
    } else {
        consumer.synchronize().expect("synchronize");
    }
    assert_eq!(
        *log.lock().unwrap(),
        ["produced"],
        "synchronize of the waiting stream returned before the event"
    );
    assert_eq!(consumer.query(), Ok(true));
}

/// Re-recording moves the event: query and synchronize see only the latest
/// record, while a wait already made keeps the record it saw.
pub fn re_recording_moves_the_event_but_not_an_earlier_wait(
    backend: &dyn Backend,
    profile: &Profile,
) {
    let runtime = runtime(backend);
    let Some(capabilities) = capabilities(&*runtime, profile) else {
        return;
    };
    let first = new_stream(&*runtime, StreamPriority::Normal);
    let second = new_stream(&*runtime, StreamPriority::Normal);
    let waiter = new_stream(&*runtime, StreamPriority::Normal);
    let log = Arc::new(Mutex::new(Vec::new()));
    let gate = hold(first);
    log_on(first, &log, "first");
    let moving = event(&*runtime, false);
    first
        .record_event(&*moving, None)
        .expect("record on the held stream");
    wait_while_held(capabilities, waiter, &*moving, &gate);
    log_on(waiter, &log, "waiter");
    second
        .record_event(&*moving, None)
        .expect("record again, on an idle stream");
    moving
        .synchronize()
        .expect("synchronize sees only the latest record");
    assert_eq!(moving.query(), Ok(true));
    if capabilities.device_side_wait {
        assert_eq!(
            waiter.query(),
            Ok(false),
            "the wait keeps the first record, still held"
        );
        gate.open();
    }
    waiter.synchronize().expect("synchronize");
    assert_eq!(*log.lock().unwrap(), ["first", "waiter"]);
}

/// Waiting on an event recorded on the same stream (as after the round
/// robin wraps) is a no-op, not a self-deadlock, even while the stream is
/// held.
pub fn waiting_on_the_same_stream_is_a_no_op(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let gate = hold(stream);
    let own = event(&*runtime, false);
    stream.record_event(&*own, None).expect("record");
    stream
        .wait_event(&*own)
        .expect("returns at once: nothing to wait for");
    assert_eq!(own.query(), Ok(false));
    gate.open();
    stream.synchronize().expect("synchronize");
    assert_eq!(own.query(), Ok(true));
}

/// A completion that panics after its operation succeeded fails its
/// stream (see `a_completion_panic_fails_the_stream`) at that operation:
/// an event recorded behind it, before the panic, fails with
/// `STREAM_FAILED` naming the panic (query, synchronize and a pending
/// notification), while one recorded before it completes, with a record
/// carrying a completion and a refused launch between the two (neither
/// may shift the operation's place).
pub fn a_completion_panic_fails_the_events_recorded_behind_it(
    backend: &dyn Backend,
    profile: &Profile,
) {
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let before = event(&*runtime, false);
    let recorded = Completions::new();
    stream
        .record_event(&*before, recorded.options().completion)
        .expect("record");
    let empty = HostBuffer::zeroed(0);
    let address = runtime.allocate(128).expect("allocate");
    let refused = stream
        .launch_h2d(&empty, &address, LaunchOptions::new())
        .unwrap_err();
    assert_eq!(refused.status(), Status::INVALID_ARGUMENT, "{refused}");
    let gate = hold(stream);
    stream
        .launch_host_callback(
            Box::new(|| {}),
            LaunchOptions::new().on_complete(|_| panic!("deliberate completion panic 29")),
        )
        .expect("launch");
    let behind = event(&*runtime, false);
    stream
        .record_event(&*behind, None)
        .expect("record is accepted; the stream fails later");
    let notified = Completions::new();
    assert_eq!(
        behind.notify(notified.options().completion.expect("a completion")),
        Ok(Notification::Pending),
        "the record is held"
    );
    gate.open();
    let named = |err: &flex_rt::FlexError| {
        assert_eq!(err.status(), Status::STREAM_FAILED, "{err}");
        assert!(
            err.message().contains("deliberate completion panic 29"),
            "{err}"
        );
    };
    named(&behind.synchronize().unwrap_err());
    named(&behind.query().unwrap_err());
    match behind.notify(Box::new(|_| panic!("settled: never called"))) {
        Ok(Notification::Settled(Err(err))) => named(&err),
        other => panic!("expected the failed record's error, got {other:?}"),
    }
    assert_eq!(
        stream.synchronize().unwrap_err().status(),
        Status::HOST_CALLBACK_FAILED
    );
    assert_eq!(notified.results(), vec![Err(Status::STREAM_FAILED)]);
    assert_eq!(before.query(), Ok(true), "recorded before the panic");
    before.synchronize().expect("recorded before the panic");
    assert_eq!(recorded.results(), vec![Ok(())]);
    runtime.free(&address).expect("free");
}

/// Dropping the runtime destroys its events (flex.h): an event that
/// outlives it fails every call with `INVALID_HANDLE`, and dropping it
/// afterwards is harmless.
pub fn an_event_dies_with_its_runtime(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let event = event(&*runtime, false);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    stream.record_event(&*event, None).expect("record");
    event.synchronize().expect("synchronize");
    drop(runtime);
    let never = Completions::new();
    for err in [
        event.query().unwrap_err(),
        event.synchronize().unwrap_err(),
        event
            .notify(never.options().completion.expect("a completion"))
            .unwrap_err(),
    ] {
        assert_eq!(err.status(), Status::INVALID_HANDLE, "{err}");
    }
    assert_eq!((never.calls(), never.drops()), (0, 1));
    // As the end of an elapsed time measured from an event of a live
    // runtime (which may be given the closed runtime's address).
    let later = self::runtime(backend);
    let start = self::event(&*later, true);
    let err = start.elapsed_nanos(&*event).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_HANDLE, "{err}");
    assert!(
        err.message().contains("end event's runtime was closed"),
        "{err}"
    );
    let err = event.elapsed_nanos(&*start).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_HANDLE, "{err}");
    // To a stream of the live runtime it is another runtime's event, as
    // any: whether or not that runtime was given the closed one's address.
    let stream = new_stream(&*later, StreamPriority::Normal);
    for err in [
        stream.record_event(&*event, None).unwrap_err(),
        stream.wait_event(&*event).unwrap_err(),
    ] {
        assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    }
    drop(event);
}

/// A record whose stream fails before reaching it poisons the event: query
/// and synchronize return the stream's error, never "not ready" forever,
/// and a stream that waits on it fails with an error naming the event's
/// stream instead of hanging.
pub fn a_failed_record_poisons_the_event_and_its_waiters(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let Some(capabilities) = capabilities(&*runtime, profile) else {
        return;
    };
    let failing = new_stream(&*runtime, StreamPriority::Normal);
    let waiter = new_stream(&*runtime, StreamPriority::Normal);
    // Work the waiter has before the wait is not affected by it.
    let earlier = Arc::new(AtomicBool::new(false));
    let e = Arc::clone(&earlier);
    waiter
        .launch_host_callback(
            Box::new(move || e.store(true, Ordering::SeqCst)),
            LaunchOptions::new(),
        )
        .expect("launch");
    let gate = hold(failing);
    failing
        .launch_host_callback(
            Box::new(|| panic!("deliberate panic")),
            LaunchOptions::new(),
        )
        .expect("launch");
    let poisoned = event(&*runtime, false);
    let completions = Completions::new();
    failing
        .record_event(&*poisoned, completions.options().completion)
        .expect("record is accepted; the stream fails later");
    wait_while_held(capabilities, waiter, &*poisoned, &gate);
    gate.open();
    let err = poisoned.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::STREAM_FAILED, "{err}");
    assert_eq!(
        poisoned.query().unwrap_err().status(),
        Status::STREAM_FAILED
    );
    assert_eq!(completions.results(), vec![Err(Status::STREAM_FAILED)]);
    // The waiter's later work fails instead of waiting for ever.
    let ran = Arc::new(AtomicBool::new(false));
    let r = Arc::clone(&ran);
    let launched = waiter.launch_host_callback(
        Box::new(move || r.store(true, Ordering::SeqCst)),
        LaunchOptions::new(),
    );
    let err = match launched {
        Ok(()) => waiter.synchronize().unwrap_err(),
        Err(refused) => refused,
    };
    assert_eq!(err.status(), Status::STREAM_FAILED, "{err}");
    let named = format!("stream {}", failing.id());
    assert!(
        err.message().contains(&named),
        "the error names the event's stream ({named}): {err}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    assert!(
        earlier.load(Ordering::SeqCst),
        "work enqueued before the wait ran"
    );
}

/// A callback of one stream may launch on a stream that waits for an event
/// behind that callback: the wait (blocking the host or not) must not keep
/// the launch out, or neither would ever finish.
pub fn a_callback_may_launch_on_a_stream_that_waits_for_it(
    backend: &dyn Backend,
    profile: &Profile,
) {
    // The callback needs the waiter for the life of the process.
    let runtime: &'static dyn Runtime = Box::leak(runtime(backend));
    let Some(capabilities) = capabilities(runtime, profile) else {
        return;
    };
    let producer = new_stream(runtime, StreamPriority::Normal);
    let waiter: &'static dyn Stream = new_stream(runtime, StreamPriority::Normal);
    let log = Arc::new(Mutex::new(Vec::new()));
    let gate = hold(producer);
    let from_callback = Arc::clone(&log);
    producer
        .launch_host_callback(
            Box::new(move || {
                let log = Arc::clone(&from_callback);
                waiter
                    .launch_host_callback(
                        Box::new(move || log.lock().unwrap().push("launched by a callback")),
                        LaunchOptions::new(),
                    )
                    .expect("a callback may launch on the waiting stream");
            }),
            LaunchOptions::new(),
        )
        .expect("launch");
    let produced = event(runtime, false);
    producer.record_event(&*produced, None).expect("record");
    let watchdog = Watchdog::new("a wait while a callback launches on the waiting stream");
    wait_while_held(capabilities, waiter, &*produced, &gate);
    gate.open();
    log_on(waiter, &log, "after the wait");
    // The producer first: its callback's launch is then on the waiter.
    producer.synchronize().expect("synchronize");
    waiter.synchronize().expect("synchronize");
    drop(watchdog);
    let mut log = log.lock().unwrap().clone();
    if capabilities.device_side_wait {
        // The callback and this thread launched at about the same time:
        // only that both ran is certain.
        log.sort_unstable();
        assert_eq!(log, ["after the wait", "launched by a callback"]);
    } else {
        // A host-blocking wait returns after the event, so after the
        // callback launched.
        assert_eq!(log, ["launched by a callback", "after the wait"]);
    }
}

/// An event may be dropped while its record and a wait on it are pending:
/// the wait is still honoured, nothing blocks and nothing panics.
pub fn dropping_an_event_with_pending_work_keeps_its_waits(
    backend: &dyn Backend,
    profile: &Profile,
) {
    let runtime = runtime(backend);
    let Some(capabilities) = capabilities(&*runtime, profile) else {
        return;
    };
    let HeldProducer {
        producer,
        consumer,
        log,
        gate,
        event: dropped,
        ..
    } = consumer_waiting_on_held_producer(&*runtime, capabilities, true);
    log_on(consumer, &log, "consumed");
    let started = Instant::now();
    drop(dropped);
    assert!(
        started.elapsed() < PATIENCE,
        "dropping an event does not wait"
    );
    if capabilities.device_side_wait {
        // Time enough for an engine to run the consumer if nothing held it.
        thread::sleep(Duration::from_millis(50));
        assert_eq!(
            consumer.query(),
            Ok(false),
            "the wait is still honoured after the drop"
        );
        assert!(log.lock().unwrap().is_empty());
    }
    gate.open();
    consumer.synchronize().expect("synchronize");
    producer.synchronize().expect("synchronize");
    assert_eq!(*log.lock().unwrap(), ["produced", "consumed"]);
}

/// Elapsed time needs two timed, recorded, completed events of one runtime
/// and says which precondition failed; the time is taken when the device
/// reaches each event, not when the host recorded it; reversed, it is
/// negative.
pub fn elapsed_time_is_device_time_with_named_preconditions(
    backend: &dyn Backend,
    profile: &Profile,
) {
    let runtime = runtime(backend);
    let Some(capabilities) = capabilities(&*runtime, profile) else {
        return;
    };
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let untimed = event(&*runtime, false);
    let start = event(&*runtime, true);
    let end = event(&*runtime, true);
    stream.record_event(&*untimed, None).expect("record");
    stream.synchronize().expect("synchronize");
    let err = untimed.elapsed_nanos(&*end).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(
        err.message().contains("start") && err.message().contains("timing"),
        "{err}"
    );
    let err = start.elapsed_nanos(&*end).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(
        err.message().contains("start") && err.message().contains("never recorded"),
        "{err}"
    );
    if !capabilities.event_timing {
        return;
    }
    let gate = hold(stream);
    stream.record_event(&*start, None).expect("record start");
    // The host records both at once; the device reaches `end` 30 ms later.
    const HELD: Duration = Duration::from_millis(30);
    stream
        .launch_host_callback(Box::new(|| thread::sleep(HELD)), LaunchOptions::new())
        .expect("launch");
    stream.record_event(&*end, None).expect("record end");
    let err = start.elapsed_nanos(&*end).unwrap_err();
    assert_eq!(err.status(), Status::NOT_READY, "{err}");
    gate.open();
    end.synchronize().expect("synchronize");
    let forward = start.elapsed_nanos(&*end).expect("elapsed time");
    assert!(
        forward >= HELD.as_nanos() as i64,
        "{forward} ns between the events, but the device spent at least {HELD:?} between them"
    );
    assert_eq!(end.elapsed_nanos(&*start), Ok(-forward));
}

/// Events of one runtime cannot be recorded on or waited for by another
/// runtime's stream, nor measured against another runtime's event:
/// `INVALID_ARGUMENT`, and nothing changes.
pub fn an_event_of_another_runtime_is_refused(backend: &dyn Backend, profile: &Profile) {
    let first = runtime(backend);
    let Some(capabilities) = capabilities(&*first, profile) else {
        return;
    };
    let second = runtime(backend);
    let foreign = event(&*first, false);
    let stream = new_stream(&*second, StreamPriority::Normal);
    if capabilities.event_timing {
        // Both timed, recorded and complete: only their runtimes differ.
        let start = event(&*first, true);
        let end = event(&*second, true);
        new_stream(&*first, StreamPriority::Normal)
            .record_event(&*start, None)
            .expect("record start");
        stream.record_event(&*end, None).expect("record end");
        start.synchronize().expect("synchronize start");
        end.synchronize().expect("synchronize end");
        for err in [
            start.elapsed_nanos(&*end).unwrap_err(),
            end.elapsed_nanos(&*start).unwrap_err(),
        ] {
            assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
            assert!(
                err.message().contains("both must be of one runtime"),
                "{err}"
            );
        }
    }
    let completions = Completions::new();
    let err = stream
        .record_event(&*foreign, completions.options().completion)
        .unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    assert_eq!((completions.calls(), completions.drops()), (0, 1));
    let err = stream.wait_event(&*foreign).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    assert_eq!(foreign.query(), Ok(true), "still never recorded");
}

/// Concurrent records of one event from several threads are serialized:
/// every record completes exactly once, and afterwards the event is ready.
pub fn concurrent_records_are_serialized(backend: &dyn Backend, profile: &Profile) {
    const THREADS: usize = 4;
    const RECORDS: usize = 50;
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let shared = event(&*runtime, true);
    let completions = Completions::new();
    let streams: Vec<&dyn Stream> = (0..THREADS)
        .map(|_| new_stream(&*runtime, StreamPriority::Normal))
        .collect();
    thread::scope(|scope| {
        for &stream in &streams {
            let shared = &shared;
            let completions = &completions;
            scope.spawn(move || {
                for _ in 0..RECORDS {
                    stream
                        .record_event(&**shared, completions.options().completion)
                        .expect("record");
                    shared.query().expect("query never fails here");
                }
            });
        }
    });
    for stream in &streams {
        stream.synchronize().expect("synchronize");
    }
    assert_eq!(shared.query(), Ok(true));
    assert_eq!(completions.calls(), THREADS * RECORDS);
    assert_eq!(completions.drops(), THREADS * RECORDS);
}

/// A record made without a completion is no operation the device must run:
/// on an idle stream it is complete at once, even while every engine runs
/// other streams' work of higher priority (flex-rt's `Stream::record_event`:
/// later launches do not delay an event). A record with a completion is an
/// operation an engine runs to call it, which such work may delay (flex.h
/// allows either), so this is the software device's behaviour, and the
/// library's: flex-rt passes no completion when it was given none.
pub fn a_record_without_a_completion_needs_no_engine(backend: &dyn Backend, profile: &Profile) {
    let device = software_device(profile);
    let runtime = runtime(backend);
    let Some(_) = capabilities(&*runtime, profile) else {
        return;
    };
    let (gates, blockers) = occupy_every_engine(&*runtime, &device, StreamPriority::High);
    let idle = new_stream(&*runtime, StreamPriority::Normal);
    let marker = event(&*runtime, false);
    idle.record_event(&*marker, None).expect("record");
    assert_eq!(marker.query(), Ok(true), "nothing was enqueued before it");
    let never_called: flex_rt::Completion = Box::new(|_| panic!("complete: never called"));
    assert_eq!(
        marker.notify(never_called),
        Ok(Notification::Settled(Ok(())))
    );
    marker
        .synchronize()
        .expect("synchronize returns at once: nothing to wait for");
    for gate in &gates {
        gate.open();
    }
    for stream in blockers {
        stream.synchronize().expect("synchronize");
    }
}

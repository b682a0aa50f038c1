//! The counters and the trace of the process-wide pool
//! (`spyre_stream::{enable_counters, counters, start_trace, stop_trace}`),
//! on the software device, each test in a fresh process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use spyre_stream::{
    Device, HostBuffer, LaunchOptions, OperationKind, SpyreEvent, SpyreStream, TraceEntry,
    counters, enable_counters, start_trace, stop_trace, stream_from_pool, synchronize_device,
};
use spyre_tests::conformance::Gate;
use spyre_tests::isolated;

const MOCK: (&str, &str) = ("SPYRE_BACKEND", "mock");

fn pool_stream() -> SpyreStream {
    stream_from_pool(Device::CURRENT, 0).expect("stream_from_pool")
}

#[test]
fn counters_count_launches_outcomes_and_bytes_per_stream() {
    isolated!(&[MOCK], || {
        let (a, b) = (pool_stream(), pool_stream());
        a.launch_host_callback(|| {}, LaunchOptions::new()).unwrap();
        assert_eq!(counters().device.launched, 0, "off until enabled");
        enable_counters();
        let device = spyre_stream::allocate(Device::CURRENT, 4096).unwrap();
        let (source, target) = (HostBuffer::zeroed(4096), HostBuffer::zeroed(4096));
        a.launch_h2d(&source, &device, LaunchOptions::new())
            .unwrap();
        a.launch_d2h(&device, &target, LaunchOptions::new())
            .unwrap();
        b.launch_host_callback(|| {}, LaunchOptions::new()).unwrap();
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        let snapshot = counters();
        let [(first, on_a), (second, on_b)] = snapshot.streams[..] else {
            panic!("two streams: {snapshot:?}");
        };
        assert_eq!((first, second), (a, b));
        assert_eq!((on_a.launched, on_a.completed, on_a.failed), (2, 2, 0));
        assert_eq!((on_a.bytes_h2d, on_a.bytes_d2h), (4096, 4096));
        assert_eq!((on_b.launched, on_b.completed), (1, 1));
        assert_eq!(snapshot.device.launched, 3);
        assert_eq!(snapshot.device.in_flight, 0);
        assert!(on_a.max_in_flight >= 1);
        spyre_stream::free(Device::CURRENT, &device).unwrap();
    });
}

#[test]
fn a_failed_operation_and_those_skipped_after_it_count_as_failed() {
    isolated!(&[MOCK], || {
        enable_counters();
        let stream = pool_stream();
        stream
            .launch_host_callback(|| panic!("on purpose"), LaunchOptions::new())
            .unwrap();
        // Launched before the failure is seen, or refused after it.
        let later = stream.launch_host_callback(|| {}, LaunchOptions::new());
        assert!(stream.synchronize().is_err());
        let device = counters().device;
        let expected = if later.is_ok() { 2 } else { 1 };
        assert_eq!(
            (device.launched, device.failed, device.completed),
            (expected, expected, 0)
        );
        assert_eq!(device.in_flight, 0);
    });
}

/// A launch the runtime refuses drops the caller's closure inside the
/// launch; when that drop panics, the launch is still taken back from the
/// counters and the trace (it stayed in flight for good, and its entry
/// enqueued and never finished).
#[test]
fn a_refused_launch_whose_closure_panics_on_drop_is_not_left_in_flight() {
    struct PanicOnDrop;
    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            panic!("dropped");
        }
    }
    isolated!(&[MOCK], || {
        enable_counters();
        start_trace();
        let stream = pool_stream();
        let device = spyre_stream::allocate(Device::CURRENT, 4096).unwrap();
        // 8 bytes into 4096: refused for the sizes.
        let captured = PanicOnDrop;
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            stream.launch_h2d(
                &HostBuffer::zeroed(8),
                &device,
                LaunchOptions::new().on_complete(move |_| {
                    let _captured = &captured;
                }),
            )
        }));
        assert!(unwound.is_err(), "the drop's panic reaches the caller");
        let counts = counters().device;
        assert_eq!((counts.launched, counts.in_flight), (0, 0));
        let kinds: Vec<_> = stop_trace().entries.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [OperationKind::Refused]);
        spyre_stream::free(Device::CURRENT, &device).unwrap();
    });
}

/// A backend that completes inside the launch (the no-op backend), whose
/// caller's completion panics out of it: the operation ran, and stays
/// counted and traced as run, not as refused.
#[test]
fn a_completion_that_unwinds_out_of_its_launch_stays_counted_as_run() {
    isolated!(&[MOCK], || {
        spyre_stream::set_backend(Box::new(flex_rt::noop::NoopBackend::new(1))).unwrap();
        enable_counters();
        start_trace();
        let stream = pool_stream();
        let unwound = std::panic::catch_unwind(|| {
            stream.launch_host_callback(
                || {},
                LaunchOptions::new().on_complete(|_| panic!("the caller's completion")),
            )
        });
        assert!(unwound.is_err(), "the no-op backend lets the panic unwind");
        let counts = counters().device;
        assert_eq!(
            (counts.launched, counts.completed, counts.in_flight),
            (1, 1, 0)
        );
        let kinds: Vec<_> = stop_trace().entries.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [OperationKind::HostCallback]);
    });
}

#[test]
fn copies_skipped_after_a_failure_move_no_bytes() {
    // Both copies are launched while the callback before them is held, so
    // the runtime takes them; the callback then fails and they are skipped.
    isolated!(&[MOCK], || {
        enable_counters();
        let stream = pool_stream();
        let gate = Gate::new();
        let held = std::sync::Arc::clone(&gate);
        stream
            .launch_host_callback(
                move || {
                    held.wait();
                    panic!("on purpose");
                },
                LaunchOptions::new(),
            )
            .unwrap();
        let device = spyre_stream::allocate(Device::CURRENT, 4096).unwrap();
        let (source, target) = (HostBuffer::zeroed(4096), HostBuffer::zeroed(4096));
        stream
            .launch_h2d(&source, &device, LaunchOptions::new())
            .unwrap();
        stream
            .launch_d2h(&device, &target, LaunchOptions::new())
            .unwrap();
        gate.open();
        assert!(stream.synchronize().is_err());
        let counted = counters().device;
        assert_eq!(
            (counted.launched, counted.failed, counted.completed),
            (3, 3, 0)
        );
        assert_eq!((counted.bytes_h2d, counted.bytes_d2h), (0, 0));
        spyre_stream::free(Device::CURRENT, &device).unwrap();
    });
}

#[test]
fn a_trace_holds_each_launch_record_and_wait_once() {
    isolated!(&[MOCK], || {
        let (producer, consumer) = (pool_stream(), pool_stream());
        start_trace();
        producer
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        let event = SpyreEvent::new().unwrap();
        event.record(producer).unwrap();
        event.wait(consumer).unwrap();
        consumer
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        consumer.synchronize().unwrap();
        let trace = stop_trace();
        let kinds: Vec<(OperationKind, SpyreStream)> =
            trace.entries.iter().map(|e| (e.kind, e.stream)).collect();
        assert_eq!(
            kinds,
            [
                (OperationKind::HostCallback, producer),
                (OperationKind::EventRecord, producer),
                (OperationKind::EventWait, consumer),
                (OperationKind::HostCallback, consumer),
            ]
        );
        for entry in &trace.entries {
            let (started, finished) = (entry.started.unwrap(), entry.finished.unwrap());
            assert!(
                entry.enqueued <= started && started <= finished,
                "{entry:?}"
            );
        }
        // The wait links to the record, and the consumer's work starts
        // after the producer's work before the record finished (not after
        // the record's own stamp: its notification may run after the
        // consumer was let go, see `TraceEntry::finished`).
        let (produced, record, wait, consumed) = (
            &trace.entries[0],
            &trace.entries[1],
            &trace.entries[2],
            &trace.entries[3],
        );
        let link = record.link.expect("a record has a link");
        assert_eq!(wait.link, Some(link));
        assert!(consumed.started.unwrap() >= produced.finished.unwrap());
        // Nothing is traced once it stopped.
        producer
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        producer.synchronize().unwrap();
        start_trace();
        assert!(stop_trace().entries.is_empty());
    });
}

/// Tracing does not change when an event completes: a record on an idle
/// stream is complete at once, also while the one engine runs work of a
/// high-priority stream (flex-rt's `Stream::record_event`: later launches
/// do not delay an event). Before the trace asked to be told of a record's
/// completion as a waiter is, it gave the record a completion of its own,
/// which made the record an operation the engine had to run: the event
/// stayed incomplete until the high-priority work ended.
#[test]
fn tracing_does_not_delay_an_events_completion() {
    isolated!(&[MOCK, ("SPYRE_MOCK_ENGINES", "1")], || {
        let high = stream_from_pool(Device::CURRENT, -1).expect("stream_from_pool");
        let idle = pool_stream();
        let busy = Gate::hold_pool_stream(high);
        start_trace();
        let event = SpyreEvent::new().unwrap();
        event.record(idle).unwrap();
        let complete_at_once = event.query().unwrap();
        busy.open();
        high.synchronize().unwrap();
        let trace = stop_trace();
        assert!(complete_at_once, "nothing was enqueued before the record");
        let record = &trace.entries[0];
        assert_eq!(
            (record.kind, record.stream),
            (OperationKind::EventRecord, idle)
        );
        assert!(record.finished.is_some() && !record.failed, "{record:?}");
    });
}

#[test]
fn the_devices_most_in_flight_counts_every_stream_together() {
    isolated!(&[MOCK], || {
        enable_counters();
        let (a, b) = (pool_stream(), pool_stream());
        // Each stream: a held callback and two launches behind it.
        let gates = [a, b].map(spyre_tests::conformance::Gate::hold_pool_stream);
        for stream in [a, b] {
            for _ in 0..2 {
                stream
                    .launch_host_callback(|| {}, LaunchOptions::new())
                    .unwrap();
            }
        }
        let held = counters();
        assert_eq!(held.device.in_flight, 6);
        assert_eq!(held.device.max_in_flight, 6, "3 on each stream at once");
        for (_, stream) in &held.streams {
            assert_eq!((stream.in_flight, stream.max_in_flight), (3, 3));
        }
        for gate in gates {
            gate.open();
        }
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        let done = counters();
        assert_eq!((done.device.in_flight, done.device.completed), (0, 6));
        assert_eq!(done.device.max_in_flight, 6);
    });
}

/// Several threads launching on one stream: the trace shows the stream's
/// operations one after another, each at least as long as it ran. Before
/// the starts were derived in the order the stream finished its
/// operations, launches appended to the trace in another order than they
/// reached the stream showed as taking no time and overlapping (in about
/// half the runs).
#[test]
fn a_stream_fed_by_several_threads_is_traced_one_operation_after_another() {
    isolated!(&[MOCK], || {
        let stream = pool_stream();
        start_trace();
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..500 {
                        stream
                            .launch_host_callback(
                                || std::thread::sleep(Duration::from_micros(20)),
                                LaunchOptions::new(),
                            )
                            .unwrap();
                    }
                });
            }
        });
        stream.synchronize().unwrap();
        let trace = stop_trace();
        let mut ran: Vec<(Duration, Duration)> = trace
            .entries
            .iter()
            .map(|e| (e.started.unwrap(), e.finished.unwrap()))
            .collect();
        assert_eq!(ran.len(), 4000);
        ran.sort();
        let short = ran
            .iter()
            .filter(|(started, finished)| *finished - *started < Duration::from_micros(20))
            .count();
        let overlapping = ran.windows(2).filter(|p| p[1].0 < p[0].1).count();
        assert_eq!(
            (short, overlapping),
            (0, 0),
            "operations shown shorter than their 20 µs, and starting before the one before finished"
        );
    });
}

/// A record racing a wait on the same event: the wait's entry links the
/// record the wait waited for. Each record follows a 50 µs operation of
/// the recording stream, so consecutive records finish at least 50 µs
/// apart, and the waiting stream's operation after a wait cannot finish
/// before the operation before the record the wait is linked to. Before
/// the link was read in step with the wait, a wait could be linked to the
/// record after the one it waited for: the operation after the wait then
/// finished while the one before the linked record was still running.
#[test]
fn a_wait_racing_a_record_of_its_event_links_the_record_it_waited_for() {
    isolated!(&[MOCK], || waits_link_the_records_they_waited_for(false));
}

/// As above where a wait blocks the host: a wait during which the event
/// was recorded again links no record (which one it waited for is not
/// known), never a wrong one. Each record is made once the one before it
/// completed, when the waits blocked on that one return: some waits race
/// the next record, some do not.
#[test]
fn a_host_side_wait_racing_a_record_links_the_record_it_waited_for_or_none() {
    isolated!(&[MOCK, ("SPYRE_MOCK_DEVICE_SIDE_WAIT", "0")], || {
        waits_link_the_records_they_waited_for(true)
    });
}

/// Records `event` 2 000 times on one stream, each after a 50 µs operation
/// (and, `paced`, once the record before completed), while this thread
/// waits on it from another stream and launches after each wait; then
/// checks that no operation after a wait finished before the operation
/// before the record the wait is linked to.
fn waits_link_the_records_they_waited_for(paced: bool) {
    {
        let (recording, waiting) = (pool_stream(), pool_stream());
        let event = SpyreEvent::new().unwrap();
        start_trace();
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..2_000 {
                    recording
                        .launch_host_callback(
                            || std::thread::sleep(Duration::from_micros(50)),
                            LaunchOptions::new(),
                        )
                        .unwrap();
                    event.record(recording).unwrap();
                    if paced {
                        event.synchronize().unwrap();
                    }
                }
                done.store(true, Ordering::Relaxed);
            });
            let wait_and_launch = || {
                event.wait(waiting).unwrap();
                waiting
                    .launch_host_callback(|| {}, LaunchOptions::new())
                    .unwrap();
            };
            while !done.load(Ordering::Relaxed) {
                wait_and_launch();
            }
            // At least one wait once the event is recorded: on a loaded
            // machine the recording thread may have enqueued all its
            // records before this thread's first wait.
            wait_and_launch();
        });
        synchronize_device(Device::CURRENT).unwrap();
        let trace = stop_trace();
        // For each record, when the 50 µs operation before it on the
        // recording stream finished: its completion has returned before
        // the device reaches the record, so before any wait on the record
        // is passed. (Not the record's own stamp: the runtime tells the
        // trace of a record as it tells a waiter, and the waiter may run
        // first.)
        let on_recording: Vec<&TraceEntry> = trace
            .entries
            .iter()
            .filter(|e| e.stream == recording)
            .collect();
        let records: HashMap<u64, Duration> = on_recording
            .windows(2)
            .filter(|pair| pair[1].kind == OperationKind::EventRecord)
            .map(|pair| {
                assert_eq!(pair[0].kind, OperationKind::HostCallback);
                (pair[1].link.unwrap(), pair[0].finished.unwrap())
            })
            .collect();
        assert_eq!(records.len(), 2_000, "every record follows its operation");
        let on_waiting: Vec<&TraceEntry> = trace
            .entries
            .iter()
            .filter(|e| e.stream == waiting)
            .collect();
        let mut checked = 0;
        let mut early = 0;
        for pair in on_waiting.windows(2) {
            let (wait, next) = (pair[0], pair[1]);
            if let (OperationKind::EventWait, Some(link)) = (wait.kind, wait.link) {
                assert_eq!(next.kind, OperationKind::HostCallback);
                checked += 1;
                if next.finished.unwrap() < records[&link] {
                    early += 1;
                }
            }
        }
        assert!(checked > 0, "no wait was linked to a record");
        assert_eq!(
            early, 0,
            "of {checked} operations after a linked wait, these finished before the operation before the record linked"
        );
    }
}

//! flex-rt's hardware backend against a misbehaving library: the mock shared
//! library with its `SPYRE_MOCK_*` switches (see the `spyre-mock-capi` crate). Each
//! test runs in a fresh process (`isolated`) with only the switches it names.
//!
//! What is checked is what flex.h promises and flex-rt builds on: a status
//! flex.h does not define is an error naming it, never a crash; a launch
//! that does not return `FLEX_SUCCESS` never calls its completion, so
//! flex-rt frees what it handed over exactly once; completions that arrive
//! late, from another thread, still arrive exactly once, and none arrives
//! after the runtime is destroyed (and where the library fails to destroy
//! it, what they use stays alive).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flex_rt::{Backend, DataFormat, HostBuffer, LaunchOptions, Status, StreamMode, StreamPriority};
use spyre_tests::conformance::{Completions, Gate};
use spyre_tests::ffi::{backend, live_threads, settle_threads};
use spyre_tests::isolated;
use spyre_tests::reliability::quiet_deliberate_panics;

/// Counts its drops; captured by a host callback to see when it goes.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The calling thread's name as the kernel has it. The library's threads
/// were started by its own copy of std, so `std::thread::current()` here
/// does not know their names.
fn os_thread_name() -> String {
    std::fs::read_to_string("/proc/thread-self/comm")
        .expect("/proc/thread-self/comm names this thread")
        .trim_end()
        .to_owned()
}

#[test]
fn an_undefined_status_from_query_is_an_error_naming_it() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_UNDEFINED_STATUS", "flex_stream_query")],
        || {
            let runtime = backend().create_runtime(0).expect("create_runtime");
            let stream = runtime.default_stream();
            let err = stream.query().unwrap_err();
            assert_eq!(err.status(), Status(977));
            assert!(!err.status().is_known());
            assert_eq!(err.call(), "flex_stream_query");
            assert_eq!(
                err.to_string(),
                "flex_stream_query failed with undefined status 977 (not in flex.h): \
                 flex_stream_query returned status 977 on purpose \
                 (SPYRE_MOCK_UNDEFINED_STATUS=flex_stream_query)"
            );
            // Nothing else is affected.
            let address = runtime.allocate(16).expect("allocate");
            let out = HostBuffer::zeroed(16);
            stream
                .launch_fill(&address, 3.0, DataFormat::Uint8, LaunchOptions::new())
                .unwrap();
            stream
                .launch_d2h(&address, &out, LaunchOptions::new())
                .unwrap();
            stream.synchronize().expect("synchronize");
            assert_eq!(out.to_vec(), vec![3u8; 16]);
        },
    );
}

#[test]
fn an_undefined_status_from_a_launch_releases_what_it_carried_once() {
    isolated!(mock_cdylib; &[(
            "SPYRE_MOCK_UNDEFINED_STATUS",
            "flex_launch_h2d,flex_launch_host_callback",
        )],
        || {
            let runtime = backend().create_runtime(0).expect("create_runtime");
            let stream = runtime.default_stream();
            let address = runtime.allocate(64).expect("allocate");
            let completions = Completions::new();

            let source = HostBuffer::from_vec(vec![1; 64]);
            let err = stream
                .launch_h2d(&source, &address, completions.options())
                .unwrap_err();
            assert_eq!((err.status(), err.call()), (Status(977), "flex_launch_h2d"));
            assert!(
                source.lease_for_write("test").is_ok(),
                "the read lease was released"
            );

            let host_drops = Arc::new(AtomicUsize::new(0));
            let guard = DropCount(Arc::clone(&host_drops));
            let ran = Arc::new(AtomicUsize::new(0));
            let r = Arc::clone(&ran);
            let err = stream
                .launch_host_callback(
                    Box::new(move || {
                        let _guard = guard;
                        r.fetch_add(1, Ordering::SeqCst);
                    }),
                    completions.options(),
                )
                .unwrap_err();
            assert_eq!(err.status(), Status(977));
            assert_eq!(
                host_drops.load(Ordering::SeqCst),
                1,
                "the host callback was dropped once"
            );

            // A launch the switch does not name goes through.
            stream
                .launch_fill(&address, 2.0, DataFormat::Uint8, completions.options())
                .expect("launch_fill");
            stream.synchronize().expect("synchronize");
            assert_eq!(
                ran.load(Ordering::SeqCst),
                0,
                "the refused host callback never ran"
            );
            assert_eq!(
                completions.results(),
                vec![Ok(())],
                "only the fill completed"
            );
            assert_eq!(completions.drops(), 3, "each completion released once");
        },
    );
}

#[test]
fn an_undefined_status_without_a_runtime_is_an_error() {
    isolated!(mock_cdylib; &[(
            "SPYRE_MOCK_UNDEFINED_STATUS",
            "flex_get_device_count, flex_runtime_create",
        )],
        || {
            let backend = backend();
            let err = backend.device_count().unwrap_err();
            assert_eq!(
                (err.status(), err.call()),
                (Status(977), "flex_get_device_count")
            );
            let err = backend.create_runtime(0).unwrap_err();
            assert_eq!(
                (err.status(), err.call()),
                (Status(977), "flex_runtime_create")
            );
        },
    );
}

#[test]
fn a_refused_launch_is_launch_failed_and_released_once() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_FAIL_LAUNCH", "3")],
        || {
            let runtime = backend().create_runtime(0).expect("create_runtime");
            let created = runtime
                .create_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
                .expect("create_stream");
            let address = runtime.allocate(32).expect("allocate");
            for stream in [runtime.default_stream(), created] {
                let completions = Completions::new();
                let out = HostBuffer::zeroed(32);
                let mut statuses = Vec::new();
                for value in 1..=5u8 {
                    let result = if value == 3 {
                        // The third launch is a D2H: its write lease must be
                        // released when it is refused.
                        stream.launch_d2h(&address, &out, completions.options())
                    } else {
                        stream.launch_fill(
                            &address,
                            f64::from(value),
                            DataFormat::Uint8,
                            completions.options(),
                        )
                    };
                    statuses.push(result.map_err(|err| err.status()));
                }
                assert_eq!(
                    statuses,
                    vec![Ok(()), Ok(()), Err(Status::LAUNCH_FAILED), Ok(()), Ok(())]
                );
                assert!(
                    out.lease_for_write("test").is_ok(),
                    "the write lease was released"
                );
                stream.synchronize().expect("synchronize");
                assert_eq!(completions.results(), vec![Ok(()); 4]);
                assert_eq!(completions.drops(), 5);
            }
        },
    );
}

/// A launch the library refuses takes no place among the stream's
/// launches whose completions flex-rt counts: an event recorded after it
/// but before an operation whose completion panics stays complete, and one
/// recorded behind that operation fails naming the panic.
#[test]
fn a_refused_launch_does_not_shift_a_completion_panic_onto_an_earlier_event() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_FAIL_LAUNCH", "1")],
        || {
            quiet_deliberate_panics();
            let runtime = backend().create_runtime(0).expect("create_runtime");
            let stream = runtime.default_stream();
            let address = runtime.allocate(32).expect("allocate");
            let refused = stream
                .launch_fill(&address, 1.0, DataFormat::Uint8, LaunchOptions::new())
                .unwrap_err();
            assert_eq!(refused.status(), Status::LAUNCH_FAILED, "{refused}");
            let before = runtime.create_event(false).expect("create_event");
            stream.record_event(&*before, None).expect("record");
            let gate = Gate::new();
            let waiting = Arc::clone(&gate);
            stream
                .launch_host_callback(
                    Box::new(move || waiting.wait()),
                    LaunchOptions::new().on_complete(|_| panic!("deliberate completion panic")),
                )
                .expect("launch");
            let behind = runtime.create_event(false).expect("create_event");
            stream.record_event(&*behind, None).expect("record");
            gate.open();
            let err = behind.synchronize().unwrap_err();
            assert_eq!(err.status(), Status::STREAM_FAILED, "{err}");
            assert!(err.message().contains("deliberate completion panic"), "{err}");
            assert_eq!(before.query(), Ok(true), "recorded before the panicking operation");
            runtime.free(&address).expect("free");
        },
    );
}

#[test]
fn late_completions_arrive_once_and_never_after_the_runtime() {
    const DELAY: Duration = Duration::from_millis(150);
    isolated!(mock_cdylib; &[("SPYRE_MOCK_LATE_COMPLETIONS_MS", "150")],
        || {
            let backend = backend();
            let baseline = live_threads();
            let runtime = backend.create_runtime(0).expect("create_runtime");
            // Two engines and the delivery thread.
            assert_eq!(live_threads(), baseline + 3);
            let stream = runtime
                .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                .expect("create_stream");
            let completions = Completions::new();
            let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
            let address = runtime.allocate(256).expect("allocate");
            let outs: Vec<HostBuffer> = (0..4).map(|_| HostBuffer::zeroed(256)).collect();
            let start = Instant::now();
            for (i, out) in outs.iter().enumerate() {
                stream
                    .launch_fill(&address, i as f64, DataFormat::Uint8, LaunchOptions::new())
                    .unwrap();
                let names = Arc::clone(&threads);
                let counted = completions.options().completion.unwrap();
                stream
                    .launch_d2h(
                        &address,
                        out,
                        LaunchOptions::new().on_complete(move |result| {
                            names.lock().unwrap().push(os_thread_name());
                            counted(result);
                        }),
                    )
                    .unwrap();
            }
            // The device is done long before the completions arrive: the
            // buffers stay leased to the operations until then (none
            // arrives before `start + DELAY`: checked unless this thread
            // was paused that long).
            let leased = outs[0].lease_for_write("test").is_err();
            if start.elapsed() < DELAY {
                assert!(leased, "still leased");
            }
            stream.synchronize().expect("synchronize");
            assert!(
                start.elapsed() >= DELAY,
                "synchronize waited for the completions"
            );
            assert_eq!(completions.results(), vec![Ok(()); 4]);
            for (i, out) in outs.iter().enumerate() {
                assert_eq!(out.to_vec(), vec![i as u8; 256], "buffer {i}");
            }
            // The kernel keeps 15 bytes of "spyre-mock-d0-late".
            assert_eq!(
                *threads.lock().unwrap(),
                vec!["spyre-mock-d0-l".to_owned(); 4],
                "called from the runtime's delivery thread"
            );

            // Dropping the runtime with completions pending waits for them.
            let late = Completions::new();
            let launched = Instant::now();
            for _ in 0..3 {
                stream
                    .launch_fill(&address, 1.0, DataFormat::Uint8, late.options())
                    .unwrap();
            }
            let calls = late.calls();
            if launched.elapsed() < DELAY {
                assert_eq!(calls, 0, "not delivered yet");
            }
            drop(runtime);
            assert_eq!(late.results(), vec![Ok(()); 3]);
            assert_eq!(late.drops(), 3);
            assert_eq!(
                settle_threads(baseline),
                baseline,
                "every library thread is gone"
            );
            // Nothing arrives afterwards.
            std::thread::sleep(2 * DELAY);
            assert_eq!((late.calls(), late.drops()), (3, 3));
            assert_eq!(completions.calls(), 4);
        },
    );
}

#[test]
fn a_runtime_whose_destroy_fails_keeps_what_its_late_callbacks_use() {
    // The library's synchronize and destroy return at once and do nothing,
    // so the runtime's threads outlive its drop: the host callbacks, held
    // at a gate until after the drop, run afterwards, and their completions
    // give their payload blocks back to the stream's cache, which must
    // still be there (`ci/valgrind.sh` runs this under memcheck).
    isolated!(mock_cdylib; &[(
            "SPYRE_MOCK_UNDEFINED_STATUS",
            "flex_stream_synchronize,flex_runtime_destroy",
        )],
        || {
            let runtime = backend().create_runtime(0).expect("create_runtime");
            // The default stream: a created one would be drained by its
            // own `flex_stream_destroy`, which the switch leaves alone.
            let stream = runtime.default_stream();
            let completions = Completions::new();
            let gate = Gate::new();
            let ran = Arc::new(AtomicUsize::new(0));
            for _ in 0..3 {
                let (gate, ran) = (Arc::clone(&gate), Arc::clone(&ran));
                stream
                    .launch_host_callback(
                        Box::new(move || {
                            gate.wait();
                            ran.fetch_add(1, Ordering::SeqCst);
                        }),
                        completions.options(),
                    )
                    .expect("launch_host_callback");
            }
            drop(runtime);
            assert_eq!(completions.calls(), 0, "every completion is still to come");
            gate.open();
            let deadline = Instant::now() + Duration::from_secs(20);
            while completions.calls() < 3 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(ran.load(Ordering::SeqCst), 3);
            assert_eq!(completions.results(), vec![Ok(()); 3]);
            assert_eq!((completions.calls(), completions.drops()), (3, 3));
        },
    );
}

/// A host callback's panic is named by every error its stream gives for it
/// through the library, which knows only the status the host function
/// returned: `query` as soon as the stream has failed (here long before
/// any completion arrives: the note is made before the host function
/// returns), launches refused afterwards, the completion of an operation
/// that never ran (the panicking callback itself has none), `synchronize`,
/// and the errors of events recorded behind it (with a completion and
/// without). Another stream's errors do not name it. Before, only the
/// panicking callback's own completion named it.
#[test]
fn every_error_after_a_host_callback_panic_names_it() {
    // Long enough for the host function to run and fail under valgrind
    // (`ci/valgrind.sh` runs these tests), where the failure must still be
    // seen before any completion arrives.
    const LATE: Duration = Duration::from_secs(5);
    isolated!(mock_cdylib; &[("SPYRE_MOCK_LATE_COMPLETIONS_MS", "5000")],
        || {
            const PANIC: &str = "deliberate panic: weights file missing";
            quiet_deliberate_panics();
            let runtime = backend().create_runtime(0).expect("create_runtime");
            let new_stream = || {
                runtime
                    .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                    .expect("create_stream")
            };
            let (stream, other) = (new_stream(), new_stream());
            let gate = Gate::new();
            let waiter = Arc::clone(&gate);
            stream
                .launch_host_callback(Box::new(move || waiter.wait()), LaunchOptions::new())
                .expect("launch the gate");
            stream
                .launch_host_callback(Box::new(|| panic!("{PANIC}")), LaunchOptions::new())
                .expect("launch the panicking callback");
            let (sender, completed) = std::sync::mpsc::channel();
            stream
                .launch_host_callback(
                    Box::new(|| {}),
                    LaunchOptions::new().on_complete(move |result| sender.send(result).unwrap()),
                )
                .expect("launch behind it");
            let events = [
                runtime.create_event(false).expect("create_event"),
                runtime.create_event(false).expect("create_event"),
            ];
            stream.record_event(&*events[0], None).expect("record");
            let (recorded, record_completed) = std::sync::mpsc::channel();
            stream
                .record_event(
                    &*events[1],
                    Some(Box::new(move |result| recorded.send(result).unwrap())),
                )
                .expect("record with a completion");
            let failed_at = {
                let start = Instant::now();
                gate.open();
                let error = loop {
                    match stream.query() {
                        Err(error) => break error,
                        Ok(_) => {
                            assert!(start.elapsed() < LATE, "the stream failed in time");
                            std::thread::yield_now();
                        }
                    }
                };
                assert_eq!(error.status(), Status::HOST_CALLBACK_FAILED, "{error}");
                assert!(error.message().contains(PANIC), "query: {error}");
                start.elapsed()
            };
            assert!(failed_at < LATE, "seen before any completion was delivered");
            let refused = stream
                .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                .unwrap_err();
            assert_eq!(refused.status(), Status::STREAM_FAILED, "{refused}");
            assert!(refused.message().contains(PANIC), "refused launch: {refused}");
            let synchronized = stream.synchronize().unwrap_err();
            assert_eq!(synchronized.status(), Status::HOST_CALLBACK_FAILED);
            assert!(synchronized.message().contains(PANIC), "synchronize: {synchronized}");
            let never_ran = completed.recv().unwrap().unwrap_err();
            assert_eq!(never_ran.status(), Status::STREAM_FAILED, "{never_ran}");
            assert!(never_ran.message().contains(PANIC), "completion: {never_ran}");
            for event in &events {
                for error in [event.query().unwrap_err(), event.synchronize().unwrap_err()] {
                    assert_eq!(error.status(), Status::STREAM_FAILED, "{error}");
                    assert!(error.message().contains(PANIC), "event: {error}");
                }
            }
            let record_failed = record_completed.recv().unwrap().unwrap_err();
            assert_eq!(record_failed.status(), Status::STREAM_FAILED);
            assert!(record_failed.message().contains(PANIC), "record: {record_failed}");
            // Another stream is unaffected; failed by a bad program, its
            // errors are its own.
            other
                .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                .expect("launch on another stream");
            other.synchronize().expect("another stream");
            let bad = runtime.allocate(128).expect("allocate");
            other
                .launch_fill(&bad, 0.0, DataFormat::Uint8, LaunchOptions::new())
                .expect("launch_fill");
            other
                .launch_compute(&bad, LaunchOptions::new())
                .expect("launch_compute");
            let own = other.synchronize().unwrap_err();
            assert_eq!(own.status(), Status::EXECUTION_FAILED, "{own}");
            let refused = other
                .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                .unwrap_err();
            assert_eq!(refused.status(), Status::STREAM_FAILED, "{refused}");
            for error in [own, refused] {
                assert!(!error.message().contains(PANIC), "another stream's: {error}");
            }
        },
    );
}

/// A completion that panics after its operation succeeded fails the stream
/// only if the library has not failed it already: with completions
/// delivered late, the stream ran on meanwhile and a host callback behind
/// the operation failed it first, so that failure stays the stream's error.
/// Before, the late completion's panic replaced it.
#[test]
fn a_late_completion_panic_does_not_replace_the_first_error() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_LATE_COMPLETIONS_MS", "2000")],
        || {
            quiet_deliberate_panics();
            let runtime = backend().create_runtime(0).expect("create_runtime");
            let stream = runtime
                .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                .expect("create_stream");
            stream
                .launch_host_callback(
                    Box::new(|| {}),
                    LaunchOptions::new()
                        .on_complete(|_| panic!("deliberate panic in a late completion")),
                )
                .expect("launch");
            stream
                .launch_host_callback(
                    Box::new(|| panic!("deliberate panic in a host callback")),
                    LaunchOptions::new(),
                )
                .expect("launch");
            let errors = [stream.synchronize().unwrap_err(), stream.query().unwrap_err()];
            for error in errors {
                assert_eq!(error.status(), Status::HOST_CALLBACK_FAILED, "{error}");
                assert!(error.message().contains("in a host callback"), "{error}");
                assert!(!error.message().contains("late completion"), "{error}");
            }
        },
    );
}

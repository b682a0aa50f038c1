//! flex-rt's `HardwareRuntime` and `HardwareStream` over the mock shared
//! library: teardown, `close`, concurrent submission to one stream, and no
//! library thread outliving its runtime. Each test runs in a fresh process
//! (`isolated`), so the thread counts see no other test.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use flex_rt::{
    DataFormat, HardwareRuntime, HostBuffer, LaunchOptions, Runtime, Status, Stream, StreamMode,
    StreamPriority, TeardownStep,
};
use spyre_tests::conformance::{Completions, Gate};
use spyre_tests::ffi::{backend, live_threads, settle_threads};
use spyre_tests::isolated;

fn context() -> HardwareRuntime {
    HardwareRuntime::create(Arc::clone(backend().library()), 0).expect("HardwareRuntime::create")
}

#[test]
fn dropping_the_context_waits_for_pending_work() {
    isolated!(mock_cdylib; &[], || {
        let context = context();
        let completions = Completions::new();
        let gate = Gate::new();
        let ran = Arc::new(AtomicUsize::new(0));
        let out = HostBuffer::zeroed(128);
        let address = context.allocate(128).expect("allocate");
        for stream in [
            context.default_stream() as &dyn Stream,
            context
                .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                .expect("create_stream"),
        ] {
            let (r, waiter) = (Arc::clone(&ran), Arc::clone(&gate));
            stream
                .launch_host_callback(
                    Box::new(move || {
                        waiter.wait();
                        r.fetch_add(1, Ordering::SeqCst);
                    }),
                    completions.options(),
                )
                .expect("launch_host_callback");
        }
        let stream = context.default_stream();
        stream
            .launch_fill(&address, 6.0, DataFormat::Uint8, completions.options())
            .expect("launch_fill");
        stream
            .launch_d2h(&address, &out, completions.options())
            .expect("launch_d2h");
        assert_eq!(
            completions.calls(),
            0,
            "the host callbacks are still waiting"
        );
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            gate.open();
        });
        drop(context);
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        assert_eq!(completions.results(), vec![Ok(()); 4]);
        assert_eq!(completions.drops(), 4);
        assert_eq!(out.to_vec(), vec![6u8; 128]);
        opener.join().unwrap();
    });
}

#[test]
fn close_is_ok_on_a_clean_context_and_lists_what_failed_otherwise() {
    isolated!(mock_cdylib; &[],
        || {
            let clean = context();
            let stream = clean
                .create_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
                .expect("create_stream");
            let address = clean.allocate(64).expect("allocate");
            stream
                .launch_fill(&address, 1.0, DataFormat::Fp32, LaunchOptions::new())
                .unwrap();
            assert_eq!(clean.close(), Ok(()));

            // A stream that failed reports its sticky error from the
            // teardown's synchronize; the rest of the teardown still runs.
            let failed = context();
            let stream = failed
                .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                .expect("create_stream");
            let program = failed.allocate(128).expect("allocate");
            stream
                .launch_h2d(
                    &HostBuffer::from_vec(vec![0xEE; 128]),
                    &program,
                    LaunchOptions::new(),
                )
                .unwrap();
            stream
                .launch_compute(&program, LaunchOptions::new())
                .unwrap();
            let err = failed.close().unwrap_err();
            assert_eq!(err.logical_device(), 0);
            let steps: Vec<(TeardownStep, Status)> = err
                .errors()
                .iter()
                .map(|e| (e.step(), e.error().status()))
                .collect();
            assert_eq!(
                steps,
                vec![(
                    TeardownStep::SynchronizeStream { id: 1 },
                    Status::EXECUTION_FAILED
                )]
            );
        },
    );
}

/// What the host callbacks of one stream record: whether one is running,
/// how often two ran at once, and how many ran.
#[derive(Default)]
struct HostRecord {
    busy: AtomicBool,
    overlaps: AtomicUsize,
    ran: AtomicUsize,
}

#[test]
fn eight_threads_submit_to_one_stream() {
    const THREADS: usize = 8;
    const EACH: usize = 100;
    isolated!(mock_cdylib; &[], || {
        let context = context();
        let stream = context
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .expect("create_stream");
        let completions = Completions::new();
        let record = Arc::new(HostRecord::default());
        let address = context.allocate(256).expect("allocate");
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (completions, record, address) = (&completions, &record, &address);
                scope.spawn(move || {
                    for i in 0..EACH {
                        if (t + i) % 2 == 0 {
                            let record = Arc::clone(record);
                            stream
                                .launch_host_callback(
                                    Box::new(move || {
                                        if record.busy.swap(true, Ordering::SeqCst) {
                                            record.overlaps.fetch_add(1, Ordering::SeqCst);
                                        }
                                        record.ran.fetch_add(1, Ordering::SeqCst);
                                        record.busy.store(false, Ordering::SeqCst);
                                    }),
                                    completions.options(),
                                )
                                .expect("launch_host_callback");
                        } else {
                            stream
                                .launch_fill(
                                    address,
                                    i as f64,
                                    DataFormat::Uint8,
                                    completions.options(),
                                )
                                .expect("launch_fill");
                        }
                    }
                });
            }
        });
        stream.synchronize().expect("synchronize");
        assert_eq!(
            record.overlaps.load(Ordering::SeqCst),
            0,
            "operations of one stream never overlap"
        );
        assert_eq!(record.ran.load(Ordering::SeqCst), THREADS * EACH / 2);
        assert_eq!(completions.results(), vec![Ok(()); THREADS * EACH]);
        assert_eq!(completions.drops(), THREADS * EACH);
        assert_eq!(context.close(), Ok(()));
    });
}

#[test]
fn no_library_thread_outlives_its_runtime() {
    isolated!(mock_cdylib; &[
            ("SPYRE_MOCK_ENGINES", "3"),
            ("SPYRE_MOCK_LATE_COMPLETIONS_MS", "5"),
        ],
        || {
            let backend = backend();
            let baseline = live_threads();
            let first = HardwareRuntime::create(Arc::clone(backend.library()), 0).expect("create");
            // Three engines and the completion delivery thread.
            assert_eq!(live_threads(), baseline + 4);
            let second = HardwareRuntime::create(Arc::clone(backend.library()), 0).expect("create");
            assert_eq!(live_threads(), baseline + 8);
            let completions = Completions::new();
            for context in [&first, &second] {
                let stream = context
                    .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                    .expect("create_stream");
                for _ in 0..10 {
                    stream
                        .launch_host_callback(Box::new(|| {}), completions.options())
                        .expect("launch");
                }
            }
            drop(first);
            assert_eq!(settle_threads(baseline + 4), baseline + 4);
            assert_eq!(second.close(), Ok(()));
            assert_eq!(
                settle_threads(baseline),
                baseline,
                "every library thread was joined"
            );
            assert_eq!(completions.results(), vec![Ok(()); 20]);
        },
    );
}

#[test]
fn destroying_a_runtime_does_not_wait_for_a_call_blocked_on_another() {
    // A thread is blocked in `flex_stream_synchronize` on one runtime's
    // stream (held by a callback); dropping another, idle runtime
    // (`flex_runtime_destroy`) returns meanwhile. Before the fix the
    // blocked call's view of the handle table kept every runtime alive and
    // the destroy waited for it: here for ever, as the callback is released
    // only after the drop.
    isolated!(mock_cdylib; &[], || {
        let busy = context();
        let idle = context();
        let gate = spyre_tests::conformance::Gate::new();
        let held = Arc::clone(&gate);
        busy.default_stream()
            .launch_host_callback(Box::new(move || held.wait()), LaunchOptions::new())
            .expect("launch_host_callback");
        std::thread::scope(|scope| {
            let blocked = scope.spawn(|| busy.default_stream().synchronize());
            // Let the synchronize block first: a drop before it would
            // show nothing (the test would pass either way).
            std::thread::sleep(Duration::from_millis(50));
            let (dropped, done) = std::sync::mpsc::channel();
            scope.spawn(move || {
                drop(idle);
                dropped.send(()).unwrap();
            });
            let returned = done.recv_timeout(Duration::from_secs(10));
            gate.open();
            assert!(returned.is_ok(), "the idle runtime's destroy waited for the other runtime's call");
            blocked.join().unwrap().expect("synchronize");
        });
    });
}

/// Asserts that `call` failed with the `RUNTIME_FAILED` naming `fork()`
/// that a forked child gets from its parent's runtime.
fn assert_forked(result: flex_rt::Result<()>, call: &str) {
    let err = result.expect_err(call);
    assert_eq!(err.status(), Status::RUNTIME_FAILED, "{call}: {err}");
    assert!(err.to_string().contains("fork()"), "{call}: {err}");
}

/// The flex library in a child forked after a runtime was created: the
/// runtime's engine threads are not in the child, so every call on the
/// parent's runtime, streams and events fails with `RUNTIME_FAILED`
/// naming fork (before the fix a launch returned `FLEX_SUCCESS` and never
/// ran, and a synchronize blocked for ever), while a runtime created in
/// the child works.
#[test]
fn a_forked_child_gets_runtime_failed_from_the_parents_runtime_never_a_hang() {
    use spyre_tests::process::{ForkOutcome, fork_and_wait};

    isolated!(mock_cdylib; &[], || {
        let parent = context();
        let stream = parent
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .expect("create_stream");
        let event = parent.create_event(false).expect("create_event");
        let gate = spyre_tests::conformance::Gate::new();
        let held = Arc::clone(&gate);
        stream
            .launch_host_callback(Box::new(move || held.wait()), LaunchOptions::new())
            .expect("launch_host_callback");
        let outcome = fork_and_wait(Duration::from_secs(30), || {
            assert_forked(
                stream
                    .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                    .map(drop),
                "launch",
            );
            assert_forked(stream.query().map(drop), "query");
            assert_forked(stream.synchronize(), "synchronize");
            assert_forked(stream.record_event(&*event, None), "record_event");
            assert_forked(event.synchronize(), "event synchronize");
            assert_forked(parent.allocate(64).map(drop), "allocate");
            assert_forked(parent.create_event(false).map(drop), "create_event");
            // A runtime of the child's own works.
            let child = context();
            let own = child.create_event(true).expect("create_event in the child");
            assert_forked(
                own.elapsed_nanos(&*event).map(drop),
                "elapsed time to the parent's event",
            );
            let ran = Arc::new(AtomicBool::new(false));
            let set = Arc::clone(&ran);
            child
                .default_stream()
                .launch_host_callback(
                    Box::new(move || set.store(true, Ordering::SeqCst)),
                    LaunchOptions::new(),
                )
                .expect("launch in the child's runtime");
            child.default_stream().synchronize().expect("synchronize");
            assert!(ran.load(Ordering::SeqCst));
            // The parent's objects are the parent's: not dropped here.
            std::mem::forget(child);
        });
        gate.open();
        assert_eq!(outcome, ForkOutcome::Exited(0));
    });
}

/// Forks 20 children, a few milliseconds apart, while each of `loops`
/// runs again and again on a thread of its own (until it returns `false`
/// or the forks are done); `child` makes each child's body in the parent,
/// right before its fork. Asserts that every child exited with 0 within
/// 10 s: none failed, none hung.
fn fork_while_looping<B: FnOnce()>(
    loops: &[&(dyn Fn() -> bool + Sync)],
    pause: Duration,
    mut child: impl FnMut() -> B,
) {
    use spyre_tests::process::{ForkOutcome, fork_and_wait};

    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for &body in loops {
            let stop = &stop;
            scope.spawn(move || while !stop.load(Ordering::Relaxed) && body() {});
        }
        let outcomes: Vec<ForkOutcome> = (0..20)
            .map(|_| {
                std::thread::sleep(pause);
                fork_and_wait(Duration::from_secs(10), child())
            })
            .collect();
        stop.store(true, Ordering::Relaxed);
        assert!(
            outcomes.iter().all(|o| *o == ForkOutcome::Exited(0)),
            "{outcomes:?}"
        );
    });
}

/// A child forked while other threads of the parent are inside flex-rt,
/// launching on a stream (its submission lock) and creating streams (the
/// runtime's creation lock), never blocks on those locks, held in the
/// child by threads it does not have: the calls fail with
/// `RUNTIME_FAILED` naming fork before taking them, and dropping the
/// parent's events and a runtime of the parent's in the child leaves them
/// to the parent (flex.h: the child leaves them to its exit). Before
/// flex-rt checked fork itself, most of these children hung.
#[test]
fn a_forked_child_never_blocks_on_a_lock_the_parents_threads_held() {
    isolated!(mock_cdylib; &[], || {
        let parent = context();
        let stream = parent
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .expect("create_stream");
        let launch = || {
            stream
                .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                .expect("launch_host_callback");
            true
        };
        let created = AtomicUsize::new(0);
        let create = || {
            parent
                .create_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
                .expect("create_stream");
            created.fetch_add(1, Ordering::Relaxed) + 1 < 2_000
        };
        fork_while_looping(&[&launch, &create], Duration::from_millis(2), || {
            let event = parent.create_event(false).expect("create_event");
            let other = context();
            let stream = &stream;
            let parent = &parent;
            move || {
                assert_forked(
                    stream
                        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
                        .map(drop),
                    "launch",
                );
                assert_forked(
                    parent
                        .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                        .map(drop),
                    "create_stream",
                );
                assert_forked(stream.record_event(&*event, None), "record_event");
                drop(event);
                // Nothing of the parent's runtime is synchronized or
                // destroyed: one step, the runtime left to the parent.
                let closed = other.close().expect_err("close in the child");
                let [left] = closed.errors() else {
                    panic!("one failed step expected: {closed}");
                };
                assert_eq!(left.step(), TeardownStep::DestroyRuntime, "{closed}");
                assert_eq!(left.error().status(), Status::RUNTIME_FAILED, "{closed}");
                assert!(left.error().to_string().contains("fork()"), "{closed}");
            }
        });
    });
}

/// A child forked while a thread of the parent records an event (holding
/// the event's latest record across the library's call) gets
/// `RUNTIME_FAILED` naming fork from the event's query, synchronize and
/// notify, never waiting for that record. Before the fix the error of
/// query and synchronize took that lock to name a host callback's panic:
/// all 20 children hung.
#[test]
fn a_forked_child_never_waits_for_a_record_the_parents_thread_was_making() {
    isolated!(mock_cdylib; &[], || {
        let parent = context();
        let stream = parent
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .expect("create_stream");
        let event = parent.create_event(false).expect("create_event");
        let record = || {
            stream.record_event(&*event, None).expect("record_event");
            true
        };
        fork_while_looping(&[&record], Duration::from_millis(1), || {
            let event = &event;
            move || {
                assert_forked(event.query().map(drop), "event query");
                assert_forked(event.synchronize(), "event synchronize");
                let never = Completions::new();
                let completion = never.options().completion.expect("a completion");
                assert_forked(event.notify(completion).map(drop), "event notify");
            }
        });
    });
}

/// A child forked while another thread of the parent is inside a call
/// that reads the library's handle table makes, uses and destroys a
/// runtime of its own, never waiting for that thread: the library's table
/// is changed only once no call can still read the old one, and the
/// child's table forgets the calls of threads it does not have. Checked
/// to hang (13 of 20 children timed out) when the child does not forget them.
#[test]
fn a_forked_child_makes_its_own_runtime_while_a_parent_thread_was_mid_call() {
    isolated!(mock_cdylib; &[], || {
        let parent = context();
        let stream = parent
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .expect("create_stream");
        let query = || {
            stream.query().expect("query");
            true
        };
        fork_while_looping(&[&query], Duration::from_millis(1), || {
            || {
                let own = context();
                let stream = own
                    .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                    .expect("create_stream in the child");
                let ran = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&ran);
                stream
                    .launch_host_callback(
                        Box::new(move || flag.store(true, Ordering::SeqCst)),
                        LaunchOptions::new(),
                    )
                    .expect("launch in the child");
                stream.synchronize().expect("synchronize in the child");
                assert!(ran.load(Ordering::SeqCst));
                own.close().expect("close in the child");
            }
        });
    });
}

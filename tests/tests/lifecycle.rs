//! The process-wide runtime: start once, free, device selection, one device
//! per process, the current stream, environment variables. Each test runs in
//! a fresh process (the runtime starts once per process).

use futures_executor::block_on;
use spyre_stream::{
    Device, DeviceBuffer, DeviceSource, DeviceState, Error, LaunchOptions, SpyreEvent, StreamGuard,
    StreamId, allocate, capabilities, current_stream, default_stream, device_state, empty_cache,
    free, free_runtime, host_compute_stream, host_compute_stream_by_id, memory_stats, runtime_info,
    set_current_stream, set_device, start_runtime, stream_from_pool, synchronize_device,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use spyre_mock::MockSystem;
use spyre_tests::isolated;
use spyre_tests::process::{ForkOutcome, fork_and_wait, set_env_var};
use spyre_tests::reliability::SpyBackend;

const MOCK: (&str, &str) = ("SPYRE_BACKEND", "mock");

#[test]
fn start_runs_once_and_free_makes_a_restart_an_explicit_error() {
    isolated!(&[MOCK], || {
        assert_eq!(device_state(), DeviceState::NotInitialized);
        start_runtime().unwrap();
        start_runtime().unwrap();
        let info = runtime_info().unwrap();
        assert_eq!(
            (info.backend, info.device, info.device_source),
            ("mock", 0, DeviceSource::Default)
        );
        assert_eq!(info.host_compute_streams, 4);
        assert!(!info.track_hazards);
        assert_eq!(device_state(), DeviceState::Ok);

        let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
        assert_eq!(stream.id(), StreamId(1));
        let guard = StreamGuard::new(stream).unwrap();
        free_runtime();
        // The stream made current is still this thread's (torch-spyre's
        // getCurrentStream); a thread with none would get the default
        // stream, which needs the runtime, and so does this thread once
        // the guard has put the default stream back.
        assert_eq!(current_stream(Device::CURRENT).unwrap(), stream);
        let elsewhere = std::thread::spawn(|| current_stream(Device::CURRENT));
        assert!(matches!(
            elsewhere.join().unwrap(),
            Err(Error::RuntimeReset)
        ));
        drop(guard);
        assert!(matches!(
            current_stream(Device::CURRENT),
            Err(Error::RuntimeReset)
        ));
        assert_eq!(device_state(), DeviceState::NotInitialized);
        let err = start_runtime().unwrap_err();
        assert!(matches!(err, Error::RuntimeReset), "{err:?}");
        assert!(
            err.to_string().contains("runtime reset is not supported"),
            "{err}"
        );
        assert!(matches!(
            stream_from_pool(Device::CURRENT, 0),
            Err(Error::RuntimeReset)
        ));
        assert!(matches!(
            default_stream(Device::CURRENT),
            Err(Error::RuntimeReset)
        ));

        // Streams already resolved keep working: their handles stay valid.
        let (tx, rx) = std::sync::mpsc::channel();
        stream
            .launch_host_callback(move || tx.send(7).unwrap(), LaunchOptions::new())
            .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(rx.recv().unwrap(), 7);
        assert!(stream.query().unwrap());
        synchronize_device(Device::CURRENT).unwrap();
    },);
}

#[test]
fn synchronize_device_before_start_does_nothing() {
    isolated!(&[MOCK], || {
        synchronize_device(Device::CURRENT).unwrap();
        assert!(
            runtime_info().is_none(),
            "synchronize_device must not start the runtime"
        );
        free_runtime();
        start_runtime().expect("free_runtime before any start does nothing");
    },);
}

#[test]
fn raw_free_starts_nothing_and_still_frees_after_free_runtime() {
    isolated!(&[MOCK], || {
        let invalid = |err: Error| match err {
            Error::Flex(flex) if flex.status() == spyre_stream::Status::INVALID_ARGUMENT => flex,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        };
        // Before the start nothing was allocated: refused, and nothing starts.
        let never = spyre_stream::CompositeAddress::single(
            spyre_stream::LogicalAddress {
                region_id: 0,
                offset: 0,
            },
            4096,
        )
        .unwrap();
        let refused = invalid(free(Device::CURRENT, &never).unwrap_err());
        assert!(
            refused.to_string().contains("the runtime has not started"),
            "{refused}"
        );
        assert!(runtime_info().is_none(), "free must not start the runtime");

        // Memory allocated before free_runtime is given back after it: the
        // second free of the address finds no live allocation.
        let address = allocate(Device::CURRENT, 1 << 20).unwrap();
        free_runtime();
        free(Device::CURRENT, &address).unwrap();
        invalid(free(Device::CURRENT, &address).unwrap_err());
    });
}

#[test]
fn local_rank_selects_the_device_and_other_devices_are_refused() {
    isolated!(
        &[MOCK, ("SPYRE_MOCK_DEVICES", "4"), ("LOCAL_RANK", "2")],
        || {
            let stream = stream_from_pool(Device::CURRENT, -1).unwrap();
            assert_eq!((stream.device_index(), stream.id()), (2, StreamId(33)));
            let info = runtime_info().unwrap();
            assert_eq!(
                (info.device, info.device_source),
                (2, DeviceSource::LocalRank("LOCAL_RANK"))
            );

            let err = stream_from_pool(Device::new(0).unwrap(), 0).unwrap_err();
            assert_other_device(&err, 0, 2);
            assert_eq!(
                err.to_string(),
                "device 0 was requested, but this process uses device 2: one Spyre device per process is supported; use device 2, or start one process per device"
            );
            // The first device keeps working.
            assert_eq!(
                stream_from_pool(Device::new(2).unwrap(), -1).unwrap().id(),
                StreamId(34)
            );
            // A stream of another device cannot be made current.
            let foreign = spyre_stream::SpyreStream::from_parts(1, StreamId(0));
            let err = set_current_stream(foreign).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::WrongDevice {
                        stream_device: 1,
                        pool_device: 2
                    }
                ),
                "{err:?}"
            );
            assert!(
                err.to_string()
                    .starts_with("stream of device 1, but this process uses device 2"),
                "{err}"
            );
            let err = synchronize_device(Device::new(1).unwrap()).unwrap_err();
            assert_other_device(&err, 1, 2);
            assert!(matches!(
                foreign.query(),
                Err(Error::WrongDevice {
                    stream_device: 1,
                    pool_device: 2
                })
            ));
        },
    );
}

#[test]
fn a_malformed_local_rank_fails_start_and_a_retry_can_succeed() {
    isolated!(&[MOCK, ("LOCAL_RANK", "abc")], || {
        // The current device is read the way the start reads it: the
        // same error, not a silent 0.
        let err = spyre_stream::current_device().unwrap_err();
        assert!(
            matches!(err, Error::InvalidEnv { variable: "LOCAL_RANK", ref value, .. } if value == "abc"),
            "{err:?}"
        );
        let err = start_runtime().unwrap_err();
        assert!(
            matches!(err, Error::InvalidEnv { variable: "LOCAL_RANK", ref value, .. } if value == "abc"),
            "{err:?}"
        );
        // So does synchronize_device, which starts nothing.
        let err = synchronize_device(Device::CURRENT).unwrap_err();
        assert!(
            matches!(err, Error::InvalidEnv { variable: "LOCAL_RANK", ref value, .. } if value == "abc"),
            "{err:?}"
        );
        assert!(runtime_info().is_none());
        // Setting the thread's device bypasses LOCAL_RANK: the retry succeeds.
        set_device(0).unwrap();
        start_runtime().unwrap();
        assert_eq!(
            runtime_info().unwrap().device_source,
            DeviceSource::ThreadDevice
        );
    },);
}

#[test]
fn local_rank_above_127_is_refused() {
    isolated!(&[MOCK, ("LOCAL_RANK", "128")], || {
        let err = start_runtime().unwrap_err();
        assert!(
            err.to_string()
                .contains("128 exceeds the maximum supported device index (127)"),
            "{err}"
        );
    },);
}

#[test]
fn a_device_beyond_the_visible_count_is_refused_with_both_numbers() {
    isolated!(&[MOCK, ("LOCAL_RANK", "1")], || {
        // A call that starts nothing refuses the device as the start does.
        assert!(matches!(
            synchronize_device(Device::CURRENT),
            Err(Error::DeviceOutOfRange {
                device: 1,
                count: 1,
                chosen_by: DeviceSource::LocalRank("LOCAL_RANK"),
            })
        ));
        let err = start_runtime().unwrap_err();
        assert!(
            matches!(
                err,
                Error::DeviceOutOfRange {
                    device: 1,
                    count: 1,
                    chosen_by: DeviceSource::LocalRank("LOCAL_RANK"),
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "Device index out of bounds. logical_device_id=1, number of visible devices=1; the device came from LOCAL_RANK: local ranks must be below 1: start one rank per visible device; where each rank sees only its own devices (SPYRE_DEVICES set per rank), they are numbered from 0 in each rank: call set_device on the thread that starts the runtime, or, outside torchrun, set LOCAL_RANK=0 (read before the other launchers' variables)"
        );
        assert!(matches!(
            set_device(1),
            Err(Error::DeviceOutOfRange {
                device: 1,
                count: 1,
                chosen_by: DeviceSource::ThreadDevice,
            })
        ));
        assert!(matches!(
            set_device(128),
            Err(Error::InvalidDeviceIndex { index: 128, .. })
        ));
        assert!(matches!(
            set_device(-2),
            Err(Error::InvalidDeviceIndex { index: -2, .. })
        ));
        set_device(0).unwrap();
        start_runtime().unwrap();
    },);
}

#[test]
fn host_compute_streams_follow_the_variable() {
    isolated!(
        &[MOCK, ("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", "2")],
        || {
            let ids: Vec<i64> = (0..3)
                .map(|_| host_compute_stream(Device::CURRENT).unwrap().id().get())
                .collect();
            assert_eq!(ids, vec![65, 66, 65]);
            assert_eq!(
                host_compute_stream_by_id(66, Device::CURRENT).unwrap().id(),
                StreamId(66)
            );
            let err = host_compute_stream_by_id(67, Device::CURRENT).unwrap_err();
            assert_eq!(
                err.to_string(),
                "stream id 67 is not a host compute stream id (valid range [65, 67))"
            );
            assert!(host_compute_stream_by_id(64, Device::CURRENT).is_err());
            assert!(host_compute_stream_by_id(i64::MAX, Device::CURRENT).is_err());
            assert!(host_compute_stream_by_id(-1, Device::CURRENT).is_err());
            let pool = spyre_stream::global_pool().unwrap();
            let ids: Vec<i64> = pool.mapped_ids().iter().map(|id| id.get()).collect();
            assert_eq!(
                ids,
                vec![0, 65, 66],
                "host-compute streams are created at initialization"
            );
        },
    );
}

#[test]
fn host_compute_count_above_8_is_capped() {
    isolated!(
        &[MOCK, ("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", "9")],
        || {
            start_runtime().unwrap();
            assert_eq!(runtime_info().unwrap().host_compute_streams, 8);
            assert_eq!(
                host_compute_stream_by_id(72, Device::CURRENT).unwrap().id(),
                StreamId(72)
            );
        },
    );
}

#[test]
fn bad_host_compute_counts_fail_start_naming_the_value() {
    // In the child the loop body runs directly, with the child's one value.
    for raw in ["0", "-1", " ", "abc"] {
        isolated!(
            &[MOCK, ("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", raw)],
            || {
                let raw = std::env::var("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS").unwrap();
                let err = start_runtime().unwrap_err();
                assert!(
                    err.to_string().starts_with(&format!(
                        "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS={raw:?} is invalid"
                    )),
                    "{err}"
                );
                assert!(matches!(
                    stream_from_pool(Device::CURRENT, 0),
                    Err(Error::InvalidEnv { .. })
                ));
            },
        );
    }
}

#[test]
fn an_empty_variable_means_unset_for_every_variable() {
    isolated!(
        &[
            ("SPYRE_BACKEND", ""),
            ("FLEX_RUNTIME_LIB", ""),
            ("LOCAL_RANK", ""),
            ("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", ""),
            ("SPYRE_HAZARD_TRACKER", ""),
            ("SPYRE_MOCK_DEVICES", ""),
            ("SPYRE_MOCK_OP_LATENCY_US", ""),
        ],
        || {
            // SPYRE_BACKEND= is the build's default (hardware here), and
            // FLEX_RUNTIME_LIB= searches the default names rather than
            // opening "", so the start fails exactly as with both unset.
            let with_empty = start_runtime().unwrap_err().to_string();
            set_env_var("SPYRE_BACKEND", None);
            set_env_var("FLEX_RUNTIME_LIB", None);
            assert_eq!(start_runtime().unwrap_err().to_string(), with_empty);
            assert!(with_empty.contains("libflex.so.1"), "{with_empty}");

            set_env_var("SPYRE_BACKEND", Some("mock"));
            start_runtime().unwrap();
            let info = runtime_info().unwrap();
            assert_eq!(
                (
                    info.device,
                    info.device_source,
                    info.host_compute_streams,
                    info.track_hazards
                ),
                (0, DeviceSource::Default, 4, false)
            );
        },
    );
}

#[test]
fn the_hazard_tracker_takes_boolean_spellings_and_refuses_others() {
    for raw in ["true", "OFF", "2"] {
        isolated!(&[MOCK, ("SPYRE_HAZARD_TRACKER", raw)], || {
            let raw = std::env::var("SPYRE_HAZARD_TRACKER").unwrap();
            match (raw.as_str(), start_runtime()) {
                ("true", Ok(())) => assert!(runtime_info().unwrap().track_hazards),
                ("OFF", Ok(())) => assert!(!runtime_info().unwrap().track_hazards),
                ("2", Err(err)) => assert_eq!(
                    err.to_string(),
                    "SPYRE_HAZARD_TRACKER=\"2\" is invalid: expected a boolean: 1, true, on or yes for on; 0, false, off or no for off (case-insensitive)"
                ),
                (raw, other) => panic!("SPYRE_HAZARD_TRACKER={raw:?}: {other:?}"),
            }
        },);
    }
}

#[test]
fn hazard_tracker_is_read_at_start() {
    isolated!(&[MOCK, ("SPYRE_HAZARD_TRACKER", "1")], || {
        start_runtime().unwrap();
        assert!(runtime_info().unwrap().track_hazards);
        assert!(spyre_stream::hazard_tracker_enabled());
        spyre_stream::set_hazard_tracker_enabled(false).unwrap();
        assert!(!spyre_stream::hazard_tracker_enabled());
    },);
}

#[test]
fn current_stream_is_per_thread_and_guards_nest() {
    isolated!(&[MOCK], || {
        let default = default_stream(Device::CURRENT).unwrap();
        assert_eq!(current_stream(Device::CURRENT).unwrap(), default);
        let a = stream_from_pool(Device::CURRENT, 0).unwrap();
        let b = stream_from_pool(Device::CURRENT, -1).unwrap();
        assert_eq!(set_current_stream(a).unwrap(), default);
        assert_eq!(current_stream(Device::CURRENT).unwrap(), a);
        // A new thread starts at the default stream.
        let other = std::thread::spawn(|| current_stream(Device::CURRENT).unwrap())
            .join()
            .unwrap();
        assert_eq!(other, default);
        {
            let outer = spyre_stream::StreamGuard::new(b).unwrap();
            assert_eq!(outer.previous(), a);
            assert_eq!(current_stream(Device::CURRENT).unwrap(), b);
            {
                let _inner = spyre_stream::StreamGuard::new(default).unwrap();
                assert_eq!(current_stream(Device::CURRENT).unwrap(), default);
            }
            assert_eq!(current_stream(Device::CURRENT).unwrap(), b);
        }
        assert_eq!(current_stream(Device::CURRENT).unwrap(), a);
        assert_eq!(set_current_stream(default).unwrap(), a);
    },);
}

/// A guard kept in a thread-local (a worker's stream for its lifetime), and
/// calls from a thread-local's destructor, while the thread's storage is
/// being destroyed: the guard restores nothing and `current_stream` gives
/// the default stream, with no panic (a panic in a thread-local's
/// destructor aborts the process); `set_current_stream` says the thread is
/// exiting. Before the fix each of the three aborted the process.
#[test]
fn the_current_stream_from_a_thread_locals_destructor_never_panics() {
    use std::cell::RefCell;
    use std::sync::mpsc;

    struct AtExit {
        guard: Option<spyre_stream::StreamGuard>,
        report: Option<mpsc::Sender<String>>,
    }
    impl Drop for AtExit {
        fn drop(&mut self) {
            drop(self.guard.take());
            let current = current_stream(Device::CURRENT);
            let set = current.as_ref().map(|stream| set_current_stream(*stream));
            let report = format!("{current:?} / {set:?}");
            self.report.take().unwrap().send(report).unwrap();
        }
    }
    thread_local! {
        static AT_EXIT: RefCell<AtExit> = const {
            RefCell::new(AtExit { guard: None, report: None })
        };
    }

    isolated!(&[MOCK], || {
        let default = default_stream(Device::CURRENT).unwrap();
        let worker = stream_from_pool(Device::CURRENT, 0).unwrap();
        let (report, reports) = mpsc::channel();
        std::thread::spawn(move || {
            // Registered before the current stream's storage is first
            // touched on this thread, so destroyed after it.
            AT_EXIT.with(|at_exit| at_exit.borrow_mut().report = Some(report));
            let guard = spyre_stream::StreamGuard::new(worker).unwrap();
            assert_eq!(current_stream(Device::CURRENT).unwrap(), worker);
            AT_EXIT.with(|at_exit| at_exit.borrow_mut().guard = Some(guard));
        })
        .join()
        .expect("the worker thread exits cleanly");
        let seen = reports.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(
            seen,
            format!("Ok({default:?}) / Ok(Err(ThreadExiting))"),
            "the default stream, and set_current_stream refused"
        );
    });
}

#[test]
fn the_hardware_backend_without_a_library_is_an_error_not_a_fallback() {
    isolated!(
        &[
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", "/nonexistent/libflex.so.1"),
        ],
        || {
            let err = start_runtime().unwrap_err();
            assert!(matches!(err, Error::Load(_)), "{err:?}");
            assert!(
                err.to_string().contains("/nonexistent/libflex.so.1"),
                "{err}"
            );
            assert!(runtime_info().is_none());
        },
    );
}

#[test]
fn an_unknown_backend_name_is_refused() {
    isolated!(&[("SPYRE_BACKEND", "gpu")], || {
        let err = start_runtime().unwrap_err();
        assert_eq!(
            err.to_string(),
            "SPYRE_BACKEND=\"gpu\" is invalid: expected `mock` or `hardware`"
        );
    },);
}

#[test]
fn with_both_backends_compiled_the_default_is_hardware() {
    isolated!(&[("FLEX_RUNTIME_LIB", "/nonexistent/libflex.so.1")], || {
        assert_eq!(
            spyre_stream::selected_backend().unwrap(),
            spyre_stream::BackendKind::Hardware
        );
        assert!(matches!(start_runtime(), Err(Error::Load(_))));
    },);
}

/// In a forked child of `parent`: a check that a call's result is
/// `ForkedProcess` naming the parent's and this child's pid (`what` names
/// the call in the panic).
fn forked_from(parent: u32) -> impl Fn(spyre_stream::Result<()>, &str) {
    let child = std::process::id();
    move |result, what| match result {
        Err(Error::ForkedProcess {
            started_in,
            current,
        }) => {
            assert_eq!((started_in, current), (parent, child), "{what}");
        }
        other => panic!("{what} in the forked child: {other:?}"),
    }
}

/// A software device whose runtime creation says it began, then waits
/// until released: a start held inside its lifecycle lock.
#[derive(Debug)]
struct GatedBackend {
    system: MockSystem,
    inside: Arc<AtomicBool>,
    release: Arc<AtomicBool>,
}

impl flex_rt::Backend for GatedBackend {
    fn name(&self) -> &'static str {
        "mock"
    }

    fn device_count(&self) -> flex_rt::Result<u32> {
        self.system.device_count()
    }

    fn create_runtime(&self, logical_device: u32) -> flex_rt::Result<Box<dyn flex_rt::Runtime>> {
        self.inside.store(true, Ordering::SeqCst);
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.system.create_runtime(logical_device)
    }
}

#[test]
fn a_child_forked_during_the_start_gets_an_error_from_every_lifecycle_call_never_a_hang() {
    // A thread of the parent is inside the start (creating the runtime)
    // at the fork: it is not in the child, and the lifecycle lock it holds
    // would be held there for good. Before the fix the child's first call
    // hung on that lock.
    isolated!(&[MOCK], || {
        let (inside, release) = (Arc::default(), Arc::new(AtomicBool::new(false)));
        spyre_stream::set_backend(Box::new(GatedBackend {
            system: MockSystem::builder().build().unwrap(),
            inside: Arc::clone(&inside),
            release: Arc::clone(&release),
        }))
        .unwrap();
        let starting = std::thread::spawn(start_runtime);
        while !inside.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }

        let outcome = fork_and_wait(Duration::from_secs(20), || {
            let child = std::process::id();
            let calls = [
                (start_runtime(), "start_runtime"),
                (
                    stream_from_pool(Device::CURRENT, 0).map(drop),
                    "stream_from_pool",
                ),
                (spyre_stream::device_count().map(drop), "device_count"),
                (set_device(0), "set_device"),
                (
                    spyre_stream::set_backend(Box::new(MockSystem::builder().build().unwrap())),
                    "set_backend",
                ),
            ];
            for (result, call) in calls {
                match result {
                    Err(Error::ForkedDuringStart { current }) => {
                        assert_eq!(current, child, "{call}");
                    }
                    other => panic!("{call}: expected ForkedDuringStart, got {other:?}"),
                }
            }
            free_runtime();
            assert_eq!(device_state(), DeviceState::NotInitialized);
        });
        release.store(true, Ordering::SeqCst);
        starting.join().unwrap().unwrap();
        assert_eq!(outcome, ForkOutcome::Exited(0));
        // The parent's start finished, and its runtime works.
        let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
        stream
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        stream.synchronize().unwrap();
    });
}

/// A software device whose `device_count` and `create_runtime` call the
/// stream layer back, as a backend must not, and keep what it answered.
#[derive(Debug, Default)]
struct ReenteringBackend {
    system: MockSystem,
    answers: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ReenteringBackend {
    fn ask(&self) {
        let answers = [
            spyre_stream::device_count().map(drop),
            start_runtime(),
            set_device(0),
            spyre_stream::set_backend(Box::new(MockSystem::default())),
        ];
        let mut kept = self.answers.lock().unwrap();
        kept.extend(answers.into_iter().map(|a| format!("{a:?}")));
    }
}

impl flex_rt::Backend for ReenteringBackend {
    fn name(&self) -> &'static str {
        "mock"
    }

    fn device_count(&self) -> flex_rt::Result<u32> {
        self.ask();
        self.system.device_count()
    }

    fn create_runtime(&self, logical_device: u32) -> flex_rt::Result<Box<dyn flex_rt::Runtime>> {
        self.ask();
        self.system.create_runtime(logical_device)
    }
}

#[test]
fn a_backend_that_calls_the_stream_layer_during_the_start_is_refused_not_hung() {
    // The start calls the backend with the lifecycle lock held; before the
    // fix a call back into the layer waited for that lock for ever. Run on
    // a thread of its own, so that a hang fails the test at the bound.
    isolated!(&[MOCK], || {
        let backend = ReenteringBackend::default();
        let answers = Arc::clone(&backend.answers);
        spyre_stream::set_backend(Box::new(backend)).unwrap();
        let (done, started) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(start_runtime()).unwrap());
        let started = started
            .recv_timeout(Duration::from_secs(20))
            .expect("the start hung on a call back from its backend");
        started.unwrap();
        // Called twice (device_count, then create_runtime), each call of the
        // four refused.
        let answers = answers.lock().unwrap();
        assert_eq!(answers.len(), 8, "{answers:?}");
        for answer in answers.iter() {
            assert_eq!(answer, "Err(LifecycleReentered)");
        }
        // The start itself went through, on device 0, with the backend.
        assert_eq!(runtime_info().unwrap().device, 0);
        stream_from_pool(Device::CURRENT, 0)
            .unwrap()
            .synchronize()
            .unwrap();
    });
}

#[test]
fn a_child_forked_before_the_start_must_install_its_own_backend() {
    // The parent installs a software device of three devices and forks
    // before starting: the child must not start silently on the backend
    // the environment names (one device here) in its place.
    isolated!(&[MOCK], || {
        let three = MockSystem::builder().devices(3).build().unwrap();
        spyre_stream::set_backend(Box::new(three)).unwrap();
        let parent = std::process::id();

        let outcome = fork_and_wait(Duration::from_secs(30), move || {
            let child = std::process::id();
            for result in [spyre_stream::device_count().map(drop), start_runtime()] {
                match result {
                    Err(Error::BackendFromParent {
                        installed_in,
                        current,
                    }) => assert_eq!((installed_in, current), (parent, child)),
                    other => panic!("expected BackendFromParent, got {other:?}"),
                }
            }
            let two = MockSystem::builder().devices(2).build().unwrap();
            spyre_stream::set_backend(Box::new(two)).unwrap();
            assert_eq!(spyre_stream::device_count().unwrap(), 2);
            start_runtime().unwrap();
        });
        assert_eq!(outcome, ForkOutcome::Exited(0));
        assert_eq!(spyre_stream::device_count().unwrap(), 3, "the parent's");
    });
}

#[test]
fn a_forked_child_neither_reads_nor_touches_the_parents_trace() {
    // A parent thread may hold the trace's lock at the fork (a launch or a
    // completion appending): the child, which can launch nothing, must not
    // take it. Shown here by what the child sees: not the parent's entry.
    isolated!(&[MOCK], || {
        let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
        spyre_stream::start_trace();
        stream
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        stream.synchronize().unwrap();

        let outcome = fork_and_wait(Duration::from_secs(30), || {
            assert_eq!(spyre_stream::stop_trace().entries.len(), 0);
            spyre_stream::start_trace();
            assert_eq!(spyre_stream::stop_trace().entries.len(), 0);
        });
        assert_eq!(outcome, ForkOutcome::Exited(0));
        let parents = spyre_stream::stop_trace();
        assert_eq!(parents.entries.len(), 1, "the parent's trace is whole");
    });
}

#[test]
fn a_forked_child_gets_a_clear_error_from_every_entry_point_never_a_hang() {
    isolated!(&[MOCK], || {
        spyre_stream::enable_counters();
        let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
        stream
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        stream.synchronize().unwrap();
        assert_eq!(spyre_stream::counters().device.launched, 1);
        let parent = std::process::id();

        let outcome = fork_and_wait(Duration::from_secs(30), move || {
            let forked = forked_from(parent);
            // The stream the parent used: before the fix this hung
            // (the software device's engine threads are not in the child).
            forked(stream.synchronize(), "SpyreStream::synchronize");
            forked(stream.query().map(drop), "SpyreStream::query");
            forked(
                stream.launch_host_callback(|| {}, LaunchOptions::new()),
                "SpyreStream::launch_host_callback",
            );
            forked(stream.error().map(drop), "SpyreStream::error");
            forked(
                stream.wait_stream(stream),
                "SpyreStream::wait_stream (itself)",
            );
            forked(start_runtime(), "start_runtime");
            forked(
                stream_from_pool(Device::CURRENT, 0).map(drop),
                "stream_from_pool",
            );
            forked(default_stream(Device::CURRENT).map(drop), "default_stream");
            forked(
                spyre_stream::default_stream_handle(Device::CURRENT).map(drop),
                "default_stream_handle",
            );
            forked(
                host_compute_stream(Device::CURRENT).map(drop),
                "host_compute_stream",
            );
            forked(
                host_compute_stream_by_id(65, Device::CURRENT).map(drop),
                "host_compute_stream_by_id",
            );
            forked(current_stream(Device::CURRENT).map(drop), "current_stream");
            forked(set_current_stream(stream).map(drop), "set_current_stream");
            forked(synchronize_device(Device::CURRENT), "synchronize_device");
            forked(spyre_stream::device_count().map(drop), "device_count");
            forked(set_device(0), "set_device");
            forked(spyre_stream::global_pool().map(drop), "global_pool");
            forked(
                spyre_stream::set_hazard_tracker_enabled(true),
                "set_hazard_tracker_enabled",
            );
            assert_eq!(device_state(), DeviceState::NotInitialized);
            assert!(runtime_info().is_none());
            // The counts the child inherited are the parent's.
            assert_eq!(spyre_stream::counters(), Default::default());
            let message = synchronize_device(Device::CURRENT).unwrap_err().to_string();
            let child = std::process::id();
            for needle in [
                format!("started in process {parent} and this is process {child}, a fork() of it"),
                "Start the runtime only after forking".to_owned(),
                "spawn".to_owned(),
            ] {
                assert!(message.contains(&needle), "{needle:?} not in {message}");
            }
        });
        assert_eq!(outcome, ForkOutcome::Exited(0));

        // The parent is untouched.
        stream
            .launch_host_callback(|| {}, LaunchOptions::new())
            .unwrap();
        stream.synchronize().unwrap();
        synchronize_device(Device::CURRENT).unwrap();
    },);
}

#[test]
fn a_forked_child_gets_a_clear_error_from_events_and_memory_never_a_hang() {
    // The parent's event is recorded behind work that the parent holds
    // until the child has ended, so any call of the child that reached the
    // parent's device would wait for ever (before the fix the event's
    // `synchronize` and futures did, and `query` answered with the
    // parent's state).
    isolated!(&[MOCK], || {
        let held = stream_from_pool(Device::CURRENT, 0).unwrap();
        let other = stream_from_pool(Device::CURRENT, 0).unwrap();
        let (release, released) = std::sync::mpsc::channel::<()>();
        held.launch_host_callback(
            move || {
                let _ = released.recv();
            },
            LaunchOptions::new(),
        )
        .unwrap();
        let [start, end] = [(); 2].map(|()| SpyreEvent::with_timing().unwrap());
        start.record(held).unwrap();
        end.record(held).unwrap();
        let before_fork = end.synchronize_async();
        let buffer = DeviceBuffer::<f32>::zeros(other, 4).unwrap();
        let address = allocate(Device::CURRENT, 4096).unwrap();
        let parent = std::process::id();

        let outcome = fork_and_wait(Duration::from_secs(30), || {
            let forked = forked_from(parent);
            forked(end.query().map(drop), "SpyreEvent::query");
            forked(end.synchronize(), "SpyreEvent::synchronize");
            forked(
                start.elapsed_time(&end).map(drop),
                "SpyreEvent::elapsed_time",
            );
            forked(
                block_on(end.synchronize_async()),
                "SpyreEvent::synchronize_async",
            );
            forked(block_on(before_fork), "a future made before the fork");
            forked(end.record(other), "SpyreEvent::record");
            forked(end.wait(other), "SpyreEvent::wait");
            forked(SpyreEvent::new().map(drop), "SpyreEvent::new");
            forked(other.wait_stream(held), "SpyreStream::wait_stream");
            forked(
                held.synchronize_async().map(drop),
                "SpyreStream::synchronize_async",
            );
            forked(capabilities(Device::CURRENT).map(drop), "capabilities");
            forked(memory_stats(Device::CURRENT).map(drop), "memory_stats");
            forked(empty_cache(Device::CURRENT).map(drop), "empty_cache");
            forked(allocate(Device::CURRENT, 4096).map(drop), "allocate");
            forked(free(Device::CURRENT, &address), "free");
            forked(
                DeviceBuffer::<f32>::zeros(other, 4).map(drop),
                "DeviceBuffer::zeros",
            );
            forked(buffer.to_vec(other).map(drop), "DeviceBuffer::to_vec");
        });
        assert_eq!(outcome, ForkOutcome::Exited(0));

        // The parent is untouched: its event completes once released.
        release.send(()).unwrap();
        end.synchronize().unwrap();
        assert!(start.elapsed_time(&end).is_ok());
        free(Device::CURRENT, &address).unwrap();
        assert_eq!(buffer.to_vec(other).unwrap(), [0.0; 4]);
    },);
}

#[test]
fn a_forked_child_drops_the_parents_events_without_destroying_them() {
    // Destroying them would call into the parent's runtime (through a flex
    // library, `flex_event_destroy`, which may wait for a lock a parent's
    // thread held at the fork). Both kinds: an event the caller owns and
    // a marker lent to a stream's future.
    isolated!(&[], || {
        let backend = SpyBackend::new(MockSystem::default());
        spyre_stream::set_backend(Box::new(backend.clone())).unwrap();
        let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
        let owned = SpyreEvent::new().unwrap();
        owned.record(stream).unwrap();
        let lent = stream.synchronize_async().unwrap();
        let runtime = backend.runtime().unwrap();
        let live = runtime.live_events();
        assert_eq!(live, 2);

        let outcome = fork_and_wait(Duration::from_secs(30), || {
            drop(owned);
            drop(lent);
            assert_eq!(runtime.live_events(), live, "an event was destroyed");
        });
        assert_eq!(outcome, ForkOutcome::Exited(0));
        // The parent is untouched: its stream still completes work.
        block_on(stream.synchronize_async().unwrap()).unwrap();
    },);
}

#[test]
fn a_child_forked_before_the_start_starts_its_own_runtime() {
    isolated!(&[MOCK], || {
        let outcome = fork_and_wait(Duration::from_secs(30), || {
            let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
            stream
                .launch_host_callback(|| {}, LaunchOptions::new())
                .unwrap();
            stream.synchronize().unwrap();
        });
        assert_eq!(outcome, ForkOutcome::Exited(0));
        assert!(runtime_info().is_none(), "the child's start is its own");
    },);
}

#[test]
fn the_first_call_that_names_a_device_starts_the_runtime_there() {
    isolated!(&[MOCK, ("SPYRE_MOCK_DEVICES", "2")], || {
        let stream = stream_from_pool(Device::new(1).unwrap(), 0).unwrap();
        assert_eq!((stream.device_index(), stream.id()), (1, StreamId(1)));
        let info = runtime_info().unwrap();
        assert_eq!(
            (info.device, info.device_source),
            (1, DeviceSource::Requested)
        );
        // Every thread without a device of its own follows the runtime.
        assert_eq!(spyre_stream::current_device().unwrap(), 1);
        let other = std::thread::spawn(|| {
            (
                spyre_stream::current_device().unwrap(),
                current_stream(Device::CURRENT).unwrap().device_index(),
            )
        })
        .join()
        .unwrap();
        assert_eq!(other, (1, 1));
        synchronize_device(Device::CURRENT).unwrap();
    },);
}

#[test]
fn a_corrected_local_rank_is_what_the_retry_and_every_thread_use() {
    isolated!(
        &[MOCK, ("SPYRE_MOCK_DEVICES", "2"), ("LOCAL_RANK", "5")],
        || {
            assert_eq!(spyre_stream::current_device().unwrap(), 5);
            let err = stream_from_pool(Device::CURRENT, 0).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::DeviceOutOfRange {
                        device: 5,
                        count: 2,
                        chosen_by: DeviceSource::LocalRank("LOCAL_RANK"),
                    }
                ),
                "{err:?}"
            );
            assert!(runtime_info().is_none());

            set_env_var("LOCAL_RANK", Some("1"));
            assert_eq!(spyre_stream::current_device().unwrap(), 1);
            let stream = stream_from_pool(Device::CURRENT, 0).unwrap();
            assert_eq!(stream.device_index(), 1);
            let info = runtime_info().unwrap();
            assert_eq!(
                (info.device, info.device_source),
                (1, DeviceSource::LocalRank("LOCAL_RANK"))
            );
            current_stream(Device::CURRENT)
                .unwrap()
                .synchronize()
                .unwrap();

            // Once started, the runtime's device is the one source of truth.
            set_env_var("LOCAL_RANK", Some("0"));
            assert_eq!(spyre_stream::current_device().unwrap(), 1);
            synchronize_device(Device::CURRENT).unwrap();
        },
    );
}

#[test]
fn a_failed_start_reads_the_corrected_environment_on_retry() {
    isolated!(
        &[MOCK, ("SPYRE_MOCK_DEVICES", "1"), ("LOCAL_RANK", "1")],
        || {
            let err = start_runtime().unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::DeviceOutOfRange {
                        device: 1,
                        count: 1,
                        chosen_by: DeviceSource::LocalRank("LOCAL_RANK"),
                    }
                ),
                "{err:?}"
            );
            // The software device made from the environment is not kept:
            // the retry sees two devices.
            set_env_var("SPYRE_MOCK_DEVICES", Some("2"));
            start_runtime().unwrap();
            assert_eq!(runtime_info().unwrap().device, 1);
        },
    );
}

/// Asserts that `err` is `OtherDevice` for device `requested` of a
/// runtime on device `bound`.
#[track_caller]
fn assert_other_device(err: &Error, requested: u8, bound: u8) {
    assert!(
        matches!(err, Error::OtherDevice { requested: r, bound: b } if (*r, *b) == (requested, bound)),
        "{err:?}"
    );
}

#[test]
fn once_started_the_thread_device_can_only_be_the_runtime_device() {
    isolated!(&[MOCK, ("SPYRE_MOCK_DEVICES", "2")], || {
        start_runtime().unwrap();
        assert_other_device(&set_device(1).unwrap_err(), 1, 0);
        assert_eq!(
            spyre_stream::current_device().unwrap(),
            0,
            "nothing changed"
        );
        set_device(0).unwrap();
        assert_eq!(spyre_stream::current_device().unwrap(), 0);
    });
}

/// The one way left for a thread's device to differ from the runtime's (a
/// `set_device` before a start that named another device): every call on
/// its current device fails with `OtherDevice`, the hazard-tracker switch
/// too, and changes nothing.
#[test]
fn a_thread_set_to_another_device_before_the_start_changes_nothing_of_it() {
    isolated!(&[MOCK, ("SPYRE_MOCK_DEVICES", "2")], || {
        set_device(1).unwrap();
        let stream = stream_from_pool(Device::new(0).unwrap(), -1).unwrap();
        assert_eq!(stream.device_index(), 0);
        assert_other_device(
            &spyre_stream::set_hazard_tracker_enabled(true).unwrap_err(),
            1,
            0,
        );
        assert!(!spyre_stream::hazard_tracker_enabled(), "changed anyway");
        assert_other_device(&stream_from_pool(Device::CURRENT, -1).unwrap_err(), 1, 0);
        assert_other_device(&synchronize_device(Device::CURRENT).unwrap_err(), 1, 0);
        // The runtime has started, but not on this thread's device.
        assert_other_device(&spyre_stream::start_runtime().unwrap_err(), 1, 0);
        set_device(0).unwrap();
        spyre_stream::start_runtime().unwrap();
    });
}

#[test]
fn requests_refused_for_their_arguments_bind_nothing() {
    isolated!(&[MOCK, ("SPYRE_MOCK_DEVICES", "2")], || {
        let device = Device::new(1).unwrap();
        assert!(matches!(
            host_compute_stream_by_id(1000, device),
            Err(Error::NotHostComputeStream {
                id: 1000,
                start: 65,
                end: 69
            })
        ));
        assert!(matches!(
            spyre_stream::allocate(device, 0),
            Err(Error::Flex(e)) if e.status() == spyre_stream::Status::INVALID_ARGUMENT
        ));
        assert!(matches!(
            set_current_stream(spyre_stream::SpyreStream::from_parts(1, StreamId(999))),
            Err(Error::NoHandle {
                id: StreamId(999),
                device: 1
            })
        ));
        // A host-compute id beyond the 4 configured (65..69), though below
        // the largest count (8): no pool will map it either.
        for id in [69, 72] {
            assert!(matches!(
                set_current_stream(spyre_stream::SpyreStream::from_parts(1, StreamId(id))),
                Err(Error::NotHostComputeStream { id: i, start: 65, end: 69 }) if i == id
            ));
            assert!(matches!(
                spyre_stream::StreamGuard::new(spyre_stream::SpyreStream::from_parts(1, StreamId(id))),
                Err(Error::NotHostComputeStream { id: i, start: 65, end: 69 }) if i == id
            ));
        }
        assert!(runtime_info().is_none(), "nothing started");
        // The first request that can be served binds its device.
        assert_eq!(
            host_compute_stream_by_id(65, device)
                .unwrap()
                .device_index(),
            1
        );
        // Once started, the pool's own count decides: 68 is its last id.
        let last = spyre_stream::SpyreStream::from_parts(1, StreamId(68));
        set_current_stream(last).unwrap();
        assert_eq!(current_stream(device).unwrap(), last);
        let err =
            set_current_stream(spyre_stream::SpyreStream::from_parts(1, StreamId(69))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stream id 69 is not a host compute stream id (valid range [65, 69))"
        );
        assert_eq!(current_stream(device).unwrap(), last, "unchanged");
    });
}

#[test]
fn every_launchers_local_rank_chooses_the_device() {
    let envs: Vec<Vec<(&str, &str)>> = [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ]
    .into_iter()
    .map(|variable| vec![MOCK, ("SPYRE_MOCK_DEVICES", "4"), (variable, "2")])
    .collect();
    isolated!(each; &envs, || {
        // The one launcher variable this child was given.
        let set = spyre_stream::env::LOCAL_RANK_VARIABLES
            .into_iter()
            .find(|v| std::env::var(v).is_ok())
            .expect("a launcher variable is set");
        start_runtime().unwrap();
        let info = runtime_info().unwrap();
        assert_eq!((info.device, info.device_source), (2, DeviceSource::LocalRank(set)));
        assert_eq!(info.device_source.name(), set);
    });
}

#[test]
fn srun_starting_torchrun_binds_torchruns_rank() {
    isolated!(
        &[
            MOCK,
            ("SPYRE_MOCK_DEVICES", "4"),
            ("SLURM_LOCALID", "0"),
            ("LOCAL_RANK", "3")
        ],
        || {
            start_runtime().unwrap();
            let info = runtime_info().unwrap();
            assert_eq!(
                (info.device, info.device_source),
                (3, DeviceSource::LocalRank("LOCAL_RANK"))
            );
        }
    );
}

#[test]
fn a_rank_beyond_the_devices_is_refused_naming_its_variable() {
    isolated!(
        &[
            MOCK,
            ("SPYRE_MOCK_DEVICES", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "4")
        ],
        || {
            let err = start_runtime().unwrap_err();
            assert_eq!(
                err.to_string(),
                "Device index out of bounds. logical_device_id=4, number of visible devices=4; the device came from Open MPI's local rank (OMPI_COMM_WORLD_LOCAL_RANK): local ranks must be below 4: start one rank per visible device; where each rank sees only its own devices (SPYRE_DEVICES set per rank), they are numbered from 0 in each rank: call set_device on the thread that starts the runtime, or, outside torchrun, set LOCAL_RANK=0 (read before the other launchers' variables)"
            );
        }
    );
}

#[test]
fn spyre_devices_restricts_and_reorders_the_software_devices() {
    isolated!(
        &[
            MOCK,
            ("SPYRE_MOCK_DEVICES", "4"),
            ("SPYRE_DEVICES", "3,2"),
            ("LOCAL_RANK", "1")
        ],
        || {
            assert_eq!(spyre_stream::device_count().unwrap(), 2);
            start_runtime().unwrap();
            let info = runtime_info().unwrap();
            assert_eq!(info.device, 1, "logical device 1 (device 2)");
            assert!(
                info.backend_details
                    .contains(&("visible_devices", "3,2".to_owned())),
                "{:?}",
                info.backend_details
            );
            assert!(matches!(
                set_device(2),
                Err(Error::DeviceOutOfRange {
                    device: 2,
                    count: 2,
                    ..
                })
            ));
        }
    );
}

#[test]
fn a_bad_spyre_devices_list_stops_the_start_naming_it() {
    isolated!(
        &[MOCK, ("SPYRE_MOCK_DEVICES", "2"), ("SPYRE_DEVICES", "1,1")],
        || {
            let err = start_runtime().unwrap_err();
            assert!(matches!(err, Error::BackendConfig(_)), "{err:?}");
            assert!(
                err.to_string()
                    .contains("visible device 1 is listed twice (from SPYRE_MOCK_DEVICES=\"2\", SPYRE_DEVICES=\"1,1\")"),
                "{err}"
            );
        }
    );
}

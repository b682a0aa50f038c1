//! The process-wide runtime: start once, free, device selection, one device
//! per process, the current stream, environment variables. Each test runs in
//! a fresh process (the runtime starts once per process).

use spyre_stream::{
    Device, DeviceSource, DeviceState, Error, LaunchOptions, StreamId, current_stream,
    default_stream, device_state, free_runtime, host_compute_stream, host_compute_stream_by_id,
    runtime_info, set_current_stream, set_device, start_runtime, stream_from_pool,
    synchronize_device,
};
use spyre_tests::isolated;

const MOCK: (&str, &str) = ("SPYRE_BACKEND", "mock");

#[test]
fn start_runs_once_and_free_makes_a_restart_an_explicit_error() {
    isolated(
        "start_runs_once_and_free_makes_a_restart_an_explicit_error",
        &[MOCK],
        || {
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
            free_runtime();
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
        },
    );
}

#[test]
fn synchronize_device_before_start_does_nothing() {
    isolated(
        "synchronize_device_before_start_does_nothing",
        &[MOCK],
        || {
            synchronize_device(Device::CURRENT).unwrap();
            assert!(
                runtime_info().is_none(),
                "synchronize_device must not start the runtime"
            );
            free_runtime();
            start_runtime().expect("free_runtime before any start does nothing");
        },
    );
}

#[test]
fn local_rank_selects_the_device_and_other_devices_are_refused() {
    isolated(
        "local_rank_selects_the_device_and_other_devices_are_refused",
        &[MOCK, ("SPYRE_MOCK_DEVICES", "4"), ("LOCAL_RANK", "2")],
        || {
            let stream = stream_from_pool(Device::CURRENT, -1).unwrap();
            assert_eq!((stream.device_index(), stream.id()), (2, StreamId(33)));
            let info = runtime_info().unwrap();
            assert_eq!(
                (info.device, info.device_source),
                (2, DeviceSource::LocalRank)
            );

            let err = stream_from_pool(Device::new(0).unwrap(), 0).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::PoolAlreadyInitialized {
                        initialized: 2,
                        requested: 0
                    }
                ),
                "{err:?}"
            );
            assert!(
                err.to_string()
                    .contains("device_index 2; cannot reinitialize with device_index 0")
            );
            // The first device keeps working.
            assert_eq!(
                stream_from_pool(Device::new(2).unwrap(), -1).unwrap().id(),
                StreamId(34)
            );
            // A stream of another device cannot be made current.
            let foreign = spyre_stream::SpyreStream::from_parts(1, StreamId(0));
            assert!(matches!(
                set_current_stream(foreign),
                Err(Error::PoolAlreadyInitialized { .. })
            ));
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
    isolated(
        "a_malformed_local_rank_fails_start_and_a_retry_can_succeed",
        &[MOCK, ("LOCAL_RANK", "abc")],
        || {
            // The per-thread default never panics: it counts as device 0.
            assert_eq!(spyre_stream::current_device(), 0);
            let err = start_runtime().unwrap_err();
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
        },
    );
}

#[test]
fn local_rank_above_127_is_refused() {
    isolated(
        "local_rank_above_127_is_refused",
        &[MOCK, ("LOCAL_RANK", "128")],
        || {
            let err = start_runtime().unwrap_err();
            assert!(
                err.to_string()
                    .contains("128 exceeds the maximum supported device index (127)"),
                "{err}"
            );
        },
    );
}

#[test]
fn a_device_beyond_the_visible_count_is_refused_with_both_numbers() {
    isolated(
        "a_device_beyond_the_visible_count_is_refused_with_both_numbers",
        &[MOCK, ("LOCAL_RANK", "1")],
        || {
            let err = start_runtime().unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::DeviceOutOfRange {
                        device: 1,
                        count: 1
                    }
                ),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                "Device index out of bounds: logical_device_id=1, number of visible devices=1"
            );
            assert!(matches!(
                set_device(1),
                Err(Error::DeviceOutOfRange {
                    device: 1,
                    count: 1
                })
            ));
            assert!(matches!(
                set_device(128),
                Err(Error::InvalidDeviceIndex { index: 128 })
            ));
            assert!(matches!(
                set_device(-2),
                Err(Error::InvalidDeviceIndex { index: -2 })
            ));
            set_device(0).unwrap();
            start_runtime().unwrap();
        },
    );
}

#[test]
fn host_compute_streams_follow_the_variable() {
    isolated(
        "host_compute_streams_follow_the_variable",
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
    isolated(
        "host_compute_count_above_8_is_capped",
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
    for raw in ["0", "-1", "", "abc"] {
        isolated(
            "bad_host_compute_counts_fail_start_naming_the_value",
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
fn hazard_tracker_is_read_at_start() {
    isolated(
        "hazard_tracker_is_read_at_start",
        &[MOCK, ("SPYRE_HAZARD_TRACKER", "1")],
        || {
            start_runtime().unwrap();
            assert!(runtime_info().unwrap().track_hazards);
            assert!(spyre_stream::hazard_tracker_enabled());
            spyre_stream::set_hazard_tracker_enabled(false).unwrap();
            assert!(!spyre_stream::hazard_tracker_enabled());
        },
    );
}

#[test]
fn current_stream_is_per_thread_and_guards_nest() {
    isolated(
        "current_stream_is_per_thread_and_guards_nest",
        &[MOCK],
        || {
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
        },
    );
}

#[test]
fn the_hardware_backend_without_a_library_is_an_error_not_a_fallback() {
    isolated(
        "the_hardware_backend_without_a_library_is_an_error_not_a_fallback",
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
    isolated(
        "an_unknown_backend_name_is_refused",
        &[("SPYRE_BACKEND", "gpu")],
        || {
            let err = start_runtime().unwrap_err();
            assert_eq!(
                err.to_string(),
                "SPYRE_BACKEND=\"gpu\" is invalid: expected `mock` or `hardware`"
            );
        },
    );
}

#[test]
fn with_both_backends_compiled_the_default_is_hardware() {
    isolated(
        "with_both_backends_compiled_the_default_is_hardware",
        &[("FLEX_RUNTIME_LIB", "/nonexistent/libflex.so.1")],
        || {
            assert_eq!(
                spyre_stream::selected_backend().unwrap(),
                spyre_stream::BackendKind::Hardware
            );
            assert!(matches!(start_runtime(), Err(Error::Load(_))));
        },
    );
}

//! Bad input: every malformed stream id, device index, environment value
//! and library path is a clear error that names the bad value, and nothing
//! panics. Spaces of values are checked with proptest against oracles
//! written from the documented rules; a few end-to-end checks run in fresh
//! processes through `start_runtime`.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use flex_rt::{HardwareBackend, LaunchOptions, LoadError};
use proptest::prelude::*;
use spyre_mock::{MockRuntime, MockSystem};
use spyre_stream::env::{parse_host_compute_streams, parse_local_rank};
use spyre_stream::{
    BackendKind, Device, DeviceSource, Error, PoolConfig, SpyreStream, StreamId, StreamPool,
    parse_backend,
};
use spyre_tests::isolated;
use spyre_tests::reliability::{DropCounter, decimal};

// ---------------------------------------------------------------- stream ids

/// A pool with ids 0, 1–3, 33–34 and 65–68 mapped.
fn pool() -> &'static StreamPool<'static> {
    static POOL: OnceLock<&'static StreamPool<'static>> = OnceLock::new();
    POOL.get_or_init(|| {
        let system = MockSystem::builder()
            .memory_bytes(1 << 20)
            .region_bytes(1 << 18)
            .build()
            .unwrap();
        let runtime: &'static MockRuntime =
            Box::leak(Box::new(system.create_mock_runtime(0).unwrap()));
        let pool = Box::leak(Box::new(
            StreamPool::new(runtime, PoolConfig::new(4, false).unwrap()).unwrap(),
        ));
        for priority in [0, 0, 0, -1, -1] {
            pool.stream_from_pool(priority).unwrap();
        }
        pool
    })
}

const MAPPED: [i64; 10] = [0, 1, 2, 3, 33, 34, 65, 66, 67, 68];

fn any_id() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        -3i64..80,
        Just(i64::MAX),
        Just(i64::MIN),
        Just(1000),
        Just(69),
    ]
}

fn assert_no_handle(err: Error, id: i64) {
    // When the id's range gets its handle, written out from the id space
    // (id 0 is always mapped here).
    let advice = match id {
        1..=64 => format!(
            "a pool id (1–64) gets its stream when stream_from_pool first hands it out; a SpyreStream made with from_parts for id {id} before that has none"
        ),
        65..=72 => "host-compute ids run from 65 to 64+N, N from TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS (4 unless set, at most 8): an id above 64+N has no stream, and those up to it are mapped when the pool initializes".to_owned(),
        _ => format!(
            "no stream has id {id}: ids are 0 (the default stream), 1–32 (normal priority), 33–64 (high priority) and 65–72 (host compute)"
        ),
    };
    assert_eq!(
        err.to_string(),
        format!(
            "SpyreStream: no flex handle for stream id {id} — was the stream pool initialized for this device? (device 0); {advice}"
        )
    );
    assert!(
        matches!(err, Error::NoHandle { id: StreamId(i), device: 0 } if i == id),
        "{err:?}"
    );
}

proptest! {
    /// Resolve succeeds exactly for the mapped ids; every other id, and
    /// every operation on it, is `NoHandle` naming the id. A callback
    /// launched on such an id is released without running.
    #[test]
    fn any_stream_id_resolves_or_is_a_named_no_handle_error(id in any_id()) {
        let pool = pool();
        let stream = SpyreStream::from_parts(0, StreamId(id));
        match pool.resolve(stream) {
            Ok(handle) => {
                prop_assert!(MAPPED.contains(&id), "{id} resolved");
                prop_assert_eq!(pool.resolve(stream).unwrap().id(), handle.id());
            }
            Err(err) => {
                prop_assert!(!MAPPED.contains(&id), "{id} did not resolve: {err}");
                assert_no_handle(err, id);
                // The stream's own methods (this process's pool never maps
                // these ids either) refuse it the same way.
                assert_no_handle(stream.query().unwrap_err(), id);
                assert_no_handle(stream.synchronize().unwrap_err(), id);
                assert_no_handle(stream.error().unwrap_err(), id);
                let ran = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&ran);
                let drops = DropCounter::default();
                let token = drops.token();
                let completion = drops.token();
                let err = stream
                    .launch_host_callback(
                        move || {
                            flag.store(true, Ordering::SeqCst);
                            drop(token);
                        },
                        LaunchOptions::new().on_complete(move |_| drop(completion)),
                    )
                    .unwrap_err();
                assert_no_handle(err, id);
                prop_assert!(!ran.load(Ordering::SeqCst));
                prop_assert_eq!(drops.get(), 2);
            }
        }
    }

    /// `host_compute_stream_by_id` accepts exactly 65..65+N and names the
    /// id and the range otherwise.
    #[test]
    fn any_id_is_a_host_compute_stream_or_a_named_error(id in any_id()) {
        match pool().host_compute_stream_by_id(id) {
            Ok(stream) => {
                prop_assert!((65..69).contains(&id), "{id} accepted");
                prop_assert_eq!(stream.id(), StreamId(id));
            }
            Err(err) => {
                prop_assert!(!(65..69).contains(&id), "{id} refused");
                prop_assert_eq!(
                    err.to_string(),
                    format!("stream id {id} is not a host compute stream id (valid range [65, 69))")
                );
                prop_assert!(
                    matches!(err, Error::NotHostComputeStream { id: i, start: 65, end: 69 } if i == id),
                    "{err:?}"
                );
            }
        }
    }

    /// A stream of any other device is refused by the pool, naming both devices.
    #[test]
    fn a_stream_of_another_device_is_refused(device in 1u8..=255, id in any_id()) {
        let err = pool().resolve(SpyreStream::from_parts(device, StreamId(id))).unwrap_err();
        prop_assert!(
            matches!(err, Error::WrongDevice { stream_device, pool_device: 0 } if stream_device == device),
            "{err:?}"
        );
    }

    /// `Device::new` accepts exactly -1..=127 and names the index otherwise.
    #[test]
    fn any_device_index_is_valid_or_a_named_error(index in prop_oneof![any::<i64>(), -3i64..140]) {
        match Device::new(index) {
            Ok(device) => {
                prop_assert!((-1..=127).contains(&index), "{index} accepted");
                prop_assert_eq!(i64::from(device.index()), index);
            }
            Err(err) => {
                prop_assert!(!(-1..=127).contains(&index), "{index} refused");
                prop_assert_eq!(
                    err.to_string(),
                    format!("device index {index} is out of range: expected -1 (the current device) or 0..=127")
                );
            }
        }
    }
}

#[test]
fn named_bad_stream_ids() {
    let pool = pool();
    // Negative, one past the host-compute range, far out, the extremes, and
    // pool ids never handed out.
    for id in [-1, -2, 69, 1000, i64::MAX, i64::MIN, 4, 32, 35, 64] {
        assert_no_handle(
            pool.resolve(SpyreStream::from_parts(0, StreamId(id)))
                .unwrap_err(),
            id,
        );
    }
    for id in [-1, 64, 69, 1000, i64::MAX, i64::MIN, 0] {
        assert!(matches!(
            pool.host_compute_stream_by_id(id),
            Err(Error::NotHostComputeStream { id: i, .. }) if i == id
        ));
    }
}

// ------------------------------------------------------------- environment

/// Strings that look like numbers, nearly numbers, or nothing like them.
fn env_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[+-]?[0-9]{0,25}",
        "[ +\\-0-9a-z_.]{0,8}",
        Just(String::new()),
        Just(" ".to_string()),
        Just("mock".to_string()),
        Just("hardware".to_string()),
    ]
}

/// `LOCAL_RANK` as documented: unset or empty is 0; else a base-10 integer
/// in 0..=127 with nothing around it.
fn local_rank_oracle(raw: Option<&str>) -> Option<u8> {
    match raw {
        None | Some("") => Some(0),
        Some(raw) => match decimal(raw)? {
            (_, 0) => Some(0),
            (true, _) => None,
            (false, m) => u8::try_from(m).ok().filter(|d| *d <= 127),
        },
    }
}

/// `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS` as documented: unset is 4; a
/// base-10 integer of at least 1, capped at 8; nothing else.
fn host_compute_oracle(raw: Option<&str>) -> Option<usize> {
    match raw {
        None | Some("") => Some(4),
        Some(raw) => match decimal(raw)? {
            (_, 0) | (true, _) => None,
            (false, m) => Some(m.min(8) as usize),
        },
    }
}

/// The error `SPYRE_BACKEND=raw` gets when `raw` names no backend: the
/// reason, and, for a value with spaces around it, the note that the
/// stream layer refuses them.
fn backend_refusal(raw: &str) -> String {
    let spaces = if raw.trim() == raw {
        ""
    } else {
        "; spaces around the value are not accepted (the stream layer reads its variables strictly)"
    };
    format!("SPYRE_BACKEND={raw:?} is invalid: expected `mock` or `hardware`{spaces}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn local_rank_is_ok_exactly_for_the_documented_values(raw in proptest::option::of(env_value())) {
        let raw = raw.as_deref();
        match (parse_local_rank(raw), local_rank_oracle(raw)) {
            (Ok(got), Some(expected)) => prop_assert_eq!(got, expected),
            (Err(err), None) => {
                let raw = raw.unwrap();
                let message = err.to_string();
                prop_assert!(message.starts_with(&format!("LOCAL_RANK={raw:?} is invalid: ")), "{message}");
                prop_assert!(
                    matches!(&err, Error::InvalidEnv { variable: "LOCAL_RANK", value, .. } if value == raw),
                    "{err:?}"
                );
            }
            (got, expected) => prop_assert!(false, "LOCAL_RANK={raw:?}: got {got:?}, documented {expected:?}"),
        }
    }

    #[test]
    fn host_compute_count_is_ok_exactly_for_the_documented_values(raw in proptest::option::of(env_value())) {
        let raw = raw.as_deref();
        match (parse_host_compute_streams(raw), host_compute_oracle(raw)) {
            (Ok(got), Some(expected)) => prop_assert_eq!(got, expected),
            (Err(err), None) => {
                let raw = raw.unwrap();
                let message = err.to_string();
                prop_assert!(
                    message.starts_with(&format!("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS={raw:?} is invalid: ")),
                    "{message}"
                );
            }
            (got, expected) => prop_assert!(
                false,
                "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS={raw:?}: got {got:?}, documented {expected:?}"
            ),
        }
    }

    #[test]
    fn backend_is_ok_only_for_mock_and_hardware(raw in proptest::option::of(env_value())) {
        let raw = raw.as_deref();
        match (raw, parse_backend(raw)) {
            // This crate builds spyre-stream with both backends: hardware is the default.
            (None | Some(""), Ok(kind)) => prop_assert_eq!(kind, BackendKind::Hardware),
            (Some("mock"), Ok(kind)) => prop_assert_eq!(kind, BackendKind::Mock),
            (Some("hardware"), Ok(kind)) => prop_assert_eq!(kind, BackendKind::Hardware),
            (Some(raw), Err(err)) if raw != "mock" && raw != "hardware" => prop_assert_eq!(
                err.to_string(),
                backend_refusal(raw)
            ),
            (raw, got) => prop_assert!(false, "SPYRE_BACKEND={raw:?}: {got:?}"),
        }
    }
}

/// Every small integer, signed, with a `+` and with leading zeros, around
/// the boundaries (0, 1, 8, 9, 127, 128): the parsers agree with the
/// documented rules on each.
#[test]
fn env_parsers_at_the_boundaries() {
    let mut checked = 0;
    for v in -300i64..=300 {
        for raw in [
            v.to_string(),
            format!("+{v}"),
            format!("00{v}"),
            format!(" {v}"),
            format!("{v} "),
        ] {
            let lr = parse_local_rank(Some(&raw)).ok();
            assert_eq!(lr, local_rank_oracle(Some(&raw)), "LOCAL_RANK={raw:?}");
            let hc = parse_host_compute_streams(Some(&raw)).ok();
            assert_eq!(
                hc,
                host_compute_oracle(Some(&raw)),
                "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS={raw:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 601 * 5);
    // Spot checks of the oracles themselves, from the documented rules.
    assert_eq!(local_rank_oracle(Some("127")), Some(127));
    assert_eq!(local_rank_oracle(Some("128")), None);
    assert_eq!(local_rank_oracle(Some("-1")), None);
    assert_eq!(local_rank_oracle(Some("")), Some(0));
    assert_eq!(host_compute_oracle(None), Some(4));
    assert_eq!(host_compute_oracle(Some("")), Some(4), "empty means unset");
    assert_eq!(host_compute_oracle(Some("0")), None);
    assert_eq!(host_compute_oracle(Some("9")), Some(8));
    assert_eq!(
        host_compute_oracle(Some("99999999999999999999999")),
        Some(8)
    );
}

/// Near misses of the two backend names are refused, naming the value.
#[test]
fn backend_near_misses_are_refused() {
    for name in ["mock", "hardware"] {
        let upper = name.to_uppercase();
        let mut capitalized = name.to_string();
        capitalized[..1].make_ascii_uppercase();
        let near = [
            upper,
            capitalized,
            format!(" {name}"),
            format!("{name} "),
            format!("{name}\n"),
            format!("{name}s"),
            name[..name.len() - 1].to_string(),
            format!("{name}\0"),
        ];
        for raw in near {
            assert_eq!(
                parse_backend(Some(&raw)).unwrap_err().to_string(),
                backend_refusal(&raw)
            );
        }
    }
}

/// The values every variable is tried with end to end.
const VALUES: [&str; 8] = [
    "",
    " ",
    "abc",
    "-1",
    "0",
    "9",
    "99999999999999999999",
    "184467440737095516150",
];

fn envs(variable: &'static str, with_mock: bool) -> Vec<Vec<(&'static str, &'static str)>> {
    VALUES
        .iter()
        .map(|value| {
            let mut env = vec![(variable, *value)];
            if with_mock {
                env.push(("SPYRE_BACKEND", "mock"));
            }
            env
        })
        .collect()
}

#[test]
fn local_rank_values_end_to_end() {
    isolated!(each; &envs("LOCAL_RANK", true),
        || {
            let raw = std::env::var("LOCAL_RANK").unwrap();
            // The current device is the start's own reading: the same
            // device, or the same refusal.
            assert_eq!(
                spyre_stream::current_device().ok(),
                local_rank_oracle(Some(&raw))
            );
            match (local_rank_oracle(Some(&raw)), spyre_stream::start_runtime()) {
                (Some(0), Ok(())) => {
                    let info = spyre_stream::runtime_info().unwrap();
                    let source = if raw.is_empty() {
                        DeviceSource::Default
                    } else {
                        DeviceSource::LocalRank("LOCAL_RANK")
                    };
                    assert_eq!((info.device, info.device_source), (0, source));
                }
                (Some(device), Err(err)) => {
                    // One mock device: any other index is out of range, with both numbers.
                    assert!(
                        matches!(err, Error::DeviceOutOfRange { device: d, count: 1, chosen_by: DeviceSource::LocalRank("LOCAL_RANK") } if d == device),
                        "LOCAL_RANK={raw:?}: {err:?}"
                    );
                }
                (None, Err(err)) => {
                    assert!(
                        err.to_string()
                            .starts_with(&format!("LOCAL_RANK={raw:?} is invalid: ")),
                        "{err}"
                    );
                    // The thread's device overrides LOCAL_RANK: a retry can succeed.
                    spyre_stream::set_device(0).unwrap();
                    spyre_stream::start_runtime().unwrap();
                }
                (expected, got) => panic!("LOCAL_RANK={raw:?}: expected {expected:?}, got {got:?}"),
            }
        },
    );
}

#[test]
fn host_compute_count_values_end_to_end() {
    isolated!(each; &envs("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", true),
        || {
            let raw = std::env::var("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS").unwrap();
            match (
                host_compute_oracle(Some(&raw)),
                spyre_stream::start_runtime(),
            ) {
                (Some(n), Ok(())) => {
                    assert_eq!(
                        spyre_stream::runtime_info().unwrap().host_compute_streams,
                        n
                    );
                    let last = 64 + n as i64;
                    spyre_stream::host_compute_stream_by_id(last, Device::CURRENT).unwrap();
                    assert!(matches!(
                        spyre_stream::host_compute_stream_by_id(last + 1, Device::CURRENT),
                        Err(Error::NotHostComputeStream { .. })
                    ));
                }
                (None, Err(err)) => {
                    assert!(
                        err.to_string().starts_with(&format!(
                            "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS={raw:?} is invalid: "
                        )),
                        "{err}"
                    );
                    assert!(spyre_stream::runtime_info().is_none());
                }
                (expected, got) => panic!("{raw:?}: expected {expected:?}, got {got:?}"),
            }
        },
    );
}

#[test]
fn backend_values_end_to_end() {
    isolated!(each; &envs("SPYRE_BACKEND", false),
        || {
            let raw = std::env::var("SPYRE_BACKEND").unwrap();
            let err = spyre_stream::start_runtime().unwrap_err();
            if raw.is_empty() {
                // Empty means unset: the build's default, hardware, which
                // finds no flex library here.
                assert!(matches!(err, Error::Load(_)), "{err:?}");
            } else {
                assert_eq!(
                    err.to_string(),
                    backend_refusal(&raw)
                );
            }
            assert!(spyre_stream::runtime_info().is_none());
            // An installed backend does not consult SPYRE_BACKEND.
            spyre_stream::set_backend(Box::new(MockSystem::default())).unwrap();
            spyre_stream::start_runtime().unwrap();
            assert_eq!(
                spyre_stream::stream_from_pool(Device::CURRENT, 0)
                    .unwrap()
                    .id(),
                StreamId(1)
            );
        },
    );
}

// ----------------------------------------------------------- device indices

/// Every free function that hands out a stream of `device`, called once.
fn stream_calls_on(device: Device) -> [spyre_stream::Result<SpyreStream>; 5] {
    [
        spyre_stream::stream_from_pool(device, 0),
        spyre_stream::default_stream(device),
        spyre_stream::host_compute_stream(device),
        spyre_stream::host_compute_stream_by_id(65, device),
        spyre_stream::current_stream(device),
    ]
}

#[test]
fn bad_device_indices_end_to_end() {
    isolated!(&[("SPYRE_BACKEND", "mock")], || {
        use spyre_stream::{set_device, stream_from_pool};
        // Before the start: the index is checked, then the device count.
        for index in [-1, -2, 128, 1000, i64::MIN, i64::MAX] {
            assert!(
                matches!(set_device(index), Err(Error::InvalidDeviceIndex { index: i, .. }) if i == index),
                "{index}"
            );
        }
        // set_device takes a device, not -1 (as torch-spyre's), and says so.
        assert_eq!(
            set_device(-1).unwrap_err().to_string(),
            "device index -1 is out of range: expected 0..=127 (set_device takes a device; -1, the current device, is not one)"
        );
        assert_eq!(
            Device::new(-2).unwrap_err().to_string(),
            "device index -2 is out of range: expected -1 (the current device) or 0..=127"
        );
        // A stream's device index is never the current device.
        assert_eq!(
            spyre_stream::set_current_stream(SpyreStream::from_parts(200, StreamId(1)))
                .unwrap_err()
                .to_string(),
            "device index 200 is out of range: expected 0..=127"
        );
        for index in [1, 2, 127] {
            let err = set_device(index).unwrap_err();
            assert!(
                matches!(err, Error::DeviceOutOfRange { device, count: 1, chosen_by: DeviceSource::ThreadDevice } if i64::from(device) == index),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                format!(
                    "Device index out of bounds. logical_device_id={index}, number of visible devices=1; the device came from the thread's current device (set_device): use a device below 1"
                )
            );
        }
        assert!(matches!(
            Device::new(-2),
            Err(Error::InvalidDeviceIndex { index: -2, .. })
        ));
        assert!(matches!(
            Device::new(128),
            Err(Error::InvalidDeviceIndex { index: 128, .. })
        ));
        // Nothing was started or bound by the refusals.
        assert!(spyre_stream::runtime_info().is_none());

        // Before the start, a request for a device that does not exist is
        // refused with the device and the count, and binds nothing; so is
        // `synchronize_device`, which has nothing to do before the start (as
        // `torch.cuda.synchronize(5)` raises).
        for index in [1, 127] {
            let device = Device::new(index).unwrap();
            let expect = |result: spyre_stream::Result<()>| match result {
                Err(Error::DeviceOutOfRange {
                    device,
                    count: 1,
                    chosen_by: DeviceSource::Requested,
                }) if i64::from(device) == index => {}
                other => panic!("device {index}: {other:?}"),
            };
            stream_calls_on(device)
                .into_iter()
                .for_each(|result| expect(result.map(drop)));
            expect(
                spyre_stream::set_current_stream(SpyreStream::from_parts(index as u8, StreamId(0)))
                    .map(drop),
            );
            expect(spyre_stream::synchronize_device(device));
            // The memory statistics load nothing before the start: zeros
            // for any device, as PyTorch's are empty then.
            assert_eq!(
                spyre_stream::memory_stats(device).unwrap(),
                spyre_stream::MemoryStats::default()
            );
            assert_eq!(spyre_stream::empty_cache(device).unwrap(), 0);
            assert!(spyre_stream::runtime_info().is_none(), "device {index}");
        }
        // Device 0 is there: nothing to do, and nothing started.
        spyre_stream::synchronize_device(Device::new(0).unwrap()).unwrap();
        assert!(spyre_stream::runtime_info().is_none());
        spyre_stream::start_runtime().unwrap();

        // A device the process is not bound to: named with both indices.
        for index in [1, 127] {
            let device = Device::new(index).unwrap();
            let expect = |result: spyre_stream::Result<SpyreStream>| match result {
                Err(Error::OtherDevice {
                    requested,
                    bound: 0,
                }) if i64::from(requested) == index => {}
                other => panic!("device {index}: {other:?}"),
            };
            stream_calls_on(device).into_iter().for_each(expect);
            assert!(matches!(
                spyre_stream::set_current_stream(SpyreStream::from_parts(index as u8, StreamId(0))),
                Err(Error::WrongDevice { stream_device, pool_device: 0 }) if i64::from(stream_device) == index
            ));
            assert!(matches!(
                spyre_stream::synchronize_device(device),
                Err(Error::OtherDevice { requested, bound: 0 }) if i64::from(requested) == index
            ));
            assert!(matches!(
                SpyreStream::from_parts(index as u8, StreamId(0)).query(),
                Err(Error::WrongDevice { pool_device: 0, .. })
            ));
        }
        // Device 0 is unaffected.
        let stream = stream_from_pool(Device::new(0).unwrap(), 0).unwrap();
        assert_eq!(stream.id(), StreamId(1));
        stream.synchronize().unwrap();
        assert_eq!(spyre_stream::device_state(), spyre_stream::DeviceState::Ok);
    },);
}

// ------------------------------------------------------------ library paths

/// A system library that is not a flex runtime (it lacks every flex symbol).
fn library_without_flex_symbols() -> &'static str {
    const CANDIDATES: [&str; 4] = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
        "/usr/lib64/libm.so.6",
    ];
    CANDIDATES
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("a libm.so.6 exists on this machine")
}

/// Each bad path, and what kind of refusal it gets.
fn bad_paths() -> Vec<(String, &'static str)> {
    let dir = env!("CARGO_MANIFEST_DIR");
    vec![
        ("/nonexistent/spyre/libflex.so.1".to_string(), "open"),
        (dir.to_string(), "open"),
        (format!("{dir}/Cargo.toml"), "open"),
        (library_without_flex_symbols().to_string(), "symbol"),
    ]
}

fn check_load_error(err: &LoadError, path: &str, kind: &str) {
    let message = err.to_string();
    assert!(
        message.contains(path),
        "the error must name {path}: {message}"
    );
    match (kind, err) {
        ("open", LoadError::Open { path: p, .. }) => assert_eq!(p.to_str(), Some(path)),
        ("symbol", LoadError::MissingSymbol { symbol, .. }) => {
            assert_eq!(*symbol, "flex_get_api_version")
        }
        _ => panic!("{path}: expected a {kind} error, got {err:?}"),
    }
}

#[test]
fn bad_library_paths_are_named_by_flex_backend_open() {
    for (path, kind) in bad_paths() {
        let err = HardwareBackend::open(&path).unwrap_err();
        check_load_error(&err, &path, kind);
    }
    // The empty path is refused before the dynamic loader sees it (it would
    // return the main program).
    let err = HardwareBackend::open("").unwrap_err();
    assert!(
        matches!(&err, LoadError::Open { reason, .. } if reason == "the path is empty"),
        "{err:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any file name under a missing directory: an `Open` error naming it.
    #[test]
    fn any_missing_path_is_a_named_open_error(name in "[^/]{0,40}") {
        let path = format!("/nonexistent-spyre-dir/{name}");
        let err = HardwareBackend::open(&path).unwrap_err();
        prop_assert!(err.to_string().contains(&path), "{err}");
        prop_assert!(matches!(err, LoadError::Open { .. }), "{err:?}");
    }
}

#[test]
fn bad_library_paths_are_named_by_start_runtime() {
    let paths = bad_paths();
    let envs: Vec<Vec<(&str, &str)>> = paths
        .iter()
        .map(|(path, _)| {
            vec![
                ("SPYRE_BACKEND", "hardware"),
                ("FLEX_RUNTIME_LIB", path.as_str()),
            ]
        })
        .collect();
    isolated!(each; &envs,
        || {
            let path = std::env::var("FLEX_RUNTIME_LIB").unwrap();
            let kind = bad_paths()
                .into_iter()
                .find(|(p, _)| *p == path)
                .map(|(_, kind)| kind)
                .unwrap();
            let err = spyre_stream::start_runtime().unwrap_err();
            assert!(err.to_string().contains(&path), "{err}");
            let Error::Load(load) = &err else {
                panic!("expected a load error, got {err:?}")
            };
            match load.as_ref() {
                LoadError::Env {
                    variable: "FLEX_RUNTIME_LIB",
                    value,
                    error,
                } => {
                    assert_eq!(value.to_str(), Some(path.as_str()));
                    check_load_error(error, &path, kind);
                }
                other => panic!("expected FLEX_RUNTIME_LIB to be named, got {other:?}"),
            }
            // Nothing started, and no silent fallback to the mock.
            assert!(spyre_stream::runtime_info().is_none());
            assert!(matches!(
                spyre_stream::global_pool(),
                Err(spyre_stream::Error::NotStarted)
            ));
        },
    );
}

/// A library of another ABI major version (the mock shared library with
/// `SPYRE_MOCK_ABI_VERSION=2.0`) is refused, naming the file and both
/// versions, by `HardwareBackend::open` and by `start_runtime`.
#[test]
fn a_library_of_another_abi_major_is_refused_naming_it() {
    let library = spyre_tests::mock_cdylib().to_str().unwrap().to_owned();
    isolated!(
        &[
            ("SPYRE_MOCK_ABI_VERSION", "2.0"),
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", &library),
        ],
        || {
            let library = std::env::var("FLEX_RUNTIME_LIB").unwrap();
            let loaded = std::fs::canonicalize(&library).unwrap();
            let loaded = loaded.to_str().unwrap();
            let expect_mismatch = |err: &LoadError| match err {
                LoadError::AbiMismatch { found, path, .. } => {
                    assert_eq!((found.major, found.minor), (2, 0));
                    assert_eq!(path.to_str(), Some(loaded));
                    let message = err.to_string();
                    assert!(message.contains(loaded), "{message}");
                    assert!(message.contains("implements flex ABI 2.0"), "{message}");
                }
                other => panic!("expected an ABI mismatch, got {other:?}"),
            };
            expect_mismatch(&HardwareBackend::open(&library).unwrap_err());

            let err = spyre_stream::start_runtime().unwrap_err();
            assert!(err.to_string().contains(&library), "{err}");
            match &err {
                Error::Load(load) => match load.as_ref() {
                    LoadError::Env { value, error, .. } => {
                        assert_eq!(value.to_str(), Some(library.as_str()));
                        expect_mismatch(error);
                    }
                    other => panic!("{other:?}"),
                },
                other => panic!("expected a load error, got {other:?}"),
            }
            assert!(spyre_stream::runtime_info().is_none());
        },
    );
}

//! Unit tests of the exported functions, called in process. Runtimes are
//! made with explicit configurations and switches (no environment), except
//! where a test says otherwise.

use spyre_testkit::f32_le_bytes;
use std::ffi::{CStr, c_void};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flex_sys::bindings::{self as sys, FlexApi};
use parking_lot::Mutex;

use flex_rt::program::KernelDescriptor;
use spyre_mock::MockSystemBuilder;

use flex_rt::Runtime;
use flex_sys::bindings::{
    FLEX_ERROR_NO_DEVICE, FLEX_ERROR_RUNTIME_FAILED, FLEX_NOT_READY, FLEX_SUCCESS,
    flex_completion_t, flex_composite_address_t, flex_runtime_t, flex_status_t, flex_stream_t,
};

use crate::environment::{
    self, ENV_FAIL_LAUNCH, ENV_FAIL_RUNTIME_CREATE, ENV_LATE_COMPLETIONS_MS, ENV_UNDEFINED_STATUS,
    Switches,
};
use crate::handles;
use crate::runtime::start_runtime;
use crate::*;

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// A runtime made through `start_runtime`, destroyed on drop.
struct Rt(*mut flex_runtime_t);

impl Rt {
    /// 1 MiB of memory in 4 KiB regions, 2 engines, with `switches`.
    fn with(switches: Switches) -> Self {
        let config = MockSystemBuilder::new()
            .memory_bytes(1 << 20)
            .region_bytes(4096)
            .build_config()
            .unwrap();
        let state = start_runtime(0, config, switches).unwrap();
        Self(handles::register_runtime(state))
    }

    fn new() -> Self {
        Self::with(Switches::default())
    }

    fn default_stream(&self) -> *mut flex_stream_t {
        let mut out = ptr::null_mut();
        assert_eq!(
            // SAFETY: a live runtime and a valid out pointer.
            unsafe { flex_runtime_get_default_stream(self.0, &raw mut out) },
            FLEX_SUCCESS
        );
        out
    }

    fn create_stream(&self, priority: i32) -> *mut flex_stream_t {
        let mut out = ptr::null_mut();
        // SAFETY: a live runtime and a valid out pointer.
        let status = unsafe { flex_runtime_create_stream(self.0, priority, 0, 0, &raw mut out) };
        assert_eq!(status, FLEX_SUCCESS, "{}", boundary::last_error());
        out
    }

    fn alloc(&self, size: u64) -> Addr {
        let mut chunks = vec![sys::flex_address_chunk_t::default(); 64];
        let mut count = 0usize;
        // SAFETY: room for 64 chunks and a valid count pointer.
        let status =
            unsafe { flex_memory_allocate(self.0, size, chunks.as_mut_ptr(), 64, &raw mut count) };
        assert_eq!(status, FLEX_SUCCESS, "{}", boundary::last_error());
        chunks.truncate(count);
        Addr(chunks)
    }

    fn destroy(mut self) -> flex_status_t {
        // SAFETY: any pointer value is accepted.
        let status = unsafe { flex_runtime_destroy(self.0) };
        self.0 = ptr::null_mut();
        status
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: any pointer value is accepted.
            unsafe { flex_runtime_destroy(self.0) };
        }
    }
}

/// A composite address owned by the test.
#[derive(Clone)]
struct Addr(Vec<sys::flex_address_chunk_t>);

impl Addr {
    fn raw(&self) -> flex_composite_address_t {
        flex_composite_address_t {
            chunks: self.0.as_ptr(),
            num_chunks: self.0.len(),
        }
    }

    fn start(&self) -> flex_rt::LogicalAddress {
        flex_rt::LogicalAddress {
            region_id: self.0[0].address.region_id,
            offset: self.0[0].address.offset,
        }
    }
}

/// What C completions recorded: statuses in call order and thread names.
#[derive(Default)]
struct Recorder {
    statuses: Mutex<Vec<flex_status_t>>,
    threads: Mutex<Vec<String>>,
}

unsafe extern "C" fn record(user_data: *mut c_void, status: flex_status_t) {
    // SAFETY: every test passes a pointer to a `Recorder` that outlives the
    // runtime's completions (the test synchronizes before dropping it).
    let recorder = unsafe { &*user_data.cast::<Recorder>() };
    recorder.statuses.lock().push(status);
    let name = std::thread::current().name().unwrap_or("").to_owned();
    recorder.threads.lock().push(name);
}

fn completion(recorder: &Recorder) -> flex_completion_t {
    flex_completion_t {
        fn_: Some(record),
        user_data: ptr::from_ref(recorder).cast_mut().cast(),
    }
}

const NO_COMPLETION: flex_completion_t = flex_completion_t {
    fn_: None,
    user_data: ptr::null_mut(),
};

fn sync(stream: *mut flex_stream_t) -> flex_status_t {
    // SAFETY: any pointer value is accepted.
    unsafe { flex_stream_synchronize(stream) }
}

fn query(stream: *mut flex_stream_t) -> flex_status_t {
    // SAFETY: any pointer value is accepted.
    unsafe { flex_stream_query(stream) }
}

fn h2d(stream: *mut flex_stream_t, data: &[u8], dst: &Addr, c: flex_completion_t) -> flex_status_t {
    let raw = dst.raw();
    // SAFETY: `data` outlives the operation (every test synchronizes before
    // it goes), and `raw` points into `dst` for the call.
    unsafe { flex_launch_h2d(stream, data.as_ptr().cast(), &raw const raw, 0, c) }
}

fn d2h(
    stream: *mut flex_stream_t,
    src: &Addr,
    out: &mut [u8],
    c: flex_completion_t,
) -> flex_status_t {
    let raw = src.raw();
    // SAFETY: as for `h2d`; `out` is not touched until the test synchronizes.
    unsafe { flex_launch_d2h(stream, &raw const raw, out.as_mut_ptr().cast(), 0, c) }
}

/// A host function that sleeps for the milliseconds in `*user_data` (a
/// `u64`) and then returns success.
unsafe extern "C" fn sleepy(user_data: *mut c_void) -> flex_status_t {
    // SAFETY: the tests pass a `u64` that outlives the operation.
    let ms = unsafe { *user_data.cast::<u64>() };
    std::thread::sleep(Duration::from_millis(ms));
    FLEX_SUCCESS
}

/// A host function that returns the status stored in `*user_data`.
unsafe extern "C" fn returns_status(user_data: *mut c_void) -> flex_status_t {
    // SAFETY: the tests pass an `i32` that outlives the operation.
    unsafe { *user_data.cast::<i32>() }
}

fn host(
    stream: *mut flex_stream_t,
    f: unsafe extern "C" fn(*mut c_void) -> flex_status_t,
    data: *mut c_void,
    c: flex_completion_t,
) -> flex_status_t {
    // SAFETY: `f` accepts `data` (see each function), alive until the test
    // synchronizes.
    unsafe { flex_launch_host_callback(stream, Some(f), data, 0, c) }
}

fn last_error() -> String {
    // SAFETY: no preconditions; the string is copied at once.
    unsafe { CStr::from_ptr(flex_get_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

// ---------------------------------------------------------------------------
// The ABI surface
// ---------------------------------------------------------------------------

/// Assigns every export to the field of bindgen's `FlexApi` for the same
/// function: a signature that drifts from flex.h does not compile. Never
/// called: named by the constant below, it is checked, and used.
const _: fn(&mut FlexApi) = exports_have_the_bindgen_signatures;

fn exports_have_the_bindgen_signatures(api: &mut FlexApi) {
    api.flex_get_api_version = Ok(flex_get_api_version);
    api.flex_status_string = Ok(flex_status_string);
    api.flex_get_last_error_message = Ok(flex_get_last_error_message);
    api.flex_get_device_count = Ok(flex_get_device_count);
    api.flex_runtime_create = Ok(flex_runtime_create);
    api.flex_runtime_destroy = Ok(flex_runtime_destroy);
    api.flex_runtime_get_logical_device = Ok(flex_runtime_get_logical_device);
    api.flex_runtime_get_default_stream = Ok(flex_runtime_get_default_stream);
    api.flex_runtime_create_stream = Ok(flex_runtime_create_stream);
    api.flex_stream_destroy = Ok(flex_stream_destroy);
    api.flex_runtime_has_stream_error = Ok(flex_runtime_has_stream_error);
    api.flex_memory_allocate = Ok(flex_memory_allocate);
    api.flex_memory_free = Ok(flex_memory_free);
    api.flex_stream_get_id = Ok(flex_stream_get_id);
    api.flex_stream_get_priority = Ok(flex_stream_get_priority);
    api.flex_stream_query = Ok(flex_stream_query);
    api.flex_stream_synchronize = Ok(flex_stream_synchronize);
    api.flex_stream_needs_shutdown = Ok(flex_stream_needs_shutdown);
    api.flex_launch_h2d = Ok(flex_launch_h2d);
    api.flex_launch_d2h = Ok(flex_launch_d2h);
    api.flex_launch_compute = Ok(flex_launch_compute);
    api.flex_launch_host_callback = Ok(flex_launch_host_callback);
    api.flex_launch_fill = Ok(flex_launch_fill);
    api.flex_runtime_get_capability = Ok(flex_runtime_get_capability);
    api.flex_event_create = Ok(flex_event_create);
    api.flex_event_destroy = Ok(flex_event_destroy);
    api.flex_event_record = Ok(flex_event_record);
    api.flex_stream_wait_event = Ok(flex_stream_wait_event);
    api.flex_event_notify = Ok(flex_event_notify);
    api.flex_runtime_get_memory_info = Ok(flex_runtime_get_memory_info);
    api.flex_event_query = Ok(flex_event_query);
    api.flex_event_synchronize = Ok(flex_event_synchronize);
    api.flex_event_elapsed_time = Ok(flex_event_elapsed_time);
}

#[test]
fn every_flex_h_function_is_exported_with_its_signature() {
    // The assignment above is the signature check; this keeps it compiled.
    let _: fn(&mut FlexApi) = exports_have_the_bindgen_signatures;
    // flex.h 1.0: 23 functions; 1.1 adds 10; all but the version and the
    // two string getters return a status.
    assert_eq!(flex_sys::REQUIRED_SYMBOLS.len(), 23);
    assert_eq!(flex_sys::ABI_1_1_SYMBOLS.len(), 10);
    assert_eq!(environment::status_calls().count(), 30);
    assert!(environment::status_calls().all(|call| call != "flex_status_string"));
}

#[test]
fn status_strings_are_the_header_names() {
    let name = |status| {
        // SAFETY: any status is accepted; the string is static.
        unsafe { CStr::from_ptr(flex_status_string(status)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(name(0), "FLEX_SUCCESS");
    assert_eq!(name(1), "FLEX_NOT_READY");
    assert_eq!(name(4), "FLEX_ERROR_OUT_OF_MEMORY");
    assert_eq!(name(10), "FLEX_ERROR_HOST_CALLBACK_FAILED");
    assert_eq!(name(13), "FLEX_ERROR_INTERNAL");
    for unknown in [-1, 14, 977, i32::MIN, i32::MAX] {
        assert_eq!(name(unknown), "FLEX_UNKNOWN_STATUS");
    }
}

#[test]
fn api_version_is_the_header_version_or_the_switch() {
    let version = |value: Option<&str>| environment::abi_version(|_| value.map(str::to_owned));
    assert_eq!(version(None), Ok(0x0001_0001));
    assert_eq!(version(Some("")), Ok(0x0001_0001));
    assert_eq!(version(Some("1.0")), Ok(0x0001_0000));
    assert_eq!(version(Some("2.0")), Ok(0x0002_0000));
    assert_eq!(version(Some(" 1.7 ")), Ok(0x0001_0007));
    assert_eq!(version(Some("65535.65535")), Ok(0xFFFF_FFFF));
    for malformed in ["2", "1.x", "70000.0", "-1.0", "+1.0", "1.0.0", "1,1"] {
        assert_eq!(
            version(Some(malformed)),
            Err(format!(
                "SPYRE_MOCK_ABI_VERSION={malformed:?} is not valid: expected MAJOR.MINOR, each a decimal number from 0 to 65535 (e.g. 1.0)"
            )),
            "{malformed}"
        );
        // The runtime is refused with that message; the library loads.
        let switches = Switches::from_lookup(|name| {
            (name == "SPYRE_MOCK_ABI_VERSION").then(|| malformed.to_owned())
        });
        assert!(switches.unwrap_err().contains("SPYRE_MOCK_ABI_VERSION"));
    }
}

/// The use-after-free detector needs to be told when memory is handed out
/// again (`Runtime::note_reuse`), which flex.h has no call for: asked for
/// through the library, the device is refused, naming the variable and
/// where the detector works, rather than run without it.
#[test]
fn the_use_after_free_detector_is_refused_through_the_library() {
    let config = |value: &str| {
        let value = value.to_owned();
        environment::config(move |name| (name == "SPYRE_MOCK_CHECK_REUSE").then(|| value.clone()))
    };
    let refused = config("1").unwrap_err();
    assert!(
        refused.starts_with("SPYRE_MOCK_CHECK_REUSE=\"1\" cannot work through the flex library"),
        "{refused}"
    );
    assert!(refused.contains("in-process software device"), "{refused}");
    assert!(!config("0").unwrap().check_reuse());
    assert!(
        config("2").unwrap_err().contains("SPYRE_MOCK_CHECK_REUSE"),
        "malformed"
    );
}

#[test]
fn switches_parse_and_name_bad_values() {
    let parse = |pairs: &[(&str, &str)]| {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Switches::from_lookup(move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    };
    assert_eq!(parse(&[]).unwrap(), Switches::default());
    let all = parse(&[
        (ENV_UNDEFINED_STATUS, "flex_stream_query, flex_launch_h2d"),
        (ENV_FAIL_LAUNCH, "3"),
        (ENV_LATE_COMPLETIONS_MS, "25"),
        (ENV_FAIL_RUNTIME_CREATE, "1"),
    ])
    .unwrap();
    assert_eq!(
        all.undefined_status,
        vec!["flex_stream_query", "flex_launch_h2d"]
    );
    assert!(all.undefined_status_for("flex_launch_h2d"));
    assert!(!all.undefined_status_for("flex_launch_d2h"));
    assert_eq!(all.fail_launch, Some(3));
    assert_eq!(all.late_completions, Some(Duration::from_millis(25)));
    assert!(all.fail_runtime_create);
    assert_eq!(parse(&[(ENV_FAIL_LAUNCH, "0")]).unwrap().fail_launch, None);
    for (raw, on) in [
        ("0", false),
        ("off", false),
        ("No", false),
        ("TRUE", true),
        ("yes", true),
    ] {
        assert_eq!(
            parse(&[(ENV_FAIL_RUNTIME_CREATE, raw)])
                .unwrap()
                .fail_runtime_create,
            on,
            "{raw}"
        );
    }

    for (name, raw, needle) in [
        (
            ENV_UNDEFINED_STATUS,
            "flex_get_api_version",
            "\"flex_get_api_version\" is not a flex.h function that returns a status",
        ),
        (
            ENV_UNDEFINED_STATUS,
            "flex_bogus",
            "SPYRE_MOCK_UNDEFINED_STATUS=\"flex_bogus\"",
        ),
        (
            ENV_FAIL_LAUNCH,
            "two",
            "SPYRE_MOCK_FAIL_LAUNCH=\"two\" is not valid: expected a decimal whole number",
        ),
        (
            ENV_FAIL_LAUNCH,
            "18446744073709551616",
            "SPYRE_MOCK_FAIL_LAUNCH=\"18446744073709551616\" is not valid: it must be at most 18446744073709551615",
        ),
        (
            ENV_LATE_COMPLETIONS_MS,
            "-5",
            "SPYRE_MOCK_LATE_COMPLETIONS_MS=\"-5\"",
        ),
        (
            ENV_LATE_COMPLETIONS_MS,
            "10001",
            "SPYRE_MOCK_LATE_COMPLETIONS_MS=\"10001\" is not valid: expected a decimal number of milliseconds from 0 to 10000",
        ),
        (
            ENV_FAIL_RUNTIME_CREATE,
            "maybe",
            "SPYRE_MOCK_FAIL_RUNTIME_CREATE=\"maybe\" is not valid: expected a boolean",
        ),
    ] {
        let err = parse(&[(name, raw)]).unwrap_err();
        assert!(err.contains(needle), "{needle:?} not in {err:?}");
    }
}

#[test]
fn last_error_is_empty_until_a_call_fails_and_kept_across_successes() {
    std::thread::spawn(|| {
        assert_eq!(last_error(), "");
        let mut count = 0;
        assert_eq!(
            // SAFETY: NULL is accepted and refused.
            unsafe { flex_get_device_count(ptr::null_mut()) },
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(last_error(), "count is NULL");
        assert_eq!(
            // SAFETY: a valid out pointer.
            unsafe { flex_get_device_count(&raw mut count) },
            FLEX_SUCCESS
        );
        assert_eq!(last_error(), "count is NULL", "success leaves the message");
        assert_eq!(
            // SAFETY: NULL is accepted and refused.
            unsafe { flex_stream_query(ptr::null_mut()) },
            sys::FLEX_ERROR_INVALID_HANDLE
        );
        assert_eq!(last_error(), "the stream handle is NULL");
    })
    .join()
    .unwrap();
}

#[test]
fn a_panic_becomes_an_internal_error_with_its_message() {
    let status = boundary::boundary("flex_test", || panic!("kaboom {}", 7));
    assert_eq!(status, sys::FLEX_ERROR_INTERNAL);
    assert_eq!(last_error(), "the library panicked: kaboom 7");
}

// ---------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------

#[test]
fn null_and_foreign_handles_are_invalid_handle_errors() {
    let mut local = [0u64; 8];
    let foreign_rt: *mut flex_runtime_t = local.as_mut_ptr().cast();
    let foreign_stream: *mut flex_stream_t = local.as_mut_ptr().cast();
    let addr = flex_composite_address_t {
        chunks: ptr::null(),
        num_chunks: 0,
    };
    let mut out_i32 = 7;
    let mut out_u64 = 7u64;
    let mut out_stream = ptr::null_mut();
    let mut out_count = 7usize;
    let mut chunk = [sys::flex_address_chunk_t::default(); 1];
    let byte = [0u8; 1];
    for (rt, stream) in [
        (ptr::null_mut(), ptr::null_mut()),
        (foreign_rt, foreign_stream),
    ] {
        // SAFETY: every pointer is NULL, foreign (recognised without a
        // dereference), or a valid out pointer.
        let statuses = unsafe {
            [
                flex_runtime_destroy(rt),
                flex_runtime_get_logical_device(rt, &raw mut out_i32),
                flex_runtime_get_default_stream(rt, &raw mut out_stream),
                flex_runtime_create_stream(rt, 0, 0, 0, &raw mut out_stream),
                flex_stream_destroy(rt, stream),
                flex_runtime_has_stream_error(rt, &raw mut out_i32),
                flex_memory_allocate(rt, 128, chunk.as_mut_ptr(), 1, &raw mut out_count),
                flex_memory_free(rt, &raw const addr),
                flex_stream_get_id(stream, &raw mut out_u64),
                flex_stream_get_priority(stream, &raw mut out_i32),
                flex_stream_query(stream),
                flex_stream_synchronize(stream),
                flex_stream_needs_shutdown(stream, &raw mut out_i32),
                flex_launch_h2d(
                    stream,
                    byte.as_ptr().cast(),
                    &raw const addr,
                    0,
                    NO_COMPLETION,
                ),
                flex_launch_d2h(
                    stream,
                    &raw const addr,
                    local.as_mut_ptr().cast(),
                    0,
                    NO_COMPLETION,
                ),
                flex_launch_compute(stream, &raw const addr, 0, NO_COMPLETION),
                flex_launch_host_callback(
                    stream,
                    Some(returns_status),
                    ptr::null_mut(),
                    0,
                    NO_COMPLETION,
                ),
                flex_launch_fill(stream, &raw const addr, 1.0, 0, 0, NO_COMPLETION),
            ]
        };
        assert_eq!(statuses, [sys::FLEX_ERROR_INVALID_HANDLE; 18], "{rt:p}");
    }
    assert_eq!(
        (out_i32, out_u64, out_count),
        (7, 7, 7),
        "out-parameters untouched on failure"
    );
    assert!(out_stream.is_null());
    assert!(
        last_error().contains("is not a live stream of this library"),
        "{}",
        last_error()
    );
}

/// A destroy removes a handle only while it is still the runtime it
/// drained: a handle whose address now names another runtime (the first
/// destroyed by another thread meanwhile, the address reused) stays.
/// Before, the slower of two destroys of one runtime removed whatever
/// runtime was at the address then.
#[test]
fn a_destroy_removes_only_the_runtime_it_drained() {
    let rt = Rt::new();
    let serial = handles::runtime(rt.0).unwrap().serial;
    assert!(handles::unregister_runtime(rt.0, serial + 1).is_none());
    assert!(handles::runtime(rt.0).is_ok(), "the runtime stays");
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
}

#[test]
fn destroyed_runtimes_and_streams_are_rejected() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let default = rt.default_stream();
    assert_eq!(
        // SAFETY: live handles.
        unsafe { flex_stream_destroy(rt.0, default) },
        sys::FLEX_ERROR_INVALID_HANDLE
    );
    assert!(last_error().contains("default stream"), "{}", last_error());
    let other = Rt::new();
    assert_eq!(
        // SAFETY: live handles.
        unsafe { flex_stream_destroy(other.0, stream) },
        sys::FLEX_ERROR_INVALID_HANDLE
    );
    assert!(
        last_error().contains("belongs to another runtime"),
        "{}",
        last_error()
    );

    // SAFETY: live handles.
    assert_eq!(unsafe { flex_stream_destroy(rt.0, stream) }, FLEX_SUCCESS);
    assert_eq!(query(stream), sys::FLEX_ERROR_INVALID_HANDLE);
    assert_eq!(
        // SAFETY: a retired handle is recognised without a dereference.
        unsafe { flex_stream_destroy(rt.0, stream) },
        sys::FLEX_ERROR_INVALID_HANDLE
    );
    assert_eq!(
        query(default),
        FLEX_SUCCESS,
        "the other streams are unaffected"
    );

    let handle = rt.0;
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
    assert_eq!(
        // SAFETY: a destroyed handle is recognised without a dereference.
        unsafe { flex_runtime_destroy(handle) },
        sys::FLEX_ERROR_INVALID_HANDLE
    );
    assert!(
        last_error().contains("is not a live runtime"),
        "{}",
        last_error()
    );
}

#[test]
fn streams_have_ids_priorities_and_one_default() {
    let rt = Rt::new();
    let default = rt.default_stream();
    assert_eq!(default, rt.default_stream(), "always the same handle");
    let normal = rt.create_stream(sys::FLEX_STREAM_PRIORITY_NORMAL);
    let high = rt.create_stream(sys::FLEX_STREAM_PRIORITY_HIGH);
    for (stream, id, priority) in [(default, 0, 0), (normal, 1, 0), (high, 2, 1)] {
        let (mut got_id, mut got_priority) = (99u64, 99i32);
        // SAFETY: live handles, valid out pointers.
        unsafe {
            assert_eq!(flex_stream_get_id(stream, &raw mut got_id), FLEX_SUCCESS);
            assert_eq!(
                flex_stream_get_priority(stream, &raw mut got_priority),
                FLEX_SUCCESS
            );
        }
        assert_eq!((got_id, got_priority), (id, priority));
    }
    let mut device = -1;
    assert_eq!(
        // SAFETY: a live handle, a valid out pointer.
        unsafe { flex_runtime_get_logical_device(rt.0, &raw mut device) },
        FLEX_SUCCESS
    );
    assert_eq!(device, 0);
    let state = handles::runtime(rt.0).unwrap();
    assert_eq!(handles::live_streams_of(&state), 3);

    let mut out = ptr::null_mut();
    // SAFETY: a live handle and a valid out pointer; the arguments are refused.
    unsafe {
        assert_eq!(
            flex_runtime_create_stream(rt.0, 2, 0, 0, &raw mut out),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("unknown stream priority 2"),
            "{}",
            last_error()
        );
        assert_eq!(
            flex_runtime_create_stream(rt.0, 0, 1, 0, &raw mut out),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("unknown stream mode 1"),
            "{}",
            last_error()
        );
        assert_eq!(
            flex_runtime_create_stream(rt.0, 0, 0, 0, ptr::null_mut()),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
    }
    assert!(out.is_null());
}

#[test]
fn runtime_creation_checks_the_device_and_the_fault() {
    let config = || MockSystemBuilder::new().devices(2).build_config().unwrap();
    for (device, status, needle) in [
        (-1, FLEX_ERROR_NO_DEVICE, "logical device -1 is negative"),
        (2, FLEX_ERROR_NO_DEVICE, "logical device 2 does not exist"),
    ] {
        let failure = start_runtime(device, config(), Switches::default())
            .err()
            .unwrap();
        assert_eq!(failure.status, status);
        assert!(failure.message.contains(needle), "{}", failure.message);
    }
    let failing = Switches {
        fail_runtime_create: true,
        ..Switches::default()
    };
    let failure = start_runtime(1, config(), failing).err().unwrap();
    assert_eq!(failure.status, FLEX_ERROR_RUNTIME_FAILED);
    assert!(
        failure
            .message
            .contains("SPYRE_MOCK_FAIL_RUNTIME_CREATE, set to a true value"),
        "{}",
        failure.message
    );
    let state = start_runtime(1, config(), Switches::default()).unwrap();
    assert_eq!(state.runtime.logical_device(), 1);
}

/// Uses the process environment: valid when no `SPYRE_MOCK_*` variable is
/// set, as under `cargo test`.
#[test]
fn the_exported_create_and_count_use_the_default_configuration() {
    let mut count = -1;
    // SAFETY: valid out pointers throughout.
    unsafe {
        assert_eq!(flex_get_device_count(&raw mut count), FLEX_SUCCESS);
        assert_eq!(count, 1);
        let mut rt = ptr::null_mut();
        assert_eq!(flex_runtime_create(1, &raw mut rt), FLEX_ERROR_NO_DEVICE);
        assert!(rt.is_null());
        assert_eq!(
            flex_runtime_create(0, ptr::null_mut()),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(flex_runtime_create(0, &raw mut rt), FLEX_SUCCESS);
        assert!(!rt.is_null());
        assert_eq!(flex_runtime_destroy(rt), FLEX_SUCCESS);
    }
}

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

/// Asking how many chunks an allocation needs (a capacity too small) never
/// holds the memory: an allocation of the last free bytes beside it never
/// fails. Before, the call allocated and then freed, and allocations racing
/// it failed with `OUT_OF_MEMORY` while memory was free (42 of these
/// 50 000; 3 of 20 000 in another run).
#[test]
#[cfg_attr(miri, ignore = "thousands of racing calls")]
fn asking_for_the_chunks_needed_never_holds_the_memory() {
    let rt = Rt::new();
    let state = handles::runtime(rt.0).unwrap();
    // Every 4 KiB region taken but two: an 8 KiB allocation needs both.
    let taken: Vec<Addr> = (0..(state.runtime.free_memory_bytes() / 4096 - 2))
        .map(|_| rt.alloc(4096))
        .collect();
    let runtime = rt.0 as usize;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut count = 0usize;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: a live runtime; no room for chunks (capacity 0)
                // and a valid count pointer.
                let status = unsafe {
                    flex_memory_allocate(
                        runtime as *mut _,
                        8192,
                        ptr::NonNull::dangling().as_ptr(),
                        0,
                        &raw mut count,
                    )
                };
                assert!(
                    status == sys::FLEX_ERROR_INVALID_ARGUMENT
                        || status == sys::FLEX_ERROR_OUT_OF_MEMORY,
                    "{status}"
                );
            }
        })
    };
    let mut out_of_memory = 0;
    for _ in 0..50_000 {
        let mut chunks = [sys::flex_address_chunk_t::default(); 2];
        let mut count = 0usize;
        // SAFETY: room for 2 chunks and a valid count pointer.
        let status =
            unsafe { flex_memory_allocate(rt.0, 8192, chunks.as_mut_ptr(), 2, &raw mut count) };
        if status == sys::FLEX_ERROR_OUT_OF_MEMORY {
            out_of_memory += 1;
            continue;
        }
        assert_eq!(status, FLEX_SUCCESS, "{}", last_error());
        let address = flex_composite_address_t {
            chunks: chunks.as_ptr(),
            num_chunks: count,
        };
        // SAFETY: the address just allocated; its chunks outlive the call.
        let freed = unsafe { flex_memory_free(rt.0, &raw const address) };
        assert_eq!(freed, FLEX_SUCCESS);
    }
    stop.store(true, Ordering::Relaxed);
    asker.join().unwrap();
    assert_eq!(out_of_memory, 0, "allocations refused with 8 KiB free");
    drop(taken);
}

#[test]
fn allocation_reports_the_chunks_needed_when_capacity_is_short() {
    let rt = Rt::new();
    let state = handles::runtime(rt.0).unwrap();
    let free = state.runtime.free_memory_bytes();
    let mut chunks = [sys::flex_address_chunk_t::default(); 3];
    let mut count = 0usize;
    // 10000 bytes in 4096-byte regions: 4096 + 4096 + 1808.
    // SAFETY: room for 1 (then 3) chunks and a valid count pointer.
    let status =
        unsafe { flex_memory_allocate(rt.0, 10_000, chunks.as_mut_ptr(), 1, &raw mut count) };
    assert_eq!(status, sys::FLEX_ERROR_INVALID_ARGUMENT);
    assert_eq!(count, 3);
    assert!(last_error().contains("needs 3 chunks"), "{}", last_error());
    assert_eq!(
        state.runtime.free_memory_bytes(),
        free,
        "nothing stays allocated"
    );
    // SAFETY: as above.
    let status =
        unsafe { flex_memory_allocate(rt.0, 10_000, chunks.as_mut_ptr(), 3, &raw mut count) };
    assert_eq!(status, FLEX_SUCCESS);
    assert_eq!(count, 3);
    let sizes: Vec<u64> = chunks.iter().map(|c| c.size).collect();
    assert_eq!(sizes, vec![4096, 4096, 1808]);
    assert!(chunks.iter().all(|c| c.address.offset % 128 == 0));

    let address = flex_composite_address_t {
        chunks: chunks.as_ptr(),
        num_chunks: 3,
    };
    let partial = flex_composite_address_t {
        chunks: chunks.as_ptr(),
        num_chunks: 1,
    };
    // SAFETY: the addresses point into `chunks`; NULL is refused.
    unsafe {
        assert_eq!(
            flex_memory_free(rt.0, &raw const partial),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("not a live allocation"),
            "{}",
            last_error()
        );
        assert_eq!(flex_memory_free(rt.0, &raw const address), FLEX_SUCCESS);
        assert_eq!(
            flex_memory_free(rt.0, &raw const address),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            flex_memory_free(rt.0, ptr::null()),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            flex_memory_allocate(rt.0, 0, chunks.as_mut_ptr(), 3, &raw mut count),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            flex_memory_allocate(rt.0, 128, ptr::null_mut(), 3, &raw mut count),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            flex_memory_allocate(rt.0, 128, chunks.as_mut_ptr(), 3, ptr::null_mut()),
            sys::FLEX_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            flex_memory_allocate(rt.0, 2 << 20, chunks.as_mut_ptr(), 3, &raw mut count),
            sys::FLEX_ERROR_OUT_OF_MEMORY
        );
    }
    assert_eq!(state.runtime.free_memory_bytes(), free);
}

// ---------------------------------------------------------------------------
// Launches
// ---------------------------------------------------------------------------

#[test]
fn copies_fill_and_compute_move_the_right_bytes() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let recorder = Recorder::default();
    // Spans three regions: 4096 + 4096 + 1808.
    let big = rt.alloc(10_000);
    assert_eq!(big.0.len(), 3);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut back = vec![0u8; 10_000];
    assert_eq!(
        h2d(stream, &data, &big, completion(&recorder)),
        FLEX_SUCCESS
    );
    assert_eq!(
        d2h(stream, &big, &mut back, completion(&recorder)),
        FLEX_SUCCESS
    );

    let ints = rt.alloc(16);
    let raw = ints.raw();
    // SAFETY: `raw` points into `ints` for the call.
    let status = unsafe {
        flex_launch_fill(
            stream,
            &raw const raw,
            -2.7,
            sys::FLEX_DATA_FORMAT_INT32,
            1,
            completion(&recorder),
        )
    };
    assert_eq!(status, FLEX_SUCCESS);
    let mut filled = [0u8; 16];
    assert_eq!(
        d2h(stream, &ints, &mut filled, completion(&recorder)),
        FLEX_SUCCESS
    );

    // axpy: 2 * [1, 2] + [10, 20] = [12, 24].
    let (x, y, out, program) = (rt.alloc(8), rt.alloc(8), rt.alloc(8), rt.alloc(128));
    let xs = f32_le_bytes(&[1.0, 2.0]);
    let ys = f32_le_bytes(&[10.0, 20.0]);
    let descriptor = KernelDescriptor::axpy(2, 2.0, x.start(), y.start(), out.start()).to_bytes();
    assert_eq!(h2d(stream, &xs, &x, NO_COMPLETION), FLEX_SUCCESS);
    assert_eq!(h2d(stream, &ys, &y, NO_COMPLETION), FLEX_SUCCESS);
    assert_eq!(
        h2d(stream, &descriptor, &program, NO_COMPLETION),
        FLEX_SUCCESS
    );
    let raw = program.raw();
    assert_eq!(
        // SAFETY: `raw` points into `program` for the call.
        unsafe { flex_launch_compute(stream, &raw const raw, 0, completion(&recorder)) },
        FLEX_SUCCESS
    );
    let mut result = [0u8; 8];
    assert_eq!(d2h(stream, &out, &mut result, NO_COMPLETION), FLEX_SUCCESS);

    assert_eq!(sync(stream), FLEX_SUCCESS);
    assert_eq!(back, data);
    assert_eq!(filled, [0xFE, 0xFF, 0xFF, 0xFF].repeat(4).as_slice());
    assert_eq!(result.as_slice(), f32_le_bytes(&[12.0, 24.0]));
    assert_eq!(*recorder.statuses.lock(), vec![FLEX_SUCCESS; 5]);
    assert!(
        recorder
            .threads
            .lock()
            .iter()
            .all(|name| name.starts_with("spyre-mock-d0-e"))
    );
}

#[test]
fn bad_arguments_are_refused_before_anything_is_enqueued() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let recorder = Recorder::default();
    let good = rt.alloc(256);
    let mut misaligned = good.clone();
    misaligned.0[0].address.offset += 64;
    let empty = flex_composite_address_t {
        chunks: good.0.as_ptr(),
        num_chunks: 0,
    };
    let too_many = flex_composite_address_t {
        chunks: good.0.as_ptr(),
        num_chunks: 65,
    };
    let null_chunks = flex_composite_address_t {
        chunks: ptr::null(),
        num_chunks: 1,
    };
    let odd = rt.alloc(6);
    let (good_raw, misaligned_raw, odd_raw) = (good.raw(), misaligned.raw(), odd.raw());
    let bytes = [0u8; 256];
    let c = completion(&recorder);
    let src = bytes.as_ptr().cast::<c_void>();
    let fp32 = sys::FLEX_DATA_FORMAT_IEEE_FP32;
    type Launch<'a> = Box<dyn Fn() -> flex_status_t + 'a>;
    // Every pointer below is NULL or valid for the call, and every handle is
    // live; nothing is enqueued, so nothing outlives the call.
    let cases: Vec<(Launch<'_>, &str)> = vec![
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_h2d(stream, ptr::null(), &raw const good_raw, 0, c) }),
            "host_src is NULL",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_h2d(stream, src, ptr::null(), 0, c) }),
            "dst is NULL",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_h2d(stream, src, &raw const misaligned_raw, 0, c) }),
            "dst: chunk 0 starts at offset 64 of region 0, which is not a multiple of 128 bytes",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_h2d(stream, src, &raw const empty, 0, c) }),
            "dst has 0 chunks; a composite address has 1..=64",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe {
                flex_launch_d2h(stream, &raw const too_many, ptr::null_mut(), 0, c)
            }),
            "src has 65 chunks",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe {
                flex_launch_d2h(stream, &raw const good_raw, ptr::null_mut(), 0, c)
            }),
            "host_dst is NULL",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_compute(stream, &raw const null_chunks, 0, c) }),
            "program.chunks (0x0) is NULL or misaligned",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_host_callback(stream, None, ptr::null_mut(), 0, c) }),
            "host_fn is NULL",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_fill(stream, &raw const good_raw, 1.0, 9, 0, c) }),
            "unknown data format 9",
        ),
        (
            // SAFETY: as stated above `cases`.
            Box::new(|| unsafe { flex_launch_fill(stream, &raw const odd_raw, 1.0, fp32, 0, c) }),
            "fill of 6 bytes is not a whole number of Fp32 elements",
        ),
    ];
    for (launch, needle) in cases {
        assert_eq!(launch(), sys::FLEX_ERROR_INVALID_ARGUMENT, "{needle}");
        assert!(
            last_error().contains(needle),
            "{needle:?} not in {:?}",
            last_error()
        );
    }
    assert_eq!(sync(stream), FLEX_SUCCESS);
    assert!(
        recorder.statuses.lock().is_empty(),
        "a refused launch never calls its completion"
    );
}

#[test]
fn failures_are_sticky_and_completions_get_the_error() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let bystander = rt.create_stream(0);
    let recorder = Recorder::default();
    let program = rt.alloc(128);
    let garbage = [0xAB_u8; 128];
    assert_eq!(h2d(stream, &garbage, &program, NO_COMPLETION), FLEX_SUCCESS);
    let raw = program.raw();
    assert_eq!(
        // SAFETY: `raw` points into `program` for the call.
        unsafe { flex_launch_compute(stream, &raw const raw, 0, completion(&recorder)) },
        FLEX_SUCCESS
    );
    assert_eq!(sync(stream), sys::FLEX_ERROR_EXECUTION_FAILED);
    assert!(last_error().contains("bad magic"), "{}", last_error());
    assert_eq!(sync(stream), sys::FLEX_ERROR_EXECUTION_FAILED, "sticky");
    assert_eq!(query(stream), sys::FLEX_ERROR_EXECUTION_FAILED);
    assert_eq!(
        h2d(stream, &garbage, &program, completion(&recorder)),
        sys::FLEX_ERROR_STREAM_FAILED
    );
    assert_eq!(
        *recorder.statuses.lock(),
        vec![sys::FLEX_ERROR_EXECUTION_FAILED]
    );
    let mut has_error = -1;
    assert_eq!(
        // SAFETY: a live handle and a valid out pointer.
        unsafe { flex_runtime_has_stream_error(rt.0, &raw mut has_error) },
        FLEX_SUCCESS
    );
    assert_eq!(has_error, 1);
    assert_eq!(sync(bystander), FLEX_SUCCESS);

    // Destroying the failed stream leaves no stream with an error.
    // SAFETY: live handles.
    assert_eq!(unsafe { flex_stream_destroy(rt.0, stream) }, FLEX_SUCCESS);
    assert_eq!(
        // SAFETY: as above.
        unsafe { flex_runtime_has_stream_error(rt.0, &raw mut has_error) },
        FLEX_SUCCESS
    );
    assert_eq!(has_error, 0);
}

#[test]
fn a_failing_host_function_fails_the_stream_with_host_callback_failed() {
    let rt = Rt::new();
    let stream = rt.default_stream();
    let recorder = Recorder::default();
    let mut status = sys::FLEX_ERROR_INTERNAL;
    assert_eq!(
        host(
            stream,
            returns_status,
            (&raw mut status).cast(),
            completion(&recorder)
        ),
        FLEX_SUCCESS
    );
    assert_eq!(sync(stream), sys::FLEX_ERROR_HOST_CALLBACK_FAILED);
    assert!(
        last_error().contains("the host function returned FLEX_ERROR_INTERNAL (13)"),
        "{}",
        last_error()
    );
    assert_eq!(
        *recorder.statuses.lock(),
        vec![sys::FLEX_ERROR_HOST_CALLBACK_FAILED]
    );
    let mut needs = -1;
    assert_eq!(
        // SAFETY: a live handle and a valid out pointer.
        unsafe { flex_stream_needs_shutdown(stream, &raw mut needs) },
        FLEX_SUCCESS
    );
    assert_eq!(needs, 0);
}

/// Calls `flex_stream_synchronize` and `flex_runtime_destroy` on the
/// runtime whose callback this is and records their statuses.
struct Reentry {
    runtime: *mut flex_runtime_t,
    stream: *mut flex_stream_t,
    statuses: Mutex<Vec<flex_status_t>>,
}

unsafe extern "C" fn reenter(user_data: *mut c_void) -> flex_status_t {
    // SAFETY: the test passes a `Reentry` that outlives the operation.
    let reentry = unsafe { &*user_data.cast::<Reentry>() };
    // SAFETY: the handles are live; the calls are refused.
    let statuses = unsafe {
        [
            flex_stream_synchronize(reentry.stream),
            flex_runtime_destroy(reentry.runtime),
            flex_stream_query(reentry.stream),
        ]
    };
    reentry.statuses.lock().extend(statuses);
    FLEX_SUCCESS
}

unsafe extern "C" fn reenter_completion(user_data: *mut c_void, _status: flex_status_t) {
    // SAFETY: as for `reenter`; the return value is recorded inside.
    unsafe { reenter(user_data) };
}

#[test]
fn waiting_on_the_own_runtime_from_a_callback_is_refused() {
    for late in [None, Some(Duration::from_millis(1))] {
        let rt = Rt::with(Switches {
            late_completions: late,
            ..Switches::default()
        });
        let stream = rt.default_stream();
        let reentry = Reentry {
            runtime: rt.0,
            stream,
            statuses: Mutex::new(Vec::new()),
        };
        let data = ptr::from_ref(&reentry).cast_mut().cast();
        let c = flex_completion_t {
            fn_: Some(reenter_completion),
            user_data: data,
        };
        assert_eq!(host(stream, reenter, data, c), FLEX_SUCCESS);
        assert_eq!(sync(stream), FLEX_SUCCESS);
        let unsupported = sys::FLEX_ERROR_UNSUPPORTED;
        // From the host function, the query sees its own operation running;
        // from the completion, only the completion itself is pending.
        assert_eq!(
            *reentry.statuses.lock(),
            vec![
                unsupported,
                unsupported,
                FLEX_NOT_READY,
                unsupported,
                unsupported,
                FLEX_NOT_READY
            ],
            "late: {late:?}"
        );
        assert_eq!(rt.destroy(), FLEX_SUCCESS);
    }
}

// ---------------------------------------------------------------------------
// Switches at work
// ---------------------------------------------------------------------------

#[test]
fn undefined_status_calls_return_977_and_do_nothing() {
    let rt = Rt::with(Switches {
        undefined_status: vec!["flex_stream_query", "flex_launch_h2d", "flex_stream_get_id"],
        ..Switches::default()
    });
    let stream = rt.default_stream();
    let recorder = Recorder::default();
    let dst = rt.alloc(4);
    assert_eq!(query(stream), 977);
    assert!(
        last_error().contains("flex_stream_query returned status 977 on purpose"),
        "{}",
        last_error()
    );
    assert_eq!(h2d(stream, &[1, 2, 3, 4], &dst, completion(&recorder)), 977);
    let mut id = 55;
    // SAFETY: a live handle, a valid out pointer.
    assert_eq!(unsafe { flex_stream_get_id(stream, &raw mut id) }, 977);
    assert_eq!(id, 55);
    let mut back = [9u8; 4];
    assert_eq!(
        d2h(stream, &dst, &mut back, completion(&recorder)),
        FLEX_SUCCESS
    );
    assert_eq!(sync(stream), FLEX_SUCCESS);
    assert_eq!(
        *recorder.statuses.lock(),
        vec![FLEX_SUCCESS],
        "only the d2h completed"
    );
    assert_eq!(
        back, [0; 4],
        "the h2d never ran: memory never written reads as zeros"
    );
}

#[test]
fn the_nth_launch_of_every_stream_is_refused() {
    let rt = Rt::with(Switches {
        fail_launch: Some(2),
        ..Switches::default()
    });
    let recorder = Recorder::default();
    let mut wait = 0u64;
    for stream in [rt.default_stream(), rt.create_stream(1)] {
        let results: Vec<flex_status_t> = (0..3)
            .map(|_| {
                host(
                    stream,
                    sleepy,
                    (&raw mut wait).cast(),
                    completion(&recorder),
                )
            })
            .collect();
        assert_eq!(
            results,
            vec![FLEX_SUCCESS, sys::FLEX_ERROR_LAUNCH_FAILED, FLEX_SUCCESS]
        );
        assert_eq!(sync(stream), FLEX_SUCCESS);
    }
    assert_eq!(*recorder.statuses.lock(), vec![FLEX_SUCCESS; 4]);
}

#[test]
fn late_completions_come_from_the_delivery_thread_and_are_still_waited_for() {
    let delay = Duration::from_millis(40);
    let rt = Rt::with(Switches {
        late_completions: Some(delay),
        ..Switches::default()
    });
    let stream = rt.create_stream(0);
    let recorder = Recorder::default();
    let mut wait = 0u64;
    let start = Instant::now();
    for _ in 0..3 {
        assert_eq!(
            host(
                stream,
                sleepy,
                (&raw mut wait).cast(),
                completion(&recorder)
            ),
            FLEX_SUCCESS
        );
    }
    // No completion is delivered before `start + delay`: checked unless
    // this thread was paused that long.
    let pending = query(stream);
    if start.elapsed() < delay {
        assert_eq!(pending, FLEX_NOT_READY);
    }
    assert_eq!(sync(stream), FLEX_SUCCESS);
    assert!(
        start.elapsed() >= delay,
        "synchronize waited for the late completions"
    );
    assert_eq!(*recorder.statuses.lock(), vec![FLEX_SUCCESS; 3]);
    assert_eq!(
        *recorder.threads.lock(),
        vec!["spyre-mock-d0-late".to_owned(); 3]
    );
    assert_eq!(query(stream), FLEX_SUCCESS);

    // Destroy waits for pending late completions, then joins the thread.
    for _ in 0..2 {
        assert_eq!(
            host(
                stream,
                sleepy,
                (&raw mut wait).cast(),
                completion(&recorder)
            ),
            FLEX_SUCCESS
        );
    }
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
    assert_eq!(recorder.statuses.lock().len(), 5);
}

/// A completion that launches another host function with itself as its
/// completion on `stream`, until `stop`: work that never ends by itself.
struct Relauncher {
    stream: *mut flex_stream_t,
    stop: std::sync::atomic::AtomicBool,
    launched: AtomicUsize,
}

unsafe extern "C" fn relaunch(user_data: *mut c_void, _status: flex_status_t) {
    // SAFETY: the test passes a `Relauncher` that outlives every operation
    // (it destroys the runtime, which waits for them, first).
    let relauncher = unsafe { &*user_data.cast::<Relauncher>() };
    if !relauncher.stop.load(Ordering::SeqCst) {
        let again = flex_completion_t {
            fn_: Some(relaunch),
            user_data,
        };
        if host(
            relauncher.stream,
            returns_status,
            (&raw const SUCCESS).cast_mut().cast(),
            again,
        ) == FLEX_SUCCESS
        {
            relauncher.launched.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The status `returns_status` returns for the relaunched host functions.
static SUCCESS: i32 = FLEX_SUCCESS;

#[test]
fn synchronize_with_late_completions_waits_only_for_launches_before_it() {
    // Each completion launches the next operation of the stream: a
    // synchronize that waited until no completion of the stream was
    // pending (before the fix) never returned.
    let rt = Rt::with(Switches {
        late_completions: Some(Duration::from_millis(1)),
        ..Switches::default()
    });
    let stream = rt.create_stream(0);
    let relauncher = Relauncher {
        stream,
        stop: std::sync::atomic::AtomicBool::new(false),
        launched: AtomicUsize::new(0),
    };
    let first = flex_completion_t {
        fn_: Some(relaunch),
        user_data: ptr::from_ref(&relauncher).cast_mut().cast(),
    };
    assert_eq!(
        host(
            stream,
            returns_status,
            (&raw const SUCCESS).cast_mut().cast(),
            first
        ),
        FLEX_SUCCESS
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let address = stream as usize;
    let synchronizing = std::thread::spawn(move || {
        let _ = tx.send(sync(address as *mut flex_stream_t));
    });
    let synchronized = rx.recv_timeout(Duration::from_secs(20));
    relauncher.stop.store(true, Ordering::SeqCst);
    synchronizing.join().unwrap();
    assert_eq!(synchronized, Ok(FLEX_SUCCESS), "synchronize returned");
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
    assert!(relauncher.launched.load(Ordering::SeqCst) >= 1);
}

#[test]
fn destroy_waits_for_pending_work_and_completions() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let recorder = Recorder::default();
    let mut wait = 30u64;
    for _ in 0..3 {
        assert_eq!(
            host(
                stream,
                sleepy,
                (&raw mut wait).cast(),
                completion(&recorder)
            ),
            FLEX_SUCCESS
        );
    }
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
    assert_eq!(*recorder.statuses.lock(), vec![FLEX_SUCCESS; 3]);
}

/// A completion that launches `returns_status` onto `target`, completed
/// into `recorder`, and keeps that launch's status.
struct Forwarder {
    target: *mut flex_stream_t,
    launch: Mutex<Option<flex_status_t>>,
    recorder: Recorder,
}

unsafe extern "C" fn forward(user_data: *mut c_void, _status: flex_status_t) {
    // SAFETY: the test passes a `Forwarder` that outlives the runtime.
    let forwarder = unsafe { &*user_data.cast::<Forwarder>() };
    let status = host(
        forwarder.target,
        returns_status,
        (&raw const SUCCESS).cast_mut().cast(),
        completion(&forwarder.recorder),
    );
    *forwarder.launch.lock() = Some(status);
}

/// A host function that returns once the runtime at `user_data` has left
/// the handle table, or after 100 ms.
unsafe extern "C" fn returns_once_destroyed(user_data: *mut c_void) -> flex_status_t {
    let deadline = Instant::now() + Duration::from_millis(100);
    while handles::runtime(user_data.cast()).is_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    FLEX_SUCCESS
}

#[test]
fn destroy_waits_for_work_launched_after_its_check_passed_the_stream() {
    // The launch made during `drain_all`'s check stands for a completion's
    // launch onto a stream the check had found idle. Before the fix,
    // destroy took the runtime out of the handle table without waiting
    // for it; the operation ran as the runtime was dropped (it waits here
    // until then), and its completion's own launch failed with
    // INVALID_HANDLE.
    let rt = Rt::new();
    let (first, second) = (rt.create_stream(0), rt.create_stream(0));
    let forwarder = Forwarder {
        target: second,
        launch: Mutex::new(None),
        recorder: Recorder::default(),
    };
    let (first, user_data) = (first as usize, ptr::from_ref(&forwarder) as usize);
    let runtime = rt.0 as usize;
    handles::LAUNCH_DURING_DRAIN_CHECK.set(Some(Box::new(move || {
        let then = flex_completion_t {
            fn_: Some(forward),
            user_data: user_data as *mut c_void,
        };
        let status = host(
            first as *mut flex_stream_t,
            returns_once_destroyed,
            runtime as *mut c_void,
            then,
        );
        assert_eq!(status, FLEX_SUCCESS, "the launch during the check");
    })));
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
    assert!(
        handles::LAUNCH_DURING_DRAIN_CHECK.take().is_none(),
        "the check made the launch"
    );
    assert_eq!(*forwarder.launch.lock(), Some(FLEX_SUCCESS));
    assert_eq!(*forwarder.recorder.statuses.lock(), [FLEX_SUCCESS]);
}

#[test]
fn stream_destroy_waits_for_the_stream() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let recorder = Recorder::default();
    let mut wait = 30u64;
    assert_eq!(
        host(
            stream,
            sleepy,
            (&raw mut wait).cast(),
            completion(&recorder)
        ),
        FLEX_SUCCESS
    );
    // SAFETY: live handles.
    assert_eq!(unsafe { flex_stream_destroy(rt.0, stream) }, FLEX_SUCCESS);
    assert_eq!(*recorder.statuses.lock(), vec![FLEX_SUCCESS]);
}

#[test]
fn concurrent_launches_on_separate_streams_all_complete() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn count(_: *mut c_void, status: flex_status_t) {
        assert_eq!(status, FLEX_SUCCESS);
        CALLS.fetch_add(1, Ordering::SeqCst);
    }
    let rt = Arc::new(Rt::new());
    let streams: Vec<usize> = (0..4).map(|_| rt.create_stream(0) as usize).collect();
    let threads: Vec<_> = streams
        .into_iter()
        .map(|stream| {
            std::thread::spawn(move || {
                let mut wait = 0u64;
                let stream = stream as *mut flex_stream_t;
                for _ in 0..50 {
                    let c = flex_completion_t {
                        fn_: Some(count),
                        user_data: ptr::null_mut(),
                    };
                    assert_eq!(
                        host(stream, sleepy, (&raw mut wait).cast(), c),
                        FLEX_SUCCESS
                    );
                }
                assert_eq!(sync(stream), FLEX_SUCCESS);
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(CALLS.load(Ordering::SeqCst), 200);
}

// `Rt` is shared across threads only in the test above; the handle is an
// opaque value that every function accepts from any thread (flex.h).
// SAFETY: see above.
unsafe impl Send for Rt {}
// SAFETY: see above.
unsafe impl Sync for Rt {}

mod abi_1_1;
#[cfg(target_os = "linux")]
mod cancellation;

/// Queries `stream` from two threads, `rounds` times each, while `destroy`
/// runs on this thread; returns every status the queries saw after the
/// destroy had returned.
fn query_while(
    stream: *mut flex_stream_t,
    rounds: usize,
    destroy: impl FnOnce(),
) -> Vec<flex_status_t> {
    let stream = stream as usize;
    let destroyed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let destroyed = Arc::clone(&destroyed);
            std::thread::spawn(move || {
                let mut after = Vec::new();
                for _ in 0..rounds {
                    let was_destroyed = destroyed.load(Ordering::SeqCst);
                    let status = query(stream as *mut flex_stream_t);
                    if was_destroyed {
                        after.push(status);
                    }
                }
                after
            })
        })
        .collect();
    std::thread::yield_now();
    destroy();
    destroyed.store(true, Ordering::SeqCst);
    callers
        .into_iter()
        .flat_map(|caller| caller.join().expect("no caller panicked"))
        .collect()
}

/// Runs `race` with the number of queries each racing thread makes, as many
/// times as the race is repeated (fewer of both under Miri).
fn repeat_race(mut race: impl FnMut(usize)) {
    let (repeats, rounds) = if cfg!(miri) { (1, 20) } else { (20, 2_000) };
    for _ in 0..repeats {
        race(rounds);
    }
}

/// Lookups take no lock: threads querying a stream while another thread
/// destroys it see it live or `FLEX_ERROR_INVALID_HANDLE`, and only the
/// latter once the destroy has returned.
#[test]
fn queries_racing_a_stream_destroy_see_a_live_or_an_invalid_handle() {
    repeat_race(|rounds| {
        let rt = Rt::new();
        let stream = rt.create_stream(0);
        let after = query_while(stream, rounds, || {
            // SAFETY: live handles.
            assert_eq!(unsafe { flex_stream_destroy(rt.0, stream) }, FLEX_SUCCESS);
        });
        assert!(
            after.iter().all(|&s| s == sys::FLEX_ERROR_INVALID_HANDLE),
            "{after:?}"
        );
        assert_eq!(query(stream), sys::FLEX_ERROR_INVALID_HANDLE);
    });
}

/// A stream or an event created by a thread racing its runtime's destroy
/// (which flex.h forbids) is refused with `FLEX_ERROR_INVALID_HANDLE` or
/// created and then destroyed with the runtime: the destroy returns.
/// Before the fix a create that had found the runtime live registered its
/// handle after the destroy had taken the runtime out of the table: the
/// destroy waited for that entry's reference for ever. (The handles are
/// not queried afterwards: their addresses are freed with the runtime and
/// may be another test's by then.)
#[test]
fn creates_racing_a_runtime_destroy_never_hold_it_up() {
    repeat_race(|rounds| {
        let rt = Rt::new();
        let runtime = rt.0 as usize;
        let destroyed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let creator = {
            let destroyed = Arc::clone(&destroyed);
            std::thread::spawn(move || {
                let runtime = runtime as *mut flex_runtime_t;
                let mut after = 0;
                while after < rounds.min(200) {
                    if destroyed.load(Ordering::SeqCst) {
                        after += 1;
                    }
                    let mut stream = ptr::null_mut();
                    let mut event = ptr::null_mut();
                    // SAFETY: valid out pointers; any runtime value is accepted.
                    let statuses = unsafe {
                        (
                            flex_runtime_create_stream(runtime, 0, 0, 0, &raw mut stream),
                            flex_event_create(runtime, 0, &raw mut event),
                        )
                    };
                    for status in [statuses.0, statuses.1] {
                        assert!(
                            [FLEX_SUCCESS, sys::FLEX_ERROR_INVALID_HANDLE].contains(&status),
                            "a create returned {status}: {}",
                            last_error()
                        );
                    }
                }
            })
        };
        std::thread::yield_now();
        let (done, wait_done) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(rt.destroy()).unwrap());
        assert_eq!(
            wait_done.recv_timeout(Duration::from_secs(10)),
            Ok(FLEX_SUCCESS),
            "flex_runtime_destroy did not return"
        );
        destroyed.store(true, Ordering::SeqCst);
        creator.join().expect("the creator did not panic");
    });
}

/// A host function that spins (yielding) until the `AtomicBool` at
/// `user_data` is set, then returns success.
unsafe extern "C" fn held_until_set(user_data: *mut c_void) -> flex_status_t {
    // SAFETY: the tests pass an `AtomicBool` that outlives the operation.
    let gate = unsafe { &*user_data.cast::<std::sync::atomic::AtomicBool>() };
    while !gate.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    FLEX_SUCCESS
}

/// A host function that counts itself in the `AtomicUsize` at `user_data`.
unsafe extern "C" fn counts_its_run(user_data: *mut c_void) -> flex_status_t {
    // SAFETY: the tests pass an `AtomicUsize` that outlives every operation
    // that uses it (each test destroys and drains the stream first).
    unsafe { &*user_data.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
    FLEX_SUCCESS
}

/// flex.h: `flex_stream_destroy` returns "after its pending work has
/// finished and its completion callbacks have returned". A launch made
/// while the destroy waits for the stream's work is refused with
/// `FLEX_ERROR_INVALID_HANDLE` (the stream is closed first); every launch
/// that was accepted has run by the time the destroy returns. Before the
/// fix the stream took launches until its handle was retired, after the
/// wait: here every launch was accepted while the held operation kept the
/// destroy waiting, and in a race a launch could run after the destroy
/// returned.
#[test]
fn launches_while_a_stream_is_destroyed_are_refused_or_waited_for() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let gate = std::sync::atomic::AtomicBool::new(false);
    let ran = AtomicUsize::new(0);
    let gate_data = ptr::from_ref(&gate).cast_mut().cast();
    let ran_data = ptr::from_ref(&ran).cast_mut().cast();
    assert_eq!(
        host(stream, held_until_set, gate_data, NO_COMPLETION),
        FLEX_SUCCESS
    );
    let handles = (rt.0 as usize, stream as usize);
    std::thread::scope(|scope| {
        let destroy = scope.spawn(move || {
            let (rt, stream) = (
                handles.0 as *mut flex_runtime_t,
                handles.1 as *mut flex_stream_t,
            );
            // SAFETY: live handles.
            unsafe { flex_stream_destroy(rt, stream) }
        });
        // Launch until one is refused: the destroy has closed the stream.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut accepted = 0usize;
        let refused = loop {
            match host(stream, counts_its_run, ran_data, NO_COMPLETION) {
                FLEX_SUCCESS => accepted += 1,
                status => break Some(status),
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        let message = last_error();
        let ran_while_held = ran.load(Ordering::SeqCst);
        // Released before anything is asserted: a failed assertion must not
        // leave the destroy waiting for ever.
        gate.store(true, Ordering::Release);
        let destroyed = destroy.join().unwrap();
        assert_eq!(
            refused,
            Some(sys::FLEX_ERROR_INVALID_HANDLE),
            "a launch while the destroy waits must be refused ({accepted} were accepted)"
        );
        assert!(message.contains("destroyed"), "{message}");
        assert_eq!(ran_while_held, 0, "the held operation is first");
        assert_eq!(destroyed, FLEX_SUCCESS);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            accepted,
            "every accepted launch has run when the destroy returns"
        );
    });
    assert_eq!(
        host(stream, counts_its_run, ran_data, NO_COMPLETION),
        sys::FLEX_ERROR_INVALID_HANDLE
    );
}

/// Threads launching on a stream while another destroys it: once the
/// destroy has returned, no host function of the stream runs any more, and
/// every launch that returned `FLEX_SUCCESS` has run.
#[test]
fn no_launch_racing_a_stream_destroy_runs_after_it() {
    let repeats = if cfg!(miri) { 2 } else { 200 };
    for _ in 0..repeats {
        let rt = Rt::new();
        let stream = rt.create_stream(0) as usize;
        let ran = Arc::new(AtomicUsize::new(0));
        let launchers: Vec<_> = (0..2)
            .map(|_| {
                let ran = Arc::clone(&ran);
                std::thread::spawn(move || {
                    let data = Arc::as_ptr(&ran).cast_mut().cast();
                    let mut accepted = 0usize;
                    while host(
                        stream as *mut flex_stream_t,
                        counts_its_run,
                        data,
                        NO_COMPLETION,
                    ) == FLEX_SUCCESS
                    {
                        accepted += 1;
                    }
                    accepted
                })
            })
            .collect();
        std::thread::yield_now();
        // SAFETY: live handles.
        let status = unsafe { flex_stream_destroy(rt.0, stream as *mut flex_stream_t) };
        assert_eq!(status, FLEX_SUCCESS);
        let ran_at_return = ran.load(Ordering::SeqCst);
        let accepted: usize = launchers.into_iter().map(|l| l.join().unwrap()).sum();
        assert_eq!(
            ran_at_return, accepted,
            "accepted launches ran before the destroy returned"
        );
        drop(rt);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            accepted,
            "nothing ran after the destroy"
        );
    }
}

/// A runtime destroyed while other threads still call on its stream (which
/// flex.h forbids) does not take the state from under them: the calls in
/// flight finish on the snapshot they hold. (After the destroy the freed
/// address may name another test's stream, so the statuses are not
/// checked; the test is that nothing crashes, and Miri checks the memory.)
#[test]
fn queries_racing_a_runtime_destroy_do_not_use_freed_state() {
    repeat_race(|rounds| {
        let rt = Rt::new();
        let stream = rt.create_stream(0);
        query_while(stream, rounds, || assert_eq!(rt.destroy(), FLEX_SUCCESS));
    });
}

/// Makes an event of `rt` (untimed).
fn new_event(rt: &Rt) -> *mut sys::flex_event_t {
    let mut event = ptr::null_mut();
    // SAFETY: a live runtime and a valid out pointer.
    let status = unsafe { flex_event_create(rt.0, 0, &raw mut event) };
    assert_eq!(status, FLEX_SUCCESS);
    event
}

/// Runs `body` in a process of its own, the test binary run again for the
/// test `name` alone (under Miri, which cannot run a process, in this
/// one), for tests that other tests' threads would disturb:
///
/// - A test that forks: other tests' threads start and end threads at any
///   time, and a child forked while another thread starts or ends one
///   inherits a lock of the standard library's held (its threads'
///   stack-overflow handling takes a process-wide lock at each thread's
///   start and end), and hangs when it starts a thread: the child's
///   runtime's engines did, in about one run of the whole test binary in
///   three with 8 test threads.
/// - A test of when an update waits: every thread's read sections count,
///   other tests' too.
pub(crate) fn alone(name: &str, body: impl FnOnce()) {
    const MARKER: &str = "SPYRE_MOCK_CAPI_TEST_ALONE";
    if cfg!(miri) || std::env::var(MARKER).as_deref() == Ok(name) {
        body();
        return;
    }
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(MARKER, name)
        .output()
        .expect("the test binary can run again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name} alone ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `child` in a `fork()`ed child (which then `_exit`s with 0, or 101
/// if `child` panicked) and returns its exit code, or `None` if it had not
/// ended after 10 s (it is killed then).
fn in_forked_child(child: impl FnOnce()) -> Option<i32> {
    // SAFETY: `fork` has no memory-safety preconditions; the child runs only
    // `child` (calls of this library, whose locks are held across the fork)
    // and `_exit`s without unwinding or running exit handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)) {
            Ok(()) => 0,
            Err(_) => 101,
        };
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut status = 0;
        // SAFETY: `pid` is this process's child; `status` is a valid out pointer.
        let waited = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
        if waited == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            });
        }
        if Instant::now() > deadline {
            // SAFETY: `pid` is this process's child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &raw mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `fork()` while other threads are inside the library, querying, creating
/// and destroying events (the event table's lock) and creating streams
/// (the handle writers' lock): every child can make a runtime and an event
/// of its own and use them, and gets `RUNTIME_FAILED` from the parent's
/// event. Before the library held its locks across the fork, 19 of 20
/// children hung on a lock held at the fork by a thread that does not exist
/// in the child.
#[test]
#[cfg_attr(miri, ignore = "fork() is outside Miri")]
fn a_fork_while_other_threads_are_inside_the_library_leaves_the_child_working() {
    alone(
        "tests::a_fork_while_other_threads_are_inside_the_library_leaves_the_child_working",
        forks_of_a_fork_while_other_threads_are_inside_the_library_leaves_the_child_working,
    );
}

fn forks_of_a_fork_while_other_threads_are_inside_the_library_leaves_the_child_working() {
    let rt = Arc::new(Rt::new());
    let event = new_event(&rt) as usize;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Forks only once every busy thread has started: a thread still
    // starting holds the standard library's lock of thread starts, which
    // the child's engines would wait for (see `alone`).
    let started = Arc::new(std::sync::Barrier::new(4));
    let busy: Vec<_> = (0..3)
        .map(|role| {
            let (rt, stop, started) = (Arc::clone(&rt), Arc::clone(&stop), Arc::clone(&started));
            std::thread::spawn(move || {
                started.wait();
                while !stop.load(Ordering::Relaxed) {
                    match role {
                        // SAFETY: a live event.
                        0 => assert_eq!(unsafe { flex_event_query(event as *mut _) }, FLEX_SUCCESS),
                        1 => {
                            let made = new_event(&rt);
                            // SAFETY: live handles of one runtime.
                            assert_eq!(unsafe { flex_event_destroy(rt.0, made) }, FLEX_SUCCESS);
                        }
                        _ => drop(rt.create_stream(0)),
                    }
                }
            })
        })
        .collect();
    started.wait();
    let outcomes: Vec<Option<i32>> = (0..20)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(2));
            in_forked_child(|| {
                // SAFETY: any pointer value is accepted.
                let parents = unsafe { flex_event_query(event as *mut _) };
                assert_eq!(parents, sys::FLEX_ERROR_RUNTIME_FAILED);
                let own = Rt::new();
                let made = new_event(&own);
                // SAFETY: a live event of the child's runtime.
                assert_eq!(unsafe { flex_event_query(made) }, FLEX_SUCCESS);
                // SAFETY: live handles of one runtime.
                assert_eq!(unsafe { flex_event_destroy(own.0, made) }, FLEX_SUCCESS);
                std::mem::forget(own);
            })
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    for thread in busy {
        thread.join().unwrap();
    }
    assert!(outcomes.iter().all(|o| *o == Some(0)), "{outcomes:?}");
}

/// `fork()` after the parent's runtimes ran work, their engines idle
/// (parked), no other thread inside the library: each child makes a
/// runtime of its own (flex.h allows it) and runs 100 host functions on
/// it. Before the device's locks were the standard library's, a child's
/// threads met the parent's parked threads left in `parking_lot`'s
/// process-wide table (lost wake-ups, or a bucket lock held for ever): 14
/// of these 100 children hung, 4 of 100 in a release build with one
/// parent runtime.
#[test]
#[cfg_attr(miri, ignore = "fork() is outside Miri")]
fn a_child_forked_after_the_parents_work_runs_work_on_a_runtime_of_its_own() {
    alone(
        "tests::a_child_forked_after_the_parents_work_runs_work_on_a_runtime_of_its_own",
        forks_of_a_child_forked_after_the_parents_work_runs_work_on_a_runtime_of_its_own,
    );
}

fn forks_of_a_child_forked_after_the_parents_work_runs_work_on_a_runtime_of_its_own() {
    // Several runtimes: more parked threads left behind in each child.
    let runtimes: Vec<Rt> = (0..4).map(|_| Rt::new()).collect();
    let parents: Vec<_> = runtimes.iter().map(|rt| rt.create_stream(0)).collect();
    let mut status = FLEX_SUCCESS;
    let outcomes: Vec<Option<i32>> = (0..100)
        .map(|_| {
            for &stream in &parents {
                assert_eq!(
                    host(
                        stream,
                        returns_status,
                        (&raw mut status).cast(),
                        NO_COMPLETION
                    ),
                    FLEX_SUCCESS
                );
                assert_eq!(sync(stream), FLEX_SUCCESS);
            }
            in_forked_child(|| {
                let own = Rt::new();
                let stream = own.create_stream(0);
                let mut ok = FLEX_SUCCESS;
                for _ in 0..100 {
                    assert_eq!(
                        host(stream, returns_status, (&raw mut ok).cast(), NO_COMPLETION),
                        FLEX_SUCCESS
                    );
                }
                assert_eq!(sync(stream), FLEX_SUCCESS);
                assert_eq!(own.destroy(), FLEX_SUCCESS);
            })
        })
        .collect();
    let failed: Vec<_> = outcomes.iter().filter(|o| **o != Some(0)).collect();
    assert!(
        failed.is_empty(),
        "children hung (None) or failed: {failed:?}"
    );
}

//! The software device as a flex runtime library: every function of
//! `flex.h`, exported with C linkage from spyre-mock's `cdylib`
//! (`libspyre_mock.so`), so that the hardware path — flex-sys's loader and
//! flex-rt's FFI backend — runs against a real dynamically loaded library in
//! every `cargo test`.
//!
//! The functions are also plain Rust functions of this module, callable in
//! process (the unit tests do); each is `unsafe` because it takes raw
//! pointers whose validity `flex.h` leaves to the caller. Their signatures
//! are bindgen's from flex-sys (a unit test assigns each one to the matching
//! field of [`flex_sys::bindings::FlexApi`], so a drift does not compile).
//!
//! # Behaviour
//!
//! Every call follows `flex.h` on the device of this crate: a runtime is a
//! [`MockRuntime`](crate::MockRuntime), a stream one of its
//! [`MockStream`](crate::MockStream)s, and every launch goes through
//! [`MockStream::enqueue`](crate::MockStream::enqueue) with an
//! [`Op`] built from the raw pointers, so the C path has the same
//! validation, scheduling, completion and error rules as the Rust one.
//!
//! - **Handles.** A `flex_runtime_t *` is the address of a boxed handle; a
//!   `flex_stream_t *` is the address of a stream owned by its runtime.
//!   Every call looks the handle up in a process-wide table of live handles
//!   before using it, so NULL, a foreign pointer, a destroyed stream or a
//!   destroyed runtime is `FLEX_ERROR_INVALID_HANDLE`, never a dereference
//!   (as with any pointer handle, an address freed by
//!   `flex_runtime_destroy` may later be reused by a new runtime or stream
//!   of this library).
//! - **Arguments.** NULL, misaligned or out-of-range arguments are
//!   `FLEX_ERROR_INVALID_ARGUMENT`; out-parameters are written only on
//!   success (and `*num_chunks_out` when the capacity is too small, as
//!   `flex.h` says).
//! - **Errors.** Every failure sets the calling thread's last-error message,
//!   which [`flex_get_last_error_message`] returns (`""` on a thread where
//!   nothing has failed; never NULL). Success leaves it unchanged.
//! - **Completions** are called exactly once for every launch that returned
//!   `FLEX_SUCCESS`, on an engine thread of the runtime (or its delivery
//!   thread, see `SPYRE_MOCK_LATE_COMPLETIONS_MS`), never inside the launch;
//!   a launch that returns anything else never calls its completion.
//! - **Host functions** run on an engine thread in stream order; a status
//!   other than `FLEX_SUCCESS` fails the operation and the stream with
//!   `FLEX_ERROR_HOST_CALLBACK_FAILED`.
//! - **Forbidden re-entry.** `flex_stream_synchronize`,
//!   `flex_stream_destroy` and `flex_runtime_destroy` called from a
//!   completion or host function of the same runtime return
//!   `FLEX_ERROR_UNSUPPORTED` instead of waiting for themselves.
//! - **Destroy.** `flex_stream_destroy` waits for the stream's work and
//!   completions, then retires the handle (the stream's memory stays with
//!   its runtime). `flex_runtime_destroy` waits for all work and every
//!   completion — including work that completions launched — then frees the
//!   runtime and joins all its threads: nothing of it runs after the call
//!   returns.
//! - **Panics** never cross the C boundary: each export runs under
//!   `catch_unwind`, and a panic becomes `FLEX_ERROR_INTERNAL` with the panic
//!   message as the last error.
//!
//! # Environment
//!
//! The library reads its configuration from the environment:
//! `flex_get_api_version` reads `SPYRE_MOCK_ABI_VERSION` on every call;
//! `flex_get_device_count` and `flex_runtime_create` read the device
//! variables and `SPYRE_MOCK_UNDEFINED_STATUS` on every call; a runtime
//! takes every other switch when it is created and keeps it. Values are
//! trimmed; unset or empty means the default. A malformed device variable or
//! switch makes `flex_get_device_count` and `flex_runtime_create` fail with
//! `FLEX_ERROR_RUNTIME_FAILED`, naming the variable and its value.
//!
//! | variable | effect | default |
//! |---|---|---|
//! | `SPYRE_MOCK_DEVICES`, `SPYRE_MOCK_MEMORY_BYTES`, `SPYRE_MOCK_REGION_BYTES`, `SPYRE_MOCK_ENGINES`, `SPYRE_MOCK_OP_LATENCY_US`, `SPYRE_MOCK_COPY_BANDWIDTH` | the device, as [`MockConfig::from_lookup`](crate::MockConfig::from_lookup) reads them (see the [crate docs](crate#environment)) | as there |
//! | `SPYRE_MOCK_ABI_VERSION=M.m` | `flex_get_api_version` reports version `M.m` (each 0..=65535), e.g. `2.0` (a loader must refuse it) or `1.7` (a newer minor, accepted); a malformed value reports `0.0` | the header's version |
//! | `SPYRE_MOCK_UNDEFINED_STATUS=<call>[,<call>…]` | each named function (any of the 20 that return a status, e.g. `flex_stream_query`, `flex_launch_h2d`) returns status 977, which `flex.h` does not define, and does nothing else: no out-parameter is written, a launch enqueues nothing and never calls its completion, a destroy destroys nothing | none |
//! | `SPYRE_MOCK_FAIL_LAUNCH=N` | on every stream of the runtime, the `N`th launch that passes the argument and stream-state checks is refused with `FLEX_ERROR_LAUNCH_FAILED` (enqueues nothing, never calls its completion); earlier and later launches are unaffected (`MockStream::fail_nth_launch`); 0 is off | off |
//! | `SPYRE_MOCK_LATE_COMPLETIONS_MS=N` (0..=10000) | completions are delivered `N` ms after their operation finished, from a delivery thread of the runtime (`spyre-mock-d<device>-late`), in order; the stream runs its next operation meanwhile. Synchronize, query and destroy still count such completions as pending, so `flex_stream_synchronize` and `flex_runtime_destroy` return only after they have returned | off |
//! | `SPYRE_MOCK_FAIL_RUNTIME_CREATE=1` | `flex_runtime_create` on an existing device fails with `FLEX_ERROR_RUNTIME_FAILED`; `0` is off | off |

mod boundary;
mod host;
mod late;
mod registry;
mod switches;

#[cfg(test)]
mod tests;

use std::ffi::{c_char, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use flex_rt::{
    AddressChunk, Completion, CompositeAddress, DataFormat, LaunchOptions, MAX_ADDRESS_CHUNKS,
    Runtime, Stream, StreamMode, StreamPriority,
};
use flex_sys::bindings::{
    FLEX_ERROR_NO_DEVICE, FLEX_ERROR_RUNTIME_FAILED, FLEX_ERROR_UNSUPPORTED, FLEX_NOT_READY,
    FLEX_SUCCESS, flex_address_chunk_t, flex_completion_t, flex_composite_address_t,
    flex_data_format_t, flex_host_fn, flex_runtime_t, flex_status_t, flex_stream_mode_t,
    flex_stream_priority_t, flex_stream_t,
};

use self::boundary::{CallResult, Failure, boundary, last_error_ptr, status_name};
use self::host::{CCompletion, CHostFn, RawSink, RawSource, in_callback_of};
use self::late::LateThread;
use self::registry::RuntimeState;
pub use self::switches::{
    ENV_ABI_VERSION, ENV_FAIL_LAUNCH, ENV_FAIL_RUNTIME_CREATE, ENV_LATE_COMPLETIONS_MS,
    ENV_UNDEFINED_STATUS, UNDEFINED_STATUS,
};
use self::switches::{Switches, process_env};
use crate::{MockConfig, MockSystem, Op};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A checked out-parameter: non-null and aligned for `T`.
fn out_param<T>(ptr: *mut T, name: &str) -> Result<NonNull<T>, Failure> {
    let ptr =
        NonNull::new(ptr).ok_or_else(|| Failure::invalid_argument(format!("{name} is NULL")))?;
    if !ptr.as_ptr().is_aligned() {
        return Err(Failure::invalid_argument(format!(
            "{name} ({ptr:p}) is not aligned for its type"
        )));
    }
    Ok(ptr)
}

/// Reads a `flex_composite_address_t` argument into a checked address.
///
/// # Safety
/// `ptr` is NULL or points to a `flex_composite_address_t` that is valid for
/// reads during this call, and whose `chunks` is NULL or points to
/// `num_chunks` valid chunks (flex.h: "The array is read during the call
/// that receives it").
unsafe fn read_address(
    ptr: *const flex_composite_address_t,
    name: &str,
) -> Result<CompositeAddress, Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid_argument(format!("{name} is NULL")));
    }
    if !ptr.is_aligned() {
        return Err(Failure::invalid_argument(format!(
            "{name} ({ptr:p}) is not aligned for flex_composite_address_t"
        )));
    }
    // SAFETY: non-null and aligned (checked above), and valid for reads by
    // this function's contract.
    let raw = unsafe { ptr.read() };
    if raw.num_chunks == 0 || raw.num_chunks > MAX_ADDRESS_CHUNKS {
        return Err(Failure::invalid_argument(format!(
            "{name} has {} chunks; a composite address has 1..={MAX_ADDRESS_CHUNKS}",
            raw.num_chunks
        )));
    }
    if raw.chunks.is_null() || !raw.chunks.is_aligned() {
        return Err(Failure::invalid_argument(format!(
            "{name}.chunks ({:p}) is NULL or misaligned",
            raw.chunks
        )));
    }
    // SAFETY: `chunks` is non-null and aligned (checked above) and points to
    // `num_chunks` chunks by this function's contract; `num_chunks` is at
    // most 64, so the slice is small. The slice is dropped before returning.
    let chunks = unsafe { std::slice::from_raw_parts(raw.chunks, raw.num_chunks) };
    let chunks: Vec<AddressChunk> = chunks.iter().copied().map(AddressChunk::from_raw).collect();
    CompositeAddress::new(chunks)
        .map_err(|err| Failure::invalid_argument(format!("{name}: {}", err.message())))
}

/// The size of a device address as a host length.
fn host_len(address: &CompositeAddress, name: &str) -> Result<usize, Failure> {
    usize::try_from(address.total_size())
        .ok()
        .filter(|&len| isize::try_from(len).is_ok())
        .ok_or_else(|| {
            Failure::invalid_argument(format!(
                "{name} has {} bytes, more than host memory can hold",
                address.total_size()
            ))
        })
}

/// The status a completion is called with.
fn status_of(result: &flex_rt::Result<()>) -> flex_status_t {
    match result {
        Ok(()) => FLEX_SUCCESS,
        Err(err) => err.status().0,
    }
}

/// The device completion that calls the caller's C completion: directly on
/// the engine thread, or through the delivery thread when completions are
/// late. `None` when the caller gave none.
fn completion_for(
    state: &Arc<RuntimeState>,
    stream: u64,
    completion: flex_completion_t,
) -> Option<Completion> {
    let completion = CCompletion::new(completion, state.key())?;
    Some(match &state.late {
        None => Box::new(move |result| completion.call(status_of(&result))),
        Some(late) => {
            let reservation = late.queue().reserve(stream);
            Box::new(move |result| reservation.deliver(completion, status_of(&result)))
        }
    })
}

/// The common part of every launch: validates the stream, applies the
/// undefined-status switch, builds the operation (argument checks) and
/// enqueues it.
fn launch(
    call: &'static str,
    stream: *mut flex_stream_t,
    pipeline_barrier: i32,
    completion: flex_completion_t,
    build: impl FnOnce(&Arc<RuntimeState>) -> Result<Op, Failure>,
) -> CallResult {
    let stream = registry::stream(stream)?;
    stream.state.check_switch(call)?;
    let op = build(&stream.state)?;
    let device = stream.mock()?;
    let options = LaunchOptions {
        pipeline_barrier: pipeline_barrier != 0,
        completion: completion_for(&stream.state, stream.id, completion),
    };
    device.enqueue(op, options)?;
    Ok(FLEX_SUCCESS)
}

/// Refuses a call that would wait for the callback this thread is running.
fn refuse_in_callback(state: &Arc<RuntimeState>, call: &str) -> Result<(), Failure> {
    if in_callback_of(state.key()) {
        Err(Failure::new(
            FLEX_ERROR_UNSUPPORTED,
            format!(
                "{call} was called from a completion or host function of the same runtime, which flex.h forbids; it would wait for itself"
            ),
        ))
    } else {
        Ok(())
    }
}

/// Creates the state of a runtime on `logical_device` with `config` and
/// `switches` (what `flex_runtime_create` does after reading the
/// environment).
fn start_runtime(
    logical_device: i32,
    config: MockConfig,
    switches: Switches,
) -> Result<Arc<RuntimeState>, Failure> {
    let devices = config.devices();
    let Ok(device) = u32::try_from(logical_device) else {
        return Err(Failure::new(
            FLEX_ERROR_NO_DEVICE,
            format!(
                "logical device {logical_device} is negative; this library has devices 0..{devices}"
            ),
        ));
    };
    if switches.fail_runtime_create && device < devices {
        return Err(Failure::new(
            FLEX_ERROR_RUNTIME_FAILED,
            format!(
                "device {device} could not be opened (fault injected by {ENV_FAIL_RUNTIME_CREATE}=1)"
            ),
        ));
    }
    let runtime = MockSystem::with_config(config).create_mock_runtime(device)?;
    if let Some(n) = switches.fail_launch {
        runtime.default_mock_stream().fail_nth_launch(n);
    }
    let late = match switches.late_completions {
        Some(delay) => Some(start_late_thread(device, delay)?),
        None => None,
    };
    Ok(Arc::new(RuntimeState {
        runtime,
        late,
        switches,
        retired: Default::default(),
    }))
}

fn start_late_thread(device: u32, delay: Duration) -> Result<LateThread, Failure> {
    LateThread::start(format!("spyre-mock-d{device}-late"), delay).map_err(|err| {
        Failure::new(
            FLEX_ERROR_RUNTIME_FAILED,
            format!("cannot start the completion delivery thread: {err}"),
        )
    })
}

/// Waits until `state` has no other owner (calls that looked the runtime up
/// before it left the handle table finish quickly) and returns it.
fn sole_owner(mut state: Arc<RuntimeState>) -> RuntimeState {
    loop {
        match Arc::try_unwrap(state) {
            Ok(state) => return state,
            Err(shared) => {
                state = shared;
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

/// The environment switches for a call without a runtime.
fn env_switches() -> Result<Switches, Failure> {
    Switches::from_lookup(process_env)
        .map_err(|message| Failure::new(FLEX_ERROR_RUNTIME_FAILED, message))
}

/// The device configuration from the environment.
fn env_config() -> Result<MockConfig, Failure> {
    switches::config(process_env)
        .map_err(|message| Failure::new(FLEX_ERROR_RUNTIME_FAILED, message))
}

// ---------------------------------------------------------------------------
// Library
// ---------------------------------------------------------------------------

/// `flex_get_api_version`: the header's version packed as
/// `FLEX_MAKE_API_VERSION`, or `SPYRE_MOCK_ABI_VERSION` when set (see the
/// [module docs](self#environment)). Never fails (were reading the
/// environment to panic, it would report `0.0`, which loaders refuse).
///
/// # Safety
/// None: it takes no arguments and may be called at any time from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_get_api_version() -> u32 {
    std::panic::catch_unwind(|| switches::abi_version(process_env)).unwrap_or(0)
}

/// `flex_status_string`: the flex.h name of `status`, or
/// `"FLEX_UNKNOWN_STATUS"`. A static string; never NULL.
///
/// # Safety
/// None: any value may be passed, from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_status_string(status: flex_status_t) -> *const c_char {
    status_name(status).as_ptr()
}

/// `flex_get_last_error_message`: the calling thread's last-error message,
/// `""` if no call has failed on this thread. Valid until the next flex call
/// on this thread; never NULL.
///
/// # Safety
/// None: it takes no arguments. The caller must copy the string before its
/// next flex call on the same thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_get_last_error_message() -> *const c_char {
    std::panic::catch_unwind(last_error_ptr).unwrap_or_else(|_| c"".as_ptr())
}

/// `flex_get_device_count`: the number of devices configured by
/// `SPYRE_MOCK_DEVICES` (default 1).
///
/// # Safety
/// `count` is NULL or valid for writing an `int32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_get_device_count(count: *mut i32) -> flex_status_t {
    const CALL: &str = "flex_get_device_count";
    boundary(CALL, || {
        registry::undefined_status_check(&env_switches()?, CALL)?;
        let out = out_param(count, "count")?;
        let devices = env_config()?.devices();
        let devices = i32::try_from(devices)
            .map_err(|_| Failure::internal(format!("{devices} devices do not fit int32_t")))?;
        // SAFETY: flex.h: `count` points to a writable `int32_t` when it is
        // not NULL; `out_param` checked non-null and alignment.
        unsafe { out.write(devices) };
        Ok(FLEX_SUCCESS)
    })
}

// ---------------------------------------------------------------------------
// Runtime
// ---------------------------------------------------------------------------

/// `flex_runtime_create`: a runtime with fresh device state (memory, default
/// stream, engine threads) on `logical_device`, configured by the
/// environment at this call (see the [module docs](self#environment)).
///
/// # Safety
/// `runtime_out` is NULL or valid for writing a `flex_runtime_t *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_create(
    logical_device: i32,
    runtime_out: *mut *mut flex_runtime_t,
) -> flex_status_t {
    const CALL: &str = "flex_runtime_create";
    boundary(CALL, || {
        let switches = env_switches()?;
        registry::undefined_status_check(&switches, CALL)?;
        let out = out_param(runtime_out, "runtime_out")?;
        let state = start_runtime(logical_device, env_config()?, switches)?;
        let handle = registry::register_runtime(state);
        // SAFETY: flex.h: `runtime_out` points to a writable
        // `flex_runtime_t *` when not NULL; checked non-null and aligned.
        unsafe { out.write(handle) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_runtime_destroy`: waits for all work on all streams and every
/// completion (including work launched by completions meanwhile), then
/// frees the runtime, its streams and memory, and joins its threads.
///
/// # Safety
/// `runtime` is any value; live handles are recognised without
/// dereferencing. flex.h: not from a callback of this runtime (refused with
/// `FLEX_ERROR_UNSUPPORTED`), and not while another thread uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_destroy(runtime: *mut flex_runtime_t) -> flex_status_t {
    const CALL: &str = "flex_runtime_destroy";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        refuse_in_callback(&state, CALL)?;
        state.check_switch(CALL)?;
        state.drain_all();
        drop(state);
        let state = registry::unregister_runtime(runtime).ok_or_else(|| {
            Failure::invalid_handle(format!(
                "{runtime:p} was destroyed by another thread during this call"
            ))
        })?;
        drop(sole_owner(state));
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_runtime_get_logical_device`.
///
/// # Safety
/// `device_out` is NULL or valid for writing an `int32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_get_logical_device(
    runtime: *mut flex_runtime_t,
    device_out: *mut i32,
) -> flex_status_t {
    const CALL: &str = "flex_runtime_get_logical_device";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        state.check_switch(CALL)?;
        let out = out_param(device_out, "device_out")?;
        let device = state.runtime.logical_device();
        let device = i32::try_from(device)
            .map_err(|_| Failure::internal(format!("device {device} does not fit int32_t")))?;
        // SAFETY: flex.h: `device_out` points to a writable `int32_t` when
        // not NULL; checked non-null and aligned.
        unsafe { out.write(device) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_runtime_get_default_stream`: always the same handle (stream id 0).
///
/// # Safety
/// `stream_out` is NULL or valid for writing a `flex_stream_t *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_get_default_stream(
    runtime: *mut flex_runtime_t,
    stream_out: *mut *mut flex_stream_t,
) -> flex_status_t {
    const CALL: &str = "flex_runtime_get_default_stream";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        state.check_switch(CALL)?;
        let out = out_param(stream_out, "stream_out")?;
        let handle = registry::stream_handle(state.runtime.default_mock_stream());
        // SAFETY: flex.h: `stream_out` points to a writable
        // `flex_stream_t *` when not NULL; checked non-null and aligned.
        unsafe { out.write(handle) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_runtime_create_stream`: a new stream with the next id (1, 2, …).
/// `track_hazards` is recorded; any non-zero value is true.
///
/// # Safety
/// `stream_out` is NULL or valid for writing a `flex_stream_t *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_create_stream(
    runtime: *mut flex_runtime_t,
    priority: flex_stream_priority_t,
    mode: flex_stream_mode_t,
    track_hazards: i32,
    stream_out: *mut *mut flex_stream_t,
) -> flex_status_t {
    const CALL: &str = "flex_runtime_create_stream";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        state.check_switch(CALL)?;
        let priority = StreamPriority::from_raw(priority)
            .map_err(|err| Failure::invalid_argument(err.message()))?;
        let mode =
            StreamMode::from_raw(mode).map_err(|err| Failure::invalid_argument(err.message()))?;
        let out = out_param(stream_out, "stream_out")?;
        let stream = state
            .runtime
            .create_mock_stream(priority, mode, track_hazards != 0)?;
        if let Some(n) = state.switches.fail_launch {
            stream.fail_nth_launch(n);
        }
        let handle = registry::register_stream(&state, stream);
        // SAFETY: flex.h: `stream_out` points to a writable
        // `flex_stream_t *` when not NULL; checked non-null and aligned.
        unsafe { out.write(handle) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_stream_destroy`: waits for the stream's work and completions, then
/// retires the handle. Refuses the default stream and another runtime's
/// stream (`FLEX_ERROR_INVALID_HANDLE`).
///
/// # Safety
/// The handles are any values; live ones are recognised without
/// dereferencing. flex.h: not from a callback of this runtime (refused with
/// `FLEX_ERROR_UNSUPPORTED`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_stream_destroy(
    runtime: *mut flex_runtime_t,
    stream: *mut flex_stream_t,
) -> flex_status_t {
    const CALL: &str = "flex_stream_destroy";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        let target = registry::stream(stream)?;
        if !Arc::ptr_eq(&state, &target.state) {
            return Err(Failure::invalid_handle(format!(
                "stream {stream:p} belongs to another runtime than {runtime:p}"
            )));
        }
        if target.id == 0 {
            return Err(Failure::invalid_handle(
                "the default stream is destroyed with its runtime, not with flex_stream_destroy",
            ));
        }
        refuse_in_callback(&state, CALL)?;
        state.check_switch(CALL)?;
        state.drain_stream(target.mock()?);
        if !registry::retire_stream(stream) {
            return Err(Failure::invalid_handle(format!(
                "stream {stream:p} was destroyed by another thread during this call"
            )));
        }
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_runtime_has_stream_error`: 1 if any stream of the runtime that has
/// not been destroyed has failed or needs shutdown, else 0.
///
/// # Safety
/// `has_error_out` is NULL or valid for writing an `int32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_has_stream_error(
    runtime: *mut flex_runtime_t,
    has_error_out: *mut i32,
) -> flex_status_t {
    const CALL: &str = "flex_runtime_has_stream_error";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        state.check_switch(CALL)?;
        let out = out_param(has_error_out, "has_error_out")?;
        let retired = state.retired.lock().clone();
        let has_error = (0..state.runtime.stream_count() as u64)
            .filter(|id| !retired.contains(id))
            .filter_map(|id| state.runtime.mock_stream(id))
            .any(|s| s.query().is_err() || s.needs_shutdown().unwrap_or(false));
        // SAFETY: flex.h: `has_error_out` points to a writable `int32_t`
        // when not NULL; checked non-null and aligned.
        unsafe { out.write(i32::from(has_error)) };
        Ok(FLEX_SUCCESS)
    })
}

// ---------------------------------------------------------------------------
// Device memory
// ---------------------------------------------------------------------------

/// `flex_memory_allocate`: `size` bytes in 128-byte aligned chunks (see the
/// device's placement rule in [`Runtime::allocate`]). When `capacity` is too
/// small, writes the number of chunks needed to `*num_chunks_out`, allocates
/// nothing and returns `FLEX_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// `chunks_out` is NULL or valid for writing `capacity` chunks;
/// `num_chunks_out` is NULL or valid for writing a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_memory_allocate(
    runtime: *mut flex_runtime_t,
    size: u64,
    chunks_out: *mut flex_address_chunk_t,
    capacity: usize,
    num_chunks_out: *mut usize,
) -> flex_status_t {
    const CALL: &str = "flex_memory_allocate";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        state.check_switch(CALL)?;
        if size == 0 {
            return Err(Failure::invalid_argument(
                "size is 0; an allocation needs at least 1 byte",
            ));
        }
        let chunks_out = out_param(chunks_out, "chunks_out")?;
        let count_out = out_param(num_chunks_out, "num_chunks_out")?;
        let address = state.runtime.allocate(size)?;
        let chunks = address.chunks();
        if chunks.len() > capacity {
            // Nothing may stay allocated; this address was just made, so
            // freeing it cannot fail.
            let _ = state.runtime.free(&address);
            // SAFETY: flex.h: `num_chunks_out` points to a writable `size_t`
            // when not NULL (and holds the number needed on this error);
            // checked non-null and aligned.
            unsafe { count_out.write(chunks.len()) };
            return Err(Failure::invalid_argument(format!(
                "capacity {capacity} is too small: the allocation of {size} bytes needs {} chunks; nothing was allocated",
                chunks.len()
            )));
        }
        for (index, chunk) in chunks.iter().enumerate() {
            // SAFETY: flex.h: `chunks_out` has room for `capacity` entries;
            // `index < chunks.len() <= capacity`, and the pointer is non-null
            // and aligned (checked), so `add(index)` stays inside it.
            unsafe { chunks_out.add(index).write(chunk.to_raw()) };
        }
        // SAFETY: as above for `num_chunks_out`.
        unsafe { count_out.write(chunks.len()) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_memory_free`: frees exactly an address that `flex_memory_allocate`
/// returned. Operations that still use it fail with
/// `FLEX_ERROR_EXECUTION_FAILED`.
///
/// # Safety
/// `address` is NULL or points to a valid `flex_composite_address_t` whose
/// chunk array is valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_memory_free(
    runtime: *mut flex_runtime_t,
    address: *const flex_composite_address_t,
) -> flex_status_t {
    const CALL: &str = "flex_memory_free";
    boundary(CALL, || {
        let state = registry::runtime(runtime)?;
        state.check_switch(CALL)?;
        // SAFETY: this function's contract is `read_address`'s.
        let address = unsafe { read_address(address, "address") }?;
        state.runtime.free(&address)?;
        Ok(FLEX_SUCCESS)
    })
}

// ---------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------

/// `flex_stream_get_id`: 0 for the default stream, then 1, 2, … in creation
/// order.
///
/// # Safety
/// `id_out` is NULL or valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_stream_get_id(
    stream: *mut flex_stream_t,
    id_out: *mut u64,
) -> flex_status_t {
    const CALL: &str = "flex_stream_get_id";
    boundary(CALL, || {
        let stream = registry::stream(stream)?;
        stream.state.check_switch(CALL)?;
        let out = out_param(id_out, "id_out")?;
        // SAFETY: flex.h: `id_out` points to a writable `uint64_t` when not
        // NULL; checked non-null and aligned.
        unsafe { out.write(stream.id) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_stream_get_priority`.
///
/// # Safety
/// `priority_out` is NULL or valid for writing a `flex_stream_priority_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_stream_get_priority(
    stream: *mut flex_stream_t,
    priority_out: *mut flex_stream_priority_t,
) -> flex_status_t {
    const CALL: &str = "flex_stream_get_priority";
    boundary(CALL, || {
        let stream = registry::stream(stream)?;
        stream.state.check_switch(CALL)?;
        let out = out_param(priority_out, "priority_out")?;
        let priority = stream.mock()?.priority().to_raw();
        // SAFETY: flex.h: `priority_out` points to a writable
        // `flex_stream_priority_t` when not NULL; checked non-null and
        // aligned.
        unsafe { out.write(priority) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_stream_query`: `FLEX_SUCCESS` when every operation enqueued so far
/// has completed and its completion has returned, `FLEX_NOT_READY` when not,
/// the stream's first error when it has failed. Never blocks.
///
/// # Safety
/// `stream` is any value; live handles are recognised without dereferencing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_stream_query(stream: *mut flex_stream_t) -> flex_status_t {
    const CALL: &str = "flex_stream_query";
    boundary(CALL, || {
        let stream = registry::stream(stream)?;
        stream.state.check_switch(CALL)?;
        let done = stream.mock()?.query()?;
        let late_pending = stream
            .state
            .late
            .as_ref()
            .is_some_and(|late| late.queue().pending(Some(stream.id)) > 0);
        Ok(if done && !late_pending {
            FLEX_SUCCESS
        } else {
            FLEX_NOT_READY
        })
    })
}

/// `flex_stream_synchronize`: blocks until every operation enqueued before
/// the call has completed and its completion has returned; then the
/// stream's first error if it has failed (sticky).
///
/// # Safety
/// `stream` is any value; live handles are recognised without
/// dereferencing. flex.h: not from a callback of this runtime (refused with
/// `FLEX_ERROR_UNSUPPORTED`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_stream_synchronize(stream: *mut flex_stream_t) -> flex_status_t {
    const CALL: &str = "flex_stream_synchronize";
    boundary(CALL, || {
        let stream = registry::stream(stream)?;
        refuse_in_callback(&stream.state, CALL)?;
        stream.state.check_switch(CALL)?;
        let device = stream.mock()?;
        let result = device.synchronize();
        if let Some(late) = &stream.state.late {
            late.queue().wait_idle(Some(stream.id));
        }
        result?;
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_stream_needs_shutdown`.
///
/// # Safety
/// `needs_shutdown_out` is NULL or valid for writing an `int32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_stream_needs_shutdown(
    stream: *mut flex_stream_t,
    needs_shutdown_out: *mut i32,
) -> flex_status_t {
    const CALL: &str = "flex_stream_needs_shutdown";
    boundary(CALL, || {
        let stream = registry::stream(stream)?;
        stream.state.check_switch(CALL)?;
        let out = out_param(needs_shutdown_out, "needs_shutdown_out")?;
        let needs = stream.mock()?.needs_shutdown()?;
        // SAFETY: flex.h: `needs_shutdown_out` points to a writable
        // `int32_t` when not NULL; checked non-null and aligned.
        unsafe { out.write(i32::from(needs)) };
        Ok(FLEX_SUCCESS)
    })
}

// ---------------------------------------------------------------------------
// Launches
// ---------------------------------------------------------------------------

/// `flex_launch_h2d`: copies `dst`'s total size from `host_src` to `dst`.
///
/// # Safety
/// `host_src` is NULL or points to `dst`'s total size in bytes that stay
/// valid and unchanged until the completion is called (or, without one,
/// until the operation has completed); `dst` is NULL or a valid composite
/// address for the call; `completion` follows `flex_completion_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_launch_h2d(
    stream: *mut flex_stream_t,
    host_src: *const c_void,
    dst: *const flex_composite_address_t,
    pipeline_barrier: i32,
    completion: flex_completion_t,
) -> flex_status_t {
    const CALL: &str = "flex_launch_h2d";
    boundary(CALL, || {
        launch(CALL, stream, pipeline_barrier, completion, |_| {
            // SAFETY: this function's contract is `read_address`'s.
            let dst = unsafe { read_address(dst, "dst") }?;
            if host_src.is_null() {
                return Err(Failure::invalid_argument("host_src is NULL"));
            }
            let len = host_len(&dst, "dst")?;
            // SAFETY: `host_src` is non-null and, by this function's
            // contract (flex.h), points to `len` = dst's total size bytes
            // that stay valid and unchanged until the completion; `len` fits
            // `isize`.
            let source = unsafe { RawSource::new(host_src, len) };
            Ok(Op::h2d(source, dst))
        })
    })
}

/// `flex_launch_d2h`: copies `src`'s total size from `src` into `host_dst`.
///
/// # Safety
/// `host_dst` is NULL or points to `src`'s total size in writable bytes that
/// stay valid, and that the host neither reads nor writes, until the
/// completion is called (or, without one, until the operation has
/// completed); `src` is NULL or a valid composite address for the call;
/// `completion` follows `flex_completion_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_launch_d2h(
    stream: *mut flex_stream_t,
    src: *const flex_composite_address_t,
    host_dst: *mut c_void,
    pipeline_barrier: i32,
    completion: flex_completion_t,
) -> flex_status_t {
    const CALL: &str = "flex_launch_d2h";
    boundary(CALL, || {
        launch(CALL, stream, pipeline_barrier, completion, |_| {
            // SAFETY: this function's contract is `read_address`'s.
            let src = unsafe { read_address(src, "src") }?;
            if host_dst.is_null() {
                return Err(Failure::invalid_argument("host_dst is NULL"));
            }
            let len = host_len(&src, "src")?;
            // SAFETY: `host_dst` is non-null and, by this function's
            // contract (flex.h), points to `len` = src's total size writable
            // bytes that only the runtime touches until the completion; `len`
            // fits `isize`.
            let sink = unsafe { RawSink::new(host_dst, len) };
            Ok(Op::d2h(src, sink))
        })
    })
}

/// `flex_launch_compute`: runs the kernel descriptor stored at `program`
/// (see [`crate::kernel`]); a program the device cannot run fails the
/// operation with `FLEX_ERROR_EXECUTION_FAILED`.
///
/// # Safety
/// `program` is NULL or a valid composite address for the call;
/// `completion` follows `flex_completion_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_launch_compute(
    stream: *mut flex_stream_t,
    program: *const flex_composite_address_t,
    pipeline_barrier: i32,
    completion: flex_completion_t,
) -> flex_status_t {
    const CALL: &str = "flex_launch_compute";
    boundary(CALL, || {
        launch(CALL, stream, pipeline_barrier, completion, |_| {
            // SAFETY: this function's contract is `read_address`'s.
            let program = unsafe { read_address(program, "program") }?;
            Ok(Op::compute(program))
        })
    })
}

/// `flex_launch_host_callback`: runs `host_fn(host_user_data)` on an engine
/// thread in stream order.
///
/// # Safety
/// `host_fn` is NULL or a function that may be called once, on another
/// thread, with `host_user_data`, which stays valid until the completion is
/// called; `completion` follows `flex_completion_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_launch_host_callback(
    stream: *mut flex_stream_t,
    host_fn: flex_host_fn,
    host_user_data: *mut c_void,
    pipeline_barrier: i32,
    completion: flex_completion_t,
) -> flex_status_t {
    const CALL: &str = "flex_launch_host_callback";
    boundary(CALL, || {
        launch(CALL, stream, pipeline_barrier, completion, |state| {
            let func = host_fn.ok_or_else(|| Failure::invalid_argument("host_fn is NULL"))?;
            let host = CHostFn::new(func, host_user_data, state.key());
            Ok(Op::host_fn(move || host.call()))
        })
    })
}

/// `flex_launch_fill`: fills `dst` with `value` converted to `format` (see
/// [`crate::encode_fill_value`]).
///
/// # Safety
/// `dst` is NULL or a valid composite address for the call; `completion`
/// follows `flex_completion_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_launch_fill(
    stream: *mut flex_stream_t,
    dst: *const flex_composite_address_t,
    value: f64,
    format: flex_data_format_t,
    pipeline_barrier: i32,
    completion: flex_completion_t,
) -> flex_status_t {
    const CALL: &str = "flex_launch_fill";
    boundary(CALL, || {
        launch(CALL, stream, pipeline_barrier, completion, |_| {
            // SAFETY: this function's contract is `read_address`'s.
            let dst = unsafe { read_address(dst, "dst") }?;
            let format = DataFormat::from_raw(format)
                .map_err(|err| Failure::invalid_argument(err.message()))?;
            Ok(Op::fill(dst, value, format))
        })
    })
}

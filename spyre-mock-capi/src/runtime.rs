//! Runtimes: create and destroy, their logical device, default stream,
//! stream creation and destruction, and the stream-error roll-up.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use flex_rt::{Runtime, Stream, StreamMode, StreamPriority};
use flex_sys::bindings::{
    FLEX_ERROR_NO_DEVICE, FLEX_ERROR_RUNTIME_FAILED, FLEX_SUCCESS, flex_runtime_t, flex_status_t,
    flex_stream_mode_t, flex_stream_priority_t, flex_stream_t,
};
use flex_sys::fork::ForkGeneration;
use spyre_mock::{MockConfig, MockSystem};

use crate::args::out_param;
use crate::boundary::{CancellationHeld, Failure, boundary};
use crate::environment::{ENV_FAIL_RUNTIME_CREATE, Switches, env_config, env_switches};
use crate::handles::refuse_in_callback;
use crate::handles::{self, RuntimeState};
use crate::late_completions::LateThread;

/// `flex_runtime_create`: a runtime with fresh device state (memory, default
/// stream, engine threads) on `logical_device`, configured by the
/// environment at this call (see the [module docs](crate#environment)).
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
        handles::undefined_status_check(&switches, CALL)?;
        let out = out_param(runtime_out, "runtime_out")?;
        let state = start_runtime(logical_device, env_config()?, switches)?;
        let handle = handles::register_runtime(state);
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
        // The destroy waits for the runtime's other users and joins its
        // threads: cancellation points.
        let _held = CancellationHeld::new();
        let state = handles::runtime(runtime)?;
        refuse_in_callback(&state, CALL)?;
        state.check_switch(CALL)?;
        state.drain_all();
        let serial = state.serial;
        drop(state);
        let state = handles::unregister_runtime(runtime, serial).ok_or_else(|| {
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
        let state = handles::runtime(runtime)?;
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
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        let out = out_param(stream_out, "stream_out")?;
        let handle = handles::stream_handle(state.runtime.default_mock_stream());
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
        let state = handles::runtime(runtime)?;
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
        let handle = handles::register_stream(&state, stream)?;
        // SAFETY: flex.h: `stream_out` points to a writable
        // `flex_stream_t *` when not NULL; checked non-null and aligned.
        unsafe { out.write(handle) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_stream_destroy`: closes the stream ([`spyre_mock::MockStream::close`]:
/// a launch, record or wait on it from then on is refused with
/// `FLEX_ERROR_INVALID_HANDLE`), waits for its work and completions, then
/// retires the handle. A launch on another thread that races the destroy
/// is thus either waited for or refused, never left to run after the
/// destroy has returned. Refuses the default stream and another runtime's
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
        let state = handles::runtime(runtime)?;
        // Held by the call, not through the snapshot: draining blocks.
        let held = handles::held_stream(stream)?;
        let target = held.get();
        if !Arc::ptr_eq(&state, target.state) {
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
        let mock = target.mock();
        mock.close();
        state.drain_stream(mock);
        if !handles::retire_stream(stream) {
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
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        let out = out_param(has_error_out, "has_error_out")?;
        let retired = state.retired.lock().clone();
        let has_error = state
            .streams()
            .filter(|s| !retired.contains(&s.id()))
            .any(|s| s.query().is_err() || s.needs_shutdown().unwrap_or(false));
        // SAFETY: flex.h: `has_error_out` points to a writable `int32_t`
        // when not NULL; checked non-null and aligned.
        unsafe { out.write(i32::from(has_error)) };
        Ok(FLEX_SUCCESS)
    })
}

/// Creates the state of a runtime on `logical_device` with `config` and
/// `switches` (what `flex_runtime_create` does after reading the
/// environment).
pub(crate) fn start_runtime(
    logical_device: i32,
    config: MockConfig,
    switches: Switches,
) -> Result<Arc<RuntimeState>, Failure> {
    let devices = config.visible_count();
    let Ok(device) = u32::try_from(logical_device) else {
        return Err(Failure::new(
            FLEX_ERROR_NO_DEVICE,
            format!(
                "logical device {logical_device} is negative; this library has devices 0..={}",
                devices.saturating_sub(1)
            ),
        ));
    };
    if switches.fail_runtime_create && device < devices {
        return Err(Failure::new(
            FLEX_ERROR_RUNTIME_FAILED,
            format!(
                "device {device} could not be opened (fault injected by {ENV_FAIL_RUNTIME_CREATE}, set to a true value)"
            ),
        ));
    }
    flex_sys::fork::watch_forks().map_err(|err| {
        Failure::new(
            FLEX_ERROR_RUNTIME_FAILED,
            format!("cannot watch for fork() (pthread_atfork failed: {err})"),
        )
    })?;
    handles::keep_locks_across_fork()?;
    crate::rcu::forget_sections_in_forked_child().map_err(|err| {
        Failure::new(
            FLEX_ERROR_RUNTIME_FAILED,
            format!(
                "cannot keep the handle table usable across fork() (pthread_atfork failed: {err})"
            ),
        )
    })?;
    let fork = ForkGeneration::current();
    let runtime = MockSystem::with_config(config).create_mock_runtime(device)?;
    if let Some(n) = switches.fail_launch {
        runtime.default_mock_stream().fail_nth_launch(n);
    }
    let late = match switches.late_completions {
        Some(delay) => Some(start_late_thread(device, delay)?),
        None => None,
    };
    Ok(Arc::new(RuntimeState {
        serial: RuntimeState::next_serial(),
        runtime,
        late,
        switches,
        retired: Default::default(),
        destroyed: AtomicBool::new(false),
        fork,
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
pub(crate) fn sole_owner(mut state: Arc<RuntimeState>) -> RuntimeState {
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

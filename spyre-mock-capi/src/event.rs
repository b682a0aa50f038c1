//! Events and capabilities (flex.h ABI 1.1): create, destroy, record, wait,
//! query, synchronize, elapsed time, and the capability query.

use std::sync::Arc;

use flex_rt::{Notification, Stream};
use flex_sys::bindings::{
    FLEX_CAPABILITY_DEVICE_SIDE_WAIT, FLEX_CAPABILITY_EVENT_TIMING, FLEX_EVENT_TIMING,
    FLEX_NOT_READY, FLEX_SUCCESS, flex_capability_t, flex_completion_t, flex_event_flags_t,
    flex_event_t, flex_runtime_t, flex_status_t, flex_stream_t,
};

use crate::args::out_param;
use crate::boundary::{Failure, boundary};
use crate::handles::{self, EventEntry, refuse_in_callback};
use crate::launch::completion_for;

/// `flex_runtime_get_capability`: device-side waits and event timing as
/// the device is configured (`SPYRE_MOCK_DEVICE_SIDE_WAIT`,
/// `SPYRE_MOCK_EVENT_TIMING`).
///
/// # Safety
/// `value_out` is NULL or valid for writing an `int32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_get_capability(
    runtime: *mut flex_runtime_t,
    capability: flex_capability_t,
    value_out: *mut i32,
) -> flex_status_t {
    const CALL: &str = "flex_runtime_get_capability";
    boundary(CALL, || {
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        let out = out_param(value_out, "value_out")?;
        let capabilities = flex_rt::Runtime::capabilities(&state.runtime)?;
        let value = match capability {
            FLEX_CAPABILITY_DEVICE_SIDE_WAIT => capabilities.device_side_wait,
            FLEX_CAPABILITY_EVENT_TIMING => capabilities.event_timing,
            other => {
                return Err(Failure::invalid_argument(format!(
                    "capability {other} is not one this library knows (0 = FLEX_CAPABILITY_DEVICE_SIDE_WAIT, 1 = FLEX_CAPABILITY_EVENT_TIMING)"
                )));
            }
        };
        // SAFETY: flex.h: `value_out` points to a writable `int32_t` when
        // not NULL; checked non-null and aligned.
        unsafe { out.write(i32::from(value)) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_event_create`.
///
/// # Safety
/// `event_out` is NULL or valid for writing a `flex_event_t *`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_event_create(
    runtime: *mut flex_runtime_t,
    flags: flex_event_flags_t,
    event_out: *mut *mut flex_event_t,
) -> flex_status_t {
    const CALL: &str = "flex_event_create";
    boundary(CALL, || {
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        let out = out_param(event_out, "event_out")?;
        if flags & !FLEX_EVENT_TIMING != 0 {
            return Err(Failure::invalid_argument(format!(
                "flags {flags:#x} has bits flex.h does not define (known: FLEX_EVENT_TIMING = {FLEX_EVENT_TIMING:#x})"
            )));
        }
        let timing = flags & FLEX_EVENT_TIMING != 0;
        let event = flex_rt::Runtime::create_event(&state.runtime, timing)?;
        let handle = handles::register_event(EventEntry {
            state: Arc::clone(&state),
            event,
        })?;
        // SAFETY: flex.h: `event_out` points to a writable `flex_event_t *`
        // when not NULL; checked non-null and aligned.
        unsafe { out.write(handle) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_event_destroy`: never blocks; pending records and waits are still
/// honoured (they hold the device event).
///
/// # Safety
/// `runtime` and `event` are any values; live handles are recognised
/// without dereferencing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_event_destroy(
    runtime: *mut flex_runtime_t,
    event: *mut flex_event_t,
) -> flex_status_t {
    const CALL: &str = "flex_event_destroy";
    boundary(CALL, || {
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        handles::unregister_event(&state, event)?;
        Ok(FLEX_SUCCESS)
    })
}

/// The live event of a record or wait on `stream` (checked: the stream's
/// switches first), which must be of the stream's runtime.
fn event_of_stream(
    stream: &handles::StreamRef<'_>,
    event: *mut flex_event_t,
    call: &str,
) -> Result<Arc<EventEntry>, Failure> {
    stream.state.check_switch(call)?;
    let event = handles::event(event)?;
    if !Arc::ptr_eq(&event.state, stream.state) {
        return Err(Failure::invalid_argument(
            "the event and the stream belong to different runtimes",
        ));
    }
    Ok(event)
}

/// `flex_event_record`: marks the end of the stream's FIFO; the completion
/// is called when the device reaches it (or the stream failed first).
///
/// # Safety
/// `completion` follows `flex_completion_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_event_record(
    event: *mut flex_event_t,
    stream: *mut flex_stream_t,
    completion: flex_completion_t,
) -> flex_status_t {
    const CALL: &str = "flex_event_record";
    boundary(CALL, || {
        let snapshot = handles::snapshot();
        let stream = snapshot.stream(stream)?;
        let event = event_of_stream(&stream, event, CALL)?;
        let completion = completion_for(stream.state, stream.id, completion);
        stream.mock().record_event(&*event.event, completion)?;
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_stream_wait_event`: a gate in the device's scheduler, or, with
/// `SPYRE_MOCK_DEVICE_SIDE_WAIT=0`, a host wait for the event.
///
/// # Safety
/// `stream` and `event` are any values; live handles are recognised
/// without dereferencing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_stream_wait_event(
    stream: *mut flex_stream_t,
    event: *mut flex_event_t,
) -> flex_status_t {
    const CALL: &str = "flex_stream_wait_event";
    boundary(CALL, || {
        // Held by the call, not through the snapshot: without device-side
        // waits it blocks.
        let held = handles::held_stream(stream)?;
        let stream = held.get();
        let event = event_of_stream(&stream, event, CALL)?;
        if !flex_rt::Runtime::capabilities(&stream.state.runtime)?.device_side_wait {
            // The wait blocks the host: not from a callback of the runtime
            // (an engine, or the late-completion thread).
            refuse_in_callback(stream.state, CALL)?;
        }
        stream.mock().wait_event(&*event.event)?;
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_event_notify`: registers `completion` for the latest record, or
/// writes 1 (and never calls it) when there is nothing to wait for.
///
/// # Safety
/// `complete_out` is NULL or valid for writing an `int32_t`; `completion`
/// follows `flex_completion_fn`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_event_notify(
    event: *mut flex_event_t,
    completion: flex_completion_t,
    complete_out: *mut i32,
) -> flex_status_t {
    const CALL: &str = "flex_event_notify";
    boundary(CALL, || {
        let event = handles::event(event)?;
        event.state.check_switch(CALL)?;
        let out = out_param(complete_out, "complete_out")?;
        // No stream: late completions (if on) are queued under id u64::MAX.
        let completion = completion_for(&event.state, u64::MAX, completion);
        let complete = match completion {
            // Nothing to call: say only whether there is anything to wait for.
            None => !matches!(event.event.query(), Ok(false)),
            Some(completion) => matches!(event.event.notify(completion)?, Notification::Settled(_)),
        };
        // SAFETY: flex.h: `complete_out` points to a writable `int32_t` when
        // not NULL; checked non-null and aligned.
        unsafe { out.write(i32::from(complete)) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_event_query`: never blocks.
///
/// # Safety
/// `event` is any value; live handles are recognised without dereferencing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_event_query(event: *mut flex_event_t) -> flex_status_t {
    const CALL: &str = "flex_event_query";
    boundary(CALL, || {
        let event = handles::event(event)?;
        event.state.check_switch(CALL)?;
        Ok(if event.event.query()? {
            FLEX_SUCCESS
        } else {
            FLEX_NOT_READY
        })
    })
}

/// `flex_event_synchronize`: blocks until the latest record has completed.
///
/// # Safety
/// `event` is any value; live handles are recognised without
/// dereferencing. flex.h: not from a callback of this runtime (refused with
/// `FLEX_ERROR_UNSUPPORTED`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_event_synchronize(event: *mut flex_event_t) -> flex_status_t {
    const CALL: &str = "flex_event_synchronize";
    boundary(CALL, || {
        let event = handles::event(event)?;
        refuse_in_callback(&event.state, CALL)?;
        event.state.check_switch(CALL)?;
        event.event.synchronize()?;
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_event_elapsed_time`: nanoseconds from `start`'s completion to
/// `end`'s.
///
/// # Safety
/// `nanoseconds_out` is NULL or valid for writing an `int64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_event_elapsed_time(
    start: *mut flex_event_t,
    end: *mut flex_event_t,
    nanoseconds_out: *mut i64,
) -> flex_status_t {
    const CALL: &str = "flex_event_elapsed_time";
    boundary(CALL, || {
        let start = handles::event(start)?;
        start.state.check_switch(CALL)?;
        let end = handles::event(end)?;
        let out = out_param(nanoseconds_out, "nanoseconds_out")?;
        if !Arc::ptr_eq(&start.state, &end.state) {
            return Err(Failure::invalid_argument(
                "the start and end events belong to different runtimes",
            ));
        }
        let nanos = start.event.elapsed_nanos(&*end.event)?;
        // SAFETY: flex.h: `nanoseconds_out` points to a writable `int64_t`
        // when not NULL; checked non-null and aligned.
        unsafe { out.write(nanos) };
        Ok(FLEX_SUCCESS)
    })
}

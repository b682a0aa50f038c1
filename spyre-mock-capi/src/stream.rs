//! Streams: id, priority, query, synchronize and the needs-shutdown state.

use flex_rt::Stream;
use flex_sys::bindings::{
    FLEX_NOT_READY, FLEX_SUCCESS, flex_status_t, flex_stream_priority_t, flex_stream_t,
};

use crate::args::out_param;
use crate::boundary::boundary;
use crate::handles::refuse_in_callback;
use crate::handles::{self};

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
        let snapshot = handles::snapshot();
        let stream = snapshot.stream(stream)?;
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
        let snapshot = handles::snapshot();
        let stream = snapshot.stream(stream)?;
        stream.state.check_switch(CALL)?;
        let out = out_param(priority_out, "priority_out")?;
        let priority = stream.mock().priority().to_raw();
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
        let snapshot = handles::snapshot();
        let stream = snapshot.stream(stream)?;
        stream.state.check_switch(CALL)?;
        let done = stream.mock().query()?;
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
        // Held by the call, not through the snapshot: it blocks.
        let held = handles::held_stream(stream)?;
        let stream = held.get();
        refuse_in_callback(stream.state, CALL)?;
        stream.state.check_switch(CALL)?;
        let device = stream.mock();
        // The completions of launches made before this call; later ones
        // (a completion's own launch, another thread's) are not waited for.
        let next_launch = stream
            .state
            .late
            .as_ref()
            .map(|late| late.queue().next_launch());
        let result = device.synchronize();
        if let (Some(late), Some(next_launch)) = (&stream.state.late, next_launch) {
            late.queue().wait_launched_before(stream.id, next_launch);
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
        let snapshot = handles::snapshot();
        let stream = snapshot.stream(stream)?;
        stream.state.check_switch(CALL)?;
        let out = out_param(needs_shutdown_out, "needs_shutdown_out")?;
        let needs = stream.mock().needs_shutdown()?;
        // SAFETY: flex.h: `needs_shutdown_out` points to a writable
        // `int32_t` when not NULL; checked non-null and aligned.
        unsafe { out.write(i32::from(needs)) };
        Ok(FLEX_SUCCESS)
    })
}

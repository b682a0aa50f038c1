//! Launches: H2D, D2H, compute, host function and fill, each with its
//! pipeline barrier and completion.

use std::ffi::c_void;
use std::sync::Arc;

use flex_rt::{Completion, DataFormat, LaunchOptions};
use flex_sys::bindings::{
    FLEX_SUCCESS, flex_completion_t, flex_composite_address_t, flex_data_format_t, flex_host_fn,
    flex_status_t, flex_stream_t,
};
use spyre_mock::Op;

use crate::args::{host_len, read_address};
use crate::boundary::{CallResult, Failure, boundary};
use crate::handles::{self, RuntimeState};
use crate::host_side::{CCompletion, CHostFn, RawSink, RawSource, status_of};

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
/// (see [`flex_rt::program`]); a program the device cannot run fails the
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
            Ok(Op::raw_host_fn(host.into_raw()))
        })
    })
}

/// `flex_launch_fill`: fills `dst` with `value` converted to `format` (see
/// [`spyre_mock::encode_fill_value`]).
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

/// The device completion that calls the caller's C completion, boxed:
/// directly on the engine thread, or through the delivery thread when
/// completions are late. `None` when the caller gave none. For event
/// records and notifications, and launches with late completions; other
/// launches pass theirs unboxed (see [`launch`]).
pub(crate) fn completion_for(
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
/// enqueues it. Unless completions are late, the C completion goes to the
/// device as a [`spyre_mock::RawCompletion`] (as a host function goes as a
/// [`spyre_mock::RawHostFn`]): a host-function launch allocates nothing on
/// the launching thread for an engine to free (a copy still boxes its host
/// memory, and every device address its chunks).
pub(crate) fn launch(
    call: &'static str,
    stream: *mut flex_stream_t,
    pipeline_barrier: i32,
    completion: flex_completion_t,
    build: impl FnOnce(&Arc<RuntimeState>) -> Result<Op, Failure>,
) -> CallResult {
    let snapshot = handles::snapshot();
    let stream = snapshot.stream(stream)?;
    stream.state.check_switch(call)?;
    let op = build(stream.state)?;
    let device = stream.mock();
    if stream.state.late.is_some() {
        let options = LaunchOptions {
            pipeline_barrier: pipeline_barrier != 0,
            completion: completion_for(stream.state, stream.id, completion),
        };
        device.enqueue(op, options)?;
    } else {
        // The device has no pipeline to order (the barrier has no effect
        // on it), and the completion goes without an allocation.
        let completion = CCompletion::new(completion, stream.state.key());
        device.enqueue_raw(op, completion.map(CCompletion::into_raw))?;
    }
    Ok(FLEX_SUCCESS)
}

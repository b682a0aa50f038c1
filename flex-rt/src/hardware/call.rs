//! Turning what a flex call returns into a `Result`.
//!
//! Every FFI call of this backend goes through [`check`] (or [`query_result`]
//! for `flex_stream_query`, the one function with a second non-error
//! status). The pure parts take the last-error message as a closure so that
//! they can be tested without a library.

use std::ptr::NonNull;

use flex_sys::FlexLibrary;
use flex_sys::bindings as sys;

use crate::error::{FlexError, Result};
use crate::status::Status;

/// What a failed call reports when the library set no last-error message.
const NO_MESSAGE: &str = "the library set no error message";

/// `Ok(())` for `FLEX_SUCCESS`; otherwise the error for `call`, with the
/// calling thread's last-error message read from `lib` at once.
///
/// Call it right after the flex call, on the same thread, before any other
/// flex call: the message is per thread and the next failing call replaces
/// it.
pub(super) fn check(
    lib: &FlexLibrary,
    status: sys::flex_status_t,
    call: &'static str,
) -> Result<()> {
    status_result(status, call, || lib.last_error_message())
}

/// `Ok(())` for `FLEX_SUCCESS`; otherwise [`failure`] with the message that
/// `last_error` returns. `last_error` is called only on failure, once.
/// Inlined: on the hot path it is one comparison.
#[inline]
pub(super) fn status_result(
    status: sys::flex_status_t,
    call: &'static str,
    last_error: impl FnOnce() -> String,
) -> Result<()> {
    if status == sys::FLEX_SUCCESS {
        Ok(())
    } else {
        Err(failure(Status(status), call, last_error()))
    }
}

/// The result of `flex_stream_query`: `FLEX_SUCCESS` is `Ok(true)` (all work
/// done), `FLEX_NOT_READY` is `Ok(false)`, anything else is the error, with
/// the message that `last_error` returns.
#[inline]
pub(super) fn query_result(
    status: sys::flex_status_t,
    call: &'static str,
    last_error: impl FnOnce() -> String,
) -> Result<bool> {
    if status == sys::FLEX_NOT_READY {
        Ok(false)
    } else {
        status_result(status, call, last_error).map(|()| true)
    }
}

/// The error for a failed `call` that returned `status`.
///
/// Any status other than `FLEX_SUCCESS` is an error, including codes that
/// `flex.h` does not define (a later library may add some); [`Status`]'s
/// display names those as `undefined status <n> (not in flex.h)`. An empty
/// message becomes a note that the library gave none.
pub(super) fn failure(status: Status, call: &'static str, message: String) -> FlexError {
    if message.is_empty() {
        FlexError::new(status, call, NO_MESSAGE)
    } else {
        FlexError::new(status, call, message)
    }
}

/// The handle a successful `call` wrote to its out-parameter, which must not
/// be null: a null one is a [`Status::INTERNAL`] error naming the call and
/// `what` it should have returned.
pub(super) fn non_null<T>(ptr: *mut T, call: &'static str, what: &str) -> Result<NonNull<T>> {
    NonNull::new(ptr).ok_or_else(|| {
        FlexError::new(
            Status::INTERNAL,
            call,
            format!(
                "returned FLEX_SUCCESS but wrote a null {what} (0x0); the library broke flex.h"
            ),
        )
    })
}

/// A logical device index as `flex.h`'s `int32_t`.
///
/// # Errors
/// [`Status::NO_DEVICE`] naming the index when it exceeds `i32::MAX` (no
/// library can have such a device).
pub(super) fn device_to_raw(logical_device: u32, call: &'static str) -> Result<i32> {
    i32::try_from(logical_device).map_err(|_| {
        FlexError::new(
            Status::NO_DEVICE,
            call,
            format!(
                "logical device {logical_device} does not fit in flex.h's int32_t (at most {})",
                i32::MAX
            ),
        )
    })
}

/// A device count from `flex_get_device_count`, which must not be negative.
///
/// # Errors
/// [`Status::INTERNAL`] naming the value when the library reported a
/// negative count.
pub(super) fn count_from_raw(count: i32, call: &'static str) -> Result<u32> {
    u32::try_from(count).map_err(|_| {
        FlexError::new(
            Status::INTERNAL,
            call,
            format!("returned FLEX_SUCCESS with a negative device count {count}"),
        )
    })
}

/// A boolean out-parameter (`int32_t`): 0 is false, any other value is true.
pub(super) fn bool_from_raw(value: i32) -> bool {
    value != 0
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn success_is_ok_and_never_reads_the_message() {
        let read = Cell::new(0);
        let result = status_result(sys::FLEX_SUCCESS, "flex_x", || {
            read.set(read.get() + 1);
            String::new()
        });
        assert_eq!(result, Ok(()));
        assert_eq!(read.get(), 0);
    }

    #[test]
    fn every_known_error_carries_status_call_and_message() {
        for raw in 1..=13 {
            let read = Cell::new(0);
            let err = status_result(raw, "flex_stream_synchronize", || {
                read.set(read.get() + 1);
                format!("message {raw}")
            })
            .unwrap_err();
            assert_eq!(read.get(), 1, "the message is read exactly once");
            assert_eq!(err.status(), Status(raw));
            assert!(err.status().is_known());
            assert_eq!(err.call(), "flex_stream_synchronize");
            assert_eq!(err.message(), format!("message {raw}"));
        }
        let err = status_result(sys::FLEX_ERROR_NO_DEVICE, "flex_runtime_create", || {
            "device 9 not present".to_owned()
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "flex_runtime_create failed with FLEX_ERROR_NO_DEVICE (5): device 9 not present"
        );
    }

    #[test]
    fn undefined_codes_are_errors_naming_the_value() {
        for raw in [-1, 14, 77, i32::MIN, i32::MAX] {
            let err = status_result(raw, "flex_launch_fill", String::new).unwrap_err();
            assert_eq!(err.status(), Status(raw));
            assert!(!err.status().is_known());
            assert_eq!(
                err.to_string(),
                format!(
                    "flex_launch_fill failed with undefined status {raw} (not in flex.h): \
                     the library set no error message"
                )
            );
        }
    }

    #[test]
    fn not_ready_outside_query_is_an_error() {
        let err =
            status_result(sys::FLEX_NOT_READY, "flex_stream_synchronize", String::new).unwrap_err();
        assert_eq!(err.status(), Status::NOT_READY);
    }

    #[test]
    fn query_maps_ready_not_ready_and_errors() {
        assert_eq!(
            query_result(sys::FLEX_SUCCESS, "flex_stream_query", || unreachable!()),
            Ok(true)
        );
        assert_eq!(
            query_result(sys::FLEX_NOT_READY, "flex_stream_query", || unreachable!()),
            Ok(false)
        );
        let err = query_result(
            sys::FLEX_ERROR_EXECUTION_FAILED,
            "flex_stream_query",
            || "bad program".to_owned(),
        )
        .unwrap_err();
        assert_eq!(err.status(), Status::EXECUTION_FAILED);
        assert_eq!(err.message(), "bad program");
        let err = query_result(99, "flex_stream_query", String::new).unwrap_err();
        assert_eq!(err.status(), Status(99));
    }

    #[test]
    fn a_null_handle_after_success_is_an_internal_error() {
        let mut value = 5u8;
        assert!(non_null(&raw mut value, "flex_x", "thing").is_ok());
        let err = non_null(
            std::ptr::null_mut::<u8>(),
            "flex_runtime_create",
            "runtime handle",
        )
        .unwrap_err();
        assert_eq!(err.status(), Status::INTERNAL);
        assert_eq!(err.call(), "flex_runtime_create");
        assert!(err.message().contains("null runtime handle"), "{err}");
    }

    #[test]
    fn device_indices_and_counts_are_range_checked() {
        assert_eq!(device_to_raw(0, "c"), Ok(0));
        assert_eq!(device_to_raw(i32::MAX as u32, "c"), Ok(i32::MAX));
        let err = device_to_raw(u32::MAX, "flex_runtime_create").unwrap_err();
        assert_eq!(err.status(), Status::NO_DEVICE);
        assert!(err.message().contains("logical device 4294967295"), "{err}");
        assert_eq!(count_from_raw(3, "c"), Ok(3));
        let err = count_from_raw(-2, "flex_get_device_count").unwrap_err();
        assert_eq!(err.status(), Status::INTERNAL);
        assert!(err.message().contains("-2"), "{err}");
    }

    #[test]
    fn booleans_are_nonzero() {
        assert!(!bool_from_raw(0));
        assert!(bool_from_raw(1));
        assert!(bool_from_raw(-1));
        assert!(bool_from_raw(i32::MAX));
    }
}

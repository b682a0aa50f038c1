//! The edge of every exported call: the failure type, the thread-local
//! last-error message, and the panic barrier.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use flex_rt::{FlexError, panic_message};
use flex_sys::bindings::{
    FLEX_ERROR_INTERNAL, FLEX_ERROR_INVALID_ARGUMENT, FLEX_ERROR_INVALID_HANDLE, flex_status_t,
};

/// Why an exported call failed: the status it returns and the message it
/// leaves as the thread's last error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) status: flex_status_t,
    pub(super) message: String,
}

impl Failure {
    /// A failure with `status` and `message`.
    pub(super) fn new(status: flex_status_t, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// `FLEX_ERROR_INVALID_ARGUMENT`.
    pub(super) fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(FLEX_ERROR_INVALID_ARGUMENT, message)
    }

    /// `FLEX_ERROR_INVALID_HANDLE`.
    pub(super) fn invalid_handle(message: impl Into<String>) -> Self {
        Self::new(FLEX_ERROR_INVALID_HANDLE, message)
    }

    /// `FLEX_ERROR_INTERNAL`.
    pub(super) fn internal(message: impl Into<String>) -> Self {
        Self::new(FLEX_ERROR_INTERNAL, message)
    }
}

impl From<FlexError> for Failure {
    /// The device's error: its status and message.
    fn from(error: FlexError) -> Self {
        Self::new(error.status().0, error.message())
    }
}

/// What the body of an exported call returns: the status on success
/// (`FLEX_SUCCESS`, or `FLEX_NOT_READY` from `flex_stream_query`), or why it
/// failed.
pub(super) type CallResult = Result<flex_status_t, Failure>;

thread_local! {
    /// The calling thread's last-error message; `""` until a call fails.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Sets the calling thread's last-error message. NUL bytes in the message
/// become `?`. Does nothing while the thread's locals are being destroyed.
pub(super) fn set_last_error(message: &str) {
    let text = message.replace('\0', "?");
    // `replace` removed every NUL byte, so `CString::new` cannot fail; the
    // fallback only keeps this function panic-free.
    let text = CString::new(text).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

/// The calling thread's last-error message as a pointer that stays valid
/// until the next failing call on this thread replaces it (flex.h promises
/// less: until the next flex call on the thread). Never null.
pub(super) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or_else(|_| c"".as_ptr())
}

/// A copy of the calling thread's last-error message (for tests).
#[cfg(test)]
pub(super) fn last_error() -> String {
    LAST_ERROR.with(|slot| slot.borrow().to_string_lossy().into_owned())
}

/// `pthread_setcancelstate`'s state that holds a cancellation request
/// until cancellation is enabled again: 1 in glibc and musl. Held on Linux
/// only; other systems' numbers (macOS's is 0) are not checked here, so
/// nothing is held there.
const PTHREAD_CANCEL_DISABLE: c_int = 1;

#[cfg(all(target_os = "linux", not(miri)))]
unsafe extern "C" {
    /// POSIX: sets the calling thread's cancelability state, storing the
    /// previous one in `*oldstate`. (Not in the `libc` crate, which leaves
    /// out thread cancellation.)
    fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
}

/// Holds off a `pthread_cancel` of the calling thread while it waits in a
/// cancellation point of the library's (joining the engines as a runtime is
/// destroyed, sleeping while a handle table's readers finish), and restores
/// the thread's earlier state when dropped (a cancellation requested
/// meanwhile then acts at the caller's next cancellation point). A
/// cancellation there would unwind through the library's frames, which
/// cannot unwind, and abort the process. Taken only where a call may wait
/// so, not by every call: the launch and query paths reach no cancellation
/// point and pay nothing.
pub(super) struct CancellationHeld(c_int);

impl CancellationHeld {
    pub(super) fn new() -> Self {
        Self(set_cancel_state(PTHREAD_CANCEL_DISABLE))
    }
}

impl Drop for CancellationHeld {
    fn drop(&mut self) {
        set_cancel_state(self.0);
    }
}

/// Sets the calling thread's cancelability state to `state` and returns the
/// previous one.
#[cfg(all(target_os = "linux", not(miri)))]
fn set_cancel_state(state: c_int) -> c_int {
    let mut previous = 0;
    // SAFETY: `state` is `PTHREAD_CANCEL_DISABLE` or a state an earlier call
    // returned, so a valid one (an invalid one would only be refused with
    // EINVAL), and `previous` is a live `c_int` the call writes the old
    // state into; the call touches only the calling thread's own state.
    unsafe {
        pthread_setcancelstate(state, &mut previous);
    }
    previous
}

/// Miri does not model thread cancellation, and other systems than Linux
/// are not held (see [`PTHREAD_CANCEL_DISABLE`]).
#[cfg(not(all(target_os = "linux", not(miri))))]
fn set_cancel_state(_state: c_int) -> c_int {
    0
}

/// Runs the body of the exported function `call`: returns its status, or on
/// failure sets the last-error message and returns the failure's status. A
/// panic never crosses the C boundary: it becomes `FLEX_ERROR_INTERNAL` with
/// the panic message.
pub(super) fn boundary(call: &'static str, body: impl FnOnce() -> CallResult) -> flex_status_t {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(status)) => return status,
        Ok(Err(failure)) => failure,
        Err(payload) => Failure::internal(format!(
            "the library panicked: {}",
            panic_message(payload.as_ref())
        )),
    };
    // Recording the message allocates; keep even that from unwinding.
    let message = if failure.message.is_empty() {
        format!("{call} failed")
    } else {
        failure.message
    };
    let _ = catch_unwind(|| set_last_error(&message));
    failure.status
}

/// The flex.h name of a status code, or `FLEX_UNKNOWN_STATUS`.
pub(super) fn status_name(status: flex_status_t) -> &'static CStr {
    use flex_sys::bindings as sys;
    match status {
        sys::FLEX_SUCCESS => c"FLEX_SUCCESS",
        sys::FLEX_NOT_READY => c"FLEX_NOT_READY",
        sys::FLEX_ERROR_INVALID_ARGUMENT => c"FLEX_ERROR_INVALID_ARGUMENT",
        sys::FLEX_ERROR_INVALID_HANDLE => c"FLEX_ERROR_INVALID_HANDLE",
        sys::FLEX_ERROR_OUT_OF_MEMORY => c"FLEX_ERROR_OUT_OF_MEMORY",
        sys::FLEX_ERROR_NO_DEVICE => c"FLEX_ERROR_NO_DEVICE",
        sys::FLEX_ERROR_STREAM_FAILED => c"FLEX_ERROR_STREAM_FAILED",
        sys::FLEX_ERROR_LAUNCH_FAILED => c"FLEX_ERROR_LAUNCH_FAILED",
        sys::FLEX_ERROR_SHUTDOWN => c"FLEX_ERROR_SHUTDOWN",
        sys::FLEX_ERROR_EXECUTION_FAILED => c"FLEX_ERROR_EXECUTION_FAILED",
        sys::FLEX_ERROR_HOST_CALLBACK_FAILED => c"FLEX_ERROR_HOST_CALLBACK_FAILED",
        sys::FLEX_ERROR_RUNTIME_FAILED => c"FLEX_ERROR_RUNTIME_FAILED",
        sys::FLEX_ERROR_UNSUPPORTED => c"FLEX_ERROR_UNSUPPORTED",
        sys::FLEX_ERROR_INTERNAL => c"FLEX_ERROR_INTERNAL",
        _ => c"FLEX_UNKNOWN_STATUS",
    }
}

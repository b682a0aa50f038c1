//! The one error type of the flex runtime API.

use crate::status::Status;

/// An error from a flex runtime: the status code, the call that failed, and the
/// runtime's own message (for the hardware backend, the thread-local last-error
/// message read right after the failing call, on the same thread).
///
/// Cheap to clone: a stream's sticky error is handed out again by every later
/// `query` and `synchronize`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed with {status}: {message}")]
pub struct FlexError {
    status: Status,
    call: &'static str,
    message: String,
}

impl FlexError {
    /// Makes an error for `call` (the flex.h function or trait method name)
    /// with `status` and a human-readable `message`.
    pub fn new(status: Status, call: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            call,
            message: message.into(),
        }
    }

    /// Shorthand for a [`Status::INVALID_ARGUMENT`] error raised before
    /// anything reached the device.
    pub fn invalid_argument(call: &'static str, message: impl Into<String>) -> Self {
        Self::new(Status::INVALID_ARGUMENT, call, message)
    }

    /// The status code; may be a value flex.h does not define.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The call that failed, for example `flex_launch_h2d` or `launch_h2d`.
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The runtime's message; empty if the runtime gave none.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Result with [`FlexError`].
pub type Result<T, E = FlexError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_call_status_and_message() {
        let err = FlexError::new(
            Status::OUT_OF_MEMORY,
            "flex_memory_allocate",
            "1 GiB in use",
        );
        assert_eq!(
            err.to_string(),
            "flex_memory_allocate failed with FLEX_ERROR_OUT_OF_MEMORY (4): 1 GiB in use"
        );
        assert_eq!(err.status(), Status::OUT_OF_MEMORY);
        assert_eq!(err.call(), "flex_memory_allocate");
        assert_eq!(err.message(), "1 GiB in use");
    }
}

//! Status codes of flex.h as an integer newtype.

use std::fmt;

use flex_sys::bindings as sys;

/// A status code returned by a flex runtime (`flex_status_t` in flex.h).
///
/// This is an integer newtype, not an enum: a library may return a value that
/// flex.h does not name, and holding it must not be undefined behaviour.
/// [`Status::name`] gives the flex.h name of the known codes; any other value
/// displays as `undefined status <n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub i32);

impl Status {
    /// `FLEX_SUCCESS`: the call succeeded.
    pub const SUCCESS: Self = Self(sys::FLEX_SUCCESS);
    /// `FLEX_NOT_READY`: a queried stream still has work in flight.
    pub const NOT_READY: Self = Self(sys::FLEX_NOT_READY);
    /// `FLEX_ERROR_INVALID_ARGUMENT`: an argument is out of range or inconsistent.
    pub const INVALID_ARGUMENT: Self = Self(sys::FLEX_ERROR_INVALID_ARGUMENT);
    /// `FLEX_ERROR_INVALID_HANDLE`: a handle is null or foreign.
    pub const INVALID_HANDLE: Self = Self(sys::FLEX_ERROR_INVALID_HANDLE);
    /// `FLEX_ERROR_OUT_OF_MEMORY`: device memory is exhausted.
    pub const OUT_OF_MEMORY: Self = Self(sys::FLEX_ERROR_OUT_OF_MEMORY);
    /// `FLEX_ERROR_NO_DEVICE`: the logical device does not exist.
    pub const NO_DEVICE: Self = Self(sys::FLEX_ERROR_NO_DEVICE);
    /// `FLEX_ERROR_STREAM_FAILED`: the stream failed earlier (sticky).
    pub const STREAM_FAILED: Self = Self(sys::FLEX_ERROR_STREAM_FAILED);
    /// `FLEX_ERROR_LAUNCH_FAILED`: the runtime refused to enqueue an operation.
    pub const LAUNCH_FAILED: Self = Self(sys::FLEX_ERROR_LAUNCH_FAILED);
    /// `FLEX_ERROR_SHUTDOWN`: the stream needs a runtime shutdown.
    pub const SHUTDOWN: Self = Self(sys::FLEX_ERROR_SHUTDOWN);
    /// `FLEX_ERROR_EXECUTION_FAILED`: an operation failed on the device.
    pub const EXECUTION_FAILED: Self = Self(sys::FLEX_ERROR_EXECUTION_FAILED);
    /// `FLEX_ERROR_HOST_CALLBACK_FAILED`: a host callback failed or panicked.
    pub const HOST_CALLBACK_FAILED: Self = Self(sys::FLEX_ERROR_HOST_CALLBACK_FAILED);
    /// `FLEX_ERROR_RUNTIME_FAILED`: the runtime could not be created or failed.
    pub const RUNTIME_FAILED: Self = Self(sys::FLEX_ERROR_RUNTIME_FAILED);
    /// `FLEX_ERROR_UNSUPPORTED`: not supported by this library or device.
    pub const UNSUPPORTED: Self = Self(sys::FLEX_ERROR_UNSUPPORTED);
    /// `FLEX_ERROR_INTERNAL`: an internal error of the library.
    pub const INTERNAL: Self = Self(sys::FLEX_ERROR_INTERNAL);

    const NAMES: [(Status, &'static str); 14] = [
        (Self::SUCCESS, "FLEX_SUCCESS"),
        (Self::NOT_READY, "FLEX_NOT_READY"),
        (Self::INVALID_ARGUMENT, "FLEX_ERROR_INVALID_ARGUMENT"),
        (Self::INVALID_HANDLE, "FLEX_ERROR_INVALID_HANDLE"),
        (Self::OUT_OF_MEMORY, "FLEX_ERROR_OUT_OF_MEMORY"),
        (Self::NO_DEVICE, "FLEX_ERROR_NO_DEVICE"),
        (Self::STREAM_FAILED, "FLEX_ERROR_STREAM_FAILED"),
        (Self::LAUNCH_FAILED, "FLEX_ERROR_LAUNCH_FAILED"),
        (Self::SHUTDOWN, "FLEX_ERROR_SHUTDOWN"),
        (Self::EXECUTION_FAILED, "FLEX_ERROR_EXECUTION_FAILED"),
        (
            Self::HOST_CALLBACK_FAILED,
            "FLEX_ERROR_HOST_CALLBACK_FAILED",
        ),
        (Self::RUNTIME_FAILED, "FLEX_ERROR_RUNTIME_FAILED"),
        (Self::UNSUPPORTED, "FLEX_ERROR_UNSUPPORTED"),
        (Self::INTERNAL, "FLEX_ERROR_INTERNAL"),
    ];

    /// The flex.h name of this code, or `None` for a value flex.h does not define.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMES
            .iter()
            .find(|(status, _)| *status == self)
            .map(|(_, name)| *name)
    }

    /// Whether flex.h defines this code.
    pub fn is_known(self) -> bool {
        self.name().is_some()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "undefined status {} (not in flex.h)", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes_have_their_header_names() {
        assert_eq!(Status(0).name(), Some("FLEX_SUCCESS"));
        assert_eq!(Status(4).to_string(), "FLEX_ERROR_OUT_OF_MEMORY (4)");
        assert_eq!(Status(13).name(), Some("FLEX_ERROR_INTERNAL"));
    }

    #[test]
    fn undefined_codes_are_values_not_ub() {
        for raw in [-1, 14, 9999, i32::MIN, i32::MAX] {
            let status = Status(raw);
            assert!(!status.is_known());
            assert_eq!(
                status.to_string(),
                format!("undefined status {raw} (not in flex.h)")
            );
        }
    }
}

//! Typed stream and device error states (torch-spyre's `spyre_error.h`).

use std::fmt;

use flex_rt::{FlexError, Stream};

/// Error state of one stream (`SpyreStreamError`), from
/// [`crate::SpyreStream::error`], or [`StreamErrorState::of`] a raw handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamErrorState {
    /// The stream does not need a shutdown (`SpyreStreamError::Success`, 0).
    Success = 0,
    /// The runtime reports that the stream needs a shutdown (`Shutdown`, 1).
    Shutdown = 1,
}

impl StreamErrorState {
    /// The state of `stream` (`SpyreStream::getError`): `Shutdown` when the
    /// runtime says the stream needs a shutdown, else `Success`.
    ///
    /// # Errors
    /// The runtime's error, unchanged, when it cannot tell.
    pub fn of(stream: &dyn Stream) -> Result<Self, FlexError> {
        Ok(if stream.needs_shutdown()? {
            Self::Shutdown
        } else {
            Self::Success
        })
    }

    /// The stable name: `"Success"` or `"Shutdown"` (`SpyreStreamGetErrorString`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "Success",
            Self::Shutdown => "Shutdown",
        }
    }
}

impl fmt::Display for StreamErrorState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// State of the process's device (`SpyreDeviceState`), from [`crate::device_state`].
/// Callers treat [`DeviceState::NotInitialized`] as "proceed".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceState {
    /// The runtime is running and no stream has failed (`Ok`, 0).
    Ok = 0,
    /// No runtime: never started, or freed (`NotInitialized`, 1).
    NotInitialized = 1,
    /// Some stream of the runtime has failed or needs shutdown; a process
    /// restart is required (`StreamError`, 2).
    StreamError = 2,
}

impl DeviceState {
    /// The stable name: `"Ok"`, `"NotInitialized"` or `"StreamError"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "Ok",
            Self::NotInitialized => "NotInitialized",
            Self::StreamError => "StreamError",
        }
    }
}

impl fmt::Display for DeviceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_are_stable() {
        assert_eq!(StreamErrorState::Success.as_str(), "Success");
        assert_eq!(StreamErrorState::Shutdown.to_string(), "Shutdown");
        assert_eq!(StreamErrorState::Shutdown as i32, 1);
        assert_eq!(DeviceState::Ok as i32, 0);
        assert_eq!(DeviceState::NotInitialized.as_str(), "NotInitialized");
        assert_eq!(DeviceState::StreamError.to_string(), "StreamError");
        assert_eq!(DeviceState::StreamError as i32, 2);
    }
}

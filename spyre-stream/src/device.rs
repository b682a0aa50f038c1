//! The device argument, and the device set on each thread.

use std::cell::Cell;

use crate::error::{Error, Result};

/// A device argument (`c10::Device` of type PrivateUse1): a logical device
/// index, or [`Device::CURRENT`] for the calling thread's current device
/// (index -1, as in torch-spyre).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device(i8);

impl Device {
    /// The calling thread's current device (index -1).
    pub const CURRENT: Device = Device(-1);

    /// A device by index: -1 for the current device, or 0..=127.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceIndex`] naming `index` otherwise.
    pub fn new(index: i64) -> Result<Self> {
        match i8::try_from(index) {
            Ok(i) if i >= -1 => Ok(Self(i)),
            _ => Err(Error::InvalidDeviceIndex {
                index,
                expected: "-1 (the current device) or 0..=127",
            }),
        }
    }

    /// The device with logical index `index`.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceIndex`] when `index` is above 127 (expecting
    /// 0..=127: an index given as `u8`, a stream's say, never means the
    /// current device).
    pub fn from_index(index: u8) -> Result<Self> {
        i8::try_from(index)
            .map(Self)
            .map_err(|_| Error::InvalidDeviceIndex {
                index: i64::from(index),
                expected: "0..=127",
            })
    }

    /// The raw index; -1 for [`Device::CURRENT`].
    pub fn index(self) -> i8 {
        self.0
    }

    /// The logical device index when the device is named explicitly;
    /// `None` for [`Device::CURRENT`], which the process-wide runtime
    /// resolves (see [`crate::current_device`]).
    pub fn explicit(self) -> Option<u8> {
        u8::try_from(self.0).ok()
    }
}

impl Default for Device {
    /// [`Device::CURRENT`].
    fn default() -> Self {
        Self::CURRENT
    }
}

thread_local! {
    /// The device set on this thread by [`crate::set_device`]
    /// (`SpyreGuardImpl::tls_idx`).
    static THREAD_DEVICE: Cell<Option<u8>> = const { Cell::new(None) };
}

/// The device explicitly set on this thread, if any.
pub(crate) fn thread_device() -> Option<u8> {
    THREAD_DEVICE.with(Cell::get)
}

/// Sets the calling thread's device; the caller has validated it.
pub(crate) fn set_thread_device(device: u8) {
    THREAD_DEVICE.with(|d| d.set(Some(device)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_indices_are_validated() {
        assert_eq!(Device::new(-1).unwrap(), Device::CURRENT);
        assert_eq!(Device::new(0).unwrap().index(), 0);
        assert_eq!(Device::new(127).unwrap().explicit(), Some(127));
        assert_eq!(Device::CURRENT.explicit(), None);
        for bad in [-2, 128, i64::MIN, i64::MAX] {
            match Device::new(bad).unwrap_err() {
                Error::InvalidDeviceIndex { index, .. } => assert_eq!(index, bad),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(Device::from_index(127).unwrap().explicit(), Some(127));
        assert_eq!(
            Device::from_index(200).unwrap_err().to_string(),
            "device index 200 is out of range: expected 0..=127"
        );
        let message = Device::new(128).unwrap_err().to_string();
        assert_eq!(
            message,
            "device index 128 is out of range: expected -1 (the current device) or 0..=127"
        );
    }
}

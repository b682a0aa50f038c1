//! Devices and the thread's current device.

use std::cell::Cell;
use std::sync::OnceLock;

use crate::env::{self, MAX_DEVICE_INDEX};
use crate::{Error, Result, global};

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
            _ => Err(Error::InvalidDeviceIndex { index }),
        }
    }

    /// The device with logical index `index`.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceIndex`] when `index` is above 127.
    pub fn from_index(index: u8) -> Result<Self> {
        Self::new(i64::from(index))
    }

    /// The raw index; -1 for [`Device::CURRENT`].
    pub fn index(self) -> i8 {
        self.0
    }

    /// The logical device index, with [`Device::CURRENT`] resolved for the calling thread.
    pub fn resolve(self) -> u8 {
        u8::try_from(self.0).unwrap_or_else(|_| current_device())
    }
}

impl Default for Device {
    /// [`Device::CURRENT`].
    fn default() -> Self {
        Self::CURRENT
    }
}

thread_local! {
    /// The device set on this thread by [`set_device`] (`SpyreGuardImpl::tls_idx`).
    static THREAD_DEVICE: Cell<Option<u8>> = const { Cell::new(None) };
}

/// `LOCAL_RANK` read leniently once per process: the per-thread default device.
fn default_device() -> u8 {
    static DEFAULT: OnceLock<u8> = OnceLock::new();
    *DEFAULT
        .get_or_init(|| env::parse_local_rank(env::var(env::LOCAL_RANK).as_deref()).unwrap_or(0))
}

/// The calling thread's current device: the one set by [`set_device`] on this
/// thread, else `LOCAL_RANK`, else 0. Never fails and never panics: a
/// malformed `LOCAL_RANK` counts as 0 here and is reported by
/// [`crate::start_runtime`] (torch-spyre's `parse_local_rank_safe`).
pub fn current_device() -> u8 {
    THREAD_DEVICE.with(Cell::get).unwrap_or_else(default_device)
}

/// The device explicitly set on this thread, if any.
pub(crate) fn thread_device() -> Option<u8> {
    THREAD_DEVICE.with(Cell::get)
}

/// Makes `index` the calling thread's current device (torch-spyre's `set_device`).
///
/// # Errors
/// [`Error::InvalidDeviceIndex`] for an index outside 0..=127;
/// [`Error::DeviceOutOfRange`] when it is not below [`crate::device_count`];
/// the backend's error if devices cannot be counted.
pub fn set_device(index: i64) -> Result<()> {
    let device = u8::try_from(index)
        .ok()
        .filter(|d| *d <= MAX_DEVICE_INDEX)
        .ok_or(Error::InvalidDeviceIndex { index })?;
    let count = global::device_count()?;
    if u32::from(device) >= count {
        return Err(Error::DeviceOutOfRange { device, count });
    }
    THREAD_DEVICE.with(|d| d.set(Some(device)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_indices_are_validated() {
        assert_eq!(Device::new(-1).unwrap(), Device::CURRENT);
        assert_eq!(Device::new(0).unwrap().index(), 0);
        assert_eq!(Device::new(127).unwrap().resolve(), 127);
        for bad in [-2, 128, i64::MIN, i64::MAX] {
            match Device::new(bad).unwrap_err() {
                Error::InvalidDeviceIndex { index } => assert_eq!(index, bad),
                other => panic!("{other:?}"),
            }
        }
        assert!(Device::from_index(200).is_err());
        let message = Device::new(128).unwrap_err().to_string();
        assert_eq!(
            message,
            "device index 128 is out of range: expected -1 (the current device) or 0..=127"
        );
    }
}

//! Device memory of the process's device: owned buffers
//! ([`DeviceBuffer`]) over a caching allocator, its statistics, and the raw
//! allocation calls of the runtime.

mod allocator;
mod buffer;
mod element;
mod raw;

pub(crate) use allocator::CachingAllocator;
pub use allocator::{
    LARGE_SEGMENT, LARGE_SEGMENT_LIMIT, MIN_BLOCK, MemoryStats, SEGMENTS_PER_DEVICE, SMALL_REQUEST,
    SMALL_SEGMENT,
};
pub use buffer::DeviceBuffer;
pub use element::DeviceElement;
pub use raw::{allocate, free, memory_info, memory_layout};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::runtime;

/// The caching allocator's statistics for `device`
/// (`torch.cuda.memory_stats`); all zero before the runtime starts (this
/// starts nothing).
///
/// # Errors
/// [`Error::ForkedProcess`] in a forked child; [`Error::OtherDevice`] when
/// the runtime runs on another device.
pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    match runtime::started_allocator_for(device) {
        Ok(allocator) => Ok(allocator.stats()),
        Err(Error::NotStarted) => Ok(MemoryStats::default()),
        Err(error) => Err(error),
    }
}

/// Bytes held by live [`DeviceBuffer`]s on `device`, at their rounded
/// size (`torch.cuda.memory_allocated`).
///
/// # Errors
/// As [`memory_stats`].
pub fn memory_allocated(device: Device) -> Result<u64> {
    memory_stats(device).map(|stats| stats.allocated_bytes)
}

/// Bytes the caching allocator holds from `device`, in use or cached
/// (`torch.cuda.memory_reserved`).
///
/// # Errors
/// As [`memory_stats`].
pub fn memory_reserved(device: Device) -> Result<u64> {
    memory_stats(device).map(|stats| stats.reserved_bytes)
}

/// The most bytes live buffers have held at once on `device`, since the
/// start or [`reset_peak_memory_stats`] (`torch.cuda.max_memory_allocated`).
///
/// # Errors
/// As [`memory_stats`].
pub fn max_memory_allocated(device: Device) -> Result<u64> {
    memory_stats(device).map(|stats| stats.peak_allocated_bytes)
}

/// Starts the peak statistics again from the current values
/// (`torch.cuda.reset_peak_memory_stats`). Does nothing before the start.
///
/// # Errors
/// As [`memory_stats`].
pub fn reset_peak_memory_stats(device: Device) -> Result<()> {
    match runtime::started_allocator_for(device) {
        Ok(allocator) => {
            allocator.reset_peaks();
            Ok(())
        }
        Err(Error::NotStarted) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Returns the cached memory of `device` that no buffer uses to the device
/// (`torch.cuda.empty_cache`), and the bytes returned. Blocks until the
/// streams that own that memory have finished their work; memory of a
/// stream that cannot be waited for from here (called from one of its host
/// callbacks) stays cached. Does nothing before the start.
///
/// # Errors
/// As [`memory_stats`].
pub fn empty_cache(device: Device) -> Result<u64> {
    match runtime::started_allocator_for(device) {
        Ok(allocator) => Ok(allocator.empty_cache()),
        Err(Error::NotStarted) => Ok(0),
        Err(error) => Err(error),
    }
}

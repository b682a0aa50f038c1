//! The caching allocator's statistics and cache, by device, under
//! PyTorch's names (`torch.cuda.memory_stats`, `memory_allocated`, ...).

use super::allocator::{CachingAllocator, MemoryStats};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::runtime;

/// The caching allocator's statistics for `device`
/// (`torch.cuda.memory_stats`); all zero before the runtime starts, for
/// any device, as PyTorch's are empty before CUDA is initialized (this
/// starts and loads nothing, and so cannot check the device then).
///
/// # Errors
/// [`Error::ForkedProcess`] in a forked child; [`Error::OtherDevice`] when
/// the runtime runs on another device.
pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    with_allocator(device, MemoryStats::default(), CachingAllocator::stats)
}

/// `f` of `device`'s allocator once the runtime has started; `before` until
/// then (nothing is started).
fn with_allocator<T>(
    device: Device,
    before: T,
    f: impl FnOnce(&CachingAllocator) -> T,
) -> Result<T> {
    match runtime::started_allocator_for(device) {
        Ok(allocator) => Ok(f(allocator)),
        Err(Error::NotStarted) => Ok(before),
        Err(error) => Err(error),
    }
}

/// Bytes held by live [`crate::DeviceBuffer`]s on `device`, at their rounded
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
    with_allocator(device, (), CachingAllocator::reset_peaks)
}

/// Returns the cached memory of `device` that no buffer uses to the device
/// (`torch.cuda.empty_cache`), and the bytes returned. Blocks until the
/// streams that own that memory, and the streams that memory waiting to be
/// cached again was used on, have finished their work (the work enqueued
/// before the call). Memory stays cached where its stream cannot be waited
/// for from here (called from a completion or host callback of the
/// device), or where it was freed only after the wait began while its
/// stream still has work. Does nothing before the start. A full device
/// does the same before it fails an allocation
/// ([`crate::DeviceBuffer::new`]).
///
/// # Errors
/// As [`memory_stats`].
pub fn empty_cache(device: Device) -> Result<u64> {
    with_allocator(device, 0, CachingAllocator::empty_cache)
}

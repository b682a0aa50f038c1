//! Device memory of the process's device, by composite address.
//!
//! The raw allocation calls of the runtime (`flex_memory_allocate` /
//! `flex_memory_free`), through the process-wide runtime: the caller owns
//! what it allocates and frees it when no stream uses it any more.

use flex_rt::{CompositeAddress, FlexError, MemoryInfo, MemoryLayout};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::runtime;

/// Allocates `bytes` (> 0) of device memory on `device`, starting the
/// runtime if needed. The chunks of the result are 128-byte aligned and add
/// up to `bytes`; the memory is not initialized. Free it with [`free`] once
/// no stream uses it (the software device's use-after-free detector,
/// `SPYRE_MOCK_CHECK_REUSE`, reports work on memory freed too early and
/// allocated again, as for buffers). Memory the caching allocator holds
/// for buffers is not returned for it: call [`crate::empty_cache`] first
/// when the device is full.
///
/// Thread-safety: may be called from any thread.
///
/// # Errors
/// As [`crate::stream_from_pool`] for the device; the runtime's
/// `INVALID_ARGUMENT` for 0 bytes and `OUT_OF_MEMORY` when the device is
/// full ([`crate::Error::Flex`]).
pub fn allocate(device: Device, bytes: u64) -> Result<CompositeAddress> {
    if bytes == 0 {
        // Refused before anything starts: a request that cannot be served
        // binds no device.
        return Err(FlexError::invalid_argument(
            "allocate",
            "allocation size must be at least 1 byte, got 0",
        )
        .into());
    }
    let runtime = runtime::pool_for(device)?.runtime();
    let address = runtime.allocate(bytes)?;
    // Work enqueued from now on is the new owner's: a checking device
    // (`SPYRE_MOCK_CHECK_REUSE`) tells it from work on memory freed here
    // while still in use, as it does for buffers.
    runtime.note_reuse(&address);
    Ok(address)
}

/// Frees memory returned by [`allocate`], given the same address. Starts
/// nothing; after [`crate::free_runtime`] it still frees (the runtime is
/// never destroyed, as buffers' drops still return their memory), so that
/// what was allocated before can be given back.
///
/// Thread-safety: may be called from any thread.
///
/// # Errors
/// `INVALID_ARGUMENT` ([`crate::Error::Flex`]) when `address` is not a live
/// allocation (the runtime's; before the start there is none) or starts in
/// a segment of the caching allocator, such as the address of any
/// [`crate::DeviceBuffer`] (drop the buffer instead);
/// [`Error::ForkedProcess`] in a child forked after the start;
/// [`Error::OtherDevice`] for another device than the runtime's. Nothing
/// is freed then.
pub fn free(device: Device, address: &CompositeAddress) -> Result<()> {
    match runtime::started_allocator_for(device) {
        Ok(allocator) => allocator.free_raw(address),
        Err(Error::NotStarted) => Err(FlexError::invalid_argument(
            "free",
            format!(
                "{address} is not a live allocation: the runtime has not started, so nothing was allocated"
            ),
        )
        .into()),
        Err(other) => Err(other),
    }
}

/// The layout of `device`'s memory (size and region size), or `None` when
/// the backend cannot tell (the hardware backend: flex.h has no call for
/// the region size, in any ABI version). Starts the runtime if needed.
///
/// # Errors
/// As [`crate::stream_from_pool`] for the device.
pub fn memory_layout(device: Device) -> Result<Option<MemoryLayout>> {
    Ok(runtime::pool_for(device)?.runtime().memory_layout())
}

/// Free and total memory of `device` (`torch.cuda.mem_get_info`), from the
/// runtime (`flex_runtime_get_memory_info`). Starts the runtime if needed.
/// Free memory may be fragmented: the largest single allocation can be
/// smaller.
///
/// # Errors
/// As [`crate::stream_from_pool`] for the device; [`Error::Unsupported`]
/// with a flex library of ABI 1.0 (it has no such call); the runtime's
/// error ([`Error::Flex`]).
pub fn memory_info(device: Device) -> Result<MemoryInfo> {
    runtime::pool_for(device)?
        .runtime()
        .memory_info()
        .map_err(Error::from_abi_1_1_call)
}

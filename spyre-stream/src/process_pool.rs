//! torch-spyre's free functions over the process-wide pool
//! (`getStreamFromPool`, `getDefaultStream`, `getHostComputeStream`,
//! `synchronizeDevice`, ...): each finds the pool of the device it is given
//! through [`crate::runtime`] and asks it.

use flex_rt::Stream;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::pool::check_host_compute_id;
use crate::runtime::{self, pool_for};
use crate::stream::SpyreStream;

/// The next stream of a pool on `device`, round robin (`getStreamFromPool`):
/// `priority < 0` picks the high-priority pool (ids 33–64), otherwise the
/// normal pool (ids 1–32). Starts the runtime if needed.
///
/// # Errors
/// The start error; [`Error::OtherDevice`] for another device;
/// the runtime's error if the stream cannot be created.
pub fn stream_from_pool(device: Device, priority: i32) -> Result<SpyreStream> {
    pool_for(device)?.stream_from_pool(priority)
}

/// The default stream of `device` (id 0, `getDefaultStream`). Starts the runtime if needed.
///
/// # Errors
/// As [`stream_from_pool`].
pub fn default_stream(device: Device) -> Result<SpyreStream> {
    pool_for(device)?.default_stream()
}

/// The runtime handle of the default stream (`getDefaultStreamRuntimeHandle`),
/// for code that talks to the runtime directly (a collective-communication
/// backend, say).
///
/// A launch on the handle goes around the stream layer: it neither carries
/// nor covers the `pipeline_barrier` that a reuse of device memory asks for
/// on the default stream (see [`crate::DeviceBuffer`]). After such a reuse,
/// launch through [`default_stream`] first, or set
/// [`LaunchOptions::pipeline_barrier`](crate::LaunchOptions::pipeline_barrier) yourself.
///
/// # Errors
/// As [`stream_from_pool`].
pub fn default_stream_handle(device: Device) -> Result<&'static dyn Stream> {
    pool_for(device)?.default_stream_handle()
}

/// The next host-compute stream, round robin (`getHostComputeStream`).
///
/// # Errors
/// As [`stream_from_pool`].
pub fn host_compute_stream(device: Device) -> Result<SpyreStream> {
    pool_for(device)?.host_compute_stream()
}

/// The host-compute stream `id` (`getHostComputeStreamById`).
///
/// The id is checked before anything starts: an id outside the range binds
/// no device. Before the start, that check reads
/// `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS` once more (the start reads it too);
/// afterwards it uses the pool's count.
///
/// # Errors
/// [`Error::NotHostComputeStream`] outside 65..65+N; otherwise as [`stream_from_pool`].
pub fn host_compute_stream_by_id(id: i64, device: Device) -> Result<SpyreStream> {
    check_host_compute_id(id, runtime::host_compute_streams()?)?;
    pool_for(device)?.host_compute_stream_by_id(id)
}

/// Synchronizes every stream of `device` (`synchronizeDevice`); see
/// [`crate::StreamPool::synchronize_device`]. Before the runtime has started there is
/// nothing to synchronize: it checks `device` as [`crate::start_runtime`]
/// would (which loads the backend to count the devices) and returns `Ok`
/// without starting it (a device out of range is an error before the start
/// as after it, as `torch.cuda.synchronize(device)` raises).
///
/// # Errors
/// [`Error::OtherDevice`] for a device other than the process's;
/// before the start, [`Error::DeviceOutOfRange`], [`Error::InvalidEnv`] for
/// a malformed local-rank variable, and [`crate::device_count`]'s errors;
/// [`Error::ForkedProcess`] in a forked child;
/// [`Error::DeviceSynchronize`] naming the first stream that failed;
/// [`Error::Flex`] with `UNSUPPORTED` from a completion or host callback of
/// the device's runtime (it would wait for itself).
pub fn synchronize_device(device: Device) -> Result<()> {
    match runtime::started_pool_for(device) {
        Ok(pool) => pool.synchronize_device(),
        Err(Error::NotStarted) => runtime::check_device_before_start(device),
        Err(other) => Err(other),
    }
}

//! The thread-local current stream and its RAII guard.

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::id::{HOST_COMPUTE_START, StreamId};
use crate::pool::check_host_compute_id;
use crate::runtime;
use crate::stream::SpyreStream;

thread_local! {
    /// Current stream id per device index, for this thread (torch-spyre's
    /// `current_streams`). Unset means the default stream.
    static CURRENT_STREAMS: RefCell<Vec<(u8, StreamId)>> = const { RefCell::new(Vec::new()) };
}

/// The stream stored as current on `device` for this thread, if any. None
/// too once the thread's current-stream storage has been destroyed as the
/// thread exits (a lookup from a thread-local destructor that runs after
/// it): the thread is back at the default stream then.
fn lookup(device: u8) -> Option<StreamId> {
    CURRENT_STREAMS
        .try_with(|c| {
            c.borrow()
                .iter()
                .find(|(d, _)| *d == device)
                .map(|(_, id)| *id)
        })
        .ok()
        .flatten()
}

/// Stores `stream` as this thread's current stream on its device; false,
/// storing nothing, once the thread's current-stream storage has been
/// destroyed.
fn store(stream: SpyreStream) -> bool {
    CURRENT_STREAMS
        .try_with(|c| {
            let mut current = c.borrow_mut();
            match current
                .iter_mut()
                .find(|(d, _)| *d == stream.device_index())
            {
                Some(entry) => entry.1 = stream.id(),
                None => current.push((stream.device_index(), stream.id())),
            }
        })
        .is_ok()
}

/// The calling thread's current stream on `device` (`getCurrentStream`):
/// the stream last made current on this thread, else the default stream. A
/// new thread starts at the default stream, and an exiting thread is back
/// at it once its current-stream storage has been destroyed (a call from a
/// thread-local destructor that runs after that one; one that runs before
/// still sees the stream made current). Starts the runtime and initializes the pool
/// when it falls back to the default stream. A stream made current is
/// returned after [`crate::free_runtime`] too, as torch-spyre's
/// `getCurrentStream` returns it (its handle stays valid); the default
/// stream, made current or not, is [`crate::Error::RuntimeReset`] then, as
/// [`crate::default_stream`] is.
///
/// # Errors
/// As [`crate::default_stream`]; [`crate::Error::InvalidEnv`] for a
/// malformed `LOCAL_RANK` when `device` is the current one before the start;
/// [`crate::Error::ForkedProcess`] in a child forked after the start.
pub fn current_stream(device: Device) -> Result<SpyreStream> {
    // A stored current stream implies a started runtime (only
    // `set_current_stream`, which starts it, stores one): before the start
    // there is only the default stream to start for.
    let pool = match runtime::started_pool_for(device) {
        Ok(pool) => pool,
        Err(Error::NotStarted) => return runtime::pool_for(device)?.default_stream(),
        Err(other) => return Err(other),
    };
    let index = pool.device();
    match lookup(index).filter(|&id| id != StreamId(0)) {
        Some(id) => Ok(SpyreStream::from_parts(index, id)),
        // The default stream, stored or not, as after the start.
        None => {
            runtime::check_not_freed()?;
            pool.default_stream()
        }
    }
}

/// Makes `stream` the calling thread's current stream on its device
/// (`setCurrentStream`) and returns the previous one. Starts the runtime on
/// the stream's device if it has not started.
///
/// # Errors
/// [`Error::NoHandle`] for an id outside the pool's id space (0–64 and the
/// host-compute ids), and [`Error::NotHostComputeStream`] naming the range
/// for a host-compute id beyond the configured count (65..65+N, N from
/// `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS`, or [`Error::InvalidEnv`] if that
/// is malformed), both before anything starts;
/// [`Error::InvalidDeviceIndex`] for a stream of a device above 127 (made
/// with [`SpyreStream::from_parts`]); [`Error::WrongDevice`] for
/// a stream of a device other than the process's; the runtime's start
/// error; [`Error::ThreadExiting`] when called as the thread exits, after
/// its current-stream storage was destroyed (from a thread-local
/// destructor that runs after that one), where no current stream can be
/// kept.
pub fn set_current_stream(stream: SpyreStream) -> Result<SpyreStream> {
    let id = stream.id();
    if id.slot().is_none() {
        // No pool ever maps this id: refuse before anything starts.
        return Err(Error::NoHandle {
            id,
            device: stream.device_index(),
        });
    }
    let host_compute = id.get() >= HOST_COMPUTE_START;
    if host_compute {
        // Nor one beyond the configured host-compute streams.
        check_host_compute_id(id.get(), runtime::host_compute_streams()?)?;
    }
    let device = Device::from_index(stream.device_index())?;
    let pool = runtime::pool_for(device).map_err(|e| match e {
        Error::OtherDevice { requested, bound } => Error::WrongDevice {
            stream_device: requested,
            pool_device: bound,
        },
        other => other,
    })?;
    if host_compute {
        // The started pool's count decides (the variable may have changed
        // since it was read above).
        check_host_compute_id(id.get(), pool.config().host_compute_streams())?;
    }
    let previous = current_stream(device)?;
    if store(stream) {
        Ok(previous)
    } else {
        Err(Error::ThreadExiting)
    }
}

/// Makes a stream current for a scope and restores the previous one on drop
/// (the Python `with torch.spyre.Stream(...)` block). Guards nest: drop them in
/// reverse order of creation, as scopes do. A guard may live in a
/// thread-local: dropped as the thread exits, after the thread's
/// current-stream storage was destroyed, it restores nothing (the thread is
/// back at the default stream) and does not panic; dropped before, it
/// restores as ever.
///
/// Not `Send`: the current stream is per thread.
#[must_use = "the stream is current only while the guard lives"]
#[derive(Debug)]
pub struct StreamGuard {
    previous: SpyreStream,
    _not_send: PhantomData<*const ()>,
}

impl StreamGuard {
    /// Makes `stream` current on its device.
    ///
    /// # Errors
    /// As [`set_current_stream`].
    pub fn new(stream: SpyreStream) -> Result<Self> {
        Ok(Self {
            previous: set_current_stream(stream)?,
            _not_send: PhantomData,
        })
    }

    /// The stream that is restored when the guard drops.
    pub fn previous(&self) -> SpyreStream {
        self.previous
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // Nothing to restore into once the thread's storage is going.
        let _ = store(self.previous);
    }
}

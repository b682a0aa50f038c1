//! The crate's error type.

use flex_rt::FlexError;

use crate::id::{
    HIGH_POOL_END, HOST_COMPUTE_START, MAX_HOST_COMPUTE_STREAMS, NORMAL_POOL_START, StreamId,
};

/// Everything that can go wrong in the stream layer. Each variant carries the
/// facts a caller needs: the id, the device indices, the variable and its raw
/// value, the valid range. Where torch-spyre raises the error with a text
/// of its own, the message carries it (without the name of its function
/// where several functions return the error), and what the Rust API adds
/// (the device, where a value came from) follows. The exceptions, each
/// saying why: [`Error::OtherDevice`], the range check of
/// [`crate::set_device`], and a runtime that cannot be created, which
/// gives the runtime's own error ([`Error::Flex`], or
/// [`Error::BackendConfig`] for its configuration) where torch-spyre,
/// given a null runtime, says `Failed to initialize Spyre runtime.`
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operation on a stream id that has no runtime handle: an id never
    /// handed out by the pool, or a pool that was never initialized. After
    /// torch-spyre's text, the message says which ids get a handle when,
    /// by the id's range.
    #[error(
        "SpyreStream: no flex handle for stream id {id} — was the stream pool initialized for this device? (device {device}); {}",
        no_handle_advice(*id)
    )]
    NoHandle {
        /// The id that has no handle.
        id: StreamId,
        /// The stream's device index.
        device: u8,
    },

    /// A stream of one device was used with the pool of another.
    #[error(
        "stream of device {stream_device}, but this process uses device {pool_device}: one Spyre device per process is supported; use a stream of device {pool_device}, or start one process per device"
    )]
    WrongDevice {
        /// The device index of the stream.
        stream_device: u8,
        /// The device the process's pool is bound to.
        pool_device: u8,
    },

    /// A device other than the one the process's runtime runs on was asked
    /// for. Nothing was changed: the runtime stays on its device.
    /// torch-spyre's nearest error, `initializeStreamPoolImpl already
    /// called with device_index <a>; cannot reinitialize with device_index
    /// <b>`, names its pool's index, which need not be the device the
    /// runtime runs on there (see the crate docs on a device named
    /// explicitly); this message names the devices instead.
    #[error(
        "device {requested} was requested, but this process uses device {bound}: one Spyre device per process is supported; use device {bound}, or start one process per device"
    )]
    OtherDevice {
        /// The device that was asked for.
        requested: u8,
        /// The device the runtime runs on.
        bound: u8,
    },

    /// The process-wide runtime has not started, and the call does not start it.
    #[error(
        "the Spyre runtime has not started: call start_runtime() or take a stream from the pool first"
    )]
    NotStarted,

    /// The process is a child of `fork()` of the process that started the
    /// runtime. Device state cannot cross `fork()` (the software device's
    /// engine threads do not exist in the child; on a card the child would
    /// drive its parent's driver handles), so every entry point of the
    /// process-wide API refuses (PyTorch's rule for CUDA).
    #[error(
        "the Spyre runtime was started in process {started_in} and this is process {current}, a fork() of it: a device runtime cannot be used across fork(). Start the runtime only after forking (in the child), or start worker processes with spawn (std::process::Command; Python multiprocessing's \"spawn\" start method)"
    )]
    ForkedProcess {
        /// The process id the runtime was started in.
        started_in: u32,
        /// This process's id.
        current: u32,
    },

    /// The process is a child of `fork()`, forked while a thread of its
    /// parent was starting the runtime, or loading or installing its
    /// backend (the calls that hold the runtime's lifecycle lock before the
    /// start: [`crate::start_runtime`] and the first use of the pool,
    /// [`crate::set_backend`], [`crate::device_count`] and
    /// [`crate::set_device`]). That thread is not in the child, and its
    /// half-done work is the parent's, so each of those calls refuses at
    /// once rather than wait for ever ([`crate::free_runtime`] does
    /// nothing there).
    #[error(
        "this process ({current}) was forked while a thread of its parent was starting the Spyre runtime (or loading or installing its backend): that half-done work is the parent's and cannot be finished here. Fork before any thread begins to start the runtime, or start worker processes with spawn (std::process::Command; Python multiprocessing's \"spawn\" start method)"
    )]
    ForkedDuringStart {
        /// This process's id.
        current: u32,
    },

    /// A call that starts, frees or loads the runtime (or installs or
    /// counts through its backend) was made on a thread already inside
    /// one: from a backend's [`flex_rt::Backend::device_count`] or
    /// [`flex_rt::Backend::create_runtime`], which the start calls with the
    /// runtime's lifecycle lock held. Refused rather than waiting for
    /// itself; nothing was changed by it.
    #[error(
        "a call that starts, frees or loads the Spyre runtime was made from inside another one on the same thread (a backend's device_count or create_runtime, which the start calls): it would wait for itself; a backend must not call the stream layer"
    )]
    LifecycleReentered,

    /// The process is a child of `fork()` of a process that installed a
    /// backend with [`crate::set_backend`] and had not started the runtime:
    /// the child does not use that backend (a library it loaded, and any
    /// state it holds, are the parent's), and refuses to start on another
    /// one in its place. Call `set_backend` again in the child.
    #[error(
        "the backend installed with set_backend in process {installed_in} is not used in this process ({current}), a fork() of it, as its state is the parent's: call set_backend again in the child before the runtime starts there"
    )]
    BackendFromParent {
        /// The process id `set_backend` was called in.
        installed_in: u32,
        /// This process's id.
        current: u32,
    },

    /// The fork watcher (`pthread_atfork`) could not be registered, so the
    /// runtime was not started.
    #[error("cannot start the Spyre runtime: registering its fork() watcher failed: {0}")]
    ForkWatch(std::sync::Arc<std::io::Error>),

    /// `host_compute_stream_by_id` with an id outside the host-compute range.
    #[error("stream id {id} is not a host compute stream id (valid range [{start}, {end}))")]
    NotHostComputeStream {
        /// The id asked for.
        id: i64,
        /// First host-compute id (65).
        start: i64,
        /// One past the last host-compute id (65 + N).
        end: i64,
    },

    /// A host-compute stream count outside 1..=8 given to [`crate::PoolConfig::new`].
    #[error("host-compute stream count {count} is out of range: expected 1..=8")]
    InvalidHostComputeStreams {
        /// The count given.
        count: usize,
    },

    /// A device index outside what the call takes: -1 (the current device)
    /// or 0..=127 for a [`crate::Device`], 0..=127 for
    /// [`crate::set_device`] (which, like torch-spyre's, takes a device,
    /// not -1).
    #[error("device index {index} is out of range: expected {expected}")]
    InvalidDeviceIndex {
        /// The index given.
        index: i64,
        /// What the call takes, in words (an index range, or for a pool, a
        /// runtime on a device in range).
        expected: &'static str,
    },

    /// [`crate::set_current_stream`] (or [`crate::StreamGuard::new`]) was
    /// called as the calling thread exits, after its current-stream storage
    /// was destroyed (from a thread-local destructor that runs after that
    /// one): no current stream can be kept for the thread any more.
    #[error(
        "set_current_stream: the calling thread is exiting and its thread-local current stream is already gone; the stream cannot be made current (current_stream gives the default stream from here on)"
    )]
    ThreadExiting,

    /// The logical device is not below the number of visible devices.
    /// The message begins with torch-spyre's text, then says what chose
    /// the device and what to do about it.
    #[error(
        "Device index out of bounds. logical_device_id={device}, number of visible devices={count}; the device came from {}: {}",
        chosen_by.description(),
        out_of_range_advice(*count, *chosen_by)
    )]
    DeviceOutOfRange {
        /// The logical device asked for.
        device: u8,
        /// How many devices the backend sees.
        count: u32,
        /// What chose the device (a launcher's variable, `set_device`, ...).
        chosen_by: crate::DeviceSource,
    },

    /// An environment variable holds a value that cannot be used.
    #[error("{variable}={value:?} is invalid: {reason}")]
    InvalidEnv {
        /// The variable's name.
        variable: &'static str,
        /// Its raw value.
        value: String,
        /// What was expected.
        reason: String,
    },

    /// `start_runtime` (or an entry point that needs it) after `free_runtime`.
    #[error(
        "the Spyre runtime was freed by free_runtime(); runtime reset is not supported: restart the process to start a new runtime"
    )]
    RuntimeReset,

    /// A backend was installed after the runtime had started.
    #[error(
        "the Spyre runtime has already started; install a backend before the first stream operation"
    )]
    RuntimeAlreadyStarted,

    /// `SPYRE_BACKEND` names a backend this build does not have, or none was compiled in.
    #[error("{0}")]
    BackendUnavailable(String),

    /// The backend's configuration in the environment is invalid (a
    /// malformed or out-of-range `SPYRE_MOCK_*` or `SPYRE_DEVICES` value);
    /// the message names the variable and its value.
    #[error("{0}")]
    BackendConfig(FlexError),

    /// The runtime library could not be loaded.
    #[error(transparent)]
    Load(#[from] std::sync::Arc<flex_rt::LoadError>),

    /// `synchronize_device` failed on one stream (the first that failed; the
    /// others were still synchronized).
    #[error("synchronize_device: stream {id} failed: {source}")]
    DeviceSynchronize {
        /// The id of the first stream that failed.
        id: StreamId,
        /// Its error.
        source: FlexError,
    },

    /// The runtime cannot do what was asked: events, capabilities and
    /// memory info with a flex library of ABI 1.0 ("unsupported by this flex
    /// library (ABI 1.0)", naming the missing function), and events with
    /// timing on a device that cannot time them.
    #[error("{0}")]
    Unsupported(FlexError),
    /// [`crate::SpyreEvent::elapsed_time`] with an event created without
    /// timing.
    #[error(
        "elapsed_time: the {which} event was created without timing; create both events with SpyreEvent::with_timing()"
    )]
    EventWithoutTiming {
        /// Which of the two events.
        which: EventRole,
    },
    /// [`crate::SpyreEvent::elapsed_time`] with an event never recorded.
    #[error("elapsed_time: the {which} event was never recorded; record both events first")]
    EventNotRecorded {
        /// Which of the two events.
        which: EventRole,
    },
    /// [`crate::SpyreEvent::elapsed_time`] with an event whose record has
    /// not completed.
    #[error(
        "elapsed_time: the {which} event has not completed yet; synchronize (or await) it first"
    )]
    EventNotComplete {
        /// Which of the two events.
        which: EventRole,
    },
    /// [`crate::SpyreEvent::elapsed_time`] with an event whose record
    /// failed (its stream failed before reaching it): the event's error,
    /// naming which event.
    #[error(
        "elapsed_time: the {which} event's record failed, so it has no time; record it again on a stream that has not failed: {source}"
    )]
    EventFailed {
        /// Which of the two events.
        which: EventRole,
        /// The record's error ([`crate::SpyreEvent::query`]'s).
        source: FlexError,
    },
    /// [`crate::SpyreEvent::elapsed_time`] where the end event completed
    /// before the start event.
    #[error(
        "elapsed_time: the end event completed {by:?} before the start event; call start.elapsed_time(&end) with the event that completes first as start"
    )]
    EventsOutOfOrder {
        /// How much earlier the end event completed.
        by: std::time::Duration,
    },
    /// The device could not give the memory a [`crate::DeviceBuffer`] asked
    /// for, even after the caching allocator returned its cached memory to
    /// the device (waiting for the streams that held it) and tried again;
    /// or, at once, a request larger than all of the device's memory
    /// (boxed: the details are large).
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// A copy between a [`crate::DeviceBuffer`] and host memory of another
    /// length.
    #[error(
        "{operation}: the device buffer holds {buffer} {unit} but the host side has {host}; the lengths must be equal"
    )]
    LengthMismatch {
        /// The method called.
        operation: &'static str,
        /// The device buffer's length.
        buffer: u64,
        /// The host side's length.
        host: u64,
        /// `elements` or `bytes`.
        unit: &'static str,
    },
    /// An error of the flex runtime, unchanged.
    #[error(transparent)]
    Flex(#[from] FlexError),
}

/// The details of [`Error::OutOfMemory`]: what was asked for, and where
/// the memory is.
///
/// A request larger than all of the device's memory
/// ([`OutOfMemory::device_total`]), in the allocator's whole blocks of
/// [`crate::MIN_BLOCK`] bytes, fails at once, without emptying the cache or
/// waiting for any stream, and its message says so (as PyTorch's names the
/// device's total capacity).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub struct OutOfMemory {
    /// Bytes asked for.
    pub requested: u64,
    /// All of the device's memory, in bytes, from the runtime (`None` when
    /// it cannot tell: a flex library of ABI 1.0, or one whose memory
    /// information failed, or reported 0, when the device's allocator was
    /// made).
    pub device_total: Option<u64>,
    /// Free device memory, in bytes, from the runtime (`None` when it
    /// cannot tell: see [`OutOfMemory::memory_query_error`]).
    pub device_free: Option<u64>,
    /// Why [`OutOfMemory::device_free`] is `None`: the runtime's error of
    /// its memory query (`UNSUPPORTED` from a flex library of ABI 1.0,
    /// which has none), shown in the message.
    pub memory_query_error: Option<FlexError>,
    /// Bytes the allocator still holds but no buffer uses, after the
    /// retry: free blocks in segments that live buffers share (a segment
    /// goes back to the device only whole), of streams that had work left
    /// that could not be waited for on the device side (host-blocking
    /// waits, a failed stream) or too small to lend for the request,
    /// memory of streams that could
    /// not be waited for (from a host callback of the device), and memory
    /// freed only after the retry's wait began on a stream still busy.
    /// For a request larger than the device, what the allocator held then
    /// (nothing was returned or waited for).
    pub cached: u64,
    /// The largest block among them, in bytes.
    pub largest_cached: u64,
    /// The runtime's refusal.
    pub source: FlexError,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            requested,
            cached,
            largest_cached,
            source,
            ..
        } = self;
        // As the allocator decides: by the request's whole blocks.
        let blocks = requested
            .checked_next_multiple_of(crate::MIN_BLOCK)
            .unwrap_or(u64::MAX);
        if let Some(total) = self.device_total.filter(|&total| blocks > total) {
            // Named only where the blocks, not the bytes, exceed it.
            let in_blocks = if *requested > total {
                String::new()
            } else {
                format!(
                    " ({blocks} in the allocator's blocks of {})",
                    crate::MIN_BLOCK
                )
            };
            // The largest request whose blocks fit.
            let most = total / crate::MIN_BLOCK * crate::MIN_BLOCK;
            let advice = if most == 0 {
                format!("the device cannot hold one block of {}", crate::MIN_BLOCK)
            } else {
                format!("allocate at most {most} bytes (less what other buffers use)")
            };
            return write!(
                f,
                "out of device memory: cannot allocate {requested} bytes{in_blocks}, more than \
                 the device's {total} bytes in all; {advice}: {source}"
            );
        }
        // The query's own error says why (a flex library of ABI 1.0 says
        // it has no such query).
        let free = match (self.device_free, &self.memory_query_error) {
            (Some(free), _) => format!("{free} bytes"),
            (None, Some(error)) => format!("an unknown amount (its memory query failed: {error})"),
            (None, None) => "an unknown amount".to_owned(),
        };
        write!(
            f,
            "out of device memory: cannot allocate {requested} bytes; the device has {free} free, \
             the allocator caches {cached} bytes (largest cached block {largest_cached} bytes: \
             free blocks in segments that buffers still use, of streams that had work left (only \
             a stream that has finished its work lends its cached blocks, or, where the device \
             waits on the device side, one whose work the borrower can wait for), memory freed during \
             the retry, or memory of streams that could not be waited for); drop buffers no \
             longer needed or allocate less: {source}"
        )
    }
}

/// Which event of [`crate::SpyreEvent::elapsed_time`] an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventRole {
    /// The event the call is made on.
    Start,
    /// The event passed as the argument.
    End,
}

impl std::fmt::Display for EventRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Start => "start",
            Self::End => "end",
        })
    }
}

impl Error {
    /// An error of a call flex ABI 1.1 added (events, capabilities, memory
    /// info): [`Error::Unsupported`] when the runtime does not have it (its
    /// `UNSUPPORTED`, for a flex library of ABI 1.0), else [`Error::Flex`].
    pub(crate) fn from_abi_1_1_call(error: FlexError) -> Self {
        if error.status() == flex_rt::Status::UNSUPPORTED {
            Self::Unsupported(error)
        } else {
            Self::Flex(error)
        }
    }

    /// A backend's error while counting devices or creating the runtime:
    /// [`Error::BackendConfig`] when the backend refused its configuration
    /// (`INVALID_ARGUMENT`: a bad `SPYRE_MOCK_*` or `SPYRE_DEVICES` value
    /// of the software device or of its flex library), else
    /// [`Error::Flex`].
    pub(crate) fn from_backend(error: FlexError) -> Self {
        if error.status() == flex_rt::Status::INVALID_ARGUMENT {
            Self::BackendConfig(error)
        } else {
            Self::Flex(error)
        }
    }
}

/// When an id of [`Error::NoHandle`]'s range gets its handle (the id alone
/// says which range; not whether the pool has started).
fn no_handle_advice(id: StreamId) -> String {
    const HOST_COMPUTE_END: i64 = HOST_COMPUTE_START + MAX_HOST_COMPUTE_STREAMS as i64 - 1;
    match id.get() {
        0 => "the default stream (id 0) is mapped when the pool initializes, on the first call that takes a stream of it (stream_from_pool, default_stream, current_stream, host_compute_stream)".to_owned(),
        NORMAL_POOL_START..=HIGH_POOL_END => format!(
            "a pool id (1–64) gets its stream when stream_from_pool first hands it out; a SpyreStream made with from_parts for id {id} before that has none"
        ),
        HOST_COMPUTE_START..=HOST_COMPUTE_END => format!(
            "host-compute ids run from {HOST_COMPUTE_START} to 64+N, N from TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS (4 unless set, at most {MAX_HOST_COMPUTE_STREAMS}): an id above 64+N has no stream, and those up to it are mapped when the pool initializes"
        ),
        _ => format!(
            "no stream has id {id}: ids are 0 (the default stream), 1–32 (normal priority), 33–64 (high priority) and {HOST_COMPUTE_START}–{HOST_COMPUTE_END} (host compute)"
        ),
    }
}

/// What to do about [`Error::DeviceOutOfRange`], by what chose the device.
fn out_of_range_advice(count: u32, chosen_by: crate::DeviceSource) -> String {
    match (count, chosen_by) {
        (0, _) => "no device is visible to this process".to_owned(),
        (_, crate::DeviceSource::LocalRank(_)) => format!(
            "local ranks must be below {count}: start one rank per visible device; where each \
             rank sees only its own devices (SPYRE_DEVICES set per rank), they are numbered from \
             0 in each rank: call set_device on the thread that starts the runtime, or, outside \
             torchrun, set LOCAL_RANK=0 (read before the other launchers' variables)"
        ),
        _ => format!("use a device below {count}"),
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceSource;

    /// The advice for an id without a handle names when its range gets
    /// one; an id outside every range is told the ranges.
    #[test]
    fn an_id_without_a_handle_is_told_when_ids_like_it_get_one() {
        let advice = |id| {
            let message = Error::NoHandle {
                id: StreamId(id),
                device: 2,
            }
            .to_string();
            message.split_once("(device 2); ").unwrap().1.to_owned()
        };
        assert_eq!(
            advice(0),
            "the default stream (id 0) is mapped when the pool initializes, on the first call that takes a stream of it (stream_from_pool, default_stream, current_stream, host_compute_stream)"
        );
        assert!(advice(1).starts_with("a pool id (1–64) gets its stream"));
        assert!(advice(64).ends_with("from_parts for id 64 before that has none"));
        assert!(advice(65).starts_with("host-compute ids run from 65 to 64+N"));
        assert!(advice(72).starts_with("host-compute ids run from 65 to 64+N"));
        for id in [-1, 73, i64::MIN] {
            assert_eq!(
                advice(id),
                format!(
                    "no stream has id {id}: ids are 0 (the default stream), 1–32 (normal priority), 33–64 (high priority) and 65–72 (host compute)"
                )
            );
        }
    }

    /// Out of memory on a device smaller than one block says so, rather
    /// than advise "at most 0 bytes" (a request of 0 is refused); an
    /// unknown free amount is told with the memory query's own error.
    #[test]
    fn out_of_memory_advice_fits_the_device() {
        let refusal = FlexError::new(flex_rt::Status::OUT_OF_MEMORY, "allocate", "full");
        let error = |device_total, memory_query_error| OutOfMemory {
            requested: 300,
            device_total,
            device_free: None,
            memory_query_error,
            cached: 0,
            largest_cached: 0,
            source: refusal.clone(),
        };
        let tiny = error(Some(256), None).to_string();
        assert!(
            tiny.starts_with(
                "out of device memory: cannot allocate 300 bytes, more than the device's 256 \
                 bytes in all; the device cannot hold one block of 512: "
            ),
            "{tiny}"
        );
        let query = FlexError::new(
            flex_rt::Status::UNSUPPORTED,
            "memory_info",
            "unsupported by this flex library (ABI 1.0)",
        );
        let unknown = error(None, Some(query.clone())).to_string();
        assert!(
            unknown.contains(&format!(
                "the device has an unknown amount (its memory query failed: {query}) free"
            )),
            "{unknown}"
        );
    }

    /// The advice follows what chose the device: a launcher's rank is told
    /// the ranks that fit, a device named in code the devices that do, and
    /// a process that sees no device is told so rather than "below 0".
    #[test]
    fn a_device_out_of_range_is_told_what_fits() {
        let message = |device, count, chosen_by| {
            Error::DeviceOutOfRange {
                device,
                count,
                chosen_by,
            }
            .to_string()
        };
        assert_eq!(
            message(2, 2, DeviceSource::Requested),
            "Device index out of bounds. logical_device_id=2, number of visible devices=2; the device came from the device named by the first call: use a device below 2"
        );
        assert_eq!(
            message(0, 0, DeviceSource::Default),
            "Device index out of bounds. logical_device_id=0, number of visible devices=0; the device came from default (no current device, no launcher's local rank set): no device is visible to this process"
        );
    }
}

//! The no-op backend: accepts every call, completes every operation at once,
//! and counts what it was asked to do.
//!
//! For tests and model checks of the layers above flex-rt (the pool's
//! locking, its invariants, its error paths), where a device would only add
//! threads and time: a launch runs its host callback (if any) and then its
//! completion with `Ok(())` on the calling thread before it returns, moves
//! no bytes, and is counted. Streams live in an append-only table, so their
//! borrows stay valid for the runtime's life, as the contract requires.
//!
//! Knobs a test can turn: a delay in every stream creation (a slow vendor
//! runtime), a number of coming stream creations that fail, a hook that
//! runs inside every `synchronize` (to hold a stream "busy"), and a status
//! every elapsed time fails with once its checks pass (a runtime that
//! contradicts its own event queries).
//!
//! What it does not model, where the [`crate::Stream`] and
//! [`crate::Event`] contracts ask more: failures, and host buffers. A panic
//! in a host callback or a completion unwinds out of the launch into its
//! caller (it is not caught, and fails no stream); no stream ever fails, so
//! `query` and `synchronize` always succeed; an event outlives its runtime
//! without error (its calls still succeed after the runtime is dropped);
//! and a copy or fill checks no sizes and takes no lease on its host
//! buffer (it completes before the launch returns). Test work that fails,
//! and copies, on the software device (`spyre-mock`), which models all of
//! them.
//!
//! ```
//! use flex_rt::noop::NoopRuntime;
//! use flex_rt::{LaunchOptions, Runtime, StreamMode, StreamPriority};
//!
//! let runtime = NoopRuntime::new(0);
//! let stream = runtime.create_stream(StreamPriority::High, StreamMode::StrictOrdering, false)?;
//! stream.launch_host_callback(Box::new(|| {}), LaunchOptions::new().on_complete(|r| assert!(r.is_ok())))?;
//! stream.synchronize()?;
//! let calls = runtime.calls();
//! assert_eq!((calls.streams_created, calls.launches, calls.synchronizes), (1, 1, 1));
//! # Ok::<(), flex_rt::FlexError>(())
//! ```

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::address::{ADDRESS_ALIGNMENT, CompositeAddress, LogicalAddress};
use crate::buffer::HostBuffer;
use crate::error::{FlexError, Result};
use crate::event::{Capabilities, Event, Notification};
use crate::launch::{Completion, HostCallback, LaunchOptions};
use crate::status::Status;
use crate::traits::{Backend, Runtime, Stream};
use crate::types::{DataFormat, MemoryInfo, StreamMode, StreamPriority};

/// How many of each call a [`NoopRuntime`] has seen (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoopCalls {
    /// Streams created (the default stream not counted).
    pub streams_created: u64,
    /// Stream creations refused by [`NoopRuntime::fail_next_stream_creations`].
    pub stream_creations_failed: u64,
    /// Launches of every kind on every stream.
    pub launches: u64,
    /// `query` calls on every stream.
    pub queries: u64,
    /// `synchronize` calls on every stream.
    pub synchronizes: u64,
    /// `allocate` calls.
    pub allocations: u64,
    /// `free` calls.
    pub frees: u64,
}

#[derive(Default)]
struct Counters {
    streams_created: AtomicU64,
    stream_creations_failed: AtomicU64,
    launches: AtomicU64,
    queries: AtomicU64,
    synchronizes: AtomicU64,
    allocations: AtomicU64,
    frees: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> NoopCalls {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NoopCalls {
            streams_created: get(&self.streams_created),
            stream_creations_failed: get(&self.stream_creations_failed),
            launches: get(&self.launches),
            queries: get(&self.queries),
            synchronizes: get(&self.synchronizes),
            allocations: get(&self.allocations),
            frees: get(&self.frees),
        }
    }
}

/// A hook run inside every `synchronize`, with the stream's id.
pub type SynchronizeHook = Box<dyn Fn(u64) + Send + Sync>;

/// What [`NoopRuntime::with_creation_hook`] runs inside every stream
/// creation, with the priority asked for, before the stream is made.
pub type CreationHook = Box<dyn Fn(StreamPriority) + Send + Sync>;

/// A [`Backend`] of no-op runtimes: `devices` logical devices, each
/// [`Backend::create_runtime`] a fresh [`NoopRuntime`] with this backend's
/// stream-creation delay and elapsed-time failure.
///
/// `Send + Sync`; `Clone` shares nothing.
#[derive(Clone, Debug)]
pub struct NoopBackend {
    devices: u32,
    creation_delay: Duration,
    elapsed_failure: Option<Status>,
}

impl NoopBackend {
    /// A backend with `devices` devices (0 is allowed: every runtime creation
    /// then fails with [`Status::NO_DEVICE`]).
    pub fn new(devices: u32) -> Self {
        Self {
            devices,
            creation_delay: Duration::ZERO,
            elapsed_failure: None,
        }
    }

    /// Makes every stream creation of the runtimes it creates take `delay`.
    pub fn with_creation_delay(mut self, delay: Duration) -> Self {
        self.creation_delay = delay;
        self
    }

    /// Makes the runtimes it creates fail every elapsed time with `status`
    /// ([`NoopRuntime::with_elapsed_time_failure`]).
    pub fn with_elapsed_time_failure(mut self, status: Status) -> Self {
        self.elapsed_failure = Some(status);
        self
    }
}

impl Backend for NoopBackend {
    fn name(&self) -> &'static str {
        "noop"
    }

    fn device_count(&self) -> Result<u32> {
        Ok(self.devices)
    }

    fn create_runtime(&self, logical_device: u32) -> Result<Box<dyn Runtime>> {
        if logical_device >= self.devices {
            return Err(FlexError::new(
                Status::NO_DEVICE,
                "NoopBackend::create_runtime",
                match self.devices {
                    0 => format!(
                        "logical device {logical_device} does not exist; this backend has no devices"
                    ),
                    devices => format!(
                        "logical device {logical_device} does not exist; this backend has devices 0..={}",
                        devices - 1
                    ),
                },
            ));
        }
        let mut runtime = NoopRuntime::new(logical_device).with_creation_delay(self.creation_delay);
        runtime.elapsed_failure = self.elapsed_failure;
        Ok(Box::new(runtime))
    }
}

/// What a runtime and its streams share: the counters and the hook.
#[derive(Default)]
struct Shared {
    counters: Counters,
    synchronize_hook: Option<SynchronizeHook>,
}

/// A runtime that accepts every call (see the [module docs](self)).
///
/// Streams are numbered as the contract says: 0 is the default stream, then
/// 1, 2, ... in creation order. Allocations hand out 128-byte aligned,
/// never-reused addresses in region 0 and keep no memory.
///
/// `Send + Sync`; every method may be called from any thread.
pub struct NoopRuntime {
    device: u32,
    shared: Arc<Shared>,
    default: NoopStream,
    streams: boxcar::Vec<NoopStream>,
    creation_delay: Duration,
    creation_hook: Option<CreationHook>,
    fail_next: AtomicUsize,
    next_offset: AtomicU64,
    elapsed_failure: Option<Status>,
}

impl NoopRuntime {
    /// A runtime on `logical_device` with only its default stream.
    pub fn new(logical_device: u32) -> Self {
        Self::with_shared(logical_device, Shared::default())
    }

    /// A runtime on `logical_device` that runs `hook` with the stream's id
    /// inside every `synchronize`, before it returns (a test can block there
    /// to keep a stream "busy").
    pub fn with_synchronize_hook(logical_device: u32, hook: SynchronizeHook) -> Self {
        Self::with_shared(
            logical_device,
            Shared {
                counters: Counters::default(),
                synchronize_hook: Some(hook),
            },
        )
    }

    fn with_shared(logical_device: u32, shared: Shared) -> Self {
        let shared = Arc::new(shared);
        Self {
            device: logical_device,
            default: NoopStream::new(0, StreamPriority::Normal, Arc::clone(&shared)),
            shared,
            streams: boxcar::Vec::new(),
            creation_delay: Duration::ZERO,
            creation_hook: None,
            fail_next: AtomicUsize::new(0),
            next_offset: AtomicU64::new(0),
            elapsed_failure: None,
        }
    }

    /// Makes every stream creation take `delay` (the calling thread sleeps).
    pub fn with_creation_delay(mut self, delay: Duration) -> Self {
        self.creation_delay = delay;
        self
    }

    /// Runs `hook` with the priority inside every stream creation, after the
    /// creation delay (a test can block there to keep a creation "slow").
    pub fn with_creation_hook(mut self, hook: CreationHook) -> Self {
        self.creation_hook = Some(hook);
        self
    }

    /// Makes every elapsed time between events of this runtime fail with
    /// `status` once its own checks (timing, recorded) pass, although the
    /// events' queries report them complete: a runtime that contradicts
    /// itself, for tests of what callers do then (a caller that retries on
    /// [`Status::NOT_READY`] must not retry for ever).
    pub fn with_elapsed_time_failure(mut self, status: Status) -> Self {
        self.elapsed_failure = Some(status);
        self
    }

    /// Makes the next `n` stream creations fail with
    /// [`Status::RUNTIME_FAILED`] (added to any still pending).
    pub fn fail_next_stream_creations(&self, n: usize) {
        self.fail_next.fetch_add(n, Ordering::SeqCst);
    }

    /// What the runtime has been asked to do so far.
    pub fn calls(&self) -> NoopCalls {
        self.shared.counters.snapshot()
    }

    /// Streams that exist, the default stream included.
    pub fn stream_count(&self) -> usize {
        1 + self.streams.count()
    }

    /// How many times `synchronize` was called on stream `id`, or `None`
    /// when there is no such stream.
    pub fn synchronizes_of(&self, id: u64) -> Option<u64> {
        let stream = match id {
            0 => Some(&self.default),
            n => self.streams.get(usize::try_from(n - 1).ok()?),
        };
        stream.map(|s| s.synchronizes.load(Ordering::Relaxed))
    }
}

impl fmt::Debug for NoopRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NoopRuntime")
            .field("device", &self.device)
            .field("streams", &self.stream_count())
            .field("calls", &self.calls())
            .finish()
    }
}

impl Runtime for NoopRuntime {
    fn logical_device(&self) -> u32 {
        self.device
    }

    fn default_stream(&self) -> &dyn Stream {
        &self.default
    }

    fn create_stream(
        &self,
        priority: StreamPriority,
        _mode: StreamMode,
        _track_hazards: bool,
    ) -> Result<&dyn Stream> {
        if !self.creation_delay.is_zero() {
            std::thread::sleep(self.creation_delay);
        }
        if let Some(hook) = &self.creation_hook {
            hook(priority);
        }
        let counters = &self.shared.counters;
        if self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            Counters::bump(&counters.stream_creations_failed);
            return Err(FlexError::new(
                Status::RUNTIME_FAILED,
                "create_stream",
                "stream creation refused by NoopRuntime::fail_next_stream_creations",
            ));
        }
        Counters::bump(&counters.streams_created);
        let index = self.streams.push_with(|index| {
            NoopStream::new(index as u64 + 1, priority, Arc::clone(&self.shared))
        });
        Ok(&self.streams[index])
    }

    fn has_stream_error(&self) -> Result<bool> {
        Ok(false)
    }

    fn allocate(&self, size: u64) -> Result<CompositeAddress> {
        Counters::bump(&self.shared.counters.allocations);
        if size == 0 {
            return Err(FlexError::invalid_argument(
                "allocate",
                "an allocation needs at least one byte, got 0",
            ));
        }
        // Addresses are never reused: one past the last is refused.
        let out_of_addresses = || {
            FlexError::new(
                Status::OUT_OF_MEMORY,
                "allocate",
                format!(
                    "{size} bytes do not fit in the no-op runtime's addresses left (it hands out \
                     offsets below 2^64, never reused)"
                ),
            )
        };
        let reserved = size
            .checked_next_multiple_of(ADDRESS_ALIGNMENT)
            .ok_or_else(out_of_addresses)?;
        let offset = self
            .next_offset
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                next.checked_add(reserved)
            })
            .map_err(|_| out_of_addresses())?;
        CompositeAddress::single(
            LogicalAddress {
                region_id: 0,
                offset,
            },
            size,
        )
    }

    fn free(&self, _address: &CompositeAddress) -> Result<()> {
        Counters::bump(&self.shared.counters.frees);
        Ok(())
    }

    /// Memory without end: every allocation succeeds and nothing is taken.
    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(MemoryInfo {
            free_bytes: u64::MAX,
            total_bytes: u64::MAX,
        })
    }

    /// Device-side waits and timing: every event completes when recorded.
    fn capabilities(&self) -> Result<Capabilities> {
        Ok(Capabilities {
            device_side_wait: true,
            event_timing: true,
        })
    }

    fn create_event(&self, timing: bool) -> Result<Box<dyn Event>> {
        Ok(Box::new(NoopEvent {
            device: self.logical_device(),
            owner: Arc::as_ptr(&self.shared) as usize,
            timing,
            recorded: AtomicBool::new(false),
            elapsed_failure: self.elapsed_failure,
        }))
    }
}

/// An event of a [`NoopRuntime`]: complete as soon as it is recorded, since
/// work takes no time; elapsed times are 0 (or the runtime's
/// [`NoopRuntime::with_elapsed_time_failure`]).
#[derive(Debug)]
struct NoopEvent {
    device: u32,
    /// The runtime that made it (the address of its shared state).
    owner: usize,
    timing: bool,
    recorded: AtomicBool,
    /// What every elapsed time fails with once its checks pass
    /// ([`NoopRuntime::with_elapsed_time_failure`]).
    elapsed_failure: Option<Status>,
}

impl NoopEvent {
    /// `event` as a no-op event of the runtime `owner`.
    fn of<'a>(event: &'a dyn Event, owner: usize, call: &'static str) -> Result<&'a NoopEvent> {
        let event: &NoopEvent = event.as_any().downcast_ref().ok_or_else(|| {
            FlexError::invalid_argument(call, "the event belongs to another backend")
        })?;
        if event.owner != owner {
            return Err(FlexError::invalid_argument(
                call,
                format!(
                    "the event belongs to another runtime (logical device {})",
                    event.device
                ),
            ));
        }
        Ok(event)
    }
}

impl Event for NoopEvent {
    fn logical_device(&self) -> u32 {
        self.device
    }

    fn timing(&self) -> bool {
        self.timing
    }

    fn query(&self) -> Result<bool> {
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Every record has completed by the time it returns: nothing to wait for.
    fn notify(&self, _completion: Completion) -> Result<Notification> {
        Ok(Notification::Settled(Ok(())))
    }

    fn elapsed_nanos(&self, end: &dyn Event) -> Result<i64> {
        const CALL: &str = "elapsed_time";
        let end = NoopEvent::of(end, self.owner, CALL)?;
        for (name, event) in [("start", self), ("end", end)] {
            if !event.timing {
                return Err(FlexError::invalid_argument(
                    CALL,
                    format!("the {name} event was created without timing"),
                ));
            }
            if !event.recorded.load(Ordering::Acquire) {
                return Err(FlexError::invalid_argument(
                    CALL,
                    format!("the {name} event was never recorded"),
                ));
            }
        }
        match self.elapsed_failure {
            Some(status) => Err(FlexError::new(
                status,
                CALL,
                "injected by NoopRuntime::with_elapsed_time_failure",
            )),
            None => Ok(0),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One stream of a [`NoopRuntime`], handed out as `&dyn Stream`.
struct NoopStream {
    id: u64,
    priority: StreamPriority,
    synchronizes: AtomicU64,
    shared: Arc<Shared>,
}

impl NoopStream {
    fn new(id: u64, priority: StreamPriority, shared: Arc<Shared>) -> Self {
        Self {
            id,
            priority,
            synchronizes: AtomicU64::new(0),
            shared,
        }
    }

    /// The identity of the stream's runtime, as [`NoopEvent::owner`].
    fn owner(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// Counts a launch and completes it at once.
    fn complete(&self, options: LaunchOptions) -> Result<()> {
        Counters::bump(&self.shared.counters.launches);
        if let Some(completion) = options.completion {
            completion(Ok(()));
        }
        Ok(())
    }
}

impl fmt::Debug for NoopStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NoopStream({})", self.id)
    }
}

impl Stream for NoopStream {
    fn id(&self) -> u64 {
        self.id
    }

    fn priority(&self) -> StreamPriority {
        self.priority
    }

    fn query(&self) -> Result<bool> {
        Counters::bump(&self.shared.counters.queries);
        Ok(true)
    }

    fn synchronize(&self) -> Result<()> {
        if let Some(hook) = &self.shared.synchronize_hook {
            hook(self.id);
        }
        self.synchronizes.fetch_add(1, Ordering::Relaxed);
        Counters::bump(&self.shared.counters.synchronizes);
        Ok(())
    }

    fn needs_shutdown(&self) -> Result<bool> {
        Ok(false)
    }

    fn launch_h2d(
        &self,
        _src: &HostBuffer,
        _dst: &CompositeAddress,
        options: LaunchOptions,
    ) -> Result<()> {
        self.complete(options)
    }

    fn launch_d2h(
        &self,
        _src: &CompositeAddress,
        _dst: &HostBuffer,
        options: LaunchOptions,
    ) -> Result<()> {
        self.complete(options)
    }

    fn launch_compute(&self, _program: &CompositeAddress, options: LaunchOptions) -> Result<()> {
        self.complete(options)
    }

    fn launch_host_callback(&self, callback: HostCallback, options: LaunchOptions) -> Result<()> {
        callback();
        self.complete(options)
    }

    fn launch_fill(
        &self,
        _dst: &CompositeAddress,
        _value: f64,
        _format: DataFormat,
        options: LaunchOptions,
    ) -> Result<()> {
        self.complete(options)
    }

    /// Counted as a launch; the event completes at once.
    fn record_event(&self, event: &dyn Event, completion: Option<Completion>) -> Result<()> {
        let event = NoopEvent::of(event, self.owner(), "record_event")?;
        event.recorded.store(true, Ordering::Release);
        self.complete(LaunchOptions {
            pipeline_barrier: false,
            completion,
        })
    }

    /// Nothing to wait for: every event is complete.
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        NoopEvent::of(event, self.owner(), "wait_event").map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// A device the backend does not have is named with the ones it has.
    #[test]
    fn a_missing_device_names_the_devices_there_are() {
        let message = |devices, device| {
            let Err(refused) = NoopBackend::new(devices).create_runtime(device) else {
                panic!("device {device} of {devices} was made");
            };
            refused.message().to_owned()
        };
        assert_eq!(
            message(2, 2),
            "logical device 2 does not exist; this backend has devices 0..=1"
        );
        assert_eq!(
            message(0, 0),
            "logical device 0 does not exist; this backend has no devices"
        );
    }

    /// Sizes that would wrap the address counter are refused, and so is 0,
    /// naming the size: before, `u64::MAX` overflowed (a panic in a debug
    /// build; in a release build two requests of 2^63 wrapped the counter
    /// and reused addresses).
    #[test]
    fn allocations_never_wrap_and_name_a_bad_size() {
        let runtime = NoopRuntime::new(0);
        let zero = runtime.allocate(0).unwrap_err();
        assert_eq!(zero.status(), Status::INVALID_ARGUMENT);
        assert!(zero.message().contains("got 0"), "{zero}");
        let huge = runtime.allocate(u64::MAX).unwrap_err();
        assert_eq!(huge.status(), Status::OUT_OF_MEMORY);
        assert!(huge.message().starts_with(&u64::MAX.to_string()), "{huge}");
        let half = 1 << 63;
        assert_eq!(runtime.allocate(half).unwrap().start().offset, 0);
        assert_eq!(
            runtime.allocate(half).unwrap_err().status(),
            Status::OUT_OF_MEMORY,
            "its end, 2^64, is past the last offset the runtime counts to"
        );
        assert_eq!(
            runtime.allocate(1).unwrap().start().offset,
            half,
            "a refused request moves nothing"
        );
    }

    #[test]
    fn every_call_is_accepted_completed_at_once_and_counted() {
        let runtime = NoopRuntime::new(3);
        assert_eq!(runtime.logical_device(), 3);
        let stream = runtime
            .create_stream(StreamPriority::High, StreamMode::StrictOrdering, true)
            .unwrap();
        assert_eq!((stream.id(), stream.priority()), (1, StreamPriority::High));
        let ran = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicU64::new(0));
        let (r, c) = (Arc::clone(&ran), Arc::clone(&completed));
        stream
            .launch_host_callback(
                Box::new(move || r.store(true, Ordering::SeqCst)),
                LaunchOptions::new().on_complete(move |result| {
                    assert!(result.is_ok());
                    c.fetch_add(1, Ordering::SeqCst);
                }),
            )
            .unwrap();
        assert!(ran.load(Ordering::SeqCst), "ran before the launch returned");
        assert_eq!(completed.load(Ordering::SeqCst), 1, "completed at once");
        let a = runtime.allocate(1).unwrap();
        let b = runtime.allocate(200).unwrap();
        assert_eq!((a.start().offset, b.start().offset), (0, 128));
        assert_eq!(b.total_size(), 200);
        runtime.free(&a).unwrap();
        stream
            .launch_fill(&b, 1.0, DataFormat::Uint8, LaunchOptions::new())
            .unwrap();
        assert!(stream.query().unwrap());
        stream.synchronize().unwrap();
        runtime.default_stream().synchronize().unwrap();
        assert_eq!(
            runtime.calls(),
            NoopCalls {
                streams_created: 1,
                stream_creations_failed: 0,
                launches: 2,
                queries: 1,
                synchronizes: 2,
                allocations: 2,
                frees: 1,
            }
        );
        assert_eq!(runtime.synchronizes_of(0), Some(1));
        assert_eq!(runtime.synchronizes_of(1), Some(1));
        assert_eq!(runtime.synchronizes_of(2), None);
        assert_eq!(runtime.stream_count(), 2);
    }

    #[test]
    fn refused_creations_and_hooks() {
        let seen = Arc::new(AtomicU64::new(u64::MAX));
        let s = Arc::clone(&seen);
        let runtime = NoopRuntime::with_synchronize_hook(
            0,
            Box::new(move |id| s.store(id, Ordering::SeqCst)),
        );
        runtime.fail_next_stream_creations(2);
        for _ in 0..2 {
            let err = runtime
                .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                .unwrap_err();
            assert_eq!(err.status(), Status::RUNTIME_FAILED);
        }
        let stream = runtime
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .unwrap();
        assert_eq!(stream.id(), 1, "refused creations take no id");
        stream.synchronize().unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert_eq!(runtime.calls().stream_creations_failed, 2);
    }

    /// Two events with timing of `runtime`, recorded one after the other on
    /// its default stream; their elapsed time is refused before that.
    fn recorded_timed_pair(runtime: &dyn Runtime) -> (Box<dyn Event>, Box<dyn Event>) {
        let stream = runtime.default_stream();
        let start = runtime.create_event(true).unwrap();
        let end = runtime.create_event(true).unwrap();
        assert_eq!(
            start.elapsed_nanos(&*end).unwrap_err().status(),
            Status::INVALID_ARGUMENT,
            "never recorded: checked first"
        );
        stream.record_event(&*start, None).unwrap();
        stream.record_event(&*end, None).unwrap();
        assert_eq!(start.query(), Ok(true));
        (start, end)
    }

    #[test]
    fn events_complete_at_once_and_belong_to_their_runtime() {
        let runtime = NoopRuntime::new(0);
        let other = NoopRuntime::new(0);
        let stream = runtime.default_stream();
        let (start, end) = recorded_timed_pair(&runtime);
        assert_eq!(start.elapsed_nanos(&*end), Ok(0));
        stream.wait_event(&*start).unwrap();
        let foreign = other.create_event(false).unwrap();
        for err in [
            stream.record_event(&*foreign, None).unwrap_err(),
            stream.wait_event(&*foreign).unwrap_err(),
            start.elapsed_nanos(&*foreign).unwrap_err(),
        ] {
            assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
        }
    }

    #[test]
    fn an_elapsed_time_failure_comes_after_the_events_checks() {
        let runtime = NoopBackend::new(1)
            .with_elapsed_time_failure(Status::NOT_READY)
            .create_runtime(0)
            .unwrap();
        let (start, end) = recorded_timed_pair(&*runtime);
        assert_eq!(end.query(), Ok(true));
        assert_eq!(
            start.elapsed_nanos(&*end).unwrap_err().status(),
            Status::NOT_READY
        );
    }

    #[test]
    fn the_backend_makes_runtimes_of_its_devices() {
        let backend = NoopBackend::new(2).with_creation_delay(Duration::from_millis(1));
        assert_eq!(backend.device_count().unwrap(), 2);
        let runtime = backend.create_runtime(1).unwrap();
        assert_eq!(runtime.logical_device(), 1);
        let started = std::time::Instant::now();
        runtime
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(1));
        let err = backend.create_runtime(2).unwrap_err();
        assert_eq!(err.status(), Status::NO_DEVICE);
        assert!(
            err.message().contains("logical device 2 does not exist"),
            "{err}"
        );
    }
}

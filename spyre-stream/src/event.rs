//! `SpyreEvent`: a marker in stream order, to order work across streams
//! without blocking the host, to time it, and to await it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use flex_rt::sync::Mutex;
use flex_rt::{Capabilities, Event, FlexError, Notification, Status};

use crate::device::Device;
use crate::error::{Error, EventRole, Result};
use crate::marker::RuntimeEvent;
use crate::runtime;
use crate::signal::Signal;
use crate::stream::SpyreStream;
use crate::trace::{self, OperationKind};

/// A marker in a stream's order (torch-spyre would call it `SpyreEvent`;
/// `torch.cuda.Event`, cudarc's `CudaEvent`).
///
/// [`SpyreEvent::record`] on a stream captures exactly the work enqueued
/// there so far; the event completes when that work has. Other streams can
/// [`wait`](SpyreEvent::wait) for it without blocking the host, the host can
/// [`query`](SpyreEvent::query), [`synchronize`](SpyreEvent::synchronize) or
/// `.await` it ([`SpyreEvent::synchronize_async`]), and two events created
/// [`with_timing`](SpyreEvent::with_timing) give the device time between
/// them ([`SpyreEvent::elapsed_time`]).
///
/// ```
/// # fn main() -> spyre_stream::Result<()> {
/// use spyre_stream::{Device, LaunchOptions, SpyreEvent};
///
/// spyre_stream::set_backend(Box::new(spyre_mock::MockSystem::default()))?;
/// let copy = spyre_stream::stream_from_pool(Device::CURRENT, 0)?;
/// let compute = spyre_stream::stream_from_pool(Device::CURRENT, 0)?;
/// copy.launch_host_callback(|| println!("copy in"), LaunchOptions::new())?;
/// let copied = SpyreEvent::new()?;
/// copied.record(copy)?;
/// // Work on `compute` from here on starts after the copy, and this
/// // thread does not wait.
/// copied.wait(compute)?;
/// compute.launch_host_callback(|| println!("compute"), LaunchOptions::new())?;
/// compute.synchronize()?;
/// assert!(copied.query()?);
/// # Ok(()) }
/// ```
///
/// # The contract (PyTorch's and CUDA's rules, the same on every backend)
///
/// - Recording again moves the event: `query`, `synchronize` and later
///   waits see only the latest record; a wait already made keeps the record
///   it saw.
/// - An event never recorded is complete: `query` is `true`, `synchronize`
///   returns at once, `wait` does nothing (on a stream that has failed it
///   returns the stream's error, as every enqueue there does).
/// - If the recording stream fails before the event's point, the event
///   fails: `query` and `synchronize` return the record's error
///   (`STREAM_FAILED`, its message naming the stream's first error), and a
///   stream that waits on it fails too instead of waiting forever; its
///   error names the event's stream by its runtime id
///   ([`flex_rt::Stream::id`] of [`crate::StreamPool::resolve`]). One
///   exception, through a flex library: where the stream failed because
///   an operation's completion (`on_complete`) panicked, which the library
///   is not told, the event fails but a stream that waits on it does not
///   (its work runs).
/// - Waiting on an event recorded on the same stream is a no-op.
/// - Dropping an event never blocks: records and waits already made are
///   honoured, and its resources are freed when they are done.
///
/// # Device-side waits
///
/// Where the device can make a stream wait ([`capabilities`]`.device_side_wait`,
/// the software device by default), [`SpyreEvent::wait`] returns at once. On
/// today's Spyre card it cannot: `wait` then blocks the calling thread until
/// the event has completed, which keeps the ordering correct but makes the
/// host wait. Check the capability where that matters.
///
/// # Thread-safety
///
/// `Send + Sync`: an event may be recorded, waited on, queried and awaited
/// from any thread; concurrent records are serialized, the last one wins.
pub struct SpyreEvent {
    shared: Arc<Shared>,
    device: u8,
    timing: bool,
    /// Whether a record has been made (for [`SpyreEvent::elapsed_time`]'s
    /// errors); the runtime keeps the rest.
    recorded: AtomicBool,
    /// The trace link of the latest record, when it was traced (0: not).
    traced_record: AtomicU64,
    /// Held, while tracing, across a record and the store of its link, and
    /// across a wait that returns at once and the load: a record racing a
    /// wait then cannot make the wait's entry link a record other than the
    /// one it waits for. Records made with the trace off do not take it
    /// (they would pay for it on every record): one that began before the
    /// trace started and lands during the first traced record of the same
    /// event can make that record's entry finish with its own record, and
    /// clear its link. Only the trace is affected, never the ordering.
    trace_order: Mutex<()>,
}

/// A [`SpyreEvent`]'s runtime event and the count of its records, shared
/// with the futures that await it.
struct Shared {
    event: RuntimeEvent,
    /// Records begun ([`SpyreEvent::record`] called, less those refused or
    /// ended by a panic before the runtime took them, uncounted again as
    /// they return: [`BegunRecord`]), and records made (taken by the
    /// runtime; counted before a traced record's notification, so a record
    /// taken stays counted whatever follows it).
    begun: AtomicU64,
    made: AtomicU64,
}

impl Shared {
    /// Records begun and made, in that order.
    fn records(&self) -> (u64, u64) {
        let begun = self.begun.load(Ordering::SeqCst);
        (begun, self.made.load(Ordering::SeqCst))
    }
}

/// A record counted as begun in [`Shared::begun`] until it is counted as
/// made in [`Shared::made`] ([`BegunRecord::made`]). Dropped unmade (the
/// record refused, or a panic out of it), it is uncounted again: the event
/// is as if the record had never begun, so that a future made before it
/// keeps its error's detail and `elapsed_time` does not take it for a
/// record in progress (a reader that saw it begun took it as one, which is
/// safe).
struct BegunRecord<'a> {
    begun: &'a AtomicU64,
    made: &'a AtomicU64,
}

impl<'a> BegunRecord<'a> {
    fn begin(shared: &'a Shared) -> Self {
        Self::counted(&shared.begun, &shared.made)
    }

    fn counted(begun: &'a AtomicU64, made: &'a AtomicU64) -> Self {
        begun.fetch_add(1, Ordering::SeqCst);
        Self { begun, made }
    }

    /// Counts the record as made; it stays begun.
    fn made(self) {
        self.made.fetch_add(1, Ordering::SeqCst);
        std::mem::forget(self);
    }
}

impl Drop for BegunRecord<'_> {
    fn drop(&mut self) {
        self.begun.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Measurements [`SpyreEvent::elapsed_time`] makes at most when the
/// runtime reports an event pending or failed that was complete when
/// checked. Each retry follows a record by another thread in between (a
/// runtime that disagrees with its own queries without one gets its error
/// returned at once); the bound ends the call even while another thread
/// records the events again and again.
const ELAPSED_TIME_ATTEMPTS: u32 = 16;

impl SpyreEvent {
    /// An event without timing (`torch.cuda.Event()`), on the calling
    /// thread's current device (the process's one device); starts the
    /// runtime if needed, as [`crate::stream_from_pool`] does.
    ///
    /// # Errors
    /// As [`crate::stream_from_pool`] for the current device;
    /// [`Error::Unsupported`] when the runtime has no events (a flex library
    /// of ABI 1.0); the runtime's error ([`Error::Flex`]).
    pub fn new() -> Result<Self> {
        Self::create(false)
    }

    /// An event that takes a device timestamp when it completes
    /// (`torch.cuda.Event(enable_timing=True)`), for
    /// [`SpyreEvent::elapsed_time`]. Slightly more costly to complete.
    ///
    /// # Errors
    /// As [`SpyreEvent::new`]; [`Error::Unsupported`] when the device
    /// cannot time events ([`capabilities`]`.event_timing` is false), so
    /// that the lack shows here rather than at the first `elapsed_time`.
    pub fn with_timing() -> Result<Self> {
        Self::create(true)
    }

    fn create(timing: bool) -> Result<Self> {
        let pool = runtime::pool_for(Device::CURRENT)?;
        // A runtime that cannot say (a flex library of ABI 1.0 has no
        // events either, which the creation below reports) is not refused.
        if timing
            && pool
                .runtime()
                .capabilities()
                .is_ok_and(|capabilities| !capabilities.event_timing)
        {
            return Err(Error::Unsupported(FlexError::new(
                Status::UNSUPPORTED,
                "flex_event_create",
                "this device cannot time events (its event_timing capability is false): create the event with SpyreEvent::new and time on the host",
            )));
        }
        let event = pool
            .runtime()
            .create_event(timing)
            .map_err(Error::from_abi_1_1_call)?;
        Ok(Self::of(RuntimeEvent::owned(event), pool.device(), timing))
    }

    /// A marker event of `stream`'s runtime, lent for one use: see
    /// [`crate::marker`].
    fn marker(stream: SpyreStream) -> Result<Self> {
        let event = runtime::markers_of(stream)?
            .take()
            .map_err(Error::from_abi_1_1_call)?;
        Ok(Self::of(event, stream.device_index(), false))
    }

    fn of(event: RuntimeEvent, device: u8, timing: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                event,
                begun: AtomicU64::new(0),
                made: AtomicU64::new(0),
            }),
            device,
            timing,
            recorded: AtomicBool::new(false),
            traced_record: AtomicU64::new(0),
            trace_order: Mutex::new(()),
        }
    }

    /// The logical device the event belongs to.
    pub fn device_index(&self) -> u8 {
        self.device
    }

    /// Whether the event was created with timing.
    pub fn timing(&self) -> bool {
        self.timing
    }

    /// Records the event on `stream` (`Event.record(stream)`;
    /// `cudaEventRecord`): it now marks the end of the work enqueued there
    /// so far. Does not wait for the device; concurrent records of one event
    /// are serialized by the runtime. A record costs what a launch does: no
    /// completion is attached (an await asks the runtime for one when it is
    /// made, [`SpyreEvent::synchronize_async`]).
    ///
    /// # Errors
    /// As [`SpyreStream::query`] for the stream ([`Error::WrongDevice`] for a
    /// stream of another device); the stream's error if it has failed. On
    /// error the event is unchanged.
    pub fn record(&self, stream: SpyreStream) -> Result<()> {
        let handle = stream.handle()?;
        let begun = BegunRecord::begin(&self.shared);
        if !trace::is_on() {
            handle.record_event(self.event(), None)?;
            self.traced_record.store(0, Ordering::Relaxed);
            self.made(begun);
            return Ok(());
        }
        let (completion, entry) = trace::record(stream, OperationKind::EventRecord, 0, false, None);
        let link = entry.link;
        let _order = self.trace_order.lock();
        if let Err(error) = handle.record_event(self.event(), None) {
            entry.refused();
            return Err(error.into());
        }
        self.traced_record.store(link, Ordering::Relaxed);
        // Made once the runtime has taken it, before anything else can
        // fail or panic.
        self.made(begun);
        // Told when the record completes as a waiter is, not by a
        // completion of the record's own: that would make the record an
        // operation the device must run to call it, which work of other
        // streams could delay, and the event with it.
        match self.event().notify(completion) {
            Ok(Notification::Pending) => {}
            Ok(Notification::Settled(outcome)) => entry.finished(outcome.is_err()),
            // The runtime could not say (closed meanwhile): the trace
            // shows the record as not finished.
            Err(_) => {}
        }
        Ok(())
    }

    /// Counts the event as recorded, then the record `begun` as made.
    fn made(&self, begun: BegunRecord<'_>) {
        self.recorded.store(true, Ordering::Release);
        begun.made();
    }

    /// Makes every operation enqueued on `stream` from now on start only
    /// after the event's latest record has completed (`Event.wait(stream)`;
    /// `cudaStreamWaitEvent`). Returns at once where the device waits on the
    /// device side; else blocks until the event has completed (see
    /// "Device-side waits"). Either way the wait is work of `stream`, as in
    /// CUDA: until the event has completed, `stream`'s
    /// [`SpyreStream::query`] is `false` and its
    /// [`SpyreStream::synchronize`] waits (so `s.wait_stream(other)` then
    /// `s.synchronize()` covers `other`'s work, as in PyTorch), unless
    /// `stream` has failed: then both return its error at once, as nothing
    /// behind the wait runs. A no-op for an event never recorded or
    /// recorded on `stream`, but on a failed `stream`, which refuses every
    /// wait with its error.
    ///
    /// # Errors
    /// As [`SpyreEvent::record`]; without device-side waits,
    /// [`Error::Flex`] with `UNSUPPORTED` when called from a completion or
    /// host callback (it would wait for itself; the software device in
    /// process refuses only when it would actually have to wait, a flex
    /// library always).
    pub fn wait(&self, stream: SpyreStream) -> Result<()> {
        let handle = stream.handle()?;
        if !trace::is_on() {
            handle.wait_event(self.event())?;
            return Ok(());
        }
        let link = if runtime::pool_of(stream)?
            .runtime()
            .capabilities()
            .is_ok_and(|c| c.device_side_wait)
        {
            // Returns at once: no record can slip between the wait and
            // the link it reads.
            let _order = self.trace_order.lock();
            handle.wait_event(self.event())?;
            self.traced_record.load(Ordering::Relaxed)
        } else {
            // Blocks until the record completes, which may need a record
            // of this event by a callback: no lock is held meanwhile. The
            // link is the wait's only if no record was made during it.
            let before = self.traced_link();
            handle.wait_event(self.event())?;
            let after = self.traced_link();
            if before == after { before } else { 0 }
        };
        trace::record_wait(stream, (link != 0).then_some(link));
        Ok(())
    }

    /// The link of the latest traced record, once no record is half made.
    fn traced_link(&self) -> u64 {
        let _order = self.trace_order.lock();
        self.traced_record.load(Ordering::Relaxed)
    }

    /// Whether the latest record has completed (`Event.query()`): `true`
    /// also for an event never recorded. Never blocks.
    ///
    /// # Errors
    /// The record's error if it failed ([`Error::Flex`] with `STREAM_FAILED`
    /// naming the recording stream's first error, or `SHUTDOWN` on a stream
    /// that needs shutdown);
    /// [`Error::ForkedProcess`] in a child forked after the start.
    pub fn query(&self) -> Result<bool> {
        runtime::check_not_forked()?;
        Ok(self.event().query()?)
    }

    /// Blocks until the latest record has completed (`Event.synchronize()`);
    /// returns at once for an event never recorded. No lock of the pool is
    /// held while waiting.
    ///
    /// # Errors
    /// The record's error if it failed (as for [`SpyreEvent::query`]); `UNSUPPORTED` from
    /// a completion or host callback ([`Error::Flex`]; the software device in
    /// process refuses only when the event has not completed, a flex
    /// library always); [`Error::ForkedProcess`] in a child forked after the
    /// start (the parent's device would never complete the record there).
    pub fn synchronize(&self) -> Result<()> {
        runtime::check_not_forked()?;
        Ok(self.event().synchronize()?)
    }

    /// A future that resolves when the latest record (as of this call) has
    /// completed, with `Ok(())` or the record's error (as for
    /// [`SpyreEvent::query`]: through a flex library, whose notification
    /// carries only a status, the future asks the event's query for the
    /// message, unless the event was recorded again meanwhile); at once for
    /// an event never recorded. The future keeps the runtime's event until
    /// it is dropped. Its waker is driven by a completion the
    /// runtime calls when the record completes (asked for now, with
    /// `flex_event_notify`; nothing is added to any stream): no thread
    /// blocks and nothing polls. Works on any executor; dropping it early is
    /// fine (its task's waker is released then), but its completion stays
    /// registered on the record until the record settles (a few hundred
    /// bytes each): a loop that makes and drops futures on one
    /// long-pending record (a `select!` with a timeout, say) should keep
    /// one future and poll it again. A runtime error while asking resolves
    /// the future with it; in a
    /// child forked after the start the future resolves with
    /// [`Error::ForkedProcess`] (nothing is asked of the parent's runtime).
    /// Blocking a thread on it (`block_on`) inside a completion or host
    /// callback of the device's runtime never returns when the record is
    /// behind that callback (the blocking [`SpyreEvent::synchronize`]
    /// refuses there instead); hand it to a task.
    pub fn synchronize_async(&self) -> SynchronizeFuture {
        let awaited = self.awaited();
        SynchronizeFuture {
            // In a forked child nothing is asked; the first poll says why.
            signal: runtime::check_not_forked()
                .is_ok()
                .then(|| self.completion_signal()),
            slot: None,
            awaited,
        }
    }

    /// The event as a future made now awaits it: read before the future
    /// asks the runtime, so that a record counted as begun after this is
    /// one the future may not be bound to.
    fn awaited(&self) -> Awaited {
        let (begun, made) = self.shared.records();
        Awaited {
            shared: Arc::clone(&self.shared),
            begun: (made == begun).then_some(begun),
        }
    }

    /// The runtime's event.
    fn event(&self) -> &dyn Event {
        &*self.shared.event
    }

    /// A signal set when the latest record (as of this call) completes or
    /// fails: the runtime's notification (`flex_event_notify`), or set at
    /// once when there is nothing to wait for.
    fn completion_signal(&self) -> Arc<Signal> {
        let signal = Signal::new();
        let completes = Arc::clone(&signal);
        match self
            .event()
            .notify(Box::new(move |outcome| completes.complete(outcome)))
        {
            Ok(Notification::Pending) => {}
            // Complete, failed, or never recorded: the outcome of the
            // record the future is bound to, whatever was recorded since.
            Ok(Notification::Settled(outcome)) => signal.complete(outcome),
            Err(error) => signal.complete(Err(error)),
        }
        signal
    }

    /// The device time from this event's completion to `end`'s
    /// (`Event.elapsed_time(end)`, there in milliseconds; here a
    /// [`Duration`]). Timestamps are taken when the device reaches each
    /// event in stream order, not when the host recorded it.
    ///
    /// # Errors
    /// [`Error::EventWithoutTiming`], [`Error::EventNotRecorded`],
    /// [`Error::EventNotComplete`] or [`Error::EventFailed`] (with the
    /// record's error) naming the event (start or end) whose precondition
    /// failed (also when another thread records either event again during
    /// the call, and the new record is pending or fails);
    /// [`Error::EventsOutOfOrder`] when `end` completed before this event;
    /// the runtime's other errors ([`Error::Flex`]), among them its
    /// `NOT_READY`, `STREAM_FAILED` or `SHUTDOWN` when it reports a record
    /// pending or failed that its query found complete, with no record of
    /// another thread in between to explain it (or after 16 measurements
    /// that each had one);
    /// [`Error::ForkedProcess`] in a child forked after the start, before
    /// any of those.
    pub fn elapsed_time(&self, end: &SpyreEvent) -> Result<Duration> {
        runtime::check_not_forked()?;
        let both = [(EventRole::Start, self), (EventRole::End, end)];
        // Each precondition for both events before the next one, so the
        // error names the first that fails in the order a caller fixes them.
        for (which, event) in both {
            if !event.timing {
                return Err(Error::EventWithoutTiming { which });
            }
        }
        for (which, event) in both {
            if !event.recorded.load(Ordering::Acquire) {
                return Err(Error::EventNotRecorded { which });
            }
        }
        // Both events' records begun and made, taken before each check: a
        // record of another thread in progress then, or begun since, is
        // what can make a measurement disagree with the check.
        let records = || both.map(|(_, event)| event.shared.records());
        let mut before = records();
        for (which, event) in both {
            event.check_complete(which)?;
        }
        let mut attempts = 0;
        let nanos = loop {
            attempts += 1;
            match self.event().elapsed_nanos(end.event()) {
                Ok(nanos) => break nanos,
                // Recorded again by another thread since the check: the
                // event whose new record is pending, or failed, is named as
                // the check names it; if that record has completed too,
                // measure again. Without such a record (or after
                // `ELAPSED_TIME_ATTEMPTS` measurements) the runtime
                // contradicts its own queries: its error is returned.
                Err(error)
                    if matches!(
                        error.status(),
                        Status::NOT_READY | Status::STREAM_FAILED | Status::SHUTDOWN
                    ) =>
                {
                    let after = records();
                    for (which, event) in both {
                        event.check_complete(which)?;
                    }
                    let recorded_meanwhile =
                        after != before || before.iter().any(|(begun, made)| begun != made);
                    if !recorded_meanwhile || attempts >= ELAPSED_TIME_ATTEMPTS {
                        return Err(error.into());
                    }
                    before = after;
                }
                Err(error) => return Err(error.into()),
            }
        };
        match u64::try_from(nanos) {
            Ok(forward) => Ok(Duration::from_nanos(forward)),
            Err(_) => Err(Error::EventsOutOfOrder {
                by: Duration::from_nanos(nanos.unsigned_abs()),
            }),
        }
    }

    /// [`SpyreEvent::elapsed_time`]'s check that this event, its `which`,
    /// has completed.
    ///
    /// # Errors
    /// [`Error::EventNotComplete`] while its record is pending,
    /// [`Error::EventFailed`] when the record failed, naming `which`;
    /// [`SpyreEvent::query`]'s other errors.
    fn check_complete(&self, which: EventRole) -> Result<()> {
        match self.query() {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::EventNotComplete { which }),
            // A failed record's errors (see `query`); any other is the
            // runtime's, not the record's.
            Err(Error::Flex(source))
                if matches!(source.status(), Status::STREAM_FAILED | Status::SHUTDOWN) =>
            {
                Err(Error::EventFailed { which, source })
            }
            Err(other) => Err(other),
        }
    }
}

impl fmt::Debug for SpyreEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpyreEvent")
            .field("device", &self.device)
            .field("timing", &self.timing)
            .field("recorded", &self.recorded.load(Ordering::Relaxed))
            .finish()
    }
}

/// The future of [`SpyreEvent::synchronize_async`] and
/// [`SpyreStream::synchronize_async`]: resolves with `Ok(())` when the
/// awaited work has completed, or with the error it failed with
/// ([`Error::Flex`]); polled in a child forked after the start (made there
/// or before the fork), with [`Error::ForkedProcess`], as the parent's
/// device will never complete it there. `Send`; dropping it before
/// completion is safe.
#[must_use = "a future does nothing unless awaited"]
pub struct SynchronizeFuture {
    /// `None`: nothing to wait for.
    signal: Option<Arc<Signal>>,
    /// This future's place among the signal's waiters, once polled.
    slot: Option<usize>,
    /// The event awaited (a stream's marker, kept until the future is
    /// dropped, which never blocks), to name the cause of a failure.
    awaited: Awaited,
}

/// The event a [`SynchronizeFuture`] awaits, and the count of its records
/// begun when the future was made (`None`: one was being made then).
struct Awaited {
    shared: Arc<Shared>,
    begun: Option<u64>,
}

impl Awaited {
    /// `error`, the failure the runtime gave the future's notification,
    /// with the message of the event's query instead when it has the same
    /// status and no record has begun since the future was made (so the
    /// query still reports the record the future awaits): a flex library
    /// tells a notification only the status, and its query's message
    /// names the recording stream's first error.
    fn explain(&self, error: FlexError) -> FlexError {
        let Some(begun) = self.begun else {
            return error;
        };
        match self.shared.event.query() {
            Err(cause)
                if cause.status() == error.status()
                    && self.shared.begun.load(Ordering::SeqCst) == begun =>
            {
                FlexError::new(error.status(), error.call(), cause.message())
            }
            _ => error,
        }
    }
}

impl Future for SynchronizeFuture {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Err(forked) = runtime::check_not_forked() {
            return Poll::Ready(Err(forked));
        }
        let this = self.get_mut();
        let Some(signal) = &this.signal else {
            return Poll::Ready(Ok(()));
        };
        signal
            .poll(&mut this.slot, cx)
            .map(|outcome| outcome.map_err(|error| Error::Flex(this.awaited.explain(error))))
    }
}

impl Drop for SynchronizeFuture {
    /// Releases the task's waker now rather than when the record settles.
    fn drop(&mut self) {
        // In a forked child a parent thread may have held the signal's lock
        // at the fork: nothing there is released.
        if runtime::check_not_forked().is_err() {
            return;
        }
        if let (Some(signal), Some(slot)) = (&self.signal, self.slot) {
            signal.forget(slot);
        }
    }
}

impl fmt::Debug for SynchronizeFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SynchronizeFuture")
            .field("waits", &self.signal.is_some())
            .finish()
    }
}

impl SpyreStream {
    /// Records `event` on this stream (`Stream.record_event(event)`); see
    /// [`SpyreEvent::record`].
    ///
    /// # Errors
    /// As [`SpyreEvent::record`].
    pub fn record_event(self, event: &SpyreEvent) -> Result<()> {
        event.record(self)
    }

    /// Makes this stream's later work wait for `event`
    /// (`Stream.wait_event(event)`; cudarc's `CudaStream::wait`); see
    /// [`SpyreEvent::wait`].
    ///
    /// # Errors
    /// As [`SpyreEvent::wait`].
    pub fn wait_event(self, event: &SpyreEvent) -> Result<()> {
        event.wait(self)
    }

    /// Makes this stream's later work wait for all work enqueued on `other`
    /// so far (`Stream.wait_stream(other)`; cudarc's `CudaStream::join`):
    /// records a marker event on `other` and waits on it (the runtime's
    /// marker events are kept idle between uses, not made each time). When
    /// `other` is this stream nothing is enqueued (PyTorch's no-op), but
    /// the call is checked as any wait is: the same errors, and a failed
    /// stream refuses it. Never blocks the host where the device waits on
    /// the device side.
    ///
    /// # Errors
    /// For the marker, which starts nothing: as [`SpyreStream::query`] for
    /// `other` ([`Error::NoHandle`], [`Error::WrongDevice`],
    /// [`Error::ForkedProcess`]), [`Error::RuntimeReset`] after
    /// [`crate::free_runtime`], [`Error::Unsupported`] when the runtime has
    /// no events (a flex library of ABI 1.0) and the runtime's error making
    /// it ([`Error::Flex`]); as [`SpyreEvent::wait`] for this stream;
    /// a refused record on `other` (it has failed, say) is [`Error::Flex`]
    /// with the call `wait_stream` and a message naming `other`; for this
    /// stream itself, which waits for nothing, the marker's errors all the
    /// same (a marker is taken and given back, so that a runtime without
    /// events refuses a wait whichever streams it names), then its error as
    /// [`SpyreStream::query`] reports it.
    pub fn wait_stream(self, other: SpyreStream) -> Result<()> {
        if other == self {
            drop(SpyreEvent::marker(self)?);
            return self.query().map(drop);
        }
        let marker = SpyreEvent::marker(other)?;
        marker.record(other).map_err(|error| match error {
            // Say which stream refused: the caller asked about two.
            Error::Flex(refused) => Error::Flex(FlexError::new(
                refused.status(),
                "wait_stream",
                format!(
                    "the stream to wait for, {other}, refused the record of its marker event: {refused}"
                ),
            )),
            other_error => other_error,
        })?;
        marker.wait(self)
    }

    /// A future that resolves when all work enqueued on this stream so far
    /// has completed: the awaitable form of [`SpyreStream::synchronize`],
    /// driven by the device's completion callback (no thread blocks, no
    /// polling). Resolves with an error naming the stream's first error if
    /// that work fails. Blocking a thread on it (`block_on`) inside a
    /// completion or host callback of the device's runtime never returns
    /// when the work it waits for is behind that callback (the blocking
    /// [`SpyreStream::synchronize`] refuses there instead); hand it to a
    /// task.
    /// Records a marker event, as [`SpyreStream::wait_stream`] does, lent to
    /// the future until it is dropped.
    ///
    /// Its waker is called from the record's notification, which is work of
    /// the stream as every completion is (CUDA's host functions are too): a
    /// task woken by it may find [`SpyreStream::query`] still `false` for
    /// the moment the device's other notifications of that point take
    /// (another future's waker, say), and [`SpyreStream::synchronize`]
    /// waits for them.
    ///
    /// # Errors
    /// For the marker, which starts nothing: as [`SpyreStream::query`]
    /// ([`Error::NoHandle`], [`Error::WrongDevice`],
    /// [`Error::ForkedProcess`]), [`Error::RuntimeReset`] after
    /// [`crate::free_runtime`], [`Error::Unsupported`] when the runtime has
    /// no events (a flex library of ABI 1.0) and the runtime's error making
    /// it ([`Error::Flex`]); as [`SpyreEvent::record`].
    pub fn synchronize_async(self) -> Result<SynchronizeFuture> {
        let marker = SpyreEvent::marker(self)?;
        marker.record(self)?;
        let awaited = marker.awaited();
        let signal = marker.completion_signal();
        Ok(SynchronizeFuture {
            signal: Some(signal),
            slot: None,
            awaited,
        })
    }
}

/// What the process's device can do beyond flex ABI 1.0: whether a stream
/// waits on an event on the device side, and whether events can be timed.
/// Starts the runtime if needed.
///
/// # Errors
/// As [`crate::stream_from_pool`] for the device; [`Error::Unsupported`] for
/// a flex library of ABI 1.0.
pub fn capabilities(device: Device) -> Result<Capabilities> {
    runtime::pool_for(device)?
        .runtime()
        .capabilities()
        .map_err(Error::from_abi_1_1_call)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record made stays counted as begun and made; one refused, or one
    /// a panic ends (a backend's), leaves both counts as they were, so the
    /// event does not look as if a record were in progress for ever.
    #[test]
    fn only_a_record_made_stays_counted() {
        let (begun, made) = (AtomicU64::new(0), AtomicU64::new(0));
        let counts = || (begun.load(Ordering::SeqCst), made.load(Ordering::SeqCst));
        BegunRecord::counted(&begun, &made).made();
        assert_eq!(counts(), (1, 1));
        drop(BegunRecord::counted(&begun, &made));
        assert_eq!(counts(), (1, 1));
        let panicked = std::panic::catch_unwind(|| {
            let _begun = BegunRecord::counted(&begun, &made);
            assert_eq!(counts(), (2, 1), "counted as begun while in progress");
            panic!("a backend's panic");
        });
        assert!(panicked.is_err());
        assert_eq!(counts(), (1, 1));
    }
}

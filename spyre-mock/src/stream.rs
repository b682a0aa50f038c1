//! One stream of the software device: a FIFO queue of operations.
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::sync::MutexGuard;
use flex_rt::{
    Completion, CompositeAddress, DataFormat, Event, FlexError, HostBuffer, HostCallback,
    LaunchOptions, Result, Status, Stream, StreamMode, StreamPriority, check_copy_size,
};

use crate::engine::Device;
use crate::event::MockEvent;
use crate::inbox::Inbox;
use crate::op::{Op, Pending};
use crate::progress::Progress;
use crate::raw_call::{OpCompletion, RawCompletion};
use crate::record::Record;
use crate::scheduler::{Refused, Scheduler};

/// A stream of a [`crate::MockRuntime`]; implements [`flex_rt::Stream`].
///
/// Operations run in submission order, one at a time; different streams run
/// concurrently on the runtime's engines (see the [crate docs](crate)). Every
/// launch goes through [`MockStream::enqueue`].
///
/// `pipeline_barrier` is accepted and has no observable effect: a stream
/// already starts an operation only after the previous one has completed,
/// with no overlap. `track_hazards` is recorded ([`MockStream::tracks_hazards`])
/// but orders nothing across streams.
///
/// Thread-safety: `Send + Sync`. Launches on one stream from several
/// threads are serialized by the stream's own lock (taken inside the
/// runtime's scheduler lock when a launch needs that); their order is the
/// order in which they take it.
pub struct MockStream {
    id: u64,
    index: usize,
    priority: StreamPriority,
    track_hazards: bool,
    device: Arc<Device>,
    /// What the stream shares with the scheduler without its lock: the
    /// counts `query` and `pending_operations` read and `synchronize`
    /// watches, and where `synchronize` blocks.
    progress: Arc<Progress>,
    /// Where a launch goes without the scheduler lock while the scheduler
    /// holds the stream (see [`crate::inbox`]).
    inbox: Arc<Inbox>,
}

impl MockStream {
    /// The stream scheduled as `index` on `device`'s scheduler, locked by
    /// the caller as `scheduler`.
    pub(crate) fn new(
        index: usize,
        priority: StreamPriority,
        track_hazards: bool,
        device: Arc<Device>,
        scheduler: &Scheduler,
    ) -> Self {
        Self {
            id: index as u64,
            index,
            priority,
            track_hazards,
            device,
            progress: scheduler.stream(index).progress(),
            inbox: scheduler.stream(index).inbox(),
        }
    }

    /// Enqueues `op` at the end of the stream: the entry point of every
    /// launch with a boxed completion (or none), also for a C-ABI layer that
    /// builds [`Op`]s from raw pointers (see [`MockStream::enqueue_raw`] for
    /// an unboxed completion).
    ///
    /// Checks, in order: the operation's sizes ([`Status::INVALID_ARGUMENT`]);
    /// whether the stream is closed ([`MockStream::close`],
    /// [`Status::INVALID_HANDLE`]), needs shutdown ([`Status::SHUTDOWN`]) or has failed
    /// ([`Status::STREAM_FAILED`]); a due [`MockStream::fail_nth_launch`]
    /// fault ([`Status::LAUNCH_FAILED`]). On `Err` nothing is enqueued and
    /// `op` and the completion are dropped on the calling thread, after the
    /// scheduler lock is released. A launch on a stream that has work
    /// queued or running, and none of those states or faults, takes only
    /// the stream's own lock, unless the runtime's use-after-free detector
    /// is on (see the [crate docs](crate)). On `Ok` the completion is
    /// called exactly once on an engine thread, never inside this call; the
    /// operation's host memory (`op`'s source or sink) is dropped before
    /// it.
    ///
    /// # Errors
    /// As listed above.
    pub fn enqueue(&self, op: Op, options: LaunchOptions) -> Result<()> {
        let LaunchOptions {
            pipeline_barrier: _,
            completion,
        } = options;
        self.enqueue_pending(op, completion.map(OpCompletion::Boxed))
    }

    /// [`MockStream::enqueue`] with a [`RawCompletion`] instead of a boxed
    /// one: the same checks, order and completion rules, and no heap
    /// allocation for the completion (with [`Op::raw_host_fn`], none for
    /// the operation either; a device address or host memory in `op` is
    /// allocated as ever). For a C-ABI layer, whose completions are a
    /// function pointer and user data.
    ///
    /// # Errors
    /// As [`MockStream::enqueue`]'s; a refused launch drops `completion`
    /// uncalled.
    pub fn enqueue_raw(&self, op: Op, completion: Option<RawCompletion>) -> Result<()> {
        self.enqueue_pending(op, completion.map(OpCompletion::Raw))
    }

    /// The launch itself, for [`MockStream::enqueue`] and
    /// [`MockStream::enqueue_raw`].
    fn enqueue_pending(&self, mut op: Op, completion: Option<OpCompletion>) -> Result<()> {
        op.validate()?;
        let pending = Pending::new(op, completion);
        // Behind work the scheduler holds: nothing for the engines to
        // decide, so no scheduler lock.
        let Err(pending) = self.inbox.try_push(pending, &self.progress) else {
            return Ok(());
        };
        self.submit(|scheduler| scheduler.admit(self.index, pending), || {})
    }

    /// Admits work to the scheduler with `admit`, runs `on_admitted` under
    /// the scheduler lock if it was, and, if the stream became ready while
    /// no other was, tells the engines: the work epoch moves under the lock
    /// (a watching engine sees it), and a blocked one is woken after it
    /// when none is watching.
    /// What `admit` refused is dropped after the lock is released (it may
    /// hold user code).
    fn submit<R>(
        &self,
        admit: impl FnOnce(&mut Scheduler) -> std::result::Result<bool, Refused<R>>,
        on_admitted: impl FnOnce(),
    ) -> Result<()> {
        let (admitted, tell) = {
            let mut scheduler = self.device.scheduler.lock();
            // Streams ready already have an engine coming for them: one
            // busy, which takes the next ready stream when it comes back,
            // or one told when the first of them was made ready, which
            // tells the next idle one when it sees more (`crate::engine`).
            // So only a stream made ready while none was tells the engines
            // (as an executor wakes a worker only for an empty queue).
            let others_ready = scheduler.has_ready();
            let admitted = admit(&mut scheduler);
            if admitted.is_ok() {
                on_admitted();
            }
            let tell = matches!(admitted, Ok(true)) && !others_ready;
            // Under the lock, where watchers come and go: one that is
            // watching now takes the lock and looks before it blocks.
            let watched = tell.then(|| {
                self.device.mark_work();
                scheduler.watching != 0
            });
            (admitted, watched)
        };
        match admitted {
            Ok(_) => {
                if let Some(watched) = tell {
                    self.device.wake_idle(watched);
                }
                Ok(())
            }
            Err(refused) => {
                let (err, rejected) = *refused;
                drop(rejected);
                Err(err)
            }
        }
    }

    /// Whether the stream was created with hazard tracking.
    pub fn tracks_hazards(&self) -> bool {
        self.track_hazards
    }

    /// The ordering mode; always [`StreamMode::StrictOrdering`].
    pub fn mode(&self) -> StreamMode {
        StreamMode::StrictOrdering
    }

    /// The logical device of the stream's runtime.
    pub fn logical_device(&self) -> u32 {
        self.device.index
    }

    /// Operations enqueued and not yet complete (completion returned). An
    /// event record counts only while it is a marker operation (with a
    /// completion); usually it is no operation at all. A device-side wait
    /// that holds the stream (its record pending, or failed) counts as one
    /// until an engine has passed it. Takes no lock.
    pub fn pending_operations(&self) -> u64 {
        self.progress.pending()
    }

    /// Operations enqueued on the stream so far, counted as
    /// [`MockStream::pending_operations`] counts them; never decreases.
    /// Two equal readings mean that nothing was enqueued on the stream in
    /// between: a caller that must find the runtime quiet (the C
    /// library's `flex_runtime_destroy`, which waits for the work that
    /// completions launch) reads it before and after its check. Takes no
    /// lock.
    pub fn enqueued_operations(&self) -> u64 {
        self.progress.submitted()
    }

    /// Whether a thread is blocked on the stream right now
    /// (`synchronize`, or a wait for one of its event records).
    #[cfg(test)]
    pub(crate) fn has_sleepers(&self) -> bool {
        self.progress.has_sleepers()
    }

    /// How often threads blocked on the stream were woken.
    #[cfg(test)]
    pub(crate) fn wakes(&self) -> u64 {
        self.progress.wakes()
    }

    /// Closes the stream: every launch, event record and wait on it from
    /// now on is refused with [`Status::INVALID_HANDLE`], while
    /// what was enqueued before runs and completes as ever (a launch that
    /// races this call is either refused or enqueued before it, never
    /// after). `query` and `synchronize` keep working. Closing twice is
    /// the same as once; nothing reopens a stream, and it stays in its
    /// runtime (the device's streams are append-only: its id is never
    /// reused).
    ///
    /// For a flex library's `flex_stream_destroy`, which must wait for the
    /// work a racing launch enqueued or refuse that launch: it closes the
    /// stream, then synchronizes it. Takes the runtime's scheduler lock
    /// once; never blocks on the stream's work.
    pub fn close(&self) {
        self.device.scheduler.lock().stream_mut(self.index).close();
    }

    /// Fault injection: the `n`th launch from now (1 = the next one) that
    /// passes the size and stream-state checks is refused with
    /// [`Status::LAUNCH_FAILED`]; nothing is enqueued and its completion is
    /// dropped uncalled. Launches before and after it are unaffected.
    /// Replaces an earlier setting; `n = 0` clears it.
    pub fn fail_nth_launch(&self, n: u64) {
        self.device
            .scheduler
            .lock()
            .set_fail_launch_in(self.index, (n > 0).then_some(n));
    }

    /// Fault injection: puts the stream into the needs-shutdown state, which
    /// only dropping the runtime clears. From then on
    /// [`Stream::needs_shutdown`] is true, launches are refused with
    /// [`Status::SHUTDOWN`], queued operations that have not started complete
    /// with [`Status::SHUTDOWN`] without running (the one running, if any,
    /// finishes normally), and the stream counts as failed: `query` and
    /// `synchronize` return its first error, which is this `SHUTDOWN` unless
    /// the stream had failed before.
    pub fn set_needs_shutdown(&self) {
        let error = FlexError::new(
            Status::SHUTDOWN,
            "needs_shutdown",
            "the stream needs a shutdown of its runtime (fault injected by MockStream::set_needs_shutdown)",
        );
        // Never refused; a stream held behind a wait becomes ready.
        let _ = self.submit(
            |scheduler| Ok::<_, Refused<()>>(scheduler.fail_for_shutdown(self.index, error)),
            || {},
        );
    }

    /// Fault injection: every operation of the stream that runs from now on
    /// holds its engine for `per_op` longer. [`Duration::ZERO`] restores
    /// normal speed.
    pub fn set_slowdown(&self, per_op: Duration) {
        self.device
            .scheduler
            .lock()
            .stream_mut(self.index)
            .set_slowdown(per_op);
    }
}

impl fmt::Debug for MockStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockStream")
            .field("device", &self.device.index)
            .field("id", &self.id)
            .field("priority", &self.priority)
            .field("track_hazards", &self.track_hazards)
            .finish()
    }
}

impl Stream for MockStream {
    fn id(&self) -> u64 {
        self.id
    }

    fn priority(&self) -> StreamPriority {
        self.priority
    }

    /// Whether everything enqueued so far has completed (completion
    /// returned). Never blocks, and takes no lock unless the stream has
    /// failed: it reads the stream's counts in the reverse of the order
    /// they are published in (see `Progress`), so a stream with a failed
    /// operation never reads as done.
    ///
    /// # Errors
    /// The stream's first error if it has failed (sticky).
    fn query(&self) -> Result<bool> {
        if let Some(done) = self.progress.done() {
            return Ok(done);
        }
        let scheduler = self.device.scheduler.lock();
        let state = scheduler.stream(self.index);
        match &state.error {
            Some(err) => Err(err.clone()),
            None => Ok(state.completed() == state.submitted()),
        }
    }

    /// Blocks until everything enqueued before the call has completed.
    ///
    /// # Errors
    /// The stream's first error if it has failed (sticky);
    /// [`Status::UNSUPPORTED`] when called on an engine thread of the same
    /// runtime (from a completion or host callback), where waiting could
    /// never end.
    fn synchronize(&self) -> Result<()> {
        if self.device.is_engine_thread() {
            return Err(FlexError::new(
                Status::UNSUPPORTED,
                "synchronize",
                "synchronize was called from a completion or host callback of the same runtime; it would wait for itself",
            ));
        }
        let device = &self.device;
        let mut scheduler = device.scheduler.lock();
        scheduler.log_synchronize(self.id);
        let target = scheduler.stream(self.index).submitted();
        if scheduler.stream(self.index).completed() < target {
            // Watch this stream's completion count without the lock as the
            // sync policy says (spin or yield; `Auto` only for
            // `AUTO_SPIN`), then block until an operation of this stream
            // that finishes wakes it.
            let deadline = device.spin_deadline();
            let done = || self.progress.completed() >= target;
            if !MutexGuard::unlocked(&mut scheduler, || device.watch(deadline, done)) {
                self.progress
                    .sleep_until(&mut scheduler, || target, |_| done());
            }
        }
        match &scheduler.stream(self.index).error {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }

    fn needs_shutdown(&self) -> Result<bool> {
        Ok(self
            .device
            .scheduler
            .lock()
            .stream(self.index)
            .needs_shutdown())
    }

    fn launch_h2d(
        &self,
        src: &HostBuffer,
        dst: &CompositeAddress,
        options: LaunchOptions,
    ) -> Result<()> {
        const CALL: &str = "launch_h2d";
        check_copy_size(CALL, src.len(), dst)?;
        let lease = src.lease_for_read(CALL)?;
        self.enqueue(Op::h2d(lease, dst.clone()), options)
    }

    fn launch_d2h(
        &self,
        src: &CompositeAddress,
        dst: &HostBuffer,
        options: LaunchOptions,
    ) -> Result<()> {
        const CALL: &str = "launch_d2h";
        check_copy_size(CALL, dst.len(), src)?;
        let lease = dst.lease_for_write(CALL)?;
        self.enqueue(Op::d2h(src.clone(), lease), options)
    }

    fn launch_compute(&self, program: &CompositeAddress, options: LaunchOptions) -> Result<()> {
        self.enqueue(Op::compute(program.clone()), options)
    }

    fn launch_host_callback(&self, callback: HostCallback, options: LaunchOptions) -> Result<()> {
        self.enqueue(Op::HostCallback(callback), options)
    }

    fn launch_fill(
        &self,
        dst: &CompositeAddress,
        value: f64,
        format: DataFormat,
        options: LaunchOptions,
    ) -> Result<()> {
        self.enqueue(Op::fill(dst.clone(), value, format), options)
    }

    /// The event completes, with a timestamp, when the stream has finished
    /// everything enqueued before the record (at once on a stream with
    /// nothing unfinished); a record takes no time in the timing model and
    /// counts as a launch for `fail_nth_launch`. Usually a mark the
    /// scheduler keeps beside the stream's FIFO, not an operation in it.
    fn record_event(&self, event: &dyn Event, completion: Option<Completion>) -> Result<()> {
        let event = MockEvent::of(event, &self.device, "record_event")?;
        let record = Arc::new(Record::new(self.index, self.id));
        let latest = Arc::clone(&record);
        self.submit(
            |scheduler| scheduler.admit_record(self.index, record, completion),
            || *event.latest.lock() = Some(latest),
        )
    }

    /// With device-side waits (the default) a gate in the scheduler and an
    /// operation behind it that completes once the wait has passed (so
    /// `query` and `synchronize` see the wait as work of the stream): no
    /// thread blocks. Without them (`device_side_wait(false)`, like today's
    /// card) blocks until the event completes.
    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        const CALL: &str = "wait_event";
        let event = MockEvent::of(event, &self.device, CALL)?;
        if self.device.device_side_wait {
            return self.submit(
                |scheduler| match event.latest.lock().clone() {
                    Some(record) => scheduler.add_gate(self.index, record),
                    // Nothing to wait for, but refused on a failed stream
                    // as every enqueue is.
                    None => scheduler
                        .check_accepts(self.index, CALL)
                        .map(|()| false)
                        .map_err(|err| Box::new((err, ()))),
                },
                || {},
            );
        }
        let record = {
            let scheduler = self.device.scheduler.lock();
            scheduler.check_accepts(self.index, CALL)?;
            let Some(record) = event.latest.lock().clone() else {
                return Ok(());
            };
            if record.stream == self.index {
                return Ok(());
            }
            record
        };
        if record.outcome().is_none() && self.device.is_engine_thread() {
            return Err(FlexError::new(
                Status::UNSUPPORTED,
                CALL,
                "this device cannot wait on the device side, so wait_event blocks the host; called from a completion or host callback of the same runtime it would wait for itself",
            ));
        }
        if self.device.wait_for_record(&record, CALL).is_err() {
            // A failed record fails this stream from this point on, as a
            // device-side wait does: work enqueued before still runs.
            self.submit(|scheduler| scheduler.add_gate(self.index, record), || {})?;
        }
        Ok(())
    }
}

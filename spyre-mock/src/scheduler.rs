//! Which operation runs next: per-stream FIFO queues and the ready order.
//!
//! This is plain data, always used under the runtime's scheduler mutex,
//! except for launches on an *active* stream (one running an operation or
//! with work queued): they wait in the stream's inbox without this lock
//! ([`crate::inbox`]) and are moved to the end of its queue before the
//! stream could go idle. A stream is *ready* when it has queued work and
//! is not running an operation. Engines take the ready stream with the
//! highest priority, and among those the one whose front operation was
//! enqueued first. A stream
//! runs at most one operation at a time: from taking it until its
//! completion has returned, the stream is *running* and not ready.
//!
//! An engine that takes a stream's front operation may take the operations
//! queued behind it as well, to run them without the lock in between
//! ([`Scheduler::take_batch`]): a *batch*, of at most
//! [`crate::engine::BATCH_LIMIT`] operations. Streams of the same or a
//! lower priority wait for it, even where their front operation was
//! enqueued first: a device orders nothing between streams beyond their
//! priority (`flex.h`), and one operation at a time per lock round trip
//! would keep the engines from keeping up with their callers. A
//! high-priority stream made ready during a batch of a normal-priority
//! stream stops it, so queued work of high-priority streams still starts
//! first.
//!
//! A device-side wait on an event is a *gate* in the waiting stream: it
//! holds the operations enqueued after it until the event's record has
//! completed. The first of them is the wait's own *wait marker* (a marker
//! operation, [`Op::Record`] of a record nobody else holds), so that a
//! wait is unfinished work of its stream until it has passed: the stream's
//! query, synchronize and later records see it as they see any operation.
//! A stream whose front operation is behind a closed gate is
//! *blocked*: not ready, and listed as a waiter of the recording stream,
//! which looks at its waiters again each time one of its operations
//! finishes. No thread waits for a gate. A gate whose record failed fails
//! the stream once nothing before the gate is unfinished (the wait marker
//! behind it is then skipped like any operation of a failed stream). (The
//! failure lands as the recording stream's operation
//! finishes, under the lock: a thread that saw the record fail without the
//! lock may look at the waiting stream a moment before.)
//!
//! An event record is usually not an operation at all but a *mark*: the
//! position in its stream it was recorded at, reached when the operation
//! before it finishes (at once on a stream with nothing unfinished). Only a
//! record that carries a completion is a marker operation ([`Op::Record`])
//! in the FIFO. Either way the record completes once everything enqueued
//! before it on its stream has run and its completion has returned; a mark
//! needs no engine to take it, so an idle engine is not woken again just to
//! pass it. Notifications of different records are not ordered with each
//! other: a record made while the engine calls an earlier record's
//! notifications is complete at once (everything before it has finished),
//! and may be seen complete before those calls return.
use std::collections::VecDeque;
use std::sync::Arc;
#[cfg(not(spyre_loom))]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use flex_rt::{Completion, CompositeAddress, FlexError, Status, StreamPriority};
// Under loom (`--cfg spyre_loom`) the enqueue order is a loom atomic.
#[cfg(spyre_loom)]
use loom::sync::atomic::AtomicU64;

use crate::inbox::Inbox;
use crate::memory::DeviceMemory;
use crate::op::{Op, Pending};
use crate::progress::Progress;
use crate::raw_call::OpCompletion;
use crate::ready::ReadySet;
use crate::record::{EventRecord, Record};
use crate::reuse::ReuseCheck;

/// A device-side wait: operations from the `before`th one enqueued on the
/// stream (0-based) on start only after `record` has completed.
struct Gate {
    before: u64,
    record: Arc<Record>,
}

/// An event record without a marker operation: reached when the stream's
/// `after`th operation (1-based) has finished.
struct Mark {
    after: u64,
    record: Arc<Record>,
}

/// The notifications asked for on the records an operation reached as it
/// finished ([`Scheduler::reach`], which set their outcomes): to be called
/// once the scheduler lock is released ([`Reached::notify`]).
#[must_use = "the notifications of reached records must be called"]
pub(crate) struct Reached(Vec<(Arc<Record>, Vec<Completion>)>);

impl Reached {
    /// Whether there is nothing to call.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Calls the notifications, in record order; call without the
    /// scheduler lock (they are user code).
    pub(crate) fn notify(self) {
        for (record, notifications) in self.0 {
            record.notify_settled(notifications);
        }
    }
}

/// Scheduling state of one stream.
pub(crate) struct StreamState {
    priority: StreamPriority,
    queue: VecDeque<Pending>,
    running: bool,
    /// Listed in the ready set, from [`Scheduler::schedule`] until
    /// [`Scheduler::next_job`] takes it: a stream is listed at most once,
    /// however many paths look at it meanwhile (its own launch and the
    /// recording stream it waited on, say).
    in_ready: bool,
    /// Waits not yet passed, in enqueue order (so by `before`).
    gates: VecDeque<Gate>,
    /// Records not yet reached, in record order (so by `after`).
    marks: VecDeque<Mark>,
    /// Streams blocked on a record of this stream; looked at again each time
    /// an operation of this stream finishes.
    waiters: Vec<usize>,
    /// What the stream shares without the scheduler lock: its counts of
    /// enqueued and completed operations, whether it has failed, and the
    /// threads blocked on it.
    progress: Arc<Progress>,
    /// Launches made without the scheduler lock while the stream is
    /// active, moved to the end of `queue` before the stream could go
    /// idle; marked active (`InboxState::active`) exactly while the stream
    /// is running or `queue` is not empty (see [`crate::inbox`]).
    inbox: Arc<Inbox>,
    /// Operations whose end the stream's records have seen: `completed`,
    /// or one more from [`Scheduler::reach`] to [`Scheduler::finish`]
    /// (while the engine calls the notifications of the records reached),
    /// so that a record made meanwhile is reached at once instead of
    /// waiting for a position already passed.
    passed: u64,
    /// The first error (sticky).
    pub(crate) error: Option<FlexError>,
    needs_shutdown: bool,
    /// Closed ([`crate::MockStream::close`]): refuses every launch, record
    /// and wait; what was enqueued before runs as ever.
    closed: bool,
    /// The launch that many launches from now is refused (1 = the next).
    fail_launch_in: Option<u64>,
    /// Extra time every operation of the stream takes.
    slowdown: Duration,
}

/// What an engine does with the operation it took.
pub(crate) enum Verdict {
    /// Run it, then hold its engine for the stream's slowdown more.
    Run { slowdown: Duration },
    /// Do not run it: complete it with this error.
    Skip(FlexError),
}

/// A launch the scheduler refused: the error, and what was refused, for
/// the caller to drop once the lock is released (it may hold user code).
/// Boxed, as refusals are rare and the launch's result stays small.
pub(crate) type Refused<T> = Box<(FlexError, T)>;

/// An operation taken by an engine.
pub(crate) struct Job {
    pub(crate) stream: usize,
    pub(crate) pending: Pending,
    pub(crate) verdict: Verdict,
}

/// Entries [`Scheduler::log_synchronize`] keeps: the most recent calls only,
/// so a process that synchronizes in a loop does not grow without bound.
pub(crate) const SYNCHRONIZE_LOG_LIMIT: usize = 4096;

/// Streams, their queues, and the ready order of one runtime.
#[derive(Default)]
pub(crate) struct Scheduler {
    streams: Vec<StreamState>,
    ready: ReadySet,
    /// The next number of the runtime-wide enqueue order, taken by every
    /// launch (under its stream's inbox lock, not this one's); on a cache
    /// line of its own, as only launching threads write it.
    order: Arc<CachePadded<AtomicU64>>,
    /// Moved (release, under this lock) each time a high-priority stream
    /// is made ready: what a batch of a normal-priority stream watches
    /// without the lock, and stops at ([`Self::take_batch`]). Shared with
    /// the engines ([`Self::high_ready_epoch`]); on a cache line of its
    /// own, as engines read it between the operations of a batch.
    high_ready_epoch: Arc<CachePadded<std::sync::atomic::AtomicU64>>,
    /// Set when the runtime is dropped: engines exit once nothing is ready.
    pub(crate) shutting_down: bool,
    /// Engines that have stopped for good: after the shutdown began, or
    /// by unwinding before; the last one to stop after it began closes the
    /// device ([`crate::engine::Device::closed`]), or the shutdown itself
    /// if none is left then.
    pub(crate) engines_stopped: usize,
    /// Idle engines watching the device's work epoch now (without this
    /// lock): a launch, or a busy engine that sees more ready streams, that
    /// finds a watcher here leaves the waking to it (the watcher takes the
    /// lock and looks before it blocks), so it makes no wake-up call.
    pub(crate) watching: usize,
    /// Engines between taking a job and finding no work: while one is,
    /// under `Auto` no idle engine watches (it would take a core from the
    /// busy one); the busy one wakes a blocked engine when it sees more
    /// ready streams.
    pub(crate) busy: usize,
    /// Stream ids `synchronize` was called on, in call order; the most
    /// recent [`SYNCHRONIZE_LOG_LIMIT`] calls.
    synchronize_log: VecDeque<u64>,
    /// The use-after-free detector, when it is on.
    reuse: Option<ReuseCheck>,
}

impl Scheduler {
    /// No streams yet; with the use-after-free detector if `check_reuse`.
    pub(crate) fn new(check_reuse: bool) -> Self {
        Self {
            reuse: check_reuse.then(ReuseCheck::default),
            ..Self::default()
        }
    }

    /// Notes that `address` is handed out again (see [`crate::reuse`]);
    /// nothing when the detector is off. Streams that have failed are left
    /// out: their queued work never runs.
    pub(crate) fn note_reuse(&mut self, address: &CompositeAddress) {
        let Self {
            streams,
            reuse,
            order,
            ..
        } = self;
        let Some(check) = reuse else { return };
        let queued = streams
            .iter()
            .enumerate()
            .filter(|(_, state)| state.error.is_none())
            .flat_map(|(index, state)| {
                let first = state.completed() + u64::from(state.running);
                (first..)
                    .zip(&state.queue)
                    .map(move |(position, pending)| (index, position, &pending.op))
            });
        // With the detector on every launch takes this lock
        // ([`Self::launches_checked`]): the queues hold every operation not
        // yet taken, and the order is not moving.
        let next_seq = order.load(Ordering::Relaxed);
        check.note(address, queued, next_seq, |s| streams[s].completed());
    }

    /// Tells the detector that stream `index`'s running operation has run;
    /// nothing when it is off.
    pub(crate) fn reuse_ran(&mut self, index: usize) {
        if let Some(check) = &mut self.reuse {
            check.ran(index);
        }
    }

    /// Records the operation `job` is starting and checks it against the
    /// detector's notes: the error to fail it with, if it touches memory
    /// handed out again too early. `None` when the detector is off.
    pub(crate) fn check_reuse(&mut self, job: &Job, memory: &DeviceMemory) -> Option<FlexError> {
        let Self { streams, reuse, .. } = self;
        let check = reuse.as_mut()?;
        let position = streams[job.stream].completed();
        check.start(
            job.stream,
            position,
            job.pending.seq,
            &job.pending.op,
            memory,
            |s| streams[s].completed(),
        )
    }

    /// Adds a stream and returns its index.
    pub(crate) fn add_stream(&mut self, priority: StreamPriority) -> usize {
        let inbox = Inbox::new(Arc::clone(&self.order));
        inbox.lock().checked = self.reuse.is_some();
        self.streams.push(StreamState {
            priority,
            queue: VecDeque::new(),
            running: false,
            in_ready: false,
            gates: VecDeque::new(),
            marks: VecDeque::new(),
            waiters: Vec::new(),
            progress: Arc::new(Progress::new()),
            inbox: Arc::new(inbox),
            passed: 0,
            error: None,
            needs_shutdown: false,
            closed: false,
            fail_launch_in: None,
            slowdown: Duration::ZERO,
        });
        self.streams.len() - 1
    }

    /// The state of stream `index` (an index from [`Self::add_stream`]).
    pub(crate) fn stream(&self, index: usize) -> &StreamState {
        &self.streams[index]
    }

    /// The state of stream `index`, mutably.
    pub(crate) fn stream_mut(&mut self, index: usize) -> &mut StreamState {
        &mut self.streams[index]
    }

    /// Records a `synchronize` call on stream `id`, dropping the oldest
    /// entry once [`SYNCHRONIZE_LOG_LIMIT`] are kept.
    pub(crate) fn log_synchronize(&mut self, id: u64) {
        if self.synchronize_log.len() == SYNCHRONIZE_LOG_LIMIT {
            self.synchronize_log.pop_front();
        }
        self.synchronize_log.push_back(id);
    }

    /// The recorded `synchronize` calls, oldest first.
    pub(crate) fn synchronize_log(&self) -> Vec<u64> {
        self.synchronize_log.iter().copied().collect()
    }

    /// Whether any stream has failed or needs shutdown.
    pub(crate) fn any_stream_error(&self) -> bool {
        self.streams
            .iter()
            .any(|s| s.error.is_some() || s.needs_shutdown)
    }

    /// The epoch moved each time a high-priority stream is made ready, for
    /// the engines to watch without the lock ([`Self::take_batch`]).
    pub(crate) fn high_ready_epoch(&self) -> Arc<CachePadded<std::sync::atomic::AtomicU64>> {
        Arc::clone(&self.high_ready_epoch)
    }

    /// Whether some stream is ready.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Enqueues `pending` on stream `index`, or refuses it: with
    /// [`Status::SHUTDOWN`] if the stream needs shutdown, with
    /// [`Status::STREAM_FAILED`] if it has failed, with
    /// [`Status::INVALID_HANDLE`] if it is closed, with
    /// [`Status::LAUNCH_FAILED`] if a `fail_nth_launch` fault is due. A
    /// refused operation is handed back so the caller drops it after
    /// releasing the lock. `Ok(true)` when the stream became ready.
    pub(crate) fn admit(
        &mut self,
        index: usize,
        pending: Pending,
    ) -> Result<bool, Refused<Pending>> {
        let call = pending.op.call();
        if let Err(err) = self.check_launch(index, call) {
            return Err(Box::new((err, pending)));
        }
        Ok(self.enqueue(index, None, pending))
    }

    /// Queues `pending` at the end of stream `index`, behind a gate on
    /// `wait` if given, once the checks are done; returns whether the
    /// stream became ready.
    fn enqueue(&mut self, index: usize, wait: Option<Arc<Record>>, mut pending: Pending) -> bool {
        let checked = self.launches_checked(index);
        let state = &mut self.streams[index];
        {
            // Launches made without this lock go first: they took the
            // inbox lock before this one.
            let mut inbox = state.inbox.lock();
            inbox.move_into(&mut state.queue);
            if let Some(record) = wait {
                let before = state.submitted();
                state.gates.push_back(Gate { before, record });
            }
            inbox.number(&mut pending, &state.progress);
            if let Op::Record(EventRecord(record)) = &pending.op {
                // Reached as it finishes: at the count it was numbered at.
                record.place_at(state.progress.submitted());
            }
            inbox.active = true;
            inbox.checked = checked;
        }
        state.queue.push_back(pending);
        let first_in_line = !state.running && state.queue.len() == 1;
        first_in_line && self.schedule(index)
    }

    /// Whether launches on stream `index` need the checks of
    /// [`Self::admit`] under this lock: the stream is closed, has failed,
    /// needs shutdown or has a `fail_nth_launch` fault set, or the
    /// use-after-free detector is on (it reads every queue). Otherwise a
    /// launch on a stream the scheduler holds goes to its inbox.
    fn launches_checked(&self, index: usize) -> bool {
        let state = &self.streams[index];
        state.closed
            || state.error.is_some()
            || state.needs_shutdown
            || state.fail_launch_in.is_some()
            || self.reuse.is_some()
    }

    /// Sets stream `index`'s `fail_nth_launch` fault: the `n`th launch from
    /// now (1 = the next) is refused; `None` clears it.
    pub(crate) fn set_fail_launch_in(&mut self, index: usize, n: Option<u64>) {
        self.streams[index].fail_launch_in = n;
        self.sync_checked(index);
    }

    /// Tells stream `index`'s inbox whether its launches need the
    /// scheduler's checks now ([`Self::launches_checked`]).
    fn sync_checked(&self, index: usize) {
        let checked = self.launches_checked(index);
        self.streams[index].inbox.lock().checked = checked;
    }

    /// Records `record` on stream `index`: as a mark (no operation) unless
    /// it carries a `completion`, in which case it is enqueued as a marker
    /// operation ([`Self::admit`]). A mark on a stream whose every operation
    /// has run and returned its completion is reached at once (`passed`).
    /// Refused as [`Self::admit`] refuses a launch (a record counts for
    /// `fail_nth_launch`); what is refused is handed back for the caller to
    /// drop after releasing the lock.
    /// `Ok(true)` when the stream became ready (only ever for a marker).
    pub(crate) fn admit_record(
        &mut self,
        index: usize,
        record: Arc<Record>,
        completion: Option<Completion>,
    ) -> Result<bool, Refused<Option<Pending>>> {
        if let Some(completion) = completion {
            let marker = Pending::new(
                Op::Record(EventRecord(record)),
                Some(OpCompletion::Boxed(completion)),
            );
            return self.admit(index, marker).map_err(|refused| {
                let (err, marker) = *refused;
                Box::new((err, Some(marker)))
            });
        }
        self.check_launch(index, "record_event")
            .map_err(|err| Box::new((err, None)))?;
        let checked = self.launches_checked(index);
        let state = &mut self.streams[index];
        let mut inbox = state.inbox.lock();
        inbox.checked = checked;
        if state.passed == state.submitted() {
            // Nothing before it is unfinished. A fresh record: nobody has
            // asked for a notification yet, so there is none to call.
            let none = record.set_outcome(Ok(Instant::now()));
            debug_assert!(none.is_empty());
        } else {
            let after = state.submitted();
            record.place_at(after);
            state.marks.push_back(Mark { after, record });
        }
        Ok(false)
    }

    /// Whether stream `index` takes a launch now: [`Self::check_accepts`],
    /// then a due `fail_nth_launch` fault ([`Status::LAUNCH_FAILED`]),
    /// which this counts down.
    fn check_launch(&mut self, index: usize, call: &'static str) -> Result<(), FlexError> {
        self.check_accepts(index, call)?;
        let state = &mut self.streams[index];
        if let Some(n) = state.fail_launch_in {
            state.fail_launch_in = n.checked_sub(1).filter(|&left| left > 0);
            if n <= 1 {
                return Err(FlexError::new(
                    Status::LAUNCH_FAILED,
                    call,
                    "the runtime refused the launch (fault injected by MockStream::fail_nth_launch)",
                ));
            }
        }
        Ok(())
    }

    /// Whether stream `index` accepts work: `Err` with
    /// [`Status::INVALID_HANDLE`] if it is closed, with [`Status::SHUTDOWN`]
    /// if it needs shutdown, with [`Status::STREAM_FAILED`] if it has failed.
    pub(crate) fn check_accepts(&self, index: usize, call: &'static str) -> Result<(), FlexError> {
        let state = &self.streams[index];
        if state.closed {
            return Err(FlexError::new(
                Status::INVALID_HANDLE,
                call,
                "the stream was destroyed and accepts no more work",
            ));
        }
        if state.needs_shutdown {
            return Err(FlexError::new(
                Status::SHUTDOWN,
                call,
                "the stream needs a shutdown of its runtime and accepts no more work",
            ));
        }
        if let Some(first) = &state.error {
            return Err(FlexError::new(
                Status::STREAM_FAILED,
                call,
                format!("the stream has failed and accepts no more work; its first error: {first}"),
            ));
        }
        Ok(())
    }

    /// Adds a device-side wait to stream `index`: its operations enqueued
    /// from now on start only after `record` has completed. A record of the
    /// stream itself is already ordered, and a completed one holds nothing:
    /// neither adds anything. Otherwise the wait is a gate followed by a
    /// *wait marker*, an operation of the stream (a marker record nobody
    /// else holds) that the gate holds: so the stream has unfinished work
    /// until the wait has passed, and its query, synchronize and records
    /// made after the wait see it, as they see any operation (a wait is
    /// work enqueued on the stream, as in CUDA). The marker does not count
    /// for `fail_nth_launch`. Returns whether the stream became ready (the
    /// marker can be, behind a record that failed meanwhile: it then fails
    /// the stream).
    ///
    /// # Errors
    /// As [`Self::admit`]'s stream-state checks, in [`Self::admit`]'s
    /// refusal form (nothing to hand back); nothing is added then.
    pub(crate) fn add_gate(
        &mut self,
        index: usize,
        record: Arc<Record>,
    ) -> Result<bool, Refused<()>> {
        self.check_accepts(index, "wait_event")
            .map_err(|err| Box::new((err, ())))?;
        if record.stream == index || matches!(record.outcome(), Some(Ok(_))) {
            // Already ordered, or already complete: nothing to hold.
            return Ok(false);
        }
        let marker = Op::Record(EventRecord(Arc::new(Record::new(index, index as u64))));
        Ok(self.enqueue(index, Some(record), Pending::new(marker, None)))
    }

    /// Makes stream `index` ready if it is idle, has work, and no closed gate
    /// holds its front operation: passes every open gate that nothing
    /// unfinished is before (a gate whose record failed fails the stream,
    /// naming the recording stream, whether or not work is queued behind
    /// it), and registers the stream, once, as a waiter of the recording
    /// stream of a closed one (so that a record that fails later fails an
    /// idle stream too). A stream that has failed passes its gates without
    /// waiting: nothing behind them runs. Returns whether the stream became
    /// ready. A high-priority stream made ready moves the high-ready
    /// epoch, which stops batches of normal-priority streams.
    fn schedule(&mut self, index: usize) -> bool {
        self.schedule_telling_batches(index, true)
    }

    /// [`Self::schedule`], moving the high-ready epoch for a high-priority
    /// stream made ready only if `tell_batches`.
    fn schedule_telling_batches(&mut self, index: usize, tell_batches: bool) -> bool {
        loop {
            let state = &mut self.streams[index];
            if state.running || state.in_ready {
                return false;
            }
            // Not running: every operation before the front has completed
            // (with nothing queued, every operation enqueued: the inbox is
            // moved into the queue before a stream goes idle).
            let front = state.completed();
            let Some(gate) = state.gates.front().filter(|gate| gate.before <= front) else {
                break;
            };
            let record = Arc::clone(&gate.record);
            match record.outcome() {
                // A failed stream runs nothing behind the gate: nothing to
                // hold (its synchronize is not kept waiting for another
                // stream's work).
                None if state.error.is_some() => {
                    state.gates.pop_front();
                }
                None => {
                    let waiters = &mut self.streams[record.stream].waiters;
                    if !waiters.contains(&index) {
                        waiters.push(index);
                    }
                    return false;
                }
                Some(outcome) => {
                    state.gates.pop_front();
                    if let Err(cause) = outcome {
                        let error = record.wait_error(&cause);
                        self.record_error(index, error);
                    }
                }
            }
        }
        let state = &mut self.streams[index];
        let Some(front) = state.queue.front() else {
            return false;
        };
        if let Op::Record(EventRecord(record)) = &front.op {
            // A marker: its time is now, whenever an engine takes it.
            record.mark_ready(Instant::now());
        }
        self.ready.push(state.priority, front.seq, index);
        if tell_batches && state.priority == StreamPriority::High {
            self.high_ready_epoch.fetch_add(1, Ordering::Release);
        }
        state.in_ready = true;
        true
    }

    /// Takes the next operation to run, if any stream is ready, and marks
    /// its stream running.
    pub(crate) fn next_job(&mut self) -> Option<Job> {
        let index = self.ready.pop()?;
        let state = &mut self.streams[index];
        debug_assert!(state.in_ready && !state.running, "listed once, while idle");
        state.in_ready = false;
        let pending = state.queue.pop_front()?;
        state.running = true;
        let verdict = match state.not_run(pending.op.call()) {
            // A record (an event's marker, a wait's marker) takes no time,
            // in the timing model or under a slowdown.
            None if matches!(pending.op, Op::Record(_)) => Verdict::Run {
                slowdown: Duration::ZERO,
            },
            None => Verdict::Run {
                slowdown: state.slowdown,
            },
            Some(error) => Verdict::Skip(error),
        };
        Some(Job {
            stream: index,
            pending,
            verdict,
        })
    }

    /// Moves up to `limit` more operations of `job`'s stream, whose front
    /// operation an engine has just taken ([`Self::next_job`]), into
    /// `batch`, for that engine to run one after another without taking
    /// the lock between them ([`crate::engine`]). Returns the value of the
    /// high-ready epoch the batch must stop at once it moves, `None` if
    /// the stream has high priority (nothing outranks it) or nothing was
    /// taken.
    ///
    /// Streams of the stream's own priority or lower that are ready, or
    /// become ready, wait for the batch: a device orders nothing between
    /// streams beyond priority (`flex.h`: queued work of high-priority
    /// streams starts first), and the batch is bounded by `limit`. A
    /// high-priority stream does not: the job's stream was the first of
    /// the ready order, so none was ready as the batch was taken, and one
    /// made ready later moves the high-ready epoch under the lock, which
    /// stops a normal-priority batch before its next operation.
    ///
    /// Takes nothing when the stream has failed or needs shutdown, with
    /// the use-after-free detector on, or behind an event record's marker
    /// operation (its completion opens the gates of streams waiting on it,
    /// in [`Self::finish`]); and stops before an operation held by a
    /// device-side wait, before a marker operation, and after the
    /// operation that reaches a record's mark: each of those needs the
    /// lock as it is passed. Operations the engine does not run go back
    /// with [`Self::put_back`].
    pub(crate) fn take_batch(
        &mut self,
        job: &Job,
        limit: usize,
        batch: &mut VecDeque<Pending>,
    ) -> Option<u64> {
        if self.reuse.is_some()
            || !matches!(job.verdict, Verdict::Run { .. })
            || matches!(job.pending.op, Op::Record(_))
        {
            return None;
        }
        let state = &mut self.streams[job.stream];
        if state.error.is_some() || state.needs_shutdown {
            return None;
        }
        if state.queue.len() < limit {
            state.inbox.lock().move_into(&mut state.queue);
        }
        // The first queued operation is the stream's (c + 1)th (0-based),
        // c operations having completed and one running.
        let first = state.completed() + 1;
        let gate = state.gates.front().map_or(u64::MAX, |gate| gate.before);
        let mark = state.marks.front().map_or(u64::MAX, |mark| mark.after);
        // Queued operation j is the (first + j)th (0-based): held by a gate
        // from `gate` on; reached marks are passed as the one before it
        // finishes, so it must not come after a mark's position.
        let room = gate.min(mark).saturating_sub(first);
        let take = state
            .queue
            .iter()
            .take(limit.min(usize::try_from(room).unwrap_or(usize::MAX)))
            .take_while(|pending| !matches!(pending.op, Op::Record(_)))
            .count();
        batch.extend(state.queue.drain(..take));
        let outranked = take > 0 && state.priority != StreamPriority::High;
        outranked.then(|| self.high_ready_epoch.load(Ordering::Acquire))
    }

    /// Returns the operations of stream `index` that an engine took with
    /// [`Self::take_batch`] and did not run to the front of its queue, in
    /// their order.
    pub(crate) fn put_back(&mut self, index: usize, batch: &mut VecDeque<Pending>) {
        let queue = &mut self.streams[index].queue;
        while let Some(pending) = batch.pop_back() {
            queue.push_front(pending);
        }
    }

    /// Records `error` as the stream's error unless it already has one.
    pub(crate) fn record_error(&mut self, index: usize, error: FlexError) {
        let state = &mut self.streams[index];
        if state.error.is_none() {
            // Launches checked first: a thread that sees the stream failed
            // (here under this lock, or through the failed flag without
            // it) then has its launches refused, not queued.
            state.inbox.lock().checked = true;
            state.changed();
            tracing::debug!(stream = index, %error, "stream failed");
            state.error = Some(error);
            state.progress.mark_failed();
        }
    }

    /// Fails stream `index` as needing shutdown with `error` (kept only if
    /// it is the stream's first), and lets it go on if it was held behind a
    /// gate: a failed stream runs nothing behind one, so its synchronize
    /// does not wait for the other stream. Returns whether the stream became
    /// ready (its engines must be told).
    pub(crate) fn fail_for_shutdown(&mut self, index: usize, error: FlexError) -> bool {
        self.streams[index].set_needs_shutdown();
        self.record_error(index, error);
        self.schedule(index)
    }

    /// Sets the outcome of the marks that the running operation of stream
    /// `index` reaches as it finishes (the stream's error, if it has
    /// failed): call after its completion has returned and before
    /// [`Self::finish`], which looks at the streams waiting on them.
    pub(crate) fn reach(&mut self, index: usize) -> Reached {
        let state = &mut self.streams[index];
        state.passed = state.completed() + 1;
        let position = state.passed;
        let due = state
            .marks
            .iter()
            .take_while(|mark| mark.after <= position)
            .count();
        let mut reached = Vec::new();
        if due > 0 {
            let outcome = match state.not_run("record_event") {
                None => Ok(Instant::now()),
                Some(error) => Err(error),
            };
            for Mark { record, .. } in state.marks.drain(..due) {
                let notifications = record.set_outcome(outcome.clone());
                if !notifications.is_empty() {
                    reached.push((record, notifications));
                }
            }
        }
        Reached(reached)
    }

    /// Marks the running operation of stream `index` complete (its
    /// completion has returned), wakes the threads blocked on the stream
    /// if one looks again at the new count, and makes the stream ready
    /// again if it has more work. Returns whether it did. Called by the
    /// engine that ran the operation, which takes its next job
    /// ([`Self::next_job`]) before it releases the lock.
    ///
    /// Streams blocked on a record of this stream are looked at again (the
    /// finished operation may be that record, or have reached its mark in
    /// [`Self::reach`]); any that became ready show up in
    /// [`Self::has_ready`].
    pub(crate) fn finish(&mut self, index: usize) -> bool {
        self.reuse_ran(index);
        let state = &mut self.streams[index];
        state.running = false;
        state.passed = state.completed() + 1;
        if state.progress.publish_locked(state.passed) {
            state.progress.wake();
        }
        if state.queue.is_empty() {
            // The stream goes idle unless launches wait in its inbox; from
            // then on a launch takes this lock to make it ready.
            let mut inbox = state.inbox.lock();
            inbox.move_into(&mut state.queue);
            inbox.active = !state.queue.is_empty();
        }
        for waiter in std::mem::take(&mut state.waiters) {
            self.schedule(waiter);
        }
        // The engine that finished the operation takes its next job in this
        // lock hold; if this stream has high priority, that job is of a
        // high-priority stream: this one, or an older one that is ready. A
        // normal-priority batch running on another engine was taken while
        // no high-priority stream was ready, so any that is ready now
        // became ready since, moving the epoch (a stream made ready again
        // by its own engine, as here, is taken at once), and that batch has
        // stopped. So this stream, if it is not what this engine takes, is
        // not held up by such a batch, and batches need not stop for it.
        self.schedule_telling_batches(index, false)
    }
}

impl StreamState {
    /// Whether the stream needs a shutdown of its runtime.
    pub(crate) fn needs_shutdown(&self) -> bool {
        self.needs_shutdown
    }

    /// Sets the stream's extra time per operation (fault injection).
    pub(crate) fn set_slowdown(&mut self, per_op: Duration) {
        self.slowdown = per_op;
        self.changed();
    }

    /// Closes the stream ([`crate::MockStream::close`]): from now on its
    /// launches go through [`Scheduler::admit`]'s checks, which refuse them.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        self.inbox.lock().checked = true;
    }

    /// Puts the stream in the needs-shutdown state (fault injection).
    pub(crate) fn set_needs_shutdown(&mut self) {
        self.needs_shutdown = true;
        self.inbox.lock().checked = true;
        self.changed();
    }

    /// Notes a change of the error, shutdown state or slowdown for an
    /// engine running a batch of the stream ([`Progress::changes`]).
    fn changed(&self) {
        self.progress.note_change();
    }

    /// Operations whose completion has returned.
    pub(crate) fn completed(&self) -> u64 {
        self.progress.completed()
    }

    /// Operations enqueued so far.
    pub(crate) fn submitted(&self) -> u64 {
        self.progress.submitted()
    }

    /// What the stream shares without the scheduler lock, for a thread
    /// that watches its completions or blocks on them.
    pub(crate) fn progress(&self) -> Arc<Progress> {
        Arc::clone(&self.progress)
    }

    /// The stream's inbox, shared with its [`crate::MockStream`].
    pub(crate) fn inbox(&self) -> Arc<Inbox> {
        Arc::clone(&self.inbox)
    }

    /// The error an operation (`call`) of this stream completes with
    /// instead of running, once the stream has failed or needs shutdown;
    /// `None` while it has not.
    fn not_run(&self, call: &'static str) -> Option<FlexError> {
        let first = self.error.as_ref()?;
        Some(if self.needs_shutdown {
            FlexError::new(
                Status::SHUTDOWN,
                call,
                "the stream needs a shutdown of its runtime; the operation did not run",
            )
        } else {
            FlexError::new(
                Status::STREAM_FAILED,
                call,
                format!("the stream failed earlier ({first}); the operation did not run"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop() -> Pending {
        Pending::new(Op::host_fn(|| Ok(())), None)
    }

    /// A scheduler with one normal-priority stream.
    fn one_stream() -> (Scheduler, usize) {
        let mut s = Scheduler::default();
        let a = s.add_stream(StreamPriority::Normal);
        (s, a)
    }

    fn take(s: &mut Scheduler) -> usize {
        let job = s.next_job().unwrap();
        job.stream
    }

    #[test]
    fn high_priority_first_then_oldest() {
        let (mut s, a) = one_stream();
        let b = s.add_stream(StreamPriority::Normal);
        let h = s.add_stream(StreamPriority::High);
        assert!(s.admit(b, noop()).is_ok());
        assert!(s.admit(a, noop()).is_ok());
        assert!(s.admit(h, noop()).is_ok());
        assert_eq!(take(&mut s), h);
        assert_eq!(take(&mut s), b);
        assert_eq!(take(&mut s), a);
        assert!(s.next_job().is_none());
    }

    #[test]
    fn one_operation_at_a_time_per_stream() {
        let (mut s, a) = one_stream();
        assert_eq!(s.admit(a, noop()).ok(), Some(true));
        assert_eq!(s.admit(a, noop()).ok(), Some(false));
        assert_eq!(take(&mut s), a);
        assert!(s.next_job().is_none(), "the stream is running");
        assert!(s.finish(a));
        assert_eq!(take(&mut s), a);
        assert!(!s.finish(a));
        assert_eq!(s.stream(a).submitted(), 2);
        assert_eq!(s.stream(a).completed(), 2);
        assert!(!s.has_ready());
    }

    /// The enqueue order of the operations `s` takes next on stream
    /// `index`, ending each.
    fn take_all(s: &mut Scheduler, index: usize) -> Vec<u64> {
        std::iter::from_fn(|| {
            let job = s.next_job()?;
            assert_eq!(job.stream, index);
            end(s, index);
            Some(job.pending.seq)
        })
        .collect()
    }

    #[test]
    fn a_launch_under_the_lock_goes_behind_the_launches_in_the_inbox() {
        let (mut s, a) = one_stream();
        s.admit(a, noop()).ok().unwrap();
        let running = s.next_job().unwrap();
        let (inbox, progress) = (s.stream(a).inbox(), s.stream(a).progress());
        assert!(
            inbox.try_push(noop(), &progress).is_ok(),
            "an active stream takes launches in its inbox"
        );
        assert_eq!(s.admit(a, noop()).ok(), Some(false));
        drop(running);
        end(&mut s, a);
        assert_eq!(take_all(&mut s, a), [1, 2]);
        assert!(
            inbox.try_push(noop(), &progress).is_err(),
            "an idle stream's launches take the scheduler lock"
        );
    }

    #[test]
    fn a_batch_takes_the_inbox_and_what_it_puts_back_stays_in_front() {
        let (mut s, a) = one_stream();
        s.admit(a, noop()).ok().unwrap();
        let running = s.next_job().unwrap();
        let (inbox, progress) = (s.stream(a).inbox(), s.stream(a).progress());
        for _ in 0..2 {
            inbox.try_push(noop(), &progress).ok().unwrap();
        }
        let mut batch = VecDeque::new();
        s.take_batch(&running, 4, &mut batch);
        let taken: Vec<u64> = batch.iter().map(|pending| pending.seq).collect();
        assert_eq!(taken, [1, 2]);
        inbox.try_push(noop(), &progress).ok().unwrap();
        s.put_back(a, &mut batch);
        drop(running);
        end(&mut s, a);
        assert_eq!(take_all(&mut s, a), [1, 2, 3]);
    }

    #[test]
    fn failed_streams_skip_and_refuse() {
        let (mut s, a) = one_stream();
        s.admit(a, noop()).ok().unwrap();
        s.record_error(a, FlexError::new(Status::EXECUTION_FAILED, "x", "boom"));
        s.record_error(a, FlexError::new(Status::INTERNAL, "y", "later"));
        assert_eq!(
            s.stream(a).error.as_ref().unwrap().status(),
            Status::EXECUTION_FAILED
        );
        let job = s.next_job().unwrap();
        assert!(
            matches!(&job.verdict, Verdict::Skip(e) if e.status() == Status::STREAM_FAILED && e.message().contains("boom"))
        );
        let (err, _) = *s.admit(a, noop()).unwrap_err();
        assert_eq!(err.status(), Status::STREAM_FAILED);
        assert!(s.any_stream_error());
    }

    #[test]
    fn synchronize_log_keeps_the_most_recent_calls() {
        let mut s = Scheduler::default();
        s.log_synchronize(7);
        s.log_synchronize(3);
        assert_eq!(s.synchronize_log(), vec![7, 3]);
        for id in 0..(SYNCHRONIZE_LOG_LIMIT as u64 + 10) {
            s.log_synchronize(id);
        }
        let log = s.synchronize_log();
        assert_eq!(log.len(), SYNCHRONIZE_LOG_LIMIT);
        assert_eq!(log.first(), Some(&10));
        assert_eq!(log.last(), Some(&(SYNCHRONIZE_LOG_LIMIT as u64 + 9)));
    }

    #[test]
    fn nth_launch_fault_counts_down() {
        let (mut s, a) = one_stream();
        s.set_fail_launch_in(a, Some(2));
        assert!(s.admit(a, noop()).is_ok());
        let (err, _) = *s.admit(a, noop()).unwrap_err();
        assert_eq!(err.status(), Status::LAUNCH_FAILED);
        assert!(s.admit(a, noop()).is_ok());
        assert_eq!(s.stream(a).fail_launch_in, None);
        assert_eq!(s.stream(a).submitted(), 2);
    }

    fn record_on(s: &mut Scheduler, index: usize) -> Arc<Record> {
        let record = Arc::new(Record::new(index, 7));
        let became_ready = s.admit_record(index, Arc::clone(&record), None);
        assert!(matches!(became_ready, Ok(false)), "a mark never readies");
        record
    }

    /// Ends an operation of stream `index` as an engine does.
    fn end(s: &mut Scheduler, index: usize) {
        s.reach(index).notify();
        s.finish(index);
    }

    /// Takes the next job and ends it without running it.
    fn complete_next(s: &mut Scheduler) -> usize {
        let job = s.next_job().expect("a ready stream");
        end(s, job.stream);
        job.stream
    }

    #[test]
    fn a_record_on_a_stream_with_nothing_unfinished_is_reached_at_once() {
        let (mut s, a) = one_stream();
        let record = record_on(&mut s, a);
        assert!(matches!(record.outcome(), Some(Ok(_))));
        assert_eq!(s.stream(a).submitted(), 0, "no operation was enqueued");
        assert!(!s.has_ready());
    }

    #[test]
    fn a_record_is_reached_when_the_operation_before_it_finishes() {
        let (mut s, a) = one_stream();
        s.admit(a, noop()).ok().unwrap();
        let after_one = record_on(&mut s, a);
        s.admit(a, noop()).ok().unwrap();
        let after_two = record_on(&mut s, a);
        let job = s.next_job().unwrap();
        assert!(after_one.outcome().is_none(), "the first launch is running");
        end(&mut s, job.stream);
        assert!(matches!(after_one.outcome(), Some(Ok(_))));
        assert!(after_two.outcome().is_none(), "the second launch is queued");
        assert_eq!(complete_next(&mut s), a);
        assert!(matches!(after_two.outcome(), Some(Ok(_))));
        assert_eq!(s.stream(a).submitted(), 2, "records are not operations");
    }

    #[test]
    fn a_record_behind_a_failure_fails_with_the_streams_first_error() {
        let (mut s, a) = one_stream();
        s.admit(a, noop()).ok().unwrap();
        let record = record_on(&mut s, a);
        let job = s.next_job().unwrap();
        s.record_error(a, FlexError::new(Status::EXECUTION_FAILED, "x", "boom"));
        end(&mut s, job.stream);
        let error = record.outcome().unwrap().unwrap_err();
        assert_eq!(error.status(), Status::STREAM_FAILED);
        assert_eq!(error.call(), "record_event");
        assert!(error.message().contains("boom"), "{error}");
    }

    #[test]
    fn a_waiter_whose_record_settled_is_listed_once() {
        // A waiter's wait marker is held by its gate; the record settles
        // (as an engine settles a marker, without the lock) and launches on
        // the waiter go behind the wait marker before the recording
        // stream's `finish` looks at its waiters. The waiter is listed
        // once: listed twice, its second operation would be handed out
        // while its first runs.
        let mut s = Scheduler::default();
        let producer = s.add_stream(StreamPriority::Normal);
        let waiter = s.add_stream(StreamPriority::Normal);
        let record = Arc::new(Record::new(producer, 7));
        let marker = Op::Record(EventRecord(Arc::clone(&record)));
        s.admit(producer, Pending::new(marker, None)).ok().unwrap();
        assert!(!s.add_gate(waiter, Arc::clone(&record)).unwrap(), "held");
        let job = s.next_job().unwrap();
        assert_eq!(job.stream, producer);
        record.settle(Ok(Instant::now()));
        assert!(
            matches!(s.admit(waiter, noop()), Ok(false)),
            "behind the wait marker"
        );
        s.admit(waiter, noop()).ok().unwrap();
        end(&mut s, producer);
        let wait = s.next_job().expect("the wait passed");
        assert_eq!(wait.stream, waiter);
        assert!(matches!(wait.pending.op, Op::Record(_)), "the wait marker");
        assert!(
            s.next_job().is_none(),
            "the waiter runs one operation at a time"
        );
        assert!(!s.has_ready());
    }

    /// A wait on a pending record adds one operation (its marker), pending
    /// until the record completes and the marker has run; a record made
    /// after the wait is a mark reached then. A wait on a completed record
    /// or on one of the stream's own adds nothing.
    #[test]
    fn a_wait_is_an_operation_of_the_stream_and_a_record_after_it_waits_for_it() {
        let mut s = Scheduler::default();
        let producer = s.add_stream(StreamPriority::Normal);
        let waiter = s.add_stream(StreamPriority::Normal);
        s.admit(producer, noop()).ok().unwrap();
        let produced = record_on(&mut s, producer);
        assert!(!s.add_gate(waiter, Arc::clone(&produced)).unwrap());
        assert_eq!(s.stream(waiter).submitted(), 1, "the wait marker");
        assert_eq!(s.stream(waiter).completed(), 0, "pending until it passes");
        let after = Arc::new(Record::new(waiter, 8));
        assert!(matches!(
            s.admit_record(waiter, Arc::clone(&after), None),
            Ok(false)
        ));
        assert_eq!(s.stream(waiter).submitted(), 1, "a mark, no operation");
        assert!(after.outcome().is_none(), "behind the wait");
        assert_eq!(complete_next(&mut s), producer);
        assert!(matches!(produced.outcome(), Some(Ok(_))));
        assert_eq!(complete_next(&mut s), waiter, "the wait passed");
        assert_eq!(s.stream(waiter).completed(), 1);
        assert!(matches!(after.outcome(), Some(Ok(_))));
        // A wait on a completed record, or on the stream's own, adds nothing.
        assert!(!s.add_gate(waiter, Arc::clone(&produced)).unwrap());
        assert!(!s.add_gate(waiter, after).unwrap());
        assert_eq!(s.stream(waiter).submitted(), 1);
    }

    #[test]
    fn a_record_with_a_completion_is_a_marker_operation() {
        let (mut s, a) = one_stream();
        let record = Arc::new(Record::new(a, 7));
        let completion: Completion = Box::new(|_| {});
        assert!(matches!(
            s.admit_record(a, Arc::clone(&record), Some(completion)),
            Ok(true)
        ));
        assert!(record.outcome().is_none(), "reached when the marker runs");
        assert_eq!(s.stream(a).submitted(), 1);
    }

    #[test]
    fn a_record_counts_for_the_nth_launch_fault() {
        let (mut s, a) = one_stream();
        s.set_fail_launch_in(a, Some(2));
        record_on(&mut s, a);
        let refused = s.admit_record(a, Arc::new(Record::new(a, 7)), None);
        let Err(refused) = refused else {
            panic!("the second launch, a record, is refused");
        };
        let (error, None) = *refused else {
            panic!("a refused record without a completion hands back no marker");
        };
        assert_eq!(error.status(), Status::LAUNCH_FAILED);
        assert_eq!(error.call(), "record_event");
        assert_eq!(s.stream(a).fail_launch_in, None);
    }
}

/// Loom models of the event state machine (an engine completes or fails
/// a record — settling it outside the scheduler lock, then finishing under
/// it, as `engine.rs` does — while another thread adds a wait for it and
/// launches behind the wait, and a third drops the event), of a query
/// without the lock, and of launches through a stream's inbox racing the
/// engine. Run by `ci/loom.sh` (`--cfg spyre_loom`).
#[cfg(all(test, spyre_loom))]
mod loom_models {
    use std::sync::Arc;
    use std::time::Instant;

    use loom::sync::Mutex;

    use super::*;
    use crate::inbox::Inbox;
    use crate::record::EventRecord;

    fn noop() -> Pending {
        Pending::new(Op::host_fn(|| Ok(())), None)
    }

    /// A scheduler with one stream and one launch on it.
    fn one_launch() -> (Arc<Mutex<Scheduler>>, usize) {
        let scheduler = Arc::new(Mutex::new(Scheduler::default()));
        let stream = {
            let mut s = scheduler.lock().unwrap();
            let stream = s.add_stream(StreamPriority::Normal);
            s.admit(stream, noop()).ok().unwrap();
            stream
        };
        (scheduler, stream)
    }

    /// One interleaving of record / wait / complete / drop; `fail` makes the
    /// recording stream fail before the record is reached. With `mark` the
    /// record is a mark behind a launch, which the engine finishing that
    /// launch reaches; without, a marker operation the engine runs.
    fn race(fail: bool, mark: bool) {
        let scheduler = Arc::new(Mutex::new(Scheduler::default()));
        let (producer, waiter, record) = {
            let mut s = scheduler.lock().unwrap();
            let producer = s.add_stream(StreamPriority::Normal);
            let waiter = s.add_stream(StreamPriority::Normal);
            let record = Arc::new(Record::new(producer, 7));
            if mark {
                s.admit(producer, noop()).ok().unwrap();
                s.admit_record(producer, Arc::clone(&record), None)
                    .ok()
                    .unwrap();
            } else {
                let marker = Op::Record(EventRecord(Arc::clone(&record)));
                s.admit(producer, Pending::new(marker, None)).ok().unwrap();
            }
            if fail {
                s.record_error(
                    producer,
                    FlexError::new(Status::EXECUTION_FAILED, "launch_compute", "boom"),
                );
            }
            (producer, waiter, record)
        };
        // The event's own reference, dropped by a third thread.
        let event_reference = Arc::clone(&record);
        let engine = {
            let scheduler = Arc::clone(&scheduler);
            loom::thread::spawn(move || {
                let job = scheduler.lock().unwrap().next_job().unwrap();
                match &job.verdict {
                    Verdict::Run { .. } => {
                        if let Op::Record(EventRecord(record)) = &job.pending.op {
                            record.settle(Ok(Instant::now()));
                        }
                    }
                    Verdict::Skip(error) => job.pending.op.abandon(error),
                }
                drop(job);
                let reached = scheduler.lock().unwrap().reach(producer);
                reached.notify();
                scheduler.lock().unwrap().finish(producer);
            })
        };
        let waiting = {
            let scheduler = Arc::clone(&scheduler);
            loom::thread::spawn(move || {
                scheduler.lock().unwrap().add_gate(waiter, record).unwrap();
                // Apart from the wait, so the engine may finish in between.
                // A record failed by now has failed the waiter as the wait
                // was added, and its launches are refused. Two launches:
                // listed twice in the ready set, the waiter would hand out
                // the second while the first runs.
                let mut s = scheduler.lock().unwrap();
                let first = s.admit(waiter, noop());
                let second = s.admit(waiter, noop());
                assert_eq!(first.is_ok(), second.is_ok());
                first.map(drop).map_err(|refused| refused.0)
            })
        };
        let dropper = loom::thread::spawn(move || drop(event_reference));
        engine.join().unwrap();
        let admitted = waiting.join().unwrap();
        dropper.join().unwrap();
        let mut s = scheduler.lock().unwrap();
        // No lost wake-up: the waiter is ready, exactly once. Its first job
        // is its wait marker when the record had not completed as the wait
        // was added (always when it failed): that runs, or is skipped once
        // the record has failed, and its end makes the launch ready.
        let mut job = s.next_job().expect("the waiting stream became ready");
        assert_eq!(job.stream, waiter);
        if matches!(job.pending.op, Op::Record(_)) {
            assert_verdict(&job.verdict, fail);
            assert!(
                s.next_job().is_none(),
                "one operation of the waiter at a time"
            );
            drop(job);
            let reached = s.reach(waiter);
            assert!(reached.is_empty(), "nobody holds the wait marker's record");
            s.finish(waiter);
            if let Err(refused) = admitted {
                assert!(fail, "refused without a failure: {refused}");
                assert_eq!(refused.status(), Status::STREAM_FAILED);
                assert!(refused.message().contains("stream 7"), "{refused}");
                assert!(s.next_job().is_none(), "nothing is ready");
                return;
            }
            job = s.next_job().expect("the waiter's launch became ready");
            assert_eq!(job.stream, waiter);
        } else {
            assert!(!fail, "a wait on a failed record leaves a wait marker");
            assert!(admitted.is_ok());
        }
        assert!(s.next_job().is_none(), "nothing else is ready");
        assert!(!s.has_ready());
        assert_verdict(&job.verdict, fail);
    }

    /// A job of the waiter runs, or, when the record failed, is skipped
    /// with `STREAM_FAILED` naming the recording stream.
    fn assert_verdict(verdict: &Verdict, fail: bool) {
        match (verdict, fail) {
            (Verdict::Run { .. }, false) => {}
            (Verdict::Skip(error), true) => {
                assert_eq!(error.status(), Status::STREAM_FAILED);
                assert!(error.message().contains("stream 7"), "{error}");
            }
            (verdict, _) => panic!(
                "fail = {fail}, but the waiter's job got {}",
                match verdict {
                    Verdict::Run { .. } => "run",
                    Verdict::Skip(_) => "skip",
                }
            ),
        }
    }

    /// Launches a no-op on `stream` as `MockStream::enqueue` does: to the
    /// inbox if it takes it, else through the scheduler. Returns whether
    /// the launch was accepted.
    fn launch(
        scheduler: &Mutex<Scheduler>,
        inbox: &Inbox,
        progress: &Progress,
        stream: usize,
    ) -> bool {
        match inbox.try_push(noop(), progress) {
            Ok(()) => true,
            Err(pending) => scheduler.lock().unwrap().admit(stream, pending).is_ok(),
        }
    }

    /// The inbox and progress of `stream`, as its `MockStream` holds them.
    fn handles(scheduler: &Mutex<Scheduler>, stream: usize) -> (Arc<Inbox>, Arc<Progress>) {
        let s = scheduler.lock().unwrap();
        (s.stream(stream).inbox(), s.stream(stream).progress())
    }

    /// Runs `f` with the scheduler on a new loom thread.
    fn spawn_on(
        scheduler: &Arc<Mutex<Scheduler>>,
        f: impl FnOnce(&Mutex<Scheduler>) + Send + 'static,
    ) -> loom::thread::JoinHandle<()> {
        let scheduler = Arc::clone(scheduler);
        loom::thread::spawn(move || f(&scheduler))
    }

    /// A launch made while an engine finishes the stream's only queued
    /// operation either goes to the inbox, which the engine moves to the
    /// queue as the stream runs empty, or, once the engine has let the
    /// stream go, through the scheduler, which makes it ready: either way
    /// it is taken exactly once, numbered after the first, and never left
    /// in the inbox of an idle stream.
    #[test]
    fn a_launch_racing_the_end_of_its_streams_work_is_taken_once() {
        loom::model(|| {
            let (scheduler, stream) = one_launch();
            let (inbox, progress) = handles(&scheduler, stream);
            let engine = spawn_on(&scheduler, move |scheduler| {
                let job = scheduler.lock().unwrap().next_job().unwrap();
                drop(job);
                let mut s = scheduler.lock().unwrap();
                s.reach(stream).notify();
                s.finish(stream);
            });
            assert!(launch(&scheduler, &inbox, &progress, stream));
            engine.join().unwrap();
            let mut s = scheduler.lock().unwrap();
            let job = s.next_job().expect("the second launch is ready");
            assert_eq!((job.stream, job.pending.seq), (stream, 1));
            assert!(s.next_job().is_none(), "taken once");
            assert_eq!(progress.submitted(), 2);
        });
    }

    /// A thread that sees a stream failed (its failed flag, read without
    /// the lock) has its next launch refused, whether the launch races the
    /// engine recording the error or not: never queued with `Ok`, in the
    /// inbox or through the scheduler.
    #[test]
    fn a_launch_after_the_stream_is_seen_failed_is_refused() {
        loom::model(|| {
            let (scheduler, stream) = one_launch();
            let (inbox, progress) = handles(&scheduler, stream);
            let engine = spawn_on(&scheduler, move |scheduler| {
                scheduler.lock().unwrap().record_error(
                    stream,
                    FlexError::new(Status::EXECUTION_FAILED, "launch_compute", "boom"),
                );
            });
            let seen_failed = progress.done().is_none();
            let accepted = launch(&scheduler, &inbox, &progress, stream);
            engine.join().unwrap();
            assert!(
                !(seen_failed && accepted),
                "a launch after the stream was seen failed was accepted"
            );
        });
    }

    /// A notification asked for while the engine settles the record is
    /// either called once by the engine or refused as already settled:
    /// never lost, never called twice.
    #[test]
    fn a_notification_racing_the_settling_is_called_or_refused_once() {
        loom::model(|| {
            let record = Arc::new(Record::new(0, 7));
            let calls = Arc::new(loom::sync::atomic::AtomicUsize::new(0));
            let engine = {
                let record = Arc::clone(&record);
                loom::thread::spawn(move || record.settle(Ok(Instant::now())))
            };
            let counted = Arc::clone(&calls);
            let registered = record.notify(Box::new(move |result| {
                assert!(result.is_ok());
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }));
            engine.join().unwrap();
            let called = calls.load(std::sync::atomic::Ordering::SeqCst);
            match registered {
                Ok(()) => assert_eq!(called, 1, "registered, so called once"),
                Err(_) => assert_eq!(called, 0, "refused, so never called"),
            }
        });
    }

    /// A record made while the engine calls the notifications of the
    /// records its operation reached (between `reach` and `finish`) is
    /// reached as well: at once, as nothing before it is unfinished.
    #[test]
    fn a_record_made_while_reached_records_notify_is_reached() {
        loom::model(|| {
            let (scheduler, producer) = one_launch();
            let first = Arc::new(Record::new(producer, 7));
            scheduler
                .lock()
                .unwrap()
                .admit_record(producer, Arc::clone(&first), None)
                .ok()
                .unwrap();
            assert!(first.notify(Box::new(|_| {})).is_ok(), "pending");
            let engine = {
                let scheduler = Arc::clone(&scheduler);
                loom::thread::spawn(move || {
                    let job = scheduler.lock().unwrap().next_job().unwrap();
                    drop(job);
                    let reached = scheduler.lock().unwrap().reach(producer);
                    reached.notify();
                    scheduler.lock().unwrap().finish(producer);
                })
            };
            let second = Arc::new(Record::new(producer, 7));
            scheduler
                .lock()
                .unwrap()
                .admit_record(producer, Arc::clone(&second), None)
                .ok()
                .unwrap();
            engine.join().unwrap();
            assert!(
                matches!(second.outcome(), Some(Ok(_))),
                "the second record was reached"
            );
        });
    }

    /// A query without the lock racing the engine that fails a stream's
    /// only operation sees it pending or failed, never done: the failed
    /// flag is set before the count of the failing operation is published,
    /// and the reader loads them the other way round.
    #[test]
    fn a_query_racing_a_failing_operation_never_reads_done() {
        loom::model(|| {
            let (scheduler, stream) = one_launch();
            let progress = scheduler.lock().unwrap().stream(stream).progress();
            let engine = loom::thread::spawn(move || {
                let job = scheduler.lock().unwrap().next_job().unwrap();
                drop(job);
                let mut s = scheduler.lock().unwrap();
                s.record_error(
                    stream,
                    FlexError::new(Status::EXECUTION_FAILED, "launch_compute", "boom"),
                );
                s.finish(stream);
            });
            assert_ne!(
                progress.done(),
                Some(true),
                "read as done although its only operation failed"
            );
            engine.join().unwrap();
            assert_eq!(progress.done(), None, "failed once the engine is done");
            assert_eq!(progress.pending(), 0);
        });
    }

    #[test]
    fn a_record_completing_while_a_wait_is_added_releases_the_waiter() {
        loom::model(|| race(false, false));
    }

    #[test]
    fn a_record_failing_while_a_wait_is_added_fails_the_waiter() {
        loom::model(|| race(true, false));
    }

    #[test]
    fn a_mark_reached_while_a_wait_is_added_releases_the_waiter() {
        loom::model(|| race(false, true));
    }

    #[test]
    fn a_mark_failing_while_a_wait_is_added_fails_the_waiter() {
        loom::model(|| race(true, true));
    }
}

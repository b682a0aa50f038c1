//! One record of an event on the software device: the point it marks, its
//! outcome once the device reaches it, and the completions waiting for that
//! outcome. A record is a mark the scheduler keeps beside its stream's FIFO,
//! or, when it carries a completion, a marker operation in it
//! ([`EventRecord`] in [`crate::Op::Record`]); a wait is a gate on it in
//! the scheduler, with a marker operation of a record of its own behind the
//! gate.
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[cfg(not(spyre_loom))]
use crate::sync::Mutex;
use flex_rt::{Completion, FlexError, Result, Status};

/// One record of an event: the point it marks (a stream and the work before
/// it) and, once the device reaches it, the outcome — the completion time,
/// or the error it failed with (`STREAM_FAILED` naming the recording
/// stream's first error, or `SHUTDOWN`). Shared by the event (while it is the
/// latest record), the mark or marker operation, and every wait that saw
/// it.
pub(crate) struct Record {
    /// Scheduler index of the recording stream.
    pub(crate) stream: usize,
    /// Its id, for messages.
    pub(crate) stream_id: u64,
    /// The recording stream's completed count at which the device reaches
    /// the record: the operations enqueued before it (a mark) or up to and
    /// including it (a marker operation); 0 until the scheduler places it,
    /// and for a record reached at once. Written and read under the
    /// scheduler lock, so relaxed.
    position: AtomicU64,
    /// When the record's marker operation (a record with a completion)
    /// became ready to run: its stream had finished everything before it
    /// and passed its waits. The record's time, however long the marker
    /// then waits for an engine to call its completion. Set under the
    /// scheduler lock.
    ready_at: std::sync::OnceLock<Instant>,
    outcome: OutcomeCell,
}

/// The write-once outcome of a record, read without a lock (`OnceLock`),
/// and the completions asked for (`Event::notify`) while it was pending,
/// which the one that sets the outcome takes: setting and registering hold
/// one lock, so a registration is either taken by the setter or refused
/// because the outcome is there. Under loom (`--cfg spyre_loom`) one loom
/// mutex holds both, so that the models explore every order.
#[cfg(not(spyre_loom))]
struct OutcomeCell {
    outcome: std::sync::OnceLock<Result<Instant>>,
    notifications: Mutex<Vec<Completion>>,
}

#[cfg(not(spyre_loom))]
impl OutcomeCell {
    fn new() -> Self {
        Self {
            outcome: std::sync::OnceLock::new(),
            notifications: Mutex::new(Vec::new()),
        }
    }

    /// Sets the outcome if unset; returns the registered completions.
    fn set(&self, outcome: Result<Instant>) -> Vec<Completion> {
        let mut notifications = self.notifications.lock();
        let _ = self.outcome.set(outcome);
        std::mem::take(&mut *notifications)
    }

    fn get(&self) -> Option<Result<Instant>> {
        self.outcome.get().cloned()
    }

    fn is_set(&self) -> bool {
        self.outcome.get().is_some()
    }

    /// Registers `completion`, or hands it back when the outcome is set.
    fn register(&self, completion: Completion) -> std::result::Result<(), Completion> {
        let mut notifications = self.notifications.lock();
        if self.outcome.get().is_some() {
            return Err(completion);
        }
        notifications.push(completion);
        Ok(())
    }
}

#[cfg(spyre_loom)]
struct OutcomeCell(loom::sync::Mutex<(Option<Result<Instant>>, Vec<Completion>)>);

#[cfg(spyre_loom)]
impl OutcomeCell {
    fn new() -> Self {
        Self(loom::sync::Mutex::new((None, Vec::new())))
    }

    fn set(&self, outcome: Result<Instant>) -> Vec<Completion> {
        let mut cell = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cell.0.is_none() {
            cell.0 = Some(outcome);
        }
        std::mem::take(&mut cell.1)
    }

    fn get(&self) -> Option<Result<Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    fn is_set(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0.is_some()
    }

    fn register(&self, completion: Completion) -> std::result::Result<(), Completion> {
        let mut cell = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cell.0.is_some() {
            return Err(completion);
        }
        cell.1.push(completion);
        Ok(())
    }
}

impl Record {
    pub(crate) fn new(stream: usize, stream_id: u64) -> Self {
        Self {
            stream,
            stream_id,
            position: AtomicU64::new(0),
            ready_at: std::sync::OnceLock::new(),
            outcome: OutcomeCell::new(),
        }
    }

    /// Notes that the record's marker operation is ready to run, `at`
    /// (the first call counts); call with the scheduler lock held.
    pub(crate) fn mark_ready(&self, at: Instant) {
        let _ = self.ready_at.set(at);
    }

    /// The time of a record whose marker operation runs now: when the
    /// marker became ready ([`Record::mark_ready`]), else now.
    pub(crate) fn time_reached(&self) -> Instant {
        self.ready_at.get().copied().unwrap_or_else(Instant::now)
    }

    /// Places the record at its stream's completed count `position` (see
    /// [`Record::position`]); call with the scheduler lock held, as the
    /// record is queued.
    pub(crate) fn place_at(&self, position: u64) {
        self.position.store(position, Ordering::Relaxed);
    }

    /// The recording stream's completed count at which the device reaches
    /// the record, once it settles (its outcome is set before that count
    /// is published); 0 if it is not placed. Read with the scheduler lock
    /// held.
    pub(crate) fn position(&self) -> u64 {
        self.position.load(Ordering::Relaxed)
    }

    /// Sets the outcome once (later calls change nothing) and calls the
    /// completions asked for meanwhile, on the calling thread (an engine,
    /// with no lock held), catching their panics.
    pub(crate) fn settle(&self, outcome: Result<Instant>) {
        let notifications = self.set_outcome(outcome);
        self.notify_settled(notifications);
    }

    /// Sets the outcome once (later calls change nothing) and returns the
    /// completions asked for meanwhile, which the caller hands to
    /// [`Record::notify_settled`] once it holds no lock (they are user
    /// code). Waits and queries see the outcome from now on.
    pub(crate) fn set_outcome(&self, outcome: Result<Instant>) -> Vec<Completion> {
        self.outcome.set(outcome)
    }

    /// Calls `notifications` (from [`Record::set_outcome`]) with the
    /// outcome, catching their panics.
    pub(crate) fn notify_settled(&self, notifications: Vec<Completion>) {
        if notifications.is_empty() {
            return;
        }
        let result = match self.outcome() {
            Some(Err(error)) => Err(error),
            _ => Ok(()),
        };
        for completion in notifications {
            let result = result.clone();
            let call = std::panic::AssertUnwindSafe(move || completion(result));
            if let Err(payload) = std::panic::catch_unwind(call) {
                tracing::error!(
                    stream = self.stream_id,
                    "an event notification panicked: {}",
                    flex_rt::panic_message(payload.as_ref())
                );
                flex_rt::drop_panic(payload);
            }
        }
    }

    /// Registers `completion` for when the record settles; hands it back
    /// when the record has settled already (race-free against
    /// [`Record::settle`], see `OutcomeCell`).
    pub(crate) fn notify(&self, completion: Completion) -> std::result::Result<(), Completion> {
        self.outcome.register(completion)
    }

    /// The outcome, or `None` while the device has not reached the record
    /// (a copy: the time, or the error).
    pub(crate) fn outcome(&self) -> Option<Result<Instant>> {
        self.outcome.get()
    }

    /// Whether the device has reached the record (its outcome is set);
    /// [`Record::outcome`] without the copy.
    pub(crate) fn is_settled(&self) -> bool {
        self.outcome.is_set()
    }

    /// The error a stream that waited on this failed record fails with.
    pub(crate) fn wait_error(&self, cause: &FlexError) -> FlexError {
        FlexError::new(
            Status::STREAM_FAILED,
            "wait_event",
            format!(
                "waited on an event recorded on stream {}, which failed before reaching it: {cause}",
                self.stream_id
            ),
        )
    }
}

/// The marker operation of a record ([`crate::Op::Record`]). Made by
/// [`crate::MockStream`]'s `record_event`, and by its `wait_event` as the
/// wait's marker (a record nobody waits for, completed once the wait has
/// passed).
pub struct EventRecord(pub(crate) Arc<Record>);

impl fmt::Debug for EventRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventRecord(stream {})", self.0.stream_id)
    }
}

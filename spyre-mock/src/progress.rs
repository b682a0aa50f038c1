//! What a stream shares without the scheduler lock: its counts of enqueued
//! and completed operations, whether it has failed, and the threads
//! blocked on it.
use std::sync::atomic::Ordering;
#[cfg(not(spyre_loom))]
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

use crossbeam_utils::CachePadded;
// Under loom (`--cfg spyre_loom`) a stream's counts are loom atomics, so
// that the models explore the orders a lock-free reader can see them in.
#[cfg(spyre_loom)]
use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use parking_lot::{Condvar, MutexGuard};

/// The part of a stream's state used without the scheduler lock.
///
/// The engine running the stream's operations is the only writer of
/// `completed`: in [`crate::scheduler::Scheduler::finish`], under the lock, or between the
/// operations of a batch ([`crate::scheduler::Scheduler::take_batch`]) without it. Sleepers
/// are counted under the lock. So a thread that blocks on the stream
/// counts itself a sleeper *before* it looks at `completed` a last time,
/// and an engine that publishes a count without the lock looks at the
/// sleepers *after* it (all four `SeqCst`): either a `synchronize` sleeper
/// sees the new count, or the engine sees the sleeper and wakes it under
/// the lock. Under the lock (`finish`) a release store and a plain look
/// suffice. Event records are never passed inside a batch, so a thread
/// waiting for one is woken by `finish` alone.
///
/// `query` reads the stream without the lock, so the two counts and the
/// failed flag are published in an order a reader can rely on: an
/// operation is counted in `submitted` (at launch, under the stream's inbox
/// lock) before
/// any engine can take it, and the stream's first error sets `failed`
/// (under the lock) before the count of the operation that failed is
/// published. A reader that loads `completed` first (acquire) therefore
/// sees `submitted` at least as large, and `failed` set if any operation
/// it counts has failed.
pub(crate) struct Progress {
    /// Operations enqueued so far; written under the stream's inbox lock,
    /// by launching threads, so on a cache line of its own: the engine
    /// writes `completed` on every operation it finishes, and the two
    /// writers sharing a line would take it from each other each time.
    submitted: CachePadded<AtomicU64>,
    /// Operations whose completion has returned.
    completed: AtomicU64,
    /// Whether the stream has an error (sticky); set under the scheduler
    /// lock, where the error itself is.
    failed: AtomicBool,
    /// Threads blocked on `finished` until this stream's operations or
    /// records complete; an operation that finishes on a stream with none
    /// wakes nobody.
    sleepers: AtomicU32,
    /// Where `synchronize` of this stream and waits for its event records
    /// block (with the scheduler lock).
    finished: Condvar,
    /// Bumped, under the lock, whenever the stream's error, shutdown state
    /// or slowdown changes: an engine running a batch of the stream stops
    /// there, so that the next operation is judged as
    /// [`crate::scheduler::Scheduler::next_job`] would judge it.
    changes: AtomicU64,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            submitted: CachePadded::new(AtomicU64::new(0)),
            completed: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            sleepers: AtomicU32::new(0),
            finished: Condvar::new(),
            changes: AtomicU64::new(0),
        }
    }

    /// Operations enqueued so far. Without the lock, load it after
    /// [`Self::completed`] (see the type's docs).
    pub(crate) fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::Acquire)
    }

    /// Counts one more enqueued operation; call with the stream's inbox
    /// lock held, before the operation is queued
    /// ([`crate::inbox::InboxState::number`]).
    pub(crate) fn submit_one(&self) {
        self.submitted.store(
            self.submitted.load(Ordering::Relaxed) + 1,
            Ordering::Release,
        );
    }

    /// Operations whose completion has returned.
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    /// Marks the stream failed; call with the scheduler lock held, once
    /// its error is set and before the failing operation's count is
    /// published.
    pub(crate) fn mark_failed(&self) {
        self.failed.store(true, Ordering::Release);
    }

    /// Whether every operation enqueued so far has completed, read without
    /// the lock: `None` if the stream has failed (its error is under the
    /// scheduler lock). Loads the completed count, then the failed flag,
    /// then the enqueued count (see the type's docs), so a stream whose
    /// counted operations include a failed one never reads as done.
    pub(crate) fn done(&self) -> Option<bool> {
        let completed = self.completed();
        if self.failed.load(Ordering::Acquire) {
            return None;
        }
        Some(completed == self.submitted())
    }

    /// Operations enqueued and not yet complete, read without the lock
    /// (completed first, so the enqueued count read after it is never
    /// smaller).
    pub(crate) fn pending(&self) -> u64 {
        let completed = self.completed();
        self.submitted() - completed
    }

    /// Publishes `completed` with the scheduler lock held, where sleepers
    /// come and go; returns whether a thread is blocked on the stream.
    pub(crate) fn publish_locked(&self, completed: u64) -> bool {
        self.completed.store(completed, Ordering::Release);
        self.sleepers.load(Ordering::Relaxed) > 0
    }

    /// Publishes that one more operation has completed (its completion
    /// has returned), as an engine does without the lock between the
    /// operations of a batch, the stream running on. Returns whether a
    /// thread is blocked on the stream, to be woken with the lock held.
    pub(crate) fn complete_one(&self) -> bool {
        self.completed
            .store(self.completed.load(Ordering::Relaxed) + 1, Ordering::SeqCst);
        self.sleepers.load(Ordering::SeqCst) > 0
    }

    /// Notes a change of the stream's error, shutdown state or slowdown
    /// ([`Self::changes`]); call with the scheduler lock held.
    pub(crate) fn note_change(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
    }

    /// How often the stream's error, shutdown state or slowdown changed;
    /// an engine running a batch stops when this moves.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Threads blocked on the stream right now.
    #[cfg(test)]
    pub(crate) fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::SeqCst)
    }

    /// Wakes every thread blocked on the stream; call with the scheduler
    /// lock held.
    pub(crate) fn wake(&self) {
        self.finished.notify_all();
    }

    /// Blocks, with `scheduler` locked on entry and on return, until `done`
    /// holds: counted as a sleeper before `done` is looked at for the last
    /// time (see the type's docs), woken when an operation of the stream
    /// finishes.
    pub(crate) fn sleep_until<S>(
        &self,
        scheduler: &mut MutexGuard<'_, S>,
        done: impl Fn(&S) -> bool,
    ) {
        while !done(scheduler) {
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            if !done(scheduler) {
                self.finished.wait(scheduler);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

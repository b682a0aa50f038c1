//! What a stream shares without the scheduler lock: its counts of enqueued
//! and completed operations, whether it has failed, and the threads
//! blocked on it.
use std::sync::atomic::Ordering;
#[cfg(not(spyre_loom))]
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

use crossbeam_utils::CachePadded;
// Under loom (`--cfg spyre_loom`) a stream's counts are loom atomics, so
// that the models explore the orders a lock-free reader can see them in.
use crate::sync::{Condvar, MutexGuard};
#[cfg(spyre_loom)]
use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

/// The part of a stream's state used without the scheduler lock.
///
/// The engine running the stream's operations is the only writer of
/// `completed`: in [`crate::scheduler::Scheduler::finish`], under the lock, or between the
/// operations of a batch ([`crate::scheduler::Scheduler::take_batch`]) without it. A thread
/// that blocks on the stream says, under the lock, at which completed
/// count it wants to look again (`wake_at`, the least of those of every
/// blocked thread): `synchronize` at the count it waits for, a wait for an
/// event record at the record's position (the count at which the device
/// reaches it, [`crate::record::Record::position`]). A completion wakes the blocked threads
/// only once `completed` reaches `wake_at`, so a thread that synchronizes
/// a stream with many operations still queued is woken once, not by each
/// of them (unless another thread blocked on the stream asks to look
/// sooner: they share one condition variable, and all look again). The
/// waking clears `wake_at` under the lock, a woken thread that is not
/// done sets it again, and the last blocked thread to leave clears it. So
/// a thread lowers `wake_at` *before* it looks at `completed` a last time,
/// and an engine that publishes a count without the lock looks at
/// `wake_at` *after* it (all four `SeqCst`): either the thread sees the
/// new count, or the engine sees that the count reaches `wake_at` and
/// wakes it under the lock.
/// Under the lock (`finish`) a release store and a plain look suffice.
/// Event records are never passed inside a batch, so `finish` is what
/// wakes a thread waiting for one once it is reached (its outcome is set
/// before the count is published).
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
    /// The least completed count at which a thread blocked on `finished`
    /// wants to look again; [`NO_SLEEPER`] when none is blocked (it may
    /// stay lower than every blocked thread's count until a waking clears
    /// it, if one that asked sooner has left). An operation whose
    /// completion leaves the count below it wakes nobody.
    wake_at: AtomicU64,
    /// Threads blocked on `finished` now; changed under the scheduler lock
    /// only. The last to leave clears `wake_at`: one whose last look found
    /// it done left without waiting, its count still set.
    sleepers: AtomicU32,
    /// Where `synchronize` of this stream and waits for its event records
    /// block (with the scheduler lock).
    finished: Condvar,
    /// Bumped, under the lock, whenever the stream's error, shutdown state
    /// or slowdown changes: an engine running a batch of the stream stops
    /// there, so that the next operation is judged as
    /// [`crate::scheduler::Scheduler::next_job`] would judge it.
    changes: AtomicU64,
    /// How often blocked threads were woken ([`Self::wake`]), for tests.
    #[cfg(test)]
    wakes: std::sync::atomic::AtomicU64,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            submitted: CachePadded::new(AtomicU64::new(0)),
            completed: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            wake_at: AtomicU64::new(NO_SLEEPER),
            sleepers: AtomicU32::new(0),
            finished: Condvar::new(),
            changes: AtomicU64::new(0),
            #[cfg(test)]
            wakes: std::sync::atomic::AtomicU64::new(0),
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

    /// Publishes `completed` with the scheduler lock held, where blocked
    /// threads come and go; returns whether one wants to look now, to be
    /// woken with [`Self::wake`].
    pub(crate) fn publish_locked(&self, completed: u64) -> bool {
        self.completed.store(completed, Ordering::Release);
        completed >= self.wake_at.load(Ordering::Relaxed)
    }

    /// Publishes that one more operation has completed (its completion
    /// has returned), as an engine does without the lock between the
    /// operations of a batch, the stream running on. Returns whether a
    /// blocked thread wants to look now, to be woken with the lock held
    /// ([`Self::wake`]).
    pub(crate) fn complete_one(&self) -> bool {
        let completed = self.completed.load(Ordering::Relaxed) + 1;
        self.completed.store(completed, Ordering::SeqCst);
        completed >= self.wake_at.load(Ordering::SeqCst)
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

    /// Whether a thread is blocked on the stream right now.
    #[cfg(test)]
    pub(crate) fn has_sleepers(&self) -> bool {
        self.sleepers.load(Ordering::SeqCst) > 0
    }

    /// How often blocked threads were woken.
    #[cfg(test)]
    pub(crate) fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::SeqCst)
    }

    /// Wakes every thread blocked on the stream, each to look again and
    /// block again if it is not done; call with the scheduler lock held.
    pub(crate) fn wake(&self) {
        #[cfg(test)]
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.wake_at.store(NO_SLEEPER, Ordering::SeqCst);
        self.finished.notify_all();
    }

    /// Blocks, with `scheduler` locked on entry and on return, until `done`
    /// holds. Before `done` is looked at for the last time (see the type's
    /// docs) the thread asks to be woken once the stream has completed
    /// `look_again_at()` operations: the count `done` needs (for an event
    /// record, its position), or the next one if none is known.
    pub(crate) fn sleep_until<S>(
        &self,
        scheduler: &mut MutexGuard<'_, S>,
        look_again_at: impl Fn() -> u64,
        done: impl Fn(&S) -> bool,
    ) {
        if done(scheduler) {
            return;
        }
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        while !done(scheduler) {
            self.wake_at.fetch_min(look_again_at(), Ordering::SeqCst);
            if !done(scheduler) {
                self.finished.wait(scheduler);
            }
        }
        if self.sleepers.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.wake_at.store(NO_SLEEPER, Ordering::SeqCst);
        }
    }
}

/// [`Progress::wake_at`] while no thread is blocked on the stream.
const NO_SLEEPER: u64 = u64::MAX;

#[cfg(all(test, not(spyre_loom)))]
mod tests {
    use std::cell::Cell;

    use crate::sync::Mutex;

    use super::*;

    #[test]
    fn a_thread_done_at_its_last_look_leaves_no_count_to_wake_at() {
        // Not done at its first two looks; it asks to look again at 5, and
        // its last look before blocking finds it done (the count it needs
        // came in between), so it leaves without blocking. A later
        // completion then has no one to wake.
        let progress = Progress::new();
        let lock = Mutex::new(());
        let looks = Cell::new(0);
        let done = |_: &()| {
            looks.set(looks.get() + 1);
            looks.get() > 2
        };
        // (Had it blocked, nothing would wake it and the test would hang.)
        progress.sleep_until(&mut lock.lock(), || 5, done);
        assert!(!progress.has_sleepers());
        assert!(!progress.publish_locked(6), "nobody is blocked");
    }
}

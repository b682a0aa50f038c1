//! A stream's inbox: launches made without the scheduler lock.
//!
//! While a stream is *active* (an operation of it is running, or its queue
//! is not empty), a launch on it changes nothing the engines decide by:
//! the stream is not made ready, and the ready order does not move. Such a
//! launch takes only the stream's inbox lock: it numbers the operation in
//! the runtime-wide enqueue order, counts it as enqueued
//! ([`Progress::submit_one`]) and appends it to the inbox. The scheduler
//! moves the inbox to the end of the stream's queue, under both locks: as
//! the queue runs empty (the stream goes idle only if the inbox is empty
//! too), when a batch could take more, and before any launch that takes
//! the scheduler lock is queued. So the inbox only ever holds operations
//! behind the queue's, and the stream's FIFO order is the order its
//! launches took the inbox lock.
//!
//! A launch on an idle stream, or on one whose launches need the
//! scheduler's checks (it has failed, needs shutdown, has a
//! `fail_nth_launch` fault set, or the use-after-free detector is on),
//! goes through [`crate::scheduler::Scheduler::admit`] under the scheduler
//! lock. The scheduler sets both flags here under the inbox lock, so a
//! launch reads them as of its place in the stream's order; a stream is
//! marked checked before its failure can be seen. The lock order is the
//! scheduler's lock, then an inbox's.
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crossbeam_utils::CachePadded;

// Under loom the inbox lock and the enqueue-order counter are loom's, so
// that the models explore launches racing the scheduler.
#[cfg(not(spyre_loom))]
use crate::sync::{Mutex, MutexGuard};
#[cfg(spyre_loom)]
use loom::sync::{Mutex, MutexGuard, atomic::AtomicU64};
#[cfg(not(spyre_loom))]
use std::sync::atomic::AtomicU64;

use crate::op::Pending;
use crate::progress::Progress;

/// Launches on one stream waiting to be moved into its queue, and what
/// tells a launch whether it may add to them.
pub(crate) struct Inbox(Mutex<InboxState>);

/// What the inbox lock guards.
pub(crate) struct InboxState {
    /// Launched behind the stream's queued operations, in launch order.
    ops: VecDeque<Pending>,
    /// Whether the stream is active: the scheduler moves the inbox into
    /// the queue before it lets the stream go idle.
    pub(crate) active: bool,
    /// Whether launches need the scheduler's checks (a failed stream, one
    /// that needs shutdown, a `fail_nth_launch` fault set, the
    /// use-after-free detector on). Never clear while they do; it may stay
    /// set until the next launch under the scheduler lock once they no
    /// longer do (a `fail_nth_launch` fault that refused its launch).
    pub(crate) checked: bool,
    /// The runtime's enqueue order, shared by every stream of it.
    order: Arc<CachePadded<AtomicU64>>,
}

impl Inbox {
    /// An empty inbox of an idle stream, numbering
    /// operations from `order`.
    pub(crate) fn new(order: Arc<CachePadded<AtomicU64>>) -> Self {
        Self(Mutex::new(InboxState {
            ops: VecDeque::new(),
            active: false,
            checked: false,
            order,
        }))
    }

    /// Locks the inbox; the scheduler lock, if taken, must be taken first.
    pub(crate) fn lock(&self) -> MutexGuard<'_, InboxState> {
        #[cfg(spyre_loom)]
        return self.0.lock().unwrap();
        #[cfg(not(spyre_loom))]
        return self.0.lock();
    }

    /// Appends `pending` to the inbox without the scheduler lock, if the
    /// stream is active and its launches need no checks; else
    /// hands it back, to be admitted under the scheduler lock.
    pub(crate) fn try_push(
        &self,
        mut pending: Pending,
        progress: &Progress,
    ) -> Result<(), Pending> {
        let mut inbox = self.lock();
        if !inbox.active || inbox.checked {
            return Err(pending);
        }
        inbox.number(&mut pending, progress);
        inbox.ops.push_back(pending);
        Ok(())
    }
}

impl InboxState {
    /// Numbers `pending` in the runtime's enqueue order and counts it as
    /// enqueued on the stream whose `progress` this is, right before the
    /// operation is queued (in the inbox or, under the scheduler lock, in
    /// the queue): so a stream's operations are numbered and counted in
    /// their FIFO order.
    pub(crate) fn number(&mut self, pending: &mut Pending, progress: &Progress) {
        pending.seq = self.order.fetch_add(1, Ordering::Relaxed);
        progress.submit_one();
    }

    /// Moves every launch in the inbox to the end of `queue`, in order.
    pub(crate) fn move_into(&mut self, queue: &mut VecDeque<Pending>) {
        if queue.is_empty() {
            std::mem::swap(queue, &mut self.ops);
        } else {
            queue.append(&mut self.ops);
        }
    }
}

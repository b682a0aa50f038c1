//! Late completions (`SPYRE_MOCK_LATE_COMPLETIONS_MS`): a runtime's C
//! completions are handed to a delivery thread of that runtime, which calls
//! each one `delay` after its operation finished, in hand-over order.
//!
//! Every completion is counted per stream from its launch until it has
//! returned, so `flex_stream_synchronize`, `flex_stream_query`,
//! `flex_stream_destroy` and `flex_runtime_destroy` still wait for (or
//! report) completions that are due but not yet delivered, as flex.h
//! requires. Each carries the number of its launch, so that
//! `flex_stream_synchronize` waits only for the completions of launches
//! made before it (as it waits only for the work enqueued before it), not
//! for those of launches that completions or other threads keep making.
//! What does change: the stream runs its next operation while the
//! completion of the previous one is still pending.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flex_sys::bindings::flex_status_t;
use spyre_mock::sync::{Condvar, Mutex};

use crate::host_side::CCompletion;

/// One completion waiting for its time.
struct Item {
    due: Instant,
    stream: u64,
    /// The number of its launch ([`LateQueue::reserve`]).
    number: u64,
    completion: CCompletion,
    status: flex_status_t,
}

#[derive(Default)]
struct State {
    items: VecDeque<Item>,
    /// Per stream id, the launch numbers of the completions that were
    /// launched and have not returned.
    pending: BTreeMap<u64, BTreeSet<u64>>,
    /// The number the next launch gets.
    next: u64,
    stop: bool,
}

/// The queue between a runtime's engines and its delivery thread.
pub(super) struct LateQueue {
    delay: Duration,
    state: Mutex<State>,
    /// Signalled on every change: new item, delivery, stop.
    changed: Condvar,
}

impl LateQueue {
    /// Counts a completion of `stream` as pending until it is delivered (or
    /// the reservation is dropped unused: a refused launch).
    pub(super) fn reserve(self: &Arc<Self>, stream: u64) -> Reservation {
        let mut state = self.state.lock();
        let number = state.next;
        state.next += 1;
        state.pending.entry(stream).or_default().insert(number);
        Reservation {
            queue: Some(Arc::clone(self)),
            stream,
            number,
        }
    }

    /// The number the next launch gets: [`LateQueue::wait_launched_before`]
    /// waits for the completions of the launches before it.
    pub(super) fn next_launch(&self) -> u64 {
        self.state.lock().next
    }

    /// Blocks until no completion of `stream` launched before `next_launch`
    /// (a [`LateQueue::next_launch`]) is pending.
    pub(super) fn wait_launched_before(&self, stream: u64, next_launch: u64) {
        let mut state = self.state.lock();
        while state
            .pending
            .get(&stream)
            .and_then(BTreeSet::first)
            .is_some_and(|&oldest| oldest < next_launch)
        {
            self.changed.wait(&mut state);
        }
    }

    /// Completions of `stream` (or of every stream, for `None`) that are
    /// pending.
    pub(super) fn pending(&self, stream: Option<u64>) -> u64 {
        let state = self.state.lock();
        Self::count(&state, stream)
    }

    fn count(state: &State, stream: Option<u64>) -> u64 {
        let count = match stream {
            Some(id) => state.pending.get(&id).map_or(0, BTreeSet::len),
            None => state.pending.values().map(BTreeSet::len).sum(),
        };
        count as u64
    }

    /// Blocks until no completion of `stream` (or of any stream) is pending.
    pub(super) fn wait_idle(&self, stream: Option<u64>) {
        let mut state = self.state.lock();
        while Self::count(&state, stream) > 0 {
            self.changed.wait(&mut state);
        }
    }

    fn release(&self, state: &mut State, stream: u64, number: u64) {
        if let Some(numbers) = state.pending.get_mut(&stream) {
            numbers.remove(&number);
            if numbers.is_empty() {
                state.pending.remove(&stream);
            }
        }
        self.changed.notify_all();
    }
}

/// A pending completion of one stream, counted until it is handed to the
/// delivery thread ([`Reservation::deliver`]) or dropped.
pub(super) struct Reservation {
    queue: Option<Arc<LateQueue>>,
    stream: u64,
    number: u64,
}

impl Reservation {
    /// Hands `completion` with `status` to the delivery thread, due `delay`
    /// from now.
    pub(super) fn deliver(mut self, completion: CCompletion, status: flex_status_t) {
        let Some(queue) = self.queue.take() else {
            return;
        };
        let mut state = queue.state.lock();
        state.items.push_back(Item {
            due: Instant::now() + queue.delay,
            stream: self.stream,
            number: self.number,
            completion,
            status,
        });
        queue.changed.notify_all();
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(queue) = self.queue.take() {
            let mut state = queue.state.lock();
            queue.release(&mut state, self.stream, self.number);
        }
    }
}

/// The delivery thread of one runtime; dropping it stops the thread after
/// it has delivered everything queued, and joins it.
pub(super) struct LateThread {
    queue: Arc<LateQueue>,
    thread: Option<JoinHandle<()>>,
}

impl LateThread {
    /// Starts the delivery thread `name` with `delay`.
    ///
    /// # Errors
    /// The OS error when the thread cannot be spawned.
    pub(super) fn start(name: String, delay: Duration) -> std::io::Result<Self> {
        let queue = Arc::new(LateQueue {
            delay,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let shared = Arc::clone(&queue);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || deliver_until_stopped(&shared))?;
        Ok(Self {
            queue,
            thread: Some(thread),
        })
    }

    /// The queue the runtime's completions go to.
    pub(super) fn queue(&self) -> &Arc<LateQueue> {
        &self.queue
    }
}

impl Drop for LateThread {
    fn drop(&mut self) {
        self.queue.state.lock().stop = true;
        self.queue.changed.notify_all();
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// The delivery loop: calls each item once it is due, in queue order; exits
/// when told to stop and nothing is queued.
fn deliver_until_stopped(queue: &LateQueue) {
    let mut state = queue.state.lock();
    loop {
        let Some(due) = state.items.front().map(|item| item.due) else {
            if state.stop {
                return;
            }
            queue.changed.wait(&mut state);
            continue;
        };
        if Instant::now() < due {
            queue.changed.wait_until(&mut state, due);
            continue;
        }
        let Some(item) = state.items.pop_front() else {
            continue;
        };
        let Item {
            stream,
            number,
            completion,
            status,
            ..
        } = item;
        drop(state);
        // flex.h requires a C completion to return normally; the catch
        // only guards this library's own code.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| completion.call(status)));
        state = queue.state.lock();
        queue.release(&mut state, stream, number);
    }
}

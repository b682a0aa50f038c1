//! A one-shot completion signal that a device completion callback sets and
//! futures await: the hand-off between the runtime's thread and an async
//! executor, with no thread blocked and no polling loop.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use flex_rt::FlexError;

use crate::loom_shim::Mutex;

/// Set once, by the completion of one event record; read by every future
/// waiting for that record.
#[derive(Debug)]
pub(crate) struct Signal {
    state: Mutex<SignalState>,
}

#[derive(Debug, Default)]
struct SignalState {
    /// `None` until the record completes; then its outcome, for good.
    outcome: Option<Result<(), FlexError>>,
    /// Tasks to wake when it does.
    wakers: Vec<Waker>,
}

impl Signal {
    /// A signal not yet set.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(SignalState::default()),
        })
    }

    /// Sets the outcome (the first call wins) and wakes every waiting task,
    /// after releasing the lock: a waker may run the task inline.
    pub(crate) fn complete(&self, outcome: Result<(), FlexError>) {
        let wakers = {
            let mut state = self.state.lock();
            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome);
            std::mem::take(&mut state.wakers)
        };
        for waker in wakers {
            waker.wake();
        }
    }

    /// The outcome if set; else registers `cx`'s waker and returns
    /// `Pending`. `slot` is the caller's place in the waiter list (`None`
    /// before its first poll): a future polled again replaces its own waker
    /// instead of adding one, so each future holds at most one entry however
    /// often it is polled (`Waker::will_wake` may say no for the same task).
    /// The check and the registration happen under one lock, so a
    /// completion between them cannot be missed. A waker replaced is
    /// dropped after the lock, as in [`Signal::forget`].
    pub(crate) fn poll(
        &self,
        slot: &mut Option<usize>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), FlexError>> {
        let replaced = {
            let mut state = self.state.lock();
            if let Some(outcome) = &state.outcome {
                return Poll::Ready(outcome.clone());
            }
            let waker = cx.waker();
            match *slot {
                Some(index) if index < state.wakers.len() => {
                    let registered = &mut state.wakers[index];
                    if registered.will_wake(waker) {
                        None
                    } else {
                        Some(std::mem::replace(registered, waker.clone()))
                    }
                }
                _ => {
                    *slot = Some(state.wakers.len());
                    state.wakers.push(waker.clone());
                    None
                }
            }
        };
        drop(replaced);
        Poll::Pending
    }

    /// Releases the waker registered at `slot` (its future was dropped):
    /// the task it would wake is let go now, not when the signal is set.
    /// The entry stays, as a waker that does nothing, so that other
    /// futures keep their places. The released waker is dropped after the
    /// lock: its drop is the executor's code.
    pub(crate) fn forget(&self, slot: usize) {
        let released = {
            let mut state = self.state.lock();
            state
                .wakers
                .get_mut(slot)
                .map(|waker| std::mem::replace(waker, Waker::noop().clone()))
        };
        drop(released);
    }

    /// The outcome, without registering anything.
    #[cfg(all(test, not(spyre_loom)))]
    pub(crate) fn outcome(&self) -> Option<Result<(), FlexError>> {
        self.state.lock().outcome.clone()
    }
}

#[cfg(all(test, not(spyre_loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::Wake;

    use flex_rt::Status;

    use super::*;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_waiting_task_is_woken_once_and_then_sees_the_outcome() {
        let signal = Signal::new();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut slot = None;
        assert!(signal.poll(&mut slot, &mut cx).is_pending());
        assert!(
            signal.poll(&mut slot, &mut cx).is_pending(),
            "polled twice, registered once"
        );
        signal.complete(Ok(()));
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert!(matches!(
            signal.poll(&mut slot, &mut cx),
            Poll::Ready(Ok(()))
        ));
    }

    #[test]
    fn a_forgotten_waker_is_released_and_the_others_still_woken() {
        let signal = Signal::new();
        let (first, second) = (
            Arc::new(CountingWaker(AtomicUsize::new(0))),
            Arc::new(CountingWaker(AtomicUsize::new(0))),
        );
        let (mut first_slot, mut second_slot) = (None, None);
        for (counter, slot) in [(&first, &mut first_slot), (&second, &mut second_slot)] {
            let waker = Waker::from(Arc::clone(counter));
            assert!(
                signal
                    .poll(slot, &mut Context::from_waker(&waker))
                    .is_pending()
            );
        }
        assert_eq!(Arc::strong_count(&first), 2, "held by the signal");
        signal.forget(first_slot.unwrap());
        assert_eq!(Arc::strong_count(&first), 1, "released");
        signal.complete(Ok(()));
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
    }

    /// A waker that notes, as its last reference goes, whether the lock of
    /// the signal it was registered with was free then.
    struct LockProbe {
        signal: Arc<Signal>,
        lock_was_free: Arc<AtomicBool>,
    }

    impl Wake for LockProbe {
        fn wake(self: Arc<Self>) {}
    }

    impl Drop for LockProbe {
        fn drop(&mut self) {
            let free = !self.signal.state.is_locked();
            self.lock_was_free.store(free, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_replaced_waker_is_dropped_after_the_lock() {
        let signal = Signal::new();
        let lock_was_free = Arc::new(AtomicBool::new(false));
        let probe = Waker::from(Arc::new(LockProbe {
            signal: Arc::clone(&signal),
            lock_was_free: Arc::clone(&lock_was_free),
        }));
        let mut slot = None;
        let mut cx = Context::from_waker(&probe);
        assert!(signal.poll(&mut slot, &mut cx).is_pending());
        // The signal holds the probe's last reference; a poll with another
        // waker replaces it.
        drop(probe);
        let other = Waker::from(Arc::new(CountingWaker(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&other);
        assert!(signal.poll(&mut slot, &mut cx).is_pending());
        assert!(
            lock_was_free.load(Ordering::SeqCst),
            "dropped under the signal's lock (its drop is the executor's code)"
        );
    }

    #[test]
    fn the_first_outcome_wins() {
        let signal = Signal::new();
        let failure = FlexError::new(Status::STREAM_FAILED, "record_event", "boom");
        signal.complete(Err(failure.clone()));
        signal.complete(Ok(()));
        assert_eq!(signal.outcome(), Some(Err(failure)));
    }
}

/// Loom models of the hand-off between a completion callback and the tasks
/// awaiting it: run by `ci/loom.sh` (`--cfg spyre_loom`).
#[cfg(all(test, spyre_loom))]
mod loom_models {
    use std::future::poll_fn;
    use std::task::Waker;

    use flex_rt::Status;

    use super::*;

    /// A completion racing the first poll is never lost: the task is woken
    /// (loom reports a deadlock if `block_on` parks for ever).
    #[test]
    fn a_completion_racing_a_poll_wakes_the_task() {
        loom::model(|| {
            let signal = Signal::new();
            let completer = Arc::clone(&signal);
            let thread = loom::thread::spawn(move || completer.complete(Ok(())));
            let mut slot = None;
            let outcome = loom::future::block_on(poll_fn(|cx| signal.poll(&mut slot, cx)));
            assert_eq!(outcome, Ok(()));
            thread.join().unwrap();
        });
    }

    /// Two tasks on two threads await one record; both see its error.
    #[test]
    fn every_waiting_task_sees_the_outcome() {
        loom::model(|| {
            let signal = Signal::new();
            let failure = FlexError::new(Status::STREAM_FAILED, "record_event", "failed");
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let signal = Arc::clone(&signal);
                    loom::thread::spawn(move || {
                        let mut slot = None;
                        loom::future::block_on(poll_fn(|cx| signal.poll(&mut slot, cx)))
                    })
                })
                .collect();
            signal.complete(Err(failure.clone()));
            for waiter in waiters {
                assert_eq!(waiter.join().unwrap(), Err(failure.clone()));
            }
        });
    }

    /// A future dropped after its first poll (its waker released), while
    /// the completion runs, leaves nothing behind that the completion could
    /// trip on.
    #[test]
    fn dropping_a_future_while_the_completion_runs_is_safe() {
        loom::model(|| {
            let signal = Signal::new();
            let completer = Arc::clone(&signal);
            let thread = loom::thread::spawn(move || completer.complete(Ok(())));
            let mut cx = Context::from_waker(Waker::noop());
            let mut slot = None;
            let _ = signal.poll(&mut slot, &mut cx);
            if let Some(slot) = slot {
                // As `SynchronizeFuture`'s drop does.
                signal.forget(slot);
            }
            drop(signal);
            thread.join().unwrap();
        });
    }
}

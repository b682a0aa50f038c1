//! The lock of the runtime's lifecycle (its start, its free, the backend
//! waiting for the start), which a child of `fork()` never waits on for
//! ever.
//!
//! A start holds the lock across slow work (loading the flex library,
//! creating the runtime and the pool's streams). A thread of the parent
//! that held it at a `fork()` does not exist in the child, so an ordinary
//! lock would stay held there for good, and the child's first call would
//! hang. Here the lock is one atomic word that names the fork generation
//! ([`flex_rt::fork`]) of the process that took it: a child finds it taken
//! in another generation and gets [`Error::ForkedDuringStart`] at once.
//! The value behind it is in a mutex that only the word's
//! holder takes, so that mutex is never contended and never waits.
//!
//! Waiting for a holder of the caller's own process is by polling (a few
//! yields, then sleeps growing to 1 ms): the lock is taken a handful of
//! times in a process's life, never on a stream's path, and a sleep, unlike
//! a parked thread, leaves nothing in a table that a fork could copy.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flex_rt::fork;
use flex_rt::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Yields before the first sleep while another thread of this process holds
/// the lock.
const YIELDS: u32 = 16;
/// The longest sleep between two looks at the lock.
const LONGEST_SLEEP: Duration = Duration::from_millis(1);

thread_local! {
    /// Whether the calling thread holds a [`LifecycleLock`] (the process
    /// has one, the runtime's): a call that takes it again (from a
    /// backend's methods, which a start calls with it held) is refused
    /// instead of waiting for itself.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
}

/// A lock whose holder is known by fork generation.
///
/// `Send + Sync` when `T: Send`.
pub(crate) struct LifecycleLock<T> {
    /// 0 while free; else `2 × generation + 1`, the fork generation of the
    /// process whose thread holds it (odd, so never 0; a child's
    /// generation is its parent's plus at least one, so never the same
    /// word).
    holder: AtomicU64,
    value: Mutex<T>,
}

/// The lock, held; the value behind it through `Deref`.
pub(crate) struct LifecycleGuard<'a, T> {
    lock: &'a LifecycleLock<T>,
    /// Always `Some` until the drop, which releases it before the word.
    value: Option<MutexGuard<'a, T>>,
    /// Not `Send`: the drop clears the dropping thread's [`HOLDING`], so it
    /// must run on the thread that took the lock.
    _same_thread: std::marker::PhantomData<*const ()>,
}

impl<T> LifecycleLock<T> {
    /// An unlocked lock holding `value`.
    pub(crate) const fn new(value: T) -> Self {
        Self {
            holder: AtomicU64::new(0),
            value: Mutex::new(value),
        }
    }

    /// Takes the lock, waiting while another thread of this process holds
    /// it.
    ///
    /// # Errors
    /// [`Error::ForkedDuringStart`] in a child forked while a thread of an
    /// ancestor held it (that thread is not in the child, and its half-done
    /// work is the parent's); [`Error::ForkWatch`] when the fork watcher,
    /// which must count forks before the lock is first taken, cannot be
    /// registered; [`Error::LifecycleReentered`] when the calling thread
    /// holds it already.
    pub(crate) fn lock(&self) -> Result<LifecycleGuard<'_, T>> {
        fork::watch_forks().map_err(|e| Error::ForkWatch(std::sync::Arc::new(e)))?;
        let mine = fork::fork_generation().wrapping_mul(2).wrapping_add(1);
        let mut looks = 0_u32;
        loop {
            match self
                .holder
                .compare_exchange_weak(0, mine, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    HOLDING.set(true);
                    return Ok(LifecycleGuard {
                        lock: self,
                        value: Some(self.value.lock()),
                        _same_thread: std::marker::PhantomData,
                    });
                }
                Err(0) => {}
                Err(holder) if holder != mine => {
                    return Err(Error::ForkedDuringStart {
                        current: std::process::id(),
                    });
                }
                // Held in this process by this thread: it would wait for
                // itself. (A child forked by the holder saw another
                // generation above.)
                Err(_) if HOLDING.get() => return Err(Error::LifecycleReentered),
                Err(_) => {
                    if looks < YIELDS {
                        std::thread::yield_now();
                    } else {
                        let doublings = (looks - YIELDS).min(5);
                        let sleep = Duration::from_micros(32 << doublings);
                        std::thread::sleep(sleep.min(LONGEST_SLEEP));
                    }
                    looks = looks.saturating_add(1);
                }
            }
        }
    }
}

impl<T> Deref for LifecycleGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value.as_ref().expect("held until the drop")
    }
}

impl<T> DerefMut for LifecycleGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value.as_mut().expect("held until the drop")
    }
}

impl<T> Drop for LifecycleGuard<'_, T> {
    fn drop(&mut self) {
        // The mutex first: once the word is 0, the next holder (or a child
        // forked from here on) finds the mutex free too.
        drop(self.value.take());
        HOLDING.set(false);
        self.lock.holder.store(0, Ordering::Release);
    }
}

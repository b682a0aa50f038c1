//! The device's locks and condition variables: the standard library's,
//! which a forked child can use, behind the interface the device is
//! written against (a lock without poisoning, a guard that can be unlocked
//! for a stretch of user code, a condition variable waited on with a
//! guard).
//!
//! Public for the software device's C library, whose locks follow the
//! same rule.
//!
//! Not `parking_lot`: it keeps one process-wide table of parked threads,
//! with a lock per bucket. `fork` copies that table with the entries of
//! threads that were parked in the parent (an idle engine waiting for
//! work, a thread in `synchronize`) and with any bucket lock a parent
//! thread held, and the child's new threads reuse those threads' stacks:
//! a child that made a runtime of its own (which `flex.h` allows) then lost
//! wake-ups or blocked for ever in one fork of seven. The standard
//! library's locks are a futex word inside each lock and share nothing.
//!
//! A panic while a lock is held is caught by the device and recorded as
//! the operation's error, so the state behind a lock is whole: poisoning is
//! ignored.

use std::ops::{Deref, DerefMut};
use std::sync::PoisonError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A mutual-exclusion lock without poisoning.
#[derive(Debug, Default)]
pub struct Mutex<T>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// An unlocked mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }

    /// Blocks until the lock is free, and takes it.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard {
            mutex: &self.0,
            guard: Some(lock(&self.0)),
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The lock of a [`Mutex`], held until dropped.
pub struct MutexGuard<'a, T> {
    mutex: &'a std::sync::Mutex<T>,
    /// `None` only inside [`MutexGuard::unlocked`] and [`Condvar::wait`],
    /// which hold the only reference to the guard meanwhile.
    guard: Option<std::sync::MutexGuard<'a, T>>,
}

impl<T> MutexGuard<'_, T> {
    /// Releases the lock while `f` runs, and takes it again after (also
    /// when `f` unwinds).
    pub fn unlocked<U>(this: &mut Self, f: impl FnOnce() -> U) -> U {
        this.guard = None;
        let relock = Relock(this);
        let result = f();
        drop(relock);
        result
    }
}

/// Takes the lock of a guard released by [`MutexGuard::unlocked`] again
/// when dropped.
struct Relock<'g, 'a, T>(&'g mut MutexGuard<'a, T>);

impl<T> Drop for Relock<'_, '_, T> {
    fn drop(&mut self) {
        self.0.guard = Some(lock(self.0.mutex));
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.guard.as_deref().expect("the lock is held")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_deref_mut().expect("the lock is held")
    }
}

/// A condition variable, waited on with a [`MutexGuard`] (of one mutex
/// throughout).
///
/// It counts the threads waiting on it, and a notification with none
/// waiting costs one load, not a system call. That is exact for the one
/// use the device makes of it: a waiter looks at its condition and waits
/// under the mutex, and a notifier changed the condition under the same
/// mutex before it notifies (holding it or not), so a waiter either saw
/// the change or was counted before the notifier took the mutex.
#[derive(Debug, Default)]
pub struct Condvar {
    inner: std::sync::Condvar,
    waiters: AtomicUsize,
}

impl Condvar {
    /// A condition variable no thread waits on.
    pub const fn new() -> Self {
        Self {
            inner: std::sync::Condvar::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    /// Releases `guard`'s lock until notified (or woken spuriously), then
    /// takes it again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        self.wait_with(guard, |inner, held| {
            inner.wait(held).unwrap_or_else(PoisonError::into_inner)
        });
    }

    /// As [`Condvar::wait`], until `deadline` at the latest.
    pub fn wait_until<T>(&self, guard: &mut MutexGuard<'_, T>, deadline: Instant) {
        let timeout = deadline.saturating_duration_since(Instant::now());
        self.wait_with(guard, |inner, held| {
            inner
                .wait_timeout(held, timeout)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        });
    }

    fn wait_with<'a, T>(
        &self,
        guard: &mut MutexGuard<'a, T>,
        wait: impl FnOnce(
            &std::sync::Condvar,
            std::sync::MutexGuard<'a, T>,
        ) -> std::sync::MutexGuard<'a, T>,
    ) {
        let held = guard.guard.take().expect("the lock is held");
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let held = wait(&self.inner, held);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        guard.guard = Some(held);
    }

    /// Wakes one waiting thread, if any.
    pub fn notify_one(&self) {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            self.inner.notify_one();
        }
    }

    /// Wakes every waiting thread.
    pub fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            self.inner.notify_all();
        }
    }
}

/// A reader-writer lock without poisoning.
#[derive(Debug, Default)]
pub struct RwLock<T>(std::sync::RwLock<T>);

/// A shared lock of a [`RwLock`].
pub type RwLockReadGuard<'a, T> = std::sync::RwLockReadGuard<'a, T>;

impl<T> RwLock<T> {
    /// An unlocked reader-writer lock holding `value`.
    pub const fn new(value: T) -> Self {
        Self(std::sync::RwLock::new(value))
    }

    /// Takes the lock shared.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the lock exclusively.
    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn unlocked_releases_the_lock_and_takes_it_again() {
        let mutex = Mutex::new(1);
        let mut guard = mutex.lock();
        MutexGuard::unlocked(&mut guard, || {
            *mutex.lock() = 2;
        });
        assert_eq!(*guard, 2);
        *guard = 3;
        drop(guard);
        assert_eq!(*mutex.lock(), 3);
    }

    #[test]
    fn unlocked_takes_the_lock_again_when_its_stretch_unwinds() {
        let mutex = Mutex::new(1);
        let mut guard = mutex.lock();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            MutexGuard::unlocked(&mut guard, || panic!("user code"))
        }));
        assert!(unwound.is_err());
        *guard = 2;
        assert!(mutex.0.try_lock().is_err(), "held again");
        drop(guard);
        assert_eq!(*mutex.lock(), 2);
    }

    #[test]
    fn a_notification_wakes_a_waiter_and_none_is_lost() {
        let shared = Arc::new((Mutex::new(0u32), Condvar::new()));
        let waiter = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let (mutex, condvar) = &*shared;
                let mut seen = mutex.lock();
                for round in 1..=1000 {
                    while *seen < round {
                        condvar.wait(&mut seen);
                    }
                }
            })
        };
        let (mutex, condvar) = &*shared;
        for _ in 0..1000 {
            *mutex.lock() += 1;
            condvar.notify_one();
        }
        waiter.join().expect("the waiter saw every round");
    }

    #[test]
    fn a_wait_that_times_out_leaves_no_waiter_counted() {
        let mutex = Mutex::new(());
        let condvar = Condvar::new();
        let mut guard = mutex.lock();
        let deadline = Instant::now() + Duration::from_millis(20);
        condvar.wait_until(&mut guard, deadline);
        assert_eq!(condvar.waiters.load(Ordering::SeqCst), 0);
    }
}

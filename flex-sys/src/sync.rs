//! Locks that keep no state outside themselves, so that a child of
//! `fork()` can use the locks it makes: [`Mutex`] and [`RwLock`], with
//! the guards of `lock_api` (mapped guards, guards held through an `Arc`).
//!
//! `parking_lot`'s locks park their waiters in one process-wide table of
//! parked threads, with a lock per bucket. `fork()` copies that table with
//! the entries of the threads that were parked in the parent and with any
//! bucket lock a parent thread held at that moment: in the child, a lock
//! whose address hashes to such a bucket can hang when contended, and a
//! wake-up can go to a thread that is not there. Each lock here is one
//! 32-bit atomic word, taken and released with atomic instructions as
//! `parking_lot`'s are; a thread that must wait sleeps on the lock's word
//! (a private futex on Linux; elsewhere the platform's wait-on-address,
//! through the `atomic-wait` crate, which has it for Android, macOS, iOS,
//! Windows and FreeBSD, the platforms this module builds on), whose
//! sleepers the kernel keeps per process: the locks share nothing, and a child has none of its
//! parent's sleepers. (A lock a parent's thread *held* at the fork stays
//! held in the child, as with any lock: flex-rt and the stream layer do
//! not touch their own objects of the parent there; a `HostBuffer` the
//! caller keeps across the fork is the caller's, and its docs say what
//! blocks.)
//!
//! Neither lock poisons. Both are unfair: a thread that takes a lock just
//! released may go before one woken for it.
//!
//! [`RwLock`] lets readers in while a writer waits: a thread that holds a
//! read lock may take another (a host callback reading a buffer that a copy
//! queued behind it reads too), where a lock that made readers wait behind
//! a waiting writer would deadlock it. A writer waits until no read is
//! left, however many come.
//!
//! Guards may be sent to and released on another thread (a lease an
//! operation in flight holds, released by the thread that completes it).

use std::sync::atomic::{AtomicU32, Ordering};

/// Sleeping on a lock's word, and waking its sleepers: a private futex on
/// Linux, the `atomic-wait` crate's wait-on-address elsewhere. A sleep
/// checks the word and sleeps as one step (it returns at once if the word
/// no longer holds the value), and may end spuriously.
#[cfg(target_os = "linux")]
mod word {
    use std::sync::atomic::AtomicU32;

    /// Sleeps while `word` holds `value`.
    pub(super) fn wait(word: &AtomicU32, value: u32) {
        // SAFETY: `FUTEX_WAIT` reads the aligned `u32` at `word`, alive for
        // the call (borrowed), and sleeps while it equals `value`; a null
        // timeout is none. The address is passed as the `*mut u32` the
        // kernel takes. An error (`EAGAIN`: the word changed; `EINTR`) is a
        // wake-up, as a spurious one is.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                value,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }

    /// Wakes one thread sleeping on `word`.
    pub(super) fn wake_one(word: &AtomicU32) {
        wake(word, 1);
    }

    /// Wakes every thread sleeping on `word`.
    pub(super) fn wake_all(word: &AtomicU32) {
        wake(word, i32::MAX);
    }

    fn wake(word: &AtomicU32, threads: i32) {
        // SAFETY: `FUTEX_WAKE` never reads or writes the address: it only
        // finds the process's sleepers on it. (The lock may be gone by the
        // call: after the release another thread may take it, release it
        // and free it, as with the standard library's futex locks.)
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                threads,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod word {
    pub(super) use atomic_wait::{wait, wake_all, wake_one};
}

/// A mutual-exclusion lock without poisoning, fork-safe (see the module).
pub type Mutex<T> = lock_api::Mutex<RawMutex, T>;
/// The lock of a [`Mutex`], held until dropped.
pub type MutexGuard<'a, T> = lock_api::MutexGuard<'a, RawMutex, T>;
/// A [`MutexGuard`] narrowed to a part of the value.
pub type MappedMutexGuard<'a, T> = lock_api::MappedMutexGuard<'a, RawMutex, T>;
/// A reader-writer lock without poisoning whose readers do not wait for a
/// waiting writer, fork-safe (see the module).
pub type RwLock<T> = lock_api::RwLock<RawRwLock, T>;
/// A shared lock of a [`RwLock`], held until dropped.
pub type RwLockReadGuard<'a, T> = lock_api::RwLockReadGuard<'a, RawRwLock, T>;
/// An exclusive lock of a [`RwLock`], held until dropped.
pub type RwLockWriteGuard<'a, T> = lock_api::RwLockWriteGuard<'a, RawRwLock, T>;
/// A shared lock of a [`RwLock`] held through an `Arc` (so it has no
/// lifetime), held until dropped.
pub type ArcRwLockReadGuard<T> = lock_api::ArcRwLockReadGuard<RawRwLock, T>;
/// An exclusive lock of a [`RwLock`] held through an `Arc`, held until
/// dropped.
pub type ArcRwLockWriteGuard<T> = lock_api::ArcRwLockWriteGuard<RawRwLock, T>;

/// `RawMutex::state`: free.
const FREE: u32 = 0;
/// `RawMutex::state`: held, and no thread has waited for it since it was
/// taken.
const HELD: u32 = 1;
/// `RawMutex::state`: held, and a thread may be waiting for it.
const CONTENDED: u32 = 2;

/// How often a [`RawMutex`] that is held tries again, pausing, before it
/// waits.
const SPINS: u32 = 6;

/// The raw lock of [`Mutex`]: one atomic word, taken with a
/// compare-exchange and released with a swap.
///
/// The futex mutex of Drepper's "Futexes Are Tricky": the word says free,
/// held, or held with waiters; a thread that cannot take it (after a short
/// spin) marks it contended and sleeps while it stays so, and a release
/// that finds it contended wakes one sleeper, which takes it marked
/// contended (another might still sleep). The sleep checks the word and
/// sleeps as one step, so a release between the mark and the sleep is not
/// missed.
pub struct RawMutex {
    state: AtomicU32,
}

impl RawMutex {
    /// Waits until the lock is taken, marked contended (see the type).
    #[cold]
    fn lock_contended(&self) {
        for spin in 0..SPINS {
            for _ in 0..(1u32 << spin) {
                std::hint::spin_loop();
            }
            if self.state.load(Ordering::Relaxed) == FREE
                && self
                    .state
                    .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
        }
        while self.state.swap(CONTENDED, Ordering::Acquire) != FREE {
            word::wait(&self.state, CONTENDED);
        }
    }
}

// SAFETY: `lock` and `try_lock` return only once this thread's
// compare-exchange or swap moved the word from FREE (acquire), and only
// `unlock` moves it back (release), so at most one guard exists at a time
// and what the holder wrote is seen by the next. Unlocking on another
// thread is sound (`GuardSend`): nothing is tied to the locking thread.
// Nothing here unwinds.
unsafe impl lock_api::RawMutex for RawMutex {
    const INIT: Self = Self {
        state: AtomicU32::new(FREE),
    };

    type Guard = lock_api::GuardSend;

    #[inline]
    fn lock(&self) -> Self::Guard {
        if self
            .state
            .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        lock_api::GuardSend::new()
    }

    #[inline]
    fn try_lock(&self) -> Option<Self::Guard> {
        self.state
            .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| lock_api::GuardSend::new())
    }

    #[inline]
    unsafe fn unlock(&self, _guard: Self::Guard) {
        if self.state.swap(FREE, Ordering::Release) == CONTENDED {
            word::wake_one(&self.state);
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) != FREE
    }
}

/// `RawRwLock::state`: the exclusive lock is held.
const WRITER: u32 = 1 << 31;
/// `RawRwLock::state`: a thread may be sleeping until the lock changes.
const SLEEPERS: u32 = 1 << 30;
/// `RawRwLock::state`: the shared locks held now.
const READERS: u32 = SLEEPERS - 1;

/// The raw lock of [`RwLock`]: one atomic word that counts the shared
/// locks and says whether the exclusive one is held, taken and released
/// with a compare-exchange or a swap.
///
/// A reader waits only while a writer holds the lock, never for one that
/// waits (see the module), so the `try` calls never wait. A thread that
/// must wait sets the `SLEEPERS` bit with a compare-exchange from a value
/// that shows the lock held (else it tries again) and sleeps on the word
/// while it keeps that value (checked and slept on as one step); a release
/// that clears the bit (the exclusive one's, or the last shared one's: only
/// then can a waiter go on) wakes every sleeper, and woken threads that
/// still must wait set the bit again. A sleeping writer is not woken by
/// readers coming and going (only a wake ends a sleep); one whose value
/// changed just before it slept tries again. The bit is never set on a
/// lock nobody holds.
pub struct RawRwLock {
    state: AtomicU32,
}

impl RawRwLock {
    /// Takes the lock, changing the word as `taking` says, once `busy`
    /// says it may; sleeps while it may not (see the type). `taking` may
    /// panic (too many readers) before it changes anything.
    fn lock_with(&self, busy: impl Fn(u32) -> bool, taking: impl Fn(u32) -> u32) {
        while !self.try_with(&busy, &taking) {
            if let Some(marked) = self.mark_sleeper(&busy) {
                word::wait(&self.state, marked);
            }
        }
    }

    /// Sets `SLEEPERS` if `busy` says the lock is held: the word as marked,
    /// to sleep on (as loaded, with no compare-exchange, if the bit is set
    /// already: its clearing wakes every sleeper); `None` if the lock is
    /// free to try again. Never on a lock nobody holds.
    fn mark_sleeper(&self, busy: impl Fn(u32) -> bool) -> Option<u32> {
        let mut state = self.state.load(Ordering::Relaxed);
        while busy(state) {
            if state & SLEEPERS != 0 {
                return Some(state);
            }
            match self.state.compare_exchange_weak(
                state,
                state | SLEEPERS,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(state | SLEEPERS),
                Err(now) => state = now,
            }
        }
        None
    }

    /// Wakes every sleeper, after a release that cleared `SLEEPERS`.
    #[cold]
    fn wake_sleepers(&self) {
        word::wake_all(&self.state);
    }

    /// Takes the lock, changing the word as `taking` says, if `busy` says
    /// it may now; at once either way.
    fn try_with(&self, busy: impl Fn(u32) -> bool, taking: impl Fn(u32) -> u32) -> bool {
        let mut state = self.state.load(Ordering::Relaxed);
        while !busy(state) {
            match self.state.compare_exchange_weak(
                state,
                taking(state),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => state = now,
            }
        }
        false
    }
}

/// Whether a reader must wait: a writer holds the lock.
fn reader_busy(state: u32) -> bool {
    state & WRITER != 0
}

/// One more reader.
///
/// # Panics
/// If `READERS` (2^30 − 1) shared locks are held already (guards forgotten
/// by the billion): before anything changes.
fn add_reader(state: u32) -> u32 {
    assert!(
        state & READERS != READERS,
        "too many shared locks of one RwLock"
    );
    state + 1
}

/// Whether a writer must wait: any reader or writer holds the lock.
fn writer_busy(state: u32) -> bool {
    state & (WRITER | READERS) != 0
}

/// Takes the lock exclusively.
fn set_writer(state: u32) -> u32 {
    state | WRITER
}

/// Whether a thread may be sleeping until `lock` changes: a snapshot, stale
/// as soon as it is returned (for tests and diagnostics: that a writer
/// waits, say). Never on a lock nobody holds.
pub fn has_sleepers<T: ?Sized>(lock: &RwLock<T>) -> bool {
    // SAFETY: `raw` is unsafe because its caller could release the lock
    // through it; this only loads the word.
    let raw = unsafe { lock.raw() };
    raw.state.load(Ordering::Relaxed) & SLEEPERS != 0
}

// SAFETY: the holders in the word (the reader count, `WRITER`) are only
// ever changed by a compare-exchange from a value `busy` accepted (so a
// shared lock is granted only while no writer holds it, and the exclusive
// one only while nobody holds it), or by a release of a lock held, which
// gives `RwLock`'s `&`/`&mut` access its exclusion (a waiter changes only
// `SLEEPERS`); an acquire on taking and a release on releasing order what
// a holder wrote before the next holder, the relaxed changes of `SLEEPERS`
// in between being read-modify-writes, which continue the release
// sequence. The reader count cannot overflow into the flags (`add_reader`
// panics first, having changed nothing). Unlocking on another thread is
// sound (`GuardSend`): nothing is tied to the locking thread.
unsafe impl lock_api::RawRwLock for RawRwLock {
    const INIT: Self = Self {
        state: AtomicU32::new(0),
    };

    type SharedGuard = lock_api::GuardSend;
    type ExclusiveGuard = lock_api::GuardSend;

    #[inline]
    fn lock_shared(&self) -> Self::SharedGuard {
        self.lock_with(reader_busy, add_reader);
        lock_api::GuardSend::new()
    }

    #[inline]
    fn try_lock_shared(&self) -> Option<Self::SharedGuard> {
        self.try_with(reader_busy, add_reader)
            .then(lock_api::GuardSend::new)
    }

    #[inline]
    unsafe fn unlock_shared(&self, _guard: Self::SharedGuard) {
        // The last reader clears `SLEEPERS` as it goes: only a writer can
        // be waiting while a reader holds the lock, and only now can it go.
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            let last = state & READERS == 1;
            let next = if last {
                (state - 1) & !SLEEPERS
            } else {
                state - 1
            };
            match self.state.compare_exchange_weak(
                state,
                next,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) if last && state & SLEEPERS != 0 => return self.wake_sleepers(),
                Ok(_) => return,
                Err(now) => state = now,
            }
        }
    }

    #[inline]
    fn lock_exclusive(&self) -> Self::ExclusiveGuard {
        self.lock_with(writer_busy, set_writer);
        lock_api::GuardSend::new()
    }

    #[inline]
    fn try_lock_exclusive(&self) -> Option<Self::ExclusiveGuard> {
        self.try_with(writer_busy, set_writer)
            .then(lock_api::GuardSend::new)
    }

    #[inline]
    unsafe fn unlock_exclusive(&self, _guard: Self::ExclusiveGuard) {
        // While a writer holds the lock no reader does: the word is
        // `WRITER`, maybe with `SLEEPERS`.
        if self.state.swap(0, Ordering::Release) & SLEEPERS != 0 {
            self.wake_sleepers();
        }
    }

    fn is_locked(&self) -> bool {
        writer_busy(self.state.load(Ordering::Relaxed))
    }

    fn is_locked_exclusive(&self) -> bool {
        self.state.load(Ordering::Relaxed) & WRITER != 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;

    /// Runs `f` on a new thread; whether it returned within 10 s (a lost
    /// wake-up would leave it waiting for ever; under Miri, whose clock
    /// moves by the instructions run, 120 s). A panic in `f` reads as not
    /// returning.
    fn ends_in_time(f: impl FnOnce() + Send + 'static) -> bool {
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = done.send(());
        });
        let bound = Duration::from_secs(if cfg!(miri) { 120 } else { 10 });
        ended.recv_timeout(bound).is_ok()
    }

    #[test]
    fn a_mutex_excludes_and_loses_no_wake_up() {
        // Four threads add to a plain (non-atomic) count under the lock;
        // with a lost update or a lost wake-up the total is short or the
        // test times out. 4 × 20 000 = 80 000 (4 × 200 under Miri).
        let per_thread = if cfg!(miri) { 200 } else { 20_000 };
        let count = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let count = Arc::clone(&count);
                std::thread::spawn(move || {
                    for _ in 0..per_thread {
                        let mut held = count.lock();
                        let seen = *held;
                        std::hint::spin_loop();
                        *held = seen + 1;
                    }
                })
            })
            .collect();
        assert!(ends_in_time(move || threads
            .into_iter()
            .for_each(|t| t.join().unwrap())));
        assert_eq!(*count.lock(), 4 * per_thread);
        assert!(!count.is_locked());
    }

    #[test]
    fn a_mutex_guard_may_be_released_on_another_thread() {
        let mutex = Arc::new(Mutex::new(()));
        let guard = lock_api::Mutex::lock_arc(&mutex);
        std::thread::spawn(move || drop(guard)).join().unwrap();
        assert!(mutex.try_lock().is_some());
    }

    #[test]
    fn a_reader_is_let_in_while_a_writer_waits() {
        assert!(
            ends_in_time(|| {
                let lock = Arc::new(RwLock::new(1));
                let first = lock.read();
                let waiting = Arc::new(AtomicBool::new(false));
                let writer = {
                    let (lock, waiting) = (Arc::clone(&lock), Arc::clone(&waiting));
                    std::thread::spawn(move || {
                        waiting.store(true, Ordering::SeqCst);
                        *lock.write() = 2;
                    })
                };
                while !waiting.load(Ordering::SeqCst) || !has_sleepers(&lock) {
                    std::thread::yield_now();
                }
                // The writer waits for `first`; another read of the same thread
                // goes ahead of it (it would deadlock otherwise).
                assert!(lock.try_write().is_none());
                let second = lock
                    .try_read()
                    .expect("a reader is not held back by a waiting writer");
                assert_eq!((*first, *second), (1, 1));
                drop((first, second));
                writer.join().unwrap();
                assert_eq!(*lock.read(), 2);
                assert!(!has_sleepers(&lock), "a lock nobody holds has no sleepers");
            }),
            "a thread waited past the bound"
        );
    }

    #[test]
    fn a_writer_excludes_readers_and_writers_until_released() {
        assert!(
            ends_in_time(|| {
                let lock = Arc::new(RwLock::new(0));
                let write = lock.write();
                assert!(lock.try_read().is_none());
                assert!(lock.try_write().is_none());
                assert!(lock.is_locked_exclusive());
                let reader = {
                    let lock = Arc::clone(&lock);
                    std::thread::spawn(move || *lock.read())
                };
                while !has_sleepers(&lock) {
                    std::thread::yield_now();
                }
                let mut write = write;
                *write = 7;
                drop(write);
                assert_eq!(reader.join().unwrap(), 7);
                assert!(!lock.is_locked());
            }),
            "a thread waited past the bound"
        );
    }

    #[test]
    fn arc_guards_may_be_released_on_another_thread() {
        let lock = Arc::new(RwLock::new(()));
        let read = lock.try_read_arc().unwrap();
        std::thread::spawn(move || drop(read)).join().unwrap();
        let write = lock.try_write_arc().unwrap();
        std::thread::spawn(move || drop(write)).join().unwrap();
        assert!(!lock.is_locked());
    }

    #[test]
    fn readers_and_writers_exclude_and_lose_no_wake_up() {
        // Two writers keep two plain counts equal (each writes one, pauses,
        // writes the other); three readers check them equal. A reader let in
        // beside a writer, or a writer beside another, sees them differ or
        // loses an update; a lost wake-up times out. 2 × 5 000 writes
        // (2 × 100 under Miri).
        let writes = if cfg!(miri) { 100 } else { 5_000 };
        let lock = Arc::new(RwLock::new((0u64, 0u64)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (lock, stop) = (Arc::clone(&lock), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut torn = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let pair = *lock.read();
                        torn += u32::from(pair.0 != pair.1);
                    }
                    torn
                })
            })
            .collect();
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..writes {
                        let mut pair = lock.write();
                        pair.0 += 1;
                        std::hint::spin_loop();
                        pair.1 += 1;
                    }
                })
            })
            .collect();
        let written = ends_in_time(move || writers.into_iter().for_each(|t| t.join().unwrap()));
        stop.store(true, Ordering::Relaxed);
        assert!(written, "a writer waited past the bound");
        let torn: u32 = readers.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(torn, 0, "a reader saw a write half done");
        assert_eq!(*lock.read(), (2 * writes, 2 * writes));
        assert!(!lock.is_locked() && !has_sleepers(&lock));
    }
}

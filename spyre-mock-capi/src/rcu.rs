//! Read-copy-update: a value that every call reads and few calls replace,
//! read with no lock, no read-modify-write and no reference count.
//!
//! A reader opens a *read section* ([`Rcu::read`]): it raises its thread's
//! section depth (a plain store to a slot only that thread writes), then
//! loads the current value's address. A writer ([`Rcu::update`]) publishes
//! a changed copy with one swap, then waits out a *grace period*: until
//! every thread's depth has been seen at zero once. Only then does it free
//! the old value. A section that began before the swap may have loaded the
//! old address, and the writer waits for it; one that began after the swap
//! loads the new one. Sections nest (a depth, not a flag).
//!
//! That argument needs a full barrier between a reader's depth store and
//! its load of the address, and between the writer's swap and its scan of
//! the depths (the store-buffering pattern). The reader's barrier is the
//! cost every call would pay, so on Linux it is moved to the writer:
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier on
//! every running thread of the process before it returns (a thread that is
//! not running passed one when it was switched out), and the reader needs
//! only a compiler fence. Where membarrier is not available (another OS, a
//! kernel or sandbox that refuses it, Miri), both sides use a `SeqCst`
//! fence. Either way the writer's scan loads each depth with acquire and
//! the reader lowers it with release, so everything a section read
//! happens before the value is freed.
//!
//! A thread's slot is taken on its first section, from a process-wide
//! append-only list (slots are never freed; a thread's slot is given back
//! when the thread exits, for the next new thread). A writer waits for
//! every slot, so a writer must not be inside a section itself: it would
//! wait for itself (checked: it panics instead).
//!
//! After `fork()` the child has one thread; the sections other threads had
//! open are forgotten there (a `pthread_atfork` child handler, registered
//! when the first slot is taken), or a writer in the child would wait for
//! threads that do not exist there.
use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, compiler_fence, fence};
use std::sync::{MutexGuard, OnceLock, PoisonError};

/// A value read in read sections and replaced whole by [`Rcu::update`].
pub(super) struct Rcu<T> {
    /// `Box::into_raw` of the current value; never null.
    current: AtomicPtr<T>,
    /// Serializes the writers (each copies the value it replaces).
    writers: std::sync::Mutex<()>,
}

// SAFETY: the value is shared between threads by reference (readers) and
// moved to the writer that frees it, as in an `Arc<T>`: `Send + Sync` of
// `T` is what that needs.
unsafe impl<T: Send + Sync> Sync for Rcu<T> {}
// SAFETY: as above; the `Rcu` owns a `Box<T>`.
unsafe impl<T: Send + Sync> Send for Rcu<T> {}

impl<T> Rcu<T> {
    /// An `Rcu` holding `value`.
    pub(super) fn new(value: T) -> Self {
        Self {
            current: AtomicPtr::new(Box::into_raw(Box::new(value))),
            writers: std::sync::Mutex::new(()),
        }
    }

    /// The current value, for as long as the returned guard lives (a read
    /// section of this thread). Never blocks: one thread-local access, two
    /// plain stores and one load (plus, where membarrier is not available,
    /// one fence).
    #[inline]
    pub(super) fn read(&self) -> Read<'_, T> {
        let section = Section::enter();
        let current = self.current.load(Ordering::Acquire);
        Read {
            // The pointer is never null (`new`, `update`).
            value: NonNull::new(current).unwrap_or_else(|| unreachable!()),
            _section: section,
            _value: PhantomData,
        }
    }

    /// The writers' lock, for holding across `fork()` (the library's
    /// `pthread_atfork` handlers): a writer holds it while it copies,
    /// publishes and waits.
    pub(super) fn lock_writers(&self) -> MutexGuard<'_, ()> {
        self.writers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` to a copy of the current value, publishes the copy,
    /// waits until no read section can still see the old value, and drops
    /// it (after the writers' lock is released). Writers run one at a time.
    ///
    /// # Panics
    /// If this thread is inside a read section (it would wait for itself);
    /// a panic in `change` publishes nothing.
    pub(super) fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R
    where
        T: Clone,
    {
        let (old, result) = {
            let _writers = self.lock_writers();
            // SAFETY: only a writer frees a value, after replacing it, and
            // writers are serialized by the lock held here: the current
            // value stays alive until this writer replaces it.
            let mut next = unsafe { &*self.current.load(Ordering::Acquire) }.clone();
            let result = change(&mut next);
            let old = self
                .current
                .swap(Box::into_raw(Box::new(next)), Ordering::AcqRel);
            wait_for_readers();
            (old, result)
        };
        // SAFETY: `old` came from `Box::into_raw` (`new` or an earlier
        // update) and was swapped out exactly once, here; every read
        // section that may have loaded it has ended (`wait_for_readers`),
        // and a later one loads the new value.
        drop(unsafe { Box::from_raw(old) });
        result
    }
}

impl<T> Drop for Rcu<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no read section borrows this `Rcu`, so no
        // reader holds the current value, which came from `Box::into_raw`.
        drop(unsafe { Box::from_raw(*self.current.get_mut()) });
    }
}

/// The value of an [`Rcu`] as of a read section, which lasts as long as
/// this guard. Not `Send`: a section belongs to its thread.
pub(super) struct Read<'a, T> {
    value: NonNull<T>,
    _section: Section,
    _value: PhantomData<&'a T>,
}

impl<T> Deref for Read<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the value was current when this section began, and a
        // writer frees it only after every section that began before its
        // swap has ended (module docs); this one ends when `self` drops.
        unsafe { self.value.as_ref() }
    }
}

/// One thread's reader slot.
struct Slot {
    /// The thread's read-section depth; written only by the thread that
    /// owns the slot, read by writers.
    depth: AtomicUsize,
    /// Whether a live thread owns the slot.
    owned: AtomicBool,
}

/// Every slot ever taken, in a list that only grows.
static SLOTS: boxcar::Vec<Slot> = boxcar::Vec::new();

thread_local! {
    /// This thread's slot, once it has opened a section.
    static SLOT: Cell<Option<&'static Slot>> = const { Cell::new(None) };
    /// Gives the slot back when the thread exits.
    static GIVE_BACK: GiveBack = const { GiveBack };
}

/// Gives this thread's slot back on drop (at thread exit).
struct GiveBack;

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some(slot) = SLOT.with(Cell::take) {
            slot.owned.store(false, Ordering::Release);
        }
    }
}

/// This thread's slot, taken on first use.
#[inline]
fn current_slot() -> &'static Slot {
    SLOT.with(|cell| match cell.get() {
        Some(slot) => slot,
        None => {
            let slot = take_slot();
            cell.set(Some(slot));
            slot
        }
    })
}

/// A slot a thread gave back, or a new one.
#[cold]
fn take_slot() -> &'static Slot {
    let slot = SLOTS
        .iter()
        .map(|(_, slot)| slot)
        .find(|slot| {
            slot.owned
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
        .unwrap_or_else(|| {
            &SLOTS[SLOTS.push(Slot {
                depth: AtomicUsize::new(0),
                owned: AtomicBool::new(true),
            })]
        });
    // A thread that is exiting cannot register the give-back: its slot
    // stays taken, and unused, for good.
    let _ = GIVE_BACK.try_with(|_| ());
    forget_other_threads_after_fork();
    slot
}

/// Registers [`forget_other_threads`] as a `pthread_atfork` child handler,
/// once per process; if `pthread_atfork` fails (`ENOMEM`), the next slot
/// taken tries again.
fn forget_other_threads_after_fork() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    extern "C" fn in_child() {
        forget_other_threads();
    }
    if REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: `pthread_atfork` only stores the function pointer; the
    // handler is a plain `extern "C" fn` with no arguments that lives for
    // the whole program and touches only atomics and a thread-local
    // (`forget_other_threads`).
    if unsafe { libc::pthread_atfork(None, None, Some(in_child)) } != 0 {
        REGISTERED.store(false, Ordering::Release);
    }
}

/// An open read section of this thread.
struct Section {
    slot: &'static Slot,
    /// The depth before this section.
    outer: usize,
    /// A section belongs to its thread.
    _not_send: PhantomData<*const ()>,
}

impl Section {
    #[inline]
    fn enter() -> Self {
        let slot = current_slot();
        let outer = slot.depth.load(Ordering::Relaxed);
        slot.depth.store(outer + 1, Ordering::Relaxed);
        if outer == 0 {
            reader_barrier();
        }
        Self {
            slot,
            outer,
            _not_send: PhantomData,
        }
    }
}

impl Drop for Section {
    #[inline]
    fn drop(&mut self) {
        self.slot.depth.store(self.outer, Ordering::Release);
    }
}

/// Waits until every thread's section depth has been seen at zero once
/// since the value was swapped.
///
/// # Panics
/// If this thread is inside a read section.
fn wait_for_readers() {
    writer_barrier();
    let own = SLOT.with(Cell::get);
    for (_, slot) in SLOTS.iter() {
        if own.is_some_and(|own| std::ptr::eq(own, slot)) {
            assert_eq!(
                slot.depth.load(Ordering::Relaxed),
                0,
                "a handle-table writer ran inside a read section of its own thread"
            );
            continue;
        }
        let mut spins = 0u32;
        while slot.depth.load(Ordering::Acquire) != 0 {
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Forgets the read sections of every thread but this one, and gives
/// their slots back: for a forked child, which has none of those threads.
/// Touches only atomics and this thread's local (no allocation, no lock),
/// as a `pthread_atfork` child handler must.
fn forget_other_threads() {
    let own = SLOT.with(Cell::get);
    for (_, slot) in SLOTS.iter() {
        if !own.is_some_and(|own| std::ptr::eq(own, slot)) {
            slot.depth.store(0, Ordering::Relaxed);
            slot.owned.store(false, Ordering::Release);
        }
    }
}

/// Whether the reader's barrier is the writer's membarrier (decided once,
/// by the first reader or writer).
fn asymmetric() -> bool {
    static ASYMMETRIC: OnceLock<bool> = OnceLock::new();
    *ASYMMETRIC.get_or_init(membarrier::register)
}

#[inline]
fn reader_barrier() {
    if asymmetric() {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

fn writer_barrier() {
    if asymmetric() {
        membarrier::barrier();
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The `membarrier(2)` system call.
#[cfg(all(target_os = "linux", not(miri)))]
mod membarrier {
    /// `MEMBARRIER_CMD_GLOBAL`: a barrier on every thread of every process;
    /// slow, needs no registration.
    const CMD_GLOBAL: libc::c_int = 1 << 0;
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`: a barrier on every running
    /// thread of this process, by inter-processor interrupt.
    const CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    fn call(cmd: libc::c_int) -> bool {
        let (flags, cpu_id): (libc::c_uint, libc::c_int) = (0, 0);
        // SAFETY: membarrier takes a command and flags (and a CPU id,
        // unused without `MEMBARRIER_CMD_FLAG_CPU`), reads and writes no
        // memory of ours, and fails cleanly (ENOSYS, EINVAL, EPERM) where
        // it is not available.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, flags, cpu_id) == 0 }
    }

    /// Registers the process for private expedited barriers; whether it
    /// could.
    pub(super) fn register() -> bool {
        call(CMD_REGISTER_PRIVATE_EXPEDITED)
    }

    /// A full barrier on every thread of the process.
    ///
    /// # Panics
    /// If the kernel refuses both the private and the global barrier after
    /// it accepted the registration (then no barrier reaches the readers,
    /// and the old value must not be freed).
    pub(super) fn barrier() {
        let private = || call(CMD_PRIVATE_EXPEDITED);
        let done = private() || (register() && private()) || call(CMD_GLOBAL);
        assert!(
            done,
            "membarrier failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// No `membarrier(2)` here: readers fence.
#[cfg(not(all(target_os = "linux", not(miri))))]
mod membarrier {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn barrier() {
        unreachable!("readers fence where membarrier is not registered")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Barrier, mpsc};
    use std::time::Duration;

    /// A value that knows whether it was dropped, and whose two halves
    /// always agree while it lives.
    #[derive(Clone)]
    struct Pair {
        a: u64,
        b: u64,
        drops: Arc<AtomicU64>,
    }

    impl Drop for Pair {
        fn drop(&mut self) {
            // Poison the halves: a reader of a freed value would see
            // them disagree (and Miri would see the use after free).
            self.a = 1;
            self.b = 2;
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn pair(drops: &Arc<AtomicU64>) -> Pair {
        Pair {
            a: 0,
            b: 0,
            drops: Arc::clone(drops),
        }
    }

    #[test]
    fn an_update_is_seen_by_the_next_read_and_drops_the_old_value_once() {
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = Rcu::new(pair(&drops));
        let result = rcu.update(|value| {
            value.a = 7;
            value.b = 7;
            "returned"
        });
        assert_eq!(result, "returned");
        assert_eq!((rcu.read().a, rcu.read().b), (7, 7));
        // The clone's original, replaced by the update.
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        drop(rcu);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn nested_sections_end_with_the_outermost() {
        let rcu = Rcu::new(5u32);
        let outer = rcu.read();
        let depth = || current_slot().depth.load(Ordering::Relaxed);
        {
            let inner = rcu.read();
            assert_eq!(*inner, 5);
            assert_eq!(depth(), 2);
        }
        assert_eq!(
            depth(),
            1,
            "the inner section's end left the outer one open"
        );
        drop(outer);
        assert_eq!(depth(), 0);
    }

    #[test]
    fn an_update_waits_for_a_section_open_on_another_thread() {
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = &Rcu::new(pair(&drops));
        let (opened, wait_opened) = mpsc::channel();
        let (close, wait_close) = mpsc::channel::<()>();
        let (updated, wait_updated) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                let value = rcu.read();
                opened.send(()).unwrap();
                wait_close.recv().unwrap();
                // Still the old value, alive and whole.
                assert_eq!((value.a, value.b), (0, 0));
            });
            wait_opened.recv().unwrap();
            scope.spawn(move || {
                rcu.update(|value| {
                    value.a = 1;
                    value.b = 1;
                });
                updated.send(()).unwrap();
            });
            assert_eq!(
                wait_updated.recv_timeout(Duration::from_millis(200)),
                Err(mpsc::RecvTimeoutError::Timeout),
                "the update returned while a section that may see the old value was open"
            );
            assert_eq!(drops.load(Ordering::SeqCst), 0);
            close.send(()).unwrap();
            wait_updated.recv().unwrap();
        });
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(rcu.read().a, 1);
    }

    #[test]
    fn readers_racing_writers_never_see_a_freed_value() {
        let threads = if cfg!(miri) { 2 } else { 4 };
        let updates = if cfg!(miri) { 20 } else { 2_000 };
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = Rcu::new(pair(&drops));
        let done = AtomicBool::new(false);
        let start = Barrier::new(threads + 1);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    start.wait();
                    let mut last = 0;
                    while !done.load(Ordering::Relaxed) {
                        let value = rcu.read();
                        let (a, b) = (value.a, value.b);
                        assert_eq!(a, b, "a half-freed value");
                        assert!(a >= last, "a read went back to an older value");
                        last = a;
                    }
                });
            }
            start.wait();
            for n in 1..=updates {
                rcu.update(|value| {
                    value.a = n;
                    value.b = n;
                });
            }
            done.store(true, Ordering::Relaxed);
        });
        assert_eq!(drops.load(Ordering::SeqCst), updates);
    }

    #[test]
    #[should_panic(expected = "inside a read section of its own thread")]
    fn a_writer_inside_its_own_section_panics_instead_of_waiting_for_ever() {
        let rcu = Rcu::new(0u8);
        let _section = rcu.read();
        rcu.update(|value| *value = 1);
    }
}

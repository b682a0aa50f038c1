//! Read-copy-update: a value that every call reads and few calls replace,
//! read with no lock, no read-modify-write and no reference count.
//!
//! A reader opens a *read section* ([`Rcu::read`]): it makes its thread's
//! section count odd (a plain store to a slot only that thread writes),
//! then loads the current value's address; closing the section makes the
//! count even again. A writer ([`Rcu::update`]) publishes a changed copy
//! with one swap, then notes every thread whose count it finds odd, with
//! that count: once each of those counts has changed (the section it saw
//! has ended; a later one loads the new value), no section can read the old
//! value, and it may be freed. A writer does not wait for that: it retires
//! the old value with its note, and frees every retired value whose
//! sections have ended, so a reader switched out inside a section holds up
//! no writer, only memory (a bound on how many retired values there are and
//! what they weigh: past it a writer waits). [`Rcu::update_and_synchronize`]
//! waits, and frees every retired value still listed before it returns
//! (values a concurrent writer took out of the list earlier may still be
//! being freed by that writer). Sections nest: only the outermost one moves
//! the count. A section is not entered from a signal handler: the depth and
//! the count are two stores, and a handler's section between them would
//! take the interrupted one for open (or closed) when it is not (the C
//! library's docs forbid flex calls from signal handlers).
//!
//! That argument needs a full barrier between a reader's odd store and its
//! load of the address, and between the writer's swap and its scan of the
//! counts (the store-buffering pattern). The reader's barrier is the cost
//! every call would pay, so on Linux it is moved to the writer:
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier on
//! every running thread of the process before it returns (a thread that is
//! not running passed one when it was switched out), and the reader needs
//! only a compiler fence. The process registers for it when the library is
//! loaded, before any call ([`prepare`]); where that fails (another OS, a kernel or
//! sandbox that refuses it, Miri), both sides use a `SeqCst` fence. Either
//! way the writer loads each count with acquire and a reader stores it
//! with release, so everything a section read happens before the value is
//! freed.
//!
//! A thread's slot is taken on its first section, from a process-wide
//! append-only list (slots are never freed; a thread's slot is given back
//! when the thread exits, for the next new thread, by the destructor of a
//! key of the C library's thread-specific data ([`GIVE_BACK_KEY`]): glibc
//! runs those after every thread-local's destructor, and again for a key
//! set while they run, so a thread whose first call comes from a
//! destructor at its exit gives its slot back too). A writer may wait for
//! every other thread's open section, so a writer must not be inside a
//! section itself: it would wait for itself, or for a thread that waits for
//! it (checked first: it panics instead, having changed nothing).
//!
//! After `fork()` the child has one thread; the sections other threads had
//! open are forgotten there (a `pthread_atfork` child handler, registered
//! when the library is loaded), or a writer in the child would wait for
//! threads that do not exist there.
use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering, compiler_fence, fence,
};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::boundary::CancellationHeld;

/// A value read in read sections and replaced whole by [`Rcu::update`].
pub(super) struct Rcu<T> {
    /// `Box::into_raw` of the current value; null while it is `initial`.
    current: AtomicPtr<T>,
    /// The value until the first update (so that `new` is `const`, and a
    /// static `Rcu` needs no lazy initialization, which a `fork()` could
    /// interrupt).
    initial: T,
    /// Serializes the writers (each copies the value it replaces), and
    /// holds the values they replaced that sections may still read.
    writers: Mutex<Retired<T>>,
    /// What a value weighs, for the bound, in units of the owner's
    /// ([`Rcu::weighed`]; 1 for each value in tests' `Rcu::new`).
    weigh: fn(&T) -> usize,
    /// What the retired values an [`Rcu::update`] leaves to later ones may
    /// weigh in all (past at least [`MIN_RETIRED`] of them; and at most
    /// [`MAX_RETIRED`] values).
    max_retired_weight: usize,
}

// SAFETY: the value is shared between threads by reference (readers) and
// moved to the writer that frees it, as in an `Arc<T>`: `Send + Sync` of
// `T` is what that needs.
unsafe impl<T: Send + Sync> Sync for Rcu<T> {}
// SAFETY: as above; the `Rcu` owns its values.
unsafe impl<T: Send + Sync> Send for Rcu<T> {}

impl<T> Rcu<T> {
    /// An `Rcu` holding `initial` whose updates leave at most
    /// [`MAX_RETIRED`] retired values to later ones.
    #[cfg(test)]
    pub(super) const fn new(initial: T) -> Self {
        Self::weighed(initial, weigh_one, MAX_RETIRED)
    }

    /// An `Rcu` holding `initial` whose updates leave retired values that
    /// weigh at most `max_retired_weight` in all (by `weigh`), and at most
    /// [`MAX_RETIRED`] of them, to later ones, or [`MIN_RETIRED`] values
    /// whatever they weigh: past that, an update waits for their readers
    /// and frees them.
    pub(super) const fn weighed(
        initial: T,
        weigh: fn(&T) -> usize,
        max_retired_weight: usize,
    ) -> Self {
        Self {
            current: AtomicPtr::new(std::ptr::null_mut()),
            initial,
            writers: Mutex::new(Retired { values: Vec::new() }),
            weigh,
            max_retired_weight,
        }
    }

    /// The current value, for as long as the returned guard lives (a read
    /// section of this thread). Never waits for a writer: one thread-local
    /// access, two plain stores and one load (plus, where membarrier is not
    /// available, one fence). The thread's first outermost section also
    /// takes its slot (and every outermost section does where the slot's
    /// give-back could not be registered): that may allocate and take the C
    /// library's key lock. Not for a signal handler (module docs).
    #[inline]
    pub(super) fn read(&self) -> Read<'_, T> {
        let section = Section::enter();
        let current = NonNull::new(self.current.load(Ordering::Acquire))
            .unwrap_or_else(|| NonNull::from(&self.initial));
        Read {
            value: current,
            _section: section,
            _value: PhantomData,
        }
    }

    /// The writers' lock, for holding across `fork()` (the library's
    /// `pthread_atfork` handlers): a writer holds it while it copies,
    /// publishes, and frees (or waits for) the values it replaced.
    pub(super) fn lock_writers(&self) -> MutexGuard<'_, Retired<T>> {
        self.writers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` to a copy of the current value and publishes the
    /// copy, without waiting for the read sections that may still see the
    /// old value: the old value is retired, and freed by a later update
    /// once those sections have ended (this one frees the values of
    /// earlier updates whose sections have ended). Past the `Rcu`'s bound
    /// on retired values ([`Rcu::weighed`]), it waits as
    /// [`Rcu::update_and_synchronize`] does. Writers run one at a time.
    ///
    /// # Panics
    /// If this thread is inside a read section (an update may wait, and it
    /// would wait for itself), before anything is changed; a panic in
    /// `change` publishes nothing.
    pub(super) fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R
    where
        T: Clone,
    {
        self.write(change, Wait::WhenFull)
    }

    /// As [`Rcu::update`], then waits until no read section can still see
    /// the old value or any value replaced before it, and frees those still
    /// listed as retired (after the writers' lock is released; a concurrent
    /// writer may still be freeing ones it took out of the list earlier):
    /// when this returns, no section reads a value older than the one it
    /// published.
    ///
    /// # Panics
    /// As [`Rcu::update`].
    pub(super) fn update_and_synchronize<R>(&self, change: impl FnOnce(&mut T) -> R) -> R
    where
        T: Clone,
    {
        self.write(change, Wait::Always)
    }

    fn write<R>(&self, change: impl FnOnce(&mut T) -> R, wait: Wait) -> R
    where
        T: Clone,
    {
        assert!(
            !in_section(),
            "a writer of a read-copy-update value ran inside a read section of its own thread"
        );
        let (freed, result) = {
            let mut retired = self.lock_writers();
            // SAFETY: only a writer frees a value, after replacing it, and
            // writers are serialized by the lock held here: the current
            // value stays alive until this writer replaces it.
            let current = unsafe { self.current.load(Ordering::Acquire).as_ref() };
            let weight = current.map_or(0, self.weigh);
            let mut next = current.unwrap_or(&self.initial).clone();
            let result = change(&mut next);
            let old = self
                .current
                .swap(Box::into_raw(Box::new(next)), Ordering::AcqRel);
            let open = open_sections();
            if let Some(value) = NonNull::new(old) {
                retired.values.push(RetiredValue {
                    value,
                    open,
                    weight,
                });
            }
            // What no section reads any more is freed first: only the
            // values still read count against the bound.
            let (mut freed, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut retired.values)
                .into_iter()
                .partition(RetiredValue::unread);
            let kept_weight = kept.iter().map(|value| value.weight).sum::<usize>();
            let full = kept.len() > MIN_RETIRED
                && (kept_weight > self.max_retired_weight || kept.len() > MAX_RETIRED);
            if wait == Wait::Always || full {
                // A section open at an earlier swap that has not ended is
                // open at every later one, with the same count: waiting for
                // the sections open at the newest kept value's swap waits
                // for every kept value's.
                if let Some(newest) = kept.last() {
                    wait_for(&newest.open);
                }
                freed.extend(kept);
            } else {
                retired.values = kept;
            }
            (freed, result)
        };
        // Every read section that may have loaded these has ended
        // (`unread`, or `wait_for` of a superset of their open sections),
        // and a later one loads a newer value: dropped here, outside the
        // writers' lock, they free their values.
        drop(freed);
        result
    }
}

/// How many replaced values an [`Rcu::update`] leaves to later updates,
/// whatever they weigh, before it waits for their readers: each update
/// looks at every retired value, to free those no section reads.
pub(super) const MAX_RETIRED: usize = 256;

/// How many replaced values an [`Rcu::update`] leaves to later updates
/// whatever they weigh ([`Rcu::weighed`]): with values larger than the
/// bound, updates still wait only every so often.
pub(super) const MIN_RETIRED: usize = 8;

/// The weight of a value of an [`Rcu::new`].
#[cfg(test)]
fn weigh_one<T>(_: &T) -> usize {
    1
}

/// Whether a writer waits for the read sections that may see the value it
/// replaced.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Only past the `Rcu`'s bound on retired values ([`Rcu::weighed`]).
    WhenFull,
    /// Always: every replaced value is freed before the update returns.
    Always,
}

/// The values writers replaced that read sections may still see, oldest
/// first; guarded by the writers' lock.
pub(super) struct Retired<T> {
    values: Vec<RetiredValue<T>>,
}

/// A replaced value and the read sections that were open when it was
/// replaced. Dropping it frees the value: it is dropped only once no read
/// section can read the value (taken out of the list by a writer that saw
/// those sections end or waited for them, or with its `Rcu`, which then
/// has no sections).
struct RetiredValue<T> {
    /// `Box::into_raw` of the value (kept raw: readers may still borrow
    /// it).
    value: NonNull<T>,
    /// Each slot whose count was odd just after the swap, with that count.
    open: Vec<(&'static Slot, u64)>,
    /// What the value weighs ([`Rcu::weighed`]).
    weight: usize,
}

impl<T> RetiredValue<T> {
    /// Whether every section open at the swap has ended: its count
    /// changed (loaded with acquire, so everything the section read happens
    /// before the caller frees the value).
    fn unread(&self) -> bool {
        self.open
            .iter()
            .all(|(slot, seen)| slot.count.load(Ordering::Acquire) != *seen)
    }
}

impl<T> Drop for Rcu<T> {
    fn drop(&mut self) {
        let current = *self.current.get_mut();
        if !current.is_null() {
            // SAFETY: `&mut self`: no read section borrows this `Rcu`, so
            // no reader holds the current value, which came from
            // `Box::into_raw`.
            drop(unsafe { Box::from_raw(current) });
        }
        // The retired values are freed as the writers' lock drops.
    }
}

impl<T> Drop for RetiredValue<T> {
    fn drop(&mut self) {
        // SAFETY: `value` came from `Box::into_raw` (an update) and was
        // swapped out exactly once, into this one `RetiredValue`, which is
        // moved (never copied) until it drops, here; no read section can
        // still read it (the type's docs).
        drop(unsafe { Box::from_raw(self.value.as_ptr()) });
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
        // SAFETY: the value was current (or the `Rcu`'s own initial value,
        // which lives as long as the borrow `'a`) when this section began,
        // and a writer frees it only after every section open at its swap
        // has ended (module docs); this one ends when `self` drops.
        unsafe { self.value.as_ref() }
    }
}

/// One thread's reader slot. Written only by the thread that owns it
/// (plain loads and stores, no read-modify-write), read by writers.
struct Slot {
    /// Odd while the thread is inside a read section: raised by one as
    /// the outermost section opens and again as it closes.
    count: AtomicU64,
    /// How many sections of the thread are open (nested).
    depth: AtomicUsize,
    /// Whether a live thread owns the slot.
    owned: AtomicBool,
    /// Whether the owner gives the slot back as its outermost section
    /// ends: the give-back at its exit could not be registered, or ran
    /// while a section was open. Written by the owner only.
    give_back_after_section: AtomicBool,
}

/// Every slot ever taken, in a list that only grows.
static SLOTS: boxcar::Vec<Slot> = boxcar::Vec::new();

thread_local! {
    /// This thread's slot, once it has opened a section. No destructor:
    /// readable until the thread's very end.
    static SLOT: Cell<Option<&'static Slot>> = const { Cell::new(None) };
}

/// The key of the C library's thread-specific data whose destructor gives
/// a thread's slot back as the thread exits ([`give_back_at_exit`]), or
/// [`NO_KEY`] until one is made. Made when the library is loaded
/// ([`prepare`]), else (Miri, or `pthread_key_create` failed there with
/// `EAGAIN`: the process had used up its keys) by the next slot taken; a
/// slot taken while there is none goes back after each outermost section.
/// An atomic, not a once-only cell: a `fork()` cannot leave it half made.
///
/// Not a thread-local's destructor: glibc runs those before the keys'
/// destructors and never again, so a give-back registered by a first call
/// from a key's destructor would never run. A key set while the keys'
/// destructors run has its destructor run in a later round, up to
/// `PTHREAD_DESTRUCTOR_ITERATIONS` rounds: a thread whose call in the
/// last round comes after this key's destructor keeps its slot. (Where
/// Rust's thread-locals are destroyed by a key of their own, as on musl,
/// this key's destructor may run first: a section a thread-local still
/// holds then gives the slot back as it ends.) The key is never deleted,
/// and the library is linked so that `dlclose` leaves it loaded (`-z
/// nodelete`, `build.rs`, on ELF systems): there a thread that called exits
/// calling the destructor, also after a `dlclose`. (Elsewhere the library
/// must not be closed while a thread that called it lives.)
static GIVE_BACK_KEY: AtomicU64 = AtomicU64::new(NO_KEY);

/// [`GIVE_BACK_KEY`] before a key is made.
const NO_KEY: u64 = u64::MAX;

/// [`GIVE_BACK_KEY`], made if there is none yet; `None` if it cannot be
/// made.
fn give_back_key() -> Option<libc::pthread_key_t> {
    extern "C" fn at_exit(_: *mut c_void) {
        give_back_at_exit();
    }
    let made = GIVE_BACK_KEY.load(Ordering::Acquire);
    if made != NO_KEY {
        return libc::pthread_key_t::try_from(made).ok();
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `pthread_key_create` writes the new key to `key`, a live
    // local, and stores the destructor, a plain `extern "C" fn` that stays
    // loaded for the whole process (`GIVE_BACK_KEY`), ignores the value it
    // is passed, and touches only atomics and a thread-local without a
    // destructor (and, in this crate's tests, a test's own record).
    if unsafe { libc::pthread_key_create(&mut key, Some(at_exit)) } != 0 {
        return None;
    }
    match GIVE_BACK_KEY.compare_exchange(
        NO_KEY,
        u64::from(key),
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => Some(key),
        Err(first) => {
            // Another thread made one first: this one was never set.
            // SAFETY: `key` was made above and no thread has a value for it.
            unsafe { libc::pthread_key_delete(key) };
            libc::pthread_key_t::try_from(first).ok()
        }
    }
}

/// Registers the give-back of `slot` at this thread's exit: sets this
/// thread's value of [`GIVE_BACK_KEY`] (the slot's address, only so that
/// it is not null: the destructor finds the slot through `SLOT`). Returns
/// whether it did.
fn give_back_at_thread_exit(slot: &'static Slot) -> bool {
    give_back_key().is_some_and(|key| {
        // SAFETY: `key` was made by `pthread_key_create` and is never
        // deleted; the value is stored, never dereferenced.
        unsafe { libc::pthread_setspecific(key, std::ptr::from_ref(slot).cast()) == 0 }
    })
}

/// Gives this thread's slot back as the thread exits (the destructor of
/// [`GIVE_BACK_KEY`]); if a section of the thread is still open, the
/// outermost section to end gives it back.
fn give_back_at_exit() {
    if let Some(slot) = SLOT.with(Cell::get) {
        if slot.depth.load(Ordering::Relaxed) == 0 {
            give_back_now(slot);
        } else {
            slot.give_back_after_section.store(true, Ordering::Relaxed);
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
                count: AtomicU64::new(0),
                depth: AtomicUsize::new(0),
                owned: AtomicBool::new(true),
                give_back_after_section: AtomicBool::new(false),
            })]
        });
    // Where the give-back at exit cannot be registered, the slot goes
    // back after each section instead (else the thread would keep it, for
    // every writer to scan, for good).
    #[cfg(test)]
    tests::note_taken(slot);
    let registered = give_back_at_thread_exit(slot);
    slot.give_back_after_section
        .store(!registered, Ordering::Relaxed);
    slot
}

/// Whether this thread is inside a read section.
fn in_section() -> bool {
    SLOT.with(Cell::get)
        .is_some_and(|slot| slot.depth.load(Ordering::Relaxed) != 0)
}

/// An open read section of this thread.
struct Section {
    slot: &'static Slot,
    /// A section belongs to its thread.
    _not_send: PhantomData<*const ()>,
}

impl Section {
    #[inline]
    fn enter() -> Self {
        let slot = current_slot();
        let depth = slot.depth.load(Ordering::Relaxed);
        slot.depth.store(depth + 1, Ordering::Relaxed);
        if depth == 0 {
            let count = slot.count.load(Ordering::Relaxed);
            slot.count.store(count + 1, Ordering::Release);
            reader_barrier();
        }
        Self {
            slot,
            _not_send: PhantomData,
        }
    }
}

impl Drop for Section {
    #[inline]
    fn drop(&mut self) {
        // Sections of a thread may end in any order: only the count of
        // open ones matters.
        let depth = self.slot.depth.load(Ordering::Relaxed) - 1;
        self.slot.depth.store(depth, Ordering::Relaxed);
        if depth == 0 {
            let count = self.slot.count.load(Ordering::Relaxed);
            self.slot.count.store(count + 1, Ordering::Release);
            if self.slot.give_back_after_section.load(Ordering::Relaxed) {
                give_back_now(self.slot);
            }
        }
    }
}

/// Gives back the slot of a thread that is exiting.
#[cold]
fn give_back_now(slot: &'static Slot) {
    #[cfg(test)]
    tests::note_given_back(slot);
    SLOT.with(|cell| cell.set(None));
    slot.owned.store(false, Ordering::Release);
}

/// Every slot whose count is odd (a section open) just after the caller
/// swapped the value, with that count. Its barrier orders the swap before
/// the loads (module docs): a section these loads find closed, or that
/// opens later, loads the new value.
fn open_sections() -> Vec<(&'static Slot, u64)> {
    writer_barrier();
    SLOTS
        .iter()
        .map(|(_, slot)| (slot, slot.count.load(Ordering::Acquire)))
        .filter(|(_, count)| count % 2 == 1)
        .collect()
}

/// Waits until each of the `open` sections has ended: its count changed.
/// Spins briefly, then yields, then sleeps, doubling the sleep from 10 µs
/// up to 1 ms: a section's thread may be switched out for long (a yield
/// alone would busy a CPU meanwhile, and under a real-time policy would
/// not let a thread of lower priority run at all). A caller's
/// `pthread_cancel` is held off meanwhile: the sleep is a cancellation
/// point, and this library's frames cannot unwind.
fn wait_for(open: &[(&'static Slot, u64)]) {
    const SPINS: u32 = 64;
    const YIELDS: u32 = 64;
    let _held = CancellationHeld::new();
    for (slot, seen) in open {
        let mut looks = 0u32;
        let mut sleep = std::time::Duration::from_micros(10);
        while slot.count.load(Ordering::Acquire) == *seen {
            if looks < SPINS {
                std::hint::spin_loop();
            } else if looks < SPINS + YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(std::time::Duration::from_millis(1));
            }
            looks = looks.saturating_add(1);
        }
    }
}

/// Forgets the read sections of every thread but this one, and gives
/// their slots back: for a forked child, which has none of those threads.
/// Takes no lock of this library and allocates nothing itself (the
/// thread-local access may, on a thread's first, through the C library's
/// own fork-safe allocator), as a `pthread_atfork` child handler must.
fn forget_other_threads() {
    let own = SLOT.with(Cell::get);
    for (_, slot) in SLOTS.iter() {
        if !own.is_some_and(|own| std::ptr::eq(own, slot)) {
            let count = slot.count.load(Ordering::Relaxed);
            slot.count.store(count + count % 2, Ordering::Relaxed);
            slot.depth.store(0, Ordering::Relaxed);
            slot.owned.store(false, Ordering::Release);
        }
    }
}

/// Whether the reader's barrier is the writer's membarrier: set once, when
/// the library is loaded ([`prepare`]), before any call can read it.
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Registers the process for membarrier, creates the key that gives a
/// thread's slot back at its exit ([`GIVE_BACK_KEY`]), and registers
/// [`forget_other_threads`] as a `pthread_atfork` child handler
/// ([`forget_sections_in_forked_child`]).
/// Called once, when the library is loaded (`crate::library`), before any
/// of its functions can be called: so no `fork()` can find a read section
/// open and no handler to forget it, nor a decision half made. Without it
/// (Miri), readers fence and a forked child is not handled.
///
/// The membarrier registration is a system call at load: a seccomp policy
/// that kills a process on system calls it does not know kills it at
/// `dlopen` (one that refuses it with an error leaves readers fencing).
pub(super) fn prepare() {
    ASYMMETRIC.store(membarrier::register(), Ordering::Relaxed);
    let _ = give_back_key();
    let _ = forget_sections_in_forked_child();
}

/// Registers [`forget_other_threads`] as a `pthread_atfork` child handler,
/// once per process: at load ([`prepare`]), and again from
/// `flex_runtime_create` if that failed.
///
/// # Errors
/// The error of `pthread_atfork` (`ENOMEM`); a later call tries again.
pub(super) fn forget_sections_in_forked_child() -> Result<(), std::io::Error> {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    extern "C" fn in_child() {
        forget_other_threads();
    }
    if REGISTERED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: `pthread_atfork` only stores the function pointer; the
    // handler is a plain `extern "C" fn` with no arguments that lives for
    // the whole program and touches only atomics and a thread-local
    // without a destructor (`forget_other_threads`). Two threads
    // registering at once register it twice, which forgets twice.
    match unsafe { libc::pthread_atfork(None, None, Some(in_child)) } {
        0 => {
            REGISTERED.store(true, Ordering::Release);
            Ok(())
        }
        status => Err(std::io::Error::from_raw_os_error(status)),
    }
}

#[inline]
fn reader_barrier() {
    if ASYMMETRIC.load(Ordering::Relaxed) {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

fn writer_barrier() {
    if ASYMMETRIC.load(Ordering::Relaxed) {
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
    /// and the old value must not be freed; the new one stays published, so
    /// the C call that made the change fails with `FLEX_ERROR_INTERNAL`
    /// after making it: the library's docs require a process not to refuse
    /// `membarrier` once the library is loaded).
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
    use std::sync::{Arc, Barrier, OnceLock, mpsc};
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

    /// Sets both halves of the value to `n`, leaving the old value to a
    /// later update.
    fn set(rcu: &Rcu<Pair>, n: u64) {
        rcu.update(|value| {
            value.a = n;
            value.b = n;
        });
    }

    /// Sets both halves of the value to `n`, and frees every value it
    /// replaced before it returns.
    fn set_and_synchronize(rcu: &Rcu<Pair>, n: u64) {
        rcu.update_and_synchronize(|value| {
            value.a = n;
            value.b = n;
        });
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
        // The initial value stays in the `Rcu` until it drops.
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        set(&rcu, 8);
        assert_eq!((rcu.read().a, rcu.read().b), (8, 8));
        set_and_synchronize(&rcu, 9);
        assert_eq!((rcu.read().a, rcu.read().b), (9, 9));
        // The first two updates' values, replaced.
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        set(&rcu, 10);
        drop(rcu);
        // The initial value, the one the last update replaced (retired or
        // not) and the current one.
        assert_eq!(drops.load(Ordering::SeqCst), 5);
    }

    /// This thread's open sections, and whether its count is odd.
    fn own_sections() -> (usize, u64) {
        let slot = current_slot();
        (
            slot.depth.load(Ordering::Relaxed),
            slot.count.load(Ordering::Relaxed) % 2,
        )
    }

    #[test]
    fn nested_sections_end_with_the_outermost() {
        let rcu = Rcu::new(5u32);
        let outer = rcu.read();
        {
            let inner = rcu.read();
            assert_eq!(*inner, 5);
            assert_eq!(own_sections(), (2, 1));
        }
        assert_eq!(
            own_sections(),
            (1, 1),
            "the inner section's end closed the outer one"
        );
        drop(outer);
        assert_eq!(own_sections(), (0, 0));
    }

    #[test]
    fn sections_may_end_out_of_order() {
        let rcu = Rcu::new(5u32);
        let first = rcu.read();
        let second = rcu.read();
        drop(first);
        assert_eq!(
            own_sections(),
            (1, 1),
            "the first section's end closed the second one"
        );
        assert_eq!(*second, 5);
        drop(second);
        assert_eq!(own_sections(), (0, 0));
    }

    /// Sets the value to 1 (freeing every older one), then opens a read
    /// section of it on one thread and runs `writer` on another, with a
    /// channel to report on; `watch` runs on this thread with the reports
    /// and a function that ends the section (which then checks that the
    /// value it read is still whole). Returns once all three are done.
    fn with_a_section_open(
        rcu: &Rcu<Pair>,
        writer: impl FnOnce(mpsc::Sender<u64>) + Send,
        watch: impl FnOnce(&mpsc::Receiver<u64>, &dyn Fn()),
    ) {
        set_and_synchronize(rcu, 1);
        with_a_section_of(rcu, 1, writer, watch);
    }

    /// [`with_a_section_open`] of the current value, `value` (set by the
    /// caller), returning what `watch` returns.
    fn with_a_section_of<R>(
        rcu: &Rcu<Pair>,
        value: u64,
        writer: impl FnOnce(mpsc::Sender<u64>) + Send,
        watch: impl FnOnce(&mpsc::Receiver<u64>, &dyn Fn()) -> R,
    ) -> R {
        let (opened, wait_opened) = mpsc::channel();
        let (close, wait_close) = mpsc::channel::<()>();
        let (updated, wait_updated) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                let read = rcu.read();
                opened.send(()).unwrap();
                wait_close.recv().unwrap();
                assert_eq!((read.a, read.b), (value, value), "read after it was freed");
            });
            wait_opened.recv().unwrap();
            scope.spawn(move || writer(updated));
            // Ends the section even if `watch` panics (else the scope
            // would wait for it for ever).
            let close = EndsOnDrop(close);
            watch(&wait_updated, &|| close.end())
        })
    }

    /// Ends a section held by [`with_a_section_open`] when told, or when
    /// dropped.
    struct EndsOnDrop(mpsc::Sender<()>);

    impl EndsOnDrop {
        fn end(&self) {
            // A second end finds the section's thread gone: nothing to do.
            let _ = self.0.send(());
        }
    }

    impl Drop for EndsOnDrop {
        fn drop(&mut self) {
            self.end();
        }
    }

    #[test]
    fn an_update_and_synchronize_waits_for_a_section_open_on_another_thread() {
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = &Rcu::new(pair(&drops));
        with_a_section_open(
            rcu,
            |updated| {
                set_and_synchronize(rcu, 2);
                updated.send(2).unwrap();
            },
            |wait_updated, close| {
                assert_eq!(
                    wait_updated.recv_timeout(Duration::from_millis(200)),
                    Err(mpsc::RecvTimeoutError::Timeout),
                    "the update returned while a section that may see the old value was open"
                );
                assert_eq!(drops.load(Ordering::SeqCst), 0);
                close();
                assert_eq!(wait_updated.recv(), Ok(2));
            },
        );
        // The value 1.
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(rcu.read().a, 2);
    }

    /// The CPU time the calling thread has used.
    fn thread_cpu_time() -> Duration {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid out-pointer; the clock exists on Linux.
        let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }

    /// A writer waiting 300 ms for a section sleeps: it used under a third
    /// of that in CPU time. Before, it yielded in a loop, busy all along
    /// (300 ms of CPU time on an idle CPU: 299.8 ms in one run).
    #[test]
    #[cfg_attr(miri, ignore = "thread CPU clock")]
    fn a_writer_waiting_for_a_long_section_does_not_busy_a_cpu() {
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = &Rcu::new(pair(&drops));
        with_a_section_open(
            rcu,
            |updated| {
                let start = thread_cpu_time();
                set_and_synchronize(rcu, 2);
                let busy = thread_cpu_time() - start;
                updated.send(busy.as_micros().try_into().unwrap()).unwrap();
            },
            |wait_updated, close| {
                std::thread::sleep(Duration::from_millis(300));
                close();
                let busy_us = wait_updated.recv().unwrap();
                assert!(
                    busy_us < 100_000,
                    "the writer used {busy_us} µs of CPU time waiting 300 ms"
                );
            },
        );
    }

    #[test]
    fn an_update_does_not_wait_for_a_section_open_on_another_thread() {
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = &Rcu::new(pair(&drops));
        with_a_section_open(
            rcu,
            |updated| {
                set(rcu, 2);
                updated.send(2).unwrap();
            },
            |wait_updated, close| {
                // Were the update to wait for the section, it would end
                // only after this timeout (the section ends below).
                let waited = wait_updated.recv_timeout(Duration::from_secs(30));
                let freed_while_read = drops.load(Ordering::SeqCst);
                close();
                assert_eq!(waited, Ok(2), "the update waited for the open section");
                assert_eq!(freed_while_read, 0, "freed while read");
            },
        );
        assert_eq!(rcu.read().a, 2);
        // Once the section has ended, a later update frees the retired
        // value, long before the bound would make one wait. A section of
        // another test's thread, open at that update's swap, may hold it up
        // for a few updates more (the longest such sections, in the bound's
        // tests, last a few updates and 200 ms; these are 100 ms apart).
        const TRIES: u64 = 30;
        const { assert!(TRIES < MAX_RETIRED as u64) };
        let mut n = 3;
        while drops.load(Ordering::SeqCst) == 0 {
            assert!(
                n < 3 + TRIES,
                "the retired value was not freed by {} later updates",
                n - 3
            );
            set(rcu, n);
            n += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(rcu.read().a, n - 1);
    }

    #[test]
    fn values_retired_while_a_section_was_open_are_freed_by_a_synchronize_or_the_drop() {
        for freed_by_synchronize in [true, false] {
            let drops = Arc::new(AtomicU64::new(0));
            let rcu = Rcu::new(pair(&drops));
            with_a_section_open(
                &rcu,
                |updated| {
                    // Value 1 retired, seen by the section.
                    set(&rcu, 2);
                    updated.send(2).unwrap();
                },
                |wait_updated, close| {
                    assert_eq!(wait_updated.recv(), Ok(2));
                    close();
                },
            );
            // Value 1 is still retired (no update since the section
            // ended).
            assert_eq!(drops.load(Ordering::SeqCst), 0);
            if freed_by_synchronize {
                set_and_synchronize(&rcu, 3);
                // Values 1 (retired by the earlier update) and 2.
                assert_eq!(drops.load(Ordering::SeqCst), 2);
            } else {
                drop(rcu);
                // The initial value, value 1 (retired) and value 2
                // (current).
                assert_eq!(drops.load(Ordering::SeqCst), 3);
            }
        }
    }

    #[test]
    fn past_the_bound_of_retired_values_an_update_waits_and_frees_them_all() {
        let drops = Arc::new(AtomicU64::new(0));
        // A small bound, for Miri's sake; the production one is the same
        // code. Values weigh 1: nine values are more than the floor of
        // `MIN_RETIRED` (8) and weigh more than 8.
        let rcu = Rcu::weighed(pair(&drops), weigh_one, 8);
        an_update_past_the_bound_waits(&rcu, &drops, 8);
    }

    #[test]
    fn the_bound_counts_what_retired_values_weigh() {
        let drops = Arc::new(AtomicU64::new(0));
        // Values of 100 under a bound of 1 000: ten stay retired, the
        // eleventh is past the bound (and past the floor of 8 values).
        let rcu = Rcu::weighed(pair(&drops), |_| 100, 1_000);
        an_update_past_the_bound_waits(&rcu, &drops, 10);
        // Values heavier than the whole bound: the floor of 8 values
        // stays retired, the ninth waits.
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = Rcu::weighed(pair(&drops), |_| 5_000, 1_000);
        an_update_past_the_bound_waits(&rcu, &drops, MIN_RETIRED as u64);
    }

    #[test]
    fn values_freed_without_waiting_do_not_count_against_the_bound() {
        // Alone: a section of another test's thread open at the swaps of the
        // first ten values and still open at the eleventh update keeps them
        // retired, and makes that update wait (with 8 test threads, all
        // three attempts once waited so). In a process of its own only a
        // pause of this thread between its own steps could, which does not
        // repeat, so the scenario is still tried up to three times.
        // Counting values that no section reads makes it wait every time.
        crate::tests::alone(
            "rcu::tests::values_freed_without_waiting_do_not_count_against_the_bound",
            || {
                for attempt in 1..=3 {
                    if ten_more_updates_are_within_the_bound_once_ten_are_unread() {
                        return;
                    }
                    eprintln!("attempt {attempt}: an update waited");
                }
                panic!("an update within the bound waited: values no section read were counted");
            },
        );
    }

    /// Retires ten values of 100 under a bound of 1 000 while a section is
    /// open, ends the section, opens another, and makes ten more updates:
    /// the first frees the ten values, which no section reads any more, so
    /// the ten are within the bound again. Returns whether they returned
    /// within 2 s (while the second section was open).
    fn ten_more_updates_are_within_the_bound_once_ten_are_unread() -> bool {
        let drops = Arc::new(AtomicU64::new(0));
        let rcu = &Rcu::weighed(pair(&drops), |_| 100, 1_000);
        with_a_section_open(
            rcu,
            |updated| {
                for n in 2..=11 {
                    set(rcu, n);
                }
                updated.send(11).unwrap();
            },
            |wait_updated, close| {
                let within_bound = wait_updated.recv_timeout(Duration::from_secs(30));
                close();
                assert_eq!(within_bound, Ok(11), "an update within the bound waited");
            },
        );
        with_a_section_of(
            rcu,
            11,
            |updated| {
                for n in 12..=21 {
                    set(rcu, n);
                }
                updated.send(21).unwrap();
            },
            |wait_updated, close| {
                let within_bound = wait_updated.recv_timeout(Duration::from_secs(2));
                close();
                within_bound == Ok(21)
            },
        )
    }

    /// With a section open that sees every value, `within` updates of `rcu`
    /// retire their values without waiting, and the next one waits for the
    /// section, then frees every value replaced.
    fn an_update_past_the_bound_waits(rcu: &Rcu<Pair>, drops: &AtomicU64, within: u64) {
        with_a_section_open(
            rcu,
            |updated| {
                // Values 1 to `within` retired, each seen by the section.
                for n in 2..=within + 1 {
                    set(rcu, n);
                }
                updated.send(within + 1).unwrap();
                // One more retired: past the bound, this one waits.
                set(rcu, within + 2);
                updated.send(within + 2).unwrap();
            },
            |wait_updated, close| {
                let within_bound = wait_updated.recv_timeout(Duration::from_secs(30));
                let past_bound = wait_updated.recv_timeout(Duration::from_millis(200));
                let freed_while_read = drops.load(Ordering::SeqCst);
                close();
                assert_eq!(
                    within_bound,
                    Ok(within + 1),
                    "an update within the bound waited"
                );
                assert_eq!(
                    past_bound,
                    Err(mpsc::RecvTimeoutError::Timeout),
                    "the update past the bound returned while a section that may see a retired value was open"
                );
                assert_eq!(freed_while_read, 0, "freed while read");
                assert_eq!(wait_updated.recv(), Ok(within + 2));
            },
        );
        // Values 1 to `within + 1`: every value replaced, freed by the
        // update that waited.
        assert_eq!(drops.load(Ordering::SeqCst), within + 1);
    }

    #[test]
    fn readers_racing_writers_never_see_a_freed_value() {
        // Readers that never rest hold up every writer of the test binary
        // that waits (the other tests' runtime destroys among them) while
        // one of them is switched out inside a section: two, for a bounded
        // time.
        let threads = 2;
        let updates = if cfg!(miri) { 20 } else { 1_000 };
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
                // Mostly retired and freed by later updates; every tenth
                // waits and frees them all.
                if n % 10 == 0 {
                    set_and_synchronize(&rcu, n);
                } else {
                    set(&rcu, n);
                }
            }
            done.store(true, Ordering::Relaxed);
        });
        set_and_synchronize(&rcu, updates + 1);
        // Every update's value but the last (the initial one stays in the
        // `Rcu` until it drops).
        assert_eq!(drops.load(Ordering::SeqCst), updates);
    }

    static EXIT_RCU: Rcu<u8> = Rcu::new(7);

    thread_local! {
        /// The number [`on_named_thread`] gave this thread (0: none).
        static THREAD_NUMBER: Cell<u64> = const { Cell::new(0) };
    }

    /// What a thread [`on_named_thread`] ran did with slots: its number,
    /// and whether it took (`true`) or gave back a slot.
    static SLOTS_MOVED: Mutex<Vec<(u64, bool)>> = Mutex::new(Vec::new());

    fn note(taken: bool) {
        let number = THREAD_NUMBER.with(Cell::get);
        if number != 0 {
            SLOTS_MOVED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((number, taken));
        }
    }

    /// Notes that this thread takes a slot (from [`take_slot`]).
    pub(super) fn note_taken(_: &'static Slot) {
        note(true);
    }

    /// Notes that this thread gives a slot back (from [`give_back_now`]).
    pub(super) fn note_given_back(_: &'static Slot) {
        note(false);
    }

    /// Runs `body` on a new thread, joins it (so every destructor of its
    /// exit has run), and returns how many slots it took and how many it
    /// gave back.
    fn on_named_thread(body: impl FnOnce() + Send + 'static) -> (usize, usize) {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        std::thread::spawn(move || {
            THREAD_NUMBER.with(|cell| cell.set(number));
            body();
        })
        .join()
        .unwrap();
        let moved = SLOTS_MOVED.lock().unwrap_or_else(PoisonError::into_inner);
        let count = |taken| moved.iter().filter(|&&m| m == (number, taken)).count();
        (count(true), count(false))
    }

    /// A thread-local whose destructor reads `EXIT_RCU` and reports the
    /// value.
    struct ReadsOnExit(mpsc::Sender<u8>);

    impl Drop for ReadsOnExit {
        fn drop(&mut self) {
            let _ = self.0.send(*EXIT_RCU.read());
        }
    }

    thread_local! {
        static READS_ON_EXIT: std::cell::RefCell<Option<ReadsOnExit>> =
            const { std::cell::RefCell::new(None) };
        static HELD_AT_EXIT: std::cell::RefCell<Option<Read<'static, u8>>> =
            const { std::cell::RefCell::new(None) };
    }

    #[test]
    fn a_thread_that_reads_in_a_thread_locals_destructor_gives_its_slot_back() {
        for reads_before in [false, true] {
            let (report, reports) = mpsc::channel();
            let given_back = on_named_thread(move || {
                READS_ON_EXIT.with(|cell| *cell.borrow_mut() = Some(ReadsOnExit(report)));
                if reads_before {
                    drop(EXIT_RCU.read());
                }
            });
            assert_eq!(reports.recv().unwrap(), 7, "the value read at exit");
            assert_eq!(
                given_back,
                (1, 1),
                "slots (taken, given back); read before: {reads_before}"
            );
        }
    }

    /// The destructor of [`READS_AT_KEY_EXIT`]: reads `EXIT_RCU` into
    /// [`READ_AT_KEY_EXIT`].
    extern "C" fn reads_at_key_exit(_: *mut c_void) {
        READ_AT_KEY_EXIT.store(u64::from(*EXIT_RCU.read()), Ordering::Relaxed);
    }

    static READ_AT_KEY_EXIT: AtomicU64 = AtomicU64::new(0);

    /// A key of the C library's thread-specific data whose destructor
    /// reads (`reads_at_key_exit`): made by the first test to use it.
    static READS_AT_KEY_EXIT: OnceLock<libc::pthread_key_t> = OnceLock::new();

    /// A C thread whose first call comes from a key's destructor: glibc has
    /// run the thread-locals' destructors by then, and never runs them
    /// again, so a give-back registered as one would never run (the slot
    /// was kept for good, for every writer to scan).
    #[test]
    fn a_thread_that_reads_in_a_keys_destructor_gives_its_slot_back() {
        let key = *READS_AT_KEY_EXIT.get_or_init(|| {
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: writes the new key to a live local; the destructor is
            // a plain `extern "C" fn` of this program that ignores its
            // argument.
            let created = unsafe { libc::pthread_key_create(&mut key, Some(reads_at_key_exit)) };
            assert_eq!(created, 0, "pthread_key_create");
            key
        });
        for reads_before in [false, true] {
            READ_AT_KEY_EXIT.store(0, Ordering::Relaxed);
            let given_back = on_named_thread(move || {
                // SAFETY: `key` was made by `pthread_key_create` and is
                // never deleted; the value is a marker, never dereferenced.
                let set =
                    unsafe { libc::pthread_setspecific(key, std::ptr::from_ref(&EXIT_RCU).cast()) };
                assert_eq!(set, 0, "pthread_setspecific");
                if reads_before {
                    drop(EXIT_RCU.read());
                }
            });
            assert_eq!(
                READ_AT_KEY_EXIT.load(Ordering::Relaxed),
                7,
                "the value read at exit"
            );
            // Read before: the read in the key's destructor uses that slot,
            // or takes another if the slot went back first (the order of
            // the keys' destructors): every slot taken goes back.
            let (taken, given) = given_back;
            assert!(
                taken >= 1 && taken == given,
                "slots taken {taken}, given back {given} (read before: {reads_before})"
            );
        }
    }

    #[test]
    fn a_section_held_by_a_thread_local_until_the_exit_gives_the_slot_back_once() {
        let given_back = on_named_thread(|| {
            HELD_AT_EXIT.with(|cell| *cell.borrow_mut() = Some(EXIT_RCU.read()));
        });
        assert_eq!(given_back, (1, 1), "slots (taken, given back)");
    }

    /// Where the keys' destructors run before a thread-local that holds a
    /// section is destroyed (an order glibc does not use, others may), the
    /// give-back waits for the section to end.
    #[test]
    fn a_give_back_at_exit_during_a_section_waits_for_the_section_to_end() {
        let given_back = on_named_thread(|| {
            let section = EXIT_RCU.read();
            give_back_at_exit();
            let slot = SLOT
                .with(Cell::get)
                .expect("a slot while the section is open");
            assert!(
                slot.owned.load(Ordering::Relaxed),
                "given back inside the section"
            );
            drop(section);
            assert!(SLOT.with(Cell::get).is_none(), "kept after the section");
        });
        assert_eq!(given_back, (1, 1), "slots (taken, given back)");
    }

    #[test]
    fn a_writer_inside_its_own_section_panics_before_changing_anything() {
        let rcu = Rcu::new(0u8);
        let section = rcu.read();
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rcu.update(|value| *value = 1);
        }))
        .expect_err("an update inside a section of its own thread");
        assert_eq!(
            flex_rt::panic_message(panic.as_ref()),
            "a writer of a read-copy-update value ran inside a read section of its own thread"
        );
        drop(section);
        assert_eq!(*rcu.read(), 0, "the refused update published its value");
    }

    #[test]
    fn a_section_open_the_whole_time_delays_an_update_only_until_it_ends() {
        // A thread that opens sections back to back never lets its count
        // rest at even for long: the writer waits for the section it saw,
        // not for a moment with none open.
        let rcu = Rcu::new(0u64);
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let _outer = rcu.read();
                    let _again = rcu.read();
                }
            });
            for n in 1..=if cfg!(miri) { 5 } else { 200 } {
                rcu.update_and_synchronize(|value| *value = n);
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}

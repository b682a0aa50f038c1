//! The memory of launch payloads, reused per stream.
//!
//! A launch's payload (the callback module's `Payload`; any `T` here) lives
//! in a [`Block`] on the heap from the launch
//! until its completion. If the launching thread allocated every block and
//! a runtime thread freed it, then with glibc, once the runtime thread's
//! cache for that size is full (seven blocks), every free would go back to
//! the launching thread's arena under the arena's lock, which the launching
//! thread's next allocation takes too: the two threads would meet at that
//! lock on every launch (BENCHMARKS.md, the flex library's launch). So a
//! stream's completions hand their blocks back to the stream's
//! [`PayloadCache`], and its next launches take them from there:
//!
//! - a completion (on any runtime thread) pushes its block onto the
//!   cache's `returned` stack with one compare-and-swap;
//! - a launch (under the stream's submission lock, so one at a time) takes
//!   a block from its private [`FreeBlocks`] list; only when that is empty
//!   does it take the whole `returned` stack at once, with one swap, or,
//!   if that is empty too, allocate.
//!
//! Only the swap ever removes blocks from `returned`, one thread at a time,
//! and it removes all of them: a push races only with other pushes and
//! with the swap, so the stack has no ABA problem.
//!
//! The cache is also where a stream's callbacks leave what the stream
//! must know afterwards and the library cannot tell it: the message of the
//! first host callback that panicked ([`PayloadCache::note_host_panic`]),
//! and of the first completion that panicked after its operation
//! succeeded ([`PayloadCache::note_completion_panic`]), with its place
//! among the stream's launches, so that an event recorded behind it fails.
//!
//! A stream keeps as many blocks as it ever had launches in flight at once
//! (one [`Block`] each, about 150 bytes), until it is dropped. Its cache
//! must outlive every completion of its launches, which holds because a
//! stream is dropped only after `flex_stream_destroy` or
//! `flex_runtime_destroy` succeeded, and both wait for every completion to
//! return (`flex.h`); a runtime that is leaked instead (dropped inside its
//! own callback), or whose `flex_runtime_destroy` failed, leaks its
//! streams' caches with it ([`PayloadCache::leak`]). Blocks hold a raw
//! pointer to their cache, not a count: the `Arc` around a cache is there
//! so that it can be leaked from a shared borrow of its stream.

use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
#[cfg(test)]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Whether a completion panic was ever noted in this process
/// ([`PayloadCache::note_completion_panic`]): until then, an event's
/// outcome needs no look at its stream's cache.
static ANY_COMPLETION_PANIC: AtomicBool = AtomicBool::new(false);

/// Whether a completion panic was ever noted in this process: one load.
#[inline]
pub(super) fn any_completion_panic() -> bool {
    ANY_COMPLETION_PANIC.load(Ordering::Acquire)
}

/// Whether the library reports a stream failed (`flex_stream_query`
/// returns an error); called only from a completion of the stream's
/// launches.
pub(super) type FailureProbe = Box<dyn Fn() -> bool + Send + Sync>;

/// The memory of one launch's payload.
pub(super) struct Block<T> {
    /// The next block of the free list the block is on; meaningful only
    /// while it is free.
    next: *mut Block<T>,
    /// Where the block goes once its payload has been taken: the cache of
    /// its stream, or null to free it.
    home: *const PayloadCache<T>,
    /// The payload, from [`Block::fill`] until [`Block::take`].
    payload: MaybeUninit<T>,
}

impl<T> Block<T> {
    /// Moves `payload` into a block: one from `cache` if it has one, else a
    /// new one, which goes back to `cache` when its payload is taken; with
    /// no cache, a new one that is freed then.
    pub(super) fn fill(
        payload: T,
        cache: Option<(&Arc<PayloadCache<T>>, &mut FreeBlocks<T>)>,
    ) -> NonNull<Self> {
        let Some((cache, free)) = cache else {
            return NonNull::from(Box::leak(Box::new(Block {
                next: ptr::null_mut(),
                home: ptr::null(),
                payload: MaybeUninit::new(payload),
            })));
        };
        match free.pop(cache) {
            Some(block) => {
                // SAFETY: a block on a free list is owned by that list (its
                // payload was taken), and `pop` moved it out to this caller;
                // writing the payload makes it full again.
                unsafe { (*block.as_ptr()).payload.write(payload) };
                block
            }
            None => {
                #[cfg(test)]
                cache.made.fetch_add(1, Ordering::SeqCst);
                NonNull::from(Box::leak(Box::new(Block {
                    next: ptr::null_mut(),
                    home: Arc::as_ptr(cache),
                    payload: MaybeUninit::new(payload),
                })))
            }
        }
    }

    /// The address of the payload inside `block`, without making a
    /// reference.
    pub(super) fn payload(block: NonNull<Self>) -> *mut T {
        // SAFETY: `block` points to a live `Block` (every caller holds a
        // filled block); `&raw mut` only computes the field's address.
        unsafe { (&raw mut (*block.as_ptr()).payload).cast() }
    }

    /// The cache `block` goes back to, if it has one; read before
    /// [`Block::take`], after which the block is no longer the caller's.
    ///
    /// # Safety
    /// `block` came from [`Block::fill`] and has not been taken yet; the
    /// cache, if any, stays alive for `'a` (see the module documentation:
    /// until the last completion of its stream's launches has returned).
    pub(super) unsafe fn home<'a>(block: NonNull<Self>) -> Option<&'a PayloadCache<T>> {
        // SAFETY: by the contract the block is live and filled, so its
        // `home` field is initialized and not written by anyone (it is set
        // once, when the block is made); the cache it points to, if not
        // null, lives for `'a`.
        unsafe { (*block.as_ptr()).home.as_ref() }
    }

    /// Moves the payload out of `block` and gives the block back: to its
    /// stream's cache, or to the allocator.
    ///
    /// # Safety
    /// `block` came from [`Block::fill`], this is the one `take` for that
    /// fill, and nothing else uses the block or its payload from here on;
    /// the block's cache, if it has one, is alive.
    pub(super) unsafe fn take(block: NonNull<Self>) -> T {
        let raw = block.as_ptr();
        // SAFETY: by the contract, `raw` is a filled block this call owns:
        // the payload is initialized, and it is read exactly once.
        let (payload, home) = unsafe { ((*raw).payload.assume_init_read(), (*raw).home) };
        if home.is_null() {
            // SAFETY: a block without a home was made by `Box::new` in
            // `fill` and is owned by this call; its payload was moved out,
            // and `MaybeUninit` does not drop it again.
            drop(unsafe { Box::from_raw(raw) });
        } else {
            // SAFETY: the contract keeps the cache alive.
            unsafe { &*home }.push(block);
        }
        payload
    }
}

/// The blocks a stream's completions have handed back; see the module
/// documentation. Shared by the stream and, as a raw pointer, by every
/// block it made.
pub(super) struct PayloadCache<T> {
    /// A stack of free blocks linked by [`Block::next`]; pushed by
    /// completions, emptied whole by [`FreeBlocks::pop`].
    returned: AtomicPtr<Block<T>>,
    /// The message of the stream's first host callback that panicked.
    host_panic: OnceLock<String>,
    /// The error message of the stream's first completion that panicked
    /// after its operation succeeded, and that operation's place among the
    /// stream's launches (0-based).
    completion_panic: OnceLock<(u64, String)>,
    /// Completions of the stream's launches begun so far (flex.h calls a
    /// stream's completions in submission order, so the next one's place
    /// among its launches: see `HardwareStream`'s count of them).
    completions_begun: AtomicU64,
    /// Whether the library reports the stream failed (`None` in tests:
    /// never).
    failed: Option<FailureProbe>,
    /// Blocks allocated for this cache, for tests to see reuse.
    #[cfg(test)]
    made: AtomicUsize,
}

impl<T> PayloadCache<T> {
    pub(super) fn new() -> Self {
        Self {
            returned: AtomicPtr::new(ptr::null_mut()),
            host_panic: OnceLock::new(),
            completion_panic: OnceLock::new(),
            completions_begun: AtomicU64::new(0),
            failed: None,
            #[cfg(test)]
            made: AtomicUsize::new(0),
        }
    }

    /// How many blocks were allocated for this cache so far.
    #[cfg(test)]
    pub(super) fn blocks_made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }

    /// Keeps `message` as the stream's host callback panic, unless one was
    /// kept before: a stream's first error is the one it keeps (`flex.h`),
    /// and no host callback starts on a stream after it has failed. (One
    /// may still be running when a shutdown fails its stream; the stream's
    /// error is then `SHUTDOWN`, which the errors naming the panic leave
    /// alone: see the callback module's `stream_failure`.)
    pub(super) fn note_host_panic(&self, message: &str) {
        self.host_panic.get_or_init(|| message.to_owned());
    }

    /// The message [`PayloadCache::note_host_panic`] kept, if any.
    pub(super) fn host_panic(&self) -> Option<&str> {
        self.host_panic.get().map(String::as_str)
    }

    /// A cache whose stream's failure in the library `failed` tells (see
    /// [`PayloadCache::note_completion_panic`]).
    pub(super) fn with_failure_probe(failed: FailureProbe) -> Self {
        let mut cache = Self::new();
        cache.failed = Some(failed);
        cache
    }

    /// Keeps `message` as the error of a completion that panicked after its
    /// operation succeeded, unless one was kept before, or the library
    /// reports the stream failed already: then its error is the stream's
    /// first (`flex.h` holds the stream while a completion runs, but a
    /// library that delivers completions late may have run, and failed,
    /// later work meanwhile). The library does not know of the panic (a
    /// completion returns nothing), so the stream fails on flex-rt's side:
    /// see `HardwareStream`. Called from the completion of the stream's
    /// launch at `place` ([`PayloadCache::begin_completion`]).
    pub(super) fn note_completion_panic(&self, place: u64, message: String) {
        if self.failed.as_ref().is_some_and(|failed| failed()) {
            return;
        }
        if self.completion_panic.set((place, message)).is_ok() {
            // Release: with the note, before the library moves the stream on.
            ANY_COMPLETION_PANIC.store(true, Ordering::Release);
        }
    }

    /// The message [`PayloadCache::note_completion_panic`] kept, if any.
    pub(super) fn completion_panic(&self) -> Option<&str> {
        self.completion_panic
            .get()
            .map(|(_, message)| message.as_str())
    }

    /// The message [`PayloadCache::note_completion_panic`] kept for one of
    /// the stream's first `launched` launches, if any: an event recorded
    /// after them fails with it. One load while the stream's completions
    /// have not panicked.
    pub(super) fn completion_panic_before(&self, launched: u64) -> Option<&str> {
        self.completion_panic
            .get()
            .filter(|(place, _)| *place < launched)
            .map(|(_, message)| message.as_str())
    }

    /// The place among the stream's launches of the completion beginning
    /// now; call once at the start of each completion of the stream.
    pub(super) fn begin_completion(&self) -> u64 {
        self.completions_begun.fetch_add(1, Ordering::Relaxed)
    }

    /// Pushes a block whose payload has been taken.
    fn push(&self, block: NonNull<Block<T>>) {
        let raw = block.as_ptr();
        let mut head = self.returned.load(Ordering::Relaxed);
        loop {
            // SAFETY: the caller gave up the block; until the push below
            // succeeds nobody else can reach it.
            unsafe { (*raw).next = head };
            // Release: the link, and the caller's read of the payload
            // before it, happen before the launch that takes the block.
            match self.returned.compare_exchange_weak(
                head,
                raw,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Keeps this cache alive for good: for a runtime that is leaked with
    /// completions still to come, which would push into it.
    pub(super) fn leak(cache: &Arc<Self>) {
        std::mem::forget(Arc::clone(cache));
    }
}

impl<T> Drop for PayloadCache<T> {
    fn drop(&mut self) {
        // SAFETY: with `&mut self` no completion can push any more, so the
        // blocks on the stack are owned by it.
        unsafe { free_list(*self.returned.get_mut()) };
    }
}

/// The free blocks a stream's launches take first, under its submission
/// lock.
pub(super) struct FreeBlocks<T> {
    /// A list linked by [`Block::next`].
    head: *mut Block<T>,
}

// SAFETY: the list owns its blocks outright (none is reachable from
// anywhere else), and a block holds no payload while free; moving the list
// to another thread moves that ownership.
unsafe impl<T> Send for FreeBlocks<T> {}

impl<T> FreeBlocks<T> {
    pub(super) fn new() -> Self {
        Self {
            head: ptr::null_mut(),
        }
    }

    /// A free block: the list's first, or, when the list is empty, the
    /// first of everything `cache` has been handed back, the rest of which
    /// become the list.
    fn pop(&mut self, cache: &PayloadCache<T>) -> Option<NonNull<Block<T>>> {
        if self.head.is_null() {
            // Acquire: pairs with the pushes' Release.
            self.head = cache.returned.swap(ptr::null_mut(), Ordering::Acquire);
        }
        let block = NonNull::new(self.head)?;
        // SAFETY: the list owns `block`; its link was written before it was
        // pushed (and the swap acquired it).
        self.head = unsafe { (*block.as_ptr()).next };
        Some(block)
    }
}

impl<T> Drop for FreeBlocks<T> {
    fn drop(&mut self) {
        // SAFETY: the list owns its blocks.
        unsafe { free_list(self.head) };
    }
}

/// Frees every block of a free list.
///
/// # Safety
/// The caller owns the list: every block on it is free (its payload was
/// taken) and reachable from nowhere else.
unsafe fn free_list<T>(mut head: *mut Block<T>) {
    while !head.is_null() {
        // SAFETY: every block was made by `Box::new` in `Block::fill`, and
        // the caller owns it; the payload was moved out, and `MaybeUninit`
        // does not drop it.
        let block = unsafe { Box::from_raw(head) };
        head = block.next;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A payload that counts its drops.
    struct Payload(Arc<AtomicUsize>);

    impl Drop for Payload {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn payload(drops: &Arc<AtomicUsize>) -> Payload {
        Payload(Arc::clone(drops))
    }

    /// A filled block, moved to another thread to be taken there.
    struct Filled(NonNull<Block<Payload>>);

    // SAFETY: a filled block is owned by whoever holds it, and its payload
    // is `Send`; the test hands it to exactly one thread.
    unsafe impl Send for Filled {}

    /// The blocks on the cache's stack, top first.
    fn returned(cache: &PayloadCache<Payload>) -> Vec<NonNull<Block<Payload>>> {
        let mut blocks = Vec::new();
        let mut at = cache.returned.load(Ordering::SeqCst);
        while let Some(block) = NonNull::new(at) {
            blocks.push(block);
            // SAFETY: blocks on the stack are free and owned by the cache,
            // which this test does not change meanwhile.
            at = unsafe { (*at).next };
        }
        blocks
    }

    #[test]
    fn a_block_given_back_is_the_next_one_filled() {
        let drops = Arc::new(AtomicUsize::new(0));
        let cache = Arc::new(PayloadCache::new());
        let mut free = FreeBlocks::new();
        let a = Block::fill(payload(&drops), Some((&cache, &mut free)));
        let b = Block::fill(payload(&drops), Some((&cache, &mut free)));
        assert_ne!(a, b);
        assert_eq!(cache.blocks_made(), 2);
        // SAFETY: `a` was filled above and is taken once.
        drop(unsafe { Block::take(a) });
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the payload moved out");
        assert_eq!(returned(&cache), [a], "the block went back to its cache");
        let c = Block::fill(payload(&drops), Some((&cache, &mut free)));
        assert_eq!(c, a, "the block given back is reused");
        assert_eq!(cache.blocks_made(), 2, "no block was allocated");
        assert!(returned(&cache).is_empty() && free.head.is_null());
        // SAFETY: each was filled above and is taken once.
        unsafe {
            drop(Block::take(b));
            drop(Block::take(c));
        }
        assert_eq!(
            returned(&cache),
            [c, b],
            "a stack: the last given back on top"
        );
        let refilled: HashSet<_> = (0..2)
            .map(|_| Block::fill(payload(&drops), Some((&cache, &mut free))))
            .collect();
        assert_eq!(refilled, HashSet::from([a, b]));
        assert_eq!(cache.blocks_made(), 2);
        let fresh = Block::fill(payload(&drops), Some((&cache, &mut free)));
        assert_eq!(
            cache.blocks_made(),
            3,
            "a third block in flight is a new one"
        );
        for block in refilled.into_iter().chain([fresh]) {
            // SAFETY: each was filled above and is taken once.
            drop(unsafe { Block::take(block) });
        }
        assert_eq!(
            drops.load(Ordering::SeqCst),
            6,
            "every payload dropped once"
        );
    }

    #[test]
    fn a_blocks_home_is_its_cache_and_keeps_the_first_host_panic() {
        let drops = Arc::new(AtomicUsize::new(0));
        let cache = Arc::new(PayloadCache::new());
        let mut free = FreeBlocks::new();
        let cached = Block::fill(payload(&drops), Some((&cache, &mut free)));
        let uncached = Block::fill(payload(&drops), None);
        // SAFETY: both were filled above and not taken yet; `cache` lives
        // to the end of the test.
        let (home, none) = unsafe { (Block::home(cached), Block::home(uncached)) };
        assert!(home.is_some_and(|home| ptr::eq(home, Arc::as_ptr(&cache))));
        assert!(none.is_none(), "a block without a cache has no home");
        assert_eq!(cache.host_panic(), None);
        cache.note_host_panic("first");
        cache.note_host_panic("second");
        assert_eq!(cache.host_panic(), Some("first"), "the first is kept");
        // SAFETY: each was filled above and is taken once.
        unsafe {
            drop(Block::take(cached));
            drop(Block::take(uncached));
        }
    }

    #[test]
    fn blocks_given_back_by_several_threads_are_each_reused_once() {
        const BLOCKS: usize = 16;
        let drops = Arc::new(AtomicUsize::new(0));
        let cache = Arc::new(PayloadCache::new());
        let mut free = FreeBlocks::new();
        let blocks: Vec<NonNull<Block<Payload>>> = (0..BLOCKS)
            .map(|_| Block::fill(payload(&drops), Some((&cache, &mut free))))
            .collect();
        std::thread::scope(|scope| {
            for chunk in blocks.chunks(BLOCKS / 4) {
                let chunk: Vec<Filled> = chunk.iter().map(|&block| Filled(block)).collect();
                scope.spawn(move || {
                    for Filled(block) in chunk {
                        // SAFETY: each block was filled above and is taken
                        // once, by the one thread it was moved to.
                        drop(unsafe { Block::take(block) });
                    }
                });
            }
        });
        assert_eq!(drops.load(Ordering::SeqCst), BLOCKS);
        let on_stack: HashSet<_> = returned(&cache).into_iter().collect();
        let all: HashSet<_> = blocks.iter().copied().collect();
        assert_eq!(on_stack, all, "every block is on the stack once");
        let refilled: HashSet<_> = (0..BLOCKS)
            .map(|_| Block::fill(payload(&drops), Some((&cache, &mut free))))
            .collect();
        assert_eq!(refilled, all);
        assert_eq!(cache.blocks_made(), BLOCKS);
        for block in refilled {
            // SAFETY: each was filled above and is taken once.
            drop(unsafe { Block::take(block) });
        }
        assert_eq!(drops.load(Ordering::SeqCst), 2 * BLOCKS);
    }

    #[test]
    fn launches_refill_while_a_completion_thread_gives_blocks_back() {
        // A launching thread fills blocks and hands them, through a channel
        // of 4, to a completion thread that takes them, while it keeps
        // filling: pushes race the launching thread's swaps. At most 6
        // blocks are in flight at once (4 in the channel, 1 being taken, 1
        // just filled), so reuse keeps the cache at 6 blocks at most.
        const LAUNCHES: usize = if cfg!(miri) { 200 } else { 20_000 };
        let drops = Arc::new(AtomicUsize::new(0));
        let cache = Arc::new(PayloadCache::new());
        let mut free = FreeBlocks::new();
        let (sender, receiver) = std::sync::mpsc::sync_channel::<Filled>(4);
        std::thread::scope(|scope| {
            scope.spawn(move || {
                for Filled(block) in receiver {
                    // SAFETY: each block was filled by the launching thread
                    // and moved here to be taken once.
                    drop(unsafe { Block::take(block) });
                }
            });
            for _ in 0..LAUNCHES {
                let block = Block::fill(payload(&drops), Some((&cache, &mut free)));
                sender.send(Filled(block)).unwrap();
            }
            drop(sender);
        });
        assert_eq!(drops.load(Ordering::SeqCst), LAUNCHES);
        let made = cache.blocks_made();
        assert!(
            (1..=6).contains(&made),
            "{made} blocks for at most 6 in flight"
        );
    }

    #[test]
    fn a_block_without_a_cache_is_freed_when_taken() {
        let drops = Arc::new(AtomicUsize::new(0));
        let block = Block::fill(payload(&drops), None);
        // SAFETY: filled above, taken once.
        let payload = unsafe { Block::take(block) };
        assert_eq!(
            drops.load(Ordering::SeqCst),
            0,
            "the payload is moved out, not dropped"
        );
        drop(payload);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}

//! Pipeline barriers for memory reused on its own stream.
//!
//! The caching allocator hands a block freed on a stream to the next
//! allocation on that stream at once (work enqueued later on a stream runs
//! after work enqueued earlier). flex.h's `STRICT_ORDERING` promises only
//! that a stream's operations start and finish in order, and its launches'
//! `pipeline_barrier` ("start only after every operation enqueued before it
//! on the stream has completed, with no overlap of pipeline stages") says
//! that a card may overlap an operation with the ones before it. On such a
//! card the new owner's first operation could run beside the previous
//! owner's last one, on the same bytes. So a block taken from a stream's
//! cache *requests* a barrier on that stream, and the next launch through
//! [`crate::SpyreStream`]'s launch calls, whoever makes it, carries
//! `pipeline_barrier` and so *covers* the request. The software device runs
//! one operation of a stream at a time, where a barrier changes nothing.
//!
//! One covering launch is enough for every operation after it: it starts
//! after everything enqueued before it has completed, the previous owner's
//! work among it (enqueued before the block was freed, so before the
//! request), and any later operation starts after it.
//!
//! Per stream slot, one word: the requests made (high half) and the
//! requests covered (low half), each counting modulo 2³². A launch that
//! finds them different sets the barrier, and once the launch has been
//! enqueued, writes the count it saw as covered, only if the word is still
//! what it saw. A request made meanwhile changes the word, so the write
//! fails and the request stays for the next launch (which sets a barrier
//! again: at worst one more than needed per launch made at the same time,
//! never one fewer, short of 2³² requests and as many covers made while
//! one launch is between its look and its write, bringing the word back
//! to what it saw). A request that would bring the count of requests
//! round to the count covered (2³² of them with no launch between) counts
//! twice, so that pending requests never read as covered. A thread that
//! finds the word covered has seen, through that write (release, then its
//! acquire load), that the covering launch was enqueued: its own operation
//! comes after it on the stream.
//!
//! Launches through a raw handle ([`crate::StreamPool::resolve`],
//! [`crate::default_stream_handle`]) and record and wait operations
//! neither carry nor cover a request.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::id::MAX_STREAM_SLOTS;
use crate::stream::SpyreStream;

/// The low half of a word, where the requests covered are counted.
const LOW_HALF: u64 = u32::MAX as u64;
/// One request, added to the high half.
const ONE_REQUEST: u64 = 1 << 32;

/// The barrier requests of one device's streams, one word per stream id.
///
/// Thread-safety: `Sync`; requests and launches may race freely (the
/// module docs argue the protocol).
pub(crate) struct ReuseBarriers {
    words: [AtomicU64; MAX_STREAM_SLOTS],
}

/// A request a launch is about to cover: the word as the launch saw it.
#[must_use = "cover the request once the launch has been enqueued"]
pub(crate) struct Uncovered<'a> {
    word: &'a AtomicU64,
    seen: u64,
}

impl ReuseBarriers {
    /// No request on any stream.
    pub(crate) fn new() -> Self {
        Self {
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Asks that the next launch on `stream` carry a pipeline barrier: a
    /// block has just been taken from its cache for a new owner. Ids with
    /// no slot (none the pool hands out) are ignored.
    pub(crate) fn request(&self, stream: SpyreStream) {
        if let Some(word) = stream.id().slot().map(|slot| &self.words[slot]) {
            let _ = word.fetch_update(Ordering::Release, Ordering::Relaxed, |seen| {
                let next = seen.wrapping_add(ONE_REQUEST);
                // Never equal counts while requests are pending.
                Some(if next >> 32 == next & LOW_HALF {
                    next.wrapping_add(ONE_REQUEST)
                } else {
                    next
                })
            });
        }
    }

    /// The request a launch on `stream` must carry a barrier for, if any:
    /// one acquire load.
    #[inline]
    pub(crate) fn uncovered(&self, stream: SpyreStream) -> Option<Uncovered<'_>> {
        let word = &self.words[stream.id().slot()?];
        let seen = word.load(Ordering::Acquire);
        (seen >> 32 != seen & LOW_HALF).then_some(Uncovered { word, seen })
    }
}

impl Uncovered<'_> {
    /// Marks the requests seen as covered, after the launch that carried
    /// the barrier was enqueued. Not called when the launch failed: the
    /// request stays for the next one.
    pub(crate) fn cover(self) {
        let covered = (self.seen & !LOW_HALF) | (self.seen >> 32);
        // Failure means the word changed: a new request (which must stay)
        // or another launch's cover of at least as much.
        let _ = self
            .word
            .compare_exchange(self.seen, covered, Ordering::AcqRel, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::StreamId;

    fn stream(id: i64) -> SpyreStream {
        SpyreStream::from_parts(0, StreamId(id))
    }

    #[test]
    fn a_request_is_carried_by_the_next_launch_only() {
        let barriers = ReuseBarriers::new();
        assert!(barriers.uncovered(stream(3)).is_none());
        barriers.request(stream(3));
        assert!(barriers.uncovered(stream(4)).is_none(), "other streams");
        barriers.uncovered(stream(3)).expect("requested").cover();
        assert!(barriers.uncovered(stream(3)).is_none());
    }

    #[test]
    fn a_request_made_during_a_covering_launch_stays() {
        let barriers = ReuseBarriers::new();
        barriers.request(stream(2));
        let launching = barriers.uncovered(stream(2)).expect("requested");
        barriers.request(stream(2));
        launching.cover();
        barriers
            .uncovered(stream(2))
            .expect("the second request")
            .cover();
        assert!(barriers.uncovered(stream(2)).is_none());
    }

    #[test]
    fn two_launches_covering_the_same_request_leave_it_covered() {
        let barriers = ReuseBarriers::new();
        barriers.request(stream(5));
        barriers.request(stream(5));
        let (first, second) = (
            barriers.uncovered(stream(5)).expect("requested"),
            barriers.uncovered(stream(5)).expect("requested"),
        );
        second.cover();
        first.cover();
        assert!(barriers.uncovered(stream(5)).is_none());
    }

    #[test]
    fn the_counts_wrap() {
        let barriers = ReuseBarriers::new();
        let word = &barriers.words[6];
        word.store(LOW_HALF << 32 | LOW_HALF, Ordering::Relaxed);
        barriers.request(stream(6));
        assert_eq!(
            word.load(Ordering::Relaxed) >> 32,
            0,
            "the high half wrapped"
        );
        barriers.uncovered(stream(6)).expect("requested").cover();
        assert!(barriers.uncovered(stream(6)).is_none());
    }

    /// 2³² - 1 requests pending, the most the counts can tell apart: one
    /// more must not make them read as covered.
    #[test]
    fn pending_requests_never_wrap_round_to_covered() {
        let barriers = ReuseBarriers::new();
        let word = &barriers.words[8];
        word.store(4 << 32 | 5, Ordering::Relaxed);
        assert!(barriers.uncovered(stream(8)).is_some());
        barriers.request(stream(8));
        assert!(barriers.uncovered(stream(8)).is_some(), "still pending");
        barriers.uncovered(stream(8)).expect("pending").cover();
        assert!(barriers.uncovered(stream(8)).is_none());
    }

    /// One step of a thread in [`every_interleaving_puts_a_barrier_between_the_owners`].
    #[derive(Clone, Copy, Debug)]
    enum Step {
        /// The chokepoint's look for a request.
        Look,
        /// The launch of operation `n`, in the stream's submission order,
        /// with a barrier if the look found a request.
        Enqueue(u8),
        /// The cover of what the look found, after the launch.
        Cover,
        /// A block reused on the stream.
        Request,
    }

    /// Two threads each enqueue an operation of a block's owner, reuse
    /// the block (the request) and enqueue the new owner's operation on
    /// one stream, each launch as the chokepoint makes it (look, enqueue,
    /// cover). In every one of the 3 432 interleavings of their steps,
    /// each new owner's operation is behind a barrier set at or after it
    /// was enqueued, after its previous owner's.
    #[test]
    #[cfg_attr(miri, ignore = "3 432 schedules of safe code, about 100 s under Miri")]
    fn every_interleaving_puts_a_barrier_between_the_owners() {
        use Step::{Cover, Enqueue, Look, Request};
        let programs = [
            [Look, Enqueue(1), Cover, Request, Look, Enqueue(2), Cover],
            [Look, Enqueue(3), Cover, Request, Look, Enqueue(4), Cover],
        ];
        // Bit i of a schedule: which thread takes step i.
        let schedules: Vec<u32> = (0..1 << 14).filter(|s: &u32| s.count_ones() == 7).collect();
        assert_eq!(schedules.len(), 3432, "14 choose 7");
        for schedule in schedules {
            let barriers = ReuseBarriers::new();
            let mut next = [0; 2];
            let mut looked: [Option<Uncovered<'_>>; 2] = [None, None];
            let mut log = Vec::new();
            for thread in (0..14).map(|i| (schedule >> i & 1) as usize) {
                match programs[thread][next[thread]] {
                    Look => looked[thread] = barriers.uncovered(stream(9)),
                    Enqueue(op) => log.push((op, looked[thread].is_some())),
                    Cover => {
                        if let Some(found) = looked[thread].take() {
                            found.cover();
                        }
                    }
                    Request => barriers.request(stream(9)),
                }
                next[thread] += 1;
            }
            let place = |op| log.iter().position(|&(o, _)| o == op).expect("enqueued");
            for (old, new) in [(1, 2), (3, 4)] {
                assert!(
                    log[place(old) + 1..=place(new)]
                        .iter()
                        .any(|&(_, barrier)| barrier),
                    "no barrier between {old} and {new}: {log:?}"
                );
            }
        }
    }
}

//! The ready order: which ready stream an engine takes next.
//!
//! Engines take the ready stream with the highest priority, and among
//! those the one whose front operation was enqueued first
//! ([`crate::scheduler`]). Both go into one `u64` key, so that ordering two
//! streams is one comparison: the top bit is the priority, the rest the
//! complement of the front operation's place in the runtime-wide enqueue
//! order, so the greatest key is taken first.
//!
//! The stream an engine has just finished is most often ready again at
//! once, and the engine then takes the next stream. So the set keeps the
//! latest stream made ready beside its heap: taking it back costs no heap
//! operation, and taking another in its place costs one sift of the heap
//! instead of the two of a push and a pop.
use std::collections::BinaryHeap;

use flex_rt::StreamPriority;

/// The greatest place in the enqueue order a key can hold: the top bit is
/// the priority's. A runtime would need 2^63 launches to pass it; past
/// it, streams of one priority would tie and go by their index.
const MAX_SEQ: u64 = u64::MAX >> 1;

/// One ready stream: its key, then its index (which never decides, as no
/// two ready streams have the same front operation).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    key: u64,
    stream: usize,
}

impl Entry {
    fn new(priority: StreamPriority, seq: u64, stream: usize) -> Self {
        debug_assert!(seq <= MAX_SEQ, "enqueue order {seq} past {MAX_SEQ}");
        let rank = match priority {
            StreamPriority::Normal => 0,
            StreamPriority::High => 1 << 63,
        };
        Self {
            key: rank | (MAX_SEQ - seq.min(MAX_SEQ)),
            stream,
        }
    }
}

/// The ready streams of one runtime, taken in the ready order.
#[derive(Debug, Default)]
pub(crate) struct ReadySet {
    heap: BinaryHeap<Entry>,
    /// The stream made ready last, when it has not gone into the heap.
    latest: Option<Entry>,
}

impl ReadySet {
    /// Whether no stream is ready.
    pub(crate) fn is_empty(&self) -> bool {
        self.latest.is_none() && self.heap.is_empty()
    }

    /// Adds stream `stream` of `priority`, whose front operation is the
    /// `seq`th of the runtime-wide enqueue order. A stream must not be
    /// added again before it is taken.
    pub(crate) fn push(&mut self, priority: StreamPriority, seq: u64, stream: usize) {
        let entry = Entry::new(priority, seq, stream);
        if let Some(earlier) = self.latest.replace(entry) {
            self.heap.push(earlier);
        }
    }

    /// Takes the stream that comes first in the ready order, if any.
    pub(crate) fn pop(&mut self) -> Option<usize> {
        let Some(latest) = self.latest.take() else {
            return self.heap.pop().map(|entry| entry.stream);
        };
        let first = match self.heap.peek_mut() {
            // The heap's first goes ahead: the latest takes its place,
            // sifted down as the handle drops.
            Some(mut top) if *top > latest => std::mem::replace(&mut *top, latest),
            _ => latest,
        };
        Some(first.stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use StreamPriority::{High, Normal};

    fn drain(set: &mut ReadySet) -> Vec<usize> {
        std::iter::from_fn(|| set.pop()).collect()
    }

    #[test]
    fn high_priority_first_then_the_oldest_front_operation() {
        let mut set = ReadySet::default();
        set.push(Normal, 7, 0);
        set.push(High, 9, 1);
        set.push(Normal, 3, 2);
        set.push(High, 4, 3);
        assert_eq!(drain(&mut set), [3, 1, 2, 0]);
        assert!(set.is_empty());
    }

    #[test]
    fn the_latest_stream_is_taken_in_its_place_whether_it_is_first_or_not() {
        let mut set = ReadySet::default();
        set.push(Normal, 5, 0);
        set.push(Normal, 6, 1);
        // Older than both: taken back without the heap.
        set.push(Normal, 2, 2);
        assert_eq!(set.pop(), Some(2));
        // Younger than both: the heap's first goes, it stays.
        set.push(Normal, 10, 3);
        assert_eq!(set.pop(), Some(0));
        assert!(!set.is_empty());
        set.push(High, 11, 4);
        assert_eq!(drain(&mut set), [4, 1, 3]);
    }

    #[test]
    fn round_robin_streams_come_back_in_enqueue_order() {
        // Eight streams with operations enqueued round robin: each taken
        // stream is ready again with its next operation, eight places on.
        let mut set = ReadySet::default();
        for stream in 0..8 {
            set.push(Normal, stream as u64, stream);
        }
        let mut order = Vec::new();
        for seq in 0..64 {
            let stream = set.pop().unwrap();
            order.push(stream);
            set.push(Normal, seq + 8, stream);
        }
        let expected: Vec<usize> = (0..64).map(|seq| seq % 8).collect();
        assert_eq!(order, expected);
    }

    #[test]
    fn the_last_places_of_the_enqueue_order_still_sort() {
        let mut set = ReadySet::default();
        set.push(Normal, MAX_SEQ, 0);
        set.push(Normal, MAX_SEQ - 1, 1);
        set.push(High, MAX_SEQ, 2);
        set.push(Normal, 0, 3);
        assert_eq!(drain(&mut set), [2, 3, 1, 0]);
    }
}

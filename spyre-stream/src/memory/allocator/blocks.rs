//! The caching allocator's table of blocks: the segments it holds, cut
//! into blocks; the cached blocks, ordered for best fit; the recent
//! blocks; the blocks freed in other streams' order; and the statistics.
//! Bookkeeping only: it calls no runtime but to query the fences of
//! deferred blocks ([`Fence::passed`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use flex_rt::CompositeAddress;

use super::fence::{Fence, Waited};
use super::sizing::{Pool, lies_in_one_chunk, should_split};
use crate::error::Result;
use crate::stream::SpyreStream;

/// The memory statistics of one device's caching allocator (PyTorch's
/// `torch.cuda.memory_stats`, in its main counters), in bytes and counts
/// since the runtime started. Blocks count at their rounded size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Bytes of blocks held by live buffers (`allocated_bytes.all.current`;
    /// `torch.cuda.memory_allocated`).
    pub allocated_bytes: u64,
    /// The most `allocated_bytes` has been since the start or the last
    /// [`crate::reset_peak_memory_stats`] (`max_memory_allocated`).
    pub peak_allocated_bytes: u64,
    /// Bytes the allocator holds from the device, in use or cached
    /// (`reserved_bytes.all.current`; `torch.cuda.memory_reserved`).
    pub reserved_bytes: u64,
    /// The most `reserved_bytes` has been (`max_memory_reserved`).
    pub peak_reserved_bytes: u64,
    /// Bytes the live buffers asked for, before rounding
    /// (`requested_bytes.all.current`).
    pub requested_bytes: u64,
    /// Buffers allocated (`allocation.all.allocated`).
    pub allocations: u64,
    /// Buffers dropped (`allocation.all.freed`).
    pub frees: u64,
    /// Blocks waiting for other streams before they are cached again.
    pub pending_frees: u64,
    /// Allocations the runtime made for the allocator
    /// (`num_device_alloc`).
    pub device_allocations: u64,
    /// Frees the runtime made for the allocator (`num_device_free`).
    pub device_frees: u64,
    /// Allocations that found the device full, emptied the cache and tried
    /// again (`num_alloc_retries`).
    pub alloc_retries: u64,
    /// Allocations that failed for lack of memory (`num_ooms`).
    pub out_of_memory: u64,
}

/// How many blocks freed on their own stream are kept unmerged, for the
/// next allocations of the same size there.
pub(super) const RECENT_BLOCKS: usize = 16;

/// A block handed out to a buffer.
#[derive(Debug)]
pub(crate) struct Block {
    /// The block's memory: `requested` bytes from the block's start.
    pub(crate) address: CompositeAddress,
    /// The stream whose segment the block is in.
    pub(super) stream: i64,
    pub(super) segment: u64,
    pub(super) offset: u64,
    /// Rounded size, the bytes the block takes in its segment.
    pub(super) size: u64,
    /// Bytes asked for.
    pub(super) requested: u64,
    /// The stream the block was lent to, when it is not the segment's own
    /// ([`CachingAllocator::lend_block`](super::CachingAllocator::lend_block)): its free waits for that stream.
    pub(super) lent_to: Option<SpyreStream>,
    /// Its segment's pool (kept here so that taking the block back as a
    /// recent one looks up no segment).
    pub(super) pool: Pool,
    /// Whether all `size` bytes lie in one chunk of the segment (then so
    /// does any request it serves; kept for the same reason).
    pub(super) one_chunk: bool,
}

/// A block freed in other streams' order, not yet cached.
pub(super) struct Deferred {
    pub(super) segment: u64,
    pub(super) offset: u64,
    /// The allocator's free count ([`MemoryStats::frees`]) at its free:
    /// its fences are at points enqueued before that count was reached.
    pub(super) freed: u64,
    pub(super) fences: Vec<Fence>,
}

/// One device allocation, cut into blocks.
pub(super) struct Segment {
    pub(super) address: CompositeAddress,
    pub(super) stream: i64,
    /// The pool of the request it was taken for: its blocks serve only
    /// requests of that pool, but on a full device (see the module docs).
    pub(super) pool: Pool,
    /// The allocator's free count ([`MemoryStats::frees`], which only
    /// grows) at the latest free of one of its blocks (0: none yet): work
    /// that used a block was enqueued before that free.
    pub(super) last_free: u64,
    /// Kept for the waiting retry under way, wholly free when it began to
    /// wait ([`CachingAllocator::retry_segment`](super::CachingAllocator::retry_segment)): no other return gives it
    /// back to the device meanwhile; its own stream may still use it.
    pub(super) held: bool,
    /// Every block of the segment by offset: its size and whether it is free
    /// (and cached).
    pub(super) blocks: BTreeMap<u64, Span>,
}

impl Segment {
    /// Whether the segment is one free block (it can go back to the
    /// device).
    pub(super) fn is_wholly_free(&self) -> bool {
        self.blocks.len() == 1 && self.blocks.values().all(|span| span.free)
    }
}

#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) size: u64,
    pub(super) free: bool,
}

/// A cached block, ordered for best fit: by stream, then size.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct FreeKey {
    pub(super) stream: i64,
    pub(super) size: u64,
    pub(super) segment: u64,
    pub(super) offset: u64,
}

/// The segments the allocator holds, by id. Ids are never reused (a
/// deferred block names its segment by id); a segment returned to the
/// device leaves the map, so the map, and every look over it, is as large
/// as the memory held, however many segments came and went before.
#[derive(Default)]
pub(super) struct Segments {
    pub(super) by_id: BTreeMap<u64, Segment>,
    pub(super) next_id: u64,
}

impl Segments {
    pub(super) fn get(&self, id: u64) -> Option<&Segment> {
        self.by_id.get(&id)
    }

    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut Segment> {
        self.by_id.get_mut(&id)
    }

    /// Adds `segment` under a fresh id.
    pub(super) fn push(&mut self, segment: Segment) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.by_id.insert(id, segment);
        id
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<Segment> {
        self.by_id.remove(&id)
    }

    /// Puts back a segment [`Segments::remove`] took.
    pub(super) fn restore(&mut self, id: u64, segment: Segment) {
        self.by_id.insert(id, segment);
    }

    /// Whether the `len` bytes at `offset` of segment `id` lie in one of its
    /// chunks (`false` for a segment not in the table).
    pub(super) fn lie_in_one_chunk(&self, id: u64, offset: u64, len: u64) -> bool {
        self.get(id)
            .is_some_and(|segment| lies_in_one_chunk(&segment.address, offset, len))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Segment)> {
        self.by_id.iter().map(|(&id, segment)| (id, segment))
    }

    /// Marks every wholly free segment held ([`Segment::held`]); merge the
    /// recent blocks first. Returns their streams.
    pub(super) fn hold_wholly_free(&mut self) -> BTreeSet<i64> {
        self.by_id
            .values_mut()
            .filter(|segment| segment.is_wholly_free())
            .map(|segment| {
                segment.held = true;
                segment.stream
            })
            .collect()
    }

    /// Ends every hold ([`Segment::held`]).
    pub(super) fn release_held(&mut self) {
        for segment in self.by_id.values_mut() {
            segment.held = false;
        }
    }

    /// How many segments are held.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) segments: Segments,
    pub(super) free: BTreeSet<FreeKey>,
    /// Blocks freed on their own stream, oldest first, still marked in use
    /// in their segments: cached, but not yet merged.
    pub(super) recent: VecDeque<Block>,
    pub(super) deferred: Vec<Deferred>,
    pub(super) stats: MemoryStats,
    /// Segments between the device and `segments`: allocated and not yet
    /// added, or taken out to go back to the device and not yet freed (or
    /// put back). Still the allocator's for [`CachingAllocator::free_raw`](super::CachingAllocator::free_raw).
    pub(super) in_transit: Vec<CompositeAddress>,
}

/// Which cached blocks of a stream [`State::take_cached`] looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Serving {
    /// Those of segments of this pool.
    Pool(Pool),
    /// Those of either pool in segments that are not one free block (a
    /// full device's first step: a segment wholly free goes back to the
    /// device instead, whatever its pool).
    SegmentsInUse,
    /// Any (a full device's last resort).
    Any,
}

/// Whether a block or segment that fits one region is taken in several
/// chunks: by [`CachingAllocator::allocate_segment`](super::CachingAllocator::allocate_segment) and
/// [`State::take_cached`]; [`State::lendable`] prefers one chunk with
/// [`Pieces::Refuse`] but still lends one in several.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Pieces {
    /// No: the cache is returned first (its segments fragment the memory).
    Refuse,
    /// Yes: a buffer in several chunks still serves copies and fills.
    Accept,
}

impl State {
    /// Caches again every deferred block whose streams have all passed the
    /// point of its drop. Each block stays listed until it is cached: a
    /// panic out of a fence's query (the runtime's) loses none.
    pub(super) fn collect_deferred(&mut self) {
        let mut at = 0;
        while at < self.deferred.len() {
            if self.deferred[at].fences.iter().all(Fence::passed) {
                let entry = self.deferred.remove(at);
                self.stats.pending_frees -= 1;
                self.release(entry.segment, entry.offset);
            } else {
                at += 1;
            }
        }
    }

    /// The newest recent block of `stream` that serves `rounded` bytes
    /// without a split (the block [`State::take`] would hand out whole).
    /// With [`Pieces::Refuse`], only a block whose front `rounded` bytes
    /// lie in one chunk.
    pub(super) fn take_recent(
        &mut self,
        stream: i64,
        rounded: u64,
        requested: u64,
        pieces: Pieces,
    ) -> Result<Option<Block>> {
        let segments = &self.segments;
        let pool = Pool::of(rounded);
        let Some(index) = self.recent.iter().rposition(|block| {
            block.stream == stream
                && block.pool == pool
                && block.size >= rounded
                && !should_split(rounded, block.size - rounded)
                && (pieces == Pieces::Accept
                    || block.one_chunk
                    || segments.lie_in_one_chunk(block.segment, block.offset, rounded))
        }) else {
            return Ok(None);
        };
        let mut block = self.recent.remove(index).expect("found above");
        if block.requested != requested {
            let segment = self
                .segments
                .get_mut(block.segment)
                .expect("a recent block's segment exists");
            // As in `take`: a block that cannot be sliced stays out of the
            // cache.
            block.address = segment.address.slice(block.offset, requested)?;
            block.requested = requested;
        }
        self.count_allocation(block.size, requested);
        Ok(Some(block))
    }

    /// Keeps `block`, freed on its own stream, among the recent blocks,
    /// merging the oldest one when there are [`RECENT_BLOCKS`].
    pub(super) fn keep_recent(&mut self, block: Block) {
        if self.recent.len() == RECENT_BLOCKS
            && let Some(oldest) = self.recent.pop_front()
        {
            self.release(oldest.segment, oldest.offset);
        }
        self.recent.push_back(block);
    }

    /// Merges the recent blocks of `stream` (of every stream for `None`)
    /// into the cache.
    pub(super) fn merge_recent(&mut self, stream: Option<i64>) {
        let mut index = 0;
        while index < self.recent.len() {
            if stream.is_none_or(|stream| self.recent[index].stream == stream) {
                let block = self.recent.remove(index).expect("in range");
                self.release(block.segment, block.offset);
            } else {
                index += 1;
            }
        }
    }

    /// Counts a block of `size` bytes handed out for `requested`.
    pub(super) fn count_allocation(&mut self, size: u64, requested: u64) {
        self.stats.allocated_bytes += size;
        self.stats.peak_allocated_bytes = self
            .stats
            .peak_allocated_bytes
            .max(self.stats.allocated_bytes);
        self.stats.requested_bytes += requested;
        self.stats.allocations += 1;
    }

    /// The best-fitting cached block of `stream` for `rounded` bytes among
    /// those `serving` names; with [`Pieces::Refuse`], the best fitting
    /// whose front `rounded` bytes lie in one chunk of its segment.
    pub(super) fn take_cached(
        &mut self,
        stream: i64,
        rounded: u64,
        requested: u64,
        pieces: Pieces,
        serving: Serving,
    ) -> Result<Option<Block>> {
        let probe = FreeKey {
            stream,
            size: rounded,
            segment: 0,
            offset: 0,
        };
        let found = self
            .free
            .range(probe..)
            .take_while(|key| key.stream == stream)
            .filter(|key| {
                self.segments
                    .get(key.segment)
                    .is_some_and(|segment| match serving {
                        Serving::Pool(pool) => segment.pool == pool,
                        Serving::SegmentsInUse => !segment.is_wholly_free(),
                        Serving::Any => true,
                    })
            })
            .find(|key| {
                pieces == Pieces::Accept
                    || self
                        .segments
                        .lie_in_one_chunk(key.segment, key.offset, rounded)
            })
            .copied();
        found
            .map(|found| self.take(found, rounded, requested))
            .transpose()
    }

    /// The cached block [`CachingAllocator::lend_block`](super::CachingAllocator::lend_block) would lend for
    /// `rounded` bytes to stream `borrower`: the smallest one large enough
    /// of a stream other than `borrower` and those in `passed_over`,
    /// outside the segments held for a waiting retry; where `pieces`
    /// refuses several chunks, one whose front `rounded` bytes lie in one
    /// chunk first, and with `one_chunk_only` no other.
    pub(super) fn lendable(
        &self,
        borrower: i64,
        rounded: u64,
        pieces: Pieces,
        one_chunk_only: bool,
        passed_over: &BTreeSet<i64>,
    ) -> Option<FreeKey> {
        self.free
            .iter()
            .filter(|key| {
                key.stream != borrower && key.size >= rounded && !passed_over.contains(&key.stream)
            })
            .filter(|key| {
                self.segments
                    .get(key.segment)
                    .is_some_and(|segment| !segment.held)
            })
            .map(|key| {
                let pieced = pieces == Pieces::Refuse
                    && !self
                        .segments
                        .lie_in_one_chunk(key.segment, key.offset, rounded);
                (pieced, key.size, *key)
            })
            .filter(|&(pieced, _, _)| !(one_chunk_only && pieced))
            .min()
            .map(|(_, _, key)| key)
    }

    /// Takes the cached block `found` out of the cache, whole, marked in
    /// use in its segment: no allocation takes it and no free merges with
    /// it until [`State::hand_out`] hands it out or [`State::release`]
    /// caches it again.
    pub(super) fn set_aside(&mut self, found: FreeKey) {
        self.free.remove(&found);
        if let Some(segment) = self.segments.get_mut(found.segment) {
            segment.blocks.insert(
                found.offset,
                Span {
                    size: found.size,
                    free: false,
                },
            );
        }
    }

    /// The largest cached block: free, or waiting for other streams.
    pub(super) fn largest_cached(&self) -> u64 {
        let free = self.free.iter().map(|key| key.size);
        let deferred = self.deferred.iter().filter_map(|entry| {
            let segment = self.segments.get(entry.segment)?;
            Some(segment.blocks.get(&entry.offset)?.size)
        });
        free.chain(deferred).max().unwrap_or(0)
    }

    /// The streams deferred blocks wait for (to pass their event, or to
    /// be idle), and the streams owning their segments.
    pub(super) fn pending_free_streams(&self) -> BTreeSet<i64> {
        let fences =
            self.deferred
                .iter()
                .flat_map(|entry| &entry.fences)
                .map(|fence| match fence {
                    Fence::Event { stream, .. } | Fence::Idle(stream) => stream.id().get(),
                });
        let owners = self
            .deferred
            .iter()
            .filter_map(|entry| Some(self.segments.get(entry.segment)?.stream));
        fences.chain(owners).collect()
    }

    /// Drops the fences that a wait passed: every fence of the streams it
    /// found failed and done, and the fences of the streams it waited for
    /// on blocks freed before it began (their point was enqueued before the
    /// synchronize, which saw it end, though the stream may have been given
    /// more work since; an event fence whose query fails as a call is
    /// passed so too); then caches the blocks whose fences have all passed.
    pub(super) fn pass_fences(&mut self, waited: &Waited) {
        for entry in &mut self.deferred {
            entry.fences.retain(|fence| {
                let (Fence::Event { stream, .. } | Fence::Idle(stream)) = fence;
                !waited.has_ended(stream.id().get(), entry.freed)
            });
        }
        self.collect_deferred();
    }

    /// The streams owning a segment that is one free block.
    pub(super) fn free_segment_owners(&mut self) -> BTreeSet<i64> {
        self.merge_recent(None);
        self.segments
            .iter()
            .filter(|(_, segment)| segment.is_wholly_free())
            .map(|(_, segment)| segment.stream)
            .collect()
    }

    /// Hands out the cached block `found` for `rounded` bytes, split if
    /// the rest is worth keeping.
    pub(super) fn take(&mut self, found: FreeKey, rounded: u64, requested: u64) -> Result<Block> {
        self.set_aside(found);
        self.hand_out(found, rounded, requested)
    }

    /// Hands out the block `found`, set aside ([`State::set_aside`]), for
    /// `rounded` bytes, split if the rest is worth keeping: the rest is
    /// cached again, merged with a free block after it (one freed while
    /// the block was set aside; the block handed out is not merged with
    /// anything).
    pub(super) fn hand_out(
        &mut self,
        found: FreeKey,
        rounded: u64,
        requested: u64,
    ) -> Result<Block> {
        let mut size = found.size;
        if should_split(rounded, found.size - rounded) {
            let segment = self
                .segments
                .get_mut(found.segment)
                .expect("a set-aside block's segment exists");
            size = rounded;
            for (offset, size) in [
                (found.offset, rounded),
                (found.offset + rounded, found.size - rounded),
            ] {
                segment.blocks.insert(offset, Span { size, free: false });
            }
            self.release(found.segment, found.offset + rounded);
        }
        let segment = self
            .segments
            .get(found.segment)
            .expect("a set-aside block's segment exists");
        // Fails only for a backend whose chunks are not multiples of
        // MIN_BLOCK (flex.h promises aligned starts, not sizes): the block
        // is then kept out of the cache, so that no later request picks it.
        let address = segment.address.slice(found.offset, requested)?;
        let (pool, one_chunk) = (
            segment.pool,
            lies_in_one_chunk(&segment.address, found.offset, size),
        );
        self.count_allocation(size, requested);
        Ok(Block {
            address,
            stream: found.stream,
            segment: found.segment,
            offset: found.offset,
            size,
            requested,
            lent_to: None,
            pool,
            one_chunk,
        })
    }

    /// Takes `address` out of [`State::in_transit`]: the segment is in
    /// `segments` (or back in it), or the device has it back.
    pub(super) fn arrived(&mut self, address: &CompositeAddress) {
        if let Some(at) = self.in_transit.iter().position(|a| a == address) {
            self.in_transit.swap_remove(at);
        }
    }

    /// Adds a segment from the device for `stream`, in `pool`, all of it
    /// one free block, and returns that block.
    pub(super) fn add_segment(
        &mut self,
        address: CompositeAddress,
        stream: i64,
        pool: Pool,
    ) -> FreeKey {
        let size = address.total_size();
        let id = self.segments.push(Segment {
            address,
            stream,
            pool,
            last_free: 0,
            held: false,
            blocks: BTreeMap::from([(0, Span { size, free: true })]),
        });
        let whole = FreeKey {
            stream,
            size,
            segment: id,
            offset: 0,
        };
        self.free.insert(whole);
        whole
    }

    /// Marks the block at `offset` of `segment` free, merged with free
    /// neighbours, and caches it.
    pub(super) fn release(&mut self, segment_id: u64, offset: u64) {
        let Some(segment) = self.segments.get_mut(segment_id) else {
            return;
        };
        let stream = segment.stream;
        let Some(span) = segment.blocks.remove(&offset) else {
            return;
        };
        let (mut start, mut size) = (offset, span.size);
        let next = segment
            .blocks
            .range(offset + size..)
            .next()
            .filter(|&(&at, after)| at == offset + size && after.free);
        let previous = segment
            .blocks
            .range(..offset)
            .next_back()
            .filter(|&(&at, before)| at + before.size == offset && before.free);
        let neighbours = [next, previous].map(|found| found.map(|(&at, _)| at));
        for neighbour in neighbours.into_iter().flatten() {
            let span = segment
                .blocks
                .remove(&neighbour)
                .expect("a neighbour found above");
            self.free.remove(&FreeKey {
                stream,
                size: span.size,
                segment: segment_id,
                offset: neighbour,
            });
            start = start.min(neighbour);
            size += span.size;
        }
        segment.blocks.insert(start, Span { size, free: true });
        self.free.insert(FreeKey {
            stream,
            size,
            segment: segment_id,
            offset: start,
        });
    }

    /// Removes every segment that is one free block, for the device; each
    /// is in transit until it is freed or put back.
    pub(super) fn take_free_segments(&mut self, include_held: bool) -> Vec<(u64, Segment)> {
        self.merge_recent(None);
        let whole: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, segment)| segment.is_wholly_free() && (include_held || !segment.held))
            .map(|(id, _)| id)
            .collect();
        whole
            .into_iter()
            .filter_map(|id| {
                let segment = self.segments.remove(id)?;
                self.in_transit.push(segment.address.clone());
                self.free.remove(&FreeKey {
                    stream: segment.stream,
                    size: segment.address.total_size(),
                    segment: id,
                    offset: 0,
                });
                Some((id, segment))
            })
            .collect()
    }

    /// Puts back a segment [`State::take_free_segments`] removed.
    pub(super) fn restore_segment(&mut self, id: u64, segment: Segment) {
        self.arrived(&segment.address);
        self.free.insert(FreeKey {
            stream: segment.stream,
            size: segment.address.total_size(),
            segment: id,
            offset: 0,
        });
        self.segments.restore(id, segment);
    }
}

#[cfg(test)]
mod tests {
    use super::super::sizing::MIN_BLOCK;
    use super::*;

    fn segment() -> Segment {
        Segment {
            address: CompositeAddress::new(vec![flex_rt::AddressChunk {
                address: flex_rt::LogicalAddress {
                    region_id: 0,
                    offset: 0,
                },
                size: MIN_BLOCK,
            }])
            .expect("one aligned chunk"),
            last_free: 0,
            held: false,
            stream: 1,
            pool: Pool::Small,
            blocks: BTreeMap::new(),
        }
    }

    /// A state with one segment of `blocks` (offset, size, free) in units
    /// of [`MIN_BLOCK`], the free ones cached.
    fn state_with(blocks: &[(u64, u64, bool)]) -> (State, u64) {
        let total: u64 = blocks.iter().map(|&(_, size, _)| size).sum();
        let mut segment = segment();
        segment.address = CompositeAddress::new(vec![flex_rt::AddressChunk {
            address: flex_rt::LogicalAddress {
                region_id: 0,
                offset: 0,
            },
            size: total * MIN_BLOCK,
        }])
        .expect("one aligned chunk");
        let stream = segment.stream;
        let mut state = State::default();
        let id = state.segments.push(segment);
        for &(offset, size, free) in blocks {
            let (offset, size) = (offset * MIN_BLOCK, size * MIN_BLOCK);
            let segment = state.segments.get_mut(id).expect("pushed");
            segment.blocks.insert(offset, Span { size, free });
            if free {
                state.free.insert(FreeKey {
                    stream,
                    size,
                    segment: id,
                    offset,
                });
            }
        }
        (state, id)
    }

    /// `chunks` chunks of 4 MiB, each at the start of its own region from
    /// `first_region` on.
    fn chunks_of_4_mib(first_region: u32, chunks: u32) -> CompositeAddress {
        CompositeAddress::new(
            (first_region..first_region + chunks)
                .map(|region_id| flex_rt::AddressChunk {
                    address: flex_rt::LogicalAddress {
                        region_id,
                        offset: 0,
                    },
                    size: 4 << 20,
                })
                .collect::<Vec<_>>(),
        )
        .expect("aligned chunks")
    }

    /// A state holding one segment of `pool` over `chunks` (4 MiB each) and
    /// a recent block of it at `offset`, `size` bytes, last handed out for
    /// `requested`.
    fn state_with_recent(
        pool: Pool,
        chunks: u32,
        (offset, size, requested): (u64, u64, u64),
    ) -> (State, i64) {
        let mut segment = segment();
        segment.address = chunks_of_4_mib(0, chunks);
        segment.pool = pool;
        let stream = segment.stream;
        let address = segment.address.slice(offset, requested).expect("inside");
        let one_chunk = lies_in_one_chunk(&segment.address, offset, size);
        let mut state = State::default();
        let id = state.segments.push(segment);
        state.recent.push_back(Block {
            address,
            stream,
            segment: id,
            offset,
            size,
            requested,
            lent_to: None,
            pool,
            one_chunk,
        });
        (state, stream)
    }

    #[test]
    fn a_recent_block_serves_a_larger_request_only_in_one_chunk() {
        const MIB: u64 = 1 << 20;
        // A 2 MiB block at 2.5 MiB of a large segment in two 4 MiB chunks,
        // last handed out for 1.5 MiB ([2.5, 4) MiB, one chunk): 2 MiB from
        // it would cross the chunks' boundary at 4 MiB.
        let block = (5 * MIB / 2, 2 * MIB, 3 * MIB / 2);
        let (mut state, stream) = state_with_recent(Pool::Large, 2, block);
        let larger = state.take_recent(stream, 2 * MIB, 2 * MIB, Pieces::Refuse);
        assert!(larger.unwrap().is_none(), "2 MiB would be in two chunks");
        let again = state.take_recent(stream, 3 * MIB / 2, 3 * MIB / 2, Pieces::Refuse);
        assert_eq!(again.unwrap().expect("1.5 MiB lies in one").offset, block.0);
    }

    #[test]
    fn a_recent_block_serves_only_requests_of_its_pool() {
        const MIB: u64 = 1 << 20;
        // A 2 MiB block of a small-pool segment, taken for 1.5 MiB by a
        // full device's last resort: given back, it does not serve 1.5 MiB
        // again (a large request), so the small pool's segment is not
        // pinned by it.
        let (mut state, stream) = state_with_recent(Pool::Small, 1, (0, 2 * MIB, 3 * MIB / 2));
        let taken = state.take_recent(stream, 3 * MIB / 2, 3 * MIB / 2, Pieces::Refuse);
        assert!(taken.unwrap().is_none());
    }

    #[test]
    fn the_rest_of_a_set_aside_block_merges_with_a_block_freed_meanwhile() {
        // In MIN_BLOCK units: a free block of 8 at 0, a block in use at 8.
        let (mut state, id) = state_with(&[(0, 8, true), (8, 8, false)]);
        let stream = state.segments.get(id).unwrap().stream;
        let found = *state.free.first().unwrap();
        state.set_aside(found);
        // While it is set aside (its stream being looked at), the block
        // after it is freed: it cannot merge with the set-aside one.
        state.release(id, 8 * MIN_BLOCK);
        let block = state.hand_out(found, 2 * MIN_BLOCK, 1).unwrap();
        assert_eq!((block.offset, block.size), (0, 2 * MIN_BLOCK));
        // The rest (6 at 2) and the block freed meanwhile (8 at 8) are one
        // free block of 14, as everywhere else in the cache.
        let free: Vec<_> = state.free.iter().map(|k| (k.offset, k.size)).collect();
        assert_eq!(free, [(2 * MIN_BLOCK, 14 * MIN_BLOCK)]);
        let spans: Vec<_> = state
            .segments
            .get(id)
            .unwrap()
            .blocks
            .iter()
            .map(|(&offset, span)| (offset, span.size, span.free))
            .collect();
        assert_eq!(
            spans,
            [
                (0, 2 * MIN_BLOCK, false),
                (2 * MIN_BLOCK, 14 * MIN_BLOCK, true)
            ]
        );
        assert_eq!(block.stream, stream);
    }

    #[test]
    fn a_block_in_one_chunk_is_lent_first_and_alone_where_asked() {
        const MIB: u64 = 1 << 20;
        // Stream 1's segment: one 4 MiB chunk, a free 4 MiB block. Stream
        // 2's: two 4 MiB chunks, a free 2 MiB block across their boundary
        // (at 3 MiB). A 2 MiB request that refuses pieces fits both.
        let mut state = State::default();
        let mut add = |stream: i64, chunks: u32, offset: u64, size: u64| {
            let mut segment = segment();
            segment.address = chunks_of_4_mib(2 * stream as u32, chunks);
            segment.stream = stream;
            segment.blocks.insert(offset, Span { size, free: true });
            let id = state.segments.push(segment);
            state.free.insert(FreeKey {
                stream,
                size,
                segment: id,
                offset,
            });
        };
        add(1, 1, 0, 4 * MIB);
        add(2, 2, 3 * MIB, 2 * MIB);
        let lendable = |passed_over: &[i64], one_chunk_only| {
            state
                .lendable(
                    3,
                    2 * MIB,
                    Pieces::Refuse,
                    one_chunk_only,
                    &passed_over.iter().copied().collect(),
                )
                .map(|key| key.stream)
        };
        // The block in one chunk first, though the other fits better.
        assert_eq!(lendable(&[], false), Some(1));
        assert_eq!(lendable(&[], true), Some(1));
        // With its stream passed over: the other only when pieces are
        // taken.
        assert_eq!(lendable(&[1], true), None);
        assert_eq!(lendable(&[1], false), Some(2));
    }

    #[test]
    fn segments_returned_to_the_device_leave_the_table() {
        let mut segments = Segments::default();
        let kept = segments.push(segment());
        for _ in 0..1_000 {
            let id = segments.push(segment());
            assert!(segments.remove(id).is_some());
        }
        // Ids are never reused; the table holds what is held.
        assert_eq!(segments.push(segment()), 1_001);
        assert_eq!(segments.len(), 2);
        assert!(segments.get(kept).is_some());
    }
}

//! The caching allocator behind [`crate::DeviceBuffer`] (PyTorch's CUDA
//! caching allocator, in its essentials): device memory is taken from the
//! runtime in segments, handed out in blocks, and kept when a buffer is
//! dropped, for the next allocation on the same stream.
//!
//! - **Rounding and segments.** A request is rounded up to
//!   [`MIN_BLOCK`] bytes. Requests up to [`SMALL_REQUEST`] come from
//!   segments of [`SMALL_SEGMENT`]; up to [`LARGE_SEGMENT_LIMIT`], from
//!   segments of [`LARGE_SEGMENT`]; larger ones get a segment of their own,
//!   rounded to [`SMALL_SEGMENT`]. A cached block serves only requests of
//!   the kind its segment was taken for, up to [`SMALL_REQUEST`] or above
//!   (PyTorch's small and large pools), so that a small buffer is not cut
//!   from a large segment and does not keep it from going back to the
//!   device; only a full device (below) takes a block of the other kind.
//!   No segment is larger than one memory
//!   region (so that every block lies in one chunk, as a kernel operand
//!   must) or than 1/[`SEGMENTS_PER_DEVICE`] of the device's memory, where
//!   the runtime tells them, unless the request itself is. When the
//!   device cannot give a whole segment, or only in several chunks where
//!   it would fit a region, the request's own size is tried. Where the
//!   runtime does not tell the region size (a flex library: flex.h has no
//!   call for it), a standard segment that comes back in several chunks
//!   (it crossed a region's end, or the memory is fragmented) goes back
//!   too, and the request's own size is taken in whatever chunks the
//!   device gives: a standard segment is kept only in one chunk (but for
//!   the retry of a full device, which takes what the device gives).
//!   A request that fits one region is served from a cached block only
//!   where its bytes lie in one chunk of the block's segment (a segment
//!   larger than a region, made for a larger request, is not cut across
//!   its regions for it).
//! - **Per stream.** A segment, and every block in it, belongs to the stream
//!   it was allocated for. A free block is reused for that stream with no
//!   synchronization (work enqueued later on a stream runs after work
//!   enqueued earlier); for another stream only as a full device's last
//!   resort (lent, below). PyTorch's allocator rests that on a CUDA
//!   stream running one operation at a time. flex.h's `STRICT_ORDERING`
//!   promises only that a stream's operations start and finish in order,
//!   and its `pipeline_barrier` says that a card may overlap an operation
//!   with the ones before it: so a block taken from its stream's cache
//!   asks that the stream's next launch carry that barrier
//!   ([`crate::memory::reuse_barrier`]), which keeps the new owner's work
//!   launched through the stream from overlapping the previous owner's.
//! - **Other streams.** A block used on other streams
//!   ([`crate::DeviceBuffer::record_stream`]) is freed in their order: an
//!   event (a marker event, reused) is recorded on each when the buffer is
//!   dropped, and the block is cached again only when all have completed
//!   (looked at on every allocation; waited for only by `empty_cache` and
//!   a full device). Without events (a flex library of ABI 1.0) the block
//!   waits until each of those streams is idle instead.
//! - **Split and merge.** A free block larger than a request is split when
//!   the rest is worth keeping ([`MIN_BLOCK`] or more for small requests,
//!   more than [`SMALL_REQUEST`] for large ones); a block that goes back to
//!   its segment merges with the free blocks next to it (a block freed on
//!   its own stream does so later, below).
//! - **Recent blocks.** The last [`RECENT_BLOCKS`](blocks::RECENT_BLOCKS) blocks freed on their own
//!   stream are kept as they were, unmerged, and an allocation on that
//!   stream that one of them serves without a split takes it back without
//!   touching the ordered maps (a server allocating the same sizes every
//!   step). They merge when pushed out by newer ones, when an allocation on
//!   their stream finds none that fits, and before memory goes back to the
//!   device. A recent block is taken before a better fit among the merged
//!   ones: for requests above [`SMALL_REQUEST`] it may be up to that much
//!   larger than the request (as a block the best fit picks may be), for
//!   smaller ones it is the request's rounded size.
//! - **Out of memory.** A request larger than all of the device's memory
//!   (when the runtime tells it) fails with [`Error::OutOfMemory`] as soon
//!   as the device refuses it: nothing is returned or waited for. When the
//!   device is full, a cached block of the
//!   stream in the other pool serves first if its segment is one that
//!   buffers still use (in one chunk where the request fits a region, as
//!   a block of its own pool would): nothing is returned or waited for.
//!   Otherwise the allocator returns the
//!   whole free segments of streams that are idle to the device (waiting
//!   for no stream) and tries again; if that
//!   was not enough, it waits for the streams that hold whole free
//!   segments and those that blocks freed in other streams' order wait
//!   for, returns what they held, and tries once more (PyTorch's retry
//!   also waits: `cudaFree` synchronizes the device). Retries that wait do
//!   so one at a time, and each holds the segments it waits for against
//!   other threads' returns (their own streams may still use them) until
//!   it has returned them and taken its own, as PyTorch's retry does under
//!   its allocator's lock; if it had to keep segments freed during the
//!   wait on streams still busy, it waits again (up to three rounds).
//!   Meanwhile other threads' retries wait for it, and segments it holds
//!   (idle streams' too) serve only their own streams. From a host
//!   callback of the same device nothing is waited for (the device refuses
//!   the wait): busy streams, and those a retry holds, keep their
//!   segments. Then it takes a cached block in several chunks if one fits
//!   (it serves copies and fills, not kernel operands); then it borrows a
//!   cached block of another stream that has finished its work now, or,
//!   where the device waits on the device side, of one with work left,
//!   behind that work (below); then it fails with [`Error::OutOfMemory`].
//! - **Lent blocks.** A full device's last resort, before it fails, is a
//!   cached block in a segment of another stream, lent if that stream is
//!   seen idle once the block is set aside (or failed, and then seen
//!   failed by a synchronize, which waits only for the work it began
//!   before the failure): every use of a
//!   cached block was enqueued before its free, so none can still touch
//!   it. Where the device waits on the device side (and the borrower has
//!   not failed), a stream with work left lends too, after the blocks of
//!   finished streams (of those in one chunk, where the request fits a
//!   region, then of the others): the borrowing stream first
//!   waits for all the work enqueued on it so far
//!   ([`crate::SpyreStream::wait_stream`]), which blocks no thread, but
//!   ties the borrower to that work: the borrowing stream's later work,
//!   and its synchronize, wait for it, and if it fails the borrowing
//!   stream fails too, as after any wait on an event. (CUDA's
//!   stream-ordered pools reuse memory freed on another stream by
//!   default, once that free's own event has completed or by inserting
//!   such a dependency; PyTorch's allocator fails instead.) Streams whose
//!   work cannot be waited for so (host-blocking waits, a failed stream
//!   no synchronize has seen fail, one that needs shutdown or cannot be
//!   queried) are passed over, as are the segments a waiting retry holds;
//!   nothing is waited for on the host but a failed stream's work begun
//!   before its failure.
//!   The block stays in its segment: when its buffer is dropped it waits
//!   for the borrowing stream, as for a stream that used it, before it is
//!   cached again for its segment's stream. Without it, streams that each
//!   keep a partly used segment could fill the device while most of its
//!   memory lies cached (a new pool stream per iteration, cycling through
//!   the 64 pool streams).
//! - **Failed streams.** A failed stream takes no more work, but a query
//!   that reports the failure does not say that the work begun before it
//!   has ended: flex.h does not promise it, and a card that overlaps a
//!   stream's operations may still run one (a stream that needs shutdown
//!   goes on with the operation it was in). So a failed stream's memory,
//!   and blocks used on it, wait until a synchronize (`empty_cache`, or the
//!   retry of a full device, which also lends its cached blocks after
//!   such a synchronize) has returned the stream's failure once it could
//!   take no more work: everything it ran has then ended. Until then its
//!   segments stay cached and a block used on it stays a pending free;
//!   from a host callback of the device, where no synchronize can be
//!   made, they stay so.
//!
//! The allocator's pieces: [`sizing`] (rounding, pools, segment sizes),
//! [`blocks`] (the table of segments and blocks, and the statistics) and
//! [`fence`] (when memory other streams used is free of them).

mod blocks;
mod fence;
mod sizing;

pub(crate) use blocks::Block;
pub use blocks::MemoryStats;
pub use sizing::{
    LARGE_SEGMENT, LARGE_SEGMENT_LIMIT, MIN_BLOCK, SEGMENTS_PER_DEVICE, SMALL_REQUEST,
    SMALL_SEGMENT, allocations_held, segment_bytes,
};

use std::collections::{BTreeMap, BTreeSet};

use flex_rt::sync::{Mutex, MutexGuard};
use flex_rt::{CompositeAddress, FlexError, Runtime, Status};

use self::blocks::{Deferred, FreeKey, Pieces, Segment, Serving, State};
use self::fence::{
    Fence, Waited, has_finished_now, has_finished_or_failed, is_stream_failure,
    synchronize_finds_failed,
};
use self::sizing::{Pool, round_request, segment_cap, segment_size};
use crate::error::{Error, OutOfMemory, Result};
use crate::id::StreamId;
use crate::marker::MarkerEvents;
use crate::memory::reuse_barrier::ReuseBarriers;
use crate::stream::SpyreStream;

/// The caching allocator of the process's device.
///
/// Thread-safety: every method may be called from any thread; the state
/// is behind one mutex, never held across a runtime call that allocates,
/// frees or waits. It is held across calls that return at once: the
/// queries of pending frees' fences (their events' or streams', one per
/// pending free, on every allocation, free, wait and statistics call) and
/// the destroy of a marker event a passed fence gives back past the idle
/// markers kept. Two
/// more order the moves of segments between the device and the cache:
/// `emptying`, held by one return of cached segments at a time, and
/// `transit`, held across the runtime calls that allocate and free
/// segments, a raw free, a whole return (with its streams' queries), and
/// in the retry of a full device from its return to its request. Neither
/// is held across a wait for a stream. A third, `retrying`, is held by
/// the waiting step of a retry across its waits, never by a host callback
/// of the device.
pub(crate) struct CachingAllocator {
    runtime: &'static dyn Runtime,
    /// Where the fences' events come from.
    markers: &'static MarkerEvents,
    /// The largest segment taken from the device ([`segment_cap`]).
    segment_cap: u64,
    /// All of the device's memory, if the runtime tells: a request larger
    /// fails at once.
    total: Option<u64>,
    /// The device's region size, where the runtime tells it.
    region: Option<u64>,
    state: Mutex<State>,
    /// Held while segments are returned to the device (and, in the retry
    /// of a full device, across the request that follows), so that an
    /// allocation retrying after a full device waits for a return already
    /// under way instead of failing beside it. Never held across a wait for
    /// a stream: a host callback of that stream may itself empty the cache
    /// or allocate on a full device. Taken before `transit`.
    emptying: Mutex<()>,
    /// Held across every device call that moves a segment between the
    /// device and the allocator (an allocation and its entry in
    /// `State::in_transit`, a free and its leaving it) and across a raw
    /// free with its look at the segments ([`CachingAllocator::free_raw`]):
    /// so the look never sees an address the device has already handed
    /// back or out without the allocator knowing. A return of cached
    /// segments holds it throughout, and the retry of a full device holds
    /// it from its return to its request, so that no other thread's new
    /// segment takes the memory returned for it. Taken before `state`.
    transit: Mutex<()>,
    /// Held by the waiting step of a retry of a full device, from its wait
    /// to its request, so that retries that wait do so one at a time: each
    /// holds the wholly free segments ([`Segment::held`]) against the
    /// others' returns. Never taken from a host callback of the device
    /// (which may not wait).
    /// Taken before `emptying`.
    retrying: Mutex<()>,
    /// Barriers asked for by blocks reused on their own stream.
    barriers: ReuseBarriers,
}

/// Where an allocated block came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The stream's own cache: the previous owner's work on the stream may
    /// still be running ([`ReuseBarriers`]).
    Cache,
    /// A new segment from the device.
    Segment,
    /// Another stream's cache, lent only once that stream had finished
    /// its work.
    Lent,
}

/// What [`CachingAllocator::wait_for_streams`] found: the streams whose
/// wholly free segments may go back to the device although they are not
/// idle now. The default is no wait: only streams idle now
/// ([`has_finished_now`]) have their segments returned.
#[derive(Default)]
struct Finished<'a> {
    /// The streams whose work enqueued before the wait has ended: a
    /// segment of theirs whose blocks were all freed before it was used
    /// only by such work.
    waited: Waited,
    /// The waiting retry's hold on the segments held for it
    /// ([`Segment::held`]), which it may return; `None` for every other
    /// return.
    hold: Option<Hold<'a>>,
}

/// The hold of the waiting retry on the segments wholly free when it began
/// to wait ([`Segment::held`]), ended when dropped (also if the retry
/// unwinds). One at a time: the retry holds `retrying`.
struct Hold<'a>(&'a CachingAllocator);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.state.lock().segments.release_held();
    }
}

/// What [`CachingAllocator::return_segments`] did.
#[derive(Default)]
struct Returned {
    /// The bytes returned to the device.
    bytes: u64,
    /// Whether it kept wholly free segments because their streams may
    /// still use them (a further wait could return them).
    kept_busy: bool,
}

/// Rounds of the waiting step of a retry of a full device at most: the
/// first, and more while memory freed on busy streams during the previous
/// wait was kept.
const WAIT_ROUNDS: u32 = 3;

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("stats", &self.state.lock().stats)
            .finish()
    }
}

impl CachingAllocator {
    /// An empty allocator over `runtime`, fencing with `markers` (of the
    /// same runtime).
    pub(crate) fn new(runtime: &'static dyn Runtime, markers: &'static MarkerEvents) -> Self {
        let layout = runtime.memory_layout();
        // A total of 0 tells nothing.
        let total = layout
            .map(|layout| layout.total_bytes)
            .or_else(|| match runtime.memory_info() {
                Ok(info) => Some(info.total_bytes),
                Err(error) => {
                    if error.status() != Status::UNSUPPORTED {
                        tracing::warn!(%error, "the device's memory is unknown: a request larger than all of it is found out by trying");
                    }
                    None
                }
            })
            .filter(|&total| total > 0);
        Self {
            runtime,
            markers,
            segment_cap: segment_cap(layout.map(|layout| layout.region_bytes), total),
            total,
            region: layout.map(|layout| layout.region_bytes),
            state: Mutex::new(State::default()),
            emptying: Mutex::new(()),
            transit: Mutex::new(()),
            retrying: Mutex::new(()),
            barriers: ReuseBarriers::new(),
        }
    }

    /// A block of at least `bytes` (> 0) for `stream`: a cached one if the
    /// stream has one large enough in its request's pool (small or large),
    /// else from a new segment; on a full device, as the module docs say.
    ///
    /// # Errors
    /// As [`round_request`]; [`Error::OutOfMemory`] when the device cannot
    /// give the memory even after the cache was emptied; the runtime's
    /// other errors.
    pub(crate) fn allocate(&self, stream: SpyreStream, bytes: u64) -> Result<Block> {
        let (block, origin) = self.take_block(stream, bytes)?;
        // Work enqueued from now on is the new owner's (a checking device
        // tells it from the previous owner's).
        self.runtime.note_reuse(&block.address);
        if origin == Origin::Cache {
            // The previous owner's work on the stream may still run.
            self.barriers.request(stream);
        }
        Ok(block)
    }

    /// The barrier requests of blocks reused on their own stream, which
    /// the launch chokepoint reads and covers.
    #[inline]
    pub(crate) fn reuse_barriers(&self) -> &ReuseBarriers {
        &self.barriers
    }

    /// The block [`CachingAllocator::allocate`] hands out, and where it
    /// came from.
    fn take_block(&self, stream: SpyreStream, bytes: u64) -> Result<(Block, Origin)> {
        let rounded = round_request(bytes)?;
        let pool = Pool::of(rounded);
        let key = stream.id().get();
        // A request that fits one region gets a block in one chunk (a
        // kernel operand must be) while the device can give one.
        let pieces = if self.region.is_some_and(|region| rounded <= region) {
            Pieces::Refuse
        } else {
            Pieces::Accept
        };
        {
            let mut state = self.state.lock();
            state.collect_deferred();
            if let Some(block) = state.take_recent(key, rounded, bytes, pieces)? {
                return Ok((block, Origin::Cache));
            }
            state.merge_recent(Some(key));
            if let Some(block) =
                state.take_cached(key, rounded, bytes, pieces, Serving::Pool(pool))?
            {
                return Ok((block, Origin::Cache));
            }
        }
        let segment = match self.allocate_segment(rounded, Pieces::Refuse) {
            Ok(segment) => segment,
            Err(error) if error.status() == Status::OUT_OF_MEMORY => {
                if self.total.is_some_and(|total| rounded > total) {
                    // Nothing returned or waited for can make room.
                    return Err(self.out_of_memory(bytes, error));
                }
                {
                    // A full device: a cached block of the other pool, in
                    // a segment that buffers still use, serves before
                    // anything is returned or waited for.
                    let mut state = self.state.lock();
                    let serving = Serving::SegmentsInUse;
                    if let Some(block) = state.take_cached(key, rounded, bytes, pieces, serving)? {
                        return Ok((block, Origin::Cache));
                    }
                    state.stats.alloc_retries += 1;
                }
                match self.retry_segment(rounded) {
                    Ok(segment) => segment,
                    Err(error) if error.status() == Status::OUT_OF_MEMORY => {
                        // Last, a cached block of either pool, in several
                        // chunks if need be: it still serves copies and
                        // fills.
                        let mut state = self.state.lock();
                        state.merge_recent(Some(key));
                        if let Some(block) =
                            state.take_cached(key, rounded, bytes, Pieces::Accept, Serving::Any)?
                        {
                            return Ok((block, Origin::Cache));
                        }
                        drop(state);
                        if let Some(block) = self.lend_block(stream, rounded, bytes, pieces)? {
                            return Ok((block, Origin::Lent));
                        }
                        return Err(self.out_of_memory(bytes, error));
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            Err(error) => return Err(error.into()),
        };
        let mut state = self.state.lock();
        state.arrived(&segment);
        let whole = state.add_segment(segment, key, pool);
        Ok((state.take(whole, rounded, bytes)?, Origin::Segment))
    }

    /// A segment for `rounded` bytes once the device was found full: the
    /// cache goes back to the device and the segment is asked for again.
    /// First the cached memory of streams that have finished their work,
    /// waiting for none; if that is not enough, the cached memory of every
    /// stream, after waiting for those that hold some, and for the streams
    /// whose blocks wait for them (PyTorch's retry waits likewise, through
    /// `cudaFree`'s synchronization). Only then is a segment in several
    /// chunks accepted.
    ///
    /// Each step returns the cache and asks for the segment under one hold
    /// of the transit lock, so that memory it returned cannot be taken by
    /// another thread's new segment before its own request: with several
    /// threads retrying at once, each would otherwise give back what the
    /// next took, and all could fail. The waiting step runs one at a time
    /// (`retrying`) and holds the wholly free segments ([`Segment::held`])
    /// before it waits for their streams, so that no other thread's retry
    /// returns them meanwhile (as PyTorch's retry holds its allocator's
    /// lock throughout; their own streams, and so their host callbacks,
    /// may still use them); if it kept segments freed during its wait on
    /// streams that were still busy, it waits again, up to [`WAIT_ROUNDS`]
    /// times. From a host callback of the device nothing is waited for.
    fn retry_segment(&self, rounded: u64) -> std::result::Result<CompositeAddress, FlexError> {
        // No wait: the streams that are idle now.
        let idle = Finished::default();
        match self.return_and_allocate(&idle, rounded, Pieces::Refuse).1 {
            Err(error) if error.status() == Status::OUT_OF_MEMORY => {}
            other => return other,
        }
        if self.runtime.in_host_callback() {
            // The device refuses the wait, and a waiting retry may be
            // waiting for this very callback: what has finished, once more.
            return self.return_and_allocate(&idle, rounded, Pieces::Accept).1;
        }
        let _one_waiting_retry = self.retrying.lock();
        let mut round = 1;
        loop {
            let finished = self.wait_for_streams_holding();
            let (returned, segment) = self.return_and_allocate(&finished, rounded, Pieces::Accept);
            match segment {
                Err(error)
                    if error.status() == Status::OUT_OF_MEMORY
                        && returned.kept_busy
                        && round < WAIT_ROUNDS =>
                {
                    round += 1;
                }
                other => return other,
            }
        }
    }

    /// The last resort of a full device: a cached block of another stream
    /// lent to `stream` for `rounded` bytes (CUDA's reuse of a
    /// stream-ordered pool; PyTorch's caching allocator never lends). Every
    /// use of a cached block was enqueued before its free (uses on other
    /// streams are fenced before it is cached again), so once its stream
    /// is seen finished after the block was set aside, no work can touch
    /// it ([`has_finished_or_failed`]). Where the device waits on the
    /// device side (and `stream` has not failed), a stream with work left
    /// lends one too, after the blocks of finished streams of the same
    /// kind (below), once `stream` waits for that work
    /// ([`SpyreStream::wait_stream`]: CUDA's inserted dependencies,
    /// `cudaMemPoolReuseAllowInternalDependencies`), which blocks no
    /// thread, but makes `stream` wait for that work (its synchronize too)
    /// and fail if that work fails, as any wait on an event does. The best
    /// fit is lent; where `pieces` refuses several chunks, one lying in one
    /// chunk goes first, whether or not it needs the wait, then the
    /// others in the same order; a stream whose work cannot be
    /// waited for so (host-blocking waits, a failed stream whose failure
    /// no synchronize has seen, a refused wait) is passed over, as are the
    /// segments a waiting retry holds. The block stays in its segment:
    /// when freed, it waits for `stream` (and its other users) before it
    /// is cached again for the segment's stream. Nothing is waited for on
    /// the host but the work a failed stream began before its failure.
    ///
    /// # Errors
    /// As [`State::take`].
    fn lend_block(
        &self,
        stream: SpyreStream,
        rounded: u64,
        requested: u64,
        pieces: Pieces,
    ) -> Result<Option<Block>> {
        let borrower = stream.id().get();
        // First the blocks of streams that have finished, which need no
        // wait; then, where the device waits on the device side (and the
        // borrower can wait), those of streams with work left, behind that
        // work. Where `pieces` refuses several chunks, blocks whose front
        // lies in one chunk go first, in both ways, then the others.
        let behind_work = self.waits_on_device_side() && stream.query().is_ok();
        let one_chunk = pieces == Pieces::Refuse;
        let passes = [(true, false), (true, true), (false, false), (false, true)]
            .into_iter()
            .filter(|&(one_chunk_only, waits)| {
                (one_chunk || !one_chunk_only) && (behind_work || !waits)
            });
        for (one_chunk_only, waits) in passes {
            let mut passed_over = BTreeSet::new();
            loop {
                // Set aside under the lock: neither its stream's
                // allocations nor a return of cached memory take it while
                // its stream is looked at.
                let candidate = {
                    let mut state = self.state.lock();
                    state.merge_recent(None);
                    let Some(found) =
                        state.lendable(borrower, rounded, pieces, one_chunk_only, &passed_over)
                    else {
                        break;
                    };
                    SetAside::new(&self.state, &mut state, found)
                };
                // No lock is held: a failed stream's synchronize may wait.
                let owner = self.stream(candidate.found.stream);
                let ordered =
                    has_finished_or_failed(owner) || (waits && stream.wait_stream(owner).is_ok());
                let mut state = self.state.lock();
                let found = candidate.settle();
                if ordered {
                    let mut block = state.hand_out(found, rounded, requested)?;
                    block.lent_to = Some(stream);
                    return Ok(Some(block));
                }
                state.release(found.segment, found.offset);
                passed_over.insert(found.stream);
            }
        }
        Ok(None)
    }

    /// Whether the device waits on events on the device side (a wait then
    /// blocks no thread); `false` where its waits block the host, or it
    /// has no events.
    fn waits_on_device_side(&self) -> bool {
        self.runtime
            .capabilities()
            .is_ok_and(|capabilities| capabilities.device_side_wait)
    }

    /// Returns the segments `finished` allows
    /// ([`CachingAllocator::return_segments`]) and asks the device for a
    /// segment for `rounded` bytes ([`CachingAllocator::allocate_segment`]
    /// with `pieces`) under one hold of `emptying` and the transit lock, so
    /// that no other thread's segment takes the memory returned in between.
    fn return_and_allocate(
        &self,
        finished: &Finished<'_>,
        rounded: u64,
        pieces: Pieces,
    ) -> (Returned, std::result::Result<CompositeAddress, FlexError>) {
        let _one_at_a_time = self.emptying.lock();
        let transit = self.transit.lock();
        let returned = self.return_segments(finished, &transit);
        let segment = self.allocate_segment_in_transit(rounded, pieces, &transit);
        (returned, segment)
    }

    /// A segment for `rounded` bytes from the device: the standard segment
    /// size, or the request's own if the device cannot give that much.
    /// With [`Pieces::Refuse`], a segment that fits one region but came back
    /// in several chunks (the memory is fragmented) goes back to the device,
    /// the request's own size is tried in one piece, and failing that the
    /// call fails with `OUT_OF_MEMORY`, so that the caller can return its
    /// cache and try again. Where the runtime does not tell the region
    /// size, a standard segment in several chunks goes back and the
    /// request's own size is taken as the device gives it.
    fn allocate_segment(
        &self,
        rounded: u64,
        pieces: Pieces,
    ) -> std::result::Result<CompositeAddress, FlexError> {
        let transit = self.transit.lock();
        self.allocate_segment_in_transit(rounded, pieces, &transit)
    }

    /// [`CachingAllocator::allocate_segment`] with the transit lock held
    /// by the caller (`_transit` is its guard).
    fn allocate_segment_in_transit(
        &self,
        rounded: u64,
        pieces: Pieces,
        _transit: &MutexGuard<'_, ()>,
    ) -> std::result::Result<CompositeAddress, FlexError> {
        let standard = segment_size(rounded, self.segment_cap);
        let mut size = standard;
        loop {
            // After the standard size, the request's own.
            let fall_back = size > rounded;
            let segment = match self.runtime.allocate(size) {
                Err(error) if error.status() == Status::OUT_OF_MEMORY && fall_back => {
                    size = rounded;
                    continue;
                }
                other => other,
            }?;
            let mut state = self.state.lock();
            state.stats.device_allocations += 1;
            state.in_transit.push(segment.clone());
            // Whether one piece could come: where the region size is known,
            // for a segment that fits a region; where it is not (through a
            // flex library), for the request's own size after the standard
            // one (taken then in whatever chunks the device gives).
            let one_piece_possible = match self.region {
                Some(region) => segment.total_size() <= region,
                None => fall_back,
            };
            if pieces == Pieces::Refuse && one_piece_possible && segment.chunks().len() > 1 {
                drop(state);
                let chunks = segment.chunks().len();
                let freed = self.runtime.free(&segment);
                let mut state = self.state.lock();
                state.stats.device_frees += u64::from(freed.is_ok());
                state.arrived(&segment);
                drop(state);
                // Told once the segment has arrived: a subscriber that
                // panics then leaves nothing in transit.
                if let Err(error) = &freed {
                    tracing::warn!(%error, "the device refused to free a segment that came in {chunks} chunks; it is forgotten");
                }
                if fall_back {
                    size = rounded;
                    continue;
                }
                return Err(FlexError::new(
                    Status::OUT_OF_MEMORY,
                    "allocate",
                    format!(
                        "no free range holds {} bytes in one piece (the device offered {chunks} chunks)",
                        segment.total_size()
                    ),
                ));
            }
            state.stats.reserved_bytes += segment.total_size();
            state.stats.peak_reserved_bytes = state
                .stats
                .peak_reserved_bytes
                .max(state.stats.reserved_bytes);
            return Ok(segment);
        }
    }

    /// The error of an allocation the device could not serve.
    fn out_of_memory(&self, requested: u64, source: FlexError) -> Error {
        let (device_free, memory_query_error) = match self.runtime.memory_info() {
            Ok(info) => (Some(info.free_bytes), None),
            Err(error) => (None, Some(error)),
        };
        let mut state = self.state.lock();
        state.merge_recent(None);
        state.stats.out_of_memory += 1;
        let cached = state.stats.reserved_bytes - state.stats.allocated_bytes;
        let largest_cached = state.largest_cached();
        Error::OutOfMemory(Box::new(OutOfMemory {
            requested,
            device_total: self.total,
            device_free,
            memory_query_error,
            cached,
            largest_cached,
            source,
        }))
    }

    /// Returns `block` to the cache. With `users` (streams other than the
    /// block's own that used it), the block waits for the work enqueued on
    /// them so far first. Never blocks.
    /// A block lent to a stream other than its segment's
    /// ([`CachingAllocator::lend_block`]) waits for that stream as well.
    pub(crate) fn free(&self, block: Block, users: &[SpyreStream]) {
        if users.is_empty() && block.lent_to.is_none() {
            // The common case, without an iterator chain to collect.
            drop(self.cache(block, Vec::new()));
            return;
        }
        // Should making a fence panic (a runtime's record, a tracing
        // subscriber), the block is still cached, behind every stream
        // that used it being idle.
        let fencing = Fencing {
            allocator: self,
            lent_to: block.lent_to,
            block: Some(block),
            users,
        };
        let fences = fencing.streams().map(|stream| self.fence(stream)).collect();
        self.cache(fencing.fenced(), fences).collect_deferred();
    }

    /// [`CachingAllocator::free`] of `block`, whose streams' `fences` are
    /// made, as a pending free where there are any. Returns the state,
    /// still locked: the caller collects the pending frees that have
    /// passed ([`State::collect_deferred`]), unless it may not query the
    /// runtime (while a panic unwinds).
    fn cache(&self, block: Block, fences: Vec<Fence>) -> MutexGuard<'_, State> {
        let mut state = self.state.lock();
        state.stats.allocated_bytes -= block.size;
        state.stats.requested_bytes -= block.requested;
        state.stats.frees += 1;
        let now = state.stats.frees;
        if let Some(segment) = state.segments.get_mut(block.segment) {
            segment.last_free = now;
        }
        if fences.is_empty() {
            state.keep_recent(block);
        } else {
            state.stats.pending_frees += 1;
            state.deferred.push(Deferred {
                segment: block.segment,
                offset: block.offset,
                freed: now,
                fences,
            });
        }
        state
    }

    /// A fence at the end of the work enqueued on `stream` so far.
    fn fence(&self, stream: SpyreStream) -> Fence {
        let recorded = (|| {
            let handle = stream.handle().ok()?;
            let event = self.markers.take().ok()?;
            handle.record_event(&*event, None).ok()?;
            Some(event)
        })();
        match recorded {
            Some(event) => Fence::Event { event, stream },
            None => Fence::Idle(stream),
        }
    }

    /// Returns every cached segment that is wholly free to the device
    /// (`torch.cuda.empty_cache`). Blocks until the streams that own them,
    /// and those that blocks freed in other streams' order wait for, have
    /// finished their work (a segment's blocks may be in use by work
    /// still enqueued on its stream); a segment whose stream cannot be waited
    /// for from here (from a host callback of the device), whose last block
    /// was freed only after the wait began while its stream still has work,
    /// or that a full device's retry holds for itself meanwhile (the retry
    /// returns it once its stream has finished), stays cached. Returns the
    /// bytes returned to the device.
    pub(crate) fn empty_cache(&self) -> u64 {
        let finished = self.wait_for_streams();
        let _one_at_a_time = self.emptying.lock();
        let transit = self.transit.lock();
        self.return_segments(&finished, &transit).bytes
    }

    /// Synchronizes every stream that holds a wholly free segment, that a
    /// pending free waits for, or that owns a block of such a free, holding
    /// no lock, and tells which finished (`torch.cuda.empty_cache`; the
    /// waiting step of the retry of a full device holds the segments too,
    /// [`CachingAllocator::wait_for_streams_holding`]).
    fn wait_for_streams(&self) -> Finished<'_> {
        self.wait(|state| state.free_segment_owners())
    }

    /// [`CachingAllocator::wait_for_streams`] for the waiting step of a
    /// retry: the wholly free segments are first held for it
    /// ([`Segment::held`]) until the returned [`Finished`] is dropped,
    /// which lets [`CachingAllocator::return_segments`] return them.
    fn wait_for_streams_holding(&self) -> Finished<'_> {
        let hold = Hold(self);
        let mut finished = self.wait(|state| {
            state.merge_recent(None);
            state.segments.hold_wholly_free()
        });
        finished.hold = Some(hold);
        finished
    }

    /// Waits for the streams `owners` names (called under the state lock,
    /// after the free count is read) and those pending frees wait for.
    fn wait(&self, owners: impl FnOnce(&mut State) -> BTreeSet<i64>) -> Finished<'_> {
        let mut finished = Finished::default();
        let streams = {
            let mut state = self.state.lock();
            state.collect_deferred();
            finished.waited.frees_before = state.stats.frees;
            let mut streams = owners(&mut state);
            streams.extend(state.pending_free_streams());
            streams
        };
        for id in streams {
            // Refused from a host callback of the device: its segments
            // then stay cached. A failure covers only the work enqueued
            // before the call (the stream may have failed, needing
            // shutdown, while later work ran): a second synchronize, made
            // once it had failed and so could take no more work, covers
            // all of it.
            let stream = self.stream(id);
            match stream.synchronize() {
                Ok(()) => {
                    finished.waited.synchronized.insert(id);
                }
                Err(Error::Flex(error))
                    if is_stream_failure(&error) && synchronize_finds_failed(stream) =>
                {
                    finished.waited.failed.insert(id);
                }
                Err(_) => {}
            }
        }
        // Blocks waiting for a failed stream (to be idle, which it never
        // will be, or for an event that failed) are free of it now, and so
        // are blocks freed before the wait that wait for a stream it waited
        // for (which may be busy again).
        self.state.lock().pass_fences(&finished.waited);
        finished
    }

    /// Returns to the device the wholly free segments of the streams that
    /// have finished their work: [`has_finished_now`], or as `finished`
    /// tells; segments held for the waiting retry ([`Segment::held`])
    /// only for that retry (`finished.hold`). Called with
    /// `emptying` and the transit lock (`_transit`) held.
    fn return_segments(&self, finished: &Finished<'_>, _transit: &MutexGuard<'_, ()>) -> Returned {
        let released = {
            let mut state = self.state.lock();
            state.collect_deferred();
            state.take_free_segments(finished.hold.is_some())
        };
        // Each segment stays in `taken` until it is given back to the device
        // or kept: a panic out of a query or a free (the runtime's) puts the
        // others back in the cache.
        let mut taken = Taken {
            state: &self.state,
            segments: BTreeMap::new(),
        };
        for (id, segment) in released {
            taken
                .segments
                .entry(segment.stream)
                .or_default()
                .push((id, segment));
        }
        let mut returned = Returned::default();
        // Told once every segment is settled: a subscriber that panics
        // then leaves none of them in transit.
        let mut failed_frees = Vec::new();
        let streams: Vec<i64> = taken.segments.keys().copied().collect();
        for stream_id in streams {
            let done = finished.waited.failed.contains(&stream_id)
                || has_finished_now(self.stream(stream_id));
            let segments = taken.segments.get_mut(&stream_id).map(std::mem::take);
            let (mut returning, keeping): (Vec<_>, Vec<_>) = segments
                .unwrap_or_default()
                .into_iter()
                .partition(|(_, segment)| {
                    done || finished.waited.has_ended(stream_id, segment.last_free)
                });
            if !keeping.is_empty() {
                returned.kept_busy = true;
                let mut state = self.state.lock();
                for (id, segment) in keeping {
                    state.restore_segment(id, segment);
                }
            }
            // Taken out one at a time, in the order they came: one whose
            // free panics stays in transit (whether the device freed it is
            // not known).
            returning.reverse();
            taken.segments.insert(stream_id, returning);
            while let Some((_, segment)) = taken.segments.get_mut(&stream_id).and_then(Vec::pop) {
                let size = segment.address.total_size();
                let freed = self.runtime.free(&segment.address);
                let mut state = self.state.lock();
                match freed {
                    Ok(()) => {
                        state.arrived(&segment.address);
                        state.stats.reserved_bytes -= size;
                        state.stats.device_frees += 1;
                        returned.bytes += size;
                    }
                    Err(error) => {
                        // No status of a failed free says the memory is
                        // still the caller's (`INVALID_ARGUMENT`: not an
                        // allocation of the runtime, a double free say):
                        // never handed out again, nor counted as held.
                        state.arrived(&segment.address);
                        state.stats.reserved_bytes -= size;
                        failed_frees.push(error);
                    }
                }
            }
        }
        for error in failed_frees {
            tracing::warn!(%error, "the device failed to free a cached segment; it is forgotten");
        }
        returned
    }

    /// Frees `address`, memory allocated from the runtime directly, unless
    /// it starts in a segment the allocator holds (in use by buffers,
    /// cached, or on its way from or back to the device; the whole of it,
    /// or a buffer's part): freeing that would pull memory from under its
    /// buffers, or have the allocator free memory handed out again later.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the address for memory of the allocator
    /// (nothing is freed); the runtime's error.
    pub(crate) fn free_raw(&self, address: &CompositeAddress) -> Result<()> {
        let _transit = self.transit.lock();
        let owned = {
            let state = self.state.lock();
            state
                .in_transit
                .iter()
                .any(|segment| starts_in(address, segment))
                || state
                    .segments
                    .iter()
                    .any(|(_, segment)| starts_in(address, &segment.address))
        };
        if owned {
            return Err(FlexError::invalid_argument(
                "free",
                format!(
                    "{address} is memory of the caching allocator (it holds DeviceBuffers), not of allocate; drop the DeviceBuffer instead, and call empty_cache to return cached memory to the device"
                ),
            )
            .into());
        }
        Ok(self.runtime.free(address)?)
    }

    /// The statistics now (deferred frees whose streams have moved on are
    /// collected first).
    pub(crate) fn stats(&self) -> MemoryStats {
        let mut state = self.state.lock();
        state.collect_deferred();
        state.stats
    }

    /// The stream of this device with (pool) id `id`.
    fn stream(&self, id: i64) -> SpyreStream {
        SpyreStream::from_parts(self.runtime.logical_device() as u8, StreamId(id))
    }

    /// Starts the peaks again from the current values.
    pub(crate) fn reset_peaks(&self) {
        let mut state = self.state.lock();
        state.stats.peak_allocated_bytes = state.stats.allocated_bytes;
        state.stats.peak_reserved_bytes = state.stats.reserved_bytes;
    }
}

/// Whether `address` starts in one of `segment`'s chunks: the segment
/// itself, or a buffer's part of it.
fn starts_in(address: &CompositeAddress, segment: &CompositeAddress) -> bool {
    let start = address.start();
    segment.chunks().iter().any(|chunk| {
        chunk.address.region_id == start.region_id
            && start
                .offset
                .checked_sub(chunk.address.offset)
                .is_some_and(|into| into < chunk.size)
    })
}

/// Wholly free segments taken out of the cache to go back to the device
/// ([`CachingAllocator::return_segments`]), by stream: those still here
/// when it is dropped are put back in the cache.
struct Taken<'a> {
    state: &'a Mutex<State>,
    segments: BTreeMap<i64, Vec<(u64, Segment)>>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let segments = std::mem::take(&mut self.segments);
        if segments.values().all(Vec::is_empty) {
            return;
        }
        let mut state = self.state.lock();
        for (id, segment) in segments.into_values().flatten() {
            state.restore_segment(id, segment);
        }
    }
}

/// A block being freed while its fences are made
/// ([`CachingAllocator::free`]): cached behind its streams' being idle
/// ([`Fence::Idle`]) if dropped before they are all made
/// ([`Fencing::fenced`]).
struct Fencing<'a> {
    allocator: &'a CachingAllocator,
    block: Option<Block>,
    users: &'a [SpyreStream],
    lent_to: Option<SpyreStream>,
}

impl Fencing<'_> {
    /// The streams the block waits for: `users`, and the stream it was
    /// lent to.
    fn streams(&self) -> impl Iterator<Item = SpyreStream> + '_ {
        self.users.iter().copied().chain(self.lent_to)
    }

    /// The block, its fences made.
    fn fenced(mut self) -> Block {
        self.block
            .take()
            .expect("a block being fenced is fenced once")
    }
}

impl Drop for Fencing<'_> {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            // Not collected now: that queries the runtime, whose second
            // panic, during this one's unwinding, would abort the process.
            let fences = self.streams().map(Fence::Idle).collect();
            drop(self.allocator.cache(block, fences));
        }
    }
}

/// A block set aside ([`State::set_aside`]) for a lend while its stream is
/// looked at without the lock: cached again if dropped before it is
/// settled ([`SetAside::settle`]), so that a panic out of the look (a
/// runtime's query or wait, a tracing subscriber) loses no block.
struct SetAside<'a> {
    state: &'a Mutex<State>,
    found: FreeKey,
    settled: bool,
}

impl<'a> SetAside<'a> {
    /// Sets `found` aside in `locked`, the contents of `state`.
    fn new(state: &'a Mutex<State>, locked: &mut State, found: FreeKey) -> Self {
        locked.set_aside(found);
        Self {
            state,
            found,
            settled: false,
        }
    }

    /// The block, for the caller to hand out or cache again under the
    /// lock it holds.
    fn settle(mut self) -> FreeKey {
        self.settled = true;
        self.found
    }
}

impl Drop for SetAside<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.state
                .lock()
                .release(self.found.segment, self.found.offset);
        }
    }
}

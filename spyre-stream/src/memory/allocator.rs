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
//! - **Recent blocks.** The last [`RECENT_BLOCKS`] blocks freed on their own
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

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use flex_rt::{CompositeAddress, FlexError, MemoryLayout, Runtime, Status};
use parking_lot::{Mutex, MutexGuard};

use crate::error::{Error, OutOfMemory, Result};
use crate::marker::{MarkerEvents, RuntimeEvent};
use crate::memory::reuse_barrier::ReuseBarriers;
use crate::stream::SpyreStream;

/// Every block is a multiple of this many bytes (PyTorch's `kMinBlockSize`).
pub const MIN_BLOCK: u64 = 512;
/// Requests up to this size share [`SMALL_SEGMENT`]s (PyTorch's
/// `kSmallSize`).
pub const SMALL_REQUEST: u64 = 1 << 20;
/// The segment of small requests (PyTorch's `kSmallBuffer`).
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Requests below this size share [`LARGE_SEGMENT`]s (PyTorch's
/// `kMinLargeAlloc`).
pub const LARGE_SEGMENT_LIMIT: u64 = 10 << 20;
/// The segment of requests between [`SMALL_REQUEST`] and
/// [`LARGE_SEGMENT_LIMIT`] (PyTorch's `kLargeBuffer`).
pub const LARGE_SEGMENT: u64 = 20 << 20;
/// A segment is at most this fraction of the device's memory (when the
/// runtime tells its size), so that a small device is not taken by the
/// cached segments of a few streams.
pub const SEGMENTS_PER_DEVICE: u64 = 32;

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
const RECENT_BLOCKS: usize = 16;

/// A block handed out to a buffer.
#[derive(Debug)]
pub(crate) struct Block {
    /// The block's memory: `requested` bytes from the block's start.
    pub(crate) address: CompositeAddress,
    /// The stream whose segment the block is in.
    stream: i64,
    segment: u64,
    offset: u64,
    /// Rounded size, the bytes the block takes in its segment.
    size: u64,
    /// Bytes asked for.
    requested: u64,
    /// The stream the block was lent to, when it is not the segment's own
    /// ([`CachingAllocator::lend_block`]): its free waits for that stream.
    lent_to: Option<SpyreStream>,
    /// Its segment's pool (kept here so that taking the block back as a
    /// recent one looks up no segment).
    pool: Pool,
    /// Whether all `size` bytes lie in one chunk of the segment (then so
    /// does any request it serves; kept for the same reason).
    one_chunk: bool,
}

/// What must happen before a block freed by a buffer that other streams
/// used is cached again: one per such stream.
enum Fence {
    /// A marker event recorded on `stream` when the buffer was dropped; it
    /// goes back to the idle markers with the fence.
    Event {
        event: RuntimeEvent,
        stream: SpyreStream,
    },
    /// No event could be made: the stream must be idle.
    Idle(SpyreStream),
}

impl Fence {
    /// Whether the stream has passed the point of the drop: the event has
    /// completed, or, for a stream without an event (no marker event, or
    /// the record was refused because the stream had already failed), the
    /// stream is idle ([`has_finished_now`]). An event whose record failed
    /// has not: flex.h does not say that the work begun before the failure
    /// has ended (a card may overlap a stream's operations), and neither
    /// does a query that itself failed. Those fences, and those of a stream
    /// that failed or needs shutdown, are passed by a synchronize that saw
    /// the stream's work end (`empty_cache`, or the retry of a full device:
    /// [`State::pass_fences`]).
    fn passed(&self) -> bool {
        match self {
            Fence::Event { event, .. } => matches!(event.query(), Ok(true)),
            Fence::Idle(stream) => has_finished_now(*stream),
        }
    }
}

/// A block freed in other streams' order, not yet cached.
struct Deferred {
    segment: u64,
    offset: u64,
    /// The allocator's free count ([`MemoryStats::frees`]) at its free:
    /// its fences are at points enqueued before that count was reached.
    freed: u64,
    fences: Vec<Fence>,
}

/// One device allocation, cut into blocks.
struct Segment {
    address: CompositeAddress,
    stream: i64,
    /// The pool of the request it was taken for: its blocks serve only
    /// requests of that pool, but on a full device (see the module docs).
    pool: Pool,
    /// The allocator's free count ([`MemoryStats::frees`], which only
    /// grows) at the latest free of one of its blocks (0: none yet): work
    /// that used a block was enqueued before that free.
    last_free: u64,
    /// Kept for the waiting retry under way, wholly free when it began to
    /// wait ([`CachingAllocator::retry_segment`]): no other return gives it
    /// back to the device meanwhile; its own stream may still use it.
    held: bool,
    /// Every block of the segment by offset: its size and whether it is free
    /// (and cached).
    blocks: BTreeMap<u64, Span>,
}

impl Segment {
    /// Whether the segment is one free block (it can go back to the
    /// device).
    fn is_wholly_free(&self) -> bool {
        self.blocks.len() == 1 && self.blocks.values().all(|span| span.free)
    }
}

#[derive(Clone, Copy)]
struct Span {
    size: u64,
    free: bool,
}

/// A cached block, ordered for best fit: by stream, then size.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FreeKey {
    stream: i64,
    size: u64,
    segment: u64,
    offset: u64,
}

/// The segments the allocator holds, by id. Ids are never reused (a
/// deferred block names its segment by id); a segment returned to the
/// device leaves the map, so the map, and every look over it, is as large
/// as the memory held, however many segments came and went before.
#[derive(Default)]
struct Segments {
    by_id: BTreeMap<u64, Segment>,
    next_id: u64,
}

impl Segments {
    fn get(&self, id: u64) -> Option<&Segment> {
        self.by_id.get(&id)
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Segment> {
        self.by_id.get_mut(&id)
    }

    /// Adds `segment` under a fresh id.
    fn push(&mut self, segment: Segment) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.by_id.insert(id, segment);
        id
    }

    fn remove(&mut self, id: u64) -> Option<Segment> {
        self.by_id.remove(&id)
    }

    /// Puts back a segment [`Segments::remove`] took.
    fn restore(&mut self, id: u64, segment: Segment) {
        self.by_id.insert(id, segment);
    }

    /// Whether the `len` bytes at `offset` of segment `id` lie in one of its
    /// chunks (`false` for a segment not in the table).
    fn lie_in_one_chunk(&self, id: u64, offset: u64, len: u64) -> bool {
        self.get(id)
            .is_some_and(|segment| lies_in_one_chunk(&segment.address, offset, len))
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Segment)> {
        self.by_id.iter().map(|(&id, segment)| (id, segment))
    }

    /// Marks every wholly free segment held ([`Segment::held`]); merge the
    /// recent blocks first. Returns their streams.
    fn hold_wholly_free(&mut self) -> BTreeSet<i64> {
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
    fn release_held(&mut self) {
        for segment in self.by_id.values_mut() {
            segment.held = false;
        }
    }

    /// How many segments are held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[derive(Default)]
struct State {
    segments: Segments,
    free: BTreeSet<FreeKey>,
    /// Blocks freed on their own stream, oldest first, still marked in use
    /// in their segments: cached, but not yet merged.
    recent: VecDeque<Block>,
    deferred: Vec<Deferred>,
    stats: MemoryStats,
    /// Segments between the device and `segments`: allocated and not yet
    /// added, or taken out to go back to the device and not yet freed (or
    /// put back). Still the allocator's for [`CachingAllocator::free_raw`].
    in_transit: Vec<CompositeAddress>,
}

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

/// The two pools of cached blocks (PyTorch's small and large pools): a
/// request of up to [`SMALL_REQUEST`] bytes is served from the segments
/// taken for such requests, a larger one from the others, so that a small
/// buffer is not cut from a large segment and keeps it from going back to
/// the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Small,
    Large,
}

impl Pool {
    /// The pool of a request of `rounded` bytes.
    fn of(rounded: u64) -> Self {
        if rounded <= SMALL_REQUEST {
            Self::Small
        } else {
            Self::Large
        }
    }
}

/// Which cached blocks of a stream [`State::take_cached`] looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Serving {
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
/// chunks: by [`CachingAllocator::allocate_segment`] and
/// [`State::take_cached`]; [`State::lendable`] prefers one chunk with
/// [`Pieces::Refuse`] but still lends one in several.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pieces {
    /// No: the cache is returned first (its segments fragment the memory).
    Refuse,
    /// Yes: a buffer in several chunks still serves copies and fills.
    Accept,
}

/// What [`CachingAllocator::wait_for_streams`] found: the streams whose
/// wholly free segments may go back to the device although they are not
/// idle now. The default is no wait: only streams idle now
/// ([`has_finished_now`]) have their segments returned.
#[derive(Default)]
struct Finished<'a> {
    /// Streams a synchronize found failed: everything they ran has ended,
    /// and they take no more work.
    failed_and_done: BTreeSet<i64>,
    /// Streams a synchronize waited for: a segment of theirs whose blocks
    /// were all freed by [`Finished::frees_before_waiting`] was used only
    /// by work enqueued before the wait, which has ended, whatever the
    /// stream was given since.
    waited: BTreeSet<i64>,
    /// The free count ([`MemoryStats::frees`]) before the wait began.
    frees_before_waiting: u64,
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

/// `bytes` rounded up to [`MIN_BLOCK`].
///
/// # Errors
/// [`Error::Flex`] (`INVALID_ARGUMENT`) for 0 bytes or a size that
/// overflows.
pub(crate) fn round_request(bytes: u64) -> Result<u64> {
    if bytes == 0 {
        return Err(FlexError::invalid_argument(
            "DeviceBuffer",
            "a device buffer needs at least one byte, got 0",
        )
        .into());
    }
    bytes.checked_next_multiple_of(MIN_BLOCK).ok_or_else(|| {
        FlexError::invalid_argument(
            "DeviceBuffer",
            format!(
                "{bytes} bytes cannot be allocated: the size overflows when rounded to {MIN_BLOCK}"
            ),
        )
        .into()
    })
}

/// The segment to take from the device for a request of `rounded` bytes:
/// the standard size, at most `cap` (but never less than the request).
fn segment_size(rounded: u64, cap: u64) -> u64 {
    let standard = if rounded <= SMALL_REQUEST {
        SMALL_SEGMENT
    } else if rounded < LARGE_SEGMENT_LIMIT {
        LARGE_SEGMENT
    } else {
        rounded
            .checked_next_multiple_of(SMALL_SEGMENT)
            .unwrap_or(rounded)
    };
    standard.min(cap).max(rounded)
}

/// The largest segment worth taking on a device of `layout` (or of
/// `total` bytes when only that is known): one region, so that a segment
/// (and every block in it) lies in one chunk, as a kernel operand must;
/// and 1/[`SEGMENTS_PER_DEVICE`] of the memory, so that a few streams'
/// segments do not take a small device. A multiple of [`MIN_BLOCK`];
/// `u64::MAX` when the runtime tells neither.
fn segment_cap(region: Option<u64>, total: Option<u64>) -> u64 {
    let by_region = region.unwrap_or(u64::MAX);
    let by_memory = total.map_or(u64::MAX, |total| total / SEGMENTS_PER_DEVICE);
    let cap = by_region.min(by_memory) / MIN_BLOCK * MIN_BLOCK;
    cap.max(MIN_BLOCK)
}

/// The segment the caching allocator takes from a device of `layout` for a
/// buffer of `bytes` bytes, in bytes: the standard size for the request
/// (see the module docs), at most a region and 1/[`SEGMENTS_PER_DEVICE`]
/// of the memory, never less than the request rounded up to
/// [`MIN_BLOCK`]. (Where the device cannot give it, the allocator takes the
/// request's own size.) 0 for 0 bytes or a size that overflows when
/// rounded. Pure: reads nothing of a runtime.
pub fn segment_bytes(layout: MemoryLayout, bytes: u64) -> u64 {
    let Ok(rounded) = round_request(bytes) else {
        return 0;
    };
    segment_size(
        rounded,
        segment_cap(Some(layout.region_bytes), Some(layout.total_bytes)),
    )
}

/// How many buffers of `bytes` bytes each the caching allocator holds at
/// once on a device of `layout`, every buffer in one chunk (as a kernel
/// operand must), when all its buffers have that size: in each region, the
/// standard segments it takes from the device for such a request, each
/// holding as many whole blocks (`bytes` rounded up to [`MIN_BLOCK`]) as
/// fit, and in what is left of the region, blocks of their own size (what
/// the allocator takes when the device cannot give a whole segment). 0 when
/// `bytes` is 0 or its block is larger than a region.
///
/// Fewer than [`MemoryLayout::blocks_held`] gives where a segment is not a
/// multiple of the block: on the software device's default 1 GiB, a
/// request of 349 526 bytes makes 5 blocks of 349 696 bytes per 2 MiB
/// segment, 2 560 in all, where the regions alone would hold 3 068. A
/// bound for one stream's buffers; streams that each keep a partly used
/// segment may hold fewer, though a full device lends the cached blocks of
/// idle streams, and, where it waits on the device side, of busy ones
/// (see the module docs). Pure: reads nothing of a runtime.
pub fn allocations_held(layout: MemoryLayout, bytes: u64) -> u64 {
    let MemoryLayout {
        total_bytes: total,
        region_bytes: region,
    } = layout;
    let Ok(rounded) = round_request(bytes) else {
        return 0;
    };
    if region == 0 || rounded > region {
        return 0;
    }
    let segment = segment_bytes(layout, bytes);
    let per_region = |bytes: u64| bytes / segment * (segment / rounded) + bytes % segment / rounded;
    (total / region).saturating_mul(per_region(region)) + per_region(total % region)
}

/// Whether a free block with `rest` bytes left over a request of
/// `rounded` bytes is split (PyTorch's `should_split`).
fn should_split(rounded: u64, rest: u64) -> bool {
    if rounded <= SMALL_REQUEST {
        rest >= MIN_BLOCK
    } else {
        rest > SMALL_REQUEST
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
                    state.set_aside(found);
                    found
                };
                // No lock is held: a failed stream's synchronize may wait.
                let owner = self.stream(candidate.stream);
                let ordered =
                    has_finished_or_failed(owner) || (waits && stream.wait_stream(owner).is_ok());
                let mut state = self.state.lock();
                if ordered {
                    let mut block = state.hand_out(candidate, rounded, requested)?;
                    block.lent_to = Some(stream);
                    return Ok(Some(block));
                }
                state.release(candidate.segment, candidate.offset);
                passed_over.insert(candidate.stream);
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
                if let Err(error) = &freed {
                    tracing::warn!(%error, "the device refused to free a segment that came in {chunks} chunks; it is forgotten");
                }
                let mut state = self.state.lock();
                state.stats.device_frees += u64::from(freed.is_ok());
                state.arrived(&segment);
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
        let fences: Vec<Fence> = if users.is_empty() && block.lent_to.is_none() {
            // The common case, without an iterator chain to collect.
            Vec::new()
        } else {
            users
                .iter()
                .chain(block.lent_to.as_ref())
                .map(|&stream| self.fence(stream))
                .collect()
        };
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
            state.collect_deferred();
        }
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
            finished.frees_before_waiting = state.stats.frees;
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
                    finished.waited.insert(id);
                }
                Err(Error::Flex(error))
                    if is_stream_failure(&error) && synchronize_finds_failed(stream) =>
                {
                    finished.failed_and_done.insert(id);
                }
                Err(_) => {}
            }
        }
        // Blocks waiting for a failed stream (to be idle, which it never
        // will be, or for an event that failed) are free of it now, and so
        // are blocks freed before the wait that wait for a stream it waited
        // for (which may be busy again).
        self.state.lock().pass_fences(&finished);
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
        let mut by_stream: BTreeMap<i64, Vec<(u64, Segment)>> = BTreeMap::new();
        for (id, segment) in released {
            by_stream
                .entry(segment.stream)
                .or_default()
                .push((id, segment));
        }
        let mut returned = Returned::default();
        for (stream_id, segments) in by_stream {
            let done = finished.failed_and_done.contains(&stream_id)
                || has_finished_now(self.stream(stream_id));
            let (returning, keeping): (Vec<_>, Vec<_>) =
                segments.into_iter().partition(|(_, segment)| {
                    done || (finished.waited.contains(&stream_id)
                        && segment.last_free <= finished.frees_before_waiting)
                });
            if !keeping.is_empty() {
                returned.kept_busy = true;
                let mut state = self.state.lock();
                for (id, segment) in keeping {
                    state.restore_segment(id, segment);
                }
            }
            for (_, segment) in returning {
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
                        drop(state);
                        tracing::warn!(%error, "the device failed to free a cached segment; it is forgotten");
                    }
                }
            }
        }
        returned
    }

    /// Frees `address`, memory allocated from the runtime directly, unless
    /// it is the whole of a segment the allocator holds (in use by
    /// buffers, cached, or on its way from or back to the device): freeing
    /// that would pull memory from under its buffers, or have the allocator
    /// free memory handed out again later.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the address for a segment of the
    /// allocator (nothing is freed); the runtime's error.
    pub(crate) fn free_raw(&self, address: &CompositeAddress) -> Result<()> {
        let _transit = self.transit.lock();
        let owned = {
            let state = self.state.lock();
            state.in_transit.contains(address)
                || state
                    .segments
                    .iter()
                    .any(|(_, segment)| segment.address == *address)
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
        SpyreStream::from_parts(self.runtime.logical_device() as u8, crate::StreamId(id))
    }

    /// Starts the peaks again from the current values.
    pub(crate) fn reset_peaks(&self) {
        let mut state = self.state.lock();
        state.stats.peak_allocated_bytes = state.stats.allocated_bytes;
        state.stats.peak_reserved_bytes = state.stats.reserved_bytes;
    }
}

/// Whether a synchronize of `stream` returned the stream's own failure
/// (see [`is_stream_failure`]): everything enqueued before the call has
/// ended, and the stream takes no more work.
fn synchronize_finds_failed(stream: SpyreStream) -> bool {
    matches!(stream.synchronize(), Err(Error::Flex(error)) if is_stream_failure(&error))
}

/// Whether `stream` has no work left that could touch its memory, now,
/// without waiting: whether it is idle. A stream that has failed is not:
/// flex.h does not say that the work begun before a failure has ended when
/// a query reports it (a card that overlaps a stream's operations may still
/// run one), nor does a stream that needs shutdown (reported at once, while
/// the operation it was running goes on). Only a synchronize, which waits
/// for that work, tells ([`synchronize_finds_failed`]). `false` too while
/// it has work, when the query failed as a call, or when the stream cannot
/// be reached.
fn has_finished_now(stream: SpyreStream) -> bool {
    matches!(stream.query(), Ok(true))
}

/// Whether `stream` has no work left that could touch its memory, waiting
/// only for the work a failed stream began before its failure: it is idle
/// now ([`has_finished_now`]), or its query reports its failure (not a
/// shutdown, whose running operation may go on for long) and a synchronize
/// made after that returns the failure too ([`synchronize_finds_failed`]):
/// the stream took no work after the query, and the synchronize waited for
/// the rest. Call holding no lock of the allocator. From a host callback of
/// the device the synchronize is refused, and a failed stream counts as
/// busy.
fn has_finished_or_failed(stream: SpyreStream) -> bool {
    match stream.query() {
        Ok(idle) => idle,
        Err(Error::Flex(error)) => {
            is_stream_failure(&error)
                && error.status() != Status::SHUTDOWN
                && synchronize_finds_failed(stream)
        }
        Err(_) => false,
    }
}

/// Whether `len` bytes from `offset` of `address` lie in one of its
/// chunks.
fn lies_in_one_chunk(address: &CompositeAddress, offset: u64, len: u64) -> bool {
    let mut start = 0;
    for chunk in address.chunks() {
        let end = start + chunk.size;
        if offset < end {
            return offset + len <= end;
        }
        start = end;
    }
    false
}

/// Whether `error`, from a query or synchronize of a stream, is the
/// stream's own failure (after which it takes no more work; only a
/// synchronize that returns it says that the work enqueued before the call
/// has ended): an operation's failure
/// (`EXECUTION_FAILED`, `HOST_CALLBACK_FAILED`, `OUT_OF_MEMORY`), a wait on
/// a failed event (`STREAM_FAILED`), a stream that needs shutdown
/// (`SHUTDOWN`). Anything else is the call failing (an invalid handle, an
/// unsupported call, an internal error, a status flex.h does not define)
/// and says nothing of where the stream is: memory it may still use is not
/// handed out again on its word. (So a stream whose operation failed with
/// `INTERNAL`, the software device's own fault, keeps its cached memory:
/// the two cannot be told apart.)
fn is_stream_failure(error: &FlexError) -> bool {
    [
        Status::EXECUTION_FAILED,
        Status::HOST_CALLBACK_FAILED,
        Status::OUT_OF_MEMORY,
        Status::STREAM_FAILED,
        Status::SHUTDOWN,
    ]
    .contains(&error.status())
}

impl State {
    /// Caches again every deferred block whose streams have all passed the
    /// point of its drop.
    fn collect_deferred(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        let deferred = std::mem::take(&mut self.deferred);
        for entry in deferred {
            if entry.fences.iter().all(Fence::passed) {
                self.stats.pending_frees -= 1;
                self.release(entry.segment, entry.offset);
            } else {
                self.deferred.push(entry);
            }
        }
    }

    /// The newest recent block of `stream` that serves `rounded` bytes
    /// without a split (the block [`State::take`] would hand out whole).
    /// With [`Pieces::Refuse`], only a block whose front `rounded` bytes
    /// lie in one chunk.
    fn take_recent(
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
    fn keep_recent(&mut self, block: Block) {
        if self.recent.len() == RECENT_BLOCKS
            && let Some(oldest) = self.recent.pop_front()
        {
            self.release(oldest.segment, oldest.offset);
        }
        self.recent.push_back(block);
    }

    /// Merges the recent blocks of `stream` (of every stream for `None`)
    /// into the cache.
    fn merge_recent(&mut self, stream: Option<i64>) {
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
    fn count_allocation(&mut self, size: u64, requested: u64) {
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
    fn take_cached(
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

    /// The cached block [`CachingAllocator::lend_block`] would lend for
    /// `rounded` bytes to stream `borrower`: the smallest one large enough
    /// of a stream other than `borrower` and those in `passed_over`,
    /// outside the segments held for a waiting retry; where `pieces`
    /// refuses several chunks, one whose front `rounded` bytes lie in one
    /// chunk first, and with `one_chunk_only` no other.
    fn lendable(
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
    fn set_aside(&mut self, found: FreeKey) {
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
    fn largest_cached(&self) -> u64 {
        let free = self.free.iter().map(|key| key.size);
        let deferred = self.deferred.iter().filter_map(|entry| {
            let segment = self.segments.get(entry.segment)?;
            Some(segment.blocks.get(&entry.offset)?.size)
        });
        free.chain(deferred).max().unwrap_or(0)
    }

    /// The streams deferred blocks wait for (to pass their event, or to
    /// be idle), and the streams owning their segments.
    fn pending_free_streams(&self) -> BTreeSet<i64> {
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
    fn pass_fences(&mut self, finished: &Finished<'_>) {
        for entry in &mut self.deferred {
            let freed_before = entry.freed <= finished.frees_before_waiting;
            entry.fences.retain(|fence| {
                let (Fence::Event { stream, .. } | Fence::Idle(stream)) = fence;
                let id = stream.id().get();
                !(finished.failed_and_done.contains(&id)
                    || freed_before && finished.waited.contains(&id))
            });
        }
        self.collect_deferred();
    }

    /// The streams owning a segment that is one free block.
    fn free_segment_owners(&mut self) -> BTreeSet<i64> {
        self.merge_recent(None);
        self.segments
            .iter()
            .filter(|(_, segment)| segment.is_wholly_free())
            .map(|(_, segment)| segment.stream)
            .collect()
    }

    /// Hands out the cached block `found` for `rounded` bytes, split if
    /// the rest is worth keeping.
    fn take(&mut self, found: FreeKey, rounded: u64, requested: u64) -> Result<Block> {
        self.set_aside(found);
        self.hand_out(found, rounded, requested)
    }

    /// Hands out the block `found`, set aside ([`State::set_aside`]), for
    /// `rounded` bytes, split if the rest is worth keeping: the rest is
    /// cached again, merged with a free block after it (one freed while
    /// the block was set aside; the block handed out is not merged with
    /// anything).
    fn hand_out(&mut self, found: FreeKey, rounded: u64, requested: u64) -> Result<Block> {
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
    fn arrived(&mut self, address: &CompositeAddress) {
        if let Some(at) = self.in_transit.iter().position(|a| a == address) {
            self.in_transit.swap_remove(at);
        }
    }

    /// Adds a segment from the device for `stream`, in `pool`, all of it
    /// one free block, and returns that block.
    fn add_segment(&mut self, address: CompositeAddress, stream: i64, pool: Pool) -> FreeKey {
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
    fn release(&mut self, segment_id: u64, offset: u64) {
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
    fn take_free_segments(&mut self, include_held: bool) -> Vec<(u64, Segment)> {
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
    fn restore_segment(&mut self, id: u64, segment: Segment) {
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

    #[test]
    fn allocations_held_counts_blocks_per_segment_and_segments_per_region() {
        let layout = |total_bytes, region_bytes| MemoryLayout {
            total_bytes,
            region_bytes,
        };
        // 1 GiB in regions of 256 MiB (the software device's default):
        // 349 526 bytes round to 349 696; a 2 MiB segment holds 5 of them
        // (1 748 480 bytes), a region 128 segments: 4 × 128 × 5.
        assert_eq!(allocations_held(layout(1 << 30, 256 << 20), 349_526), 2_560);
        // 128 bytes round to 512: 4 096 per 2 MiB segment, the whole GiB.
        assert_eq!(allocations_held(layout(1 << 30, 256 << 20), 128), 2_097_152);
        // 100 MiB requests get segments of their own size: 2 per region.
        assert_eq!(allocations_held(layout(1 << 30, 256 << 20), 100 << 20), 8);
        // 80 MiB in regions of 5 MiB (segments capped at 2.5 MiB, so 2 MiB
        // ones): 600 000 bytes round to 600 064; 3 per segment, 2 segments
        // per region, and the region's last 1 MiB holds 1 more: 16 × 7.
        assert_eq!(allocations_held(layout(80 << 20, 5 << 20), 600_000), 112);
        // A last, smaller region: 3 MiB more hold 1 segment (3) and 1 MiB (1).
        assert_eq!(allocations_held(layout(83 << 20, 5 << 20), 600_000), 116);
        // A small device caps segments at 1/32 of it (128 KiB of 4 MiB):
        // the request's own size, 11 per 4 MiB region.
        assert_eq!(allocations_held(layout(4 << 20, 4 << 20), 349_526), 11);
        assert_eq!(allocations_held(layout(1 << 30, 256 << 20), 0), 0);
        // Segments: 2 MiB for small requests, capped at 1/32 of the device
        // (384 KiB of 12 MiB), never below the request.
        assert_eq!(segment_bytes(layout(1 << 30, 256 << 20), 128), 2 << 20);
        assert_eq!(segment_bytes(layout(12 << 20, 12 << 20), 128), 384 << 10);
        assert_eq!(segment_bytes(layout(12 << 20, 12 << 20), 1 << 20), 1 << 20);
        assert_eq!(segment_bytes(layout(1 << 30, 256 << 20), 3 << 20), 20 << 20);
        assert_eq!(segment_bytes(layout(1 << 30, 256 << 20), 0), 0);
        assert_eq!(
            allocations_held(layout(1 << 30, 256 << 20), (256 << 20) + 1),
            0
        );
    }

    #[test]
    fn a_range_lies_in_one_chunk_only_if_no_boundary_cuts_it() {
        let chunk = |region_id, size| flex_rt::AddressChunk {
            address: flex_rt::LogicalAddress {
                region_id,
                offset: 0,
            },
            size,
        };
        let two = CompositeAddress::new(vec![chunk(0, 1024), chunk(1, 1024)]).unwrap();
        assert!(lies_in_one_chunk(&two, 0, 1024));
        assert!(lies_in_one_chunk(&two, 1024, 1024));
        assert!(!lies_in_one_chunk(&two, 512, 1024), "cut at 1024");
        assert!(!lies_in_one_chunk(&two, 1024, 1536), "past the end");
        assert!(!lies_in_one_chunk(&two, 2048, 512), "outside");
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

//! How the caching allocator sizes what it holds: requests rounded to
//! blocks, the two pools, the segment taken from the device for a request,
//! when a free block is split, and whether a range of a segment lies in one
//! chunk. Pure: nothing here calls a runtime.

use flex_rt::{CompositeAddress, FlexError, MemoryLayout};

use crate::error::Result;

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

/// The two pools of cached blocks (PyTorch's small and large pools): a
/// request of up to [`SMALL_REQUEST`] bytes is served from the segments
/// taken for such requests, a larger one from the others, so that a small
/// buffer is not cut from a large segment and keeps it from going back to
/// the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pool {
    Small,
    Large,
}

impl Pool {
    /// The pool of a request of `rounded` bytes.
    pub(super) fn of(rounded: u64) -> Self {
        if rounded <= SMALL_REQUEST {
            Self::Small
        } else {
            Self::Large
        }
    }
}

/// `bytes` rounded up to [`MIN_BLOCK`].
///
/// # Errors
/// [`crate::Error::Flex`] (`INVALID_ARGUMENT`) for 0 bytes or a size that
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
pub(super) fn segment_size(rounded: u64, cap: u64) -> u64 {
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
pub(super) fn segment_cap(region: Option<u64>, total: Option<u64>) -> u64 {
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
pub(super) fn should_split(rounded: u64, rest: u64) -> bool {
    if rounded <= SMALL_REQUEST {
        rest >= MIN_BLOCK
    } else {
        rest > SMALL_REQUEST
    }
}

/// Whether `len` bytes from `offset` of `address` lie in one of its
/// chunks.
pub(super) fn lies_in_one_chunk(address: &CompositeAddress, offset: u64, len: u64) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

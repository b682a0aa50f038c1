//! Device memory of one runtime: lazily backed regions, a first-fit
//! allocator of 128-byte aligned chunks, and checked access for operations.
//!
//! Memory is split into regions of `region_bytes` (the last one may be
//! smaller); a region's `region_id` is its index. A region holds no host
//! memory until an operation first writes it; then it becomes a
//! `vec![0u8; size]`, which the allocator gets zeroed from the OS, so pages
//! are mapped only when touched. Reading a region never written gives zeros.
//!
//! Allocation sizes are rounded up to whole 128-byte units internally; the
//! chunks returned carry the exact sizes. An allocation goes into the first
//! free range that holds it whole; if none does, it is spread over free
//! ranges in address order, one chunk per range, at most
//! [`MAX_ADDRESS_CHUNKS`] chunks.
//!
//! Operations access memory through a [`MemoryView`], which holds the
//! allocation table for reading: every address is checked to lie inside a
//! live allocated chunk before any byte moves, and a concurrent `free` waits
//! until the operation is done, so no operation ever touches memory outside
//! a live allocation.
use std::collections::{BTreeMap, HashMap};

use crate::sync::{RwLock, RwLockReadGuard};
use flex_rt::{
    ADDRESS_ALIGNMENT, AddressChunk, CompositeAddress, FlexError, LogicalAddress,
    MAX_ADDRESS_CHUNKS, MemoryLayout, Result, Status,
};

use crate::config::MockConfig;

/// What [`crate::MockRuntime::allocate_at_most`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundedAllocation {
    /// The allocation, in at most the chunks allowed.
    Allocated(CompositeAddress),
    /// The placement would take this many chunks, more than allowed:
    /// nothing was allocated.
    NeedsChunks(usize),
}

/// One region of device memory.
struct Region {
    size: usize,
    /// Empty until first written, then exactly `size` bytes.
    data: RwLock<Vec<u8>>,
}

/// A chunk of a live allocation.
#[derive(Clone, Copy, Debug)]
struct LiveChunk {
    /// Exact size, as returned to the caller.
    size: u64,
    /// Size taken from the free list (a multiple of 128).
    reserved: u64,
}

/// Key of a range of memory: (region id, offset).
type Key = (u32, u64);

#[derive(Default)]
struct Allocations {
    /// Free ranges: start → length; adjacent ranges are merged.
    free: BTreeMap<Key, u64>,
    /// Chunks of live allocations by their start.
    live: BTreeMap<Key, LiveChunk>,
    /// Live allocations by the start of their first chunk.
    by_start: HashMap<LogicalAddress, CompositeAddress>,
    free_bytes: u64,
}

impl Allocations {
    fn insert_free(&mut self, (region, mut offset): Key, mut len: u64) {
        if let Some((&(prev_region, prev_offset), &prev_len)) =
            self.free.range(..(region, offset)).next_back()
            && prev_region == region
            && prev_offset + prev_len == offset
        {
            self.free.remove(&(prev_region, prev_offset));
            offset = prev_offset;
            len += prev_len;
        }
        if let Some(next_len) = self.free.remove(&(region, offset + len)) {
            len += next_len;
        }
        self.free.insert((region, offset), len);
    }
}

/// The device memory of one runtime. Thread-safe: allocation takes the
/// allocation table for writing, operations take it for reading.
pub(crate) struct DeviceMemory {
    capacity: u64,
    region_bytes: u64,
    regions: Vec<Region>,
    allocs: RwLock<Allocations>,
}

/// A validated contiguous range inside one region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    region: usize,
    start: usize,
    len: usize,
}

impl Span {
    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

fn round_up(size: u64) -> Option<u64> {
    size.checked_next_multiple_of(ADDRESS_ALIGNMENT)
}

impl DeviceMemory {
    /// Empty memory of `config.memory_bytes()` in regions of
    /// `config.region_bytes()`; no host memory is taken yet.
    pub(crate) fn new(config: &MockConfig) -> Self {
        let capacity = config.memory_bytes();
        let region_bytes = config.region_bytes();
        let mut regions = Vec::new();
        let mut allocs = Allocations {
            free_bytes: capacity,
            ..Allocations::default()
        };
        let mut start = 0u64;
        let mut id = 0u32;
        while start < capacity {
            let size = region_bytes.min(capacity - start);
            // The builder checked that regions fit `usize` and that there
            // are at most MAX_REGIONS of them.
            regions.push(Region {
                size: usize::try_from(size).unwrap_or(0),
                data: RwLock::new(Vec::new()),
            });
            allocs.free.insert((id, 0), size);
            start += size;
            id += 1;
        }
        Self {
            capacity,
            region_bytes,
            regions,
            allocs: RwLock::new(allocs),
        }
    }

    /// The memory's size and region size.
    pub(crate) fn layout(&self) -> MemoryLayout {
        MemoryLayout {
            total_bytes: self.capacity,
            region_bytes: self.region_bytes,
        }
    }

    /// Total device memory in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes not taken by live allocations (counted in 128-byte units).
    pub(crate) fn free_bytes(&self) -> u64 {
        self.allocs.read().free_bytes
    }

    /// Number of regions that hold host memory (have been written).
    pub(crate) fn backed_regions(&self) -> usize {
        self.regions
            .iter()
            .filter(|r| !r.data.read().is_empty())
            .count()
    }

    /// Allocates `size` bytes; see the module docs for the placement rule.
    pub(crate) fn allocate(&self, size: u64) -> Result<CompositeAddress> {
        match self.allocate_at_most(size, MAX_ADDRESS_CHUNKS)? {
            BoundedAllocation::Allocated(address) => Ok(address),
            // The placement never takes more chunks than an address holds.
            BoundedAllocation::NeedsChunks(chunks) => Err(FlexError::new(
                Status::INTERNAL,
                "allocate",
                format!("the placement took {chunks} chunks, more than {MAX_ADDRESS_CHUNKS}"),
            )),
        }
    }

    /// Allocates `size` bytes in at most `max_chunks` chunks; where the
    /// placement rule would take more, allocates nothing and says how many
    /// (in one step: a caller that only asks never holds memory another
    /// allocation could have had).
    pub(crate) fn allocate_at_most(
        &self,
        size: u64,
        max_chunks: usize,
    ) -> Result<BoundedAllocation> {
        const CALL: &str = "allocate";
        if size == 0 {
            return Err(FlexError::invalid_argument(
                CALL,
                "allocation size must be at least 1 byte, got 0",
            ));
        }
        let mut allocs = self.allocs.write();
        let free = allocs.free_bytes;
        let out_of_memory = |detail: &str| {
            FlexError::new(
                Status::OUT_OF_MEMORY,
                CALL,
                format!(
                    "cannot allocate {size} bytes: {free} of {} bytes of device memory are free{detail}",
                    self.capacity
                ),
            )
        };
        let Some(rounded) = round_up(size).filter(|&r| r <= free) else {
            return Err(out_of_memory(""));
        };
        // (start of a free range, bytes taken from it)
        let mut pieces: Vec<(Key, u64)> = Vec::new();
        if let Some((&key, _)) = allocs.free.iter().find(|&(_, &len)| len >= rounded) {
            pieces.push((key, rounded));
        } else {
            let mut need = rounded;
            for (&key, &len) in &allocs.free {
                if pieces.len() == MAX_ADDRESS_CHUNKS {
                    break;
                }
                let take = len.min(need);
                pieces.push((key, take));
                need -= take;
                if need == 0 {
                    break;
                }
            }
            if need > 0 {
                // A range never crosses a region: small regions make many
                // ranges of an empty device too.
                let longest = allocs.free.values().copied().max().unwrap_or(0);
                // The ranges the placement walked: whole regions (then
                // only larger regions help), or split by live allocations.
                let whole_regions = pieces
                    .iter()
                    .all(|(key, _)| allocs.free.get(key).copied() == Some(self.region_bytes));
                let why = if whole_regions {
                    format!(
                        "the free ranges are whole regions of {} bytes: larger regions (SPYRE_MOCK_REGION_BYTES) make fewer",
                        self.region_bytes
                    )
                } else {
                    "live allocations split them: freeing memory beside them makes them longer"
                        .to_owned()
                };
                return Err(out_of_memory(&format!(
                    ", but in more than {MAX_ADDRESS_CHUNKS} free ranges (an allocation takes at most {MAX_ADDRESS_CHUNKS} chunks), the longest {longest} bytes; {why}"
                )));
            }
        }
        if pieces.len() > max_chunks {
            return Ok(BoundedAllocation::NeedsChunks(pieces.len()));
        }
        let mut chunks = Vec::with_capacity(pieces.len());
        let mut remaining = size;
        for &((region, offset), take) in &pieces {
            let len = allocs.free.remove(&(region, offset)).unwrap_or(take);
            if len > take {
                allocs.free.insert((region, offset + take), len - take);
            }
            let exact = take.min(remaining);
            remaining -= exact;
            allocs.live.insert(
                (region, offset),
                LiveChunk {
                    size: exact,
                    reserved: take,
                },
            );
            chunks.push(AddressChunk {
                address: LogicalAddress {
                    region_id: region,
                    offset,
                },
                size: exact,
            });
        }
        allocs.free_bytes -= rounded;
        let address = CompositeAddress::new(chunks)?;
        allocs.by_start.insert(address.start(), address.clone());
        // Logged with the table unlocked: a subscriber may be slow.
        drop(allocs);
        tracing::trace!(%address, size, "allocated device memory");
        Ok(BoundedAllocation::Allocated(address))
    }

    /// Frees an allocation given exactly the address `allocate` returned.
    pub(crate) fn free(&self, address: &CompositeAddress) -> Result<()> {
        let mut allocs = self.allocs.write();
        if allocs.by_start.get(&address.start()) != Some(address) {
            return Err(FlexError::invalid_argument(
                "free",
                format!(
                    "{address} is not a live allocation of this runtime; free takes exactly the address that allocate returned, once"
                ),
            ));
        }
        allocs.by_start.remove(&address.start());
        for chunk in address.chunks() {
            let key = (chunk.address.region_id, chunk.address.offset);
            if let Some(live) = allocs.live.remove(&key) {
                allocs.free_bytes += live.reserved;
                allocs.insert_free(key, live.reserved);
            }
        }
        drop(allocs);
        tracing::trace!(%address, "freed device memory");
        Ok(())
    }

    /// A view for one operation: holds the allocation table for reading
    /// until dropped. Take at most one view per thread at a time.
    pub(crate) fn view(&self) -> MemoryView<'_> {
        MemoryView {
            memory: self,
            allocs: self.allocs.read(),
        }
    }
}

/// Checked access to device memory for one operation; see the module docs.
pub(crate) struct MemoryView<'a> {
    memory: &'a DeviceMemory,
    allocs: RwLockReadGuard<'a, Allocations>,
}

impl MemoryView<'_> {
    /// The span of `len` bytes at `at`, which must lie inside one chunk of a
    /// live allocation. `what` names the range in the error.
    pub(crate) fn span(
        &self,
        at: LogicalAddress,
        len: u64,
        what: &dyn std::fmt::Display,
    ) -> Result<Span, String> {
        let outside = || {
            format!(
                "{what} (region {} +{}, {len} bytes) is not inside a live allocation of this runtime: never allocated, freed, or past the end of one allocated chunk",
                at.region_id, at.offset
            )
        };
        let (&(region, chunk_offset), chunk) = self
            .allocs
            .live
            .range(..=(at.region_id, at.offset))
            .next_back()
            .ok_or_else(outside)?;
        let end = at.offset.checked_add(len).ok_or_else(outside)?;
        if region != at.region_id || end > chunk_offset + chunk.size {
            return Err(outside());
        }
        let region = usize::try_from(region).map_err(|_| outside())?;
        let start = usize::try_from(at.offset).map_err(|_| outside())?;
        let len = usize::try_from(len).map_err(|_| outside())?;
        Ok(Span { region, start, len })
    }

    /// The spans of every chunk of `address`, each checked as [`Self::span`].
    pub(crate) fn spans(&self, address: &CompositeAddress) -> Result<Vec<Span>, String> {
        address
            .chunks()
            .iter()
            .enumerate()
            .map(|(index, chunk)| {
                self.span(
                    chunk.address,
                    chunk.size,
                    &format_args!("chunk {index} of device address {address}"),
                )
            })
            .collect()
    }

    fn region(&self, span: &Span) -> Option<&Region> {
        self.memory.regions.get(span.region)
    }

    /// Copies the bytes of `spans`, in order, into `out` until `out` is full.
    pub(crate) fn read(&self, spans: &[Span], out: &mut [u8]) {
        let mut pos = 0;
        for span in spans {
            let Some(region) = self.region(span) else {
                continue;
            };
            let n = span.len.min(out.len() - pos);
            let dst = &mut out[pos..pos + n];
            let data = region.data.read();
            match data.get(span.start..span.start + n) {
                Some(src) => dst.copy_from_slice(src),
                None => dst.fill(0),
            }
            pos += n;
            if pos == out.len() {
                break;
            }
        }
    }

    /// Writes `data`, in order, into `spans` until `data` runs out.
    ///
    /// # Errors
    /// When a region written for the first time cannot be backed with host
    /// memory (see [`back`]); the spans before it were written.
    pub(crate) fn write(&self, spans: &[Span], data: &[u8]) -> Result<(), String> {
        let mut pos = 0;
        for span in spans {
            let Some(region) = self.region(span) else {
                continue;
            };
            let n = span.len.min(data.len() - pos);
            let mut bytes = region.data.write();
            back(&mut bytes, region.size, span.region)?;
            if let Some(dst) = bytes.get_mut(span.start..span.start + n) {
                dst.copy_from_slice(&data[pos..pos + n]);
            }
            pos += n;
            if pos == data.len() {
                break;
            }
        }
        Ok(())
    }

    /// Fills `spans` with `pattern` repeated; the pattern runs on across
    /// span boundaries as if the spans were one buffer.
    ///
    /// # Errors
    /// As [`Self::write`].
    pub(crate) fn fill(&self, spans: &[Span], pattern: &[u8]) -> Result<(), String> {
        if pattern.is_empty() {
            return Ok(());
        }
        let mut phase = 0;
        for span in spans {
            let Some(region) = self.region(span) else {
                continue;
            };
            let mut bytes = region.data.write();
            back(&mut bytes, region.size, span.region)?;
            if let Some(dst) = bytes.get_mut(span.start..span.start + span.len) {
                let mut rotated = pattern.to_vec();
                rotated.rotate_left(phase);
                let mut pieces = dst.chunks_exact_mut(rotated.len());
                for piece in &mut pieces {
                    piece.copy_from_slice(&rotated);
                }
                let tail = pieces.into_remainder();
                let tail_len = tail.len();
                tail.copy_from_slice(&rotated[..tail_len]);
            }
            phase = (phase + span.len) % pattern.len();
        }
        Ok(())
    }
}

/// Gives a region its host memory the first time it is written: `size`
/// zeroed bytes (the OS maps the pages on first touch). Refuses, instead of
/// aborting the process in the allocator, a region larger than the host
/// memory available now (`MemAvailable` in `/proc/meminfo`, where it can
/// be read), or one the allocator refuses (a limit on the process's
/// address space, say). A region already backed costs nothing: the
/// available memory is read only for the first write.
fn back(bytes: &mut Vec<u8>, size: usize, index: usize) -> Result<(), String> {
    back_within(bytes, size, index, host_memory_available)
}

/// [`back`] on a host with `available()` bytes available (`None`:
/// unknown), asked only when the region is not backed yet.
fn back_within(
    bytes: &mut Vec<u8>,
    size: usize,
    index: usize,
    available: impl FnOnce() -> Option<u64>,
) -> Result<(), String> {
    if !bytes.is_empty() {
        return Ok(());
    }
    if let Some(available) = available().filter(|&a| size as u64 > a) {
        return Err(format!(
            "the software device cannot back memory region {index} ({size} bytes) with host memory: the host has {available} bytes available; use a smaller SPYRE_MOCK_REGION_BYTES"
        ));
    }
    *bytes = bytemuck::allocation::try_zeroed_vec(size).map_err(|()| {
        format!(
            "the software device cannot back memory region {index} ({size} bytes) with host memory: the allocation was refused (a limit on the process's memory, say); use a smaller SPYRE_MOCK_REGION_BYTES or raise the limit"
        )
    })?;
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo` in bytes, or `None` where it cannot be
/// read (and under Miri, whose isolation forbids opening files).
fn host_memory_available() -> Option<u64> {
    if cfg!(miri) {
        return None;
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region the allocator refuses (here larger than any host's address
    /// space, with the available memory unknown, as where /proc cannot be
    /// read) is an error naming the region, not an abort.
    #[test]
    #[cfg_attr(miri, ignore = "Miri stops at an allocation this large")]
    fn a_region_the_allocator_refuses_is_an_error() {
        let mut bytes = Vec::new();
        let error = back_within(&mut bytes, 1 << 62, 3, || None).unwrap_err();
        assert_eq!(
            error,
            "the software device cannot back memory region 3 (4611686018427387904 bytes) with host memory: the allocation was refused (a limit on the process's memory, say); use a smaller SPYRE_MOCK_REGION_BYTES or raise the limit"
        );
        assert!(bytes.is_empty());
    }

    /// A region already backed does not read the host's available memory
    /// again: every write to device memory came here, and read
    /// `/proc/meminfo` each time, under the region's lock.
    #[test]
    fn a_backed_region_does_not_ask_the_host_again() {
        let mut bytes = vec![7u8; 16];
        back_within(&mut bytes, 16, 0, || panic!("the host was asked")).unwrap();
        assert_eq!(bytes, [7u8; 16], "kept as it was");
    }

    use crate::config::MockSystemBuilder;

    fn memory(total: u64, region: u64) -> DeviceMemory {
        DeviceMemory::new(
            &MockSystemBuilder::new()
                .memory_bytes(total)
                .region_bytes(region)
                .build_config()
                .unwrap(),
        )
    }

    fn sizes(address: &CompositeAddress) -> Vec<u64> {
        address.chunks().iter().map(|c| c.size).collect()
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot read the host's available memory")]
    fn backing_more_than_the_host_has_is_refused_not_aborted() {
        // Half the address space is more than any host has available, so
        // the refusal comes before the allocator is asked.
        let size = usize::MAX / 2;
        let mut bytes = Vec::new();
        let message = back(&mut bytes, size, 7).unwrap_err();
        assert!(message.contains("memory region 7"), "{message}");
        assert!(message.contains(&format!("({size} bytes)")), "{message}");
        assert!(message.contains("SPYRE_MOCK_REGION_BYTES"), "{message}");
        assert!(bytes.is_empty(), "nothing is backed after a refusal");
        back(&mut bytes, 16, 0).unwrap();
        assert_eq!(bytes, vec![0u8; 16], "a small region is backed with zeros");
    }

    #[test]
    fn allocations_are_aligned_exact_and_counted_in_units() {
        let mem = memory(4096, 1024);
        let a = mem.allocate(100).unwrap();
        let b = mem.allocate(1).unwrap();
        assert_eq!(sizes(&a), vec![100]);
        assert_eq!(a.start().offset, 0);
        assert_eq!(b.start().offset, 128);
        assert_eq!(mem.free_bytes(), 4096 - 256);
        mem.free(&a).unwrap();
        mem.free(&b).unwrap();
        assert_eq!(mem.free_bytes(), 4096);
    }

    #[test]
    fn large_allocations_span_regions() {
        let mem = memory(4096, 1024);
        let a = mem.allocate(3000).unwrap();
        assert_eq!(sizes(&a), vec![1024, 1024, 952]);
        let regions: Vec<u32> = a.chunks().iter().map(|c| c.address.region_id).collect();
        assert_eq!(regions, vec![0, 1, 2]);
        for c in a.chunks() {
            assert_eq!(c.address.offset % ADDRESS_ALIGNMENT, 0);
        }
    }

    #[test]
    fn a_range_that_fits_whole_is_preferred() {
        let mem = memory(4096, 1024);
        let small = mem.allocate(128).unwrap();
        let big = mem.allocate(1024).unwrap();
        assert_eq!(big.chunks().len(), 1);
        assert_eq!(big.start().region_id, 1);
        mem.free(&small).unwrap();
        // Now 1024 are free in region 0 again, merged with the rest.
        let again = mem.allocate(1024).unwrap();
        assert_eq!(
            again.start(),
            LogicalAddress {
                region_id: 0,
                offset: 0
            }
        );
    }

    #[test]
    fn exhaustion_names_requested_and_free_bytes() {
        let mem = memory(4096, 1024);
        let _a = mem.allocate(4000).unwrap();
        let err = mem.allocate(200).unwrap_err();
        assert_eq!(err.status(), Status::OUT_OF_MEMORY);
        assert!(err.message().contains("cannot allocate 200 bytes"), "{err}");
        assert!(err.message().contains("0 of 4096 bytes"), "{err}");
        let err = memory(4096, 1024).allocate(u64::MAX).unwrap_err();
        assert_eq!(err.status(), Status::OUT_OF_MEMORY);
    }

    #[test]
    fn fragmentation_beyond_the_chunk_limit_is_out_of_memory() {
        let mem = memory(128 * 256, 128 * 256);
        let blocks: Vec<_> = (0..256).map(|_| mem.allocate(128).unwrap()).collect();
        for block in blocks.iter().step_by(2) {
            mem.free(block).unwrap();
        }
        // 128 separate free units of 128 bytes each.
        let err = mem.allocate(65 * 128).unwrap_err();
        assert_eq!(err.status(), Status::OUT_OF_MEMORY);
        assert!(
            err.message().ends_with(
                "16384 of 32768 bytes of device memory are free, but in more than 64 free ranges (an allocation takes at most 64 chunks), the longest 128 bytes; live allocations split them: freeing memory beside them makes them longer"
            ),
            "{err}"
        );
        assert_eq!(sizes(&mem.allocate(64 * 128).unwrap()).len(), 64);
    }

    #[test]
    fn ranges_split_by_live_allocations_are_named_so_beside_whole_regions() {
        // 100 regions of 1 KiB; in each of the first 70, 128 live bytes
        // and 896 free after them; the last 30 wholly free. 65 KiB would
        // take the 70 split ranges first, 64 of them only 56 KiB: the
        // message blames the live allocations, though whole regions (the
        // longest ranges) remain.
        let mem = memory(100 * 1024, 1024);
        let mut rests = Vec::new();
        let kept: Vec<_> = (0..70)
            .map(|_| {
                let live = mem.allocate(128).unwrap();
                rests.push(mem.allocate(896).unwrap());
                live
            })
            .collect();
        for rest in &rests {
            mem.free(rest).unwrap();
        }
        assert_eq!(kept.len(), 70);
        assert_eq!(mem.free_bytes(), 100 * 1024 - 70 * 128);
        let err = mem.allocate(65 * 1024).unwrap_err();
        assert!(
            err.message().ends_with(
                "the longest 1024 bytes; live allocations split them: freeing memory beside them makes them longer"
            ),
            "{err}"
        );
    }

    #[test]
    fn regions_too_small_for_an_allocation_are_named_on_an_empty_device() {
        // An empty device of 512 regions of 128 bytes: 65 536 bytes free,
        // but no allocation of more than 64 regions.
        let mem = memory(65_536, 128);
        let err = mem.allocate(65 * 128).unwrap_err();
        assert_eq!(err.status(), Status::OUT_OF_MEMORY);
        assert!(
            err.message().ends_with(
                "the longest 128 bytes; the free ranges are whole regions of 128 bytes: larger regions (SPYRE_MOCK_REGION_BYTES) make fewer"
            ),
            "{err}"
        );
    }

    #[test]
    fn free_checks_the_address() {
        let mem = memory(4096, 1024);
        let a = mem.allocate(3000).unwrap();
        let partial = CompositeAddress::new(a.chunks()[..1].to_vec()).unwrap();
        let err = mem.free(&partial).unwrap_err();
        assert_eq!(err.status(), Status::INVALID_ARGUMENT);
        assert!(err.message().contains("not a live allocation"), "{err}");
        mem.free(&a).unwrap();
        assert!(mem.free(&a).is_err());
        assert_eq!(mem.free_bytes(), 4096);
    }

    #[test]
    fn views_check_bounds_and_move_bytes_across_chunks() {
        let mem = memory(4096, 1024);
        assert_eq!(mem.backed_regions(), 0);
        let a = mem.allocate(1500).unwrap();
        let view = mem.view();
        let spans = view.spans(&a).unwrap();
        let data: Vec<u8> = (0..1500u32).map(|i| (i % 251) as u8).collect();
        view.write(&spans, &data).unwrap();
        let mut back = vec![0; 1500];
        view.read(&spans, &mut back);
        assert_eq!(back, data);
        assert_eq!(mem.backed_regions(), 2);

        let past_end = view.span(a.chunks()[1].address, 477, &"x").unwrap_err();
        assert!(
            past_end.contains("not inside a live allocation"),
            "{past_end}"
        );
        assert!(view.span(a.chunks()[1].address, 476, &"x").is_ok());
        let unallocated = LogicalAddress {
            region_id: 3,
            offset: 0,
        };
        assert!(view.span(unallocated, 1, &"x").is_err());
        let no_region = LogicalAddress {
            region_id: 99,
            offset: 0,
        };
        assert!(view.span(no_region, 1, &"x").is_err());
    }

    #[test]
    fn fill_pattern_continues_across_spans() {
        let mem = memory(4096, 2048);
        let a = mem.allocate(1024 + 6).unwrap();
        // Split the allocation into spans of odd lengths.
        let view = mem.view();
        let start = a.start();
        let spans = [
            view.span(start, 3, &"a").unwrap(),
            view.span(LogicalAddress { offset: 3, ..start }, 1027, &"b")
                .unwrap(),
        ];
        view.fill(&spans, &[1, 2, 3, 4]).unwrap();
        let mut back = vec![0; 1030];
        view.read(&spans, &mut back);
        let expected: Vec<u8> = (0..1030).map(|i| [1, 2, 3, 4][i % 4]).collect();
        assert_eq!(back, expected);
    }
}

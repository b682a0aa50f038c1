//! Device memory of the process's device: owned buffers
//! ([`DeviceBuffer`]) over a caching allocator, its statistics, and the raw
//! allocation calls of the runtime.

pub(crate) mod allocator;
mod buffer;
mod element;
mod raw;
pub(crate) mod reuse_barrier;
mod stats;

pub use allocator::{
    LARGE_SEGMENT, LARGE_SEGMENT_LIMIT, MIN_BLOCK, MemoryStats, SEGMENTS_PER_DEVICE, SMALL_REQUEST,
    SMALL_SEGMENT, allocations_held, segment_bytes,
};
pub use buffer::DeviceBuffer;
pub use element::DeviceElement;
pub use raw::{allocate, free, memory_info, memory_layout};
pub use stats::{
    empty_cache, max_memory_allocated, memory_allocated, memory_reserved, memory_stats,
    reset_peak_memory_stats,
};

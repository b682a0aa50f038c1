//! Small enumerations shared by every backend: priority, ordering mode, data format.

use std::fmt;

use flex_sys::bindings as sys;

use crate::error::{FlexError, Result};

/// Priority of a hardware stream (`flex_stream_priority_t`).
///
/// When more streams have work than a device has engines, queued work of
/// [`StreamPriority::High`] streams starts first. torch-spyre creates a pool
/// stream as `HIGH` when the call that first hands out its id asks for a
/// negative priority, so its high-priority pool's streams (ids 33–64) are
/// `HIGH` unless first handed out for a positive one, and every other
/// stream as `NORMAL` (`flex::RuntimeStreamPriority`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamPriority {
    /// `FLEX_STREAM_PRIORITY_NORMAL`.
    #[default]
    Normal,
    /// `FLEX_STREAM_PRIORITY_HIGH`.
    High,
}

impl StreamPriority {
    /// The flex.h value.
    pub fn to_raw(self) -> i32 {
        match self {
            Self::Normal => sys::FLEX_STREAM_PRIORITY_NORMAL,
            Self::High => sys::FLEX_STREAM_PRIORITY_HIGH,
        }
    }

    /// Parses a flex.h value.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] naming `raw` when flex.h defines no such priority.
    pub fn from_raw(raw: i32) -> Result<Self> {
        match raw {
            sys::FLEX_STREAM_PRIORITY_NORMAL => Ok(Self::Normal),
            sys::FLEX_STREAM_PRIORITY_HIGH => Ok(Self::High),
            other => Err(FlexError::invalid_argument(
                "stream priority",
                format!("unknown stream priority {other}; expected 0 (NORMAL) or 1 (HIGH)"),
            )),
        }
    }
}

impl fmt::Display for StreamPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Normal => "normal",
            Self::High => "high",
        })
    }
}

/// Ordering mode of a hardware stream (`flex_stream_mode_t`).
///
/// flex.h defines one mode, the one torch-spyre uses for every stream
/// (`RuntimeStreamMode::STRICT_ORDERING`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StreamMode {
    /// Operations start and finish in submission order (FIFO).
    #[default]
    StrictOrdering,
}

impl StreamMode {
    /// The flex.h value.
    pub fn to_raw(self) -> i32 {
        match self {
            Self::StrictOrdering => sys::FLEX_STREAM_MODE_STRICT_ORDERING,
        }
    }

    /// Parses a flex.h value.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] naming `raw` when flex.h defines no such mode.
    pub fn from_raw(raw: i32) -> Result<Self> {
        match raw {
            sys::FLEX_STREAM_MODE_STRICT_ORDERING => Ok(Self::StrictOrdering),
            other => Err(FlexError::invalid_argument(
                "stream mode",
                format!("unknown stream mode {other}; expected 0 (STRICT_ORDERING)"),
            )),
        }
    }
}

/// Element format of device data (`flex_data_format_t`), used by fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataFormat {
    /// IEEE 754 binary32, 4 bytes, little-endian.
    Fp32,
    /// IEEE 754 binary16, 2 bytes, little-endian.
    Fp16,
    /// Signed 32-bit integer, 4 bytes, little-endian.
    Int32,
    /// Unsigned 8-bit integer, 1 byte.
    Uint8,
}

impl DataFormat {
    /// Size of one element in bytes.
    pub fn element_size(self) -> u64 {
        match self {
            Self::Fp32 | Self::Int32 => 4,
            Self::Fp16 => 2,
            Self::Uint8 => 1,
        }
    }

    /// The flex.h value.
    pub fn to_raw(self) -> i32 {
        match self {
            Self::Fp32 => sys::FLEX_DATA_FORMAT_IEEE_FP32,
            Self::Fp16 => sys::FLEX_DATA_FORMAT_IEEE_FP16,
            Self::Int32 => sys::FLEX_DATA_FORMAT_INT32,
            Self::Uint8 => sys::FLEX_DATA_FORMAT_UINT8,
        }
    }

    /// Parses a flex.h value.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] naming `raw` when flex.h defines no such format.
    pub fn from_raw(raw: i32) -> Result<Self> {
        match raw {
            sys::FLEX_DATA_FORMAT_IEEE_FP32 => Ok(Self::Fp32),
            sys::FLEX_DATA_FORMAT_IEEE_FP16 => Ok(Self::Fp16),
            sys::FLEX_DATA_FORMAT_INT32 => Ok(Self::Int32),
            sys::FLEX_DATA_FORMAT_UINT8 => Ok(Self::Uint8),
            other => Err(FlexError::invalid_argument(
                "data format",
                format!(
                    "unknown data format {other}; expected 0 (FP32), 1 (FP16), 2 (INT32) or 3 (UINT8)"
                ),
            )),
        }
    }
}

/// How a device's memory is laid out, as far as allocation is concerned:
/// `total_bytes` of memory in regions of `region_bytes` (the last region is
/// smaller when `region_bytes` does not divide `total_bytes`). A chunk of an
/// allocation never crosses a region, so one chunk holds at most
/// `region_bytes`; a kernel operand, which must lie in one chunk, too.
///
/// Reported by [`Runtime::memory_layout`](crate::Runtime::memory_layout)
/// where the backend knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryLayout {
    /// Device memory of the runtime, in bytes.
    pub total_bytes: u64,
    /// Size of one memory region, in bytes (at least 128, at most
    /// `total_bytes`).
    pub region_bytes: u64,
}

/// How much of a runtime's device memory is free
/// (`flex_runtime_get_memory_info`; `cudaMemGetInfo`), in bytes.
///
/// Reported by [`Runtime::memory_info`](crate::Runtime::memory_info).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryInfo {
    /// Bytes not taken by live allocations. Fragmentation may make the
    /// largest single allocation smaller.
    pub free_bytes: u64,
    /// All of the runtime's device memory.
    pub total_bytes: u64,
}

impl MemoryLayout {
    /// How many blocks of `block` bytes the memory holds at once, each in
    /// one region: the blocks that fit whole in each region, added up. Exact
    /// for a first-fit allocator when every allocation has the size `block`
    /// (pass it rounded as the allocator rounds it, to
    /// [`ADDRESS_ALIGNMENT`](crate::ADDRESS_ALIGNMENT) or more: it is not
    /// rounded here); 0 when `block` is 0 or larger than a region.
    pub fn blocks_held(&self, block: u64) -> u64 {
        if self.region_bytes == 0 || block == 0 {
            return 0;
        }
        let full_regions = self.total_bytes / self.region_bytes;
        let last = self.total_bytes % self.region_bytes;
        full_regions.saturating_mul(self.region_bytes / block) + last / block
    }
}

/// How a thread waits in `synchronize` — and how a device's workers wait
/// for work — the choices CUDA offers (`cudaDeviceScheduleSpin`, `Yield`,
/// `BlockingSync`, `Auto`). Spinning answers in well under a microsecond but
/// burns a core while it waits; blocking costs a thread wake-up (several
/// microseconds) and burns nothing.
///
/// A backend chooses per runtime; the software device takes it from its
/// configuration (`SPYRE_MOCK_SYNC_POLICY`), and its engines, under every
/// policy but `BlockingSync`, also spin out the last microseconds of a
/// timed operation of its timing model (see `spyre-mock`'s docs). A flex
/// library decides on its own (flex.h 1.0 has no call to choose).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncPolicy {
    /// Spin for a short while ([`SyncPolicy::AUTO_SPIN`]), then block: fast
    /// for short waits, and no more than that spin burned on long ones.
    #[default]
    Auto,
    /// Spin until done.
    Spin,
    /// Yield the processor between checks until done.
    Yield,
    /// Block at once (a condition variable).
    Blocking,
}

impl SyncPolicy {
    /// How long [`SyncPolicy::Auto`] spins before it blocks: 20 µs.
    pub const AUTO_SPIN: std::time::Duration = std::time::Duration::from_micros(20);

    /// `"auto"`, `"spin"`, `"yield"` or `"blocking"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Spin => "spin",
            Self::Yield => "yield",
            Self::Blocking => "blocking",
        }
    }

    /// The policy named `raw` (one of [`SyncPolicy::as_str`]'s names, any
    /// case), or `None`.
    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Auto, Self::Spin, Self::Yield, Self::Blocking]
            .into_iter()
            .find(|p| raw.eq_ignore_ascii_case(p.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip_and_match_the_header() {
        assert_eq!(StreamPriority::High.to_raw(), 1);
        assert_eq!(StreamPriority::from_raw(0).unwrap(), StreamPriority::Normal);
        assert_eq!(StreamMode::from_raw(0).unwrap(), StreamMode::StrictOrdering);
        for format in [
            DataFormat::Fp32,
            DataFormat::Fp16,
            DataFormat::Int32,
            DataFormat::Uint8,
        ] {
            assert_eq!(DataFormat::from_raw(format.to_raw()).unwrap(), format);
        }
        assert_eq!(DataFormat::Fp16.element_size(), 2);
    }

    #[test]
    fn unknown_raw_values_are_errors_naming_the_value() {
        let err = StreamPriority::from_raw(7).unwrap_err();
        assert!(err.message().contains("unknown stream priority 7"), "{err}");
        assert!(
            StreamMode::from_raw(1)
                .unwrap_err()
                .message()
                .contains("mode 1")
        );
        assert!(
            DataFormat::from_raw(-3)
                .unwrap_err()
                .message()
                .contains("format -3")
        );
    }

    #[test]
    fn blocks_held_counts_whole_blocks_per_region() {
        let layout = |total_bytes, region_bytes| MemoryLayout {
            total_bytes,
            region_bytes,
        };
        // 1 GiB in four 256 MiB regions; 100 MiB + 128 blocks: two per region.
        let block = 100 * (1 << 20) + 128;
        assert_eq!(layout(1 << 30, 256 << 20).blocks_held(block), 8);
        // Bytes alone would suggest 10 (1 GiB / 100 MiB): packing is what counts.
        assert_eq!((1u64 << 30) / block, 10);
        // A last region smaller than the others: 1000 bytes in regions of 384
        // are 384 + 384 + 232; blocks of 128 fit 3 + 3 + 1.
        assert_eq!(layout(1000, 384).blocks_held(128), 7);
        assert_eq!(layout(1 << 20, 1 << 20).blocks_held(1 << 20), 1);
        assert_eq!(layout(1 << 20, 1 << 20).blocks_held((1 << 20) + 1), 0);
        assert_eq!(layout(1 << 20, 0).blocks_held(128), 0);
        assert_eq!(layout(1 << 20, 1 << 20).blocks_held(0), 0);
    }

    #[test]
    fn sync_policies_parse_their_names_in_any_case() {
        for policy in [
            SyncPolicy::Auto,
            SyncPolicy::Spin,
            SyncPolicy::Yield,
            SyncPolicy::Blocking,
        ] {
            assert_eq!(SyncPolicy::parse(policy.as_str()), Some(policy));
        }
        assert_eq!(SyncPolicy::parse("SPIN"), Some(SyncPolicy::Spin));
        assert_eq!(SyncPolicy::parse("busy"), None);
        assert_eq!(SyncPolicy::default(), SyncPolicy::Auto);
    }
}

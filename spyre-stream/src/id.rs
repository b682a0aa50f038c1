//! Stream ids and the fixed layout of the id space.

use std::fmt;

/// A stream id (`c10::StreamId`, a signed 64-bit integer).
///
/// The id space of one device is fixed (torch-spyre's layout):
///
/// | ids | stream | priority |
/// |---|---|---|
/// | 0 | the default stream | 0 |
/// | 1–32 | normal-priority pool, round robin | 0 |
/// | 33–64 | high-priority pool, round robin | -1 |
/// | 65–65+N-1 | host-compute streams, N from `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS` | -1 |
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub i64);

impl StreamId {
    /// The default stream's id.
    pub const DEFAULT: StreamId = StreamId(0);

    /// The raw id.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The priority torch-spyre reports for this id: 0 for ids up to 32 (the
    /// default stream and the normal pool), -1 above (the high-priority pool
    /// and the host-compute streams). Derived from the id alone, as
    /// `SpyreStream::priority()` does upstream.
    pub fn priority(self) -> i32 {
        if self.0 <= NORMAL_POOL_END { 0 } else { -1 }
    }

    /// The part of the id space this id is in: the default stream (0), the
    /// normal pool (1–32), the high-priority pool (33–64) or the host-compute
    /// streams (65 and up); `None` for a negative id.
    pub fn pool(self) -> Option<PoolKind> {
        match self.0 {
            i64::MIN..0 => None,
            0 => Some(PoolKind::Default),
            NORMAL_POOL_START..=NORMAL_POOL_END => Some(PoolKind::Normal),
            HIGH_POOL_START..=HIGH_POOL_END => Some(PoolKind::High),
            _ => Some(PoolKind::HostCompute),
        }
    }

    /// The table slot of this id, if it is inside the largest possible id space.
    #[inline]
    pub(crate) fn slot(self) -> Option<usize> {
        usize::try_from(self.0)
            .ok()
            .filter(|&slot| slot < MAX_STREAM_SLOTS)
    }
}

/// The parts of a device's stream-id space ([`StreamId::pool`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Id 0, the default stream.
    Default,
    /// Ids 1–32, handed out round robin for priority 0 and above.
    Normal,
    /// Ids 33–64, handed out round robin for negative priorities.
    High,
    /// Ids 65 and up, the host-compute streams.
    HostCompute,
}

impl PoolKind {
    /// `"default"`, `"normal"`, `"high"` or `"host-compute"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Normal => "normal",
            Self::High => "high",
            Self::HostCompute => "host-compute",
        }
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Streams in each of the normal and high-priority pools (`kStreamsPerDevice`).
pub const STREAMS_PER_POOL: usize = 32;
/// First id of the normal-priority pool.
pub const NORMAL_POOL_START: i64 = 1;
/// Last id of the normal-priority pool.
pub const NORMAL_POOL_END: i64 = 32;
/// First id of the high-priority pool.
pub const HIGH_POOL_START: i64 = 33;
/// Last id of the high-priority pool.
pub const HIGH_POOL_END: i64 = 64;
/// First host-compute stream id (`kHostComputeStreamStartPerDevice`).
pub const HOST_COMPUTE_START: i64 = 65;
/// Host-compute streams when `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS` is unset.
pub const DEFAULT_HOST_COMPUTE_STREAMS: usize = 4;
/// Most host-compute streams: a larger `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS`
/// is capped to this (as in torch-spyre), while [`crate::PoolConfig::new`]
/// refuses a larger count.
pub const MAX_HOST_COMPUTE_STREAMS: usize = 8;
/// Size of the handle table: every id that can ever be mapped.
pub(crate) const MAX_STREAM_SLOTS: usize = HOST_COMPUTE_START as usize + MAX_HOST_COMPUTE_STREAMS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_derives_from_the_id() {
        assert_eq!(StreamId(0).priority(), 0);
        assert_eq!(StreamId(32).priority(), 0);
        assert_eq!(StreamId(33).priority(), -1);
        assert_eq!(StreamId(64).priority(), -1);
        assert_eq!(StreamId(65).priority(), -1);
    }

    #[test]
    fn every_id_names_its_pool() {
        assert_eq!(StreamId(-1).pool(), None);
        assert_eq!(StreamId(0).pool(), Some(PoolKind::Default));
        assert_eq!(StreamId(1).pool(), Some(PoolKind::Normal));
        assert_eq!(StreamId(32).pool(), Some(PoolKind::Normal));
        assert_eq!(StreamId(33).pool(), Some(PoolKind::High));
        assert_eq!(StreamId(64).pool(), Some(PoolKind::High));
        assert_eq!(StreamId(65).pool(), Some(PoolKind::HostCompute));
        assert_eq!(PoolKind::HostCompute.as_str(), "host-compute");
    }

    #[test]
    fn slots_cover_exactly_the_id_space() {
        assert_eq!(StreamId(0).slot(), Some(0));
        assert_eq!(StreamId(72).slot(), Some(72));
        assert_eq!(StreamId(73).slot(), None);
        assert_eq!(StreamId(-1).slot(), None);
        assert_eq!(StreamId(i64::MAX).slot(), None);
    }
}

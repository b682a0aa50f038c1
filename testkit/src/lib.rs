//! What the workspace's tests, benchmarks and verification workload share,
//! written once.
//!
//! - [`SplitMix64`]: the one deterministic generator: inputs of `spyre run`,
//!   random operations of the stress tests.
//! - [`interleaved`] (and, with feature `criterion`, `bench_interleaved`):
//!   timing several contenders round by round, so that a benchmark and its
//!   baseline see the same machine even when its speed drifts; [`batched`]:
//!   timing launches without the wait that drains them;
//!   [`interleaved_batched`]: both at once; [`interleaved_prepared`]:
//!   round by round, with an untimed set-up before each timed run.
//! - [`f32_le_bytes`], [`f32s_from_le`]: `f32`s as the device stores them.
//!
//! No dependency on the workspace's own crates, so every crate can use it.
#![forbid(unsafe_code)]

mod rng;
mod timing;

pub use rng::{SplitMix64, mix64};
pub use timing::{
    BatchedMember, PreparedMember, batched, interleaved, interleaved_batched, interleaved_prepared,
};
#[cfg(feature = "criterion")]
pub use timing::{bench_interleaved, bench_interleaved_batched, bench_interleaved_prepared};

/// `values` as the device stores `f32`: 4 little-endian bytes each.
pub fn f32_le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The `f32`s of little-endian `bytes` (a trailing partial value is ignored).
pub fn f32s_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_bytes_round_trip_little_endian() {
        let values = [1.0f32, -2.5, f32::MIN_POSITIVE];
        let bytes = f32_le_bytes(&values);
        assert_eq!(&bytes[..4], &[0x00, 0x00, 0x80, 0x3f], "1.0 is 0x3f800000");
        assert_eq!(f32s_from_le(&bytes), values);
        assert_eq!(f32s_from_le(&bytes[..5]), [1.0]);
    }
}

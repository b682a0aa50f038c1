//! What the workspace's tests, benchmarks and verification workload share,
//! written once.
//!
//! - [`SplitMix64`]: the one deterministic generator: inputs of `spyre run`,
//!   random operations of the stress tests.
//! - [`interleaved`] (and, with feature `criterion`, `bench_interleaved`):
//!   timing several contenders round by round, so that a benchmark and its
//!   baseline see the same machine even when its speed drifts.
//!
//! No dependency on the workspace's own crates, so every crate can use it.
#![forbid(unsafe_code)]

mod rng;
mod timing;

pub use rng::{SplitMix64, mix64};
#[cfg(feature = "criterion")]
pub use timing::bench_interleaved;
pub use timing::interleaved;

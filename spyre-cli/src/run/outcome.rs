//! What a finished `spyre run` measured, before it is reported.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use spyre_stream::DeviceSource;

use super::lane::Overlap;
use super::plan::Plan;

/// What a finished run measured; see [`RunReport`](super::RunReport).
#[derive(Clone, Debug)]
pub(crate) struct RunOutcome {
    /// The backend's name.
    pub(crate) backend: &'static str,
    /// The backend's details (library and ABI, or the software device's
    /// configuration, with the visible devices when `SPYRE_DEVICES` chose).
    pub(crate) backend_details: Vec<(&'static str, String)>,
    /// The logical device the process ran on.
    pub(crate) device: u8,
    /// What chose that device.
    pub(crate) device_source: DeviceSource,
    /// The plan every iteration followed.
    pub(crate) plan: Plan,
    /// Iterations whose result matched the reference.
    pub(crate) verified: u64,
    /// Launches by stream id.
    pub(crate) launches_by_stream: BTreeMap<i64, u64>,
    /// Pipelined mode: the stages' device time and span, from timed events.
    pub(crate) overlap: Option<Overlap>,
    /// Time from the first submission to the last check.
    pub(crate) wall: Duration,
    /// Device memory the run used.
    pub(crate) memory: MemoryUse,
    /// The operation counters at the end (`spyre_stream::counters`).
    pub(crate) counters: spyre_stream::CountersSnapshot,
    /// `--trace`: the file written.
    pub(crate) trace: Option<TraceFile>,
    /// `--timeline`: the picture written.
    pub(crate) timeline: Option<String>,
    /// Why `--trace` or `--timeline` could not be written (both reasons,
    /// when both failed): the run is reported, then this, and it exits 1.
    pub(crate) unwritten: Option<String>,
}

/// The trace file of `--trace`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct TraceFile {
    /// Where it was written.
    pub(crate) path: String,
    /// What it holds.
    #[serde(flatten)]
    pub(crate) summary: super::trace_file::TraceSummary,
}

/// Device memory a run used, from the caching allocator's statistics
/// (`spyre_stream::memory_stats`); part of the JSON report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct MemoryUse {
    /// The most bytes the run's buffers held at once.
    pub(crate) peak_allocated_bytes: u64,
    /// The most bytes the allocator held from the device at once.
    pub(crate) peak_reserved_bytes: u64,
    /// Allocations the device made for the allocator.
    pub(crate) device_allocations: u64,
    /// Of those, how many came after the warm-up: once every thread had
    /// checked its first window of `--in-flight` iterations, the most that
    /// can be in flight before memory is reused (`None`, `null` in JSON,
    /// if a thread ran no more iterations than that).
    pub(crate) device_allocations_after_warm_up: Option<u64>,
    /// Bytes still allocated at the end (checked to be 0).
    pub(crate) allocated_bytes_at_end: u64,
}

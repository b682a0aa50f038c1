//! What a finished `spyre run` measured, before it is reported.

use std::collections::BTreeMap;
use std::time::Duration;

use spyre_stream::DeviceSource;

use super::lane::Overlap;
use super::plan::Plan;

/// What a finished run measured; see [`RunReport`](super::RunReport).
#[derive(Clone, Debug)]
pub(crate) struct RunOutcome {
    /// The backend's name.
    pub(crate) backend: &'static str,
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
}

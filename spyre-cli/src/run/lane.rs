//! Where one thread's iterations run (`--mode`): on a stream per iteration,
//! all on one stream, or pipelined across three streams ordered by events.
//!
//! In the pipelined mode an iteration takes three streams from the pool —
//! copy-in, compute, copy-out — and its stages are ordered by events only:
//!
//! ```text
//! copy-in   wait computed[i-2] → H2D x, H2D y → record copied_in[i]
//! compute   wait copied_in[i], copied_out[i-2] → H2D program, compute → record computed[i]
//! copy-out  wait computed[i] → D2H out → record copied_out[i]
//! ```
//!
//! Device memory is double-buffered: iteration `i` uses slot `i % 2` (a run
//! of one iteration has one slot), which iteration `i - 2` used last; the waits on that iteration's events keep a
//! slot from being overwritten while the device still reads it. The host
//! never waits for a stage: it waits only for a result it checks. Each
//! stage starts and ends with a timed event, which gives the overlap the
//! report shows.

use std::sync::Arc;
use std::time::Duration;

use spyre_stream::{Device, SpyreEvent, SpyreStream};

use super::buffers::IterationBuffers;

/// The three stages of a pipelined iteration.
pub(crate) const STAGES: [&str; 3] = ["copy-in", "compute", "copy-out"];

/// Where a thread's iterations run.
pub(super) enum Lane {
    /// Each iteration on its own pool stream; memory per iteration.
    PerIteration,
    /// Every iteration of the thread on one pool stream; memory per iteration.
    Serialized(SpyreStream),
    /// Three pool streams per iteration ordered by events; two memory slots.
    Pipelined(Pipeline),
}

/// The double-buffered state of a pipelined thread.
pub(super) struct Pipeline {
    /// Device memory of the two slots (one for a single iteration): the
    /// operands and the program.
    pub(super) slots: Vec<Slot>,
    /// The events of the iteration that last used each slot.
    pub(super) last: [Option<Arc<StageEvents>>; 2],
}

/// One slot of device memory.
pub(super) struct Slot {
    /// `x` (or `A`), `y` (or `B`), the output and the program.
    pub(super) buffers: IterationBuffers,
}

/// The timed events at the start and end of each stage of one iteration.
pub(super) struct StageEvents {
    /// Start and end of copy-in, compute and copy-out, in [`STAGES`] order.
    pub(super) bounds: [(SpyreEvent, SpyreEvent); 3],
}

impl StageEvents {
    /// Six fresh timed events.
    pub(super) fn new() -> spyre_stream::Result<Self> {
        let pair = || {
            Ok::<_, spyre_stream::Error>((SpyreEvent::with_timing()?, SpyreEvent::with_timing()?))
        };
        Ok(Self {
            bounds: [pair()?, pair()?, pair()?],
        })
    }

    /// The end of the compute stage (`computed[i]`).
    pub(super) fn computed(&self) -> &SpyreEvent {
        &self.bounds[1].1
    }

    /// The end of the copy-out stage (`copied_out[i]`).
    pub(super) fn copied_out(&self) -> &SpyreEvent {
        &self.bounds[2].1
    }

    /// Device time of each stage, once the last stage has completed.
    ///
    /// # Errors
    /// A failed record, or a stage whose events cannot be timed.
    pub(super) fn stage_times(&self) -> spyre_stream::Result<[Duration; 3]> {
        self.copied_out().synchronize()?;
        let mut times = [Duration::ZERO; 3];
        for (time, (start, end)) in times.iter_mut().zip(&self.bounds) {
            *time = start.elapsed_time(end)?;
        }
        Ok(times)
    }
}

/// Device time a thread's stages took, and the span they took it in.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Overlap {
    /// Device time of each stage, summed over iterations, in [`STAGES`] order.
    pub(crate) stage_time: [Duration; 3],
    /// Device time from the first stage's start to the last stage's end.
    pub(crate) span: Duration,
}

impl Overlap {
    /// Stage time over span: up to 3 per thread when the three stages ran
    /// side by side all the time (threads run at once, so with `T` threads
    /// up to `3T`); 1 when the stages of one thread ran one after another
    /// with no gap; below 1 when the device sat idle between them; 0 for an
    /// empty span.
    pub(crate) fn factor(&self) -> f64 {
        let busy: Duration = self.stage_time.iter().sum();
        if self.span.is_zero() {
            0.0
        } else {
            busy.as_secs_f64() / self.span.as_secs_f64()
        }
    }

    /// Adds another thread's measurement: stage times add up, and the span
    /// is the longest (the threads ran at the same time).
    pub(crate) fn merge(&mut self, other: Overlap) {
        for (mine, theirs) in self.stage_time.iter_mut().zip(other.stage_time) {
            *mine += theirs;
        }
        self.span = self.span.max(other.span);
    }
}

/// Waits for a pipelined thread's last iterations and drops its slots
/// (their buffers are freed in the order of every stream that used them).
pub(super) fn release_pipeline(pipeline: Pipeline) {
    let Pipeline { slots, last } = pipeline;
    for events in last.iter().flatten() {
        // Errors were reported with the iteration that failed.
        let _ = events.copied_out().synchronize();
    }
    drop(slots);
}

/// The stream for `priority` from the pool of the process's device.
pub(super) fn pool_stream(priority: i32) -> spyre_stream::Result<SpyreStream> {
    spyre_stream::stream_from_pool(Device::CURRENT, priority)
}

//! The report of `spyre run`, as text and as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use spyre_stream::PoolKind;

use super::lane::STAGES;
use super::outcome::{MemoryUse, RunOutcome, TraceFile};
use super::plan::{H2D_PER_ITERATION, LAUNCHES_PER_ITERATION};
use crate::cli::RunArgs;
use crate::error::pool_name;
use crate::output;
use crate::size::format_size;

/// Launches on one stream during a run.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct StreamCount {
    /// The stream id.
    pub(crate) id: i64,
    /// `normal` (ids 1–32) or `high` (ids 33–64).
    pub(crate) pool: &'static str,
    /// Launches enqueued on it.
    pub(crate) operations: u64,
}

/// Everything `spyre run` reports; `--json` prints it as one object.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RunReport {
    /// The backend (`mock` or `hardware`).
    pub(crate) backend: &'static str,
    /// The backend's details, as `spyre info` shows them (for the software
    /// device with `SPYRE_DEVICES` set, `visible_devices`: the device behind
    /// each logical device).
    pub(crate) backend_details: BTreeMap<&'static str, String>,
    /// The logical device the process ran on.
    pub(crate) device: u8,
    /// What chose the device: the launcher variable that named it
    /// (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID` or
    /// `SLURM_LOCALID`), `set_device`, `requested` or `default` (see
    /// `spyre_stream::DeviceSource::name`).
    pub(crate) device_source: &'static str,
    /// The kernel (`axpy` or `matmul`).
    pub(crate) kernel: &'static str,
    /// `--mode`: `pipelined`, `per-iteration` or `serialized`.
    pub(crate) mode: &'static str,
    /// Host threads.
    pub(crate) threads: usize,
    /// Iterations per thread.
    pub(crate) iterations_per_thread: u64,
    /// Iterations in flight per thread.
    pub(crate) in_flight: usize,
    /// `--size`, in bytes.
    pub(crate) size_bytes: u64,
    /// `--seed`.
    pub(crate) seed: u64,
    /// The kernel's dims: `[n]` for axpy, `[m, k, n]` for matmul.
    pub(crate) dims: Vec<u64>,
    /// `f32` elements in each operand.
    pub(crate) elements_per_operand: usize,
    /// Bytes of each operand.
    pub(crate) operand_bytes: u64,
    /// threads × iterations.
    pub(crate) iterations_total: u64,
    /// Iterations whose result matched the host reference bit for bit.
    pub(crate) iterations_verified: u64,
    /// Launches: H2D + compute + D2H.
    pub(crate) operations: u64,
    /// H2D launches (inputs and kernel descriptors).
    pub(crate) operations_h2d: u64,
    /// Compute launches.
    pub(crate) operations_compute: u64,
    /// D2H launches.
    pub(crate) operations_d2h: u64,
    /// Bytes copied host to device.
    pub(crate) bytes_h2d: u64,
    /// Bytes copied device to host.
    pub(crate) bytes_d2h: u64,
    /// `bytes_h2d + bytes_d2h`.
    pub(crate) bytes_moved: u64,
    /// Wall time of the run, in seconds.
    pub(crate) wall_seconds: f64,
    /// `bytes_moved / wall_seconds / 1e9`.
    pub(crate) gb_per_s: f64,
    /// Distinct streams used.
    pub(crate) streams_used: usize,
    /// Distinct normal-priority streams used.
    pub(crate) streams_used_normal: usize,
    /// Distinct high-priority streams used.
    pub(crate) streams_used_high: usize,
    /// Launches on normal-priority streams.
    pub(crate) operations_normal: u64,
    /// Launches on high-priority streams.
    pub(crate) operations_high: u64,
    /// Launches per stream, by id.
    pub(crate) streams: Vec<StreamCount>,
    /// Pipelined mode: how much the stages overlapped on the device.
    pub(crate) overlap: Option<OverlapReport>,
    /// Device memory, from the caching allocator's statistics.
    pub(crate) memory: MemoryUse,
    /// The operation counters at the end (`spyre_stream::counters`): the
    /// device's and each stream's.
    pub(crate) counters: CountersReport,
    /// `--trace`: the file written and what it holds.
    pub(crate) trace: Option<TraceFile>,
    /// `--timeline`: the SVG written.
    pub(crate) timeline: Option<String>,
}

/// Operation counters, as `spyre_stream::Counters` has them.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct CountsReport {
    /// Operations launched.
    pub(crate) launched: u64,
    /// Operations that completed.
    pub(crate) completed: u64,
    /// Operations that failed.
    pub(crate) failed: u64,
    /// Bytes copied host to device, by copies that completed.
    pub(crate) bytes_h2d: u64,
    /// Bytes copied device to host, by copies that completed.
    pub(crate) bytes_d2h: u64,
    /// Operations in flight at the end.
    pub(crate) in_flight: u64,
    /// The most in flight at once.
    pub(crate) max_in_flight: u64,
}

impl From<spyre_stream::Counters> for CountsReport {
    fn from(c: spyre_stream::Counters) -> Self {
        Self {
            launched: c.launched,
            completed: c.completed,
            failed: c.failed,
            bytes_h2d: c.bytes_h2d,
            bytes_d2h: c.bytes_d2h,
            in_flight: c.in_flight,
            max_in_flight: c.max_in_flight,
        }
    }
}

/// The device's counters and each stream's (by id).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct CountersReport {
    /// All streams together.
    pub(crate) device: CountsReport,
    /// Each stream that launched anything.
    pub(crate) streams: BTreeMap<i64, CountsReport>,
}

impl CountersReport {
    fn new(snapshot: &spyre_stream::CountersSnapshot) -> Self {
        Self {
            device: snapshot.device.into(),
            streams: snapshot
                .streams
                .iter()
                .map(|(stream, counters)| (stream.id().get(), (*counters).into()))
                .collect(),
        }
    }
}

/// How much the stages of a pipelined run overlapped, from timed events
/// at the start and end of every stage. A stage counts from its start event
/// (when its stream reached it, its waits passed) to its end event, so time
/// its operations spent queued for a free engine counts as stage time: the
/// factor says how many stages were in flight on average, not how much
/// faster the run was (`spyre bench`'s pipeline measurement says that).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct OverlapReport {
    /// Device time of copy-in, compute and copy-out, summed over the
    /// iterations (and threads), in seconds.
    pub(crate) stage_seconds: [f64; 3],
    /// Device time from a thread's first stage start to its last stage end
    /// (the longest over the threads), in seconds.
    pub(crate) span_seconds: f64,
    /// Stage time over span: the stages in flight (running, or waiting for
    /// a free engine) on average. 1 when the
    /// stages of one thread ran one after another with no gap, up to 3 per
    /// thread when all three were in flight all the time (the threads'
    /// stage times add up, and they run at once).
    pub(crate) factor: f64,
}

impl RunReport {
    /// The report of a successful run.
    pub(crate) fn new(args: &RunArgs, outcome: &RunOutcome) -> Self {
        let plan = &outcome.plan;
        let total = args.threads as u64 * args.iterations;
        let iterations_run = outcome.verified;
        let operations: u64 = outcome.launches_by_stream.values().sum();
        let bytes_h2d = iterations_run * plan.h2d_bytes();
        let bytes_d2h = iterations_run * plan.d2h_bytes();
        let bytes_moved = bytes_h2d + bytes_d2h;
        let wall_seconds = outcome.wall.as_secs_f64();
        let streams: Vec<StreamCount> = outcome
            .launches_by_stream
            .iter()
            .map(|(&id, &operations)| StreamCount {
                id,
                pool: pool_name(id),
                operations,
            })
            .collect();
        let in_pool = |pool: &'static str| streams.iter().filter(move |s| s.pool == pool);
        Self {
            backend: outcome.backend,
            backend_details: outcome.backend_details.iter().cloned().collect(),
            device: outcome.device,
            device_source: outcome.device_source.name(),
            kernel: plan.kernel.name(),
            mode: args.mode.name(),
            threads: args.threads,
            iterations_per_thread: args.iterations,
            in_flight: args.in_flight,
            size_bytes: args.size,
            seed: args.seed,
            dims: plan.dims(),
            elements_per_operand: plan.elements,
            operand_bytes: plan.operand_bytes,
            iterations_total: total,
            iterations_verified: outcome.verified,
            operations,
            operations_h2d: iterations_run * H2D_PER_ITERATION,
            operations_compute: iterations_run,
            operations_d2h: iterations_run,
            bytes_h2d,
            bytes_d2h,
            bytes_moved,
            wall_seconds,
            gb_per_s: if wall_seconds > 0.0 {
                bytes_moved as f64 / wall_seconds / 1e9
            } else {
                0.0
            },
            streams_used: streams.len(),
            streams_used_normal: in_pool(PoolKind::Normal.as_str()).count(),
            streams_used_high: in_pool(PoolKind::High.as_str()).count(),
            operations_normal: in_pool(PoolKind::Normal.as_str())
                .map(|s| s.operations)
                .sum(),
            operations_high: in_pool(PoolKind::High.as_str()).map(|s| s.operations).sum(),
            streams,
            memory: outcome.memory,
            counters: CountersReport::new(&outcome.counters),
            trace: outcome.trace.clone(),
            timeline: outcome.timeline.clone(),
            overlap: outcome.overlap.map(|overlap| OverlapReport {
                stage_seconds: overlap.stage_time.map(|t| t.as_secs_f64()),
                span_seconds: overlap.span.as_secs_f64(),
                factor: overlap.factor(),
            }),
        }
    }

    /// The report as text for people.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        let dims = self
            .dims
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join("×");
        let _ = writeln!(
            out,
            "spyre run: {} ({dims}, {} per operand) on the {} backend, device {} ({})",
            self.kernel,
            format_size(self.operand_bytes),
            self.backend,
            self.device,
            self.device_source
        );
        let _ = writeln!(
            out,
            "  {} thread{} × {} iteration{}, {} in flight per thread, --size {}, seed {}, --mode {}",
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.iterations_per_thread,
            if self.iterations_per_thread == 1 {
                ""
            } else {
                "s"
            },
            self.in_flight,
            format_size(self.size_bytes),
            self.seed,
            self.mode
        );
        let _ = writeln!(
            out,
            "verified     {} / {} iterations (bitwise against the host reference)",
            self.iterations_verified, self.iterations_total
        );
        let _ = writeln!(
            out,
            "operations   {} launches ({} H2D, {} compute, {} D2H; {LAUNCHES_PER_ITERATION} per iteration)",
            self.operations, self.operations_h2d, self.operations_compute, self.operations_d2h
        );
        let _ = writeln!(
            out,
            "bytes moved  {} bytes ({}): H2D {} bytes, D2H {} bytes",
            self.bytes_moved,
            format_size(self.bytes_moved),
            self.bytes_h2d,
            self.bytes_d2h
        );
        let _ = writeln!(
            out,
            "throughput   {} GB/s",
            output::format_figure(self.gb_per_s)
        );
        let _ = writeln!(out, "wall time    {:.3} s", self.wall_seconds);
        if let Some(overlap) = &self.overlap {
            let stages: Vec<String> = STAGES
                .iter()
                .zip(overlap.stage_seconds)
                .map(|(name, seconds)| format!("{name} {seconds:.3} s"))
                .collect();
            let _ = writeln!(
                out,
                "overlap      {:.2} stages in flight on average ({} of stage time in {:.3} s on the device; from timed events)",
                overlap.factor,
                stages.join(", "),
                overlap.span_seconds
            );
        }
        let memory = &self.memory;
        let after_first = match memory.device_allocations_after_warm_up {
            Some(n) => format!("{n} after the warm-up"),
            None => "no steady state: a thread ran no more than --in-flight iterations".to_owned(),
        };
        let _ = writeln!(
            out,
            "memory       peak {} in buffers, {} reserved; {} device allocation{} ({after_first}); {} bytes allocated at the end",
            format_size(memory.peak_allocated_bytes),
            format_size(memory.peak_reserved_bytes),
            memory.device_allocations,
            if memory.device_allocations == 1 {
                ""
            } else {
                "s"
            },
            memory.allocated_bytes_at_end
        );
        if let Some(trace) = &self.trace {
            let _ = writeln!(
                out,
                "trace        {} ({} operations, the launches with their event records and waits, on {} streams; Chrome trace format: open in Perfetto or chrome://tracing)",
                trace.path, trace.summary.operations, trace.summary.streams
            );
        }
        if let Some(timeline) = &self.timeline {
            let _ = writeln!(out, "timeline     {timeline} (SVG, one row per stream)");
        }
        let _ = writeln!(
            out,
            "streams      {} used: {} normal ({} launches), {} high ({} launches)",
            self.streams_used,
            self.streams_used_normal,
            self.operations_normal,
            self.streams_used_high,
            self.operations_high
        );
        for (pool, range) in [
            (PoolKind::Normal, "ids 1–32"),
            (PoolKind::High, "ids 33–64"),
        ] {
            let pool = pool.as_str();
            let entries: Vec<String> = self
                .streams
                .iter()
                .filter(|s| s.pool == pool)
                .map(|s| format!("{:>2}:{:<4}", s.id, s.operations))
                .collect();
            if entries.is_empty() {
                continue;
            }
            let _ = writeln!(out, "  {pool} ({range}), id:launches");
            for line in entries.chunks(8) {
                let _ = writeln!(out, "    {}", line.join(" ").trim_end());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::cli::KernelArg;
    use crate::output::to_json_line;
    use crate::run::Plan;

    fn args() -> RunArgs {
        RunArgs {
            threads: 2,
            iterations: 3,
            size: 4096,
            kernel: KernelArg::Axpy,
            mode: crate::cli::ModeArg::Pipelined,
            in_flight: 2,
            seed: 5,
            json: false,
            trace: None,
            timeline: None,
            exit_when_stdin_closes: false,
        }
    }

    #[test]
    fn totals_follow_from_the_plan() {
        let plan = Plan::new(KernelArg::Axpy, 4096).unwrap();
        let outcome = RunOutcome {
            backend: "mock",
            backend_details: vec![("devices", "4".to_owned())],
            device: 3,
            device_source: spyre_stream::DeviceSource::LocalRank(spyre_stream::env::LOCAL_RANK),
            plan,
            verified: 6,
            launches_by_stream: BTreeMap::from([(1, 10), (2, 5), (33, 10), (34, 5)]),
            overlap: Some(super::super::lane::Overlap {
                stage_time: [
                    Duration::from_millis(300),
                    Duration::from_millis(200),
                    Duration::from_millis(100),
                ],
                span: Duration::from_millis(400),
            }),
            wall: Duration::from_millis(500),
            counters: Default::default(),
            trace: None,
            timeline: None,
            unwritten: None,
            memory: crate::run::MemoryUse {
                peak_allocated_bytes: 3 << 20,
                peak_reserved_bytes: 4 << 20,
                device_allocations: 2,
                device_allocations_after_warm_up: Some(0),
                allocated_bytes_at_end: 0,
            },
        };
        let report = RunReport::new(&args(), &outcome);
        assert_eq!(report.iterations_total, 6);
        assert_eq!(report.operations, 30);
        assert_eq!(report.operations_h2d, 18);
        assert_eq!(report.bytes_h2d, 6 * (2 * 1364 + 128));
        assert_eq!(report.bytes_d2h, 6 * 1364);
        assert_eq!(report.bytes_moved, report.bytes_h2d + report.bytes_d2h);
        assert_eq!(
            (report.streams_used_normal, report.streams_used_high),
            (2, 2)
        );
        assert_eq!((report.operations_normal, report.operations_high), (15, 15));
        assert!((report.gb_per_s - report.bytes_moved as f64 / 0.5e9).abs() < 1e-12);
        let text = report.to_text();
        assert!(text.contains("verified     6 / 6 iterations"), "{text}");
        assert!(
            text.contains("on the mock backend, device 3 (LOCAL_RANK)"),
            "{text}"
        );
        assert!(text.contains("normal (ids 1–32)"), "{text}");
        assert!(text.contains(" 1:10"), "{text}");
        // 0.3 + 0.2 + 0.1 s of stage time in 0.4 s: 1.5×.
        assert!(
            text.contains("overlap      1.50 stages in flight on average (copy-in 0.300 s, compute 0.200 s, copy-out 0.100 s of stage time in 0.400 s on the device"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&to_json_line(&report).unwrap()).unwrap();
        assert_eq!(json["iterations_verified"], 6);
        assert_eq!(
            (json["device"].as_u64(), json["device_source"].as_str()),
            (Some(3), Some("LOCAL_RANK"))
        );
        assert_eq!(json["streams"][2]["pool"], "high");
        assert!(
            text.contains("memory       peak 3 MiB in buffers, 4 MiB reserved; 2 device allocations (0 after the warm-up); 0 bytes allocated at the end"),
            "{text}"
        );
        assert_eq!(json["memory"]["device_allocations_after_warm_up"], 0);
        assert_eq!(json["memory"]["peak_allocated_bytes"], 3 << 20);
    }
}

//! The `pipeline` measurement of `spyre bench`: the same work pipelined
//! across three streams ordered by events (`spyre run --mode pipelined`)
//! and serialized on one stream (`--mode serialized`), each run as a child
//! process of this program, alternately, so that both see the same machine.
//!
//! On the software device the children get a timing model in which copies
//! and compute take comparable time — every operation 1 ms
//! (`SPYRE_MOCK_OP_LATENCY_US=1000`), a copy of one operand 1 ms more
//! (`SPYRE_MOCK_COPY_BANDWIDTH`), four engines so that three stages can run
//! at once — unless the environment already sets those variables.
//!
//! Each child's standard input is a pipe this program holds: when this
//! program ends, by any signal too, the child stops
//! (`--exit-when-stdin-closes`).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use spyre_stream::{BackendKind, MemoryLayout};

use super::{BenchResult, Statistic};
use crate::cli::{KernelArg, ModeArg, RunArgs};
use crate::error::CliError;
use crate::run::Plan;

/// `--size` of the runs: operands of 349 524 bytes.
const SIZE: &str = "1MiB";
/// Iterations of each run (one thread).
const ITERATIONS: &str = "40";
/// Runs of each mode; the median is reported.
pub(super) const ROUNDS: usize = 3;

/// What the measurement found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct PipelineTimes {
    /// Median wall time of the serialized runs.
    pub(super) serialized: Duration,
    /// Median wall time of the pipelined runs.
    pub(super) pipelined: Duration,
    /// Median overlap factor of the pipelined runs (from timed events).
    pub(super) overlap: f64,
    /// Wall time of all the serialized runs.
    pub(super) serialized_total: Duration,
    /// Wall time of all the pipelined runs.
    pub(super) pipelined_total: Duration,
}

impl PipelineTimes {
    /// The results as bench rows: both runs (each the median run, with
    /// the runs' count and total time), the speedup (from both modes'
    /// runs) and the overlap (from the pipelined runs).
    pub(super) fn results(&self) -> Vec<BenchResult> {
        let rows = |name, value, unit, statistic, runs: usize, total: Duration| BenchResult {
            name,
            size_bytes: None,
            value,
            unit,
            statistic,
            operations: runs as u64,
            seconds: total.as_secs_f64(),
        };
        let both = self.serialized_total + self.pipelined_total;
        vec![
            rows(
                "pipeline: serialized",
                self.serialized.as_secs_f64() * 1e3,
                "ms/run",
                Statistic::Median,
                ROUNDS,
                self.serialized_total,
            ),
            rows(
                "pipeline: pipelined",
                self.pipelined.as_secs_f64() * 1e3,
                "ms/run",
                Statistic::Median,
                ROUNDS,
                self.pipelined_total,
            ),
            rows(
                "pipeline: speedup",
                self.serialized.as_secs_f64() / self.pipelined.as_secs_f64().max(1e-12),
                "x",
                Statistic::RatioOfMedians,
                2 * ROUNDS,
                both,
            ),
            rows(
                "pipeline: overlap",
                self.overlap,
                "x",
                Statistic::Median,
                ROUNDS,
                self.pipelined_total,
            ),
        ]
    }
}

/// The children's `--size` in bytes and their plan.
fn child_plan() -> (u64, Plan) {
    let size = crate::size::parse_size(SIZE).expect("SIZE is a size `spyre run` takes");
    let plan = Plan::new(KernelArg::Axpy, size).expect("SIZE makes a plan");
    (size, plan)
}

/// One variable of the children's timing model, as they ran with it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ModelVariable {
    /// Its value.
    pub(crate) value: String,
    /// Where it came from.
    pub(crate) from: ModelSource,
}

/// Where a variable of the children's timing model came from; serialized
/// (and written) as `environment` or `spyre bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) enum ModelSource {
    /// This process's environment, which the children inherit.
    #[serde(rename = "environment")]
    Environment,
    /// Set for the children by the measurement.
    #[serde(rename = "spyre bench")]
    Bench,
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Environment => "environment",
            Self::Bench => "spyre bench",
        })
    }
}

/// The children's timing model on the software device, by variable.
pub(crate) type TimingModel = BTreeMap<&'static str, ModelVariable>;

/// The `SPYRE_MOCK_*` timing model the children run with: each variable as
/// the environment sets it, else this measurement's value.
fn timing_model(lookup: impl Fn(&str) -> Option<String>) -> TimingModel {
    // The children's operands, copied in 1 ms at this rate.
    let operand = child_plan().1.operand_bytes;
    [
        ("SPYRE_MOCK_OP_LATENCY_US", "1000".to_owned()),
        ("SPYRE_MOCK_COPY_BANDWIDTH", (operand * 1000).to_string()),
        ("SPYRE_MOCK_ENGINES", "4".to_owned()),
    ]
    .into_iter()
    .map(|(name, value)| {
        let variable = match lookup(name).filter(|value| !value.trim().is_empty()) {
            Some(value) => ModelVariable {
                value: value.trim().to_owned(),
                from: ModelSource::Environment,
            },
            None => ModelVariable {
                value,
                from: ModelSource::Bench,
            },
        };
        (name, variable)
    })
    .collect()
}

/// Refuses, before any measurement, a device whose memory cannot hold the
/// children's runs, serialized or pipelined (as a child would refuse it,
/// after every other measurement had run).
///
/// # Errors
/// [`CliError::Usage`] naming the child's invocation and why it does not
/// fit.
pub(super) fn check_capacity(layout: MemoryLayout) -> Result<(), CliError> {
    let (size, plan) = child_plan();
    let iterations = ITERATIONS.parse().expect("a whole number");
    for mode in [ModeArg::Serialized, ModeArg::Pipelined] {
        let args = RunArgs {
            threads: 1,
            iterations,
            size,
            kernel: KernelArg::Axpy,
            mode,
            // `spyre run`'s default, which the children keep.
            in_flight: 4,
            seed: 1,
            json: true,
            trace: None,
            timeline: None,
            exit_when_stdin_closes: false,
        };
        // The run's own advice names its flags, which the children's
        // invocation fixes.
        crate::run::check_capacity(&plan, &args, layout).map_err(|refused| {
            CliError::Usage(format!(
                "the pipeline measurement's child runs (`spyre run --threads 1 --iterations {ITERATIONS} --size {SIZE} --mode {}`) do not fit this device: {}; `spyre bench --pipeline false` skips that measurement",
                mode.name(),
                refused.reason
            ))
        })?;
    }
    Ok(())
}

/// One `spyre run` child in `mode`; returns its wall time and overlap.
fn run_child(mode: &str, env: &[(&'static str, String)]) -> Result<(Duration, f64), CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find this program to run it again: {e}")))?;
    let mut child = Command::new(exe)
        .args([
            "run",
            "--exit-when-stdin-closes",
            "--threads",
            "1",
            "--iterations",
            ITERATIONS,
            "--size",
            SIZE,
            "--mode",
            mode,
            "--json",
        ])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CliError::Failed(format!("cannot start `spyre run --mode {mode}`: {e}")))?;
    // Held until the child has ended: when this program ends, however it
    // ends, the pipe closes and the child stops (`--exit-when-stdin-closes`).
    let parent_alive = child.stdin.take();
    let output = child
        .wait_with_output()
        .map_err(|e| CliError::Failed(format!("cannot run `spyre run --mode {mode}`: {e}")))?;
    drop(parent_alive);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let parsed = serde_json::from_str::<Value>(stdout.trim());
    let report = match parsed {
        Ok(report) => report,
        // Ended before it could say why (a signal, say): what ended it, and
        // what it printed.
        Err(e) => {
            let said: Vec<_> = [
                stdout.trim(),
                String::from_utf8_lossy(&output.stderr).trim(),
            ]
            .into_iter()
            .filter(|text| !text.is_empty())
            .map(str::to_owned)
            .collect();
            let said = if said.is_empty() {
                "it printed nothing".to_owned()
            } else {
                format!("it printed: {}", said.join(" / "))
            };
            let ended = if output.status.success() {
                format!("printed no report ({e})")
            } else {
                format!("ended without a report ({})", output.status)
            };
            return Err(CliError::Failed(format!(
                "the pipeline measurement's child run (`spyre run --mode {mode}`) {ended}; {said}"
            )));
        }
    };
    if !output.status.success() {
        let message = report["error"].as_str().unwrap_or("no message");
        let skip = "`spyre bench --pipeline false` skips that measurement";
        // The child's exit code says whose fault it is: 2 is the invocation
        // (a bad environment, or a device too small for its size).
        return Err(
            if output.status.code() == Some(i32::from(crate::error::EXIT_USAGE)) {
                CliError::Usage(format!(
                    "the pipeline measurement's child run (`spyre run --threads 1 --iterations {ITERATIONS} --size {SIZE} --mode {mode}`) was refused: {message} (the flags it names are the measurement's own, not `spyre bench`'s); {skip}"
                ))
            } else {
                CliError::Failed(format!(
                    "the pipeline measurement's child run (`spyre run --mode {mode}`) failed ({}): {message}; {skip}",
                    output.status
                ))
            },
        );
    }
    let wall = report["wall_seconds"].as_f64().unwrap_or(0.0);
    let overlap = report["overlap"]["factor"].as_f64().unwrap_or(1.0);
    Ok((Duration::from_secs_f64(wall.max(0.0)), overlap))
}

/// The median of `values` (sorted in place); `values` is not empty.
fn median<T: Copy + PartialOrd>(values: &mut [T]) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    values[values.len() / 2]
}

/// Runs [`ROUNDS`] serialized and pipelined children, alternately; returns
/// their times and, on the software device, the timing model they ran
/// with ([`timing_model`]).
///
/// # Errors
/// [`CliError::Usage`] when a child refuses its invocation (exit code 2: a
/// bad environment, which this run shares); [`CliError::Failed`] when a
/// child cannot run or fails otherwise.
pub(super) fn measure(backend: BackendKind) -> Result<(PipelineTimes, TimingModel), CliError> {
    let model = match backend {
        BackendKind::Mock => timing_model(|name| std::env::var(name).ok()),
        BackendKind::Hardware => TimingModel::new(),
    };
    let env: Vec<(&'static str, String)> = model
        .iter()
        .filter(|(_, variable)| variable.from == ModelSource::Bench)
        .map(|(name, variable)| (*name, variable.value.clone()))
        .collect();
    let mut serialized = Vec::with_capacity(ROUNDS);
    let mut pipelined = Vec::with_capacity(ROUNDS);
    let mut overlaps = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        serialized.push(run_child("serialized", &env)?.0);
        let (wall, overlap) = run_child("pipelined", &env)?;
        pipelined.push(wall);
        overlaps.push(overlap);
    }
    let times = PipelineTimes {
        serialized_total: serialized.iter().sum(),
        pipelined_total: pipelined.iter().sum(),
        serialized: median(&mut serialized),
        pipelined: median(&mut pipelined),
        overlap: median(&mut overlaps),
    };
    Ok((times, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timing_model_fills_only_what_the_environment_leaves_unset() {
        let set = |value: &str| ModelVariable {
            value: value.to_owned(),
            from: ModelSource::Bench,
        };
        let all = timing_model(|_| None);
        assert_eq!(
            all,
            TimingModel::from([
                ("SPYRE_MOCK_OP_LATENCY_US", set("1000")),
                // 349 524 bytes per operand, in 1 ms.
                ("SPYRE_MOCK_COPY_BANDWIDTH", set("349524000")),
                ("SPYRE_MOCK_ENGINES", set("4")),
            ])
        );
        let some = timing_model(|name| (name == "SPYRE_MOCK_ENGINES").then(|| " 2 ".to_owned()));
        assert_eq!(
            some["SPYRE_MOCK_ENGINES"],
            ModelVariable {
                value: "2".to_owned(),
                from: ModelSource::Environment
            }
        );
        assert_eq!(some["SPYRE_MOCK_OP_LATENCY_US"], set("1000"));
        let blank = timing_model(|_| Some(" ".to_owned()));
        assert_eq!(blank, all, "empty is unset");
    }

    #[test]
    fn results_report_the_speedup_of_the_medians() {
        let times = PipelineTimes {
            serialized: Duration::from_millis(400),
            pipelined: Duration::from_millis(160),
            overlap: 2.5,
            serialized_total: Duration::from_millis(1_250),
            pipelined_total: Duration::from_millis(500),
        };
        let results = times.results();
        assert_eq!(results.len(), 4);
        assert_eq!(results[0].value, 400.0);
        assert_eq!(results[1].value, 160.0);
        assert!((results[2].value - 2.5).abs() < 1e-12, "400 / 160");
        assert_eq!(results[3].value, 2.5);
        // Each row's time is that of the runs it comes from.
        let runs: Vec<(u64, f64)> = results.iter().map(|r| (r.operations, r.seconds)).collect();
        assert_eq!(runs, [(3, 1.25), (3, 0.5), (6, 1.75), (3, 0.5)]);
        let statistics: Vec<Statistic> = results.iter().map(|r| r.statistic).collect();
        assert_eq!(
            statistics,
            [
                Statistic::Median,
                Statistic::Median,
                Statistic::RatioOfMedians,
                Statistic::Median
            ]
        );
        assert_eq!(median(&mut [3, 1, 2]), 2);
    }
}

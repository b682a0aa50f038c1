//! A trace of `spyre run` in the Chrome trace event format, which Perfetto
//! (ui.perfetto.dev) and `chrome://tracing` open: one track per stream,
//! named by its id and priority; every operation a slice from its start to
//! its finish on the device; every wait on an event a flow arrow from the
//! record it waited for to the moment the wait was passed (flow events
//! bound to slices by `bind_id`). The tracks' process is this process (its
//! id), named by the logical device and that id (`Spyre device 2 (process
//! 4711)`), so that the traces of a launch's ranks tell themselves apart
//! when opened together: their times are on the host's monotonic clock
//! (`CLOCK_MONOTONIC`, the time since boot, which every process of the
//! host reads alike), so that they line up, and their arrows' ids hold the
//! process id, so that no arrow joins two processes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spyre_stream::{OperationKind, Trace};

use super::output_file::OutputFile;
use crate::error::CliError;

/// What a written trace holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct TraceSummary {
    /// Operations drawn (launches, records and waits that ran).
    pub(crate) operations: usize,
    /// Streams (tracks).
    pub(crate) streams: usize,
}

/// The category of the zero-length slices that end the arrows from
/// records to waits.
const ARROW_END: &str = "flow";

/// `time` in microseconds, the unit of the format's times, from its whole
/// nanoseconds: the nearest `f64` to a number of three decimals, which
/// JSON writes as those three decimals. (Through seconds as `f64`, a time
/// came out as 1980.8809999999999 µs instead of 1980.881, and the slice
/// that starts where the one before it finished could start before it in
/// the file.) So up to 2^43 µs (101.8 days on the host's clock, where an
/// `f64`'s step grows past 1 ns); beyond, within that step, 2 ns up to
/// 203 days. A duration is written from two such times ([`duration`]), so
/// far into the clock it is often not three decimals (`87.7449951171875`),
/// a viewer's whole nanoseconds of it at most 1 ns short.
fn micros(time: Duration) -> f64 {
    time.as_nanos() as f64 / 1000.0
}

/// The duration from `start` to `end` in µs: [`micros`] of their
/// difference, made an `f64` step shorter where it must be so that, added
/// to `start`'s µs as a viewer adds them, it ends no later than `end`'s: a
/// slice then never ends after the next one of its stream starts, which
/// starts at this one's end or later. (1035.333 + 730.633 is
/// 1765.9660000000001 in `f64`, after 1765.966.)
fn duration(start: Duration, end: Duration) -> f64 {
    let (from, to) = (micros(start), micros(end));
    let duration = micros(end.saturating_sub(start));
    if from + duration <= to {
        return duration;
    }
    // The difference of the two as written: exact where `from` is at least
    // half of `to` (so `from` plus it is `to`); otherwise larger than half
    // of `to`, an `f64` step of which is at least half of one of `to`, so
    // a step or two down end it no later than `to`. (Stepping down from
    // the difference's own µs took a step of a short slice's size each
    // time: millions of them for a 0.015 µs slice far into a run.)
    let mut duration = (to - from).max(0.0);
    while duration > 0.0 && from + duration > to {
        duration = duration.next_down();
    }
    duration
}

/// The arrow id of the record linked `link` in this process's trace: the
/// link in the low 31 bits, the process id (below 2^22 on Linux) above
/// them, so that ids stay apart in the traces of several processes opened
/// together and below 2^53, which a viewer reading JSON numbers as `f64`
/// takes exactly.
fn arrow_id(pid: u32, link: u64) -> u64 {
    (u64::from(pid) << 31) | (link & ((1 << 31) - 1))
}

/// Where the times of a trace that began at `origin` start on the host's
/// monotonic clock (`CLOCK_MONOTONIC`, which `Instant` reads on Linux):
/// that clock's reading now, less the time since `origin`. Zero for a
/// trace without an origin, and where the clock cannot be read.
fn clock_at(origin: Option<Instant>) -> Duration {
    let Some(origin) = origin else {
        return Duration::ZERO;
    };
    #[cfg(unix)]
    {
        // In this order the result is at or after the origin's reading,
        // never before it by the time between the two calls.
        let since = origin.elapsed();
        let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        u64::try_from(now.tv_sec)
            .ok()
            .zip(u32::try_from(now.tv_nsec).ok())
            .map_or(Duration::ZERO, |(secs, nanos)| {
                Duration::new(secs, nanos).saturating_sub(since)
            })
    }
    #[cfg(not(unix))]
    {
        let _ = origin;
        Duration::ZERO
    }
}

/// Writes Chrome trace events one at a time, as the elements of the
/// document's `traceEvents` array.
struct EventWriter<'a> {
    out: &'a mut dyn Write,
    written: usize,
}

impl EventWriter<'_> {
    fn event(&mut self, event: &Value) -> std::io::Result<()> {
        if self.written > 0 {
            self.out.write_all(b",")?;
        }
        self.written += 1;
        serde_json::to_writer(&mut *self.out, event)?;
        Ok(())
    }
}

/// What a trace says of the process that made it.
#[derive(Clone, Copy, Debug, Default)]
struct Process {
    /// The trace's origin on the host's monotonic clock ([`clock_at`]),
    /// which its times are written from.
    clock: Duration,
    /// Its rank in a launch, where a launcher chose its device: named in
    /// the process's name beside the device, which ranks that each see
    /// only their own devices (`SPYRE_DEVICES` per rank) all call 0.
    rank: Option<u64>,
}

/// Writes `trace` to `out` as a Chrome trace document, one event at a
/// time: what is held in memory meanwhile is one event, the streams seen
/// and the records waited for, not the document; `process` says of the
/// process what the document names.
///
/// # Errors
/// The writer's.
fn write_events(
    out: &mut dyn Write,
    trace: &Trace,
    process: Process,
) -> std::io::Result<TraceSummary> {
    let clock = process.clock;
    // The trace's one process: this one's id (never 0, which viewers take
    // for the kernel's idle task), so that ranks' traces opened together
    // stay apart.
    let pid = std::process::id();
    // The records whose slices are written (they finished): only those
    // can start an arrow.
    let records: BTreeSet<u64> = trace
        .entries
        .iter()
        .filter(|e| e.kind == OperationKind::EventRecord && e.finished.is_some())
        .filter_map(|e| e.link)
        .collect();
    out.write_all(br#"{"displayTimeUnit":"ms","traceEvents":["#)?;
    let mut events = EventWriter { out, written: 0 };
    let mut streams = BTreeMap::new();
    let mut operations = 0;
    for entry in &trace.entries {
        let (Some(started), Some(finished)) = (entry.started, entry.finished) else {
            continue;
        };
        let (started, finished) = (clock + started, clock + finished);
        let tid = entry.stream.id().get();
        streams.insert(tid, entry.stream.priority());
        operations += 1;
        let mut args = json!({
            "enqueued_us": micros(clock + entry.enqueued),
            "failed": entry.failed,
        });
        if entry.bytes > 0 {
            args["bytes"] = json!(entry.bytes);
        }
        if entry.pipeline_barrier {
            args["pipeline_barrier"] = json!(true);
        }
        let name = if entry.bytes > 0 {
            format!("{} {} B", entry.kind.name(), entry.bytes)
        } else {
            entry.kind.name().to_owned()
        };
        let mut slice = json!({
            "name": name,
            "cat": entry.kind.name(),
            "ph": "X",
            "pid": pid,
            "tid": tid,
            "ts": micros(started),
            "dur": duration(started, finished),
            "args": args,
        });
        // A record and the waits on it: an arrow from the record's slice to
        // where each wait was passed. The arrow ends on a slice of its own,
        // at the wait's finish, not on the wait's slice: a wait starts when
        // its stream gets to it, often before the record starts, and
        // viewers that read the events in time order (Perfetto) drop an
        // arrow whose end comes before its start. The wait's finish is at
        // or after the record's (the trace derives it so).
        let arrow_end = match (entry.kind, entry.link) {
            (OperationKind::EventRecord, Some(link)) => {
                slice["bind_id"] = json!(arrow_id(pid, link));
                slice["flow_out"] = json!(true);
                None
            }
            (OperationKind::EventWait, Some(link)) if records.contains(&link) => Some(json!({
                "name": "event wait passed",
                "cat": ARROW_END,
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": micros(finished),
                "dur": 0,
                "bind_id": arrow_id(pid, link),
                "flow_in": true,
            })),
            _ => None,
        };
        events.event(&slice)?;
        if let Some(arrow_end) = arrow_end {
            events.event(&arrow_end)?;
        }
    }
    for (&tid, &priority) in &streams {
        let pool = if priority < 0 {
            "high priority"
        } else {
            "normal priority"
        };
        events.event(
            &json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
            "args": {"name": format!("stream {tid} ({pool})")}}),
        )?;
        events.event(
            &json!({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
            "args": {"sort_index": tid}}),
        )?;
    }
    // The device and the process that ran the work: per-rank traces of a
    // launch tell themselves apart.
    let device = trace.entries.first().map_or_else(String::new, |entry| {
        format!(" {}", entry.stream.device_index())
    });
    let rank = process
        .rank
        .map_or_else(String::new, |rank| format!("rank {rank}, "));
    events.event(&json!({"name": "process_name", "ph": "M", "pid": pid,
        "args": {"name": format!("Spyre device{device} ({rank}process {pid})")}}))?;
    out.write_all(b"]}")?;
    Ok(TraceSummary {
        operations,
        streams: streams.len(),
    })
}

/// Writes `trace` to `file` in the Chrome trace event format, streamed
/// (see [`write_events`]), naming the process's `rank` in a launch where a
/// launcher chose its device.
///
/// # Errors
/// [`CliError::Failed`] naming the path when it cannot be written.
pub(crate) fn write_chrome_trace(
    file: OutputFile,
    trace: &Trace,
    rank: Option<u64>,
) -> Result<TraceSummary, CliError> {
    let process = Process {
        clock: clock_at(trace.origin),
        rank,
    };
    file.write_with("trace", |out| write_events(out, trace, process))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use spyre_stream::{SpyreStream, StreamId, TraceEntry};

    use super::*;

    /// A fill on stream 1 that ran from `at` µs for 1 µs.
    fn fill(at: u64, pipeline_barrier: bool) -> TraceEntry {
        TraceEntry {
            stream: SpyreStream::from_parts(0, StreamId(1)),
            kind: OperationKind::Fill,
            bytes: 1024,
            pipeline_barrier,
            enqueued: Duration::from_micros(at),
            started: Some(Duration::from_micros(at)),
            finished: Some(Duration::from_micros(at + 1)),
            failed: false,
            link: None,
        }
    }

    /// A slice's start plus its duration, added as a viewer adds them,
    /// never passes its end, for starts and ends of whole nanoseconds over
    /// a range; the reviewer's pair 1035.333 µs + 730.633 µs among them
    /// (1765.9660000000001 with the difference's own µs).
    #[test]
    fn a_slice_never_ends_after_its_end() {
        let ns = Duration::from_nanos;
        let (start, end) = (ns(1_035_333), ns(1_765_966));
        assert!(
            micros(start) + micros(end - start) > micros(end),
            "the case needs the step"
        );
        assert!(micros(start) + duration(start, end) <= micros(end));
        // Starts far into a run (up to 1 000 s) with slices of a few ns,
        // where a step of the slice's own size is far shorter than one of
        // its end's, and those of the first milliseconds.
        // And at the host clock's times: a day, 68 000 s (this machine's
        // uptime when it was written) and 101 days after boot.
        let starts = (0..3_000_000u64)
            .step_by(997)
            .chain((0..1_000).map(|i| i * 1_000_000_007))
            .chain(
                [86_400, 68_000, 101 * 86_400]
                    .into_iter()
                    .flat_map(|secs: u64| (0..200).map(move |i| secs * 1_000_000_000 + i * 7_919)),
            );
        for start_ns in starts {
            for length_ns in [0, 1, 7, 15, 999, 730_633, 2_000_001] {
                let (start, end) = (ns(start_ns), ns(start_ns + length_ns));
                let (from, to, d) = (micros(start), micros(end), duration(start, end));
                assert!(from + d <= to, "{from} + {d} > {to}");
                // Short by no more than the `f64` steps there (and far
                // below a nanosecond in the first 1 000 s).
                let step = to.next_up() - to;
                assert!(
                    to - (from + d) <= (2.0 * step).max(1e-6),
                    "{d} is short of {to} - {from}"
                );
            }
        }
    }

    /// Times are written as the decimals of their whole nanoseconds, so a
    /// slice that starts where the one before it on its stream finished
    /// starts exactly there: 1772.161 µs + 208.72 µs is 1980.881 µs, which
    /// through seconds as `f64` was written 1980.8809999999999 (before the
    /// previous slice's end).
    #[test]
    fn consecutive_slices_of_a_stream_meet_exactly() {
        let at = |nanos| Some(Duration::from_nanos(nanos));
        let mut first = fill(0, false);
        (first.started, first.finished) = (at(1_772_161), at(1_980_881));
        let mut second = fill(0, false);
        (second.started, second.finished) = (at(1_980_881), at(1_981_000));
        let mut out = Vec::new();
        write_events(
            &mut out,
            &Trace {
                entries: vec![first, second],
                origin: None,
            },
            Process::default(),
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        for written in [r#""dur":208.72,"#, r#""ts":1772.161}"#, r#""ts":1980.881}"#] {
            assert!(text.contains(written), "{written} in {text}");
        }
    }

    #[test]
    fn a_slice_names_its_pipeline_barrier_only_when_it_had_one() {
        let trace = Trace {
            entries: vec![fill(0, false), fill(2, true)],
            origin: None,
        };
        let mut out = Vec::new();
        let summary = write_events(&mut out, &trace, Process::default()).unwrap();
        assert_eq!((summary.operations, summary.streams), (2, 1));
        let document: Value = serde_json::from_slice(&out).unwrap();
        let args: Vec<&Value> = document["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| &e["args"])
            .collect();
        assert_eq!(args.len(), 2);
        assert!(args[0].get("pipeline_barrier").is_none(), "{}", args[0]);
        assert_eq!(args[1]["pipeline_barrier"], true);
        let process = document["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "process_name")
            .unwrap();
        assert_eq!(
            process["args"]["name"],
            format!("Spyre device 0 (process {})", std::process::id())
        );
        assert_eq!(process["pid"], std::process::id());
    }

    /// A record on stream 1 at 10–11 µs and a wait on it on stream 2 that
    /// finished at 12 µs, written from a clock at 5 s by rank 3: every time
    /// is 5 s later than the trace's own, both ends of the arrow carry the
    /// record's link 7 beside this process's id, and the process's name
    /// has the rank.
    #[test]
    fn times_count_from_the_clock_and_arrows_carry_the_process_id() {
        let at = |micros| Some(Duration::from_micros(micros));
        let record = TraceEntry {
            kind: OperationKind::EventRecord,
            bytes: 0,
            link: Some(7),
            started: at(10),
            finished: at(11),
            enqueued: Duration::from_micros(9),
            ..fill(0, false)
        };
        let wait = TraceEntry {
            stream: SpyreStream::from_parts(0, StreamId(2)),
            kind: OperationKind::EventWait,
            bytes: 0,
            link: Some(7),
            started: at(8),
            finished: at(12),
            enqueued: Duration::from_micros(8),
            ..fill(0, false)
        };
        let trace = Trace {
            entries: vec![record, wait],
            origin: None,
        };
        let mut out = Vec::new();
        let process = Process {
            clock: Duration::from_secs(5),
            rank: Some(3),
        };
        write_events(&mut out, &trace, process).unwrap();
        let document: Value = serde_json::from_slice(&out).unwrap();
        let events = document["traceEvents"].as_array().unwrap();
        let slices: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        let times: Vec<_> = slices.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
        assert_eq!(times, [5_000_010.0, 5_000_008.0, 5_000_012.0]);
        assert_eq!(slices[0]["args"]["enqueued_us"], 5_000_009.0);
        let id = (u64::from(std::process::id()) << 31) | 7;
        assert_eq!(slices[0]["bind_id"], id, "the record's end");
        assert_eq!(slices[2]["bind_id"], id, "the wait's end");
        assert_eq!(arrow_id(3, (1 << 31) + 7), (3 << 31) | 7);
        let process = events.iter().find(|e| e["name"] == "process_name").unwrap();
        assert_eq!(
            process["args"]["name"],
            format!("Spyre device 0 (rank 3, process {})", std::process::id()),
            "a launch's rank is named"
        );
    }

    /// The clock is the host's monotonic one: a trace that began now
    /// starts at `CLOCK_MONOTONIC`'s reading now (within the time between
    /// the two readings), one that began 50 ms ago 50 ms before it.
    #[cfg(unix)]
    #[test]
    fn the_clock_is_the_hosts_monotonic_clock() {
        let monotonic = || {
            let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
            Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
        };
        let before = monotonic();
        let origin = Instant::now();
        let clock = clock_at(Some(origin));
        let after = monotonic();
        assert!(
            before <= clock && clock <= after,
            "{before:?} {clock:?} {after:?}"
        );
        let earlier = origin.checked_sub(Duration::from_millis(50)).unwrap();
        let back = clock - clock_at(Some(earlier));
        assert!(
            back.abs_diff(Duration::from_millis(50)) < Duration::from_millis(5),
            "{back:?}"
        );
        assert_eq!(clock_at(None), Duration::ZERO);
    }
}

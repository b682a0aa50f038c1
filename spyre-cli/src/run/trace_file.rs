//! A trace of `spyre run` in the Chrome trace event format, which Perfetto
//! (ui.perfetto.dev) and `chrome://tracing` open: one track per stream,
//! named by its id and priority; every operation a slice from its start to
//! its finish on the device; every wait on an event a flow arrow from the
//! record it waited for (flow events bound to the slices by `bind_id`).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use spyre_stream::{OperationKind, Trace, TraceEntry};

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

/// The trace's one process (not 0, which viewers take for the kernel's
/// idle task).
const PID: u32 = 1;

fn micros(time: std::time::Duration) -> f64 {
    time.as_secs_f64() * 1e6
}

/// The trace as Chrome trace events.
pub(crate) fn chrome_trace(trace: &Trace) -> (Value, TraceSummary) {
    let mut events = Vec::new();
    let mut streams = BTreeMap::new();
    let records: BTreeMap<u64, &TraceEntry> = trace
        .entries
        .iter()
        .filter(|e| e.kind == OperationKind::EventRecord)
        .filter_map(|e| Some((e.link?, e)))
        .collect();
    let mut operations = 0;
    for entry in &trace.entries {
        let (Some(started), Some(finished)) = (entry.started, entry.finished) else {
            continue;
        };
        let tid = entry.stream.id().get();
        streams.insert(tid, entry.stream.priority());
        operations += 1;
        let mut args = json!({
            "enqueued_us": micros(entry.enqueued),
            "failed": entry.failed,
        });
        if entry.bytes > 0 {
            args["bytes"] = json!(entry.bytes);
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
            "pid": PID,
            "tid": tid,
            "ts": micros(started),
            "dur": micros(finished.saturating_sub(started)),
            "args": args,
        });
        // A record and the waits on it: an arrow from the record's slice
        // to each wait's (flow events bound to the slices by id).
        match (entry.kind, entry.link) {
            (OperationKind::EventRecord, Some(link)) => {
                slice["bind_id"] = json!(link);
                slice["flow_out"] = json!(true);
            }
            (OperationKind::EventWait, Some(link)) if records.contains_key(&link) => {
                slice["bind_id"] = json!(link);
                slice["flow_in"] = json!(true);
            }
            _ => {}
        }
        events.push(slice);
    }
    for (&tid, &priority) in &streams {
        let pool = if priority < 0 {
            "high priority"
        } else {
            "normal priority"
        };
        events.push(
            json!({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid,
            "args": {"name": format!("stream {tid} ({pool})")}}),
        );
        events.push(
            json!({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid,
            "args": {"sort_index": tid}}),
        );
    }
    events.push(json!({"name": "process_name", "ph": "M", "pid": PID,
        "args": {"name": "Spyre device"}}));
    let summary = TraceSummary {
        operations,
        streams: streams.len(),
    };
    (
        json!({"displayTimeUnit": "ms", "traceEvents": events}),
        summary,
    )
}

/// Writes `trace` to `file` in the Chrome trace event format.
///
/// # Errors
/// [`CliError::Failed`] naming the path when it cannot be written.
pub(crate) fn write_chrome_trace(
    file: OutputFile,
    trace: &Trace,
) -> Result<TraceSummary, CliError> {
    let (value, summary) = chrome_trace(trace);
    file.write("trace", value.to_string().as_bytes())?;
    Ok(summary)
}

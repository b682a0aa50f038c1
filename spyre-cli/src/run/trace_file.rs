//! A trace of `spyre run` in the Chrome trace event format, which Perfetto
//! (ui.perfetto.dev) and `chrome://tracing` open: one track per stream,
//! named by its id and priority; every operation a slice from its start to
//! its finish on the device; every wait on an event a flow arrow from the
//! record it waited for.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use spyre_stream::{OperationKind, Trace, TraceEntry};

use crate::error::CliError;

/// What a written trace holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct TraceSummary {
    /// Operations drawn (launches, records and waits that ran).
    pub(crate) operations: usize,
    /// Streams (tracks).
    pub(crate) streams: usize,
}

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
    for (index, entry) in trace.entries.iter().enumerate() {
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
        events.push(json!({
            "name": name,
            "cat": entry.kind.name(),
            "ph": "X",
            "pid": 0,
            "tid": tid,
            "ts": micros(started),
            "dur": micros(finished.saturating_sub(started)),
            "args": args,
        }));
        // A wait: an arrow from the end of the record it waited for.
        if entry.kind == OperationKind::EventWait
            && let Some(record) = entry.link.and_then(|link| records.get(&link))
            && let Some(recorded) = record.finished
        {
            let from = record.stream.id().get();
            events.push(
                json!({"name": "event", "cat": "event", "ph": "s", "id": index,
                "pid": 0, "tid": from, "ts": micros(recorded)}),
            );
            events.push(
                json!({"name": "event", "cat": "event", "ph": "f", "bp": "e", "id": index,
                "pid": 0, "tid": tid, "ts": micros(finished)}),
            );
        }
    }
    for (&tid, &priority) in &streams {
        let pool = if priority < 0 {
            "high priority"
        } else {
            "normal priority"
        };
        events.push(
            json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
            "args": {"name": format!("stream {tid} ({pool})")}}),
        );
        events.push(
            json!({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
            "args": {"sort_index": tid}}),
        );
    }
    events.push(json!({"name": "process_name", "ph": "M", "pid": 0,
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

/// Writes `trace` to `path` in the Chrome trace event format.
///
/// # Errors
/// [`CliError::Failed`] naming the path when it cannot be written.
pub(crate) fn write_chrome_trace(path: &Path, trace: &Trace) -> Result<TraceSummary, CliError> {
    let (value, summary) = chrome_trace(trace);
    std::fs::write(path, value.to_string()).map_err(|e| {
        CliError::Failed(format!("cannot write the trace to {}: {e}", path.display()))
    })?;
    Ok(summary)
}

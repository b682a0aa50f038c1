//! A picture of `spyre run`'s trace: an SVG timeline with one row per
//! stream, every operation a bar from when its stream reached it to its
//! finish on the device (time waiting for a free engine included; see
//! `spyre_stream::TraceEntry::started`), coloured by kind, with a legend
//! and a time axis in milliseconds. Drawn with plotters.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use spyre_stream::{OperationKind, Trace};

use super::output_file::OutputFile;
use crate::error::CliError;

/// The kinds drawn as bars, with their colours, in legend order.
const KINDS: [(OperationKind, RGBColor); 5] = [
    (OperationKind::H2d, RGBColor(31, 119, 180)),
    (OperationKind::Compute, RGBColor(255, 127, 14)),
    (OperationKind::D2h, RGBColor(44, 160, 44)),
    (OperationKind::Fill, RGBColor(148, 103, 189)),
    (OperationKind::HostCallback, RGBColor(140, 86, 75)),
];
/// Event records and waits: ticks, not bars.
const MARKER: RGBColor = RGBColor(90, 90, 90);

/// Refuses a path that does not end in `.svg` (the one format drawn).
///
/// # Errors
/// [`CliError::Usage`] naming the path.
pub(crate) fn check_path(path: &Path) -> Result<(), CliError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.eq_ignore_ascii_case("svg") => Ok(()),
        _ => Err(CliError::Usage(format!(
            "--timeline {}: the timeline is drawn as SVG; give a file name ending in .svg, with a name before it (run.svg)",
            path.display()
        ))),
    }
}

/// Writes the timeline of `trace` to `file`.
///
/// # Errors
/// [`CliError::Failed`] naming the path when the picture cannot be drawn
/// or written.
pub(crate) fn write_timeline(file: OutputFile, trace: &Trace) -> Result<(), CliError> {
    let svg = draw(trace).map_err(|e| {
        CliError::Failed(format!(
            "cannot draw the timeline into {}: {e}",
            file.path().display()
        ))
    })?;
    file.write("timeline", svg.as_bytes())
}

/// The timeline of `trace` as an SVG document.
fn draw(trace: &Trace) -> Result<String, Box<dyn std::error::Error>> {
    // Rows: the streams, by id; times in milliseconds.
    let mut rows: BTreeMap<i64, i32> = BTreeMap::new();
    let mut end_ms = 0f64;
    for entry in &trace.entries {
        if let Some(finished) = entry.finished {
            rows.insert(entry.stream.id().get(), 0);
            end_ms = end_ms.max(finished.as_secs_f64() * 1e3);
        }
    }
    for (row, index) in rows.values_mut().zip(0..) {
        *row = index;
    }
    let labels: Vec<i64> = rows.keys().copied().collect();
    let count = rows.len().max(1) as i32;
    let height = 90 + 26 * count as u32;
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("spyre run: operations by stream", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(90)
        // The right fifth is left free for the legend.
        .build_cartesian_2d(
            0f64..end_ms.max(1e-3) * 1.25,
            (0i32..count).into_segmented(),
        )?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("time on the device (ms)")
        .y_labels(labels.len())
        .y_label_formatter(&|row| match row {
            SegmentValue::CenterOf(row) => labels
                .get(*row as usize)
                .map_or_else(String::new, |id| format!("stream {id}")),
            _ => String::new(),
        })
        .draw()?;
    // A bar fills its stream's row.
    let span = |row: i32| (SegmentValue::Exact(row), SegmentValue::Exact(row + 1));
    for (kind, colour) in KINDS {
        let bars = trace
            .entries
            .iter()
            .filter(|e| e.kind == kind)
            .filter_map(|e| {
                let (started, finished) = (e.started?, e.finished?);
                let row = rows[&e.stream.id().get()];
                let (from, to) = (started.as_secs_f64() * 1e3, finished.as_secs_f64() * 1e3);
                let (bottom, top) = span(row);
                Some(Rectangle::new(
                    [(from, bottom), (to, top)],
                    colour.mix(0.85).filled(),
                ))
            });
        chart
            .draw_series(bars)?
            .label(kind.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    let ticks = trace
        .entries
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                OperationKind::EventRecord | OperationKind::EventWait
            )
        })
        .filter_map(|e| {
            let at = e.finished?.as_secs_f64() * 1e3;
            let row = rows[&e.stream.id().get()];
            let (bottom, top) = span(row);
            Some(PathElement::new(vec![(at, bottom), (at, top)], MARKER))
        });
    chart
        .draw_series(ticks)?
        .label("event record / wait")
        .legend(|(x, y)| PathElement::new(vec![(x + 6, y - 6), (x + 6, y + 6)], MARKER));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    drop(chart);
    drop(root);
    Ok(svg)
}

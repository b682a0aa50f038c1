//! `spyre bench`: quick measurements a user can run on a host.
//!
//! Each measurement runs one untimed warm-up batch, then whole batches until
//! its time budget (`--budget-ms`, default 250 ms) is spent, and reports the
//! mean. With the default three transfer sizes that is nine measurements,
//! about 2.3 s. Then the `pipeline` measurement ([`pipeline`]) compares the
//! same work pipelined across streams with events against it serialized on
//! one stream, in child processes (a few seconds more). These are spot
//! checks; the criterion benchmarks in the crates' `benches/` directories
//! are the careful measurements.

pub(crate) mod pipeline;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::Serialize;
use spyre_stream::{
    ADDRESS_ALIGNMENT, Device, HostBuffer, LaunchOptions, MAX_ADDRESS_CHUNKS, MemoryLayout,
    SpyreStream, Status,
};

use crate::cli::BenchArgs;
use crate::error::CliError;
use crate::output;
use crate::size::format_size;

/// Host memory the bandwidth measurements use at most per batch.
const BATCH_BYTES: u64 = 64 << 20;
/// Most copies per bandwidth batch.
const MAX_COPIES_PER_BATCH: u64 = 8;

/// What a measurement's value is of its operations or runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Statistic {
    /// Their mean: the time they took over their number (or the bytes
    /// moved over the time).
    Mean,
    /// The median of the runs (the pipeline's rows, from its child runs).
    Median,
    /// The ratio of two medians (the pipeline's speedup: the serialized
    /// runs' over the pipelined runs').
    RatioOfMedians,
}

impl Statistic {
    /// The name in the text table.
    fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Median => "median",
            Self::RatioOfMedians => "ratio",
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct BenchResult {
    /// What was measured.
    pub(crate) name: &'static str,
    /// Transfer size in bytes, for bandwidth measurements.
    pub(crate) size_bytes: Option<u64>,
    /// The figure: what [`BenchResult::statistic`] says it is.
    pub(crate) value: f64,
    /// Unit of `value`: `ns/op`, `us/op`, `GB/s`, `ms/run` or `x` (a ratio).
    pub(crate) unit: &'static str,
    /// What `value` is of the operations timed.
    pub(crate) statistic: Statistic,
    /// Operations timed (for the pipeline's rows, its child runs).
    pub(crate) operations: u64,
    /// Time they took, in seconds (for a ratio, the runs it comes from).
    pub(crate) seconds: f64,
}

/// Everything `spyre bench` reports; `--json` prints it as one object.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct BenchReport {
    /// The backend measured.
    pub(crate) backend: &'static str,
    /// The logical device measured.
    pub(crate) device: u8,
    /// What chose it ([`spyre_stream::DeviceSource::name`]).
    pub(crate) device_source: &'static str,
    /// Time budget of each measurement, in milliseconds.
    pub(crate) budget_ms: u64,
    /// The measurements, in the order they ran.
    pub(crate) results: Vec<BenchResult>,
    /// The backend's description of the device measured (the software
    /// device's configuration, its timing model among it).
    pub(crate) backend_details: BTreeMap<&'static str, String>,
    /// The software device's timing model the pipeline measurement's child
    /// runs had, by variable, each with where it came from (empty without
    /// the measurement, and on a Spyre device).
    pub(crate) pipeline_timing_model: pipeline::TimingModel,
}

/// Runs batches of operations until `budget` is spent, after one untimed
/// warm-up operation, and returns the operations timed and their time.
/// Batches start at one operation and double up to `max_batch` while the
/// time per operation seen so far says the next batch fits in what is left
/// of the budget, so a measurement overruns its budget by at most one
/// operation, however slow the device (at least two operations always run).
fn measure(
    budget: Duration,
    max_batch: u64,
    run_batch: impl FnMut(u64) -> Result<(), CliError>,
) -> Result<(u64, Duration), CliError> {
    measure_by(Instant::now, budget, max_batch, run_batch)
}

/// [`measure`], reading the time from `now` (a clock of the tests' own,
/// which their batches move, so that no pause of the machine changes what
/// they check).
fn measure_by(
    now: impl Fn() -> Instant,
    budget: Duration,
    max_batch: u64,
    mut run_batch: impl FnMut(u64) -> Result<(), CliError>,
) -> Result<(u64, Duration), CliError> {
    run_batch(1)?;
    let start = now();
    let mut operations = 0;
    let mut batch = 1;
    loop {
        run_batch(batch)?;
        operations += batch;
        let elapsed = now() - start;
        if elapsed >= budget {
            return Ok((operations, elapsed));
        }
        let per_operation = elapsed.as_secs_f64() / operations as f64;
        let fits = ((budget - elapsed).as_secs_f64() / per_operation.max(1e-12)) as u64;
        batch = (batch * 2).min(max_batch).min(fits).max(1);
    }
}

/// A latency result in `unit` (`ns/op` or `us/op`).
fn latency(
    name: &'static str,
    unit: &'static str,
    (operations, elapsed): (u64, Duration),
) -> BenchResult {
    let per_op = elapsed.as_secs_f64() / operations as f64;
    BenchResult {
        name,
        size_bytes: None,
        value: if unit == "ns/op" {
            per_op * 1e9
        } else {
            per_op * 1e6
        },
        unit,
        statistic: Statistic::Mean,
        operations,
        seconds: elapsed.as_secs_f64(),
    }
}

/// A stream-layer error of the benchmark.
fn stream_error(context: &'static str) -> impl Fn(spyre_stream::Error) -> CliError {
    move |e| CliError::stream(context, e)
}

/// What `spyre bench` measured, and the error that ended it part-way, if
/// one did: the measurements made before it are kept and reported.
pub(crate) struct BenchOutcome {
    pub(crate) report: BenchReport,
    pub(crate) failed: Option<CliError>,
}

/// Runs every measurement.
///
/// # Errors
/// The stream layer's error, and [`CliError::Usage`] for a transfer size
/// the device cannot hold, or, with the pipeline measurement, for a
/// runtime without events, when they come before any measurement, and
/// the error of the first measurement when it fails. An error during a
/// later one ends the run there, in [`BenchOutcome::failed`], with the
/// measurements made before it.
pub(crate) fn bench(args: &BenchArgs) -> Result<BenchOutcome, CliError> {
    spyre_stream::start_runtime().map_err(stream_error("starting the Spyre runtime"))?;
    if args.pipeline {
        // Its child runs need events: refused now, not after the rest.
        crate::run::require_timed_events(
            "the pipeline measurement",
            "skip it with `spyre bench --pipeline false`",
        )?;
    }
    let kind = spyre_stream::selected_backend().map_err(stream_error("choosing the backend"))?;
    let info = spyre_stream::runtime_info()
        .ok_or_else(|| CliError::Failed("the Spyre runtime did not start".into()))?;
    // Every size, and the pipeline's children, checked before the first
    // measurement: not refused after the others have run.
    let layout = spyre_stream::memory_layout(Device::CURRENT)
        .map_err(stream_error("reading the device's memory layout"))?;
    // The software device's engines may each get an allocator arena as
    // they first run a copy (what an address-space limit counts).
    let reserved = crate::host_memory::arena_bytes(crate::run::engines(&info).unwrap_or(0));
    for &size in &args.sizes {
        check_size(size, layout, info.backend == "mock", reserved)?;
    }
    if args.pipeline
        && let Some(layout) = layout
    {
        pipeline::check_capacity(layout)?;
    }
    let mut report = BenchReport {
        backend: info.backend,
        device: info.device,
        device_source: info.device_source.name(),
        budget_ms: args.budget_ms,
        results: Vec::new(),
        backend_details: info.backend_details.into_iter().collect(),
        pipeline_timing_model: pipeline::TimingModel::new(),
    };
    match measure_all(args, kind, &mut report) {
        // Nothing measured: the error alone, as for one before the start.
        Err(error) if report.results.is_empty() => Err(error),
        measured => Ok(BenchOutcome {
            report,
            failed: measured.err(),
        }),
    }
}

/// Makes every measurement of `args` on the backend `kind`, into `report`,
/// showing their progress.
///
/// # Errors
/// The first measurement's error, naming the measurement
/// ([`CliError::Measurement`]); `report` keeps those made before it.
fn measure_all(
    args: &BenchArgs,
    kind: spyre_stream::BackendKind,
    report: &mut BenchReport,
) -> Result<(), CliError> {
    let budget = Duration::from_millis(args.budget_ms);
    let progress = Progress::new(3 + 2 * args.sizes.len() as u64, args.pipeline, budget);
    let measured = measure_each(args, kind, report, &progress);
    progress.finish();
    measured.map_err(|error| match progress.current.take() {
        Some(name) => CliError::Measurement {
            name,
            source: Box::new(error),
        },
        None => error,
    })
}

/// [`measure_all`]'s measurements, each named to `progress` as it starts.
fn measure_each(
    args: &BenchArgs,
    kind: spyre_stream::BackendKind,
    report: &mut BenchReport,
    progress: &Progress,
) -> Result<(), CliError> {
    let pool =
        spyre_stream::global_pool().map_err(stream_error("using the process's stream pool"))?;
    let budget = Duration::from_millis(args.budget_ms);
    let stream = spyre_stream::stream_from_pool(Device::CURRENT, 0).map_err(stream_error(
        concat!("taking a stream from the pool", first_take!()),
    ))?;
    let results = &mut report.results;

    progress.start("handle resolution");
    let timed = measure(budget, 10_000, |batch| {
        for _ in 0..batch {
            black_box(
                pool.resolve(black_box(stream))
                    .map_err(stream_error("resolving a handle"))?,
            );
        }
        Ok(())
    })?;
    results.push(latency("handle resolution", "ns/op", timed));

    progress.start("pool assignment");
    let mut priority = 0;
    let timed = measure(budget, 1_000, |batch| {
        for _ in 0..batch {
            priority = if priority == 0 { -1 } else { 0 };
            black_box(
                spyre_stream::stream_from_pool(Device::CURRENT, priority)
                    .map_err(stream_error("taking a stream from the pool"))?,
            );
        }
        Ok(())
    })?;
    results.push(latency("pool assignment", "ns/op", timed));

    progress.start("empty op round trip");
    let timed = measure(budget, 100, |batch| {
        for _ in 0..batch {
            stream
                .launch_host_callback(|| {}, LaunchOptions::new())
                .map_err(stream_error("launching a host callback"))?;
            stream
                .synchronize()
                .map_err(stream_error("synchronizing the stream"))?;
        }
        Ok(())
    })?;
    results.push(latency("empty op round trip", "us/op", timed));

    for &size in &args.sizes {
        progress.start(&format!("H2D bandwidth, {}", format_size(size)));
        results.push(bandwidth(stream, budget, size, Direction::HostToDevice)?);
        progress.start(&format!("D2H bandwidth, {}", format_size(size)));
        results.push(bandwidth(stream, budget, size, Direction::DeviceToHost)?);
    }
    if args.pipeline {
        progress.start("pipeline: pipelined against serialized, in child processes");
        let (times, model) = pipeline::measure(kind)?;
        results.extend(times.results());
        report.pipeline_timing_model = model;
    }
    Ok(())
}

/// About how long the pipeline measurement takes: six child runs, of
/// 0.13–0.33 s each on the software device with its timing model, and the
/// children's start.
const PIPELINE_ESTIMATE: Duration = Duration::from_secs(2);

/// Which measurement runs and how many are left, on stderr when it is a
/// terminal (hidden otherwise, so that pipes and `--json` get no bar).
struct Progress {
    bar: ProgressBar,
    /// Measurements of one budget each, before the pipeline's.
    budgeted: u64,
    budget: Duration,
    /// The measurement started last, for an error that ends it.
    current: std::cell::RefCell<Option<String>>,
}

impl Progress {
    fn new(budgeted: u64, pipeline: bool, budget: Duration) -> Self {
        Self {
            bar: output::progress_bar(budgeted + u64::from(pipeline), "{spinner} {msg}"),
            budgeted,
            budget,
            current: std::cell::RefCell::new(None),
        }
    }

    /// Names the next measurement, its place and the time left: a budget
    /// for each measurement from this one on, and the pipeline's estimate
    /// ([`PIPELINE_ESTIMATE`]) while it is to come.
    fn start(&self, name: &str) {
        *self.current.borrow_mut() = Some(name.to_owned());
        self.bar.inc(1);
        let (place, total) = (self.bar.position(), self.bar.length().unwrap_or(0));
        let budgets = (self.budgeted + 1).saturating_sub(place);
        let pipeline = if total > self.budgeted {
            PIPELINE_ESTIMATE
        } else {
            Duration::ZERO
        };
        let seconds = (self.budget.as_secs_f64() * budgets as f64) + pipeline.as_secs_f64();
        self.bar.set_message(format!(
            "[{place}/{total}] {name} (about {seconds:.1} s left)"
        ));
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// Copies of `size` bytes per bandwidth batch.
fn copies_per_batch(size: u64) -> u64 {
    (BATCH_BYTES / size.max(1)).clamp(1, MAX_COPIES_PER_BATCH)
}

/// `size` as a host buffer's length.
///
/// # Errors
/// [`CliError::Usage`] naming the size when it does not fit a `usize`.
fn host_len(size: u64) -> Result<usize, CliError> {
    usize::try_from(size)
        .map_err(|_| CliError::Usage(format!("--sizes {size} is too large for this host")))
}

/// Refuses a transfer size this host or device cannot take, before any
/// measurement: more than the device's memory, or more host memory than
/// the host has for the largest batch's buffers (a D2H batch holds one
/// per copy) and, on the software device, the regions the allocation
/// reaches, which it backs with host memory when they are first written;
/// under an address-space limit, `reserved` bytes more (the engines'
/// allocator arenas).
///
/// # Errors
/// [`CliError::Usage`] naming the size and what it needs.
fn check_size(
    size: u64,
    layout: Option<MemoryLayout>,
    mock: bool,
    reserved: u64,
) -> Result<(), CliError> {
    host_len(size)?;
    if let Some(layout) = layout
        && size > layout.total_bytes
    {
        return Err(CliError::Usage(format!(
            "--sizes {size} ({}) does not fit in device memory: the device has {} bytes ({})",
            format_size(size),
            layout.total_bytes,
            format_size(layout.total_bytes)
        )));
    }
    if let Some(layout) = layout.filter(|_| mock) {
        // An allocation takes at most MAX_ADDRESS_CHUNKS chunks, and the
        // software device's free ranges never cross a region.
        let regions = size.div_ceil(layout.region_bytes.max(1));
        if regions > MAX_ADDRESS_CHUNKS as u64 {
            let smallest = size
                .div_ceil(MAX_ADDRESS_CHUNKS as u64)
                .next_multiple_of(ADDRESS_ALIGNMENT);
            return Err(CliError::Usage(format!(
                "--sizes {size} ({}) spans {regions} memory regions of the software device, and an allocation takes at most {MAX_ADDRESS_CHUNKS}: use regions of at least {smallest} bytes (SPYRE_MOCK_REGION_BYTES) or a smaller size",
                format_size(size)
            )));
        }
    }
    let buffers = size.saturating_mul(copies_per_batch(size));
    let backed = match layout {
        Some(layout) if mock => size
            .div_ceil(layout.region_bytes.max(1))
            .saturating_mul(layout.region_bytes)
            .min(layout.total_bytes),
        _ => 0,
    };
    crate::host_memory::check_with_regions(
        buffers,
        "host buffers",
        backed,
        reserved,
        &format!("--sizes {size}"),
    )
}

/// A copy direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    HostToDevice,
    DeviceToHost,
}

/// Copies of `size` bytes in batches (each batch enqueued, then one
/// synchronize), reported in GB/s.
fn bandwidth(
    stream: SpyreStream,
    budget: Duration,
    size: u64,
    direction: Direction,
) -> Result<BenchResult, CliError> {
    let len = host_len(size)?;
    let copies = copies_per_batch(size);
    let device = spyre_stream::allocate(Device::CURRENT, size).map_err(|e| match e {
        spyre_stream::Error::Flex(flex) if flex.status() == Status::OUT_OF_MEMORY => {
            CliError::Usage(format!(
                "--sizes {size} ({}) does not fit in device memory: {flex}",
                format_size(size)
            ))
        }
        other => CliError::stream("allocating device memory", other),
    })?;
    // A D2H copy holds its host buffer exclusively until it completes, so
    // each copy of a batch gets its own buffer; H2D copies may share one.
    let buffers: Vec<HostBuffer> = match direction {
        Direction::HostToDevice => vec![HostBuffer::from_vec(vec![0x5a; len])],
        Direction::DeviceToHost => (0..copies).map(|_| HostBuffer::zeroed(len)).collect(),
    };
    let timed = measure(budget, copies, |batch| {
        for i in 0..batch {
            let buffer = &buffers[i as usize % buffers.len()];
            match direction {
                Direction::HostToDevice => stream.launch_h2d(buffer, &device, LaunchOptions::new()),
                Direction::DeviceToHost => stream.launch_d2h(&device, buffer, LaunchOptions::new()),
            }
            .map_err(stream_error("launching a copy"))?;
        }
        stream
            .synchronize()
            .map_err(stream_error("synchronizing the stream"))
    });
    let freed = spyre_stream::free(Device::CURRENT, &device);
    let (operations, elapsed) = timed?;
    freed.map_err(|e| CliError::stream("freeing device memory", e))?;
    let seconds = elapsed.as_secs_f64();
    Ok(BenchResult {
        name: match direction {
            Direction::HostToDevice => "H2D bandwidth",
            Direction::DeviceToHost => "D2H bandwidth",
        },
        size_bytes: Some(size),
        value: (operations * size) as f64 / seconds / 1e9,
        unit: "GB/s",
        statistic: Statistic::Mean,
        operations,
        seconds,
    })
}

impl BenchReport {
    /// The report as a table for people.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "spyre bench on the {} backend, device {} ({}), {} ms per measurement",
            self.backend, self.device, self.device_source, self.budget_ms
        );
        let _ = writeln!(
            out,
            "{:<22} {:>10} {:>12} {:<6} {:<6} {:>10}",
            "measurement", "size", "value", "unit", "of", "ops"
        );
        for r in &self.results {
            let size = r.size_bytes.map_or_else(|| "-".to_string(), format_size);
            let value = output::format_figure(r.value);
            let _ = writeln!(
                out,
                "{:<22} {:>10} {:>12} {:<6} {:<6} {:>10}",
                r.name,
                size,
                value,
                r.unit,
                r.statistic.name(),
                r.operations
            );
        }
        let details: Vec<String> = self
            .backend_details
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        if !details.is_empty() {
            let _ = writeln!(out, "measured on: {}", details.join(" "));
        }
        if !self.pipeline_timing_model.is_empty() {
            let variables: Vec<String> = self
                .pipeline_timing_model
                .iter()
                .map(|(name, variable)| format!("{name}={} ({})", variable.value, variable.from))
                .collect();
            let _ = writeln!(out, "the pipeline's child runs: {}", variables.join(", "));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that only the operations of a test move: each takes
    /// `per_operation`.
    struct Clock {
        now: std::cell::Cell<Instant>,
        per_operation: Duration,
    }

    impl Clock {
        fn new(per_operation: Duration) -> Self {
            Self {
                now: std::cell::Cell::new(Instant::now()),
                per_operation,
            }
        }

        fn now(&self) -> Instant {
            self.now.get()
        }

        fn run(&self, batch: u64) {
            let took = self.per_operation * u32::try_from(batch).unwrap();
            self.now.set(self.now.get() + took);
        }
    }

    #[test]
    fn measure_runs_whole_batches_until_the_budget() {
        let clock = Clock::new(Duration::from_micros(200));
        let mut batches = Vec::new();
        let (operations, elapsed) = measure_by(
            || clock.now(),
            Duration::from_millis(20),
            4,
            |batch| {
                batches.push(batch);
                clock.run(batch);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(batches[0], 1, "one warm-up operation");
        assert_eq!(
            &batches[1..4],
            &[1, 2, 4],
            "batches double up to the maximum"
        );
        assert!(batches.iter().all(|b| (1..=4).contains(b)));
        assert_eq!(
            operations,
            batches[1..].iter().sum::<u64>(),
            "the warm-up is not timed"
        );
        // 100 operations of 200 µs fill the 20 ms exactly: the batch that
        // ends the budget is cut to what fits.
        assert_eq!(
            (operations, elapsed),
            (100, Duration::from_millis(20)),
            "batches: {batches:?}"
        );
    }

    #[test]
    fn a_slow_operation_overruns_the_budget_by_at_most_one_operation() {
        // Each operation takes 30 ms, the budget is 1 ms: one warm-up and one
        // timed operation, not a batch of 100.
        let clock = Clock::new(Duration::from_millis(30));
        let mut ran = 0;
        let (operations, elapsed) = measure_by(
            || clock.now(),
            Duration::from_millis(1),
            100,
            |batch| {
                ran += batch;
                clock.run(batch);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!((ran, operations), (2, 1));
        assert_eq!(elapsed, Duration::from_millis(30));
    }

    #[test]
    fn latency_units() {
        let r = latency("x", "ns/op", (1000, Duration::from_micros(1)));
        assert!((r.value - 1.0).abs() < 1e-9);
        let r = latency("x", "us/op", (10, Duration::from_micros(50)));
        assert!((r.value - 5.0).abs() < 1e-9);
    }

    #[test]
    fn table_has_a_row_per_result() {
        let report = BenchReport {
            backend: "mock",
            device: 2,
            device_source: "LOCAL_RANK",
            budget_ms: 1,
            results: vec![BenchResult {
                name: "H2D bandwidth",
                size_bytes: Some(4096),
                value: 1.5,
                unit: "GB/s",
                statistic: Statistic::Mean,
                operations: 8,
                seconds: 0.1,
            }],
            backend_details: BTreeMap::from([("engines", "2".to_owned())]),
            pipeline_timing_model: pipeline::TimingModel::from([(
                "SPYRE_MOCK_OP_LATENCY_US",
                pipeline::ModelVariable {
                    value: "10".to_owned(),
                    from: pipeline::ModelSource::Environment,
                },
            )]),
        };
        let text = report.to_text();
        assert!(
            text.starts_with(
                "spyre bench on the mock backend, device 2 (LOCAL_RANK), 1 ms per measurement\n"
            ),
            "{text}"
        );
        // The value is not always a mean (the pipeline's are medians): the
        // row says which.
        assert!(
            text.contains(
                "measurement                  size        value unit   of            ops\nH2D bandwidth               4 KiB        1.500 GB/s   mean            8\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "measured on: engines=2\nthe pipeline's child runs: SPYRE_MOCK_OP_LATENCY_US=10 (environment)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_value_below_a_thousandth_keeps_its_digits() {
        // 429 one-byte copies in 50 ms: 8.58e-6 GB/s, not 0.000.
        let report = BenchReport {
            backend: "mock",
            device: 0,
            device_source: "default",
            backend_details: BTreeMap::new(),
            pipeline_timing_model: pipeline::TimingModel::new(),
            budget_ms: 50,
            results: vec![BenchResult {
                name: "H2D bandwidth",
                size_bytes: Some(1),
                value: 429.0 / 0.05 / 1e9,
                unit: "GB/s",
                statistic: Statistic::Mean,
                operations: 429,
                seconds: 0.05,
            }],
        };
        let text = report.to_text();
        assert!(text.contains("    8.580e-6 GB/s"), "{text}");
    }
}

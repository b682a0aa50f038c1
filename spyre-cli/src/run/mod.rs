//! `spyre run`: the verified workload.
//!
//! `--threads` host threads each run `--iterations` iterations, keeping up to
//! `--in-flight` of them outstanding. An iteration enqueues, in order:
//!
//! 1. H2D of the first input (`x` or `A`),
//! 2. H2D of the second input (`y` or `B`),
//! 3. H2D of the kernel descriptor,
//! 4. compute,
//! 5. D2H of the result, whose completion signals the thread,
//!
//! on pool streams as `--mode` says: `pipelined` (the default: 1–2 on a
//! copy-in stream, 3–4 on a compute stream, 5 on a copy-out stream, three
//! new pool streams each iteration, ordered by events, memory
//! double-buffered per thread; see `lane.rs`), `per-iteration` (all five on
//! a new pool stream each iteration, memory per iteration) or `serialized`
//! (all on the thread's one pool stream, memory per iteration). In the
//! first two, priority 0 and -1 alternate by iteration, so both pools and
//! all their streams are used; in `serialized` the thread's parity chooses.
//!
//! While the device works the thread computes the expected result on the
//! host ([`crate::verify`]). When the thread waits for the iteration, it
//! drops the iteration's device buffers (pipelined: the slots are dropped
//! when the thread ends) and compares the result bit for bit. Device memory
//! comes from the caching allocator; at the end every buffer has been
//! dropped, and the run checks that no byte is still allocated. The first
//! failure stops every thread and is reported with its thread, iteration and
//! stream.

mod buffers;
mod capacity;
mod estimate;
mod interrupt;
mod lane;
mod launch;
mod outcome;
mod output_file;
mod plan;
mod report;
mod timeline;
mod trace_file;
mod worker;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Instant;

use spyre_stream::Device;
use spyre_stream::program::DESCRIPTOR_SIZE;

pub(crate) use self::capacity::check_capacity;
pub(crate) use self::outcome::{MemoryUse, RunOutcome, TraceFile};
use self::output_file::OutputFile;
pub(crate) use self::plan::Plan;
pub(crate) use self::report::RunReport;
use self::worker::{Shared, ThreadStats};
use crate::cli::{KernelArg, ModeArg, RunArgs};
use crate::error::CliError;
use crate::host_memory;
use crate::output;
use crate::size::format_total;

/// Host memory a traced iteration holds until the run ends, rounded up
/// from the peak resident memory of `spyre run --threads 2 --iterations
/// 20000 --size 12` on the software device with the flag against without
/// it, per iteration: 2.2 KB for `--trace`, 3.3 KB for `--timeline` (with
/// or without `--trace`).
const TRACE_BYTES_PER_ITERATION: u64 = 2_500;
/// See [`TRACE_BYTES_PER_ITERATION`].
const TIMELINE_BYTES_PER_ITERATION: u64 = 3_500;
/// Address space a traced iteration takes at its peak, which an
/// address-space limit (`ulimit -v`) counts: rounded up from the peak size
/// of the process (`VmPeak`) of `spyre run --threads 2 --iterations 50000
/// --size 12` on the software device with the flag against without it,
/// with `MALLOC_ARENA_MAX=1` (so that the threads' allocator arenas,
/// counted apart, do not blur it), per iteration: 2.91 KB for `--trace`,
/// 4.32 KB for `--timeline` (with or without `--trace`). More than the
/// resident memory: the room the trace's lists reserve as they grow.
const TRACE_ADDRESS_SPACE_PER_ITERATION: u64 = 3_000;
/// See [`TRACE_ADDRESS_SPACE_PER_ITERATION`].
const TIMELINE_ADDRESS_SPACE_PER_ITERATION: u64 = 4_500;
/// Host memory per iteration of a trace written to this process's standard
/// output or error, which is built whole before its one write
/// ([`output_file`]): twice the trace's 2.95 KB an iteration (118 MB for
/// the 40 000 iterations above), as the buffer grows by doubling. The
/// timeline's SVG is 1.42 KB an iteration; the two are built one after
/// the other, so the larger counts.
const TRACE_BUILT_BYTES_PER_ITERATION: u64 = 6_000;
/// See [`TRACE_BUILT_BYTES_PER_ITERATION`].
const TIMELINE_BUILT_BYTES_PER_ITERATION: u64 = 3_000;

/// Refuses, before any work, a runtime without timed events for `what`,
/// which orders streams with events and times its stages with them: a
/// usage error that says what to do `instead`. Starts the runtime if
/// needed.
///
/// # Errors
/// [`CliError::Usage`] for a runtime without events (a flex library of ABI
/// 1.0) or without event timing; the stream layer's error if the runtime
/// cannot start or answer.
pub(crate) fn require_timed_events(what: &str, instead: &str) -> Result<(), CliError> {
    timed_events_verdict(spyre_stream::capabilities(Device::CURRENT), what, instead)
}

/// [`require_timed_events`]' verdict on the runtime's answer.
fn timed_events_verdict(
    capabilities: spyre_stream::Result<spyre_stream::Capabilities>,
    what: &str,
    instead: &str,
) -> Result<(), CliError> {
    match capabilities {
        Ok(capabilities) if capabilities.event_timing => Ok(()),
        Ok(_) => Err(CliError::Usage(format!(
            "{what} times its stages with events, and this runtime cannot time them: {instead}"
        ))),
        Err(spyre_stream::Error::Unsupported(source)) => Err(CliError::Usage(format!(
            "{what} orders streams with events, and this runtime has none: {instead} ({source})"
        ))),
        Err(e) => Err(CliError::stream("asking the runtime what it can do", e)),
    }
}

/// Writes `file` with `write` when it and the trace are both there, and
/// returns the file's path and what `write` returned; a failure's message
/// goes to `unwritten` instead, for after the report.
fn write_output<T>(
    file: Option<OutputFile>,
    recorded: &Option<spyre_stream::Trace>,
    unwritten: &mut Vec<String>,
    write: impl FnOnce(OutputFile, &spyre_stream::Trace) -> Result<T, CliError>,
) -> Option<(String, T)> {
    let (file, recorded) = file.zip(recorded.as_ref())?;
    let path = file.path().display().to_string();
    write(file, recorded)
        .map_err(|e| unwritten.push(e.to_string()))
        .ok()
        .map(|written| (path, written))
}

/// Warns, on standard error, that `path`, given with `flag`, may be shared
/// by the `size` processes of a launch (the device came from the
/// launcher's `variable`): a path without a placeholder, which, given to
/// every rank, is one file that each replaces whole (the last rank's
/// contents are what stays); or this process's standard output or error on
/// a pipe, which keeps only writes of up to 4 KiB whole, so that ranks
/// sharing it can cut into each other's. Nothing for a device or a file
/// the standard streams are redirected to (ranks appending to one log keep
/// their writes whole). `example` is a path with a placeholder, for the
/// advice.
fn warn_of_shared_output(
    variable: &str,
    size: u64,
    flag: &str,
    path: Option<&std::path::Path>,
    example: &str,
) {
    let Some(path) = path else {
        return;
    };
    let shared = if output_file::is_one_file_for_every_process(path) {
        "a path without {rank}, {device} or {pid}: if every rank is given it, the last rank to end replaces the others' file"
    } else if output_file::is_standard_stream_on_a_pipe(path) {
        "a pipe, which keeps only writes of up to 4 KiB whole: ranks that share it can cut into each other's output"
    } else {
        return;
    };
    // Advice only: a closed stderr must not fail (or panic) the run.
    let _ = writeln!(
        std::io::stderr(),
        "warning: {flag} {}: {shared} (a launch of {size} processes: {variable} is set); put {{rank}} in the name for a file per rank ({flag} {example})",
        path.display()
    );
}

/// The software device's engines, from the runtime's details; `None` on
/// a flex library, whose threads are not known.
pub(crate) fn engines(info: &spyre_stream::RuntimeInfo) -> Option<u64> {
    info.backend_details
        .iter()
        .find(|(name, _)| *name == "engines")
        .and_then(|(_, value)| value.parse().ok())
}

/// Runs the workload.
///
/// # Errors
/// [`CliError::Usage`] for sizes the device cannot hold, an output file
/// that cannot be created, and the pipelined mode on a runtime without
/// events; the stream layer's start error; [`CliError::Iteration`] for the
/// first iteration that failed.
pub(crate) fn run(args: &RunArgs) -> Result<RunOutcome, CliError> {
    if args.exit_when_stdin_closes {
        exit_when_stdin_closes()?;
    }
    let plan = Plan::new(args.kernel, args.size)?;
    if let Some(path) = &args.timeline {
        timeline::check_path(path)?;
    }
    // Paths that name one file as given name one once expanded too; those
    // that only do once expanded are refused below.
    if let (Some(trace), Some(timeline)) = (&args.trace, &args.timeline) {
        output_file::check_distinct(trace, timeline)?;
    }
    let total = (args.threads as u64)
        .checked_mul(args.iterations)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--threads {} × --iterations {} is more iterations than can be counted; their product must be at most {} (use fewer --iterations)",
                args.threads, args.iterations, u64::MAX
            ))
        })?;
    spyre_stream::start_runtime().map_err(|e| CliError::stream("starting the Spyre runtime", e))?;
    let info = spyre_stream::runtime_info()
        .ok_or_else(|| CliError::Failed("the Spyre runtime did not start".into()))?;
    // The output paths, with their placeholders replaced.
    let ranked = [&args.trace, &args.timeline]
        .into_iter()
        .flatten()
        .any(|path| output_file::holds_rank(path));
    // The rank is read once, for the paths and for the trace's process
    // name; one that cannot be read fails the run only where a path
    // needs it.
    let rank = match launch::rank(info.device_source) {
        Ok(rank) => Some(rank),
        Err(refused) if ranked => return Err(refused),
        Err(_) => None,
    };
    let expanded = |path: &Option<std::path::PathBuf>| {
        path.as_deref()
            .map(|path| output_file::expand(path, rank.unwrap_or(0), info.device))
    };
    let (trace_path, timeline_path) = (expanded(&args.trace), expanded(&args.timeline));
    if let (Some(trace), Some(timeline)) = (&trace_path, &timeline_path) {
        output_file::check_distinct(trace, timeline)?;
    }
    if let Some((variable, Some(size))) = launch::launch(info.device_source)
        && size > 1
    {
        let (trace, timeline) = (args.trace.as_deref(), args.timeline.as_deref());
        warn_of_shared_output(variable, size, "--trace", trace, "trace-{rank}.json");
        warn_of_shared_output(variable, size, "--timeline", timeline, "run-{rank}.svg");
    }
    if args.mode == ModeArg::Pipelined {
        require_timed_events(
            "`spyre run --mode pipelined` (the default)",
            "use `--mode per-iteration` or `--mode serialized`",
        )?;
    }
    let layout = spyre_stream::memory_layout(Device::CURRENT)
        .map_err(|e| CliError::stream("reading the device's memory layout", e))?;
    if let Some(layout) = layout {
        check_capacity(&plan, args, layout)?;
    }
    // Per iteration in flight: its two inputs (as sent), the output and the
    // expected result on the host, each an operand, and the program; and
    // per thread, while it makes an iteration, that one's two inputs as
    // numbers too (six operands at once).
    let in_flight = (args.in_flight as u64).min(args.iterations);
    let per_thread = in_flight
        .saturating_mul(
            plan.operand_bytes
                .saturating_mul(4)
                .saturating_add(DESCRIPTOR_SIZE as u64),
        )
        .saturating_add(plan.operand_bytes.saturating_mul(2));
    let mut buffers = (args.threads as u64).saturating_mul(per_thread);
    let engines = engines(&info);
    if info.backend == "mock" {
        // The software device's engines each hold, while they run a
        // compute, host copies of its operands: at most four at once (the
        // two inputs as numbers, the result and its bytes; an input's bytes
        // as read are dropped once converted, before the result is made),
        // for as many computes as run at once.
        let computes = engines
            .unwrap_or(1)
            .min((args.threads as u64).saturating_mul(in_flight));
        buffers =
            buffers.saturating_add(computes.saturating_mul(plan.operand_bytes.saturating_mul(4)));
    }
    // The software device backs the regions the run writes with host
    // memory: a region the host cannot give would fail a copy, after the
    // work started.
    let backed = layout
        .filter(|_| info.backend == "mock")
        .map_or(0, |layout| capacity::backed_bytes(&plan, args, layout));
    // A trace is kept in memory until the run ends (and takes more address
    // space than memory).
    let (held_per_iteration, address_space_per_iteration) = if args.timeline.is_some() {
        (
            TIMELINE_BYTES_PER_ITERATION,
            TIMELINE_ADDRESS_SPACE_PER_ITERATION,
        )
    } else if args.trace.is_some() {
        (TRACE_BYTES_PER_ITERATION, TRACE_ADDRESS_SPACE_PER_ITERATION)
    } else {
        (0, 0)
    };
    // And one written to a standard stream is built whole first.
    let built = |path: &Option<std::path::PathBuf>, bytes| {
        path.as_deref()
            .filter(|path| output_file::is_standard_stream(path))
            .map_or(0, |_| bytes)
    };
    let per_traced_iteration = held_per_iteration.saturating_add(
        built(&trace_path, TRACE_BUILT_BYTES_PER_ITERATION)
            .max(built(&timeline_path, TIMELINE_BUILT_BYTES_PER_ITERATION)),
    );
    let traced = total.saturating_mul(per_traced_iteration);
    let mut what = format!(
        "--size {} with --threads {} and --in-flight {}",
        args.size, args.threads, args.in_flight
    );
    let mut held = "host buffers";
    if traced > 0 {
        let _ = write!(
            what,
            ", tracing {total} iterations (the trace is kept in memory until the run ends: {} at about {per_traced_iteration} bytes an iteration; fewer --iterations, or no --trace and --timeline, need less)",
            format_total(traced)
        );
        held = "host buffers and the trace";
    }
    // Each worker, each engine and the thread that watches standard input
    // may get an allocator arena of its own; the workers, started after
    // this, take their stacks too (the others are running already).
    let workers = args.threads as u64;
    let threads = workers
        .saturating_add(engines.unwrap_or(0))
        .saturating_add(u64::from(args.exit_when_stdin_closes));
    let arenas = host_memory::arena_bytes(threads)
        .saturating_add(workers.saturating_mul(host_memory::thread_stack_bytes()));
    let trace_room = total.saturating_mul(address_space_per_iteration - held_per_iteration);
    host_memory::check_with_regions(
        buffers.saturating_add(traced),
        held,
        backed,
        arenas.saturating_add(trace_room),
        &what,
    )?;
    if plan.kernel == KernelArg::Matmul
        && info.backend == "mock"
        && let Some(warning) =
            estimate::matmul_warning(plan.n, total, args.threads, estimate::measure_rate())
    {
        // Advice only: a closed stderr must not fail (or panic) the run.
        let _ = writeln!(std::io::stderr(), "{warning}");
    }
    // Every check has passed: the output files are created now, before
    // any work, so that a path that cannot be written is refused up front.
    let trace_file = trace_path
        .as_deref()
        .map(|path| OutputFile::create("--trace", path))
        .transpose()?;
    let timeline_file = match timeline_path
        .as_deref()
        .map(|path| OutputFile::create("--timeline", path))
        .transpose()
    {
        Ok(file) => file,
        Err(refused) => {
            if let Some(file) = trace_file {
                file.discard();
            }
            return Err(refused);
        }
    };
    if let (Some(trace), Some(timeline)) = (&trace_file, &timeline_file)
        && trace.is_same_file(timeline)
    {
        let refused = output_file::same_file(timeline.path());
        for file in [trace_file, timeline_file].into_iter().flatten() {
            file.discard();
        }
        return Err(refused);
    }
    tracing::info!(
        backend = info.backend,
        kernel = plan.kernel.name(),
        n = plan.n,
        operand_bytes = plan.operand_bytes,
        "spyre run starting"
    );

    let progress = output::progress_bar(
        total,
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} iterations verified ({per_sec}, eta {eta})",
    );
    let shared = Shared::new(plan, args, progress.clone());
    spyre_stream::enable_counters();
    let tracing = args.trace.is_some() || args.timeline.is_some();
    if tracing {
        spyre_stream::start_trace();
    }
    let start = Instant::now();
    let results: Vec<Option<ThreadStats>> = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(args.threads);
        for thread in 0..args.threads {
            let shared = &shared;
            let spawned = std::thread::Builder::new()
                .name(format!("spyre-run-{thread}"))
                .spawn_scoped(scope, move || shared.worker(thread));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    shared.fail_with(CliError::Failed(format!(
                        "cannot start host thread {thread}: {e}"
                    )));
                    break;
                }
            }
        }
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(stats) => stats,
                Err(_) => {
                    shared.fail_with(CliError::Failed("a host thread panicked".into()));
                    None
                }
            })
            .collect()
    });
    let wall = start.elapsed();
    progress.finish_and_clear();
    let recorded = tracing.then(|| {
        // Every operation finished (after a failure too), so that each has
        // its finish time.
        if let Err(e) = spyre_stream::synchronize_device(Device::CURRENT) {
            tracing::debug!(error = %e, "a stream failed before the trace stopped");
        }
        spyre_stream::stop_trace()
    });
    let allocations_at_warm_up = shared.allocations_at_warm_up();
    // Written after a failure too: that is when a picture helps most. A
    // write that fails is reported after what the run did, not instead.
    let mut unwritten = Vec::new();
    // A launch's rank names the trace's process.
    let launch_rank = launch::launch(info.device_source).and(rank);
    let trace = write_output(trace_file, &recorded, &mut unwritten, |file, trace| {
        trace_file::write_chrome_trace(file, trace, launch_rank)
    })
    .map(|(path, summary)| TraceFile { path, summary });
    let timeline = write_output(
        timeline_file,
        &recorded,
        &mut unwritten,
        timeline::write_timeline,
    )
    .map(|(path, ())| path);

    let mut failures = shared.into_failures();
    if !failures.is_empty() {
        let others = failures.len() - 1;
        if others > 0 {
            tracing::warn!("{others} more iteration(s) failed after the first");
        }
        for message in &unwritten {
            tracing::warn!("{message}");
        }
        return Err(failures.swap_remove(0));
    }
    let mut launches_by_stream = BTreeMap::new();
    let mut verified = 0;
    let mut overlap: Option<lane::Overlap> = None;
    for stats in results.into_iter().flatten() {
        verified += stats.verified;
        for (id, launches) in stats.launches_by_stream {
            *launches_by_stream.entry(id).or_insert(0) += launches;
        }
        if let Some(thread) = stats.overlap {
            overlap.get_or_insert_default().merge(thread);
        }
    }
    let counters = spyre_stream::counters();
    let memory = spyre_stream::memory_stats(Device::CURRENT)
        .map_err(|e| CliError::stream("reading the memory statistics", e))?;
    if memory.allocated_bytes != 0 {
        return Err(CliError::Failed(format!(
            "{} bytes of device memory are still allocated after every buffer of the run was dropped",
            memory.allocated_bytes
        )));
    }
    Ok(RunOutcome {
        backend: info.backend,
        backend_details: info.backend_details,
        device: info.device,
        device_source: info.device_source,
        plan,
        verified,
        launches_by_stream,
        overlap,
        wall,
        counters,
        trace,
        timeline,
        unwritten: (!unwritten.is_empty()).then(|| unwritten.join("; ")),
        memory: MemoryUse {
            peak_allocated_bytes: memory.peak_allocated_bytes,
            peak_reserved_bytes: memory.peak_reserved_bytes,
            device_allocations: memory.device_allocations,
            device_allocations_after_warm_up: allocations_at_warm_up
                .map(|first| memory.device_allocations - first),
            allocated_bytes_at_end: memory.allocated_bytes,
        },
    })
}

/// Ends this process (exit 1) once its standard input reaches its end or
/// fails: a parent that holds the pipe's other end has ended, and its child
/// run ends with it (`--exit-when-stdin-closes`).
///
/// # Errors
/// [`CliError::Failed`] when the watching thread cannot be started.
fn exit_when_stdin_closes() -> Result<(), CliError> {
    std::thread::Builder::new()
        .name("spyre-run-stdin".to_owned())
        .spawn(|| {
            let mut stdin = std::io::stdin().lock();
            let mut byte = [0_u8; 64];
            while matches!(std::io::Read::read(&mut stdin, &mut byte), Ok(n) if n > 0) {}
            let _ = writeln!(
                std::io::stderr(),
                "error: standard input closed (the parent of this run has ended): stopping"
            );
            std::process::exit(i32::from(crate::error::EXIT_FAILURE));
        })
        .map(drop)
        .map_err(|e| CliError::Failed(format!("cannot watch standard input: {e}")))
}

#[cfg(test)]
mod tests {
    use spyre_stream::{Capabilities, FlexError, Status};

    use super::*;

    #[test]
    fn the_pipelined_mode_needs_events_that_can_be_timed() {
        let verdict = |capabilities| timed_events_verdict(capabilities, "the mode", "use another");
        assert!(
            verdict(Ok(Capabilities {
                device_side_wait: false,
                event_timing: true,
            }))
            .is_ok()
        );
        let untimed = verdict(Ok(Capabilities {
            device_side_wait: true,
            event_timing: false,
        }))
        .unwrap_err();
        assert_eq!(untimed.exit_code(), 2);
        assert_eq!(
            untimed.to_string(),
            "the mode times its stages with events, and this runtime cannot time them: use another"
        );
        let none = verdict(Err(spyre_stream::Error::Unsupported(FlexError::new(
            Status::UNSUPPORTED,
            "flex_runtime_get_capability",
            "ABI 1.0",
        ))))
        .unwrap_err();
        assert_eq!(none.exit_code(), 2);
        assert!(
            none.to_string().starts_with(
                "the mode orders streams with events, and this runtime has none: use another ("
            ),
            "{none}"
        );
    }
}

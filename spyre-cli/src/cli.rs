//! Command-line arguments (clap derive).

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::size::{parse_listed_size, parse_positive_size};

/// Most host threads `spyre run` accepts.
pub(crate) const MAX_THREADS: usize = 1024;
/// Most iterations in flight per thread `spyre run` accepts.
pub(crate) const MAX_IN_FLIGHT: usize = 1024;

/// The top-level command line.
#[derive(Debug, Parser)]
#[command(
    name = "spyre",
    version,
    about = "Inspect, exercise and measure the Spyre stream pool",
    long_about = "Inspect, exercise and measure the Spyre stream pool.\n\n\
        The backend follows the build and SPYRE_BACKEND (mock or hardware); the \
        hardware backend loads the flex library named by FLEX_RUNTIME_LIB. \
        Log output goes to stderr and follows RUST_LOG (default: warn).\n\n\
        Exit codes: 0 success; 1 the work failed (device error or a result that \
        differs from the host reference); 2 bad arguments or environment, \
        including a run that asks for more device memory than the device has \
        (refused before any work where the up-front estimate sees it; a run \
        near the limit, whose streams each keep their freed memory cached, \
        can still run out partway, and exits 2 then too, naming the \
        iteration)."
)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Show the backend, devices, the logical device of this process, the pool
    /// layout, hazard tracking and the environment in effect.
    Info(InfoArgs),
    /// Run the verified workload: many iterations of H2D, compute and D2H on
    /// pool streams (of both priorities, but with --mode serialized and one
    /// thread), every result checked bitwise against a host reference.
    Run(RunArgs),
    /// Quick measurements: handle resolution, pool assignment, empty-op round
    /// trip, H2D and D2H bandwidth, and the pipeline (events) against its
    /// serialized baseline. It takes 3 + 2 × (number of --sizes)
    /// measurements of --budget-ms each, so the total time is measurements ×
    /// budget: 9 × 250 ms, about 2.3 s, by default, plus a few seconds for
    /// the pipeline (--pipeline false skips it). A measurement overruns
    /// its budget by at most one operation, and runs at least two (one to
    /// warm up), so a slow device (SPYRE_MOCK_OP_LATENCY_US) takes longer.
    /// Progress is shown on a terminal.
    Bench(BenchArgs),
}

impl Command {
    /// Whether a failure is reported on stdout as one JSON line
    /// (`{"error": ..., "exit_code": ...}`): `run` and `bench` with `--json`.
    /// `info --json` prints its report, which names the error, either way.
    pub(crate) fn reports_errors_as_json(&self) -> bool {
        match self {
            Self::Info(_) => false,
            Self::Run(RunArgs { json, .. }) | Self::Bench(BenchArgs { json, .. }) => *json,
        }
    }
}

/// Arguments of `spyre info`.
#[derive(Debug, Args)]
pub(crate) struct InfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The compute kernel of `spyre run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum KernelArg {
    /// `out[i] = alpha * x[i] + y[i]` over vectors.
    Axpy,
    /// `C = A · B` over square row-major matrices.
    Matmul,
}

impl KernelArg {
    /// The kernel's name, as on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Axpy => "axpy",
            Self::Matmul => "matmul",
        }
    }
}

/// How `spyre run` places an iteration's work on streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    /// Copy-in, compute and copy-out of each iteration on three pool streams,
    /// ordered by events only; device memory double-buffered per thread.
    Pipelined,
    /// All five operations of each iteration on one pool stream, a new one
    /// each iteration (the round robin through both pools).
    PerIteration,
    /// Every iteration of a thread on the same pool stream, one after the
    /// other: the baseline the pipelined mode is measured against.
    Serialized,
}

impl ModeArg {
    /// The mode's name, as on the command line.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Pipelined => "pipelined",
            Self::PerIteration => "per-iteration",
            Self::Serialized => "serialized",
        }
    }
}

/// Arguments of `spyre run`.
#[derive(Clone, Debug, Args)]
pub(crate) struct RunArgs {
    /// Host threads submitting work (1 to 1024).
    #[arg(long, value_name = "T", default_value = "2", value_parser = parse_threads, allow_negative_numbers = true)]
    pub(crate) threads: usize,
    /// Iterations per thread.
    #[arg(long, value_name = "N", default_value = "200", value_parser = parse_iterations, allow_negative_numbers = true)]
    pub(crate) iterations: u64,
    /// Bytes of operands per iteration: both inputs and the output together
    /// (axpy: three vectors of SIZE/12 f32 each; matmul: three n×n f32
    /// matrices with n = floor(sqrt(SIZE/12))). Plain bytes or with a unit:
    /// 4096, 4KiB, 1MiB, 2MB.
    #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = parse_positive_size, allow_negative_numbers = true)]
    pub(crate) size: u64,
    /// Compute kernel. matmul costs n³ per iteration: at the default size
    /// (n = 295) a run on the software device takes about 2 s in a release
    /// build on two cores (a debug build's, about 100 s); --size 64KiB
    /// (n = 73) about 0.05 s. A matmul run estimated to take over a minute
    /// on the software device says so before it starts.
    #[arg(long, value_enum, default_value_t = KernelArg::Axpy)]
    pub(crate) kernel: KernelArg,
    /// Where each iteration's work runs: `pipelined` (copy-in, compute and
    /// copy-out on three pool streams ordered by events, so stages of
    /// consecutive iterations overlap; the report shows the overlap
    /// measured with timed events), `per-iteration` (one pool stream per
    /// iteration) or `serialized` (one stream per thread).
    #[arg(long, value_enum, default_value_t = ModeArg::Pipelined)]
    pub(crate) mode: ModeArg,
    /// Iterations each thread keeps in flight (1 to 1024); it waits for the
    /// oldest before starting another.
    #[arg(long, value_name = "K", default_value = "4", value_parser = parse_in_flight, allow_negative_numbers = true)]
    pub(crate) in_flight: usize,
    /// Seed of the input generator; each iteration derives its own seed from
    /// it, its thread and its index.
    #[arg(long, default_value = "1", value_parser = parse_seed, allow_negative_numbers = true)]
    pub(crate) seed: u64,
    /// Print one JSON object instead of text; on failure, one JSON object
    /// {"error": MESSAGE, "exit_code": CODE}, with "report", the run's,
    /// where the run ended but its --trace or --timeline FILE could not be
    /// written.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write a trace of every device operation to FILE in the Chrome trace
    /// event format (open it in Perfetto or chrome://tracing): one track
    /// per stream, each operation from when its stream reached it (its
    /// launch, or the end of the operation before it) to its finish on the
    /// device, time it waited for a free engine included; waits on events
    /// as arrows from the records they waited for.
    /// FILE is opened before the run (a path that cannot be opened for
    /// writing exits 2 at once) and replaced whole when the run ends, after
    /// a failure too (a write that fails then, on a full disk say, exits 1
    /// naming FILE, after the run's report); an interrupted run (Ctrl-C)
    /// or a failed write leaves a FILE that existed as it was, and one it
    /// created empty. The operations are kept in memory until then (about
    /// 2.5 KB per iteration, 3.5 KB with --timeline; under an address-space
    /// limit, ulimit -v, 3 and 4.5 KB, and 64 MiB for each thread's memory
    /// allocator arena, up to glibc's limit, which MALLOC_ARENA_MAX sets: a
    /// run that the host's available memory, or the limit, cannot trace
    /// exits 2 before it starts) and the
    /// file is written one event at a time. FILE may be this command's
    /// standard output or error (/dev/stdout into a log that other
    /// processes append to, or a pipe, say; not a socket, which cannot be
    /// opened by path): the trace is then written
    /// after what the stream holds, followed by a newline, in one write, so
    /// it is built whole in memory first (about 6 KB more per iteration; a
    /// pipe keeps only writes of up to 4 KiB whole, so ranks sharing one
    /// can cut into each other's traces; with --json on standard output,
    /// the trace is the line before the report's, JSON Lines). A FIFO
    /// (named pipe) that no process reads yet is waited for, with a
    /// warning, before the run starts. In FILE, {rank} is replaced by
    /// the process's rank in its launch (RANK, OMPI_COMM_WORLD_RANK,
    /// PMI_RANK or SLURM_PROCID, of the launcher whose local rank chose the
    /// device; else the first of them set; else that local rank; else 0),
    /// {device} by the logical device
    /// and {pid} by the process id: the ranks of a launch given --trace
    /// trace-{rank}.json write a file each (ranks of a launch of more than
    /// one process given one file, or a pipe, are warned). Times are on the
    /// host's monotonic clock, so the traces of processes on one host line
    /// up when opened together.
    #[arg(long, value_name = "FILE")]
    pub(crate) trace: Option<std::path::PathBuf>,
    /// Draw the same trace as a timeline into FILE (SVG: a name ending in
    /// .svg): one row per stream, each operation a bar coloured by kind,
    /// with a legend and a time axis. Opened before the run and written at
    /// its end, as --trace, with the same {rank}, {device} and {pid}.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) timeline: Option<std::path::PathBuf>,
    /// Ends the run (exit 1) once standard input is closed: for a program
    /// that runs `spyre run` as its child and holds the other end of that
    /// pipe, so that the child does not outlive it however it ends
    /// (`spyre bench`'s pipeline measurement).
    #[arg(long, hide = true)]
    pub(crate) exit_when_stdin_closes: bool,
}

/// Default transfer sizes of `spyre bench`.
pub(crate) const DEFAULT_BENCH_SIZES: &str = "4KiB,1MiB,16MiB";

/// Arguments of `spyre bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Time spent on each measurement, in milliseconds (1..=60000). The run
    /// takes about (3 + 2 × number of --sizes) × this, plus a few seconds
    /// for the pipeline measurement.
    #[arg(long, value_name = "MS", default_value = "250", value_parser = parse_budget, allow_negative_numbers = true)]
    pub(crate) budget_ms: u64,
    /// Transfer sizes for the H2D and D2H bandwidth, comma-separated (so
    /// no thousands separators: 4096 or 4KiB, not 4,096); given more than
    /// once, every list given is measured, in order.
    #[arg(
        long,
        value_name = "BYTES,...",
        value_delimiter = ',',
        default_value = DEFAULT_BENCH_SIZES,
        value_parser = parse_listed_size,
        allow_negative_numbers = true
    )]
    pub(crate) sizes: Vec<u64>,
    /// Also measure the same work pipelined across three streams ordered by
    /// events against it serialized on one stream (`spyre run --mode
    /// pipelined` and `--mode serialized`, 3 child processes each, run
    /// alternately; on the software device with a timing model in which
    /// copies and compute take comparable time). Reports both medians, the
    /// speedup and the overlap the events measured. Takes a few seconds.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL",
        value_parser = bool_parser(),
        ignore_case = true
    )]
    pub(crate) pipeline: bool,
    /// Print one JSON object instead of a table; on failure, one JSON object
    /// {"error": MESSAGE, "exit_code": CODE}, with "report", the
    /// measurements made before it, where a measurement failed part-way
    /// (without --json they are printed before the error).
    #[arg(long)]
    pub(crate) json: bool,
}

/// Spellings of a boolean argument, on then off: the same as the
/// environment's booleans (README), in any case.
const BOOL_SPELLINGS: [[&str; 4]; 2] = [["true", "1", "on", "yes"], ["false", "0", "off", "no"]];

/// Parses a boolean argument as any of [`BOOL_SPELLINGS`] (with
/// `ignore_case`); clap's error lists them.
fn bool_parser() -> impl TypedValueParser<Value = bool> {
    PossibleValuesParser::new(BOOL_SPELLINGS.as_flattened()).map(|text| {
        BOOL_SPELLINGS[0]
            .iter()
            .any(|on| text.eq_ignore_ascii_case(on))
    })
}

/// Parses a whole number in `1..=max`, naming `what` and the text on error.
fn parse_count(text: &str, what: &str, max: u64) -> Result<u64, String> {
    let expected = format!("expected a whole number from 1 to {max}");
    match parse_whole(text) {
        Ok(0) | Err(Whole::Negative) => Err(format!(
            "{what} must be at least 1, got {text:?}; {expected}"
        )),
        Ok(value) if value > max => Err(format!(
            "{what} must be at most {max}, got {text:?}; {expected}"
        )),
        Err(Whole::TooLarge) => Err(format!(
            "{what} must be at most {max}, got {text:?}; {expected}"
        )),
        Ok(value) => Ok(value),
        Err(Whole::NotANumber) => Err(format!("{text:?} is not a whole number; {expected}")),
    }
}

/// Why a text is not a whole number of `u64`.
enum Whole {
    /// A minus sign before digits.
    Negative,
    /// Digits of 2^64 or more.
    TooLarge,
    /// Anything else (empty, letters, a fraction).
    NotANumber,
}

/// A whole number of `u64` (spaces around it allowed).
fn parse_whole(text: &str) -> Result<u64, Whole> {
    let trimmed = text.trim();
    trimmed.parse::<u64>().map_err(|err| match err.kind() {
        std::num::IntErrorKind::PosOverflow => Whole::TooLarge,
        _ if trimmed.strip_prefix('-').is_some_and(|digits| {
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }) =>
        {
            Whole::Negative
        }
        _ => Whole::NotANumber,
    })
}

/// Value parser of `--seed`: any whole number from 0 to 2^64 - 1.
fn parse_seed(text: &str) -> Result<u64, String> {
    let expected = format!("expected a whole number from 0 to {}", u64::MAX);
    parse_whole(text).map_err(|why| match why {
        Whole::Negative => format!("the seed cannot be negative, got {text:?}; {expected}"),
        Whole::TooLarge => format!(
            "the seed must be at most {}, got {text:?}; {expected}",
            u64::MAX
        ),
        Whole::NotANumber => format!("{text:?} is not a whole number; {expected}"),
    })
}

/// Value parser of `--threads`.
fn parse_threads(text: &str) -> Result<usize, String> {
    parse_count(text, "the thread count", MAX_THREADS as u64).map(|v| v as usize)
}

/// Value parser of `--iterations`.
fn parse_iterations(text: &str) -> Result<u64, String> {
    parse_count(text, "the iteration count", u64::MAX)
}

/// Value parser of `--in-flight`.
fn parse_in_flight(text: &str) -> Result<usize, String> {
    parse_count(text, "the in-flight count", MAX_IN_FLIGHT as u64).map(|v| v as usize)
}

/// Value parser of `--budget-ms`.
fn parse_budget(text: &str) -> Result<u64, String> {
    parse_count(text, "the time budget", 60_000)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("spyre").chain(args.iter().copied()))
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_defaults() {
        let Command::Run(run) = parse(&["run"]).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(run.threads, 2);
        assert_eq!(run.iterations, 200);
        assert_eq!(run.size, 1 << 20);
        assert_eq!(run.kernel, KernelArg::Axpy);
        assert_eq!(run.in_flight, 4);
        assert_eq!(run.seed, 1);
        assert!(!run.json);
    }

    #[test]
    fn run_arguments() {
        let cli = parse(&[
            "run",
            "--threads",
            "3",
            "--iterations",
            "5",
            "--size",
            "4KiB",
            "--kernel",
            "matmul",
            "--in-flight",
            "2",
            "--seed",
            "9",
            "--json",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run");
        };
        assert_eq!(
            (
                run.threads,
                run.iterations,
                run.size,
                run.in_flight,
                run.seed
            ),
            (3, 5, 4096, 2, 9)
        );
        assert_eq!(run.kernel, KernelArg::Matmul);
        assert!(run.json);
    }

    #[test]
    fn zero_and_junk_are_refused_with_the_value() {
        for (flag, value, needle) in [
            (
                "--threads",
                "0",
                "the thread count must be at least 1, got \"0\"",
            ),
            ("--threads", "1025", "at most 1024"),
            (
                "--threads",
                "x",
                "\"x\" is not a whole number; expected a whole number from 1 to 1024",
            ),
            (
                "--iterations",
                "0",
                "the iteration count must be at least 1",
            ),
            ("--in-flight", "0", "the in-flight count must be at least 1"),
            ("--size", "0", "the size must be at least 1 byte, got \"0\""),
            ("--size", "1XB", "unknown unit"),
        ] {
            let err = parse(&["run", flag, value]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{flag} {value}");
            assert_eq!(err.exit_code(), 2);
            let text = err.to_string();
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        let err = parse(&["run", "--kernel", "conv"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue);
    }

    #[test]
    fn bench_sizes_are_a_list() {
        let Command::Bench(bench) = parse(&["bench", "--sizes", "1KiB,2MiB"]).unwrap().command
        else {
            panic!("not bench");
        };
        assert_eq!(bench.sizes, vec![1024, 2 << 20]);
        assert_eq!(bench.budget_ms, 250);
        // A thousands separator would split one size in two.
        let err = parse(&["bench", "--sizes", "4,096"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("\"096\" starts with 0"), "{err}");
    }

    #[test]
    fn pipeline_takes_the_environments_booleans_in_any_case() {
        let pipeline = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Bench(bench)) => Ok(bench.pipeline),
            Ok(_) => panic!("not bench"),
            Err(err) => Err(err.kind()),
        };
        assert_eq!(pipeline(&["bench"]), Ok(true), "on by default");
        for on in ["true", "1", "on", "yes", "YES", "True"] {
            assert_eq!(pipeline(&["bench", "--pipeline", on]), Ok(true), "{on}");
        }
        for off in ["false", "0", "off", "no", "OFF", "No"] {
            assert_eq!(pipeline(&["bench", "--pipeline", off]), Ok(false), "{off}");
        }
        for bad in ["maybe", "", "2", " yes"] {
            assert_eq!(
                pipeline(&["bench", "--pipeline", bad]),
                Err(ErrorKind::InvalidValue),
                "{bad:?}"
            );
        }
    }
}

//! `spyre`: the command-line tool of the Spyre stream pool.
//!
//! It is for checking a host and the stream layer end to end:
//!
//! - `spyre info` shows the backend in use (the software device or a flex
//!   library, with its path and ABI version), the devices, the logical device
//!   this process binds and why, the pool's id layout, hazard tracking, and
//!   the environment variables in effect.
//! - `spyre run` runs the main workload: several host threads, each keeping
//!   several iterations in flight on streams of both priority pools; every
//!   iteration copies its inputs and a kernel descriptor to the device,
//!   computes (axpy or matmul), copies the result back, and checks it bit for
//!   bit against a reference computed on the host. It prints launches, bytes
//!   moved, throughput, wall time and per-stream counts, or one JSON object.
//! - `spyre bench` takes quick measurements: handle resolution, pool
//!   assignment, an empty op's round trip, H2D and D2H bandwidth.
//!
//! The same binary runs on the software device (feature `mock`, the default)
//! and through the FFI path on a flex library (feature `hardware`,
//! `SPYRE_BACKEND=hardware`, `FLEX_RUNTIME_LIB=<path>`). Exit codes: 0
//! success, 1 the work failed, 2 bad arguments or environment (see
//! `error.rs`).
#![forbid(unsafe_code)]

/// Added to the steps that take a stream from the pool, for `run` and
/// `bench`: the first take initializes the stream pool, which creates its
/// host-compute streams, so a failure of that creation is reported there.
/// A macro, so that `concat!` can make a `&'static str` step of it.
macro_rules! first_take {
    () => {
        " (the first take also initializes the stream pool, creating its host-compute streams)"
    };
}

mod bench;
mod cli;
mod error;
mod host_memory;
mod info;
mod output;
mod run;
mod size;
mod verify;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use clap::Parser as _;
use tracing_subscriber::EnvFilter;

use crate::bench::BenchReport;
use crate::cli::{Cli, Command};
use crate::error::{CliError, ErrorReport};
use crate::output::{emit, to_json_line};
use crate::run::RunReport;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return argument_error(&error),
    };
    init_tracing();
    match dispatch(&cli.command) {
        Ok(()) => ExitCode::from(error::EXIT_OK),
        Err(Failure { error, report }) => {
            let _ = writeln!(std::io::stderr(), "error: {error}");
            if cli.command.reports_errors_as_json() {
                // Whoever parses stdout gets one line either way.
                let json = match report {
                    Some(report) => ErrorReport::after(&error, report),
                    None => ErrorReport::new(&error),
                };
                let _ = to_json_line(&json).and_then(|line| emit(&line));
            }
            error.process_exit_code()
        }
    }
}

/// Why a command failed, and, for a `spyre run --json` that ran but could
/// not write its trace or timeline, or a `spyre bench --json` whose
/// measurement failed part-way, the command's report (what it did), which
/// goes into the failure's JSON line (without `--json` it is printed before
/// the error).
struct Failure {
    error: CliError,
    report: Option<serde_json::Value>,
}

impl From<CliError> for Failure {
    fn from(error: CliError) -> Self {
        Self {
            error,
            report: None,
        }
    }
}

/// Reports an argument clap refused (or `--help`/`--version`) as clap does,
/// and, when `--json` is among the arguments, also as the one JSON line that
/// `--json` promises for failures (`{"error": ..., "exit_code": 2}`).
///
/// Help or a version that cannot be written (a full disk, not a closed
/// pipe) is a failure, as a report that cannot be written is.
fn argument_error(error: &clap::Error) -> ExitCode {
    let printed = error.print().and_then(|()| std::io::stdout().flush());
    let code = error.exit_code();
    if code == 0
        && let Err(e) = printed
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        let _ = writeln!(std::io::stderr(), "error: cannot write to stdout: {e}");
        return ExitCode::from(error::EXIT_FAILURE);
    }
    if code != 0 && std::env::args_os().any(|arg| arg == "--json") {
        // The message with what was expected (clap's possible values and
        // tips), without the usage and the pointer to --help.
        let rendered = error.render().to_string();
        let message = rendered
            .lines()
            .map(str::trim)
            .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more"))
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let message = message.strip_prefix("error: ").unwrap_or(&message);
        let report = ErrorReport::new(&CliError::Usage(message.to_owned()));
        let _ = to_json_line(&report).and_then(|line| emit(&line));
    }
    ExitCode::from(u8::try_from(code).unwrap_or(error::EXIT_USAGE))
}

/// Logs to stderr (lines that cannot be written are dropped), filtered by `RUST_LOG` (unset or empty: `warn`; a value
/// that is not a filter, or not Unicode: `warn`, with a warning that names it), in colour
/// only when stderr is a terminal and `NO_COLOR` is unset or empty.
fn init_tracing() {
    let raw = match std::env::var("RUST_LOG") {
        Ok(raw) => Some(raw).filter(|v| !v.is_empty()),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(raw)) => {
            let _ = writeln!(
                std::io::stderr(),
                "warning: RUST_LOG={raw:?} is not Unicode, so not a log filter; using `warn`"
            );
            None
        }
    };
    let filter = match raw.as_deref().map(EnvFilter::try_new) {
        None => EnvFilter::new("warn"),
        Some(Ok(filter)) => filter,
        Some(Err(e)) => {
            let _ = writeln!(
                std::io::stderr(),
                "warning: RUST_LOG={:?} is not a log filter ({e}); using `warn`",
                raw.unwrap_or_default()
            );
            EnvFilter::new("warn")
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr closed or a full pipe)
        // is dropped; reporting that on stderr again would panic.
        .log_internal_errors(false)
        .with_ansi(use_colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .try_init();
}

/// Whether to write colour codes: only to a terminal, and not when
/// `NO_COLOR` is set to a non-empty value (no-color.org).
fn use_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Runs one subcommand and prints its output.
fn dispatch(command: &Command) -> Result<(), Failure> {
    match command {
        Command::Info(args) => {
            let (report, error) = info::gather();
            emit(&if args.json {
                to_json_line(&report)?
            } else {
                report.to_text()
            })?;
            error.map_or(Ok(()), |error| Err(error.into()))
        }
        Command::Run(args) => {
            let outcome = run::run(args)?;
            let unwritten = outcome.unwritten.clone().map(CliError::Failed);
            let report = RunReport::new(args, &outcome);
            finish(args.json, &report, RunReport::to_text, unwritten)
        }
        Command::Bench(args) => {
            let bench::BenchOutcome { report, failed } = bench::bench(args)?;
            finish(args.json, &report, BenchReport::to_text, failed)
        }
    }
}

/// Prints a command's `report` (one JSON line with `json`, else
/// `to_text`'s), or, where `failed` says the command ended in an error
/// after the report was made (a run whose trace could not be written, a
/// bench whose measurement failed part-way), what was done and the error:
/// with `json`, one line, the error's, with the report in it; else the
/// report, then the error.
fn finish<R: serde::Serialize>(
    json: bool,
    report: &R,
    to_text: impl Fn(&R) -> String,
    failed: Option<CliError>,
) -> Result<(), Failure> {
    match failed {
        Some(error) if json => Err(Failure {
            report: serde_json::to_value(report).ok(),
            error,
        }),
        Some(error) => Ok(emit(&to_text(report)).and(Err(error))?),
        None => Ok(emit(&if json {
            to_json_line(report)?
        } else {
            to_text(report)
        })?),
    }
}

#[cfg(test)]
mod tests {
    use super::use_colour;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some("".as_ref())));
        assert!(!use_colour(true, Some("1".as_ref())));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some("".as_ref())));
    }
}

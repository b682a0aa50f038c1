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

mod bench;
mod cli;
mod error;
mod info;
mod report;
mod run;
mod size;
mod verify;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};
use crate::error::CliError;
use crate::report::{RunReport, emit, to_json_line};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match dispatch(&cli.command) {
        Ok(()) => ExitCode::from(error::EXIT_OK),
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "error: {error}");
            error.process_exit_code()
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `warn`).
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs one subcommand and prints its output.
fn dispatch(command: &Command) -> Result<(), CliError> {
    match command {
        Command::Info(args) => {
            let (report, error) = info::gather();
            emit(&if args.json {
                to_json_line(&report)?
            } else {
                report.to_text()
            })?;
            error.map_or(Ok(()), Err)
        }
        Command::Run(args) => {
            let outcome = run::run(args)?;
            let report = RunReport::new(args, &outcome);
            emit(&if args.json {
                to_json_line(&report)?
            } else {
                report.to_text()
            })
        }
        Command::Bench(args) => {
            let report = bench::bench(args)?;
            emit(&if args.json {
                to_json_line(&report)?
            } else {
                report.to_text()
            })
        }
    }
}

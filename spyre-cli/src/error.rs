//! Errors of the command and its exit codes.
//!
//! | code | meaning |
//! |---:|---|
//! | 0 | success |
//! | 1 | the work failed: a device or runtime error, a result that differs from the host reference |
//! | 2 | the invocation is wrong: a bad argument (clap's own errors use 2 too), a value the device cannot take, a malformed environment variable, a flex library without a call the command needs |

use std::fmt;
use std::process::ExitCode;

/// Exit code for success.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit code when the work failed.
pub(crate) const EXIT_FAILURE: u8 = 1;
/// Exit code when the invocation (arguments or environment) is wrong.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Everything that makes `spyre` exit with a non-zero code.
#[derive(Debug)]
pub(crate) enum CliError {
    /// An argument or a combination of arguments that cannot be used; the
    /// message names the value and what was expected.
    Usage(String),
    /// An error of the stream layer outside any iteration (starting the
    /// runtime, counting devices, ...), with what was being done.
    Stream {
        /// What the command was doing.
        context: &'static str,
        /// The stream layer's error.
        source: spyre_stream::Error,
    },
    /// An iteration of `spyre run` failed.
    Iteration(Box<IterationFailure>),
    /// A measurement of `spyre bench` failed: its name (with its size, for
    /// a bandwidth), and why.
    Measurement {
        /// The measurement, as its progress names it.
        name: String,
        /// Why it failed; its exit code is the error's.
        source: Box<CliError>,
    },
    /// Anything else that failed, described.
    Failed(String),
}

impl CliError {
    /// A [`CliError::Stream`] with `context`.
    pub(crate) fn stream(context: &'static str, source: spyre_stream::Error) -> Self {
        Self::Stream { context, source }
    }

    /// The process exit code for this error (see the [module docs](self)).
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => EXIT_USAGE,
            Self::Stream { source, .. } if is_configuration_error(source) => EXIT_USAGE,
            Self::Iteration(failure) if failure.is_out_of_memory() => EXIT_USAGE,
            Self::Measurement { source, .. } => source.exit_code(),
            Self::Stream { .. } | Self::Iteration(_) | Self::Failed(_) => EXIT_FAILURE,
        }
    }

    /// [`CliError::exit_code`] as a process exit code.
    pub(crate) fn process_exit_code(&self) -> ExitCode {
        ExitCode::from(self.exit_code())
    }
}

/// A failure as `--json` reports it on stdout:
/// `{"error": "<message>", "exit_code": <code>}`, so that a script reading
/// stdout gets one JSON line whether the command succeeded or not; with
/// `"report"` too where the command's own report was made before it failed
/// (a run whose trace could not be written, a bench whose measurement
/// failed part-way: with the measurements made before it).
#[derive(Debug, serde::Serialize)]
pub(crate) struct ErrorReport {
    /// The message also printed on stderr, without the `error: ` prefix.
    error: String,
    /// The process exit code (see the [module docs](self)).
    exit_code: u8,
    /// The command's report, where it was made before the failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    report: Option<serde_json::Value>,
}

impl ErrorReport {
    /// The report of `error`.
    pub(crate) fn new(error: &CliError) -> Self {
        Self {
            error: error.to_string(),
            exit_code: error.exit_code(),
            report: None,
        }
    }

    /// The report of `error`, which came after the command made `report`.
    pub(crate) fn after(error: &CliError, report: serde_json::Value) -> Self {
        Self {
            report: Some(report),
            ..Self::new(error)
        }
    }
}

/// Whether a stream-layer error means the environment is set up wrong (a
/// malformed variable, a backend this build lacks, a flex library that
/// cannot be loaded or lacks a call the command needs, a device that does
/// not exist, a bad `SPYRE_MOCK_*` value) rather than that the device
/// failed.
fn is_configuration_error(error: &spyre_stream::Error) -> bool {
    use spyre_stream::Error;
    matches!(
        error,
        Error::InvalidEnv { .. }
            | Error::BackendConfig(_)
            | Error::BackendFromParent { .. }
            | Error::Load(_)
            | Error::BackendUnavailable(_)
            | Error::DeviceOutOfRange { .. }
            | Error::InvalidHostComputeStreams { .. }
            | Error::InvalidDeviceIndex { .. }
            | Error::Unsupported(_)
    )
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(message) | Self::Failed(message) => f.write_str(message),
            Self::Stream { context, source } => write!(f, "{context}: {source}"),
            Self::Iteration(failure) => failure.fmt(f),
            Self::Measurement { name, source } => write!(f, "measuring {name}: {source}"),
        }
    }
}

impl std::error::Error for CliError {}

/// Where a failed iteration ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IterationPlace {
    /// Host thread index, from 0.
    pub(crate) thread: usize,
    /// Iteration index within the thread, from 0.
    pub(crate) iteration: u64,
    /// The stream id, once the iteration had a stream.
    pub(crate) stream_id: Option<i64>,
}

impl fmt::Display for IterationPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "thread {}, iteration {}", self.thread, self.iteration)?;
        match self.stream_id {
            Some(id) => write!(f, ", stream {id} ({} pool)", pool_name(id)),
            None => write!(f, ", before a stream was assigned"),
        }
    }
}

/// The pool an id is in, for messages: `default`, `normal`, `high`,
/// `host-compute` (spyre-stream's [`spyre_stream::PoolKind`]), or `unknown`.
pub(crate) fn pool_name(id: i64) -> &'static str {
    spyre_stream::StreamId(id)
        .pool()
        .map_or("unknown", spyre_stream::PoolKind::as_str)
}

/// One iteration of `spyre run` that failed, and how.
#[derive(Debug)]
pub(crate) struct IterationFailure {
    /// Where it ran.
    pub(crate) place: IterationPlace,
    /// What went wrong.
    pub(crate) kind: FailureKind,
}

impl IterationFailure {
    /// Whether the device ran out of memory (an invocation that asks for too much).
    pub(crate) fn is_out_of_memory(&self) -> bool {
        matches!(self.kind, FailureKind::OutOfMemory { .. })
    }
}

/// Which of `spyre run`'s flags that set the device memory a run holds can
/// still lower it; displays as the advice of a run that ran out of device
/// memory: lower those, or, where none can, use a device with more memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lowerable {
    /// A smaller `--size` gives smaller operand blocks.
    pub(crate) size: bool,
    /// `--in-flight` keeps several iterations' memory per thread.
    pub(crate) in_flight: bool,
    /// `--threads` is above 1.
    pub(crate) threads: bool,
    /// A pipelined thread keeps two iterations' memory, which
    /// `--mode per-iteration --in-flight 1` halves.
    pub(crate) one_per_thread: bool,
}

impl fmt::Display for Lowerable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const ONE_EACH: &str =
            "use --mode per-iteration --in-flight 1 (one iteration's memory per thread)";
        let flags: Vec<&str> = [
            (self.size, "--size"),
            (self.in_flight, "--in-flight"),
            (self.threads, "--threads"),
        ]
        .into_iter()
        .filter_map(|(lowerable, flag)| lowerable.then_some(flag))
        .collect();
        match (flags.as_slice(), self.one_per_thread) {
            ([], false) => {
                f.write_str("every flag is at its smallest already: use a device with more memory")
            }
            ([], true) => f.write_str(ONE_EACH),
            ([flag], _) => write!(f, "lower {flag}"),
            ([rest @ .., last], _) => write!(f, "lower {} or {last}", rest.join(", ")),
        }?;
        if self.one_per_thread && !flags.is_empty() {
            write!(f, ", or {ONE_EACH}")?;
        }
        Ok(())
    }
}

/// How an iteration failed.
#[derive(Debug)]
pub(crate) enum FailureKind {
    /// The stream layer or the device returned an error.
    Device {
        /// The step, for example `H2D of x` or `compute (axpy)`.
        step: String,
        /// The error.
        source: spyre_stream::Error,
    },
    /// Device memory ran out.
    OutOfMemory {
        /// Bytes that were asked for.
        bytes: u64,
        /// The allocator's error.
        source: spyre_stream::Error,
        /// Which of the run's flags can be lowered, for the advice.
        lowerable: Lowerable,
    },
    /// The result read back differs from the host reference.
    Mismatch(Mismatch),
}

/// The first element where a result differs from the host reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Mismatch {
    /// Index of the first differing element.
    pub(crate) index: usize,
    /// The reference value.
    pub(crate) expected: f32,
    /// The value read from the device.
    pub(crate) got: f32,
    /// How many elements differ in all.
    pub(crate) differing: usize,
    /// Elements compared.
    pub(crate) len: usize,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "result differs from the host reference at element {} of {}: expected {:e} ({:#010x}), got {:e} ({:#010x}); {} element(s) differ",
            self.index,
            self.len,
            self.expected,
            self.expected.to_bits(),
            self.got,
            self.got.to_bits(),
            self.differing
        )
    }
}

impl fmt::Display for IterationFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "iteration failed ({}): ", self.place)?;
        match &self.kind {
            FailureKind::Device { step, source } => write!(f, "{step}: {source}"),
            FailureKind::OutOfMemory {
                bytes,
                source,
                lowerable,
            } => write!(
                f,
                "the device has no room for {bytes} more bytes ({source}); {lowerable}"
            ),
            FailureKind::Mismatch(mismatch) => mismatch.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use spyre_stream::{FlexError, Status};

    use super::*;

    fn place() -> IterationPlace {
        IterationPlace {
            thread: 1,
            iteration: 7,
            stream_id: Some(35),
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(CliError::Usage("x".into()).exit_code(), EXIT_USAGE);
        assert_eq!(CliError::Failed("x".into()).exit_code(), EXIT_FAILURE);
        let env = spyre_stream::Error::InvalidEnv {
            variable: "LOCAL_RANK",
            value: "abc".into(),
            reason: "r".into(),
        };
        assert_eq!(CliError::stream("starting", env).exit_code(), EXIT_USAGE);
        let device = spyre_stream::Error::Flex(FlexError::new(
            Status::EXECUTION_FAILED,
            "launch_compute",
            "boom",
        ));
        assert_eq!(CliError::stream("x", device).exit_code(), EXIT_FAILURE);
        let oom = IterationFailure {
            place: place(),
            kind: FailureKind::OutOfMemory {
                bytes: 10,
                source: FlexError::new(Status::OUT_OF_MEMORY, "allocate", "full").into(),
                lowerable: Lowerable {
                    size: true,
                    in_flight: false,
                    threads: false,
                    one_per_thread: false,
                },
            },
        };
        assert_eq!(CliError::Iteration(Box::new(oom)).exit_code(), EXIT_USAGE);
    }

    /// The advice of a run out of device memory names only the flags
    /// that can still be lowered (before, always all three).
    #[test]
    fn out_of_memory_advice_names_only_the_flags_above_their_smallest() {
        let advice = |size, in_flight, threads| {
            Lowerable {
                size,
                in_flight,
                threads,
                one_per_thread: false,
            }
            .to_string()
        };
        assert_eq!(
            advice(true, true, true),
            "lower --size, --in-flight or --threads"
        );
        assert_eq!(advice(true, false, true), "lower --size or --threads");
        assert_eq!(advice(false, true, false), "lower --in-flight");
        assert_eq!(
            advice(false, false, false),
            "every flag is at its smallest already: use a device with more memory"
        );
        // A pipelined thread's two iterations: one each per iteration.
        let pipelined = |size| Lowerable {
            size,
            in_flight: false,
            threads: false,
            one_per_thread: true,
        };
        assert_eq!(
            pipelined(false).to_string(),
            "use --mode per-iteration --in-flight 1 (one iteration's memory per thread)"
        );
        assert_eq!(
            pipelined(true).to_string(),
            "lower --size, or use --mode per-iteration --in-flight 1 (one iteration's memory per thread)"
        );
    }

    #[test]
    fn mismatch_message_names_everything() {
        let failure = IterationFailure {
            place: place(),
            kind: FailureKind::Mismatch(Mismatch {
                index: 3,
                expected: 1.5,
                got: 2.0,
                differing: 2,
                len: 10,
            }),
        };
        let message = failure.to_string();
        assert_eq!(
            message,
            "iteration failed (thread 1, iteration 7, stream 35 (high pool)): result differs from the host reference at element 3 of 10: expected 1.5e0 (0x3fc00000), got 2e0 (0x40000000); 2 element(s) differ"
        );
        assert_eq!(pool_name(1), "normal");
        assert_eq!(pool_name(32), "normal");
        assert_eq!(pool_name(64), "high");
        assert_eq!(pool_name(0), "default");
        assert_eq!(pool_name(65), "host-compute");
    }
}

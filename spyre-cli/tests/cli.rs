//! Runs the `spyre` binary with small arguments and checks what is right by
//! construction: counts, bytes, stream ids, exit codes and messages.
//!
//! Every child runs on the software device: `SPYRE_BACKEND=mock` is set
//! because `cargo test --workspace` may build the stream layer with both
//! backends, and then the default would be hardware. A build without the
//! software device (`--no-default-features --features hardware`) has nothing
//! to run these on, so the file is empty there.
#![cfg(feature = "mock")]

use std::fs::File;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// Removes every variable of the stream layer, its backends, logging and
/// the launchers from `command`'s environment (by prefix, so a new
/// `SPYRE_MOCK_*` switch cannot leak in from the test's own environment,
/// nor a launcher's rank from a test run under one).
fn clear_environment(command: &mut Command) {
    const PREFIXES: [&str; 12] = [
        "SPYRE_",
        "TORCH_SPYRE_",
        "LOCAL_RANK",
        "RANK",
        "WORLD_SIZE",
        "OMPI_",
        "PMI_",
        "MPI_LOCALRANKID",
        "SLURM_",
        "FLEX_RUNTIME_LIB",
        "RUST_LOG",
        "RUST_BACKTRACE",
    ];
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if PREFIXES.iter().any(|p| name.starts_with(p)) {
            command.env_remove(name.as_ref());
        }
    }
}

/// A `spyre` command with `args` on the software device, with a clean
/// environment.
fn spyre_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spyre"));
    command.args(args);
    clear_environment(&mut command);
    command.env("SPYRE_BACKEND", "mock");
    command
}

/// A new directory for this test process's files, named `spyre-NAME-PID`
/// in the temporary directory.
fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("spyre-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `spyre` on the software device, with a clean environment plus `env`.
fn spyre(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = spyre_command(args);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("the spyre binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `spyre`, expects success and one JSON object on stdout.
fn json(args: &[&str], env: &[(&str, &str)]) -> Value {
    let output = spyre(args, env);
    assert_eq!(
        output.status.code(),
        Some(0),
        "spyre {args:?} failed\nstdout: {}\nstderr: {}",
        stdout(&output),
        stderr(&output)
    );
    let text = stdout(&output);
    assert_eq!(text.lines().count(), 1, "one line of JSON: {text}");
    serde_json::from_str(&text).expect("stdout is JSON")
}

fn u64_of(value: &Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number in {value}"))
}

/// Checks the per-stream counts of a run report.
fn check_streams(report: &Value, normal_iterations: u64, high_iterations: u64) {
    let streams = report["streams"].as_array().expect("streams is an array");
    let mut sum = 0;
    let (mut normal, mut high) = (0, 0);
    for stream in streams {
        let id = stream["id"].as_i64().expect("id");
        let operations = stream["operations"].as_u64().expect("operations");
        assert!(operations > 0 && operations % 5 == 0, "{stream}");
        sum += operations;
        match id {
            1..=32 => {
                assert_eq!(stream["pool"], "normal", "{stream}");
                normal += 1;
            }
            33..=64 => {
                assert_eq!(stream["pool"], "high", "{stream}");
                high += 1;
            }
            other => panic!("stream id {other} is outside the normal and high pools"),
        }
    }
    assert_eq!(
        sum,
        u64_of(report, "operations"),
        "per-stream counts sum to the total"
    );
    assert!(normal > 0, "a normal-priority stream (1–32) was used");
    assert!(high > 0, "a high-priority stream (33–64) was used");
    assert_eq!(u64_of(report, "streams_used"), streams.len() as u64);
    assert_eq!(u64_of(report, "streams_used_normal"), normal);
    assert_eq!(u64_of(report, "streams_used_high"), high);
    assert_eq!(u64_of(report, "operations_normal"), 5 * normal_iterations);
    assert_eq!(u64_of(report, "operations_high"), 5 * high_iterations);
}

#[test]
fn axpy_run_reports_exact_counts() {
    let report = json(
        &[
            "run",
            "--threads",
            "2",
            "--iterations",
            "5",
            "--size",
            "4KiB",
            "--mode",
            "per-iteration",
            "--json",
        ],
        &[],
    );
    let (threads, iterations) = (2, 5);
    let total = threads * iterations;
    // --size covers both inputs and the output: 4096 / 12 = 341 f32 each.
    let n = 4096 / 12;
    let operand = 4 * n;
    assert_eq!(report["backend"], "mock");
    assert_eq!(report["kernel"], "axpy");
    assert_eq!(report["dims"], serde_json::json!([n]));
    assert_eq!(u64_of(&report, "operand_bytes"), operand);
    assert_eq!(u64_of(&report, "size_bytes"), 4096);
    assert_eq!(u64_of(&report, "iterations_total"), total);
    assert_eq!(u64_of(&report, "iterations_verified"), total);
    assert_eq!(u64_of(&report, "operations"), 5 * total);
    assert_eq!(u64_of(&report, "operations_h2d"), 3 * total);
    assert_eq!(u64_of(&report, "operations_compute"), total);
    assert_eq!(u64_of(&report, "operations_d2h"), total);
    // H2D: x, y and the 128-byte descriptor; D2H: out.
    assert_eq!(u64_of(&report, "bytes_h2d"), total * (2 * operand + 128));
    assert_eq!(u64_of(&report, "bytes_d2h"), total * operand);
    assert_eq!(u64_of(&report, "bytes_moved"), total * (3 * operand + 128));
    assert!(report["wall_seconds"].as_f64().expect("wall_seconds") > 0.0);
    assert!(report["gb_per_s"].as_f64().expect("gb_per_s") > 0.0);
    // Priorities alternate per iteration, starting at 0 on even threads and
    // at -1 on odd ones: 5 iterations on each pool, each on a fresh stream
    // of the 32-stream round robin.
    check_streams(&report, 5, 5);
    assert_eq!(u64_of(&report, "streams_used"), 10);
}

#[test]
fn matmul_run_reports_exact_counts() {
    let report = json(
        &[
            "run",
            "--kernel",
            "matmul",
            "--threads",
            "2",
            "--iterations",
            "3",
            "--in-flight",
            "2",
            "--size",
            "4KiB",
            "--seed",
            "99",
            "--mode",
            "per-iteration",
            "--json",
        ],
        &[],
    );
    // 4096 / 12 = 341 f32 per matrix; floor(sqrt(341)) = 18.
    let n = 18;
    let operand = 4 * n * n;
    let total = 6;
    assert_eq!(report["kernel"], "matmul");
    assert_eq!(report["dims"], serde_json::json!([n, n, n]));
    assert_eq!(u64_of(&report, "elements_per_operand"), n * n);
    assert_eq!(u64_of(&report, "seed"), 99);
    assert_eq!(u64_of(&report, "in_flight"), 2);
    assert_eq!(u64_of(&report, "iterations_verified"), total);
    assert_eq!(u64_of(&report, "operations"), 5 * total);
    assert_eq!(u64_of(&report, "bytes_moved"), total * (3 * operand + 128));
    // Thread 0: 0, -1, 0; thread 1: -1, 0, -1.
    check_streams(&report, 3, 3);
}

#[test]
fn a_pipelined_run_orders_its_stages_with_events_and_measures_their_overlap() {
    // Every operation takes 20 ms on a device of four engines: stages of
    // consecutive iterations can only overlap if nothing but events orders
    // them. (So long that the host's pauses on a busy machine, which leave
    // the device idle, cannot hide the overlap.)
    let report = json(
        &[
            "run",
            "--threads",
            "2",
            "--iterations",
            "5",
            "--size",
            "4KiB",
            "--json",
        ],
        &[
            ("SPYRE_MOCK_OP_LATENCY_US", "20000"),
            ("SPYRE_MOCK_ENGINES", "4"),
        ],
    );
    assert_eq!(report["mode"], "pipelined");
    assert_eq!(u64_of(&report, "iterations_verified"), 10);
    assert_eq!(u64_of(&report, "operations"), 50);
    // Thread 0 runs priorities 0, -1, 0, -1, 0 and thread 1 the opposite:
    // five iterations of each, five launches each (two on the copy-in
    // stream, two on the compute stream, one on the copy-out stream).
    assert_eq!(u64_of(&report, "operations_normal"), 25);
    assert_eq!(u64_of(&report, "operations_high"), 25);
    let streams = report["streams"].as_array().expect("streams");
    let sum: u64 = streams
        .iter()
        .map(|s| s["operations"].as_u64().expect("operations"))
        .sum();
    assert_eq!(sum, 50);
    let overlap = &report["overlap"];
    let stages = overlap["stage_seconds"].as_array().expect("stage_seconds");
    assert_eq!(stages.len(), 3);
    // Each stage holds at least its operations' 20 ms, ten times over:
    // copy-in and compute two operations, copy-out one.
    for (stage, operations) in stages.iter().zip([2.0, 2.0, 1.0]) {
        let seconds = stage.as_f64().expect("seconds");
        assert!(seconds >= 10.0 * operations * 0.020, "{overlap}");
    }
    let factor = overlap["factor"].as_f64().expect("factor");
    assert!(factor > 1.0, "the stages overlapped: {overlap}");
    // The per-iteration and serialized modes have no stages to time.
    for mode in ["per-iteration", "serialized"] {
        let report = json(
            &[
                "run",
                "--iterations",
                "2",
                "--size",
                "4KiB",
                "--mode",
                mode,
                "--json",
            ],
            &[],
        );
        assert_eq!(report["mode"], mode);
        assert_eq!(report["overlap"], Value::Null);
        assert_eq!(u64_of(&report, "iterations_verified"), 4);
    }
    // Serialized: each thread keeps to one stream.
    let report = json(
        &[
            "run",
            "--iterations",
            "3",
            "--size",
            "4KiB",
            "--mode",
            "serialized",
            "--json",
        ],
        &[],
    );
    assert_eq!(u64_of(&report, "streams_used"), 2);
    check_streams(&report, 3, 3);
}

#[test]
fn many_iterations_wrap_both_round_robins() {
    let report = json(
        &[
            "run",
            "--threads",
            "2",
            "--iterations",
            "40",
            "--size",
            "1KiB",
            "--in-flight",
            "8",
            "--mode",
            "per-iteration",
            "--json",
        ],
        &[],
    );
    assert_eq!(u64_of(&report, "iterations_verified"), 80);
    assert_eq!(u64_of(&report, "streams_used_normal"), 32);
    assert_eq!(u64_of(&report, "streams_used_high"), 32);
    check_streams(&report, 40, 40);
}

#[test]
fn text_report_names_the_totals() {
    let output = spyre(
        &[
            "run",
            "--threads",
            "1",
            "--iterations",
            "4",
            "--size",
            "1KiB",
        ],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    for needle in [
        "verified     4 / 4 iterations",
        "operations   20 launches (12 H2D, 4 compute, 4 D2H",
        "wall time",
        "GB/s",
        "normal (ids 1–32)",
        "high (ids 33–64)",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    // stderr is not a terminal here: no progress bar.
    assert_eq!(stderr(&output), "");
}

/// Runs `spyre` with bad input: exit code 2, the message names `needles`,
/// and nothing panicked.
fn refused(args: &[&str], env: &[(&str, &str)], needles: &[&str]) {
    let output = spyre(args, env);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "spyre {args:?}: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_counts_exit_2_naming_the_value() {
    refused(
        &[
            "run",
            "--threads",
            "2",
            "--iterations",
            "18446744073709551615",
        ],
        &[],
        &[
            "--threads 2 × --iterations 18446744073709551615 is more iterations than can be counted; their product must be at most 18446744073709551615 (use fewer --iterations)",
        ],
    );
    refused(
        &["run", "--threads", "0"],
        &[],
        &["'0'", "--threads", "must be at least 1"],
    );
    refused(
        &["run", "--iterations", "0"],
        &[],
        &["'0'", "--iterations", "must be at least 1"],
    );
    refused(
        &["run", "--in-flight", "0"],
        &[],
        &["'0'", "--in-flight", "must be at least 1"],
    );
    refused(
        &["run", "--threads", "many"],
        &[],
        &["'many'", "not a whole number"],
    );
    refused(
        &["run", "--kernel", "conv"],
        &[],
        &["'conv'", "axpy", "matmul"],
    );
    // Negative and too large: named as such, not as a stray flag or as
    // something that is not a number.
    refused(
        &["run", "--threads", "-1"],
        &[],
        &["'-1'", "--threads", "must be at least 1"],
    );
    refused(
        &["run", "--iterations", "18446744073709551616"],
        &[],
        &["must be at most 18446744073709551615"],
    );
    refused(
        &["run", "--seed", "-1"],
        &[],
        &["'-1'", "--seed", "cannot be negative"],
    );
    refused(
        &["run", "--seed", "x"],
        &[],
        &[
            "'x'",
            "expected a whole number from 0 to 18446744073709551615",
        ],
    );
    refused(&["run", "--bogus"], &[], &["--bogus"]);
    refused(&[], &[], &["Usage"]);
}

#[test]
fn bad_sizes_exit_2_naming_the_value() {
    refused(
        &["run", "--size", "0"],
        &[],
        &["'0'", "--size", "at least 1 byte"],
    );
    refused(&["run", "--size", "4XB"], &[], &["'4XB'", "unknown unit"]);
    refused(
        &["run", "--size", "8"],
        &[],
        &["--size 8 is too small for axpy", "at least 12 bytes"],
    );
    // Larger than the software device's memory (1 GiB by default).
    refused(
        &[
            "run",
            "--size",
            "2GiB",
            "--threads",
            "1",
            "--in-flight",
            "1",
        ],
        &[],
        &["--size 2147483648", "268435456 bytes"],
    );
    refused(
        &[
            "run",
            "--size",
            "1100MiB",
            "--threads",
            "1",
            "--in-flight",
            "1",
        ],
        &[("SPYRE_MOCK_REGION_BYTES", "1073741824")],
        &[
            "--size 1153433600",
            "per iteration",
            "the device has 1073741824 bytes",
        ],
    );
    // 300 MiB makes operands of 100 MiB: a 256 MiB region holds two, so the
    // default 1 GiB in four regions holds 8 blocks, 2 iterations, although
    // 3 × 300 MiB is less than 1 GiB.
    refused(
        &[
            "run",
            "--size",
            "300MiB",
            "--threads",
            "1",
            "--in-flight",
            "3",
            "--mode",
            "per-iteration",
        ],
        &[],
        &[
            "--threads 1 and --in-flight 3 (--mode per-iteration) keeps 3 iterations' memory on the device",
            "3 blocks of 104857600 bytes",
            "where the caching allocator's segments hold at most 2 of them at once beside their programs",
            "lower --in-flight to at most 2 (or --size)",
        ],
    );
    // 300 MiB fits two iterations: the advice names only what would fit
    // (with more threads than that, fewer in flight cannot help).
    let too_many = "even one iteration per thread does not fit: lower --threads to at most 2, with --in-flight 1, or use a smaller --size";
    let pipelined = "a pipelined thread keeps 2 iterations' memory however many are in flight: lower --threads to at most 1";
    let one_each =
        "or use --mode per-iteration --in-flight 1 (one iteration's memory per thread), which fits";
    let one_each_fewer = "or use --mode per-iteration --in-flight 1 with --threads at most 2";
    for (threads, mode, iterations, advice) in [
        ("3", "per-iteration", "100", &[too_many][..]),
        ("3", "pipelined", "100", &[pipelined, one_each_fewer][..]),
        ("2", "pipelined", "100", &[pipelined, one_each][..]),
        // One iteration each: a pipelined thread keeps one.
        (
            "3",
            "pipelined",
            "1",
            &[
                "keeps one iteration's memory however many are in flight: lower --threads to at most 2",
            ][..],
        ),
    ] {
        let args = [
            "run",
            "--size",
            "300MiB",
            "--threads",
            threads,
            "--mode",
            mode,
            "--iterations",
            iterations,
        ];
        refused(&args, &[], advice);
    }
    // The default 1 MiB makes operands of 349 526 bytes in blocks of
    // 349 696. 32 MiB in one region would hold 95 such blocks, 31
    // iterations (15 pipelined threads, 2 each); but the allocator's
    // segments there are 1 MiB (1/32 of the device) and hold 2 blocks
    // each, and one holds the programs, so 62 blocks, 20 iterations: 10
    // threads, not 11.
    let small = [
        ("SPYRE_MOCK_MEMORY_BYTES", "33554432"),
        ("SPYRE_MOCK_REGION_BYTES", "33554432"),
    ];
    let fits = json(
        &["run", "--json", "--threads", "10", "--iterations", "2"],
        &small,
    );
    assert_eq!(u64_of(&fits, "iterations_verified"), 20);
    refused(
        &["run", "--threads", "11", "--iterations", "2"],
        &small,
        &[
            "keeps 22 iterations' memory",
            "hold at most 20 of them at once beside their programs",
            "lower --threads to at most 10",
        ],
    );
    // Operands of 32 KiB fill the 1 MiB segments of a 2 MiB device, 32 to
    // each, and a program cut from a free one leaves a rest no operand
    // fits: one block each, so 64 blocks hold 16 iterations, not the 21
    // the operands alone would. 16 in flight run (before, 17 to 20 passed
    // the check and ran out of memory at the 17th).
    let small_operands = [
        ("SPYRE_MOCK_MEMORY_BYTES", "2097152"),
        ("SPYRE_MOCK_REGION_BYTES", "1048576"),
    ];
    let per_iteration = |threads, in_flight| {
        [
            "run",
            "--size",
            "96KiB",
            "--mode",
            "per-iteration",
            "--threads",
            threads,
            "--iterations",
            "20",
            "--in-flight",
            in_flight,
        ]
    };
    let fits = json(
        &[&per_iteration("1", "16")[..], &["--json"]].concat(),
        &small_operands,
    );
    assert_eq!(u64_of(&fits, "iterations_verified"), 20);
    refused(
        &per_iteration("1", "17"),
        &small_operands,
        &[
            "keeps 17 iterations' memory",
            "hold at most 16 of them at once beside their programs",
            "lower --in-flight to at most 16 (or --size)",
        ],
    );
    // With two threads, fewer threads is advice too: 16 held, 9 each,
    // one thread.
    refused(
        &per_iteration("2", "9"),
        &small_operands,
        &["lower --in-flight to at most 8 (or --threads to at most 1, or --size)"],
    );
    // Operands that fill their segments leave no room for the programs:
    // 12 MiB holds 12 operands of 1 MiB, 4 iterations, but the programs
    // take a segment of 384 KiB (1/32 of the device), leaving 11 operands,
    // 3 iterations, for the 4 in flight of 2 pipelined threads.
    refused(
        &["run", "--size", "3MiB"],
        &[
            ("SPYRE_MOCK_MEMORY_BYTES", "12582912"),
            ("SPYRE_MOCK_REGION_BYTES", "12582912"),
        ],
        &[
            "keeps 4 iterations' memory",
            "hold at most 3 of them at once",
        ],
    );
    // What fits is told beside its own programs, not the refused run's:
    // 64 KiB in 2 KiB segments holds 128 blocks of 512 bytes; the programs
    // of 128 iterations in flight would cover all 32 segments, but 32
    // iterations fit beside theirs (8 segments, 96 blocks left): 16
    // pipelined threads.
    refused(
        &["run", "--size", "1536", "--threads", "64"],
        &[
            ("SPYRE_MOCK_MEMORY_BYTES", "65536"),
            ("SPYRE_MOCK_REGION_BYTES", "65536"),
        ],
        &[
            "hold at most 32 of them at once",
            "lower --threads to at most 16",
        ],
    );
    // Fits once, but not four times over two threads.
    refused(
        &["run", "--size", "1MiB"],
        &[
            ("SPYRE_MOCK_MEMORY_BYTES", "4194304"),
            ("SPYRE_MOCK_REGION_BYTES", "4194304"),
        ],
        &[
            "--threads 2 and --in-flight 4",
            "the device has 4194304 bytes",
        ],
    );
}

/// A run whose memory is more than the process's address-space limit
/// leaves (`ulimit -v`, which `MemAvailable` does not show) is refused
/// before it starts, naming the limit (before, the software device's first
/// region, 256 MiB, aborted the process: "memory allocation of 268435456
/// bytes failed").
#[cfg(target_os = "linux")]
#[test]
fn a_run_over_the_address_space_limit_is_refused_before_it_starts() {
    let program = env!("CARGO_BIN_EXE_spyre");
    let mut command = Command::new("sh");
    command
        .args(["-c", "ulimit -v 250000 && exec \"$0\" \"$@\""])
        .arg(program)
        .args(["run", "--threads", "1", "--iterations", "1", "--size", "12"]);
    clear_environment(&mut command);
    command.env("SPYRE_BACKEND", "mock");
    let output = command.output().expect("sh runs");
    let stderr = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("256 MiB of the software device's memory regions")
            && stderr.contains("left under the process's address-space limit (ulimit -v"),
        "{stderr}"
    );
}

/// A traced run whose trace fits what the address-space limit leaves, but
/// not beside the arenas its threads' allocator reserves (64 MiB each: two
/// workers, and the engines that have none yet) and the room the trace
/// takes to grow, is refused before it starts, saying so. Before, 70 000 iterations a thread under `ulimit -v 800000` passed
/// the check and aborted when the trace grew ("memory allocation of
/// 402653184 bytes failed"), losing the report and the trace.
#[cfg(target_os = "linux")]
#[test]
fn a_traced_run_counts_its_threads_arenas_against_the_address_space_limit() {
    let dir = scratch_dir("arenas");
    let trace = dir.join("trace.json");
    let mut command = Command::new("sh");
    command
        .args(["-c", "ulimit -v 800000 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_spyre"))
        .args(["run", "--size", "12", "--iterations", "70000", "--trace"])
        .arg(&trace);
    clear_environment(&mut command);
    command.env("SPYRE_BACKEND", "mock");
    let output = command.output().expect("sh runs");
    let stderr = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for needle in [
        "tracing 140000 iterations (the trace is kept in memory until the run ends: 333.79 MiB at about 2500 bytes an iteration;",
        "more of address space (its threads' memory allocator arenas, 64 MiB a thread, their stacks, and a trace's room to grow; with glibc, MALLOC_ARENA_MAX=2 makes the arenas fewer), but the process has",
        "left under the process's address-space limit (ulimit -v",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    }
    assert!(!trace.exists(), "no trace file before the run");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A trace too large for the host's memory is refused before the run
/// starts (before, the run grew until the host ran out of memory, and left
/// the trace empty), and no file is created.
#[cfg(target_os = "linux")]
#[test]
fn a_run_whose_trace_the_host_cannot_hold_is_refused_before_it_starts() {
    let path = std::env::temp_dir().join(format!("spyre-huge-trace-{}.json", std::process::id()));
    let path_text = path.to_str().unwrap();
    // 2 × 10^10 iterations at 2 500 bytes: 5 × 10^13 bytes (45.47 TiB).
    let huge = ["run", "--threads", "2", "--iterations", "10000000000"];
    // A trace to standard output (a file, or a pipe) is built whole before
    // it is written: 6 000 bytes more an iteration; one to /dev/null, even
    // where standard output is /dev/null too, is not.
    let log = format!("{path_text}.log");
    let json = format!("{path_text}.json");
    let svg = format!("{path_text}.svg");
    for (flag, file, stdout, per_iteration, total) in [
        ("--trace", &json[..], "null", "2500", "45.47 TiB"),
        ("--timeline", &svg[..], "null", "3500", "63.66 TiB"),
        ("--trace", "/dev/stdout", "file", "8500", "154.61 TiB"),
        ("--trace", "/dev/stdout", "pipe", "8500", "154.61 TiB"),
        ("--trace", "/dev/null", "null", "2500", "45.47 TiB"),
    ] {
        let to_stdout = file == "/dev/stdout";
        let file = file.to_owned();
        let stdout = match stdout {
            "file" => Stdio::from(File::create(&log).unwrap()),
            "pipe" => Stdio::piped(),
            _ => Stdio::null(),
        };
        let mut run = spyre_command(&huge)
            .args([flag, file.as_str()])
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .expect("the spyre binary runs");
        // A run that started anyway would take years: stopped at the bound.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while run.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = run.kill();
                let _ = run.wait();
                // What the run wrote to: never /dev/stdout or /dev/null.
                if !file.starts_with("/dev/") {
                    let _ = std::fs::remove_file(&file);
                }
                let _ = std::fs::remove_file(&log);
                panic!("{flag}: the run started");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let output = run.wait_with_output().unwrap();
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{flag}: {err}");
        for needle in [
            &format!(
                "tracing 20000000000 iterations (the trace is kept in memory until the run ends: {total} at about {per_iteration} bytes an iteration; fewer --iterations, or no --trace and --timeline, need less)"
            )[..],
            "of host buffers and the trace",
            "of host memory, but the process has",
        ] {
            assert!(err.contains(needle), "{needle:?} not in: {err}");
        }
        if to_stdout {
            assert_eq!(output.stdout, b"", "nothing was written");
            if let Ok(written) = std::fs::read(&log) {
                assert_eq!(written, b"", "nothing was written");
                std::fs::remove_file(&log).unwrap();
            }
        } else if file != "/dev/null" {
            assert!(!std::path::Path::new(&file).exists(), "{file} was created");
        }
    }
}

/// A misspelled `SPYRE_MOCK_*` variable, and one only the C library reads,
/// are warned about on the software device in process (before: ignored
/// silently, `info` listing the misspelled one beside the default it left).
#[test]
fn ignored_software_device_variables_are_warned() {
    let output = spyre(
        &["info"],
        &[
            ("SPYRE_MOCK_LATENCY_US", "100000"),
            ("SPYRE_MOCK_FAIL_LAUNCH", "1"),
            ("SPYRE_MOCK_EMPTY", ""),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let errors = stderr(&output);
    for needle in [
        "SPYRE_MOCK_LATENCY_US is not a variable of the software device: it is ignored (its variables in process are SPYRE_MOCK_DEVICES,",
        "SPYRE_MOCK_FAIL_LAUNCH is read only by the software device's C library",
    ] {
        assert_eq!(
            errors.matches(needle).count(),
            1,
            "{needle:?} once in: {errors}"
        );
    }
    // An empty value is unset.
    assert!(!errors.contains("SPYRE_MOCK_EMPTY"), "{errors}");
    // A start that fails (a bad value) and is tried again warns once.
    let output = spyre(
        &["info"],
        &[("SPYRE_MOCK_ENGINES", "0"), ("SPYRE_MOCK_FAIL_LAUNCH", "1")],
    );
    let errors = stderr(&output);
    assert_eq!(
        errors
            .matches("SPYRE_MOCK_FAIL_LAUNCH is read only")
            .count(),
        1,
        "{errors}"
    );
}

#[test]
fn bad_environment_exits_2_naming_the_value() {
    refused(
        &["run", "--iterations", "1"],
        &[("SPYRE_BACKEND", "gpu")],
        &["SPYRE_BACKEND=\"gpu\""],
    );
    // `info` reports what it can, and points at the error for the backend.
    let output = spyre(&["info"], &[("SPYRE_BACKEND", "gpu")]);
    assert_eq!(output.status.code(), Some(2));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("selected by build and SPYRE_BACKEND: none: SPYRE_BACKEND=\"gpu\" is invalid: expected `mock` or `hardware`)\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "\nerror             starting the Spyre runtime: SPYRE_BACKEND=\"gpu\" is invalid"
        ),
        "{text}"
    );
    refused(
        &["run", "--iterations", "1"],
        &[("LOCAL_RANK", "abc")],
        &["LOCAL_RANK=\"abc\""],
    );
    refused(
        &["run", "--iterations", "1"],
        &[("SPYRE_MOCK_ENGINES", "0")],
        &["SPYRE_MOCK_ENGINES=\"0\""],
    );
    // 2^32 µs would make every operation sleep 71 minutes.
    refused(
        &["run", "--iterations", "1"],
        &[("SPYRE_MOCK_OP_LATENCY_US", "4294967296")],
        &[
            "SPYRE_MOCK_OP_LATENCY_US=\"4294967296\"",
            "at most 1000000 µs",
        ],
    );
    // A region no host can back: refused before the run, not at its first
    // copy. Needed: the region (2^62 bytes), and per thread its one
    // iteration's inputs as numbers and as sent, output and expected
    // result (6 operands of 349 524 bytes) and its 128-byte program, and
    // the software device's copies for the computes its 2 engines run at
    // once (4 operands each): 2^62 + 2 × 2 097 272 + 2 × 1 398 096 bytes.
    refused(
        &["run", "--iterations", "1"],
        &[
            ("SPYRE_MOCK_MEMORY_BYTES", "4611686018427387904"),
            ("SPYRE_MOCK_REGION_BYTES", "4611686018427387904"),
        ],
        &[
            "(6.67 MiB of host buffers, and 4194304 TiB of the software device's memory regions (SPYRE_MOCK_REGION_BYTES), which it backs",
            "needs 4611686018434378640 bytes (4194304.00 TiB) of host memory",
        ],
    );
    refused(
        &["run", "--iterations", "1"],
        &[("SPYRE_HAZARD_TRACKER", "maybe")],
        &["SPYRE_HAZARD_TRACKER=\"maybe\"", "expected a boolean"],
    );
    // An unusable flex library is the environment's fault, like any other
    // variable (a build without the hardware backend says so instead).
    let info = json(&["info", "--json"], &[]);
    let has_hardware = info["compiled_backends"]
        .as_array()
        .expect("compiled_backends")
        .contains(&Value::from("hardware"));
    refused(
        &["run", "--iterations", "1"],
        &[
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", "/nonexistent/libflex.so.1"),
        ],
        &[if has_hardware {
            "FLEX_RUNTIME_LIB=\"/nonexistent/libflex.so.1\" names a library that cannot be used"
        } else {
            "this build has no `hardware` backend"
        }],
    );
}

/// `FLEX_RUNTIME_LIB` set while the software device is chosen is not used,
/// and the run says so on stderr rather than silently running on the
/// software device; without the variable there is no such warning.
#[test]
fn a_flex_library_named_for_a_mock_run_is_reported_unused() {
    let args = SMALL_RUN;
    let warning = "FLEX_RUNTIME_LIB is set, but the software device was chosen";
    let output = spyre(
        &args,
        &[
            ("SPYRE_BACKEND", "mock"),
            ("FLEX_RUNTIME_LIB", "/nonexistent/libflex.so.1"),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains(warning), "{}", stderr(&output));
    let output = spyre(&args, &[("SPYRE_BACKEND", "mock")]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!stderr(&output).contains(warning), "{}", stderr(&output));
}

/// A small run: one thread, two iterations of 4 KiB.
const SMALL_RUN: [&str; 7] = [
    "run",
    "--threads",
    "1",
    "--iterations",
    "2",
    "--size",
    "4KiB",
];

#[test]
fn a_run_names_its_device_and_what_chose_it() {
    let args = [&SMALL_RUN[..], &["--json"]].concat();
    let report = json(&args, &[]);
    assert_eq!(report["device"], 0);
    assert_eq!(report["device_source"], "default");
    let report = json(&args, &[("SPYRE_MOCK_DEVICES", "2"), ("LOCAL_RANK", "1")]);
    assert_eq!(report["device"], 1);
    assert_eq!(report["device_source"], "LOCAL_RANK");
    let output = spyre(
        &SMALL_RUN,
        &[("SPYRE_MOCK_DEVICES", "2"), ("LOCAL_RANK", "1")],
    );
    assert!(
        stdout(&output).contains("on the mock backend, device 1 (LOCAL_RANK)"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let output = spyre(
        &[
            "run",
            "--threads",
            "1",
            "--iterations",
            "1",
            "--size",
            "4KiB",
        ],
        &[("RUST_LOG", "info")],
    );
    assert_eq!(output.status.code(), Some(0));
    let log = stderr(&output);
    assert!(log.contains("Spyre runtime started"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a piped log: {log:?}"
    );
}

#[test]
fn a_closed_stderr_loses_the_log_not_the_run() {
    // The log's reader goes away before the run logs anything: every log
    // line meets a closed pipe (EPIPE), and the run must still finish and
    // report on stdout.
    let mut command = spyre_command(&["run", "--threads", "1", "--iterations", "4", "--json"]);
    command
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("the spyre binary runs");
    drop(child.stderr.take());
    let output = child.wait_with_output().expect("spyre finishes");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let report: Value = serde_json::from_str(&stdout(&output)).expect("stdout is JSON");
    assert_eq!(report["iterations_verified"], 4, "{report}");
}

/// A trace that cannot be written (a full disk) fails the run with exit 1
/// after its report: what the run did is not lost (before, nothing was
/// printed). With `--json` the one line is the error's, as for any failure,
/// with the run's report beside it (before, the report was lost).
#[cfg(target_os = "linux")]
#[test]
fn a_trace_that_cannot_be_written_fails_after_the_report() {
    let args = [
        "run",
        "--threads",
        "1",
        "--iterations",
        "2",
        "--trace",
        "/dev/full",
    ];
    let output = spyre(&args, &[]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let text = stdout(&output);
    assert!(text.contains("\nverified     2 / 2 iterations"), "{text}");
    assert!(!text.contains("\ntrace "), "no trace is reported: {text}");
    assert!(
        stderr(&output).starts_with("error: cannot write the trace to /dev/full: "),
        "{}",
        stderr(&output)
    );
    let output = spyre(&[&args[..], &["--json"]].concat(), &[]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let error: Value = serde_json::from_str(&stdout(&output)).expect("one JSON line");
    assert_eq!(error["exit_code"], 1, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .starts_with("cannot write the trace to /dev/full: "),
        "{error}"
    );
    assert_eq!(error["report"]["iterations_verified"], 2, "{error}");
}

/// Help and the version written to a full disk fail as a report would
/// (exit 1, the reason on stderr); to a closed pipe they do not.
#[cfg(target_os = "linux")]
#[test]
fn help_and_version_that_cannot_be_written_fail() {
    for flag in ["--help", "--version"] {
        let full = File::options().write(true).open("/dev/full").unwrap();
        let output = spyre_command(&[flag])
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .expect("the spyre binary runs");
        assert_eq!(output.status.code(), Some(1), "{flag}: {output:?}");
        assert!(
            stderr(&output).starts_with("error: cannot write to stdout: "),
            "{flag}: {}",
            stderr(&output)
        );

        // A pipe whose reader is gone before the child starts: every write
        // meets EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = spyre_command(&[flag])
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("the spyre binary runs");
        assert_eq!(output.status.code(), Some(0), "{flag}: {output:?}");
    }
}

/// The process ids of `parent`'s children, from `/proc`.
#[cfg(target_os = "linux")]
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // The parent's id is the second field after the command, which
            // is in parentheses and may hold spaces.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// Whether process `pid` has ended: gone, or a zombie its new parent has
/// not reaped yet.
#[cfg(target_os = "linux")]
fn has_ended(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

/// `spyre bench` killed while a pipeline child runs does not leave the
/// child running: the child ends when its standard input, a pipe the bench
/// holds, closes (before, the child ran on, reparented). Killed with
/// SIGKILL, which nothing can catch; the same holds for any signal.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_bench_does_not_leave_its_child_run_running() {
    use std::time::{Duration, Instant};
    let mut command = spyre_command(&["bench", "--budget-ms", "1", "--sizes", "1"]);
    // 100 ms operations: the serialized child's 200 take 20 s, far past
    // the 3 s given below for it to stop.
    command
        .env("SPYRE_MOCK_OP_LATENCY_US", "100000")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut bench = command.spawn().expect("the spyre binary runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    let child = loop {
        if let Some(&child) = children_of(bench.id()).first() {
            break child;
        }
        if Instant::now() > deadline || bench.try_wait().unwrap().is_some() {
            let _ = bench.kill();
            panic!("no child run started");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    bench.kill().unwrap();
    bench.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !has_ended(child) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(has_ended(child), "the child run {child} was left running");
}

/// A run ended by SIGTERM or SIGINT while it writes its trace removes the
/// new file it was writing beside the trace (before, it stayed, named
/// `.NAME.XXXXXX.partial`, up to about 120 MB here), and ends by the
/// signal; the trace file it created stays empty. A run that started with
/// SIGINT ignored (a shell's background job) keeps it ignored.
#[cfg(target_os = "linux")]
#[test]
fn a_run_ended_by_a_signal_while_writing_its_trace_leaves_no_partial_file() {
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};
    // 2 × 20 000 iterations make a trace of about 120 MB: its write takes long
    // enough to be caught in the act.
    let dir = scratch_dir("signal");
    let partials = || {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".partial"))
            .collect::<Vec<_>>()
    };
    for (signal, name, ignored) in [(15, "TERM", false), (2, "INT", false), (2, "INT", true)] {
        let trace = dir.join(format!("trace-{name}-{ignored}.json"));
        let args = [
            "run",
            "--threads",
            "2",
            "--iterations",
            "20000",
            "--size",
            "12",
        ];
        let mut command = spyre_command(&args);
        command.arg("--trace").arg(&trace);
        if ignored {
            // Started as a shell starts a background job: SIGINT ignored.
            let program = command.get_program().to_owned();
            let args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
            command = Command::new("sh");
            command
                .args(["-c", "trap '' INT; exec \"$0\" \"$@\""])
                .arg(program)
                .args(args);
            clear_environment(&mut command);
            command.env("SPYRE_BACKEND", "mock");
        }
        let mut run = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the spyre binary runs");
        let deadline = Instant::now() + Duration::from_secs(120);
        while partials().is_empty() {
            assert!(
                run.try_wait().unwrap().is_none(),
                "the run ended before its trace was written"
            );
            assert!(Instant::now() < deadline, "no trace was being written");
            std::thread::sleep(Duration::from_millis(2));
        }
        // The shell's own `kill`: no separate program needed.
        let sent = Command::new("sh")
            .args(["-c", &format!("kill -{name} {}", run.id())])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = run.wait().unwrap();
        assert_eq!(partials(), Vec::<String>::new(), "SIG{name}");
        let written = std::fs::metadata(&trace).unwrap().len();
        if ignored {
            assert!(status.success(), "SIG{name} ignored: {status:?}");
            assert!(written > 0, "the trace was written whole");
        } else {
            assert_eq!(status.signal(), Some(signal), "SIG{name}: {status:?}");
            assert_eq!(written, 0, "SIG{name}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn info_json_describes_the_process() {
    let info = json(&["info", "--json"], &[]);
    assert_eq!(info["backend"], "mock");
    assert_eq!(info["events"], "device-side waits, timing");
    assert_eq!(
        info["device_memory"],
        "1073741824 bytes (1 GiB), 1073741824 free"
    );
    let host_waits = json(&["info", "--json"], &[("SPYRE_MOCK_DEVICE_SIDE_WAIT", "0")]);
    assert_eq!(host_waits["events"], "host-blocking waits, timing");
    let untimed = json(&["info", "--json"], &[("SPYRE_MOCK_EVENT_TIMING", "0")]);
    assert_eq!(untimed["events"], "device-side waits, no timing");
    assert_eq!(info["selected_backend"], "mock");
    assert!(
        info["compiled_backends"]
            .as_array()
            .expect("compiled_backends")
            .contains(&Value::from("mock"))
    );
    assert_eq!(info["device_count"], 1);
    assert_eq!(info["device"], 0);
    assert_eq!(info["device_source"], "default");
    assert_eq!(info["pool"]["default_stream"], 0);
    assert_eq!(info["pool"]["normal"], serde_json::json!([1, 32]));
    assert_eq!(info["pool"]["high"], serde_json::json!([33, 64]));
    assert_eq!(info["pool"]["host_compute"], serde_json::json!([65, 68]));
    assert_eq!(info["pool"]["host_compute_streams"], 4);
    assert_eq!(info["hazard_tracking"], false);
    assert_eq!(info["backend_details"]["memory_bytes"], "1073741824");
    assert_eq!(info["backend_details"]["check_reuse"], "false");
    assert_eq!(info["backend_details"]["device_side_wait"], "true");
    assert_eq!(info["environment"]["SPYRE_BACKEND"], "mock");
    assert_eq!(info["environment"]["LOCAL_RANK"], Value::Null);
    assert_eq!(info["environment"]["FLEX_RUNTIME_LIB"], Value::Null);
    assert_eq!(info["error"], Value::Null);
}

#[test]
fn info_follows_the_environment() {
    let info = json(
        &["info", "--json"],
        &[
            ("LOCAL_RANK", "1"),
            ("SPYRE_MOCK_DEVICES", "2"),
            ("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", "2"),
            ("SPYRE_HAZARD_TRACKER", "1"),
            ("SPYRE_MOCK_MEMORY_BYTES", "536870912"),
            ("SPYRE_MOCK_CHECK_REUSE", "yes"),
            ("SPYRE_MOCK_DEVICE_SIDE_WAIT", "0"),
            ("SPYRE_LIBRARY_KNOB", "7"),
        ],
    );
    // A SPYRE_* variable this build does not read is listed too (a flex
    // library may read it; before, a build without the software device
    // hid its SPYRE_MOCK_* variables).
    assert_eq!(info["environment"]["SPYRE_LIBRARY_KNOB"], "7");
    assert_eq!(info["backend_details"]["check_reuse"], "true");
    assert_eq!(info["backend_details"]["device_side_wait"], "false");
    assert_eq!(info["device_count"], 2);
    assert_eq!(info["device"], 1);
    assert_eq!(info["device_source"], "LOCAL_RANK");
    assert_eq!(info["pool"]["host_compute"], serde_json::json!([65, 66]));
    assert_eq!(info["pool"]["host_compute_streams"], 2);
    assert_eq!(info["hazard_tracking"], true);
    assert_eq!(info["backend_details"]["memory_bytes"], "536870912");
    assert_eq!(info["environment"]["LOCAL_RANK"], "1");
    assert_eq!(info["environment"]["SPYRE_MOCK_DEVICES"], "2");
}

#[test]
fn info_text_lists_every_variable() {
    let one = spyre(&["info"], &[("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", "1")]);
    assert!(stdout(&one).contains("host compute    65–65 (1 stream)\n"));
    let output = spyre(&["info"], &[("SPYRE_HAZARD_TRACKER", "1")]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    for needle in [
        "backend           mock",
        "this process      device 0",
        "normal          1–32",
        "high            33–64",
        "host compute    65–68 (4 streams)",
        "hazard tracking   on",
        "  engines         2\n",
        "  device_side_wait true\n",
        "events            device-side waits, timing",
        "device memory     1073741824 bytes (1 GiB), 1073741824 free",
        "SPYRE_HAZARD_TRACKER                 = \"1\"",
        "FLEX_RUNTIME_LIB                     (unset)",
        "SPYRE_MOCK_COPY_BANDWIDTH",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
}

#[test]
fn info_still_reports_when_the_runtime_cannot_start() {
    let output = spyre(
        &["info", "--json"],
        &[("LOCAL_RANK", "5"), ("SPYRE_MOCK_DEVICES", "4")],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let info: Value = serde_json::from_str(&stdout(&output)).expect("stdout is JSON");
    assert_eq!(info["environment"]["LOCAL_RANK"], "5");
    assert_eq!(info["backend"], Value::Null);
    // The number of devices to start ranks for (before, null).
    assert_eq!(info["device_count"], 4);
    let error = info["error"].as_str().expect("error is a string");
    assert!(error.contains("logical_device_id=5"), "{error}");
    assert!(stderr(&output).contains("logical_device_id=5"));
}

#[test]
fn info_text_says_no_device_was_chosen_when_the_runtime_cannot_start() {
    let output = spyre(&["info"], &[("LOCAL_RANK", "5")]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains("this process      no device (the runtime did not start: see error)"),
        "{text}"
    );
    assert!(!text.contains("(from unknown)"), "{text}");
    assert!(text.contains("logical_device_id=5"), "{text}");
}

#[test]
fn json_failures_print_one_json_line_naming_the_error() {
    // A bad environment: exit 2 (the invocation is wrong).
    for args in [
        &["run", "--iterations", "1", "--json"][..],
        &["bench", "--budget-ms", "1", "--json"][..],
    ] {
        let output = spyre(args, &[("LOCAL_RANK", "abc")]);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        let report: Value = serde_json::from_str(&stdout(&output)).expect("stdout is JSON");
        assert_eq!(report["exit_code"], 2, "spyre {args:?}: {report}");
        let error = report["error"].as_str().expect("error is a string");
        assert!(error.contains("LOCAL_RANK=\"abc\""), "{error}");
        assert!(
            stderr(&output).contains(error),
            "stderr has the same message"
        );
    }
    // Arguments clap refuses get the same line on stdout.
    let output = spyre(&["run", "--json", "--threads", "0"], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let report: Value = serde_json::from_str(&stdout(&output)).expect("stdout is JSON");
    assert_eq!(report["exit_code"], 2, "{report}");
    let error = report["error"].as_str().expect("error is a string");
    assert!(
        error.contains("'0'") && error.contains("--threads"),
        "{error}"
    );
    assert!(!error.starts_with("error:"), "{error}");
    // With what was expected, as on stderr (before, only the first line).
    let output = spyre(&["bench", "--json", "--pipeline", "maybe"], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let report: Value = serde_json::from_str(&stdout(&output)).expect("stdout is JSON");
    assert_eq!(
        report["error"],
        "invalid value 'maybe' for '--pipeline <BOOL>' [possible values: true, 1, on, yes, false, 0, off, no]"
    );
    // Without --json, stdout stays empty.
    let output = spyre(&["run", "--iterations", "1"], &[("LOCAL_RANK", "abc")]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(stdout(&output), "");
}

/// A run too slow for three decimals of GB/s (12-byte operands, 10 ms an
/// operation) still shows its throughput: 8 iterations move 1 120 bytes
/// (the programs among them) in about 0.2 s, about 5e-6 GB/s (before:
/// "0.000 GB/s").
#[test]
fn a_slow_runs_throughput_is_not_shown_as_zero() {
    let output = spyre(
        &["run", "--size", "12", "--iterations", "4", "--threads", "2"],
        &[("SPYRE_MOCK_OP_LATENCY_US", "10000")],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let line = text
        .lines()
        .find(|line| line.starts_with("throughput"))
        .expect("a throughput line");
    let figure: f64 = line
        .trim_start_matches("throughput")
        .trim()
        .trim_end_matches("GB/s")
        .trim()
        .parse()
        .expect("a number");
    assert!(figure > 0.0 && figure < 1e-3, "{line}");
}

/// A pipeline child killed part-way: the bench fails (exit 1), naming the
/// signal, and keeps the measurements made before it, in the error's JSON
/// line ("report") with --json and before the error without. Before, they
/// were lost with the error.
#[cfg(target_os = "linux")]
#[test]
fn a_bench_whose_pipeline_child_is_killed_keeps_what_it_measured() {
    for json in [true, false] {
        let mut args = vec!["bench", "--budget-ms", "1", "--sizes", "4KiB"];
        if json {
            args.push("--json");
        }
        let bench = spyre_command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the spyre binary runs");
        kill_first_child_of(bench.id());
        let output = bench.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        // The first child run is the serialized one; the error names the
        // measurement it ended.
        let ended = "measuring pipeline: pipelined against serialized, in child processes: the pipeline measurement's child run (`spyre run --mode serialized`) ended without a report (signal: 9 (SIGKILL))";
        assert!(stderr(&output).contains(ended), "{}", stderr(&output));
        let names = [
            "handle resolution",
            "pool assignment",
            "empty op round trip",
            "H2D bandwidth",
            "D2H bandwidth",
        ];
        if json {
            let failure: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
            assert_eq!(failure["exit_code"], 1);
            assert!(failure["error"].as_str().unwrap().contains(ended));
            let measured: Vec<_> = failure["report"]["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|result| result["name"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(measured, names);
        } else {
            let text = stdout(&output);
            assert!(text.starts_with("spyre bench"), "{text}");
            for name in names {
                assert!(text.contains(name), "{name} in {text}");
            }
            assert!(!text.contains("pipeline"), "{text}");
        }
    }
}

/// Kills (`SIGKILL`) the first child process of `parent` once it appears
/// (waiting at most 60 s).
#[cfg(target_os = "linux")]
fn kill_first_child_of(parent: u32) {
    let children = format!("/proc/{parent}/task/{parent}/children");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let listed = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(child) = listed.split_whitespace().next() {
            let killed = Command::new("kill").args(["-KILL", child]).status();
            assert!(killed.unwrap().success());
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("process {parent} started no child in 60 s");
}

#[test]
fn bench_json_has_every_measurement() {
    let report = json(
        &[
            "bench",
            "--json",
            "--budget-ms",
            "20",
            "--sizes",
            "4KiB,64KiB",
        ],
        &[],
    );
    assert_eq!(report["backend"], "mock");
    assert_eq!(report["device"], 0);
    assert_eq!(report["device_source"], "default");
    assert_eq!(report["backend_details"]["engines"], "2");
    // The timing model the children ran with: every operation 1 ms, an
    // operand (349 524 bytes) copied in 1 ms more, four engines.
    let set = |value: &str| serde_json::json!({"value": value, "from": "spyre bench"});
    assert_eq!(
        report["pipeline_timing_model"],
        serde_json::json!({
            "SPYRE_MOCK_COPY_BANDWIDTH": set("349524000"),
            "SPYRE_MOCK_ENGINES": set("4"),
            "SPYRE_MOCK_OP_LATENCY_US": set("1000"),
        })
    );
    let results = report["results"].as_array().expect("results");
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "handle resolution",
            "pool assignment",
            "empty op round trip",
            "H2D bandwidth",
            "D2H bandwidth",
            "H2D bandwidth",
            "D2H bandwidth",
            "pipeline: serialized",
            "pipeline: pipelined",
            "pipeline: speedup",
            "pipeline: overlap",
        ]
    );
    for result in results {
        assert!(result["value"].as_f64().expect("value") > 0.0, "{result}");
        assert!(result["operations"].as_u64().expect("operations") > 0);
    }
    assert_eq!(results[0]["unit"], "ns/op");
    assert_eq!(results[2]["unit"], "us/op");
    assert_eq!(results[3]["unit"], "GB/s");
    assert_eq!(results[5]["size_bytes"], 65536);
    // The pipeline's rows are medians of its child runs (the speedup, their
    // ratio); the rest, means.
    let statistics: Vec<&str> = results
        .iter()
        .map(|r| r["statistic"].as_str().expect("statistic"))
        .collect();
    assert_eq!(
        statistics,
        [
            &["mean"; 7][..],
            &["median", "median", "ratio_of_medians", "median"]
        ]
        .concat()
    );
}

#[test]
fn version_and_help() {
    let output = spyre(&["--version"], &[]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        stdout(&output).trim(),
        format!("spyre {}", env!("CARGO_PKG_VERSION"))
    );
    let output = spyre(&["run", "--help"], &[]);
    assert_eq!(output.status.code(), Some(0));
    let text = stdout(&output);
    for flag in [
        "--threads",
        "--iterations",
        "--size",
        "--kernel",
        "--in-flight",
        "--seed",
        "--mode",
        "--json",
    ] {
        assert!(text.contains(flag), "{flag} not in\n{text}");
    }
}

#[test]
fn bench_shows_each_measurement_and_what_is_left_on_a_terminal() {
    // `script` (util-linux, essential on Debian) gives the child a terminal.
    let binary = env!("CARGO_BIN_EXE_spyre");
    let mut command = Command::new("script");
    command.args([
        "-qec",
        &format!("{binary} bench --budget-ms 100 --sizes 4KiB --pipeline false"),
        "/dev/null",
    ]);
    clear_environment(&mut command);
    let output = command
        .env("SPYRE_BACKEND", "mock")
        .output()
        .expect("script runs");
    assert_eq!(output.status.code(), Some(0));
    let screen = stdout(&output);
    // 3 + 2 × 1 size = 5 measurements of 100 ms each.
    for line in [
        "[1/5] handle resolution (about 0.5 s left)",
        "[2/5] pool assignment (about 0.4 s left)",
        "[3/5] empty op round trip (about 0.3 s left)",
        "[4/5] H2D bandwidth, 4 KiB (about 0.2 s left)",
        "[5/5] D2H bandwidth, 4 KiB (about 0.1 s left)",
    ] {
        assert!(
            screen.contains(line),
            "{line:?} not on the terminal:\n{screen}"
        );
    }
    // Through a pipe there is no bar.
    let piped = spyre(
        &[
            "bench",
            "--budget-ms",
            "1",
            "--sizes",
            "4KiB",
            "--pipeline",
            "false",
        ],
        &[],
    );
    assert!(!stderr(&piped).contains("[1/5]"), "{}", stderr(&piped));
}

#[test]
fn a_matmul_run_of_more_than_a_minute_says_so_before_it_starts() {
    use std::io::{BufRead, BufReader};
    // n = floor(sqrt(64 MiB / 12)) = 2364: 2 × 2364³ ≈ 2.6e10 multiply-adds.
    let mut child = Command::new(env!("CARGO_BIN_EXE_spyre"))
        .args([
            "run",
            "--kernel",
            "matmul",
            "--size",
            "64MiB",
            "--threads",
            "1",
            "--iterations",
            "1",
            "--in-flight",
            "1",
        ])
        .env("SPYRE_BACKEND", "mock")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the spyre binary runs");
    // Read the first line on a thread, so that a run that never says so
    // fails the test after a bounded wait instead of running for minutes.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = String::new();
        let _ = BufReader::new(stderr).read_line(&mut first);
        let _ = tx.send(first);
    });
    let first = rx.recv_timeout(std::time::Duration::from_secs(60));
    let _ = child.kill();
    let _ = child.wait();
    let first = first.expect("a warning within 60 s, before the run");
    assert!(
        first.contains("matmul 2364×2364 × 1 iterations is 2.64e10 multiply-adds"),
        "{first}"
    );
    assert!(first.contains("Use a smaller --size"), "{first}");
}

#[test]
fn the_memory_check_counts_only_iterations_that_can_be_in_flight() {
    // 4 MiB in one region holds 11 blocks of 349 696 bytes: 3 iterations.
    // --in-flight 4 with only 2 iterations keeps at most 2 in flight: it runs.
    let memory = [
        ("SPYRE_MOCK_MEMORY_BYTES", "4194304"),
        ("SPYRE_MOCK_REGION_BYTES", "4194304"),
    ];
    let report = json(
        &[
            "run",
            "--json",
            "--threads",
            "1",
            "--iterations",
            "2",
            "--in-flight",
            "4",
        ],
        &memory,
    );
    assert_eq!(report["iterations_verified"], 2);
    // A region too small for any operand says so, not "--size of at most 0".
    refused(
        &["run", "--size", "12", "--threads", "1", "--iterations", "1"],
        &[
            ("SPYRE_MOCK_MEMORY_BYTES", "1024"),
            ("SPYRE_MOCK_REGION_BYTES", "128"),
        ],
        &[
            "each in a block of 512 bytes",
            "no operand fits a region of 128 bytes",
            "SPYRE_MOCK_REGION_BYTES of at least 512",
        ],
    );
}

#[test]
fn an_empty_rust_log_is_unset_and_a_bad_one_is_named() {
    let args = [
        "run",
        "--threads",
        "1",
        "--iterations",
        "1",
        "--size",
        "4KiB",
    ];
    let capped = [("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", "9")];
    for rust_log in [None, Some("")] {
        let mut env = capped.to_vec();
        env.extend(rust_log.map(|v| ("RUST_LOG", v)));
        let output = spyre(&args, &env);
        assert_eq!(output.status.code(), Some(0));
        assert!(
            stderr(&output).contains("capping host-compute streams at 8"),
            "RUST_LOG={rust_log:?}: {}",
            stderr(&output)
        );
    }
    let output = spyre(&args, &[("RUST_LOG", "a=b=c")]);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        stderr(&output).contains("RUST_LOG=\"a=b=c\" is not a log filter"),
        "{}",
        stderr(&output)
    );
    // Not Unicode (a lone 0xff byte): warned about too, not taken as unset.
    let output = spyre_command(&args)
        .env(
            "RUST_LOG",
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"debug\xff"),
        )
        .output()
        .expect("the spyre binary runs");
    assert_eq!(output.status.code(), Some(0));
    assert!(
        stderr(&output).contains("RUST_LOG=\"debug\\xFF\" is not Unicode"),
        "{}",
        stderr(&output)
    );
}

/// On a device that cannot time events, the pipelined mode (which times
/// its stages with them) is a usage error naming the modes that work, and
/// those run.
#[test]
fn a_device_without_event_timing_refuses_only_the_pipelined_mode() {
    let untimed = [("SPYRE_MOCK_EVENT_TIMING", "0")];
    let args = SMALL_RUN;
    let output = spyre(&args, &untimed);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "`spyre run --mode pipelined` (the default) times its stages with events, and this runtime cannot time them: use `--mode per-iteration` or `--mode serialized`"
        ),
        "{}",
        stderr(&output)
    );
    let output = spyre(
        &[&args[..], &["--mode", "per-iteration"]].concat(),
        &untimed,
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn a_run_larger_than_host_memory_is_refused_before_it_allocates() {
    // The software device's memory is backed lazily, so 8 TiB of it costs
    // nothing; the host buffers of a 3 TiB run would (about 4 TiB).
    let huge_device = [
        ("SPYRE_MOCK_MEMORY_BYTES", "8796093022208"),
        ("SPYRE_MOCK_REGION_BYTES", "2199023255552"),
    ];
    refused(
        &[
            "run",
            "--size",
            "3TiB",
            "--threads",
            "1",
            "--iterations",
            "1",
            "--in-flight",
            "1",
        ],
        &huge_device,
        &[
            "--size 3298534883328",
            "of host memory, but the process has",
        ],
    );
    // The 2 TiB buffer and the 2 TiB region it is written to.
    refused(
        &["bench", "--sizes", "2TiB", "--budget-ms", "1"],
        &huge_device,
        &[
            "--sizes 2199023255552 (2 TiB of host buffers, and 2 TiB of the software device's memory regions",
            "needs 4398046511104 bytes (4 TiB) of host memory",
        ],
    );
}

#[test]
fn bench_refuses_sizes_and_children_that_cannot_run_before_measuring() {
    // A 1-byte copy is written to a 1 TiB region, which the software device
    // backs with host memory: 8 one-byte buffers (a D2H batch) and the
    // region. Before, the first measurements ran and the copy failed with
    // exit 1.
    refused(
        &[
            "bench",
            "--budget-ms",
            "1",
            "--sizes",
            "1",
            "--pipeline",
            "false",
        ],
        &[
            ("SPYRE_MOCK_MEMORY_BYTES", "1125899906842624"),
            ("SPYRE_MOCK_REGION_BYTES", "1099511627776"),
        ],
        &[
            "--sizes 1 (8 B of host buffers, and 1 TiB of the software device's memory regions (SPYRE_MOCK_REGION_BYTES), which it backs with host memory when they are first written) needs 1099511627784 bytes (1.00 TiB) of host memory",
        ],
    );
    // More than the device holds, after a size that fits.
    refused(
        &["bench", "--budget-ms", "1", "--sizes", "4KiB,2GiB"],
        &[],
        &[
            "--sizes 2147483648 (2 GiB) does not fit in device memory: the device has 1073741824 bytes (1 GiB)",
        ],
    );
    // 1 MiB of device memory cannot hold the pipeline's child runs: said
    // before the measurements, not by the first child after them.
    refused(
        &["bench", "--budget-ms", "1", "--sizes", "1"],
        &[("SPYRE_MOCK_MEMORY_BYTES", "1048576")],
        &[
            "the pipeline measurement's child runs (`spyre run --threads 1 --iterations 40 --size 1MiB --mode serialized`) do not fit this device: ",
            "`spyre bench --pipeline false` skips that measurement",
        ],
    );
    // 4 MiB holds 3 iterations of 1 MiB beside their programs (blocks of
    // 349 696 bytes in 128 KiB-capped segments, one each: 11, one lost to
    // the programs): the pipelined child's 2 fit, the serialized child's 4
    // in flight do not. The run's own advice (its --size, --in-flight,
    // --threads) is left out: the children's invocation is fixed.
    refused(
        &["bench", "--budget-ms", "1", "--sizes", "1"],
        &[("SPYRE_MOCK_MEMORY_BYTES", "4194304")],
        &[
            "(`spyre run --threads 1 --iterations 40 --size 1MiB --mode serialized`) do not fit this device: ",
            "at most 3 of them at once beside their programs; `spyre bench --pipeline false` skips that measurement\n",
        ],
    );
    // A 16 MiB copy on regions of 128 KiB spans 128 regions, and an
    // allocation takes at most 64 chunks: refused before the 4 KiB one is
    // measured, naming the smallest region that serves it (16 MiB / 64).
    refused(
        &[
            "bench",
            "--budget-ms",
            "1",
            "--pipeline",
            "false",
            "--sizes",
            "4KiB,16MiB",
        ],
        &[("SPYRE_MOCK_REGION_BYTES", "131072")],
        &[
            "--sizes 16777216 (16 MiB) spans 128 memory regions of the software device, and an allocation takes at most 64: use regions of at least 262144 bytes (SPYRE_MOCK_REGION_BYTES) or a smaller size",
        ],
    );
}

#[test]
fn a_steady_run_makes_no_device_allocation_after_its_warm_up() {
    for mode in ["pipelined", "serialized"] {
        let report = json(
            &["run", "--json", "--iterations", "30", "--mode", mode],
            &[],
        );
        assert_eq!(report["iterations_verified"], 60, "{mode}");
        let memory = &report["memory"];
        assert_eq!(memory["allocated_bytes_at_end"], 0, "{mode}");
        assert_eq!(
            memory["device_allocations_after_warm_up"], 0,
            "{mode}: {memory}"
        );
        // 2 threads, each holding at least one iteration's three operands
        // of 349 696 bytes (1 MiB / 3, rounded to 512) and a program block.
        let peak = memory["peak_allocated_bytes"].as_u64().unwrap();
        assert!(peak >= 2 * (3 * 349_696 + 512), "{mode}: {memory}");
        assert!(memory["device_allocations"].as_u64().unwrap() >= 1);
    }
}

#[test]
fn a_run_no_longer_than_its_window_has_no_steady_state() {
    // 3 iterations with 4 in flight: all allocate before any is checked.
    let report = json(
        &[
            "run",
            "--json",
            "--iterations",
            "3",
            "--mode",
            "per-iteration",
        ],
        &[],
    );
    assert_eq!(report["iterations_verified"], 6);
    assert!(
        report["memory"]["device_allocations_after_warm_up"].is_null(),
        "{}",
        report["memory"]
    );
}

#[test]
fn a_trace_holds_every_launched_operation_once_on_its_streams_track() {
    let path = std::env::temp_dir().join(format!("spyre-trace-{}.json", std::process::id()));
    let path_text = path.to_str().unwrap().to_owned();
    let report = json(
        &["run", "--json", "--iterations", "6", "--trace", &path_text],
        &[],
    );
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let events = trace["traceEvents"].as_array().unwrap();
    // The operations' slices; the arrows' ends are zero-length slices of
    // their own category.
    let slices: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "flow")
        .collect();
    // Every launch of the report is a slice: 2 threads × 6 iterations × 5
    // (3 H2D, a compute, a D2H), each once.
    let launches = slices
        .iter()
        .filter(|e| ["H2D", "D2H", "compute"].contains(&e["cat"].as_str().unwrap()))
        .count() as u64;
    assert_eq!(launches, u64_of(&report, "operations"));
    assert_eq!(launches, 2 * 6 * 5);
    for (cat, count) in [("H2D", 36), ("compute", 12), ("D2H", 12)] {
        assert_eq!(
            slices.iter().filter(|e| e["cat"] == cat).count(),
            count,
            "{cat}"
        );
    }
    for slice in &slices {
        let (ts, dur) = (
            slice["ts"].as_f64().unwrap(),
            slice["dur"].as_f64().unwrap(),
        );
        assert!(ts >= 0.0 && dur >= 0.0, "{slice}");
        assert!(
            slice["args"]["enqueued_us"].as_f64().unwrap() <= ts + 1e-6,
            "{slice}"
        );
    }
    // One named track per stream used, and the pipeline's waits as arrows.
    let named: std::collections::BTreeSet<i64> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["tid"].as_i64().unwrap())
        .collect();
    let used: std::collections::BTreeSet<i64> =
        slices.iter().map(|e| e["tid"].as_i64().unwrap()).collect();
    assert_eq!(named, used);
    // Each launch on its stream's track: each iteration takes 3 new pool
    // streams, and its priority alternates, so 2 × 6 × 3 = 36 takes, 18 of
    // each pool's 32 streams, give every stream one role: copy-in (two
    // H2D), compute (the descriptor's H2D and the compute) or copy-out
    // (a D2H), 12 of each; and each track holds the launches the report
    // counts for its stream.
    let mut roles: std::collections::BTreeMap<i64, Vec<&str>> = Default::default();
    for slice in &slices {
        let cat = slice["cat"].as_str().unwrap();
        if ["H2D", "D2H", "compute"].contains(&cat) {
            roles
                .entry(slice["tid"].as_i64().unwrap())
                .or_default()
                .push(cat);
        }
    }
    let mut patterns: std::collections::BTreeMap<Vec<&str>, usize> = Default::default();
    for cats in roles.values() {
        let mut cats = cats.clone();
        cats.sort_unstable();
        *patterns.entry(cats).or_default() += 1;
    }
    assert_eq!(
        patterns,
        [
            (vec!["D2H"], 12),
            (vec!["H2D", "H2D"], 12),
            (vec!["H2D", "compute"], 12),
        ]
        .into_iter()
        .collect()
    );
    let counted: std::collections::BTreeMap<i64, usize> = report["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_i64().unwrap(),
                s["operations"].as_u64().unwrap() as usize,
            )
        })
        .collect();
    let traced: std::collections::BTreeMap<i64, usize> =
        roles.iter().map(|(&tid, cats)| (tid, cats.len())).collect();
    assert_eq!(traced, counted);
    let flow_out: std::collections::BTreeSet<u64> = slices
        .iter()
        .filter(|e| e["flow_out"] == true)
        .map(|e| e["bind_id"].as_u64().unwrap())
        .collect();
    let flow_in: Vec<u64> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "flow" && e["flow_in"] == true)
        .map(|e| e["bind_id"].as_u64().unwrap())
        .collect();
    assert!(!flow_in.is_empty(), "the pipeline's waits are arrows");
    assert!(
        flow_in.iter().all(|id| flow_out.contains(id)),
        "every arrow comes from a record"
    );
    // One process, the run's own (its id, never 0).
    let pid = &events[0]["pid"];
    assert!(pid.as_u64().is_some_and(|pid| pid > 0), "{pid}");
    assert!(events.iter().all(|e| &e["pid"] == pid));
    assert_eq!(
        report["trace"]["operations"].as_u64().unwrap() as usize,
        slices.len()
    );
}

#[test]
fn every_arrow_of_a_trace_ends_after_its_record_starts() {
    // With every operation taking 2 ms, a compute stage reaches its wait
    // while the copy it waits for still runs: the wait starts before the
    // record does. Perfetto reads a trace's events in time order and drops
    // an arrow whose end it reads before its start, so each arrow ends at
    // the wait's finish, on a zero-length slice right after the wait's.
    let path = std::env::temp_dir().join(format!("spyre-arrows-{}.json", std::process::id()));
    let path_text = path.to_str().unwrap().to_owned();
    json(
        &[
            "run",
            "--json",
            "--threads",
            "1",
            "--iterations",
            "4",
            "--trace",
            &path_text,
        ],
        &[("SPYRE_MOCK_OP_LATENCY_US", "2000")],
    );
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let events = trace["traceEvents"].as_array().unwrap();
    let ts = |e: &Value| e["ts"].as_f64().unwrap();
    let starts: std::collections::BTreeMap<u64, (f64, usize)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["flow_out"] == true)
        .map(|(index, e)| (e["bind_id"].as_u64().unwrap(), (ts(e), index)))
        .collect();
    let mut arrows = 0;
    let mut waits_before_their_record = 0;
    for (index, end) in events.iter().enumerate() {
        if end["flow_in"] != true {
            continue;
        }
        arrows += 1;
        let (start, start_index) = starts[&end["bind_id"].as_u64().unwrap()];
        assert!(
            ts(end) > start || (ts(end) == start && index > start_index),
            "an arrow ends before its record starts: {end}"
        );
        let wait = &events[index - 1];
        assert_eq!(
            (wait["cat"].as_str(), &wait["tid"], end["dur"].as_f64()),
            (Some("event wait"), &end["tid"], Some(0.0)),
            "{end} follows its wait"
        );
        // Within a nanosecond: times are on the host's clock, far from 0,
        // where an `f64` step of a µs is some picoseconds.
        assert!((ts(wait) + wait["dur"].as_f64().unwrap() - ts(end)).abs() < 1e-3);
        if ts(wait) < start {
            waits_before_their_record += 1;
        }
    }
    // 4 iterations on 2 memory slots, each iteration on 3 new streams (so
    // no wait is on its own stream): compute waits for the copy-in and
    // copy-out for compute (2 waits); from the second round of slots on,
    // copy-in waits for the slot's last compute and compute for its last
    // copy-out too (4): 2 × 2 + 2 × 4.
    assert_eq!(arrows, 12);
    assert!(waits_before_their_record > 0, "the case this test is for");
}

#[test]
fn a_timeline_draws_a_row_per_stream_and_a_bar_per_operation() {
    let path = std::env::temp_dir().join(format!("spyre-timeline-{}.svg", std::process::id()));
    let path_text = path.to_str().unwrap().to_owned();
    let report = json(
        &[
            "run",
            "--json",
            "--threads",
            "1",
            "--iterations",
            "4",
            "--timeline",
            &path_text,
        ],
        &[],
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
    // One row label per stream: 4 pipelined iterations on 3 new pool
    // streams each.
    let rows = svg.matches("stream ").count();
    assert_eq!(rows, 12, "row labels");
    for legend in ["H2D", "compute", "D2H", "event record / wait"] {
        assert!(svg.contains(legend), "legend {legend}");
    }
    assert!(svg.contains("time on the device (ms)"));
    // A bar per launch, in its kind's colour at 0.85 opacity (the legend's
    // swatches are opaque): 4 iterations of 3 H2D (two operands and the
    // kernel descriptor), a compute and a D2H.
    for (kind, fill, bars) in [
        ("H2D", "#1F77B4", 12),
        ("compute", "#FF7F0E", 4),
        ("D2H", "#2CA02C", 4),
    ] {
        assert_eq!(
            svg.matches(&format!(r#"opacity="0.85" fill="{fill}""#))
                .count(),
            bars,
            "{kind} bars"
        );
    }
    assert_eq!(report["timeline"], path_text.as_str());
}

#[test]
fn a_timeline_must_be_svg() {
    refused(
        &["run", "--timeline", "out.png"],
        &[],
        &["--timeline out.png: the timeline is drawn as SVG; give a file name ending in .svg"],
    );
}

#[test]
fn output_files_that_cannot_be_created_are_refused_before_the_run() {
    // Refused up front (exit 2), not after the whole run as a failed one
    // (exit 1, the report lost).
    refused(
        &["run", "--trace", "/nonexistent/dir/trace.json"],
        &[],
        &["--trace /nonexistent/dir/trace.json: cannot create the file: "],
    );
    refused(
        &["run", "--timeline", "/nonexistent/dir/timeline.svg"],
        &[],
        &["--timeline /nonexistent/dir/timeline.svg: cannot create the file: "],
    );
    refused(
        &["run", "--trace", "run.svg", "--timeline", "./run.svg"],
        &[],
        &["--trace and --timeline both name ./run.svg; give each its own file"],
    );
}

/// `--timeline` through a symbolic link to the file `--trace` creates: the
/// paths cannot be told apart before the files exist (the link dangles),
/// so the opened files are compared; before, the timeline replaced the
/// trace and the run said it wrote both.
#[cfg(unix)]
#[test]
fn a_timeline_through_a_dangling_link_to_the_trace_is_refused() {
    let dir = scratch_dir("same-file");
    let trace = dir.join("same.svg");
    let link = dir.join("link.svg");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    let message = format!(
        "--trace and --timeline both name {}; give each its own file",
        link.display()
    );
    refused(
        &[
            "run",
            "--iterations",
            "1",
            "--trace",
            trace.to_str().unwrap(),
            "--timeline",
            link.to_str().unwrap(),
        ],
        &[],
        &[message.as_str()],
    );
    assert!(
        !trace.exists(),
        "the file the refused run created is removed"
    );
    // The other way round: the trace through the link creates the file;
    // the refusal removes that file and leaves the user's link.
    refused(
        &[
            "run",
            "--iterations",
            "1",
            "--trace",
            link.to_str().unwrap(),
            "--timeline",
            trace.to_str().unwrap(),
        ],
        &[],
        &["give each its own file"],
    );
    assert!(
        !trace.exists(),
        "the file the refused run created is removed"
    );
    assert!(
        std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()),
        "the link is left as it was"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One pipe as both outputs is not one file to refuse: each is written in
/// place, one after the other.
#[cfg(target_os = "linux")]
#[test]
fn a_trace_and_a_timeline_may_share_a_pipe() {
    let dir = scratch_dir("one-pipe");
    let timeline = dir.join("stderr.svg");
    std::os::unix::fs::symlink("/dev/stderr", &timeline).unwrap();
    let (mut reader, writer) = std::io::pipe().unwrap();
    let mut command = spyre_command(&[
        "run",
        "--threads",
        "1",
        "--iterations",
        "1",
        "--json",
        "--trace",
        "/dev/stdout",
        "--timeline",
        timeline.to_str().unwrap(),
    ]);
    command.stdout(writer.try_clone().unwrap()).stderr(writer);
    let mut child = command.spawn().expect("the spyre binary runs");
    drop(command);
    let mut output = String::new();
    std::io::Read::read_to_string(&mut reader, &mut output).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0), "{output}");
    assert!(output.contains("\"traceEvents\""), "{output}");
    assert!(output.contains("<svg"), "{output}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_refused_run_leaves_no_output_file_and_a_device_file_takes_the_trace() {
    // Refused by the device-size check, after the arguments were parsed:
    // neither file is created.
    let dir = std::env::temp_dir();
    let trace = dir.join(format!("spyre-refused-{}.json", std::process::id()));
    let timeline = dir.join(format!("spyre-refused-{}.svg", std::process::id()));
    refused(
        &[
            "run",
            "--size",
            "2GiB",
            "--trace",
            trace.to_str().unwrap(),
            "--timeline",
            timeline.to_str().unwrap(),
        ],
        &[],
        &["--size 2147483648"],
    );
    assert!(!trace.exists() && !timeline.exists());
    // `/dev/null` (which cannot be synced) takes a whole run's trace.
    let report = json(
        &["run", "--json", "--iterations", "4", "--trace", "/dev/null"],
        &[],
    );
    assert_eq!(report["trace"]["path"], "/dev/null");
}

/// Ranks of a launch appending their reports and `--trace /dev/stdout` to
/// one log at once keep each trace whole and on lines of its own: the log
/// is a sequence of JSON values, four traces and four `--json` reports.
/// Before, a trace went out in many writes, and four ranks' traces were cut
/// into each other (none parsed).
#[cfg(unix)]
#[test]
fn ranks_appending_traces_to_one_log_keep_each_whole() {
    let dir = scratch_dir("shared-log");
    let log = dir.join("all.log");
    std::fs::write(&log, "").unwrap();
    let children: Vec<_> = (0..4)
        .map(|rank| {
            let stdout = File::options().append(true).open(&log).unwrap();
            let mut command = spyre_command(&[
                "run",
                "--threads",
                "1",
                "--iterations",
                "40",
                "--json",
                "--trace",
                "/dev/stdout",
            ]);
            command
                .env("SPYRE_MOCK_DEVICES", "4")
                .env("LOCAL_RANK", rank.to_string())
                .stdout(stdout);
            command.spawn().expect("the spyre binary runs")
        })
        .collect();
    for mut child in children {
        assert_eq!(child.wait().unwrap().code(), Some(0));
    }
    let contents = std::fs::read_to_string(&log).unwrap();
    let values: Vec<Value> = serde_json::Deserializer::from_str(&contents)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("the log is not a sequence of JSON values: {e}"));
    let traces = values
        .iter()
        .filter(|v| v["traceEvents"].is_array())
        .count();
    let reports = values
        .iter()
        .filter(|v| v["iterations_verified"] == 40)
        .count();
    assert_eq!((values.len(), traces, reports), (8, 4, 4));
    // Each value a line of its own: a trace ends with a newline, so no
    // report begins on a trace's line.
    assert_eq!(contents.lines().count(), 8, "{contents}");
    for line in contents.lines() {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("a line is not one JSON value: {e}"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--trace /dev/stdout` with standard output a pipe (a launcher's, `|
/// tee`): the trace goes through standard output, whole, on a line of its
/// own, and the report begins on the next. Before, it was written in
/// place through a descriptor of its own (opened by the path), in parts
/// and without the newline: the report went on on the trace's line, and
/// the trace did not parse.
#[test]
fn a_trace_to_standard_output_on_a_pipe_ends_its_line_before_the_report() {
    let output = spyre(&[&SMALL_RUN[..], &["--trace", "/dev/stdout"]].concat(), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let (trace, report) = text.split_once('\n').unwrap();
    let trace: Value = serde_json::from_str(trace).expect("the first line is the trace");
    assert!(trace["traceEvents"].is_array());
    assert!(report.starts_with("spyre run: axpy"), "{report}");
}

/// `--trace` to a FIFO that no process reads yet: the run says it waits
/// for a reader, naming the flag and the FIFO, and once one opens it, the
/// trace arrives there whole. Before, the run blocked in the open before
/// any work and said nothing.
#[cfg(unix)]
#[test]
fn a_trace_to_a_fifo_without_a_reader_says_it_waits_for_one() {
    use std::io::{BufRead, BufReader, Read};
    let dir = scratch_dir("fifo");
    let fifo = dir.join("trace");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success(), "mkfifo makes the FIFO");
    let mut child = spyre_command(&[&SMALL_RUN[..], &["--trace", fifo.to_str().unwrap()]].concat())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the spyre binary runs");
    let mut errors = BufReader::new(child.stderr.take().unwrap());
    // Read apart, so that a run that says nothing fails the test instead
    // of blocking it.
    let (said, first_line) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = errors.read_line(&mut line);
        let _ = said.send(line);
        let _ = std::io::copy(&mut errors, &mut std::io::sink());
    });
    let line = first_line.recv_timeout(std::time::Duration::from_secs(60));
    let Ok(line) = line else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the run said nothing while it waited for the FIFO's reader");
    };
    assert_eq!(
        line.trim_end(),
        format!(
            "warning: --trace {0}: a FIFO that no process reads yet; waiting for one to open it (start its reader, `cat {0}` say, or give a file)",
            fifo.display()
        )
    );
    // Read apart too: a run that ends without opening the FIFO fails the
    // test instead of leaving the reader blocked in its open.
    let (read, trace) = std::sync::mpsc::channel();
    let reader_fifo = fifo.clone();
    std::thread::spawn(move || {
        let mut trace = String::new();
        let _ = File::open(&reader_fifo).and_then(|mut file| file.read_to_string(&mut trace));
        let _ = read.send(trace);
    });
    let trace = trace.recv_timeout(std::time::Duration::from_secs(60));
    let status = child.wait().unwrap();
    let Ok(trace) = trace else {
        // The reader's open waits for a writer: this one lets it end.
        drop(File::options().write(true).open(&fifo));
        panic!("the run ended ({status}) without writing the trace to the FIFO");
    };
    assert_eq!(status.code(), Some(0));
    let trace: Value = serde_json::from_str(&trace).expect("the trace is whole");
    assert!(trace["traceEvents"].is_array());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ranks of a launch given one `--trace` path with `{rank}`, `{device}` and
/// `{pid}` in it write a file each, named by their rank, device and
/// process, with no warning; each trace's process is named by all three.
#[test]
fn ranks_given_one_path_with_placeholders_write_a_file_each() {
    let dir = scratch_dir("per-rank");
    let pattern = dir.join("trace-{rank}-{device}-{pid}.json");
    let children: Vec<_> = (0..2)
        .map(|local| {
            let mut command = spyre_command(
                &[
                    &SMALL_RUN[..],
                    &["--json", "--trace", pattern.to_str().unwrap()],
                ]
                .concat(),
            );
            command
                .env("SPYRE_MOCK_DEVICES", "2")
                .env("LOCAL_RANK", local.to_string())
                .env("RANK", (local + 4).to_string())
                .env("WORLD_SIZE", "8")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            command.spawn().expect("the spyre binary runs")
        })
        .collect();
    for (local, child) in children.into_iter().enumerate() {
        let pid = child.id();
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(stderr(&output), "", "no warning with a placeholder");
        let path = dir.join(format!("trace-{}-{local}-{pid}.json", local + 4));
        let report: Value = serde_json::from_str(&stdout(&output)).unwrap();
        assert_eq!(report["trace"]["path"], path.to_str().unwrap());
        let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let process = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "process_name")
            .unwrap()
            .clone();
        assert_eq!(
            process["args"]["name"],
            format!("Spyre device {local} (rank {}, process {pid})", local + 4),
            "named by its rank too"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `{rank}` is the rank of the launcher whose local rank chose the device,
/// else the first rank variable set, else the local rank, else 0; a rank
/// that is not a number is refused before the run, naming the variable.
#[test]
fn the_rank_in_a_path_is_the_launchers() {
    let dir = scratch_dir("rank-path");
    let pattern = dir.join("t-{rank}.json");
    let run = [
        &SMALL_RUN[..],
        &["--json", "--trace", pattern.to_str().unwrap()],
    ]
    .concat();
    let path_of = |env: &[(&str, &str)]| {
        json(&run, env)["trace"]["path"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let named = |rank: &str| dir.join(format!("t-{rank}.json")).display().to_string();
    assert_eq!(path_of(&[]), named("0"), "no launcher");
    assert_eq!(path_of(&[("PMI_RANK", "3")]), named("3"), "the first set");
    assert_eq!(
        path_of(&[
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("RANK", "9"),
        ]),
        named("5"),
        "the launcher that chose the device"
    );
    assert_eq!(
        path_of(&[("SLURM_LOCALID", "0"), ("SLURM_PROCID", "6")]),
        named("6")
    );
    assert_eq!(
        path_of(&[("LOCAL_RANK", "1"), ("SPYRE_MOCK_DEVICES", "2")]),
        named("1"),
        "no rank set: the local rank"
    );
    refused(
        &run,
        &[("LOCAL_RANK", "0"), ("RANK", "first")],
        &["RANK=\"first\" is not a rank", "expected a whole number"],
    );
    assert!(
        !dir.join("t-first.json").exists() && !dir.join("t-{rank}.json").exists(),
        "refused before any file was made"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A launch of more than one process (each launcher's size variable) whose
/// ranks are given one file, or a pipe, is warned, for both flags; a
/// launch of one, a local rank set by hand (no size), and no launcher at
/// all are not.
#[test]
fn ranks_given_one_file_or_a_pipe_are_warned() {
    let dir = scratch_dir("shared-path");
    let (trace, timeline) = (dir.join("shared.json"), dir.join("shared.svg"));
    let run = [
        &SMALL_RUN[..],
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--timeline",
            timeline.to_str().unwrap(),
        ],
    ]
    .concat();
    let one_file = |flag: &str, path: &std::path::Path, variable: &str| {
        format!(
            "warning: {flag} {}: a path without {{rank}}, {{device}} or {{pid}}: if every rank is given it, the last rank to end replaces the others' file (a launch of 2 processes: {variable} is set); put {{rank}} in the name",
            path.display()
        )
    };
    for (local, size) in [
        ("LOCAL_RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("MPI_LOCALRANKID", "PMI_SIZE"),
        ("SLURM_LOCALID", "SLURM_STEP_NUM_TASKS"),
    ] {
        let output = spyre(&run, &[(local, "0"), (size, "2")]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let warned = stderr(&output);
        assert!(
            warned.contains(&one_file("--trace", &trace, local)),
            "{warned}"
        );
        assert!(
            warned.contains(&one_file("--timeline", &timeline, local)),
            "{warned}"
        );
        let output = spyre(&run, &[(local, "0"), (size, "1")]);
        assert_eq!(stderr(&output), "", "a launch of one: {local}");
    }
    for env in [
        &[][..],
        &[("LOCAL_RANK", "0")],
        // A batch script of a job of four tasks is one process.
        &[
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_STEP_NUM_TASKS", "1"),
        ],
    ] {
        let output = spyre(&run, env);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(stderr(&output), "", "{env:?}");
    }
    // Standard output on a pipe (`Command::output` gives it one).
    let output = spyre(
        &[&SMALL_RUN[..], &["--trace", "/dev/stdout"]].concat(),
        &[("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "warning: --trace /dev/stdout: a pipe, which keeps only writes of up to 4 KiB whole"
        ),
        "{}",
        stderr(&output)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The traces of two processes, one run after the other, opened together
/// line up: their times are on the host's monotonic clock, so the second's
/// first slice starts after the first's last ends, and no arrow id of one
/// is an arrow id of the other. Before, each trace's times counted from its
/// own start (both began near 0) and both numbered their arrows 1, 2, ...
#[test]
fn traces_of_two_processes_line_up_and_keep_their_arrows_apart() {
    let dir = scratch_dir("two-traces");
    let traces: Vec<Value> = (0..2)
        .map(|i| {
            let path = dir.join(format!("{i}.json"));
            let run = [&SMALL_RUN[..], &["--trace", path.to_str().unwrap()]].concat();
            let output = spyre(&run, &[]);
            assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
        })
        .collect();
    let slices = |trace: &Value| -> Vec<Value> {
        trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .cloned()
            .collect()
    };
    let (first, second) = (slices(&traces[0]), slices(&traces[1]));
    let end = |e: &Value| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
    let first_end = first.iter().map(end).fold(f64::MIN, f64::max);
    let second_start = second
        .iter()
        .map(|e| e["ts"].as_f64().unwrap())
        .fold(f64::MAX, f64::min);
    assert!(
        first_end < second_start,
        "{first_end} µs, then {second_start} µs"
    );
    let ids = |slices: &[Value]| -> std::collections::BTreeSet<u64> {
        slices
            .iter()
            .filter_map(|e| e["bind_id"].as_u64())
            .collect()
    };
    let (first_ids, second_ids) = (ids(&first), ids(&second));
    assert!(!first_ids.is_empty(), "the pipelined run waits on events");
    assert!(
        first_ids.is_disjoint(&second_ids),
        "{first_ids:?} {second_ids:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A trace written to the file the run's standard output is, named through
/// a symbolic link (`/dev/stdout` under another name), goes through
/// standard output into that file: not renamed over it (the run's report
/// goes on to the same file, and a file renamed over it would leave the
/// report in an unlinked one), and not emptied first (a log that other
/// processes share keeps their lines; with `>`, the run's report is not
/// written over the trace).
/// Before, the file was emptied and the trace written from its start: an
/// appended log lost every earlier line, and with `>` the report
/// overwrote the trace's start.
#[cfg(unix)]
#[test]
fn a_trace_to_the_file_standard_output_is_is_written_into_that_file() {
    use std::os::unix::fs::MetadataExt;
    let dir = scratch_dir("stdout-trace");
    let out = dir.join("out.txt");
    let link = dir.join("trace.json");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    let earlier = "another rank's report\n";
    for append in [true, false] {
        std::fs::write(&out, earlier).unwrap();
        // Opened for appending, as a shell's `>>`, or emptied, as `>`.
        let stdout = File::options()
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&out)
            .unwrap();
        let inode = std::fs::metadata(&out).unwrap().ino();
        let mut command = spyre_command(&[
            "run",
            "--iterations",
            "2",
            "--trace",
            link.to_str().unwrap(),
        ]);
        command.stdout(stdout);
        let output = command.output().expect("the spyre binary runs");
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(
            std::fs::metadata(&out).unwrap().ino(),
            inode,
            "the file standard output is was replaced"
        );
        let contents = std::fs::read_to_string(&out).unwrap();
        // What the run writes starts with the trace (the report follows).
        let trace_at = if append { earlier.len() } else { 0 };
        assert!(
            contents.starts_with(&earlier[..trace_at]),
            "append {append}: {contents}"
        );
        let trace = serde_json::Deserializer::from_str(&contents[trace_at..])
            .into_iter::<Value>()
            .next()
            .expect("a JSON value")
            .unwrap_or_else(|e| panic!("append {append}: the trace is not whole: {e}"));
        assert!(trace["traceEvents"].is_array(), "append {append}: {trace}");
        assert_eq!(
            contents.matches("verified").count(),
            1,
            "append {append}: the report, once: {contents}"
        );
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "only the file and the link: {names:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_json_report_carries_the_counters_of_every_stream() {
    let report = json(&["run", "--json", "--iterations", "10"], &[]);
    let counters = &report["counters"];
    let device = &counters["device"];
    // 2 threads × 10 iterations × 5 launches, all completed.
    assert_eq!(u64_of(device, "launched"), 100);
    assert_eq!(u64_of(device, "launched"), u64_of(&report, "operations"));
    assert_eq!(u64_of(device, "completed"), 100);
    assert_eq!(u64_of(device, "failed"), 0);
    assert_eq!(u64_of(device, "in_flight"), 0);
    assert!(u64_of(device, "max_in_flight") >= 1);
    assert_eq!(u64_of(device, "bytes_h2d"), u64_of(&report, "bytes_h2d"));
    assert_eq!(u64_of(device, "bytes_d2h"), u64_of(&report, "bytes_d2h"));
    // Each stream's launches are the report's count for that stream.
    let streams = counters["streams"].as_object().unwrap();
    for stream in report["streams"].as_array().unwrap() {
        let id = stream["id"].as_i64().unwrap().to_string();
        assert_eq!(
            u64_of(&streams[&id], "launched"),
            u64_of(stream, "operations"),
            "stream {id}"
        );
    }
    let summed: u64 = streams.values().map(|s| u64_of(s, "launched")).sum();
    assert_eq!(summed, 100);
}

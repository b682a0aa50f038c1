#!/usr/bin/env bash
# Runs the main workload (`spyre run`) through the hardware path: the
# flex-sys loader and flex-rt's hardware backend, on the software device built as
# a shared library that exports flex.h (libspyre_mock_capi.so, crate
# spyre-mock-capi). Fails unless the
# run used the hardware backend and verified every iteration; prints one
# summary line. Then, with the library reporting ABI 1.0 (no events), checks
# that the default (pipelined) run is refused before any work (exit 2,
# naming the modes that need no events), that `--mode per-iteration` runs,
# and that `spyre bench` is refused before it measures anything (naming
# `--pipeline false`).
#
# Arguments of `spyre run` can be changed with SPYRE_CI_THREADS,
# SPYRE_CI_ITERATIONS, SPYRE_CI_SIZE and SPYRE_CI_KERNEL. Needs jq or python3
# to read the JSON report.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

threads="${SPYRE_CI_THREADS:-2}"
iterations="${SPYRE_CI_ITERATIONS:-50}"
size="${SPYRE_CI_SIZE:-64KiB}"
kernel="${SPYRE_CI_KERNEL:-axpy}"

case "$(uname -s)" in
    Darwin) lib_name="libspyre_mock_capi.dylib" ;;
    *) lib_name="libspyre_mock_capi.so" ;;
esac
target_dir="${CARGO_TARGET_DIR:-target}"
[[ "$target_dir" = /* ]] || target_dir="$repo_root/$target_dir"
lib="$target_dir/release/$lib_name"

echo "run-hardware-path: building the software device as a shared library" >&2
cargo build --release --locked -p spyre-mock-capi
if [[ ! -f "$lib" ]]; then
    echo "run-hardware-path: $lib was not built" >&2
    exit 1
fi

echo "run-hardware-path: spyre run --kernel $kernel --threads $threads --iterations $iterations --size $size, FLEX_RUNTIME_LIB=$lib" >&2
report="$(
    SPYRE_BACKEND=hardware FLEX_RUNTIME_LIB="$lib" \
        cargo run --release --locked --quiet -p spyre-cli --features hardware -- \
        run --json --kernel "$kernel" --threads "$threads" --iterations "$iterations" --size "$size"
)"

# Prints: backend verified total operations bytes_moved gb_per_s wall_seconds
read_report() {
    if command -v jq >/dev/null 2>&1; then
        jq -r '[.backend, .iterations_verified, .iterations_total, .operations, .bytes_moved, .gb_per_s, .wall_seconds] | map(tostring) | join(" ")'
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c 'import json, sys
r = json.load(sys.stdin)
print(" ".join(str(r[k]) for k in ["backend", "iterations_verified", "iterations_total", "operations", "bytes_moved", "gb_per_s", "wall_seconds"]))'
    else
        echo "run-hardware-path: jq or python3 is needed to read the report" >&2
        return 1
    fi
}

read -r backend verified total operations bytes gbps seconds < <(printf '%s\n' "$report" | read_report)

if [[ "$backend" != "hardware" ]]; then
    echo "run-hardware-path: the run used the '$backend' backend, not hardware" >&2
    exit 1
fi
if [[ -z "$total" || "$total" == "0" || "$verified" != "$total" ]]; then
    echo "run-hardware-path: $verified of $total iterations verified" >&2
    printf '%s\n' "$report" >&2
    exit 1
fi
printf 'hardware path OK: %s/%s iterations verified through the hardware backend on %s (%s launches, %s bytes moved, %.3f GB/s, %.3f s)\n' \
    "$verified" "$total" "$lib" "$operations" "$bytes" "$gbps" "$seconds"

echo "run-hardware-path: a library of ABI 1.0 (no events): the pipelined run is refused up front, per-iteration runs" >&2
set +e
refusal="$(
    SPYRE_BACKEND=hardware FLEX_RUNTIME_LIB="$lib" SPYRE_MOCK_ABI_VERSION=1.0 \
        cargo run --release --locked --quiet -p spyre-cli --features hardware -- \
        run --iterations 2 --size 64KiB 2>&1 >/dev/null
)"
code=$?
set -e
if [[ $code -ne 2 || "$refusal" != *"orders streams with events, and this runtime has none: use \`--mode per-iteration\`"* ]]; then
    echo "run-hardware-path: expected exit 2 naming the modes without events, got exit $code: $refusal" >&2
    exit 1
fi
SPYRE_BACKEND=hardware FLEX_RUNTIME_LIB="$lib" SPYRE_MOCK_ABI_VERSION=1.0 \
    cargo run --release --locked --quiet -p spyre-cli --features hardware -- \
    run --mode per-iteration --iterations 2 --size 64KiB >/dev/null
set +e
refusal="$(
    SPYRE_BACKEND=hardware FLEX_RUNTIME_LIB="$lib" SPYRE_MOCK_ABI_VERSION=1.0 \
        cargo run --release --locked --quiet -p spyre-cli --features hardware -- \
        bench --budget-ms 20 2>&1 >/dev/null
)"
code=$?
set -e
if [[ $code -ne 2 || "$refusal" != *"the pipeline measurement orders streams with events, and this runtime has none: skip it with \`spyre bench --pipeline false\`"* ]]; then
    echo "run-hardware-path: expected spyre bench to exit 2 before measuring, naming --pipeline false; got exit $code: $refusal" >&2
    exit 1
fi
echo "ABI 1.0 OK: the pipelined run and the bench refused before any work (exit 2), the per-iteration run verified"

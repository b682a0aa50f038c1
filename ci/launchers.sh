#!/usr/bin/env bash
# `spyre run` under a real launcher: Open MPI's `mpirun` starts one process
# per software device, each choosing its device from the launcher's local
# rank (OMPI_COMM_WORLD_LOCAL_RANK), on the software device in process and
# through the FFI path (its C library as the flex library):
#
# - 4 ranks over 4 devices: every rank verifies all its iterations, on a
#   device of its own (checked from each rank's JSON report);
# - 5 ranks over 4 devices: the 5th fails alone, with an error naming its
#   variable and the device count, and the other 4 still verify;
# - 4 ranks with SPYRE_DEVICES=3,2,1,0: the same, every logical device
#   backed by a different device (the software device reports the mapping).
#
# Installs Open MPI (Debian's openmpi-bin) when `mpirun` is missing.
# When Open MPI cannot be installed (not root, no sudo, no apt-get, or the
# install fails) the script fails in CI and says why; outside CI it prints
# "SKIPPED (outside CI only): ..." and exits 0 (ci/lib.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source ci/lib.sh

ensure_debian_package mpirun openmpi-bin "the launcher runs"

cargo build --release --locked -p spyre-mock-capi
cargo build --release --locked -p spyre-cli --features hardware
target_dir="${CARGO_TARGET_DIR:-target}"
[[ "$target_dir" = /* ]] || target_dir="$repo_root/$target_dir"
spyre="$target_dir/release/spyre"
lib="$target_dir/release/libspyre_mock_capi.so"

# Ranks run as ordinary processes (spyre does not call MPI_Init); a rank that
# fails must not take the others down, so that "fails alone" can be seen.
mpirun_flags=(--oversubscribe --mca orte_abort_on_non_zero_status 0)
if [[ "$(id -u)" -eq 0 ]]; then
    mpirun_flags+=(--allow-run-as-root)
fi

# Runs `spyre run --json` on $1 ranks with the environment that follows;
# prints every rank's JSON line. Each rank writes its report to a file of
# its own: mpirun forwards standard output in pieces of at most 4 KiB,
# which can cut a long line of one rank with another's.
ranks() {
    local count="$1"
    shift
    local dir
    dir="$(mktemp -d)" || exit 1
    timeout 300 mpirun "${mpirun_flags[@]}" -np "$count" \
        env SPYRE_MOCK_DEVICES=4 "$@" \
        sh -c '"$0" run --json --iterations 20 --threads 1 >"$1/rank-$OMPI_COMM_WORLD_RANK.json" 2>"$1/rank-$OMPI_COMM_WORLD_RANK.log"' \
        "$spyre" "$dir" || true
    # A rank's log tells why when the check fails.
    cat "$dir"/rank-*.log >&2 2>/dev/null || true
    cat "$dir"/rank-*.json
    rm -rf "$dir"
}

# Checks the JSON lines on stdin: $1 successful ranks on distinct devices,
# every iteration verified, the device chosen by Open MPI's local rank; $2
# failed ranks naming that variable and 4 visible devices; $3 the expected
# visible_devices detail ("" when not reported).
check() {
    python3 -c '
import json, sys
ok_count, failed_count, visible = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
reports = [json.loads(line) for line in sys.stdin if line.strip().startswith("{")]
ok = [r for r in reports if "error" not in r]
failed = [r for r in reports if "error" in r]
assert len(ok) == ok_count, f"{len(ok)} ranks succeeded, expected {ok_count}: {reports}"
assert len(failed) == failed_count, f"{len(failed)} ranks failed, expected {failed_count}: {failed}"
devices = sorted(r["device"] for r in ok)
assert devices == list(range(ok_count)), f"devices {devices}"
for r in ok:
    assert r["iterations_verified"] == r["iterations_total"] > 0, r
    assert r["device_source"] == "OMPI_COMM_WORLD_LOCAL_RANK", r["device_source"]
    if visible:
        assert r["backend_details"].get("visible_devices") == visible, r["backend_details"]
for r in failed:
    message = r["error"]
    assert "number of visible devices=4" in message and "OMPI_COMM_WORLD_LOCAL_RANK" in message, message
behind = sorted(int(visible.split(",")[d]) for d in devices) if visible else devices
assert len(set(behind)) == len(behind), behind
summary = f"{len(ok)} ranks verified on devices {devices}"
if visible:
    summary += f" (behind them: {behind})"
for r in failed:
    summary += "; one failed alone: " + r["error"]
print(summary)
' "$@"
}

for path in in-process ffi; do
    if [[ "$path" == ffi ]]; then
        backend=(SPYRE_BACKEND=hardware FLEX_RUNTIME_LIB="$lib")
    else
        backend=(SPYRE_BACKEND=mock)
    fi
    summary="$(ranks 4 "${backend[@]}" | check 4 0 "")"
    echo "launchers ($path): 4 ranks on 4 devices: $summary"
    summary="$(ranks 5 "${backend[@]}" | check 4 1 "")"
    echo "launchers ($path): 5 ranks on 4 devices: $summary"
    visible=""
    if [[ "$path" == in-process ]]; then
        visible="3,2,1,0"
    fi
    summary="$(ranks 4 "${backend[@]}" SPYRE_DEVICES=3,2,1,0 | check 4 0 "$visible")"
    echo "launchers ($path): 4 ranks, SPYRE_DEVICES=3,2,1,0: $summary"
done

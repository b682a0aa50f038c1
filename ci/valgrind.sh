#!/usr/bin/env bash
# The hardware backend's fault and teardown paths under valgrind's
# memcheck: flex-rt's FFI fault tests (tests/tests/ffi_faults.rs) against
# the software device's C library, each test in a process of its own, every
# process checked. Miri cannot load a shared library, so this is where a
# use after free across the C boundary shows: for instance a completion
# that a runtime whose `flex_runtime_destroy` failed still calls after its
# teardown, giving its payload block back to a stream's cache. Any memcheck
# error fails the run.
#
# Installs valgrind (Debian's package) when it is missing; when it cannot,
# the script fails in CI and says why, and outside CI prints
# "SKIPPED (outside CI only): ..." and exits 0 (ci/lib.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
source ci/lib.sh

ensure_debian_package valgrind valgrind "the valgrind run"

# The library is built first, so that no test process builds it (which
# valgrind would follow into cargo); the paths come from cargo's JSON
# messages.
lib="$(cargo build --release --locked -p spyre-mock-capi --message-format=json |
    grep -o '"[^"]*/libspyre_mock_capi\.so"' | head -n 1 | tr -d '"')"
[[ -f "$lib" ]] || { echo "error: cargo reported no libspyre_mock_capi.so" >&2; exit 1; }
tests="$(cargo test --locked -p spyre-tests --test ffi_faults --no-run --message-format=json |
    grep -o '"executable":"[^"]*/ffi_faults-[^"]*"' | head -n 1 | sed 's/^"executable":"//; s/"$//')"
[[ -x "$tests" ]] || { echo "error: cargo reported no ffi_faults test binary" >&2; exit 1; }

# A memcheck error exits the test process with 97, which fails its test.
SPYRE_TESTS_MOCK_CDYLIB="$lib" valgrind --quiet --trace-children=yes --error-exitcode=97 \
    "$tests" --test-threads=1

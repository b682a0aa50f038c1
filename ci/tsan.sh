#!/usr/bin/env bash
# ThreadSanitizer on the stress tests (tests/tests/stress.rs): eight threads
# of random pool and stream operations over the software device, a fresh
# pool raced 100 times, and the process-wide run (which re-executes the test
# binary, itself instrumented). The standard library is rebuilt with the
# sanitizer (-Zbuild-std) so that its synchronization is seen too.
#
#   bash ci/tsan.sh                      # the stress tests
#   bash ci/tsan.sh --test faults -- --skip undefined_status
#                                        # other tests of spyre-tests
#
# Tests that load the mock shared library (`spyre_tests::mock_cdylib()`,
# which runs cargo to build it) cannot run here: that nested build inherits
# RUSTFLAGS and fails with an ABI-mismatch error; skip them as above.
#
# Takes about 2.5 minutes on 2 cores from cold (instrumented std and
# dependencies ~2 min, the tests 15-30 s); a race makes the test binary exit
# with status 66 and the script fail. Uses its own target directory.
#
# Needs a nightly toolchain with rust-src (`nightly`, or the toolchain
# TSAN_TOOLCHAIN names); it is installed with rustup when missing. When it cannot be installed, or the host is not one that
# ThreadSanitizer supports, the script fails in CI and says why; outside CI
# it prints "SKIPPED (outside CI only): ..." and exits 0 (ci/lib.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/lib.sh

TOOLCHAIN="${TSAN_TOOLCHAIN:-nightly}"
ensure_nightly_components "$TOOLCHAIN" rust-src

target="$(rustc "+$TOOLCHAIN" -vV | sed -n 's/^host: //p')"
case "$target" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) ;;
    *) cannot_run ThreadSanitizer "rustc does not support it on $target" ;;
esac

args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--test stress)

started=$SECONDS
RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" \
    CARGO_TARGET_DIR=target/tsan \
    cargo "+$TOOLCHAIN" test -Zbuild-std --target "$target" --locked -p spyre-tests "${args[@]}"
echo "==> tsan ${args[*]}: passed in $((SECONDS - started)) s"

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
# Needs a nightly toolchain with rust-src; it is installed with rustup when
# missing. When it cannot be installed because the network is unavailable,
# prints "SKIPPED: <reason>" and exits 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TOOLCHAIN="${TSAN_TOOLCHAIN:-nightly}"

skip() {
    echo "SKIPPED: $*"
    exit 0
}

ensure_components() {
    if ! command -v rustup >/dev/null 2>&1; then
        echo "error: rustup is needed to install the $TOOLCHAIN toolchain with rust-src" >&2
        exit 1
    fi
    if rustup component list --toolchain "$TOOLCHAIN" --installed 2>/dev/null | grep -q '^rust-src'; then
        return 0
    fi
    echo "==> installing $TOOLCHAIN with rust-src"
    local log
    log="$(mktemp)"
    if ! rustup toolchain install "$TOOLCHAIN" --profile minimal --component rust-src >"$log" 2>&1; then
        cat "$log" >&2
        if grep -qiE 'download|network|resolve|connect|timed? ?out|dns|unreachable|tls|ssl|proxy' "$log"; then
            rm -f "$log"
            skip "ThreadSanitizer: cannot install the $TOOLCHAIN toolchain's rust-src component (network unavailable)"
        fi
        rm -f "$log"
        echo "error: rustup could not install rust-src for $TOOLCHAIN" >&2
        exit 1
    fi
    rm -f "$log"
}

ensure_components

target="$(rustc "+$TOOLCHAIN" -vV | sed -n 's/^host: //p')"
case "$target" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) ;;
    *) skip "ThreadSanitizer: not supported by rustc on $target" ;;
esac

args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(--test stress)

started=$SECONDS
RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" \
    CARGO_TARGET_DIR=target/tsan \
    cargo "+$TOOLCHAIN" test -Zbuild-std --target "$target" --locked -p spyre-tests "${args[@]}"
echo "==> tsan ${args[*]}: passed in $((SECONDS - started)) s"

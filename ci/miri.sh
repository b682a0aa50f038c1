#!/usr/bin/env bash
# Miri on the pure-Rust tests of the pool and the software device: undefined
# behaviour, data races and use-after-free in
#   stream-lib  spyre-stream's unit tests (ids, env parsers, devices, errors)
#   pool        spyre-stream/tests/pool.rs: the pool over the mock, with its
#               engine threads (round robin, init, faults, device sync, no
#               lock held while waiting)
#   mock        spyre-mock's unit tests (engines, scheduler, memory, kernels,
#               faults, streams)
#   capi        spyre-mock-capi's unit tests: the flex.h exports of the
#               software device, called from Rust
#   contract    flex-rt's unit tests: the program format, the no-op backend,
#               the environment rules, the hardware backend's callback
#               bookkeeping (dlopen is out of Miri's reach and is skipped);
#               and flex-sys's locks (`flex_sys::sync`)
#
#   bash ci/miri.sh                 # all five suites
#   bash ci/miri.sh pool mock       # chosen suites
#
# Takes about 11 minutes on 2 cores (sysroot and dependencies ~1 min from
# cold; in CI at 859692f: stream-lib 24 s, pool 17 s, mock 7.7 min, capi
# 98 s, contract 15 s).
#
# MIRIFLAGS:
#   -Zmiri-ignore-leaks           the tests leak runtimes on purpose (as the
#                                 process-wide runtime is leaked by design),
#                                 so their engine threads are still parked
#                                 when the test binary's main returns;
#   -Zmiri-permissive-provenance  parking_lot_core (a dependency of tests) casts
#                                 integers to pointers, and the mock
#                                 library carries a C function pointer and
#                                 user data through the device as integers
#                                 (exposed provenance); this silences
#                                 Miri's warning about such casts.
# The hardware backend (dlopen) is out of Miri's reach and is not run here.
#
# Needs a nightly toolchain with the `miri` and `rust-src` components
# (`nightly`, or the toolchain MIRI_TOOLCHAIN names); they
# are installed with rustup when missing. When they cannot be installed, the
# script fails in CI and says why; outside CI it prints "SKIPPED (outside CI
# only): ..." and exits 0 (ci/lib.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/lib.sh

TOOLCHAIN="${MIRI_TOOLCHAIN:-nightly}"
ensure_nightly_components "$TOOLCHAIN" miri rust-src
echo "==> miri on $(rustc "+$TOOLCHAIN" --version)"

export MIRIFLAGS="${MIRIFLAGS:--Zmiri-ignore-leaks -Zmiri-permissive-provenance}"
cargo "+$TOOLCHAIN" miri setup

run_suite() {
    local started=$SECONDS
    case "$1" in
        stream-lib) cargo "+$TOOLCHAIN" miri test --locked -p spyre-stream --lib ;;
        pool) cargo "+$TOOLCHAIN" miri test --locked -p spyre-stream --test pool ;;
        mock) cargo "+$TOOLCHAIN" miri test --locked -p spyre-mock --lib ;;
        capi) cargo "+$TOOLCHAIN" miri test --locked -p spyre-mock-capi --lib ;;
        contract)
            cargo "+$TOOLCHAIN" miri test --locked -p flex-rt --lib
            cargo "+$TOOLCHAIN" miri test --locked -p flex-sys --lib sync::
            ;;
        *)
            echo "error: unknown suite '$1' (stream-lib, pool, mock, capi, contract)" >&2
            exit 2
            ;;
    esac
    echo "==> miri $1: passed in $((SECONDS - started)) s"
}

suites=("$@")
[[ ${#suites[@]} -gt 0 ]] || suites=(stream-lib pool mock capi contract)
for suite in "${suites[@]}"; do
    echo "==> miri $suite"
    run_suite "$suite"
done

#!/usr/bin/env bash
# Model-checks with loom: the pool's concurrency (spyre-stream/tests/loom.rs),
# the awaitable's waker hand-off and the software device's events.
# Uses its own target directory: the cfg flag changes every crate's build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUSTFLAGS="--cfg spyre_loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p spyre-stream --no-default-features --release --locked --test loom "$@"
# The awaitable's waker hand-off (spyre-stream/src/signal.rs) and the software
# device's event state machine, lock-free query and stream inboxes
# (spyre-mock/src/scheduler.rs): unit-test models, selected by name.
RUSTFLAGS="--cfg spyre_loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p spyre-stream --no-default-features --release --locked --lib loom_models "$@"
RUSTFLAGS="--cfg spyre_loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p spyre-mock --release --locked --lib loom_models "$@"

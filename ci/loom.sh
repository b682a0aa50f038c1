#!/usr/bin/env bash
# Model-checks the pool's concurrency with loom (spyre-stream/tests/loom.rs).
# Uses its own target directory: the cfg flag changes every crate's build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUSTFLAGS="--cfg spyre_loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p spyre-stream --no-default-features --release --locked --test loom "$@"

#!/usr/bin/env bash
# Fails when flex-sys/src/bindings.rs is not what bindgen generates from
# flex-sys/include/flex.h (regenerate with
# `cargo run --manifest-path flex-sys/gen/Cargo.toml`).
#
# The generator needs libclang at run time. On Debian/Ubuntu this script
# installs libclang-dev with apt-get when no libclang is found (as root, or
# through passwordless sudo); elsewhere it stops and says what to install.
# Runs non-interactively (CI=true, no stdin).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

have_libclang() {
    local f
    if [[ -n "${LIBCLANG_PATH:-}" ]]; then
        for f in "$LIBCLANG_PATH"/libclang.so* "$LIBCLANG_PATH"/libclang-[0-9]*.so*; do
            [[ -e "$f" ]] && return 0
        done
    fi
    # libclang.so or libclang-<version>.so, not libclang-cpp (a different library
    # that some images ship without libclang itself).
    for f in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
        /usr/lib/*/libclang.so* /usr/lib/*/libclang-[0-9]*.so* /usr/lib/libclang.so*; do
        [[ -e "$f" ]] && return 0
    done
    local ldconfig
    ldconfig="$(command -v ldconfig || echo /sbin/ldconfig)"
    if [[ -x "$ldconfig" ]]; then
        # Read all of ldconfig's output (no `grep -q`): with pipefail, an early
        # exit of grep would make ldconfig die of SIGPIPE and the test fail.
        local listing
        listing="$("$ldconfig" -p 2>/dev/null || true)"
        [[ "$listing" == *"libclang.so"* || "$listing" == *libclang-[0-9]* ]] && return 0
    fi
    return 1
}

install_libclang() {
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "check-bindings: libclang not found and apt-get is not available." >&2
        echo "check-bindings: install libclang (e.g. libclang-dev or clang) or set LIBCLANG_PATH to its directory." >&2
        exit 1
    fi
    local sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo=(sudo -n)
        else
            echo "check-bindings: libclang not found; installing libclang-dev needs root." >&2
            echo "check-bindings: run 'apt-get install libclang-dev' as root, or run this script as root." >&2
            exit 1
        fi
    fi
    echo "check-bindings: libclang not found; installing libclang-dev with apt-get" >&2
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update </dev/null
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libclang-dev </dev/null
    if ! have_libclang; then
        echo "check-bindings: libclang-dev was installed but no libclang library was found." >&2
        exit 1
    fi
}

if ! have_libclang; then
    install_libclang
fi

cargo run --locked --manifest-path flex-sys/gen/Cargo.toml -- --check

# Shared by the scripts in ci/: sourced, not run.
#
# The rule for a check that cannot run (a tool or component that cannot be
# installed, a platform the tool does not support): in CI (CI set to
# anything but "", "0" or "false") it is a failure that says why; outside
# CI it is a skip that says so and exits 0. No check reports success when it
# did not run.

in_ci() {
    case "${CI:-}" in
        "" | 0 | false | FALSE | False) return 1 ;;
        *) return 0 ;;
    esac
}

# cannot_run CHECK REASON: ends the script as the rule above says.
cannot_run() {
    local check="$1"
    shift
    if in_ci; then
        echo "error: $check did not run: $* (in CI a check that cannot run is a failure)" >&2
        exit 1
    fi
    echo "SKIPPED (outside CI only): $check did not run: $*" >&2
    exit 0
}

# ensure_nightly_components TOOLCHAIN COMPONENT...: installs the components
# (and the toolchain if it is missing) with rustup, or calls cannot_run.
ensure_nightly_components() {
    local toolchain="$1"
    shift
    if ! command -v rustup >/dev/null 2>&1; then
        cannot_run "$toolchain with $*" "rustup is not installed, so the $toolchain toolchain cannot be installed"
    fi
    local installed missing=()
    installed="$(rustup component list --toolchain "$toolchain" --installed 2>/dev/null || true)"
    local component
    for component in "$@"; do
        grep -q "^$component" <<<"$installed" || missing+=("$component")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    echo "==> installing ${missing[*]} for $toolchain" >&2
    local log status=0
    log="$(mktemp)"
    if rustup toolchain list 2>/dev/null | grep -q "^$toolchain"; then
        rustup component add --toolchain "$toolchain" "${missing[@]}" >"$log" 2>&1 || status=$?
    else
        local flags=()
        for component in "${missing[@]}"; do flags+=(--component "$component"); done
        rustup toolchain install "$toolchain" --profile minimal "${flags[@]}" >"$log" 2>&1 || status=$?
    fi
    if [[ $status -ne 0 ]]; then
        cat "$log" >&2
        rm -f "$log"
        cannot_run "$toolchain with ${missing[*]}" "rustup could not install them (exit $status; its output is above)"
    fi
    rm -f "$log"
}

# ensure_debian_package COMMAND PACKAGE CHECK: installs Debian's PACKAGE
# with apt-get when COMMAND is missing (as root, or through sudo without a
# password); when it cannot, CHECK cannot run (see cannot_run).
ensure_debian_package() {
    local command="$1" package="$2" check="$3"
    command -v "$command" >/dev/null 2>&1 && return 0
    local as_root=()
    if [[ "$(id -u)" -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null ||
            cannot_run "$check" "$command is missing, and installing $package needs root (or sudo without a password)"
        as_root=(sudo -n env DEBIAN_FRONTEND=noninteractive)
    fi
    command -v apt-get >/dev/null 2>&1 ||
        cannot_run "$check" "$command is missing and there is no apt-get to install $package"
    echo "==> installing $package" >&2
    local log
    log="$(mktemp)"
    if ! { "${as_root[@]}" apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq \
            -o DPkg::Lock::Timeout=300 "$package"; } >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        cannot_run "$check" "installing $package failed (its output is above)"
    fi
    rm -f "$log"
    command -v "$command" >/dev/null 2>&1 ||
        cannot_run "$check" "$package was installed but $command is still missing"
}

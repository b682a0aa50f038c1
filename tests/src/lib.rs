//! Test support shared by the cross-crate tests in `tests/tests/`.
//!
//! - [`isolated`]: runs a test body in a fresh child process with its own
//!   environment, for tests of process-global state (the runtime starts once
//!   per process) and of environment variables.
//! - [`mock_cdylib`]: the path of the software device's flex library
//!   (`libspyre_mock_capi.so`, crate `spyre-mock-capi`), built on first use,
//!   so that the FFI path runs in every `cargo test`.
//! - [`process`]: forking a child with a bounded wait, and changing the
//!   environment of an isolated test process.
//! - [`conformance`]: one suite for the `Runtime`/`Stream` contract, run
//!   against every backend: the in-process mock (`tests/conformance_mock.rs`),
//!   the mock shared library through flex-sys and flex-rt
//!   (`tests/conformance_ffi.rs`), and a vendor library named by
//!   `FLEX_RUNTIME_LIB` (`tests/conformance_vendor.rs`, ignored unless run
//!   with `--ignored`).

pub mod conformance;
pub mod process;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Environment variable that tells a re-executed test binary which test body to run.
const CHILD_MARKER: &str = "SPYRE_TESTS_ISOLATED_CHILD";

/// Runs `body` in a fresh process: the test binary re-executes itself with
/// only the test `name` selected, `env` set (and `SPYRE_*`, `LOCAL_RANK`,
/// `TORCH_SPYRE_*` and `FLEX_RUNTIME_LIB` cleared unless given), and asserts
/// that the child passed. Inside the child, `body` runs directly.
///
/// `name` must be the test's path as the harness prints it (for a test at
/// the top of an integration-test file, its function name).
///
/// # Panics
/// When the child process fails or cannot be started: that is the test failing.
pub fn isolated(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if std::env::var(CHILD_MARKER).as_deref() == Ok(name) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let mut command = Command::new(exe);
    command.args([name, "--exact", "--nocapture", "--test-threads=1"]);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if ["SPYRE_", "TORCH_SPYRE_", "LOCAL_RANK", "FLEX_RUNTIME_LIB"]
            .iter()
            .any(|p| key.starts_with(p))
        {
            command.env_remove(key.as_ref());
        }
    }
    command.env(CHILD_MARKER, name);
    if let Some(path) = MOCK_CDYLIB.get() {
        // The child uses the library this process already built.
        command.env(MOCK_CDYLIB_ENV, path);
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command
        .output()
        .expect("the test binary can re-execute itself");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "isolated test {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("1 passed"),
        "isolated test {name} did not run in the child:\n{stdout}"
    );
}

/// Environment variable that names an already built mock shared library;
/// when set, [`mock_cdylib`] uses it instead of building. [`isolated`] sets it
/// for its children once the parent has the library.
pub const MOCK_CDYLIB_ENV: &str = "SPYRE_TESTS_MOCK_CDYLIB";

static MOCK_CDYLIB: OnceLock<PathBuf> = OnceLock::new();

/// The path of the software device's flex library
/// (`libspyre_mock_capi.so`, crate `spyre-mock-capi`), for
/// `HardwareBackend::open(mock_cdylib())`.
///
/// Cargo does not hand a dependency's `cdylib` to tests, so the first call
/// in a process runs `$CARGO build -p spyre-mock-capi --lib
/// --message-format=json-render-diagnostics` (`--release` when this crate was
/// built without debug assertions) and takes the path from the
/// `compiler-artifact` message. The build uses its own target directory,
/// `<target>/mock-cdylib`, next to the workspace's profile directories, so it
/// never waits for the lock of the outer build that is running the tests;
/// cargo's own lock orders concurrent test processes. The first build
/// compiles spyre-mock-capi and its dependencies there, once per profile;
/// after that it is a no-op check of a fraction of a second. If [`MOCK_CDYLIB_ENV`] names a
/// file, that file is used instead.
///
/// # Panics
/// When cargo cannot be run or the build fails: the message carries cargo's
/// output.
pub fn mock_cdylib() -> &'static Path {
    MOCK_CDYLIB.get_or_init(|| {
        if let Some(path) = std::env::var_os(MOCK_CDYLIB_ENV).map(PathBuf::from)
            && path.is_file()
        {
            return path;
        }
        build_mock_cdylib().unwrap_or_else(|message| panic!("{message}"))
    })
}

/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The target directory of the running test binary: the parent of its
/// profile directory (`<target>/<profile>/deps/<binary>`), or the
/// workspace's `target` when the binary lives elsewhere.
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let deps = exe.parent()?;
            let profile = deps.parent()?;
            (deps.file_name()? == "deps").then(|| profile.parent().map(Path::to_path_buf))?
        })
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Builds the mock shared library and returns its path.
fn build_mock_cdylib() -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = workspace_root().join("Cargo.toml");
    let target = target_dir().join("mock-cdylib");
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", "spyre-mock-capi", "--lib"])
        .arg("--target-dir")
        .arg(&target)
        .arg("--message-format=json-render-diagnostics")
        // A plain library, whatever flags the test itself was built with
        // (a sanitizer build's flags would not link with a std-built cdylib).
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    if cfg!(not(debug_assertions)) {
        command.arg("--release");
    }
    let shown = format!("{command:?}");
    let output = command
        .output()
        .map_err(|err| format!("cannot run {shown}: {err}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "building the mock shared library failed ({}): {shown}\n{stderr}",
            output.status
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    cdylib_from_messages(&stdout).ok_or_else(|| {
        format!(
            "{shown} succeeded but reported no spyre_mock_capi cdylib artifact ending in {}\n{stderr}",
            std::env::consts::DLL_SUFFIX
        )
    })
}

/// The path of spyre-mock-capi's `cdylib` in cargo's JSON messages (one per line).
fn cdylib_from_messages(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["name"] == "spyre_mock_capi"
                && message["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|kind| kind == "cdylib"))
        })
        .flat_map(|message| message["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|name| name.as_str().map(PathBuf::from))
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.ends_with(std::env::consts::DLL_SUFFIX))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdylib_path_is_taken_from_the_artifact_message() {
        let library = format!(
            "/t/debug/libspyre_mock_capi{}",
            std::env::consts::DLL_SUFFIX
        );
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"name":"flex_rt","kind":["lib"]},"filenames":["/t/libflex_rt.rlib"]}"#.to_owned(),
            "not json".to_owned(),
            r#"{"reason":"compiler-artifact","target":{"name":"spyre_mock","kind":["lib"]},"filenames":["/t/debug/libspyre_mock.rlib"]}"#.to_owned(),
            format!(
                r#"{{"reason":"compiler-artifact","target":{{"name":"spyre_mock_capi","kind":["cdylib"]}},"filenames":["{library}"]}}"#
            ),
            r#"{"reason":"build-finished","success":true}"#.to_owned(),
        ]
        .join("\n");
        assert_eq!(
            cdylib_from_messages(&messages),
            Some(PathBuf::from(library))
        );
        assert_eq!(cdylib_from_messages(r#"{"reason":"build-finished"}"#), None);
    }
}

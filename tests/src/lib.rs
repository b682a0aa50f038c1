//! Test support shared by the cross-crate tests in `tests/tests/`.
//!
//! - [`isolated`]: runs a test body in a fresh child process with its own
//!   environment, for tests of process-global state (the runtime starts once
//!   per process) and of environment variables.

use std::process::Command;

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

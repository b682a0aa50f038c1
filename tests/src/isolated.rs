//! Running a test body in a fresh process: the process-wide runtime starts
//! once per process, and environment variables are read at start, so tests
//! of either need a process of their own.

use std::process::Command;

use crate::mock_cdylib::{MOCK_CDYLIB_ENV, built_mock_cdylib};

/// Environment variable that tells a re-executed test binary which test body to run.
const CHILD_MARKER: &str = "SPYRE_TESTS_ISOLATED_CHILD";

/// Runs `body` in a fresh process: the test binary re-executes itself with
/// only the test `name` selected, `env` set (and `SPYRE_*`, `TORCH_SPYRE_*`,
/// the launchers' local-rank variables and `FLEX_RUNTIME_LIB` cleared unless
/// given, but the stress tests' `SPYRE_STRESS_*`), and asserts
/// that the child passed. Inside the child, `body` runs directly.
///
/// `name` must be the test's path as the harness prints it (for a test at
/// the top of an integration-test file, its function name); the
/// [`isolated!`](crate::isolated!) macro finds it by itself.
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
        if [
            "SPYRE_",
            "TORCH_SPYRE_",
            "LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
            "SLURM_LOCALID",
            "FLEX_RUNTIME_LIB",
        ]
        .iter()
        .any(|p| key.starts_with(p))
            // The stress tests' own knobs (seed, operations) are kept.
            && !key.starts_with("SPYRE_STRESS_")
        {
            command.env_remove(key.as_ref());
        }
    }
    command.env(CHILD_MARKER, name);
    if let Some(path) = built_mock_cdylib() {
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

/// Runs `body` once in a fresh process per environment in `envs` (see
/// [`isolated`]). Inside a child, `body` runs once, with that child's
/// environment; it reads the values it checks from the environment.
pub fn isolated_each(name: &str, envs: &[Vec<(&str, &str)>], body: impl Fn()) {
    if std::env::var(CHILD_MARKER).as_deref() == Ok(name) {
        body();
        return;
    }
    for env in envs {
        isolated(name, env, &body);
    }
}

/// The test path the harness prints, from the type name of a function
/// defined inside the test (`binary::module::test::here` →
/// `module::test`): the first segment (the test binary's crate) and the last
/// (the marker function) removed.
pub fn test_name(marker: &'static str) -> &'static str {
    let without_marker = marker.rsplit_once("::").map_or(marker, |(path, _)| path);
    without_marker
        .split_once("::")
        .map_or(without_marker, |(_, path)| path)
}

/// [`isolated()`] (or [`isolated_each`]) with the enclosing test's own name,
/// so a test does not repeat it:
///
/// ```ignore
/// #[test]
/// fn a_test() {
///     spyre_tests::isolated!(&[("SPYRE_BACKEND", "mock")], || { /* ... */ });
///     // the child reuses the software device's flex library built here first:
///     spyre_tests::isolated!(mock_cdylib; &[], || { /* ... */ });
///     // once per environment:
///     spyre_tests::isolated!(each; &envs, || { /* ... */ });
/// }
/// ```
#[macro_export]
macro_rules! isolated {
    (@name) => {{
        fn here() {}
        $crate::isolated::test_name(::std::any::type_name_of_val(&here))
    }};
    (mock_cdylib; $env:expr, $body:expr $(,)?) => {{
        $crate::mock_cdylib();
        $crate::isolated::isolated($crate::isolated!(@name), $env, $body)
    }};
    (each; $envs:expr, $body:expr $(,)?) => {
        $crate::isolated::isolated_each($crate::isolated!(@name), $envs, $body)
    };
    ($env:expr, $body:expr $(,)?) => {
        $crate::isolated::isolated($crate::isolated!(@name), $env, $body)
    };
}

#[cfg(test)]
mod tests {
    use super::test_name;

    #[test]
    fn the_test_name_drops_the_binary_and_the_marker() {
        assert_eq!(test_name("lifecycle::a_test::here"), "a_test");
        assert_eq!(
            test_name("bad_input::module::a_test::here"),
            "module::a_test"
        );
        assert_eq!(
            test_name("a_test::here"),
            "a_test",
            "no binary prefix to drop"
        );
    }
}

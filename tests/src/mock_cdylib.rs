//! The software device's flex library (`libspyre_mock_capi.so`), built on
//! first use so that the FFI path runs in every `cargo test`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Environment variable that names an already built mock shared library;
/// when set, [`mock_cdylib`] uses it instead of building. [`isolated()`](crate::isolated::isolated) sets it
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
/// concurrent builds from several test binaries are serialized by a file
/// lock. The first build
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

/// Builds the mock shared library and returns its path. One build at a time
/// across every test binary (a `serial_test` file lock): test binaries that
/// need the library start together under `cargo test` and `cargo nextest`.
fn build_mock_cdylib() -> Result<PathBuf, String> {
    build_mock_cdylib_serially();
    BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .unwrap_or_else(|| Err("the serialized build did not run".into()))
}

/// The result of the last [`build_mock_cdylib_serially`].
static BUILT: std::sync::Mutex<Option<Result<PathBuf, String>>> = std::sync::Mutex::new(None);

/// [`build_mock_cdylib_now`] under the file lock; `file_serial` takes a
/// function without arguments or value, so the result goes to [`BUILT`].
#[serial_test::file_serial(spyre_mock_capi_build)]
fn build_mock_cdylib_serially() {
    let built = build_mock_cdylib_now();
    *BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(built);
}

/// Runs the cargo build of the mock shared library.
fn build_mock_cdylib_now() -> Result<PathBuf, String> {
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

/// The library, if this process has built or found it already.
pub(crate) fn built_mock_cdylib() -> Option<&'static Path> {
    MOCK_CDYLIB.get().map(PathBuf::as_path)
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

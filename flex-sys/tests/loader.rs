//! The loader against real shared libraries, compiled from `tests/c/` by the
//! test itself (see `support`).
//!
//! Tests that depend on the process environment (`FLEX_RUNTIME_LIB`,
//! `LD_LIBRARY_PATH`) run the body in a child process: this test binary is
//! started again with `--exact child_process_entry` and `FLEX_SYS_TEST_CHILD`
//! naming the case. Everything else goes through `FlexLibrary::open` and
//! `FlexLibrary::load_from`, which read no environment.

mod support;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use flex_sys::bindings::{
    FLEX_ERROR_INVALID_ARGUMENT, FLEX_ERROR_NO_DEVICE, FLEX_SUCCESS, flex_runtime_t,
};
use flex_sys::{
    ABI_1_1_SYMBOLS, AbiVersion, Attempt, FlexLibrary, LoadError, MissingFunction, REQUIRED_SYMBOLS,
};
use support::Stub;

/// Asserts that `reason`, a `dlerror()` text, contains `expected`. The texts
/// are glibc's; other C libraries word them differently, so there only a
/// non-empty reason is required.
#[track_caller]
fn assert_dlerror(reason: &str, expected: &str) {
    if cfg!(target_env = "gnu") {
        assert!(
            reason.contains(expected),
            "{reason:?} should contain {expected:?}"
        );
    } else {
        assert!(!reason.is_empty());
    }
}

/// Unwraps a `LoadError::Open`, checking its path.
#[track_caller]
fn open_reason(error: LoadError, expected_path: &Path) -> String {
    match error {
        LoadError::Open { path, reason } => {
            assert_eq!(path, expected_path);
            reason
        }
        other => panic!("expected LoadError::Open, got {other:?}"),
    }
}

/// Calls `flex_get_device_count` through `api()`.
fn device_count(library: &FlexLibrary) -> (i32, i32) {
    let mut count = -1;
    // SAFETY: `count` is a valid, writable `int32_t` for the whole call.
    let status = unsafe { library.api().flex_get_device_count(&mut count) };
    (status, count)
}

/// Calls `flex_runtime_create(device, ..)`, which the stub always fails.
fn create_runtime(library: &FlexLibrary, device: i32) -> i32 {
    let mut runtime: *mut flex_runtime_t = std::ptr::null_mut();
    // SAFETY: `runtime` is a valid, writable out-pointer for the whole call.
    unsafe { library.api().flex_runtime_create(device, &mut runtime) }
}

// ---------------------------------------------------------------------------
// Files that are not (loadable) flex libraries
// ---------------------------------------------------------------------------

#[test]
fn missing_file_is_an_open_error_with_the_system_reason() {
    let path = support::out_dir().join("no-such-dir/libflex.so.1");
    let reason = open_reason(FlexLibrary::open(&path).unwrap_err(), &path);
    assert_dlerror(
        &reason,
        &format!("{}: cannot open shared object file", path.display()),
    );
    assert_dlerror(&reason, "No such file or directory");
}

#[test]
fn directory_is_an_open_error() {
    let dir = support::out_dir();
    let reason = open_reason(FlexLibrary::open(&dir).unwrap_err(), &dir);
    assert_dlerror(&reason, "Is a directory");
}

#[test]
fn text_file_is_an_open_error() {
    let path = support::text_file(
        "not-a-library.so",
        "This is a text file, not a shared library, although its name ends in .so.\n",
    );
    let reason = open_reason(FlexLibrary::open(&path).unwrap_err(), &path);
    assert_dlerror(&reason, "invalid ELF header");
}

#[test]
fn unresolvable_symbol_fails_at_load_not_at_first_call() {
    let path = Stub::new().define("FLEX_TEST_UNDEFINED_SYMBOL").build();
    let error = FlexLibrary::open(&path).unwrap_err();
    let text = error.to_string();
    let reason = open_reason(error, &path);
    assert_dlerror(&reason, "undefined symbol: flex_test_undefined_function");
    assert!(text.contains(&path.display().to_string()), "{text}");

    // The same file opens with lazy binding: only immediate binding (the
    // loader's RTLD_NOW) turns the unresolved symbol into a load error.
    if std::env::var_os("LD_BIND_NOW").is_none_or(|v| v.is_empty()) {
        use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
        // SAFETY: the stub has no initialisers or finalisers, and nothing
        // from it is called; it is closed again at the end of the statement.
        let lazy = unsafe { Library::open(Some(&path), RTLD_LAZY | RTLD_LOCAL) };
        assert!(lazy.is_ok(), "lazy open failed: {:?}", lazy.err());
    }
}

#[test]
fn missing_dependency_library_fails_at_load() {
    let dependency = support::dependency_library();
    let path = Stub::new()
        .define("FLEX_TEST_NEEDS_DEPENDENCY")
        .link(&dependency)
        .build();
    let reason = open_reason(FlexLibrary::open(&path).unwrap_err(), &path);
    assert_dlerror(&reason, "libflextestdep.so: cannot open shared object file");
}

// ---------------------------------------------------------------------------
// Symbols and versions
// ---------------------------------------------------------------------------

#[test]
fn library_missing_flex_launch_fill_is_refused_naming_the_symbol() {
    let path = Stub::new().omit("flex_launch_fill").build();
    let error = FlexLibrary::open(&path).unwrap_err();
    assert_eq!(
        error,
        LoadError::MissingSymbol {
            symbol: "flex_launch_fill",
            version: AbiVersion::CURRENT,
            path: path.clone()
        }
    );
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "{} does not export `flex_launch_fill`",
            path.display()
        )),
        "{text}"
    );
}

/// A library found through the search path that exports no flex function
/// at all (another library under the expected name, say) is named by the
/// file the loader opened, not by the bare name (before: "libm.so.6 does
/// not export ...", which did not say which file that was).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn a_library_without_flex_functions_found_by_name_is_named_by_its_file() {
    let error = FlexLibrary::open("libm.so.6").unwrap_err();
    let LoadError::MissingSymbol { symbol, path, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*symbol, "flex_get_api_version");
    assert!(path.is_absolute(), "{}", path.display());
    assert_eq!(path, &std::fs::canonicalize(path).unwrap());
    let file = path.file_name().unwrap().to_string_lossy();
    assert!(file.starts_with("libm"), "{file}");
}

/// `dlsym` returns null without an error for an absolute symbol of value
/// 0; such a function cannot be called, and a null function pointer cannot
/// exist in Rust: refused in any version, a 1.1 function in a 1.0 library
/// too. Before, the library was accepted (and the version call at 0 would
/// have jumped there).
#[test]
fn a_function_at_address_0_is_refused() {
    for (symbol, version) in [
        ("flex_launch_fill", None),
        ("flex_get_api_version", None),
        ("flex_event_create", Some((1, 0))),
    ] {
        let mut stub = Stub::new().null(symbol);
        if let Some((major, minor)) = version {
            stub = stub.version(major, minor);
        }
        let path = stub.build();
        assert_eq!(
            FlexLibrary::open(&path).unwrap_err(),
            LoadError::NullSymbol {
                symbol,
                path: path.clone()
            },
            "{symbol} at address 0"
        );
    }
}

#[test]
fn every_required_symbol_is_checked_at_load() {
    for &symbol in REQUIRED_SYMBOLS {
        let path = Stub::new().omit(symbol).build();
        assert_eq!(
            FlexLibrary::open(&path).unwrap_err(),
            LoadError::MissingSymbol {
                symbol,
                // Without the version call the library reports no version;
                // the call is in every version from 1.0 on.
                version: if symbol == "flex_get_api_version" {
                    AbiVersion { major: 1, minor: 0 }
                } else {
                    AbiVersion::CURRENT
                },
                path: path.clone()
            },
            "library without {symbol}"
        );
    }
}

#[test]
fn a_1_1_library_must_export_every_1_1_function() {
    for &symbol in ABI_1_1_SYMBOLS {
        let path = Stub::new().omit(symbol).build();
        assert_eq!(
            FlexLibrary::open(&path).unwrap_err(),
            LoadError::MissingSymbol {
                symbol,
                version: AbiVersion { major: 1, minor: 1 },
                path: path.clone()
            },
            "1.1 library without {symbol}"
        );
    }
}

#[test]
fn a_1_0_library_loads_and_reports_the_1_1_functions_unsupported() {
    let path = Stub::new()
        .version(1, 0)
        .define("FLEX_TEST_ABI_1_0")
        .build();
    let library = FlexLibrary::open(&path).expect("a 1.0 library is compatible with 1.1");
    assert_eq!(library.version(), AbiVersion { major: 1, minor: 0 });
    assert_eq!(device_count(&library), (FLEX_SUCCESS, 3));
    assert_eq!(library.require("flex_launch_fill"), Ok(()));
    for &symbol in ABI_1_1_SYMBOLS {
        let missing = library.require(symbol).unwrap_err();
        assert_eq!(
            missing,
            MissingFunction {
                symbol,
                added_in: AbiVersion { major: 1, minor: 1 },
                version: AbiVersion { major: 1, minor: 0 },
                path: path.clone(),
            }
        );
        assert!(
            missing
                .to_string()
                .starts_with("unsupported by this flex library (ABI 1.0): "),
            "{missing}"
        );
    }
}

#[test]
fn a_1_0_library_that_exports_1_1_names_still_gets_no_1_1_calls() {
    // The 1.1 names of a 1.0 library promise nothing: they are not used.
    let library = FlexLibrary::open(Stub::new().version(1, 0).build()).unwrap();
    assert_eq!(
        library.require("flex_event_record").unwrap_err().symbol,
        "flex_event_record"
    );
}

#[test]
fn a_1_1_library_has_the_1_1_functions() {
    let library = FlexLibrary::open(Stub::new().build()).unwrap();
    for &symbol in ABI_1_1_SYMBOLS {
        assert_eq!(library.require(symbol), Ok(()));
    }
}

#[test]
fn other_major_version_is_an_abi_mismatch_with_both_versions() {
    for (major, minor) in [(2, 0), (0, 5)] {
        let path = Stub::new().version(major, minor).build();
        let error = FlexLibrary::open(&path).unwrap_err();
        assert_eq!(
            error,
            LoadError::AbiMismatch {
                expected: AbiVersion::CURRENT,
                found: AbiVersion { major, minor },
                path: path.clone(),
            }
        );
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "{} implements flex ABI {major}.{minor}, but this program was built for flex ABI 1.1",
                path.display()
            )),
            "{text}"
        );
    }
}

#[test]
fn version_is_checked_before_the_other_symbols() {
    // Both wrong: the version check comes first, so that is what is reported.
    let path = Stub::new().version(2, 0).omit("flex_launch_fill").build();
    assert_eq!(
        FlexLibrary::open(&path).unwrap_err(),
        LoadError::AbiMismatch {
            expected: AbiVersion::CURRENT,
            found: AbiVersion { major: 2, minor: 0 },
            path,
        }
    );
}

#[test]
fn newer_minor_version_is_accepted() {
    let path = Stub::new().version(1, 7).build();
    let library = FlexLibrary::open(&path).expect("a 1.7 library is compatible with 1.1");
    assert_eq!(library.version(), AbiVersion { major: 1, minor: 7 });
    assert_eq!(library.path(), path);
    assert_eq!(device_count(&library), (FLEX_SUCCESS, 3));
}

// ---------------------------------------------------------------------------
// A good library
// ---------------------------------------------------------------------------

#[test]
fn good_library_loads_and_answers_through_api() {
    let path = Stub::new().build();
    let library = FlexLibrary::open(&path).expect("the stub is a complete flex 1.1 library");
    assert_eq!(library.path(), path);
    assert_eq!(library.version(), AbiVersion::CURRENT);
    assert_eq!(device_count(&library), (FLEX_SUCCESS, 3));
}

#[test]
fn last_error_message_is_the_message_of_the_failing_call() {
    let library = FlexLibrary::open(Stub::new().build()).unwrap();
    assert_eq!(create_runtime(&library, 9), FLEX_ERROR_NO_DEVICE);
    assert_eq!(library.last_error_message(), "no device 9");

    // SAFETY: a null out-pointer is allowed; the library reports it.
    let status = unsafe { library.api().flex_get_device_count(std::ptr::null_mut()) };
    assert_eq!(status, FLEX_ERROR_INVALID_ARGUMENT);
    assert_eq!(library.last_error_message(), "count is NULL");
}

#[test]
fn last_error_message_is_per_thread() {
    let library = FlexLibrary::open(Stub::new().build()).unwrap();
    let threads: Vec<_> = [7, 8]
        .into_iter()
        .map(|device| {
            let library = Arc::clone(&library);
            std::thread::spawn(move || {
                let before = library.last_error_message();
                let status = create_runtime(&library, device);
                (before, status, library.last_error_message())
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        results,
        [
            (
                String::new(),
                FLEX_ERROR_NO_DEVICE,
                "no device 7".to_owned()
            ),
            (
                String::new(),
                FLEX_ERROR_NO_DEVICE,
                "no device 8".to_owned()
            ),
        ]
    );
}

#[test]
fn status_string_is_the_library_name_for_the_code() {
    let library = FlexLibrary::open(Stub::new().build()).unwrap();
    assert_eq!(library.status_string(FLEX_SUCCESS), "FLEX_SUCCESS");
    assert_eq!(
        library.status_string(FLEX_ERROR_NO_DEVICE),
        "FLEX_ERROR_NO_DEVICE"
    );
    assert_eq!(library.status_string(999), "FLEX_UNKNOWN_STATUS");
    assert_eq!(library.status_string(-1), "FLEX_UNKNOWN_STATUS");
}

#[test]
fn null_strings_from_the_library_become_empty() {
    let library = FlexLibrary::open(Stub::new().define("FLEX_TEST_NULL_STRINGS").build()).unwrap();
    assert_eq!(create_runtime(&library, 9), FLEX_ERROR_NO_DEVICE);
    assert_eq!(library.last_error_message(), "");
    assert_eq!(library.status_string(FLEX_ERROR_NO_DEVICE), "");
}

#[test]
fn invalid_utf8_in_a_message_is_replaced() {
    let library = FlexLibrary::open(Stub::new().define("FLEX_TEST_BAD_UTF8").build()).unwrap();
    assert_eq!(create_runtime(&library, 9), FLEX_ERROR_NO_DEVICE);
    assert_eq!(library.last_error_message(), "no device 9 \u{FFFD}");
}

#[test]
fn open_is_never_cached_and_a_handle_works_after_another_is_dropped() {
    let path = Stub::new().build();
    let first = FlexLibrary::open(&path).unwrap();
    let second = FlexLibrary::open(&path).unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    drop(first);
    assert_eq!(device_count(&second), (FLEX_SUCCESS, 3));
    assert_eq!(
        format!("{second:?}"),
        format!(
            "FlexLibrary {{ path: {path:?}, version: AbiVersion {{ major: 1, minor: 1 }}, .. }}"
        )
    );
}

/// Whether `path` is mapped into this process.
#[cfg(target_os = "linux")]
fn mapped(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .expect("the process's mappings")
        .contains(&path.display().to_string())
}

/// A library stays loaded after its last handle is dropped, also one the
/// checks refused: opening it ran its initialisers, which may have left
/// code of its own to run. Each uses a stub of its own (an unused define
/// makes a distinct file), which no other test opens.
#[cfg(target_os = "linux")]
#[test]
fn a_library_stays_loaded_once_opened_also_when_refused() {
    let kept = Stub::new().define("FLEX_TEST_KEPT_LOADED").build();
    assert!(!mapped(&kept), "mapped before it was opened");
    let library = FlexLibrary::open(&kept).expect("open");
    assert!(mapped(&kept), "not mapped once opened");
    drop(library);
    assert!(mapped(&kept), "unmapped after its last handle was dropped");

    let refused = Stub::new()
        .version(2, 0)
        .define("FLEX_TEST_UNLOADED")
        .build();
    assert!(matches!(
        FlexLibrary::open(&refused),
        Err(LoadError::AbiMismatch { .. })
    ));
    assert!(mapped(&refused), "a refused library was unmapped");
}

// ---------------------------------------------------------------------------
// FLEX_RUNTIME_LIB through load_from (no environment involved)
// ---------------------------------------------------------------------------

#[test]
fn load_from_a_value_loads_exactly_that_path() {
    let path = Stub::new().build();
    let library = FlexLibrary::load_from(Some(path.clone().into())).unwrap();
    assert_eq!(library.path(), path);
    assert_eq!(device_count(&library), (FLEX_SUCCESS, 3));
}

#[test]
fn load_from_a_missing_path_names_the_variable_and_value() {
    let path = support::out_dir().join("no-such-dir/libflex.so.1");
    let error = FlexLibrary::load_from(Some(path.clone().into())).unwrap_err();
    let text = error.to_string();
    let LoadError::Env {
        variable,
        value,
        error: inner,
    } = error
    else {
        panic!("expected LoadError::Env, got {error:?}");
    };
    assert_eq!(variable, "FLEX_RUNTIME_LIB");
    assert_eq!(value, path.as_os_str());
    let reason = open_reason(*inner, &path);
    assert_dlerror(&reason, "No such file or directory");
    assert!(
        text.starts_with(&format!(
            "FLEX_RUNTIME_LIB={:?} names a library",
            path.as_os_str()
        )),
        "{text}"
    );
}

#[test]
fn load_from_a_wrong_version_keeps_the_cause() {
    let path = Stub::new().version(2, 0).build();
    assert_eq!(
        FlexLibrary::load_from(Some(path.clone().into())).unwrap_err(),
        LoadError::Env {
            variable: "FLEX_RUNTIME_LIB",
            value: path.clone().into(),
            error: Box::new(LoadError::AbiMismatch {
                expected: AbiVersion::CURRENT,
                found: AbiVersion { major: 2, minor: 0 },
                path,
            }),
        }
    );
}

// ---------------------------------------------------------------------------
// load(): the real environment, one child process per case
// ---------------------------------------------------------------------------

/// Names the case a child process runs.
const CHILD_CASE: &str = "FLEX_SYS_TEST_CHILD";
/// A path the child compares with.
const CHILD_EXPECT: &str = "FLEX_SYS_TEST_EXPECT";

/// Runs `child_process_entry` in a fresh process with `case`, the given
/// environment, `FLEX_RUNTIME_LIB` unset unless given, and `search_dir`
/// first on `LD_LIBRARY_PATH`. Fails unless the child reports success.
fn run_child(case: &str, env: &[(&str, &OsStr)], search_dir: Option<&Path>) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_CASE, case)
        .env_remove("FLEX_RUNTIME_LIB");
    for (key, value) in env {
        command.env(key, value);
    }
    if let Some(dir) = search_dir {
        let mut paths = vec![dir.to_owned()];
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            paths.extend(std::env::split_paths(&old));
        }
        command.env("LD_LIBRARY_PATH", std::env::join_paths(paths).unwrap());
    }
    let output = command.output().expect("run the test binary again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(&format!("child case {case}: ok")),
        "child case {case} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A directory `out_dir()/<name>-<hash of its files>` holding copies of
/// `files` under the given names.
fn search_dir(name: &str, files: &[(&Path, &str)]) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut hasher);
    let dir = support::out_dir().join(format!("{name}-{:016x}", hasher.finish()));
    for (source, file_name) in files {
        support::copy_as(source, &dir, file_name);
    }
    support::canonical(&dir)
}

/// Not a test of its own: the body of the child processes started by
/// `run_child`. Does nothing unless `FLEX_SYS_TEST_CHILD` is set.
#[test]
fn child_process_entry() {
    let Some(case) = std::env::var_os(CHILD_CASE) else {
        return;
    };
    let case = case.to_string_lossy().into_owned();
    let expect = std::env::var_os(CHILD_EXPECT).map(PathBuf::from);
    let result = FlexLibrary::load();
    match case.as_str() {
        "env-missing" => {
            let expect = expect.unwrap();
            let error = result.unwrap_err();
            let text = error.to_string();
            let LoadError::Env {
                variable,
                value,
                error: inner,
            } = error
            else {
                panic!("expected LoadError::Env, got {error:?}");
            };
            assert_eq!(variable, "FLEX_RUNTIME_LIB");
            assert_eq!(value, expect.as_os_str());
            assert_dlerror(&open_reason(*inner, &expect), "No such file or directory");
            assert!(
                text.starts_with(&format!("FLEX_RUNTIME_LIB={:?}", expect.as_os_str())),
                "{text}"
            );
        }
        "env-wins" | "soname-first" => {
            let library = result.unwrap();
            assert_eq!(library.path(), expect.unwrap());
            assert_eq!(device_count(&library), (FLEX_SUCCESS, 3));
            assert_eq!(library.skipped(), []);
        }
        "skipped-soname" => {
            let library = result.unwrap();
            let expect = expect.unwrap();
            assert_eq!(library.path(), expect.with_file_name("libflex.so"));
            let [Attempt { candidate, reason }] = library.skipped() else {
                panic!("one name skipped: {:?}", library.skipped());
            };
            assert_eq!(candidate, "libflex.so.1");
            assert_dlerror(reason, &format!("{}: invalid ELF header", expect.display()));
        }
        "refused-soname" => {
            assert_eq!(
                result.unwrap_err(),
                LoadError::Searched {
                    name: "libflex.so.1".to_owned(),
                    error: Box::new(LoadError::AbiMismatch {
                        expected: AbiVersion::CURRENT,
                        found: AbiVersion { major: 2, minor: 0 },
                        path: expect.unwrap(),
                    }),
                }
            );
        }
        "nothing-loadable" => {
            let dir = expect.unwrap();
            let error = result.unwrap_err();
            let text = error.to_string();
            let LoadError::NotFound { attempts } = error else {
                panic!("expected LoadError::NotFound, got {error:?}");
            };
            let names: Vec<&str> = attempts.iter().map(|a| a.candidate.as_str()).collect();
            assert_eq!(names, ["libflex.so.1", "libflex.so"]);
            for Attempt { candidate, reason } in &attempts {
                let file = dir.join(candidate);
                assert_dlerror(reason, &format!("{}: invalid ELF header", file.display()));
                assert!(text.contains(reason.as_str()), "{text}");
            }
            assert!(
                text.contains("FLEX_RUNTIME_LIB=/path/to/libflex.so.1"),
                "{text}"
            );
        }
        other => panic!("unknown child case {other:?}"),
    }
    println!("child case {case}: ok");
}

#[test]
fn load_with_flex_runtime_lib_set_to_a_missing_file_names_the_variable() {
    let missing = support::out_dir().join("no-such-dir/libflex.so.1");
    run_child(
        "env-missing",
        &[
            ("FLEX_RUNTIME_LIB", missing.as_os_str()),
            (CHILD_EXPECT, missing.as_os_str()),
        ],
        None,
    );
}

#[test]
fn load_with_flex_runtime_lib_set_ignores_the_search_path() {
    let good = Stub::new().build();
    // A loadable but incompatible libflex.so.1 on the search path must not
    // be looked at when the variable is set.
    let dir = search_dir(
        "env-wins",
        &[(&Stub::new().version(2, 0).build(), "libflex.so.1")],
    );
    run_child(
        "env-wins",
        &[
            ("FLEX_RUNTIME_LIB", good.as_os_str()),
            (CHILD_EXPECT, good.as_os_str()),
        ],
        Some(&dir),
    );
}

#[test]
fn load_without_the_variable_prefers_the_soname_and_reports_the_real_file() {
    let dir = search_dir(
        "soname-first",
        &[
            (&Stub::new().build(), "libflex.so.1"),
            (&Stub::new().version(2, 0).build(), "libflex.so"),
        ],
    );
    let expect: OsString = dir.join("libflex.so.1").into();
    run_child("soname-first", &[(CHILD_EXPECT, &expect)], Some(&dir));
}

/// A text file whose name ends in `.so`: no dynamic loader opens it.
fn not_a_library() -> PathBuf {
    support::text_file(
        "not-a-library.so",
        "This is a text file, not a shared library, although its name ends in .so.\n",
    )
}

/// A `libflex.so.1` that cannot be opened (not a library) is passed over
/// for `libflex.so`, and the library says so ([`FlexLibrary::skipped`]);
/// before, nothing did.
#[test]
fn load_without_the_variable_tells_the_soname_it_could_not_open() {
    let text = not_a_library();
    let dir = search_dir(
        "skipped-soname",
        &[
            (&text, "libflex.so.1"),
            (&Stub::new().build(), "libflex.so"),
        ],
    );
    let expect: OsString = dir.join("libflex.so.1").into();
    run_child("skipped-soname", &[(CHILD_EXPECT, &expect)], Some(&dir));
}

#[test]
fn load_without_the_variable_reports_a_refused_soname_without_falling_back() {
    let dir = search_dir(
        "refused-soname",
        &[
            (&Stub::new().version(2, 0).build(), "libflex.so.1"),
            (&Stub::new().build(), "libflex.so"),
        ],
    );
    let expect: OsString = dir.join("libflex.so.1").into();
    run_child("refused-soname", &[(CHILD_EXPECT, &expect)], Some(&dir));
}

#[test]
fn load_without_the_variable_lists_every_candidate_when_none_opens() {
    let text = not_a_library();
    let dir = search_dir(
        "nothing-loadable",
        &[(&text, "libflex.so.1"), (&text, "libflex.so")],
    );
    run_child(
        "nothing-loadable",
        &[(CHILD_EXPECT, dir.as_os_str())],
        Some(&dir),
    );
}

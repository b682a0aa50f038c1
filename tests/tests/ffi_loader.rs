//! flex-sys's loader and flex-rt's backend against the real mock shared
//! library: the ABI check, the symbols, the configuration the library reads
//! from the environment, and runtime-creation failures. Every test runs in a
//! fresh process (`isolated`) with the `SPYRE_MOCK_*` variables it names and
//! no others.

use std::path::PathBuf;

use flex_rt::{Backend, DataFormat, HardwareBackend, HostBuffer, LaunchOptions, Status};
use flex_sys::{AbiVersion, FlexLibrary, LoadError};
use spyre_tests::ffi::backend;
use spyre_tests::isolated;
use spyre_tests::mock_cdylib;

/// The file the dynamic loader maps for the mock library.
fn canonical_library() -> PathBuf {
    std::fs::canonicalize(mock_cdylib()).expect("the library exists")
}

const V1_1: AbiVersion = AbiVersion { major: 1, minor: 1 };

#[test]
fn the_library_exports_flex_h_at_the_header_version() {
    isolated!(mock_cdylib; &[],
        || {
            // `open` checks every symbol of flex.h 1.1 (flex_sys::REQUIRED_SYMBOLS
            // and flex_sys::ABI_1_1_SYMBOLS).
            let library = FlexLibrary::open(mock_cdylib()).expect("open");
            assert_eq!(library.version(), V1_1);
            assert_eq!(library.path(), canonical_library());
            assert_eq!(library.status_string(4), "FLEX_ERROR_OUT_OF_MEMORY");
            assert_eq!(library.status_string(977), "FLEX_UNKNOWN_STATUS");
            let fresh = std::sync::Arc::clone(&library);
            let message = std::thread::spawn(move || fresh.last_error_message());
            assert_eq!(
                message.join().unwrap(),
                "",
                "no call has failed on a new thread"
            );
            // The same file through FLEX_RUNTIME_LIB's code path.
            let by_env = FlexLibrary::load_from(Some(mock_cdylib().into())).expect("load_from");
            assert_eq!(by_env.path(), library.path());
            let backend = HardwareBackend::from_library(library);
            assert_eq!(backend.device_count(), Ok(1));
            assert_eq!(
                backend.details(),
                vec![
                    ("library", canonical_library().display().to_string()),
                    ("abi_version", "1.1".to_owned()),
                ]
            );
        },
    );
}

/// The library is linked to stay loaded after its last `dlclose` (`-z
/// nodelete`): every thread that called it runs a function of it as it
/// exits, which must still be there. flex-sys's loader keeps every library
/// it has opened loaded anyway, so this looks at the flag itself, which a
/// C program that opens and closes the library relies on: `readelf -d`
/// (binutils, beside the C compiler that links the library) lists it among
/// the dynamic section's `FLAGS_1`.
#[cfg(target_os = "linux")]
#[test]
fn the_library_is_linked_to_stay_loaded_after_it_is_closed() {
    let output = std::process::Command::new("readelf")
        .arg("-d")
        .arg(mock_cdylib())
        .output()
        .expect("readelf (binutils, installed with the C compiler) runs");
    assert!(output.status.success(), "readelf failed: {output:?}");
    let dynamic = String::from_utf8_lossy(&output.stdout);
    let flags = dynamic
        .lines()
        .find(|line| line.contains("(FLAGS_1)"))
        .unwrap_or_else(|| panic!("no FLAGS_1 entry in:\n{dynamic}"));
    assert!(
        flags.split_whitespace().any(|flag| flag == "NODELETE"),
        "not linked -z nodelete: {flags}"
    );
}

/// The file of the C library loaded as `libm.so.6`, from the loader's
/// refusal (it exports no flex function).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn libm() -> PathBuf {
    match FlexLibrary::open("libm.so.6").unwrap_err() {
        LoadError::MissingSymbol { path, .. } => path,
        other => panic!("{other:?}"),
    }
}

/// Without `FLEX_RUNTIME_LIB`, a library the search finds under
/// `libflex.so.1` that is not a flex runtime (here the C library's libm,
/// through a link on `LD_LIBRARY_PATH`) is refused naming both the name it
/// was found under and its file (before: the file alone, which did not say
/// that the search had found it).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn a_library_the_search_finds_is_refused_naming_the_name_and_the_file() {
    let dir = std::env::temp_dir().join(format!("spyre-searched-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let link = dir.join("libflex.so.1");
    if !link.exists() {
        std::os::unix::fs::symlink(libm(), &link).unwrap();
    }
    isolated!(&[("LD_LIBRARY_PATH", dir.to_str().unwrap())], || {
        let err = FlexLibrary::load_from(None).unwrap_err();
        let LoadError::Searched { name, error } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(name, "libflex.so.1");
        assert!(
            matches!(&**error, LoadError::MissingSymbol { symbol: "flex_get_api_version", path, .. } if *path == libm()),
            "{error:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "the dynamic loader's search found libflex.so.1 (FLEX_RUNTIME_LIB is not set), but it cannot be used: {} does not export `flex_get_api_version`",
                libm().display()
            )),
            "{text}"
        );
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn another_major_version_is_refused_naming_both_versions() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_ABI_VERSION", "2.0")],
        || {
            let err = HardwareBackend::open(mock_cdylib()).unwrap_err();
            assert_eq!(
                err,
                LoadError::AbiMismatch {
                    expected: V1_1,
                    found: AbiVersion { major: 2, minor: 0 },
                    path: canonical_library(),
                }
            );
            let text = err.to_string();
            assert!(text.contains("implements flex ABI 2.0"), "{text}");
            assert!(text.contains("built for flex ABI 1.1"), "{text}");
            // Through FLEX_RUNTIME_LIB, the error also names the variable.
            let err = FlexLibrary::load_from(Some(mock_cdylib().into())).unwrap_err();
            assert!(
                matches!(
                    &err,
                    LoadError::Env {
                        variable: "FLEX_RUNTIME_LIB",
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("flex ABI 2.0"), "{err}");
        },
    );
}

#[test]
fn a_newer_minor_version_is_accepted() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_ABI_VERSION", "1.7")],
        || {
            let backend = backend();
            assert_eq!(
                backend.library().version(),
                AbiVersion { major: 1, minor: 7 }
            );
            assert!(
                backend
                    .details()
                    .contains(&("abi_version", "1.7".to_owned()))
            );
            let runtime = backend.create_runtime(0).expect("create_runtime");
            let stream = runtime.default_stream();
            let address = runtime.allocate(64).expect("allocate");
            let out = HostBuffer::zeroed(64);
            stream
                .launch_fill(&address, 5.0, DataFormat::Uint8, LaunchOptions::new())
                .unwrap();
            stream
                .launch_d2h(&address, &out, LaunchOptions::new())
                .unwrap();
            stream.synchronize().unwrap();
            assert_eq!(out.to_vec(), vec![5u8; 64]);
        },
    );
}

/// A malformed `SPYRE_MOCK_ABI_VERSION` is an error naming it, from the
/// runtime's creation: the library reports the header's version, so a
/// loader does not blame the library's ABI (before, it reported 0.0 and
/// the loader said to install another flex runtime).
#[test]
fn a_malformed_version_switch_is_refused_naming_it() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_ABI_VERSION", "1,1")],
        || {
            let backend = HardwareBackend::open(mock_cdylib()).expect("the library loads");
            assert_eq!(backend.library().version(), AbiVersion::CURRENT);
            let err = backend.create_runtime(0).unwrap_err();
            assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
            assert!(
                err.to_string().contains(
                    "SPYRE_MOCK_ABI_VERSION=\"1,1\" is not valid: expected MAJOR.MINOR"
                ),
                "{err}"
            );
        },
    );
}

#[test]
fn the_device_configuration_comes_from_the_environment() {
    isolated!(mock_cdylib; &[
            ("SPYRE_MOCK_DEVICES", "3"),
            ("SPYRE_MOCK_MEMORY_BYTES", "1048576"),
            ("SPYRE_MOCK_REGION_BYTES", "262144"),
        ],
        || {
            let backend = backend();
            assert_eq!(backend.device_count(), Ok(3));
            let runtime = backend.create_runtime(2).expect("device 2 exists");
            assert_eq!(runtime.logical_device(), 2);
            let err = backend.create_runtime(3).unwrap_err();
            assert_eq!(err.status(), Status::NO_DEVICE, "{err}");
            assert_eq!(err.call(), "flex_runtime_create");
            // 1 MiB of memory: one byte more does not fit, all of it does,
            // in four chunks of 256 KiB.
            let err = runtime.allocate((1 << 20) + 1).unwrap_err();
            assert_eq!(err.status(), Status::OUT_OF_MEMORY, "{err}");
            let all = runtime.allocate(1 << 20).expect("allocate all");
            let sizes: Vec<u64> = all.chunks().iter().map(|c| c.size).collect();
            assert_eq!(sizes, vec![262_144; 4]);
        },
    );
}

#[test]
fn runtime_creation_can_be_made_to_fail() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_FAIL_RUNTIME_CREATE", "1")],
        || {
            let backend = backend();
            assert_eq!(backend.device_count(), Ok(1));
            let err = backend.create_runtime(0).unwrap_err();
            assert_eq!(err.status(), Status::RUNTIME_FAILED, "{err}");
            assert_eq!(err.call(), "flex_runtime_create");
            assert_eq!(
                err.message(),
                "device 0 could not be opened (fault injected by SPYRE_MOCK_FAIL_RUNTIME_CREATE, set to a true value)"
            );
            // A device that does not exist is still NO_DEVICE.
            assert_eq!(
                backend.create_runtime(1).unwrap_err().status(),
                Status::NO_DEVICE
            );
        },
    );
}

#[test]
fn a_malformed_switch_fails_runtime_creation_naming_it() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_FAIL_LAUNCH", "often")],
        || {
            let err = backend().create_runtime(0).unwrap_err();
            assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
            assert!(
                err.message()
                    .contains("SPYRE_MOCK_FAIL_LAUNCH=\"often\" is not valid"),
                "{err}"
            );
        },
    );
}

#[test]
fn a_malformed_device_setting_fails_the_device_count_naming_it() {
    isolated!(mock_cdylib; &[("SPYRE_MOCK_ENGINES", "0")],
        || {
            let backend = backend();
            let err = backend.device_count().unwrap_err();
            assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
            assert_eq!(err.call(), "flex_get_device_count");
            assert!(
                err.message()
                    .contains("engines must be between 1 and 256, got 0"),
                "{err}"
            );
            assert!(err.message().contains("SPYRE_MOCK_ENGINES=\"0\""), "{err}");
            assert_eq!(
                backend.create_runtime(0).unwrap_err().status(),
                Status::INVALID_ARGUMENT
            );
        },
    );
}

#[test]
fn a_bad_setting_of_the_library_is_a_configuration_error_of_the_start() {
    let library = mock_cdylib().to_str().expect("a UTF-8 path").to_owned();
    isolated!(
        &[
            ("SPYRE_BACKEND", "hardware"),
            ("FLEX_RUNTIME_LIB", library.as_str()),
            ("SPYRE_MOCK_DEVICES", "0"),
        ],
        || {
            // The library refuses its own configuration (INVALID_ARGUMENT):
            // the stream layer reports the environment, not a device failure.
            let err = spyre_stream::start_runtime().unwrap_err();
            assert!(
                matches!(&err, spyre_stream::Error::BackendConfig(e) if e.status() == Status::INVALID_ARGUMENT),
                "{err:?}"
            );
            assert!(
                err.to_string().contains("SPYRE_MOCK_DEVICES=\"0\""),
                "{err}"
            );
        }
    );
}

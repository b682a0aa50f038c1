//! The conformance suite against a vendor flex library: the hardware-gated
//! tests.
//!
//! They run when `FLEX_RUNTIME_LIB` names a flex library, against that
//! library (loaded exactly as `HardwareBackend::load` does):
//!
//! ```text
//! FLEX_RUNTIME_LIB=/path/to/libflex.so.1 cargo test --workspace
//! ```
//!
//! Without it every case is reported as ignored, with the reason (the
//! build script sets `cfg(flex_vendor_library)` from the variable). With
//! `--ignored` but without `FLEX_RUNTIME_LIB`, or with a library that cannot
//! be loaded, every case fails: a missing library never passes. Only
//! the cases that hold for any flex library run (no software-device
//! kernels), one at a time across all test binaries (a `serial_test` file
//! lock), each on its own runtime on device 0.

use flex_rt::HardwareBackend;
use flex_sys::RUNTIME_LIB_ENV;
use spyre_tests::conformance::{Case, Profile};

fn run(name: &'static str, case: Case) {
    let Some(path) = std::env::var_os(RUNTIME_LIB_ENV) else {
        panic!(
            "{name}: {RUNTIME_LIB_ENV} is not set; the vendor conformance suite needs it to name a flex library"
        );
    };
    let backend = HardwareBackend::load().unwrap_or_else(|err| panic!("{name}: {err}"));
    println!(
        "{name}: vendor conformance against {} ({RUNTIME_LIB_ENV}={}, ABI {})",
        backend.library().path().display(),
        path.to_string_lossy(),
        backend.library().version()
    );
    case(&backend, &Profile::ANY_LIBRARY);
}

spyre_tests::conformance_tests! {
    #[cfg_attr(
        not(flex_vendor_library),
        ignore = "vendor conformance suite did not run: set FLEX_RUNTIME_LIB to a flex library to run it"
    )]
    // One at a time, across every test binary: a device may not allow
    // several runtimes at once.
    #[serial_test::file_serial(flex_device)]
    runner = run;
    suite = general;
}

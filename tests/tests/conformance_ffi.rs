//! The conformance suite against the software device as a shared library
//! (`libspyre_mock_capi.so`, built by `spyre_tests::mock_cdylib`), loaded by
//! flex-sys and driven through flex-rt's hardware backend (`HardwareBackend`). This
//! is the hardware path of the workspace, run without hardware.
//!
//! The library takes its configuration from `SPYRE_MOCK_*` environment
//! variables, so each case runs in a fresh process (`spyre_tests::isolated`)
//! with the variables of `spyre_tests::conformance::SOFTWARE_DEVICE`: the
//! same device the in-process suite runs on.

use flex_rt::HardwareBackend;
use spyre_tests::conformance::{Case, Profile, SOFTWARE_DEVICE};
use spyre_tests::{isolated, mock_cdylib};

fn run(name: &'static str, case: Case) {
    // Build (or find) the library here, once, so the child reuses it.
    let library = mock_cdylib();
    let env = SOFTWARE_DEVICE.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    isolated(name, &env, || {
        let backend = HardwareBackend::open(library)
            .unwrap_or_else(|err| panic!("cannot load {}: {err}", library.display()));
        case(&backend, &Profile::SOFTWARE_DEVICE);
    });
}

spyre_tests::conformance_tests! {
    runner = run;
    suite = software_device;
}

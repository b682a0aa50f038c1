//! The conformance suite against the software device as a shared library
//! (`libspyre_mock_capi.so`, built by `spyre_tests::mock_cdylib`), loaded by
//! flex-sys and driven through flex-rt's FFI backend (`HardwareBackend`). This
//! is the hardware path of the workspace, run without hardware.
//!
//! The library takes its configuration from `SPYRE_MOCK_*` environment
//! variables, so each case runs in a fresh process (`spyre_tests::isolated`)
//! with the variables of `spyre_tests::conformance::SOFTWARE_DEVICE`: the
//! same device the in-process suite runs on.

use flex_rt::HardwareBackend;
use spyre_tests::conformance::{
    Case, GENERAL_CASES, Profile, SOFTWARE_DEVICE, SOFTWARE_DEVICE_CASES, assert_instantiated,
};
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

spyre_tests::software_device_conformance_tests! {
    runner = run;
}

#[test]
fn every_case_is_instantiated() {
    assert_instantiated(CONFORMANCE_CASES, &[&GENERAL_CASES, &SOFTWARE_DEVICE_CASES]);
}

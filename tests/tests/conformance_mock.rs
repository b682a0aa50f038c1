//! The conformance suite against the software device in process
//! (`spyre_mock::MockSystem`), configured as
//! `spyre_tests::conformance::SOFTWARE_DEVICE`.

use spyre_tests::conformance::{
    Case, GENERAL_CASES, Profile, SOFTWARE_DEVICE, SOFTWARE_DEVICE_CASES, assert_instantiated,
};

fn run(_name: &'static str, case: Case) {
    let system = SOFTWARE_DEVICE.system();
    case(&system, &Profile::SOFTWARE_DEVICE);
}

spyre_tests::software_device_conformance_tests! {
    runner = run;
}

#[test]
fn every_case_is_instantiated() {
    assert_instantiated(CONFORMANCE_CASES, &[&GENERAL_CASES, &SOFTWARE_DEVICE_CASES]);
}

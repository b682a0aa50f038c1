//! The conformance suite against the software device in process
//! (`spyre_mock::MockSystem`), configured as
//! `spyre_tests::conformance::SOFTWARE_DEVICE`.

use spyre_tests::conformance::{Case, Profile, SOFTWARE_DEVICE};

fn run(_name: &'static str, case: Case) {
    let system = SOFTWARE_DEVICE.system();
    case(&system, &Profile::SOFTWARE_DEVICE);
}

spyre_tests::conformance_tests! {
    runner = run;
    suite = software_device;
}

//! The conformance suite against the software device in process
//! (`spyre_mock::MockSystem`), configured as
//! `spyre_tests::conformance::SOFTWARE_DEVICE`; the event cases run a second
//! time without device-side waits (`SOFTWARE_DEVICE_HOST_WAIT`, like
//! today's Spyre card).

use spyre_tests::conformance::{Case, Profile, SOFTWARE_DEVICE};

fn run(_name: &'static str, case: Case) {
    let system = SOFTWARE_DEVICE.system();
    case(&system, &Profile::SOFTWARE_DEVICE);
}

spyre_tests::conformance_tests! {
    runner = run;
    suite = software_device;
}

mod host_wait {
    use spyre_tests::conformance::{Case, Profile, SOFTWARE_DEVICE_HOST_WAIT};

    fn run(_name: &'static str, case: Case) {
        let system = SOFTWARE_DEVICE_HOST_WAIT.system();
        case(&system, &Profile::of(SOFTWARE_DEVICE_HOST_WAIT));
    }

    spyre_tests::conformance_tests! {
        runner = run;
        suite = events;
    }
}

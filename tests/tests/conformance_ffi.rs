//! The conformance suite against the software device as a shared library
//! (`libspyre_mock_capi.so`, built by `spyre_tests::mock_cdylib`), loaded by
//! flex-sys and driven through flex-rt's hardware backend (`HardwareBackend`). This
//! is the hardware path of the workspace, run without hardware.
//!
//! The library takes its configuration from `SPYRE_MOCK_*` environment
//! variables, so each case runs in a fresh process (`spyre_tests::isolated`)
//! with the variables of `spyre_tests::conformance::SOFTWARE_DEVICE`: the
//! same device the in-process suite runs on. The event cases run a second
//! time with `SPYRE_MOCK_DEVICE_SIDE_WAIT=0` (`SOFTWARE_DEVICE_HOST_WAIT`,
//! like today's Spyre card), and once more against the library reporting
//! ABI 1.0, where they must be refused as unsupported.

use flex_rt::HardwareBackend;
use spyre_tests::conformance::{Case, Profile, SOFTWARE_DEVICE, SoftwareDevice};
use spyre_tests::{isolated, mock_cdylib};

/// Runs `case` in a fresh process (test `name`) on the library configured
/// as `device`, with the `extra` variables, which `profile` describes.
fn run_on(
    name: &str,
    device: SoftwareDevice,
    extra: &[(&str, &str)],
    profile: Profile,
    case: Case,
) {
    // Build (or find) the library here, once, so the child reuses it.
    let library = mock_cdylib();
    let env = device.env();
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(extra);
    isolated(name, &env, || {
        let backend = HardwareBackend::open(library)
            .unwrap_or_else(|err| panic!("cannot load {}: {err}", library.display()));
        case(&backend, &profile);
    });
}

fn run(name: &'static str, case: Case) {
    run_on(name, SOFTWARE_DEVICE, &[], Profile::SOFTWARE_DEVICE, case);
}

spyre_tests::conformance_tests! {
    runner = run;
    suite = software_device;
}

mod host_wait {
    use spyre_tests::conformance::{Case, Profile, SOFTWARE_DEVICE_HOST_WAIT};

    fn run(name: &'static str, case: Case) {
        super::run_on(
            &format!("host_wait::{name}"),
            SOFTWARE_DEVICE_HOST_WAIT,
            &[],
            Profile::of(SOFTWARE_DEVICE_HOST_WAIT),
            case,
        );
    }

    spyre_tests::conformance_tests! {
        runner = run;
        suite = events;
    }
}

mod abi_1_0 {
    use spyre_tests::conformance::{Case, Profile, SOFTWARE_DEVICE};

    fn run(name: &'static str, case: Case) {
        super::run_on(
            &format!("abi_1_0::{name}"),
            SOFTWARE_DEVICE,
            &[("SPYRE_MOCK_ABI_VERSION", "1.0")],
            Profile {
                abi_1_0: true,
                ..Profile::SOFTWARE_DEVICE
            },
            case,
        );
    }

    spyre_tests::conformance_tests! {
        runner = run;
        suite = events;
    }
}

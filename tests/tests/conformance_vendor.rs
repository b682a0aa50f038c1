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
//! kernels), one at a time, each on its own runtime on device 0.

use std::sync::{Mutex, PoisonError};

use flex_rt::HardwareBackend;
use flex_sys::RUNTIME_LIB_ENV;
use spyre_tests::conformance::{Case, GENERAL_CASES, Profile, assert_instantiated};

/// Cases run one at a time: a device may not allow several runtimes at once.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run(name: &'static str, case: Case) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
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
    runner = run;
    cases = [
        device_count_and_missing_devices,
        streams_belong_to_the_runtime_and_report_their_priority,
        fifo_order_of_operations_and_completions,
        query_and_synchronize,
        h2d_d2h_round_trip,
        multi_chunk_round_trip,
        fill_in_every_format,
        later_operations_see_earlier_ones,
        bad_program_fails_the_stream_and_the_error_is_sticky,
        size_mismatch_is_invalid_argument_and_enqueues_nothing,
        memory_errors,
        completions_are_released_exactly_once,
        host_callback_panic_is_an_error_not_an_abort,
        dropping_the_runtime_completes_pending_work,
        launches_from_several_threads_are_serialized,
    ];
}

#[test]
fn every_general_case_is_instantiated() {
    assert_instantiated(CONFORMANCE_CASES, &[&GENERAL_CASES]);
}

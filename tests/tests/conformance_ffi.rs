//! The conformance suite against the software device as a shared library
//! (`libspyre_mock.so`, built by `spyre_tests::mock_cdylib`), loaded by
//! flex-sys and driven through flex-rt's FFI backend (`FlexBackend`). This
//! is the hardware path of the workspace, run without hardware.
//!
//! The library takes its configuration from `SPYRE_MOCK_*` environment
//! variables, so each case runs in a fresh process (`spyre_tests::isolated`)
//! with the variables of `spyre_tests::conformance::SOFTWARE_DEVICE`: the
//! same device the in-process suite runs on.

use flex_rt::FlexBackend;
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
        let backend = FlexBackend::open(library)
            .unwrap_or_else(|err| panic!("cannot load {}: {err}", library.display()));
        case(&backend, &Profile::SOFTWARE_DEVICE);
    });
}

spyre_tests::conformance_tests! {
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
        compute_axpy,
        compute_matmul,
        high_priority_work_starts_first,
        work_on_freed_memory_fails,
    ];
}

#[test]
fn every_case_is_instantiated() {
    assert_instantiated(CONFORMANCE_CASES, &[&GENERAL_CASES, &SOFTWARE_DEVICE_CASES]);
}

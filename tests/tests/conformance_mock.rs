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

//! Event benchmarks through the FFI path: the software device's shared
//! library loaded by flex-sys and driven by flex-rt's hardware backend; see
//! `events/common.rs` for the groups, their baselines and the targets.
//! Run with `cargo bench -p spyre-tests --bench events_ffi`.

use criterion::{Criterion, criterion_group, criterion_main};
use flex_rt::HardwareBackend;

#[path = "events/common.rs"]
mod common;

fn benches(c: &mut Criterion) {
    let library = HardwareBackend::open(spyre_tests::mock_cdylib()).expect("mock shared library");
    spyre_stream::set_backend(Box::new(library)).expect("backend");
    common::run(c, "ffi");
}

criterion_group!(events_ffi, benches);
criterion_main!(events_ffi);

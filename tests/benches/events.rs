//! Event benchmarks on the software device in process; see
//! `events/common.rs` for the groups, their baselines and the targets.
//! Run with `cargo bench -p spyre-tests --bench events`.

use criterion::{Criterion, criterion_group, criterion_main};

#[path = "events/common.rs"]
mod common;

fn benches(c: &mut Criterion) {
    spyre_stream::set_backend(Box::new(spyre_mock::MockSystem::default())).expect("backend");
    common::run(c, "in_process");
}

criterion_group!(events, benches);
criterion_main!(events);

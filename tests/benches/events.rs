//! Event benchmarks on the software device in process, configured by the
//! `SPYRE_MOCK_*` variables (for example `SPYRE_MOCK_SYNC_POLICY=blocking`,
//! under which `synchronize` sleeps in the kernel as an awaiting executor
//! does, instead of spinning 20 µs first); see `events/common.rs` for the
//! groups, their baselines and the targets. Run with
//! `cargo bench -p spyre-tests --bench events`.

use criterion::{Criterion, criterion_group, criterion_main};

#[path = "events/common.rs"]
mod common;

fn benches(c: &mut Criterion) {
    let system = spyre_mock::MockSystem::from_env().expect("SPYRE_MOCK_* configure the device");
    spyre_stream::set_backend(Box::new(system)).expect("backend");
    common::run(c, "in_process");
}

criterion_group!(events, benches);
criterion_main!(events);

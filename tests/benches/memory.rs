//! Device memory benchmarks on the software device in process, each member
//! timed round by round against the others (interleaved, each round
//! starting one member later):
//!
//! | member | measures |
//! |---|---|
//! | `buffer_1MiB` | `DeviceBuffer::<u8>::new` of 1 MiB and its drop, on one stream: a cached block taken and given back |
//! | `raw_1MiB` (baseline) | the runtime's own allocate and free of 1 MiB (`Runtime::allocate` / `free`, what the allocator saves) |
//! | `vec_1MiB` (baseline) | `Vec::<u8>::with_capacity(1 MiB)` and its drop on the host |
//!
//! Targets: a cached allocate + free ≥ 20× faster than the runtime's, and
//! within 5× of the host's `Vec`. Run with
//! `cargo bench -p spyre-tests --bench memory` (with
//! `SPYRE_MOCK_CHECK_REUSE=1` to see the use-after-free detector's cost).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use spyre_stream::{Device, DeviceBuffer};
use spyre_testkit::bench_interleaved;

const MIB: usize = 1 << 20;

fn benches(c: &mut Criterion) {
    let system = spyre_mock::MockSystem::from_env().expect("SPYRE_MOCK_* configure the device");
    spyre_stream::set_backend(Box::new(system)).expect("backend");
    let stream = spyre_stream::stream_from_pool(Device::CURRENT, 0).expect("stream");
    // Warm the cache: the first allocation takes a segment from the device.
    drop(DeviceBuffer::<u8>::new(stream, MIB).expect("buffer"));
    let runtime = spyre_stream::global_pool().expect("pool").runtime();
    let buffer = || {
        drop(black_box(
            DeviceBuffer::<u8>::new(stream, MIB).expect("buffer"),
        ))
    };
    let raw = || {
        let address = runtime.allocate(MIB as u64).expect("allocate");
        runtime.free(black_box(&address)).expect("free");
    };
    let vec = || drop(black_box(Vec::<u8>::with_capacity(MIB)));
    let mut group = c.benchmark_group("memory");
    bench_interleaved(
        &mut group,
        &[
            ("buffer_1MiB", &buffer),
            ("raw_1MiB", &raw),
            ("vec_1MiB", &vec),
        ],
    );
    group.finish();
}

criterion_group!(memory, benches);
criterion_main!(memory);

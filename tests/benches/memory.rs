//! Device memory benchmarks on the software device in process, each member
//! timed round by round against the others (interleaved, each round
//! starting one member later), in batches of [`BATCH`] calls timed as one,
//! so that the clock's own cost (tens of nanoseconds) is not in the
//! figures:
//!
//! | member | measures |
//! |---|---|
//! | `buffer_1MiB` | `DeviceBuffer::<u8>::new` of 1 MiB and its drop, on one stream: a cached block taken and given back |
//! | `raw_1MiB` (baseline) | the runtime's own allocate and free of 1 MiB (`Runtime::allocate` / `free`, what the allocator saves) |
//! | `raw_ffi_1MiB` (baseline) | the same through flex-rt's FFI backend on the software device's flex library (`flex_memory_allocate` / `flex_memory_free`, the calls a `hardware` build makes) |
//! | `vec_1MiB` (baseline) | `Vec::<u8>::with_capacity(1 MiB)` and its drop on the host |
//!
//! Targets: a cached allocate + free ≥ 20× faster than the runtime's, and
//! within 5× of the host's `Vec`. Run with
//! `cargo bench -p spyre-tests --bench memory` (with
//! `SPYRE_MOCK_CHECK_REUSE=1` to see the use-after-free detector's cost;
//! `raw_ffi_1MiB` is left out then, as the flex library refuses the
//! detector, which it cannot run).
//! The first run builds the software device's flex library, outside any
//! measurement.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use flex_rt::{Backend, HardwareBackend};
use spyre_stream::{Device, DeviceBuffer};
use spyre_testkit::{BatchedMember, bench_interleaved_batched};

const MIB: usize = 1 << 20;
/// Calls per timed batch.
const BATCH: u64 = 1000;

fn benches(c: &mut Criterion) {
    let system = spyre_mock::MockSystem::from_env().expect("SPYRE_MOCK_* configure the device");
    let through_the_library = !system.config().check_reuse();
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
    let ffi = through_the_library.then(|| {
        HardwareBackend::open(spyre_tests::mock_cdylib())
            .expect("flex library")
            .create_runtime(0)
            .expect("runtime")
    });
    let raw_ffi = || {
        let ffi = ffi.as_ref().expect("measured through the library");
        let address = ffi.allocate(MIB as u64).expect("allocate");
        ffi.free(black_box(&address)).expect("free");
    };
    let vec = || drop(black_box(Vec::<u8>::with_capacity(MIB)));
    // Nothing is left to wait for after a batch.
    let drain = || {};
    let mut group = c.benchmark_group("memory");
    let mut names = vec!["buffer_1MiB", "raw_1MiB"];
    let mut members: Vec<BatchedMember<'_>> = vec![(&buffer, &drain), (&raw, &drain)];
    if through_the_library {
        names.push("raw_ffi_1MiB");
        members.push((&raw_ffi, &drain));
    }
    names.push("vec_1MiB");
    members.push((&vec, &drain));
    bench_interleaved_batched(&mut group, BATCH, &names, &members);
    group.finish();
}

criterion_group!(memory, benches);
criterion_main!(memory);

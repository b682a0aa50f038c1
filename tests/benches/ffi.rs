//! The cost of the C boundary: the same stream calls through flex-rt's FFI
//! backend on the mock shared library, next to the in-process mock.
//!
//! Both sides are the software device with its default configuration,
//! reached through the same trait objects (`Box<dyn Runtime>`,
//! `&dyn Stream`): `in_process` is `MockSystem::create_runtime`, `ffi` is
//! `HardwareBackend::open(mock_cdylib())` → `create_runtime(0)`, so a call on
//! the `ffi` side crosses flex-rt's FFI layer (payload, submission lock,
//! status mapping), the C ABI, and the library's exports (handle lookup,
//! argument checks, `catch_unwind`) before reaching the same device code.
//! The baseline of every group is `in_process`; the difference is the
//! boundary.
//!
//! - `ffi_query`: [`Stream::query`] of an idle stream.
//! - `ffi_enqueue`: [`Stream::launch_host_callback`] of a no-op, timed in
//!   batches of [`BATCH`] with the stream synchronized after each batch,
//!   outside the timed region; the two sides' batches interleaved round by
//!   round.
//! - `ffi_round_trip`: launch of a no-op host callback, then
//!   [`Stream::synchronize`]; interleaved (below).
//! - `ffi_h2d_4KiB`: [`Stream::launch_h2d`] of 4 KiB, then `synchronize`;
//!   interleaved.
//!
//! The two microsecond-scale groups are *interleaved*: every round runs the
//! `in_process` and the `ffi` call once each, and each benchmark times only
//! its own (see `interleaved`). Their time is mostly thread wake-up
//! latency, which on a shared machine drifts by several times within
//! minutes; interleaving measures both sides over the same stretch of
//! time, so the difference is the boundary and not the drift.
//!
//! Run with `cargo bench -p spyre-tests --bench ffi`. The first run builds
//! the mock shared library (see `spyre_tests::mock_cdylib`), outside any
//! measurement.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flex_rt::{
    Backend, CompositeAddress, HardwareBackend, HostBuffer, LaunchOptions, Runtime, Stream,
    StreamMode, StreamPriority,
};
use spyre_mock::MockSystem;
use spyre_testkit::{BatchedMember, bench_interleaved, bench_interleaved_batched};

/// Launches timed back to back before the queue is drained, in `ffi_enqueue`.
const BATCH: u64 = 256;
/// Bytes per copy in `ffi_h2d_4KiB`.
const COPY_BYTES: usize = 4 << 10;

/// One side of the comparison: a runtime of one backend; each group uses a
/// fresh stream of it.
struct Side {
    name: &'static str,
    runtime: Box<dyn Runtime>,
}

impl Side {
    fn new(name: &'static str, backend: &dyn Backend) -> Self {
        let runtime = backend.create_runtime(0).expect("runtime");
        Self { name, runtime }
    }

    fn stream(&self) -> &dyn Stream {
        self.runtime
            .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
            .expect("stream")
    }
}

fn noop(stream: &dyn Stream) {
    stream
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .expect("launch");
}

fn sides() -> [Side; 2] {
    let mock = MockSystem::default();
    let library = HardwareBackend::open(spyre_tests::mock_cdylib()).expect("mock shared library");
    [Side::new("in_process", &mock), Side::new("ffi", &library)]
}

fn bench_query(c: &mut Criterion, sides: &[Side]) {
    let mut group = c.benchmark_group("ffi_query");
    for side in sides {
        let stream = side.stream();
        group.bench_function(side.name, |b| {
            b.iter(|| stream.query().expect("query"));
        });
    }
    group.finish();
}

fn bench_enqueue(c: &mut Criterion, sides: &[Side]) {
    let streams: Vec<&dyn Stream> = sides.iter().map(Side::stream).collect();
    let launches: Vec<Box<dyn Fn() + '_>> = streams
        .iter()
        .map(|&stream| -> Box<dyn Fn() + '_> { Box::new(move || noop(stream)) })
        .collect();
    let drains: Vec<Box<dyn Fn() + '_>> = streams
        .iter()
        .map(|&stream| -> Box<dyn Fn() + '_> {
            Box::new(move || stream.synchronize().expect("synchronize"))
        })
        .collect();
    let members: Vec<BatchedMember<'_>> = launches
        .iter()
        .zip(&drains)
        .map(|(launch, drain)| (&**launch, &**drain))
        .collect();
    let names: Vec<&str> = sides.iter().map(|side| side.name).collect();
    let mut group = c.benchmark_group("ffi_enqueue");
    bench_interleaved_batched(&mut group, BATCH, &names, &members);
    group.finish();
}

fn bench_round_trip(c: &mut Criterion, sides: &[Side]) {
    let streams: Vec<&dyn Stream> = sides.iter().map(Side::stream).collect();
    let ops: Vec<Box<dyn Fn() + '_>> = streams
        .iter()
        .map(|&stream| -> Box<dyn Fn() + '_> {
            Box::new(move || {
                noop(stream);
                stream.synchronize().expect("synchronize");
            })
        })
        .collect();
    let members: Vec<(&str, &dyn Fn())> = sides
        .iter()
        .zip(&ops)
        .map(|(side, op)| (side.name, &**op))
        .collect();
    let mut group = c.benchmark_group("ffi_round_trip");
    bench_interleaved(&mut group, &members);
    group.finish();
}

fn bench_h2d(c: &mut Criterion, sides: &[Side]) {
    let host = HostBuffer::from_vec((0..COPY_BYTES).map(|i| (i % 251) as u8).collect());
    let targets: Vec<(&dyn Stream, CompositeAddress)> = sides
        .iter()
        .map(|side| {
            let device = side
                .runtime
                .allocate(COPY_BYTES as u64)
                .expect("device memory");
            (side.stream(), device)
        })
        .collect();
    let ops: Vec<Box<dyn Fn() + '_>> = targets
        .iter()
        .map(|(stream, device)| -> Box<dyn Fn() + '_> {
            Box::new(|| {
                stream
                    .launch_h2d(&host, device, LaunchOptions::new())
                    .expect("h2d");
                stream.synchronize().expect("synchronize");
            })
        })
        .collect();
    let members: Vec<(&str, &dyn Fn())> = sides
        .iter()
        .zip(&ops)
        .map(|(side, op)| (side.name, &**op))
        .collect();
    let mut group = c.benchmark_group("ffi_h2d_4KiB");
    group.throughput(Throughput::Bytes(COPY_BYTES as u64));
    bench_interleaved(&mut group, &members);
    group.finish();
    for (side, (_, device)) in sides.iter().zip(&targets) {
        side.runtime.free(device).expect("free");
    }
}

fn benches(c: &mut Criterion) {
    let sides = sides();
    bench_query(c, &sides);
    bench_enqueue(c, &sides);
    bench_round_trip(c, &sides);
    bench_h2d(c, &sides);
}

criterion_group!(ffi, benches);
criterion_main!(ffi);

//! The event benchmarks, on whichever backend the process-wide pool runs
//! (the bench binaries `events` and `events_ffi` choose it), each beside
//! its baseline in the same run:
//!
//! | group | measures | baseline |
//! |---|---|---|
//! | `<side>_record` | `SpyreEvent::record` on an idle stream, batched, drained untimed | an empty launch (no-op host callback), the same way |
//! | `<side>_query` | `SpyreEvent::query` of a completed event | an empty launch, batched |
//! | `<side>_wait` | `SpyreStream::wait_event` between two idle streams (the event completed) | an empty launch, batched |
//! | `<side>_round_trip` | a no-op launch, then awaiting the stream (`synchronize_async`, `futures_executor::block_on`) or the event (`record` + `synchronize_async`) | the same launch, then blocking `synchronize`; interleaved |
//!
//! Targets (issue "Events"): record and query ≤ 2× an empty launch; an
//! await round trip within 1.5× of a blocking synchronize round trip.

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use spyre_stream::{Device, LaunchOptions, SpyreEvent, SpyreStream};
use spyre_testkit::{batched, bench_interleaved};

/// Operations timed back to back before the stream is drained.
const BATCH: u64 = 256;

fn noop(stream: SpyreStream) {
    stream
        .launch_host_callback(|| {}, LaunchOptions::new())
        .expect("launch");
}

fn drain(stream: SpyreStream) {
    stream.synchronize().expect("synchronize");
}

/// The empty-launch baseline of a batched group.
fn empty_launch(group: &mut BenchmarkGroup<'_, WallTime>, stream: SpyreStream) {
    group.bench_function("empty_launch", |b| {
        b.iter_custom(|iters| batched(iters, BATCH, || noop(stream), || drain(stream)))
    });
}

/// Runs every group on the pool's backend, naming groups after `side`.
pub fn run(c: &mut Criterion, side: &str) {
    let stream = spyre_stream::stream_from_pool(Device::CURRENT, 0).expect("stream");
    let other = spyre_stream::stream_from_pool(Device::CURRENT, 0).expect("stream");
    let event = SpyreEvent::new().expect("event");

    let mut group = c.benchmark_group(format!("{side}_record"));
    empty_launch(&mut group, stream);
    group.bench_function("record", |b| {
        b.iter_custom(|iters| {
            batched(
                iters,
                BATCH,
                || event.record(stream).expect("record"),
                || drain(stream),
            )
        })
    });
    group.finish();

    event.record(stream).expect("record");
    event.synchronize().expect("synchronize");
    let mut group = c.benchmark_group(format!("{side}_query"));
    empty_launch(&mut group, stream);
    group.bench_function("query_completed", |b| {
        b.iter(|| assert!(event.query().expect("query")))
    });
    group.finish();

    let mut group = c.benchmark_group(format!("{side}_wait"));
    empty_launch(&mut group, stream);
    group.bench_function("wait_idle", |b| {
        b.iter_custom(|iters| {
            batched(
                iters,
                BATCH,
                || other.wait_event(&event).expect("wait"),
                || drain(other),
            )
        })
    });
    group.finish();

    let synchronize = || {
        noop(stream);
        stream.synchronize().expect("synchronize");
    };
    let await_stream = || {
        noop(stream);
        let done = stream.synchronize_async().expect("future");
        futures_executor::block_on(done).expect("await");
    };
    let round_trip_event = SpyreEvent::new().expect("event");
    let await_event = || {
        noop(stream);
        round_trip_event.record(stream).expect("record");
        futures_executor::block_on(round_trip_event.synchronize_async()).expect("await");
    };
    let mut group = c.benchmark_group(format!("{side}_round_trip"));
    bench_interleaved(
        &mut group,
        &[
            ("synchronize", &synchronize),
            ("await_stream", &await_stream),
            ("await_event", &await_event),
        ],
    );
    group.finish();
}

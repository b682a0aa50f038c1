//! The event benchmarks, on whichever backend the process-wide pool runs
//! (the bench binaries `events` and `events_ffi` choose it), each beside
//! its baseline in the same run:
//!
//! | group | measures | baseline |
//! |---|---|---|
//! | `<side>_enqueue` | `SpyreEvent::record` on an idle stream (and `record_raw`: flex-rt's `Stream::record_event` with no completion, what the layers below cost); `SpyreStream::wait_event` between two idle streams (the event completed); `SpyreEvent::query` of a completed event | an empty launch (a no-op host callback) |
//! | `<side>_counters_snapshot` | `spyre_stream::counters()` with two streams counted | (none: its absolute cost) |
//! | `<side>_trace` | an empty launch with tracing on (`launch_traced`: an entry and a completion per launch) | the same with tracing off (`launch_untraced`: one relaxed load) |
//! | `<side>_round_trip` | a no-op launch, then awaiting the stream (`synchronize_async`, `futures_executor::block_on`) or the event (`record` + `synchronize_async`) | the same launch, then blocking `synchronize` |
//!
//! Every member of a group is timed round by round against the others
//! (interleaved: this machine class drifts several times within minutes).
//! Enqueueing members run in batches of [`BATCH`], each followed by an
//! untimed drain of the stream.
//!
//! Targets: record and query ≤ 2× an empty launch; an
//! await round trip within 1.5× of a blocking synchronize round trip.

use std::time::{Duration, Instant};

use criterion::Criterion;
use spyre_stream::{Device, LaunchOptions, SpyreEvent, SpyreStream};
use spyre_testkit::{BatchedMember, bench_interleaved, bench_interleaved_batched};

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

/// Times `iters` empty launches with tracing off (`traced == false`) or on,
/// in batches of [`BATCH`]: every round times a batch of each, one after
/// the other (the order alternating round by round), each drained untimed,
/// and adds up the time of the batches asked for.
fn trace_batches(iters: u64, traced: bool, stream: SpyreStream) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    let mut round = 0u64;
    while left > 0 {
        let n = left.min(BATCH);
        let order = if round.is_multiple_of(2) {
            [false, true]
        } else {
            [true, false]
        };
        for on in order {
            if on {
                spyre_stream::start_trace();
            }
            let start = Instant::now();
            for _ in 0..n {
                noop(stream);
            }
            let time = start.elapsed();
            drain(stream);
            if on {
                drop(spyre_stream::stop_trace());
            }
            if on == traced {
                total += time;
            }
        }
        round += 1;
        left -= n;
    }
    total
}

/// Runs every group on the pool's backend, naming groups after `side`.
pub fn run(c: &mut Criterion, side: &str) {
    let stream = spyre_stream::stream_from_pool(Device::CURRENT, 0).expect("stream");
    let other = spyre_stream::stream_from_pool(Device::CURRENT, 0).expect("stream");
    let recorded = SpyreEvent::new().expect("event");
    let completed = SpyreEvent::new().expect("event");
    completed.record(stream).expect("record");
    completed.synchronize().expect("synchronize");

    let pool = spyre_stream::global_pool().expect("pool");
    let handle = pool.resolve(stream).expect("handle");
    let raw_event = pool.runtime().create_event(false).expect("event");
    let empty_launch = || noop(stream);
    let record = || recorded.record(stream).expect("record");
    let record_raw = || handle.record_event(&*raw_event, None).expect("record");
    let wait_idle = || other.wait_event(&completed).expect("wait");
    let query_completed = || assert!(completed.query().expect("query"));
    let members: [(&str, &dyn Fn(), SpyreStream); 5] = [
        ("empty_launch", &empty_launch, stream),
        ("record", &record, stream),
        ("record_raw", &record_raw, stream),
        ("wait_idle", &wait_idle, other),
        ("query_completed", &query_completed, stream),
    ];
    let drains: Vec<Box<dyn Fn()>> = members
        .iter()
        .map(|&(_, _, s)| -> Box<dyn Fn()> { Box::new(move || drain(s)) })
        .collect();
    let ops: Vec<BatchedMember<'_>> = members
        .iter()
        .zip(&drains)
        .map(|(&(_, op, _), drain)| (op, &**drain))
        .collect();
    let names: Vec<&str> = members.iter().map(|&(name, _, _)| name).collect();
    let mut group = c.benchmark_group(format!("{side}_enqueue"));
    bench_interleaved_batched(&mut group, BATCH, &names, &ops);
    group.finish();

    let mut group = c.benchmark_group(format!("{side}_trace"));
    for (name, traced) in [("launch_untraced", false), ("launch_traced", true)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| trace_batches(iters, traced, stream))
        });
    }
    group.finish();

    // The counters' snapshot (launches above were counted on `stream` and
    // `other`).
    spyre_stream::enable_counters();
    noop(stream);
    noop(other);
    drain(stream);
    drain(other);
    c.bench_function(&format!("{side}_counters_snapshot"), |b| {
        b.iter(|| std::hint::black_box(spyre_stream::counters()))
    });

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

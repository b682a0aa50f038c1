//! The launch chokepoint's own cost: a launch of an empty host callback
//! through [`SpyreStream`] against the same launch on the stream's runtime
//! handle, over the no-op backend (`flex_rt::noop`: a launch runs its
//! callback and completion on the calling thread and returns, so no
//! device thread's timing mixes in; on the software device the
//! launching thread races its engines for the stream's inbox, which
//! moves these figures by more than the chokepoint costs).
//!
//! | member | measures |
//! |---|---|
//! | `launch/spyre_stream` | [`SpyreStream::launch_host_callback`]: the handle resolved through the process-wide pool (the fork and device checks, an acquire load of the slot), the stream's reuse-barrier word read (an acquire load), the instrumentation flags read (a relaxed load), then the runtime's launch |
//! | `launch/resolve_and_handle` | [`spyre_stream::global_pool`] and [`spyre_stream::StreamPool::resolve`], then the launch on the handle: the resolution's share |
//! | `launch/handle` (baseline) | [`flex_rt::Stream::launch_host_callback`] on the handle, resolved once beforehand |
//!
//! Each boxes the same empty closure. The members are interleaved batch
//! by batch, [`BATCH`] launches timed as one (the clock costs nothing per
//! launch).
//!
//! Run with `cargo bench -p spyre-tests --bench launch`.

use criterion::{Criterion, criterion_group, criterion_main};
use flex_rt::noop::NoopBackend;
use spyre_stream::{Device, LaunchOptions};
use spyre_testkit::bench_interleaved_batched;

/// Launches timed back to back.
const BATCH: u64 = 256;

fn benches(c: &mut Criterion) {
    spyre_stream::set_backend(Box::new(NoopBackend::new(1))).expect("backend");
    let stream = spyre_stream::stream_from_pool(Device::CURRENT, 0).expect("stream");
    let handle = spyre_stream::global_pool()
        .and_then(|pool| pool.resolve(stream))
        .expect("handle");
    let through_stream = || {
        stream
            .launch_host_callback(|| {}, LaunchOptions::new())
            .expect("launch")
    };
    let resolve_and_handle = || {
        spyre_stream::global_pool()
            .and_then(|pool| pool.resolve(stream))
            .expect("handle")
            .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .expect("launch")
    };
    let on_handle = || {
        handle
            .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
            .expect("launch")
    };
    // Every launch has completed when it returns.
    let nothing_to_drain = || {};
    let mut group = c.benchmark_group("launch");
    bench_interleaved_batched(
        &mut group,
        BATCH,
        &["spyre_stream", "resolve_and_handle", "handle"],
        &[
            (&through_stream, &nothing_to_drain),
            (&resolve_and_handle, &nothing_to_drain),
            (&on_handle, &nothing_to_drain),
        ],
    );
    group.finish();
}

criterion_group!(launch, benches);
criterion_main!(launch);

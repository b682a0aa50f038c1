//! Benchmarks of the stream pool over the in-process software device.
//!
//! Every group puts the pool call next to a baseline that does the least
//! work the call could possibly do, so the report can give a ratio:
//!
//! - `resolve/1_thread`: [`StreamPool::resolve`] of an assigned stream
//!   (device check, read lock, table load, unlock). Baseline
//!   `array_load/1_thread`: loading a handle from a plain
//!   `[Option<&dyn Stream>; 73]` table, the same table without the lock.
//! - `resolve/2_threads`: the same call timed on one thread while a second
//!   thread resolves in a loop concurrently, so both share the lock's cache
//!   line. Baseline `array_load/2_threads`: both threads load from the plain
//!   table.
//! - `assignment/{1,2}_threads`: [`StreamPool::stream_from_pool`] once every
//!   pool id has its handle (steady state: write lock, cursor update,
//!   unlock), alone and with a second thread assigning concurrently.
//!   Baseline `atomic_round_robin/{1,2}_threads`: a relaxed `fetch_add`
//!   modulo 32 on one shared counter, the cheapest thread-safe round robin.
//! - `synchronize_device/pool_69_idle`: [`StreamPool::synchronize_device`]
//!   with every stream created and idle (id 0, all 64 pool ids and the 4
//!   host-compute streams). Baseline `direct_69_idle`: calling
//!   [`Stream::synchronize`] on the same 69 handles in a loop, without the
//!   pool's snapshot. The two are interleaved: every round runs both once
//!   and each benchmark times only its own (see `interleaved`), so that on
//!   a shared machine both are measured over the same stretch of time.
//!
//! Run with `cargo bench -p spyre-stream --bench pool`.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flex_rt::Stream;
use spyre_mock::MockSystem;
use spyre_stream::{PoolConfig, SpyreStream, StreamId, StreamPool};
use spyre_testkit::bench_interleaved;

/// Size of the pool's handle table: ids 0..=72.
const TABLE_SLOTS: usize = 73;

/// Times `iters` calls of `timed` on this thread while `contend` runs in a
/// loop on a second thread. The second thread has started looping before
/// the clock starts and stops after it stops.
fn with_contender(iters: u64, contend: impl Fn() + Sync, mut timed: impl FnMut()) -> Duration {
    let stop = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                contend();
                started.store(true, Ordering::Relaxed);
            }
        });
        while !started.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
        let start = Instant::now();
        for _ in 0..iters {
            timed();
        }
        let elapsed = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        elapsed
    })
}

/// A pool with every pool id assigned (normal and high), plus the default
/// and host-compute streams from initialization.
fn full_pool(pool: &StreamPool<'_>) {
    for _ in 0..32 {
        pool.stream_from_pool(0).expect("normal stream");
        pool.stream_from_pool(-1).expect("high-priority stream");
    }
}

fn bench_resolve(c: &mut Criterion) {
    let system = MockSystem::default();
    let runtime = system.create_mock_runtime(0).expect("mock runtime");
    let pool = StreamPool::new(&runtime, PoolConfig::default()).expect("pool");
    full_pool(&pool);
    let stream = SpyreStream::from_parts(pool.device(), StreamId(5));
    let mut table: [Option<&dyn Stream>; TABLE_SLOTS] = [None; TABLE_SLOTS];
    for id in pool.mapped_ids() {
        let slot = usize::try_from(id.get()).expect("non-negative id");
        table[slot] = Some(
            pool.resolve(SpyreStream::from_parts(pool.device(), id))
                .unwrap(),
        );
    }
    let slot = 5usize;

    let mut group = c.benchmark_group("resolve");
    group.bench_function("array_load/1_thread", |b| {
        b.iter(|| black_box(&table)[black_box(slot)]);
    });
    group.bench_function("resolve/1_thread", |b| {
        b.iter(|| pool.resolve(black_box(stream)));
    });
    group.bench_function("array_load/2_threads", |b| {
        b.iter_custom(|iters| {
            with_contender(
                iters,
                || {
                    black_box(black_box(&table)[black_box(slot)]);
                },
                || {
                    black_box(black_box(&table)[black_box(slot)]);
                },
            )
        });
    });
    group.bench_function("resolve/2_threads", |b| {
        b.iter_custom(|iters| {
            with_contender(
                iters,
                || {
                    let _ = black_box(pool.resolve(black_box(stream)));
                },
                || {
                    let _ = black_box(pool.resolve(black_box(stream)));
                },
            )
        });
    });
    group.finish();
}

fn bench_assignment(c: &mut Criterion) {
    let system = MockSystem::default();
    let runtime = system.create_mock_runtime(0).expect("mock runtime");
    let pool = StreamPool::new(&runtime, PoolConfig::default()).expect("pool");
    full_pool(&pool);
    let cursor = AtomicUsize::new(0);
    let round_robin = || black_box(cursor.fetch_add(1, Ordering::Relaxed) % 32);

    let mut group = c.benchmark_group("assignment");
    group.bench_function("atomic_round_robin/1_thread", |b| b.iter(round_robin));
    group.bench_function("stream_from_pool/1_thread", |b| {
        b.iter(|| pool.stream_from_pool(black_box(0)));
    });
    group.bench_function("atomic_round_robin/2_threads", |b| {
        b.iter_custom(|iters| {
            with_contender(
                iters,
                || {
                    round_robin();
                },
                || {
                    round_robin();
                },
            )
        });
    });
    group.bench_function("stream_from_pool/2_threads", |b| {
        b.iter_custom(|iters| {
            with_contender(
                iters,
                || {
                    let _ = black_box(pool.stream_from_pool(black_box(0)));
                },
                || {
                    let _ = black_box(pool.stream_from_pool(black_box(0)));
                },
            )
        });
    });
    group.finish();
}

fn bench_synchronize_device(c: &mut Criterion) {
    let system = MockSystem::default();
    let runtime = system.create_mock_runtime(0).expect("mock runtime");
    let pool = StreamPool::new(&runtime, PoolConfig::default()).expect("pool");
    full_pool(&pool);
    let handles: Vec<&dyn Stream> = pool
        .mapped_ids()
        .into_iter()
        .map(|id| {
            pool.resolve(SpyreStream::from_parts(pool.device(), id))
                .unwrap()
        })
        .collect();
    assert_eq!(handles.len(), 69, "default + 64 pool + 4 host-compute");

    let direct = || {
        for handle in &handles {
            handle.synchronize().expect("idle stream");
        }
    };
    let through_pool = || pool.synchronize_device().expect("idle device");

    let mut group = c.benchmark_group("synchronize_device");
    bench_interleaved(
        &mut group,
        &[("direct_69_idle", &direct), ("pool_69_idle", &through_pool)],
    );
    group.finish();
}

criterion_group!(
    benches,
    bench_resolve,
    bench_assignment,
    bench_synchronize_device
);
criterion_main!(benches);

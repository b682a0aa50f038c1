//! Benchmarks of the stream pool over the in-process software device, each
//! beside its baselines, measured in the same run:
//!
//! - `resolve`: [`StreamPool::resolve`] of an assigned stream (device check,
//!   acquire load of a write-once slot), beside `array_load` (a handle from
//!   a plain `[Option<&dyn Stream>; 73]`, the least the call could do) and
//!   `cpp_shared_mutex` (torch-spyre's discipline re-implemented in C++:
//!   `std::shared_lock` on a `std::shared_mutex` and `find` in a
//!   `std::unordered_map<int64_t, Handle*>`; `benches/cpp/`, compiled with
//!   `-O2` by the build script).
//! - `assignment`: [`StreamPool::stream_from_pool`] once every pool id has
//!   its handle (the settled cursor: an acquire load and an atomic add),
//!   beside
//!   `atomic_round_robin` (a relaxed `fetch_add` modulo 32, the cheapest
//!   thread-safe round robin) and `cpp_shared_mutex` (`std::unique_lock`,
//!   cursor advance, lazy insert).
//! - `synchronize_device`: [`StreamPool::synchronize_device`] over the 69
//!   idle streams, beside calling [`Stream::synchronize`] on the same
//!   handles directly.
//!
//! The members of a group are interleaved round by round: each round runs
//! every member for a batch of calls and times each batch as a whole (the
//! clock costs nothing per call), because this machine class drifts 2–3×
//! within minutes. `…/2_threads` members run with a second thread doing the
//! same call concurrently, so both share the structure's cache lines.
//! `synchronize_device` is interleaved call by call.
//!
//! Run with `cargo bench -p spyre-tests --bench pool`.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use flex_rt::Stream;
use spyre_mock::MockSystem;
use spyre_stream::{PoolConfig, SpyreStream, StreamId, StreamPool};
use spyre_testkit::bench_interleaved;

/// torch-spyre's pool discipline in C++ (`benches/cpp/torch_spyre_pool.cpp`).
mod cpp {
    use std::ffi::c_void;

    // Built by the package's build script, which puts it on the search path.
    #[link(name = "torch_spyre_pool", kind = "static")]
    #[link(name = "stdc++")]
    unsafe extern "C" {
        fn cpp_pool_new() -> *mut c_void;
        fn cpp_pool_free(pool: *mut c_void);
        fn cpp_pool_resolve(pool: *const c_void, id: i64) -> *const c_void;
        fn cpp_pool_stream_from_pool(pool: *mut c_void, priority: i32) -> i64;
    }

    /// One C++ pool, freed on drop.
    pub struct Pool(*mut c_void);

    // SAFETY: the C++ pool guards all of its state with its shared_mutex;
    // every function above may be called from any thread at once.
    unsafe impl Send for Pool {}
    // SAFETY: as for `Send`: all access goes through the mutex.
    unsafe impl Sync for Pool {}

    impl Pool {
        pub fn new() -> Self {
            // SAFETY: no preconditions; returns a new pool that `Drop` frees.
            Self(unsafe { cpp_pool_new() })
        }

        /// `resolveRuntimeHandle`: the handle's address, or null.
        pub fn resolve(&self, id: i64) -> *const c_void {
            // SAFETY: `self.0` is a live pool (freed only in `Drop`).
            unsafe { cpp_pool_resolve(self.0, id) }
        }

        /// `getStreamFromPool`: the id handed out.
        pub fn stream_from_pool(&self, priority: i32) -> i64 {
            // SAFETY: `self.0` is a live pool; the C++ side locks it.
            unsafe { cpp_pool_stream_from_pool(self.0, priority) }
        }
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            // SAFETY: `self.0` came from `cpp_pool_new` and is freed once.
            unsafe { cpp_pool_free(self.0) }
        }
    }
}

/// Calls per member and round.
const ROUND: u64 = 20_000;

/// Times `iters` calls of `members[me]` in rounds of [`ROUND`] calls in
/// which every member runs its batch (only `members[me]`'s is timed, as a
/// whole, so the clock costs nothing per call). With `contended`, a second
/// thread runs the same call concurrently during each batch.
fn interleaved_rounds(
    iters: u64,
    me: usize,
    members: &[&(dyn Fn() + Sync)],
    contended: bool,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(ROUND);
        for (index, op) in members.iter().enumerate() {
            let elapsed = if contended {
                with_contender(n, op, op)
            } else {
                let start = Instant::now();
                for _ in 0..n {
                    op();
                }
                start.elapsed()
            };
            if index == me {
                total += elapsed;
            }
        }
        left -= n;
    }
    total
}

/// Benchmarks every `(name, op)` of `members` in `group` with
/// [`interleaved_rounds`], alone (`<name>/1_thread`) and contended
/// (`<name>/2_threads`).
fn bench_rounds<M: criterion::measurement::Measurement<Value = Duration>>(
    group: &mut criterion::BenchmarkGroup<'_, M>,
    members: &[(&str, &(dyn Fn() + Sync))],
) {
    let ops: Vec<&(dyn Fn() + Sync)> = members.iter().map(|&(_, op)| op).collect();
    for (contended, threads) in [(false, "1_thread"), (true, "2_threads")] {
        for (me, &(name, _)) in members.iter().enumerate() {
            group.bench_function(format!("{name}/{threads}"), |b| {
                b.iter_custom(|iters| interleaved_rounds(iters, me, &ops, contended))
            });
        }
    }
}

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
    let cpp = cpp::Pool::new();
    for _ in 0..32 {
        cpp.stream_from_pool(0);
        cpp.stream_from_pool(-1);
    }
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
    let array_load = || {
        black_box(black_box(&table)[black_box(slot)]);
    };
    let resolve = || {
        let _ = black_box(pool.resolve(black_box(stream)));
    };
    let cpp_resolve = || {
        black_box(cpp.resolve(black_box(5)));
    };

    let mut group = c.benchmark_group("resolve");
    bench_rounds(
        &mut group,
        &[
            ("array_load", &array_load),
            ("resolve", &resolve),
            ("cpp_shared_mutex", &cpp_resolve),
        ],
    );
    group.finish();
}

fn bench_assignment(c: &mut Criterion) {
    let system = MockSystem::default();
    let runtime = system.create_mock_runtime(0).expect("mock runtime");
    let pool = StreamPool::new(&runtime, PoolConfig::default()).expect("pool");
    full_pool(&pool);
    let cpp = cpp::Pool::new();
    for _ in 0..32 {
        cpp.stream_from_pool(0);
    }
    let cursor = AtomicUsize::new(0);
    let round_robin = || {
        black_box(cursor.fetch_add(1, Ordering::Relaxed) % 32);
    };
    // The stream goes into `black_box`, not the whole `Result`: a 64-byte
    // `Result` copied through `black_box`'s stack slot costs tens of moves
    // that a caller using `?` does not pay.
    let assign = || {
        black_box(pool.stream_from_pool(black_box(0)).ok());
    };
    let cpp_assign = || {
        black_box(cpp.stream_from_pool(black_box(0)));
    };

    let mut group = c.benchmark_group("assignment");
    bench_rounds(
        &mut group,
        &[
            ("atomic_round_robin", &round_robin),
            ("stream_from_pool", &assign),
            ("cpp_shared_mutex", &cpp_assign),
        ],
    );
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

//! Benchmarks of the software device: launches, round trips, throughput
//! across streams, the engines' own cost per operation, and copies.
//!
//! Every group puts the mock next to a baseline, so the report can give a
//! ratio. The baseline for launches is `Executor` below: the smallest
//! executor with the mock's shape (one mutex-protected FIFO, a condition
//! variable to wake workers, a completion counter with a condition
//! variable to wait on, two worker threads like the mock's two engines,
//! and the mock's wake-up policy), without per-stream queues, priorities,
//! errors or device memory.
//!
//! Groups whose operations take microseconds or more (`round_trip`,
//! `ops_throughput`, `drain`, `copy_1MiB`, `copy_64MiB`) are *interleaved*: every
//! round runs each member of the group once, in order, and each benchmark
//! times only its own member (see `interleaved`). On a shared machine the
//! thread wake-up latency and the memory bandwidth drift by several times
//! within minutes; interleaving measures a member and its baseline over
//! the same stretch of time, so their ratio stays meaningful. `enqueue` is
//! interleaved batch by batch (a batch timed as one, so the clock costs
//! nothing per launch); `copy_4KiB` is timed plainly, as two clock reads
//! per copy would distort it.
//!
//! - `enqueue`: one launch of an empty operation. `mock/host_callback` is
//!   [`Stream::launch_host_callback`] of a no-op on one stream; baseline
//!   `executor/submit` submits the same boxed no-op. Launches are timed in
//!   batches of [`BATCH`], the two members' batches interleaved round by
//!   round; the queue is drained (synchronized) after each batch, outside
//!   the timed region, so it never grows without bound.
//! - `round_trip` (interleaved): launch of an empty operation followed by
//!   a wait for it, `mock/launch_synchronize` (launch +
//!   [`Stream::synchronize`]) against `executor/submit_wait`.
//! - `ops_throughput` (interleaved): [`OPS`] no-op launches spread round
//!   robin over 1, 8 and 64 streams (`mock/streams/<n>`), then every stream
//!   synchronized; reported as operations per second. Baseline
//!   `executor/2_workers`: the same number of no-ops through the executor,
//!   then one wait.
//! - `drain` (interleaved, set-up untimed): the cost of running an
//!   operation without a launching thread beside it. [`DRAIN_OPS`] no-ops
//!   are queued round robin over 1, 8 and 64 streams
//!   (`mock/streams/<n>`) while every engine is held by a host callback on
//!   a stream of its own, untimed; the timed part releases the engines and
//!   synchronizes every stream. Baseline `executor/2_workers`: the same
//!   number of no-ops queued while both workers are held, then released
//!   and waited for. The held callbacks spin (yielding) on a flag, so the
//!   release wakes no thread; reported as operations per second.
//! - `copy_<size>` for 4 KiB, 1 MiB and 64 MiB (1 MiB and 64 MiB
//!   interleaved): `mock/h2d` and `mock/d2h` are one launch of the copy
//!   followed by `synchronize` (so the time includes the round trip);
//!   baseline `copy_from_slice` copies the same number of bytes between two
//!   host buffers on the calling thread. Reported as bytes per second.
//!
//! Run with `cargo bench -p spyre-mock --bench device`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flex_rt::{HostBuffer, LaunchOptions, Runtime, Stream, StreamMode, StreamPriority};
use parking_lot::{Condvar, Mutex};
use spyre_mock::{MockRuntime, MockStream, MockSystem};
use spyre_testkit::{bench_interleaved, bench_interleaved_batched, bench_interleaved_prepared};

/// Launches timed back to back before the queue is drained, in `enqueue`.
const BATCH: u64 = 256;
/// Operations per iteration of `ops_throughput`.
const OPS: usize = 1024;
/// Operations queued behind the held engines or workers in `drain`.
const DRAIN_OPS: usize = 16 * 1024;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct ExecState {
    queue: VecDeque<Job>,
    submitted: u64,
    completed: u64,
    /// The completed count the waiting threads wait for, the least of
    /// them; `None` while none waits. A worker wakes them only once the
    /// count reaches it, as the mock wakes a blocked `synchronize` only
    /// at the count it waits for.
    wake_at: Option<u64>,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<ExecState>,
    work: Condvar,
    done: Condvar,
}

/// The baseline executor: a locked FIFO served by worker threads.
struct Executor {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Executor {
    fn new(workers: usize) -> Self {
        let shared = Arc::new(Shared::default());
        let workers = (0..workers)
            .map(|_| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let mut state = shared.state.lock();
                    loop {
                        if let Some(job) = state.queue.pop_front() {
                            if !state.queue.is_empty() {
                                // More work: make sure an idle worker looks.
                                shared.work.notify_one();
                            }
                            parking_lot::MutexGuard::unlocked(&mut state, job);
                            state.completed += 1;
                            if state.wake_at.is_some_and(|at| state.completed >= at) {
                                state.wake_at = None;
                                shared.done.notify_all();
                            }
                        } else if state.stop {
                            break;
                        } else {
                            shared.work.wait(&mut state);
                        }
                    }
                })
            })
            .collect();
        Self { shared, workers }
    }

    /// Queues `job`; wakes a worker only when the queue was empty, as a
    /// launch on the mock wakes an engine only when it makes the first
    /// stream ready (a worker that takes a job and sees more wakes the next
    /// one, as an engine does).
    fn submit(&self, job: Job) {
        let mut state = self.shared.state.lock();
        let was_empty = state.queue.is_empty();
        state.queue.push_back(job);
        state.submitted += 1;
        drop(state);
        if was_empty {
            self.shared.work.notify_one();
        }
    }

    /// Waits until everything submitted so far has run.
    fn wait(&self) {
        let mut state = self.shared.state.lock();
        let target = state.submitted;
        while state.completed < target {
            state.wake_at = Some(state.wake_at.map_or(target, |at| at.min(target)));
            self.shared.done.wait(&mut state);
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.work.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// A runtime of the default configuration; `SPYRE_MOCK_*` variables, if
/// set, change it (for experiments; the reported numbers use none).
fn runtime() -> MockRuntime {
    MockSystem::from_env()
        .expect("SPYRE_MOCK_* variables")
        .create_mock_runtime(0)
        .expect("mock runtime")
}

fn new_stream(runtime: &MockRuntime) -> &MockStream {
    runtime
        .create_mock_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
        .expect("mock stream")
}

fn noop(stream: &MockStream) {
    stream
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .expect("launch");
}

fn bench_enqueue(c: &mut Criterion) {
    let runtime = runtime();
    let stream = new_stream(&runtime);
    let executor = Executor::new(2);

    let submit = || executor.submit(Box::new(|| {}));
    let wait = || executor.wait();
    let launch = || noop(stream);
    let synchronize = || stream.synchronize().expect("synchronize");
    let mut group = c.benchmark_group("enqueue");
    bench_interleaved_batched(
        &mut group,
        BATCH,
        &["executor/submit", "mock/host_callback"],
        &[(&submit, &wait), (&launch, &synchronize)],
    );
    group.finish();
}

fn bench_round_trip(c: &mut Criterion) {
    let runtime = runtime();
    let stream = new_stream(&runtime);
    let executor = Executor::new(2);

    let mut group = c.benchmark_group("round_trip");
    bench_interleaved(
        &mut group,
        &[
            ("executor/submit_wait", &|| {
                executor.submit(Box::new(|| {}));
                executor.wait();
            }),
            ("mock/launch_synchronize", &|| {
                noop(stream);
                stream.synchronize().expect("synchronize");
            }),
        ],
    );
    group.finish();
}

fn bench_ops_throughput(c: &mut Criterion) {
    let runtime = runtime();
    let streams: Vec<&MockStream> = (0..64).map(|_| new_stream(&runtime)).collect();
    let executor = Executor::new(2);

    let executor_ops = || {
        for _ in 0..OPS {
            executor.submit(Box::new(|| {}));
        }
        executor.wait();
    };
    let spread = |streams: &[&MockStream]| {
        for i in 0..OPS {
            noop(streams[i % streams.len()]);
        }
        for stream in streams {
            stream.synchronize().expect("synchronize");
        }
    };

    let mut group = c.benchmark_group("ops_throughput");
    group.throughput(Throughput::Elements(OPS as u64));
    bench_interleaved(
        &mut group,
        &[
            ("executor/2_workers", &executor_ops),
            ("mock/streams/1", &|| spread(&streams[..1])),
            ("mock/streams/8", &|| spread(&streams[..8])),
            ("mock/streams/64", &|| spread(&streams[..64])),
        ],
    );
    group.finish();
}

/// Holds the threads that run work: each held job counts itself started,
/// then spins (yielding) until released.
#[derive(Default)]
struct Hold {
    started: AtomicUsize,
    released: AtomicBool,
}

impl Hold {
    /// A job that holds the thread running it until [`Hold::release`].
    fn job(self: &Arc<Self>) -> Job {
        let hold = Arc::clone(self);
        Box::new(move || {
            hold.started.fetch_add(1, Ordering::SeqCst);
            while !hold.released.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
        })
    }

    /// Waits until `threads` held jobs have started.
    fn wait_started(&self, threads: usize) {
        while self.started.load(Ordering::SeqCst) < threads {
            std::thread::yield_now();
        }
    }

    fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

/// The hold of the member being set up and run. Released when dropped, so
/// that a panic while engines or workers are held unwinds instead of
/// waiting for them forever (declare it after what runs the held jobs).
struct CurrentHold(RefCell<Arc<Hold>>);

impl CurrentHold {
    fn new() -> Self {
        Self(RefCell::new(Arc::new(Hold::default())))
    }

    /// A fresh hold, made the current one.
    fn fresh(&self) -> Arc<Hold> {
        let fresh = Arc::new(Hold::default());
        *self.0.borrow_mut() = Arc::clone(&fresh);
        fresh
    }

    fn release(&self) {
        self.0.borrow().release();
    }
}

impl Drop for CurrentHold {
    fn drop(&mut self) {
        self.release();
    }
}

fn bench_drain(c: &mut Criterion) {
    let runtime = runtime();
    let streams: Vec<&MockStream> = (0..64).map(|_| new_stream(&runtime)).collect();
    let holders: Vec<&MockStream> = (0..runtime.engines())
        .map(|_| new_stream(&runtime))
        .collect();
    let executor = Executor::new(2);
    let hold = CurrentHold::new();

    let hold_workers = || {
        let fresh = hold.fresh();
        for _ in 0..2 {
            executor.submit(fresh.job());
        }
        fresh.wait_started(2);
        for _ in 0..DRAIN_OPS {
            executor.submit(Box::new(|| {}));
        }
    };
    let run_workers = || {
        hold.release();
        executor.wait();
    };
    let hold_engines = |streams: &[&MockStream]| {
        let fresh = hold.fresh();
        for holder in &holders {
            holder
                .launch_host_callback(fresh.job(), LaunchOptions::new())
                .expect("launch");
        }
        fresh.wait_started(holders.len());
        for i in 0..DRAIN_OPS {
            noop(streams[i % streams.len()]);
        }
    };
    let run_engines = |streams: &[&MockStream]| {
        hold.release();
        for stream in streams.iter().chain(&holders) {
            stream.synchronize().expect("synchronize");
        }
    };
    let (hold_1, run_1) = (
        || hold_engines(&streams[..1]),
        || run_engines(&streams[..1]),
    );
    let (hold_8, run_8) = (
        || hold_engines(&streams[..8]),
        || run_engines(&streams[..8]),
    );
    let (hold_64, run_64) = (|| hold_engines(&streams), || run_engines(&streams));

    let mut group = c.benchmark_group("drain");
    group.throughput(Throughput::Elements(DRAIN_OPS as u64));
    group.sample_size(20);
    bench_interleaved_prepared(
        &mut group,
        &[
            "executor/2_workers",
            "mock/streams/1",
            "mock/streams/8",
            "mock/streams/64",
        ],
        &[
            (&hold_workers, &run_workers),
            (&hold_1, &run_1),
            (&hold_8, &run_8),
            (&hold_64, &run_64),
        ],
    );
    group.finish();
}

fn bench_copies(c: &mut Criterion) {
    let runtime = runtime();
    let stream = new_stream(&runtime);
    for (label, size) in [
        ("4KiB", 4usize << 10),
        ("1MiB", 1 << 20),
        ("64MiB", 64 << 20),
    ] {
        let device = runtime.allocate(size as u64).expect("device memory");
        let pattern: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let host_src = HostBuffer::from_vec(pattern.clone());
        let host_dst = HostBuffer::zeroed(size);
        // Back the device memory before timing, so D2H reads real bytes,
        // and check that the bytes make the round trip.
        stream
            .launch_h2d(&host_src, &device, LaunchOptions::new())
            .expect("h2d");
        stream
            .launch_d2h(&device, &host_dst, LaunchOptions::new())
            .expect("d2h");
        stream.synchronize().expect("synchronize");
        assert!(
            host_dst.read()[..] == pattern[..],
            "the round trip kept the bytes"
        );
        let plain_dst = RefCell::new(vec![0u8; size]);
        let copy = || {
            black_box(&mut plain_dst.borrow_mut()[..]).copy_from_slice(black_box(&pattern[..]));
        };
        let h2d = || {
            stream
                .launch_h2d(&host_src, &device, LaunchOptions::new())
                .expect("h2d");
            stream.synchronize().expect("synchronize");
        };
        let d2h = || {
            stream
                .launch_d2h(&device, &host_dst, LaunchOptions::new())
                .expect("d2h");
            stream.synchronize().expect("synchronize");
        };

        let mut group = c.benchmark_group(format!("copy_{label}"));
        group.throughput(Throughput::Bytes(size as u64));
        if size >= 64 << 20 {
            group.sample_size(20);
        }
        let members: [(&str, &dyn Fn()); 3] = [
            ("copy_from_slice", &copy),
            ("mock/h2d", &h2d),
            ("mock/d2h", &d2h),
        ];
        if size < 1 << 20 {
            for (name, op) in members {
                group.bench_function(name, |b| b.iter(op));
            }
        } else {
            bench_interleaved(&mut group, &members);
        }
        group.finish();
        runtime.free(&device).expect("free");
    }
}

criterion_group!(
    benches,
    bench_enqueue,
    bench_round_trip,
    bench_ops_throughput,
    bench_drain,
    bench_copies
);
criterion_main!(benches);

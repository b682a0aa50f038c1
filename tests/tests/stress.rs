//! Stress: many threads doing thousands of random pool and stream operations
//! at once, then checking the invariants of the spec
//! (`stream-ownership-and-synchronization`) and of flex-rt's launch contract:
//!
//! - each stream id maps to exactly one handle for the whole run (every
//!   resolve records the handle's address; all are equal), and distinct ids
//!   map to distinct handles;
//! - a stream is created once per id: the runtime made exactly
//!   1 (default) + N (host-compute) + distinct pool ids streams;
//! - the round-robin cursor moves once per assignment: the ids handed out by
//!   each pool are exactly the first k entries of its round-robin sequence;
//! - every launch that returned `Ok` had its completion called exactly once,
//!   with `Ok`, in FIFO order per stream and thread, and every completion
//!   closure was dropped exactly once;
//! - after a stream (or the device) synchronizes, every completion launched
//!   on it before by the same thread has fired;
//! - nothing deadlocks: the workers run on their own threads and the test
//!   fails, rather than hangs, if they do not finish within 60 s.
//!
//! Deterministic per seed: `SPYRE_STRESS_SEED` (default fixed) and
//! `SPYRE_STRESS_OPS` (operations per worker, default 10 000; 5 000 for the
//! process-wide run) and `SPYRE_STRESS_ROUNDS` (fresh pools raced, default
//! 100) override the defaults.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use flex_rt::noop::NoopRuntime;
use flex_rt::program::KernelDescriptor;
use flex_rt::{CompositeAddress, DataFormat, HostBuffer, LaunchOptions, Stream};
use spyre_mock::{MockRuntime, MockSystem};
use spyre_stream::{
    Device, DeviceState, Error, PoolConfig, Result, SpyreStream, StreamErrorState, StreamGuard,
    StreamId, StreamPool,
};
use spyre_testkit::SplitMix64;
use spyre_tests::isolated;
use spyre_tests::reliability::{
    DropCounter, addr, bounded, env_count, ops_per_worker, run_bounded, seed,
};

const WORKERS: usize = 8;
const HOST_COMPUTE: usize = 4;
const LIMIT: Duration = Duration::from_secs(60);
/// f32 elements in each worker's device buffer.
const ELEMS: u64 = 64;
const BYTES: u64 = ELEMS * 4;
const PRIORITIES: [i32; 7] = [i32::MIN, -3, -1, 0, 1, 5, i32::MAX];

fn small_system() -> MockSystem {
    MockSystem::builder()
        .memory_bytes(1 << 20)
        .region_bytes(1 << 18)
        .build()
        .unwrap()
}

/// Which surface the workers drive: a `StreamPool` value, or the process-wide
/// free functions and `SpyreStream` methods.
#[derive(Clone, Copy)]
enum Api {
    Pool(&'static StreamPool<'static>),
    Global,
}

impl Api {
    fn pool(self) -> &'static StreamPool<'static> {
        match self {
            Api::Pool(pool) => pool,
            Api::Global => spyre_stream::global_pool().expect("the runtime has started"),
        }
    }

    fn assign(self, priority: i32) -> Result<SpyreStream> {
        match self {
            Api::Pool(pool) => pool.stream_from_pool(priority),
            Api::Global => spyre_stream::stream_from_pool(Device::CURRENT, priority),
        }
    }

    fn host_compute(self) -> Result<SpyreStream> {
        match self {
            Api::Pool(pool) => pool.host_compute_stream(),
            Api::Global => spyre_stream::host_compute_stream(Device::CURRENT),
        }
    }

    fn host_compute_by_id(self, id: i64) -> Result<SpyreStream> {
        match self {
            Api::Pool(pool) => pool.host_compute_stream_by_id(id),
            Api::Global => spyre_stream::host_compute_stream_by_id(id, Device::CURRENT),
        }
    }

    fn default_stream(self) -> Result<SpyreStream> {
        match self {
            Api::Pool(pool) => pool.default_stream(),
            Api::Global => spyre_stream::default_stream(Device::CURRENT),
        }
    }

    fn default_stream_handle(self) -> Result<&'static dyn Stream> {
        match self {
            Api::Pool(pool) => pool.default_stream_handle(),
            Api::Global => spyre_stream::default_stream_handle(Device::CURRENT),
        }
    }

    fn synchronize_device(self) -> Result<()> {
        match self {
            Api::Pool(pool) => pool.synchronize_device(),
            Api::Global => spyre_stream::synchronize_device(Device::CURRENT),
        }
    }

    fn query(self, s: SpyreStream) -> Result<bool> {
        match self {
            Api::Pool(pool) => Ok(pool.resolve(s)?.query()?),
            Api::Global => s.query(),
        }
    }

    fn synchronize(self, s: SpyreStream) -> Result<()> {
        match self {
            Api::Pool(pool) => Ok(pool.resolve(s)?.synchronize()?),
            Api::Global => s.synchronize(),
        }
    }

    fn error(self, s: SpyreStream) -> Result<StreamErrorState> {
        match self {
            Api::Pool(pool) => Ok(StreamErrorState::of(pool.resolve(s)?)?),
            Api::Global => s.error(),
        }
    }

    fn launch(self, s: SpyreStream, op: Launch, options: LaunchOptions) -> Result<()> {
        let raw = |pool: &StreamPool<'static>| pool.resolve(s);
        match (self, op) {
            (Api::Pool(p), Launch::H2d(src, dst)) => Ok(raw(p)?.launch_h2d(&src, &dst, options)?),
            (Api::Pool(p), Launch::D2h(src, dst)) => Ok(raw(p)?.launch_d2h(&src, &dst, options)?),
            (Api::Pool(p), Launch::Fill(dst, v)) => {
                Ok(raw(p)?.launch_fill(&dst, v, DataFormat::Fp32, options)?)
            }
            (Api::Pool(p), Launch::Compute(program)) => {
                Ok(raw(p)?.launch_compute(&program, options)?)
            }
            (Api::Pool(p), Launch::Callback(f)) => {
                Ok(raw(p)?.launch_host_callback(Box::new(f), options)?)
            }
            (Api::Global, Launch::H2d(src, dst)) => s.launch_h2d(&src, &dst, options),
            (Api::Global, Launch::D2h(src, dst)) => s.launch_d2h(&src, &dst, options),
            (Api::Global, Launch::Fill(dst, v)) => {
                s.launch_fill(&dst, v, DataFormat::Fp32, options)
            }
            (Api::Global, Launch::Compute(program)) => s.launch_compute(&program, options),
            (Api::Global, Launch::Callback(f)) => s.launch_host_callback(f, options),
        }
    }
}

/// One launch of each kind flex-rt has.
enum Launch {
    H2d(HostBuffer, CompositeAddress),
    D2h(CompositeAddress, HostBuffer),
    Fill(CompositeAddress, f64),
    Compute(CompositeAddress),
    Callback(Box<dyn FnOnce() + Send>),
}

/// Counters shared by every worker of a run.
#[derive(Default)]
struct Tally {
    launched_ok: AtomicU64,
    completions: AtomicU64,
    completion_errors: AtomicU64,
    order_violations: AtomicU64,
    callbacks_launched: AtomicU64,
    callbacks_run: AtomicU64,
    drops: DropCounter,
}

/// Launch bookkeeping of one worker on one stream.
#[derive(Default)]
struct Lane {
    /// Launches of this worker on this stream that returned `Ok`.
    launched: u64,
    /// Completions of those launches that have fired.
    done: Arc<AtomicU64>,
}

/// What a worker saw, for the checks across workers.
#[derive(Default)]
struct Report {
    /// Stream id → (handle address, runtime stream id) of every resolve.
    handles: HashMap<i64, (usize, u64)>,
    normal: Vec<i64>,
    high: Vec<i64>,
    host_compute: Vec<i64>,
    ops: u64,
}

struct Worker {
    api: Api,
    index: usize,
    rng: SplitMix64,
    ctx: String,
    tally: Arc<Tally>,
    data: CompositeAddress,
    program: CompositeAddress,
    known: Vec<SpyreStream>,
    lanes: HashMap<i64, Lane>,
    /// The thread's current stream as this worker last set it (global surface).
    current: SpyreStream,
    report: Report,
}

impl Worker {
    fn new(api: Api, index: usize, seed: u64, tally: Arc<Tally>) -> Self {
        let mut rng = SplitMix64::fork(seed, index as u64);
        let ctx = format!("worker {index} (SPYRE_STRESS_SEED={seed:#x})");
        // The first call may start the runtime (global surface), racing the
        // other workers' first calls.
        let first_priority = *rng.pick(&PRIORITIES);
        let first = api.assign(first_priority).unwrap();
        let default = api.default_stream().unwrap();
        let runtime = api.pool().runtime();
        let data = runtime.allocate(BYTES).unwrap();
        let program = runtime.allocate(128).unwrap();
        let value = index as f32 + 1.0;
        let descriptor = KernelDescriptor::fill(ELEMS, value, data.start());
        api.launch(
            default,
            Launch::H2d(
                HostBuffer::from_vec(descriptor.to_bytes().to_vec()),
                program.clone(),
            ),
            LaunchOptions::new(),
        )
        .unwrap();
        api.synchronize(default).unwrap();
        let mut worker = Self {
            api,
            index,
            rng,
            ctx,
            tally,
            data,
            program,
            known: vec![default],
            lanes: HashMap::new(),
            current: default,
            report: Report::default(),
        };
        worker.record_assignment(first, first_priority);
        worker
    }

    fn remember(&mut self, s: SpyreStream) {
        if !self.known.contains(&s) {
            self.known.push(s);
        }
    }

    fn record_assignment(&mut self, s: SpyreStream, priority: i32) {
        let id = s.id().get();
        let ctx = &self.ctx;
        assert_eq!(s.device_index(), self.api.pool().device(), "{ctx}");
        if priority < 0 {
            assert!(
                (33..=64).contains(&id),
                "{ctx}: priority {priority} gave {id}"
            );
            self.report.high.push(id);
        } else {
            assert!(
                (1..=32).contains(&id),
                "{ctx}: priority {priority} gave {id}"
            );
            self.report.normal.push(id);
        }
        self.remember(s);
    }

    fn any_known(&mut self) -> SpyreStream {
        *self.rng.pick(&self.known)
    }

    fn resolve(&mut self, s: SpyreStream) {
        let handle = self.api.pool().resolve(s).unwrap();
        let seen = (addr(handle), handle.id());
        let first = *self.report.handles.entry(s.id().get()).or_insert(seen);
        assert_eq!(
            first, seen,
            "{}: stream {s} resolved to two different handles",
            self.ctx
        );
    }

    fn launch_random(&mut self, s: SpyreStream) {
        let kind = self.rng.below(5);
        let op = match kind {
            0 => {
                let bytes = (0..BYTES).map(|i| (i as u8) ^ (self.index as u8)).collect();
                Launch::H2d(HostBuffer::from_vec(bytes), self.data.clone())
            }
            1 => Launch::D2h(self.data.clone(), HostBuffer::zeroed(BYTES as usize)),
            2 => Launch::Fill(self.data.clone(), self.rng.below(100) as f64),
            3 => Launch::Compute(self.program.clone()),
            _ => {
                let tally = Arc::clone(&self.tally);
                Launch::Callback(Box::new(move || {
                    tally.callbacks_run.fetch_add(1, Ordering::SeqCst);
                }))
            }
        };
        let lane = self.lanes.entry(s.id().get()).or_default();
        let seq = lane.launched;
        let done = Arc::clone(&lane.done);
        let tally = Arc::clone(&self.tally);
        let token = self.tally.drops.token();
        let options = LaunchOptions::new()
            .pipeline_barrier(self.rng.one_in(4))
            .on_complete(move |result| {
                tally.completions.fetch_add(1, Ordering::SeqCst);
                if result.is_err() {
                    tally.completion_errors.fetch_add(1, Ordering::SeqCst);
                }
                if done.fetch_add(1, Ordering::SeqCst) != seq {
                    tally.order_violations.fetch_add(1, Ordering::SeqCst);
                }
                drop(token);
            });
        if let Err(e) = self.api.launch(s, op, options) {
            panic!("{}: launch kind {kind} on {s} was refused: {e}", self.ctx);
        }
        lane.launched += 1;
        self.tally.launched_ok.fetch_add(1, Ordering::SeqCst);
        if kind == 4 {
            self.tally.callbacks_launched.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Every completion this worker launched on `id` has fired.
    fn check_lane_drained(&self, id: i64, after: &str) {
        if let Some(lane) = self.lanes.get(&id) {
            assert_eq!(
                lane.done.load(Ordering::SeqCst),
                lane.launched,
                "{}: after {after}, completions on stream {id} are missing",
                self.ctx
            );
        }
    }

    fn step(&mut self) {
        let api = self.api;
        match self.rng.below(100) {
            0..6 => {
                let priority = *self.rng.pick(&PRIORITIES);
                let s = api.assign(priority).unwrap();
                self.record_assignment(s, priority);
            }
            6..9 => {
                let s = api.host_compute().unwrap();
                let id = s.id().get();
                assert!((65..65 + HOST_COMPUTE as i64).contains(&id), "{}", self.ctx);
                self.report.host_compute.push(id);
                self.remember(s);
            }
            9..11 => {
                let id = 65 + self.rng.below(HOST_COMPUTE as u64) as i64;
                let s = api.host_compute_by_id(id).unwrap();
                assert_eq!(s.id(), StreamId(id), "{}", self.ctx);
                self.remember(s);
            }
            11..13 => {
                let s = api.default_stream().unwrap();
                assert_eq!(s.id(), StreamId::DEFAULT, "{}", self.ctx);
                let handle = api.default_stream_handle().unwrap();
                self.resolve(s);
                assert_eq!(
                    self.report.handles[&0].0,
                    addr(handle),
                    "{}: default_stream_handle differs from resolve(0)",
                    self.ctx
                );
            }
            13..25 => {
                let s = self.any_known();
                self.resolve(s);
            }
            25..67 => {
                let s = self.any_known();
                self.launch_random(s);
            }
            67..72 => {
                let s = self.any_known();
                api.query(s)
                    .unwrap_or_else(|e| panic!("{}: query {s}: {e}", self.ctx));
            }
            72..76 => {
                let s = self.any_known();
                api.synchronize(s)
                    .unwrap_or_else(|e| panic!("{}: synchronize {s}: {e}", self.ctx));
                self.check_lane_drained(s.id().get(), "synchronizing the stream");
            }
            76..78 => {
                api.synchronize_device()
                    .unwrap_or_else(|e| panic!("{}: synchronize_device: {e}", self.ctx));
                for &id in self.lanes.keys() {
                    self.check_lane_drained(id, "synchronize_device");
                }
            }
            78..82 => {
                let s = self.any_known();
                assert_eq!(
                    api.error(s).unwrap(),
                    StreamErrorState::Success,
                    "{}",
                    self.ctx
                );
            }
            _ => match api {
                Api::Pool(_) => {
                    let s = self.any_known();
                    self.launch_random(s);
                }
                Api::Global => self.current_stream_op(),
            },
        }
        self.report.ops += 1;
    }

    /// Sets or scopes the thread's current stream, launches on it, and checks
    /// that the current stream is exactly what this thread made it.
    fn current_stream_op(&mut self) {
        let current = || spyre_stream::current_stream(Device::CURRENT).unwrap();
        assert_eq!(
            current(),
            self.current,
            "{}: current stream drifted",
            self.ctx
        );
        let s = self.any_known();
        if self.rng.one_in(2) {
            let previous = spyre_stream::set_current_stream(s).unwrap();
            assert_eq!(previous, self.current, "{}", self.ctx);
            self.current = s;
            assert_eq!(current(), s, "{}", self.ctx);
        } else {
            let guard = StreamGuard::new(s).unwrap();
            assert_eq!(guard.previous(), self.current, "{}", self.ctx);
            assert_eq!(current(), s, "{}", self.ctx);
            for _ in 0..self.rng.below(3) {
                self.launch_random(current());
            }
            if self.rng.one_in(2) {
                let inner_stream = self.any_known();
                let inner = StreamGuard::new(inner_stream).unwrap();
                assert_eq!(inner.previous(), s, "{}", self.ctx);
                self.launch_random(current());
                drop(inner);
                assert_eq!(current(), s, "{}: inner guard did not restore", self.ctx);
            }
            drop(guard);
            assert_eq!(
                current(),
                self.current,
                "{}: guard did not restore",
                self.ctx
            );
        }
    }

    /// Ends the run: drains this worker's work, checks a computed result,
    /// and hands over what it saw.
    fn finish(mut self) -> Report {
        let api = self.api;
        api.synchronize_device().unwrap();
        for &id in self.lanes.keys() {
            self.check_lane_drained(id, "the final synchronize_device");
        }
        // A value this worker computes alone: fill, run its fill kernel,
        // read back, in FIFO order on one stream.
        let s = self.any_known();
        let out = HostBuffer::zeroed(BYTES as usize);
        api.launch(
            s,
            Launch::Fill(self.data.clone(), -7.0),
            LaunchOptions::new(),
        )
        .unwrap();
        api.launch(
            s,
            Launch::Compute(self.program.clone()),
            LaunchOptions::new(),
        )
        .unwrap();
        api.launch(
            s,
            Launch::D2h(self.data.clone(), out.clone()),
            LaunchOptions::new(),
        )
        .unwrap();
        api.synchronize(s).unwrap();
        let expected: Vec<u8> = (0..ELEMS)
            .flat_map(|_| (self.index as f32 + 1.0).to_le_bytes())
            .collect();
        assert_eq!(
            out.to_vec(),
            expected,
            "{}: the fill kernel's output",
            self.ctx
        );
        if let Api::Global = api {
            assert_eq!(
                spyre_stream::current_stream(Device::CURRENT).unwrap(),
                self.current,
                "{}: another thread changed this thread's current stream",
                self.ctx
            );
        }
        self.report
    }
}

/// The first `count` ids of a round robin over `first..first+len`, sorted.
fn round_robin_prefix(first: i64, len: i64, count: usize) -> Vec<i64> {
    let mut ids: Vec<i64> = (0..count as i64).map(|i| first + i % len).collect();
    ids.sort_unstable();
    ids
}

/// Checks the invariants across every worker's report and the pool.
fn check_run(api: Api, reports: &[Report], tally: &Tally, seed: u64) {
    let ctx = format!("SPYRE_STRESS_SEED={seed:#x}");
    let pool = api.pool();

    // Each id → one handle, and distinct ids → distinct handles.
    let mut handles: HashMap<i64, (usize, u64)> = HashMap::new();
    for report in reports {
        for (&id, &seen) in &report.handles {
            let first = *handles.entry(id).or_insert(seen);
            assert_eq!(first, seen, "{ctx}: id {id} had two handles across threads");
        }
    }
    let distinct: BTreeSet<usize> = handles.values().map(|(a, _)| *a).collect();
    assert_eq!(
        distinct.len(),
        handles.len(),
        "{ctx}: two ids share a handle"
    );

    // The cursors moved exactly once per assignment.
    let gather = |f: fn(&Report) -> &Vec<i64>| -> Vec<i64> {
        let mut all: Vec<i64> = reports.iter().flat_map(|r| f(r).iter().copied()).collect();
        all.sort_unstable();
        all
    };
    let normal = gather(|r| &r.normal);
    let high = gather(|r| &r.high);
    let host_compute = gather(|r| &r.host_compute);
    assert_eq!(
        normal,
        round_robin_prefix(1, 32, normal.len()),
        "{ctx}: normal pool"
    );
    assert_eq!(
        high,
        round_robin_prefix(33, 32, high.len()),
        "{ctx}: high pool"
    );
    assert_eq!(
        host_compute,
        round_robin_prefix(65, HOST_COMPUTE as i64, host_compute.len()),
        "{ctx}: host-compute round robin"
    );

    // The table holds exactly the default, host-compute and assigned ids.
    let assigned: BTreeSet<i64> = normal.iter().chain(&high).copied().collect();
    let expected: BTreeSet<i64> = [0]
        .into_iter()
        .chain(assigned.iter().copied())
        .chain(65..65 + HOST_COMPUTE as i64)
        .collect();
    let mapped: BTreeSet<i64> = pool.mapped_ids().iter().map(|id| id.get()).collect();
    assert_eq!(mapped, expected, "{ctx}: mapped ids");

    // One runtime stream per mapped id, none made and dropped on the side:
    // the mock numbers its streams 0, 1, 2, … in creation order.
    let mut runtime_ids: Vec<u64> = mapped
        .iter()
        .map(|&id| {
            let handle = pool
                .resolve(SpyreStream::from_parts(pool.device(), StreamId(id)))
                .unwrap();
            if let Some(&(a, _)) = handles.get(&id) {
                assert_eq!(a, addr(handle), "{ctx}: id {id} changed handle at the end");
            }
            handle.id()
        })
        .collect();
    runtime_ids.sort_unstable();
    assert_eq!(
        runtime_ids,
        (0..mapped.len() as u64).collect::<Vec<_>>(),
        "{ctx}: streams created"
    );

    // Every Ok launch completed once, Ok, in order; every closure dropped once.
    api.synchronize_device().unwrap();
    let launched = tally.launched_ok.load(Ordering::SeqCst);
    assert!(launched > 0);
    assert_eq!(
        tally.completions.load(Ordering::SeqCst),
        launched,
        "{ctx}: completions"
    );
    assert_eq!(tally.completion_errors.load(Ordering::SeqCst), 0, "{ctx}");
    assert_eq!(tally.order_violations.load(Ordering::SeqCst), 0, "{ctx}");
    assert_eq!(
        tally.drops.get(),
        launched,
        "{ctx}: completion closures dropped"
    );
    assert_eq!(
        tally.callbacks_run.load(Ordering::SeqCst),
        tally.callbacks_launched.load(Ordering::SeqCst),
        "{ctx}: host callbacks run"
    );
    assert!(!pool.runtime().has_stream_error().unwrap(), "{ctx}");
}

fn workers(
    api: Api,
    seed: u64,
    ops: usize,
    tally: &Arc<Tally>,
) -> Vec<Box<dyn FnOnce() -> Report + Send>> {
    (0..WORKERS)
        .map(|index| {
            let tally = Arc::clone(tally);
            Box::new(move || {
                let mut worker = Worker::new(api, index, seed, tally);
                for _ in 0..ops {
                    worker.step();
                }
                worker.finish()
            }) as Box<dyn FnOnce() -> Report + Send>
        })
        .collect()
}

#[test]
fn eight_threads_of_random_operations_on_one_pool_keep_every_invariant() {
    let seed = seed();
    let ops = ops_per_worker(10_000);
    let runtime: &'static MockRuntime =
        Box::leak(Box::new(small_system().create_mock_runtime(0).unwrap()));
    let pool: &'static StreamPool<'static> = Box::leak(Box::new(
        StreamPool::new(runtime, PoolConfig::new(HOST_COMPUTE, false).unwrap()).unwrap(),
    ));
    let api = Api::Pool(pool);
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let reports = run_bounded("pool-stress", LIMIT, workers(api, seed, ops, &tally));
    eprintln!(
        "pool stress: {WORKERS} workers x {ops} ops, {} launches, seed {seed:#x}, {:?}",
        tally.launched_ok.load(Ordering::SeqCst),
        started.elapsed()
    );
    assert_eq!(
        reports.iter().map(|r| r.ops).sum::<u64>(),
        (WORKERS * ops) as u64
    );
    check_run(api, &reports, &tally, seed);
    // The mock's own count: default + host-compute + distinct pool ids.
    let pool_ids: BTreeSet<i64> = reports
        .iter()
        .flat_map(|r| r.normal.iter().chain(&r.high).copied())
        .collect();
    assert_eq!(runtime.stream_count(), 1 + HOST_COMPUTE + pool_ids.len());
    // Every handle is the runtime's own stream of that id.
    for id in pool.mapped_ids() {
        let handle = pool.resolve(SpyreStream::from_parts(0, id)).unwrap();
        let own = runtime.mock_stream(handle.id()).unwrap();
        assert_eq!(addr(handle), addr(own), "id {id}");
    }
}

/// Many fresh pools, each raced from its first call by eight threads released
/// together: initialization, the first assignment of each id, and resolves
/// all collide. Per round: the ids follow the round robin, each id has one
/// handle, and the runtime made one stream per mapped id.
#[test]
fn fresh_pools_race_initialization_assignment_and_resolution() {
    let seed = seed();
    let rounds = env_count("SPYRE_STRESS_ROUNDS", 100);
    bounded("fresh-pools", LIMIT, move || {
        for round in 0..rounds {
            race_one_fresh_pool(seed, round);
        }
    });
}

fn race_one_fresh_pool(seed: u64, round: usize) {
    let ctx = format!("round {round} (SPYRE_STRESS_SEED={seed:#x})");
    // Stream creation takes a while (the mock's is nearly instant), so that
    // the threads racing a fresh pool really overlap with the creations
    // (each under its id's creation lock).
    let runtime = NoopRuntime::new(0).with_creation_delay(Duration::from_micros(200));
    let pool = StreamPool::new(&runtime, PoolConfig::new(HOST_COMPUTE, false).unwrap()).unwrap();
    let barrier = Barrier::new(WORKERS);
    let reports: Vec<Report> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..WORKERS)
            .map(|index| {
                let (pool, barrier, ctx) = (&pool, &barrier, &ctx);
                scope.spawn(move || {
                    let mut rng = SplitMix64::fork(seed ^ round as u64, index as u64);
                    let mut report = Report::default();
                    barrier.wait();
                    for step in 0..24 {
                        // The first operation after the barrier always starts
                        // or observes initialization, so that the eight
                        // threads collide on it.
                        let kind = if step == 0 {
                            *rng.pick(&[0, 2, 4, 5])
                        } else {
                            rng.below(7)
                        };
                        fresh_pool_op(pool, &mut rng, &mut report, ctx, kind);
                        report.ops += 1;
                    }
                    report
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    check_round(&pool, &runtime, &reports, &ctx);
}

/// Ids that initialization maps, all in one step.
const INIT_IDS: [i64; 5] = [0, 65, 66, 67, 68];

fn fresh_pool_op(
    pool: &StreamPool<'_>,
    rng: &mut SplitMix64,
    report: &mut Report,
    ctx: &str,
    kind: u64,
) {
    // Initialization is atomic: once any of its ids resolves, all do.
    let all_init_ids_resolve = |why: &str| {
        for id in INIT_IDS {
            if let Err(e) = pool.resolve(SpyreStream::from_parts(0, StreamId(id))) {
                panic!("{ctx}: {why}, but id {id} does not resolve: {e}");
            }
        }
    };
    match kind {
        0 => {
            pool.initialize().unwrap();
            all_init_ids_resolve("initialize returned");
        }
        1 | 2 => {
            let priority = *rng.pick(&PRIORITIES);
            let s = pool.stream_from_pool(priority).unwrap();
            let id = s.id().get();
            if priority < 0 {
                report.high.push(id);
            } else {
                report.normal.push(id);
            }
        }
        3 => {
            let s = pool.host_compute_stream().unwrap();
            report.host_compute.push(s.id().get());
        }
        4 => {
            let id = if rng.one_in(2) {
                *rng.pick(&INIT_IDS)
            } else {
                rng.below(70) as i64
            };
            match pool.resolve(SpyreStream::from_parts(0, StreamId(id))) {
                Ok(handle) => {
                    let seen = (addr(handle), handle.id());
                    let first = *report.handles.entry(id).or_insert(seen);
                    assert_eq!(first, seen, "{ctx}: id {id}");
                    if INIT_IDS.contains(&id) {
                        all_init_ids_resolve(&format!("id {id} resolved"));
                    }
                }
                Err(Error::NoHandle {
                    id: StreamId(i), ..
                }) if i == id => {}
                Err(other) => panic!("{ctx}: resolve {id}: {other}"),
            }
        }
        5 => {
            assert_eq!(pool.default_stream().unwrap().id(), StreamId::DEFAULT);
            all_init_ids_resolve("default_stream returned");
        }
        _ => pool.synchronize_device().unwrap(),
    }
}

fn check_round(pool: &StreamPool<'_>, runtime: &NoopRuntime, reports: &[Report], ctx: &str) {
    let mut final_handles: HashMap<i64, (usize, u64)> = HashMap::new();
    for id in pool.mapped_ids() {
        let handle = pool.resolve(SpyreStream::from_parts(0, id)).unwrap();
        final_handles.insert(id.get(), (addr(handle), handle.id()));
    }
    for report in reports {
        for (id, seen) in &report.handles {
            assert_eq!(
                final_handles.get(id),
                Some(seen),
                "{ctx}: id {id} changed handle"
            );
        }
    }
    let mut normal: Vec<i64> = reports.iter().flat_map(|r| r.normal.clone()).collect();
    let mut high: Vec<i64> = reports.iter().flat_map(|r| r.high.clone()).collect();
    let mut host: Vec<i64> = reports
        .iter()
        .flat_map(|r| r.host_compute.clone())
        .collect();
    normal.sort_unstable();
    high.sort_unstable();
    host.sort_unstable();
    assert_eq!(normal, round_robin_prefix(1, 32, normal.len()), "{ctx}");
    assert_eq!(high, round_robin_prefix(33, 32, high.len()), "{ctx}");
    assert_eq!(
        host,
        round_robin_prefix(65, HOST_COMPUTE as i64, host.len()),
        "{ctx}"
    );
    let assigned: BTreeSet<i64> = normal.iter().chain(&high).copied().collect();
    let initialized = pool.is_initialized();
    let expected: BTreeSet<i64> = if initialized {
        [0].into_iter()
            .chain(assigned.iter().copied())
            .chain(65..65 + HOST_COMPUTE as i64)
            .collect()
    } else {
        BTreeSet::new()
    };
    assert_eq!(
        final_handles.keys().copied().collect::<BTreeSet<_>>(),
        expected,
        "{ctx}"
    );
    let created = if initialized {
        1 + HOST_COMPUTE + assigned.len()
    } else {
        1
    };
    assert_eq!(runtime.stream_count(), created, "{ctx}: streams created");
}

/// The same workload through the process-wide free functions, the current
/// stream and `StreamGuard`, in a fresh process (`SPYRE_BACKEND=mock`); the
/// workers' first calls race to start the runtime.
#[test]
fn process_wide_stress_through_the_free_functions_and_the_current_stream() {
    let seed = seed();
    let seed_text = seed.to_string();
    let ops = ops_per_worker(5_000).to_string();
    isolated!(
        &[
            ("SPYRE_BACKEND", "mock"),
            ("SPYRE_MOCK_MEMORY_BYTES", "1048576"),
            ("SPYRE_MOCK_REGION_BYTES", "262144"),
            ("TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS", "4"),
            ("SPYRE_STRESS_SEED", &seed_text),
            ("SPYRE_STRESS_OPS", &ops),
        ],
        || {
            let seed = spyre_tests::reliability::seed();
            let ops = ops_per_worker(0);
            assert_eq!(spyre_stream::device_state(), DeviceState::NotInitialized);
            let tally = Arc::new(Tally::default());
            let started = Instant::now();
            let reports = run_bounded(
                "global-stress",
                LIMIT,
                workers(Api::Global, seed, ops, &tally),
            );
            eprintln!(
                "process-wide stress: {WORKERS} workers x {ops} ops, {} launches, seed {seed:#x}, {:?}",
                tally.launched_ok.load(Ordering::SeqCst),
                started.elapsed()
            );
            check_run(Api::Global, &reports, &tally, seed);
            assert_eq!(spyre_stream::device_state(), DeviceState::Ok);
            assert_eq!(
                spyre_stream::runtime_info().unwrap().host_compute_streams,
                HOST_COMPUTE
            );
        },
    );
}

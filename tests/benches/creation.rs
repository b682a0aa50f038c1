//! The pool while a slow stream creation is in flight: the worst latency of
//! [`StreamPool::resolve`] and of [`StreamPool::stream_from_pool`] handing
//! out ids whose streams exist, while another thread's assignment creates a
//! fresh high-priority stream that takes 10 ms (a runtime whose creation
//! sleeps), beside the same calls with no creation in flight. The two
//! phases alternate, 10 ms each, for 16 rounds (16 fresh ids), in one run.
//!
//! Run with `cargo bench -p spyre-tests --bench creation`.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flex_rt::StreamPriority;
use flex_rt::noop::NoopRuntime;
use spyre_stream::{PoolConfig, SpyreStream, StreamPool};

/// How long one stream creation takes once armed.
const CREATION: Duration = Duration::from_millis(10);
/// Creations timed (fresh high-priority ids: at most 32).
const ROUNDS: usize = 16;

/// Every call's latency, in nanoseconds.
#[derive(Default)]
struct Latencies {
    resolve: Vec<u64>,
    assignment: Vec<u64>,
}

impl Latencies {
    fn print(&mut self, phase: &str) {
        println!("{phase} ({} calls of each):", self.resolve.len());
        for (call, nanos) in [
            ("resolve", &mut self.resolve),
            ("assignment", &mut self.assignment),
        ] {
            nanos.sort_unstable();
            let at = |q: f64| nanos[((nanos.len() - 1) as f64 * q) as usize];
            println!(
                "  {call:<10} median {:>5} ns   99.99% {:>6} ns   worst {:>7.1} µs",
                at(0.5),
                at(0.9999),
                at(1.0) as f64 / 1e3
            );
        }
    }
}

/// Times a resolve of `stream` and an assignment from the normal pool
/// (every id of which has its stream) again and again until `done`.
fn measure(
    pool: &StreamPool<'_>,
    stream: SpyreStream,
    seen: &mut Latencies,
    done: impl Fn() -> bool,
) {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    while !done() {
        let start = Instant::now();
        black_box(pool.resolve(stream).expect("resolve"));
        let resolved = Instant::now();
        black_box(pool.stream_from_pool(0).expect("assignment"));
        let assigned = Instant::now();
        seen.resolve.push(nanos(resolved - start));
        seen.assignment.push(nanos(assigned - resolved));
    }
}

fn main() {
    static ARMED: AtomicBool = AtomicBool::new(false);
    let runtime: &'static NoopRuntime = Box::leak(Box::new(
        NoopRuntime::new(0).with_creation_hook(Box::new(|priority| {
            if priority == StreamPriority::High && ARMED.load(Ordering::Relaxed) {
                std::thread::sleep(CREATION);
            }
        })),
    ));
    let pool = StreamPool::new(runtime, PoolConfig::default()).expect("pool");
    pool.initialize().expect("initialize");
    let stream = pool.stream_from_pool(0).expect("normal stream");
    for _ in 1..32 {
        pool.stream_from_pool(0).expect("normal stream");
    }
    ARMED.store(true, Ordering::Relaxed);

    let (mut idle, mut during) = (Latencies::default(), Latencies::default());
    let mut creations = Duration::ZERO;
    for _ in 0..ROUNDS {
        let until = Instant::now() + CREATION;
        measure(&pool, stream, &mut idle, || Instant::now() >= until);
        let finished = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let start = Instant::now();
                pool.stream_from_pool(-1)
                    .expect("fresh high-priority stream");
                creations += start.elapsed();
                finished.store(true, Ordering::Release);
            });
            measure(&pool, stream, &mut during, || {
                finished.load(Ordering::Acquire)
            });
        });
    }
    println!(
        "{ROUNDS} creations of a fresh high-priority stream, {:.1} ms each on average",
        creations.as_secs_f64() * 1e3 / ROUNDS as f64
    );
    idle.print("no creation in flight");
    during.print("during a creation");
}

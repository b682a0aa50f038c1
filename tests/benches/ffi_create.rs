//! Stream creation through the flex library while other threads call it:
//! the latency of [`Runtime::create_stream`] on the main thread while
//! [`READERS`] threads per side query streams of the same side in a loop,
//! the `in_process` software device beside the `ffi` side (flex-rt's FFI
//! backend on the mock shared library), one creation of each side per
//! round, for [`ROUNDS`] rounds: both sides under the same load, over the
//! same stretch of time.
//!
//! With more busy threads than CPUs (twelve querying threads on a 2-CPU
//! machine), a querying thread is often switched out in the middle of a
//! call: a creation that waited for every call in flight would wait for
//! the scheduler to run that thread again. The main thread is switched out
//! too, in either side's creations: the longer a creation, the likelier.
//! The `ffi` time is all of flex-rt's `create_stream` through the library
//! (its own lock and stream list as well as the library's create), and it
//! grows over the run: each creation copies the library's handle table,
//! which gains an entry per stream (about 400 by the end), so the
//! percentiles depend on [`ROUNDS`].
//!
//! Run with `cargo bench -p spyre-tests --bench ffi_create`. The first run
//! builds the mock shared library (see `spyre_tests::mock_cdylib`), outside
//! any measurement.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flex_rt::{Backend, HardwareBackend, Runtime, StreamMode, StreamPriority};
use spyre_mock::MockSystem;

/// Querying threads per side.
const READERS: usize = 6;
/// Creations timed per side.
const ROUNDS: usize = 400;

fn create(runtime: &dyn Runtime) -> Duration {
    let start = Instant::now();
    runtime
        .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
        .expect("stream");
    start.elapsed()
}

fn print(side: &str, mut times: Vec<Duration>) {
    times.sort_unstable();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    println!(
        "{side:<10} median {:>8.1} µs   99% {:>8.1} µs   worst {:>8.1} µs",
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

/// Tells the querying threads to stop when dropped: also when a creation
/// panics, or the scope would wait for them for ever.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn main() {
    let mock = MockSystem::default();
    let library = HardwareBackend::open(spyre_tests::mock_cdylib()).expect("mock shared library");
    let sides: [(&str, Box<dyn Runtime>); 2] = [
        ("in_process", mock.create_runtime(0).expect("runtime")),
        ("ffi", library.create_runtime(0).expect("runtime")),
    ];
    let stop = AtomicBool::new(false);
    let mut times: [Vec<Duration>; 2] = Default::default();
    std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        for (_, runtime) in &sides {
            let stream = runtime
                .create_stream(StreamPriority::Normal, StreamMode::StrictOrdering, false)
                .expect("stream");
            for _ in 0..READERS {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        stream.query().expect("query");
                    }
                });
            }
        }
        for _ in 0..ROUNDS {
            for ((_, runtime), times) in sides.iter().zip(&mut times) {
                times.push(create(&**runtime));
            }
        }
    });
    println!(
        "stream creation with {READERS} threads per side querying, {ROUNDS} of each side, interleaved:"
    );
    for ((side, _), times) in sides.iter().zip(times) {
        print(side, times);
    }
}

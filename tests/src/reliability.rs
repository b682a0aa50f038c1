//! What the reliability tests (`stress.rs`, `faults.rs`, `bad_input.rs`)
//! share: the seed of a run, a time-bounded runner that turns a hang into a
//! test failure, counters for launches and completions, a mock backend that
//! lets a test reach the runtime the process-wide pool runs on, an
//! independent reading of integers, and a panic hook that keeps deliberate
//! panics quiet.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use flex_rt::{Backend, Runtime, Stream};
use spyre_mock::{MockRuntime, MockSystem};

/// The base seed: `SPYRE_STRESS_SEED` (decimal or `0x` hex), or a fixed
/// default when it is unset or empty.
pub fn seed() -> u64 {
    const DEFAULT: u64 = 0x5EED_5EED_2024_0001;
    match flex_rt::env::var("SPYRE_STRESS_SEED") {
        Some(raw) => {
            let raw = raw.trim();
            let parsed = match raw.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => raw.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("SPYRE_STRESS_SEED={raw:?} is not a u64: {e}"))
        }
        None => DEFAULT,
    }
}

/// Operations per worker: `SPYRE_STRESS_OPS` or `default`.
pub fn ops_per_worker(default: usize) -> usize {
    env_count("SPYRE_STRESS_OPS", default)
}

/// A count from the environment variable `name`, or `default` when it is
/// unset or empty.
pub fn env_count(name: &str, default: usize) -> usize {
    flex_rt::env::var(name)
        .map(|raw| {
            raw.parse()
                .unwrap_or_else(|e| panic!("{name}={raw:?} is not a count: {e}"))
        })
        .unwrap_or(default)
}

/// Runs every worker on its own thread and waits for all of them for at most
/// `limit` in total. A worker that panics fails the test with its panic; a
/// worker that has not finished by then fails the test with a message (the
/// stuck threads are left behind, so the test fails instead of hanging CI).
pub fn run_bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    workers: Vec<Box<dyn FnOnce() -> T + Send>>,
) -> Vec<T> {
    let count = workers.len();
    let (tx, rx) = mpsc::channel();
    for (index, work) in workers.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(format!("{what}-{index}"))
            .spawn(move || {
                let outcome = catch_unwind(AssertUnwindSafe(work));
                let _ = tx.send((index, outcome));
            })
            .expect("a worker thread can be spawned");
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let mut results: Vec<Option<T>> = (0..count).map(|_| None).collect();
    for finished in 0..count {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((index, Ok(value))) => results[index] = Some(value),
            Ok((index, Err(panic))) => {
                eprintln!("{what}: worker {index} panicked");
                resume_unwind(panic)
            }
            Err(_) => {
                let stuck: Vec<usize> = (0..count).filter(|&i| results[i].is_none()).collect();
                panic!(
                    "{what}: {} of {count} workers (indices {stuck:?}) did not finish within \
                     {limit:?} ({finished} did): a deadlock or a lost wake-up",
                    count - finished
                );
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every worker reported"))
        .collect()
}

/// Runs one body on a worker thread, bounded as [`run_bounded`].
pub fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    run_bounded(what, limit, vec![Box::new(body)])
        .pop()
        .expect("one worker")
}

/// The address of a handle, to compare handles across threads.
pub fn addr(handle: &dyn Stream) -> usize {
    (handle as *const dyn Stream).cast::<()>() as usize
}

/// Counts drops of the values it hands out: put one into a closure to learn
/// that the closure was released.
#[derive(Clone, Debug, Default)]
pub struct DropCounter(Arc<AtomicU64>);

/// Increments its counter when dropped.
#[derive(Debug)]
pub struct DropToken(Arc<AtomicU64>);

impl DropCounter {
    /// A token that counts one drop.
    pub fn token(&self) -> DropToken {
        DropToken(Arc::clone(&self.0))
    }

    /// Drops so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for DropToken {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A mock backend that keeps a reference to the runtime it creates, so that
/// a test can inject faults into the runtime behind the process-wide pool
/// (`MockStream::set_needs_shutdown`, `stream_count`, ...). The runtime is
/// leaked, as the process-wide runtime is anyway.
#[derive(Clone, Debug)]
pub struct SpyBackend {
    system: MockSystem,
    runtime: Arc<OnceLock<&'static MockRuntime>>,
}

impl SpyBackend {
    /// A backend over `system`.
    pub fn new(system: MockSystem) -> Self {
        Self {
            system,
            runtime: Arc::default(),
        }
    }

    /// The runtime created by the first successful `create_runtime`.
    pub fn runtime(&self) -> Option<&'static MockRuntime> {
        self.runtime.get().copied()
    }
}

impl Backend for SpyBackend {
    fn name(&self) -> &'static str {
        "mock"
    }

    fn device_count(&self) -> flex_rt::Result<u32> {
        self.system.device_count()
    }

    fn create_runtime(&self, logical_device: u32) -> flex_rt::Result<Box<dyn Runtime>> {
        let runtime: &'static MockRuntime =
            Box::leak(Box::new(self.system.create_mock_runtime(logical_device)?));
        assert!(
            self.runtime.set(runtime).is_ok(),
            "SpyBackend creates one runtime"
        );
        Ok(Box::new(runtime))
    }
}

/// An independent reading of "a base-10 integer": an optional `+` or `-`
/// and one or more ASCII digits, nothing else. Returns the sign and the
/// magnitude (saturated at `u128::MAX`), or `None` for anything else.
pub fn decimal(raw: &str) -> Option<(bool, u128)> {
    let (negative, digits) = match raw.as_bytes().first() {
        Some(b'-') => (true, &raw[1..]),
        Some(b'+') => (false, &raw[1..]),
        _ => (false, raw),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    let magnitude = if significant.len() > 30 {
        u128::MAX
    } else if significant.is_empty() {
        0
    } else {
        significant.parse().expect("at most 30 digits fit in u128")
    };
    Some((negative, magnitude))
}

/// Keeps the panics whose message starts with "deliberate" (the ones a
/// test makes on purpose, in host callbacks and completions) out of the
/// output: no message and no backtrace, which under valgrind takes seconds
/// to print. Other panics go to the hook that was set before. For a test
/// process of its own ([`crate::isolated!`]): the hook is process-wide.
pub fn quiet_deliberate_panics() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
        if !message.is_some_and(|m| m.starts_with("deliberate")) {
            default_hook(info);
        }
    }));
}

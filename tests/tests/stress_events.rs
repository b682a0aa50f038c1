//! Stress of events: eight threads doing thousands of random records, waits,
//! queries, synchronizes, event drops and launches across shared streams of
//! one runtime, then checking:
//!
//! - 0 lost completions: every launch and record that returned `Ok` had its
//!   completion called exactly once, with `Ok` (nothing here fails), and
//!   every completion closure was dropped exactly once;
//! - ordering: work launched on a stream after it waited for an event ran
//!   after the work recorded before that event (each worker checks its own
//!   produce → record → wait → consume chains; 0 violations);
//! - 0 hangs: the workers finish within 60 s, or the test fails naming
//!   them;
//! - afterwards every stream is idle and every live event complete.
//!
//! Run on the software device in process, with device-side waits and
//! without (host-blocking waits, like today's card), and through the FFI
//! path. Deterministic per seed: `SPYRE_STRESS_SEED`, `SPYRE_STRESS_OPS`
//! (operations per worker, default 4 000).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flex_rt::{Backend, Event, LaunchOptions, Runtime, Stream, StreamMode, StreamPriority};
use spyre_mock::MockSystem;
use spyre_testkit::SplitMix64;
use spyre_tests::isolated;
use spyre_tests::reliability::{DropCounter, ops_per_worker, run_bounded, seed};

const WORKERS: usize = 8;
const STREAMS: usize = 6;
const EVENTS: usize = 4;
const LIMIT: Duration = Duration::from_secs(60);

/// What every worker shares.
struct Shared {
    runtime: &'static dyn Runtime,
    streams: Vec<&'static dyn Stream>,
    /// Shared events; a slot is replaced (the old event dropped) at random.
    events: Vec<Mutex<Arc<dyn Event>>>,
    accepted: AtomicU64,
    completed_ok: AtomicU64,
    completed_err: AtomicU64,
    violations: AtomicU64,
    drops: DropCounter,
}

impl Shared {
    fn new(runtime: &'static dyn Runtime) -> Self {
        let streams = (0..STREAMS)
            .map(|i| {
                let priority = if i % 2 == 0 {
                    StreamPriority::Normal
                } else {
                    StreamPriority::High
                };
                runtime
                    .create_stream(priority, StreamMode::StrictOrdering, false)
                    .expect("stream")
            })
            .collect();
        let events = (0..EVENTS)
            .map(|i| Mutex::new(Arc::from(runtime.create_event(i % 2 == 0).expect("event"))))
            .collect();
        Self {
            runtime,
            streams,
            events,
            accepted: AtomicU64::new(0),
            completed_ok: AtomicU64::new(0),
            completed_err: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            drops: DropCounter::default(),
        }
    }

    /// A completion that counts its call and, through its token, its drop.
    fn completion(self: &Arc<Self>) -> flex_rt::Completion {
        let shared = Arc::clone(self);
        let token = self.drops.token();
        Box::new(move |result| {
            let _token = &token;
            match result {
                Ok(()) => shared.completed_ok.fetch_add(1, Ordering::SeqCst),
                Err(_) => shared.completed_err.fetch_add(1, Ordering::SeqCst),
            };
        })
    }

    fn event(&self, k: usize) -> Arc<dyn Event> {
        Arc::clone(&self.events[k].lock().unwrap())
    }
}

fn worker(shared: Arc<Shared>, index: usize, seed: u64, ops: usize) {
    let mut rng = SplitMix64::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // This worker's produce → consume chains: one flag per chain, set by
    // its producer, checked by its consumer.
    let own_event = shared.runtime.create_event(false).expect("event");
    for _ in 0..ops {
        let s = shared.streams[rng.below(STREAMS as u64) as usize];
        let k = rng.below(EVENTS as u64) as usize;
        match rng.below(9) {
            0 | 1 => {
                let options = LaunchOptions {
                    pipeline_barrier: false,
                    completion: Some(shared.completion()),
                };
                s.launch_host_callback(Box::new(|| {}), options)
                    .expect("launch");
                shared.accepted.fetch_add(1, Ordering::SeqCst);
            }
            2 => {
                s.record_event(&*shared.event(k), Some(shared.completion()))
                    .expect("record");
                shared.accepted.fetch_add(1, Ordering::SeqCst);
            }
            3 => s.wait_event(&*shared.event(k)).expect("wait"),
            4 => {
                shared.event(k).query().expect("query");
            }
            5 => {
                if rng.below(8) == 0 {
                    s.synchronize().expect("synchronize");
                } else {
                    shared.event(k).synchronize().expect("event synchronize");
                }
            }
            6 => {
                // Drop the event in the slot (records and waits on it may be
                // pending) and put a fresh one there.
                let fresh: Arc<dyn Event> = Arc::from(
                    shared
                        .runtime
                        .create_event(rng.below(2) == 0)
                        .expect("event"),
                );
                drop(std::mem::replace(
                    &mut *shared.events[k].lock().unwrap(),
                    fresh,
                ));
            }
            _ => {
                // A chain: produce on `s`, record, make another stream wait,
                // consume there; the consumer must see the product.
                let consumer = shared.streams[rng.below(STREAMS as u64) as usize];
                let produced = Arc::new(AtomicBool::new(false));
                let p = Arc::clone(&produced);
                s.launch_host_callback(
                    Box::new(move || p.store(true, Ordering::SeqCst)),
                    LaunchOptions::new(),
                )
                .expect("produce");
                s.record_event(&*own_event, None).expect("record");
                consumer.wait_event(&*own_event).expect("wait");
                let p = produced;
                let shared_for_check = Arc::clone(&shared);
                consumer
                    .launch_host_callback(
                        Box::new(move || {
                            if !p.load(Ordering::SeqCst) {
                                shared_for_check.violations.fetch_add(1, Ordering::SeqCst);
                            }
                        }),
                        LaunchOptions::new(),
                    )
                    .expect("consume");
            }
        }
    }
}

/// Runs the workers on `runtime` and checks the outcome.
fn stress(name: &str, runtime: &'static dyn Runtime) {
    let seed = seed();
    let ops = ops_per_worker(4_000);
    let shared = Arc::new(Shared::new(runtime));
    let started = Instant::now();
    let workers: Vec<Box<dyn FnOnce() + Send>> = (0..WORKERS)
        .map(|index| {
            let shared = Arc::clone(&shared);
            Box::new(move || worker(shared, index, seed, ops)) as Box<dyn FnOnce() + Send>
        })
        .collect();
    run_bounded(name, LIMIT, workers);
    for stream in &shared.streams {
        stream.synchronize().expect("synchronize");
    }
    for k in 0..EVENTS {
        assert_eq!(shared.event(k).query(), Ok(true), "event {k}");
    }
    let accepted = shared.accepted.load(Ordering::SeqCst);
    eprintln!(
        "{name}: {WORKERS} workers x {ops} ops, {accepted} completions, seed {seed:#x}, {:?}",
        started.elapsed()
    );
    assert_eq!(shared.completed_err.load(Ordering::SeqCst), 0);
    assert_eq!(
        shared.completed_ok.load(Ordering::SeqCst),
        accepted,
        "every accepted launch and record completed once"
    );
    assert_eq!(
        shared.drops.get(),
        accepted,
        "every completion dropped once"
    );
    assert_eq!(
        shared.violations.load(Ordering::SeqCst),
        0,
        "ordering violations"
    );
    assert!(accepted > 0);
}

fn mock_runtime(device_side_wait: bool) -> &'static dyn Runtime {
    let system = MockSystem::builder()
        .memory_bytes(1 << 20)
        .region_bytes(1 << 18)
        .device_side_wait(device_side_wait)
        .build()
        .unwrap();
    Box::leak(system.create_runtime(0).unwrap())
}

#[test]
fn random_events_across_threads_and_streams_on_the_software_device() {
    stress("events", mock_runtime(true));
}

#[test]
fn random_events_with_host_blocking_waits() {
    stress("events-host-wait", mock_runtime(false));
}

#[test]
fn random_events_through_the_ffi_path() {
    isolated!(mock_cdylib; &[], || {
        let backend = flex_rt::HardwareBackend::open(spyre_tests::mock_cdylib()).unwrap();
        let runtime: &'static dyn Runtime = Box::leak(backend.create_runtime(0).unwrap());
        stress("events-ffi", runtime);
    });
}

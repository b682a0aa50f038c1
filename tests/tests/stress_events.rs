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
//!
//! The second half does the same through the stream layer (`SpyreEvent`
//! over pool streams, default 2 000 operations per worker), adding
//! awaited futures and elapsed times, and chains that end in an awaited
//! future instead of a wait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flex_rt::{Backend, Event, LaunchOptions, Runtime, Stream, StreamMode, StreamPriority};
use spyre_mock::MockSystem;
use spyre_stream::{Device, Error, SpyreEvent, SpyreStream, stream_from_pool};
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

// ------------------------------------------------- the stream layer's events

/// Streams of the pool the layer-level workers share.
const POOL_STREAMS: usize = 6;

/// What the layer-level workers share: `SpyreEvent`s, half of them timed,
/// replaced (the old one dropped) at random.
struct LayerShared {
    streams: Vec<SpyreStream>,
    events: Vec<Mutex<Arc<SpyreEvent>>>,
    launched: AtomicU64,
    ran: Arc<AtomicU64>,
    violations: AtomicU64,
}

impl LayerShared {
    fn event(&self, k: usize) -> Arc<SpyreEvent> {
        Arc::clone(&self.events[k].lock().unwrap())
    }
}

fn layer_event(timed: bool) -> Arc<SpyreEvent> {
    Arc::new(if timed {
        SpyreEvent::with_timing().expect("event")
    } else {
        SpyreEvent::new().expect("event")
    })
}

/// One layer-level worker: random records, waits, queries, synchronizes,
/// awaits, elapsed times, replacements and launches on the shared events
/// and streams, and produce → record → wait → consume chains (one through
/// a device-side or host wait, one through an awaited future) on an event
/// of its own.
fn layer_worker(shared: &LayerShared, index: usize, seed: u64, ops: usize) {
    let mut rng = SplitMix64::new(seed ^ (index as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    let own = SpyreEvent::new().expect("event");
    let pick = |rng: &mut SplitMix64| shared.streams[rng.below(POOL_STREAMS as u64) as usize];
    for _ in 0..ops {
        let s = pick(&mut rng);
        let k = rng.below(EVENTS as u64) as usize;
        match rng.below(10) {
            0 | 1 => {
                let ran = Arc::clone(&shared.ran);
                s.launch_host_callback(
                    move || {
                        ran.fetch_add(1, Ordering::SeqCst);
                    },
                    spyre_stream::LaunchOptions::new(),
                )
                .expect("launch");
                shared.launched.fetch_add(1, Ordering::SeqCst);
            }
            2 => shared.event(k).record(s).expect("record"),
            3 => shared.event(k).wait(s).expect("wait"),
            4 => {
                shared.event(k).query().expect("query");
            }
            5 => {
                if rng.below(2) == 0 {
                    shared.event(k).synchronize().expect("event synchronize");
                } else {
                    futures_executor::block_on(shared.event(k).synchronize_async())
                        .expect("awaited");
                }
            }
            6 => {
                // Timed pairs only (even slots); either may be recorded
                // again meanwhile: a value or a typed precondition error.
                let (start, end) = (shared.event(0), shared.event(2));
                match start.elapsed_time(&end) {
                    Ok(_)
                    | Err(
                        Error::EventNotRecorded { .. }
                        | Error::EventNotComplete { .. }
                        | Error::EventsOutOfOrder { .. },
                    ) => {}
                    Err(other) => panic!("elapsed_time: {other:?}"),
                }
            }
            7 => {
                let fresh = layer_event(k.is_multiple_of(2));
                drop(std::mem::replace(
                    &mut *shared.events[k].lock().unwrap(),
                    fresh,
                ));
            }
            _ => {
                let produced = Arc::new(AtomicBool::new(false));
                let p = Arc::clone(&produced);
                s.launch_host_callback(
                    move || p.store(true, Ordering::SeqCst),
                    spyre_stream::LaunchOptions::new(),
                )
                .expect("produce");
                own.record(s).expect("record");
                if rng.below(2) == 0 {
                    let consumer = pick(&mut rng);
                    own.wait(consumer).expect("wait");
                    let (p, seen) = (produced, Arc::new(AtomicBool::new(false)));
                    let checked = Arc::clone(&seen);
                    consumer
                        .launch_host_callback(
                            move || checked.store(p.load(Ordering::SeqCst), Ordering::SeqCst),
                            spyre_stream::LaunchOptions::new(),
                        )
                        .expect("consume");
                    consumer.synchronize().expect("consumer synchronize");
                    if !seen.load(Ordering::SeqCst) {
                        shared.violations.fetch_add(1, Ordering::SeqCst);
                    }
                } else {
                    futures_executor::block_on(own.synchronize_async()).expect("awaited");
                    if !produced.load(Ordering::SeqCst) {
                        shared.violations.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
    }
}

/// Runs the layer-level workers on the process-wide runtime and checks
/// the outcome: 0 ordering violations, every launch ran once, 0 hangs, and
/// every stream idle and every shared event complete at the end.
fn stress_the_layer(name: &str) {
    let seed = seed();
    let ops = ops_per_worker(2_000);
    let shared = Arc::new(LayerShared {
        streams: (0..POOL_STREAMS)
            .map(|i| stream_from_pool(Device::CURRENT, -((i % 2) as i32)).expect("stream"))
            .collect(),
        events: (0..EVENTS)
            .map(|k| Mutex::new(layer_event(k.is_multiple_of(2))))
            .collect(),
        launched: AtomicU64::new(0),
        ran: Arc::new(AtomicU64::new(0)),
        violations: AtomicU64::new(0),
    });
    let started = Instant::now();
    let workers: Vec<Box<dyn FnOnce() + Send>> = (0..WORKERS)
        .map(|index| {
            let shared = Arc::clone(&shared);
            Box::new(move || layer_worker(&shared, index, seed, ops)) as Box<dyn FnOnce() + Send>
        })
        .collect();
    run_bounded(name, LIMIT, workers);
    for stream in &shared.streams {
        stream.synchronize().expect("synchronize");
    }
    for k in 0..EVENTS {
        assert_eq!(shared.event(k).query().ok(), Some(true), "event {k}");
    }
    let launched = shared.launched.load(Ordering::SeqCst);
    eprintln!(
        "{name}: {WORKERS} workers x {ops} ops, {launched} launches, seed {seed:#x}, {:?}",
        started.elapsed()
    );
    assert!(launched > 0);
    assert_eq!(
        shared.ran.load(Ordering::SeqCst),
        launched,
        "every launch ran once"
    );
    assert_eq!(
        shared.violations.load(Ordering::SeqCst),
        0,
        "ordering violations"
    );
}

#[test]
fn random_spyre_events_across_threads_and_pool_streams() {
    isolated!(&[("SPYRE_BACKEND", "mock")], || stress_the_layer(
        "layer-events"
    ));
}

#[test]
fn random_spyre_events_with_host_blocking_waits() {
    isolated!(
        &[
            ("SPYRE_BACKEND", "mock"),
            ("SPYRE_MOCK_DEVICE_SIDE_WAIT", "0")
        ],
        || stress_the_layer("layer-events-host-wait")
    );
}

#[test]
fn random_spyre_events_through_the_ffi_path() {
    isolated!(mock_cdylib; &[], || {
        let backend = flex_rt::HardwareBackend::open(spyre_tests::mock_cdylib()).unwrap();
        spyre_stream::set_backend(Box::new(backend)).unwrap();
        stress_the_layer("layer-events-ffi");
    });
}

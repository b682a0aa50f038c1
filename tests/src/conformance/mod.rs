//! One conformance suite for the `Runtime` / `Stream` contract (flex-rt's
//! traits and `flex.h`), run against every backend:
//!
//! | backend | test file | runs |
//! |---|---|---|
//! | the software device in process ([`spyre_mock::MockSystem`]) | `tests/conformance_mock.rs` | always |
//! | the mock shared library through flex-sys and flex-rt (`HardwareBackend::open(mock_cdylib())`) | `tests/conformance_ffi.rs` | always, each case in a fresh process configured by `SPYRE_MOCK_*` |
//! | the library named by `FLEX_RUNTIME_LIB` (`HardwareBackend::load()`) | `tests/conformance_vendor.rs` | with `--ignored`; shown as ignored otherwise |
//!
//! Each case is a `pub fn(&dyn Backend, &Profile)`. It creates its own
//! runtime on device 0, so cases share nothing. The one list of cases is
//! [`with_conformance_cases!`](crate::with_conformance_cases): its `general`
//! cases hold for any flex library; its `software_device` cases need facts
//! only the software device has (its kernel descriptors, its engine count,
//! its memory layout), given by [`Profile::software_device`]. The
//! [`conformance_tests!`](crate::conformance_tests) macro turns a suite into
//! one `#[test]` per case.
//!
//! Expected values come from `flex.h` and from arithmetic done by hand in
//! the comments, and for compute also from [`spyre_mock::reference`].

use spyre_testkit::{f32_le_bytes, f32s_from_le};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use flex_rt::program::KernelDescriptor;
use flex_rt::{
    Backend, CompositeAddress, DataFormat, FlexError, HostBuffer, LaunchOptions, Runtime, Status,
    Stream, StreamMode, StreamPriority,
};
use spyre_mock::{MockSystem, reference};

mod events;
pub use events::*;

/// A conformance case.
pub type Case = fn(&dyn Backend, &Profile);

/// What a case may assume beyond the contract.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    /// Facts about spyre-mock's software device when it is the backend (in
    /// process or as the shared library); `None` for any other library.
    pub software_device: Option<SoftwareDevice>,
    /// Whether the library reports ABI 1.0, which has no events: the event
    /// cases then check that events are refused as unsupported.
    pub abi_1_0: bool,
}

impl Profile {
    /// The software device configured as [`SOFTWARE_DEVICE`].
    pub const SOFTWARE_DEVICE: Profile = Profile::of(SOFTWARE_DEVICE);

    /// A library the suite knows nothing more about.
    pub const ANY_LIBRARY: Profile = Profile {
        software_device: None,
        abi_1_0: false,
    };

    /// The software device configured as `device`, at ABI 1.1.
    pub const fn of(device: SoftwareDevice) -> Profile {
        Profile {
            software_device: Some(device),
            abi_1_0: false,
        }
    }
}

/// The configuration of the software device in the conformance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftwareDevice {
    /// Device memory per runtime, bytes.
    pub memory_bytes: u64,
    /// Size of one memory region, bytes: a chunk never crosses a region.
    pub region_bytes: u64,
    /// Engine threads per runtime.
    pub engines: u32,
    /// Whether streams wait on events on the device side (else the host
    /// blocks, as on today's Spyre card).
    pub device_side_wait: bool,
}

/// The software device both mock backends run the suite on: 4 MiB of memory
/// in 64 KiB regions, so that a modest copy spans several chunks, and two
/// engines.
pub const SOFTWARE_DEVICE: SoftwareDevice = SoftwareDevice {
    memory_bytes: 4 << 20,
    region_bytes: 64 << 10,
    engines: 2,
    device_side_wait: true,
};

/// [`SOFTWARE_DEVICE`] without device-side waits, like today's Spyre card:
/// the event cases run on it too, so both ways of waiting are tested.
pub const SOFTWARE_DEVICE_HOST_WAIT: SoftwareDevice = SoftwareDevice {
    device_side_wait: false,
    ..SOFTWARE_DEVICE
};

impl SoftwareDevice {
    /// The in-process system with this configuration.
    ///
    /// # Panics
    /// If the builder refuses the configuration (it does not).
    pub fn system(&self) -> MockSystem {
        MockSystem::builder()
            .memory_bytes(self.memory_bytes)
            .region_bytes(self.region_bytes)
            .engines(self.engines)
            .device_side_wait(self.device_side_wait)
            .build()
            .expect("the conformance configuration is valid")
    }

    /// The `SPYRE_MOCK_*` variables that configure the shared library the
    /// same way.
    pub fn env(&self) -> [(&'static str, String); 4] {
        [
            ("SPYRE_MOCK_MEMORY_BYTES", self.memory_bytes.to_string()),
            ("SPYRE_MOCK_REGION_BYTES", self.region_bytes.to_string()),
            ("SPYRE_MOCK_ENGINES", self.engines.to_string()),
            (
                "SPYRE_MOCK_DEVICE_SIDE_WAIT",
                u8::from(self.device_side_wait).to_string(),
            ),
        ]
    }
}

/// The one list of conformance cases, each a function of this module:
/// calls `$callback! { $($args)* general: [...]; events: [...];
/// software_device: [...]; }`. `general` and `events` hold for any flex
/// library (`events` for ABI 1.1; a 1.0 library must refuse them
/// consistently); `software_device` needs [`Profile::software_device`] (the
/// built-in kernels, two engines, ...).
/// A case added to the module is added here, and so reaches every backend.
#[macro_export]
macro_rules! with_conformance_cases {
    ($callback:path; $($args:tt)*) => {
        $callback! {
            $($args)*
            general: [
                device_count_and_missing_devices,
                streams_belong_to_the_runtime_and_report_their_priority,
                fifo_order_of_operations_and_completions,
                query_and_synchronize,
                h2d_d2h_round_trip,
                multi_chunk_round_trip,
                fill_in_every_format,
                later_operations_see_earlier_ones,
                bad_program_fails_the_stream_and_the_error_is_sticky,
                size_mismatch_is_invalid_argument_and_enqueues_nothing,
                memory_errors,
                memory_info_counts_live_allocations,
                completions_are_released_exactly_once,
                host_callback_panic_is_an_error_not_an_abort,
                a_completion_panic_fails_the_stream,
                in_host_callback_only_inside_the_runtimes_callbacks,
                dropping_the_runtime_completes_pending_work,
                launches_from_several_threads_are_serialized,
            ];
            events: [
                an_event_never_recorded_is_complete,
                a_failed_stream_refuses_every_wait,
                a_record_captures_exactly_the_work_before_it,
                notify_calls_back_when_the_latest_record_settles,
                a_wait_orders_later_work_after_the_event,
                a_pending_wait_is_unfinished_work_of_the_waiting_stream,
                re_recording_moves_the_event_but_not_an_earlier_wait,
                waiting_on_the_same_stream_is_a_no_op,
                a_failed_record_poisons_the_event_and_its_waiters,
                a_completion_panic_fails_the_events_recorded_behind_it,
                a_callback_may_launch_on_a_stream_that_waits_for_it,
                dropping_an_event_with_pending_work_keeps_its_waits,
                elapsed_time_is_device_time_with_named_preconditions,
                an_event_of_another_runtime_is_refused,
                an_event_dies_with_its_runtime,
                concurrent_records_are_serialized,
            ];
            software_device: [
                compute_axpy,
                compute_matmul,
                high_priority_work_starts_first,
                work_on_freed_memory_fails,
                a_record_without_a_completion_needs_no_engine,
            ];
        }
    };
}

/// Generates one `#[test]` per conformance case of a suite: `general` (any
/// flex library: general and event cases), `events` (the event cases
/// alone, for a second device configuration) or `software_device` (every
/// case).
///
/// `runner` is a `fn(&'static str, spyre_tests::conformance::Case)`: it gets
/// the test's name and the case, and runs the case against its backend.
/// Attributes before `runner` (for example `#[ignore = "..."]`) go on every
/// test.
///
/// ```ignore
/// spyre_tests::conformance_tests! {
///     runner = run;
///     suite = software_device;
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (
        $(#[$attr:meta])*
        runner = $runner:path;
        suite = $suite:ident;
    ) => {
        $crate::with_conformance_cases!($crate::conformance_tests; @$suite [$(#[$attr])*] $runner;);
    };
    (@general [$($attr:tt)*] $runner:path;
        general: [$($general:ident),* $(,)?];
        events: [$($events:ident),* $(,)?];
        software_device: [$($software:ident),* $(,)?];
    ) => {
        $crate::conformance_tests!(@each [$($attr)*] $runner; $($general,)* $($events),*);
    };
    (@events [$($attr:tt)*] $runner:path;
        general: [$($general:ident),* $(,)?];
        events: [$($events:ident),* $(,)?];
        software_device: [$($software:ident),* $(,)?];
    ) => {
        $crate::conformance_tests!(@each [$($attr)*] $runner; $($events),*);
    };
    (@software_device [$($attr:tt)*] $runner:path;
        general: [$($general:ident),* $(,)?];
        events: [$($events:ident),* $(,)?];
        software_device: [$($software:ident),* $(,)?];
    ) => {
        $crate::conformance_tests!(@each [$($attr)*] $runner; $($general,)* $($events,)* $($software),*);
    };
    (@each [$($attr:tt)*] $runner:path; $case:ident $(, $rest:ident)*) => {
        #[test]
        $($attr)*
        fn $case() {
            $runner(stringify!($case), $crate::conformance::$case);
        }
        $crate::conformance_tests!(@each [$($attr)*] $runner; $($rest),*);
    };
    (@each [$($attr:tt)*] $runner:path;) => {};
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Longest wait for something that only happens if the backend works;
/// reaching it means a lost wakeup or a deadlock.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub(crate) fn runtime(backend: &dyn Backend) -> Box<dyn Runtime> {
    backend.create_runtime(0).unwrap_or_else(|err| {
        panic!(
            "{} cannot create a runtime on device 0: {err}",
            backend.name()
        )
    })
}

pub(crate) fn new_stream(runtime: &dyn Runtime, priority: StreamPriority) -> &dyn Stream {
    runtime
        .create_stream(priority, StreamMode::StrictOrdering, false)
        .expect("create_stream")
}

/// `n` bytes of a pattern that differs at every position of a 251-byte
/// period (251 is prime, so no power-of-two chunk boundary lines up).
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 7 + usize::from(seed)) % 251) as u8)
        .collect()
}

/// Copies `bytes` to a new allocation and returns its address (the copy is
/// enqueued, not awaited).
fn upload(runtime: &dyn Runtime, stream: &dyn Stream, bytes: Vec<u8>) -> CompositeAddress {
    let address = runtime.allocate(bytes.len() as u64).expect("allocate");
    stream
        .launch_h2d(&HostBuffer::from_vec(bytes), &address, LaunchOptions::new())
        .expect("launch_h2d");
    address
}

/// Reads `address` back after everything enqueued before on `stream`.
fn download(stream: &dyn Stream, address: &CompositeAddress) -> Vec<u8> {
    let len = usize::try_from(address.total_size()).expect("fits");
    let out = HostBuffer::zeroed(len);
    stream
        .launch_d2h(address, &out, LaunchOptions::new())
        .expect("launch_d2h");
    stream.synchronize().expect("synchronize");
    out.to_vec()
}

/// The status of an error, for comparisons that ignore the message.
fn status_of(result: Result<(), FlexError>) -> Result<(), Status> {
    result.map_err(|err| err.status())
}

/// Counts completions: how often they were called, with what, and how often
/// the closures were dropped (called or not). A completion released exactly
/// once is called at most once and dropped exactly once.
#[derive(Debug, Default)]
pub struct Completions {
    results: Mutex<Vec<Result<(), Status>>>,
    drops: AtomicUsize,
}

/// Increments [`Completions::drops`] when the closure that owns it goes.
struct DropCount(Arc<Completions>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.drops.fetch_add(1, Ordering::SeqCst);
    }
}

impl Completions {
    /// A new counter, shared with the completions it makes.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Launch options whose completion records into `self`.
    pub fn options(self: &Arc<Self>) -> LaunchOptions {
        let guard = DropCount(Arc::clone(self));
        LaunchOptions::new().on_complete(move |result| {
            guard.0.results.lock().unwrap().push(status_of(result));
        })
    }

    /// The status of every call so far, in call order.
    pub fn results(&self) -> Vec<Result<(), Status>> {
        self.results.lock().unwrap().clone()
    }

    /// How many completions were called.
    pub fn calls(&self) -> usize {
        self.results.lock().unwrap().len()
    }

    /// How many completion closures were dropped (after a call, or uncalled).
    pub fn drops(&self) -> usize {
        self.drops.load(Ordering::SeqCst)
    }
}

/// A one-shot gate that host callbacks wait at.
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Opens the gate for every waiter, now and later.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.changed.notify_all();
    }

    /// Whether the gate has been opened.
    pub fn is_open(&self) -> bool {
        *self.open.lock().unwrap()
    }

    /// A closed gate that `stream` (of the process-wide pool) waits at:
    /// a host callback enqueued on it holds the stream until the gate opens.
    ///
    /// # Panics
    /// When the launch fails: the test is broken.
    pub fn hold_pool_stream(stream: spyre_stream::SpyreStream) -> Arc<Self> {
        let gate = Self::new();
        let waiter = Arc::clone(&gate);
        stream
            .launch_host_callback(move || waiter.wait(), flex_rt::LaunchOptions::new())
            .expect("launch");
        gate
    }

    /// Waits until the gate is open, at most 20 s (a wait that long means
    /// the test is broken; the test then fails on what it checks next).
    pub fn wait(&self) {
        let guard = self.open.lock().unwrap();
        let _ = self
            .changed
            .wait_timeout_while(guard, PATIENCE, |open| !*open)
            .unwrap();
    }
}

/// An ordered record of events, shared with callbacks.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push(event.into());
    }

    fn events(&self) -> MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap()
    }
}

// ---------------------------------------------------------------------------
// Cases for any flex library
// ---------------------------------------------------------------------------

/// `flex_get_device_count` is at least 1, and a device index at or past it
/// is `FLEX_ERROR_NO_DEVICE` (flex.h, `flex_runtime_create`).
pub fn device_count_and_missing_devices(backend: &dyn Backend, profile: &Profile) {
    let count = backend.device_count().expect("device_count");
    assert!(count >= 1, "{count} devices");
    if profile.software_device.is_some() {
        assert_eq!(count, 1, "SPYRE_MOCK_DEVICES is unset: one device");
    }
    let err = backend.create_runtime(count).unwrap_err();
    assert_eq!(err.status(), Status::NO_DEVICE, "{err}");
    let runtime = runtime(backend);
    assert_eq!(runtime.logical_device(), 0);
}

/// The runtime owns its streams and lends them out: the default stream is
/// always the same one, id 0, normal priority; created streams get distinct
/// ids and report the priority they were created with.
pub fn streams_belong_to_the_runtime_and_report_their_priority(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let default = runtime.default_stream();
    assert!(std::ptr::addr_eq(default, runtime.default_stream()));
    assert_eq!(default.id(), 0);
    assert_eq!(default.priority(), StreamPriority::Normal);
    let normal = new_stream(&*runtime, StreamPriority::Normal);
    let high = new_stream(&*runtime, StreamPriority::High);
    let tracking = runtime
        .create_stream(StreamPriority::High, StreamMode::StrictOrdering, true)
        .expect("create_stream with hazard tracking");
    assert_eq!(normal.priority(), StreamPriority::Normal);
    assert_eq!(high.priority(), StreamPriority::High);
    assert_eq!(tracking.priority(), StreamPriority::High);
    let mut ids = vec![default.id(), normal.id(), high.id(), tracking.id()];
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "stream ids are unique within the runtime");
    for stream in [default, normal, high, tracking] {
        assert_eq!(stream.query(), Ok(true), "a new stream has no work");
        assert_eq!(stream.needs_shutdown(), Ok(false));
    }
    assert_eq!(runtime.has_stream_error(), Ok(false));
}

/// Operations run in submission order, and each completion runs before the
/// next operation of the stream starts (flex.h: "Callbacks of one stream are
/// called in submission order ... the stream does not advance while it
/// runs").
pub fn fifo_order_of_operations_and_completions(backend: &dyn Backend, _: &Profile) {
    const N: usize = 20;
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let log = Log::default();
    for i in 0..N {
        let (host_log, done_log) = (log.clone(), log.clone());
        stream
            .launch_host_callback(
                Box::new(move || host_log.push(format!("op{i}"))),
                LaunchOptions::new().on_complete(move |result| {
                    assert!(result.is_ok());
                    done_log.push(format!("done{i}"));
                }),
            )
            .expect("launch_host_callback");
    }
    stream.synchronize().expect("synchronize");
    let expected: Vec<String> = (0..N)
        .flat_map(|i| [format!("op{i}"), format!("done{i}")])
        .collect();
    assert_eq!(*log.events(), expected);
}

/// `query` does not block and reports unfinished work as `Ok(false)`;
/// `synchronize` waits for it; afterwards `query` is `Ok(true)`.
pub fn query_and_synchronize(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    assert_eq!(stream.query(), Ok(true));
    let gate = Gate::new();
    let ran = Arc::new(AtomicBool::new(false));
    let (g, r) = (Arc::clone(&gate), Arc::clone(&ran));
    stream
        .launch_host_callback(
            Box::new(move || {
                g.wait();
                r.store(true, Ordering::SeqCst);
            }),
            LaunchOptions::new(),
        )
        .expect("launch_host_callback");
    assert_eq!(
        stream.query(),
        Ok(false),
        "the callback is held at the gate"
    );
    gate.open();
    stream.synchronize().expect("synchronize");
    assert!(ran.load(Ordering::SeqCst));
    assert_eq!(stream.query(), Ok(true));
    stream
        .synchronize()
        .expect("synchronize with nothing to wait for");
}

/// H2D then D2H returns the same bytes, for sizes below, at and above the
/// 128-byte alignment unit, each completion reporting success.
pub fn h2d_d2h_round_trip(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let completions = Completions::new();
    for (seed, size) in [1usize, 127, 128, 129, 4099].into_iter().enumerate() {
        let data = pattern(size, seed as u8);
        let address = runtime.allocate(size as u64).expect("allocate");
        assert_eq!(address.total_size(), size as u64);
        let out = HostBuffer::zeroed(size);
        stream
            .launch_h2d(
                &HostBuffer::from_vec(data.clone()),
                &address,
                completions.options(),
            )
            .expect("launch_h2d");
        stream
            .launch_d2h(&address, &out, completions.options())
            .expect("launch_d2h");
        stream.synchronize().expect("synchronize");
        assert_eq!(out.to_vec(), data, "{size} bytes");
        runtime.free(&address).expect("free");
    }
    assert_eq!(completions.results(), vec![Ok(()); 10]);
}

/// A buffer larger than one memory region comes back in several chunks
/// (on the software device: three, region, region, rest), and copies
/// across the chunk boundaries keep every byte in order.
pub fn multi_chunk_round_trip(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let size = match profile.software_device {
        // 2.5 regions and 100 bytes: no free range of a fresh runtime holds
        // it whole, so it is spread over regions 0, 1, 2 in address order.
        Some(device) => 2 * device.region_bytes + device.region_bytes / 2 + 100,
        None => (3 << 20) + 5,
    };
    let address = runtime.allocate(size).expect("allocate");
    assert_eq!(address.total_size(), size);
    for chunk in address.chunks() {
        assert_eq!(
            chunk.address.offset % 128,
            0,
            "flex.h: chunks are 128-byte aligned"
        );
    }
    if let Some(device) = profile.software_device {
        let r = device.region_bytes;
        let sizes: Vec<u64> = address.chunks().iter().map(|c| c.size).collect();
        assert_eq!(sizes, vec![r, r, r / 2 + 100]);
        let regions: Vec<u32> = address
            .chunks()
            .iter()
            .map(|c| c.address.region_id)
            .collect();
        assert_eq!(regions, vec![0, 1, 2]);
    }
    let data = pattern(usize::try_from(size).unwrap(), 3);
    stream
        .launch_h2d(
            &HostBuffer::from_vec(data.clone()),
            &address,
            LaunchOptions::new(),
        )
        .expect("launch_h2d");
    assert_eq!(download(stream, &address), data);
    // A fill across the same boundaries, then read back.
    stream
        .launch_fill(&address, 7.0, DataFormat::Uint8, LaunchOptions::new())
        .expect("launch_fill");
    assert!(download(stream, &address).iter().all(|&b| b == 7));
}

/// Fill converts the value as flex.h says: rounded to nearest for FP16/FP32,
/// truncated toward zero and saturated for the integers; little-endian.
/// A size that is not a whole number of elements is `INVALID_ARGUMENT`.
pub fn fill_in_every_format(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    // 1.5 = 0x3FC0_0000 in binary32, 0x3E00 in binary16; -2.0 = 0xC000 in
    // binary16; trunc(-2.7) = -2 = 0xFFFF_FFFE; 300 saturates to 255 in u8.
    let cases: [(f64, DataFormat, &[u8]); 5] = [
        (1.5, DataFormat::Fp32, &[0x00, 0x00, 0xC0, 0x3F]),
        (1.5, DataFormat::Fp16, &[0x00, 0x3E]),
        (-2.0, DataFormat::Fp16, &[0x00, 0xC0]),
        (-2.7, DataFormat::Int32, &[0xFE, 0xFF, 0xFF, 0xFF]),
        (300.0, DataFormat::Uint8, &[0xFF]),
    ];
    let completions = Completions::new();
    for (value, format, element) in cases {
        let address = runtime.allocate(256).expect("allocate");
        stream
            .launch_fill(&address, value, format, completions.options())
            .expect("launch_fill");
        let expected = element.repeat(256 / element.len());
        assert_eq!(
            download(stream, &address),
            expected,
            "{value} as {format:?}"
        );
    }
    assert_eq!(completions.results(), vec![Ok(()); 5]);

    let odd = runtime.allocate(6).expect("allocate");
    let err = stream
        .launch_fill(&odd, 1.0, DataFormat::Fp32, completions.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    stream.synchronize().expect("synchronize");
    assert_eq!(completions.calls(), 5, "the refused fill never completes");
    assert_eq!(completions.drops(), 6, "but its completion is released");
}

/// Operations of one stream see the results of earlier ones: H2D, then
/// fill over it, then D2H reads the fill.
pub fn later_operations_see_earlier_ones(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let address = runtime.allocate(512).expect("allocate");
    let out = HostBuffer::zeroed(512);
    stream
        .launch_h2d(
            &HostBuffer::from_vec(pattern(512, 1)),
            &address,
            LaunchOptions::new(),
        )
        .expect("launch_h2d");
    stream
        .launch_fill(&address, 9.0, DataFormat::Uint8, LaunchOptions::new())
        .expect("launch_fill");
    stream
        .launch_d2h(&address, &out, LaunchOptions::new().pipeline_barrier(true))
        .expect("launch_d2h");
    // No synchronize: reading the buffer waits for the D2H's lease.
    assert_eq!(out.to_vec(), vec![9u8; 512]);
}

/// A program the device cannot run fails with `EXECUTION_FAILED`, in the
/// completion and from `synchronize` / `query`, again and again (sticky);
/// later launches are refused with `STREAM_FAILED` and never complete;
/// other streams of the runtime are unaffected.
pub fn bad_program_fails_the_stream_and_the_error_is_sticky(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let bystander = new_stream(&*runtime, StreamPriority::Normal);
    let program = upload(&*runtime, stream, vec![0xAB; 128]);
    let completions = Completions::new();
    stream
        .launch_compute(&program, completions.options())
        .expect("launch_compute is accepted; it fails on the device");
    let err = stream.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::EXECUTION_FAILED, "{err}");
    assert_eq!(completions.results(), vec![Err(Status::EXECUTION_FAILED)]);
    for _ in 0..2 {
        assert_eq!(
            stream.synchronize().unwrap_err().status(),
            Status::EXECUTION_FAILED
        );
        assert_eq!(
            stream.query().unwrap_err().status(),
            Status::EXECUTION_FAILED
        );
    }
    let err = stream
        .launch_fill(&program, 0.0, DataFormat::Uint8, completions.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::STREAM_FAILED, "{err}");
    assert_eq!(completions.calls(), 1);
    assert_eq!(completions.drops(), 2);
    assert_eq!(runtime.has_stream_error(), Ok(true));

    let data = pattern(128, 5);
    let address = upload(&*runtime, bystander, data.clone());
    assert_eq!(download(bystander, &address), data);
}

/// A copy whose host and device sizes differ is `INVALID_ARGUMENT`: nothing
/// is enqueued, the completion is released uncalled, the host buffer is
/// free again, and the stream keeps working.
pub fn size_mismatch_is_invalid_argument_and_enqueues_nothing(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let address = runtime.allocate(128).expect("allocate");
    let short = HostBuffer::zeroed(100);
    let completions = Completions::new();
    let err = stream
        .launch_h2d(&short, &address, completions.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    let err = stream
        .launch_d2h(&address, &short, completions.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    assert!(
        short.lease_for_write("test").is_ok(),
        "no lease is left behind"
    );
    stream.synchronize().expect("the stream has not failed");
    assert_eq!((completions.calls(), completions.drops()), (0, 2));
    let data = pattern(128, 9);
    stream
        .launch_h2d(
            &HostBuffer::from_vec(data.clone()),
            &address,
            LaunchOptions::new(),
        )
        .expect("launch_h2d");
    assert_eq!(download(stream, &address), data);
}

/// Allocation and free errors: size 0 is `INVALID_ARGUMENT`, a size no
/// device has is `OUT_OF_MEMORY`, freeing something that is not a live
/// allocation (never allocated, or already freed) is `INVALID_ARGUMENT`.
pub fn memory_errors(backend: &dyn Backend, profile: &Profile) {
    let runtime = runtime(backend);
    assert_eq!(
        runtime.allocate(0).unwrap_err().status(),
        Status::INVALID_ARGUMENT
    );
    // The largest multiple of 128 a u64 holds: 2^64 - 128 bytes.
    let huge = !127u64;
    assert_eq!(
        runtime.allocate(huge).unwrap_err().status(),
        Status::OUT_OF_MEMORY
    );
    if let Some(device) = profile.software_device {
        // One byte more than the whole device.
        let err = runtime.allocate(device.memory_bytes + 1).unwrap_err();
        assert_eq!(err.status(), Status::OUT_OF_MEMORY, "{err}");
        // The whole device is available to one allocation.
        let all = runtime.allocate(device.memory_bytes).expect("allocate all");
        assert_eq!(
            runtime.allocate(1).unwrap_err().status(),
            Status::OUT_OF_MEMORY
        );
        runtime.free(&all).expect("free");
    }
    let address = runtime.allocate(300).expect("allocate");
    let err = runtime
        .free(&CompositeAddress::single(address.start(), 128).unwrap())
        .unwrap_err();
    assert_eq!(
        err.status(),
        Status::INVALID_ARGUMENT,
        "a part of an allocation: {err}"
    );
    runtime.free(&address).expect("free");
    let err = runtime.free(&address).unwrap_err();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "freed twice: {err}");
}

/// Memory info (ABI 1.1) counts live allocations: an allocation of 4 KiB
/// takes at least 4 KiB of the free memory, freeing it gives them back, and
/// the total does not change. A 1.0 library refuses it as `UNSUPPORTED`.
pub fn memory_info_counts_live_allocations(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let before = match runtime.memory_info() {
        Ok(info) => info,
        Err(err) => {
            assert_eq!(err.status(), Status::UNSUPPORTED, "{err}");
            return;
        }
    };
    assert!(before.total_bytes > 0 && before.free_bytes <= before.total_bytes);
    let address = runtime.allocate(4096).expect("allocate");
    let during = runtime.memory_info().expect("memory_info");
    assert_eq!(during.total_bytes, before.total_bytes);
    assert!(
        during.free_bytes + 4096 <= before.free_bytes,
        "{before:?} → {during:?}"
    );
    runtime.free(&address).expect("free");
    let after = runtime.memory_info().expect("memory_info");
    assert!(
        after.free_bytes >= during.free_bytes + 4096,
        "{during:?} → {after:?}"
    );
}

/// Every completion is released exactly once: called once for each
/// accepted launch (with `Ok`, its own error, or `STREAM_FAILED` for work
/// that never ran because the stream had failed before), dropped uncalled
/// for each refused launch.
pub fn completions_are_released_exactly_once(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let completions = Completions::new();
    let gate = Gate::new();
    let address = runtime.allocate(256).expect("allocate");
    // 1: held at the gate, so everything below is queued behind it.
    let g = Arc::clone(&gate);
    stream
        .launch_host_callback(Box::new(move || g.wait()), completions.options())
        .expect("launch");
    // 2-4: three operations that run normally.
    for _ in 0..3 {
        stream
            .launch_fill(&address, 1.0, DataFormat::Fp32, completions.options())
            .expect("launch_fill");
    }
    // Refused at launch (size mismatch): never called, dropped once.
    let short = HostBuffer::zeroed(10);
    assert!(
        stream
            .launch_h2d(&short, &address, completions.options())
            .is_err()
    );
    // 5: fails the stream.
    stream
        .launch_host_callback(
            Box::new(|| panic!("deliberate panic")),
            completions.options(),
        )
        .expect("launch");
    // 6-7: queued behind the failure; they never run.
    for _ in 0..2 {
        stream
            .launch_fill(&address, 2.0, DataFormat::Fp32, completions.options())
            .expect("launch_fill");
    }
    gate.open();
    assert_eq!(
        stream.synchronize().unwrap_err().status(),
        Status::HOST_CALLBACK_FAILED
    );
    // Refused at launch: the stream has failed.
    let err = stream
        .launch_fill(&address, 3.0, DataFormat::Fp32, completions.options())
        .unwrap_err();
    assert_eq!(err.status(), Status::STREAM_FAILED);
    assert_eq!(
        completions.results(),
        vec![
            Ok(()),
            Ok(()),
            Ok(()),
            Ok(()),
            Err(Status::HOST_CALLBACK_FAILED),
            Err(Status::STREAM_FAILED),
            Err(Status::STREAM_FAILED),
        ]
    );
    assert_eq!(
        completions.drops(),
        9,
        "7 called + 2 refused, each dropped once"
    );
}

/// `Runtime::in_host_callback` is true in a host function and a completion
/// of the runtime, and false on the caller's thread and in another
/// runtime's callbacks.
pub fn in_host_callback_only_inside_the_runtimes_callbacks(backend: &dyn Backend, _: &Profile) {
    let runtime: Arc<dyn Runtime> = Arc::from(runtime(backend));
    let other: Arc<dyn Runtime> = Arc::from(self::runtime(backend));
    assert!(!runtime.in_host_callback(), "on the caller's thread");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let probe = |what: &'static str| {
        let (runtime, other, seen) = (
            Arc::downgrade(&runtime),
            Arc::downgrade(&other),
            Arc::clone(&seen),
        );
        move || {
            let runtime = runtime.upgrade().expect("the runtime outlives its work");
            let other = other
                .upgrade()
                .expect("the other runtime outlives the work");
            seen.lock()
                .unwrap()
                .push((what, runtime.in_host_callback(), other.in_host_callback()));
        }
    };
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let in_completion = probe("completion");
    stream
        .launch_host_callback(
            Box::new(probe("host function")),
            LaunchOptions::new().on_complete(move |_| in_completion()),
        )
        .expect("launch");
    stream.synchronize().expect("synchronize");
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [("completion", true, false), ("host function", true, false)]
    );
    assert!(!runtime.in_host_callback(), "on the caller's thread after");
}

/// A panic in a host callback is caught: the operation and the stream fail
/// with `HOST_CALLBACK_FAILED`, the stream's error (from `synchronize` and
/// `query`) carries the panic's message, and the process goes on.
pub fn host_callback_panic_is_an_error_not_an_abort(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let completions = Completions::new();
    stream
        .launch_host_callback(
            Box::new(|| panic!("deliberate panic 17")),
            completions.options(),
        )
        .expect("launch");
    let err = stream.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED, "{err}");
    assert!(err.message().contains("deliberate panic 17"), "{err}");
    let again = stream.synchronize().unwrap_err();
    assert_eq!(again, err, "the stream's error is sticky");
    let queried = stream.query().unwrap_err();
    assert_eq!(queried.status(), Status::HOST_CALLBACK_FAILED, "{queried}");
    assert!(
        queried.message().contains("deliberate panic 17"),
        "{queried}"
    );
    assert_eq!(
        completions.results(),
        vec![Err(Status::HOST_CALLBACK_FAILED)]
    );
    assert_eq!(runtime.has_stream_error(), Ok(true));
    // The runtime still works on its other streams.
    let other = new_stream(&*runtime, StreamPriority::Normal);
    let ran = Arc::new(AtomicBool::new(false));
    let r = Arc::clone(&ran);
    other
        .launch_host_callback(
            Box::new(move || r.store(true, Ordering::SeqCst)),
            LaunchOptions::new(),
        )
        .expect("launch");
    other.synchronize().expect("synchronize");
    assert!(ran.load(Ordering::SeqCst));
}

/// A panic in the completion of an operation that succeeded is caught and
/// fails the stream, as a host callback's does: `synchronize` and `query`
/// return `HOST_CALLBACK_FAILED` naming the panic, later launches are
/// refused with `STREAM_FAILED` naming it, the runtime reports a stream
/// error, and its other streams go on.
pub fn a_completion_panic_fails_the_stream(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    stream
        .launch_host_callback(
            Box::new(|| {}),
            LaunchOptions::new().on_complete(|_| panic!("deliberate completion panic 23")),
        )
        .expect("launch");
    let err = stream.synchronize().unwrap_err();
    assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED, "{err}");
    assert!(
        err.message().contains("deliberate completion panic 23"),
        "{err}"
    );
    assert_eq!(stream.synchronize().unwrap_err(), err, "sticky");
    let queried = stream.query().unwrap_err();
    assert_eq!(queried.status(), Status::HOST_CALLBACK_FAILED, "{queried}");
    assert!(
        queried.message().contains("deliberate completion panic 23"),
        "{queried}"
    );
    let completions = Completions::new();
    let refused = stream
        .launch_host_callback(Box::new(|| {}), completions.options())
        .unwrap_err();
    assert_eq!(refused.status(), Status::STREAM_FAILED, "{refused}");
    assert!(
        refused.message().contains("deliberate completion panic 23"),
        "{refused}"
    );
    // Worded as every backend words a launch on a failed stream.
    assert!(
        refused
            .message()
            .starts_with("the stream has failed and accepts no more work; its first error: "),
        "{refused}"
    );
    assert_eq!(
        completions.results(),
        vec![],
        "a refused launch never completes"
    );
    assert_eq!(completions.drops(), 1);
    assert_eq!(runtime.has_stream_error(), Ok(true));
    let other = new_stream(&*runtime, StreamPriority::Normal);
    other
        .launch_host_callback(Box::new(|| {}), LaunchOptions::new())
        .expect("launch on another stream");
    other.synchronize().expect("another stream goes on");
}

/// Dropping the runtime with work still queued lets it all run and every
/// completion return before the drop finishes.
pub fn dropping_the_runtime_completes_pending_work(backend: &dyn Backend, _: &Profile) {
    let runtime = runtime(backend);
    let completions = Completions::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let out = HostBuffer::zeroed(128);
    {
        let stream = new_stream(&*runtime, StreamPriority::Normal);
        let address = runtime.allocate(128).expect("allocate");
        for _ in 0..3 {
            let r = Arc::clone(&ran);
            stream
                .launch_host_callback(
                    Box::new(move || {
                        std::thread::sleep(Duration::from_millis(10));
                        r.fetch_add(1, Ordering::SeqCst);
                    }),
                    completions.options(),
                )
                .expect("launch");
        }
        stream
            .launch_fill(&address, 4.0, DataFormat::Uint8, completions.options())
            .expect("launch_fill");
        stream
            .launch_d2h(&address, &out, completions.options())
            .expect("launch_d2h");
    }
    drop(runtime);
    assert_eq!(ran.load(Ordering::SeqCst), 3);
    assert_eq!(completions.results(), vec![Ok(()); 5]);
    assert_eq!(completions.drops(), 5);
    assert_eq!(out.to_vec(), vec![4u8; 128]);
}

/// Launches from several threads onto one stream are serialized by the
/// stream: host callbacks never overlap, and every completion runs once.
pub fn launches_from_several_threads_are_serialized(backend: &dyn Backend, _: &Profile) {
    const THREADS: usize = 4;
    const EACH: usize = 25;
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let completions = Completions::new();
    let busy = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..EACH {
                    let (busy, overlaps) = (Arc::clone(&busy), Arc::clone(&overlaps));
                    stream
                        .launch_host_callback(
                            Box::new(move || {
                                if busy.swap(true, Ordering::SeqCst) {
                                    overlaps.fetch_add(1, Ordering::SeqCst);
                                }
                                std::thread::yield_now();
                                busy.store(false, Ordering::SeqCst);
                            }),
                            completions.options(),
                        )
                        .expect("launch");
                }
            });
        }
    });
    stream.synchronize().expect("synchronize");
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(completions.results(), vec![Ok(()); THREADS * EACH]);
    assert_eq!(completions.drops(), THREADS * EACH);
}

// ---------------------------------------------------------------------------
// Cases for the software device
// ---------------------------------------------------------------------------

fn software_device(profile: &Profile) -> SoftwareDevice {
    profile
        .software_device
        .expect("this case needs the software device (Profile::software_device)")
}

/// Runs `descriptor` on `stream` and returns the `n` `f32`s at `out`.
fn run_kernel(
    runtime: &dyn Runtime,
    stream: &dyn Stream,
    descriptor: &KernelDescriptor,
    out: &CompositeAddress,
) -> Vec<f32> {
    let program = upload(runtime, stream, descriptor.to_bytes().to_vec());
    let completions = Completions::new();
    stream
        .launch_compute(&program, completions.options())
        .expect("launch_compute");
    let values = f32s_from_le(&download(stream, out));
    assert_eq!(completions.results(), vec![Ok(())]);
    values
}

/// The axpy kernel: `out = alpha * x + y`, checked against numbers worked
/// out by hand and, bit for bit, against [`reference::axpy`].
pub fn compute_axpy(backend: &dyn Backend, profile: &Profile) {
    software_device(profile);
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let run = |alpha: f32, x: &[f32], y: &[f32]| {
        let n = x.len() as u64;
        let xa = upload(&*runtime, stream, f32_le_bytes(x));
        let ya = upload(&*runtime, stream, f32_le_bytes(y));
        let out = runtime.allocate(4 * n).expect("allocate");
        let descriptor = KernelDescriptor::axpy(n, alpha, xa.start(), ya.start(), out.start());
        run_kernel(&*runtime, stream, &descriptor, &out)
    };
    // 2*1+10 = 12, 2*2+20 = 24, 2*3+30 = 36, 2*4+40 = 48.
    let exact = run(2.0, &[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 30.0, 40.0]);
    assert_eq!(exact, vec![12.0, 24.0, 36.0, 48.0]);
    // -0.5*8+1 = -3; -0.5*-2+0.25 = 1.25.
    assert_eq!(run(-0.5, &[8.0, -2.0], &[1.0, 0.25]), vec![-3.0, 1.25]);
    // Inexact values: equal to the reference bit for bit.
    let (x, y) = ([0.3f32, 1e-3, -7.5, 1e30], [0.7f32, 2.0, 1e8, -1e30]);
    let got = run(0.1, &x, &y);
    let want = reference::axpy(0.1, &x, &y);
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// The matmul kernel: row-major `C = A · B`, checked against a product
/// worked out by hand and, bit for bit, against [`reference::matmul`].
pub fn compute_matmul(backend: &dyn Backend, profile: &Profile) {
    software_device(profile);
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let run = |m: u64, k: u64, n: u64, a: &[f32], b: &[f32]| {
        let aa = upload(&*runtime, stream, f32_le_bytes(a));
        let ba = upload(&*runtime, stream, f32_le_bytes(b));
        let c = runtime.allocate(4 * m * n).expect("allocate");
        let descriptor = KernelDescriptor::matmul(m, k, n, aa.start(), ba.start(), c.start());
        run_kernel(&*runtime, stream, &descriptor, &c)
    };
    // [1 2 3]   [ 7  8]   [1*7+2*9+3*11  1*8+2*10+3*12]   [ 58  64]
    // [4 5 6] · [ 9 10] = [4*7+5*9+6*11  4*8+5*10+6*12] = [139 154]
    //           [11 12]
    let c = run(
        2,
        3,
        2,
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0],
    );
    assert_eq!(c, vec![58.0, 64.0, 139.0, 154.0]);
    // Inexact values, 3x4 · 4x2: equal to the reference bit for bit.
    let a: Vec<f32> = (0..12).map(|i| 0.1 * i as f32 - 0.35).collect();
    let b: Vec<f32> = (0..8).map(|i| 1.0 / (i as f32 + 3.0)).collect();
    let got = run(3, 4, 2, &a, &b);
    let want = reference::matmul(3, 4, 2, &a, &b).expect("sizes match");
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

/// Occupies every engine of the software device with a host callback held
/// at its own gate, each on a new stream of `priority`, and waits until all
/// of them run. Returns the gates and the streams.
///
/// # Panics
/// When a launch fails or the engines do not all start within
/// [`PATIENCE`]: the test is broken.
fn occupy_every_engine<'r>(
    runtime: &'r dyn Runtime,
    device: &SoftwareDevice,
    priority: StreamPriority,
) -> (Vec<Arc<Gate>>, Vec<&'r dyn Stream>) {
    let started = Arc::new(AtomicUsize::new(0));
    let gates: Vec<Arc<Gate>> = (0..device.engines).map(|_| Gate::new()).collect();
    let blockers: Vec<&dyn Stream> = gates
        .iter()
        .map(|gate| {
            let stream = new_stream(runtime, priority);
            let (g, s) = (Arc::clone(gate), Arc::clone(&started));
            stream
                .launch_host_callback(
                    Box::new(move || {
                        s.fetch_add(1, Ordering::SeqCst);
                        g.wait();
                    }),
                    LaunchOptions::new(),
                )
                .expect("launch");
            stream
        })
        .collect();
    let deadline = std::time::Instant::now() + PATIENCE;
    while started.load(Ordering::SeqCst) < gates.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "the engines never all started"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    (gates, blockers)
}

/// With every engine busy, queued work of a high-priority stream starts
/// before older queued work of a normal stream (flex.h,
/// `flex_stream_priority_t`).
pub fn high_priority_work_starts_first(backend: &dyn Backend, profile: &Profile) {
    let device = software_device(profile);
    let runtime = runtime(backend);
    let log = Log::default();
    let (gates, blockers) = occupy_every_engine(&*runtime, &device, StreamPriority::Normal);
    let normal = new_stream(&*runtime, StreamPriority::Normal);
    let high = new_stream(&*runtime, StreamPriority::High);
    for (stream, name) in [(normal, "normal"), (high, "high")] {
        let l = log.clone();
        stream
            .launch_host_callback(Box::new(move || l.push(name)), LaunchOptions::new())
            .expect("launch");
    }
    // Free one engine: it takes the high-priority work first.
    gates[0].open();
    high.synchronize().expect("synchronize");
    normal.synchronize().expect("synchronize");
    assert_eq!(*log.events(), vec!["high".to_owned(), "normal".to_owned()]);
    for gate in &gates {
        gate.open();
    }
    for stream in blockers {
        stream.synchronize().expect("synchronize");
    }
}

/// flex.h, `flex_memory_free`: "Work that still uses the memory and runs
/// while it is free fails with FLEX_ERROR_EXECUTION_FAILED" — on the
/// software device, every operation that runs after the free, the memory
/// not allocated again.
pub fn work_on_freed_memory_fails(backend: &dyn Backend, profile: &Profile) {
    software_device(profile);
    let runtime = runtime(backend);
    let stream = new_stream(&*runtime, StreamPriority::Normal);
    let address = runtime.allocate(256).expect("allocate");
    runtime.free(&address).expect("free");
    let completions = Completions::new();
    let out = HostBuffer::zeroed(256);
    stream
        .launch_d2h(&address, &out, completions.options())
        .expect("launch_d2h is accepted; it fails on the device");
    assert_eq!(
        stream.synchronize().unwrap_err().status(),
        Status::EXECUTION_FAILED
    );
    assert_eq!(completions.results(), vec![Err(Status::EXECUTION_FAILED)]);
    assert_eq!(out.to_vec(), vec![0u8; 256], "no byte moved");
}

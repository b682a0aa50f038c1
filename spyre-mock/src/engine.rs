//! Engine threads: the shared state of one runtime's device and the threads
//! that run its operations.
//!
//! Each runtime has `engines` threads named `spyre-mock-d<device>-e<n>`. An
//! engine takes the next job from the [`Scheduler`], releases the lock, runs
//! the operation (catching any panic), holds until the timing model's time
//! from the operation's start has passed (and a stream's injected slowdown
//! after it), records a failure as the stream's sticky error, calls the
//! completion (catching any panic), and marks the operation complete. The completion
//! of an operation that succeeded is called before the lock is taken again
//! (one lock round trip per operation, not two); the stream does not
//! advance until the operation is marked complete either way. No lock is held
//! while user code runs, so completions and host functions may launch more
//! work. Engines stop when the runtime is dropped and nothing is ready.
//!
//! Marking an operation complete publishes the stream's completion count,
//! which a spinning `synchronize` of that stream watches without the
//! scheduler lock, and wakes the threads blocked on that stream
//! (`synchronize`, or a wait for one of its event records) only once it
//! reaches the count one of them looks again at
//! ([`crate::progress::Progress`]): completions on other streams wake
//! nobody, and those before the last one a lone `synchronize` waits for
//! wake nobody either.
//!
//! An engine takes the operations queued behind its job on the same stream
//! as well (up to [`BATCH_LIMIT`] in all; see [`Scheduler::take_batch`])
//! and runs them one after another, publishing each completion without the
//! lock, so a busy stream costs one lock round trip per batch rather than
//! per operation. Streams of the same or a lower priority wait for the
//! batch (a device orders nothing between them). It stops wherever
//! running them one at a time could differ otherwise: when a stream of
//! higher priority becomes ready (it starts first), when the stream fails
//! or its shutdown state or slowdown changes, and at a record's mark, a
//! marker operation or a device-side wait. Errors and wake-ups are those
//! of one operation at a time.
use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sync::{Condvar, Mutex, MutexGuard};
use crossbeam_utils::CachePadded;
use flex_rt::{FlexError, Result, Status, SyncPolicy, drop_panic, panic_message};

use crate::config::MockConfig;
use crate::memory::DeviceMemory;
use crate::op::{Op, Pending};
use crate::raw_call::OpCompletion;
use crate::record::Record;
use crate::scheduler::{Job, Scheduler, Verdict};

static LIVE_ENGINE_THREADS: AtomicUsize = AtomicUsize::new(0);
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The token of the device whose engine this thread is, or 0.
    static ENGINE_OF: Cell<u64> = const { Cell::new(0) };
}

/// Number of engine threads of all runtimes in the process that are alive
/// right now. Counted up before an engine is spawned and down as its last
/// action, so once every runtime has been dropped (from a thread that is not
/// one of its engines) it is back to its earlier value.
pub fn live_engine_threads() -> usize {
    LIVE_ENGINE_THREADS.load(Ordering::SeqCst)
}

/// Counts one engine thread as alive while it exists.
struct LiveThread;

impl LiveThread {
    fn new() -> Self {
        LIVE_ENGINE_THREADS.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for LiveThread {
    fn drop(&mut self) {
        LIVE_ENGINE_THREADS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The timing model: how long an operation holds its engine, from its start,
/// the host's work on it included ([`hold_until`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    op_latency: Duration,
    copy_bandwidth: Option<u64>,
}

impl Timing {
    fn delay(&self, op: &Op) -> Duration {
        if !op.is_timed() {
            return Duration::ZERO;
        }
        let copy = match self.copy_bandwidth {
            Some(bw) if op.copy_bytes() > 0 => {
                Duration::try_from_secs_f64(op.copy_bytes() as f64 / bw as f64)
                    .unwrap_or(Duration::MAX)
            }
            _ => Duration::ZERO,
        };
        self.op_latency.saturating_add(copy)
    }
}

/// State one runtime shares with its streams and engine threads.
pub(crate) struct Device {
    /// Logical device index.
    pub(crate) index: u32,
    /// How many engine threads the device has.
    pub(crate) engines: usize,
    /// Unique per runtime in the process; marks its engine threads.
    token: u64,
    pub(crate) memory: DeviceMemory,
    timing: Timing,
    /// On cache lines of its own, as are the work epoch and the high-ready
    /// epoch: the lock word is taken by the engines for every job and by
    /// every launch on an idle stream, and the epochs are read by engines
    /// without the lock (a watching engine, and one between the operations
    /// of a batch), so sharing a line would make those launches miss in
    /// the cache.
    pub(crate) scheduler: CachePadded<Mutex<Scheduler>>,
    /// Engines wait here for work.
    pub(crate) work: Condvar,
    /// How `synchronize` and the engines wait.
    pub(crate) sync_policy: SyncPolicy,
    /// Whether waits on events are held by the scheduler (else they block
    /// the calling thread).
    pub(crate) device_side_wait: bool,
    /// Whether events made with timing take timestamps (else their elapsed
    /// time is refused).
    pub(crate) event_timing: bool,
    /// Whether the use-after-free detector is on.
    pub(crate) check_reuse: bool,
    /// Engines spinning out the end of a timed operation now, and how many
    /// may at once ([`hold_until`]).
    spinning: AtomicUsize,
    spin_cap: usize,
    /// Moved (release, under the scheduler lock) when a launch makes the
    /// first stream ready (none was), when a busy engine sees more streams
    /// ready than it takes while another engine is idle
    /// ([`Device::mark_work`]), and when the runtime shuts down: what a
    /// watching engine watches instead of taking the scheduler lock.
    pub(crate) work_epoch: CachePadded<AtomicU64>,
    /// Moved (release, under the scheduler lock) each time a high-priority
    /// stream is made ready: what stops a batch of a normal-priority
    /// stream ([`Scheduler::take_batch`]).
    pub(crate) high_ready_epoch: Arc<CachePadded<AtomicU64>>,
    /// Events of the runtime made and not dropped yet
    /// ([`crate::MockRuntime::live_events`]).
    pub(crate) live_events: AtomicUsize,
    /// Set once the runtime has been dropped and its work has drained, by
    /// the last engine to stop (or the drop's shutdown, should every engine
    /// have unwound before, and the drop after joining them, with any
    /// work left unsettled): its
    /// events are destroyed with it, as `flex.h`'s are
    /// ([`crate::MockEvent`]'s calls fail from then on).
    pub(crate) closed: AtomicBool,
}

impl Device {
    /// Fresh device state: empty memory, no streams.
    pub(crate) fn new(index: u32, config: &MockConfig) -> Self {
        let scheduler = Scheduler::new(config.check_reuse());
        Self {
            index,
            engines: config.engines() as usize,
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
            memory: DeviceMemory::new(config),
            timing: Timing {
                op_latency: config.op_latency(),
                copy_bandwidth: config.copy_bandwidth(),
            },
            high_ready_epoch: scheduler.high_ready_epoch(),
            scheduler: CachePadded::new(Mutex::new_deferring(scheduler)),
            work: Condvar::new(),
            sync_policy: config.sync_policy(),
            device_side_wait: config.device_side_wait(),
            event_timing: config.event_timing(),
            check_reuse: config.check_reuse(),
            spinning: AtomicUsize::new(0),
            spin_cap: spin_cap(),
            work_epoch: CachePadded::new(AtomicU64::new(0)),
            live_events: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Whether the calling thread is one of this device's engines.
    pub(crate) fn is_engine_thread(&self) -> bool {
        ENGINE_OF.with(Cell::get) == self.token
    }

    /// Blocks until the device has reached `record` and returns its
    /// outcome: the host side of `Event::synchronize` and of a wait without
    /// device-side waits.
    ///
    /// # Errors
    /// The record's error if it failed;
    /// [`Status::UNSUPPORTED`] on an engine thread of this device, where
    /// waiting could never end.
    pub(crate) fn wait_for_record(&self, record: &Record, call: &'static str) -> Result<()> {
        if !record.is_settled() && self.is_engine_thread() {
            return Err(FlexError::new(
                Status::UNSUPPORTED,
                call,
                "called from a completion or host callback of the same runtime; it would wait for itself",
            ));
        }
        if !record.is_settled() && !self.watch(self.spin_deadline(), || record.is_settled()) {
            // A sleeper of the recording stream: only its finishing
            // operations can settle the record, the one that completes its
            // position (`Record::position`). It asks for the next count
            // instead if the record is not placed or its position has
            // passed: a thread woken and not done must ask for a count
            // still to come.
            let mut scheduler = self.scheduler.lock();
            let progress = scheduler.stream(record.stream).progress();
            progress.sleep_until(
                &mut scheduler,
                || record.position().max(progress.completed() + 1),
                |_| record.is_settled(),
            );
        }
        match record.outcome() {
            Some(Err(error)) => Err(error),
            _ => Ok(()),
        }
    }

    /// Moves the work epoch: a stream was made ready. Called with the
    /// scheduler lock held, so that whoever sees the stream ready (under
    /// the lock) sees the epoch moved too: a watching engine.
    pub(crate) fn mark_work(&self) {
        self.work_epoch.fetch_add(1, Ordering::Release);
    }

    /// Wakes a blocked engine for work marked with [`Device::mark_work`],
    /// when none was watching (`watched`, read under the scheduler lock,
    /// where watchers come and go: one watching then takes the lock and
    /// looks before it blocks). Called without the lock: a wake-up call
    /// made under it would hold up the engines and every launch that takes
    /// the lock.
    pub(crate) fn wake_idle(&self, watched: bool) {
        if !watched {
            self.work.notify_one();
        }
    }

    /// Tells the engines to stop once nothing is ready.
    pub(crate) fn begin_shutdown(&self) {
        {
            let mut scheduler = self.scheduler.lock();
            scheduler.shutting_down = true;
            self.mark_work();
            // Every engine unwound already: none is left to close it.
            if scheduler.engines_stopped == self.engines {
                self.closed.store(true, Ordering::Release);
            }
        }
        self.work.notify_all();
    }

    /// The deadline of the spin of one blocking call (`synchronize`, an
    /// event's wait) as the sync policy says: `None` (spin until done) for
    /// `Spin` and `Yield`, [`SyncPolicy::AUTO_SPIN`] from now otherwise.
    /// Callers keep one deadline across every wait of one call, so the
    /// spinning a call burns is bounded however often it looks again.
    pub(crate) fn spin_deadline(&self) -> Option<Instant> {
        match self.sync_policy {
            SyncPolicy::Spin | SyncPolicy::Yield => None,
            SyncPolicy::Auto | SyncPolicy::Blocking => Some(Instant::now() + SyncPolicy::AUTO_SPIN),
        }
    }

    /// Waits, without the scheduler lock, until `done` returns true, as the
    /// sync policy says: spin, yield, or neither (`Blocking`); until
    /// `deadline` at the latest (`None`: until done). Returns whether it
    /// is done; if not, the caller blocks (its stream's
    /// `Progress::sleep_until`, or the engines' condition variable). `done`
    /// is a few atomic loads.
    ///
    /// A spin backs off: it looks after every pause for its first
    /// [`WATCH_EAGER_LOOKS`] looks, then pauses twice as long after each
    /// look, up to [`WATCH_MAX_PAUSES`]. What a spin watches is a line that
    /// another core writes (a completion count, the work epoch), and every
    /// look takes the line from the writer, whose next write must take it
    /// back: a watcher looking every pause for long would make each write
    /// of an engine running a batch wait for the line. A short wait (an
    /// empty operation's round trip) is still seen at once.
    pub(crate) fn watch(&self, deadline: Option<Instant>, done: impl Fn() -> bool) -> bool {
        let yields = match self.sync_policy {
            SyncPolicy::Blocking => return done(),
            SyncPolicy::Yield => true,
            SyncPolicy::Spin | SyncPolicy::Auto => false,
        };
        let mut looks: u32 = 0;
        loop {
            if done() {
                return true;
            }
            if yields {
                std::thread::yield_now();
            } else {
                looks = looks.saturating_add(1);
                let backoff = looks.saturating_sub(WATCH_EAGER_LOOKS);
                let pauses = 1 << backoff.min(WATCH_MAX_PAUSES.ilog2());
                for _ in 0..pauses {
                    std::hint::spin_loop();
                }
                // The clock is read only once the looks are far apart
                // (about 1.6 µs into the spin here).
                if pauses < WATCH_MAX_PAUSES {
                    continue;
                }
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return false;
            }
        }
    }
}

/// Looks a spinning [`Device::watch`] makes one pause apart before it backs
/// off: about 0.8 µs on the machine of BENCHMARKS.md (a pause takes about
/// 26 ns there), longer than an empty operation's round trip.
const WATCH_EAGER_LOOKS: u32 = 32;

/// The most spin-loop pauses between two looks of a spinning
/// [`Device::watch`] once it backs off: about 0.4 µs on the machine of
/// BENCHMARKS.md, which is what a long spin can add to seeing its
/// condition.
const WATCH_MAX_PAUSES: u32 = 16;
const _: () = assert!(
    WATCH_MAX_PAUSES.is_power_of_two(),
    "the backoff doubles up to it"
);

/// Starts `count` engine threads on `device`.
///
/// # Errors
/// [`Status::RUNTIME_FAILED`] if a thread cannot be spawned; the threads
/// already started are stopped and joined first.
pub(crate) fn spawn_engines(device: &Arc<Device>, count: u32) -> Result<Vec<JoinHandle<()>>> {
    let mut handles = Vec::with_capacity(count as usize);
    for engine in 0..count {
        let name = format!("spyre-mock-d{}-e{engine}", device.index);
        let live = LiveThread::new();
        let shared = Arc::clone(device);
        let spawned = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let _live = live;
                precise_timers();
                engine_main(shared);
            });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(err) => {
                device.begin_shutdown();
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(FlexError::new(
                    Status::RUNTIME_FAILED,
                    "create_runtime",
                    format!("cannot start engine thread {name}: {err}"),
                ));
            }
        }
    }
    Ok(handles)
}

/// An engine as the scheduler counts it; when dropped (the engine stops,
/// or its thread unwinds from a panic outside the device's catches, in a
/// `tracing` subscriber, say), it counts the engine out: no longer busy,
/// stopped, the device closed by the last engine to stop, and the engines
/// that wait at shutdown for busy ones woken. So dropping the runtime ends
/// either way.
struct Counted<'a> {
    device: &'a Device,
    /// Whether this engine counts in `scheduler.busy`: from taking a job
    /// until it finds no work.
    busy: bool,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let mut scheduler = self.device.scheduler.lock();
        if self.busy {
            scheduler.busy -= 1;
        }
        // The last engine to stop closes the device: the runtime was
        // dropped and its work has drained, and its events die with it
        // (flex.h), whichever thread dropped it (one of these engines too,
        // which cannot join the others).
        scheduler.engines_stopped += 1;
        // An engine that unwound before the drop leaves the device open:
        // `begin_shutdown` closes it if none is left by then.
        if scheduler.shutting_down && scheduler.engines_stopped == self.device.engines {
            self.device.closed.store(true, Ordering::Release);
        }
        drop(scheduler);
        // Engines that waited for this one's work stop too.
        self.device.work.notify_all();
    }
}

fn engine_main(device: Arc<Device>) {
    ENGINE_OF.with(|t| t.set(device.token));
    // Declared before the lock's guard, so dropped after it on unwind.
    let mut engine = Counted {
        device: &device,
        busy: false,
    };
    // The operations taken after a job's own (`Scheduler::take_batch`);
    // empty between jobs, kept for its capacity. Declared before the
    // lock's guard too: on unwind, the caller's operations in it are
    // dropped without the lock.
    let mut batch = VecDeque::new();
    let mut scheduler = device.scheduler.lock();
    // When this engine ran out of work, for its spin budget: kept across
    // wake-ups that find nothing for it, reset only when it takes a job.
    let mut idle_since: Option<Instant> = None;
    // How many to take at most: doubled after a batch that took as many as
    // it could and ran whole; after a batch cut short (a high-priority
    // stream made ready, a change or a failure of the stream), none for the
    // next `BATCH_BACKOFF` jobs, then one: where high-priority streams keep
    // becoming ready, an engine does not move operations out of a queue
    // and back again for nothing.
    let mut batch_limit = 1;
    let mut backoff = 0;
    loop {
        match scheduler.next_job() {
            Some(job) => {
                idle_since = None;
                if !engine.busy {
                    engine.busy = true;
                    scheduler.busy += 1;
                }
                // More streams waiting (launched, or made ready again as an
                // operation finished): `run_job` makes sure an idle engine
                // looks, whoever was woken for them before. With every
                // engine busy there is no one to tell: each takes the next
                // ready stream when it comes back for work (a batch of
                // lower priority stops by itself, `Scheduler::take_batch`).
                let announce = (scheduler.has_ready() && scheduler.busy < device.engines)
                    .then_some(scheduler.watching != 0);
                if announce.is_some() {
                    device.mark_work();
                }
                let high_ready_epoch = if batch_limit > 0 {
                    scheduler.take_batch(&job, batch_limit, &mut batch)
                } else {
                    None
                };
                let taken = batch.len();
                let batch = Batch {
                    high_ready_epoch,
                    rest: &mut batch,
                };
                let ran_all = run_job(&device, &mut scheduler, job, announce, batch);
                if !ran_all {
                    batch_limit = 0;
                    backoff = BATCH_BACKOFF;
                } else if batch_limit == 0 {
                    backoff -= 1;
                    if backoff == 0 {
                        batch_limit = 1;
                    }
                } else if taken == batch_limit {
                    batch_limit = (batch_limit * 2).min(BATCH_LIMIT - 1);
                }
            }
            None if scheduler.shutting_down => {
                if engine.busy {
                    engine.busy = false;
                    scheduler.busy -= 1;
                }
                if scheduler.busy > 0 {
                    // Another engine still runs work, which may make
                    // streams ready (its own stream's next operation, a
                    // stream its record lets go): stay to run them, so
                    // that the work drains on every engine, as it would
                    // run with the runtime alive (a host function that
                    // waits for another stream's work needs a second
                    // engine). Woken as an idle engine is, or by the last
                    // engine to stop.
                    device.work.wait(&mut scheduler);
                    continue;
                }
                // Stopped: counted out as `engine` drops.
                break;
            }
            None => {
                if engine.busy {
                    engine.busy = false;
                    scheduler.busy -= 1;
                }
                // Idle: watch for new work for a moment without the lock,
                // then block. Under `Auto` an engine watches only while
                // every engine is idle, and one at a time: an idle device
                // answers a launch without a wake-up, and idle engines do
                // not take the cores of the threads that launch and of the
                // engines that work (a busy engine that sees more ready
                // streams wakes a blocked one). Under `Blocking` none
                // watches.
                let watch = match device.sync_policy {
                    SyncPolicy::Blocking => false,
                    SyncPolicy::Auto => scheduler.watching == 0 && scheduler.busy == 0,
                    SyncPolicy::Spin | SyncPolicy::Yield => true,
                };
                let moved = watch && {
                    let seen = device.work_epoch.load(Ordering::Acquire);
                    let deadline =
                        *idle_since.get_or_insert_with(Instant::now) + SyncPolicy::AUTO_SPIN;
                    scheduler.watching += 1;
                    let moved = MutexGuard::unlocked(&mut scheduler, || {
                        device.watch(Some(deadline), || {
                            device.work_epoch.load(Ordering::Acquire) != seen
                        })
                    });
                    scheduler.watching -= 1;
                    moved
                };
                if !moved && !scheduler.has_ready() && !scheduler.shutting_down {
                    device.work.wait(&mut scheduler);
                }
            }
        }
    }
}

/// Operations an engine runs at most from one stream per lock round trip:
/// its job and up to this many minus one taken with it
/// ([`Scheduler::take_batch`]); so also the most operations of one stream
/// that a ready stream of the same priority waits for on one engine.
pub(crate) const BATCH_LIMIT: usize = 32;

/// Jobs an engine runs alone after a batch was cut short, before it takes
/// one more operation with a job again.
const BATCH_BACKOFF: u32 = 16;

/// The operations an engine took after its job's own, and what stops it
/// from running them.
struct Batch<'a> {
    /// Still to run, in stream order; what is left goes back to the stream.
    rest: &'a mut VecDeque<Pending>,
    /// [`Device::high_ready_epoch`] when the batch of a normal-priority
    /// stream was taken: the batch stops once it moves (a high-priority
    /// stream became ready), so that the ready order decides the next
    /// operation. `None` for a high-priority stream, which nothing
    /// outranks.
    high_ready_epoch: Option<u64>,
}

/// One operation run without the lock: its call name, its result, its
/// completion if it was not called yet (on failure it is called once the
/// error is recorded), and the outcome of a completion already called.
struct Ran {
    call: &'static str,
    result: Result<()>,
    completion: Option<OpCompletion>,
    early: Option<std::thread::Result<()>>,
}

impl Ran {
    /// Whether the operation and its completion succeeded, so the stream
    /// may run its next operation without the lock.
    fn succeeded(&self) -> bool {
        self.result.is_ok() && !matches!(self.early, Some(Err(_)))
    }
}

/// Runs one job, then the batch taken with it while each operation
/// succeeds, no stream of higher priority becomes ready and the stream
/// does not change;
/// `scheduler` is locked on entry and on return, and unlocked while user
/// code runs. With `announce` (whether an engine was watching; the work
/// is marked already), first wakes an idle engine for the other ready
/// streams ([`Device::wake_idle`]), once the lock is released. Returns
/// whether it ran every operation of the batch.
///
/// Between the operations of a batch the engine publishes each completion
/// without the lock ([`crate::progress::Progress`]) and takes the lock
/// only to wake a thread blocked on the stream; the last operation it runs
/// finishes as a single job does (error, records reached, the stream made
/// ready again), and what it did not run goes back to the stream.
fn run_job(
    device: &Device,
    scheduler: &mut MutexGuard<'_, Scheduler>,
    mut job: Job,
    announce: Option<bool>,
    batch: Batch<'_>,
) -> bool {
    if matches!(job.verdict, Verdict::Run { .. })
        && let Some(reused) = scheduler.check_reuse(&job, &device.memory)
    {
        job.verdict = Verdict::Skip(reused);
    }
    let Job {
        stream,
        pending,
        verdict,
    } = job;
    let slowdown = match verdict {
        Verdict::Run { slowdown } => slowdown,
        Verdict::Skip(_) => Duration::ZERO,
    };
    // What ends a batch early: a change of the stream seen from here on.
    let watch = (!batch.rest.is_empty()).then(|| {
        let progress = scheduler.stream(stream).progress();
        let changes = progress.changes();
        (progress, changes)
    });
    let Ran {
        call,
        result,
        completion,
        early,
    } = MutexGuard::unlocked(scheduler, || {
        if let Some(watched) = announce {
            device.wake_idle(watched);
        }
        let mut ran = run_op(device, stream, pending, verdict);
        if let Some((progress, changes)) = &watch {
            while ran.succeeded()
                && batch
                    .high_ready_epoch
                    .is_none_or(|epoch| device.high_ready_epoch.load(Ordering::Acquire) == epoch)
                && progress.changes() == *changes
                && let Some(next) = batch.rest.pop_front()
            {
                if progress.complete_one() {
                    let _scheduler = device.scheduler.lock();
                    progress.wake();
                }
                ran = run_op(device, stream, next, Verdict::Run { slowdown });
            }
        }
        ran
    });
    let ran_all = batch.rest.is_empty();
    if !ran_all {
        scheduler.put_back(stream, batch.rest);
    }
    let outcome = match (result, completion) {
        (Err(err), Some(completion)) => {
            scheduler.record_error(stream, err.clone());
            Some(MutexGuard::unlocked(scheduler, || {
                catch_unwind(AssertUnwindSafe(|| completion.call(Err(err))))
            }))
        }
        (Err(err), None) => {
            scheduler.record_error(stream, err);
            early
        }
        (Ok(()), _) => early,
    };
    if let Some(Err(payload)) = outcome {
        scheduler.record_error(
            stream,
            FlexError::new(
                Status::HOST_CALLBACK_FAILED,
                call,
                format!(
                    "the completion callback panicked: {}",
                    panic_message(payload.as_ref())
                ),
            ),
        );
        // The payload is the caller's value, its drop user code: without
        // the lock (a wake-up it makes would otherwise wait for the lock's
        // release, `crate::sync::Condvar`).
        MutexGuard::unlocked(scheduler, || drop_panic(payload));
    }
    // The notifications of event records this operation reaches (awaiting
    // tasks are woken here): without the lock, as they are user code, and
    // before the stream advances, so the stream's `synchronize` returns
    // after them. (The records' outcomes are set already: an event's query
    // or synchronize may see them complete first, as before.)
    let reached = scheduler.reach(stream);
    if !reached.is_empty() {
        MutexGuard::unlocked(scheduler, || reached.notify());
    }
    // If the stream has more work, this engine takes it (or something more
    // urgent) on its next turn; no other engine needs waking.
    scheduler.finish(stream);
    ran_all
}

/// How long before the end of a timed operation its engine stops sleeping
/// and spins instead ([`hold_until`]): more than a sleep of an engine
/// overshoots (its timer slack is 1 ns, [`precise_timers`], so what is left
/// is a wake-up).
const SLEEP_MARGIN: Duration = Duration::from_micros(60);

/// How many engines of one device may spin out the end of a timed
/// operation at once: one fewer than the cores the process may run on (so
/// none on one core), so that spinning engines leave a core to the threads
/// that launch, and engines beyond the cores sleep instead of taking turns
/// at spinning (which would make the device's parallelism the host's).
fn spin_cap() -> usize {
    std::thread::available_parallelism().map_or(0, |cores| cores.get() - 1)
}

/// Makes the calling engine's sleeps end on time: a timer slack of 1 ns
/// instead of Linux's default 50 µs, by which a sleep may end late (a timed
/// operation sleeps to just before its end, [`hold_until`]). Elsewhere, and
/// under Miri, nothing; a refusal leaves the default.
fn precise_timers() {
    #[cfg(all(target_os = "linux", not(miri)))]
    let _ = rustix::thread::set_current_timer_slack(Some(std::num::NonZeroU64::MIN));
}

/// Holds the calling engine of `device` until `deadline` (`None`: past any
/// time, as a delay too long to add to now; then it sleeps for good). It
/// sleeps while more than [`SLEEP_MARGIN`] is left, then spins to the
/// deadline, so that a modelled time ends within about a microsecond of
/// it; but under the `Blocking` sync policy, which never spins, and while
/// [`spin_cap`] other engines of the device spin (on one core, always), it
/// sleeps the rest too
/// (ending a wake-up late, some microseconds). The spin does not yield: a
/// yield gives the core to a busy thread there until its time slice ends
/// (4 ms), where a spin keeps it for the microseconds left, and a sleeping
/// engine woken by its timer preempts such a thread.
fn hold_until(deadline: Option<Instant>, device: &Device) {
    let Some(deadline) = deadline else {
        loop {
            std::thread::park();
        }
    };
    let margin = if device.sync_policy == SyncPolicy::Blocking {
        Duration::ZERO
    } else {
        SLEEP_MARGIN
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        if left > margin {
            std::thread::sleep(left - margin);
        } else if device.spinning.fetch_add(1, Ordering::Relaxed) < device.spin_cap {
            while Instant::now() < deadline {
                std::hint::spin_loop();
            }
            device.spinning.fetch_sub(1, Ordering::Relaxed);
            return;
        } else {
            device.spinning.fetch_sub(1, Ordering::Relaxed);
            std::thread::sleep(left);
        }
    }
}

/// Runs one operation without the scheduler lock (or completes it with the
/// verdict's error), and calls its completion if it succeeded.
///
/// A timed operation holds its engine until its modelled time from its start
/// has passed ([`hold_until`]), the host's work on it counted in that time:
/// a 4 KiB copy at 1 GB/s ends 4.1 µs after it started, not after the
/// copy's own time and then 4.1 µs more. A stream's injected slowdown
/// ([`crate::MockStream::set_slowdown`]) holds it that much longer after
/// both.
fn run_op(device: &Device, stream: usize, pending: Pending, verdict: Verdict) -> Ran {
    let call = pending.op.call();
    let mut completion = pending.completion;
    let op = pending.op;
    // A completion of an operation that succeeded is called in the same
    // unlocked stretch as the operation (the stream does not advance before
    // it returns either way); a failure is recorded as the stream's error
    // first, under the lock, so that the completion sees it.
    let result = match verdict {
        Verdict::Skip(err) => {
            op.abandon(&err);
            // Dropping releases host leases and closures; their Drop is user code.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(op))) {
                drop_panic(payload);
            }
            Err(err)
        }
        Verdict::Run { slowdown } => {
            let delay = device.timing.delay(&op);
            // Read only for a timed operation: an untimed one (the default
            // device) pays no clock read.
            let deadline = (!delay.is_zero()).then(|| Instant::now().checked_add(delay));
            let result = catch_unwind(AssertUnwindSafe(|| op.execute(&device.memory)))
                .unwrap_or_else(|payload| {
                    let message = panic_message(payload.as_ref());
                    drop_panic(payload);
                    Err(FlexError::new(
                        Status::INTERNAL,
                        call,
                        format!("the operation panicked on the device: {message}"),
                    ))
                });
            if let Some(deadline) = deadline {
                hold_until(deadline, device);
            }
            // An injected slowdown holds the engine longer still, after
            // the work and its modelled time.
            if !slowdown.is_zero() {
                hold_until(Instant::now().checked_add(slowdown), device);
            }
            result
        }
    };
    if device.check_reuse {
        // Before the completion: a host it wakes may reuse the memory.
        device.scheduler.lock().reuse_ran(stream);
    }
    let early = match (&result, completion.take()) {
        (Ok(()), Some(completion)) => {
            Some(catch_unwind(AssertUnwindSafe(|| completion.call(Ok(())))))
        }
        (_, taken) => {
            completion = taken;
            None
        }
    };
    Ran {
        call,
        result,
        completion,
        early,
    }
}

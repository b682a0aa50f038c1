//! The process-wide runtime (torch-spyre's `GlobalRuntime`,
//! `startRuntime`/`freeRuntime`, `set_device` and the device state): which
//! backend and device it runs on, starting it once, freeing it, and finding
//! the pool of a device for the free functions.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use flex_rt::fork::{self, ForkGeneration};
use flex_rt::{Backend, Runtime, Stream};

use crate::backend::{self, BackendKind};
use crate::device::{Device, set_thread_device, thread_device};
use crate::env::{self, MAX_DEVICE_INDEX};
use crate::error::{Error, Result};
use crate::lifecycle_lock::LifecycleLock;
use crate::marker::MarkerEvents;
use crate::memory::allocator::CachingAllocator;
use crate::memory::reuse_barrier::ReuseBarriers;
use crate::pool::{PoolConfig, StreamPool};
use crate::state::DeviceState;
use crate::stream::SpyreStream;

/// The started runtime. Leaked on purpose: handles must stay valid for the
/// life of the process, even after [`free_runtime`], as the spec says.
struct Running {
    backend: &'static dyn Backend,
    pool: StreamPool<'static>,
    /// The caching allocator behind [`crate::DeviceBuffer`].
    allocator: CachingAllocator,
    /// The idle marker events of `wait_stream`, `synchronize_async` and the
    /// allocator's fences (leaked with the rest, so that the allocator can
    /// hold it).
    markers: &'static MarkerEvents,
    device_source: DeviceSource,
    /// The process the runtime was started in, for the fork error.
    pid: u32,
    /// The fork generation it was started in: any other is a forked child.
    generation: ForkGeneration,
}

impl Running {
    /// `Ok` in the process that started the runtime; in a child of `fork()`,
    /// [`Error::ForkedProcess`]. One relaxed atomic load.
    #[inline]
    fn check_process(&self) -> Result<&Self> {
        if self.generation.is_current() {
            Ok(self)
        } else {
            Err(Error::ForkedProcess {
                started_in: self.pid,
                current: std::process::id(),
            })
        }
    }
}

/// The started runtime, checked to belong to this process.
///
/// # Errors
/// [`Error::NotStarted`] before the first start; [`Error::ForkedProcess`]
/// in a forked child.
#[inline]
fn running() -> Result<&'static Running> {
    RUNNING.get().ok_or(Error::NotStarted)?.check_process()
}

/// Where the process's logical device came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSource {
    /// The device named explicitly by the call that started the runtime
    /// (for example `stream_from_pool(Device::new(1)?, 0)`).
    Requested,
    /// The starting thread's current device, set with [`set_device`].
    ThreadDevice,
    /// A launcher's local rank: the variable named (one of
    /// [`env::LOCAL_RANK_VARIABLES`]: `LOCAL_RANK`,
    /// `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`).
    LocalRank(&'static str),
    /// None of these: device 0.
    Default,
}

impl DeviceSource {
    /// A short stable name for reports: `requested`, `set_device`, the
    /// launcher's variable (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
    /// `MPI_LOCALRANKID`, `SLURM_LOCALID`) or `default`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::ThreadDevice => "set_device",
            Self::LocalRank(variable) => variable,
            Self::Default => "default",
        }
    }

    /// A sentence-length description for diagnostics ([`DeviceSource::name`]
    /// is the stable short name).
    pub fn description(self) -> &'static str {
        match self {
            Self::Requested => "the device named by the first call",
            Self::ThreadDevice => "the thread's current device (set_device)",
            Self::LocalRank(variable) => match variable {
                env::OMPI_LOCAL_RANK => "Open MPI's local rank (OMPI_COMM_WORLD_LOCAL_RANK)",
                env::MPICH_LOCAL_RANK => "MPICH's local rank (MPI_LOCALRANKID)",
                env::SLURM_LOCAL_ID => "Slurm's local task id (SLURM_LOCALID)",
                _ => "LOCAL_RANK",
            },
            Self::Default => "default (no current device, no launcher's local rank set)",
        }
    }
}

/// Set once, by the first successful start; never replaced.
static RUNNING: OnceLock<Running> = OnceLock::new();
/// Set by [`free_runtime`]; never cleared.
static FREED: AtomicBool = AtomicBool::new(false);
/// Serializes start/free and holds the backend until the runtime starts.
static LIFECYCLE: LifecycleLock<Option<Slot>> = LifecycleLock::new(None);

/// The backend waiting for the start.
struct Slot {
    backend: Box<dyn Backend>,
    /// Installed by [`set_backend`] (kept when a start fails), rather than
    /// created from the features and the environment (dropped then, so that
    /// a retry reads the corrected environment).
    installed: bool,
    /// The fork generation it was created in: a child of `fork()` does not
    /// use its parent's backend (a loaded, maybe initialized, library).
    generation: ForkGeneration,
    /// The process it was created in.
    process: u32,
}

impl Slot {
    /// `backend`, created in this process now.
    fn new(backend: Box<dyn Backend>, installed: bool) -> Self {
        Self {
            backend,
            installed,
            generation: ForkGeneration::current(),
            process: std::process::id(),
        }
    }
}

/// `Ok` unless the runtime was started in another process (this one is a
/// forked child). Checked before taking [`LIFECYCLE`], which a thread of the
/// parent may have held when it forked.
pub(crate) fn check_not_forked() -> Result<()> {
    RUNNING
        .get()
        .map_or(Ok(()), |r| r.check_process().map(drop))
}

/// Installs the backend the runtime will start on, instead of the one chosen
/// by features and `SPYRE_BACKEND` (for example a software device with
/// custom settings, or a library opened from a known path).
///
/// A backend installed before a `fork()` is not used in the child, which
/// must install its own (until it does, its start fails with
/// [`Error::BackendFromParent`]).
///
/// Thread-safety: any thread may call it. While another thread is inside a
/// call that starts, frees or loads the runtime (a start may load the flex
/// library and create the runtime and the pool's streams), it waits for
/// that call to end, by yields and then sleeps of up to 1 ms.
///
/// # Errors
/// [`Error::ForkedProcess`] in a child forked after the start;
/// [`Error::ForkedDuringStart`] in a child forked while a parent thread
/// was inside one of the calls that start, free or load the runtime;
/// [`Error::RuntimeAlreadyStarted`] once the runtime has started;
/// [`Error::RuntimeReset`] after [`free_runtime`]; [`Error::ForkWatch`]
/// when the fork watcher cannot be registered;
/// [`Error::LifecycleReentered`] from a backend's methods during a start.
pub fn set_backend(backend: Box<dyn Backend>) -> Result<()> {
    check_not_forked()?;
    let mut slot = LIFECYCLE.lock()?;
    check_not_freed()?;
    if RUNNING.get().is_some() {
        return Err(Error::RuntimeAlreadyStarted);
    }
    forget_inherited(&mut slot);
    *slot = Some(Slot::new(backend, true));
    Ok(())
}

/// Leaves a backend created before a `fork()` to the parent: never
/// dropped in the child, where its library's state is the parent's.
fn forget_inherited(slot: &mut Option<Slot>) {
    if let Some(inherited) = slot.take_if(|s| !s.generation.is_current()) {
        // Not logged: the log's locks may have been held by a parent
        // thread at the fork.
        std::mem::forget(inherited);
    }
}

/// Registers the fork watcher (once per process).
fn watch_forks() -> Result<()> {
    fork::watch_forks().map_err(|e| Error::ForkWatch(std::sync::Arc::new(e)))
}

/// [`Error::RuntimeReset`] after [`free_runtime`].
pub(crate) fn check_not_freed() -> Result<()> {
    if FREED.load(Ordering::Acquire) {
        Err(Error::RuntimeReset)
    } else {
        Ok(())
    }
}

/// The backend to start on: the installed one, else the one the features and
/// `SPYRE_BACKEND` select (created and kept for later calls). A backend
/// created before a `fork()` is left to the parent ([`forget_inherited`]):
/// one made from the environment is made afresh; one installed with
/// [`set_backend`] is an error ([`Error::BackendFromParent`]) until the
/// child installs its own, rather than silently another backend.
fn backend_slot(slot: &mut Option<Slot>) -> Result<&dyn Backend> {
    if let Some(inherited) = slot.as_ref()
        && inherited.installed
        && !inherited.generation.is_current()
    {
        return Err(Error::BackendFromParent {
            installed_in: inherited.process,
            current: std::process::id(),
        });
    }
    forget_inherited(slot);
    if slot.is_none() {
        watch_forks()?;
        let kind = backend::parse_backend(env::var(env::BACKEND).as_deref())?;
        *slot = Some(Slot::new(backend::create(kind)?, false));
    }
    Ok(slot
        .as_ref()
        .map(|s| s.backend.as_ref())
        .expect("the slot was filled above"))
}

/// The device `device` names for the calling thread, and why: the explicit
/// index; else the thread's device ([`set_device`]); else the started
/// runtime's device; else the launcher's local rank (`LOCAL_RANK`, then
/// its MPI and Slurm counterparts, [`crate::env::launcher_local_rank`]),
/// strictly parsed and read now; else 0.
///
/// This one function is the only reading of the current device, for every
/// entry point and for the start itself, so a thread's device and the
/// runtime's can never disagree: before the start both come from the same
/// reading of the environment, after it every thread without a device of its
/// own follows the runtime (torch-spyre writes `LOCAL_RANK` back into
/// `tls_idx` at start for the same reason). Once `running` is known, it
/// reads nothing but the thread's device and cannot fail.
fn resolve(device: Device, running: Option<&Running>) -> Result<(u8, DeviceSource)> {
    if let Some(index) = device.explicit() {
        return Ok((index, DeviceSource::Requested));
    }
    if let Some(index) = thread_device() {
        return Ok((index, DeviceSource::ThreadDevice));
    }
    if let Some(running) = running {
        return Ok((running.pool.device(), running.device_source));
    }
    match env::launcher_local_rank(env::var)? {
        Some((rank, variable)) => Ok((rank, DeviceSource::LocalRank(variable))),
        None => Ok((0, DeviceSource::Default)),
    }
}

/// The calling thread's current device (torch-spyre's `tls_idx`): the one
/// set on this thread by [`set_device`]; else, once the runtime has started,
/// the runtime's device; before that, the launcher's local rank (`LOCAL_RANK`
/// or its MPI and Slurm counterparts, [`crate::env::LOCAL_RANK_VARIABLES`],
/// read now, strictly) or 0.
///
/// # Errors
/// [`Error::InvalidEnv`] for a malformed local-rank variable before the
/// runtime has started (the same error [`start_runtime`] would give);
/// [`Error::ForkedProcess`] in a child forked after the start.
pub fn current_device() -> Result<u8> {
    check_not_forked()?;
    resolve(Device::CURRENT, RUNNING.get()).map(|(index, _)| index)
}

/// Makes `index` the calling thread's current device (torch-spyre's
/// `set_device`). Once the runtime has started, only its device can be set:
/// another would make every call on the current device fail. Before the
/// start any visible device can be set; if the start (from any thread, or
/// racing this call) then names another device, this thread's calls on the
/// current device fail with [`Error::OtherDevice`] until it sets the
/// runtime's device.
///
/// Before the start it loads the backend to count the devices, and may
/// wait for another thread's start as [`device_count`] does.
///
/// # Errors
/// [`Error::InvalidDeviceIndex`] for an index outside 0..=127;
/// [`Error::DeviceOutOfRange`] when it is not below [`device_count`] (the
/// start's text for the same fact, `Device index out of bounds. ...`,
/// rather than that of torch-spyre's Python binding, `Device index <i>
/// out of range [0, <n>)`: one error for one fact);
/// [`Error::OtherDevice`] for another device than the started runtime's
/// (nothing is changed); as [`device_count`] otherwise.
pub fn set_device(index: i64) -> Result<()> {
    let device = u8::try_from(index)
        .ok()
        .filter(|d| *d <= MAX_DEVICE_INDEX)
        .ok_or(Error::InvalidDeviceIndex {
            index,
            expected: "0..=127 (set_device takes a device; -1, the current device, is not one)",
        })?;
    check_visible(device, device_count()?, DeviceSource::ThreadDevice)?;
    if let Some(running) = RUNNING.get() {
        let bound = running.pool.device();
        if device != bound {
            return Err(Error::OtherDevice {
                requested: device,
                bound,
            });
        }
    }
    set_thread_device(device);
    Ok(())
}

/// Checks that `device`, chosen by `chosen_by`, is below `count`, the
/// visible device count.
///
/// # Errors
/// [`Error::DeviceOutOfRange`] when it is not.
fn check_visible(device: u8, count: u32, chosen_by: DeviceSource) -> Result<()> {
    if u32::from(device) >= count {
        return Err(Error::DeviceOutOfRange {
            device,
            count,
            chosen_by,
        });
    }
    Ok(())
}

/// Checks `device` as [`start_runtime`] would (resolved now, then against
/// [`device_count`], which loads the backend), and starts nothing: for the
/// calls that have nothing to do before the start, so that a device they
/// could never serve is an error then too, as it is after the start.
///
/// # Errors
/// [`Error::InvalidEnv`] for a malformed local-rank variable;
/// [`Error::DeviceOutOfRange`]; as [`device_count`].
pub(crate) fn check_device_before_start(device: Device) -> Result<()> {
    let (index, chosen_by) = resolve(device, None)?;
    check_visible(index, device_count()?, chosen_by)
}

/// Starts the process-wide runtime (`startRuntime`) on the calling thread's
/// current device: once per process; later calls return at once. A failed
/// start binds no device and may be retried: it keeps a backend installed
/// with [`set_backend`], and drops one it created from the environment, so
/// that the retry reads the environment again.
///
/// It reads the environment once: the logical device ([`current_device`]),
/// `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS` and `SPYRE_HAZARD_TRACKER`; then
/// chooses the backend, checks the device against the visible device count,
/// creates the runtime and the pool (which initializes on first use).
///
/// Thread-safety: any thread may call it. While another thread is inside a
/// call that starts, frees or loads the runtime (a start may load the flex
/// library and create the runtime and the pool's streams), it waits for
/// that call to end, by yields and then sleeps of up to 1 ms.
///
/// # Errors
/// [`Error::ForkedProcess`] in a child forked after the runtime started;
/// [`Error::ForkedDuringStart`] in a child forked while a parent thread was
/// starting it (or inside another call that starts, frees or loads it);
/// [`Error::RuntimeReset`] after [`free_runtime`]; [`Error::InvalidEnv`] for
/// a malformed variable; [`Error::DeviceOutOfRange`]; the backend's load or
/// configuration error ([`Error::BackendUnavailable`] for a
/// `SPYRE_BACKEND` this build does not have, [`Error::BackendFromParent`]
/// in a child of a process that installed one with [`crate::set_backend`]);
/// [`Error::ForkWatch`] when the fork watcher cannot be registered; the
/// runtime's creation error;
/// [`Error::OtherDevice`] when the runtime has started on another device
/// than the calling thread's current one (set with [`set_device`] before
/// another thread started it), as for every call on the current device;
/// [`Error::LifecycleReentered`] from a backend's methods during a start
/// (before the runtime has started).
pub fn start_runtime() -> Result<()> {
    pool_for(Device::CURRENT).map(drop)
}

/// Starts the runtime on the device `device` names (see [`resolve`]) unless
/// it has started, and returns it with the device `device` names. Nothing is
/// bound unless the start succeeds: the device is checked against the
/// visible devices first. The device is resolved once.
fn start_on(device: Device) -> Result<(&'static Running, u8)> {
    if let Some(running) = RUNNING.get() {
        return usable(running, device);
    }
    let mut slot = LIFECYCLE.lock()?;
    check_not_freed()?;
    if let Some(running) = RUNNING.get() {
        return usable(running, device);
    }
    let started = start_locked(&mut slot, device);
    if started.is_err() && slot.as_ref().is_some_and(|s| !s.installed) {
        // One inherited from the parent (the start failed before choosing
        // the backend) is the parent's, left to it; one made here is dropped.
        forget_inherited(&mut slot);
        *slot = None;
    }
    started
}

/// The start itself, under [`LIFECYCLE`].
fn start_locked(slot: &mut Option<Slot>, device: Device) -> Result<(&'static Running, u8)> {
    let (device, device_source) = resolve(device, None)?;
    let host_compute =
        env::parse_host_compute_streams(env::var(env::NUM_HOST_COMPUTE_STREAMS).as_deref())?;
    let track_hazards = env::parse_hazard_tracker(env::var(env::HAZARD_TRACKER).as_deref())?;
    let config = PoolConfig::new(host_compute, track_hazards)?;

    let backend = backend_slot(slot)?;
    check_visible(
        device,
        backend.device_count().map_err(Error::from_backend)?,
        device_source,
    )?;
    let generation = ForkGeneration::current();
    let runtime: &'static dyn Runtime = Box::leak(
        backend
            .create_runtime(u32::from(device))
            .map_err(Error::from_backend)?,
    );
    let pool = StreamPool::new(runtime, config)?;
    let backend: &'static dyn Backend =
        Box::leak(slot.take().expect("backend_slot filled the slot").backend);
    tracing::info!(
        backend = backend.name(),
        device,
        source = device_source.description(),
        host_compute_streams = host_compute,
        track_hazards,
        "Spyre runtime started"
    );
    let markers: &'static MarkerEvents = Box::leak(Box::new(MarkerEvents::new(runtime)));
    let started = RUNNING.set(Running {
        backend,
        pool,
        allocator: CachingAllocator::new(runtime, markers),
        markers,
        device_source,
        pid: std::process::id(),
        generation,
    });
    debug_assert!(started.is_ok(), "RUNNING is only set under LIFECYCLE");
    Ok((RUNNING.get().expect("set just above"), device))
}

/// The started runtime, checked to be this process's and not freed, with
/// the device `device` names.
fn usable(running: &'static Running, device: Device) -> Result<(&'static Running, u8)> {
    running.check_process()?;
    check_not_freed()?;
    let (index, _) = resolve(device, Some(running))?;
    Ok((running, index))
}

/// Drops the process's use of the runtime (`freeRuntime`). Afterwards
/// [`device_state`] is [`DeviceState::NotInitialized`], streams already
/// resolved keep working (the runtime and its streams are never destroyed:
/// their handles stay valid), and [`start_runtime`] and everything that needs
/// it fail with [`Error::RuntimeReset`] instead of silently doing nothing.
/// Before any start it does nothing, and in a child forked after the start,
/// or while a parent thread was starting the runtime, too (the runtime is
/// the parent's).
///
/// Thread-safety: any thread may call it; it waits for another thread's
/// start or load of the runtime to end, as [`start_runtime`] does.
pub fn free_runtime() {
    if check_not_forked().is_err() {
        // The runtime is the parent's. Not logged: the log's locks may have
        // been held by a parent thread at the fork.
        return;
    }
    let Ok(_slot) = LIFECYCLE.lock() else {
        // A child forked while a parent thread held the lock: the runtime,
        // if any, is the parent's. Or a backend's method called this during
        // a start on this thread: there is no runtime to free yet.
        return;
    };
    if RUNNING.get().is_some() {
        FREED.store(true, Ordering::Release);
        tracing::info!("Spyre runtime freed; runtime reset is not supported in this process");
    }
}

/// The pool for `device`, starting the runtime on it first if needed.
///
/// # Errors
/// As [`start_runtime`]; [`Error::OtherDevice`] when the runtime runs on
/// another device.
pub(crate) fn pool_for(device: Device) -> Result<&'static StreamPool<'static>> {
    let (running, requested) = start_on(device)?;
    bound_pool(running, requested)
}

/// The pool for `device` when the runtime has started; starts nothing.
///
/// # Errors
/// [`Error::NotStarted`] before the start; [`Error::ForkedProcess`] in a
/// forked child; [`Error::OtherDevice`] for another device.
pub(crate) fn started_pool_for(device: Device) -> Result<&'static StreamPool<'static>> {
    let running = running()?;
    let (requested, _) = resolve(device, Some(running))?;
    bound_pool(running, requested)
}

/// The marker events of `stream`'s runtime, whose handle is checked (the
/// stream's device is the runtime's). Starts nothing.
///
/// # Errors
/// As [`crate::SpyreStream::query`] for `stream`; [`Error::RuntimeReset`]
/// after [`free_runtime`].
pub(crate) fn markers_of(stream: SpyreStream) -> Result<&'static MarkerEvents> {
    stream.handle()?;
    check_not_freed()?;
    Ok(running()?.markers)
}

/// The caching allocator that serves `stream`, whose handle is checked
/// (the stream's device is the runtime's). Starts nothing.
///
/// # Errors
/// As [`crate::SpyreStream::query`] for `stream`; [`Error::RuntimeReset`]
/// after [`free_runtime`].
pub(crate) fn allocator_of(stream: SpyreStream) -> Result<&'static CachingAllocator> {
    stream.handle()?;
    check_not_freed()?;
    Ok(&running()?.allocator)
}

/// The caching allocator of `device` when the runtime has started; starts
/// nothing.
///
/// # Errors
/// As [`started_pool_for`].
pub(crate) fn started_allocator_for(device: Device) -> Result<&'static CachingAllocator> {
    started_pool_for(device)?;
    Ok(&running()?.allocator)
}

/// The device the started runtime runs on; `None` before the start (and in
/// a forked child).
pub(crate) fn started_device() -> Option<u8> {
    running().ok().map(|running| running.pool.device())
}

/// `running`'s pool if it serves `requested`.
fn bound_pool(running: &'static Running, requested: u8) -> Result<&'static StreamPool<'static>> {
    let bound = running.pool.device();
    if requested == bound {
        Ok(&running.pool)
    } else {
        Err(Error::OtherDevice { requested, bound })
    }
}

/// The pool that resolves `stream`'s handle. Does not start anything: a
/// stream can only have a handle if the pool exists.
///
/// # Errors
/// [`Error::NoHandle`] before the start; [`Error::ForkedProcess`] in a
/// forked child.
#[inline]
pub(crate) fn pool_of(stream: SpyreStream) -> Result<&'static StreamPool<'static>> {
    running_for(stream).map(|running| &running.pool)
}

/// What the launch chokepoint needs: `stream`'s handle, resolved as
/// [`pool_of`] and [`StreamPool::resolve`] do, and the barrier requests of
/// memory reused on the device's streams.
///
/// # Errors
/// As [`pool_of`], and [`StreamPool::resolve`]'s.
#[inline]
pub(crate) fn launch_target(
    stream: SpyreStream,
) -> Result<(&'static dyn Stream, &'static ReuseBarriers)> {
    let running = running_for(stream)?;
    Ok((
        running.pool.resolve(stream)?,
        running.allocator.reuse_barriers(),
    ))
}

/// The started runtime, for a call on `stream`: [`Error::NoHandle`] before
/// the start.
#[inline]
fn running_for(stream: SpyreStream) -> Result<&'static Running> {
    match running() {
        Err(Error::NotStarted) => Err(Error::NoHandle {
            id: stream.id(),
            device: stream.device_index(),
        }),
        started => started,
    }
}

/// The process-wide pool, for code that needs the pool or its runtime
/// directly (the `StreamPool` methods, raw handles).
///
/// The reference is the parent's in a child of `fork()`: the pool and its
/// handles are below the process-wide API and do not check for a fork, so
/// a child must not use a pool or a handle obtained before forking (its
/// calls would reach the parent's device, whose threads the child does
/// not have). Call this again in the child: it returns the error.
///
/// # Errors
/// [`Error::NotStarted`] before [`start_runtime`]; [`Error::ForkedProcess`]
/// in a child forked after the start.
pub fn global_pool() -> Result<&'static StreamPool<'static>> {
    running().map(|r| &r.pool)
}

/// The state of the process's device (`SpyreGetDeviceState`):
/// [`DeviceState::NotInitialized`] before start, after [`free_runtime`], and
/// in a child forked after the start (it has no runtime of its own);
/// [`DeviceState::StreamError`] when some stream has failed or needs shutdown
/// (or the runtime cannot tell); [`DeviceState::Ok`] otherwise.
pub fn device_state() -> DeviceState {
    match running() {
        Ok(_) if FREED.load(Ordering::Acquire) => DeviceState::NotInitialized,
        Err(_) => DeviceState::NotInitialized,
        Ok(running) => match running.pool.runtime().has_stream_error() {
            Ok(false) => DeviceState::Ok,
            Ok(true) => DeviceState::StreamError,
            Err(e) => {
                tracing::warn!(error = %e, "has_stream_error failed; reporting StreamError");
                DeviceState::StreamError
            }
        },
    }
}

/// Number of logical devices the backend sees (`device_count`). Loads the
/// backend if it is not loaded yet; does not start the runtime.
///
/// Thread-safety: any thread may call it. Before the start, while another
/// thread is inside a call that starts, frees or loads the runtime (a start
/// may load the flex library and create the runtime and the pool's
/// streams), it waits for that call to end, by yields and then sleeps of up
/// to 1 ms.
///
/// # Errors
/// The backend's load, configuration or counting error
/// ([`Error::BackendUnavailable`], [`Error::BackendFromParent`], as for
/// [`start_runtime`]); [`Error::ForkWatch`] when the fork watcher cannot be
/// registered; [`Error::ForkedProcess`] in a child forked after the start;
/// [`Error::ForkedDuringStart`] before the start, in a child forked while
/// a parent thread was inside a call that starts, frees or loads the
/// runtime; [`Error::LifecycleReentered`] before the start, from a
/// backend's methods during a start.
pub fn device_count() -> Result<u32> {
    if let Some(running) = RUNNING.get() {
        return Ok(running.check_process()?.backend.device_count()?);
    }
    let mut slot = LIFECYCLE.lock()?;
    match RUNNING.get() {
        Some(running) => Ok(running.check_process()?.backend.device_count()?),
        None => backend_slot(&mut slot)?
            .device_count()
            .map_err(Error::from_backend),
    }
}

/// The number of host-compute streams: the started pool's, or, before the
/// start, what `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS` would give it now.
///
/// # Errors
/// [`Error::InvalidEnv`] for a malformed variable before the start;
/// [`Error::ForkedProcess`] in a forked child.
pub(crate) fn host_compute_streams() -> Result<usize> {
    match running() {
        Ok(running) => Ok(running.pool.config().host_compute_streams()),
        Err(Error::NotStarted) => {
            env::parse_host_compute_streams(env::var(env::NUM_HOST_COMPUTE_STREAMS).as_deref())
        }
        Err(other) => Err(other),
    }
}

/// Whether streams created from now on track hazards (`get_hazard_tracker_enabled`).
/// `false` before the runtime starts.
pub fn hazard_tracker_enabled() -> bool {
    global_pool().is_ok_and(|p| p.hazard_tracker_enabled())
}

/// Sets whether streams created from now on track hazards
/// (`set_hazard_tracker_enabled`, a testing and tuning hook). Starts the
/// runtime on the current device if needed.
///
/// # Errors
/// The start error; [`Error::OtherDevice`] when the runtime runs on
/// another device than this thread's current one (nothing is changed).
pub fn set_hazard_tracker_enabled(enabled: bool) -> Result<()> {
    pool_for(Device::CURRENT)?.set_hazard_tracker_enabled(enabled);
    Ok(())
}

/// Facts about the started runtime for diagnostics, or `None` before start.
#[derive(Clone, Debug)]
pub struct RuntimeInfo {
    /// The backend's name (`mock` or `hardware`).
    pub backend: &'static str,
    /// The backend's details (library path and ABI version, or mock settings).
    pub backend_details: Vec<(&'static str, String)>,
    /// The logical device the process is bound to.
    pub device: u8,
    /// Why that device.
    pub device_source: DeviceSource,
    /// Number of host-compute streams.
    pub host_compute_streams: usize,
    /// Whether new streams track hazards.
    pub track_hazards: bool,
    /// Whether [`free_runtime`] has been called.
    pub freed: bool,
}

/// Facts about the started runtime, or `None` before [`start_runtime`] and
/// in a child forked after it.
pub fn runtime_info() -> Option<RuntimeInfo> {
    running().ok().map(|r| RuntimeInfo {
        backend: r.backend.name(),
        backend_details: r.backend.details(),
        device: r.pool.device(),
        device_source: r.device_source,
        host_compute_streams: r.pool.config().host_compute_streams(),
        track_hazards: r.pool.hazard_tracker_enabled(),
        freed: FREED.load(Ordering::Acquire),
    })
}

/// The backend the build would choose with the current `SPYRE_BACKEND`.
///
/// # Errors
/// As [`backend::parse_backend`].
pub fn selected_backend() -> Result<BackendKind> {
    backend::parse_backend(env::var(env::BACKEND).as_deref())
}

//! The Spyre stream pool: torch-spyre's stream layer, in Rust.
//!
//! A process-wide pool of device streams over a flex runtime: the default
//! stream, 32 normal- and 32 high-priority streams handed out round robin,
//! host-compute streams, a thread-local current stream, and device-wide
//! synchronization, with the ownership and locking discipline of the spec
//! (`stream-ownership-and-synchronization`) — except that handle resolution
//! takes no lock (see "Where this differs", below).
//!
//! ```
//! # fn main() -> spyre_stream::Result<()> {
//! use spyre_stream::{Device, HostBuffer, LaunchOptions};
//!
//! // Run on the software device whatever the features and SPYRE_BACKEND say.
//! spyre_stream::set_backend(Box::new(spyre_mock::MockSystem::default()))?;
//! let stream = spyre_stream::stream_from_pool(Device::CURRENT, 0)?;
//! let _guard = spyre_stream::StreamGuard::new(stream)?;
//! let current = spyre_stream::current_stream(Device::CURRENT)?;
//! assert_eq!(current, stream);
//! current.launch_host_callback(|| println!("ran in stream order"), LaunchOptions::new())?;
//! current.synchronize()?;
//! # let _ = HostBuffer::zeroed(0);
//! # Ok(()) }
//! ```
//!
//! # Ownership
//!
//! The runtime (a [`flex_rt::Runtime`]) creates and owns every stream. The
//! [`StreamPool`] stores borrowed handles keyed by [`StreamId`]; it never
//! creates a handle twice for one id and never destroys one. A
//! [`SpyreStream`] is a `Copy` value of (device, id) and holds no handle: each
//! operation resolves the handle through the pool. The process-wide runtime
//! is leaked on purpose, so handles stay valid for the life of the process,
//! even after [`free_runtime`].
//!
//! # Invariants, and why they hold
//!
//! - **The handle table is append-only.** A slot is written at most once
//!   (under the exclusive lock at initialization, under the slot's own
//!   creation lock for a pool id), published with release, and never cleared or
//!   overwritten; a reader (acquire, no lock) therefore sees a whole handle
//!   or none, never a partial update or a removed entry.
//! - **Ids are never reassigned.** Ids map to slots of a fixed table (0,
//!   1–32, 33–64, 65..65+N-1), so an id always names the same handle.
//! - **A handle is created at most once per id.** A pool id's stream is
//!   created only under that id's creation lock, after checking that the
//!   slot is empty (the host-compute streams at initialization, under the
//!   exclusive lock).
//! - **Initialization is atomic.** The default-stream mapping and the
//!   host-compute streams are created first, then written, then published by
//!   one release store of the pool's `initialized` flag; readers resolve
//!   those ids only after seeing the flag, so they see all of them or none.
//!   On error nothing is written and a later call retries.
//! - **The pool holds no lock while waiting on the device**, and takes none
//!   to resolve a handle or, once every id of a pool has its stream and no
//!   failed id waits to be handed out again, to assign from that pool:
//!   `resolve` is an acquire load, such an assignment an acquire load and
//!   an atomic add (before that, an assignment takes the pool's retry lock);
//!   [`synchronize_device`] snapshots the table without a lock, then waits.
//!   (The caching allocator's retry of a full device is the one wait made
//!   under a lock: its own, so that such retries wait one at a time; see
//!   [`DeviceBuffer::new`].)
//! - **One device per process.** The pool is bound to the runtime's logical
//!   device; asking for another fails with an error naming both. A request
//!   that cannot be served binds nothing: the device is checked against the
//!   visible devices, and arguments the call can check alone (a host-compute
//!   id, an allocation of 0 bytes, a stream id outside the id space) are
//!   checked, before the runtime starts; the first call that names a device
//!   explicitly starts the runtime on that device.
//! - **One reading of the current device.** A thread's current device is the
//!   one it set with [`set_device`]; otherwise, once the runtime has started,
//!   the runtime's device; before that, the launcher's local rank
//!   (`LOCAL_RANK` or its MPI and Slurm counterparts, see [`mod@env`]) read
//!   afresh (the same
//!   reading the start uses). Once started, [`set_device`] accepts only the
//!   runtime's device. The one way left for a thread's device to differ is
//!   a `set_device(d)` before the start (or racing it) while the start, by
//!   any thread, named another device; that thread's calls on the current
//!   device then fail with [`Error::OtherDevice`], naming both.
//! - **Device state does not cross `fork()`.** In a child forked after the
//!   start, every entry point of the process-wide API that uses device
//!   state and returns a `Result` returns [`Error::ForkedProcess`]
//!   (PyTorch's "cannot re-initialize CUDA in forked subprocess"), but for
//!   arguments wrong on their face (0 bytes, a device index above 127, a
//!   stream id outside the id space), which are refused first, as in any
//!   process; [`device_state`] says
//!   `NotInitialized`, [`runtime_info`] `None`, [`counters()`] an empty
//!   snapshot, and [`free_runtime`] does nothing. Detected by a
//!   `pthread_atfork` handler at the cost of one relaxed atomic load per
//!   call, checked before any lock: never the
//!   parent's streams. A backend created before a fork is not used in the
//!   child: one the environment chose is made afresh there; one installed
//!   with [`set_backend`] makes the child's start fail with
//!   [`Error::BackendFromParent`] until the child installs its own. The
//!   locks the child's own runtime then takes (this crate's and flex-rt's,
//!   [`flex_rt::sync`]; the software device's, the standard library's)
//!   keep no state outside themselves: the parent's threads that waited
//!   for one at the fork leave nothing behind in the child. In a
//!   child forked after the start, [`start_trace`] and [`stop_trace`] do
//!   nothing. A child forked while another thread was inside
//!   [`start_runtime`] (or the first use of the pool, [`set_backend`], or
//!   [`device_count`] or [`set_device`] before the start, which hold the
//!   same lifecycle lock) gets [`Error::ForkedDuringStart`] from each of
//!   those calls, at once: the lock names the fork generation that took
//!   it ([`free_runtime`] does nothing there; a fork during the process's
//!   first registration of its fork watcher, inside the first of those
//!   calls, leaves the child to finish that registration). (A child
//!   forked while another thread starts or ends a thread inherits the
//!   Rust standard library's lock of thread starts held: the software
//!   device's runtime in the child then hangs starting its engines. A [`HostBuffer`] a copy had in flight at
//!   the fork stays leased in the child for good: its `read` and `write`
//!   block there, its `try_read` and `try_write` say `None`.)
//! - **The runtime starts once.** A failed start leaves nothing behind and can
//!   be retried; after [`free_runtime`] a start is an explicit error, never a
//!   silent no-op.
//!
//! # Locking discipline
//!
//! | operation | spec | here |
//! |---|---|---|
//! | [`StreamPool::resolve`] (every stream operation) | shared lock | no lock: acquire load of a write-once slot |
//! | [`StreamPool::default_stream_handle`] | shared lock | no lock (after initialization) |
//! | [`StreamPool::synchronize_device`] | shared lock while collecting handles | no lock: the snapshot loads the `initialized` flag (acquire), then each slot (initialization whole or not at all, and every stream anyone has been given); none while waiting |
//! | pool initialization | exclusive lock | exclusive lock; published by a release store |
//! | [`StreamPool::stream_from_pool`] | exclusive lock, the stream of a fresh id created inside it; the cursor is written on every assignment | the cursor advanced by one atomic add (an id whose creation failed is handed out again first, from a queue under its own lock, the cursor not written then); a fresh id's stream created under that id's creation lock; once every id has its stream and nothing is queued, an acquire load and the add, nothing else |
//! | [`StreamPool::host_compute_stream`] | exclusive lock; the cursor is written on every assignment | the cursor advanced by a compare-and-swap loop (one read-modify-write when uncontended), no lock |
//!
//! # torch-spyre names
//!
//! | torch-spyre (C++) | here |
//! |---|---|
//! | `getStreamFromPool(device, priority)` | [`stream_from_pool`], [`StreamPool::stream_from_pool`] |
//! | `getDefaultStream(device)` | [`default_stream`], [`StreamPool::default_stream`] |
//! | `getCurrentStream(device)` | [`current_stream`] |
//! | `setCurrentStream(stream)` | [`set_current_stream`], [`StreamGuard`] |
//! | `getHostComputeStream(device)` | [`host_compute_stream`], [`StreamPool::host_compute_stream`] |
//! | `getHostComputeStreamById(id, device)` | [`host_compute_stream_by_id`], [`StreamPool::host_compute_stream_by_id`] |
//! | `getDefaultStreamRuntimeHandle(device)` | [`default_stream_handle`], [`StreamPool::default_stream_handle`] |
//! | `synchronizeDevice(device)` | [`synchronize_device`], [`StreamPool::synchronize_device`] |
//! | `startRuntime()` | [`start_runtime`] |
//! | `freeRuntime()` | [`free_runtime`] |
//! | `SpyreStream::resolveRuntimeHandle()` | [`StreamPool::resolve`] |
//! | `SpyreStreamGetError(stream)` | [`SpyreStream::error`], [`StreamErrorState::of`] |
//! | `SpyreGetDeviceState()` | [`device_state`] |
//! | `SpyreStreamGetErrorString(err)` | [`StreamErrorState::as_str`] |
//! | `SpyreStream::query()` / `synchronize()` | [`SpyreStream::query`] / [`SpyreStream::synchronize`] |
//! | `launchH2D` / `launchD2H` / `launchCompute` / `launchHostCallback` / `fillAsync` | [`SpyreStream::launch_h2d`] / [`SpyreStream::launch_d2h`] / [`SpyreStream::launch_compute`] / [`SpyreStream::launch_host_callback`] / [`SpyreStream::launch_fill`] |
//! | `SpyreGuardImpl::tls_idx`, `set_device` | [`current_device`], [`set_device`] |
//! | `get/set_hazard_tracker_enabled` | [`hazard_tracker_enabled`], [`set_hazard_tracker_enabled`] |
//!
//! # Events: PyTorch and cudarc names
//!
//! torch-spyre has no events yet ("event-based stream synchronization is not
//! yet implemented"); these follow `torch.cuda` and cudarc.
//!
//! | PyTorch (`torch.cuda`) / cudarc | here |
//! |---|---|
//! | `torch.cuda.Event()` / `Event(enable_timing=True)`; `CudaEvent` | [`SpyreEvent::new`] / [`SpyreEvent::with_timing`] |
//! | `Event.record(stream)`, `Stream.record_event(event)`; `CudaEvent::record` | [`SpyreEvent::record`], [`SpyreStream::record_event`] |
//! | `Event.wait(stream)`, `Stream.wait_event(event)`; `CudaStream::wait` | [`SpyreEvent::wait`], [`SpyreStream::wait_event`] |
//! | `Stream.wait_stream(other)`; `CudaStream::join` | [`SpyreStream::wait_stream`] |
//! | `Event.query()` / `Event.synchronize()` | [`SpyreEvent::query`] / [`SpyreEvent::synchronize`] |
//! | `Event.elapsed_time(end)` (ms, `float`) | [`SpyreEvent::elapsed_time`] ([`std::time::Duration`]) |
//! | (none: awaiting a CUDA event needs polling) | [`SpyreEvent::synchronize_async`], [`SpyreStream::synchronize_async`] |
//!
//! # Device memory: PyTorch and cudarc names
//!
//! torch-spyre hands out raw allocations; these follow `torch.cuda`'s
//! caching allocator and cudarc ([`DeviceBuffer`] has the rules).
//!
//! | PyTorch (`torch.cuda`) / cudarc | here |
//! |---|---|
//! | `torch.empty(n, device=...)`; `CudaStream::alloc` | [`DeviceBuffer::new`] |
//! | `torch.zeros(n, device=...)`; `alloc_zeros` | [`DeviceBuffer::zeros`] |
//! | `torch.tensor(data, device=...)`; `memcpy_stod` | [`DeviceBuffer::from_host`] |
//! | `Tensor.copy_(host)`; `memcpy_htod` | [`DeviceBuffer::copy_from_host`], [`DeviceBuffer::copy_from_host_buffer`] |
//! | `Tensor.cpu()`; `memcpy_dtoh`, `memcpy_dtov` | [`DeviceBuffer::copy_to_host`], [`DeviceBuffer::to_vec`], [`DeviceBuffer::copy_to_host_buffer`] |
//! | `Tensor.fill_(v)`; `memset_zeros` | [`DeviceBuffer::fill`] |
//! | `Tensor.record_stream(s)` | [`DeviceBuffer::record_stream`] |
//! | `memory_allocated` / `memory_reserved` / `max_memory_allocated` | [`memory_allocated`] / [`memory_reserved`] / [`max_memory_allocated`] |
//! | `memory_stats` / `reset_peak_memory_stats` / `empty_cache` | [`memory_stats`] / [`reset_peak_memory_stats`] / [`empty_cache`] |
//! | `mem_get_info` | [`memory_info`] |
//!
//! # Tracing and counters
//!
//! [`start_trace`] and [`stop_trace`] record every operation launched
//! through the pool's streams in between, with its stream, kind, bytes and
//! times ([`Trace`]); `spyre run --trace FILE` writes it for Perfetto. Off,
//! it costs one relaxed atomic load per launch.
//!
//! [`enable_counters`] and [`counters()`] count, per stream and for the
//! device, operations launched, completed and failed, bytes each way (of
//! copies that completed) and operations in flight; off (the default), one
//! relaxed atomic load per launch.
//!
//! # Where this differs from torch-spyre, on purpose
//!
//! - **Handle resolution takes no lock** (the spec's table has a shared
//!   lock for `resolveRuntimeHandle`, `getDefaultStreamRuntimeHandle` and
//!   the snapshot of `synchronizeDevice`; the snapshot reads the
//!   `initialized` flag first, so that it sees an initialization whole).
//!   The spec's own invariants make the
//!   lock unnecessary: the table is append-only, an id is never remapped,
//!   and the pool never destroys a handle. So a slot, once written, never
//!   changes: publishing it with release and reading it with acquire gives a
//!   reader the whole handle or nothing, exactly what the shared lock gave,
//!   without two locked read-modify-writes per operation on one cache line
//!   (resolve went from 10.1 ns to 1.1 ns with one thread and from 38 ns to
//!   1.6 ns with two, beside an array load of 0.4–0.8 ns; BENCHMARKS.md).
//!   Initialization stays under the exclusive lock and atomic through the
//!   release-published flag. The loom models check the protocol and fail
//!   when the publication order is broken (RELIABILITY.md).
//! - **Assignment takes no lock once every pool id has its stream.** The
//!   spec advances the cursors under the exclusive lock. The advance is the
//!   only write of a hand-out, and one atomic read-modify-write is as
//!   exclusive as the lock made it: each advance sees the one before, so
//!   the round robin is the spec's. An id whose creation failed is queued
//!   (under a lock of its own) and handed out first, the cursor not
//!   advanced; a flag (set with release once all 32 ids have streams and
//!   nothing is queued, cleared when a failure queues an id) lets an
//!   assignment skip the queue and the table: an acquire load and an atomic
//!   add (5.8 ns against 19.2 ns for torch-spyre's discipline in C++;
//!   BENCHMARKS.md).
//! - **A pool stream is created outside the exclusive section** (upstream
//!   runs `createStream` inside the write lock, so a creation that takes
//!   10 ms stalls every assignment). The assignment hands out the id (an
//!   atomic add, above) and creates the stream under a lock of that id
//!   alone: resolving any id and handing out ids that have streams
//!   proceed meanwhile, and only callers handed the same fresh id wait for
//!   its creation (at most one creation per id still holds). A failed
//!   creation (an error or a panic) publishes nothing and its id is handed
//!   out again first, once per failure, by a later assignment of the pool,
//!   which then does not advance the cursor. The cursor advances before the
//!   creation, as torch-spyre's does, but torch-spyre skips an id whose
//!   creation failed until its cursor comes round to it again; here, once
//!   no creation is in flight, the ids handed out are those of a cursor
//!   that stayed on the failure, so that a transient failure does not shift
//!   the round robin (an assignment concurrent with the failing one may
//!   still be handed the next id before the failed one). A runtime's `create_stream` must not assign from
//!   the same pool.
//! - A positive priority asks for a normal-priority stream, as
//!   `torch.cuda.Stream(priority=...)` documents and CUDA does (a priority
//!   past the lowest is the lowest), so a priority written for CUDA gets
//!   the stream it would get there (PyTorch's C++ `getStreamFromPool`
//!   refuses a positive one); and the runtime priority always matches the
//!   id's pool;
//!   torch-spyre sends any non-zero priority to the high pool and creates
//!   NORMAL runtime streams for host-compute ids.
//! - After [`free_runtime`], a later start and every call that would start
//!   the runtime, hand out a stream (from a pool, a host-compute stream,
//!   the default stream, the current stream where it falls back to the
//!   default one), allocate from the freed runtime's allocator
//!   ([`DeviceBuffer::new`], [`allocate`]) or take its marker events is an
//!   explicit error ([`Error::RuntimeReset`]); operations on streams
//!   already handed out keep working, so that work in flight can still be
//!   waited for, and so do the allocator's statistics, [`empty_cache`] and
//!   [`free`] of memory already allocated. torch-spyre keeps handing out ids that already have handles and
//!   would call a null runtime for a fresh one ("Runtime reset after stream
//!   initialization is not supported"): whether a call works would depend
//!   on which ids other threads had been given before.
//! - A failed pool initialization publishes nothing and can be retried.
//! - `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS` is parsed strictly, and fixed
//!   when the runtime starts. Before the start, [`host_compute_stream_by_id`]
//!   and [`set_current_stream`] of a host-compute id read it again to check
//!   the id (a value above 8 is then warned about at each read).
//!   `LOCAL_RANK` (and the launchers' variables below) are parsed with
//!   torch-spyre's `parse_local_rank` rules, but leading whitespace, which
//!   its `strtoll` skips, is refused as any other stray character is.
//! - [`synchronize_device`] waits for every stream even after one has
//!   failed, then returns the first failure as [`Error::DeviceSynchronize`]
//!   naming that stream's id, the runtime's error as its source;
//!   torch-spyre stops at the first failing stream and propagates its
//!   error unwrapped. So when it returns no stream of the device is still
//!   running what was enqueued before the call, and the error says which
//!   stream failed (the runtime's error alone names none).
//! - `SPYRE_HAZARD_TRACKER` is a boolean of the workspace's usual spellings
//!   (`1/0/true/false/on/off/yes/no`, any case); another value is an error
//!   instead of silently off. An empty value means unset for every variable.
//! - A call that names a device explicitly before the runtime has started
//!   starts it on that device ([`DeviceSource::Requested`]), as in CUDA.
//!   torch-spyre starts the runtime on the thread's device whatever the
//!   call names and binds its pool to the index the call named: its streams
//!   then run on the thread's device under the other index, and calls for
//!   the thread's own device are refused afterwards
//!   (`initializeStreamPoolImpl already called with device_index ...`).
//! - A forked child gets [`Error::ForkedProcess`] instead of its parent's
//!   device state.
//! - **The process's device comes from the launcher that started it**, not
//!   only from torchrun's `LOCAL_RANK` (the spec's one variable): then Open
//!   MPI's `OMPI_COMM_WORLD_LOCAL_RANK`, MPICH's `MPI_LOCALRANKID` and
//!   Slurm's `SLURM_LOCALID` ([`env::LOCAL_RANK_VARIABLES`]). Under
//!   `mpirun` or `srun` without torchrun, reading `LOCAL_RANK` alone puts
//!   every rank of a node on device 0, the failure a user of those launchers
//!   meets first; torchrun's variable still wins where it is set. A
//!   launcher that already gives each task only its own device (so that it
//!   sees it as device 0) needs `LOCAL_RANK=0` set for its tasks, or the
//!   explicit [`set_device`].
//!
//! # Environment
//!
//! The launchers' local-rank variables (`LOCAL_RANK`, then
//! `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`),
//! `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS`, `SPYRE_HAZARD_TRACKER`,
//! `SPYRE_BACKEND` (see [`mod@env`]); the software device reads
//! `SPYRE_MOCK_*` and `SPYRE_DEVICES`, the hardware backend
//! `FLEX_RUNTIME_LIB`.
//!
//! # Backends
//!
//! Feature `mock` (default) runs on the software device; feature `hardware`
//! loads a flex library at run time. With both, `SPYRE_BACKEND=mock|hardware`
//! chooses and the default is hardware; a missing library is an error, never
//! a silent fallback to the mock.
#![forbid(unsafe_code)]

mod backend;
mod counters;
mod current;
mod device;
pub mod env;
mod error;
mod event;
mod id;
mod instrument;
mod lifecycle_lock;
mod loom_shim;
mod marker;
mod memory;
mod pool;
mod process_pool;
mod runtime;
mod signal;
mod state;
mod stream;
mod stream_operations;
mod trace;

pub use backend::{BackendKind, parse_backend};
pub use counters::{Counters, CountersSnapshot, counters, enable_counters};
pub use current::{StreamGuard, current_stream, set_current_stream};
pub use device::Device;
pub use error::{Error, EventRole, OutOfMemory, Result};
pub use event::{SpyreEvent, SynchronizeFuture, capabilities};
pub use flex_rt::{
    ADDRESS_ALIGNMENT, Capabilities, CompositeAddress, DataFormat, FlexError, HostBuffer,
    LaunchOptions, LogicalAddress, MAX_ADDRESS_CHUNKS, MemoryInfo, MemoryLayout, Status, program,
};
pub use id::{
    DEFAULT_HOST_COMPUTE_STREAMS, HIGH_POOL_END, HIGH_POOL_START, HOST_COMPUTE_START,
    MAX_HOST_COMPUTE_STREAMS, NORMAL_POOL_END, NORMAL_POOL_START, PoolKind, STREAMS_PER_POOL,
    StreamId,
};
pub use memory::{
    DeviceBuffer, DeviceElement, LARGE_SEGMENT, LARGE_SEGMENT_LIMIT, MIN_BLOCK, MemoryStats,
    SEGMENTS_PER_DEVICE, SMALL_REQUEST, SMALL_SEGMENT, allocate, allocations_held, empty_cache,
    free, max_memory_allocated, memory_allocated, memory_info, memory_layout, memory_reserved,
    memory_stats, reset_peak_memory_stats, segment_bytes,
};
pub use pool::{PoolConfig, StreamPool};
pub use process_pool::{
    default_stream, default_stream_handle, host_compute_stream, host_compute_stream_by_id,
    stream_from_pool, synchronize_device,
};
pub use runtime::{
    DeviceSource, RuntimeInfo, current_device, device_count, device_state, free_runtime,
    global_pool, hazard_tracker_enabled, runtime_info, selected_backend, set_backend, set_device,
    set_hazard_tracker_enabled, start_runtime,
};
pub use state::{DeviceState, StreamErrorState};
pub use stream::SpyreStream;
pub use trace::{OperationKind, Trace, TraceEntry, start_trace, stop_trace};

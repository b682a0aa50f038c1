//! `StreamPool`: the id → handle table and round-robin assignment of the spec.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;

use crossbeam_utils::CachePadded;
use flex_rt::{FlexError, Runtime, Status, Stream, StreamMode, StreamPriority};

use crate::error::{Error, Result};
use crate::id::{
    HIGH_POOL_START, HOST_COMPUTE_START, MAX_HOST_COMPUTE_STREAMS, MAX_STREAM_SLOTS,
    NORMAL_POOL_START, STREAMS_PER_POOL, StreamId,
};
use crate::loom_shim::{AtomicBool, AtomicUsize, Mutex, WriteOnce};
use crate::stream::SpyreStream;

/// `Ok` when `id` is one of the `count` host-compute ids (65..65+count).
///
/// # Errors
/// [`Error::NotHostComputeStream`] naming `id` and the range.
pub(crate) fn check_host_compute_id(id: i64, count: usize) -> Result<()> {
    let end = HOST_COMPUTE_START + count as i64;
    if (HOST_COMPUTE_START..end).contains(&id) {
        Ok(())
    } else {
        Err(Error::NotHostComputeStream {
            id,
            start: HOST_COMPUTE_START,
            end,
        })
    }
}

/// Configuration fixed when a pool is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    host_compute_streams: usize,
    track_hazards: bool,
}

impl PoolConfig {
    /// `host_compute_streams` host-compute streams (ids 65..65+N-1, N in
    /// 1..=8); `track_hazards` is the initial value of the hazard tracker,
    /// latched into every stream the pool creates.
    ///
    /// # Errors
    /// [`Error::InvalidHostComputeStreams`] when N is outside 1..=8.
    pub fn new(host_compute_streams: usize, track_hazards: bool) -> Result<Self> {
        if !(1..=MAX_HOST_COMPUTE_STREAMS).contains(&host_compute_streams) {
            return Err(Error::InvalidHostComputeStreams {
                count: host_compute_streams,
            });
        }
        Ok(Self {
            host_compute_streams,
            track_hazards,
        })
    }

    /// Number of host-compute streams.
    pub fn host_compute_streams(&self) -> usize {
        self.host_compute_streams
    }

    /// Initial hazard-tracker setting.
    pub fn track_hazards(&self) -> bool {
        self.track_hazards
    }
}

impl Default for PoolConfig {
    /// Four host-compute streams, no hazard tracking: torch-spyre's defaults.
    fn default() -> Self {
        Self {
            host_compute_streams: crate::id::DEFAULT_HOST_COMPUTE_STREAMS,
            track_hazards: false,
        }
    }
}

/// Hands an id out again when dropped: armed while its stream is created,
/// forgotten once it is, so an error or a panic of the creation leaves the
/// id to a later assignment.
struct RetryOnDrop<'p, 'rt> {
    pool: &'p StreamPool<'rt>,
    high: bool,
    offset: usize,
}

impl Drop for RetryOnDrop<'_, '_> {
    fn drop(&mut self) {
        self.pool.cursor(self.high).retry_later(self.offset);
    }
}

/// The round robin of one pool of 32 ids, as offsets from its first id.
///
/// Once every id of the pool has its stream and no failed creation waits
/// to be retried, the cursor is *settled*: an assignment is one acquire
/// load of that flag and one atomic add, with no lock and no look at the
/// table. Until then (the first round, and after a failure) an assignment
/// takes `retry`'s lock, hands out a failed id first, and creates the id's
/// stream if it has none.
struct PoolCursor {
    /// Hand-outs the round robin has made; the next offset is this modulo
    /// 32 (`2^usize::BITS` is a multiple of 32, so the order survives the
    /// wrap). On a cache line of its own: every assignment writes it, and
    /// the flag and slots every assignment reads must not move with it.
    next: CachePadded<AtomicUsize>,
    /// Offsets whose stream creation failed, handed out again first.
    retry: Mutex<VecDeque<usize>>,
    /// Ids of the pool whose stream has been created and published, counted
    /// by the creating thread after the slot's release (acquire-release, so
    /// that whoever reads 32 with acquire sees every slot published).
    created: AtomicUsize,
    /// Every id of the pool has its stream and `retry` is empty. Written
    /// under `retry`'s lock: set with release (after `created` was seen at
    /// 32, so a reader that sees the flag with acquire sees the slots too),
    /// cleared when a failure queues an id.
    settled: AtomicBool,
}

impl PoolCursor {
    fn new() -> Self {
        Self {
            next: CachePadded::new(AtomicUsize::new(0)),
            retry: Mutex::new(VecDeque::new()),
            created: AtomicUsize::new(0),
            settled: AtomicBool::new(false),
        }
    }

    /// The cursor's offset, advancing it.
    #[inline]
    fn advance(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % STREAMS_PER_POOL
    }

    /// The offset to hand out while unsettled: one whose creation failed,
    /// without advancing the cursor (as if the cursor had stayed on it),
    /// else the cursor's, advancing it.
    fn hand_out(&self) -> usize {
        let queued = self.retry.lock().pop_front();
        queued.unwrap_or_else(|| self.advance())
    }

    /// Hands `offset` out again first, its creation having failed: once per
    /// failure, so that every hand-out the cursor advanced for ends in one
    /// success (two callers of one id that both fail push it twice; an
    /// entry whose id a waiter created meanwhile hands out that id again,
    /// as a cursor that stayed on it would). Bounded by the assignments in
    /// flight: every unsettled hand-out pops first.
    fn retry_later(&self, offset: usize) {
        let mut retry = self.retry.lock();
        retry.push_back(offset);
        self.settled.store(false, Ordering::Relaxed);
    }

    /// Settles the cursor if every id of the pool has its stream and
    /// nothing waits for a retry.
    fn settle(&self) {
        let retry = self.retry.lock();
        if retry.is_empty() && self.created.load(Ordering::Acquire) == STREAMS_PER_POOL {
            self.settled.store(true, Ordering::Release);
        }
    }
}

/// The stream pool of one device over one runtime (torch-spyre's `StreamPool`).
///
/// The pool owns no stream: it stores borrowed handles, keyed by stream id, in
/// an append-only table. Ids 0 (default stream) and the host-compute streams
/// are mapped when the pool initializes; ids 1–64 get a handle the first time
/// the round robin hands them out, at most once per id; no id is ever
/// remapped or removed, and the pool never destroys a stream.
///
/// Locking: initialization takes the exclusive lock, as the spec says. An
/// assignment ([`StreamPool::stream_from_pool`],
/// [`StreamPool::host_compute_stream`]) advances its cursor with one atomic
/// read-modify-write instead of under that lock: the advance is the only
/// write of a hand-out, and an atomic one is as exclusive as the lock made
/// it (each advance sees the one before). The stream an assignment creates
/// for a fresh pool id is created under a lock of that id alone, so a slow
/// creation holds up only the callers handed the same id (they wait for it;
/// at most one creation per id still holds). A failed creation (an error or
/// a panic) publishes nothing and hands its id out again, first, to a later
/// assignment of that pool, which does not advance the cursor then: once
/// no creation is in flight, the ids handed out are those of a cursor that
/// stayed put on the failure (torch-spyre's, advanced before the creation
/// as here, skips a failed id until it comes round again; see the crate
/// docs). Once all 32 ids
/// of a pool have streams and no failed id is queued, an assignment of that
/// pool is an acquire load and an atomic add. A runtime's `create_stream` must not assign
/// from the same pool (it would wait for itself). Handle resolution
/// ([`StreamPool::resolve`], [`StreamPool::default_stream_handle`]) and the
/// snapshot of [`StreamPool::synchronize_device`] take no lock: the table
/// is append-only and each slot is written once (published with release,
/// read with acquire), so a reader sees a whole handle or none and never
/// waits for a writer. This departs from the spec's locks on purpose; see
/// the crate docs. No lock is held while waiting on the device.
///
/// Initialization is atomic: the default-stream mapping and the host-compute
/// streams are created first, written to their slots, and published together
/// by one release store of the `initialized` flag; a reader resolves an
/// initialization id only after seeing the flag (acquire), so it sees all of
/// them or none. A failed initialization writes nothing, and a later call
/// retries; it creates only the host-compute streams the failed one did
/// not, so none is created twice or left unused.
///
/// This is a value; the process-wide pool of the spec is one of them, behind
/// the crate's free functions. Tests and embedders may build their own. A
/// [`SpyreStream`] is only a (device, id) pair: the crate's operations on
/// one (its launches, query and synchronize, events, device buffers)
/// resolve it in the process-wide pool, never in the pool that handed it
/// out. A stream of a pool built by hand is used through its raw handle,
/// [`StreamPool::resolve`]; given to those operations it names the
/// process-wide pool's stream of the same device and id, or fails with
/// [`Error::NoHandle`] where that pool has none.
///
/// Thread-safety: `Send + Sync`; every method may be called from any thread.
pub struct StreamPool<'rt> {
    runtime: &'rt dyn Runtime,
    device: u8,
    config: PoolConfig,
    track_hazards: AtomicBool,
    /// Slot `i` holds the handle of stream id `i`. Append-only: a slot is
    /// written at most once — under `initialization` at initialization, under
    /// `creations[i]` for a pool id — and never changes again.
    handles: [WriteOnce<&'rt dyn Stream>; MAX_STREAM_SLOTS],
    /// Set (release) once id 0 and the host-compute ids are written.
    initialized: AtomicBool,
    /// The exclusive section: initialization. Holds the host-compute
    /// streams an initialization created before it failed, for the next
    /// one to publish: a retry creates only the rest, so no stream is
    /// created twice for one id and none is left unused.
    initialization: Mutex<Vec<&'rt dyn Stream>>,
    /// The round robin of ids 1–32.
    normal: PoolCursor,
    /// The round robin of ids 33–64.
    high: PoolCursor,
    /// The host-compute index handed out next, below N.
    next_host_compute: AtomicUsize,
    /// Slot `i`'s creation lock: held while the stream of a fresh pool id
    /// is created, outside the exclusive lock.
    creations: [Mutex<()>; MAX_STREAM_SLOTS],
}

impl<'rt> StreamPool<'rt> {
    /// A pool over `runtime`, bound to the runtime's logical device. Cheap:
    /// no stream is created until the pool initializes.
    ///
    /// # Errors
    /// [`Error::InvalidDeviceIndex`] if the runtime's device is above 127.
    pub fn new(runtime: &'rt dyn Runtime, config: PoolConfig) -> Result<Self> {
        let device = u8::try_from(runtime.logical_device())
            .ok()
            .filter(|d| *d <= crate::env::MAX_DEVICE_INDEX)
            .ok_or(Error::InvalidDeviceIndex {
                index: i64::from(runtime.logical_device()),
                expected: "a runtime on a logical device 0..=127",
            })?;
        Ok(Self {
            runtime,
            device,
            config,
            track_hazards: AtomicBool::new(config.track_hazards),
            handles: std::array::from_fn(|_| WriteOnce::new()),
            initialized: AtomicBool::new(false),
            initialization: Mutex::new(Vec::new()),
            normal: PoolCursor::new(),
            high: PoolCursor::new(),
            next_host_compute: AtomicUsize::new(0),
            creations: std::array::from_fn(|_| Mutex::new(())),
        })
    }

    /// The logical device the pool serves.
    pub fn device(&self) -> u8 {
        self.device
    }

    /// The runtime the pool's streams belong to.
    pub fn runtime(&self) -> &'rt dyn Runtime {
        self.runtime
    }

    /// The configuration the pool was made with.
    pub fn config(&self) -> PoolConfig {
        self.config
    }

    /// Whether streams created from now on track hazards.
    pub fn hazard_tracker_enabled(&self) -> bool {
        self.track_hazards.load(Ordering::Relaxed)
    }

    /// Sets whether streams created from now on track hazards; streams that
    /// exist keep the setting they were created with (torch-spyre latches it
    /// per stream). The default stream never tracks hazards.
    pub fn set_hazard_tracker_enabled(&self, enabled: bool) {
        self.track_hazards.store(enabled, Ordering::Relaxed);
    }

    /// Whether the pool has been initialized. No lock (one acquire load).
    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::Acquire)
    }

    /// Initializes the pool if it is not (`initializeStreamPoolImpl`): maps
    /// id 0 to the runtime's default stream and creates the host-compute
    /// streams, under the exclusive lock. Idempotent; one acquire load once
    /// initialized. The cursors start at the first id of their pools (no
    /// assignment runs before initialization, so none needs resetting).
    ///
    /// Thread-safety: any thread may call it; until the pool is initialized
    /// a caller waits on the exclusive lock while another thread
    /// initializes it (creating the host-compute streams), as do the calls
    /// that initialize first (the default stream and its handle, the
    /// host-compute streams, the first assignment).
    ///
    /// # Errors
    /// The runtime's error if a host-compute stream cannot be created; then
    /// nothing is published and the next call retries, keeping the streams
    /// created before the failure (it creates only the rest). Those keep
    /// the hazard-tracker setting they were created with, should
    /// [`StreamPool::set_hazard_tracker_enabled`] change it in between.
    #[inline]
    pub fn initialize(&self) -> Result<()> {
        if self.is_initialized() {
            return Ok(());
        }
        self.initialize_slow()
    }

    /// [`StreamPool::initialize`] once the flag was seen unset.
    #[cold]
    fn initialize_slow(&self) -> Result<()> {
        let mut created = self.initialization.lock();
        if self.initialized.load(Ordering::Relaxed) {
            // Written under this same lock: no ordering needed.
            return Ok(());
        }
        let default = self.runtime.default_stream();
        // Kept as they are created: a failure (an error, or a panic of the
        // runtime's) leaves them for the next call.
        while created.len() < self.config.host_compute_streams {
            let stream = self.create_stream(StreamPriority::High)?;
            created.push(stream);
        }
        // Written once: a failed initialization wrote nothing, so every
        // slot here is still empty.
        let written = self.handles[0].set(default);
        debug_assert!(written, "slot 0 is written once");
        let first = HOST_COMPUTE_START as usize;
        for (slot, handle) in self.handles[first..].iter().zip(created.drain(..)) {
            let written = slot.set(handle);
            debug_assert!(written, "a host-compute slot is written once");
        }
        // Publishes every slot written above (release).
        self.initialized.store(true, Ordering::Release);
        Ok(())
    }

    fn create_stream(&self, priority: StreamPriority) -> Result<&'rt dyn Stream> {
        Ok(self.runtime.create_stream(
            priority,
            StreamMode::StrictOrdering,
            self.hazard_tracker_enabled(),
        )?)
    }

    /// Hands out the next stream of a pool, round robin (`getStreamFromPool`):
    /// a negative `priority` picks the high-priority pool (ids 33–64), zero
    /// or positive the normal pool (ids 1–32), as `torch.cuda.Stream` and
    /// CUDA map a priority past the lowest to the lowest (PyTorch's C++
    /// `getStreamFromPool` refuses a positive one; see the crate docs). The
    /// cursor advances (one atomic add, no lock; until every id of the pool
    /// has its stream, an assignment first looks at the pool's queue of
    /// failed ids, under that queue's lock) on every assignment but one
    /// handing out again an id whose creation failed. The first time an id
    /// is handed out its handle is created, with the runtime priority of its
    /// pool, under that id's own lock, so only callers handed the same id
    /// wait for it (see the type's docs). Initializes the pool first if
    /// needed. The stream returned names a (device, id) pair, which the
    /// crate's stream operations resolve in the process-wide pool: for a
    /// pool built by hand, use [`StreamPool::resolve`] (see the type's
    /// docs).
    ///
    /// # Errors
    /// The runtime's error if the pool cannot initialize or the stream cannot
    /// be created; then nothing is inserted, and the next assignment of the
    /// pool retries the same id without advancing the cursor (as if it had
    /// stayed on it; torch-spyre's cursor has moved on by then).
    #[inline]
    pub fn stream_from_pool(&self, priority: i32) -> Result<SpyreStream> {
        let high = priority < 0;
        let (start, runtime_priority) = if high {
            (HIGH_POOL_START, StreamPriority::High)
        } else {
            (NORMAL_POOL_START, StreamPriority::Normal)
        };
        let cursor = self.cursor(high);
        if cursor.settled.load(Ordering::Acquire) {
            // Every id has its stream, so the pool is initialized too.
            let id = start + cursor.advance() as i64;
            return Ok(SpyreStream::from_parts(self.device, StreamId(id)));
        }
        self.assign_unsettled(high, start, runtime_priority)
    }

    /// [`StreamPool::stream_from_pool`] while the pool's cursor is not
    /// settled: initializes the pool, hands out an id, creates its stream
    /// if it has none, and settles the cursor once every id has one.
    #[cold]
    fn assign_unsettled(
        &self,
        high: bool,
        start: i64,
        priority: StreamPriority,
    ) -> Result<SpyreStream> {
        self.initialize()?;
        let cursor = self.cursor(high);
        let offset = cursor.hand_out();
        let id = start + offset as i64;
        let failed = RetryOnDrop {
            pool: self,
            high,
            offset,
        };
        if self.create_once(id as usize, priority)? {
            // After the slot's release: whoever reads 32 (acquire) sees it.
            cursor.created.fetch_add(1, Ordering::AcqRel);
        }
        std::mem::forget(failed);
        cursor.settle();
        Ok(SpyreStream::from_parts(self.device, StreamId(id)))
    }

    /// The round robin of the high-priority pool, or of the normal one.
    #[inline]
    fn cursor(&self, high: bool) -> &PoolCursor {
        if high { &self.high } else { &self.normal }
    }

    /// Creates and publishes the handle of pool slot `slot` unless it has
    /// one (at most one creation per id): under the slot's creation lock,
    /// so a caller handed an id whose creation is in flight waits for it,
    /// and nobody else does. `true` if this call created it.
    fn create_once(&self, slot: usize, priority: StreamPriority) -> Result<bool> {
        if self.handles[slot].get().is_some() {
            return Ok(false);
        }
        let _creating = self.creations[slot].lock();
        if self.handles[slot].get().is_some() {
            // Created by another caller of this id while this one waited.
            return Ok(false);
        }
        let written = self.handles[slot].set(self.create_stream(priority)?);
        debug_assert!(
            written,
            "a pool slot is written once, under its creation lock"
        );
        Ok(true)
    }

    /// The default stream (id 0), initializing the pool if needed (`getDefaultStream`).
    ///
    /// # Errors
    /// As [`StreamPool::initialize`].
    pub fn default_stream(&self) -> Result<SpyreStream> {
        self.initialize()?;
        Ok(SpyreStream::from_parts(self.device, StreamId::DEFAULT))
    }

    /// The default stream's runtime handle (`getDefaultStreamRuntimeHandle`),
    /// for code that talks to the runtime directly. No lock once initialized.
    /// Its launches skip the reuse barrier as [`StreamPool::resolve`]'s do.
    ///
    /// # Errors
    /// As [`StreamPool::initialize`].
    pub fn default_stream_handle(&self) -> Result<&'rt dyn Stream> {
        let stream = self.default_stream()?;
        self.resolve(stream)
    }

    /// The next host-compute stream, round robin over ids 65..65+N-1
    /// (`getHostComputeStream`). The cursor advances by a compare-and-swap
    /// loop (so that it stays below N across the counter's wrap), no lock;
    /// initializes the pool if needed.
    ///
    /// # Errors
    /// As [`StreamPool::initialize`].
    pub fn host_compute_stream(&self) -> Result<SpyreStream> {
        self.initialize()?;
        let count = self.config.host_compute_streams;
        let advanced =
            self.next_host_compute
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |index| {
                    Some((index + 1) % count)
                });
        // The closure never refuses: `Err` cannot happen, and both carry
        // the previous value.
        let index = advanced.unwrap_or_else(|index| index);
        Ok(SpyreStream::from_parts(
            self.device,
            StreamId(HOST_COMPUTE_START + index as i64),
        ))
    }

    /// The host-compute stream with `id` (`getHostComputeStreamById`). The
    /// range uses N as read when the pool was configured, never re-read.
    ///
    /// # Errors
    /// [`Error::NotHostComputeStream`] naming `id` and the valid range; or as
    /// [`StreamPool::initialize`].
    pub fn host_compute_stream_by_id(&self, id: i64) -> Result<SpyreStream> {
        check_host_compute_id(id, self.config.host_compute_streams)?;
        self.initialize()?;
        Ok(SpyreStream::from_parts(self.device, StreamId(id)))
    }

    /// The runtime handle of `stream` (`resolveRuntimeHandle`). Takes no
    /// lock and never waits: one acquire load of the slot (and, for id 0 and
    /// the host-compute ids, of the `initialized` flag). The handle stays
    /// valid because the table is append-only and the runtime outlives the
    /// pool.
    ///
    /// A launch on the handle goes around the stream layer: it neither
    /// carries nor covers the `pipeline_barrier` that a reuse of device
    /// memory asks for on the stream (see [`crate::DeviceBuffer`]). After
    /// such a reuse, launch through the [`SpyreStream`] first, or set
    /// [`LaunchOptions::pipeline_barrier`](crate::LaunchOptions::pipeline_barrier) yourself.
    ///
    /// # Errors
    /// [`Error::WrongDevice`] for a stream of another device;
    /// [`Error::NoHandle`] when the id has no handle.
    #[inline]
    pub fn resolve(&self, stream: SpyreStream) -> Result<&'rt dyn Stream> {
        if stream.device_index() != self.device {
            return Err(Error::WrongDevice {
                stream_device: stream.device_index(),
                pool_device: self.device,
            });
        }
        let handle = stream.id().slot().and_then(|slot| self.published(slot));
        handle.ok_or_else(|| Error::NoHandle {
            id: stream.id(),
            device: stream.device_index(),
        })
    }

    /// The handle in `slot`, if published: initialization slots only once
    /// the `initialized` flag is seen (acquire), so that a reader sees all of
    /// them or none.
    #[inline]
    fn published(&self, slot: usize) -> Option<&'rt dyn Stream> {
        let initialization_slot = slot == 0 || slot >= HOST_COMPUTE_START as usize;
        if initialization_slot && !self.initialized.load(Ordering::Acquire) {
            return None;
        }
        self.handles[slot].get()
    }

    /// Synchronizes every stream of the device (`synchronizeDevice`): the
    /// default stream, each assigned normal and high-priority stream, then
    /// each host-compute stream, in that order, each once; ids never assigned
    /// are skipped. The handles are collected as one snapshot, without a
    /// lock, before the first wait. If a stream fails, the others are
    /// still synchronized. An uninitialized pool has nothing to synchronize.
    ///
    /// # Errors
    /// [`Error::DeviceSynchronize`] with the id and error of the first
    /// stream that failed; [`Error::Flex`] with [`Status::UNSUPPORTED`]
    /// (call `synchronize_device`) from a completion or host callback of the
    /// device's runtime, where every stream's synchronize is refused (it
    /// would wait for itself): no stream failed then.
    pub fn synchronize_device(&self) -> Result<()> {
        let snapshot = self.snapshot();
        let mut first_error = None;
        for (id, handle) in snapshot {
            if let Err(source) = handle.synchronize() {
                if source.status() == Status::UNSUPPORTED && source.call() == "synchronize" {
                    // The calling thread's refusal, the same on every stream.
                    return Err(Error::Flex(FlexError::new(
                        Status::UNSUPPORTED,
                        "synchronize_device",
                        source.message(),
                    )));
                }
                tracing::warn!(stream = id.get(), error = %source, "synchronize_device: stream failed");
                first_error.get_or_insert(Error::DeviceSynchronize { id, source });
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The ids that have a handle, in table order (for diagnostics and
    /// tests): the snapshot [`StreamPool::synchronize_device`] takes.
    pub fn mapped_ids(&self) -> Vec<StreamId> {
        self.snapshot().into_iter().map(|(id, _)| id).collect()
    }

    /// Every published handle with its id, in table order, without a lock:
    /// the initialization slots only once the `initialized` flag is seen
    /// (acquire), so the snapshot has all of them or none, never half an
    /// initialization. A pool id's stream is published under its own
    /// creation lock before the id is returned to anyone: a slot missing
    /// from the snapshot is one whose stream nobody has been given yet, so
    /// no work on it can need waiting for.
    fn snapshot(&self) -> Vec<(StreamId, &'rt dyn Stream)> {
        if !self.initialized.load(Ordering::Acquire) {
            return Vec::new();
        }
        (0..MAX_STREAM_SLOTS)
            .filter_map(|slot| Some((StreamId(slot as i64), self.handles[slot].get()?)))
            .collect()
    }
}

impl fmt::Debug for StreamPool<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamPool")
            .field("device", &self.device)
            .field("config", &self.config)
            .field("initialized", &self.is_initialized())
            .finish_non_exhaustive()
    }
}

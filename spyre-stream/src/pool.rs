//! `StreamPool`: the id → handle table and round-robin assignment of the spec.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;

use flex_rt::{Runtime, Stream, StreamMode, StreamPriority};

use crate::error::{Error, Result};
use crate::id::{
    HIGH_POOL_START, HOST_COMPUTE_START, MAX_HOST_COMPUTE_STREAMS, MAX_STREAM_SLOTS,
    NORMAL_POOL_START, STREAMS_PER_POOL, StreamId,
};
use crate::loom_shim::{AtomicBool, Mutex, WriteOnce};
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

/// The round-robin cursors: what the exclusive lock guards.
#[derive(Default)]
struct Cursors {
    normal: PoolCursor,
    high: PoolCursor,
    next_host_compute: usize,
}

impl Cursors {
    fn of(&mut self, high: bool) -> &mut PoolCursor {
        if high {
            &mut self.high
        } else {
            &mut self.normal
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
        self.pool
            .cursors
            .lock()
            .of(self.high)
            .retry_later(self.offset);
    }
}

/// The round robin of one pool of 32 ids, as offsets from its first id.
#[derive(Default)]
struct PoolCursor {
    /// The offset the round robin hands out next.
    next: usize,
    /// Offsets whose stream creation failed, handed out again first.
    retry: VecDeque<usize>,
}

impl PoolCursor {
    /// The offset to hand out: one whose creation failed, without
    /// advancing the cursor (as if the cursor had stayed on it), else the
    /// cursor's, advancing it.
    fn hand_out(&mut self) -> usize {
        if let Some(offset) = self.retry.pop_front() {
            return offset;
        }
        let offset = self.next;
        self.next = (offset + 1) % STREAMS_PER_POOL;
        offset
    }

    /// Hands `offset` out again first, its creation having failed: once per
    /// failure, so that every hand-out the cursor advanced for ends in one
    /// success (two callers of one id that both fail push it twice; an
    /// entry whose id a waiter created meanwhile hands out that id again,
    /// as a cursor that stayed on it would). Bounded by the assignments in
    /// flight: every hand-out pops first.
    fn retry_later(&mut self, offset: usize) {
        self.retry.push_back(offset);
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
/// Locking: initialization and every assignment
/// ([`StreamPool::stream_from_pool`], [`StreamPool::host_compute_stream`])
/// take the exclusive lock to hand an id out, as the spec says; but the
/// stream an assignment creates for a fresh pool id is created after that
/// lock is released, under a lock of that id alone, so a slow creation
/// holds up only the callers handed the same id (they wait for it; at most
/// one creation per id still holds). A failed creation (an error or a
/// panic) publishes nothing and hands its id out again, first, to a later
/// assignment of that pool, which does not advance the cursor then: once
/// no creation is in flight, the ids handed out are those of the spec's
/// cursor that stays put on a failure. A runtime's `create_stream` must
/// not assign from the same pool (it would wait for itself). Handle
/// resolution ([`StreamPool::resolve`], [`StreamPool::default_stream_handle`])
/// takes no lock: the table is append-only and each slot is written once
/// (published with release, read with acquire), so a reader sees a whole
/// handle or none and never waits for a writer. This departs from the spec's
/// shared lock on purpose; see the crate docs. The snapshot of
/// [`StreamPool::synchronize_device`] takes the exclusive lock briefly (see
/// its docs for what it sees). No lock is held while waiting on the device.
///
/// Initialization is atomic: the default-stream mapping and the host-compute
/// streams are created first, written to their slots, and published together
/// by one release store of the `initialized` flag; a reader resolves an
/// initialization id only after seeing the flag (acquire), so it sees all of
/// them or none. A failed initialization writes nothing, and a later call
/// retries.
///
/// This is a value; the process-wide pool of the spec is one of them, behind
/// the crate's free functions. Tests and embedders may build their own.
///
/// Thread-safety: `Send + Sync`; every method may be called from any thread.
pub struct StreamPool<'rt> {
    runtime: &'rt dyn Runtime,
    device: u8,
    config: PoolConfig,
    track_hazards: AtomicBool,
    /// Slot `i` holds the handle of stream id `i`. Append-only: a slot is
    /// written at most once — under `cursors`' lock at initialization, under
    /// `creations[i]` for a pool id — and never changes again.
    handles: [WriteOnce<&'rt dyn Stream>; MAX_STREAM_SLOTS],
    /// Set (release) once id 0 and the host-compute ids are written.
    initialized: AtomicBool,
    /// The exclusive section: initialization and every hand-out of an id.
    cursors: Mutex<Cursors>,
    /// Slot `i`'s creation lock: held while the stream of a fresh pool id
    /// is created, outside `cursors`' lock.
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
            })?;
        Ok(Self {
            runtime,
            device,
            config,
            track_hazards: AtomicBool::new(config.track_hazards),
            handles: std::array::from_fn(|_| WriteOnce::new()),
            initialized: AtomicBool::new(false),
            cursors: Mutex::new(Cursors::default()),
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
    /// id 0 to the runtime's default stream, creates the host-compute streams,
    /// resets the cursors. Idempotent.
    ///
    /// # Errors
    /// The runtime's error if a host-compute stream cannot be created; then
    /// nothing is published and the next call retries.
    pub fn initialize(&self) -> Result<()> {
        if self.is_initialized() {
            return Ok(());
        }
        self.initialize_locked(&mut self.cursors.lock())
    }

    /// Initializes under the exclusive lock (`cursors` is its guard).
    fn initialize_locked(&self, cursors: &mut Cursors) -> Result<()> {
        if self.initialized.load(Ordering::Relaxed) {
            // Written under this same lock: no ordering needed.
            return Ok(());
        }
        let default = self.runtime.default_stream();
        let mut host_compute: [Option<&'rt dyn Stream>; MAX_HOST_COMPUTE_STREAMS] =
            [None; MAX_HOST_COMPUTE_STREAMS];
        for slot in host_compute
            .iter_mut()
            .take(self.config.host_compute_streams)
        {
            *slot = Some(self.create_stream(StreamPriority::High)?);
        }
        // Written once: a failed initialization wrote nothing, so every
        // slot here is still empty.
        let written = self.handles[0].set(default);
        debug_assert!(written, "slot 0 is written once");
        let first = HOST_COMPUTE_START as usize;
        for (slot, handle) in self.handles[first..].iter().zip(host_compute) {
            if let Some(handle) = handle {
                let written = slot.set(handle);
                debug_assert!(written, "a host-compute slot is written once");
            }
        }
        *cursors = Cursors::default();
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
    /// or positive the normal pool (ids 1–32) — PyTorch's convention. The
    /// cursor advances on every assignment but one handing out again an id
    /// whose creation failed. The first time an id is handed
    /// out its handle is created, with the runtime priority of its pool:
    /// after the exclusive lock is released, under that id's own lock, so
    /// only callers handed the same id wait for it (see the type's docs).
    /// Initializes the pool first if needed.
    ///
    /// # Errors
    /// The runtime's error if the pool cannot initialize or the stream cannot
    /// be created; then nothing is inserted, and the next assignment of the
    /// pool retries the same id without advancing the cursor (as if it had
    /// stayed on it).
    pub fn stream_from_pool(&self, priority: i32) -> Result<SpyreStream> {
        let high = priority < 0;
        let (start, runtime_priority) = if high {
            (HIGH_POOL_START, StreamPriority::High)
        } else {
            (NORMAL_POOL_START, StreamPriority::Normal)
        };
        let offset = {
            let mut cursors = self.cursors.lock();
            self.initialize_locked(&mut cursors)?;
            cursors.of(high).hand_out()
        };
        let id = start + offset as i64;
        let failed = RetryOnDrop {
            pool: self,
            high,
            offset,
        };
        self.create_once(id as usize, runtime_priority)?;
        std::mem::forget(failed);
        Ok(SpyreStream::from_parts(self.device, StreamId(id)))
    }

    /// Creates and publishes the handle of pool slot `slot` unless it has
    /// one (at most one creation per id): under the slot's creation lock,
    /// so a caller handed an id whose creation is in flight waits for it,
    /// and nobody else does.
    fn create_once(&self, slot: usize, priority: StreamPriority) -> Result<()> {
        if self.handles[slot].get().is_some() {
            return Ok(());
        }
        let _creating = self.creations[slot].lock();
        if self.handles[slot].get().is_some() {
            // Created by another caller of this id while this one waited.
            return Ok(());
        }
        let written = self.handles[slot].set(self.create_stream(priority)?);
        debug_assert!(
            written,
            "a pool slot is written once, under its creation lock"
        );
        Ok(())
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
    ///
    /// # Errors
    /// As [`StreamPool::initialize`].
    pub fn default_stream_handle(&self) -> Result<&'rt dyn Stream> {
        let stream = self.default_stream()?;
        self.resolve(stream)
    }

    /// The next host-compute stream, round robin over ids 65..65+N-1
    /// (`getHostComputeStream`). Write lock; initializes the pool if needed.
    ///
    /// # Errors
    /// As [`StreamPool::initialize`].
    pub fn host_compute_stream(&self) -> Result<SpyreStream> {
        let mut cursors = self.cursors.lock();
        self.initialize_locked(&mut cursors)?;
        let index = cursors.next_host_compute;
        cursors.next_host_compute = (index + 1) % self.config.host_compute_streams;
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
    /// are skipped. The handles are collected as one snapshot under the
    /// exclusive lock, which is released before the first wait. If a stream fails, the others are
    /// still synchronized. An uninitialized pool has nothing to synchronize.
    ///
    /// # Errors
    /// [`Error::DeviceSynchronize`] with the id and error of the first stream that failed.
    pub fn synchronize_device(&self) -> Result<()> {
        let snapshot = self.snapshot();
        let mut first_error = None;
        for (id, handle) in snapshot {
            if let Err(source) = handle.synchronize() {
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

    /// Every published handle with its id, in table order: taken under the
    /// exclusive lock, which initialization and every cursor write hold
    /// (the spec's snapshot; one load per slot without it could see slot 65
    /// without slot 0, half an initialization). A pool id's stream is
    /// published under its own creation lock, before the id is returned to
    /// anyone: a slot missing from the snapshot is one whose stream nobody
    /// has been given yet, so no work on it can need waiting for. Released
    /// before the caller waits on anything.
    fn snapshot(&self) -> Vec<(StreamId, &'rt dyn Stream)> {
        let _writes = self.cursors.lock();
        if !self.initialized.load(Ordering::Relaxed) {
            // Written under this same lock: no ordering needed.
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

//! One runtime of the software device: its memory, streams and engines.
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use flex_rt::{
    Capabilities, CompositeAddress, Event, FlexError, MemoryInfo, MemoryLayout, Result, Runtime,
    Status, Stream, StreamMode, StreamPriority,
};

use crate::config::MockConfig;
use crate::engine::{Device, spawn_engines};
use crate::event::MockEvent;
use crate::faults::RuntimeFaults;
use crate::memory::BoundedAllocation;
use crate::stream::MockStream;

/// A runtime of the software device, bound to one logical device;
/// implements [`flex_rt::Runtime`]. Made by
/// [`crate::MockSystem::create_mock_runtime`] or through
/// [`flex_rt::Backend::create_runtime`].
///
/// Every runtime has fresh state of its own: its own device memory (all
/// free), its own streams (the default stream has id 0, created streams get
/// 1, 2, 3, …) and its own engine threads. Two runtimes on the same logical
/// device share nothing.
///
/// Streams are stored append-only at stable addresses and live until the
/// runtime is dropped. Dropping the runtime lets all enqueued work finish
/// (every completion is called), then stops and joins its engine threads and
/// frees its memory, or, while an event of it is still alive (destroyed,
/// its calls failing), with the last such event: an event keeps the
/// device's state. If the last owner drops it on one of its own engine
/// threads (inside a callback), the engines are told to stop but not joined;
/// they exit once the queued work is done.
///
/// Thread-safety: `Send + Sync`; every method may be called from any thread.
pub struct MockRuntime {
    device: Arc<Device>,
    streams: boxcar::Vec<MockStream>,
    engines: Vec<JoinHandle<()>>,
    faults: RuntimeFaults,
}

impl MockRuntime {
    /// Fresh state for logical device `index` with `config`'s memory and
    /// engines, and the default stream.
    pub(crate) fn start(index: u32, config: &MockConfig) -> Result<Self> {
        let device = Arc::new(Device::new(index, config));
        let streams = boxcar::Vec::new();
        {
            let mut scheduler = device.scheduler.lock();
            let default = scheduler.add_stream(StreamPriority::Normal);
            streams.push(MockStream::new(
                default,
                StreamPriority::Normal,
                false,
                Arc::clone(&device),
                &scheduler,
            ));
        }
        let engines = spawn_engines(&device, config.engines())?;
        tracing::debug!(
            device = index,
            engines = config.engines(),
            "mock runtime started"
        );
        Ok(Self {
            device,
            streams,
            engines,
            faults: RuntimeFaults::default(),
        })
    }

    /// The default stream as a [`MockStream`].
    pub fn default_mock_stream(&self) -> &MockStream {
        // Stream 0 is pushed in `start`, before the runtime exists.
        &self.streams[0]
    }

    /// The stream with id `id`, or `None` if the runtime has no such stream.
    pub fn mock_stream(&self, id: u64) -> Option<&MockStream> {
        self.streams.get(usize::try_from(id).ok()?)
    }

    /// [`Runtime::create_stream`], returning the concrete stream.
    ///
    /// # Errors
    /// [`Status::RUNTIME_FAILED`] while a
    /// [`RuntimeFaults::fail_next_stream_creations`] fault is pending.
    pub fn create_mock_stream(
        &self,
        priority: StreamPriority,
        mode: StreamMode,
        track_hazards: bool,
    ) -> Result<&MockStream> {
        let StreamMode::StrictOrdering = mode;
        if self.faults.take_stream_creation_failure() {
            return Err(FlexError::new(
                Status::RUNTIME_FAILED,
                "create_stream",
                "no more streams can be made (fault injected by RuntimeFaults::fail_next_stream_creations)",
            ));
        }
        let mut scheduler = self.device.scheduler.lock();
        let index = scheduler.add_stream(priority);
        // Streams are only added under the scheduler lock, so the two
        // sequences stay in step.
        let pushed = self.streams.push(MockStream::new(
            index,
            priority,
            track_hazards,
            Arc::clone(&self.device),
            &scheduler,
        ));
        drop(scheduler);
        match self.streams.get(index) {
            Some(stream) if pushed == index => Ok(stream),
            _ => Err(FlexError::new(
                Status::INTERNAL,
                "create_stream",
                format!("stream table out of step: stored at {pushed}, scheduled as {index}"),
            )),
        }
    }

    /// Number of streams, the default stream included.
    pub fn stream_count(&self) -> usize {
        self.streams.count()
    }

    /// Number of events of this runtime made and not yet dropped
    /// (destroyed): for leak checks, and to see that a caller left an event
    /// alone. Records and waits already made do not count; an event's
    /// latest record may outlive it.
    pub fn live_events(&self) -> usize {
        self.device.live_events.load(Ordering::Relaxed)
    }

    /// Ids of the streams `synchronize` was called on, in call order (for
    /// tests of who synchronizes what, and in which order). Only the most
    /// recent 4096 calls are kept, so that a long-running process does not
    /// grow without bound.
    pub fn synchronize_log(&self) -> Vec<u64> {
        self.device.scheduler.lock().synchronize_log()
    }

    /// Fault injection switches of this runtime.
    pub fn faults(&self) -> &RuntimeFaults {
        &self.faults
    }

    /// Device memory of the runtime in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.device.memory.capacity()
    }

    /// Device memory not taken by live allocations, in bytes (allocations
    /// count in whole 128-byte units).
    pub fn free_memory_bytes(&self) -> u64 {
        self.device.memory.free_bytes()
    }

    /// Number of memory regions that hold host memory so far (regions are
    /// backed when first written).
    pub fn backed_regions(&self) -> usize {
        self.device.memory.backed_regions()
    }

    /// Allocates `size` bytes as [`Runtime::allocate`] does, in at most
    /// `max_chunks` chunks; where the device's placement would take more,
    /// allocates nothing and returns how many it would take
    /// ([`BoundedAllocation::NeedsChunks`]): `flex_memory_allocate` with a
    /// capacity too small, answered without ever holding the memory.
    /// Thread-safe.
    ///
    /// # Errors
    /// As [`Runtime::allocate`]: `INVALID_ARGUMENT` for a size of 0,
    /// `OUT_OF_MEMORY` when the device cannot place it at all.
    pub fn allocate_at_most(&self, size: u64, max_chunks: usize) -> Result<BoundedAllocation> {
        self.device.memory.allocate_at_most(size, max_chunks)
    }

    /// Number of engine threads of the runtime.
    pub fn engines(&self) -> usize {
        self.engines.len()
    }

    #[cfg(test)]
    pub(crate) fn device_weak(&self) -> std::sync::Weak<Device> {
        Arc::downgrade(&self.device)
    }
}

impl fmt::Debug for MockRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockRuntime")
            .field("device", &self.device.index)
            .field("streams", &self.streams.count())
            .field("engines", &self.engines.len())
            .field("memory_bytes", &self.device.memory.capacity())
            .finish()
    }
}

impl Runtime for MockRuntime {
    fn logical_device(&self) -> u32 {
        self.device.index
    }

    fn default_stream(&self) -> &dyn Stream {
        self.default_mock_stream()
    }

    fn create_stream(
        &self,
        priority: StreamPriority,
        mode: StreamMode,
        track_hazards: bool,
    ) -> Result<&dyn Stream> {
        Ok(self.create_mock_stream(priority, mode, track_hazards)?)
    }

    fn has_stream_error(&self) -> Result<bool> {
        Ok(self.device.scheduler.lock().any_stream_error())
    }

    fn allocate(&self, size: u64) -> Result<CompositeAddress> {
        self.device.memory.allocate(size)
    }

    fn free(&self, address: &CompositeAddress) -> Result<()> {
        self.device.memory.free(address)
    }

    /// Whether the calling thread is one of this device's engines (running
    /// a host function or a completion).
    fn in_host_callback(&self) -> bool {
        self.device.is_engine_thread()
    }

    /// Feeds the use-after-free detector
    /// ([`MockConfig::check_reuse`](crate::MockConfig::check_reuse)); one
    /// branch when it is off.
    fn note_reuse(&self, address: &CompositeAddress) {
        if self.device.check_reuse {
            self.device.scheduler.lock().note_reuse(address);
        }
    }

    fn memory_layout(&self) -> Option<MemoryLayout> {
        Some(self.device.memory.layout())
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(MemoryInfo {
            free_bytes: self.device.memory.free_bytes(),
            total_bytes: self.device.memory.capacity(),
        })
    }

    /// Device-side waits and event timing, each unless configured off
    /// ([`MockConfig::device_side_wait`](crate::MockConfig::device_side_wait),
    /// [`MockConfig::event_timing`](crate::MockConfig::event_timing)).
    fn capabilities(&self) -> Result<Capabilities> {
        Ok(Capabilities {
            device_side_wait: self.device.device_side_wait,
            event_timing: self.device.event_timing,
        })
    }

    /// A [`MockEvent`]; it keeps the runtime's device state alive while it
    /// exists.
    fn create_event(&self, timing: bool) -> Result<Box<dyn Event>> {
        Ok(Box::new(MockEvent::new(Arc::clone(&self.device), timing)))
    }
}

impl Drop for MockRuntime {
    fn drop(&mut self) {
        self.device.begin_shutdown();
        if self.device.is_engine_thread() {
            tracing::warn!(
                device = self.device.index,
                "mock runtime dropped on one of its own engine threads; its engines stop once their work is done"
            );
            return;
        }
        // The last engine to stop closes the device, and its events with
        // it (flex.h), once every record has settled; here too, in case an
        // engine unwound instead of stopping.
        for engine in self.engines.drain(..) {
            if engine.join().is_err() {
                tracing::error!(device = self.device.index, "a mock engine thread panicked");
            }
        }
        self.device.closed.store(true, Ordering::Release);
        tracing::debug!(device = self.device.index, "mock runtime stopped");
    }
}

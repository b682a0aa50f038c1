//! The contract every backend meets: `Backend`, `Runtime` and `Stream`.

use std::fmt;

use crate::address::CompositeAddress;
use crate::buffer::HostBuffer;
use crate::error::{FlexError, Result};
use crate::event::{Capabilities, Event};
use crate::launch::{Completion, HostCallback, LaunchOptions};
use crate::types::{DataFormat, MemoryInfo, MemoryLayout, StreamMode, StreamPriority};

/// A loaded device runtime library, or the software device: it counts the
/// visible devices and creates runtimes.
///
/// Thread-safety: `Send + Sync`; every method may be called from any thread.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Short name of the backend, for example `mock` or `hardware`.
    fn name(&self) -> &'static str;

    /// Number of logical devices visible to this process (`flex_get_device_count`).
    ///
    /// # Errors
    /// The runtime's error if it cannot count its devices.
    fn device_count(&self) -> Result<u32>;

    /// Facts about the backend for diagnostics (`spyre info`), as name/value
    /// pairs, names in `snake_case` (they are keys of `spyre info --json`):
    /// for a loaded library its path and ABI version, for the software
    /// device its configuration. Empty by default.
    fn details(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Creates a runtime bound to `logical_device` (`flex_runtime_create`).
    ///
    /// # Errors
    /// [`crate::Status::NO_DEVICE`] when `logical_device` is not below
    /// [`Backend::device_count`]; the runtime's error when it cannot start.
    fn create_runtime(&self, logical_device: u32) -> Result<Box<dyn Runtime>>;
}

/// One device context (`flex::RuntimeContext`), bound to one logical device.
///
/// Ownership, as in the spec: the runtime creates and owns every stream;
/// [`Runtime::default_stream`] and [`Runtime::create_stream`] hand out borrows
/// that cannot outlive it, and nothing above this trait ever destroys a
/// stream. Streams are kept at stable addresses until the runtime is dropped.
///
/// Thread-safety: `Send + Sync`; every method may be called from any thread.
pub trait Runtime: Send + Sync + fmt::Debug {
    /// The logical device this runtime is bound to (0-based).
    fn logical_device(&self) -> u32;

    /// The default stream: normal priority, strict ordering, no hazard
    /// tracking, created with the runtime. Always the same stream.
    fn default_stream(&self) -> &dyn Stream;

    /// Creates a stream (`RuntimeContext::createStream(priority, mode,
    /// track_hazards)` in torch-spyre). With `track_hazards` the runtime
    /// orders this stream's memory accesses against other tracking streams.
    ///
    /// # Errors
    /// The runtime's error when no stream can be made.
    fn create_stream(
        &self,
        priority: StreamPriority,
        mode: StreamMode,
        track_hazards: bool,
    ) -> Result<&dyn Stream>;

    /// Whether any stream of this runtime has failed or needs shutdown
    /// (`RuntimeContext::hasStreamError()`).
    ///
    /// # Errors
    /// The runtime's error if it cannot tell.
    fn has_stream_error(&self) -> Result<bool>;

    /// Allocates `size` bytes (> 0) of device memory; the result's chunks are
    /// 128-byte aligned and add up to `size`. The memory is not initialized.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] for size 0;
    /// [`crate::Status::OUT_OF_MEMORY`] when the device is full.
    fn allocate(&self, size: u64) -> Result<CompositeAddress>;

    /// Frees memory returned by [`Runtime::allocate`], given the same address.
    /// Operations still using it that run while it is free fail
    /// (`EXECUTION_FAILED`); once it is allocated again they may read and
    /// write the new allocation (`flex.h`): free only memory whose work has
    /// completed.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] when `address` is not a live
    /// allocation of this runtime; nothing is freed then.
    fn free(&self, address: &CompositeAddress) -> Result<()>;

    /// Says that an allocator above the runtime (a caching allocator that
    /// hands out parts of its allocations again) now gives the memory at
    /// `address` to a new owner: work enqueued from now on that touches it
    /// is the new owner's, work enqueued before is the previous owner's.
    /// A backend may check that no operation of the new owner runs while
    /// one of the previous owner on that memory has not completed (the
    /// software device's use-after-free detector). A hint only: it changes
    /// nothing the runtime does otherwise. The default does nothing (flex.h
    /// has no such call).
    fn note_reuse(&self, address: &CompositeAddress) {
        let _ = address;
    }

    /// Whether the calling thread is running a host function or a
    /// completion of this runtime (where `flex.h` forbids waiting for the
    /// runtime's streams, and the backends refuse it): a layer above that
    /// would otherwise wait, there, for work that may be waiting for the
    /// calling thread (the caching allocator's retry of a full device)
    /// does not. The default returns `false`.
    fn in_host_callback(&self) -> bool {
        false
    }

    /// The layout of this runtime's device memory, or `None` when the
    /// backend cannot tell (flex.h, 1.0 and 1.1, has no call for the region
    /// size, so the hardware backend returns `None`). The default
    /// implementation returns `None`.
    fn memory_layout(&self) -> Option<MemoryLayout> {
        None
    }

    /// Free and total device memory of this runtime
    /// (`flex_runtime_get_memory_info`, flex ABI 1.1).
    ///
    /// # Errors
    /// [`crate::Status::UNSUPPORTED`] for a flex 1.0 library ("unsupported
    /// by this flex library (ABI 1.0)", naming the function); the runtime's
    /// error.
    fn memory_info(&self) -> Result<MemoryInfo>;

    /// What the runtime can do beyond flex ABI 1.0
    /// (`flex_runtime_get_capability`).
    ///
    /// # Errors
    /// [`crate::Status::UNSUPPORTED`] when the backend has no events (a flex
    /// 1.0 library: "unsupported by this flex library (ABI 1.0)", naming the
    /// missing function).
    fn capabilities(&self) -> Result<Capabilities>;

    /// Creates an event, not yet recorded (`flex_event_create`); with
    /// `timing` it takes device timestamps for [`Event::elapsed_nanos`].
    ///
    /// # Errors
    /// [`crate::Status::UNSUPPORTED`] as for [`Runtime::capabilities`]; the
    /// runtime's error when no event can be made.
    fn create_event(&self, timing: bool) -> Result<Box<dyn Event>>;
}

/// A borrowed runtime is a runtime: `Box::new(&runtime)` hands a runtime
/// that lives elsewhere (a leaked one, say) to code that takes a
/// `Box<dyn Runtime>`, with every call forwarded.
impl<R: Runtime + ?Sized> Runtime for &R {
    fn logical_device(&self) -> u32 {
        (**self).logical_device()
    }

    fn default_stream(&self) -> &dyn Stream {
        (**self).default_stream()
    }

    fn create_stream(
        &self,
        priority: StreamPriority,
        mode: StreamMode,
        track_hazards: bool,
    ) -> Result<&dyn Stream> {
        (**self).create_stream(priority, mode, track_hazards)
    }

    fn has_stream_error(&self) -> Result<bool> {
        (**self).has_stream_error()
    }

    fn allocate(&self, size: u64) -> Result<CompositeAddress> {
        (**self).allocate(size)
    }

    fn free(&self, address: &CompositeAddress) -> Result<()> {
        (**self).free(address)
    }

    fn note_reuse(&self, address: &CompositeAddress) {
        (**self).note_reuse(address)
    }

    fn in_host_callback(&self) -> bool {
        (**self).in_host_callback()
    }

    fn memory_layout(&self) -> Option<MemoryLayout> {
        (**self).memory_layout()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        (**self).memory_info()
    }

    fn capabilities(&self) -> Result<Capabilities> {
        (**self).capabilities()
    }

    fn create_event(&self, timing: bool) -> Result<Box<dyn Event>> {
        (**self).create_event(timing)
    }
}

/// One hardware queue (`flex::RuntimeStream`): operations run in submission
/// order, and different streams run concurrently.
///
/// Every launch enqueues one operation and returns without waiting. On `Ok`
/// its completion (if any) is called exactly once, when the operation has
/// finished or failed. On `Err` nothing was enqueued and the completion and
/// any lease on a host buffer have been released.
///
/// Errors are sticky: once an operation fails, the stream runs no more work;
/// later operations complete with [`crate::Status::STREAM_FAILED`], later
/// launches are refused with it, and `query`/`synchronize` return the first
/// error.
///
/// Thread-safety: `Send + Sync`. Launches from several threads onto one
/// stream are serialized inside the stream (flex itself promises nothing
/// there); their relative order is the order in which they take the stream.
pub trait Stream: Send + Sync + fmt::Debug {
    /// The stream's identifier, unique within its runtime; 0 for the default stream.
    fn id(&self) -> u64;

    /// The priority the stream was created with.
    fn priority(&self) -> StreamPriority;

    /// Whether all work enqueued before the call has completed: `Ok(true)`
    /// done, `Ok(false)` still running. Never blocks.
    ///
    /// # Errors
    /// The stream's first error if it has failed. A backend whose stream
    /// fails on its own side while work queued before the failure still
    /// runs (`HardwareStream` behind a completion's panic) says `Ok(false)`
    /// until that work has ended. A failure the device reports says only
    /// that the stream takes no more work: flex.h does not say that the
    /// work begun before it has ended (a card may overlap a stream's
    /// operations, and `SHUTDOWN`, the stream needing a shutdown of its
    /// runtime, is reported at once while the operation the stream was
    /// running goes on). A `synchronize` that returns the failure does say
    /// it, for the work enqueued before it. The failed operation's
    /// completion (host code) may still be running when the failure is
    /// reported.
    fn query(&self) -> Result<bool>;

    /// Blocks until all work enqueued before the call has completed and its
    /// completions have returned.
    ///
    /// # Errors
    /// The stream's first error if it has failed (sticky);
    /// [`crate::Status::UNSUPPORTED`] (call `"synchronize"`) when called
    /// from a completion or host callback of the same runtime, which could
    /// never see its own work done (the layers above tell this refusal by
    /// that status and call).
    fn synchronize(&self) -> Result<()>;

    /// Whether the stream needs a runtime shutdown (`RuntimeStream::needsShutdown()`);
    /// such a stream refuses launches with [`crate::Status::SHUTDOWN`].
    ///
    /// # Errors
    /// The runtime's error if it cannot tell.
    fn needs_shutdown(&self) -> Result<bool>;

    /// Host-to-device copy of all of `src` into `dst`; the sizes must match.
    /// The operation holds a shared lease on `src` until it completes.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] on a size mismatch or a busy
    /// buffer; the stream's error if it has failed or needs shutdown; the
    /// runtime's refusal.
    fn launch_h2d(
        &self,
        src: &HostBuffer,
        dst: &CompositeAddress,
        options: LaunchOptions,
    ) -> Result<()>;

    /// Device-to-host copy of all of `src` into `dst`; the sizes must match.
    /// The operation holds an exclusive lease on `dst` until it completes, so
    /// [`HostBuffer::read`] waits for the data.
    ///
    /// # Errors
    /// As [`Stream::launch_h2d`].
    fn launch_d2h(
        &self,
        src: &CompositeAddress,
        dst: &HostBuffer,
        options: LaunchOptions,
    ) -> Result<()>;

    /// Runs the compute program stored in device memory at `program`. A
    /// program the device cannot run fails the operation (and the stream) with
    /// [`crate::Status::EXECUTION_FAILED`].
    ///
    /// # Errors
    /// The stream's error if it has failed or needs shutdown; the runtime's refusal.
    fn launch_compute(&self, program: &CompositeAddress, options: LaunchOptions) -> Result<()>;

    /// Runs `callback` on a runtime thread in stream order; the stream does
    /// not advance until it returns. If the stream fails before its turn the
    /// callback is dropped without running.
    ///
    /// # Errors
    /// The stream's error if it has failed or needs shutdown; the runtime's refusal.
    fn launch_host_callback(&self, callback: HostCallback, options: LaunchOptions) -> Result<()>;

    /// Fills `dst` with `value` converted to `format` (`RuntimeStream::fillAsync`).
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] when the size of `dst` is not a
    /// multiple of the element size; otherwise as [`Stream::launch_compute`].
    fn launch_fill(
        &self,
        dst: &CompositeAddress,
        value: f64,
        format: DataFormat,
        options: LaunchOptions,
    ) -> Result<()>;

    /// Records `event` here (`flex_event_record`; `cudaEventRecord`): the
    /// event now marks the end of the work enqueued on this stream so far.
    /// `completion`, if any, is called exactly once when the event completes
    /// (`Ok`) or fails (the record's error: see [`Event::query`]), on a runtime thread, as for a
    /// launch; it is dropped uncalled when this returns `Err`. See [`Event`]
    /// for the contract.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] for an event of another runtime or
    /// backend; the stream's error if it has failed or needs shutdown; the
    /// runtime's refusal; [`crate::Status::UNSUPPORTED`] without events. On
    /// error the event is unchanged.
    fn record_event(&self, event: &dyn Event, completion: Option<Completion>) -> Result<()>;

    /// Makes every operation enqueued here after this call start only after
    /// `event`'s latest record (as of this call) has completed
    /// (`flex_stream_wait_event`; `cudaStreamWaitEvent`). A no-op for an
    /// event never recorded or recorded on this stream, but on a stream
    /// that has failed, which refuses every wait. Returns at once when
    /// the runtime has [`Capabilities::device_side_wait`], else blocks until
    /// the event has completed. A failed event fails this stream.
    ///
    /// # Errors
    /// As [`Stream::record_event`]; without device-side waits,
    /// [`crate::Status::UNSUPPORTED`] from a completion or host callback of
    /// the same runtime (a backend may refuse only when it would have to
    /// wait).
    fn wait_event(&self, event: &dyn Event) -> Result<()>;
}

/// Checks that a copy's host and device sizes agree; the device backends'
/// `launch_h2d` and `launch_d2h` (the hardware backend's, the software
/// device's) call it before enqueuing. The no-op backend, a test double,
/// checks no sizes ([`crate::noop`]).
///
/// # Errors
/// [`crate::Status::INVALID_ARGUMENT`] naming both sizes.
pub fn check_copy_size(
    call: &'static str,
    host_len: usize,
    device: &CompositeAddress,
) -> Result<()> {
    if host_len as u64 == device.total_size() {
        Ok(())
    } else {
        Err(FlexError::invalid_argument(
            call,
            format!(
                "host buffer has {host_len} bytes but the device address {device} has {} bytes; they must be equal",
                device.total_size()
            ),
        ))
    }
}

/// Checks that a fill's size is a whole number of elements.
///
/// # Errors
/// [`crate::Status::INVALID_ARGUMENT`] naming the size and the element size.
pub fn check_fill_size(
    call: &'static str,
    dst: &CompositeAddress,
    format: DataFormat,
) -> Result<()> {
    let element = format.element_size();
    if dst.total_size().is_multiple_of(element) {
        Ok(())
    } else {
        Err(FlexError::invalid_argument(
            call,
            format!(
                "fill of {} bytes is not a whole number of {format:?} elements ({element} bytes each)",
                dst.total_size()
            ),
        ))
    }
}

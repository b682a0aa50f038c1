//! `HardwareRuntime`: one `flex_runtime_t`, the owner of its streams.

use std::fmt;
use std::ptr;
use std::sync::Arc;

use flex_sys::FlexLibrary;
use flex_sys::bindings as sys;
use flex_sys::fork::ForkGeneration;

use super::call::{self, check};
use super::callback;
use super::event::{HardwareEvent, Liveness, read_capabilities, require_1_1};
use super::handle::{RuntimeHandle, StreamHandle};
use super::stream::{HardwareStream, RawAddress};
use crate::address::{AddressChunk, CompositeAddress, MAX_ADDRESS_CHUNKS};
use crate::error::{FlexError, Result};
use crate::event::{Capabilities, Event};
use crate::status::Status;
use crate::sync::Mutex;
use crate::traits::{Runtime, Stream};
use crate::types::{MemoryInfo, StreamMode, StreamPriority};

/// One device context bound to one logical device: a `flex_runtime_t`
/// (torch-spyre's `flex::RuntimeContext`, made by
/// `flex::RuntimeContext::create()`).
///
/// # Ownership (the stream-ownership spec)
///
/// The context creates and owns every [`HardwareStream`]: the default stream,
/// made with the runtime, and each one from
/// [`HardwareRuntime::create_stream`], kept in append-only storage at a
/// stable address until the context goes away. Callers only borrow them
/// (`&HardwareStream`, or `&dyn Stream` through [`Runtime`]), so a stream
/// cannot outlive its context — the compiler refuses it — and nothing above
/// flex-rt ever destroys a stream. The context holds an
/// `Arc<FlexLibrary>`, so the library stays loaded while the context or
/// any of its streams is alive.
///
/// # Teardown
///
/// Dropping the context, or [`HardwareRuntime::close`], runs the teardown
/// exactly once:
///
/// 1. synchronize every stream (default first, then in creation order), so
///    every pending completion has run and released what it held;
/// 2. destroy the created streams in reverse creation order
///    (`flex_stream_destroy`; the default stream is not passed to it, as
///    `flex.h` requires);
/// 3. destroy the runtime (`flex_runtime_destroy`).
///
/// Every step runs even if an earlier one failed, but in two cases, where
/// none runs and the runtime is leaked: in a child forked from the process
/// that made it (the runtime is the parent's), and inside one of its own
/// callbacks (below); the failure reported then is one
/// [`TeardownStep::DestroyRuntime`]. `Drop` never panics: it
/// logs each failure with `tracing::warn!`. [`HardwareRuntime::close`]
/// returns them all instead. The library reference is released last (the
/// library itself stays loaded for the rest of the process: see
/// [`FlexLibrary`]).
///
/// `flex.h` forbids destroying a runtime from one of its own completion or
/// host callbacks (it would wait for itself). If the last owner drops the
/// context there, the runtime is leaked instead — its streams keep running
/// and the library stays loaded for the rest of the process — and the
/// failure is logged (or returned by `close`). The same holds when
/// `flex_runtime_destroy` fails: nothing then says the runtime's threads
/// stopped, so the library and the streams' payload caches, which their
/// completions still use, are kept for the rest of the process.
///
/// # Fork
///
/// A runtime does not cross `fork()` (flex.h). In a child forked after it
/// was created, its launches, records, waits and stream creations fail
/// with [`Status::RUNTIME_FAILED`] naming fork before taking any lock of
/// flex-rt's (a parent thread may have held one at the fork), and its other
/// calls get the library's own `FLEX_ERROR_RUNTIME_FAILED`. Dropping or
/// closing it, or one of its events, in the child touches nothing: they are
/// left to the parent (and to the child's exit), and `close` reports that
/// as its one failed step, [`TeardownStep::DestroyRuntime`]. A runtime
/// created in the child works: flex-rt's locks (and
/// [`crate::HostBuffer`]'s) are [`crate::sync`]'s, and the standard
/// library's for a runtime's liveness, which keep no state outside
/// themselves, so the threads of the parent that were waiting for one at
/// the fork leave nothing behind that the child's locks could meet.
///
/// # Thread-safety
///
/// `Send + Sync`; every method may be called from any thread at the same
/// time (`flex.h`: every function may be called from any thread; handles
/// are not tied to a thread). Stream creation is serialized inside the
/// context so that creation order is well defined. Dropping it works on any
/// thread, including one that never called flex before.
///
/// # Panics
///
/// No method panics, and neither does `Drop`. A status `flex.h` does not
/// define, or a success with a null handle, is an error, never a panic.
pub struct HardwareRuntime {
    /// Keeps the library loaded; released after the teardown.
    lib: Arc<FlexLibrary>,
    handle: RuntimeHandle,
    logical_device: u32,
    /// The runtime's default stream; destroyed with the runtime.
    default: HardwareStream,
    /// Streams from `create_stream`, in creation order; never moved or
    /// removed before the teardown.
    streams: boxcar::Vec<HardwareStream>,
    /// Held across `flex_runtime_create_stream` and the push, so index order
    /// is creation order.
    create_lock: Mutex<()>,
    /// Set by the first teardown; a second one does nothing.
    torn_down: bool,
    /// Shared with every event of the runtime; cleared by the teardown.
    alive: Liveness,
    /// Read at creation: the capabilities, or why there are none (a flex 1.0
    /// library, with no events).
    capabilities: Result<Capabilities>,
}

impl HardwareRuntime {
    /// Creates a runtime bound to `logical_device` (0-based) with
    /// `flex_runtime_create`, and takes its default stream.
    ///
    /// This is `flex::RuntimeContext::create()` in torch-spyre and
    /// [`Backend::create_runtime`](crate::Backend::create_runtime) of
    /// [`HardwareBackend`](super::HardwareBackend). `lib` is kept for the life of
    /// the context.
    ///
    /// # Errors
    /// - [`Status::NO_DEVICE`] when `logical_device` is above `i32::MAX`, or
    ///   when the library says the device does not exist;
    /// - [`Status::RUNTIME_FAILED`] (or another status) when the library
    ///   cannot create the runtime, with its last-error message;
    /// - [`Status::INTERNAL`] when the library reports success but hands back
    ///   a null handle or an undefined default-stream priority; the runtime is
    ///   destroyed again in that case.
    pub fn create(lib: Arc<FlexLibrary>, logical_device: u32) -> Result<HardwareRuntime> {
        const CALL: &str = "flex_runtime_create";
        let raw_device = call::device_to_raw(logical_device, CALL)?;
        flex_sys::fork::watch_forks().map_err(|error| {
            FlexError::new(
                Status::RUNTIME_FAILED,
                CALL,
                format!("cannot watch for fork() (pthread_atfork failed: {error})"),
            )
        })?;
        let fork = ForkGeneration::current();
        let mut out: *mut sys::flex_runtime_t = ptr::null_mut();
        // SAFETY: `flex_runtime_create` takes any device index and a valid
        // `flex_runtime_t **` out pointer, which `out` is for the call.
        let status = unsafe { lib.api().flex_runtime_create(raw_device, &raw mut out) };
        check(&lib, status, CALL)?;
        let handle = RuntimeHandle::new(call::non_null(out, CALL, "runtime handle")?, fork);
        let default = match Self::open_default_stream(&lib, handle) {
            Ok(default) => default,
            Err(error) => {
                destroy_runtime(&lib, handle).unwrap_or_else(|destroy| {
                    tracing::warn!(
                        logical_device,
                        "destroying a half-created flex runtime failed: {destroy}"
                    );
                });
                return Err(error);
            }
        };
        tracing::debug!(logical_device, path = %lib.path().display(), "created a flex runtime");
        let capabilities = read_capabilities(&lib, handle);
        Ok(HardwareRuntime {
            lib,
            handle,
            logical_device,
            default,
            streams: boxcar::Vec::new(),
            create_lock: Mutex::new(()),
            torn_down: false,
            alive: Liveness::new(),
            capabilities,
        })
    }

    /// Takes the default stream of a runtime that was just created.
    fn open_default_stream(
        lib: &Arc<FlexLibrary>,
        handle: RuntimeHandle,
    ) -> Result<HardwareStream> {
        const CALL: &str = "flex_runtime_get_default_stream";
        let mut out: *mut sys::flex_stream_t = ptr::null_mut();
        // SAFETY: `handle` is the live runtime created just before; `out` is
        // a valid `flex_stream_t **` out pointer for the call.
        let status = unsafe {
            lib.api()
                .flex_runtime_get_default_stream(handle.as_ptr(), &raw mut out)
        };
        check(lib, status, CALL)?;
        let stream = StreamHandle::new(call::non_null(out, CALL, "default stream handle")?);
        HardwareStream::open(Arc::clone(lib), handle, stream, true)
    }

    /// The default stream: normal priority, strict ordering, no hazard
    /// tracking, id 0, created with the runtime and destroyed with it
    /// (`getDefaultStream()` in torch-spyre). Always the same stream; the
    /// borrow cannot outlive the context.
    pub fn default_stream(&self) -> &HardwareStream {
        &self.default
    }

    /// Creates a stream with `flex_runtime_create_stream`
    /// (`createStream(priority, mode, track_hazards)` in torch-spyre). The
    /// context owns it until the context is dropped; the borrow cannot
    /// outlive the context. Concurrent calls are serialized.
    ///
    /// # Errors
    /// The library's error when no stream can be made
    /// ([`Status::RUNTIME_FAILED`]), with its last-error message;
    /// [`Status::INTERNAL`] when it reports success with a null handle or an
    /// undefined priority (a stream it did make is destroyed again).
    pub fn create_stream(
        &self,
        priority: StreamPriority,
        mode: StreamMode,
        track_hazards: bool,
    ) -> Result<&HardwareStream> {
        const CALL: &str = "flex_runtime_create_stream";
        self.handle.check_not_forked(CALL)?;
        let _order = self.create_lock.lock();
        let mut out: *mut sys::flex_stream_t = ptr::null_mut();
        // SAFETY: the runtime is alive while `&self` is (it is destroyed only
        // by the teardown, which needs ownership); the enumerations are
        // values flex.h defines; `out` is a valid out pointer for the call.
        let status = unsafe {
            self.lib.api().flex_runtime_create_stream(
                self.handle.as_ptr(),
                priority.to_raw(),
                mode.to_raw(),
                i32::from(track_hazards),
                &raw mut out,
            )
        };
        check(&self.lib, status, CALL)?;
        let stream = StreamHandle::new(call::non_null(out, CALL, "stream handle")?);
        let stream = match HardwareStream::open(Arc::clone(&self.lib), self.handle, stream, false) {
            Ok(stream) => stream,
            Err(error) => {
                self.destroy_stream(stream).unwrap_or_else(|destroy| {
                    tracing::warn!(
                        logical_device = self.logical_device,
                        "destroying a half-created flex stream failed: {destroy}"
                    );
                });
                return Err(error);
            }
        };
        let index = self.streams.push(stream);
        self.streams.get(index).ok_or_else(|| {
            FlexError::new(
                Status::INTERNAL,
                "create_stream",
                format!("stream {index} is missing from the context right after it was added"),
            )
        })
    }

    /// The library this context calls into; it stays loaded at least as
    /// long as the context.
    pub fn library(&self) -> &Arc<FlexLibrary> {
        &self.lib
    }

    /// Closes the runtime now, with the teardown described on
    /// [`HardwareRuntime`], and reports every step that failed (dropping the
    /// context does the same and only logs them).
    ///
    /// # Errors
    /// [`CloseError`] listing each failed step in order: a stream whose
    /// synchronize returned its (sticky) error, a stream or the runtime that
    /// could not be destroyed, or [`Status::UNSUPPORTED`] when called from a
    /// completion or host callback of this runtime (the runtime is leaked
    /// then), or [`Status::RUNTIME_FAILED`] as the one step in a child
    /// forked after the runtime was created (left to the parent: see
    /// "Fork" above).
    pub fn close(mut self) -> Result<(), CloseError> {
        let errors = self.teardown();
        let logical_device = self.logical_device;
        // `Drop` sees `torn_down` and does nothing more.
        drop(self);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CloseError {
                logical_device,
                errors,
            })
        }
    }

    /// The teardown: runs once, and returns every failure.
    fn teardown(&mut self) -> Vec<TeardownError> {
        if std::mem::replace(&mut self.torn_down, true) {
            return Vec::new();
        }
        if let Err(error) = self.handle.check_not_forked("close") {
            // A forked child: the runtime is the parent's (flex.h: the child
            // leaves it to its exit). Touch nothing, neither the library nor
            // a lock a parent thread may have held at the fork.
            self.leak_for_pending_callbacks();
            return vec![TeardownError {
                step: TeardownStep::DestroyRuntime,
                error,
            }];
        }
        if callback::in_callback_of(self.handle.key()) {
            // Destroying would wait for the callback this thread is running.
            // Leak the runtime, and the library with it: pending callbacks
            // still run its code, and give their payload blocks back to their
            // streams' caches.
            self.leak_for_pending_callbacks();
            return vec![TeardownError {
                step: TeardownStep::DestroyRuntime,
                error: FlexError::new(
                    Status::UNSUPPORTED,
                    "close",
                    "the runtime was dropped or closed inside one of its own completion or host \
                     callbacks, where flex.h forbids destroying it; it is leaked (its streams keep \
                     running and the library stays loaded)",
                ),
            }];
        }
        let mut errors = Vec::new();
        let created: Vec<&HardwareStream> = self.streams.iter().map(|(_, stream)| stream).collect();
        for stream in std::iter::once(&self.default).chain(created.iter().copied()) {
            if let Err(error) = stream.synchronize_unchecked() {
                errors.push(TeardownError {
                    step: TeardownStep::SynchronizeStream { id: stream.id() },
                    error,
                });
            }
        }
        for stream in created.iter().rev() {
            if let Err(error) = self.destroy_stream(stream.handle()) {
                errors.push(TeardownError {
                    step: TeardownStep::DestroyStream { id: stream.id() },
                    error,
                });
            }
        }
        // Events die with the runtime: no event call may start from here on.
        self.alive.end();
        if let Err(error) = destroy_runtime(&self.lib, self.handle) {
            // Nothing says the runtime stopped: its threads may still call
            // completions, which run the library's code and give payload
            // blocks back to their streams' caches. Keep both.
            self.leak_for_pending_callbacks();
            errors.push(TeardownError {
                step: TeardownStep::DestroyRuntime,
                error,
            });
        }
        tracing::debug!(
            logical_device = self.logical_device,
            failures = errors.len(),
            "closed a flex runtime"
        );
        errors
    }

    /// Keeps what callbacks of a runtime that was not destroyed still use
    /// alive for good: the library (its code) and every stream's payload
    /// cache (see `payload_cache`).
    fn leak_for_pending_callbacks(&self) {
        std::mem::forget(Arc::clone(&self.lib));
        self.default.leak_payload_cache();
        for (_, stream) in self.streams.iter() {
            stream.leak_payload_cache();
        }
    }

    /// `flex_stream_destroy` for a stream this context created.
    fn destroy_stream(&self, stream: StreamHandle) -> Result<()> {
        // SAFETY: the runtime is alive, `stream` is one of its created
        // streams (never the default stream), and nothing else uses it:
        // either it was never handed out (creation failed half-way) or the
        // teardown runs with exclusive access to the context.
        let status = unsafe {
            self.lib
                .api()
                .flex_stream_destroy(self.handle.as_ptr(), stream.as_ptr())
        };
        check(&self.lib, status, "flex_stream_destroy")
    }
}

/// `flex_runtime_destroy`. The caller guarantees exclusive use of the runtime
/// and that the current thread is not running one of its callbacks.
fn destroy_runtime(lib: &FlexLibrary, handle: RuntimeHandle) -> Result<()> {
    // SAFETY: `handle` is a live runtime; the callers (a failed `create`,
    // which never shared it, and the teardown, which owns the context) make
    // this the last use of it and of its streams, and neither runs inside
    // one of its callbacks.
    let status = unsafe { lib.api().flex_runtime_destroy(handle.as_ptr()) };
    check(lib, status, "flex_runtime_destroy")
}

/// Frees device memory the library handed back without a usable address;
/// failures are only logged (the caller is already reporting an error).
fn free_raw_chunks(lib: &FlexLibrary, handle: RuntimeHandle, chunks: &[sys::flex_address_chunk_t]) {
    let raw = sys::flex_composite_address_t {
        chunks: chunks.as_ptr(),
        num_chunks: chunks.len(),
    };
    // SAFETY: the runtime is alive; `raw` points to `chunks`, alive for the
    // call, exactly as `flex_memory_allocate` returned them.
    let status = unsafe { lib.api().flex_memory_free(handle.as_ptr(), &raw const raw) };
    if let Err(error) = check(lib, status, "flex_memory_free") {
        tracing::warn!("freeing an allocation with an unusable address failed: {error}");
    }
}

impl Runtime for HardwareRuntime {
    fn logical_device(&self) -> u32 {
        self.logical_device
    }

    /// Whether the calling thread is inside a completion or host function
    /// of this runtime, called through this crate's trampolines.
    fn in_host_callback(&self) -> bool {
        callback::in_callback_of(self.handle.key())
    }

    fn capabilities(&self) -> Result<Capabilities> {
        self.capabilities.clone()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        const CALL: &str = "flex_runtime_get_memory_info";
        require_1_1(&self.lib, CALL)?;
        let (mut free_bytes, mut total_bytes) = (0u64, 0u64);
        // SAFETY: the runtime is alive while `&self` is; the library is 1.1
        // (checked above), so the symbol is resolved; both out pointers are
        // valid `uint64_t`s for the call.
        let status = unsafe {
            self.lib.api().flex_runtime_get_memory_info(
                self.handle.as_ptr(),
                &raw mut free_bytes,
                &raw mut total_bytes,
            )
        };
        check(&self.lib, status, CALL)?;
        if free_bytes > total_bytes {
            return Err(FlexError::new(
                Status::INTERNAL,
                CALL,
                format!(
                    "returned FLEX_SUCCESS with {free_bytes} bytes free of {total_bytes}; the library broke flex.h"
                ),
            ));
        }
        Ok(MemoryInfo {
            free_bytes,
            total_bytes,
        })
    }

    fn create_event(&self, timing: bool) -> Result<Box<dyn Event>> {
        require_1_1(&self.lib, "flex_event_create")?;
        let capabilities = self.capabilities.clone()?;
        let event = HardwareEvent::create(
            &self.lib,
            self.handle,
            &self.alive,
            self.logical_device,
            timing,
            capabilities,
        )?;
        Ok(Box::new(event))
    }

    fn default_stream(&self) -> &dyn Stream {
        HardwareRuntime::default_stream(self)
    }

    fn create_stream(
        &self,
        priority: StreamPriority,
        mode: StreamMode,
        track_hazards: bool,
    ) -> Result<&dyn Stream> {
        HardwareRuntime::create_stream(self, priority, mode, track_hazards)
            .map(|s| s as &dyn Stream)
    }

    fn has_stream_error(&self) -> Result<bool> {
        let mut has_error = 0i32;
        // SAFETY: the runtime is alive while `&self` is; `has_error` is a
        // valid `int32_t` out pointer for the call.
        let status = unsafe {
            self.lib
                .api()
                .flex_runtime_has_stream_error(self.handle.as_ptr(), &raw mut has_error)
        };
        check(&self.lib, status, "flex_runtime_has_stream_error")?;
        // Or a stream failed on flex-rt's side (`HardwareStream`: a
        // completion's panic, which the library cannot be told of).
        Ok(call::bool_from_raw(has_error)
            || self.default.completion_panicked()
            || self
                .streams
                .iter()
                .any(|(_, stream)| stream.completion_panicked()))
    }

    fn allocate(&self, size: u64) -> Result<CompositeAddress> {
        const CALL: &str = "flex_memory_allocate";
        let mut chunks = vec![sys::flex_address_chunk_t::default(); MAX_ADDRESS_CHUNKS];
        let mut count = 0usize;
        // SAFETY: the runtime is alive while `&self` is; `chunks` has room
        // for `chunks.len()` entries and `count` is a valid out pointer, both
        // for the duration of the call.
        let status = unsafe {
            self.lib.api().flex_memory_allocate(
                self.handle.as_ptr(),
                size,
                chunks.as_mut_ptr(),
                chunks.len(),
                &raw mut count,
            )
        };
        check(&self.lib, status, CALL)?;
        if count > chunks.len() {
            return Err(FlexError::new(
                Status::INTERNAL,
                CALL,
                format!(
                    "returned FLEX_SUCCESS with {count} chunks but had room for {}; the allocation cannot be used or freed",
                    chunks.len()
                ),
            ));
        }
        chunks.truncate(count);
        let parsed: Vec<AddressChunk> =
            chunks.iter().copied().map(AddressChunk::from_raw).collect();
        let problem = match CompositeAddress::new(parsed) {
            Ok(address) if address.total_size() == size => return Ok(address),
            Ok(address) => format!(
                "returned FLEX_SUCCESS with chunks of {} bytes in total for a request of {size} bytes",
                address.total_size()
            ),
            Err(invalid) => format!(
                "returned FLEX_SUCCESS with an invalid address: {}",
                invalid.message()
            ),
        };
        free_raw_chunks(&self.lib, self.handle, &chunks);
        Err(FlexError::new(Status::INTERNAL, CALL, problem))
    }

    fn free(&self, address: &CompositeAddress) -> Result<()> {
        let chunks = RawAddress::new(address);
        let raw = chunks.raw();
        // SAFETY: the runtime is alive while `&self` is; `raw` points into
        // `chunks`, alive for the call. Freeing memory that operations still
        // use is defined by flex.h (they fail), and touches no host memory.
        let status = unsafe {
            self.lib
                .api()
                .flex_memory_free(self.handle.as_ptr(), &raw const raw)
        };
        check(&self.lib, status, "flex_memory_free")
    }
}

impl Drop for HardwareRuntime {
    /// Runs the teardown (see [`HardwareRuntime`]) unless [`HardwareRuntime::close`]
    /// already did; logs each failure with `tracing::warn!`. Never panics.
    fn drop(&mut self) {
        let logical_device = self.logical_device;
        if !self.handle.in_creating_process() {
            // A forked child: the teardown leaves everything to the parent,
            // and nothing is logged (the log's locks may have been held by
            // a parent thread at the fork).
            let _left_to_the_parent = self.teardown();
            return;
        }
        for failure in self.teardown() {
            tracing::warn!(logical_device, "dropping a flex runtime: {failure}");
        }
    }
}

impl fmt::Debug for HardwareRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardwareRuntime")
            .field("logical_device", &self.logical_device)
            .field("library", &self.lib.path())
            .field("handle", &self.handle.as_ptr())
            .field("created_streams", &self.streams.count())
            .finish_non_exhaustive()
    }
}

/// One step of a [`HardwareRuntime`]'s teardown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TeardownStep {
    /// `flex_stream_synchronize` on the stream with this id (step 1).
    SynchronizeStream {
        /// The stream's id (0 for the default stream).
        id: u64,
    },
    /// `flex_stream_destroy` of the created stream with this id (step 2).
    DestroyStream {
        /// The stream's id.
        id: u64,
    },
    /// `flex_runtime_destroy` (step 3), or the runtime being leaked because
    /// the teardown ran inside one of its own callbacks (`UNSUPPORTED`) or
    /// in a forked child (`RUNTIME_FAILED` naming fork): then no step ran.
    DestroyRuntime,
}

impl fmt::Display for TeardownStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SynchronizeStream { id } => write!(f, "synchronizing stream {id}"),
            Self::DestroyStream { id } => write!(f, "destroying stream {id}"),
            Self::DestroyRuntime => f.write_str("destroying the runtime"),
        }
    }
}

/// A step of a [`HardwareRuntime`]'s teardown that failed, and its error.
/// Displays as `<step>: <error>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{step}: {error}")]
pub struct TeardownError {
    step: TeardownStep,
    error: FlexError,
}

impl TeardownError {
    /// The step that failed.
    pub fn step(&self) -> TeardownStep {
        self.step
    }

    /// Its error, with the flex call, status and the library's message.
    pub fn error(&self) -> &FlexError {
        &self.error
    }
}

/// Every failure of [`HardwareRuntime::close`], in teardown order. The
/// teardown still ran every step, but in a forked child or inside one of
/// the runtime's own callbacks, where it ran none and the one failure is
/// [`TeardownStep::DestroyRuntime`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "closing the flex runtime of logical device {logical_device} failed in {} step(s): {}",
    errors.len(),
    DisplayList(errors)
)]
pub struct CloseError {
    logical_device: u32,
    errors: Vec<TeardownError>,
}

impl CloseError {
    /// The logical device of the runtime that was closed.
    pub fn logical_device(&self) -> u32 {
        self.logical_device
    }

    /// The failed steps, in the order they ran; never empty.
    pub fn errors(&self) -> &[TeardownError] {
        &self.errors
    }
}

/// Formats a list as `a; b; c`.
struct DisplayList<'a>(&'a [TeardownError]);

impl fmt::Display for DisplayList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static_assertions::assert_impl_all!(HardwareRuntime: Send, Sync, fmt::Debug, Runtime);
    static_assertions::assert_impl_all!(CloseError: Send, Sync, std::error::Error);

    #[test]
    fn close_error_lists_every_step_in_order() {
        let error = CloseError {
            logical_device: 1,
            errors: vec![
                TeardownError {
                    step: TeardownStep::SynchronizeStream { id: 3 },
                    error: FlexError::new(
                        Status::EXECUTION_FAILED,
                        "flex_stream_synchronize",
                        "bad program",
                    ),
                },
                TeardownError {
                    step: TeardownStep::DestroyStream { id: 3 },
                    error: FlexError::new(Status::INVALID_HANDLE, "flex_stream_destroy", "gone"),
                },
                TeardownError {
                    step: TeardownStep::DestroyRuntime,
                    error: FlexError::new(Status(42), "flex_runtime_destroy", "odd"),
                },
            ],
        };
        assert_eq!(error.logical_device(), 1);
        assert_eq!(error.errors().len(), 3);
        assert_eq!(
            error.errors()[1].step(),
            TeardownStep::DestroyStream { id: 3 }
        );
        assert_eq!(error.errors()[2].error().status(), Status(42));
        assert_eq!(
            error.to_string(),
            "closing the flex runtime of logical device 1 failed in 3 step(s): \
             synchronizing stream 3: flex_stream_synchronize failed with \
             FLEX_ERROR_EXECUTION_FAILED (9): bad program; \
             destroying stream 3: flex_stream_destroy failed with \
             FLEX_ERROR_INVALID_HANDLE (3): gone; \
             destroying the runtime: flex_runtime_destroy failed with \
             undefined status 42 (not in flex.h): odd"
        );
    }
}

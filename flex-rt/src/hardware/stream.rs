//! `HardwareStream`: one `flex_stream_t`, borrowed from its `HardwareRuntime`.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flex_sys::FlexLibrary;
use flex_sys::bindings as sys;

use super::call::{self, check};
use super::callback::{self, Lease, OpMeta, Payload, Submission};
use super::event::HardwareEvent;
use super::handle::{RuntimeHandle, StreamHandle};
use super::payload_cache::{FailureProbe, FreeBlocks, PayloadCache};
use crate::address::CompositeAddress;
use crate::buffer::HostBuffer;
use crate::error::{FlexError, Result};
use crate::event::Event;
use crate::launch::{Completion, HostCallback, LaunchOptions};
use crate::status::Status;
use crate::sync::Mutex;
use crate::traits::{Stream, check_copy_size, check_fill_size};
use crate::types::{DataFormat, StreamPriority};

/// One hardware queue of a [`HardwareRuntime`](super::HardwareRuntime): a
/// `flex_stream_t` (torch-spyre's `flex::RuntimeStream`).
///
/// Obtained only as a borrow of its context —
/// [`HardwareRuntime::default_stream`](super::HardwareRuntime::default_stream)
/// or [`HardwareRuntime::create_stream`](super::HardwareRuntime::create_stream)
/// — so it cannot outlive it, and nothing but the context destroys it (the
/// stream-ownership spec: "torch-spyre never destroys a
/// flex::RuntimeStream"). All behaviour is the [`Stream`] trait's; this type
/// adds [`HardwareStream::is_default`].
///
/// # Launches
///
/// Each launch checks what flex-rt can check first ([`check_copy_size`],
/// [`check_fill_size`], the lease on a [`HostBuffer`]), then calls the flex
/// launch function with a completion that always releases what the
/// operation holds. On `Err` nothing was enqueued and the completion was
/// dropped without being called; on `Ok` it is called exactly once, on a
/// runtime thread. See the [module documentation](super) for the ownership
/// of each launch.
///
/// # Thread-safety
///
/// `Send + Sync`. `flex.h` lets every function be called from any thread,
/// except that launches on one stream from several threads at once "are not
/// serialized by the runtime: the caller must serialize them". This stream
/// does: a mutex per stream is held across each launch call (the spec leaves
/// it to the caller; here safe code cannot get it wrong). `query`,
/// `synchronize` and `needs_shutdown` take no lock.
/// [`Stream::synchronize`] from a completion or host callback of the same
/// runtime is refused with [`Status::UNSUPPORTED`], as `flex.h` forbids it
/// (it would wait for itself).
///
/// # Panics
///
/// No method panics. A panic in a completion or host callback is caught at
/// the flex boundary: a host callback's panic fails the operation (and the
/// stream) with [`Status::HOST_CALLBACK_FAILED`]; the stream's errors
/// after it (from [`Stream::query`] and [`Stream::synchronize`], launches
/// refused with [`Status::STREAM_FAILED`], and the completions of
/// operations that did not run) end with the panic's message, as the
/// in-process software device's do. A completion's panic after its
/// operation succeeded fails the stream too, on flex-rt's side (the
/// library cannot be told: a completion returns nothing): from then on
/// launches, records and waits are refused with
/// [`Status::STREAM_FAILED`], and `synchronize` returns
/// [`Status::HOST_CALLBACK_FAILED`] naming it once the library has run the
/// work it had queued; unlike on the in-process device, that work still
/// runs (a launch made while the completion runs may still be enqueued),
/// and `query` says `false` until it has, then returns the same error. Events recorded behind it fail
/// on flex-rt's side, as on the in-process device (see `HardwareEvent`),
/// but a wait on one enqueued in the library passes, and the waiting
/// stream's work runs. Another stream that waited on an event of a stream
/// failed by a host callback's panic fails with the library's message,
/// which does not name the panic.
pub struct HardwareStream {
    /// Keeps the library loaded; the context holds it too.
    lib: Arc<FlexLibrary>,
    /// The runtime this stream belongs to.
    runtime: RuntimeHandle,
    handle: StreamHandle,
    /// From `flex_stream_get_id`, read once at creation.
    id: u64,
    /// From `flex_stream_get_priority`, read once at creation.
    priority: StreamPriority,
    /// Whether this is the runtime's default stream.
    is_default: bool,
    /// Held across every launch call: serializes submissions to this
    /// stream, and holds the payload blocks its launches take first.
    submit: Mutex<FreeBlocks<Payload>>,
    /// Launches the library took whose completions are flex-rt's (every
    /// launch, and every record with a completion): the place of each
    /// among them is the order of its completion (flex.h calls a stream's
    /// completions in submission order). Written under `submit`, beside
    /// it: not on the line the completions write.
    launched: AtomicU64,
    /// The payload blocks its completions give back (see
    /// [`super::payload_cache`]).
    payloads: Arc<PayloadCache<Payload>>,
}

impl HardwareStream {
    /// Wraps a stream handle of `runtime`, reading its id and priority.
    ///
    /// # Errors
    /// The error of `flex_stream_get_id` or `flex_stream_get_priority`, or
    /// [`Status::INTERNAL`] for a priority `flex.h` does not define. The
    /// caller still owns the handle then.
    pub(super) fn open(
        lib: Arc<FlexLibrary>,
        runtime: RuntimeHandle,
        handle: StreamHandle,
        is_default: bool,
    ) -> Result<Self> {
        let api = lib.api();
        let mut id = 0u64;
        // SAFETY: `handle` is a live stream of a live runtime (the caller got
        // it from the library just now); `id` is a valid `uint64_t` out
        // pointer for the duration of the call.
        let status = unsafe { api.flex_stream_get_id(handle.as_ptr(), &raw mut id) };
        check(&lib, status, "flex_stream_get_id")?;
        let mut raw_priority = sys::FLEX_STREAM_PRIORITY_NORMAL;
        // SAFETY: as above, with a valid `flex_stream_priority_t` out pointer.
        let status =
            unsafe { api.flex_stream_get_priority(handle.as_ptr(), &raw mut raw_priority) };
        check(&lib, status, "flex_stream_get_priority")?;
        let priority = StreamPriority::from_raw(raw_priority).map_err(|_| {
            FlexError::new(
                Status::INTERNAL,
                "flex_stream_get_priority",
                format!("returned FLEX_SUCCESS with priority {raw_priority}, which flex.h does not define"),
            )
        })?;
        let payloads = Arc::new(PayloadCache::with_failure_probe(failure_probe(
            &lib, handle,
        )));
        Ok(Self {
            lib,
            runtime,
            handle,
            id,
            priority,
            is_default,
            submit: Mutex::new(FreeBlocks::new()),
            launched: AtomicU64::new(0),
            payloads,
        })
    }

    /// Whether this is the runtime's default stream (id 0 in `flex.h`),
    /// which lives as long as the runtime and is never destroyed on its own.
    pub fn is_default(&self) -> bool {
        self.is_default
    }

    /// The handle, for the owning context's teardown.
    pub(super) fn handle(&self) -> StreamHandle {
        self.handle
    }

    /// Keeps the stream's payload cache alive for good: for a runtime
    /// leaked with completions still to come (see
    /// [`super::payload_cache`]).
    pub(super) fn leak_payload_cache(&self) {
        PayloadCache::leak(&self.payloads);
    }

    /// `flex_stream_synchronize` without the callback-thread check; for the
    /// context's teardown, which makes that check itself.
    pub(super) fn synchronize_unchecked(&self) -> Result<()> {
        // SAFETY: the stream and its runtime are alive (the context is not
        // torn down while `&self` exists, and teardown calls this before
        // destroying anything). The callers have checked that this thread is
        // not running a callback of this runtime.
        let status = unsafe { self.lib.api().flex_stream_synchronize(self.handle.as_ptr()) };
        const CALL: &str = "flex_stream_synchronize";
        self.check_completions(CALL)?;
        check(&self.lib, status, CALL).map_err(|err| self.with_host_panic(err))
    }

    /// Whether a completion of this stream panicked after its operation
    /// succeeded, which fails the stream on flex-rt's side
    /// ([`PayloadCache::note_completion_panic`]).
    pub(super) fn completion_panicked(&self) -> bool {
        self.payloads.completion_panic().is_some()
    }

    /// `Err(HOST_CALLBACK_FAILED)` from `call` (`flex_stream_query` or
    /// `flex_stream_synchronize`) once a completion of this stream
    /// panicked after its operation succeeded: the stream's first error,
    /// which the library does not know. One load.
    #[inline]
    fn check_completions(&self, call: &'static str) -> Result<()> {
        match self.payloads.completion_panic() {
            None => Ok(()),
            Some(message) => Err(FlexError::new(Status::HOST_CALLBACK_FAILED, call, message)),
        }
    }

    /// `Err(STREAM_FAILED)` for work enqueued with `call` once a completion
    /// of this stream panicked after its operation succeeded: the stream
    /// refuses work from then on, as a failed stream does. One load.
    #[inline]
    fn check_accepts_work(&self, call: &'static str) -> Result<()> {
        match self.payloads.completion_panic() {
            None => Ok(()),
            Some(message) => Err(FlexError::new(
                Status::STREAM_FAILED,
                call,
                format!(
                    "the stream has failed and accepts no more work; its first error: {message}"
                ),
            )),
        }
    }

    /// `err`, an error of this stream, naming the host callback panic
    /// that failed the stream, if one did ([`callback::name_stream_panic`]):
    /// the library knows only the status the host function returned. The
    /// in-process software device's errors name it too.
    fn with_host_panic(&self, err: FlexError) -> FlexError {
        callback::name_stream_panic(err, self.id, self.payloads.host_panic())
    }

    /// The payload of one operation on this stream.
    fn payload(
        &self,
        call: &'static str,
        options: LaunchOptions,
        lease: Lease,
        host_callback: Option<HostCallback>,
    ) -> (Payload, i32) {
        let meta = OpMeta {
            call,
            stream_id: Some(self.id),
            runtime: self.runtime.key(),
        };
        let barrier = i32::from(options.pipeline_barrier);
        let payload = Payload::new(meta, options.completion, lease, host_callback);
        (payload, barrier)
    }

    /// Makes one launch call under the submission lock, then settles who
    /// owns the payload: the library on `FLEX_SUCCESS`, else this function,
    /// which reads the error message first and then frees the payload
    /// without calling its completion.
    fn submit(
        &self,
        call: &'static str,
        payload: Payload,
        launch: impl FnOnce(&Submission) -> sys::flex_status_t,
    ) -> Result<()> {
        // Declared before the lock, so that it is dropped after it even if
        // the launch unwinds: its drop runs user code, which may launch on
        // this stream.
        self.runtime.check_not_forked(call)?;
        self.check_accepts_work(call)?;
        let submission;
        let status = {
            let mut free = self.submit.lock();
            // SAFETY: the cache outlives every completion of this stream's
            // launches (see `super::payload_cache`: the stream is dropped
            // only after its runtime confirmed them, or the cache is leaked)
            // and the submission (dropped in this call); `free` is this
            // stream's own list, which holds blocks of this cache only.
            submission = unsafe { Submission::cached(payload, &self.payloads, &mut free) };
            let status = launch(&submission);
            if status == sys::FLEX_SUCCESS {
                // Under the lock: a load and a store, no read-modify-write.
                let launched = self.launched.load(Ordering::Relaxed);
                self.launched.store(launched + 1, Ordering::Relaxed);
            }
            status
        };
        if status == sys::FLEX_SUCCESS {
            submission.hand_over();
            return Ok(());
        }
        // Read the thread-local message before dropping the payload: its
        // drop runs user code, which could make other flex calls.
        let error = call::failure(Status(status), call, self.lib.last_error_message());
        drop(submission);
        Err(self.with_host_panic(error))
    }
}

/// A `flex_composite_address_t` and the chunk array it points into; the
/// array lives as long as this value, so keep it alive across the call.
pub(super) struct RawAddress {
    chunks: Vec<sys::flex_address_chunk_t>,
}

impl RawAddress {
    pub(super) fn new(address: &CompositeAddress) -> Self {
        Self {
            chunks: address.to_raw_chunks(),
        }
    }

    /// The struct to pass by pointer; valid while `self` is alive and
    /// unchanged.
    pub(super) fn raw(&self) -> sys::flex_composite_address_t {
        sys::flex_composite_address_t {
            chunks: self.chunks.as_ptr(),
            num_chunks: self.chunks.len(),
        }
    }
}

impl Stream for HardwareStream {
    fn id(&self) -> u64 {
        self.id
    }

    fn priority(&self) -> StreamPriority {
        self.priority
    }

    fn query(&self) -> Result<bool> {
        // SAFETY: the stream is alive while `&self` is (its context outlives
        // the borrow). `flex_stream_query` does not block and may be called
        // from any thread, callbacks included.
        let status = unsafe { self.lib.api().flex_stream_query(self.handle.as_ptr()) };
        const CALL: &str = "flex_stream_query";
        if status == sys::FLEX_NOT_READY {
            // Still running, behind a completion's panic too: the library
            // runs the work it had queued (see the type's docs), and the
            // panic's failure is reported once that work has ended.
            return Ok(false);
        }
        self.check_completions(CALL)?;
        call::query_result(status, CALL, || self.lib.last_error_message())
            .map_err(|err| self.with_host_panic(err))
    }

    fn synchronize(&self) -> Result<()> {
        if callback::in_callback_of(self.runtime.key()) {
            return Err(FlexError::new(
                Status::UNSUPPORTED,
                "synchronize",
                "synchronize was called from a completion or host callback of the same runtime; it would wait for itself",
            ));
        }
        self.synchronize_unchecked()
    }

    fn needs_shutdown(&self) -> Result<bool> {
        let mut needs = 0i32;
        // SAFETY: the stream is alive while `&self` is; `needs` is a valid
        // `int32_t` out pointer for the call.
        let status = unsafe {
            self.lib
                .api()
                .flex_stream_needs_shutdown(self.handle.as_ptr(), &raw mut needs)
        };
        check(&self.lib, status, "flex_stream_needs_shutdown")?;
        Ok(call::bool_from_raw(needs))
    }

    fn launch_h2d(
        &self,
        src: &HostBuffer,
        dst: &CompositeAddress,
        options: LaunchOptions,
    ) -> Result<()> {
        const CALL: &str = "flex_launch_h2d";
        check_copy_size("launch_h2d", src.len(), dst)?;
        let lease = src.lease_for_read("launch_h2d")?;
        let host_src: *const c_void = lease.as_ptr().cast();
        let dst = RawAddress::new(dst);
        let dst_raw = dst.raw();
        let (payload, barrier) = self.payload(CALL, options, Lease::Read(lease), None);
        self.submit(CALL, payload, |submission| {
            // SAFETY: the stream is alive while `&self` is, and the submission
            // lock is held. `host_src` points to `src.len()` bytes, which
            // equals the total size of `dst` (checked above); the read lease
            // inside the payload keeps those bytes allocated and unmodified
            // until the completion, which is the lifetime `flex.h` requires.
            // `dst_raw` points into `dst`'s chunk array, alive for the call.
            // The completion takes ownership of the payload only if this
            // returns FLEX_SUCCESS (see `submit`).
            unsafe {
                self.lib.api().flex_launch_h2d(
                    self.handle.as_ptr(),
                    host_src,
                    &raw const dst_raw,
                    barrier,
                    submission.completion(),
                )
            }
        })
    }

    fn launch_d2h(
        &self,
        src: &CompositeAddress,
        dst: &HostBuffer,
        options: LaunchOptions,
    ) -> Result<()> {
        const CALL: &str = "flex_launch_d2h";
        check_copy_size("launch_d2h", dst.len(), src)?;
        let mut lease = dst.lease_for_write("launch_d2h")?;
        let host_dst: *mut c_void = lease.as_mut_ptr().cast();
        let src = RawAddress::new(src);
        let src_raw = src.raw();
        let (payload, barrier) = self.payload(CALL, options, Lease::Write(lease), None);
        self.submit(CALL, payload, |submission| {
            // SAFETY: the stream is alive while `&self` is, and the submission
            // lock is held. `host_dst` points to `dst.len()` writable bytes,
            // the total size of `src` (checked above). The exclusive write
            // lease inside the payload keeps them allocated and keeps every
            // Rust reader and writer out until the completion, as `flex.h`
            // requires. `src_raw` points into `src`'s chunk array, alive for
            // the call.
            unsafe {
                self.lib.api().flex_launch_d2h(
                    self.handle.as_ptr(),
                    &raw const src_raw,
                    host_dst,
                    barrier,
                    submission.completion(),
                )
            }
        })
    }

    fn launch_compute(&self, program: &CompositeAddress, options: LaunchOptions) -> Result<()> {
        const CALL: &str = "flex_launch_compute";
        let program = RawAddress::new(program);
        let program_raw = program.raw();
        let (payload, barrier) = self.payload(CALL, options, Lease::None, None);
        self.submit(CALL, payload, |submission| {
            // SAFETY: the stream is alive while `&self` is, and the submission
            // lock is held. `program_raw` points into `program`'s chunk array,
            // alive for the call (flex.h reads it only during the call).
            unsafe {
                self.lib.api().flex_launch_compute(
                    self.handle.as_ptr(),
                    &raw const program_raw,
                    barrier,
                    submission.completion(),
                )
            }
        })
    }

    fn launch_host_callback(&self, callback: HostCallback, options: LaunchOptions) -> Result<()> {
        const CALL: &str = "flex_launch_host_callback";
        let (payload, barrier) = self.payload(CALL, options, Lease::None, Some(callback));
        self.submit(CALL, payload, |submission| {
            // SAFETY: the stream is alive while `&self` is, and the submission
            // lock is held. `host_user_data` points into the payload, which
            // stays allocated until the completion is called (the lifetime
            // `flex.h` requires); the host trampoline only takes a shared
            // reference to it, and the completion runs after the host
            // function (see the `callback` module).
            unsafe {
                self.lib.api().flex_launch_host_callback(
                    self.handle.as_ptr(),
                    submission.host_fn(),
                    submission.host_user_data(),
                    barrier,
                    submission.completion(),
                )
            }
        })
    }

    fn launch_fill(
        &self,
        dst: &CompositeAddress,
        value: f64,
        format: DataFormat,
        options: LaunchOptions,
    ) -> Result<()> {
        const CALL: &str = "flex_launch_fill";
        check_fill_size("launch_fill", dst, format)?;
        let dst = RawAddress::new(dst);
        let dst_raw = dst.raw();
        let (payload, barrier) = self.payload(CALL, options, Lease::None, None);
        self.submit(CALL, payload, |submission| {
            // SAFETY: the stream is alive while `&self` is, and the submission
            // lock is held. `dst_raw` points into `dst`'s chunk array, alive
            // for the call.
            unsafe {
                self.lib.api().flex_launch_fill(
                    self.handle.as_ptr(),
                    &raw const dst_raw,
                    value,
                    format.to_raw(),
                    barrier,
                    submission.completion(),
                )
            }
        })
    }

    fn record_event(&self, event: &dyn Event, completion: Option<Completion>) -> Result<()> {
        const CALL: &str = "flex_event_record";
        let event = HardwareEvent::of(event, CALL)?;
        let Some(completion) = completion else {
            // Nothing to call: no payload, and no completion for the
            // library, which can then complete the record as soon as the
            // stream gets to it. A record with a completion is an operation
            // the library must run to call it, which work of other streams
            // (of higher priority) can delay, and with it the event.
            return event.use_for_stream(self.runtime, CALL, |raw_event| {
                self.check_accepts_work(CALL)?;
                // Enqueued like a launch: serialized with them.
                let _serialized = self.submit.lock();
                let launched = self.launched.load(Ordering::Relaxed);
                // SAFETY: the stream is alive while `&self` is; the event is
                // alive and of the same live runtime (`use_for_stream`
                // checked both, holding the runtime's liveness lock). A null
                // completion function is "none" (flex.h).
                let status = event.record_on(self.id, &self.payloads, launched, || unsafe {
                    self.lib.api().flex_event_record(
                        raw_event,
                        self.handle.as_ptr(),
                        sys::flex_completion_t {
                            fn_: None,
                            user_data: std::ptr::null_mut(),
                        },
                    )
                });
                check(&self.lib, status, CALL).map_err(|err| self.with_host_panic(err))
            });
        };
        let options = LaunchOptions {
            pipeline_barrier: false,
            completion: Some(completion),
        };
        let (payload, _) = self.payload(CALL, options, Lease::None, None);
        event.use_for_stream(self.runtime, CALL, |raw_event| {
            self.submit(CALL, payload, |submission| {
                // Under the submission lock: the launches before the record.
                let launched = self.launched.load(Ordering::Relaxed);
                // SAFETY: the stream is alive while `&self` is, and the
                // submission lock is held; the event is alive and of the
                // same live runtime (`use_for_stream` checked both, holding
                // the runtime's liveness lock). The completion takes the
                // payload only on FLEX_SUCCESS (see `submit`).
                event.record_on(self.id, &self.payloads, launched, || unsafe {
                    self.lib.api().flex_event_record(
                        raw_event,
                        self.handle.as_ptr(),
                        submission.completion(),
                    )
                })
            })
        })
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        const CALL: &str = "flex_stream_wait_event";
        let event = HardwareEvent::of(event, CALL)?;
        if !event.device_side_wait() && callback::in_callback_of(event.runtime_key()) {
            return Err(FlexError::new(
                Status::UNSUPPORTED,
                CALL,
                "this device cannot wait on the device side, so wait_event blocks the host; called from a completion or host callback of the same runtime it would wait for itself",
            ));
        }
        event.use_for_stream(self.runtime, CALL, |raw_event| {
            self.check_accepts_work(CALL)?;
            let wait = || {
                // SAFETY: the stream is alive while `&self` is; the event is
                // alive and of the same live runtime (checked by
                // `use_for_stream`, which holds the liveness lock across
                // this closure). The callers below hold the submission lock
                // when the call enqueues, and hold no lock when it blocks.
                unsafe {
                    self.lib
                        .api()
                        .flex_stream_wait_event(self.handle.as_ptr(), raw_event)
                }
            };
            let status = if event.device_side_wait() {
                // The wait is enqueued like a launch: serialized with them.
                let _serialized = self.submit.lock();
                wait()
            } else {
                // The call blocks the host until the event completes and
                // enqueues nothing: it must not hold the submission lock,
                // or a callback that launches on this stream before the
                // event's point would wait for it for ever. This thread
                // runs no callback of the runtime (checked above).
                wait()
            };
            check(&self.lib, status, CALL).map_err(|err| self.with_host_panic(err))
        })
    }
}

/// Whether the library reports stream `handle` failed, for its payload
/// cache ([`PayloadCache::note_completion_panic`]).
fn failure_probe(lib: &Arc<FlexLibrary>, handle: StreamHandle) -> FailureProbe {
    let lib = Arc::clone(lib);
    Box::new(move || {
        // SAFETY: the probe is called only from a completion of the
        // stream's launches, and the library calls those before
        // `flex_stream_destroy` or `flex_runtime_destroy` returns (both wait
        // for them), so the handle is live; `flex_stream_query` never blocks
        // and may be called from a callback (flex.h).
        let status = unsafe { lib.api().flex_stream_query(handle.as_ptr()) };
        status != sys::FLEX_SUCCESS && status != sys::FLEX_NOT_READY
    })
}

impl fmt::Debug for HardwareStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardwareStream")
            .field("id", &self.id)
            .field("priority", &self.priority)
            .field("is_default", &self.is_default)
            .field("handle", &self.handle.as_ptr())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::{AddressChunk, LogicalAddress};

    static_assertions::assert_impl_all!(HardwareStream: Send, Sync, fmt::Debug);

    #[test]
    fn raw_addresses_point_at_their_chunks() {
        let address = CompositeAddress::new(vec![
            AddressChunk {
                address: LogicalAddress {
                    region_id: 1,
                    offset: 128,
                },
                size: 10,
            },
            AddressChunk {
                address: LogicalAddress {
                    region_id: 2,
                    offset: 0,
                },
                size: 20,
            },
        ])
        .unwrap();
        let holder = RawAddress::new(&address);
        let raw = holder.raw();
        assert_eq!(raw.num_chunks, 2);
        assert_eq!(raw.chunks, holder.chunks.as_ptr());
        assert_eq!(holder.chunks[1].address.region_id, 2);
        assert_eq!(holder.chunks[1].size, 20);
    }
}

//! `HardwareEvent`: one `flex_event_t` (flex.h ABI 1.1).

use std::any::Any;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use flex_sys::FlexLibrary;
use flex_sys::bindings as sys;

use super::call::{self, check};
use super::callback::{self, Lease, OpMeta, Payload, Submission};
use super::handle::RuntimeHandle;
use super::payload_cache::{self, PayloadCache};
use crate::error::{FlexError, Result};
use crate::event::{Capabilities, Event, Notification};
use crate::launch::Completion;
use crate::status::Status;
use crate::sync::Mutex;

/// Whether a runtime is still alive, shared by the runtime and its events.
///
/// The runtime's teardown clears it ([`Liveness::end`]) before
/// `flex_runtime_destroy` (which destroys the runtime's events); every event
/// call holds the read lock across its FFI call, so none runs on a destroyed
/// handle.
///
/// The standard library's reader-writer lock, not [`crate::sync::RwLock`]:
/// on Linux (a futex word) a waiting writer goes first, so a stream of
/// event calls on other threads cannot hold a close off, and a thread may
/// take the read lock again while no writer waits. A thread takes it twice
/// only inside a stream's call (an event dropped by a record that failed
/// to launch, while the record holds the event's read lock), when no
/// writer can be waiting: the teardown needs the runtime exclusively. (The
/// standard library promises neither order nor a second read on every
/// platform.) Like [`crate::sync`]'s, it keeps no state outside itself (a
/// forked child can use the runtimes it makes).
#[derive(Clone)]
pub(super) struct Liveness(Arc<std::sync::RwLock<bool>>);

impl Liveness {
    /// A live runtime's.
    pub(super) fn new() -> Self {
        Self(Arc::new(std::sync::RwLock::new(true)))
    }

    /// The read lock, to hold across an event's FFI call: `true` while the
    /// runtime is alive. Poisoning is ignored (no panic happens while the
    /// write lock is held).
    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, bool> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks the runtime closed, once every event call in flight has
    /// returned.
    pub(super) fn end(&self) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = false;
    }
}

/// The `UNSUPPORTED` error for the ABI 1.1 function `call` when the library
/// is 1.0 ("unsupported by this flex library (ABI 1.0)", naming it).
pub(super) fn require_1_1(lib: &FlexLibrary, call: &'static str) -> Result<()> {
    lib.require(call)
        .map_err(|missing| FlexError::new(Status::UNSUPPORTED, call, missing.to_string()))
}

/// Reads the runtime's capabilities (`flex_runtime_get_capability`).
pub(super) fn read_capabilities(lib: &FlexLibrary, runtime: RuntimeHandle) -> Result<Capabilities> {
    const CALL: &str = "flex_runtime_get_capability";
    require_1_1(lib, CALL)?;
    let read = |capability: sys::flex_capability_t| -> Result<bool> {
        let mut value = 0i32;
        // SAFETY: `runtime` is alive (the caller owns it); `require` returned
        // Ok, so the symbol is resolved; `value` is a valid `int32_t` out
        // pointer for the call.
        let status = unsafe {
            lib.api()
                .flex_runtime_get_capability(runtime.as_ptr(), capability, &raw mut value)
        };
        check(lib, status, CALL)?;
        Ok(call::bool_from_raw(value))
    };
    Ok(Capabilities {
        device_side_wait: read(sys::FLEX_CAPABILITY_DEVICE_SIDE_WAIT)?,
        event_timing: read(sys::FLEX_CAPABILITY_EVENT_TIMING)?,
    })
}

/// An event of a [`HardwareRuntime`](super::HardwareRuntime): a
/// `flex_event_t` (torch-spyre would call it `SpyreEvent`'s handle).
///
/// Destroyed with `flex_event_destroy` on drop, which never blocks (flex.h:
/// pending records and waits are still honoured). If the runtime is closed
/// first, the event is gone with it: its methods then fail with
/// [`Status::INVALID_HANDLE`] and drop does nothing. In a child forked
/// after its runtime was created, its methods fail with
/// [`Status::RUNTIME_FAILED`] naming fork and drop does nothing (the event
/// is the parent's).
///
/// When the stream of the event's latest record failed by a host
/// callback's panic, the event's errors (`STREAM_FAILED` from
/// [`Event::query`] and [`Event::synchronize`]) end with the panic's
/// message, as the in-process software device's do (the library knows
/// only the status the host function returned). When a completion of an
/// operation enqueued before the record panicked after the operation
/// succeeded, which fails the stream on flex-rt's side only (see
/// `HardwareStream`), the event fails too: its query, synchronize and
/// notification give `STREAM_FAILED` naming the panic, as on the
/// in-process device, although the library completed the record. A wait
/// on it enqueued in the library still passes (the library cannot be
/// told). This rests on flex.h's rule that a stream does not move on while
/// a completion runs: with a library that calls completions late (after
/// later work ran), an event may be seen complete before the panic is
/// noted. A query or synchronize that a new record of the same event
/// overtakes gives the library's outcome of the earlier record unchecked.
///
/// Thread-safety: `Send + Sync`; flex.h lets every event function be called
/// from any thread, and serializes concurrent records of one event.
pub struct HardwareEvent {
    lib: Arc<FlexLibrary>,
    runtime: RuntimeHandle,
    handle: NonNull<sys::flex_event_t>,
    alive: Liveness,
    logical_device: u32,
    timing: bool,
    device_side_wait: bool,
    /// The latest record made through flex-rt. Held across each record
    /// call, so it pairs with the library's latest record.
    latest: Mutex<Option<Recorded>>,
    /// How many records were made through flex-rt: moved under `latest`
    /// after each; an error is matched to `latest` only if no record was
    /// made between the call that gave it and the read of `latest`.
    records: AtomicU64,
}

/// Where an event was recorded through flex-rt.
#[derive(Clone)]
struct Recorded {
    /// The id of the stream.
    stream_id: u64,
    /// The stream's payload cache, where the panics of its callbacks are
    /// noted: a host callback's, to name in the event's errors (the
    /// library knows only the status the host function returned), and a
    /// completion's, which fails the event if it came before the record.
    cache: Arc<PayloadCache<Payload>>,
    /// The stream's launches before the record
    /// (`HardwareStream` counts them).
    launched: u64,
}

impl Recorded {
    /// `Err(STREAM_FAILED)` for `call` if a completion of a launch before
    /// the record panicked after its operation succeeded.
    fn check_completions(&self, call: &'static str) -> Result<()> {
        match self.cache.completion_panic_before(self.launched) {
            None => Ok(()),
            Some(message) => Err(FlexError::new(
                Status::STREAM_FAILED,
                call,
                format!(
                    "the event was recorded on stream {} behind work whose completion failed the stream: {message}",
                    self.stream_id
                ),
            )),
        }
    }
}

// SAFETY: the event handle is an opaque token passed back to the library;
// flex.h lets every function be called from any thread with any handle, and
// serializes concurrent records of one event itself. The other fields are
// `Send + Sync`.
unsafe impl Send for HardwareEvent {}
// SAFETY: as for `Send`: `&HardwareEvent` only shares the pointer value.
unsafe impl Sync for HardwareEvent {}

impl HardwareEvent {
    /// Creates an event on `runtime` (`flex_event_create`).
    pub(super) fn create(
        lib: &Arc<FlexLibrary>,
        runtime: RuntimeHandle,
        alive: &Liveness,
        logical_device: u32,
        timing: bool,
        capabilities: Capabilities,
    ) -> Result<Self> {
        const CALL: &str = "flex_event_create";
        require_1_1(lib, CALL)?;
        let flags = if timing {
            sys::FLEX_EVENT_TIMING
        } else {
            sys::FLEX_EVENT_DEFAULT
        };
        let mut out: *mut sys::flex_event_t = ptr::null_mut();
        // SAFETY: `runtime` is alive (the caller borrows it); the 1.1 symbols
        // are resolved (checked above); `out` is a valid out pointer.
        let status = unsafe {
            lib.api()
                .flex_event_create(runtime.as_ptr(), flags, &raw mut out)
        };
        check(lib, status, CALL)?;
        let handle = call::non_null(out, CALL, "event handle")?;
        Ok(Self {
            lib: Arc::clone(lib),
            runtime,
            handle,
            alive: alive.clone(),
            logical_device,
            timing,
            device_side_wait: capabilities.device_side_wait,
            latest: Mutex::new(None),
            records: AtomicU64::new(0),
        })
    }

    /// Makes a record of the event on stream `stream_id` (whose payload
    /// cache is `cache`, and which had `launched` launches with flex-rt's
    /// completions before it) with `record`, the library call, which
    /// returns its status: the stream is kept as the latest record's if the
    /// call succeeded (see [`HardwareEvent::name_host_panic`] and
    /// [`Recorded::check_completions`]). Called under the stream's
    /// submission lock; runs no user code.
    pub(super) fn record_on(
        &self,
        stream_id: u64,
        cache: &Arc<PayloadCache<Payload>>,
        launched: u64,
        record: impl FnOnce() -> sys::flex_status_t,
    ) -> sys::flex_status_t {
        let mut latest = self.latest.lock();
        let status = record();
        if status == sys::FLEX_SUCCESS {
            *latest = Some(Recorded {
                stream_id,
                cache: Arc::clone(cache),
                launched,
            });
            self.records.fetch_add(1, Ordering::Release);
        }
        status
    }

    /// `err`, the error of a call made when [`HardwareEvent::records`]
    /// was `records`, naming the host callback panic that failed the
    /// stream of the event's latest record, if one did and no record has
    /// been made since (else the error may be about another record).
    #[cold]
    fn name_host_panic(&self, records: u64, err: FlexError) -> FlexError {
        if !self.runtime.in_creating_process() {
            // The fork error: in a forked child, `latest` may be held for
            // ever by a parent thread the child does not have.
            return err;
        }
        let latest = self.latest.lock();
        let Some(recorded) = latest.as_ref() else {
            return err;
        };
        if self.records.load(Ordering::Acquire) != records {
            return err;
        }
        callback::name_stream_panic(err, recorded.stream_id, recorded.cache.host_panic())
    }

    /// The latest record as of `records` ([`HardwareEvent::records`] read
    /// before the call whose outcome it qualifies), if it was made through
    /// flex-rt and none has been made since.
    fn recorded_as_of(&self, records: u64) -> Option<crate::sync::MappedMutexGuard<'_, Recorded>> {
        let latest = self.latest.lock();
        if self.records.load(Ordering::Acquire) != records {
            return None;
        }
        crate::sync::MutexGuard::try_map(latest, Option::as_mut).ok()
    }

    /// `outcome`, a success of `call` for the latest record as of
    /// `records`, unless a completion of its stream panicked before it
    /// (see [`Recorded::check_completions`]).
    #[inline]
    fn check_completions<T>(&self, records: u64, call: &'static str, outcome: T) -> Result<T> {
        if !payload_cache::any_completion_panic() {
            return Ok(outcome);
        }
        match self.recorded_as_of(records) {
            Some(recorded) => recorded.check_completions(call).map(|()| outcome),
            None => Ok(outcome),
        }
    }

    /// The outcome of the event's latest record, `recorded` when made
    /// through flex-rt, which the library has said is settled: its query,
    /// with a host callback's panic named and a completion's panic before
    /// the record checked, as [`Event::query`] does. The caller holds
    /// [`HardwareEvent::latest`] (so no record is made meanwhile) and the
    /// runtime's liveness.
    #[cold]
    fn settled_outcome(
        &self,
        event: *mut sys::flex_event_t,
        recorded: Option<&Recorded>,
    ) -> Result<()> {
        const CALL: &str = "flex_event_query";
        // SAFETY: as in `query`: the event and its runtime are alive (the
        // caller holds the read lock); the symbol is resolved. Never blocks.
        let status = unsafe { self.lib.api().flex_event_query(event) };
        let queried = call::query_result(status, CALL, || self.lib.last_error_message());
        match (queried, recorded) {
            (Err(err), Some(recorded)) => Err(callback::name_stream_panic(
                err,
                recorded.stream_id,
                recorded.cache.host_panic(),
            )),
            (Err(err), None) => Err(err),
            (Ok(_), Some(recorded)) => recorded.check_completions(CALL),
            (Ok(_), None) => Ok(()),
        }
    }

    /// Runs `f` with the event's handle while the runtime is known alive.
    fn with_handle<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(*mut sys::flex_event_t) -> Result<T>,
    ) -> Result<T> {
        self.runtime.check_not_forked(call)?;
        let alive = self.alive.read();
        if !*alive {
            return Err(FlexError::new(
                Status::INVALID_HANDLE,
                call,
                "the event's runtime was closed, which destroyed the event",
            ));
        }
        f(self.handle.as_ptr())
    }

    /// The raw handle, for a stream of the same runtime: `f` runs while the
    /// runtime is known alive.
    pub(super) fn use_for_stream<T>(
        &self,
        runtime: RuntimeHandle,
        call: &'static str,
        f: impl FnOnce(*mut sys::flex_event_t) -> Result<T>,
    ) -> Result<T> {
        if runtime != self.runtime {
            return Err(FlexError::invalid_argument(
                call,
                format!(
                    "the event belongs to another runtime (logical device {}) than the stream",
                    self.logical_device
                ),
            ));
        }
        self.with_handle(call, f)
    }

    /// Whether the runtime waits on the device side (else `wait_event`
    /// blocks the host).
    pub(super) fn device_side_wait(&self) -> bool {
        self.device_side_wait
    }

    /// The key of the event's runtime, to recognise its callback threads.
    pub(super) fn runtime_key(&self) -> usize {
        self.runtime.key()
    }

    /// Recognises a hardware event among `dyn Event`s.
    pub(super) fn of<'a>(event: &'a dyn Event, call: &'static str) -> Result<&'a HardwareEvent> {
        event.as_any().downcast_ref().ok_or_else(|| {
            FlexError::invalid_argument(
                call,
                format!("{event:?} is not an event of the hardware backend"),
            )
        })
    }
}

impl fmt::Debug for HardwareEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardwareEvent")
            .field("logical_device", &self.logical_device)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl Event for HardwareEvent {
    fn logical_device(&self) -> u32 {
        self.logical_device
    }

    fn timing(&self) -> bool {
        self.timing
    }

    fn query(&self) -> Result<bool> {
        const CALL: &str = "flex_event_query";
        let records = self.records.load(Ordering::Acquire);
        self.with_handle(CALL, |event| {
            // SAFETY: the event is alive (not destroyed: `self` exists, and
            // the runtime is alive under the read lock); the symbol is
            // resolved (the event was created). Never blocks.
            let status = unsafe { self.lib.api().flex_event_query(event) };
            call::query_result(status, CALL, || self.lib.last_error_message())
        })
        .map_err(|err| self.name_host_panic(records, err))
        .and_then(|complete| match complete {
            true => self.check_completions(records, CALL, true),
            false => Ok(false),
        })
    }

    fn notify(&self, completion: Completion) -> Result<Notification> {
        const CALL: &str = "flex_event_notify";
        let meta = OpMeta {
            call: CALL,
            stream_id: None,
            runtime: self.runtime.key(),
        };
        let mut complete = 0i32;
        let (status, submission, settled) = self.with_handle(CALL, |event| {
            // The latest record is held across the call (as a record holds
            // it across its own), so that the record whose outcome the
            // completion checks is the one the library notifies about: the
            // library's outcome, unless a completion before it panicked.
            let latest = self.latest.lock();
            let completion: Completion = match latest.as_ref() {
                Some(recorded) => {
                    let recorded = recorded.clone();
                    Box::new(move |outcome: Result<()>| {
                        completion(outcome.and_then(|()| recorded.check_completions(CALL)));
                    })
                }
                None => completion,
            };
            let submission =
                Submission::new(Payload::new(meta, Some(completion), Lease::None, None));
            // SAFETY: the event is alive and its runtime too (read lock
            // held); `complete` is a valid `int32_t` out pointer. The
            // library takes the payload only on FLEX_SUCCESS with
            // `*complete_out == 0` (flex.h), and never calls the completion
            // inside the call; in every other case it never calls it and
            // the payload is reclaimed below, with no lock held.
            let status = unsafe {
                self.lib
                    .api()
                    .flex_event_notify(event, submission.completion(), &raw mut complete)
            };
            // The library says only that the record has settled; its query
            // says how. Asked with the latest record still held, so that a
            // record made meanwhile cannot answer for it.
            let settled = (status == sys::FLEX_SUCCESS && call::bool_from_raw(complete))
                .then(|| self.settled_outcome(event, latest.as_ref()));
            drop(latest);
            Ok((status, submission, settled))
        })?;
        if status != sys::FLEX_SUCCESS {
            // Read the thread's message before the payload's drop runs user code.
            let error = call::failure(Status(status), CALL, self.lib.last_error_message());
            drop(submission);
            return Err(error);
        }
        match settled {
            // Nothing to wait for: the library will never call it.
            Some(outcome) => {
                drop(submission);
                Ok(Notification::Settled(outcome))
            }
            None => {
                submission.hand_over();
                Ok(Notification::Pending)
            }
        }
    }

    fn synchronize(&self) -> Result<()> {
        const CALL: &str = "flex_event_synchronize";
        if callback::in_callback_of(self.runtime.key()) {
            return Err(FlexError::new(
                Status::UNSUPPORTED,
                CALL,
                "synchronize was called from a completion or host callback of the event's runtime; it would wait for itself",
            ));
        }
        let records = self.records.load(Ordering::Acquire);
        self.with_handle(CALL, |event| {
            // SAFETY: as in `query`; this thread runs no callback of the
            // runtime (checked above), as flex.h requires for a blocking call.
            let status = unsafe { self.lib.api().flex_event_synchronize(event) };
            check(&self.lib, status, CALL)
        })
        .map_err(|err| self.name_host_panic(records, err))
        .and_then(|()| self.check_completions(records, CALL, ()))
    }

    fn elapsed_nanos(&self, end: &dyn Event) -> Result<i64> {
        const CALL: &str = "flex_event_elapsed_time";
        let end = HardwareEvent::of(end, CALL)?;
        self.runtime.check_not_forked(CALL)?;
        end.runtime.check_not_forked(CALL)?;
        // Runtime handles compare by serial number, not address: a runtime
        // created after another was closed may be given its address.
        if self.runtime != end.runtime {
            for (name, event) in [("start", self), ("end", end)] {
                if !*event.alive.read() {
                    return Err(FlexError::new(
                        Status::INVALID_HANDLE,
                        CALL,
                        format!("the {name} event's runtime was closed, which destroyed the event"),
                    ));
                }
            }
            return Err(FlexError::invalid_argument(
                CALL,
                format!(
                    "the start event is of logical device {} and the end event of another runtime (logical device {}); both must be of one runtime",
                    self.logical_device, end.logical_device
                ),
            ));
        }
        self.with_handle(CALL, |start| {
            let mut nanos = 0i64;
            // SAFETY: both events are alive and of this live runtime
            // (checked above, under the read lock); `nanos` is a valid
            // `int64_t` out pointer. `flex_event_elapsed_time` does not block.
            let status = unsafe {
                self.lib
                    .api()
                    .flex_event_elapsed_time(start, end.handle.as_ptr(), &raw mut nanos)
            };
            check(&self.lib, status, CALL)?;
            Ok(nanos)
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HardwareEvent {
    fn drop(&mut self) {
        if !self.runtime.in_creating_process() {
            // A forked child leaves the parent's events to its exit.
            return;
        }
        let alive = self.alive.read();
        if !*alive {
            return;
        }
        // SAFETY: the runtime is alive (read lock held) and the event was
        // created by it and not destroyed yet; this is its last use.
        // `flex_event_destroy` never blocks, so it is safe on any thread,
        // callbacks included.
        let status = unsafe {
            self.lib
                .api()
                .flex_event_destroy(self.runtime.as_ptr(), self.handle.as_ptr())
        };
        if let Err(error) = check(&self.lib, status, "flex_event_destroy") {
            tracing::warn!(logical_device = self.logical_device, "{error}");
        }
    }
}

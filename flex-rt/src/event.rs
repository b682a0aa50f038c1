//! Events: markers in stream order (flex.h ABI 1.1), and the runtime's
//! capabilities that decide how waiting on them behaves.

use std::any::Any;
use std::fmt;

use crate::error::Result;
use crate::launch::Completion;

/// What a runtime can do beyond flex ABI 1.0
/// (`flex_runtime_get_capability`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// `FLEX_CAPABILITY_DEVICE_SIDE_WAIT`: [`Stream::wait_event`](crate::Stream::wait_event)
    /// returns at once and the device holds the stream's later work. When
    /// false, `wait_event` blocks the calling thread until the event has
    /// completed instead (the same ordering, but the host waits); today's
    /// Spyre card is such a device.
    pub device_side_wait: bool,
    /// `FLEX_CAPABILITY_EVENT_TIMING`: events created with timing take
    /// device timestamps, so [`Event::elapsed_nanos`] can work.
    pub event_timing: bool,
}

/// What [`Event::notify`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notification {
    /// The record is pending: the completion will be called once it
    /// completes or fails.
    Pending,
    /// Nothing to wait for, and the completion was dropped uncalled: the
    /// outcome of the latest record as of the call, which had already
    /// completed (`Ok`) or failed (its error, as [`Event::query`] gives
    /// it), or `Ok` for an event never recorded. It is that record's
    /// outcome even when another thread records the event again meanwhile
    /// (a query after the call could report the new record instead).
    Settled(Result<()>),
}

/// A marker in stream order (`flex_event_t`; `cudaEvent_t`,
/// `torch.cuda.Event`).
///
/// Made by [`Runtime::create_event`](crate::Runtime::create_event), recorded
/// by [`Stream::record_event`](crate::Stream::record_event), waited on by
/// [`Stream::wait_event`](crate::Stream::wait_event). The contract, the same
/// for every device backend (PyTorch's and CUDA's rules; the no-op test
/// double departs from it where [`crate::noop`] says):
///
/// - a record captures exactly the work enqueued on its stream before it;
///   the event completes when that work has completed, and later launches do
///   not delay it;
/// - recording again moves the event: `query` and `synchronize` see only the
///   latest record, while a wait already enqueued keeps the record it saw;
/// - an event never recorded is complete (query `Ok(true)`, synchronize
///   returns at once, a wait on it is a no-op, but on a failed stream,
///   which refuses every wait);
/// - if the recording stream fails before the event's point, the event is
///   failed: `query` and `synchronize` return that error, and a stream that
///   waits on it fails too (its error names the event's stream) instead of
///   waiting forever;
/// - dropping the event never blocks: pending records and waits are still
///   honoured and its resources are freed when they are done;
/// - the event dies with its runtime (`flex_runtime_destroy` destroys the
///   runtime's events): once the runtime has been dropped, every call fails
///   with [`Status::INVALID_HANDLE`](crate::Status::INVALID_HANDLE), and
///   dropping the event is harmless.
///
/// Thread-safety: `Send + Sync`; concurrent records of one event are
/// serialized by the backend.
pub trait Event: Send + Sync + fmt::Debug {
    /// The logical device of the runtime that made the event.
    fn logical_device(&self) -> u32;

    /// Whether the event was created with timing (`FLEX_EVENT_TIMING`).
    fn timing(&self) -> bool;

    /// Whether the latest record has completed: `Ok(true)` complete (or
    /// never recorded), `Ok(false)` still pending (`flex_event_query`).
    /// Never blocks.
    ///
    /// # Errors
    /// The record's error if it failed (flex.h): `STREAM_FAILED`, its
    /// message naming the recording stream's first error, or `SHUTDOWN` on
    /// a stream that needs shutdown.
    fn query(&self) -> Result<bool>;

    /// Asks for `completion` to be called once when the latest record (as
    /// of this call) completes (`Ok`) or fails (the record's error, as for
    /// [`Event::query`]), on a runtime thread, as for a launch (`flex_event_notify`).
    /// Adds nothing to any stream and never blocks: the way to await a
    /// record made without a completion.
    ///
    /// Returns [`Notification::Pending`] when `completion` will be called,
    /// and [`Notification::Settled`] with the record's outcome when there is
    /// nothing to wait for (the record has already completed or failed, or
    /// the event was never recorded); `completion` is dropped uncalled then.
    ///
    /// # Errors
    /// The runtime's error; `completion` is dropped uncalled then.
    fn notify(&self, completion: Completion) -> Result<Notification>;

    /// Blocks until the latest record (as of this call) has completed
    /// (`flex_event_synchronize`); returns at once for an event never
    /// recorded.
    ///
    /// # Errors
    /// The record's error if it failed (as for [`Event::query`]);
    /// [`Status::UNSUPPORTED`](crate::Status::UNSUPPORTED) when called from a
    /// completion or host callback of the same runtime (a backend may
    /// refuse only when it would have to wait: an event already complete
    /// needs no waiting).
    fn synchronize(&self) -> Result<()>;

    /// Device time from this event's completion to `end`'s, in nanoseconds;
    /// negative when `end` completed first (`flex_event_elapsed_time`).
    ///
    /// # Errors
    /// [`Status::INVALID_ARGUMENT`](crate::Status::INVALID_ARGUMENT) when an
    /// event was created without timing, was never recorded, or the two
    /// belong to different runtimes or backends;
    /// [`Status::NOT_READY`](crate::Status::NOT_READY) when one has not
    /// completed; [`Status::INVALID_HANDLE`](crate::Status::INVALID_HANDLE)
    /// when either event's runtime was closed (which destroyed it);
    /// [`Status::UNSUPPORTED`](crate::Status::UNSUPPORTED) when the runtime
    /// cannot time events (`Capabilities::event_timing` false); a record's
    /// error. The message names the event and the precondition.
    fn elapsed_nanos(&self, end: &dyn Event) -> Result<i64>;

    /// The event as `Any`, so a backend can recognise its own events.
    fn as_any(&self) -> &dyn Any;
}

//! When memory that streams used may be handed out again: the fences of a
//! block freed in other streams' order, what a wait for streams found, and
//! the queries of a stream's state that the allocator trusts (see the
//! module docs of [`super`], "Failed streams").

use std::collections::BTreeSet;

use flex_rt::{FlexError, Status};

use crate::error::Error;
use crate::marker::RuntimeEvent;
use crate::stream::SpyreStream;

/// What must happen before a block freed by a buffer that other streams
/// used is cached again: one per such stream.
pub(super) enum Fence {
    /// A marker event recorded on `stream` when the buffer was dropped; it
    /// goes back to the idle markers with the fence.
    Event {
        event: RuntimeEvent,
        stream: SpyreStream,
    },
    /// No event could be made: the stream must be idle.
    Idle(SpyreStream),
}

impl Fence {
    /// Whether the stream has passed the point of the drop: the event has
    /// completed, or, for a stream without an event (no marker event, or
    /// the record was refused because the stream had already failed), the
    /// stream is idle ([`has_finished_now`]). An event whose record failed
    /// has not: flex.h does not say that the work begun before the failure
    /// has ended (a card may overlap a stream's operations), and neither
    /// does a query that itself failed. Those fences, and those of a stream
    /// that failed or needs shutdown, are passed by a synchronize that saw
    /// the stream's work end (`empty_cache`, or the retry of a full device:
    /// [`Waited`]).
    pub(super) fn passed(&self) -> bool {
        match self {
            Fence::Event { event, .. } => matches!(event.query(), Ok(true)),
            Fence::Idle(stream) => has_finished_now(*stream),
        }
    }
}

/// What a synchronize of streams found (`empty_cache`, the waiting step of
/// a full device's retry): the streams whose work enqueued before it has
/// ended.
#[derive(Default)]
pub(super) struct Waited {
    /// Streams a synchronize found failed: everything they ran has ended,
    /// and they take no more work.
    pub(super) failed: BTreeSet<i64>,
    /// Streams a synchronize waited for: work enqueued on them before the
    /// free count reached [`Waited::frees_before`] has ended, whatever the
    /// stream was given since.
    pub(super) synchronized: BTreeSet<i64>,
    /// The allocator's free count (`MemoryStats::frees`, which only grows)
    /// before the wait began.
    pub(super) frees_before: u64,
}

impl Waited {
    /// Whether the work of stream `id` enqueued before the free count
    /// reached `freed` has ended, as far as the wait found.
    pub(super) fn has_ended(&self, id: i64, freed: u64) -> bool {
        self.failed.contains(&id) || freed <= self.frees_before && self.synchronized.contains(&id)
    }
}

/// Whether a synchronize of `stream` returned the stream's own failure
/// (see [`is_stream_failure`]): everything enqueued before the call has
/// ended, and the stream takes no more work.
pub(super) fn synchronize_finds_failed(stream: SpyreStream) -> bool {
    matches!(stream.synchronize(), Err(Error::Flex(error)) if is_stream_failure(&error))
}

/// Whether `stream` has no work left that could touch its memory, now,
/// without waiting: whether it is idle. A stream that has failed is not:
/// flex.h does not say that the work begun before a failure has ended when
/// a query reports it (a card that overlaps a stream's operations may still
/// run one), nor does a stream that needs shutdown (reported at once, while
/// the operation it was running goes on). Only a synchronize, which waits
/// for that work, tells ([`synchronize_finds_failed`]). `false` too while
/// it has work, when the query failed as a call, or when the stream cannot
/// be reached.
pub(super) fn has_finished_now(stream: SpyreStream) -> bool {
    matches!(stream.query(), Ok(true))
}

/// Whether `stream` has no work left that could touch its memory, waiting
/// only for the work a failed stream began before its failure: it is idle
/// now ([`has_finished_now`]), or its query reports its failure (not a
/// shutdown, whose running operation may go on for long) and a synchronize
/// made after that returns the failure too ([`synchronize_finds_failed`]):
/// the stream took no work after the query, and the synchronize waited for
/// the rest. Call holding no lock of the allocator. From a host callback of
/// the device the synchronize is refused, and a failed stream counts as
/// busy.
pub(super) fn has_finished_or_failed(stream: SpyreStream) -> bool {
    match stream.query() {
        Ok(idle) => idle,
        Err(Error::Flex(error)) => {
            is_stream_failure(&error)
                && error.status() != Status::SHUTDOWN
                && synchronize_finds_failed(stream)
        }
        Err(_) => false,
    }
}

/// Whether `error`, from a query or synchronize of a stream, is the
/// stream's own failure (after which it takes no more work; only a
/// synchronize that returns it says that the work enqueued before the call
/// has ended): an operation's failure
/// (`EXECUTION_FAILED`, `HOST_CALLBACK_FAILED`, `OUT_OF_MEMORY`), a wait on
/// a failed event (`STREAM_FAILED`), a stream that needs shutdown
/// (`SHUTDOWN`). Anything else is the call failing (an invalid handle, an
/// unsupported call, an internal error, a status flex.h does not define)
/// and says nothing of where the stream is: memory it may still use is not
/// handed out again on its word. (So a stream whose operation failed with
/// `INTERNAL`, the software device's own fault, keeps its cached memory:
/// the two cannot be told apart.)
pub(super) fn is_stream_failure(error: &FlexError) -> bool {
    [
        Status::EXECUTION_FAILED,
        Status::HOST_CALLBACK_FAILED,
        Status::OUT_OF_MEMORY,
        Status::STREAM_FAILED,
        Status::SHUTDOWN,
    ]
    .contains(&error.status())
}

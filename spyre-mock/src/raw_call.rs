//! Host functions and completions given as a plain function and three
//! words of context, carried to the engine thread without a heap
//! allocation: how a C boundary passes a foreign function pointer, its user
//! data and its own bookkeeping to the device (see
//! [`crate::MockStream::enqueue_raw`]).
//!
//! A boxed closure ([`crate::HostFn`], [`flex_rt::Completion`]) costs an
//! allocation on the launching thread and a free on the engine thread;
//! under glibc, once the engine's thread cache for that size is full
//! (seven blocks), its frees go back to the launching thread's arena under
//! the arena's lock, which the launching thread's next allocation takes
//! too. These types hold the same call in four words, inside the
//! operation.

use std::fmt;

use flex_rt::{Completion, Result};

/// The context a [`RawHostFn`] or [`RawCompletion`] passes back to its
/// function: three machine words, opaque to the device, which neither reads
/// nor changes them.
pub type RawContext = [usize; 3];

/// A host function run in stream order, as [`crate::Op::raw_host_fn`]:
/// `run(context)` on an engine thread. `Err(message)` fails the operation
/// (and the stream) with [`flex_rt::Status::HOST_CALLBACK_FAILED`] and the
/// message, as a [`crate::HostFn`]'s does; a panic inside is caught and does
/// the same.
///
/// Not `Clone`: the device calls `run` at most once, with the `context` it
/// was built with, and drops the value without calling it when the
/// operation does not run (its stream failed first). `run` may rely on
/// that, and on being reachable only through the values its own crate
/// builds, to treat the words as what it packed into them.
pub struct RawHostFn {
    run: fn(RawContext) -> std::result::Result<(), String>,
    context: RawContext,
}

impl RawHostFn {
    /// A host function that calls `run(context)`.
    pub fn new(
        run: fn(RawContext) -> std::result::Result<(), String>,
        context: RawContext,
    ) -> Self {
        Self { run, context }
    }

    /// Calls `run(context)`, consuming the value.
    pub(crate) fn call(self) -> std::result::Result<(), String> {
        (self.run)(self.context)
    }
}

impl fmt::Debug for RawHostFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RawHostFn")
    }
}

/// A completion called once its operation has finished, as
/// [`crate::MockStream::enqueue_raw`] takes it: `run(context, result)` on an
/// engine thread, with the rules of a boxed [`Completion`] (called exactly
/// once for an accepted launch, never inside the launch call; dropped
/// uncalled when the launch is refused; a panic inside fails the stream).
///
/// Not `Clone`, for the same reason as [`RawHostFn`].
pub struct RawCompletion {
    run: fn(RawContext, Result<()>),
    context: RawContext,
}

impl RawCompletion {
    /// A completion that calls `run(context, result)`.
    pub fn new(run: fn(RawContext, Result<()>), context: RawContext) -> Self {
        Self { run, context }
    }
}

impl fmt::Debug for RawCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RawCompletion")
    }
}

/// The completion of an enqueued operation: a boxed closure (every
/// [`flex_rt::Stream`] launch, [`crate::MockStream::enqueue`]) or a raw one
/// ([`crate::MockStream::enqueue_raw`]).
pub(crate) enum OpCompletion {
    Boxed(Completion),
    Raw(RawCompletion),
}

impl OpCompletion {
    /// Calls the completion with `result`, consuming it.
    pub(crate) fn call(self, result: Result<()>) {
        match self {
            Self::Boxed(completion) => completion(result),
            Self::Raw(RawCompletion { run, context }) => run(context, result),
        }
    }
}

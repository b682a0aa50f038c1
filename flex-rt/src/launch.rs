//! What every launch carries: the pipeline-barrier flag and the completion.

use std::fmt;

use crate::error::FlexError;

/// Called exactly once when an enqueued operation has finished (`Ok`) or
/// failed (`Err` with the operation's error). Runs on a runtime thread; the
/// stream does not advance while it runs, so keep it short, and never
/// synchronize a stream of the same runtime inside it. A panic inside it
/// never unwinds into a device backend's runtime (the no-op test double
/// runs it on the launching thread and lets a panic unwind into the
/// launch: [`crate::noop`]): it is caught, and the completion of a
/// launch that panics after its operation succeeded fails the stream with
/// [`crate::Status::HOST_CALLBACK_FAILED`] naming the panic (through a
/// flex library, on flex-rt's side: see the hardware backend's stream); a
/// panic in an event's notification ([`crate::Event::notify`]) is logged
/// and fails nothing.
pub type Completion = Box<dyn FnOnce(Result<(), FlexError>) + Send + 'static>;

/// A host function run in stream order by `launch_host_callback`: it starts
/// after every earlier operation on the stream has completed, and the stream
/// does not advance until it returns. A panic inside it is caught and fails
/// the operation (and the stream) with
/// [`crate::Status::HOST_CALLBACK_FAILED`]; it never unwinds into a device
/// backend's runtime (the no-op test double differs: [`crate::noop`]).
pub type HostCallback = Box<dyn FnOnce() + Send + 'static>;

/// Options of one launch (flex.h: `pipeline_barrier` and `completion`).
///
/// ```
/// # use flex_rt::LaunchOptions;
/// let options = LaunchOptions::new()
///     .pipeline_barrier(true)
///     .on_complete(|result| assert!(result.is_ok()));
/// ```
#[derive(Default)]
pub struct LaunchOptions {
    /// Start only after every earlier operation on the stream has completed,
    /// with no overlap of pipeline stages.
    pub pipeline_barrier: bool,
    /// Called exactly once when the operation finishes or fails. Never called
    /// when the launch itself returns an error: the closure is dropped then.
    pub completion: Option<Completion>,
}

impl LaunchOptions {
    /// No barrier, no completion.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the pipeline-barrier flag.
    pub fn pipeline_barrier(mut self, barrier: bool) -> Self {
        self.pipeline_barrier = barrier;
        self
    }

    /// Sets the completion callback.
    pub fn on_complete(mut self, f: impl FnOnce(Result<(), FlexError>) + Send + 'static) -> Self {
        self.completion = Some(Box::new(f));
        self
    }
}

impl fmt::Debug for LaunchOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchOptions")
            .field("pipeline_barrier", &self.pipeline_barrier)
            .field("completion", &self.completion.is_some())
            .finish()
    }
}

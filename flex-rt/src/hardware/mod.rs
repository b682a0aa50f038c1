//! The hardware backend: [`Backend`](crate::Backend),
//! [`Runtime`](crate::Runtime) and [`Stream`](crate::Stream) over a flex
//! runtime library loaded at run time by flex-sys (the vendor's on a Spyre
//! host, or the software device's `libspyre_mock_capi.so`). One name across
//! the layers: cargo feature `hardware` of spyre-stream, this module, and the
//! types `HardwareBackend`, `HardwareRuntime`, `HardwareStream`.
//!
//! - [`HardwareBackend`] wraps an `Arc<FlexLibrary>`: it counts devices and
//!   creates runtimes.
//! - [`HardwareRuntime`] is one `flex_runtime_t` (torch-spyre's
//!   `flex::RuntimeContext`). It owns the default stream and every stream it
//!   creates, and hands out borrows of them, as the stream-ownership spec
//!   says: nothing above flex-rt ever destroys a stream, and a stream cannot
//!   outlive its context (the borrow checker refuses it).
//! - [`HardwareStream`] is one `flex_stream_t` (`flex::RuntimeStream`).
//! - [`HardwareEvent`] is one `flex_event_t` (flex.h ABI 1.1). With a 1.0
//!   library, events and capabilities fail with
//!   [`Status::UNSUPPORTED`](crate::Status::UNSUPPORTED): "unsupported by
//!   this flex library (ABI 1.0)", naming the missing function.
//!
//! # How calls cross the ABI
//!
//! Every flex function returns a status. One helper turns it into a
//! `Result`: on anything but `FLEX_SUCCESS` it reads the thread-local
//! last-error message at once, on the same thread, and builds a
//! [`FlexError`](crate::FlexError) naming the flex function, the status (a
//! code that `flex.h` does not define is an error like any other, displayed
//! with its value) and the message. A success that hands back a null handle
//! is an error too.
//!
//! # Launches and completions
//!
//! A launch moves everything the operation needs after the call returns —
//! the caller's [`Completion`](crate::Completion), the lease on a
//! [`HostBuffer`](crate::HostBuffer), the [`HostCallback`](crate::HostCallback)
//! — into one heap block, passes its address as the completion's
//! `user_data` with an `extern "C"` trampoline as the completion function
//! (always, even when the caller asked for no completion, so that the lease
//! is released), and gives up ownership only if the launch returns
//! `FLEX_SUCCESS`. `flex.h` promises that the completion is then called
//! exactly once; the trampoline moves the payload out, releases the lease,
//! and runs the caller's completion under `catch_unwind`. A launch that
//! returns anything else enqueued nothing and never calls its completion
//! (`flex.h`), so flex-rt moves the payload out itself and drops it,
//! without calling the completion. Either way the payload is taken out
//! exactly once. The block of a launch on a stream goes back to that
//! stream, whose next launches reuse it, so flex-rt itself allocates
//! nothing on the launching thread for a runtime thread to free, which
//! under glibc makes both meet at the allocator's lock on every launch
//! (an event notification's block, on no stream, is freed; a caller's
//! completion or host callback that captures anything is the caller's
//! own box). No Rust panic ever unwinds into the library.
//!
//! # Callbacks and the runtime's own thread
//!
//! `flex.h` forbids `flex_stream_synchronize` and `flex_runtime_destroy` from
//! a completion or host function of the same runtime (it would wait for
//! itself). The trampolines record which runtime's callback the current
//! thread is running; [`Stream::synchronize`](crate::Stream::synchronize)
//! then fails with [`Status::UNSUPPORTED`](crate::Status::UNSUPPORTED), and
//! dropping or closing the runtime there leaks it instead of deadlocking.
#![allow(unsafe_code)]

mod backend;
mod call;
mod callback;
mod event;
mod handle;
mod payload_cache;
mod runtime;
mod stream;

pub use backend::HardwareBackend;
pub use event::HardwareEvent;
pub use runtime::{CloseError, HardwareRuntime, TeardownError, TeardownStep};
pub use stream::HardwareStream;

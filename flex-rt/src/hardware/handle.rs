//! The opaque `flex.h` handles as non-null, thread-safe newtypes.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use flex_sys::bindings as sys;
use flex_sys::fork::ForkGeneration;

use crate::error::{FlexError, Result};
use crate::status::Status;

/// A `flex_runtime_t *` that a successful `flex_runtime_create` returned,
/// the fork generation of the process that created it, and a serial
/// number of its own.
///
/// Only a pointer: the owner ([`super::HardwareRuntime`]) decides when it is
/// destroyed. Copying it does not copy the runtime. Two handles are equal
/// only if they are copies of one: a runtime created after another was
/// destroyed may be given its address, and is still another runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RuntimeHandle {
    ptr: NonNull<sys::flex_runtime_t>,
    fork: ForkGeneration,
    /// Unique in the process: see [`RuntimeHandle::key`].
    serial: usize,
}

/// The serial number of the next runtime handle (0 is never one).
static NEXT_SERIAL: AtomicUsize = AtomicUsize::new(1);

/// A `flex_stream_t *` that `flex_runtime_get_default_stream` or
/// `flex_runtime_create_stream` returned. Only a pointer, as above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StreamHandle(NonNull<sys::flex_stream_t>);

// SAFETY: the handles are opaque tokens that Rust never dereferences; they
// are only passed back to the library. `flex.h`: "Every function may be
// called from any thread, at the same time as any other function, unless its
// documentation says otherwise. Handles are not tied to the thread that
// created them." So moving a handle to another thread and using it there is
// allowed. The functions that do restrict concurrency are handled by the
// owners: launches on one stream are serialized by that stream's mutex
// (`HardwareStream`), and `flex_runtime_destroy` / `flex_stream_destroy` run
// only from `HardwareRuntime`'s teardown, which has exclusive access.
unsafe impl Send for RuntimeHandle {}
// SAFETY: as for `Send`: sharing `&RuntimeHandle` only shares the pointer
// value, and `flex.h` allows concurrent calls with the same handle.
unsafe impl Sync for RuntimeHandle {}
// SAFETY: as for `RuntimeHandle`.
unsafe impl Send for StreamHandle {}
// SAFETY: as for `RuntimeHandle`.
unsafe impl Sync for StreamHandle {}

impl RuntimeHandle {
    /// Wraps a non-null runtime pointer that a process of generation
    /// `fork` created (read after `flex_sys::fork::watch_forks`).
    pub(super) fn new(ptr: NonNull<sys::flex_runtime_t>, fork: ForkGeneration) -> Self {
        Self {
            ptr,
            fork,
            serial: NEXT_SERIAL.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The pointer to pass to the library.
    pub(super) fn as_ptr(self) -> *mut sys::flex_runtime_t {
        self.ptr.as_ptr()
    }

    /// A non-zero number that identifies this runtime in the process, never
    /// given to another (not its address, which a later runtime may be
    /// given), used to recognise the runtime's own callbacks.
    pub(super) fn key(self) -> usize {
        self.serial
    }

    /// Whether this is the process that created the runtime: `false` in a
    /// child forked since, where flex.h fails every call on it with
    /// `FLEX_ERROR_RUNTIME_FAILED` and leaves it to the child's exit. One
    /// relaxed atomic load.
    #[inline]
    pub(super) fn in_creating_process(self) -> bool {
        self.fork.is_current()
    }

    /// `Ok` in the process that created the runtime; in a forked child,
    /// [`Status::RUNTIME_FAILED`] naming fork, as the library's own answer
    /// would be. Checked before any lock of flex-rt's is taken for the
    /// runtime, its streams or its events: in the child such a lock may be
    /// held for ever by a parent thread the child does not have.
    #[inline]
    pub(super) fn check_not_forked(self, call: &'static str) -> Result<()> {
        if self.in_creating_process() {
            Ok(())
        } else {
            Err(forked(call))
        }
    }
}

/// The error of a call on a runtime of the parent in a forked child.
#[cold]
fn forked(call: &'static str) -> FlexError {
    FlexError::new(
        Status::RUNTIME_FAILED,
        call,
        "this runtime was created by the parent process before fork(); a forked child cannot \
         use it, its streams or its events, and leaves them to its exit: create a runtime in \
         the child",
    )
}

impl StreamHandle {
    /// Wraps a non-null stream pointer.
    pub(super) fn new(ptr: NonNull<sys::flex_stream_t>) -> Self {
        Self(ptr)
    }

    /// The pointer to pass to the library.
    pub(super) fn as_ptr(self) -> *mut sys::flex_stream_t {
        self.0.as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_at_another_ones_address_is_another_runtime() {
        let ptr = NonNull::<sys::flex_runtime_t>::dangling();
        let fork = ForkGeneration::current();
        let (first, second) = (RuntimeHandle::new(ptr, fork), RuntimeHandle::new(ptr, fork));
        assert_eq!(first, first, "a copy is the same runtime");
        assert_ne!(first, second);
        assert_ne!(first.key(), second.key());
        assert_ne!(first.key(), 0);
        assert_eq!(first.as_ptr(), second.as_ptr());
    }
}

//! The opaque `flex.h` handles as non-null, thread-safe newtypes.

use std::ptr::NonNull;

use flex_sys::bindings as sys;

/// A `flex_runtime_t *` that a successful `flex_runtime_create` returned.
///
/// Only a pointer: the owner ([`super::HardwareRuntime`]) decides when it is
/// destroyed. Copying it does not copy the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RuntimeHandle(NonNull<sys::flex_runtime_t>);

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
    /// Wraps a non-null runtime pointer.
    pub(super) fn new(ptr: NonNull<sys::flex_runtime_t>) -> Self {
        Self(ptr)
    }

    /// The pointer to pass to the library.
    pub(super) fn as_ptr(self) -> *mut sys::flex_runtime_t {
        self.0.as_ptr()
    }

    /// A non-zero number that identifies this runtime while it exists (its
    /// address), used to recognise the runtime's own callbacks.
    pub(super) fn key(self) -> usize {
        self.0.as_ptr() as usize
    }
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

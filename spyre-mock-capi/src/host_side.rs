//! What a launch carries across threads: raw host memory as the device's
//! [`HostSource`] / [`HostSink`], and the caller's C completion and host
//! function, called on runtime threads.

use std::cell::Cell;
use std::ffi::c_void;

use flex_sys::bindings::{FLEX_SUCCESS, flex_completion_t, flex_status_t};

use crate::boundary::status_name;
use spyre_mock::{HostSink, HostSource, RawCompletion, RawContext, RawHostFn};

/// Host memory an H2D copy reads: `len` bytes at `ptr`, as passed to
/// `flex_launch_h2d`.
pub(super) struct RawSource {
    ptr: *const u8,
    len: usize,
}

impl RawSource {
    /// Wraps the caller's source.
    ///
    /// # Safety
    /// `ptr` is non-null and points to `len` bytes (`len <= isize::MAX`) that
    /// stay valid and unchanged (by the host and by other operations in
    /// flight, such as a D2H into overlapping bytes) until the operation's
    /// completion is called (or, without a completion, until the operation
    /// has completed) — flex.h's promise for `host_src`.
    pub(super) unsafe fn new(ptr: *const c_void, len: usize) -> Self {
        Self {
            ptr: ptr.cast(),
            len,
        }
    }
}

// SAFETY: the bytes are only read, and flex.h makes them the runtime's to
// read from any of its threads until the completion: the caller keeps them
// valid and unchanged that long (see `RawSource::new`). The pointer itself
// is plain data.
unsafe impl Send for RawSource {}

impl HostSource for RawSource {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `RawSource::new`'s contract: `ptr` is non-null and valid
        // for reads of `len` bytes, unchanged, for as long as the operation
        // owns this value (it drops it before calling the completion).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Host memory a D2H copy writes: `len` bytes at `ptr`, as passed to
/// `flex_launch_d2h`.
pub(super) struct RawSink {
    ptr: *mut u8,
    len: usize,
}

impl RawSink {
    /// Wraps the caller's destination.
    ///
    /// # Safety
    /// `ptr` is non-null and points to `len` writable bytes
    /// (`len <= isize::MAX`) that stay valid, and that neither the host nor
    /// another operation in flight (a D2H into overlapping bytes on any
    /// stream, an H2D from them) reads or writes, until the operation's
    /// completion is called (or, without a completion, until the operation
    /// has completed) — flex.h's promise for `host_dst`.
    pub(super) unsafe fn new(ptr: *mut c_void, len: usize) -> Self {
        Self {
            ptr: ptr.cast(),
            len,
        }
    }
}

// SAFETY: flex.h gives the runtime exclusive use of the bytes, from any of
// its threads, until the completion (see `RawSink::new`); the pointer itself
// is plain data.
unsafe impl Send for RawSink {}

impl HostSink for RawSink {
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `RawSink::new`'s contract: `ptr` is non-null and valid for
        // writes of `len` bytes, and nothing else touches them while the
        // operation owns this value. `&mut self` makes the slice unique on
        // the Rust side.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn len(&self) -> usize {
        self.len
    }
}

thread_local! {
    /// The key of the runtime whose C completion or host function this
    /// thread is running, or 0.
    static IN_CALLBACK_OF: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is running a C completion or host function of the
/// runtime with `key` (flex.h forbids synchronizing or destroying it there).
pub(super) fn in_callback_of(key: usize) -> bool {
    IN_CALLBACK_OF.try_with(Cell::get).unwrap_or(0) == key
}

/// Marks the thread as running a callback of runtime `key` while alive.
struct CallbackScope {
    previous: usize,
}

impl CallbackScope {
    fn enter(key: usize) -> Self {
        let previous = IN_CALLBACK_OF.try_with(|c| c.replace(key)).unwrap_or(0);
        Self { previous }
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        let _ = IN_CALLBACK_OF.try_with(|c| c.set(self.previous));
    }
}

/// The device context of a C function, its user data and the key of its
/// runtime: the two pointers as addresses, their provenance exposed so that
/// [`unpack`] may turn them back into pointers. As integers the words are
/// `Send`; sending them to an engine thread is right for the reason given
/// on `CCompletion`'s and `CHostFn`'s `Send` (flex.h runs both on a runtime
/// thread).
fn pack(func: *const (), user_data: *mut c_void, runtime: usize) -> RawContext {
    [
        func.expose_provenance(),
        user_data.expose_provenance(),
        runtime,
    ]
}

/// What [`pack`] packed: the function's address, the user data and the
/// runtime key.
fn unpack([func, user_data, runtime]: RawContext) -> (*const (), *mut c_void, usize) {
    (
        std::ptr::with_exposed_provenance(func),
        std::ptr::with_exposed_provenance_mut(user_data),
        runtime,
    )
}

/// The status a completion is called with.
pub(crate) fn status_of(result: &flex_rt::Result<()>) -> flex_status_t {
    match result {
        Ok(()) => FLEX_SUCCESS,
        Err(err) => err.status().0,
    }
}

/// The caller's completion of one launch. Not `Clone`: [`CCompletion::call`]
/// consumes it, so it is called at most once; dropping it uncalled (a
/// refused launch) leaves `user_data` with the caller.
pub(super) struct CCompletion {
    func: unsafe extern "C" fn(*mut c_void, flex_status_t),
    user_data: *mut c_void,
    runtime: usize,
}

// SAFETY: flex.h: the runtime calls the completion "on a thread the runtime
// owns", so the caller has agreed that `fn` runs on another thread with
// `user_data`. This library never reads `user_data`; it only carries the
// pointer value to that thread and passes it back unchanged.
unsafe impl Send for CCompletion {}

impl CCompletion {
    /// The completion of a launch, or `None` when its `fn` is NULL.
    /// `runtime` is the key of the stream's runtime.
    pub(super) fn new(completion: flex_completion_t, runtime: usize) -> Option<Self> {
        completion.fn_.map(|func| Self {
            func,
            user_data: completion.user_data,
            runtime,
        })
    }

    /// The same completion as the device's [`RawCompletion`], which calls
    /// it with the status of the operation's result: no allocation.
    pub(super) fn into_raw(self) -> RawCompletion {
        let context = pack(self.func as *const (), self.user_data, self.runtime);
        RawCompletion::new(Self::call_raw, context)
    }

    /// The function of [`CCompletion::into_raw`]'s completion; reachable
    /// only through the values `into_raw` builds, so `context` is what it
    /// packed (the device passes it back unchanged, once).
    fn call_raw(context: RawContext, result: flex_rt::Result<()>) {
        let (func, user_data, runtime) = unpack(context);
        // SAFETY: `func` is the address `into_raw` took of a completion
        // function of this very type; a pointer to a function transmutes
        // back to the function pointer.
        let func = unsafe {
            std::mem::transmute::<*const (), unsafe extern "C" fn(*mut c_void, flex_status_t)>(func)
        };
        let completion = Self {
            func,
            user_data,
            runtime,
        };
        completion.call(status_of(&result));
    }

    /// Calls `fn(user_data, status)`, marking this thread as inside a
    /// callback of the runtime meanwhile.
    pub(super) fn call(self, status: flex_status_t) {
        let _scope = CallbackScope::enter(self.runtime);
        // SAFETY: `func` and `user_data` are what the caller passed to a
        // launch that returned FLEX_SUCCESS; flex.h has the runtime call them
        // exactly once, which this is: `self` is consumed, and the value
        // comes either from the launch itself or, through `call_raw`, from
        // the words of a `RawCompletion`, which is not `Clone` and which the
        // device consumes by calling it once. flex.h requires the callee to
        // return normally (no C++ exception, longjmp or thread exit through
        // this frame); a Rust callee that panics aborts at its own
        // `extern "C"` boundary.
        unsafe { (self.func)(self.user_data, status) }
    }
}

/// The caller's host function of `flex_launch_host_callback`.
pub(super) struct CHostFn {
    func: unsafe extern "C" fn(*mut c_void) -> flex_status_t,
    user_data: *mut c_void,
    runtime: usize,
}

// SAFETY: as for `CCompletion`: flex.h runs the host function "on a runtime
// thread", and `host_user_data` is only passed back unchanged.
unsafe impl Send for CHostFn {}

impl CHostFn {
    /// Wraps a non-null host function of runtime `runtime`.
    pub(super) fn new(
        func: unsafe extern "C" fn(*mut c_void) -> flex_status_t,
        user_data: *mut c_void,
        runtime: usize,
    ) -> Self {
        Self {
            func,
            user_data,
            runtime,
        }
    }

    /// The same host function as the device's [`RawHostFn`]: no
    /// allocation.
    pub(super) fn into_raw(self) -> RawHostFn {
        let context = pack(self.func as *const (), self.user_data, self.runtime);
        RawHostFn::new(Self::call_raw, context)
    }

    /// The function of [`CHostFn::into_raw`]'s host function; reachable
    /// only through the values `into_raw` builds, so `context` is what it
    /// packed (the device passes it back unchanged, at most once).
    fn call_raw(context: RawContext) -> Result<(), String> {
        let (func, user_data, runtime) = unpack(context);
        // SAFETY: `func` is the address `into_raw` took of a host function
        // of this very type; a pointer to a function transmutes back to the
        // function pointer.
        let func = unsafe {
            std::mem::transmute::<*const (), unsafe extern "C" fn(*mut c_void) -> flex_status_t>(
                func,
            )
        };
        let host = Self {
            func,
            user_data,
            runtime,
        };
        host.call()
    }

    /// Calls `host_fn(host_user_data)`: `Ok` for `FLEX_SUCCESS`, otherwise
    /// the status named, which fails the operation with
    /// `FLEX_ERROR_HOST_CALLBACK_FAILED`.
    pub(super) fn call(self) -> Result<(), String> {
        let _scope = CallbackScope::enter(self.runtime);
        // SAFETY: the function and data the caller passed to a launch that
        // returned FLEX_SUCCESS; the device runs a host operation at most
        // once (`self` is consumed, and `call_raw` rebuilds it from the words
        // of a `RawHostFn`, which is not `Clone` and which the device
        // consumes by calling it), before its completion, while
        // `host_user_data` is still valid (flex.h: until the completion).
        // flex.h requires it to return normally, as a completion.
        let status = unsafe { (self.func)(self.user_data) };
        if status == FLEX_SUCCESS {
            Ok(())
        } else {
            Err(format!(
                "the host function returned {} ({status})",
                status_name(status).to_string_lossy()
            ))
        }
    }
}

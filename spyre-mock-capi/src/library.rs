//! The library as a whole: its ABI version, status names, the thread's
//! last error, and the device count.

use std::ffi::c_char;

use flex_sys::bindings::{FLEX_SUCCESS, flex_status_t};

use crate::args::out_param;
use crate::boundary::{Failure, boundary, last_error_ptr, status_name};
use crate::environment::{self, env_config, env_switches};
use crate::handles::{self};
use crate::rcu;

/// Runs when the library is loaded (`dlopen`, or the start of a program
/// linking it), before any of its functions can be called: the one-time
/// set-up that a call would otherwise do first, under a lock or a
/// once-only cell that a `fork()` by another thread could leave held in
/// the child for ever (the child's first call would then block): the
/// handle table's membarrier registration, fork handler, and the key that
/// gives a thread's read-section slot back at its exit, made again by the
/// next slot taken if it failed here ([`rcu::prepare`]); the watch for
/// `fork()` that marks a parent's runtimes as the parent's
/// (`flex_sys::fork::watch_forks`); and the handlers that keep the
/// library's locks usable across it
/// ([`handles::keep_locks_across_fork`]). Each fork registration that
/// fails here (`ENOMEM`) is tried again, and reported, by
/// `flex_runtime_create`.
#[ctor::ctor(unsafe)]
fn at_load() {
    rcu::prepare();
    let _ = flex_sys::fork::watch_forks();
    let _ = handles::keep_locks_across_fork();
}

/// `flex_get_api_version`: the header's version packed as
/// `FLEX_MAKE_API_VERSION`, or `SPYRE_MOCK_ABI_VERSION` when set (see the
/// [module docs](crate#environment)); the header's version when that is
/// malformed (`flex_get_device_count` and `flex_runtime_create` then
/// refuse, naming the value). Never
/// fails (were reading the environment to panic, it would report `0.0`,
/// which loaders refuse).
///
/// # Safety
/// None: it takes no arguments and may be called at any time from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_get_api_version() -> u32 {
    std::panic::catch_unwind(|| {
        environment::abi_version(flex_rt::env::var_or_empty)
            .unwrap_or_else(|_| environment::header_version())
    })
    .unwrap_or(0)
}

/// `flex_status_string`: the flex.h name of `status`, or
/// `"FLEX_UNKNOWN_STATUS"`. A static string; never NULL.
///
/// # Safety
/// None: any value may be passed, from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_status_string(status: flex_status_t) -> *const c_char {
    status_name(status).as_ptr()
}

/// `flex_get_last_error_message`: the calling thread's last-error message,
/// `""` if no call has failed on this thread. Valid until the next flex call
/// on this thread; never NULL.
///
/// # Safety
/// None: it takes no arguments. The caller must copy the string before its
/// next flex call on the same thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_get_last_error_message() -> *const c_char {
    std::panic::catch_unwind(last_error_ptr).unwrap_or_else(|_| c"".as_ptr())
}

/// `flex_get_device_count`: the number of devices visible to the process:
/// those `SPYRE_DEVICES` lists, else all `SPYRE_MOCK_DEVICES` (default 1).
///
/// # Safety
/// `count` is NULL or valid for writing an `int32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_get_device_count(count: *mut i32) -> flex_status_t {
    const CALL: &str = "flex_get_device_count";
    boundary(CALL, || {
        handles::undefined_status_check(&env_switches()?, CALL)?;
        let out = out_param(count, "count")?;
        let devices = env_config()?.visible_count();
        let devices = i32::try_from(devices)
            .map_err(|_| Failure::internal(format!("{devices} devices do not fit int32_t")))?;
        // SAFETY: flex.h: `count` points to a writable `int32_t` when it is
        // not NULL; `out_param` checked non-null and alignment.
        unsafe { out.write(devices) };
        Ok(FLEX_SUCCESS)
    })
}

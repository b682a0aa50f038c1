//! A C caller's `pthread_cancel` of a thread inside an exported call.

use std::ffi::c_int;
use std::sync::mpsc;
use std::time::Duration;

use flex_sys::bindings::{FLEX_SUCCESS, flex_runtime_t};

use super::{NO_COMPLETION, Rt, host, sleepy};
use crate::*;

/// POSIX's `PTHREAD_CANCEL_DISABLE` (glibc and musl).
const PTHREAD_CANCEL_DISABLE: c_int = 1;

unsafe extern "C" {
    fn pthread_cancel(thread: libc::pthread_t) -> c_int;
    fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
}

/// A thread cancelled while `flex_runtime_destroy` waits for the runtime's
/// work (a host function that sleeps 300 ms, then the engines' join, a
/// cancellation point) finishes the call: the cancellation waits for its
/// return. Before, it unwound into the library's frames in the join and the
/// process aborted.
#[test]
#[cfg_attr(miri, ignore = "Miri does not model thread cancellation")]
fn a_thread_cancelled_inside_a_call_finishes_the_call() {
    let rt = Rt::new();
    let mut ms: u64 = 300;
    assert_eq!(
        host(
            rt.default_stream(),
            sleepy,
            (&raw mut ms).cast(),
            NO_COMPLETION
        ),
        FLEX_SUCCESS
    );
    // The destroying thread owns the runtime from here.
    let runtime = rt.0 as usize;
    std::mem::forget(rt);
    let (entered, is_inside) = mpsc::channel();
    let (finished, has_finished) = mpsc::channel();
    let destroyer = std::thread::spawn(move || {
        entered.send(()).unwrap();
        // SAFETY: a live runtime, destroyed once, by this thread alone.
        let status = unsafe { flex_runtime_destroy(runtime as *mut flex_runtime_t) };
        // The cancellation, held during the call, is pending now: hold it
        // again before anything that may be a cancellation point.
        let mut previous = 0;
        // SAFETY: a valid state and a live out value.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &raw mut previous) };
        finished.send(status).unwrap();
    });
    is_inside.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: the thread has not been joined, so its handle is live.
    let cancelled = unsafe {
        pthread_cancel(std::os::unix::thread::JoinHandleExt::as_pthread_t(
            &destroyer,
        ))
    };
    assert_eq!(cancelled, 0);
    assert_eq!(
        has_finished.recv_timeout(Duration::from_secs(30)),
        Ok(FLEX_SUCCESS)
    );
    destroyer.join().unwrap();
}

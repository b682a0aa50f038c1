//! The ABI 1.1 calls through the C boundary: handles, arguments, the
//! capability query, memory info and the event contract (its full conformance suite runs
//! through flex-rt in `tests/`; these run under Miri too).

use std::ffi::c_void;
use std::ptr;

use flex_sys::bindings::{
    FLEX_CAPABILITY_DEVICE_SIDE_WAIT, FLEX_CAPABILITY_EVENT_TIMING,
    FLEX_ERROR_HOST_CALLBACK_FAILED, FLEX_ERROR_INVALID_ARGUMENT, FLEX_ERROR_INVALID_HANDLE,
    FLEX_ERROR_STREAM_FAILED, FLEX_EVENT_TIMING, FLEX_NOT_READY, FLEX_SUCCESS, flex_event_t,
    flex_status_t,
};

use std::sync::atomic::{AtomicBool, Ordering};

use super::{NO_COMPLETION, Recorder, Rt, completion, host, returns_status, sleepy, sync};
use crate::boundary;
use crate::*;

fn create(rt: &Rt, flags: i32) -> *mut flex_event_t {
    let mut event = ptr::null_mut();
    // SAFETY: a live runtime and a valid out pointer.
    let status = unsafe { flex_event_create(rt.0, flags, &raw mut event) };
    assert_eq!(status, FLEX_SUCCESS, "{}", boundary::last_error());
    event
}

fn record(event: *mut flex_event_t, stream: *mut sys::flex_stream_t) -> flex_status_t {
    // SAFETY: any handle values are accepted; no completion.
    unsafe { flex_event_record(event, stream, NO_COMPLETION) }
}

fn wait(stream: *mut sys::flex_stream_t, event: *mut flex_event_t) -> flex_status_t {
    // SAFETY: any handle values are accepted.
    unsafe { flex_stream_wait_event(stream, event) }
}

fn query(event: *mut flex_event_t) -> flex_status_t {
    // SAFETY: any handle value is accepted.
    unsafe { flex_event_query(event) }
}

fn synchronize(event: *mut flex_event_t) -> flex_status_t {
    // SAFETY: any handle value is accepted.
    unsafe { flex_event_synchronize(event) }
}

use flex_sys::bindings as sys;

/// A host function that waits until the `AtomicBool` at `user_data` is set.
unsafe extern "C" fn waits_for_flag(user_data: *mut c_void) -> flex_status_t {
    // SAFETY: the tests pass an `AtomicBool` that outlives the operation.
    let flag = unsafe { &*user_data.cast::<AtomicBool>() };
    while !flag.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    FLEX_SUCCESS
}

/// Holds `stream` until the returned flag is set (keep the flag alive until
/// the stream is synchronized).
fn hold(stream: *mut sys::flex_stream_t, flag: &AtomicBool) {
    let data = ptr::from_ref(flag).cast_mut().cast();
    assert_eq!(
        host(stream, waits_for_flag, data, NO_COMPLETION),
        FLEX_SUCCESS
    );
}

#[test]
fn capabilities_and_bad_arguments() {
    let rt = Rt::new();
    let mut value = -1;
    for (capability, expected) in [
        (FLEX_CAPABILITY_DEVICE_SIDE_WAIT, 1),
        (FLEX_CAPABILITY_EVENT_TIMING, 1),
    ] {
        // SAFETY: a live runtime and a valid out pointer.
        let status = unsafe { flex_runtime_get_capability(rt.0, capability, &raw mut value) };
        assert_eq!((status, value), (FLEX_SUCCESS, expected));
    }
    // SAFETY: as above; the capability is unknown.
    let status = unsafe { flex_runtime_get_capability(rt.0, 7, &raw mut value) };
    assert_eq!(status, FLEX_ERROR_INVALID_ARGUMENT);
    assert!(boundary::last_error().contains("capability 7"));
    // SAFETY: a NULL out pointer is refused, not written.
    let status = unsafe { flex_runtime_get_capability(rt.0, 0, ptr::null_mut()) };
    assert_eq!(status, FLEX_ERROR_INVALID_ARGUMENT);
    let mut event = ptr::null_mut();
    // SAFETY: an unknown flag bit is refused; the out pointer is valid.
    let status = unsafe { flex_event_create(rt.0, 0x10, &raw mut event) };
    assert_eq!(status, FLEX_ERROR_INVALID_ARGUMENT);
    assert!(event.is_null(), "nothing written on failure");
    // SAFETY: a NULL runtime is refused.
    let status = unsafe { flex_event_create(ptr::null_mut(), 0, &raw mut event) };
    assert_eq!(status, FLEX_ERROR_INVALID_HANDLE);
    for status in [
        query(ptr::null_mut()),
        synchronize(ptr::null_mut()),
        record(ptr::null_mut(), rt.default_stream()),
        // SAFETY: a foreign address is looked up, never dereferenced.
        unsafe { flex_event_destroy(rt.0, ptr::dangling_mut()) },
    ] {
        assert_eq!(status, FLEX_ERROR_INVALID_HANDLE);
    }
}

#[test]
fn a_wait_holds_the_waiting_stream_until_the_record_completes() {
    let rt = Rt::new();
    let producer = rt.create_stream(0);
    let consumer = rt.create_stream(0);
    let event = create(&rt, FLEX_EVENT_TIMING);
    assert_eq!(query(event), FLEX_SUCCESS, "never recorded: complete");
    let held = AtomicBool::new(false);
    hold(producer, &held);
    let recorder = Recorder::default();
    // SAFETY: live handles; `recorder` outlives the runtime's completions
    // (the test synchronizes before it goes).
    let status = unsafe { flex_event_record(event, producer, completion(&recorder)) };
    assert_eq!(status, FLEX_SUCCESS);
    assert_eq!(query(event), FLEX_NOT_READY);
    assert_eq!(wait(consumer, event), FLEX_SUCCESS);
    let mut zero = 0u64;
    let zero_ptr: *mut c_void = (&raw mut zero).cast();
    assert_eq!(
        host(consumer, sleepy, zero_ptr, NO_COMPLETION),
        FLEX_SUCCESS
    );
    assert_eq!(super::query(consumer), FLEX_NOT_READY, "held by the gate");
    held.store(true, Ordering::Release);
    assert_eq!(sync(consumer), FLEX_SUCCESS);
    assert_eq!(
        query(event),
        FLEX_SUCCESS,
        "the consumer ran after the record"
    );
    assert_eq!(*recorder.statuses.lock(), [FLEX_SUCCESS]);
    let end = create(&rt, FLEX_EVENT_TIMING);
    assert_eq!(record(end, producer), FLEX_SUCCESS);
    assert_eq!(synchronize(end), FLEX_SUCCESS);
    let mut nanos = -1i64;
    // SAFETY: live events and a valid out pointer.
    let status = unsafe { flex_event_elapsed_time(event, end, &raw mut nanos) };
    assert_eq!(status, FLEX_SUCCESS, "{}", boundary::last_error());
    assert!(nanos >= 0, "{nanos}");
    // SAFETY: live handles; each destroyed once.
    unsafe {
        assert_eq!(flex_event_destroy(rt.0, event), FLEX_SUCCESS);
        assert_eq!(flex_event_destroy(rt.0, end), FLEX_SUCCESS);
        assert_eq!(flex_event_destroy(rt.0, end), FLEX_ERROR_INVALID_HANDLE);
    }
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
}

#[test]
fn a_failed_record_fails_its_waiter_and_events_die_with_their_runtime() {
    let rt = Rt::new();
    let failing = rt.create_stream(0);
    let waiter = rt.create_stream(0);
    let event = create(&rt, 0);
    // Held, so that the record is enqueued before the failure.
    let held = AtomicBool::new(false);
    hold(failing, &held);
    let mut status = 10i32; // FLEX_ERROR_HOST_CALLBACK_FAILED from the host function
    let status_ptr: *mut c_void = (&raw mut status).cast();
    assert_eq!(
        host(failing, returns_status, status_ptr, NO_COMPLETION),
        FLEX_SUCCESS
    );
    assert_eq!(
        record(event, failing),
        FLEX_SUCCESS,
        "{}",
        boundary::last_error()
    );
    assert_eq!(wait(waiter, event), FLEX_SUCCESS);
    held.store(true, Ordering::Release);
    assert_eq!(synchronize(event), FLEX_ERROR_STREAM_FAILED);
    // Once the failing stream has finished (its synchronize returns after
    // the streams waiting on it were looked at), the waiter has failed
    // with nothing launched on it, and refuses a launch.
    assert_eq!(sync(failing), FLEX_ERROR_HOST_CALLBACK_FAILED);
    assert_eq!(sync(waiter), FLEX_ERROR_STREAM_FAILED);
    let mut zero = 0u64;
    let zero_ptr: *mut c_void = (&raw mut zero).cast();
    assert_eq!(
        host(waiter, sleepy, zero_ptr, NO_COMPLETION),
        FLEX_ERROR_STREAM_FAILED
    );
    assert_eq!(sync(waiter), FLEX_ERROR_STREAM_FAILED);
    assert!(
        boundary::last_error().contains(&format!("event recorded on stream {}", {
            let mut id = 0u64;
            // SAFETY: a live stream and a valid out pointer.
            unsafe { flex_stream_get_id(failing, &raw mut id) };
            id
        })),
        "{}",
        boundary::last_error()
    );
    // Another runtime's stream cannot record or wait on it.
    let other = Rt::new();
    let foreign = other.default_stream();
    assert_eq!(record(event, foreign), FLEX_ERROR_INVALID_ARGUMENT);
    assert_eq!(wait(foreign, event), FLEX_ERROR_INVALID_ARGUMENT);
    // Destroying the runtime retires its events.
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
    assert_eq!(query(event), FLEX_ERROR_INVALID_HANDLE);
}

#[test]
fn notify_calls_back_once_or_says_there_is_nothing_to_wait_for() {
    let rt = Rt::new();
    let stream = rt.create_stream(0);
    let event = create(&rt, 0);
    let recorder = Recorder::default();
    let mut complete = -1;
    // SAFETY: a live event, a valid out pointer; `recorder` outlives the
    // runtime's completions (the test synchronizes before it goes).
    let status = unsafe { flex_event_notify(event, completion(&recorder), &raw mut complete) };
    assert_eq!((status, complete), (FLEX_SUCCESS, 1), "never recorded");
    let held = AtomicBool::new(false);
    hold(stream, &held);
    assert_eq!(record(event, stream), FLEX_SUCCESS);
    // SAFETY: as above.
    let status = unsafe { flex_event_notify(event, completion(&recorder), &raw mut complete) };
    assert_eq!((status, complete), (FLEX_SUCCESS, 0), "the record is held");
    // SAFETY: a NULL out pointer is refused before anything is registered.
    let status = unsafe { flex_event_notify(event, completion(&recorder), ptr::null_mut()) };
    assert_eq!(status, FLEX_ERROR_INVALID_ARGUMENT);
    held.store(true, Ordering::Release);
    assert_eq!(sync(stream), FLEX_SUCCESS);
    assert_eq!(*recorder.statuses.lock(), [FLEX_SUCCESS], "called once");
    assert_eq!(rt.destroy(), FLEX_SUCCESS);
}

#[test]
fn memory_info_counts_live_allocations() {
    let rt = Rt::new();
    let (mut free, mut total) = (0u64, 0u64);
    let info = |free: &mut u64, total: &mut u64| {
        // SAFETY: a live runtime and valid out pointers.
        unsafe { flex_runtime_get_memory_info(rt.0, free, total) }
    };
    assert_eq!(info(&mut free, &mut total), FLEX_SUCCESS);
    // `Rt::new` makes 1 MiB of memory, all free.
    assert_eq!((free, total), (1 << 20, 1 << 20));
    let block = rt.alloc(1000);
    assert_eq!(info(&mut free, &mut total), FLEX_SUCCESS);
    // 1000 bytes take 1024 (whole 128-byte units).
    assert_eq!((free, total), ((1 << 20) - 1024, 1 << 20));
    let raw = block.raw();
    // SAFETY: a live runtime; `raw` points into `block` for the call.
    let status = unsafe { flex_memory_free(rt.0, &raw const raw) };
    assert_eq!(status, FLEX_SUCCESS);
    assert_eq!(info(&mut free, &mut total), FLEX_SUCCESS);
    assert_eq!(free, 1 << 20);
    // SAFETY: NULL out pointers are refused, nothing is written.
    let status = unsafe { flex_runtime_get_memory_info(rt.0, ptr::null_mut(), &raw mut total) };
    assert_eq!(status, FLEX_ERROR_INVALID_ARGUMENT);
}

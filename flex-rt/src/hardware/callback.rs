//! What a launch hands to the library, and the `extern "C"` trampolines the
//! library calls back.
//!
//! # Ownership of one launch
//!
//! Everything an operation needs after its launch call returns lives in one
//! heap block, a [`Payload`]: the caller's completion, the lease on a host
//! buffer, and for host callbacks a [`HostSlot`] with the closure. A launch
//! on a stream takes the block from the stream's cache of finished ones
//! (see [`super::payload_cache`]); other payloads get a new one.
//! [`Submission`] owns the block as a raw pointer from the moment the launch
//! is prepared:
//!
//! - the launch passes [`Submission::completion`] (always
//!   [`completion_trampoline`], even when the caller gave no completion, so
//!   that the lease is released) and, for host callbacks,
//!   [`Submission::host_fn`] / [`Submission::host_user_data`];
//! - if the launch returns `FLEX_SUCCESS`, [`Submission::hand_over`] gives
//!   ownership to the library, which (`flex.h`) calls the completion exactly
//!   once; [`completion_trampoline`] moves the payload out and gives the
//!   block back (to its stream's cache, or to the allocator);
//! - if the launch returns anything else, `flex.h` says nothing was enqueued
//!   and the completion is never called: the `Submission` is dropped, and
//!   its `Drop` moves the payload out, gives the block back and drops the
//!   payload, without calling the caller's completion.
//!
//! So each payload is taken out of its block exactly once, by the
//! completion or by the rejected launch's caller.
//!
//! # Why the host function and the completion do not alias
//!
//! The host function gets a pointer to the payload's block, reads the
//! block's `home` (written once, when the block was made) and makes a
//! shared reference to the [`HostSlot`] field inside the payload, never to
//! the payload itself (`&HostSlot`); everything it changes is behind the
//! slot's mutex, or in the stream's cache (a `OnceLock`). The completion
//! takes unique ownership of the whole payload. `flex.h`
//! orders the two: the host function is part of the operation and the
//! completion is called only "when the operation has finished", after the
//! host function has returned (or when it will never be called). So the
//! shared borrow has ended before the completion moves the payload out of
//! its block, and no `&mut` ever exists alongside a `&`.
//!
//! # Panics
//!
//! No Rust panic unwinds into the library: both trampolines run every piece
//! of user code (closures and the drops of what they captured) under
//! `catch_unwind` and report a panic with `tracing::error!`. The
//! application's `tracing` subscriber is user code too: a panic from it
//! stops at [`stop_at_boundary`], around the whole of each trampoline,
//! after the stream's state has been updated.

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Arc;

use flex_sys::bindings as sys;

use crate::buffer::{ReadLease, WriteLease};
use crate::error::FlexError;
use crate::launch::{Completion, HostCallback};
use crate::panic::{drop_panic, panic_message};
use crate::status::Status;
use crate::sync::Mutex;

use super::payload_cache::{Block, FreeBlocks, PayloadCache};

/// The call name of errors handed to a completion.
const COMPLETION_CALL: &str = "completion";

/// Which operation a payload belongs to, for messages and for recognising
/// the runtime's own callback threads.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpMeta {
    /// The flex launch function, for example `flex_launch_h2d`.
    pub(super) call: &'static str,
    /// The id of the stream the operation was launched on.
    /// `None` for `flex_event_notify`, which is on no stream.
    pub(super) stream_id: Option<u64>,
    /// [`super::handle::RuntimeHandle::key`] of the stream's runtime.
    pub(super) runtime: usize,
}

/// The host buffer lease an operation holds until it completes.
#[expect(
    dead_code,
    reason = "a lease is never read; it is held for its Drop, which releases the buffer"
)]
pub(super) enum Lease {
    /// The operation touches no host memory.
    None,
    /// An H2D copy reads the buffer.
    Read(ReadLease),
    /// A D2H copy writes the buffer.
    Write(WriteLease),
}

/// The part of a host-callback payload that the host function may touch.
pub(super) struct HostSlot {
    /// The runtime whose thread runs the host function.
    runtime: usize,
    /// The closure until it is taken, and a panic message if it panicked.
    state: Mutex<HostState>,
}

/// See [`HostSlot::state`].
#[derive(Default)]
struct HostState {
    /// The closure; `None` once the host function has taken it.
    callback: Option<HostCallback>,
    /// The closure's panic message, for the completion's error.
    panic: Option<String>,
}

/// Everything one launched operation needs until its completion.
pub(super) struct Payload {
    meta: OpMeta,
    /// The caller's completion, if any.
    completion: Option<Completion>,
    /// Keeps the host buffer alive and locked until the completion.
    lease: Lease,
    /// The host callback, for `flex_launch_host_callback`; empty otherwise.
    host: HostSlot,
}

impl Payload {
    /// A payload for an operation described by `meta`.
    pub(super) fn new(
        meta: OpMeta,
        completion: Option<Completion>,
        lease: Lease,
        host_callback: Option<HostCallback>,
    ) -> Self {
        Self {
            meta,
            completion,
            lease,
            host: HostSlot {
                runtime: meta.runtime,
                state: Mutex::new(HostState {
                    callback: host_callback,
                    panic: None,
                }),
            },
        }
    }

    /// Finishes the operation with `status`: releases the lease (so the
    /// completion can read a D2H buffer), drops an unrun host callback, then
    /// runs the caller's completion; `stream` is its launching stream's
    /// cache, for the host callback panic that failed the stream, if one
    /// did. May unwind if user code panics; the trampoline catches it.
    fn complete(self, status: sys::flex_status_t, stream: Option<&PayloadCache<Payload>>) {
        let Payload {
            meta,
            completion,
            lease,
            host,
        } = self;
        drop(lease);
        let HostState { callback, panic } = host.state.into_inner();
        // A host function that never ran (its stream failed before its turn)
        // is dropped without running, as the trait documents. Its drop is
        // user code: a panic there must not cost the caller its completion.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(move || drop(callback))) {
            let message = panic_message(&*panic);
            drop_panic(panic);
            // Nor a panic of the log's subscriber, which is user code too.
            stop_at_boundary((), || {
                tracing::error!(
                    call = meta.call,
                    stream = ?meta.stream_id,
                    "dropping a host callback that never ran panicked: {message}; the completion \
                     still runs"
                );
            });
        }
        if let Some(completion) = completion {
            let stream_panic = stream.and_then(PayloadCache::host_panic);
            completion(completion_result(meta, status, panic, stream_panic));
        }
    }
}

/// What a completion is told for `status`: `Ok` for `FLEX_SUCCESS`, else an
/// error with `status` (any value, defined by `flex.h` or not) and call
/// `"completion"`, naming the operation's own host callback panic
/// (`host_panic`), or else the one that failed its stream
/// (`stream_panic`, see [`stream_failure`]).
fn completion_result(
    meta: OpMeta,
    status: sys::flex_status_t,
    host_panic: Option<String>,
    stream_panic: Option<&str>,
) -> Result<(), FlexError> {
    if status == sys::FLEX_SUCCESS {
        return Ok(());
    }
    let OpMeta {
        call, stream_id, ..
    } = meta;
    let message = match (host_panic, stream_id) {
        (Some(panic), Some(stream_id)) => host_panic_message(stream_id, &panic),
        (Some(panic), None) => format!("the callback of {call} panicked: {panic}"),
        (None, Some(stream_id)) => stream_failure(
            Status(status),
            format!("the operation launched by {call} on stream {stream_id} did not complete"),
            stream_id,
            stream_panic,
        ),
        (None, None) => format!("the event's record awaited with {call} did not complete"),
    };
    Err(FlexError::new(Status(status), COMPLETION_CALL, message))
}

/// `err`, an error of stream `stream_id`, naming the host callback panic
/// that failed the stream (`panic`) as [`stream_failure`] says: the
/// stream's and its events' errors.
#[cold]
pub(super) fn name_stream_panic(err: FlexError, stream_id: u64, panic: Option<&str>) -> FlexError {
    let Some(panic) = panic else {
        return err;
    };
    let message = stream_failure(
        err.status(),
        err.message().to_owned(),
        stream_id,
        Some(panic),
    );
    FlexError::new(err.status(), err.call(), message)
}

/// How a host callback's panic is named in errors: the library knows only
/// the status the host function returned.
fn host_panic_message(stream_id: u64, panic: &str) -> String {
    format!(
        "the host callback launched by flex_launch_host_callback on stream {stream_id} panicked: \
         {panic}"
    )
}

/// `message`, an error of stream `stream_id` with `status`, followed by the
/// host callback panic that failed the stream (`panic`, from its cache's
/// [`PayloadCache::host_panic`]) when the status is one a failed stream
/// gives (`HOST_CALLBACK_FAILED`, its first error, or `STREAM_FAILED`,
/// what it refuses and fails afterwards). A noted panic is the first error
/// the library has for the stream: host functions run only on a stream the
/// library has not failed, one at a time in order, and a stream that needs
/// shutdown gives `SHUTDOWN` instead (`flex.h`). (A completion's panic,
/// which fails the stream on flex-rt's side only, comes first where there
/// is one: `HardwareStream` reports it before asking the library.)
fn stream_failure(status: Status, message: String, stream_id: u64, panic: Option<&str>) -> String {
    match panic {
        Some(panic)
            if status == Status::HOST_CALLBACK_FAILED || status == Status::STREAM_FAILED =>
        {
            format!("{message}; {}", host_panic_message(stream_id, panic))
        }
        _ => message,
    }
}

/// Owns a [`Payload`], in its block, as a raw pointer until the launch
/// decides who takes it out. Dropping it drops the payload and gives the
/// block back (the launch was rejected); [`Submission::hand_over`] gives it
/// to the library.
pub(super) struct Submission {
    block: NonNull<Block<Payload>>,
}

impl Submission {
    /// Moves `payload` to the heap, at a stable address, in a block freed
    /// when its completion is done.
    pub(super) fn new(payload: Payload) -> Self {
        Self {
            block: Block::fill(payload, None),
        }
    }

    /// Moves `payload` into a block of `cache` (taken from `free`, else
    /// new), which goes back to `cache` when its completion is done, or
    /// when the submission is dropped.
    ///
    /// # Safety
    /// `cache` outlives the submission and every completion of its launch
    /// (see [`super::payload_cache`]), and `free` holds only blocks of
    /// `cache`.
    pub(super) unsafe fn cached(
        payload: Payload,
        cache: &Arc<PayloadCache<Payload>>,
        free: &mut FreeBlocks<Payload>,
    ) -> Self {
        Self {
            block: Block::fill(payload, Some((cache, free))),
        }
    }

    /// The completion to pass to the launch: [`completion_trampoline`] with
    /// the payload's block as `user_data`.
    pub(super) fn completion(&self) -> sys::flex_completion_t {
        sys::flex_completion_t {
            fn_: Some(completion_trampoline),
            user_data: self.block.as_ptr().cast(),
        }
    }

    /// The host function to pass to `flex_launch_host_callback`.
    pub(super) fn host_fn(&self) -> sys::flex_host_fn {
        Some(host_fn_trampoline)
    }

    /// The `host_user_data` to pass to `flex_launch_host_callback`: the
    /// address of the payload's block, whose [`HostSlot`] the host function
    /// uses.
    pub(super) fn host_user_data(&self) -> *mut c_void {
        self.block.as_ptr().cast()
    }

    /// The launch returned `FLEX_SUCCESS`: the library now owns the payload
    /// and will pass it to [`completion_trampoline`] exactly once.
    pub(super) fn hand_over(self) {
        std::mem::forget(self);
    }
}

impl Drop for Submission {
    /// The launch was rejected (or never made): take the payload back and
    /// drop it, releasing the lease and dropping the completion and host
    /// callback without calling them.
    fn drop(&mut self) {
        // SAFETY: the block was filled by `Submission::new` or `cached`. It
        // was not handed over (`hand_over` forgets `self`, so this `Drop`
        // does not run then), and a launch that did not return
        // `FLEX_SUCCESS` never calls the completion or host function
        // (`flex.h`), so nothing else uses the block: this is its only
        // owner, and it runs once. A cached block's stream, and so its
        // cache, is alive: the launch was made on it just now.
        let payload = unsafe { Block::take(self.block) };
        drop(payload);
    }
}

thread_local! {
    /// The runtime key whose completion or host function this thread is
    /// running, or 0.
    static RUNNING_CALLBACK_OF: Cell<usize> = const { Cell::new(0) };
}

/// Whether the current thread is inside a completion or host function of the
/// runtime with this key (`flex.h` forbids synchronizing or destroying that
/// runtime from there).
pub(super) fn in_callback_of(runtime: usize) -> bool {
    RUNNING_CALLBACK_OF
        .try_with(|running| running.get() == runtime)
        .unwrap_or(false)
}

/// Marks the current thread as running a callback of a runtime until dropped.
struct CallbackScope {
    previous: usize,
}

impl CallbackScope {
    fn enter(runtime: usize) -> Self {
        let previous = RUNNING_CALLBACK_OF
            .try_with(|running| running.replace(runtime))
            .unwrap_or(0);
        Self { previous }
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        // Ignoring the error is right: it only fails while the thread's
        // locals are being destroyed, when nothing reads them any more.
        let _ = RUNNING_CALLBACK_OF.try_with(|running| running.set(self.previous));
    }
}

/// Runs `body`, the whole of a trampoline or a log inside one, and returns
/// what it returns; if a panic escapes it, stops the panic here and
/// returns `on_panic`. The trampolines run user code under `catch_unwind`
/// already, but they also log with `tracing`, and the subscriber the
/// application installed is user code that may panic too. Unwinding out
/// of an `extern "C"` function would abort the process; this stops it
/// instead (the panic hook has reported it).
fn stop_at_boundary<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(panic) => {
            drop_panic(panic);
            on_panic
        }
    }
}

/// The `flex_completion_fn` of every launch.
///
/// Moves the [`Payload`] out of its block, gives the block back (to its
/// stream's cache, or to the allocator), releases the lease and runs the
/// caller's completion with `Ok(())` for `FLEX_SUCCESS` or the error for
/// any other status. A panic in user code is caught and logged with
/// `tracing::error!`; after an operation that succeeded it also fails the
/// stream on flex-rt's side ([`PayloadCache::note_completion_panic`]). The
/// payload is dropped either way.
///
/// # Safety
///
/// `user_data` is null (logged and ignored) or the `user_data` of
/// [`Submission::completion`] of a submission that was handed over, and this
/// is the one call `flex.h` promises for it: the block is not used after.
/// The block's stream cache, if it has one, is alive (see
/// [`super::payload_cache`]).
pub(super) unsafe extern "C" fn completion_trampoline(
    user_data: *mut c_void,
    status: sys::flex_status_t,
) {
    // SAFETY: this function's contract is `completion_body`'s.
    stop_at_boundary((), || unsafe { completion_body(user_data, status) });
}

/// The body of [`completion_trampoline`], under the same contract.
///
/// # Safety
///
/// As [`completion_trampoline`]'s.
unsafe fn completion_body(user_data: *mut c_void, status: sys::flex_status_t) {
    let Some(block) = NonNull::new(user_data.cast::<Block<Payload>>()) else {
        tracing::error!(
            status,
            "flex called a completion with a null user_data; ignored (the library broke flex.h)"
        );
        return;
    };
    // SAFETY: by this function's contract `user_data` is the block of a
    // submission handed over to the library, which calls the completion
    // exactly once; so this is the only owner now. The host function, if
    // any, has returned (or will never run): `flex.h` calls the completion
    // after the operation has finished. A cached block's cache is alive: its
    // stream is dropped only after its completions have returned (see
    // `super::payload_cache`), so for the whole of this call; its `home` is
    // read before `take` gives the block back.
    let (stream, payload) = unsafe { (Block::home(block), Block::take(block)) };
    let place = stream.map(PayloadCache::begin_completion);
    let meta = payload.meta;
    let _scope = CallbackScope::enter(meta.runtime);
    if let Err(panic) = catch_unwind(AssertUnwindSafe(move || payload.complete(status, stream))) {
        let message = panic_message(&*panic);
        // After an operation that succeeded, the panic is the stream's
        // first error (after one that failed, the library has the first).
        // Noted before the log, whose subscriber is user code too.
        if status == sys::FLEX_SUCCESS
            && let (Some(stream), Some(stream_id), Some(place)) = (stream, meta.stream_id, place)
        {
            stream.note_completion_panic(
                place,
                format!(
                    "the completion callback of the operation launched by {} on stream {stream_id} \
                 panicked: {message}",
                    meta.call
                ),
            );
        }
        drop_panic(panic);
        tracing::error!(
            call = meta.call,
            stream = ?meta.stream_id,
            "a completion callback panicked: {message}; the panic was stopped at the flex boundary"
        );
    }
}

/// The `flex_host_fn` of `flex_launch_host_callback`.
///
/// Takes the closure out of the [`HostSlot`] and runs it under
/// `catch_unwind`: `FLEX_SUCCESS` when it returns,
/// `FLEX_ERROR_HOST_CALLBACK_FAILED` when it panics (the panic message is
/// logged with `tracing::error!`, kept for the completion's error, and
/// noted in the stream's cache, [`PayloadCache::note_host_panic`], before
/// the status is returned, so that every error the stream gives for the
/// failure names it). The closure is consumed by running it, so it is
/// dropped exactly once, here; a closure that is never run is dropped by
/// the completion.
///
/// # Safety
///
/// `user_data` is null (an error status is returned) or the
/// [`Submission::host_user_data`] of a submission that was handed over and
/// whose completion has not been called yet.
pub(super) unsafe extern "C" fn host_fn_trampoline(user_data: *mut c_void) -> sys::flex_status_t {
    // SAFETY: this function's contract is `host_fn_body`'s.
    stop_at_boundary(sys::FLEX_ERROR_HOST_CALLBACK_FAILED, || unsafe {
        host_fn_body(user_data)
    })
}

/// The body of [`host_fn_trampoline`], under the same contract.
///
/// # Safety
///
/// As [`host_fn_trampoline`]'s.
unsafe fn host_fn_body(user_data: *mut c_void) -> sys::flex_status_t {
    let Some(block) = NonNull::new(user_data.cast::<Block<Payload>>()) else {
        tracing::error!(
            "flex called a host function with a null user_data; failing it (the library broke flex.h)"
        );
        return sys::FLEX_ERROR_HOST_CALLBACK_FAILED;
    };
    // SAFETY: by this function's contract `user_data` is the block of a
    // live, filled payload whose completion has not run, so the block and
    // its cache (if it has one: a stream's cache outlives the completions
    // of its launches, `super::payload_cache`) are valid for the whole call.
    // Only shared references are made, to the block's `home` (written once,
    // when the block was made) and to the `HostSlot` field, and all mutation
    // goes through the slot's mutex and the cache's `OnceLock`; the
    // completion, which takes ownership, runs only after this function has
    // returned (see the module documentation).
    let (home, slot) = unsafe { (Block::home(block), &(*Block::payload(block)).host) };
    let _scope = CallbackScope::enter(slot.runtime);
    // A second call before the completion finds the slot empty. (A call
    // after the completion, which flex.h rules out as well, may find the
    // block reused by a later launch on the stream: no check can catch that
    // here.)
    let taken = slot.state.lock().callback.take();
    let Some(callback) = taken else {
        tracing::error!(
            "flex called a host function a second time; failing it (the library broke flex.h)"
        );
        return sys::FLEX_ERROR_HOST_CALLBACK_FAILED;
    };
    match catch_unwind(AssertUnwindSafe(callback)) {
        Ok(()) => sys::FLEX_SUCCESS,
        Err(panic) => {
            let message = panic_message(&*panic);
            // Kept and noted before the log, whose subscriber is user code
            // too.
            if let Some(stream) = home {
                stream.note_host_panic(&message);
            }
            slot.state.lock().panic = Some(message.clone());
            drop_panic(panic);
            tracing::error!(
                "a host callback panicked: {message}; the panic was stopped at the flex boundary \
                 and the operation fails with FLEX_ERROR_HOST_CALLBACK_FAILED"
            );
            sys::FLEX_ERROR_HOST_CALLBACK_FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::buffer::HostBuffer;

    static_assertions::assert_impl_all!(Payload: Send);
    static_assertions::assert_impl_all!(HostSlot: Send, Sync);

    const RUNTIME: usize = 0x5eed;

    fn meta(call: &'static str) -> OpMeta {
        OpMeta {
            call,
            stream_id: Some(7),
            runtime: RUNTIME,
        }
    }

    /// Counts its drops.
    struct DropCounter(Arc<AtomicUsize>);

    impl Drop for DropCounter {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A completion that records every result it gets and owns a drop counter.
    fn recording_completion(
        results: &Arc<crate::sync::Mutex<Vec<Result<(), FlexError>>>>,
        drops: &Arc<AtomicUsize>,
    ) -> Completion {
        let results = Arc::clone(results);
        let guard = DropCounter(Arc::clone(drops));
        Box::new(move |result| {
            let _guard = &guard;
            results.lock().push(result);
        })
    }

    /// What the library does after a successful launch: call the completion
    /// once with `status`.
    fn launch_then_complete(submission: Submission, status: sys::flex_status_t) {
        let completion = submission.completion();
        submission.hand_over();
        let f = completion.fn_.expect("a completion is always passed");
        // SAFETY: the submission was handed over and this is its one
        // completion call.
        unsafe { f(completion.user_data, status) };
    }

    #[test]
    fn success_runs_the_completion_once_with_ok_and_frees_everything() {
        let results = Arc::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let payload = Payload::new(
            meta("flex_launch_compute"),
            Some(recording_completion(&results, &drops)),
            Lease::None,
            None,
        );
        launch_then_complete(Submission::new(payload), sys::FLEX_SUCCESS);
        assert_eq!(*results.lock(), vec![Ok(())]);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn failure_statuses_reach_the_completion_as_errors() {
        for status in [
            sys::FLEX_ERROR_EXECUTION_FAILED,
            sys::FLEX_ERROR_STREAM_FAILED,
            sys::FLEX_ERROR_SHUTDOWN,
            77,
            -5,
        ] {
            let results = Arc::default();
            let drops = Arc::new(AtomicUsize::new(0));
            let payload = Payload::new(
                meta("flex_launch_fill"),
                Some(recording_completion(&results, &drops)),
                Lease::None,
                None,
            );
            launch_then_complete(Submission::new(payload), status);
            let results = results.lock();
            assert_eq!(results.len(), 1);
            let err = results[0].as_ref().unwrap_err();
            assert_eq!(err.status(), Status(status));
            assert_eq!(err.call(), "completion");
            assert_eq!(
                err.message(),
                "the operation launched by flex_launch_fill on stream 7 did not complete"
            );
            if status == 77 {
                assert!(
                    err.to_string()
                        .contains("undefined status 77 (not in flex.h)"),
                    "{err}"
                );
            }
            assert_eq!(drops.load(Ordering::SeqCst), 1);
        }
    }

    #[test]
    fn a_launch_without_completion_still_releases_its_lease() {
        let buffer = HostBuffer::from_vec(vec![1, 2, 3]);
        let lease = buffer.lease_for_write("launch_d2h").unwrap();
        let submission = Submission::new(Payload::new(
            meta("flex_launch_d2h"),
            None,
            Lease::Write(lease),
            None,
        ));
        assert!(
            buffer.lease_for_read("t").is_err(),
            "leased while in flight"
        );
        let completion = submission.completion();
        assert!(completion.fn_.is_some());
        launch_then_complete(submission, sys::FLEX_SUCCESS);
        assert!(
            buffer.lease_for_read("t").is_ok(),
            "released by the completion"
        );
    }

    /// Panics when dropped.
    struct PanicOnDrop;

    impl Drop for PanicOnDrop {
        fn drop(&mut self) {
            panic!("dropped");
        }
    }

    #[test]
    fn a_panic_dropping_an_unrun_host_callback_still_runs_the_completion() {
        also_with_a_panicking_log(|| {
            let results = Arc::default();
            let drops = Arc::new(AtomicUsize::new(0));
            let host: HostCallback = {
                let captured = PanicOnDrop;
                Box::new(move || {
                    let _captured = &captured;
                })
            };
            let payload = Payload::new(
                meta("flex_launch_host_callback"),
                Some(recording_completion(&results, &drops)),
                Lease::None,
                Some(host),
            );
            // The stream failed before the host function's turn: it never runs.
            launch_then_complete(Submission::new(payload), sys::FLEX_ERROR_STREAM_FAILED);
            let results = results.lock();
            assert_eq!(results.len(), 1, "the completion ran once");
            let err = results[0].as_ref().unwrap_err();
            assert_eq!(err.status(), Status::STREAM_FAILED);
            assert_eq!(drops.load(Ordering::SeqCst), 1);
        });
    }

    #[test]
    fn the_lease_is_released_before_the_completion_runs() {
        let buffer = HostBuffer::zeroed(4);
        let mut lease = buffer.lease_for_write("launch_d2h").unwrap();
        lease.copy_from_slice(&[4, 3, 2, 1]);
        let seen = Arc::new(crate::sync::Mutex::new(None));
        let completion: Completion = {
            let buffer = buffer.clone();
            let seen = Arc::clone(&seen);
            Box::new(move |result| {
                assert!(result.is_ok());
                // Would deadlock if the write lease were still held.
                *seen.lock() = Some(buffer.to_vec());
            })
        };
        let submission = Submission::new(Payload::new(
            meta("flex_launch_d2h"),
            Some(completion),
            Lease::Write(lease),
            None,
        ));
        launch_then_complete(submission, sys::FLEX_SUCCESS);
        assert_eq!(*seen.lock(), Some(vec![4, 3, 2, 1]));
    }

    #[test]
    fn host_pointers_taken_before_the_lease_moves_stay_valid_until_completion() {
        // What `launch_h2d` / `launch_d2h` do: take the raw pointer from the
        // lease, move the lease into the payload, and let the "device" use
        // the pointer until the completion.
        let source = HostBuffer::from_vec(vec![1, 2, 3, 4]);
        let read = source.lease_for_read("launch_h2d").unwrap();
        let src_ptr: *const u8 = read.as_ptr();
        let h2d = Submission::new(Payload::new(
            meta("flex_launch_h2d"),
            None,
            Lease::Read(read),
            None,
        ));
        let target = HostBuffer::zeroed(4);
        let mut write = target.lease_for_write("launch_d2h").unwrap();
        let dst_ptr: *mut u8 = write.as_mut_ptr();
        let d2h = Submission::new(Payload::new(
            meta("flex_launch_d2h"),
            None,
            Lease::Write(write),
            None,
        ));
        // SAFETY: both leases live inside the submissions, so both buffers
        // are allocated, 4 bytes long, and not touched by Rust meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src_ptr, dst_ptr, 4) };
        launch_then_complete(d2h, sys::FLEX_SUCCESS);
        launch_then_complete(h2d, sys::FLEX_SUCCESS);
        assert_eq!(target.to_vec(), vec![1, 2, 3, 4]);
        assert!(source.lease_for_write("t").is_ok());
    }

    #[test]
    fn a_panicking_completion_does_not_unwind_and_is_freed_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let buffer = HostBuffer::zeroed(8);
        let lease = buffer.lease_for_read("launch_h2d").unwrap();
        let completion: Completion = {
            let guard = DropCounter(Arc::clone(&drops));
            Box::new(move |_| {
                let _guard = &guard;
                panic!("completion boom");
            })
        };
        let submission = Submission::new(Payload::new(
            meta("flex_launch_h2d"),
            Some(completion),
            Lease::Read(lease),
            None,
        ));
        // Returns normally: the panic is caught inside the trampoline.
        launch_then_complete(submission, sys::FLEX_SUCCESS);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(buffer.lease_for_write("t").is_ok());
    }

    #[test]
    fn a_stream_s_payload_block_is_reused_after_its_completion_and_after_a_rejection() {
        let results = Arc::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let cache = Arc::new(PayloadCache::new());
        let mut free = FreeBlocks::new();
        let cached = |free: &mut FreeBlocks<Payload>| {
            // SAFETY: `cache` and `free` live to the end of the test, and
            // `free` is used with `cache` only.
            unsafe {
                Submission::cached(
                    Payload::new(
                        meta("flex_launch_compute"),
                        Some(recording_completion(&results, &drops)),
                        Lease::None,
                        None,
                    ),
                    &cache,
                    free,
                )
            }
        };
        let first = cached(&mut free);
        let block = first.completion().user_data;
        launch_then_complete(first, sys::FLEX_SUCCESS);
        assert_eq!(results.lock().len(), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the payload was dropped");
        // The completion gave the block back; the next launch takes it, and
        // a rejected launch gives it back too.
        let second = cached(&mut free);
        assert_eq!(second.completion().user_data, block);
        drop(second);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        assert_eq!(
            results.lock().len(),
            1,
            "a rejected launch's completion is not called"
        );
        let third = cached(&mut free);
        assert_eq!(third.completion().user_data, block);
        launch_then_complete(third, sys::FLEX_ERROR_STREAM_FAILED);
        assert_eq!(results.lock().len(), 2);
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        assert_eq!(cache.blocks_made(), 1, "three launches, one block");
    }

    #[test]
    fn a_rejected_launch_is_reclaimed_once_without_calling_the_completion() {
        let results = Arc::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let host_drops = Arc::new(AtomicUsize::new(0));
        let buffer = HostBuffer::zeroed(2);
        let lease = buffer.lease_for_read("launch_h2d").unwrap();
        let host: HostCallback = {
            let guard = DropCounter(Arc::clone(&host_drops));
            Box::new(move || {
                let _guard = &guard;
                unreachable!("a rejected launch never runs its host callback");
            })
        };
        let submission = Submission::new(Payload::new(
            meta("flex_launch_host_callback"),
            Some(recording_completion(&results, &drops)),
            Lease::Read(lease),
            Some(host),
        ));
        let _passed_to_the_library = (
            submission.completion(),
            submission.host_fn(),
            submission.host_user_data(),
        );
        // The launch returned an error: the caller drops the submission.
        drop(submission);
        assert!(results.lock().is_empty(), "the completion is never called");
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(host_drops.load(Ordering::SeqCst), 1);
        assert!(buffer.lease_for_write("t").is_ok());
    }

    /// Calls the host function the way the library does.
    fn run_host_fn(submission: &Submission) -> sys::flex_status_t {
        let f = submission
            .host_fn()
            .expect("a host function is always passed");
        // SAFETY: the submission is alive and its completion has not run.
        unsafe { f(submission.host_user_data()) }
    }

    #[test]
    fn the_host_function_runs_the_closure_once_then_the_completion_frees_it() {
        let runs = Arc::new(AtomicUsize::new(0));
        let host_drops = Arc::new(AtomicUsize::new(0));
        let results = Arc::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let host: HostCallback = {
            let runs = Arc::clone(&runs);
            let guard = DropCounter(Arc::clone(&host_drops));
            Box::new(move || {
                let _guard = &guard;
                assert!(in_callback_of(RUNTIME));
                runs.fetch_add(1, Ordering::SeqCst);
            })
        };
        let submission = Submission::new(Payload::new(
            meta("flex_launch_host_callback"),
            Some(recording_completion(&results, &drops)),
            Lease::None,
            Some(host),
        ));
        assert_eq!(run_host_fn(&submission), sys::FLEX_SUCCESS);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(host_drops.load(Ordering::SeqCst), 1, "consumed by running");
        assert!(!in_callback_of(RUNTIME));
        // A second call (a broken library) does not run it again.
        assert_eq!(
            run_host_fn(&submission),
            sys::FLEX_ERROR_HOST_CALLBACK_FAILED
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        launch_then_complete(submission, sys::FLEX_SUCCESS);
        assert_eq!(*results.lock(), vec![Ok(())]);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(host_drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_panicking_host_function_fails_the_operation_and_is_dropped_once() {
        let host_drops = Arc::new(AtomicUsize::new(0));
        let results = Arc::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let host: HostCallback = {
            let guard = DropCounter(Arc::clone(&host_drops));
            Box::new(move || {
                let _guard = &guard;
                panic!("host boom {}", 42);
            })
        };
        let submission = Submission::new(Payload::new(
            meta("flex_launch_host_callback"),
            Some(recording_completion(&results, &drops)),
            Lease::None,
            Some(host),
        ));
        assert_eq!(
            run_host_fn(&submission),
            sys::FLEX_ERROR_HOST_CALLBACK_FAILED
        );
        assert_eq!(host_drops.load(Ordering::SeqCst), 1);
        assert!(!in_callback_of(RUNTIME), "the scope is left on panic too");
        // The library then fails the operation.
        launch_then_complete(submission, sys::FLEX_ERROR_HOST_CALLBACK_FAILED);
        let results = results.lock();
        assert_eq!(results.len(), 1);
        let err = results[0].as_ref().unwrap_err();
        assert_eq!(err.status(), Status::HOST_CALLBACK_FAILED);
        assert_eq!(
            err.message(),
            "the host callback launched by flex_launch_host_callback on stream 7 panicked: \
             host boom 42"
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(host_drops.load(Ordering::SeqCst), 1);
    }

    /// The panic is noted in the stream's cache by the host function,
    /// before it returns the failed status (the library fails the stream
    /// then, and its query may be called before any completion), and an
    /// operation of the stream that never ran names it in its completion.
    #[test]
    fn a_host_function_panic_is_noted_for_its_stream_before_it_returns() {
        also_with_a_panicking_log(|| {
            let cache = Arc::new(PayloadCache::new());
            let mut free = FreeBlocks::new();
            let results = Arc::default();
            let drops = Arc::new(AtomicUsize::new(0));
            let payload = |host: Option<HostCallback>| {
                Payload::new(
                    meta("flex_launch_host_callback"),
                    Some(recording_completion(&results, &drops)),
                    Lease::None,
                    host,
                )
            };
            // SAFETY: `cache` outlives both submissions and their completions,
            // and `free` holds only its blocks.
            let (panicking, behind) = unsafe {
                (
                    Submission::cached(
                        payload(Some(Box::new(|| panic!("no weights")))),
                        &cache,
                        &mut free,
                    ),
                    Submission::cached(payload(Some(Box::new(|| {}))), &cache, &mut free),
                )
            };
            assert_eq!(
                run_host_fn(&panicking),
                sys::FLEX_ERROR_HOST_CALLBACK_FAILED
            );
            assert_eq!(cache.host_panic(), Some("no weights"), "noted on return");
            launch_then_complete(panicking, sys::FLEX_ERROR_HOST_CALLBACK_FAILED);
            launch_then_complete(behind, sys::FLEX_ERROR_STREAM_FAILED);
            let results = results.lock();
            let messages: Vec<&str> = results
                .iter()
                .map(|result| result.as_ref().unwrap_err().message())
                .collect();
            assert_eq!(
                messages,
                [
                    "the host callback launched by flex_launch_host_callback on stream 7 panicked: \
                     no weights",
                    "the operation launched by flex_launch_host_callback on stream 7 did not \
                     complete; the host callback launched by flex_launch_host_callback on stream 7 \
                     panicked: no weights",
                ]
            );
        });
    }

    /// A completion that panics after its operation succeeded fails its
    /// stream on flex-rt's side (noted in the cache); after an operation
    /// that failed, the library's error is the stream's first, and nothing
    /// is noted.
    #[test]
    fn a_completion_panic_after_success_is_noted_for_its_stream() {
        also_with_a_panicking_log(|| {
            for (status, noted) in [
                (sys::FLEX_ERROR_EXECUTION_FAILED, None),
                (
                    sys::FLEX_SUCCESS,
                    Some(
                        "the completion callback of the operation launched by flex_launch_fill on \
                         stream 7 panicked: completion boom",
                    ),
                ),
            ] {
                let cache = Arc::new(PayloadCache::new());
                let mut free = FreeBlocks::new();
                let payload = Payload::new(
                    meta("flex_launch_fill"),
                    Some(Box::new(|_| panic!("completion boom"))),
                    Lease::None,
                    None,
                );
                // SAFETY: `cache` outlives the submission and its completion,
                // and `free` holds only its blocks.
                let submission = unsafe { Submission::cached(payload, &cache, &mut free) };
                launch_then_complete(submission, status);
                assert_eq!(cache.completion_panic(), noted, "status {status}");
                assert_eq!(cache.host_panic(), None);
            }
        });
    }

    /// A noted panic is named after the errors of a failed stream only
    /// (its first error, `HOST_CALLBACK_FAILED`, and what it fails
    /// afterwards, `STREAM_FAILED`), not after a shutdown's or another
    /// failure's.
    #[test]
    fn only_a_failed_streams_errors_name_its_host_panic() {
        let failure = |status, panic| stream_failure(status, "m".to_owned(), 3, panic);
        let named = "m; the host callback launched by flex_launch_host_callback on stream 3 \
                     panicked: p";
        assert_eq!(failure(Status::HOST_CALLBACK_FAILED, Some("p")), named);
        assert_eq!(failure(Status::STREAM_FAILED, Some("p")), named);
        for status in [
            Status::SHUTDOWN,
            Status::EXECUTION_FAILED,
            Status::INVALID_HANDLE,
        ] {
            assert_eq!(failure(status, Some("p")), "m", "{status}");
        }
        assert_eq!(failure(Status::STREAM_FAILED, None), "m");
    }

    #[test]
    fn a_host_function_that_never_runs_is_dropped_by_the_completion() {
        let host_drops = Arc::new(AtomicUsize::new(0));
        let results = Arc::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let host: HostCallback = {
            let guard = DropCounter(Arc::clone(&host_drops));
            Box::new(move || {
                let _guard = &guard;
                unreachable!("the stream failed before its turn");
            })
        };
        let submission = Submission::new(Payload::new(
            meta("flex_launch_host_callback"),
            Some(recording_completion(&results, &drops)),
            Lease::None,
            Some(host),
        ));
        launch_then_complete(submission, sys::FLEX_ERROR_STREAM_FAILED);
        assert_eq!(host_drops.load(Ordering::SeqCst), 1);
        assert_eq!(
            results.lock()[0].as_ref().unwrap_err().status(),
            Status::STREAM_FAILED
        );
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_completion_runs_inside_the_runtime_callback_scope() {
        let inside = Arc::new(crate::sync::Mutex::new(None));
        let completion: Completion = {
            let inside = Arc::clone(&inside);
            Box::new(move |_| {
                *inside.lock() = Some((in_callback_of(RUNTIME), in_callback_of(RUNTIME + 1)));
            })
        };
        assert!(!in_callback_of(RUNTIME));
        let submission = Submission::new(Payload::new(
            meta("flex_launch_compute"),
            Some(completion),
            Lease::None,
            None,
        ));
        launch_then_complete(submission, sys::FLEX_SUCCESS);
        assert_eq!(*inside.lock(), Some((true, false)));
        assert!(!in_callback_of(RUNTIME));
    }

    /// A `tracing` subscriber that panics on every event.
    struct PanickingSubscriber;

    impl tracing::Subscriber for PanickingSubscriber {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            panic!("the subscriber failed");
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// Runs `test` as it is, then again with a `tracing` subscriber on this
    /// thread that panics on every event: the trampolines' logs, whose
    /// subscriber is user code, must cost nothing the test checks.
    fn also_with_a_panicking_log(test: impl Fn()) {
        test();
        tracing::subscriber::with_default(PanickingSubscriber, test);
    }

    #[test]
    fn a_panicking_subscriber_stops_at_the_trampolines() {
        // Both trampolines log the null user_data; the subscriber's panic
        // would unwind out of an `extern "C"` function, which aborts the
        // test binary.
        tracing::subscriber::with_default(PanickingSubscriber, || {
            // SAFETY: null is explicitly allowed by both contracts.
            unsafe { completion_trampoline(std::ptr::null_mut(), sys::FLEX_SUCCESS) };
            // SAFETY: as above.
            let status = unsafe { host_fn_trampoline(std::ptr::null_mut()) };
            assert_eq!(status, sys::FLEX_ERROR_HOST_CALLBACK_FAILED);
        });
    }

    #[test]
    fn null_user_data_is_ignored_by_both_trampolines() {
        // SAFETY: null is explicitly allowed by both contracts.
        unsafe { completion_trampoline(std::ptr::null_mut(), sys::FLEX_SUCCESS) };
        // SAFETY: as above.
        let status = unsafe { host_fn_trampoline(std::ptr::null_mut()) };
        assert_eq!(status, sys::FLEX_ERROR_HOST_CALLBACK_FAILED);
    }
}

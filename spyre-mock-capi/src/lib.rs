//! The software Spyre device as a flex runtime library: every function of
//! `flex.h`, exported with C linkage from this crate's `cdylib`
//! (`libspyre_mock_capi.so`), so that the hardware path — flex-sys's loader
//! and flex-rt's hardware backend — runs against a real dynamically loaded
//! library in every `cargo test`, and a vendor-conformance run can point
//! `FLEX_RUNTIME_LIB` at it.
//!
//! The device itself is `spyre-mock` (safe Rust, `#![forbid(unsafe_code)]`);
//! this crate is the C boundary over it and holds all of its `unsafe` code.
//! The functions are also plain Rust functions of this crate, callable in
//! process (the unit tests do); each is `unsafe` because it takes raw
//! pointers whose validity `flex.h` leaves to the caller. Their signatures
//! are bindgen's from flex-sys (a unit test assigns each one to the matching
//! field of [`flex_sys::bindings::FlexApi`], so a drift does not compile).
//!
//! # Behaviour
//!
//! Every call follows `flex.h` on the device of this crate: a runtime is a
//! [`MockRuntime`](spyre_mock::MockRuntime), a stream one of its
//! [`MockStream`](spyre_mock::MockStream)s, and every launch goes through
//! [`MockStream::enqueue_raw`](spyre_mock::MockStream::enqueue_raw) (or,
//! with late completions, [`MockStream::enqueue`](spyre_mock::MockStream::enqueue))
//! with an [`Op`](spyre_mock::Op) built from the raw pointers, so the C path
//! has the same validation, scheduling, completion and error rules as the
//! Rust one.
//!
//! - **Handles.** A `flex_runtime_t *` is the address of a boxed handle; a
//!   `flex_stream_t *` is the address of a stream owned by its runtime; a
//!   `flex_event_t *` (ABI 1.1) is the address of the library's entry for
//!   the event, which `flex_event_destroy` and `flex_runtime_destroy`
//!   retire.
//!   Every call looks the handle up in a process-wide table of live handles
//!   before using it, so NULL, a foreign pointer, a destroyed stream or a
//!   destroyed runtime is `FLEX_ERROR_INVALID_HANDLE`, never a dereference
//!   (as with any pointer handle, an address freed by
//!   `flex_runtime_destroy` may later be reused by a new runtime or stream
//!   of this library).
//! - **Arguments.** NULL, misaligned or out-of-range arguments are
//!   `FLEX_ERROR_INVALID_ARGUMENT`; out-parameters are written only on
//!   success (and `*num_chunks_out` when the capacity is too small, as
//!   `flex.h` says).
//! - **Errors.** Every failure sets the calling thread's last-error message,
//!   which [`flex_get_last_error_message`] returns (`""` on a thread where
//!   nothing has failed; never NULL). Success leaves it unchanged.
//! - **Completions** are called exactly once for every launch that returned
//!   `FLEX_SUCCESS`, on an engine thread of the runtime (or its delivery
//!   thread, see `SPYRE_MOCK_LATE_COMPLETIONS_MS`), never inside the launch;
//!   a launch that returns anything else never calls its completion.
//! - **Host functions** run on an engine thread in stream order; a status
//!   other than `FLEX_SUCCESS` fails the operation and the stream with
//!   `FLEX_ERROR_HOST_CALLBACK_FAILED`.
//! - **Forbidden re-entry.** `flex_stream_synchronize`,
//!   `flex_event_synchronize`, `flex_stream_wait_event` without device-side
//!   waits, `flex_stream_destroy` and `flex_runtime_destroy` called from a
//!   completion or host function of the same runtime return
//!   `FLEX_ERROR_UNSUPPORTED` instead of waiting for themselves.
//! - **Destroy.** `flex_stream_destroy` closes the stream (a launch,
//!   record or wait on it from then on is `FLEX_ERROR_INVALID_HANDLE`),
//!   waits for its work and completions, then retires the handle (the
//!   stream's memory stays with its runtime). `flex_runtime_destroy` waits for all work and every
//!   completion — including work that completions launched — then frees the
//!   runtime and joins all its threads: nothing of it runs after the call
//!   returns.
//! - **Fork.** A runtime records the `fork()` generation it was created in
//!   (flex-sys's fork watcher); in a forked child every call on it, its
//!   streams or its events returns `FLEX_ERROR_RUNTIME_FAILED` (its engine
//!   threads are not in the child), checked as the handle is looked up:
//!   one relaxed atomic load per call. The library's process-wide locks
//!   are held across `fork()` (`pthread_atfork`), and the child forgets the
//!   handle-table reads of the threads it does not have, so a call another
//!   thread was making at the fork does not leave the child blocked on it,
//!   and the device's locks and waits share no process-wide state
//!   (`spyre_mock::sync`), so a runtime the child makes runs as any other.
//!   One lock is not the library's: the Rust standard library's copy
//!   inside this library takes a process-wide lock at the end of each of
//!   the library's threads (for its stack-overflow handling; a Rust
//!   program's own copy also at each start). So a child forked while
//!   another thread of the parent was destroying a runtime, whose engines
//!   were ending, hangs when its own runtime's engines end, at its
//!   `flex_runtime_destroy`. Fork while no runtime is being destroyed.
//! - **Not from signal handlers.** No function of the library may be
//!   called from a signal handler: a call reads the handle table in a read
//!   section of its thread (`rcu`), which a handler's call interrupting
//!   another call's entry or exit would misread, and failures allocate.
//! - **membarrier.** On Linux the library registers the process for
//!   `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` as it is loaded, so
//!   that a handle lookup needs no fence; every create or destroy then
//!   runs one. A process must not make the kernel refuse `membarrier`
//!   afterwards (a seccomp filter installed later): each create or destroy
//!   would then fail with `FLEX_ERROR_INTERNAL` after its change was made.
//!   Where the registration itself is refused, lookups fence and nothing
//!   else changes.
//! - **Panics** never cross the C boundary: each export runs under
//!   `catch_unwind`, and a panic becomes `FLEX_ERROR_INTERNAL` with the panic
//!   message as the last error.
//!
//! # Environment
//!
//! The library reads its configuration from the environment:
//! `flex_get_api_version` reads `SPYRE_MOCK_ABI_VERSION` on every call;
//! `flex_get_device_count` and `flex_runtime_create` read the device
//! variables and `SPYRE_MOCK_UNDEFINED_STATUS` on every call; a runtime
//! takes every other switch when it is created and keeps it. Values are
//! trimmed; unset or empty means the default. A malformed device variable or
//! switch makes `flex_get_device_count` and `flex_runtime_create` fail with
//! `FLEX_ERROR_INVALID_ARGUMENT`, naming the variable and its value (the
//! library's configuration is the caller's argument, in effect).
//!
//! | variable | effect | default |
//! |---|---|---|
//! | `SPYRE_MOCK_DEVICES`, `SPYRE_MOCK_MEMORY_BYTES`, `SPYRE_MOCK_REGION_BYTES`, `SPYRE_MOCK_ENGINES`, `SPYRE_MOCK_OP_LATENCY_US`, `SPYRE_MOCK_COPY_BANDWIDTH`, `SPYRE_MOCK_SYNC_POLICY`, `SPYRE_MOCK_DEVICE_SIDE_WAIT`, `SPYRE_MOCK_EVENT_TIMING`, `SPYRE_MOCK_CHECK_REUSE`, `SPYRE_DEVICES` | the device, as [`MockConfig::from_lookup`](spyre_mock::MockConfig::from_lookup) reads them (see the [device's docs](spyre_mock#environment)), except that `SPYRE_MOCK_CHECK_REUSE` true is refused with `FLEX_ERROR_INVALID_ARGUMENT`: the use-after-free detector must be told when memory is handed out again, which flex.h has no call for, so through the library it would check nothing | as there |
//! | `SPYRE_MOCK_ABI_VERSION=M.m` | `flex_get_api_version` reports version `M.m` (each 0..=65535), e.g. `2.0` (a loader must refuse it), `1.0` (accepted, and a loader then offers no events) or `1.7` (a newer minor, accepted); with a malformed value it reports the header's version and `flex_get_device_count` and `flex_runtime_create` fail with `FLEX_ERROR_INVALID_ARGUMENT` naming the value | the header's version |
//! | `SPYRE_MOCK_UNDEFINED_STATUS=<call>[,<call>…]` | each named function (any of the 30 that return a status, e.g. `flex_stream_query`, `flex_launch_h2d`) returns status 977, which `flex.h` does not define, and does nothing else: no out-parameter is written, a launch enqueues nothing and never calls its completion, a destroy destroys nothing | none |
//! | `SPYRE_MOCK_FAIL_LAUNCH=N` | on every stream of the runtime, the `N`th launch (event records count) that passes the argument and stream-state checks is refused with `FLEX_ERROR_LAUNCH_FAILED` (enqueues nothing, never calls its completion); earlier and later launches are unaffected (`MockStream::fail_nth_launch`); 0 is off | off |
//! | `SPYRE_MOCK_LATE_COMPLETIONS_MS=N` (0..=10000) | completions are delivered `N` ms after their operation finished, from a delivery thread of the runtime (`spyre-mock-d<device>-late`), in order; the stream runs its next operation meanwhile. Synchronize, query and destroy still count such completions as pending, so `flex_stream_synchronize` and `flex_runtime_destroy` return only after they have returned | off |
//! | `SPYRE_MOCK_FAIL_RUNTIME_CREATE=1` | `flex_runtime_create` on an existing device fails with `FLEX_ERROR_RUNTIME_FAILED`; `0` is off | off |

//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | `library` | `flex_get_api_version`, `flex_status_string`, `flex_get_last_error_message`, `flex_get_device_count` |
//! | `runtime` | runtime create/destroy, logical device, default stream, stream create/destroy, has-stream-error |
//! | `memory` | `flex_memory_allocate`, `flex_memory_free`, `flex_runtime_get_memory_info` |
//! | `stream` | stream id, priority, query, synchronize, needs-shutdown |
//! | `launch` | the five launches and their completions |
//! | `event` | events and capabilities (ABI 1.1): create, destroy, record, wait, notify, query, synchronize, elapsed time |
//! | `args` | raw arguments checked before use |
//! | `boundary` | the failure type, the thread's last error, the panic barrier |
//! | `handles` | the table of live runtime, stream and event handles |
//! | `host_side` | what a launch carries across threads: raw host memory, C completions and host functions |
//! | `late_completions` | the delivery thread of `SPYRE_MOCK_LATE_COMPLETIONS_MS` |
//! | `environment` | what the library reads from the environment: the device configuration, the ABI version to report, the misbehaviour switches |

mod args;
mod boundary;
mod environment;
mod event;
mod handles;
mod host_side;
mod late_completions;
mod launch;
mod library;
mod memory;
mod rcu;
mod runtime;
mod stream;

#[cfg(test)]
mod tests;

pub use event::{
    flex_event_create, flex_event_destroy, flex_event_elapsed_time, flex_event_notify,
    flex_event_query, flex_event_record, flex_event_synchronize, flex_runtime_get_capability,
    flex_stream_wait_event,
};
pub use launch::{
    flex_launch_compute, flex_launch_d2h, flex_launch_fill, flex_launch_h2d,
    flex_launch_host_callback,
};
pub use library::{
    flex_get_api_version, flex_get_device_count, flex_get_last_error_message, flex_status_string,
};
pub use memory::{flex_memory_allocate, flex_memory_free, flex_runtime_get_memory_info};
pub use runtime::{
    flex_runtime_create, flex_runtime_create_stream, flex_runtime_destroy,
    flex_runtime_get_default_stream, flex_runtime_get_logical_device,
    flex_runtime_has_stream_error, flex_stream_destroy,
};
pub use stream::{
    flex_stream_get_id, flex_stream_get_priority, flex_stream_needs_shutdown, flex_stream_query,
    flex_stream_synchronize,
};

//! A software Spyre device.
//!
//! spyre-mock implements flex-rt's [`Backend`](flex_rt::Backend),
//! [`Runtime`](flex_rt::Runtime) and [`Stream`](flex_rt::Stream) traits in
//! safe Rust, so that everything above flex-rt builds, runs and is tested
//! on any machine without a Spyre card. It keeps the semantics of flex.h:
//! per-stream FIFO execution, concurrency across streams, priorities, sticky
//! errors, completions called exactly once, and device memory with
//! composite addresses. Compute runs a small set of built-in `f32` kernels,
//! so results are checkable numbers.
//!
//! ```
//! use flex_rt::{Backend, HostBuffer, LaunchOptions};
//! use spyre_mock::MockSystem;
//!
//! let system = MockSystem::builder().memory_bytes(1 << 20).region_bytes(1 << 18).build()?;
//! let runtime = system.create_runtime(0)?;
//! let stream = runtime.default_stream();
//! let device = runtime.allocate(4)?;
//! let out = HostBuffer::zeroed(4);
//! stream.launch_h2d(&HostBuffer::from_vec(vec![1, 2, 3, 4]), &device, LaunchOptions::new())?;
//! stream.launch_d2h(&device, &out, LaunchOptions::new())?;
//! stream.synchronize()?;
//! assert_eq!(out.to_vec(), vec![1, 2, 3, 4]);
//! # Ok::<(), flex_rt::FlexError>(())
//! ```
//!
//! # The device
//!
//! A [`MockSystem`] has `devices` logical devices (default 1). Every
//! [`MockRuntime`] created on one gets fresh state: its own device memory,
//! streams and engine threads; runtimes share nothing.
//!
//! # Execution model
//!
//! - Each stream is a FIFO. It runs at most one operation at a time, and an
//!   operation counts as running until its completion has returned.
//! - A runtime has `engines` engine threads (default 2), named
//!   `spyre-mock-d<device>-e<n>`. Different streams run concurrently, up to
//!   one per engine. When more streams have work than there are engines,
//!   queued work of [`High`](flex_rt::StreamPriority::High) streams starts
//!   first, then the stream whose next operation was enqueued earliest.
//!   The priority is strict: while high-priority streams keep every engine
//!   busy, normal streams wait, and so does a `synchronize` of them (or of
//!   the device). Between streams of one priority the order is not strict
//!   (`flex.h` promises none): an engine that takes a stream's operation
//!   runs up to 31 more queued behind it before it picks again, so a
//!   stream of the same priority may wait for up to 32 operations of each
//!   such stream ahead of it, and of each run already going on an engine
//!   when it became ready, even where its own was enqueued first. A
//!   high-priority stream made ready meanwhile stops such a run of a
//!   normal-priority stream before its next operation.
//! - Completions and host callbacks run on engine threads, never inside the
//!   launch call, with no lock held, in FIFO order per stream. A host
//!   callback holds its stream and its engine until it returns. A panic in
//!   a host callback or completion is caught and fails the stream with
//!   [`HOST_CALLBACK_FAILED`](flex_rt::Status::HOST_CALLBACK_FAILED); the
//!   engine keeps running.
//! - Errors are sticky: after an operation fails, the stream's later
//!   operations complete with `STREAM_FAILED` (or `SHUTDOWN` once the stream
//!   needs shutdown) without running, later launches are refused with it,
//!   and `query` / `synchronize` return the first error.
//! - Launch-time checks: sizes, host-buffer leases, stream state, injected
//!   faults; a refused launch enqueues nothing and drops its completion.
//!   Run-time checks: every chunk of a device address must lie inside a live
//!   allocation of the runtime, else the operation fails with
//!   `EXECUTION_FAILED` and moves no byte.
//! - `pipeline_barrier` has no observable effect: a stream never overlaps
//!   its operations anyway.
//! - Dropping a runtime lets pending work finish, then joins its engines;
//!   [`live_engine_threads`] counts the engine threads alive in the process.
//!
//! Launches enter through [`MockStream::enqueue`] with an [`Op`] (the
//! [`Stream`](flex_rt::Stream) methods use it) or
//! [`MockStream::enqueue_raw`], its form for a C-ABI layer: such a layer
//! has its own [`HostSource`] / [`HostSink`] over raw pointers, and passes
//! a C host function and completion as a plain function and three context
//! words ([`RawHostFn`] with [`Op::raw_host_fn`], and [`RawCompletion`]),
//! which a launch carries without a heap allocation: blocks allocated by
//! the launching thread and freed by an engine make the two meet, under
//! glibc, at the allocator's lock on every launch once the engine's thread
//! cache for their size is full.
//!
//! A launch on a stream with an operation running or work queued takes only
//! that stream's lock: nothing the engines decide by changes. A launch on
//! an idle stream, an event record, a wait, and any launch on a stream
//! that has failed, needs shutdown or has a `fail_nth_launch` fault set (or
//! of a runtime with the use-after-free detector on) take the runtime's
//! scheduler lock, which the engines take to pick work.
//!
//! # Events
//!
//! [`MockRuntime`] implements flex.h 1.1's events ([`MockEvent`]). A record
//! marks the end of its stream's FIFO: when the stream has finished
//! everything enqueued before it, the event completes and takes its
//! timestamp (at once on a stream with nothing unfinished; elapsed times
//! follow the timing model, the record itself takes no time), and if the
//! stream has failed first the event fails with `STREAM_FAILED` naming
//! the stream's first error (`SHUTDOWN` on a stream that needs shutdown). The
//! record is no operation an engine has to take — the engine finishing the
//! operation before it completes it — except when it carries a completion:
//! then it is a marker operation ([`Op::Record`]) in the FIFO, which an
//! engine takes in the ready order like any operation, to complete the
//! event and then call the completion: until then the event is pending
//! (so higher-priority work, even launched later, can delay it), but its
//! time is when its stream got to the record, however long the marker
//! then waited for an engine. A wait is a
//! *gate* in the waiting stream: the scheduler holds the operations
//! enqueued after it until the record has completed, and looks again each
//! time an operation of the recording stream finishes; no thread, engine
//! or host, is parked on it. A wait on a pending (or failed) record is also work of
//! the waiting stream, as in CUDA: a marker operation behind the gate, so
//! the stream's `query` says not ready and its `synchronize` returns only
//! once the wait has passed.
//! A gate whose record failed fails the waiting stream from that point on,
//! with an error naming the recording stream. `Event::notify` registers a
//! completion on the pending record itself (nothing is enqueued); the
//! engine that settles the record calls it. With
//! [`MockSystemBuilder::device_side_wait`]`(false)` (or
//! `SPYRE_MOCK_DEVICE_SIDE_WAIT=0`) the device behaves like today's Spyre
//! card instead: [`Runtime::capabilities`](flex_rt::Runtime::capabilities)
//! says so and a wait blocks the calling thread until the event completes.
//!
//! # Memory
//!
//! `memory_bytes` per runtime (default 1 GiB) in regions of `region_bytes`
//! (default 256 MiB, or the whole memory when smaller), backed lazily; a
//! region larger than the host memory available is refused with
//! `OUT_OF_MEMORY` when first written. Allocations are 128-byte aligned and
//! may span several chunks; see [`Runtime::allocate`](flex_rt::Runtime::allocate).
//!
//! # Compute
//!
//! The program at a compute address is a 128-byte
//! [`KernelDescriptor`](flex_rt::program::KernelDescriptor) of the device
//! contract naming one of the kernels copy, fill, add, mul, axpy and matmul; results
//! equal the host functions in [`reference`](mod@reference) bit for bit.
//!
//! # Timing and faults
//!
//! Optional per-operation latency and copy bandwidth make work take time
//! (default: as fast as the host allows). For tests, [`SystemFaults`],
//! [`RuntimeFaults`] and the fault methods of [`MockStream`] make runtime
//! creation, stream creation or a chosen launch fail, put a stream into the
//! needs-shutdown state, or slow a stream down.
//!
//! # Environment
//!
//! [`MockSystem::from_env`] reads (decimal numbers but the sync policy, the
//! three booleans and the device list; unset or empty keeps the default):
//!
//! | variable                    | meaning                                   | default   |
//! |-----------------------------|-------------------------------------------|-----------|
//! | `SPYRE_MOCK_DEVICES`        | number of logical devices                 | 1         |
//! | `SPYRE_MOCK_MEMORY_BYTES`   | device memory per runtime, bytes          | 1073741824 |
//! | `SPYRE_MOCK_REGION_BYTES`   | size of one memory region, bytes          | 268435456 |
//! | `SPYRE_MOCK_ENGINES`        | engine threads per runtime                | 2         |
//! | `SPYRE_MOCK_OP_LATENCY_US`  | time an operation takes at least, from its start, the host's work on it included (a copy's bytes at the bandwidth added), microseconds, 0..=1000000 (at most 1 s) | 0 |
//! | `SPYRE_MOCK_COPY_BANDWIDTH` | H2D/D2H bandwidth, bytes per second, at least 1000000 (1 MB/s) | unlimited |
//! | `SPYRE_MOCK_DEVICE_SIDE_WAIT` | whether streams wait on events on the device side (a boolean); `0` models today's card, where a wait blocks the host | on |
//! | `SPYRE_MOCK_EVENT_TIMING` | whether events created with timing take timestamps (a boolean); `0` models a card that cannot time events: the capability says so and elapsed times are refused with `UNSUPPORTED` ([`MockConfig::event_timing`]) | on |
//! | `SPYRE_MOCK_CHECK_REUSE`       | the use-after-free detector (a boolean): every copy, fill and compute that touches memory an allocator handed out again while an operation of the previous owner on it has not completed fails, naming both ([`MockConfig::check_reuse`]) | off |
//! | `SPYRE_DEVICES`             | the devices the process may see, in its order, like `CUDA_VISIBLE_DEVICES`: `2,3` makes logical device 0 device 2; distinct indices below the device count | every device |
//! | `SPYRE_MOCK_SYNC_POLICY`    | how `synchronize` waits: `auto` (spin 20 µs per call, then block), `spin` or `yield` (until done), `blocking` ([`flex_rt::SyncPolicy`]); idle engines spin 20 µs before they park: under `auto` one idle engine at a time, and only while no engine is busy (the others park at once, leaving the cores to the threads that launch and to the engines that work; a busy engine that sees more ready streams wakes one), under `spin` and `yield` every one, under `blocking` none; a timed operation (`SPYRE_MOCK_OP_LATENCY_US`, `SPYRE_MOCK_COPY_BANDWIDTH`) spins the last 60 µs of its modelled time (as many engines at once as the process has cores but one, none on one core; the others sleep), but under `blocking`, where it sleeps all of it | `auto` |
//!
//! # The shared library
//!
//! The crate `spyre-mock-capi` builds this device as a flex runtime library
//! (`libspyre_mock_capi.so`) that exports every function of `flex.h`, so
//! flex-sys's loader and flex-rt's hardware backend run against a real
//! dynamically loaded library without a Spyre card; its `SPYRE_MOCK_*`
//! misbehaviour switches are documented there. This crate has no `unsafe`
//! code.
#![forbid(unsafe_code)]

pub mod config;
mod engine;
mod event;
mod faults;
mod inbox;
mod kernel;
mod memory;
mod op;
mod progress;
mod raw_call;
mod ready;
mod record;
pub mod reference;
mod reuse;
mod runtime;
mod scheduler;
mod stream;
pub mod sync;
mod system;

#[cfg(test)]
mod tests;

pub use config::{MockConfig, MockSystemBuilder};
pub use engine::live_engine_threads;
pub use event::MockEvent;
pub use faults::{RuntimeFaults, SystemFaults};
pub use memory::BoundedAllocation;
pub use op::{HostFn, HostSink, HostSource, Op, encode_fill_value};
pub use raw_call::{RawCompletion, RawContext, RawHostFn};
pub use record::EventRecord;
pub use runtime::MockRuntime;
pub use stream::MockStream;
pub use system::MockSystem;

#[cfg(test)]
mod assertions {
    use super::*;

    static_assertions::assert_impl_all!(MockSystem: Send, Sync, Clone, flex_rt::Backend);
    static_assertions::assert_impl_all!(MockRuntime: Send, Sync, flex_rt::Runtime);
    static_assertions::assert_impl_all!(MockStream: Send, Sync, flex_rt::Stream);
    static_assertions::assert_impl_all!(SystemFaults: Send, Sync);
    static_assertions::assert_impl_all!(RuntimeFaults: Send, Sync);
    static_assertions::assert_impl_all!(Op: Send);
}

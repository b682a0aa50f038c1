//! Live handles: which `flex_runtime_t *`, `flex_stream_t *` and
//! `flex_event_t *` values this library handed out and has not destroyed,
//! and the state behind them.
//!
//! A runtime handle is the address of a [`RuntimeHandle`] box
//! (`Box::into_raw`); a stream handle is the address of a [`MockStream`]
//! owned by its runtime (streams never move). Neither is ever dereferenced
//! to validate it: every call looks the address up in a process-wide
//! table, and a null, foreign or destroyed address is
//! `FLEX_ERROR_INVALID_HANDLE`.
//!
//! Runtimes and streams, read by every call and changed only when one is
//! created or destroyed, live in an immutable [`Handles`] snapshot behind
//! an [`Rcu`]: a call reads the current snapshot in a read section
//! ([`snapshot`]: no lock, no read-modify-write, no reference count) and
//! looks the handle up in it; a create or destroy publishes a changed copy.
//! A create, or a stream's destroy, leaves the old copy to be dropped by a
//! later change once no call can still read it (it does not wait for the
//! calls in flight: a caller switched out mid-call holds up nobody); a
//! runtime's destroy waits until no call can read any older copy, and
//! drops them all, so its state is not kept alive by a copy. The snapshot
//! a call reads keeps the runtime's state alive until the call returns,
//! even if another thread breaks flex.h and destroys the runtime
//! meanwhile. A snapshot holds every runtime, and a runtime's destroy
//! waits for every open read section: so a call that blocks
//! (`flex_stream_synchronize`, `flex_stream_destroy`, a host-side
//! `flex_stream_wait_event`) takes one reference to its own runtime and
//! ends its section ([`held_stream`]), and `flex_runtime_destroy` of
//! another runtime does not wait for it. Events, created and destroyed far
//! more often, are in a table behind a mutex and handed out as `Arc`s.
//!
//! A destroyed stream (`flex_stream_destroy`) leaves the table and is
//! recorded as retired in its runtime; its memory lives until the runtime
//! is destroyed, as the device's streams are append-only. An address freed
//! by `flex_runtime_destroy` may be reused by a later runtime or stream of
//! this library, like any pointer handle; until then it is rejected.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};

use flex_rt::{Event, Stream};
use flex_sys::bindings::{
    FLEX_ERROR_RUNTIME_FAILED, FLEX_ERROR_UNSUPPORTED, flex_event_t, flex_runtime_t, flex_stream_t,
};
use flex_sys::fork::ForkGeneration;
use spyre_mock::sync::Mutex;
use spyre_mock::{MockRuntime, MockStream};

use crate::boundary::Failure;
use crate::environment::Switches;
use crate::host_side::in_callback_of;
use crate::late_completions::LateThread;
use crate::rcu::{self, Rcu};

/// Everything behind one runtime handle.
///
/// Fields drop in order: the device first (its drop waits for queued work
/// and joins the engines, whose completions may still go to the delivery
/// thread), then the delivery thread (stopped after it has delivered
/// everything, and joined).
pub(super) struct RuntimeState {
    /// This runtime's number, never given to another runtime of the
    /// process (unlike an address, which a later runtime may reuse): what
    /// its callbacks are recognised by ([`RuntimeState::key`]), and what a
    /// destroy checks that the handle it removes is still this runtime's
    /// ([`unregister_runtime`]).
    pub(super) serial: usize,
    pub(super) runtime: MockRuntime,
    pub(super) late: Option<LateThread>,
    pub(super) switches: Switches,
    /// Ids of streams destroyed with `flex_stream_destroy`.
    pub(super) retired: Mutex<BTreeSet<u64>>,
    /// Set as `flex_runtime_destroy` takes the runtime out of the handle
    /// table (under the table's writers' lock): a stream or event
    /// registered by a call that found the runtime live before, racing
    /// that destroy, is refused instead of being left in a table that no
    /// longer has its runtime ([`register_stream`], [`register_event`]).
    pub(super) destroyed: AtomicBool,
    /// The `fork()` generation the runtime was created in: a forked child
    /// has none of its engine threads, so every call on it there fails
    /// ([`RuntimeState::check_not_forked`]).
    pub(super) fork: ForkGeneration,
}

impl RuntimeState {
    /// A number that identifies this runtime, for recognising its
    /// callbacks on a thread: its [`RuntimeState::serial`], so that a
    /// completion of a runtime destroyed meanwhile is never taken for one
    /// of a later runtime made at the same address.
    pub(super) fn key(&self) -> usize {
        self.serial
    }

    /// A serial number for a new runtime: 1, 2, ... in the process.
    pub(super) fn next_serial() -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// `FLEX_ERROR_RUNTIME_FAILED` in a child forked after the runtime was
    /// created: its engines do not exist there, so work would never run
    /// and a wait would never end. One relaxed atomic load.
    #[inline]
    pub(super) fn check_not_forked(&self) -> Result<(), Failure> {
        if self.fork.is_current() {
            Ok(())
        } else {
            Err(forked())
        }
    }

    /// Fails with [`crate::environment::UNDEFINED_STATUS`] when the switches name `call`.
    pub(super) fn check_switch(&self, call: &str) -> Result<(), Failure> {
        undefined_status_check(&self.switches, call)
    }

    /// Blocks until stream `id` has no queued operation and no pending late
    /// completion. Errors of the stream are not this wait's business.
    pub(super) fn drain_stream(&self, stream: &MockStream) {
        let _ = stream.synchronize();
        if let Some(late) = &self.late {
            late.queue().wait_idle(Some(stream.id()));
        }
    }

    /// Blocks until every stream is idle and no completion is pending,
    /// including work that completions launched meanwhile.
    ///
    /// A completion can launch onto a stream after the check below has
    /// found that stream idle, and return before the check ends, so that
    /// every stream and the delivery queue look idle while the launch is
    /// queued. The check is therefore framed by two readings of the
    /// streams' enqueued counts ([`RuntimeState::enqueued`]). If both find
    /// the same, nothing was enqueued between them, and every operation
    /// enqueued before the first was found complete, its completion
    /// returned: no code of the runtime is left running that could launch
    /// more (flex.h forbids other threads to use the runtime meanwhile).
    pub(super) fn drain_all(&self) {
        loop {
            for stream in self.streams() {
                self.drain_stream(stream);
            }
            // And the completions of no stream (`flex_event_notify`'s):
            // blocked on here, not looped on below.
            if let Some(late) = &self.late {
                late.queue().wait_idle(None);
            }
            let before = self.enqueued();
            let streams_idle = self
                .streams()
                .all(|stream| stream.pending_operations() == 0);
            let late_idle = self
                .late
                .as_ref()
                .is_none_or(|late| late.queue().pending(None) == 0);
            #[cfg(test)]
            if let Some(launch) = LAUNCH_DURING_DRAIN_CHECK.take() {
                launch();
            }
            if streams_idle && late_idle && self.enqueued() == before {
                return;
            }
        }
    }

    /// The number of streams and the operations enqueued on them so far:
    /// both only grow, so two equal readings mean no stream was created
    /// and nothing was enqueued in between.
    fn enqueued(&self) -> (usize, u64) {
        self.streams()
            .fold((0, 0), |(streams, operations), stream| {
                (streams + 1, operations + stream.enqueued_operations())
            })
    }

    /// Every stream of the runtime, destroyed ones too (their memory lives
    /// until the runtime's destroy), in id order.
    pub(super) fn streams(&self) -> impl Iterator<Item = &MockStream> {
        (0..self.runtime.stream_count() as u64).filter_map(|id| self.runtime.mock_stream(id))
    }
}

#[cfg(test)]
thread_local! {
    /// Called once, if set, by [`RuntimeState::drain_all`] on this thread
    /// between its check and its second reading. A launch made there
    /// stands for one made by a completion that runs after the check has
    /// passed the stream launched on, and returns before the check ends.
    pub(super) static LAUNCH_DURING_DRAIN_CHECK: RefCell<Option<Box<dyn FnOnce()>>> =
        const { RefCell::new(None) };
}

/// The failure of a call on a runtime created before a `fork()`, in the
/// child.
#[cold]
fn forked() -> Failure {
    Failure::new(
        FLEX_ERROR_RUNTIME_FAILED,
        "this runtime was created by the parent process before fork(); a forked child has none of its device threads and cannot use it (nor its streams and events, nor destroy it): create a runtime in the child",
    )
}

/// `Err` with [`crate::environment::UNDEFINED_STATUS`] when `switches` name `call`.
/// Inlined into every call; the error path is out of line.
#[inline]
pub(super) fn undefined_status_check(switches: &Switches, call: &str) -> Result<(), Failure> {
    if switches.undefined_status_for(call) {
        Err(undefined_status_failure(switches, call))
    } else {
        Ok(())
    }
}

/// The failure of `call` when the switches name it.
#[cold]
fn undefined_status_failure(switches: &Switches, call: &str) -> Failure {
    Failure::new(
        crate::environment::UNDEFINED_STATUS,
        format!(
            "{call} returned status {} on purpose ({}={})",
            crate::environment::UNDEFINED_STATUS,
            crate::environment::ENV_UNDEFINED_STATUS,
            switches.undefined_status.join(",")
        ),
    )
}

/// What a `flex_runtime_t *` points to.
pub(super) struct RuntimeHandle {
    /// Owned by the handle; the table holds another reference.
    _state: Arc<RuntimeState>,
}

/// A live stream handle: its runtime, its id there and the device stream,
/// borrowed from the [`Snapshot`] the call holds.
pub(super) struct StreamRef<'a> {
    pub(super) state: &'a Arc<RuntimeState>,
    pub(super) id: u64,
    mock: &'a MockStream,
}

/// A live stream handle whose runtime the call holds itself, not through
/// a [`Snapshot`]: for calls that block. A snapshot held while blocked
/// would hold up the destroy of any runtime (which waits for every open
/// snapshot) and any change past [`MAX_RETIRED_ENTRIES`] in retired snapshots,
/// and with them `fork()` (whose handler takes the table's writers'
/// lock).
pub(super) struct HeldStream {
    state: Arc<RuntimeState>,
    id: u64,
    /// The device stream, which lives as long as `state` does.
    mock: NonNull<MockStream>,
}

impl HeldStream {
    /// The stream, borrowed from this hold.
    pub(super) fn get(&self) -> StreamRef<'_> {
        StreamRef {
            state: &self.state,
            id: self.id,
            // SAFETY: `mock` is the address of a stream of `state`'s
            // runtime (`held_stream`), whose streams never move and live
            // as long as it does; `self.state` keeps it alive for the
            // borrow.
            mock: unsafe { self.mock.as_ref() },
        }
    }
}

/// A live stream handle, held by the call ([`HeldStream`]).
///
/// # Errors
/// As [`Snapshot::stream`].
pub(super) fn held_stream(handle: *mut flex_stream_t) -> Result<HeldStream, Failure> {
    let snapshot = snapshot();
    let stream = snapshot.stream(handle)?;
    Ok(HeldStream {
        state: Arc::clone(stream.state),
        id: stream.id,
        mock: NonNull::from(stream.mock),
    })
}

impl<'a> StreamRef<'a> {
    /// The device stream.
    pub(super) fn mock(&self) -> &'a MockStream {
        self.mock
    }
}

#[derive(Clone)]
struct Entry {
    runtime: Arc<RuntimeState>,
    id: u64,
}

/// What a `flex_event_t *` points to: the device event and its runtime.
pub(super) struct EventEntry {
    pub(super) state: Arc<RuntimeState>,
    pub(super) event: Box<dyn Event>,
}

/// The live runtimes and streams: replaced as a whole, never changed in
/// place.
#[derive(Clone)]
pub(super) struct Handles {
    /// Runtime handle address → state.
    runtimes: BTreeMap<usize, Arc<RuntimeState>>,
    /// Stream handle address → runtime and id.
    streams: BTreeMap<usize, Entry>,
}

/// The live runtimes and streams. Its writers' lock is a `std` mutex, as
/// is [`EVENTS`]: released after a `fork()` in the child
/// ([`keep_locks_across_fork`]), its unlock is an atomic swap and at most a
/// futex wake, with no lock of its own.
static HANDLES: Rcu<Handles> = Rcu::weighed(
    Handles {
        runtimes: BTreeMap::new(),
        streams: BTreeMap::new(),
    },
    Handles::entries,
    MAX_RETIRED_ENTRIES,
);

/// How many entries (runtimes and streams) the old copies of the table
/// that changes leave to later ones may hold in all, before a change waits
/// for the calls that may read them and frees them (past
/// [`rcu::MIN_RETIRED`] copies, however large the table; and never more
/// than [`rcu::MAX_RETIRED`] copies): the memory a call that sits in the
/// library (switched out, say) can hold up without holding up a change.
/// An entry of a copy takes about 50 bytes, so this is about 6.5 MB, or 8
/// copies of a table of more than 16 384 entries: 244 copies of eight
/// runtimes' 66 streams, 32 copies of 4 000 streams (with a bound of 256
/// copies alone, 4 000 streams held 50 MB). Copies no call reads any more
/// are freed by the next change without waiting, and do not count. A
/// smaller bound makes changes wait: 64 copies of a small table did, in
/// about one stream creation in a hundred, under twelve busy callers on two
/// CPUs (`ffi_create` in BENCHMARKS.md). Old copies are freed only by later
/// changes: after a burst of them, they stay allocated until the next
/// change.
const MAX_RETIRED_ENTRIES: usize = 1 << 17;

impl Handles {
    /// The entries of the table, runtimes and streams: what a copy weighs.
    fn entries(&self) -> usize {
        self.runtimes.len() + self.streams.len()
    }
}

/// Event handle address (of the `EventEntry` inside the `Arc`) → event.
static EVENTS: std::sync::Mutex<BTreeMap<usize, Arc<EventEntry>>> =
    std::sync::Mutex::new(BTreeMap::new());

/// [`EVENTS`]'s guard (every change of the table is one map operation).
fn events() -> std::sync::MutexGuard<'static, BTreeMap<usize, Arc<EventEntry>>> {
    EVENTS.lock().unwrap_or_else(PoisonError::into_inner)
}

type HeldAcrossFork = (
    std::sync::MutexGuard<'static, rcu::Retired<Handles>>,
    std::sync::MutexGuard<'static, BTreeMap<usize, Arc<EventEntry>>>,
);

thread_local! {
    /// The guards [`lock_before_fork`] took, on the forking thread, until
    /// [`unlock_after_fork`] drops them. `ManuallyDrop`, so that the
    /// thread-local has no destructor to register: registering one takes
    /// the dynamic loader's lock, which a thread in `dlopen` may hold while
    /// it waits for the lock `fork()` holds around these handlers.
    static HELD_ACROSS_FORK: RefCell<Option<ManuallyDrop<HeldAcrossFork>>> =
        const { RefCell::new(None) };
}

/// Keeps the library's process-wide locks ([`HANDLES`]' writers', [`EVENTS`])
/// usable in a forked child: `fork()` copies a lock that another thread
/// holds as held, for ever, and the child's first call that takes it would
/// block for ever. Registers `pthread_atfork` handlers once per process:
/// before a fork the forking thread takes both locks (code elsewhere never
/// holds both; a writer of the table holds its lock while it may wait for
/// the calls reading the table, and none of those waits for either lock
/// but [`EVENTS`], which is never held while waiting) and keeps their guards in a
/// thread-local; after it, in the parent and in the child (whose one thread
/// is the forking thread's copy), it drops them. Dropping them allocates
/// nothing and takes no other lock, as the child of a multi-threaded
/// process requires.
///
/// # Errors
/// `FLEX_ERROR_RUNTIME_FAILED` naming the `errno` of `pthread_atfork`
/// (`ENOMEM`); a later call tries again.
pub(super) fn keep_locks_across_fork() -> Result<(), Failure> {
    static DONE: AtomicBool = AtomicBool::new(false);
    static REGISTERING: Mutex<()> = Mutex::new(());
    if DONE.load(Ordering::Acquire) {
        return Ok(());
    }
    let _registering = REGISTERING.lock();
    if DONE.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: `pthread_atfork` only stores the function pointers; the
    // handlers are plain `extern "C" fn`s with no arguments that live for
    // the whole program and touch only this module's statics and
    // thread-local (see their docs).
    let status = unsafe {
        libc::pthread_atfork(
            Some(lock_before_fork),
            Some(unlock_after_fork),
            Some(unlock_after_fork),
        )
    };
    if status != 0 {
        return Err(Failure::new(
            FLEX_ERROR_RUNTIME_FAILED,
            format!(
                "cannot keep this library's locks across fork() (pthread_atfork failed: {})",
                std::io::Error::from_raw_os_error(status)
            ),
        ));
    }
    DONE.store(true, Ordering::Release);
    Ok(())
}

/// `pthread_atfork`'s prepare handler: takes both locks, in the parent,
/// and keeps their guards on this thread for the fork.
extern "C" fn lock_before_fork() {
    let held = ManuallyDrop::new((HANDLES.lock_writers(), events()));
    HELD_ACROSS_FORK.with(|slot| *slot.borrow_mut() = Some(held));
}

/// `pthread_atfork`'s parent and child handler: drops the guards
/// [`lock_before_fork`] kept, releasing both locks.
extern "C" fn unlock_after_fork() {
    if let Some(held) = HELD_ACROSS_FORK.with(|slot| slot.borrow_mut().take()) {
        drop(ManuallyDrop::into_inner(held));
    }
}

/// The live runtimes and streams as a call sees them: read for the call
/// (a call that blocks holds its stream instead, [`HeldStream`]). A
/// runtime's destroy waits until this is dropped (and any change of the
/// table may wait, past [`MAX_RETIRED_ENTRIES`] in old copies): a call drops it
/// before it changes the table.
pub(super) struct Snapshot(rcu::Read<'static, Handles>);

/// The current snapshot of the live runtimes and streams.
#[inline]
pub(super) fn snapshot() -> Snapshot {
    Snapshot(HANDLES.read())
}

/// Publishes `change` applied to a copy of the current snapshot; the old
/// one is dropped by a later change, once no call reads it
/// ([`Rcu::update`]).
///
/// # Panics
/// If this thread holds a [`Snapshot`] (it could wait for itself).
fn change_handles<T>(change: impl FnOnce(&mut Handles) -> T) -> T {
    HANDLES.update(change)
}

/// Registers a new event; returns its handle (the address of the entry,
/// never dereferenced: only looked up).
///
/// # Errors
/// `FLEX_ERROR_INVALID_HANDLE` if another thread destroyed the event's
/// runtime since the call found it (flex.h forbids that; the event is
/// dropped, and the destroy does not wait for it).
pub(super) fn register_event(entry: EventEntry) -> Result<*mut flex_event_t, Failure> {
    let entry = Arc::new(entry);
    let handle = Arc::as_ptr(&entry).cast_mut().cast::<flex_event_t>();
    let mut events = events();
    // `unregister_runtime` sets the flag before it takes this lock to
    // remove the runtime's events: seen clear here, under the lock, the
    // event is removed with the others.
    if entry.state.destroyed.load(Ordering::Relaxed) {
        drop(events);
        // Dropped outside the table's lock: dropping an event is device code.
        drop(entry);
        return Err(destroyed_meanwhile());
    }
    events.insert(handle as usize, entry);
    Ok(handle)
}

/// The failure of a create whose runtime another thread destroyed while
/// the call ran.
#[cold]
fn destroyed_meanwhile() -> Failure {
    Failure::invalid_handle(
        "the runtime was destroyed by another thread while this call ran (flex.h forbids destroying a runtime in use)",
    )
}

/// The entry of a live event handle; the `Arc` keeps it alive for the call
/// even if another thread destroys the handle meanwhile.
///
/// # Errors
/// `FLEX_ERROR_INVALID_HANDLE` for NULL or an address that is not a live
/// event of this library.
pub(super) fn event(handle: *mut flex_event_t) -> Result<Arc<EventEntry>, Failure> {
    if handle.is_null() {
        return Err(Failure::invalid_handle("the event handle is NULL"));
    }
    let entry = events()
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(|| {
            Failure::invalid_handle(format!(
                "{handle:p} is not a live event of this library (never created by it, destroyed, or its runtime was destroyed)"
            ))
        })?;
    entry.state.check_not_forked()?;
    Ok(entry)
}

/// Removes an event handle of `state` from the table; the event is dropped
/// when the last call using it returns (a drop never blocks).
///
/// # Errors
/// `FLEX_ERROR_INVALID_HANDLE` for NULL, an address that is not a live
/// event, or an event of another runtime (which stays live).
pub(super) fn unregister_event(
    state: &Arc<RuntimeState>,
    handle: *mut flex_event_t,
) -> Result<(), Failure> {
    let entry = event(handle)?;
    if !Arc::ptr_eq(&entry.state, state) {
        return Err(Failure::invalid_handle(format!(
            "{handle:p} is an event of another runtime"
        )));
    }
    let removed = events().remove(&(handle as usize));
    drop(entry);
    // Dropped outside the table's lock: dropping an event is device code.
    match removed {
        Some(removed) => {
            drop(removed);
            Ok(())
        }
        // Another destroy of the same handle took it out meanwhile: this
        // one, as one that came after it, finds no live event.
        None => Err(Failure::invalid_handle(format!(
            "event {handle:p} was destroyed by another thread during this call"
        ))),
    }
}

/// The handle of a device stream.
pub(super) fn stream_handle(stream: &MockStream) -> *mut flex_stream_t {
    std::ptr::from_ref(stream).cast_mut().cast()
}

/// Registers a new runtime and its default stream; returns the runtime
/// handle.
pub(super) fn register_runtime(state: Arc<RuntimeState>) -> *mut flex_runtime_t {
    let default = stream_handle(state.runtime.default_mock_stream()) as usize;
    let handle = Box::into_raw(Box::new(RuntimeHandle {
        _state: Arc::clone(&state),
    }));
    change_handles(|handles| {
        handles.streams.insert(
            default,
            Entry {
                runtime: Arc::clone(&state),
                id: 0,
            },
        );
        handles.runtimes.insert(handle as usize, state);
    });
    handle.cast()
}

/// Registers stream `id` of `state`; returns its handle.
///
/// # Errors
/// `FLEX_ERROR_INVALID_HANDLE` if another thread destroyed the runtime
/// since the call found it (flex.h forbids that; the stream stays with the
/// runtime, unregistered).
pub(super) fn register_stream(
    state: &Arc<RuntimeState>,
    stream: &MockStream,
) -> Result<*mut flex_stream_t, Failure> {
    let handle = stream_handle(stream);
    change_handles(|handles| {
        // Set under this lock by `unregister_runtime`.
        if state.destroyed.load(Ordering::Relaxed) {
            return Err(destroyed_meanwhile());
        }
        handles.streams.insert(
            handle as usize,
            Entry {
                runtime: Arc::clone(state),
                id: stream.id(),
            },
        );
        Ok(handle)
    })
}

impl Snapshot {
    /// The state of a live runtime handle.
    ///
    /// # Errors
    /// `FLEX_ERROR_INVALID_HANDLE` for NULL or an address that is not a
    /// live runtime of this library.
    pub(super) fn runtime(
        &self,
        handle: *mut flex_runtime_t,
    ) -> Result<&Arc<RuntimeState>, Failure> {
        if handle.is_null() {
            return Err(Failure::invalid_handle("the runtime handle is NULL"));
        }
        let state = self.0.runtimes.get(&(handle as usize)).ok_or_else(|| {
            Failure::invalid_handle(format!(
                "{handle:p} is not a live runtime of this library (never created by it, or destroyed)"
            ))
        })?;
        state.check_not_forked()?;
        Ok(state)
    }

    /// The runtime and id of a live stream handle.
    ///
    /// # Errors
    /// `FLEX_ERROR_INVALID_HANDLE` for NULL or an address that is not a
    /// live stream of this library.
    pub(super) fn stream(&self, handle: *mut flex_stream_t) -> Result<StreamRef<'_>, Failure> {
        if handle.is_null() {
            return Err(Failure::invalid_handle("the stream handle is NULL"));
        }
        let entry = self.0.streams.get(&(handle as usize)).ok_or_else(|| {
            Failure::invalid_handle(format!(
                "{handle:p} is not a live stream of this library (never created by it, destroyed, or its runtime was destroyed)"
            ))
        })?;
        entry.runtime.check_not_forked()?;
        // SAFETY: only `register_runtime` and `register_stream` put a
        // stream address in the table: `stream_handle` of a stream of
        // `entry.runtime`, whose streams never move and live as long as
        // it does (the device's streams are append-only). This snapshot
        // holds that runtime's state for the borrow.
        let mock = unsafe { &*handle.cast_const().cast::<MockStream>() };
        Ok(StreamRef {
            state: &entry.runtime,
            id: entry.id,
            mock,
        })
    }
}

/// The state of a live runtime handle, kept alive by the returned `Arc`
/// (for calls that are not on the hot path).
///
/// # Errors
/// As [`Snapshot::runtime`].
pub(super) fn runtime(handle: *mut flex_runtime_t) -> Result<Arc<RuntimeState>, Failure> {
    snapshot().runtime(handle).cloned()
}

/// Removes a stream handle from the table and records the stream as
/// retired in its runtime. `false` if it was not there.
pub(super) fn retire_stream(handle: *mut flex_stream_t) -> bool {
    let removed = change_handles(|handles| handles.streams.remove(&(handle as usize)));
    match removed {
        Some(entry) => {
            entry.runtime.retired.lock().insert(entry.id);
            true
        }
        None => false,
    }
}

/// Removes a runtime handle and all its streams from the table, frees the
/// handle box, and returns the state. `None` if the handle was not live or
/// is no longer the runtime numbered `serial` (destroyed by another thread
/// since, and its address given to a new runtime: that one stays).
pub(super) fn unregister_runtime(
    handle: *mut flex_runtime_t,
    serial: usize,
) -> Option<Arc<RuntimeState>> {
    // Waits for the calls reading older snapshots, and drops those still
    // retired: once this returns, none of them keeps the state alive (a
    // concurrent change may still be dropping ones it took out of the list
    // before; the destroy waits for every other reference anyway).
    let state = HANDLES.update_and_synchronize(|handles| {
        if handles.runtimes.get(&(handle as usize))?.serial != serial {
            return None;
        }
        let state = handles.runtimes.remove(&(handle as usize))?;
        state.destroyed.store(true, Ordering::Relaxed);
        handles
            .streams
            .retain(|_, entry| !Arc::ptr_eq(&entry.runtime, &state));
        Some(state)
    })?;
    let removed = {
        let mut events = events();
        let (gone, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut *events)
            .into_iter()
            .partition(|(_, entry)| Arc::ptr_eq(&entry.state, &state));
        *events = kept;
        gone
    };
    // Dropped outside the table's lock: dropping an event is device code.
    drop(removed);
    // SAFETY: the address was in the table, and only `register_runtime`
    // puts one there: the value of `Box::into_raw` of a `RuntimeHandle`.
    // Removing it from the table (above, under the writers' lock, from the
    // latest snapshot) is the only way to get here, and a later snapshot
    // no longer has it, so this reclaims the box exactly once; no code
    // dereferences runtime handle addresses (snapshots hold the state's
    // `Arc`, not the box).
    drop(unsafe { Box::from_raw(handle.cast::<RuntimeHandle>()) });
    Some(state)
}

/// The stream handles of a live runtime (for tests).
#[cfg(test)]
pub(super) fn live_streams_of(state: &Arc<RuntimeState>) -> usize {
    snapshot()
        .0
        .streams
        .values()
        .filter(|entry| Arc::ptr_eq(&entry.runtime, state))
        .count()
}

/// Refuses a call that would wait for the callback this thread is running.
pub(crate) fn refuse_in_callback(state: &Arc<RuntimeState>, call: &str) -> Result<(), Failure> {
    if in_callback_of(state.key()) {
        Err(Failure::new(
            FLEX_ERROR_UNSUPPORTED,
            format!(
                "{call} was called from a completion or host function of the same runtime, which flex.h forbids; it would wait for itself"
            ),
        ))
    } else {
        Ok(())
    }
}

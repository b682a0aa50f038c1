//! Operation counters a server can export: per stream and for the device,
//! launched, completed and failed operations, bytes each way (of copies
//! that completed), and the current and highest number of operations in
//! flight.
//!
//! Off until [`enable_counters`] (while off, and the trace too, a launch
//! pays one relaxed load for both).
//! On, a launch adds to its stream's counters and carries a completion that
//! counts its outcome and, for a copy that completed, its bytes; a
//! [`counters`] snapshot reads relaxed atomics and
//! takes no lock. Operations launched while the counters were off are not
//! counted, not even when they complete later.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use flex_rt::{FlexError, LaunchOptions};

use crate::id::{MAX_STREAM_SLOTS, StreamId};
use crate::instrument;
use crate::stream::SpyreStream;

struct Slot {
    launched: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    bytes_h2d: AtomicU64,
    bytes_d2h: AtomicU64,
    max_in_flight: AtomicU64,
}

impl Slot {
    /// Every count at zero.
    const fn new() -> Self {
        Self {
            launched: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            bytes_h2d: AtomicU64::new(0),
            bytes_d2h: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
        }
    }
}

/// The device as a whole: its launches, finishes and the most in flight
/// at once over all streams.
static DEVICE: Slot = Slot::new();

/// One per stream id the pool can hand out ([`StreamId::slot`]).
static SLOTS: [Slot; MAX_STREAM_SLOTS] = [const { Slot::new() }; MAX_STREAM_SLOTS];

/// Which way an operation moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Host to device.
    H2d,
    /// Device to host.
    D2h,
    /// Neither.
    None,
}

/// The counters of one stream, or of the device (all its streams), at one
/// moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Operations launched.
    pub launched: u64,
    /// Operations that completed.
    pub completed: u64,
    /// Operations that failed (or were skipped because their stream had
    /// failed).
    pub failed: u64,
    /// Bytes copied host to device, by copies that completed (a copy that
    /// failed, or was skipped because its stream had failed, moved none).
    pub bytes_h2d: u64,
    /// Bytes copied device to host, by copies that completed.
    pub bytes_d2h: u64,
    /// Operations launched and not finished (`launched − completed −
    /// failed`).
    pub in_flight: u64,
    /// The most operations in flight at once (for the device: on all its
    /// streams together). A launch the runtime refused may have raised it
    /// for the moment it took to refuse.
    pub max_in_flight: u64,
}

/// A snapshot of [`counters`]: the device's totals and every stream that
/// launched anything, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// All streams together.
    pub device: Counters,
    /// Each stream that launched anything, in id order.
    pub streams: Vec<(SpyreStream, Counters)>,
}

/// Starts counting operations launched from now on (see the
/// [`counters`] snapshot). Counts start where an earlier enabling left
/// them.
pub fn enable_counters() {
    instrument::set(instrument::COUNTERS, true);
}

/// The counters of the process's device and its streams now: relaxed
/// reads, no lock; a snapshot taken while operations run may pair a
/// stream's counts from slightly different moments. All zero before
/// [`enable_counters`], and in a child forked after the start (the counts
/// it inherited are the parent's).
pub fn counters() -> CountersSnapshot {
    let mut snapshot = CountersSnapshot::default();
    if crate::runtime::check_not_forked().is_err() {
        return snapshot;
    }
    let device_index = crate::runtime::started_device().unwrap_or(0);
    for (id, slot) in SLOTS.iter().enumerate() {
        let launched = slot.launched.load(Ordering::Relaxed);
        if launched == 0 {
            continue;
        }
        let completed = slot.completed.load(Ordering::Relaxed);
        let failed = slot.failed.load(Ordering::Relaxed);
        let counters = Counters {
            launched,
            completed,
            failed,
            bytes_h2d: slot.bytes_h2d.load(Ordering::Relaxed),
            bytes_d2h: slot.bytes_d2h.load(Ordering::Relaxed),
            in_flight: launched.saturating_sub(completed + failed),
            max_in_flight: slot.max_in_flight.load(Ordering::Relaxed),
        };
        let device = &mut snapshot.device;
        device.launched += counters.launched;
        device.completed += counters.completed;
        device.failed += counters.failed;
        device.bytes_h2d += counters.bytes_h2d;
        device.bytes_d2h += counters.bytes_d2h;
        device.in_flight += counters.in_flight;

        let stream = SpyreStream::from_parts(device_index, StreamId(id as i64));
        snapshot.streams.push((stream, counters));
    }
    snapshot.device.max_in_flight = DEVICE.max_in_flight.load(Ordering::Relaxed);
    snapshot
}

/// Counts a launch on `stream` about to be made, and returns the options
/// with a completion that counts its outcome and, if it succeeded, the
/// `bytes` it moved in `direction` (then calls the caller's).
/// Call only when the counters are on; `refused` undoes the count of a launch the
/// runtime refused.
pub(crate) fn counted(
    stream: SpyreStream,
    direction: Direction,
    bytes: u64,
    options: LaunchOptions,
) -> (LaunchOptions, Counted) {
    let Some(slot) = stream.id().slot().map(|slot| &SLOTS[slot]) else {
        return (options, Counted(None));
    };
    for counts in [slot, &DEVICE] {
        let launched = counts.launched.fetch_add(1, Ordering::Relaxed) + 1;
        let finished =
            counts.completed.load(Ordering::Relaxed) + counts.failed.load(Ordering::Relaxed);
        counts
            .max_in_flight
            .fetch_max(launched.saturating_sub(finished), Ordering::Relaxed);
    }
    let LaunchOptions {
        pipeline_barrier,
        completion,
    } = options;
    let called = Arc::new(AtomicBool::new(false));
    let counted = Counted(Some((slot, Arc::clone(&called))));
    let counting = Box::new(move |outcome: Result<(), FlexError>| {
        called.store(true, Ordering::Relaxed);
        for counts in [slot, &DEVICE] {
            match outcome {
                Ok(()) => counts.completed.fetch_add(1, Ordering::Relaxed),
                Err(_) => counts.failed.fetch_add(1, Ordering::Relaxed),
            };
        }
        if outcome.is_ok() {
            // Only a copy that completed moved its bytes.
            match direction {
                Direction::H2d => slot.bytes_h2d.fetch_add(bytes, Ordering::Relaxed),
                Direction::D2h => slot.bytes_d2h.fetch_add(bytes, Ordering::Relaxed),
                Direction::None => 0,
            };
        }
        if let Some(completion) = completion {
            completion(outcome);
        }
    });
    (
        LaunchOptions {
            pipeline_barrier,
            completion: Some(counting),
        },
        counted,
    )
}

/// A counted launch, for its refusal to be taken back, and whether its
/// completion has been called.
pub(crate) struct Counted(Option<(&'static Slot, Arc<AtomicBool>)>);

impl Counted {
    /// The runtime refused the launch: it is not counted (its completion,
    /// which would count its outcome and bytes, is dropped uncalled). A
    /// launch whose completion was called stays counted (a backend that
    /// completes inside the launch, whose caller's completion then unwound
    /// out of it).
    pub(crate) fn refused(self) {
        if let Some((slot, called)) = self.0
            && !called.load(Ordering::Relaxed)
        {
            slot.launched.fetch_sub(1, Ordering::Relaxed);
            DEVICE.launched.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

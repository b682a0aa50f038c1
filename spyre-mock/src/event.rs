//! Events of the software device: a record is a mark at a position of its
//! stream, or a marker operation in its FIFO (see `record.rs`); a wait is a
//! gate in the waiting stream that the scheduler
//! holds closed until the record has completed. No thread ever parks on a
//! device-side wait.
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::sync::Mutex;
use flex_rt::{Completion, Event, FlexError, Notification, Result, Status};

use crate::engine::Device;
use crate::record::Record;

/// An event of a [`crate::MockRuntime`]; implements [`flex_rt::Event`].
///
/// Thread-safety: `Send + Sync`. Its latest record is replaced only under
/// the runtime's scheduler lock (so concurrent records are serialized, and
/// a wait, which reads it under that lock too, is placed against one whole
/// record); a query, a notification or a synchronize reads it under its own
/// small lock only (a synchronize of a pending record then waits as the
/// stream's synchronize does).
///
/// Once its runtime has been dropped (and its work has drained), the event
/// is destroyed with it, as `flex.h` destroys a runtime's events: its
/// calls fail with [`Status::INVALID_HANDLE`]; dropping it is harmless.
pub struct MockEvent {
    pub(crate) device: Arc<Device>,
    timing: bool,
    pub(crate) latest: Mutex<Option<Arc<Record>>>,
}

impl MockEvent {
    pub(crate) fn new(device: Arc<Device>, timing: bool) -> Self {
        device.live_events.fetch_add(1, Ordering::Relaxed);
        Self {
            device,
            timing,
            latest: Mutex::new(None),
        }
    }

    /// `Err(INVALID_HANDLE)` for `call` once the event's runtime has been
    /// dropped, which destroyed the event.
    fn check_alive(&self, call: &'static str) -> Result<()> {
        if self.device.closed.load(Ordering::Acquire) {
            return Err(FlexError::new(
                Status::INVALID_HANDLE,
                call,
                "the event's runtime was closed, which destroyed the event",
            ));
        }
        Ok(())
    }

    /// Recognises a mock event of `device` among `dyn Event`s.
    pub(crate) fn of<'a>(
        event: &'a dyn Event,
        device: &Arc<Device>,
        call: &'static str,
    ) -> Result<&'a MockEvent> {
        let event: &MockEvent = event.as_any().downcast_ref().ok_or_else(|| {
            FlexError::invalid_argument(
                call,
                format!("{event:?} is not an event of the software device"),
            )
        })?;
        if !Arc::ptr_eq(&event.device, device) {
            return Err(FlexError::invalid_argument(
                call,
                format!(
                    "the event belongs to the runtime of logical device {} and the stream to another runtime (logical device {}); both must be of one runtime",
                    event.device.index, device.index
                ),
            ));
        }
        Ok(event)
    }

    /// The latest record as of this call.
    fn latest(&self) -> Option<Arc<Record>> {
        self.latest.lock().clone()
    }
}

impl Drop for MockEvent {
    fn drop(&mut self) {
        self.device.live_events.fetch_sub(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for MockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockEvent")
            .field("device", &self.device.index)
            .field("timing", &self.timing)
            .finish_non_exhaustive()
    }
}

impl Event for MockEvent {
    fn logical_device(&self) -> u32 {
        self.device.index
    }

    fn timing(&self) -> bool {
        self.timing
    }

    fn query(&self) -> Result<bool> {
        self.check_alive("event_query")?;
        match self.latest().as_deref().map(Record::outcome) {
            None => Ok(true),
            Some(None) => Ok(false),
            Some(Some(Ok(_))) => Ok(true),
            Some(Some(Err(error))) => Err(error),
        }
    }

    fn notify(&self, completion: Completion) -> Result<Notification> {
        self.check_alive("event_notify")?;
        let Some(record) = self.latest() else {
            return Ok(Notification::Settled(Ok(())));
        };
        match record.notify(completion) {
            Ok(()) => Ok(Notification::Pending),
            // Dropped here, with no lock held: its drop is user code. The
            // outcome is this record's, whatever was recorded since.
            Err(_already_settled) => Ok(Notification::Settled(match record.outcome() {
                Some(Err(error)) => Err(error),
                _ => Ok(()),
            })),
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.check_alive("event_synchronize")?;
        let Some(record) = self.latest() else {
            return Ok(());
        };
        self.device.wait_for_record(&record, "event_synchronize")
    }

    fn elapsed_nanos(&self, end: &dyn Event) -> Result<i64> {
        const CALL: &str = "elapsed_time";
        self.check_alive(CALL)?;
        let end: &MockEvent = end.as_any().downcast_ref().ok_or_else(|| {
            FlexError::invalid_argument(
                CALL,
                format!("the end event {end:?} is not an event of the software device"),
            )
        })?;
        if !Arc::ptr_eq(&self.device, &end.device) {
            if end.device.closed.load(Ordering::Acquire) {
                return Err(FlexError::new(
                    Status::INVALID_HANDLE,
                    CALL,
                    "the end event's runtime was closed, which destroyed the event",
                ));
            }
            return Err(FlexError::invalid_argument(
                CALL,
                format!(
                    "the start event is of the runtime of logical device {} and the end event of another runtime (logical device {}); both must be of one runtime",
                    self.device.index, end.device.index
                ),
            ));
        }
        if !self.device.event_timing {
            return Err(FlexError::new(
                Status::UNSUPPORTED,
                CALL,
                "this device takes no event timestamps (SPYRE_MOCK_EVENT_TIMING is off; the runtime's event_timing capability is false)",
            ));
        }
        let mut times = [Instant::now(); 2];
        for ((name, event), time) in [("start", self), ("end", end)].into_iter().zip(&mut times) {
            if !event.timing {
                return Err(FlexError::invalid_argument(
                    CALL,
                    format!(
                        "the {name} event was created without timing; create both events with timing"
                    ),
                ));
            }
            let Some(record) = event.latest() else {
                return Err(FlexError::invalid_argument(
                    CALL,
                    format!("the {name} event was never recorded; record both events first"),
                ));
            };
            *time = match record.outcome() {
                None => {
                    return Err(FlexError::new(
                        Status::NOT_READY,
                        CALL,
                        format!("the {name} event has not completed yet; synchronize it first"),
                    ));
                }
                Some(Err(error)) => return Err(error),
                Some(Ok(at)) => at,
            };
        }
        let [start, end] = times;
        let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        Ok(match end.checked_duration_since(start) {
            Some(forward) => nanos(forward),
            None => -nanos(start.duration_since(end)),
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

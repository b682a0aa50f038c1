//! Events of the software device: a record is a marker operation in its
//! stream's FIFO; a wait is a gate in the waiting stream that the scheduler
//! holds closed until the record has completed. No thread ever parks on a
//! device-side wait.
use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use flex_rt::{Completion, Event, FlexError, Result, Status};
use parking_lot::Mutex;

use crate::engine::Device;

/// One record of an event: the point it marks (a stream and the work before
/// it) and, once the device reaches it, the outcome — the completion time,
/// or the recording stream's error. Shared by the event (while it is the
/// latest record), the marker operation, and every wait that saw it.
pub(crate) struct Record {
    /// Scheduler index of the recording stream.
    pub(crate) stream: usize,
    /// Its id, for messages.
    pub(crate) stream_id: u64,
    outcome: OutcomeCell,
}

/// The write-once outcome of a record, read without a lock (`OnceLock`),
/// and the completions asked for (`Event::notify`) while it was pending,
/// which the one that sets the outcome takes: setting and registering hold
/// one lock, so a registration is either taken by the setter or refused
/// because the outcome is there. Under loom (`--cfg spyre_loom`) one loom
/// mutex holds both, so that the models explore every order.
#[cfg(not(spyre_loom))]
struct OutcomeCell {
    outcome: std::sync::OnceLock<Result<Instant>>,
    notifications: Mutex<Vec<Completion>>,
}

#[cfg(not(spyre_loom))]
impl OutcomeCell {
    fn new() -> Self {
        Self {
            outcome: std::sync::OnceLock::new(),
            notifications: Mutex::new(Vec::new()),
        }
    }

    /// Sets the outcome if unset; returns the registered completions.
    fn set(&self, outcome: Result<Instant>) -> Vec<Completion> {
        let mut notifications = self.notifications.lock();
        let _ = self.outcome.set(outcome);
        std::mem::take(&mut *notifications)
    }

    fn get(&self) -> Option<Result<Instant>> {
        self.outcome.get().cloned()
    }

    /// Registers `completion`, or hands it back when the outcome is set.
    fn register(&self, completion: Completion) -> std::result::Result<(), Completion> {
        let mut notifications = self.notifications.lock();
        if self.outcome.get().is_some() {
            return Err(completion);
        }
        notifications.push(completion);
        Ok(())
    }
}

#[cfg(spyre_loom)]
struct OutcomeCell(loom::sync::Mutex<(Option<Result<Instant>>, Vec<Completion>)>);

#[cfg(spyre_loom)]
impl OutcomeCell {
    fn new() -> Self {
        Self(loom::sync::Mutex::new((None, Vec::new())))
    }

    fn set(&self, outcome: Result<Instant>) -> Vec<Completion> {
        let mut cell = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cell.0.is_none() {
            cell.0 = Some(outcome);
        }
        std::mem::take(&mut cell.1)
    }

    fn get(&self) -> Option<Result<Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    fn register(&self, completion: Completion) -> std::result::Result<(), Completion> {
        let mut cell = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if cell.0.is_some() {
            return Err(completion);
        }
        cell.1.push(completion);
        Ok(())
    }
}

impl Record {
    pub(crate) fn new(stream: usize, stream_id: u64) -> Self {
        Self {
            stream,
            stream_id,
            outcome: OutcomeCell::new(),
        }
    }

    /// Sets the outcome once (later calls change nothing) and calls the
    /// completions asked for meanwhile, on the calling thread (an engine,
    /// with no lock held), catching their panics.
    pub(crate) fn settle(&self, outcome: Result<Instant>) {
        let notifications = self.outcome.set(outcome);
        if notifications.is_empty() {
            return;
        }
        let result = match self.outcome() {
            Some(Err(error)) => Err(error),
            _ => Ok(()),
        };
        for completion in notifications {
            let result = result.clone();
            let call = std::panic::AssertUnwindSafe(move || completion(result));
            if let Err(payload) = std::panic::catch_unwind(call) {
                tracing::error!(
                    stream = self.stream_id,
                    "an event notification panicked: {}",
                    crate::panic_message(payload.as_ref())
                );
            }
        }
    }

    /// Registers `completion` for when the record settles; hands it back
    /// when the record has settled already (race-free against
    /// [`Record::settle`], see `OutcomeCell`).
    pub(crate) fn notify(&self, completion: Completion) -> std::result::Result<(), Completion> {
        self.outcome.register(completion)
    }

    /// The outcome, or `None` while the device has not reached the record
    /// (a copy: the time, or the error).
    pub(crate) fn outcome(&self) -> Option<Result<Instant>> {
        self.outcome.get()
    }

    /// The error a stream that waited on this failed record fails with.
    pub(crate) fn wait_error(&self, cause: &FlexError) -> FlexError {
        FlexError::new(
            Status::STREAM_FAILED,
            "wait_event",
            format!(
                "waited on an event recorded on stream {}, which failed before reaching it: {cause}",
                self.stream_id
            ),
        )
    }
}

/// The marker operation of a record ([`crate::Op::Record`]). Only
/// [`crate::MockStream`]'s `record_event` makes one.
pub struct EventRecord(pub(crate) Arc<Record>);

impl fmt::Debug for EventRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventRecord(stream {})", self.0.stream_id)
    }
}

/// An event of a [`crate::MockRuntime`]; implements [`flex_rt::Event`].
///
/// Thread-safety: `Send + Sync`. Its latest record is read and replaced
/// only under the runtime's scheduler lock, so concurrent records are
/// serialized and a wait sees one whole record.
pub struct MockEvent {
    pub(crate) device: Arc<Device>,
    timing: bool,
    pub(crate) latest: Mutex<Option<Arc<Record>>>,
}

impl MockEvent {
    pub(crate) fn new(device: Arc<Device>, timing: bool) -> Self {
        Self {
            device,
            timing,
            latest: Mutex::new(None),
        }
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

    /// The latest record, read under the scheduler lock.
    fn latest(&self) -> Option<Arc<Record>> {
        let _scheduler = self.device.scheduler.lock();
        self.latest.lock().clone()
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
        match self.latest().as_deref().map(Record::outcome) {
            None => Ok(true),
            Some(None) => Ok(false),
            Some(Some(Ok(_))) => Ok(true),
            Some(Some(Err(error))) => Err(error),
        }
    }

    fn notify(&self, completion: Completion) -> Result<bool> {
        let Some(record) = self.latest() else {
            return Ok(true);
        };
        match record.notify(completion) {
            Ok(()) => Ok(false),
            // Dropped here, with no lock held: its drop is user code.
            Err(_already_settled) => Ok(true),
        }
    }

    fn synchronize(&self) -> Result<()> {
        let Some(record) = self.latest() else {
            return Ok(());
        };
        self.device.wait_for_record(&record, "event_synchronize")
    }

    fn elapsed_nanos(&self, end: &dyn Event) -> Result<i64> {
        const CALL: &str = "elapsed_time";
        let end: &MockEvent = end.as_any().downcast_ref().ok_or_else(|| {
            FlexError::invalid_argument(
                CALL,
                format!("the end event {end:?} is not an event of the software device"),
            )
        })?;
        if !Arc::ptr_eq(&self.device, &end.device) {
            return Err(FlexError::invalid_argument(
                CALL,
                format!(
                    "the start event is of the runtime of logical device {} and the end event of another runtime (logical device {}); both must be of one runtime",
                    self.device.index, end.device.index
                ),
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

//! The runtime's events as this crate holds them ([`RuntimeEvent`]), and
//! marker events: the events without timing that [`crate::SpyreStream`]'s
//! `wait_stream` and `synchronize_async`, and the caching allocator's
//! cross-stream fences, record for their own use, kept
//! idle between uses instead of created and destroyed each time (through a
//! flex library a creation and a destruction cost more than the record
//! itself).
//!
//! Reusing a marker is what the event contract allows: a wait or a
//! notification binds to the record that was latest when it was asked for,
//! so recording the event again later changes nothing for them, and a
//! record still pending when its marker goes back is unaffected (flex.h's
//! `flex_event_destroy` says the same of destroying one).

use std::ops::Deref;

use flex_rt::fork::ForkGeneration;
use flex_rt::{Event, Runtime};

use crate::loom_shim::Mutex;

/// Idle markers kept at most; more are destroyed when they come back. Enough
/// for the 64 pool streams each awaiting once at the same time; a burst
/// beyond (or many cross-stream frees still fenced) makes new ones and
/// destroys the surplus.
const IDLE_LIMIT: usize = 64;

/// The idle markers of the process's runtime. Thread-safety: `Send + Sync`;
/// a take or a return holds a small lock for one `Vec` push or pop.
pub(crate) struct MarkerEvents {
    runtime: &'static dyn Runtime,
    idle: Mutex<Vec<Box<dyn Event>>>,
    /// The process the markers were made in: a forked child leaves them
    /// alone (another thread may have held `idle`'s lock at the fork).
    generation: ForkGeneration,
}

impl MarkerEvents {
    /// No idle marker yet; markers are made on `runtime` when needed.
    pub(crate) fn new(runtime: &'static dyn Runtime) -> Self {
        Self {
            runtime,
            idle: Mutex::new(Vec::new()),
            generation: ForkGeneration::current(),
        }
    }

    /// An idle marker, or a new one (an event without timing).
    ///
    /// # Errors
    /// The runtime's error when a new one cannot be made (a flex library of
    /// ABI 1.0 has no events).
    pub(crate) fn take(&'static self) -> flex_rt::Result<RuntimeEvent> {
        let idle = self.idle.lock().pop();
        let event = match idle {
            Some(event) => event,
            None => self.runtime.create_event(false)?,
        };
        Ok(RuntimeEvent {
            event: Some(event),
            home: Some(self),
            generation: self.generation,
        })
    }

    /// Markers idle now.
    #[cfg(all(test, not(spyre_loom)))]
    pub(crate) fn idle(&self) -> usize {
        self.idle.lock().len()
    }
}

/// An event of the process's runtime: one a [`crate::SpyreEvent`] owns,
/// destroyed when dropped, or a marker in use, which goes back to the idle
/// markers when dropped. Dropping never blocks (records may be pending),
/// and in a child forked after the event was made touches nothing of the
/// parent's runtime (the event is forgotten).
pub(crate) struct RuntimeEvent {
    /// `Some` until dropped.
    event: Option<Box<dyn Event>>,
    /// Where a marker goes back to; `None` for an owned event.
    home: Option<&'static MarkerEvents>,
    /// The process the event was made in.
    generation: ForkGeneration,
}

impl RuntimeEvent {
    /// An event that is destroyed when dropped.
    pub(crate) fn owned(event: Box<dyn Event>) -> Self {
        Self {
            event: Some(event),
            home: None,
            generation: ForkGeneration::current(),
        }
    }
}

impl Deref for RuntimeEvent {
    type Target = dyn Event;

    fn deref(&self) -> &Self::Target {
        self.event
            .as_deref()
            .expect("a marker holds its event until dropped")
    }
}

impl Drop for RuntimeEvent {
    fn drop(&mut self) {
        let Some(event) = self.event.take() else {
            return;
        };
        if !self.generation.is_current() {
            // A forked child: the event is the parent's runtime's (a
            // flex library's destroy could wait for a lock a parent's
            // thread held at the fork); touch neither it nor the idle
            // markers' lock.
            std::mem::forget(event);
            return;
        }
        let Some(home) = self.home else {
            // Owned: destroyed.
            drop(event);
            return;
        };
        let mut idle = home.idle.lock();
        if idle.len() < IDLE_LIMIT {
            idle.push(event);
            return;
        }
        drop(idle);
        // Destroyed without the lock held.
        drop(event);
    }
}

#[cfg(all(test, not(spyre_loom)))]
mod tests {
    use flex_rt::noop::NoopRuntime;

    use super::*;

    fn markers() -> &'static MarkerEvents {
        let runtime: &'static NoopRuntime = Box::leak(Box::new(NoopRuntime::new(0)));
        Box::leak(Box::new(MarkerEvents::new(runtime)))
    }

    #[test]
    fn a_marker_goes_back_when_dropped_and_is_taken_again() {
        let markers = markers();
        let first = markers.take().unwrap();
        let address = std::ptr::from_ref::<dyn Event>(&*first).cast::<u8>();
        drop(first);
        assert_eq!(markers.idle(), 1);
        let again = markers.take().unwrap();
        assert_eq!(
            std::ptr::from_ref::<dyn Event>(&*again).cast::<u8>(),
            address,
            "the idle marker is reused, not a new one made"
        );
        assert_eq!(markers.idle(), 0);
    }

    #[test]
    fn at_most_the_limit_is_kept_idle() {
        let markers = markers();
        let taken: Vec<RuntimeEvent> = (0..IDLE_LIMIT + 3)
            .map(|_| markers.take().unwrap())
            .collect();
        drop(taken);
        assert_eq!(markers.idle(), IDLE_LIMIT);
    }
}

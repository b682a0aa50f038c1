//! Fault injection for tests: switches that make a system refuse runtimes
//! and a runtime refuse streams.
//!
//! Faults of one stream (refuse the Nth launch, need shutdown, run slowly)
//! live on the stream itself: [`crate::MockStream::fail_nth_launch`],
//! [`crate::MockStream::set_needs_shutdown`] and
//! [`crate::MockStream::set_slowdown`].
use std::sync::atomic::{AtomicBool, Ordering};

use crate::sync::Mutex;

/// Faults of a [`crate::MockSystem`]. Shared through an `Arc` by the system
/// and its clones, so a test can set a fault, hand the system to the code
/// under test, and clear the fault later.
///
/// Thread-safety: `Send + Sync`; every method is a single atomic operation.
#[derive(Debug, Default)]
pub struct SystemFaults {
    fail_runtime_creation: AtomicBool,
}

impl SystemFaults {
    /// While `fail` is true, every [`flex_rt::Backend::create_runtime`] (and
    /// [`crate::MockSystem::create_mock_runtime`]) on a valid device fails
    /// with [`flex_rt::Status::RUNTIME_FAILED`]. Runtimes that already exist
    /// are unaffected.
    pub fn set_fail_runtime_creation(&self, fail: bool) {
        self.fail_runtime_creation.store(fail, Ordering::SeqCst);
    }

    /// Whether runtime creation is currently set to fail.
    pub fn fail_runtime_creation(&self) -> bool {
        self.fail_runtime_creation.load(Ordering::SeqCst)
    }
}

/// Faults of a [`crate::MockRuntime`], reached through
/// [`crate::MockRuntime::faults`].
///
/// Thread-safety: `Send + Sync`; every method takes one short lock, so
/// concurrent calls and stream creations see each setting whole.
#[derive(Debug, Default)]
pub struct RuntimeFaults {
    /// (creations that still succeed first, creations that fail after them).
    stream_creations: Mutex<(u64, u64)>,
}

impl RuntimeFaults {
    /// Makes the next `count` stream creations on the runtime fail with
    /// [`flex_rt::Status::RUNTIME_FAILED`] (no stream is made, no id is
    /// used). Replaces any count set before; 0 clears the fault.
    pub fn fail_next_stream_creations(&self, count: u64) {
        self.fail_stream_creations_after(0, count);
    }

    /// Lets the next `succeed_first` stream creations succeed, then makes
    /// the `count` after them fail with [`flex_rt::Status::RUNTIME_FAILED`].
    /// Replaces any setting made before.
    pub fn fail_stream_creations_after(&self, succeed_first: u64, count: u64) {
        *self.stream_creations.lock() = (succeed_first, count);
    }

    /// How many of the coming stream creations will still fail.
    pub fn pending_stream_creation_failures(&self) -> u64 {
        self.stream_creations.lock().1
    }

    /// Decides one stream creation: true when it must fail.
    pub(crate) fn take_stream_creation_failure(&self) -> bool {
        let mut state = self.stream_creations.lock();
        match *state {
            (_, 0) => false,
            (0, ref mut failures) => {
                *failures -= 1;
                true
            }
            (ref mut successes, _) => {
                *successes -= 1;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_creation_failures_count_down_to_zero() {
        let faults = RuntimeFaults::default();
        assert!(!faults.take_stream_creation_failure());
        faults.fail_next_stream_creations(2);
        assert_eq!(faults.pending_stream_creation_failures(), 2);
        assert!(faults.take_stream_creation_failure());
        assert!(faults.take_stream_creation_failure());
        assert!(!faults.take_stream_creation_failure());
        assert_eq!(faults.pending_stream_creation_failures(), 0);
        faults.fail_stream_creations_after(2, 1);
        assert_eq!(
            (0..4)
                .map(|_| faults.take_stream_creation_failure())
                .collect::<Vec<_>>(),
            vec![false, false, true, false]
        );
    }

    #[test]
    fn runtime_creation_toggle() {
        let faults = SystemFaults::default();
        assert!(!faults.fail_runtime_creation());
        faults.set_fail_runtime_creation(true);
        assert!(faults.fail_runtime_creation());
        faults.set_fail_runtime_creation(false);
        assert!(!faults.fail_runtime_creation());
    }
}

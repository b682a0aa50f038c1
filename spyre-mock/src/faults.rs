//! Fault injection for tests: switches that make a system refuse runtimes
//! and a runtime refuse streams.
//!
//! Faults of one stream (refuse the Nth launch, need shutdown, run slowly)
//! live on the stream itself: [`crate::MockStream::fail_nth_launch`],
//! [`crate::MockStream::set_needs_shutdown`] and
//! [`crate::MockStream::set_slowdown`].
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
/// Thread-safety: `Send + Sync`; every method is a single atomic operation.
#[derive(Debug, Default)]
pub struct RuntimeFaults {
    failing_stream_creations: AtomicU64,
}

impl RuntimeFaults {
    /// Makes the next `count` stream creations on the runtime fail with
    /// [`flex_rt::Status::RUNTIME_FAILED`] (no stream is made, no id is
    /// used). Replaces any count set before; 0 clears the fault.
    pub fn fail_next_stream_creations(&self, count: u64) {
        self.failing_stream_creations.store(count, Ordering::SeqCst);
    }

    /// How many of the next stream creations will still fail.
    pub fn pending_stream_creation_failures(&self) -> u64 {
        self.failing_stream_creations.load(Ordering::SeqCst)
    }

    /// Uses up one pending failure: true when this stream creation must fail.
    pub(crate) fn take_stream_creation_failure(&self) -> bool {
        self.failing_stream_creations
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
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

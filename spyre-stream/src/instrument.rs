//! What a launch records beside launching — the trace, the counters —
//! decided by one relaxed load of these flags per launch.

use std::sync::atomic::{AtomicU8, Ordering};

/// The trace is on ([`crate::start_trace`]).
pub(crate) const TRACE: u8 = 1;
/// The counters are on ([`crate::enable_counters`]).
pub(crate) const COUNTERS: u8 = 2;

static FLAGS: AtomicU8 = AtomicU8::new(0);

/// The flags now: one relaxed load.
#[inline]
pub(crate) fn flags() -> u8 {
    FLAGS.load(Ordering::Relaxed)
}

/// Turns `flag` on or off.
pub(crate) fn set(flag: u8, on: bool) {
    if on {
        FLAGS.fetch_or(flag, Ordering::Relaxed);
    } else {
        FLAGS.fetch_and(!flag, Ordering::Relaxed);
    }
}

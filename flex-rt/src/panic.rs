//! Caught panics of user code.
//!
//! A launch runs user code on the device's side: host callbacks, host
//! functions and completions. Every device backend (the hardware backend,
//! the software device; not the no-op test double) catches their panics
//! and turns them into a failed stream (`HOST_CALLBACK_FAILED`) or a log
//! line, and each needs the same two things of a caught payload: its text,
//! and a drop that cannot unwind, since a payload's `Drop` is user code too.
//! They live here, once, for the backends of this crate and of the software
//! device.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The text of a caught panic payload: the payload itself when it is a
/// `&str` or a `String` (what `panic!` makes), otherwise the fixed text
/// `"a panic with a non-string payload"` (what `std::panic::panic_any` of
/// any other type gives).
///
/// Allocates the returned `String`; never panics. Thread-safe: it only
/// reads the payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Drops a caught panic payload without letting a panic of its own `Drop`
/// escape.
///
/// A payload is any type user code passed to `std::panic::panic_any`, so
/// its `Drop` may panic in turn; a plain `drop` there would unwind out of
/// the backend's thread (an engine, or the vendor runtime's callback
/// thread) after the first panic was handled. The second payload is leaked
/// instead: dropping it could panic again, without end.
///
/// Never panics.
pub fn drop_panic(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn messages_are_the_payloads_text_or_a_fixed_one() {
        let payload = catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "plain");
        let payload = catch_unwind(|| panic!("formatted {}", 7)).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "formatted 7");
        let payload = catch_unwind(|| std::panic::panic_any(5u8)).unwrap_err();
        assert_eq!(
            panic_message(payload.as_ref()),
            "a panic with a non-string payload"
        );
    }

    /// Panics when dropped, counting its drops first.
    struct PanicsOnDrop(Arc<AtomicUsize>);

    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
            panic!("dropping the payload");
        }
    }

    #[test]
    fn a_payload_whose_drop_panics_is_dropped_without_unwinding() {
        let drops = Arc::new(AtomicUsize::new(0));
        let payload: Box<dyn Any + Send> = Box::new(PanicsOnDrop(Arc::clone(&drops)));
        drop_panic(payload);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}

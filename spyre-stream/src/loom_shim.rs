//! The lock, atomics and write-once cells the pool uses, behind a shim so
//! that loom can model them: `flex_rt::sync` and `std` normally, loom's under
//! `--cfg spyre_loom`.

#[cfg(not(spyre_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize};

    /// A cell written at most once and read without a lock (`OnceLock`): a
    /// reader sees either nothing or the whole value, published with release
    /// and read with acquire.
    #[derive(Debug)]
    pub(crate) struct WriteOnce<T>(std::sync::OnceLock<T>);

    impl<T: Copy> WriteOnce<T> {
        pub(crate) fn new() -> Self {
            Self(std::sync::OnceLock::new())
        }

        /// The value, if written. One acquire load.
        #[inline]
        pub(crate) fn get(&self) -> Option<T> {
            self.0.get().copied()
        }

        /// Writes `value` if the cell is empty; `false` if it was not.
        pub(crate) fn set(&self, value: T) -> bool {
            self.0.set(value).is_ok()
        }
    }

    /// The crate's lock: the pool's exclusive section (torch-spyre's
    /// `unique_lock` on the `shared_mutex`; nothing takes it shared any
    /// more), its retry queues and creation locks, the idle markers.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(flex_rt::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(flex_rt::sync::Mutex::new(value))
        }

        #[inline]
        pub(crate) fn lock(&self) -> flex_rt::sync::MutexGuard<'_, T> {
            self.0.lock()
        }

        /// Whether some thread holds the lock now (for tests of what runs
        /// outside it).
        #[cfg(test)]
        pub(crate) fn is_locked(&self) -> bool {
            self.0.is_locked()
        }
    }
}

#[cfg(spyre_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize};

    /// A write-once cell modelled by loom: every read and write is a point
    /// where loom switches threads (std's `OnceLock` publishes with
    /// release/acquire; the models check the pool's protocol around it).
    #[derive(Debug)]
    pub(crate) struct WriteOnce<T>(loom::sync::Mutex<Option<T>>);

    impl<T: Copy> WriteOnce<T> {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Mutex::new(None))
        }

        pub(crate) fn get(&self) -> Option<T> {
            *self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn set(&self, value: T) -> bool {
            let mut cell = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if cell.is_some() {
                return false;
            }
            *cell = Some(value);
            true
        }
    }

    /// The crate's lock, modelled by loom.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            // A poisoned lock means a panic inside the pool, which loom reports anyway.
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}

pub(crate) use imp::{AtomicBool, AtomicUsize, Mutex, WriteOnce};

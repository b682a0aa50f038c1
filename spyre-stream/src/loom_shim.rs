//! The lock and atomics the pool uses, behind a shim so that loom can model
//! them: `parking_lot` normally, loom's under `--cfg spyre_loom`.

#[cfg(not(spyre_loom))]
mod imp {
    pub(crate) use std::sync::atomic::AtomicBool;

    /// A reader-writer lock (`std::shared_mutex` in torch-spyre).
    #[derive(Debug, Default)]
    pub(crate) struct RwLock<T>(parking_lot::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::RwLock::new(value))
        }

        #[inline]
        pub(crate) fn read(&self) -> parking_lot::RwLockReadGuard<'_, T> {
            self.0.read()
        }

        #[inline]
        pub(crate) fn write(&self) -> parking_lot::RwLockWriteGuard<'_, T> {
            self.0.write()
        }
    }
}

#[cfg(spyre_loom)]
mod imp {
    pub(crate) use loom::sync::atomic::AtomicBool;

    /// A reader-writer lock modelled by loom.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            // A poisoned lock means a panic inside the pool, which loom reports anyway.
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }

        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
    }
}

pub(crate) use imp::{AtomicBool, RwLock};

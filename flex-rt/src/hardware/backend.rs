//! `HardwareBackend`: a loaded flex library as a [`Backend`].

use std::path::Path;
use std::sync::Arc;

use flex_sys::{FlexLibrary, LoadError};

use super::call::{self, check};
use super::runtime::HardwareRuntime;
use crate::error::Result;
use crate::traits::{Backend, Runtime};

/// The hardware backend: a flex runtime library loaded at run time
/// (`Backend::name` is `"hardware"`).
///
/// It counts devices and creates [`HardwareRuntime`]s, each of which keeps
/// the library loaded. Loading is flex-sys's: [`HardwareBackend::load`] follows
/// `FLEX_RUNTIME_LIB` and the default library names, [`HardwareBackend::open`]
/// takes a path, and every failure is a [`LoadError`] that says what was
/// tried. Nothing is cached.
///
/// Thread-safety: `Send + Sync`; every method may be called from any thread
/// (`flex.h`: every function may be called from any thread). Cloning shares
/// the library. No method panics.
#[derive(Clone, Debug)]
pub struct HardwareBackend {
    lib: Arc<FlexLibrary>,
}

impl HardwareBackend {
    /// Loads the library the environment selects, with
    /// [`FlexLibrary::load`]: exactly `FLEX_RUNTIME_LIB` when it is set,
    /// otherwise `libflex.so.<major>` then `libflex.so`.
    ///
    /// # Errors
    /// [`LoadError`] naming the path(s) tried, a missing symbol, or both ABI
    /// versions on a major-version mismatch.
    pub fn load() -> std::result::Result<Self, LoadError> {
        let lib = FlexLibrary::load()?;
        for skipped in lib.skipped() {
            tracing::info!(
                loaded = %lib.path().display(),
                "the flex library {skipped} could not be opened; loaded the next name instead"
            );
        }
        Ok(Self::from_library(lib))
    }

    /// Loads the library at `path`, with [`FlexLibrary::open`] (used by
    /// tests and by programs that configure the path themselves).
    ///
    /// # Errors
    /// As [`FlexLibrary::open`].
    pub fn open(path: impl AsRef<Path>) -> std::result::Result<Self, LoadError> {
        FlexLibrary::open(path).map(Self::from_library)
    }

    /// A backend over a library that is already loaded.
    pub fn from_library(lib: Arc<FlexLibrary>) -> Self {
        Self { lib }
    }

    /// The loaded library.
    pub fn library(&self) -> &Arc<FlexLibrary> {
        &self.lib
    }
}

impl Backend for HardwareBackend {
    fn name(&self) -> &'static str {
        "hardware"
    }

    /// `flex_get_device_count`.
    fn device_count(&self) -> Result<u32> {
        const CALL: &str = "flex_get_device_count";
        let mut count = 0i32;
        // SAFETY: `count` is a valid `int32_t` out pointer for the call; the
        // function has no other precondition and may be called from any
        // thread. `self.lib` keeps the library loaded.
        let status = unsafe { self.lib.api().flex_get_device_count(&raw mut count) };
        check(&self.lib, status, CALL)?;
        call::count_from_raw(count, CALL)
    }

    /// `[("library", <path of the loaded file>), ("abi_version", "M.m")]`,
    /// then `("skipped", "<name> (<reason>)")` for each default name tried
    /// first that could not be opened ([`FlexLibrary::skipped`]).
    fn details(&self) -> Vec<(&'static str, String)> {
        let mut details = vec![
            ("library", self.lib.path().display().to_string()),
            ("abi_version", self.lib.version().to_string()),
        ];
        details.extend(
            self.lib
                .skipped()
                .iter()
                .map(|skipped| ("skipped", skipped.to_string())),
        );
        details
    }

    /// [`HardwareRuntime::create`] with this backend's library.
    fn create_runtime(&self, logical_device: u32) -> Result<Box<dyn Runtime>> {
        Ok(Box::new(HardwareRuntime::create(
            Arc::clone(&self.lib),
            logical_device,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static_assertions::assert_impl_all!(HardwareBackend: Send, Sync, Clone, Backend);

    #[test]
    #[cfg_attr(miri, ignore = "Miri cannot dlopen")]
    fn open_reports_the_load_error() {
        let error = HardwareBackend::open("/nonexistent/libflex.so.1").unwrap_err();
        assert!(
            matches!(error, LoadError::Open { ref path, .. } if path == Path::new("/nonexistent/libflex.so.1")),
            "{error}"
        );
    }
}

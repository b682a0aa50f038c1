//! Which backend the process-wide runtime uses: chosen by cargo feature and
//! `SPYRE_BACKEND`, never by silent fallback.

use std::fmt;

use flex_rt::Backend;

use crate::env::{BACKEND, invalid};
use crate::error::{Error, Result};

/// A backend this crate can be built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The software device (`spyre-mock`), feature `mock`.
    Mock,
    /// A flex runtime library loaded at run time (flex-rt's hardware backend), feature `hardware`.
    Hardware,
}

impl BackendKind {
    /// `"mock"` or `"hardware"`, the values of `SPYRE_BACKEND`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mock => "mock",
            Self::Hardware => "hardware",
        }
    }

    /// Whether this build includes the backend.
    pub fn is_compiled(self) -> bool {
        match self {
            Self::Mock => cfg!(feature = "mock"),
            Self::Hardware => cfg!(feature = "hardware"),
        }
    }

    /// The backend used when `SPYRE_BACKEND` is unset: hardware when it is
    /// compiled in, else mock.
    pub fn default_for_build() -> Option<Self> {
        [Self::Hardware, Self::Mock]
            .into_iter()
            .find(|k| k.is_compiled())
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses `SPYRE_BACKEND`: `mock` or `hardware` (exactly), or unset or empty
/// for the build's default ([`BackendKind::default_for_build`]).
///
/// # Errors
/// [`Error::InvalidEnv`] naming the raw value when it is neither;
/// [`Error::BackendUnavailable`] when it names a backend this build lacks, or
/// when no backend is compiled in.
pub fn parse_backend(raw: Option<&str>) -> Result<BackendKind> {
    let kind = match raw.filter(|r| !r.is_empty()) {
        None => BackendKind::default_for_build().ok_or_else(|| {
            Error::BackendUnavailable(
                "spyre-stream was built without a backend: enable the cargo feature `mock` or `hardware`".into(),
            )
        })?,
        Some("mock") => BackendKind::Mock,
        Some("hardware") => BackendKind::Hardware,
        Some(other) => return Err(invalid(BACKEND, other, "expected `mock` or `hardware`")),
    };
    if !kind.is_compiled() {
        return Err(Error::BackendUnavailable(format!(
            "SPYRE_BACKEND={kind} but this build has no `{kind}` backend: rebuild with `--features {kind}`"
        )));
    }
    Ok(kind)
}

/// Creates the backend of `kind`: the software device configured from its
/// `SPYRE_MOCK_*` variables (with a warning when `FLEX_RUNTIME_LIB` is set,
/// as it is then not used, and for each `SPYRE_MOCK_*` variable it does not
/// read: [`spyre_mock::config::ignored_in_process`]), or the flex library found through
/// `FLEX_RUNTIME_LIB` and the default library names.
///
/// # Errors
/// [`Error::BackendConfig`] for the mock's configuration, or the library's
/// load error.
pub(crate) fn create(kind: BackendKind) -> Result<Box<dyn Backend>> {
    match kind {
        #[cfg(feature = "mock")]
        BackendKind::Mock => {
            if crate::env::var(flex_rt::RUNTIME_LIB_ENV).is_some() {
                // Never silently another device than the one asked for.
                tracing::warn!(
                    "{} is set, but the software device was chosen (SPYRE_BACKEND, or a build \
                     without the `hardware` feature): no flex library is loaded",
                    flex_rt::RUNTIME_LIB_ENV
                );
            }
            // Nor a switch set that changes nothing: said once a process
            // (a backend made again after a failed start finds the same
            // environment). An empty value is unset, the workspace's rule.
            static IGNORED_TOLD: std::sync::Once = std::sync::Once::new();
            IGNORED_TOLD.call_once(|| {
                for (name, value) in std::env::vars_os() {
                    if let Some(ignored) = name
                        .to_str()
                        .filter(|_| !value.is_empty())
                        .and_then(spyre_mock::config::ignored_in_process)
                    {
                        tracing::warn!("{ignored}");
                    }
                }
            });
            Ok(Box::new(
                spyre_mock::MockSystem::from_env().map_err(Error::BackendConfig)?,
            ))
        }
        #[cfg(feature = "hardware")]
        BackendKind::Hardware => Ok(Box::new(
            flex_rt::HardwareBackend::load().map_err(|e| Error::Load(std::sync::Arc::new(e)))?,
        )),
        #[allow(unreachable_patterns)]
        other => Err(Error::BackendUnavailable(format!(
            "this build has no `{other}` backend"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_values_name_the_value() {
        for raw in ["MOCK", "abc", "-1", "0", "9"] {
            let message = parse_backend(Some(raw)).unwrap_err().to_string();
            assert_eq!(
                message,
                format!("SPYRE_BACKEND={raw:?} is invalid: expected `mock` or `hardware`")
            );
        }
    }

    #[test]
    fn default_and_explicit_choices_follow_the_features() {
        assert_eq!(
            parse_backend(Some("")).ok(),
            parse_backend(None).ok(),
            "empty means unset"
        );
        let default = parse_backend(None);
        match (cfg!(feature = "mock"), cfg!(feature = "hardware")) {
            (_, true) => assert_eq!(default.unwrap(), BackendKind::Hardware),
            (true, false) => assert_eq!(default.unwrap(), BackendKind::Mock),
            (false, false) => assert!(matches!(default, Err(Error::BackendUnavailable(_)))),
        }
        assert_eq!(parse_backend(Some("mock")).is_ok(), cfg!(feature = "mock"));
        assert_eq!(
            parse_backend(Some("hardware")).is_ok(),
            cfg!(feature = "hardware")
        );
    }
}

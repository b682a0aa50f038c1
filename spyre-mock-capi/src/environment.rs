//! The environment variables the shared library reads: the device
//! configuration, the ABI version to report, and the misbehaviour switches. Parsing is pure (a lookup
//! closure), so tests need not touch the process environment.

use std::time::Duration;

use flex_sys::bindings::{
    FLEX_API_VERSION_MAJOR, FLEX_API_VERSION_MINOR, FLEX_ERROR_INVALID_ARGUMENT,
};
use flex_sys::make_api_version;
use spyre_mock::MockConfig;
use spyre_mock::config::ENV_CHECK_REUSE;

use crate::boundary::Failure;

pub(crate) use spyre_mock::config::{
    ENV_ABI_VERSION, ENV_FAIL_LAUNCH, ENV_FAIL_RUNTIME_CREATE, ENV_LATE_COMPLETIONS_MS,
    ENV_UNDEFINED_STATUS,
};

/// Largest delay of `SPYRE_MOCK_LATE_COMPLETIONS_MS`: 10 000 ms (10 s).
pub(crate) const MAX_LATE_COMPLETIONS_MS: u64 = 10_000;

/// The status a call named in `SPYRE_MOCK_UNDEFINED_STATUS` returns: a value
/// flex.h does not define.
pub(crate) const UNDEFINED_STATUS: i32 = 977;

/// The misbehaviour switches a runtime (or a call without one) follows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Switches {
    /// Calls that return [`UNDEFINED_STATUS`] and do nothing else.
    pub(super) undefined_status: Vec<&'static str>,
    /// The launch on each stream that is refused (1 = the first).
    pub(super) fail_launch: Option<u64>,
    /// Delay of every completion, delivered from the runtime's delivery thread.
    pub(super) late_completions: Option<Duration>,
    /// Whether `flex_runtime_create` fails.
    pub(super) fail_runtime_create: bool,
}

impl Switches {
    /// Reads the switches through `lookup` (name → value, `None` when
    /// unset). Values are trimmed; empty counts as unset.
    ///
    /// # Errors
    /// A message naming the variable and its raw value when a value is
    /// malformed.
    pub(super) fn from_lookup(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Self, String> {
        abi_version(&mut lookup)?;
        let mut value = |name: &str| {
            lookup(name)
                .map(|raw| raw.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut switches = Self::default();
        if let Some(raw) = value(ENV_UNDEFINED_STATUS) {
            for name in raw.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let Some(known) = status_calls().find(|&call| call == name) else {
                    return Err(format!(
                        "{ENV_UNDEFINED_STATUS}={raw:?} is not valid: {name:?} is not a flex.h function that returns a status (one of {})",
                        status_calls().collect::<Vec<_>>().join(", ")
                    ));
                };
                switches.undefined_status.push(known);
            }
        }
        if let Some(raw) = value(ENV_FAIL_LAUNCH) {
            let n = flex_rt::env::parse_u64(&raw).map_err(|expected| {
                format!("{ENV_FAIL_LAUNCH}={raw:?} is not valid: {expected} (1 = the first launch of each stream, 0 = off)")
            })?;
            switches.fail_launch = (n > 0).then_some(n);
        }
        if let Some(raw) = value(ENV_LATE_COMPLETIONS_MS) {
            let ms: u64 = raw
                .parse()
                .ok()
                .filter(|ms| *ms <= MAX_LATE_COMPLETIONS_MS)
                .ok_or_else(|| {
                    format!("{ENV_LATE_COMPLETIONS_MS}={raw:?} is not valid: expected a decimal number of milliseconds from 0 to {MAX_LATE_COMPLETIONS_MS}")
                })?;
            switches.late_completions = Some(Duration::from_millis(ms));
        }
        if let Some(raw) = value(ENV_FAIL_RUNTIME_CREATE) {
            switches.fail_runtime_create = flex_rt::env::parse_bool(&raw).ok_or_else(|| {
                format!(
                    "{ENV_FAIL_RUNTIME_CREATE}={raw:?} is not valid: {}",
                    flex_rt::env::BOOL_EXPECTED
                )
            })?;
        }
        Ok(switches)
    }

    /// Whether `call` is set to return [`UNDEFINED_STATUS`].
    #[inline]
    pub(super) fn undefined_status_for(&self, call: &str) -> bool {
        self.undefined_status.contains(&call)
    }
}

/// The three flex.h functions that return a version or a string, not a status.
const NON_STATUS_CALLS: [&str; 3] = [
    "flex_get_api_version",
    "flex_status_string",
    "flex_get_last_error_message",
];

/// Every flex.h function that returns a `flex_status_t`: all of
/// [`flex_sys::REQUIRED_SYMBOLS`] and [`flex_sys::ABI_1_1_SYMBOLS`] but the
/// three that return a version or a string.
pub(super) fn status_calls() -> impl Iterator<Item = &'static str> {
    flex_sys::REQUIRED_SYMBOLS
        .iter()
        .chain(flex_sys::ABI_1_1_SYMBOLS)
        .copied()
        .filter(|name| !NON_STATUS_CALLS.contains(name))
}

/// The version this header declares, packed.
pub(super) fn header_version() -> u32 {
    make_api_version(FLEX_API_VERSION_MAJOR as u32, FLEX_API_VERSION_MINOR as u32)
}

/// The packed version `flex_get_api_version` reports: `SPYRE_MOCK_ABI_VERSION`
/// (`M.m`, both decimal digits only, 0..=65535) when set and well formed,
/// the header's version when unset or empty.
///
/// # Errors
/// A malformed value, named with what is expected. `flex_get_api_version`
/// then reports the header's version, and every call that reads the
/// switches (`flex_get_device_count`, `flex_runtime_create`) refuses with
/// this message ([`Switches::from_lookup`]): a loader is not told of a
/// version nobody asked for.
pub(super) fn abi_version(mut lookup: impl FnMut(&str) -> Option<String>) -> Result<u32, String> {
    let current = header_version();
    let Some(raw) = lookup(ENV_ABI_VERSION) else {
        return Ok(current);
    };
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Ok(current);
    }
    let parse = |part: &str| {
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse::<u16>().ok().map(u32::from))
            .flatten()
    };
    trimmed
        .split_once('.')
        .and_then(|(major, minor)| Some(make_api_version(parse(major)?, parse(minor)?)))
        .ok_or_else(|| {
            format!(
                "{ENV_ABI_VERSION}={raw:?} is not valid: expected MAJOR.MINOR, each a decimal number from 0 to 65535 (e.g. 1.0)"
            )
        })
}

/// The device configuration from the `SPYRE_MOCK_*` variables of
/// [`MockConfig::from_lookup`].
///
/// # Errors
/// Its message, naming the variable and value; and a refusal of the
/// use-after-free detector (`SPYRE_MOCK_CHECK_REUSE` true), which needs
/// to be told when an allocator hands memory out again
/// (`flex_rt::Runtime::note_reuse`), a call flex.h does not have: through
/// the library it would check nothing.
pub(super) fn config(mut lookup: impl FnMut(&str) -> Option<String>) -> Result<MockConfig, String> {
    let config = MockConfig::from_lookup(&mut lookup).map_err(|err| err.message().to_owned())?;
    if config.check_reuse() {
        let raw = lookup(ENV_CHECK_REUSE).unwrap_or_default();
        return Err(format!(
            "{ENV_CHECK_REUSE}={raw:?} cannot work through the flex library: the use-after-free \
             detector must be told when an allocator hands memory out again, and flex.h has no \
             such call; unset it here, and use the in-process software device \
             (SPYRE_BACKEND=mock) to detect use after free"
        ));
    }
    Ok(config)
}

/// The environment switches for a call without a runtime.
pub(crate) fn env_switches() -> Result<Switches, Failure> {
    Switches::from_lookup(flex_rt::env::var_or_empty)
        .map_err(|message| Failure::new(FLEX_ERROR_INVALID_ARGUMENT, message))
}

/// The device configuration from the environment.
pub(crate) fn env_config() -> Result<MockConfig, Failure> {
    config(flex_rt::env::var_or_empty)
        .map_err(|message| Failure::new(FLEX_ERROR_INVALID_ARGUMENT, message))
}

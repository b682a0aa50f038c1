//! The conventions every environment variable of the workspace follows.
//!
//! - **Empty means unset.** A variable set to the empty string is read
//!   exactly as if it were not set, for every variable (`LOCAL_RANK=`,
//!   `SPYRE_BACKEND=`, `FLEX_RUNTIME_LIB=`, `SPYRE_MOCK_*=`, ...), so that
//!   `VAR= command` and a launcher that exports every name both mean
//!   "default".
//! - **Booleans** are `1`, `true`, `on`, `yes` for on and `0`, `false`,
//!   `off`, `no` for off, case-insensitive; anything else is an error that
//!   names the variable and its value, never silently off.
//! - A value that is not valid Unicode is read lossily, so that the error
//!   can still show it.

/// What a boolean variable accepts, for error messages.
pub const BOOL_EXPECTED: &str =
    "expected a boolean: 1, true, on or yes for on; 0, false, off or no for off (case-insensitive)";

/// Reads the process environment variable `name`: `None` when it is unset
/// or empty. A value that is not Unicode is converted lossily.
///
/// Thread-safety: reading the environment is safe from any thread.
pub fn var(name: &str) -> Option<String> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(|value| value.to_string_lossy().into_owned())
}

/// Parses a boolean variable's value (see the [module docs](self)):
/// `Some(true)` or `Some(false)`, or `None` when `raw` is not one of the
/// accepted spellings.
pub fn parse_bool(raw: &str) -> Option<bool> {
    const ON: [&str; 4] = ["1", "true", "on", "yes"];
    const OFF: [&str; 4] = ["0", "false", "off", "no"];
    if ON.iter().any(|v| raw.eq_ignore_ascii_case(v)) {
        Some(true)
    } else if OFF.iter().any(|v| raw.eq_ignore_ascii_case(v)) {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_accept_the_usual_spellings_in_any_case() {
        for on in ["1", "true", "TRUE", "True", "on", "ON", "yes", "Yes"] {
            assert_eq!(parse_bool(on), Some(true), "{on}");
        }
        for off in ["0", "false", "FALSE", "off", "Off", "no", "NO"] {
            assert_eq!(parse_bool(off), Some(false), "{off}");
        }
        for bad in [
            "", " 1", "1 ", "2", "-1", "y", "n", "enable", "truee", "0x1",
        ] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
    }
}

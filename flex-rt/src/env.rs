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
    var_or_empty(name).filter(|value| !value.is_empty())
}

/// Reads the process environment variable `name` as [`var`] does, but an
/// empty value is `Some("")`: for callers whose rules tell an empty value
/// from an unset one themselves.
///
/// Thread-safety: reading the environment is safe from any thread.
pub fn var_or_empty(name: &str) -> Option<String> {
    std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
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

/// Parses a whole-number variable's value: a decimal `u64`. The error says
/// what was expected, to follow `NAME="raw" is not valid: `: "it must be
/// at most 18446744073709551615" for a number too large for 64 bits,
/// "expected a decimal whole number" for anything else (a minus sign,
/// a fraction, a word). A leading `+` is accepted, as `str::parse` does.
///
/// # Errors
/// As above, when `raw` is not such a number.
pub fn parse_u64(raw: &str) -> Result<u64, String> {
    raw.parse::<u64>().map_err(|error| match error.kind() {
        std::num::IntErrorKind::PosOverflow => format!("it must be at most {}", u64::MAX),
        _ => "expected a decimal whole number".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_name_what_was_expected() {
        assert_eq!(parse_u64("0"), Ok(0));
        assert_eq!(parse_u64("+1"), Ok(1));
        assert_eq!(parse_u64("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_u64("18446744073709551616"),
            Err("it must be at most 18446744073709551615".to_owned())
        );
        for bad in ["", "-1", "1.5", "two", "0x10"] {
            assert_eq!(
                parse_u64(bad),
                Err("expected a decimal whole number".to_owned()),
                "{bad:?}"
            );
        }
    }

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

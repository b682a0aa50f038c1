//! Byte sizes on the command line (`4096`, `4KiB`, `1MiB`, `2GB`) and in
//! reports.
//!
//! Accepted forms: a whole decimal number of bytes, optionally followed
//! (after optional spaces) by a unit, case-insensitive:
//!
//! | unit | factor |
//! |---|---|
//! | none, `B` | 1 |
//! | `K`, `KiB` | 1024 |
//! | `M`, `MiB` | 1024² |
//! | `G`, `GiB` | 1024³ |
//! | `T`, `TiB` | 1024⁴ |
//! | `KB`, `MB`, `GB`, `TB` | 1000, 1000², 1000³, 1000⁴ |

/// What a valid size looks like, for error messages.
const EXPECTED: &str =
    "expected a whole number of bytes, optionally with a unit: for example 4096, 4KiB, 1MiB, 2GB";

/// Parses a byte size; see the [module docs](self). Zero is accepted here;
/// callers that need a positive size use [`parse_positive_size`].
///
/// # Errors
/// A message naming the text when it is empty, not a whole number, has an
/// unknown unit, or does not fit in 64 bits.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("{text:?} is not a size: {EXPECTED}"));
    }
    let mut rest = unit.chars();
    let number_goes_on = match rest.next() {
        Some('.' | ',' | '_') => true,
        Some('e' | 'E') => rest
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '+' || c == '-'),
        _ => false,
    };
    if number_goes_on {
        return Err(format!(
            "{text:?} is not a whole number of bytes: fractions, digit separators and exponents are not accepted; give a whole number, in a smaller unit if need be (1536KiB, not 1.5MiB)"
        ));
    }
    let factor: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {:?}: {EXPECTED}",
                unit.trim()
            ));
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("{text:?} is too large: a size must be below 2^64 bytes"))
}

/// Parses a byte size that must be at least one byte (the value parser of
/// `--size`).
///
/// # Errors
/// As [`parse_size`], and for zero.
pub(crate) fn parse_positive_size(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err(format!(
            "the size must be at least 1 byte, got {text:?} (0 bytes)"
        )),
        bytes => Ok(bytes),
    }
}

/// Parses one size of a comma-separated list (the value parser of
/// `--sizes`): as [`parse_positive_size`], and refusing a number with a
/// leading zero (`096`), which in a list is most likely the end of a
/// number written with a thousands separator (`4,096` reads as 4 and 096).
///
/// # Errors
/// As [`parse_positive_size`], and for a leading zero.
pub(crate) fn parse_listed_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.len() > 1
        && trimmed.starts_with('0')
        && trimmed[1..].starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!(
            "{text:?} starts with 0: `,` separates the sizes of the list, so a number written with a thousands separator (4,096) reads as two; write it without (4096) or with a unit (4KiB)"
        ));
    }
    parse_positive_size(text)
}

/// A size for people: `512 B`, `4 KiB`, `1.33 MiB`.
pub(crate) fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, factor) in UNITS {
        if bytes >= factor {
            return if bytes.is_multiple_of(factor) {
                format!("{} {unit}", bytes / factor)
            } else {
                format!("{:.2} {unit}", bytes as f64 / factor as f64)
            };
        }
    }
    format!("{bytes} B")
}

/// `bytes` of a total summed or multiplied with saturation: as
/// [`format_size`] gives it, or "more than 16 EiB" for `u64::MAX`, where
/// the saturation stops (the true figure does not fit in 64 bits).
pub(crate) fn format_total(bytes: u64) -> String {
    if bytes == u64::MAX {
        "more than 16 EiB".to_owned()
    } else {
        format_size(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saturated_total_is_not_shown_as_a_figure() {
        assert_eq!(format_total(u64::MAX), "more than 16 EiB");
        assert_eq!(format_total(u64::MAX - 1), format_size(u64::MAX - 1));
        assert_eq!(format_total(3 << 30), "3 GiB");
    }

    #[test]
    fn plain_bytes_and_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("12B"), Ok(12));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1mib"), Ok(1 << 20));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("3KB"), Ok(3000));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size(" 7 "), Ok(7));
    }

    #[test]
    fn bad_sizes_name_the_text() {
        for bad in ["", "abc", "-1", "1.5MiB", "MiB", "4XB", "4 K iB"] {
            let message = parse_size(bad).unwrap_err();
            assert!(message.contains(&format!("{bad:?}")), "{message}");
        }
        assert!(
            parse_size("4XB")
                .unwrap_err()
                .contains("unknown unit \"XB\"")
        );
        for not_whole in ["1.5MiB", "4,096", "4_096", "1e6", "2E+3", "1e-3"] {
            let message = parse_size(not_whole).unwrap_err();
            assert_eq!(
                message,
                format!(
                    "{not_whole:?} is not a whole number of bytes: fractions, digit separators and exponents are not accepted; give a whole number, in a smaller unit if need be (1536KiB, not 1.5MiB)"
                )
            );
        }
        assert!(
            parse_size("99999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_size("17TiB").is_ok());
        assert!(parse_size("16777216TiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn zero_is_refused_where_a_positive_size_is_needed() {
        let message = parse_positive_size("0KiB").unwrap_err();
        assert!(message.contains("\"0KiB\""), "{message}");
        assert!(message.contains("at least 1 byte"), "{message}");
        assert_eq!(parse_positive_size("1"), Ok(1));
    }

    #[test]
    fn a_listed_size_with_a_leading_zero_is_taken_for_a_thousands_separator() {
        for text in ["096", " 048", "00", "0KiB"] {
            let message = parse_listed_size(text).unwrap_err();
            assert!(message.contains(&format!("{text:?}")), "{message}");
        }
        assert!(
            parse_listed_size("096")
                .unwrap_err()
                .contains("thousands separator")
        );
        assert!(
            parse_listed_size("0")
                .unwrap_err()
                .contains("at least 1 byte")
        );
        assert_eq!(parse_listed_size("4096"), Ok(4096));
        assert_eq!(parse_listed_size(" 4KiB"), Ok(4096));
        assert_eq!(parse_listed_size("10"), Ok(10));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(1 << 20), "1 MiB");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(3 << 30), "3 GiB");
    }
}

//! The host memory a command is about to use, checked against what the
//! host has, so that a request too large for it is a usage error naming the
//! sizes instead of an allocation failure that aborts the process.

use crate::error::CliError;
use crate::size::{format_size, format_total};

/// Bytes of memory the host can give without swapping (`MemAvailable` in
/// `/proc/meminfo`), or `None` where that cannot be read.
fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&meminfo)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Refuses `needed` bytes of host memory for `what` when the host has less
/// available; where the available memory cannot be read, nothing is checked.
///
/// # Errors
/// [`CliError::Usage`] naming both sizes and what needed them.
pub(crate) fn check(needed: u64, what: &str) -> Result<(), CliError> {
    check_against(needed, available_bytes(), what)
}

/// Refuses `buffers` bytes of host memory (what `held` names: host
/// buffers, say) and `backed` bytes of the software device's memory
/// regions (which it backs with host memory when they are first written),
/// together, for `what`, when the host has less available; the message
/// names both parts when there are regions.
///
/// # Errors
/// As [`check`].
pub(crate) fn check_with_regions(
    buffers: u64,
    held: &str,
    backed: u64,
    what: &str,
) -> Result<(), CliError> {
    let what = if backed > 0 {
        format!(
            "{what} ({} of {held}, and {} of the software device's memory regions (SPYRE_MOCK_REGION_BYTES), which it backs with host memory when they are first written)",
            format_total(buffers),
            format_total(backed)
        )
    } else {
        what.to_owned()
    };
    check(buffers.saturating_add(backed), &what)
}

fn check_against(needed: u64, available: Option<u64>, what: &str) -> Result<(), CliError> {
    match available {
        Some(available) if needed > available => {
            // `needed` is summed with saturation: at the top it is a bound.
            let needed = if needed == u64::MAX {
                format!("more than {needed} bytes (16 EiB)")
            } else {
                format!("{needed} bytes ({})", format_size(needed))
            };
            Err(CliError::Usage(format!(
                "{what} needs {needed} of host memory, but the host has {available} bytes ({}) available (MemAvailable in /proc/meminfo)",
                format_size(available)
            )))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo =
            "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots\n"), None);
    }

    #[test]
    fn more_than_available_is_a_usage_error_naming_both() {
        assert!(check_against(10, Some(10), "x").is_ok());
        assert!(check_against(10, None, "x").is_ok());
        let err = check_against(3 << 30, Some(1 << 30), "--size 1GiB").unwrap_err();
        assert_eq!(err.exit_code(), crate::error::EXIT_USAGE);
        assert_eq!(
            err.to_string(),
            "--size 1GiB needs 3221225472 bytes (3 GiB) of host memory, but the host has 1073741824 bytes (1 GiB) available (MemAvailable in /proc/meminfo)"
        );
        // A need whose sum saturated is a bound, not a figure.
        assert_eq!(
            check_against(u64::MAX, Some(1 << 30), "x")
                .unwrap_err()
                .to_string(),
            "x needs more than 18446744073709551615 bytes (16 EiB) of host memory, but the host has 1073741824 bytes (1 GiB) available (MemAvailable in /proc/meminfo)"
        );
    }
}

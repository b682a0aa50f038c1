//! The host memory a command is about to use, checked against what the
//! host has and what the process's address-space limit leaves, so that a
//! request too large for them is a usage error naming the sizes instead of
//! an allocation failure that aborts the process. A bound: what is counted
//! is what the command's buffers and the software device's copies need,
//! not the threads' stacks or the allocator's own room, so a run just
//! under the limit may still fail in an allocation.

use crate::error::CliError;
use crate::size::{format_size, format_total};

/// Address space the C library's allocator may reserve for a thread that
/// allocates while others do: glibc gives such a thread an arena of its
/// own, up to a limit ([`arena_limit`]), a reservation of 64 MiB
/// (`HEAP_MAX_SIZE` on 64-bit hosts) of which it uses only what it needs.
/// Not memory the host gives, so not checked against what is available,
/// but an address-space limit (`ulimit -v`) counts it in full: arenas made
/// as the run's threads start leave that much less for the buffers and the
/// trace that grow after them, whose allocation then fails (and aborts the
/// process).
pub(crate) const THREAD_ARENA_BYTES: u64 = 64 << 20;

/// Arenas glibc's allocator makes at most in this process, the main one
/// among them: its `arena_max` where set to a positive number; else, as it
/// applies a limit only once it has more arenas than its `arena_test` (8
/// unless set), the larger of that and one, and 8 for each CPU (64-bit
/// hosts), `cpus`. Each setting is the `glibc.malloc.*` tunable of
/// `GLIBC_TUNABLES` (the last given), else the `MALLOC_ARENA_MAX` or
/// `MALLOC_ARENA_TEST` variable, read as C's `strtoul` with base 0 reads
/// (`0x40`, `010`). `lookup` reads the environment.
fn arena_limit(lookup: impl Fn(&str) -> Option<String>, cpus: u64) -> u64 {
    let setting = |tunable: &str, variable: &str| {
        let tuned = lookup("GLIBC_TUNABLES").and_then(|tunables| {
            tunables
                .split(':')
                .filter_map(|pair| pair.strip_prefix(tunable)?.strip_prefix('='))
                .filter_map(parse_c_number)
                .rfind(|&value| value > 0)
        });
        tuned.or_else(|| {
            lookup(variable)
                .and_then(|raw| parse_c_number(&raw))
                .filter(|&value| value > 0)
        })
    };
    if let Some(max) = setting("glibc.malloc.arena_max", "MALLOC_ARENA_MAX") {
        return max;
    }
    let test = setting("glibc.malloc.arena_test", "MALLOC_ARENA_TEST").unwrap_or(8);
    test.saturating_add(1).max(cpus.saturating_mul(8))
}

/// A whole number as C's `strtoul` with base 0 reads one: hexadecimal
/// after `0x`, octal after a leading `0`, else decimal; spaces around it
/// allowed.
fn parse_c_number(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if text.len() > 1
        && let Some(octal) = text.strip_prefix('0')
    {
        u64::from_str_radix(octal, 8).ok()
    } else {
        text.parse().ok()
    }
}

/// CPUs as glibc counts them for its arena limit: those online
/// (`/sys/devices/system/cpu/online`, such as `0-3,6`; newer versions
/// count those the process may run on, never more), else what the
/// standard library sees.
fn cpus_online() -> u64 {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| {
            text.trim().split(',').try_fold(0u64, |count, range| {
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                let (first, last): (u64, u64) = (first.parse().ok()?, last.parse().ok()?);
                Some(count + last.checked_sub(first)? + 1)
            })
        });
    listed
        .filter(|&cpus| cpus > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// Address space a thread the command starts reserves for its stack: the
/// standard library's size for a new thread (`RUST_MIN_STACK`, else 2 MiB)
/// and a guard page. Not memory used, but an address-space limit counts
/// it, and with many threads it is hundreds of MiB.
pub(crate) fn thread_stack_bytes() -> u64 {
    let stack = std::env::var("RUST_MIN_STACK")
        .ok()
        .and_then(|raw| raw.trim().parse().ok())
        .unwrap_or(2 << 20);
    stack + 4096
}

/// Address space that the allocator arenas of `threads` threads reserve
/// at most: an arena each, up to the allocator's limit ([`arena_limit`])
/// less the main arena. Threads that have made theirs already are in what
/// the process has mapped, and so counted twice: a bound, which refuses
/// some runs at the very edge of a limit rather than let one through that
/// would abort.
pub(crate) fn arena_bytes(threads: u64) -> u64 {
    let limit = arena_limit(|name| std::env::var(name).ok(), cpus_online());
    threads
        .min(limit.saturating_sub(1))
        .saturating_mul(THREAD_ARENA_BYTES)
}

/// What bounds the memory the process can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    /// The host's memory available without swapping.
    Host,
    /// What the process's address-space limit leaves.
    AddressSpace,
}

/// Bytes of memory the process can take, and what says so: the host's
/// memory available without swapping (`MemAvailable` in `/proc/meminfo`),
/// and what the process's address-space limit (`ulimit -v`, in
/// `/proc/self/limits`) leaves beside what it has mapped (`VmSize` in
/// `/proc/self/status`); each where it can be read.
fn available_bytes() -> Vec<(u64, Bound, &'static str)> {
    let read = |path| std::fs::read_to_string(path).ok();
    let host = read("/proc/meminfo")
        .and_then(|meminfo| parse_mem_available(&meminfo))
        .map(|bytes| {
            (
                bytes,
                Bound::Host,
                "available (MemAvailable in /proc/meminfo)",
            )
        });
    let limit = read("/proc/self/limits")
        .and_then(|limits| parse_address_space_limit(&limits))
        .map(|limit| {
            let mapped = read("/proc/self/status")
                .and_then(|status| parse_kib_field(&status, "VmSize:"))
                .unwrap_or(0);
            (
                limit.saturating_sub(mapped),
                Bound::AddressSpace,
                "left under the process's address-space limit (ulimit -v, in /proc/self/limits, less VmSize)",
            )
        });
    [host, limit].into_iter().flatten().collect()
}

/// The soft limit of `Max address space` of a `/proc/self/limits` text,
/// in bytes; `None` when unlimited or not found.
fn parse_address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line.trim_start_matches("Max address space")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A `field` given in kB (`MemAvailable:`, `VmSize:`) of a `/proc` text,
/// in bytes.
fn parse_kib_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line
        .trim_start_matches(field)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn parse_mem_available(meminfo: &str) -> Option<u64> {
    parse_kib_field(meminfo, "MemAvailable:")
}

/// Refuses `buffers` bytes of host memory (what `held` names: host
/// buffers, say) and `backed` bytes of the software device's memory
/// regions (which it backs with host memory when they are first written),
/// together, for `what`, when the host has less available, or the
/// process's address-space limit leaves less, where `reserved` bytes of
/// address space that are not used (threads' allocator arenas,
/// [`arena_bytes`], new threads' stacks, [`thread_stack_bytes`], and a
/// trace's room to grow) count too; the message
/// names both parts when there are regions. Where neither bound can be
/// read, nothing is checked.
///
/// # Errors
/// [`CliError::Usage`] naming the sizes, the bound and what needed them.
pub(crate) fn check_with_regions(
    buffers: u64,
    held: &str,
    backed: u64,
    reserved: u64,
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
    check_against(
        buffers.saturating_add(backed),
        reserved,
        &available_bytes(),
        &what,
    )
}

/// Refuses `needed` bytes for `what` against each of `available`'s
/// bounds, and `reserved` bytes more (address space reserved, not used)
/// against an address-space limit.
fn check_against(
    needed: u64,
    reserved: u64,
    available: &[(u64, Bound, &str)],
    what: &str,
) -> Result<(), CliError> {
    for &(available, bound, source) in available {
        let reserved = if bound == Bound::AddressSpace {
            reserved
        } else {
            0
        };
        if needed.saturating_add(reserved) <= available {
            continue;
        }
        // `needed` is summed with saturation: at the top it is a bound.
        let needed = if needed == u64::MAX {
            format!("more than {needed} bytes (16 EiB)")
        } else {
            format!("{needed} bytes ({})", format_size(needed))
        };
        let reserved = if reserved > 0 {
            format!(
                " and {reserved} bytes ({}) more of address space (its threads' memory allocator arenas, {} MiB a thread, their stacks, and a trace's room to grow; with glibc, MALLOC_ARENA_MAX=2 makes the arenas fewer)",
                format_size(reserved),
                THREAD_ARENA_BYTES >> 20
            )
        } else {
            String::new()
        };
        return Err(CliError::Usage(format!(
            "{what} needs {needed} of host memory{reserved}, but the process has {available} bytes ({}) {source}",
            format_size(available)
        )));
    }
    Ok(())
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
    fn the_address_space_limit_is_read_in_bytes() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax address space         614400000            unlimited            bytes     \n";
        assert_eq!(parse_address_space_limit(limits), Some(614_400_000));
        let unlimited =
            "Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(parse_address_space_limit(unlimited), None);
        assert_eq!(
            parse_kib_field("VmSize:\t    3892 kB\n", "VmSize:"),
            Some(3892 * 1024)
        );
    }

    const HOST: &str = "available (MemAvailable in /proc/meminfo)";

    #[test]
    fn more_than_available_is_a_usage_error_naming_both() {
        let host = |bytes| [(bytes, Bound::Host, HOST)];
        assert!(check_against(10, 0, &host(10), "x").is_ok());
        assert!(check_against(10, 0, &[], "x").is_ok());
        let err = check_against(3 << 30, 0, &host(1 << 30), "--size 1GiB").unwrap_err();
        assert_eq!(err.exit_code(), crate::error::EXIT_USAGE);
        assert_eq!(
            err.to_string(),
            "--size 1GiB needs 3221225472 bytes (3 GiB) of host memory, but the process has 1073741824 bytes (1 GiB) available (MemAvailable in /proc/meminfo)"
        );
        // A need whose sum saturated is a bound, not a figure.
        assert_eq!(
            check_against(u64::MAX, 0, &host(1 << 30), "x")
                .unwrap_err()
                .to_string(),
            "x needs more than 18446744073709551615 bytes (16 EiB) of host memory, but the process has 1073741824 bytes (1 GiB) available (MemAvailable in /proc/meminfo)"
        );
    }

    /// The address space threads' arenas reserve counts against an
    /// address-space limit, not against the host's available memory:
    /// 512 MiB needed and two arenas (128 MiB) fit 1 GiB of either, and
    /// 900 MiB with them fit the host's 1 GiB but not a limit's.
    #[test]
    fn reserved_address_space_counts_only_against_a_limit() {
        const LIMIT: &str = "left under the process's address-space limit";
        let both = |bytes| {
            [
                (bytes, Bound::Host, HOST),
                (bytes, Bound::AddressSpace, LIMIT),
            ]
        };
        let arenas = 2 * THREAD_ARENA_BYTES;
        assert!(check_against(512 << 20, arenas, &both(1 << 30), "x").is_ok());
        assert!(check_against(900 << 20, arenas, &[(1 << 30, Bound::Host, HOST)], "x").is_ok());
        assert_eq!(
            check_against(900 << 20, arenas, &both(1 << 30), "x")
                .unwrap_err()
                .to_string(),
            "x needs 943718400 bytes (900 MiB) of host memory and 134217728 bytes (128 MiB) more of address space (its threads' memory allocator arenas, 64 MiB a thread, their stacks, and a trace's room to grow; with glibc, MALLOC_ARENA_MAX=2 makes the arenas fewer), but the process has 1073741824 bytes (1 GiB) left under the process's address-space limit"
        );
    }

    /// glibc's arena limit: its tunable (the last), else `MALLOC_ARENA_MAX`,
    /// read as C reads numbers; else the larger of `arena_test` + 1 and 8 a
    /// CPU. A value that is not a positive number is not a setting.
    #[test]
    fn the_arena_limit_is_the_allocators() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(arena_limit(env(&[]), 2), 16);
        assert_eq!(arena_limit(env(&[]), 1), 9, "the allocator's arena_test");
        assert_eq!(arena_limit(env(&[("MALLOC_ARENA_MAX", "1")]), 2), 1);
        assert_eq!(arena_limit(env(&[("MALLOC_ARENA_MAX", "0")]), 2), 16);
        assert_eq!(arena_limit(env(&[("MALLOC_ARENA_MAX", "many")]), 2), 16);
        assert_eq!(arena_limit(env(&[("MALLOC_ARENA_MAX", "0x40")]), 2), 64);
        assert_eq!(arena_limit(env(&[("MALLOC_ARENA_MAX", "010")]), 2), 8);
        assert_eq!(arena_limit(env(&[("MALLOC_ARENA_TEST", "100")]), 2), 101);
        assert_eq!(
            arena_limit(env(&[("GLIBC_TUNABLES", "glibc.malloc.arena_test=100")]), 2),
            101
        );
        let tuned = |tunables: &'static str| {
            arena_limit(
                move |name: &str| match name {
                    "MALLOC_ARENA_MAX" => Some("64".to_owned()),
                    "GLIBC_TUNABLES" => Some(tunables.to_owned()),
                    _ => None,
                },
                2,
            )
        };
        assert_eq!(tuned("glibc.malloc.check=0:glibc.malloc.arena_max=3"), 3);
        assert_eq!(
            tuned("glibc.malloc.arena_max=2:glibc.malloc.arena_max=5"),
            5
        );
        assert_eq!(tuned("glibc.malloc.arena_max=0"), 64, "a rejected tunable");
    }
}

//! The environment variables the stream layer reads, each parsed by a pure
//! function of the raw value so that every rule is testable in-process.

use std::num::IntErrorKind;

use crate::error::{Error, Result};
use crate::id::{DEFAULT_HOST_COMPUTE_STREAMS, MAX_HOST_COMPUTE_STREAMS};

/// Logical device of the process when no thread-local device is set (torchrun sets it).
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// Open MPI's local rank (`mpirun`).
pub const OMPI_LOCAL_RANK: &str = "OMPI_COMM_WORLD_LOCAL_RANK";
/// MPICH's local rank (Hydra's `mpiexec`).
pub const MPICH_LOCAL_RANK: &str = "MPI_LOCALRANKID";
/// Slurm's local task id (`srun`).
pub const SLURM_LOCAL_ID: &str = "SLURM_LOCALID";
/// The launchers' local-rank variables, in the order they are asked: the
/// first one set gives the process's logical device. torchrun's first, then
/// Open MPI's, MPICH's and Slurm's: a launcher started by another sets its
/// own variable and inherits the outer one's, so the more specific (inner)
/// launcher must win — `srun` starting `torchrun` sets `SLURM_LOCALID` per
/// node task and `LOCAL_RANK` per worker, and the worker is the process.
pub const LOCAL_RANK_VARIABLES: [&str; 4] = [
    LOCAL_RANK,
    OMPI_LOCAL_RANK,
    MPICH_LOCAL_RANK,
    SLURM_LOCAL_ID,
];
/// Number of host-compute streams (ids 65..65+N-1).
pub const NUM_HOST_COMPUTE_STREAMS: &str = "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS";
/// A boolean (see [`flex_rt::env`]): on makes every stream created
/// afterwards track hazards.
pub const HAZARD_TRACKER: &str = "SPYRE_HAZARD_TRACKER";
/// `mock` or `hardware`: the backend, when both are compiled in.
pub const BACKEND: &str = "SPYRE_BACKEND";

/// Every environment variable the stream layer and its backends read, in a
/// stable order: this crate's, then `FLEX_RUNTIME_LIB` (the hardware
/// backend's), then the software device's `SPYRE_MOCK_*` and
/// `SPYRE_DEVICES` when feature `mock` is on.
pub fn variables() -> Vec<&'static str> {
    let mut names = LOCAL_RANK_VARIABLES.to_vec();
    names.extend([
        NUM_HOST_COMPUTE_STREAMS,
        HAZARD_TRACKER,
        BACKEND,
        flex_rt::RUNTIME_LIB_ENV,
    ]);
    #[cfg(feature = "mock")]
    names.extend(spyre_mock::config::ENV_VARS);
    names
}

/// Largest logical device index (`c10::DeviceIndex` is an `i8`).
pub const MAX_DEVICE_INDEX: u8 = 127;

/// Reads a variable: `None` when unset or empty (the workspace's rule, see
/// [`flex_rt::env`]); a value that is not Unicode is kept lossily so that
/// the parser can name it in its error.
pub(crate) fn var(name: &str) -> Option<String> {
    flex_rt::env::var(name)
}

/// What [`invalid`] adds to the reason for a value with spaces around it.
const SPACES_NOTE: &str =
    "; spaces around the value are not accepted (the stream layer reads its variables strictly)";

/// [`Error::InvalidEnv`] for `variable`'s raw `value`, refused for
/// `reason`; the reason says so too when the value has spaces around it,
/// which this layer's variables refuse (the software device's
/// `SPYRE_MOCK_*` ones accept them), so that an error whose value looks
/// right tells why.
pub(crate) fn invalid(variable: &'static str, value: &str, reason: impl Into<String>) -> Error {
    let mut reason = reason.into();
    if value.trim() != value {
        reason.push_str(SPACES_NOTE);
    }
    Error::InvalidEnv {
        variable,
        value: value.to_owned(),
        reason,
    }
}

/// Parses `LOCAL_RANK` (torch-spyre's strict `parse_local_rank`): unset or
/// empty gives 0; otherwise a base-10 integer in 0..=127 with nothing else
/// around it.
///
/// # Errors
/// [`Error::InvalidEnv`] naming the raw value when it is not an integer, is
/// negative, or exceeds 127.
pub fn parse_local_rank(raw: Option<&str>) -> Result<u8> {
    parse_rank(LOCAL_RANK, raw)
}

/// Parses a launcher's local-rank variable `variable` (one of
/// [`LOCAL_RANK_VARIABLES`]) with `LOCAL_RANK`'s rules
/// ([`parse_local_rank`]); errors name `variable`.
///
/// # Errors
/// As [`parse_local_rank`].
pub fn parse_rank(variable: &'static str, raw: Option<&str>) -> Result<u8> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(0);
    };
    match raw.parse::<i64>() {
        Ok(v) if v < 0 => Err(invalid(
            variable,
            raw,
            format!(
                "{variable} value is out of range: '{raw}' (a device index cannot be negative)"
            ),
        )),
        Ok(v) if v > i64::from(MAX_DEVICE_INDEX) => Err(invalid(
            variable,
            raw,
            format!(
                "{variable} value {v} exceeds the maximum supported device index ({MAX_DEVICE_INDEX})"
            ),
        )),
        Ok(v) => Ok(v as u8),
        Err(e)
            if matches!(
                e.kind(),
                IntErrorKind::PosOverflow | IntErrorKind::NegOverflow
            ) =>
        {
            Err(invalid(
                variable,
                raw,
                format!("{variable} value is out of range: '{raw}'; expected 0..=127"),
            ))
        }
        Err(_) => Err(invalid(
            variable,
            raw,
            format!("{variable} is not a valid integer: '{raw}'; expected 0..=127"),
        )),
    }
}

/// The launcher's local rank: the first of [`LOCAL_RANK_VARIABLES`] that
/// `lookup` finds set (non-empty), parsed strictly, with its name; `None`
/// when none is set. A malformed value is an error, not a reason to ask
/// the next variable.
///
/// # Errors
/// As [`parse_rank`], naming the variable that was set.
pub fn launcher_local_rank(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Option<(u8, &'static str)>> {
    for variable in LOCAL_RANK_VARIABLES {
        if let Some(raw) = lookup(variable).filter(|raw| !raw.is_empty()) {
            return parse_rank(variable, Some(&raw)).map(|rank| Some((rank, variable)));
        }
    }
    Ok(None)
}

/// Parses `TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS`: unset or empty gives 4;
/// 1–8 are taken as they are; larger values are capped at 8 with a warning.
///
/// Stricter than torch-spyre's `atoi`: trailing junk and spaces are errors
/// rather than silently read as a number or as 0.
///
/// # Errors
/// [`Error::InvalidEnv`] naming the variable and raw value for 0, negative
/// numbers, or anything that is not an integer.
pub fn parse_host_compute_streams(raw: Option<&str>) -> Result<usize> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(DEFAULT_HOST_COMPUTE_STREAMS);
    };
    let count = match raw.parse::<i64>() {
        Ok(v) => v,
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => i64::MAX,
        Err(_) => {
            return Err(invalid(
                NUM_HOST_COMPUTE_STREAMS,
                raw,
                format!(
                    "expected an integer of at least 1 (larger than {MAX_HOST_COMPUTE_STREAMS} is capped at {MAX_HOST_COMPUTE_STREAMS})"
                ),
            ));
        }
    };
    if count < 1 {
        return Err(invalid(
            NUM_HOST_COMPUTE_STREAMS,
            raw,
            format!(
                "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS must be at least 1, got '{raw}' (larger than {MAX_HOST_COMPUTE_STREAMS} is capped at {MAX_HOST_COMPUTE_STREAMS})"
            ),
        ));
    }
    if count > MAX_HOST_COMPUTE_STREAMS as i64 {
        tracing::warn!(
            variable = NUM_HOST_COMPUTE_STREAMS,
            value = raw,
            "capping host-compute streams at {MAX_HOST_COMPUTE_STREAMS}"
        );
        return Ok(MAX_HOST_COMPUTE_STREAMS);
    }
    Ok(count as usize)
}

/// Parses `SPYRE_HAZARD_TRACKER`, a boolean ([`flex_rt::env::parse_bool`]):
/// unset or empty is off.
///
/// Stricter than torch-spyre, which takes exactly `"1"` as on and anything
/// else as off: here `true`, `on` and `yes` are on too, and a value that is
/// no boolean is an error rather than silently off.
///
/// # Errors
/// [`Error::InvalidEnv`] naming the raw value when it is not a boolean.
pub fn parse_hazard_tracker(raw: Option<&str>) -> Result<bool> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(false);
    };
    flex_rt::env::parse_bool(raw)
        .ok_or_else(|| invalid(HAZARD_TRACKER, raw, flex_rt::env::BOOL_EXPECTED))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(err: Error) -> (String, String) {
        match err {
            Error::InvalidEnv { value, reason, .. } => (value, reason),
            other => panic!("expected InvalidEnv, got {other:?}"),
        }
    }

    #[test]
    fn local_rank_unset_or_empty_is_zero() {
        assert_eq!(parse_local_rank(None).unwrap(), 0);
        assert_eq!(parse_local_rank(Some("")).unwrap(), 0);
    }

    #[test]
    fn local_rank_accepts_0_to_127() {
        assert_eq!(parse_local_rank(Some("0")).unwrap(), 0);
        assert_eq!(parse_local_rank(Some("3")).unwrap(), 3);
        assert_eq!(parse_local_rank(Some("127")).unwrap(), 127);
    }

    #[test]
    fn local_rank_rejects_garbage_negative_and_large_values() {
        let (value, why) = reason(parse_local_rank(Some("abc")).unwrap_err());
        assert_eq!(value, "abc");
        assert!(why.contains("not a valid integer"), "{why}");
        assert!(
            reason(parse_local_rank(Some(" 1")).unwrap_err())
                .1
                .contains("not a valid integer")
        );
        assert!(
            reason(parse_local_rank(Some("1x")).unwrap_err())
                .1
                .contains("not a valid integer")
        );
        // torch-spyre's texts, with the raw value quoted as it quotes it.
        assert!(
            reason(parse_local_rank(Some("-1")).unwrap_err())
                .1
                .starts_with("LOCAL_RANK value is out of range: '-1'")
        );
        assert!(
            reason(parse_local_rank(Some("128")).unwrap_err())
                .1
                .contains("128 exceeds the maximum supported device index (127)")
        );
        assert!(
            reason(parse_local_rank(Some("99999999999999999999")).unwrap_err())
                .1
                .starts_with("LOCAL_RANK value is out of range: '99999999999999999999'")
        );
        let message = parse_local_rank(Some("abc")).unwrap_err().to_string();
        assert!(
            message.starts_with("LOCAL_RANK=\"abc\" is invalid"),
            "{message}"
        );
    }

    /// A value with spaces around it is refused, and the reason says why
    /// (the message otherwise shows a value that looks right); one without
    /// gets no such note.
    #[test]
    fn values_refused_for_spaces_around_them_say_so() {
        let refusals = [
            parse_local_rank(Some("0 ")).unwrap_err(),
            parse_host_compute_streams(Some(" 3")).unwrap_err(),
            parse_hazard_tracker(Some("1\t")).unwrap_err(),
            crate::backend::parse_backend(Some("mock ")).unwrap_err(),
        ];
        for err in refusals {
            let (value, why) = reason(err);
            assert!(why.ends_with(SPACES_NOTE), "{value:?}: {why}");
        }
        let (_, why) = reason(parse_local_rank(Some("abc")).unwrap_err());
        assert_eq!(
            why,
            "LOCAL_RANK is not a valid integer: 'abc'; expected 0..=127"
        );
    }

    #[test]
    fn the_innermost_launcher_chooses_the_device() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(launcher_local_rank(env(&[])).unwrap(), None);
        // srun starting torchrun: torchrun's LOCAL_RANK wins.
        assert_eq!(
            launcher_local_rank(env(&[(SLURM_LOCAL_ID, "0"), (LOCAL_RANK, "3")])).unwrap(),
            Some((3, LOCAL_RANK))
        );
        // mpirun inside a Slurm allocation: Open MPI's wins.
        assert_eq!(
            launcher_local_rank(env(&[(SLURM_LOCAL_ID, "1"), (OMPI_LOCAL_RANK, "2")])).unwrap(),
            Some((2, OMPI_LOCAL_RANK))
        );
        assert_eq!(
            launcher_local_rank(env(&[(MPICH_LOCAL_RANK, "5"), (SLURM_LOCAL_ID, "1")])).unwrap(),
            Some((5, MPICH_LOCAL_RANK))
        );
        assert_eq!(
            launcher_local_rank(env(&[(SLURM_LOCAL_ID, "7")])).unwrap(),
            Some((7, SLURM_LOCAL_ID))
        );
        // Empty is unset: the next variable is asked.
        assert_eq!(
            launcher_local_rank(env(&[(LOCAL_RANK, ""), (SLURM_LOCAL_ID, "1")])).unwrap(),
            Some((1, SLURM_LOCAL_ID))
        );
    }

    #[test]
    fn a_malformed_launcher_rank_is_named_and_not_skipped() {
        let lookup = |name: &str| match name {
            OMPI_LOCAL_RANK => Some("x1".to_owned()),
            SLURM_LOCAL_ID => Some("0".to_owned()),
            _ => None,
        };
        let message = launcher_local_rank(lookup).unwrap_err().to_string();
        assert_eq!(
            message,
            "OMPI_COMM_WORLD_LOCAL_RANK=\"x1\" is invalid: OMPI_COMM_WORLD_LOCAL_RANK is not a valid integer: 'x1'; expected 0..=127"
        );
        let (value, why) = reason(parse_rank(SLURM_LOCAL_ID, Some("200")).unwrap_err());
        assert_eq!(value, "200");
        assert_eq!(
            why,
            "SLURM_LOCALID value 200 exceeds the maximum supported device index (127)"
        );
    }

    #[test]
    fn host_compute_default_range_and_cap() {
        assert_eq!(parse_host_compute_streams(None).unwrap(), 4);
        assert_eq!(parse_host_compute_streams(Some("1")).unwrap(), 1);
        assert_eq!(parse_host_compute_streams(Some("8")).unwrap(), 8);
        assert_eq!(parse_host_compute_streams(Some("9")).unwrap(), 8);
        assert_eq!(
            parse_host_compute_streams(Some("99999999999999999999999")).unwrap(),
            8
        );
    }

    #[test]
    fn host_compute_rejects_zero_negative_empty_and_junk() {
        assert_eq!(parse_host_compute_streams(Some("")).unwrap(), 4);
        for raw in ["0", "-1", " ", "abc", "3abc", " 3"] {
            let err = parse_host_compute_streams(Some(raw)).unwrap_err();
            let message = err.to_string();
            assert!(
                message.starts_with(&format!(
                    "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS={raw:?} is invalid"
                )),
                "{message}"
            );
        }
        // Below 1: torch-spyre's text, and what is done above the cap.
        let message = parse_host_compute_streams(Some("0"))
            .unwrap_err()
            .to_string();
        assert!(
            message.ends_with(
                "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS must be at least 1, got '0' (larger than 8 is capped at 8)"
            ),
            "{message}"
        );
    }

    #[test]
    fn hazard_tracker_takes_booleans_and_rejects_anything_else() {
        for raw in ["1", "true", "TRUE", "on", "Yes"] {
            assert!(parse_hazard_tracker(Some(raw)).unwrap(), "{raw:?}");
        }
        for raw in [
            None,
            Some(""),
            Some("0"),
            Some("false"),
            Some("OFF"),
            Some("no"),
        ] {
            assert!(!parse_hazard_tracker(raw).unwrap(), "{raw:?}");
        }
        for raw in ["2", "enabled", "-"] {
            let message = parse_hazard_tracker(Some(raw)).unwrap_err().to_string();
            assert_eq!(
                message,
                format!(
                    "SPYRE_HAZARD_TRACKER={raw:?} is invalid: expected a boolean: 1, true, on or yes for on; 0, false, off or no for off (case-insensitive)"
                )
            );
        }
    }
}

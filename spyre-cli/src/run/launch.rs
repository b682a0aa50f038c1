//! What a launcher tells a process of its launch: its rank among all the
//! processes, and how many there are. The stream layer reads only the
//! local rank, for the device ([`spyre_stream::DeviceSource::LocalRank`]);
//! `spyre run` reads the rest for its output files (`{rank}` in a path, and
//! the warning that ranks given one path write one file).

use std::ffi::OsString;

use spyre_stream::DeviceSource;
use spyre_stream::env::{LOCAL_RANK, MPICH_LOCAL_RANK, OMPI_LOCAL_RANK, SLURM_LOCAL_ID};

use crate::error::CliError;

/// A launcher's variables: its local rank (which the stream layer reads),
/// the process's rank among all of the launch's, and their number.
struct Launcher {
    local_rank: &'static str,
    rank: &'static str,
    size: &'static str,
}

/// torchrun, Open MPI's `mpirun`, MPICH's `mpiexec` (Hydra) and Slurm's
/// `srun` (the size of the job step, not of the job: a batch script of a
/// job of four tasks is one process), in the stream layer's order of
/// their local ranks.
const LAUNCHERS: [Launcher; 4] = [
    Launcher {
        local_rank: LOCAL_RANK,
        rank: "RANK",
        size: "WORLD_SIZE",
    },
    Launcher {
        local_rank: OMPI_LOCAL_RANK,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
    },
    Launcher {
        local_rank: MPICH_LOCAL_RANK,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
    },
    Launcher {
        local_rank: SLURM_LOCAL_ID,
        rank: "SLURM_PROCID",
        size: "SLURM_STEP_NUM_TASKS",
    },
];

/// The launcher whose local rank chose the device, if one did.
fn launcher(source: DeviceSource) -> Option<&'static Launcher> {
    match source {
        DeviceSource::LocalRank(variable) => LAUNCHERS.iter().find(|l| l.local_rank == variable),
        _ => None,
    }
}

/// What a launcher that chose the device says of the launch: the local
/// rank's variable, and how many processes it started, if it says so with
/// a whole number. `None` where no launcher chose the device.
pub(crate) fn launch(source: DeviceSource) -> Option<(&'static str, Option<u64>)> {
    launch_in(source, &|name| std::env::var_os(name))
}

/// [`launch`] in the environment `lookup` reads.
fn launch_in(
    source: DeviceSource,
    lookup: &dyn Fn(&str) -> Option<OsString>,
) -> Option<(&'static str, Option<u64>)> {
    let launcher = launcher(source)?;
    let size = lookup(launcher.size).and_then(|raw| raw.to_str()?.trim().parse().ok());
    Some((launcher.local_rank, size))
}

/// The process's rank among all of its launch's, for `{rank}` in a path:
/// the rank variable of the launcher that chose the device (`source`),
/// else the first set of `RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK` and
/// `SLURM_PROCID` (a wrapper may have set only the local rank the stream
/// layer reads first); where none is set, the local rank that chose the
/// device (ranks started on one host by hand), else 0 (a process on its
/// own).
///
/// # Errors
/// [`CliError::Usage`] naming the variable and its value when it is not a
/// whole number.
pub(crate) fn rank(source: DeviceSource) -> Result<u64, CliError> {
    rank_in(source, &|name| std::env::var_os(name))
}

/// [`rank`] in the environment `lookup` reads.
fn rank_in(
    source: DeviceSource,
    lookup: &dyn Fn(&str) -> Option<OsString>,
) -> Result<u64, CliError> {
    let set = |name: &'static str| lookup(name).filter(|v| !v.is_empty()).map(|v| (name, v));
    let chosen = launcher(source);
    let found = chosen
        .and_then(|launcher| set(launcher.rank))
        .or_else(|| LAUNCHERS.iter().find_map(|l| set(l.rank)))
        .or_else(|| chosen.and_then(|launcher| set(launcher.local_rank)));
    let Some((variable, raw)) = found else {
        return Ok(0);
    };
    raw.to_str()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| {
            CliError::Usage(format!(
                "{variable}={raw:?} is not a rank, which {{rank}} in an output path stands for: expected a whole number, as the launcher sets it"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment of `pairs` only.
    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), OsString::from(value)))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        }
    }

    /// Each launcher's local rank finds its own rank and size variables;
    /// the stream layer's local-rank variables are all known, in its order.
    #[test]
    fn each_launcher_reads_its_own_size() {
        assert_eq!(
            spyre_stream::env::LOCAL_RANK_VARIABLES.to_vec(),
            LAUNCHERS.iter().map(|l| l.local_rank).collect::<Vec<_>>(),
        );
        let sizes = [
            ("LOCAL_RANK", "WORLD_SIZE"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("MPI_LOCALRANKID", "PMI_SIZE"),
            ("SLURM_LOCALID", "SLURM_STEP_NUM_TASKS"),
        ];
        for (local, size) in sizes {
            let source = DeviceSource::LocalRank(local);
            let others: Vec<(&str, &str)> = sizes
                .iter()
                .filter(|(_, other)| *other != size)
                .map(|(_, other)| (*other, "9"))
                .collect();
            let with = [&others[..], &[(size, " 4 ")]].concat();
            assert_eq!(launch_in(source, &env(&with)), Some((local, Some(4))));
            assert_eq!(
                launch_in(source, &env(&others)),
                Some((local, None)),
                "{local} without {size}"
            );
            assert_eq!(
                launch_in(source, &env(&[(size, "two")])),
                Some((local, None)),
                "not a number"
            );
        }
        assert_eq!(
            launch_in(DeviceSource::Default, &env(&[("WORLD_SIZE", "4")])),
            None
        );
    }

    #[test]
    fn the_rank_is_the_choosing_launchers_else_the_first_set_else_the_local_rank() {
        let torchrun = DeviceSource::LocalRank(spyre_stream::env::LOCAL_RANK);
        let slurm = DeviceSource::LocalRank(spyre_stream::env::SLURM_LOCAL_ID);
        let rank = |source, pairs: &[(&str, &str)]| {
            rank_in(source, &env(pairs)).map_err(|e| e.to_string())
        };
        assert_eq!(rank(DeviceSource::Default, &[]), Ok(0));
        assert_eq!(
            rank(torchrun, &[("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")]),
            Ok(1),
            "no rank set: the local rank"
        );
        assert_eq!(
            rank(torchrun, &[("RANK", "7"), ("SLURM_PROCID", "3")]),
            Ok(7)
        );
        assert_eq!(rank(slurm, &[("RANK", "7"), ("SLURM_PROCID", "3")]), Ok(3));
        assert_eq!(
            rank(
                DeviceSource::Default,
                &[("PMI_RANK", "5"), ("SLURM_PROCID", "3")]
            ),
            Ok(5)
        );
        assert_eq!(
            rank(torchrun, &[("RANK", ""), ("OMPI_COMM_WORLD_RANK", "6")]),
            Ok(6),
            "empty is unset: a wrapper's LOCAL_RANK beside Open MPI's rank"
        );
        assert_eq!(rank(torchrun, &[("RANK", " 12 ")]), Ok(12));
        for bad in ["-1", "1e3", "99999999999999999999999", "x"] {
            assert_eq!(
                rank(torchrun, &[("RANK", bad)]),
                Err(format!(
                    "RANK={bad:?} is not a rank, which {{rank}} in an output path stands for: expected a whole number, as the launcher sets it"
                ))
            );
        }
    }
}

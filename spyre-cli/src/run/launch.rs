//! What a launcher tells a process of its launch: its rank among all the
//! processes, and how many there are. The stream layer reads only the
//! local rank, for the device ([`spyre_stream::DeviceSource::LocalRank`]);
//! `spyre run` reads the rest for its output files (`{rank}` in a path, and
//! the warning that ranks given one path write one file).

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

/// How many processes the launcher that chose the device (`source`) says
/// it started, if one did and says so with a whole number.
pub(crate) fn size(source: DeviceSource) -> Option<u64> {
    let launcher = launcher(source)?;
    std::env::var(launcher.size).ok()?.trim().parse().ok()
}

/// The process's rank among all of its launch's, for `{rank}` in a path:
/// the rank variable of the launcher that chose the device (`source`), or
/// where none did, the first set of `RANK`, `OMPI_COMM_WORLD_RANK`,
/// `PMI_RANK` and `SLURM_PROCID`; 0 (a process on its own) where none is.
///
/// # Errors
/// [`CliError::Usage`] naming the variable and its value when it is not a
/// whole number.
pub(crate) fn rank(source: DeviceSource) -> Result<u64, CliError> {
    let variable = match launcher(source) {
        Some(launcher) => Some(launcher.rank),
        None => LAUNCHERS
            .iter()
            .map(|l| l.rank)
            .find(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty())),
    };
    let Some(variable) = variable else {
        return Ok(0);
    };
    let Some(raw) = std::env::var_os(variable).filter(|v| !v.is_empty()) else {
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

    /// Each launcher's local rank finds its own rank and size variables.
    #[test]
    fn each_launcher_pairs_its_local_rank_with_its_rank_and_size() {
        let pairs: Vec<_> = LAUNCHERS
            .iter()
            .map(|l| (l.local_rank, l.rank, l.size))
            .collect();
        assert_eq!(
            pairs,
            [
                ("LOCAL_RANK", "RANK", "WORLD_SIZE"),
                (
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE"
                ),
                ("MPI_LOCALRANKID", "PMI_RANK", "PMI_SIZE"),
                ("SLURM_LOCALID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
            ]
        );
        assert_eq!(
            spyre_stream::env::LOCAL_RANK_VARIABLES.to_vec(),
            LAUNCHERS.iter().map(|l| l.local_rank).collect::<Vec<_>>(),
            "every launcher the stream layer knows, in its order"
        );
        for source in [DeviceSource::Default, DeviceSource::Requested] {
            assert!(launcher(source).is_none());
        }
    }
}

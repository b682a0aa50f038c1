//! `spyre info`: what this process would run on, and why.
//!
//! The environment is shown even when the runtime cannot start (a missing
//! library, a malformed variable): the report then carries the error, and
//! the command exits with that error's code after printing it.

use std::fmt::Write as _;

use serde::Serialize;
use spyre_stream::{
    BackendKind, HIGH_POOL_END, HIGH_POOL_START, HOST_COMPUTE_START, NORMAL_POOL_END,
    NORMAL_POOL_START, StreamId, env,
};

use crate::error::CliError;
use crate::output::OrderedMap;

/// The pool's id layout.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PoolLayout {
    /// The default stream's id (0).
    pub(crate) default_stream: i64,
    /// First and last id of the normal-priority pool.
    pub(crate) normal: [i64; 2],
    /// First and last id of the high-priority pool.
    pub(crate) high: [i64; 2],
    /// First and last id of the host-compute streams.
    pub(crate) host_compute: [i64; 2],
    /// Number of host-compute streams.
    pub(crate) host_compute_streams: usize,
}

impl PoolLayout {
    /// The layout with `host_compute_streams` host-compute streams.
    pub(crate) fn new(host_compute_streams: usize) -> Self {
        let last_host_compute = HOST_COMPUTE_START + host_compute_streams as i64 - 1;
        Self {
            default_stream: StreamId::DEFAULT.get(),
            normal: [NORMAL_POOL_START, NORMAL_POOL_END],
            high: [HIGH_POOL_START, HIGH_POOL_END],
            host_compute: [HOST_COMPUTE_START, last_host_compute],
            host_compute_streams,
        }
    }
}

/// Everything `spyre info` reports; `--json` prints it as one object.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct InfoReport {
    /// Version of this command.
    pub(crate) version: &'static str,
    /// Backends compiled into this build.
    pub(crate) compiled_backends: Vec<&'static str>,
    /// The backend the build and `SPYRE_BACKEND` select, when valid.
    pub(crate) selected_backend: Option<&'static str>,
    /// Why none is selected (in the text; the JSON's `error` has the
    /// start's error).
    #[serde(skip)]
    pub(crate) unselected_because: Option<String>,
    /// The backend the runtime started on.
    pub(crate) backend: Option<&'static str>,
    /// The backend's details: for hardware the library path and ABI
    /// version, for the software device its configuration.
    pub(crate) backend_details: OrderedMap<String>,
    /// Logical devices the backend sees.
    pub(crate) device_count: Option<u32>,
    /// The logical device this process binds.
    pub(crate) device: Option<u8>,
    /// Why that device: `requested`, `set_device`, the launcher variable
    /// that named it (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
    /// `MPI_LOCALRANKID` or `SLURM_LOCALID`) or `default`.
    pub(crate) device_source: Option<&'static str>,
    /// A longer description of the source.
    pub(crate) device_source_detail: Option<&'static str>,
    /// The pool's id layout.
    pub(crate) pool: Option<PoolLayout>,
    /// Whether new streams track hazards (`SPYRE_HAZARD_TRACKER=1`).
    pub(crate) hazard_tracking: Option<bool>,
    /// Device memory: `"1073741824 bytes (1 GiB), 1073741824 free"`, or why
    /// the runtime cannot tell (a flex library of ABI 1.0).
    pub(crate) device_memory: Option<String>,
    /// Events: `"device-side waits, timing"`, `"host-blocking waits,
    /// timing"` and so on, or why there are none (a flex library of ABI
    /// 1.0).
    pub(crate) events: Option<String>,
    /// The environment variables the stream layer and its backends read:
    /// the value, or `null` when unset (an empty value, which they take as
    /// unset, is shown as it is: `""`); then every other `SPYRE_*`
    /// variable that is set, by name (a flex library may read them: the
    /// software device's reads `SPYRE_MOCK_*` and `SPYRE_DEVICES`, which a
    /// build without the software device does not list).
    pub(crate) environment: OrderedMap<Option<String>>,
    /// Why the runtime could not start, if it could not.
    pub(crate) error: Option<String>,
}

/// The environment variables shown: the stream layer's, the hardware
/// backend's and the software device's.
pub(crate) fn environment_variables() -> Vec<&'static str> {
    let mut names = env::variables();
    names.push("RUST_LOG");
    names
}

/// Gathers the report, starting the runtime. Returns the report and, when
/// the runtime could not start, the error (already described in the report).
pub(crate) fn gather() -> (InfoReport, Option<CliError>) {
    let known = environment_variables();
    let mut others: Vec<(String, Option<String>)> = std::env::vars_os()
        .map(|(name, value)| {
            (
                name.to_string_lossy().into_owned(),
                Some(value.to_string_lossy().into_owned()),
            )
        })
        .filter(|(name, _)| name.starts_with("SPYRE_") && !known.contains(&name.as_str()))
        .collect();
    others.sort();
    let environment = OrderedMap(
        known
            .iter()
            .map(|&name| {
                let value = std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
                (name.to_string(), value)
            })
            .chain(others)
            .collect(),
    );
    let selected = spyre_stream::selected_backend();
    let mut report = InfoReport {
        version: env!("CARGO_PKG_VERSION"),
        compiled_backends: [BackendKind::Mock, BackendKind::Hardware]
            .into_iter()
            .filter(|k| k.is_compiled())
            .map(BackendKind::as_str)
            .collect(),
        selected_backend: selected.as_ref().ok().map(|kind| kind.as_str()),
        unselected_because: selected.as_ref().err().map(ToString::to_string),
        backend: None,
        backend_details: OrderedMap::default(),
        device_count: None,
        device: None,
        device_source: None,
        device_source_detail: None,
        pool: None,
        hazard_tracking: None,
        device_memory: None,
        events: None,
        environment,
        error: None,
    };
    let started = spyre_stream::start_runtime()
        .map_err(|e| CliError::stream("starting the Spyre runtime", e))
        .and_then(|()| {
            spyre_stream::device_count().map_err(|e| CliError::stream("counting devices", e))
        });
    let count = match started {
        Ok(count) => count,
        Err(error) => {
            // The devices may still be counted (a local rank past them,
            // say): the number that fixes the launch.
            report.device_count = spyre_stream::device_count().ok();
            report.error = Some(error.to_string());
            return (report, Some(error));
        }
    };
    report.device_count = Some(count);
    if let Some(info) = spyre_stream::runtime_info() {
        report.backend = Some(info.backend);
        report.backend_details = OrderedMap(
            info.backend_details
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
        );
        report.device = Some(info.device);
        report.device_source = Some(info.device_source.name());
        report.device_source_detail = Some(info.device_source.description());
        report.pool = Some(PoolLayout::new(info.host_compute_streams));
        report.hazard_tracking = Some(info.track_hazards);
    }
    report.device_memory = Some(
        match spyre_stream::memory_info(spyre_stream::Device::CURRENT) {
            Ok(info) => format!(
                "{} bytes ({}), {} free",
                info.total_bytes,
                crate::size::format_size(info.total_bytes),
                info.free_bytes
            ),
            Err(error) => format!("unknown: {error}"),
        },
    );
    report.events = Some(
        match spyre_stream::capabilities(spyre_stream::Device::CURRENT) {
            Ok(capabilities) => format!(
                "{} waits, {}",
                if capabilities.device_side_wait {
                    "device-side"
                } else {
                    "host-blocking"
                },
                if capabilities.event_timing {
                    "timing"
                } else {
                    "no timing"
                }
            ),
            Err(error) => format!("none: {error}"),
        },
    );
    (report, None)
}

impl InfoReport {
    /// The report as text for people.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        let unknown = || "unknown".to_string();
        let _ = writeln!(out, "spyre {}", self.version);
        let _ = writeln!(
            out,
            "backend           {} (compiled: {}; selected by build and SPYRE_BACKEND: {})",
            self.backend.unwrap_or("not started"),
            self.compiled_backends.join(", "),
            self.selected_backend.map_or_else(
                || format!(
                    "none: {}",
                    self.unselected_because.as_deref().unwrap_or("unknown")
                ),
                str::to_owned
            )
        );
        for (name, value) in &self.backend_details.0 {
            // In the column of the values above, one space at least after
            // a longer name.
            let _ = writeln!(out, "  {name:<15} {value}");
        }
        let _ = writeln!(
            out,
            "devices           {}",
            self.device_count.map_or_else(unknown, |c| c.to_string())
        );
        match self.device {
            Some(device) => {
                let _ = writeln!(
                    out,
                    "this process      device {device} (from {})",
                    self.device_source_detail.unwrap_or("unknown")
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "this process      no device (the runtime did not start: see error)"
                );
            }
        }
        if let Some(pool) = &self.pool {
            let _ = writeln!(out, "pool layout");
            let _ = writeln!(out, "  {:<16}{}", "default stream", pool.default_stream);
            let _ = writeln!(
                out,
                "  {:<16}{}–{} (priority 0, round robin)",
                "normal", pool.normal[0], pool.normal[1]
            );
            let _ = writeln!(
                out,
                "  {:<16}{}–{} (priority -1, round robin)",
                "high", pool.high[0], pool.high[1]
            );
            let _ = writeln!(
                out,
                "  {:<16}{}–{} ({} stream{})",
                "host compute",
                pool.host_compute[0],
                pool.host_compute[1],
                pool.host_compute_streams,
                if pool.host_compute_streams == 1 {
                    ""
                } else {
                    "s"
                }
            );
        }
        let _ = writeln!(
            out,
            "hazard tracking   {}",
            match self.hazard_tracking {
                Some(true) => "on",
                Some(false) => "off",
                None => "unknown",
            }
        );
        let _ = writeln!(
            out,
            "device memory     {}",
            self.device_memory.as_deref().unwrap_or("unknown")
        );
        let _ = writeln!(
            out,
            "events            {}",
            self.events.as_deref().unwrap_or("unknown")
        );
        let _ = writeln!(out, "environment");
        for (name, value) in &self.environment.0 {
            match value {
                Some(value) => {
                    let _ = writeln!(out, "  {name:<37}= {value:?}");
                }
                None => {
                    let _ = writeln!(out, "  {name:<37}(unset)");
                }
            }
        }
        if let Some(error) = &self.error {
            let _ = writeln!(out, "error             {error}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_the_host_compute_count() {
        let layout = PoolLayout::new(4);
        assert_eq!(layout.default_stream, 0);
        assert_eq!(layout.normal, [1, 32]);
        assert_eq!(layout.high, [33, 64]);
        assert_eq!(layout.host_compute, [65, 68]);
        assert_eq!(PoolLayout::new(8).host_compute, [65, 72]);
    }

    #[test]
    fn every_variable_is_listed_once() {
        let names = environment_variables();
        let software_device = ["SPYRE_MOCK_DEVICES", "SPYRE_MOCK_COPY_BANDWIDTH"];
        for name in [
            "LOCAL_RANK",
            "TORCH_SPYRE_NUM_HOST_COMPUTE_STREAMS",
            "SPYRE_HAZARD_TRACKER",
            "SPYRE_BACKEND",
            "FLEX_RUNTIME_LIB",
            "RUST_LOG",
        ]
        .into_iter()
        .chain(
            software_device
                .into_iter()
                .filter(|_| cfg!(feature = "mock")),
        ) {
            assert_eq!(names.iter().filter(|n| **n == name).count(), 1, "{name}");
        }
        if !cfg!(feature = "mock") {
            assert!(software_device.iter().all(|name| !names.contains(name)));
        }
    }
}

//! Configuration of the software device: defaults, the builder and its
//! checks, and parsing of the `SPYRE_MOCK_*` environment variables.
use std::fmt;
use std::time::Duration;

use flex_rt::{ADDRESS_ALIGNMENT, FlexError, Result, SyncPolicy};

/// Number of devices a system has unless configured otherwise.
pub const DEFAULT_DEVICES: u32 = 1;
/// Device memory per runtime unless configured otherwise: 1 GiB.
pub const DEFAULT_MEMORY_BYTES: u64 = 1 << 30;
/// Size of one memory region unless configured otherwise: 256 MiB.
pub const DEFAULT_REGION_BYTES: u64 = 256 << 20;
/// Engine threads per runtime unless configured otherwise.
pub const DEFAULT_ENGINES: u32 = 2;
/// Most engine threads one runtime may have.
pub const MAX_ENGINES: u32 = 256;
/// Most memory regions one runtime may have (`memory_bytes / region_bytes`,
/// rounded up).
pub const MAX_REGIONS: u64 = 65_536;

/// Largest operation latency: 1 s. A larger value would make a
/// run of a few thousand operations take hours, which is never a useful
/// model of a device.
pub const MAX_OP_LATENCY: Duration = Duration::from_secs(1);
/// Smallest modelled copy bandwidth: 1 MB/s (10^6 bytes per second), so
/// that a copy of `n` bytes is held at most `n` microseconds.
pub const MIN_COPY_BANDWIDTH: u64 = 1_000_000;

/// Environment variable: number of devices (decimal, ≥ 1).
pub const ENV_DEVICES: &str = "SPYRE_MOCK_DEVICES";
/// Environment variable (torch-spyre's, like `CUDA_VISIBLE_DEVICES`): the
/// devices the process may see, in the order it numbers them — a
/// comma-separated list of distinct device indices below the device count;
/// `"2,3"` makes logical device 0 device 2 and logical device 1 device 3.
/// Unset or empty: every device, in order.
pub const ENV_VISIBLE_DEVICES: &str = "SPYRE_DEVICES";
/// Environment variable: device memory per runtime in bytes (decimal, a
/// positive multiple of 128).
pub const ENV_MEMORY_BYTES: &str = "SPYRE_MOCK_MEMORY_BYTES";
/// Environment variable: size of one memory region in bytes (decimal, a
/// positive multiple of 128, not above the memory size). Unset: 256 MiB, or
/// the whole memory when smaller.
pub const ENV_REGION_BYTES: &str = "SPYRE_MOCK_REGION_BYTES";
/// Environment variable: engine threads per runtime (decimal, 1..=256).
pub const ENV_ENGINES: &str = "SPYRE_MOCK_ENGINES";
/// Environment variable: the latency of every operation in microseconds,
/// the time it holds its engine at least from its start
/// ([`MockSystemBuilder::op_latency`]; decimal, 0 for none, at most
/// 1 000 000 = [`MAX_OP_LATENCY`]).
pub const ENV_OP_LATENCY_US: &str = "SPYRE_MOCK_OP_LATENCY_US";
/// Environment variable: bandwidth of H2D and D2H copies in bytes per second
/// (decimal, at least 1 000 000 = [`MIN_COPY_BANDWIDTH`]; unset for as fast
/// as the host allows).
pub const ENV_COPY_BANDWIDTH: &str = "SPYRE_MOCK_COPY_BANDWIDTH";

/// Environment variable: how `synchronize` and the engines wait
/// ([`SyncPolicy`]: `auto`, `spin`, `yield` or `blocking`, any case; unset
/// for `auto`).
pub const ENV_SYNC_POLICY: &str = "SPYRE_MOCK_SYNC_POLICY";

/// Environment variable: whether a stream can wait on an event on the device
/// side (a boolean: `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`; unset
/// for yes). `0` makes the device behave like today's Spyre card, where
/// `wait_event` blocks the host until the event completes.
pub const ENV_DEVICE_SIDE_WAIT: &str = "SPYRE_MOCK_DEVICE_SIDE_WAIT";

/// Environment variable: whether events created with timing take device
/// timestamps (a boolean; unset for yes): see [`MockConfig::event_timing`].
pub const ENV_EVENT_TIMING: &str = "SPYRE_MOCK_EVENT_TIMING";

/// Environment variable: whether the device checks every copy, fill and
/// compute for memory reused too early (a boolean; unset for no): see
/// [`MockConfig::check_reuse`].
pub const ENV_CHECK_REUSE: &str = "SPYRE_MOCK_CHECK_REUSE";

/// The boolean variables of [`MockConfig::from_lookup`], in the order it
/// reads them.
const BOOL_ENV_VARS: [&str; 3] = [ENV_DEVICE_SIDE_WAIT, ENV_EVENT_TIMING, ENV_CHECK_REUSE];

/// The numeric variables of [`MockConfig::from_lookup`], in the order it
/// reads them.
const NUMERIC_ENV_VARS: [&str; 6] = [
    ENV_DEVICES,
    ENV_MEMORY_BYTES,
    ENV_REGION_BYTES,
    ENV_ENGINES,
    ENV_OP_LATENCY_US,
    ENV_COPY_BANDWIDTH,
];

/// The range a numeric variable accepts where it is narrower than the
/// integer it is read into (what [`MockSystemBuilder::build_config`]
/// checks), for the error of a value too large to read.
fn accepted_range(name: &str) -> Option<String> {
    match name {
        ENV_DEVICES => Some(format!(
            "between 1 and {} (flex.h counts devices in int32_t)",
            i32::MAX
        )),
        ENV_ENGINES => Some(format!("between 1 and {MAX_ENGINES}")),
        ENV_OP_LATENCY_US => Some(format!("at most {} (1 s)", MAX_OP_LATENCY.as_micros())),
        _ => None,
    }
}

/// Every environment variable [`MockConfig::from_lookup`] reads, in the order
/// it reads them.
pub const ENV_VARS: [&str; 11] = [
    ENV_DEVICES,
    ENV_MEMORY_BYTES,
    ENV_REGION_BYTES,
    ENV_ENGINES,
    ENV_OP_LATENCY_US,
    ENV_COPY_BANDWIDTH,
    ENV_SYNC_POLICY,
    ENV_DEVICE_SIDE_WAIT,
    ENV_EVENT_TIMING,
    ENV_CHECK_REUSE,
    ENV_VISIBLE_DEVICES,
];

/// `SPYRE_MOCK_ABI_VERSION=M.m`: the version the software device's C
/// library (spyre-mock-capi) reports from `flex_get_api_version`.
pub const ENV_ABI_VERSION: &str = "SPYRE_MOCK_ABI_VERSION";
/// `SPYRE_MOCK_UNDEFINED_STATUS=<call>[,<call>...]`: these calls of the C
/// library return a status flex.h does not define, and do nothing else.
pub const ENV_UNDEFINED_STATUS: &str = "SPYRE_MOCK_UNDEFINED_STATUS";
/// `SPYRE_MOCK_FAIL_LAUNCH=N`: the C library refuses the `N`th launch on
/// each stream.
pub const ENV_FAIL_LAUNCH: &str = "SPYRE_MOCK_FAIL_LAUNCH";
/// `SPYRE_MOCK_LATE_COMPLETIONS_MS=N`: the C library delivers completions
/// `N` ms late from a thread of the runtime.
pub const ENV_LATE_COMPLETIONS_MS: &str = "SPYRE_MOCK_LATE_COMPLETIONS_MS";
/// `SPYRE_MOCK_FAIL_RUNTIME_CREATE=1` (a boolean): the C library's
/// `flex_runtime_create` fails.
pub const ENV_FAIL_RUNTIME_CREATE: &str = "SPYRE_MOCK_FAIL_RUNTIME_CREATE";

/// The variables only the software device's C library reads (its ABI
/// version and misbehaviour switches), beside [`ENV_VARS`], which it reads
/// too.
pub const C_LIBRARY_ENV_VARS: [&str; 5] = [
    ENV_ABI_VERSION,
    ENV_UNDEFINED_STATUS,
    ENV_FAIL_LAUNCH,
    ENV_LATE_COMPLETIONS_MS,
    ENV_FAIL_RUNTIME_CREATE,
];

/// Why the software device in process ignores the environment variable
/// `name` of its `SPYRE_MOCK_` prefix, if it does: only the C library
/// reads it, or nothing does (a misspelling, say). `None` for one it
/// reads, and for any name without the prefix. For a warning: a switch
/// that is set and ignored changes nothing, silently.
pub fn ignored_in_process(name: &str) -> Option<String> {
    if !name.starts_with("SPYRE_MOCK_") || ENV_VARS.contains(&name) {
        return None;
    }
    Some(if C_LIBRARY_ENV_VARS.contains(&name) {
        format!(
            "{name} is read only by the software device's C library (the hardware backend with FLEX_RUNTIME_LIB naming it), not by the software device in process: it is ignored"
        )
    } else {
        let known: Vec<&str> = ENV_VARS
            .iter()
            .copied()
            .filter(|known| known.starts_with("SPYRE_MOCK_"))
            .collect();
        format!(
            "{name} is not a variable of the software device: it is ignored (its variables in process are {})",
            known.join(", ")
        )
    })
}

/// A checked configuration of the software device. Made by
/// [`MockSystemBuilder::build_config`] or [`MockConfig::from_lookup`]; every
/// value in it has passed the builder's checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockConfig {
    devices: u32,
    memory_bytes: u64,
    region_bytes: u64,
    engines: u32,
    op_latency: Duration,
    copy_bandwidth: Option<u64>,
    sync_policy: SyncPolicy,
    device_side_wait: bool,
    event_timing: bool,
    check_reuse: bool,
    /// `None`: every device, in order.
    visible_devices: Option<Vec<u32>>,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            devices: DEFAULT_DEVICES,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            region_bytes: DEFAULT_REGION_BYTES,
            engines: DEFAULT_ENGINES,
            op_latency: Duration::ZERO,
            copy_bandwidth: None,
            sync_policy: SyncPolicy::Auto,
            device_side_wait: true,
            event_timing: true,
            check_reuse: false,
            visible_devices: None,
        }
    }
}

impl MockConfig {
    /// Number of devices the system has (before [`MockConfig::visible_devices`]
    /// selects among them).
    pub fn devices(&self) -> u32 {
        self.devices
    }

    /// The devices a process sees, in its order (`SPYRE_DEVICES`), or
    /// `None` for every device in order.
    pub fn visible_devices(&self) -> Option<&[u32]> {
        self.visible_devices.as_deref()
    }

    /// Number of logical devices: the visible ones.
    pub fn visible_count(&self) -> u32 {
        self.visible_devices
            .as_ref()
            .map_or(self.devices, |visible| visible.len() as u32)
    }

    /// The device behind `logical` device, or `None` when `logical` is not
    /// below [`MockConfig::visible_count`].
    pub fn device_of(&self, logical: u32) -> Option<u32> {
        match &self.visible_devices {
            Some(visible) => visible.get(logical as usize).copied(),
            None => (logical < self.devices).then_some(logical),
        }
    }

    /// Device memory of each runtime, in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Size of one memory region in bytes; the last region of a runtime is
    /// smaller when it does not divide [`MockConfig::memory_bytes`].
    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    /// Number of memory regions of each runtime.
    pub fn region_count(&self) -> u64 {
        self.memory_bytes.div_ceil(self.region_bytes)
    }

    /// Engine threads of each runtime.
    pub fn engines(&self) -> u32 {
        self.engines
    }

    /// How long every operation that runs takes at least, from its start
    /// (see [`MockSystemBuilder::op_latency`]).
    pub fn op_latency(&self) -> Duration {
        self.op_latency
    }

    /// Bandwidth of H2D and D2H copies in bytes per second, or `None` for as
    /// fast as the host allows.
    pub fn copy_bandwidth(&self) -> Option<u64> {
        self.copy_bandwidth
    }

    /// How `synchronize` and the engines wait.
    pub fn sync_policy(&self) -> SyncPolicy {
        self.sync_policy
    }

    /// Whether a stream waits on an event on the device side (the
    /// scheduler holds its later work; no thread blocks), or, when false,
    /// `wait_event` blocks the calling thread as on today's Spyre card.
    pub fn device_side_wait(&self) -> bool {
        self.device_side_wait
    }

    /// Whether events created with timing take device timestamps (default
    /// true; `SPYRE_MOCK_EVENT_TIMING`), the runtime's `event_timing`
    /// capability. When false, such events are still made and order work,
    /// but their elapsed time is refused with
    /// [`flex_rt::Status::UNSUPPORTED`], as on a card that cannot time
    /// events (flex.h's `FLEX_CAPABILITY_EVENT_TIMING` of 0).
    pub fn event_timing(&self) -> bool {
        self.event_timing
    }

    /// Whether the device checks for memory reused too early (default
    /// false; `SPYRE_MOCK_CHECK_REUSE`): an allocator above the runtime
    /// says when it hands memory out again
    /// ([`flex_rt::Runtime::note_reuse`]), and every copy, fill and compute
    /// of the new owner that touches that memory while an operation of the
    /// previous owner on it has not completed fails with
    /// [`flex_rt::Status::EXECUTION_FAILED`], naming both operations. A
    /// compute still queued when the reuse is noted counts only with its
    /// program's memory; its operands are read from the program as it
    /// starts. Costs a scan of the queued work per
    /// reuse and a check per operation, so it is off unless asked for.
    pub fn check_reuse(&self) -> bool {
        self.check_reuse
    }

    /// Reads the configuration from `lookup`, which maps an environment
    /// variable name (one of [`ENV_VARS`]) to its value or `None` when unset.
    /// Values are trimmed; an empty value counts as unset; unset variables
    /// keep their defaults. Pure: [`MockSystem::from_env`](crate::MockSystem::from_env) passes a closure
    /// over the process environment, tests pass a map.
    ///
    /// # Errors
    /// [`flex_rt::Status::INVALID_ARGUMENT`] naming the variable and its raw
    /// value when a value is not a decimal number of the right range, not a
    /// sync policy (`SPYRE_MOCK_SYNC_POLICY`) or not a boolean
    /// (`SPYRE_MOCK_DEVICE_SIDE_WAIT`, `SPYRE_MOCK_EVENT_TIMING`,
    /// `SPYRE_MOCK_CHECK_REUSE`), when `SPYRE_DEVICES` is not a
    /// comma-separated list of device indices, or when
    /// the values together fail the builder's checks (then the message names
    /// every variable that was set).
    pub fn from_lookup<F>(mut lookup: F) -> Result<Self>
    where
        F: FnMut(&str) -> Option<String>,
    {
        const CALL: &str = "MockSystem::from_env";
        let mut builder = MockSystemBuilder::new();
        let mut used = Vec::new();
        if let Some(raw) = lookup(ENV_SYNC_POLICY).filter(|raw| !raw.trim().is_empty()) {
            let policy = SyncPolicy::parse(raw.trim()).ok_or_else(|| {
                FlexError::invalid_argument(
                    CALL,
                    format!(
                        "{ENV_SYNC_POLICY}={raw:?} is not valid: expected auto, spin, yield or blocking"
                    ),
                )
            })?;
            builder = builder.sync_policy(policy);
            used.push(format!("{ENV_SYNC_POLICY}={raw:?}"));
        }
        for name in BOOL_ENV_VARS {
            let Some(raw) = lookup(name).filter(|raw| !raw.trim().is_empty()) else {
                continue;
            };
            let value = flex_rt::env::parse_bool(raw.trim()).ok_or_else(|| {
                FlexError::invalid_argument(
                    CALL,
                    format!(
                        "{name}={raw:?} is not valid: {}",
                        flex_rt::env::BOOL_EXPECTED
                    ),
                )
            })?;
            builder = match name {
                ENV_DEVICE_SIDE_WAIT => builder.device_side_wait(value),
                ENV_EVENT_TIMING => builder.event_timing(value),
                _ => builder.check_reuse(value),
            };
            used.push(format!("{name}={raw:?}"));
        }
        for name in NUMERIC_ENV_VARS {
            let Some(raw) = lookup(name) else { continue };
            let value = raw.trim();
            if value.is_empty() {
                continue;
            }
            // A number too large for the integer it is read into is told the
            // variable's own range where that is narrower.
            let out_of_range = |fallback: String| {
                let expected =
                    accepted_range(name).map_or(fallback, |range| format!("it must be {range}"));
                FlexError::invalid_argument(
                    CALL,
                    format!("{name}={raw:?} is not valid: {expected}"),
                )
            };
            let number = flex_rt::env::parse_u64(value).map_err(|expected| {
                match value.parse::<u64>().map_err(|e| *e.kind()) {
                    Err(std::num::IntErrorKind::PosOverflow) => out_of_range(expected),
                    _ => FlexError::invalid_argument(
                        CALL,
                        format!("{name}={raw:?} is not valid: {expected}"),
                    ),
                }
            })?;
            let narrow = |number: u64| {
                u32::try_from(number)
                    .map_err(|_| out_of_range(format!("it must be at most {}", u32::MAX)))
            };
            builder = match name {
                ENV_DEVICES => builder.devices(narrow(number)?),
                ENV_MEMORY_BYTES => builder.memory_bytes(number),
                ENV_REGION_BYTES => builder.region_bytes(number),
                ENV_ENGINES => builder.engines(narrow(number)?),
                ENV_OP_LATENCY_US => builder.op_latency(Duration::from_micros(number)),
                _ => builder.copy_bandwidth(number),
            };
            used.push(format!("{name}={raw:?}"));
        }
        if let Some(raw) = lookup(ENV_VISIBLE_DEVICES).filter(|raw| !raw.trim().is_empty()) {
            builder = builder.visible_devices(parse_device_list(&raw).map_err(|reason| {
                FlexError::invalid_argument(
                    CALL,
                    format!("{ENV_VISIBLE_DEVICES}={raw:?} is not valid: {reason}"),
                )
            })?);
            used.push(format!("{ENV_VISIBLE_DEVICES}={raw:?}"));
        }
        builder.build_config().map_err(|err| {
            FlexError::invalid_argument(
                CALL,
                format!("{} (from {})", err.message(), used.join(", ")),
            )
        })
    }
}

/// Parses a `SPYRE_DEVICES` list: comma-separated decimal device indices,
/// spaces around an entry allowed. Whether they exist and are distinct is
/// the builder's check.
fn parse_device_list(raw: &str) -> std::result::Result<Vec<u32>, String> {
    raw.split(',')
        .enumerate()
        .map(|(index, entry)| {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(format!(
                    "entry {} is empty; expected a comma-separated list of device indices such as 2,3",
                    index + 1
                ));
            }
            if !entry.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "entry {entry:?} is not a device index; expected a comma-separated list of device indices such as 2,3"
                ));
            }
            entry
                .parse::<u32>()
                .map_err(|_| format!("entry {entry} is too large for a device index"))
        })
        .collect()
}

impl fmt::Display for MockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} device(s), {} bytes of memory in {} region(s) of {} bytes, {} engine(s), op latency {:?}, copy bandwidth ",
            self.devices,
            self.memory_bytes,
            self.region_count(),
            self.region_bytes,
            self.engines,
            self.op_latency
        )?;
        match self.copy_bandwidth {
            Some(bw) => write!(f, "{bw} B/s")?,
            None => write!(f, "unlimited")?,
        }
        write!(f, ", sync policy {}", self.sync_policy.as_str())?;
        let wait = if self.device_side_wait {
            "device side"
        } else {
            "host blocks"
        };
        write!(f, ", event waits: {wait}")?;
        if !self.event_timing {
            write!(f, ", no event timing")?;
        }
        if self.check_reuse {
            write!(f, ", reuse check on")?;
        }
        if let Some(visible) = &self.visible_devices {
            write!(f, ", visible devices {}", device_list(visible))?;
        }
        Ok(())
    }
}

/// Builds a [`MockSystem`](crate::MockSystem) (or only its [`MockConfig`]). Every setter is
/// optional; unset values keep the `DEFAULT_*` constants of this module.
///
/// ```
/// # use spyre_mock::MockSystem;
/// # use std::time::Duration;
/// let system = MockSystem::builder()
///     .devices(2)
///     .memory_bytes(64 << 20)
///     .region_bytes(16 << 20)
///     .engines(4)
///     .op_latency(Duration::from_micros(10))
///     .copy_bandwidth(10 << 30)
///     .build()?;
/// assert_eq!(system.config().devices(), 2);
/// # Ok::<(), flex_rt::FlexError>(())
/// ```
#[derive(Clone, Debug)]
pub struct MockSystemBuilder {
    devices: u32,
    memory_bytes: u64,
    /// `None`: [`DEFAULT_REGION_BYTES`], or the whole memory when smaller.
    region_bytes: Option<u64>,
    engines: u32,
    op_latency: Duration,
    copy_bandwidth: Option<u64>,
    sync_policy: SyncPolicy,
    device_side_wait: bool,
    event_timing: bool,
    check_reuse: bool,
    visible_devices: Option<Vec<u32>>,
}

/// `devices` as `SPYRE_DEVICES` writes them: `3,2,1,0`.
pub(crate) fn device_list(devices: &[u32]) -> String {
    devices
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Default for MockSystemBuilder {
    fn default() -> Self {
        let defaults = MockConfig::default();
        Self {
            devices: defaults.devices,
            memory_bytes: defaults.memory_bytes,
            region_bytes: None,
            engines: defaults.engines,
            op_latency: defaults.op_latency,
            copy_bandwidth: defaults.copy_bandwidth,
            sync_policy: defaults.sync_policy,
            device_side_wait: defaults.device_side_wait,
            event_timing: defaults.event_timing,
            check_reuse: defaults.check_reuse,
            visible_devices: None,
        }
    }
}

impl MockSystemBuilder {
    /// A builder with every value at its default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of logical devices (≥ 1, at most `i32::MAX` because flex.h
    /// counts devices in `int32_t`). Default 1.
    pub fn devices(mut self, devices: u32) -> Self {
        self.devices = devices;
        self
    }

    /// Device memory of each runtime in bytes (a positive multiple of 128).
    /// Default 1 GiB. Memory is backed lazily: a region takes host memory
    /// only when first written, and the OS maps its pages on first touch.
    pub fn memory_bytes(mut self, bytes: u64) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// Size of one memory region in bytes (a positive multiple of 128, at
    /// most the memory size, at most [`MAX_REGIONS`] regions). Default
    /// 256 MiB ([`DEFAULT_REGION_BYTES`]), or the whole memory when that is
    /// smaller, so that a small `memory_bytes` alone is a valid system. A chunk of an allocation never crosses a region, so an
    /// allocation larger than the free space of one region gets several
    /// chunks.
    pub fn region_bytes(mut self, bytes: u64) -> Self {
        self.region_bytes = Some(bytes);
        self
    }

    /// Engine threads of each runtime (1..=[`MAX_ENGINES`]): how many streams
    /// run an operation at the same time. Default 2.
    pub fn engines(mut self, engines: u32) -> Self {
        self.engines = engines;
        self
    }

    /// How long every operation that runs holds its engine at least, from
    /// its start, with a copy's time at the bandwidth added
    /// ([`MockSystemBuilder::copy_bandwidth`]); the host's own work on it
    /// counts in that time (a fill that took the host 3 µs of a modelled
    /// 10 µs holds its engine 7 µs more), and it ends within about a
    /// microsecond of it: the engine sleeps (with a timer slack of 1 ns on
    /// Linux), then spins the last 60 µs. Under [`SyncPolicy::Blocking`],
    /// which never spins, and while as many of the device's engines spin as
    /// the process has cores but one (on one core, always), it sleeps the
    /// whole time instead, ending a wake-up late (some microseconds; more
    /// on a busy host). At most [`MAX_OP_LATENCY`]. Default zero.
    pub fn op_latency(mut self, latency: Duration) -> Self {
        self.op_latency = latency;
        self
    }

    /// Bandwidth of H2D and D2H copies in bytes per second (at least
    /// [`MIN_COPY_BANDWIDTH`]): a copy of `n` bytes holds its engine
    /// `n / bandwidth` seconds beyond the operation latency, from its start,
    /// the host's copy included. Default: unlimited.
    pub fn copy_bandwidth(mut self, bytes_per_sec: u64) -> Self {
        self.copy_bandwidth = Some(bytes_per_sec);
        self
    }

    /// How `synchronize` and the engines wait ([`SyncPolicy`]). Default
    /// [`SyncPolicy::Auto`]: spin up to [`SyncPolicy::AUTO_SPIN`], then block;
    /// of the idle engines, one at a time watches for work that way, and
    /// only while no engine is busy; the others block at once (under `Spin`
    /// and `Yield` every idle engine watches, under `Blocking` none).
    pub fn sync_policy(mut self, policy: SyncPolicy) -> Self {
        self.sync_policy = policy;
        self
    }

    /// Whether streams wait on events on the device side (default true);
    /// false models today's Spyre card, where `wait_event` blocks the host
    /// (see [`MockConfig::device_side_wait`]).
    pub fn device_side_wait(mut self, device_side_wait: bool) -> Self {
        self.device_side_wait = device_side_wait;
        self
    }

    /// Whether events created with timing take device timestamps (default
    /// true; see [`MockConfig::event_timing`]).
    pub fn event_timing(mut self, event_timing: bool) -> Self {
        self.event_timing = event_timing;
        self
    }

    /// Whether the device checks for memory reused too early (default
    /// false; see [`MockConfig::check_reuse`]).
    pub fn check_reuse(mut self, check_reuse: bool) -> Self {
        self.check_reuse = check_reuse;
        self
    }

    /// The devices a process sees, in its order (`SPYRE_DEVICES`): distinct
    /// indices below [`MockSystemBuilder::devices`], at least one. Default:
    /// every device in order.
    pub fn visible_devices(mut self, devices: Vec<u32>) -> Self {
        self.visible_devices = Some(devices);
        self
    }

    /// Checks the values and returns the configuration.
    ///
    /// # Errors
    /// [`flex_rt::Status::INVALID_ARGUMENT`] naming the value: devices 0 or
    /// above `i32::MAX`; engines outside 1..=[`MAX_ENGINES`]; a memory or
    /// region size that is 0 or not a multiple of 128; a region larger than
    /// the memory or than this host's address space; more than
    /// [`MAX_REGIONS`] regions; an op latency above [`MAX_OP_LATENCY`];
    /// visible devices that are none, name a device at or above
    /// [`MockSystemBuilder::devices`], or name one twice; a copy bandwidth
    /// below [`MIN_COPY_BANDWIDTH`].
    pub fn build_config(self) -> Result<MockConfig> {
        const CALL: &str = "MockSystemBuilder::build";
        let region_bytes = self
            .region_bytes
            .unwrap_or(DEFAULT_REGION_BYTES.min(self.memory_bytes));
        let fail = |message: String| Err(FlexError::invalid_argument(CALL, message));
        if self.devices == 0 {
            return fail("devices must be at least 1, got 0".into());
        }
        if i32::try_from(self.devices).is_err() {
            return fail(format!(
                "devices must be at most {} (flex.h counts devices in int32_t), got {}",
                i32::MAX,
                self.devices
            ));
        }
        if self.engines == 0 || self.engines > MAX_ENGINES {
            return fail(format!(
                "engines must be between 1 and {MAX_ENGINES}, got {}",
                self.engines
            ));
        }
        for (name, value) in [
            ("memory_bytes", self.memory_bytes),
            ("region_bytes", region_bytes),
        ] {
            if value == 0 || !value.is_multiple_of(ADDRESS_ALIGNMENT) {
                return fail(format!(
                    "{name} must be a positive multiple of {ADDRESS_ALIGNMENT} (the address alignment), got {value}"
                ));
            }
        }
        if region_bytes > self.memory_bytes {
            return fail(format!(
                "region_bytes ({region_bytes}) must not exceed memory_bytes ({})",
                self.memory_bytes
            ));
        }
        if usize::try_from(region_bytes).is_err() {
            return fail(format!(
                "region_bytes ({region_bytes}) does not fit in this host's address space"
            ));
        }
        let regions = self.memory_bytes.div_ceil(region_bytes);
        if regions > MAX_REGIONS {
            return fail(format!(
                "memory_bytes ({}) / region_bytes ({region_bytes}) makes {regions} regions; at most {MAX_REGIONS} are supported, so use larger regions",
                self.memory_bytes
            ));
        }
        if self.op_latency > MAX_OP_LATENCY {
            // In µs where that is exact (as the variable gives it), else
            // whole: truncated, 1 s and 1 ns would read as the limit.
            let got = if self.op_latency.subsec_nanos().is_multiple_of(1_000) {
                format!("{} µs", self.op_latency.as_micros())
            } else {
                format!("{:?}", self.op_latency)
            };
            return fail(format!(
                "op_latency must be at most {} µs (1 s), got {got}",
                MAX_OP_LATENCY.as_micros(),
            ));
        }
        if let Some(visible) = &self.visible_devices {
            if visible.is_empty() {
                return fail("visible_devices must name at least one device".into());
            }
            if let Some(&missing) = visible.iter().find(|&&d| d >= self.devices) {
                return fail(format!(
                    "visible device {missing} does not exist: the system has {} device(s) (0..={})",
                    self.devices,
                    self.devices.saturating_sub(1)
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            if let Some(&twice) = visible.iter().find(|&&d| !seen.insert(d)) {
                return fail(format!("visible device {twice} is listed twice"));
            }
        }
        if let Some(bandwidth) = self.copy_bandwidth.filter(|b| *b < MIN_COPY_BANDWIDTH) {
            return fail(format!(
                "copy_bandwidth must be at least {MIN_COPY_BANDWIDTH} bytes per second (1 MB/s), got {bandwidth} (leave it unset for unlimited)"
            ));
        }
        Ok(MockConfig {
            devices: self.devices,
            memory_bytes: self.memory_bytes,
            region_bytes,
            engines: self.engines,
            op_latency: self.op_latency,
            copy_bandwidth: self.copy_bandwidth,
            sync_policy: self.sync_policy,
            device_side_wait: self.device_side_wait,
            event_timing: self.event_timing,
            check_reuse: self.check_reuse,
            visible_devices: self.visible_devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use flex_rt::Status;

    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<String> + 'a {
        let map: HashMap<&str, &str> = vars.iter().copied().collect();
        move |name| map.get(name).map(|v| v.to_string())
    }

    #[test]
    fn variables_the_device_in_process_ignores_are_named_with_the_reason() {
        for read in ENV_VARS {
            assert_eq!(ignored_in_process(read), None, "{read}");
        }
        assert_eq!(ignored_in_process("RUST_LOG"), None);
        assert_eq!(
            ignored_in_process("SPYRE_MOCK_FAIL_LAUNCH").unwrap(),
            "SPYRE_MOCK_FAIL_LAUNCH is read only by the software device's C library (the hardware backend with FLEX_RUNTIME_LIB naming it), not by the software device in process: it is ignored"
        );
        assert_eq!(
            ignored_in_process("SPYRE_MOCK_LATENCY_US").unwrap(),
            "SPYRE_MOCK_LATENCY_US is not a variable of the software device: it is ignored (its variables in process are SPYRE_MOCK_DEVICES, SPYRE_MOCK_MEMORY_BYTES, SPYRE_MOCK_REGION_BYTES, SPYRE_MOCK_ENGINES, SPYRE_MOCK_OP_LATENCY_US, SPYRE_MOCK_COPY_BANDWIDTH, SPYRE_MOCK_SYNC_POLICY, SPYRE_MOCK_DEVICE_SIDE_WAIT, SPYRE_MOCK_EVENT_TIMING, SPYRE_MOCK_CHECK_REUSE)"
        );
    }

    #[test]
    fn defaults_match_the_documented_values() {
        let config = MockConfig::from_lookup(|_| None).unwrap();
        assert_eq!(config, MockConfig::default());
        assert_eq!(config.devices(), 1);
        assert_eq!(config.memory_bytes(), 1 << 30);
        assert_eq!(config.region_bytes(), 256 << 20);
        assert_eq!(config.region_count(), 4);
        assert_eq!(config.engines(), 2);
        assert_eq!(config.op_latency(), Duration::ZERO);
        assert_eq!(config.copy_bandwidth(), None);
        assert!(config.to_string().contains("unlimited"), "{config}");
    }

    #[test]
    fn every_variable_is_read() {
        let config = MockConfig::from_lookup(lookup(&[
            (ENV_DEVICES, "3"),
            (ENV_MEMORY_BYTES, " 4096 "),
            (ENV_REGION_BYTES, "1024"),
            (ENV_ENGINES, "5"),
            (ENV_OP_LATENCY_US, "250"),
            (ENV_COPY_BANDWIDTH, "1000000"),
        ]))
        .unwrap();
        assert_eq!(config.devices(), 3);
        assert_eq!(config.memory_bytes(), 4096);
        assert_eq!(config.region_bytes(), 1024);
        assert_eq!(config.engines(), 5);
        assert_eq!(config.op_latency(), Duration::from_micros(250));
        assert_eq!(config.copy_bandwidth(), Some(1_000_000));
    }

    #[test]
    fn a_small_memory_alone_is_one_region_of_that_size() {
        // 64 MiB < the 256 MiB default region: the region shrinks to fit.
        let config = MockConfig::from_lookup(lookup(&[(ENV_MEMORY_BYTES, "67108864")])).unwrap();
        assert_eq!(config.memory_bytes(), 64 << 20);
        assert_eq!(config.region_bytes(), 64 << 20);
        assert_eq!(config.region_count(), 1);
        // 768 MiB keeps the default regions: three of 256 MiB.
        let config = MockSystemBuilder::new()
            .memory_bytes(768 << 20)
            .build_config()
            .unwrap();
        assert_eq!(config.region_bytes(), DEFAULT_REGION_BYTES);
        assert_eq!(config.region_count(), 3);
    }

    #[test]
    fn empty_values_count_as_unset() {
        let config = MockConfig::from_lookup(lookup(&[(ENV_DEVICES, "  ")])).unwrap();
        assert_eq!(config.devices(), DEFAULT_DEVICES);
    }

    #[test]
    fn bad_values_name_the_variable_and_raw_value() {
        for (name, raw, needle) in [
            (ENV_DEVICES, "two", "SPYRE_MOCK_DEVICES=\"two\""),
            (ENV_ENGINES, "-1", "SPYRE_MOCK_ENGINES=\"-1\""),
            (ENV_ENGINES, "99999999999", "it must be between 1 and 256"),
            (
                ENV_ENGINES,
                "18446744073709551616",
                "SPYRE_MOCK_ENGINES=\"18446744073709551616\" is not valid: it must be between 1 and 256",
            ),
            (
                ENV_DEVICES,
                "18446744073709551615",
                "SPYRE_MOCK_DEVICES=\"18446744073709551615\" is not valid: it must be between 1 and 2147483647 (flex.h counts devices in int32_t)",
            ),
            (
                ENV_OP_LATENCY_US,
                "18446744073709551616",
                "SPYRE_MOCK_OP_LATENCY_US=\"18446744073709551616\" is not valid: it must be at most 1000000 (1 s)",
            ),
            (
                ENV_MEMORY_BYTES,
                "99999999999999999999",
                "SPYRE_MOCK_MEMORY_BYTES=\"99999999999999999999\" is not valid: it must be at most 18446744073709551615",
            ),
            (ENV_MEMORY_BYTES, "1GiB", "SPYRE_MOCK_MEMORY_BYTES=\"1GiB\""),
            (ENV_OP_LATENCY_US, "1.5", "SPYRE_MOCK_OP_LATENCY_US=\"1.5\""),
        ] {
            let err = MockConfig::from_lookup(lookup(&[(name, raw)])).unwrap_err();
            assert_eq!(err.status(), Status::INVALID_ARGUMENT);
            assert!(err.message().contains(needle), "{err}");
        }
    }

    #[test]
    fn values_that_fail_the_checks_name_the_variables() {
        let err = MockConfig::from_lookup(lookup(&[(ENV_DEVICES, "0")])).unwrap_err();
        assert!(
            err.message().contains("devices must be at least 1"),
            "{err}"
        );
        assert!(err.message().contains("SPYRE_MOCK_DEVICES=\"0\""), "{err}");

        let err = MockConfig::from_lookup(lookup(&[
            (ENV_MEMORY_BYTES, "1024"),
            (ENV_REGION_BYTES, "2048"),
        ]))
        .unwrap_err();
        assert!(err.message().contains("must not exceed"), "{err}");
        assert!(err.message().contains("SPYRE_MOCK_MEMORY_BYTES=\"1024\""));
        assert!(err.message().contains("SPYRE_MOCK_REGION_BYTES=\"2048\""));

        let err = MockConfig::from_lookup(lookup(&[(ENV_COPY_BANDWIDTH, "0")])).unwrap_err();
        assert!(err.message().contains("copy_bandwidth"), "{err}");

        let config = MockConfig::from_lookup(lookup(&[(ENV_SYNC_POLICY, " Spin ")])).unwrap();
        assert_eq!(config.sync_policy(), SyncPolicy::Spin);
        assert_eq!(
            MockConfig::from_lookup(lookup(&[(ENV_SYNC_POLICY, "")]))
                .unwrap()
                .sync_policy(),
            SyncPolicy::Auto,
            "empty is unset"
        );
        let err = MockConfig::from_lookup(lookup(&[(ENV_SYNC_POLICY, "busy")])).unwrap_err();
        assert!(
            err.message().contains(
                "SPYRE_MOCK_SYNC_POLICY=\"busy\" is not valid: expected auto, spin, yield or blocking"
            ),
            "{err}"
        );

        // Booleans: the workspace's spellings in any case, and its message.
        for (raw, on) in [(" On ", true), ("NO", false)] {
            let config = MockConfig::from_lookup(lookup(&[(ENV_DEVICE_SIDE_WAIT, raw)])).unwrap();
            assert_eq!(config.device_side_wait(), on, "{raw:?}");
            let config = MockConfig::from_lookup(lookup(&[(ENV_EVENT_TIMING, raw)])).unwrap();
            assert_eq!(config.event_timing(), on, "{raw:?}");
        }
        assert!(MockConfig::default().event_timing(), "on by default");
        let err = MockConfig::from_lookup(lookup(&[(ENV_CHECK_REUSE, "maybe")])).unwrap_err();
        assert!(
            err.message().contains(
                "SPYRE_MOCK_CHECK_REUSE=\"maybe\" is not valid: expected a boolean: 1, true, on or yes for on; 0, false, off or no for off (case-insensitive)"
            ),
            "{err}"
        );

        // 2^32 µs would make every operation sleep 71 minutes.
        let err =
            MockConfig::from_lookup(lookup(&[(ENV_OP_LATENCY_US, "4294967296")])).unwrap_err();
        assert!(
            err.message()
                .contains("op_latency must be at most 1000000 µs (1 s), got 4294967296 µs"),
            "{err}"
        );
        assert!(
            err.message()
                .contains("SPYRE_MOCK_OP_LATENCY_US=\"4294967296\""),
            "{err}"
        );
    }

    #[test]
    fn builder_checks_name_the_value() {
        let cases: Vec<(MockSystemBuilder, &str)> = vec![
            (
                MockSystemBuilder::new().devices(0),
                "devices must be at least 1, got 0",
            ),
            (MockSystemBuilder::new().devices(u32::MAX), "got 4294967295"),
            (
                MockSystemBuilder::new().engines(0),
                "engines must be between 1 and 256, got 0",
            ),
            (MockSystemBuilder::new().engines(257), "got 257"),
            (
                MockSystemBuilder::new().memory_bytes(0),
                "memory_bytes must be a positive multiple of 128 (the address alignment), got 0",
            ),
            (MockSystemBuilder::new().memory_bytes(1000), "got 1000"),
            (
                MockSystemBuilder::new().region_bytes(100),
                "region_bytes must be a positive multiple of 128 (the address alignment), got 100",
            ),
            (
                MockSystemBuilder::new().memory_bytes(256).region_bytes(512),
                "region_bytes (512) must not exceed memory_bytes (256)",
            ),
            (
                MockSystemBuilder::new()
                    .memory_bytes(1 << 30)
                    .region_bytes(128),
                "makes 8388608 regions",
            ),
            (
                MockSystemBuilder::new().copy_bandwidth(0),
                "copy_bandwidth must be at least 1000000 bytes per second (1 MB/s), got 0",
            ),
            (
                MockSystemBuilder::new().copy_bandwidth(999_999),
                "got 999999",
            ),
            (
                MockSystemBuilder::new().op_latency(Duration::from_micros(1_000_001)),
                "op_latency must be at most 1000000 µs (1 s), got 1000001 µs",
            ),
            (
                MockSystemBuilder::new().op_latency(Duration::from_nanos(1_000_000_001)),
                "op_latency must be at most 1000000 µs (1 s), got 1.000000001s",
            ),
        ];
        assert!(
            MockSystemBuilder::new()
                .op_latency(MAX_OP_LATENCY)
                .copy_bandwidth(MIN_COPY_BANDWIDTH)
                .build_config()
                .is_ok(),
            "the bounds themselves are allowed"
        );
        for (builder, needle) in cases {
            let err = builder.build_config().unwrap_err();
            assert_eq!(err.status(), Status::INVALID_ARGUMENT);
            assert_eq!(err.call(), "MockSystemBuilder::build");
            assert!(err.message().contains(needle), "{needle:?} not in {err}");
        }
    }

    #[test]
    fn last_region_may_be_smaller() {
        let config = MockSystemBuilder::new()
            .memory_bytes(1280)
            .region_bytes(512)
            .build_config()
            .unwrap();
        assert_eq!(config.region_count(), 3);
    }

    #[test]
    fn spyre_devices_selects_and_orders_the_visible_devices() {
        let config =
            MockConfig::from_lookup(lookup(&[(ENV_DEVICES, "4"), (ENV_VISIBLE_DEVICES, "2, 3")]))
                .unwrap();
        assert_eq!(config.visible_devices(), Some(&[2, 3][..]));
        assert_eq!(config.visible_count(), 2);
        assert_eq!(
            (
                config.device_of(0),
                config.device_of(1),
                config.device_of(2)
            ),
            (Some(2), Some(3), None)
        );
        let all =
            MockConfig::from_lookup(lookup(&[(ENV_DEVICES, "2"), (ENV_VISIBLE_DEVICES, " ")]))
                .unwrap();
        assert_eq!((all.visible_devices(), all.visible_count()), (None, 2));
        assert_eq!(all.device_of(1), Some(1));
    }

    #[test]
    fn bad_spyre_devices_lists_are_named() {
        for (raw, expected) in [
            (
                "1,,2",
                "SPYRE_DEVICES=\"1,,2\" is not valid: entry 2 is empty",
            ),
            (
                "1,x",
                "SPYRE_DEVICES=\"1,x\" is not valid: entry \"x\" is not a device index",
            ),
            (
                "-1",
                "SPYRE_DEVICES=\"-1\" is not valid: entry \"-1\" is not a device index",
            ),
            (
                "0,4",
                "visible device 4 does not exist: the system has 4 device(s) (0..=3) (from SPYRE_MOCK_DEVICES=\"4\", SPYRE_DEVICES=\"0,4\")",
            ),
            (
                "3,1,3",
                "visible device 3 is listed twice (from SPYRE_MOCK_DEVICES=\"4\", SPYRE_DEVICES=\"3,1,3\")",
            ),
            (
                "99999999999",
                "entry 99999999999 is too large for a device index",
            ),
        ] {
            let err =
                MockConfig::from_lookup(lookup(&[(ENV_DEVICES, "4"), (ENV_VISIBLE_DEVICES, raw)]))
                    .unwrap_err();
            assert_eq!(err.status(), flex_rt::Status::INVALID_ARGUMENT, "{raw}");
            assert!(err.message().contains(expected), "{raw}: {}", err.message());
        }
    }
}

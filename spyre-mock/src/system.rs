//! The software device as a whole: its devices, and the flex-rt backend.
use std::sync::Arc;

use flex_rt::{Backend, FlexError, Result, Runtime, Status};

use crate::config::{MockConfig, MockSystemBuilder, device_list};
use crate::faults::SystemFaults;
use crate::runtime::MockRuntime;

/// The software device: `devices` logical devices that runtimes can be
/// created on. Implements [`flex_rt::Backend`] with the name `"mock"`.
///
/// Every runtime created gets fresh state (see [`MockRuntime`]); the system
/// itself holds only the configuration and the [`SystemFaults`]. Clones
/// share the faults.
///
/// Thread-safety: `Send + Sync`; every method may be called from any thread.
#[derive(Clone, Debug)]
pub struct MockSystem {
    config: MockConfig,
    faults: Arc<SystemFaults>,
}

impl Default for MockSystem {
    /// One device with the default configuration.
    fn default() -> Self {
        Self::with_config(MockConfig::default())
    }
}

impl MockSystem {
    /// A builder for a system; see [`MockSystemBuilder`].
    pub fn builder() -> MockSystemBuilder {
        MockSystemBuilder::new()
    }

    /// A system with a checked configuration.
    pub fn with_config(config: MockConfig) -> Self {
        Self {
            config,
            faults: Arc::default(),
        }
    }

    /// A system configured by the `SPYRE_MOCK_*` environment variables (see
    /// the [crate docs](crate)); unset variables keep their defaults.
    ///
    /// # Errors
    /// As [`MockConfig::from_lookup`]: a bad value, named with its variable
    /// and raw text.
    pub fn from_env() -> Result<Self> {
        Ok(Self::with_config(MockConfig::from_lookup(
            flex_rt::env::var_or_empty,
        )?))
    }

    /// The configuration.
    pub fn config(&self) -> &MockConfig {
        &self.config
    }

    /// Fault injection switches, shared with every clone of the system.
    pub fn faults(&self) -> &Arc<SystemFaults> {
        &self.faults
    }

    /// Creates a runtime on `logical_device` and returns it as the concrete
    /// type.
    ///
    /// # Errors
    /// [`Status::NO_DEVICE`] naming the index and the device count when
    /// `logical_device` is not below it; [`Status::RUNTIME_FAILED`] while
    /// [`SystemFaults::set_fail_runtime_creation`] is on, or when an engine
    /// thread cannot be started.
    pub fn create_mock_runtime(&self, logical_device: u32) -> Result<MockRuntime> {
        const CALL: &str = "create_runtime";
        if self.config.device_of(logical_device).is_none() {
            let visible = self.config.visible_count();
            let which = match self.config.visible_devices() {
                Some(list) => format!(
                    "{visible} device(s) are visible ({}, as SPYRE_DEVICES or visible_devices set them)",
                    device_list(list)
                ),
                None => format!(
                    "the mock system has {visible} device(s) (0..={})",
                    visible.saturating_sub(1)
                ),
            };
            return Err(FlexError::new(
                Status::NO_DEVICE,
                CALL,
                format!("logical device {logical_device} does not exist; {which}"),
            ));
        }
        if self.faults.fail_runtime_creation() {
            return Err(FlexError::new(
                Status::RUNTIME_FAILED,
                CALL,
                format!(
                    "device {logical_device} could not be opened (fault injected by SystemFaults::set_fail_runtime_creation)"
                ),
            ));
        }
        MockRuntime::start(logical_device, &self.config)
    }
}

impl Backend for MockSystem {
    fn name(&self) -> &'static str {
        "mock"
    }

    /// The visible devices (`SPYRE_DEVICES`), all by default.
    fn device_count(&self) -> Result<u32> {
        Ok(self.config.visible_count())
    }

    /// The configuration: devices (and the visible ones, when
    /// `SPYRE_DEVICES` chooses), memory, region size, engines, op latency,
    /// copy bandwidth, synchronize policy, whether waits are device-side
    /// and whether the use-after-free check is on.
    fn details(&self) -> Vec<(&'static str, String)> {
        let c = &self.config;
        let mut details = vec![("devices", c.devices().to_string())];
        if let Some(visible) = c.visible_devices() {
            details.push(("visible_devices", device_list(visible)));
        }
        details.extend([
            ("memory_bytes", c.memory_bytes().to_string()),
            ("region_bytes", c.region_bytes().to_string()),
            ("engines", c.engines().to_string()),
            ("op_latency", format!("{:?}", c.op_latency())),
            (
                "copy_bandwidth",
                c.copy_bandwidth()
                    .map_or_else(|| "unlimited".to_string(), |bw| format!("{bw} B/s")),
            ),
            ("sync_policy", c.sync_policy().as_str().to_string()),
            ("device_side_wait", c.device_side_wait().to_string()),
            ("event_timing", c.event_timing().to_string()),
            ("check_reuse", c.check_reuse().to_string()),
        ]);
        details
    }

    fn create_runtime(&self, logical_device: u32) -> Result<Box<dyn Runtime>> {
        Ok(Box::new(self.create_mock_runtime(logical_device)?))
    }
}

impl MockSystemBuilder {
    /// Checks the values and makes the system.
    ///
    /// # Errors
    /// As [`MockSystemBuilder::build_config`].
    pub fn build(self) -> Result<MockSystem> {
        Ok(MockSystem::with_config(self.build_config()?))
    }
}

//! The device allocations of one iteration (or one pipeline slot).

use spyre_stream::{CompositeAddress, Device};

/// The device allocations of one iteration (or one pipeline slot), freed
/// explicitly once no stream uses them.
pub(super) struct DeviceMemory {
    addresses: Vec<CompositeAddress>,
}

impl DeviceMemory {
    /// No allocation yet.
    pub(super) fn new() -> Self {
        Self {
            addresses: Vec::with_capacity(3),
        }
    }

    /// Adds an allocation to free with the others.
    pub(super) fn push(&mut self, address: CompositeAddress) {
        self.addresses.push(address);
    }

    /// Frees every allocation; all are attempted, the first error is returned.
    pub(super) fn free(self) -> Result<(), spyre_stream::Error> {
        let mut first = Ok(());
        for address in &self.addresses {
            if let Err(e) = spyre_stream::free(Device::CURRENT, address)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    /// Frees every allocation on a path that already reports an error:
    /// a failure to free is only logged.
    pub(super) fn free_or_warn(self) {
        if let Err(e) = self.free() {
            tracing::warn!(error = %e, "freeing device memory failed");
        }
    }
}

//! `SpyreStream`: a stream as a plain (device, id) value.

use std::fmt;

use flex_rt::{CompositeAddress, DataFormat, HostBuffer, LaunchOptions};

use crate::{Result, StreamErrorState, StreamId, global};

/// A Spyre stream: a small `Copy` value of (device index, stream id), like
/// `c10::Stream`. It holds no handle and no interior mutability; every
/// operation resolves the runtime handle through the process-wide pool under
/// its read lock (torch-spyre's `resolveRuntimeHandle`), so a `SpyreStream`
/// can be copied to and used from any thread.
///
/// Equality and hashing are on (device, id). [`SpyreStream::priority`]
/// derives from the id alone.
///
/// The methods here go through the process-wide pool (see [`crate::start_runtime`]).
/// For a [`crate::StreamPool`] built by hand, call the same-named `StreamPool` methods.
///
/// Submissions to one stream from several threads are serialized by the
/// runtime backend (flex-rt's contract); their relative order is the order
/// in which they reach the stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpyreStream {
    device: u8,
    id: StreamId,
}

impl SpyreStream {
    /// A stream value for `id` on `device` without asking the pool (c10's
    /// `Stream(UNSAFE, device, id)`). Nothing is checked here: an operation
    /// on an id that has no handle fails with [`crate::Error::NoHandle`].
    pub fn from_parts(device: u8, id: StreamId) -> Self {
        Self { device, id }
    }

    /// The stream id.
    pub fn id(self) -> StreamId {
        self.id
    }

    /// The logical device index.
    pub fn device_index(self) -> u8 {
        self.device
    }

    /// 0 for ids 0–32, -1 above, as torch-spyre reports it.
    pub fn priority(self) -> i32 {
        self.id.priority()
    }

    /// Whether all work enqueued on the stream has completed. Never blocks.
    ///
    /// # Errors
    /// [`crate::Error::NoHandle`] when the id has no handle; the runtime's
    /// error, unchanged, if the stream has failed.
    pub fn query(self) -> Result<bool> {
        global::pool_of(self)?.query(self)
    }

    /// Blocks until all work enqueued on the stream has completed. No lock is
    /// held while waiting.
    ///
    /// # Errors
    /// As [`SpyreStream::query`].
    pub fn synchronize(self) -> Result<()> {
        global::pool_of(self)?.synchronize(self)
    }

    /// The stream's error state (`SpyreStreamGetError`).
    ///
    /// # Errors
    /// As [`SpyreStream::query`].
    pub fn error(self) -> Result<StreamErrorState> {
        global::pool_of(self)?.stream_error(self)
    }

    /// Enqueues a host-to-device copy; see [`crate::StreamPool::launch_h2d`].
    ///
    /// # Errors
    /// As [`SpyreStream::query`], plus the launch's own errors.
    pub fn launch_h2d(
        self,
        src: &HostBuffer,
        dst: &CompositeAddress,
        options: LaunchOptions,
    ) -> Result<()> {
        global::pool_of(self)?.launch_h2d(self, src, dst, options)
    }

    /// Enqueues a device-to-host copy; see [`crate::StreamPool::launch_d2h`].
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`].
    pub fn launch_d2h(
        self,
        src: &CompositeAddress,
        dst: &HostBuffer,
        options: LaunchOptions,
    ) -> Result<()> {
        global::pool_of(self)?.launch_d2h(self, src, dst, options)
    }

    /// Enqueues a compute program; see [`crate::StreamPool::launch_compute`].
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`].
    pub fn launch_compute(self, program: &CompositeAddress, options: LaunchOptions) -> Result<()> {
        global::pool_of(self)?.launch_compute(self, program, options)
    }

    /// Enqueues a host callback; see [`crate::StreamPool::launch_host_callback`].
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`].
    pub fn launch_host_callback(
        self,
        callback: impl FnOnce() + Send + 'static,
        options: LaunchOptions,
    ) -> Result<()> {
        global::pool_of(self)?.launch_host_callback(self, callback, options)
    }

    /// Enqueues a fill; see [`crate::StreamPool::launch_fill`].
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`].
    pub fn launch_fill(
        self,
        dst: &CompositeAddress,
        value: f64,
        format: DataFormat,
        options: LaunchOptions,
    ) -> Result<()> {
        global::pool_of(self)?.launch_fill(self, dst, value, format, options)
    }
}

impl fmt::Debug for SpyreStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SpyreStream {{ device: {}, id: {} }}",
            self.device, self.id
        )
    }
}

impl fmt::Display for SpyreStream {
    /// `<spyre stream device=0 id=5>`, after torch-spyre's `__repr__`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<spyre stream device={} id={}>", self.device, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    static_assertions::assert_impl_all!(SpyreStream: Copy, Send, Sync);

    #[test]
    fn equality_and_hash_are_on_device_and_id() {
        let a = SpyreStream::from_parts(0, StreamId(5));
        let b = SpyreStream::from_parts(0, StreamId(5));
        let c = SpyreStream::from_parts(1, StreamId(5));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let set: HashSet<_> = [a, b, c].into_iter().collect();
        assert_eq!(set.len(), 2);
        assert_eq!(a.to_string(), "<spyre stream device=0 id=5>");
        assert_eq!(std::mem::size_of::<SpyreStream>(), 16);
    }
}

//! `SpyreStream`: a stream as a plain (device, id) value.

use std::fmt;

use flex_rt::{CompositeAddress, DataFormat, HostBuffer, LaunchOptions, Stream};

use crate::{Result, StreamErrorState, StreamId, runtime};

/// A Spyre stream: a small `Copy` value of (device index, stream id), like
/// `c10::Stream`. It holds no handle and no interior mutability; every
/// operation resolves the runtime handle through the process-wide pool under
/// its read lock (torch-spyre's `resolveRuntimeHandle`), so a `SpyreStream`
/// can be copied to and used from any thread.
///
/// Equality and hashing are on (device, id). [`SpyreStream::priority`]
/// derives from the id alone.
///
/// The methods here are the one public way to use a pool stream; they go
/// through the process-wide pool (see [`crate::start_runtime`]). For a
/// [`crate::StreamPool`] built by hand, [`crate::StreamPool::resolve`] gives
/// the raw handle, whose [`flex_rt::Stream`] methods are the same operations.
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

    /// The runtime handle behind this stream, resolved through the
    /// process-wide pool ([`crate::StreamPool::resolve`]).
    #[inline]
    fn handle(self) -> Result<&'static dyn Stream> {
        runtime::pool_of(self)?.resolve(self)
    }

    /// Whether all work enqueued on the stream has completed. Never blocks.
    ///
    /// # Errors
    /// [`crate::Error::NoHandle`] when the id has no handle;
    /// [`crate::Error::WrongDevice`] for a stream of another device;
    /// [`crate::Error::ForkedProcess`] in a forked child; the runtime's
    /// error, unchanged ([`crate::Error::Flex`]), if the stream has failed.
    pub fn query(self) -> Result<bool> {
        Ok(self.handle()?.query()?)
    }

    /// Blocks until all work enqueued on the stream has completed. No lock is
    /// held while waiting.
    ///
    /// # Errors
    /// As [`SpyreStream::query`].
    pub fn synchronize(self) -> Result<()> {
        Ok(self.handle()?.synchronize()?)
    }

    /// The stream's error state (`SpyreStreamGetError`): `Shutdown` when the
    /// runtime says the stream needs a shutdown, else `Success`.
    ///
    /// # Errors
    /// As [`SpyreStream::query`].
    pub fn error(self) -> Result<StreamErrorState> {
        Ok(StreamErrorState::of(self.handle()?)?)
    }

    /// Enqueues a host-to-device copy of all of `src` into `dst`
    /// (`SpyreStream::launchH2D`); see [`flex_rt::Stream::launch_h2d`]. The
    /// operation leases `src` until it completes.
    ///
    /// # Errors
    /// As [`SpyreStream::query`], plus the launch's own errors (sizes that
    /// differ, a buffer already leased, a refused launch).
    pub fn launch_h2d(
        self,
        src: &HostBuffer,
        dst: &CompositeAddress,
        options: LaunchOptions,
    ) -> Result<()> {
        Ok(self.handle()?.launch_h2d(src, dst, options)?)
    }

    /// Enqueues a device-to-host copy of all of `src` into `dst`
    /// (`SpyreStream::launchD2H`); see [`flex_rt::Stream::launch_d2h`]. The
    /// operation leases `dst` exclusively until it completes.
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`].
    pub fn launch_d2h(
        self,
        src: &CompositeAddress,
        dst: &HostBuffer,
        options: LaunchOptions,
    ) -> Result<()> {
        Ok(self.handle()?.launch_d2h(src, dst, options)?)
    }

    /// Enqueues the compute program at `program` (`SpyreStream::launchCompute`;
    /// the format is [`flex_rt::program`]); see
    /// [`flex_rt::Stream::launch_compute`].
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`].
    pub fn launch_compute(self, program: &CompositeAddress, options: LaunchOptions) -> Result<()> {
        Ok(self.handle()?.launch_compute(program, options)?)
    }

    /// Enqueues `callback` to run on a runtime thread in stream order
    /// (`SpyreStream::launchHostCallback`); see
    /// [`flex_rt::Stream::launch_host_callback`].
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`]; on error the callback is dropped
    /// without running.
    pub fn launch_host_callback(
        self,
        callback: impl FnOnce() + Send + 'static,
        options: LaunchOptions,
    ) -> Result<()> {
        Ok(self
            .handle()?
            .launch_host_callback(Box::new(callback), options)?)
    }

    /// Enqueues a fill of `dst` with `value` in `format`
    /// (`SpyreStream::fillAsync`); see [`flex_rt::Stream::launch_fill`].
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
        Ok(self.handle()?.launch_fill(dst, value, format, options)?)
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

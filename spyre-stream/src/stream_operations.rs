//! The operations of a [`SpyreStream`] (torch-spyre's `SpyreStream::query`,
//! `synchronize`, `getError` and the launch chokepoint), each resolving the
//! stream's handle through the process-wide pool. The value type itself is
//! in `stream.rs`, below the pool, which takes it as an argument.

use flex_rt::{CompositeAddress, DataFormat, HostBuffer, LaunchOptions, Stream};

use crate::counters::{self, Counted, Direction};
use crate::error::Result;
use crate::instrument;
use crate::runtime;
use crate::state::StreamErrorState;
use crate::stream::SpyreStream;
use crate::trace::{self, OperationKind, Traced};

impl SpyreStream {
    /// The runtime handle behind this stream, resolved through the
    /// process-wide pool ([`crate::StreamPool::resolve`]).
    #[inline]
    pub(crate) fn handle(self) -> Result<&'static dyn Stream> {
        runtime::pool_of(self)?.resolve(self)
    }

    /// The launch chokepoint: resolves the handle and launches, with a
    /// pipeline barrier while memory reused on the stream has a request no
    /// enqueued launch has covered yet (`memory::reuse_barrier`; one
    /// acquire load decides), recording the operation in the trace and the
    /// counters when they are on (one relaxed load decides).
    fn launch(
        self,
        kind: OperationKind,
        bytes: u64,
        mut options: LaunchOptions,
        launch: impl FnOnce(&dyn Stream, LaunchOptions) -> flex_rt::Result<()>,
    ) -> Result<()> {
        let (handle, barriers) = runtime::launch_target(self)?;
        let reused = barriers.uncovered(self);
        if reused.is_some() {
            options.pipeline_barrier = true;
        }
        let flags = instrument::flags();
        if flags == 0 {
            launch(handle, options)?;
            if let Some(reused) = reused {
                reused.cover();
            }
            return Ok(());
        }
        let (tracing, counting) = (
            flags & instrument::TRACE != 0,
            flags & instrument::COUNTERS != 0,
        );
        let (options, traced) = if tracing {
            let (options, entry) = trace::traced(self, kind, bytes, options);
            (options, Some(entry))
        } else {
            (options, None)
        };
        let (options, counted) = if counting {
            let direction = match kind {
                OperationKind::H2d => Direction::H2d,
                OperationKind::D2h => Direction::D2h,
                _ => Direction::None,
            };
            let (options, count) = counters::counted(self, direction, bytes, options);
            (options, Some(count))
        } else {
            (options, None)
        };
        let unlaunched = Unlaunched { traced, counted };
        launch(handle, options)?;
        unlaunched.launched();
        if let Some(reused) = reused {
            reused.cover();
        }
        Ok(())
    }

    /// Whether all work enqueued on the stream has completed, including
    /// waits on events ([`SpyreStream::wait_event`],
    /// [`SpyreStream::wait_stream`]): a pending wait is unfinished work.
    /// Never blocks.
    ///
    /// # Errors
    /// [`crate::Error::NoHandle`] when the id has no handle;
    /// [`crate::Error::WrongDevice`] for a stream of another device;
    /// [`crate::Error::ForkedProcess`] in a forked child; the runtime's
    /// error, unchanged ([`crate::Error::Flex`]), if the stream has failed.
    pub fn query(self) -> Result<bool> {
        Ok(self.handle()?.query()?)
    }

    /// Blocks until all work enqueued on the stream has completed, including
    /// its waits on events (see [`SpyreStream::query`]). No lock is held
    /// while waiting.
    ///
    /// # Errors
    /// As [`SpyreStream::query`]; [`crate::Error::Flex`] with `UNSUPPORTED`
    /// when called from a host callback or an operation's completion (a
    /// thread of the device's runtime), where the wait could never end.
    pub fn synchronize(self) -> Result<()> {
        Ok(self.handle()?.synchronize()?)
    }

    /// The stream's error state (`SpyreStreamGetError`): `Shutdown` when the
    /// runtime says the stream needs a shutdown, else `Success` — also for
    /// a stream that has failed without needing a shutdown, as in
    /// torch-spyre, where this state is about shutdown only (an operation's
    /// failure is what [`SpyreStream::query`] and
    /// [`SpyreStream::synchronize`] return).
    ///
    /// # Errors
    /// As [`SpyreStream::query`] for the handle ([`crate::Error::NoHandle`],
    /// [`crate::Error::WrongDevice`], [`crate::Error::ForkedProcess`]); the
    /// runtime's error when it cannot tell. Not the stream's failure.
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
        self.launch(
            OperationKind::H2d,
            dst.total_size(),
            options,
            |handle, options| handle.launch_h2d(src, dst, options),
        )
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
        self.launch(
            OperationKind::D2h,
            src.total_size(),
            options,
            |handle, options| handle.launch_d2h(src, dst, options),
        )
    }

    /// Enqueues the compute program at `program` (`SpyreStream::launchCompute`;
    /// the format is [`flex_rt::program`]); see
    /// [`flex_rt::Stream::launch_compute`].
    ///
    /// # Errors
    /// As [`SpyreStream::launch_h2d`].
    pub fn launch_compute(self, program: &CompositeAddress, options: LaunchOptions) -> Result<()> {
        self.launch(OperationKind::Compute, 0, options, |handle, options| {
            handle.launch_compute(program, options)
        })
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
        self.launch(
            OperationKind::HostCallback,
            0,
            options,
            |handle, options| handle.launch_host_callback(Box::new(callback), options),
        )
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
        self.launch(
            OperationKind::Fill,
            dst.total_size(),
            options,
            |handle, options| handle.launch_fill(dst, value, format, options),
        )
    }
}

/// A launch's trace entry and counts, taken back when it is dropped
/// before [`Unlaunched::launched`]: when the runtime refuses the launch,
/// and when the launch unwinds (a refused operation's closure and
/// completion are dropped inside it, and their drops are user code, which
/// may panic), so that a launch that never ran is never counted in flight.
struct Unlaunched {
    traced: Option<Traced>,
    counted: Option<Counted>,
}

impl Unlaunched {
    /// The runtime took the launch: its entry and counts stay.
    fn launched(mut self) {
        self.traced = None;
        self.counted = None;
    }
}

impl Drop for Unlaunched {
    fn drop(&mut self) {
        if let Some(entry) = self.traced.take() {
            entry.refused();
        }
        if let Some(count) = self.counted.take() {
            count.refused();
        }
    }
}

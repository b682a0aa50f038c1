//! [`DeviceBuffer`]: device memory with an owner.

use std::fmt;
use std::marker::PhantomData;

use flex_rt::sync::Mutex;
use flex_rt::{CompositeAddress, DataFormat, FlexError, HostBuffer, LaunchOptions, LogicalAddress};

use super::allocator::{Block, CachingAllocator};
use super::element::{self, DeviceElement};
use crate::error::{Error, Result};
use crate::runtime;
use crate::stream::SpyreStream;

/// `len` elements of `T` in device memory of the process's device, freed
/// when dropped (PyTorch's `torch.empty(n, device=...)`, cudarc's
/// `CudaSlice<T>`). `T` is one of the device's data formats: `f32`,
/// [`half::f16`], `i32`, or `u8` (also for untyped bytes).
///
/// ```
/// # fn main() -> spyre_stream::Result<()> {
/// use spyre_stream::{Device, DeviceBuffer};
///
/// spyre_stream::set_backend(Box::new(spyre_mock::MockSystem::default()))?;
/// let stream = spyre_stream::stream_from_pool(Device::CURRENT, 0)?;
/// let mut x = DeviceBuffer::from_host(stream, &[1.0f32, 2.0, 3.0])?;
/// x.fill(stream, 0.5)?;
/// assert_eq!(x.to_vec(stream)?, [0.5, 0.5, 0.5]);
/// drop(x); // cached for the next buffer on `stream`
/// assert_eq!(spyre_stream::memory_allocated(Device::CURRENT)?, 0);
/// # Ok(()) }
/// ```
///
/// # Stream-ordered lifetime (PyTorch's caching-allocator rules)
///
/// A buffer belongs to the stream it was allocated on. Its memory is ready
/// in that stream's order: work on the same stream may use it at once; to
/// use it on another stream, order that stream after this one first
/// ([`SpyreStream::wait_stream`]). Every method here that enqueues work on a
/// stream other than the buffer's own declares that use; work that reaches
/// the buffer in other ways (a compute program that names its address)
/// must be declared with [`DeviceBuffer::record_stream`].
///
/// Dropping a buffer never blocks. Its memory goes back to the allocator's
/// cache for its stream (unless it was lent, below), where the next
/// allocation on that stream of the same pool (up to 1 MiB, or larger, as
/// PyTorch's small and large pools) may take it at once (work enqueued
/// later on a stream runs after work enqueued earlier). As flex.h lets a
/// card overlap a stream's operations unless a launch asks for a
/// `pipeline_barrier`, the stream's next launch after such a reuse carries
/// that barrier (whatever it launches), so the new owner's work launched
/// through [`SpyreStream`] never overlaps the previous owner's. A launch
/// through a raw handle ([`crate::StreamPool::resolve`],
/// [`crate::default_stream_handle`]) neither carries nor clears it: after
/// a reuse, launch through the stream first, or set the barrier yourself.
/// If other streams
/// used it, an event is recorded on each, and
/// the memory is reused only after all have completed. Device memory goes
/// back to the device only by [`crate::empty_cache`], or when the device
/// is full (see [`DeviceBuffer::new`]). On a full device, a buffer may be
/// given memory cached for another stream that has finished its work, or,
/// where the device waits on the device side, for one with work left,
/// after which the buffer's stream waits for that work (its synchronize
/// too) and fails if it fails; when dropped, that memory waits for the buffer's stream before
/// the stream it was cached for reuses it.
///
/// Thread-safety: `Send + Sync`. Methods that write to the buffer take
/// `&mut self`; the device orders the work itself only within a stream.
pub struct DeviceBuffer<T: DeviceElement> {
    /// `None` only during drop.
    block: Option<Block>,
    len: usize,
    stream: SpyreStream,
    /// Streams other than `stream` that have used the buffer.
    users: Mutex<Vec<SpyreStream>>,
    allocator: &'static CachingAllocator,
    _element: PhantomData<T>,
}

impl<T: DeviceElement> DeviceBuffer<T> {
    /// `len` elements on the process's device, owned by `stream`. The
    /// contents are unspecified until written (device memory, not host
    /// memory: reading them is not undefined behaviour, only meaningless).
    /// Starts nothing: `stream` must come from the pool.
    ///
    /// # Errors
    /// [`Error::Flex`] (`INVALID_ARGUMENT`) for `len` 0 or a byte size
    /// that overflows; [`Error::NoHandle`], [`Error::WrongDevice`] or
    /// [`Error::ForkedProcess`] for `stream`, as [`SpyreStream::query`];
    /// [`Error::RuntimeReset`] after [`crate::free_runtime`];
    /// [`Error::OutOfMemory`] when the device cannot give the memory; the
    /// runtime's other allocation errors as [`Error::Flex`]. A
    /// stream that has failed is not looked at (as PyTorch's caching
    /// allocator does not): the buffer's first copy or fill on it fails.
    ///
    /// Blocking: when the device is full, a cached block of `stream` in the
    /// other pool (up to 1 MiB, or larger), in a segment that buffers still
    /// use, serves without waiting; when there is none and the cached
    /// memory of idle streams is not enough, blocks until the streams holding cached
    /// memory have finished their work, then returns it to the device and
    /// tries again (as PyTorch's allocator does); such waits run one at a
    /// time, so it may also wait for another thread's. If that is still not
    /// enough, a block cached for another stream that has finished its
    /// work now is lent (as CUDA's stream-ordered pools reuse memory
    /// opportunistically), waiting for nothing but, where that stream has
    /// failed, the work it began before its failure; failing that, where
    /// the device waits on the device side, one cached for a stream with
    /// work left, after `stream` is made to wait for that work
    /// ([`SpyreStream::wait_stream`], which blocks no thread; CUDA's
    /// inserted dependencies): `stream`'s later work and its synchronize
    /// then wait for that work too (a host function there that waits for
    /// the thread synchronizing `stream` would never return), and
    /// `stream` fails if that work fails.
    /// Called from a
    /// completion or host callback of the device, it waits for no stream
    /// (the device refuses that wait) nor for another thread, and may fail
    /// instead.
    pub fn new(stream: SpyreStream, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(FlexError::invalid_argument(
                "DeviceBuffer::new",
                "a device buffer needs at least one element, got 0",
            )
            .into());
        }
        let bytes = (len as u64).checked_mul(T::SIZE as u64).ok_or_else(|| {
            FlexError::invalid_argument(
                "DeviceBuffer::new",
                format!("{len} elements of {} bytes overflow u64", T::SIZE),
            )
        })?;
        let allocator = runtime::allocator_of(stream)?;
        let block = allocator.allocate(stream, bytes)?;
        Ok(Self {
            block: Some(block),
            len,
            stream,
            users: Mutex::new(Vec::new()),
            allocator,
            _element: PhantomData,
        })
    }

    /// `len` zeros, filled on `stream`.
    ///
    /// # Errors
    /// As [`DeviceBuffer::new`] and [`DeviceBuffer::fill`].
    pub fn zeros(stream: SpyreStream, len: usize) -> Result<Self> {
        let mut buffer = Self::new(stream, len)?;
        buffer.fill_bytes_zero(stream)?;
        Ok(buffer)
    }

    /// A copy of `values`, copied in on `stream` (cudarc's
    /// `memcpy_stod`). Returns once the copy is enqueued: `values` is
    /// staged in a host buffer first.
    ///
    /// # Errors
    /// As [`DeviceBuffer::new`] for `values.len()` and
    /// [`DeviceBuffer::copy_from_host`].
    pub fn from_host(stream: SpyreStream, values: &[T]) -> Result<Self> {
        let mut buffer = Self::new(stream, values.len())?;
        buffer.copy_from_host(stream, values)?;
        Ok(buffer)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a buffer holds at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes (`len() × T::SIZE`; the allocator's block may be
    /// larger).
    pub fn size_bytes(&self) -> u64 {
        self.address().total_size()
    }

    /// The data format of the elements.
    pub fn data_format(&self) -> DataFormat {
        T::FORMAT
    }

    /// The stream the buffer belongs to.
    pub fn stream(&self) -> SpyreStream {
        self.stream
    }

    /// Where the buffer lies: [`DeviceBuffer::size_bytes`] bytes, in one or
    /// more chunks. Valid while the buffer lives.
    pub fn address(&self) -> &CompositeAddress {
        &self
            .block
            .as_ref()
            .expect("a live buffer has its block")
            .address
    }

    /// The buffer's start address, for a kernel argument
    /// ([`flex_rt::program::KernelDescriptor`]), whose operand must lie in
    /// one chunk of device memory. Declare the compute's
    /// stream with [`DeviceBuffer::record_stream`] if it is not the
    /// buffer's own.
    ///
    /// # Errors
    /// [`Error::Flex`] (`INVALID_ARGUMENT`) when the buffer lies in more
    /// than one chunk (the device had no single free range for it).
    pub fn operand(&self) -> Result<LogicalAddress> {
        let chunks = self.address().chunks();
        if chunks.len() == 1 {
            Ok(chunks[0].address)
        } else {
            Err(FlexError::invalid_argument(
                "DeviceBuffer::operand",
                format!(
                    "the buffer's {} bytes lie in {} chunks of device memory, and a kernel operand must lie in one",
                    self.size_bytes(),
                    chunks.len()
                ),
            )
            .into())
        }
    }

    /// Declares that work on `stream` uses the buffer (PyTorch's
    /// `Tensor.record_stream`): when the buffer is dropped, its memory is
    /// reused only after the work enqueued on `stream` by then has
    /// completed. Needed only for uses the buffer's own methods do not see;
    /// a no-op for the buffer's own stream.
    ///
    /// # Errors
    /// As [`SpyreStream::query`] for `stream` (a stream without a handle,
    /// or of another device).
    pub fn record_stream(&self, stream: SpyreStream) -> Result<()> {
        stream.handle()?;
        self.note_use(stream);
        Ok(())
    }

    /// Enqueues a copy of `values` into the buffer on `stream` (H2D).
    /// Returns once enqueued: `values` is staged in a host buffer first.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] naming both lengths; as
    /// [`SpyreStream::launch_h2d`].
    pub fn copy_from_host(&mut self, stream: SpyreStream, values: &[T]) -> Result<()> {
        self.check_len("copy_from_host", values.len())?;
        let staged = HostBuffer::from_vec(element::encode(values));
        self.launch_h2d(stream, &staged)
    }

    /// Enqueues a copy of all of `src` into the buffer on `stream` (H2D);
    /// the operation leases `src` until it completes.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `src` is not [`DeviceBuffer::size_bytes`]
    /// long; as [`SpyreStream::launch_h2d`].
    pub fn copy_from_host_buffer(&mut self, stream: SpyreStream, src: &HostBuffer) -> Result<()> {
        self.check_bytes("copy_from_host_buffer", src.len())?;
        self.launch_h2d(stream, src)
    }

    /// Enqueues a copy of the buffer into all of `dst` on `stream` (D2H);
    /// the operation leases `dst` exclusively until it completes, so
    /// [`HostBuffer::read`] waits for the data.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] when `dst` is not [`DeviceBuffer::size_bytes`]
    /// long; as [`SpyreStream::launch_d2h`].
    pub fn copy_to_host_buffer(&self, stream: SpyreStream, dst: &HostBuffer) -> Result<()> {
        self.check_bytes("copy_to_host_buffer", dst.len())?;
        self.launch_on(stream, |address| {
            stream.launch_d2h(address, dst, LaunchOptions::new())
        })
    }

    /// Copies the buffer into `out` (D2H on `stream`) and waits for it: it
    /// synchronizes `stream` (cudarc's `memcpy_dtoh`).
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] naming both lengths; as
    /// [`SpyreStream::launch_d2h`] and [`SpyreStream::synchronize`] (the
    /// stream's error if it failed; `out` is unchanged then). From a host
    /// callback or an operation's completion the synchronize is refused
    /// (`UNSUPPORTED`) after the copy was enqueued, and `out` is unchanged:
    /// there, enqueue [`DeviceBuffer::copy_to_host_buffer`] and read the
    /// host buffer once the stream has passed it.
    pub fn copy_to_host(&self, stream: SpyreStream, out: &mut [T]) -> Result<()> {
        self.check_len("copy_to_host", out.len())?;
        let staged = HostBuffer::zeroed(self.size_bytes() as usize);
        self.copy_to_host_buffer(stream, &staged)?;
        stream.synchronize()?;
        element::decode_into(&staged.read(), out);
        Ok(())
    }

    /// The buffer's elements, copied to the host on `stream`; waits as
    /// [`DeviceBuffer::copy_to_host`] does.
    ///
    /// # Errors
    /// As [`DeviceBuffer::copy_to_host`].
    pub fn to_vec(&self, stream: SpyreStream) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.len];
        self.copy_to_host(stream, &mut out)?;
        Ok(out)
    }

    /// Enqueues a fill of every element with `value` on `stream`
    /// (`RuntimeStream::fillAsync`). Every value is written exactly but a
    /// NaN, which fills a quiet NaN whose payload may differ.
    ///
    /// # Errors
    /// As [`SpyreStream::launch_fill`].
    pub fn fill(&mut self, stream: SpyreStream, value: T) -> Result<()> {
        self.launch_on(stream, |address| {
            stream.launch_fill(address, value.to_f64(), T::FORMAT, LaunchOptions::new())
        })
    }

    /// Zeros every byte (a fill of `u8` zeros, valid for every format).
    fn fill_bytes_zero(&mut self, stream: SpyreStream) -> Result<()> {
        self.launch_on(stream, |address| {
            stream.launch_fill(address, 0.0, DataFormat::Uint8, LaunchOptions::new())
        })
    }

    fn launch_h2d(&mut self, stream: SpyreStream, src: &HostBuffer) -> Result<()> {
        self.launch_on(stream, |address| {
            stream.launch_h2d(src, address, LaunchOptions::new())
        })
    }

    /// Launches on `stream` what `launch` enqueues on the buffer's memory
    /// and, once it is enqueued, remembers the use (the launch resolved and
    /// checked the stream).
    fn launch_on(
        &self,
        stream: SpyreStream,
        launch: impl FnOnce(&CompositeAddress) -> Result<()>,
    ) -> Result<()> {
        launch(self.address())?;
        self.note_use(stream);
        Ok(())
    }

    /// Remembers a use on `stream` if it is not the buffer's own.
    fn note_use(&self, stream: SpyreStream) {
        if stream != self.stream {
            let mut users = self.users.lock();
            if !users.contains(&stream) {
                users.push(stream);
            }
        }
    }

    fn check_len(&self, operation: &'static str, host: usize) -> Result<()> {
        if host == self.len {
            Ok(())
        } else {
            Err(Error::LengthMismatch {
                operation,
                buffer: self.len as u64,
                host: host as u64,
                unit: "elements",
            })
        }
    }

    fn check_bytes(&self, operation: &'static str, host: usize) -> Result<()> {
        if host as u64 == self.size_bytes() {
            Ok(())
        } else {
            Err(Error::LengthMismatch {
                operation,
                buffer: self.size_bytes(),
                host: host as u64,
                unit: "bytes",
            })
        }
    }
}

impl<T: DeviceElement> Drop for DeviceBuffer<T> {
    /// Returns the memory to the allocator's cache; never blocks. In a
    /// child of `fork()` the memory is the parent's: nothing is done.
    fn drop(&mut self) {
        if runtime::check_not_forked().is_err() {
            return;
        }
        if let Some(block) = self.block.take() {
            let users = std::mem::take(self.users.get_mut());
            self.allocator.free(block, &users);
        }
    }
}

impl<T: DeviceElement> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("format", &T::FORMAT)
            .field("len", &self.len)
            .field("stream", &self.stream)
            .field("address", &self.block.as_ref().map(|b| &b.address))
            .finish()
    }
}

//! Operations a stream runs, and the small traits through which they reach
//! host memory.
//!
//! [`Op`] with [`crate::MockStream::enqueue`] (or
//! [`crate::MockStream::enqueue_raw`]) is the one entry point for every
//! launch: the [`flex_rt::Stream`] methods of [`crate::MockStream`] build an
//! `Op` from leases on [`flex_rt::HostBuffer`]s and a boxed closure, and a
//! C-ABI layer builds one from raw host pointers (its own [`HostSource`] /
//! [`HostSink`] types) and C host functions (a [`RawHostFn`] whose function
//! maps the C status to `Err`, with a [`crate::RawCompletion`], neither
//! boxed). All
//! get the same validation, scheduling, completion and error rules.
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use flex_rt::{
    CompositeAddress, DataFormat, FlexError, ReadLease, Result, Status, WriteLease,
    check_copy_size, check_fill_size, drop_panic, panic_message,
};

use crate::kernel::{self, KernelFailure};
use crate::memory::DeviceMemory;
use crate::raw_call::{OpCompletion, RawHostFn};
use crate::record::EventRecord;

/// Host memory an H2D copy reads from. The operation owns the source until
/// it has run (or is dropped unrun), and drops it before calling the
/// operation's completion.
///
/// `len` is called when the operation is enqueued (to check the size) and
/// by the operation's `Debug` format, `bytes` once on an engine thread when
/// it runs, with no lock of the device held (it may call the runtime,
/// allocate or free device memory, say); the two must agree. Where they
/// do not, the copy moves the shorter of `bytes` and the device range (the
/// device bytes past a short source keep their values); nothing fails.
pub trait HostSource: Send {
    /// The bytes to copy to the device.
    fn bytes(&self) -> &[u8];

    /// How many bytes [`HostSource::bytes`] returns. The default calls it;
    /// a source over memory it does not own (a C caller's) gives the length
    /// without making a slice of bytes that are not yet the runtime's to
    /// read.
    fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Whether [`HostSource::len`] is 0.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Host memory a D2H copy writes into. The operation owns the sink until it
/// has run (or is dropped unrun), and drops it before calling the
/// operation's completion, so the completion may read the bytes.
///
/// `len` is called when the operation is enqueued (to check the size),
/// `bytes_mut` once on an engine thread when it runs, with no lock of the
/// device held (as [`HostSource::bytes`]); the two must agree. Where they
/// do not, the copy fills the shorter of `bytes_mut` and the device range
/// (the bytes of a longer sink past it keep their values); nothing fails.
pub trait HostSink: Send {
    /// The bytes the device data is copied into.
    fn bytes_mut(&mut self) -> &mut [u8];

    /// How many bytes [`HostSink::bytes_mut`] returns, without making a
    /// unique slice of them (at enqueue an earlier operation may still be
    /// writing them).
    fn len(&self) -> usize;

    /// Whether [`HostSink::len`] is 0.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl HostSource for ReadLease {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl HostSource for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl HostSource for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl HostSink for WriteLease {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }

    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// A host function run in stream order. `Err(message)` fails the operation
/// (and the stream) with [`Status::HOST_CALLBACK_FAILED`] and the message; a
/// panic inside is caught and does the same.
pub type HostFn = Box<dyn FnOnce() -> Result<(), String> + Send + 'static>;

/// One operation for [`crate::MockStream::enqueue`].
///
/// Sizes are checked at enqueue ([`Status::INVALID_ARGUMENT`]); device
/// addresses are checked when the operation runs: every chunk must lie
/// inside a live allocation of the stream's runtime, else the operation
/// fails with [`Status::EXECUTION_FAILED`] and moves no byte.
pub enum Op {
    /// Copies all of `src` to `dst`; the sizes must be equal.
    H2d {
        /// Host bytes to read.
        src: Box<dyn HostSource>,
        /// Device destination.
        dst: CompositeAddress,
    },
    /// Copies all of `src` into `dst`; the sizes must be equal.
    D2h {
        /// Device source.
        src: CompositeAddress,
        /// Host bytes to write.
        dst: Box<dyn HostSink>,
    },
    /// Runs the kernel descriptor stored at `program` (see [`flex_rt::program`]).
    Compute {
        /// Device address of a [`flex_rt::program::KernelDescriptor`].
        program: CompositeAddress,
    },
    /// Fills `dst` with `value` converted to `format` (see
    /// [`encode_fill_value`]); the size must be a whole number of elements.
    Fill {
        /// Device destination.
        dst: CompositeAddress,
        /// Value before conversion.
        value: f64,
        /// Element format.
        format: DataFormat,
    },
    /// Runs a host function on an engine thread in stream order.
    HostFn(HostFn),
    /// Runs a host function given as a function and context words
    /// ([`RawHostFn`]) on an engine thread in stream order, with the rules
    /// of [`Op::HostFn`], and without a heap allocation.
    RawHostFn(RawHostFn),
    /// Runs the host callback of [`flex_rt::Stream::launch_host_callback`]
    /// on an engine thread in stream order, as it was given (no second
    /// box): it returns nothing, and a panic inside fails the operation
    /// with [`Status::HOST_CALLBACK_FAILED`].
    HostCallback(flex_rt::HostCallback),
    /// An event's record: completes the event, with a timestamp, when the
    /// stream reaches it. Made by [`crate::MockStream`]'s `record_event`,
    /// and by its `wait_event` as the wait's marker; takes no time in the
    /// timing model.
    Record(EventRecord),
}

impl Op {
    /// An H2D copy from `src`.
    pub fn h2d(src: impl HostSource + 'static, dst: CompositeAddress) -> Self {
        Self::H2d {
            src: Box::new(src),
            dst,
        }
    }

    /// A D2H copy into `dst`.
    pub fn d2h(src: CompositeAddress, dst: impl HostSink + 'static) -> Self {
        Self::D2h {
            src,
            dst: Box::new(dst),
        }
    }

    /// A compute operation running the descriptor at `program`.
    pub fn compute(program: CompositeAddress) -> Self {
        Self::Compute { program }
    }

    /// A fill of `dst`.
    pub fn fill(dst: CompositeAddress, value: f64, format: DataFormat) -> Self {
        Self::Fill { dst, value, format }
    }

    /// A host function.
    pub fn host_fn(f: impl FnOnce() -> Result<(), String> + Send + 'static) -> Self {
        Self::HostFn(Box::new(f))
    }

    /// A host function given as a function and context words.
    pub fn raw_host_fn(f: RawHostFn) -> Self {
        Self::RawHostFn(f)
    }

    /// The name of the [`flex_rt::Stream`] method this operation belongs to
    /// (`launch_h2d`, `launch_d2h`, `launch_compute`, `launch_fill`,
    /// `launch_host_callback`, `record_event`); errors of the operation carry
    /// it as their call.
    pub fn call(&self) -> &'static str {
        match self {
            Self::H2d { .. } => "launch_h2d",
            Self::D2h { .. } => "launch_d2h",
            Self::Compute { .. } => "launch_compute",
            Self::Fill { .. } => "launch_fill",
            Self::HostFn(_) | Self::RawHostFn(_) | Self::HostCallback(_) => "launch_host_callback",
            Self::Record(_) => "record_event",
        }
    }

    /// Launch-time checks of the operation's own arguments.
    pub(crate) fn validate(&mut self) -> Result<()> {
        let call = self.call();
        match self {
            Self::H2d { src, dst } => check_copy_size(call, src.len(), dst),
            Self::D2h { src, dst } => check_copy_size(call, dst.len(), src),
            Self::Fill { dst, format, .. } => check_fill_size(call, dst, *format),
            Self::Compute { .. }
            | Self::HostFn(_)
            | Self::RawHostFn(_)
            | Self::HostCallback(_)
            | Self::Record(_) => Ok(()),
        }
    }

    /// Whether the timing model charges this operation (an event record is
    /// a marker and takes no time).
    pub(crate) fn is_timed(&self) -> bool {
        !matches!(self, Self::Record(_))
    }

    /// Settles an event record that will not run (its stream failed first)
    /// with the error its completion gets.
    pub(crate) fn abandon(&self, error: &FlexError) {
        if let Self::Record(EventRecord(record)) = self {
            record.settle(Err(error.clone()));
        }
    }

    /// Bytes moved between host and device (0 for anything but a copy), for
    /// the bandwidth model.
    pub(crate) fn copy_bytes(&self) -> u64 {
        match self {
            Self::H2d { dst, .. } => dst.total_size(),
            Self::D2h { src, .. } => src.total_size(),
            _ => 0,
        }
    }

    /// Runs the operation on an engine thread; consumes it, so its host
    /// memory is released when this returns.
    pub(crate) fn execute(self, memory: &DeviceMemory) -> Result<()> {
        let call = self.call();
        let failed = |message: String| FlexError::new(Status::EXECUTION_FAILED, call, message);
        let out_of_memory = |message: String| FlexError::new(Status::OUT_OF_MEMORY, call, message);
        match self {
            // The caller's source or sink gives its bytes before the memory
            // is viewed: it may allocate or free device memory itself,
            // which the view would block.
            Self::H2d { src, dst } => {
                let bytes = src.bytes();
                let view = memory.view();
                let spans = view.spans(&dst).map_err(failed)?;
                view.write(&spans, bytes).map_err(out_of_memory)
            }
            Self::D2h { src, mut dst } => {
                let sink = dst.bytes_mut();
                let view = memory.view();
                let spans = view.spans(&src).map_err(failed)?;
                view.read(&spans, sink);
                Ok(())
            }
            Self::Fill { dst, value, format } => {
                let view = memory.view();
                let spans = view.spans(&dst).map_err(failed)?;
                view.fill(&spans, &encode_fill_value(value, format))
                    .map_err(out_of_memory)
            }
            Self::Compute { program } => {
                kernel::execute(&memory.view(), &program).map_err(|failure| match failure {
                    KernelFailure::Invalid(message) => failed(message),
                    KernelFailure::Backing(message) => out_of_memory(message),
                })
            }
            Self::Record(EventRecord(record)) => {
                record.settle(Ok(record.time_reached()));
                Ok(())
            }
            Self::HostFn(f) => host_fn_result(call, catch_unwind(AssertUnwindSafe(f))),
            Self::RawHostFn(f) => {
                host_fn_result(call, catch_unwind(AssertUnwindSafe(move || f.call())))
            }
            Self::HostCallback(f) => catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
                let err = host_callback_panicked(call, payload.as_ref());
                drop_panic(payload);
                err
            }),
        }
    }
}

/// The result of a host function's operation, from what the function
/// returned or the panic it raised (both fail the operation with
/// [`Status::HOST_CALLBACK_FAILED`]).
fn host_fn_result(
    call: &'static str,
    outcome: std::thread::Result<std::result::Result<(), String>>,
) -> Result<()> {
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => Err(FlexError::new(
            Status::HOST_CALLBACK_FAILED,
            call,
            format!("host callback returned an error: {message}"),
        )),
        Err(payload) => {
            let err = host_callback_panicked(call, payload.as_ref());
            drop_panic(payload);
            Err(err)
        }
    }
}

/// The error of a host function or callback that panicked.
fn host_callback_panicked(call: &'static str, payload: &(dyn std::any::Any + Send)) -> FlexError {
    FlexError::new(
        Status::HOST_CALLBACK_FAILED,
        call,
        format!("host callback panicked: {}", panic_message(payload)),
    )
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::H2d { src, dst } => f
                .debug_struct("H2d")
                .field("src_len", &src.len())
                .field("dst", dst)
                .finish(),
            Self::D2h { src, .. } => f.debug_struct("D2h").field("src", src).finish(),
            Self::Compute { program } => {
                f.debug_struct("Compute").field("program", program).finish()
            }
            Self::Fill { dst, value, format } => f
                .debug_struct("Fill")
                .field("dst", dst)
                .field("value", value)
                .field("format", format)
                .finish(),
            Self::HostFn(_) => f.write_str("HostFn"),
            Self::RawHostFn(raw) => raw.fmt(f),
            Self::HostCallback(_) => f.write_str("HostCallback"),
            Self::Record(record) => record.fmt(f),
        }
    }
}

/// An enqueued operation.
pub(crate) struct Pending {
    /// Position in the runtime-wide enqueue order
    /// ([`crate::inbox::InboxState::number`]).
    pub(crate) seq: u64,
    pub(crate) op: Op,
    pub(crate) completion: Option<OpCompletion>,
}

impl Pending {
    /// An operation not yet numbered; it is numbered as it is queued.
    pub(crate) fn new(op: Op, completion: Option<OpCompletion>) -> Self {
        Self {
            seq: 0,
            op,
            completion,
        }
    }
}

/// The bytes of one fill element: `value` converted to `format`,
/// little-endian, as flex.h's `flex_launch_fill` defines it.
///
/// - `Fp32`, `Fp16`: rounded to nearest, ties to even; out-of-range values
///   become ±infinity, NaN stays NaN.
/// - `Int32`, `Uint8`: truncated toward zero and saturated to the type's
///   range; NaN becomes 0.
pub fn encode_fill_value(value: f64, format: DataFormat) -> Vec<u8> {
    match format {
        DataFormat::Fp32 => (value as f32).to_le_bytes().to_vec(),
        DataFormat::Fp16 => f16_bits_nearest(value).to_le_bytes().to_vec(),
        DataFormat::Int32 => (value as i32).to_le_bytes().to_vec(),
        DataFormat::Uint8 => vec![value as u8],
    }
}

/// The IEEE 754 binary16 bits nearest `value` (ties to even), rounded once
/// from the `f64`: not through `f32` (as a half-precision conversion
/// instruction would need), which rounds twice and can land on the other
/// side of a tie (1 + 2⁻¹¹ + 2⁻⁴⁰ is not 1.0). Values at or beyond
/// 65 520 become ±infinity; NaN becomes a quiet NaN of the same sign.
fn f16_bits_nearest(value: f64) -> u16 {
    const MANTISSA_BITS: u32 = 52;
    let bits = value.to_bits();
    let sign = ((bits >> 48) & 0x8000) as u16;
    let biased = ((bits >> MANTISSA_BITS) & 0x7FF) as i32;
    let fraction = bits & ((1 << MANTISSA_BITS) - 1);
    if biased == 0x7FF {
        return sign | if fraction == 0 { 0x7C00 } else { 0x7E00 };
    }
    if biased == 0 {
        // Zero, or an f64 subnormal: far below half of binary16's least
        // subnormal (2⁻²⁵).
        return sign;
    }
    let exponent = biased - 1023;
    if exponent >= 16 {
        return sign | 0x7C00;
    }
    let significand = fraction | (1 << MANTISSA_BITS);
    // The value in units of the result's last place: 2⁻²⁴ for binary16
    // subnormals (exponent below -14), 2^(exponent - 10) for normals.
    let shift = if exponent < -14 { 28 - exponent } else { 42 } as u32;
    if shift > MANTISSA_BITS + 1 {
        // Below half of 2⁻²⁴: rounds to zero.
        return sign;
    }
    let quotient = significand >> shift;
    let remainder = significand & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let rounded =
        quotient + u64::from(remainder > half || (remainder == half && quotient & 1 == 1));
    // A normal's quotient holds the implicit bit (2¹⁰), which lands in the
    // exponent field: adding the exponent less one gives the encoding,
    // and a rounding carry moves into the exponent (up to infinity).
    let magnitude = if exponent < -14 {
        rounded
    } else {
        (((exponent + 14) as u64) << 10) + rounded
    };
    sign | magnitude as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_values_are_converted_as_flex_h_says() {
        assert_eq!(
            encode_fill_value(1.5, DataFormat::Fp32),
            1.5f32.to_le_bytes()
        );
        assert_eq!(
            encode_fill_value(0.1, DataFormat::Fp32),
            0.1f32.to_le_bytes()
        );
        assert_eq!(encode_fill_value(1.5, DataFormat::Fp16), [0x00, 0x3E]);
        assert_eq!(encode_fill_value(-2.0, DataFormat::Fp16), [0x00, 0xC0]);
        assert_eq!(encode_fill_value(1e6, DataFormat::Fp16), [0x00, 0x7C]); // +inf
        assert_eq!(
            encode_fill_value(-2.7, DataFormat::Int32),
            (-2i32).to_le_bytes()
        );
        assert_eq!(
            encode_fill_value(2.7, DataFormat::Int32),
            2i32.to_le_bytes()
        );
        assert_eq!(
            encode_fill_value(1e20, DataFormat::Int32),
            i32::MAX.to_le_bytes()
        );
        assert_eq!(
            encode_fill_value(-1e20, DataFormat::Int32),
            i32::MIN.to_le_bytes()
        );
        assert_eq!(
            encode_fill_value(f64::NAN, DataFormat::Int32),
            0i32.to_le_bytes()
        );
        assert_eq!(encode_fill_value(3.9, DataFormat::Uint8), [3]);
        assert_eq!(encode_fill_value(300.0, DataFormat::Uint8), [255]);
        assert_eq!(encode_fill_value(-5.0, DataFormat::Uint8), [0]);
    }

    /// Every finite binary16 value, and every midpoint between two
    /// neighbours (exact in f64) with a nudge of 2⁻⁴⁰ of it either way: the
    /// value itself, the midpoint to the even neighbour, the nudged ones to
    /// the nearer neighbour. Worked by hand for the first ones.
    #[test]
    fn fp16_fills_are_rounded_once_to_nearest() {
        // 2^exponent, exactly (`powi` need not be exact, and under Miri is
        // not).
        let pow2 = |exponent: i32| f64::from_bits(((1023 + exponent) as u64) << 52);
        let fp16 = |value: f64| {
            u16::from_le_bytes(
                encode_fill_value(value, DataFormat::Fp16)
                    .try_into()
                    .unwrap(),
            )
        };
        // 1 + 2⁻¹¹ + 2⁻⁴⁰: above the tie between 1.0 and 1 + 2⁻¹⁰.
        assert_eq!(fp16(1.0 + pow2(-11) + pow2(-40)), 0x3C01);
        assert_eq!(fp16(1.0 + pow2(-11)), 0x3C00, "a tie goes to even");
        assert_eq!(fp16(1.0 + 3.0 * pow2(-11)), 0x3C02, "a tie goes to even");
        // 2⁻²⁵ + 2⁻⁵⁰: above half of the least subnormal.
        assert_eq!(fp16(pow2(-25) + pow2(-50)), 0x0001);
        assert_eq!(fp16(pow2(-25)), 0x0000, "a tie goes to even");
        assert_eq!(fp16(-pow2(-24)), 0x8001);
        assert_eq!(fp16(65504.0), 0x7BFF);
        assert_eq!(fp16(65519.99), 0x7BFF);
        assert_eq!(fp16(65520.0), 0x7C00);
        assert_eq!(fp16(-1e300), 0xFC00);
        assert_eq!(fp16(-0.0), 0x8000);
        assert_eq!(fp16(f64::MIN_POSITIVE / 2.0), 0x0000);
        assert_eq!(fp16(f64::NAN) & 0x7E00, 0x7E00);
        let value = |bits: u16| f64::from(half::f16::from_bits(bits));
        // Every value natively; every 61st under Miri, which is far slower.
        let step = if cfg!(miri) { 61 } else { 1 };
        for bits in (0..0x7C00u16).step_by(step) {
            assert_eq!(fp16(value(bits)), bits, "{bits:#06x}");
            assert_eq!(fp16(-value(bits)), bits | 0x8000, "-{bits:#06x}");
            if bits == 0x7BFF {
                continue;
            }
            let (low, high) = (value(bits), value(bits + 1));
            let middle = (low + high) / 2.0;
            let even = if bits % 2 == 0 { bits } else { bits + 1 };
            assert_eq!(fp16(middle), even, "midpoint above {bits:#06x}");
            let nudge = middle * pow2(-40);
            assert_eq!(
                fp16(middle - nudge),
                bits,
                "below the midpoint above {bits:#06x}"
            );
            assert_eq!(
                fp16(middle + nudge),
                bits + 1,
                "above the midpoint above {bits:#06x}"
            );
        }
    }

    #[test]
    fn sizes_are_checked_at_launch() {
        let dst = CompositeAddress::single(
            flex_rt::LogicalAddress {
                region_id: 0,
                offset: 0,
            },
            8,
        )
        .unwrap();
        let mut op = Op::h2d(vec![0u8; 7], dst.clone());
        let err = op.validate().unwrap_err();
        assert_eq!(err.call(), "launch_h2d");
        assert!(err.message().contains("7 bytes"), "{err}");
        assert!(Op::h2d(vec![0u8; 8], dst.clone()).validate().is_ok());
        let mut fill = Op::fill(dst.clone(), 1.0, DataFormat::Fp32);
        assert!(fill.validate().is_ok());
        let odd = CompositeAddress::single(
            flex_rt::LogicalAddress {
                region_id: 0,
                offset: 0,
            },
            6,
        )
        .unwrap();
        let err = Op::fill(odd, 1.0, DataFormat::Int32)
            .validate()
            .unwrap_err();
        assert_eq!(err.status(), Status::INVALID_ARGUMENT);
        assert_eq!(Op::compute(dst.clone()).call(), "launch_compute");
    }

    #[test]
    fn only_an_event_record_is_free_in_the_timing_model() {
        let dst = CompositeAddress::single(
            flex_rt::LogicalAddress {
                region_id: 0,
                offset: 0,
            },
            8,
        )
        .unwrap();
        let record = Op::Record(EventRecord(std::sync::Arc::new(
            crate::record::Record::new(0, 0),
        )));
        assert!(!record.is_timed());
        assert_eq!(record.call(), "record_event");
        for op in [
            Op::compute(dst.clone()),
            Op::fill(dst.clone(), 0.0, DataFormat::Uint8),
            Op::h2d(vec![0u8; 8], dst),
            Op::host_fn(|| Ok(())),
            Op::HostCallback(Box::new(|| {})),
        ] {
            assert!(op.is_timed(), "{op:?}");
        }
    }
}

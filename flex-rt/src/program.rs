//! The compute-program format of the device contract: 128-byte kernel
//! descriptors that name a built-in `f32` kernel, its sizes and arguments.
//!
//! A program is loaded into device memory with an H2D copy, like a real
//! binary, and run with [`Stream::launch_compute`](crate::Stream::launch_compute)
//! on its address. The format belongs to the contract, not to one backend:
//! callers build descriptors here, and every backend that accepts them runs
//! the same programs (the software device in `spyre-mock` executes them; a
//! device that cannot run a program fails the operation with
//! [`Status::EXECUTION_FAILED`](crate::Status::EXECUTION_FAILED) and a
//! message that names the problem).
//!
//! # Descriptor layout (128 bytes, little-endian)
//!
//! | offset | type         | field                                        |
//! |-------:|--------------|----------------------------------------------|
//! | 0      | `[u8; 4]`    | magic `"SPYK"` (`u32` 0x4B595053)            |
//! | 4      | `u16`        | version, 1                                   |
//! | 6      | `u16`        | kernel id (see [`Kernel`])                   |
//! | 8      | `u32`        | number of arguments                          |
//! | 12     | `u32`        | reserved, 0                                  |
//! | 16     | `[u64; 3]`   | dims                                         |
//! | 40     | `f32`        | alpha                                        |
//! | 44     | `u32`        | reserved, 0                                  |
//! | 48     | 4 × 16 bytes | arguments: `region_id: u32`, reserved `u32` 0, `offset: u64` |
//! | 112    | 16 bytes     | reserved, 0                                  |
//!
//! # Kernels
//!
//! All operands are packed little-endian `f32` arrays; each lies inside one
//! chunk of an allocation (an operand never spans chunks).
//!
//! | id | kernel | dims        | alpha | arguments     | result                        |
//! |---:|--------|-------------|-------|---------------|-------------------------------|
//! | 1  | copy   | `[n, 0, 0]` | —     | `a, out`      | `out[i] = a[i]`               |
//! | 2  | fill   | `[n, 0, 0]` | value | `out`         | `out[i] = alpha`              |
//! | 3  | add    | `[n, 0, 0]` | —     | `a, b, out`   | `out[i] = a[i] + b[i]`        |
//! | 4  | mul    | `[n, 0, 0]` | —     | `a, b, out`   | `out[i] = a[i] * b[i]`        |
//! | 5  | axpy   | `[n, 0, 0]` | alpha | `x, y, out`   | `out[i] = alpha * x[i] + y[i]`|
//! | 6  | matmul | `[m, k, n]` | —     | `a, b, c`     | row-major `C[m×n] = A[m×k]·B[k×n]` |
//!
//! Used dims must be at least 1; unused dims, unused argument slots and
//! reserved bytes must be 0. Kernels that take no alpha ignore it.
use crate::address::LogicalAddress;

/// Size of a kernel descriptor in bytes.
pub const DESCRIPTOR_SIZE: usize = 128;
/// The first four bytes of every descriptor.
pub const KERNEL_MAGIC: [u8; 4] = *b"SPYK";
/// The descriptor version the format defines.
pub const KERNEL_DESCRIPTOR_VERSION: u16 = 1;
/// Argument slots in a descriptor.
pub const MAX_KERNEL_ARGS: usize = 4;

const ARGS_OFFSET: usize = 48;
const ARG_SIZE: usize = 16;
/// Reserved byte ranges `[start, end)`: after `num_args`, after `alpha`,
/// the second word of each argument slot, and the tail.
const RESERVED_RANGES: [(usize, usize); 7] = [
    (12, 16),
    (44, 48),
    (52, 56),
    (68, 72),
    (84, 88),
    (100, 104),
    (112, 128),
];
const ZERO_ADDRESS: LogicalAddress = LogicalAddress {
    region_id: 0,
    offset: 0,
};

/// A built-in kernel. See the [module docs](self) for what each computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `out[i] = a[i]`.
    Copy,
    /// `out[i] = alpha`.
    Fill,
    /// `out[i] = a[i] + b[i]`.
    Add,
    /// `out[i] = a[i] * b[i]`.
    Mul,
    /// `out[i] = alpha * x[i] + y[i]`.
    Axpy,
    /// Row-major `C = A · B`.
    Matmul,
}

impl Kernel {
    /// Every kernel, in id order.
    pub const ALL: [Kernel; 6] = [
        Self::Copy,
        Self::Fill,
        Self::Add,
        Self::Mul,
        Self::Axpy,
        Self::Matmul,
    ];

    /// The id stored in a descriptor (1..=6).
    pub fn id(self) -> u16 {
        match self {
            Self::Copy => 1,
            Self::Fill => 2,
            Self::Add => 3,
            Self::Mul => 4,
            Self::Axpy => 5,
            Self::Matmul => 6,
        }
    }

    /// The kernel with descriptor id `id`, if any.
    pub fn from_id(id: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.id() == id)
    }

    /// Lower-case name, as in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Copy => "copy",
            Self::Fill => "fill",
            Self::Add => "add",
            Self::Mul => "mul",
            Self::Axpy => "axpy",
            Self::Matmul => "matmul",
        }
    }

    /// Names of the arguments, in slot order; the last one is the output.
    pub fn arg_names(self) -> &'static [&'static str] {
        match self {
            Self::Copy => &["a", "out"],
            Self::Fill => &["out"],
            Self::Add | Self::Mul => &["a", "b", "out"],
            Self::Axpy => &["x", "y", "out"],
            Self::Matmul => &["a", "b", "c"],
        }
    }

    /// Number of arguments the kernel takes.
    pub fn num_args(self) -> u32 {
        self.arg_names().len() as u32
    }

    /// Names of the dims the kernel uses, in order; the others must be 0.
    pub fn dim_names(self) -> &'static [&'static str] {
        match self {
            Self::Matmul => &["m", "k", "n"],
            _ => &["n"],
        }
    }
}

/// Why a descriptor cannot run. The device reports it as the message of an
/// [`crate::Status::EXECUTION_FAILED`] error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorError {
    /// The input is not 128 bytes long.
    #[error("a kernel descriptor is {DESCRIPTOR_SIZE} bytes, got {0}")]
    Length(usize),
    /// The magic is not `"SPYK"`.
    #[error(
        "bad magic {found:#010x}; expected {:#010x} (\"SPYK\")",
        u32::from_le_bytes(KERNEL_MAGIC)
    )]
    Magic {
        /// The first four bytes, read as a little-endian `u32`.
        found: u32,
    },
    /// A version other than the one the format defines.
    #[error(
        "unsupported descriptor version {found}; the format is version {KERNEL_DESCRIPTOR_VERSION}"
    )]
    Version {
        /// The version in the descriptor.
        found: u16,
    },
    /// A kernel id no [`Kernel`] has.
    #[error(
        "unknown kernel id {found}; known ids are 1 (copy), 2 (fill), 3 (add), 4 (mul), 5 (axpy), 6 (matmul)"
    )]
    UnknownKernel {
        /// The id in the descriptor.
        found: u16,
    },
    /// `num_args` disagrees with the kernel.
    #[error("kernel {kernel} takes {expected} argument(s), but num_args is {found}")]
    NumArgs {
        /// The kernel.
        kernel: &'static str,
        /// Arguments it takes.
        expected: u32,
        /// `num_args` in the descriptor.
        found: u32,
    },
    /// A reserved byte is not zero.
    #[error(
        "reserved byte {offset} of the descriptor is {value:#04x}; reserved bytes must be zero"
    )]
    Reserved {
        /// Byte offset in the descriptor.
        offset: usize,
        /// Its value.
        value: u8,
    },
    /// A used dim is zero.
    #[error("kernel {kernel} needs dims[{index}] ({name}) of at least 1, got 0")]
    ZeroDim {
        /// The kernel.
        kernel: &'static str,
        /// Index of the dim.
        index: usize,
        /// Its name.
        name: &'static str,
    },
    /// An unused dim is not zero.
    #[error(
        "kernel {kernel} uses {used} dim(s), but unused dims[{index}] is {value}; unused dims must be 0"
    )]
    UnusedDim {
        /// The kernel.
        kernel: &'static str,
        /// Dims it uses.
        used: usize,
        /// Index of the dim.
        index: usize,
        /// Its value.
        value: u64,
    },
    /// An unused argument slot is not zero.
    #[error(
        "kernel {kernel} takes {used} argument(s), but unused argument slot {index} holds region {}, offset {} instead of zero",
        found.region_id,
        found.offset
    )]
    UnusedArg {
        /// The kernel.
        kernel: &'static str,
        /// Arguments it takes.
        used: u32,
        /// Index of the slot.
        index: usize,
        /// What the slot holds.
        found: LogicalAddress,
    },
    /// An operand's size in bytes overflows.
    #[error("kernel {kernel}: the size of argument {arg} overflows (dims {dims:?})")]
    Overflow {
        /// The kernel.
        kernel: &'static str,
        /// Name of the argument.
        arg: &'static str,
        /// The dims in the descriptor.
        dims: [u64; 3],
    },
}

/// A decoded kernel descriptor. The fields are public so that tests can
/// build descriptors the device must refuse; [`KernelDescriptor::parse`]
/// accepts only consistent ones. The constructors set the kernel's
/// argument count and slots consistently, and take the dims as given: a
/// dim of 0, or dims whose operand sizes overflow, make a descriptor that
/// [`KernelDescriptor::parse`] (and so the device, when the program runs)
/// refuses; check with `parse(&descriptor.to_bytes())` where the dims come
/// from input.
///
/// ```
/// # use flex_rt::LogicalAddress;
/// # use flex_rt::program::KernelDescriptor;
/// let at = |offset| LogicalAddress { region_id: 0, offset };
/// let desc = KernelDescriptor::axpy(1024, 2.0, at(0), at(4096), at(8192));
/// assert_eq!(KernelDescriptor::parse(&desc.to_bytes()), Ok(desc));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelDescriptor {
    /// The kernel to run.
    pub kernel: Kernel,
    /// Sizes in elements (not bytes), as the kernel names them
    /// ([`Kernel::dim_names`]): `[n, 0, 0]` for the element-wise kernels,
    /// `[m, k, n]` for matmul; unused dims are 0.
    pub dims: [u64; 3],
    /// Scalar of `fill` and `axpy`; ignored by the others.
    pub alpha: f32,
    /// Number of arguments; must equal [`Kernel::num_args`] to run.
    pub num_args: u32,
    /// Argument addresses in slot order; unused slots are zero.
    pub args: [LogicalAddress; MAX_KERNEL_ARGS],
}

/// One operand of a checked descriptor: its argument name, where it
/// starts, and its size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    /// The argument's name, as in the kernel table (`a`, `b`, `out`, ...).
    pub name: &'static str,
    /// Where the operand starts.
    pub at: LogicalAddress,
    /// Its size in bytes (elements × 4).
    pub bytes: u64,
}

impl KernelDescriptor {
    fn new(kernel: Kernel, dims: [u64; 3], alpha: f32, used: &[LogicalAddress]) -> Self {
        let mut args = [ZERO_ADDRESS; MAX_KERNEL_ARGS];
        for (slot, &arg) in args.iter_mut().zip(used) {
            *slot = arg;
        }
        Self {
            kernel,
            dims,
            alpha,
            num_args: kernel.num_args(),
            args,
        }
    }

    /// `out[i] = a[i]` for `n` elements.
    pub fn copy(n: u64, a: LogicalAddress, out: LogicalAddress) -> Self {
        Self::new(Kernel::Copy, [n, 0, 0], 0.0, &[a, out])
    }

    /// `out[i] = value` for `n` elements.
    pub fn fill(n: u64, value: f32, out: LogicalAddress) -> Self {
        Self::new(Kernel::Fill, [n, 0, 0], value, &[out])
    }

    /// `out[i] = a[i] + b[i]` for `n` elements.
    pub fn add(n: u64, a: LogicalAddress, b: LogicalAddress, out: LogicalAddress) -> Self {
        Self::new(Kernel::Add, [n, 0, 0], 0.0, &[a, b, out])
    }

    /// `out[i] = a[i] * b[i]` for `n` elements.
    pub fn mul(n: u64, a: LogicalAddress, b: LogicalAddress, out: LogicalAddress) -> Self {
        Self::new(Kernel::Mul, [n, 0, 0], 0.0, &[a, b, out])
    }

    /// `out[i] = alpha * x[i] + y[i]` for `n` elements.
    pub fn axpy(
        n: u64,
        alpha: f32,
        x: LogicalAddress,
        y: LogicalAddress,
        out: LogicalAddress,
    ) -> Self {
        Self::new(Kernel::Axpy, [n, 0, 0], alpha, &[x, y, out])
    }

    /// Row-major `C[m×n] = A[m×k] · B[k×n]`.
    pub fn matmul(
        m: u64,
        k: u64,
        n: u64,
        a: LogicalAddress,
        b: LogicalAddress,
        c: LogicalAddress,
    ) -> Self {
        Self::new(Kernel::Matmul, [m, k, n], 0.0, &[a, b, c])
    }

    /// The 128-byte encoding (see the [module docs](self)). Writes the
    /// fields as they are, consistent or not; reserved bytes are zero.
    pub fn to_bytes(&self) -> [u8; DESCRIPTOR_SIZE] {
        let mut out = [0u8; DESCRIPTOR_SIZE];
        out[0..4].copy_from_slice(&KERNEL_MAGIC);
        out[4..6].copy_from_slice(&KERNEL_DESCRIPTOR_VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&self.kernel.id().to_le_bytes());
        out[8..12].copy_from_slice(&self.num_args.to_le_bytes());
        for (i, dim) in self.dims.iter().enumerate() {
            out[16 + 8 * i..24 + 8 * i].copy_from_slice(&dim.to_le_bytes());
        }
        out[40..44].copy_from_slice(&self.alpha.to_le_bytes());
        for (i, arg) in self.args.iter().enumerate() {
            let at = ARGS_OFFSET + ARG_SIZE * i;
            out[at..at + 4].copy_from_slice(&arg.region_id.to_le_bytes());
            out[at + 8..at + 16].copy_from_slice(&arg.offset.to_le_bytes());
        }
        out
    }

    /// Decodes and checks a descriptor: length, magic, version, kernel id,
    /// argument count, reserved bytes, dims, unused slots, and that every
    /// operand's size in bytes fits `u64`.
    ///
    /// # Errors
    /// The first [`DescriptorError`] found, in that order.
    pub fn parse(bytes: &[u8]) -> Result<Self, DescriptorError> {
        let bytes: &[u8; DESCRIPTOR_SIZE] = bytes
            .try_into()
            .map_err(|_| DescriptorError::Length(bytes.len()))?;
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| (u64::from(u32_at(at + 4)) << 32) | u64::from(u32_at(at));

        let magic = u32_at(0);
        if magic != u32::from_le_bytes(KERNEL_MAGIC) {
            return Err(DescriptorError::Magic { found: magic });
        }
        let version = u16_at(4);
        if version != KERNEL_DESCRIPTOR_VERSION {
            return Err(DescriptorError::Version { found: version });
        }
        let id = u16_at(6);
        let kernel = Kernel::from_id(id).ok_or(DescriptorError::UnknownKernel { found: id })?;
        let num_args = u32_at(8);
        if num_args != kernel.num_args() {
            return Err(DescriptorError::NumArgs {
                kernel: kernel.name(),
                expected: kernel.num_args(),
                found: num_args,
            });
        }
        let reserved = RESERVED_RANGES.iter().map(|&(start, end)| start..end);
        for range in reserved {
            if let Some(offset) = range.clone().find(|&at| bytes[at] != 0) {
                return Err(DescriptorError::Reserved {
                    offset,
                    value: bytes[offset],
                });
            }
        }
        let dims = [u64_at(16), u64_at(24), u64_at(32)];
        let used_dims = kernel.dim_names().len();
        for (index, &value) in dims.iter().enumerate() {
            if index < used_dims && value == 0 {
                return Err(DescriptorError::ZeroDim {
                    kernel: kernel.name(),
                    index,
                    name: kernel.dim_names()[index],
                });
            }
            if index >= used_dims && value != 0 {
                return Err(DescriptorError::UnusedDim {
                    kernel: kernel.name(),
                    used: used_dims,
                    index,
                    value,
                });
            }
        }
        let alpha = f32::from_le_bytes([bytes[40], bytes[41], bytes[42], bytes[43]]);
        let mut args = [ZERO_ADDRESS; MAX_KERNEL_ARGS];
        for (index, slot) in args.iter_mut().enumerate() {
            let at = ARGS_OFFSET + ARG_SIZE * index;
            *slot = LogicalAddress {
                region_id: u32_at(at),
                offset: u64_at(at + 8),
            };
            if index >= num_args as usize && *slot != ZERO_ADDRESS {
                return Err(DescriptorError::UnusedArg {
                    kernel: kernel.name(),
                    used: num_args,
                    index,
                    found: *slot,
                });
            }
        }
        let descriptor = Self {
            kernel,
            dims,
            alpha,
            num_args,
            args,
        };
        descriptor.operands()?;
        Ok(descriptor)
    }

    /// The operands in argument order (the last is the output), with their
    /// sizes in bytes.
    ///
    /// # Errors
    /// [`DescriptorError::Overflow`] when a size does not fit this host.
    pub fn operands(&self) -> Result<Vec<Operand>, DescriptorError> {
        let [d0, d1, d2] = self.dims;
        let elements: Vec<Option<u64>> = match self.kernel {
            Kernel::Copy | Kernel::Fill | Kernel::Add | Kernel::Mul | Kernel::Axpy => {
                vec![Some(d0); self.kernel.arg_names().len()]
            }
            Kernel::Matmul => vec![d0.checked_mul(d1), d1.checked_mul(d2), d0.checked_mul(d2)],
        };
        self.kernel
            .arg_names()
            .iter()
            .zip(elements)
            .zip(self.args)
            .map(|((&name, elements), at)| {
                elements
                    .and_then(|e| e.checked_mul(4))
                    .filter(|&bytes| usize::try_from(bytes).is_ok())
                    .map(|bytes| Operand { name, at, bytes })
                    .ok_or(DescriptorError::Overflow {
                        kernel: self.kernel.name(),
                        arg: name,
                        dims: self.dims,
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> LogicalAddress {
        LogicalAddress {
            region_id: 2,
            offset,
        }
    }

    #[test]
    fn every_builder_round_trips() {
        let descriptors = [
            KernelDescriptor::copy(3, at(0), at(128)),
            KernelDescriptor::fill(3, -1.25, at(128)),
            KernelDescriptor::add(3, at(0), at(128), at(256)),
            KernelDescriptor::mul(3, at(0), at(128), at(256)),
            KernelDescriptor::axpy(3, 0.5, at(0), at(128), at(256)),
            KernelDescriptor::matmul(2, 3, 4, at(0), at(128), at(256)),
        ];
        for desc in descriptors {
            assert_eq!(desc.num_args, desc.kernel.num_args());
            assert_eq!(KernelDescriptor::parse(&desc.to_bytes()), Ok(desc));
        }
        for kernel in Kernel::ALL {
            assert_eq!(Kernel::from_id(kernel.id()), Some(kernel));
        }
        assert_eq!(Kernel::from_id(0), None);
    }

    #[test]
    fn layout_is_as_documented() {
        let desc = KernelDescriptor::axpy(5, 2.0, at(256), at(384), at(512));
        let b = desc.to_bytes();
        assert_eq!(&b[0..4], b"SPYK");
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 0x4B59_5053);
        assert_eq!(&b[4..6], &[1, 0]);
        assert_eq!(&b[6..8], &[5, 0]);
        assert_eq!(&b[8..12], &[3, 0, 0, 0]);
        assert_eq!(&b[16..24], &5u64.to_le_bytes());
        assert_eq!(&b[24..40], &[0; 16]);
        assert_eq!(&b[40..44], &2.0f32.to_le_bytes());
        assert_eq!(&b[48..52], &2u32.to_le_bytes());
        assert_eq!(&b[56..64], &256u64.to_le_bytes());
        assert_eq!(&b[72..80], &384u64.to_le_bytes());
        assert_eq!(&b[88..96], &512u64.to_le_bytes());
        assert_eq!(&b[96..128], &[0; 32]);
    }

    #[test]
    fn bad_descriptors_are_named() {
        let good = KernelDescriptor::add(4, at(0), at(128), at(256));
        let patched = |f: &dyn Fn(&mut [u8; DESCRIPTOR_SIZE])| {
            let mut bytes = good.to_bytes();
            f(&mut bytes);
            KernelDescriptor::parse(&bytes).unwrap_err().to_string()
        };
        assert!(patched(&|b| b[0] = b'X').contains("bad magic"));
        assert!(patched(&|b| b[4] = 2).contains("unsupported descriptor version 2"));
        assert!(patched(&|b| b[6] = 99).contains("unknown kernel id 99"));
        assert!(
            patched(&|b| b[8] = 2).contains("kernel add takes 3 argument(s), but num_args is 2")
        );
        assert!(patched(&|b| b[12] = 1).contains("reserved byte 12"));
        assert!(patched(&|b| b[53] = 1).contains("reserved byte 53"));
        assert!(patched(&|b| b[127] = 1).contains("reserved byte 127"));
        assert!(patched(&|b| b[16] = 0).contains("dims[0] (n) of at least 1"));
        assert!(patched(&|b| b[24] = 1).contains("unused dims[1] is 1"));
        assert!(patched(&|b| b[96] = 1).contains("unused argument slot 3"));
        let err = KernelDescriptor::parse(&good.to_bytes()[..100]).unwrap_err();
        assert_eq!(err, DescriptorError::Length(100));

        let huge = KernelDescriptor::copy(u64::MAX / 2, at(0), at(128));
        assert!(
            KernelDescriptor::parse(&huge.to_bytes())
                .unwrap_err()
                .to_string()
                .contains("argument a overflows")
        );
        let huge = KernelDescriptor::matmul(1 << 40, 1 << 40, 1, at(0), at(128), at(256));
        assert!(matches!(
            KernelDescriptor::parse(&huge.to_bytes()),
            Err(DescriptorError::Overflow { arg: "a", .. })
        ));
    }
}

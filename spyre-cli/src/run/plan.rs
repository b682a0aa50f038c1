//! The shape of one iteration of `spyre run`: the kernel's size, its
//! operands, its device blocks and its 128-byte program.

use spyre_stream::program::{DESCRIPTOR_SIZE, KernelDescriptor};
use spyre_stream::{CompositeAddress, MIN_BLOCK};

use crate::cli::KernelArg;
use crate::error::CliError;
use crate::size::format_size;

/// Launches per iteration: three H2D copies, one compute, one D2H copy.
pub(crate) const LAUNCHES_PER_ITERATION: u64 = 5;
/// H2D copies per iteration.
pub(crate) const H2D_PER_ITERATION: u64 = 3;

/// Size of the kernel descriptor in bytes, as a `u64`.
pub(super) const DESCRIPTOR_BYTES: u64 = DESCRIPTOR_SIZE as u64;
/// Device allocations per iteration, each of [`Plan::block_bytes`].
pub(super) const BLOCKS_PER_ITERATION: u64 = 3;

/// The shape of one iteration, derived from `--kernel` and `--size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The kernel.
    pub(crate) kernel: KernelArg,
    /// axpy: elements per vector; matmul: the side of each square matrix.
    pub(crate) n: u64,
    /// `f32` elements in each operand.
    pub(crate) elements: usize,
    /// Bytes of each operand (two inputs and the output are the same size).
    pub(crate) operand_bytes: u64,
    /// [`Plan::operand_bytes`] as a host length.
    pub(crate) operand_len: usize,
}

impl Plan {
    /// The plan for `kernel` with `size` bytes of operands per iteration:
    /// axpy gets three vectors of `size / 12` elements, matmul three n×n
    /// matrices with `n = floor(sqrt(size / 12))`.
    ///
    /// # Errors
    /// [`CliError::Usage`] naming the size when it is below 12 bytes (one
    /// `f32` per operand) or too large for this host.
    pub(crate) fn new(kernel: KernelArg, size: u64) -> Result<Self, CliError> {
        let per_operand = size / 12;
        if per_operand == 0 {
            return Err(CliError::Usage(format!(
                "--size {size} is too small for {}: expected at least 12 bytes (one f32 in each of the two inputs and the output)",
                kernel.name()
            )));
        }
        let n = match kernel {
            KernelArg::Axpy => per_operand,
            KernelArg::Matmul => per_operand.isqrt(),
        };
        let elements_u64 = match kernel {
            KernelArg::Axpy => n,
            KernelArg::Matmul => n * n,
        };
        let too_large = || {
            CliError::Usage(format!(
                "--size {size} ({}) is too large for this host",
                format_size(size)
            ))
        };
        let elements = usize::try_from(elements_u64).map_err(|_| too_large())?;
        let operand_bytes = elements_u64.checked_mul(4).ok_or_else(too_large)?;
        let operand_len = usize::try_from(operand_bytes).map_err(|_| too_large())?;
        Ok(Self {
            kernel,
            n,
            elements,
            operand_bytes,
            operand_len,
        })
    }

    /// The kernel's dims as the descriptor takes them: `[n]` or `[m, k, n]`.
    pub(crate) fn dims(&self) -> Vec<u64> {
        match self.kernel {
            KernelArg::Axpy => vec![self.n],
            KernelArg::Matmul => vec![self.n; 3],
        }
    }

    /// Bytes copied host to device per iteration: two inputs and the descriptor.
    pub(crate) fn h2d_bytes(&self) -> u64 {
        2 * self.operand_bytes + DESCRIPTOR_BYTES
    }

    /// Bytes copied device to host per iteration: the output.
    pub(crate) fn d2h_bytes(&self) -> u64 {
        self.operand_bytes
    }

    /// Bytes of the allocator's block for one operand: the operand rounded
    /// up to [`MIN_BLOCK`] (the caching allocator's granularity). An
    /// iteration holds three such blocks (the two inputs and the output)
    /// and one block for its program.
    pub(crate) fn block_bytes(&self) -> u64 {
        self.operand_bytes
            .checked_next_multiple_of(MIN_BLOCK)
            .unwrap_or(u64::MAX)
    }

    /// The 128-byte program for operands at `a`, `b` and `out`.
    pub(super) fn descriptor(
        &self,
        alpha: f32,
        a: &CompositeAddress,
        b: &CompositeAddress,
        out: &CompositeAddress,
    ) -> [u8; DESCRIPTOR_SIZE] {
        match self.kernel {
            KernelArg::Axpy => {
                KernelDescriptor::axpy(self.n, alpha, a.start(), b.start(), out.start())
            }
            KernelArg::Matmul => {
                KernelDescriptor::matmul(self.n, self.n, self.n, a.start(), b.start(), out.start())
            }
        }
        .to_bytes()
    }
}

#[cfg(test)]
mod tests {
    use spyre_stream::LogicalAddress;

    use super::*;

    #[test]
    fn axpy_plan() {
        let plan = Plan::new(KernelArg::Axpy, 1 << 20).unwrap();
        assert_eq!(plan.n, 87_381);
        assert_eq!(plan.elements, 87_381);
        assert_eq!(plan.operand_bytes, 349_524);
        assert_eq!(plan.dims(), vec![87_381]);
        assert_eq!(plan.h2d_bytes(), 2 * 349_524 + 128);
        assert_eq!(plan.d2h_bytes(), 349_524);
        // 349_524 rounded up to 512 is 349_696.
        assert_eq!(plan.block_bytes(), 349_696);
        let tiny = Plan::new(KernelArg::Axpy, 12).unwrap();
        assert_eq!((tiny.n, tiny.operand_bytes), (1, 4));
    }

    #[test]
    fn matmul_plan() {
        let plan = Plan::new(KernelArg::Matmul, 4096).unwrap();
        assert_eq!(plan.n, 18); // 4096 / 12 = 341; floor(sqrt(341)) = 18
        assert_eq!(plan.elements, 324);
        assert_eq!(plan.operand_bytes, 1296);
        assert_eq!(plan.dims(), vec![18, 18, 18]);
        let plan = Plan::new(KernelArg::Matmul, 1 << 20).unwrap();
        assert_eq!(plan.n, 295);
    }

    #[test]
    fn too_small_sizes_name_the_value() {
        for kernel in [KernelArg::Axpy, KernelArg::Matmul] {
            let err = Plan::new(kernel, 11).unwrap_err();
            assert_eq!(err.exit_code(), crate::error::EXIT_USAGE);
            let message = err.to_string();
            assert!(message.contains("--size 11 is too small"), "{message}");
            assert!(message.contains("at least 12 bytes"), "{message}");
        }
    }

    #[test]
    fn descriptors_match_the_device_format() {
        let plan = Plan::new(KernelArg::Matmul, 4096).unwrap();
        let at = |offset| {
            CompositeAddress::single(
                LogicalAddress {
                    region_id: 1,
                    offset,
                },
                1296,
            )
            .unwrap()
        };
        let bytes = plan.descriptor(0.0, &at(0), &at(1408), &at(2816));
        let parsed = KernelDescriptor::parse(&bytes).unwrap();
        assert_eq!(parsed.dims, [18, 18, 18]);
    }
}

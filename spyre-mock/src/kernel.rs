//! Runs the compute programs of the device contract
//! ([`flex_rt::program`]) on the software device.
//!
//! The device reads the first 128 bytes of the program address, checks
//! them, checks that every operand lies inside one chunk of a live
//! allocation, reads all inputs into host memory (so operands may alias),
//! computes with the functions of [`crate::reference`] and writes the
//! output. Any problem fails the operation with
//! [`flex_rt::Status::EXECUTION_FAILED`] and a message that names it;
//! nothing is written then. An output in a region that cannot be backed
//! with host memory when first written fails it with
//! [`flex_rt::Status::OUT_OF_MEMORY`], as a copy or fill there does.

use flex_rt::program::{DESCRIPTOR_SIZE, Kernel, KernelDescriptor};
use flex_rt::{CompositeAddress, LogicalAddress};

use crate::memory::MemoryView;
use crate::reference;

/// An empty vector with room for `len` items, or the failure to name when
/// the host refuses that much memory (the kernel's working copies of its
/// operands, and its result, are caller-sized: a refusal fails the
/// operation instead of aborting the process).
fn host_vec<T>(len: usize, what: &str) -> Result<Vec<T>, KernelFailure> {
    let mut vec = Vec::new();
    vec.try_reserve_exact(len).map_err(|_| {
        KernelFailure::Backing(format!(
            "the software device cannot hold {what} ({len} items of {} bytes) in host memory to run the kernel: the allocation was refused",
            size_of::<T>()
        ))
    })?;
    Ok(vec)
}

fn to_f32s(bytes: &[u8]) -> Result<Vec<f32>, KernelFailure> {
    let mut values = host_vec(bytes.len() / 4, "an operand as f32")?;
    values.extend(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    Ok(values)
}

fn to_bytes(values: &[f32]) -> Result<Vec<u8>, KernelFailure> {
    let mut bytes = host_vec(values.len() * 4, "the result's bytes")?;
    bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    Ok(bytes)
}

/// The descriptor of the program at `program`.
fn descriptor(
    view: &MemoryView<'_>,
    program: &CompositeAddress,
) -> Result<KernelDescriptor, String> {
    if program.total_size() < DESCRIPTOR_SIZE as u64 {
        return Err(format!(
            "program at {program} has {} bytes; a kernel descriptor needs {DESCRIPTOR_SIZE}",
            program.total_size()
        ));
    }
    let mut bytes = [0u8; DESCRIPTOR_SIZE];
    view.read(&view.spans(program)?, &mut bytes);
    KernelDescriptor::parse(&bytes).map_err(|e| format!("bad kernel descriptor at {program}: {e}"))
}

/// Where the operands of the program at `program` are, and their sizes in
/// bytes, as the program reads now.
pub(crate) fn operands(
    view: &MemoryView<'_>,
    program: &CompositeAddress,
) -> Result<Vec<(LogicalAddress, u64)>, String> {
    let descriptor = descriptor(view, program)?;
    let operands = descriptor
        .operands()
        .map_err(|e| format!("bad kernel descriptor at {program}: {e}"))?;
    Ok(operands.iter().map(|o| (o.at, o.bytes)).collect())
}

/// Why a program failed ([`execute`]).
#[derive(Debug)]
pub(crate) enum KernelFailure {
    /// A bad program or operand (`EXECUTION_FAILED`).
    Invalid(String),
    /// Host memory for the output, or for the kernel's working copies of
    /// its operands, could not be had (`OUT_OF_MEMORY`).
    Backing(String),
}

impl From<String> for KernelFailure {
    fn from(message: String) -> Self {
        Self::Invalid(message)
    }
}

/// Runs the program at `program`; see the [module docs](self).
pub(crate) fn execute(
    view: &MemoryView<'_>,
    program: &CompositeAddress,
) -> Result<(), KernelFailure> {
    let descriptor = descriptor(view, program)?;
    let kernel = descriptor.kernel;
    let operands = descriptor
        .operands()
        .map_err(|e| format!("bad kernel descriptor at {program}: {e}"))?;
    let spans = operands
        .iter()
        .enumerate()
        .map(|(index, operand)| {
            view.span(
                operand.at,
                operand.bytes,
                &format_args!(
                    "argument {index} ({}) of kernel {}",
                    operand.name,
                    kernel.name()
                ),
            )
        })
        .collect::<Result<Vec<_>, String>>()?;
    let Some((output, inputs)) = spans.split_last() else {
        return Err(format!("kernel {} has no output argument", kernel.name()).into());
    };
    let inputs: Vec<Vec<f32>> = inputs
        .iter()
        .map(|span| {
            let mut raw = bytemuck::allocation::try_zeroed_vec(span.len()).map_err(|()| {
                KernelFailure::Backing(format!(
                    "the software device cannot hold an operand of {} bytes in host memory to run the kernel: the allocation was refused",
                    span.len()
                ))
            })?;
            view.read(std::slice::from_ref(span), &mut raw);
            to_f32s(&raw)
        })
        .collect::<Result<_, _>>()?;
    let n = output.len() / 4;
    let alpha = descriptor.alpha;
    let dim = |d: u64| usize::try_from(d).unwrap_or(usize::MAX);
    let [m, k, cols] = descriptor.dims.map(dim);
    // The result's room is reserved first (fallibly), as the working
    // copies' is; a matmul whose operands do not match its dims reserves
    // none and fails below as such.
    let result_len = match (kernel, inputs.as_slice()) {
        (Kernel::Fill, []) => n,
        (Kernel::Matmul, [a, b])
            if m.checked_mul(k) == Some(a.len()) && k.checked_mul(cols) == Some(b.len()) =>
        {
            m.saturating_mul(cols)
        }
        (Kernel::Matmul, _) => 0,
        (_, [a]) => a.len(),
        (_, [a, b]) => a.len().min(b.len()),
        _ => 0,
    };
    let mut result = host_vec(result_len, "the result")?;
    match (kernel, inputs.as_slice()) {
        (Kernel::Copy, [a]) => reference::copy_into(a, &mut result),
        (Kernel::Fill, []) => reference::fill_into(n, alpha, &mut result),
        (Kernel::Add, [a, b]) => reference::add_into(a, b, &mut result),
        (Kernel::Mul, [a, b]) => reference::mul_into(a, b, &mut result),
        (Kernel::Axpy, [x, y]) => reference::axpy_into(alpha, x, y, &mut result),
        (Kernel::Matmul, [a, b]) => reference::matmul_into(m, k, cols, a, b, &mut result)
            .ok_or_else(|| format!("matmul operands do not match dims {:?}", descriptor.dims))?,
        _ => return Err(format!("kernel {} got the wrong operands", kernel.name()).into()),
    }
    view.write(std::slice::from_ref(output), &to_bytes(&result)?)
        .map_err(KernelFailure::Backing)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A working copy the host cannot hold (here more than the address
    /// space) fails the kernel with `OUT_OF_MEMORY`, naming its size,
    /// instead of aborting the process.
    #[test]
    fn a_working_copy_the_host_refuses_is_a_failure() {
        let Err(KernelFailure::Backing(message)) = host_vec::<f32>(1 << 61, "an operand as f32")
        else {
            panic!("a reservation of 2^63 bytes succeeded");
        };
        assert_eq!(
            message,
            "the software device cannot hold an operand as f32 (2305843009213693952 items of 4 bytes) in host memory to run the kernel: the allocation was refused"
        );
    }
}

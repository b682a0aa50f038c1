//! Raw arguments of the exported calls, checked before use: out-parameters
//! and composite addresses.

use std::ptr::NonNull;

use flex_rt::{AddressChunk, CompositeAddress, MAX_ADDRESS_CHUNKS};
use flex_sys::bindings::flex_composite_address_t;

use crate::boundary::Failure;

/// A checked out-parameter: non-null and aligned for `T`.
pub(crate) fn out_param<T>(ptr: *mut T, name: &str) -> Result<NonNull<T>, Failure> {
    let ptr =
        NonNull::new(ptr).ok_or_else(|| Failure::invalid_argument(format!("{name} is NULL")))?;
    if !ptr.as_ptr().is_aligned() {
        return Err(Failure::invalid_argument(format!(
            "{name} ({ptr:p}) is not aligned for its type"
        )));
    }
    Ok(ptr)
}

/// Reads a `flex_composite_address_t` argument into a checked address.
///
/// # Safety
/// `ptr` is NULL or points to a `flex_composite_address_t` that is valid for
/// reads during this call, and whose `chunks` is NULL or points to
/// `num_chunks` valid chunks (flex.h: "The array is read during the call
/// that receives it").
pub(crate) unsafe fn read_address(
    ptr: *const flex_composite_address_t,
    name: &str,
) -> Result<CompositeAddress, Failure> {
    if ptr.is_null() {
        return Err(Failure::invalid_argument(format!("{name} is NULL")));
    }
    if !ptr.is_aligned() {
        return Err(Failure::invalid_argument(format!(
            "{name} ({ptr:p}) is not aligned for flex_composite_address_t"
        )));
    }
    // SAFETY: non-null and aligned (checked above), and valid for reads by
    // this function's contract.
    let raw = unsafe { ptr.read() };
    if raw.num_chunks == 0 || raw.num_chunks > MAX_ADDRESS_CHUNKS {
        return Err(Failure::invalid_argument(format!(
            "{name} has {} chunks; a composite address has 1..={MAX_ADDRESS_CHUNKS}",
            raw.num_chunks
        )));
    }
    if raw.chunks.is_null() || !raw.chunks.is_aligned() {
        return Err(Failure::invalid_argument(format!(
            "{name}.chunks ({:p}) is NULL or misaligned",
            raw.chunks
        )));
    }
    // SAFETY: `chunks` is non-null and aligned (checked above) and points to
    // `num_chunks` chunks by this function's contract; `num_chunks` is at
    // most 64, so the slice is small. The slice is dropped before returning.
    let chunks = unsafe { std::slice::from_raw_parts(raw.chunks, raw.num_chunks) };
    let chunks: Vec<AddressChunk> = chunks.iter().copied().map(AddressChunk::from_raw).collect();
    CompositeAddress::new(chunks)
        .map_err(|err| Failure::invalid_argument(format!("{name}: {}", err.message())))
}

/// The size of a device address as a host length.
pub(crate) fn host_len(address: &CompositeAddress, name: &str) -> Result<usize, Failure> {
    usize::try_from(address.total_size())
        .ok()
        .filter(|&len| isize::try_from(len).is_ok())
        .ok_or_else(|| {
            Failure::invalid_argument(format!(
                "{name} has {} bytes, more than host memory can hold",
                address.total_size()
            ))
        })
}

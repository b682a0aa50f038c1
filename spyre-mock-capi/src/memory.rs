//! Device memory: allocate and free composite addresses, and how much is
//! free.

use flex_rt::Runtime;
use flex_sys::bindings::{
    FLEX_SUCCESS, flex_address_chunk_t, flex_composite_address_t, flex_runtime_t, flex_status_t,
};
use spyre_mock::BoundedAllocation;

use crate::args::{out_param, read_address};
use crate::boundary::{Failure, boundary};
use crate::handles::{self};

/// `flex_memory_allocate`: `size` bytes in 128-byte aligned chunks (see the
/// device's placement rule in [`Runtime::allocate`]). When `capacity` is too
/// small, writes the number of chunks needed to `*num_chunks_out`, allocates
/// nothing and returns `FLEX_ERROR_INVALID_ARGUMENT`.
///
/// # Safety
/// `chunks_out` is NULL or valid for writing `capacity` chunks;
/// `num_chunks_out` is NULL or valid for writing a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_memory_allocate(
    runtime: *mut flex_runtime_t,
    size: u64,
    chunks_out: *mut flex_address_chunk_t,
    capacity: usize,
    num_chunks_out: *mut usize,
) -> flex_status_t {
    const CALL: &str = "flex_memory_allocate";
    boundary(CALL, || {
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        if size == 0 {
            return Err(Failure::invalid_argument(
                "size is 0; an allocation needs at least 1 byte",
            ));
        }
        let chunks_out = out_param(chunks_out, "chunks_out")?;
        let count_out = out_param(num_chunks_out, "num_chunks_out")?;
        let address = match state.runtime.allocate_at_most(size, capacity)? {
            BoundedAllocation::Allocated(address) => address,
            BoundedAllocation::NeedsChunks(needed) => {
                // SAFETY: flex.h: `num_chunks_out` points to a writable
                // `size_t` when not NULL (and holds the number needed on
                // this error); checked non-null and aligned.
                unsafe { count_out.write(needed) };
                return Err(Failure::invalid_argument(format!(
                    "capacity {capacity} is too small: the allocation of {size} bytes needs {needed} chunks; nothing was allocated"
                )));
            }
        };
        let chunks = address.chunks();
        for (index, chunk) in chunks.iter().enumerate() {
            // SAFETY: flex.h: `chunks_out` has room for `capacity` entries;
            // `index < chunks.len() <= capacity`, and the pointer is non-null
            // and aligned (checked), so `add(index)` stays inside it.
            unsafe { chunks_out.add(index).write(chunk.to_raw()) };
        }
        // SAFETY: as above for `num_chunks_out`.
        unsafe { count_out.write(chunks.len()) };
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_memory_free`: frees exactly an address that `flex_memory_allocate`
/// returned. Operations that still use it and run while it is free fail
/// with `FLEX_ERROR_EXECUTION_FAILED` (once allocated again, it is the new
/// allocation's memory).
///
/// # Safety
/// `address` is NULL or points to a valid `flex_composite_address_t` whose
/// chunk array is valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_memory_free(
    runtime: *mut flex_runtime_t,
    address: *const flex_composite_address_t,
) -> flex_status_t {
    const CALL: &str = "flex_memory_free";
    boundary(CALL, || {
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        // SAFETY: this function's contract is `read_address`'s.
        let address = unsafe { read_address(address, "address") }?;
        state.runtime.free(&address)?;
        Ok(FLEX_SUCCESS)
    })
}

/// `flex_runtime_get_memory_info` (ABI 1.1): bytes not taken by live
/// allocations, and the runtime's whole device memory.
///
/// # Safety
/// `free_out` and `total_out` are NULL or valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flex_runtime_get_memory_info(
    runtime: *mut flex_runtime_t,
    free_out: *mut u64,
    total_out: *mut u64,
) -> flex_status_t {
    const CALL: &str = "flex_runtime_get_memory_info";
    boundary(CALL, || {
        let state = handles::runtime(runtime)?;
        state.check_switch(CALL)?;
        let free = out_param(free_out, "free_out")?;
        let total = out_param(total_out, "total_out")?;
        let info = state.runtime.memory_info()?;
        // SAFETY: flex.h: both point to a writable `uint64_t` when not NULL;
        // both checked non-null and aligned before either is written.
        unsafe {
            free.write(info.free_bytes);
            total.write(info.total_bytes);
        }
        Ok(FLEX_SUCCESS)
    })
}

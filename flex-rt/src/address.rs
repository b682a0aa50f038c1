//! Device memory addresses: logical addresses, chunks and composite addresses.

use std::fmt;

use flex_sys::bindings as sys;

use crate::error::{FlexError, Result};

/// Alignment, in bytes, of every chunk offset (`FLEX_ADDRESS_ALIGNMENT`).
pub const ADDRESS_ALIGNMENT: u64 = sys::FLEX_ADDRESS_ALIGNMENT as u64;

/// Most chunks one composite address may have (`FLEX_MAX_ADDRESS_CHUNKS`).
pub const MAX_ADDRESS_CHUNKS: usize = sys::FLEX_MAX_ADDRESS_CHUNKS as usize;

/// A place in device memory (`flex_logical_address_t`): a region of the
/// device and a byte offset inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LogicalAddress {
    /// Identifier of a device memory region.
    pub region_id: u32,
    /// Byte offset inside the region.
    pub offset: u64,
}

/// A contiguous run of device memory (`flex_address_chunk_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressChunk {
    /// Where the chunk starts; the offset is [`ADDRESS_ALIGNMENT`]-aligned.
    pub address: LogicalAddress,
    /// Length in bytes, greater than zero.
    pub size: u64,
}

impl AddressChunk {
    /// The flex.h representation.
    pub fn to_raw(self) -> sys::flex_address_chunk_t {
        sys::flex_address_chunk_t {
            address: sys::flex_logical_address_t {
                region_id: self.address.region_id,
                offset: self.address.offset,
            },
            size: self.size,
        }
    }

    /// From the flex.h representation (not validated; see [`CompositeAddress::new`]).
    pub fn from_raw(raw: sys::flex_address_chunk_t) -> Self {
        Self {
            address: LogicalAddress {
                region_id: raw.address.region_id,
                offset: raw.address.offset,
            },
            size: raw.size,
        }
    }
}

/// One logical device buffer made of one or more chunks, in buffer order
/// (`flex::CompositeAddress` in torch-spyre, `flex_composite_address_t` in
/// flex.h). Its size is the sum of its chunk sizes.
///
/// Invariants, checked by [`CompositeAddress::new`]: at least one chunk, at
/// most [`MAX_ADDRESS_CHUNKS`]; every chunk non-empty, with an offset that is
/// a multiple of [`ADDRESS_ALIGNMENT`] and an end that does not overflow
/// `u64`; the total size fits in `u64`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompositeAddress {
    chunks: Box<[AddressChunk]>,
    total_size: u64,
}

impl CompositeAddress {
    /// Makes a composite address from its chunks.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] naming the bad chunk: no chunks,
    /// too many, an empty chunk, a misaligned offset, or a size overflow.
    pub fn new(chunks: impl Into<Vec<AddressChunk>>) -> Result<Self> {
        const CALL: &str = "CompositeAddress::new";
        let chunks = chunks.into();
        if chunks.is_empty() {
            return Err(FlexError::invalid_argument(
                CALL,
                "a composite address needs at least one chunk, got none",
            ));
        }
        if chunks.len() > MAX_ADDRESS_CHUNKS {
            return Err(FlexError::invalid_argument(
                CALL,
                format!(
                    "a composite address has at most {MAX_ADDRESS_CHUNKS} chunks, got {}",
                    chunks.len()
                ),
            ));
        }
        let mut total_size = 0u64;
        for (index, chunk) in chunks.iter().enumerate() {
            if chunk.size == 0 {
                return Err(FlexError::invalid_argument(
                    CALL,
                    format!("chunk {index} is empty (size 0); every chunk needs at least one byte"),
                ));
            }
            if !chunk.address.offset.is_multiple_of(ADDRESS_ALIGNMENT) {
                return Err(FlexError::invalid_argument(
                    CALL,
                    format!(
                        "chunk {index} starts at offset {} of region {}, which is not a multiple of {ADDRESS_ALIGNMENT} bytes",
                        chunk.address.offset, chunk.address.region_id
                    ),
                ));
            }
            chunk
                .address
                .offset
                .checked_add(chunk.size)
                .ok_or_else(|| {
                    FlexError::invalid_argument(
                        CALL,
                        format!(
                            "chunk {index} (offset {}, size {}) ends past the largest u64",
                            chunk.address.offset, chunk.size
                        ),
                    )
                })?;
            total_size = total_size.checked_add(chunk.size).ok_or_else(|| {
                FlexError::invalid_argument(
                    CALL,
                    format!(
                        "the chunks' sizes add up past the largest u64 at chunk {index} (size {}, after {total_size} bytes in the chunks before it)",
                        chunk.size
                    ),
                )
            })?;
        }
        Ok(Self {
            chunks: chunks.into_boxed_slice(),
            total_size,
        })
    }

    /// A composite address of one chunk.
    ///
    /// # Errors
    /// As [`CompositeAddress::new`].
    pub fn single(address: LogicalAddress, size: u64) -> Result<Self> {
        Self::new(vec![AddressChunk { address, size }])
    }

    /// The chunks, in buffer order.
    pub fn chunks(&self) -> &[AddressChunk] {
        &self.chunks
    }

    /// Total size in bytes (the sum of the chunk sizes; `total_size()` in torch-spyre).
    pub fn total_size(&self) -> u64 {
        self.total_size
    }

    /// The first chunk's start: where the buffer begins.
    pub fn start(&self) -> LogicalAddress {
        self.chunks[0].address
    }

    /// The `len` bytes from byte `offset` of this buffer, as a composite
    /// address of their own (the chunks they fall in, clipped): how an
    /// allocator hands out part of one allocation.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] naming the range when `len` is 0,
    /// when `offset + len` exceeds [`CompositeAddress::total_size`], or when
    /// a resulting chunk would not start on a [`ADDRESS_ALIGNMENT`]-byte
    /// boundary.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Self> {
        const CALL: &str = "CompositeAddress::slice";
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.total_size);
        let Some(end) = end.filter(|_| len > 0) else {
            return Err(FlexError::invalid_argument(
                CALL,
                format!(
                    "bytes [{offset}, {offset} + {len}) are not a non-empty range inside the buffer's {} bytes",
                    self.total_size
                ),
            ));
        };
        let mut chunks = Vec::new();
        let mut chunk_start = 0u64;
        for chunk in self.chunks.iter() {
            let chunk_end = chunk_start + chunk.size;
            let from = offset.max(chunk_start);
            let to = end.min(chunk_end);
            if from < to {
                chunks.push(AddressChunk {
                    address: LogicalAddress {
                        region_id: chunk.address.region_id,
                        offset: chunk.address.offset + (from - chunk_start),
                    },
                    size: to - from,
                });
            }
            chunk_start = chunk_end;
        }
        Self::new(chunks).map_err(|error| {
            FlexError::invalid_argument(
                CALL,
                format!(
                    "bytes [{offset}, {offset} + {len}) of the buffer cannot be an address of \
                     their own: {}",
                    error.message()
                ),
            )
        })
    }

    /// The chunks in flex.h form, for a `flex_composite_address_t` that
    /// borrows them.
    pub fn to_raw_chunks(&self) -> Vec<sys::flex_address_chunk_t> {
        self.chunks.iter().map(|c| c.to_raw()).collect()
    }
}

impl fmt::Display for CompositeAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, c) in self.chunks.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(
                f,
                "region {} +{} ({} B)",
                c.address.region_id, c.address.offset, c.size
            )?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(region_id: u32, offset: u64, size: u64) -> AddressChunk {
        AddressChunk {
            address: LogicalAddress { region_id, offset },
            size,
        }
    }

    #[test]
    fn a_slice_clips_the_chunks_it_falls_in() {
        let addr = CompositeAddress::new(vec![chunk(0, 0, 512), chunk(3, 256, 1024)]).unwrap();
        // Bytes 384..896: the last 128 of chunk 0, the first 384 of chunk 1.
        let part = addr.slice(384, 512).unwrap();
        assert_eq!(part.chunks(), &[chunk(0, 384, 128), chunk(3, 256, 384)]);
        assert_eq!(part.total_size(), 512);
        assert_eq!(
            addr.slice(512, 1024).unwrap().chunks(),
            &[chunk(3, 256, 1024)]
        );
        assert_eq!(addr.slice(0, 1536).unwrap(), addr);
    }

    #[test]
    fn a_slice_outside_the_buffer_or_unaligned_is_refused() {
        let addr = CompositeAddress::single(
            LogicalAddress {
                region_id: 1,
                offset: 0,
            },
            1024,
        )
        .unwrap();
        for (offset, len) in [(0, 0), (1024, 1), (512, 513), (u64::MAX, 2), (64, 128)] {
            let err = addr.slice(offset, len).unwrap_err();
            assert_eq!(
                err.status(),
                crate::Status::INVALID_ARGUMENT,
                "{offset}+{len}"
            );
        }
        let message = addr.slice(512, 513).unwrap_err().to_string();
        assert!(
            message.contains("[512, 512 + 513)") && message.contains("1024 bytes"),
            "{message}"
        );
        // A misaligned start names the slice and its range too (it named
        // `CompositeAddress::new` and a chunk index only).
        let misaligned = addr.slice(64, 128).unwrap_err();
        assert_eq!(misaligned.call(), "CompositeAddress::slice");
        assert!(
            misaligned.message().starts_with(
                "bytes [64, 64 + 128) of the buffer cannot be an address of their own: "
            ),
            "{misaligned}"
        );
    }

    #[test]
    fn total_size_is_the_sum_of_chunks() {
        let addr = CompositeAddress::new(vec![chunk(0, 0, 100), chunk(3, 256, 28)]).unwrap();
        assert_eq!(addr.total_size(), 128);
        assert_eq!(addr.chunks().len(), 2);
        assert_eq!(
            addr.start(),
            LogicalAddress {
                region_id: 0,
                offset: 0
            }
        );
        assert_eq!(
            addr.to_string(),
            "[region 0 +0 (100 B), region 3 +256 (28 B)]"
        );
    }

    #[test]
    fn empty_address_is_rejected() {
        let err = CompositeAddress::new(Vec::new()).unwrap_err();
        assert!(err.message().contains("at least one chunk"), "{err}");
    }

    #[test]
    fn misaligned_offset_is_rejected_with_the_offset() {
        let err = CompositeAddress::single(
            LogicalAddress {
                region_id: 2,
                offset: 64,
            },
            8,
        )
        .unwrap_err();
        assert!(err.message().contains("offset 64 of region 2"), "{err}");
        assert!(
            CompositeAddress::single(
                LogicalAddress {
                    region_id: 2,
                    offset: 384
                },
                8
            )
            .is_ok()
        );
    }

    #[test]
    fn empty_chunk_and_overflow_are_rejected() {
        assert!(
            CompositeAddress::new(vec![chunk(0, 0, 8), chunk(0, 128, 0)])
                .unwrap_err()
                .message()
                .contains("chunk 1 is empty")
        );
        assert!(
            CompositeAddress::single(
                LogicalAddress {
                    region_id: 0,
                    offset: u64::MAX - 127
                },
                256
            )
            .unwrap_err()
            .message()
            .contains("chunk 0 (offset 18446744073709551488, size 256) ends past the largest u64")
        );
        // Each chunk ends in range; their sizes' sum does not, and the
        // message says so (before, it blamed chunk 1's own end).
        let summed = CompositeAddress::new(vec![chunk(0, 0, u64::MAX), chunk(1, 128, 2)]);
        assert_eq!(
            summed.unwrap_err().message(),
            "the chunks' sizes add up past the largest u64 at chunk 1 (size 2, after 18446744073709551615 bytes in the chunks before it)"
        );
    }

    #[test]
    fn too_many_chunks_are_rejected() {
        let chunks: Vec<_> = (0..=MAX_ADDRESS_CHUNKS as u32)
            .map(|r| chunk(r, 0, 1))
            .collect();
        let err = CompositeAddress::new(chunks).unwrap_err();
        assert!(err.message().contains("at most 64 chunks, got 65"), "{err}");
    }

    #[test]
    fn raw_round_trip() {
        let c = chunk(7, 1024, 55);
        assert_eq!(AddressChunk::from_raw(c.to_raw()), c);
    }
}

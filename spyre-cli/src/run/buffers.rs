//! The device buffers of one iteration (or one pipeline slot): freed by
//! dropping them, in the order of the streams that used them.

use spyre_stream::{DeviceBuffer, FlexError, SpyreStream, Status};

use super::plan::{DESCRIPTOR_BYTES, Plan};

/// The two inputs, the output and the program of an iteration.
pub(super) struct IterationBuffers {
    /// The first input (`x` or `A`).
    pub(super) a: DeviceBuffer<f32>,
    /// The second input (`y` or `B`).
    pub(super) b: DeviceBuffer<f32>,
    /// The output (`out` or `C`).
    pub(super) out: DeviceBuffer<f32>,
    /// The kernel descriptor.
    pub(super) program: DeviceBuffer<u8>,
}

impl IterationBuffers {
    /// Buffers for `plan` on `stream`; each operand lies in one chunk of
    /// device memory (a kernel operand must).
    ///
    /// # Errors
    /// The allocator's error (out of memory, named), with the bytes asked
    /// for; an operand that came back in more than one chunk is
    /// `OUT_OF_MEMORY` too.
    pub(super) fn allocate(
        stream: SpyreStream,
        plan: &Plan,
    ) -> Result<Self, (u64, spyre_stream::Error)> {
        let operand = || {
            let buffer = DeviceBuffer::<f32>::new(stream, plan.elements)
                .map_err(|e| (plan.operand_bytes, e))?;
            match buffer.operand() {
                Ok(_) => Ok(buffer),
                Err(_) => Err((
                    plan.operand_bytes,
                    FlexError::new(
                        Status::OUT_OF_MEMORY,
                        "allocate",
                        format!(
                            "no free range holds {} bytes in one piece (the buffer came back in {} chunks, and a kernel operand must lie in one)",
                            plan.operand_bytes,
                            buffer.address().chunks().len()
                        ),
                    )
                    .into(),
                )),
            }
        };
        Ok(Self {
            a: operand()?,
            b: operand()?,
            out: operand()?,
            program: DeviceBuffer::new(stream, DESCRIPTOR_BYTES as usize)
                .map_err(|e| (DESCRIPTOR_BYTES, e))?,
        })
    }

    /// Declares that work on `stream` reads or writes every buffer through
    /// the program (a compute), so that dropping them waits for it.
    ///
    /// # Errors
    /// As [`DeviceBuffer::record_stream`].
    pub(super) fn record_stream(&self, stream: SpyreStream) -> spyre_stream::Result<()> {
        self.a.record_stream(stream)?;
        self.b.record_stream(stream)?;
        self.out.record_stream(stream)?;
        self.program.record_stream(stream)
    }
}

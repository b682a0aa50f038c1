//! The use-after-free detector (`SPYRE_MOCK_CHECK_REUSE`): what
//! compute-sanitizer finds for CUDA programs whose caching allocator hands
//! memory out again too early.
//!
//! An allocator above the runtime says when it gives memory to a new owner
//! ([`flex_rt::Runtime::note_reuse`]). The device then notes every
//! operation still queued or running that touches that memory: the
//! previous owner's. An operation enqueued after the note (the new
//! owner's) that touches the same bytes as one of those, and starts before
//! it has completed, fails with [`Status::EXECUTION_FAILED`] and a message
//! that names both. A note is dropped once every operation it holds has
//! completed.
//!
//! An operation counts as completed once it has run and taken its modelled
//! time, before its completion is called (a host that learns of it there
//! may hand its memory out again).
//!
//! The operands of a compute are read from its program as it starts. A
//! compute still queued when memory is handed out again counts only with
//! its program's memory (its program may not be written yet, and stale
//! bytes there must not name memory it will not touch): a compute of the
//! previous owner that is still queued is not checked for its operands.
//! Operations of a stream that has failed are not counted: they never run.

use std::collections::HashMap;
use std::fmt;

use flex_rt::{CompositeAddress, FlexError, Status};

use crate::kernel;
use crate::memory::DeviceMemory;
use crate::op::Op;

/// Bytes `[start, end)` of one memory region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    region: u32,
    start: u64,
    end: u64,
}

impl Extent {
    /// The bytes both cover, if any.
    fn overlap(&self, other: &Extent) -> Option<Extent> {
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        (self.region == other.region && start < end).then_some(Extent {
            region: self.region,
            start,
            end,
        })
    }
}

impl fmt::Display for Extent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {} bytes [{}, {})",
            self.region, self.start, self.end
        )
    }
}

/// The extents of `address`'s chunks.
fn extents_of(address: &CompositeAddress) -> Vec<Extent> {
    address
        .chunks()
        .iter()
        .map(|chunk| Extent {
            region: chunk.address.region_id,
            start: chunk.address.offset,
            end: chunk.address.offset.saturating_add(chunk.size),
        })
        .collect()
}

/// The device memory `op` touches: the device side of a copy or fill; a
/// compute's program, and with `memory` (as it starts) the operands the
/// program names; nothing for a host function or a record.
fn extents(op: &Op, memory: Option<&DeviceMemory>) -> Vec<Extent> {
    match op {
        Op::H2d { dst, .. } | Op::Fill { dst, .. } => extents_of(dst),
        Op::D2h { src, .. } => extents_of(src),
        Op::Compute { program } => {
            let mut touched = extents_of(program);
            if let Some(Ok(operands)) = memory.map(|m| kernel::operands(&m.view(), program)) {
                touched.extend(operands.into_iter().map(|(at, bytes)| Extent {
                    region: at.region_id,
                    start: at.offset,
                    end: at.offset.saturating_add(bytes),
                }));
            }
            touched
        }
        Op::HostFn(_) | Op::RawHostFn(_) | Op::HostCallback(_) | Op::Record(_) => Vec::new(),
    }
}

/// The first bytes `a` and `b` both cover.
fn first_overlap(a: &[Extent], b: &[Extent]) -> Option<Extent> {
    a.iter().find_map(|x| b.iter().find_map(|y| x.overlap(y)))
}

/// An operation as a report names it: its call, stream and place in the
/// stream (`position`: how many operations of the stream came before it).
#[derive(Clone, Copy, Debug)]
struct OpName {
    call: &'static str,
    stream: usize,
    position: u64,
}

impl fmt::Display for OpName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (operation {} of stream {})",
            self.call,
            self.position + 1,
            self.stream
        )
    }
}

/// An operation and the memory it touches.
#[derive(Clone, Debug)]
struct Touch {
    name: OpName,
    extents: Vec<Extent>,
}

/// Memory handed out again, and the previous owner's operations on it that
/// had not completed then.
struct Note {
    extents: Vec<Extent>,
    /// Operations enqueued from this sequence number on are the new owner's.
    from_seq: u64,
    earlier: Vec<Touch>,
}

/// The detector's state, kept by the scheduler (under its lock).
#[derive(Default)]
pub(crate) struct ReuseCheck {
    notes: Vec<Note>,
    /// The operation each stream is running, by stream index.
    running: HashMap<usize, Touch>,
    /// Per stream, how many of its operations have run (ahead of the
    /// scheduler's count, which moves after the completion).
    ran: HashMap<usize, u64>,
}

/// An operation still queued: its stream, its position in the stream, and
/// the operation.
pub(crate) type Queued<'a> = (usize, u64, &'a Op);

impl ReuseCheck {
    /// Notes that `address` is handed out again, with every operation of
    /// `queued` and every running one that touches it; `next_seq` is the
    /// sequence number the next enqueued operation gets. `completed(s)` is
    /// how many operations of stream `s` have completed.
    pub(crate) fn note<'a>(
        &mut self,
        address: &CompositeAddress,
        queued: impl Iterator<Item = Queued<'a>>,
        next_seq: u64,
        completed: impl Fn(usize) -> u64,
    ) {
        self.forget_completed(&completed);
        let fenced = extents_of(address);
        let touches = |touched: &[Extent]| first_overlap(touched, &fenced).is_some();
        let mut earlier: Vec<Touch> = self
            .running
            .values()
            .filter(|touch| touches(&touch.extents))
            .cloned()
            .collect();
        for (stream, position, op) in queued {
            let touched = extents(op, None);
            if touches(&touched) {
                earlier.push(Touch {
                    name: OpName {
                        call: op.call(),
                        stream,
                        position,
                    },
                    extents: touched,
                });
            }
        }
        if !earlier.is_empty() {
            self.notes.push(Note {
                extents: fenced,
                from_seq: next_seq,
                earlier,
            });
        }
    }

    /// Records `op` (sequence number `seq`; `position` operations of
    /// `stream` came before it) as running, and checks it: returns the
    /// error to fail it with when it was enqueued after memory it touches
    /// was handed out again and an operation of the previous owner on the
    /// same bytes has not completed.
    pub(crate) fn start(
        &mut self,
        stream: usize,
        position: u64,
        seq: u64,
        op: &Op,
        memory: &DeviceMemory,
        completed: impl Fn(usize) -> u64,
    ) -> Option<FlexError> {
        let touched = extents(op, Some(memory));
        if touched.is_empty() {
            return None;
        }
        let name = OpName {
            call: op.call(),
            stream,
            position,
        };
        self.forget_completed(&completed);
        let violation = self
            .notes
            .iter()
            .filter(|note| seq >= note.from_seq)
            .find_map(|note| {
                note.earlier.iter().find_map(|earlier| {
                    let shared = touched
                        .iter()
                        .filter_map(|x| note.extents.iter().find_map(|y| x.overlap(y)))
                        .find_map(|x| earlier.extents.iter().find_map(|y| x.overlap(y)))?;
                    Some((earlier.name, shared))
                })
            });
        self.running.insert(
            stream,
            Touch {
                name,
                extents: touched,
            },
        );
        let (earlier, shared) = violation?;
        Some(FlexError::new(
            Status::EXECUTION_FAILED,
            name.call,
            format!(
                "use after free: {name} touches {shared}, which was handed out again while {earlier}, enqueued before that, had not completed; declare every stream that uses the memory (DeviceBuffer::record_stream) or order the streams with an event"
            ),
        ))
    }

    /// Stream `stream`'s running operation has run (before its completion
    /// is called).
    pub(crate) fn ran(&mut self, stream: usize) {
        if let Some(touch) = self.running.remove(&stream) {
            self.ran.insert(stream, touch.name.position + 1);
        }
    }

    /// Drops the operations that have completed, and the notes left with
    /// none.
    fn forget_completed(&mut self, completed: &impl Fn(usize) -> u64) {
        let ran = &self.ran;
        let done = |stream: usize| completed(stream).max(ran.get(&stream).copied().unwrap_or(0));
        for note in &mut self.notes {
            note.earlier
                .retain(|touch| done(touch.name.stream) <= touch.name.position);
        }
        self.notes.retain(|note| !note.earlier.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(region: u32, start: u64, end: u64) -> Extent {
        Extent { region, start, end }
    }

    #[test]
    fn extents_overlap_only_within_one_region() {
        let a = extent(0, 0, 512);
        assert_eq!(a.overlap(&extent(0, 256, 1024)), Some(extent(0, 256, 512)));
        assert_eq!(a.overlap(&extent(0, 512, 1024)), None, "adjacent");
        assert_eq!(a.overlap(&extent(1, 0, 512)), None, "another region");
    }
}

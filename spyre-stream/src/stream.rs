//! `SpyreStream`: a stream as a plain (device, id) value.

use std::fmt;

use crate::id::StreamId;

/// A Spyre stream: a small `Copy` value of (device index, stream id), like
/// `c10::Stream`. It holds no handle and no interior mutability; every
/// operation resolves the runtime handle through the process-wide pool
/// (torch-spyre's `resolveRuntimeHandle`, here without a lock), so a
/// `SpyreStream` can be copied to and used from any thread.
///
/// Equality and hashing are on (device, id). [`SpyreStream::priority`]
/// derives from the id alone.
///
/// Its operations ([`SpyreStream::query`], [`SpyreStream::synchronize`],
/// [`SpyreStream::error`] and the launches) are the one public way to use a
/// pool stream; they go through the process-wide pool (see [`crate::start_runtime`]). For a
/// [`crate::StreamPool`] built by hand, [`crate::StreamPool::resolve`] gives
/// the raw handle, whose [`flex_rt::Stream`] methods are the same operations.
///
/// Submissions to one stream from several threads are serialized by the
/// runtime backend (flex-rt's contract); their relative order is the order
/// in which they reach the stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpyreStream {
    device: u8,
    id: StreamId,
}

impl SpyreStream {
    /// A stream value for `id` on `device` without asking the pool (c10's
    /// `Stream(UNSAFE, device, id)`). Nothing is checked here: an operation
    /// on an id that has no handle fails with [`crate::Error::NoHandle`].
    #[inline]
    pub fn from_parts(device: u8, id: StreamId) -> Self {
        Self { device, id }
    }

    /// The stream id.
    pub fn id(self) -> StreamId {
        self.id
    }

    /// The logical device index.
    pub fn device_index(self) -> u8 {
        self.device
    }

    /// 0 for ids 0–32, -1 above, as torch-spyre reports it.
    pub fn priority(self) -> i32 {
        self.id.priority()
    }
}

impl fmt::Debug for SpyreStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SpyreStream {{ device: {}, id: {} }}",
            self.device, self.id
        )
    }
}

impl fmt::Display for SpyreStream {
    /// `<spyre stream device=0 id=5>`, after torch-spyre's `__repr__`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<spyre stream device={} id={}>", self.device, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    static_assertions::assert_impl_all!(SpyreStream: Copy, Send, Sync);

    #[test]
    fn equality_and_hash_are_on_device_and_id() {
        let a = SpyreStream::from_parts(0, StreamId(5));
        let b = SpyreStream::from_parts(0, StreamId(5));
        let c = SpyreStream::from_parts(1, StreamId(5));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let set: HashSet<_> = [a, b, c].into_iter().collect();
        assert_eq!(set.len(), 2);
        assert_eq!(a.to_string(), "<spyre stream device=0 id=5>");
        assert_eq!(std::mem::size_of::<SpyreStream>(), 16);
    }
}

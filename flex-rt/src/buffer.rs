//! Host buffers that asynchronous copies keep alive and lock while in flight.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::sync::{
    ArcRwLockReadGuard, ArcRwLockWriteGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

use crate::error::{FlexError, Result};

/// Host memory for asynchronous copies: shared, reference-counted bytes.
///
/// This is the Rust form of the host lifetime token torch-spyre passes with
/// every copy. Cloning is cheap and shares the bytes. An in-flight operation
/// holds a lease on the buffer until it completes (or fails), so the memory
/// cannot be freed under the device:
///
/// - an H2D copy holds a shared lease: the host may read the buffer meanwhile,
///   and a [`HostBuffer::write`] waits until the copy is done;
/// - a D2H copy holds an exclusive lease: [`HostBuffer::read`] and
///   [`HostBuffer::write`] wait until the device has written the bytes.
///
/// A launch never waits for a lease: if the buffer is leased in a conflicting
/// way (a D2H still writing it, or a guard alive on this or another thread),
/// the launch fails with [`crate::Status::INVALID_ARGUMENT`] and enqueues
/// nothing.
///
/// Readers are not held back by a writer that waits: while the buffer is
/// read (an H2D copy in flight, a read guard), a [`HostBuffer::write`]
/// waiting for those reads to end does not keep more H2D launches or
/// [`HostBuffer::read`]s out. So a host callback may read a buffer that an
/// H2D copy queued behind it reads too while another thread waits to write
/// it (with a lock that lets a waiting writer go first, the callback would
/// wait for the writer, the writer for the copy, and the copy for the
/// callback). A writer waits until no read is left, however many come.
///
/// Thread-safety: `Send + Sync`; every access goes through a reader-writer
/// lock that lets readers in while a writer waits ([`crate::sync::RwLock`],
/// which a process forked while a thread waited for the buffer can still
/// use for the buffers it makes).
#[derive(Clone)]
pub struct HostBuffer {
    bytes: Arc<RwLock<Box<[u8]>>>,
    len: usize,
}

impl HostBuffer {
    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::from_vec(vec![0; len])
    }

    /// A buffer that takes ownership of `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Self {
            bytes: Arc::new(RwLock::new(bytes.into_boxed_slice())),
            len,
        }
    }

    /// Length in bytes; fixed for the life of the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shared access to the bytes; blocks while a D2H copy into the buffer is
    /// in flight or a write guard is alive (not for a writer that waits
    /// while the buffer is read: see [`HostBuffer`]).
    ///
    /// Do not call it from a host callback of the stream that copies into the
    /// buffer: the copy cannot finish until the callback returns. In a
    /// process forked while a D2H copy into the buffer was in flight, the
    /// copy's lease is never released (the device and its threads stay
    /// with the parent): `read` blocks for ever there, where
    /// [`HostBuffer::try_read`] says `None`.
    pub fn read(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.bytes.read()
    }

    /// Exclusive access to the bytes; blocks while any copy from or into the
    /// buffer is in flight or another guard is alive.
    ///
    /// As for [`HostBuffer::read`], a copy in flight at a `fork()` holds the
    /// buffer for good in the child: [`HostBuffer::try_write`] does not wait.
    pub fn write(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.bytes.write()
    }

    /// Shared access to the bytes if no D2H copy into the buffer is in
    /// flight and no write guard is alive; `None` otherwise, at once.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, Box<[u8]>>> {
        self.bytes.try_read()
    }

    /// Exclusive access to the bytes if no copy from or into the buffer is
    /// in flight and no other guard is alive; `None` otherwise, at once.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, Box<[u8]>>> {
        self.bytes.try_write()
    }

    /// A copy of the bytes (waits as [`HostBuffer::read`] does).
    pub fn to_vec(&self) -> Vec<u8> {
        self.read().to_vec()
    }

    /// Takes a shared lease for an operation that reads the buffer (H2D).
    /// Backends call this at launch and release the lease when the operation
    /// completes.
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] if a D2H copy or a write guard holds the buffer.
    pub fn lease_for_read(&self, call: &'static str) -> Result<ReadLease> {
        self.bytes
            .try_read_arc()
            .map(ReadLease)
            .ok_or_else(|| busy(call, self.len, "read"))
    }

    /// Takes an exclusive lease for an operation that writes the buffer (D2H).
    ///
    /// # Errors
    /// [`crate::Status::INVALID_ARGUMENT`] if any operation or guard holds the buffer.
    pub fn lease_for_write(&self, call: &'static str) -> Result<WriteLease> {
        self.bytes
            .try_write_arc()
            .map(WriteLease)
            .ok_or_else(|| busy(call, self.len, "written"))
    }
}

fn busy(call: &'static str, len: usize, what: &str) -> FlexError {
    FlexError::invalid_argument(
        call,
        format!(
            "host buffer of {len} bytes cannot be {what} by the device now: an operation in flight or a guard holds it; synchronize the stream that uses it or drop the guard first"
        ),
    )
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .finish()
    }
}

impl From<Vec<u8>> for HostBuffer {
    fn from(bytes: Vec<u8>) -> Self {
        Self::from_vec(bytes)
    }
}

/// A shared lease on a [`HostBuffer`] held by an in-flight H2D copy.
/// Dereferences to the bytes. `Send`: it may be released on a runtime thread.
pub struct ReadLease(ArcRwLockReadGuard<Box<[u8]>>);

impl fmt::Debug for ReadLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadLease")
            .field("len", &self.len())
            .finish()
    }
}

impl Deref for ReadLease {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// An exclusive lease on a [`HostBuffer`] held by an in-flight D2H copy.
/// Dereferences to the bytes. `Send`: it may be released on a runtime thread.
pub struct WriteLease(ArcRwLockWriteGuard<Box<[u8]>>);

impl fmt::Debug for WriteLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteLease")
            .field("len", &self.len())
            .finish()
    }
}

impl Deref for WriteLease {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for WriteLease {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static_assertions::assert_impl_all!(HostBuffer: Send, Sync);
    static_assertions::assert_impl_all!(ReadLease: Send);
    static_assertions::assert_impl_all!(WriteLease: Send);
    static_assertions::assert_impl_all!(crate::program::KernelDescriptor: Send, Sync, Copy);

    #[test]
    fn read_leases_share_and_exclude_writers() {
        let buf = HostBuffer::from_vec(vec![1, 2, 3]);
        let a = buf.lease_for_read("t").unwrap();
        let b = buf.lease_for_read("t").unwrap();
        assert_eq!(&*a, &[1, 2, 3]);
        let err = buf.lease_for_write("launch_d2h").unwrap_err();
        assert_eq!(err.call(), "launch_d2h");
        assert!(err.message().contains("host buffer of 3 bytes"), "{err}");
        drop((a, b));
        assert!(buf.lease_for_write("t").is_ok());
    }

    #[test]
    fn try_read_and_try_write_do_not_wait_for_a_lease() {
        let buf = HostBuffer::from_vec(vec![1, 2]);
        let copy_in = buf.lease_for_write("t").unwrap();
        assert!(buf.try_read().is_none() && buf.try_write().is_none());
        drop(copy_in);
        let copy_out = buf.lease_for_read("t").unwrap();
        assert_eq!(buf.try_read().as_deref().map(|b| &b[..]), Some(&[1, 2][..]));
        assert!(buf.try_write().is_none(), "an H2D copy reads the buffer");
        drop(copy_out);
        buf.try_write().expect("nothing holds the buffer")[0] = 7;
        assert_eq!(buf.to_vec(), vec![7, 2]);
    }

    /// While an H2D lease reads the buffer and a writer waits for it, reads
    /// and more H2D leases are still granted; the writer gets the buffer
    /// once they are all gone. With a lock that lets a waiting writer go
    /// first, both were refused (a host callback's `read` then waited for
    /// the writer, which waited for the copy queued behind the callback).
    #[test]
    fn a_waiting_writer_does_not_keep_readers_out() {
        let buf = HostBuffer::from_vec(vec![1, 2]);
        let copy_out = buf.lease_for_read("t").unwrap();
        let (wrote, written) = std::sync::mpsc::channel();
        let writing = buf.clone();
        std::thread::spawn(move || {
            writing.write()[0] = 7;
            let _ = wrote.send(());
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !crate::sync::has_sleepers(&buf.bytes) {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never waited"
            );
            std::thread::yield_now();
        }
        assert_eq!(buf.try_read().as_deref().map(|b| &b[..]), Some(&[1, 2][..]));
        let another = buf.lease_for_read("t").expect("a second H2D copy");
        assert_eq!(buf.read()[1], 2);
        drop((copy_out, another));
        written
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the writer gets the buffer once the reads are gone");
        assert_eq!(buf.to_vec(), vec![7, 2]);
    }

    #[test]
    fn write_lease_is_exclusive_and_visible_after_release() {
        let buf = HostBuffer::zeroed(4);
        let mut lease = buf.lease_for_write("t").unwrap();
        assert!(buf.lease_for_read("t").is_err());
        lease.copy_from_slice(&[9, 8, 7, 6]);
        drop(lease);
        assert_eq!(buf.to_vec(), vec![9, 8, 7, 6]);
        assert_eq!(buf.len(), 4);
    }
}

//! Detecting `fork()`: a device runtime cannot cross it.
//!
//! A child of `fork()` inherits a copy of its parent's memory, including a
//! started device runtime's handles, but only the thread that called `fork`:
//! a runtime's worker threads do not exist in the child, and on a real card
//! the child would drive its parent's driver handles. Whatever keeps device
//! state must therefore notice that it now runs in a forked child and refuse
//! to touch that state (PyTorch's rule for CUDA: "cannot re-initialize CUDA
//! in forked subprocess").
//!
//! [`watch_forks`] registers a `pthread_atfork` child handler once per
//! process; from then on every `fork()` increments the counter that
//! [`fork_generation`] reads. Code that starts device state records the
//! generation at start ([`ForkGeneration::current`]) and compares it on use
//! ([`ForkGeneration::is_current`]): one relaxed atomic load, no system call.
//! The handler does nothing but an atomic add, which is async-signal-safe as
//! the child of a multi-threaded process requires.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// Forks seen since [`watch_forks`] was first called, in the ancestry of
/// this process (a child starts with its parent's count plus one).
static GENERATION: AtomicU64 = AtomicU64::new(0);

#[cfg(unix)]
extern "C" fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Registers the fork watcher, once per process; later calls return at once.
/// Call it before recording a [`ForkGeneration`]: forks before the first call
/// are not counted.
///
/// # Errors
/// The `errno` value from `pthread_atfork` (`ENOMEM`) when the handler
/// could not be registered; a later call tries again.
///
/// Thread-safety: may be called from any thread, concurrently.
pub fn watch_forks() -> Result<(), std::io::Error> {
    static REGISTERED: Mutex<bool> = Mutex::new(false);
    // A poisoned lock only means another caller panicked; the flag is still right.
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    if *registered {
        return Ok(());
    }
    #[cfg(not(unix))]
    {
        // No fork() on this platform: nothing to watch.
        *registered = true;
        return Ok(());
    }
    // SAFETY: `pthread_atfork` only stores the three function pointers;
    // the child handler is a plain `extern "C" fn` with no arguments that
    // lives for the whole program and does one atomic add (async-signal-safe,
    // as a handler that runs in the child of a multi-threaded process must
    // be). Null prepare and parent handlers are allowed.
    let status = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    if status != 0 {
        return Err(std::io::Error::from_raw_os_error(status));
    }
    *registered = true;
    Ok(())
}

/// How many times this process's ancestry has forked since [`watch_forks`]
/// was first called.
pub fn fork_generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// The fork generation a piece of device state was created in.
///
/// `Copy`, 8 bytes; `Send + Sync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkGeneration(u64);

impl ForkGeneration {
    /// The generation of the calling process. Meaningful only after
    /// [`watch_forks`] succeeded.
    pub fn current() -> Self {
        Self(fork_generation())
    }

    /// Whether the calling process is the one this generation was recorded
    /// in (`false` in any child forked since). One relaxed atomic load.
    #[inline]
    pub fn is_current(self) -> bool {
        fork_generation() == self.0
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_sees_a_new_generation_and_the_parent_does_not() {
        watch_forks().unwrap();
        watch_forks().expect("a second call returns at once");
        let started = ForkGeneration::current();
        assert!(started.is_current());
        // SAFETY: the child does only async-signal-safe work: two atomic
        // loads and `_exit`, never returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let code = if started.is_current() { 1 } else { 0 };
            let code = if ForkGeneration::current().is_current() {
                code
            } else {
                2
            };
            // SAFETY: `_exit` ends the child without running the parent's
            // atexit handlers or unwinding into the harness.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: `pid` is this process's child and `status` a valid out-pointer.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        assert!(libc::WIFEXITED(status), "child status {status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "1: the child took the parent's generation as its own; 2: a fresh record was stale"
        );
        assert!(
            started.is_current(),
            "the parent's generation must not move"
        );
    }
}

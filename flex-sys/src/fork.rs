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
//! [`fork_generation`] reads (`vfork`, `_Fork` and a raw `clone` run no
//! fork handlers and are not counted). Code that starts device state records the
//! generation at start ([`ForkGeneration::current`]) and compares it on use
//! ([`ForkGeneration::is_current`]): one relaxed atomic load, no system call.
//! The handler does nothing but an atomic add, which is async-signal-safe as
//! the child of a multi-threaded process requires.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Forks seen since [`watch_forks`] was first called, in the ancestry of
/// this process, once per registered handler (a child starts with its
/// parent's count plus one, or more: see [`watch_forks`]).
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
/// Thread-safety: may be called from any thread, concurrently. Once the
/// watcher is registered a call is one acquire load. Calls never wait for
/// each other: threads whose first calls race may each register the
/// handler (then every fork counts once per handler, which changes nothing,
/// as only the inequality of generations is used). A wait would hang a
/// child forked while a thread of its parent was registering: that thread
/// is not in the child, and a record of which process it belonged to can
/// be fooled by a reused process id.
pub fn watch_forks() -> Result<(), std::io::Error> {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    ensure(&REGISTERED, register_handler)
}

/// Runs `register` unless `registered` says a call has succeeded, and
/// records its success there.
fn ensure(
    registered: &AtomicBool,
    register: impl FnOnce() -> Result<(), std::io::Error>,
) -> Result<(), std::io::Error> {
    if registered.load(Ordering::Acquire) {
        return Ok(());
    }
    register()?;
    registered.store(true, Ordering::Release);
    Ok(())
}

/// Registers [`after_fork_in_child`] with `pthread_atfork`.
fn register_handler() -> Result<(), std::io::Error> {
    #[cfg(unix)]
    {
        // SAFETY: `pthread_atfork` only stores the three function
        // pointers; the child handler is a plain `extern "C" fn` with no
        // arguments that lives for the whole program and does one atomic
        // add (async-signal-safe, as a handler that runs in the child of a
        // multi-threaded process must be). Null prepare and parent
        // handlers are allowed.
        let status = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        if status != 0 {
            return Err(std::io::Error::from_raw_os_error(status));
        }
    }
    // (No fork() on other platforms: nothing to watch.)
    Ok(())
}

/// How many times this process's ancestry has forked since [`watch_forks`]
/// was first called. One relaxed atomic load (inlined into callers in other
/// crates: every flex call checks it).
#[inline]
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
    #[inline]
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

    /// A child forked while another thread is inside `watch_forks` (every
    /// runtime creation calls it) can call it too. When every call took the
    /// registration lock, 13 of this test's 20 children hung on it, held in
    /// the parent by a thread the child does not have.
    #[test]
    #[cfg_attr(miri, ignore = "fork() is outside Miri")]
    fn a_child_forked_during_another_threads_call_can_call_it_too() {
        watch_forks().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let caller = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    watch_forks().unwrap();
                }
            })
        };
        let mut hung = 0;
        for _ in 0..20 {
            // SAFETY: the child calls `watch_forks` (after the first
            // registration: atomic loads) and `_exit`s, never returning
            // into the test harness.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
            if pid == 0 {
                let code = i32::from(watch_forks().is_err());
                // SAFETY: ends the child at once, without unwinding.
                unsafe { libc::_exit(code) };
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let mut status = 0;
            loop {
                // SAFETY: `pid` is this process's child; `status` a valid out-pointer.
                if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
                    break;
                }
                if std::time::Instant::now() > deadline {
                    hung += 1;
                    // SAFETY: `pid` is this process's child, not yet reaped.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        stop.store(true, Ordering::Relaxed);
        caller.join().unwrap();
        assert_eq!(hung, 0, "children that hung in watch_forks, of 20");
    }

    #[test]
    fn a_failed_registration_is_tried_again_and_a_successful_one_is_not() {
        let registered = AtomicBool::new(false);
        let err = ensure(&registered, || {
            Err(std::io::Error::from_raw_os_error(libc::ENOMEM))
        })
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOMEM));
        let mut calls = 0;
        for _ in 0..2 {
            ensure(&registered, || {
                calls += 1;
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(calls, 1, "registrations run after the failed one");
    }

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

//! Process-level test support that needs the operating system directly:
//! forking a child, and changing the environment of a test's own isolated
//! process. The only `unsafe` of the test crates, each block argued.

use std::time::{Duration, Instant};

/// How a forked child ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ForkOutcome {
    /// The child exited with this code (0: its body returned normally).
    Exited(i32),
    /// The child was killed by this signal.
    Signalled(i32),
    /// The child did not finish in time and was killed: it hung.
    TimedOut(Duration),
}

/// Forks the calling process and runs `body` in the child, which then exits
/// with 0 (or 101 if `body` panicked, after printing the panic to stderr).
/// The parent waits for the child for at most `limit`, polling every
/// millisecond, and kills it when the limit passes, so a child that hangs
/// makes the test fail instead of hanging the suite.
///
/// Call it from a test that runs in its own process ([`crate::isolated!`]):
/// the child is a copy of this process with only the calling thread.
///
/// # Panics
/// When `fork` or `waitpid` fail.
pub fn fork_and_wait(limit: Duration, body: impl FnOnce()) -> ForkOutcome {
    // SAFETY: `fork` has no memory-safety preconditions; the hazard of a
    // forked child of a threaded process is a lock held by a thread that does
    // not exist in the child. The child below only runs `body` (the code
    // under test, whose point is to touch no such state) and then `_exit`s
    // without unwinding into the test harness or running exit handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
            Ok(()) => 0,
            Err(_) => 101,
        };
        // SAFETY: ends the child at once; nothing of the parent's is flushed
        // or run twice.
        unsafe { libc::_exit(code) }
    }
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is this process's child; `status` is a valid out-pointer.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(
            waited >= 0,
            "waitpid failed: {}",
            std::io::Error::last_os_error()
        );
        if waited == pid {
            return if libc::WIFEXITED(status) {
                ForkOutcome::Exited(libc::WEXITSTATUS(status))
            } else {
                ForkOutcome::Signalled(libc::WTERMSIG(status))
            };
        }
        if started.elapsed() > limit {
            // SAFETY: `pid` is our unreaped child, so the id cannot have been
            // reused; SIGKILL then reaping it leaves no zombie.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return ForkOutcome::TimedOut(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sets an environment variable of the calling process (`None` removes it),
/// for a test that changes the environment between two calls of the code
/// under test, as a user would between a failed start and a retry.
///
/// Call it only from a test running alone in its own process
/// ([`crate::isolated!`] runs the child with `--test-threads=1`) and before it
/// starts threads that read the environment.
pub fn set_env_var(name: &str, value: Option<&str>) {
    // SAFETY: changing the environment is unsound only while another thread
    // reads or writes it. The isolated child runs this test alone on one
    // thread, and the caller promises that no thread of its own is running
    // (the software device's engine threads exist only once a runtime has
    // started, and read no environment).
    unsafe {
        match value {
            Some(value) => std::env::set_var(name, value),
            None => std::env::remove_var(name),
        }
    }
}

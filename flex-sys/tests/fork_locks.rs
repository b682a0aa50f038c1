//! The locks of `flex_sys::sync` in a child of `fork()` made while the
//! parent's threads were asleep on locks of the same kind (held by the test
//! across each fork): the child's own locks, contended by threads of its
//! own, work (no hang, no lost update, no torn read).
//! A test binary of its own, so that no other test's threads are forked.
#![cfg(unix)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flex_sys::sync::{Mutex, RwLock};

/// Threads of the child contending on each of its locks.
const CHILD_THREADS: u64 = 4;
/// Updates each child thread makes.
const CHILD_UPDATES: u64 = 5_000;
/// Forks made.
const FORKS: usize = 100;

/// What a child does: a mutex and a reader-writer lock of its own, each
/// updated by [`CHILD_THREADS`] threads (readers checking the writers'
/// pairs beside them); whether every update was counted and no read torn.
fn child_work() -> bool {
    let count = Arc::new(Mutex::new(0u64));
    let pair = Arc::new(RwLock::new((0u64, 0u64)));
    let threads: Vec<_> = (0..CHILD_THREADS)
        .map(|i| {
            let (count, pair) = (Arc::clone(&count), Arc::clone(&pair));
            std::thread::spawn(move || {
                let mut torn = false;
                for _ in 0..CHILD_UPDATES {
                    *count.lock() += 1;
                    if i % 2 == 0 {
                        let mut p = pair.write();
                        p.0 += 1;
                        p.1 += 1;
                    } else {
                        let p = *pair.read();
                        torn |= p.0 != p.1;
                    }
                }
                torn
            })
        })
        .collect();
    let torn = threads.into_iter().any(|t| t.join().unwrap_or(true));
    let writes = CHILD_THREADS / 2 * CHILD_UPDATES;
    !torn && *count.lock() == CHILD_THREADS * CHILD_UPDATES && *pair.read() == (writes, writes)
}

#[test]
fn a_child_forked_while_threads_wait_on_locks_uses_locks_of_its_own() {
    // Bounded, so that a lock of the parent that hangs fails the test
    // instead of holding CI up.
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(forks());
    });
    let (hung, failed) = ended
        .recv_timeout(Duration::from_secs(300))
        .expect("the parent's own locks hung, or a step of the parent panicked");
    assert_eq!((hung, failed), (0, 0), "children hung, children failed");
}

/// Forks [`FORKS`] children while the parent's threads are asleep on its
/// locks; how many children hung and how many failed.
fn forks() -> (usize, usize) {
    // The parent's threads wait on one mutex and one reader-writer lock
    // that the test holds across each fork, so that at every fork they
    // are asleep on them; between forks they take them once each.
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(Mutex::new(0u64));
    let shared = Arc::new(RwLock::new(0u64));
    let busy: Vec<_> = (0..4)
        .map(|i| {
            let (stop, count, shared) =
                (Arc::clone(&stop), Arc::clone(&count), Arc::clone(&shared));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if i < 2 {
                        *count.lock() += 1;
                    } else {
                        let _ = *shared.read();
                        // Room for the test's write between the reads.
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut hung = 0;
    let mut failed = 0;
    for _ in 0..FORKS {
        let held = (count.lock(), shared.write());
        // The reader threads are asleep on `shared` before the fork (the
        // mutex's waiters, likely, too).
        while !flex_sys::sync::has_sleepers(&shared) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(2));
        // SAFETY: the child runs `child_work` (its own locks and threads)
        // and `_exit`s, never returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let worked = std::panic::catch_unwind(child_work).unwrap_or(false);
            let code = i32::from(!worked);
            // SAFETY: ends the child at once, without unwinding.
            unsafe { libc::_exit(code) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut status = 0;
        loop {
            // SAFETY: `pid` is this process's child; `status` a valid out-pointer.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                failed += usize::from(!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0));
                break;
            }
            if Instant::now() > deadline {
                hung += 1;
                // SAFETY: `pid` is this process's child, not yet reaped.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
    }
    stop.store(true, Ordering::Relaxed);
    for thread in busy {
        thread.join().unwrap();
    }
    (hung, failed)
}

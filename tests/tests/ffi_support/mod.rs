//! Helpers shared by the FFI-path tests (`ffi_*.rs`): a fresh process per
//! test, the mock shared library as a backend, and the number of threads of
//! this process.
#![allow(dead_code)] // each test file uses part of it

use std::time::{Duration, Instant};

use flex_rt::HardwareBackend;
use spyre_tests::mock_cdylib;

/// [`spyre_tests::isolated`], with the mock shared library built (or found)
/// in this process first, so the child reuses it instead of asking cargo.
pub fn isolated(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    mock_cdylib();
    spyre_tests::isolated(name, env, body);
}

/// The mock shared library, loaded through flex-sys.
pub fn backend() -> HardwareBackend {
    HardwareBackend::open(mock_cdylib())
        .unwrap_or_else(|err| panic!("cannot load {}: {err}", mock_cdylib().display()))
}

/// Threads of this process right now (`/proc/self/task`), counted from
/// outside any library: a thread the mock library started is counted
/// whatever crate copy started it.
pub fn live_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task lists this process's threads")
        .count()
}

/// Waits (at most 5 s) until the process has `expected` threads: a joined
/// thread leaves `/proc/self/task` a moment after `pthread_join` returns.
/// Returns the last count seen.
pub fn settle_threads(expected: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = live_threads();
        if now == expected || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

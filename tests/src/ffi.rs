//! What the FFI-path tests (`ffi_*.rs`) share: the software device's flex
//! library as a backend, and the number of threads of this process.

use std::time::{Duration, Instant};

use crate::mock_cdylib::mock_cdylib;
use flex_rt::HardwareBackend;

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

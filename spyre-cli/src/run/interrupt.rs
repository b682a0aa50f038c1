//! What a signal that ends `spyre run` (Ctrl-C, `kill`, a closed terminal)
//! leaves of an output file being replaced: the new file written beside it
//! ([`super::output_file`]) is removed, and the process then ends by the
//! signal as it would have anyway (exit status 128 + the signal's number
//! in a shell: 130 for Ctrl-C).
//!
//! Nothing is installed until the first such file is made, so until then
//! the signals keep their default action. From then on a thread of its own
//! waits for `SIGINT`, `SIGTERM` and `SIGHUP`; on the first, it removes the
//! files listed, restores the signal's default action and raises it again.
//! A signal the process started with ignored (`nohup`'s `SIGHUP`, the
//! `SIGINT` of a shell's background job) is not watched: it stays ignored.
//! Only on Linux, where `/proc/self/status` tells which are ignored;
//! elsewhere no signal is watched.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// The files to remove should a signal end the process now.
static LISTED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A file that a signal ending the process while this is alive removes.
#[derive(Debug)]
pub(crate) struct RemovedOnSignal(PathBuf);

impl RemovedOnSignal {
    /// Makes a file with `make`, which returns it and its path, and lists
    /// that path until the returned guard is dropped. A signal that comes
    /// while the file is made finds it listed once it is (the list is held
    /// meanwhile), so no file made here is left by a signal.
    ///
    /// # Errors
    /// `make`'s error; nothing is listed then.
    pub(crate) fn make<T>(
        make: impl FnOnce() -> std::io::Result<(T, PathBuf)>,
    ) -> std::io::Result<(T, Self)> {
        watch();
        let mut listed = LISTED.lock().unwrap_or_else(PoisonError::into_inner);
        let (made, path) = make()?;
        listed.push(path.clone());
        Ok((made, Self(path)))
    }

    /// Runs `f` (the rename of the file over its target, say) with the
    /// list held: a signal that comes meanwhile removes nothing until `f`
    /// has returned, and one whose removal began first keeps `f` from
    /// starting (it holds the list until the process ends). So `f` never
    /// finds the file gone half-way.
    pub(crate) fn while_listed<T>(&self, f: impl FnOnce() -> T) -> T {
        let _listed = LISTED.lock().unwrap_or_else(PoisonError::into_inner);
        f()
    }
}

impl Drop for RemovedOnSignal {
    fn drop(&mut self) {
        let mut listed = LISTED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = listed.iter().position(|path| *path == self.0) {
            listed.swap_remove(at);
        }
    }
}

/// Starts the thread that removes the listed files on a signal, once per
/// process. Where a signal is not watched, the files are left as before
/// (named `.NAME.XXXXXX.partial`, and the module docs of
/// [`super::output_file`] say so).
#[cfg(target_os = "linux")]
fn watch() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static WATCHING: std::sync::Once = std::sync::Once::new();
    WATCHING.call_once(|| {
        let Some(ignored) = ignored_signals() else {
            return;
        };
        let watched: Vec<i32> = [SIGINT, SIGTERM, SIGHUP]
            .into_iter()
            .filter(|&signal| ignored & (1 << (signal - 1)) == 0)
            .collect();
        let Ok(mut signals) = signal_hook::iterator::Signals::new(watched) else {
            return;
        };
        let watcher = std::thread::Builder::new()
            .name("spyre-signals".to_owned())
            .spawn(move || {
                let Some(signal) = signals.forever().next() else {
                    return;
                };
                // Held until the process ends: no file is listed after this.
                let listed = LISTED.lock().unwrap_or_else(PoisonError::into_inner);
                for path in listed.iter() {
                    let _ = std::fs::remove_file(path);
                }
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                // Should the default action not end the process, end it as
                // a shell reports the signal.
                std::process::exit(128 + signal);
            });
        drop(watcher);
    });
}

/// The signals this process ignores, as the bit mask of `/proc`'s
/// `SigIgn` (bit `n - 1` for signal `n`), or `None` if it cannot be read.
#[cfg(target_os = "linux")]
fn ignored_signals() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))?;
    u64::from_str_radix(mask.trim(), 16).ok()
}

/// Elsewhere no signal is watched.
#[cfg(not(target_os = "linux"))]
fn watch() {}

//! Writing to the user: reports as text or one line of JSON on stdout, and
//! progress bars on a terminal.

use std::io::{self, IsTerminal as _};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde::ser::SerializeMap;

use crate::error::CliError;

/// Writes `text` to stdout. A closed pipe (`spyre info | head -1`) is not an
/// error.
///
/// # Errors
/// [`CliError::Failed`] when stdout cannot be written for another reason.
pub(crate) fn emit(text: &str) -> Result<(), CliError> {
    let mut stdout = io::stdout().lock();
    match write_all_waiting(&mut stdout, text.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(CliError::Failed(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

/// Writes all of `bytes` to `out` and flushes it, waiting while `out` is
/// full where it does not block (a non-blocking pipe a parent process gave
/// as standard output, whose reader is behind: the write would otherwise
/// fail half-way with `WouldBlock`).
///
/// # Errors
/// `out`'s, but `WouldBlock` and `Interrupted`, which are retried.
pub(crate) fn write_all_waiting(out: &mut dyn io::Write, mut bytes: &[u8]) -> io::Result<()> {
    let wait = || std::thread::sleep(std::time::Duration::from_millis(1));
    while !bytes.is_empty() {
        match out.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = &bytes[written..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    loop {
        match out.flush() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            flushed => return flushed,
        }
    }
}

/// `value` as one line of JSON.
///
/// # Errors
/// [`CliError::Failed`] if it cannot be serialized.
pub(crate) fn to_json_line<T: Serialize>(value: &T) -> Result<String, CliError> {
    serde_json::to_string(value)
        .map(|mut line| {
            line.push('\n');
            line
        })
        .map_err(|e| CliError::Failed(format!("cannot serialize the report as JSON: {e}")))
}

/// `value` with three decimals, or with four significant digits where
/// three decimals would show it as 0.000 (a one-byte copy's GB/s, a slow
/// run's throughput): `1.500`, `8.580e-6`.
pub(crate) fn format_figure(value: f64) -> String {
    if value != 0.0 && value.abs() < 1e-3 {
        format!("{value:.3e}")
    } else {
        format!("{value:.3}")
    }
}

/// Name/value pairs that serialize as a JSON object in their given order.
#[derive(Clone, Debug, Default)]
pub(crate) struct OrderedMap<V>(pub(crate) Vec<(String, V)>);

impl<V: Serialize> Serialize for OrderedMap<V> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in &self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// A progress bar of `len` steps drawn with `template` on stderr when it is
/// a terminal; hidden otherwise, so that a log or a pipe gets no bar. (With
/// `--json` the report goes to stdout, which the bar never touches.)
pub(crate) fn progress_bar(len: u64, template: &str) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most 3 bytes a call and refuses every other
    /// call, and every other flush, with `WouldBlock` (a full non-blocking
    /// pipe) or `Interrupted`.
    struct Reluctant {
        written: Vec<u8>,
        calls: usize,
        flushes: usize,
    }

    impl io::Write for Reluctant {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.calls += 1;
            match self.calls % 4 {
                1 => Err(io::ErrorKind::WouldBlock.into()),
                3 => Err(io::ErrorKind::Interrupted.into()),
                _ => {
                    let taken = bytes.len().min(3);
                    self.written.extend_from_slice(&bytes[..taken]);
                    Ok(taken)
                }
            }
        }

        fn flush(&mut self) -> io::Result<()> {
            self.flushes += 1;
            if self.flushes == 1 {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn a_writer_that_would_block_gets_everything_in_order() {
        let mut out = Reluctant {
            written: Vec::new(),
            calls: 0,
            flushes: 0,
        };
        write_all_waiting(&mut out, b"the whole report\n").unwrap();
        assert_eq!(out.written, b"the whole report\n");
        assert_eq!(out.flushes, 2, "flushed again after WouldBlock");
    }

    #[test]
    fn a_figure_below_a_thousandth_keeps_its_digits() {
        assert_eq!(format_figure(1.5), "1.500");
        assert_eq!(format_figure(0.0), "0.000");
        assert_eq!(format_figure(0.001), "0.001");
        assert_eq!(format_figure(4.1e-6), "4.100e-6");
        assert_eq!(format_figure(-2.5e-4), "-2.500e-4");
    }

    #[test]
    fn ordered_map_keeps_order() {
        let map = OrderedMap(vec![("b".to_string(), 1), ("a".to_string(), 2)]);
        assert_eq!(serde_json::to_string(&map).unwrap(), r#"{"b":1,"a":2}"#);
    }
}

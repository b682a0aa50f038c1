//! Writing to the user: reports as text or one line of JSON on stdout, and
//! progress bars on a terminal.

use std::io::{self, IsTerminal as _, Write as _};

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
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(CliError::Failed(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
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

    #[test]
    fn ordered_map_keeps_order() {
        let map = OrderedMap(vec![("b".to_string(), 1), ("a".to_string(), 2)]);
        assert_eq!(serde_json::to_string(&map).unwrap(), r#"{"b":1,"a":2}"#);
    }
}

//! A file `spyre run` writes when the run ends (`--trace`, `--timeline`),
//! created once every check has passed and before the work starts: a path
//! that cannot be written is refused before any work, as a bad argument,
//! not after minutes of it, and a refused run leaves no file behind.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::CliError;

/// An output file created (empty) before the run, written once after it.
#[derive(Debug)]
pub(crate) struct OutputFile {
    path: PathBuf,
    file: File,
    /// Whether this run created the file (it did not exist before).
    created: bool,
}

impl OutputFile {
    /// Creates (or truncates) the file at `path`, given with `flag`.
    ///
    /// # Errors
    /// [`CliError::Usage`] naming the flag, the path and the reason when
    /// the file cannot be created (a directory that does not exist, no
    /// permission, a directory at that path).
    pub(crate) fn create(flag: &str, path: &Path) -> Result<Self, CliError> {
        let created = !path.exists();
        let file = File::create(path).map_err(|e| {
            CliError::Usage(format!(
                "{flag} {}: cannot create the file: {e}; give the path of a file (not a directory) that you may write, in a directory that exists",
                path.display()
            ))
        })?;
        Ok(Self {
            path: path.to_owned(),
            file,
            created,
        })
    }

    /// The path the file was created at.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents`, `what` the file holds, and closes the file.
    ///
    /// # Errors
    /// [`CliError::Failed`] naming `what` and the path when the write fails
    /// (a full disk, say).
    pub(crate) fn write(mut self, what: &str, contents: &[u8]) -> Result<(), CliError> {
        self.file.write_all(contents).map_err(|e| {
            CliError::Failed(format!(
                "cannot write the {what} to {}: {e}",
                self.path.display()
            ))
        })
    }

    /// Removes the file again if this run created it (a run refused after
    /// creating it leaves nothing behind); a file that existed stays, empty.
    pub(crate) fn discard(self) {
        if self.created {
            drop(self.file);
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Refuses the same file given to `--trace` and `--timeline` (as written,
/// or after making both paths absolute): the second write would land on
/// the first.
///
/// # Errors
/// [`CliError::Usage`] naming the path.
pub(crate) fn check_distinct(trace: &Path, timeline: &Path) -> Result<(), CliError> {
    let same = trace == timeline
        || matches!(
            (std::path::absolute(trace), std::path::absolute(timeline)),
            (Ok(a), Ok(b)) if a == b
        );
    if same {
        return Err(CliError::Usage(format!(
            "--trace and --timeline both name {}; give each its own file",
            timeline.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("spyre-output-file-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_path_in_a_missing_directory_is_refused_naming_the_flag_and_the_path() {
        let err = OutputFile::create("--trace", Path::new("/nonexistent/dir/x.json")).unwrap_err();
        assert!(matches!(err, CliError::Usage(_)), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with("--trace /nonexistent/dir/x.json: cannot create the file: "),
            "{message}"
        );
    }

    #[test]
    fn the_file_is_created_at_once_and_written_whole_at_the_end() {
        let path = scratch("written.json");
        let file = OutputFile::create("--trace", &path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        file.write("trace", b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_device_that_cannot_sync_takes_the_write() {
        OutputFile::create("--trace", Path::new("/dev/null"))
            .unwrap()
            .write("trace", b"{}")
            .unwrap();
    }

    #[test]
    fn a_discarded_file_is_removed_only_if_the_run_created_it() {
        let fresh = scratch("fresh.json");
        OutputFile::create("--trace", &fresh).unwrap().discard();
        assert!(!fresh.exists());
        let old = scratch("old.json");
        std::fs::write(&old, b"old").unwrap();
        OutputFile::create("--trace", &old).unwrap().discard();
        assert!(old.exists());
        std::fs::remove_file(&old).unwrap();
    }

    #[test]
    fn the_same_file_for_both_outputs_is_refused() {
        let err = check_distinct(Path::new("run.svg"), Path::new("./run.svg")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--trace and --timeline both name ./run.svg; give each its own file"
        );
        check_distinct(Path::new("run.json"), Path::new("run.svg")).unwrap();
    }
}

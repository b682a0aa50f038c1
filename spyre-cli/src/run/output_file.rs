//! A file `spyre run` writes when the run ends (`--trace`, `--timeline`),
//! created before the run starts: a path that cannot be written is refused
//! before any work, as a bad argument, not after minutes of it.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::CliError;

/// An output file created (empty) before the run, written once after it.
#[derive(Debug)]
pub(crate) struct OutputFile {
    path: PathBuf,
    file: File,
}

impl OutputFile {
    /// Creates (or truncates) the file at `path`, given with `flag`.
    ///
    /// # Errors
    /// [`CliError::Usage`] naming the flag, the path and the reason when
    /// the file cannot be created (a directory that does not exist, no
    /// permission, a directory at that path).
    pub(crate) fn create(flag: &str, path: &Path) -> Result<Self, CliError> {
        let file = File::create(path).map_err(|e| {
            CliError::Usage(format!(
                "{flag} {}: cannot create the file: {e}; give a path in a directory that exists and that you may write",
                path.display()
            ))
        })?;
        Ok(Self {
            path: path.to_owned(),
            file,
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
        self.file
            .write_all(contents)
            .and_then(|()| self.file.sync_all())
            .map_err(|e| {
                CliError::Failed(format!(
                    "cannot write the {what} to {}: {e}",
                    self.path.display()
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let path =
            std::env::temp_dir().join(format!("spyre-output-file-{}.json", std::process::id()));
        let file = OutputFile::create("--trace", &path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        file.write("trace", b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        std::fs::remove_file(&path).unwrap();
    }
}

//! A file `spyre run` writes when the run ends (`--trace`, `--timeline`),
//! prepared once every check has passed and before the work starts: a path
//! that cannot be written is refused before any work, as a bad argument,
//! not after minutes of it, and a refused run leaves no file behind.
//!
//! The contents go to a new file beside the target, which replaces the
//! target only once it is written whole: a run that is interrupted (Ctrl-C,
//! a kill) leaves the target as it was, never empty or half written (and
//! an empty hidden `.NAME.PID.part` beside it, which nothing reads). A
//! target that is not a regular file (`/dev/null`, a pipe) is written in
//! place; a symbolic link is followed, and the file it names is replaced.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::CliError;

/// An output file prepared before the run, written once after it.
#[derive(Debug)]
pub(crate) struct OutputFile {
    /// The path as given, for messages.
    path: PathBuf,
    file: File,
    /// Where `file` was made, when it replaces `target` once written.
    staged: Option<Staged>,
}

/// A file written beside its target, then renamed over it.
#[derive(Debug)]
struct Staged {
    part: PathBuf,
    target: PathBuf,
}

impl OutputFile {
    /// Prepares the file at `path`, given with `flag`: makes the new file
    /// beside it (or opens a target that is not a regular file).
    ///
    /// # Errors
    /// [`CliError::Usage`] naming the flag, the path and the reason when
    /// the file cannot be made (a directory that does not exist or that
    /// may not be written, a directory at that path).
    pub(crate) fn create(flag: &str, path: &Path) -> Result<Self, CliError> {
        let refused = |reason: String| {
            CliError::Usage(format!(
                "{flag} {}: cannot create the file: {reason}; give the path of a file (not a directory) that you may write, in a directory that exists",
                path.display()
            ))
        };
        let target = resolve(path).map_err(|e| refused(e.to_string()))?;
        match std::fs::metadata(&target) {
            Ok(meta) if meta.is_dir() => return Err(refused("it is a directory".to_owned())),
            Ok(meta) if !meta.is_file() => {
                let file = File::create(&target).map_err(|e| refused(e.to_string()))?;
                return Ok(Self {
                    path: path.to_owned(),
                    file,
                    staged: None,
                });
            }
            _ => {}
        }
        let name = target.file_name().unwrap_or_default().to_string_lossy();
        let part = target.with_file_name(format!(".{name}.{}.part", std::process::id()));
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&part)
            .map_err(|e| refused(e.to_string()))?;
        Ok(Self {
            path: path.to_owned(),
            file,
            staged: Some(Staged { part, target }),
        })
    }

    /// The path the file was given at.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents`, `what` the file holds, closes the file and puts
    /// it in the target's place.
    ///
    /// # Errors
    /// [`CliError::Failed`] naming `what` and the path when the write or
    /// the replacement fails (a full disk, say); the target is then left
    /// as it was, and the new file removed.
    pub(crate) fn write(mut self, what: &str, contents: &[u8]) -> Result<(), CliError> {
        let failed = |e: std::io::Error| {
            CliError::Failed(format!(
                "cannot write the {what} to {}: {e}",
                self.path.display()
            ))
        };
        let written = self.file.write_all(contents);
        let Some(staged) = &self.staged else {
            return written.map_err(failed);
        };
        let placed = written.and_then(|()| std::fs::rename(&staged.part, &staged.target));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&staged.part);
            return Err(failed(e));
        }
        Ok(())
    }

    /// Removes the new file (a run refused after preparing it leaves
    /// nothing behind, and the target as it was).
    pub(crate) fn discard(self) {
        if let Some(staged) = self.staged {
            drop(self.file);
            let _ = std::fs::remove_file(&staged.part);
        }
    }
}

/// `path` with symbolic links and `.`/`..` resolved: the file itself when
/// it exists, else its directory joined with its name.
fn resolve(path: &Path) -> std::io::Result<PathBuf> {
    if let Ok(resolved) = std::fs::canonicalize(path) {
        return Ok(resolved);
    }
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path names no file")
    })?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    Ok(std::fs::canonicalize(parent)?.join(name))
}

/// Refuses the same file given to `--trace` and `--timeline` (as written,
/// or once both paths are resolved: `..`, `.` and symbolic links): the
/// second write would replace the first.
///
/// # Errors
/// [`CliError::Usage`] naming the path.
pub(crate) fn check_distinct(trace: &Path, timeline: &Path) -> Result<(), CliError> {
    let same = trace == timeline
        || matches!(
            (resolve(trace), resolve(timeline)),
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
    use std::os::unix::fs::FileTypeExt;

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
    fn the_target_is_replaced_whole_at_the_end_and_untouched_before() {
        let path = scratch("written.json");
        std::fs::write(&path, b"old").unwrap();
        let file = OutputFile::create("--trace", &path).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"old",
            "untouched until the end"
        );
        file.write("trace", b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let fresh = scratch("fresh-written.json");
        OutputFile::create("--trace", &fresh)
            .unwrap()
            .write("trace", b"[]")
            .unwrap();
        assert_eq!(std::fs::read(&fresh).unwrap(), b"[]");
        for path in [path, fresh] {
            let leftovers = std::fs::read_dir(path.parent().unwrap())
                .unwrap()
                .filter_map(|entry| entry.ok())
                .filter(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    name.ends_with(".part")
                        && name.contains(&*path.file_name().unwrap().to_string_lossy())
                })
                .count();
            assert_eq!(leftovers, 0, "no new file left beside {}", path.display());
            std::fs::remove_file(&path).unwrap();
        }
    }

    #[test]
    fn a_device_that_cannot_sync_takes_the_write() {
        OutputFile::create("--trace", Path::new("/dev/null"))
            .unwrap()
            .write("trace", b"{}")
            .unwrap();
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device(),
            "written in place, not replaced"
        );
    }

    #[test]
    fn a_discarded_file_leaves_nothing_and_the_target_as_it_was() {
        let fresh = scratch("fresh.json");
        OutputFile::create("--trace", &fresh).unwrap().discard();
        assert!(!fresh.exists());
        let old = scratch("old.json");
        std::fs::write(&old, b"old").unwrap();
        OutputFile::create("--trace", &old).unwrap().discard();
        assert_eq!(std::fs::read(&old).unwrap(), b"old");
        std::fs::remove_file(&old).unwrap();
    }

    #[test]
    fn a_directory_is_refused() {
        let err = OutputFile::create("--trace", &std::env::temp_dir()).unwrap_err();
        assert!(err.to_string().contains("it is a directory"), "{err}");
    }

    #[test]
    fn the_same_file_for_both_outputs_is_refused() {
        let err = check_distinct(Path::new("run.svg"), Path::new("./run.svg")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--trace and --timeline both name ./run.svg; give each its own file"
        );
        check_distinct(Path::new("run.json"), Path::new("run.svg")).unwrap();
        let dir = scratch("dir");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let through_parent = dir.join("sub/../same.svg");
        let err = check_distinct(&through_parent, &dir.join("same.svg")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--trace and --timeline both name"),
            "{err}"
        );
        let link = dir.join("link.svg");
        std::fs::write(dir.join("same.svg"), b"").unwrap();
        std::os::unix::fs::symlink(dir.join("same.svg"), &link).unwrap();
        assert!(
            check_distinct(&link, &dir.join("same.svg")).is_err(),
            "a link to it"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

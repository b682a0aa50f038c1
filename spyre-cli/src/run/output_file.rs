//! A file `spyre run` writes when the run ends (`--trace`, `--timeline`),
//! opened once every check has passed and before the work starts: a path
//! that cannot be written is refused before any work, as a bad argument,
//! not after minutes of it, and a refused run leaves no file behind.
//!
//! The file is opened without truncating it and its contents are replaced
//! whole: they are written to a new file beside it (the file a symbolic
//! link names, in its directory), given the file's mode, and renamed over
//! it once complete. So a run that is interrupted (Ctrl-C, a kill), even
//! while it writes, or whose write fails (a full disk) leaves a file that
//! existed as it was (a file the run created stays empty); a file removed
//! during the run is made again when the run writes it. A signal that
//! ends the process during the write removes the new file's part
//! ([`super::interrupt`]; on Linux, for `SIGINT`, `SIGTERM` and `SIGHUP`
//! unless the process started with them ignored); elsewhere, and for a
//! kill that cannot be caught, it may stay, named `.NAME.XXXXXX.partial`,
//! beside the file. The file's owner becomes the user
//! who ran, and other hard links to it keep the old contents. The write is
//! made in place (the file emptied, then written, under an exclusive
//! `flock`, so that processes doing so at once write one after the other;
//! a lock another open file keeps is waited for at most 10 s, then the
//! file is written without it, with a warning)
//! where no file can be made beside it (a directory the user may not write
//! to) or renamed over it (a bind-mounted file), for a device or a pipe,
//! and for a path under `/dev` (but `/dev/shm`) or `/proc`. What this
//! process's standard output or error is (`/dev/stdout` redirected to a
//! file is that file, a log that other processes may share; or a pipe, or
//! a terminal) is neither replaced nor emptied: the contents, and a
//! newline, go through that stream, after what was written to it before,
//! as the run's own output does (waiting while a non-blocking one is
//! full), in one write (built whole in memory first), so that ranks
//! appending to one log keep their contents whole
//! (up to the 2 GiB Linux takes in one write: a larger one is written in
//! parts, which another process's write may come between; and a pipe
//! keeps only writes of up to 4 KiB, `PIPE_BUF`, whole: ranks sharing one
//! pipe, a launcher's output, say, can cut into each other's contents,
//! so give each rank a file of its own, [`expand`]).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::interrupt::RemovedOnSignal;
use crate::error::CliError;
use crate::output::write_all_waiting;

/// An output file opened before the run, written once after it.
#[derive(Debug)]
pub(crate) struct OutputFile {
    /// The flag the path was given with, for messages.
    flag: &'static str,
    path: PathBuf,
    file: File,
    /// The file this run created (it did not exist before), symbolic links
    /// resolved: what a discard removes (the file, not a link to it).
    created: Option<PathBuf>,
}

impl OutputFile {
    /// Opens (or creates) the file at `path`, given with `flag`, without
    /// truncating it.
    ///
    /// # Errors
    /// [`CliError::Usage`] naming the flag, the path and the reason when
    /// the file cannot be opened for writing (a directory that does not
    /// exist, no permission, a directory at that path).
    pub(crate) fn create(flag: &'static str, path: &Path) -> Result<Self, CliError> {
        let refused = |reason: String| {
            CliError::Usage(format!(
                "{flag} {}: cannot create the file: {reason}; give the path of a file (not a directory) that you may write, in a directory that exists",
                path.display()
            ))
        };
        if path.is_dir() {
            return Err(refused("it is a directory".to_owned()));
        }
        if is_socket(path) {
            // Opened by path, a socket is `ENXIO`, "no such device or
            // address", which says nothing of what to do.
            return Err(CliError::Usage(format!(
                "{flag} {}: it is a socket (standard output under a service manager's journal, say), which cannot be opened by path; give a file, or redirect standard output to a file or a pipe",
                path.display()
            )));
        }
        let existed = path.exists();
        let file = open(flag, path).map_err(|e| refused(e.to_string()))?;
        let created =
            (!existed).then(|| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned()));
        Ok(Self {
            flag,
            path: path.to_owned(),
            file,
            created,
        })
    }

    /// The path the file was given at.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the file's contents with `contents`, `what` the file
    /// holds (see the module docs), and closes it.
    ///
    /// # Errors
    /// [`CliError::Failed`] naming `what` and the path when the write fails
    /// (a full disk, say).
    pub(crate) fn write(self, what: &str, contents: &[u8]) -> Result<(), CliError> {
        self.write_with(what, |out| out.write_all(contents))
    }

    /// Replaces the file's contents with what `contents` writes into it
    /// through a buffer, so that nothing needs to be built whole in memory
    /// first (see the module docs), and closes it; returns what `contents`
    /// returned. `what` names what the file holds.
    ///
    /// # Errors
    /// [`CliError::Failed`] naming `what` and the path when the write fails
    /// (a full disk, say); the file is then as it was, unless it was
    /// written in place.
    pub(crate) fn write_with<T>(
        self,
        what: &str,
        contents: impl FnOnce(&mut dyn Write) -> std::io::Result<T>,
    ) -> Result<T, CliError> {
        let Self {
            flag, path, file, ..
        } = self;
        let named = Named { flag, path: &path };
        let failed = |e: std::io::Error| {
            CliError::Failed(format!(
                "cannot write the {what} to {}: {e}",
                path.display()
            ))
        };
        let mut file = file;
        let mut meta = file.metadata().ok();
        if meta.as_ref().is_some_and(|meta| is_gone_from(meta, &path)) {
            // The path no longer names the file opened at the start
            // (removed, or moved away): written there, the contents would
            // be lost with it, or land in the file moved away (a trace the
            // user kept). The path is opened again, as at the start: another
            // file put there (by a rank given the same path that ended
            // first, an editor's save) is replaced, as it would have been
            // anyway; a file removed is made again.
            let reopened = if is_fifo(&path) {
                // Its reader is not waited for now, after the run.
                Err(std::io::Error::other("it is now a FIFO"))
            } else {
                open(flag, &path)
            };
            file = reopened.map_err(|e| {
                CliError::Failed(format!(
                    "cannot write the {what} to {}: the file opened at the start was removed or moved during the run, and the path cannot be opened again: {e}",
                    path.display()
                ))
            })?;
            meta = file.metadata().ok();
        }
        if let Some(stream) = meta.as_ref().and_then(standard_stream) {
            return stream.write_with(contents).map_err(failed);
        }
        let regular = meta.filter(std::fs::Metadata::is_file);
        let replaced = regular
            .as_ref()
            .filter(|_| !names_a_system_file(&path))
            .and_then(|meta| Some((beside(&path).ok()?, meta.permissions())));
        let Some(((temp, target, listed), mode)) = replaced else {
            return write_in_place(&file, named, regular.is_some(), contents).map_err(failed);
        };
        let mut out = BufWriter::new(temp);
        let written = out
            .get_ref()
            .as_file()
            .set_permissions(mode)
            .and_then(|()| contents(&mut out))
            .and_then(|written| out.flush().map(|()| written))
            .map_err(failed)?;
        let temp = out.into_inner().map_err(|e| failed(e.into_error()))?;
        // With the new file listed for removal on a signal held: a signal
        // now cannot remove it between here and its rename, which the
        // fallback below would take for a refused rename and so empty the
        // file.
        listed.while_listed(|| {
            let Err(refused) = temp.persist(&target) else {
                return Ok(());
            };
            // The file cannot be renamed over (a bind-mounted file, another
            // user's file in a sticky directory): it takes the contents in
            // place, from the new file. If that fails too, both reasons are
            // told.
            let mut temp = refused.file;
            temp.seek(SeekFrom::Start(0))
                .and_then(|_| write_in_place(&file, named, true, |out| std::io::copy(&mut temp, out)))
                .map(drop)
                .map_err(|e| {
                    CliError::Failed(format!(
                        "cannot write the {what} to {}: renaming the written file over it failed ({}), and so did writing into it ({e})",
                        path.display(),
                        refused.error
                    ))
                })
        })?;
        Ok(written)
    }

    /// Whether `self` and `other` are one regular file (the same device
    /// and inode): reached through links that [`check_distinct`] cannot
    /// resolve before the files exist, such as a symbolic link to a file
    /// that the other flag's path then created. (A pipe or a terminal both
    /// name takes one write after the other: not refused.)
    #[cfg(unix)]
    pub(crate) fn is_same_file(&self, other: &Self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.file.metadata(), other.file.metadata()) {
            (Ok(a), Ok(b)) => {
                a.is_file() && b.is_file() && (a.dev(), a.ino()) == (b.dev(), b.ino())
            }
            _ => false,
        }
    }

    /// See the Unix version: elsewhere only paths are told apart.
    #[cfg(not(unix))]
    pub(crate) fn is_same_file(&self, _: &Self) -> bool {
        false
    }

    /// Removes the file again if this run created it (a run refused after
    /// opening it leaves nothing behind); a file that existed stays as it
    /// was.
    pub(crate) fn discard(self) {
        if let Some(created) = self.created {
            drop(self.file);
            let _ = std::fs::remove_file(created);
        }
    }
}

/// How long a write in place waits for another holder of the file's lock
/// before it writes without it ([`lock_for_writing`]).
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A file as the user named it: the flag and the path, for messages.
#[derive(Clone, Copy)]
struct Named<'a> {
    flag: &'a str,
    path: &'a Path,
}

/// Opens (or creates) `path`, given with `flag`, for writing, without
/// truncating it; a FIFO as [`open_fifo`] does.
fn open(flag: &str, path: &Path) -> std::io::Result<File> {
    let mut options = File::options();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    if let Some(opened) = open_fifo(flag, path, &options) {
        return opened;
    }
    #[cfg(not(unix))]
    let _ = flag;
    options.open(path)
}

/// Opens `path` with `options` if it names a FIFO (named pipe) that is not
/// this process's standard output or error (written through the stream,
/// not this descriptor: on systems where opening `/dev/fd/1` duplicates
/// it, a change of its flags here would change the stream's). A FIFO that
/// no process has open for reading would block the open until one does:
/// that is said on standard error, naming `flag` and the path, and then
/// waited for (`mkfifo trace; spyre run --trace trace` with `cat trace`
/// started after it), so that a run waiting for its reader does not look
/// hung. `None` for any other path.
#[cfg(unix)]
fn open_fifo(
    flag: &str,
    path: &Path,
    options: &std::fs::OpenOptions,
) -> Option<std::io::Result<File>> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_fifo() || standard_stream(&meta).is_some() {
        return None;
    }
    // Opened without blocking, a FIFO without a reader is `ENXIO`; with
    // one, the descriptor is made blocking again, as every other output's
    // is.
    let nonblocking = rustix::fs::OFlags::NONBLOCK.bits() as i32;
    let opened = match options.clone().custom_flags(nonblocking).open(path) {
        Ok(file) => rustix::io::ioctl_fionbio(&file, false)
            .map(|()| file)
            .map_err(std::io::Error::from),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NXIO.raw_os_error()) => {
            // Advice only: a closed stderr must not fail (or panic) the run.
            let _ = writeln!(
                std::io::stderr(),
                "warning: {flag} {}: a FIFO that no process reads yet; waiting for one to open it (start its reader, `cat {}` say, or give a file)",
                path.display(),
                path.display()
            );
            options.open(path)
        }
        Err(e) => Err(e),
    };
    Some(opened)
}

/// Empties `file`, `named`, if it is `regular`, writes what `contents`
/// writes into it through a buffer, and flushes it. A regular file is
/// locked ([`lock_for_writing`]) from before it is emptied until the write
/// is done, so that processes writing one file in place at once (the ranks
/// of a launch given one path in a directory they may not write to) write
/// it one after the other, each whole, instead of into each other.
fn write_in_place<T>(
    mut file: &File,
    named: Named<'_>,
    regular: bool,
    contents: impl FnOnce(&mut dyn Write) -> std::io::Result<T>,
) -> std::io::Result<T> {
    let locked = regular && lock_for_writing(file, named, LOCK_WAIT);
    if regular {
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
    }
    let mut out = BufWriter::new(file);
    let written = contents(&mut out)?;
    out.flush()?;
    // Closing the file releases the lock too; released here, as soon as
    // the contents are written.
    if locked {
        file.unlock()?;
    }
    Ok(written)
}

/// Takes an exclusive advisory lock (`flock`) on `file`, `named`, waiting
/// up to `wait` while another open file holds one; whether it holds it.
/// Where the file system has no such locks (`ENOLCK` on NFS without its
/// lock daemon, `EOPNOTSUPP`, say) it does not, and the write goes on
/// without; so it does after the wait (a lock kept by another process, or
/// by a descriptor of the same file this process inherited) and on another
/// error, each with a warning on standard error naming the flag and path.
fn lock_for_writing(file: &File, named: Named<'_>, wait: Duration) -> bool {
    let warn = |what: String| {
        // Advice only: a closed stderr must not fail (or panic) the run.
        let _ = writeln!(
            std::io::stderr(),
            "warning: {} {}: {what}; writing it without the lock (a process writing it at the same time can cut into it)",
            named.flag,
            named.path.display(),
        );
    };
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => return true,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                warn(format!(
                    "another open file of it (another process's, or one this process inherited) has held a lock on it for {} s",
                    wait.as_secs_f64()
                ));
                return false;
            }
            Err(std::fs::TryLockError::Error(e)) => {
                if !is_lock_unsupported(&e) {
                    warn(format!("it cannot be locked ({e})"));
                }
                return false;
            }
        }
    }
}

/// Whether `error`, from taking a lock, says the file system has no locks
/// (`ENOLCK`, `ENOSYS`, `EOPNOTSUPP`).
fn is_lock_unsupported(error: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        use rustix::io::Errno;
        if [Errno::NOLCK, Errno::NOSYS, Errno::OPNOTSUPP]
            .iter()
            .any(|errno| error.raw_os_error() == Some(errno.raw_os_error()))
        {
            return true;
        }
    }
    error.kind() == std::io::ErrorKind::Unsupported
}

/// Whether `path`, as given, names a file of the system's (under `/dev` or
/// `/proc`, as `/dev/stdout` does), written in place: it may stand for
/// another file (this process's standard output, redirected to a file),
/// which must not be replaced. `/dev/shm`, a file system for files like
/// any other (a common scratch directory of a node), is not one.
fn names_a_system_file(path: &Path) -> bool {
    (path.starts_with("/dev") && !path.starts_with("/dev/shm")) || path.starts_with("/proc")
}

/// This process's standard output or error.
#[derive(Clone, Copy)]
enum StandardStream {
    Output,
    Error,
}

impl StandardStream {
    /// Writes what `contents` writes, then a newline, through the stream
    /// (at its position, after what was written to it before; appended
    /// where it was opened for appending), as one write where the system
    /// takes it whole: built in memory first, so that processes appending
    /// to one log at once do not cut into each other's contents, and the
    /// run's report starts on a line of its own. A stream that would block
    /// (a non-blocking pipe whose reader is behind) is waited for
    /// ([`crate::output::write_all_waiting`]), as the report after it is.
    fn write_with<T>(
        self,
        contents: impl FnOnce(&mut dyn Write) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let mut whole = Vec::new();
        let written = contents(&mut whole)?;
        whole.push(b'\n');
        match self {
            Self::Output => write_all_waiting(&mut std::io::stdout().lock(), &whole)?,
            Self::Error => write_all_waiting(&mut std::io::stderr().lock(), &whole)?,
        }
        Ok(written)
    }
}

/// Whether `path` names (through links) the file, pipe or terminal this
/// process's standard output or error is, where a file's contents are
/// built whole before they are written ([`StandardStream::write_with`]).
pub(crate) fn is_standard_stream(path: &Path) -> bool {
    standard_stream_at(path).is_some()
}

/// What `path` names (through links), if it is this process's standard
/// output or error ([`standard_stream`]).
fn standard_stream_at(path: &Path) -> Option<std::fs::Metadata> {
    std::fs::metadata(path)
        .ok()
        .filter(|meta| standard_stream(meta).is_some())
}

/// Whether `path` names (through links) a FIFO.
#[cfg(unix)]
fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.file_type().is_fifo())
}

/// See the Unix version: elsewhere no path is known to be one.
#[cfg(not(unix))]
fn is_fifo(_: &Path) -> bool {
    false
}

/// Whether the regular file of `meta` (opened earlier at `path`) is no
/// longer the file `path` names: removed, moved away, or another put in
/// its place since it was opened.
#[cfg(unix)]
fn is_gone_from(meta: &std::fs::Metadata, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.is_file()
        && (meta.nlink() == 0
            || !std::fs::metadata(path)
                .is_ok_and(|now| (now.dev(), now.ino()) == (meta.dev(), meta.ino())))
}

/// See the Unix version: elsewhere a removal is not seen.
#[cfg(not(unix))]
fn is_gone_from(_: &std::fs::Metadata, _: &Path) -> bool {
    false
}

/// Whether `path` names (through links) a socket.
#[cfg(unix)]
fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.file_type().is_socket())
}

/// See the Unix version: elsewhere no path is known to be one.
#[cfg(not(unix))]
fn is_socket(_: &Path) -> bool {
    false
}

/// Whether `path` names (through links) this process's standard output or
/// error, and that is a pipe: written whole in one write, which a pipe
/// keeps whole only up to 4 KiB (`PIPE_BUF`).
#[cfg(unix)]
pub(crate) fn is_standard_stream_on_a_pipe(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    standard_stream_at(path).is_some_and(|meta| meta.file_type().is_fifo())
}

/// See the Unix version: elsewhere no path is known to be one.
#[cfg(not(unix))]
pub(crate) fn is_standard_stream_on_a_pipe(_: &Path) -> bool {
    false
}

/// Which of this process's standard output and error the file of `meta`
/// is (a file it was redirected to, a pipe, a terminal: named through
/// `/dev/stdout` or another symbolic link, say), if either. A device that
/// is not a terminal (`/dev/null`) is none: it keeps nothing to cut into,
/// and is written as it comes. (A socket cannot be opened by path, so a
/// path never names one here: it is refused when it is opened.)
#[cfg(unix)]
fn standard_stream(meta: &std::fs::Metadata) -> Option<StandardStream> {
    use std::io::IsTerminal;
    use std::os::fd::{AsFd, BorrowedFd};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let same = |fd: BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(File::from)
            .and_then(|file| file.metadata())
            .is_ok_and(|other| (other.dev(), other.ino()) == (meta.dev(), meta.ino()))
    };
    let (stream, terminal) = if same(std::io::stdout().as_fd()) {
        (StandardStream::Output, std::io::stdout().is_terminal())
    } else if same(std::io::stderr().as_fd()) {
        (StandardStream::Error, std::io::stderr().is_terminal())
    } else {
        return None;
    };
    let kind = meta.file_type();
    (kind.is_file() || kind.is_fifo() || terminal).then_some(stream)
}

/// See the Unix version: elsewhere only paths are told apart.
#[cfg(not(unix))]
fn standard_stream(_: &std::fs::Metadata) -> Option<StandardStream> {
    None
}

/// A new, empty file in the directory of the file `path` names (symbolic
/// links resolved), to be renamed over it, and that file's path; the new
/// file is removed should a signal end the process while the guard lives.
fn beside(path: &Path) -> std::io::Result<(tempfile::NamedTempFile, PathBuf, RemovedOnSignal)> {
    let target = std::fs::canonicalize(path)?;
    let dir = target.parent().unwrap_or(Path::new("/")).to_owned();
    let name = target
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    RemovedOnSignal::make(|| {
        let temp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(&dir)?;
        let made = temp.path().to_owned();
        Ok(((temp, target), made))
    })
    .map(|((temp, target), listed)| (temp, target, listed))
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

/// The placeholders an output path may hold: `{rank}`, replaced by the
/// process's rank in its launch (see [`super::launch::rank`]), `{pid}`, by
/// its process id, and `{device}`, by the logical device the run is on.
pub(crate) const PLACEHOLDERS: [&str; 3] = ["{rank}", "{pid}", "{device}"];

/// Whether `path` holds `placeholder`.
fn holds(path: &Path, placeholder: &str) -> bool {
    path.as_os_str().to_string_lossy().contains(placeholder)
}

/// Whether `path` holds `{rank}`, which needs the launcher's rank.
pub(crate) fn holds_rank(path: &Path) -> bool {
    holds(path, PLACEHOLDERS[0])
}

/// `path` with every placeholder in it ([`PLACEHOLDERS`]) replaced, for the
/// run of rank `rank` on logical device `device`: so that the ranks of a
/// launch, each given the same `--trace trace-{rank}.json`, write a file
/// each. The rest of the path is kept byte for byte.
pub(crate) fn expand(path: &Path, rank: u64, device: u8) -> PathBuf {
    let values = [
        (PLACEHOLDERS[0], rank.to_string()),
        (PLACEHOLDERS[1], std::process::id().to_string()),
        (PLACEHOLDERS[2], device.to_string()),
    ];
    #[cfg(unix)]
    {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let mut bytes = path.as_os_str().as_bytes().to_vec();
        for (placeholder, value) in &values {
            bytes = replace_all(&bytes, placeholder.as_bytes(), value.as_bytes());
        }
        PathBuf::from(std::ffi::OsString::from_vec(bytes))
    }
    #[cfg(not(unix))]
    {
        // Elsewhere a path that is not Unicode is kept as it is.
        let Some(text) = path.to_str() else {
            return path.to_owned();
        };
        let mut text = text.to_owned();
        for (placeholder, value) in &values {
            text = text.replace(placeholder, value);
        }
        PathBuf::from(text)
    }
}

/// `haystack` with every `from` in it, left to right, replaced by `to`.
#[cfg(unix)]
fn replace_all(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = haystack;
    while let Some(at) = rest.windows(from.len()).position(|window| window == from) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(to);
        rest = &rest[at + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Whether every process given `path` writes the one file, each replacing
/// the others' contents: it holds no placeholder ([`PLACEHOLDERS`]) and
/// names a file (or nothing yet), not this process's standard output or
/// error, a device or a pipe.
pub(crate) fn is_one_file_for_every_process(path: &Path) -> bool {
    if PLACEHOLDERS
        .iter()
        .any(|placeholder| holds(path, placeholder))
    {
        return false;
    }
    match std::fs::metadata(path) {
        Ok(meta) => meta.is_file() && standard_stream(&meta).is_none(),
        Err(_) => true,
    }
}

/// Refuses the same file given to `--trace` and `--timeline` (as written,
/// or once both paths are resolved: `..`, `.` and symbolic links): the
/// second write would land on the first.
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
        return Err(same_file(timeline));
    }
    Ok(())
}

/// The refusal of one file given to both `--trace` and `--timeline`.
pub(crate) fn same_file(timeline: &Path) -> CliError {
    CliError::Usage(format!(
        "--trace and --timeline both name {}; give each its own file",
        timeline.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(path: &Path) -> Named<'_> {
        Named {
            flag: "--trace",
            path,
        }
    }

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
    fn the_file_is_left_as_it_was_until_the_end_then_written_whole() {
        let path = scratch("written.json");
        std::fs::write(&path, b"old contents, longer than the new").unwrap();
        let file = OutputFile::create("--trace", &path).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"old contents, longer than the new",
            "untouched until the end"
        );
        file.write("trace", b"{}").unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{}",
            "emptied, then written"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_device_that_cannot_be_emptied_takes_the_write() {
        OutputFile::create("--trace", Path::new("/dev/null"))
            .unwrap()
            .write("trace", b"{}")
            .unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_write_that_fails_only_when_flushed_is_an_error_naming_the_path() {
        // `/dev/full` takes no byte: the buffered write fails at its flush.
        let err = OutputFile::create("--trace", Path::new("/dev/full"))
            .unwrap()
            .write_with("trace", |out| out.write_all(b"{}"))
            .unwrap_err();
        assert!(matches!(err, CliError::Failed(_)), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("cannot write the trace to /dev/full: "),
            "{err}"
        );
    }

    #[test]
    fn the_old_contents_stay_until_the_new_are_whole_and_a_failed_write_keeps_them() {
        let path = scratch("replaced.json");
        std::fs::write(&path, b"old").unwrap();
        // Interrupted while it writes: the file is still as it was.
        let seen = OutputFile::create("--trace", &path)
            .unwrap()
            .write_with("trace", |out| {
                out.write_all(&[b'x'; 100_000])?;
                out.flush()?;
                std::fs::read(&path)
            })
            .unwrap();
        assert_eq!(
            seen, b"old",
            "as it was while the new contents were written"
        );
        assert_eq!(std::fs::read(&path).unwrap(), vec![b'x'; 100_000]);
        // A write that fails half-way leaves the last whole contents.
        let err = OutputFile::create("--trace", &path)
            .unwrap()
            .write_with("trace", |out| {
                out.write_all(b"{\"half\":")?;
                Err::<(), _>(std::io::Error::other("disk full"))
            })
            .unwrap_err();
        assert!(err.to_string().ends_with("disk full"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![b'x'; 100_000]);
        let dir = path.parent().unwrap();
        let prefix = format!(".{}.", path.file_name().unwrap().to_string_lossy());
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "no partial file left: {left:?}");
        std::fs::remove_file(&path).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn the_files_mode_is_kept_and_a_symbolic_link_still_names_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("linked");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("trace.json");
        std::fs::write(&file, b"old").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        OutputFile::create("--trace", &link)
            .unwrap()
            .write("trace", b"new")
            .unwrap();
        assert!(
            link.symlink_metadata().unwrap().is_symlink(),
            "still a link"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `/dev/stdout` redirected to a file, `/proc/self/fd/N`: the file is
    /// written in place, not replaced, so the descriptor still names it.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_path_under_proc_is_written_in_place() {
        use std::os::unix::fs::MetadataExt;
        let path = scratch("through-proc.json");
        std::fs::write(&path, b"old contents").unwrap();
        let open = File::open(&path).unwrap();
        let inode = open.metadata().unwrap().ino();
        let through = PathBuf::from(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd;
            open.as_raw_fd()
        }));
        OutputFile::create("--trace", &through)
            .unwrap()
            .write("trace", b"{}")
            .unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().ino(),
            inode,
            "the same file"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn what_the_writer_returns_is_returned() {
        let path = scratch("returned.json");
        let written = OutputFile::create("--trace", &path)
            .unwrap()
            .write_with("trace", |out| out.write_all(b"[1]").map(|()| 3))
            .unwrap();
        assert_eq!(written, 3);
        assert_eq!(std::fs::read(&path).unwrap(), b"[1]");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_discarded_file_is_removed_only_if_the_run_created_it() {
        let fresh = scratch("fresh.json");
        OutputFile::create("--trace", &fresh).unwrap().discard();
        assert!(!fresh.exists());
        let old = scratch("old.json");
        std::fs::write(&old, b"old").unwrap();
        OutputFile::create("--trace", &old).unwrap().discard();
        assert_eq!(std::fs::read(&old).unwrap(), b"old", "as it was");
        std::fs::remove_file(&old).unwrap();
    }

    #[test]
    fn placeholders_are_replaced_wherever_they_are_and_the_rest_kept() {
        let pid = std::process::id();
        assert_eq!(
            expand(
                Path::new("/tmp/{device}/trace-{pid}-{device}-{rank}.json"),
                9,
                3
            ),
            PathBuf::from(format!("/tmp/3/trace-{pid}-3-9.json"))
        );
        assert_eq!(
            expand(Path::new("trace-{Rank}-{pid.json"), 1, 127),
            PathBuf::from("trace-{Rank}-{pid.json"),
            "not placeholders"
        );
        #[cfg(unix)]
        {
            assert_eq!(replace_all(b"{a}{a}x{a", b"{a}", b"1"), b"11x{a");
            use std::os::unix::ffi::OsStrExt;
            let raw = std::ffi::OsStr::from_bytes(b"\xff{device}\xfe");
            assert_eq!(
                expand(Path::new(raw), 0, 12).as_os_str().as_bytes(),
                b"\xff12\xfe",
                "bytes that are not Unicode are kept"
            );
        }
    }

    #[test]
    fn a_path_with_a_placeholder_or_naming_no_file_is_not_one_for_every_process() {
        let path = scratch("shared.json");
        assert!(is_one_file_for_every_process(&path), "not there yet");
        std::fs::write(&path, b"").unwrap();
        assert!(is_one_file_for_every_process(&path), "a file");
        std::fs::remove_file(&path).unwrap();
        assert!(!is_one_file_for_every_process(Path::new("t-{pid}.json")));
        assert!(!is_one_file_for_every_process(Path::new("t-{rank}.json")));
        assert!(!is_one_file_for_every_process(Path::new("t-{device}.json")));
        assert!(!is_one_file_for_every_process(Path::new("/dev/null")));
    }

    /// `/dev/stdout` and `/proc/self/fd/1` may stand for another file; a
    /// file under `/dev/shm` stands for itself, and is replaced whole.
    #[test]
    fn only_paths_that_may_stand_for_another_file_are_the_systems() {
        for path in ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "/dev/null"] {
            assert!(names_a_system_file(Path::new(path)), "{path}");
        }
        for path in [
            "/dev/shm/trace.json",
            "/tmp/trace.json",
            "trace.json",
            "/devices.json",
        ] {
            assert!(!names_a_system_file(Path::new(path)), "{path}");
        }
    }

    /// Two writers of one file in place, the second starting while the
    /// first is half-way: the second waits for the first's lock, so the
    /// file holds the second's contents whole. (Without the lock the
    /// second emptied the file under the first, which went on writing at
    /// its own offset: the second's bytes, zeros, then the first's rest.)
    #[cfg(unix)]
    #[test]
    fn writers_in_place_take_turns() {
        let path = scratch("in-place.json");
        std::fs::write(&path, b"").unwrap();
        let (first, second) = (
            File::options().write(true).open(&path).unwrap(),
            File::options().write(true).open(&path).unwrap(),
        );
        let (halfway, at_halfway) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                write_in_place(&first, named(&path), true, |out| {
                    out.write_all(&[b'a'; 1000])?;
                    out.flush()?;
                    halfway.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    out.write_all(&[b'a'; 1000])
                })
                .unwrap();
            });
            at_halfway.recv().unwrap();
            write_in_place(&second, named(&path), true, |out| out.write_all(b"second")).unwrap();
        });
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        std::fs::remove_file(&path).unwrap();
    }

    /// A lock another open file keeps is waited for, up to the wait, then
    /// written without: not a run stuck after its work for as long as
    /// another process keeps it.
    #[cfg(unix)]
    #[test]
    fn a_lock_kept_elsewhere_is_waited_for_a_while_only() {
        let path = scratch("kept-lock.json");
        std::fs::write(&path, b"").unwrap();
        let holder = File::options().write(true).open(&path).unwrap();
        holder.lock().unwrap();
        let file = File::options().write(true).open(&path).unwrap();
        let started = Instant::now();
        assert!(!lock_for_writing(
            &file,
            named(&path),
            Duration::from_millis(100)
        ));
        assert!(started.elapsed() >= Duration::from_millis(100));
        holder.unlock().unwrap();
        assert!(
            lock_for_writing(&file, named(&path), Duration::ZERO),
            "free now"
        );
        std::fs::remove_file(&path).unwrap();
    }

    /// A file removed during the run is made again when the run writes it,
    /// not written into the removed one (where the contents were lost and
    /// the run said they were written), one moved away is left as it was,
    /// and one renamed over replaced; one whose directory is gone too is an
    /// error saying so.
    #[cfg(unix)]
    #[test]
    fn a_file_removed_during_the_run_is_made_again() {
        let dir = scratch("removed");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.json");
        let file = OutputFile::create("--trace", &path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write("trace", b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let file = OutputFile::create("--trace", &path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let err = file.write("trace", b"{}").unwrap_err();
        assert_eq!(err.exit_code(), crate::error::EXIT_FAILURE);
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "cannot write the trace to {}: the file opened at the start was removed or moved during the run, and the path cannot be opened again: ",
                path.display()
            )),
            "{message}"
        );
        // Another file renamed over it (another rank's, given the same
        // path, that ended first) is replaced, as it was before removals
        // were handled (making the file anew, as a first version did,
        // failed here).
        std::fs::create_dir_all(&dir).unwrap();
        let file = OutputFile::create("--trace", &path).unwrap();
        let other = dir.join("other");
        std::fs::write(&other, b"the other rank's").unwrap();
        std::fs::rename(&other, &path).unwrap();
        file.write("trace", b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        // One moved away (a trace the user kept) is left as it was, and
        // the path gets the new contents.
        let file = OutputFile::create("--trace", &path).unwrap();
        std::fs::write(&path, b"the kept trace").unwrap();
        let kept = dir.join("kept.json");
        std::fs::rename(&path, &kept).unwrap();
        file.write("trace", b"{}").unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"the kept trace");
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        // A FIFO put in its place is not waited for after the run.
        let file = OutputFile::create("--trace", &path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success());
        let err = file.write("trace", b"{}").unwrap_err().to_string();
        assert!(
            err.ends_with("cannot be opened again: it is now a FIFO"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A FIFO whose reader is there is opened at once, and blocking, as
    /// every other output is: its write waits for the reader rather than
    /// failing when the pipe is full.
    #[cfg(unix)]
    #[test]
    fn a_fifo_with_a_reader_is_opened_at_once_and_blocking() {
        use rustix::fs::OFlags;
        use std::os::unix::fs::OpenOptionsExt;
        let path = scratch("fifo");
        let _ = std::fs::remove_file(&path);
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success());
        let mut reader = File::options()
            .read(true)
            .custom_flags(OFlags::NONBLOCK.bits() as i32)
            .open(&path)
            .unwrap();
        let file = OutputFile::create("--trace", &path).unwrap();
        assert!(
            !rustix::fs::fcntl_getfl(&file.file)
                .unwrap()
                .contains(OFlags::NONBLOCK)
        );
        file.write("trace", b"{}").unwrap();
        let mut read = String::new();
        std::io::Read::read_to_string(&mut reader, &mut read).unwrap();
        assert_eq!(read, "{}");
        std::fs::remove_file(&path).unwrap();
    }

    /// A socket (a service's standard output into its journal) is refused
    /// saying what it is and what to do, not with `ENXIO`'s "no such
    /// device or address".
    #[cfg(unix)]
    #[test]
    fn a_socket_is_refused_saying_so() {
        let path = scratch("socket");
        let _ = std::fs::remove_file(&path);
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = OutputFile::create("--trace", &path).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "--trace {}: it is a socket (standard output under a service manager's journal, say), which cannot be opened by path; give a file, or redirect standard output to a file or a pipe",
                path.display()
            )
        );
        std::fs::remove_file(&path).unwrap();
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
        #[cfg(unix)]
        {
            let link = dir.join("link.svg");
            std::fs::write(dir.join("same.svg"), b"").unwrap();
            std::os::unix::fs::symlink(dir.join("same.svg"), &link).unwrap();
            assert!(
                check_distinct(&link, &dir.join("same.svg")).is_err(),
                "a link to it"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

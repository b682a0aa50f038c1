//! Builds the C test libraries in `tests/c/` with the system C compiler.
//!
//! Every library is compiled with `$CC` (default `cc`) as
//! `-shared -fPIC -Wall -Wextra -Werror -I flex-sys/include`, into
//! `$CARGO_TARGET_TMPDIR/flex-sys-c/`. A file's name carries a hash of its
//! inputs (sources, header, flags, compiler), so a library is built once,
//! reused by later runs, and never overwritten with different contents while
//! another test process has it loaded. Files are written under a temporary
//! name and renamed into place, so concurrent test processes never see a
//! half-written library.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::ffi::OsString;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

const CRATE_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// The directory every test artefact goes into.
pub fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flex-sys-c");
    std::fs::create_dir_all(&dir).expect("create the test library directory");
    dir
}

/// A variant of `tests/c/flex_stub.c`.
#[derive(Default)]
pub struct Stub {
    defines: Vec<String>,
    flags: Vec<String>,
    link: Vec<PathBuf>,
}

impl Stub {
    /// The stub with no switches: a good library reporting the header's
    /// version.
    pub fn new() -> Stub {
        Stub::default()
    }

    /// Adds `-D<define>`.
    pub fn define(mut self, define: &str) -> Stub {
        self.defines.push(define.to_owned());
        self
    }

    /// Reports the packed version `FLEX_MAKE_API_VERSION(major, minor)`.
    pub fn version(self, major: u32, minor: u32) -> Stub {
        self.define(&format!(
            "FLEX_TEST_VERSION=FLEX_MAKE_API_VERSION({major},{minor})"
        ))
    }

    /// Leaves the function `symbol` out of the library.
    pub fn omit(self, symbol: &str) -> Stub {
        self.define(&format!("OMIT_{symbol}"))
    }

    /// Exports `symbol` as an absolute symbol of value 0 instead of the
    /// function (`-Wl,--defsym`): `dlsym` finds it and returns null.
    pub fn null(mut self, symbol: &str) -> Stub {
        self.flags.push(format!("-Wl,--defsym={symbol}=0"));
        self.omit(symbol)
    }

    /// Links against the shared library at `library`.
    pub fn link(mut self, library: &Path) -> Stub {
        self.link.push(library.to_owned());
        self
    }

    /// Compiles the library (or reuses an earlier build) and returns its
    /// absolute, canonical path.
    pub fn build(self) -> PathBuf {
        let args: Vec<OsString> = self
            .defines
            .iter()
            .map(|d| format!("-D{d}"))
            .chain(self.flags)
            .map(OsString::from)
            .collect();
        compile("flex_stub", "flex_stub.c", &args, &self.link)
    }
}

/// `tests/c/dependency.c` as a shared library with the soname
/// `libflextestdep.so`. A library linked against it records that name as a
/// dependency, and no directory on the search path holds such a file.
pub fn dependency_library() -> PathBuf {
    compile(
        "flextestdep",
        "dependency.c",
        &["-Wl,-soname,libflextestdep.so".into()],
        &[],
    )
}

/// Writes `contents` to `out_dir()/name` (atomically) and returns the path.
pub fn text_file(name: &str, contents: &str) -> PathBuf {
    let target = out_dir().join(name);
    publish(&target, |tmp| std::fs::write(tmp, contents));
    canonical(&target)
}

/// Makes `dir/name` a copy of `source` (atomically) and returns its
/// canonical path.
pub fn copy_as(source: &Path, dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).expect("create the directory");
    let target = dir.join(name);
    publish(&target, |tmp| std::fs::copy(source, tmp).map(drop));
    canonical(&target)
}

/// The canonical form of an existing path.
pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|e| panic!("canonicalize {}: {e}", path.display()))
}

/// Libraries already built by this process, by file name.
static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);

/// Compiles `tests/c/<source>` with `args` and the extra link `inputs` into
/// `out_dir()/lib<stem>-<hash>.so`; returns its canonical path.
fn compile(stem: &str, source: &str, args: &[OsString], inputs: &[PathBuf]) -> PathBuf {
    let compiler = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let include = Path::new(CRATE_DIR).join("include");
    let source = Path::new(CRATE_DIR).join("tests/c").join(source);

    let mut hasher = DefaultHasher::new();
    compiler.hash(&mut hasher);
    args.hash(&mut hasher);
    inputs.hash(&mut hasher);
    for file in [&source, &include.join("flex.h")].into_iter().chain(inputs) {
        std::fs::read(file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()))
            .hash(&mut hasher);
    }
    let file_name = format!("lib{stem}-{:016x}.so", hasher.finish());

    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(path) = built.get_or_insert_with(HashMap::new).get(&file_name) {
        return path.clone();
    }
    let target = out_dir().join(&file_name);
    publish(&target, |tmp| {
        let mut command = Command::new(&compiler);
        command
            .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(&include)
            .args(args)
            .arg("-o")
            .arg(tmp)
            .arg(&source)
            .args(inputs);
        let output = command.output().unwrap_or_else(|e| {
            panic!("cannot run the C compiler {compiler:?}: {e}; set CC to a C compiler")
        });
        if output.status.success() {
            Ok(())
        } else {
            panic!(
                "{command:?} failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
        }
    });
    let path = canonical(&target);
    built
        .get_or_insert_with(HashMap::new)
        .insert(file_name, path.clone());
    path
}

/// Creates `target` through `write(temporary)` and a rename, unless it
/// exists already.
fn publish(target: &Path, write: impl FnOnce(&Path) -> std::io::Result<()>) {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    if target.exists() {
        return;
    }
    let tmp = target.with_extension(format!(
        "tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    write(&tmp).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, target)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), target.display()));
}

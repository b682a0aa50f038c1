//! Errors of loading a flex runtime library.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::version::AbiVersion;

/// Why no usable flex runtime library could be loaded.
///
/// Every message says what was tried and what to do about it, so printing
/// the error with `{}` is enough for a user. The fields carry the same facts
/// for programs. Errors are plain data (`Clone`, `Eq`) and can be cached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The dynamic loader could not open `path`: the file is missing, is a
    /// directory, is not a shared library for this machine, or one of its
    /// dependencies (a library, or a symbol one of them must provide) cannot
    /// be found. The library is opened with immediate binding, so an
    /// unresolvable dependency is reported here and not at a later call.
    #[error(
        "cannot load the flex runtime library {}: {reason}. {}",
        path.display(),
        OpenAdvice(path)
    )]
    Open {
        /// The path or name that was passed to the dynamic loader.
        path: PathBuf,
        /// The dynamic loader's own description (`dlerror()`), or why the
        /// path was not passed to it (empty, or containing a NUL byte).
        reason: String,
    },

    /// `FLEX_RUNTIME_LIB` was set and the library it names cannot be used.
    /// The variable is used exactly as given: no other library is tried.
    #[error(
        "{variable}={value:?} names a library that cannot be used ({variable} is used as \
         given, nothing else is tried): {error}. Point {variable} at a flex runtime library, \
         e.g. {variable}=/path/to/libflex.so.{major}, or unset it to search the default names",
        major = AbiVersion::CURRENT.major
    )]
    Env {
        /// The name of the environment variable: `FLEX_RUNTIME_LIB`.
        variable: &'static str,
        /// Its value, as read from the environment.
        value: OsString,
        /// Why the library at that path was refused.
        error: Box<LoadError>,
    },

    /// `FLEX_RUNTIME_LIB` was not set, and the library the dynamic loader
    /// found under a default name was refused (ABI mismatch, missing or
    /// null symbol): which name found it, and why it was refused (naming
    /// the file).
    #[error(
        "the dynamic loader's search found {name} (FLEX_RUNTIME_LIB is not set), but it cannot be \
         used: {error}. To see where the search finds {name}, look in LD_LIBRARY_PATH's \
         directories and `ldconfig -p | grep libflex`"
    )]
    Searched {
        /// The default name the dynamic loader found the library under,
        /// for example `libflex.so.1`.
        name: String,
        /// Why the library was refused.
        error: Box<LoadError>,
    },

    /// `FLEX_RUNTIME_LIB` was not set and the dynamic loader could open none
    /// of the default names. A default name that opens but is then refused
    /// (ABI mismatch, missing symbol) is [`LoadError::Searched`] instead.
    #[error(
        "no flex runtime library found: tried {}. Install the flex runtime so that the dynamic \
         loader finds libflex.so.{major} (ldconfig, LD_LIBRARY_PATH), or set \
         FLEX_RUNTIME_LIB=/path/to/libflex.so.{major}",
        DisplayAttempts(attempts),
        major = AbiVersion::CURRENT.major
    )]
    NotFound {
        /// Every name tried, in order, with the dynamic loader's reason.
        attempts: Vec<Attempt>,
    },

    /// The library implements another major version of the flex ABI.
    #[error(
        "{} implements flex ABI {found}, but this program was built for flex ABI {expected}; \
         a different major version is not compatible. Install a flex runtime with ABI major \
         version {}, or point FLEX_RUNTIME_LIB at one, and start the program again (it keeps a \
         refused library loaded)",
        path.display(),
        expected.major
    )]
    AbiMismatch {
        /// The version this crate was built for ([`AbiVersion::CURRENT`]).
        expected: AbiVersion,
        /// The version the library reported.
        found: AbiVersion,
        /// The file that was loaded.
        path: PathBuf,
    },

    /// The library does not export a function that the ABI version it
    /// reports requires.
    #[error(
        "{} does not export `{symbol}`, which flex ABI {version} requires, so it is not a \
         complete flex runtime library (a stub, an older build, or another library). Install \
         a complete flex runtime, or point FLEX_RUNTIME_LIB at one, and start the program again \
         (it keeps a refused library loaded)",
        path.display()
    )]
    MissingSymbol {
        /// The name of the missing function, one of [`crate::REQUIRED_SYMBOLS`]
        /// or (for a library reporting ABI 1.1 or later)
        /// [`crate::ABI_1_1_SYMBOLS`].
        symbol: &'static str,
        /// The ABI version the library reported; 1.0, the first version,
        /// when the missing function is `flex_get_api_version` itself.
        version: AbiVersion,
        /// The file that was loaded.
        path: PathBuf,
    },

    /// The library exports a function of `flex.h` at address 0 (an
    /// absolute symbol, or an indirect function whose resolver returned
    /// null), where nothing can be called; in any ABI version.
    #[error(
        "{} exports `{symbol}` at address 0, where no function can be called, so it is not a \
         usable flex runtime library (a stub or a broken build). Install a complete flex \
         runtime, or point FLEX_RUNTIME_LIB at one, and start the program again (it keeps a \
         refused library loaded)",
        path.display()
    )]
    NullSymbol {
        /// The function, one of [`crate::REQUIRED_SYMBOLS`] or
        /// [`crate::ABI_1_1_SYMBOLS`].
        symbol: &'static str,
        /// The file that was loaded.
        path: PathBuf,
    },
}

/// A function of a later ABI minor version than the loaded library's: the
/// library loaded (it reports an older minor version), and the feature that
/// needs the function is unavailable with it.
///
/// Displays as, for example: "unsupported by this flex library (ABI 1.0):
/// `flex_event_create` was added in flex ABI 1.1, and /usr/lib/libflex.so.1
/// implements ABI 1.0; install a flex runtime with ABI 1.1 or later to use
/// it".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported by this flex library (ABI {version}): `{symbol}` was added in flex ABI \
     {added_in}, and {} implements ABI {version}; install a flex runtime with ABI {added_in} or \
     later to use it",
    path.display()
)]
pub struct MissingFunction {
    /// The function that is missing, for example `flex_event_create`.
    pub symbol: &'static str,
    /// The ABI version that added it.
    pub added_in: AbiVersion,
    /// The ABI version the library reported.
    pub version: AbiVersion,
    /// The file that was loaded.
    pub path: PathBuf,
}

/// One default library name that the loader tried, and why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The name passed to the dynamic loader, for example `libflex.so.1`.
    pub candidate: String,
    /// The dynamic loader's description of the failure (`dlerror()`).
    pub reason: String,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.candidate, self.reason)
    }
}

/// Formats attempts as `a (reason); b (reason)`.
struct DisplayAttempts<'a>(&'a [Attempt]);

/// What to do about [`LoadError::Open`] for `path`: a path with a `/` is
/// opened as given; a bare name is searched for by the dynamic loader,
/// not taken as a path (as `ldd NAME` would take it).
struct OpenAdvice<'a>(&'a Path);

impl fmt::Display for OpenAdvice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.0;
        if path.as_os_str().is_empty() {
            return f.write_str("Give the path of a flex runtime library");
        }
        let check = "is a shared library built for this machine, and that every library it \
                     needs can be found";
        if path.as_os_str().as_encoded_bytes().contains(&b'/') {
            write!(
                f,
                "Check that the file exists, {check} (`ldd {}` lists them)",
                path.display()
            )
        } else {
            write!(
                f,
                "A name without a `/` is searched for by the dynamic loader \
                 (LD_LIBRARY_PATH, the program's RUNPATH, the ldconfig cache, the default \
                 directories), not taken as a path: for a file in the current directory, give \
                 its path (./{}). If the loader found the file, check that it {check} (`ldd` on \
                 its path lists them)",
                path.display()
            )
        }
    }
}

impl fmt::Display for DisplayAttempts<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, attempt) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{attempt}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_names_the_path_and_the_reason() {
        let e = LoadError::Open {
            path: "/opt/flex/libflex.so.1".into(),
            reason: "/opt/flex/libflex.so.1: invalid ELF header".into(),
        };
        assert_eq!(
            e.to_string(),
            "cannot load the flex runtime library /opt/flex/libflex.so.1: \
             /opt/flex/libflex.so.1: invalid ELF header. Check that the file exists, is a \
             shared library built for this machine, and that every library it needs can be \
             found (`ldd /opt/flex/libflex.so.1` lists them)"
        );
    }

    #[test]
    fn open_of_a_bare_name_says_where_it_was_searched() {
        let e = LoadError::Open {
            path: "libflex-dev.so".into(),
            reason: "libflex-dev.so: cannot open shared object file: No such file or directory"
                .into(),
        };
        assert_eq!(
            e.to_string(),
            "cannot load the flex runtime library libflex-dev.so: libflex-dev.so: cannot open \
             shared object file: No such file or directory. A name without a `/` is searched \
             for by the dynamic loader (LD_LIBRARY_PATH, the program's RUNPATH, the ldconfig \
             cache, the default directories), not taken as a path: for a file in the current \
             directory, give its path (./libflex-dev.so). If the loader found the file, check \
             that it is a shared library built for this machine, and that every library it \
             needs can be found (`ldd` on its path lists them)"
        );
    }

    #[test]
    fn open_of_an_empty_path_asks_for_one() {
        let e = LoadError::Open {
            path: PathBuf::new(),
            reason: "the path is empty".into(),
        };
        assert_eq!(
            e.to_string(),
            "cannot load the flex runtime library : the path is empty. Give the path of a flex \
             runtime library"
        );
    }

    #[test]
    fn env_names_the_variable_its_value_and_the_cause() {
        let e = LoadError::Env {
            variable: "FLEX_RUNTIME_LIB",
            value: "/nope/libflex.so.1".into(),
            error: Box::new(LoadError::Open {
                path: "/nope/libflex.so.1".into(),
                reason: "no such file".into(),
            }),
        };
        let text = e.to_string();
        assert!(
            text.starts_with(
                "FLEX_RUNTIME_LIB=\"/nope/libflex.so.1\" names a library that cannot be used \
                 (FLEX_RUNTIME_LIB is used as given, nothing else is tried): cannot load the \
                 flex runtime library /nope/libflex.so.1: no such file."
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "Point FLEX_RUNTIME_LIB at a flex runtime library, e.g. \
                 FLEX_RUNTIME_LIB=/path/to/libflex.so.1, or unset it to search the default names"
            ),
            "{text}"
        );
    }

    #[test]
    fn not_found_lists_every_attempt_and_suggests_the_variable() {
        let e = LoadError::NotFound {
            attempts: vec![
                Attempt {
                    candidate: "libflex.so.1".into(),
                    reason: "libflex.so.1: cannot open shared object file".into(),
                },
                Attempt {
                    candidate: "libflex.so".into(),
                    reason: "libflex.so: cannot open shared object file".into(),
                },
            ],
        };
        assert_eq!(
            e.to_string(),
            "no flex runtime library found: tried libflex.so.1 (libflex.so.1: cannot open \
             shared object file); libflex.so (libflex.so: cannot open shared object file). \
             Install the flex runtime so that the dynamic loader finds libflex.so.1 (ldconfig, \
             LD_LIBRARY_PATH), or set FLEX_RUNTIME_LIB=/path/to/libflex.so.1"
        );
    }

    #[test]
    fn abi_mismatch_shows_both_versions_and_the_path() {
        let e = LoadError::AbiMismatch {
            expected: AbiVersion { major: 1, minor: 0 },
            found: AbiVersion { major: 2, minor: 0 },
            path: "/usr/lib/libflex.so.2".into(),
        };
        assert_eq!(
            e.to_string(),
            "/usr/lib/libflex.so.2 implements flex ABI 2.0, but this program was built for flex \
             ABI 1.0; a different major version is not compatible. Install a flex runtime with \
             ABI major version 1, or point FLEX_RUNTIME_LIB at one, and start the program again \
             (it keeps a refused library loaded)"
        );
    }

    #[test]
    fn missing_symbol_names_the_symbol_and_the_path() {
        let e = LoadError::MissingSymbol {
            symbol: "flex_launch_fill",
            version: AbiVersion { major: 1, minor: 0 },
            path: "/usr/lib/libflex.so.1".into(),
        };
        assert_eq!(
            e.to_string(),
            "/usr/lib/libflex.so.1 does not export `flex_launch_fill`, which flex ABI 1.0 \
             requires, so it is not a complete flex runtime library (a stub, an older build, or \
             another library). Install a complete flex runtime, or point FLEX_RUNTIME_LIB at one, \
             and start the program again (it keeps a refused library loaded)"
        );
    }

    #[test]
    fn null_symbol_names_the_function_and_address_0() {
        let e = LoadError::NullSymbol {
            symbol: "flex_event_create",
            path: "/usr/lib/libflex.so.1".into(),
        };
        assert_eq!(
            e.to_string(),
            "/usr/lib/libflex.so.1 exports `flex_event_create` at address 0, where no function can \
             be called, so it is not a usable flex runtime library (a stub or a broken build). \
             Install a complete flex runtime, or point FLEX_RUNTIME_LIB at one, and start the \
             program again (it keeps a refused library loaded)"
        );
    }

    #[test]
    fn missing_function_says_unsupported_and_names_symbol_and_versions() {
        let e = MissingFunction {
            symbol: "flex_event_create",
            added_in: AbiVersion { major: 1, minor: 1 },
            version: AbiVersion { major: 1, minor: 0 },
            path: "/usr/lib/libflex.so.1".into(),
        };
        assert_eq!(
            e.to_string(),
            "unsupported by this flex library (ABI 1.0): `flex_event_create` was added in flex \
             ABI 1.1, and /usr/lib/libflex.so.1 implements ABI 1.0; install a flex runtime with \
             ABI 1.1 or later to use it"
        );
    }
}

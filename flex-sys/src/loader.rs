//! Opening a flex runtime library at run time and checking it against `flex.h`.

use std::ffi::{CStr, OsStr, OsString, c_char, c_void};
use std::fmt;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use crate::bindings::FlexApi;
use crate::error::{Attempt, LoadError, MissingFunction};
use crate::symbols::{ABI_1_1_SYMBOLS, REQUIRED_SYMBOLS};
use crate::version::AbiVersion;

/// The environment variable that names the flex runtime library to load:
/// `FLEX_RUNTIME_LIB`. See [`FlexLibrary::load`].
pub const RUNTIME_LIB_ENV: &str = "FLEX_RUNTIME_LIB";

/// The names [`FlexLibrary::load`] tries when `FLEX_RUNTIME_LIB` is unset,
/// in order: the soname `libflex.so.<major>`, then `libflex.so`.
fn default_candidates() -> [String; 2] {
    [
        format!("libflex.so.{}", AbiVersion::CURRENT.major),
        "libflex.so".to_owned(),
    ]
}

/// A loaded flex runtime library whose ABI version and symbols have been
/// checked against `include/flex.h`.
///
/// Obtain one with [`FlexLibrary::load`] (the library the environment
/// selects) or [`FlexLibrary::open`] (an explicit path). Both hand out an
/// [`Arc`]; anything that calls into the library should hold a clone.
/// Function pointers copied out of [`FlexLibrary::api`] are valid only
/// while an `Arc` lives.
///
/// A library, once opened, stays loaded for the rest of the process: its
/// `dlopen` handle is never closed, after the last `Arc` is dropped too,
/// and also when the checks refuse it. Opening it ran its initialisers,
/// and a flex library may leave its own code to run after its last handle
/// is closed (threads it started, destructors it registered for the
/// threads that called it), so unmapping it under them would crash the
/// process. So for the rest of the process, opening the same name (or the
/// library's soname, or the same file by another path) again gives that
/// same library, even if the file has been replaced meanwhile: after a
/// refusal, a good library of the same soname is loaded by starting the
/// program again.
///
/// # Thread safety
///
/// `FlexLibrary` is `Send + Sync`. `flex.h` allows every function to be
/// called from any thread at the same time as any other; the only per-thread
/// state is the last-error message (see [`FlexLibrary::last_error_message`]).
///
/// # Trust
///
/// Loading a library runs its initialisation code, and calling it runs its
/// code: this crate can check that the file reports a compatible ABI version
/// and exports every function of `flex.h`, but not that those functions
/// behave as `flex.h` says. Only load files that are flex runtime libraries.
pub struct FlexLibrary {
    /// The resolved functions; owns the `dlopen` handle, never closed (so
    /// never dropped: what is given up with this value is the handle and,
    /// for a 1.0 library, the few small error texts of the 1.1 functions
    /// it lacks).
    api: ManuallyDrop<FlexApi>,
    /// The file that was loaded, as found by the dynamic loader.
    path: PathBuf,
    /// The version the library reported.
    version: AbiVersion,
    /// The default names tried before it that could not be opened
    /// ([`FlexLibrary::skipped`]).
    skipped: Vec<Attempt>,
}

// Compile-time proof of the thread-safety promise above.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FlexLibrary>();
};

impl FlexLibrary {
    /// Loads the flex runtime library that the environment selects.
    ///
    /// - If `FLEX_RUNTIME_LIB` is set to a non-empty value, exactly that
    ///   path is opened; nothing else is tried (empty means unset, as for
    ///   every variable of the workspace). On failure the error is
    ///   [`LoadError::Env`], which names the variable and its value and
    ///   carries the underlying error.
    /// - Otherwise the soname `libflex.so.<major>` (`libflex.so.1` for ABI
    ///   1.x) is tried first, then `libflex.so`, each searched by the dynamic
    ///   loader as `dlopen` does (`LD_LIBRARY_PATH`, the `ldconfig` cache,
    ///   the default directories). The first name the dynamic loader can open
    ///   decides: if it is then refused (ABI mismatch, missing symbol), the
    ///   error is [`LoadError::Searched`], naming the name and carrying
    ///   that error, and later names are not tried. If no name can be
    ///   opened the error is [`LoadError::NotFound`], listing each name with
    ///   the dynamic loader's reason.
    ///
    /// Each call opens the library afresh and checks it again; the dynamic
    /// loader shares one mapping between handles to the same file, and
    /// gives a library already loaded in the process (every one opened
    /// stays loaded: see [`FlexLibrary`]) for a name it was loaded by, for
    /// its soname, and for the same file by another path: so after
    /// `open("/opt/test/libflex.so.1")` of a library whose soname is
    /// `libflex.so.1`, `load()` gives that library again, not the one of
    /// the search path.
    ///
    /// # Errors
    ///
    /// [`LoadError::Env`], [`LoadError::NotFound`], or
    /// [`LoadError::Searched`] with the error of [`FlexLibrary::open`] for
    /// the default name that was opened.
    pub fn load() -> Result<Arc<FlexLibrary>, LoadError> {
        Self::load_from(std::env::var_os(RUNTIME_LIB_ENV))
    }

    /// [`FlexLibrary::load`] with the value of `FLEX_RUNTIME_LIB` given
    /// instead of read from the environment: `Some(path)` loads exactly
    /// `path`, `None` searches the default names, and so does `Some("")`
    /// (empty means unset, as for every variable of the workspace).
    ///
    /// For programs that take the value from their own configuration, and
    /// for tests (changing the environment of a running, threaded process is
    /// not sound).
    ///
    /// # Errors
    ///
    /// As [`FlexLibrary::load`]; errors for `Some(path)` are
    /// [`LoadError::Env`] and name `FLEX_RUNTIME_LIB`.
    pub fn load_from(env_value: Option<OsString>) -> Result<Arc<FlexLibrary>, LoadError> {
        if let Some(value) = env_value.filter(|value| !value.is_empty()) {
            return match Self::open_name(&value) {
                Ok(library) => Ok(Arc::new(library)),
                Err(error) => Err(LoadError::Env {
                    variable: RUNTIME_LIB_ENV,
                    value,
                    error: Box::new(error),
                }),
            };
        }
        let mut attempts = Vec::new();
        for candidate in default_candidates() {
            match Self::open_name(OsStr::new(&candidate)) {
                Ok(mut library) => {
                    library.skipped = attempts;
                    return Ok(Arc::new(library));
                }
                Err(LoadError::Open { reason, .. }) => attempts.push(Attempt { candidate, reason }),
                Err(refused) => {
                    return Err(LoadError::Searched {
                        name: candidate,
                        error: Box::new(refused),
                    });
                }
            }
        }
        Err(LoadError::NotFound { attempts })
    }

    /// Opens the flex runtime library at `path` and checks it. Never cached:
    /// every call opens it again, checks it and returns a new `Arc` (the
    /// dynamic loader gives the library already loaded by that name, if
    /// any: see [`FlexLibrary`]).
    ///
    /// Steps, each a distinct error:
    ///
    /// 1. `dlopen(path, RTLD_NOW | RTLD_LOCAL)`. Immediate binding makes a
    ///    missing dependency (a library, or a symbol a dependency should
    ///    provide) fail here rather than at the first call. Once opened, the
    ///    library stays loaded, whatever the checks below decide (see
    ///    [`FlexLibrary`]). A `path` without
    ///    a `/` is searched like any `dlopen` name; write `./name` for a file
    ///    in the current directory. An empty path, or one with a NUL byte, is
    ///    refused without calling `dlopen`.
    /// 2. `flex_get_api_version` is resolved and called before anything else,
    ///    and its major version must equal [`AbiVersion::CURRENT`]'s. Any
    ///    minor version, older or newer, is accepted.
    /// 3. Every function in [`crate::REQUIRED_SYMBOLS`] must be exported,
    ///    and, for a library reporting minor version 1 or later, every
    ///    function in [`crate::ABI_1_1_SYMBOLS`] too. A 1.0 library loads
    ///    without the 1.1 functions; [`FlexLibrary::require`] reports them
    ///    unsupported.
    ///
    /// No function of `flex.h` may be exported at address 0 (an absolute
    /// symbol, or an indirect function whose resolver returned null), in
    /// any version: nothing can be called there.
    ///
    /// # Errors
    ///
    /// - [`LoadError::Open`]: step 1 failed (missing file, a directory, not a
    ///   shared library, a wrong architecture, an unresolvable dependency);
    /// - [`LoadError::MissingSymbol`]: `flex_get_api_version` or another
    ///   function the reported version requires is not exported;
    /// - [`LoadError::NullSymbol`]: a function of `flex.h` is exported at
    ///   address 0;
    /// - [`LoadError::AbiMismatch`]: the library reports another major
    ///   version.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<FlexLibrary>, LoadError> {
        Self::open_name(path.as_ref().as_os_str()).map(Arc::new)
    }

    /// Implements [`FlexLibrary::open`] for a path or a bare library name.
    fn open_name(name: &OsStr) -> Result<FlexLibrary, LoadError> {
        let refuse = |reason: &str| LoadError::Open {
            path: PathBuf::from(name),
            reason: reason.to_owned(),
        };
        if name.is_empty() {
            // dlopen("") would return the main program instead of a library.
            return Err(refuse("the path is empty"));
        }
        if name.as_bytes().contains(&0) {
            return Err(refuse("the path contains a NUL byte"));
        }

        // SAFETY: `dlopen` is unsafe because it runs the library's
        // initialisers now and its finalisers at exit (the handle is never
        // closed: `ManuallyDrop` here and in `FlexLibrary`, so nothing the
        // initialisers started can outlive the code it runs, even if the
        // checks refuse the library), which may have any requirement. The
        // contract of this loader, stated on `FlexLibrary` ("Trust"), is
        // that the file is a flex runtime library, whose initialisers need
        // nothing from the caller.
        let handle = unsafe { Library::open(Some(name), RTLD_NOW | RTLD_LOCAL) }
            .map_err(|e| refuse(&e.to_string()))?
            .into_raw();
        // SAFETY: `handle` was returned by `dlopen` just above (through
        // `into_raw`, which gave up the `Library` without closing it), and
        // is turned back into a `Library` once, here.
        let library = ManuallyDrop::new(unsafe { Library::from_raw(handle) });
        let path = loaded_file(&library)
            .or_else(|| opened_file(handle))
            .unwrap_or_else(|| fallback_path(name));
        let refuse_export =
            |symbol: &'static str, version: AbiVersion| match export(&library, symbol) {
                Export::Found => None,
                Export::Missing => Some(LoadError::MissingSymbol {
                    symbol,
                    version,
                    path: path.clone(),
                }),
                Export::AtZero => Some(LoadError::NullSymbol {
                    symbol,
                    path: path.clone(),
                }),
            };

        // SAFETY: the type is the one `flex.h` declares,
        // `uint32_t flex_get_api_version(void)`, required in every ABI
        // version, read as an `Option` of the function pointer: an address
        // of 0 reads as `None` (the null pointer niche of `Option<fn>`),
        // never as a null function pointer. The function pointer is copied
        // out of the `Symbol` and used only below, while the library is
        // loaded (it always is from now on).
        let symbol = unsafe {
            library.get::<Option<unsafe extern "C" fn() -> u32>>(b"flex_get_api_version\0")
        };
        let get_version = match symbol.as_deref() {
            Ok(Some(get_version)) => *get_version,
            // The library reports no version without this call; every
            // version has it.
            Err(_) => {
                return Err(LoadError::MissingSymbol {
                    symbol: "flex_get_api_version",
                    version: AbiVersion { major: 1, minor: 0 },
                    path,
                });
            }
            Ok(None) => {
                return Err(LoadError::NullSymbol {
                    symbol: "flex_get_api_version",
                    path,
                });
            }
        };
        // SAFETY: `flex.h`: takes no arguments, has no preconditions, never
        // fails and needs no runtime. The library stays loaded.
        let found = AbiVersion::from_packed(unsafe { get_version() });
        if !AbiVersion::CURRENT.is_compatible_with(found) {
            return Err(LoadError::AbiMismatch {
                expected: AbiVersion::CURRENT,
                found,
                path,
            });
        }

        let required = |symbol: &&str| found.minor >= 1 || !ABI_1_1_SYMBOLS.contains(symbol);
        if let Some(refused) = REQUIRED_SYMBOLS
            .iter()
            .chain(ABI_1_1_SYMBOLS)
            .find_map(|&symbol| match refuse_export(symbol, found) {
                // A 1.0 library need not export the 1.1 functions, but
                // none may be at 0 (below).
                Some(LoadError::MissingSymbol { .. }) if !required(&symbol) => None,
                refused => refused,
            })
        {
            return Err(refused);
        }
        // SAFETY: `from_library` resolves every function with the signature
        // bindgen generated from `flex.h`; it is unsafe because a symbol's
        // type cannot be checked. The library has just reported the same
        // major ABI version as that header, which promises those signatures.
        // Every function of `flex.h` it exports is at an address other than
        // 0 (checked just above), so no field holds a null function
        // pointer, provided an indirect function's resolver gives the same
        // address at this second lookup as at the check, as resolvers,
        // which pick an implementation for the machine, do; a 1.0
        // library's 1.1 exports are never called (see
        // `FlexLibrary::require`). The handle moves into `FlexApi`, which
        // is never dropped: the function pointers stay valid for the rest
        // of the process.
        let api =
            unsafe { FlexApi::from_library(ManuallyDrop::into_inner(library)) }.map_err(|e| {
                LoadError::Open {
                    path: path.clone(),
                    reason: e.to_string(),
                }
            })?;
        Ok(FlexLibrary {
            api: ManuallyDrop::new(api),
            path,
            version: found,
            skipped: Vec::new(),
        })
    }

    /// The file that was loaded, as an absolute path with symbolic links
    /// resolved: for `libflex.so.1` found through the search path, for
    /// example `/usr/lib/x86_64-linux-gnu/libflex.so.1.4.2`.
    ///
    /// It is the file that defines the library's flex functions, as reported
    /// by `dladdr`, or, for a library that exports none of them (which the
    /// checks then refuse), the file the dynamic loader opened (its link
    /// map, with glibc). If the system cannot tell, it is the name that was
    /// opened.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The default names [`FlexLibrary::load`] tried before this library's
    /// and could not open, each with the dynamic loader's reason (a
    /// `libflex.so.1` that is missing, or not a library this process can
    /// load, before a `libflex.so` that was loaded); empty for a library
    /// named by path or found by the first name.
    #[must_use]
    pub fn skipped(&self) -> &[Attempt] {
        &self.skipped
    }

    /// The ABI version the library reported through `flex_get_api_version`.
    /// Its major version equals [`AbiVersion::CURRENT`]'s; its minor version
    /// may be older or newer.
    #[must_use]
    pub fn version(&self) -> AbiVersion {
        self.version
    }

    /// Whether the library provides `symbol`: every ABI 1.0 function does;
    /// an ABI 1.1 function ([`crate::ABI_1_1_SYMBOLS`]: events and
    /// capabilities) only when the library reports minor version 1 or later
    /// (the loader then checked that it exports all of them). A 1.0 library's
    /// exports of those names are not used: their behaviour is not promised.
    ///
    /// # Errors
    ///
    /// [`MissingFunction`] naming `symbol`, the version that added it, and
    /// the library's version and path ("unsupported by this flex library
    /// (ABI 1.0)"). Call this before any ABI 1.1 method of
    /// [`FlexLibrary::api`].
    pub fn require(&self, symbol: &'static str) -> Result<(), MissingFunction> {
        if self.version.minor >= 1 || !ABI_1_1_SYMBOLS.contains(&symbol) {
            return Ok(());
        }
        Err(MissingFunction {
            symbol,
            added_in: AbiVersion { major: 1, minor: 1 },
            version: self.version,
            path: self.path.clone(),
        })
    }

    /// The library's functions.
    ///
    /// Every ABI 1.0 field of the returned [`FlexApi`] is `Ok`, and every
    /// ABI 1.1 field is `Ok` when the library reports 1.1 or later: each symbol
    /// was resolved and checked when the library was loaded. So the
    /// generated methods (`api.flex_get_device_count(..)` and so on) can
    /// never reach the `expect` inside them, provided an ABI 1.1 method is
    /// called only after [`FlexLibrary::require`] returned `Ok` for it. They
    /// remain `unsafe`: each call must follow the rules `flex.h` documents
    /// for that function (valid pointers and handles, thread restrictions,
    /// lifetimes of buffers).
    ///
    /// The function pointers are valid as long as this `FlexLibrary` is
    /// alive; keep an `Arc<FlexLibrary>` next to anything that uses them.
    #[must_use]
    pub fn api(&self) -> &FlexApi {
        &self.api
    }

    /// The calling thread's last-error message from
    /// `flex_get_last_error_message`, copied at once into a `String`.
    ///
    /// The message is per thread and is replaced by the next failing flex call
    /// on that thread, so call this on the same thread right after the call
    /// that failed, before any other flex call. A null pointer from the
    /// library gives an empty string; bytes that are not UTF-8 are replaced
    /// with U+FFFD.
    #[must_use]
    pub fn last_error_message(&self) -> String {
        let Ok(get_message) = &self.api.flex_get_last_error_message else {
            return String::new();
        };
        // SAFETY: `flex.h`: no arguments, no preconditions, callable from any
        // thread. The library stays loaded while `self` is borrowed.
        let message = unsafe { get_message() };
        // SAFETY: `flex.h` promises a NUL-terminated string that stays valid
        // until the next flex call on this thread; it is copied here, before
        // any other flex call.
        unsafe { copy_c_string(message) }
    }

    /// The library's name for a status code from `flex_status_string`, for
    /// example `"FLEX_ERROR_NO_DEVICE"`; an unknown code gives
    /// `"FLEX_UNKNOWN_STATUS"` (the library's text, copied). A null pointer
    /// from the library gives an empty string; bytes that are not UTF-8 are
    /// replaced with U+FFFD. Callable from any thread.
    #[must_use]
    pub fn status_string(&self, status: i32) -> String {
        let Ok(status_string) = &self.api.flex_status_string else {
            return String::new();
        };
        // SAFETY: `flex.h`: any status value is allowed, there are no other
        // preconditions. The library stays loaded while `self` is borrowed.
        let name = unsafe { status_string(status) };
        // SAFETY: `flex.h` promises a static NUL-terminated string that lives
        // as long as the library is loaded, which it is during the copy.
        unsafe { copy_c_string(name) }
    }
}

impl fmt::Debug for FlexLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlexLibrary")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Copies a C string into a `String`: null gives `""`, invalid UTF-8 is
/// replaced lossily.
///
/// # Safety
///
/// `ptr` is null or points to a NUL-terminated string that stays valid and
/// unchanged during this call.
unsafe fn copy_c_string(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: non-null, and NUL-terminated and valid by this function's
    // contract.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// The file that defines the first of the flex functions that `library`
/// resolves, canonicalized; `None` if the system cannot tell.
fn loaded_file(library: &Library) -> Option<PathBuf> {
    REQUIRED_SYMBOLS.iter().find_map(|name| {
        // SAFETY: the symbol is read as a plain address (`*mut c_void`, the
        // type `dlsym` itself returns); it is never called or dereferenced.
        let address = unsafe { library.get::<*mut c_void>(name.as_bytes()) }.ok()?;
        defining_file(*address)
    })
}

/// Whether and where a library exports a function.
enum Export {
    /// At an address other than 0.
    Found,
    /// Not at all.
    Missing,
    /// At address 0: `dlsym` returns null without an error (an absolute
    /// symbol of value 0, an indirect function whose resolver returned
    /// null), and a null function pointer cannot exist in Rust.
    AtZero,
}

/// Whether and where `library` exports `symbol`.
fn export(library: &Library, symbol: &str) -> Export {
    // SAFETY: the symbol is read as a plain address (`*mut c_void`, the type
    // `dlsym` itself returns); it is never called or dereferenced.
    match unsafe { library.get::<*mut c_void>(symbol.as_bytes()) } {
        Err(_) => Export::Missing,
        Ok(address) if address.is_null() => Export::AtZero,
        Ok(_) => Export::Found,
    }
}

/// The file of the loaded object that contains `address`, via `dladdr`.
fn defining_file(address: *const c_void) -> Option<PathBuf> {
    let mut info = MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `dladdr` only looks the address up in the loader's tables (it
    // never dereferences it) and writes `*info`, which is valid for writes.
    let found = unsafe { libc::dladdr(address, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: `dladdr` returned non-zero, so it filled in `info`; every field
    // is a pointer, and all-zero (from `zeroed`) is valid for the rest.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is the NUL-terminated name of a loaded object,
    // owned by the dynamic loader; the object stays loaded (the caller holds
    // a handle to it) while the name is copied here.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_bytes()
        .to_vec();
    if name.is_empty() {
        return None;
    }
    let name = PathBuf::from(OsString::from_vec(name));
    Some(std::fs::canonicalize(&name).unwrap_or(name))
}

/// The file of the object `dlopen` returned `handle` for, as the dynamic
/// loader names it in its link map (`dlinfo` with `RTLD_DI_LINKMAP`),
/// canonicalized: for a library that exports none of flex's functions
/// (another library under the name `libflex.so.1` on the search path),
/// whose file `dladdr` cannot find. `None` if the loader cannot tell.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn opened_file(handle: *mut c_void) -> Option<PathBuf> {
    /// The start of the loader's `struct link_map` (`<link.h>`), the part
    /// that is public and stable: the load address, then the file name.
    #[repr(C)]
    struct LinkMapHead {
        l_addr: usize,
        l_name: *const c_char,
    }
    let mut map: *const LinkMapHead = std::ptr::null();
    // SAFETY: `handle` is a live `dlopen` handle (the library is never
    // closed), and `RTLD_DI_LINKMAP` writes one pointer, to the object's
    // `struct link_map`, into `map`, which is valid for that write.
    let found = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&raw mut map).cast::<c_void>(),
        )
    };
    if found != 0 || map.is_null() {
        return None;
    }
    // SAFETY: `map` points to the loader's link map of the object, which
    // stays as long as the object is loaded (always, from now on); its
    // first two fields are those of `LinkMapHead` in every glibc.
    let name = unsafe { (*map).l_name };
    if name.is_null() {
        return None;
    }
    // SAFETY: `l_name` is the NUL-terminated file name the loader keeps for
    // the loaded object, alive while the object is loaded.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
    if name.is_empty() {
        return None;
    }
    let name = PathBuf::from(OsString::from_vec(name));
    Some(std::fs::canonicalize(&name).unwrap_or(name))
}

/// See the glibc version: elsewhere the link map is not read.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn opened_file(_: *mut c_void) -> Option<PathBuf> {
    None
}

/// The best path for `name` when `dladdr` cannot tell: the canonical path of
/// a name with a `/` that exists, else the name itself.
fn fallback_path(name: &OsStr) -> PathBuf {
    let path = PathBuf::from(name);
    if name.as_bytes().contains(&b'/') {
        std::fs::canonicalize(&path).unwrap_or(path)
    } else {
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_candidates_are_the_soname_then_the_plain_name() {
        assert_eq!(default_candidates(), ["libflex.so.1", "libflex.so"]);
    }

    #[test]
    fn empty_path_is_refused_before_dlopen() {
        let error = FlexLibrary::open("").unwrap_err();
        assert_eq!(
            error,
            LoadError::Open {
                path: PathBuf::new(),
                reason: "the path is empty".to_owned()
            }
        );
    }

    #[test]
    fn nul_byte_in_path_is_refused_before_dlopen() {
        let error = FlexLibrary::open("/tmp/lib\0flex.so").unwrap_err();
        assert_eq!(
            error,
            LoadError::Open {
                path: PathBuf::from("/tmp/lib\0flex.so"),
                reason: "the path contains a NUL byte".to_owned()
            }
        );
    }

    /// As `load` does with an empty variable: the default names are
    /// searched (with whatever outcome this machine gives), and the value is
    /// not blamed.
    #[test]
    fn an_empty_env_value_searches_the_default_names() {
        let outcome =
            |value| FlexLibrary::load_from(value).map(|library| library.path().to_owned());
        let empty = outcome(Some(OsString::new()));
        assert!(!matches!(empty, Err(LoadError::Env { .. })), "{empty:?}");
        assert_eq!(empty, outcome(None));
    }

    #[test]
    fn copy_c_string_handles_null_and_invalid_utf8() {
        // SAFETY: null is allowed.
        assert_eq!(unsafe { copy_c_string(std::ptr::null()) }, "");
        let bytes = b"bad \xff byte\0";
        // SAFETY: a NUL-terminated array that outlives the call.
        let copied = unsafe { copy_c_string(bytes.as_ptr().cast()) };
        assert_eq!(copied, "bad \u{FFFD} byte");
    }
}

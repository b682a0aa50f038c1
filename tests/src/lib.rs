//! Test support shared by the cross-crate tests in `tests/tests/`.
//!
//! - [`isolated!`] / [`isolated()`]: runs a test body in a fresh child process with its own
//!   environment, for tests of process-global state (the runtime starts once
//!   per process) and of environment variables.
//! - [`mock_cdylib()`]: the path of the software device's flex library
//!   (`libspyre_mock_capi.so`, crate `spyre-mock-capi`), built on first use,
//!   so that the FFI path runs in every `cargo test`.
//! - [`process`]: forking a child with a bounded wait, and changing the
//!   environment of an isolated test process.
//! - [`reliability`]: what the stress, fault and bad-input tests share: the
//!   seed, a time-bounded runner, drop counters, a spy backend, an
//!   independent reading of integers.
//! - [`ffi`]: what the FFI-path tests share: the software device's library
//!   as a backend, and this process's thread count.
//! - [`conformance`]: one suite for the `Runtime`/`Stream` contract, run
//!   against every backend: the in-process mock (`tests/conformance_mock.rs`),
//!   the mock shared library through flex-sys and flex-rt
//!   (`tests/conformance_ffi.rs`), and a vendor library named by
//!   `FLEX_RUNTIME_LIB` (`tests/conformance_vendor.rs`, ignored unless run
//!   with `--ignored`).

#![deny(unsafe_code)]

pub mod conformance;
pub mod ffi;
pub mod isolated;
mod mock_cdylib;
#[allow(unsafe_code)] // forking and changing the environment: see the module
pub mod process;
pub mod reliability;

pub use isolated::{isolated, isolated_each};
pub use mock_cdylib::{MOCK_CDYLIB_ENV, mock_cdylib};

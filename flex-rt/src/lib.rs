//! Safe flex runtime API.
//!
//! flex-rt is the only way anything above it talks to a device. It defines
//! the contract every backend meets — the [`Backend`], [`Runtime`] and
//! [`Stream`] traits, and the types they share — and implements it over the
//! vendor's C ABI (flex-sys) in [`hardware`]: [`HardwareBackend`],
//! [`HardwareRuntime`] (torch-spyre's `flex::RuntimeContext`) and
//! [`HardwareStream`] (`flex::RuntimeStream`). The software device in
//! `spyre-mock` implements the same traits.
//!
//! Ownership follows torch-spyre's stream-ownership spec: a runtime creates
//! and owns every stream; callers get borrows tied to the runtime and never
//! destroy a stream. Host memory given to an asynchronous copy is a
//! [`HostBuffer`] that the operation leases until it completes, so safe code
//! cannot free or touch memory the device is still using.
#![deny(unsafe_code)]

mod address;
mod buffer;
pub mod env;
mod error;
mod event;
#[cfg(unix)]
pub mod hardware;
mod launch;
pub mod noop;
mod panic;
pub mod program;
mod status;
mod traits;
mod types;

pub use address::{
    ADDRESS_ALIGNMENT, AddressChunk, CompositeAddress, LogicalAddress, MAX_ADDRESS_CHUNKS,
};
pub use buffer::{HostBuffer, ReadLease, WriteLease};
pub use error::{FlexError, Result};
pub use event::{Capabilities, Event, Notification};
pub use flex_sys::fork;
pub use flex_sys::sync;
#[cfg(unix)]
pub use flex_sys::{AbiVersion, FlexLibrary, LoadError, RUNTIME_LIB_ENV};
#[cfg(unix)]
pub use hardware::{
    CloseError, HardwareBackend, HardwareEvent, HardwareRuntime, HardwareStream, TeardownError,
    TeardownStep,
};
pub use launch::{Completion, HostCallback, LaunchOptions};
pub use panic::{drop_panic, panic_message};
pub use status::Status;
pub use traits::{Backend, Runtime, Stream, check_copy_size, check_fill_size};
pub use types::{DataFormat, MemoryInfo, MemoryLayout, StreamMode, StreamPriority, SyncPolicy};

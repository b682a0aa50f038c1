//! The FFI backend: the Runtime and Stream traits over a loaded flex library.

/// Placeholder.
#[derive(Debug)]
pub struct FlexBackend;
/// Placeholder.
#[derive(Debug)]
pub struct RuntimeContext;
/// Placeholder.
#[derive(Debug)]
pub struct RuntimeStream;

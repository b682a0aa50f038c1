//! The `spyre` command.
fn main() {}

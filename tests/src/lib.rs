//! Test support shared by the cross-crate tests.

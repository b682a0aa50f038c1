//! The Spyre stream pool.

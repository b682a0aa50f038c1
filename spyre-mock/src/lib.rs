//! A software Spyre device.

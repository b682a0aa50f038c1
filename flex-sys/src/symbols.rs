//! The functions of `flex.h` that a library must export, by ABI minor version.
//!
//! One list per minor version is both the public symbol list and what the
//! loader checks a library against. A unit test compares the lists with the
//! generated bindings, so a function added to `flex.h` cannot be forgotten
//! here.

/// Declares the symbol lists.
macro_rules! flex_functions {
    (
        abi_1_0: [$($base:ident),+ $(,)?],
        abi_1_1: [$($added:ident),+ $(,)?] $(,)?
    ) => {
        /// The functions of flex ABI 1.0, in header order,
        /// `flex_get_api_version` first. Every library must export all of
        /// them: the loader refuses one that lacks any with
        /// [`LoadError::MissingSymbol`](crate::LoadError::MissingSymbol).
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($base)),+];

        /// The functions flex ABI 1.1 adds (capabilities, memory info and
        /// events), in
        /// header order. A library reporting minor version 1 or later must
        /// export all of them (the loader refuses it otherwise, as for
        /// [`REQUIRED_SYMBOLS`]); a 1.0 library loads without them, and
        /// [`FlexLibrary::require`](crate::FlexLibrary::require) reports each
        /// unsupported.
        pub const ABI_1_1_SYMBOLS: &[&str] = &[$(stringify!($added)),+];

    };
}

flex_functions! {
    abi_1_0: [
        flex_get_api_version,
        flex_status_string,
        flex_get_last_error_message,
        flex_get_device_count,
        flex_runtime_create,
        flex_runtime_destroy,
        flex_runtime_get_logical_device,
        flex_runtime_get_default_stream,
        flex_runtime_create_stream,
        flex_stream_destroy,
        flex_runtime_has_stream_error,
        flex_memory_allocate,
        flex_memory_free,
        flex_stream_get_id,
        flex_stream_get_priority,
        flex_stream_query,
        flex_stream_synchronize,
        flex_stream_needs_shutdown,
        flex_launch_h2d,
        flex_launch_d2h,
        flex_launch_compute,
        flex_launch_host_callback,
        flex_launch_fill,
    ],
    abi_1_1: [
        flex_runtime_get_capability,
        flex_runtime_get_memory_info,
        flex_event_create,
        flex_event_destroy,
        flex_event_record,
        flex_stream_wait_event,
        flex_event_notify,
        flex_event_query,
        flex_event_synchronize,
        flex_event_elapsed_time,
    ],
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{ABI_1_1_SYMBOLS, REQUIRED_SYMBOLS};

    const BINDINGS: &str = include_str!("bindings.rs");

    /// Field names of `pub struct FlexApi { .. }` in the generated file.
    fn flex_api_fields() -> Vec<&'static str> {
        let start = BINDINGS
            .find("pub struct FlexApi {")
            .expect("bindings.rs declares `pub struct FlexApi`");
        let body = &BINDINGS[start..];
        let end = body.find("\n}\n").expect("`FlexApi` has a closing brace");
        body[..end]
            .lines()
            .filter_map(|line| line.strip_prefix("    pub "))
            .filter_map(|rest| rest.split_once(':').map(|(name, _)| name))
            .collect()
    }

    /// Names of the `pub unsafe fn flex_*` methods of `impl FlexApi`.
    fn flex_api_methods() -> Vec<&'static str> {
        BINDINGS
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix("pub unsafe fn "))
            .filter_map(|rest| rest.split_once('(').map(|(name, _)| name))
            .filter(|name| name.starts_with("flex_"))
            .collect()
    }

    #[test]
    fn list_has_no_duplicates_and_starts_with_the_version_call() {
        let unique: BTreeSet<_> = REQUIRED_SYMBOLS.iter().collect();
        assert_eq!(unique.len(), REQUIRED_SYMBOLS.len());
        assert_eq!(REQUIRED_SYMBOLS[0], "flex_get_api_version");
    }

    #[test]
    fn list_covers_every_field_of_flex_api() {
        let fields = flex_api_fields();
        // 23 functions in flex.h 1.0 and 10 added by 1.1; guards the parser
        // against matching nothing.
        assert_eq!(
            fields.len(),
            23 + 10,
            "fields parsed from bindings.rs: {fields:?}"
        );
        let listed: Vec<&str> = REQUIRED_SYMBOLS
            .iter()
            .chain(ABI_1_1_SYMBOLS)
            .copied()
            .collect();
        assert_eq!(fields, listed, "order and names must match bindings.rs");
    }

    #[test]
    fn list_covers_every_generated_function() {
        let methods: BTreeSet<_> = flex_api_methods().into_iter().collect();
        let listed: BTreeSet<_> = REQUIRED_SYMBOLS
            .iter()
            .chain(ABI_1_1_SYMBOLS)
            .copied()
            .collect();
        assert_eq!(methods, listed);
    }
}

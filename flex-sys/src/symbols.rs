//! The functions of `flex.h` that a library must export.
//!
//! One list drives both [`REQUIRED_SYMBOLS`] and the load-time check over the
//! fields of [`FlexApi`](crate::bindings::FlexApi), so they cannot drift apart.
//! A unit test compares the list with the generated bindings, so a function
//! added to `flex.h` cannot be forgotten here.

/// Declares the symbol list and the check over `FlexApi`'s fields.
macro_rules! flex_functions {
    ($($name:ident),+ $(,)?) => {
        /// The name of every function declared in `include/flex.h` (ABI
        /// [`AbiVersion::CURRENT`](crate::AbiVersion::CURRENT)), in header
        /// order, `flex_get_api_version` first.
        ///
        /// All of them are required: the loader refuses a library that lacks
        /// any of them with [`LoadError::MissingSymbol`](crate::LoadError::MissingSymbol).
        /// When a later minor version of the header adds functions, they will
        /// be optional for libraries of an older minor version.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$(stringify!($name)),+];

        /// The first field of `api`, in [`REQUIRED_SYMBOLS`] order, whose
        /// symbol did not resolve.
        #[cfg(unix)]
        pub(crate) fn first_missing(api: &crate::bindings::FlexApi) -> Option<&'static str> {
            $(
                if api.$name.is_err() {
                    return Some(stringify!($name));
                }
            )+
            None
        }
    };
}

flex_functions![
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
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::REQUIRED_SYMBOLS;

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
        // 23 functions in flex.h 1.0; guards the parser against matching nothing.
        assert_eq!(
            fields.len(),
            23,
            "fields parsed from bindings.rs: {fields:?}"
        );
        assert_eq!(
            fields, REQUIRED_SYMBOLS,
            "order and names must match bindings.rs"
        );
    }

    #[test]
    fn list_covers_every_generated_function() {
        let methods: BTreeSet<_> = flex_api_methods().into_iter().collect();
        let listed: BTreeSet<_> = REQUIRED_SYMBOLS.iter().copied().collect();
        assert_eq!(methods, listed);
    }
}

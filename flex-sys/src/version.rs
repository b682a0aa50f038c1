//! The flex ABI version: `major.minor`, packed into one `u32` as `flex.h` does.

use std::fmt;

use crate::bindings::{FLEX_API_VERSION_MAJOR, FLEX_API_VERSION_MINOR};

// The header macros are emitted as `i32` constants; both must fit in the
// 16 bits that the packed form gives them, so the casts below are exact.
const _: () = assert!(FLEX_API_VERSION_MAJOR >= 0 && FLEX_API_VERSION_MAJOR <= 0xFFFF);
const _: () = assert!(FLEX_API_VERSION_MINOR >= 0 && FLEX_API_VERSION_MINOR <= 0xFFFF);

/// Packs a major and a minor version into the value that
/// `flex_get_api_version` returns: major in bits 16..31, minor in bits 0..15.
///
/// Mirrors `FLEX_MAKE_API_VERSION` in `flex.h` bit for bit: bits of `major`
/// above 15 are shifted out and bits of `minor` above 15 are masked off.
///
/// ```
/// assert_eq!(flex_sys::make_api_version(1, 7), 0x0001_0007);
/// ```
#[must_use]
pub const fn make_api_version(major: u32, minor: u32) -> u32 {
    (major << 16) | (minor & 0xFFFF)
}

/// The major version inside a packed version (bits 16..31).
///
/// Mirrors `FLEX_API_VERSION_GET_MAJOR` in `flex.h`.
#[must_use]
pub const fn api_version_major(version: u32) -> u32 {
    version >> 16
}

/// The minor version inside a packed version (bits 0..15).
///
/// Mirrors `FLEX_API_VERSION_GET_MINOR` in `flex.h`.
#[must_use]
pub const fn api_version_minor(version: u32) -> u32 {
    version & 0xFFFF
}

/// A flex ABI version, `major.minor`.
///
/// Compatibility rule (see `flex.h`): a library is usable when its major
/// version equals the major version of the header these bindings were
/// generated from ([`AbiVersion::CURRENT`]). The minor version does not
/// matter for that check: a newer minor only adds functions or status codes,
/// and an older minor is accepted too as long as every function this crate
/// requires is present (see [`crate::REQUIRED_SYMBOLS`]).
///
/// Displays as `major.minor`, for example `1.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AbiVersion {
    /// Major version. Libraries with another major version are incompatible.
    pub major: u32,
    /// Minor version. Later minors only add to the ABI.
    pub minor: u32,
}

impl AbiVersion {
    /// The version that `include/flex.h` declares
    /// (`FLEX_API_VERSION_MAJOR`.`FLEX_API_VERSION_MINOR`): the version these
    /// bindings were generated for.
    pub const CURRENT: AbiVersion = AbiVersion {
        major: FLEX_API_VERSION_MAJOR as u32,
        minor: FLEX_API_VERSION_MINOR as u32,
    };

    /// Unpacks a version as returned by `flex_get_api_version`.
    ///
    /// ```
    /// use flex_sys::AbiVersion;
    /// assert_eq!(AbiVersion::from_packed(0x0002_0003), AbiVersion { major: 2, minor: 3 });
    /// ```
    #[must_use]
    pub const fn from_packed(packed: u32) -> AbiVersion {
        AbiVersion {
            major: api_version_major(packed),
            minor: api_version_minor(packed),
        }
    }

    /// Packs this version as [`make_api_version`] does (and with the same
    /// truncation of values that do not fit in 16 bits).
    #[must_use]
    pub const fn packed(self) -> u32 {
        make_api_version(self.major, self.minor)
    }

    /// Whether a library reporting `library` can be used by code built for
    /// `self`: true exactly when the major versions are equal. Any minor
    /// version, older or newer, is accepted.
    #[must_use]
    pub const fn is_compatible_with(self, library: AbiVersion) -> bool {
        self.major == library.major
    }
}

impl fmt::Display for AbiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_is_the_header_version() {
        assert_eq!(AbiVersion::CURRENT, AbiVersion { major: 1, minor: 1 });
        assert_eq!(AbiVersion::CURRENT.packed(), 0x0001_0001);
    }

    #[test]
    fn packing_matches_the_header_macros() {
        assert_eq!(make_api_version(1, 7), 0x0001_0007);
        assert_eq!(make_api_version(2, 0), 0x0002_0000);
        assert_eq!(make_api_version(0xFFFF, 0xFFFF), 0xFFFF_FFFF);
        // Like the C macro: minor is masked to 16 bits, major's high bits
        // are shifted out.
        assert_eq!(make_api_version(1, 0x1_0005), 0x0001_0005);
        assert_eq!(make_api_version(0x1_0002, 3), 0x0002_0003);
        assert_eq!(api_version_major(0x0003_0009), 3);
        assert_eq!(api_version_minor(0x0003_0009), 9);
    }

    #[test]
    fn from_packed_and_packed_round_trip() {
        for packed in [0, 1, 0x0001_0000, 0x0001_0007, 0xFFFF_FFFF, 0x1234_5678] {
            assert_eq!(AbiVersion::from_packed(packed).packed(), packed);
        }
        assert_eq!(
            AbiVersion::from_packed(0x1234_5678),
            AbiVersion {
                major: 0x1234,
                minor: 0x5678
            }
        );
    }

    #[test]
    fn displays_major_dot_minor() {
        assert_eq!(AbiVersion { major: 1, minor: 0 }.to_string(), "1.0");
        assert_eq!(
            AbiVersion {
                major: 2,
                minor: 17
            }
            .to_string(),
            "2.17"
        );
    }

    #[test]
    fn only_the_major_version_decides_compatibility() {
        let current = AbiVersion { major: 1, minor: 3 };
        assert!(current.is_compatible_with(AbiVersion { major: 1, minor: 0 }));
        assert!(current.is_compatible_with(AbiVersion { major: 1, minor: 7 }));
        assert!(!current.is_compatible_with(AbiVersion { major: 2, minor: 0 }));
        assert!(!current.is_compatible_with(AbiVersion { major: 0, minor: 3 }));
    }
}

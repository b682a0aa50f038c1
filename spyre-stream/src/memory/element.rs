//! The element types a [`crate::DeviceBuffer`] can hold: one per data format
//! of the flex ABI, stored little-endian on the device whatever the host's
//! byte order.

use flex_rt::DataFormat;

mod sealed {
    pub trait Sealed {}
}

/// An element of device data: `f32`, [`half::f16`], `i32` or `u8` (also
/// used for untyped bytes), one for each [`DataFormat`] of the flex ABI.
/// Sealed: the device knows no other formats.
pub trait DeviceElement: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The device's data format for this element.
    const FORMAT: DataFormat;
    /// Bytes per element on the device (`FORMAT.element_size()`).
    const SIZE: usize;

    /// Writes `self` little-endian into `out` (`SIZE` bytes).
    ///
    /// # Panics
    /// If `out` is not exactly `SIZE` bytes long.
    fn write_le(self, out: &mut [u8]);
    /// Reads one element from `bytes` (`SIZE` bytes, little-endian).
    ///
    /// # Panics
    /// If `bytes` is not exactly `SIZE` bytes long.
    fn read_le(bytes: &[u8]) -> Self;
    /// The value as a fill takes it: exact for every value of every
    /// format but a NaN, whose payload and signalling bit may not be kept
    /// (a fill writes a quiet NaN).
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($ty:ty, $format:ident, $size:literal, |$v:ident| $to_f64:expr) => {
        impl sealed::Sealed for $ty {}
        impl DeviceElement for $ty {
            const FORMAT: DataFormat = DataFormat::$format;
            const SIZE: usize = $size;

            fn write_le(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }

            fn read_le(bytes: &[u8]) -> Self {
                let mut raw = [0u8; $size];
                raw.copy_from_slice(bytes);
                <$ty>::from_le_bytes(raw)
            }

            fn to_f64(self) -> f64 {
                let $v = self;
                $to_f64
            }
        }
    };
}

element!(f32, Fp32, 4, |v| f64::from(v));
element!(half::f16, Fp16, 2, |v| v.to_f64());
element!(i32, Int32, 4, |v| f64::from(v));
element!(u8, Uint8, 1, |v| f64::from(v));

/// `values` as device bytes (little-endian).
pub(crate) fn encode<T: DeviceElement>(values: &[T]) -> Vec<u8> {
    let mut bytes = vec![0u8; values.len() * T::SIZE];
    for (value, out) in values.iter().zip(bytes.chunks_exact_mut(T::SIZE)) {
        value.write_le(out);
    }
    bytes
}

/// Device bytes (little-endian) into `out`; `bytes` holds exactly
/// `out.len()` elements.
pub(crate) fn decode_into<T: DeviceElement>(bytes: &[u8], out: &mut [T]) {
    for (value, raw) in out.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
        *value = T::read_le(raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_formats() {
        assert_eq!(f32::SIZE as u64, f32::FORMAT.element_size());
        assert_eq!(half::f16::SIZE as u64, half::f16::FORMAT.element_size());
        assert_eq!(i32::SIZE as u64, i32::FORMAT.element_size());
        assert_eq!(u8::SIZE as u64, u8::FORMAT.element_size());
    }

    #[test]
    fn encoding_is_little_endian_and_round_trips() {
        // 1.0f32 = 0x3F80_0000; -2i32 = 0xFFFF_FFFE; 1.0f16 = 0x3C00.
        assert_eq!(encode(&[1.0f32]), [0x00, 0x00, 0x80, 0x3F]);
        assert_eq!(encode(&[-2i32]), [0xFE, 0xFF, 0xFF, 0xFF]);
        assert_eq!(encode(&[half::f16::ONE]), [0x00, 0x3C]);
        let values = [1.5f32, -0.0, f32::MAX];
        let mut back = [0f32; 3];
        decode_into(&encode(&values), &mut back);
        assert_eq!(back.map(f32::to_bits), values.map(f32::to_bits));
    }
}

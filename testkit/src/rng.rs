//! SplitMix64 (Vigna): a small, fast, deterministic 64-bit generator, good
//! for reproducible inputs and for picking operations; not for anything
//! statistical or secret.

/// The SplitMix64 generator. `Clone`; one per thread.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent generator for worker `index` of a run seeded with
    /// `seed`.
    pub fn fork(seed: u64, index: u64) -> Self {
        let mut base = Self::new(seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F));
        Self::new(base.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// A value in `0..n`.
    ///
    /// # Panics
    /// When `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// One element of `items`.
    ///
    /// # Panics
    /// When `items` is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// True with probability 1/`n`.
    ///
    /// # Panics
    /// When `n` is 0.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A value in `[-1, 1)`: a multiple of 2⁻²³, from the top 24 bits, so
    /// every value is exact in `f32`.
    pub fn next_f32(&mut self) -> f32 {
        let bits = (self.next_u64() >> 40) as i32; // 0 ..= 2^24 - 1
        (bits - (1 << 23)) as f32 / (1u32 << 23) as f32
    }

    /// `len` values from [`SplitMix64::next_f32`].
    pub fn f32s(&mut self, len: usize) -> Vec<f32> {
        let mut values = vec![0.0f32; len];
        for value in &mut values {
            *value = self.next_f32();
        }
        values
    }
}

/// The SplitMix64 output function: a bijective mix of 64 bits, also good
/// for deriving seeds.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_the_published_one() {
        // First outputs of splitmix64 seeded with 0 (Vigna's reference code).
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn f32s_are_in_range_and_deterministic() {
        let a = SplitMix64::new(42).f32s(10_000);
        let b = SplitMix64::new(42).f32s(10_000);
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        assert!(a.iter().any(|v| *v < -0.9) && a.iter().any(|v| *v > 0.9));
        assert_ne!(SplitMix64::new(43).f32s(4), a[..4]);
    }

    #[test]
    fn picks_stay_in_range_and_forks_differ() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..1000 {
            assert!(rng.below(3) < 3);
            assert!([1, 2, 3].contains(rng.pick(&[1, 2, 3])));
        }
        assert_ne!(
            SplitMix64::fork(1, 0).next_u64(),
            SplitMix64::fork(1, 1).next_u64()
        );
    }
}

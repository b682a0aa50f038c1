//! Inputs and the host reference of `spyre run`, computed here with plain
//! loops and nothing from the device crates, and the bitwise check of a
//! result against it.
//!
//! The arithmetic follows the device's documented order exactly, so a correct
//! device matches bit for bit: `f32` throughout, each product and each sum
//! rounded on its own (no fused multiply-add; Rust never contracts `a * b + c`
//! into one).

use spyre_testkit::mix64;

use crate::error::Mismatch;

/// The seed of one iteration: a function of the run's seed, the thread and
/// the iteration index, so any iteration can be reproduced alone.
pub(crate) fn iteration_seed(seed: u64, thread: usize, iteration: u64) -> u64 {
    mix64(seed ^ mix64((thread as u64).wrapping_mul(0xD1B5_4A32_D192_ED03) ^ mix64(iteration)))
}

/// `out[i] = alpha * x[i] + y[i]`: the product rounded to `f32`, then the sum.
pub(crate) fn axpy(alpha: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len().min(y.len()));
    for i in 0..x.len().min(y.len()) {
        let product = alpha * x[i];
        out.push(product + y[i]);
    }
    out
}

/// Row-major `C[n×n] = A[n×n] · B[n×n]`: each `C[i][j]` starts at `0.0` and
/// adds `A[i][p] * B[p][j]` for `p = 0, 1, …, n-1` in that order, rounding
/// the product and then the sum at every step.
///
/// The loops run i, p, j (one row of accumulators at a time) so that `B` is
/// read in order; every `C[i][j]` still sees its terms in ascending `p`, so
/// the result is the same bit for bit as the i, j, p order.
///
/// Returns `None` when the inputs are not n×n.
pub(crate) fn matmul_square(n: usize, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
    let len = n.checked_mul(n)?;
    if a.len() != len || b.len() != len {
        return None;
    }
    let mut c = vec![0.0f32; len];
    for i in 0..n {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..n {
            let a_ip = a[i * n + p];
            let b_row = &b[p * n..(p + 1) * n];
            for (acc, &b_pj) in row.iter_mut().zip(b_row) {
                let product = a_ip * b_pj;
                *acc += product;
            }
        }
    }
    Some(c)
}

/// Little-endian bytes of `values`, as the device stores `f32`.
pub(crate) fn to_le_bytes(values: &[f32]) -> Vec<u8> {
    // Plain slice indexing and shifts: fast in unoptimized builds too.
    let mut bytes = vec![0u8; values.len() * 4];
    let out: &mut [u8] = &mut bytes;
    for (i, value) in values.iter().enumerate() {
        let bits = value.to_bits();
        let at = 4 * i;
        out[at] = bits as u8;
        out[at + 1] = (bits >> 8) as u8;
        out[at + 2] = (bits >> 16) as u8;
        out[at + 3] = (bits >> 24) as u8;
    }
    bytes
}

/// Compares `got` (little-endian `f32` bytes read from the device) with
/// `expected` bit for bit.
///
/// # Errors
/// The first element that differs, with how many differ; a length
/// difference counts as a mismatch at the first missing element.
pub(crate) fn check_bitwise(expected: &[f32], got: &[u8]) -> Result<(), Mismatch> {
    let got_len = got.len() / 4;
    let common = got_len.min(expected.len());
    let mut first: Option<(usize, f32, f32)> = None;
    let mut differing = 0usize;
    for (index, &want) in expected[..common].iter().enumerate() {
        let at = 4 * index;
        let have = got[at] as u32
            | (got[at + 1] as u32) << 8
            | (got[at + 2] as u32) << 16
            | (got[at + 3] as u32) << 24;
        if have != want.to_bits() {
            differing += 1;
            first.get_or_insert((index, want, f32::from_bits(have)));
        }
    }
    if got.len() != expected.len() * 4 {
        differing += expected.len().abs_diff(got_len);
        first.get_or_insert((
            common,
            expected.get(common).copied().unwrap_or(f32::NAN),
            f32::NAN,
        ));
    }
    match first {
        None => Ok(()),
        Some((index, expected_value, got_value)) => Err(Mismatch {
            index,
            expected: expected_value,
            got: got_value,
            differing,
            len: expected.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_seeds_differ() {
        let seeds = [
            iteration_seed(1, 0, 0),
            iteration_seed(1, 0, 1),
            iteration_seed(1, 1, 0),
            iteration_seed(2, 0, 0),
        ];
        for (i, a) in seeds.iter().enumerate() {
            for b in &seeds[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn axpy_by_hand_and_rounding_order() {
        assert_eq!(axpy(2.0, &[1.0, 2.0], &[3.0, 4.0]), vec![5.0, 8.0]);
        // 0.1 * 0.1 is rounded before the add; a fused multiply-add would differ.
        let x = 0.1f32;
        let y = -0.01f32;
        assert_eq!(axpy(x, &[x], &[y])[0].to_bits(), ((x * x) + y).to_bits());
        assert_ne!(axpy(x, &[x], &[y])[0].to_bits(), x.mul_add(x, y).to_bits());
    }

    #[test]
    fn matmul_by_hand_and_order() {
        let c = matmul_square(2, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]).unwrap();
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        // Summed left to right from 0.0: 1e8 + 1 - 1e8 = 0 in f32.
        let a = [1e8, 1.0, -1e8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let b = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        assert_eq!(matmul_square(3, &a, &b).unwrap()[0], 0.0);
        assert_eq!(matmul_square(2, &[1.0; 3], &[1.0; 4]), None);
    }

    #[test]
    fn agrees_with_the_device_documentation_on_random_inputs() {
        // The device's reference functions are the documented semantics; the
        // loops here are written independently and must agree bit for bit.
        let mut rng = spyre_testkit::SplitMix64::new(7);
        let (alpha, x, y) = (rng.next_f32(), rng.f32s(1000), rng.f32s(1000));
        let ours = axpy(alpha, &x, &y);
        let theirs = spyre_mock::reference::axpy(alpha, &x, &y);
        assert!(
            ours.iter()
                .zip(&theirs)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        let n = 23;
        let (a, b) = (rng.f32s(n * n), rng.f32s(n * n));
        let ours = matmul_square(n, &a, &b).unwrap();
        let theirs = spyre_mock::reference::matmul(n, n, n, &a, &b).unwrap();
        assert!(
            ours.iter()
                .zip(&theirs)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }

    #[test]
    fn bitwise_check_finds_the_first_difference() {
        let expected = [1.0f32, 2.0, 3.0, 4.0];
        assert_eq!(check_bitwise(&expected, &to_le_bytes(&expected)), Ok(()));
        let mut got = expected;
        got[1] = 2.5;
        got[3] = -4.0;
        let mismatch = check_bitwise(&expected, &to_le_bytes(&got)).unwrap_err();
        assert_eq!(
            (
                mismatch.index,
                mismatch.expected,
                mismatch.got,
                mismatch.differing
            ),
            (1, 2.0, 2.5, 2)
        );
        // -0.0 and 0.0 compare equal as numbers but not as bits.
        let mismatch = check_bitwise(&[0.0], &to_le_bytes(&[-0.0])).unwrap_err();
        assert_eq!(mismatch.index, 0);
        // A short result is a mismatch at the first missing element.
        let mismatch = check_bitwise(&expected, &to_le_bytes(&expected[..2])).unwrap_err();
        assert_eq!((mismatch.index, mismatch.differing), (2, 2));
    }
}

//! Host reference implementations of the built-in kernels.
//!
//! The device computes every kernel with exactly these functions, so a
//! result read back from the device equals the reference bit for bit. All
//! arithmetic is `f32`, each operation rounded on its own (no fused
//! multiply-add), in the order documented per function.
/// `out[i] = a[i]`.
pub fn copy(a: &[f32]) -> Vec<f32> {
    collected(|out| copy_into(a, out))
}

/// [`copy`], appended to `out` (whose room the caller may have reserved).
pub fn copy_into(a: &[f32], out: &mut Vec<f32>) {
    out.extend_from_slice(a);
}

/// `n` copies of `value`.
pub fn fill(n: usize, value: f32) -> Vec<f32> {
    collected(|out| fill_into(n, value, out))
}

/// [`fill`], appended to `out`.
pub fn fill_into(n: usize, value: f32, out: &mut Vec<f32>) {
    out.resize(out.len() + n, value);
}

/// `out[i] = a[i] + b[i]`; the result is as long as the shorter input.
pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    collected(|out| add_into(a, b, out))
}

/// [`add`], appended to `out`.
pub fn add_into(a: &[f32], b: &[f32], out: &mut Vec<f32>) {
    out.extend(a.iter().zip(b).map(|(a, b)| a + b));
}

/// `out[i] = a[i] * b[i]`; the result is as long as the shorter input.
pub fn mul(a: &[f32], b: &[f32]) -> Vec<f32> {
    collected(|out| mul_into(a, b, out))
}

/// [`mul`], appended to `out`.
pub fn mul_into(a: &[f32], b: &[f32], out: &mut Vec<f32>) {
    out.extend(a.iter().zip(b).map(|(a, b)| a * b));
}

/// `out[i] = alpha * x[i] + y[i]`: the product is rounded to `f32`, then
/// the sum. The result is as long as the shorter input.
pub fn axpy(alpha: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    collected(|out| axpy_into(alpha, x, y, out))
}

/// [`axpy`], appended to `out`.
pub fn axpy_into(alpha: f32, x: &[f32], y: &[f32], out: &mut Vec<f32>) {
    out.extend(x.iter().zip(y).map(|(x, y)| alpha * x + y));
}

/// Row-major `C[m×n] = A[m×k] · B[k×n]`: each `C[i][j]` starts at `0.0` and
/// adds `A[i][p] * B[p][j]` for `p = 0, 1, …, k-1` in that order, rounding
/// the product and then the sum to `f32` at every step.
///
/// The loops run i, p, j (one row of accumulators at a time), so `B` is
/// read in order and the inner loop vectorizes; every `C[i][j]` still sees
/// its terms in ascending `p`, so the result is bit for bit that of the
/// i, j, p order.
///
/// Returns `None` when `a.len() != m*k`, `b.len() != k*n`, or a size
/// overflows `usize`.
pub fn matmul(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
    let mut c = Vec::new();
    matmul_into(m, k, n, a, b, &mut c)?;
    Some(c)
}

/// [`matmul`], appended to `c`; `None`, with `c` as it was, as for
/// [`matmul`].
pub fn matmul_into(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    b: &[f32],
    c: &mut Vec<f32>,
) -> Option<()> {
    if a.len() != m.checked_mul(k)? || b.len() != k.checked_mul(n)? {
        return None;
    }
    let start = c.len();
    c.resize(start.checked_add(m.checked_mul(n)?)?, 0.0);
    if n == 0 {
        return Some(());
    }
    let c = &mut c[start..];
    for (row, a_row) in c.chunks_exact_mut(n).zip(a.chunks_exact(k.max(1))) {
        for (&a_ip, b_row) in a_row.iter().zip(b.chunks_exact(n)) {
            for (acc, &b_pj) in row.iter_mut().zip(b_row) {
                let product = a_ip * b_pj;
                *acc += product;
            }
        }
    }
    Some(())
}

/// The vector `fill` appends to an empty one.
fn collected(fill: impl FnOnce(&mut Vec<f32>)) -> Vec<f32> {
    let mut out = Vec::new();
    fill(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `_into` forms append to what `out` holds, in its reserved room,
    /// and give what the plain forms return.
    #[test]
    fn the_into_forms_append_what_the_plain_forms_return() {
        let (a, b) = ([1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.25]);
        let mut out = Vec::with_capacity(2 + 4 * 5 + 4);
        out.extend([9.0, 9.0]);
        let room = out.capacity();
        copy_into(&a, &mut out);
        fill_into(4, 7.0, &mut out);
        add_into(&a, &b, &mut out);
        mul_into(&a, &b, &mut out);
        axpy_into(2.0, &a, &b, &mut out);
        assert_eq!(matmul_into(2, 2, 2, &a, &b, &mut out), Some(()));
        let mut expected = vec![9.0, 9.0];
        for part in [
            copy(&a),
            fill(4, 7.0),
            add(&a, &b),
            mul(&a, &b),
            axpy(2.0, &a, &b),
            matmul(2, 2, 2, &a, &b).unwrap(),
        ] {
            expected.extend(part);
        }
        assert_eq!(out, expected);
        assert_eq!(out.capacity(), room, "written in the reserved room");
        // A refused matmul leaves the vector as it was.
        assert_eq!(matmul_into(3, 2, 2, &a, &b, &mut out), None);
        assert_eq!(out, expected);
    }

    #[test]
    fn elementwise_by_hand() {
        assert_eq!(copy(&[1.0, -2.5]), vec![1.0, -2.5]);
        assert_eq!(fill(3, 0.5), vec![0.5, 0.5, 0.5]);
        assert_eq!(
            add(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]),
            vec![11.0, 22.0, 33.0]
        );
        assert_eq!(mul(&[1.5, -2.0], &[4.0, 0.25]), vec![6.0, -0.5]);
        assert_eq!(axpy(2.0, &[1.0, 2.0], &[3.0, 4.0]), vec![5.0, 8.0]);
        assert_eq!(add(&[1.0, 2.0], &[1.0]), vec![2.0]);
    }

    #[test]
    fn matmul_by_hand() {
        // [1 2] [5 6]   [1*5+2*7 1*6+2*8]   [19 22]
        // [3 4] [7 8] = [3*5+4*7 3*6+4*8] = [43 50]
        let c = matmul(2, 2, 2, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]).unwrap();
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        // [1 2 3] · [1 0; 0 1; 1 1] = [1+3, 2+3] = [4 5]
        let c = matmul(1, 3, 2, &[1.0, 2.0, 3.0], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]).unwrap();
        assert_eq!(c, vec![4.0, 5.0]);
    }

    #[test]
    fn matmul_accumulates_in_order_without_fma() {
        // 1e8 + 1 - 1e8 in f32 is 0 when summed left to right.
        let c = matmul(1, 3, 1, &[1e8, 1.0, -1e8], &[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(c, vec![0.0]);
        // 0.1 * 0.1 + 0.0: the product is rounded before the add.
        let c = matmul(1, 1, 1, &[0.1], &[0.1]).unwrap();
        assert_eq!(c[0].to_bits(), (0.1f32 * 0.1f32).to_bits());
    }

    #[test]
    fn matmul_is_bitwise_the_textbook_order() {
        // The definition, loops i, j, p, against the vectorizable i, p, j
        // order, on non-square shapes (and empty ones) with values of
        // mixed sign and magnitude, so that any reordering of a sum shows.
        fn textbook(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
            let mut c = Vec::with_capacity(m * n);
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0.0f32;
                    for p in 0..k {
                        acc += a[i * k + p] * b[p * n + j];
                    }
                    c.push(acc);
                }
            }
            c
        }
        let mut state = 0x9E37_79B9u32;
        let mut value = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1 << 12) as f32 - 2048.0
        };
        for (m, k, n) in [
            (3, 5, 7),
            (7, 5, 3),
            (1, 33, 17),
            (16, 16, 16),
            (0, 3, 2),
            (2, 0, 3),
            (2, 3, 0),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| value()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| value()).collect();
            let got = matmul(m, k, n, &a, &b).unwrap();
            let want = textbook(m, k, n, &a, &b);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{m}×{k} · {k}×{n}");
        }
    }

    #[test]
    fn matmul_rejects_wrong_lengths() {
        assert_eq!(matmul(2, 2, 2, &[1.0; 3], &[1.0; 4]), None);
        assert_eq!(matmul(2, 2, 2, &[1.0; 4], &[1.0; 5]), None);
        assert_eq!(matmul(usize::MAX, 2, 1, &[], &[1.0; 2]), None);
    }
}

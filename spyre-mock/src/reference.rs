//! Host reference implementations of the built-in kernels.
//!
//! The device computes every kernel with exactly these functions, so a
//! result read back from the device equals the reference bit for bit. All
//! arithmetic is `f32`, each operation rounded on its own (no fused
//! multiply-add), in the order documented per function.
/// `out[i] = a[i]`.
pub fn copy(a: &[f32]) -> Vec<f32> {
    a.to_vec()
}

/// `n` copies of `value`.
pub fn fill(n: usize, value: f32) -> Vec<f32> {
    vec![value; n]
}

/// `out[i] = a[i] + b[i]`; the result is as long as the shorter input.
pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

/// `out[i] = a[i] * b[i]`; the result is as long as the shorter input.
pub fn mul(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(a, b)| a * b).collect()
}

/// `out[i] = alpha * x[i] + y[i]`: the product is rounded to `f32`, then
/// the sum. The result is as long as the shorter input.
pub fn axpy(alpha: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(x, y)| alpha * x + y).collect()
}

/// Row-major `C[m×n] = A[m×k] · B[k×n]`: each `C[i][j]` starts at `0.0` and
/// adds `A[i][p] * B[p][j]` for `p = 0, 1, …, k-1` in that order, rounding
/// the product and then the sum to `f32` at every step.
///
/// Returns `None` when `a.len() != m*k`, `b.len() != k*n`, or a size
/// overflows `usize`.
pub fn matmul(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
    if a.len() != m.checked_mul(k)? || b.len() != k.checked_mul(n)? {
        return None;
    }
    let mut c = Vec::with_capacity(m.checked_mul(n)?);
    for i in 0..m {
        let row = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let mut acc = 0.0f32;
            for (p, &a_ip) in row.iter().enumerate() {
                acc += a_ip * b[p * n + j];
            }
            c.push(acc);
        }
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn matmul_rejects_wrong_lengths() {
        assert_eq!(matmul(2, 2, 2, &[1.0; 3], &[1.0; 4]), None);
        assert_eq!(matmul(2, 2, 2, &[1.0; 4], &[1.0; 5]), None);
        assert_eq!(matmul(usize::MAX, 2, 1, &[], &[1.0; 2]), None);
    }
}

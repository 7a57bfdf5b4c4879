//! Small dense linear algebra for the forecasters (matrices of at most a few dozen rows, where a
//! hand-written Cholesky beats general-purpose crates; see `../shared/notes/dependencies.md`).

/// Lower-triangular Cholesky factor of a symmetric positive-definite `n × n` row-major matrix,
/// in place (only the lower triangle is read; the upper one is zeroed). Returns `false` if the
/// matrix is not positive definite.
pub fn cholesky_in_place(matrix: &mut [f64], n: usize) -> bool {
    assert!(matrix.len() >= n * n);
    for j in 0..n {
        let (upper, lower) = matrix.split_at_mut((j + 1) * n);
        let row_j = &mut upper[j * n..];
        let diagonal = row_j[j] - row_j[..j].iter().map(|v| v * v).sum::<f64>();
        if diagonal <= 0.0 || !diagonal.is_finite() {
            return false;
        }
        let root = diagonal.sqrt();
        row_j[j] = root;
        row_j[j + 1..].fill(0.0);
        let inverse = 1.0 / root;
        let pivot = &row_j[..j];
        for row_i in lower[..(n - j - 1) * n].chunks_exact_mut(n) {
            let mut value = row_i[j];
            for (a, b) in row_i[..j].iter().zip(pivot) {
                value -= a * b;
            }
            row_i[j] = value * inverse;
        }
    }
    true
}

/// Householder reduction of a symmetric `n × n` row-major matrix (full storage, overwritten)
/// to tridiagonal form `T = Qᵀ A Q`, applying `Qᵀ` to `vector` as well. On return `diagonal`
/// (length n) and `off_diagonal` (length n − 1) hold T. With T, `A + rI` can be evaluated for
/// many shifts r in O(n) each ([`shifted_tridiagonal_terms`], [`shifted_tridiagonal_terms_batch`]).
/// Written for the small matrices of the GP (n ≈ 10): the reflector is read from a row (the
/// matrix is symmetric) and the products `A₂₂ v` sum with two accumulators, which keeps the
/// additions of one dot product from waiting on each other.
pub fn tridiagonalize(
    matrix: &mut [f64],
    n: usize,
    vector: &mut [f64],
    diagonal: &mut Vec<f64>,
    off_diagonal: &mut Vec<f64>,
    work: &mut Vec<f64>,
) {
    assert!(matrix.len() >= n * n && vector.len() >= n);
    off_diagonal.clear();
    work.clear();
    work.resize(2 * n, 0.0);
    let (reflector, product) = work.split_at_mut(n);
    for k in 0..n.saturating_sub(2) {
        let m = n - k - 1; // length of the column below the diagonal
        let v = &mut reflector[..m];
        v.copy_from_slice(&matrix[k * n + k + 1..(k + 1) * n]);
        let tail: f64 = v[1..].iter().map(|x| x * x).sum();
        if tail == 0.0 {
            off_diagonal.push(v[0]);
            continue;
        }
        let norm = (v[0] * v[0] + tail).sqrt();
        let alpha = if v[0] > 0.0 { -norm } else { norm };
        v[0] -= alpha;
        let beta = 2.0 / (v[0] * v[0] + tail);
        // p = β A₂₂ v, w = p − (β/2)(pᵀv) v, A₂₂ ← A₂₂ − v wᵀ − w vᵀ.
        let p = &mut product[..m];
        for (i, slot) in p.iter_mut().enumerate() {
            let row = &matrix[(k + 1 + i) * n + k + 1..(k + 2 + i) * n];
            let (mut even, mut odd) = (0.0, 0.0);
            for (a, b) in row.chunks_exact(2).zip(v.chunks_exact(2)) {
                even += a[0] * b[0];
                odd += a[1] * b[1];
            }
            if m % 2 == 1 {
                even += row[m - 1] * v[m - 1];
            }
            *slot = beta * (even + odd);
        }
        let half = 0.5 * beta * p.iter().zip(v.iter()).map(|(a, b)| a * b).sum::<f64>();
        for (slot, x) in p.iter_mut().zip(v.iter()) {
            *slot -= half * x;
        }
        for i in 0..m {
            let (vi, pi) = (v[i], p[i]);
            let row = &mut matrix[(k + 1 + i) * n + k + 1..(k + 2 + i) * n];
            for ((entry, vj), pj) in row.iter_mut().zip(v.iter()).zip(p.iter()) {
                *entry -= vi * pj + pi * vj;
            }
        }
        off_diagonal.push(alpha);
        let tail_vector = &mut vector[k + 1..n];
        let projection = beta
            * tail_vector
                .iter()
                .zip(v.iter())
                .map(|(a, b)| a * b)
                .sum::<f64>();
        for (slot, x) in tail_vector.iter_mut().zip(v.iter()) {
            *slot -= projection * x;
        }
    }
    if n >= 2 {
        off_diagonal.push(matrix[(n - 1) * n + n - 2]);
    }
    diagonal.clear();
    diagonal.extend((0..n).map(|i| matrix[i * n + i]));
}

/// For the tridiagonal `T` of [`tridiagonalize`] and the transformed vector `c = Qᵀy`: the
/// determinant `|T + rI| = mantissa · e^exponent` (kept apart so that callers can fold it into
/// one logarithm) and `cᵀ(T + rI)⁻¹c`, by the LDLᵀ recurrence; `None` if `T + rI` is not
/// positive definite.
pub fn shifted_tridiagonal_terms(
    diagonal: &[f64],
    off_diagonal: &[f64],
    vector: &[f64],
    shift: f64,
) -> Option<ShiftedTerms> {
    let [terms] = shifted_tridiagonal_terms_batch(diagonal, off_diagonal, vector, &[shift]);
    terms
}

/// [`shifted_tridiagonal_terms`] for `K` shifts at once. The LDLᵀ recurrence is a chain of
/// dependent divisions (one reciprocal of each pivot); running the `K` chains side by side lets
/// them overlap. Each shift gets the same operations in the same order as alone.
pub fn shifted_tridiagonal_terms_batch<const K: usize>(
    diagonal: &[f64],
    off_diagonal: &[f64],
    vector: &[f64],
    shifts: &[f64; K],
) -> [Option<ShiftedTerms>; K] {
    let mut inverse = [0.0; K];
    let mut carried = [0.0; K];
    let mut mantissa = [1.0; K];
    let mut exponent = [0.0; K];
    let mut quadratic = [0.0; K];
    let mut valid = [true; K];
    for (i, (a, c)) in diagonal.iter().zip(vector).enumerate() {
        let previous = if i == 0 { 0.0 } else { off_diagonal[i - 1] };
        for lane in 0..K {
            // pivot_i = a_i + r − e²/pivot_{i−1}, z_i = c_i − (e/pivot_{i−1}) z_{i−1}.
            let link = previous * inverse[lane];
            let pivot = a + shifts[lane] - link * previous;
            let z = c - link * carried[lane];
            valid[lane] &= pivot > 0.0 && pivot.is_finite();
            inverse[lane] = 1.0 / pivot;
            carried[lane] = z;
            quadratic[lane] += z * z * inverse[lane];
            mantissa[lane] *= pivot;
        }
        for lane in 0..K {
            if !(1e-150..=1e150).contains(&mantissa[lane]) {
                exponent[lane] += mantissa[lane].ln();
                mantissa[lane] = 1.0;
            }
        }
    }
    std::array::from_fn(|lane| {
        valid[lane].then_some(ShiftedTerms {
            determinant_mantissa: mantissa[lane],
            determinant_exponent: exponent[lane],
            quadratic: quadratic[lane],
        })
    })
}

/// Result of [`shifted_tridiagonal_terms`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShiftedTerms {
    pub determinant_mantissa: f64,
    pub determinant_exponent: f64,
    /// `cᵀ(T + rI)⁻¹c`.
    pub quadratic: f64,
}

impl ShiftedTerms {
    pub fn log_determinant(&self) -> f64 {
        self.determinant_exponent + self.determinant_mantissa.ln()
    }
}

/// Solves `L z = b` in place (forward substitution).
pub fn forward_substitute(lower: &[f64], n: usize, vector: &mut [f64]) {
    for i in 0..n {
        let row = &lower[i * n..i * n + i + 1];
        let dot: f64 = row[..i].iter().zip(&vector[..i]).map(|(a, b)| a * b).sum();
        vector[i] = (vector[i] - dot) / row[i];
    }
}

/// Solves `Lᵀ x = z` in place (back substitution).
pub fn back_substitute(lower: &[f64], n: usize, vector: &mut [f64]) {
    for i in (0..n).rev() {
        let mut value = vector[i];
        for k in i + 1..n {
            value -= lower[k * n + i] * vector[k];
        }
        vector[i] = value / lower[i * n + i];
    }
}

/// `log |A|` from its Cholesky factor: twice the log of the product of the diagonal, taken
/// with one logarithm (rescaling the product if it threatens to leave the f64 range).
pub fn log_determinant(lower: &[f64], n: usize) -> f64 {
    let mut product = 1.0;
    let mut logarithm = 0.0;
    for i in 0..n {
        product *= lower[i * n + i];
        if !(1e-150..=1e150).contains(&product) {
            logarithm += product.ln();
            product = 1.0;
        }
    }
    2.0 * (logarithm + product.ln())
}

/// Least squares `min ‖X β − y‖²` via the normal equations with a tiny ridge for stability.
/// `design` is row-major with `columns` columns. Returns `None` if singular.
pub fn least_squares(design: &[f64], columns: usize, targets: &[f64]) -> Option<Vec<f64>> {
    let rows = targets.len();
    let mut gram = vec![0.0; columns * columns];
    let mut moment = vec![0.0; columns];
    for row in 0..rows {
        let x = &design[row * columns..(row + 1) * columns];
        for a in 0..columns {
            moment[a] += x[a] * targets[row];
            for b in 0..=a {
                gram[a * columns + b] += x[a] * x[b];
            }
        }
    }
    for a in 0..columns {
        for b in 0..a {
            gram[b * columns + a] = gram[a * columns + b];
        }
        gram[a * columns + a] += 1e-9 * (1.0 + gram[a * columns + a]);
    }
    if !cholesky_in_place(&mut gram, columns) {
        return None;
    }
    forward_substitute(&gram, columns, &mut moment);
    back_substitute(&gram, columns, &mut moment);
    Some(moment)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_known_system() {
        // A = [[4, 2], [2, 3]] => L = [[2, 0], [1, √2]]; A x = [2, 1] => x = [0.5, 0].
        let mut matrix = vec![4.0, 2.0, 2.0, 3.0];
        assert!(cholesky_in_place(&mut matrix, 2));
        assert!((matrix[3] - 2f64.sqrt()).abs() < 1e-12);
        let mut rhs = vec![2.0, 1.0];
        forward_substitute(&matrix, 2, &mut rhs);
        back_substitute(&matrix, 2, &mut rhs);
        assert!((rhs[0] - 0.5).abs() < 1e-12 && rhs[1].abs() < 1e-12);
        assert!((log_determinant(&matrix, 2) - 8f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn cholesky_reproduces_a_random_spd_matrix_and_log_determinant() {
        // A = B Bᵀ + I for a fixed B (12 × 12): L Lᵀ must give A back, log|A| must match the
        // sum of log diagonal entries, and a large diagonal must not overflow the product.
        let n = 12;
        let b: Vec<f64> = (0..n * n)
            .map(|k| ((k * 37 % 101) as f64 / 50.0) - 1.0)
            .collect();
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (0..n).map(|k| b[i * n + k] * b[j * n + k]).sum::<f64>()
                    + if i == j { 1.0 } else { 0.0 };
            }
        }
        let mut lower = a.clone();
        assert!(cholesky_in_place(&mut lower, n));
        for i in 0..n {
            for j in 0..n {
                let product: f64 = (0..n).map(|k| lower[i * n + k] * lower[j * n + k]).sum();
                assert!((product - a[i * n + j]).abs() < 1e-10, "({i}, {j})");
            }
        }
        let direct: f64 = (0..n).map(|i| 2.0 * lower[i * n + i].ln()).sum();
        assert!((log_determinant(&lower, n) - direct).abs() < 1e-10);
        let big: Vec<f64> = (0..40 * 40)
            .map(|k| if k % 41 == 0 { 1e20 } else { 0.0 })
            .collect();
        let expected = 40.0 * 2.0 * 1e20f64.ln();
        assert!((log_determinant(&big, 40) - expected).abs() < 1e-9 * expected);
    }

    #[test]
    fn tridiagonal_shifts_agree_with_cholesky() {
        // Exponential-kernel correlation matrix of scattered points: log|A + rI| and
        // yᵀ(A + rI)⁻¹y from the tridiagonal form must equal the Cholesky values for every r.
        let n = 10;
        let points: Vec<f64> = (0..n).map(|i| ((i * 7919) % 13) as f64 * 0.37).collect();
        let targets: Vec<f64> = (0..n).map(|i| ((i * 31) % 11) as f64 - 5.0).collect();
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (-(points[i] - points[j]).abs() / 1.3).exp();
            }
        }
        let mut reduced = a.clone();
        let mut transformed = targets.clone();
        let (mut diagonal, mut off, mut work) = (Vec::new(), Vec::new(), Vec::new());
        tridiagonalize(
            &mut reduced,
            n,
            &mut transformed,
            &mut diagonal,
            &mut off,
            &mut work,
        );
        assert_eq!((diagonal.len(), off.len()), (n, n - 1));
        for shift in [1e-3, 0.05, 1.0] {
            let mut factor = a.clone();
            for i in 0..n {
                factor[i * n + i] += shift;
            }
            assert!(cholesky_in_place(&mut factor, n));
            let mut z = targets.clone();
            forward_substitute(&factor, n, &mut z);
            let quadratic: f64 = z.iter().map(|v| v * v).sum();
            let terms = shifted_tridiagonal_terms(&diagonal, &off, &transformed, shift).unwrap();
            let (log_det, quad) = (terms.log_determinant(), terms.quadratic);
            assert!(
                (log_det - log_determinant(&factor, n)).abs() < 1e-9,
                "shift {shift}"
            );
            assert!((quad - quadratic).abs() < 1e-9 * quadratic, "shift {shift}");
        }
        // A shift that makes the matrix indefinite is reported.
        assert!(shifted_tridiagonal_terms(&diagonal, &off, &transformed, -10.0).is_none());
    }

    #[test]
    fn batched_shifts_match_single_ones() {
        let n = 9;
        let points: Vec<f64> = (0..n).map(|i| ((i * 5417) % 17) as f64 * 0.29).collect();
        let mut matrix = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                matrix[i * n + j] = (-(points[i] - points[j]).abs() / 0.8).exp();
            }
        }
        let mut vector: Vec<f64> = (0..n).map(|i| ((i * 13) % 7) as f64 - 3.0).collect();
        let (mut diagonal, mut off, mut work) = (Vec::new(), Vec::new(), Vec::new());
        tridiagonalize(
            &mut matrix,
            n,
            &mut vector,
            &mut diagonal,
            &mut off,
            &mut work,
        );
        // Five shifts at once equal five single calls bit for bit; an indefinite shift is None.
        let shifts = [1e-3, 0.05, 1.0, -50.0, 0.2];
        let batch = shifted_tridiagonal_terms_batch(&diagonal, &off, &vector, &shifts);
        for (terms, shift) in batch.iter().zip(shifts) {
            assert_eq!(
                *terms,
                shifted_tridiagonal_terms(&diagonal, &off, &vector, shift)
            );
            assert_eq!(terms.is_none(), shift < 0.0);
        }
    }

    #[test]
    fn rejects_indefinite_matrix() {
        let mut matrix = vec![1.0, 2.0, 2.0, 1.0];
        assert!(!cholesky_in_place(&mut matrix, 2));
    }

    #[test]
    fn least_squares_recovers_line() {
        let design: Vec<f64> = (0..10).flat_map(|i| [1.0, f64::from(i)]).collect();
        let targets: Vec<f64> = (0..10).map(|i| 3.0 + 2.0 * f64::from(i)).collect();
        let beta = least_squares(&design, 2, &targets).unwrap();
        assert!((beta[0] - 3.0).abs() < 1e-6 && (beta[1] - 2.0).abs() < 1e-6);
    }
}

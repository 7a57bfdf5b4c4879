//! Small dense linear algebra for the forecasters (matrices of at most a few dozen rows, where a
//! hand-written Cholesky beats general-purpose crates; see `../shared/notes/dependencies.md`).

/// Lower-triangular Cholesky factor of a symmetric positive-definite `n × n` row-major matrix,
/// in place. Returns `false` if the matrix is not positive definite.
pub fn cholesky_in_place(matrix: &mut [f64], n: usize) -> bool {
    for j in 0..n {
        let mut diagonal = matrix[j * n + j];
        for k in 0..j {
            diagonal -= matrix[j * n + k] * matrix[j * n + k];
        }
        if diagonal <= 0.0 || !diagonal.is_finite() {
            return false;
        }
        let root = diagonal.sqrt();
        matrix[j * n + j] = root;
        for i in j + 1..n {
            let mut value = matrix[i * n + j];
            for k in 0..j {
                value -= matrix[i * n + k] * matrix[j * n + k];
            }
            matrix[i * n + j] = value / root;
        }
        for k in j + 1..n {
            matrix[j * n + k] = 0.0;
        }
    }
    true
}

/// Solves `L z = b` in place (forward substitution).
pub fn forward_substitute(lower: &[f64], n: usize, vector: &mut [f64]) {
    for i in 0..n {
        let mut value = vector[i];
        for k in 0..i {
            value -= lower[i * n + k] * vector[k];
        }
        vector[i] = value / lower[i * n + i];
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

/// `log |A|` from its Cholesky factor.
pub fn log_determinant(lower: &[f64], n: usize) -> f64 {
    (0..n).map(|i| 2.0 * lower[i * n + i].ln()).sum()
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

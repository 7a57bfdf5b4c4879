//! Gaussian-process forecaster with the history-dependent kernel of Pace §3.1.2.
//!
//! Training inputs are patterns `x̃_t = [t, y_{t−h}, …, y_{t−1}]` (Eq. 5) and the kernel is a
//! stationary kernel on those patterns (Eq. 6), exponential by default (Pace found it better than
//! RBF for non-smooth usage series), RBF selectable. Only the N most recent patterns are used.
//! Predictions follow Eq. 7–8 with a zero-mean prior on standardised targets.
//!
//! Choices the paper leaves open, made here:
//! - k steps ahead are forecast *directly*: for horizon j the GP is trained on pairs
//!   (`x̃_t`, `y_{t+j−1}`), so each step gets its own honest predictive variance instead of
//!   feeding means back (which would ignore the uncertainty of the fed-back inputs).
//! - The series window is standardised (mean 0, std 1) and the time coordinate is scaled to
//!   `index / N` so that time and values are on comparable scales.
//! - Hyperparameters (length-scale ℓ, noise ratio r = σn²/σf²) maximise the evidence over a
//!   grid; the signal variance σf² is profiled out in closed form (`σf² = yᵀ(K₀ + rI)⁻¹y / n`).
//!   The grid search can be repeated only every `refit_every` calls to save time.
//! - The reported variance is that of a new *observation* (Eq. 8 plus σn²), since it is
//!   compared with observed usage.

use serde::{Deserialize, Serialize};

use super::linalg::{back_substitute, cholesky_in_place, forward_substitute, log_determinant};
use super::{Forecast, ForecastError, Forecaster, check_history};

/// Kernel applied to the transformed inputs (Pace Eq. 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernel {
    /// `exp(−‖x − x'‖ / ℓ)`.
    Exponential,
    /// `exp(−‖x − x'‖² / (2ℓ²))`.
    Rbf,
}

impl Kernel {
    fn correlation(self, distance_squared: f64, length_scale: f64) -> f64 {
        match self {
            Kernel::Exponential => (-distance_squared.sqrt() / length_scale).exp(),
            Kernel::Rbf => (-distance_squared / (2.0 * length_scale * length_scale)).exp(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GpConfig {
    /// History window h (pattern length). Pace uses 10.
    pub window: usize,
    /// Number N of most recent patterns to train on. Pace uses N = h.
    pub patterns: usize,
    pub kernel: Kernel,
    /// Redo the evidence maximisation every this many calls (1 = every call).
    pub refit_every: usize,
}

impl Default for GpConfig {
    fn default() -> Self {
        Self {
            window: 10,
            patterns: 10,
            kernel: Kernel::Exponential,
            refit_every: 1,
        }
    }
}

/// Length-scale multipliers (of the median pattern distance) and noise ratios searched.
const LENGTH_FACTORS: [f64; 5] = [0.25, 0.5, 1.0, 2.0, 4.0];
const NOISE_RATIOS: [f64; 5] = [1e-3, 1e-2, 0.05, 0.2, 1.0];
/// Smallest standard deviation treated as a varying series (relative to its level).
const FLAT_SERIES: f64 = 1e-9;

#[derive(Debug, Clone)]
pub struct GpForecaster {
    config: GpConfig,
    calls: usize,
    /// Cached (length scale relative to median distance, noise ratio).
    hyper: Option<(f64, f64)>,
    scratch: Scratch,
}

#[derive(Debug, Clone, Default)]
struct Scratch {
    inputs: Vec<f64>,
    distances: Vec<f64>,
    matrix: Vec<f64>,
    weights: Vec<f64>,
    cross: Vec<f64>,
}

impl GpForecaster {
    pub fn new(config: GpConfig) -> Self {
        Self {
            config: GpConfig {
                window: config.window.max(1),
                patterns: config.patterns.max(2),
                kernel: config.kernel,
                refit_every: config.refit_every.max(1),
            },
            calls: 0,
            hyper: None,
            scratch: Scratch::default(),
        }
    }

    pub fn config(&self) -> &GpConfig {
        &self.config
    }

    /// Log evidence (with σf² profiled out) of targets `y` under correlation matrix built from
    /// `distances`, or `None` if the matrix is not positive definite.
    fn log_evidence(
        &mut self,
        n: usize,
        targets: &[f64],
        length_scale: f64,
        noise_ratio: f64,
    ) -> Option<f64> {
        self.build_matrix(n, length_scale, noise_ratio);
        let scratch = &mut self.scratch;
        if !cholesky_in_place(&mut scratch.matrix, n) {
            return None;
        }
        scratch.weights.clear();
        scratch.weights.extend_from_slice(targets);
        forward_substitute(&scratch.matrix, n, &mut scratch.weights);
        let quadratic: f64 = scratch.weights.iter().map(|z| z * z).sum();
        let signal = (quadratic / n as f64).max(1e-12);
        let count = n as f64;
        Some(
            -0.5 * count * signal.ln()
                - 0.5 * log_determinant(&scratch.matrix, n)
                - 0.5 * count * (1.0 + (2.0 * std::f64::consts::PI).ln()),
        )
    }

    fn build_matrix(&mut self, n: usize, length_scale: f64, noise_ratio: f64) {
        let kernel = self.config.kernel;
        let scratch = &mut self.scratch;
        scratch.matrix.clear();
        scratch.matrix.resize(n * n, 0.0);
        for i in 0..n {
            for j in 0..i {
                let value = kernel.correlation(scratch.distances[i * n + j], length_scale);
                scratch.matrix[i * n + j] = value;
                scratch.matrix[j * n + i] = value;
            }
            scratch.matrix[i * n + i] = 1.0 + noise_ratio;
        }
    }
}

impl Default for GpForecaster {
    fn default() -> Self {
        Self::new(GpConfig::default())
    }
}

impl Forecaster for GpForecaster {
    fn min_history(&self) -> usize {
        self.config.window + 2
    }

    fn name(&self) -> &'static str {
        "gp"
    }

    fn forecast(
        &mut self,
        history: &[f64],
        horizon: usize,
    ) -> Result<Vec<Forecast>, ForecastError> {
        check_history(history, self.min_history(), horizon)?;
        let h = self.config.window;
        // Patterns end at the last observation; keep the N newest plus what horizons need.
        // Horizon j can train on all but the newest j patterns, so N + horizon patterns give
        // every horizon N training pairs when the history is long enough.
        let used_patterns = (self.config.patterns + horizon).min(history.len() - h + 1);
        let series = &history[history.len() - (used_patterns + h - 1)..];
        let level = series.iter().sum::<f64>() / series.len() as f64;
        let spread = (series
            .iter()
            .map(|v| (v - level) * (v - level))
            .sum::<f64>()
            / series.len() as f64)
            .sqrt();
        if spread <= FLAT_SERIES * (1.0 + level.abs()) {
            // A flat window carries no information about variation: forecast the level.
            return Ok(vec![
                Forecast {
                    mean: level,
                    variance: 0.0,
                };
                horizon
            ]);
        }
        let standardized: Vec<f64> = series.iter().map(|v| (v - level) / spread).collect();
        // Pattern p (0-based, oldest first) covers standardized[p .. p + h] and its one-step
        // target is standardized[p + h]; the newest pattern (index used_patterns − 1) has none.
        let dimension = h + 1;
        let time_scale = self.config.patterns as f64;
        let pattern_count = used_patterns;
        let scratch = &mut self.scratch;
        scratch.inputs.clear();
        for pattern in 0..pattern_count {
            scratch.inputs.push(pattern as f64 / time_scale);
            scratch
                .inputs
                .extend_from_slice(&standardized[pattern..pattern + h]);
        }
        let query = pattern_count - 1;

        let mut forecasts = Vec::with_capacity(horizon);
        let refit = self.hyper.is_none() || self.calls.is_multiple_of(self.config.refit_every);
        self.calls += 1;
        for step in 1..=horizon {
            // Training pairs for this horizon: pattern p → standardized[p + h + step − 1].
            let last_trainable = pattern_count.saturating_sub(step); // exclusive
            let first = last_trainable.saturating_sub(self.config.patterns);
            let n = last_trainable - first;
            if n < 2 {
                let fallback = forecasts.last().copied().unwrap_or(Forecast {
                    mean: level,
                    variance: spread * spread,
                });
                forecasts.push(fallback);
                continue;
            }
            let targets: Vec<f64> = (first..last_trainable)
                .map(|p| standardized[p + h + step - 1])
                .collect();
            // Pairwise squared distances between the training patterns and to the query.
            let scratch = &mut self.scratch;
            scratch.distances.clear();
            scratch.distances.resize(n * n, 0.0);
            scratch.cross.clear();
            let squared = |a: usize, b: usize, inputs: &[f64]| -> f64 {
                let (x, y) = (
                    &inputs[a * dimension..(a + 1) * dimension],
                    &inputs[b * dimension..(b + 1) * dimension],
                );
                x.iter().zip(y).map(|(u, v)| (u - v) * (u - v)).sum()
            };
            let mut pairwise = Vec::with_capacity(n * (n - 1) / 2);
            for i in 0..n {
                for j in 0..i {
                    let d = squared(first + i, first + j, &scratch.inputs);
                    scratch.distances[i * n + j] = d;
                    scratch.distances[j * n + i] = d;
                    pairwise.push(d);
                }
                let to_query = squared(first + i, query, &scratch.inputs);
                scratch.cross.push(to_query);
            }
            pairwise.sort_unstable_by(f64::total_cmp);
            let median_distance = pairwise[pairwise.len() / 2].sqrt().max(1e-6);

            if step == 1 && refit {
                let mut best: Option<(f64, f64, f64)> = None;
                for factor in LENGTH_FACTORS {
                    for ratio in NOISE_RATIOS {
                        if let Some(evidence) =
                            self.log_evidence(n, &targets, factor * median_distance, ratio)
                            && best.is_none_or(|(b, _, _)| evidence > b)
                        {
                            best = Some((evidence, factor, ratio));
                        }
                    }
                }
                self.hyper = best
                    .map(|(_, factor, ratio)| (factor, ratio))
                    .or(self.hyper);
            }
            let (factor, ratio) = self.hyper.unwrap_or((1.0, 0.1));
            let length_scale = factor * median_distance;
            self.build_matrix(n, length_scale, ratio);
            let kernel = self.config.kernel;
            let scratch = &mut self.scratch;
            if !cholesky_in_place(&mut scratch.matrix, n) {
                forecasts.push(Forecast {
                    mean: level,
                    variance: spread * spread,
                });
                continue;
            }
            scratch.weights.clear();
            scratch.weights.extend_from_slice(&targets);
            forward_substitute(&scratch.matrix, n, &mut scratch.weights);
            let signal = (scratch.weights.iter().map(|z| z * z).sum::<f64>() / n as f64).max(1e-12);
            back_substitute(&scratch.matrix, n, &mut scratch.weights);
            // k* (correlations to the query), Eq. 7 mean and Eq. 8 variance.
            let mut correlations: Vec<f64> = scratch
                .cross
                .iter()
                .map(|d| kernel.correlation(*d, length_scale))
                .collect();
            let mean: f64 = correlations
                .iter()
                .zip(&scratch.weights)
                .map(|(k, w)| k * w)
                .sum();
            forward_substitute(&scratch.matrix, n, &mut correlations);
            let explained: f64 = correlations.iter().map(|v| v * v).sum();
            let latent = (1.0 - explained).max(0.0);
            let variance = signal * (latent + ratio);
            forecasts.push(Forecast {
                mean: level + spread * mean,
                variance: spread * spread * variance,
            });
        }
        Ok(forecasts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn learns_a_repeating_pattern() {
        // Period-4 pattern: the history kernel sees identical patterns and predicts the next.
        let base = [10.0, 20.0, 15.0, 5.0];
        let series: Vec<f64> = (0..40).map(|i| base[i % 4]).collect();
        let mut gp = GpForecaster::new(GpConfig {
            window: 4,
            patterns: 12,
            ..GpConfig::default()
        });
        let forecasts = gp.forecast(&series, 3).unwrap();
        for (step, forecast) in forecasts.iter().enumerate() {
            let expected = base[(40 + step) % 4];
            assert!(
                (forecast.mean - expected).abs() < 1.0,
                "step {step}: {forecast:?} expected {expected}"
            );
            assert!(forecast.std_dev() < 3.0);
        }
    }

    #[test]
    fn noisy_series_gets_calibrated_intervals() {
        // AR(1) around 50 with unit noise: 2σ intervals should cover most one-step outcomes.
        let mut rng = StdRng::seed_from_u64(5);
        let mut value: f64 = 50.0;
        let mut series = Vec::new();
        for _ in 0..600 {
            let noise: f64 = (0..12).map(|_| rng.random::<f64>()).sum::<f64>() - 6.0;
            value = 50.0 + 0.7 * (value - 50.0) + noise;
            series.push(value);
        }
        let mut gp = GpForecaster::default();
        let (mut covered, mut total) = (0, 0);
        for end in 30..series.len() {
            let forecast = gp.forecast(&series[..end], 1).unwrap()[0];
            total += 1;
            if forecast.covers(series[end], 2.0) {
                covered += 1;
            }
        }
        let coverage = f64::from(covered) / f64::from(total);
        assert!(coverage > 0.8, "coverage {coverage}");
    }

    #[test]
    fn flat_series_forecasts_its_level() {
        let mut gp = GpForecaster::default();
        let forecasts = gp.forecast(&[7.0; 30], 2).unwrap();
        assert_eq!(forecasts[1].mean, 7.0);
        assert_eq!(forecasts[1].variance, 0.0);
    }

    #[test]
    fn rbf_kernel_is_selectable_and_errors_are_reported() {
        let mut gp = GpForecaster::new(GpConfig {
            kernel: Kernel::Rbf,
            ..GpConfig::default()
        });
        let series: Vec<f64> = (0..30).map(|i| f64::from(i % 7)).collect();
        assert_eq!(gp.forecast(&series, 2).unwrap().len(), 2);
        assert!(matches!(
            gp.forecast(&series[..5], 1),
            Err(ForecastError::TooShort { .. })
        ));
        assert!(matches!(
            gp.forecast(&series, 0),
            Err(ForecastError::ZeroHorizon)
        ));
        let mut bad = series.clone();
        bad[3] = f64::NAN;
        assert!(matches!(
            gp.forecast(&bad, 1),
            Err(ForecastError::NotFinite { index: 3, .. })
        ));
    }
}

//! ARIMA(p, d, q) forecaster with automatic order selection by AIC (Pace §3.1.1, Eq. 2), fitted
//! by conditional sum of squares (CSS), with the k-step forecast-error variance from the ψ-weights
//! (`Var e_t(k) = σ² Σ_{j<k} ψ_j²`, Pace §3.1.3).
//!
//! Choices made here:
//! - d ∈ {0, 1}; p ≤ 3, q ≤ 2 by default (Pace reports the optimiser settles on p ≤ 3).
//! - For d = 0 the series mean is removed first (the constant δ); for d = 1 no drift.
//! - Every candidate is scored on the same observations (residuals from index
//!   `max_p + max_d` on), so AICs of different d are comparable: with d ≤ 1 the conditional
//!   likelihood of `y` given its first values equals that of the differenced series.
//! - q = 0 is fitted exactly by least squares; q > 0 by Nelder–Mead on the CSS, starting from the
//!   AR least-squares fit, rejecting non-stationary AR and non-invertible MA polynomials.
//! - σ² = CSS / n (the maximum-likelihood estimate).

use serde::{Deserialize, Serialize};

use super::linalg::least_squares;
use super::{Forecast, ForecastError, Forecaster, check_history};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ArimaConfig {
    pub max_p: usize,
    pub max_d: usize,
    pub max_q: usize,
    /// Redo the order search and fit every this many calls (1 = every call); between refits the
    /// chosen coefficients are reused on the new data.
    pub refit_every: usize,
}

impl Default for ArimaConfig {
    fn default() -> Self {
        Self {
            max_p: 3,
            max_d: 1,
            max_q: 2,
            refit_every: 1,
        }
    }
}

/// A fitted ARIMA model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArimaModel {
    pub p: usize,
    pub d: usize,
    pub q: usize,
    /// φ_1 … φ_p.
    pub ar: Vec<f64>,
    /// θ_1 … θ_q (MA polynomial 1 + Σ θ_j L^j).
    pub ma: Vec<f64>,
    /// Innovation variance σ².
    pub sigma2: f64,
    pub aic: f64,
    /// Observations the CSS was summed over.
    pub observations: usize,
}

/// Stationarity of `1 − Σ φ_i L^i` by the step-down (reverse Levinson–Durbin) recursion: all
/// partial autocorrelations must lie strictly inside (−1, 1).
pub fn is_stationary(ar: &[f64]) -> bool {
    let mut coefficients = ar.to_vec();
    for order in (1..=coefficients.len()).rev() {
        let reflection = coefficients[order - 1];
        if !reflection.is_finite() || reflection.abs() >= 1.0 - 1e-9 {
            return false;
        }
        let scale = 1.0 - reflection * reflection;
        let previous: Vec<f64> = (0..order - 1)
            .map(|j| (coefficients[j] + reflection * coefficients[order - 2 - j]) / scale)
            .collect();
        coefficients = previous;
    }
    true
}

/// Invertibility of `1 + Σ θ_j L^j` (same test on −θ).
pub fn is_invertible(ma: &[f64]) -> bool {
    let negated: Vec<f64> = ma.iter().map(|theta| -theta).collect();
    is_stationary(&negated)
}

/// The series the ARMA part models: mean-removed `y` for d = 0, first differences for d = 1.
fn transformed(series: &[f64], d: usize) -> (Vec<f64>, f64) {
    if d == 0 {
        let mean = series.iter().sum::<f64>() / series.len() as f64;
        (series.iter().map(|y| y - mean).collect(), mean)
    } else {
        (
            series.windows(2).map(|pair| pair[1] - pair[0]).collect(),
            0.0,
        )
    }
}

/// CSS residuals of the ARMA(p, q) on `w` (pre-sample errors zero); returns the sum of squares
/// from `start` on.
fn residuals(w: &[f64], ar: &[f64], ma: &[f64], start: usize, out: &mut Vec<f64>) -> f64 {
    let p = ar.len();
    out.clear();
    out.resize(w.len(), 0.0);
    let mut sum = 0.0;
    for t in p..w.len() {
        let mut error = w[t];
        for (i, phi) in ar.iter().enumerate() {
            error -= phi * w[t - 1 - i];
        }
        for (j, theta) in ma.iter().enumerate() {
            if t > j {
                error -= theta * out[t - 1 - j];
            }
        }
        out[t] = error;
        if t >= start {
            sum += error * error;
        }
    }
    sum
}

/// Minimises `objective` with Nelder–Mead from `start` (dimension ≤ a handful).
fn nelder_mead(objective: impl Fn(&[f64]) -> f64, start: &[f64], step: f64) -> (Vec<f64>, f64) {
    let dimension = start.len();
    let mut simplex: Vec<Vec<f64>> = vec![start.to_vec()];
    for axis in 0..dimension {
        let mut vertex = start.to_vec();
        vertex[axis] += step;
        simplex.push(vertex);
    }
    let mut values: Vec<f64> = simplex.iter().map(|v| objective(v)).collect();
    for _ in 0..200 * dimension {
        let mut order: Vec<usize> = (0..=dimension).collect();
        order.sort_by(|a, b| values[*a].total_cmp(&values[*b]));
        simplex = order.iter().map(|i| simplex[*i].clone()).collect();
        values = order.iter().map(|i| values[*i]).collect();
        let (best, worst) = (values[0], values[dimension]);
        if (worst - best).abs() <= 1e-10 * (best.abs() + 1e-12) {
            break;
        }
        let centroid: Vec<f64> = (0..dimension)
            .map(|k| simplex[..dimension].iter().map(|v| v[k]).sum::<f64>() / dimension as f64)
            .collect();
        let along = |factor: f64| -> Vec<f64> {
            (0..dimension)
                .map(|k| centroid[k] + factor * (simplex[dimension][k] - centroid[k]))
                .collect()
        };
        let reflected = along(-1.0);
        let reflected_value = objective(&reflected);
        if reflected_value < values[0] {
            let expanded = along(-2.0);
            let expanded_value = objective(&expanded);
            if expanded_value < reflected_value {
                simplex[dimension] = expanded;
                values[dimension] = expanded_value;
            } else {
                simplex[dimension] = reflected;
                values[dimension] = reflected_value;
            }
        } else if reflected_value < values[dimension - 1] {
            simplex[dimension] = reflected;
            values[dimension] = reflected_value;
        } else {
            let contracted = along(0.5);
            let contracted_value = objective(&contracted);
            if contracted_value < values[dimension] {
                simplex[dimension] = contracted;
                values[dimension] = contracted_value;
            } else {
                for index in 1..=dimension {
                    let shrunk: Vec<f64> = (0..dimension)
                        .map(|k| simplex[0][k] + 0.5 * (simplex[index][k] - simplex[0][k]))
                        .collect();
                    values[index] = objective(&shrunk);
                    simplex[index] = shrunk;
                }
            }
        }
    }
    let best = (0..=dimension)
        .min_by(|a, b| values[*a].total_cmp(&values[*b]))
        .unwrap_or(0);
    (simplex[best].clone(), values[best])
}

/// Fits ARIMA(p, d, q) by CSS, scoring residuals of `y` from index `start` (≥ p + d).
pub fn fit_arima(series: &[f64], p: usize, d: usize, q: usize, start: usize) -> Option<ArimaModel> {
    if d > 1 || start < p + d || series.len() <= start {
        return None;
    }
    let (w, _) = transformed(series, d);
    let start_w = start - d;
    let observations = w.len() - start_w;
    let parameters = p + q + usize::from(d == 0) + 1;
    if observations < parameters + 2 {
        return None;
    }
    // AR part by least squares on the scored sample.
    let ar = if p == 0 {
        Vec::new()
    } else {
        let rows = w.len() - start_w;
        let mut design = Vec::with_capacity(rows * p);
        for t in start_w..w.len() {
            for lag in 1..=p {
                design.push(w[t - lag]);
            }
        }
        least_squares(&design, p, &w[start_w..])?
    };
    let mut scratch = Vec::new();
    let (ar, ma, css) = if q == 0 {
        if !is_stationary(&ar) {
            return None;
        }
        let css = residuals(&w, &ar, &[], start_w, &mut scratch);
        (ar, Vec::new(), css)
    } else {
        let mut initial = if is_stationary(&ar) { ar } else { vec![0.0; p] };
        initial.extend(std::iter::repeat_n(0.0, q));
        let objective = |parameters: &[f64]| -> f64 {
            let (ar, ma) = parameters.split_at(p);
            if !is_stationary(ar) || !is_invertible(ma) {
                return f64::INFINITY;
            }
            let mut buffer = Vec::with_capacity(w.len());
            residuals(&w, ar, ma, start_w, &mut buffer)
        };
        let (best, css) = nelder_mead(objective, &initial, 0.1);
        if !css.is_finite() {
            return None;
        }
        let (ar, ma) = best.split_at(p);
        (ar.to_vec(), ma.to_vec(), css)
    };
    let count = observations as f64;
    let sigma2 = (css / count).max(1e-300);
    Some(ArimaModel {
        p,
        d,
        q,
        ar,
        ma,
        sigma2,
        aic: count * sigma2.ln() + 2.0 * parameters as f64,
        observations,
    })
}

/// Searches p ≤ max_p, d ≤ max_d, q ≤ max_q and returns the fit with the lowest AIC.
pub fn select_order(series: &[f64], config: &ArimaConfig) -> Option<ArimaModel> {
    let max_d = config.max_d.min(1);
    let start = config.max_p + max_d;
    let mut best: Option<ArimaModel> = None;
    for d in 0..=max_d {
        for p in 0..=config.max_p {
            for q in 0..=config.max_q {
                if let Some(model) = fit_arima(series, p, d, q, start)
                    && best.as_ref().is_none_or(|b| model.aic < b.aic)
                {
                    best = Some(model);
                }
            }
        }
    }
    best
}

impl ArimaModel {
    /// ψ-weights ψ_0 … ψ_{count−1} of the full model `φ(L)(1 − L)^d y = θ(L) ε`.
    pub fn psi_weights(&self, count: usize) -> Vec<f64> {
        let mut full_ar = self.ar.clone();
        if self.d == 1 {
            // φ(L)(1 − L): coefficients of y_{t−i} on the right-hand side.
            full_ar.push(0.0);
            let original = self.ar.clone();
            full_ar[0] = original.first().copied().unwrap_or(0.0) + 1.0;
            for i in 1..full_ar.len() {
                let current = original.get(i).copied().unwrap_or(0.0);
                full_ar[i] = current - original[i - 1];
            }
        }
        let mut psi = Vec::with_capacity(count);
        for j in 0..count {
            let mut value = if j == 0 {
                1.0
            } else {
                self.ma.get(j - 1).copied().unwrap_or(0.0)
            };
            for (i, phi) in full_ar.iter().enumerate() {
                if j > i {
                    value += phi * psi[j - 1 - i];
                }
            }
            psi.push(value);
        }
        psi
    }

    /// Forecasts 1 … horizon steps after the end of `series` with this model's coefficients.
    pub fn forecast(&self, series: &[f64], horizon: usize) -> Vec<Forecast> {
        let (mut w, mean) = transformed(series, self.d);
        let mut errors = Vec::new();
        residuals(&w, &self.ar, &self.ma, w.len(), &mut errors);
        let known = w.len();
        for step in 0..horizon {
            let t = known + step;
            let mut value = 0.0;
            for (i, phi) in self.ar.iter().enumerate() {
                if t > i {
                    value += phi * w[t - 1 - i];
                }
            }
            for (j, theta) in self.ma.iter().enumerate() {
                // Future innovations have expectation zero; only past residuals count.
                if t > j && t - 1 - j < known {
                    value += theta * errors[t - 1 - j];
                }
            }
            w.push(value);
        }
        let psi = self.psi_weights(horizon);
        let mut level = series.last().copied().unwrap_or(0.0);
        let mut cumulative = 0.0;
        (0..horizon)
            .map(|step| {
                cumulative += psi[step] * psi[step];
                let mean_value = if self.d == 0 {
                    mean + w[known + step]
                } else {
                    level += w[known + step];
                    level
                };
                Forecast {
                    mean: mean_value,
                    variance: self.sigma2 * cumulative,
                }
            })
            .collect()
    }
}

/// [`Forecaster`] that selects and fits an ARIMA model on the history it is given.
#[derive(Debug, Clone, Default)]
pub struct ArimaForecaster {
    config: ArimaConfig,
    calls: usize,
    model: Option<ArimaModel>,
}

impl ArimaForecaster {
    pub fn new(config: ArimaConfig) -> Self {
        Self {
            config: ArimaConfig {
                refit_every: config.refit_every.max(1),
                max_d: config.max_d.min(1),
                ..config
            },
            calls: 0,
            model: None,
        }
    }

    /// The model used by the last forecast.
    pub fn model(&self) -> Option<&ArimaModel> {
        self.model.as_ref()
    }
}

impl Forecaster for ArimaForecaster {
    fn min_history(&self) -> usize {
        self.config.max_p + self.config.max_d.min(1) + 3
    }

    fn name(&self) -> &'static str {
        "arima"
    }

    fn forecast(
        &mut self,
        history: &[f64],
        horizon: usize,
    ) -> Result<Vec<Forecast>, ForecastError> {
        check_history(history, self.min_history(), horizon)?;
        let level = history.iter().sum::<f64>() / history.len() as f64;
        let flat = history
            .iter()
            .all(|value| (value - history[0]).abs() <= 1e-12 * (1.0 + level.abs()));
        if flat {
            return Ok(vec![
                Forecast {
                    mean: history[0],
                    variance: 0.0,
                };
                horizon
            ]);
        }
        if self.model.is_none() || self.calls.is_multiple_of(self.config.refit_every) {
            self.model = select_order(history, &self.config).or(self.model.take());
        }
        self.calls += 1;
        match &self.model {
            Some(model) => Ok(model.forecast(history, horizon)),
            None => {
                // No order could be fitted (too few points for any candidate): random walk with
                // the variance of the observed steps.
                let steps: Vec<f64> = history.windows(2).map(|p| p[1] - p[0]).collect();
                let variance = steps.iter().map(|s| s * s).sum::<f64>() / steps.len().max(1) as f64;
                let last = history[history.len() - 1];
                Ok((1..=horizon)
                    .map(|k| Forecast {
                        mean: last,
                        variance: variance * k as f64,
                    })
                    .collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    fn gaussian(rng: &mut StdRng) -> f64 {
        // Box–Muller.
        let u: f64 = rng.random::<f64>().max(1e-300);
        let v: f64 = rng.random::<f64>();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    #[test]
    fn stationarity_and_invertibility_checks() {
        assert!(is_stationary(&[0.5]));
        assert!(!is_stationary(&[1.1]));
        assert!(is_stationary(&[0.5, 0.3]));
        assert!(!is_stationary(&[0.5, 0.6])); // root inside the unit circle
        assert!(is_invertible(&[0.4]));
        assert!(!is_invertible(&[-1.2]));
    }

    #[test]
    fn recovers_ar1_coefficient_and_variance() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut series = vec![0.0];
        for _ in 0..2000 {
            let last = series[series.len() - 1];
            series.push(0.6 * last + gaussian(&mut rng));
        }
        let model = fit_arima(&series, 1, 0, 0, 4).unwrap();
        assert!((model.ar[0] - 0.6).abs() < 0.05, "{model:?}");
        assert!((model.sigma2 - 1.0).abs() < 0.1, "{model:?}");
        let selected = select_order(&series, &ArimaConfig::default()).unwrap();
        assert_eq!(selected.d, 0, "{selected:?}");
        assert!(selected.p >= 1);
    }

    #[test]
    fn recovers_ma1_coefficient() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut previous = 0.0;
        let mut series = Vec::new();
        for _ in 0..3000 {
            let shock = gaussian(&mut rng);
            series.push(10.0 + shock + 0.5 * previous);
            previous = shock;
        }
        let model = fit_arima(&series, 0, 0, 1, 4).unwrap();
        assert!((model.ma[0] - 0.5).abs() < 0.06, "{model:?}");
    }

    #[test]
    fn random_walk_selects_differencing_and_variance_grows_linearly() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut series = vec![100.0];
        for _ in 0..1000 {
            let last = series[series.len() - 1];
            series.push(last + gaussian(&mut rng));
        }
        let model = select_order(&series, &ArimaConfig::default()).unwrap();
        assert_eq!(model.d, 1, "{model:?}");
        // For a pure random walk ψ_j = 1, so Var e(k) = k σ².
        let pure = ArimaModel {
            p: 0,
            d: 1,
            q: 0,
            ar: vec![],
            ma: vec![],
            sigma2: 2.0,
            aic: 0.0,
            observations: 0,
        };
        let forecasts = pure.forecast(&series, 3);
        assert_eq!(forecasts[2].mean, series[series.len() - 1]);
        assert!((forecasts[2].variance - 6.0).abs() < 1e-12);
    }

    #[test]
    fn known_ar1_forecast_and_psi_weights() {
        // y_t = 0.5 y_{t−1} + ε around mean 0: forecasts decay geometrically, ψ_j = 0.5^j.
        let model = ArimaModel {
            p: 1,
            d: 0,
            q: 0,
            ar: vec![0.5],
            ma: vec![],
            sigma2: 1.0,
            aic: 0.0,
            observations: 0,
        };
        let series = [-2.0, 2.0, -2.0, 2.0, 4.0]; // mean 0.8
        let forecasts = model.forecast(&series, 2);
        assert!((forecasts[0].mean - (0.8 + 0.5 * 3.2)).abs() < 1e-12);
        assert!((forecasts[1].mean - (0.8 + 0.25 * 3.2)).abs() < 1e-12);
        assert!((forecasts[1].variance - 1.25).abs() < 1e-12);
        let psi = ArimaModel { d: 1, ..model }.psi_weights(3);
        // (1 − 0.5L)(1 − L): ψ = 1, 1.5, 1.75.
        assert!((psi[1] - 1.5).abs() < 1e-12 && (psi[2] - 1.75).abs() < 1e-12);
    }

    #[test]
    fn forecaster_interval_coverage_on_ar1() {
        let mut rng = StdRng::seed_from_u64(4);
        let mut series = vec![0.0];
        for _ in 0..800 {
            let last = series[series.len() - 1];
            series.push(0.5 * last + gaussian(&mut rng));
        }
        let mut forecaster = ArimaForecaster::new(ArimaConfig::default());
        let (mut covered, mut total) = (0, 0);
        for end in (200..series.len()).step_by(3) {
            let forecast = forecaster.forecast(&series[end - 200..end], 1).unwrap()[0];
            total += 1;
            if forecast.covers(series[end], 2.0) {
                covered += 1;
            }
        }
        let coverage = f64::from(covered) / f64::from(total);
        assert!(coverage > 0.88 && coverage < 0.99, "{coverage}");
    }
}

//! Usage forecasting (Pace §3.1): a GP with the history-dependent kernel and ARIMA with AIC
//! order selection, both returning a mean and a variance for every step ahead, behind one
//! [`Forecaster`] trait that the worker's resource shaper uses.

pub mod arima;
pub mod gp;
pub mod linalg;
pub mod shaping;

use serde::{Deserialize, Serialize};

pub use arima::{ArimaConfig, ArimaForecaster, ArimaModel};
pub use gp::{GpConfig, GpForecaster, Kernel};

/// Predictive distribution of one future observation (Gaussian: mean and variance).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Forecast {
    pub mean: f64,
    pub variance: f64,
}

impl Forecast {
    pub fn std_dev(&self) -> f64 {
        self.variance.max(0.0).sqrt()
    }

    /// `mean ± z·σ` contains `value`.
    pub fn covers(&self, value: f64, z: f64) -> bool {
        (value - self.mean).abs() <= z * self.std_dev()
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ForecastError {
    #[error("need at least {needed} observations to forecast, got {got}")]
    TooShort { needed: usize, got: usize },
    #[error("observation {index} is not finite ({value})")]
    NotFinite { index: usize, value: f64 },
    #[error("horizon must be at least 1")]
    ZeroHorizon,
}

/// A usage forecaster. `history` is the observed series, oldest first, at a fixed sampling
/// interval; the result holds `horizon` forecasts for 1, 2, …, `horizon` steps ahead.
/// Implementations may cache hyperparameters between calls (hence `&mut self`), so one
/// forecaster instance should follow one series.
pub trait Forecaster {
    fn forecast(&mut self, history: &[f64], horizon: usize)
    -> Result<Vec<Forecast>, ForecastError>;

    /// Observations a call needs at minimum.
    fn min_history(&self) -> usize;

    fn name(&self) -> &'static str;
}

pub(crate) fn check_history(
    history: &[f64],
    needed: usize,
    horizon: usize,
) -> Result<(), ForecastError> {
    if horizon == 0 {
        return Err(ForecastError::ZeroHorizon);
    }
    if history.len() < needed {
        return Err(ForecastError::TooShort {
            needed,
            got: history.len(),
        });
    }
    if let Some((index, value)) = history.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(ForecastError::NotFinite {
            index,
            value: *value,
        });
    }
    Ok(())
}

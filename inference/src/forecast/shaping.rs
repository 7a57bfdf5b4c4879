//! The forecasters behind the live resource shaper ([`scheduler_core::shaping`]): one GP (Pace
//! §3.1, the default) or ARIMA forecaster per usage series, forecasting the next interval's
//! peak one step ahead.

use super::{ArimaConfig, ArimaForecaster, Forecaster, GpConfig, GpForecaster};
use scheduler_core::shaper::UsageForecast;
use scheduler_core::shaping::{ForecasterFactory, SeriesForecaster};
use serde::{Deserialize, Serialize};

/// Which forecaster shapes (Pace §4 compares both; GP with K2 = 3 is its best).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForecasterKind {
    #[default]
    Gp,
    Arima,
}

impl std::str::FromStr for ForecasterKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gp" => Ok(ForecasterKind::Gp),
            "arima" => Ok(ForecasterKind::Arima),
            other => Err(format!(
                "unknown forecaster {other:?}: expected \"gp\" or \"arima\""
            )),
        }
    }
}

impl ForecasterFactory for ForecasterKind {
    fn series(&self) -> Box<dyn SeriesForecaster> {
        match self {
            ForecasterKind::Gp => Box::new(Series(GpForecaster::new(GpConfig::default()))),
            ForecasterKind::Arima => Box::new(Series(ArimaForecaster::new(ArimaConfig::default()))),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            ForecasterKind::Gp => "gp",
            ForecasterKind::Arima => "arima",
        }
    }
}

/// GP forecasters with a given configuration. With `refit_every` > 1 a series reuses its
/// evidence maximisation's hyperparameters between passes, and successive series start their
/// refit schedules one call apart, so one pass never refits every container at once.
#[derive(Debug)]
pub struct GpFactory {
    config: GpConfig,
    next_phase: std::sync::atomic::AtomicUsize,
}

impl GpFactory {
    pub fn new(config: GpConfig) -> GpFactory {
        GpFactory {
            config,
            next_phase: Default::default(),
        }
    }
}

impl ForecasterFactory for GpFactory {
    fn series(&self) -> Box<dyn SeriesForecaster> {
        let phase = self
            .next_phase
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::new(Series(
            GpForecaster::new(self.config).with_refit_phase(phase),
        ))
    }

    fn name(&self) -> &'static str {
        "gp"
    }
}

/// ARIMA forecasters with a given configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArimaFactory(pub ArimaConfig);

impl ForecasterFactory for ArimaFactory {
    fn series(&self) -> Box<dyn SeriesForecaster> {
        Box::new(Series(ArimaForecaster::new(self.0)))
    }

    fn name(&self) -> &'static str {
        "arima"
    }
}

impl ForecasterKind {
    /// Its factory, redoing the fit (GP evidence maximisation, ARIMA order search) every
    /// `refit_every` calls of a series (1: every call, the default).
    pub fn factory(self, refit_every: usize) -> Box<dyn ForecasterFactory> {
        match self {
            ForecasterKind::Gp => Box::new(GpFactory::new(GpConfig {
                refit_every,
                ..GpConfig::default()
            })),
            ForecasterKind::Arima => Box::new(ArimaFactory(ArimaConfig {
                refit_every,
                ..ArimaConfig::default()
            })),
        }
    }
}

/// One series' forecaster.
struct Series<F>(F);

impl<F: Forecaster + Send> SeriesForecaster for Series<F> {
    fn forecast_next(&mut self, history: &[f64]) -> Option<UsageForecast> {
        let next = self.0.forecast(history, 1).ok()?.into_iter().next()?;
        Some(UsageForecast {
            peak_fraction: next.mean,
            variance: next.variance,
        })
    }

    fn min_history(&self) -> usize {
        self.0.min_history()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forecasters_follow_a_steady_series_and_refuse_a_short_one() {
        for kind in [ForecasterKind::Gp, ForecasterKind::Arima] {
            let mut f = kind.series();
            assert!(f.forecast_next(&[0.5; 2]).is_none(), "{}", kind.name());
            let series: Vec<f64> = (0..20).map(|i| 0.4 + 0.02 * ((i % 4) as f64)).collect();
            let p = f.forecast_next(&series).expect("forecast");
            assert!(
                (0.3..0.6).contains(&p.peak_fraction) && p.variance >= 0.0,
                "{}: {p:?}",
                kind.name()
            );
        }
        // Configured GP series with staggered refits forecast the same steady series.
        let factory = GpFactory::new(GpConfig {
            refit_every: 5,
            ..GpConfig::default()
        });
        let series: Vec<f64> = (0..20).map(|i| 0.4 + 0.02 * ((i % 4) as f64)).collect();
        for _ in 0..3 {
            let mut f = factory.series();
            for _ in 0..6 {
                let p = f.forecast_next(&series).expect("forecast");
                assert!((0.3..0.6).contains(&p.peak_fraction), "{p:?}");
            }
        }
        assert_eq!("arima".parse::<ForecasterKind>(), Ok(ForecasterKind::Arima));
        assert!("lstm".parse::<ForecasterKind>().is_err());
    }
}

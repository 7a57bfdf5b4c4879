//! Everything the schedulers learn from history, as sans-IO library code:
//!
//! - [`predictor`]: 3σPredict runtime distributions (3Sigma §4.1) built on [`histogram`] and
//!   [`distribution`] (expected utility, expected usage, conditioning, mis-estimate handling).
//! - [`forecast`]: Pace §3.1 GP (history kernel) and ARIMA forecasters behind [`forecast::Forecaster`].
//! - [`slo`]: Morpheus §4 periodic-job detection, SLO inference and the contract life cycle.
//! - [`traces`]: readers for SWF, Google 2011, Alibaba 2017, Bitbrains, PlanetLab, Hadoop
//!   resource-estimator skylines and JSON lines, with file:line errors.
//! - [`skyline`]: the Morpheus §5 job resource model (skyline LP, Clarabel via good_lp).
//!
//! Nothing here reads the OS clock or an unseeded RNG: callers pass `now` and seeded RNGs.

pub mod distribution;
pub mod forecast;
pub mod histogram;
pub mod predictor;
pub mod skyline;
pub mod slo;
pub mod traces;

pub use distribution::{
    OverEstimatePolicy, Piece, RuntimeDistribution, UtilityCurve, UtilityPoint, exp_inc_finish,
};
pub use forecast::{Forecast, ForecastError, Forecaster};
pub use histogram::StreamingHistogram;
pub use predictor::{
    Estimator, Expert, Feature, JobFeatures, PredictorConfig, RuntimePrediction, RuntimePredictor,
};
pub use skyline::{
    Beta, LpFormulation, RunSkyline, SkylineError, SkylineLpConfig, SkylineSolution, fit_skyline,
};
pub use slo::{InferredSlo, PeriodicJob, ProvenanceEvent, SloConfig, SloContract};
pub use traces::TraceError;

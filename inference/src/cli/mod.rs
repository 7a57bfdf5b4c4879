//! Evaluation drivers of the `inference` binary (they time calls with the OS clock, which the
//! library itself never reads).

pub mod contracts;
pub mod forecast_eval;
pub mod predict_eval;

//! Runtime beliefs and utility curves: the inputs 3σSched values options with (3Sigma §3).

use super::ThreeSigmaError;
use serde::{Deserialize, Serialize};

/// A job's runtime distribution as equally likely runtimes (sorted, seconds).
///
/// 3σPredict's piecewise distribution (crate `inference`) is handed over as its quantiles at the
/// midpoints of `n` equal-probability bins; with that representation Eq. 1 is an average and
/// the expected consumption of §3.2 a count, both exact for the belief and cheap enough to
/// evaluate for every option of every pending job each cycle. A point estimate (PointPerfEst,
/// PointRealEst) is a belief with one runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeBelief {
    runtimes: Vec<f64>,
    /// Largest runtime in the history behind the belief: where exp-inc starts (§4.2.1).
    largest_observed: f64,
}

impl RuntimeBelief {
    /// A belief from equally likely runtimes; each must be finite and positive.
    pub fn from_runtimes(mut runtimes: Vec<f64>) -> Result<Self, ThreeSigmaError> {
        if runtimes.is_empty() {
            return Err(ThreeSigmaError::EmptyBelief);
        }
        if let Some(bad) = runtimes.iter().find(|r| !r.is_finite() || **r <= 0.0) {
            return Err(ThreeSigmaError::BadRuntime(*bad));
        }
        runtimes.sort_by(f64::total_cmp);
        let largest_observed = runtimes[runtimes.len() - 1];
        Ok(Self {
            runtimes,
            largest_observed,
        })
    }

    /// A point estimate.
    pub fn point(runtime: f64) -> Result<Self, ThreeSigmaError> {
        Self::from_runtimes(vec![runtime])
    }

    pub fn runtimes(&self) -> &[f64] {
        &self.runtimes
    }

    pub fn mean(&self) -> f64 {
        self.runtimes.iter().sum::<f64>() / self.runtimes.len() as f64
    }

    pub fn max(&self) -> f64 {
        self.runtimes[self.runtimes.len() - 1]
    }

    /// P(runtime > t): the expected fraction of the job's resources still held `t` after its
    /// start (§3.2).
    pub fn survival(&self, t: f64) -> f64 {
        let at_most = self.runtimes.partition_point(|r| *r <= t);
        (self.runtimes.len() - at_most) as f64 / self.runtimes.len() as f64
    }

    /// P(runtime ≤ t).
    pub fn cdf(&self, t: f64) -> f64 {
        1.0 - self.survival(t)
    }

    /// Every runtime multiplied by `factor` (a job on non-preferred nodes runs longer, §5).
    pub fn scaled(&self, factor: f64) -> Self {
        Self {
            runtimes: self.runtimes.iter().map(|r| r * factor).collect(),
            largest_observed: self.largest_observed * factor,
        }
    }

    /// The belief about the total runtime of a job that has run for `elapsed` seconds (Eq. 2:
    /// only runtimes beyond `elapsed` remain, renormalised). When none remains the job has
    /// outrun its history, and the estimate is exp-inc's (§4.2.1) with `cycle`-second steps.
    pub fn conditioned(&self, elapsed: f64, cycle: f64) -> Self {
        let first_beyond = self.runtimes.partition_point(|r| *r <= elapsed);
        if first_beyond < self.runtimes.len() {
            return Self {
                runtimes: self.runtimes[first_beyond..].to_vec(),
                largest_observed: self.largest_observed,
            };
        }
        Self {
            runtimes: vec![exp_inc_finish(
                self.largest_observed.max(self.max()),
                elapsed,
                cycle,
            )],
            largest_observed: self.largest_observed,
        }
    }

    /// Expected utility of starting at `start` (Eq. 1): the mean of `U(start + runtime)`.
    pub fn expected_utility(&self, utility: &Utility, start: f64) -> f64 {
        self.runtimes
            .iter()
            .map(|r| utility.value_at(start + r))
            .sum::<f64>()
            / self.runtimes.len() as f64
    }
}

/// Finish time estimated by exp-inc (§4.2.1): from the largest observed runtime the estimate
/// grows by `2^t` cycles, `t = 0, 1, …`, each time the job outlives it. Always `> elapsed`.
pub fn exp_inc_finish(largest_observed: f64, elapsed: f64, cycle: f64) -> f64 {
    let cycle = if cycle.is_finite() && cycle > 0.0 {
        cycle
    } else {
        1.0
    };
    let mut finish = largest_observed.max(0.0);
    let mut increment = cycle;
    while finish <= elapsed {
        finish += increment;
        increment *= 2.0;
    }
    finish
}

/// Utility of a job as a function of its completion time (§3.1, Fig. 3).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Utility {
    /// SLO job: `value` if completed by `deadline`, zero after (Fig. 3(a)).
    Slo { deadline: f64, value: f64 },
    /// SLO job under over-estimate handling (§4.2.2, Fig. 3(d)): `value` until the deadline,
    /// then `after_deadline` decaying linearly to zero at `zero_at`.
    SloDecaying {
        deadline: f64,
        value: f64,
        after_deadline: f64,
        zero_at: f64,
    },
    /// Latency-sensitive best-effort job: `value` at submission, decaying linearly to zero at
    /// `zero_at` (§3.1).
    BestEffort {
        submit: f64,
        value: f64,
        zero_at: f64,
    },
}

impl Utility {
    pub fn value_at(&self, completion: f64) -> f64 {
        match *self {
            Utility::Slo { deadline, value } => {
                if completion <= deadline {
                    value
                } else {
                    0.0
                }
            }
            Utility::SloDecaying {
                deadline,
                value,
                after_deadline,
                zero_at,
            } => {
                if completion <= deadline {
                    value
                } else if completion >= zero_at {
                    0.0
                } else {
                    after_deadline * (zero_at - completion) / (zero_at - deadline)
                }
            }
            Utility::BestEffort {
                submit,
                value,
                zero_at,
            } => {
                if completion <= submit {
                    value
                } else if completion >= zero_at {
                    0.0
                } else {
                    value * (zero_at - completion) / (zero_at - submit)
                }
            }
        }
    }

    /// The highest value the curve reaches.
    pub fn peak(&self) -> f64 {
        match *self {
            Utility::Slo { value, .. }
            | Utility::SloDecaying { value, .. }
            | Utility::BestEffort { value, .. } => value,
        }
    }

    pub fn is_slo(&self) -> bool {
        !matches!(self, Utility::BestEffort { .. })
    }
}

/// Adaptive over-estimate handling (§4.2.3): an SLO job whose belief gives it less than
/// `threshold` chance of finishing by its deadline even if started at submission is probably
/// over-estimated, so its utility decays past the deadline (§4.2.2) instead of dropping to zero.
/// The defaults are `inference::OverEstimatePolicy`'s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverEstimateHandling {
    pub threshold: f64,
    /// Utility just after the deadline as a fraction of the on-time value (lower, so such jobs
    /// only take otherwise idle resources).
    pub post_deadline_fraction: f64,
    /// Time to decay to zero, as a multiple of (deadline − submit).
    pub decay_span_factor: f64,
}

impl Default for OverEstimateHandling {
    fn default() -> Self {
        Self {
            threshold: 0.05,
            post_deadline_fraction: 0.5,
            decay_span_factor: 1.0,
        }
    }
}

impl OverEstimateHandling {
    /// The utility 3σSched plans with for a job submitted at `submit`.
    pub fn adjust(&self, utility: Utility, belief: &RuntimeBelief, submit: f64) -> Utility {
        match utility {
            Utility::Slo { deadline, value } if belief.cdf(deadline - submit) < self.threshold => {
                let window = (deadline - submit).max(f64::EPSILON);
                Utility::SloDecaying {
                    deadline,
                    value,
                    after_deadline: value * self.post_deadline_fraction,
                    zero_at: deadline + window * self.decay_span_factor,
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survival_and_expected_utility_follow_the_paper_example() {
        // §4.3.4 scenario 1: runtime U(0, 10) sampled at 2.5, 5, 7.5, 10 (equally likely).
        let b = RuntimeBelief::from_runtimes(vec![10.0, 2.5, 7.5, 5.0]).unwrap();
        assert_eq!(b.survival(0.0), 1.0);
        assert_eq!(b.survival(2.5), 0.75);
        assert_eq!(b.survival(5.0), 0.5);
        assert_eq!(b.survival(10.0), 0.0);
        let slo = Utility::Slo {
            deadline: 15.0,
            value: 1.0,
        };
        assert_eq!(b.expected_utility(&slo, 5.0), 1.0);
        assert_eq!(b.expected_utility(&slo, 10.0), 0.5);
        assert_eq!(b.expected_utility(&slo, 12.5), 0.25);
    }

    #[test]
    fn conditioning_drops_past_runtimes_and_exp_inc_takes_over() {
        let b = RuntimeBelief::from_runtimes(vec![10.0, 20.0, 30.0, 40.0]).unwrap();
        let c = b.conditioned(25.0, 1.0);
        assert_eq!(c.runtimes(), &[30.0, 40.0]);
        assert_eq!(c.survival(35.0), 0.5);
        // Past everything: 40 + 1, then + 2, + 4 …
        assert_eq!(b.conditioned(40.0, 1.0).runtimes(), &[41.0]);
        assert_eq!(b.conditioned(41.5, 1.0).runtimes(), &[43.0]);
        assert_eq!(b.conditioned(43.0, 1.0).runtimes(), &[47.0]);
    }

    #[test]
    fn over_estimate_handling_only_for_hopeless_slo_jobs() {
        let long = RuntimeBelief::from_runtimes(vec![100.0, 120.0]).unwrap();
        let slo = Utility::Slo {
            deadline: 50.0,
            value: 10.0,
        };
        let handling = OverEstimateHandling::default();
        let adjusted = handling.adjust(slo, &long, 0.0);
        assert!(matches!(adjusted, Utility::SloDecaying { .. }));
        assert_eq!(adjusted.value_at(75.0), 2.5);
        let short = RuntimeBelief::from_runtimes(vec![10.0, 120.0]).unwrap();
        assert_eq!(handling.adjust(slo, &short, 0.0), slo);
    }

    #[test]
    fn bad_beliefs_are_refused() {
        assert!(RuntimeBelief::from_runtimes(vec![]).is_err());
        assert!(RuntimeBelief::from_runtimes(vec![1.0, f64::NAN]).is_err());
        assert!(RuntimeBelief::point(0.0).is_err());
    }
}

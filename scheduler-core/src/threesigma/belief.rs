//! Runtime beliefs and utility curves: the inputs 3σSched values options with (3Sigma §3).

use super::ThreeSigmaError;
use serde::{Deserialize, Serialize};

/// One piece of a [`RuntimeBelief`]: probability `mass` spread uniformly over `[lo, hi]`, or
/// sitting on `lo` when `lo == hi` (an atom).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BeliefPiece {
    pub lo: f64,
    pub hi: f64,
    pub mass: f64,
}

impl BeliefPiece {
    fn is_atom(&self) -> bool {
        self.hi <= self.lo
    }

    /// Mass of the piece strictly above `t`.
    fn mass_above(&self, t: f64) -> f64 {
        if t < self.lo {
            self.mass
        } else if t >= self.hi {
            0.0
        } else {
            self.mass * (self.hi - t) / (self.hi - self.lo)
        }
    }
}

/// A job's runtime distribution (seconds): a piecewise-uniform density with optional atoms.
///
/// Eq. 1 and the expected consumption of §3.2 integrate over the whole runtime distribution
/// 3σPredict maintains as a histogram (§4.1). The belief keeps that whole distribution —
/// support minimum and maximum included — as pieces of known mass, each uniform between two
/// runtimes: 3σPredict's distribution is handed over as its quantiles at levels `i/n`,
/// `i = 0..=n` ([`RuntimeBelief::from_quantiles`], `n` pieces of mass `1/n`; exact for the
/// calibrated distributions 3σPredict produces, which are `n` = 20 such pieces). Eq. 1 is then
/// exact for the piecewise-linear utility curves of §3.1 and survival is a linear
/// interpolation, both cheap enough for every option of every pending job each cycle.
/// Equally likely runtimes ([`RuntimeBelief::from_runtimes`]) are atoms; a point estimate
/// (PointPerfEst, PointRealEst) is a belief with one atom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeBelief {
    /// Sorted, non-overlapping (`pieces[i].hi <= pieces[i + 1].lo`), masses summing to 1.
    pieces: Vec<BeliefPiece>,
    /// Mass of `pieces[i..]`, plus a trailing 0 (for survival in O(log pieces)).
    mass_from: Vec<f64>,
    /// Largest runtime in the history behind the belief: where exp-inc starts (§4.2.1).
    largest_observed: f64,
}

impl RuntimeBelief {
    /// A belief from equally likely runtimes (atoms); each must be finite and positive.
    pub fn from_runtimes(mut runtimes: Vec<f64>) -> Result<Self, ThreeSigmaError> {
        if runtimes.is_empty() {
            return Err(ThreeSigmaError::EmptyBelief);
        }
        if let Some(bad) = runtimes.iter().find(|r| !r.is_finite() || **r <= 0.0) {
            return Err(ThreeSigmaError::BadRuntime(*bad));
        }
        runtimes.sort_by(f64::total_cmp);
        let mass = 1.0 / runtimes.len() as f64;
        Self::from_pieces(
            runtimes
                .into_iter()
                .map(|r| BeliefPiece { lo: r, hi: r, mass })
                .collect(),
        )
    }

    /// A belief from the quantiles of a distribution at levels `0, 1/n, …, 1` (`n + 1`
    /// non-decreasing runtimes, finite and positive, `n ≥ 1`): mass `1/n` uniform between
    /// consecutive quantiles (an atom where two are equal). The first and last are the
    /// distribution's support minimum and maximum, so no tail is cut.
    pub fn from_quantiles(quantiles: &[f64]) -> Result<Self, ThreeSigmaError> {
        if quantiles.len() < 2 {
            return Err(ThreeSigmaError::EmptyBelief);
        }
        if let Some(bad) = quantiles.iter().find(|r| !r.is_finite() || **r <= 0.0) {
            return Err(ThreeSigmaError::BadRuntime(*bad));
        }
        if let Some(pair) = quantiles.windows(2).find(|pair| pair[1] < pair[0]) {
            return Err(ThreeSigmaError::BadBelief(format!(
                "quantiles must not decrease ({} then {})",
                pair[0], pair[1]
            )));
        }
        let mass = 1.0 / (quantiles.len() - 1) as f64;
        let mut pieces: Vec<BeliefPiece> = Vec::with_capacity(quantiles.len() - 1);
        for pair in quantiles.windows(2) {
            let (lo, hi) = (pair[0], pair[1]);
            match pieces.last_mut() {
                // Equal quantiles in a row are one atom.
                Some(last) if lo == hi && last.is_atom() && last.lo == lo => last.mass += mass,
                _ => pieces.push(BeliefPiece { lo, hi, mass }),
            }
        }
        Self::from_pieces(pieces)
    }

    /// A belief from pieces in increasing order that do not overlap, with finite positive
    /// bounds and non-negative masses (normalised to sum 1; at least one positive).
    pub fn from_pieces(pieces: Vec<BeliefPiece>) -> Result<Self, ThreeSigmaError> {
        if pieces.is_empty() {
            return Err(ThreeSigmaError::EmptyBelief);
        }
        for piece in &pieces {
            for bound in [piece.lo, piece.hi] {
                if !bound.is_finite() || bound <= 0.0 {
                    return Err(ThreeSigmaError::BadRuntime(bound));
                }
            }
            if piece.hi < piece.lo || !piece.mass.is_finite() || piece.mass < 0.0 {
                return Err(ThreeSigmaError::BadBelief(format!(
                    "piece [{}, {}] with mass {}",
                    piece.lo, piece.hi, piece.mass
                )));
            }
        }
        if let Some(pair) = pieces.windows(2).find(|pair| pair[1].lo < pair[0].hi) {
            return Err(ThreeSigmaError::BadBelief(format!(
                "pieces overlap or are out of order ([{}, {}] then [{}, {}])",
                pair[0].lo, pair[0].hi, pair[1].lo, pair[1].hi
            )));
        }
        let total: f64 = pieces.iter().map(|p| p.mass).sum();
        if total.is_nan() || total <= 0.0 {
            return Err(ThreeSigmaError::BadBelief("no probability mass".into()));
        }
        let largest_observed = pieces[pieces.len() - 1].hi;
        Ok(Self::normalised(pieces, largest_observed))
    }

    /// Drops massless pieces, rescales masses to sum 1 and sets up the survival index. The
    /// pieces must already be valid (the constructors check, the transformations keep it).
    fn normalised(pieces: Vec<BeliefPiece>, largest_observed: f64) -> Self {
        let total: f64 = pieces.iter().map(|p| p.mass).sum();
        let pieces: Vec<BeliefPiece> = pieces
            .into_iter()
            .filter(|p| p.mass > 0.0)
            .map(|p| BeliefPiece {
                mass: p.mass / total,
                ..p
            })
            .collect();
        let mut mass_from = Vec::with_capacity(pieces.len() + 1);
        let mut above = 0.0;
        mass_from.push(above);
        for piece in pieces.iter().rev() {
            above += piece.mass;
            mass_from.push(above);
        }
        mass_from.reverse();
        Self {
            pieces,
            mass_from,
            largest_observed,
        }
    }

    /// A point estimate.
    pub fn point(runtime: f64) -> Result<Self, ThreeSigmaError> {
        Self::from_runtimes(vec![runtime])
    }

    pub fn pieces(&self) -> &[BeliefPiece] {
        &self.pieces
    }

    pub fn mean(&self) -> f64 {
        self.pieces
            .iter()
            .map(|p| p.mass * (p.lo + p.hi) / 2.0)
            .sum()
    }

    /// Smallest runtime with positive probability.
    pub fn min(&self) -> f64 {
        self.pieces[0].lo
    }

    /// Largest runtime with positive probability.
    pub fn max(&self) -> f64 {
        self.pieces[self.pieces.len() - 1].hi
    }

    /// Smallest `t` with `P(runtime ≤ t) ≥ q` (`q` clamped to [0, 1]; NaN reads as ½).
    pub fn quantile(&self, q: f64) -> f64 {
        let target = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let mut below = 0.0;
        for piece in &self.pieces {
            // A tolerance: masses summed in floating point must not step past a level they
            // reach exactly.
            if below + piece.mass >= target - 1e-12 {
                if piece.is_atom() {
                    return piece.lo;
                }
                let fraction = ((target - below) / piece.mass).clamp(0.0, 1.0);
                return piece.lo + fraction * (piece.hi - piece.lo);
            }
            below += piece.mass;
        }
        self.max()
    }

    /// P(runtime > t): the expected fraction of the job's resources still held `t` after its
    /// start (§3.2).
    pub fn survival(&self, t: f64) -> f64 {
        // Pieces wholly at or below `t` hold nothing beyond it; those after the first one
        // reaching past `t` hold all their mass.
        let first = self.pieces.partition_point(|p| p.hi <= t);
        match self.pieces.get(first) {
            None => 0.0,
            Some(piece) => (piece.mass_above(t) + self.mass_from[first + 1]).clamp(0.0, 1.0),
        }
    }

    /// P(runtime ≤ t).
    pub fn cdf(&self, t: f64) -> f64 {
        1.0 - self.survival(t)
    }

    /// Every runtime multiplied by `factor` (a job on non-preferred nodes runs longer, §5).
    pub fn scaled(&self, factor: f64) -> Self {
        Self {
            pieces: self
                .pieces
                .iter()
                .map(|p| BeliefPiece {
                    lo: p.lo * factor,
                    hi: p.hi * factor,
                    mass: p.mass,
                })
                .collect(),
            mass_from: self.mass_from.clone(),
            largest_observed: self.largest_observed * factor,
        }
    }

    /// The belief about the total runtime of a job that has run for `elapsed` seconds (Eq. 2:
    /// only runtimes beyond `elapsed` remain, renormalised). When none remains the job has
    /// outrun its history, and the estimate is exp-inc's (§4.2.1) with `cycle`-second steps.
    pub fn conditioned(&self, elapsed: f64, cycle: f64) -> Self {
        let first = self.pieces.partition_point(|p| p.hi <= elapsed);
        if first < self.pieces.len() && self.survival(elapsed) > 1e-12 {
            let mut kept = self.pieces[first..].to_vec();
            let head = &mut kept[0];
            if head.lo < elapsed {
                *head = BeliefPiece {
                    lo: elapsed,
                    hi: head.hi,
                    mass: head.mass_above(elapsed),
                };
            }
            return Self::normalised(kept, self.largest_observed);
        }
        let finish = exp_inc_finish(self.largest_observed.max(self.max()), elapsed, cycle);
        Self::normalised(
            vec![BeliefPiece {
                lo: finish,
                hi: finish,
                mass: 1.0,
            }],
            self.largest_observed,
        )
    }

    /// Expected utility of starting at `start` (Eq. 1): `∫ U(start + t) PDF(t) dt`, exact for
    /// the piecewise-linear utility curves of §3.1: each uniform piece is split at the curve's
    /// breakpoints and each part, on which the utility is linear, contributes its mass times the
    /// utility at its midpoint (never on a step).
    pub fn expected_utility(&self, utility: &Utility, start: f64) -> f64 {
        let mut breakpoints = utility.breakpoints();
        breakpoints.sort_by(f64::total_cmp);
        let mut total = 0.0;
        for piece in &self.pieces {
            let (lo, hi) = (start + piece.lo, start + piece.hi);
            if piece.is_atom() {
                total += piece.mass * utility.value_at(lo);
                continue;
            }
            let density = piece.mass / (hi - lo);
            let mut from = lo;
            for cut in breakpoints.iter().copied().filter(|b| *b > lo && *b < hi) {
                total += density * (cut - from) * utility.value_at((from + cut) / 2.0);
                from = cut;
            }
            total += density * (hi - from) * utility.value_at((from + hi) / 2.0);
        }
        total
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

    /// Completion times where the curve has a step or a kink, in increasing order; it is
    /// linear between them.
    pub fn breakpoints(&self) -> [f64; 2] {
        match *self {
            Utility::Slo { deadline, .. } => [deadline, deadline],
            Utility::SloDecaying {
                deadline, zero_at, ..
            } => [deadline, zero_at],
            Utility::BestEffort {
                submit, zero_at, ..
            } => [submit, zero_at],
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
        assert_eq!(c, RuntimeBelief::from_runtimes(vec![30.0, 40.0]).unwrap());
        assert_eq!(c.survival(35.0), 0.5);
        // Past everything: 40 + 1, then + 2, + 4 …
        let only = |b: RuntimeBelief| {
            assert_eq!(b.pieces().len(), 1);
            assert_eq!(b.min(), b.max());
            b.max()
        };
        assert_eq!(only(b.conditioned(40.0, 1.0)), 41.0);
        assert_eq!(only(b.conditioned(41.5, 1.0)), 43.0);
        assert_eq!(only(b.conditioned(43.0, 1.0)), 47.0);
    }

    /// Runtime uniform on [100, 200] as quantiles at 0, ¼, ½, ¾, 1.
    fn uniform_100_200() -> RuntimeBelief {
        RuntimeBelief::from_quantiles(&[100.0, 125.0, 150.0, 175.0, 200.0]).unwrap()
    }

    #[test]
    fn quantile_pieces_keep_the_whole_support() {
        let b = uniform_100_200();
        assert_eq!(b.min(), 100.0);
        assert_eq!(b.max(), 200.0);
        assert!((b.mean() - 150.0).abs() < 1e-9);
        // Survival is linear inside the support, 1 below it, 0 at and above its top.
        assert_eq!(b.survival(50.0), 1.0);
        assert!((b.survival(110.0) - 0.9).abs() < 1e-12);
        assert!((b.survival(190.0) - 0.1).abs() < 1e-12);
        assert!((b.survival(199.0) - 0.01).abs() < 1e-12);
        assert_eq!(b.survival(200.0), 0.0);
        assert!((b.cdf(160.0) - 0.6).abs() < 1e-12);
        for q in [0.0, 0.01, 0.3, 0.5, 0.99, 1.0] {
            assert!((b.quantile(q) - (100.0 + 100.0 * q)).abs() < 1e-9, "q{q}");
        }
    }

    #[test]
    fn expected_utility_integrates_the_tails_exactly() {
        let b = uniform_100_200();
        // SLO step at 195 for a start at 0: P(runtime ≤ 195) = 0.95 (Eq. 1).
        let slo = Utility::Slo {
            deadline: 195.0,
            value: 10.0,
        };
        assert!((b.expected_utility(&slo, 0.0) - 9.5).abs() < 1e-9);
        // Mid-bin quantiles of the same distribution ((i + ½)/20: 102.5 … 197.5) say a start
        // at 2 s is certain to meet a deadline of 200 s; the whole distribution says 98 %.
        let mid_bin =
            RuntimeBelief::from_runtimes((0..20).map(|i| 100.0 + 5.0 * (i as f64 + 0.5)).collect())
                .unwrap();
        let deadline = Utility::Slo {
            deadline: 200.0,
            value: 1.0,
        };
        assert!((mid_bin.expected_utility(&deadline, 2.0) - 1.0).abs() < 1e-12);
        assert!((b.expected_utility(&deadline, 2.0) - 0.98).abs() < 1e-9);
        // Linear best-effort decay from 1 at 0 to 0 at 400: E[1 − (s + T)/400] exactly.
        let be = Utility::BestEffort {
            submit: 0.0,
            value: 1.0,
            zero_at: 400.0,
        };
        assert!((b.expected_utility(&be, 50.0) - (1.0 - 200.0 / 400.0)).abs() < 1e-9);
        // Past the curve's end for half the support: ∫_{100}^{150} (1 − (250 + t)/400) dt / 100.
        let expected =
            (50.0 - (250.0 * 50.0 + (150.0f64.powi(2) - 100.0f64.powi(2)) / 2.0) / 400.0) / 100.0;
        assert!((b.expected_utility(&be, 250.0) - expected).abs() < 1e-9);
        // A decaying SLO curve (§4.2.2): 10 until 150, 5 → 0 linearly over (150, 250].
        let decaying = Utility::SloDecaying {
            deadline: 150.0,
            value: 10.0,
            after_deadline: 5.0,
            zero_at: 250.0,
        };
        // Half the mass before the deadline (10), half after with mean utility 5 · (1 − 0.25).
        assert!((b.expected_utility(&decaying, 0.0) - (5.0 + 0.5 * 3.75)).abs() < 1e-9);
    }

    #[test]
    fn conditioning_a_continuous_belief_clips_and_renormalises() {
        let b = uniform_100_200();
        let c = b.conditioned(180.0, 1.0);
        assert_eq!(c.min(), 180.0);
        assert_eq!(c.max(), 200.0);
        assert!((c.survival(190.0) - 0.5).abs() < 1e-12);
        assert!((c.pieces().iter().map(|p| p.mass).sum::<f64>() - 1.0).abs() < 1e-12);
        // Beyond the whole support exp-inc starts from its top (§4.2.1).
        assert_eq!(b.conditioned(200.0, 2.0).max(), 202.0);
        let s = b.scaled(1.5);
        assert_eq!((s.min(), s.max()), (150.0, 300.0));
        assert!((s.survival(285.0) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn equal_quantiles_are_atoms() {
        // A quarter of the mass exactly at 100 s, the rest uniform on [100, 160].
        let b = RuntimeBelief::from_quantiles(&[100.0, 100.0, 120.0, 140.0, 160.0]).unwrap();
        assert_eq!(b.pieces().len(), 4);
        assert!((b.survival(100.0) - 0.75).abs() < 1e-12);
        assert!((b.survival(99.9) - 1.0).abs() < 1e-12);
        assert_eq!(b.quantile(0.2), 100.0);
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
        assert!(RuntimeBelief::from_quantiles(&[100.0]).is_err());
        assert!(RuntimeBelief::from_quantiles(&[100.0, 90.0]).is_err());
        assert!(RuntimeBelief::from_quantiles(&[0.0, 90.0]).is_err());
        assert!(
            RuntimeBelief::from_pieces(vec![
                BeliefPiece {
                    lo: 10.0,
                    hi: 20.0,
                    mass: 0.5
                },
                BeliefPiece {
                    lo: 15.0,
                    hi: 30.0,
                    mass: 0.5
                },
            ])
            .is_err()
        );
        assert!(
            RuntimeBelief::from_pieces(vec![BeliefPiece {
                lo: 10.0,
                hi: 20.0,
                mass: 0.0
            }])
            .is_err()
        );
        assert!(RuntimeBelief::from_runtimes(vec![]).is_err());
        assert!(RuntimeBelief::from_runtimes(vec![1.0, f64::NAN]).is_err());
        assert!(RuntimeBelief::point(0.0).is_err());
    }
}

//! Runtime distributions and what a distribution-based scheduler computes from them
//! (3Sigma §3: expected utility Eq. 1, expected resource consumption §3.2, conditioning on the
//! elapsed time Eq. 2; §4.2 under- and over-estimate handling).
//!
//! A [`RuntimeDistribution`] is plain data: an ordered list of pieces, each either a point mass
//! or an interval over which the density is linear. That is exactly the shape a Ben-Haim &
//! Tom-Tov histogram describes (trapezoids between centroids), and it stays closed under
//! conditioning on elapsed time, so the guarantor and the simulator can keep and clone it freely.

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use crate::histogram::StreamingHistogram;

/// One piece of a runtime distribution. `lo == hi` is a point mass; otherwise the density is
/// linear from `density_lo` at `lo` to `density_hi` at `hi`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    pub lo: f64,
    pub hi: f64,
    pub density_lo: f64,
    pub density_hi: f64,
    /// Probability mass of the piece (for a segment `(density_lo + density_hi) / 2 · (hi − lo)`).
    pub mass: f64,
}

impl Piece {
    fn is_atom(&self) -> bool {
        self.hi <= self.lo
    }

    fn slope(&self) -> f64 {
        (self.density_hi - self.density_lo) / (self.hi - self.lo)
    }

    /// Mass of this piece at or below `t`.
    fn mass_below(&self, t: f64) -> f64 {
        if t < self.lo {
            0.0
        } else if t >= self.hi {
            self.mass
        } else {
            let y = t - self.lo;
            (self.density_lo * y + 0.5 * self.slope() * y * y).clamp(0.0, self.mass)
        }
    }

    fn density_at(&self, t: f64) -> f64 {
        if self.is_atom() || t < self.lo || t > self.hi {
            0.0
        } else {
            self.density_lo + self.slope() * (t - self.lo)
        }
    }

    /// Smallest `y ≥ 0` such that the mass in `[lo, lo + y]` reaches `remaining`.
    fn offset_for_mass(&self, remaining: f64) -> f64 {
        if self.is_atom() {
            return 0.0;
        }
        let width = self.hi - self.lo;
        let slope = self.slope();
        let discriminant = (self.density_lo * self.density_lo + 2.0 * slope * remaining).max(0.0);
        let denominator = self.density_lo + discriminant.sqrt();
        // Rationalised root of slope/2·y² + d_lo·y − remaining = 0: stable when slope ≈ 0.
        let offset = if denominator > 0.0 {
            2.0 * remaining / denominator
        } else {
            0.0
        };
        offset.clamp(0.0, width)
    }

    fn mean_contribution(&self) -> f64 {
        if self.is_atom() {
            return self.lo * self.mass;
        }
        let width = self.hi - self.lo;
        self.lo * self.mass
            + self.density_lo * width * width / 2.0
            + self.slope() * width * width * width / 3.0
    }
}

/// Probability mass below which a level counts as reached (float sums of piece masses).
const MASS_TOLERANCE: f64 = 1e-12;

/// Pieces of a [`RuntimeDistribution::widened`] distribution (equal mass each; 0.1, 0.5 and
/// 0.9 fall on their bounds).
pub const CALIBRATED_PIECES: usize = 20;

/// The levels of a calibrated distribution's knots and Φ⁻¹ of each (the extreme levels' Φ⁻¹
/// is infinite: the floor's tails stop at half a piece). Computed once.
struct CalibrationGrid {
    levels: [f64; CALIBRATED_PIECES + 1],
    normal: [f64; CALIBRATED_PIECES + 1],
}

fn calibration_grid() -> &'static CalibrationGrid {
    static GRID: std::sync::OnceLock<CalibrationGrid> = std::sync::OnceLock::new();
    GRID.get_or_init(|| {
        let half = 0.5 / CALIBRATED_PIECES as f64;
        let levels = std::array::from_fn(|i| i as f64 / CALIBRATED_PIECES as f64);
        let normal = levels.map(|p: f64| standard_normal_quantile(p.clamp(half, 1.0 - half)));
        CalibrationGrid { levels, normal }
    })
}

/// Φ⁻¹(p) for p in (0, 1): Acklam's rational approximation (relative error < 1.2e-9).
pub fn standard_normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.024_25 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.024_25 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Probability distribution of a job's runtime (seconds or any consistent time unit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeDistribution {
    pieces: Vec<Piece>,
    /// Largest runtime ever observed for the history this came from: the point past which
    /// under-estimate handling (exp-inc, 3Sigma §4.2.1) takes over.
    largest_observed: f64,
    /// Number of observations behind the distribution (0 for synthetic ones).
    observations: f64,
}

impl RuntimeDistribution {
    /// A runtime known exactly (the PointPerfEst view, or an exp-inc estimate).
    pub fn point(runtime: f64) -> Self {
        Self {
            pieces: vec![Piece {
                lo: runtime,
                hi: runtime,
                density_lo: 0.0,
                density_hi: 0.0,
                mass: 1.0,
            }],
            largest_observed: runtime,
            observations: 0.0,
        }
    }

    /// Uniform on `[lo, hi]` (`hi > lo`); handy for tests and synthetic workloads.
    pub fn uniform(lo: f64, hi: f64) -> Self {
        if hi <= lo {
            return Self::point(lo);
        }
        let density = 1.0 / (hi - lo);
        Self {
            pieces: vec![Piece {
                lo,
                hi,
                density_lo: density,
                density_hi: density,
                mass: 1.0,
            }],
            largest_observed: hi,
            observations: 0.0,
        }
    }

    /// Empirical distribution of `samples` through an 80-bin streaming histogram.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        let mut histogram = StreamingHistogram::default();
        for sample in samples {
            histogram.insert(*sample);
        }
        histogram.distribution()
    }

    /// The trapezoid density of a Ben-Haim & Tom-Tov histogram: mass `(m_i + m_{i+1}) / 2`
    /// between consecutive centroids, anchored with zero height at the exact min and max.
    pub fn from_histogram(histogram: &StreamingHistogram) -> Option<Self> {
        let (min, max) = (histogram.min()?, histogram.max()?);
        let total = histogram.count();
        if total <= 0.0 {
            return None;
        }
        let mut knots: Vec<(f64, f64)> = Vec::with_capacity(histogram.bins().len() + 2);
        knots.push((min, 0.0));
        knots.extend(histogram.bins().iter().map(|bin| (bin.centroid, bin.count)));
        knots.push((max, 0.0));
        let mut pieces = Vec::with_capacity(knots.len());
        for pair in knots.windows(2) {
            let ((x0, m0), (x1, m1)) = (pair[0], pair[1]);
            let mass = (m0 + m1) / 2.0 / total;
            if mass <= 0.0 {
                continue;
            }
            let width = x1 - x0;
            if width <= 0.0 {
                // Zero-width trapezoid: its half-bin mass sits exactly on the value.
                match pieces.last_mut() {
                    Some(Piece {
                        lo, hi, mass: m, ..
                    }) if *lo == x0 && *hi == x0 => *m += mass,
                    _ => pieces.push(Piece {
                        lo: x0,
                        hi: x0,
                        density_lo: 0.0,
                        density_hi: 0.0,
                        mass,
                    }),
                }
            } else {
                pieces.push(Piece {
                    lo: x0,
                    hi: x1,
                    density_lo: m0 / total / width,
                    density_hi: m1 / total / width,
                    mass,
                });
            }
        }
        Some(Self {
            pieces,
            largest_observed: max,
            observations: total,
        })
    }

    /// The same shape stretched by `factor` (> 0) along the time axis: every quantile is
    /// multiplied by it, masses are kept, densities divided by it. A non-positive or non-finite
    /// factor leaves the distribution as it is.
    pub fn scaled(&self, factor: f64) -> Self {
        if !(factor.is_finite() && factor > 0.0) {
            return self.clone();
        }
        Self {
            pieces: self
                .pieces
                .iter()
                .map(|p| Piece {
                    lo: p.lo * factor,
                    hi: p.hi * factor,
                    density_lo: p.density_lo / factor,
                    density_hi: p.density_hi / factor,
                    mass: p.mass,
                })
                .collect(),
            largest_observed: self.largest_observed * factor,
            observations: self.observations,
        }
    }

    /// The quantiles at levels `0, 1/n, …, 1` (`n + 1` runtimes, `n ≥ 1`): the support's
    /// minimum and maximum and the knots of `n` equal-mass pieces between them. What 3σSched is
    /// handed (`RuntimeBelief::from_quantiles`): exact for a calibrated distribution of
    /// [`CALIBRATED_PIECES`] pieces, and no tail is cut (3Sigma Eq. 1 integrates over the whole
    /// distribution).
    pub fn equal_mass_quantiles(&self, n: usize) -> Vec<f64> {
        let n = n.max(1);
        let levels: Vec<f64> = (0..=n).map(|i| i as f64 / n as f64).collect();
        let mut quantiles = vec![0.0; n + 1];
        self.quantiles_into(&levels, &mut quantiles);
        quantiles
    }

    /// The distribution as pieces of uniform density (or atoms), what 3σSched's beliefs are
    /// made of (`RuntimeBelief::from_pieces`): a uniform piece or an atom is kept as it is (so
    /// a calibrated distribution, [`CALIBRATED_PIECES`] uniform pieces, is handed over exactly),
    /// and a piece whose density slopes (a histogram's trapezoid, the falling upper tail of
    /// [`RuntimeDistribution::with_upper_tail`]) becomes `split` (≥ 1) uniform pieces of equal
    /// mass between its own quantiles. Massless pieces are left out.
    pub fn uniform_pieces(&self, split: usize) -> Vec<Piece> {
        let split = split.max(1);
        let mut out = Vec::with_capacity(self.pieces.len() + split);
        for piece in self.pieces.iter().filter(|p| p.mass > 0.0) {
            let sloped = !piece.is_atom()
                && (piece.density_lo - piece.density_hi).abs()
                    > 1e-9 * piece.density_lo.max(piece.density_hi);
            if !sloped || split == 1 {
                let density = if piece.is_atom() {
                    0.0
                } else {
                    piece.mass / (piece.hi - piece.lo)
                };
                out.push(Piece {
                    density_lo: density,
                    density_hi: density,
                    ..*piece
                });
                continue;
            }
            let mass = piece.mass / split as f64;
            let mut lo = piece.lo;
            for j in 1..=split {
                let hi = if j == split {
                    piece.hi
                } else {
                    (piece.lo + piece.offset_for_mass(mass * j as f64)).clamp(lo, piece.hi)
                };
                let density = if hi > lo { mass / (hi - lo) } else { 0.0 };
                out.push(Piece {
                    lo,
                    hi,
                    density_lo: density,
                    density_hi: density,
                    mass,
                });
                lo = hi;
            }
        }
        out
    }

    /// Quantiles at increasing levels `levels` into `out` (as many as both hold) in one sweep
    /// over the pieces: O(pieces + levels), where calling [`RuntimeDistribution::quantile`] for
    /// each is O(pieces × levels).
    pub fn quantiles_into(&self, levels: &[f64], out: &mut [f64]) {
        let mut cumulative = 0.0;
        let mut pieces = self.pieces.iter().filter(|p| p.mass > 0.0).peekable();
        for (&level, slot) in levels.iter().zip(out.iter_mut()) {
            let target = if level.is_nan() {
                0.5
            } else {
                level.clamp(0.0, 1.0)
            };
            *slot = loop {
                match pieces.peek() {
                    Some(piece) if cumulative + piece.mass < target - MASS_TOLERANCE => {
                        cumulative += piece.mass;
                        pieces.next();
                    }
                    Some(piece) => {
                        break piece.lo + piece.offset_for_mass((target - cumulative).max(0.0));
                    }
                    None => break self.support_max(),
                }
            };
        }
    }

    /// The distribution with its spread around the median multiplied by `spread` in log space,
    /// plus a log-normal floor of `floor` × `spread` (so a history of identical runtimes still
    /// gets an interval): its quantile at level `p` is
    /// `m · exp(spread · (ln(Q(p)/m) + floor · Φ⁻¹(p)))`, `m` the median. Built as
    /// [`CALIBRATED_PIECES`] pieces of equal mass, so the quantiles at multiples of
    /// 1/[`CALIBRATED_PIECES`] (among them 0.1, 0.5 and 0.9) are exact. The median is kept.
    pub fn widened(&self, spread: f64, floor: f64) -> Self {
        self.calibrated(1.0, spread, floor)
    }

    /// [`RuntimeDistribution::widened`] of the distribution [`RuntimeDistribution::scaled`] by
    /// `scale`, built in one pass (the predictor's path: one allocation, no intermediate copy).
    pub fn calibrated(&self, scale: f64, spread: f64, floor: f64) -> Self {
        let grid = calibration_grid();
        let mut quantiles = [0.0; CALIBRATED_PIECES + 1];
        self.quantiles_into(&grid.levels, &mut quantiles);
        let median = quantiles[CALIBRATED_PIECES / 2];
        let scale = if scale.is_finite() && scale > 0.0 {
            scale
        } else {
            1.0
        };
        if !(spread.is_finite() && spread > 0.0) || median <= 0.0 {
            return self.scaled(scale);
        }
        let centre = median * scale;
        let mut knots = [0.0; CALIBRATED_PIECES + 1];
        for ((knot, &q), &z) in knots.iter_mut().zip(&quantiles).zip(&grid.normal) {
            let log_deviation = (q.max(f64::MIN_POSITIVE) / median).ln();
            *knot = centre * (spread * (log_deviation + floor * z)).exp();
        }
        // Exactly the centre at the median level, whatever the rounding of ln and exp.
        knots[CALIBRATED_PIECES / 2] = centre;
        let mass = 1.0 / CALIBRATED_PIECES as f64;
        let pieces = knots
            .windows(2)
            .map(|pair| {
                let (lo, hi) = (pair[0], pair[1].max(pair[0]));
                let density = if hi > lo { mass / (hi - lo) } else { 0.0 };
                Piece {
                    lo,
                    hi,
                    density_lo: density,
                    density_hi: density,
                    mass,
                }
            })
            .collect();
        Self {
            pieces,
            largest_observed: self.largest_observed * scale,
            observations: self.observations,
        }
    }

    /// The distribution with probability `mass` (< ½) moved above its support maximum. It is
    /// taken from the upper half only — every piece above the median keeps its shape with
    /// `(½ − mass) / ½` of its probability, the lower half and so the median are unchanged
    /// (the median is the point estimate, and moving it would trade within-2× accuracy for the
    /// tail) — and one piece of `mass` is added on `[top, top · ratio]` (`top` the old support
    /// maximum), its density falling linearly to 0 (mean `top · (2 + ratio) / 3`: most of it
    /// just past the top). An empirical distribution gives probability 0 to anything longer
    /// than the longest runtime it has seen, yet the next run exceeds the maximum of `n`
    /// exchangeable runs with probability `1/(n + 1)`, and more often when runtimes drift;
    /// `RuntimePredictor::upper_tail` measures how often and by how much. `largest_observed` (the
    /// history's longest runtime) is kept; exp-inc (3Sigma §4.2.1) takes over past the tail's
    /// end, where no mass is left. A `mass` outside (0, ½), or a `ratio` that does not put the
    /// tail's end at a finite runtime above the top, changes nothing.
    pub fn with_upper_tail(&self, mass: f64, ratio: f64) -> Self {
        let top = self.support_max();
        let hi = top * ratio;
        if !(mass > 0.0 && mass < 0.5 && top > 0.0 && hi.is_finite() && hi > top) {
            return self.clone();
        }
        let keep = (0.5 - mass) / 0.5;
        let scaled = |p: &Piece, factor: f64| Piece {
            density_lo: p.density_lo * factor,
            density_hi: p.density_hi * factor,
            mass: p.mass * factor,
            ..*p
        };
        let mut pieces: Vec<Piece> = Vec::with_capacity(self.pieces.len() + 2);
        let mut below = 0.0_f64;
        for piece in self.pieces.iter().filter(|p| p.mass > 0.0) {
            let lower = (0.5 - below).clamp(0.0, piece.mass);
            below += piece.mass;
            if lower >= piece.mass - MASS_TOLERANCE {
                pieces.push(*piece);
            } else if lower <= MASS_TOLERANCE {
                pieces.push(scaled(piece, keep));
            } else if piece.is_atom() {
                // An atom across the median: its upper part is scaled.
                pieces.push(Piece {
                    mass: lower + (piece.mass - lower) * keep,
                    ..*piece
                });
            } else {
                // Split at the median: a linear density stays linear on each side.
                let at = piece.lo + piece.offset_for_mass(lower);
                let density_at = piece.density_at(at);
                pieces.push(Piece {
                    hi: at,
                    density_hi: density_at,
                    mass: lower,
                    ..*piece
                });
                pieces.push(scaled(
                    &Piece {
                        lo: at,
                        density_lo: density_at,
                        mass: piece.mass - lower,
                        ..*piece
                    },
                    keep,
                ));
            }
        }
        pieces.push(Piece {
            lo: top,
            hi,
            density_lo: 2.0 * mass / (hi - top),
            density_hi: 0.0,
            mass,
        });
        Self {
            pieces,
            largest_observed: self.largest_observed,
            observations: self.observations,
        }
    }

    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    pub fn largest_observed(&self) -> f64 {
        self.largest_observed
    }

    pub fn observations(&self) -> f64 {
        self.observations
    }

    /// Smallest runtime with positive probability.
    pub fn support_min(&self) -> f64 {
        self.pieces.first().map_or(0.0, |piece| piece.lo)
    }

    /// Largest runtime with positive probability.
    pub fn support_max(&self) -> f64 {
        self.pieces.last().map_or(0.0, |piece| piece.hi)
    }

    /// Density of the continuous part at `t` (point masses are not included; `cdf` has them).
    pub fn pdf(&self, t: f64) -> f64 {
        self.pieces.iter().map(|piece| piece.density_at(t)).sum()
    }

    /// P(runtime ≤ t).
    pub fn cdf(&self, t: f64) -> f64 {
        let mut cumulative = 0.0;
        for piece in &self.pieces {
            if piece.lo > t {
                break;
            }
            cumulative += piece.mass_below(t);
        }
        cumulative.clamp(0.0, 1.0)
    }

    /// P(runtime > t): the probability the job still holds its resources at `t` (3Sigma §3.2).
    pub fn survival(&self, t: f64) -> f64 {
        1.0 - self.cdf(t)
    }

    /// Smallest `t` with `cdf(t) ≥ q` (`q` clamped to [0, 1]).
    pub fn quantile(&self, q: f64) -> f64 {
        let target = if q.is_nan() { 0.5 } else { q.clamp(0.0, 1.0) };
        let mut cumulative = 0.0;
        for piece in &self.pieces {
            if piece.mass <= 0.0 {
                continue;
            }
            // A mass tolerance: equal-mass pieces summed in floating point must not step past
            // a level they reach exactly (the median of a widened distribution is its knot).
            if cumulative + piece.mass >= target - MASS_TOLERANCE {
                return piece.lo + piece.offset_for_mass((target - cumulative).max(0.0));
            }
            cumulative += piece.mass;
        }
        self.support_max()
    }

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn mean(&self) -> f64 {
        self.pieces.iter().map(Piece::mean_contribution).sum()
    }

    /// Draws one runtime by inverse-CDF sampling with the caller's (seeded) RNG.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        self.quantile(rng.random::<f64>())
    }

    /// Distribution of the runtime given that the job has already run for `elapsed`
    /// (3Sigma Eq. 2: `1 − CDF'(t) = (1 − CDF(t)) / (1 − CDF(elapsed))` for `t ≥ elapsed`).
    ///
    /// When no probability mass is left beyond `elapsed` (the job has outrun every observation),
    /// the result is the exp-inc point estimate of §4.2.1 (see [`exp_inc_finish`]) with
    /// increments of `cycle` time units.
    pub fn condition_on_elapsed(&self, elapsed: f64, cycle: f64) -> Self {
        if self.cdf(elapsed) <= 0.0 {
            return self.clone();
        }
        let remaining = self.survival(elapsed);
        if remaining <= 1e-12 {
            let mut estimate = Self::point(exp_inc_finish(
                self.largest_observed.max(self.support_max()),
                elapsed,
                cycle,
            ));
            estimate.largest_observed = self.largest_observed;
            estimate.observations = self.observations;
            return estimate;
        }
        let mut pieces = Vec::with_capacity(self.pieces.len());
        for piece in &self.pieces {
            if piece.hi <= elapsed {
                continue;
            }
            let mut kept = *piece;
            if piece.lo <= elapsed {
                kept.lo = elapsed;
                kept.density_lo = piece.density_at(elapsed);
                kept.mass = piece.mass - piece.mass_below(elapsed);
            }
            kept.density_lo /= remaining;
            kept.density_hi /= remaining;
            kept.mass /= remaining;
            if kept.mass > 0.0 {
                pieces.push(kept);
            }
        }
        Self {
            pieces,
            largest_observed: self.largest_observed,
            observations: self.observations,
        }
    }

    /// Expected utility of starting the job at `start` (3Sigma Eq. 1):
    /// `E[U(start)] = ∫ U(start + t) PDF(t) dt`, exact for piecewise-linear utility curves.
    pub fn expected_utility(&self, utility: &UtilityCurve, start: f64) -> f64 {
        let mut total = 0.0;
        for piece in &self.pieces {
            if piece.is_atom() {
                total += piece.mass * utility.value_at(start + piece.lo);
                continue;
            }
            // Split at the utility curve's breakpoints so both factors are linear on each part;
            // two-point Gauss-Legendre is then exact (the product is quadratic) and never
            // evaluates the utility exactly on a step.
            let mut cuts = vec![piece.lo];
            cuts.extend(
                utility
                    .points()
                    .iter()
                    .map(|point| point.time - start)
                    .filter(|t| *t > piece.lo && *t < piece.hi),
            );
            cuts.push(piece.hi);
            cuts.dedup();
            for part in cuts.windows(2) {
                let (a, b) = (part[0], part[1]);
                let half = (b - a) / 2.0;
                let middle = (a + b) / 2.0;
                let offset = half / 3f64.sqrt();
                for t in [middle - offset, middle + offset] {
                    total += half * piece.density_at(t) * utility.value_at(start + t);
                }
            }
        }
        total
    }

    /// Expected utility for each candidate start time (one MILP option per start time).
    pub fn expected_utilities(&self, utility: &UtilityCurve, starts: &[f64]) -> Vec<f64> {
        starts
            .iter()
            .map(|start| self.expected_utility(utility, *start))
            .collect()
    }

    /// Expected consumption of `demand` at each of `times` for a job started at `start`
    /// (3Sigma §3.2: demand × (1 − CDF(t − start))). Condition on elapsed time first for
    /// running jobs.
    pub fn expected_usage(&self, demand: f64, start: f64, times: &[f64]) -> Vec<f64> {
        times
            .iter()
            .map(|time| {
                if *time < start {
                    0.0
                } else {
                    demand * self.survival(time - start)
                }
            })
            .collect()
    }
}

/// Finish time estimated by exp-inc (3Sigma §4.2.1): once the elapsed time reaches the largest
/// observed runtime, the estimate grows by `2^t` cycles, `t = 0, 1, 2, …`, each time the job
/// outlives the previous estimate. Returns a time strictly greater than `elapsed`.
pub fn exp_inc_finish(largest_observed: f64, elapsed: f64, cycle: f64) -> f64 {
    let cycle = if cycle.is_finite() && cycle > 0.0 {
        cycle
    } else {
        1.0
    };
    let mut finish = largest_observed.max(0.0);
    let mut increment = cycle;
    for _ in 0..1024 {
        if finish > elapsed {
            return finish;
        }
        finish += increment;
        increment *= 2.0;
    }
    elapsed + cycle
}

/// A point of a piecewise-linear utility curve over completion time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UtilityPoint {
    pub time: f64,
    pub utility: f64,
}

/// Utility as a function of completion time: piecewise linear through `points` (sorted by time;
/// two points at the same time form a step whose left value applies at that instant, so
/// finishing exactly at a deadline counts as on time), constant before the first and after the
/// last point (3Sigma Fig. 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UtilityCurve {
    points: Vec<UtilityPoint>,
}

impl UtilityCurve {
    /// Builds a curve; points are sorted by time (stable, so step order is kept).
    pub fn new(mut points: Vec<UtilityPoint>) -> Self {
        points.retain(|point| point.time.is_finite() && point.utility.is_finite());
        points.sort_by(|a, b| a.time.total_cmp(&b.time));
        Self { points }
    }

    /// SLO job: `value` if complete by `deadline`, zero after (Fig. 3(a)).
    pub fn deadline(deadline: f64, value: f64) -> Self {
        Self::new(vec![
            UtilityPoint {
                time: deadline,
                utility: value,
            },
            UtilityPoint {
                time: deadline,
                utility: 0.0,
            },
        ])
    }

    /// SLO job with over-estimate handling (Fig. 3(d)): `value` until `deadline`, then
    /// `value_after_deadline` decaying linearly to zero over `decay_span`.
    pub fn deadline_with_decay(
        deadline: f64,
        value: f64,
        value_after_deadline: f64,
        decay_span: f64,
    ) -> Self {
        Self::new(vec![
            UtilityPoint {
                time: deadline,
                utility: value,
            },
            UtilityPoint {
                time: deadline,
                utility: value_after_deadline,
            },
            UtilityPoint {
                time: deadline + decay_span.max(f64::EPSILON),
                utility: 0.0,
            },
        ])
    }

    /// Latency-sensitive job: utility decreasing linearly from `value` at `submit` to zero at
    /// `zero_at` (Fig. 3(b)).
    pub fn latency_sensitive(submit: f64, value: f64, zero_at: f64) -> Self {
        Self::new(vec![
            UtilityPoint {
                time: submit,
                utility: value,
            },
            UtilityPoint {
                time: zero_at.max(submit + f64::EPSILON),
                utility: 0.0,
            },
        ])
    }

    pub fn points(&self) -> &[UtilityPoint] {
        &self.points
    }

    /// Utility of completing at `time`.
    pub fn value_at(&self, time: f64) -> f64 {
        let Some(first) = self.points.first() else {
            return 0.0;
        };
        if time <= first.time {
            return first.utility;
        }
        let next = self.points.partition_point(|point| point.time < time);
        match self.points.get(next) {
            None => self.points[self.points.len() - 1].utility,
            Some(point) if point.time == time => point.utility,
            Some(point) => {
                let previous = self.points[next - 1];
                let fraction = (time - previous.time) / (point.time - previous.time);
                previous.utility + fraction * (point.utility - previous.utility)
            }
        }
    }
}

/// Adaptive over-estimate handling (3Sigma §4.2.2–§4.2.3): an SLO job whose distribution gives
/// it little chance of meeting its deadline even if started at submission is probably
/// over-estimated, so its utility decays linearly past the deadline instead of dropping to zero.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OverEstimatePolicy {
    /// Enable decay when P(runtime ≤ deadline − submit) is below this.
    pub threshold: f64,
    /// Utility right after the deadline as a fraction of the on-time value (lower than on-time
    /// so such jobs only use otherwise idle resources).
    pub post_deadline_fraction: f64,
    /// Time for the post-deadline utility to reach zero, as a multiple of (deadline − submit).
    pub decay_span_factor: f64,
}

impl Default for OverEstimatePolicy {
    fn default() -> Self {
        Self {
            threshold: 0.05,
            post_deadline_fraction: 0.5,
            decay_span_factor: 1.0,
        }
    }
}

impl OverEstimatePolicy {
    /// True when the runtime distribution says the job cannot realistically meet its deadline.
    pub fn is_likely_overestimate(
        &self,
        distribution: &RuntimeDistribution,
        submit: f64,
        deadline: f64,
    ) -> bool {
        distribution.cdf(deadline - submit) < self.threshold
    }

    /// The utility curve the scheduler should use for an SLO job.
    pub fn slo_utility(
        &self,
        distribution: &RuntimeDistribution,
        submit: f64,
        deadline: f64,
        value: f64,
    ) -> UtilityCurve {
        if self.is_likely_overestimate(distribution, submit, deadline) {
            let window = (deadline - submit).max(f64::EPSILON);
            UtilityCurve::deadline_with_decay(
                deadline,
                value,
                value * self.post_deadline_fraction,
                window * self.decay_span_factor,
            )
        } else {
            UtilityCurve::deadline(deadline, value)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    #[test]
    fn widening_scales_log_deviations_keeps_the_median_and_floors_atoms() {
        assert!((standard_normal_quantile(0.9) - 1.281_551_565_5).abs() < 1e-8);
        assert!(standard_normal_quantile(0.5).abs() < 1e-12);
        assert!((standard_normal_quantile(0.01) + 2.326_347_874).abs() < 1e-8);
        let d = RuntimeDistribution::from_samples(&[10.0, 20.0, 40.0, 80.0, 160.0]).unwrap();
        let levels = [0.0, 0.1, 0.35, 0.5, 0.9, 1.0];
        let mut swept = [0.0; 6];
        d.quantiles_into(&levels, &mut swept);
        for (level, q) in levels.iter().zip(&swept) {
            assert!((d.quantile(*level) - q).abs() < 1e-9, "q{level}");
        }
        let m = d.median();
        let w = d.widened(2.0, 0.0);
        assert!((w.median() - m).abs() < 1e-6 * m);
        for p in [0.1, 0.9] {
            // Exact at multiples of 1/CALIBRATED_PIECES: twice the log deviation.
            let expected = m * (2.0 * (d.quantile(p) / m).ln()).exp();
            assert!((w.quantile(p) - expected).abs() < 1e-6 * expected, "p{p}");
        }
        let mass: f64 = w.pieces().iter().map(|p| p.mass).sum();
        assert!((mass - 1.0).abs() < 1e-9);
        // An atom gets the floor's log-normal spread.
        let atom = RuntimeDistribution::point(100.0).widened(1.0, 0.1);
        let expected_p90 = 100.0 * (0.1 * 1.281_551_565_5f64).exp();
        assert!((atom.quantile(0.9) - expected_p90).abs() < 1e-6 * expected_p90);
        assert!((atom.median() - 100.0).abs() < 1e-6);
    }

    #[test]
    fn scaling_multiplies_every_quantile_and_keeps_the_mass() {
        let d = RuntimeDistribution::from_samples(&[10.0, 12.0, 15.0, 40.0, 41.0, 90.0]).unwrap();
        let s = d.scaled(2.5);
        for q in [0.0, 0.1, 0.25, 0.5, 0.9, 1.0] {
            assert!((s.quantile(q) - 2.5 * d.quantile(q)).abs() < 1e-9, "q{q}");
        }
        let mass: f64 = s.pieces().iter().map(|p| p.mass).sum();
        assert!((mass - 1.0).abs() < 1e-9);
        assert!((s.mean() - 2.5 * d.mean()).abs() < 1e-9);
        assert_eq!(s.largest_observed(), 2.5 * d.largest_observed());
        assert_eq!(d.scaled(0.0), d);
        assert_eq!(d.scaled(f64::NAN), d);
    }

    #[test]
    fn uniform_cdf_quantile_pdf_mean() {
        let distribution = RuntimeDistribution::uniform(0.0, 10.0);
        assert!(close(distribution.cdf(2.5), 0.25, 1e-12));
        assert!(close(distribution.quantile(0.75), 7.5, 1e-9));
        assert!(close(distribution.pdf(3.0), 0.1, 1e-12));
        assert!(close(distribution.mean(), 5.0, 1e-9));
        assert_eq!(distribution.cdf(-1.0), 0.0);
        assert_eq!(distribution.cdf(11.0), 1.0);
    }

    #[test]
    fn histogram_of_two_values_puts_quarter_mass_on_each_and_half_between() {
        let distribution = RuntimeDistribution::from_samples(&[10.0, 20.0]).unwrap();
        assert!(close(distribution.cdf(10.0), 0.25, 1e-12));
        assert!(close(distribution.cdf(15.0), 0.5, 1e-12));
        assert!(close(distribution.cdf(19.999), 0.75, 1e-3));
        assert!(close(distribution.median(), 15.0, 1e-9));
        assert!(close(distribution.mean(), 15.0, 1e-9));
    }

    #[test]
    fn quantile_inverts_cdf_on_a_skewed_histogram() {
        let samples: Vec<f64> = (1..=500).map(|i| f64::from(i).powf(1.7)).collect();
        let distribution = RuntimeDistribution::from_samples(&samples).unwrap();
        for q in [0.01, 0.1, 0.3, 0.5, 0.8, 0.99] {
            let t = distribution.quantile(q);
            assert!(close(distribution.cdf(t), q, 1e-9), "q={q}");
        }
    }

    #[test]
    fn conditioning_follows_equation_two() {
        // Uniform(0, 10) given elapsed 4 is Uniform(4, 10).
        let distribution = RuntimeDistribution::uniform(0.0, 10.0);
        let conditioned = distribution.condition_on_elapsed(4.0, 1.0);
        for t in [4.0, 5.0, 7.5, 9.0] {
            let expected = distribution.survival(t) / distribution.survival(4.0);
            assert!(close(conditioned.survival(t), expected, 1e-12), "t={t}");
        }
        assert!(close(conditioned.mean(), 7.0, 1e-9));
        assert!(close(conditioned.pdf(6.0), 1.0 / 6.0, 1e-12));
    }

    #[test]
    fn conditioning_past_all_history_uses_exp_inc() {
        let distribution = RuntimeDistribution::from_samples(&[50.0, 80.0, 100.0]).unwrap();
        // At 100 the job has outlived every observation: finish = 100 + 1 cycle.
        let at_max = distribution.condition_on_elapsed(100.0, 10.0);
        assert!(close(at_max.median(), 110.0, 1e-9));
        // Outliving that: + 2 cycles, then + 4 cycles.
        assert!(close(
            distribution.condition_on_elapsed(110.0, 10.0).median(),
            130.0,
            1e-9
        ));
        assert!(close(
            distribution.condition_on_elapsed(135.0, 10.0).median(),
            170.0,
            1e-9
        ));
        assert_eq!(exp_inc_finish(100.0, 20.0, 10.0), 100.0);
    }

    #[test]
    fn expected_utility_of_paper_example_case_a() {
        // 3Sigma §2.3 case A: runtimes Uniform(0, 10 min), SLO deadline 15 min. Run the BE job
        // first (start the SLO job when it ends) => SLO miss probability 12.5%.
        let slo = RuntimeDistribution::uniform(0.0, 10.0);
        let deadline = UtilityCurve::deadline(15.0, 1.0);
        // Starting right away: always on time.
        assert!(close(slo.expected_utility(&deadline, 0.0), 1.0, 1e-12));
        // Starting at a BE runtime b ~ U(0, 10): average of P(runtime ≤ 15 − b).
        let mut average = 0.0;
        let steps = 10_000;
        for step in 0..steps {
            let start = (f64::from(step) + 0.5) / f64::from(steps) * 10.0;
            average += slo.expected_utility(&deadline, start) / f64::from(steps);
        }
        assert!(close(average, 0.875, 1e-4), "{average}");
    }

    #[test]
    fn expected_utility_is_exact_for_linear_utility() {
        // E[U] for U(c) = 1 − c/100 and runtime U(0, 10) started at 20: 1 − (20 + 5)/100.
        let distribution = RuntimeDistribution::uniform(0.0, 10.0);
        let utility = UtilityCurve::latency_sensitive(0.0, 1.0, 100.0);
        assert!(close(
            distribution.expected_utility(&utility, 20.0),
            0.75,
            1e-12
        ));
        // A point mass exactly at the deadline counts as on time.
        let point = RuntimeDistribution::point(5.0);
        assert_eq!(
            point.expected_utility(&UtilityCurve::deadline(5.0, 2.0), 0.0),
            2.0
        );
    }

    #[test]
    fn expected_usage_is_demand_times_survival() {
        let distribution = RuntimeDistribution::uniform(0.0, 10.0);
        let usage = distribution.expected_usage(4.0, 100.0, &[90.0, 100.0, 105.0, 120.0]);
        assert_eq!(usage, vec![0.0, 4.0, 2.0, 0.0]);
    }

    #[test]
    fn sampling_matches_distribution_and_is_reproducible() {
        let distribution = RuntimeDistribution::uniform(0.0, 10.0);
        let mut rng = StdRng::seed_from_u64(3);
        let samples: Vec<f64> = (0..20_000).map(|_| distribution.sample(&mut rng)).collect();
        let below = samples.iter().filter(|s| **s <= 2.0).count() as f64 / 20_000.0;
        assert!(close(below, 0.2, 0.01), "{below}");
        let mut again = StdRng::seed_from_u64(3);
        assert_eq!(distribution.sample(&mut again), samples[0]);
    }

    #[test]
    fn over_estimate_policy_switches_to_decay_only_when_deadline_looks_impossible() {
        let policy = OverEstimatePolicy::default();
        let slow = RuntimeDistribution::uniform(100.0, 200.0);
        let utility = policy.slo_utility(&slow, 0.0, 50.0, 1.0);
        assert!(policy.is_likely_overestimate(&slow, 0.0, 50.0));
        assert!(utility.value_at(60.0) > 0.0);
        assert_eq!(utility.value_at(50.0), 1.0);
        assert_eq!(utility.value_at(100.0), 0.0);
        let fast = RuntimeDistribution::uniform(10.0, 40.0);
        let utility = policy.slo_utility(&fast, 0.0, 50.0, 1.0);
        assert_eq!(utility.value_at(50.1), 0.0);
    }

    #[test]
    fn an_upper_tail_moves_its_mass_above_the_old_maximum() {
        let body = RuntimeDistribution::uniform(10.0, 20.0);
        let tailed = body.with_upper_tail(0.1, 3.0);
        assert!(close(tailed.cdf(20.0), 0.9, 1e-12), "{}", tailed.cdf(20.0));
        // Falling linearly to 0 at 60: a quarter of the tail's mass lies past 40.
        assert!(
            close(tailed.survival(40.0), 0.025, 1e-12),
            "{}",
            tailed.survival(40.0)
        );
        assert_eq!(tailed.support_max(), 60.0);
        assert_eq!(
            tailed.largest_observed(),
            20.0,
            "the history's longest runtime is kept"
        );
        // The lower half and the median stay; the upper half holds 0.4 instead of 0.5.
        assert!(close(tailed.median(), 15.0, 1e-9));
        assert!(close(tailed.quantile(0.25), 12.5, 1e-9));
        assert!(close(tailed.cdf(17.5), 0.5 + 0.2, 1e-9));
        assert!(close(
            tailed.mean(),
            0.5 * 12.5 + 0.4 * 17.5 + 0.1 * (20.0 + 40.0 / 3.0),
            1e-9
        ));
        assert!(close(
            tailed.pieces().iter().map(|p| p.mass).sum::<f64>(),
            1.0,
            1e-12
        ));
        // A sloped piece across the median is split where the median is, and stays linear.
        let skewed = RuntimeDistribution::from_samples(&[1.0, 2.0, 2.0, 3.0, 9.0]).unwrap();
        let tailed = skewed.with_upper_tail(0.2, 2.0);
        assert!(close(tailed.median(), skewed.median(), 1e-9));
        assert!(close(tailed.cdf(9.0), 0.8, 1e-9));
        for q in [0.1, 0.3, 0.5] {
            assert!(close(tailed.quantile(q), skewed.quantile(q), 1e-9), "{q}");
        }
        for (mass, ratio) in [
            (0.0, 2.0),
            (0.5, 2.0),
            (0.1, 1.0),
            (0.1, 1.0 + f64::EPSILON / 4.0),
            (0.1, f64::MAX),
            (0.1, f64::NAN),
            (-0.1, 2.0),
        ] {
            assert_eq!(body.with_upper_tail(mass, ratio), body, "{mass} {ratio}");
        }
    }

    #[test]
    fn uniform_pieces_keep_uniform_ones_and_split_sloped_ones_by_mass() {
        let calibrated = RuntimeDistribution::uniform(10.0, 20.0).widened(1.0, 0.1);
        assert_eq!(calibrated.uniform_pieces(8), calibrated.pieces().to_vec());
        let tailed = calibrated.with_upper_tail(0.1, 3.0);
        let pieces = tailed.uniform_pieces(8);
        assert_eq!(pieces.len(), CALIBRATED_PIECES + 8);
        let top = calibrated.support_max();
        for piece in &pieces[CALIBRATED_PIECES..] {
            assert!(close(piece.mass, 0.1 / 8.0, 1e-12));
            assert!(piece.lo >= top && piece.hi <= 3.0 * top && piece.hi > piece.lo);
        }
        // The split pieces' bounds are the tail's own quantiles: survival agrees at each.
        let split = RuntimeDistribution {
            pieces: pieces.clone(),
            largest_observed: tailed.largest_observed(),
            observations: 0.0,
        };
        for piece in &pieces[CALIBRATED_PIECES..] {
            assert!(close(
                split.survival(piece.lo),
                tailed.survival(piece.lo),
                1e-9
            ));
        }
        assert!(close(split.mean(), tailed.mean(), 0.01 * tailed.mean()));
    }

    #[test]
    fn serde_round_trip() {
        let distribution = RuntimeDistribution::from_samples(&[1.0, 2.0, 3.0, 10.0]).unwrap();
        let json = serde_json::to_string(&distribution).unwrap();
        let back: RuntimeDistribution = serde_json::from_str(&json).unwrap();
        assert_eq!(back, distribution);
    }
}
#[cfg(test)]
mod widening_keeps_the_median {
    use super::*;

    /// Histograms of tied and spread runtimes alike keep their median under any widening.
    #[test]
    fn on_many_random_histograms() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut next = || rng.random::<f64>();
        for _ in 0..2000 {
            let n = 1 + (next() * 30.0) as usize;
            let samples: Vec<f64> = (0..n)
                .map(|_| {
                    let scale = if next() < 0.3 { 100.0 } else { 1.0 };
                    (1.0 + (next() * 5.0).floor() * 10.0) * scale
                })
                .collect();
            let d = RuntimeDistribution::from_samples(&samples).unwrap();
            let w = d.widened(0.2 + next() * 3.0, 0.1);
            assert!(
                (w.median() - d.median()).abs() <= 1e-9 * d.median(),
                "{samples:?}: {} then {}",
                d.median(),
                w.median()
            );
        }
    }
}

//! 3σPredict (3Sigma §4.1): runtime distributions from job history, chosen per job by the
//! expert with the lowest normalised mean absolute error.
//!
//! Every job carries features (user, job name, template, requested resources, submit hour, …,
//! and combinations such as user+name). For every feature *value* the predictor keeps a
//! [`FeatureHistory`]: a Ben-Haim & Tom-Tov histogram of observed runtimes, the four point
//! estimators of the paper (mean, median of recent values, exponentially weighted rolling
//! average with α = 0.6, mean of the X most recent) plus one of ours (the centre of the
//! densest factor-4 window of the recent values, [`Estimator::RecentMode`]) and a streaming
//! NMAE per estimator. A (feature value,
//! estimator) pair is an *expert*; the job gets the distribution of the feature value whose
//! expert has the lowest NMAE. Memory per feature value is constant: a bounded histogram, a
//! bounded ring of recent values and a few counters.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::distribution::RuntimeDistribution;
use crate::histogram::{DEFAULT_MAX_BINS, StreamingHistogram};

/// Largest ring of recent values a feature value may keep.
pub const MAX_RECENT_WINDOW: usize = 64;

/// The point estimators: the four of 3Sigma §4.1, then ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// (a) average of all observations.
    Mean,
    /// (b) median of the recent values (proxy for the full median, §4.1 "Scalability").
    RecentMedian,
    /// (c) exponentially weighted rolling average: `r ← α·x + (1 − α)·r`, α = 0.6.
    Rolling,
    /// (d) average of the X most recent observations.
    RecentMean,
    /// Not in the paper: the centre (geometric mean of its ends) of the densest factor-4
    /// window of the recent values, i.e. the estimate that the most recent runtimes lie
    /// within 2× of. Histories that mix short failed or killed runs with full runs are
    /// bimodal; their median falls between the modes and is within 2× of neither.
    RecentMode,
}

/// Number of point estimators.
pub const ESTIMATORS: usize = 5;

impl Estimator {
    pub const ALL: [Estimator; ESTIMATORS] = [
        Estimator::Mean,
        Estimator::RecentMedian,
        Estimator::Rolling,
        Estimator::RecentMean,
        Estimator::RecentMode,
    ];

    fn index(self) -> usize {
        match self {
            Estimator::Mean => 0,
            Estimator::RecentMedian => 1,
            Estimator::Rolling => 2,
            Estimator::RecentMean => 3,
            Estimator::RecentMode => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Estimator::Mean => "mean",
            Estimator::RecentMedian => "recent_median",
            Estimator::Rolling => "rolling",
            Estimator::RecentMean => "recent_mean",
            Estimator::RecentMode => "recent_mode",
        }
    }
}

/// Tunables of the predictor (defaults from 3Sigma §4.1 where the paper gives one).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PredictorConfig {
    /// Histogram bin budget per feature value (paper: 80).
    pub max_bins: usize,
    /// Weight of the newest observation in the rolling estimator (paper: α = 0.6).
    pub rolling_alpha: f64,
    /// Recent values kept per feature value for the median estimator (≤ 64).
    pub recent_window: usize,
    /// X of the "average of X recent runtimes" estimator (≤ `recent_window`; the paper does not
    /// give X). 2, the "average of the last two" of Tsafrir et al. (TPDS 2007), measured
    /// slightly better than 5 (docs/benchmarks-inference.md §1).
    pub recent_mean_count: usize,
    /// How many scored estimates an expert's own NMAE must have to weigh as much as the NMAE
    /// of its feature as a whole (see [`RuntimePredictor::choose`]): an expert with `s` scores
    /// is ranked by `(s·NMAE_expert + m·NMAE_feature) / (s + m)`.
    pub prior_weight: f64,
    /// Share of outcomes the central interval of this mass should hold (the 10th–90th
    /// percentile for 0.8); see [`RuntimePredictor::spread`].
    pub coverage_target: f64,
    /// Step of the online calibration of the spread (adaptive conformal inference, Gibbs &
    /// Candès 2021): per finished job, `spread ← spread · exp(rate · (missed − (1 − target)))`.
    pub calibration_rate: f64,
    /// Log-normal floor of every predicted distribution's spread (σ of ln runtime before
    /// calibration), so a history of identical runtimes still has an interval to calibrate.
    pub spread_floor: f64,
    /// Give every distribution the upper tail measured online ([`RuntimePredictor::upper_tail`]);
    /// off, a distribution ends at its history's (widened) maximum, as 3Sigma §4.1's empirical
    /// histograms do.
    #[serde(default = "upper_tail_on")]
    pub upper_tail: bool,
}

fn upper_tail_on() -> bool {
    true
}

impl Default for PredictorConfig {
    fn default() -> Self {
        Self {
            max_bins: DEFAULT_MAX_BINS,
            rolling_alpha: 0.6,
            recent_window: 20,
            recent_mean_count: 2,
            prior_weight: 3.0,
            coverage_target: 0.8,
            calibration_rate: 0.05,
            spread_floor: 0.1,
            upper_tail: true,
        }
    }
}

/// One feature of a job, e.g. `user = alice` or `user+name = alice/etl`.
///
/// A *scaled* feature (`scale = Some(s)`) learns the ratio runtime / `s` of its jobs, and its
/// experts estimate `s ×` their estimate of the ratio: e.g. the share of its requested time a
/// user's jobs run, applied to this job's request ([`JobFeatures::push_scaled`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Feature {
    pub name: String,
    pub value: String,
    #[serde(default)]
    pub scale: Option<f64>,
}

impl Feature {
    /// The factor from this feature's history (a ratio when scaled) to a runtime.
    fn scale(&self) -> f64 {
        self.scale.unwrap_or(1.0)
    }
}

/// The features a job is described by. Missing attributes are simply not pushed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobFeatures {
    pub features: Vec<Feature>,
}

impl JobFeatures {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `name = value`; empty values are skipped (an unknown attribute groups nothing).
    pub fn push(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let value = value.into();
        if !value.is_empty() {
            self.features.push(Feature {
                name: name.into(),
                value,
                scale: None,
            });
        }
    }

    /// Adds the scaled feature `name = value`, whose history is of runtime / `scale` (see
    /// [`Feature`]); skipped when the value is empty or `scale` is not finite and positive.
    pub fn push_scaled(&mut self, name: impl Into<String>, value: impl Into<String>, scale: f64) {
        let value = value.into();
        if !value.is_empty() && scale.is_finite() && scale > 0.0 {
            self.features.push(Feature {
                name: name.into(),
                value,
                scale: Some(scale),
            });
        }
    }

    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.push(name, value);
        self
    }

    pub fn len(&self) -> usize {
        self.features.len()
    }

    pub fn is_empty(&self) -> bool {
        self.features.is_empty()
    }
}

/// 64-bit FNV-1a of `name`, a separator and `value`: a stable key so the per-value state does not
/// depend on the length of the (often hashed) attribute strings.
fn feature_key(feature: &Feature) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in feature
        .name
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(feature.value.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Streaming NMAE accumulator: Σ|estimate − actual| / Σ actual.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorStat {
    pub absolute_error_sum: f64,
    pub actual_sum: f64,
    pub scored: u64,
}

impl ErrorStat {
    pub fn record(&mut self, estimate: f64, actual: f64) {
        self.absolute_error_sum += (estimate - actual).abs();
        self.actual_sum += actual.abs();
        self.scored += 1;
    }

    /// NMAE, or `None` before the first scored estimate.
    pub fn nmae(&self) -> Option<f64> {
        if self.scored == 0 {
            None
        } else if self.actual_sum > 0.0 {
            Some(self.absolute_error_sum / self.actual_sum)
        } else if self.absolute_error_sum == 0.0 {
            Some(0.0)
        } else {
            Some(f64::INFINITY)
        }
    }
}

/// `(s·own + m·feature) / (s + m)`: an expert's NMAE shrunk towards its feature's NMAE.
fn shrunk_nmae(own: &ErrorStat, feature: Option<f64>, prior_weight: f64) -> Option<f64> {
    let scored = own.scored as f64;
    match (own.nmae(), feature) {
        (Some(own), Some(feature)) if prior_weight > 0.0 => {
            Some((scored * own + prior_weight * feature) / (scored + prior_weight))
        }
        (Some(own), _) => Some(own),
        (None, feature) => feature,
    }
}

/// Classes of history length an expert's within-2× record is kept per: 1, 2, 3–4, 5–8, 9–16
/// and more observations behind the feature value.
pub const HISTORY_CLASSES: usize = 6;

/// The history-length class of a feature value with `observations` (≥ 1) runtimes.
fn history_class(observations: u64) -> usize {
    let bits = (u64::BITS - observations.saturating_sub(1).leading_zeros()) as usize;
    bits.min(HISTORY_CLASSES - 1)
}

/// Decayed count of within-2× hits among decayed scored estimates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HitRecord {
    pub hits: f64,
    pub scored: f64,
}

impl HitRecord {
    fn record(&mut self, hit: bool, decay: f64) {
        self.hits = self.hits * (1.0 - decay) + f64::from(u8::from(hit));
        self.scored = self.scored * (1.0 - decay) + 1.0;
    }

    /// Laplace estimate of the hit probability: `(hits + 1) / (scored + 2)`.
    pub fn rate(&self) -> f64 {
        (self.hits + 1.0) / (self.scored + 2.0)
    }
}

/// `estimate` within a factor of two of `actual`.
fn within_2x(estimate: f64, actual: f64) -> bool {
    estimate >= actual / 2.0 && estimate <= actual * 2.0
}

/// What the predictor learns per feature *name* (a handful per job): each estimator's NMAE
/// over all values of the feature, and its within-2× record per history-length class.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FeatureRecord {
    errors: [ErrorStat; ESTIMATORS],
    hits: [[HitRecord; HISTORY_CLASSES]; ESTIMATORS],
}

/// Constant-size state of one feature value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureHistory {
    histogram: StreamingHistogram,
    count: u64,
    mean: f64,
    rolling: f64,
    recent: Vec<f64>,
    recent_next: usize,
    errors: [ErrorStat; ESTIMATORS],
}

impl FeatureHistory {
    fn new(config: &PredictorConfig) -> Self {
        Self {
            histogram: StreamingHistogram::new(config.max_bins),
            count: 0,
            mean: 0.0,
            rolling: 0.0,
            recent: Vec::with_capacity(config.recent_window.clamp(1, MAX_RECENT_WINDOW)),
            recent_next: 0,
            errors: [ErrorStat::default(); ESTIMATORS],
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn histogram(&self) -> &StreamingHistogram {
        &self.histogram
    }

    pub fn error(&self, estimator: Estimator) -> &ErrorStat {
        &self.errors[estimator.index()]
    }

    /// Current point estimate of `estimator` (`None` before the first observation).
    pub fn estimate(&self, estimator: Estimator, config: &PredictorConfig) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        Some(match estimator {
            Estimator::Mean => self.mean,
            Estimator::Rolling => self.rolling,
            Estimator::RecentMedian | Estimator::RecentMode => {
                let mut buffer = [0.0; MAX_RECENT_WINDOW];
                let values = &mut buffer[..self.recent.len()];
                values.copy_from_slice(&self.recent);
                values.sort_unstable_by(f64::total_cmp);
                if estimator == Estimator::RecentMedian {
                    sorted_median(values)
                } else {
                    densest_window_centre(values)
                }
            }
            Estimator::RecentMean => {
                let capacity = ring_size(config);
                let take = config.recent_mean_count.clamp(1, self.recent.len());
                let mut sum = 0.0;
                for back in 1..=take {
                    // Walk backwards from the newest entry of the ring.
                    let index = if self.recent.len() < capacity {
                        self.recent.len() - back
                    } else {
                        (self.recent_next + capacity - back) % capacity
                    };
                    sum += self.recent[index];
                }
                sum / take as f64
            }
        })
    }

    /// Current estimate of every estimator, in [`Estimator::ALL`] order (the recent values
    /// are sorted once for the median and the mode).
    fn estimates(&self, config: &PredictorConfig) -> [Option<f64>; ESTIMATORS] {
        if self.count == 0 {
            return [None; ESTIMATORS];
        }
        let mut buffer = [0.0; MAX_RECENT_WINDOW];
        let values = &mut buffer[..self.recent.len()];
        values.copy_from_slice(&self.recent);
        values.sort_unstable_by(f64::total_cmp);
        Estimator::ALL.map(|estimator| match estimator {
            Estimator::RecentMedian => Some(sorted_median(values)),
            Estimator::RecentMode => Some(densest_window_centre(values)),
            other => self.estimate(other, config),
        })
    }

    /// Scores every estimator's current estimate against `runtime`, then learns it.
    #[cfg(test)]
    fn observe(&mut self, runtime: f64, config: &PredictorConfig) {
        let estimates = self.estimates(config);
        self.score(&estimates, runtime);
        self.learn(runtime, config);
    }

    fn score(&mut self, estimates: &[Option<f64>; ESTIMATORS], runtime: f64) {
        for (error, estimate) in self.errors.iter_mut().zip(estimates) {
            if let Some(estimate) = estimate {
                error.record(*estimate, runtime);
            }
        }
    }

    fn learn(&mut self, runtime: f64, config: &PredictorConfig) {
        self.count += 1;
        self.mean += (runtime - self.mean) / self.count as f64;
        self.rolling = if self.count == 1 {
            runtime
        } else {
            config.rolling_alpha * runtime + (1.0 - config.rolling_alpha) * self.rolling
        };
        let capacity = ring_size(config);
        if self.recent.len() < capacity {
            self.recent.push(runtime);
            self.recent_next = self.recent.len() % capacity;
        } else {
            self.recent[self.recent_next] = runtime;
            self.recent_next = (self.recent_next + 1) % capacity;
        }
        self.histogram.insert(runtime);
    }
}

/// Median of ascending, non-empty `values`.
fn sorted_median(values: &[f64]) -> f64 {
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// The estimate that the most of ascending, non-empty `values` lie within 2× of: the
/// geometric centre of the factor-4 window `[v_i, v_j]` (`v_j ≤ 4·v_i`) holding the most
/// values. Among equally full windows, the one whose centre is nearest the median (in ratio),
/// so a history without any cluster gets its median's neighbourhood, not its shortest run.
fn densest_window_centre(values: &[f64]) -> f64 {
    let median = sorted_median(values);
    // Ascending: no zero runtime in the window, so every centre and the median are positive.
    let all_positive = values.first().is_some_and(|&v| v > 0.0);
    let (mut best_count, mut best_centre, mut best_distance) = (0, median, f64::INFINITY);
    let mut end = 0;
    for start in 0..values.len() {
        end = end.max(start + 1);
        while end < values.len() && values[end] <= 4.0 * values[start] {
            end += 1;
        }
        let count = end - start;
        if count < best_count {
            continue;
        }
        let centre = (values[start] * values[end - 1]).sqrt();
        let distance = if all_positive {
            // |ln(centre / median)| orders as max(r, 1/r) with r = centre / median: the same
            // comparison without a logarithm per window (this runs for every prediction).
            let ratio = centre / median;
            ratio.max(ratio.recip())
        } else if centre > 0.0 && median > 0.0 {
            (centre / median).ln().abs()
        } else {
            (centre - median).abs()
        };
        if count > best_count || distance < best_distance {
            (best_count, best_centre, best_distance) = (count, centre, distance);
        }
    }
    best_centre
}

/// Size of the ring of recent values: from the config, not `Vec::capacity`, which a clone or a
/// deserialised history does not keep (a cloned half-full ring then indexed past its end).
fn ring_size(config: &PredictorConfig) -> usize {
    config.recent_window.clamp(1, MAX_RECENT_WINDOW)
}

impl FeatureHistory {
    #[cfg(test)]
    fn recent_len(&self) -> usize {
        self.recent.len()
    }

    /// Bytes this feature value occupies (struct, histogram bins, recent ring).
    pub fn state_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.histogram.state_bytes()
            - std::mem::size_of::<StreamingHistogram>()
            + self.recent.capacity() * std::mem::size_of::<f64>()
    }
}

/// Identity and track record of the expert that produced a prediction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expert {
    pub feature: String,
    pub value: String,
    pub estimator: Estimator,
    /// NMAE of this expert so far (`None` if it has never been scored).
    pub nmae: Option<f64>,
    /// Observations behind the feature value.
    pub observations: u64,
}

/// What 3σPredict hands to the scheduler for one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimePrediction {
    pub distribution: RuntimeDistribution,
    /// Support maximum of `distribution` before its upper tail
    /// ([`RuntimePredictor::upper_tail`]): the longest runtime its history suggests.
    #[serde(default)]
    pub body_support_max: f64,
    /// The chosen expert's point estimate (what a PointRealEst scheduler would use).
    pub point_estimate: f64,
    pub expert: Expert,
}

/// A candidate expert for one job, as seen by evaluation code and baselines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertCandidate {
    /// Index into the job's `JobFeatures::features`.
    pub feature_index: usize,
    pub estimator: Estimator,
    pub estimate: f64,
    pub nmae: Option<f64>,
    /// Estimates of this expert scored so far.
    pub scored: u64,
    /// NMAE of the same estimator over every value of this feature (`None` before any score).
    pub feature_nmae: Option<f64>,
    /// Estimated probability that this expert's estimate is within 2× of the outcome: the
    /// Laplace-smoothed within-2× record of its feature and estimator at its history length.
    pub hit_rate: f64,
    /// The rank used by [`RuntimePredictor::choose`]: the expert's NMAE shrunk towards its
    /// feature's NMAE (`None` when neither has been scored).
    pub score: Option<f64>,
    pub observations: u64,
}

/// The 3σPredict state: one [`FeatureHistory`] per feature value seen so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuntimePredictor {
    config: PredictorConfig,
    histories: HashMap<u64, FeatureHistory>,
    /// Per (feature name, estimator) over all values of the feature: streaming NMAE (the prior
    /// for experts with a short track record) and within-2× records per history length. One
    /// entry per feature *name* (a handful).
    feature_records: HashMap<String, FeatureRecord>,
    /// Calibrated multiplier of every distribution's log-spread around its median.
    #[serde(default = "unit_spread")]
    spread: f64,
    /// Recent within-2× hit rate of the selection rules, in [`Selection::ALL`] order.
    #[serde(default)]
    selection_hits: [HitRecord; SELECTIONS],
    /// How often, and by how much, outcomes exceeded their distribution's support maximum.
    #[serde(default)]
    upper_tail: UpperTailRecord,
}

/// Decayed record of outcomes above the support maximum of the distribution their job was
/// given at submission (an effective window of ~1,000 finished jobs, as the per-feature
/// within-2× records).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct UpperTailRecord {
    /// Outcomes scored.
    pub scored: f64,
    /// Outcomes above the support maximum.
    pub exceeded: f64,
    /// Sum of ln(outcome / support maximum) over those.
    pub log_ratio_sum: f64,
}

/// Decay per finished job of [`UpperTailRecord`].
const UPPER_TAIL_DECAY: f64 = 0.001;

/// Outcomes scored before the record gives a tail: one recent window's worth (the first
/// exceedance alone would say "all of them").
const UPPER_TAIL_MIN_SCORED: f64 = 20.0;

impl UpperTailRecord {
    fn record(&mut self, support_max: f64, runtime: f64) {
        let keep = 1.0 - UPPER_TAIL_DECAY;
        self.scored = self.scored * keep + 1.0;
        self.exceeded *= keep;
        self.log_ratio_sum *= keep;
        if runtime > support_max {
            self.exceeded += 1.0;
            self.log_ratio_sum += (runtime / support_max).ln();
        }
    }

    /// `(mass, ratio)` of the tail to add: the share of outcomes that exceeded (at most 0.4),
    /// and the end of a density falling linearly from the support maximum to zero at `ratio ×`
    /// it, whose mean is the exceeding outcomes' geometric-mean ratio `g` (`ratio = 1 +
    /// 3 (g − 1)`): most exceeding runs end just past the maximum, a few far beyond. The
    /// geometric mean, not the arithmetic one: on the traces the ratios run up to 10⁶ (a
    /// history of seconds-long runs, then a job of days), and their arithmetic mean
    /// (7–500,000× by trace) would stretch every tail over days. `(0, 1)`, no tail, before any
    /// exceeded or before [`UPPER_TAIL_MIN_SCORED`] outcomes.
    pub fn tail(&self) -> (f64, f64) {
        if self.exceeded <= 0.0 || self.scored < UPPER_TAIL_MIN_SCORED {
            return (0.0, 1.0);
        }
        let geometric_mean_ratio = (self.log_ratio_sum / self.exceeded).exp().max(1.0);
        (
            (self.exceeded / self.scored).min(0.4),
            1.0 + 3.0 * (geometric_mean_ratio - 1.0),
        )
    }
}

/// How the expert of a job is selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// 3Sigma §4.1: the expert of lowest (shrunk) NMAE.
    Ranked,
    /// The recent mode ([`Estimator::RecentMode`]) of the job's first feature value with
    /// history (callers list the most specific features first): the rule of a per-(user,
    /// request) history lookup.
    MostSpecific,
    /// The expert whose (feature, estimator, history length) has put the most estimates
    /// within 2× of the outcome (see [`RuntimePredictor::choose_by_hits`]).
    Learned,
    /// The feature value that the 3Sigma ranking restricted to [`Estimator::RecentMode`]
    /// experts picks, with its recent mode: the ranking chooses the feature value, the mode
    /// the estimate. Ranking every estimator lets a mean or rolling average with a low NMAE
    /// (NMAE weighs the longest jobs most) win jobs that the mode would put within 2×.
    RankedMode,
}

/// Number of selection rules.
const SELECTIONS: usize = 4;

impl Selection {
    pub const ALL: [Selection; SELECTIONS] = [
        Selection::Ranked,
        Selection::MostSpecific,
        Selection::Learned,
        Selection::RankedMode,
    ];
}

/// Decay per scored estimate of the per-feature within-2× records (an effective window of
/// ~1,000 estimates per feature, estimator and history class).
const FEATURE_HIT_DECAY: f64 = 0.001;

/// Decay per finished job of the selection rules' hit rates (an effective window of ~200 jobs).
const SELECTION_DECAY: f64 = 0.005;

fn unit_spread() -> f64 {
    1.0
}

impl Default for RuntimePredictor {
    fn default() -> Self {
        Self::new(PredictorConfig::default())
    }
}

impl RuntimePredictor {
    pub fn new(config: PredictorConfig) -> Self {
        Self {
            config,
            histories: HashMap::new(),
            feature_records: HashMap::new(),
            spread: 1.0,
            selection_hits: [HitRecord::default(); SELECTIONS],
            upper_tail: UpperTailRecord::default(),
        }
    }

    /// The rule selecting experts now: whichever had the highest recent within-2× hit rate on
    /// finished jobs, as estimated at their submission (ranked until every rule has a record).
    /// The NMAE ranking chooses among many noisy track records and loses, on some traces, to
    /// the plain most-specific lookup or the learned rule (docs/benchmarks-inference.md §1);
    /// none wins everywhere, so the predictor follows the one right most often lately.
    pub fn selection(&self) -> Selection {
        if self
            .selection_hits
            .iter()
            .any(|record| record.scored <= 0.0)
        {
            return Selection::Ranked;
        }
        let mut best = Selection::Ranked;
        for (selection, record) in Selection::ALL.into_iter().zip(&self.selection_hits) {
            let rate = record.hits / record.scored;
            let best_rate =
                self.selection_hits[best as usize].hits / self.selection_hits[best as usize].scored;
            if rate > best_rate {
                best = selection;
            }
        }
        best
    }

    /// The most-specific candidate: the recent mode of the first feature value with history.
    fn most_specific(candidates: &[ExpertCandidate]) -> Option<ExpertCandidate> {
        candidates
            .iter()
            .find(|c| c.estimator == Estimator::RecentMode)
            .copied()
    }

    /// The expert each selection rule picks, in [`Selection::ALL`] order.
    fn rule_choices(
        &self,
        candidates: &[ExpertCandidate],
    ) -> [Option<ExpertCandidate>; SELECTIONS] {
        let ranked = self.choose(candidates);
        [
            ranked,
            Self::most_specific(candidates).or(ranked),
            Self::choose_by_hits(candidates),
            self.choose_with_estimator(candidates, Estimator::RecentMode)
                .or(ranked),
        ]
    }

    /// The expert for a job: the pick of the rule in use ([`RuntimePredictor::selection`]),
    /// unless another rule's pick has more support. Each rule votes, with its recent
    /// within-2× hit rate as weight, for every pick its own estimate is within 2× of; the pick
    /// with the most weight wins (ties: the rule in use). When the rules disagree, an
    /// estimate that two rules agree on is more often right than the one estimate of the
    /// rule that has lately been best on average (docs/benchmarks-inference.md §1, issue 16:
    /// +0.4 to +1.0 points of within-2× on all six traces).
    pub fn select(&self, candidates: &[ExpertCandidate]) -> Option<ExpertCandidate> {
        self.vote(&self.rule_choices(candidates))
    }

    fn vote(&self, choices: &[Option<ExpertCandidate>; SELECTIONS]) -> Option<ExpertCandidate> {
        let in_use = choices[self.selection() as usize]?;
        if self
            .selection_hits
            .iter()
            .any(|record| record.scored <= 0.0)
        {
            return Some(in_use);
        }
        let support = |estimate: f64| -> f64 {
            choices
                .iter()
                .zip(&self.selection_hits)
                .filter(|(choice, _)| choice.is_some_and(|c| within_2x(c.estimate, estimate)))
                .map(|(_, record)| record.hits / record.scored)
                .sum()
        };
        let (mut best, mut best_support) = (in_use, support(in_use.estimate));
        for choice in choices.iter().flatten() {
            let candidate_support = support(choice.estimate);
            if candidate_support > best_support {
                (best, best_support) = (*choice, candidate_support);
            }
        }
        Some(best)
    }

    /// The candidate whose feature and estimator, at its feature value's history length, put
    /// the largest share of past estimates within 2× of the outcome (ties: the earlier
    /// feature). Within 2× is a ratio test, which NMAE (dominated by the longest jobs) does
    /// not rank for; the record is per feature *name*, so a value seen once borrows the
    /// record of values of its feature seen once.
    pub fn choose_by_hits(candidates: &[ExpertCandidate]) -> Option<ExpertCandidate> {
        let mut best: Option<ExpertCandidate> = None;
        for candidate in candidates {
            if best.is_none_or(|b| candidate.hit_rate > b.hit_rate) {
                best = Some(*candidate);
            }
        }
        best
    }

    /// The calibrated spread multiplier. A feature value's histogram says how runtimes vary,
    /// but measured on the traces its 10th–90th percentile held only 54–69 % of outcomes
    /// (docs/benchmarks-inference.md §1): predictions are made from few, past observations.
    /// So every distribution's log-spread around its median is multiplied by this factor,
    /// learnt online from jobs that finished: the fraction of outcomes outside the central
    /// `coverage_target` interval they were given at submission is driven to
    /// `1 − coverage_target` (adaptive conformal inference; the long-run miss rate converges
    /// to the target whatever the data, Gibbs & Candès 2021, Prop. 4.1).
    pub fn spread(&self) -> f64 {
        self.spread
    }

    /// The upper tail every prediction gets: `(mass, ratio)` of
    /// [`RuntimeDistribution::with_upper_tail`] with a linearly falling density
    /// ([`UpperTailRecord::tail`]), learnt online from finished jobs — how often their runtime
    /// exceeded the support maximum of the distribution given at submission. An empirical
    /// distribution puts no mass past the longest runtime it has seen; measured on the traces
    /// (docs/benchmarks-inference.md, "The upper tail") outcomes exceed it often enough that a
    /// scheduler which defers a job until "deadline − longest runtime" (3Sigma §4.3) misses
    /// its deadline for most of the 3Sigma misses that a priority scheduler met
    /// (docs/experiments/3sigma/missed-jobs.md).
    pub fn upper_tail(&self) -> (f64, f64) {
        if self.config.upper_tail {
            self.upper_tail.tail()
        } else {
            (0.0, 1.0)
        }
    }

    /// The central `coverage_target` interval of `distribution`.
    fn central_interval(&self, distribution: &RuntimeDistribution) -> (f64, f64) {
        let tail = ((1.0 - self.config.coverage_target) / 2.0).clamp(0.0, 0.5);
        let mut q = [0.0; 2];
        distribution.quantiles_into(&[tail, 1.0 - tail], &mut q);
        (q[0], q[1])
    }

    /// One step of the spread's calibration: `runtime` fell inside or outside the interval
    /// its job was given at submission.
    fn calibrate(&mut self, interval: (f64, f64), runtime: f64) {
        let missed = if runtime < interval.0 || runtime > interval.1 {
            1.0
        } else {
            0.0
        };
        let step = self.config.calibration_rate * (missed - (1.0 - self.config.coverage_target));
        self.spread = (self.spread * step.exp()).clamp(0.05, 50.0);
    }

    pub fn config(&self) -> &PredictorConfig {
        &self.config
    }

    /// Number of feature values with history.
    pub fn feature_values(&self) -> usize {
        self.histories.len()
    }

    /// History of one feature value, if any.
    pub fn history(&self, feature: &Feature) -> Option<&FeatureHistory> {
        self.histories.get(&feature_key(feature))
    }

    /// Total bytes of per-feature-value state (excluding the hash table's own overhead).
    pub fn state_bytes(&self) -> usize {
        self.histories
            .values()
            .map(FeatureHistory::state_bytes)
            .sum()
    }

    /// Upper bound of one feature value's state once its histogram and ring are full.
    pub fn max_state_bytes_per_value(&self) -> usize {
        let recent = self.config.recent_window.clamp(1, MAX_RECENT_WINDOW);
        std::mem::size_of::<FeatureHistory>()
            + (self.config.max_bins.max(2) + 1) * std::mem::size_of::<crate::histogram::Bin>()
            + recent * std::mem::size_of::<f64>()
    }

    /// Every expert available for `features`, in feature order then estimator order.
    pub fn candidates(&self, features: &JobFeatures) -> Vec<ExpertCandidate> {
        self.candidates_and_submitted(features).0
    }

    /// The job's expert candidates and the estimate every expert gives now, from one lookup
    /// of each feature value's history and one evaluation of each estimator.
    fn candidates_and_submitted(
        &self,
        features: &JobFeatures,
    ) -> (Vec<ExpertCandidate>, SubmittedEstimates) {
        let mut candidates = Vec::with_capacity(features.features.len() * ESTIMATORS);
        let mut submitted = Vec::with_capacity(features.features.len());
        let mut observations = Vec::with_capacity(features.features.len());
        for (feature_index, feature) in features.features.iter().enumerate() {
            let Some(history) = self.histories.get(&feature_key(feature)) else {
                submitted.push([None; ESTIMATORS]);
                observations.push(0);
                continue;
            };
            let scale = feature.scale();
            let estimates = history
                .estimates(&self.config)
                .map(|e| e.map(|e| e * scale));
            submitted.push(estimates);
            observations.push(history.count);
            let record = self.feature_records.get(&feature.name);
            let class = history_class(history.count);
            for estimator in Estimator::ALL {
                if let Some(estimate) = estimates[estimator.index()] {
                    let own = history.error(estimator);
                    let feature_nmae = record.and_then(|r| r.errors[estimator.index()].nmae());
                    let hit_rate = record.map_or(0.5, |r| r.hits[estimator.index()][class].rate());
                    candidates.push(ExpertCandidate {
                        feature_index,
                        estimator,
                        estimate,
                        nmae: own.nmae(),
                        scored: own.scored,
                        feature_nmae,
                        hit_rate,
                        score: shrunk_nmae(own, feature_nmae, self.config.prior_weight),
                        observations: history.count,
                    });
                }
            }
        }
        (
            candidates,
            SubmittedEstimates {
                estimates: submitted,
                observations,
                interval: None,
                selections: [None; SELECTIONS],
                support_max: None,
            },
        )
    }

    /// The expert 3σPredict would use (3Sigma §4.1): the lowest NMAE among the job's experts.
    ///
    /// The paper does not say how to rank an expert with little or no track record (a job
    /// name seen once has an estimate but no scored error yet). Ranking raw NMAEs lets a broad
    /// feature (submit hour: many scores, NMAE ≈ 0.9) beat a specific one that has not been
    /// scored yet, and lets one lucky score win. So each expert is ranked by its NMAE shrunk
    /// towards the NMAE of the same estimator over *all values of its feature*,
    /// `(s·NMAE_expert + m·NMAE_feature) / (s + m)` with `s` its scores and `m` =
    /// `prior_weight`: a new value of a feature that is usually predictive (job name) is
    /// trusted like that feature, and its own record takes over as it grows. Ties go to the
    /// earlier feature (callers list specific features first). Without any score anywhere,
    /// the Mean expert of the feature value with the most observations.
    pub fn choose(&self, candidates: &[ExpertCandidate]) -> Option<ExpertCandidate> {
        Self::choose_among(candidates.iter().copied())
    }

    /// Same rule restricted to one estimator: the "single point estimator" baselines.
    pub fn choose_with_estimator(
        &self,
        candidates: &[ExpertCandidate],
        estimator: Estimator,
    ) -> Option<ExpertCandidate> {
        Self::choose_among(
            candidates
                .iter()
                .copied()
                .filter(|candidate| candidate.estimator == estimator),
        )
    }

    fn choose_among(candidates: impl Iterator<Item = ExpertCandidate>) -> Option<ExpertCandidate> {
        let mut best_scored: Option<(f64, ExpertCandidate)> = None;
        let mut best_unscored: Option<ExpertCandidate> = None;
        for candidate in candidates {
            match candidate.score {
                Some(score) => {
                    if best_scored.is_none_or(|(best, _)| score < best) {
                        best_scored = Some((score, candidate));
                    }
                }
                None => {
                    let better = best_unscored.is_none_or(|best| {
                        candidate.observations > best.observations
                            || (candidate.observations == best.observations
                                && candidate.estimator == Estimator::Mean
                                && best.estimator != Estimator::Mean)
                    });
                    if better {
                        best_unscored = Some(candidate);
                    }
                }
            }
        }
        best_scored
            .map(|(_, candidate)| candidate)
            .or(best_unscored)
    }

    /// Runtime distribution for a job from history only (`None` when no feature value of the
    /// job has been seen).
    pub fn predict(&self, features: &JobFeatures) -> Option<RuntimePrediction> {
        let candidates = self.candidates(features);
        let chosen = self.select(&candidates)?;
        self.prediction_from(features, &chosen)
    }

    /// [`RuntimePredictor::predict`] and [`RuntimePredictor::submitted_estimates`] of the same
    /// job at once: each expert's estimate is computed once, not once per call.
    pub fn predict_with_submitted(
        &self,
        features: &JobFeatures,
    ) -> (Option<RuntimePrediction>, SubmittedEstimates) {
        let (candidates, mut submitted) = self.candidates_and_submitted(features);
        let choices = self.rule_choices(&candidates);
        submitted.selections = choices.map(|choice| choice.map(|c| c.estimate));
        let prediction = self
            .vote(&choices)
            .and_then(|chosen| self.prediction_from(features, &chosen));
        submitted.interval = prediction
            .as_ref()
            .map(|p| self.central_interval(&p.distribution));
        submitted.support_max = prediction.as_ref().map(|p| p.body_support_max);
        (prediction, submitted)
    }

    /// Builds the prediction for a chosen candidate of `features`.
    pub fn prediction_from(
        &self,
        features: &JobFeatures,
        chosen: &ExpertCandidate,
    ) -> Option<RuntimePrediction> {
        let feature = features.features.get(chosen.feature_index)?;
        let history = self.histories.get(&feature_key(feature))?;
        // The feature value's histogram gives the shape; its location follows the chosen
        // expert, whose estimate is what the ranking found accurate (the histogram's own median
        // weighs the whole, possibly stale, history alike). Measured in
        // docs/benchmarks-inference.md §1: within-2× of the median up by 0.4–4.6 points.
        let histogram = history.histogram.distribution()?;
        let median = histogram.median();
        // A scaled feature's histogram is of ratios; this maps it to runtimes as well.
        let scale = if median > 0.0 && chosen.estimate > 0.0 {
            chosen.estimate / median
        } else {
            feature.scale()
        };
        let body = histogram.calibrated(scale, self.spread, self.config.spread_floor);
        let body_support_max = body.support_max();
        let (tail_mass, tail_ratio) = self.upper_tail();
        let distribution = body.with_upper_tail(tail_mass, tail_ratio);
        Some(RuntimePrediction {
            distribution,
            body_support_max,
            point_estimate: chosen.estimate,
            expert: Expert {
                feature: feature.name.clone(),
                value: feature.value.clone(),
                estimator: chosen.estimator,
                nmae: chosen.nmae,
                observations: history.count,
            },
        })
    }

    /// Point estimate only (the PointRealEst baseline of 3Sigma §6), from the same experts.
    pub fn point_estimate(&self, features: &JobFeatures) -> Option<f64> {
        self.select(&self.candidates(features))
            .map(|chosen| chosen.estimate)
    }

    /// The estimate every expert of `features` gives now: keep it from submission until the
    /// job finishes and pass it to [`RuntimePredictor::observe_submitted`].
    pub fn submitted_estimates(&self, features: &JobFeatures) -> SubmittedEstimates {
        let histories: Vec<Option<&FeatureHistory>> = features
            .features
            .iter()
            .map(|feature| self.histories.get(&feature_key(feature)))
            .collect();
        SubmittedEstimates {
            estimates: histories
                .iter()
                .zip(&features.features)
                .map(|(h, feature)| {
                    h.map_or([None; ESTIMATORS], |history| {
                        let scale = feature.scale();
                        history
                            .estimates(&self.config)
                            .map(|e| e.map(|e| e * scale))
                    })
                })
                .collect(),
            observations: histories.iter().map(|h| h.map_or(0, |h| h.count)).collect(),
            interval: None,
            selections: [None; SELECTIONS],
            support_max: None,
        }
    }

    /// Learns a finished job's runtime, scoring every expert on the estimate it gives *now*
    /// (use [`RuntimePredictor::observe_submitted`] when the submission-time estimates were
    /// kept). Non-finite or negative runtimes are ignored.
    pub fn observe(&mut self, features: &JobFeatures, runtime: f64) {
        self.observe_inner(features, runtime, None);
    }

    /// Learns a finished job's runtime, scoring every expert on the estimate it gave when the
    /// job was submitted (3Sigma §4.1: experts are ranked by the NMAE "of past estimates").
    ///
    /// This matters for time-local experts: scored at finish time, a rolling average over
    /// "user + submit hour" has just absorbed the job's finished siblings and looks accurate,
    /// although at submission (when the prediction is used) it had not seen them. Experts
    /// that had no estimate at submission are not scored.
    pub fn observe_submitted(
        &mut self,
        features: &JobFeatures,
        runtime: f64,
        submitted: &SubmittedEstimates,
    ) {
        self.observe_inner(features, runtime, Some(submitted));
    }

    fn observe_inner(
        &mut self,
        features: &JobFeatures,
        runtime: f64,
        submitted: Option<&SubmittedEstimates>,
    ) {
        if !runtime.is_finite() || runtime < 0.0 {
            return;
        }
        if let Some(interval) = submitted.and_then(|s| s.interval) {
            self.calibrate(interval, runtime);
        }
        if let Some(support_max) = submitted.and_then(|s| s.support_max)
            && support_max > 0.0
        {
            self.upper_tail.record(support_max, runtime);
        }
        if let Some(submitted) = submitted
            && submitted.selections.iter().all(Option::is_some)
        {
            for (record, estimate) in self.selection_hits.iter_mut().zip(&submitted.selections) {
                let hit = estimate.is_some_and(|e| within_2x(e, runtime));
                record.record(hit, SELECTION_DECAY);
            }
        }
        let config = self.config;
        for (index, feature) in features.features.iter().enumerate() {
            let history = self
                .histories
                .entry(feature_key(feature))
                .or_insert_with(|| FeatureHistory::new(&config));
            let (estimates, observations) = match submitted {
                Some(submitted) => (
                    submitted
                        .estimates
                        .get(index)
                        .copied()
                        .unwrap_or([None; ESTIMATORS]),
                    submitted.observations.get(index).copied().unwrap_or(0),
                ),
                None => {
                    let scale = feature.scale();
                    let estimates = history.estimates(&config).map(|e| e.map(|e| e * scale));
                    (estimates, history.count)
                }
            };
            if estimates.iter().any(Option::is_some) {
                let record = match self.feature_records.get_mut(&feature.name) {
                    Some(record) => record,
                    None => self
                        .feature_records
                        .entry(feature.name.clone())
                        .or_default(),
                };
                let class = history_class(observations.max(1));
                for (estimator, estimate) in estimates.iter().enumerate() {
                    if let Some(estimate) = estimate {
                        record.errors[estimator].record(*estimate, runtime);
                        record.hits[estimator][class]
                            .record(within_2x(*estimate, runtime), FEATURE_HIT_DECAY);
                    }
                }
                history.score(&estimates, runtime);
            }
            history.learn(runtime / feature.scale(), &config);
        }
    }
}

impl SubmittedEstimates {
    /// What each selection rule estimated at submission, in [`Selection::ALL`] order.
    pub fn selections(&self) -> &[Option<f64>; SELECTIONS] {
        &self.selections
    }
}

/// The estimates every expert of one job gave at its submission, per feature in the job's
/// feature order (a few dozen numbers held by the caller while the job runs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubmittedEstimates {
    estimates: Vec<[Option<f64>; ESTIMATORS]>,
    /// Observations behind each feature value at submission (its history-length class).
    #[serde(default)]
    observations: Vec<u64>,
    /// The central interval the job's prediction gave ([`RuntimePredictor::predict_with_submitted`]
    /// sets it): its outcome calibrates the spread.
    #[serde(default)]
    interval: Option<(f64, f64)>,
    /// What each selection rule estimated at submission (their hit rates are kept from these).
    #[serde(default)]
    selections: [Option<f64>; SELECTIONS],
    /// Support maximum of the prediction's distribution before its upper tail: its outcome
    /// calibrates the tail ([`RuntimePredictor::upper_tail`]).
    #[serde(default)]
    support_max: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(user: &str, name: &str) -> JobFeatures {
        JobFeatures::new()
            .with("user", user)
            .with("name", name)
            .with("user+name", format!("{user}/{name}"))
    }

    #[test]
    fn a_cloned_or_reloaded_predictor_keeps_its_ring_of_recent_runtimes() {
        let mut predictor = RuntimePredictor::default();
        let features = job("alice", "etl");
        for runtime in [10.0, 20.0, 30.0] {
            predictor.observe(&features, runtime);
        }
        let json = serde_json::to_string(&predictor).unwrap();
        let mut reloaded: RuntimePredictor = serde_json::from_str(&json).unwrap();
        let mut cloned = predictor.clone();
        // Past the configured window (20): the ring wraps instead of growing or panicking.
        for i in 0..30 {
            cloned.observe(&features, 40.0 + f64::from(i));
            reloaded.observe(&features, 40.0 + f64::from(i));
        }
        let feature = &features.features[0];
        for p in [&cloned, &reloaded] {
            let history = p.history(feature).unwrap();
            assert_eq!(history.recent_len(), 20);
            // The 20 most recent are 50..=69: their median is 59.5.
            let median = history
                .estimate(Estimator::RecentMedian, p.config())
                .unwrap();
            assert_eq!(median, 59.5);
        }
    }

    #[test]
    fn no_history_means_no_prediction() {
        let predictor = RuntimePredictor::default();
        assert!(predictor.predict(&job("a", "x")).is_none());
    }

    #[test]
    fn the_distribution_is_centred_on_the_chosen_experts_estimate() {
        let mut predictor = RuntimePredictor::default();
        // A user whose jobs got ten times longer: the whole-history histogram's median lags,
        // the chosen expert's recent estimate does not.
        for round in 0..30 {
            let runtime = if round < 20 { 10.0 } else { 100.0 };
            predictor.observe(&job("carol", "etl"), runtime);
        }
        let prediction = predictor.predict(&job("carol", "etl")).unwrap();
        assert!(
            (prediction.distribution.median() - prediction.point_estimate).abs()
                < 1e-6 * prediction.point_estimate,
            "median {} vs expert {}",
            prediction.distribution.median(),
            prediction.point_estimate
        );
        let history = predictor
            .history(&Feature {
                name: "user+name".into(),
                value: "carol/etl".into(),
                scale: None,
            })
            .unwrap();
        let raw = history.histogram().distribution().unwrap();
        // The shape is the histogram's, widened by the calibrated spread: relative to the
        // median, the same as the raw histogram widened alike.
        let ratio = |d: &RuntimeDistribution| d.quantile(0.9) / d.median();
        let widened = raw.widened(predictor.spread(), predictor.config().spread_floor);
        assert!((ratio(&prediction.distribution) - ratio(&widened)).abs() < 1e-9);
    }

    /// Uniform numbers in [0, 1) from a seeded 64-bit LCG (Knuth's MMIX constants).
    fn uniform_stream(mut seed: u64) -> impl FnMut() -> f64 {
        move || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn the_spread_is_calibrated_online_to_the_coverage_target() {
        // Each job is the first of its name (no history but the user's, which drifts): the
        // histograms alone miss the target. The calibrated intervals hold ~80 % of outcomes.
        // (Without calibration, `calibration_rate: 0.0`, this stream is covered 94.5 %.)
        let mut predictor = RuntimePredictor::default();
        let mut uniform = uniform_stream(11);
        let (mut inside, mut scored) = (0u32, 0u32);
        for i in 0..6000 {
            let level = 100.0 * (1.0 + (i / 500) as f64); // drifts upwards every 500 jobs
            let runtime = level * (3.0 * (uniform() - 0.5)).exp();
            let features = job("dave", &format!("run-{i}"));
            let (prediction, submitted) = predictor.predict_with_submitted(&features);
            if let (Some(_), Some((lo, hi)), true) = (prediction, submitted.interval, i >= 2000) {
                scored += 1;
                inside += u32::from(lo <= runtime && runtime <= hi);
            }
            predictor.observe_submitted(&features, runtime, &submitted);
        }
        let coverage = f64::from(inside) / f64::from(scored);
        assert!(
            (0.75..=0.85).contains(&coverage),
            "coverage {coverage}, spread {}",
            predictor.spread()
        );
    }

    /// Runtimes that keep growing exceed their history's maximum again and again, which an
    /// empirical distribution gives probability 0. The online upper tail learns how often and
    /// by how much: its mass tracks the share that exceeded, and the predicted 99th percentile
    /// is exceeded about 1 % of the time instead of by every job past the maximum.
    #[test]
    fn the_upper_tail_learns_how_often_outcomes_exceed_the_history() {
        let run = |upper_tail: bool| {
            let mut predictor = RuntimePredictor::new(PredictorConfig {
                upper_tail,
                ..PredictorConfig::default()
            });
            let mut uniform = uniform_stream(5);
            let (mut exceeded, mut above_p99, mut scored) = (0u32, 0u32, 0u32);
            for i in 0..6000 {
                // A drift of 2 % per job, and one job in 10 runs 2–4× its level.
                let level = 100.0 * 1.02f64.powi(i % 600);
                let burst = if uniform() < 0.1 {
                    2.0 + 2.0 * uniform()
                } else {
                    1.0
                };
                let runtime = level * burst * (0.4 * (uniform() - 0.5)).exp();
                let features = job("frank", &format!("batch-{}", i / 600));
                let (prediction, submitted) = predictor.predict_with_submitted(&features);
                if let (Some(prediction), true) = (prediction, i >= 2000) {
                    scored += 1;
                    exceeded += u32::from(runtime > prediction.body_support_max);
                    above_p99 += u32::from(runtime > prediction.distribution.quantile(0.99));
                }
                predictor.observe_submitted(&features, runtime, &submitted);
            }
            let scored = f64::from(scored);
            (
                f64::from(exceeded) / scored,
                f64::from(above_p99) / scored,
                predictor.upper_tail().0,
            )
        };
        let (exceeded_without, above_p99_without, mass_without) = run(false);
        let (exceeded, above_p99, mass) = run(true);
        assert_eq!(mass_without, 0.0, "off, no tail");
        assert!(
            exceeded_without > 0.04,
            "the stream exceeds its history: {exceeded_without}"
        );
        assert!(
            (mass - exceeded).abs() < 0.5 * exceeded,
            "tail mass {mass} against {exceeded} of outcomes past the body's maximum"
        );
        assert!(
            above_p99 < 0.025 && above_p99 < 0.5 * above_p99_without,
            "above the 99th percentile: {above_p99} with the tail, {above_p99_without} without"
        );
    }

    #[test]
    fn the_selection_rule_right_more_often_lately_is_followed() {
        let mut predictor = RuntimePredictor::default();
        let features = job("erin", "etl");
        predictor.observe(&features, 10.0);
        assert_eq!(
            predictor.selection(),
            Selection::Ranked,
            "ranked until every rule has a record"
        );
        let submitted = |ranked: f64, specific: f64| SubmittedEstimates {
            estimates: vec![[None; ESTIMATORS]; 3],
            observations: vec![0; 3],
            interval: None,
            // The learned rule said what the ranked one said.
            selections: [Some(ranked), Some(specific), Some(ranked), Some(ranked)],
            support_max: None,
        };
        // The most-specific lookup said 10, the ranked expert 1000; it took 10.
        for _ in 0..50 {
            predictor.observe_submitted(&features, 10.0, &submitted(1000.0, 10.0));
        }
        assert_eq!(predictor.selection(), Selection::MostSpecific);
        let candidates = predictor.candidates(&features);
        let chosen = predictor.select(&candidates).unwrap();
        assert_eq!(
            (chosen.feature_index, chosen.estimator),
            (0, Estimator::RecentMode),
            "the first feature value with history, its recent mode"
        );
        // The record turns: the ranked rule is followed again.
        for _ in 0..400 {
            predictor.observe_submitted(&features, 10.0, &submitted(10.0, 1000.0));
        }
        assert_eq!(predictor.selection(), Selection::Ranked);
    }

    #[test]
    fn one_pass_prediction_matches_the_separate_calls() {
        let mut predictor = RuntimePredictor::default();
        for round in 0..12 {
            let runtime = 50.0 + f64::from(round * 7 % 5);
            predictor.observe(&job("bob", "sim"), runtime);
        }
        // Known user and name, plus a feature value never seen (no history, no estimates).
        let features = job("bob", "sim").with("queue", "never-seen");
        let (prediction, submitted) = predictor.predict_with_submitted(&features);
        assert_eq!(
            submitted.estimates,
            predictor.submitted_estimates(&features).estimates
        );
        assert!(submitted.interval.is_some(), "the interval given is kept");
        assert_eq!(submitted.estimates.len(), 4);
        assert_eq!(submitted.estimates[3], [None; ESTIMATORS]);
        assert!(submitted.estimates[0].iter().all(Option::is_some));
        let (one_pass, separate) = (prediction.unwrap(), predictor.predict(&features).unwrap());
        assert_eq!(one_pass.point_estimate, separate.point_estimate);
        assert_eq!(one_pass.expert.feature, separate.expert.feature);
        assert_eq!(one_pass.expert.estimator, separate.expert.estimator);
        assert_eq!(
            one_pass.distribution.median(),
            separate.distribution.median()
        );
        let (none, empty) = RuntimePredictor::default().predict_with_submitted(&features);
        assert!(none.is_none());
        assert_eq!(empty.estimates, vec![[None; ESTIMATORS]; 4]);
    }

    #[test]
    fn the_recent_mode_ranks_windows_by_log_distance_from_the_median() {
        // The definition: among the fullest windows, the least |ln(centre / median)|; the code
        // compares max(r, 1/r) instead (no logarithm per window) when every value is positive.
        fn by_logarithm(values: &[f64]) -> f64 {
            let median = sorted_median(values);
            let (mut best_count, mut best_centre, mut best_distance) = (0, median, f64::INFINITY);
            let mut end = 0;
            for start in 0..values.len() {
                end = end.max(start + 1);
                while end < values.len() && values[end] <= 4.0 * values[start] {
                    end += 1;
                }
                let count = end - start;
                let centre = (values[start] * values[end - 1]).sqrt();
                let distance = (centre / median).ln().abs();
                if count > best_count || (count == best_count && distance < best_distance) {
                    (best_count, best_centre, best_distance) = (count, centre, distance);
                }
            }
            best_centre
        }
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..20_000 {
            let len = 1 + (next() % 20) as usize;
            // Runtimes over six orders of magnitude, some repeated, as recent windows hold.
            let mut values: Vec<f64> = (0..len)
                .map(|_| (1 + next() % 1000) as f64 * 10f64.powi((next() % 4) as i32))
                .collect();
            values.sort_unstable_by(f64::total_cmp);
            assert_eq!(
                densest_window_centre(&values),
                by_logarithm(&values),
                "round {round}: {values:?}"
            );
        }
    }

    #[test]
    fn the_recent_mode_is_the_centre_of_the_densest_factor_4_window() {
        // Killed-early runs around 10 s and full runs around 1,000 s: the mode sits in the
        // larger cluster and is within 2× of its five runs.
        let mut values = [9.0, 10.0, 12.0, 900.0, 1000.0, 1100.0, 1200.0, 1300.0];
        values.sort_unstable_by(f64::total_cmp);
        let mode = densest_window_centre(&values);
        assert!((mode - (900.0f64 * 1300.0).sqrt()).abs() < 1e-9, "{mode}");
        let hits = values.iter().filter(|v| within_2x(mode, **v)).count();
        assert_eq!(hits, 5);
        // Two clusters of four: the median (mean of the middle pair, 456) falls between them
        // and is within 2× of one run; the mode takes the cluster nearer the median in ratio
        // and is within 2× of its four.
        let split = [9.0, 10.0, 11.0, 12.0, 900.0, 1000.0, 1100.0, 1200.0];
        let median = sorted_median(&split);
        assert_eq!(split.iter().filter(|v| within_2x(median, **v)).count(), 1);
        let mode = densest_window_centre(&split);
        assert!((mode - (900.0f64 * 1200.0).sqrt()).abs() < 1e-9, "{mode}");
        assert_eq!(split.iter().filter(|v| within_2x(mode, **v)).count(), 4);
        // No cluster (every pair more than 4× apart): the window nearest the median.
        assert_eq!(densest_window_centre(&[1.0, 10.0, 100.0]), 10.0);
        assert_eq!(densest_window_centre(&[7.0]), 7.0);
        // Equally full windows: the one nearer the median (in ratio) wins.
        assert_eq!(
            densest_window_centre(&[1.0, 3.0, 100.0, 300.0, 5000.0]),
            (100.0f64 * 300.0).sqrt()
        );
        // The estimator reads the ring of recent values.
        let config = PredictorConfig::default();
        let mut history = FeatureHistory::new(&config);
        for runtime in [10.0, 1000.0, 1100.0, 12.0, 1200.0] {
            history.observe(runtime, &config);
        }
        let estimate = history.estimate(Estimator::RecentMode, &config).unwrap();
        assert!((estimate - (1000.0f64 * 1200.0).sqrt()).abs() < 1e-9);
        assert_eq!(
            history.estimates(&config)[Estimator::RecentMode.index()],
            Some(estimate)
        );
    }

    #[test]
    fn a_scaled_feature_learns_the_share_of_the_request_a_job_runs() {
        // A user's jobs run about half of what they request, whatever the request.
        let run = |requested: f64| {
            let mut features = JobFeatures::new().with("user", "dana");
            features.push_scaled("user/requested_time", "dana", requested);
            features
        };
        let mut predictor = RuntimePredictor::default();
        let requests = [100.0, 4000.0, 600.0, 20_000.0, 1500.0, 9000.0];
        for (index, requested) in requests.into_iter().cycle().take(30).enumerate() {
            let jitter = 1.0 + 0.02 * (index % 3) as f64;
            predictor.observe(&run(requested), 0.5 * requested * jitter);
        }
        let features = run(50_000.0);
        let candidates = predictor.candidates(&features);
        let median_of = |feature_index: usize| {
            *candidates
                .iter()
                .find(|c| {
                    c.feature_index == feature_index && c.estimator == Estimator::RecentMedian
                })
                .unwrap()
        };
        let scaled = median_of(1);
        assert!(
            (scaled.estimate / 25_000.0 - 1.0).abs() < 0.05,
            "{scaled:?}"
        );
        // The user's runtimes alone say nothing of this request.
        assert!(!within_2x(median_of(0).estimate, 25_000.0));
        // The ranking prefers the scaled feature, and its distribution is of runtimes,
        // centred on the estimate.
        assert_eq!(predictor.choose(&candidates).unwrap().feature_index, 1);
        let prediction = predictor.prediction_from(&features, &scaled).unwrap();
        let median = prediction.distribution.median();
        assert!((median / scaled.estimate - 1.0).abs() < 1e-6, "{median}");
        assert!(prediction.distribution.quantile(0.1) > 0.7 * median);
        assert!(prediction.distribution.quantile(0.9) < 1.4 * median);
        // Its history holds ratios, so the state per value is that of any feature value.
        let ratio = predictor
            .history(&features.features[1])
            .unwrap()
            .estimate(Estimator::Mean, predictor.config())
            .unwrap();
        assert!((ratio - 0.51).abs() < 0.01, "{ratio}");
        // Scales that are not finite and positive, and empty values, are skipped.
        let mut skipped = JobFeatures::new();
        skipped.push_scaled("x", "y", 0.0);
        skipped.push_scaled("x", "y", f64::NAN);
        skipped.push_scaled("x", "", 5.0);
        assert!(skipped.is_empty());
    }

    #[test]
    fn the_ranked_mode_rule_takes_the_recent_mode_of_the_ranked_feature_value() {
        let mut predictor = RuntimePredictor::default();
        for round in 0..20 {
            let jitter = f64::from(round % 3);
            predictor.observe(&job("alice", "short"), 10.0 + jitter);
            predictor.observe(&job("alice", "long"), 1000.0 + jitter);
        }
        let features = job("alice", "long");
        let candidates = predictor.candidates(&features);
        let expected = predictor
            .choose_with_estimator(&candidates, Estimator::RecentMode)
            .unwrap();
        let (_, submitted) = predictor.predict_with_submitted(&features);
        assert_eq!(
            submitted.selections()[Selection::RankedMode as usize],
            Some(expected.estimate)
        );
        // The rule in use when it has been right most often lately.
        predictor.selection_hits = [HitRecord {
            hits: 1.0,
            scored: 10.0,
        }; SELECTIONS];
        predictor.selection_hits[Selection::RankedMode as usize].hits = 9.0;
        assert_eq!(predictor.selection(), Selection::RankedMode);
        let chosen = predictor.select(&candidates).unwrap();
        assert_eq!(chosen.estimator, Estimator::RecentMode);
        assert_ne!(features.features[chosen.feature_index].name, "user");
        assert!((chosen.estimate - 1001.0).abs() < 2.0, "{chosen:?}");
    }

    #[test]
    fn the_rules_vote_with_their_recent_hit_rates() {
        let pick = |feature_index: usize, estimate: f64| ExpertCandidate {
            feature_index,
            estimator: Estimator::RecentMode,
            estimate,
            nmae: None,
            scored: 0,
            feature_nmae: None,
            hit_rate: 0.5,
            score: None,
            observations: 1,
        };
        let mut predictor = RuntimePredictor::default();
        let choices = [
            Some(pick(1, 1000.0)),
            Some(pick(0, 10.0)),
            Some(pick(2, 1500.0)),
            Some(pick(1, 900.0)),
        ];
        // No record yet: the rule in use (ranked), no vote.
        assert_eq!(predictor.vote(&choices).unwrap().estimate, 1000.0);
        let rates = |predictor: &mut RuntimePredictor, rates: [f64; SELECTIONS]| {
            for (record, rate) in predictor.selection_hits.iter_mut().zip(rates) {
                *record = HitRecord {
                    hits: rate * 100.0,
                    scored: 100.0,
                };
            }
        };
        // The most-specific rule is in use (best on average) and says 10; the three others
        // agree on about 1,000: 0.5 + 0.4 + 0.4 of support against 0.55.
        rates(&mut predictor, [0.5, 0.55, 0.4, 0.4]);
        assert_eq!(predictor.selection(), Selection::MostSpecific);
        let chosen = predictor.vote(&choices).unwrap();
        assert_eq!(chosen.feature_index, 1);
        // The pick with the most support among those within 2×: 1,000 has all three (1,500
        // and 900 are within 2× of it), 1,500 and 900 only two each.
        assert_eq!(chosen.estimate, 1000.0);
        // A rule in use that is right far more often than the others keeps its pick.
        rates(&mut predictor, [0.3, 0.95, 0.3, 0.3]);
        assert_eq!(predictor.vote(&choices).unwrap().estimate, 10.0);
        // predict and predict_with_submitted vote alike.
        for round in 0..20 {
            let jitter = f64::from(round % 3);
            predictor.observe(&job("alice", "short"), 10.0 + jitter);
            predictor.observe(&job("alice", "long"), 1000.0 + jitter);
        }
        let features = job("alice", "long");
        let (one_pass, _) = predictor.predict_with_submitted(&features);
        assert_eq!(
            one_pass.unwrap().point_estimate,
            predictor.predict(&features).unwrap().point_estimate
        );
    }

    #[test]
    fn history_classes_double_in_length() {
        let classes: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 1000]
            .into_iter()
            .map(history_class)
            .collect();
        assert_eq!(classes, [0, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    }

    #[test]
    fn the_learned_rule_follows_the_feature_whose_estimates_land_within_2x() {
        // "hour" values are seen often but say little; "name" values are seen once or twice
        // and are right. NMAE ranking prefers the long-scored hour expert at first, the
        // learned rule trusts a name seen once because names seen once were right before.
        let mut predictor = RuntimePredictor::default();
        let run = |name: &str| JobFeatures::new().with("name", name).with("hour", "7");
        for program in 0..200u32 {
            let runtime = [10.0, 1000.0, 100_000.0][program as usize % 3];
            let first = predictor
                .predict_with_submitted(&run(&format!("p{program}")))
                .1;
            predictor.observe_submitted(&run(&format!("p{program}")), runtime, &first);
            let second = predictor
                .predict_with_submitted(&run(&format!("p{program}")))
                .1;
            predictor.observe_submitted(&run(&format!("p{program}")), runtime, &second);
        }
        predictor.observe(&run("fresh"), 5000.0);
        let candidates = predictor.candidates(&run("fresh"));
        let chosen = RuntimePredictor::choose_by_hits(&candidates).unwrap();
        assert_eq!(chosen.feature_index, 0, "the name, seen once");
        assert!((chosen.estimate - 5000.0).abs() < 1e-9);
        let name = candidates.iter().find(|c| c.feature_index == 0).unwrap();
        assert!(name.hit_rate > 0.9, "{}", name.hit_rate);
        for hour in candidates.iter().filter(|c| c.feature_index == 1) {
            // Three runtime levels in turn, each program twice: an hour estimate is right at
            // most every other time.
            assert!(hour.hit_rate < 0.6, "{hour:?}");
        }
    }

    #[test]
    fn hit_records_decay_and_are_smoothed() {
        let mut record = HitRecord::default();
        assert_eq!(record.rate(), 0.5);
        record.record(true, 0.0);
        record.record(false, 0.0);
        record.record(true, 0.0);
        assert_eq!(record.rate(), 3.0 / 5.0);
        let mut decayed = HitRecord::default();
        decayed.record(false, 0.5);
        decayed.record(true, 0.5);
        // The miss weighs half: hits 1, scored 1.5.
        assert_eq!(decayed.rate(), 2.0 / 3.5);
    }

    #[test]
    fn estimators_follow_their_definitions() {
        let config = PredictorConfig {
            recent_window: 4,
            recent_mean_count: 2,
            ..PredictorConfig::default()
        };
        let mut history = FeatureHistory::new(&config);
        for runtime in [10.0, 20.0, 30.0, 100.0, 50.0] {
            history.observe(runtime, &config);
        }
        assert_eq!(history.estimate(Estimator::Mean, &config), Some(42.0));
        // Recent ring holds 20, 30, 100, 50 => median 40.
        assert_eq!(
            history.estimate(Estimator::RecentMedian, &config),
            Some(40.0)
        );
        // Mean of the two most recent: 100 and 50.
        assert_eq!(history.estimate(Estimator::RecentMean, &config), Some(75.0));
        let mut rolling: f64 = 10.0;
        for runtime in [20.0, 30.0, 100.0, 50.0] {
            rolling = 0.6 * runtime + 0.4 * rolling;
        }
        let estimate = history.estimate(Estimator::Rolling, &config).unwrap();
        assert!((estimate - rolling).abs() < 1e-12);
    }

    #[test]
    fn nmae_is_scored_before_learning() {
        let config = PredictorConfig::default();
        let mut history = FeatureHistory::new(&config);
        history.observe(10.0, &config);
        history.observe(30.0, &config);
        // The mean estimator said 10 for the second job: |10 − 30| / 30.
        let nmae = history.error(Estimator::Mean).nmae().unwrap();
        assert!((nmae - 20.0 / 30.0).abs() < 1e-12);
        assert_eq!(history.error(Estimator::Mean).scored, 1);
    }

    #[test]
    fn picks_the_feature_value_whose_expert_has_lowest_error() {
        let mut predictor = RuntimePredictor::default();
        // User "alice" runs two very different jobs; the name predicts runtime, the user not.
        for round in 0..20 {
            let jitter = f64::from(round % 3);
            predictor.observe(&job("alice", "short"), 10.0 + jitter);
            predictor.observe(&job("alice", "long"), 1000.0 + jitter);
        }
        let prediction = predictor.predict(&job("alice", "long")).unwrap();
        assert_ne!(prediction.expert.feature, "user");
        assert!((prediction.distribution.median() - 1001.0).abs() < 5.0);
        assert!((prediction.point_estimate - 1001.0).abs() < 5.0);
        // A new job name of a known user falls back to the user's (bimodal) history.
        let fallback = predictor.predict(&job("alice", "brand-new")).unwrap();
        assert_eq!(fallback.expert.feature, "user");
        assert!(fallback.distribution.quantile(0.1) < 20.0);
        assert!(fallback.distribution.quantile(0.9) > 900.0);
    }

    #[test]
    fn a_new_value_of_a_predictive_feature_is_trusted_like_its_feature() {
        let mut predictor = RuntimePredictor::default();
        let run = |name: &str, hour: &str| JobFeatures::new().with("name", name).with("hour", hour);
        // Twenty recurring programs of very different lengths, all submitted in hour 7: the
        // name predicts runtime, the hour does not.
        for repeat in 0..2 {
            for program in 0..20u32 {
                let runtime = f64::from(10 * (program + 1)) + f64::from(repeat);
                predictor.observe(&run(&format!("p{program}"), "7"), runtime);
            }
        }
        // A new program has run once: its name expert has an estimate but no score yet.
        predictor.observe(&run("fresh", "7"), 5000.0);
        let prediction = predictor.predict(&run("fresh", "7")).unwrap();
        assert_eq!(prediction.expert.feature, "name");
        assert_eq!(prediction.expert.observations, 1);
        assert!((prediction.point_estimate - 5000.0).abs() < 1e-9);
        // With no prior weight an expert is ranked by its own record alone.
        let mut raw = RuntimePredictor::new(PredictorConfig {
            prior_weight: 0.0,
            ..PredictorConfig::default()
        });
        for repeat in 0..2 {
            for program in 0..20u32 {
                let runtime = f64::from(10 * (program + 1)) + f64::from(repeat);
                raw.observe(&run(&format!("p{program}"), "7"), runtime);
            }
        }
        raw.observe(&run("fresh", "7"), 5000.0);
        raw.observe(&run("fresh", "7"), 50.0);
        let candidates = raw.candidates(&run("fresh", "7"));
        let fresh = candidates
            .iter()
            .find(|c| c.feature_index == 0 && c.estimator == Estimator::Mean)
            .unwrap();
        assert_eq!(fresh.scored, 1);
        assert_eq!(fresh.score, fresh.nmae);
    }

    #[test]
    fn experts_are_scored_on_what_they_estimated_at_submission() {
        let mut predictor = RuntimePredictor::default();
        let hour = JobFeatures::new().with("hour", "3");
        predictor.observe(&hour, 10.0);
        // Four jobs are submitted together while the hour's history says 10; they all run
        // 1000. Scored at finish, the later ones would look well predicted (the history has
        // absorbed their siblings); scored at submission, every one was off by 990.
        let at_submission = predictor.submitted_estimates(&hour);
        for _ in 0..4 {
            predictor.observe_submitted(&hour, 1000.0, &at_submission);
        }
        for candidate in predictor.candidates(&hour) {
            assert_eq!(candidate.scored, 4);
            let nmae = candidate.nmae.unwrap();
            assert!((nmae - 0.99).abs() < 1e-12, "{candidate:?}");
        }
        // A feature value first seen after submission had no estimate then: learnt, not scored.
        let named = JobFeatures::new().with("hour", "4").with("name", "late");
        let before = predictor.submitted_estimates(&named);
        predictor.observe(&JobFeatures::new().with("name", "late"), 20.0);
        predictor.observe_submitted(&named, 30.0, &before);
        let late = predictor
            .candidates(&JobFeatures::new().with("name", "late"))
            .into_iter()
            .find(|c| c.estimator == Estimator::Mean)
            .unwrap();
        assert_eq!(late.observations, 2);
        assert_eq!(late.scored, 0);

        // The finish-time rule scores the same jobs against an estimate that has already
        // moved towards them.
        let mut finish_time = RuntimePredictor::default();
        finish_time.observe(&hour, 10.0);
        for _ in 0..4 {
            finish_time.observe(&hour, 1000.0);
        }
        let mean = finish_time
            .candidates(&hour)
            .into_iter()
            .find(|c| c.estimator == Estimator::Mean)
            .unwrap();
        assert!(mean.nmae.unwrap() < 0.6);
    }

    #[test]
    fn memory_per_feature_value_is_bounded() {
        let mut predictor = RuntimePredictor::default();
        let features = job("u", "n");
        predictor.observe(&features, 1.0);
        let after_one = predictor.state_bytes();
        for runtime in 0..100_000 {
            predictor.observe(&features, f64::from(runtime));
        }
        assert_eq!(predictor.state_bytes(), after_one);
        assert!(after_one <= 3 * predictor.max_state_bytes_per_value());
        assert_eq!(predictor.feature_values(), 3);
    }

    #[test]
    fn ignores_invalid_runtimes() {
        let mut predictor = RuntimePredictor::default();
        predictor.observe(&job("u", "n"), f64::NAN);
        predictor.observe(&job("u", "n"), -5.0);
        assert_eq!(predictor.feature_values(), 0);
    }

    #[test]
    fn single_estimator_baseline_uses_only_that_estimator() {
        let mut predictor = RuntimePredictor::default();
        for runtime in [10.0, 10.0, 10.0, 200.0] {
            predictor.observe(&job("u", "n"), runtime);
        }
        let candidates = predictor.candidates(&job("u", "n"));
        let chosen = predictor
            .choose_with_estimator(&candidates, Estimator::Rolling)
            .unwrap();
        assert_eq!(chosen.estimator, Estimator::Rolling);
        assert!((chosen.estimate - (0.6 * 200.0 + 0.4 * 10.0)).abs() < 1e-9);
    }
}

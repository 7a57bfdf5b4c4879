//! Ben-Haim & Tom-Tov streaming histogram ("A Streaming Parallel Decision Tree Algorithm",
//! JMLR 2010, Algorithm 1 "update" and the trapezoid "sum"/"uniform" procedures).
//!
//! 3Sigma §4.1 stores the empirical runtime distribution of every feature value in such a
//! histogram with at most 80 bins of varying width, so that memory per feature value is constant
//! while heavy-tailed and multi-modal shapes are kept.

use serde::{Deserialize, Serialize};

use crate::distribution::RuntimeDistribution;

/// Default bin budget from 3Sigma §4.1.
pub const DEFAULT_MAX_BINS: usize = 80;

/// One histogram bin: a centroid and the number of points merged into it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bin {
    pub centroid: f64,
    pub count: f64,
}

/// Streaming histogram with a bounded number of bins.
///
/// Besides the bins it keeps the exact minimum and maximum seen, which anchor the trapezoid
/// interpolation at both ends and give the "largest observation" that under-estimate handling
/// (3Sigma §4.2.1) needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamingHistogram {
    max_bins: usize,
    bins: Vec<Bin>,
    total: f64,
    min: f64,
    max: f64,
}

impl Default for StreamingHistogram {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_BINS)
    }
}

impl StreamingHistogram {
    /// A histogram that never holds more than `max_bins` bins (at least 2).
    pub fn new(max_bins: usize) -> Self {
        Self {
            max_bins: max_bins.max(2),
            bins: Vec::new(),
            total: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    pub fn max_bins(&self) -> usize {
        self.max_bins
    }

    pub fn bins(&self) -> &[Bin] {
        &self.bins
    }

    /// Number of points inserted.
    pub fn count(&self) -> f64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.bins.is_empty()
    }

    /// Smallest value inserted (`None` when empty).
    pub fn min(&self) -> Option<f64> {
        (!self.is_empty()).then_some(self.min)
    }

    /// Largest value inserted (`None` when empty).
    pub fn max(&self) -> Option<f64> {
        (!self.is_empty()).then_some(self.max)
    }

    /// Bytes of memory this histogram owns (struct plus bin storage), for the constant-memory
    /// claim of 3Sigma §4.1.
    pub fn state_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.bins.capacity() * std::mem::size_of::<Bin>()
    }

    /// Inserts one observation. Non-finite values are ignored (they carry no runtime information
    /// and would poison every later quantile).
    pub fn insert(&mut self, value: f64) {
        self.insert_weighted(value, 1.0);
    }

    /// Inserts `value` with weight `count` (used for merging).
    pub fn insert_weighted(&mut self, value: f64, count: f64) {
        if !value.is_finite() || count.is_nan() || count <= 0.0 {
            return;
        }
        if self.bins.capacity() == 0 {
            // Reserve the whole budget once so the footprint is constant from then on.
            self.bins.reserve_exact(self.max_bins + 1);
        }
        self.total += count;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        let position = self.bins.partition_point(|bin| bin.centroid < value);
        if let Some(bin) = self.bins.get_mut(position)
            && bin.centroid == value
        {
            bin.count += count;
            return;
        }
        self.bins.insert(
            position,
            Bin {
                centroid: value,
                count,
            },
        );
        if self.bins.len() > self.max_bins {
            self.merge_closest_pair();
        }
    }

    /// Merges another histogram into this one (Ben-Haim & Tom-Tov Algorithm 2).
    pub fn merge(&mut self, other: &StreamingHistogram) {
        for bin in &other.bins {
            self.insert_weighted(bin.centroid, bin.count);
        }
        if let (Some(lo), Some(hi)) = (other.min(), other.max()) {
            self.min = self.min.min(lo);
            self.max = self.max.max(hi);
        }
    }

    fn merge_closest_pair(&mut self) {
        let mut best = 0;
        let mut best_gap = f64::INFINITY;
        for index in 0..self.bins.len() - 1 {
            let gap = self.bins[index + 1].centroid - self.bins[index].centroid;
            if gap < best_gap {
                best_gap = gap;
                best = index;
            }
        }
        let right = self.bins.remove(best + 1);
        let left = &mut self.bins[best];
        let count = left.count + right.count;
        left.centroid = (left.centroid * left.count + right.centroid * right.count) / count;
        left.count = count;
    }

    /// The piecewise-linear density this histogram describes, normalised to mass 1
    /// (`None` when empty).
    pub fn distribution(&self) -> Option<RuntimeDistribution> {
        RuntimeDistribution::from_histogram(self)
    }

    /// Estimated number of points ≤ `value` (the trapezoid "sum" procedure).
    pub fn sum_below(&self, value: f64) -> f64 {
        match self.distribution() {
            Some(distribution) => distribution.cdf(value) * self.total,
            None => 0.0,
        }
    }

    /// Estimated `q`-quantile (`None` when empty).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        self.distribution()
            .map(|distribution| distribution.quantile(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn never_exceeds_bin_budget_and_keeps_count() {
        let mut histogram = StreamingHistogram::new(80);
        for value in 0..10_000 {
            histogram.insert(f64::from(value % 997) * 1.5);
        }
        assert!(histogram.bins().len() <= 80);
        assert_eq!(histogram.count(), 10_000.0);
        let summed: f64 = histogram.bins().iter().map(|bin| bin.count).sum();
        assert!((summed - 10_000.0).abs() < 1e-9);
        assert_eq!(histogram.min(), Some(0.0));
        assert_eq!(histogram.max(), Some(996.0 * 1.5));
        // Bins stay sorted by centroid.
        assert!(
            histogram
                .bins()
                .windows(2)
                .all(|pair| pair[0].centroid < pair[1].centroid)
        );
    }

    #[test]
    fn footprint_is_constant_after_first_insert() {
        let mut histogram = StreamingHistogram::new(80);
        histogram.insert(1.0);
        let bytes = histogram.state_bytes();
        for value in 0..50_000 {
            histogram.insert(f64::from(value));
        }
        assert_eq!(histogram.state_bytes(), bytes);
    }

    #[test]
    fn quantiles_of_uniform_stream_are_within_one_percent() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut histogram = StreamingHistogram::new(80);
        for _ in 0..100_000 {
            histogram.insert(rng.random::<f64>() * 1000.0);
        }
        for q in [0.1, 0.25, 0.5, 0.75, 0.9, 0.99] {
            let estimate = histogram.quantile(q).unwrap();
            assert!(
                (estimate - q * 1000.0).abs() < 10.0,
                "q={q} estimate={estimate}"
            );
        }
    }

    #[test]
    fn quantiles_of_heavy_tailed_stream_have_small_rank_error() {
        // Exponential runtimes (mean 100): compare rank error against the exact sample quantile.
        let mut rng = StdRng::seed_from_u64(11);
        let mut histogram = StreamingHistogram::new(80);
        let mut values = Vec::new();
        for _ in 0..50_000 {
            let value = -100.0 * (1.0 - rng.random::<f64>()).ln();
            histogram.insert(value);
            values.push(value);
        }
        values.sort_by(f64::total_cmp);
        for q in [0.1, 0.5, 0.9, 0.99] {
            let estimate = histogram.quantile(q).unwrap();
            let rank = values.partition_point(|v| *v <= estimate) as f64 / values.len() as f64;
            assert!((rank - q).abs() < 0.01, "q={q} rank={rank}");
        }
    }

    #[test]
    fn ignores_non_finite_values() {
        let mut histogram = StreamingHistogram::new(10);
        histogram.insert(f64::NAN);
        histogram.insert(f64::INFINITY);
        assert!(histogram.is_empty());
        histogram.insert(3.0);
        assert_eq!(histogram.count(), 1.0);
    }

    #[test]
    fn merge_combines_counts_and_range() {
        let mut left = StreamingHistogram::new(20);
        let mut right = StreamingHistogram::new(20);
        for value in 0..100 {
            left.insert(f64::from(value));
            right.insert(f64::from(value + 100));
        }
        left.merge(&right);
        assert_eq!(left.count(), 200.0);
        assert_eq!(left.max(), Some(199.0));
        let median = left.quantile(0.5).unwrap();
        assert!((median - 100.0).abs() < 5.0, "{median}");
    }
}

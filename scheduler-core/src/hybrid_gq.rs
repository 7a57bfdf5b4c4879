//! The hybrid-GQ application policy of Mercury §5: QUEUEABLE for tasks expected to be shorter
//! than `td`, in `pq` of the cases; GUARANTEED otherwise. only-G is (td = ∞, pq = 0) and only-Q
//! is (td = ∞, pq = 100%).

use crate::ContainerType;
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// hybrid-GQ(td, pq).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HybridGq {
    /// Task duration threshold in ms; `None` is ∞.
    pub td_ms: Option<u64>,
    /// Fraction in [0, 1] of eligible tasks that ask for QUEUEABLE.
    pub pq: f64,
}

impl HybridGq {
    pub const ONLY_G: HybridGq = HybridGq {
        td_ms: None,
        pq: 0.0,
    };
    pub const ONLY_Q: HybridGq = HybridGq {
        td_ms: None,
        pq: 1.0,
    };

    pub fn new(td_ms: Option<u64>, pq: f64) -> Result<HybridGq, String> {
        if !(0.0..=1.0).contains(&pq) || pq.is_nan() {
            return Err(format!("pq must be a fraction in [0, 1], got {pq}"));
        }
        Ok(HybridGq { td_ms, pq })
    }

    /// The container type for a task with the given runtime estimate. A task without an
    /// estimate is treated as long (only eligible when td is ∞).
    pub fn choose<R: Rng + ?Sized>(
        &self,
        runtime_estimate_ms: Option<u64>,
        rng: &mut R,
    ) -> ContainerType {
        let short = match (self.td_ms, runtime_estimate_ms) {
            (None, _) => true,
            (Some(td), Some(est)) => est < td,
            (Some(_), None) => false,
        };
        let queueable =
            short && (self.pq >= 1.0 || (self.pq > 0.0 && rng.random_range(0.0..1.0) < self.pq));
        if queueable {
            ContainerType::Queueable
        } else {
            ContainerType::Guaranteed
        }
    }

    /// The paper's name of this configuration.
    pub fn label(&self) -> String {
        let percent = (self.pq * 100.0).round();
        match self.td_ms {
            None if self.pq <= 0.0 => "only-G".into(),
            None if self.pq >= 1.0 => "only-Q".into(),
            None => format!("{percent}%-Q"),
            Some(td) if self.pq >= 1.0 => format!("<{}sec-Q", td / 1000),
            Some(td) => format!("<{}sec-{percent}%-Q", td / 1000),
        }
    }
}

impl FromStr for HybridGq {
    type Err = String;

    /// Accepts `only-G`, `only-Q`, `50%-Q`, `<5sec-Q`, `<10sec-70%-Q` (the paper's names, case
    /// insensitive) and `hybrid:td_ms=10000,pq=0.7` (td_ms may be `inf`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let bad = || {
            format!(
                "unknown application policy {s:?}: expected only-G, only-Q, N%-Q, <Nsec-Q, <Nsec-N%-Q or hybrid:td_ms=N|inf,pq=F"
            )
        };
        match lower.as_str() {
            "only-g" => return Ok(HybridGq::ONLY_G),
            "only-q" => return Ok(HybridGq::ONLY_Q),
            _ => {}
        }
        if let Some(rest) = lower.strip_prefix("hybrid:") {
            let (mut td, mut pq) = (None, None);
            for part in rest.split(',') {
                let (k, v) = part.split_once('=').ok_or_else(bad)?;
                match k.trim() {
                    "td_ms" if v.trim() == "inf" => td = Some(None),
                    "td_ms" => td = Some(Some(v.trim().parse::<u64>().map_err(|_| bad())?)),
                    "pq" => pq = Some(v.trim().parse::<f64>().map_err(|_| bad())?),
                    _ => return Err(bad()),
                }
            }
            return HybridGq::new(td.ok_or_else(bad)?, pq.ok_or_else(bad)?);
        }
        let rest = lower.strip_suffix("-q").ok_or_else(bad)?;
        let percent = |p: &str| -> Result<f64, String> {
            let v: f64 = p
                .strip_suffix('%')
                .ok_or_else(bad)?
                .parse()
                .map_err(|_| bad())?;
            Ok(v / 100.0)
        };
        if let Some(rest) = rest.strip_prefix('<') {
            let (secs, pq) = match rest.split_once("sec") {
                Some((secs, "")) => (secs, 1.0),
                Some((secs, tail)) => (secs, percent(tail.strip_prefix('-').ok_or_else(bad)?)?),
                None => return Err(bad()),
            };
            let secs: u64 = secs.parse().map_err(|_| bad())?;
            return HybridGq::new(Some(secs * 1000), pq);
        }
        HybridGq::new(None, percent(rest)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn paper_names_parse() {
        assert_eq!("only-G".parse::<HybridGq>().unwrap(), HybridGq::ONLY_G);
        assert_eq!("only-Q".parse::<HybridGq>().unwrap(), HybridGq::ONLY_Q);
        assert_eq!(
            "50%-Q".parse::<HybridGq>().unwrap(),
            HybridGq {
                td_ms: None,
                pq: 0.5
            }
        );
        assert_eq!(
            "<5sec-Q".parse::<HybridGq>().unwrap(),
            HybridGq {
                td_ms: Some(5000),
                pq: 1.0
            }
        );
        assert_eq!(
            "<10sec-70%-Q".parse::<HybridGq>().unwrap(),
            HybridGq {
                td_ms: Some(10_000),
                pq: 0.7
            }
        );
        assert_eq!(
            "hybrid:td_ms=inf,pq=0.25".parse::<HybridGq>().unwrap(),
            HybridGq {
                td_ms: None,
                pq: 0.25
            }
        );
        assert!("<10sec-170%-Q".parse::<HybridGq>().is_err());
        assert!("whatever".parse::<HybridGq>().is_err());
        assert_eq!(
            "<10sec-70%-Q".parse::<HybridGq>().unwrap().label(),
            "<10sec-70%-Q"
        );
    }

    #[test]
    fn fractions_follow_pq_and_td() {
        let mut rng = StdRng::seed_from_u64(1);
        let p: HybridGq = "<10sec-70%-Q".parse().unwrap();
        let n = 20_000;
        let q = (0..n)
            .filter(|_| p.choose(Some(2000), &mut rng) == ContainerType::Queueable)
            .count();
        let frac = q as f64 / n as f64;
        assert!((frac - 0.7).abs() < 0.02, "{frac}");
        assert_eq!(p.choose(Some(50_000), &mut rng), ContainerType::Guaranteed);
        assert_eq!(p.choose(None, &mut rng), ContainerType::Guaranteed);
        assert_eq!(
            HybridGq::ONLY_Q.choose(None, &mut rng),
            ContainerType::Queueable
        );
        assert_eq!(
            HybridGq::ONLY_G.choose(Some(1), &mut rng),
            ContainerType::Guaranteed
        );
    }
}

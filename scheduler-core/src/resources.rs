//! Multi-dimensional resource vectors (CPU and memory), the unit every policy reasons in.

use serde::{Deserialize, Serialize};

/// CPU in millicores (1000 = one core) and memory in MiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_mib: u64,
}

impl Resources {
    pub const ZERO: Resources = Resources {
        cpu_millis: 0,
        memory_mib: 0,
    };

    pub const fn new(cpu_millis: u64, memory_mib: u64) -> Resources {
        Resources {
            cpu_millis,
            memory_mib,
        }
    }

    pub fn is_zero(&self) -> bool {
        self.cpu_millis == 0 && self.memory_mib == 0
    }

    /// True when every dimension of `self` is at most that of `other`.
    pub fn fits_in(&self, other: &Resources) -> bool {
        self.cpu_millis <= other.cpu_millis && self.memory_mib <= other.memory_mib
    }

    pub fn saturating_add(&self, other: &Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_mib: self.memory_mib.saturating_add(other.memory_mib),
        }
    }

    pub fn saturating_sub(&self, other: &Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
            memory_mib: self.memory_mib.saturating_sub(other.memory_mib),
        }
    }

    /// Component-wise minimum.
    pub fn min(&self, other: &Resources) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.min(other.cpu_millis),
            memory_mib: self.memory_mib.min(other.memory_mib),
        }
    }

    pub fn scale(&self, factor: u64) -> Resources {
        Resources {
            cpu_millis: self.cpu_millis.saturating_mul(factor),
            memory_mib: self.memory_mib.saturating_mul(factor),
        }
    }

    /// The largest share of `capacity` this vector takes in any dimension (DRF's dominant share),
    /// clamped to [0, 1]. A zero-capacity dimension counts as fully taken if anything asks for it.
    pub fn dominant_share(&self, capacity: &Resources) -> f64 {
        fn share(part: u64, whole: u64) -> f64 {
            if whole == 0 {
                if part == 0 { 0.0 } else { 1.0 }
            } else {
                part as f64 / whole as f64
            }
        }
        share(self.cpu_millis, capacity.cpu_millis)
            .max(share(self.memory_mib, capacity.memory_mib))
            .min(1.0)
    }
}

impl std::fmt::Display for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{cpu_millis: {}, memory_mib: {}}}",
            self.cpu_millis, self.memory_mib
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_and_arithmetic() {
        let cap = Resources::new(4000, 8192);
        let a = Resources::new(1000, 2048);
        assert!(a.fits_in(&cap));
        assert!(!Resources::new(5000, 1).fits_in(&cap));
        assert_eq!(cap.saturating_sub(&a), Resources::new(3000, 6144));
        assert_eq!(a.saturating_sub(&cap), Resources::ZERO);
        assert_eq!(a.saturating_add(&a), Resources::new(2000, 4096));
        assert!((a.dominant_share(&cap) - 0.25).abs() < 1e-12);
        assert_eq!(Resources::new(1, 0).dominant_share(&Resources::ZERO), 1.0);
    }
}

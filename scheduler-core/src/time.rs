//! Time as the core sees it: a point on a caller-supplied clock.
//!
//! The real actors pass wall-clock time (microseconds since the Unix epoch); the simulator passes
//! its virtual clock. The core never reads a clock itself.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Microseconds since the clock's epoch.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Time(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);

    pub const fn from_micros(us: u64) -> Time {
        Time(us)
    }

    pub const fn from_millis(ms: u64) -> Time {
        Time(ms.saturating_mul(1000))
    }

    pub const fn from_secs(s: u64) -> Time {
        Time(s.saturating_mul(1_000_000))
    }

    pub const fn as_micros(self) -> u64 {
        self.0
    }

    pub const fn as_millis(self) -> u64 {
        self.0 / 1000
    }

    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }

    pub fn saturating_add(self, d: Duration) -> Time {
        Time(
            self.0
                .saturating_add(d.as_micros().min(u64::MAX as u128) as u64),
        )
    }
}

impl std::ops::Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        self.saturating_add(d)
    }
}

impl std::fmt::Display for Time {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:06}s", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

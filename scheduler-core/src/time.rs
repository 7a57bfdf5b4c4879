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

/// How far in the past an app may date its job's submission (24 h). Node queues are ordered by
/// job submit time (Mercury §4.3); without a floor an app could claim 0 and jump every queue.
pub const MAX_JOB_SUBMIT_AGE_MS: u64 = 24 * 60 * 60 * 1000;

/// The job submit time the cluster uses for an ask: the app's claim clamped to
/// `[now - MAX_JOB_SUBMIT_AGE_MS, now]`, so neither a future time nor an ancient one lets an app
/// overtake work submitted honestly.
pub fn clamp_job_submit_time_ms(claimed_ms: u64, now_ms: u64) -> u64 {
    claimed_ms.clamp(now_ms.saturating_sub(MAX_JOB_SUBMIT_AGE_MS), now_ms)
}

#[cfg(test)]
mod job_submit_time_tests {
    use super::*;

    #[test]
    fn claims_are_clamped_to_the_last_day() {
        let now = 10 * MAX_JOB_SUBMIT_AGE_MS;
        assert_eq!(
            clamp_job_submit_time_ms(0, now),
            now - MAX_JOB_SUBMIT_AGE_MS
        );
        assert_eq!(clamp_job_submit_time_ms(u64::MAX, now), now);
        assert_eq!(clamp_job_submit_time_ms(now - 5, now), now - 5);
        // Early in a clock's life the floor is its epoch.
        assert_eq!(clamp_job_submit_time_ms(0, 1_000), 0);
    }
}

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

/// The time source of the actors. The core takes `now` from its callers; the actors take it from
/// a `Clock`: the wall clock in production (read by a function the binary provides: this crate
/// never reads the OS clock itself), or a clock that moves only when told (tests, so node
/// timeouts, token expiries and key rotations are exercised without sleeping).
#[derive(Clone, Debug)]
pub enum Clock {
    /// The caller's wall clock (µs since the Unix epoch).
    Wall(fn() -> Time),
    /// A clock that moves only when told to.
    Manual(std::sync::Arc<std::sync::atomic::AtomicU64>),
}

impl Clock {
    /// A manual clock starting at `start`.
    pub fn manual(start: Time) -> Clock {
        Clock::Manual(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(
            start.as_micros(),
        )))
    }

    pub fn now(&self) -> Time {
        match self {
            Clock::Wall(read) => read(),
            Clock::Manual(t) => Time::from_micros(t.load(std::sync::atomic::Ordering::SeqCst)),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.now().as_millis()
    }

    /// Move a manual clock forward; no effect on a wall clock.
    pub fn advance(&self, by: std::time::Duration) {
        if let Clock::Manual(t) = self {
            t.fetch_add(
                by.as_micros().min(u64::MAX as u128) as u64,
                std::sync::atomic::Ordering::SeqCst,
            );
        }
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_a_wall_clock_reads_its_function() {
        let c = Clock::manual(Time::from_millis(5));
        let shared = c.clone();
        assert_eq!(c.now_ms(), 5);
        shared.advance(std::time::Duration::from_millis(10));
        assert_eq!(c.now_ms(), 15, "clones share the time");
        let wall = Clock::Wall(|| Time::from_secs(42));
        wall.advance(std::time::Duration::from_secs(1));
        assert_eq!(wall.now(), Time::from_secs(42));
    }
}

//! How a worker decides its coordinator is gone (sans-IO: the caller passes `now`).
//!
//! The coordinator answers every heartbeat, so silence for a few heartbeat intervals means it is
//! dead, paused or cut off. Waiting for the QUIC idle timeout instead would leave GUARANTEED asks
//! hanging and the re-join late; declaring the link dead early lets the worker answer them with the
//! retryable `coordinator_unavailable` and start re-joining (issue 11).

use crate::time::Time;
use std::time::Duration;

/// Default number of heartbeat intervals without any frame from the coordinator before the link
/// is declared dead.
pub const DEFAULT_LINK_TIMEOUT_HEARTBEATS: u32 = 3;

/// Floor of the link timeout: with very short heartbeat intervals (tests, simulations) a busy
/// machine's scheduling noise alone must not end a healthy session.
pub const MIN_LINK_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a join may take before the worker gives up on that attempt and retries.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Re-join backoff: first retry after `REJOIN_BACKOFF_START`, doubling to `REJOIN_BACKOFF_MAX`;
/// back to the start after a session that joined.
pub const REJOIN_BACKOFF_START: Duration = Duration::from_millis(100);
pub const REJOIN_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Liveness of one session with the coordinator.
#[derive(Debug, Clone)]
pub struct LinkLiveness {
    started: Time,
    last_heard: Option<Time>,
    timeout: Duration,
}

/// Why the link is considered dead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkDead {
    #[error("no join answer from the coordinator within {0:?}")]
    JoinTimedOut(Duration),
    #[error("nothing heard from the coordinator for {silent:?} (limit {limit:?})")]
    Silent { silent: Duration, limit: Duration },
}

impl LinkLiveness {
    /// A session that sent its join at `now`.
    pub fn joining(now: Time) -> LinkLiveness {
        LinkLiveness {
            started: now,
            last_heard: None,
            timeout: JOIN_TIMEOUT,
        }
    }

    /// The join was accepted at `now`: from here on silence is measured against
    /// `heartbeats × heartbeat_interval` (at least [`MIN_LINK_TIMEOUT`]).
    pub fn joined(&mut self, now: Time, heartbeat_interval: Duration, heartbeats: u32) {
        self.last_heard = Some(now);
        self.timeout = heartbeat_interval
            .saturating_mul(heartbeats.max(1))
            .max(MIN_LINK_TIMEOUT);
    }

    /// Any frame from the coordinator arrived at `now`.
    pub fn heard(&mut self, now: Time) {
        if self.last_heard.is_some() {
            self.last_heard = Some(now);
        }
    }

    /// The silence limit in force.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `Err` once the session should be given up at `now`.
    pub fn check(&self, now: Time) -> Result<(), LinkDead> {
        match self.last_heard {
            None if now.saturating_since(self.started) > self.timeout => {
                Err(LinkDead::JoinTimedOut(self.timeout))
            }
            None => Ok(()),
            Some(heard) => {
                let silent = now.saturating_since(heard);
                if silent > self.timeout {
                    Err(LinkDead::Silent {
                        silent,
                        limit: self.timeout,
                    })
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// The next re-join delay after one of `previous`; `joined` says whether the session that just
/// ended had joined (then the worker retries quickly: the coordinator was reachable a moment ago).
pub fn next_rejoin_backoff(previous: Duration, joined: bool) -> Duration {
    if joined {
        REJOIN_BACKOFF_START
    } else {
        previous
            .saturating_mul(2)
            .clamp(REJOIN_BACKOFF_START, REJOIN_BACKOFF_MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Time {
        Time::from_millis(v)
    }

    #[test]
    fn a_join_without_answer_times_out() {
        let l = LinkLiveness::joining(ms(0));
        assert!(l.check(ms(5_000)).is_ok());
        assert_eq!(
            l.check(ms(5_001)),
            Err(LinkDead::JoinTimedOut(JOIN_TIMEOUT))
        );
    }

    #[test]
    fn silence_for_three_heartbeats_ends_the_session() {
        let mut l = LinkLiveness::joining(ms(0));
        l.joined(
            ms(100),
            Duration::from_millis(500),
            DEFAULT_LINK_TIMEOUT_HEARTBEATS,
        );
        assert_eq!(l.timeout(), Duration::from_millis(1_500));
        l.heard(ms(1_000));
        assert!(l.check(ms(2_500)).is_ok());
        assert!(matches!(l.check(ms(2_501)), Err(LinkDead::Silent { .. })));
        // Hearing anything resets the clock.
        l.heard(ms(2_400));
        assert!(l.check(ms(3_800)).is_ok());
    }

    #[test]
    fn short_heartbeats_get_the_floor() {
        let mut l = LinkLiveness::joining(ms(0));
        l.joined(ms(0), Duration::from_millis(10), 3);
        assert_eq!(l.timeout(), MIN_LINK_TIMEOUT);
        assert!(l.check(ms(1_000)).is_ok());
        assert!(l.check(ms(1_001)).is_err());
    }

    #[test]
    fn frames_before_the_join_do_not_start_the_silence_clock() {
        let mut l = LinkLiveness::joining(ms(0));
        l.heard(ms(4_000));
        assert!(matches!(l.check(ms(5_001)), Err(LinkDead::JoinTimedOut(_))));
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets_after_a_joined_session() {
        let mut b = REJOIN_BACKOFF_START;
        let mut seen = vec![];
        for _ in 0..7 {
            b = next_rejoin_backoff(b, false);
            seen.push(b.as_millis());
        }
        assert_eq!(seen, [200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(next_rejoin_backoff(b, true), REJOIN_BACKOFF_START);
    }
}

//! How a worker decides its coordinator is gone (sans-IO: the caller passes `now`).
//!
//! The coordinator answers every heartbeat, so silence for a few heartbeat intervals means it is
//! dead, paused, cut off or overloaded. Two limits (issue 11, issue 17):
//! - after [`DEFAULT_LINK_TIMEOUT_HEARTBEATS`] silent intervals the coordinator is taken as
//!   *unresponsive*: the worker answers GUARANTEED asks with the retryable
//!   `coordinator_unavailable` instead of leaving them hanging, but keeps the session, and keeps
//!   heartbeating on it;
//! - the session is given up (and the worker re-joins) only after
//!   [`DEFAULT_LINK_GIVE_UP_HEARTBEATS`] silent intervals, or when the transport closes (a
//!   restarted coordinator's stateless reset, or QUIC's idle timeout, a backstop at 15 s).
//!
//! Why not re-join at the first limit: a slow or briefly paused coordinator is not a dead one,
//! and every session given up costs it a whole join when it is already behind. With that rule
//! every coordinator pause of more than three intervals made every worker re-join at once, and
//! in a 10,000-node join storm that saturated the coordinator (`testbed fleet`) the re-joins
//! were added to the storm. YARN's node managers likewise re-register only when the resource
//! manager asks them to.

use crate::time::Time;
use std::time::Duration;

/// Default number of heartbeat intervals without any frame from the coordinator before it is
/// taken as unresponsive.
pub const DEFAULT_LINK_TIMEOUT_HEARTBEATS: u32 = 3;

/// Floor of the unresponsive limit: with very short heartbeat intervals (tests, simulations) a
/// busy machine's scheduling noise alone must not refuse asks.
pub const MIN_LINK_TIMEOUT: Duration = Duration::from_secs(1);

/// Heartbeat intervals of silence after which the session is given up even though the
/// transport still stands: ten, as long as the coordinator's default node timeout at its
/// default heartbeat interval. A coordinator silent that long has declared this node lost (it
/// then closes the session itself, unless its loss guard holds the node) or is wedged; a new
/// session is the only way on either way.
pub const DEFAULT_LINK_GIVE_UP_HEARTBEATS: u32 = 10;

/// Floor of the give-up limit: with very short heartbeat intervals (tests) a coordinator
/// catching up after a pause of a few seconds must not lose every session.
pub const MIN_LINK_GIVE_UP: Duration = Duration::from_secs(6);

/// How long a join may go without progress before the worker gives up on that attempt and
/// retries: no answer begun, or no byte more of it, for this long ([`JoinAnswerWait`]).
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a join answer may take in all while its bytes keep arriving. The answer carries
/// the cluster's directory (O(nodes)); during a join storm a busy coordinator delivers it more
/// slowly than [`JOIN_TIMEOUT`], and giving up then only makes it send the whole answer again to
/// the same node, which is how a storm feeds itself (issue 17: at 10,000 nodes 4–11 % of the
/// joins were such retries, each also leaving an accepted session behind to be declared lost).
pub const JOIN_ANSWER_LIMIT: Duration = Duration::from_secs(60);

/// Re-join backoff: first retry after `REJOIN_BACKOFF_START`, doubling to `REJOIN_BACKOFF_MAX`;
/// back to the start after a session that joined.
pub const REJOIN_BACKOFF_START: Duration = Duration::from_millis(100);
pub const REJOIN_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Liveness of one session with the coordinator.
#[derive(Debug, Clone)]
pub struct LinkLiveness {
    started: Time,
    last_heard: Option<Time>,
    /// Silence past this: unresponsive (asks refused, session kept).
    timeout: Duration,
    /// Silence past this: the session is given up.
    give_up: Duration,
}

/// Waiting for the answer to a join: the attempt is given up when nothing of the answer arrives
/// for [`JOIN_TIMEOUT`] (the coordinator is gone, wedged or cut off) or when a slow answer is
/// still not whole after [`JOIN_ANSWER_LIMIT`]; as long as bytes keep coming within the first
/// limit, the worker keeps reading rather than asking again.
#[derive(Debug, Clone)]
pub struct JoinAnswerWait {
    started: Time,
    last_progress: Time,
}

impl JoinAnswerWait {
    /// The join was sent at `now`.
    pub fn new(now: Time) -> JoinAnswerWait {
        JoinAnswerWait {
            started: now,
            last_progress: now,
        }
    }

    /// Bytes of the answer arrived at `now`.
    pub fn progress(&mut self, now: Time) {
        self.last_progress = self.last_progress.max(now);
    }

    /// How much longer to wait for the next bytes at `now`; `Err` once the attempt should be
    /// given up.
    pub fn time_left(&self, now: Time) -> Result<Duration, LinkDead> {
        let stalled_at = self.last_progress + JOIN_TIMEOUT;
        let limit_at = self.started + JOIN_ANSWER_LIMIT;
        if now >= limit_at {
            return Err(LinkDead::JoinAnswerTooSlow(JOIN_ANSWER_LIMIT));
        }
        if now >= stalled_at {
            return Err(LinkDead::JoinTimedOut(JOIN_TIMEOUT));
        }
        Ok(stalled_at.min(limit_at).saturating_since(now))
    }
}

/// Why the link is considered dead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkDead {
    #[error("no join answer from the coordinator within {0:?}")]
    JoinTimedOut(Duration),
    #[error("the coordinator's join answer was still incomplete after {0:?}")]
    JoinAnswerTooSlow(Duration),
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
            give_up: JOIN_TIMEOUT,
        }
    }

    /// The join was accepted at `now`: from here on silence is measured against
    /// `heartbeats × heartbeat_interval` (at least [`MIN_LINK_TIMEOUT`]) for responsiveness,
    /// and against [`DEFAULT_LINK_GIVE_UP_HEARTBEATS`] intervals (at least [`MIN_LINK_GIVE_UP`],
    /// and never less than the first) for giving the session up.
    pub fn joined(&mut self, now: Time, heartbeat_interval: Duration, heartbeats: u32) {
        self.last_heard = Some(now);
        self.timeout = heartbeat_interval
            .saturating_mul(heartbeats.max(1))
            .max(MIN_LINK_TIMEOUT);
        self.give_up = heartbeat_interval
            .saturating_mul(DEFAULT_LINK_GIVE_UP_HEARTBEATS)
            .max(MIN_LINK_GIVE_UP)
            .max(self.timeout);
    }

    /// A session whose join was accepted at `now`, with the default limits
    /// ([`DEFAULT_LINK_TIMEOUT_HEARTBEATS`], [`DEFAULT_LINK_GIVE_UP_HEARTBEATS`]).
    pub fn after_join(now: Time, heartbeat_interval: Duration) -> LinkLiveness {
        let mut liveness = LinkLiveness::joining(now);
        liveness.joined(now, heartbeat_interval, DEFAULT_LINK_TIMEOUT_HEARTBEATS);
        liveness
    }

    /// Any frame from the coordinator arrived at `now`.
    pub fn heard(&mut self, now: Time) {
        if self.last_heard.is_some() {
            self.last_heard = Some(now);
        }
    }

    /// The silence after which the coordinator is taken as unresponsive.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The silence after which the session is given up (also the bound of a write).
    pub fn give_up_after(&self) -> Duration {
        self.give_up
    }

    /// `Err` (naming the silence and the unresponsive limit) while the joined coordinator has
    /// been silent for more than [`LinkLiveness::timeout`] at `now`; `Ok` before the join.
    pub fn responsive(&self, now: Time) -> Result<(), LinkDead> {
        match self.last_heard {
            Some(heard) if now.saturating_since(heard) > self.timeout => Err(LinkDead::Silent {
                silent: now.saturating_since(heard),
                limit: self.timeout,
            }),
            _ => Ok(()),
        }
    }

    /// `Err` once the session should be given up at `now`: a join unanswered for
    /// [`JOIN_TIMEOUT`], or silence past [`LinkLiveness::give_up_after`].
    pub fn check(&self, now: Time) -> Result<(), LinkDead> {
        match self.last_heard {
            None if now.saturating_since(self.started) > self.timeout => {
                Err(LinkDead::JoinTimedOut(self.timeout))
            }
            None => Ok(()),
            Some(heard) => {
                let silent = now.saturating_since(heard);
                if silent > self.give_up {
                    Err(LinkDead::Silent {
                        silent,
                        limit: self.give_up,
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

/// How long to wait before the re-join whose backoff is `backoff`: between half of it and all of
/// it, uniformly ("equal jitter", M. Brooker, "Exponential Backoff And Jitter", AWS Architecture
/// Blog, 2015). Without it every worker that lost the same coordinator at the same moment (a
/// restart, a partition healing) retries in the same instants, 100 ms, 200 ms, 400 ms… after, and
/// each retry wave meets the same join storm; the upper bound stays the backoff, so a worker
/// never re-joins later than the schedule says.
pub fn jittered_rejoin_delay<R: rand::Rng + ?Sized>(backoff: Duration, rng: &mut R) -> Duration {
    use rand::RngExt;
    let half = backoff / 2;
    let spread = u64::try_from((backoff - half).as_micros()).unwrap_or(u64::MAX);
    half + Duration::from_micros(rng.random_range(0..=spread))
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
    fn a_join_answer_that_keeps_arriving_is_waited_for_up_to_the_overall_limit() {
        let mut w = JoinAnswerWait::new(ms(1_000));
        assert_eq!(w.time_left(ms(1_000)), Ok(JOIN_TIMEOUT));
        // Nothing arrives: given up at the stall limit, not before.
        assert_eq!(w.time_left(ms(5_999)), Ok(Duration::from_millis(1)));
        assert_eq!(
            w.time_left(ms(6_000)),
            Err(LinkDead::JoinTimedOut(JOIN_TIMEOUT))
        );
        // Bytes every 4 s keep the attempt alive past the stall limit...
        for t in (5_000..=53_000).step_by(4_000) {
            w.progress(ms(t));
            assert_eq!(w.time_left(ms(t)), Ok(JOIN_TIMEOUT), "at {t} ms");
        }
        // ...but not past the overall limit, which also bounds the wait it hands out.
        w.progress(ms(59_000));
        assert_eq!(w.time_left(ms(59_000)), Ok(Duration::from_secs(2)));
        assert_eq!(
            w.time_left(ms(61_000)),
            Err(LinkDead::JoinAnswerTooSlow(JOIN_ANSWER_LIMIT))
        );
        // Progress reported out of order never moves the stall limit back.
        let mut w = JoinAnswerWait::new(ms(0));
        w.progress(ms(4_000));
        w.progress(ms(1_000));
        assert_eq!(w.time_left(ms(8_000)), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn silence_for_three_heartbeats_is_unresponsive_and_for_ten_ends_the_session() {
        let mut l = LinkLiveness::joining(ms(0));
        l.joined(
            ms(100),
            Duration::from_millis(1_000),
            DEFAULT_LINK_TIMEOUT_HEARTBEATS,
        );
        assert_eq!(l.timeout(), Duration::from_millis(3_000));
        assert_eq!(l.give_up_after(), Duration::from_millis(10_000));
        l.heard(ms(1_000));
        assert!(l.responsive(ms(4_000)).is_ok());
        assert!(matches!(
            l.responsive(ms(4_001)),
            Err(LinkDead::Silent { limit, .. }) if limit == Duration::from_secs(3)
        ));
        // Unresponsive is not dead: the session stands until the give-up limit.
        assert!(l.check(ms(11_000)).is_ok());
        assert!(matches!(
            l.check(ms(11_001)),
            Err(LinkDead::Silent { limit, .. }) if limit == Duration::from_secs(10)
        ));
        // Hearing anything resets the clock of both.
        l.heard(ms(10_000));
        assert!(l.responsive(ms(13_000)).is_ok());
        assert!(l.check(ms(20_000)).is_ok());
    }

    #[test]
    fn short_heartbeats_get_the_floors() {
        let mut l = LinkLiveness::joining(ms(0));
        l.joined(ms(0), Duration::from_millis(10), 3);
        assert_eq!(l.timeout(), MIN_LINK_TIMEOUT);
        assert_eq!(l.give_up_after(), MIN_LINK_GIVE_UP);
        assert!(l.responsive(ms(1_000)).is_ok());
        assert!(l.responsive(ms(1_001)).is_err());
        assert!(l.check(ms(6_000)).is_ok());
        assert!(l.check(ms(6_001)).is_err());
    }

    #[test]
    fn the_give_up_limit_is_never_below_the_unresponsive_one() {
        let mut l = LinkLiveness::joining(ms(0));
        l.joined(ms(0), Duration::from_secs(1), 20);
        assert_eq!(l.timeout(), Duration::from_secs(20));
        assert_eq!(l.give_up_after(), Duration::from_secs(20));
    }

    #[test]
    fn frames_before_the_join_do_not_start_the_silence_clock() {
        let mut l = LinkLiveness::joining(ms(0));
        l.heard(ms(4_000));
        assert!(matches!(l.check(ms(5_001)), Err(LinkDead::JoinTimedOut(_))));
    }

    #[test]
    fn rejoin_delays_spread_over_the_upper_half_of_the_backoff() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for backoff in [
            REJOIN_BACKOFF_START,
            Duration::from_millis(800),
            REJOIN_BACKOFF_MAX,
        ] {
            let delays: Vec<Duration> = (0..1_000)
                .map(|_| jittered_rejoin_delay(backoff, &mut rng))
                .collect();
            assert!(delays.iter().all(|d| backoff / 2 <= *d && *d <= backoff));
            // Spread, not a constant: both quarters of the range are used.
            let low = delays.iter().filter(|d| **d < backoff * 3 / 4).count();
            assert!((350..=650).contains(&low), "{backoff:?}: {low} of 1000 low");
        }
        assert_eq!(
            jittered_rejoin_delay(Duration::ZERO, &mut rng),
            Duration::ZERO
        );
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

//! When silence is not the node's fault: the coordinator's guard on declaring nodes lost
//! (sans-IO: the caller passes `now`).
//!
//! A node silent past the node timeout is declared lost, and "lost means gone": its containers
//! are reported `lost` and it must kill them when it re-joins. That rule blames the node for a
//! silence that may be the coordinator's own, and then it destroys the whole cluster's work at
//! once:
//!
//! - **The coordinator stopped listening** (its process paused, its VM frozen or swapping, its
//!   thread blocked): on resuming, every node looks silent since before the pause. Without this
//!   guard a coordinator paused past the node timeout declared every node lost at its next tick.
//!   Now a gap between two silence checks longer than two check intervals counts as time the
//!   coordinator was deaf: every node's silence is shortened by it ([`LossGuard::deaf_for`]),
//!   so a node is declared lost only after a whole node timeout of silence the coordinator was
//!   there to hear.
//! - **Most of the cluster goes silent at once** (the coordinator cut off from the nodes'
//!   network, or overloaded past the point of answering them, issue 17's congestion collapse at
//!   10,000 nodes): it is far more likely the coordinator's or the network's fault than that of
//!   thousands of nodes failing together. This is the rule of Kubernetes' node lifecycle
//!   controller for a zone (`ComputeZoneState`, defaults `--unhealthy-zone-threshold=0.55`,
//!   `--secondary-node-eviction-rate=0.01`): with more than two nodes suspected (silent for
//!   more than half their timeout, so the share is judged before the first of them is due:
//!   nodes cut off together fall silent over a heartbeat interval) and at least 55 % of the
//!   nodes suspected ("partial disruption"), nodes past the timeout are declared lost at 0.01
//!   per second, the longest silent first; with every node suspected ("full disruption") none
//!   is. When the share falls back below the threshold, every node still silent gets a whole
//!   node timeout from then, as after a pause of the coordinator's own (Kubernetes resets every
//!   node's timestamps on leaving full disruption): a healing partition brings nodes back over
//!   a heartbeat interval, and the last of them must not be declared lost the moment the
//!   first ones are heard. One deviation from Kubernetes: it stops evictions entirely in a
//!   partial disruption of a zone of at most 50 nodes; here the slow rate applies at every
//!   size, so a small cluster that really lost most of its nodes still frees their GUARANTEED
//!   capacity, one node per 100 s.
//!
//! - **Nodes are still coming back.** A coordinator that was away long enough for its nodes to
//!   give their sessions up (a pause past the workers' give-up limit) gets every one
//!   of them re-joining at once, and re-joins are answered only as fast as the coordinator
//!   handshakes and answers them: at 5,000 nodes on this project's 2-core VM it took 10–18 s,
//!   longer than the node timeout, and 183–470 live nodes were declared lost (and their work
//!   killed) while they waited in the coordinator's own queue (docs/benchmarks.md §9, session
//!   24). So a grace is granted after a pause of the coordinator's own too (one long enough
//!   for a worker to give its session up), and while one
//!   lasts, every node that comes back (a re-join of a node the coordinator knew) extends it to
//!   a node timeout from then: declarations resume a node timeout after the *last* node came
//!   back, i.e. once the recovery has stopped, not while it is in progress. A grace with its
//!   extensions lasts at most [`GRACE_MAX_TIMEOUTS`] node timeouts (a grace granted for the
//!   other cause while one lasts gives the silent nodes a whole node timeout from then, but
//!   does not restart that cap), and is granted for the same cause (a pause, a mass silence's
//!   end) at most once per [`GRACE_REARM_TIMEOUTS`]: a dead node's declaration is held back at
//!   most [`GRACE_MAX_TIMEOUTS`] + 1 node timeouts at a time, and for roughly half of any long
//!   span at worst.
//!
//! Holding a declaration never over-commits GUARANTEED capacity: a silent node's bookings stay
//! until it is declared lost (the coordinator also keeps new GUARANTEED work off it while it is
//! held). What it costs is time: an app learns later that containers on a node that really died
//! are gone.

use crate::liveness::MIN_LINK_GIVE_UP;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The guard's settings ([`crate::coordinator::CoordinatorConfig::loss_guard`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossGuardConfig {
    /// How often the caller checks for silent nodes (the coordinator's tick). A gap between two
    /// checks longer than twice this is time the coordinator was not listening; everything past
    /// one interval of it is taken off every node's silence.
    pub check_interval: Duration,
    /// The share of the nodes silent at once from which the coordinator presumes the fault is
    /// its own or the network's (Kubernetes `--unhealthy-zone-threshold`, 0.55). Above 1.0 the
    /// mass-silence rule is off.
    pub mass_silence_share: f64,
    /// Nodes declared lost per second while the share is reached but some nodes are still heard
    /// (Kubernetes `--secondary-node-eviction-rate`, 0.01); at most one per check.
    pub declarations_per_s_in_mass_silence: f64,
}

/// More silent nodes than this are needed for mass silence (Kubernetes: "more than 2").
pub const MASS_SILENCE_MIN_NODES: usize = 3;

/// After a grace (one node timeout without declarations, after a mass silence ends or a long
/// pause of the coordinator's own) is granted, another for the same cause is granted only this
/// many node timeouts later: twice [`GRACE_MAX_TIMEOUTS`], so even grace after grace of one
/// cause holds declarations back at most half the time, and a share that keeps crossing the
/// threshold delays a dead node's declaration by at most one node timeout in this many (ten,
/// if nodes keep re-joining within each of those graces).
pub const GRACE_REARM_TIMEOUTS: u32 = 2 * GRACE_MAX_TIMEOUTS;

/// A grace, extended by nodes coming back ([`LossGuard::node_returned`]), ends at the latest
/// this many node timeouts after it was granted (100 s at the default 10-s node timeout): a
/// dead node is declared at most this much late. Measured: 7,000 fleet nodes re-joining after
/// a 15-s pause took 31–75 s to be answered on this project's 2-core VM (docs/benchmarks.md
/// §9, session 25), so half of this would already bind there; Kubernetes, for comparison, evicts a
/// NotReady node's pods only after 300 s (`tolerationSeconds` of its not-ready taint).
pub const GRACE_MAX_TIMEOUTS: u32 = 10;

impl Default for LossGuardConfig {
    fn default() -> Self {
        LossGuardConfig {
            check_interval: Duration::from_millis(500),
            mass_silence_share: 0.55,
            declarations_per_s_in_mass_silence: 0.01,
        }
    }
}

impl LossGuardConfig {
    /// `Ok`, or the setting that is wrong with a clear reason.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.check_interval.is_zero() {
            return Err(("check_interval", "must be positive".into()));
        }
        if !self.mass_silence_share.is_finite() || self.mass_silence_share <= 0.0 {
            return Err((
                "mass_silence_share",
                format!(
                    "must be a positive share of the nodes (0.55 by default, above 1 to turn the rule off), got {}",
                    self.mass_silence_share
                ),
            ));
        }
        if !self.declarations_per_s_in_mass_silence.is_finite()
            || self.declarations_per_s_in_mass_silence < 0.0
        {
            return Err((
                "declarations_per_s_in_mass_silence",
                format!(
                    "must be a rate of at least 0 nodes per second, got {}",
                    self.declarations_per_s_in_mass_silence
                ),
            ));
        }
        Ok(())
    }
}

/// Why a grace was granted: each cause has its own re-arm clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GraceCause {
    MassSilenceEnded = 0,
    OwnStall = 1,
}

/// How the cluster's silence looks at a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// Fewer than the share (or at most two nodes) silent: every silent node is declared lost.
    Normal,
    /// At least the share silent, some nodes still heard: declared at the slow rate.
    Mass { silent: usize, nodes: usize },
    /// Every node silent (more than two): none declared.
    Total { silent: usize },
}

/// The guard's state between checks.
#[derive(Clone, Debug)]
pub struct LossGuard {
    last_check: Option<Time>,
    /// Time in mass silence not yet spent on a declaration (at most one period of the slow
    /// rate banked); kept in whole nanoseconds so a period is earned exactly.
    banked: Duration,
    /// Within a grace (after a mass or total silence, or a long pause of the coordinator's
    /// own, extended while nodes come back): nothing is declared before this.
    grace_until: Option<Time>,
    /// When the grace in progress (or the last one) was granted: its extensions end
    /// [`GRACE_MAX_TIMEOUTS`] node timeouts later.
    grace_granted_at: Option<Time>,
    /// When a grace was last granted for each cause ([`GraceCause`]): each cause is re-armed
    /// on its own clock, so a pause of the coordinator's own does not use up the grace the end
    /// of a later mass silence needs (and the other way round).
    granted_for: [Option<Time>; 2],
    silence: Silence,
    stalls: u64,
    /// Graces extended by a node coming back ([`LossGuard::node_returned`]).
    extensions: u64,
}

impl Default for LossGuard {
    fn default() -> Self {
        LossGuard::new()
    }
}

impl LossGuard {
    pub fn new() -> LossGuard {
        LossGuard {
            last_check: None,
            banked: Duration::ZERO,
            grace_until: None,
            grace_granted_at: None,
            granted_for: [None; 2],
            silence: Silence::Normal,
            stalls: 0,
            extensions: 0,
        }
    }

    /// The caller starts listening at `now`: a gap before the first check counts as well.
    pub fn start(&mut self, now: Time) {
        self.last_check.get_or_insert(now);
    }

    /// When the last check was.
    pub fn last_check(&self) -> Option<Time> {
        self.last_check
    }

    /// Whether a check is overdue at `now` (more than two check intervals since the last one):
    /// the coordinator has not been listening, and the silence it sees is not yet known to be
    /// the nodes'. Nothing is overdue before the first check or start.
    pub fn overdue(&self, config: &LossGuardConfig, now: Time) -> bool {
        self.last_check
            .is_some_and(|last| now.saturating_since(last) > config.check_interval * 2)
    }

    /// A check at `now`: how long the coordinator was deaf since the previous check (zero
    /// unless the gap is longer than two check intervals; then all of it past one interval).
    /// A stall of at least half a `node_timeout` (or [`MIN_LINK_GIVE_UP`], the shortest time a
    /// worker waits before giving its session up, if that is less) also grants a grace of one
    /// `node_timeout` (as the end of a mass silence does, at most once per
    /// [`GRACE_REARM_TIMEOUTS`]): nodes that gave their sessions up while the coordinator was
    /// away come back over the next seconds, and nodes coming back extend it
    /// ([`LossGuard::node_returned`]).
    pub fn deaf_for(
        &mut self,
        config: &LossGuardConfig,
        now: Time,
        node_timeout: Duration,
    ) -> Duration {
        let previous = self.last_check.replace(now);
        let Some(previous) = previous else {
            return Duration::ZERO;
        };
        let gap = now.saturating_since(previous);
        let interval = config.check_interval;
        if gap > interval * 2 {
            self.stalls += 1;
            let deaf = gap - interval;
            // Only a stall long enough for nodes to have given their sessions up (the shortest
            // give-up limit a worker uses, or half a node timeout if that is shorter): short
            // ones (an overloaded coordinator's late ticks) must not use up the pause's grace.
            if deaf >= (node_timeout / 2).min(MIN_LINK_GIVE_UP) {
                self.grant_grace(now, node_timeout, GraceCause::OwnStall);
            }
            deaf
        } else {
            Duration::ZERO
        }
    }

    /// One node timeout without declarations from `now`, unless a grace was granted for the
    /// same cause within the last [`GRACE_REARM_TIMEOUTS`] node timeouts. Within a grace in
    /// progress (of the other cause) it only makes sure of the whole node timeout.
    fn grant_grace(&mut self, now: Time, node_timeout: Duration, cause: GraceCause) {
        let rearm_after = node_timeout.saturating_mul(GRACE_REARM_TIMEOUTS);
        let last = &mut self.granted_for[cause as usize];
        if !last.is_none_or(|at| now.saturating_since(at) >= rearm_after) {
            return;
        }
        *last = Some(now);
        let until = now.saturating_add(node_timeout);
        if self.in_grace(now, node_timeout) {
            // Within the grace in progress: the nodes still silent get a whole node timeout
            // from now, but the grace keeps the start its extensions are capped from, so the
            // two causes cannot chain their caps.
            self.grace_until = self.grace_until.max(Some(until));
        } else {
            self.grace_until = Some(until);
            self.grace_granted_at = Some(now);
        }
    }

    /// Whether a grace holds declarations back at `now`. Never more than one node timeout
    /// ahead, even after the wall clock stepped back.
    fn in_grace(&self, now: Time, node_timeout: Duration) -> bool {
        self.grace_until
            .is_some_and(|until| now < until && until.saturating_since(now) <= node_timeout)
    }

    /// A node the coordinator knew came back at `now` (it re-joined): within a grace, the
    /// recovery is still in progress, so the grace is extended to one `node_timeout` from now,
    /// but not past [`GRACE_MAX_TIMEOUTS`] node timeouts from when it was granted. Outside a
    /// grace (a quiet cluster) nothing changes.
    ///
    /// Every re-join counts, also one of a node heard within the grace: in a congested
    /// recovery nodes that were answered lose their sessions again and re-join (measured:
    /// 9,339–11,959 sessions ended for 7,000 nodes, docs/benchmarks.md §9, session 25), and
    /// a version that let each node extend a grace only once declared 5,243 live nodes lost in
    /// such a run where this rule, on the same seed, declared none. The price: in a cluster
    /// where workers re-join often anyway (restarts, crash loops, a token holder re-joining on
    /// purpose) a grace lasts to its cap, i.e. a dead node is declared up to
    /// [`GRACE_MAX_TIMEOUTS`] node timeouts late after a pause or a mass silence, never
    /// later.
    pub fn node_returned(&mut self, now: Time, node_timeout: Duration) {
        if !self.in_grace(now, node_timeout) {
            return;
        }
        let (Some(until), Some(granted)) = (self.grace_until, self.grace_granted_at) else {
            return;
        };
        let latest = granted.saturating_add(node_timeout.saturating_mul(GRACE_MAX_TIMEOUTS));
        let extended = now.saturating_add(node_timeout).min(latest);
        if extended > until {
            self.grace_until = Some(extended);
            self.extensions += 1;
        }
    }

    /// Graces extended by a node coming back ([`LossGuard::node_returned`]).
    pub fn grace_extensions(&self) -> u64 {
        self.extensions
    }

    /// Checks that found the coordinator had been deaf ([`LossGuard::deaf_for`]).
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// The silence found by the last [`LossGuard::admit`].
    pub fn silence(&self) -> Silence {
        self.silence
    }

    /// Of `past_timeout` silent nodes (longest silent first), how many to declare lost at
    /// `now`, judging the cluster's silence by the `suspected` nodes (silent for more than half
    /// their timeout, `past_timeout` included) out of `nodes`. In mass silence the time since
    /// the previous check (`elapsed`) is banked towards the next declaration at the slow rate.
    /// When a mass or total silence ends, nothing is declared for one `node_timeout`: every
    /// node still silent then gets a whole timeout from the end of the episode.
    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        config: &LossGuardConfig,
        now: Time,
        node_timeout: Duration,
        past_timeout: usize,
        suspected: usize,
        nodes: usize,
        elapsed: Duration,
    ) -> usize {
        let share = if nodes == 0 {
            0.0
        } else {
            suspected as f64 / nodes as f64
        };
        // A share that is not a number (a config not validated) turns the rule off.
        let silence = if suspected < MASS_SILENCE_MIN_NODES
            || config.mass_silence_share.is_nan()
            || share < config.mass_silence_share
        {
            Silence::Normal
        } else if suspected >= nodes {
            Silence::Total { silent: suspected }
        } else {
            Silence::Mass {
                silent: suspected,
                nodes,
            }
        };
        let before = std::mem::replace(&mut self.silence, silence);
        match silence {
            Silence::Normal => {
                self.banked = Duration::ZERO;
                if before != Silence::Normal {
                    // The episode ends: nodes come back over a heartbeat interval when a
                    // partition heals, and the last ones must not be declared lost the moment
                    // the first ones are heard. At most one grace per GRACE_REARM_TIMEOUTS node
                    // timeouts, so a share that keeps crossing the threshold cannot keep a
                    // dead node from being declared.
                    self.grant_grace(now, node_timeout, GraceCause::MassSilenceEnded);
                }
                if self.in_grace(now, node_timeout) {
                    0
                } else {
                    self.grace_until = None;
                    past_timeout
                }
            }
            Silence::Total { .. } => {
                self.banked = Duration::ZERO;
                0
            }
            Silence::Mass { .. } => {
                let rate = config.declarations_per_s_in_mass_silence;
                // A rate too small for a Duration's period (or 0) never declares.
                let period = if rate > 0.0 {
                    Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX)
                } else {
                    Duration::MAX
                };
                // Nothing banked on entering: the first node goes after a whole period of the
                // slow rate, so a coordinator that recovers within it loses nobody.
                if matches!(before, Silence::Mass { .. }) {
                    self.banked = self.banked.saturating_add(elapsed).min(period);
                }
                if rate > 0.0 && self.banked >= period && past_timeout > 0 {
                    self.banked -= period;
                    1
                } else {
                    0
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: &LossGuardConfig = &LossGuardConfig {
        check_interval: Duration::from_millis(500),
        mass_silence_share: 0.55,
        declarations_per_s_in_mass_silence: 0.01,
    };

    fn guard() -> LossGuard {
        LossGuard::new()
    }

    #[test]
    fn a_gap_of_more_than_two_checks_is_deaf_time_past_one_interval() {
        let mut g = guard();
        assert_eq!(g.deaf_for(C, Time::from_millis(0), TIMEOUT), Duration::ZERO);
        assert_eq!(
            g.deaf_for(C, Time::from_millis(500), TIMEOUT),
            Duration::ZERO
        );
        // A late tick (up to two intervals) is not a stall.
        assert_eq!(
            g.deaf_for(C, Time::from_millis(1_500), TIMEOUT),
            Duration::ZERO
        );
        assert_eq!(g.stalls(), 0);
        // Paused 30 s: 29.5 s of it deaf.
        assert_eq!(
            g.deaf_for(C, Time::from_millis(31_500), TIMEOUT),
            Duration::from_millis(29_500)
        );
        assert_eq!(g.stalls(), 1);
        assert_eq!(
            g.deaf_for(C, Time::from_millis(32_000), TIMEOUT),
            Duration::ZERO
        );
        // Paused before its first check: measured from the start.
        let mut g = guard();
        g.start(Time::from_millis(0));
        assert_eq!(
            g.deaf_for(C, Time::from_millis(3_000), TIMEOUT),
            Duration::from_millis(2_500)
        );
    }

    const TIMEOUT: Duration = Duration::from_secs(10);

    /// `admit` at 1,000 s.
    fn declared(
        g: &mut LossGuard,
        past: usize,
        suspected: usize,
        nodes: usize,
        elapsed: Duration,
    ) -> usize {
        g.admit(
            C,
            Time::from_secs(1_000),
            TIMEOUT,
            past,
            suspected,
            nodes,
            elapsed,
        )
    }

    #[test]
    fn up_to_two_silent_nodes_or_less_than_the_share_are_all_declared() {
        let mut g = guard();
        let tick = Duration::from_millis(500);
        // Two of two silent: a tiny cluster is never held (more than two are needed).
        assert_eq!(declared(&mut g, 2, 2, 2, tick), 2);
        assert_eq!(g.silence(), Silence::Normal);
        // 54 of 100 suspected, 40 of them past the timeout.
        assert_eq!(declared(&mut g, 40, 54, 100, tick), 40);
        assert_eq!(g.silence(), Silence::Normal);
        assert_eq!(declared(&mut g, 0, 0, 0, tick), 0);
    }

    #[test]
    fn every_node_silent_declares_none_and_its_end_gives_the_rest_a_fresh_timeout() {
        let mut g = guard();
        for _ in 0..1_000 {
            assert_eq!(declared(&mut g, 3, 3, 3, Duration::from_secs(10)), 0);
        }
        assert_eq!(g.silence(), Silence::Total { silent: 3 });
        // Two heard again at 1,000 s: one still silent, not declared at once but a whole node
        // timeout later.
        assert_eq!(declared(&mut g, 1, 1, 3, Duration::from_millis(500)), 0);
        assert_eq!(g.silence(), Silence::Normal);
        let at = |s: u64| Time::from_millis(s);
        let half = Duration::from_millis(500);
        assert_eq!(g.admit(C, at(1_009_500), TIMEOUT, 1, 1, 3, half), 0);
        assert_eq!(g.admit(C, at(1_010_000), TIMEOUT, 1, 1, 3, half), 1);
    }

    #[test]
    fn mass_silence_declares_one_node_per_hundred_seconds() {
        let mut g = guard();
        let tick = Duration::from_millis(500);
        let mut total = 0;
        let mut first_at = None;
        // 300 s of 60 of 100 nodes silent (nothing declared leaves them silent in this test).
        for t in 0..600 {
            let n = declared(&mut g, 60, 60, 100, tick);
            if n > 0 && first_at.is_none() {
                first_at = Some(t);
            }
            total += n;
        }
        assert_eq!(
            g.silence(),
            Silence::Mass {
                silent: 60,
                nodes: 100
            }
        );
        // Nothing banked on entering; one declaration per 100 s after that.
        assert_eq!(first_at, Some(200));
        assert_eq!(total, 2);
        // Back under the share: the episode ends (the rest get a fresh timeout, no burst), the
        // bank is emptied, and a new mass silence starts with nothing banked.
        assert_eq!(declared(&mut g, 40, 40, 100, tick), 0);
        assert_eq!(g.silence(), Silence::Normal);
        assert_eq!(declared(&mut g, 60, 60, 100, tick), 0);
        assert_eq!(declared(&mut g, 60, 60, 100, tick), 0);
    }

    #[test]
    fn at_most_one_declaration_is_banked() {
        let mut g = guard();
        assert_eq!(declared(&mut g, 10, 10, 12, Duration::ZERO), 0);
        // 1,000 s in one step earn one, not ten: a coordinator that was away does not then
        // declare a burst.
        assert_eq!(declared(&mut g, 10, 10, 12, Duration::from_secs(1_000)), 1);
        assert_eq!(declared(&mut g, 9, 9, 11, Duration::from_millis(500)), 0);
        // Suspected but none past the timeout yet: the bank waits for one.
        let mut g = guard();
        declared(&mut g, 0, 10, 12, Duration::ZERO);
        assert_eq!(declared(&mut g, 0, 10, 12, Duration::from_secs(200)), 0);
        assert_eq!(declared(&mut g, 1, 10, 12, Duration::from_millis(500)), 1);
    }

    #[test]
    fn a_share_crossing_the_threshold_again_and_again_gets_one_grace_per_twenty_timeouts() {
        let mut g = guard();
        let half = Duration::from_millis(500);
        let at = |ms: u64| Time::from_millis(ms);
        // Mass at 0 s, back at 1 s: grace until 11 s.
        assert_eq!(g.admit(C, at(0), TIMEOUT, 2, 6, 10, half), 0);
        assert_eq!(g.admit(C, at(1_000), TIMEOUT, 2, 2, 10, half), 0);
        // Mass again at 5 s and back at 6 s: no new grace, so the two dead nodes are declared
        // when the first grace ends.
        assert_eq!(g.admit(C, at(5_000), TIMEOUT, 2, 6, 10, half), 0);
        assert_eq!(g.admit(C, at(6_000), TIMEOUT, 2, 2, 10, half), 0);
        assert_eq!(g.admit(C, at(11_000), TIMEOUT, 2, 2, 10, half), 2);
        // Still none 100 s later: graces are twenty timeouts apart.
        assert_eq!(g.admit(C, at(101_000), TIMEOUT, 2, 6, 10, half), 0);
        assert_eq!(g.admit(C, at(101_500), TIMEOUT, 2, 2, 10, half), 2);
        // Twenty timeouts after the first grace, an episode's end gets one again.
        assert_eq!(g.admit(C, at(201_000), TIMEOUT, 2, 6, 10, half), 0);
        assert_eq!(g.admit(C, at(201_500), TIMEOUT, 2, 2, 10, half), 0);
        assert_eq!(g.admit(C, at(211_500), TIMEOUT, 2, 2, 10, half), 2);
    }

    #[test]
    fn a_pause_grants_a_grace_that_nodes_coming_back_extend_up_to_ten_timeouts() {
        let mut g = guard();
        let half = Duration::from_millis(500);
        let at = |ms: u64| Time::from_millis(ms);
        assert_eq!(g.deaf_for(C, at(0), TIMEOUT), Duration::ZERO);
        // Paused from 0 to 20 s: a grace until 30 s.
        assert!(g.deaf_for(C, at(20_000), TIMEOUT) > Duration::ZERO);
        assert_eq!(g.admit(C, at(20_000), TIMEOUT, 1, 1, 10, half), 0);
        assert_eq!(g.admit(C, at(29_500), TIMEOUT, 1, 1, 10, half), 0);
        // A node comes back at 29.5 s: the grace lasts until 39.5 s.
        g.node_returned(at(29_500), TIMEOUT);
        assert_eq!(g.grace_extensions(), 1);
        assert_eq!(g.admit(C, at(39_000), TIMEOUT, 1, 1, 10, half), 0);
        assert_eq!(g.admit(C, at(39_500), TIMEOUT, 1, 1, 10, half), 1);
        // Once it has ended, a node coming back does not open it again.
        g.node_returned(at(40_000), TIMEOUT);
        assert_eq!(g.grace_extensions(), 1);
        assert_eq!(g.admit(C, at(40_000), TIMEOUT, 1, 1, 10, half), 1);

        // Nodes coming back every 5 s for ever: the grace ends 10 timeouts after it was granted.
        let mut g = guard();
        g.deaf_for(C, at(0), TIMEOUT);
        g.deaf_for(C, at(20_000), TIMEOUT);
        let mut first_declared = None;
        for t in (20_000..200_000).step_by(500) {
            if t % 5_000 == 0 {
                g.node_returned(at(t), TIMEOUT);
            }
            if g.admit(C, at(t), TIMEOUT, 1, 1, 10, half) > 0 && first_declared.is_none() {
                first_declared = Some(t);
            }
        }
        assert_eq!(first_declared, Some(120_000));
        // A short stall (a late tick of an overloaded coordinator) grants no grace: it ends no
        // session, and must not use up the grace a mass silence's end may need.
        let mut g = guard();
        g.deaf_for(C, at(0), TIMEOUT);
        assert_eq!(
            g.deaf_for(C, at(3_000), TIMEOUT),
            Duration::from_millis(2_500)
        );
        assert_eq!(g.admit(C, at(3_000), TIMEOUT, 1, 1, 10, half), 1);
        assert_eq!(g.admit(C, at(3_500), TIMEOUT, 1, 6, 10, half), 0);
        assert_eq!(g.admit(C, at(4_000), TIMEOUT, 1, 1, 10, half), 0);
        // A pause's grace that lapsed (nobody came back within it) does not use up the grace
        // of a mass silence that ends later: the causes are re-armed apart.
        let mut g = guard();
        g.deaf_for(C, at(0), TIMEOUT);
        g.deaf_for(C, at(20_000), TIMEOUT);
        assert_eq!(g.admit(C, at(30_000), TIMEOUT, 6, 6, 10, half), 0);
        assert_eq!(g.admit(C, at(40_000), TIMEOUT, 4, 4, 10, half), 0);
        assert_eq!(g.admit(C, at(49_500), TIMEOUT, 4, 4, 10, half), 0);
        assert_eq!(g.admit(C, at(50_000), TIMEOUT, 4, 4, 10, half), 4);
        // A mass silence ending within a pause's grace gives the nodes still silent a whole
        // node timeout from then, but the cap on extensions still counts from the pause.
        let mut g = guard();
        g.deaf_for(C, at(0), TIMEOUT);
        g.deaf_for(C, at(20_000), TIMEOUT);
        for t in (20_000..200_000).step_by(500) {
            if t == 100_000 {
                assert_eq!(g.admit(C, at(t), TIMEOUT, 6, 6, 10, half), 0);
                continue;
            }
            if t % 5_000 == 0 {
                g.node_returned(at(t), TIMEOUT);
            }
            let declared = g.admit(C, at(t), TIMEOUT, 1, 1, 10, half);
            // The pause's grace, extended to its cap at 120 s; the episode's end at 100.5 s
            // reaches 110.5 s only.
            assert_eq!(declared, usize::from(t >= 120_000), "at {t} ms");
        }
        // A quiet cluster: a node re-joining (a worker restart) outside any grace holds nothing.
        let mut g = guard();
        g.node_returned(at(1_000), TIMEOUT);
        assert_eq!(g.admit(C, at(1_000), TIMEOUT, 1, 1, 10, half), 1);
        assert_eq!(g.grace_extensions(), 0);
    }

    #[test]
    fn a_grace_never_reaches_more_than_a_timeout_ahead_and_odd_settings_do_not_panic() {
        let mut g = guard();
        let half = Duration::from_millis(500);
        assert_eq!(
            g.admit(C, Time::from_secs(1_000), TIMEOUT, 1, 3, 3, half),
            0
        );
        assert_eq!(
            g.admit(C, Time::from_secs(1_001), TIMEOUT, 1, 1, 3, half),
            0
        );
        // The wall clock steps back an hour: the grace does not last an hour more.
        assert_eq!(g.admit(C, Time::from_secs(1), TIMEOUT, 1, 1, 3, half), 1);
        // A rate too small for a period, and a share that is not a number.
        let odd = LossGuardConfig {
            declarations_per_s_in_mass_silence: 1e-300,
            ..C.clone()
        };
        let mut g = guard();
        for _ in 0..3 {
            assert_eq!(
                g.admit(
                    &odd,
                    Time::ZERO,
                    TIMEOUT,
                    5,
                    5,
                    6,
                    Duration::from_secs(1_000_000)
                ),
                0
            );
        }
        let nan = LossGuardConfig {
            mass_silence_share: f64::NAN,
            ..C.clone()
        };
        assert_eq!(guard().admit(&nan, Time::ZERO, TIMEOUT, 5, 5, 6, half), 5);
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(
            &LossGuardConfig::default(),
            C,
            "the tests run on the defaults"
        );
        assert!(LossGuardConfig::default().validate().is_ok());
        let bad = |c: LossGuardConfig| c.validate().unwrap_err().0;
        assert!(
            bad(LossGuardConfig {
                mass_silence_share: 0.0,
                ..LossGuardConfig::default()
            })
            .contains("mass_silence_share")
        );
        assert!(
            bad(LossGuardConfig {
                declarations_per_s_in_mass_silence: f64::NAN,
                ..LossGuardConfig::default()
            })
            .contains("declarations_per_s_in_mass_silence")
        );
        assert!(
            bad(LossGuardConfig {
                check_interval: Duration::ZERO,
                ..LossGuardConfig::default()
            })
            .contains("check_interval")
        );
    }
}

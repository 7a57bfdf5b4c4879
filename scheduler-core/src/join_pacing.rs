//! How many join answers the coordinator delivers at once (sans-IO: the caller passes the
//! sizes in).
//!
//! A join is answered with the cluster's directory, O(nodes): 266 KB on average at 10,000
//! nodes, 350 KB late in a storm that leaves lost nodes in it. Capping the connections not yet
//! *accepted* bounds the coordinator's work up to each acceptance, not the delivery of the
//! answers, which is most of a join's cost: issue 17 measured 10,000 workers joining from
//! distinct addresses (the per-source cap out of the way) with hundreds of answers in delivery
//! at once on the coordinator's one thread; the heartbeats of nodes already joined waited behind
//! them past the node timeout, and 8,383 nodes were declared lost, re-joined and answered again.
//!
//! So a join holds a turn from its acceptance until its answer is delivered (the worker's first
//! frame after the join, which it sends only once it has read the whole answer), and the turns
//! are capped by the bytes of answers in flight: at most [`JOIN_ANSWER_BYTES_IN_FLIGHT`] worth of
//! answers of the size the last join was answered with, never fewer than
//! [`MIN_JOINS_IN_PROGRESS`]. Joins past the cap wait for a turn in the coordinator (their
//! connections stay counted as not joined, under the coordinator's caps on those), instead of
//! being refused: a refused worker retries, and at 10,000 waiting workers the retries' handshakes
//! cost more than the joins (measured: 1,800 refused attempts a second took more than a core of
//! the fleet's driver).

/// Bytes of join answers the coordinator lets be in delivery at once. QUIC moves a few hundred
/// MB/s per core on loopback here (`testbed quic-floor`), so 8 MiB is a few tens of
/// milliseconds of the coordinator's thread: well inside one heartbeat interval, so joined
/// nodes' heartbeats never wait behind a pile of answers.
pub const JOIN_ANSWER_BYTES_IN_FLIGHT: u64 = 8 << 20;

/// Joins in progress allowed whatever the answers' size.
pub const MIN_JOINS_IN_PROGRESS: usize = 4;

/// The pacing rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinPacing {
    pub answer_bytes_in_flight: u64,
}

impl Default for JoinPacing {
    fn default() -> Self {
        JoinPacing {
            answer_bytes_in_flight: JOIN_ANSWER_BYTES_IN_FLIGHT,
        }
    }
}

impl JoinPacing {
    /// How many joins may be in progress at once when the last answer was `answer_bytes` long
    /// (0 before any join: no size to go by, no limit).
    pub fn joins_in_progress_limit(&self, answer_bytes: u64) -> usize {
        match self.answer_bytes_in_flight.checked_div(answer_bytes) {
            None => usize::MAX,
            Some(fit) => usize::try_from(fit)
                .unwrap_or(usize::MAX)
                .max(MIN_JOINS_IN_PROGRESS),
        }
    }

    /// May one more join be answered while `in_progress` are being delivered?
    pub fn admits(&self, in_progress: usize, answer_bytes: u64) -> bool {
        in_progress < self.joins_in_progress_limit(answer_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_in_flight_are_capped_by_their_bytes() {
        let p = JoinPacing::default();
        // The 10,000-node directory (266 KB per answer): 31 answers in delivery at once.
        assert_eq!(p.joins_in_progress_limit(266_000), 31);
        assert!(p.admits(30, 266_000));
        assert!(!p.admits(31, 266_000));
        // A small cluster's answers: the byte budget does not bind (the caps on connections
        // not joined yet do).
        assert_eq!(p.joins_in_progress_limit(2_000), 4194);
        // Huge answers still let a few joins proceed together.
        assert_eq!(p.joins_in_progress_limit(100 << 20), MIN_JOINS_IN_PROGRESS);
        assert!(p.admits(3, 100 << 20));
        assert!(!p.admits(4, 100 << 20));
        // Before any join there is no size to go by.
        assert_eq!(p.joins_in_progress_limit(0), usize::MAX);
        // A one-byte budget: the floor.
        let tiny = JoinPacing {
            answer_bytes_in_flight: 1,
        };
        assert_eq!(tiny.joins_in_progress_limit(1_000), MIN_JOINS_IN_PROGRESS);
    }
}

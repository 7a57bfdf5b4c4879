//! The queue-delay estimate R = Tq + Tr + Tl of Mercury §4.2.

use serde::{Deserialize, Serialize};

/// A node's estimated queuing delay for a new QUEUEABLE container, in milliseconds.
///
/// - `tq_ms`: the cumulative estimated execution time of the queued QUEUEABLE containers;
/// - `tr_ms`: the remaining estimated execution time of the running containers;
/// - `tl_ms`: time since a QUEUEABLE container last started on the node, counted only while
///   QUEUEABLE work cannot start at once (a broad indicator that the node is not available to
///   opportunistic work, e.g. because GUARANTEED work holds it).
///
/// Deviation from the paper's plain sums, written down in `docs/design.md`: each container's time
/// is weighted by its dominant share of the node, so R is in "whole-node milliseconds" and a
/// 32-core node with 32 queued one-core tasks of 1 s reports ~1 s, not 32 s. On a node that runs one
/// container at a time this is exactly the paper's sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueDelay {
    pub tq_ms: f64,
    pub tr_ms: f64,
    pub tl_ms: f64,
}

impl QueueDelay {
    /// The ranking value R.
    pub fn total_ms(&self) -> f64 {
        self.tq_ms + self.tr_ms + self.tl_ms
    }
}

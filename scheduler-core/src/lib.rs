//! Sans-IO core of the hybrid scheduler.
//!
//! Everything here is plain code over state: domain types, the wire messages and their codec, and
//! every scheduling policy (Mercury's node runtime, queue-delay estimate, top-k placement, load
//! shedding, quotas, policing, promotion, hybrid-GQ; the central guaranteed placement). Callers pass
//! `now` and a seeded RNG in; nothing here reads a clock, opens a socket or spawns a task. The
//! actors in `coordinator` and `worker` and the simulator in `testbed` drive exactly this code.

pub mod codec;
pub mod coordinator;
pub mod distributed;
pub mod guarantor;
pub mod hosted;
pub mod hybrid_gq;
pub mod ids;
pub mod issued;
pub mod join_pacing;
pub mod liveness;
pub mod loss_guard;
pub mod node;
pub mod promotion;
pub mod protocol;
pub mod queue_delay;
pub mod quota;
pub mod reservation;
pub mod resources;
pub mod shaper;
pub mod shaping;
pub mod threesigma;
pub mod time;
pub mod token;

pub use ids::{AppId, ContainerId, JobId, NodeId};
pub use resources::Resources;
pub use time::Time;

use serde::{Deserialize, Serialize};

/// The two container classes of Mercury §3.2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ContainerType {
    /// Placed centrally, started at once, never preempted by the infrastructure.
    Guaranteed,
    /// Placed by a distributed scheduler; may queue at the node, be reordered, shed or preempted.
    Queueable,
}

impl std::fmt::Display for ContainerType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ContainerType::Guaranteed => "GUARANTEED",
            ContainerType::Queueable => "QUEUEABLE",
        })
    }
}

/// Why the infrastructure (or the application) ended a container early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KillReason {
    /// A QUEUEABLE container was killed to make room for a GUARANTEED one (Mercury §3.4).
    PreemptedByGuaranteed,
    /// A queued QUEUEABLE container was discarded by load shedding (Mercury §4.3).
    Shed,
    /// The application released or stopped the container.
    Released,
    /// The container could not be launched, or exceeded its memory limit.
    Failed,
    /// The node running the container was lost.
    Lost,
    /// The resource shaper's preemption policy (Pace §3.2, Algorithm 1) preempted it: its
    /// shaped allocation no longer fit its node. The event's message gives the policy's reason.
    ShapedPreemption,
}

impl std::fmt::Display for KillReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KillReason::PreemptedByGuaranteed => "preempted_by_guaranteed",
            KillReason::Shed => "shed",
            KillReason::Released => "released",
            KillReason::Failed => "failed",
            KillReason::Lost => "lost",
            KillReason::ShapedPreemption => "shaped_preemption",
        })
    }
}

//! The discrete-event simulator: the production `scheduler-core` policies under a virtual clock.
//!
//! What is simulated, and by which production code:
//! - every node is a [`scheduler_core::node::NodeRuntime`] (queues, starts, preemption, shedding,
//!   policing);
//! - every node that hosts job managers has a [`scheduler_core::distributed::DistributedScheduler`]
//!   placing their QUEUEABLE asks on the top-k view it last received (Mercury §4.2);
//! - the coordinator is a [`scheduler_core::coordinator::CoordinatorState`]: nodes heartbeat
//!   their queue-delay estimate R every `heartbeat_interval_ms`; once per round it computes the
//!   top-k list and the shedding threshold (§4.3), which reach nodes and their schedulers in the
//!   heartbeat acknowledgements;
//! - the central scheduler is a [`scheduler_core::guarantor::Guarantor`] with best fit. In
//!   [`GuaranteedAllocation::OnHeartbeat`] (the YARN-like baseline of Mercury §7.1) it allocates
//!   only to a node that heartbeats and learns of finished GUARANTEED containers from heartbeats;
//!   in [`GuaranteedAllocation::EventDriven`] finishes are reported at once and asks are placed
//!   on arrival;
//! - each job manager applies hybrid-GQ ([`scheduler_core::hybrid_gq::HybridGq`]) per task, asks
//!   its local distributed scheduler (QUEUEABLE) or the guarantor (GUARANTEED), starts granted
//!   containers on their nodes, and asks again for QUEUEABLE tasks that were shed or killed.
//!
//! Token signing is skipped: the schedulers return token bodies and signing is the caller's job
//! (the node runtime never sees tokens). Node failures are not simulated.

pub mod cli;
pub mod diagnose;
mod engine;
pub mod events;
mod wakes;

pub use engine::Simulation;

use crate::workload::JobStream;
use scheduler_core::Resources;
use scheduler_core::coordinator::SheddingPolicy;
use scheduler_core::hybrid_gq::HybridGq;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How the central scheduler allocates GUARANTEED containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuaranteedAllocation {
    /// YARN-like: allocate on a node only when it heartbeats; finished containers are learnt
    /// from heartbeats (Mercury §7.1: 3 s).
    OnHeartbeat,
    /// Asks are placed when they arrive, and a finished container's capacity is reused as soon
    /// as its notice arrives.
    EventDriven,
}

fn default_true() -> bool {
    true
}

fn default_view_candidates_per_k() -> usize {
    scheduler_core::distributed::VIEW_CANDIDATES_PER_K
}

/// Which [`scheduler_core::guarantor::GuaranteedPlacer`] the central scheduler uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuaranteedPlacerKind {
    /// Best fit by GUARANTEED books only.
    BestFit,
    /// Least QUEUEABLE work preempted, then best fit; in heartbeat-driven allocation a node is
    /// passed over for up to one heartbeat interval while another could take the ask with less
    /// preemption.
    #[default]
    QueueableAware,
}

impl std::str::FromStr for GuaranteedPlacerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "best-fit" => Ok(GuaranteedPlacerKind::BestFit),
            "queueable-aware" => Ok(GuaranteedPlacerKind::QueueableAware),
            _ => Err(format!(
                "unknown GUARANTEED placer {s:?}: expected best-fit or queueable-aware"
            )),
        }
    }
}

/// The job manager's runtime estimate for a task (used by hybrid-GQ and by the nodes' R).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EstimateModel {
    Exact,
    /// The true runtime times exp(N(0, sigma²)).
    Noisy {
        sigma: f64,
    },
    /// 3σPredict (`inference::predictor`, 3Sigma §4.1) over the job's features
    /// ([`crate::workload::JobSpec::features`]) plus one feature shared by every job: at
    /// admission the job manager estimates each task at the median of the predicted runtime
    /// distribution; when a job finishes the predictor learns its mean task runtime. A job no
    /// history covers yet (the first ones) has no estimate: hybrid-GQ treats it as long.
    Predicted,
}

/// Nodes whose tasks run `slowdown` times longer than estimated (Mercury §7.2.3's "straggler
/// nodes that underestimate queuing delay").
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stragglers {
    /// Fraction of nodes (the first ones, rounded up).
    pub fraction: f64,
    pub slowdown: f64,
}

/// One-way message delays in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessageDelays {
    /// Node → coordinator heartbeat, and coordinator → node acknowledgement (each way).
    pub heartbeat_ms: u64,
    /// Guarantor → job manager grant delivery (YARN: the AM's next allocate call).
    pub guaranteed_grant_ms: u64,
    /// Job manager → its local distributed scheduler and back (the AM-RM proxy round trip).
    pub queueable_ask_ms: u64,
    /// Job manager → node `start_container`.
    pub start_container_ms: u64,
    /// Node → job manager container event (finished, killed, shed).
    pub notify_ms: u64,
}

impl Default for MessageDelays {
    fn default() -> Self {
        MessageDelays {
            heartbeat_ms: 1,
            guaranteed_grant_ms: 500,
            queueable_ask_ms: 1,
            start_container_ms: 1,
            notify_ms: 1,
        }
    }
}

/// Everything a run depends on besides the workload. Serialised into every report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: usize,
    pub node_capacity: Resources,
    /// Nodes per rack (Mercury §7.1: at most 40).
    pub rack_size: usize,
    /// Application policy of every job manager (label in `policy_label`).
    pub policy: HybridGq,
    pub policy_label: String,
    pub top_k: usize,
    /// Nodes per k in the coordinator's view (`scheduler_core::distributed::VIEW_CANDIDATES_PER_K`);
    /// 1 = the view is just the top k, so a scheduler's own placements cannot move its choice
    /// to other nodes (Mercury's plain top-k).
    #[serde(default = "default_view_candidates_per_k")]
    pub view_candidates_per_k: usize,
    pub shedding: SheddingPolicy,
    pub min_shedding_threshold_ms: f64,
    pub reorder_by_job_submit_time: bool,
    /// Node heartbeat interval; also the coordinator's top-k/threshold round.
    pub heartbeat_interval_ms: u64,
    pub guaranteed_allocation: GuaranteedAllocation,
    /// Placement of GUARANTEED containers.
    #[serde(default)]
    pub guaranteed_placer: GuaranteedPlacerKind,
    /// Tell nodes the QUEUEABLE limit "capacity − GUARANTEED booked" in heartbeat acks (§4.3).
    pub policing: bool,
    /// Nodes return queued QUEUEABLE containers that GUARANTEED work holds back longer than a
    /// placement elsewhere would wait (`NodeRuntime::shed_held_by_guaranteed`), at each
    /// heartbeat answer. An addition to Mercury (docs/experiments/mercury/diagnosis.md).
    #[serde(default = "default_true")]
    pub return_held_queueable: bool,
    pub delays: MessageDelays,
    pub estimate: EstimateModel,
    /// Concurrent-jobs limit of the job submitter (Mercury §7.2.1: 150).
    pub max_concurrent_jobs: usize,
    /// Nodes that host job managers (and so run a distributed scheduler used by them); job j is
    /// hosted on one of them round-robin.
    pub job_manager_hosts: usize,
    /// Simulated time to stop at; `None` runs until the workload is exhausted and drained.
    pub duration_ms: Option<u64>,
    /// Completions before this are excluded from throughput and latency figures.
    pub warmup_ms: u64,
    pub stragglers: Option<Stragglers>,
    /// Time a container holds its resources before its task starts running (process launch).
    pub task_launch_overhead_ms: u64,
    /// Skip heartbeats that change nothing (empty node, R already reported as 0, nothing
    /// booked or waiting for a node update) until something wakes the node. Off by default:
    /// a woken node's events get new sequence numbers, so among events at the very same
    /// microsecond their order can differ from the full simulation (in `experiment mercury`
    /// one of 28 runs differs by 2% of tasks). For speed on large, mostly idle clusters.
    pub elide_idle_heartbeats: bool,
    /// Check node-runtime and guarantor invariants after every step (slow; for tests).
    pub check_invariants: bool,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl SimConfig {
    /// Mercury §7.1's setting: 256 nodes of 32 cores and 128 GiB in racks of 40, 3 s heartbeats,
    /// a YARN-like central scheduler, top-k = 50, 150 concurrent jobs, 30-minute runs.
    pub fn mercury_cluster(seed: u64, policy: HybridGq) -> SimConfig {
        SimConfig {
            seed,
            nodes: 256,
            node_capacity: Resources::new(32_000, 131_072),
            rack_size: 40,
            policy_label: policy.label(),
            policy,
            top_k: 50,
            view_candidates_per_k: default_view_candidates_per_k(),
            shedding: SheddingPolicy::Off,
            min_shedding_threshold_ms: 100.0,
            reorder_by_job_submit_time: false,
            heartbeat_interval_ms: 3_000,
            guaranteed_allocation: GuaranteedAllocation::OnHeartbeat,
            guaranteed_placer: GuaranteedPlacerKind::default(),
            policing: true,
            return_held_queueable: true,
            delays: MessageDelays::default(),
            estimate: EstimateModel::Exact,
            max_concurrent_jobs: 150,
            job_manager_hosts: 150,
            duration_ms: Some(30 * 60 * 1000),
            warmup_ms: 60_000,
            stragglers: None,
            task_launch_overhead_ms: 0,
            elide_idle_heartbeats: false,
            check_invariants: cfg!(debug_assertions),
            progress: false,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.nodes == 0 {
            return Err("the cluster needs at least one node".into());
        }
        if self.heartbeat_interval_ms == 0 {
            return Err("heartbeat interval must be positive".into());
        }
        if self.max_concurrent_jobs == 0 || self.job_manager_hosts == 0 {
            return Err("max_concurrent_jobs and job_manager_hosts must be positive".into());
        }
        if self.node_capacity.is_zero()
            || self.rack_size == 0
            || self.top_k == 0
            || self.view_candidates_per_k == 0
        {
            return Err("node capacity, rack size and top-k must be positive".into());
        }
        if let Some(s) = self.stragglers
            && (!(0.0..=1.0).contains(&s.fraction) || s.slowdown.is_nan() || s.slowdown < 1.0)
        {
            return Err("stragglers need a fraction in [0, 1] and a slowdown >= 1".into());
        }
        Ok(())
    }
}

/// Job latency summary in seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub jobs: usize,
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl LatencySummary {
    pub fn of(samples_s: &mut [f64]) -> LatencySummary {
        if samples_s.is_empty() {
            return LatencySummary::default();
        }
        samples_s.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let i = ((q * samples_s.len() as f64).ceil() as usize).clamp(1, samples_s.len());
            samples_s[i - 1]
        };
        LatencySummary {
            jobs: samples_s.len(),
            mean: samples_s.iter().sum::<f64>() / samples_s.len() as f64,
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
        }
    }
}

/// The outcome of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    pub seed: u64,
    pub config: SimConfig,
    pub workload: String,
    /// Simulated seconds the figures below cover (end − warm-up).
    pub measured_s: f64,
    pub simulated_s: f64,
    /// Tasks completed per second of the measured window.
    pub task_throughput: f64,
    /// Jobs completed per minute of the measured window.
    pub job_throughput: f64,
    /// Latency (admission → last task done) of jobs completed in the window, in seconds.
    pub job_latency_s: LatencySummary,
    /// The same, per job class (e.g. "2s" and "50s" jobs of the hybrid mix).
    pub job_latency_by_class_s: BTreeMap<String, LatencySummary>,
    /// Mean wait from arrival to admission under the concurrent-jobs limit, seconds.
    pub mean_admission_wait_s: f64,
    /// QUEUEABLE containers killed to make room for GUARANTEED ones (whole run).
    pub queueable_killed: u64,
    /// Queued QUEUEABLE containers discarded by load shedding (whole run).
    pub queueable_shed: u64,
    pub tasks_completed: u64,
    pub jobs_completed: u64,
    pub guaranteed_containers: u64,
    pub queueable_containers: u64,
    /// CPU-time of tasks completed in the window over the cluster's CPU capacity.
    pub cpu_utilization: f64,
    /// How good the job managers' estimates were ([`EstimateModel::Predicted`] only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimates: Option<EstimateAccuracy>,
    pub events: u64,
    pub wall_s: f64,
    pub events_per_s: f64,
    /// What the coordinator's per-heartbeat work cost this process (wall time, so it varies
    /// with the machine like `wall_s`): comparable with `testbed fleet`'s coordinator CPU per
    /// heartbeat and the `coordinator_heartbeat` bench (docs/benchmarks.md §9).
    #[serde(default)]
    pub coordinator_cost: CoordinatorCost,
}

impl SimReport {
    /// The report with every figure that depends on the machine's speed zeroed, for comparing
    /// two runs' outcomes.
    pub fn without_timings(mut self) -> SimReport {
        self.wall_s = 0.0;
        self.events_per_s = 0.0;
        self.coordinator_cost = CoordinatorCost {
            heartbeats: self.coordinator_cost.heartbeats,
            rounds: self.coordinator_cost.rounds,
            ..CoordinatorCost::default()
        };
        self
    }
}

/// Time the simulation spent in the coordinator's share of heartbeats: what the live
/// coordinator process runs per heartbeat outside I/O (the same `scheduler-core` calls), so
/// the simulator and `testbed fleet` can be compared. One heartbeat in
/// [`CoordinatorCost::SAMPLE_EVERY`] is timed (a clock read costs about as much as the cheap
/// calls it would time), every round is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorCost {
    /// Heartbeats the coordinator handled.
    pub heartbeats: u64,
    /// Of them, timed.
    pub heartbeats_timed: u64,
    /// Mean time of a timed heartbeat: `CoordinatorState::heartbeat` and the guarantor's
    /// heartbeat-side bookkeeping (finished GUARANTEED containers, QUEUEABLE load), as the live
    /// coordinator and guarantor actors do on each heartbeat. Heartbeat-driven allocation
    /// (`schedule_on_node`, the YARN-like baseline) is placement, not heartbeat work, and is
    /// not counted.
    pub heartbeat_ns: f64,
    /// Rounds (top-k and shedding threshold, once per heartbeat interval).
    pub rounds: u64,
    /// Mean time of a round.
    pub round_ns: f64,
    /// `heartbeat_ns` plus the rounds' time spread over the heartbeats: the coordinator core's
    /// cost per heartbeat.
    pub ns_per_heartbeat: f64,
}

impl CoordinatorCost {
    pub const SAMPLE_EVERY: u64 = 64;
}

/// Accuracy of predicted runtime estimates over the admitted jobs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EstimateAccuracy {
    pub jobs: u64,
    /// Jobs that had an estimate (some history covered them).
    pub estimated: u64,
    /// Fraction of estimated jobs whose estimate is within a factor of two of their mean task
    /// runtime.
    pub within_2x: f64,
}

/// Run one simulation.
pub fn run(
    config: SimConfig,
    workload_name: &str,
    workload: JobStream,
) -> Result<SimReport, String> {
    let mut sim = Simulation::new(config, workload)?;
    sim.run();
    Ok(sim.report(workload_name))
}

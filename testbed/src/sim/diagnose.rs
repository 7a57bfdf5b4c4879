//! Where a run's capacity and its tasks' time go (issue 15's evidence). Opt-in
//! ([`super::Simulation::enable_diagnostics`]): sampling reads state between events and never
//! pushes an event, so a diagnosed run makes exactly the decisions of an undiagnosed one.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One cluster-wide sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterSample {
    pub t_s: f64,
    /// Cores held by running containers over all cores.
    pub busy: f64,
    /// Idle cores on nodes whose QUEUEABLE queue is empty, over all cores.
    pub idle_empty_queue: f64,
    /// Idle cores on nodes with QUEUEABLE work queued (it could not start: policing or fit).
    pub idle_with_queue: f64,
    /// Idle cores the central scheduler holds as booked: a grant on its way to the job manager,
    /// or a finished GUARANTEED container it has not heard of yet (the heartbeat gap).
    pub idle_booked_guaranteed: f64,
    /// QUEUEABLE containers queued at nodes.
    pub queued: u64,
    /// Nodes with an idle core and an empty queue.
    pub starved_nodes: u64,
    /// Mean and population σ of the R the coordinator holds, and the threshold it sends.
    pub r_mean_ms: f64,
    pub r_sigma_ms: f64,
    pub threshold_ms: Option<f64>,
    /// Sheds and kills since the previous sample.
    pub sheds: u64,
    pub kills: u64,
}

/// One node's sample (for the few traced nodes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSample {
    pub t_s: f64,
    pub running: u64,
    pub queued: u64,
    /// Its R now (Tq, Tr, Tl) and as the coordinator last heard it.
    pub tq_ms: f64,
    pub tr_ms: f64,
    pub tl_ms: f64,
    pub reported_r_ms: f64,
}

/// Where the completed tasks' time went, summed over tasks completed after warm-up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskTime {
    pub tasks: u64,
    /// Job admission → the task's final start.
    pub admission_to_start_s: f64,
    /// … of which spent queued on nodes that later shed it.
    pub queued_then_shed_s: f64,
    /// … of which spent queued on nodes whose GUARANTEED work then killed it (incl. run time lost).
    pub placed_then_killed_s: f64,
    /// … of which between the final placement (or grant) and the start.
    pub final_wait_s: f64,
    /// Running.
    pub run_s: f64,
    pub sheds: u64,
    pub kills: u64,
    /// Tasks shed at least once, and the largest number of sheds of one task.
    pub tasks_shed: u64,
    pub max_sheds: u64,
    /// Tasks by number of sheds (0, 1, 2, … 9, "10+").
    pub shed_histogram: BTreeMap<String, u64>,
}

/// Idle capacity over the measured window, in core-seconds, and what it is attributed to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IdleBreakdown {
    pub capacity_core_s: f64,
    pub busy_core_s: f64,
    pub idle_empty_queue_core_s: f64,
    pub idle_with_queue_core_s: f64,
    pub idle_booked_guaranteed_core_s: f64,
    /// Per node: the fraction of the window it had an idle core with an empty queue; summary.
    pub starved_fraction_p10: f64,
    pub starved_fraction_p50: f64,
    pub starved_fraction_p90: f64,
}

/// Everything a diagnosed run records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Diagnostics {
    pub sample_every_ms: u64,
    pub idle: IdleBreakdown,
    pub task_time: TaskTime,
    /// The same per job class and final container type, e.g. "2s queueable".
    pub task_time_by_class: BTreeMap<String, TaskTime>,
    /// Cluster samples once per second over the whole run.
    pub timeline: Vec<ClusterSample>,
    /// 100-ms samples of the traced nodes over a 30-s window after warm-up.
    pub traced_nodes: BTreeMap<String, Vec<NodeSample>>,
}

/// Quantile of a sorted slice (nearest rank).
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[i - 1]
}

impl TaskTime {
    /// Add one completed task.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &mut self,
        admission_to_start_s: f64,
        queued_then_shed_s: f64,
        placed_then_killed_s: f64,
        final_wait_s: f64,
        run_s: f64,
        sheds: u64,
        kills: u64,
    ) {
        self.tasks += 1;
        self.admission_to_start_s += admission_to_start_s;
        self.queued_then_shed_s += queued_then_shed_s;
        self.placed_then_killed_s += placed_then_killed_s;
        self.final_wait_s += final_wait_s;
        self.run_s += run_s;
        self.kills += kills;
        self.record_sheds(sheds);
    }

    pub(crate) fn record_sheds(&mut self, sheds: u64) {
        let bucket = if sheds >= 10 {
            "10+".to_string()
        } else {
            sheds.to_string()
        };
        *self.shed_histogram.entry(bucket).or_default() += 1;
        if sheds > 0 {
            self.tasks_shed += 1;
        }
        self.max_sheds = self.max_sheds.max(sheds);
        self.sheds += sheds;
    }
}

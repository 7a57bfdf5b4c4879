//! 3σSched in the live guarantor (DESIGN.md "The guarantor: one loop", layer 2): GUARANTEED
//! asks that carry a job description wait in a queue of their own and are planned each cycle by
//! [`ThreeSigmaScheduler`] (3Sigma §4.3) against the capacity left after the reservations
//! (layer 1), the plain GUARANTEED work booked now, and the expected consumption of running
//! 3Sigma jobs (§3.2). A decision to start a job now becomes concrete nodes here: best fit inside
//! the chosen equivalence set (§4.3.3), all containers of the gang or none, each checked against
//! the node's free GUARANTEED capacity and the reservations' rule at grant time, so a decision
//! computed on an older snapshot can never over-commit a node.
//!
//! This file is a child module of [`crate::guarantor`] (it books through the guarantor's private
//! grant path); its public items are re-exported from [`crate::threesigma`].
//!
//! A cycle is three steps so an actor can solve off its thread: [`Guarantor::prepare_threesigma_cycle`]
//! (snapshot), [`LiveCycle::solve`] (HiGHS, `Send`), [`Guarantor::apply_threesigma_cycle`].

use super::{GuaranteedAsk, GuaranteedPlacement, Guarantor, GuarantorError, GuarantorNode};
use crate::threesigma::{
    CycleDecision, CycleInput, CycleModel, CycleRecord, HighsSolver, JobDescription,
    NodeConstraint, PartitionState, PendingJob, RunningJob, RuntimeBelief, ThreeSigmaConfig,
    ThreeSigmaScheduler, Utility, equivalence_partitions, model::ColumnKind,
};
use crate::{AppId, ContainerId, JobId, NodeId, Resources};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Settings of the live 3Sigma cycle (coordinator config `[threesigma]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LiveThreeSigmaConfig {
    /// Scheduling interval (§4.3.1: "1-2s").
    pub cycle_ms: u64,
    /// Spacing of start times in the plan-ahead window (seconds).
    pub step_s: f64,
    /// Start times per option (the window is `starts × step_s`).
    pub starts: usize,
    /// Solver time as a fraction of the cycle (§4.3.6).
    pub time_limit_fraction: f64,
    /// The unit capacity is counted in: a node holds `min(cpu / slot.cpu, memory / slot.memory)`
    /// slots, a container takes its dominant number of slots.
    pub slot: Resources,
    /// Most jobs waiting in the 3Sigma queue; more are refused with a clear error.
    pub max_pending_jobs: usize,
    /// Runtime assumed for a job with no history and no `runtime_estimate_ms` (seconds).
    pub default_runtime_s: f64,
    /// Finished jobs kept for the SLO attainment figures of the dashboard (per app and total
    /// counts are kept forever; this bounds the recent list).
    pub recent_finished: usize,
}

impl Default for LiveThreeSigmaConfig {
    fn default() -> Self {
        Self {
            cycle_ms: 1000,
            step_s: 2.0,
            starts: 16,
            time_limit_fraction: 0.2,
            slot: Resources {
                cpu_millis: 1000,
                memory_mib: 1024,
            },
            max_pending_jobs: 1000,
            default_runtime_s: 60.0,
            recent_finished: 100,
        }
    }
}

impl LiveThreeSigmaConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.cycle_ms == 0 || self.cycle_ms > 60_000 {
            return Err(format!(
                "threesigma.cycle_ms must be in 1..=60000, got {}",
                self.cycle_ms
            ));
        }
        if self.slot.cpu_millis == 0 || self.slot.memory_mib == 0 {
            return Err("threesigma.slot needs non-zero cpu_millis and memory_mib".into());
        }
        if self.max_pending_jobs == 0 {
            return Err("threesigma.max_pending_jobs must be positive".into());
        }
        if !(self.default_runtime_s.is_finite() && self.default_runtime_s > 0.0) {
            return Err("threesigma.default_runtime_s must be positive".into());
        }
        self.scheduler_config()
            .validate()
            .map_err(|e| format!("threesigma: {e}"))
    }

    /// The cycle's MILP settings. Live preemption is not enacted (running 3Sigma work is never
    /// killed by the live cycle), so the model has no preemption columns.
    pub fn scheduler_config(&self) -> ThreeSigmaConfig {
        ThreeSigmaConfig {
            cycle_s: self.cycle_ms as f64 / 1000.0,
            step_s: self.step_s,
            starts: self.starts,
            time_limit_fraction: self.time_limit_fraction,
            preemption: false,
            ..ThreeSigmaConfig::default()
        }
    }

    /// Slots of a node of `capacity`.
    pub fn node_slots(&self, capacity: &Resources) -> f64 {
        (capacity.cpu_millis as f64 / self.slot.cpu_millis as f64)
            .min(capacity.memory_mib as f64 / self.slot.memory_mib as f64)
            .floor()
    }

    /// Slots one container of `resources` takes (its dominant dimension, at least one).
    pub fn container_slots(&self, resources: &Resources) -> f64 {
        (resources.cpu_millis as f64 / self.slot.cpu_millis as f64)
            .max(resources.memory_mib as f64 / self.slot.memory_mib as f64)
            .ceil()
            .max(1.0)
    }

    /// Slots held by bookings of `resources` (fractional: the share of the dominant dimension).
    fn used_slots(&self, resources: &Resources) -> f64 {
        (resources.cpu_millis as f64 / self.slot.cpu_millis as f64)
            .max(resources.memory_mib as f64 / self.slot.memory_mib as f64)
    }
}

/// A job's runtime distribution as `explain` shows it (seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BeliefSummary {
    pub p10_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub mean_s: f64,
    /// Where the belief came from (the 3σPredict expert, or the prior used without history).
    pub source: String,
}

impl BeliefSummary {
    pub fn of(belief: &RuntimeBelief, source: impl Into<String>) -> BeliefSummary {
        BeliefSummary {
            p10_s: belief.quantile(0.1),
            p50_s: belief.quantile(0.5),
            p90_s: belief.quantile(0.9),
            mean_s: belief.mean(),
            source: source.into(),
        }
    }
}

/// One option of a waiting job the last cycle considered (§4.3.4: equivalence set × start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsideredOption {
    /// The equivalence set's nodes (up to a few names) and their count.
    pub partition: usize,
    pub nodes: Vec<String>,
    pub node_count: usize,
    /// Seconds from the cycle to the option's start.
    pub start_in_s: f64,
    pub expected_utility: f64,
    pub chosen: bool,
}

/// Why a waiting 3Sigma job was not placed, with what the last cycle saw (`explain`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobExplanation {
    pub ask_key: u64,
    pub app_id: AppId,
    pub job_id: JobId,
    pub gang: u32,
    pub resources: Resources,
    pub utility: Utility,
    pub belief: BeliefSummary,
    /// Unix ms of the cycle this explanation is from (`None`: no cycle ran since submission).
    pub cycle_at_ms: Option<u64>,
    /// The best options of the last cycle, by expected utility (at most 8).
    pub options: Vec<ConsideredOption>,
    pub reason: String,
}

/// A 3Sigma job whose containers have all ended (the actor persists it for 3σPredict).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletedJob {
    pub app_id: AppId,
    pub job_id: JobId,
    /// The guarantor's key of the job's ask (what [`Guarantor::submit_job`] was given): the
    /// caller finds what it kept of the job's submission by it.
    #[serde(default)]
    pub ask_key: u64,
    pub features: Vec<(String, String)>,
    pub submit_ms: u64,
    pub start_ms: u64,
    pub finish_ms: u64,
    /// Runtime from the grant to the last container's end (seconds).
    pub runtime_s: f64,
    /// SLO jobs: whether it completed by its deadline.
    pub slo_met: Option<bool>,
    /// Utility earned (the curve at completion).
    pub utility_earned: f64,
    /// A container ended without ever starting (expired, released or lost): its runtime is not
    /// a runtime of the job and is not learned from.
    pub aborted: bool,
}

/// SLO attainment of finished 3Sigma jobs (dashboard).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SloAttainment {
    pub slo_met: u64,
    pub slo_missed: u64,
    pub best_effort_finished: u64,
    /// Met / (met + missed), when any SLO job finished.
    pub attainment: Option<f64>,
    pub per_app: BTreeMap<String, AppAttainment>,
    /// The most recent finished jobs, newest last.
    pub recent: Vec<CompletedJob>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppAttainment {
    pub slo_met: u64,
    pub slo_missed: u64,
    pub best_effort_finished: u64,
    pub attainment: Option<f64>,
}

fn ratio(met: u64, missed: u64) -> Option<f64> {
    (met + missed > 0).then(|| met as f64 / (met + missed) as f64)
}

/// What one cycle did, for metrics and logs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveCycleReport {
    pub record: CycleRecord,
    /// Wall time of the solve, measured by the caller (the core reads no clock).
    pub started_jobs: usize,
    pub deferred_jobs: usize,
    /// Jobs the decision started whose gang no longer fitted the nodes at apply time.
    pub not_enacted: usize,
    pub pending_jobs: usize,
}

#[derive(Debug, Clone)]
struct WaitingJob {
    ask: GuaranteedAsk,
    description: JobDescription,
    belief: RuntimeBelief,
    belief_source: String,
    submit_s: f64,
    explanation: Option<Explanation>,
}

/// What the last cycle said of a waiting job.
#[derive(Debug, Clone)]
struct Explanation {
    cycle_ms: u64,
    options: Vec<ConsideredOption>,
    /// For the operator: other jobs are named by ask key.
    reason: String,
    /// For the job's app: other jobs (maybe other apps') are only counted.
    reason_for_app: String,
}

/// Ask keys an operator's `explain` names when better-valued jobs took the room (the rest are
/// counted), so a reason stays a line.
const BETTER_JOBS_NAMED: usize = 5;

#[derive(Debug, Clone)]
struct RunningLiveJob {
    app_id: AppId,
    job_id: JobId,
    features: Vec<(String, String)>,
    utility: Utility,
    belief: RuntimeBelief,
    slots_per_container: f64,
    submit_ms: u64,
    start_ms: u64,
    containers: HashSet<ContainerId>,
    /// Node of each container (the partition of its first node is where the job counts).
    nodes: Vec<NodeId>,
    aborted: bool,
}

/// The guarantor's 3Sigma queue and its bookkeeping.
pub struct LiveThreeSigma {
    config: LiveThreeSigmaConfig,
    /// Taken out while a cycle is being solved off the caller's thread.
    scheduler: Option<ThreeSigmaScheduler<HighsSolver>>,
    waiting: Vec<WaitingJob>,
    running: HashMap<u64, RunningLiveJob>,
    /// Container → the running job (ask key) it belongs to.
    container_job: HashMap<ContainerId, u64>,
    node_attributes: HashMap<NodeId, BTreeMap<String, String>>,
    last_cycle_ms: Option<u64>,
    last_record: Option<CycleRecord>,
    completed: Vec<CompletedJob>,
    attainment: SloAttainment,
}

impl std::fmt::Debug for LiveThreeSigma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveThreeSigma")
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .finish()
    }
}

impl LiveThreeSigma {
    pub fn new(config: LiveThreeSigmaConfig) -> Result<LiveThreeSigma, String> {
        config.validate()?;
        let scheduler =
            ThreeSigmaScheduler::new("3sigma-live", config.scheduler_config(), HighsSolver)
                .map_err(|e| e.to_string())?;
        Ok(LiveThreeSigma {
            config,
            scheduler: Some(scheduler),
            waiting: Vec::new(),
            running: HashMap::new(),
            container_job: HashMap::new(),
            node_attributes: HashMap::new(),
            last_cycle_ms: None,
            last_record: None,
            completed: Vec::new(),
            attainment: SloAttainment::default(),
        })
    }

    pub fn config(&self) -> &LiveThreeSigmaConfig {
        &self.config
    }
}

/// A cycle's snapshot, solvable off the guarantor's thread.
pub struct LiveCycle {
    now_ms: u64,
    scheduler: ThreeSigmaScheduler<HighsSolver>,
    partitions: Vec<PartitionState>,
    members: Vec<Vec<NodeId>>,
    pending: Vec<PendingJob>,
    running: Vec<RunningJob>,
    /// Capacity rows' parts for the reasons: slots held by reservations and other GUARANTEED
    /// work at step 0 per partition.
    reserved_now: Vec<f64>,
    other_now: Vec<f64>,
}

/// A solved cycle, to hand back to [`Guarantor::apply_threesigma_cycle`].
pub struct SolvedCycle {
    cycle: LiveCycle,
    decision: CycleDecision,
    model: CycleModel,
}

impl LiveCycle {
    pub fn pending_jobs(&self) -> usize {
        self.pending.len()
    }

    /// Run the MILP (bounded by the configured fraction of the cycle).
    pub fn solve(mut self) -> SolvedCycle {
        let input = CycleInput {
            now: self.now_ms as f64 / 1000.0,
            partitions: &self.partitions,
            pending: &self.pending,
            running: &self.running,
        };
        let (decision, model) = self.scheduler.cycle_with_model(&input);
        SolvedCycle {
            cycle: self,
            decision,
            model,
        }
    }
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

impl Guarantor {
    /// Plan asks with a job description with 3σSched (before nodes join).
    pub fn with_threesigma(mut self, live: LiveThreeSigma) -> Guarantor {
        self.threesigma = Some(live);
        self
    }

    pub fn threesigma(&self) -> Option<&LiveThreeSigma> {
        self.threesigma.as_ref()
    }

    /// The attributes a node was started with (`worker run --attribute k=v`); its rack is the
    /// attribute `rack` unless given.
    pub fn set_node_attributes(&mut self, node: &NodeId, mut attributes: BTreeMap<String, String>) {
        let rack = self.nodes.get(node).map(|n| n.rack.clone());
        if let Some(live) = &mut self.threesigma {
            if let Some(rack) = rack {
                attributes.entry("rack".into()).or_insert(rack);
            }
            live.node_attributes.insert(node.clone(), attributes);
        }
    }

    /// Queue a GUARANTEED ask that describes its job for the 3Sigma cycle. `belief` is
    /// 3σPredict's distribution for it (or a prior), `belief_source` says which.
    pub fn submit_job(
        &mut self,
        ask: GuaranteedAsk,
        description: JobDescription,
        belief: RuntimeBelief,
        belief_source: String,
        now_ms: u64,
    ) -> Result<(), GuarantorError> {
        let Some(live) = &self.threesigma else {
            return Err(GuarantorError::BadJob(
                "3Sigma scheduling is not enabled on this coordinator".into(),
            ));
        };
        if ask.count == 0 || ask.resources.is_zero() {
            return Err(GuarantorError::Empty);
        }
        description
            .validate()
            .map_err(|e| GuarantorError::BadJob(e.to_string()))?;
        if description.gang != ask.count {
            return Err(GuarantorError::BadJob(format!(
                "the job's gang ({}) differs from the ask's count ({})",
                description.gang, ask.count
            )));
        }
        if live.waiting.len() >= live.config.max_pending_jobs {
            return Err(GuarantorError::JobQueueFull {
                max: live.config.max_pending_jobs,
            });
        }
        let slots = live.config.container_slots(&ask.resources) * f64::from(ask.count);
        let largest: f64 = self
            .nodes
            .values()
            .map(|n| live.config.node_slots(&n.capacity))
            .sum();
        if !self
            .nodes
            .values()
            .any(|n| ask.resources.fits_in(&n.capacity))
            || slots > largest
        {
            return Err(self.larger_than_any_node(ask.resources));
        }
        let live = self.threesigma.as_mut().expect("checked above");
        live.waiting.push(WaitingJob {
            submit_s: secs(now_ms),
            ask,
            description,
            belief,
            belief_source,
            explanation: None,
        });
        Ok(())
    }

    /// Jobs waiting in the 3Sigma queue.
    pub fn threesigma_pending(&self) -> usize {
        self.threesigma.as_ref().map_or(0, |l| l.waiting.len())
    }

    /// 3Sigma jobs the guarantor holds, waiting or running.
    pub fn threesigma_jobs(&self) -> usize {
        self.threesigma
            .as_ref()
            .map_or(0, |l| l.waiting.len() + l.running.len())
    }

    /// Ask keys of the 3Sigma jobs still waiting or running (a job not among them completed,
    /// was withdrawn or left with its app).
    pub fn threesigma_job_keys(&self) -> HashSet<u64> {
        self.threesigma.as_ref().map_or_else(HashSet::new, |l| {
            l.running
                .keys()
                .copied()
                .chain(l.waiting.iter().map(|w| w.ask.ask_key))
                .collect()
        })
    }

    /// Tell the guarantor the time before reporting container ends, so a finished 3Sigma job's
    /// runtime is measured to now.
    pub fn observe_time(&mut self, now_ms: u64) {
        self.tick(now_ms);
    }

    /// Containers of the jobs waiting in the 3Sigma queue (ids to reserve before a cycle).
    pub fn threesigma_pending_containers(&self) -> u64 {
        self.threesigma.as_ref().map_or(0, |l| {
            l.waiting.iter().map(|w| u64::from(w.ask.count)).sum()
        })
    }

    /// A solve was lost (its thread panicked): a fresh solver (no warm start) takes over.
    pub fn reset_threesigma_solver(&mut self) {
        if let Some(live) = &mut self.threesigma
            && live.scheduler.is_none()
        {
            live.scheduler = ThreeSigmaScheduler::new(
                "3sigma-live",
                live.config.scheduler_config(),
                HighsSolver,
            )
            .ok();
        }
    }

    /// Whether a 3Sigma cycle is due at `now_ms` (jobs wait, the interval passed, and no cycle
    /// is being solved).
    pub fn threesigma_due(&self, now_ms: u64) -> bool {
        self.threesigma.as_ref().is_some_and(|l| {
            !l.waiting.is_empty()
                && l.scheduler.is_some()
                && l.last_cycle_ms
                    .is_none_or(|t| now_ms >= t.saturating_add(l.config.cycle_ms))
        })
    }

    /// Drop a waiting 3Sigma job (its application went away). Containers dropped.
    pub(crate) fn cancel_job(&mut self, ask_key: u64) -> u32 {
        let Some(live) = &mut self.threesigma else {
            return 0;
        };
        let mut n = 0;
        live.waiting.retain(|w| {
            if w.ask.ask_key == ask_key {
                n += w.ask.count;
                false
            } else {
                true
            }
        });
        n
    }

    /// Snapshot the cycle's input; `None` when nothing waits or a cycle is being solved.
    pub fn prepare_threesigma_cycle(&mut self, now_ms: u64) -> Option<LiveCycle> {
        self.tick(now_ms);
        let live = self.threesigma.as_ref()?;
        if live.waiting.is_empty() || live.scheduler.is_none() {
            return None;
        }
        let config = &live.config;
        let nodes: Vec<&super::GuarantorNode> = self
            .nodes
            .values()
            .filter(|n| !self.closed().contains(&n.node_id))
            .collect();
        let attributes: Vec<BTreeMap<String, String>> = nodes
            .iter()
            .map(|n| {
                let mut a = live
                    .node_attributes
                    .get(&n.node_id)
                    .cloned()
                    .unwrap_or_default();
                a.entry("rack".into()).or_insert_with(|| n.rack.clone());
                a
            })
            .collect();
        let constraints: Vec<NodeConstraint> = live
            .waiting
            .iter()
            .flat_map(|w| {
                w.description
                    .required
                    .iter()
                    .chain(&w.description.preferred)
                    .cloned()
            })
            .collect();
        let partitioning = equivalence_partitions(&attributes, &constraints);
        // 3Sigma grants booked per node (they are counted through their beliefs instead).
        let mut live_booked: HashMap<&NodeId, Resources> = HashMap::new();
        for (id, key) in &live.container_job {
            if let (Some(g), true) = (self.grants.get(id), live.running.contains_key(key)) {
                let e = live_booked.entry(&g.node).or_default();
                *e = e.saturating_add(&g.resources);
            }
        }
        let steps = config.starts;
        let book = &self.reservations;
        let total_booked = nodes
            .iter()
            .fold(Resources::ZERO, |a, n| a.saturating_add(&n.guaranteed));
        let reservation_used = total_booked.saturating_sub(&book.plain_used());
        let total_slots: f64 = nodes.iter().map(|n| config.node_slots(&n.capacity)).sum();
        // What reservations hold beyond what their containers use, per window step.
        let reserved_steps: Vec<f64> = (0..steps)
            .map(|s| {
                let at = now_ms.saturating_add((s as f64 * config.step_s * 1000.0) as u64);
                config.used_slots(&book.held(at, None).saturating_sub(&reservation_used))
            })
            .collect();
        let mut partitions = Vec::with_capacity(partitioning.members.len());
        let mut members = Vec::with_capacity(partitioning.members.len());
        let mut reserved_now = Vec::new();
        let mut other_now = Vec::new();
        for m in &partitioning.members {
            let capacity: f64 = m
                .iter()
                .map(|&i| config.node_slots(&nodes[i].capacity))
                .sum();
            let other: f64 = m
                .iter()
                .map(|&i| {
                    let n = nodes[i];
                    let mine = live_booked.get(&n.node_id).copied().unwrap_or_default();
                    config.used_slots(&n.guaranteed.saturating_sub(&mine))
                })
                .sum();
            let share = if total_slots > 0.0 {
                capacity / total_slots
            } else {
                0.0
            };
            let reserved: Vec<f64> = reserved_steps.iter().map(|r| other + r * share).collect();
            reserved_now.push(reserved_steps.first().copied().unwrap_or(0.0) * share);
            other_now.push(other);
            partitions.push(PartitionState { capacity, reserved });
            members.push(m.iter().map(|&i| nodes[i].node_id.clone()).collect());
        }
        let pending: Vec<PendingJob> = live
            .waiting
            .iter()
            .map(|w| {
                let per = config.container_slots(&w.ask.resources);
                PendingJob {
                    id: w.ask.ask_key,
                    submit: w.submit_s,
                    utility: w.description.utility,
                    gang: (per * f64::from(w.ask.count)).ceil() as u32,
                    belief: w.belief.clone(),
                    choices: w.description.choices(&partitioning),
                }
            })
            .collect();
        let node_index: HashMap<&NodeId, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (&n.node_id, i))
            .collect();
        let running: Vec<RunningJob> = live
            .running
            .iter()
            .filter_map(|(key, r)| {
                let node = r.nodes.first()?;
                let partition = partitioning.node_partition[*node_index.get(node)?];
                Some(RunningJob {
                    id: *key,
                    partition,
                    gang: (r.slots_per_container * r.containers.len() as f64).ceil() as u32,
                    started: secs(r.start_ms),
                    belief: r.belief.clone(),
                    utility: r.utility,
                    preemptible: false,
                })
            })
            .collect();
        let live = self.threesigma.as_mut()?;
        let scheduler = live.scheduler.take()?;
        live.last_cycle_ms = Some(now_ms);
        Some(LiveCycle {
            now_ms,
            scheduler,
            partitions,
            members,
            pending,
            running,
            reserved_now,
            other_now,
        })
    }

    /// Enact a solved cycle: jobs to start now get concrete nodes (best fit inside the chosen
    /// equivalence set, the whole gang or nothing, re-checked against the books now), every
    /// waiting job gets its explanation.
    pub fn apply_threesigma_cycle(
        &mut self,
        solved: SolvedCycle,
        now_ms: u64,
    ) -> (Vec<GuaranteedPlacement>, LiveCycleReport) {
        self.tick(now_ms);
        let SolvedCycle {
            cycle,
            decision,
            model,
        } = solved;
        let Some(live) = self.threesigma.as_mut() else {
            return (
                Vec::new(),
                LiveCycleReport {
                    record: decision.record,
                    started_jobs: 0,
                    deferred_jobs: 0,
                    not_enacted: 0,
                    pending_jobs: 0,
                },
            );
        };
        let LiveCycle {
            now_ms: cycle_ms,
            scheduler,
            partitions,
            members,
            pending,
            reserved_now,
            other_now,
            ..
        } = cycle;
        live.scheduler = Some(scheduler);
        // Deferred starts that fit now at no loss were already moved to now by the core
        // (`threesigma::pull_forward`).
        let start_now = decision.start_now.clone();
        let mut placements = Vec::new();
        let mut started = 0;
        let mut not_enacted = HashMap::new();
        for p in &start_now {
            let Some(members) = members.get(p.partition) else {
                continue;
            };
            match self.place_gang(now_ms, p.job, members) {
                Some(mut granted) => {
                    started += 1;
                    placements.append(&mut granted);
                }
                None => {
                    not_enacted.insert(
                        p.job,
                        "the decision started it, but its gang no longer fits the nodes of the \
                         chosen set (bookings changed during the solve or the set is fragmented)",
                    );
                }
            }
        }
        // Explanations of the jobs still waiting.
        let live = self.threesigma.as_mut().expect("checked above");
        let chosen_by_job: HashMap<u64, (usize, f64)> = decision
            .start_now
            .iter()
            .chain(&decision.deferred)
            .map(|p| (p.job, (p.partition, p.start)))
            .collect();
        let now_s = secs(cycle_ms);
        let mut step0_users: HashMap<usize, Vec<u64>> = HashMap::new();
        for p in &start_now {
            step0_users.entry(p.partition).or_default().push(p.job);
        }
        for (j, job) in pending.iter().enumerate() {
            let Some(waiting) = live.waiting.iter_mut().find(|w| w.ask.ask_key == job.id) else {
                continue;
            };
            let mut options: Vec<ConsideredOption> = model
                .model
                .columns
                .iter()
                .filter_map(|c| match c.kind {
                    ColumnKind::Option {
                        job: cj,
                        partition,
                        step,
                    } if cj == j => {
                        let start = model.starts[step];
                        Some(ConsideredOption {
                            partition,
                            nodes: members[partition]
                                .iter()
                                .take(4)
                                .map(|n| n.to_string())
                                .collect(),
                            node_count: members[partition].len(),
                            start_in_s: start - now_s,
                            expected_utility: c.objective,
                            chosen: chosen_by_job.get(&job.id).is_some_and(|(cp, cs)| {
                                *cp == partition && (*cs - start).abs() < 1e-9
                            }),
                        })
                    }
                    _ => None,
                })
                .collect();
            options.sort_by(|a, b| {
                b.chosen
                    .cmp(&a.chosen)
                    .then(b.expected_utility.total_cmp(&a.expected_utility))
                    .then(a.start_in_s.total_cmp(&b.start_in_s))
            });
            options.truncate(8);
            // Set where the operator's reason names other jobs.
            let mut reason_for_app = None;
            let reason = if let Some(r) = not_enacted.get(&job.id) {
                (*r).to_string()
            } else if job.choices.is_empty() {
                "no node satisfies the job's required node constraints".to_string()
            } else if options.is_empty() {
                if job
                    .choices
                    .iter()
                    .all(|c| f64::from(job.gang) > partitions[c.partition].capacity)
                {
                    format!(
                        "its gang ({} slots) is larger than every equivalence set it may use",
                        job.gang
                    )
                } else {
                    "no start in the plan-ahead window has a positive expected utility (by its \
                     runtime distribution it cannot finish in time)"
                        .to_string()
                }
            } else {
                let gang = f64::from(job.gang);
                let room_now = job
                    .choices
                    .iter()
                    .map(|c| model.model.rows[c.partition * model.starts.len()].upper)
                    .fold(0.0, f64::max);
                let reserved = job
                    .choices
                    .iter()
                    .map(|c| reserved_now[c.partition])
                    .fold(0.0, f64::max);
                let other = job
                    .choices
                    .iter()
                    .map(|c| other_now[c.partition])
                    .fold(0.0, f64::max);
                let planned = chosen_by_job
                    .get(&job.id)
                    .map(|(_, start)| format!("; planned to start in {:.0} s", start - now_s))
                    .unwrap_or_default();
                if room_now + 1e-9 < gang {
                    if reserved > 0.0 && room_now + reserved + 1e-9 >= gang {
                        format!(
                            "a reservation: {reserved:.1} slots are held for reservations, \
                             {room_now:.1} are left, the job needs {gang}{planned}"
                        )
                    } else {
                        format!(
                            "capacity: {room_now:.1} slots are left now after running work \
                             ({other:.1} slots of other GUARANTEED work and the expected use of \
                             running 3Sigma jobs), the job needs {gang}{planned}"
                        )
                    }
                } else {
                    let better: Vec<u64> = job
                        .choices
                        .iter()
                        .flat_map(|c| step0_users.get(&c.partition).cloned().unwrap_or_default())
                        .filter(|k| *k != job.id)
                        .collect();
                    if better.is_empty() {
                        format!(
                            "waiting is worth more: the highest expected utility is a later \
                             start{planned}"
                        )
                    } else {
                        let mut named: Vec<String> = better
                            .iter()
                            .take(BETTER_JOBS_NAMED)
                            .map(|k| format!("ask {k}"))
                            .collect();
                        if better.len() > BETTER_JOBS_NAMED {
                            named.push(format!("{} more", better.len() - BETTER_JOBS_NAMED));
                        }
                        reason_for_app = Some(format!(
                            "a better-valued job: the room now went to {} other job{} (higher \
                             total expected utility){planned}",
                            better.len(),
                            if better.len() == 1 { "" } else { "s" }
                        ));
                        format!(
                            "a better-valued job: the room now went to {} (higher total expected \
                             utility){planned}",
                            named.join(", ")
                        )
                    }
                }
            };
            waiting.explanation = Some(Explanation {
                cycle_ms,
                options,
                reason_for_app: reason_for_app.unwrap_or_else(|| reason.clone()),
                reason,
            });
        }
        let report = LiveCycleReport {
            record: decision.record.clone(),
            started_jobs: started,
            deferred_jobs: decision.deferred.len() + decision.start_now.len() - start_now.len(),
            not_enacted: not_enacted.len(),
            pending_jobs: live.waiting.len(),
        };
        live.last_record = Some(decision.record);
        (placements, report)
    }

    /// Snapshot, solve and apply on this thread.
    pub fn run_threesigma_cycle(
        &mut self,
        now_ms: u64,
    ) -> Option<(Vec<GuaranteedPlacement>, LiveCycleReport)> {
        let cycle = self.prepare_threesigma_cycle(now_ms)?;
        Some(self.apply_threesigma_cycle(cycle.solve(), now_ms))
    }

    /// Grant every container of waiting job `ask_key` on `members`, or none. Each container
    /// goes where the guarantor's placer puts a plain GUARANTEED container (with the
    /// QUEUEABLE-aware placer: least QUEUEABLE work preempted or delayed, then best fit), among
    /// the members it fits on after the gang's earlier containers.
    fn place_gang(
        &mut self,
        now_ms: u64,
        ask_key: u64,
        members: &[NodeId],
    ) -> Option<Vec<GuaranteedPlacement>> {
        let live = self.threesigma.as_ref()?;
        let index = live.waiting.iter().position(|w| w.ask.ask_key == ask_key)?;
        let ask = live.waiting[index].ask.clone();
        // Plan on copies of the member nodes first: all or nothing.
        let mut planned: Vec<GuarantorNode> = members
            .iter()
            .filter(|id| !self.closed().contains(id))
            .filter_map(|id| self.nodes.get(id).cloned())
            .collect();
        planned.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        let mut chosen = Vec::with_capacity(ask.count as usize);
        let mut plain = Resources::ZERO;
        for _ in 0..ask.count {
            plain = plain.saturating_add(&ask.resources);
            if !self
                .reservations
                .admits_plain(now_ms, &plain, ask.runtime_estimate_ms)
            {
                return None;
            }
            let fitting: Vec<usize> = (0..planned.len())
                .filter(|&i| ask.resources.fits_in(&planned[i].free()))
                .collect();
            let candidates: Vec<&GuarantorNode> = fitting.iter().map(|&i| &planned[i]).collect();
            let pick = fitting[self.placer.choose(&ask, &candidates)?];
            let node = &mut planned[pick];
            node.guaranteed = node.guaranteed.saturating_add(&ask.resources);
            chosen.push(node.node_id.clone());
        }
        let live = self.threesigma.as_mut()?;
        let waiting = live.waiting.remove(index);
        let mut out = Vec::with_capacity(chosen.len());
        let mut remaining = ask.count;
        let mut containers = HashSet::new();
        for node in &chosen {
            remaining -= 1;
            let placement = self.grant(now_ms, &ask, node.clone(), remaining, None);
            containers.insert(placement.token_body.container_id);
            out.push(placement);
        }
        let live = self.threesigma.as_mut()?;
        for id in &containers {
            live.container_job.insert(*id, ask_key);
        }
        live.running.insert(
            ask_key,
            RunningLiveJob {
                app_id: ask.app_id.clone(),
                job_id: ask.job_id.clone(),
                features: waiting.description.features.clone(),
                utility: waiting.description.utility,
                belief: waiting.belief,
                slots_per_container: live.config.container_slots(&ask.resources),
                submit_ms: (waiting.submit_s * 1000.0) as u64,
                start_ms: now_ms,
                containers,
                nodes: chosen,
                aborted: false,
            },
        );
        Some(out)
    }

    /// A GUARANTEED grant ended (`unstarted`: before its node started it). When it was the
    /// last container of a 3Sigma job, the job is complete.
    pub(super) fn threesigma_grant_ended(&mut self, id: ContainerId, unstarted: bool) {
        let now_ms = self.clock_ms;
        let Some(live) = &mut self.threesigma else {
            return;
        };
        let Some(key) = live.container_job.remove(&id) else {
            return;
        };
        let Some(job) = live.running.get_mut(&key) else {
            return;
        };
        job.containers.remove(&id);
        job.aborted |= unstarted;
        if !job.containers.is_empty() {
            return;
        }
        let job = live.running.remove(&key).expect("present above");
        let finish_s = secs(now_ms);
        let slo_met = match job.utility {
            Utility::Slo { deadline, .. } | Utility::SloDecaying { deadline, .. } => {
                Some(finish_s <= deadline)
            }
            Utility::BestEffort { .. } => None,
        };
        let completed = CompletedJob {
            app_id: job.app_id,
            job_id: job.job_id,
            ask_key: key,
            features: job.features,
            submit_ms: job.submit_ms,
            start_ms: job.start_ms,
            finish_ms: now_ms,
            runtime_s: secs(now_ms.saturating_sub(job.start_ms)),
            slo_met,
            utility_earned: job.utility.value_at(finish_s),
            aborted: job.aborted,
        };
        if !completed.aborted {
            let a = &mut live.attainment;
            let per = a.per_app.entry(completed.app_id.to_string()).or_default();
            match slo_met {
                Some(true) => {
                    a.slo_met += 1;
                    per.slo_met += 1;
                }
                Some(false) => {
                    a.slo_missed += 1;
                    per.slo_missed += 1;
                }
                None => {
                    a.best_effort_finished += 1;
                    per.best_effort_finished += 1;
                }
            }
            per.attainment = ratio(per.slo_met, per.slo_missed);
            a.attainment = ratio(a.slo_met, a.slo_missed);
            a.recent.push(completed.clone());
            let keep = live.config.recent_finished;
            if a.recent.len() > keep {
                let drop = a.recent.len() - keep;
                a.recent.drain(..drop);
            }
        }
        live.completed.push(completed);
    }

    /// 3Sigma jobs completed since the last call (the caller learns and persists them).
    pub fn take_completed_jobs(&mut self) -> Vec<CompletedJob> {
        self.threesigma
            .as_mut()
            .map(|l| std::mem::take(&mut l.completed))
            .unwrap_or_default()
    }

    /// SLO attainment of the 3Sigma jobs finished since the coordinator started.
    pub fn slo_attainment(&self) -> Option<&SloAttainment> {
        self.threesigma.as_ref().map(|l| &l.attainment)
    }

    /// The last cycle's record (size, bound, objective, method).
    pub fn last_threesigma_record(&self) -> Option<&CycleRecord> {
        self.threesigma.as_ref()?.last_record.as_ref()
    }

    /// `explain` for waiting 3Sigma jobs (the operator's): `filter` picks by ask key or job id
    /// (all when `None`), at most `limit` of them in queue order.
    pub fn explain_jobs(&self, filter: Option<&str>, limit: usize) -> Vec<JobExplanation> {
        let Some(live) = &self.threesigma else {
            return Vec::new();
        };
        live.waiting
            .iter()
            .filter(|w| {
                filter.is_none_or(|f| w.ask.job_id.as_str() == f || w.ask.ask_key.to_string() == f)
            })
            .take(limit)
            .map(|w| w.explained(false))
            .collect()
    }

    /// `explain` on the app protocol: app `app_id`'s own waiting 3Sigma jobs of id `job_id`, at
    /// most `limit`, with other jobs only counted in the reason.
    pub fn explain_app_jobs(
        &self,
        app_id: &str,
        job_id: &str,
        limit: usize,
    ) -> Vec<JobExplanation> {
        let Some(live) = &self.threesigma else {
            return Vec::new();
        };
        live.waiting
            .iter()
            .filter(|w| w.ask.app_id.as_str() == app_id && w.ask.job_id.as_str() == job_id)
            .take(limit)
            .map(|w| w.explained(true))
            .collect()
    }
}

impl WaitingJob {
    fn explained(&self, for_app: bool) -> JobExplanation {
        let (cycle_at_ms, options, reason) = match &self.explanation {
            Some(e) => (
                Some(e.cycle_ms),
                e.options.clone(),
                if for_app {
                    e.reason_for_app.clone()
                } else {
                    e.reason.clone()
                },
            ),
            None => (
                None,
                Vec::new(),
                "submitted after the last 3Sigma cycle: planned at the next".to_string(),
            ),
        };
        JobExplanation {
            ask_key: self.ask.ask_key,
            app_id: self.ask.app_id.clone(),
            job_id: self.ask.job_id.clone(),
            gang: self.ask.count,
            resources: self.ask.resources,
            utility: self.description.utility,
            belief: BeliefSummary::of(&self.belief, self.belief_source.clone()),
            cycle_at_ms,
            options,
            reason,
        }
    }
}

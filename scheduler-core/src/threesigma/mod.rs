//! 3σSched (3Sigma, EuroSys '18, §3–§4): each cycle, a MILP over the pending jobs' placement
//! options (equivalence set × start time in the plan-ahead window) maximising expected utility
//! (Eq. 1) under capacity rows weighted by expected resource consumption (§3.2, Eq. 3), with
//! preemption of running work at a cost (§4.3.5) and the previous cycle's decision as a warm
//! start (§4.3.6).
//!
//! The solve is designed for what was measured on this machine: HiGHS finds no integer point in
//! 0.2 s on models of this size, while the LP relaxation plus LP-guided rounding reaches 95–96 %
//! of the bound. So a cycle is: LP relaxation → rounding guided by the LP values → greedy fill
//! by utility density → the better of that and the repaired warm start → MILP improvement from
//! that point if time remains. Every path ends with a selection checked row by row, and the
//! record says which path produced it and the LP bound.
//!
//! The point-estimate baselines of §6 (PointPerfEst, PointRealEst) are this scheduler fed point
//! beliefs without over-estimate handling; Prio ([`PrioScheduler`]) has no runtime knowledge.

mod belief;
pub mod highs_solver;
pub mod model;
mod partition;
mod prio;

pub use belief::{BeliefPiece, OverEstimateHandling, RuntimeBelief, Utility, exp_inc_finish};
pub use highs_solver::HighsSolver;
pub use model::{
    BasisStatus, Column, ColumnKind, FEASIBILITY_TOLERANCE, LpBasis, LpSolution, MilpModel,
    MilpSolver, MipSolution, Row, RowKind, SolveLimit, SolverError,
};
pub use partition::{JobDescription, NodeConstraint, Partitioning, equivalence_partitions};
pub use prio::PrioScheduler;

pub use crate::guarantor::threesigma_live::{
    AppAttainment, BeliefSummary, CompletedJob, ConsideredOption, JobExplanation, LiveCycle,
    LiveCycleReport, LiveThreeSigma, LiveThreeSigmaConfig, SloAttainment, SolvedCycle,
};

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Bad input to 3σSched.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ThreeSigmaError {
    #[error("a runtime belief needs at least one runtime")]
    EmptyBelief,
    #[error("runtime {0} is not a finite positive number of seconds")]
    BadRuntime(f64),
    #[error("runtime belief: {0}")]
    BadBelief(String),
    #[error("job description: {0}")]
    BadDescription(String),
    #[error("config: {0}")]
    BadConfig(String),
}

/// 3σSched's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreeSigmaConfig {
    /// Scheduling interval (§4.3.1: "1-2s").
    pub cycle_s: f64,
    /// Spacing of start times and capacity rows in the plan-ahead window.
    pub step_s: f64,
    /// Start times per option set (and capacity rows per partition): the plan-ahead window is
    /// `starts × step_s`.
    pub starts: usize,
    /// Solver time per cycle as a fraction of the cycle (§4.3.6: "a configurable fraction of its
    /// scheduling interval").
    pub time_limit_fraction: f64,
    /// Share of the solver time given to the LP relaxation; the rest goes to MILP improvement.
    /// The LP is what every decision stands on (LP rounding reaches 97–98 % of its bound, while
    /// HiGHS' MILP finds no integer point of its own in a cycle's time), so it gets most of it.
    pub lp_share: f64,
    /// Try HiGHS' MILP from the rounded point when time remains.
    pub mip_improvement: bool,
    /// Adaptive over-estimate handling (§4.2.3); `None` for the point-estimate baselines.
    pub over_estimate: Option<OverEstimateHandling>,
    /// Consider preempting running preemptible jobs (§4.3.5).
    pub preemption: bool,
    /// Preemption cost as a multiple of the running job's expected utility (§4.3.5 leaves the
    /// cost to the preemption policy; losing the job's expected value is the natural price).
    pub preemption_cost_factor: f64,
    /// What bounds the solver each cycle.
    #[serde(default)]
    pub solver_budget: SolverBudget,
}

/// What bounds the solver's effort in a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SolverBudget {
    /// Wall-clock time: `time_limit_fraction` of the cycle, `lp_share` of it for the LP
    /// relaxation (§4.3.6). What a live scheduler must do; the decision then depends on how fast
    /// the machine is at that moment.
    #[default]
    WallClock,
    /// Work: at most `lp_simplex_iterations` simplex iterations for the LP relaxation and
    /// `mip_nodes` branch-and-bound nodes for the MILP improvement (0: none), and no time limit.
    /// The same input gives the same decision on any machine under any load, so simulations
    /// use it; their cycle times are still measured and reported.
    Work {
        lp_simplex_iterations: u64,
        mip_nodes: u64,
    },
}

impl Default for ThreeSigmaConfig {
    fn default() -> Self {
        Self {
            cycle_s: 1.0,
            step_s: 60.0,
            starts: 16,
            time_limit_fraction: 0.2,
            lp_share: 0.85,
            mip_improvement: true,
            over_estimate: Some(OverEstimateHandling::default()),
            preemption: true,
            preemption_cost_factor: 1.0,
            solver_budget: SolverBudget::WallClock,
        }
    }
}

impl ThreeSigmaConfig {
    /// The point-estimate baselines of §6: same MILP, no over-estimate handling (Table 1).
    pub fn point_estimate() -> Self {
        Self {
            over_estimate: None,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), ThreeSigmaError> {
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.cycle_s) || !positive(self.step_s) {
            return Err(ThreeSigmaError::BadConfig(
                "cycle_s and step_s must be positive".into(),
            ));
        }
        if self.starts == 0 || self.starts > 1024 {
            return Err(ThreeSigmaError::BadConfig(format!(
                "starts must be in 1..=1024, got {}",
                self.starts
            )));
        }
        if !(0.0..=1.0).contains(&self.time_limit_fraction) || !(0.0..=1.0).contains(&self.lp_share)
        {
            return Err(ThreeSigmaError::BadConfig(
                "time_limit_fraction and lp_share must be in [0, 1]".into(),
            ));
        }
        if let SolverBudget::Work {
            lp_simplex_iterations: 0,
            ..
        } = self.solver_budget
        {
            return Err(ThreeSigmaError::BadConfig(
                "a work budget needs at least one LP simplex iteration".into(),
            ));
        }
        Ok(())
    }
}

/// A partition of the cluster (an equivalence set's building block, §4.3.3) as one cycle sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Container slots in the partition.
    pub capacity: f64,
    /// Slots held by reservations at each window step (missing steps: none).
    pub reserved: Vec<f64>,
}

/// One partition a job may run in and how much slower it runs there (§5: non-preferred
/// resources, 1.5×).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PartitionChoice {
    pub partition: usize,
    pub runtime_factor: f64,
}

/// A job waiting for placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingJob {
    pub id: u64,
    pub submit: f64,
    pub utility: Utility,
    /// Containers, all started together (gang).
    pub gang: u32,
    /// Runtime belief on the job's preferred resources.
    pub belief: RuntimeBelief,
    pub choices: Vec<PartitionChoice>,
}

/// A job holding resources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningJob {
    pub id: u64,
    pub partition: usize,
    pub gang: u32,
    pub started: f64,
    /// Belief about its total runtime where it runs (conditioned each cycle, Eq. 2).
    pub belief: RuntimeBelief,
    pub utility: Utility,
    pub preemptible: bool,
}

/// Everything one cycle decides over.
#[derive(Debug, Clone, Copy)]
pub struct CycleInput<'a> {
    pub now: f64,
    pub partitions: &'a [PartitionState],
    pub pending: &'a [PendingJob],
    pub running: &'a [RunningJob],
}

/// A chosen option.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub job: u64,
    pub partition: usize,
    pub start: f64,
    pub expected_utility: f64,
}

/// How a cycle's decision was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionMethod {
    /// Nothing to decide.
    Empty,
    /// LP relaxation, LP-guided rounding and greedy fill.
    LpRounding,
    /// The previous cycle's decision (repaired and filled) beat the rounding.
    WarmStart,
    /// HiGHS' MILP improved on the rounded point within the time limit.
    MilpImproved,
    /// The LP gave no answer: greedy by utility density.
    GreedyFallback,
    /// No solver: strict priority (Prio).
    Priority,
}

/// What a cycle reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CycleRecord {
    pub now: f64,
    pub method: DecisionMethod,
    pub pending: usize,
    pub columns: usize,
    pub rows: usize,
    pub nonzeros: usize,
    /// The LP relaxation's optimum (an upper bound), when the LP was solved; when its time
    /// limit stopped it (`lp_stopped_early`), the solver's Lagrangian bound (larger).
    pub lp_bound: Option<f64>,
    /// Objective of the rounded LP point alone (before warm start and MILP improvement).
    pub rounded_objective: Option<f64>,
    /// Objective of the decision.
    pub objective: f64,
    /// Why the LP or the MILP gave no answer, when that happened.
    pub note: Option<String>,
    /// Simplex iterations of the LP relaxation, when it was solved.
    #[serde(default)]
    pub lp_iterations: Option<u64>,
    /// The LP relaxation's time limit ended it before it was optimal: the decision rounds the
    /// best feasible point the solver had, and `lp_bound` is a Lagrangian upper bound (≥ the
    /// LP's optimum) rather than the optimum.
    #[serde(default)]
    pub lp_stopped_early: bool,
}

/// A cycle's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CycleDecision {
    /// Start these now.
    pub start_now: Vec<Placement>,
    /// Planned for later in the window (re-planned next cycle).
    pub deferred: Vec<Placement>,
    /// Preempt these running jobs now.
    pub preempt: Vec<u64>,
    pub record: CycleRecord,
}

/// A scheduling policy run once per cycle: 3σSched, the point baselines and Prio.
pub trait CyclePolicy {
    fn name(&self) -> &str;
    fn cycle(&mut self, input: &CycleInput<'_>) -> CycleDecision;
}

/// The MILP of one cycle with what is needed to read its columns back.
#[derive(Debug, Clone)]
pub struct CycleModel {
    pub model: MilpModel,
    /// Start time of each window step.
    pub starts: Vec<f64>,
}

/// Build the cycle's MILP (§4.3.3–§4.3.5).
pub fn build_model(config: &ThreeSigmaConfig, input: &CycleInput<'_>) -> CycleModel {
    let steps = config.starts;
    let starts: Vec<f64> = (0..steps)
        .map(|i| input.now + i as f64 * config.step_s)
        .collect();
    let mut model = MilpModel::default();
    let capacity_row = |partition: usize, step: usize| partition * steps + step;
    // Capacity rows: what the partition holds minus reservations and the expected consumption
    // of running work (§3.2). A row already over-committed (reservations over what running work
    // leaves) gets bound zero and no preemption credit: nothing new goes there, and the empty
    // decision stays feasible.
    let mut running_usage = vec![vec![0.0; steps]; input.partitions.len()];
    let conditioned: Vec<RuntimeBelief> = input
        .running
        .iter()
        .map(|r| {
            r.belief
                .conditioned((input.now - r.started).max(0.0), config.cycle_s)
        })
        .collect();
    for (r, belief) in input.running.iter().zip(&conditioned) {
        if let Some(usage) = running_usage.get_mut(r.partition) {
            for (step, at) in starts.iter().enumerate() {
                usage[step] += f64::from(r.gang) * belief.survival(at - r.started);
            }
        }
    }
    let mut over_committed = Vec::with_capacity(input.partitions.len() * steps);
    for (p, partition) in input.partitions.iter().enumerate() {
        for (step, used) in running_usage[p].iter().enumerate() {
            let reserved = partition.reserved.get(step).copied().unwrap_or(0.0);
            let left = partition.capacity - reserved - used;
            over_committed.push(left < -FEASIBILITY_TOLERANCE);
            model.rows.push(Row {
                kind: RowKind::Capacity { partition: p, step },
                upper: left.max(0.0),
            });
        }
    }
    for job in 0..input.pending.len() {
        model.rows.push(Row {
            kind: RowKind::OneOption { job },
            upper: 1.0,
        });
    }
    let job_row = |job: usize| input.partitions.len() * steps + job;
    for (j, job) in input.pending.iter().enumerate() {
        let gang = f64::from(job.gang);
        for choice in &job.choices {
            let Some(partition) = input.partitions.get(choice.partition) else {
                continue;
            };
            if gang > partition.capacity {
                continue;
            }
            let belief = if (choice.runtime_factor - 1.0).abs() > 1e-12 {
                job.belief.scaled(choice.runtime_factor)
            } else {
                job.belief.clone()
            };
            let utility = match &config.over_estimate {
                Some(handling) => handling.adjust(job.utility, &job.belief, job.submit),
                None => job.utility,
            };
            for (step, start) in starts.iter().enumerate() {
                let value = belief.expected_utility(&utility, *start);
                // §4.3.6: prune terms with a zero constant.
                if value <= 1e-9 {
                    continue;
                }
                let mut entries = Vec::with_capacity(steps - step + 1);
                for (later, at) in starts.iter().enumerate().skip(step) {
                    let still_running = belief.survival(at - start);
                    if still_running <= 0.0 {
                        break;
                    }
                    entries.push((capacity_row(choice.partition, later), gang * still_running));
                }
                entries.push((job_row(j), 1.0));
                model.columns.push(Column {
                    kind: ColumnKind::Option {
                        job: j,
                        partition: choice.partition,
                        step,
                    },
                    objective: value,
                    entries,
                });
            }
        }
    }
    if config.preemption {
        for (r, (running, belief)) in input.running.iter().zip(&conditioned).enumerate() {
            if !running.preemptible || running.partition >= input.partitions.len() {
                continue;
            }
            let gang = f64::from(running.gang);
            let entries: Vec<(usize, f64)> = starts
                .iter()
                .enumerate()
                .map(|(step, at)| {
                    (
                        capacity_row(running.partition, step),
                        -gang * belief.survival(at - running.started),
                    )
                })
                .filter(|(row, coef)| *coef < 0.0 && !over_committed[*row])
                .collect();
            if entries.is_empty() {
                continue;
            }
            let value = belief.expected_utility(&running.utility, running.started);
            model.columns.push(Column {
                kind: ColumnKind::Preempt { running: r },
                objective: -config.preemption_cost_factor * value,
                entries,
            });
        }
    }
    CycleModel { model, starts }
}

/// Incremental 0/1 selection over a model with row activities kept up to date.
struct Selection<'m> {
    model: &'m MilpModel,
    chosen: Vec<bool>,
    activity: Vec<f64>,
    job_taken: Vec<bool>,
}

impl<'m> Selection<'m> {
    fn new(model: &'m MilpModel, jobs: usize) -> Self {
        Self {
            model,
            chosen: vec![false; model.columns.len()],
            activity: vec![0.0; model.rows.len()],
            job_taken: vec![false; jobs],
        }
    }

    fn fits(&self, column: usize) -> bool {
        self.model.columns[column]
            .entries
            .iter()
            .all(|(row, coef)| {
                self.activity[*row] + coef <= self.model.rows[*row].upper + FEASIBILITY_TOLERANCE
            })
    }

    fn set(&mut self, column: usize, on: bool) {
        if self.chosen[column] == on {
            return;
        }
        self.chosen[column] = on;
        let sign = if on { 1.0 } else { -1.0 };
        for (row, coef) in &self.model.columns[column].entries {
            self.activity[*row] += sign * coef;
        }
        if let ColumnKind::Option { job, .. } = self.model.columns[column].kind {
            self.job_taken[job] = on;
        }
    }

    /// Choose `column` if its job is free and every row stays within bounds.
    fn try_choose(&mut self, column: usize) -> bool {
        if self.chosen[column] {
            return true;
        }
        if let ColumnKind::Option { job, .. } = self.model.columns[column].kind
            && self.job_taken[job]
        {
            return false;
        }
        if !self.fits(column) {
            return false;
        }
        self.set(column, true);
        true
    }

    /// Greedy by utility density: expected utility per container, earlier starts first among
    /// equals. (Per slot-step inside the window would favour late starts, whose consumption the
    /// window cuts off.)
    fn fill_by_density(&mut self) {
        let mut order: Vec<(usize, f64, usize)> = self
            .model
            .columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c.kind {
                ColumnKind::Option { job, step, .. } if !self.job_taken[job] => {
                    // The first capacity entry is the gang (survival at the start is 1).
                    let gang = c
                        .entries
                        .iter()
                        .find(|(row, _)| {
                            matches!(self.model.rows[*row].kind, RowKind::Capacity { .. })
                        })
                        .map_or(1.0, |(_, coef)| *coef);
                    Some((i, c.objective / gang.max(1e-9), step))
                }
                _ => None,
            })
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
        for (column, _, _) in order {
            self.try_choose(column);
        }
    }

    /// §4.3.5 for the jobs the fill left out: a job with no option in the window may start now by
    /// preempting running preemptible work in the option's partition (cheapest first) when its
    /// value exceeds the preemption costs. Without this, a cycle that is not decided by the LP
    /// (greedy fallback) or whose LP took a preemption only fractionally could never preempt,
    /// and an SLO job whose deadline allows no later start would be lost to best-effort work
    /// that a preemption costs less than.
    fn preempt_for_unplaced(&mut self) {
        let partition_of_row = |row: usize| match self.model.rows[row].kind {
            RowKind::Capacity { partition, .. } => Some(partition),
            RowKind::OneOption { .. } => None,
        };
        // Preemption columns per partition, cheapest first.
        let mut victims: HashMap<usize, Vec<usize>> = HashMap::new();
        for (c, column) in self.model.columns.iter().enumerate() {
            if matches!(column.kind, ColumnKind::Preempt { .. })
                && let Some(partition) = column
                    .entries
                    .first()
                    .and_then(|(r, _)| partition_of_row(*r))
            {
                victims.entry(partition).or_default().push(c);
            }
        }
        for list in victims.values_mut() {
            list.sort_by(|a, b| {
                self.model.columns[*b]
                    .objective
                    .total_cmp(&self.model.columns[*a].objective)
                    .then(a.cmp(b))
            });
        }
        let mut order: Vec<(usize, f64)> = self
            .model
            .columns
            .iter()
            .enumerate()
            .filter_map(|(c, column)| match column.kind {
                ColumnKind::Option { job, step: 0, .. } if !self.job_taken[job] => {
                    Some((c, column.objective))
                }
                _ => None,
            })
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (column, value) in order {
            let ColumnKind::Option { job, partition, .. } = self.model.columns[column].kind else {
                continue;
            };
            if self.job_taken[job] {
                continue;
            }
            let Some(list) = victims.get(&partition) else {
                continue;
            };
            let mut taken = Vec::new();
            let mut cost = 0.0;
            for &victim in list {
                if self.fits(column) || cost - self.model.columns[victim].objective >= value {
                    break;
                }
                if self.chosen[victim] {
                    continue;
                }
                self.set(victim, true);
                cost -= self.model.columns[victim].objective;
                taken.push(victim);
            }
            if self.fits(column) && value > cost + 1e-9 {
                self.set(column, true);
            } else {
                for victim in taken {
                    self.set(victim, false);
                }
            }
        }
    }

    /// Drop every preemption whose credit no row needs.
    fn drop_needless_preemptions(&mut self) {
        for column in 0..self.chosen.len() {
            if self.chosen[column]
                && matches!(self.model.columns[column].kind, ColumnKind::Preempt { .. })
            {
                self.set(column, false);
                if self.violated() {
                    self.set(column, true);
                }
            }
        }
    }

    fn violated(&self) -> bool {
        self.activity
            .iter()
            .zip(&self.model.rows)
            .any(|(a, row)| *a > row.upper + FEASIBILITY_TOLERANCE)
    }
}

/// LP-guided rounding (what the cycle relies on, see the module doc): preemptions the LP takes
/// at ≥ ½, then options by decreasing LP value, then the greedy fill, then needless
/// preemptions dropped. Never violates a row.
pub fn round_lp(model: &MilpModel, jobs: usize, lp_values: &[f64]) -> Vec<bool> {
    let mut selection = Selection::new(model, jobs);
    for (column, value) in lp_values.iter().enumerate() {
        if *value >= 0.5 && matches!(model.columns[column].kind, ColumnKind::Preempt { .. }) {
            selection.set(column, true);
        }
    }
    let mut order: Vec<usize> = (0..model.columns.len())
        .filter(|c| {
            lp_values.get(*c).copied().unwrap_or(0.0) > 1e-6
                && matches!(model.columns[*c].kind, ColumnKind::Option { .. })
        })
        .collect();
    order.sort_by(|a, b| {
        lp_values[*b]
            .total_cmp(&lp_values[*a])
            .then(
                model.columns[*b]
                    .objective
                    .total_cmp(&model.columns[*a].objective),
            )
            .then(a.cmp(b))
    });
    for column in order {
        selection.try_choose(column);
    }
    selection.fill_by_density();
    selection.preempt_for_unplaced();
    selection.drop_needless_preemptions();
    selection.chosen
}

/// Work-conserving enactment: a planned later start moves to now when the job's option now is
/// worth as much (an SLO job's utility is flat up to its deadline, so the MILP is indifferent
/// between those starts and may plan any of them) and the selection still fits every row.
/// 3Sigma re-plans every cycle and enacts only the first step (§4.3.1): a job left for later
/// must find room again later, while room idle now is lost, so among equal plans the one that
/// starts work now is taken. Earlier planned starts move first.
pub fn pull_forward(model: &MilpModel, jobs: usize, chosen: &mut [bool]) {
    let mut now_column: HashMap<(usize, usize), usize> = HashMap::new();
    let mut later: Vec<(usize, usize)> = Vec::new();
    for (c, column) in model.columns.iter().enumerate() {
        if let ColumnKind::Option {
            job,
            partition,
            step,
        } = column.kind
        {
            if step == 0 {
                now_column.insert((job, partition), c);
            } else if chosen[c] {
                later.push((step, c));
            }
        }
    }
    if later.is_empty() {
        return;
    }
    later.sort_unstable();
    let mut selection = Selection::new(model, jobs);
    for (c, on) in chosen.iter().enumerate() {
        if *on {
            selection.set(c, true);
        }
    }
    for (_, from) in later {
        let ColumnKind::Option { job, partition, .. } = model.columns[from].kind else {
            continue;
        };
        let Some(&to) = now_column.get(&(job, partition)) else {
            continue;
        };
        if model.columns[to].objective + 1e-9 < model.columns[from].objective {
            continue;
        }
        selection.set(from, false);
        if selection.fits(to) {
            selection.set(to, true);
        } else {
            selection.set(from, true);
        }
    }
    chosen.copy_from_slice(&selection.chosen);
}

/// Greedy by utility density without an LP (the fallback), then preemption for the jobs it
/// left out when their value exceeds the cost.
pub fn greedy(model: &MilpModel, jobs: usize) -> Vec<bool> {
    let mut selection = Selection::new(model, jobs);
    selection.fill_by_density();
    selection.preempt_for_unplaced();
    selection.drop_needless_preemptions();
    selection.chosen
}

/// 3σSched over a [`MilpSolver`].
pub struct ThreeSigmaScheduler<S> {
    name: String,
    config: ThreeSigmaConfig,
    solver: S,
    /// The previous cycle's options: job id → (partition, absolute start).
    previous: HashMap<u64, (usize, f64)>,
    /// The previous cycle's LP basis by job and running-job ids (wall-clock budgets only).
    previous_lp: Option<PreviousLp>,
}

/// A model column by what it stands for across cycles: column indices change from cycle to
/// cycle, job ids and (partition, step of the window) do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ColumnKey {
    Option {
        job: u64,
        partition: usize,
        step: usize,
    },
    Preempt {
        running: u64,
    },
}

/// A model row by what it stands for across cycles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RowKey {
    Capacity { partition: usize, step: usize },
    Job(u64),
}

fn column_key(kind: ColumnKind, input: &CycleInput<'_>) -> ColumnKey {
    match kind {
        ColumnKind::Option {
            job,
            partition,
            step,
        } => ColumnKey::Option {
            job: input.pending[job].id,
            partition,
            step,
        },
        ColumnKind::Preempt { running } => ColumnKey::Preempt {
            running: input.running[running].id,
        },
    }
}

fn row_key(kind: RowKind, input: &CycleInput<'_>) -> RowKey {
    match kind {
        RowKind::Capacity { partition, step } => RowKey::Capacity { partition, step },
        RowKind::OneOption { job } => RowKey::Job(input.pending[job].id),
    }
}

/// §4.3.6's warm start for the LP relaxation: the last LP basis, kept by column and row keys.
/// Consecutive cycles share most pending jobs and all capacity rows; an option keeps its key
/// while its job waits (the same partition and step of the window, one cycle later), so most
/// of the previous basis maps onto the next model.
#[derive(Debug, Clone, Default)]
struct PreviousLp {
    columns: HashMap<ColumnKey, BasisStatus>,
    rows: HashMap<RowKey, BasisStatus>,
}

impl PreviousLp {
    fn of(model: &MilpModel, input: &CycleInput<'_>, basis: &LpBasis) -> Self {
        let columns = model
            .columns
            .iter()
            .zip(&basis.columns)
            .filter_map(|(c, status)| Some((column_key(c.kind, input), (*status)?)))
            .collect();
        let rows = model
            .rows
            .iter()
            .zip(&basis.rows)
            .filter_map(|(r, status)| Some((row_key(r.kind, input), (*status)?)))
            .collect();
        Self { columns, rows }
    }

    /// This basis on `model`'s columns and rows (`None` where the previous model had none).
    fn on(&self, model: &MilpModel, input: &CycleInput<'_>) -> LpBasis {
        LpBasis {
            columns: model
                .columns
                .iter()
                .map(|c| self.columns.get(&column_key(c.kind, input)).copied())
                .collect(),
            rows: model
                .rows
                .iter()
                .map(|r| self.rows.get(&row_key(r.kind, input)).copied())
                .collect(),
        }
    }
}

impl<S: MilpSolver> ThreeSigmaScheduler<S> {
    pub fn new(
        name: impl Into<String>,
        config: ThreeSigmaConfig,
        solver: S,
    ) -> Result<Self, ThreeSigmaError> {
        config.validate()?;
        Ok(Self {
            name: name.into(),
            config,
            solver,
            previous: HashMap::new(),
            previous_lp: None,
        })
    }

    pub fn config(&self) -> &ThreeSigmaConfig {
        &self.config
    }

    /// §4.3.6: the previous decision, mapped onto this cycle's columns, repaired (options that
    /// no longer fit dropped) and filled greedily.
    fn warm_start(&self, cycle: &CycleModel, input: &CycleInput<'_>) -> Vec<bool> {
        let model = &cycle.model;
        let mut selection = Selection::new(model, input.pending.len());
        if self.previous.is_empty() {
            return selection.chosen;
        }
        let mut wanted: Vec<usize> = model
            .columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c.kind {
                ColumnKind::Option {
                    job,
                    partition,
                    step,
                } => {
                    let (was_partition, was_start) = *self.previous.get(&input.pending[job].id)?;
                    let target = ((was_start - input.now) / self.config.step_s)
                        .round()
                        .clamp(0.0, (self.config.starts - 1) as f64)
                        as usize;
                    (was_partition == partition && target == step).then_some(i)
                }
                ColumnKind::Preempt { .. } => None,
            })
            .collect();
        wanted.sort_by(|a, b| {
            model.columns[*b]
                .objective
                .total_cmp(&model.columns[*a].objective)
        });
        for column in wanted {
            selection.try_choose(column);
        }
        selection.fill_by_density();
        selection.chosen
    }

    /// The limits of the LP relaxation and of the MILP improvement.
    fn solve_limits(&self) -> (SolveLimit, SolveLimit) {
        match self.config.solver_budget {
            SolverBudget::WallClock => {
                let budget = self.config.cycle_s * self.config.time_limit_fraction;
                let lp = budget * self.config.lp_share;
                (SolveLimit::time(lp), SolveLimit::time(budget - lp))
            }
            SolverBudget::Work {
                lp_simplex_iterations,
                mip_nodes,
            } => (
                SolveLimit {
                    time_s: None,
                    simplex_iterations: Some(lp_simplex_iterations),
                    mip_nodes: None,
                },
                SolveLimit {
                    time_s: None,
                    simplex_iterations: None,
                    mip_nodes: Some(mip_nodes),
                },
            ),
        }
    }

    /// Run one cycle and return the model as well (benchmarks and `explain`).
    pub fn cycle_with_model(&mut self, input: &CycleInput<'_>) -> (CycleDecision, CycleModel) {
        let cycle = build_model(&self.config, input);
        let model = &cycle.model;
        let jobs = input.pending.len();
        let mut record = CycleRecord {
            now: input.now,
            method: DecisionMethod::Empty,
            pending: jobs,
            columns: model.columns.len(),
            rows: model.rows.len(),
            nonzeros: model.nonzeros(),
            lp_bound: None,
            rounded_objective: None,
            objective: 0.0,
            note: None,
            lp_iterations: None,
            lp_stopped_early: false,
        };
        if model.columns.is_empty() {
            self.previous.clear();
            self.previous_lp = None;
            let decision = CycleDecision {
                start_now: Vec::new(),
                deferred: Vec::new(),
                preempt: Vec::new(),
                record,
            };
            return (decision, cycle);
        }
        let (lp_limit, mip_limit) = self.solve_limits();
        // §4.3.6: under a wall-clock budget the LP starts from the previous cycle's basis.
        // A work budget (the simulator's) solves every cycle's LP from scratch, as before, so
        // its decisions do not depend on the cycles before beyond the warm-start decision.
        let warm_lp = matches!(self.config.solver_budget, SolverBudget::WallClock);
        let relaxation = match self.previous_lp.as_ref().filter(|_| warm_lp) {
            Some(previous) => {
                let start = previous.on(model, input);
                self.solver.solve_relaxation_from(model, lp_limit, &start)
            }
            None => self.solver.solve_relaxation(model, lp_limit),
        };
        if warm_lp && let Ok(lp) = &relaxation {
            // After a failed LP the older basis is kept: it is still the best start known.
            self.previous_lp = lp.basis.as_ref().map(|b| PreviousLp::of(model, input, b));
        }
        let (mut best, mut method) = match relaxation {
            Ok(lp) => {
                record.lp_bound = Some(lp.bound);
                record.lp_iterations = Some(lp.iterations);
                let rounded = round_lp(model, jobs, &lp.values);
                record.rounded_objective = Some(model.objective(&rounded));
                if lp.optimal {
                    (rounded, DecisionMethod::LpRounding)
                } else {
                    // The time limit stopped the LP: its best point is rounded, and the greedy
                    // (what such a cycle did before) is kept when it is worth more, so
                    // rounding a point short of the optimum never decides worse than that.
                    record.lp_stopped_early = true;
                    record.note = Some(
                        "LP relaxation stopped at its time limit: its best feasible point rounded"
                            .into(),
                    );
                    let fallback = greedy(model, jobs);
                    if model.objective(&fallback) > model.objective(&rounded) + 1e-9 {
                        (fallback, DecisionMethod::GreedyFallback)
                    } else {
                        (rounded, DecisionMethod::LpRounding)
                    }
                }
            }
            Err(e) => {
                record.note = Some(e.to_string());
                (greedy(model, jobs), DecisionMethod::GreedyFallback)
            }
        };
        let warm = self.warm_start(&cycle, input);
        if model.objective(&warm) > model.objective(&best) + 1e-9 {
            best = warm;
            method = DecisionMethod::WarmStart;
        }
        // An LP its limit stopped has used its whole share of the solver time, and the MILP
        // improvement's own share is small next to what building HiGHS' MILP costs on such
        // models (1,000+ jobs: more than the 30 ms of the default config; docs/benchmarks.md
        // §8): such a cycle skips it, as a greedy fallback does.
        if self.config.mip_improvement
            && method != DecisionMethod::GreedyFallback
            && !record.lp_stopped_early
        {
            match self.solver.improve(model, &best, mip_limit) {
                Ok(Some(improved))
                    if model.violated_row(&improved.chosen).is_none()
                        && model.objective(&improved.chosen) > model.objective(&best) + 1e-9 =>
                {
                    best = improved.chosen;
                    method = DecisionMethod::MilpImproved;
                }
                Ok(_) => {}
                Err(e) => record.note = Some(e.to_string()),
            }
        }
        // Whatever path produced it, a decision that breaks a row is not enacted.
        if model.violated_row(&best).is_some() {
            record.note = Some("selection violated a row; greedy used".into());
            best = greedy(model, jobs);
            method = DecisionMethod::GreedyFallback;
        }
        pull_forward(model, jobs, &mut best);
        record.method = method;
        record.objective = model.objective(&best);
        let decision = self.decision_from(&cycle, input, &best, record);
        (decision, cycle)
    }

    fn decision_from(
        &mut self,
        cycle: &CycleModel,
        input: &CycleInput<'_>,
        chosen: &[bool],
        record: CycleRecord,
    ) -> CycleDecision {
        let mut start_now = Vec::new();
        let mut deferred = Vec::new();
        let mut preempt_columns = Vec::new();
        self.previous.clear();
        for (column, on) in cycle.model.columns.iter().zip(chosen) {
            if !on {
                continue;
            }
            match column.kind {
                ColumnKind::Option {
                    job,
                    partition,
                    step,
                } => {
                    let placement = Placement {
                        job: input.pending[job].id,
                        partition,
                        start: cycle.starts[step],
                        expected_utility: column.objective,
                    };
                    self.previous
                        .insert(placement.job, (partition, placement.start));
                    if step == 0 {
                        start_now.push(placement);
                    } else {
                        deferred.push(placement);
                    }
                }
                ColumnKind::Preempt { running } => preempt_columns.push(running),
            }
        }
        // A preemption is enacted only when this step's starts need its room (the step-0 row
        // of its partition would overflow without it); one that only serves a later start waits
        // for a later cycle to decide again.
        let gang_of = |id: u64| {
            input
                .pending
                .iter()
                .find(|j| j.id == id)
                .map_or(0.0, |j| f64::from(j.gang))
        };
        let mut preempt = Vec::new();
        for partition in 0..input.partitions.len() {
            let upper = cycle.model.rows[partition * self.config.starts].upper;
            let use_now: f64 = start_now
                .iter()
                .filter(|p| p.partition == partition)
                .map(|p| gang_of(p.job))
                .sum();
            let mut missing = use_now - upper;
            for running in &preempt_columns {
                if missing <= FEASIBILITY_TOLERANCE {
                    break;
                }
                let job = &input.running[*running];
                if job.partition == partition {
                    preempt.push(job.id);
                    missing -= f64::from(job.gang);
                }
            }
        }
        CycleDecision {
            start_now,
            deferred,
            preempt,
            record,
        }
    }
}

impl<S: MilpSolver> CyclePolicy for ThreeSigmaScheduler<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn cycle(&mut self, input: &CycleInput<'_>) -> CycleDecision {
        self.cycle_with_model(input).0
    }
}

#[cfg(test)]
mod tests;

//! `testbed experiment morpheus`: Morpheus (OSDI'16) §9 on the simulator, side by side on one
//! cluster and one workload.
//!
//! The run drives [`scheduler_core::guarantor::Guarantor`], the same core the live guarantor
//! actor calls, with a virtual clock: reservations are made with [`Guarantor::reserve`] (LowCost
//! or greedy in the plan, §6.3), jobs ask through [`Guarantor::submit_reserved`] (granted up to
//! the reservation's allocation at that moment), DRA is [`Guarantor::reprovision`] every `T`
//! (§7), plain GUARANTEED ad-hoc work is kept off reserved capacity by the guarantor's own gate,
//! and QUEUEABLE work runs in what GUARANTEED work leaves free on each node (the policing limit,
//! [`Guarantor::queueable_limit`]) and is preempted when a GUARANTEED grant needs the room. The
//! reservation requests come from SLO contracts through [`crate::reservations::definition_of`],
//! the conversion `testbed reservations submit` sends to a live coordinator, and the skylines
//! from the inference crate's skyline LP (§5).
//!
//! The Mercury engine ([`crate::sim`]) models node queues, heartbeats and distributed
//! schedulers task by task; Morpheus' experiment is at the granularity of the plan (60-s steps,
//! uniform containers, elastic jobs), so this driver steps the guarantor once per plan step
//! instead of extending that event engine. The policy code is the core's either way.
//!
//! Parameters and their sources: docs/experiments/morpheus/parameters.md.

use super::{HeadlineRatio, HeadlineSpread, headline_spreads};
use crate::reservations::{Sizing, definition_of};
use crate::traces::{TraceFormat, read_trace};
use inference::skyline::{SkylineLpConfig, fit_skyline};
use inference::slo::{ContractStatus, SloContract, SloRule};
use inference::traces::{YarnSkylineSource, read_yarn_native_file};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::guarantor::{
    GuaranteedAsk, GuaranteedPlacement, Guarantor, GuarantorConfig, QueueableAware, QueueableLoad,
};
use scheduler_core::reservation::book::ReservationBook;
use scheduler_core::reservation::dra::Dra;
use scheduler_core::reservation::{Algorithm, PlanConfig};
use scheduler_core::{AppId, ContainerId, JobId, NodeId, Resources};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One container: 1 core, 8 GiB (Morpheus §9.3: "1core, 8GB RAM per container").
pub const CONTAINER: Resources = Resources::new(1_000, 8_192);
/// The plan step and the simulator's step (`plan_step`, 60 s; DRA's T is one step, §7).
pub const STEP_MS: u64 = 60_000;
/// The recurring jobs' period: the §9.3 adversarial run is an hourly periodic workload.
pub const PERIOD_MS: u64 = 3_600_000;

/// Fixed parameters of the experiment (docs/experiments/morpheus/parameters.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MorpheusParameters {
    pub nodes: u32,
    pub containers_per_node: u32,
    /// Periods simulated (instances per recurring job).
    pub periods: u32,
    pub generated_jobs: u32,
    pub tpch_jobs: u32,
    /// Past runs per generated job the skyline LP is fitted on.
    pub history_runs: u32,
    /// Skyline LP α (§9.1: "a value of 1% leads to the best balance").
    pub lp_alpha: f64,
    /// Run-to-run stage-duration noise of generated jobs: log-normal σ.
    pub duration_sigma: f64,
    /// Probability that a stage of a generated run straggles, and its slow-down range.
    pub straggler_probability: f64,
    pub straggler_slowdown: (f64, f64),
    /// Input arrival after the window opens, as a fraction of the job's typical duration:
    /// uniform in [0, this].
    pub input_delay_fraction: f64,
    /// Probability that a run's input is late, by 1–2 typical durations.
    pub late_input_probability: f64,
    /// Slack ratio (deadline − end) / duration, uniform in this range (Fig. 9a).
    pub slack_ratio: (f64, f64),
    /// TPC-H jobs' peak parallelism, uniform in this range (containers).
    pub tpch_peak: (u64, u64),
    /// Ad-hoc offered load and GUARANTEED cap, as fractions of the (default) cluster (§9.3: "can
    /// take up to 75% of the cluster capacity").
    pub adhoc_load: f64,
    pub adhoc_cap: f64,
    /// The per-job cap of a user's own provisioning, as a fraction of the cluster (the periodic
    /// jobs' queue: what ad-hoc work leaves).
    pub user_cap: f64,
    /// Cluster sizes tried for the footprint, as fractions of `nodes`.
    pub footprint_fractions: Vec<f64>,
}

impl Default for MorpheusParameters {
    fn default() -> Self {
        MorpheusParameters {
            nodes: 100,
            containers_per_node: 8,
            periods: 24,
            generated_jobs: 24,
            tpch_jobs: 8,
            history_runs: 20,
            lp_alpha: 0.01,
            duration_sigma: 0.15,
            straggler_probability: 0.05,
            straggler_slowdown: (1.5, 2.0),
            input_delay_fraction: 0.5,
            late_input_probability: 0.05,
            slack_ratio: (0.5, 5.0),
            tpch_peak: (100, 200),
            adhoc_load: 0.75,
            adhoc_cap: 0.75,
            user_cap: 0.25,
            footprint_fractions: (0..=20).map(|i| 1.2 - 0.05 * f64::from(i)).collect(),
        }
    }
}

/// The four configurations of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Configuration {
    /// Users provision their own guess, no reservation (Fig. 2a).
    UserProvisioned,
    /// Reservations from the skyline LP packed by LowCost, no DRA.
    MorpheusNoDra,
    /// As above with DRA (§7).
    Morpheus,
    /// Morpheus with DRA, the greedy agent instead of LowCost.
    MorpheusGreedy,
}

impl Configuration {
    pub const ALL: [Configuration; 4] = [
        Configuration::UserProvisioned,
        Configuration::MorpheusNoDra,
        Configuration::Morpheus,
        Configuration::MorpheusGreedy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Configuration::UserProvisioned => "user-provisioned baseline",
            Configuration::MorpheusNoDra => "Morpheus without DRA",
            Configuration::Morpheus => "Morpheus with DRA",
            Configuration::MorpheusGreedy => "Morpheus with DRA, greedy",
        }
    }

    fn reserves(self) -> bool {
        self != Configuration::UserProvisioned
    }

    fn dra(self) -> bool {
        matches!(
            self,
            Configuration::Morpheus | Configuration::MorpheusGreedy
        )
    }

    fn algorithm(self) -> Algorithm {
        match self {
            Configuration::MorpheusGreedy => Algorithm::Greedy,
            _ => Algorithm::LowCost,
        }
    }
}

/// A recurring job and its runs.
#[derive(Clone, Debug)]
struct RecurringJob {
    name: String,
    /// The SLO contract (window within the period, fitted skyline), signed off.
    contract: SloContract,
    /// What its owner provisions in the baseline (containers, held for the whole run).
    user_containers: u64,
    /// Per instance: (input delay in steps after the window opens, the run's skyline, whether
    /// the input was late).
    instances: Vec<(u64, Vec<u64>, bool)>,
    window_steps: u64,
}

/// An ad-hoc job replayed from the trace: arrival step and task lengths in steps.
#[derive(Clone, Debug)]
struct AdhocJob {
    arrival_step: u64,
    tasks: Vec<u64>,
}

/// The workload of one seed, shared by every configuration and cluster size.
#[derive(Clone, Debug)]
pub struct Workload {
    recurring: Vec<RecurringJob>,
    adhoc: Vec<AdhocJob>,
    /// Container-steps per step the ad-hoc trace offers after scaling.
    pub adhoc_offered_containers: f64,
    /// Mean container-steps per step the recurring runs use.
    pub recurring_mean_containers: f64,
    /// Mean per step of the fitted skylines (what the reservations ask).
    pub reserved_mean_containers: f64,
}

/// Draws one run's skyline of a recurring job.
type RunSampler = Box<dyn Fn(&mut StdRng) -> Vec<u64>>;

fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Runs of the Hadoop resource-estimator sample (TPC-H Q12) as container skylines at 60-s steps:
/// memory over 8 GiB containers (the sample's memory is MB; its peak 20,791,296 / 8,192 is the
/// 2,538 containers its core field shows), averaged over each minute and rounded up.
fn tpch_runs(path: &Path) -> anyhow::Result<Vec<Vec<f64>>> {
    let runs = read_yarn_native_file(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    if runs.is_empty() {
        anyhow::bail!("{}: no runs", path.display());
    }
    Ok(runs
        .iter()
        .map(|r| {
            let fine = r
                .skyline(
                    YarnSkylineSource::MemoryAsContainers {
                        container_mb: 8192.0,
                    },
                    5,
                )
                .values;
            fine.chunks(12)
                .map(|c| c.iter().sum::<f64>() / 12.0)
                .collect()
        })
        .collect())
}

fn fit(name: &str, runs: &[Vec<u64>], alpha: f64) -> anyhow::Result<Vec<u64>> {
    let runs: Vec<inference::skyline::RunSkyline> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| inference::skyline::RunSkyline {
            run: format!("{name}_{i}"),
            values: r.iter().map(|&v| v as f64).collect(),
        })
        .collect();
    let config = SkylineLpConfig {
        alpha,
        ..SkylineLpConfig::default()
    };
    let solution = fit_skyline(&runs, &config).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    Ok(solution.skyline)
}

fn median_len(runs: &[Vec<u64>]) -> u64 {
    let mut lens: Vec<u64> = runs.iter().map(|r| r.len() as u64).collect();
    lens.sort_unstable();
    lens[lens.len() / 2]
}

/// Build the workload of `seed` (independent of the configuration and the cluster size).
pub fn build_workload(
    p: &MorpheusParameters,
    seed: u64,
    traces: &Path,
) -> anyhow::Result<Workload> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6d6f_7270_6865_7573);
    let cluster = f64::from(p.nodes * p.containers_per_node);
    let tpch = tpch_runs(&traces.join("hadoop-resourceestimator/tpch_q12.txt"))?;
    let tpch_max = tpch
        .iter()
        .flat_map(|r| r.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1.0);
    let mut recurring = Vec::new();
    let total = p.generated_jobs + p.tpch_jobs;
    for j in 0..total {
        let is_tpch = j >= p.generated_jobs;
        let name = if is_tpch {
            format!("tpch_q12_{j}")
        } else {
            format!("gen_{j}")
        };
        // sample(rng) draws one run's skyline.
        let (history, sample): (Vec<Vec<u64>>, RunSampler) = if is_tpch {
            let peak = rng.random_range(p.tpch_peak.0..=p.tpch_peak.1) as f64;
            let scaled: Vec<Vec<u64>> = tpch
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|v| (v * peak / tpch_max).ceil() as u64)
                        .collect()
                })
                .collect();
            let pick = scaled.clone();
            (
                scaled,
                Box::new(move |rng: &mut StdRng| pick[rng.random_range(0..pick.len())].clone()),
            )
        } else {
            let stages: Vec<(u64, f64)> = (0..rng.random_range(2..=4u32))
                .map(|_| {
                    (
                        rng.random_range(10..=60u64),
                        f64::from(rng.random_range(2..=5u32)),
                    )
                })
                .collect();
            let (sigma, sp, slow) = (
                p.duration_sigma,
                p.straggler_probability,
                p.straggler_slowdown,
            );
            let draw = move |rng: &mut StdRng| -> Vec<u64> {
                let mut run = Vec::new();
                for &(width, steps) in &stages {
                    let mut m = (sigma * normal(rng)).exp();
                    if rng.random_range(0.0..1.0) < sp {
                        m *= rng.random_range(slow.0..slow.1);
                    }
                    let n = (steps * m).round().max(1.0) as usize;
                    run.extend(std::iter::repeat_n(width, n));
                }
                run
            };
            let history = (0..p.history_runs).map(|_| draw(&mut rng)).collect();
            (history, Box::new(draw))
        };
        let typical = median_len(&history);
        let skyline = fit(&name, &history, p.lp_alpha)?;
        let peak = history
            .iter()
            .flat_map(|r| r.iter().copied())
            .max()
            .unwrap_or(1);
        let slack = rng.random_range(p.slack_ratio.0..p.slack_ratio.1);
        let period_steps = PERIOD_MS / STEP_MS;
        // The window must hold the fitted skyline and end within the period.
        let window_steps = ((typical as f64 * (1.0 + slack)).round() as u64)
            .max(skyline.len() as u64 + 1)
            .min(period_steps - 5);
        let offset_steps = rng.random_range(0..=(period_steps - 5 - window_steps));
        // Users' own provisioning relative to the peak (Fig. 2a): 25 % under-provisioned, 75 %
        // over, 20 % of those more than 10× over.
        let u: f64 = rng.random_range(0.0..1.0);
        let factor = if u < 0.25 {
            rng.random_range(0.3..1.0)
        } else if u < 0.25 + 0.75 * 0.8 {
            rng.random_range(1.0..10.0)
        } else {
            rng.random_range(10.0..20.0)
        };
        let user_containers =
            ((peak as f64 * factor).round() as u64).clamp(1, (cluster * p.user_cap).floor() as u64);
        let instances = (0..p.periods)
            .map(|_| {
                let run = sample(&mut rng);
                let mut delay = rng.random_range(0.0..=p.input_delay_fraction) * typical as f64;
                let late = rng.random_range(0.0..1.0) < p.late_input_probability;
                if late {
                    delay = rng.random_range(1.0..2.0) * typical as f64;
                }
                (delay.round() as u64, run, late)
            })
            .collect();
        let step_s = (STEP_MS / 1000) as f64;
        recurring.push(RecurringJob {
            contract: SloContract {
                job: name.clone(),
                period: (PERIOD_MS / 1000) as f64,
                earliest_start: offset_steps as f64 * step_s,
                deadline: (offset_steps + window_steps) as f64 * step_s,
                skyline: Some(skyline),
                status: ContractStatus::SignedOff,
                start_rule: SloRule::InputAvailablePercentile,
                deadline_rule: SloRule::OutputReadPercentile,
                overridden: Vec::new(),
            },
            name,
            user_containers,
            instances,
            window_steps,
        });
    }
    let steps = u64::from(p.periods) * PERIOD_MS / STEP_MS;
    let recurring_area: u64 = recurring
        .iter()
        .flat_map(|j| j.instances.iter().map(|(_, r, _)| r.iter().sum::<u64>()))
        .sum();
    let reserved_area: u64 = recurring
        .iter()
        .map(|j| {
            j.contract
                .skyline
                .as_ref()
                .map_or(0, |s| s.iter().sum::<u64>())
                * u64::from(p.periods)
        })
        .sum();
    // Ad-hoc jobs: the Alibaba 2017 batch tasks, one container per task instance, lengths in
    // whole steps. The trace's ~17 h of arrivals are stretched over the simulated periods, and
    // each task instance is kept with the probability that makes the offered load `adhoc_load`
    // of the cluster: the trace's own cluster is far larger than ours, so its jobs are thinned in
    // width, not in number, keeping its arrival pattern and its mix of task lengths.
    let trace = read_trace(
        &traces.join("alibaba-2017/batch_task.csv.gz"),
        TraceFormat::Alibaba2017,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let first = trace
        .iter()
        .map(|j| j.arrival.as_millis())
        .min()
        .unwrap_or(0);
    let last = trace
        .iter()
        .map(|j| j.arrival.as_millis())
        .max()
        .unwrap_or(0);
    let span_ms = (last - first).max(1) as f64;
    let area_steps: f64 = trace
        .iter()
        .flat_map(|j| j.tasks.iter())
        .map(|t| t.runtime_ms.div_ceil(STEP_MS).max(1) as f64)
        .sum();
    let keep = (p.adhoc_load * cluster * steps as f64 / area_steps.max(1.0)).min(1.0);
    let mut adhoc = Vec::new();
    for j in &trace {
        let at = ((j.arrival.as_millis() - first) as f64 / span_ms * steps as f64) as u64;
        let tasks: Vec<u64> = j
            .tasks
            .iter()
            .filter(|_| rng.random_range(0.0..1.0) < keep)
            .map(|t| t.runtime_ms.div_ceil(STEP_MS).max(1))
            .collect();
        if !tasks.is_empty() {
            adhoc.push(AdhocJob {
                arrival_step: at.min(steps - 1),
                tasks,
            });
        }
    }
    adhoc.sort_by_key(|j| j.arrival_step);
    let adhoc_area: u64 = adhoc.iter().flat_map(|j| j.tasks.iter()).sum();
    Ok(Workload {
        adhoc_offered_containers: adhoc_area as f64 / steps as f64,
        recurring_mean_containers: recurring_area as f64 / steps as f64,
        reserved_mean_containers: reserved_area as f64 / steps as f64,
        recurring,
        adhoc,
    })
}

/// What one configuration did at one cluster size.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunOutcome {
    pub configuration: Configuration,
    pub name: String,
    pub nodes: u32,
    pub instances: u64,
    pub violations: u64,
    /// The violations by cause: the job had no reservation (rejected), its input was late (the
    /// 5 % late runs), or neither (the run outgrew its reservation: stragglers, noise).
    pub violations_unreserved: u64,
    pub violations_late_input: u64,
    pub violations_other: u64,
    pub violation_percent: f64,
    /// The largest share of one job's instances that missed their deadline.
    pub worst_job_violation_percent: f64,
    pub reservations_accepted: u32,
    pub reservations_rejected: u32,
    /// Of the accepted, how many LowCost placed (the rest: YARN's greedy fall-back, or greedy
    /// alone in the greedy configuration).
    pub reservations_placed_by_lowcost: u32,
    /// DRA stretches granted (§7).
    pub dra_stretches: u64,
    /// Of the container-steps the reservations allocated, the share their jobs used.
    pub reserved_utilization_percent: Option<f64>,
    pub adhoc_jobs: u64,
    pub adhoc_unfinished: u64,
    pub adhoc_latency_mean_s: f64,
    pub adhoc_latency_p50_s: f64,
    pub adhoc_latency_p99_s: f64,
    /// Container-hours of QUEUEABLE ad-hoc work, and of it at least how much ran on capacity
    /// reserved but idle (reservations' allocation minus their use).
    pub queueable_container_hours: f64,
    pub queueable_on_reserved_idle_container_hours: f64,
    pub reserved_idle_container_hours: f64,
    pub queueable_killed: u64,
    /// The most the plan commits at any step (containers): LowCost flattens it (§6.3).
    pub plan_peak_containers: u64,
}

/// A periodic job's live instance.
#[derive(Default)]
struct Instance {
    index: usize,
    started: bool,
    /// Progress through the run's skyline, in steps.
    progress: f64,
    held: Vec<ContainerId>,
}

/// Outstanding asks of one owner: (ask key, containers still waiting).
#[derive(Default)]
struct Asks(Vec<(u64, u32)>);

impl Asks {
    fn waiting(&self) -> u64 {
        self.0.iter().map(|a| u64::from(a.1)).sum()
    }
    fn cancel_all(&mut self, g: &mut Guarantor) {
        for (key, _) in self.0.drain(..) {
            g.cancel(key);
        }
    }
}

#[derive(Clone, Copy)]
enum Owner {
    Periodic(usize),
    Adhoc(usize),
}

struct AdhocState {
    /// Tasks not running (lengths, shortest first; the longest is granted first).
    waiting: Vec<u64>,
    running: u64,
    asks: Asks,
    done_step: Option<u64>,
}

fn containers(r: &Resources) -> u64 {
    r.cpu_millis / CONTAINER.cpu_millis
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Run one configuration on `nodes` nodes.
pub fn simulate(
    p: &MorpheusParameters,
    w: &Workload,
    configuration: Configuration,
    nodes: u32,
) -> anyhow::Result<RunOutcome> {
    let node_capacity = CONTAINER.scale(u64::from(p.containers_per_node));
    let plan = PlanConfig {
        algorithm: configuration.algorithm(),
        ..PlanConfig::default()
    };
    let book = ReservationBook::new(plan, Dra::default()).map_err(|e| anyhow::anyhow!(e))?;
    let mut g = Guarantor::new(
        GuarantorConfig::default(),
        Box::new(QueueableAware::default()),
        0,
    )
    .with_reservations(book);
    let node_ids: Vec<NodeId> = (0..nodes)
        .map(|i| NodeId::new(format!("n{i:04}")))
        .collect();
    for (i, id) in node_ids.iter().enumerate() {
        g.add_node(id.clone(), format!("rack{}", i / 20), node_capacity);
    }
    let node_index: HashMap<NodeId, usize> = node_ids
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();
    let cluster = u64::from(nodes * p.containers_per_node);
    let sizing = Sizing {
        container: CONTAINER,
        step_ms: STEP_MS,
    };
    // Reservations, in job order (the operator submits the accepted contracts).
    let mut reserved: Vec<Option<String>> = vec![None; w.recurring.len()];
    let (mut accepted, mut rejected) = (0, 0);
    if configuration.reserves() {
        for (j, job) in w.recurring.iter().enumerate() {
            let def = definition_of(&job.contract, sizing).map_err(|e| anyhow::anyhow!(e))?;
            let id = crate::reservations::reservation_id_of(&job.name);
            match g.reserve(0, &id, AppId::new(job.name.clone()), def) {
                Ok(_) => {
                    accepted += 1;
                    reserved[j] = Some(id);
                }
                Err(_) => rejected += 1,
            }
        }
    }
    let steps_total = u64::from(p.periods) * PERIOD_MS / STEP_MS;
    let period_steps = PERIOD_MS / STEP_MS;
    let run_steps = steps_total + period_steps;
    let adhoc_cap = (p.adhoc_cap * cluster as f64).floor() as u64;

    let mut next_key: u64 = 1;
    let mut key_owner: HashMap<u64, Owner> = HashMap::new();
    let mut live: Vec<Option<Instance>> = (0..w.recurring.len()).map(|_| None).collect();
    let mut periodic_asks: Vec<Asks> = (0..w.recurring.len()).map(|_| Asks::default()).collect();
    let mut violations_by_job = vec![0u64; w.recurring.len()];
    // Instances that met their deadline (job, instance).
    let mut met: Vec<(usize, usize)> = Vec::new();
    let mut counted: Vec<(usize, usize)> = Vec::new();
    let mut instances = 0u64;
    let mut adhoc: Vec<AdhocState> = Vec::new();
    let mut adhoc_next = 0usize;
    let mut adhoc_active: Vec<usize> = Vec::new();
    // Guaranteed ad-hoc containers ending at a step: (container, job).
    let mut ends: HashMap<u64, Vec<(ContainerId, usize)>> = HashMap::new();
    let mut adhoc_guaranteed: u64 = 0;
    // QUEUEABLE tasks per node: (job, end step).
    let mut queueable: Vec<Vec<(usize, u64, u64)>> = vec![Vec::new(); node_ids.len()];
    let (mut q_steps, mut q_reserved_steps, mut idle_steps) = (0u64, 0u64, 0u64);
    let (mut alloc_steps, mut used_steps) = (0u64, 0u64);
    let mut q_killed = 0u64;
    let mut dra_stretches = 0u64;

    for step in 0..run_steps {
        let now = step * STEP_MS;
        // 1. Periodic instances: arrival, end of the previous instance.
        for (j, job) in w.recurring.iter().enumerate() {
            let offset = (job.contract.earliest_start as u64 * 1000) / STEP_MS;
            if step >= offset && (step - offset).is_multiple_of(period_steps) {
                let k = ((step - offset) / period_steps) as usize;
                if let Some(old) = live[j].take() {
                    // Not finished by its next instance: a violation (counted at its deadline
                    // below) and killed.
                    for cid in old.held {
                        g.on_finished(cid);
                    }
                    periodic_asks[j].cancel_all(&mut g);
                }
                if k < job.instances.len() && step < steps_total {
                    instances += 1;
                    counted.push((j, k));
                    // Counted as violating until it finishes in time.
                    violations_by_job[j] += 1;
                    live[j] = Some(Instance {
                        index: k,
                        ..Instance::default()
                    });
                }
            }
        }
        // 2. Ad-hoc arrivals and GUARANTEED completions.
        while adhoc_next < w.adhoc.len() && w.adhoc[adhoc_next].arrival_step <= step {
            let job = &w.adhoc[adhoc_next];
            let mut waiting = job.tasks.clone();
            waiting.sort_unstable();
            adhoc.push(AdhocState {
                waiting,
                running: 0,
                asks: Asks::default(),
                done_step: None,
            });
            adhoc_active.push(adhoc.len() - 1);
            adhoc_next += 1;
        }
        if let Some(done) = ends.remove(&step) {
            for (cid, a) in done {
                g.on_finished(cid);
                adhoc[a].running -= 1;
                adhoc_guaranteed -= 1;
            }
        }
        for (n, tasks) in queueable.iter_mut().enumerate() {
            tasks.retain(|&(a, _, end)| {
                if end <= step {
                    adhoc[a].running -= 1;
                    false
                } else {
                    true
                }
            });
            let _ = n;
        }
        // 3. Periodic demand: release what is not needed, ask for the shortfall.
        for (j, job) in w.recurring.iter().enumerate() {
            let Some(inst) = live[j].as_mut() else {
                continue;
            };
            let (delay, run, _) = &job.instances[inst.index];
            let offset = (job.contract.earliest_start as u64 * 1000) / STEP_MS;
            let arrived = step >= offset + inst.index as u64 * period_steps + delay;
            if !arrived {
                continue;
            }
            inst.started = true;
            let demand = run[(inst.progress as usize).min(run.len() - 1)];
            let want = if configuration.reserves() {
                demand
            } else {
                // The user's static provisioning, held for the whole run.
                job.user_containers
            };
            let held = inst.held.len() as u64;
            if held > want {
                periodic_asks[j].cancel_all(&mut g);
                for cid in inst.held.drain(want as usize..) {
                    g.on_finished(cid);
                }
            }
            let held = inst.held.len() as u64;
            let waiting = periodic_asks[j].waiting();
            if held + waiting > want {
                periodic_asks[j].cancel_all(&mut g);
            }
            let waiting = periodic_asks[j].waiting();
            let short = want.saturating_sub(held + waiting);
            if short > 0 {
                let key = next_key;
                next_key += 1;
                let ask = GuaranteedAsk {
                    ask_key: key,
                    app_id: AppId::new(job.name.clone()),
                    resources: CONTAINER,
                    count: short as u32,
                    priority: 0,
                    locality: None,
                    runtime_estimate_ms: None,
                    job_id: JobId::new(format!("{}#{}", job.name, inst.index)),
                    job_submit_time_ms: now,
                    role: Default::default(),
                    allow_shaping: false,
                };
                let r = match &reserved[j] {
                    Some(id) => g.submit_reserved(ask, id),
                    None => g.submit(ask),
                };
                r.map_err(|e| anyhow::anyhow!("{}: {e}", job.name))?;
                key_owner.insert(key, Owner::Periodic(j));
                periodic_asks[j].0.push((key, short as u32));
            }
        }
        // 4. Ad-hoc GUARANTEED asks, in arrival order, within the ad-hoc cap.
        let mut asked: u64 = adhoc_active
            .iter()
            .map(|&a| adhoc[a].asks.waiting())
            .sum::<u64>()
            + adhoc_guaranteed;
        for &a in &adhoc_active {
            let s = &mut adhoc[a];
            let uncovered = (s.waiting.len() as u64).saturating_sub(s.asks.waiting());
            let room = adhoc_cap.saturating_sub(asked);
            let n = uncovered.min(room);
            if n == 0 {
                continue;
            }
            let key = next_key;
            next_key += 1;
            g.submit(GuaranteedAsk {
                ask_key: key,
                app_id: AppId::new("adhoc"),
                resources: CONTAINER,
                count: n as u32,
                priority: 0,
                locality: None,
                // The job manager knows its tasks' lengths: the longest waiting one bounds every
                // container of the ask, so the guarantor's gate keeps it off capacity the plan
                // commits to reservations over its run (DESIGN.md, layer 1).
                runtime_estimate_ms: s.waiting.last().map(|l| l * STEP_MS),
                job_id: JobId::new(format!("adhoc#{a}")),
                job_submit_time_ms: w.adhoc[a].arrival_step * STEP_MS,
                role: Default::default(),
                allow_shaping: false,
            })
            .map_err(|e| anyhow::anyhow!("ad-hoc: {e}"))?;
            key_owner.insert(key, Owner::Adhoc(a));
            s.asks.0.push((key, n as u32));
            asked += n;
        }
        // 5. DRA every T (one step), then the guarantor places what it admits.
        if configuration.dra() {
            g.reprovision(now);
            dra_stretches += g
                .take_reservation_events()
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        scheduler_core::reservation::book::ReservationEvent::Reprovisioned { .. }
                    )
                })
                .count() as u64;
        }
        let placements: Vec<GuaranteedPlacement> = g.schedule(now);
        for pl in placements {
            let cid = pl.token_body.container_id;
            g.on_started(cid);
            let node = node_index[&pl.token_body.node_id];
            let owner = key_owner[&pl.ask_key];
            match owner {
                Owner::Periodic(j) => {
                    take_one(&mut periodic_asks[j], pl.ask_key);
                    match live[j].as_mut() {
                        Some(inst) => inst.held.push(cid),
                        None => {
                            g.on_finished(cid);
                        }
                    }
                }
                Owner::Adhoc(a) => {
                    take_one(&mut adhoc[a].asks, pl.ask_key);
                    let s = &mut adhoc[a];
                    match s.waiting.pop() {
                        Some(len) => {
                            s.running += 1;
                            adhoc_guaranteed += 1;
                            ends.entry(step + len).or_default().push((cid, a));
                        }
                        None => {
                            g.on_finished(cid);
                        }
                    }
                }
            }
            // A GUARANTEED grant preempts QUEUEABLE work where the node is now over-full.
            let free = containers(
                &g.node(&node_ids[node])
                    .map(|n| n.free())
                    .unwrap_or_default(),
            );
            while queueable[node].len() as u64 > free {
                let (a, len, _) = queueable[node].pop().expect("non-empty");
                adhoc[a].running -= 1;
                let waiting = &mut adhoc[a].waiting;
                let at = waiting.partition_point(|&l| l < len);
                waiting.insert(at, len);
                q_killed += 1;
            }
        }
        // 6. QUEUEABLE: waiting ad-hoc tasks in what GUARANTEED work leaves free, by the
        // policing limit. Reserved-but-idle capacity is part of it.
        let mut free_total = 0u64;
        for (n, id) in node_ids.iter().enumerate() {
            let limit = containers(&g.queueable_limit(id).unwrap_or_default());
            free_total += limit;
            let mut room = limit.saturating_sub(queueable[n].len() as u64);
            if room == 0 {
                continue;
            }
            for &a in &adhoc_active {
                let s = &mut adhoc[a];
                // Tasks not covered by a GUARANTEED ask run QUEUEABLE.
                while room > 0 && s.waiting.len() as u64 > s.asks.waiting() {
                    let len = s.waiting.pop().expect("non-empty");
                    s.running += 1;
                    queueable[n].push((a, len, step + len));
                    room -= 1;
                }
                if room == 0 {
                    break;
                }
            }
        }
        let q_now: u64 = queueable.iter().map(|q| q.len() as u64).sum();
        for (n, id) in node_ids.iter().enumerate() {
            g.report_queueable_load(
                id,
                QueueableLoad {
                    running: CONTAINER.scale(queueable[n].len() as u64),
                    queued_count: 0,
                },
            );
        }
        // Measures over the simulated periods.
        if step < steps_total {
            let mut idle = 0u64;
            for id in reserved.iter().flatten() {
                let alloc =
                    containers(&g.reservations().allocated_now(id, now).unwrap_or_default());
                let used = containers(&g.reservations().used(id));
                alloc_steps += alloc;
                used_steps += used.min(alloc);
                idle += alloc.saturating_sub(used);
            }
            // Free capacity was `free_total` before QUEUEABLE placement this step; of it,
            // `idle` was reserved: QUEUEABLE work beyond the unreserved rest ran on reserved.
            let unreserved_free = free_total.saturating_sub(idle);
            q_reserved_steps += q_now.saturating_sub(unreserved_free).min(idle);
            idle_steps += idle;
            q_steps += q_now;
        }
        // 7. Progress over this step.
        for (j, job) in w.recurring.iter().enumerate() {
            let Some(inst) = live[j].as_mut() else {
                continue;
            };
            if !inst.started {
                continue;
            }
            let run = &job.instances[inst.index].1;
            let demand = run[(inst.progress as usize).min(run.len() - 1)];
            let held = inst.held.len() as u64;
            inst.progress += if demand == 0 {
                1.0
            } else {
                (held.min(demand) as f64 / demand as f64).min(1.0)
            };
            if inst.progress + 1e-9 >= run.len() as f64 {
                let finish = step + 1;
                let offset = (job.contract.earliest_start as u64 * 1000) / STEP_MS;
                let deadline = offset + inst.index as u64 * period_steps + job.window_steps;
                if finish <= deadline {
                    violations_by_job[j] -= 1;
                    met.push((j, inst.index));
                }
                let done = live[j].take().expect("live");
                for cid in done.held {
                    g.on_finished(cid);
                }
                periodic_asks[j].cancel_all(&mut g);
            }
        }
        adhoc_active.retain(|&a| {
            let s = &mut adhoc[a];
            if s.waiting.is_empty() && s.running == 0 {
                s.done_step = Some(step + 1);
                for (key, _) in s.asks.0.drain(..) {
                    g.cancel(key);
                }
                false
            } else {
                true
            }
        });
        #[cfg(debug_assertions)]
        g.check_invariants()
            .map_err(|e| anyhow::anyhow!("guarantor invariant broken at step {step}: {e}"))?;
    }
    let violations: u64 = violations_by_job.iter().sum();
    met.sort_unstable();
    let (mut unreserved, mut late_input, mut other) = (0u64, 0u64, 0u64);
    for &(j, k) in &counted {
        if met.binary_search(&(j, k)).is_ok() {
            continue;
        }
        if reserved[j].is_none() && configuration.reserves() {
            unreserved += 1;
        } else if w.recurring[j].instances[k].2 {
            late_input += 1;
        } else {
            other += 1;
        }
    }
    let per_job = u64::from(p.periods).max(1) as f64;
    let mut latencies: Vec<f64> = adhoc
        .iter()
        .enumerate()
        .filter(|(a, _)| w.adhoc[*a].arrival_step < steps_total)
        .filter_map(|(a, s)| {
            s.done_step
                .map(|d| ((d - w.adhoc[a].arrival_step) * STEP_MS) as f64 / 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let adhoc_jobs = w
        .adhoc
        .iter()
        .filter(|j| j.arrival_step < steps_total)
        .count() as u64;
    let step_h = STEP_MS as f64 / 3_600_000.0;
    Ok(RunOutcome {
        configuration,
        name: configuration.name().to_string(),
        nodes,
        instances,
        violations,
        violations_unreserved: unreserved,
        violations_late_input: late_input,
        violations_other: other,
        violation_percent: 100.0 * violations as f64 / instances.max(1) as f64,
        worst_job_violation_percent: violations_by_job
            .iter()
            .map(|&v| 100.0 * v as f64 / per_job)
            .fold(0.0, f64::max),
        reservations_accepted: accepted,
        reservations_rejected: rejected,
        reservations_placed_by_lowcost: g
            .reservations()
            .plan()
            .reservations()
            .filter(|r| r.placed_by == Some(Algorithm::LowCost))
            .count() as u32,
        dra_stretches,
        reserved_utilization_percent: (alloc_steps > 0)
            .then(|| 100.0 * used_steps as f64 / alloc_steps as f64),
        adhoc_jobs,
        adhoc_unfinished: adhoc_jobs - latencies.len() as u64,
        adhoc_latency_mean_s: latencies.iter().sum::<f64>() / latencies.len().max(1) as f64,
        adhoc_latency_p50_s: percentile(&latencies, 0.5),
        adhoc_latency_p99_s: percentile(&latencies, 0.99),
        queueable_container_hours: q_steps as f64 * step_h,
        queueable_on_reserved_idle_container_hours: q_reserved_steps as f64 * step_h,
        reserved_idle_container_hours: idle_steps as f64 * step_h,
        queueable_killed: q_killed,
        plan_peak_containers: g
            .reservations()
            .plan()
            .load()
            .runs()
            .map(|(_, _, r)| containers(&r))
            .max()
            .unwrap_or(0),
    })
}

fn take_one(asks: &mut Asks, key: u64) {
    if let Some(pos) = asks.0.iter().position(|a| a.0 == key) {
        asks.0[pos].1 -= 1;
        if asks.0[pos].1 == 0 {
            asks.0.remove(pos);
        }
    }
}

/// The smallest cluster at which a configuration keeps violations at or below the target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Footprint {
    pub configuration: Configuration,
    pub name: String,
    /// Violations allowed: the baseline's at the default size / 5 (§9.2).
    pub target_violations: f64,
    /// Smallest node count such that it and every larger size tried meet the target (None: not
    /// met at any size tried).
    pub smallest_nodes: Option<u32>,
    pub fraction_of_default: Option<f64>,
    /// (nodes, violations) at each size tried.
    pub tried: Vec<(u32, u64)>,
    /// What ad-hoc work saw at that size: the footprint counts periodic SLOs only (§9.2).
    pub adhoc_latency_mean_s: Option<f64>,
    pub adhoc_unfinished: Option<u64>,
}

/// The report of one seed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MorpheusReport {
    pub seed: u64,
    pub parameters: MorpheusParameters,
    pub adhoc_offered_containers: f64,
    pub recurring_mean_containers: f64,
    pub reserved_mean_containers: f64,
    pub cluster_containers: u64,
    pub configurations: Vec<RunOutcome>,
    /// The baseline and Morpheus with DRA with no ad-hoc work: what provisioning and run-to-run
    /// noise cost without sharing (§2.2 separates the two sources).
    pub without_adhoc: Vec<RunOutcome>,
    pub footprint: Vec<Footprint>,
    pub headline: Vec<HeadlineRatio>,
    pub wall_s: f64,
}

/// Paper's figures (positive = better, percent).
fn reduction(paper_times: f64) -> f64 {
    100.0 * (1.0 - 1.0 / paper_times)
}

/// Run every configuration on one seed, then the footprint search.
pub fn morpheus(
    p: &MorpheusParameters,
    seed: u64,
    traces: &Path,
    progress: bool,
) -> anyhow::Result<MorpheusReport> {
    let start = std::time::Instant::now();
    let w = build_workload(p, seed, traces)?;
    let mut configurations = Vec::new();
    for c in Configuration::ALL {
        let o = simulate(p, &w, c, p.nodes)?;
        if progress {
            eprintln!(
                "seed {seed}: {:<28} violations {:>3}/{} ({:.1} %)",
                o.name, o.violations, o.instances, o.violation_percent
            );
        }
        configurations.push(o);
    }
    let alone = Workload {
        adhoc: Vec::new(),
        ..w.clone()
    };
    let without_adhoc = [Configuration::UserProvisioned, Configuration::Morpheus]
        .into_iter()
        .map(|c| simulate(p, &alone, c, p.nodes))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let baseline = configurations[0].violations as f64;
    let target = baseline / 5.0;
    let mut footprint = Vec::new();
    for c in Configuration::ALL.into_iter().skip(1) {
        let mut tried = Vec::new();
        let mut smallest = None;
        let mut at_smallest: Option<RunOutcome> = None;
        for &f in &p.footprint_fractions {
            let nodes = ((f64::from(p.nodes) * f).round() as u32).max(1);
            let o = if nodes == p.nodes {
                configurations
                    .iter()
                    .find(|o| o.configuration == c)
                    .cloned()
                    .expect("every configuration ran")
            } else {
                simulate(p, &w, c, nodes)?
            };
            let v = o.violations;
            tried.push((nodes, v));
            if v as f64 <= target {
                smallest = Some(nodes);
                at_smallest = Some(o);
            } else if smallest.is_some() || nodes <= p.nodes {
                // Sizes go from the largest down: the first miss ends the search.
                break;
            }
        }
        if progress {
            eprintln!("seed {seed}: footprint {:<28} {:?}", c.name(), smallest);
        }
        footprint.push(Footprint {
            configuration: c,
            name: c.name().to_string(),
            target_violations: target,
            smallest_nodes: smallest,
            fraction_of_default: smallest.map(|n| f64::from(n) / f64::from(p.nodes)),
            tried,
            adhoc_latency_mean_s: at_smallest.as_ref().map(|o| o.adhoc_latency_mean_s),
            adhoc_unfinished: at_smallest.as_ref().map(|o| o.adhoc_unfinished),
        });
    }
    let by = |c: Configuration| {
        configurations
            .iter()
            .find(|o| o.configuration == c)
            .expect("every configuration ran")
    };
    let gain = |c: Configuration| {
        if baseline == 0.0 {
            0.0
        } else {
            100.0 * (1.0 - by(c).violations as f64 / baseline)
        }
    };
    let footprint_gain = |c: Configuration| {
        footprint
            .iter()
            .find(|f| f.configuration == c)
            .and_then(|f| f.fraction_of_default)
            .map_or(-100.0, |x| 100.0 * (1.0 - x))
    };
    let headline = vec![
        HeadlineRatio {
            claim: "SLO violations, Morpheus with DRA vs user provisioning (§9.2 Fig. 10b: 13x fewer)"
                .into(),
            paper_percent: reduction(13.0),
            ours_percent: gain(Configuration::Morpheus),
        },
        HeadlineRatio {
            claim: "SLO violations, Morpheus without DRA vs user provisioning (issue: 5x fewer at least)"
                .into(),
            paper_percent: reduction(5.0),
            ours_percent: gain(Configuration::MorpheusNoDra),
        },
        HeadlineRatio {
            claim: "Cluster footprint for 5x fewer violations than the baseline, Morpheus with DRA (§9.2 Fig. 10a: 19% smaller)"
                .into(),
            paper_percent: 19.0,
            ours_percent: footprint_gain(Configuration::Morpheus),
        },
    ];
    Ok(MorpheusReport {
        seed,
        parameters: p.clone(),
        adhoc_offered_containers: w.adhoc_offered_containers,
        recurring_mean_containers: w.recurring_mean_containers,
        reserved_mean_containers: w.reserved_mean_containers,
        cluster_containers: u64::from(p.nodes * p.containers_per_node),
        configurations,
        without_adhoc,
        footprint,
        headline,
        wall_s: start.elapsed().as_secs_f64(),
    })
}

/// Several seeds side by side.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MorpheusMultiReport {
    pub command: String,
    pub seeds: Vec<u64>,
    pub headline: Vec<HeadlineSpread>,
    pub runs: Vec<MorpheusReport>,
    pub wall_s: f64,
}

/// Where the shared traces are: `$TESTBED_TRACES`, else `../shared/data/traces` (the layout
/// next to a checkout), else `/work/shared/data/traces`.
pub fn traces_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESTBED_TRACES") {
        return PathBuf::from(dir);
    }
    let relative = PathBuf::from("../shared/data/traces");
    if relative.is_dir() {
        return relative;
    }
    PathBuf::from("/work/shared/data/traces")
}

/// Run `testbed experiment morpheus` over `seeds`.
pub fn morpheus_seeds(seeds: &[u64], command: &str) -> anyhow::Result<MorpheusMultiReport> {
    let start = std::time::Instant::now();
    let p = MorpheusParameters::default();
    let traces = traces_dir();
    let runs = seeds
        .iter()
        .map(|&s| morpheus(&p, s, &traces, true))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let per_seed: Vec<Vec<HeadlineRatio>> = runs.iter().map(|r| r.headline.clone()).collect();
    Ok(MorpheusMultiReport {
        command: command.to_string(),
        seeds: seeds.to_vec(),
        headline: headline_spreads(&per_seed),
        runs,
        wall_s: start.elapsed().as_secs_f64(),
    })
}

/// report.md and report.json.
pub fn write_report(report: &MorpheusMultiReport, dir: &Path) -> anyhow::Result<()> {
    use std::fmt::Write;
    super::write_report_json(report, dir)?;
    let mut md = String::new();
    writeln!(md, "# Morpheus §9 on the simulator\n")?;
    writeln!(md, "Command: `{}`  ", report.command)?;
    writeln!(
        md,
        "Seeds {:?}, {:.0} s wall. Parameters: [parameters.md](parameters.md); where and why we differ from the paper: [notes.md](notes.md).\n",
        report.seeds, report.wall_s
    )?;
    writeln!(md, "## Headline (paper vs ours, positive = better)\n")?;
    writeln!(md, "| claim | paper % | ours mean % | min | max | sd |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|")?;
    for h in &report.headline {
        writeln!(
            md,
            "| {} | {:+.1} | {:+.1} | {:+.1} | {:+.1} | {:.1} |",
            h.claim, h.paper_percent, h.mean, h.min, h.max, h.sd
        )?;
    }
    for r in &report.runs {
        writeln!(
            md,
            "\n## Seed {}\n\nCluster {} containers; ad-hoc offers {:.0} containers on average, recurring runs use {:.0}, their reservations ask {:.0}.\n",
            r.seed,
            r.cluster_containers,
            r.adhoc_offered_containers,
            r.recurring_mean_containers,
            r.reserved_mean_containers
        )?;
        writeln!(
            md,
            "| configuration | violations (no reservation / late input / other) | % of instances | worst job % | reservations (accepted/rejected/by LowCost) | DRA stretches | plan peak (containers) | reserved used % | ad-hoc latency mean / p50 / p99 s | ad-hoc unfinished | QUEUEABLE c-h | of it on reserved-idle c-h | reserved-idle c-h | QUEUEABLE killed |"
        )?;
        writeln!(
            md,
            "|---|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"
        )?;
        for (o, alone) in r
            .configurations
            .iter()
            .map(|o| (o, false))
            .chain(r.without_adhoc.iter().map(|o| (o, true)))
        {
            let name = if alone {
                format!("{}, no ad-hoc work", o.name)
            } else {
                o.name.clone()
            };
            writeln!(
                md,
                "| {} | {} / {} ({} / {} / {}) | {:.1} | {:.1} | {}/{}/{} | {} | {} | {} | {} | {} of {} | {:.0} | {:.0} | {:.0} | {} |",
                name,
                o.violations,
                o.instances,
                o.violations_unreserved,
                o.violations_late_input,
                o.violations_other,
                o.violation_percent,
                o.worst_job_violation_percent,
                o.reservations_accepted,
                o.reservations_rejected,
                o.reservations_placed_by_lowcost,
                o.dra_stretches,
                o.plan_peak_containers,
                o.reserved_utilization_percent
                    .map_or("–".to_string(), |u| format!("{u:.1}")),
                if o.adhoc_jobs == 0 {
                    "–".to_string()
                } else {
                    format!(
                        "{:.0} / {:.0} / {:.0}",
                        o.adhoc_latency_mean_s, o.adhoc_latency_p50_s, o.adhoc_latency_p99_s
                    )
                },
                o.adhoc_unfinished,
                o.adhoc_jobs,
                o.queueable_container_hours,
                o.queueable_on_reserved_idle_container_hours,
                o.reserved_idle_container_hours,
                o.queueable_killed
            )?;
        }
        writeln!(
            md,
            "\nFootprint (smallest cluster with violations ≤ baseline / 5):\n"
        )?;
        for f in &r.footprint {
            writeln!(
                md,
                "- {}: target ≤ {:.1}; smallest {}; ad-hoc there: latency mean {} s, {} unfinished; tried (nodes, violations) {:?}",
                f.name,
                f.target_violations,
                f.smallest_nodes.map_or("not met".to_string(), |n| format!(
                    "{n} nodes ({:.0} % of default)",
                    100.0 * f.fraction_of_default.unwrap_or(0.0)
                )),
                f.adhoc_latency_mean_s
                    .map_or("–".to_string(), |l| format!("{l:.0}")),
                f.adhoc_unfinished
                    .map_or("–".to_string(), |u| u.to_string()),
                f.tried
            )?;
        }
    }
    std::fs::write(dir.join("report.md"), md)?;
    Ok(())
}

/// `testbed experiment morpheus`.
pub fn run_cli(args: &super::cli::ExperimentArgs) -> anyhow::Result<()> {
    let seeds = args.seed_list();
    let command = super::cli::command_line();
    let report = morpheus_seeds(&seeds, &command)?;
    super::cli::publish_report(
        &report,
        args.report.as_deref(),
        args.json,
        write_report,
        |report| {
            println!(
                "morpheus experiment, seeds {:?}, {:.1} s wall",
                report.seeds, report.wall_s
            );
            for r in &report.runs {
                for o in &r.configurations {
                    println!(
                        "  seed {:<3} {:<28} violations {:>4}/{:<4} worst job {:>5.1} %  reserved used {:>5}  ad-hoc latency mean {:>7.0} s  QUEUEABLE on reserved-idle {:>6.0} c-h",
                        r.seed,
                        o.name,
                        o.violations,
                        o.instances,
                        o.worst_job_violation_percent,
                        o.reserved_utilization_percent
                            .map_or("-".to_string(), |u| format!("{u:.1}%")),
                        o.adhoc_latency_mean_s,
                        o.queueable_on_reserved_idle_container_hours
                    );
                }
            }
            println!("headline (paper vs ours, mean [min, max]):");
            for h in &report.headline {
                println!(
                    "  {:<100} {:>+7.1}% {:>+7.1}% [{:+.1}, {:+.1}]",
                    h.claim, h.paper_percent, h.mean, h.min, h.max
                );
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> MorpheusParameters {
        MorpheusParameters {
            nodes: 30,
            periods: 3,
            generated_jobs: 4,
            tpch_jobs: 2,
            history_runs: 8,
            tpch_peak: (20, 40),
            footprint_fractions: vec![1.0, 0.8],
            ..MorpheusParameters::default()
        }
    }

    fn traces() -> Option<PathBuf> {
        let dir = traces_dir();
        dir.join("hadoop-resourceestimator/tpch_q12.txt")
            .is_file()
            .then_some(dir)
    }

    /// Every configuration runs through the guarantor with its invariants checked each step
    /// (debug builds), and the reservations hold the recurring jobs' instances.
    #[test]
    fn morpheus_small_run_counts_every_instance() {
        let Some(dir) = traces() else {
            eprintln!("shared traces not found; skipped");
            return;
        };
        let p = small();
        let w = build_workload(&p, 7, &dir).expect("workload");
        for c in Configuration::ALL {
            let o = simulate(&p, &w, c, p.nodes).expect("simulate");
            assert_eq!(o.instances, 6 * 3, "{c:?}");
            assert!(o.violations <= o.instances);
            assert_eq!(
                o.violations_unreserved + o.violations_late_input + o.violations_other,
                o.violations,
                "{c:?}"
            );
            if c.reserves() {
                assert_eq!(o.reservations_accepted + o.reservations_rejected, 6);
                assert!(o.reserved_utilization_percent.is_some());
            } else {
                assert_eq!(o.reservations_accepted, 0);
            }
            assert!(o.adhoc_jobs > 0);
        }
    }

    /// The same seed gives the same report (deterministic).
    #[test]
    fn morpheus_is_deterministic() {
        let Some(dir) = traces() else {
            return;
        };
        let p = small();
        let w = build_workload(&p, 3, &dir).expect("workload");
        let a = simulate(&p, &w, Configuration::Morpheus, p.nodes).expect("a");
        let b = simulate(&p, &w, Configuration::Morpheus, p.nodes).expect("b");
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
    }
}

//! `testbed experiment pace`: Pace's resource shaping (Pace §4.2 configurations and metrics, §5.1
//! workload) on a simulated cluster with a virtual one-minute clock. Every shaping decision comes
//! from the merged code: [`ShapingState::pass`] (bounded histories, the forecasts, Eq. 9's buffer
//! and Algorithm 1 or the optimistic policy in [`scheduler_core::shaper::shape`]) with the real
//! GP and ARIMA forecasters of `inference`, or an oracle that knows the next sample. The
//! simulator only replays usage, schedules FIFO, applies resizes and preemptions, and kills
//! components the way the OS would. Parameters and their sources:
//! docs/experiments/pace/parameters.md.

use super::{HeadlineRatio, HeadlineSpread, headline_spreads, morpheus::traces_dir, spread};
use inference::forecast::shaping::ForecasterKind;
use inference::traces::read_bitbrains_file;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::shaper::{
    ComponentRole, PreemptionPolicy, PreemptionReason, ShaperConfig, UsageForecast,
};
use scheduler_core::shaping::{ForecasterFactory, SeriesForecaster, ShapingConfig, ShapingState};
use scheduler_core::{AppId, ContainerId, NodeId, Resources, Time};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The experiment's parameters (docs/experiments/pace/parameters.md gives each one's source).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PaceParameters {
    pub nodes: usize,
    pub node_cpu_millis: u64,
    pub node_memory_mib: u64,
    pub apps: usize,
    /// Share of elastic applications (the rest are rigid: one core component).
    pub elastic_share: f64,
    /// Core components of an elastic application.
    pub elastic_app_cores: usize,
    /// Elastic components of an elastic application, one value per flavor.
    pub elastic_flavors: Vec<usize>,
    /// Memory reservation of an application, one value per flavor (GiB).
    pub app_memory_gib: Vec<u64>,
    pub component_cpu_millis: u64,
    pub interarrival_mean_s: f64,
    pub interarrival_sd_s: f64,
    /// Minutes an application runs with all its components (uniform, inclusive).
    pub duration_min: (u64, u64),
    /// Crashes plus whole-application preemptions after which an application is no longer shaped.
    pub max_restarts_shaped: u32,
    pub horizon_min: u64,
    /// Bitbrains VM files (month directory and VM numbers) whose series are replayed.
    pub bitbrains_month: String,
    pub bitbrains_vms: Vec<u32>,
    /// Series shorter than this are not used.
    pub min_series_len: usize,
    pub k1: f64,
    pub k2_values: Vec<f64>,
    /// Evidence maximisation / order search every this many forecasts of a series.
    pub gp_refit_every: usize,
    pub arima_refit_every: usize,
}

impl Default for PaceParameters {
    fn default() -> Self {
        PaceParameters {
            nodes: 10,
            node_cpu_millis: 8_000,
            node_memory_mib: 64 * 1024,
            apps: 100,
            elastic_share: 0.6,
            elastic_app_cores: 3,
            elastic_flavors: vec![1, 2, 4],
            app_memory_gib: vec![8, 16, 32],
            component_cpu_millis: 1_000,
            interarrival_mean_s: 120.0,
            interarrival_sd_s: 40.0,
            duration_min: (30, 240),
            max_restarts_shaped: 3,
            horizon_min: 14 * 24 * 60,
            bitbrains_month: "2013-7".into(),
            bitbrains_vms: (1..=15).collect(),
            min_series_len: 1_000,
            k1: 0.05,
            k2_values: vec![0.0, 1.0, 2.0, 3.0],
            gp_refit_every: 1,
            arima_refit_every: 10,
        }
    }
}

impl PaceParameters {
    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.nodes > 0, "pace: nodes must be at least 1");
        anyhow::ensure!(self.apps > 0, "pace: apps must be at least 1");
        anyhow::ensure!(
            !self.elastic_flavors.is_empty() && !self.app_memory_gib.is_empty(),
            "pace: elastic_flavors and app_memory_gib need at least one value each"
        );
        anyhow::ensure!(
            self.duration_min.0 >= 1 && self.duration_min.0 <= self.duration_min.1,
            "pace: duration_min must be 1 <= min <= max, got {:?}",
            self.duration_min
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.elastic_share),
            "pace: elastic_share must be in [0, 1], got {}",
            self.elastic_share
        );
        anyhow::ensure!(
            self.gp_refit_every >= 1 && self.arima_refit_every >= 1,
            "pace: refit_every must be at least 1"
        );
        Ok(())
    }
}

/// One replayed usage series: per-sample use as a fraction of the provisioned capacity.
#[derive(Clone, Debug)]
pub struct UsageSeries {
    pub source: String,
    pub cpu: Vec<f64>,
    pub memory: Vec<f64>,
}

/// Reads the Bitbrains series named by the parameters (in place, from the shared traces).
pub fn load_series(p: &PaceParameters, traces: &Path) -> anyhow::Result<Vec<UsageSeries>> {
    let dir = traces.join("bitbrains-rnd").join(&p.bitbrains_month);
    let mut all = Vec::new();
    for vm in &p.bitbrains_vms {
        let path = dir.join(format!("{vm}.csv.gz"));
        let samples = read_bitbrains_file(&path)
            .map_err(|e| anyhow::anyhow!("pace: reading {}: {e}", path.display()))?;
        if samples.len() < p.min_series_len {
            continue;
        }
        let frac = |used: f64, cap: f64| {
            if cap > 0.0 && used.is_finite() {
                (used / cap).clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        all.push(UsageSeries {
            source: format!("bitbrains-rnd/{}/{vm}", p.bitbrains_month),
            cpu: samples
                .iter()
                .map(|s| frac(s.cpu_usage_mhz, s.cpu_capacity_mhz))
                .collect(),
            memory: samples
                .iter()
                .map(|s| frac(s.memory_usage_kb, s.memory_capacity_kb))
                .collect(),
        });
    }
    anyhow::ensure!(
        !all.is_empty(),
        "pace: no Bitbrains series of at least {} samples in {}",
        p.min_series_len,
        dir.display()
    );
    Ok(all)
}

#[derive(Clone, Debug)]
struct ComponentSpec {
    role: ComponentRole,
    request: Resources,
    series: usize,
    offset: usize,
}

#[derive(Clone, Debug)]
struct AppSpec {
    arrival_s: u64,
    /// Component-minutes of work.
    work: u64,
    components: Vec<ComponentSpec>,
}

/// The applications of one seed (the same for every configuration).
#[derive(Clone, Debug)]
pub struct PaceWorkload {
    apps: Vec<AppSpec>,
    series: Vec<UsageSeries>,
}

fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Pace §5.1's workload over the given series, deterministic per seed.
pub fn build_workload(
    p: &PaceParameters,
    series: Vec<UsageSeries>,
    seed: u64,
) -> anyhow::Result<PaceWorkload> {
    p.validate()?;
    anyhow::ensure!(!series.is_empty(), "pace: no usage series");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = 0.0f64;
    let mut apps = Vec::with_capacity(p.apps);
    for _ in 0..p.apps {
        t += (p.interarrival_mean_s + p.interarrival_sd_s * normal(&mut rng)).max(0.0);
        let elastic = rng.random_bool(p.elastic_share);
        let flavor = rng.random_range(0..p.app_memory_gib.len());
        let (cores, elastics) = if elastic {
            (
                p.elastic_app_cores,
                p.elastic_flavors[rng.random_range(0..p.elastic_flavors.len())],
            )
        } else {
            (1, 0)
        };
        let n = cores + elastics;
        let memory = (p.app_memory_gib[flavor] * 1024 / n as u64).max(1);
        let duration = rng.random_range(p.duration_min.0..=p.duration_min.1);
        let components = (0..n)
            .map(|i| {
                let s = rng.random_range(0..series.len());
                ComponentSpec {
                    role: if i < cores {
                        ComponentRole::Core
                    } else {
                        ComponentRole::Elastic
                    },
                    request: Resources::new(p.component_cpu_millis, memory),
                    series: s,
                    offset: rng.random_range(0..series[s].cpu.len()),
                }
            })
            .collect();
        apps.push(AppSpec {
            arrival_s: t.round() as u64,
            work: duration * n as u64,
            components,
        });
    }
    Ok(PaceWorkload { apps, series })
}

/// What forecasts the shaper.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Forecasts {
    /// No shaping: allocation = request (the reservation baseline).
    None,
    Oracle,
    Gp,
    Arima,
}

/// One configuration of the comparison.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PaceConfiguration {
    pub name: String,
    pub forecasts: Forecasts,
    pub policy: PreemptionPolicy,
    pub k1: f64,
    pub k2: f64,
}

/// Pace §4.2's configurations: baseline, oracle optimistic and pessimistic, then ARIMA and GP
/// (pessimistic) over the K2 values.
pub fn configurations(p: &PaceParameters) -> Vec<PaceConfiguration> {
    let c = |name: String, forecasts, policy, k2| PaceConfiguration {
        name,
        forecasts,
        policy,
        k1: p.k1,
        k2,
    };
    let mut all = vec![
        c(
            "baseline".into(),
            Forecasts::None,
            PreemptionPolicy::Pessimistic,
            0.0,
        ),
        c(
            "oracle optimistic".into(),
            Forecasts::Oracle,
            PreemptionPolicy::Optimistic,
            0.0,
        ),
        c(
            "oracle pessimistic".into(),
            Forecasts::Oracle,
            PreemptionPolicy::Pessimistic,
            0.0,
        ),
    ];
    for (forecasts, label) in [(Forecasts::Arima, "arima"), (Forecasts::Gp, "gp")] {
        for &k2 in &p.k2_values {
            all.push(c(
                format!("{label} K2={k2} pessimistic"),
                forecasts,
                PreemptionPolicy::Pessimistic,
                k2,
            ));
        }
    }
    all
}

/// The oracle's view of the future: each shaped container's next sample (fractions of its
/// request), written by the simulator before every pass.
#[derive(Default)]
struct OracleBoard {
    /// The container the next `series()` calls are for (set before `track`).
    binding: Option<ContainerId>,
    /// `series()` calls since the binding: the first is CPU, the second memory (the order
    /// `ShapingState::track` creates them in).
    calls: usize,
    next: HashMap<ContainerId, (f64, f64)>,
}

struct OracleFactory(Arc<Mutex<OracleBoard>>);

struct OracleSeries {
    board: Arc<Mutex<OracleBoard>>,
    container: Option<ContainerId>,
    memory: bool,
}

impl ForecasterFactory for OracleFactory {
    fn series(&self) -> Box<dyn SeriesForecaster> {
        let (container, memory) = match self.0.lock() {
            Ok(mut b) => {
                let memory = b.calls % 2 == 1;
                b.calls += 1;
                (b.binding, memory)
            }
            Err(_) => (None, false),
        };
        Box::new(OracleSeries {
            board: self.0.clone(),
            container,
            memory,
        })
    }

    fn name(&self) -> &'static str {
        "oracle"
    }
}

impl SeriesForecaster for OracleSeries {
    /// The next sample exactly, with no variance (Pace §4.2: "perfect information").
    fn forecast_next(&mut self, _history: &[f64]) -> Option<UsageForecast> {
        let board = self.board.lock().ok()?;
        let (cpu, memory) = *board.next.get(&self.container?)?;
        Some(UsageForecast {
            peak_fraction: if self.memory { memory } else { cpu },
            variance: 0.0,
        })
    }

    fn min_history(&self) -> usize {
        1
    }
}

/// Turnaround statistics in minutes.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TurnaroundStats {
    pub mean: f64,
    pub median: f64,
    pub p95: f64,
}

fn turnaround_stats(values: &mut [f64]) -> TurnaroundStats {
    if values.is_empty() {
        return TurnaroundStats::default();
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    TurnaroundStats {
        mean: values.iter().sum::<f64>() / values.len() as f64,
        median: at(0.5),
        p95: at(0.95),
    }
}

/// One configuration's results on one seed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PaceOutcome {
    pub name: String,
    pub apps: usize,
    pub finished: usize,
    pub turnaround_min: TurnaroundStats,
    /// Σ (allocated − used) / Σ allocated over every running component-minute, percent.
    pub memory_slack_percent: f64,
    pub cpu_slack_percent: f64,
    /// Applications that crashed at least once (a core component OOM-killed), percent of apps.
    pub failed_apps_percent: f64,
    pub failed_apps: usize,
    pub crashes: u64,
    /// Elastic components OOM-killed (their application goes on).
    pub elastic_oom_kills: u64,
    /// Components Algorithm 1 preempted (including those of applications preempted whole).
    pub preempted_components: u64,
    pub preempted_apps: u64,
    /// Component-minutes of work thrown away by crashes and whole-application preemptions.
    pub work_lost_component_min: u64,
    pub work_total_component_min: u64,
    /// Minute the last application finished.
    pub makespan_min: u64,
    pub shaping_passes: u64,
}

struct Running {
    id: ContainerId,
    node: usize,
    role: ComponentRole,
    request: Resources,
    allocation: Resources,
    series: usize,
    offset: usize,
    age: usize,
    alive: bool,
}

#[derive(Default)]
struct AppRun {
    progress: u64,
    restarts: u32,
    shaped: bool,
    running: Option<Vec<Running>>,
    finished_at_s: Option<u64>,
}

fn sample(w: &PaceWorkload, c: &Running, age: usize) -> (f64, f64) {
    let s = &w.series[c.series];
    let i = (c.offset + age) % s.cpu.len();
    (s.cpu[i], s.memory[i])
}

fn use_of(request: Resources, (cpu, memory): (f64, f64)) -> Resources {
    Resources::new(
        (request.cpu_millis as f64 * cpu).round() as u64,
        (request.memory_mib as f64 * memory).round() as u64,
    )
}

/// Runs one configuration over the workload.
pub fn simulate(
    p: &PaceParameters,
    w: &PaceWorkload,
    config: &PaceConfiguration,
) -> anyhow::Result<PaceOutcome> {
    p.validate()?;
    let node_ids: Vec<NodeId> = (0..p.nodes).map(|i| NodeId::new(format!("n{i}"))).collect();
    let capacity = Resources::new(p.node_cpu_millis, p.node_memory_mib);
    let board = Arc::new(Mutex::new(OracleBoard::default()));
    let factory: Option<Box<dyn ForecasterFactory>> = match config.forecasts {
        Forecasts::None => None,
        Forecasts::Oracle => Some(Box::new(OracleFactory(board.clone()))),
        Forecasts::Gp => Some(ForecasterKind::Gp.factory(p.gp_refit_every)),
        Forecasts::Arima => Some(ForecasterKind::Arima.factory(p.arima_refit_every)),
    };
    let mut shaper = factory.map(|f| {
        ShapingState::new(
            ShapingConfig {
                buffer: ShaperConfig {
                    k1: config.k1,
                    k2: config.k2,
                },
                policy: config.policy,
                ..ShapingConfig::default()
            },
            f,
        )
    });
    if let Some(s) = &shaper {
        s.config()
            .validate()
            .map_err(|e| anyhow::anyhow!("pace {}: {e}", config.name))?;
    }
    let app_ids: Vec<AppId> = (0..w.apps.len())
        .map(|i| AppId::new(format!("app{i}")))
        .collect();
    let mut runs: Vec<AppRun> = (0..w.apps.len()).map(|_| AppRun::default()).collect();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut next_arrival = 0;
    let mut next_seq = 0u64;
    let mut out = PaceOutcome {
        name: config.name.clone(),
        apps: w.apps.len(),
        finished: 0,
        turnaround_min: TurnaroundStats::default(),
        memory_slack_percent: 0.0,
        cpu_slack_percent: 0.0,
        failed_apps_percent: 0.0,
        failed_apps: 0,
        crashes: 0,
        elastic_oom_kills: 0,
        preempted_components: 0,
        preempted_apps: 0,
        work_lost_component_min: 0,
        work_total_component_min: w.apps.iter().map(|a| a.work).sum(),
        makespan_min: 0,
        shaping_passes: 0,
    };
    let mut failed: BTreeSet<usize> = BTreeSet::new();
    let (mut alloc_mem, mut used_mem, mut alloc_cpu, mut used_cpu) = (0f64, 0f64, 0f64, 0f64);
    let mut turnarounds = Vec::new();
    for minute in 0..=p.horizon_min {
        let now_s = minute * 60;
        while next_arrival < w.apps.len() && w.apps[next_arrival].arrival_s <= now_s {
            queue.push_back(next_arrival);
            next_arrival += 1;
        }
        // This minute's use of every running component.
        let mut uses: HashMap<ContainerId, Resources> = HashMap::new();
        for run in runs.iter().filter_map(|r| r.running.as_ref()) {
            for c in run.iter().filter(|c| c.alive) {
                uses.insert(c.id, use_of(c.request, sample(w, c, c.age)));
            }
        }
        // The OS: a node whose memory demand (each component's use or allocation, the larger)
        // exceeds its memory kills the components over their allocation, largest overshoot first.
        let mut crashed: BTreeSet<usize> = BTreeSet::new();
        for node in 0..p.nodes {
            let mut demand = 0u64;
            let mut over: Vec<(u64, usize, usize)> = Vec::new();
            for (ai, run) in runs.iter().enumerate() {
                for (ci, c) in run.running.iter().flatten().enumerate() {
                    if !c.alive || c.node != node {
                        continue;
                    }
                    let u = uses[&c.id].memory_mib;
                    demand += u.max(c.allocation.memory_mib);
                    if u > c.allocation.memory_mib {
                        over.push((u - c.allocation.memory_mib, ai, ci));
                    }
                }
            }
            over.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
            for (overshoot, ai, ci) in over {
                if demand <= p.node_memory_mib {
                    break;
                }
                let Some(c) = runs[ai].running.as_mut().and_then(|r| r.get_mut(ci)) else {
                    continue;
                };
                demand -= c.allocation.memory_mib + overshoot;
                c.alive = false;
                if let Some(s) = shaper.as_mut() {
                    s.untrack(c.id);
                }
                if c.role == ComponentRole::Core {
                    crashed.insert(ai);
                } else {
                    out.elastic_oom_kills += 1;
                }
            }
        }
        // Crashes: the work is lost, the application is resubmitted.
        for &ai in &crashed {
            out.crashes += 1;
            failed.insert(ai);
            stop_app(&mut runs[ai], shaper.as_mut(), &mut out);
            queue.push_back(ai);
        }
        // Work and slack of what runs this minute.
        for (ai, run) in runs.iter_mut().enumerate() {
            let Some(comps) = run.running.as_ref() else {
                continue;
            };
            let mut done = 0;
            for c in comps.iter().filter(|c| c.alive) {
                let u = uses[&c.id];
                done += 1;
                alloc_mem += c.allocation.memory_mib as f64;
                used_mem += u.memory_mib.min(c.allocation.memory_mib) as f64;
                alloc_cpu += c.allocation.cpu_millis as f64;
                used_cpu += u.cpu_millis.min(c.allocation.cpu_millis) as f64;
            }
            run.progress += done;
            if run.progress >= w.apps[ai].work {
                let end_s = now_s + 60;
                run.finished_at_s = Some(end_s);
                turnarounds.push((end_s - w.apps[ai].arrival_s) as f64 / 60.0);
                out.makespan_min = minute + 1;
                if let Some(s) = shaper.as_mut() {
                    for c in comps {
                        s.untrack(c.id);
                    }
                }
                run.running = None;
            }
        }
        // The shaping pass, on this minute's use (it forecasts the next minute's).
        if let Some(s) = shaper.as_mut() {
            let mut hosts: HashMap<NodeId, Resources> =
                node_ids.iter().map(|n| (n.clone(), capacity)).collect();
            if let Ok(mut b) = board.lock() {
                b.next.clear();
                for run in runs.iter().filter_map(|r| r.running.as_ref()) {
                    for c in run.iter().filter(|c| c.alive) {
                        b.next.insert(c.id, sample(w, c, c.age + 1));
                    }
                }
            }
            for run in &runs {
                for c in run.running.iter().flatten().filter(|c| c.alive) {
                    if s.is_tracked(c.id) {
                        s.observe(c.id, uses[&c.id]);
                    } else if let Some(h) = hosts.get_mut(&node_ids[c.node]) {
                        // Unshaped work comes off its host.
                        *h = h.saturating_sub(&c.allocation);
                    }
                }
            }
            let outcome = s.pass(Time::from_secs(now_s), &hosts);
            out.shaping_passes += 1;
            let mut by_id: HashMap<ContainerId, (usize, usize)> = HashMap::new();
            for (ai, run) in runs.iter().enumerate() {
                for (ci, c) in run.running.iter().flatten().enumerate() {
                    by_id.insert(c.id, (ai, ci));
                }
            }
            for r in &outcome.resized {
                if let Some(&(ai, ci)) = by_id.get(&r.container)
                    && let Some(c) = runs[ai].running.as_mut().and_then(|v| v.get_mut(ci))
                {
                    c.allocation = r.to;
                }
            }
            let mut preempted_whole: BTreeSet<usize> = BTreeSet::new();
            for (_, id, _, reason) in &outcome.preempted {
                out.preempted_components += 1;
                let Some(&(ai, ci)) = by_id.get(id) else {
                    continue;
                };
                if let Some(c) = runs[ai].running.as_mut().and_then(|v| v.get_mut(ci)) {
                    c.alive = false;
                }
                if *reason == PreemptionReason::ApplicationCoreDoesNotFit {
                    preempted_whole.insert(ai);
                }
            }
            for ai in preempted_whole {
                out.preempted_apps += 1;
                stop_app(&mut runs[ai], Some(s), &mut out);
                queue.push_back(ai);
            }
        }
        for run in runs.iter_mut().filter_map(|r| r.running.as_mut()) {
            for c in run.iter_mut() {
                c.age += 1;
            }
        }
        // FIFO admission at the request, first fit over the nodes.
        let mut free: Vec<Resources> = vec![capacity; p.nodes];
        for run in runs.iter().filter_map(|r| r.running.as_ref()) {
            for c in run.iter().filter(|c| c.alive) {
                free[c.node] = free[c.node].saturating_sub(&c.allocation);
            }
        }
        while let Some(&ai) = queue.front() {
            let mut trial = free.clone();
            let mut placement = Vec::new();
            for spec in &w.apps[ai].components {
                match trial.iter().position(|f| spec.request.fits_in(f)) {
                    Some(n) => {
                        trial[n] = trial[n].saturating_sub(&spec.request);
                        placement.push(n);
                    }
                    None => break,
                }
            }
            if placement.len() < w.apps[ai].components.len() {
                break;
            }
            queue.pop_front();
            free = trial;
            let run = &mut runs[ai];
            run.shaped = shaper.is_some() && run.restarts < p.max_restarts_shaped;
            let mut comps = Vec::new();
            for (spec, node) in w.apps[ai].components.iter().zip(placement) {
                next_seq += 1;
                let id = ContainerId::new(0, next_seq);
                if run.shaped
                    && let Some(s) = shaper.as_mut()
                {
                    if let Ok(mut b) = board.lock() {
                        b.binding = Some(id);
                        b.calls = 0;
                    }
                    s.track(
                        id,
                        &app_ids[ai],
                        &node_ids[node],
                        spec.role,
                        spec.request,
                        spec.request,
                        Time::from_secs(now_s),
                    );
                }
                comps.push(Running {
                    id,
                    node,
                    role: spec.role,
                    request: spec.request,
                    allocation: spec.request,
                    series: spec.series,
                    offset: spec.offset,
                    age: 0,
                    alive: true,
                });
            }
            run.running = Some(comps);
        }
        if next_arrival == w.apps.len() && runs.iter().all(|r| r.finished_at_s.is_some()) {
            break;
        }
    }
    out.finished = turnarounds.len();
    out.turnaround_min = turnaround_stats(&mut turnarounds);
    let pct = |alloc: f64, used: f64| {
        if alloc > 0.0 {
            100.0 * (alloc - used) / alloc
        } else {
            0.0
        }
    };
    out.memory_slack_percent = pct(alloc_mem, used_mem);
    out.cpu_slack_percent = pct(alloc_cpu, used_cpu);
    out.failed_apps = failed.len();
    out.failed_apps_percent = 100.0 * failed.len() as f64 / w.apps.len() as f64;
    Ok(out)
}

/// A crashed or preempted application: its components stop, its work is lost.
fn stop_app(run: &mut AppRun, shaper: Option<&mut ShapingState>, out: &mut PaceOutcome) {
    out.work_lost_component_min += run.progress;
    run.progress = 0;
    run.restarts += 1;
    if let (Some(s), Some(comps)) = (shaper, run.running.as_ref()) {
        for c in comps {
            s.untrack(c.id);
        }
    }
    run.running = None;
}

/// Every configuration on one seed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PaceRun {
    pub seed: u64,
    pub configurations: Vec<PaceOutcome>,
    pub headline: Vec<HeadlineRatio>,
}

/// The multi-seed report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PaceReport {
    pub experiment: String,
    pub command: String,
    pub seeds: Vec<u64>,
    pub parameters: PaceParameters,
    pub series: Vec<String>,
    pub headline: Vec<HeadlineSpread>,
    pub runs: Vec<PaceRun>,
    pub wall_s: f64,
}

fn headline(outcomes: &[PaceOutcome]) -> Vec<HeadlineRatio> {
    let find = |name: &str| outcomes.iter().find(|o| o.name == name);
    let mut h = Vec::new();
    if let (Some(base), Some(gp)) = (find("baseline"), find("gp K2=3 pessimistic"))
        && base.turnaround_min.mean > 0.0
    {
        h.push(HeadlineRatio {
            claim: "GP K2=3 K1=5% pessimistic vs reservation baseline: mean turnaround \
                    reduction (paper 10.6x = 90.6% less)"
                .into(),
            paper_percent: 100.0 * (1.0 - 1.0 / 10.6),
            ours_percent: 100.0 * (1.0 - gp.turnaround_min.mean / base.turnaround_min.mean),
        });
    }
    if let (Some(opt), Some(pess)) = (find("oracle optimistic"), find("oracle pessimistic")) {
        h.push(HeadlineRatio {
            claim: "oracle: application failures avoided by the pessimistic policy vs the \
                    optimistic one, points of apps (paper 37.67% vs 0%)"
                .into(),
            paper_percent: 37.67,
            ours_percent: opt.failed_apps_percent - pess.failed_apps_percent,
        });
    }
    h
}

/// Every configuration on one seed, `threads` at a time.
pub fn run_seed(
    p: &PaceParameters,
    series: &[UsageSeries],
    seed: u64,
    configs: &[PaceConfiguration],
    threads: usize,
    progress: bool,
) -> anyhow::Result<PaceRun> {
    let w = build_workload(p, series.to_vec(), seed)?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Mutex<Vec<Option<anyhow::Result<PaceOutcome>>>> =
        Mutex::new((0..configs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(c) = configs.get(i) else {
                        break;
                    };
                    let started = std::time::Instant::now();
                    let r = simulate(p, &w, c);
                    if progress {
                        eprintln!(
                            "pace seed {seed}: {} done in {:.1} s",
                            c.name,
                            started.elapsed().as_secs_f64()
                        );
                    }
                    if let Ok(mut all) = results.lock() {
                        all[i] = Some(r);
                    }
                }
            });
        }
    });
    let configurations = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("pace: a simulation thread panicked"))?
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("pace: a configuration did not run"))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(PaceRun {
        seed,
        headline: headline(&configurations),
        configurations,
    })
}

/// The experiment over several seeds.
pub fn pace_seeds(
    p: &PaceParameters,
    seeds: &[u64],
    threads: usize,
    command: &str,
) -> anyhow::Result<PaceReport> {
    let started = std::time::Instant::now();
    let series = load_series(p, &traces_dir())?;
    let configs = configurations(p);
    let runs = seeds
        .iter()
        .map(|&s| run_seed(p, &series, s, &configs, threads, true))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let per_seed: Vec<Vec<HeadlineRatio>> = runs.iter().map(|r| r.headline.clone()).collect();
    Ok(PaceReport {
        experiment: "pace".into(),
        command: command.to_string(),
        seeds: seeds.to_vec(),
        parameters: p.clone(),
        series: series.iter().map(|s| s.source.clone()).collect(),
        headline: headline_spreads(&per_seed),
        runs,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// report.md and report.json.
pub fn write_report(report: &PaceReport, dir: &Path) -> anyhow::Result<()> {
    use std::fmt::Write;
    super::write_report_json(report, dir)?;
    let mut md = String::new();
    writeln!(md, "# Pace §4 on the simulator\n")?;
    writeln!(md, "Command: `{}`  ", report.command)?;
    writeln!(
        md,
        "Seeds: {:?}; wall time {:.0} s. Parameters and sources: [parameters.md](parameters.md). \
         Usage series: {}.\n",
        report.seeds,
        report.wall_s,
        report.series.join(", ")
    )?;
    writeln!(md, "## Headline (positive = better)\n")?;
    writeln!(md, "| claim | paper | ours mean | min | max | by seed |")?;
    writeln!(md, "|---|---|---|---|---|---|")?;
    for h in &report.headline {
        writeln!(
            md,
            "| {} | {:+.1} % | {:+.1} % | {:+.1} % | {:+.1} % | {:?} |",
            h.claim,
            h.paper_percent,
            h.mean,
            h.min,
            h.max,
            h.by_seed
                .iter()
                .map(|v| (v * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        )?;
    }
    writeln!(
        md,
        "\n## Per configuration (mean over seeds [min, max])\n\n\
         | configuration | turnaround mean (min) | median | p95 | memory slack % | CPU slack % | \
         failed apps % | crashes | elastic OOM kills | preempted components | preempted apps | \
         work lost (% of work) | unfinished |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    let Some(first) = report.runs.first() else {
        std::fs::write(dir.join("report.md"), md)?;
        return Ok(());
    };
    for (i, c) in first.configurations.iter().enumerate() {
        let col = |f: &dyn Fn(&PaceOutcome) -> f64| {
            let v: Vec<f64> = report
                .runs
                .iter()
                .filter_map(|r| r.configurations.get(i))
                .map(f)
                .collect();
            let (mean, min, max, _) = spread(&v);
            format!("{mean:.1} [{min:.1}, {max:.1}]")
        };
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.name,
            col(&|o| o.turnaround_min.mean),
            col(&|o| o.turnaround_min.median),
            col(&|o| o.turnaround_min.p95),
            col(&|o| o.memory_slack_percent),
            col(&|o| o.cpu_slack_percent),
            col(&|o| o.failed_apps_percent),
            col(&|o| o.crashes as f64),
            col(&|o| o.elastic_oom_kills as f64),
            col(&|o| o.preempted_components as f64),
            col(&|o| o.preempted_apps as f64),
            col(&|o| 100.0 * o.work_lost_component_min as f64
                / o.work_total_component_min.max(1) as f64),
            col(&|o| (o.apps - o.finished) as f64),
        )?;
    }
    std::fs::write(dir.join("report.md"), md)?;
    Ok(())
}

/// `testbed experiment pace`.
pub fn run_cli(args: &super::cli::ExperimentArgs) -> anyhow::Result<()> {
    let seeds = args.seed_list();
    let command = super::cli::command_line();
    let report = pace_seeds(&PaceParameters::default(), &seeds, args.threads, &command)?;
    super::cli::publish_report(
        &report,
        args.report.as_deref(),
        args.json,
        write_report,
        |report| {
            println!(
                "pace experiment, seeds {:?}, {:.1} s wall",
                report.seeds, report.wall_s
            );
            for r in &report.runs {
                for o in &r.configurations {
                    println!(
                        "  seed {:<3} {:<24} turnaround mean {:>7.1} median {:>7.1} p95 {:>7.1} min  mem slack {:>5.1}%  cpu slack {:>5.1}%  failed {:>5.1}%  preempted {:>4} comps {:>3} apps  work lost {:>7}",
                        r.seed,
                        o.name,
                        o.turnaround_min.mean,
                        o.turnaround_min.median,
                        o.turnaround_min.p95,
                        o.memory_slack_percent,
                        o.cpu_slack_percent,
                        o.failed_apps_percent,
                        o.preempted_components,
                        o.preempted_apps,
                        o.work_lost_component_min
                    );
                }
            }
            println!("headline (paper vs ours, mean [min, max]):");
            for h in &report.headline {
                println!(
                    "  {:<110} {:>+7.1}% {:>+7.1}% [{:+.1}, {:+.1}]",
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

    /// Small synthetic series (no trace needed): a steady low use with a periodic burst.
    fn series() -> Vec<UsageSeries> {
        (0..3)
            .map(|k| UsageSeries {
                source: format!("synthetic/{k}"),
                cpu: (0..200)
                    .map(|i| 0.2 + 0.1 * ((i + k) % 7) as f64 / 7.0)
                    .collect(),
                memory: (0..200)
                    .map(|i| if (i + 3 * k) % 40 < 30 { 0.2 } else { 0.6 })
                    .collect(),
            })
            .collect()
    }

    fn small() -> PaceParameters {
        PaceParameters {
            nodes: 2,
            apps: 12,
            duration_min: (15, 40),
            horizon_min: 3_000,
            ..PaceParameters::default()
        }
    }

    /// A tiny run through the real shaping pass: every app finishes, the baseline never shapes
    /// nor fails, the oracle's pessimistic policy never crashes an app and holds less slack than
    /// the baseline, and the same seed gives the same outcome.
    #[test]
    fn pace_tiny_run_is_deterministic_and_the_oracle_pessimistic_policy_never_crashes() {
        let p = small();
        let w = build_workload(&p, series(), 5).expect("workload");
        let configs = configurations(&p);
        let pick = |name: &str| {
            configs
                .iter()
                .find(|c| c.name == name)
                .expect("configuration")
        };
        let base = simulate(&p, &w, pick("baseline")).expect("baseline");
        assert_eq!(base.finished, p.apps, "{base:?}");
        assert_eq!(base.shaping_passes, 0);
        assert_eq!(base.crashes + base.preempted_components, 0);
        let pess = simulate(&p, &w, pick("oracle pessimistic")).expect("oracle");
        assert_eq!(pess.finished, p.apps, "{pess:?}");
        assert_eq!(pess.crashes, 0, "{pess:?}");
        assert!(
            pess.memory_slack_percent < base.memory_slack_percent,
            "{pess:?} vs {base:?}"
        );
        let gp = simulate(&p, &w, pick("gp K2=3 pessimistic")).expect("gp");
        assert_eq!(gp.finished, p.apps, "{gp:?}");
        assert!(gp.shaping_passes > 0);
        let again = simulate(&p, &w, pick("gp K2=3 pessimistic")).expect("gp again");
        assert_eq!(gp, again);
    }

    /// Use swinging between 10 % and 90 % of the request: once shaped allocations let more apps
    /// in, the swings collide. The optimistic policy caps growth at the room left and the OS
    /// kills; Algorithm 1 preempts instead and no app crashes.
    #[test]
    fn under_contention_the_optimistic_oracle_gets_oom_kills_and_the_pessimistic_one_preempts() {
        let swinging: Vec<UsageSeries> = (0..2)
            .map(|k| UsageSeries {
                source: format!("swing/{k}"),
                cpu: vec![0.3; 120],
                memory: (0..120)
                    .map(|i| if (i + 17 * k) % 60 < 30 { 0.1 } else { 0.9 })
                    .collect(),
            })
            .collect();
        let p = PaceParameters {
            nodes: 2,
            apps: 30,
            duration_min: (60, 120),
            horizon_min: 20_000,
            ..PaceParameters::default()
        };
        let w = build_workload(&p, swinging, 9).expect("workload");
        let configs = configurations(&p);
        let run = |name: &str| {
            let c = configs.iter().find(|c| c.name == name).expect("config");
            simulate(&p, &w, c).expect("simulate")
        };
        let opt = run("oracle optimistic");
        let pess = run("oracle pessimistic");
        assert!(opt.crashes + opt.elastic_oom_kills > 0, "{opt:?}");
        assert_eq!(pess.crashes + pess.elastic_oom_kills, 0, "{pess:?}");
        assert!(pess.preempted_components > 0, "{pess:?}");
        assert_eq!(pess.finished, p.apps, "{pess:?}");
    }

    #[test]
    fn bad_parameters_are_refused_with_their_name() {
        let p = PaceParameters {
            duration_min: (10, 5),
            ..small()
        };
        let e = build_workload(&p, series(), 1).unwrap_err().to_string();
        assert!(e.contains("duration_min"), "{e}");
    }
}

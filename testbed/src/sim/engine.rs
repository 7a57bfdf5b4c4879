//! The simulation state and its event handlers. See the module documentation of [`crate::sim`].

use super::diagnose::{ClusterSample, Diagnostics, NodeSample, quantile};
use super::events::EventQueue;
use super::wakes::LazyHeartbeats;
use super::{
    CoordinatorCost, EstimateAccuracy, EstimateModel, GuaranteedAllocation, GuaranteedPlacerKind,
    LatencySummary, SimConfig, SimReport,
};
use crate::workload::{JobSpec, JobStream};
use inference::predictor::{JobFeatures, PredictorConfig, RuntimePredictor, SubmittedEstimates};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState, SheddingRound};
use scheduler_core::distributed::{
    ClusterView, DistributedScheduler, DistributedSchedulerConfig, NodeDirectoryEntry, NodeLoad,
    QueueableAsk, replacement_wait_bound_ms,
};
use scheduler_core::guarantor::{
    BestFit, GuaranteedAsk, GuaranteedPlacement, GuaranteedPlacer, Guarantor, GuarantorConfig,
    QueueableAware, QueueableLoad,
};
use scheduler_core::ids::NameBuildHasher;
use scheduler_core::node::{ContainerSpec, NodeEvent, NodeRuntime, NodeRuntimeConfig};
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::{
    AppId, ContainerId, ContainerType, JobId, KillReason, NodeId, Resources, Time,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

/// How many past top-k rounds are kept: a node's last acknowledgement is at most two rounds old.
const ROUND_RING: usize = 4;
/// Token lifetime handed to the schedulers (YARN's 600 s allocation expiry).
const TOKEN_TTL_MS: u64 = 600_000;

/// A cheap deterministic hasher for container ids (the std hasher is seeded per process).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

type IdMap<V> = HashMap<ContainerId, V, BuildHasherDefault<IdHasher>>;

enum Ev {
    /// The next job of the workload arrives.
    Arrival,
    /// A job manager's QUEUEABLE asks for all its QUEUEABLE tasks reach its distributed scheduler.
    JobQueueableAsks {
        job: u32,
    },
    /// A job manager asks again for one QUEUEABLE task (after a shed or kill).
    QueueableAsk {
        job: u32,
        task: u32,
    },
    /// A job manager's GUARANTEED asks reach the guarantor.
    GuaranteedAsks {
        job: u32,
    },
    /// `start_container` with a grant reaches the node.
    StartContainer {
        cid: ContainerId,
    },
    /// A running task's process ends.
    TaskExit {
        cid: ContainerId,
    },
    /// The job manager learns a task completed.
    TaskDone {
        job: u32,
        task: u32,
    },
    /// The job manager learns a QUEUEABLE task was shed or killed.
    TaskLost {
        job: u32,
        task: u32,
    },
    Heartbeat {
        node: u32,
    },
    HeartbeatArrival {
        node: u32,
    },
    HeartbeatAck {
        node: u32,
    },
    /// The coordinator recomputes top-k and the shedding threshold.
    Round,
    /// Event-driven allocation: a GUARANTEED finish notice reaches the guarantor.
    GuarantorFinish {
        cid: ContainerId,
        node: u32,
    },
    End,
}

/// Where the next event comes from.
#[derive(Clone, Copy)]
enum Source {
    Queue,
    Heartbeat(u32),
    Arrival(u32),
    Ack(u32),
}

struct ContainerRecord {
    job: u32,
    task: u32,
    node: u32,
    container_type: ContainerType,
    estimate_ms: Option<u64>,
    submit_ms: u64,
    started_at: Option<Time>,
    /// When the job manager got the grant (diagnostics: time lost to sheds and kills).
    placed_at: Time,
    /// Its token's count of the times its task's work was shed or returned before.
    times_returned: u8,
}

struct Ack {
    threshold_ms: Option<f64>,
    queueable_limit: Option<Resources>,
    view_round: u64,
}

struct SimNode {
    id: NodeId,
    runtime: NodeRuntime,
    slowdown: f64,
    /// GUARANTEED containers finished since the last heartbeat (reported with it).
    finished_guaranteed: Vec<ContainerId>,
    report: Option<(QueueDelay, Vec<ContainerId>, QueueableLoad)>,
    ack: Option<Ack>,
    /// The top-k round this node's last acknowledgement carried.
    view_round: u64,
    scheduler: Option<usize>,
    /// The coordinator holds R = 0 for it (its last report was zero).
    reported_zero: bool,
    /// The R of its last heartbeat (diagnostics).
    last_reported_r_ms: f64,
    /// It may host job managers: it must keep receiving top-k views, so it never sleeps.
    hosts_job_managers: bool,
}

/// A node's heartbeat schedule and sleep, kept apart from [`SimNode`] so that waking and
/// putting to sleep thousands of idle nodes per GUARANTEED ask touches little memory.
#[derive(Clone, Copy)]
struct Sleep {
    /// Heartbeat phase within the interval (µs).
    phase_us: u64,
    /// When its last elided heartbeat would have been sent (µs).
    slept_at_us: u64,
    /// Its heartbeats are elided because they would change nothing (see `can_sleep`).
    dormant: bool,
}

impl Sleep {
    /// Its first heartbeat slot strictly after `now_us`.
    fn next_slot_after(&self, now_us: u64, interval_us: u64) -> u64 {
        if now_us < self.phase_us {
            self.phase_us
        } else {
            self.phase_us + ((now_us - self.phase_us) / interval_us + 1) * interval_us
        }
    }
}

struct HostedScheduler {
    scheduler: DistributedScheduler,
    installed_round: u64,
}

struct TaskState {
    /// Times it was shed or killed, and the time it spent placed before each (diagnostics).
    sheds: u32,
    kills: u32,
    lost_to_sheds: Duration,
    lost_to_kills: Duration,
    runtime_ms: u64,
    /// The job manager's estimate (`None`: it has none, see [`EstimateModel::Predicted`]).
    estimate_ms: Option<u64>,
    resources: Resources,
}

struct JobState {
    id: JobId,
    class: String,
    arrival: Time,
    admitted: Time,
    host: u32,
    submit_ms: u64,
    tasks: Vec<TaskState>,
    remaining: usize,
    queueable_tasks: Vec<u32>,
    pending_guaranteed: VecDeque<u32>,
    /// Its predictor features and what every expert estimated at admission
    /// ([`EstimateModel::Predicted`] only): the job is learnt from, and the experts scored,
    /// when it ends.
    features: Option<(JobFeatures, SubmittedEstimates)>,
}

/// A simulation in progress. Build with [`Simulation::new`], drive with [`Simulation::run`] (or
/// [`Simulation::run_until`]), read the outcome with [`Simulation::report`].
pub struct Simulation {
    config: SimConfig,
    queue: EventQueue<Ev>,
    now: Time,
    end: Option<Time>,
    finished: bool,
    nodes: Vec<SimNode>,
    node_index: HashMap<NodeId, u32, NameBuildHasher>,
    directory: Vec<NodeDirectoryEntry>,
    hosts: Vec<u32>,
    schedulers: Vec<HostedScheduler>,
    /// Node index of each scheduler issuer prefix: issuer = `first_issuer` + node index.
    first_issuer: u32,
    coordinator: CoordinatorState,
    guarantor: Guarantor,
    rounds: Vec<Vec<NodeLoad>>,
    round: u64,
    /// The round's shedding threshold and the nodes it goes to (the outliers).
    shedding: SheddingRound,
    containers: IdMap<ContainerRecord>,
    sleep: Vec<Sleep>,
    /// Nodes that may be dormant (entries are re-checked against `Sleep::dormant`).
    dormant: Vec<u32>,
    /// Spare buffer for `dormant` (kept to reuse its allocation).
    dormant_spare: Vec<u32>,
    /// Node heartbeats, held outside the event queue (`None`: they go through the queue, as
    /// when two nodes share a heartbeat instant).
    lazy: Option<LazyHeartbeats>,
    /// Heartbeat arrivals and acknowledgements, held likewise (a fixed delay after a slot).
    held_arrivals: Option<LazyHeartbeats>,
    held_acks: Option<LazyHeartbeats>,
    jobs: Vec<Option<JobState>>,
    running_jobs: usize,
    workload: JobStream,
    next_job: Option<JobSpec>,
    arrival_scheduled: bool,
    exhausted: bool,
    app: AppId,
    quota: QueueableQuota,
    app_rng: StdRng,
    place_rng: StdRng,
    coordinator_rng: StdRng,
    estimate_rng: StdRng,
    /// 3σPredict for [`EstimateModel::Predicted`], learning from the jobs finished so far.
    predictor: Option<RuntimePredictor>,
    estimate_accuracy: EstimateAccuracy,
    /// Estimated jobs whose estimate was within 2× of their mean task runtime.
    estimates_within_2x: u64,
    stats: Stats,
    events: u64,
    wall: Duration,
    /// The coordinator's share of heartbeats and rounds, timed (see [`CoordinatorCost`]).
    coordinator_timing: CoordinatorTiming,
    /// Issue-15 diagnostics (opt-in, see [`Simulation::enable_diagnostics`]).
    diag: Option<Box<DiagState>>,
}

/// Diagnostics being recorded.
struct DiagState {
    out: Diagnostics,
    next_sample: Time,
    samples: u64,
    /// Per node: samples (in the window) with an idle core and an empty queue, and all samples.
    starved_samples: Vec<u64>,
    window_samples: u64,
    sheds_since_sample: u64,
    kills_since_sample: u64,
    traced: Vec<u32>,
}

#[derive(Default)]
struct Stats {
    tasks_completed: u64,
    tasks_in_window: u64,
    jobs_completed: u64,
    jobs_in_window: u64,
    latencies_s: Vec<f64>,
    latencies_by_class_s: BTreeMap<String, Vec<f64>>,
    admission_wait_s: f64,
    admitted: u64,
    killed: u64,
    shed: u64,
    guaranteed: u64,
    queueable: u64,
    cpu_ms_in_window: f64,
    last_completion: Time,
}

fn seeded(seed: u64, stream: u64) -> StdRng {
    // SplitMix64 of (seed, stream) so the streams are independent.
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    StdRng::seed_from_u64(z ^ (z >> 31))
}

impl Simulation {
    pub fn new(config: SimConfig, workload: JobStream) -> Result<Simulation, String> {
        Simulation::build(config, workload, true)
    }

    /// `hold_heartbeats`: keep node heartbeats out of the event queue where possible (the
    /// outcome is the same either way; tests compare the two).
    fn build(
        config: SimConfig,
        workload: JobStream,
        hold_heartbeats: bool,
    ) -> Result<Simulation, String> {
        config.validate()?;
        let n = config.nodes;
        let mut coordinator = CoordinatorState::new(
            CoordinatorConfig {
                // More candidates than k: schedulers choose among the k of least estimated R.
                top_k: config.top_k.saturating_mul(config.view_candidates_per_k),
                shedding: config.shedding,
                min_shedding_threshold_ms: config.min_shedding_threshold_ms,
                node_timeout: Duration::from_secs(u64::MAX / 4_000_000),
                new_nodes_per_answer: config.top_k,
                // Never consulted: the simulator's nodes do not go silent.
                loss_guard: Default::default(),
            },
            1,
        );
        let mut guarantor = Guarantor::new(
            GuarantorConfig {
                token_ttl_ms: TOKEN_TTL_MS,
            },
            match config.guaranteed_placer {
                GuaranteedPlacerKind::BestFit => Box::new(BestFit) as Box<dyn GuaranteedPlacer>,
                GuaranteedPlacerKind::QueueableAware => Box::new(QueueableAware {
                    patience_ms: config.heartbeat_interval_ms,
                }),
            },
            0,
        );
        let stragglers = config
            .stragglers
            .map_or(0, |s| (s.fraction * n as f64).ceil() as usize);
        let slowdown = config.stragglers.map_or(1.0, |s| s.slowdown);
        let mut nodes = Vec::with_capacity(n);
        let mut node_index = HashMap::with_capacity_and_hasher(n, Default::default());
        let mut first_issuer = 0;
        for i in 0..n {
            let id = NodeId::new(format!("n{i}"));
            let rack = format!("r{}", i / config.rack_size);
            let issuer = coordinator.join(
                Time::ZERO,
                NodeDirectoryEntry {
                    node_id: id.clone(),
                    rack: rack.clone(),
                    capacity: config.node_capacity,
                    app_endpoint: format!("{id}:7500"),
                    slot: i as u32,
                },
            );
            if i == 0 {
                first_issuer = issuer;
            }
            guarantor.add_node(id.clone(), rack, config.node_capacity);
            let mut runtime_config = NodeRuntimeConfig::new(config.node_capacity);
            runtime_config.reorder_by_job_submit_time = config.reorder_by_job_submit_time;
            node_index.insert(id.clone(), i as u32);
            nodes.push(SimNode {
                id,
                runtime: NodeRuntime::new(runtime_config, Time::ZERO),
                slowdown: if i < stragglers { slowdown } else { 1.0 },
                finished_guaranteed: Vec::new(),
                report: None,
                ack: None,
                view_round: 0,
                scheduler: None,
                reported_zero: true,
                last_reported_r_ms: 0.0,
                hosts_job_managers: false,
            });
        }
        let directory: Vec<NodeDirectoryEntry> = coordinator.nodes().cloned().collect();
        let host_count = config.job_manager_hosts.min(n);
        let hosts: Vec<u32> = (0..host_count)
            .map(|h| (h * n / host_count) as u32)
            .collect();
        for &h in &hosts {
            nodes[h as usize].hosts_job_managers = true;
        }
        let mut coordinator_rng = seeded(config.seed, 3);
        let first_round = coordinator.top_k(Time::ZERO, &mut coordinator_rng);
        let mut rounds = vec![Vec::new(); ROUND_RING];
        rounds[0] = first_round;
        let mut sim = Simulation {
            end: config.duration_ms.map(Time::from_millis),
            queue: EventQueue::default(),
            now: Time::ZERO,
            finished: false,
            nodes,
            node_index,
            directory,
            hosts,
            schedulers: Vec::new(),
            first_issuer,
            shedding: coordinator.shedding_round(),
            coordinator,
            guarantor,
            rounds,
            round: 0,
            containers: IdMap::default(),
            sleep: (0..n)
                .map(|i| Sleep {
                    phase_us: (config.heartbeat_interval_ms * 1000) * i as u64 / n as u64,
                    slept_at_us: 0,
                    dormant: false,
                })
                .collect(),
            dormant: Vec::new(),
            dormant_spare: Vec::new(),
            lazy: None,
            held_arrivals: None,
            held_acks: None,
            jobs: Vec::new(),
            running_jobs: 0,
            workload,
            next_job: None,
            arrival_scheduled: false,
            exhausted: false,
            app: AppId::from("sim-app"),
            quota: QueueableQuota::default(),
            app_rng: seeded(config.seed, 1),
            place_rng: seeded(config.seed, 2),
            coordinator_rng,
            estimate_rng: seeded(config.seed, 4),
            predictor: (config.estimate == EstimateModel::Predicted)
                .then(|| RuntimePredictor::new(PredictorConfig::default())),
            estimate_accuracy: EstimateAccuracy::default(),
            estimates_within_2x: 0,
            stats: Stats::default(),
            events: 0,
            wall: Duration::ZERO,
            coordinator_timing: CoordinatorTiming::default(),
            diag: None,
            config,
        };
        let interval = sim.config.heartbeat_interval_ms * 1000;
        if hold_heartbeats {
            let phases: Vec<u64> = sim.sleep.iter().map(|s| s.phase_us).collect();
            let delay = sim.config.delays.heartbeat_ms * 1000;
            sim.lazy = LazyHeartbeats::new(interval, 0, phases.clone());
            if sim.lazy.is_some() {
                sim.held_arrivals = LazyHeartbeats::new(interval, delay, phases.clone());
                sim.held_acks = LazyHeartbeats::new(interval, 2 * delay, phases);
                if sim.held_arrivals.is_none() || sim.held_acks.is_none() {
                    sim.held_arrivals = None;
                    sim.held_acks = None;
                }
            }
        }
        for i in 0..n {
            // Heartbeats are spread evenly over the interval, as independent nodes' would be.
            let offset = sim.sleep[i].phase_us;
            sim.push_heartbeat(i as u32, Time::from_micros(offset));
        }
        sim.queue.push(Time::from_micros(interval), Ev::Round);
        if let Some(end) = sim.end {
            sim.queue.push(end, Ev::End);
        }
        sim.try_admit();
        Ok(sim)
    }

    /// Simulated time now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Events processed so far.
    pub fn events_processed(&self) -> u64 {
        self.events
    }

    /// Run to the end (the configured duration, or until the workload is drained).
    pub fn run(&mut self) {
        self.run_until(None);
    }

    /// Run until simulated time `until` (or the end). Returns true if the run is over.
    pub fn run_until(&mut self, until: Option<Time>) -> bool {
        let started = Instant::now();
        let progress = self.config.progress.then(|| {
            let bar = match self.end {
                Some(end) => indicatif::ProgressBar::new(end.as_micros() / 1_000_000),
                None => indicatif::ProgressBar::new_spinner(),
            };
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} simulated {pos}s / {len}s [{elapsed_precise}] {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        while !self.finished {
            // The earliest of the queue's head and the held heartbeats, arrivals and
            // acknowledgements, by (time, sequence number).
            let mut next: Option<(Time, u64, Source)> =
                self.queue.peek_key().map(|(t, s)| (t, s, Source::Queue));
            for (held, source) in [
                (&self.lazy, Source::Heartbeat as fn(u32) -> Source),
                (&self.held_arrivals, Source::Arrival),
                (&self.held_acks, Source::Ack),
            ] {
                if let Some((t, s, node)) = held.as_ref().and_then(LazyHeartbeats::next)
                    && next.is_none_or(|(nt, ns, _)| (t, s) < (nt, ns))
                {
                    next = Some((t, s, source(node)));
                }
            }
            let Some((at, _, source)) = next else {
                self.finished = true;
                break;
            };
            if until.is_some_and(|u| at > u) {
                break;
            }
            while let Some(due) = self.diag.as_ref().map(|d| d.next_sample)
                && due <= at
            {
                self.now = due;
                self.diagnose_sample();
            }
            self.now = at;
            self.events += 1;
            match source {
                Source::Heartbeat(node) => self.held_heartbeat(node),
                Source::Arrival(node) => {
                    if let Some(held) = self.held_arrivals.as_mut() {
                        held.take(node, at);
                    }
                    self.heartbeat_arrival(node);
                }
                Source::Ack(node) => {
                    if let Some(held) = self.held_acks.as_mut() {
                        held.take(node, at);
                    }
                    self.heartbeat_ack(node);
                }
                Source::Queue => {
                    if let Some((_, ev)) = self.queue.pop() {
                        self.handle(ev);
                    }
                }
            }
            if let Some(bar) = &progress
                && self.events.is_multiple_of(65_536)
            {
                bar.set_position(self.now.as_micros() / 1_000_000);
                bar.set_message(format!("{} events", self.events));
            }
        }
        if let Some(bar) = progress {
            bar.finish_and_clear();
        }
        self.wall += started.elapsed();
        self.finished
    }

    fn after_ms(&self, ms: u64) -> Time {
        self.now + Duration::from_millis(ms)
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Arrival => {
                self.arrival_scheduled = false;
                self.try_admit();
            }
            Ev::JobQueueableAsks { job } => {
                let tasks = self.jobs[job as usize]
                    .as_ref()
                    .map(|j| j.queueable_tasks.clone())
                    .unwrap_or_default();
                for task in tasks {
                    self.place_queueable(job, task);
                }
            }
            Ev::QueueableAsk { job, task } => self.place_queueable(job, task),
            Ev::GuaranteedAsks { job } => self.ask_guaranteed(job),
            Ev::StartContainer { cid } => self.start_container(cid),
            Ev::TaskExit { cid } => {
                let Some(rec) = self.containers.get(&cid) else {
                    return; // killed before it could finish
                };
                let node = rec.node;
                if self.nodes[node as usize]
                    .runtime
                    .on_exit(self.now, cid, 0)
                    .is_ok()
                {
                    self.node_events(node);
                }
            }
            Ev::TaskDone { job, task } => self.task_done(job, task),
            Ev::TaskLost { job, task } => {
                let delay = self.config.delays.queueable_ask_ms;
                self.queue
                    .push(self.after_ms(delay), Ev::QueueableAsk { job, task });
            }
            Ev::Heartbeat { node } => self.heartbeat(node),
            Ev::HeartbeatArrival { node } => self.heartbeat_arrival(node),
            Ev::HeartbeatAck { node } => self.heartbeat_ack(node),
            Ev::Round => self.coordinator_round(),
            Ev::GuarantorFinish { cid, node } => {
                self.guarantor.on_finished(cid);
                let id = self.nodes[node as usize].id.clone();
                let placements = self.guarantor.schedule_on_node(self.now.as_millis(), &id);
                self.deliver_grants(placements);
                self.check_guarantor();
            }
            Ev::End => self.finished = true,
        }
    }

    // ---- job managers -------------------------------------------------------------------

    fn try_admit(&mut self) {
        while self.running_jobs < self.config.max_concurrent_jobs {
            if self.next_job.is_none() {
                self.next_job = self.workload.next();
                if self.next_job.is_none() {
                    self.exhausted = true;
                    break;
                }
            }
            let Some(arrival) = self.next_job.as_ref().map(|j| j.arrival) else {
                break;
            };
            if arrival > self.now {
                if !self.arrival_scheduled {
                    self.queue.push(arrival, Ev::Arrival);
                    self.arrival_scheduled = true;
                }
                break;
            }
            if let Some(spec) = self.next_job.take() {
                self.admit(spec);
            }
        }
        if self.exhausted && self.running_jobs == 0 && self.config.duration_ms.is_none() {
            self.finished = true;
        }
    }

    /// A task's estimate under the exact or noisy model; `job_estimate_ms` is the job's
    /// predicted estimate under [`EstimateModel::Predicted`].
    fn estimate(&mut self, runtime_ms: u64, job_estimate_ms: Option<u64>) -> Option<u64> {
        match self.config.estimate {
            EstimateModel::Exact => Some(runtime_ms),
            EstimateModel::Noisy { sigma } => {
                // Box–Muller standard normal.
                let u1: f64 = self.estimate_rng.random_range(f64::EPSILON..1.0);
                let u2: f64 = self.estimate_rng.random_range(0.0..1.0);
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                Some(((runtime_ms as f64) * (sigma * z).exp()).round().max(1.0) as u64)
            }
            EstimateModel::Predicted => job_estimate_ms,
        }
    }

    /// The job's features for the predictor (its own, then one every job shares so that any
    /// history at all gives an estimate) and the median of its predicted runtime distribution.
    fn predict_job(
        &mut self,
        spec: &JobSpec,
    ) -> Option<((JobFeatures, SubmittedEstimates), Option<u64>)> {
        let predictor = self.predictor.as_ref()?;
        let mut features = JobFeatures::new();
        for (name, value) in &spec.features {
            features.push(name.as_str(), value.as_str());
        }
        features.push("cluster", "all");
        // One pass gives both the prediction and the estimates scored when the job finishes.
        let (prediction, submitted) = predictor.predict_with_submitted(&features);
        let estimate = prediction.map(|p| p.distribution.median().round().max(1.0) as u64);
        let mean_ms = spec.tasks.iter().map(|t| t.runtime_ms).sum::<u64>() as f64
            / spec.tasks.len().max(1) as f64;
        self.estimate_accuracy.jobs += 1;
        if let Some(e) = estimate {
            self.estimate_accuracy.estimated += 1;
            let e = e as f64;
            if e >= mean_ms / 2.0 && e <= mean_ms * 2.0 {
                self.estimates_within_2x += 1;
            }
        }
        Some(((features, submitted), estimate))
    }

    fn admit(&mut self, spec: JobSpec) {
        let job = self.jobs.len() as u32;
        let host = self.hosts[job as usize % self.hosts.len()];
        self.ensure_scheduler(host);
        self.stats.admitted += 1;
        self.stats.admission_wait_s += self.now.saturating_since(spec.arrival).as_secs_f64();
        let (features, job_estimate_ms) = match self.predict_job(&spec) {
            Some((features, estimate)) => (Some(features), estimate),
            None => (None, None),
        };
        let mut state = JobState {
            features,
            id: JobId::new(format!("j{job}")),
            class: spec.class,
            arrival: spec.arrival,
            admitted: self.now,
            host,
            submit_ms: self.now.as_millis(),
            tasks: Vec::with_capacity(spec.tasks.len()),
            remaining: spec.tasks.len(),
            queueable_tasks: Vec::new(),
            pending_guaranteed: VecDeque::new(),
        };
        for (i, t) in spec.tasks.into_iter().enumerate() {
            let estimate_ms = self.estimate(t.runtime_ms, job_estimate_ms);
            match self.config.policy.choose(estimate_ms, &mut self.app_rng) {
                ContainerType::Queueable => state.queueable_tasks.push(i as u32),
                ContainerType::Guaranteed => state.pending_guaranteed.push_back(i as u32),
            }
            state.tasks.push(TaskState {
                sheds: 0,
                kills: 0,
                lost_to_sheds: Duration::ZERO,
                lost_to_kills: Duration::ZERO,
                runtime_ms: t.runtime_ms,
                estimate_ms,
                resources: t.resources,
            });
        }
        let (has_q, has_g) = (
            !state.queueable_tasks.is_empty(),
            !state.pending_guaranteed.is_empty(),
        );
        let empty = state.tasks.is_empty();
        self.jobs.push(Some(state));
        self.running_jobs += 1;
        if empty {
            self.finish_job(job);
            return;
        }
        if has_q {
            let at = self.after_ms(self.config.delays.queueable_ask_ms);
            self.queue.push(at, Ev::JobQueueableAsks { job });
        }
        if has_g {
            let at = self.after_ms(self.config.delays.heartbeat_ms);
            self.queue.push(at, Ev::GuaranteedAsks { job });
        }
    }

    fn ensure_scheduler(&mut self, host: u32) {
        if self.nodes[host as usize].scheduler.is_some() {
            return;
        }
        let node = &self.nodes[host as usize];
        let mut scheduler = DistributedScheduler::new(
            DistributedSchedulerConfig {
                top_k: self.config.top_k,
                token_ttl_ms: TOKEN_TTL_MS,
            },
            self.first_issuer + host,
        );
        // What a join acknowledgement carries: the directory and the current top-k.
        scheduler.update_view(ClusterView {
            directory_version: self.coordinator.directory_version(),
            directory: self.directory.clone(),
            delta: None,
            top_k: self.rounds[node.view_round as usize % ROUND_RING].clone(),
            ..ClusterView::default()
        });
        self.schedulers.push(HostedScheduler {
            scheduler,
            installed_round: node.view_round,
        });
        self.nodes[host as usize].scheduler = Some(self.schedulers.len() - 1);
    }

    fn place_queueable(&mut self, job: u32, task: u32) {
        let Some(state) = self.jobs[job as usize].as_ref() else {
            return;
        };
        let host = state.host;
        let t = &state.tasks[task as usize];
        let ask = QueueableAsk {
            app_id: self.app.clone(),
            resources: t.resources,
            count: 1,
            priority: 0,
            locality: None,
            runtime_estimate_ms: t.estimate_ms,
            job_id: state.id.clone(),
            job_submit_time_ms: state.submit_ms,
            // A task a node shed or returned is re-asked naming that container, as a live job
            // manager does (`allocate.replaces_shed`); the granting scheduler counts the returns
            // on from its record, as the live one does.
            replacements: if t.sheds > 0 {
                vec![u8::try_from(t.sheds).unwrap_or(u8::MAX)]
            } else {
                Vec::new()
            },
        };
        let node_round = self.nodes[host as usize].view_round;
        let Some(s) = self.nodes[host as usize].scheduler else {
            return;
        };
        let hosted = &mut self.schedulers[s];
        if hosted.installed_round != node_round {
            hosted
                .scheduler
                .update_top_k(self.rounds[node_round as usize % ROUND_RING].clone());
            hosted.installed_round = node_round;
        }
        let now_ms = self.now.as_millis();
        let placed = hosted
            .scheduler
            .place(now_ms, &ask, &self.quota, &mut self.place_rng)
            .ok()
            .and_then(|mut out| out.placed.pop());
        let Some(placed) = placed else {
            // No eligible node in this view (e.g. the task is larger than every top-k node):
            // ask again after the next round.
            let at = self.after_ms(self.config.heartbeat_interval_ms);
            self.queue.push(at, Ev::QueueableAsk { job, task });
            return;
        };
        let Some(&node) = self.node_index.get(&placed.node_id) else {
            return;
        };
        self.stats.queueable += 1;
        let cid = placed.container_id;
        self.containers.insert(
            cid,
            ContainerRecord {
                job,
                task,
                node,
                container_type: ContainerType::Queueable,
                estimate_ms: placed.token_body.runtime_estimate_ms,
                submit_ms: placed.token_body.job_submit_time_ms,
                started_at: None,
                placed_at: self.now,
                times_returned: placed.token_body.times_returned,
            },
        );
        let at = self
            .after_ms(self.config.delays.queueable_ask_ms + self.config.delays.start_container_ms);
        self.queue.push(at, Ev::StartContainer { cid });
    }

    fn ask_guaranteed(&mut self, job: u32) {
        let Some(state) = self.jobs[job as usize].as_ref() else {
            return;
        };
        // One ask per container shape, as a YARN AM asks for N containers of a capability; its
        // runtime estimate (for the nodes' R) is the mean of the tasks it will run.
        // (count, tasks with an estimate, sum of their estimates) per shape.
        let mut shapes: BTreeMap<(u64, u64), (u32, u64, u64)> = BTreeMap::new();
        for &t in &state.pending_guaranteed {
            let task = &state.tasks[t as usize];
            let e = shapes
                .entry((task.resources.cpu_millis, task.resources.memory_mib))
                .or_default();
            e.0 += 1;
            if let Some(estimate) = task.estimate_ms {
                e.1 += 1;
                e.2 += estimate;
            }
        }
        let asks: Vec<GuaranteedAsk> = shapes
            .into_iter()
            .map(|((cpu, mem), (count, estimated, sum))| GuaranteedAsk {
                ask_key: u64::from(job),
                app_id: self.app.clone(),
                resources: Resources::new(cpu, mem),
                count,
                priority: 0,
                locality: None,
                runtime_estimate_ms: (estimated > 0).then(|| sum / estimated),
                job_id: state.id.clone(),
                job_submit_time_ms: state.submit_ms,
                role: Default::default(),
                allow_shaping: false,
            })
            .collect();
        let nothing_waiting = self.guarantor.pending_asks() == 0;
        for ask in asks {
            if self.guarantor.submit(ask.clone()).is_err() {
                // Larger than every node: these tasks can never run; count them as done so the
                // job completes, and say so in the report's task count.
                let resources = ask.resources;
                if let Some(state) = self.jobs[job as usize].as_mut() {
                    let tasks = &state.tasks;
                    state
                        .pending_guaranteed
                        .retain(|&t| tasks[t as usize].resources != resources);
                }
                for _ in 0..ask.count {
                    self.job_task_finished(job, false);
                }
            }
        }
        // Event-driven: place on arrival. Capacity freed later is offered to waiting asks by
        // node updates, so when older asks wait no node has room that a node update would not
        // also find; scanning the whole cluster again is only needed when nothing waits.
        if self.config.guaranteed_allocation == GuaranteedAllocation::EventDriven && nothing_waiting
        {
            let placements = self.guarantor.schedule(self.now.as_millis());
            self.deliver_grants(placements);
        }
        self.wake_all_for_waiting_asks();
        self.check_guarantor();
    }

    fn deliver_grants(&mut self, placements: Vec<GuaranteedPlacement>) {
        for p in placements {
            let cid = p.token_body.container_id;
            let job = p.ask_key as u32;
            let node = self.node_index.get(&p.token_body.node_id).copied();
            let task = self
                .jobs
                .get(job as usize)
                .and_then(|j| j.as_ref())
                .and_then(|state| {
                    let pos = state.pending_guaranteed.iter().position(|&t| {
                        state.tasks[t as usize].resources == p.token_body.resources
                    })?;
                    Some(pos)
                });
            let (Some(node), Some(pos)) = (node, task) else {
                // Nobody to use it: give it back.
                self.guarantor.on_finished(cid);
                continue;
            };
            let Some(state) = self.jobs[job as usize].as_mut() else {
                continue;
            };
            let Some(task) = state.pending_guaranteed.remove(pos) else {
                continue;
            };
            self.stats.guaranteed += 1;
            self.wake(node);
            self.containers.insert(
                cid,
                ContainerRecord {
                    job,
                    task,
                    node,
                    container_type: ContainerType::Guaranteed,
                    estimate_ms: p.token_body.runtime_estimate_ms,
                    submit_ms: p.token_body.job_submit_time_ms,
                    started_at: None,
                    placed_at: self.now,
                    times_returned: 0,
                },
            );
            let at = self.after_ms(
                self.config.delays.guaranteed_grant_ms + self.config.delays.start_container_ms,
            );
            self.queue.push(at, Ev::StartContainer { cid });
        }
    }

    fn task_done(&mut self, job: u32, task: u32) {
        let in_window = self.now.as_millis() >= self.config.warmup_ms;
        if let Some(state) = self.jobs[job as usize].as_ref() {
            let t = &state.tasks[task as usize];
            if in_window {
                self.stats.cpu_ms_in_window +=
                    t.runtime_ms as f64 * t.resources.cpu_millis as f64 / 1000.0;
            }
        }
        self.job_task_finished(job, true);
    }

    fn job_task_finished(&mut self, job: u32, completed: bool) {
        let in_window = self.now.as_millis() >= self.config.warmup_ms;
        if completed {
            self.stats.tasks_completed += 1;
            if in_window {
                self.stats.tasks_in_window += 1;
            }
            self.stats.last_completion = self.now;
        }
        let Some(state) = self.jobs[job as usize].as_mut() else {
            return;
        };
        state.remaining = state.remaining.saturating_sub(1);
        if state.remaining == 0 {
            self.finish_job(job);
        }
    }

    fn finish_job(&mut self, job: u32) {
        let Some(state) = self.jobs[job as usize].take() else {
            return;
        };
        self.running_jobs -= 1;
        self.stats.jobs_completed += 1;
        if let (Some(predictor), Some((features, submitted))) =
            (self.predictor.as_mut(), &state.features)
        {
            // What the job manager saw its tasks take on an ordinary node.
            let mean_ms = state.tasks.iter().map(|t| t.runtime_ms).sum::<u64>() as f64
                / state.tasks.len().max(1) as f64;
            predictor.observe_submitted(features, mean_ms, submitted);
        }
        if self.now.as_millis() >= self.config.warmup_ms {
            self.stats.jobs_in_window += 1;
            let latency = self.now.saturating_since(state.admitted).as_secs_f64();
            self.stats.latencies_s.push(latency);
            self.stats
                .latencies_by_class_s
                .entry(state.class)
                .or_default()
                .push(latency);
        }
        let _ = state.arrival;
        self.try_admit();
    }

    // ---- nodes ------------------------------------------------------------------------------

    fn start_container(&mut self, cid: ContainerId) {
        let Some(rec) = self.containers.get(&cid) else {
            return;
        };
        let Some(state) = self.jobs[rec.job as usize].as_ref() else {
            self.containers.remove(&cid);
            return;
        };
        let spec = ContainerSpec {
            id: cid,
            app_id: self.app.clone(),
            job_id: state.id.clone(),
            job_submit_time: Time::from_millis(rec.submit_ms),
            priority: 0,
            container_type: rec.container_type,
            resources: state.tasks[rec.task as usize].resources,
            runtime_estimate_ms: rec.estimate_ms,
            version: 0,
            times_returned: rec.times_returned,
        };
        let node = rec.node;
        let (job, task, container_type) = (rec.job, rec.task, rec.container_type);
        self.wake(node);
        match self.nodes[node as usize].runtime.submit(self.now, spec) {
            Ok(()) => {
                if container_type == ContainerType::Guaranteed {
                    self.guarantor.on_started(cid);
                }
                self.node_events(node);
            }
            Err(_) => {
                // The node refused it (queue full): the job manager asks again.
                self.containers.remove(&cid);
                match container_type {
                    ContainerType::Queueable => {
                        if let Some(s) = self.scheduler_of(cid) {
                            s.quotas_mut().on_finished(cid);
                        }
                        let at = self.after_ms(self.config.delays.notify_ms);
                        self.queue.push(at, Ev::TaskLost { job, task });
                    }
                    ContainerType::Guaranteed => {
                        self.guarantor.on_finished(cid);
                        if let Some(state) = self.jobs[job as usize].as_mut() {
                            state.pending_guaranteed.push_back(task);
                        }
                        let at = self.after_ms(self.config.delays.heartbeat_ms);
                        self.queue.push(at, Ev::GuaranteedAsks { job });
                    }
                }
            }
        }
    }

    fn scheduler_of(&mut self, cid: ContainerId) -> Option<&mut DistributedScheduler> {
        let node = cid.issuer().checked_sub(self.first_issuer)? as usize;
        let s = self.nodes.get(node)?.scheduler?;
        Some(&mut self.schedulers[s].scheduler)
    }

    /// Act on what a node runtime decided.
    fn node_events(&mut self, node: u32) {
        let events = self.nodes[node as usize].runtime.drain_events();
        for ev in events {
            match ev {
                NodeEvent::Start { id } => {
                    let Some(rec) = self.containers.get_mut(&id) else {
                        continue;
                    };
                    rec.started_at = Some(self.now);
                    let (job, task, container_type) = (rec.job, rec.task, rec.container_type);
                    let runtime_ms = self.jobs[job as usize]
                        .as_ref()
                        .map_or(0, |s| s.tasks[task as usize].runtime_ms);
                    let slowdown = self.nodes[node as usize].slowdown;
                    let run_us = (runtime_ms as f64 * slowdown * 1000.0).round() as u64
                        + self.config.task_launch_overhead_ms * 1000;
                    let at = self.now + Duration::from_micros(run_us);
                    self.queue.push(at, Ev::TaskExit { cid: id });
                    if container_type == ContainerType::Queueable
                        && let Some(s) = self.scheduler_of(id)
                    {
                        s.quotas_mut().on_started(id);
                    }
                }
                NodeEvent::Finished { id, .. } => {
                    let Some(rec) = self.containers.remove(&id) else {
                        continue;
                    };
                    self.diagnose_finished(&rec);
                    match rec.container_type {
                        ContainerType::Guaranteed => match self.config.guaranteed_allocation {
                            GuaranteedAllocation::OnHeartbeat => {
                                self.nodes[node as usize].finished_guaranteed.push(id)
                            }
                            GuaranteedAllocation::EventDriven => {
                                let at = self.after_ms(self.config.delays.heartbeat_ms);
                                self.queue.push(at, Ev::GuarantorFinish { cid: id, node });
                            }
                        },
                        ContainerType::Queueable => {
                            if let Some(s) = self.scheduler_of(id) {
                                s.quotas_mut().on_finished(id);
                            }
                        }
                    }
                    let at = self.after_ms(self.config.delays.notify_ms);
                    self.queue.push(
                        at,
                        Ev::TaskDone {
                            job: rec.job,
                            task: rec.task,
                        },
                    );
                }
                NodeEvent::Killed { id, reason, .. } => {
                    let Some(rec) = self.containers.remove(&id) else {
                        continue;
                    };
                    let placed_for = self.now.saturating_since(rec.placed_at);
                    if let Some(t) = self.jobs[rec.job as usize]
                        .as_mut()
                        .and_then(|j| j.tasks.get_mut(rec.task as usize))
                    {
                        if reason == KillReason::Shed {
                            t.sheds += 1;
                            t.lost_to_sheds += placed_for;
                        } else {
                            t.kills += 1;
                            t.lost_to_kills += placed_for;
                        }
                    }
                    if let Some(d) = self.diag.as_mut() {
                        match reason {
                            KillReason::Shed => d.sheds_since_sample += 1,
                            _ => d.kills_since_sample += 1,
                        }
                    }
                    match reason {
                        KillReason::Shed => {
                            self.stats.shed += 1;
                            // The re-ask must not go back to the node that shed it.
                            let shedding = self.nodes[node as usize].id.clone();
                            if let Some(s) = self.scheduler_of(id) {
                                s.avoid_until_next_view(&shedding);
                            }
                        }
                        _ => self.stats.killed += 1,
                    }
                    match rec.container_type {
                        ContainerType::Queueable => {
                            if let Some(s) = self.scheduler_of(id) {
                                s.quotas_mut().on_finished(id);
                            }
                            let at = self.after_ms(self.config.delays.notify_ms);
                            self.queue.push(
                                at,
                                Ev::TaskLost {
                                    job: rec.job,
                                    task: rec.task,
                                },
                            );
                        }
                        ContainerType::Guaranteed => {
                            self.guarantor.on_finished(id);
                            if let Some(state) = self.jobs[rec.job as usize].as_mut() {
                                state.pending_guaranteed.push_back(rec.task);
                            }
                            let at = self.after_ms(self.config.delays.heartbeat_ms);
                            self.queue.push(at, Ev::GuaranteedAsks { job: rec.job });
                        }
                    }
                }
                NodeEvent::Queued { .. }
                | NodeEvent::WaitingGuaranteed { .. }
                | NodeEvent::Promoted { .. } => {}
            }
        }
        if self.config.check_invariants
            && let Err(e) = self.nodes[node as usize].runtime.check_invariants()
        {
            panic!(
                "node {} invariant broken at {}: {e}",
                self.nodes[node as usize].id, self.now
            );
        }
    }

    fn check_guarantor(&self) {
        if self.config.check_invariants
            && let Err(e) = self.guarantor.check_invariants()
        {
            panic!("guarantor invariant broken at {}: {e}", self.now);
        }
    }

    // ---- coordinator ------------------------------------------------------------------------

    /// Whether this node's heartbeat now would change nothing anywhere: the node is empty and
    /// reported R = 0 last time, nothing is booked for it, no GUARANTEED ask waits for a node
    /// update, its policing limit is already its capacity, and it hosts no scheduler needing a
    /// fresh top-k. Such heartbeats are skipped until something wakes the node (`wake`), which
    /// keeps a mostly idle 10,000-node cluster from costing O(nodes) per interval.
    fn can_sleep(&self, node: u32) -> bool {
        let n = &self.nodes[node as usize];
        self.config.elide_idle_heartbeats
            && !n.hosts_job_managers
            && n.reported_zero
            && n.report.is_none()
            && n.ack.is_none()
            && n.finished_guaranteed.is_empty()
            && n.runtime.running_count() == 0
            && n.runtime.queued_count() == 0
            && n.runtime.waiting_guaranteed_count() == 0
            && n.runtime.queueable_limit() == n.runtime.capacity()
            && n.runtime.queue_delay(self.now).total_ms() == 0.0
            && (self.config.guaranteed_allocation != GuaranteedAllocation::OnHeartbeat
                || self.guarantor.pending_asks() == 0)
            && self
                .guarantor
                .node(&n.id)
                .is_some_and(|g| g.guaranteed.is_zero())
    }

    /// Something gives the node work: resume its heartbeats if it is dormant.
    fn wake(&mut self, node: u32) {
        self.resume(node, false);
    }

    /// Resume a dormant node's heartbeats at its next slot after now. `for_asks`: woken only
    /// because GUARANTEED asks wait for node updates, so its held heartbeat stays *untouched*
    /// (it may fall asleep again in O(1), see `held_heartbeat`); otherwise the node gets work,
    /// and a heartbeat already held for it is touched.
    fn resume(&mut self, node: u32, for_asks: bool) {
        if !for_asks
            && let Some(lazy) = self.lazy.as_mut()
            && lazy.is_held(node)
        {
            // Awake already, with a heartbeat to come; if it was woken for asks, it is no longer
            // just waiting to fall asleep again: it will have work.
            lazy.touch(node);
            return;
        }
        let sleep = &mut self.sleep[node as usize];
        if !sleep.dormant {
            return;
        }
        sleep.dormant = false;
        // The elided heartbeat may still have been in flight: its arrival (and acknowledgement)
        // would see what happened since, so replay it with the zero report it carried.
        let arrival = Time::from_micros(sleep.slept_at_us)
            + Duration::from_millis(self.config.delays.heartbeat_ms);
        let next = sleep.next_slot_after(
            self.now.as_micros(),
            self.config.heartbeat_interval_ms * 1000,
        );
        let in_flight = self.now < arrival;
        if in_flight {
            self.nodes[node as usize].report =
                Some((QueueDelay::default(), Vec::new(), QueueableLoad::default()));
            self.push_arrival(node, arrival);
        }
        let at = Time::from_micros(next);
        if self.end.is_none_or(|end| at <= end) {
            self.push_heartbeat_held(node, at, for_asks && !in_flight);
        }
    }

    /// Schedule the arrival of the node's heartbeat (sent at a slot of its phase).
    fn push_arrival(&mut self, node: u32, at: Time) {
        match self.held_arrivals.as_mut() {
            Some(held) => held.insert(node, at, self.queue.reserve_seq(), false),
            None => self.queue.push(at, Ev::HeartbeatArrival { node }),
        }
    }

    /// Schedule the node's next heartbeat (at a slot of its phase).
    fn push_heartbeat(&mut self, node: u32, at: Time) {
        self.push_heartbeat_held(node, at, false);
    }

    /// As `push_heartbeat`; `untouched`: held as woken only for asks (when held at all).
    fn push_heartbeat_held(&mut self, node: u32, at: Time, untouched: bool) {
        match self.lazy.as_mut() {
            Some(lazy) => lazy.insert(node, at, self.queue.reserve_seq(), untouched),
            None => self.queue.push(at, Ev::Heartbeat { node }),
        }
    }

    /// Schedule the node's heartbeat acknowledgement (a fixed delay after a slot of its phase).
    fn push_ack(&mut self, node: u32, at: Time) {
        match self.held_acks.as_mut() {
            Some(held) => held.insert(node, at, self.queue.reserve_seq(), false),
            None => self.queue.push(at, Ev::HeartbeatAck { node }),
        }
    }

    /// GUARANTEED asks wait for node updates: every node must heartbeat again.
    fn wake_all_for_waiting_asks(&mut self) {
        if self.config.guaranteed_allocation != GuaranteedAllocation::OnHeartbeat
            || self.guarantor.pending_asks() == 0
            || self.dormant.is_empty()
        {
            return;
        }
        let mut dormant =
            std::mem::replace(&mut self.dormant, std::mem::take(&mut self.dormant_spare));
        // Held heartbeats of these nodes stay untouched until due: most of the nodes find the
        // asks placed by then and go back to sleep at once (`held_heartbeat`).
        for &node in &dormant {
            self.resume(node, true);
        }
        dormant.clear();
        self.dormant_spare = dormant;
    }

    /// A held heartbeat is due. If the node was woken for asks and nothing happened to it
    /// since it fell asleep (anything that gives it work wakes it, which touches it), all that
    /// can keep it from sleeping again is a GUARANTEED ask waiting for node updates.
    fn held_heartbeat(&mut self, node: u32) {
        let untouched = self
            .lazy
            .as_mut()
            .and_then(|l| l.take(node, self.now))
            .is_some_and(|(.., untouched)| untouched);
        if !untouched || self.guarantor.pending_asks() > 0 {
            self.heartbeat(node);
            return;
        }
        if self.config.check_invariants {
            assert!(
                self.can_sleep(node),
                "node {} was held asleep but cannot sleep at {}",
                self.nodes[node as usize].id,
                self.now
            );
            if let Some(Err(e)) = self.lazy.as_ref().map(|l| l.check(self.now)) {
                panic!("{e}");
            }
        }
        self.fall_asleep(node);
    }

    fn fall_asleep(&mut self, node: u32) {
        let sleep = &mut self.sleep[node as usize];
        sleep.dormant = true;
        sleep.slept_at_us = self.now.as_micros();
        self.dormant.push(node);
        if self.dormant.len() > 2 * self.nodes.len() {
            let sleep = &self.sleep;
            self.dormant.retain(|&i| sleep[i as usize].dormant);
        }
    }

    fn heartbeat(&mut self, node: u32) {
        if self.can_sleep(node) {
            self.fall_asleep(node);
            return;
        }
        let interval = self.config.heartbeat_interval_ms;
        let n = &mut self.nodes[node as usize];
        let load = n.runtime.queue_delay(self.now);
        n.reported_zero = load.total_ms() == 0.0;
        n.last_reported_r_ms = load.total_ms();
        let finished = std::mem::take(&mut n.finished_guaranteed);
        let queueable = QueueableLoad {
            running: n.runtime.queueable_allocated(),
            queued_count: n.runtime.queued_count() as u32,
        };
        n.report = Some((load, finished, queueable));
        let at = self.after_ms(self.config.delays.heartbeat_ms);
        self.push_arrival(node, at);
        let next = self.after_ms(interval);
        if self.end.is_none_or(|end| next <= end) {
            self.push_heartbeat(node, next);
        }
    }

    fn heartbeat_arrival(&mut self, node: u32) {
        let Some((load, finished, queueable)) = self.nodes[node as usize].report.take() else {
            return;
        };
        let id = &self.nodes[node as usize].id;
        let timing = &mut self.coordinator_timing;
        timing.heartbeats += 1;
        let started = timing
            .heartbeats
            .is_multiple_of(CoordinatorCost::SAMPLE_EVERY)
            .then(Instant::now);
        // Node loss is not simulated, so the container list (used only to report a lost
        // node's containers) is not sent.
        self.coordinator.heartbeat(self.now, id, load, Vec::new());
        for cid in finished {
            self.guarantor.on_finished(cid);
        }
        self.guarantor.report_queueable_load(id, queueable);
        if let Some(started) = started {
            timing.heartbeats_timed += 1;
            timing.heartbeat_time += started.elapsed();
        }
        if self.config.guaranteed_allocation == GuaranteedAllocation::OnHeartbeat {
            let placements = self.guarantor.schedule_on_node(self.now.as_millis(), id);
            self.deliver_grants(placements);
        }
        self.check_guarantor();
        let ack = Ack {
            threshold_ms: self.shedding.target_for(&self.nodes[node as usize].id),
            queueable_limit: if self.config.policing {
                self.guarantor
                    .queueable_limit(&self.nodes[node as usize].id)
            } else {
                None
            },
            view_round: self.round,
        };
        self.nodes[node as usize].ack = Some(ack);
        let at = self.after_ms(self.config.delays.heartbeat_ms);
        self.push_ack(node, at);
    }

    fn heartbeat_ack(&mut self, node: u32) {
        let now = self.now;
        let n = &mut self.nodes[node as usize];
        let Some(ack) = n.ack.take() else {
            return;
        };
        if let Some(limit) = ack.queueable_limit {
            n.runtime.set_queueable_limit(now, limit);
        }
        if let Some(threshold) = ack.threshold_ms {
            n.runtime.shed_to_threshold(now, threshold);
        }
        if self.config.return_held_queueable {
            // The same bound a worker derives from the view its heartbeat answer carries.
            if let Some(bound) = replacement_wait_bound_ms(
                &self.rounds[ack.view_round as usize % ROUND_RING],
                &n.id,
                self.config.top_k,
                self.config.heartbeat_interval_ms,
            ) {
                n.runtime.shed_held_by_guaranteed(now, bound);
            }
        }
        n.view_round = ack.view_round;
        self.node_events(node);
    }

    fn coordinator_round(&mut self) {
        let started = Instant::now();
        let top = self.coordinator.top_k(self.now, &mut self.coordinator_rng);
        self.round += 1;
        self.rounds[self.round as usize % ROUND_RING] = top;
        self.shedding = self.coordinator.shedding_round();
        self.coordinator_timing.rounds += 1;
        self.coordinator_timing.round_time += started.elapsed();
        let now_ms = self.now.as_millis();
        for s in &mut self.schedulers {
            s.scheduler.quotas_mut().expire(now_ms);
        }
        let next = self.after_ms(self.config.heartbeat_interval_ms);
        if self.end.is_none_or(|end| next <= end) {
            self.queue.push(next, Ev::Round);
        }
    }

    /// The report of the run so far.
    pub fn report(&self, workload: &str) -> SimReport {
        let end = self
            .end
            .unwrap_or(self.stats.last_completion)
            .max(self.now.min(self.end.unwrap_or(self.now)));
        let measured_s =
            (end.as_micros() as f64 / 1e6 - self.config.warmup_ms as f64 / 1e3).max(1e-9);
        let mut all = self.stats.latencies_s.clone();
        let by_class = self
            .stats
            .latencies_by_class_s
            .iter()
            .map(|(k, v)| (k.clone(), LatencySummary::of(&mut v.clone())))
            .collect();
        let capacity_cpu =
            self.config.node_capacity.cpu_millis as f64 / 1000.0 * self.config.nodes as f64;
        let wall_s = self.wall.as_secs_f64();
        SimReport {
            seed: self.config.seed,
            config: self.config.clone(),
            workload: workload.to_string(),
            measured_s,
            simulated_s: end.as_micros() as f64 / 1e6,
            task_throughput: self.stats.tasks_in_window as f64 / measured_s,
            job_throughput: self.stats.jobs_in_window as f64 / measured_s * 60.0,
            job_latency_s: LatencySummary::of(&mut all),
            job_latency_by_class_s: by_class,
            mean_admission_wait_s: if self.stats.admitted > 0 {
                self.stats.admission_wait_s / self.stats.admitted as f64
            } else {
                0.0
            },
            queueable_killed: self.stats.killed,
            queueable_shed: self.stats.shed,
            tasks_completed: self.stats.tasks_completed,
            jobs_completed: self.stats.jobs_completed,
            guaranteed_containers: self.stats.guaranteed,
            queueable_containers: self.stats.queueable,
            cpu_utilization: self.stats.cpu_ms_in_window / 1000.0 / (capacity_cpu * measured_s),
            estimates: self.predictor.as_ref().map(|_| EstimateAccuracy {
                within_2x: self.estimates_within_2x as f64
                    / self.estimate_accuracy.estimated.max(1) as f64,
                ..self.estimate_accuracy.clone()
            }),
            events: self.events,
            wall_s,
            events_per_s: if wall_s > 0.0 {
                self.events as f64 / wall_s
            } else {
                0.0
            },
            coordinator_cost: self.coordinator_timing.cost(),
        }
    }
}

/// Accumulated coordinator time of a run (see [`CoordinatorCost`]).
#[derive(Default)]
struct CoordinatorTiming {
    heartbeats: u64,
    heartbeats_timed: u64,
    heartbeat_time: Duration,
    rounds: u64,
    round_time: Duration,
}

impl CoordinatorTiming {
    fn cost(&self) -> CoordinatorCost {
        let mean_ns = |total: Duration, n: u64| {
            if n == 0 {
                0.0
            } else {
                total.as_nanos() as f64 / n as f64
            }
        };
        let heartbeat_ns = mean_ns(self.heartbeat_time, self.heartbeats_timed);
        CoordinatorCost {
            heartbeats: self.heartbeats,
            heartbeats_timed: self.heartbeats_timed,
            heartbeat_ns,
            rounds: self.rounds,
            round_ns: mean_ns(self.round_time, self.rounds),
            ns_per_heartbeat: heartbeat_ns + mean_ns(self.round_time, self.heartbeats),
        }
    }
}

/// Sample period of the diagnostics (idle capacity is integrated over these samples).
const DIAG_SAMPLE_MS: u64 = 100;
/// Cluster samples kept in the timeline: one in this many.
const DIAG_TIMELINE_EVERY: u64 = 10;
/// Length of the traced nodes' window after warm-up.
const DIAG_TRACE_MS: u64 = 30_000;

impl Simulation {
    /// Record where capacity and task time go ([`Diagnostics`]); `traced_nodes` are sampled
    /// one by one. Sampling happens between events and pushes none, so the run is unchanged.
    pub fn enable_diagnostics(&mut self, traced_nodes: &[u32]) {
        self.diag = Some(Box::new(DiagState {
            out: Diagnostics {
                sample_every_ms: DIAG_SAMPLE_MS,
                ..Diagnostics::default()
            },
            next_sample: self.now,
            samples: 0,
            starved_samples: vec![0; self.nodes.len()],
            window_samples: 0,
            sheds_since_sample: 0,
            kills_since_sample: 0,
            traced: traced_nodes
                .iter()
                .copied()
                .filter(|&n| (n as usize) < self.nodes.len())
                .collect(),
        }));
    }

    /// The diagnostics recorded so far (`None` unless enabled).
    pub fn diagnostics(&self) -> Option<Diagnostics> {
        let d = self.diag.as_ref()?;
        let mut out = d.out.clone();
        let mut starved: Vec<f64> = d
            .starved_samples
            .iter()
            .map(|&s| s as f64 / d.window_samples.max(1) as f64)
            .collect();
        starved.sort_by(f64::total_cmp);
        out.idle.starved_fraction_p10 = quantile(&starved, 0.1);
        out.idle.starved_fraction_p50 = quantile(&starved, 0.5);
        out.idle.starved_fraction_p90 = quantile(&starved, 0.9);
        Some(out)
    }

    fn diagnose_sample(&mut self) {
        let Some(mut d) = self.diag.take() else {
            return;
        };
        d.next_sample = self.now + Duration::from_millis(DIAG_SAMPLE_MS);
        let now = self.now;
        let in_window = now.as_millis() >= self.config.warmup_ms;
        let dt_s = DIAG_SAMPLE_MS as f64 / 1000.0;
        let cores = |r: Resources| r.cpu_millis as f64 / 1000.0;
        let mut sample = ClusterSample {
            t_s: now.as_micros() as f64 / 1e6,
            threshold_ms: self.shedding.threshold_ms,
            sheds: d.sheds_since_sample,
            kills: d.kills_since_sample,
            ..ClusterSample::default()
        };
        let total_cores = cores(self.config.node_capacity) * self.nodes.len() as f64;
        let mut r_values = Vec::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            let rt = &n.runtime;
            let cap = rt.capacity();
            let idle = cores(cap.saturating_sub(&rt.allocated()));
            let queued = rt.queued_count() as u64;
            sample.busy += cores(rt.allocated());
            sample.queued += queued;
            if queued == 0 {
                sample.idle_empty_queue += idle;
                if idle >= 1.0 {
                    sample.starved_nodes += 1;
                    if in_window {
                        d.starved_samples[i] += 1;
                    }
                }
            } else {
                sample.idle_with_queue += idle;
            }
            if let Some(g) = self.guarantor.node(&n.id) {
                let booked_not_running =
                    cores(g.guaranteed.saturating_sub(&rt.guaranteed_allocated()));
                sample.idle_booked_guaranteed += booked_not_running.min(idle);
            }
            r_values.push(rt.queue_delay(now).total_ms());
        }
        let count = r_values.len().max(1) as f64;
        sample.r_mean_ms = r_values.iter().sum::<f64>() / count;
        sample.r_sigma_ms = (r_values
            .iter()
            .map(|r| (r - sample.r_mean_ms).powi(2))
            .sum::<f64>()
            / count)
            .sqrt();
        if in_window {
            d.window_samples += 1;
            let idle = &mut d.out.idle;
            idle.capacity_core_s += total_cores * dt_s;
            idle.busy_core_s += sample.busy * dt_s;
            idle.idle_empty_queue_core_s += sample.idle_empty_queue * dt_s;
            idle.idle_with_queue_core_s += sample.idle_with_queue * dt_s;
            idle.idle_booked_guaranteed_core_s += sample.idle_booked_guaranteed * dt_s;
        }
        let warm = self.config.warmup_ms;
        if now.as_millis() >= warm && now.as_millis() < warm + DIAG_TRACE_MS {
            for &node in &d.traced {
                let n = &self.nodes[node as usize];
                let r = n.runtime.queue_delay(now);
                let reported = n.last_reported_r_ms;
                d.out
                    .traced_nodes
                    .entry(n.id.to_string())
                    .or_default()
                    .push(NodeSample {
                        t_s: sample.t_s,
                        running: n.runtime.running_count() as u64,
                        queued: n.runtime.queued_count() as u64,
                        tq_ms: r.tq_ms,
                        tr_ms: r.tr_ms,
                        tl_ms: r.tl_ms,
                        reported_r_ms: reported,
                    });
            }
        }
        if d.samples.is_multiple_of(DIAG_TIMELINE_EVERY) {
            for v in [
                &mut sample.busy,
                &mut sample.idle_empty_queue,
                &mut sample.idle_with_queue,
                &mut sample.idle_booked_guaranteed,
            ] {
                *v /= total_cores;
            }
            d.out.timeline.push(sample);
            d.sheds_since_sample = 0;
            d.kills_since_sample = 0;
        }
        d.samples += 1;
        self.diag = Some(d);
    }

    fn diagnose_finished(&mut self, rec: &ContainerRecord) {
        let in_window = self.now.as_millis() >= self.config.warmup_ms;
        let Some(d) = self.diag.as_mut().filter(|_| in_window) else {
            return;
        };
        let Some(job) = self.jobs[rec.job as usize].as_ref() else {
            return;
        };
        let Some(task) = job.tasks.get(rec.task as usize) else {
            return;
        };
        let started = rec.started_at.unwrap_or(self.now);
        let figures = (
            started.saturating_since(job.admitted).as_secs_f64(),
            task.lost_to_sheds.as_secs_f64(),
            task.lost_to_kills.as_secs_f64(),
            started.saturating_since(rec.placed_at).as_secs_f64(),
            self.now.saturating_since(started).as_secs_f64(),
            u64::from(task.sheds),
            u64::from(task.kills),
        );
        let kind = match rec.container_type {
            ContainerType::Guaranteed => "guaranteed",
            ContainerType::Queueable => "queueable",
        };
        let by_class = d
            .out
            .task_time_by_class
            .entry(format!("{} {kind}", job.class))
            .or_default();
        for t in [&mut d.out.task_time, by_class] {
            t.record(
                figures.0, figures.1, figures.2, figures.3, figures.4, figures.5, figures.6,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimReport;
    use crate::workload::{Arrivals, Generator};
    use scheduler_core::coordinator::SheddingPolicy;

    fn light(seed: u64, placer: GuaranteedPlacerKind) -> SimConfig {
        let mut c = SimConfig::mercury_cluster(seed, "<10sec-70%-Q".parse().unwrap());
        c.nodes = 48;
        c.node_capacity = Resources::new(4_000, 16_384);
        c.top_k = 5;
        c.guaranteed_placer = placer;
        c.shedding = SheddingPolicy::MeanPlusSigma { n: 2.0 };
        c.reorder_by_job_submit_time = true;
        c.max_concurrent_jobs = 20;
        c.job_manager_hosts = 5;
        c.duration_ms = Some(600_000);
        c.warmup_ms = 10_000;
        c.elide_idle_heartbeats = true;
        c.check_invariants = true;
        c
    }

    fn run(config: SimConfig, eager: bool) -> SimReport {
        let stream =
            Generator::ProductionLike.stream(config.seed, Arrivals::Poisson { jobs_per_s: 0.03 });
        let mut sim = Simulation::build(config, stream, !eager).unwrap();
        sim.run();
        sim.report("light").without_timings()
    }

    /// Heartbeats are held outside the event queue, and idle nodes woken for every GUARANTEED
    /// ask of a light load held until due. The whole report (events included) must equal that
    /// of pushing every heartbeat to the queue, with and without elision, for both placers and
    /// both allocation modes.
    #[test]
    fn holding_heartbeats_outside_the_queue_changes_nothing() {
        for (seed, placer, allocation, elide) in [
            (
                13,
                GuaranteedPlacerKind::QueueableAware,
                GuaranteedAllocation::OnHeartbeat,
                true,
            ),
            (
                14,
                GuaranteedPlacerKind::BestFit,
                GuaranteedAllocation::OnHeartbeat,
                true,
            ),
            (
                15,
                GuaranteedPlacerKind::QueueableAware,
                GuaranteedAllocation::OnHeartbeat,
                false,
            ),
            (
                16,
                GuaranteedPlacerKind::QueueableAware,
                GuaranteedAllocation::EventDriven,
                true,
            ),
        ] {
            let mut config = light(seed, placer);
            config.guaranteed_allocation = allocation;
            config.elide_idle_heartbeats = elide;
            let held = run(config.clone(), false);
            let eager = run(config.clone(), true);
            assert_eq!(held, eager, "{placer:?} {allocation:?} elide={elide}");
            assert!(
                held.guaranteed_containers > 20 && held.jobs_completed > 5,
                "{held:?}"
            );
            if elide {
                // Nodes did sleep (and were woken): fewer events than without elision.
                let mut full = config;
                full.elide_idle_heartbeats = false;
                let full = run(full, true);
                assert!(
                    held.events < full.events,
                    "{} vs {}",
                    held.events,
                    full.events
                );
            }
        }
    }

    /// Diagnostics read state between events and push none: a diagnosed run makes the same
    /// decisions (same report, events included), and its idle breakdown adds up to capacity.
    #[test]
    fn diagnosing_a_run_changes_nothing_and_accounts_for_all_capacity() {
        let mut config = light(21, GuaranteedPlacerKind::QueueableAware);
        config.elide_idle_heartbeats = false;
        let plain = run(config.clone(), false);
        let stream =
            Generator::ProductionLike.stream(config.seed, Arrivals::Poisson { jobs_per_s: 0.03 });
        let mut sim = Simulation::build(config, stream, true).unwrap();
        sim.enable_diagnostics(&[0, 7]);
        sim.run();
        let diagnosed = sim.report("light").without_timings();
        assert_eq!(plain, diagnosed);
        let d = sim.diagnostics().expect("enabled");
        let i = &d.idle;
        let parts = i.busy_core_s + i.idle_empty_queue_core_s + i.idle_with_queue_core_s;
        assert!(i.capacity_core_s > 0.0);
        assert!(
            (parts - i.capacity_core_s).abs() < 1e-6 * i.capacity_core_s,
            "{i:?}"
        );
        assert!(i.idle_booked_guaranteed_core_s <= i.capacity_core_s - i.busy_core_s + 1e-6);
        let t = &d.task_time;
        assert!(t.tasks > 0 && t.run_s > 0.0, "{t:?}");
        let by_class: u64 = d.task_time_by_class.values().map(|c| c.tasks).sum();
        assert_eq!(by_class, t.tasks);
        assert_eq!(d.traced_nodes.len(), 2);
        assert!(!d.timeline.is_empty());
    }

    /// Heartbeats are held outside the queue only when no two nodes share a heartbeat
    /// instant.
    #[test]
    fn heartbeats_are_held_only_when_ordered_by_phase() {
        let held = |config: SimConfig| {
            let stream = Generator::ProductionLike.stream(1, Arrivals::Backlog);
            Simulation::new(config, stream).unwrap().lazy.is_some()
        };
        let config = light(15, GuaranteedPlacerKind::QueueableAware);
        assert!(held(config.clone()));
        let mut crowded = config.clone();
        crowded.heartbeat_interval_ms = 1;
        crowded.nodes = 1_001;
        assert!(!held(crowded.clone()));
        crowded.nodes = 1_000;
        assert!(held(crowded));
        let mut event_driven = config;
        event_driven.guaranteed_allocation = GuaranteedAllocation::EventDriven;
        event_driven.elide_idle_heartbeats = false;
        assert!(held(event_driven));
    }
}

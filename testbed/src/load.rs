//! `testbed load`: a job manager speaking the app protocol. It allocates and starts N short
//! `testbed task` containers with C in flight, picks each container's type with the hybrid-GQ
//! policy (Mercury §5), re-asks QUEUEABLE containers that were shed (naming the shed container
//! and its node, so that the scheduler avoids that node until its next view), preempted or lost,
//! and reports counts and client-side latency percentiles.

use crate::client::{AppClient, ClientPool, ConnectOptions};
use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::hybrid_gq::HybridGq;
use scheduler_core::protocol::app::{
    Allocate, ContainerEvent, ContainerEventKind, LaunchSpec, ShedContainer,
};
use scheduler_core::{ContainerId, ContainerType, KillReason, Resources};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Which container types to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadType {
    Guaranteed,
    Queueable,
    /// Per task by the hybrid-GQ policy (`--policy`).
    Hybrid,
}

/// Options of `testbed load`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// App endpoint of the local worker: tls://HOST:PORT (needs --ca-cert), unix:///PATH, or
    /// plaintext tcp://HOST:PORT (a bare HOST:PORT is plaintext too).
    #[arg(long)]
    pub endpoint: String,
    /// The cluster CA certificate (ca.pem) that tls:// workers' certificates must chain to.
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    #[arg(long, required_unless_present = "credentials_file")]
    pub app_id: Option<String>,
    #[arg(long, required_unless_present = "credentials_file")]
    pub app_secret: Option<String>,
    /// cluster.json written by `coordinator init` (its first app's credentials are used).
    #[arg(long)]
    pub credentials_file: Option<PathBuf>,
    /// Containers to run to completion.
    #[arg(long, default_value_t = 100)]
    pub containers: usize,
    #[arg(long = "type", value_enum, default_value_t = LoadType::Hybrid)]
    pub load_type: LoadType,
    /// hybrid-GQ policy for --type hybrid: only-G, only-Q, 50%-Q, <5sec-Q, <10sec-70%-Q, hybrid:td_ms=N,pq=F.
    #[arg(long, default_value = "<10sec-70%-Q")]
    pub policy: String,
    /// Containers in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 200)]
    pub task_duration_ms: u64,
    /// A fraction of tasks run this long instead (Mercury §7.4.1's hybrid mix: 0.2 at 50 s).
    #[arg(long, default_value_t = 0)]
    pub long_task_duration_ms: u64,
    #[arg(long, default_value_t = 0.0)]
    pub long_fraction: f64,
    #[arg(long, default_value_t = 8)]
    pub task_memory_mib: u64,
    #[arg(long, default_value_t = 0.0)]
    pub task_cpu_fraction: f64,
    /// Resources asked per container.
    #[arg(long, default_value_t = 250)]
    pub cpu_millis: u64,
    #[arg(long, default_value_t = 64)]
    pub memory_mib: u64,
    /// Give up re-asking a task after this many kills.
    #[arg(long, default_value_t = 20)]
    pub max_retries: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Benchmark mode: allocate, record the latency, release the grant (untimed); start nothing.
    #[arg(long)]
    pub allocate_only: bool,
    /// The task program (`testbed` with the `task` subcommand) [default: this executable].
    #[arg(long)]
    pub task_program: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also measure the loopback floor in this run (module `floor`): 1-byte `TCP_NODELAY`
    /// round trips between two threads on 127.0.0.1, back to back just before and just after
    /// the load, and one every 5 ms while it runs; the report's `floor` gives them and the
    /// allocate p50/p99 of each type divided by the floor (the mean of the before and after
    /// p50s).
    #[arg(long)]
    pub measure_floor: bool,
    /// Back-to-back round trips of each idle floor measurement (`--measure-floor`).
    #[arg(long, default_value_t = 5000)]
    pub floor_round_trips: usize,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

fn latency(h: &Histogram<u64>) -> Latency {
    Latency {
        count: h.len(),
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
        max_us: h.max(),
    }
}

/// The report. Counts are of containers (a task killed and re-asked counts once per attempt).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadReport {
    /// Tasks to run (`--containers`).
    pub containers: usize,
    /// Containers granted by `allocate`.
    pub granted: u64,
    /// Containers accepted by `start_container`.
    pub started: u64,
    /// Containers that exited with code 0.
    pub completed: u64,
    /// Killed by the infrastructure or released (shed + preempted + lost + released); the task
    /// was asked again unless it had been killed `--max-retries` times.
    pub killed: u64,
    pub shed: u64,
    pub preempted: u64,
    pub lost: u64,
    pub released: u64,
    /// Exited non-zero, killed with reason `failed`, or refused at start.
    pub failed: u64,
    /// Tasks abandoned: killed too often, or refused for longer than 60 s in a row.
    pub gave_up: u64,
    /// Client-side latency of `allocate` until the grant, all types, µs.
    pub allocate_p50_us: u64,
    pub allocate_p99_us: u64,
    /// Client-side latency of `start_container` until `container_accepted`, all types, µs.
    pub start_p50_us: u64,
    pub start_p99_us: u64,
    pub allocate_guaranteed: Latency,
    pub allocate_queueable: Latency,
    pub start_guaranteed: Latency,
    pub start_queueable: Latency,
    /// Per task, from its first `allocate` to its end (re-asks after kills included), µs.
    pub task: Latency,
    pub granted_by_node: BTreeMap<String, u64>,
    pub wall_time_s: f64,
    pub completed_per_second: f64,
    /// The loopback floor of this run and the allocate latencies as multiples of it
    /// (`--measure-floor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<crate::floor::FloorReport>,
}

#[derive(Default)]
struct Stats {
    report: LoadReport,
    alloc: HashMap<ContainerType, Histogram<u64>>,
    start: HashMap<ContainerType, Histogram<u64>>,
    task: Option<Histogram<u64>>,
}

impl Stats {
    fn record(map: &mut HashMap<ContainerType, Histogram<u64>>, t: ContainerType, d: Duration) {
        let h = map
            .entry(t)
            .or_insert_with(|| Histogram::new(3).expect("valid sigfig"));
        let _ = h.record(d.as_micros().max(1) as u64);
    }
}

/// Routes events to the task waiting for each container's end.
type Waiting = Arc<Mutex<HashMap<ContainerId, oneshot::Sender<ContainerEventKind>>>>;

/// How long a task keeps re-asking while the cluster refuses for reasons that pass (quota,
/// unplaced, coordinator unavailable) before the task is given up.
const REFUSAL_PATIENCE: Duration = Duration::from_secs(60);
/// Longest wait between re-asks after a refusal when none of our containers finishes meanwhile.
const REFUSAL_BACKOFF: Duration = Duration::from_millis(50);

/// What every runner shares.
struct Runner {
    args: LoadArgs,
    pool: Arc<ClientPool>,
    local: Arc<AppClient>,
    waiting: Waiting,
    stats: Mutex<Stats>,
    /// Woken whenever one of our containers ends (capacity or quota may have freed up).
    finished: tokio::sync::Notify,
    task_exe: PathBuf,
    job_submit_time_ms: u64,
}

impl Runner {
    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until one of our containers ends, or a short backoff passes.
    async fn wait_for_capacity(&self) {
        let _ = tokio::time::timeout(REFUSAL_BACKOFF, self.finished.notified()).await;
    }
}

fn credentials(args: &LoadArgs) -> anyhow::Result<(String, String)> {
    if let (Some(i), Some(s)) = (&args.app_id, &args.app_secret) {
        return Ok((i.clone(), s.clone()));
    }
    let path = args
        .credentials_file
        .as_ref()
        .context("--app-id/--app-secret or --credentials-file is required")?;
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", path.display()))?;
    let app = &v["apps"][0];
    match (app["app_id"].as_str(), app["app_secret"].as_str()) {
        (Some(i), Some(s)) => Ok((i.to_string(), s.to_string())),
        _ => bail!("{} has no apps[0].app_id / app_secret", path.display()),
    }
}

/// Pace of the floor probe while the load runs, and its bound (an hour's worth at that pace).
const FLOOR_PACE: Duration = Duration::from_millis(5);
const FLOOR_PACED_MAX: usize = 720_000;

/// Run the load and return the report; with `--measure-floor`, the loopback floor around and
/// during it.
pub async fn run_load(args: &LoadArgs) -> anyhow::Result<LoadReport> {
    if !args.measure_floor {
        return run_load_only(args).await;
    }
    let round_trips = args.floor_round_trips.max(1);
    let idle_floor = move || async move {
        tokio::task::spawn_blocking(move || crate::floor::ping_pong(round_trips))
            .await
            .context("the floor measurement panicked")?
            .context("measuring the loopback floor")
    };
    let before = idle_floor().await?;
    let probe = crate::floor::PacedProbe::start(FLOOR_PACE, FLOOR_PACED_MAX)
        .context("starting the paced floor probe")?;
    let report = run_load_only(args).await;
    let during = tokio::task::spawn_blocking(move || probe.finish())
        .await
        .context("the floor probe panicked")?
        .context("the paced floor probe")?;
    let mut report = report?;
    let after = idle_floor().await?;
    let of = |l: &Latency| (l.count > 0).then_some((l.p50_us, l.p99_us));
    report.floor = Some(crate::floor::FloorReport::new(
        before,
        after,
        during,
        FLOOR_PACE,
        of(&report.allocate_queueable),
        of(&report.allocate_guaranteed),
    ));
    Ok(report)
}

async fn run_load_only(args: &LoadArgs) -> anyhow::Result<LoadReport> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.long_fraction) || !(0.0..=1.0).contains(&args.task_cpu_fraction)
    {
        bail!("--long-fraction and --task-cpu-fraction must be in [0, 1]");
    }
    let policy: HybridGq = match args.load_type {
        LoadType::Guaranteed => HybridGq::ONLY_G,
        LoadType::Queueable => HybridGq::ONLY_Q,
        LoadType::Hybrid => args.policy.parse().map_err(anyhow::Error::msg)?,
    };
    let (app_id, secret) = credentials(args)?;
    let task_exe = match &args.task_program {
        Some(p) => p.clone(),
        None => {
            std::env::current_exe().context("locating the testbed executable for `testbed task`")?
        }
    };
    let options = ConnectOptions::from_ca_cert(args.ca_cert.as_deref())?;
    let (pool, mut events) = ClientPool::with_options(&app_id, &secret, options);
    let pool = Arc::new(pool);
    let local = pool
        .get(&args.endpoint)
        .await
        .with_context(|| format!("connecting to {}", args.endpoint))?;
    let job_submit_time_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let runner = Arc::new(Runner {
        args: args.clone(),
        pool,
        local,
        waiting: Arc::default(),
        stats: Mutex::default(),
        finished: tokio::sync::Notify::new(),
        task_exe,
        job_submit_time_ms,
    });
    let dispatcher = {
        let runner = runner.clone();
        tokio::spawn(async move {
            while let Some(ContainerEvent {
                container_id,
                event,
                ..
            }) = events.recv().await
            {
                if !matches!(
                    event,
                    ContainerEventKind::Completed { .. } | ContainerEventKind::Killed { .. }
                ) {
                    continue;
                }
                let waiter = runner
                    .waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&container_id);
                if let Some(tx) = waiter {
                    let _ = tx.send(event);
                }
                runner.finished.notify_waiters();
            }
        })
    };
    let next_task = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let began = Instant::now();
    let mut runners = vec![];
    for r in 0..args.concurrency {
        let (runner, next_task) = (runner.clone(), next_task.clone());
        runners.push(tokio::spawn(async move {
            let args = &runner.args;
            let mut rng =
                StdRng::seed_from_u64(args.seed.wrapping_mul(1_000_003).wrapping_add(r as u64));
            loop {
                let task = next_task.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if task >= args.containers {
                    return Ok::<(), anyhow::Error>(());
                }
                let long =
                    args.long_fraction > 0.0 && rng.random_range(0.0..1.0) < args.long_fraction;
                let duration = if long {
                    args.long_task_duration_ms
                } else {
                    args.task_duration_ms
                };
                // hybrid-GQ (Mercury §5): the type follows the task's expected duration.
                let ctype = policy.choose(Some(duration), &mut rng);
                run_task(&runner, task, duration, ctype).await?;
            }
        }));
    }
    let mut first_error = None;
    for r in runners {
        let outcome = r
            .await
            .map_err(|e| anyhow::anyhow!("a load runner panicked: {e}"))
            .and_then(|r| r);
        if let Err(e) = outcome {
            first_error.get_or_insert(e);
        }
    }
    dispatcher.abort();
    if let Some(e) = first_error {
        return Err(e);
    }
    let wall = began.elapsed().as_secs_f64();
    let mut s = runner.stats();
    let mut all_alloc = Histogram::<u64>::new(3).expect("valid sigfig");
    let mut all_start = Histogram::<u64>::new(3).expect("valid sigfig");
    for h in s.alloc.values() {
        all_alloc.add(h).expect("same bounds");
    }
    for h in s.start.values() {
        all_start.add(h).expect("same bounds");
    }
    let get =
        |m: &HashMap<ContainerType, Histogram<u64>>, t| m.get(&t).map(latency).unwrap_or_default();
    let (ag, aq, sg, sq) = (
        get(&s.alloc, ContainerType::Guaranteed),
        get(&s.alloc, ContainerType::Queueable),
        get(&s.start, ContainerType::Guaranteed),
        get(&s.start, ContainerType::Queueable),
    );
    let task = s.task.as_ref().map(latency).unwrap_or_default();
    let r = &mut s.report;
    r.containers = args.containers;
    r.task = task;
    r.allocate_p50_us = all_alloc.value_at_quantile(0.5);
    r.allocate_p99_us = all_alloc.value_at_quantile(0.99);
    r.start_p50_us = all_start.value_at_quantile(0.5);
    r.start_p99_us = all_start.value_at_quantile(0.99);
    r.allocate_guaranteed = ag;
    r.allocate_queueable = aq;
    r.start_guaranteed = sg;
    r.start_queueable = sq;
    r.wall_time_s = wall;
    r.completed_per_second = r.completed as f64 / wall.max(1e-9);
    Ok(r.clone())
}

/// How one attempt at running a task ended.
enum Attempt {
    /// The task is done (completed, failed for good, or given up).
    Done,
    /// Ask again (killed by the infrastructure, refused for a reason that passes).
    Again,
}

/// Run one task to its end: allocate, start on the granted node, wait for its final event,
/// and re-ask when the infrastructure killed it (Mercury §6.3: the AM forges a new request).
async fn run_task(
    runner: &Runner,
    task: usize,
    duration_ms: u64,
    ctype: ContainerType,
) -> anyhow::Result<()> {
    let mut kills = 0u32;
    let mut refused_since: Option<Instant> = None;
    let mut shed = None;
    let began = Instant::now();
    loop {
        match attempt(
            runner,
            task,
            duration_ms,
            ctype,
            &mut kills,
            &mut refused_since,
            &mut shed,
        )
        .await?
        {
            Attempt::Done => {
                let mut stats = runner.stats();
                let h = stats
                    .task
                    .get_or_insert_with(|| Histogram::new(3).expect("valid sigfig"));
                let _ = h.record(began.elapsed().as_micros().max(1) as u64);
                return Ok(());
            }
            Attempt::Again => continue,
        }
    }
}

async fn attempt(
    runner: &Runner,
    task: usize,
    duration_ms: u64,
    ctype: ContainerType,
    kills: &mut u32,
    refused_since: &mut Option<Instant>,
    // The task's last container, if a node shed it: named in the re-ask so that the scheduler
    // avoids that node until its next view (`allocate.replaces_shed`).
    shed: &mut Option<ShedContainer>,
) -> anyhow::Result<Attempt> {
    let args = &runner.args;
    let ask = Allocate {
        request_id: 0,
        resources: Resources::new(args.cpu_millis, args.memory_mib),
        count: 1,
        priority: 0,
        container_type: ctype,
        locality: None,
        runtime_estimate_ms: Some(duration_ms),
        job_id: format!("load-job-{}", task / 50),
        job_submit_time_ms: runner.job_submit_time_ms,
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: shed.take().into_iter().collect(),
    };
    // A refusal that passes (quota, nothing placeable this round, coordinator away): wait for
    // one of our containers to end, then ask again, for at most REFUSAL_PATIENCE in a row.
    let refused = |since: &mut Option<Instant>| {
        let first = *since.get_or_insert_with(Instant::now);
        if first.elapsed() > REFUSAL_PATIENCE {
            runner.stats().report.gave_up += 1;
            return false;
        }
        true
    };
    let t0 = Instant::now();
    let grant = match runner.local.allocate(ask).await {
        Ok(a) => match a.containers.into_iter().next() {
            Some(g) => g,
            None => {
                if !refused(refused_since) {
                    return Ok(Attempt::Done);
                }
                runner.wait_for_capacity().await;
                return Ok(Attempt::Again);
            }
        },
        Err(e) if e.is_retryable() => {
            if !refused(refused_since) {
                return Ok(Attempt::Done);
            }
            runner.wait_for_capacity().await;
            return Ok(Attempt::Again);
        }
        // Not retryable (bad credentials, ask too large, ...): the whole load is misconfigured.
        Err(e) => bail!("allocate for task {task}: {e}"),
    };
    let alloc_time = t0.elapsed();
    *refused_since = None;
    {
        let mut s = runner.stats();
        Stats::record(&mut s.alloc, ctype, alloc_time);
        s.report.granted += 1;
        *s.report
            .granted_by_node
            .entry(grant.node_id.to_string())
            .or_default() += 1;
    }
    if args.allocate_only {
        runner
            .local
            .release(grant.container_id)
            .await
            .map_err(|e| anyhow::anyhow!("releasing {}: {e}", grant.container_id))?;
        return Ok(Attempt::Done);
    }
    let host = match runner.pool.get(&grant.node_endpoint).await {
        Ok(h) => h,
        Err(e) => {
            // The granted node is unreachable (lost?): give the grant back and ask again.
            tracing::warn!("task {task}: cannot reach {}: {e}", grant.node_endpoint);
            let _ = runner.local.release(grant.container_id).await;
            runner.stats().report.failed += 1;
            return Ok(again_unless_exhausted(runner, kills));
        }
    };
    // Register before starting: the end event may overtake the start answer.
    let (tx, end) = oneshot::channel();
    runner
        .waiting
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(grant.container_id, tx);
    let launch = LaunchSpec {
        command: runner.task_exe.display().to_string(),
        args: vec![
            "task".into(),
            "--duration-ms".into(),
            duration_ms.to_string(),
            "--memory-mib".into(),
            args.task_memory_mib.to_string(),
            "--cpu-fraction".into(),
            args.task_cpu_fraction.to_string(),
        ],
        ..Default::default()
    };
    let t1 = Instant::now();
    if let Err(e) = host.start_container(grant.token.clone(), launch).await {
        runner
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&grant.container_id);
        tracing::warn!("task {task}: start_container on {}: {e}", grant.node_id);
        runner.stats().report.failed += 1;
        let _ = runner.local.release(grant.container_id).await;
        if e.is_retryable() {
            return Ok(again_unless_exhausted(runner, kills));
        }
        return Ok(Attempt::Done);
    }
    {
        let mut s = runner.stats();
        Stats::record(&mut s.start, ctype, t1.elapsed());
        s.report.started += 1;
    }
    let end = tokio::select! {
        end = end => end.ok(),
        // Without its host's connection no event can come: count it lost.
        () = host.closed() => None,
    };
    let mut s = runner.stats();
    match end {
        Some(ContainerEventKind::Completed { exit_code: 0 }) => {
            s.report.completed += 1;
            Ok(Attempt::Done)
        }
        Some(ContainerEventKind::Completed { .. }) => {
            s.report.failed += 1;
            Ok(Attempt::Done)
        }
        Some(ContainerEventKind::Killed { reason, .. }) => {
            match reason {
                // The task itself is at fault: asking again would fail again.
                KillReason::Failed => {
                    s.report.failed += 1;
                    return Ok(Attempt::Done);
                }
                KillReason::Shed => {
                    s.report.shed += 1;
                    *shed = Some(ShedContainer {
                        container_id: grant.container_id,
                        node_id: grant.node_id.clone(),
                    });
                }
                KillReason::PreemptedByGuaranteed => s.report.preempted += 1,
                KillReason::Lost => s.report.lost += 1,
                KillReason::ShapedPreemption => s.report.preempted += 1,
                KillReason::Released => s.report.released += 1,
            }
            s.report.killed += 1;
            drop(s);
            Ok(again_unless_exhausted(runner, kills))
        }
        Some(_) | None => {
            s.report.killed += 1;
            s.report.lost += 1;
            drop(s);
            Ok(again_unless_exhausted(runner, kills))
        }
    }
}

/// Count one more kill of this task; give it up after `--max-retries`.
fn again_unless_exhausted(runner: &Runner, kills: &mut u32) -> Attempt {
    *kills += 1;
    if *kills > runner.args.max_retries {
        runner.stats().report.gave_up += 1;
        Attempt::Done
    } else {
        Attempt::Again
    }
}

/// `testbed load`.
pub fn run(args: &LoadArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let report = rt.block_on(run_load(args))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// A human-readable summary.
pub fn print_report(r: &LoadReport) {
    println!(
        "containers {}  granted {}  started {}  completed {}  failed {}  killed {} (shed {}, preempted {}, lost {}, released {})  gave up {}",
        r.containers,
        r.granted,
        r.started,
        r.completed,
        r.failed,
        r.killed,
        r.shed,
        r.preempted,
        r.lost,
        r.released,
        r.gave_up
    );
    println!(
        "allocate latency  QUEUEABLE p50 {} us p99 {} us (n={})   GUARANTEED p50 {} us p99 {} us (n={})",
        r.allocate_queueable.p50_us,
        r.allocate_queueable.p99_us,
        r.allocate_queueable.count,
        r.allocate_guaranteed.p50_us,
        r.allocate_guaranteed.p99_us,
        r.allocate_guaranteed.count
    );
    println!(
        "start latency     QUEUEABLE p50 {} us p99 {} us   GUARANTEED p50 {} us p99 {} us",
        r.start_queueable.p50_us,
        r.start_queueable.p99_us,
        r.start_guaranteed.p50_us,
        r.start_guaranteed.p99_us
    );
    if let Some(f) = &r.floor {
        println!(
            "loopback floor    p50 {:.1} us (before {} us, after {} us; during the load p50 {} us p99 {} us)   allocate / floor: QUEUEABLE p50 {:.2}x p99 {:.2}x   GUARANTEED p50 {:.2}x p99 {:.2}x",
            f.floor_p50_us,
            f.before.p50_us,
            f.after.p50_us,
            f.during.p50_us,
            f.during.p99_us,
            f.queueable_p50_ratio,
            f.queueable_p99_ratio,
            f.guaranteed_p50_ratio,
            f.guaranteed_p99_ratio
        );
    }
    println!("granted by node   {:?}", r.granted_by_node);
    println!(
        "wall time {:.2} s, {:.1} completed containers/s",
        r.wall_time_s, r.completed_per_second
    );
}

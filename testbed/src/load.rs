//! `testbed load`: a job manager speaking the app protocol. It allocates and starts N short
//! `testbed task` containers with C in flight, picks each container's type with the hybrid-GQ
//! policy (Mercury §5), re-asks QUEUEABLE containers that were shed, preempted or lost, and
//! reports counts and client-side latency percentiles.

use crate::client::{AppClient, ClientError, ClientPool};
use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::hybrid_gq::HybridGq;
use scheduler_core::protocol::app::{Allocate, ContainerEvent, ContainerEventKind, LaunchSpec};
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
    /// App endpoint of the local worker (host:port or a Unix socket path).
    #[arg(long)]
    pub endpoint: String,
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

/// The report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadReport {
    pub containers: usize,
    pub granted: u64,
    pub started: u64,
    pub completed: u64,
    pub killed: u64,
    pub shed: u64,
    pub preempted: u64,
    pub lost: u64,
    pub released: u64,
    pub failed: u64,
    pub gave_up: u64,
    pub allocate_p50_us: u64,
    pub allocate_p99_us: u64,
    pub start_p50_us: u64,
    pub start_p99_us: u64,
    pub allocate_guaranteed: Latency,
    pub allocate_queueable: Latency,
    pub start_guaranteed: Latency,
    pub start_queueable: Latency,
    pub granted_by_node: BTreeMap<String, u64>,
    pub wall_time_s: f64,
    pub completed_per_second: f64,
}

#[derive(Default)]
struct Stats {
    report: LoadReport,
    alloc: HashMap<ContainerType, Histogram<u64>>,
    start: HashMap<ContainerType, Histogram<u64>>,
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

/// Run the load and return the report.
pub async fn run_load(args: &LoadArgs) -> anyhow::Result<LoadReport> {
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
    let (pool, mut events) = ClientPool::new(&app_id, &secret);
    let pool = Arc::new(pool);
    let local = pool
        .get(&args.endpoint)
        .await
        .with_context(|| format!("connecting to {}", args.endpoint))?;
    let waiting: Waiting = Arc::default();
    let w = waiting.clone();
    tokio::spawn(async move {
        while let Some(ContainerEvent {
            container_id,
            event,
            ..
        }) = events.recv().await
        {
            let terminal = matches!(
                event,
                ContainerEventKind::Completed { .. } | ContainerEventKind::Killed { .. }
            );
            let waiter = if terminal {
                w.lock().expect("lock").remove(&container_id)
            } else {
                None
            };
            if let Some(tx) = waiter {
                let _ = tx.send(event);
            }
        }
    });
    let stats = Arc::new(Mutex::new(Stats::default()));
    let next_task = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let began = Instant::now();
    let job_submit_time_ms = scheduler_core::Time::from_micros(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as u64,
    )
    .as_millis();
    let mut runners = vec![];
    for r in 0..args.concurrency {
        let (args, pool, local, waiting, stats, next_task, exe) = (
            args.clone(),
            pool.clone(),
            local.clone(),
            waiting.clone(),
            stats.clone(),
            next_task.clone(),
            task_exe.clone(),
        );
        runners.push(tokio::spawn(async move {
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
                let ctype = policy.choose(Some(duration), &mut rng);
                run_task(
                    &args,
                    &pool,
                    &local,
                    &waiting,
                    &stats,
                    &exe,
                    task,
                    duration,
                    ctype,
                    job_submit_time_ms,
                )
                .await?;
            }
        }));
    }
    for r in runners {
        r.await.context("a load runner panicked")??;
    }
    let mut s = stats.lock().expect("lock");
    let wall = began.elapsed().as_secs_f64();
    let mut all_alloc = Histogram::<u64>::new(3).expect("valid");
    let mut all_start = Histogram::<u64>::new(3).expect("valid");
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
    let r = &mut s.report;
    r.containers = args.containers;
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

#[allow(clippy::too_many_arguments)]
async fn run_task(
    args: &LoadArgs,
    pool: &ClientPool,
    local: &AppClient,
    waiting: &Waiting,
    stats: &Mutex<Stats>,
    exe: &std::path::Path,
    task: usize,
    duration_ms: u64,
    ctype: ContainerType,
    job_submit_time_ms: u64,
) -> anyhow::Result<()> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let ask = Allocate {
            request_id: 0,
            resources: Resources::new(args.cpu_millis, args.memory_mib),
            count: 1,
            priority: 0,
            container_type: ctype,
            locality: None,
            runtime_estimate_ms: Some(duration_ms),
            job_id: format!("load-job-{}", task / 50),
            job_submit_time_ms,
        };
        let t0 = Instant::now();
        let allocated = match local.allocate(ask).await {
            Ok(a) => a,
            Err(ClientError::Server(e)) if e.retryable && attempts <= args.max_retries => {
                // Quota or coordinator hiccup: the worker said retry; yield to the others first.
                tokio::task::yield_now().await;
                continue;
            }
            Err(e) => return Err(anyhow::anyhow!("allocate for task {task}: {e}")),
        };
        let alloc_time = t0.elapsed();
        let Some(grant) = allocated.containers.into_iter().next() else {
            if attempts > args.max_retries {
                stats.lock().expect("lock").report.gave_up += 1;
                return Ok(());
            }
            tokio::task::yield_now().await;
            continue;
        };
        {
            let mut s = stats.lock().expect("lock");
            Stats::record(&mut s.alloc, ctype, alloc_time);
            s.report.granted += 1;
            *s.report
                .granted_by_node
                .entry(grant.node_id.0.clone())
                .or_default() += 1;
        }
        if args.allocate_only {
            local
                .release(grant.container_id)
                .await
                .map_err(|e| anyhow::anyhow!("releasing {}: {e}", grant.container_id))?;
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        waiting.lock().expect("lock").insert(grant.container_id, tx);
        let launch = LaunchSpec {
            command: exe.display().to_string(),
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
        if let Err(e) = pool.start(&grant, launch).await {
            waiting.lock().expect("lock").remove(&grant.container_id);
            stats.lock().expect("lock").report.failed += 1;
            return Err(anyhow::anyhow!(
                "start_container for task {task} on {}: {e}",
                grant.node_id
            ));
        }
        {
            let mut s = stats.lock().expect("lock");
            Stats::record(&mut s.start, ctype, t1.elapsed());
            s.report.started += 1;
        }
        let end = rx
            .await
            .context("the event stream ended before the container did")?;
        let mut s = stats.lock().expect("lock");
        match end {
            ContainerEventKind::Completed { exit_code: 0 } => {
                s.report.completed += 1;
                return Ok(());
            }
            ContainerEventKind::Completed { .. } => {
                s.report.failed += 1;
                return Ok(());
            }
            ContainerEventKind::Killed { reason, .. } => {
                s.report.killed += 1;
                match reason {
                    KillReason::Shed => s.report.shed += 1,
                    KillReason::PreemptedByGuaranteed => s.report.preempted += 1,
                    KillReason::Lost => s.report.lost += 1,
                    KillReason::Released => s.report.released += 1,
                    KillReason::Failed => {
                        s.report.failed += 1;
                        return Ok(());
                    }
                }
                if attempts > args.max_retries {
                    s.report.gave_up += 1;
                    return Ok(());
                }
                // Re-ask elsewhere (Mercury §6.3: the AM forges a new request).
            }
            _ => {}
        }
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
    println!("granted by node   {:?}", r.granted_by_node);
    println!(
        "wall time {:.2} s, {:.1} completed containers/s",
        r.wall_time_s, r.completed_per_second
    );
}

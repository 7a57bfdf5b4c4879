//! `testbed demo-3sigma`: 3Sigma in the live guarantor on a real local cluster (a coordinator
//! and a worker as separate processes, `testbed task` containers). A node of two slots; an SLO
//! job ("etl") and a latency-sensitive best-effort job ("report"), two containers each, both
//! wait behind a short plain GUARANTEED container. When the node frees, the 3Sigma cycle starts
//! one of them: with a loose deadline the best-effort job (whose value decays with every second)
//! goes first and the SLO job still makes its deadline after it; with a tight deadline the SLO
//! job goes first, because its runtime distribution (learned by 3σPredict from the warm-up runs)
//! says it would miss the deadline otherwise.

use crate::client::AppClient;
use crate::local::{LocalArgs, LocalCluster};
use anyhow::{Context, bail};
use scheduler_core::protocol::app::{
    Allocate, Allocated, ContainerEvent, ContainerEventKind, JobSpec, JobUtility, LaunchSpec,
};
use scheduler_core::{ContainerId, ContainerType, Resources};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Options of `testbed demo-3sigma`.
#[derive(Debug, Clone, clap::Args)]
pub struct Demo3SigmaArgs {
    /// Runtime of every job's containers.
    #[arg(long, default_value_t = 3000)]
    pub job_ms: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout_s: u64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn job_ask(name: &str, utility: JobUtility) -> Allocate {
    let mut a = Allocate::new(
        Resources::new(1000, 512),
        2,
        ContainerType::Guaranteed,
        format!("{name}-{}", now_ms()),
        now_ms(),
    );
    a.job = Some(JobSpec {
        utility,
        features: BTreeMap::from([("name".to_string(), name.to_string())]),
        required: vec![],
        preferred: vec![],
        non_preferred_slowdown: None,
    });
    a
}

fn task(ms: u64) -> anyhow::Result<LaunchSpec> {
    Ok(LaunchSpec {
        command: std::env::current_exe()?.display().to_string(),
        args: vec!["task".into(), "--duration-ms".into(), ms.to_string()],
        ..Default::default()
    })
}

struct Demo {
    client: AppClient,
    events: mpsc::UnboundedReceiver<ContainerEvent>,
    deadline: tokio::time::Instant,
    job_ms: u64,
}

impl Demo {
    /// Start the granted containers and wait until they all completed.
    async fn run_to_completion(&mut self, grants: &[Allocated], ms: u64) -> anyhow::Result<()> {
        let mut ids = Vec::new();
        for a in grants {
            for g in &a.containers {
                self.client
                    .start_container(g.token.clone(), task(ms)?)
                    .await?;
                ids.push(g.container_id);
            }
        }
        self.wait_completed(ids).await
    }

    /// Wait until every container of `ids` completed.
    async fn wait_completed(&mut self, ids: Vec<ContainerId>) -> anyhow::Result<()> {
        let mut left: HashSet<ContainerId> = ids.into_iter().collect();
        while !left.is_empty() {
            let e = tokio::time::timeout_at(self.deadline, self.events.recv())
                .await
                .context("timed out waiting for containers to complete")?
                .context("event stream closed")?;
            match e.event {
                ContainerEventKind::Completed { .. } => {
                    left.remove(&e.container_id);
                }
                ContainerEventKind::Killed { reason, message }
                    if left.contains(&e.container_id) =>
                {
                    bail!(
                        "container {} was killed ({reason}): {message}",
                        e.container_id
                    )
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The two jobs wait behind a plain container; returns which was granted first.
    async fn race(&mut self, slo_deadline_s: f64) -> anyhow::Result<&'static str> {
        let blocker = self
            .client
            .allocate(Allocate::new(
                Resources::new(2000, 1024),
                1,
                ContainerType::Guaranteed,
                "blocker",
                now_ms(),
            ))
            .await?;
        let blocker_container = blocker.containers.first().context("blocker granted")?;
        self.client
            .start_container(blocker_container.token.clone(), task(1500)?)
            .await?;
        let submitted = now_ms();
        let report = job_ask(
            "report",
            JobUtility::BestEffort {
                value: 1.0,
                zero_after_ms: 60_000,
            },
        );
        let etl = job_ask(
            "etl",
            JobUtility::Slo {
                deadline_ms: submitted + (slo_deadline_s * 1000.0) as u64,
                value: 1.0,
            },
        );
        let etl_id = etl.job_id.clone();
        let started = Instant::now();
        let client = &self.client;
        let job_ms = self.job_ms;
        // Each job's containers start the moment it is granted (the other may wait for them to
        // finish).
        let run = |ask: Allocate| async move {
            let a = client.allocate(ask).await?;
            let at = started.elapsed();
            let mut ids = Vec::new();
            for g in &a.containers {
                client
                    .start_container(g.token.clone(), task(job_ms)?)
                    .await?;
                ids.push(g.container_id);
            }
            anyhow::Ok((ids, at))
        };
        // The app asks why its SLO job waits (`explain` on the app protocol, as any app can).
        let (report_run, etl_run, explained) = tokio::join!(run(report), run(etl), async {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            client.explain(&etl_id).await
        });
        let (report_ids, report_at) = report_run?;
        let (etl_ids, etl_at) = etl_run?;
        // A transient error (e.g. the worker between coordinator sessions) only skips the line.
        if let Some(e) = explained.ok().as_ref().and_then(|e| e.jobs.first()) {
            let b = &e.belief;
            println!(
                "   explain {etl_id} while both wait: runtime p10/p50/p90 = {:.1}/{:.1}/{:.1} s \
                 ({}); {} options considered; why it waits: {}",
                b.p10_s,
                b.p50_s,
                b.p90_s,
                b.source,
                e.options.len(),
                e.reason
            );
        }
        let first = if etl_at < report_at {
            "slo"
        } else {
            "best_effort"
        };
        println!(
            "   granted: SLO job (etl) after {:.1} s, best-effort job (report) after {:.1} s",
            etl_at.as_secs_f64(),
            report_at.as_secs_f64()
        );
        self.wait_completed(report_ids.into_iter().chain(etl_ids).collect())
            .await?;
        Ok(first)
    }
}

/// `testbed demo-3sigma`.
pub fn run(args: &Demo3SigmaArgs) -> anyhow::Result<()> {
    crate::local::install_stop_signals();
    let local = LocalArgs {
        workers: 1,
        cpu_millis: 2000,
        memory_mib: 2048,
        heartbeat_interval_ms: 200,
        ..LocalArgs::default()
    };
    println!(
        "== A local cluster: a coordinator (3Sigma cycle every 1 s, plan-ahead window 16 × 2 s) \
         and one worker of two slots (2 cores, 2 GiB)"
    );
    let cluster = LocalCluster::start(&local)?;
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(workload(&cluster, args));
    drop(cluster);
    let (loose, tight) = result?;
    println!(
        "== Result: loose deadline → {loose} first; tight deadline → {tight} first. The SLO job \
         went ahead of best-effort work only when its distribution said it must."
    );
    if loose != "best_effort" || tight != "slo" {
        bail!("3Sigma did not order the jobs as expected (loose: {loose}, tight: {tight})");
    }
    Ok(())
}

async fn workload(
    cluster: &LocalCluster,
    args: &Demo3SigmaArgs,
) -> anyhow::Result<(&'static str, &'static str)> {
    let options = cluster.client_options()?;
    let endpoint = &cluster.workers[0].app_endpoint;
    let (events_tx, events) = mpsc::unbounded_channel();
    let client = AppClient::connect_with(
        endpoint,
        &options,
        &cluster.app_id,
        &cluster.app_secret,
        events_tx,
    )
    .await?;
    client.subscribe().await?;
    let mut demo = Demo {
        client,
        events,
        deadline: tokio::time::Instant::now() + Duration::from_secs(args.timeout_s),
        job_ms: args.job_ms,
    };
    println!(
        "== 1. Warm-up: one run each of \"etl\" and \"report\" ({} ms containers), so 3σPredict \
         has their runtime history",
        args.job_ms
    );
    for name in ["etl", "report"] {
        let a = demo
            .client
            .allocate(job_ask(
                name,
                JobUtility::Slo {
                    deadline_ms: now_ms() + 600_000,
                    value: 1.0,
                },
            ))
            .await?;
        demo.run_to_completion(&[a], args.job_ms).await?;
    }
    let loose_s = 40.0;
    println!(
        "== 2. Both wait behind a 1.5 s container; the SLO job's deadline is {loose_s} s away \
         (loose)"
    );
    let loose = demo.race(loose_s).await?;
    // The blocker (1.5 s), one job and the SLO job's own runtime: only starting it first makes
    // the deadline.
    let tight_s = 1.5 + args.job_ms as f64 / 1000.0 * 1.6 + 1.0;
    println!(
        "== 3. Again, with the SLO job's deadline {tight_s:.1} s away (tight: it must start as \
         soon as the node frees)"
    );
    let tight = demo.race(tight_s).await?;
    Ok((loose, tight))
}

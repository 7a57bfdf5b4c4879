//! `testbed demo` (a local cluster plus a mixed workload, explained) and
//! `testbed node-loss-check` (the in-network half of the docker-compose node-loss test).

use crate::client::{AppClient, ClientPool};
use crate::load::{LoadArgs, LoadType, print_report, run_load};
use crate::local::{LocalArgs, LocalCluster};
use anyhow::{Context, bail};
use scheduler_core::protocol::app::{
    AcceptedState, Allocate, ContainerEvent, ContainerEventKind, GrantedContainer, LaunchSpec,
    Locality,
};
use scheduler_core::{ContainerId, ContainerType, KillReason, Resources};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

/// Options of `testbed demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Workers of the local cluster.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Containers in the mixed workload.
    #[arg(long, default_value_t = 120)]
    pub containers: usize,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn ask(
    ctype: ContainerType,
    cpu: u64,
    count: u32,
    node: Option<&str>,
    estimate_ms: u64,
    job: &str,
) -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(cpu, 64),
        count,
        priority: 0,
        container_type: ctype,
        locality: node.map(|n| Locality {
            nodes: vec![n.to_string()],
            racks: vec![],
            relax: false,
        }),
        runtime_estimate_ms: Some(estimate_ms),
        job_id: job.to_string(),
        job_submit_time_ms: now_ms(),
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    }
}

fn task_launch(duration_ms: u64) -> anyhow::Result<LaunchSpec> {
    Ok(LaunchSpec {
        command: std::env::current_exe()?.display().to_string(),
        args: vec![
            "task".into(),
            "--duration-ms".into(),
            duration_ms.to_string(),
        ],
        ..Default::default()
    })
}

/// Wait (bounded by `limit`, a guard against hangs) for an event matching `want`.
async fn wait_event(
    events: &mut mpsc::UnboundedReceiver<ContainerEvent>,
    limit: Duration,
    log: bool,
    mut want: impl FnMut(&ContainerEvent) -> bool,
) -> anyhow::Result<ContainerEvent> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let ev = tokio::time::timeout_at(deadline, events.recv())
            .await
            .context("timed out waiting for a container event")?
            .context("event stream closed")?;
        if log {
            println!(
                "    event: {} on {}: {:?}",
                ev.container_id, ev.node_id, ev.event
            );
        }
        if want(&ev) {
            return Ok(ev);
        }
    }
}

/// `testbed demo`.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    crate::local::install_stop_signals();
    let local = LocalArgs {
        workers: args.workers.max(1),
        cpu_millis: 2000,
        memory_mib: 2048,
        heartbeat_interval_ms: 200,
        ..LocalArgs::default()
    };
    println!(
        "== Starting a local cluster: a coordinator and {} workers (2 cores, 2 GiB each) as separate processes",
        local.workers
    );
    let cluster = LocalCluster::start(&local)?;
    println!("   coordinator (QUIC) at {}", cluster.coordinator);
    for w in &cluster.workers {
        println!("   {} serves applications at {}", w.node_id, w.app_endpoint);
    }
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(demo_workload(&cluster, args));
    drop(cluster);
    result?;
    println!("== Done: the cluster was stopped and every container killed.");
    Ok(())
}

async fn demo_workload(cluster: &LocalCluster, args: &DemoArgs) -> anyhow::Result<()> {
    let endpoint = cluster.workers[0].app_endpoint.clone();
    println!();
    println!(
        "== 1. A mixed workload (Mercury §7.4.1 shape): 80% short tasks (0.4 s), 20% long (4 s),"
    );
    println!(
        "      typed by hybrid-GQ <10sec-70%-Q: 70% of short tasks QUEUEABLE, the rest GUARANTEED."
    );
    let load = LoadArgs {
        endpoint: endpoint.clone(),
        ca_cert: Some(cluster.ca_cert.clone()),
        app_id: Some(cluster.app_id.clone()),
        app_secret: Some(cluster.app_secret.clone()),
        credentials_file: None,
        containers: args.containers,
        load_type: LoadType::Hybrid,
        policy: "<10sec-70%-Q".into(),
        concurrency: 18,
        task_duration_ms: 400,
        long_task_duration_ms: 4000,
        long_fraction: 0.2,
        task_memory_mib: 8,
        task_cpu_fraction: 0.0,
        cpu_millis: 500,
        memory_mib: 64,
        max_retries: 20,
        seed: 7,
        allocate_only: false,
        task_program: None,
        json: false,
        measure_floor: false,
        floor_round_trips: 0,
    };
    let report = run_load(&load).await?;
    print_report(&report);

    println!();
    println!(
        "== 2. Queueing, promotion and preemption on one node ({}):",
        cluster.workers[0].node_id
    );
    let node = cluster.workers[0].node_id.clone();
    let (pool, mut events) = ClientPool::with_options(
        &cluster.app_id,
        &cluster.app_secret,
        cluster.client_options()?,
    );
    let client = pool.get(&endpoint).await?;
    let long = task_launch(60_000)?;
    // Four QUEUEABLE containers of 500 millicores fill the 2-core node; a fifth queues.
    let filled = client
        .allocate(ask(
            ContainerType::Queueable,
            500,
            4,
            Some(&node),
            60_000,
            "demo-q",
        ))
        .await?;
    let mut ids: Vec<ContainerId> = vec![];
    for g in &filled.containers {
        pool.start(g, long.clone()).await?;
        ids.push(g.container_id);
    }
    println!("   4 QUEUEABLE containers running on {node}");
    let extra = client
        .allocate(ask(
            ContainerType::Queueable,
            500,
            1,
            Some(&node),
            60_000,
            "demo-q2",
        ))
        .await?;
    let queued = extra
        .containers
        .first()
        .context("no grant for the fifth container")?;
    let accepted = pool.start(queued, long.clone()).await?;
    println!(
        "   a 5th QUEUEABLE container is {:?}: the node is full",
        accepted.state
    );
    println!(
        "   {node}'s queue delay R = Tq + Tr + Tl is now far above mean + sigma of the cluster, so at the next"
    );
    println!(
        "   heartbeat the coordinator's threshold makes {node} shed its queue (the app would re-ask elsewhere):"
    );
    wait_event(&mut events, Duration::from_secs(20), true, |e| {
        e.container_id == queued.container_id
            && matches!(e.event, ContainerEventKind::Killed { .. })
    })
    .await?;
    let first = ids[0];
    println!(
        "   promoting running QUEUEABLE container {first} to GUARANTEED (validated by the central guarantor)..."
    );
    // The coordinator learns of a container from the hosting node's next heartbeat; until then a
    // promotion is refused as unknown, so retry a few heartbeats later.
    let mut attempt = 0;
    let promoted = loop {
        match client.promote(first).await {
            Ok(p) => break p,
            Err(e) if attempt < 50 && e.server().is_some() => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    println!(
        "   promoted: new token version {}, type {}; it can no longer be preempted",
        promoted.token.body.version, promoted.token.body.container_type
    );
    println!(
        "   now a GUARANTEED ask for 1000 millicores on {node}: the two most recently started QUEUEABLE"
    );
    println!("   containers are killed to make room (never the promoted one):");
    let g = client
        .allocate(ask(
            ContainerType::Guaranteed,
            1000,
            1,
            Some(&node),
            60_000,
            "demo-g",
        ))
        .await?;
    let g0 = g.containers.first().context("no GUARANTEED grant")?;
    pool.start(g0, long.clone()).await?;
    ids.push(g0.container_id);
    let mut preempted = 0;
    while preempted < 2 {
        wait_event(&mut events, Duration::from_secs(20), true, |e| {
            matches!(
                e.event,
                ContainerEventKind::Killed {
                    reason: KillReason::PreemptedByGuaranteed,
                    ..
                }
            )
        })
        .await?;
        preempted += 1;
    }
    println!("   releasing everything");
    for id in ids {
        let _ = client.release(id).await;
    }
    Ok(())
}

/// Options of `testbed node-loss-check`.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeLossArgs {
    /// App endpoint of a worker (tls://, tcp:// or unix://, as `testbed load --endpoint`).
    #[arg(long)]
    pub endpoint: String,
    /// The cluster CA certificate for tls:// endpoints.
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    #[arg(long)]
    pub credentials_file: PathBuf,
    /// Node id of the worker that will be killed.
    #[arg(long)]
    pub victim: String,
    /// Guard against hangs.
    #[arg(long, default_value_t = 60_000)]
    pub timeout_ms: u64,
}

/// Start long containers until every worker (the victim included) runs one, print READY, wait
/// for the victim's containers to be reported lost, then check new grants avoid the victim.
pub fn node_loss_check(args: &NodeLossArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(node_loss(args))?;
    println!("{result}");
    if result["ok"] != serde_json::Value::Bool(true) {
        bail!("node loss was not handled as expected");
    }
    Ok(())
}

async fn node_loss(args: &NodeLossArgs) -> anyhow::Result<serde_json::Value> {
    let creds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&args.credentials_file)?)?;
    let (app_id, secret) = (
        creds["apps"][0]["app_id"]
            .as_str()
            .context("no app in credentials")?
            .to_string(),
        creds["apps"][0]["app_secret"]
            .as_str()
            .context("no app secret in credentials")?
            .to_string(),
    );
    let limit = Duration::from_millis(args.timeout_ms);
    let options = crate::client::ConnectOptions::from_ca_cert(args.ca_cert.as_deref())?;
    let (pool, mut events) = ClientPool::with_options(&app_id, &secret, options);
    let client: std::sync::Arc<AppClient> = pool.get(&args.endpoint).await?;
    let long = task_launch(args.timeout_ms * 2)?;
    let mut on_victim: HashSet<ContainerId> = HashSet::new();
    let mut all: Vec<GrantedContainer> = vec![];
    for _ in 0..20 {
        let a = client
            .allocate(ask(
                ContainerType::Queueable,
                100,
                3,
                None,
                120_000,
                "loss-check",
            ))
            .await?;
        for g in a.containers {
            let accepted = pool.start(&g, long.clone()).await?;
            if accepted.state == AcceptedState::Running && g.node_id.as_str() == args.victim {
                on_victim.insert(g.container_id);
            }
            all.push(g);
        }
        if !on_victim.is_empty() {
            break;
        }
    }
    if on_victim.is_empty() {
        bail!(
            "no container could be placed on {} (is it part of the cluster?)",
            args.victim
        );
    }
    let nodes: HashSet<&str> = all.iter().map(|g| g.node_id.as_str()).collect();
    eprintln!(
        "node-loss-check: {} containers running on {:?}",
        all.len(),
        nodes
    );
    println!("READY");
    std::io::stdout().flush()?;
    let mut lost: HashSet<ContainerId> = HashSet::new();
    while lost.len() < on_victim.len() {
        let ev = wait_event(&mut events, limit, false, |e| {
            matches!(
                e.event,
                ContainerEventKind::Killed {
                    reason: KillReason::Lost,
                    ..
                }
            )
        })
        .await?;
        if on_victim.contains(&ev.container_id) {
            lost.insert(ev.container_id);
        }
    }
    let mut new_grants = 0;
    let mut new_on_victim = 0;
    let mut by_node: HashMap<String, u32> = HashMap::new();
    for ctype in [
        ContainerType::Queueable,
        ContainerType::Queueable,
        ContainerType::Guaranteed,
        ContainerType::Guaranteed,
    ] {
        let a = client
            .allocate(ask(ctype, 100, 2, None, 1000, "after-loss"))
            .await?;
        for g in a.containers {
            new_grants += 1;
            if g.node_id.as_str() == args.victim {
                new_on_victim += 1;
            }
            *by_node.entry(g.node_id.to_string()).or_default() += 1;
            let _ = client.release(g.container_id).await;
        }
    }
    for g in all.iter().filter(|g| !on_victim.contains(&g.container_id)) {
        let _ = client.release(g.container_id).await;
    }
    Ok(serde_json::json!({
        "ok": lost.len() == on_victim.len() && new_on_victim == 0 && new_grants > 0,
        "started_on_victim": on_victim.len(),
        "lost_on_victim": lost.len(),
        "new_grants": new_grants,
        "new_grants_on_victim": new_on_victim,
        "new_grants_by_node": by_node,
    }))
}

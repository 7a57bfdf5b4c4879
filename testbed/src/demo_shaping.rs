//! `testbed demo-shaping`: Pace's resource shaper on a real local cluster (a coordinator and a
//! worker as separate processes, `testbed task` containers). Three GUARANTEED containers that
//! allow shaping reserve 3 × 300 MiB of a 1-GiB node but use about 40 MiB each; a fourth,
//! unshaped ask of 500 MiB waits for room. Once the GP forecaster has its history (12 shaping
//! intervals) the shaper books the three at forecast + β, and the waiting container is granted
//! and started in the capacity that frees.

use crate::client::AppClient;
use crate::local::{LocalArgs, LocalCluster};
use anyhow::{Context, bail};
use scheduler_core::protocol::app::{
    Allocate, ContainerEvent, ContainerEventKind, GrantedContainer, LaunchSpec,
};
use scheduler_core::shaper::ComponentRole;
use scheduler_core::{ContainerType, Resources};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Options of `testbed demo-shaping`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoShapingArgs {
    /// Shaping pass period (Pace uses a minute; shorter here so the demo takes seconds).
    #[arg(long, default_value_t = 1000)]
    pub shaping_interval_ms: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
}

const NODE_MEMORY_MIB: u64 = 1024;
const SHAPED_MIB: u64 = 300;
const WAITING_MIB: u64 = 500;

fn ask(memory_mib: u64, role: ComponentRole, allow_shaping: bool) -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(1000, memory_mib),
        count: 1,
        priority: 0,
        container_type: ContainerType::Guaranteed,
        locality: None,
        runtime_estimate_ms: Some(600_000),
        job_id: "demo-shaping".into(),
        job_submit_time_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64,
        reservation_id: None,
        role,
        allow_shaping,
        job: None,
        replaces_shed: Vec::new(),
    }
}

fn task(memory_mib: u64) -> anyhow::Result<LaunchSpec> {
    Ok(LaunchSpec {
        command: std::env::current_exe()?.display().to_string(),
        args: vec![
            "task".into(),
            "--duration-ms".into(),
            "600000".into(),
            "--memory-mib".into(),
            memory_mib.to_string(),
        ],
        ..Default::default()
    })
}

async fn running(
    events: &mut mpsc::UnboundedReceiver<ContainerEvent>,
    grant: &GrantedContainer,
    deadline: tokio::time::Instant,
) -> anyhow::Result<()> {
    loop {
        let e = tokio::time::timeout_at(deadline, events.recv())
            .await
            .context("timed out waiting for a container to run")?
            .context("event stream closed")?;
        if e.container_id != grant.container_id {
            continue;
        }
        match e.event {
            ContainerEventKind::Running => return Ok(()),
            other => bail!("container {} did not run: {other:?}", grant.container_id),
        }
    }
}

/// `testbed demo-shaping`.
pub fn run(args: &DemoShapingArgs) -> anyhow::Result<()> {
    crate::local::install_stop_signals();
    let local = LocalArgs {
        workers: 1,
        cpu_millis: 4000,
        memory_mib: NODE_MEMORY_MIB,
        heartbeat_interval_ms: 200,
        shaping_interval_ms: Some(args.shaping_interval_ms),
        ..LocalArgs::default()
    };
    println!(
        "== A local cluster: a coordinator with the resource shaper on (GP, K1 = 5 %, K2 = 3, \
         pessimistic policy, a pass every {} ms) and one worker of 4 cores / {NODE_MEMORY_MIB} MiB",
        args.shaping_interval_ms
    );
    let cluster = LocalCluster::start(&local)?;
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(workload(&cluster, args));
    drop(cluster);
    result?;
    println!("== Done: the cluster was stopped and every container killed.");
    Ok(())
}

async fn workload(cluster: &LocalCluster, args: &DemoShapingArgs) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout_s);
    let options = cluster.client_options()?;
    let endpoint = &cluster.workers[0].app_endpoint;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let client = AppClient::connect_with(
        endpoint,
        &options,
        &cluster.app_id,
        &cluster.app_secret,
        events_tx,
    )
    .await?;
    client.subscribe().await?;
    println!(
        "== 1. Three GUARANTEED containers of {SHAPED_MIB} MiB that allow shaping (one core, two \
         elastic), each using about 40 MiB"
    );
    for role in [
        ComponentRole::Core,
        ComponentRole::Elastic,
        ComponentRole::Elastic,
    ] {
        let a = client.allocate(ask(SHAPED_MIB, role, true)).await?;
        let grant = a.containers.first().context("granted")?;
        client
            .start_container(grant.token.clone(), task(40)?)
            .await?;
        running(&mut events, grant, deadline).await?;
        println!("   {} ({role:?}) runs", grant.container_id);
    }
    println!(
        "== 2. A {WAITING_MIB}-MiB GUARANTEED ask (not shaped): {} MiB of the node are booked, {} free: it waits",
        3 * SHAPED_MIB,
        NODE_MEMORY_MIB - 3 * SHAPED_MIB
    );
    let (waiting_tx, mut waiting_events) = mpsc::unbounded_channel();
    let waiting = AppClient::connect_with(
        endpoint,
        &options,
        &cluster.app_id,
        &cluster.app_secret,
        waiting_tx,
    )
    .await?;
    waiting.subscribe().await?;
    let asked_at = Instant::now();
    println!(
        "   the shaper needs 12 intervals of use history before the GP forecasts (about {} s)...",
        12 * args.shaping_interval_ms / 1000 + 1
    );
    let granted = tokio::time::timeout_at(
        deadline,
        waiting.allocate(ask(WAITING_MIB, ComponentRole::Core, false)),
    )
    .await
    .context("the waiting ask was not admitted in time")??;
    let grant = granted.containers.first().context("granted")?;
    println!(
        "== 3. Granted after {:.1} s: the shaper booked the three at forecast + β, freeing room",
        asked_at.elapsed().as_secs_f64()
    );
    waiting
        .start_container(grant.token.clone(), task(8)?)
        .await?;
    running(&mut waiting_events, grant, deadline).await?;
    println!(
        "   {} runs on {}: the node's GUARANTEED accounting follows the shaped sizes too",
        grant.container_id, grant.node_id
    );
    Ok(())
}

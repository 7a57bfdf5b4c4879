//! `testbed partition-check`: the in-network half of the docker-compose network-partition test
//! (deploy/compose-partition-test.sh). Two phases, each a separate run:
//!
//! - `before`: get a GUARANTEED container of `--old-cpu-millis` on the victim (through the
//!   worker at `--endpoint`), start a marked sleeper in it, print `READY {json}`; the script then
//!   cuts the victim off the network. Wait until the app is told the container is `lost` and
//!   print the result.
//! - `after` (once the script has reconnected the victim and seen it re-join): ask for the
//!   victim's whole capacity as one GUARANTEED container and start a marked sleeper in it, and
//!   get a QUEUEABLE grant on the victim too. The node refuses GUARANTEED work past its capacity,
//!   so the start succeeds only if the lost container no longer counts there; the script checks
//!   with `ps` that its processes are gone and the new container's run.

use crate::client::ClientPool;
use anyhow::{Context, bail};
use scheduler_core::protocol::app::{
    AcceptedState, Allocate, ContainerEventKind, ErrorCode, LaunchSpec, Locality,
};
use scheduler_core::{ContainerType, KillReason, Resources};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Which half of the test to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Before,
    After,
}

/// Options of `testbed partition-check`.
#[derive(Debug, Clone, clap::Args)]
pub struct PartitionArgs {
    #[arg(long, value_enum)]
    pub phase: Phase,
    /// The app endpoint to ask through (a worker that stays connected).
    #[arg(long)]
    pub endpoint: String,
    #[arg(long)]
    pub credentials_file: PathBuf,
    /// Node id of the worker that is cut off.
    #[arg(long)]
    pub victim: String,
    /// CPU of the GUARANTEED container started before the partition.
    #[arg(long, default_value_t = 1500)]
    pub old_cpu_millis: u64,
    /// The victim's CPU capacity (asked for in full after the re-join).
    #[arg(long, default_value_t = 2000)]
    pub capacity_cpu_millis: u64,
    /// Marker in the sleeper's command line (the script looks for it with `ps`).
    #[arg(long)]
    pub marker: String,
    /// Guard against hangs.
    #[arg(long, default_value_t = 60_000)]
    pub timeout_ms: u64,
}

fn on_victim(ctype: ContainerType, cpu: u64, victim: &str) -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(cpu, 32),
        count: 1,
        priority: 0,
        container_type: ctype,
        locality: Some(Locality {
            nodes: vec![victim.to_string()],
            racks: vec![],
            relax: false,
        }),
        runtime_estimate_ms: Some(600_000),
        job_id: "partition-check".into(),
        job_submit_time_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64,
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    }
}

/// A sleeping shell with `marker` in its command line (the shell stays: no `exec`).
fn marked_sleeper(marker: &str) -> LaunchSpec {
    LaunchSpec {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), format!("sleep 600; echo {marker}")],
        ..Default::default()
    }
}

/// `testbed partition-check`.
pub fn run(args: &PartitionArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(check(args))?;
    println!("{result}");
    std::io::stdout().flush()?;
    if result["ok"] != serde_json::Value::Bool(true) {
        bail!("the partition was not handled as expected: {result}");
    }
    Ok(())
}

async fn check(args: &PartitionArgs) -> anyhow::Result<serde_json::Value> {
    let creds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&args.credentials_file)?)?;
    let app_id = creds["apps"][0]["app_id"]
        .as_str()
        .context("no app in credentials")?;
    let secret = creds["apps"][0]["app_secret"]
        .as_str()
        .context("no app secret")?;
    let guard = Duration::from_millis(args.timeout_ms);
    let (pool, mut events) = ClientPool::new(app_id, secret);
    let client = pool.get(&args.endpoint).await?;
    match args.phase {
        Phase::Before => {
            let ask = on_victim(ContainerType::Guaranteed, args.old_cpu_millis, &args.victim);
            let granted = tokio::time::timeout(guard, client.allocate(ask))
                .await
                .context("GUARANTEED ask not answered")??;
            let g = granted.containers.first().context("nothing granted")?;
            let accepted = pool.start(g, marked_sleeper(&args.marker)).await?;
            if accepted.state != AcceptedState::Running {
                bail!(
                    "the GUARANTEED container is {:?}, not running",
                    accepted.state
                );
            }
            println!(
                "READY {}",
                serde_json::json!({"container_id": g.container_id, "node_id": g.node_id})
            );
            std::io::stdout().flush()?;
            let deadline = tokio::time::Instant::now() + guard;
            loop {
                let ev = tokio::time::timeout_at(deadline, events.recv())
                    .await
                    .context("timed out waiting for the lost event")?
                    .context("event stream closed")?;
                if ev.container_id == g.container_id
                    && matches!(
                        ev.event,
                        ContainerEventKind::Killed {
                            reason: KillReason::Lost,
                            ..
                        }
                    )
                {
                    return Ok(serde_json::json!({
                        "ok": ev.node_id.as_str() == args.victim,
                        "phase": "before",
                        "lost": g.container_id,
                        "lost_on": ev.node_id,
                    }));
                }
            }
        }
        Phase::After => {
            // The victim has re-joined (the script saw it): its whole capacity is free again
            // at the guarantor and, once the lost container is killed, at the node.
            let deadline = tokio::time::Instant::now() + guard;
            let ask = on_victim(
                ContainerType::Guaranteed,
                args.capacity_cpu_millis,
                &args.victim,
            );
            let granted = loop {
                match tokio::time::timeout_at(deadline, client.allocate(ask.clone()))
                    .await
                    .context("the full-capacity GUARANTEED ask was not answered")?
                {
                    Ok(a) if !a.containers.is_empty() => break a,
                    Ok(a) => bail!("unexpected answer {a:?}"),
                    Err(e) if e.code() == Some(ErrorCode::CoordinatorUnavailable) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => bail!("the full-capacity GUARANTEED ask failed: {e:?}"),
                }
            };
            let g = &granted.containers[0];
            let accepted = pool.start(g, marked_sleeper(&args.marker)).await;
            let started = match &accepted {
                Ok(a) => format!("{:?}", a.state),
                Err(e) => format!("refused: {e:?}"),
            };
            // The asking worker's distributed scheduler learns of the re-joined node with the
            // next view it gets (one round later); until then a strict node-local QUEUEABLE ask
            // comes back unplaced, which is an answer to ask again, not a failure.
            let mut last_unplaced_reason = None;
            let q = loop {
                let q = tokio::time::timeout_at(
                    deadline,
                    client.allocate(on_victim(ContainerType::Queueable, 100, &args.victim)),
                )
                .await
                .context("QUEUEABLE ask not answered")??;
                if !q.containers.is_empty() || q.unplaced == 0 {
                    break q;
                }
                last_unplaced_reason = q.unplaced_reason.clone();
                if tokio::time::Instant::now() + Duration::from_millis(100) >= deadline {
                    break q;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let queueable_on_victim = q
                .containers
                .iter()
                .filter(|c| c.node_id.as_str() == args.victim)
                .count();
            for c in &q.containers {
                let _ = client.release(c.container_id).await;
            }
            Ok(serde_json::json!({
                "ok": g.node_id.as_str() == args.victim
                    && matches!(&accepted, Ok(a) if a.state == AcceptedState::Running)
                    && queueable_on_victim == 1,
                "phase": "after",
                "guaranteed_full_capacity_granted_on": g.node_id,
                "guaranteed_cpu_millis": g.resources.cpu_millis,
                "started": started,
                "queueable_grants_on_victim": queueable_on_victim,
                "queueable_last_unplaced_reason": last_unplaced_reason,
            }))
        }
    }
}

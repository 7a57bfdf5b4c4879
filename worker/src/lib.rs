//! The worker: one per node. Runs the distributed-scheduler actor and the node-runtime actor
//! (Mercury §3–§4) on one actix arbiter, the application endpoint (TCP and Unix socket), and the
//! QUIC link to the coordinator. All policy lives in `scheduler-core`.

pub mod app_endpoint;
pub mod config;
pub mod exec;
pub mod link;
pub mod node_actor;
pub mod scheduler_actor;
pub mod shared;

use actix::{Actor, Addr};
use anyhow::Context;
use config::WorkerConfig;
use scheduler_core::node::{NodeRuntime, NodeRuntimeConfig};
use scheduler_core::{NodeId, Resources};
use shared::{Shared, wall_now};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A running worker (inside an actix System).
pub struct WorkerHandle {
    pub node_id: NodeId,
    /// Bound TCP address of the app endpoint.
    pub app_addr: SocketAddr,
    /// The endpoint advertised in grants.
    pub app_endpoint: String,
    pub node: Addr<node_actor::NodeActor>,
    pub scheduler: Addr<scheduler_actor::SchedulerActor>,
    /// State shared by the actors and connection tasks (tests, diagnostics).
    pub shared: std::rc::Rc<shared::Shared>,
}

impl WorkerHandle {
    /// Kill every container (orderly shutdown).
    pub async fn shutdown(&self) {
        let _ = self.node.send(node_actor::KillAll).await;
    }
}

/// Start a worker and wait until it has joined the cluster. Must run inside an actix System.
pub async fn start(config: WorkerConfig) -> anyhow::Result<WorkerHandle> {
    let identity = exec::user::decide(
        config.container_user.clone(),
        config.allow_root_containers,
        exec::user::effective_uid(),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    match &identity {
        exec::user::Identity::Switch(run_as) => tracing::info!(
            user = %run_as.name,
            uid = run_as.uid,
            gid = run_as.gid,
            "containers run as this user"
        ),
        exec::user::Identity::SameAsWorker { uid, wanted } => tracing::warn!(
            uid,
            container_user = %wanted.name,
            "the worker is not root and cannot switch users: containers run as the worker's own uid, \
             so they can read whatever the worker can (run the worker as root to isolate them)"
        ),
    }
    warn_if_readable_by_others(&config);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = link::client_config(&config.ca_cert)?;
    // Before anything is offered: kill what a crashed previous incarnation left running.
    let state = Arc::new(
        exec::state::StateDir::open(&config.state_dir)
            .with_context(|| "opening the worker state dir (--state-dir)".to_string())?,
    );
    let reaping = Arc::clone(&state);
    let report = tokio::task::spawn_blocking(move || reaping.reap_leftovers())
        .await
        .context("reaping leftover containers")??;
    if report != exec::state::ReapReport::default() {
        tracing::warn!(
            records = report.records,
            containers_killed = report.containers_killed,
            processes_killed = report.processes_killed,
            cgroups_removed = report.cgroups_removed,
            cgroups_left = report.cgroups_left,
            state_dir = %config.state_dir.display(),
            "reaped what a previous worker left behind"
        );
    }
    let listener = tokio::net::TcpListener::bind(config.app_listen)
        .await
        .with_context(|| format!("binding the app endpoint on {}", config.app_listen))?;
    let app_addr = listener.local_addr()?;
    let app_endpoint = config
        .app_advertise
        .clone()
        .unwrap_or_else(|| app_addr.to_string());
    let unix = match &config.app_socket {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            Some(
                tokio::net::UnixListener::bind(path)
                    .with_context(|| format!("binding the app Unix socket {}", path.display()))?,
            )
        }
        None => None,
    };
    let seed = config.seed.unwrap_or_else(rand::random);
    tracing::info!(seed, "placement RNG seeded");

    let node_id = NodeId::new(config.node_id.as_str());
    let capacity = Resources::new(config.cpu_millis, config.memory_mib);
    let mut node_config = NodeRuntimeConfig::new(capacity);
    node_config.reorder_by_job_submit_time = !config.fifo_queue;
    node_config.default_runtime_estimate_ms = config.default_runtime_estimate_ms;
    node_config.max_queue_length = config.max_queue_length;
    let executor = Rc::new(exec::Executor::detect(exec::ExecutorConfig {
        log_dir: config.container_log_dir.clone(),
        run_as: identity.run_as(),
        state: Some(state),
        ..Default::default()
    }));
    tracing::info!(
        enforcement = executor.enforcement().name(),
        "container executor ready"
    );

    let shared = Rc::new(Shared::default());
    let (link_tx, link_rx) = mpsc::unbounded_channel();
    let node = node_actor::NodeActor::new(
        node_id.clone(),
        NodeRuntime::new(node_config, wall_now()),
        executor,
        shared.clone(),
        link_tx.clone(),
    )
    .start();
    let scheduler = scheduler_actor::SchedulerActor::new(shared.clone(), link_tx, seed).start();

    let endpoint = app_endpoint::Endpoint {
        node_id: node_id.clone(),
        shared: shared.clone(),
        scheduler: scheduler.clone(),
        node: node.clone(),
        limits: config.app_limits,
        connections: Default::default(),
        refuse_log: Default::default(),
    };
    actix_rt::spawn(endpoint.clone().serve_tcp(listener));
    if let Some(unix) = unix {
        actix_rt::spawn(endpoint.serve_unix(unix));
    }

    let identity = link::Identity {
        node_id: node_id.clone(),
        rack: config.rack.clone(),
        capacity,
        app_endpoint: app_endpoint.clone(),
        join_token: config.join_token.clone(),
        coordinator: config.coordinator.clone(),
    };
    let (joined_tx, joined_rx) = tokio::sync::oneshot::channel();
    let link = link::Link {
        identity,
        client,
        shared: shared.clone(),
        scheduler: scheduler.clone(),
        node: node.clone(),
        outbox: link_rx,
    };
    actix_rt::spawn(link.run(Some(joined_tx)));
    match joined_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => anyhow::bail!(e),
        Err(_) => anyhow::bail!("the cluster link stopped before joining"),
    }
    Ok(WorkerHandle {
        node_id,
        app_addr,
        app_endpoint,
        node,
        scheduler,
        shared,
    })
}

/// Containers must not read the worker's secrets: warn when the join token file could be read
/// by users other than the worker's (the file is the operator's, so it is not changed here).
fn warn_if_readable_by_others(config: &WorkerConfig) {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = &config.join_token_file else {
        return;
    };
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o044 != 0
    {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the join token file is readable by group or others: make it 0600 so containers cannot read it"
        );
    }
}

//! The operator's admin channel (issue 18): a Unix socket in the data dir, `DATA_DIR/admin.sock`,
//! mode 0600 inside the 0700 data dir, and a peer-credential check: only the coordinator's own
//! user (or root) may connect, the way the data dir itself is guarded (as HyperQueue's server
//! directory or Docker's socket). Remote operators reach it through ssh; nothing is exposed on the
//! network.
//!
//! One JSON object per line each way: a request `{"cmd": "...", ...}` ([`AdminRequest`]) and a
//! reply `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`. Lines are capped at
//! [`MAX_LINE`] bytes, connections at [`MAX_CONNECTIONS`] at once, and an idle connection is
//! closed after [`IDLE_LIMIT`]. The `coordinator status|nodes|node|apps|reservations|explain|
//! waiting|shedding|top` commands are its client ([`call`]).

use crate::coordinator_actor::{
    AddApp, AdminCluster, CoordinatorActor, RemoveApp, SetAppQuota, SetDraining, SetShedding,
    SetTopK,
};
use crate::guarantor_actor::{
    AdminDeleteReservation, AdminGuarantor, AdminReserve, GuarantorActor,
};
use actix::Addr;
use scheduler_core::NodeId;
use scheduler_core::coordinator::SheddingPolicy;
use scheduler_core::quota::QueueableQuota;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

/// Longest request or reply line.
pub const MAX_LINE: usize = 64 * 1024;
/// Admin connections served at once; more are closed at accept.
pub const MAX_CONNECTIONS: usize = 8;
/// Longest reply a client reads (a 10,000-node `nodes` list is a few MiB).
pub const MAX_REPLY: u64 = 64 << 20;
/// An admin connection with no request for this long is closed.
pub const IDLE_LIMIT: Duration = Duration::from_secs(300);

/// The socket's path in a data dir.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("admin.sock")
}

/// What an operator can ask.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    /// Cluster totals.
    Status,
    /// Every joined node with its load, bookings and whether it is draining.
    Nodes,
    /// Start draining a node: no new work; what runs there finishes.
    Drain { node: String },
    /// Stop draining a node.
    Undrain { node: String },
    /// Registered apps with their quotas and what they run.
    Apps,
    /// Register an app; its secret is in the reply (shown once).
    AppAdd {
        app_id: String,
        #[serde(default)]
        quota: QueueableQuota,
    },
    /// Unregister an app: its new requests are refused; running containers finish.
    AppRemove { app_id: String },
    /// Replace an app's QUEUEABLE quota.
    AppQuota {
        app_id: String,
        quota: QueueableQuota,
    },
    /// Every reservation and the plan's free capacity.
    Reservations,
    /// Delete a reservation (any owner's); its waiting asks are refused.
    ReservationDelete { id: String },
    /// Reserve (or update, when it exists) a recurring reservation owned by a registered app:
    /// the operator's end of the Morpheus loop (`coordinator reservations submit`).
    ReservationSubmit {
        app_id: String,
        reservation_id: String,
        definition: scheduler_core::reservation::ReservationDefinition,
    },
    /// The waiting GUARANTEED asks, each with why it waits.
    Waiting,
    /// The waiting asks of one job, with why they wait.
    Explain { job: String },
    /// Change k of top-k (1 to 10,000); workers adopt it with their next heartbeat ack.
    TopK { k: usize },
    /// Change the shedding policy (`off`, `avg+sigma`, `avg+2sigma`, `mean+N*sigma`).
    Shedding { policy: String },
}

/// Bind the admin socket (replacing a stale one: the store's lock already guarantees that no
/// other coordinator runs on this data dir) with mode 0600.
pub fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serve the admin socket until the runtime stops.
pub fn spawn_server(
    listener: tokio::net::UnixListener,
    coordinator: Addr<CoordinatorActor>,
    guarantor: Addr<GuarantorActor>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(path = ?addr.as_pathname(), "admin socket listening");
    }
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // SAFETY: geteuid has no preconditions.
    let own_uid = unsafe { libc::geteuid() };
    actix_rt::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!("admin accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let uid = stream.peer_cred().map(|c| c.uid()).ok();
            if uid != Some(own_uid) && uid != Some(0) {
                warn!(
                    ?uid,
                    "admin connection refused: not the coordinator's user or root"
                );
                continue;
            }
            let Ok(permit) = open.clone().try_acquire_owned() else {
                debug!("admin connection refused: {MAX_CONNECTIONS} already open");
                continue;
            };
            let (coordinator, guarantor) = (coordinator.clone(), guarantor.clone());
            actix_rt::spawn(async move {
                let _permit = permit;
                if let Err(e) = serve(stream, coordinator, guarantor).await {
                    debug!("admin connection ended: {e}");
                }
            });
        }
    });
}

async fn serve(
    stream: tokio::net::UnixStream,
    coordinator: Addr<CoordinatorActor>,
    guarantor: Addr<GuarantorActor>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    // One byte more than the limit tells an over-long line from one that fits.
    let mut lines = tokio::io::BufReader::new(read).take(MAX_LINE as u64 + 1);
    let mut line = String::new();
    loop {
        line.clear();
        let n = match tokio::time::timeout(IDLE_LIMIT, lines.read_line(&mut line)).await {
            Ok(r) => r?,
            Err(_) => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
        let reply = if n > MAX_LINE {
            json!({"ok": false, "error": format!("request longer than {MAX_LINE} bytes")})
        } else {
            match serde_json::from_str::<AdminRequest>(line.trim()) {
                Ok(request) => match handle(request, &coordinator, &guarantor).await {
                    Ok(result) => json!({"ok": true, "result": result}),
                    Err(error) => json!({"ok": false, "error": error}),
                },
                Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
            }
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        write.write_all(&out).await?;
        if n > MAX_LINE {
            return Ok(());
        }
        lines.set_limit(MAX_LINE as u64 + 1);
    }
}

fn node_id(name: &str) -> Result<NodeId, String> {
    if name.is_empty() || name.len() > 253 {
        return Err(format!("bad node name {name:?}"));
    }
    Ok(NodeId::from(name))
}

/// Carry out one request.
pub async fn handle(
    request: AdminRequest,
    coordinator: &Addr<CoordinatorActor>,
    guarantor: &Addr<GuarantorActor>,
) -> Result<Value, String> {
    let gone = |e: actix::MailboxError| format!("the coordinator is stopping: {e}");
    let draining = matches!(request, AdminRequest::Drain { .. });
    fn to_json<T: Serialize>(v: &T) -> Result<Value, String> {
        serde_json::to_value(v).map_err(|e| e.to_string())
    }
    match request {
        AdminRequest::Status => {
            let cluster = coordinator.send(AdminCluster).await.map_err(gone)?;
            let g = guarantor.send(AdminGuarantor).await.map_err(gone)?;
            let capacity = cluster
                .nodes
                .iter()
                .fold(scheduler_core::Resources::default(), |a, n| {
                    a.saturating_add(&n.capacity)
                });
            let booked = g
                .bookings
                .iter()
                .fold(scheduler_core::Resources::default(), |a, b| {
                    a.saturating_add(&b.guaranteed_booked)
                });
            let running: u32 = cluster
                .nodes
                .iter()
                .map(|n| n.running_guaranteed + n.running_queueable)
                .sum();
            let queued: u32 = cluster.nodes.iter().map(|n| n.queued).sum();
            Ok(json!({
                "nodes": cluster.nodes.len(),
                "nodes_draining": cluster.nodes.iter().filter(|n| n.draining).count(),
                "nodes_lost": cluster.lost_nodes.len(),
                "apps": cluster.apps.len(),
                "capacity": capacity,
                "guaranteed_booked": booked,
                "containers_running": running,
                "containers_queued": queued,
                "guaranteed_waiting": g.pending_containers,
                "shedding_threshold_ms": cluster.shedding_threshold_ms,
                "reservations": g.reservations_total,
                "placer": g.placer,
            }))
        }
        AdminRequest::Nodes => {
            let cluster = coordinator.send(AdminCluster).await.map_err(gone)?;
            let g = guarantor.send(AdminGuarantor).await.map_err(gone)?;
            let nodes: Vec<Value> = cluster
                .nodes
                .iter()
                .map(|n| {
                    let b = g.bookings.iter().find(|b| b.node_id == n.node_id);
                    json!({
                        "node_id": n.node_id,
                        "rack": n.rack,
                        "capacity": n.capacity,
                        "guaranteed_booked": b.map(|b| b.guaranteed_booked),
                        "queueable_limit": b.map(|b| b.queueable_limit),
                        "queue_delay_ms": n.queue_delay_ms,
                        "running_guaranteed": n.running_guaranteed,
                        "running_queueable": n.running_queueable,
                        "queued": n.queued,
                        "silent_ms": n.silent_ms,
                        "draining": n.draining,
                        "drained": n.drained,
                    })
                })
                .collect();
            Ok(Value::Array(nodes))
        }
        AdminRequest::Drain { node } | AdminRequest::Undrain { node } => {
            let node = node_id(&node)?;
            let changed = coordinator
                .send(SetDraining {
                    node: node.clone(),
                    draining,
                })
                .await
                .map_err(gone)??;
            Ok(json!({"node_id": node.to_string(), "draining": draining, "changed": changed}))
        }
        AdminRequest::Apps => {
            let cluster = coordinator.send(AdminCluster).await.map_err(gone)?;
            to_json(&cluster.apps)
        }
        AdminRequest::AppAdd { app_id, quota } => {
            check_quota(&quota)?;
            let app = coordinator
                .send(AddApp { app_id, quota })
                .await
                .map_err(gone)?
                .map_err(|e| e.to_string())?;
            to_json(&app)
        }
        AdminRequest::AppRemove { app_id } => {
            coordinator
                .send(RemoveApp {
                    app_id: app_id.clone(),
                })
                .await
                .map_err(gone)??;
            Ok(json!({"app_id": app_id, "removed": true}))
        }
        AdminRequest::AppQuota { app_id, quota } => {
            check_quota(&quota)?;
            coordinator
                .send(SetAppQuota {
                    app_id: app_id.clone(),
                    quota,
                })
                .await
                .map_err(gone)??;
            Ok(json!({"app_id": app_id, "quota": quota}))
        }
        AdminRequest::Reservations => {
            let g = guarantor.send(AdminGuarantor).await.map_err(gone)?;
            Ok(json!({
                "reservations": g.reservations,
                "reservations_total": g.reservations_total,
                "plan_capacity": g.plan_capacity,
                "plan_free": g.plan_free,
                "agenda_horizon_ms": g.agenda_horizon_ms,
                "agenda_now_ms": g.agenda_now_ms,
            }))
        }
        AdminRequest::ReservationDelete { id } => {
            let dropped = guarantor
                .send(AdminDeleteReservation { id: id.clone() })
                .await
                .map_err(gone)??;
            Ok(json!({"id": id, "deleted": true, "asks_refused": dropped}))
        }
        AdminRequest::ReservationSubmit {
            app_id,
            reservation_id,
            definition,
        } => {
            let cluster = coordinator.send(AdminCluster).await.map_err(gone)?;
            let registered = to_json(&cluster.apps)?
                .as_array()
                .is_some_and(|apps| apps.iter().any(|a| a["app_id"] == app_id.as_str()));
            if !registered {
                return Err(format!(
                    "app_id: {app_id:?} is not a registered app (coordinator apps add {app_id})"
                ));
            }
            let (op, allocation) = guarantor
                .send(AdminReserve {
                    app_id: app_id.clone(),
                    reservation_id: reservation_id.clone(),
                    definition,
                })
                .await
                .map_err(gone)??;
            Ok(json!({
                "app_id": app_id,
                "reservation_id": reservation_id,
                "op": op,
                "accepted": true,
                "allocation": allocation,
            }))
        }
        AdminRequest::Waiting => {
            let g = guarantor.send(AdminGuarantor).await.map_err(gone)?;
            Ok(json!({
                "pending_asks": g.pending_asks,
                "pending_containers": g.pending_containers,
                "waiting": g.waiting,
            }))
        }
        AdminRequest::Explain { job } => {
            let g = guarantor.send(AdminGuarantor).await.map_err(gone)?;
            let asks: Vec<_> = g
                .waiting
                .iter()
                .filter(|w| w.job_id.as_str() == job)
                .collect();
            // 3Sigma jobs by job id or ask key: distribution, options and the last cycle's
            // reason.
            let jobs: Vec<_> = g
                .threesigma
                .iter()
                .flat_map(|t| &t.waiting_jobs)
                .filter(|j| j.job_id.as_str() == job || j.ask_key.to_string() == job)
                .collect();
            if asks.is_empty() && jobs.is_empty() {
                let listed = if g.pending_asks > g.waiting.len() {
                    format!(" among the first {} waiting asks", g.waiting.len())
                } else {
                    String::new()
                };
                return Err(format!(
                    "job {job:?} has no waiting GUARANTEED ask{listed} (placed, finished or never asked)"
                ));
            }
            Ok(json!({"job": job, "waiting": asks, "threesigma": jobs}))
        }
        AdminRequest::TopK { k } => {
            if !(1..=10_000).contains(&k) {
                return Err(format!("top-k must be between 1 and 10000, got {k}"));
            }
            coordinator.send(SetTopK(k)).await.map_err(gone)?;
            Ok(json!({"top_k": k}))
        }
        AdminRequest::Shedding { policy } => {
            let parsed: SheddingPolicy = policy
                .parse()
                .map_err(|e| format!("bad shedding policy {policy:?}: {e}"))?;
            coordinator.send(SetShedding(parsed)).await.map_err(gone)?;
            Ok(json!({"shedding": format!("{parsed:?}")}))
        }
    }
}

fn check_quota(q: &QueueableQuota) -> Result<(), String> {
    match q.max_queueable_per_guaranteed {
        Some(r) if !(r.is_finite() && r >= 0.0) => Err(format!(
            "max_queueable_per_guaranteed must be a non-negative number, got {r}"
        )),
        _ => Ok(()),
    }
}

/// Why the admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "cannot reach the coordinator's admin socket {path}: {source} (is the coordinator running on this data dir, as this user?)"
    )]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("admin socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the coordinator answered something that is not a reply: {0}")]
    BadReply(String),
    /// The coordinator refused the request; its words.
    #[error("{0}")]
    Refused(String),
}

/// A client of the admin socket (blocking; one request per call).
pub fn call(path: &Path, request: &AdminRequest) -> Result<Value, AdminError> {
    let io = |source| AdminError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut stream =
        std::os::unix::net::UnixStream::connect(path).map_err(|source| AdminError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(io)?;
    let mut line = serde_json::to_vec(request).map_err(|e| AdminError::BadReply(e.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut reply = String::new();
    std::io::BufReader::new(std::io::Read::take(&stream, MAX_REPLY))
        .read_line(&mut reply)
        .map_err(io)?;
    let reply: Value =
        serde_json::from_str(reply.trim()).map_err(|e| AdminError::BadReply(format!("{e}")))?;
    match reply["ok"].as_bool() {
        Some(true) => Ok(reply["result"].clone()),
        Some(false) => Err(AdminError::Refused(
            reply["error"].as_str().unwrap_or("refused").to_string(),
        )),
        None => Err(AdminError::BadReply(reply.to_string())),
    }
}

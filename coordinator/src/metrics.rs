//! Prometheus metrics of the coordinator: the registry, the handles the actors update (atomics
//! only, never awaited), and the HTTP task (hyper 1, on the actix/tokio runtime) serving
//! `/metrics` and the dashboard ([`crate::dashboard`]). The HTTP task only encodes the registry
//! and the published snapshots: it never sends to or waits on an actor.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use scheduler_core::{NodeId, Resources};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tracing::{debug, info, warn};

use crate::dashboard::{self, Dashboard};

/// Labels of a per-node series.
pub type NodeLabels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// The operator's view of the reservation agenda, served as JSON at `GET /reservations`: every
/// reservation (all owners) and the plan's free GUARANTEED capacity over the agenda (the least
/// common multiple of the periods, so the next period of every reservation).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgendaView {
    /// Coordinator clock (ms since the Unix epoch) when the guarantor published it.
    pub published_at_ms: u64,
    /// Where `published_at_ms` falls in the agenda (ms).
    pub agenda_now_ms: u64,
    pub agenda_ms: u64,
    pub plan_capacity: Resources,
    pub reservations: Vec<scheduler_core::reservation::book::ReservationInfo>,
    /// Free capacity as maximal runs, agenda ms.
    pub free: Vec<scheduler_core::reservation::AllocationInterval>,
}

/// Everything the coordinator exports. Cheap to clone handles; the registry owns the series.
pub struct CoordinatorMetrics {
    registry: Registry,
    /// The latest [`AgendaView`] as JSON. The guarantor actor publishes it whenever
    /// reservations or capacity change, so the HTTP task never asks an actor. Never held
    /// across an await.
    agenda: std::sync::Mutex<String>,
    pub nodes_joined: Counter,
    pub nodes_lost: Counter,
    /// Joins that waited for their turn to be answered (the join pacing,
    /// [`scheduler_core::join_pacing`]).
    pub joins_paced: Counter,
    /// Joins waiting for their turn to be answered now.
    pub joins_waiting: Gauge,
    /// Writes of the lost-node set to the store (synced commits on the coordinator actor's
    /// thread): at most one per tick for a batch of losses, and one at a heartbeat per tick
    /// for nodes that came back whole (the rest wait for the tick).
    pub lost_node_writes: Counter,
    /// Nodes declared lost whose loss the store has not recorded yet (a failed write): nothing
    /// of their loss is announced until it is ([`crate::coordinator_actor`], "lose_nodes").
    pub losses_not_stored: Gauge,
    /// Nodes silent past the node timeout whose declaration the loss guard holds now (most of
    /// the cluster silent at once, [`scheduler_core::loss_guard`]).
    pub losses_held_by_guard: Gauge,
    /// Ticks that found the coordinator had not been listening (paused, frozen, blocked): that
    /// time is not counted against the nodes' silence.
    pub own_stalls: Counter,
    /// Graces of the loss guard extended because a node came back (re-joined) within them:
    /// a recovery in progress holds the declarations of the nodes still on their way.
    pub loss_grace_extensions: Counter,
    pub heartbeats: Counter,
    pub promotions: Counter,
    /// Resource shaping (Pace): passes run, allocations changed, containers preempted by the
    /// policy, and containers shaped now.
    pub shaping_passes: Counter,
    pub shaping_resizes: Counter,
    pub shaping_preemptions: Counter,
    pub shaped_containers: Gauge,
    /// Request minus shaped allocation over shaped containers, by resource.
    pub shaping_freed: Family<ResourceLabel, Gauge>,
    /// Accepted reservations, and the plan's capacity and what reservations hold of it now,
    /// by resource (Morpheus' agenda at the current step).
    pub reservations: Gauge,
    pub plan_capacity: Family<ResourceLabel, Gauge>,
    pub plan_reserved: Family<ResourceLabel, Gauge>,
    pub shedding_threshold_ms: FloatGauge,
    /// R = Tq + Tr + Tl of each node, as of its last heartbeat.
    pub node_queue_delay_ms: Family<NodeLabels, FloatGauge>,
    /// Containers queued (QUEUEABLE queue and waiting GUARANTEED) and running on each node, as
    /// of its last heartbeat.
    pub node_queued: Family<NodeLabels, Gauge>,
    pub node_running: Family<NodeLabels, Gauge>,
    /// Per node and resource (`cpu_millis`, `memory_mib`).
    pub node_capacity: Family<NodeLabels, Gauge>,
    pub guaranteed_booked: Family<NodeLabels, Gauge>,
    pub policing_limit: Family<NodeLabels, Gauge>,
    /// 3σSched's live cycle: solve time, MILP size, waiting jobs, objective over LP bound,
    /// and finished SLO jobs by outcome.
    pub threesigma_cycle_seconds: Histogram,
    /// From a GUARANTEED ask decoded off its worker's stream to its first grant queued for
    /// that worker: the coordinator's share of the allocate latency (waits for capacity
    /// included).
    pub guaranteed_grant_seconds: Histogram,
    pub threesigma_columns: Gauge,
    pub threesigma_rows: Gauge,
    pub threesigma_pending_jobs: Gauge,
    pub threesigma_solution_over_bound: FloatGauge,
    pub threesigma_slo_met: Counter,
    pub threesigma_slo_missed: Counter,
}

impl Default for CoordinatorMetrics {
    fn default() -> Self {
        let mut m = CoordinatorMetrics {
            nodes_joined: Counter::default(),
            nodes_lost: Counter::default(),
            joins_paced: Counter::default(),
            joins_waiting: Gauge::default(),
            lost_node_writes: Counter::default(),
            losses_not_stored: Gauge::default(),
            losses_held_by_guard: Gauge::default(),
            own_stalls: Counter::default(),
            loss_grace_extensions: Counter::default(),
            heartbeats: Counter::default(),
            promotions: Counter::default(),
            shaping_passes: Counter::default(),
            shaping_resizes: Counter::default(),
            shaping_preemptions: Counter::default(),
            shaped_containers: Gauge::default(),
            shaping_freed: Family::default(),
            reservations: Gauge::default(),
            plan_capacity: Family::default(),
            plan_reserved: Family::default(),
            shedding_threshold_ms: FloatGauge::default(),
            node_queue_delay_ms: Family::default(),
            node_queued: Family::default(),
            node_running: Family::default(),
            node_capacity: Family::default(),
            guaranteed_booked: Family::default(),
            policing_limit: Family::default(),
            threesigma_cycle_seconds: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
            ]),
            guaranteed_grant_seconds: Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0,
            ]),
            threesigma_columns: Gauge::default(),
            threesigma_rows: Gauge::default(),
            threesigma_pending_jobs: Gauge::default(),
            threesigma_solution_over_bound: FloatGauge::default(),
            threesigma_slo_met: Counter::default(),
            threesigma_slo_missed: Counter::default(),
            registry: Registry::default(),
            agenda: std::sync::Mutex::new(
                serde_json::to_string(&AgendaView::default()).unwrap_or_default(),
            ),
        };
        let r = &mut m.registry;
        r.register(
            "coordinator_nodes_joined",
            "Worker joins accepted (re-joins included)",
            m.nodes_joined.clone(),
        );
        r.register(
            "coordinator_joins_paced",
            "Joins that waited for their turn to be answered: as many join answers (each the whole directory) were in delivery as join_answer_bytes_in_flight allows",
            m.joins_paced.clone(),
        );
        r.register(
            "coordinator_joins_waiting",
            "Joins waiting now for their turn to be answered (join pacing)",
            m.joins_waiting.clone(),
        );
        r.register(
            "coordinator_nodes_lost",
            "Nodes declared lost (timeout or closed session)",
            m.nodes_lost.clone(),
        );
        r.register(
            "coordinator_lost_node_writes",
            "Writes of the lost-node set to the store (one per batch of losses, not one per node)",
            m.lost_node_writes.clone(),
        );
        r.register(
            "coordinator_losses_not_stored",
            "Nodes declared lost whose loss the store refused so far: not announced until stored",
            m.losses_not_stored.clone(),
        );
        r.register(
            "coordinator_losses_held_by_guard",
            "Nodes silent past the node timeout not declared lost because most of the cluster is silent at once (presumed the coordinator's or the network's fault)",
            m.losses_held_by_guard.clone(),
        );
        r.register(
            "coordinator_own_stalls",
            "Ticks that found the coordinator had not been listening (paused, frozen, blocked); that time is not counted against any node's silence",
            m.own_stalls.clone(),
        );
        r.register(
            "coordinator_loss_grace_extensions",
            "Graces of the loss guard (after a pause of the coordinator's own or a mass silence) extended because a node came back within them: nodes still re-joining are not declared lost",
            m.loss_grace_extensions.clone(),
        );
        r.register(
            "coordinator_heartbeats",
            "Heartbeats received from joined workers",
            m.heartbeats.clone(),
        );
        r.register(
            "coordinator_shaping_passes",
            "Resource shaping passes run (Pace)",
            m.shaping_passes.clone(),
        );
        r.register(
            "coordinator_shaping_resizes",
            "GUARANTEED allocations the resource shaper changed",
            m.shaping_resizes.clone(),
        );
        r.register(
            "coordinator_shaping_preemptions",
            "Containers the shaper's preemption policy preempted (kill reason shaped_preemption)",
            m.shaping_preemptions.clone(),
        );
        r.register(
            "coordinator_shaped_containers",
            "Running GUARANTEED containers the resource shaper tracks",
            m.shaped_containers.clone(),
        );
        r.register(
            "coordinator_shaping_freed",
            "Capacity the shaper freed: request minus shaped allocation over shaped containers (cpu_millis, memory_mib)",
            m.shaping_freed.clone(),
        );
        r.register(
            "coordinator_reservations",
            "Accepted reservations (Morpheus)",
            m.reservations.clone(),
        );
        r.register(
            "coordinator_plan_capacity",
            "GUARANTEED capacity of the reservation plan (cpu_millis, memory_mib)",
            m.plan_capacity.clone(),
        );
        r.register(
            "coordinator_plan_reserved",
            "What reservations hold of the plan at the current step (cpu_millis, memory_mib)",
            m.plan_reserved.clone(),
        );
        r.register(
            "coordinator_promotions",
            "QUEUEABLE containers promoted to GUARANTEED",
            m.promotions.clone(),
        );
        r.register(
            "coordinator_shedding_threshold_ms",
            "Current load-shedding threshold on R (Mercury 4.3), milliseconds",
            m.shedding_threshold_ms.clone(),
        );
        r.register(
            "coordinator_node_queue_delay_ms",
            "Queue delay estimate R = Tq + Tr + Tl of each node at its last heartbeat, milliseconds",
            m.node_queue_delay_ms.clone(),
        );
        r.register(
            "coordinator_node_queued",
            "Containers queued on each node (QUEUEABLE queue and waiting GUARANTEED) at its last heartbeat",
            m.node_queued.clone(),
        );
        r.register(
            "coordinator_node_running",
            "Containers running on each node at its last heartbeat",
            m.node_running.clone(),
        );
        r.register(
            "coordinator_node_capacity",
            "Capacity of each node, by resource (cpu_millis, memory_mib)",
            m.node_capacity.clone(),
        );
        r.register(
            "coordinator_guaranteed_booked",
            "GUARANTEED bookings on each node (unstarted grants included), by resource",
            m.guaranteed_booked.clone(),
        );
        r.register(
            "coordinator_policing_limit",
            "QUEUEABLE policing limit of each node (capacity minus GUARANTEED bookings), by resource",
            m.policing_limit.clone(),
        );
        r.register(
            "coordinator_guaranteed_grant_seconds",
            "From a GUARANTEED ask decoded off its worker's stream to its first grant queued for that worker, seconds (waits for capacity included)",
            m.guaranteed_grant_seconds.clone(),
        );
        r.register(
            "coordinator_threesigma_cycle_seconds",
            "Time of each 3Sigma cycle's solve (snapshot to decision), seconds",
            m.threesigma_cycle_seconds.clone(),
        );
        r.register(
            "coordinator_threesigma_milp_columns",
            "Columns (options) of the last 3Sigma cycle's MILP",
            m.threesigma_columns.clone(),
        );
        r.register(
            "coordinator_threesigma_milp_rows",
            "Rows of the last 3Sigma cycle's MILP",
            m.threesigma_rows.clone(),
        );
        r.register(
            "coordinator_threesigma_pending_jobs",
            "Jobs waiting in the 3Sigma queue",
            m.threesigma_pending_jobs.clone(),
        );
        r.register(
            "coordinator_threesigma_solution_over_bound",
            "Objective of the last 3Sigma decision over its LP relaxation's bound",
            m.threesigma_solution_over_bound.clone(),
        );
        r.register(
            "coordinator_threesigma_slo_met",
            "Finished 3Sigma SLO jobs that met their deadline",
            m.threesigma_slo_met.clone(),
        );
        r.register(
            "coordinator_threesigma_slo_missed",
            "Finished 3Sigma SLO jobs that missed their deadline",
            m.threesigma_slo_missed.clone(),
        );
        m
    }
}

/// One label, `resource` = `cpu_millis` or `memory_mib`.
pub type ResourceLabel = Vec<(&'static str, &'static str)>;

/// Set a per-resource gauge family from `r`.
pub fn set_by_resource(family: &Family<ResourceLabel, Gauge>, r: scheduler_core::Resources) {
    family
        .get_or_create(&vec![("resource", "cpu_millis")])
        .set(r.cpu_millis as i64);
    family
        .get_or_create(&vec![("resource", "memory_mib")])
        .set(r.memory_mib as i64);
}

fn labels(node: &NodeId, resource: &'static str) -> NodeLabels {
    vec![
        ("node", node.to_string()),
        ("resource", resource.to_string()),
    ]
}

fn set_resources(family: &Family<NodeLabels, Gauge>, node: &NodeId, r: Resources) {
    family
        .get_or_create(&labels(node, "cpu_millis"))
        .set(r.cpu_millis as i64);
    family
        .get_or_create(&labels(node, "memory_mib"))
        .set(r.memory_mib as i64);
}

/// One node's per-heartbeat series, looked up once per session: a heartbeat then sets three
/// atomics instead of allocating a label vector and hashing it into three families (issue 17:
/// per-heartbeat cost at 10,000 nodes). Handles share the series' storage with the registry.
#[derive(Clone, Debug)]
pub struct NodeGauges {
    queue_delay_ms: FloatGauge,
    queued: Gauge,
    running: Gauge,
}

impl CoordinatorMetrics {
    /// The series a node's heartbeats set (at its join; [`CoordinatorMetrics::forget_node`]
    /// takes them out of the registry when the node is lost).
    pub fn node_gauges(&self, node: &NodeId) -> NodeGauges {
        let l = vec![("node", node.to_string())];
        NodeGauges {
            queue_delay_ms: self.node_queue_delay_ms.get_or_create(&l).clone(),
            queued: self.node_queued.get_or_create(&l).clone(),
            running: self.node_running.get_or_create(&l).clone(),
        }
    }

    /// What a node's heartbeat reported.
    pub fn node_heartbeat(
        &self,
        node: Option<&NodeGauges>,
        queue_delay_ms: f64,
        queued: u32,
        running: u32,
    ) {
        self.heartbeats.inc();
        if let Some(node) = node {
            node.queue_delay_ms.set(queue_delay_ms);
            node.queued.set(i64::from(queued));
            node.running.set(i64::from(running));
        }
    }

    /// A node's GUARANTEED bookings changed (or it joined).
    pub fn node_bookings(&self, node: &NodeId, capacity: Resources, booked: Resources) {
        set_resources(&self.node_capacity, node, capacity);
        set_resources(&self.guaranteed_booked, node, booked);
        set_resources(&self.policing_limit, node, capacity.saturating_sub(&booked));
    }

    /// A node left the cluster: its per-node series go.
    pub fn forget_node(&self, node: &NodeId) {
        let l = vec![("node", node.to_string())];
        self.node_queue_delay_ms.remove(&l);
        self.node_queued.remove(&l);
        self.node_running.remove(&l);
        for resource in ["cpu_millis", "memory_mib"] {
            let l = labels(node, resource);
            self.node_capacity.remove(&l);
            self.guaranteed_booked.remove(&l);
            self.policing_limit.remove(&l);
        }
    }

    /// The text exposition (OpenMetrics, which Prometheus scrapes).
    /// Publish the agenda for `GET /reservations`.
    pub fn set_agenda(&self, view: &AgendaView) {
        match serde_json::to_string(view) {
            Ok(json) => *self.agenda.lock().unwrap_or_else(|e| e.into_inner()) = json,
            Err(e) => warn!("cannot encode the agenda: {e}"),
        }
    }

    /// The latest published agenda, JSON.
    pub fn agenda(&self) -> String {
        self.agenda
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Metrics connections served at once; more are closed at accept.
pub const MAX_METRICS_CONNECTIONS: usize = 16;
/// Longest a metrics connection is kept (a scrape takes milliseconds).
pub const METRICS_CONNECTION_TIME: std::time::Duration = std::time::Duration::from_secs(30);

/// Bind the metrics listener (before anything else starts, so a bad address fails start-up).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serve `GET /metrics` on `listener` until the runtime stops. Must run inside a tokio runtime
/// (the actix system's).
pub fn spawn_server(
    listener: tokio::net::TcpListener,
    metrics: Arc<CoordinatorMetrics>,
    dashboard: Arc<Dashboard>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "metrics and dashboard listening (GET /metrics, GET /)");
    }
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_METRICS_CONNECTIONS));
    actix_rt::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: do not spin.
                    warn!("metrics accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Bounded: a scraper holding connections open (or many of them) gets no more than
            // MAX_METRICS_CONNECTIONS at once, each for at most METRICS_CONNECTION_TIME.
            let Ok(permit) = open.clone().try_acquire_owned() else {
                debug!(%peer, "metrics connection refused: {MAX_METRICS_CONNECTIONS} already open");
                continue;
            };
            let metrics = metrics.clone();
            let dashboard = dashboard.clone();
            actix_rt::spawn(async move {
                let _permit = permit;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let answer = if req.uri().path() == "/reservations" {
                        respond_agenda(&req, || metrics.agenda())
                    } else {
                        respond(&req, || metrics.encode(), &dashboard)
                    };
                    async move { Ok::<_, Infallible>(answer) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                match tokio::time::timeout(METRICS_CONNECTION_TIME, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => debug!(%peer, "metrics connection ended: {e}"),
                    Err(_) => {
                        debug!(%peer, "metrics connection closed after {METRICS_CONNECTION_TIME:?}")
                    }
                }
            });
        }
    });
}

/// `GET /reservations` gets the operator's agenda (JSON); another method a 405.
pub fn respond_agenda<B>(
    req: &Request<B>,
    agenda: impl FnOnce() -> String,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if req.method() == Method::GET {
        (StatusCode::OK, "application/json", agenda())
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET\n".to_string(),
        )
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// `GET /metrics` gets the exposition, `GET /` the dashboard page (its assets beside it) and
/// `GET /api/state` its JSON; anything else a 404, other methods a 405.
pub fn respond<B>(
    req: &Request<B>,
    encode: impl FnOnce() -> String,
    dashboard: &Dashboard,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: Bytes| {
        let mut r = Response::new(Full::new(body));
        *r.status_mut() = status;
        let headers = r.headers_mut();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        // The page loads nothing from elsewhere and is never framed.
        headers.insert(
            hyper::header::CONTENT_SECURITY_POLICY,
            hyper::header::HeaderValue::from_static(
                "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
            ),
        );
        headers.insert(
            hyper::header::X_CONTENT_TYPE_OPTIONS,
            hyper::header::HeaderValue::from_static("nosniff"),
        );
        r
    };
    let text = "text/plain; charset=utf-8";
    let path = req.uri().path();
    let known = matches!(
        path,
        "/metrics" | "/" | "/index.html" | "/app.js" | "/style.css" | "/api/state"
    );
    if known && req.method() != Method::GET {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            Bytes::from_static(b"only GET\n"),
        );
    }
    let stat = |s: &'static str| Bytes::from_static(s.as_bytes());
    match path {
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Bytes::from(encode()),
        ),
        "/" | "/index.html" => reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            stat(dashboard::INDEX_HTML),
        ),
        "/app.js" => reply(
            StatusCode::OK,
            "text/javascript; charset=utf-8",
            stat(dashboard::APP_JS),
        ),
        "/style.css" => reply(
            StatusCode::OK,
            "text/css; charset=utf-8",
            stat(dashboard::STYLE_CSS),
        ),
        "/api/state" => reply(
            StatusCode::OK,
            "application/json",
            Bytes::from(dashboard.state_json()),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            text,
            Bytes::from_static(b"not found; the dashboard is at /, metrics at /metrics\n"),
        ),
    }
}

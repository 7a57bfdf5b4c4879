//! Prometheus metrics of the worker: the registry, the handles the actors update (atomics only,
//! never awaited), and the `/metrics` HTTP task (hyper 1, on the actix/tokio runtime). The HTTP
//! task only encodes the registry: it never sends to or waits on an actor.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::token::TokenError;
use scheduler_core::{ContainerType, KillReason};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Labels of a series: (name, value) pairs.
pub type Labels = Vec<(&'static str, &'static str)>;
type FloatGauge = Gauge<f64, AtomicU64>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Everything the worker exports.
pub struct WorkerMetrics {
    registry: Registry,
    /// Containers on the node by `type` (guaranteed, queueable) and `state` (running, queued,
    /// waiting).
    pub containers: Family<Labels, Gauge>,
    pub queue_length: Gauge,
    pub queue_delay_ms: FloatGauge,
    pub sheds: Counter,
    pub preemptions: Counter,
    pub kills: Family<Labels, Counter>,
    pub token_refusals: Family<Labels, Counter>,
    /// Allocations refused for the app's quota, by `type`.
    pub quota_refusals: Family<Labels, Counter>,
    /// Containers allocated to applications through this worker, by `type`.
    pub allocations: Family<Labels, Counter>,
    /// From an `allocate` to its (first) answer with containers, by `type`.
    pub allocation_latency: HistogramFamily,
    /// What the count bounds of the queues between the cluster link and the actors did, by
    /// `event` ([`LINK_QUEUE_EVENTS`]; docs/design.md, "The worker's two threads").
    pub link_queue_events: Family<Labels, Counter>,
}

/// Every value of the `event` label of `worker_link_queue_events_total`:
/// - `hints_coalesced`: a heartbeat answer's hints replaced hints the node thread had not taken
///   yet (only the newest matter; GUARANTEED keys are carried over);
/// - `node_backpressure`: the link stopped reading the coordinator's stream because the node
///   thread had the bound of coordinator commands (stops, resizes, promotions) not yet handled;
/// - `heartbeat_coalesced`: a heartbeat replaced one the link had not written yet (its started
///   and finished reports go with the newer one);
/// - `request_refused`: an app request was answered `coordinator_unavailable` because the
///   outbox held its request bound;
/// - `outbox_overflow`: the outbox reached its bound, so the session was dropped and the worker
///   re-joins (the coordinator re-learns the node from the join's report).
pub const LINK_QUEUE_EVENTS: [&str; 5] = [
    "hints_coalesced",
    "node_backpressure",
    "heartbeat_coalesced",
    "request_refused",
    "outbox_overflow",
];

fn latency_histogram() -> Histogram {
    // 100 µs .. ~52 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        let containers = Family::<Labels, Gauge>::default();
        let queue_length = Gauge::default();
        let queue_delay_ms = FloatGauge::default();
        let sheds = Counter::default();
        let preemptions = Counter::default();
        let kills = Family::<Labels, Counter>::default();
        let token_refusals = Family::<Labels, Counter>::default();
        let quota_refusals = Family::<Labels, Counter>::default();
        let allocations = Family::<Labels, Counter>::default();
        let allocation_latency: HistogramFamily =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let link_queue_events = Family::<Labels, Counter>::default();
        let mut r = Registry::default();
        r.register(
            "worker_containers",
            "Containers on this node by type (guaranteed, queueable) and state (running, queued, waiting)",
            containers.clone(),
        );
        r.register(
            "worker_queue_length",
            "QUEUEABLE containers queued on this node",
            queue_length.clone(),
        );
        r.register(
            "worker_queue_delay_ms",
            "This node's queue delay estimate R = Tq + Tr + Tl (Mercury 4.2), milliseconds",
            queue_delay_ms.clone(),
        );
        r.register(
            "worker_sheds",
            "Queued QUEUEABLE containers discarded by load shedding",
            sheds.clone(),
        );
        r.register(
            "worker_preemptions",
            "QUEUEABLE containers killed to make room for GUARANTEED ones",
            preemptions.clone(),
        );
        r.register(
            "worker_kills",
            "Containers killed on this node, by reason",
            kills.clone(),
        );
        r.register(
            "worker_token_refusals",
            "start_container requests refused for their token, by reason",
            token_refusals.clone(),
        );
        r.register(
            "worker_quota_refusals",
            "Allocations refused for the app's quota (QUEUEABLE quota, or too many GUARANTEED asks waiting), by type",
            quota_refusals.clone(),
        );
        r.register(
            "worker_allocations",
            "Containers allocated to applications through this worker, by type",
            allocations.clone(),
        );
        r.register(
            "worker_allocation_latency_seconds",
            "Time from an allocate request (decoded by its connection) to its first answer with containers, by type",
            allocation_latency.clone(),
        );
        r.register(
            "worker_link_queue_events",
            "What the count bounds of the queues between the cluster link and the node and scheduler did, by event",
            link_queue_events.clone(),
        );
        // Every label value exists from the start, at 0, so rate() and absence alerts work.
        for event in LINK_QUEUE_EVENTS {
            let _ = link_queue_events.get_or_create(&vec![("event", event)]);
        }
        for t in ["guaranteed", "queueable"] {
            let _ = allocations.get_or_create(&vec![("type", t)]);
            let _ = allocation_latency.get_or_create(&vec![("type", t)]);
            let _ = quota_refusals.get_or_create(&vec![("type", t)]);
        }
        for reason in [
            KillReason::PreemptedByGuaranteed,
            KillReason::Shed,
            KillReason::Released,
            KillReason::Failed,
            KillReason::Lost,
        ] {
            let _ = kills.get_or_create(&vec![("reason", kill_label(reason))]);
        }
        for reason in TOKEN_REASONS {
            let _ = token_refusals.get_or_create(&vec![("reason", reason)]);
        }
        WorkerMetrics {
            registry: r,
            containers,
            queue_length,
            queue_delay_ms,
            sheds,
            preemptions,
            kills,
            token_refusals,
            quota_refusals,
            allocations,
            allocation_latency,
            link_queue_events,
        }
    }
}

/// The `type` label of a container type.
pub fn type_label(t: ContainerType) -> &'static str {
    match t {
        ContainerType::Guaranteed => "guaranteed",
        ContainerType::Queueable => "queueable",
    }
}

/// The `reason` label of a kill (as [`KillReason`] displays).
pub fn kill_label(r: KillReason) -> &'static str {
    match r {
        KillReason::PreemptedByGuaranteed => "preempted_by_guaranteed",
        KillReason::Shed => "shed",
        KillReason::Released => "released",
        KillReason::Failed => "failed",
        KillReason::Lost => "lost",
        KillReason::ShapedPreemption => "shaped_preemption",
    }
}

/// Every value of the token refusal `reason` label.
const TOKEN_REASONS: [&str; 11] = [
    "forged",
    "unknown_key",
    "expired",
    "wrong_node",
    "replayed",
    "wrong_app",
    "stale_grant",
    "revoked",
    "no_key_for_node",
    "bad_key_material",
    "encoding",
];

/// The `reason` label of a token refusal.
pub fn token_label(e: &TokenError) -> &'static str {
    match e {
        TokenError::Forged => "forged",
        TokenError::UnknownKey(_) => "unknown_key",
        TokenError::Expired { .. } => "expired",
        TokenError::WrongNode { .. } => "wrong_node",
        TokenError::Replayed { .. } => "replayed",
        TokenError::WrongApp { .. } => "wrong_app",
        TokenError::StaleGrant { .. } => "stale_grant",
        TokenError::Revoked(_) => "revoked",
        TokenError::NoKeyForNode(_) => "no_key_for_node",
        TokenError::BadKeyMaterial(_) => "bad_key_material",
        TokenError::Encoding(_) => "encoding",
    }
}

impl WorkerMetrics {
    /// A link queue's bound acted (`event` is one of [`LINK_QUEUE_EVENTS`]).
    pub fn link_queue_event(&self, event: &'static str) {
        self.link_queue_events
            .get_or_create(&vec![("event", event)])
            .inc();
    }

    /// How often `event` happened (tests, diagnostics).
    pub fn link_queue_event_count(&self, event: &'static str) -> u64 {
        self.link_queue_events
            .get_or_create(&vec![("event", event)])
            .get()
    }

    /// A container was killed.
    pub fn killed(&self, reason: KillReason) {
        self.kills
            .get_or_create(&vec![("reason", kill_label(reason))])
            .inc();
        match reason {
            KillReason::Shed => {
                self.sheds.inc();
            }
            KillReason::PreemptedByGuaranteed => {
                self.preemptions.inc();
            }
            _ => {}
        }
    }

    pub fn token_refused(&self, e: &TokenError) {
        self.token_refusals
            .get_or_create(&vec![("reason", token_label(e))])
            .inc();
    }

    /// An allocation refused for the app's quota.
    pub fn quota_refused(&self, t: ContainerType) {
        self.quota_refusals
            .get_or_create(&vec![("type", type_label(t))])
            .inc();
    }

    /// `count` containers allocated, the first of an ask `latency` after it.
    pub fn allocated(&self, t: ContainerType, count: usize, latency: Option<Duration>) {
        let l = vec![("type", type_label(t))];
        self.allocations.get_or_create(&l).inc_by(count as u64);
        if let Some(latency) = latency {
            self.allocation_latency
                .get_or_create(&l)
                .observe(latency.as_secs_f64());
        }
    }

    /// Refresh the node gauges from a heartbeat's container list (already built for the
    /// coordinator, so this costs no extra pass over the node).
    pub fn node_state(&self, containers: &[ContainerStatus], queued: usize, queue_delay_ms: f64) {
        let mut counts = [[0i64; 3]; 2];
        for s in containers {
            let t = match s.container_type {
                ContainerType::Guaranteed => 0,
                ContainerType::Queueable => 1,
            };
            let p = match s.placement {
                Placement::Running => 0,
                Placement::Queued => 1,
                Placement::WaitingGuaranteed => 2,
            };
            counts[t][p] += 1;
        }
        for (t, ty) in ["guaranteed", "queueable"].into_iter().enumerate() {
            for (p, state) in ["running", "queued", "waiting"].into_iter().enumerate() {
                self.containers
                    .get_or_create(&vec![("type", ty), ("state", state)])
                    .set(counts[t][p]);
            }
        }
        self.queue_length.set(queued as i64);
        self.queue_delay_ms.set(queue_delay_ms);
    }

    /// The text exposition (OpenMetrics, which Prometheus scrapes).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Metrics connections served at once; more are closed at accept.
pub const MAX_METRICS_CONNECTIONS: usize = 16;
/// Longest a metrics connection is kept (a scrape takes milliseconds).
pub const METRICS_CONNECTION_TIME: Duration = Duration::from_secs(30);

/// Bind the metrics listener (at start, so a taken port fails start-up).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serve `GET /metrics` on `listener` until the runtime stops.
pub fn spawn_server(listener: tokio::net::TcpListener, metrics: Arc<WorkerMetrics>) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "metrics listening (GET /metrics)");
    }
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_METRICS_CONNECTIONS));
    actix_rt::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: do not spin.
                    warn!("metrics accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
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
            actix_rt::spawn(async move {
                let _permit = permit;
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let answer = respond(&req, || metrics.encode());
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

/// `GET /metrics` gets the exposition; anything else a 404 or 405.
fn respond<B>(req: &Request<B>, encode: impl FnOnce() -> String) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        r
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            encode(),
        ),
        (_, "/metrics") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found; metrics are at /metrics\n".into(),
        ),
    }
}

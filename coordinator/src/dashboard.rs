//! The operator's web dashboard (issue 18): `GET /` on the coordinator's HTTP port serves a page
//! built into the binary (no CDN, nothing fetched at run time) that polls `GET /api/state`, a
//! JSON snapshot of the cluster (coordinator actor) and of the guarantor (bookings, waiting
//! GUARANTEED asks with why they wait, reservations and the plan's free capacity).
//!
//! The HTTP task never sends to or waits on an actor: each actor publishes its part into a
//! [`Dashboard`] at its tick, and only while someone is watching (a request since the last
//! publication), so a coordinator of 10,000 nodes pays nothing for a dashboard nobody opens.
//! Rows are capped per node and per list, so one response stays small on a large cluster.

use scheduler_core::coordinator::CoordinatorState;
use scheduler_core::guarantor::{Guarantor, WaitingAsk};
use scheduler_core::hosted::HostedContainers;
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::protocol::cluster::AppRecord;
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::reservation::AllocationInterval;
use scheduler_core::reservation::book::ReservationInfo;
use scheduler_core::threesigma::{CycleRecord, JobExplanation, SloAttainment};
use scheduler_core::{ContainerType, Resources, Time};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Containers listed per node (the node's counts are always complete).
pub const CONTAINERS_PER_NODE: usize = 64;
/// Waiting GUARANTEED asks listed.
pub const WAITING_LISTED: usize = 100;
/// Reservations listed (with their allocations) in one snapshot.
pub const RESERVATIONS_LISTED: usize = 200;

/// One container as the dashboard lists it.
#[derive(Clone, Debug, Serialize)]
pub struct ContainerRow {
    pub id: String,
    pub app_id: String,
    /// `guaranteed` or `queueable`.
    pub container_type: ContainerType,
    /// `running`, `queued` or `waiting_guaranteed`.
    pub state: Placement,
    pub resources: Resources,
}

/// One joined node, as of its last heartbeat.
#[derive(Clone, Debug, Serialize)]
pub struct NodeRow {
    pub node_id: String,
    pub rack: String,
    pub app_endpoint: String,
    pub capacity: Resources,
    /// Tq, Tr, Tl (Mercury §4.2) and their sum R, ms.
    pub queue_delay: QueueDelay,
    pub queue_delay_ms: f64,
    /// Since its last heartbeat, ms.
    pub silent_ms: u64,
    /// An operator is draining it (no new work).
    pub draining: bool,
    /// Draining and nothing left on it (running or queued): its worker can be stopped. Derived
    /// here once so the dashboard and `coordinator nodes` say the same.
    pub drained: bool,
    pub running_guaranteed: u32,
    pub running_queueable: u32,
    pub queued: u32,
    /// Resources held by its running containers, by type.
    pub guaranteed_running: Resources,
    pub queueable_running: Resources,
    /// At most [`CONTAINERS_PER_NODE`]: running first, then the queue in its order.
    pub containers: Vec<ContainerRow>,
    pub containers_total: usize,
}

/// One registered app and what it holds across the cluster.
#[derive(Clone, Debug, Serialize)]
pub struct AppRow {
    pub app_id: String,
    pub quota: QueueableQuota,
    pub running_guaranteed: u32,
    pub running_queueable: u32,
    pub queued: u32,
}

/// What the coordinator actor knows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClusterSnapshot {
    pub taken_at_ms: u64,
    /// Mercury §4.3; `None` when shedding is off.
    pub shedding_threshold_ms: Option<f64>,
    pub top_k: usize,
    pub nodes: Vec<NodeRow>,
    pub lost_nodes: Vec<String>,
    pub apps: Vec<AppRow>,
}

/// One node's GUARANTEED books.
#[derive(Clone, Debug, Serialize)]
pub struct BookingRow {
    pub node_id: String,
    pub capacity: Resources,
    pub guaranteed_booked: Resources,
    /// What the node may give QUEUEABLE work (Mercury §4.3 policing).
    pub queueable_limit: Resources,
}

/// What the guarantor knows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GuarantorSnapshot {
    pub taken_at_ms: u64,
    pub placer: String,
    pub bookings: Vec<BookingRow>,
    pub pending_asks: usize,
    pub pending_containers: u64,
    /// The first [`WAITING_LISTED`] pending asks with why each waits.
    pub waiting: Vec<WaitingAsk>,
    /// The agenda (Morpheus §6): its length, step and where now falls in it, ms.
    pub agenda_horizon_ms: u64,
    pub agenda_step_ms: u64,
    pub agenda_now_ms: u64,
    pub plan_capacity: Resources,
    /// The plan's free capacity over the agenda, maximal runs.
    pub plan_free: Vec<AllocationInterval>,
    /// At most [`RESERVATIONS_LISTED`], in id order.
    pub reservations: Vec<ReservationInfo>,
    pub reservations_total: usize,
    /// 3σSched (layer 2), when enabled.
    pub threesigma: Option<ThreeSigmaView>,
}

/// The 3Sigma queue as the dashboard shows it (issue 18).
#[derive(Clone, Debug, Serialize)]
pub struct ThreeSigmaView {
    pub cycle_ms: u64,
    pub pending_jobs: usize,
    /// The last cycle: method, MILP size, LP bound and objective.
    pub last_cycle: Option<CycleRecord>,
    /// SLO jobs finished since the coordinator started: met / missed, in all and per app.
    pub attainment: SloAttainment,
    /// The first [`WAITING_LISTED`] waiting jobs with their `explain` data.
    pub waiting_jobs: Vec<JobExplanation>,
}

/// The snapshots the HTTP task serves; actors publish, requests read. Locks are held only to
/// swap or clone an `Arc`, never across an `.await`.
#[derive(Debug, Default)]
pub struct Dashboard {
    cluster: Mutex<Arc<ClusterSnapshot>>,
    guarantor: Mutex<Arc<GuarantorSnapshot>>,
    /// A request came since the actors last published.
    watched: AtomicBool,
}

#[derive(Serialize)]
struct State<'a> {
    cluster: &'a ClusterSnapshot,
    guarantor: &'a GuarantorSnapshot,
}

impl Dashboard {
    /// True once per tick while someone is watching: the coordinator then publishes its
    /// snapshot and asks the guarantor for its own.
    pub fn take_watched(&self) -> bool {
        self.watched.swap(false, Ordering::Relaxed)
    }

    pub fn publish_cluster(&self, snapshot: ClusterSnapshot) {
        *self.cluster.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
    }

    pub fn publish_guarantor(&self, snapshot: GuarantorSnapshot) {
        *self.guarantor.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
    }

    /// `GET /api/state`: the latest snapshots (as of the actors' last tick) as one JSON object.
    pub fn state_json(&self) -> String {
        self.watched.store(true, Ordering::Relaxed);
        let cluster = self
            .cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let guarantor = self
            .guarantor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        serde_json::to_string(&State {
            cluster: &cluster,
            guarantor: &guarantor,
        })
        .unwrap_or_else(|e| format!("{{\"error\":\"encoding the state: {e}\"}}"))
    }
}

fn row(c: &ContainerStatus) -> ContainerRow {
    ContainerRow {
        id: c.id.to_string(),
        app_id: c.app_id.to_string(),
        container_type: c.container_type,
        state: c.placement,
        resources: c.resources,
    }
}

/// The coordinator's part, from its aggregate state, the containers nodes reported and the apps.
pub fn cluster_snapshot(
    now: Time,
    state: &CoordinatorState,
    shedding_threshold_ms: Option<f64>,
    hosted: &HostedContainers,
    apps: &[AppRecord],
) -> ClusterSnapshot {
    let mut per_app: BTreeMap<&str, (u32, u32, u32)> = BTreeMap::new();
    let nodes = state
        .node_loads()
        .map(|(dir, load, last_seen)| {
            let containers = hosted.on_node(&dir.node_id);
            let mut node = NodeRow {
                node_id: dir.node_id.to_string(),
                rack: dir.rack.clone(),
                app_endpoint: dir.app_endpoint.clone(),
                capacity: dir.capacity,
                queue_delay: load,
                queue_delay_ms: load.total_ms(),
                silent_ms: now.as_millis().saturating_sub(last_seen.as_millis()),
                draining: state.is_draining(&dir.node_id),
                drained: state.is_draining(&dir.node_id) && containers.is_empty(),
                running_guaranteed: 0,
                running_queueable: 0,
                queued: 0,
                guaranteed_running: Resources::default(),
                queueable_running: Resources::default(),
                containers: Vec::new(),
                containers_total: containers.len(),
            };
            for c in containers {
                let counts = per_app.entry(c.app_id.as_str()).or_default();
                match (c.placement, c.container_type) {
                    (Placement::Running, ContainerType::Guaranteed) => {
                        node.running_guaranteed += 1;
                        node.guaranteed_running =
                            node.guaranteed_running.saturating_add(&c.resources);
                        counts.0 += 1;
                    }
                    (Placement::Running, ContainerType::Queueable) => {
                        node.running_queueable += 1;
                        node.queueable_running =
                            node.queueable_running.saturating_add(&c.resources);
                        counts.1 += 1;
                    }
                    _ => {
                        node.queued += 1;
                        counts.2 += 1;
                    }
                }
            }
            // Running first, then the queue in the node's order.
            node.containers = containers
                .iter()
                .filter(|c| c.placement == Placement::Running)
                .chain(
                    containers
                        .iter()
                        .filter(|c| c.placement != Placement::Running),
                )
                .take(CONTAINERS_PER_NODE)
                .map(row)
                .collect();
            node
        })
        .collect();
    let apps = apps
        .iter()
        .map(|a| {
            let (g, q, w) = per_app.get(a.app_id.as_str()).copied().unwrap_or_default();
            AppRow {
                app_id: a.app_id.clone(),
                quota: a.quota,
                running_guaranteed: g,
                running_queueable: q,
                queued: w,
            }
        })
        .collect();
    ClusterSnapshot {
        taken_at_ms: now.as_millis(),
        shedding_threshold_ms,
        top_k: state.config().top_k,
        nodes,
        lost_nodes: state.lost_nodes().iter().map(|n| n.to_string()).collect(),
        apps,
    }
}

/// The guarantor's part.
pub fn guarantor_snapshot(now_ms: u64, core: &Guarantor) -> GuarantorSnapshot {
    let book = core.reservations();
    let plan = book.plan().config();
    let all = core.list_reservations(now_ms, None);
    let reservations_total = all.len();
    GuarantorSnapshot {
        taken_at_ms: now_ms,
        placer: core.placer_name().to_string(),
        bookings: core
            .nodes()
            .map(|n| BookingRow {
                node_id: n.node_id.to_string(),
                capacity: n.capacity,
                guaranteed_booked: n.guaranteed,
                queueable_limit: core.queueable_limit(&n.node_id).unwrap_or_default(),
            })
            .collect(),
        pending_asks: core.pending_asks(),
        pending_containers: core.pending_containers(),
        waiting: core.waiting_asks(now_ms, WAITING_LISTED),
        agenda_horizon_ms: plan.horizon_ms,
        agenda_step_ms: plan.step_ms,
        agenda_now_ms: book.agenda_ms(now_ms),
        plan_capacity: book.plan_capacity(),
        plan_free: book.free_capacity(),
        reservations: all.into_iter().take(RESERVATIONS_LISTED).collect(),
        reservations_total,
        threesigma: threesigma_view(core),
    }
}

/// The 3Sigma part of the guarantor's snapshot (`None` when 3Sigma is off).
pub fn threesigma_view(core: &Guarantor) -> Option<ThreeSigmaView> {
    let live = core.threesigma()?;
    Some(ThreeSigmaView {
        cycle_ms: live.config().cycle_ms,
        pending_jobs: core.threesigma_pending(),
        last_cycle: core.last_threesigma_record().cloned(),
        attainment: core.slo_attainment().cloned().unwrap_or_default(),
        waiting_jobs: core.explain_jobs(None, WAITING_LISTED),
    })
}

/// The page and its assets, built into the binary.
pub const INDEX_HTML: &str = include_str!("dashboard/index.html");
pub const APP_JS: &str = include_str!("dashboard/app.js");
pub const STYLE_CSS: &str = include_str!("dashboard/style.css");

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::guarantor::{BestFit, GuaranteedAsk, GuarantorConfig};
    use scheduler_core::threesigma::{
        JobDescription, LiveThreeSigma, LiveThreeSigmaConfig, RuntimeBelief, Utility,
    };
    use scheduler_core::{AppId, JobId, NodeId};

    fn ask(key: u64, job: &str) -> GuaranteedAsk {
        GuaranteedAsk {
            ask_key: key,
            app_id: AppId::from("etl-team"),
            resources: Resources::new(1000, 1024),
            count: 1,
            priority: 0,
            locality: None,
            runtime_estimate_ms: None,
            job_id: JobId::from(job),
            job_submit_time_ms: 0,
            role: Default::default(),
            allow_shaping: false,
        }
    }

    /// The `/api/state` guarantor part carries SLO attainment and, per waiting 3Sigma job, its
    /// distribution, options and reason.
    #[test]
    fn threesigma_json_has_attainment_and_explanations() {
        let now_ms = 1_000_000;
        let mut g = Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0)
            .with_threesigma(LiveThreeSigma::new(LiveThreeSigmaConfig::default()).unwrap());
        g.add_node(NodeId::from("n1"), "r".into(), Resources::new(1000, 1024));
        let slo = |deadline_s: f64| JobDescription {
            utility: Utility::Slo {
                deadline: deadline_s,
                value: 1.0,
            },
            features: vec![],
            gang: 1,
            container: Resources::new(1000, 1024),
            required: vec![],
            preferred: vec![],
            non_preferred_slowdown: 1.5,
        };
        let belief = RuntimeBelief::from_runtimes(vec![4.0, 6.0]).unwrap();
        g.submit_job(
            ask(1, "first"),
            slo(1_010.0),
            belief.clone(),
            "prior".into(),
            now_ms,
        )
        .unwrap();
        g.submit_job(
            ask(2, "second"),
            slo(1_030.0),
            belief,
            "prior".into(),
            now_ms,
        )
        .unwrap();
        let (placed, _) = g.run_threesigma_cycle(now_ms).unwrap();
        assert_eq!(placed.len(), 1);
        let id = placed[0].token_body.container_id;
        g.on_started(id);
        g.observe_time(now_ms + 5_000);
        g.on_finished(id);
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&guarantor_snapshot(now_ms, &g)).unwrap())
                .unwrap();
        let t = &json["threesigma"];
        assert_eq!(t["attainment"]["slo_met"], 1, "{t}");
        assert_eq!(t["attainment"]["attainment"], 1.0);
        assert_eq!(t["attainment"]["per_app"]["etl-team"]["slo_met"], 1);
        assert_eq!(t["pending_jobs"], 1);
        let waiting = &t["waiting_jobs"][0];
        assert_eq!(waiting["job_id"], "second");
        assert_eq!(waiting["belief"]["p90_s"], 6.0);
        assert!(
            waiting["options"].as_array().is_some_and(|o| !o.is_empty()),
            "{waiting}"
        );
        assert!(waiting["reason"].as_str().is_some_and(|r| !r.is_empty()));
        assert!(t["last_cycle"]["columns"].as_u64().is_some_and(|c| c > 0));
    }
}

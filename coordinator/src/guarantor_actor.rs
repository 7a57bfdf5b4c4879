//! The guarantor actor: owns [`scheduler_core::guarantor::Guarantor`] (central GUARANTEED
//! placement, Mercury §4.2) with the [`QueueableAware`] placer (fed each node's QUEUEABLE load
//! from its heartbeats, so GUARANTEED containers avoid preempting it), signs its grants with the cluster key
//! ring, sends them to the requesting worker's session, and tells the coordinator actor each
//! node's policing limit (§4.3) whenever GUARANTEED bookings change.

use crate::clock::Clock;
use crate::config::ShapingSettings;
use crate::coordinator_actor::{
    CoordinatorActor, PromotionBooked, QueueableLimits, ResizeOnNode, StopGrantOnNode,
};
use crate::session::{SessionId, WorkerTx};
use crate::store::Store;
use actix::prelude::*;
use scheduler_core::guarantor::verified_booking;
use scheduler_core::guarantor::{
    GuaranteedAsk, GuaranteedPlacement, Guarantor, GuarantorConfig, GuarantorError, QueueableAware,
    QueueableLoad,
};
use scheduler_core::node::ContainerStatus;
use scheduler_core::protocol::app::{
    ErrorCode, GrantedContainer, ReservationCancelled, ReservationReprovisioned, ReservationSummary,
};
use scheduler_core::protocol::cluster::{
    CoordinatorToWorker, ExplainCall, ExplainDone, GuaranteedAllocated, Released, RequestFailed,
    ReservationCall, ReservationDone, ReservationNotice, ReservationNoticeKind, ReservationOp,
    ReservationReply,
};
use scheduler_core::protocol::limits::MAX_RESERVATIONS_PER_APP;
use scheduler_core::reservation::Rejection;
use scheduler_core::reservation::book::{ReprovisionCause, ReservationBook, ReservationEvent};
use scheduler_core::shaping::{ShapingOutcome, ShapingState};
use scheduler_core::token::{GuaranteedSigner, KeyRing};
use scheduler_core::{AppId, ContainerId, ContainerType, NodeId, Resources};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tracing::{debug, error, info, warn};

#[path = "guarantor_threesigma.rs"]
pub mod threesigma;

/// Container sequence numbers reserved per store write: a restart skips at most this many ids,
/// and a grant never waits for a disk write.
pub const SEQ_RESERVATION_BLOCK: u64 = 4096;

/// Where the grants of an ask go.
struct AskRoute {
    session_id: SessionId,
    tx: WorkerTx,
    correlation_id: u64,
    /// When the session decoded the ask; taken at its first grant.
    received: Option<std::time::Instant>,
}

pub struct GuarantorActor {
    core: Guarantor,
    /// Signs GUARANTEED grants (Ed25519; no worker holds the key).
    signer: GuaranteedSigner,
    store: Arc<Store>,
    clock: Clock,
    coordinator: Addr<CoordinatorActor>,
    /// The store lets the guarantor mint sequence numbers up to this one.
    reserved_seq: u64,
    endpoints: HashMap<NodeId, String>,
    routes: HashMap<u64, AskRoute>,
    next_ask_key: u64,
    /// Where each reservation owner's events go: the worker session it last used for a
    /// reservation request or a reservation-backed ask.
    owner_routes: HashMap<AppId, (SessionId, WorkerTx)>,
    /// Bookings, capacity and policing limit per node are exported here (`/metrics`).
    pub(crate) metrics: Arc<crate::metrics::CoordinatorMetrics>,
    /// Where the dashboard's guarantor snapshot is published (with an HTTP port only).
    pub(crate) dashboard: Option<Arc<crate::dashboard::Dashboard>>,
    /// The plan step of the last agenda published for `GET /reservations`, and whether capacity
    /// changed since (a join): the periodic tick republishes then, at most once per tick.
    agenda_published_step: Option<u64>,
    agenda_stale: bool,
    /// 3σPredict and the unsaved job history, when 3Sigma is on.
    threesigma: Option<threesigma::ActorThreeSigma>,
}

impl GuarantorActor {
    /// Resumes minting after the reserved sequence in the store.
    pub fn new(
        store: Arc<Store>,
        signer: GuaranteedSigner,
        token_ttl_ms: u64,
        clock: Clock,
        coordinator: Addr<CoordinatorActor>,
        plan: &PlanSettings,
    ) -> Result<GuarantorActor, crate::store::StoreError> {
        let reserved_seq = store.guarantor_reserved_seq()?;
        let mut core = Guarantor::new(
            GuarantorConfig { token_ttl_ms },
            Box::new(QueueableAware::default()),
            reserved_seq,
        );
        // Reservations survive a restart (Morpheus §6: the plan is the cluster's promise); the
        // plan keeps its stored capacity while the nodes re-join.
        if let Some(mut book) = store.reservations()? {
            info!(
                reservations = book.ids().count(),
                "reservations restored from the store"
            );
            let stored = book.plan().config().clone();
            if (stored.step_ms, stored.horizon_ms) != (plan.plan.step_ms, plan.plan.horizon_ms) {
                warn!(
                    stored_step_ms = stored.step_ms,
                    stored_horizon_ms = stored.horizon_ms,
                    configured_step_ms = plan.plan.step_ms,
                    configured_horizon_ms = plan.plan.horizon_ms,
                    "the stored plan keeps its step and agenda (its reservations were placed on them); delete its reservations to change them"
                );
            }
            book.set_settings(
                plan.plan.algorithm,
                plan.plan.allocate_left,
                plan.plan.smoothness,
                plan.dra,
            );
            core = core.with_reservations(book);
        } else {
            match ReservationBook::new(plan.plan.clone(), plan.dra) {
                Ok(book) => core = core.with_reservations(book),
                // Validated with the settings; a plan that cannot be built is a bug there.
                Err(e) => error!("invalid plan settings, using the defaults: {e}"),
            }
        }
        // Drained nodes stay drained (their capacity stays out of the plan when they re-join).
        for node in store.draining_nodes()? {
            core.set_draining(&node, true);
        }
        info!(
            placer = core.placer_name(),
            resume_after_seq = reserved_seq,
            "guarantor ready"
        );
        Ok(GuarantorActor {
            core,
            signer,
            store,
            clock,
            coordinator,
            reserved_seq,
            endpoints: HashMap::new(),
            routes: HashMap::new(),
            next_ask_key: 1,
            owner_routes: HashMap::new(),
            metrics: Arc::default(),
            dashboard: None,
            agenda_published_step: None,
            agenda_stale: true,
            threesigma: None,
        })
    }

    /// Run Pace's resource shaper (before any node joins).
    pub fn with_shaping(mut self, settings: &ShapingSettings) -> GuarantorActor {
        info!(
            forecaster = ?settings.forecaster,
            interval_ms = settings.config.interval_ms,
            k1 = settings.config.buffer.k1,
            k2 = settings.config.buffer.k2,
            policy = ?settings.config.policy,
            refit_every = settings.refit_every,
            "resource shaping on"
        );
        let shaping = ShapingState::new(
            settings.config.clone(),
            settings.forecaster.factory(settings.refit_every),
        );
        let core = std::mem::replace(
            &mut self.core,
            Guarantor::new(
                GuarantorConfig::default(),
                Box::new(QueueableAware::default()),
                0,
            ),
        );
        self.core = core.with_shaping(shaping);
        self
    }

    /// One shaping pass: victims are stopped at their nodes (reason `shaped_preemption`), then
    /// shrinks and then growths are sent (a node applies a growth only into room it has), and
    /// what the pass freed is offered to waiting asks and the QUEUEABLE policing limits.
    fn shape(&mut self) -> ShapingOutcome {
        let now_ms = self.clock.now_ms();
        let outcome = self.core.shape(now_ms);
        self.metrics.shaping_passes.inc();
        self.metrics
            .shaping_resizes
            .inc_by(outcome.resized.len() as u64);
        self.metrics
            .shaping_preemptions
            .inc_by(outcome.preempted.len() as u64);
        self.metrics
            .shaped_containers
            .set(self.core.shaping().map_or(0, |s| s.len()) as i64);
        if let Some(shaping) = self.core.shaping() {
            crate::metrics::set_by_resource(&self.metrics.shaping_freed, shaping.freed());
        }
        for (node_id, container_id, app_id, reason) in &outcome.preempted {
            info!(node = %node_id, container = %container_id, app = %app_id, %reason, "shaper preempts");
            self.coordinator.do_send(StopGrantOnNode {
                node_id: node_id.clone(),
                container_id: *container_id,
                app_id: app_id.clone(),
                revoke_until_ms: None,
                shaped_preemption: Some(*reason),
            });
        }
        let (growths, shrinks): (Vec<_>, Vec<_>) = outcome.resized.iter().partition(|r| r.grows());
        for r in shrinks.into_iter().chain(growths) {
            debug!(node = %r.node, container = %r.container, from = %r.from, to = %r.to, "shaped");
            self.coordinator.do_send(ResizeOnNode {
                node_id: r.node.clone(),
                container_id: r.container,
                resources: r.to,
            });
        }
        if !outcome.resized.is_empty() || !outcome.preempted.is_empty() {
            info!(
                resized = outcome.resized.len(),
                preempted = outcome.preempted.len(),
                failed_apps = outcome.failed_apps.len(),
                "shaping pass"
            );
            // Waiting asks are placed into the freed capacity once the coordinator has queued
            // the resizes and stops to the nodes (it answers ScheduleWaiting): a grant never
            // overtakes the shrink that made its room on the node's stream.
            self.coordinator
                .do_send(crate::coordinator_actor::ShapingSent);
        }
        self.report_limits();
        outcome
    }

    /// Make sure `extra` more ids can be minted without passing the stored reservation.
    fn reserve(&mut self, extra: u64) -> bool {
        let needed = self.core.last_seq().saturating_add(extra);
        if needed <= self.reserved_seq {
            return true;
        }
        let next = needed.saturating_add(SEQ_RESERVATION_BLOCK);
        match self.store.set_guarantor_reserved_seq(next) {
            Ok(()) => {
                self.reserved_seq = next;
                true
            }
            Err(e) => {
                error!("cannot reserve guarantor container ids, grants wait: {e}");
                false
            }
        }
    }

    /// Place what fits, send the grants, report changed policing limits.
    fn schedule(&mut self) {
        let pending = self.core.pending_containers();
        if pending > 0 && self.reserve(pending) {
            let placements = self.core.schedule(self.clock.now_ms());
            self.deliver(placements);
        }
        self.report_limits();
    }

    fn deliver(&mut self, placements: Vec<GuaranteedPlacement>) {
        // One frame per ask per round; `remaining` of the last placement is what is left.
        let mut by_ask: BTreeMap<u64, (Vec<GrantedContainer>, u32)> = BTreeMap::new();
        for p in placements {
            let body = p.token_body;
            let container_id = body.container_id;
            let node_id = body.node_id.clone();
            let resources = body.resources;
            let token = match self.signer.sign(body) {
                Ok(t) => t,
                Err(e) => {
                    error!(%container_id, "cannot sign grant, releasing it: {e}");
                    self.core.on_finished(container_id);
                    continue;
                }
            };
            let entry = by_ask.entry(p.ask_key).or_default();
            entry.0.push(GrantedContainer {
                container_id,
                node_endpoint: self.endpoints.get(&node_id).cloned().unwrap_or_default(),
                node_id,
                container_type: ContainerType::Guaranteed,
                resources,
                token,
            });
            entry.1 = p.remaining;
        }
        for (ask_key, (containers, remaining)) in by_ask {
            let Some(route) = self.routes.get_mut(&ask_key) else {
                continue;
            };
            if let Some(received) = route.received.take() {
                self.metrics
                    .guaranteed_grant_seconds
                    .observe(received.elapsed().as_secs_f64());
            }
            debug!(
                correlation_id = route.correlation_id,
                granted = containers.len(),
                remaining,
                "guaranteed grants"
            );
            let _ = route.tx.send(CoordinatorToWorker::GuaranteedAllocated(
                GuaranteedAllocated {
                    correlation_id: route.correlation_id,
                    containers,
                    remaining,
                },
            ));
            if remaining == 0 {
                self.routes.remove(&ask_key);
            }
        }
    }

    /// Book the GUARANTEED containers a node reports running that the books do not hold, each
    /// as its signed token says it was booked (its reservation, shaping terms), so a restart
    /// books them exactly as before. A token that does not verify proves nothing: the container
    /// is booked as plain work (a worker cannot lie its way into a reservation).
    fn adopt(&mut self, node_id: &NodeId, containers: &[ContainerStatus]) {
        let keys = self.signer.public_ring();
        for c in containers
            .iter()
            .filter(|c| c.container_type == ContainerType::Guaranteed)
        {
            let booking = if self.core.is_guaranteed(c.id) {
                None // booked already; its grant keeps its terms
            } else {
                verified_booking(&keys, node_id, c).unwrap_or_else(|e| {
                    warn!(node = %node_id, container = %c.id, "the token reported with a running GUARANTEED container proves nothing, booking it as plain work: {e}");
                    None
                })
            };
            if let Err(e) = self.core.adopt_running(node_id, c, booking.as_ref()) {
                warn!(node = %node_id, container = %c.id, "cannot book a GUARANTEED container the node reports: {e}");
            }
        }
        self.report_limits();
    }

    /// Send what reservation owners must hear (Morpheus §6 replanning, §7 DRA): events to the
    /// owner's subscribed connections through its last session; a cancelled reservation's
    /// waiting asks are answered `reservation_rejected`.
    /// Returns whether replanning changed the plan (a reservation moved or was cancelled).
    fn flush_reservation_events(&mut self) -> bool {
        let now_ms = self.clock.now_ms();
        let mut replanned = false;
        for event in self.core.take_reservation_events() {
            replanned |= matches!(
                &event,
                ReservationEvent::Cancelled { .. }
                    | ReservationEvent::Reprovisioned {
                        cause: ReprovisionCause::Replanned,
                        ..
                    }
            );
            let (owner, notice) = match event {
                ReservationEvent::Reprovisioned {
                    id,
                    owner,
                    allocation,
                    cause,
                } => {
                    info!(reservation = %id, ?cause, "reservation reprovisioned");
                    (
                        owner,
                        ReservationNoticeKind::Reprovisioned(ReservationReprovisioned {
                            reservation_id: id,
                            allocation,
                            cause,
                            at_ms: now_ms,
                        }),
                    )
                }
                ReservationEvent::Cancelled {
                    id,
                    owner,
                    reason,
                    dropped_asks,
                } => {
                    warn!(reservation = %id, "reservation cancelled: {reason}");
                    self.fail_asks(
                        &dropped_asks,
                        &format!("reservation {id:?} was cancelled: {reason}"),
                    );
                    (
                        owner,
                        ReservationNoticeKind::Cancelled(ReservationCancelled {
                            reservation_id: id,
                            reason,
                            at_ms: now_ms,
                        }),
                    )
                }
            };
            if let Some((_, tx)) = self.owner_routes.get(&owner) {
                let _ = tx.send(CoordinatorToWorker::ReservationNotice(ReservationNotice {
                    app_id: owner.to_string(),
                    event: notice,
                }));
            }
        }
        replanned
    }

    /// Write the reservations to the store (after every change to them).
    /// Publish the operator's agenda (`GET /reservations` on the metrics listener).
    fn publish_agenda(&self) {
        let now_ms = self.clock.now_ms();
        let book = self.core.reservations();
        let agenda_now = book.agenda_ms(now_ms);
        let capacity = book.plan_capacity();
        let free_now = book
            .free_capacity()
            .into_iter()
            .find(|f| f.start_ms <= agenda_now && agenda_now < f.end_ms)
            .map_or(capacity, |f| {
                scheduler_core::Resources::new(f.cpu_millis, f.memory_mib)
            });
        self.metrics
            .reservations
            .set(self.core.list_reservations(now_ms, None).len() as i64);
        crate::metrics::set_by_resource(&self.metrics.plan_capacity, capacity);
        crate::metrics::set_by_resource(
            &self.metrics.plan_reserved,
            scheduler_core::Resources::new(
                capacity.cpu_millis.saturating_sub(free_now.cpu_millis),
                capacity.memory_mib.saturating_sub(free_now.memory_mib),
            ),
        );
        self.metrics.set_agenda(&crate::metrics::AgendaView {
            published_at_ms: now_ms,
            agenda_now_ms: book.agenda_ms(now_ms),
            agenda_ms: book.plan().config().horizon_ms,
            plan_capacity: book.plan_capacity(),
            reservations: self.core.list_reservations(now_ms, None),
            free: book.free_capacity(),
        });
    }

    fn save_reservations(&self) -> Result<(), crate::store::StoreError> {
        self.publish_agenda();
        self.store
            .set_reservations(&self.core.reservations().stored())
            .inspect_err(|e| error!("cannot store the reservations: {e}"))
    }

    /// Answer waiting asks the guarantor dropped (their reservation is gone).
    fn fail_asks(&mut self, ask_keys: &[u64], message: &str) {
        for key in ask_keys {
            if let Some(route) = self.routes.remove(key) {
                let _ = route
                    .tx
                    .send(CoordinatorToWorker::RequestFailed(RequestFailed {
                        correlation_id: route.correlation_id,
                        code: ErrorCode::ReservationRejected,
                        message: message.to_string(),
                    }));
            }
        }
    }

    /// A node's capacity, GUARANTEED bookings and policing limit, for `/metrics`.
    fn export_node(&self, node: &NodeId) {
        if let Some(n) = self.core.node(node) {
            self.metrics.node_bookings(node, n.capacity, n.guaranteed);
        }
    }

    /// Tell the coordinator the policing limits (Mercury §4.3) that changed: the core tracks
    /// which nodes' bookings changed, so this is O(changes), not O(nodes) per event.
    fn report_limits(&mut self) {
        let changed = self.core.take_changed_limits();
        for (node, _) in &changed {
            self.export_node(node);
        }
        if !changed.is_empty() {
            self.coordinator.do_send(QueueableLimits(changed));
        }
    }
}

impl Actor for GuarantorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.start_threesigma_timer(ctx);
    }
}

/// A GUARANTEED ask forwarded by a worker (already checked against the app registry).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submit {
    pub session_id: SessionId,
    pub tx: WorkerTx,
    /// When the coordinator's session decoded the ask (observability only).
    pub received: std::time::Instant,
    pub correlation_id: u64,
    pub ask: GuaranteedAsk,
    /// The app's reservation the job runs in (Morpheus §4), if any.
    pub reservation_id: Option<String>,
    /// The job's description: the ask is planned by the 3Sigma cycle.
    pub job: Option<scheduler_core::protocol::app::JobSpec>,
}

impl Handler<Submit> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, mut msg: Submit, _: &mut Context<Self>) {
        let ask_key = self.next_ask_key;
        self.next_ask_key += 1;
        msg.ask.ask_key = ask_key;
        let submitted = match (&msg.reservation_id, msg.job.take()) {
            (None, Some(spec)) => {
                let now_ms = self.clock.now_ms();
                match spec.description(msg.ask.app_id.as_str(), msg.ask.resources, msg.ask.count, now_ms) {
                    Err(m) => Err(GuarantorError::BadJob(m)),
                    Ok(description) => match &mut self.threesigma {
                        None => Err(GuarantorError::BadJob(
                            "3Sigma scheduling is off on this coordinator (threesigma = false); send the ask without `job`".into(),
                        )),
                        Some(t) => {
                            let (belief, source, estimates) =
                                t.belief(&description, msg.ask.runtime_estimate_ms);
                            let submitted = self.core.submit_job(
                                msg.ask,
                                description,
                                belief,
                                source,
                                now_ms,
                            );
                            if submitted.is_ok() {
                                t.remember_submission(ask_key, estimates);
                            }
                            submitted
                        }
                    },
                }
            }
            (Some(id), _) => {
                self.owner_routes
                    .insert(msg.ask.app_id.clone(), (msg.session_id, msg.tx.clone()));
                self.core.submit_reserved(msg.ask, id)
            }
            (None, None) => self.core.submit(msg.ask),
        };
        match submitted {
            Ok(()) => {
                self.routes.insert(
                    ask_key,
                    AskRoute {
                        session_id: msg.session_id,
                        tx: msg.tx,
                        correlation_id: msg.correlation_id,
                        received: Some(msg.received),
                    },
                );
                self.schedule();
            }
            Err(e) => {
                let code = match e {
                    GuarantorError::LargerThanAnyNode { .. }
                    | GuarantorError::LargerThanReservation { .. } => ErrorCode::AskTooLarge,
                    GuarantorError::UnknownReservation(_) => ErrorCode::UnknownReservation,
                    GuarantorError::NotReservationOwner(_) => ErrorCode::ReservationRejected,
                    GuarantorError::JobQueueFull { .. } => ErrorCode::GuaranteedCapacityExceeded,
                    _ => ErrorCode::InvalidRequest,
                };
                let _ = msg
                    .tx
                    .send(CoordinatorToWorker::RequestFailed(RequestFailed {
                        correlation_id: msg.correlation_id,
                        code,
                        message: e.to_string(),
                    }));
            }
        }
    }
}

/// The reservation plan's settings (Morpheus §6, §7) from the coordinator's config.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanSettings {
    pub plan: scheduler_core::reservation::PlanConfig,
    pub dra: scheduler_core::reservation::dra::Dra,
}

/// A node joined (or re-joined): its capacity, app endpoint and the GUARANTEED containers it
/// reports running (re-booked, so a coordinator restart does not forget them).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AddNode {
    pub node_id: NodeId,
    pub rack: String,
    pub capacity: Resources,
    pub endpoint: String,
    pub containers: Vec<ContainerStatus>,
    /// The session's issuer number (GUARANTEED grants of other sessions are void).
    pub epoch: u32,
    /// Its attributes (`worker run --attribute k=v`): 3Sigma's equivalence sets.
    pub attributes: BTreeMap<String, String>,
}

impl Handler<AddNode> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: AddNode, _: &mut Context<Self>) {
        let reported: Vec<ContainerId> = msg.containers.iter().map(|c| c.id).collect();
        let void = self.core.join_node(
            msg.node_id.clone(),
            msg.rack,
            msg.capacity,
            msg.epoch,
            Some(&reported),
        );
        if !void.is_empty() {
            info!(node = %msg.node_id, count = void.len(), "GUARANTEED bookings freed at the node's join: grants of its previous session, or containers it no longer holds");
        }
        self.endpoints.insert(msg.node_id.clone(), msg.endpoint);
        self.core.set_node_attributes(&msg.node_id, msg.attributes);
        self.adopt(&msg.node_id, &msg.containers);
        self.schedule();
        self.export_node(&msg.node_id);
        self.agenda_stale = true;
    }
}

/// A node is lost: its GUARANTEED bookings are dropped.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RemoveNode {
    pub node_id: NodeId,
}

impl Handler<RemoveNode> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: RemoveNode, _: &mut Context<Self>) {
        let dropped = self.core.remove_node(&msg.node_id);
        self.endpoints.remove(&msg.node_id);
        info!(node = %msg.node_id, dropped = dropped.len(), "guarantor dropped node");
        self.metrics.forget_node(&msg.node_id);
        // Losing capacity replans the reservations (Morpheus §6): their owners are told.
        if self.flush_reservation_events() {
            let _ = self.save_reservations();
        } else {
            self.publish_agenda();
        }
        self.schedule();
    }
}

/// Container starts (issuer 0 only) and ends reported by a node's heartbeat; `started_here`
/// holds the node's status of each started GUARANTEED container it still reports.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ContainerEvents {
    pub node_id: NodeId,
    pub started: Vec<ContainerId>,
    pub started_here: Vec<ContainerStatus>,
    pub finished: Vec<ContainerId>,
}

impl Handler<ContainerEvents> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: ContainerEvents, _: &mut Context<Self>) {
        self.core.observe_time(self.clock.now_ms());
        for id in msg.started {
            self.core.on_started(id);
        }
        self.adopt(&msg.node_id, &msg.started_here);
        let mut freed = false;
        for id in msg.finished {
            // Only the node holding a grant frees it.
            freed |= self.core.on_finished_on(&msg.node_id, id);
        }
        if freed {
            self.schedule();
        }
    }
}

/// A node's QUEUEABLE load from its latest heartbeat (placement input).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReportQueueableLoad {
    pub node_id: NodeId,
    pub load: QueueableLoad,
}

impl Handler<ReportQueueableLoad> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: ReportQueueableLoad, _: &mut Context<Self>) {
        self.core.report_queueable_load(&msg.node_id, msg.load);
    }
}

/// A worker session ended: its waiting asks are dropped (its apps get an error from the worker).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CancelSession {
    pub session_id: SessionId,
}

impl Handler<CancelSession> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: CancelSession, _: &mut Context<Self>) {
        let keys: Vec<u64> = self
            .routes
            .iter()
            .filter(|(_, r)| r.session_id == msg.session_id)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            let dropped = self.core.cancel(k);
            self.routes.remove(&k);
            debug!(ask_key = k, dropped, "cancelled ask of closed session");
        }
        self.owner_routes
            .retain(|_, (session, _)| *session != msg.session_id);
    }
}

/// The app connection behind one forwarded ask closed: drop what of it still waits, so no
/// capacity is granted to nobody (and no later ask waits behind it).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CancelAsk {
    pub session_id: SessionId,
    pub correlation_id: u64,
}

impl Handler<CancelAsk> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: CancelAsk, _: &mut Context<Self>) {
        let key = self.routes.iter().find_map(|(k, r)| {
            (r.session_id == msg.session_id && r.correlation_id == msg.correlation_id).then_some(*k)
        });
        // Unknown: the ask was fully placed (or refused) before the cancel arrived.
        if let Some(k) = key {
            let dropped = self.core.cancel(k);
            self.routes.remove(&k);
            debug!(
                ask_key = k,
                dropped, "cancelled ask of a closed app connection"
            );
        }
    }
}

/// Validate and book a promotion (Mercury §3.4); the answer goes to the coordinator actor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct BookPromotion {
    pub promotion_id: u64,
    pub container_id: ContainerId,
    pub node_id: NodeId,
    pub app_id: AppId,
    pub resources: Resources,
}

impl Handler<BookPromotion> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: BookPromotion, _: &mut Context<Self>) {
        let result = self
            .core
            .promote(msg.container_id, &msg.node_id, &msg.app_id, msg.resources);
        self.coordinator.do_send(PromotionBooked {
            promotion_id: msg.promotion_id,
            container_id: msg.container_id,
            result,
        });
        self.report_limits();
    }
}

/// Undo a booking (the hosting node refused the promotion, or it timed out).
#[derive(Message)]
#[rtype(result = "()")]
pub struct UndoPromotion {
    pub container_id: ContainerId,
}

impl Handler<UndoPromotion> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: UndoPromotion, _: &mut Context<Self>) {
        if self.core.on_finished(msg.container_id) {
            self.schedule();
        }
    }
}

/// Free an unstarted GUARANTEED grant on the application's behalf; answers the worker.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseGrant {
    pub container_id: ContainerId,
    pub app_id: AppId,
    pub tx: WorkerTx,
    pub correlation_id: u64,
}

impl Handler<ReleaseGrant> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: ReleaseGrant, _: &mut Context<Self>) {
        let owned = self.core.grant_owner(msg.container_id) == Some(&msg.app_id);
        let reply = match self.core.grant_node(msg.container_id).cloned() {
            Some(node_id) if owned => {
                // Unstarted by the books: free it and revoke its token at the node. Started (its
                // node's heartbeat lagged the app): the node stops it and its finish frees it.
                let revoke_until_ms = self
                    .core
                    .release_unstarted(msg.container_id, &msg.app_id)
                    .map(|g| g.expires_at_ms);
                self.coordinator.do_send(StopGrantOnNode {
                    node_id,
                    container_id: msg.container_id,
                    app_id: msg.app_id.clone(),
                    revoke_until_ms,
                    shaped_preemption: None,
                });
                if revoke_until_ms.is_some() {
                    self.schedule();
                }
                CoordinatorToWorker::Released(Released {
                    correlation_id: msg.correlation_id,
                })
            }
            _ => CoordinatorToWorker::RequestFailed(RequestFailed {
                correlation_id: msg.correlation_id,
                code: ErrorCode::UnknownContainer,
                message: format!(
                    "container {} is not a container of app {} known to the coordinator",
                    msg.container_id, msg.app_id
                ),
            }),
        };
        let _ = msg.tx.send(reply);
    }
}

/// The key ring rotated.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetKeys(pub KeyRing);

impl Handler<SetKeys> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: SetKeys, _: &mut Context<Self>) {
        match GuaranteedSigner::new(&msg.0) {
            Ok(signer) => self.signer = signer,
            // The coordinator built the same signer from these seeds before sending them.
            Err(e) => error!("GUARANTEED key rotation not applied: {e}"),
        }
    }
}

/// Measured use of running GUARANTEED containers from a heartbeat (the shaper's input).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ObserveUsage(pub Vec<(ContainerId, Resources)>);

impl Handler<ObserveUsage> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: ObserveUsage, _: &mut Context<Self>) {
        for (id, used) in msg.0 {
            self.core.observe_usage(id, used);
        }
    }
}

/// Periodic: run a shaping pass if one is due (Pace §3.2, every shaping interval).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShapeIfDue;

impl Handler<ShapeIfDue> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, _: ShapeIfDue, _: &mut Context<Self>) {
        if self.core.shaping_due(self.clock.now_ms()) {
            self.shape();
        }
    }
}

/// Run a shaping pass now, whatever the interval (operators and tests drive passes with it).
/// Answers what the pass decided (empty when shaping is off).
#[derive(Message)]
#[rtype(result = "ShapingOutcome")]
pub struct ShapeNow;

impl Handler<ShapeNow> for GuarantorActor {
    type Result = MessageResult<ShapeNow>;
    fn handle(&mut self, _: ShapeNow, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.shape())
    }
}

/// The shaper's state: shaped containers, how many reported their use since the last pass, and
/// their allocations (`None` when shaping is off). Tests wait on it before driving a pass.
#[derive(Message)]
#[rtype(result = "Option<ShapingStatus>")]
pub struct InspectShaping;

#[derive(Clone, Debug, PartialEq)]
pub struct ShapingStatus {
    pub tracked: usize,
    pub observed_since_pass: usize,
    pub allocations: Vec<(ContainerId, Resources)>,
}

impl Handler<InspectShaping> for GuarantorActor {
    type Result = Option<ShapingStatus>;
    fn handle(&mut self, _: InspectShaping, _: &mut Context<Self>) -> Self::Result {
        self.core.shaping().map(|s| ShapingStatus {
            tracked: s.len(),
            observed_since_pass: s.observed_since_pass(),
            allocations: s.allocations(),
        })
    }
}

/// Place waiting asks now (after a shaping pass's resizes were sent to the nodes).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ScheduleWaiting;

impl Handler<ScheduleWaiting> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, _: ScheduleWaiting, _: &mut Context<Self>) {
        self.schedule();
    }
}

/// Periodic work: free grants whose token expired before their container started.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ExpireGrants {
    pub now_ms: u64,
}

impl Handler<ExpireGrants> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: ExpireGrants, _: &mut Context<Self>) {
        let expired = self.core.expire_unstarted(msg.now_ms);
        if !expired.is_empty() {
            info!(count = expired.len(), "unstarted GUARANTEED grants expired");
            self.schedule();
        }
        if !self.core.reservations().is_empty() {
            // Reservations change with time: allocations begin and end, DRA (Morpheus §7)
            // stretches late jobs (one stretch per reservation lasts T; re-evaluated after it).
            let stretched = self.core.reprovision(self.clock.now_ms());
            if stretched > 0 {
                debug!(stretched, "DRA stretched reservations");
            }
            self.flush_reservation_events();
            self.schedule();
        }
        // The agenda view moves with time (allocations, DRA stretches, use) and capacity:
        // republished once per plan step, or at the next tick after a join.
        let step = self.clock.now_ms() / self.core.reservations().plan().config().step_ms.max(1);
        if self.agenda_stale || self.agenda_published_step != Some(step) {
            self.publish_agenda();
            self.agenda_stale = false;
            self.agenda_published_step = Some(step);
        }
    }
}

/// A reservation request of a registered app (`reserve`, `update_reservation`,
/// `delete_reservation`, `list_reservations`), forwarded by its worker.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReservationRequest {
    pub session_id: SessionId,
    pub tx: WorkerTx,
    pub call: ReservationCall,
}

/// An app's `explain` of its waiting 3Sigma job, forwarded by its worker.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ExplainRequest {
    pub tx: WorkerTx,
    pub call: ExplainCall,
}

/// Most jobs one `explain` answer lists (an app may have several waiting jobs of one id); each
/// is at most a few KiB (8 options), so the answer stays far below the app frame cap.
pub const MAX_EXPLAINED_JOBS: usize = 16;

impl Handler<ExplainRequest> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: ExplainRequest, _: &mut Context<Self>) {
        let ExplainRequest { tx, call } = msg;
        // Only the asking app's own jobs, by job id (not by ask key: keys are the guarantor's).
        let jobs = self
            .core
            .explain_app_jobs(&call.app_id, &call.job_id, MAX_EXPLAINED_JOBS);
        let _ = tx.send(CoordinatorToWorker::Explained(ExplainDone {
            correlation_id: call.correlation_id,
            jobs,
        }));
    }
}

/// The error answer of a refused reservation request: a bad definition names its field.
fn rejection_failure(correlation_id: u64, r: Rejection) -> RequestFailed {
    let (code, message) = match r {
        Rejection::Invalid(m) if m.starts_with("reservation_id") => {
            (ErrorCode::InvalidRequest, format!("invalid request: {m}"))
        }
        Rejection::Invalid(m) => (
            ErrorCode::InvalidRequest,
            format!("invalid request: definition.{m}"),
        ),
        r @ Rejection::Unknown(_) => (ErrorCode::UnknownReservation, r.to_string()),
        r => (ErrorCode::ReservationRejected, r.to_string()),
    };
    RequestFailed {
        correlation_id,
        code,
        message,
    }
}

impl Handler<ReservationRequest> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, msg: ReservationRequest, _: &mut Context<Self>) {
        let ReservationRequest {
            session_id,
            tx,
            call,
        } = msg;
        let app = AppId::new(call.app_id);
        let now_ms = self.clock.now_ms();
        self.owner_routes
            .insert(app.clone(), (session_id, tx.clone()));
        let correlation_id = call.correlation_id;
        let reply = match call.op {
            ReservationOp::Reserve {
                reservation_id,
                definition,
            } => {
                let held = self.core.list_reservations(now_ms, Some(&app)).len();
                if held >= MAX_RESERVATIONS_PER_APP {
                    Err(RequestFailed {
                        correlation_id,
                        code: ErrorCode::ReservationRejected,
                        message: format!(
                            "app {app} holds {held} reservations, the most one app may hold; delete one first"
                        ),
                    })
                } else {
                    self.core
                        .reserve(now_ms, &reservation_id, app.clone(), definition)
                        .map(|allocation| ReservationReply::Accepted {
                            reservation_id,
                            allocation,
                        })
                        .map_err(|r| rejection_failure(correlation_id, r))
                }
            }
            ReservationOp::Update {
                reservation_id,
                definition,
            } => self
                .core
                .update_reservation(now_ms, &reservation_id, Some(&app), definition)
                .map(|allocation| ReservationReply::Accepted {
                    reservation_id,
                    allocation,
                })
                .map_err(|r| rejection_failure(correlation_id, r)),
            ReservationOp::Delete { reservation_id } => {
                match self.core.delete_reservation(&reservation_id, Some(&app)) {
                    Ok(dropped) => {
                        self.fail_asks(
                            &dropped,
                            &format!("reservation {reservation_id:?} was deleted"),
                        );
                        Ok(ReservationReply::Deleted)
                    }
                    Err(r) => Err(rejection_failure(correlation_id, r)),
                }
            }
            ReservationOp::List => Ok(ReservationReply::Listed {
                reservations: self
                    .core
                    .list_reservations(now_ms, Some(&app))
                    .into_iter()
                    .map(|r| ReservationSummary {
                        reservation_id: r.id,
                        definition: r.definition,
                        allocated_now: r.allocated_now,
                        used: r.used,
                    })
                    .collect(),
                free: self.core.reservations().free_capacity(),
            }),
        };
        let changed = matches!(
            reply,
            Ok(ReservationReply::Accepted { .. } | ReservationReply::Deleted)
        );
        let reply = match reply {
            Ok(_) if changed && self.save_reservations().is_err() => Err(RequestFailed {
                correlation_id,
                code: ErrorCode::Internal,
                message: "the change is in effect but the coordinator could not store it; it would be lost at a coordinator restart (see the coordinator's log)".into(),
            }),
            other => other,
        };
        let frame = match reply {
            Ok(reply) => CoordinatorToWorker::ReservationDone(ReservationDone {
                correlation_id,
                reply,
            }),
            Err(failed) => {
                debug!(correlation_id, code = ?failed.code, "reservation request refused: {}", failed.message);
                CoordinatorToWorker::RequestFailed(failed)
            }
        };
        let _ = tx.send(frame);
        // A deleted or changed reservation may let waiting plain asks through.
        self.schedule();
    }
}

/// Inspection for tests and operators.
#[derive(Debug, Clone, PartialEq)]
pub struct GuarantorStats {
    pub nodes: usize,
    pub pending_containers: u64,
    pub last_seq: u64,
    /// `Err` names the broken invariant (a node over-committed by GUARANTEED work).
    pub invariants: Result<(), String>,
    /// GUARANTEED booked per node.
    pub booked: BTreeMap<NodeId, Resources>,
}

#[derive(Message)]
#[rtype(result = "GuarantorStats")]
pub struct InspectGuarantor;

impl Handler<InspectGuarantor> for GuarantorActor {
    type Result = MessageResult<InspectGuarantor>;
    fn handle(&mut self, _: InspectGuarantor, _: &mut Context<Self>) -> Self::Result {
        MessageResult(GuarantorStats {
            nodes: self.core.nodes().count(),
            pending_containers: self.core.pending_containers(),
            last_seq: self.core.last_seq(),
            invariants: self.core.check_invariants(),
            booked: self
                .core
                .nodes()
                .map(|n| (n.node_id.clone(), n.guaranteed))
                .collect(),
        })
    }
}

/// Publish the guarantor's dashboard snapshot (the coordinator asks at its tick while someone
/// watches).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishDashboard;

impl Handler<PublishDashboard> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, _: PublishDashboard, _: &mut Context<Self>) {
        if let Some(dashboard) = &self.dashboard {
            dashboard.publish_guarantor(crate::dashboard::guarantor_snapshot(
                self.clock.now_ms(),
                &self.core,
            ));
        }
    }
}

/// The guarantor's part for the admin channel (built now).
#[derive(Message)]
#[rtype(result = "crate::dashboard::GuarantorSnapshot")]
pub struct AdminGuarantor;

impl Handler<AdminGuarantor> for GuarantorActor {
    type Result = MessageResult<AdminGuarantor>;
    fn handle(&mut self, _: AdminGuarantor, _: &mut Context<Self>) -> Self::Result {
        MessageResult(crate::dashboard::guarantor_snapshot(
            self.clock.now_ms(),
            &self.core,
        ))
    }
}

/// Start or end draining a node (sent by the coordinator actor).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetNodeDraining {
    pub node: NodeId,
    pub draining: bool,
}

impl Handler<SetNodeDraining> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, m: SetNodeDraining, _: &mut Context<Self>) {
        if self.core.set_draining(&m.node, m.draining) {
            // Its capacity left or re-entered the plan: replanning may have cancelled
            // reservations (their owners are told), and undraining may let asks through.
            if (self.flush_reservation_events() || !m.draining)
                && let Err(e) = self.save_reservations()
            {
                warn!("could not store the plan after a drain change: {e}");
            }
            self.schedule();
        }
    }
}

/// Nodes get no new GUARANTEED work (`unreachable`), or may again (sent by the coordinator
/// actor, one message per tick and kind): declared lost but their loss not stored yet (until the
/// stored loss removes them, [`RemoveNode`]), or silent past the node timeout with their
/// declaration held by the loss guard (until heard again or declared lost). Their bookings stay
/// either way.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetNodesUnreachable {
    pub nodes: Vec<NodeId>,
    pub unreachable: bool,
}

impl Handler<SetNodesUnreachable> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, m: SetNodesUnreachable, _: &mut Context<Self>) {
        let mut reopened = false;
        for node in &m.nodes {
            reopened |= self.core.set_unreachable(node, m.unreachable) && !m.unreachable;
        }
        if reopened {
            // Open again: waiting asks may fit there now (one pass for the whole batch, so a
            // healed partition of thousands of nodes is not thousands of passes).
            self.schedule();
        }
    }
}

/// An operator submits a recurring reservation on behalf of a registered app: reserved, or
/// updated when the app holds one of that id already. The operation and the allocation.
#[derive(Message)]
#[rtype(
    result = "Result<(&'static str, Vec<scheduler_core::reservation::AllocationInterval>), String>"
)]
pub struct AdminReserve {
    pub app_id: String,
    pub reservation_id: String,
    pub definition: scheduler_core::reservation::ReservationDefinition,
}

impl Handler<AdminReserve> for GuarantorActor {
    type Result = Result<
        (
            &'static str,
            Vec<scheduler_core::reservation::AllocationInterval>,
        ),
        String,
    >;
    fn handle(&mut self, m: AdminReserve, _: &mut Context<Self>) -> Self::Result {
        let app = AppId::new(m.app_id);
        let now_ms = self.clock.now_ms();
        let held = self.core.list_reservations(now_ms, Some(&app));
        let exists = held.iter().any(|r| r.id == m.reservation_id);
        let (op, placed) = if exists {
            (
                "update_reservation",
                self.core
                    .update_reservation(now_ms, &m.reservation_id, Some(&app), m.definition),
            )
        } else if held.len() >= MAX_RESERVATIONS_PER_APP {
            return Err(format!(
                "app {app} holds {} reservations, the most one app may hold; delete one first",
                held.len()
            ));
        } else {
            (
                "reserve",
                self.core
                    .reserve(now_ms, &m.reservation_id, app.clone(), m.definition),
            )
        };
        let allocation = placed.map_err(|r| match r {
            Rejection::Invalid(m) if m.starts_with("reservation_id") => m,
            Rejection::Invalid(m) => format!("definition.{m}"),
            r => r.to_string(),
        })?;
        self.save_reservations().map_err(|e| {
            format!("accepted, but the coordinator could not store it (it would be lost at a restart): {e}")
        })?;
        self.schedule();
        Ok((op, allocation))
    }
}

/// An operator deletes a reservation, whoever owns it: its waiting asks are refused. The ids
/// of the refused asks.
#[derive(Message)]
#[rtype(result = "Result<usize, String>")]
pub struct AdminDeleteReservation {
    pub id: String,
}

impl Handler<AdminDeleteReservation> for GuarantorActor {
    type Result = Result<usize, String>;
    fn handle(&mut self, m: AdminDeleteReservation, _: &mut Context<Self>) -> Self::Result {
        let dropped = self
            .core
            .delete_reservation(&m.id, None)
            .map_err(|r| r.to_string())?;
        self.fail_asks(
            &dropped,
            &format!("reservation {:?} was deleted by the operator", m.id),
        );
        self.save_reservations().map_err(|e| {
            format!("deleted, but the coordinator could not store it (it would come back at a restart): {e}")
        })?;
        self.schedule();
        Ok(dropped.len())
    }
}

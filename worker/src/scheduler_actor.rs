//! The distributed-scheduler actor (Mercury §4.2, §6.3): answers QUEUEABLE asks by itself from
//! the coordinator's top-k view and signs their tokens; forwards GUARANTEED asks, promotions and
//! remote releases to the coordinator and routes the answers back to the waiting connection;
//! keeps quota counts from the coordinator's notices and tells apps about lost containers.

use crate::link_queues::{OutboxFull, OutboxTx};
use crate::node_actor::error;
use crate::shared::{ConnTx, InFlight, Settle, Shared};
use actix::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use scheduler_core::coordinator::ContainerNotice;
use scheduler_core::distributed::{
    ClusterView, DirectoryUpdate, DistributedScheduler, PlacementError, QueueableAsk,
};
use scheduler_core::issued::{IssuedAction, IssuedContainers};
use scheduler_core::node::ContainerStatus;
use scheduler_core::protocol::app::{
    Ack, Allocate, Allocated, AppResponse, ContainerEvent, ContainerEventKind, ErrorCode,
    Explained, GrantedContainer, Promote, Promoted, Release, ReservationAccepted, ReservationList,
};
use scheduler_core::protocol::cluster::{
    AllocateGuaranteed, AppRecord, CancelAllocate, CoordinatorToWorker, ExplainCall,
    PromoteContainer, ReleaseContainer, ReservationCall, ReservationNoticeKind, ReservationOp,
    ReservationReply, WorkerToCoordinator,
};
use scheduler_core::protocol::limits::MAX_WAITING_GUARANTEED_ASKS_PER_APP;
use scheduler_core::token::{IssuerNodeKey, QueueableSigner};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, KillReason, NodeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use tracing::{debug, warn};

/// A request forwarded to the coordinator, waiting for its answer.
struct Pending {
    app: AppId,
    request_id: u64,
    reply: ConnTx,
    /// A release of our own unstarted grant: "unknown container" from the coordinator means
    /// no node took it, which is a successful release.
    unknown_is_success: bool,
    /// A GUARANTEED ask: cancelled at the coordinator if its connection closes while it waits.
    guaranteed_ask: bool,
    /// Counts the ask in its app's waiting GUARANTEED asks on this worker until dropped.
    _waiting: Option<WaitingAsk>,
    /// When a GUARANTEED ask was received, until its first containers (allocation latency).
    asked_at: Option<std::time::Instant>,
}

/// GUARANTEED asks waiting at the coordinator, per app (bounded by
/// [`MAX_WAITING_GUARANTEED_ASKS_PER_APP`]).
type WaitingCounts = Rc<RefCell<HashMap<AppId, usize>>>;

/// One waiting GUARANTEED ask of an app; uncounted when its [`Pending`] goes, however it goes.
struct WaitingAsk {
    counts: WaitingCounts,
    app: AppId,
}

impl WaitingAsk {
    fn new(counts: &WaitingCounts, app: &AppId) -> WaitingAsk {
        *counts.borrow_mut().entry(app.clone()).or_default() += 1;
        WaitingAsk {
            counts: counts.clone(),
            app: app.clone(),
        }
    }
}

impl Drop for WaitingAsk {
    fn drop(&mut self) {
        let mut counts = self.counts.borrow_mut();
        if let Some(n) = counts.get_mut(&self.app) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.app);
            }
        }
    }
}

pub struct SchedulerActor {
    ds: DistributedScheduler,
    /// Signs this scheduler's QUEUEABLE grants with its per-node keys (none before a join).
    signer: Option<QueueableSigner>,
    shared: Arc<Shared>,
    rng: StdRng,
    /// Frames to the coordinator (count-bounded: app requests are refused past
    /// [`crate::link_queues::OUTBOX_REQUEST_FRAMES`]).
    link: OutboxTx,
    next_correlation: u64,
    pending: HashMap<u64, Pending>,
    /// Containers this worker granted (QUEUEABLE) or obtained for an app (GUARANTEED), and the
    /// rules applied to them (lost with their node, a release racing a start): sans-IO in
    /// `scheduler_core::issued`.
    issued: IssuedContainers,
    waiting_guaranteed: WaitingCounts,
}

impl SchedulerActor {
    pub fn new(shared: Arc<Shared>, link: OutboxTx, seed: u64) -> SchedulerActor {
        SchedulerActor {
            ds: DistributedScheduler::new(Default::default(), 0),
            signer: None,
            shared,
            rng: StdRng::seed_from_u64(seed),
            link,
            next_correlation: 1,
            pending: HashMap::new(),
            issued: IssuedContainers::default(),
            waiting_guaranteed: WaitingCounts::default(),
        }
    }

    fn forward(
        &mut self,
        app: AppId,
        request_id: u64,
        reply: ConnTx,
        make: impl FnOnce(u64) -> WorkerToCoordinator,
    ) {
        self.forward_with(app, request_id, reply, false, make)
    }

    /// Ask the coordinator to release grants nobody will receive; the answers match no
    /// pending request and are dropped.
    fn release_orphaned_grants(&mut self, containers: &[GrantedContainer]) {
        for c in containers {
            self.release_unanswered(c.token.body.app_id.to_string(), c.container_id);
        }
    }

    /// Ask the coordinator to release a container; nobody waits for the answer (it matches no
    /// pending request and is dropped).
    fn release_unanswered(&mut self, app_id: String, container_id: ContainerId) {
        let correlation_id = self.next_correlation;
        self.next_correlation += 1;
        // Best effort, bounded like an app's request (apps can cause these by the thousand,
        // and past the outbox's bound the session would drop): a grant nobody receives is
        // freed anyway when its token expires.
        let _ = self
            .link
            .push_request(WorkerToCoordinator::Release(ReleaseContainer {
                correlation_id,
                app_id,
                container_id,
            }));
    }

    fn forward_with(
        &mut self,
        app: AppId,
        request_id: u64,
        reply: ConnTx,
        unknown_is_success: bool,
        make: impl FnOnce(u64) -> WorkerToCoordinator,
    ) {
        let refused = if !self.shared.connected.get() {
            Some("this worker is not connected to the coordinator right now; retry shortly")
        } else if !self.shared.coordinator_responsive.get() {
            Some(
                "the coordinator has not answered this worker for several heartbeats; retry shortly",
            )
        } else {
            None
        };
        if let Some(why) = refused {
            let _ = reply.send(error(request_id, ErrorCode::CoordinatorUnavailable, why));
            return;
        }
        let correlation_id = self.next_correlation;
        self.next_correlation += 1;
        self.pending.insert(
            correlation_id,
            Pending {
                app,
                request_id,
                reply,
                unknown_is_success,
                guaranteed_ask: false,
                _waiting: None,
                asked_at: None,
            },
        );
        if let Err(full) = self.link.push_request(make(correlation_id))
            && let Some(p) = self.pending.remove(&correlation_id)
        {
            let message = match full {
                OutboxFull::Busy => {
                    "this worker's link to the coordinator has too many requests queued; retry shortly"
                }
                OutboxFull::Overflowed => {
                    "this worker is re-joining the coordinator right now; retry shortly"
                }
            };
            let _ = p.reply.send(error(
                request_id,
                ErrorCode::CoordinatorUnavailable,
                message,
            ));
        }
    }

    fn allocate_queueable(&mut self, app: AppId, req: &Allocate) -> AppResponse {
        let Some(signer) = self.signer.as_ref() else {
            return error(
                req.request_id,
                ErrorCode::CoordinatorUnavailable,
                "this worker has not joined the cluster yet",
            );
        };
        let ask = QueueableAsk {
            app_id: app.clone(),
            resources: req.resources,
            count: req.count,
            priority: req.priority,
            locality: req.locality.clone(),
            runtime_estimate_ms: req.runtime_estimate_ms,
            job_id: JobId::new(req.job_id.as_str()),
            job_submit_time_ms: req.job_submit_time_ms,
            // Counted on from this scheduler's record of the named containers (once for any it
            // does not know): nodes return re-placed work only past a bound doubled per return.
            replacements: self.issued.replacement_counts(
                self.ds.quotas(),
                &app,
                &req.replaces_shed,
                req.count,
            ),
        };
        // A re-ask of shed containers: their nodes wait until the next view, as in the simulator.
        let avoided = self
            .issued
            .avoid_nodes_that_shed(&mut self.ds, &app, &req.replaces_shed);
        if avoided > 0 {
            debug!(%app, avoided, "avoiding nodes that shed this app's containers until the next view");
        }
        let quota = self.shared.quota(&app);
        let now_ms = self.shared.clock.now().as_millis();
        match self.ds.place(now_ms, &ask, &quota, &mut self.rng) {
            Ok(outcome) => {
                let mut containers = Vec::with_capacity(outcome.placed.len());
                for p in outcome.placed {
                    self.issued
                        .issued(&p.node_id, p.container_id, p.token_body.times_returned);
                    match signer.sign(p.token_body) {
                        Ok(token) => containers.push(GrantedContainer {
                            container_id: p.container_id,
                            node_id: p.node_id,
                            node_endpoint: p.node_endpoint,
                            container_type: ContainerType::Queueable,
                            resources: req.resources,
                            token,
                        }),
                        Err(e) => {
                            return error(
                                req.request_id,
                                ErrorCode::Internal,
                                format!("signing failed: {e}"),
                            );
                        }
                    }
                }
                AppResponse::Allocated(Allocated {
                    request_id: req.request_id,
                    containers,
                    remaining: 0,
                    unplaced: outcome.unplaced,
                    unplaced_reason: outcome.unplaced_reason,
                })
            }
            Err(e) => {
                let code = match e {
                    PlacementError::NoView => ErrorCode::CoordinatorUnavailable,
                    PlacementError::LargerThanAnyNode { .. } => ErrorCode::AskTooLarge,
                    PlacementError::Empty => ErrorCode::InvalidRequest,
                    PlacementError::QuotaExceeded { .. } => {
                        self.shared.metrics.quota_refused(ContainerType::Queueable);
                        ErrorCode::QuotaExceeded
                    }
                };
                error(req.request_id, code, e.to_string())
            }
        }
    }

    /// Publish this scheduler's per-app counts for the next heartbeat (cluster-wide quotas).
    fn publish_counts(&self) {
        let mut counts = self.ds.quotas().outstanding_by_app();
        counts.truncate(scheduler_core::protocol::limits::MAX_ISSUED_APPS_PER_HEARTBEAT);
        self.shared.set_issued_counts(counts);
    }

    /// Carry out what the issued-container rules decided.
    fn act(&mut self, action: IssuedAction) {
        match action {
            IssuedAction::Stop { app, container_id } => {
                // Released before it started: stop it now.
                self.release_unanswered(String::from(app), container_id)
            }
            IssuedAction::Lost {
                app,
                container_id,
                node,
            } => self.shared.notify(
                &app,
                ContainerEvent {
                    container_id,
                    event: ContainerEventKind::Killed {
                        reason: KillReason::Lost,
                        message: format!("node {node} was lost"),
                    },
                    node_id: node,
                    at_ms: self.shared.clock.now().as_millis(),
                },
            ),
        }
    }

    /// Take the waiting GUARANTEED asks `which` selects out of `pending` and cancel each at the
    /// coordinator. Best effort, bounded like an app's request (a closed connection can leave a
    /// thousand waiting asks): an ask whose cancel is not sent is granted to nobody later, and
    /// that grant is released as an orphan or freed when its token expires.
    fn cancel_waiting_asks(&mut self, which: impl Fn(&Pending) -> bool) -> Vec<Pending> {
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.guaranteed_ask && which(p))
            .map(|(correlation_id, _)| *correlation_id)
            .collect();
        let mut cancelled = Vec::with_capacity(ids.len());
        for correlation_id in ids {
            if let Some(p) = self.pending.remove(&correlation_id) {
                cancelled.push(p);
            }
            let _ = self
                .link
                .push_request(WorkerToCoordinator::CancelAllocate(CancelAllocate {
                    correlation_id,
                }));
        }
        cancelled
    }

    fn fail_all_pending(&mut self, why: &str) {
        for (_, p) in self.pending.drain() {
            let _ = p
                .reply
                .send(error(p.request_id, ErrorCode::CoordinatorUnavailable, why));
        }
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;
}

/// `allocate` from an application connection.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AllocateMsg {
    pub app: AppId,
    pub req: Allocate,
    pub reply: ConnTx,
    /// Counts in the connection's requests in flight until handled.
    pub in_flight: InFlight,
    /// When the connection decoded the request: the allocation latency metric counts from here,
    /// so it includes the wait in this actor's mailbox.
    pub received_at: std::time::Instant,
}

impl Handler<AllocateMsg> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: AllocateMsg, _: &mut Context<Self>) {
        let AllocateMsg {
            app,
            req,
            reply,
            received_at: asked_at,
            ..
        } = msg;
        match req.container_type {
            ContainerType::Queueable => {
                let answer = self.allocate_queueable(app, &req);
                if let AppResponse::Allocated(a) = &answer
                    && !a.containers.is_empty()
                {
                    self.shared.metrics.allocated(
                        ContainerType::Queueable,
                        a.containers.len(),
                        Some(asked_at.elapsed()),
                    );
                }
                let _ = reply.send(answer);
                self.publish_counts();
            }
            ContainerType::Guaranteed => {
                if req.count == 0 || req.resources.is_zero() {
                    let _ = reply.send(error(
                        req.request_id,
                        ErrorCode::InvalidRequest,
                        "ask has zero resources or zero count",
                    ));
                    return;
                }
                let waiting = self
                    .waiting_guaranteed
                    .borrow()
                    .get(&app)
                    .copied()
                    .unwrap_or(0);
                if waiting >= MAX_WAITING_GUARANTEED_ASKS_PER_APP {
                    self.shared.metrics.quota_refused(ContainerType::Guaranteed);
                    let _ = reply.send(error(
                        req.request_id,
                        ErrorCode::QuotaExceeded,
                        format!(
                            "app {app} has {waiting} GUARANTEED asks waiting for capacity on this worker, the limit; retry when some are granted"
                        ),
                    ));
                    return;
                }
                let request_id = req.request_id;
                let app_id = app.to_string();
                let counted = app.clone();
                let correlation_id = self.next_correlation;
                self.forward(app, request_id, reply, move |correlation_id| {
                    WorkerToCoordinator::AllocateGuaranteed(AllocateGuaranteed {
                        correlation_id,
                        app_id,
                        allocate: req,
                    })
                });
                if let Some(p) = self.pending.get_mut(&correlation_id) {
                    p.guaranteed_ask = true;
                    p.asked_at = Some(asked_at);
                    p._waiting = Some(WaitingAsk::new(&self.waiting_guaranteed, &counted));
                }
            }
        }
    }
}

impl Handler<Settle> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, _: Settle, _: &mut Context<Self>) {}
}

/// `promote` from an application connection.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PromoteMsg {
    pub app: AppId,
    pub req: Promote,
    pub reply: ConnTx,
    /// Counts in the connection's requests in flight until handled.
    pub in_flight: InFlight,
    /// The container's status on this node, if it is here (see [`PromoteContainer::local_status`]).
    pub local_status: Option<ContainerStatus>,
}

impl Handler<PromoteMsg> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: PromoteMsg, _: &mut Context<Self>) {
        let PromoteMsg {
            app,
            req,
            reply,
            local_status,
            ..
        } = msg;
        let app_id = app.to_string();
        self.forward(app, req.request_id, reply, move |correlation_id| {
            WorkerToCoordinator::Promote(PromoteContainer {
                correlation_id,
                app_id,
                container_id: req.container_id,
                local_status,
            })
        });
    }
}

/// `reserve`, `update_reservation`, `delete_reservation` or `list_reservations` from an
/// application connection: forwarded to the coordinator's guarantor (Morpheus §6), like a
/// GUARANTEED `allocate`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReservationMsg {
    pub app: AppId,
    pub request_id: u64,
    pub op: ReservationOp,
    pub reply: ConnTx,
    /// Counts in the connection's requests in flight until handled.
    pub in_flight: InFlight,
}

impl Handler<ReservationMsg> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: ReservationMsg, _: &mut Context<Self>) {
        let ReservationMsg {
            app,
            request_id,
            op,
            reply,
            ..
        } = msg;
        let app_id = app.to_string();
        self.forward(app, request_id, reply, move |correlation_id| {
            WorkerToCoordinator::Reservation(ReservationCall {
                correlation_id,
                app_id,
                op,
            })
        });
    }
}

/// `explain` from an application connection: forwarded to the coordinator's guarantor, which
/// answers for the app's own waiting 3Sigma jobs of that id.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ExplainMsg {
    pub app: AppId,
    pub request_id: u64,
    pub job_id: String,
    pub reply: ConnTx,
    /// Counts in the connection's requests in flight until handled.
    pub in_flight: InFlight,
}

impl Handler<ExplainMsg> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: ExplainMsg, _: &mut Context<Self>) {
        let ExplainMsg {
            app,
            request_id,
            job_id,
            reply,
            ..
        } = msg;
        let app_id = app.to_string();
        self.forward(app, request_id, reply, move |correlation_id| {
            WorkerToCoordinator::Explain(ExplainCall {
                correlation_id,
                app_id,
                job_id,
            })
        });
    }
}

/// `release` of a container that is not on this node.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseRemote {
    pub app: AppId,
    pub req: Release,
    pub reply: ConnTx,
    /// Counts in the connection's requests in flight until handled.
    pub in_flight: InFlight,
}

impl Handler<ReleaseRemote> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: ReleaseRemote, _: &mut Context<Self>) {
        let ReleaseRemote {
            app, req, reply, ..
        } = msg;
        let id: ContainerId = req.container_id;
        // A grant of ours that no node reported yet: forget it here, and ask the coordinator in
        // case a node took it meanwhile ("unknown" then means nobody did).
        let expires_at_ms = self.shared.clock.now().as_millis() + self.ds.config().token_ttl_ms;
        let unstarted_grant =
            self.issued
                .release_unstarted(self.ds.quotas_mut(), id, &app, expires_at_ms);
        // Without a coordinator that answers, the release is ours alone: acknowledged here (the
        // grant is freed when its token expires), as a retry would find nothing to release.
        if unstarted_grant
            && (!self.shared.connected.get() || !self.shared.coordinator_responsive.get())
        {
            let _ = reply.send(AppResponse::Ack(Ack {
                request_id: req.request_id,
            }));
            return;
        }
        let app_id = app.to_string();
        self.forward_with(
            app,
            req.request_id,
            reply,
            unstarted_grant,
            move |correlation_id| {
                WorkerToCoordinator::Release(ReleaseContainer {
                    correlation_id,
                    app_id,
                    container_id: id,
                })
            },
        );
    }
}

/// The worker joined (or re-joined) the cluster.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SchedulerJoined {
    pub issuer: u32,
    pub issuer_keys: Vec<IssuerNodeKey>,
    pub apps: Vec<AppRecord>,
    pub top_k: usize,
    pub token_ttl_ms: u64,
    pub view: ClusterView,
}

impl Handler<SchedulerJoined> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: SchedulerJoined, _: &mut Context<Self>) {
        let mut ds = DistributedScheduler::new(
            scheduler_core::distributed::DistributedSchedulerConfig {
                top_k: msg.top_k,
                token_ttl_ms: msg.token_ttl_ms,
            },
            msg.issuer,
        );
        if msg.issuer == self.ds.issuer() {
            // Same incarnation (cannot happen with the coordinator's fresh issuers, but keep the counts).
            ds = std::mem::replace(&mut self.ds, ds);
            ds.set_top_k(msg.top_k);
        }
        ds.update_view(msg.view);
        self.shared
            .directory_version
            .set(ds.view().directory_version);
        self.ds = ds;
        self.signer = Some(QueueableSigner::new(msg.issuer, &msg.issuer_keys));
        self.shared.set_apps(msg.apps);
    }
}

/// A heartbeat ack's parts for the scheduler.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ViewUpdate {
    pub view: ClusterView,
    pub notices: Vec<ContainerNotice>,
    /// With a whole directory: the keys for the top-k's nodes, replacing the old ones;
    /// otherwise keys to add or replace (those of top-k nodes new to this scheduler).
    pub issuer_keys: Option<Vec<IssuerNodeKey>>,
    pub apps: Option<Vec<AppRecord>>,
    /// A new k of top-k (an operator's change).
    pub top_k: Option<usize>,
    /// What the other workers' schedulers hold per app (cluster-wide quotas).
    pub outstanding_elsewhere: Vec<scheduler_core::quota::AppOutstanding>,
}

impl Handler<ViewUpdate> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: ViewUpdate, _: &mut Context<Self>) {
        if let Some(k) = msg.top_k {
            self.ds.set_top_k(k);
        }
        let update = self.ds.update_view(msg.view);
        // The version the next heartbeat reports: the one the scheduler's directory is at.
        self.shared
            .directory_version
            .set(self.ds.view().directory_version);
        let mut actions = Vec::new();
        if self.ds.directory_is_partial() {
            // Protocol 9: the directory holds the nodes this scheduler's views named, not every
            // node, so only the departures a delta names end what was issued there (a reset
            // after an unknown version names none: the coordinator routes the `lost` notices of
            // a removed node's reported containers, and grants not yet started expire).
            if let DirectoryUpdate::Patched { left } = &update {
                actions = self.issued.on_nodes_left(self.ds.quotas_mut(), left);
            }
        } else if matches!(
            update,
            DirectoryUpdate::Replaced | DirectoryUpdate::Patched { .. }
        ) {
            let present: Vec<NodeId> = self
                .ds
                .view()
                .directory
                .iter()
                .map(|n| n.node_id.clone())
                .collect();
            actions = self.issued.on_directory(self.ds.quotas_mut(), &present);
        }
        if let (Some(keys), Some(signer)) = (msg.issuer_keys, self.signer.as_mut()) {
            match &update {
                DirectoryUpdate::Replaced => signer.replace_keys(&keys),
                DirectoryUpdate::Patched { left } => signer.patch_keys(&keys, left),
                // Keys for top-k nodes new to this scheduler come with any answer (protocol 6).
                DirectoryUpdate::Unchanged | DirectoryUpdate::Ignored => {
                    signer.patch_keys(&keys, &[])
                }
            }
        }
        if let Some(apps) = msg.apps {
            self.shared.set_apps(apps);
        }
        for n in &msg.notices {
            actions.extend(self.issued.on_notice(self.ds.quotas_mut(), n));
        }
        for action in actions {
            self.act(action);
        }
        self.issued
            .expire(self.ds.quotas_mut(), self.shared.clock.now().as_millis());
        self.ds
            .quotas_mut()
            .set_elsewhere(msg.outstanding_elsewhere);
        self.publish_counts();
    }
}

/// Answers of the coordinator to forwarded requests.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CoordinatorAnswer(pub CoordinatorToWorker);

impl Handler<CoordinatorAnswer> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: CoordinatorAnswer, _: &mut Context<Self>) {
        match msg.0 {
            CoordinatorToWorker::GuaranteedAllocated(g) => {
                let Some(p) = self.pending.get_mut(&g.correlation_id) else {
                    // The ask was cancelled (its connection closed) while these were on their
                    // way: give them back now rather than hold capacity until the tokens expire.
                    debug!(
                        correlation = g.correlation_id,
                        containers = g.containers.len(),
                        "grant for a cancelled ask: releasing it"
                    );
                    self.release_orphaned_grants(&g.containers);
                    return;
                };
                if !g.containers.is_empty() {
                    // Later frames of the same ask are counted; their latency is the first's.
                    let latency = p.asked_at.take().map(|t| t.elapsed());
                    self.shared.metrics.allocated(
                        ContainerType::Guaranteed,
                        g.containers.len(),
                        latency,
                    );
                }
                for c in &g.containers {
                    self.issued.issued(&c.node_id, c.container_id, 0);
                    self.ds.quotas_mut().on_granted(
                        c.container_id,
                        &p.app,
                        ContainerType::Guaranteed,
                        c.token.body.expires_at_ms,
                    );
                }
                let answer = AppResponse::Allocated(Allocated {
                    request_id: p.request_id,
                    containers: g.containers,
                    remaining: g.remaining,
                    unplaced: 0,
                    unplaced_reason: None,
                });
                let _ = p.reply.send(answer);
                if g.remaining == 0 {
                    self.pending.remove(&g.correlation_id);
                }
            }
            CoordinatorToWorker::PromoteResult(r) => {
                if let Some(p) = self.pending.remove(&r.correlation_id) {
                    self.ds.quotas_mut().on_promoted(r.token.body.container_id);
                    let _ = p.reply.send(AppResponse::Promoted(Promoted {
                        request_id: p.request_id,
                        container_id: r.token.body.container_id,
                        token: r.token,
                    }));
                }
            }
            CoordinatorToWorker::Released(r) => {
                if let Some(p) = self.pending.remove(&r.correlation_id) {
                    let _ = p.reply.send(AppResponse::Ack(Ack {
                        request_id: p.request_id,
                    }));
                }
            }
            CoordinatorToWorker::ReservationDone(d) => {
                if let Some(p) = self.pending.remove(&d.correlation_id) {
                    let request_id = p.request_id;
                    let answer = match d.reply {
                        ReservationReply::Accepted {
                            reservation_id,
                            allocation,
                        } => AppResponse::Reservation(ReservationAccepted {
                            request_id,
                            reservation_id,
                            allocation,
                        }),
                        ReservationReply::Deleted => AppResponse::Ack(Ack { request_id }),
                        ReservationReply::Listed { reservations, free } => {
                            AppResponse::Reservations(ReservationList {
                                request_id,
                                reservations,
                                free,
                            })
                        }
                    };
                    let _ = p.reply.send(answer);
                }
            }
            CoordinatorToWorker::Explained(d) => {
                if let Some(p) = self.pending.remove(&d.correlation_id) {
                    let _ = p.reply.send(AppResponse::Explained(Explained {
                        request_id: p.request_id,
                        jobs: d.jobs,
                    }));
                }
            }
            CoordinatorToWorker::ReservationNotice(n) => {
                let frame = match n.event {
                    ReservationNoticeKind::Reprovisioned(e) => {
                        AppResponse::ReservationReprovisioned(e)
                    }
                    ReservationNoticeKind::Cancelled(e) => AppResponse::ReservationCancelled(e),
                };
                self.shared.notify_frame(&AppId::new(n.app_id), frame);
            }
            CoordinatorToWorker::RequestFailed(f) => {
                if let Some(p) = self.pending.remove(&f.correlation_id) {
                    if p.unknown_is_success && f.code == ErrorCode::UnknownContainer {
                        let _ = p.reply.send(AppResponse::Ack(Ack {
                            request_id: p.request_id,
                        }));
                    } else {
                        let _ = p.reply.send(error(p.request_id, f.code, f.message));
                    }
                }
            }
            other => warn!("unexpected frame for the scheduler actor: {other:?}"),
        }
        self.publish_counts();
    }
}

/// An application connection closed. Its GUARANTEED asks still waiting at the coordinator are
/// cancelled there (nobody could receive their grants); grants it already received stay valid
/// until their tokens expire, so the app may reconnect and start them.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ConnectionClosed {
    /// The closed connection's sender (compared by channel identity).
    pub reply: ConnTx,
}

impl Handler<ConnectionClosed> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, msg: ConnectionClosed, _: &mut Context<Self>) {
        let cancelled = self.cancel_waiting_asks(|p| p.reply.same_channel(&msg.reply));
        if !cancelled.is_empty() {
            debug!(
                asks = cancelled.len(),
                "cancelled the waiting GUARANTEED asks of a closed connection"
            );
        }
    }
}

/// The coordinator has not answered for the link's unresponsive limit (the session stands):
/// its waiting GUARANTEED asks are answered `coordinator_unavailable` and cancelled at the
/// coordinator (the cancels reach it when it answers again, after the asks; a grant already on
/// its way is released as an orphan), so an app's retry does not compete with a leftover ask.
/// Other forwarded requests (releases, promotions, reservation calls) stay pending: they take
/// effect when the coordinator gets them, so they are answered then, or failed if the session
/// is given up.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CoordinatorUnresponsive;

impl Handler<CoordinatorUnresponsive> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, _: CoordinatorUnresponsive, _: &mut Context<Self>) {
        for p in self.cancel_waiting_asks(|_| true) {
            let _ = p.reply.send(error(
                p.request_id,
                ErrorCode::CoordinatorUnavailable,
                "the coordinator has not answered this worker for several heartbeats; retry",
            ));
        }
    }
}

/// The cluster link dropped: forwarded requests will not be answered.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LinkDown;

impl Handler<LinkDown> for SchedulerActor {
    type Result = ();
    fn handle(&mut self, _: LinkDown, _: &mut Context<Self>) {
        self.fail_all_pending(
            "the connection to the coordinator was lost before it answered; retry",
        );
    }
}

//! The guarantor actor: owns [`scheduler_core::guarantor::Guarantor`] (central GUARANTEED
//! placement, Mercury §4.2) with the [`QueueableAware`] placer (fed each node's QUEUEABLE load
//! from its heartbeats, so GUARANTEED containers avoid preempting it), signs its grants with the cluster key
//! ring, sends them to the requesting worker's session, and tells the coordinator actor each
//! node's policing limit (§4.3) whenever GUARANTEED bookings change.

use crate::clock::Clock;
use crate::coordinator_actor::{
    CoordinatorActor, PromotionBooked, QueueableLimits, StopGrantOnNode,
};
use crate::session::{SessionId, WorkerTx};
use crate::store::Store;
use actix::prelude::*;
use scheduler_core::guarantor::{
    GuaranteedAsk, GuaranteedPlacement, Guarantor, GuarantorConfig, GuarantorError, QueueableAware,
    QueueableLoad,
};
use scheduler_core::node::ContainerStatus;
use scheduler_core::protocol::app::{ErrorCode, GrantedContainer};
use scheduler_core::protocol::cluster::{
    CoordinatorToWorker, GuaranteedAllocated, Released, RequestFailed,
};
use scheduler_core::token::{GuaranteedSigner, KeyRing};
use scheduler_core::{AppId, ContainerId, ContainerType, NodeId, Resources};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tracing::{debug, error, info, warn};

/// Container sequence numbers reserved per store write: a restart skips at most this many ids,
/// and a grant never waits for a disk write.
pub const SEQ_RESERVATION_BLOCK: u64 = 4096;

/// Where the grants of an ask go.
struct AskRoute {
    session_id: SessionId,
    tx: WorkerTx,
    correlation_id: u64,
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
}

impl GuarantorActor {
    /// Resumes minting after the reserved sequence in the store.
    pub fn new(
        store: Arc<Store>,
        signer: GuaranteedSigner,
        token_ttl_ms: u64,
        clock: Clock,
        coordinator: Addr<CoordinatorActor>,
    ) -> Result<GuarantorActor, crate::store::StoreError> {
        let reserved_seq = store.guarantor_reserved_seq()?;
        let core = Guarantor::new(
            GuarantorConfig { token_ttl_ms },
            Box::new(QueueableAware::default()),
            reserved_seq,
        );
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
        })
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
            let Some(route) = self.routes.get(&ask_key) else {
                continue;
            };
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

    /// Book the GUARANTEED containers a node reports running that the books do not hold.
    fn adopt(&mut self, node_id: &NodeId, containers: &[ContainerStatus]) {
        for c in containers
            .iter()
            .filter(|c| c.container_type == ContainerType::Guaranteed)
        {
            if let Err(e) = self.core.adopt_running(node_id, c) {
                warn!(node = %node_id, container = %c.id, "cannot book a GUARANTEED container the node reports: {e}");
            }
        }
        self.report_limits();
    }

    /// Tell the coordinator the policing limits (Mercury §4.3) that changed: the core tracks
    /// which nodes' bookings changed, so this is O(changes), not O(nodes) per event.
    fn report_limits(&mut self) {
        let changed = self.core.take_changed_limits();
        if !changed.is_empty() {
            self.coordinator.do_send(QueueableLimits(changed));
        }
    }
}

impl Actor for GuarantorActor {
    type Context = Context<Self>;
}

/// A GUARANTEED ask forwarded by a worker (already checked against the app registry).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submit {
    pub session_id: SessionId,
    pub tx: WorkerTx,
    pub correlation_id: u64,
    pub ask: GuaranteedAsk,
}

impl Handler<Submit> for GuarantorActor {
    type Result = ();
    fn handle(&mut self, mut msg: Submit, _: &mut Context<Self>) {
        let ask_key = self.next_ask_key;
        self.next_ask_key += 1;
        msg.ask.ask_key = ask_key;
        match self.core.submit(msg.ask) {
            Ok(()) => {
                self.routes.insert(
                    ask_key,
                    AskRoute {
                        session_id: msg.session_id,
                        tx: msg.tx,
                        correlation_id: msg.correlation_id,
                    },
                );
                self.schedule();
            }
            Err(e) => {
                let code = match e {
                    GuarantorError::LargerThanAnyNode { .. } => ErrorCode::AskTooLarge,
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
        self.adopt(&msg.node_id, &msg.containers);
        self.schedule();
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
        for id in msg.started {
            self.core.on_started(id);
        }
        self.adopt(&msg.node_id, &msg.started_here);
        let mut freed = false;
        for id in msg.finished {
            freed |= self.core.on_finished(id);
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

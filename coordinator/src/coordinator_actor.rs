//! The coordinator actor: owns [`CoordinatorState`] (membership, heartbeats, Mercury §4.2
//! queue-delay aggregation into top-k views, §4.3 shedding threshold, notice routing) and the
//! cluster's token key ring, answers the cluster protocol frames of every worker session, runs
//! the node-timeout sweep and key rotation on a tick, and drives promotions (§3.4) between the
//! requesting worker, the guarantor and the hosting worker.

use crate::clock::Clock;
use crate::config::CoordinatorSettings;
use crate::datadir::new_token_key;
use crate::guarantor_actor::{
    AddNode, BookPromotion, CancelAsk, CancelSession, ContainerEvents, ExpireGrants,
    GuarantorActor, ObserveUsage, ReleaseGrant, RemoveNode, ReportQueueableLoad, SetKeys,
    ShapeIfDue, Submit, UndoPromotion,
};
use crate::guarantor_actor::{ExplainRequest, ReservationRequest};
use crate::metrics::CoordinatorMetrics;
use crate::session::{CloseCode, SessionId, WorkerTx};
use crate::store::{KeyState, Store};
use actix::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use scheduler_core::coordinator::{
    ContainerNotice, CoordinatorConfig, CoordinatorState, Joined, MembershipSent, NodeView,
    NoticeKind,
};
use scheduler_core::distributed::NodeDirectoryEntry;
use scheduler_core::guarantor::{GuaranteedAsk, GuarantorError, QueueableLoad};
use scheduler_core::hosted::{HostedContainers, ReleaseRoute};
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::promotion::{PromotionAction, Promotions};
use scheduler_core::protocol::app::ErrorCode;
use scheduler_core::protocol::cluster::{
    AllocateGuaranteed, AppRecord, ApplyPromotion, CLUSTER_PROTOCOL_VERSION, ClusterSettings,
    CoordinatorToWorker, EncodedMembership, EncodedTopK, Heartbeat, HeartbeatAck, Join,
    JoinAccepted, JoinRejected, PromoteContainer, PromoteResult, PromotionApplied,
    ReleaseContainer, Released, RequestFailed, StopContainerOnNode, WorkerToCoordinator,
};
use scheduler_core::protocol::cluster::{ExplainCall, ReservationCall};
use scheduler_core::token::{GuaranteedSigner, RotationSchedule};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};
use std::collections::HashMap;
use std::sync::Arc;
use tracing::{debug, error, info, warn};

/// A connected worker.
/// How long after its expiry an unstarted GUARANTEED grant stays booked: a node accepts a token
/// until its own clock passes the expiry, so nodes' clocks may lag the coordinator's by up to
/// this much without a grant starting after its capacity was given away (docs/reliability.md).
pub const GRANT_EXPIRY_GRACE_MS: u64 = 30_000;

struct Session {
    session_id: SessionId,
    tx: WorkerTx,
    connection: Option<quinn::Connection>,
    /// Key id of the ring this worker last received.
    keys_sent: u32,
    /// App registry version this worker last received.
    apps_sent: u64,
    /// Top-k setting version this worker last received.
    top_k_sent: u64,
    /// The issuer number of this session: GUARANTEED grants for the node carry it.
    issuer: u32,
    /// The node's per-heartbeat metric series.
    gauges: crate::metrics::NodeGauges,
}

/// Where a promotion's answer goes: the requesting worker's session and its correlation id.
type Requester = (WorkerTx, u64);

pub struct CoordinatorActor {
    settings: CoordinatorSettings,
    state: CoordinatorState,
    /// The loss guard's verdict at the last tick, to log its changes once.
    last_silence: scheduler_core::loss_guard::Silence,
    /// When the last "not listening" warning was logged (ms).
    last_stall_warning_ms: Option<u64>,
    store: Arc<Store>,
    clock: Clock,
    rng: StdRng,
    /// SHA-256 (hex) of the join token; the clear token is not kept.
    join_token_sha256: String,
    keys: KeyState,
    /// Signs promoted (GUARANTEED) tokens; rebuilt at every rotation.
    signer: GuaranteedSigner,
    /// When the keys rotate next.
    rotation: RotationSchedule,
    apps: Vec<AppRecord>,
    apps_version: u64,
    /// Bumped when an operator changes top-k; each session is sent the new k once.
    top_k_version: u64,
    guarantor: Option<Addr<GuarantorActor>>,
    sessions: HashMap<NodeId, Session>,
    session_nodes: HashMap<SessionId, NodeId>,
    /// What each node last reported holding, indexed by container (a container's host for a
    /// promotion or a release in O(1)), and where releases go.
    hosted: HostedContainers,
    /// Policing limits from the guarantor.
    queueable_limits: HashMap<NodeId, Resources>,
    /// Promotions in flight (Mercury §3.4), a sans-IO state machine in scheduler-core.
    promotions: Promotions<Requester>,
    /// Counters and gauges exported at `/metrics` (set by `server::start`).
    pub(crate) metrics: Arc<CoordinatorMetrics>,
    /// Where the dashboard's cluster snapshot is published (with an HTTP port only).
    pub(crate) dashboard: Option<Arc<crate::dashboard::Dashboard>>,
    /// The round's top-k as encoded for the heartbeat answers, with the
    /// [`CoordinatorState::top_k_generation`] it was encoded at.
    encoded_top_k: Option<(u64, EncodedTopK)>,
    /// The membership parts answers carry, encoded once per published directory version and
    /// what the worker is sent, and shared until the next version: at most one whole directory
    /// and one delta per version the change log keeps. Built when first needed in a version,
    /// so it may show changes made before that and not yet published, and not those made
    /// after; the next version's delta lists every such node again with its state then, so a
    /// worker applying it reaches the published membership all the same (test
    /// `directory_deltas::membership_built_once_per_version_still_brings_every_worker_to_the_directory`).
    /// Keyed by every change instead (as before), a join storm rebuilt the whole directory for
    /// nearly every join and answer: 20 % of the coordinator's time at 5,000 nodes.
    /// Since cluster protocol 9 the membership sent is small (the departures, the cluster's
    /// sum; a whole directory is the receiving node's own entry, appended per answer), but the
    /// sum is O(nodes) to build.
    encoded_membership: (u64, HashMap<MembershipSent, EncodedMembership>),
    /// The stored issuer counter: every issuer handed out is below it, and a restarted
    /// coordinator starts there ([`ISSUER_RESERVATION_BLOCK`]).
    issuer_reserved: u32,
    /// A heartbeat wrote the lost-node set since the last tick (a node came back whole): further
    /// removals wait for the tick's write, so a re-join storm costs one synced commit per tick,
    /// not one per node ([`CoordinatorActor::persist_lost_node_removals`]).
    lost_nodes_written_since_tick: bool,
}

/// Issuer prefixes reserved per store write: a join writes the store (a synced redb commit,
/// milliseconds on a disk) only once per this many joins, and a restart skips at most this many
/// issuers (u32: 4 billion). Issue 17: a store commit per join on the actor thread held every
/// heartbeat behind a 10,000-node join storm (docs/benchmarks.md §9).
pub const ISSUER_RESERVATION_BLOCK: u32 = 1024;

/// Answer to [`WorkerJoined`]; the frame itself has been queued on the session already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinOutcome {
    Accepted {
        node_id: NodeId,
        issuer: u32,
        /// Bytes of the answer's directory (most of the answer), for the join pacing.
        answer_bytes: u64,
    },
    Rejected {
        reason: String,
    },
}

impl CoordinatorActor {
    /// Reads the key ring, join token and apps from the store. `seed` feeds top-k tie breaks.
    pub fn new(
        settings: CoordinatorSettings,
        store: Arc<Store>,
        clock: Clock,
        seed: u64,
    ) -> Result<CoordinatorActor, crate::store::StoreError> {
        let issuer_reserved = store.next_issuer()?;
        let mut state = CoordinatorState::new(
            CoordinatorConfig {
                // Views carry more candidates than k: the workers' schedulers choose among the
                // k of least R as updated by their own placements.
                top_k: scheduler_core::distributed::view_size(settings.top_k),
                shedding: settings.shedding,
                min_shedding_threshold_ms: settings.min_shedding_threshold_ms,
                node_timeout: settings.node_timeout,
                // The view's k least-loaded nodes are then always held by a scheduler after
                // an answer (issue 17).
                new_nodes_per_answer: settings.top_k,
                loss_guard: settings.loss_guard(),
            },
            issuer_reserved,
        )
        .with_lost_nodes(store.lost_nodes()?);
        // An operator's drain outlives a restart: the node stays out of top-k when it re-joins.
        for node in store.draining_nodes()? {
            state.set_draining(&node, true);
        }
        let keys = store.key_state()?;
        let corrupted = |message: String| crate::store::StoreError::Corrupted {
            path: store.path().to_path_buf(),
            key: "key_state".into(),
            message,
        };
        state
            .set_token_master(keys.ring.current.clone())
            .map_err(|e| corrupted(e.to_string()))?;
        let rotation =
            RotationSchedule::new(settings.key_rotation.as_millis() as u64, keys.rotated_at_ms);
        let signer = keys
            .guaranteed
            .as_ref()
            .ok_or_else(|| "no GUARANTEED signing keys (start through `coordinator::start`)".into())
            .and_then(|seeds| GuaranteedSigner::new(seeds).map_err(|e| e.to_string()))
            .map_err(corrupted)?;
        let promotions =
            Promotions::new(settings.node_timeout, settings.token_ttl.as_millis() as u64);
        Ok(CoordinatorActor {
            signer,
            rotation,
            state,
            last_silence: scheduler_core::loss_guard::Silence::Normal,
            last_stall_warning_ms: None,
            join_token_sha256: store.join_token_sha256()?,
            keys,
            apps: store.apps()?,
            apps_version: 1,
            top_k_version: 1,
            store,
            clock,
            rng: StdRng::seed_from_u64(seed),
            settings,
            guarantor: None,
            sessions: HashMap::new(),
            session_nodes: HashMap::new(),
            hosted: HostedContainers::default(),
            queueable_limits: HashMap::new(),
            promotions,
            metrics: Arc::default(),
            dashboard: None,
            issuer_reserved,
            encoded_top_k: None,
            encoded_membership: (0, HashMap::new()),
            lost_nodes_written_since_tick: false,
        })
    }

    fn guarantor(&self) -> &Addr<GuarantorActor> {
        self.guarantor
            .as_ref()
            .expect("guarantor address is set before the actor starts")
    }

    fn cluster_settings(&self) -> ClusterSettings {
        ClusterSettings {
            top_k: self.settings.top_k,
            token_ttl_ms: self.settings.token_ttl.as_millis() as u64,
            heartbeat_interval_ms: self.settings.heartbeat_interval.as_millis() as u64,
        }
    }

    fn app(&self, app_id: &str) -> Option<&AppRecord> {
        self.apps.iter().find(|a| a.app_id == app_id)
    }

    fn join(&mut self, msg: WorkerJoined) -> JoinOutcome {
        let j = &msg.join;
        let reject = |reason: String| {
            let _ = msg.tx.send(CoordinatorToWorker::JoinRejected(JoinRejected {
                reason: reason.clone(),
            }));
            JoinOutcome::Rejected { reason }
        };
        if j.protocol_version != CLUSTER_PROTOCOL_VERSION {
            return reject(format!(
                "unsupported cluster protocol version {}: this coordinator speaks version {}",
                j.protocol_version, CLUSTER_PROTOCOL_VERSION
            ));
        }
        // Hashes of equal length, compared in constant time.
        let offered = crate::store::join_token_hash(&j.join_token);
        if !constant_time_eq(offered.as_bytes(), self.join_token_sha256.as_bytes()) {
            return reject("bad join token: it does not match the cluster's join-token".into());
        }
        if j.node_id.as_str().is_empty() || j.node_id.as_str().len() > 255 {
            return reject("node_id must be 1 to 255 bytes".into());
        }
        if j.capacity.cpu_millis == 0 || j.capacity.memory_mib == 0 {
            return reject(format!(
                "node capacity must be positive in every dimension, got {}",
                j.capacity
            ));
        }
        if j.app_endpoint.is_empty() {
            return reject("app_endpoint must not be empty".into());
        }
        if let Err(reason) = scheduler_core::protocol::limits::check_node_attributes(&j.attributes)
        {
            return reject(reason);
        }
        if self.state.held_loss(&j.node_id).is_some() {
            // Declared lost, and the store has not recorded it yet: no re-join of a lost node
            // is answered before its loss is stored. No `join_rejected` frame: the worker takes
            // the closed connection as a lost link and joins again after its backoff.
            return JoinOutcome::Rejected {
                reason: format!(
                    "node {} was declared lost and the loss is not stored yet; join again later",
                    j.node_id
                ),
            };
        }
        // The issuer id this join takes is stored as reserved before anything of the join
        // happens: a failure then leaves the node, its old session and its containers as they
        // were (before, the node was removed after the fact, which reported its containers
        // `lost` without declaring it lost and left the guarantor booking it).
        if let Err(e) = self.reserve_issuers() {
            error!("cannot persist the issuer counter: {e}");
            return reject(format!("coordinator store failure: {e}"));
        }
        let now = self.clock.now();
        let node_id = j.node_id.clone();
        if let Some(old) = self.sessions.remove(&node_id) {
            info!(node = %node_id, "a new join replaces the node's previous session");
            self.session_nodes.remove(&old.session_id);
            if let Some(c) = old.connection {
                CloseCode::Replaced.close(&c, "replaced by a newer session of the same node");
            }
            self.guarantor().do_send(CancelSession {
                session_id: old.session_id,
            });
        }
        // A node that was declared lost had its containers reported `lost` to their apps: lost
        // means gone, so it kills whatever of them it still runs instead of re-adopting them.
        let Joined {
            issuer,
            lost_containers,
            node_secret,
        } = self.state.join_with(
            now,
            NodeDirectoryEntry {
                node_id: node_id.clone(),
                rack: j.rack.clone(),
                capacity: j.capacity,
                app_endpoint: j.app_endpoint.clone(),
                slot: 0,
            },
            &j.containers,
        );
        let containers: Vec<ContainerStatus> = if lost_containers.is_empty() {
            j.containers.clone()
        } else {
            Vec::new()
        };
        self.hosted.report(&node_id, containers.clone());
        self.guarantor().do_send(AddNode {
            node_id: node_id.clone(),
            rack: j.rack.clone(),
            capacity: j.capacity,
            endpoint: j.app_endpoint.clone(),
            containers,
            epoch: issuer,
            attributes: j.attributes.clone(),
        });
        if !lost_containers.is_empty() {
            warn!(node = %node_id, count = lost_containers.len(), "re-joined after being declared lost: its containers are killed");
        }
        let top_k_slots = self
            .state
            .round(now, self.settings.heartbeat_interval, &mut self.rng)
            .top_k_on_wire();
        let Some(node_secret) = node_secret else {
            // The master key was checked at start; this cannot happen, but never admit a node
            // that could not check its tokens.
            error!(node = %node_id, "no QUEUEABLE session secret for the join");
            // Joined and handed to the guarantor already: declared lost, so nothing of it is
            // left half-removed (its containers are reported lost and killed at its re-join).
            self.lose_nodes(
                vec![node_id],
                "the coordinator had no session secret for its join",
            );
            return reject("coordinator key failure: no session secret".into());
        };
        // The membership of a join answer, shared with the other joins and answers of this
        // version: the cluster's sum and the node's own entry (protocol 9); the entries of its
        // view's nodes come with their keys.
        let (
            NodeView {
                mut view,
                issuer_keys,
            },
            sent,
        ) = self.state.node_view_parts(&node_id, 0, Vec::new());
        view.top_k_slots = top_k_slots;
        let membership = match self.shared_membership(&node_id, sent) {
            Ok(Some(m)) => m,
            Ok(None) | Err(_) => {
                error!(node = %node_id, ?sent, "cannot encode the directory for a join answer");
                // As above: declared lost rather than left half-removed.
                self.lose_nodes(
                    vec![node_id],
                    "the coordinator could not encode its join answer",
                );
                return reject("coordinator encoding failure: the directory".into());
            }
        };
        // What the answer's size is made of (protocol 9): the membership (the cluster's sum and
        // the node's own entry), the entries of its view's nodes and their keys; the rest is a
        // few hundred bytes whatever the cluster's size.
        let answer_bytes = (membership.encoded_len()
            + view.entries.iter().map(entry_wire_bytes).sum::<usize>()
            + issuer_keys.as_ref().map_or(0, |keys| {
                keys.iter()
                    .map(|k| k.node_id.as_str().len() + ISSUER_KEY_WIRE_OVERHEAD)
                    .sum()
            })) as u64;
        let _ = msg.tx.send_join_accepted(
            JoinAccepted {
                protocol_version: CLUSTER_PROTOCOL_VERSION,
                issuer,
                node_secret,
                issuer_keys: issuer_keys.unwrap_or_default(),
                guaranteed_keys: self.signer.public_ring(),
                apps: self.apps.clone(),
                settings: self.cluster_settings(),
                view,
                lost_containers,
            },
            membership,
        );
        self.metrics.nodes_joined.inc();
        info!(node = %node_id, issuer, rack = %j.rack, capacity = %j.capacity, containers = j.containers.len(), "worker joined");
        self.sessions.insert(
            node_id.clone(),
            Session {
                session_id: msg.session_id,
                tx: msg.tx,
                connection: msg.connection,
                keys_sent: self.keys.ring.current.key_id,
                apps_sent: self.apps_version,
                top_k_sent: self.top_k_version,
                issuer,
                gauges: self.metrics.node_gauges(&node_id),
            },
        );
        self.session_nodes.insert(msg.session_id, node_id.clone());
        // Promotions sent in the node's previous session are settled from this report (their
        // answers went with that session; docs/reliability.md "A promotion gives its booking
        // back"). A node that had been lost has none left: its loss refused them.
        let settled = self.promotions.host_rejoined(&node_id, &j.containers);
        self.run_promotion(settled);
        JoinOutcome::Accepted {
            node_id,
            issuer,
            answer_bytes,
        }
    }

    /// Keep the stored issuer counter above every issuer handed out, the one the next join
    /// takes included (called before the join): written once per [`ISSUER_RESERVATION_BLOCK`]
    /// joins, not at every join.
    fn reserve_issuers(&mut self) -> Result<(), crate::store::StoreError> {
        // After the next join takes `next_issuer`, the counter is one past it.
        let next = self.state.next_issuer().saturating_add(1);
        if next <= self.issuer_reserved {
            return Ok(());
        }
        let reserved = next.saturating_add(ISSUER_RESERVATION_BLOCK);
        self.store.set_next_issuer(reserved)?;
        self.issuer_reserved = reserved;
        Ok(())
    }

    fn heartbeat(&mut self, node_id: &NodeId, mut hb: Heartbeat) {
        let now = self.clock.now();
        self.state
            .screen_report(node_id, &mut hb.containers, &mut hb.started);
        self.persist_lost_node_removals();
        let ids = hb.containers.iter().map(|c| c.id).collect();
        if !self.state.heartbeat(now, node_id, hb.queue_delay, ids) {
            return;
        }
        self.metrics.node_heartbeat(
            self.sessions.get(node_id).map(|s| &s.gauges),
            hb.queue_delay.total_ms(),
            hb.queued,
            hb.running,
        );
        self.guarantor().do_send(ReportQueueableLoad {
            node_id: node_id.clone(),
            load: QueueableLoad::from_statuses(&hb.containers),
        });
        if self.settings.shaping.is_some() {
            let usage: Vec<(ContainerId, Resources)> = hb
                .containers
                .iter()
                .filter(|c| {
                    c.container_type == ContainerType::Guaranteed
                        && c.placement == Placement::Running
                })
                .filter_map(|c| c.usage.map(|u| (c.id, u)))
                .collect();
            if !usage.is_empty() {
                self.guarantor().do_send(ObserveUsage(usage));
            }
        }
        // The node's status of each GUARANTEED container it started: the guarantor books one its
        // books do not hold (started in the window of a re-join), so they follow the node.
        let started_here: Vec<ContainerStatus> = if hb.started.iter().any(|id| id.issuer() == 0) {
            let started: std::collections::HashSet<ContainerId> = hb
                .started
                .iter()
                .copied()
                .filter(|id| id.issuer() == 0)
                .collect();
            hb.containers
                .iter()
                .filter(|c| started.contains(&c.id))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        self.hosted.report(node_id, hb.containers);
        let mut guarantor_started = Vec::new();
        for id in hb.started {
            if id.issuer() == 0 {
                guarantor_started.push(id);
            } else {
                self.state.route_notice(ContainerNotice {
                    container_id: id,
                    node_id: node_id.clone(),
                    kind: NoticeKind::Started,
                });
            }
        }
        for &id in &hb.finished {
            if id.issuer() != 0 {
                self.state.route_notice(ContainerNotice {
                    container_id: id,
                    node_id: node_id.clone(),
                    kind: NoticeKind::Finished,
                });
            }
        }
        if !guarantor_started.is_empty() || !hb.finished.is_empty() {
            // Every finish goes to the guarantor too: promoted containers of any issuer hold
            // GUARANTEED bookings there (on_finished is idempotent for the others).
            self.guarantor().do_send(ContainerEvents {
                node_id: node_id.clone(),
                started: guarantor_started,
                started_here,
                finished: hb.finished,
            });
        }
        // At most one entry per registered app (a worker cannot grow the coordinator's state).
        let mut issued = hb.issued;
        issued.truncate(self.apps.len());
        self.state.report_issued(node_id, issued);
        // Top-k, the threshold and the per-app totals are aggregated once per round (O(nodes)),
        // not per heartbeat.
        self.state
            .round(now, self.settings.heartbeat_interval, &mut self.rng);
        let round = self.state.aggregate_round();
        let threshold = round.shedding_threshold_ms;
        // Off (no threshold) reads as 0 ms.
        self.metrics
            .shedding_threshold_ms
            .set(threshold.unwrap_or(0.0));
        // Only an outlier of the round is asked to shed (Mercury §6.3).
        let shedding_target = round.shedding_target_for(node_id);
        let outstanding_elsewhere = self.state.outstanding_elsewhere(node_id, round);
        // The round's top-k is the same in every answer until it changes: encoded once per
        // change and shared (the answer's own view carries an empty list, not read).
        let generation = self.state.top_k_generation();
        let top_k = match &self.encoded_top_k {
            Some((g, encoded)) if *g == generation => encoded.clone(),
            _ => match EncodedTopK::encode(&round.top_k_on_wire()) {
                Ok(encoded) => {
                    self.encoded_top_k = Some((generation, encoded.clone()));
                    encoded
                }
                Err(e) => {
                    error!("cannot encode the round's top-k: {e}");
                    return;
                }
            },
        };
        let (NodeView { view, issuer_keys }, sent) =
            self.state
                .node_view_parts(node_id, hb.directory_version, Vec::new());
        let membership = match self.shared_membership(node_id, sent) {
            Ok(m) => m,
            Err(e) => {
                error!("cannot encode the directory for an answer: {e}");
                return;
            }
        };
        let notices = self.state.take_notices_for(node_id);
        let limit = self
            .queueable_limits
            .get(node_id)
            .copied()
            .or_else(|| self.state.node(node_id).map(|n| n.capacity));
        let key_id = self.keys.ring.current.key_id;
        let Some(session) = self.sessions.get_mut(node_id) else {
            return;
        };
        let guaranteed_keys = (session.keys_sent != key_id).then(|| self.signer.public_ring());
        session.keys_sent = key_id;
        let apps = (session.apps_sent != self.apps_version).then(|| self.apps.clone());
        session.apps_sent = self.apps_version;
        let top_k_setting =
            (session.top_k_sent != self.top_k_version).then_some(self.settings.top_k);
        session.top_k_sent = self.top_k_version;
        let ack = HeartbeatAck {
            view,
            shedding_threshold_ms: shedding_target,
            queueable_limit: limit.unwrap_or_default(),
            notices,
            issuer_keys,
            guaranteed_keys,
            apps,
            top_k: top_k_setting,
            outstanding_elsewhere,
        };
        let _ = session.tx.send_heartbeat_ack(ack, top_k, membership);
    }

    /// The membership part of an answer (or of a join answer: `Whole`), built and encoded
    /// once per published version and what is sent, and shared by every answer that sends the
    /// same until the next version (issue 17: in a join storm every answer carries the round's
    /// joins and every join answer the whole directory; built per answer that was O(nodes²)
    /// copies). What [`CoordinatorState::wire_membership`] gave when it was first needed in
    /// this version (see `encoded_membership`).
    ///
    /// A whole directory (protocol 9: empty) gets `node`'s own entry appended
    /// ([`EncodedMembership::with_own`]): its worker must find its own node in its directory.
    fn shared_membership(
        &mut self,
        node: &NodeId,
        sent: MembershipSent,
    ) -> Result<Option<EncodedMembership>, scheduler_core::codec::CodecError> {
        let from_version = match sent {
            MembershipSent::Nothing => return Ok(None),
            MembershipSent::Whole => 0,
            MembershipSent::DeltaFrom(v) => v,
        };
        let version = self.state.directory_version();
        if self.encoded_membership.0 != version {
            self.encoded_membership = (version, HashMap::new());
        }
        let encoded = match self.encoded_membership.1.get(&sent) {
            Some(m) => m.clone(),
            None => {
                let built = EncodedMembership::encode(&self.state.wire_membership(from_version))?;
                self.encoded_membership.1.insert(sent, built.clone());
                built
            }
        };
        if sent == MembershipSent::Whole
            && let Some(own) = self.state.node(node)
        {
            return Ok(Some(encoded.with_own(own)?));
        }
        Ok(Some(encoded))
    }

    fn fail(tx: &WorkerTx, correlation_id: u64, code: ErrorCode, message: String) {
        debug!(correlation_id, ?code, "request failed: {message}");
        let _ = tx.send(CoordinatorToWorker::RequestFailed(RequestFailed {
            correlation_id,
            code,
            message,
        }));
    }

    fn allocate_guaranteed(
        &mut self,
        session_id: SessionId,
        tx: WorkerTx,
        m: AllocateGuaranteed,
        received: std::time::Instant,
    ) {
        if self.app(&m.app_id).is_none() {
            return Self::fail(
                &tx,
                m.correlation_id,
                ErrorCode::BadCredentials,
                format!("app {:?} is not registered with the coordinator", m.app_id),
            );
        }
        let a = m.allocate;
        self.guarantor().do_send(Submit {
            session_id,
            tx,
            received,
            correlation_id: m.correlation_id,
            ask: GuaranteedAsk {
                ask_key: 0,
                app_id: AppId::new(m.app_id),
                resources: a.resources,
                count: a.count,
                priority: a.priority,
                locality: a.locality,
                runtime_estimate_ms: a.runtime_estimate_ms,
                job_id: JobId::new(a.job_id),
                job_submit_time_ms: a.job_submit_time_ms,
                role: a.role,
                allow_shaping: a.allow_shaping,
            },
            reservation_id: a.reservation_id,
            job: a.job,
        });
    }

    /// Whether `app_id` is registered; if not, request `correlation_id` is failed with
    /// `bad_credentials`.
    fn registered_or_fail(&self, tx: &WorkerTx, correlation_id: u64, app_id: &str) -> bool {
        if self.app(app_id).is_some() {
            return true;
        }
        Self::fail(
            tx,
            correlation_id,
            ErrorCode::BadCredentials,
            format!("app {app_id:?} is not registered with the coordinator"),
        );
        false
    }

    /// A reservation request (Morpheus §6) of a registered app, for the guarantor.
    fn reservation(&mut self, session_id: SessionId, tx: WorkerTx, call: ReservationCall) {
        if self.registered_or_fail(&tx, call.correlation_id, &call.app_id) {
            self.guarantor().do_send(ReservationRequest {
                session_id,
                tx,
                call,
            });
        }
    }

    /// An app's `explain` of its waiting 3Sigma job, for the guarantor.
    fn explain(&mut self, tx: WorkerTx, call: ExplainCall) {
        if self.registered_or_fail(&tx, call.correlation_id, &call.app_id) {
            self.guarantor().do_send(ExplainRequest { tx, call });
        }
    }

    /// A promotion asked through `requester`'s worker. The container is located by the
    /// requester's own report when it hosts it (fresher than any heartbeat), else by the nodes'
    /// last heartbeats; the promotion protocol itself is `scheduler_core::promotion`.
    fn promote(&mut self, requester: &NodeId, tx: WorkerTx, m: PromoteContainer) {
        let located = m
            .local_status
            .clone()
            .filter(|s| s.id == m.container_id)
            .map(|s| (requester.clone(), s))
            .or_else(|| {
                self.hosted
                    .host_of(m.container_id)
                    .map(|(node, status)| (node.clone(), status.clone()))
            });
        let actions = self.promotions.request(
            self.clock.now(),
            (tx, m.correlation_id),
            &m.app_id,
            m.container_id,
            located,
        );
        self.run_promotion(actions);
    }

    /// Carry out what the promotion state machine decided.
    fn run_promotion(&mut self, actions: Vec<PromotionAction<Requester>>) {
        for action in actions {
            match action {
                PromotionAction::Book {
                    promotion_id,
                    container_id,
                    node_id,
                    app_id,
                    resources,
                } => self.guarantor().do_send(BookPromotion {
                    promotion_id,
                    container_id,
                    node_id,
                    app_id,
                    resources,
                }),
                PromotionAction::Undo { container_id } => {
                    self.guarantor().do_send(UndoPromotion { container_id })
                }
                PromotionAction::Apply {
                    promotion_id,
                    host,
                    body,
                } => {
                    let sent = match (self.signer.sign(body), self.sessions.get(&host)) {
                        (Ok(token), Some(s)) => {
                            let _ =
                                s.tx.send(CoordinatorToWorker::ApplyPromotion(ApplyPromotion {
                                    correlation_id: promotion_id,
                                    token: token.clone(),
                                }));
                            Ok(token)
                        }
                        (Err(e), _) => {
                            error!("cannot sign promoted token: {e}");
                            Err(format!("internal error: {e}"))
                        }
                        (_, None) => Err(format!("hosting node {host} is not connected")),
                    };
                    let next = self.promotions.sent(promotion_id, sent);
                    self.run_promotion(next);
                }
                PromotionAction::Succeed {
                    requester: (tx, correlation_id),
                    token,
                } => {
                    let (id, host) = (token.body.container_id, token.body.node_id.clone());
                    self.hosted.promoted(&host, id, token.body.version);
                    self.metrics.promotions.inc();
                    info!(container = %id, node = %host, "container promoted to GUARANTEED");
                    let _ = tx.send(CoordinatorToWorker::PromoteResult(PromoteResult {
                        correlation_id,
                        token,
                    }));
                }
                PromotionAction::Fail {
                    requester: (tx, correlation_id),
                    code,
                    message,
                } => Self::fail(&tx, correlation_id, code, message),
            }
        }
    }

    fn promotion_applied(&mut self, from: &NodeId, m: PromotionApplied) {
        match self.promotions.applied(from, m.correlation_id, m.error) {
            Ok(actions) => self.run_promotion(actions),
            Err(why) => warn!(node = %from, "{why}"),
        }
    }

    fn release(&mut self, tx: WorkerTx, m: ReleaseContainer) {
        match self.hosted.route_release(m.container_id, &m.app_id) {
            ReleaseRoute::StopOnHost(host) => {
                if !self.stop_on_node(&host, m.container_id, m.app_id, None, None) {
                    return Self::fail(
                        &tx,
                        m.correlation_id,
                        ErrorCode::CoordinatorUnavailable,
                        format!("hosting node {host} is not connected; retry"),
                    );
                }
                let _ = tx.send(CoordinatorToWorker::Released(Released {
                    correlation_id: m.correlation_id,
                }));
            }
            ReleaseRoute::NotTheAppsContainer => Self::fail(
                &tx,
                m.correlation_id,
                ErrorCode::UnknownContainer,
                format!(
                    "container {} is not a container of app {}",
                    m.container_id, m.app_id
                ),
            ),
            ReleaseRoute::UnstartedGuaranteedGrant => self.guarantor().do_send(ReleaseGrant {
                container_id: m.container_id,
                app_id: AppId::new(m.app_id),
                tx,
                correlation_id: m.correlation_id,
            }),
            ReleaseRoute::Unknown => Self::fail(
                &tx,
                m.correlation_id,
                ErrorCode::UnknownContainer,
                format!(
                    "container {} is not reported by any node and is not a GUARANTEED grant",
                    m.container_id
                ),
            ),
        }
    }

    /// Nodes are lost: each is declared lost in the state (its containers' `lost` notices are
    /// queued for their issuers, to leave with the issuers' next heartbeat answers), then the
    /// lost-node set is written to the store ONCE for the whole batch, and only then does
    /// anything about the losses leave this actor (the guarantor drops the bookings, the
    /// sessions are closed, promotions refused). Issue 17: one synced commit per lost node on
    /// this thread made a storm of 1,000 losses in one tick cost 1,000 fsyncs. Nothing of a loss
    /// reaches an app or the node itself before the loss is stored ("lost means gone",
    /// docs/reliability.md): notices go out only with later heartbeat answers, and a closed
    /// session's re-join is a later message.
    fn lose_nodes(&mut self, nodes: Vec<NodeId>, why: &str) {
        if nodes.is_empty() {
            return;
        }
        let declared: Vec<(NodeId, usize)> = nodes
            .into_iter()
            .map(|node_id| {
                let lost = self.state.declare_lost(&node_id);
                (node_id, lost.len())
            })
            .collect();
        if !self.persist_lost_nodes() {
            // Not stored: nothing of these losses may leave yet. Their `lost` notices and
            // everything `after_loss` does wait for a write that succeeds (retried every tick);
            // a crash before it forgets the losses, and nobody was told of them.
            for (node_id, containers) in &declared {
                warn!(node = %node_id, containers, "node lost: {why}; not announced until the loss is stored");
            }
            // Silent: no new GUARANTEED work there meanwhile (their bookings stay).
            self.guarantor()
                .do_send(crate::guarantor_actor::SetNodesUnreachable {
                    nodes: declared.iter().map(|(n, _)| n.clone()).collect(),
                    unreachable: true,
                });
            self.state.hold_losses(
                declared
                    .into_iter()
                    .map(|(node_id, _)| (node_id, why.to_string()))
                    .collect(),
            );
            self.metrics
                .losses_not_stored
                .set(self.state.held_loss_count() as i64);
            return;
        }
        for (node_id, containers) in declared {
            warn!(node = %node_id, containers, "node lost: {why}");
            self.after_loss(&node_id, why);
        }
    }

    /// The losses that could not be stored when declared are stored now: let out what was
    /// held back (their `lost` notices, and the rest of [`CoordinatorActor::after_loss`]).
    fn release_stored_losses(&mut self) {
        // None of them re-joined meanwhile: their joins are refused until now (`join`).
        let released = self.state.release_held_losses();
        self.metrics.losses_not_stored.set(0);
        for (node_id, why) in released {
            warn!(node = %node_id, "node lost: {why}; the loss is stored now");
            self.after_loss(&node_id, &why);
        }
    }

    /// What follows a node's loss once it is stored: bookings dropped, session closed, its
    /// promotions refused.
    fn after_loss(&mut self, node_id: &NodeId, why: &str) {
        self.metrics.nodes_lost.inc();
        self.metrics.forget_node(node_id);
        self.hosted.forget_node(node_id);
        self.queueable_limits.remove(node_id);
        self.guarantor().do_send(RemoveNode {
            node_id: node_id.clone(),
        });
        if let Some(s) = self.sessions.remove(node_id) {
            self.session_nodes.remove(&s.session_id);
            self.guarantor().do_send(CancelSession {
                session_id: s.session_id,
            });
            if let Some(c) = s.connection {
                CloseCode::NodeLost.close(&c, why);
            }
        }
        let refused = self.promotions.host_lost(node_id);
        self.run_promotion(refused);
    }

    /// Persist the lost-node set if it changed (one synced store commit). False when the write
    /// failed: the set is kept in memory (this incarnation still kills a lost node's containers
    /// on re-join) and written again at the next tick, and losses held back until stored stay
    /// held.
    fn persist_lost_nodes(&mut self) -> bool {
        let Some(lost) = self.state.take_lost_nodes_if_changed() else {
            return true;
        };
        self.metrics.lost_node_writes.inc();
        if let Err(e) = self.store.set_lost_nodes(lost) {
            error!("cannot persist the lost nodes: {e}");
            self.state.lost_nodes_not_saved();
            return false;
        }
        self.release_stored_losses();
        true
    }

    /// After a heartbeat: a node that came back whole after being declared lost leaves the
    /// stored set at once if no heartbeat has written it since the last tick; otherwise at the
    /// next tick (with every other node back whole by then). Only nodes back whole leave the
    /// set here (losses are written by the tick that declares them, before anything about them
    /// leaves this actor; a loss whose write failed is held until a write, possibly this one,
    /// succeeds), and a stale entry errs on the safe side: a restarted coordinator
    /// would have the node kill, at its next re-join, what it started since (reason `lost`,
    /// told to the apps). So outside storms a removal is stored as soon as before (at the
    /// first heartbeat without the killed containers), and in a storm of re-joins the entries
    /// leave the store within one tick interval, in one commit per tick instead of one per node.
    fn persist_lost_node_removals(&mut self) {
        if self.lost_nodes_written_since_tick {
            return;
        }
        if self.state.lost_nodes_changed() {
            self.persist_lost_nodes();
            self.lost_nodes_written_since_tick = true;
        }
    }

    /// Stop a container at its node on the app's behalf; for a GUARANTEED grant released before
    /// its node reported it, also revoke its token there until `revoke_until_ms`.
    fn stop_on_node(
        &self,
        node_id: &NodeId,
        container_id: ContainerId,
        app_id: String,
        revoke_until_ms: Option<u64>,
        shaped_preemption: Option<scheduler_core::shaper::PreemptionReason>,
    ) -> bool {
        match self.sessions.get(node_id) {
            Some(s) => {
                let _ =
                    s.tx.send(CoordinatorToWorker::StopContainer(StopContainerOnNode {
                        container_id,
                        app_id,
                        revoke_until_ms,
                        shaped_preemption,
                    }));
                true
            }
            None => false,
        }
    }

    /// What the loss guard held this tick ([`scheduler_core::loss_guard`]): a coordinator that
    /// was not listening does not blame its nodes, and nodes held silent get no new GUARANTEED
    /// work until they are heard again or declared lost (their bookings stay either way).
    fn guard_losses(&mut self, due: &scheduler_core::coordinator::LossesDue) {
        use scheduler_core::loss_guard::Silence;
        if !due.deaf_for.is_zero() {
            self.metrics.own_stalls.inc();
            // At most one warning per 10 s: a coordinator overloaded for long would otherwise
            // warn at every tick.
            let now_ms = self.clock.now_ms();
            let deaf_ms = due.deaf_for.as_millis() as u64;
            if self
                .last_stall_warning_ms
                .is_none_or(|at| now_ms.saturating_sub(at) >= 10_000)
            {
                self.last_stall_warning_ms = Some(now_ms);
                warn!(
                    deaf_ms,
                    stalls = self.state.own_stalls(),
                    "the coordinator was not listening (paused, frozen, overloaded or blocked): that time is not counted against any node's silence"
                );
            } else {
                debug!(deaf_ms, "the coordinator was not listening");
            }
        }
        if due.silence != self.last_silence {
            match due.silence {
                Silence::Normal => {
                    info!("silence back to normal: silent nodes are declared lost again")
                }
                Silence::Mass { silent, nodes } => warn!(
                    silent,
                    nodes,
                    "most nodes silent at once: presuming the coordinator's or the network's fault, declaring them lost at {}/s",
                    self.settings.declarations_per_s_in_mass_silence
                ),
                Silence::Total { silent } => warn!(
                    silent,
                    "every node silent: presuming the coordinator's or the network's fault, declaring none lost"
                ),
            }
            self.last_silence = due.silence;
        }
        for (nodes, unreachable) in [(&due.newly_held, true), (&due.heard_again, false)] {
            if !nodes.is_empty() {
                self.guarantor()
                    .do_send(crate::guarantor_actor::SetNodesUnreachable {
                        nodes: nodes.clone(),
                        unreachable,
                    });
            }
        }
        self.metrics.losses_held_by_guard.set(due.held as i64);
        let extensions = self.state.loss_grace_extensions();
        let counted = self.metrics.loss_grace_extensions.get();
        if extensions > counted {
            self.metrics
                .loss_grace_extensions
                .inc_by(extensions - counted);
        }
    }

    fn tick(&mut self) {
        let now = self.clock.now();
        self.publish_dashboard(now);
        let due = self.state.losses_due(now);
        self.guard_losses(&due);
        let why = format!(
            "silent for more than {} ms",
            self.settings.node_timeout.as_millis()
        );
        // Every node lost in this tick, and every node back whole whose removal a heartbeat
        // left for the tick (or a write that failed), in one store commit.
        self.lose_nodes(due.declare, &why);
        self.persist_lost_nodes();
        self.lost_nodes_written_since_tick = false;
        let now_ms = now.as_millis();
        if self.rotation.due(now_ms)
            && let Err(e) = self.rotate_keys(now_ms)
        {
            error!("key rotation skipped, retried in a minute: {e}");
            self.rotation.failed(now_ms);
        }
        // A node accepts a token until its own clock passes the expiry: the booking is kept a
        // grace period longer so a node whose clock lags ours cannot start a grant whose
        // capacity was already given to another.
        self.guarantor().do_send(ExpireGrants {
            now_ms: now_ms.saturating_sub(GRANT_EXPIRY_GRACE_MS),
        });
        if self.settings.shaping.is_some() {
            self.guarantor().do_send(ShapeIfDue);
        }
        let stale = self.promotions.expire(now);
        self.run_promotion(stale);
    }

    /// New master and GUARANTEED keys under the next id, saved before use (never sign with a
    /// key that would not survive a restart). Sessions joining from now on derive their
    /// QUEUEABLE secrets from the new master; nodes get the new GUARANTEED public keys with their
    /// next heartbeat answer and keep accepting the previous one.
    /// While someone watches the dashboard: this actor's snapshot, and the guarantor's asked for.
    fn publish_dashboard(&mut self, now: scheduler_core::Time) {
        let Some(dashboard) = &self.dashboard else {
            return;
        };
        if !dashboard.take_watched() {
            return;
        }
        dashboard.publish_cluster(crate::dashboard::cluster_snapshot(
            now,
            &self.state,
            self.state.shedding_threshold_ms(),
            &self.hosted,
            &self.apps,
        ));
        if let Some(g) = &self.guarantor {
            g.do_send(crate::guarantor_actor::PublishDashboard);
        }
    }

    fn rotate_keys(&mut self, now_ms: u64) -> Result<(), String> {
        let next_id = RotationSchedule::next_key_id(self.keys.ring.current.key_id);
        let mut next = self.keys.clone();
        next.ring
            .rotate(new_token_key(next_id).map_err(|e| e.to_string())?);
        let mut seeds = next
            .guaranteed
            .clone()
            .ok_or("no GUARANTEED signing keys")?;
        seeds.rotate(new_token_key(next_id).map_err(|e| e.to_string())?);
        let signer = GuaranteedSigner::new(&seeds).map_err(|e| e.to_string())?;
        next.guaranteed = Some(seeds.clone());
        next.rotated_at_ms = now_ms;
        self.store
            .save_key_state(&next)
            .map_err(|e| format!("cannot persist the new key: {e}"))?;
        self.state
            .set_token_master(next.ring.current.clone())
            .map_err(|e| e.to_string())?;
        self.keys = next;
        self.signer = signer;
        self.rotation.rotated(now_ms);
        info!(key_id = next_id, "token keys rotated");
        self.guarantor().do_send(SetKeys(seeds));
        Ok(())
    }
}

/// Constant-time comparison for secrets.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Actor for CoordinatorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The first silence check measures the coordinator's own pauses from here: a pause
        // before the first tick is no less the coordinator's.
        self.state.start_silence_checks(self.clock.now());
        ctx.run_interval(self.settings.tick_interval, |act, _| act.tick());
    }
}

/// Wire the guarantor in (done once, before any session connects).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetGuarantor(pub Addr<GuarantorActor>);

impl Handler<SetGuarantor> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, msg: SetGuarantor, _: &mut Context<Self>) {
        self.guarantor = Some(msg.0);
    }
}

/// The first frame of a session was a `join`.
#[derive(Message)]
#[rtype(result = "JoinOutcome")]
pub struct WorkerJoined {
    pub session_id: SessionId,
    pub join: Join,
    pub tx: WorkerTx,
    pub connection: Option<quinn::Connection>,
}

impl Handler<WorkerJoined> for CoordinatorActor {
    type Result = MessageResult<WorkerJoined>;
    fn handle(&mut self, msg: WorkerJoined, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.join(msg))
    }
}

/// A frame after the join.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FromWorker {
    pub session_id: SessionId,
    pub msg: WorkerToCoordinator,
    /// The session's place in the actor's mailbox, given back when the frame is handled
    /// (dropped with the message): a worker cannot queue more than
    /// [`crate::session::WORKER_FRAMES_IN_FLIGHT`] frames ahead of the actor.
    pub in_flight: tokio::sync::OwnedSemaphorePermit,
    /// When the session decoded the frame: the start of a GUARANTEED ask's time in the
    /// coordinator (`coordinator_guaranteed_grant_seconds`).
    pub received: std::time::Instant,
}

impl Handler<FromWorker> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: FromWorker, _: &mut Context<Self>) {
        let Some(node_id) = self.session_nodes.get(&m.session_id).cloned() else {
            debug!(
                session = m.session_id,
                "frame from a replaced or lost session ignored"
            );
            return;
        };
        let Some(tx) = self.sessions.get(&node_id).map(|s| s.tx.clone()) else {
            return;
        };
        // A node declared lost whose loss is held (not stored yet) keeps its session until the
        // loss is stored, but gets nothing new: its asks, promotions and reservation calls are
        // refused (freeing, releases and exits still go through).
        if let Some((correlation_id, why)) = self.state.refusal_of_new_work(&node_id, &m.msg) {
            return Self::fail(&tx, correlation_id, ErrorCode::CoordinatorUnavailable, why);
        }
        match m.msg {
            WorkerToCoordinator::Join(_) => {
                self.protocol_violation(&node_id, "a second join on one stream")
            }
            WorkerToCoordinator::Heartbeat(hb) => {
                if hb.node_id != node_id {
                    let why = format!(
                        "heartbeat for node {} on the session of node {node_id}",
                        hb.node_id
                    );
                    return self.protocol_violation(&node_id, &why);
                }
                self.heartbeat(&node_id, hb)
            }
            WorkerToCoordinator::GuaranteedFinished(f) => {
                // Guarantor-issued ids only (others are for their issuers, at the heartbeat);
                // the guarantor frees only grants on this node.
                let finished: Vec<ContainerId> = f
                    .finished
                    .into_iter()
                    .filter(|id| id.issuer() == 0)
                    .collect();
                if !finished.is_empty() {
                    self.guarantor().do_send(ContainerEvents {
                        node_id,
                        started: Vec::new(),
                        started_here: Vec::new(),
                        finished,
                    });
                }
            }
            WorkerToCoordinator::AllocateGuaranteed(a) => {
                self.allocate_guaranteed(m.session_id, tx, a, m.received)
            }
            WorkerToCoordinator::Promote(p) => self.promote(&node_id, tx, p),
            WorkerToCoordinator::Release(r) => self.release(tx, r),
            WorkerToCoordinator::PromotionApplied(p) => self.promotion_applied(&node_id, p),
            WorkerToCoordinator::CancelAllocate(c) => self.guarantor().do_send(CancelAsk {
                session_id: m.session_id,
                correlation_id: c.correlation_id,
            }),
            WorkerToCoordinator::Reservation(r) => self.reservation(m.session_id, tx, r),
            WorkerToCoordinator::Explain(e) => self.explain(tx, e),
            WorkerToCoordinator::ContainerResized(r) => match &r.error {
                None => {
                    debug!(node = %node_id, container = %r.container_id, resources = %r.resources, enforced_by = %r.enforced_by, "container resized")
                }
                Some(e) => {
                    warn!(node = %node_id, container = %r.container_id, resources = %r.resources, "resize not applied: {e}")
                }
            },
        }
    }
}

impl CoordinatorActor {
    fn protocol_violation(&mut self, node_id: &NodeId, why: &str) {
        warn!(node = %node_id, "closing worker session: protocol violation: {why}");
        if let Some(s) = self.sessions.get(node_id)
            && let Some(c) = &s.connection
        {
            CloseCode::ProtocolError.close(c, why);
        }
    }
}

/// A session's stream ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SessionClosed {
    pub session_id: SessionId,
}

impl Handler<SessionClosed> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: SessionClosed, _: &mut Context<Self>) {
        if let Some(node) = self.session_nodes.remove(&m.session_id) {
            // The node stays a member until the node timeout: it may re-join at once.
            info!(node = %node, "worker session closed");
            self.state.join_answer_abandoned(&node);
            self.sessions.remove(&node);
            self.guarantor().do_send(CancelSession {
                session_id: m.session_id,
            });
        }
    }
}

/// Run the periodic work now (node-timeout sweep, key rotation, grant expiry) at the clock's time.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Tick;

impl Handler<Tick> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, _: Tick, _: &mut Context<Self>) {
        self.tick();
    }
}

/// From the guarantor: policing limits that changed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct QueueableLimits(pub Vec<(NodeId, Resources)>);

impl Handler<QueueableLimits> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: QueueableLimits, _: &mut Context<Self>) {
        for (node, limit) in m.0 {
            if self.state.issuer_of(&node).is_some() {
                self.queueable_limits.insert(node, limit);
            }
        }
    }
}

/// From the guarantor: a promotion was booked or refused.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PromotionBooked {
    pub promotion_id: u64,
    pub container_id: ContainerId,
    pub result: Result<(), GuarantorError>,
}

/// The guarantor released a GUARANTEED grant on its owner's behalf: stop the container at its
/// node if it started meanwhile, and revoke an unstarted grant's token there.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopGrantOnNode {
    pub node_id: NodeId,
    pub container_id: ContainerId,
    pub app_id: AppId,
    pub revoke_until_ms: Option<u64>,
    /// The shaper's policy preempted it (killed with reason `shaped_preemption`).
    pub shaped_preemption: Option<scheduler_core::shaper::PreemptionReason>,
}

/// From the guarantor, after a shaping pass's resizes and stops: they are queued to the nodes'
/// streams, so the guarantor may now place waiting asks into the freed room.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShapingSent;

impl Handler<ShapingSent> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, _: ShapingSent, _: &mut Context<Self>) {
        self.guarantor()
            .do_send(crate::guarantor_actor::ScheduleWaiting);
    }
}

/// From the guarantor: the shaper resized a running GUARANTEED container (Pace §3.2).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResizeOnNode {
    pub node_id: NodeId,
    pub container_id: ContainerId,
    pub resources: Resources,
}

impl Handler<ResizeOnNode> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: ResizeOnNode, _: &mut Context<Self>) {
        match self.sessions.get(&m.node_id) {
            Some(s) => {
                let _ = s.tx.send(CoordinatorToWorker::ResizeContainer(
                    scheduler_core::protocol::cluster::ResizeContainer {
                        container_id: m.container_id,
                        resources: m.resources,
                    },
                ));
            }
            // Its booking follows the shaped size; the node keeps the old limit until it
            // re-joins (its report then re-books what it holds).
            None => {
                debug!(node = %m.node_id, container = %m.container_id, "resized container's node not connected")
            }
        }
    }
}

impl Handler<StopGrantOnNode> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: StopGrantOnNode, _: &mut Context<Self>) {
        if !self.stop_on_node(
            &m.node_id,
            m.container_id,
            m.app_id.to_string(),
            m.revoke_until_ms,
            m.shaped_preemption,
        ) {
            // Not connected: when it re-joins under a new session the grant is void there anyway.
            debug!(node = %m.node_id, container = %m.container_id, "released grant's node not connected");
        }
    }
}

impl Handler<PromotionBooked> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: PromotionBooked, _: &mut Context<Self>) {
        let sessions = &self.sessions;
        let actions = self.promotions.booked(
            self.clock.now_ms(),
            m.promotion_id,
            m.container_id,
            m.result.map_err(|e| (e.retryable(), e.to_string())),
            |host| sessions.get(host).map_or(0, |s| s.issuer),
        );
        self.run_promotion(actions);
    }
}

/// Register an app while running (workers get the new registry with their next ack).
#[derive(Message)]
#[rtype(result = "Result<crate::datadir::NewApp, crate::datadir::InitError>")]
pub struct AddApp {
    pub app_id: String,
    pub quota: scheduler_core::quota::QueueableQuota,
}

impl Handler<AddApp> for CoordinatorActor {
    type Result = Result<crate::datadir::NewApp, crate::datadir::InitError>;
    fn handle(&mut self, m: AddApp, _: &mut Context<Self>) -> Self::Result {
        let app = crate::datadir::add_app(&self.store, &m.app_id, m.quota)?;
        self.apps = self.store.apps()?;
        self.apps_version += 1;
        Ok(app)
    }
}

/// The cluster as the admin channel reports it (built now, not the dashboard's last snapshot).
#[derive(Message)]
#[rtype(result = "crate::dashboard::ClusterSnapshot")]
pub struct AdminCluster;

impl Handler<AdminCluster> for CoordinatorActor {
    type Result = MessageResult<AdminCluster>;
    fn handle(&mut self, _: AdminCluster, _: &mut Context<Self>) -> Self::Result {
        MessageResult(crate::dashboard::cluster_snapshot(
            self.clock.now(),
            &self.state,
            self.state.shedding_threshold_ms(),
            &self.hosted,
            &self.apps,
        ))
    }
}

/// Start or end draining a node (the operator's `node drain`): out of top-k here, no new
/// GUARANTEED work at the guarantor. `Ok(changed)`; an error for a node that is not joined
/// (unless it is being undrained).
#[derive(Message)]
#[rtype(result = "Result<bool, String>")]
pub struct SetDraining {
    pub node: NodeId,
    pub draining: bool,
}

impl Handler<SetDraining> for CoordinatorActor {
    type Result = Result<bool, String>;
    fn handle(&mut self, m: SetDraining, _: &mut Context<Self>) -> Self::Result {
        if m.draining && self.state.node(&m.node).is_none() {
            return Err(format!("no joined node named {:?}", m.node.as_str()));
        }
        let changed = self.state.set_draining(&m.node, m.draining);
        if changed && let Err(e) = self.store.set_draining_nodes(self.state.draining_nodes()) {
            // Not applied unless saved: a drain that a restart would forget is worse than a
            // refused one the operator can retry.
            self.state.set_draining(&m.node, !m.draining);
            return Err(format!("could not save the drain in the store: {e}"));
        }
        info!(node = %m.node, draining = m.draining, changed, "operator drain");
        self.guarantor()
            .do_send(crate::guarantor_actor::SetNodeDraining {
                node: m.node,
                draining: m.draining,
            });
        Ok(changed)
    }
}

/// Unregister an app while running: its requests are refused from the workers' next ack on;
/// its running containers finish.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct RemoveApp {
    pub app_id: String,
}

impl Handler<RemoveApp> for CoordinatorActor {
    type Result = Result<(), String>;
    fn handle(&mut self, m: RemoveApp, _: &mut Context<Self>) -> Self::Result {
        let removed = self
            .store
            .remove_app(&m.app_id)
            .map_err(|e| e.to_string())?;
        if !removed {
            return Err(format!("no app named {:?}", m.app_id));
        }
        self.apps = self.store.apps().map_err(|e| e.to_string())?;
        self.apps_version += 1;
        info!(app = %m.app_id, "app removed by the operator");
        Ok(())
    }
}

/// Replace an app's QUEUEABLE quota while running (workers get it with their next ack).
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct SetAppQuota {
    pub app_id: String,
    pub quota: scheduler_core::quota::QueueableQuota,
}

impl Handler<SetAppQuota> for CoordinatorActor {
    type Result = Result<(), String>;
    fn handle(&mut self, m: SetAppQuota, _: &mut Context<Self>) -> Self::Result {
        let found = self
            .store
            .set_app_quota(&m.app_id, m.quota)
            .map_err(|e| e.to_string())?;
        if !found {
            return Err(format!("no app named {:?}", m.app_id));
        }
        self.apps = self.store.apps().map_err(|e| e.to_string())?;
        self.apps_version += 1;
        info!(app = %m.app_id, quota = ?m.quota, "app quota changed by the operator");
        Ok(())
    }
}

/// Change k of top-k while running: the views carry more candidates from the next round, and
/// every worker's scheduler adopts k with its next heartbeat ack.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetTopK(pub usize);

impl Handler<SetTopK> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: SetTopK, _: &mut Context<Self>) {
        info!(top_k = m.0, "top-k changed by the operator");
        self.settings.top_k = m.0;
        self.state.config_mut().top_k = scheduler_core::distributed::view_size(m.0);
        self.state.config_mut().new_nodes_per_answer = m.0;
        self.state.invalidate_round();
        self.top_k_version += 1;
    }
}

/// Change the shedding policy while running (from the next aggregation round).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetShedding(pub scheduler_core::coordinator::SheddingPolicy);

impl Handler<SetShedding> for CoordinatorActor {
    type Result = ();
    fn handle(&mut self, m: SetShedding, _: &mut Context<Self>) {
        info!(policy = ?m.0, "shedding policy changed by the operator");
        self.state.config_mut().shedding = m.0;
        self.state.invalidate_round();
    }
}

/// Inspection for tests and operators.
#[derive(Debug, Clone, PartialEq)]
pub struct CoordinatorStats {
    pub nodes: Vec<NodeId>,
    pub sessions: usize,
    pub next_issuer: u32,
    pub key_ids: (u32, Option<u32>),
    pub pending_promotions: usize,
    pub shedding_threshold_ms: Option<f64>,
}

#[derive(Message)]
#[rtype(result = "CoordinatorStats")]
pub struct Inspect;

impl Handler<Inspect> for CoordinatorActor {
    type Result = MessageResult<Inspect>;
    fn handle(&mut self, _: Inspect, _: &mut Context<Self>) -> Self::Result {
        MessageResult(CoordinatorStats {
            nodes: self.state.nodes().map(|n| n.node_id.clone()).collect(),
            sessions: self.sessions.len(),
            next_issuer: self.state.next_issuer(),
            key_ids: (
                self.keys.ring.current.key_id,
                self.keys.ring.previous.as_ref().map(|k| k.key_id),
            ),
            pending_promotions: self.promotions.len(),
            shedding_threshold_ms: self.state.shedding_threshold_ms(),
        })
    }
}

/// At most what one directory entry takes on the wire beyond its strings (an array header,
/// three string headers, CPU, memory and slot as msgpack integers), for sizing join answers.
fn entry_wire_bytes(entry: &scheduler_core::distributed::NodeDirectoryEntry) -> usize {
    entry.node_id.as_str().len() + entry.rack.len() + entry.app_endpoint.len() + 25
}

/// At most what one QUEUEABLE key takes on the wire beyond its node id (the 32-byte secret and
/// its epoch, in columns: `scheduler_core::protocol::cluster::issuer_key_columns`).
const ISSUER_KEY_WIRE_OVERHEAD: usize = 32 + 5 + 2;

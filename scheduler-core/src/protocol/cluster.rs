//! The cluster protocol (worker ↔ coordinator) carried over QUIC: one long-lived bidirectional
//! stream per worker, length-prefixed msgpack frames ([`crate::codec`], cap
//! [`crate::codec::CLUSTER_MAX_FRAME`]). The first frame from the worker is [`Join`] with the
//! protocol version; the coordinator answers [`JoinAccepted`] or [`JoinRejected`] and closes.

use crate::codec::CodecError;
use crate::coordinator::ContainerNotice;
use crate::distributed::{ClusterView, NodeDirectoryEntry};
use crate::node::ContainerStatus;
use crate::protocol::app::{
    Allocate, ErrorCode, GrantedContainer, ReservationCancelled, ReservationReprovisioned,
    ReservationSummary,
};
use crate::protocol::tag_first::tag_first_deserialize;
use crate::queue_delay::QueueDelay;
use crate::quota::{AppOutstanding, QueueableQuota};
use crate::reservation::{AllocationInterval, ReservationDefinition};
use crate::shaper::PreemptionReason;
use crate::token::{ContainerToken, IssuerNodeKey, NodeSessionSecret, PublicKeyRing};
use crate::{ContainerId, NodeId, Resources};
use serde::{Deserialize, Serialize};

/// Version of the cluster protocol; sent in the first frame. 5: membership as deltas
/// (`ClusterView::delta`, issue 17). 6 (issue 17): QUEUEABLE issuer keys only for the top-k's
/// nodes, sent with any answer whose top-k names a node the scheduler has no key for
/// (`coordinator::NodeView`), and the top-k as two columns (`distributed::top_k_columns`).
/// 7 (issue 17): the QUEUEABLE keys as columns with raw 32-byte secrets ([`issuer_key_columns`]),
/// directory entries as arrays (`distributed::NodeDirectoryEntry`), and the top-k's queue delays
/// as 32-bit floats. 8 (issue 17): each directory entry carries its node's slot, and the top-k
/// names nodes by slot instead of by id (`distributed::SlotLoad`; the scheduler resolves them
/// in its directory at the view's version).
/// 9 (issue 17): partial directories — a scheduler is sent the directory entries of the nodes
/// its views name, with their keys (`ClusterView::entries`), and the cluster in sum
/// (`ClusterView::cluster`); a join answer's directory is the node's own entry and a delta names
/// only departures, so a join costs O(k) instead of O(nodes).
/// 10 (issue 13): `explain` (`ExplainCall` / `ExplainDone`), an app's question why its waiting
/// 3Sigma job has not started; a coordinator of 9 would close the session on it.
pub const CLUSTER_PROTOCOL_VERSION: u32 = 10;

/// A list of QUEUEABLE keys on the wire as three columns (cluster protocol 7, issue 17):
/// `{node_ids: [..], node_epochs: [..], secrets: bin}`, `secrets` being the 32 raw bytes of each
/// key in the order of `node_ids`. A scheduler is sent the key of every node new to its top-k,
/// so in a join storm keys were most of an answer's bytes: as one named map per key with the
/// secret as a hex string a key took ~115 bytes and a hex encoding on the coordinator and a
/// decoding on the worker; as columns it takes the id, up to 5 bytes of epoch and the 32 bytes.
/// Columns of different lengths, or secrets not 32 bytes each, are refused.
pub mod issuer_key_columns {
    use crate::NodeId;
    use crate::token::IssuerNodeKey;
    use serde::de::{Deserializer, Error as _, Visitor};
    use serde::ser::{SerializeStruct, Serializer};
    use serde::{Deserialize, Serialize};

    const SECRET_LEN: usize = 32;

    /// The secrets side by side, written as one msgpack bin.
    struct Secrets<'a>(&'a [IssuerNodeKey]);

    impl Serialize for Secrets<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut bytes = Vec::with_capacity(self.0.len() * SECRET_LEN);
            for k in self.0 {
                bytes.extend_from_slice(&k.secret);
            }
            s.serialize_bytes(&bytes)
        }
    }

    /// Node ids or epochs of the keys, as an array, without collecting them first.
    struct Column<'a, T, F: Fn(&'a IssuerNodeKey) -> T>(&'a [IssuerNodeKey], F);

    impl<'a, T: Serialize, F: Fn(&'a IssuerNodeKey) -> T> Serialize for Column<'a, T, F> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.iter().map(&self.1))
        }
    }

    struct SecretBytes(Vec<u8>);

    impl<'de> Deserialize<'de> for SecretBytes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SecretBytes, D::Error> {
            struct BinVisitor;
            impl Visitor<'_> for BinVisitor {
                type Value = SecretBytes;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("the keys' secrets as one binary string")
                }
                fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<SecretBytes, E> {
                    Ok(SecretBytes(v.to_vec()))
                }
                fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<SecretBytes, E> {
                    Ok(SecretBytes(v))
                }
            }
            d.deserialize_bytes(BinVisitor)
        }
    }

    #[derive(Deserialize)]
    struct Columns {
        node_ids: Vec<NodeId>,
        node_epochs: Vec<u32>,
        secrets: SecretBytes,
    }

    pub fn serialize<S: Serializer>(keys: &[IssuerNodeKey], s: S) -> Result<S::Ok, S::Error> {
        let mut columns = s.serialize_struct("IssuerKeyColumns", 3)?;
        columns.serialize_field("node_ids", &Column(keys, |k| &k.node_id))?;
        columns.serialize_field("node_epochs", &Column(keys, |k| k.node_epoch))?;
        columns.serialize_field("secrets", &Secrets(keys))?;
        columns.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IssuerNodeKey>, D::Error> {
        let Columns {
            node_ids,
            node_epochs,
            secrets: SecretBytes(secrets),
        } = Columns::deserialize(d)?;
        if node_ids.len() != node_epochs.len() || secrets.len() != node_ids.len() * SECRET_LEN {
            return Err(D::Error::custom(format!(
                "issuer_keys has {} node ids, {} node epochs and {} bytes of secrets (32 a key)",
                node_ids.len(),
                node_epochs.len(),
                secrets.len()
            )));
        }
        Ok(node_ids
            .into_iter()
            .zip(node_epochs)
            .zip(secrets.chunks_exact(SECRET_LEN))
            .map(|((node_id, node_epoch), secret)| IssuerNodeKey {
                node_id,
                node_epoch,
                secret: secret.try_into().expect("chunks of 32 bytes"),
            })
            .collect())
    }

    /// The same for an optional list (nil when absent).
    pub mod option {
        use super::IssuerNodeKey;
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(
            keys: &Option<Vec<IssuerNodeKey>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match keys {
                Some(keys) => super::serialize(keys, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Vec<IssuerNodeKey>>, D::Error> {
            #[derive(Deserialize)]
            struct Keys(#[serde(with = "super")] Vec<IssuerNodeKey>);
            Ok(Option::<Keys>::deserialize(d)?.map(|Keys(keys)| keys))
        }
    }
}

/// Frames a worker sends to the coordinator. Decoded tag first (`protocol::tag_first`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerToCoordinator {
    Join(Join),
    Heartbeat(Heartbeat),
    AllocateGuaranteed(AllocateGuaranteed),
    Promote(PromoteContainer),
    Release(ReleaseContainer),
    PromotionApplied(PromotionApplied),
    CancelAllocate(CancelAllocate),
    Reservation(ReservationCall),
    GuaranteedFinished(GuaranteedFinished),
    ContainerResized(ContainerResized),
    Explain(ExplainCall),
}

tag_first_deserialize!(WorkerToCoordinator, "type", {
    "join" => Join(Join),
    "heartbeat" => Heartbeat(Heartbeat),
    "allocate_guaranteed" => AllocateGuaranteed(AllocateGuaranteed),
    "promote" => Promote(PromoteContainer),
    "release" => Release(ReleaseContainer),
    "promotion_applied" => PromotionApplied(PromotionApplied),
    "cancel_allocate" => CancelAllocate(CancelAllocate),
    "reservation" => Reservation(ReservationCall),
    "guaranteed_finished" => GuaranteedFinished(GuaranteedFinished),
    "container_resized" => ContainerResized(ContainerResized),
    "explain" => Explain(ExplainCall),
});

/// GUARANTEED containers (issued by the guarantor) that ended on the sending node, sent the
/// moment they end so the guarantor frees their bookings and places waiting work without
/// waiting for the next heartbeat (issue 17: a node's GUARANTEED throughput was capped at its
/// slots × heartbeats per second). The next heartbeat lists them in `finished` again; freeing is
/// idempotent, and only the grant's own node can free it. No answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuaranteedFinished {
    pub finished: Vec<ContainerId>,
}

/// The hosting worker's report of a [`ResizeContainer`]: what the container is allocated and
/// limited to now. No answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerResized {
    pub container_id: ContainerId,
    /// The allocation the node accounts for it now (the old one when the resize was refused).
    pub resources: Resources,
    /// How the shaped size is enforced: `cgroup` (soft limits: memory.high and cpu.max on
    /// cgroup v2, memory.soft_limit_in_bytes and the CFS quota on v1; the hard memory limit stays
    /// at the request), `accounting` (no cgroups: the node's books only; its RSS monitor keeps
    /// killing at the request), `none` (not applied: see `error`, or the process had not
    /// started).
    pub enforced_by: String,
    /// `None` on success, else why the node refused or could not apply it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// First frame: who the worker is and the cluster's join secret.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Join {
    pub protocol_version: u32,
    pub join_token: String,
    pub node_id: NodeId,
    pub rack: String,
    pub capacity: Resources,
    /// `host:port` applications use to reach this worker.
    pub app_endpoint: String,
    /// Containers the worker still runs (after a coordinator restart or a network partition),
    /// for reconciliation.
    pub containers: Vec<ContainerStatus>,
    /// The node's attributes (`worker run --attribute k=v`), which 3Sigma's job constraints
    /// name (equivalence sets, 3Sigma §4.3.3).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub attributes: std::collections::BTreeMap<String, String>,
}

/// Periodic load and container report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub node_id: NodeId,
    /// The membership version the worker's directory is at (0: none): the answer carries the
    /// changes since, or the whole directory when the version is unknown or too old.
    pub directory_version: u64,
    /// Tq, Tr, Tl (Mercury §4.2).
    pub queue_delay: QueueDelay,
    pub running: u32,
    pub queued: u32,
    /// Resources held by running containers.
    pub allocated: Resources,
    /// Measured use of the node's containers (sum over processes), if sampled.
    pub usage: Option<Resources>,
    /// Every container on the node.
    pub containers: Vec<ContainerStatus>,
    /// Containers accepted since the last heartbeat.
    pub started: Vec<ContainerId>,
    /// Containers gone since the last heartbeat.
    pub finished: Vec<ContainerId>,
    /// What this worker's scheduler has outstanding per app (QUEUEABLE it granted, GUARANTEED
    /// it obtained), so quotas hold cluster-wide. At most one entry per registered app.
    #[serde(default)]
    pub issued: Vec<AppOutstanding>,
}

/// A GUARANTEED ask forwarded to the guarantor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocateGuaranteed {
    pub correlation_id: u64,
    pub app_id: String,
    pub allocate: Allocate,
}

/// Promotion of a QUEUEABLE container, to be validated centrally.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromoteContainer {
    pub correlation_id: u64,
    pub app_id: String,
    pub container_id: ContainerId,
    /// The container as the requesting worker sees it *now*, when that worker hosts it. The
    /// coordinator otherwise knows containers only from heartbeats, so without this a container
    /// started since its node's last heartbeat could not be promoted yet. `None` (or absent, from
    /// an older worker) when the container is on another node.
    #[serde(default)]
    pub local_status: Option<ContainerStatus>,
}

/// An application released a container that is not on the forwarding worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReleaseContainer {
    pub correlation_id: u64,
    pub app_id: String,
    pub container_id: ContainerId,
}

/// The application connection that sent a forwarded GUARANTEED ask closed before the ask was
/// fully placed: the guarantor drops what is still waiting (nobody could receive it). Grants
/// already on their way are released by the worker when they arrive. No answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CancelAllocate {
    /// The `correlation_id` of the [`AllocateGuaranteed`] to cancel, on this worker's session.
    pub correlation_id: u64,
}

/// An application's reservation request (`reserve`, `update_reservation`, `delete_reservation`,
/// `list_reservations`), forwarded to the guarantor. Answered by [`ReservationDone`] or
/// [`RequestFailed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationCall {
    pub correlation_id: u64,
    pub app_id: String,
    pub op: ReservationOp,
}

/// An app's `explain` of its waiting 3Sigma job, forwarded to the guarantor. Answered by
/// [`ExplainDone`] or [`RequestFailed`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainCall {
    pub correlation_id: u64,
    pub app_id: String,
    pub job_id: String,
}

/// The answer to an [`ExplainCall`]: the app's waiting jobs with that id (none when it has none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExplainDone {
    pub correlation_id: u64,
    pub jobs: Vec<crate::threesigma::JobExplanation>,
}

/// What a [`ReservationCall`] asks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ReservationOp {
    Reserve {
        reservation_id: String,
        definition: ReservationDefinition,
    },
    Update {
        reservation_id: String,
        definition: ReservationDefinition,
    },
    Delete {
        reservation_id: String,
    },
    List,
}

/// The hosting worker's answer to [`ApplyPromotion`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromotionApplied {
    pub correlation_id: u64,
    /// `None` on success, else why the node refused.
    pub error: Option<String>,
}

/// Frames the coordinator sends to a worker. Decoded tag first (`protocol::tag_first`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CoordinatorToWorker {
    JoinAccepted(JoinAccepted),
    JoinRejected(JoinRejected),
    HeartbeatAck(HeartbeatAck),
    GuaranteedAllocated(GuaranteedAllocated),
    PromoteResult(PromoteResult),
    Released(Released),
    RequestFailed(RequestFailed),
    ApplyPromotion(ApplyPromotion),
    StopContainer(StopContainerOnNode),
    ReservationDone(ReservationDone),
    ReservationNotice(ReservationNotice),
    ResizeContainer(ResizeContainer),
    Explained(ExplainDone),
}

tag_first_deserialize!(CoordinatorToWorker, "type", {
    "join_accepted" => JoinAccepted(JoinAccepted),
    "join_rejected" => JoinRejected(JoinRejected),
    "heartbeat_ack" => HeartbeatAck(HeartbeatAck),
    "guaranteed_allocated" => GuaranteedAllocated(GuaranteedAllocated),
    "promote_result" => PromoteResult(PromoteResult),
    "released" => Released(Released),
    "request_failed" => RequestFailed(RequestFailed),
    "apply_promotion" => ApplyPromotion(ApplyPromotion),
    "stop_container" => StopContainer(StopContainerOnNode),
    "reservation_done" => ReservationDone(ReservationDone),
    "reservation_notice" => ReservationNotice(ReservationNotice),
    "resize_container" => ResizeContainer(ResizeContainer),
    "explained" => Explained(ExplainDone),
});

/// A registered application, as workers need it to authenticate and police it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppRecord {
    pub app_id: String,
    /// SHA-256 of the app secret, hex; workers never see secrets.
    pub secret_sha256: String,
    pub quota: QueueableQuota,
}

/// Cluster-wide settings a worker adopts at join.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterSettings {
    pub top_k: usize,
    pub token_ttl_ms: u64,
    pub heartbeat_interval_ms: u64,
}

impl WorkerToCoordinator {
    /// The correlation id and a name of a frame that asks for new work (a GUARANTEED ask, a
    /// promotion, a reservation call); `None` for the others (reports, frees, releases).
    pub fn new_work_asked(&self) -> Option<(u64, &'static str)> {
        match self {
            WorkerToCoordinator::AllocateGuaranteed(a) => {
                Some((a.correlation_id, "a GUARANTEED ask"))
            }
            WorkerToCoordinator::Promote(p) => Some((p.correlation_id, "a promotion")),
            WorkerToCoordinator::Reservation(r) => Some((r.correlation_id, "a reservation call")),
            _ => None,
        }
    }
}

/// Welcome into the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinAccepted {
    pub protocol_version: u32,
    /// Container-id prefix for this worker's distributed scheduler.
    pub issuer: u32,
    /// This node session's secret: the node checks QUEUEABLE tokens addressed to it with it.
    pub node_secret: NodeSessionSecret,
    /// This worker's scheduler's keys for QUEUEABLE tokens, one per node of `view.top_k`
    /// (protocol 6; before, one per node of `view.directory`). Nodes entering the top-k later
    /// get theirs in `HeartbeatAck::issuer_keys`. As columns ([`issuer_key_columns`]).
    #[serde(with = "issuer_key_columns")]
    pub issuer_keys: Vec<IssuerNodeKey>,
    /// Public keys for GUARANTEED tokens (only the coordinator holds the private ones).
    pub guaranteed_keys: PublicKeyRing,
    pub apps: Vec<AppRecord>,
    pub settings: ClusterSettings,
    pub view: ClusterView,
    /// Containers of this join's list that the coordinator reported `lost` (the node had been
    /// declared lost): the worker kills them at once and never reports them running again.
    #[serde(default)]
    pub lost_containers: Vec<ContainerId>,
}

/// Refusal (bad version, bad join token, bad fields); the coordinator closes the stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinRejected {
    pub reason: String,
}

/// Answer to a heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    pub view: ClusterView,
    /// Mercury §4.3/§6.3 shedding target for this node: set only when shedding is on and the
    /// node was an outlier of the round (its R above mean + kσ of the other nodes' R, which is
    /// then the target; `CoordinatorState::shedding_round`).
    pub shedding_threshold_ms: Option<f64>,
    /// Mercury §4.3 policing: what the node may give QUEUEABLE work.
    pub queueable_limit: Resources,
    /// Notices about containers this worker's scheduler issued.
    pub notices: Vec<ContainerNotice>,
    /// This worker's scheduler's keys for QUEUEABLE tokens for the top-k's nodes (protocol 6,
    /// `coordinator::NodeView`): with a whole directory (`view.directory`), one per top-k node,
    /// replacing the old ones; otherwise one per top-k node whose current session's key the
    /// scheduler was not sent yet (added, or replacing a re-joined node's old key; a delta's
    /// left nodes' keys are dropped), `None` when there are none and no membership is sent.
    /// As columns ([`issuer_key_columns`]).
    #[serde(default, with = "issuer_key_columns::option")]
    pub issuer_keys: Option<Vec<IssuerNodeKey>>,
    /// New GUARANTEED public keys after a rotation.
    #[serde(default)]
    pub guaranteed_keys: Option<PublicKeyRing>,
    /// New app registry after a change.
    pub apps: Option<Vec<AppRecord>>,
    /// A new k for top-k after an operator changed it (`coordinator top-k K`); the worker's
    /// scheduler adopts it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    /// What all other workers' schedulers have outstanding per app, as of the coordinator's
    /// last round (quotas hold cluster-wide).
    #[serde(default)]
    pub outstanding_elsewhere: Vec<AppOutstanding>,
}

/// GUARANTEED grants for a forwarded ask (possibly several frames; last has `remaining == 0`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuaranteedAllocated {
    pub correlation_id: u64,
    pub containers: Vec<GrantedContainer>,
    pub remaining: u32,
}

/// A promotion succeeded; the new token (higher version, GUARANTEED).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromoteResult {
    pub correlation_id: u64,
    pub token: ContainerToken,
}

/// A release was carried out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Released {
    pub correlation_id: u64,
}

/// A forwarded request failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestFailed {
    pub correlation_id: u64,
    pub code: ErrorCode,
    pub message: String,
}

/// The answer to a [`ReservationCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationDone {
    pub correlation_id: u64,
    pub reply: ReservationReply,
}

/// What a reservation request did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ReservationReply {
    /// `reserve` or `update`: accepted with this allocation.
    Accepted {
        reservation_id: String,
        allocation: Vec<AllocationInterval>,
    },
    Deleted,
    Listed {
        reservations: Vec<ReservationSummary>,
        /// The plan's free capacity over the agenda.
        #[serde(default)]
        free: Vec<AllocationInterval>,
    },
}

/// An event for a reservation's owner: the worker pushes it to the app's subscribed connections.
/// Sent through the worker whose session the owner last used for a reservation request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationNotice {
    pub app_id: String,
    pub event: ReservationNoticeKind,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReservationNoticeKind {
    Reprovisioned(ReservationReprovisioned),
    Cancelled(ReservationCancelled),
}

/// Make a container on this node GUARANTEED (validated centrally).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApplyPromotion {
    pub correlation_id: u64,
    pub token: ContainerToken,
}

/// Stop a container on this node on the application's behalf.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StopContainerOnNode {
    pub container_id: ContainerId,
    pub app_id: String,
    /// For a GUARANTEED grant released before its node reported it started: if the container is
    /// not on the node, the node refuses its token until this time (the token's expiry).
    #[serde(default)]
    pub revoke_until_ms: Option<u64>,
    /// Set when the resource shaper preempts the container (Pace §3.2): it is killed with
    /// reason `shaped_preemption` and this in its message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shaped_preemption: Option<PreemptionReason>,
}

/// The resource shaper (Pace §3.2) resized a running GUARANTEED container of this node: the
/// node changes its limits without restarting it and answers [`ContainerResized`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResizeContainer {
    pub container_id: ContainerId,
    /// The shaped allocation: between the container's current use and its request.
    pub resources: Resources,
}

/// A round's top-k list encoded once, as [`ClusterView::top_k_slots`] is on the wire (two
/// columns, [`crate::distributed::top_k_columns`]), to be shared by every heartbeat answer of the round (issue 17: the list
/// is the same for all nodes until the next round, and at `view_size(50)` = 200 entries it is
/// most of an answer's bytes; encoding it per heartbeat was most of the coordinator's encoding
/// work).
#[derive(Clone, Debug)]
pub struct EncodedTopK {
    bytes: std::sync::Arc<[u8]>,
}

impl EncodedTopK {
    pub fn encode(top_k: &[crate::distributed::SlotLoad]) -> Result<EncodedTopK, CodecError> {
        let mut bytes = Vec::new();
        let mut ser = rmp_serde::Serializer::new(&mut bytes).with_struct_map();
        crate::distributed::top_k_columns::serialize(top_k, &mut ser)
            .map_err(|e| CodecError::Encode(e.to_string()))?;
        Ok(EncodedTopK {
            bytes: bytes.into(),
        })
    }

    /// The encoded list.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// A view's membership part ([`ClusterView::directory`] and [`ClusterView::delta`]) encoded
/// once, to be shared by every heartbeat answer that brings a worker from the same directory
/// version to the current membership (issue 17: in a join storm every answer carries the round's joins,
/// and building and encoding them per answer made a 5,000-node storm O(nodes²) in copies and
/// queued memory; docs/benchmarks.md §9).
///
/// The directory is kept as its entries' encodings without the array's header, so that a join
/// answer can send the shared directory with the joining node's own entry appended
/// ([`encode_join_accepted_frame_into`]).
#[derive(Clone, Debug)]
pub struct EncodedMembership {
    directory_len: usize,
    directory_entries: std::sync::Arc<[u8]>,
    /// One entry appended to the shared ones for one answer ([`EncodedMembership::with_own`]).
    own_entry: Option<std::sync::Arc<[u8]>>,
    delta: Option<std::sync::Arc<[u8]>>,
    /// The view's [`ClusterView::cluster`] (protocol 9).
    cluster: Option<std::sync::Arc<[u8]>>,
}

impl EncodedMembership {
    /// The membership part of `view` (its top-k is not read).
    pub fn encode(view: &ClusterView) -> Result<EncodedMembership, CodecError> {
        let mut entries = Vec::new();
        let mut ser = rmp_serde::Serializer::new(&mut entries).with_struct_map();
        for entry in &view.directory {
            entry
                .serialize(&mut ser)
                .map_err(|e| CodecError::Encode(e.to_string()))?;
        }
        Ok(EncodedMembership {
            directory_len: view.directory.len(),
            directory_entries: entries.into(),
            own_entry: None,
            delta: view.delta.as_ref().map(encode_value).transpose()?,
            cluster: view.cluster.as_ref().map(encode_value).transpose()?,
        })
    }

    /// The same whole directory with `own` (the receiving node's entry) appended, for one
    /// answer: a directory shared by the answers of a version may have been built before that
    /// node joined, and a worker must find its own node in its directory to place on it at
    /// once. The shared bytes are not copied. A delta is returned unchanged (its worker got its
    /// own entry with the whole directory it joined with).
    pub fn with_own(&self, own: &NodeDirectoryEntry) -> Result<EncodedMembership, CodecError> {
        if self.delta.is_some() {
            return Ok(self.clone());
        }
        Ok(EncodedMembership {
            own_entry: Some(encode_value(own)?),
            ..self.clone()
        })
    }

    /// Bytes this membership adds to a frame (the directory's entries, the own entry, the
    /// delta).
    pub fn encoded_len(&self) -> usize {
        self.directory_entries.len()
            + self.own_entry.as_ref().map_or(0, |e| e.len())
            + self.delta.as_ref().map_or(0, |d| d.len())
            + self.cluster.as_ref().map_or(0, |c| c.len())
    }

    /// The directory's entries (what a whole directory holds; none with a delta).
    pub fn directory_len(&self) -> usize {
        self.directory_len
    }

    /// Write the view's `cluster` field (name and value) if there is one.
    fn write_cluster(&self, out: &mut Vec<u8>) -> Result<(), rmp_serde::encode::Error> {
        if let Some(cluster) = &self.cluster {
            "cluster".serialize(&mut rmp_serde::Serializer::new(&mut *out).with_struct_map())?;
            out.extend_from_slice(cluster);
        }
        Ok(())
    }

    /// Write the directory as a msgpack array: the shared entries, then the own entry if any.
    fn write_directory(&self, out: &mut Vec<u8>) {
        write_array_len(
            out,
            self.directory_len + usize::from(self.own_entry.is_some()),
        );
        out.extend_from_slice(&self.directory_entries);
        if let Some(own) = &self.own_entry {
            out.extend_from_slice(own);
        }
    }
}

/// A msgpack array header for `len` elements (fixarray, array 16 or array 32).
fn write_array_len(out: &mut Vec<u8>, len: usize) {
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if let Ok(len) = u16::try_from(len) {
        out.push(0xdc);
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    }
}

/// One value as msgpack with named fields, as the frames' derive writes it.
fn encode_value<T: Serialize>(value: &T) -> Result<std::sync::Arc<[u8]>, CodecError> {
    let mut bytes = Vec::new();
    let mut ser = rmp_serde::Serializer::new(&mut bytes).with_struct_map();
    value
        .serialize(&mut ser)
        .map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok(bytes.into())
}

/// Append `CoordinatorToWorker::HeartbeatAck(ack)` as one length-prefixed frame to `out`, with
/// the shared `top_k` in place of `ack.view.top_k` and, when given, the shared `membership` in
/// place of `ack.view.directory` and `ack.view.delta` (which are then not read): the same bytes
/// as [`crate::codec::encode_frame_into`] of that frame with the list and the membership in the
/// view (unit test `a_heartbeat_ack_with_a_shared_top_k_is_the_derived_encoding`). Refuses a
/// frame over `limit`; on an error `out` is left as it was.
pub fn encode_heartbeat_ack_frame_into(
    ack: &HeartbeatAck,
    top_k: &EncodedTopK,
    membership: Option<&EncodedMembership>,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    crate::codec::encode_frame_with(limit, out, |out| {
        write_heartbeat_ack(ack, top_k, membership, out)
    })
}

/// One named field of a map, as the derive writes it: the name, then the value.
fn field<T: Serialize + ?Sized>(
    ser: &mut rmp_serde::Serializer<
        &mut Vec<u8>,
        rmp_serde::config::StructMapConfig<rmp_serde::config::DefaultConfig>,
    >,
    name: &str,
    value: &T,
) -> Result<(), rmp_serde::encode::Error> {
    name.serialize(&mut *ser)?;
    value.serialize(&mut *ser)
}

/// What serde's derive writes for the internally tagged `CoordinatorToWorker::HeartbeatAck`
/// (a map: the `type` tag first, then the fields in declaration order, `skip_serializing_if`
/// fields left out of the map and its length), field by field through the same serializer,
/// except that the view's `top_k` value is the shared bytes. The destructuring names every
/// field, so a field added to either struct does not compile until it is written here too.
fn write_heartbeat_ack(
    ack: &HeartbeatAck,
    shared_top_k: &EncodedTopK,
    shared_membership: Option<&EncodedMembership>,
    out: &mut Vec<u8>,
) -> Result<(), rmp_serde::encode::Error> {
    let HeartbeatAck {
        view,
        shedding_threshold_ms,
        queueable_limit,
        notices,
        issuer_keys,
        guaranteed_keys,
        apps,
        top_k,
        outstanding_elsewhere,
    } = ack;
    let ClusterView {
        directory_version,
        directory,
        delta,
        cluster,
        top_k: _,
        top_k_slots: _,
        entries,
    } = view;
    // fixmap headers: at most 15 entries each (10 and 6 here).
    let ack_fields = 9 + u8::from(top_k.is_some());
    let (has_delta, has_cluster) = match shared_membership {
        Some(m) => (m.delta.is_some(), m.cluster.is_some()),
        None => (delta.is_some(), cluster.is_some()),
    };
    let view_fields =
        3 + u8::from(has_delta) + u8::from(has_cluster) + u8::from(!entries.is_empty());
    let mut ser = rmp_serde::Serializer::new(out).with_struct_map();
    ser.get_mut().push(0x80 | ack_fields);
    field(&mut ser, "type", "heartbeat_ack")?;
    "view".serialize(&mut ser)?;
    ser.get_mut().push(0x80 | view_fields);
    field(&mut ser, "directory_version", directory_version)?;
    match shared_membership {
        Some(m) => {
            "directory".serialize(&mut ser)?;
            m.write_directory(ser.get_mut());
            if let Some(delta) = &m.delta {
                "delta".serialize(&mut ser)?;
                ser.get_mut().extend_from_slice(delta);
            }
            m.write_cluster(ser.get_mut())?;
        }
        None => {
            field(&mut ser, "directory", directory)?;
            if let Some(delta) = delta {
                field(&mut ser, "delta", delta)?;
            }
            if let Some(cluster) = cluster {
                field(&mut ser, "cluster", cluster)?;
            }
        }
    }
    "top_k".serialize(&mut ser)?;
    ser.get_mut().extend_from_slice(shared_top_k.bytes());
    if !entries.is_empty() {
        field(&mut ser, "entries", entries)?;
    }
    field(&mut ser, "shedding_threshold_ms", shedding_threshold_ms)?;
    field(&mut ser, "queueable_limit", queueable_limit)?;
    field(&mut ser, "notices", notices)?;
    "issuer_keys".serialize(&mut ser)?;
    issuer_key_columns::option::serialize(issuer_keys, &mut ser)?;
    field(&mut ser, "guaranteed_keys", guaranteed_keys)?;
    field(&mut ser, "apps", apps)?;
    if let Some(k) = top_k {
        field(&mut ser, "top_k", k)?;
    }
    field(&mut ser, "outstanding_elsewhere", outstanding_elsewhere)?;
    Ok(())
}

/// Append `CoordinatorToWorker::JoinAccepted(accepted)` as one length-prefixed frame to `out`,
/// with the shared whole directory `membership` (with the joining node's own entry appended,
/// [`EncodedMembership::with_own`], when it was built before the join) in place of
/// `accepted.view.directory`, which is not read: the same bytes as the derive's encoding of
/// that frame with that directory in the view (unit test
/// `a_join_answer_with_a_shared_directory_is_the_derived_encoding`). Issue 17: built and
/// encoded per join, the whole directory made a join storm O(nodes²) in copies. Refuses a
/// frame over `limit`; on an error `out` is left as it was.
pub fn encode_join_accepted_frame_into(
    accepted: &JoinAccepted,
    membership: &EncodedMembership,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    crate::codec::encode_frame_with(limit, out, |out| {
        write_join_accepted(accepted, membership, out)
    })
}

/// What serde's derive writes for the internally tagged `CoordinatorToWorker::JoinAccepted`
/// (see [`write_heartbeat_ack`]), with the view's directory from `membership`.
fn write_join_accepted(
    accepted: &JoinAccepted,
    membership: &EncodedMembership,
    out: &mut Vec<u8>,
) -> Result<(), rmp_serde::encode::Error> {
    let JoinAccepted {
        protocol_version,
        issuer,
        node_secret,
        issuer_keys,
        guaranteed_keys,
        apps,
        settings,
        view,
        lost_containers,
    } = accepted;
    let ClusterView {
        directory_version,
        directory: _,
        delta: _,
        cluster: _,
        top_k: _,
        top_k_slots,
        entries,
    } = view;
    let mut ser = rmp_serde::Serializer::new(out).with_struct_map();
    // fixmap headers: 10 entries (the tag and nine fields), 3 to 5 in the view (no delta).
    ser.get_mut().push(0x80 | 10);
    field(&mut ser, "type", "join_accepted")?;
    field(&mut ser, "protocol_version", protocol_version)?;
    field(&mut ser, "issuer", issuer)?;
    field(&mut ser, "node_secret", node_secret)?;
    "issuer_keys".serialize(&mut ser)?;
    issuer_key_columns::serialize(issuer_keys, &mut ser)?;
    field(&mut ser, "guaranteed_keys", guaranteed_keys)?;
    field(&mut ser, "apps", apps)?;
    field(&mut ser, "settings", settings)?;
    "view".serialize(&mut ser)?;
    let view_fields = 3 + u8::from(membership.cluster.is_some()) + u8::from(!entries.is_empty());
    ser.get_mut().push(0x80 | view_fields);
    field(&mut ser, "directory_version", directory_version)?;
    "directory".serialize(&mut ser)?;
    membership.write_directory(ser.get_mut());
    membership.write_cluster(ser.get_mut())?;
    "top_k".serialize(&mut ser)?;
    crate::distributed::top_k_columns::serialize(top_k_slots, &mut ser)?;
    if !entries.is_empty() {
        field(&mut ser, "entries", entries)?;
    }
    field(&mut ser, "lost_containers", lost_containers)?;
    Ok(())
}

#[cfg(test)]
mod shared_top_k_tests {
    use super::*;
    use crate::codec::{CLUSTER_MAX_FRAME, LENGTH_PREFIX, encode_frame, from_payload};
    use crate::coordinator::NoticeKind;
    use crate::distributed::{DirectoryDelta, NodeDirectoryEntry, SlotLoad};
    use crate::quota::AppOutstanding;

    fn top_k(n: usize) -> Vec<SlotLoad> {
        (0..n)
            .map(|i| SlotLoad {
                slot: i as u32 * 97,
                queue_delay_ms: i as f64 * 1.5,
            })
            .collect()
    }

    fn entry(i: usize) -> NodeDirectoryEntry {
        NodeDirectoryEntry {
            node_id: NodeId::new(format!("node-{i:05}")),
            rack: format!("rack-{}", i % 3),
            capacity: Resources::new(4000, 4096),
            app_endpoint: format!("127.0.0.1:{}", 20000 + i),
            slot: i as u32,
        }
    }

    /// Answers with every optional part absent and present, each encoded with a shared list and
    /// by the derive: byte for byte the same frame, which decodes to the ack with the list.
    #[test]
    fn a_heartbeat_ack_with_a_shared_top_k_is_the_derived_encoding() {
        let bare = HeartbeatAck {
            view: ClusterView {
                directory_version: 7,
                ..ClusterView::default()
            },
            shedding_threshold_ms: None,
            queueable_limit: Resources::new(1000, 512),
            notices: Vec::new(),
            issuer_keys: None,
            guaranteed_keys: None,
            apps: None,
            top_k: None,
            outstanding_elsewhere: Vec::new(),
        };
        let mut full = bare.clone();
        full.view.directory = vec![entry(1), entry(2)];
        full.view.delta = Some(DirectoryDelta {
            from_version: 5,
            joined: vec![entry(3)],
            left: vec![NodeId::new("gone")],
        });
        full.view.cluster = Some(crate::distributed::ClusterSummary {
            nodes: 10_000,
            largest_capacities: vec![Resources::new(4000, 4096), Resources::new(2000, 8192)],
        });
        full.view.entries = vec![entry(8), entry(9)];
        full.shedding_threshold_ms = Some(12.5);
        full.notices = vec![ContainerNotice {
            container_id: ContainerId::new(3, 9),
            node_id: NodeId::new("node-00003"),
            kind: NoticeKind::Finished,
        }];
        full.issuer_keys = Some(Vec::new());
        full.apps = Some(vec![AppRecord {
            app_id: "app".into(),
            secret_sha256: "ab".repeat(32),
            quota: QueueableQuota::default(),
        }]);
        full.top_k = Some(7);
        full.outstanding_elsewhere = vec![AppOutstanding {
            app_id: crate::AppId::new("app"),
            queueable: 3,
            guaranteed: 1,
        }];
        let mut whole = full.clone();
        whole.view.delta = None;
        let mut delta_only = full.clone();
        delta_only.view.directory = Vec::new();
        let mut entries_only = bare.clone();
        entries_only.view.entries = vec![entry(4)];
        let mut sum_only = bare.clone();
        sum_only.view.cluster = full.view.cluster.clone();
        for (ack, n) in [
            (&bare, 0),
            (&bare, 200),
            (&full, 0),
            (&full, 3),
            (&whole, 5),
            (&delta_only, 5),
            (&entries_only, 5),
            (&sum_only, 5),
        ] {
            let list = top_k(n);
            let shared = EncodedTopK::encode(&list).unwrap();
            let mut with_list = ack.clone();
            with_list.view.top_k_slots = list;
            let frame = CoordinatorToWorker::HeartbeatAck(with_list);
            let derived = encode_frame(&frame, CLUSTER_MAX_FRAME).unwrap();
            let mut out = b"before".to_vec();
            encode_heartbeat_ack_frame_into(ack, &shared, None, CLUSTER_MAX_FRAME, &mut out)
                .unwrap();
            assert_eq!(&out[..6], b"before");
            assert_eq!(&out[6..], &derived[..], "{n} entries");
            let decoded: CoordinatorToWorker = from_payload(&out[6 + LENGTH_PREFIX..]).unwrap();
            assert_eq!(decoded, frame);
            // The membership shared too: the answer's own directory and delta are not read.
            let membership = EncodedMembership::encode(&ack.view).unwrap();
            let mut without_membership = ack.clone();
            without_membership.view.directory = Vec::new();
            without_membership.view.delta = None;
            without_membership.view.cluster = None;
            let mut out = Vec::new();
            encode_heartbeat_ack_frame_into(
                &without_membership,
                &shared,
                Some(&membership),
                CLUSTER_MAX_FRAME,
                &mut out,
            )
            .unwrap();
            assert_eq!(&out[..], &derived[..], "{n} entries, shared membership");
            // A whole directory with the receiving node's entry appended; a delta unchanged.
            let own = entry(99);
            let mut with_own = ack.clone();
            with_own.view.top_k_slots = top_k(n);
            if ack.view.delta.is_none() {
                with_own.view.directory.push(own.clone());
            }
            let derived = encode_frame(
                &CoordinatorToWorker::HeartbeatAck(with_own),
                CLUSTER_MAX_FRAME,
            )
            .unwrap();
            let mut out = Vec::new();
            encode_heartbeat_ack_frame_into(
                &without_membership,
                &shared,
                Some(&membership.with_own(&own).unwrap()),
                CLUSTER_MAX_FRAME,
                &mut out,
            )
            .unwrap();
            assert_eq!(
                &out[..],
                &derived[..],
                "{n} entries, shared membership and own entry"
            );
        }
        // Over the limit: refused, and the buffer is as it was.
        let shared = EncodedTopK::encode(&top_k(200)).unwrap();
        let mut out = b"kept".to_vec();
        assert!(matches!(
            encode_heartbeat_ack_frame_into(&bare, &shared, None, 100, &mut out),
            Err(CodecError::Oversized { limit: 100, .. })
        ));
        assert_eq!(out, b"kept");
    }

    /// A join answer written with a shared whole directory (and the joining node's own entry
    /// appended, or not) is byte for byte the derive's encoding of the same answer, and decodes
    /// to it; directories of 0, 15, 16 and 70,000 entries cross the msgpack array headers.
    #[test]
    fn a_join_answer_with_a_shared_directory_is_the_derived_encoding() {
        use crate::token::PublicTokenKey;
        let accepted = |directory: Vec<NodeDirectoryEntry>, lost: Vec<ContainerId>| JoinAccepted {
            protocol_version: CLUSTER_PROTOCOL_VERSION,
            issuer: 42,
            node_secret: NodeSessionSecret {
                node_epoch: 42,
                secret_hex: "cd".repeat(32),
            },
            issuer_keys: vec![IssuerNodeKey {
                node_id: NodeId::new("node-00001"),
                node_epoch: 7,
                secret: [0xef; 32],
            }],
            guaranteed_keys: PublicKeyRing {
                current: PublicTokenKey {
                    key_id: 2,
                    public_hex: "01".repeat(32),
                },
                previous: None,
            },
            apps: vec![AppRecord {
                app_id: "app".into(),
                secret_sha256: "ab".repeat(32),
                quota: QueueableQuota::default(),
            }],
            settings: ClusterSettings {
                top_k: 50,
                token_ttl_ms: 60_000,
                heartbeat_interval_ms: 1000,
            },
            view: ClusterView {
                directory_version: 9,
                directory,
                cluster: Some(crate::distributed::ClusterSummary {
                    nodes: 70_002,
                    largest_capacities: vec![Resources::new(4000, 4096)],
                }),
                top_k_slots: top_k(3),
                entries: vec![entry(5), entry(6)],
                ..ClusterView::default()
            },
            lost_containers: lost,
        };
        for n in [0usize, 14, 15, 16, 70_000] {
            let shared: Vec<NodeDirectoryEntry> = (0..n).map(entry).collect();
            let membership = EncodedMembership::encode(&ClusterView {
                directory_version: 9,
                directory: shared.clone(),
                cluster: accepted(Vec::new(), Vec::new()).view.cluster,
                ..ClusterView::default()
            })
            .unwrap();
            assert_eq!(membership.directory_len(), n);
            let own = entry(n + 1);
            for (with_own, lost) in [(false, vec![]), (true, vec![ContainerId::new(3, 4)])] {
                let mut directory = shared.clone();
                if with_own {
                    directory.push(own.clone());
                }
                let frame = CoordinatorToWorker::JoinAccepted(accepted(directory, lost.clone()));
                let derived = encode_frame(&frame, CLUSTER_MAX_FRAME).unwrap();
                let membership = if with_own {
                    membership.with_own(&own).unwrap()
                } else {
                    membership.clone()
                };
                let mut out = b"before".to_vec();
                encode_join_accepted_frame_into(
                    &accepted(Vec::new(), lost),
                    &membership,
                    CLUSTER_MAX_FRAME,
                    &mut out,
                )
                .unwrap();
                assert_eq!(&out[..6], b"before");
                assert_eq!(&out[6..], &derived[..], "{n} entries, own {with_own}");
                let decoded: CoordinatorToWorker = from_payload(&out[6 + LENGTH_PREFIX..]).unwrap();
                assert_eq!(decoded, frame);
            }
        }
        // Over the limit: refused, and the buffer is as it was.
        let membership = EncodedMembership::encode(&ClusterView::default()).unwrap();
        let mut out = b"kept".to_vec();
        assert!(matches!(
            encode_join_accepted_frame_into(
                &accepted(Vec::new(), Vec::new()),
                &membership,
                100,
                &mut out
            ),
            Err(CodecError::Oversized { limit: 100, .. })
        ));
        assert_eq!(out, b"kept");
    }

    /// Protocol 8: the top-k goes as two columns, slots and delays, decodes back to the same
    /// list, takes under half the bytes of protocol 7's columns of node names (at 10,000 nodes'
    /// names and slots), and columns of unequal length are refused.
    #[test]
    fn the_top_k_goes_as_slot_and_delay_columns_and_unequal_columns_are_refused() {
        let list = top_k(200);
        let view = ClusterView {
            directory_version: 3,
            top_k_slots: list.clone(),
            ..ClusterView::default()
        };
        let bytes = crate::codec::to_payload(&view).unwrap();
        let back: ClusterView = from_payload(&bytes).unwrap();
        assert_eq!(back, view);
        let columns = EncodedTopK::encode(&list).unwrap();
        // What protocol 7 sent for the same list: the names of nodes of a 10,000-node fleet.
        #[derive(Serialize)]
        struct NamedColumns {
            node_ids: Vec<NodeId>,
            queue_delays_ms: Vec<f32>,
        }
        let named = crate::codec::to_payload(&NamedColumns {
            node_ids: list
                .iter()
                .map(|l| NodeId::new(format!("fleet-node-{:05}", l.slot)))
                .collect(),
            queue_delays_ms: list.iter().map(|l| l.queue_delay_ms as f32).collect(),
        })
        .unwrap();
        assert!(
            columns.bytes().len() * 2 < named.len(),
            "{} bytes by slot, {} by name",
            columns.bytes().len(),
            named.len()
        );
        // A list sent by name (protocol 7) is not read as one by slot.
        #[derive(Serialize)]
        struct OldView {
            directory_version: u64,
            directory: Vec<NodeDirectoryEntry>,
            top_k: NamedColumns,
        }
        let old = OldView {
            directory_version: 3,
            directory: Vec::new(),
            top_k: NamedColumns {
                node_ids: vec![NodeId::new("a")],
                queue_delays_ms: vec![1.0],
            },
        };
        assert!(from_payload::<ClusterView>(&crate::codec::to_payload(&old).unwrap()).is_err());
        #[derive(Serialize)]
        struct Lopsided {
            directory_version: u64,
            directory: Vec<NodeDirectoryEntry>,
            top_k: Columns,
        }
        #[derive(Serialize)]
        struct Columns {
            node_slots: Vec<u32>,
            queue_delays_ms: Vec<f64>,
        }
        let lopsided = Lopsided {
            directory_version: 3,
            directory: Vec::new(),
            top_k: Columns {
                node_slots: vec![4, 9],
                queue_delays_ms: vec![1.0],
            },
        };
        let err =
            from_payload::<ClusterView>(&crate::codec::to_payload(&lopsided).unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("2 node slots but 1 queue delays"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod issuer_key_columns_tests {
    use super::*;
    use crate::codec::{from_payload, to_payload};

    fn keys(n: usize) -> Vec<IssuerNodeKey> {
        (0..n)
            .map(|i| IssuerNodeKey {
                node_id: NodeId::new(format!("node-{i:05}")),
                node_epoch: 70_000 + i as u32,
                secret: [i as u8; 32],
            })
            .collect()
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Framed {
        #[serde(with = "issuer_key_columns")]
        keys: Vec<IssuerNodeKey>,
        #[serde(default, with = "issuer_key_columns::option")]
        maybe: Option<Vec<IssuerNodeKey>>,
    }

    /// Keys go as three columns with raw secrets, come back as they were (absent, empty, one,
    /// 200), and take under half of what one named map per key with a hex secret took.
    #[test]
    fn keys_go_as_columns_with_raw_secrets_and_come_back_whole() {
        for (list, maybe) in [
            (keys(0), None),
            (keys(1), Some(keys(0))),
            (keys(200), Some(keys(3))),
        ] {
            let framed = Framed { keys: list, maybe };
            let back: Framed = from_payload(&to_payload(&framed).unwrap()).unwrap();
            assert_eq!(back, framed);
        }
        #[derive(Serialize)]
        struct AsMap<'a> {
            node_id: &'a NodeId,
            node_epoch: u32,
            secret_hex: String,
        }
        let list = keys(200);
        let as_maps: Vec<AsMap> = list
            .iter()
            .map(|k| AsMap {
                node_id: &k.node_id,
                node_epoch: k.node_epoch,
                secret_hex: hex::encode(k.secret),
            })
            .collect();
        let old = to_payload(&as_maps).unwrap().len();
        let new = to_payload(&Framed {
            keys: list,
            maybe: None,
        })
        .unwrap()
        .len();
        assert!(new * 2 < old, "{new} bytes as columns, {old} as maps");
    }

    /// A directory entry is a six-element array: it comes back whole, takes under half of the
    /// named map it was, and an array of another length is refused.
    #[test]
    fn a_directory_entry_goes_as_an_array() {
        let entry = NodeDirectoryEntry {
            node_id: NodeId::new("node-00042"),
            rack: "rack-1".into(),
            capacity: Resources::new(4000, 8192),
            app_endpoint: "127.0.0.1:20042".into(),
            slot: 42,
        };
        let bytes = to_payload(&entry).unwrap();
        assert_eq!(bytes[0], 0x96, "a fixarray of 6");
        // A frame's payload must be a map, so the entry alone is read with rmp directly.
        let read = |b: &[u8]| rmp_serde::from_slice::<NodeDirectoryEntry>(b);
        assert_eq!(read(&bytes).unwrap(), entry);
        #[derive(Serialize)]
        struct AsMap<'a> {
            node_id: &'a NodeId,
            rack: &'a str,
            capacity: Resources,
            app_endpoint: &'a str,
        }
        let old = to_payload(&AsMap {
            node_id: &entry.node_id,
            rack: &entry.rack,
            capacity: entry.capacity,
            app_endpoint: &entry.app_endpoint,
        })
        .unwrap();
        assert!(
            bytes.len() * 2 < old.len(),
            "{} vs {}",
            bytes.len(),
            old.len()
        );
        let short = to_payload(&("node-1", "rack", 1u64, 2u64)).unwrap();
        assert!(read(&short).is_err());
        // Protocol 7's entry, without the slot.
        let no_slot = to_payload(&("node-1", "rack", 1u64, 2u64, "127.0.0.1:1")).unwrap();
        assert!(read(&no_slot).is_err());
        assert!(read(&old).is_err());
    }

    #[test]
    fn columns_that_do_not_line_up_are_refused_by_name() {
        #[derive(Serialize)]
        struct Raw {
            keys: RawColumns,
        }
        #[derive(Serialize)]
        struct RawColumns {
            node_ids: Vec<NodeId>,
            node_epochs: Vec<u32>,
            #[serde(with = "bin")]
            secrets: Vec<u8>,
        }
        mod bin {
            pub fn serialize<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(b)
            }
        }
        let raw = |ids: usize, epochs: usize, secret_bytes: usize| Raw {
            keys: RawColumns {
                node_ids: (0..ids).map(|i| NodeId::new(format!("n{i}"))).collect(),
                node_epochs: vec![1; epochs],
                secrets: vec![7; secret_bytes],
            },
        };
        #[derive(Deserialize, Debug)]
        struct Keys {
            #[serde(with = "issuer_key_columns")]
            #[allow(dead_code)]
            keys: Vec<IssuerNodeKey>,
        }
        let decoded = |r: &Raw| from_payload::<Keys>(&to_payload(r).unwrap());
        assert_eq!(decoded(&raw(2, 2, 64)).unwrap().keys.len(), 2);
        for (bad, says) in [
            (raw(2, 1, 64), "2 node ids, 1 node epochs and 64 bytes"),
            (raw(2, 2, 63), "2 node ids, 2 node epochs and 63 bytes"),
            (raw(1, 1, 64), "1 node ids, 1 node epochs and 64 bytes"),
        ] {
            let err = decoded(&bad).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
        // Secrets as an array of numbers instead of one binary string are refused too.
        #[derive(Serialize)]
        struct AsArray {
            keys: ArrayColumns,
        }
        #[derive(Serialize)]
        struct ArrayColumns {
            node_ids: Vec<NodeId>,
            node_epochs: Vec<u32>,
            secrets: Vec<u8>,
        }
        let as_array = AsArray {
            keys: ArrayColumns {
                node_ids: vec![NodeId::new("n0")],
                node_epochs: vec![1],
                secrets: vec![7; 32],
            },
        };
        assert!(from_payload::<Keys>(&to_payload(&as_array).unwrap()).is_err());
    }
}

#[cfg(test)]
mod tag_first_tests {
    use super::*;
    use crate::codec::{from_payload, to_payload};
    use crate::protocol::tag_first::snake_case;

    #[test]
    fn the_decoders_names_are_what_the_encoders_write() {
        for (ident, name) in WorkerToCoordinator::snake_case_names()
            .iter()
            .chain(CoordinatorToWorker::snake_case_names())
        {
            assert_eq!(snake_case(ident), *name, "variant {ident}");
        }
        // And one of each direction through the derive's encoding.
        let finished = WorkerToCoordinator::GuaranteedFinished(GuaranteedFinished {
            finished: vec![ContainerId::new(0, 7)],
        });
        let back: WorkerToCoordinator = from_payload(&to_payload(&finished).unwrap()).unwrap();
        assert_eq!(back, finished);
        let failed = CoordinatorToWorker::RequestFailed(RequestFailed {
            correlation_id: 3,
            code: ErrorCode::Internal,
            message: "m".into(),
        });
        let back: CoordinatorToWorker = from_payload(&to_payload(&failed).unwrap()).unwrap();
        assert_eq!(back, failed);
    }

    /// A msgpack map (at most 15 entries) of short string keys to the given msgpack-encoded
    /// values, in this order.
    fn map(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = vec![0x80 | entries.len() as u8];
        for (k, v) in entries {
            out.extend(str_value(k));
            out.extend_from_slice(v);
        }
        out
    }

    /// A msgpack string of at most 31 bytes.
    fn str_value(s: &str) -> Vec<u8> {
        let mut out = vec![0xa0 | s.len() as u8];
        out.extend_from_slice(s.as_bytes());
        out
    }

    #[test]
    fn a_frame_must_name_its_type_first_and_a_known_one() {
        let reason = str_value("bad version");
        let first = map(&[
            ("type", str_value("join_rejected")),
            ("reason", reason.clone()),
        ]);
        let ok: CoordinatorToWorker = from_payload(&first).unwrap();
        assert_eq!(
            ok,
            CoordinatorToWorker::JoinRejected(JoinRejected {
                reason: "bad version".into()
            })
        );
        let last = map(&[
            ("reason", reason.clone()),
            ("type", str_value("join_rejected")),
        ]);
        let e = from_payload::<CoordinatorToWorker>(&last)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("first field of a cluster frame must be `type`, not `reason`"),
            "{e}"
        );
        let unknown = map(&[("type", str_value("join_maybe")), ("reason", reason)]);
        let e = from_payload::<CoordinatorToWorker>(&unknown)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `join_maybe`"), "{e}");
        let empty = map(&[]);
        let e = from_payload::<WorkerToCoordinator>(&empty)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field `type`"), "{e}");
        // A variant's own fields are checked as before: a missing one is named.
        let short = map(&[("type", str_value("request_failed"))]);
        let e = from_payload::<CoordinatorToWorker>(&short)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field `correlation_id`"), "{e}");
    }
}

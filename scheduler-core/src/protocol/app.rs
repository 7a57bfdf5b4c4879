//! The application protocol (job manager ↔ its local worker, and ↔ the worker hosting a
//! container): length-prefixed msgpack frames, see [`crate::codec`] and `docs/protocol.md`.

use crate::reservation::book::ReprovisionCause;
use crate::reservation::{AllocationInterval, ReservationDefinition};
use crate::shaper::ComponentRole;
use crate::token::ContainerToken;
use crate::{ContainerId, ContainerType, KillReason, NodeId, Resources};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the application protocol; sent in the first frame of every connection.
pub const APP_PROTOCOL_VERSION: u32 = 1;

/// Most containers one `allocate` may ask for, so that its answer (a token per container, a few
/// hundred bytes each) always fits one frame of [`crate::codec::APP_MAX_FRAME`].
pub const MAX_CONTAINERS_PER_ALLOCATE: u32 = 1000;

/// Frames an application sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AppRequest {
    Hello(Hello),
    Allocate(Allocate),
    Release(Release),
    Promote(Promote),
    StartContainer(StartContainer),
    StopContainer(StopContainer),
    Subscribe(Subscribe),
    Reserve(Reserve),
    UpdateReservation(UpdateReservation),
    DeleteReservation(DeleteReservation),
    ListReservations(ListReservations),
    Explain(Explain),
}

impl AppRequest {
    /// The request id, for every frame but `hello`.
    pub fn request_id(&self) -> Option<u64> {
        match self {
            AppRequest::Hello(_) => None,
            AppRequest::Allocate(r) => Some(r.request_id),
            AppRequest::Release(r) => Some(r.request_id),
            AppRequest::Promote(r) => Some(r.request_id),
            AppRequest::StartContainer(r) => Some(r.request_id),
            AppRequest::StopContainer(r) => Some(r.request_id),
            AppRequest::Subscribe(r) => Some(r.request_id),
            AppRequest::Reserve(r) => Some(r.request_id),
            AppRequest::UpdateReservation(r) => Some(r.request_id),
            AppRequest::DeleteReservation(r) => Some(r.request_id),
            AppRequest::ListReservations(r) => Some(r.request_id),
            AppRequest::Explain(r) => Some(r.request_id),
        }
    }
}

/// First frame of every connection: protocol version and the application's credentials.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub app_id: String,
    pub app_secret: String,
    /// Free text for logs (e.g. "my-job-manager/2.1").
    #[serde(default)]
    pub client_name: Option<String>,
}

/// Locality preference of an ask.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Locality {
    /// Preferred node names.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Preferred rack names.
    #[serde(default)]
    pub racks: Vec<String>,
    /// If true, place anywhere when no preferred node or rack can take the container.
    #[serde(default)]
    pub relax: bool,
}

/// Ask for `count` containers of one shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocate {
    pub request_id: u64,
    pub resources: Resources,
    pub count: u32,
    /// Higher runs first among containers of jobs submitted at the same time.
    #[serde(default)]
    pub priority: u32,
    /// The weakest guarantee the application accepts (Mercury §6.2).
    pub container_type: ContainerType,
    #[serde(default)]
    pub locality: Option<Locality>,
    /// Expected task runtime; feeds the nodes' queue-delay estimates (Mercury §4.2).
    #[serde(default)]
    pub runtime_estimate_ms: Option<u64>,
    pub job_id: String,
    /// When the job was submitted (ms since the Unix epoch); queues are ordered by it (§4.3).
    pub job_submit_time_ms: u64,
    /// GUARANTEED only: the app's reservation this job runs in (Morpheus §4). Its containers are
    /// granted up to the reservation's allocation at that moment and wait beyond it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// GUARANTEED only (Pace §2): `core` components are compulsory for the application,
    /// `elastic` ones only speed it up and are preempted first when shaped allocations no longer
    /// fit. Default `core`.
    #[serde(default, skip_serializing_if = "is_core")]
    pub role: ComponentRole,
    /// GUARANTEED only (Pace §3.2): the resource shaper may resize the running containers to
    /// their forecast use plus a safeguard buffer (never below their use, never above the ask)
    /// and preempt them by its policy. Default false: booked and limited at the ask.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_shaping: bool,
    /// GUARANTEED only (3Sigma): what the job is worth and what it is like. An ask with a job
    /// description is planned by the guarantor's 3Sigma cycle (its `count` containers start
    /// together, a gang) instead of being placed at once where capacity is free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobSpec>,
    /// QUEUEABLE only: containers of this app that nodes shed (event `killed`, reason `shed`)
    /// and that this ask asks for again, each with the node that shed it. The worker's scheduler
    /// that granted them avoids those nodes for off-locality placement until its next cluster
    /// view (Mercury §4.3: a shed is a poor placement its stale view cannot see;
    /// [`crate::issued::IssuedContainers::avoid_nodes_that_shed`]). At most `count` entries.
    /// Default empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces_shed: Vec<ShedContainer>,
}

/// A container a node shed, named in a re-ask ([`Allocate::replaces_shed`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShedContainer {
    pub container_id: ContainerId,
    /// The node that shed it (the `node_id` of its `killed` event).
    pub node_id: NodeId,
}

/// A GUARANTEED ask's job description (3Sigma §3.1, §4.1, §4.3.3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub utility: JobUtility,
    /// What 3σPredict keys runtime histories on, e.g. `name`, `logical_name`, `queue`. The
    /// app id (`user`) and the requested resources are added by the cluster.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// Node attributes every node of the job must have (`worker run --attribute k=v`).
    #[serde(default)]
    pub required: Vec<crate::threesigma::NodeConstraint>,
    /// Node attributes the job prefers; elsewhere it runs `non_preferred_slowdown` × longer.
    #[serde(default)]
    pub preferred: Vec<crate::threesigma::NodeConstraint>,
    /// Default 1.5 (3Sigma §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_preferred_slowdown: Option<f64>,
}

/// What a job's completion is worth (3Sigma §3.1, Fig. 3).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobUtility {
    /// `value` if the job completes by `deadline_ms` (ms since the Unix epoch), nothing after.
    Slo { deadline_ms: u64, value: f64 },
    /// Latency-sensitive best effort: `value` at submission, decaying linearly to zero
    /// `zero_after_ms` after it.
    BestEffort { value: f64, zero_after_ms: u64 },
}

/// Features one job description may carry, and bytes of each name and value.
pub const MAX_JOB_FEATURES: usize = 16;
pub const MAX_JOB_FEATURE_BYTES: usize = 128;
/// Feature names the cluster sets itself (from the app id and the ask); an app may not.
pub const RESERVED_JOB_FEATURES: &[&str] = &["user", "user+name", "resources"];

impl JobSpec {
    /// The job description 3σSched plans with (times in seconds since the Unix epoch), or what
    /// is wrong with the spec.
    pub fn description(
        &self,
        app_id: &str,
        resources: Resources,
        count: u32,
        submit_ms: u64,
    ) -> Result<crate::threesigma::JobDescription, String> {
        use crate::threesigma::Utility;
        if self.features.len() > MAX_JOB_FEATURES {
            return Err(format!("job.features: at most {MAX_JOB_FEATURES} entries"));
        }
        for (k, v) in &self.features {
            if k.len() > MAX_JOB_FEATURE_BYTES || v.len() > MAX_JOB_FEATURE_BYTES {
                return Err(format!(
                    "job.features: names and values are at most {MAX_JOB_FEATURE_BYTES} bytes"
                ));
            }
            if RESERVED_JOB_FEATURES.contains(&k.as_str()) {
                return Err(format!(
                    "job.features.{k}: set by the cluster from the app id and the ask, not by \
                     the app"
                ));
            }
        }
        let utility = match self.utility {
            JobUtility::Slo { deadline_ms, value } => Utility::Slo {
                deadline: deadline_ms as f64 / 1000.0,
                value,
            },
            JobUtility::BestEffort {
                value,
                zero_after_ms,
            } => {
                if zero_after_ms == 0 {
                    return Err("job.utility.zero_after_ms must be positive".into());
                }
                Utility::BestEffort {
                    submit: submit_ms as f64 / 1000.0,
                    value,
                    zero_at: submit_ms.saturating_add(zero_after_ms) as f64 / 1000.0,
                }
            }
        };
        if !(utility.peak().is_finite() && utility.peak() > 0.0) {
            return Err("job.utility.value must be a positive number".into());
        }
        // Most specific first (3σPredict's most-specific rule reads them in this order).
        let mut features = Vec::new();
        if let Some(name) = self.features.get("name") {
            features.push(("user+name".to_string(), format!("{app_id}/{name}")));
        }
        // An app's features are its own: the value is prefixed with the app id, so one app can
        // neither feed another's runtime histories nor read them back through `explain`.
        for (k, v) in &self.features {
            features.push((k.clone(), format!("{app_id}/{v}")));
        }
        features.push((
            "resources".to_string(),
            format!(
                "{}m/{}Mi x{count}",
                resources.cpu_millis, resources.memory_mib
            ),
        ));
        features.push(("user".to_string(), app_id.to_string()));
        let description = crate::threesigma::JobDescription {
            utility,
            features,
            gang: count,
            container: resources,
            required: self.required.clone(),
            preferred: self.preferred.clone(),
            non_preferred_slowdown: self.non_preferred_slowdown.unwrap_or(1.5),
        };
        description.validate().map_err(|e| e.to_string())?;
        Ok(description)
    }
}

impl Allocate {
    /// An ask for `count` containers of `resources` of job `job_id` submitted at
    /// `job_submit_time_ms`, with every optional field at its default (no priority, locality,
    /// runtime estimate or reservation; `core`, not shaped). The client sets `request_id`.
    pub fn new(
        resources: Resources,
        count: u32,
        container_type: ContainerType,
        job_id: impl Into<String>,
        job_submit_time_ms: u64,
    ) -> Allocate {
        Allocate {
            request_id: 0,
            resources,
            count,
            priority: 0,
            container_type,
            locality: None,
            runtime_estimate_ms: None,
            job_id: job_id.into(),
            job_submit_time_ms,
            reservation_id: None,
            role: ComponentRole::Core,
            allow_shaping: false,
            job: None,
            replaces_shed: Vec::new(),
        }
    }
}

fn is_core(role: &ComponentRole) -> bool {
    *role == ComponentRole::Core
}

/// Ask for a (recurring) reservation of GUARANTEED capacity (Morpheus §6.1; YARN's reservation
/// definition language). Answered by `reservation` (accepted, with its allocation) or an error
/// (`reservation_rejected` with the reason, `invalid_request` naming a bad field).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reserve {
    pub request_id: u64,
    /// Chosen by the app: 1 to 128 characters of `A-Z a-z 0-9 . _ -`, unique in the cluster.
    pub reservation_id: String,
    pub definition: ReservationDefinition,
}

/// Replace the definition of one of the app's reservations; the old allocation stays when the
/// new definition does not fit. Answered like `reserve`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateReservation {
    pub request_id: u64,
    pub reservation_id: String,
    pub definition: ReservationDefinition,
}

/// Delete one of the app's reservations; answered by `ack`. Its running containers keep running
/// (as plain GUARANTEED work); its waiting asks are answered `reservation_rejected`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteReservation {
    pub request_id: u64,
    pub reservation_id: String,
}

/// List the app's reservations; answered by `reservations`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListReservations {
    pub request_id: u64,
}

/// Why the app's waiting GUARANTEED job `job_id` (an `allocate` with a `job`, planned by the
/// coordinator's 3Sigma cycle) has not started; answered by `explained`, whose `jobs` is empty
/// when the app has no such job waiting (placed, finished or never asked). An app sees only its
/// own jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explain {
    pub request_id: u64,
    pub job_id: String,
}

/// Answer to `explain`: for each of the app's waiting jobs with that id, its runtime
/// distribution, the options the last cycle considered with their expected utility, and why it
/// was not started (capacity, a better-valued job, a reservation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explained {
    pub request_id: u64,
    pub jobs: Vec<crate::threesigma::JobExplanation>,
}

/// Give a container back (queued or running containers are stopped; unstarted grants freed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub request_id: u64,
    pub container_id: ContainerId,
}

/// Turn a QUEUEABLE container (queued or running) into a GUARANTEED one (Mercury §3.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promote {
    pub request_id: u64,
    pub container_id: ContainerId,
}

/// What to run in a container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub working_dir: Option<String>,
}

/// Start a granted container on the node named in its token (send to that node's worker).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartContainer {
    pub request_id: u64,
    pub token: ContainerToken,
    pub launch: LaunchSpec,
}

/// Stop a container on this node (same effect as `release` for a started container).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopContainer {
    pub request_id: u64,
    pub container_id: ContainerId,
}

/// Receive `event` frames for this application's containers on this connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribe {
    pub request_id: u64,
}

/// Frames a worker sends to an application.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AppResponse {
    Welcome(Welcome),
    Allocated(Allocated),
    Promoted(Promoted),
    ContainerAccepted(ContainerAccepted),
    Ack(Ack),
    Event(ContainerEvent),
    Error(ErrorFrame),
    Reservation(ReservationAccepted),
    Reservations(ReservationList),
    ReservationReprovisioned(ReservationReprovisioned),
    ReservationCancelled(ReservationCancelled),
    Explained(Explained),
}

/// The `type` tags of the requests an app may send (to tell "unknown type" from "bad fields of a
/// known type").
pub const REQUEST_TYPES: &[&str] = &[
    "hello",
    "allocate",
    "release",
    "promote",
    "start_container",
    "stop_container",
    "subscribe",
    "reserve",
    "update_reservation",
    "delete_reservation",
    "list_reservations",
    "explain",
];

impl AppResponse {
    /// The request this frame answers (`None` for `welcome`, events and connection errors).
    pub fn request_id(&self) -> Option<u64> {
        match self {
            AppResponse::Welcome(_)
            | AppResponse::Event(_)
            | AppResponse::ReservationReprovisioned(_)
            | AppResponse::ReservationCancelled(_) => None,
            AppResponse::Reservation(r) => Some(r.request_id),
            AppResponse::Reservations(r) => Some(r.request_id),
            AppResponse::Explained(r) => Some(r.request_id),
            AppResponse::Allocated(a) => Some(a.request_id),
            AppResponse::Promoted(p) => Some(p.request_id),
            AppResponse::ContainerAccepted(c) => Some(c.request_id),
            AppResponse::Ack(a) => Some(a.request_id),
            AppResponse::Error(e) => e.request_id,
        }
    }
}

/// Answer to a good `hello`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub protocol_version: u32,
    pub node_id: String,
    pub max_frame_bytes: u64,
}

/// One granted container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantedContainer {
    pub container_id: ContainerId,
    pub node_id: NodeId,
    /// `host:port` of the app endpoint of the worker to send `start_container` to.
    pub node_endpoint: String,
    pub container_type: ContainerType,
    pub resources: Resources,
    pub token: ContainerToken,
}

/// Grants for an `allocate`. QUEUEABLE asks are answered by one frame. GUARANTEED asks may be
/// answered by several frames as capacity frees up; the last one has `remaining == 0`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocated {
    pub request_id: u64,
    pub containers: Vec<GrantedContainer>,
    /// Containers of this ask still to come in later frames.
    pub remaining: u32,
    /// Containers of this ask that will not be granted in answer to this request (QUEUEABLE:
    /// fewer eligible nodes than containers in this round, or the quota); ask again for them.
    #[serde(default)]
    pub unplaced: u32,
    /// Why `unplaced` is non-zero.
    #[serde(default)]
    pub unplaced_reason: Option<String>,
}

/// Answer to `promote`: the container is GUARANTEED now; the new token replaces the old one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promoted {
    pub request_id: u64,
    pub container_id: ContainerId,
    pub token: ContainerToken,
}

/// Where a started container is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptedState {
    Running,
    Queued,
}

/// Answer to `start_container`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAccepted {
    pub request_id: u64,
    pub container_id: ContainerId,
    pub state: AcceptedState,
}

/// Answer to `reserve` and `update_reservation`: accepted, with the reservation's allocation over
/// the agenda (maximal runs of equal allocation, in agenda ms: the agenda starts at the Unix epoch
/// and repeats every day, so `start_ms` 0 is 00:00 UTC).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationAccepted {
    pub request_id: u64,
    pub reservation_id: String,
    pub allocation: Vec<AllocationInterval>,
}

/// One reservation in `reservations`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationSummary {
    pub reservation_id: String,
    pub definition: ReservationDefinition,
    /// What it allocates now (DRA stretches included).
    pub allocated_now: Resources,
    /// What its GUARANTEED containers hold now.
    pub used: Resources,
}

/// Answer to `list_reservations`, in reservation id order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationList {
    pub request_id: u64,
    pub reservations: Vec<ReservationSummary>,
    /// The plan's free GUARANTEED capacity over the agenda (one day), as maximal runs: what
    /// another reservation could still get (Morpheus §6).
    #[serde(default)]
    pub free: Vec<AllocationInterval>,
}

/// Pushed to the owner's subscribed connections: the reservation's allocation changed, because
/// the cluster shrank and it was placed again (`cause.replanned`), or DRA stretched its current
/// instance (Morpheus §7, `cause.stretched`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationReprovisioned {
    pub reservation_id: String,
    pub allocation: Vec<AllocationInterval>,
    pub cause: ReprovisionCause,
    /// Coordinator clock (ms since the Unix epoch).
    pub at_ms: u64,
}

/// Pushed to the owner's subscribed connections: the reservation is gone (the cluster shrank and
/// it no longer fits). Its waiting asks were answered `reservation_rejected`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationCancelled {
    pub reservation_id: String,
    pub reason: String,
    pub at_ms: u64,
}

/// Answer to `release`, `stop_container`, `subscribe` and `delete_reservation`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    pub request_id: u64,
}

/// Lifecycle events of a container, pushed to subscribed connections of its application.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEvent {
    pub container_id: ContainerId,
    pub node_id: NodeId,
    pub event: ContainerEventKind,
    /// When the event happened on the reporting worker (ms since the Unix epoch).
    pub at_ms: u64,
}

/// What happened to a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ContainerEventKind {
    /// Waiting in the node's queue.
    Queued,
    /// The process was started.
    Running,
    /// The process exited by itself.
    Completed { exit_code: i32 },
    /// The container ended early; `reason` says why, `message` gives details.
    Killed { reason: KillReason, message: String },
    /// The container is now GUARANTEED, with this token version.
    Promoted { version: u32 },
}

/// Machine-readable error classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    VersionMismatch,
    BadCredentials,
    HelloRequired,
    MalformedFrame,
    FrameTooLarge,
    UnknownMessage,
    InvalidRequest,
    AskTooLarge,
    QuotaExceeded,
    InvalidToken,
    UnknownContainer,
    PromotionRefused,
    GuaranteedCapacityExceeded,
    CoordinatorUnavailable,
    Internal,
    /// The worker refused the connection: it serves its maximum of connections, in all or
    /// from the client's address. Sent instead of reading anything; the connection closes.
    TooManyConnections,
    /// A reservation request that is well formed but cannot be granted (no room in the plan,
    /// the id is taken, the reservation belongs to another app, or it was cancelled).
    ReservationRejected,
    /// No reservation with this id.
    UnknownReservation,
}

impl ErrorCode {
    /// Whether the same request may succeed if sent again later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::QuotaExceeded
                | ErrorCode::PromotionRefused
                | ErrorCode::GuaranteedCapacityExceeded
                | ErrorCode::CoordinatorUnavailable
                | ErrorCode::Internal
                | ErrorCode::TooManyConnections
        )
    }

    /// Whether the worker closes the connection after sending this error.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            ErrorCode::VersionMismatch
                | ErrorCode::BadCredentials
                | ErrorCode::HelloRequired
                | ErrorCode::MalformedFrame
                | ErrorCode::FrameTooLarge
                | ErrorCode::TooManyConnections
        )
    }
}

/// An error answer. `request_id` names the request it answers, if it could be read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorFrame {
    pub request_id: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
}

impl ErrorFrame {
    pub fn new(request_id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> ErrorFrame {
        ErrorFrame {
            request_id,
            code,
            message: message.into(),
            retryable: code.retryable(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{from_payload, to_payload};

    /// An app cannot set the features the cluster derives from its id (to feed or read another
    /// app's runtime histories), and its own features are kept apart from other apps'.
    #[test]
    fn job_features_are_the_apps_own() {
        let spec = |features: &[(&str, &str)]| JobSpec {
            utility: JobUtility::BestEffort {
                value: 1.0,
                zero_after_ms: 60_000,
            },
            features: features
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            required: vec![],
            preferred: vec![],
            non_preferred_slowdown: None,
        };
        for key in RESERVED_JOB_FEATURES {
            let e = spec(&[(key, "victim")])
                .description("mallory", Resources::new(1000, 512), 1, 0)
                .unwrap_err();
            assert!(e.contains(&format!("job.features.{key}")), "{e}");
        }
        let d = spec(&[("name", "etl")])
            .description("alice", Resources::new(1000, 512), 2, 0)
            .unwrap();
        let features: Vec<(&str, &str)> = d
            .features
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            features,
            [
                ("user+name", "alice/etl"),
                ("name", "alice/etl"),
                ("resources", "1000m/512Mi x2"),
                ("user", "alice"),
            ]
        );
    }

    #[test]
    fn requests_round_trip_with_type_tag() {
        let req = AppRequest::Allocate(Allocate {
            request_id: 9,
            resources: Resources::new(500, 256),
            count: 3,
            priority: 1,
            container_type: ContainerType::Queueable,
            locality: Some(Locality {
                nodes: vec!["n1".into()],
                racks: vec![],
                relax: true,
            }),
            runtime_estimate_ms: Some(2000),
            job_id: "j".into(),
            job_submit_time_ms: 5,
            reservation_id: None,
            role: Default::default(),
            allow_shaping: false,
            job: None,
            replaces_shed: Vec::new(),
        });
        let bytes = to_payload(&req).unwrap();
        assert_eq!(from_payload::<AppRequest>(&bytes).unwrap(), req);
        let env: crate::protocol::Envelope = from_payload(&bytes).unwrap();
        assert_eq!(env.kind, "allocate");
        assert_eq!(env.request_id, Some(9));
    }

    #[test]
    fn optional_fields_may_be_omitted_by_clients() {
        // A minimal allocate as a client in another language would write it.
        #[derive(Serialize)]
        struct Minimal<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            request_id: u64,
            resources: Resources,
            count: u32,
            container_type: &'a str,
            job_id: &'a str,
            job_submit_time_ms: u64,
        }
        let bytes = to_payload(&Minimal {
            kind: "allocate",
            request_id: 1,
            resources: Resources::new(1, 1),
            count: 1,
            container_type: "GUARANTEED",
            job_id: "j",
            job_submit_time_ms: 0,
        })
        .unwrap();
        match from_payload::<AppRequest>(&bytes).unwrap() {
            AppRequest::Allocate(a) => {
                assert_eq!(a.container_type, ContainerType::Guaranteed);
                assert_eq!(a.locality, None);
                assert_eq!(a.priority, 0);
            }
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn events_carry_kind_tags() {
        let ev = AppResponse::Event(ContainerEvent {
            container_id: ContainerId::new(1, 2),
            node_id: NodeId::from("n"),
            event: ContainerEventKind::Killed {
                reason: KillReason::Shed,
                message: "x".into(),
            },
            at_ms: 3,
        });
        let bytes = to_payload(&ev).unwrap();
        assert_eq!(from_payload::<AppResponse>(&bytes).unwrap(), ev);
    }
}

//! The node runtime policy (Mercury §3.4 and §4.3): what starts, queues, waits, is preempted or
//! is shed on one node. Sans-IO: the caller feeds it container submissions, exits and cluster
//! hints with `now`; it answers with [`NodeEvent`]s the caller acts on (launch or kill a process)
//! and forwards to the application.
//!
//! Rules:
//! - GUARANTEED containers start at once if they fit. If they do not fit because of running
//!   QUEUEABLE containers, QUEUEABLE containers are killed, most recently started first (they lost
//!   least work), until the GUARANTEED container fits (§3.4 "GUARANTEED - QUEUEABLE"). A
//!   GUARANTEED container never is preempted. If it cannot fit even then (the central view was
//!   stale), it waits ahead of all QUEUEABLE work and starts as soon as it fits.
//! - The node is the last word on its GUARANTEED capacity: it refuses a GUARANTEED container (or
//!   a promotion) that would make the GUARANTEED work on it, running and waiting, exceed its
//!   capacity ([`NodeError::GuaranteedCapacityExceeded`]). The guarantor never books a node past
//!   its capacity, so this refuses only grants made on a stale central view (a grant from before a
//!   coordinator restart, a release racing a start): whatever the central bookkeeping believes,
//!   GUARANTEED work on a node never exceeds what the node has.
//! - QUEUEABLE containers wait in a node-local queue ordered by their job's submit time (queue
//!   reordering, §4.3), then priority, then arrival; with reordering off, by arrival. They start in
//!   that order whenever they fit in both the node's free resources and the policing limit for
//!   opportunistic work (§4.3 "Resource policing"); a container that does not fit does not block
//!   smaller ones behind it (no head-of-line blocking).
//! - Load shedding (§4.3): queued QUEUEABLE containers are discarded, newest (last in queue
//!   order) first, while the newest would wait longer than the coordinator's threshold.
//! - Re-placement (an addition to Mercury; [`NodeRuntime::shed_held_by_guaranteed`]): queued
//!   QUEUEABLE containers that long GUARANTEED work holds back past what a placement on the
//!   view's top-k would wait are shed, so their job managers place them again.

use crate::queue_delay::QueueDelay;
use crate::{AppId, ContainerId, ContainerType, JobId, KillReason, Resources, Time};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// Node runtime settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRuntimeConfig {
    /// Resources this node gives to containers.
    pub capacity: Resources,
    /// Order the QUEUEABLE queue by job submit time (Mercury §4.3); FIFO by arrival if false.
    pub reorder_by_job_submit_time: bool,
    /// Runtime assumed for containers that came without an estimate (for R only).
    pub default_runtime_estimate_ms: u64,
    /// Bound on queued QUEUEABLE containers (protects the node from abuse).
    pub max_queue_length: usize,
}

impl NodeRuntimeConfig {
    pub fn new(capacity: Resources) -> Self {
        NodeRuntimeConfig {
            capacity,
            reorder_by_job_submit_time: true,
            default_runtime_estimate_ms: 10_000,
            max_queue_length: 100_000,
        }
    }
}

/// A container as the node runtime knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub id: ContainerId,
    pub app_id: AppId,
    pub job_id: JobId,
    pub job_submit_time: Time,
    pub priority: u32,
    pub container_type: ContainerType,
    pub resources: Resources,
    pub runtime_estimate_ms: Option<u64>,
    /// Token version it was started with.
    pub version: u32,
    /// How many times nodes shed or returned the container this one re-places (its token says
    /// so, see [`crate::token::TokenBody::times_returned`]): [`NodeRuntime::shed_held_by_guaranteed`]
    /// returns it again only past a bound doubled per return, and never after [`MAX_RETURNS`],
    /// so returned work cannot bounce between nodes for ever.
    #[serde(default)]
    pub times_returned: u8,
}

impl ContainerSpec {
    /// The container a grant's token describes, as the node runtime is handed it when the
    /// app starts it.
    pub fn granted_by(body: &crate::token::TokenBody) -> ContainerSpec {
        ContainerSpec {
            id: body.container_id,
            app_id: body.app_id.clone(),
            job_id: body.job_id.clone(),
            job_submit_time: Time::from_millis(body.job_submit_time_ms),
            priority: body.priority,
            container_type: body.container_type,
            resources: body.resources,
            runtime_estimate_ms: body.runtime_estimate_ms,
            version: body.version,
            times_returned: body.times_returned,
        }
    }

    /// It has returns left ([`MAX_RETURNS`]) should it wait queued behind GUARANTEED work.
    pub fn may_be_returned(&self) -> bool {
        self.times_returned < MAX_RETURNS
    }

    /// The exponent of its return bound ([`return_bound`]), if it has returns left.
    fn backoff_exponent(&self) -> Option<u8> {
        self.may_be_returned()
            .then(|| self.times_returned.min(RETURN_BACKOFF_MAX_EXPONENT))
    }
}

/// A queued QUEUEABLE container is returned at most this many times in all (sheds of either
/// kind count): the attempt limit of Ethernet's truncated binary exponential backoff (IEEE
/// 802.3 §4.4.2, attemptLimit = 16). See docs/experiments/mercury/parameters.md.
pub const MAX_RETURNS: u8 = 16;

/// The backoff's exponent stops growing here (IEEE 802.3 §4.2.3.2.5: k = min(n, 10)).
pub const RETURN_BACKOFF_MAX_EXPONENT: u8 = 10;

/// The wait past which a queued container already returned `times_returned` times goes back
/// again: `bound` × 2^min(times_returned, 10) (truncated binary exponential backoff), or `None`
/// once it has been returned [`MAX_RETURNS`] times.
pub fn return_bound(bound: Duration, times_returned: u8) -> Option<Duration> {
    (times_returned < MAX_RETURNS)
        .then(|| backoff_bound(bound, times_returned.min(RETURN_BACKOFF_MAX_EXPONENT)))
}

/// `bound` × 2^`exponent` (`exponent` at most [`RETURN_BACKOFF_MAX_EXPONENT`]).
fn backoff_bound(bound: Duration, exponent: u8) -> Duration {
    bound.saturating_mul(1 << exponent)
}

/// What the caller must do / report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeEvent {
    /// The container entered the QUEUEABLE queue (report `queued`).
    Queued { id: ContainerId },
    /// A GUARANTEED container waits for resources held by other GUARANTEED work.
    WaitingGuaranteed { id: ContainerId },
    /// Launch the container's process now (report `running`).
    Start { id: ContainerId },
    /// The container is gone. If `was_running`, kill its process tree.
    Killed {
        id: ContainerId,
        reason: KillReason,
        was_running: bool,
        message: String,
    },
    /// The container exited by itself (or failed to launch) and its resources are free.
    Finished { id: ContainerId, exit_code: i32 },
    /// The container is GUARANTEED now.
    Promoted { id: ContainerId, version: u32 },
}

/// Refusals. None changes the node's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("container {0} is already known on this node")]
    Duplicate(ContainerId),
    #[error("container {id} asks for {asked} but the node has only {capacity}")]
    LargerThanNode {
        id: ContainerId,
        asked: Resources,
        capacity: Resources,
    },
    #[error(
        "GUARANTEED container {id} ({asked}) does not fit: GUARANTEED work on this node already \
         holds {guaranteed} of {capacity}"
    )]
    GuaranteedCapacityExceeded {
        id: ContainerId,
        asked: Resources,
        guaranteed: Resources,
        capacity: Resources,
    },
    #[error(
        "running container {id} ({asked}) cannot be taken back: only {free} of the node is free"
    )]
    NoRoomToAdopt {
        id: ContainerId,
        asked: Resources,
        free: Resources,
    },
    #[error("the worker is upgrading in place: retry in a moment")]
    Upgrading,
    #[error("the QUEUEABLE queue is full ({0} containers)")]
    QueueFull(usize),
    #[error("container {0} is not on this node")]
    Unknown(ContainerId),
    #[error("container {id} belongs to app {owner}, not {requester}")]
    NotOwner {
        id: ContainerId,
        owner: String,
        requester: String,
    },
    #[error("container {id} is GUARANTEED already")]
    AlreadyGuaranteed { id: ContainerId },
    #[error(
        "promotion of {id} to version {new_version} is not above the current version {current}"
    )]
    StaleVersion {
        id: ContainerId,
        new_version: u32,
        current: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct QueueKey {
    /// Job submit time when reordering, else zero (so arrival order decides).
    job_submit_time: Time,
    /// Inverted priority (higher priority sorts first).
    inv_priority: u32,
    arrival_seq: u64,
}

#[derive(Clone, Debug)]
struct Running {
    spec: ContainerSpec,
    started_at: Time,
    start_seq: u64,
}

/// A running container's term of Tr, kept apart from its spec so that the sum over running
/// containers reads a dense array rather than walking the container map. Its resources and
/// class are here too: the held-work replay ([`NodeRuntime::shed_held_by_guaranteed`]) reads
/// every running container at many heartbeats and needs nothing else of it.
#[derive(Clone, Copy, Debug)]
struct RemainingWorkTerm {
    id: ContainerId,
    started_at: Time,
    estimate_ms: f64,
    dominant_share: f64,
    resources: Resources,
    queueable: bool,
}

impl RemainingWorkTerm {
    /// Expected time left, as in Tr: a container past its estimate is expected to end soon but
    /// not now, so a tenth of the estimate is kept as its remaining time rather than zero.
    fn remaining_ms(&self, now: Time) -> f64 {
        let elapsed = now.saturating_since(self.started_at).as_secs_f64() * 1000.0;
        if elapsed < self.estimate_ms {
            self.estimate_ms - elapsed
        } else {
            self.estimate_ms * 0.1
        }
    }
}

/// Where a container currently is on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    Running,
    Queued,
    WaitingGuaranteed,
}

/// A summary row per container, for heartbeats and inspection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub id: ContainerId,
    pub app_id: AppId,
    pub container_type: ContainerType,
    pub resources: Resources,
    pub placement: Placement,
    /// Token version (bumped by promotion).
    pub version: u32,
    /// The job fields of the container's token, so the coordinator can re-issue the token on
    /// promotion (Mercury §3.4) without the application resending it. Optional on the wire for
    /// clients that do not send it; [`NodeRuntime::statuses`] always fills it.
    #[serde(default)]
    pub job: Option<ContainerJob>,
    /// The container's measured use (CPU, resident memory) as its node last sampled it: the
    /// resource shaper's input (Pace §3, "Resource monitor"). Absent when not sampled yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Resources>,
    /// The signed token a GUARANTEED container was started (or promoted) with, when its grant
    /// was booked other than as plain core work (a reservation, shaping, an elastic role):
    /// sent in the `join` list so a restarted coordinator books the container again exactly as
    /// it was ([`crate::guarantor::verified_booking`]). Absent otherwise, and in heartbeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_token: Option<crate::token::ContainerToken>,
}

/// Job fields a container's token carries (see [`crate::token::TokenBody`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerJob {
    pub job_id: JobId,
    /// ms on the caller's clock (wall clock since the Unix epoch in the real system).
    pub job_submit_time_ms: u64,
    pub priority: u32,
    pub runtime_estimate_ms: Option<u64>,
}

/// The node runtime state machine.
#[derive(Clone, Debug)]
pub struct NodeRuntime {
    config: NodeRuntimeConfig,
    /// Max resources QUEUEABLE containers may hold together (policing, §4.3).
    queueable_limit: Resources,
    /// Ordered so that sums over running containers (the queue-delay estimate) add in the same
    /// order in every process: a simulation must be bit-for-bit reproducible for a seed.
    running: BTreeMap<ContainerId, Running>,
    /// One term per running container, sorted by id like `running` (same summation order).
    remaining_work_terms: Vec<RemainingWorkTerm>,
    queue: BTreeMap<QueueKey, ContainerSpec>,
    queue_keys: HashMap<ContainerId, QueueKey>,
    waiting_guaranteed: VecDeque<ContainerSpec>,
    /// Σ over queued and waiting containers of estimate × dominant share, as an exact integer
    /// (see [`NodeRuntime::work_weight`]), so Tq is O(1) however long the queue is.
    waiting_work: u128,
    /// Queued containers with returns left (the ones [`NodeRuntime::shed_held_by_guaranteed`]
    /// may return), by backoff exponent (`min(times_returned, 10)`), so a node none of whose
    /// queued work could go back now (none left, or every bound past what GUARANTEED work holds)
    /// skips that replay without walking its queue.
    queued_by_backoff: [usize; RETURN_BACKOFF_MAX_EXPONENT as usize + 1],
    allocated: Resources,
    queueable_allocated: Resources,
    next_seq: u64,
    /// When a QUEUEABLE container last started (for Tl).
    last_queueable_start: Time,
    /// Since when a new QUEUEABLE container could not start at once (for Tl).
    blocked_since: Option<Time>,
    events: Vec<NodeEvent>,
}

impl NodeRuntime {
    pub fn new(config: NodeRuntimeConfig, now: Time) -> NodeRuntime {
        NodeRuntime {
            queueable_limit: config.capacity,
            config,
            running: BTreeMap::new(),
            remaining_work_terms: Vec::new(),
            queue: BTreeMap::new(),
            queue_keys: HashMap::new(),
            waiting_guaranteed: VecDeque::new(),
            waiting_work: 0,
            queued_by_backoff: Default::default(),
            allocated: Resources::ZERO,
            queueable_allocated: Resources::ZERO,
            next_seq: 0,
            last_queueable_start: now,
            blocked_since: None,
            events: Vec::new(),
        }
    }

    pub fn config(&self) -> &NodeRuntimeConfig {
        &self.config
    }

    pub fn capacity(&self) -> Resources {
        self.config.capacity
    }

    /// Resources held by running containers.
    pub fn allocated(&self) -> Resources {
        self.allocated
    }

    /// Resources held by running GUARANTEED containers.
    pub fn guaranteed_allocated(&self) -> Resources {
        self.allocated.saturating_sub(&self.queueable_allocated)
    }

    /// Resources held or awaited by GUARANTEED containers: running ones plus those waiting to
    /// start. Never above the capacity (see [`NodeError::GuaranteedCapacityExceeded`]).
    pub fn guaranteed_committed(&self) -> Resources {
        self.waiting_guaranteed
            .iter()
            .fold(self.guaranteed_allocated(), |acc, c| {
                acc.saturating_add(&c.resources)
            })
    }

    /// Refuse `id` if `asked` more GUARANTEED work would not fit in the node's capacity.
    fn check_guaranteed_fits(&self, id: ContainerId, asked: Resources) -> Result<(), NodeError> {
        let guaranteed = self.guaranteed_committed();
        if guaranteed
            .saturating_add(&asked)
            .fits_in(&self.config.capacity)
        {
            Ok(())
        } else {
            Err(NodeError::GuaranteedCapacityExceeded {
                id,
                asked,
                guaranteed,
                capacity: self.config.capacity,
            })
        }
    }

    pub fn queueable_allocated(&self) -> Resources {
        self.queueable_allocated
    }

    pub fn queueable_limit(&self) -> Resources {
        self.queueable_limit
    }

    pub fn running_count(&self) -> usize {
        self.running.len()
    }

    pub fn queued_count(&self) -> usize {
        self.queue.len()
    }

    pub fn waiting_guaranteed_count(&self) -> usize {
        self.waiting_guaranteed.len()
    }

    /// Take the events produced since the last call.
    pub fn drain_events(&mut self) -> Vec<NodeEvent> {
        std::mem::take(&mut self.events)
    }

    /// Where a container is, if it is on this node.
    pub fn placement(&self, id: ContainerId) -> Option<Placement> {
        if self.running.contains_key(&id) {
            Some(Placement::Running)
        } else if self.queue_keys.contains_key(&id) {
            Some(Placement::Queued)
        } else if self.waiting_guaranteed.iter().any(|c| c.id == id) {
            Some(Placement::WaitingGuaranteed)
        } else {
            None
        }
    }

    /// The spec of a container on this node.
    pub fn spec(&self, id: ContainerId) -> Option<&ContainerSpec> {
        if let Some(r) = self.running.get(&id) {
            return Some(&r.spec);
        }
        if let Some(k) = self.queue_keys.get(&id) {
            return self.queue.get(k);
        }
        self.waiting_guaranteed.iter().find(|c| c.id == id)
    }

    /// Every container on the node.
    pub fn statuses(&self) -> Vec<ContainerStatus> {
        let row = |c: &ContainerSpec, placement| ContainerStatus {
            id: c.id,
            app_id: c.app_id.clone(),
            container_type: c.container_type,
            resources: c.resources,
            placement,
            version: c.version,
            job: Some(ContainerJob {
                job_id: c.job_id.clone(),
                job_submit_time_ms: c.job_submit_time.as_millis(),
                priority: c.priority,
                runtime_estimate_ms: c.runtime_estimate_ms,
            }),
            usage: None,
            grant_token: None,
        };
        let mut out: Vec<ContainerStatus> = self
            .running
            .values()
            .map(|r| row(&r.spec, Placement::Running))
            .collect();
        out.extend(
            self.waiting_guaranteed
                .iter()
                .map(|c| row(c, Placement::WaitingGuaranteed)),
        );
        out.extend(self.queue.values().map(|c| row(c, Placement::Queued)));
        out.sort_by_key(|s| s.id);
        out
    }

    /// Set the policing limit for opportunistic work (Mercury §4.3). Lowering it does not kill
    /// running QUEUEABLE containers (the point of policing is to avoid kills); it stops new starts.
    pub fn set_queueable_limit(&mut self, now: Time, limit: Resources) {
        self.queueable_limit = limit.min(&self.config.capacity);
        self.start_pending(now);
    }

    /// A container arrives with a valid token (`start_container`).
    pub fn submit(&mut self, now: Time, spec: ContainerSpec) -> Result<(), NodeError> {
        if self.placement(spec.id).is_some() {
            return Err(NodeError::Duplicate(spec.id));
        }
        if !spec.resources.fits_in(&self.config.capacity) {
            return Err(NodeError::LargerThanNode {
                id: spec.id,
                asked: spec.resources,
                capacity: self.config.capacity,
            });
        }
        match spec.container_type {
            ContainerType::Guaranteed => {
                self.check_guaranteed_fits(spec.id, spec.resources)?;
                let id = spec.id;
                self.waiting_work += self.work_weight(&spec);
                self.waiting_guaranteed.push_back(spec);
                self.start_pending(now);
                if self.placement(id) == Some(Placement::WaitingGuaranteed) {
                    self.events.push(NodeEvent::WaitingGuaranteed { id });
                }
            }
            ContainerType::Queueable => {
                if self.queue.len() >= self.config.max_queue_length {
                    return Err(NodeError::QueueFull(self.queue.len()));
                }
                let id = spec.id;
                self.enqueue(spec);
                self.start_pending(now);
                if self.queue_keys.contains_key(&id) {
                    self.events.push(NodeEvent::Queued { id });
                }
            }
        }
        Ok(())
    }

    fn enqueue(&mut self, spec: ContainerSpec) {
        let key = QueueKey {
            job_submit_time: if self.config.reorder_by_job_submit_time {
                spec.job_submit_time
            } else {
                Time::ZERO
            },
            inv_priority: u32::MAX - spec.priority,
            arrival_seq: self.next_seq,
        };
        self.next_seq += 1;
        self.queue_keys.insert(spec.id, key.clone());
        self.waiting_work += self.work_weight(&spec);
        if let Some(e) = spec.backoff_exponent() {
            self.queued_by_backoff[e as usize] += 1;
        }
        self.queue.insert(key, spec);
    }

    /// A queued container left the queue: it no longer counts in `queued_by_backoff`.
    fn uncount_queued(&mut self, spec: &ContainerSpec) {
        if let Some(e) = spec.backoff_exponent() {
            self.queued_by_backoff[e as usize] -= 1;
        }
    }

    fn free(&self) -> Resources {
        self.config.capacity.saturating_sub(&self.allocated)
    }

    fn queueable_headroom(&self) -> Resources {
        self.free().min(
            &self
                .queueable_limit
                .saturating_sub(&self.queueable_allocated),
        )
    }

    /// After `start_pending`, a new QUEUEABLE container could start at once only if nothing waits
    /// and there is opportunistic headroom in every dimension.
    fn can_start_queueable_now(&self) -> bool {
        let headroom = self.queueable_headroom();
        self.waiting_guaranteed.is_empty()
            && self.queue.is_empty()
            && headroom.cpu_millis > 0
            && headroom.memory_mib > 0
    }

    /// Books a container that is already running here, started at `started_at`, without a
    /// `Start` event: a worker that upgraded in place (`execve`) takes its running containers
    /// back this way before it re-joins. Refused, changing nothing, if it is already known or
    /// would take the node, or its GUARANTEED work, past the capacity (the caller then kills it).
    pub fn adopt_running(
        &mut self,
        started_at: Time,
        spec: ContainerSpec,
    ) -> Result<(), NodeError> {
        if self.placement(spec.id).is_some() {
            return Err(NodeError::Duplicate(spec.id));
        }
        if !spec.resources.fits_in(&self.free()) {
            return Err(NodeError::NoRoomToAdopt {
                id: spec.id,
                asked: spec.resources,
                free: self.free(),
            });
        }
        if spec.container_type == ContainerType::Guaranteed {
            self.check_guaranteed_fits(spec.id, spec.resources)?;
        }
        self.launch(started_at, spec);
        if let Some(NodeEvent::Start { .. }) = self.events.last() {
            self.events.pop();
        }
        Ok(())
    }

    fn launch(&mut self, now: Time, spec: ContainerSpec) {
        self.allocated = self.allocated.saturating_add(&spec.resources);
        if spec.container_type == ContainerType::Queueable {
            self.queueable_allocated = self.queueable_allocated.saturating_add(&spec.resources);
            self.last_queueable_start = now;
        }
        let id = spec.id;
        let term = RemainingWorkTerm {
            id,
            started_at: now,
            estimate_ms: self.estimate_ms(&spec),
            dominant_share: spec.resources.dominant_share(&self.config.capacity),
            resources: spec.resources,
            queueable: spec.container_type == ContainerType::Queueable,
        };
        match self
            .remaining_work_terms
            .binary_search_by_key(&id, |t| t.id)
        {
            Ok(at) => self.remaining_work_terms[at] = term,
            Err(at) => self.remaining_work_terms.insert(at, term),
        }
        self.running.insert(
            id,
            Running {
                spec,
                started_at: now,
                start_seq: self.next_seq,
            },
        );
        self.next_seq += 1;
        self.events.push(NodeEvent::Start { id });
    }

    fn remove_running(&mut self, id: ContainerId) -> Option<Running> {
        let r = self.running.remove(&id)?;
        if let Ok(at) = self
            .remaining_work_terms
            .binary_search_by_key(&id, |t| t.id)
        {
            self.remaining_work_terms.remove(at);
        }
        self.allocated = self.allocated.saturating_sub(&r.spec.resources);
        if r.spec.container_type == ContainerType::Queueable {
            self.queueable_allocated = self.queueable_allocated.saturating_sub(&r.spec.resources);
        }
        Some(r)
    }

    /// Start what can start: waiting GUARANTEED first (preempting QUEUEABLE), then queued
    /// QUEUEABLE in queue order, skipping any that does not fit.
    fn start_pending(&mut self, now: Time) {
        self.start_what_fits(now);
        match (self.can_start_queueable_now(), self.blocked_since) {
            (false, None) => self.blocked_since = Some(now),
            (true, Some(_)) => self.blocked_since = None,
            _ => {}
        }
    }

    fn start_what_fits(&mut self, now: Time) {
        while let Some(g) = self.waiting_guaranteed.front() {
            let need = g.resources;
            if !need.fits_in(&self.free()) && !self.preempt_queueable_for(now, need, g.id) {
                break;
            }
            let g = self.waiting_guaranteed.pop_front().expect("front exists");
            self.waiting_work -= self.work_weight(&g);
            self.launch(now, g);
        }
        if !self.waiting_guaranteed.is_empty() {
            return;
        }
        let mut headroom = self.queueable_headroom();
        if headroom.is_zero() {
            return;
        }
        let mut startable: Vec<QueueKey> = Vec::new();
        for (k, c) in &self.queue {
            // Once the headroom is used up nothing more starts (as at the top of this function);
            // stopping here keeps a start O(started) rather than O(queue length).
            if headroom.is_zero() {
                break;
            }
            if c.resources.fits_in(&headroom) {
                headroom = headroom.saturating_sub(&c.resources);
                startable.push(k.clone());
            }
        }
        for k in startable {
            let spec = self.queue.remove(&k).expect("key from queue");
            self.queue_keys.remove(&spec.id);
            self.waiting_work -= self.work_weight(&spec);
            self.uncount_queued(&spec);
            self.launch(now, spec);
        }
    }

    /// Kill running QUEUEABLE containers, most recently started first, until `need` fits in the
    /// free resources. Kills nothing and returns false if even killing all of them would not
    /// make it fit.
    fn preempt_queueable_for(&mut self, _now: Time, need: Resources, for_id: ContainerId) -> bool {
        let reclaimable = self.free().saturating_add(&self.queueable_allocated);
        if !need.fits_in(&reclaimable) {
            return false;
        }
        let mut victims: Vec<(u64, ContainerId)> = self
            .running
            .values()
            .filter(|r| r.spec.container_type == ContainerType::Queueable)
            .map(|r| (r.start_seq, r.spec.id))
            .collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        for (_, id) in victims {
            if need.fits_in(&self.free()) {
                break;
            }
            self.remove_running(id);
            self.events.push(NodeEvent::Killed {
                id,
                reason: KillReason::PreemptedByGuaranteed,
                was_running: true,
                message: format!("killed to make room for GUARANTEED container {for_id}"),
            });
        }
        need.fits_in(&self.free())
    }

    /// A running container's process ended by itself (or could not be launched).
    pub fn on_exit(&mut self, now: Time, id: ContainerId, exit_code: i32) -> Result<(), NodeError> {
        self.remove_running(id).ok_or(NodeError::Unknown(id))?;
        self.events.push(NodeEvent::Finished { id, exit_code });
        self.start_pending(now);
        Ok(())
    }

    /// The infrastructure ended a running container for its own reason (e.g. memory limit).
    pub fn on_failure(
        &mut self,
        now: Time,
        id: ContainerId,
        message: String,
    ) -> Result<(), NodeError> {
        self.remove_running(id).ok_or(NodeError::Unknown(id))?;
        self.events.push(NodeEvent::Killed {
            id,
            reason: KillReason::Failed,
            was_running: false,
            message,
        });
        self.start_pending(now);
        Ok(())
    }

    /// The application stops or releases a container (queued, waiting or running).
    pub fn stop(&mut self, now: Time, id: ContainerId, requester: &AppId) -> Result<(), NodeError> {
        let spec = self.spec(id).ok_or(NodeError::Unknown(id))?;
        if &spec.app_id != requester {
            return Err(NodeError::NotOwner {
                id,
                owner: spec.app_id.to_string(),
                requester: requester.to_string(),
            });
        }
        self.remove(
            now,
            id,
            KillReason::Released,
            "released by the application".to_string(),
        );
        Ok(())
    }

    /// Remove a container wherever it is, reporting `reason`.
    /// Remove a container on the cluster's order (not its app's): e.g. one the coordinator
    /// reported `lost` while this node was cut off, or whose grant was revoked.
    pub fn kill(
        &mut self,
        now: Time,
        id: ContainerId,
        reason: KillReason,
        message: String,
    ) -> Result<(), NodeError> {
        if self.placement(id).is_none() {
            return Err(NodeError::Unknown(id));
        }
        self.remove(now, id, reason, message);
        Ok(())
    }

    fn remove(&mut self, now: Time, id: ContainerId, reason: KillReason, message: String) {
        self.take_out(id, reason, message);
        self.start_pending(now);
    }

    /// [`NodeRuntime::remove`] without starting what the removal makes room for.
    fn take_out(&mut self, id: ContainerId, reason: KillReason, message: String) {
        let was_running = self.remove_running(id).is_some();
        if !was_running {
            if let Some(k) = self.queue_keys.remove(&id) {
                if let Some(spec) = self.queue.remove(&k) {
                    self.waiting_work -= self.work_weight(&spec);
                    self.uncount_queued(&spec);
                }
            } else if let Some(spec) = self
                .waiting_guaranteed
                .iter()
                .position(|c| c.id == id)
                .and_then(|pos| self.waiting_guaranteed.remove(pos))
            {
                self.waiting_work -= self.work_weight(&spec);
            }
        }
        self.events.push(NodeEvent::Killed {
            id,
            reason,
            was_running,
            message,
        });
    }

    /// Resize a running GUARANTEED container to its shaped allocation (Pace §3.2,
    /// RESIZECOMPONENT): the node's accounting follows, a shrink lets waiting work start, a
    /// growth takes free room and then preempts QUEUEABLE work like a GUARANTEED start
    /// (Mercury §3.4). Refused, changing nothing, when the growth does not fit the node's
    /// GUARANTEED capacity.
    pub fn resize(&mut self, now: Time, id: ContainerId, to: Resources) -> Result<(), NodeError> {
        let r = self.running.get(&id).ok_or(NodeError::Unknown(id))?;
        if r.spec.container_type != ContainerType::Guaranteed {
            return Err(NodeError::Unknown(id));
        }
        let from = r.spec.resources;
        let growth = to.saturating_sub(&from);
        if !growth.is_zero() {
            self.check_guaranteed_fits(id, growth)?;
            if !growth.fits_in(&self.free()) && !self.preempt_queueable_for(now, growth, id) {
                return Err(NodeError::GuaranteedCapacityExceeded {
                    id,
                    asked: growth,
                    guaranteed: self.guaranteed_committed(),
                    capacity: self.config.capacity,
                });
            }
        }
        let r = self.running.get_mut(&id).expect("checked above");
        r.spec.resources = to;
        self.allocated = self.allocated.saturating_sub(&from).saturating_add(&to);
        if let Ok(at) = self
            .remaining_work_terms
            .binary_search_by_key(&id, |t| t.id)
        {
            let term = &mut self.remaining_work_terms[at];
            term.dominant_share = to.dominant_share(&self.config.capacity);
            term.resources = to;
        }
        self.start_pending(now);
        Ok(())
    }

    /// Promote a QUEUEABLE container to GUARANTEED after the central side validated capacity
    /// (Mercury §3.4). A queued one leaves the queue and starts like a GUARANTEED arrival
    /// (preempting other QUEUEABLE work if needed); a running one just changes class.
    pub fn promote(
        &mut self,
        now: Time,
        id: ContainerId,
        new_version: u32,
    ) -> Result<(), NodeError> {
        let spec = self.spec(id).ok_or(NodeError::Unknown(id))?;
        if spec.container_type == ContainerType::Guaranteed {
            return Err(NodeError::AlreadyGuaranteed { id });
        }
        if new_version <= spec.version {
            return Err(NodeError::StaleVersion {
                id,
                new_version,
                current: spec.version,
            });
        }
        self.check_guaranteed_fits(id, spec.resources)?;
        if let Some(r) = self.running.get_mut(&id) {
            r.spec.container_type = ContainerType::Guaranteed;
            r.spec.version = new_version;
            self.queueable_allocated = self.queueable_allocated.saturating_sub(&r.spec.resources);
            if let Ok(at) = self
                .remaining_work_terms
                .binary_search_by_key(&id, |t| t.id)
            {
                self.remaining_work_terms[at].queueable = false;
            }
            self.events.push(NodeEvent::Promoted {
                id,
                version: new_version,
            });
            self.start_pending(now);
            return Ok(());
        }
        let key = self.queue_keys.remove(&id).ok_or(NodeError::Unknown(id))?;
        let mut spec = self.queue.remove(&key).ok_or(NodeError::Unknown(id))?;
        self.uncount_queued(&spec);
        spec.container_type = ContainerType::Guaranteed;
        spec.version = new_version;
        self.events.push(NodeEvent::Promoted {
            id,
            version: new_version,
        });
        self.waiting_guaranteed.push_back(spec);
        self.start_pending(now);
        Ok(())
    }

    /// Shed queued QUEUEABLE containers, newest in queue order first, while the newest one would
    /// wait longer than `threshold_ms` before it starts (Mercury §4.3 "Dynamically (re)-balancing
    /// load"; §6.3: an outlier node "discards an appropriate number of queued containers so as
    /// to fit the target"). Returns the shed containers.
    ///
    /// The threshold is a target *queuing delay*. The newest container starts after the work
    /// ahead of it, R minus its own term, so it fits the target when that is at most
    /// `threshold_ms`, even if R counting its own work is above it. Comparing R itself would shed
    /// a container whose wait already fits, from a node up to one container's work above the
    /// target; such sheds only move work between nodes that are about equally loaded
    /// (docs/experiments/mercury/diagnosis.md, follow-up section).
    pub fn shed_to_threshold(&mut self, now: Time, threshold_ms: f64) -> Vec<ContainerId> {
        let mut shed = Vec::new();
        if self.queue.is_empty() {
            // Nothing queued, nothing to shed (and R need not be computed).
            return shed;
        }
        // Shedding a queued container lowers R by exactly its Tq term, so one full estimate and
        // then a subtraction per victim keeps this linear in the queue length.
        let mut estimate_ms = self.queue_delay(now).total_ms();
        let denominator = self.work_denominator() as f64;
        while let Some((key, newest)) = self.queue.iter().next_back() {
            let own_work_ms = self.work_weight(newest) as f64 / denominator;
            if estimate_ms - own_work_ms <= threshold_ms {
                break;
            }
            let key = key.clone();
            let spec = self.queue.remove(&key).expect("key from queue");
            self.queue_keys.remove(&spec.id);
            self.uncount_queued(&spec);
            let weight = self.work_weight(&spec);
            self.waiting_work -= weight;
            estimate_ms -= weight as f64 / denominator;
            self.events.push(NodeEvent::Killed {
                id: spec.id,
                reason: KillReason::Shed,
                was_running: false,
                message: format!(
                    "shed: node queue delay above the cluster threshold of {threshold_ms:.0} ms; ask again elsewhere"
                ),
            });
            shed.push(spec.id);
        }
        if !shed.is_empty() {
            self.start_pending(now);
        }
        shed
    }

    /// Queued QUEUEABLE containers that GUARANTEED work holds back longer than a re-placement
    /// would wait go back to their job managers (shed, reason [`KillReason::Shed`]), newest in
    /// queue order first; returns them.
    ///
    /// Why (an addition to Mercury, measured in docs/experiments/mercury/diagnosis.md): the
    /// distributed schedulers route QUEUEABLE work by the R of the last round, while the central
    /// scheduler fills a node with GUARANTEED work between rounds. Mercury §3.4 resolves the
    /// conflict for *running* QUEUEABLE containers (killed) and delays the queued ones "until
    /// resources become available" — behind long GUARANTEED work that is the whole run of that
    /// work, while the nodes of the current top-k would start them in about `bound_ms`. Such a
    /// node is no outlier of R (its R is GUARANTEED remaining time, common in a hybrid cluster),
    /// so §4.3's shedding never moves them. Returning them is Mercury's own remedy for "poor
    /// placement choices" (§4.3: discarded containers are re-queued "at a less-loaded node",
    /// §6.3), applied where the poor choice is known at the node.
    ///
    /// A queued container goes back when its expected start (the node replayed forward: running
    /// containers end at their estimates, as in Tr, and queued ones start in queue order where
    /// they fit, as `start_what_fits` starts them) is more than its bound away, and only while
    /// a GUARANTEED container holds the node past that bound: without GUARANTEED work the queue
    /// is QUEUEABLE work that R and §4.3's shedding already account for (only-Q runs are
    /// unchanged by this). Its bound is `bound_ms` doubled for each time the container was
    /// already returned, and a container returned [`MAX_RETURNS`] times stays
    /// ([`return_bound`]): returned work raises the R of the nodes it goes to, and so the bound
    /// of the next round, so returning without backoff livelocks when GUARANTEED work holds the
    /// whole cluster (measured: 16 million returns in one simulated hour of the 256-node
    /// production-like run), while returning once only gave back most of what returning won
    /// (docs/experiments/mercury/diagnosis.md).
    ///
    /// Evaluated at heartbeat answers only: applied to each arrival as well (measured, §7.4.1
    /// and §7.4.2 seed 1), it returned twice as many containers and lowered task throughput by
    /// 1–5 %, the returned work bouncing between nodes the stale view still ranks first.
    pub fn shed_held_by_guaranteed(&mut self, now: Time, bound_ms: f64) -> Vec<ContainerId> {
        // Only containers with returns left can go back: a queue of other work alone is left as
        // it is without replaying it (most of the simulator's cost on long runs otherwise).
        if self.queued_by_backoff.iter().all(|&n| n == 0)
            || !(bound_ms.is_finite() && bound_ms >= 0.0)
        {
            return Vec::new();
        }
        let bound = Duration::from_secs_f64(bound_ms / 1000.0);
        let remaining = |term: &RemainingWorkTerm| -> Duration {
            Duration::from_secs_f64(term.remaining_ms(now).max(0.0) / 1000.0)
        };
        // How long GUARANTEED work holds the node: its longest remaining (or, waiting, whole)
        // expected run.
        let guaranteed_hold = self
            .remaining_work_terms
            .iter()
            .filter(|t| !t.queueable)
            .map(remaining)
            .chain(
                self.waiting_guaranteed
                    .iter()
                    .map(|g| Duration::from_secs_f64(self.estimate_ms(g) / 1000.0)),
            )
            .max()
            .unwrap_or(Duration::ZERO);
        let own_bound = |exponent: u8| backoff_bound(bound, exponent);
        // Queued containers that can go back (returns left, GUARANTEED work holding the node
        // past their own bound), per exponent: the node's counts of the exponents whose bound
        // the hold passes. The replay can stop once it is past the largest bound among those
        // still waiting, since what still waits then goes back anyway.
        let mut waiting_per_exponent = [0usize; RETURN_BACKOFF_MAX_EXPONENT as usize + 1];
        for (e, (&queued, eligible)) in self
            .queued_by_backoff
            .iter()
            .zip(waiting_per_exponent.iter_mut())
            .enumerate()
        {
            if guaranteed_hold > own_bound(e as u8) {
                *eligible = queued;
            }
        }
        // Nothing queued could go back: every class with work has its bound past the hold.
        if waiting_per_exponent.iter().all(|&n| n == 0) {
            return Vec::new();
        }
        // Replay the node forward from now: (offset of the end, resources, QUEUEABLE?).
        let mut ends: std::collections::BinaryHeap<std::cmp::Reverse<(Duration, u64, u64, bool)>> =
            self.remaining_work_terms
                .iter()
                .map(|t| {
                    std::cmp::Reverse((
                        remaining(t),
                        t.resources.cpu_millis,
                        t.resources.memory_mib,
                        t.queueable,
                    ))
                })
                .collect();
        let mut free = self.free();
        let mut queueable_allocated = self.queueable_allocated;
        // Waiting GUARANTEED containers go first (they may preempt QUEUEABLE work): booked from
        // now, ahead of every queued container.
        for g in &self.waiting_guaranteed {
            free = free.saturating_sub(&g.resources);
            ends.push(std::cmp::Reverse((
                Duration::from_secs_f64(self.estimate_ms(g) / 1000.0),
                g.resources.cpu_millis,
                g.resources.memory_mib,
                false,
            )));
        }
        // Each queued container with the exponent of the bound it goes back past (None: it
        // stays wherever it starts); `None` entries once started in the replay. Read from the
        // queue only as far as a pass gets: most replays end (every eligible container started)
        // long before the queue's tail, which is then never walked.
        let eligible_exponent = |spec: &ContainerSpec| {
            spec.backoff_exponent()
                .filter(|&e| guaranteed_hold > own_bound(e))
        };
        let mut unread = self.queue.iter();
        let mut waiting: Vec<Option<(&QueueKey, &ContainerSpec, Option<u8>)>> = Vec::new();
        let horizon = |per_exponent: &[usize]| {
            per_exponent
                .iter()
                .rposition(|&n| n > 0)
                .map(|e| own_bound(e as u8))
        };
        // The first entry not yet started (passes scan from it).
        let mut first = 0;
        let mut victims: Vec<&QueueKey> = Vec::new();
        let mut at = Duration::ZERO;
        // The replay ran out of ends with work still waiting: that work never fits (policing)
        // and is not ours to move.
        let mut stuck = false;
        while horizon(&waiting_per_exponent).is_some_and(|h| at <= h) {
            let mut headroom = free.min(&self.queueable_limit.saturating_sub(&queueable_allocated));
            // A pass in queue order, starting what fits, until nothing more fits (the queue can
            // be long; with no headroom nothing starts, so the pass is skipped).
            let mut index = first;
            while !headroom.is_zero() {
                if index == waiting.len() {
                    let Some((key, spec)) = unread.next() else {
                        break;
                    };
                    waiting.push(Some((key, spec, eligible_exponent(spec))));
                }
                let slot = &mut waiting[index];
                index += 1;
                let Some((key, spec, exponent)) = *slot else {
                    continue;
                };
                if !spec.resources.fits_in(&headroom) {
                    continue;
                }
                headroom = headroom.saturating_sub(&spec.resources);
                free = free.saturating_sub(&spec.resources);
                queueable_allocated = queueable_allocated.saturating_add(&spec.resources);
                if let Some(e) = exponent {
                    waiting_per_exponent[e as usize] -= 1;
                    if at > own_bound(e) {
                        victims.push(key);
                    }
                }
                ends.push(std::cmp::Reverse((
                    at + Duration::from_secs_f64(self.estimate_ms(spec) / 1000.0),
                    spec.resources.cpu_millis,
                    spec.resources.memory_mib,
                    true,
                )));
                *slot = None;
            }
            while waiting.get(first).is_some_and(Option::is_none) {
                first += 1;
            }
            // Advance to the next end (and every end at the same instant).
            let Some(std::cmp::Reverse((next, ..))) = ends.peek().copied() else {
                stuck = true;
                break;
            };
            at = next;
            while let Some(std::cmp::Reverse((end, cpu, memory, queueable))) = ends.peek().copied()
            {
                if end != at {
                    break;
                }
                ends.pop();
                let freed = Resources::new(cpu, memory);
                free = free.saturating_add(&freed).min(&self.config.capacity);
                if queueable {
                    queueable_allocated = queueable_allocated.saturating_sub(&freed);
                }
            }
        }
        // What still waits starts after `at`: the replay stopped for having passed the largest
        // bound among the eligible containers still waiting (read or not yet read from the
        // queue), so every one of them goes back, and the walk stops at the last of them.
        let eligible_waiting: usize = waiting_per_exponent.iter().sum();
        if !stuck && eligible_waiting > 0 {
            let still_waiting = waiting
                .iter()
                .flatten()
                .copied()
                .chain(unread.map(|(key, spec)| (key, spec, eligible_exponent(spec))));
            victims.extend(
                still_waiting
                    .filter(|(_, _, exponent)| exponent.is_some_and(|e| at > own_bound(e)))
                    .take(eligible_waiting)
                    .map(|(key, ..)| key),
            );
        }
        // Newest in queue order first.
        victims.sort_unstable_by(|a, b| b.cmp(a));
        let victims: Vec<QueueKey> = victims.into_iter().cloned().collect();
        let mut shed = Vec::with_capacity(victims.len());
        for key in victims {
            let spec = self.queue.remove(&key).expect("key from queue");
            self.queue_keys.remove(&spec.id);
            self.waiting_work -= self.work_weight(&spec);
            self.uncount_queued(&spec);
            let own_bound_ms = return_bound(bound, spec.times_returned)
                .unwrap_or(bound)
                .as_secs_f64()
                * 1000.0;
            self.events.push(NodeEvent::Killed {
                id: spec.id,
                reason: KillReason::Shed,
                was_running: false,
                message: format!(
                    "shed: GUARANTEED work holds this node for longer than a placement elsewhere \
                     would wait ({own_bound_ms:.0} ms); ask again elsewhere"
                ),
            });
            shed.push(spec.id);
        }
        if !shed.is_empty() {
            self.start_pending(now);
        }
        shed
    }

    /// The node is being drained or its state is lost: everything is killed with `reason`.
    pub fn kill_all(&mut self, now: Time, reason: KillReason, message: &str) {
        // Nothing starts (or preempts) while everything goes: a removal that started waiting or
        // queued work would have the worker launch it only to kill it at once (and a waiting
        // GUARANTEED container could preempt running work, told `preempted` instead of `lost`).
        let ids: Vec<ContainerId> = self.statuses().into_iter().map(|s| s.id).collect();
        for id in ids {
            self.take_out(id, reason, message.to_string());
        }
        self.start_pending(now);
    }

    /// `capacity.cpu × capacity.memory`: a container's dominant share is
    /// `min(max(cpu × cap.memory, memory × cap.cpu), cap.cpu × cap.memory)` over this.
    fn work_denominator(&self) -> u128 {
        let c = &self.config.capacity;
        (c.cpu_millis as u128 * c.memory_mib as u128).max(1)
    }

    /// estimate_ms × dominant share × [`Self::work_denominator`], exactly. A node with a
    /// zero-capacity dimension falls back to the floating-point sum in `queue_delay`.
    fn work_weight(&self, spec: &ContainerSpec) -> u128 {
        let c = &self.config.capacity;
        let r = &spec.resources;
        let share = (r.cpu_millis as u128 * c.memory_mib as u128)
            .max(r.memory_mib as u128 * c.cpu_millis as u128)
            .min(c.cpu_millis as u128 * c.memory_mib as u128);
        let estimate = spec
            .runtime_estimate_ms
            .unwrap_or(self.config.default_runtime_estimate_ms) as u128;
        estimate.saturating_mul(share)
    }

    fn estimate_ms(&self, spec: &ContainerSpec) -> f64 {
        spec.runtime_estimate_ms
            .unwrap_or(self.config.default_runtime_estimate_ms) as f64
    }

    /// R = Tq + Tr + Tl for this node now (Mercury §4.2; see [`QueueDelay`] for the weighting).
    pub fn queue_delay(&self, now: Time) -> QueueDelay {
        let cap = &self.config.capacity;
        let tq_ms = if cap.cpu_millis > 0 && cap.memory_mib > 0 {
            self.waiting_work as f64 / self.work_denominator() as f64
        } else {
            self.queue
                .values()
                .chain(self.waiting_guaranteed.iter())
                .map(|c| self.estimate_ms(c) * c.resources.dominant_share(cap))
                .sum()
        };
        let tr_ms = self
            .remaining_work_terms
            .iter()
            .map(|r| r.remaining_ms(now) * r.dominant_share)
            .sum();
        let tl_ms = match self.blocked_since {
            Some(since) => {
                now.saturating_since(since.max(self.last_queueable_start))
                    .as_secs_f64()
                    * 1000.0
            }
            None => 0.0,
        };
        QueueDelay {
            tq_ms,
            tr_ms,
            tl_ms,
        }
    }

    /// How long a running container has run.
    pub fn elapsed(&self, now: Time, id: ContainerId) -> Option<Duration> {
        self.running
            .get(&id)
            .map(|r| now.saturating_since(r.started_at))
    }

    /// Check every invariant; used by tests after each step and by the simulator in debug runs.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut sum = Resources::ZERO;
        let mut q = Resources::ZERO;
        for r in self.running.values() {
            sum = sum.saturating_add(&r.spec.resources);
            if r.spec.container_type == ContainerType::Queueable {
                q = q.saturating_add(&r.spec.resources);
            }
        }
        if !self
            .remaining_work_terms
            .iter()
            .map(|t| (t.id, t.started_at, t.resources, t.queueable))
            .eq(self.running.iter().map(|(id, r)| {
                (
                    *id,
                    r.started_at,
                    r.spec.resources,
                    r.spec.container_type == ContainerType::Queueable,
                )
            }))
        {
            return Err("remaining-work terms do not mirror the running containers".to_string());
        }
        if sum != self.allocated {
            return Err(format!(
                "allocated {} != sum of running {}",
                self.allocated, sum
            ));
        }
        if q != self.queueable_allocated {
            return Err(format!(
                "queueable allocated {} != sum {}",
                self.queueable_allocated, q
            ));
        }
        if !sum.fits_in(&self.config.capacity) {
            return Err(format!(
                "running containers {} exceed capacity {}",
                sum, self.config.capacity
            ));
        }
        if !self.guaranteed_committed().fits_in(&self.config.capacity) {
            return Err(format!(
                "GUARANTEED work {} (running and waiting) exceeds capacity {}",
                self.guaranteed_committed(),
                self.config.capacity
            ));
        }
        let work: u128 = self
            .queue
            .values()
            .chain(self.waiting_guaranteed.iter())
            .map(|c| self.work_weight(c))
            .sum();
        if work != self.waiting_work {
            return Err(format!(
                "queued work {} != sum over queue {work}",
                self.waiting_work
            ));
        }
        if self.queue.len() != self.queue_keys.len() {
            return Err("queue index out of sync".into());
        }
        let mut by_backoff = [0usize; RETURN_BACKOFF_MAX_EXPONENT as usize + 1];
        for e in self
            .queue
            .values()
            .filter_map(ContainerSpec::backoff_exponent)
        {
            by_backoff[e as usize] += 1;
        }
        if by_backoff != self.queued_by_backoff {
            return Err(format!(
                "queued containers with returns left by backoff exponent: counted {:?}, in the \
                 queue {by_backoff:?}",
                self.queued_by_backoff
            ));
        }
        for (id, k) in &self.queue_keys {
            match self.queue.get(k) {
                Some(c) if c.id == *id => {}
                _ => return Err(format!("queue index for {id} points elsewhere")),
            }
        }
        if self
            .queue
            .values()
            .any(|c| c.container_type != ContainerType::Queueable)
        {
            return Err("a GUARANTEED container sits in the QUEUEABLE queue".into());
        }
        if self
            .waiting_guaranteed
            .iter()
            .any(|c| c.container_type != ContainerType::Guaranteed)
        {
            return Err("a QUEUEABLE container waits among GUARANTEED ones".into());
        }
        if self.config.reorder_by_job_submit_time {
            let times: Vec<Time> = self.queue.values().map(|c| c.job_submit_time).collect();
            if times.windows(2).any(|w| w[0] > w[1]) {
                return Err("queue not ordered by job submit time".into());
            }
        }
        Ok(())
    }
}

//! The central scheduler for GUARANTEED containers (Mercury §4.2 "Placement of GUARANTEED
//! containers"): it allocates a GUARANTEED container on a node if and only if that node has
//! sufficient resources, tracking allocations and releases per node, and delays asks until
//! resources become available. It never over-commits a node with GUARANTEED work.
//!
//! Which node an ask goes to is a [`GuaranteedPlacer`]. [`QueueableAware`] is the default: among
//! the nodes where the ask fits by GUARANTEED books it prefers those where it preempts the least
//! QUEUEABLE work (as last reported by the node's heartbeat, [`Guarantor::report_queueable_load`]),
//! then best fit. [`BestFit`] alone ignores QUEUEABLE work. The 3Sigma/Morpheus placement plugs
//! in behind the same trait.

use crate::ids::{ContainerIdMinter, NameBuildHasher};
use crate::node::{ContainerStatus, Placement};
use crate::protocol::app::Locality;
use crate::reservation::book::{ReservationBook, ReservationEvent, ReservationInfo};
use crate::reservation::{AllocationInterval, Rejection, ReservationDefinition};
use crate::shaper::ComponentRole;
use crate::shaping::{ShapingOutcome, ShapingState};
use crate::token::{ContainerToken, GrantBooking, PublicKeyRing, TokenBody, TokenError};
use crate::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};

/// 3σSched in the live guarantor (layer 2 of DESIGN.md's guarantor); a child module so it books
/// through the private grant path. Its items are re-exported from [`crate::threesigma`].
#[path = "threesigma/live.rs"]
pub(crate) mod threesigma_live;

#[path = "guarantor/fit_index.rs"]
mod fit_index;
use fit_index::{FitIndex, FitKey};

/// A node as the guarantor sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuarantorNode {
    pub node_id: NodeId,
    pub rack: String,
    pub capacity: Resources,
    /// Sum of GUARANTEED grants on the node (granted-but-unstarted included).
    pub guaranteed: Resources,
    /// QUEUEABLE work on the node as of its last heartbeat (not part of any booking).
    pub queueable: QueueableLoad,
    /// The node's current session (its issuer number from its last join); GUARANTEED grants
    /// carry it and the node accepts only its current session's grants (see
    /// [`crate::token::TokenBody::node_epoch`]).
    #[serde(default)]
    pub epoch: u32,
    /// Its bookings changed since the policing limits were last taken (listed in
    /// `Guarantor::limits_changed` once).
    #[serde(skip)]
    limit_changed: bool,
}

impl GuarantorNode {
    /// Mark the node's policing limit changed; true the first time since the last take.
    fn mark_limit_changed(&mut self) -> bool {
        !std::mem::replace(&mut self.limit_changed, true)
    }
}

impl GuarantorNode {
    pub fn free(&self) -> Resources {
        self.capacity.saturating_sub(&self.guaranteed)
    }

    /// What one more GUARANTEED container of `resources` would take from running QUEUEABLE work
    /// here (Mercury §3.4: the node kills QUEUEABLE containers to make room), by the last report.
    /// Only the QUEUEABLE work that fits beside the GUARANTEED bookings counts: what bookings made
    /// since the report already displace is not counted twice.
    pub fn queueable_preempted_by(&self, resources: &Resources) -> Resources {
        let surviving = self.queueable.running.min(&self.free());
        self.guaranteed
            .saturating_add(&surviving)
            .saturating_add(resources)
            .saturating_sub(&self.capacity)
            .min(&surviving)
    }
}

/// A node's QUEUEABLE work, reported with its heartbeats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueableLoad {
    /// Resources held by running QUEUEABLE containers.
    pub running: Resources,
    /// QUEUEABLE containers waiting in the node's queue.
    pub queued_count: u32,
}

impl QueueableLoad {
    /// From the container list of a heartbeat.
    pub fn from_statuses(containers: &[ContainerStatus]) -> QueueableLoad {
        let mut load = QueueableLoad::default();
        for c in containers
            .iter()
            .filter(|c| c.container_type == ContainerType::Queueable)
        {
            match c.placement {
                Placement::Running => load.running = load.running.saturating_add(&c.resources),
                Placement::Queued => load.queued_count += 1,
                Placement::WaitingGuaranteed => {}
            }
        }
        load
    }
}

/// A pending GUARANTEED ask.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuaranteedAsk {
    /// Caller's key to route grants back (e.g. worker + request id).
    pub ask_key: u64,
    pub app_id: AppId,
    pub resources: Resources,
    pub count: u32,
    pub priority: u32,
    pub locality: Option<Locality>,
    pub runtime_estimate_ms: Option<u64>,
    pub job_id: JobId,
    pub job_submit_time_ms: u64,
    /// Pace §2: core (compulsory) or elastic (only speeds the application up).
    #[serde(default)]
    pub role: ComponentRole,
    /// The application lets the shaper (Pace §3.2) resize these containers to their forecast
    /// use; off by default.
    #[serde(default)]
    pub allow_shaping: bool,
}

/// Chooses the node for one GUARANTEED container among those that fit.
pub trait GuaranteedPlacer: Send {
    fn name(&self) -> &'static str;
    /// Index into `nodes` of the chosen node; every candidate passed has room for the ask.
    fn choose(&mut self, ask: &GuaranteedAsk, candidates: &[&GuarantorNode]) -> Option<usize>;

    /// What placing one container of `ask` on `node` costs besides GUARANTEED capacity (e.g.
    /// QUEUEABLE work it preempts); 0 = nothing. Heartbeat-driven allocation
    /// ([`Guarantor::schedule_on_node`]) passes a node over while another node could take the
    /// ask at a lower cost, for at most [`GuaranteedPlacer::node_update_patience_ms`].
    fn placement_cost(&self, _ask: &GuaranteedAsk, _node: &GuarantorNode) -> f64 {
        0.0
    }

    /// How long an ask may be passed over in heartbeat-driven allocation waiting for a cheaper
    /// node, counted from the first time it was passed over; 0 = never wait.
    fn node_update_patience_ms(&self) -> u64 {
        0
    }

    /// `Some(rule)` when `choose` is "the best fit among the candidates `rule` accepts, whenever
    /// it accepts any" (best fit: least free dominant share left after placing, ties to the first
    /// name). The guarantor then finds that node through its index of nodes by free capacity in
    /// O(log n) rather than scoring every candidate, and calls `choose` only when no candidate
    /// passes the rule. `None` (the default): `choose` sees every candidate.
    fn best_fit_rule(&self) -> Option<BestFitRule> {
        None
    }
}

/// Which candidates a best-fit placer takes outright (see [`GuaranteedPlacer::best_fit_rule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BestFitRule {
    /// Every node where the ask fits.
    AnyCandidate,
    /// Nodes where the ask costs nothing by [`GuaranteedPlacer::placement_cost`] and no
    /// QUEUEABLE container is queued.
    NoQueueableCost,
}

impl BestFitRule {
    /// Whether the rule takes `node` (where `ask` fits) outright.
    fn accepts(
        self,
        placer: &dyn GuaranteedPlacer,
        ask: &GuaranteedAsk,
        node: &GuarantorNode,
    ) -> bool {
        match self {
            BestFitRule::AnyCandidate => true,
            BestFitRule::NoQueueableCost => {
                node.queueable.queued_count == 0 && placer.placement_cost(ask, node) <= 0.0
            }
        }
    }
}

/// Best fit: the node left with the least free dominant share after placement. Packs GUARANTEED
/// work tightly, leaving whole nodes free for large asks and for opportunistic work.
#[derive(Clone, Copy, Debug, Default)]
pub struct BestFit;

impl GuaranteedPlacer for BestFit {
    fn name(&self) -> &'static str {
        "best-fit"
    }

    fn choose(&mut self, ask: &GuaranteedAsk, candidates: &[&GuarantorNode]) -> Option<usize> {
        candidates
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let left = n.free().saturating_sub(&ask.resources);
                (left.dominant_share(&n.capacity), i)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, i)| i)
    }

    fn best_fit_rule(&self) -> Option<BestFitRule> {
        Some(BestFitRule::AnyCandidate)
    }
}

/// Prefers the nodes where a GUARANTEED container preempts the least running QUEUEABLE work,
/// then those with the fewest QUEUEABLE containers queued (whose wait a GUARANTEED container
/// would lengthen), then best fit. Mercury §3.4 resolves GUARANTEED–QUEUEABLE conflicts by
/// killing QUEUEABLE containers; a central scheduler that knows the nodes' QUEUEABLE load (from
/// the heartbeats it already receives) avoids most of those conflicts instead. It never
/// over-commits a node with GUARANTEED work: candidates are only nodes where the ask fits by
/// GUARANTEED books.
///
/// In heartbeat-driven allocation (YARN's node update, Mercury §7.1), a node whose update would
/// preempt QUEUEABLE work is passed over while another node could take the ask with less
/// preemption, for at most `patience_ms` (one heartbeat interval lets every node be offered).
#[derive(Clone, Copy, Debug)]
pub struct QueueableAware {
    pub patience_ms: u64,
}

impl QueueableAware {
    /// The patience of one 3-s heartbeat interval (Mercury §7.1).
    pub const DEFAULT_PATIENCE_MS: u64 = 3_000;
}

impl Default for QueueableAware {
    fn default() -> Self {
        QueueableAware {
            patience_ms: Self::DEFAULT_PATIENCE_MS,
        }
    }
}

impl GuaranteedPlacer for QueueableAware {
    fn name(&self) -> &'static str {
        "queueable-aware"
    }

    fn choose(&mut self, ask: &GuaranteedAsk, candidates: &[&GuarantorNode]) -> Option<usize> {
        candidates
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let left = n.free().saturating_sub(&ask.resources);
                (
                    self.placement_cost(ask, n),
                    n.queueable.queued_count,
                    left.dominant_share(&n.capacity),
                    i,
                )
            })
            .min_by(|a, b| {
                a.0.total_cmp(&b.0)
                    .then(a.1.cmp(&b.1))
                    .then(a.2.total_cmp(&b.2))
                    .then(a.3.cmp(&b.3))
            })
            .map(|(.., i)| i)
    }

    /// The dominant share of the node's capacity that would be taken from running QUEUEABLE
    /// containers.
    fn placement_cost(&self, ask: &GuaranteedAsk, node: &GuarantorNode) -> f64 {
        let preempted = node
            .queueable_preempted_by(&ask.resources)
            .dominant_share(&node.capacity);
        if node.queueable.queued_count > 0 {
            let delayed = ask.resources.dominant_share(&node.capacity) - preempted;
            return preempted + 0.5 * delayed.max(0.0);
        }
        preempted
    }

    fn node_update_patience_ms(&self) -> u64 {
        self.patience_ms
    }

    /// A node where the ask preempts nothing and delays nothing scores `(0, 0, left share)`, the
    /// least prefix any node can have: when one exists the choice is the best fit among them.
    fn best_fit_rule(&self) -> Option<BestFitRule> {
        Some(BestFitRule::NoQueueableCost)
    }
}

/// One GUARANTEED placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuaranteedPlacement {
    pub ask_key: u64,
    /// Containers of the ask still waiting after this one.
    pub remaining: u32,
    pub token_body: TokenBody,
}

/// Refusals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuarantorError {
    #[error("ask of {asked} is larger than every node of the cluster (largest: {largest})")]
    LargerThanAnyNode {
        asked: Resources,
        largest: Resources,
    },
    #[error("ask has zero resources or zero count")]
    Empty,
    /// A job description (3Sigma) that cannot be planned.
    #[error("job description: {0}")]
    BadJob(String),
    /// The 3Sigma queue holds its maximum of waiting jobs.
    #[error("the 3Sigma queue holds its maximum of {max} waiting jobs; retry later")]
    JobQueueFull { max: usize },
    #[error("no node with name {0}")]
    UnknownNode(String),
    #[error(
        "promotion refused: node {node} has {free} GUARANTEED capacity free, the container needs {needed}"
    )]
    NoCapacityForPromotion {
        node: String,
        free: Resources,
        needed: Resources,
    },
    #[error("container {0} is GUARANTEED already")]
    AlreadyGuaranteed(ContainerId),
    /// A promotion would take capacity held for reservations (Morpheus §6; plain GUARANTEED
    /// work never does).
    #[error(
        "promotion refused: the cluster's GUARANTEED capacity left outside reservations is used up"
    )]
    ReservedCapacity,
    #[error("no reservation with id {0:?}")]
    UnknownReservation(String),
    #[error("reservation {0:?} belongs to another application")]
    NotReservationOwner(String),
    #[error("ask of {asked} is larger than reservation {id:?} ever allocates (at most {most})")]
    LargerThanReservation {
        id: String,
        asked: Resources,
        most: Resources,
    },
}

impl GuarantorError {
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            GuarantorError::NoCapacityForPromotion { .. }
                | GuarantorError::ReservedCapacity
                | GuarantorError::JobQueueFull { .. }
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Grant {
    node: NodeId,
    app: AppId,
    resources: Resources,
    /// Expiry of the unstarted grant (ms); `None` once the node reported it.
    pending_until_ms: Option<u64>,
    /// The node session the grant was made for.
    epoch: u32,
    /// The reservation whose allocation it counts against (None: plain GUARANTEED work).
    #[serde(default)]
    reservation: Option<String>,
    /// Shaping: the role the ask declared and whether it may be shaped. `resources` is the
    /// shaped allocation while the shaper tracks it, `requested` what was asked.
    #[serde(default)]
    role: ComponentRole,
    #[serde(default)]
    allow_shaping: bool,
    #[serde(default)]
    requested: Resources,
}

/// An unstarted GUARANTEED grant, for the caller to revoke at its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnstartedGrant {
    pub container_id: ContainerId,
    pub node_id: NodeId,
    pub app_id: AppId,
    pub expires_at_ms: u64,
}

/// Settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuarantorConfig {
    pub token_ttl_ms: u64,
}

impl Default for GuarantorConfig {
    fn default() -> Self {
        GuarantorConfig {
            token_ttl_ms: 600_000,
        }
    }
}

/// A waiting ask.
#[derive(Clone, Debug)]
struct PendingAsk {
    ask: GuaranteedAsk,
    /// The reservation it is granted against (Morpheus: a job running inside its reservation).
    reservation: Option<String>,
    /// When heartbeat-driven allocation first passed it over for a cheaper node (reset when a
    /// container of it is placed).
    passed_over_since_ms: Option<u64>,
}

/// The guarantor's nodes, iterated in name order (the order placers see candidates in) and
/// found by name through a hash index: every heartbeat looks its node up several times, and a
/// name-ordered tree costs a dozen string comparisons per lookup on a large cluster. A
/// [`FitIndex`] orders them by free capacity for best-fit placement in O(log n); every change to
/// a node goes through [`NodeTable::get_mut`]'s guard or [`NodeTable::insert`], which keep it
/// current.
#[derive(Default)]
struct NodeTable {
    /// Nodes in insertion slots (a removal moves the last one into the gap).
    slots: Vec<GuarantorNode>,
    /// Each slot's key in `fit`, as of the node's last change.
    fit_keys: Vec<FitKey>,
    /// Slot of each name.
    index: HashMap<NodeId, usize, NameBuildHasher>,
    /// Slots in name order.
    order: Vec<usize>,
    fit: FitIndex,
}

/// A node borrowed for change; its place in the fit index follows when the borrow ends.
struct NodeMut<'a> {
    table: &'a mut NodeTable,
    slot: usize,
}

impl std::ops::Deref for NodeMut<'_> {
    type Target = GuarantorNode;
    fn deref(&self) -> &GuarantorNode {
        &self.table.slots[self.slot]
    }
}

impl std::ops::DerefMut for NodeMut<'_> {
    fn deref_mut(&mut self) -> &mut GuarantorNode {
        &mut self.table.slots[self.slot]
    }
}

impl Drop for NodeMut<'_> {
    fn drop(&mut self) {
        self.table.refit(self.slot);
    }
}

impl NodeTable {
    fn len(&self) -> usize {
        self.slots.len()
    }

    fn get(&self, id: &NodeId) -> Option<&GuarantorNode> {
        self.index.get(id).map(|&i| &self.slots[i])
    }

    fn get_mut(&mut self, id: &NodeId) -> Option<NodeMut<'_>> {
        let slot = *self.index.get(id)?;
        Some(NodeMut { table: self, slot })
    }

    /// In name order.
    fn values(&self) -> impl Iterator<Item = &GuarantorNode> {
        self.order.iter().map(|&i| &self.slots[i])
    }

    fn fit_key(node: &GuarantorNode) -> FitKey {
        FitKey::of(node.free(), node.capacity)
    }

    /// Move the slot's node to its current place in the fit index.
    fn refit(&mut self, slot: usize) {
        let node = &self.slots[slot];
        let key = Self::fit_key(node);
        if key != self.fit_keys[slot] {
            self.fit.remove(self.fit_keys[slot], &node.node_id);
            self.fit.insert(key, node.node_id.clone());
            self.fit_keys[slot] = key;
        }
    }

    /// Insert or replace (in place) the node of this name.
    fn insert(&mut self, node: GuarantorNode) {
        if let Some(&i) = self.index.get(&node.node_id) {
            self.slots[i] = node;
            self.refit(i);
            return;
        }
        let slot = self.slots.len();
        let slots = &self.slots;
        let at = self
            .order
            .partition_point(|&i| slots[i].node_id < node.node_id);
        self.order.insert(at, slot);
        self.index.insert(node.node_id.clone(), slot);
        let key = Self::fit_key(&node);
        self.fit.insert(key, node.node_id.clone());
        self.fit_keys.push(key);
        self.slots.push(node);
    }

    fn remove(&mut self, id: &NodeId) -> Option<GuarantorNode> {
        let slot = self.index.remove(id)?;
        self.order.retain(|&i| i != slot);
        let last = self.slots.len() - 1;
        let node = self.slots.swap_remove(slot);
        let key = self.fit_keys.swap_remove(slot);
        self.fit.remove(key, &node.node_id);
        if slot != last {
            // The last slot's node moved into the gap.
            if let Some(i) = self.index.get_mut(&self.slots[slot].node_id) {
                *i = slot;
            }
            for i in &mut self.order {
                if *i == last {
                    *i = slot;
                }
            }
        }
        Some(node)
    }

    /// The best fit for `ask` (least free dominant share left, ties to the first name) among the
    /// nodes where it fits and `eligible` holds; as [`BestFit`] over those candidates.
    fn best_fit(
        &self,
        ask: &Resources,
        mut eligible: impl FnMut(&GuarantorNode) -> bool,
    ) -> Option<NodeId> {
        self.fit
            .best_fit(ask, |name| self.get(name).is_some_and(&mut eligible))
    }

    /// Index, order and fit index agree (for invariant checking).
    fn check(&self) -> Result<(), String> {
        if self.index.len() != self.slots.len()
            || self.order.len() != self.slots.len()
            || self.fit_keys.len() != self.slots.len()
            || self.fit.len() != self.slots.len()
        {
            return Err(format!(
                "node table: {} names, {} in order, {} fit keys and {} fit entries for {} nodes",
                self.index.len(),
                self.order.len(),
                self.fit_keys.len(),
                self.fit.len(),
                self.slots.len()
            ));
        }
        for (i, n) in self.slots.iter().enumerate() {
            if self.index.get(&n.node_id) != Some(&i) {
                return Err(format!("node index misplaces {}", n.node_id));
            }
            let key = Self::fit_key(n);
            if self.fit_keys[i] != key || !self.fit.holds(&key, &n.node_id) {
                return Err(format!(
                    "fit index has {} at a stale free capacity (free now {})",
                    n.node_id,
                    n.free()
                ));
            }
        }
        let mut previous: Option<&NodeId> = None;
        for n in self.values() {
            if previous.is_some_and(|p| p >= &n.node_id) {
                return Err(format!("nodes out of name order at {}", n.node_id));
            }
            previous = Some(&n.node_id);
        }
        Ok(())
    }
}

impl std::ops::Index<&NodeId> for NodeTable {
    type Output = GuarantorNode;
    fn index(&self, id: &NodeId) -> &GuarantorNode {
        self.get(id).expect("known node")
    }
}

/// A pending GUARANTEED ask as an operator sees it (see [`Guarantor::waiting_asks`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WaitingAsk {
    pub app_id: AppId,
    pub job_id: JobId,
    /// Containers still to place.
    pub containers: u32,
    /// Size of each.
    pub resources: Resources,
    pub priority: u32,
    pub reservation: Option<String>,
    /// Why it is not placed now.
    pub reason: String,
}

/// The nodes that get no new GUARANTEED work: those an operator drains and those declared lost
/// whose loss is not stored yet ([`Guarantor::set_unreachable`]). A view over both sets, so
/// there is no third set to keep in step with them.
#[derive(Clone, Copy)]
pub(crate) struct ClosedNodes<'a> {
    draining: &'a HashSet<NodeId>,
    unreachable: &'a HashSet<NodeId>,
}

impl<'a> ClosedNodes<'a> {
    fn of(draining: &'a HashSet<NodeId>, unreachable: &'a HashSet<NodeId>) -> ClosedNodes<'a> {
        ClosedNodes {
            draining,
            unreachable,
        }
    }

    pub(crate) fn contains(&self, node: &NodeId) -> bool {
        self.draining.contains(node) || self.unreachable.contains(node)
    }
}

/// The guarantor's state: nodes, GUARANTEED grants and the pending asks.
pub struct Guarantor {
    config: GuarantorConfig,
    placer: Box<dyn GuaranteedPlacer>,
    nodes: NodeTable,
    grants: HashMap<ContainerId, Grant>,
    pending: VecDeque<PendingAsk>,
    minter: ContainerIdMinter,
    /// Nodes whose GUARANTEED bookings (and so policing limit) changed since the caller last
    /// took them: the coordinator forwards only these, O(changes) rather than O(nodes).
    limits_changed: Vec<NodeId>,
    /// Reservations (Morpheus), layer 1 of the capacity the guarantor shares.
    reservations: ReservationBook,
    /// The latest time the guarantor was told (for calls that are not given one, e.g.
    /// promotions).
    clock_ms: u64,
    /// Nodes an operator is draining: they get no new GUARANTEED work and their capacity is out
    /// of the reservation plan; what runs there finishes. Kept across the node's re-joins.
    draining: HashSet<NodeId>,
    /// Nodes declared lost whose loss is not stored yet (the coordinator holds the loss back
    /// until its store takes it, and with it the node's removal here): silent, so they get no
    /// new GUARANTEED work, while their bookings stay until the removal.
    unreachable: HashSet<NodeId>,
    /// Pace's resource shaper (layer 3 of DESIGN.md's guarantor), when enabled.
    shaping: Option<ShapingState>,
    /// 3σSched's queue (layer 2), when enabled.
    threesigma: Option<threesigma_live::LiveThreeSigma>,
}

impl std::fmt::Debug for Guarantor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guarantor")
            .field("placer", &self.placer.name())
            .field("nodes", &self.nodes.len())
            .field("grants", &self.grants.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl Guarantor {
    /// Container ids are minted with issuer 0; `last_seq` resumes after a restart.
    pub fn new(
        config: GuarantorConfig,
        placer: Box<dyn GuaranteedPlacer>,
        last_seq: u64,
    ) -> Guarantor {
        Guarantor {
            config,
            placer,
            nodes: NodeTable::default(),
            grants: HashMap::new(),
            pending: VecDeque::new(),
            minter: ContainerIdMinter::resume(0, last_seq),
            limits_changed: Default::default(),
            reservations: ReservationBook::default(),
            clock_ms: 0,
            draining: HashSet::new(),
            unreachable: HashSet::new(),
            shaping: None,
            threesigma: None,
        }
    }

    /// Shape running GUARANTEED containers that allow it (Pace). Only before grants are made.
    pub fn with_shaping(mut self, shaping: ShapingState) -> Guarantor {
        self.shaping = Some(shaping);
        self
    }

    pub fn shaping(&self) -> Option<&ShapingState> {
        self.shaping.as_ref()
    }

    /// Use `book` for reservations (a configured or restored one); the default book has the
    /// default plan (one day of 60-s steps, LowCost). Only before nodes join or grants are made.
    pub fn with_reservations(mut self, mut book: ReservationBook) -> Guarantor {
        for n in self.nodes.values() {
            book.node_capacity_changed(None, Some(n.capacity));
        }
        self.reservations = book;
        self
    }

    pub fn last_seq(&self) -> u64 {
        self.minter.last_seq()
    }

    pub fn placer_name(&self) -> &'static str {
        self.placer.name()
    }

    pub fn pending_asks(&self) -> usize {
        self.pending.len()
    }

    pub fn pending_containers(&self) -> u64 {
        self.pending.iter().map(|p| p.ask.count as u64).sum()
    }

    pub fn node(&self, id: &NodeId) -> Option<&GuarantorNode> {
        self.nodes.get(id)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &GuarantorNode> {
        self.nodes.values()
    }

    /// Add or re-add a node under session 0 (tests and the simulator, where sessions do not
    /// change). See [`Guarantor::join_node`].
    pub fn add_node(&mut self, node_id: NodeId, rack: String, capacity: Resources) {
        self.join_node(node_id, rack, capacity, 0, None);
    }

    /// A node joined (or re-joined) under session `epoch`, holding the containers in `reported`
    /// (when it says). Started GUARANTEED containers it still holds stay booked (a re-join after
    /// a network blip must not double-book); started ones it no longer holds (its worker
    /// restarted and killed them) are freed, and so are unstarted grants made for another
    /// session of the node (the node refuses their tokens). Returns the freed ones. The node's
    /// capacity is updated.
    pub fn join_node(
        &mut self,
        node_id: NodeId,
        rack: String,
        capacity: Resources,
        epoch: u32,
        reported: Option<&[ContainerId]>,
    ) -> Vec<ContainerId> {
        // A node that joins is reachable, whatever a held loss said of its last session.
        self.set_unreachable(&node_id, false);
        let held: Option<std::collections::HashSet<ContainerId>> =
            reported.map(|r| r.iter().copied().collect());
        let mut void: Vec<ContainerId> = self
            .grants
            .iter()
            .filter(|(id, g)| {
                g.node == node_id
                    && match g.pending_until_ms {
                        Some(_) => g.epoch != epoch,
                        None => held.as_ref().is_some_and(|h| !h.contains(id)),
                    }
            })
            .map(|(id, _)| *id)
            .collect();
        void.sort_unstable();
        for id in &void {
            if let Some(shaping) = &mut self.shaping {
                shaping.untrack(*id);
            }
            self.threesigma_grant_ended(*id, true);
            if let Some(g) = self.grants.remove(id) {
                self.reservations
                    .book(g.reservation.as_deref(), &g.resources, false);
            }
        }
        let old_capacity = self.nodes.get(&node_id).map(|n| n.capacity);
        // Growing never replans, so nothing is cancelled here. A draining node's capacity stays
        // out of the plan.
        if !self.draining.contains(&node_id) {
            self.reservations
                .node_capacity_changed(old_capacity, Some(capacity));
        }
        let guaranteed = self
            .grants
            .values()
            .filter(|g| g.node == node_id)
            .fold(Resources::ZERO, |acc, g| acc.saturating_add(&g.resources));
        self.limits_changed.push(node_id.clone());
        self.nodes.insert(GuarantorNode {
            limit_changed: true,
            node_id,
            rack,
            capacity,
            guaranteed,
            queueable: QueueableLoad::default(),
            epoch,
        });
        void
    }

    /// The node's QUEUEABLE work as its latest heartbeat reported it (placement input only;
    /// bookings do not depend on it). Returns false for an unknown node.
    pub fn report_queueable_load(&mut self, node_id: &NodeId, load: QueueableLoad) -> bool {
        match self.nodes.get_mut(node_id) {
            Some(mut n) => {
                n.queueable = load;
                true
            }
            None => false,
        }
    }

    /// A node is gone: its grants are dropped. Returns (container, app) of each. The plan
    /// shrinks by the node's capacity and replans (Morpheus §6; YARN's
    /// `SimpleCapacityReplanner`): moved and cancelled reservations are reported in
    /// [`Guarantor::take_reservation_events`].
    pub fn remove_node(&mut self, node_id: &NodeId) -> Vec<(ContainerId, AppId)> {
        let removed = self.nodes.remove(node_id);
        self.set_unreachable(node_id, false);
        let lost: Vec<ContainerId> = self
            .grants
            .iter()
            .filter(|(_, g)| &g.node == node_id)
            .map(|(id, _)| *id)
            .collect();
        let lost: Vec<(ContainerId, AppId)> = lost
            .into_iter()
            .filter_map(|id| {
                let g = self.grants.remove(&id)?;
                self.threesigma_grant_ended(id, true);
                if let Some(shaping) = &mut self.shaping {
                    shaping.untrack(id);
                }
                self.reservations
                    .book(g.reservation.as_deref(), &g.resources, false);
                Some((id, g.app))
            })
            .collect();
        if let Some(node) = removed.filter(|_| !self.draining.contains(node_id)) {
            let cancelled = self
                .reservations
                .node_capacity_changed(Some(node.capacity), None);
            for id in cancelled {
                self.cancel_reservation(
                    &id,
                    &format!("the cluster lost node {node_id} and the reservation no longer fits"),
                );
            }
        }
        lost
    }

    /// Forget reservation `id` after replanning cancelled it: its waiting asks are dropped, its
    /// running containers become plain GUARANTEED work, its owner is told.
    fn cancel_reservation(&mut self, id: &str, reason: &str) {
        let dropped = self.drop_reserved_asks(id);
        self.untag_grants(id);
        self.reservations.cancelled(id, reason, dropped);
    }

    /// Drop the waiting asks granted against reservation `id`; their keys.
    fn drop_reserved_asks(&mut self, id: &str) -> Vec<u64> {
        let mut dropped = Vec::new();
        self.pending.retain(|p| {
            if p.reservation.as_deref() == Some(id) {
                dropped.push(p.ask.ask_key);
                false
            } else {
                true
            }
        });
        dropped
    }

    /// Grants of reservation `id` count as plain GUARANTEED work from now on (the book moves
    /// their use itself when it forgets the reservation).
    fn untag_grants(&mut self, id: &str) {
        for g in self.grants.values_mut() {
            if g.reservation.as_deref() == Some(id) {
                g.reservation = None;
            }
        }
    }

    /// Queue an ask. Refused at once if no node could ever hold one container of it.
    /// The refusal of an ask no node could ever hold, naming the largest node.
    fn larger_than_any_node(&self, asked: Resources) -> GuarantorError {
        let largest = self
            .nodes
            .values()
            .map(|n| n.capacity)
            .max_by_key(|c| (c.memory_mib, c.cpu_millis))
            .unwrap_or_default();
        GuarantorError::LargerThanAnyNode { asked, largest }
    }

    pub fn submit(&mut self, ask: GuaranteedAsk) -> Result<(), GuarantorError> {
        self.submit_to(ask, None)
    }

    /// Queue an ask of the job running inside reservation `reservation_id` (Morpheus §4): its
    /// containers are granted up to the reservation's allocation at that moment and wait beyond
    /// it (DRA may stretch the allocation, [`Guarantor::reprovision`]). Refused when the
    /// reservation is unknown, another application's, or never allocates one container of it.
    pub fn submit_reserved(
        &mut self,
        ask: GuaranteedAsk,
        reservation_id: &str,
    ) -> Result<(), GuarantorError> {
        let Some(owner) = self.reservations.owner(reservation_id) else {
            return Err(GuarantorError::UnknownReservation(
                reservation_id.to_string(),
            ));
        };
        if owner != &ask.app_id {
            return Err(GuarantorError::NotReservationOwner(
                reservation_id.to_string(),
            ));
        }
        let most = self
            .reservations
            .plan()
            .get(reservation_id)
            .map(|r| r.peak())
            .unwrap_or_default();
        if !ask.resources.fits_in(&most) {
            return Err(GuarantorError::LargerThanReservation {
                id: reservation_id.to_string(),
                asked: ask.resources,
                most,
            });
        }
        self.submit_to(ask, Some(reservation_id.to_string()))
    }

    fn submit_to(
        &mut self,
        ask: GuaranteedAsk,
        reservation: Option<String>,
    ) -> Result<(), GuarantorError> {
        if ask.count == 0 || ask.resources.is_zero() {
            return Err(GuarantorError::Empty);
        }
        if !self
            .nodes
            .values()
            .any(|n| ask.resources.fits_in(&n.capacity))
        {
            return Err(self.larger_than_any_node(ask.resources));
        }
        self.pending.push_back(PendingAsk {
            ask,
            reservation,
            passed_over_since_ms: None,
        });
        Ok(())
    }

    /// Drop the pending containers of an ask (the application went away).
    pub fn cancel(&mut self, ask_key: u64) -> u32 {
        let mut n = self.cancel_job(ask_key);
        self.pending.retain(|p| {
            if p.ask.ask_key == ask_key {
                n += p.ask.count;
                false
            } else {
                true
            }
        });
        n
    }

    fn candidates<'a>(
        nodes: &'a NodeTable,
        closed: ClosedNodes,
        ask: &GuaranteedAsk,
    ) -> Vec<&'a GuarantorNode> {
        let fits: Vec<&GuarantorNode> = nodes
            .values()
            .filter(|n| ask.resources.fits_in(&n.free()) && !closed.contains(&n.node_id))
            .collect();
        let Some(loc) = &ask.locality else {
            return fits;
        };
        let on_nodes: Vec<&GuarantorNode> = fits
            .iter()
            .copied()
            .filter(|n| loc.nodes.iter().any(|x| x == n.node_id.as_str()))
            .collect();
        if !on_nodes.is_empty() {
            return on_nodes;
        }
        let on_racks: Vec<&GuarantorNode> = fits
            .iter()
            .copied()
            .filter(|n| loc.racks.iter().any(|r| r == &n.rack))
            .collect();
        if !on_racks.is_empty() {
            return on_racks;
        }
        if loc.relax || (loc.nodes.is_empty() && loc.racks.is_empty()) {
            fits
        } else {
            Vec::new()
        }
    }

    /// The placer's choice for `ask` found through the fit index (`Some(None)`: no node fits),
    /// when the placer has a [`BestFitRule`] and the ask names no nodes or racks. `None` sends
    /// the caller to score every candidate: the placer has no rule, the ask has a locality, or
    /// no candidate passes [`BestFitRule::NoQueueableCost`].
    fn indexed_choice(
        nodes: &NodeTable,
        closed: ClosedNodes,
        placer: &dyn GuaranteedPlacer,
        ask: &GuaranteedAsk,
    ) -> Option<Option<NodeId>> {
        let rule = placer.best_fit_rule()?;
        if Self::names_nodes_or_racks(ask) {
            return None;
        }
        let chosen = nodes.best_fit(&ask.resources, |n| {
            !closed.contains(&n.node_id) && rule.accepts(placer, ask, n)
        });
        // The index's keys follow every booking change (NodeMut, insert); checked again here
        // because a grant trusts this choice: a stale key must cost a scan, never over-commit.
        let fits = |node: &NodeId| {
            nodes
                .get(node)
                .is_some_and(|n| ask.resources.fits_in(&n.free()))
        };
        match (chosen, rule) {
            (Some(node), _) if fits(&node) => Some(Some(node)),
            (Some(_), _) => None,
            (None, BestFitRule::AnyCandidate) => Some(None),
            (None, BestFitRule::NoQueueableCost) => None,
        }
    }

    /// Place whatever pending containers fit now, in arrival order; an ask that does not fit
    /// does not block later ones. `now_ms` is the wall clock for token expiry.
    pub fn schedule(&mut self, now_ms: u64) -> Vec<GuaranteedPlacement> {
        self.tick(now_ms);
        let mut out = Vec::new();
        let mut still_pending = VecDeque::with_capacity(self.pending.len());
        while let Some(mut pending) = self.pending.pop_front() {
            let reservation = pending.reservation.take();
            let ask = &mut pending.ask;
            while ask.count > 0 && self.admits(now_ms, ask, reservation.as_deref()) {
                let closed = ClosedNodes::of(&self.draining, &self.unreachable);
                let chosen = match Self::indexed_choice(&self.nodes, closed, &*self.placer, ask) {
                    Some(answer) => answer,
                    None => {
                        let cands = Self::candidates(&self.nodes, closed, ask);
                        self.placer
                            .choose(ask, &cands)
                            .map(|i| cands[i].node_id.clone())
                    }
                };
                let Some(node_id) = chosen else { break };
                ask.count -= 1;
                out.push(self.grant(now_ms, ask, node_id, ask.count, reservation.as_deref()));
            }
            if ask.count > 0 {
                pending.reservation = reservation;
                still_pending.push_back(pending);
            }
        }
        self.pending = still_pending;
        out
    }

    /// Place pending containers on one node only, in ask arrival order, while they fit: the
    /// heartbeat-driven allocation of a YARN-like central scheduler (Mercury §7.1 baseline, and
    /// YARN's `nodeUpdate`), where a node's free capacity is considered only when that node
    /// heartbeats. An ask that does not fit does not block later ones; the scan stops as soon as
    /// the node has no capacity left. The node is given; the placer only decides, through
    /// [`GuaranteedPlacer::placement_cost`], whether an ask should rather wait (at most
    /// [`GuaranteedPlacer::node_update_patience_ms`]) for a node where it costs less. Locality is
    /// honoured as in [`Guarantor::schedule`]: an ask with a non-relaxed preference for other
    /// nodes or racks is skipped.
    pub fn schedule_on_node(&mut self, now_ms: u64, node_id: &NodeId) -> Vec<GuaranteedPlacement> {
        self.tick(now_ms);
        let mut out = Vec::new();
        if self.pending.is_empty() {
            return out;
        }
        let Some(node) = self.nodes.get(node_id) else {
            return out;
        };
        if self.closed().contains(node_id) {
            return out;
        }
        let (rack, capacity) = (node.rack.clone(), node.capacity);
        let patience_ms = self.placer.node_update_patience_ms();
        // Least cost of one container of each ask shape on the other nodes with room, computed
        // once per shape and call.
        let mut cheapest_elsewhere: Vec<(Resources, f64)> = Vec::new();
        let mut index = 0;
        while index < self.pending.len() {
            let node = &self.nodes[node_id];
            if node.free().is_zero() {
                break;
            }
            let ask = &self.pending[index].ask;
            let reservation = self.pending[index].reservation.as_deref();
            if !ask.resources.fits_in(&capacity)
                || !ask.resources.fits_in(&node.free())
                || !Self::locality_allows(ask, node_id, &rack)
                || !self.admits(now_ms, ask, reservation)
            {
                index += 1;
                continue;
            }
            if patience_ms > 0
                && !self.accept_on_node_update(
                    now_ms,
                    index,
                    node_id,
                    patience_ms,
                    &mut cheapest_elsewhere,
                )
            {
                index += 1;
                continue;
            }
            let mut ask = self.pending[index].ask.clone();
            let reservation = self.pending[index].reservation.clone();
            while ask.count > 0
                && ask.resources.fits_in(&self.nodes[node_id].free())
                && self.admits(now_ms, &ask, reservation.as_deref())
            {
                ask.count -= 1;
                out.push(self.grant(
                    now_ms,
                    &ask,
                    node_id.clone(),
                    ask.count,
                    reservation.as_deref(),
                ));
                if patience_ms > 0
                    && ask.count > 0
                    && !self.accept_on_node_update(
                        now_ms,
                        index,
                        node_id,
                        patience_ms,
                        &mut cheapest_elsewhere,
                    )
                {
                    break;
                }
            }
            if ask.count == 0 {
                self.pending.remove(index);
            } else {
                self.pending[index].ask.count = ask.count;
                index += 1;
            }
        }
        out
    }

    /// Whether the pending ask at `index` may take one container's worth of `node_id` now: it
    /// costs nothing there, or no other node could take it for less, or it has been passed over
    /// for `patience_ms` already. Records when it was first passed over.
    fn accept_on_node_update(
        &mut self,
        now_ms: u64,
        index: usize,
        node_id: &NodeId,
        patience_ms: u64,
        cheapest_elsewhere: &mut Vec<(Resources, f64)>,
    ) -> bool {
        let pending = &self.pending[index];
        let ask = &pending.ask;
        let here = self.placer.placement_cost(ask, &self.nodes[node_id]);
        let waited_out = pending
            .passed_over_since_ms
            .is_some_and(|since| now_ms.saturating_sub(since) >= patience_ms);
        let accept = here <= 0.0 || waited_out || {
            let elsewhere = match cheapest_elsewhere.iter().find(|(r, _)| *r == ask.resources) {
                Some(&(_, cost)) => cost,
                // A node elsewhere where the ask costs nothing, found through the fit index.
                None if Self::costs_nothing_elsewhere(
                    &self.nodes,
                    self.closed(),
                    &*self.placer,
                    ask,
                    node_id,
                ) =>
                {
                    cheapest_elsewhere.push((ask.resources, 0.0));
                    0.0
                }
                None => {
                    let cost = self
                        .nodes
                        .values()
                        .filter(|n| &n.node_id != node_id && ask.resources.fits_in(&n.free()))
                        .filter(|n| !self.closed().contains(&n.node_id))
                        .filter(|n| Self::locality_allows(ask, &n.node_id, &n.rack))
                        .map(|n| self.placer.placement_cost(ask, n))
                        .fold(f64::INFINITY, f64::min);
                    cheapest_elsewhere.push((ask.resources, cost));
                    cost
                }
            };
            here <= elsewhere
        };
        let pending = &mut self.pending[index];
        if !accept {
            pending.passed_over_since_ms.get_or_insert(now_ms);
        } else if !waited_out {
            // Placed where it is cheapest: it is no longer waiting for a better node.
            pending.passed_over_since_ms = None;
        }
        accept
    }

    /// Whether a node other than `here` takes `ask` at no cost by the placer's
    /// [`BestFitRule::NoQueueableCost`] rule, found through the fit index; false when the placer
    /// has no such rule or the ask names nodes or racks (the caller then scores every node).
    fn costs_nothing_elsewhere(
        nodes: &NodeTable,
        closed: ClosedNodes,
        placer: &dyn GuaranteedPlacer,
        ask: &GuaranteedAsk,
        here: &NodeId,
    ) -> bool {
        let rule = BestFitRule::NoQueueableCost;
        if placer.best_fit_rule() != Some(rule) || Self::names_nodes_or_racks(ask) {
            return false;
        }
        nodes
            .best_fit(&ask.resources, |n| {
                &n.node_id != here && !closed.contains(&n.node_id) && rule.accepts(placer, ask, n)
            })
            .is_some()
    }

    /// The ask prefers particular nodes or racks (the fit index does not order by locality).
    fn names_nodes_or_racks(ask: &GuaranteedAsk) -> bool {
        ask.locality
            .as_ref()
            .is_some_and(|l| !l.nodes.is_empty() || !l.racks.is_empty())
    }

    /// Advance the guarantor's clock to `now_ms` and end DRA stretches whose time is up.
    fn tick(&mut self, now_ms: u64) {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.reservations.expire_stretches(now_ms);
    }

    /// Whether one more container of `ask` may be granted at `now_ms` by the reservations' rule
    /// (DESIGN.md "The guarantor: one loop", layer 1): against its reservation's allocation at
    /// that moment, or, for plain work, outside what the reservations hold.
    fn admits(&self, now_ms: u64, ask: &GuaranteedAsk, reservation: Option<&str>) -> bool {
        match reservation {
            Some(id) => self
                .reservations
                .admits_reserved(now_ms, id, &ask.resources),
            None => self
                .reservations
                .admits_plain(now_ms, &ask.resources, ask.runtime_estimate_ms),
        }
    }

    /// Start (`true`) or end (`false`) draining `node_id` (an operator's `node drain`): while
    /// draining it gets no new GUARANTEED containers and its capacity leaves the reservation
    /// plan, which replans as when a node is lost (reservations that no longer fit are
    /// cancelled, their owners told); what runs there is untouched. Works for a node not joined
    /// (yet). Returns whether anything changed.
    pub fn set_draining(&mut self, node_id: &NodeId, draining: bool) -> bool {
        let capacity = self.nodes.get(node_id).map(|n| n.capacity);
        if draining {
            if !self.draining.insert(node_id.clone()) {
                return false;
            }
            if let Some(capacity) = capacity {
                let cancelled = self
                    .reservations
                    .node_capacity_changed(Some(capacity), None);
                for id in cancelled {
                    self.cancel_reservation(
                        &id,
                        &format!(
                            "node {node_id} is being drained and the reservation no longer fits"
                        ),
                    );
                }
            }
        } else {
            if !self.draining.remove(node_id) {
                return false;
            }
            if let Some(capacity) = capacity {
                self.reservations
                    .node_capacity_changed(None, Some(capacity));
            }
        }
        true
    }

    /// Whether an operator is draining `node_id`.
    pub fn is_draining(&self, node_id: &NodeId) -> bool {
        self.draining.contains(node_id)
    }

    /// Mark `node_id` unreachable (`true`: declared lost, its loss not stored yet, so not
    /// removed here yet) or reachable again: an unreachable node gets no new GUARANTEED work,
    /// and what it holds stays booked until [`Guarantor::remove_node`] (which, like a join,
    /// ends the mark). Before, the guarantor went on granting on a silent node for as long as
    /// the store refused the loss. Returns whether anything changed.
    pub fn set_unreachable(&mut self, node_id: &NodeId, unreachable: bool) -> bool {
        if unreachable {
            self.nodes.get(node_id).is_some() && self.unreachable.insert(node_id.clone())
        } else {
            self.unreachable.remove(node_id)
        }
    }

    /// The nodes that get no new GUARANTEED work: draining or unreachable.
    pub(crate) fn closed(&self) -> ClosedNodes<'_> {
        ClosedNodes::of(&self.draining, &self.unreachable)
    }

    /// Whether `node_id` is marked unreachable ([`Guarantor::set_unreachable`]).
    pub fn is_unreachable(&self, node_id: &NodeId) -> bool {
        self.unreachable.contains(node_id)
    }

    /// The first `limit` pending asks in service order, each with why it waits now (for
    /// operators: the dashboard and `explain`). O(limit × nodes).
    pub fn waiting_asks(&self, now_ms: u64, limit: usize) -> Vec<WaitingAsk> {
        self.pending
            .iter()
            .take(limit)
            .map(|p| {
                let ask = &p.ask;
                let reservation = p.reservation.as_deref();
                let fitting = self
                    .nodes
                    .values()
                    .filter(|n| {
                        ask.resources.fits_in(&n.free())
                            && !self.closed().contains(&n.node_id)
                            && Self::locality_allows(ask, &n.node_id, &n.rack)
                    })
                    .count();
                let reason = if !self.admits(now_ms, ask, reservation) {
                    match reservation {
                        Some(id) => format!(
                            "reservation {id:?} allocates no more than its containers hold now"
                        ),
                        None => "the capacity left outside reservations is used up".to_string(),
                    }
                } else if fitting == 0 {
                    if self
                        .nodes
                        .values()
                        .any(|n| ask.resources.fits_in(&n.capacity))
                    {
                        format!(
                            "no node{} has {} free",
                            if ask.locality.is_some() {
                                " it may use"
                            } else {
                                ""
                            },
                            ask.resources
                        )
                    } else {
                        format!("no node is large enough for {}", ask.resources)
                    }
                } else {
                    format!("{fitting} node(s) have room: placed at their next heartbeat")
                };
                WaitingAsk {
                    app_id: ask.app_id.clone(),
                    job_id: ask.job_id.clone(),
                    containers: ask.count,
                    resources: ask.resources,
                    priority: ask.priority,
                    reservation: p.reservation.clone(),
                    reason,
                }
            })
            .collect()
    }

    /// The reservations (plan, owners, use).
    pub fn reservations(&self) -> &ReservationBook {
        &self.reservations
    }

    /// Accept a reservation for `owner` (Morpheus §6.3, LowCost by default), or say why not.
    /// Returns its allocation over the agenda.
    pub fn reserve(
        &mut self,
        now_ms: u64,
        id: &str,
        owner: AppId,
        definition: ReservationDefinition,
    ) -> Result<Vec<AllocationInterval>, Rejection> {
        self.tick(now_ms);
        self.reservations.reserve(id, owner, definition)
    }

    /// Replace a reservation's definition; `owner` None is the operator. The old allocation
    /// stays when the new definition does not fit. Containers it runs keep running (and count
    /// against the new allocation).
    pub fn update_reservation(
        &mut self,
        now_ms: u64,
        id: &str,
        owner: Option<&AppId>,
        definition: ReservationDefinition,
    ) -> Result<Vec<AllocationInterval>, Rejection> {
        self.tick(now_ms);
        self.reservations.update(id, owner, definition)
    }

    /// Delete a reservation; `owner` None is the operator. Its running containers become plain
    /// GUARANTEED work; its waiting asks are dropped (their keys are returned).
    pub fn delete_reservation(
        &mut self,
        id: &str,
        owner: Option<&AppId>,
    ) -> Result<Vec<u64>, Rejection> {
        self.reservations.delete(id, owner)?;
        let dropped = self.drop_reserved_asks(id);
        self.untag_grants(id);
        Ok(dropped)
    }

    /// The reservations of `owner` (all with None), as of `now_ms`.
    pub fn list_reservations(&self, now_ms: u64, owner: Option<&AppId>) -> Vec<ReservationInfo> {
        self.reservations.list(now_ms, owner)
    }

    /// Run DRA (Morpheus §7) at `now_ms`: every reservation whose job demands more than its
    /// allocation (containers held plus containers waiting) and holds no live stretch is
    /// stretched for `T` where the plan has room. Call it every `T` (the book's
    /// [`crate::reservation::dra::Dra::extension_ms`]); the stretches are reported as
    /// [`ReservationEvent::Reprovisioned`]. Returns how many were stretched.
    pub fn reprovision(&mut self, now_ms: u64) -> usize {
        self.tick(now_ms);
        if self.reservations.is_empty() {
            return 0;
        }
        let mut waiting: std::collections::BTreeMap<&str, Resources> = Default::default();
        for p in &self.pending {
            if let Some(id) = p.reservation.as_deref() {
                let e = waiting.entry(id).or_default();
                *e = e.saturating_add(&p.ask.resources.scale(u64::from(p.ask.count)));
            }
        }
        let demands: Vec<(String, Resources)> = waiting
            .into_iter()
            .map(|(id, w)| {
                (
                    id.to_string(),
                    w.saturating_add(&self.reservations.used(id)),
                )
            })
            .collect();
        demands
            .into_iter()
            .filter(|(id, demand)| self.reservations.reprovision(now_ms, id, *demand))
            .count()
    }

    /// What reservation owners must be told since the last call.
    pub fn take_reservation_events(&mut self) -> Vec<ReservationEvent> {
        self.reservations.take_events()
    }

    /// Whether a node-update allocation on `node_id` respects the ask's locality.
    fn locality_allows(ask: &GuaranteedAsk, node_id: &NodeId, rack: &str) -> bool {
        match &ask.locality {
            None => true,
            Some(loc) => {
                loc.relax
                    || (loc.nodes.is_empty() && loc.racks.is_empty())
                    || loc.nodes.iter().any(|n| n == node_id.as_str())
                    || loc.racks.iter().any(|r| r == rack)
            }
        }
    }

    fn grant(
        &mut self,
        now_ms: u64,
        ask: &GuaranteedAsk,
        node_id: NodeId,
        remaining: u32,
        reservation: Option<&str>,
    ) -> GuaranteedPlacement {
        self.reservations.book(reservation, &ask.resources, true);
        let mut node = self.nodes.get_mut(&node_id).expect("candidate node exists");
        node.guaranteed = node.guaranteed.saturating_add(&ask.resources);
        if node.mark_limit_changed() {
            self.limits_changed.push(node_id.clone());
        }
        let epoch = node.epoch;
        drop(node); // re-files the node in the fit index
        let container_id = self.minter.next_id();
        // Plain, unshaped core work needs nothing beyond the token's resources to be booked
        // again after a restart; everything else carries its booking (signed).
        let booking = (reservation.is_some()
            || ask.allow_shaping
            || ask.role != ComponentRole::Core)
            .then(|| GrantBooking {
                reservation_id: reservation.map(str::to_string),
                role: ask.role,
                allow_shaping: ask.allow_shaping,
                requested: ask.resources,
            });
        let expires_at_ms = now_ms.saturating_add(self.config.token_ttl_ms);
        self.grants.insert(
            container_id,
            Grant {
                node: node_id.clone(),
                app: ask.app_id.clone(),
                resources: ask.resources,
                pending_until_ms: Some(expires_at_ms),
                epoch,
                reservation: reservation.map(str::to_string),
                role: ask.role,
                allow_shaping: ask.allow_shaping,
                requested: ask.resources,
            },
        );
        GuaranteedPlacement {
            ask_key: ask.ask_key,
            remaining,
            token_body: TokenBody {
                container_id,
                node_id,
                app_id: ask.app_id.clone(),
                resources: ask.resources,
                container_type: ContainerType::Guaranteed,
                version: 0,
                job_id: ask.job_id.clone(),
                job_submit_time_ms: crate::time::clamp_job_submit_time_ms(
                    ask.job_submit_time_ms,
                    now_ms,
                ),
                priority: ask.priority,
                runtime_estimate_ms: ask.runtime_estimate_ms,
                expires_at_ms,
                key_id: 0,
                node_epoch: epoch,
                booking,
                times_returned: 0,
            },
        }
    }

    /// A node reports running a GUARANTEED container: a grant of ours no longer expires; one we
    /// do not book (granted in a previous session of the coordinator, or started in the window
    /// of a re-join) is booked as it runs, so the books follow what nodes hold. `booking` is what
    /// the container's signed token says about how it was booked (see [`verified_booking`]):
    /// with it, a container of a reservation that still exists (and still belongs to the
    /// container's application) counts against that reservation's allocation again, and a
    /// shapeable one goes back to the shaper with its request, role and current (shaped) size;
    /// without it the container is plain GUARANTEED core work, exactly as a validated promotion
    /// (Mercury §3.4). It runs already, so it is booked even where it eats into reserved
    /// capacity or exceeds its reservation's allocation at this moment. Fails only if the node
    /// has no GUARANTEED room for it by our books (the node itself never over-commits: it
    /// refuses such a start).
    pub fn adopt_running(
        &mut self,
        node_id: &NodeId,
        container: &ContainerStatus,
        booking: Option<&GrantBooking>,
    ) -> Result<(), GuarantorError> {
        if self.grants.contains_key(&container.id) {
            self.on_started(container.id);
            return Ok(());
        }
        let terms = match booking {
            None => BookingTerms::plain(container.resources),
            Some(b) => BookingTerms {
                reservation: b
                    .reservation_id
                    .clone()
                    .filter(|id| self.reservations.owner(id) == Some(&container.app_id)),
                role: b.role,
                allow_shaping: b.allow_shaping,
                // A node never reports more than was granted; if it did, its report wins (the
                // books follow what nodes hold) and the shaper may not grow it further.
                requested: max_each(b.requested, container.resources),
            },
        };
        self.book_running(
            container.id,
            node_id,
            &container.app_id,
            container.resources,
            false,
            terms,
        )?;
        self.on_started(container.id);
        Ok(())
    }

    /// The reservation a GUARANTEED grant counts against (None: plain work or no such grant).
    pub fn grant_reservation(&self, id: ContainerId) -> Option<&str> {
        self.grants.get(&id).and_then(|g| g.reservation.as_deref())
    }

    /// What a GUARANTEED grant is booked at now (its shaped size while the shaper tracks it).
    pub fn grant_resources(&self, id: ContainerId) -> Option<Resources> {
        self.grants.get(&id).map(|g| g.resources)
    }

    /// The node accepted a GUARANTEED container: it no longer expires.
    pub fn on_started(&mut self, id: ContainerId) {
        if let Some(g) = self.grants.get_mut(&id) {
            g.pending_until_ms = None;
            // Work inside a reservation keeps its reserved size (the plan books it whole).
            if g.allow_shaping
                && g.reservation.is_none()
                && let Some(shaping) = &mut self.shaping
            {
                shaping.track(
                    id,
                    &g.app,
                    &g.node,
                    g.role,
                    g.requested,
                    g.resources,
                    crate::Time::from_millis(self.clock_ms),
                );
            }
        }
    }

    /// A GUARANTEED container ended or was released: free its capacity. Idempotent.
    pub fn on_finished(&mut self, id: ContainerId) -> bool {
        let Some(g) = self.grants.remove(&id) else {
            return false;
        };
        self.threesigma_grant_ended(id, g.pending_until_ms.is_some());
        if let Some(shaping) = &mut self.shaping {
            shaping.untrack(id);
        }
        self.reservations
            .book(g.reservation.as_deref(), &g.resources, false);
        if let Some(mut n) = self.nodes.get_mut(&g.node) {
            n.guaranteed = n.guaranteed.saturating_sub(&g.resources);
            if n.mark_limit_changed() {
                self.limits_changed.push(g.node.clone());
            }
        }
        true
    }

    /// `node` reports that GUARANTEED container `id` ended: freed only if the grant is on that
    /// node, so a worker cannot free bookings on other nodes (which would let the guarantor
    /// over-commit them). Idempotent.
    pub fn on_finished_on(&mut self, node: &NodeId, id: ContainerId) -> bool {
        match self.grants.get(&id) {
            Some(g) if &g.node == node => self.on_finished(id),
            _ => false,
        }
    }

    /// Free grants whose token expired before the container was started.
    pub fn expire_unstarted(&mut self, now_ms: u64) -> Vec<ContainerId> {
        let expired: Vec<ContainerId> = self
            .grants
            .iter()
            .filter(|(_, g)| g.pending_until_ms.is_some_and(|t| t <= now_ms))
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.on_finished(*id);
        }
        expired
    }

    /// The node a GUARANTEED grant (started or not) is on.
    pub fn grant_node(&self, id: ContainerId) -> Option<&NodeId> {
        self.grants.get(&id).map(|g| &g.node)
    }

    /// The application a GUARANTEED grant (started or not) belongs to.
    pub fn grant_owner(&self, id: ContainerId) -> Option<&AppId> {
        self.grants.get(&id).map(|g| &g.app)
    }

    /// Free an unstarted grant on its owner's behalf. Returns what the caller must revoke at the
    /// node (the token may still be presented until it expires), or `None` if `id` is not an
    /// unstarted grant of `app`. A started container is stopped at its node instead.
    pub fn release_unstarted(&mut self, id: ContainerId, app: &AppId) -> Option<UnstartedGrant> {
        let g = self.grants.get(&id)?;
        let expires_at_ms = g.pending_until_ms?;
        if &g.app != app {
            return None;
        }
        let revoke = UnstartedGrant {
            container_id: id,
            node_id: g.node.clone(),
            app_id: g.app.clone(),
            expires_at_ms,
        };
        self.on_finished(id);
        Some(revoke)
    }

    /// Whether a grant was handed out but its container not yet reported started by its node.
    pub fn is_unstarted(&self, id: ContainerId) -> bool {
        self.grants
            .get(&id)
            .is_some_and(|g| g.pending_until_ms.is_some())
    }

    pub fn is_guaranteed(&self, id: ContainerId) -> bool {
        self.grants.contains_key(&id)
    }

    /// Mercury §3.4: validate a promotion. Succeeds only if the container's node has the
    /// GUARANTEED capacity for it, and the cluster has it outside the reservations' (a promoted
    /// container is plain GUARANTEED work, as of the latest time the guarantor was told); then
    /// the capacity is booked.
    pub fn promote(
        &mut self,
        id: ContainerId,
        node_id: &NodeId,
        app: &AppId,
        resources: Resources,
    ) -> Result<(), GuarantorError> {
        self.book_running(
            id,
            node_id,
            app,
            resources,
            true,
            BookingTerms::plain(resources),
        )
    }

    /// Book a container that is (or is about to be) running on `node_id` at `resources` under
    /// `terms`; with `respect_reservations`, plain work is refused where it would take reserved
    /// capacity.
    fn book_running(
        &mut self,
        id: ContainerId,
        node_id: &NodeId,
        app: &AppId,
        resources: Resources,
        respect_reservations: bool,
        terms: BookingTerms,
    ) -> Result<(), GuarantorError> {
        if self.grants.contains_key(&id) {
            return Err(GuarantorError::AlreadyGuaranteed(id));
        }
        let mut node = self
            .nodes
            .get_mut(node_id)
            .ok_or_else(|| GuarantorError::UnknownNode(node_id.to_string()))?;
        if !resources.fits_in(&node.free()) {
            return Err(GuarantorError::NoCapacityForPromotion {
                node: node_id.to_string(),
                free: node.free(),
                needed: resources,
            });
        }
        if respect_reservations
            && !self
                .reservations
                .admits_plain(self.clock_ms, &resources, None)
        {
            return Err(GuarantorError::ReservedCapacity);
        }
        self.reservations
            .book(terms.reservation.as_deref(), &resources, true);
        node.guaranteed = node.guaranteed.saturating_add(&resources);
        if node.mark_limit_changed() {
            self.limits_changed.push(node_id.clone());
        }
        self.grants.insert(
            id,
            Grant {
                node: node_id.clone(),
                app: app.clone(),
                resources,
                pending_until_ms: None,
                epoch: node.epoch,
                reservation: terms.reservation,
                role: terms.role,
                allow_shaping: terms.allow_shaping,
                requested: terms.requested,
            },
        );
        Ok(())
    }

    /// A heartbeat reported a GUARANTEED container's measured use (input of the shaper).
    pub fn observe_usage(&mut self, id: ContainerId, used: Resources) {
        if let Some(shaping) = &mut self.shaping {
            shaping.observe(id, used);
        }
    }

    /// A shaping pass is due at `now_ms` (false when shaping is off).
    pub fn shaping_due(&mut self, now_ms: u64) -> bool {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.shaping
            .as_mut()
            .is_some_and(|s| s.due(crate::Time::from_millis(now_ms)))
    }

    /// One shaping pass (Pace §3.2): every shaped container's grant is resized to its forecast
    /// peak + β (between its current use and its request), and, when the shaped allocations of a
    /// node no longer fit beside its unshaped GUARANTEED work, the policy's victims are freed
    /// here; the caller resizes the containers at their nodes and stops the victims. Bookings
    /// follow the shaped sizes, so what shaping frees goes to new placements and to the
    /// QUEUEABLE policing limit. Never over-commits a node.
    pub fn shape(&mut self, now_ms: u64) -> ShapingOutcome {
        self.clock_ms = self.clock_ms.max(now_ms);
        let Some(shaping) = &mut self.shaping else {
            return ShapingOutcome::default();
        };
        // What each node offers the shaped containers: its capacity less every booking the
        // shaper does not resize (unshaped, unstarted, reserved grants).
        let mut hosts: HashMap<NodeId, Resources> = self
            .nodes
            .values()
            .map(|n| (n.node_id.clone(), n.capacity))
            .collect();
        for (id, g) in &self.grants {
            if !shaping.is_tracked(*id)
                && let Some(free) = hosts.get_mut(&g.node)
            {
                *free = free.saturating_sub(&g.resources);
            }
        }
        let outcome = shaping.pass(crate::Time::from_millis(now_ms), &hosts);
        for r in &outcome.resized {
            let Some(g) = self.grants.get_mut(&r.container) else {
                continue;
            };
            let old = std::mem::replace(&mut g.resources, r.to);
            let allocation = &r.to;
            let node_id = &r.node;
            self.reservations.book(None, &old, false);
            self.reservations.book(None, allocation, true);
            if let Some(mut n) = self.nodes.get_mut(node_id) {
                n.guaranteed = n.guaranteed.saturating_sub(&old).saturating_add(allocation);
                if n.mark_limit_changed() {
                    self.limits_changed.push(node_id.clone());
                }
            }
        }
        for (_, id, _, _) in &outcome.preempted {
            self.on_finished(*id);
        }
        outcome
    }

    /// Policing limits of the nodes whose GUARANTEED bookings changed since the last call (joined
    /// nodes only), in name order.
    pub fn take_changed_limits(&mut self) -> Vec<(NodeId, Resources)> {
        let mut changed: Vec<(NodeId, Resources)> = std::mem::take(&mut self.limits_changed)
            .into_iter()
            .filter_map(|id| {
                let mut node = self.nodes.get_mut(&id)?;
                if !std::mem::replace(&mut node.limit_changed, false) {
                    return None; // listed twice (a re-join); reported once
                }
                Some((id, node.free()))
            })
            .collect();
        changed.sort_by(|a, b| a.0.cmp(&b.0));
        changed
    }

    /// Mercury §4.3 resource policing, first form: what a node may give QUEUEABLE work is what
    /// GUARANTEED work does not hold there.
    pub fn queueable_limit(&self, node_id: &NodeId) -> Option<Resources> {
        self.nodes.get(node_id).map(|n| n.free())
    }

    /// No node over-committed with GUARANTEED work, books equal grants (per node, per
    /// reservation and for plain work), and the plan's invariants (never over capacity).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.nodes.check()?;
        if let Some(n) = self
            .unreachable
            .iter()
            .find(|n| self.nodes.get(n).is_none())
        {
            return Err(format!(
                "node {n} is marked unreachable but not in the table"
            ));
        }
        let mut by_reservation: HashMap<Option<String>, Resources> = HashMap::new();
        for g in self.grants.values() {
            let e = by_reservation.entry(g.reservation.clone()).or_default();
            *e = e.saturating_add(&g.resources);
        }
        self.reservations.check_invariants(&by_reservation)?;
        for p in &self.pending {
            if let Some(id) = &p.reservation
                && !self.reservations.contains(id)
            {
                return Err(format!(
                    "ask {} waits for unknown reservation {id}",
                    p.ask.ask_key
                ));
            }
        }
        for n in self.nodes.values() {
            let sum = self
                .grants
                .values()
                .filter(|g| g.node == n.node_id)
                .fold(Resources::ZERO, |acc, g| acc.saturating_add(&g.resources));
            if sum != n.guaranteed {
                return Err(format!(
                    "node {}: booked {} but grants sum to {}",
                    n.node_id, n.guaranteed, sum
                ));
            }
            if !sum.fits_in(&n.capacity) {
                return Err(format!(
                    "node {} over-committed: {} > {}",
                    n.node_id, sum, n.capacity
                ));
            }
        }
        if let Some(shaping) = &self.shaping {
            for (id, g) in &self.grants {
                let Some(allocation) = shaping.allocation(*id) else {
                    continue;
                };
                if allocation != g.resources {
                    return Err(format!(
                        "shaped {id}: booked {} but shaped to {allocation}",
                        g.resources
                    ));
                }
                if !allocation.fits_in(&g.requested) {
                    return Err(format!(
                        "shaped {id} above its request: {allocation} > {}",
                        g.requested
                    ));
                }
            }
            if shaping.len() > self.grants.len() {
                return Err(format!(
                    "the shaper tracks {} containers but only {} are granted",
                    shaping.len(),
                    self.grants.len()
                ));
            }
        }
        Ok(())
    }
}

/// How a running container is booked (see [`Guarantor::adopt_running`]).
struct BookingTerms {
    reservation: Option<String>,
    role: ComponentRole,
    allow_shaping: bool,
    requested: Resources,
}

impl BookingTerms {
    /// Plain GUARANTEED core work, not shaped (a promoted QUEUEABLE container declared no role).
    fn plain(resources: Resources) -> BookingTerms {
        BookingTerms {
            reservation: None,
            role: ComponentRole::Core,
            allow_shaping: false,
            requested: resources,
        }
    }
}

fn max_each(a: Resources, b: Resources) -> Resources {
    Resources::new(
        a.cpu_millis.max(b.cpu_millis),
        a.memory_mib.max(b.memory_mib),
    )
}

/// Why a reported container's token does not prove how it was booked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookingProofError {
    #[error("its token is for container {token}, not {status}")]
    OtherContainer {
        token: ContainerId,
        status: ContainerId,
    },
    #[error("its token is for node {token}, but node {reporter} reports it")]
    OtherNode { token: NodeId, reporter: NodeId },
    #[error("its token is for app {token}, but the node reports app {status}")]
    OtherApp { token: AppId, status: AppId },
    #[error("its token is not a GUARANTEED grant")]
    NotGuaranteed,
    #[error("its token does not verify: {0}")]
    Signature(#[from] TokenError),
}

/// The booking a GUARANTEED container's token proves, for [`Guarantor::adopt_running`] after a
/// coordinator restart: `None` when the node reported no token or the token carries no booking
/// (plain work). The token must be the coordinator's (Ed25519 under one of `keys`; its expiry
/// does not matter, the container started while it was valid) and for this container, app and
/// reporting node, so a worker can neither invent a booking nor move one between containers.
/// Tokens signed by a key rotated out of `keys` cannot be checked: the caller books those as
/// plain work.
pub fn verified_booking(
    keys: &PublicKeyRing,
    reporter: &NodeId,
    status: &ContainerStatus,
) -> Result<Option<GrantBooking>, BookingProofError> {
    let Some(token) = status.grant_token.as_ref() else {
        return Ok(None);
    };
    check_token_matches(token, reporter, status)?;
    keys.verify_signature(token)?;
    Ok(token.body.booking.clone())
}

fn check_token_matches(
    token: &ContainerToken,
    reporter: &NodeId,
    status: &ContainerStatus,
) -> Result<(), BookingProofError> {
    let body = &token.body;
    if body.container_id != status.id {
        return Err(BookingProofError::OtherContainer {
            token: body.container_id,
            status: status.id,
        });
    }
    if &body.node_id != reporter {
        return Err(BookingProofError::OtherNode {
            token: body.node_id.clone(),
            reporter: reporter.clone(),
        });
    }
    if body.app_id != status.app_id {
        return Err(BookingProofError::OtherApp {
            token: body.app_id.clone(),
            status: status.app_id.clone(),
        });
    }
    if body.container_type != ContainerType::Guaranteed {
        return Err(BookingProofError::NotGuaranteed);
    }
    Ok(())
}

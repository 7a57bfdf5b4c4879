//! The distributed scheduler that runs on every worker (Mercury §4.2 "Distributed placement of
//! QUEUEABLE containers", §6.3): places QUEUEABLE asks without contacting the coordinator, by
//! choosing pseudo-randomly among the top-k nodes of least estimated queue delay in the latest
//! cluster view, honouring locality among the view's nodes (the nodes it holds QUEUEABLE keys
//! for), never putting two off-locality containers of one ask on the same node in one round, and
//! enforcing per-app quotas (§4.1).
//!
//! Between two views the scheduler accounts for its own placements, as YARN's opportunistic
//! allocator tracks the queue lengths of the nodes it uses: each container it places adds its
//! expected work to its local copy of that node's R, and the pseudo-random choice is among the k
//! nodes of least *updated* estimate. The coordinator therefore sends more candidates than k
//! ([`view_size`]); a fresh view resets the estimates. Without this, every scheduler sends every
//! container of a 3-s round to the same k nodes (herding).
//!
//! Herding happens between schedulers too: every scheduler holds the same round's view, so the
//! nodes one of them finds least loaded are the ones all of them find least loaded. A scheduler
//! therefore counts each of its placements as if each of its peers (one per node of the
//! directory: a distributed scheduler runs on every node, §6.3) had made the same one: a burst
//! goes one container per node down the view in order of R, the intent of YARN's distributed
//! allocator placing at most one container per node per AM heartbeat. Stale load information
//! makes "go to the least loaded" herd (Mitzenmacher, "How useful is old information?", IEEE
//! TPDS 2000); in the simulator's only-Q runs, own-placement accounting alone left 31% of the
//! cores idle on nodes no view pointed at while the view's first nodes queued ~190 containers
//! (docs/experiments/mercury/diagnosis.md). A node that shed QUEUEABLE work is
//! avoided until the next view ([`DistributedScheduler::avoid_until_next_view`]), so the
//! re-asked containers do not return to it on the same stale estimate.

use crate::ids::{ContainerIdMinter, NameBuildHasher};
use crate::protocol::app::Locality;
use crate::quota::{QueueableQuota, QuotaTracker};
use crate::token::TokenBody;
use crate::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One node of the cluster directory (membership; changes rarely).
///
/// On the wire as a six-element array `[node_id, rack, cpu_millis, memory_mib, app_endpoint,
/// slot]` (cluster protocol 8, issue 17), not a map with named fields: whole directories and
/// deltas are made of entries, and at 5,000 nodes a join storm sends every entry to every node;
/// as named maps an entry took ~107 bytes, as an array it takes the values and 1 byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDirectoryEntry {
    pub node_id: NodeId,
    pub rack: String,
    pub capacity: Resources,
    /// `host:port` where applications reach this node's worker.
    pub app_endpoint: String,
    /// The node's slot: a small number the coordinator gives it at join, unique among the
    /// nodes of a directory version, by which the top-k names it on the wire
    /// ([`ClusterView::top_k_slots`]). [`crate::coordinator::CoordinatorState::join`] sets it;
    /// what a joining caller puts here is replaced.
    pub slot: u32,
}

impl Serialize for NodeDirectoryEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (
            &self.node_id,
            &self.rack,
            self.capacity.cpu_millis,
            self.capacity.memory_mib,
            &self.app_endpoint,
            self.slot,
        )
            .serialize(s)
    }
}

impl<'de> Deserialize<'de> for NodeDirectoryEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NodeDirectoryEntry, D::Error> {
        let (node_id, rack, cpu_millis, memory_mib, app_endpoint, slot) =
            <(NodeId, String, u64, u64, String, u32)>::deserialize(d)?;
        Ok(NodeDirectoryEntry {
            node_id,
            rack,
            capacity: Resources::new(cpu_millis, memory_mib),
            app_endpoint,
            slot,
        })
    }
}

/// A node's rank in the top-k list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeLoad {
    pub node_id: NodeId,
    /// R = Tq + Tr + Tl in ms.
    pub queue_delay_ms: f64,
}

/// A top-k entry as it crosses the wire: the node by its directory slot
/// ([`NodeDirectoryEntry::slot`]), resolved to its name by the receiving scheduler
/// ([`DistributedScheduler::update_view`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotLoad {
    pub slot: u32,
    /// R = Tq + Tr + Tl in ms.
    pub queue_delay_ms: f64,
}

/// What the coordinator disseminates: membership and the least-loaded nodes.
///
/// Membership goes out in one of three forms (issue 17): nothing (`directory` empty, `delta`
/// `None`: the scheduler's directory is at `directory_version`), the whole directory
/// (`directory`, at join and when the version the worker reports is unknown or older than the
/// coordinator's change log), or the changes since the reported version (`delta`). A membership
/// change thus costs every node O(changes), not O(nodes).
///
/// On the wire (cluster protocol 9) the directory is *partial*: a scheduler only ever places on
/// the nodes of its view, so it is sent the entries of those nodes only, with the keys that go
/// with them (`entries`: the view's nodes it was not sent yet, [`crate::coordinator::NodeView`]),
/// and what it needs of the rest in sum (`cluster`: how many nodes, the largest capacities).
/// The "whole directory" of a join answer is then the joining node's own entry, and a delta
/// names only the nodes that left. A join costs O(k), not O(nodes): at 10,000 nodes a join answer
/// carried 266 KB of directory, and a join storm O(nodes²) bytes (docs/benchmarks.md §9).
/// In-process views (the simulator, tests) may still carry the whole directory without
/// `cluster`; the scheduler then takes both sums from its directory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The membership version this view brings the scheduler to. Bumped at most once per
    /// coordinator round however many nodes join or leave in it.
    pub directory_version: u64,
    /// The whole directory when it is sent (partial on the wire: the receiving node's own entry);
    /// empty otherwise.
    pub directory: Vec<NodeDirectoryEntry>,
    /// The changes since the version the worker reported, when those are sent instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<DirectoryDelta>,
    /// The cluster in sum, with every membership sent on the wire (protocol 9): the scheduler's
    /// directory is partial. `None`: the directory is whole, or unchanged since the last sum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterSummary>,
    /// Nodes of least queue delay, ascending (at most the coordinator's k), by name: how a view
    /// is handed over in-process (the simulator, tests). Never on the wire.
    #[serde(skip)]
    pub top_k: Vec<NodeLoad>,
    /// The same list as it crosses the wire: each node by its directory slot, as two columns
    /// ([`top_k_columns`], cluster protocol 8). A node's name is ~16 bytes at 10,000 nodes and
    /// its slot 3, and the list goes with every heartbeat answer (issue 17). When it is not
    /// empty the scheduler takes it instead of `top_k`, resolving each slot in its directory
    /// at the view's version.
    #[serde(rename = "top_k", with = "top_k_columns")]
    pub top_k_slots: Vec<SlotLoad>,
    /// Directory entries of view nodes this scheduler was not sent yet, or whose node re-joined
    /// since (protocol 9): added to its directory, replacing an entry of the same node or slot,
    /// after the membership above is applied. They travel with the nodes' QUEUEABLE keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<NodeDirectoryEntry>,
}

/// Largest number of capacities a [`ClusterSummary`] lists: past it the list is sent empty and
/// schedulers do not refuse asks as larger than any node (the check is a courtesy to apps;
/// an ask no node can hold stays unplaced with its reason).
pub const SUMMARY_MAX_CAPACITIES: usize = 64;

/// What a scheduler with a partial directory knows of the whole cluster (cluster protocol 9).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterSummary {
    /// Joined nodes: each runs a distributed scheduler that sees the same view, which a
    /// scheduler counts in its own placements (see the module documentation).
    pub nodes: u32,
    /// The node capacities not exceeded in both CPU and memory by another node's: an ask fits on
    /// some node exactly when it fits in one of these. Empty when there would be more than
    /// [`SUMMARY_MAX_CAPACITIES`] (then not checked).
    pub largest_capacities: Vec<Resources>,
}

impl ClusterSummary {
    /// The summary of the nodes of `capacities` (one item per node).
    pub fn of(capacities: impl Iterator<Item = Resources>) -> ClusterSummary {
        let mut nodes = 0u32;
        let mut distinct: Vec<Resources> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for c in capacities {
            nodes = nodes.saturating_add(1);
            if seen.insert(c) {
                distinct.push(c);
            }
        }
        ClusterSummary {
            nodes,
            largest_capacities: largest_capacities(distinct),
        }
    }
}

/// The Pareto front of distinct capacities (none holds another in both dimensions), or nothing
/// when it has more than [`SUMMARY_MAX_CAPACITIES`]. Sorted by CPU descending: an element is on
/// the front exactly when its memory exceeds that of every element with more CPU.
fn largest_capacities(mut distinct: Vec<Resources>) -> Vec<Resources> {
    distinct.sort_unstable_by(|a, b| {
        b.cpu_millis
            .cmp(&a.cpu_millis)
            .then(b.memory_mib.cmp(&a.memory_mib))
    });
    let mut front: Vec<Resources> = Vec::new();
    for c in distinct {
        if front.last().is_none_or(|f| c.memory_mib > f.memory_mib) {
            front.push(c);
        }
    }
    if front.len() > SUMMARY_MAX_CAPACITIES {
        front.clear();
    }
    front
}

/// The top-k list on the wire as two columns, `{node_slots: [..], queue_delays_ms: [..]}`,
/// instead of one `{node_id, queue_delay_ms}` map per entry (cluster protocol 6, issue 17): the
/// list is sent with every heartbeat answer and was 94 % of its bytes, about 45 bytes per entry
/// with the field names repeated. Protocol 7 made the delays 5-byte 32-bit floats (a 64-bit one
/// is read too); protocol 8 names each node by its directory slot (1–5 bytes) instead of its id
/// (~17 bytes at 10,000 nodes). Columns of different lengths are refused.
pub mod top_k_columns {
    use super::SlotLoad;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize)]
    struct ColumnsRef {
        node_slots: Vec<u32>,
        /// 32-bit floats on the wire (protocol 7): 5 bytes instead of 9 an entry, and still
        /// a tenth of a millisecond at a quarter of an hour of queue delay.
        queue_delays_ms: Vec<f32>,
    }

    #[derive(Deserialize)]
    struct Columns {
        node_slots: Vec<u32>,
        queue_delays_ms: Vec<f64>,
    }

    pub fn serialize<S: Serializer>(top_k: &[SlotLoad], s: S) -> Result<S::Ok, S::Error> {
        ColumnsRef {
            node_slots: top_k.iter().map(|l| l.slot).collect(),
            queue_delays_ms: top_k.iter().map(|l| l.queue_delay_ms as f32).collect(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SlotLoad>, D::Error> {
        let Columns {
            node_slots,
            queue_delays_ms,
        } = Columns::deserialize(d)?;
        if node_slots.len() != queue_delays_ms.len() {
            return Err(serde::de::Error::custom(format!(
                "top_k has {} node slots but {} queue delays",
                node_slots.len(),
                queue_delays_ms.len()
            )));
        }
        Ok(node_slots
            .into_iter()
            .zip(queue_delays_ms)
            .map(|(slot, queue_delay_ms)| SlotLoad {
                slot,
                queue_delay_ms,
            })
            .collect())
    }
}

/// The membership changes from `from_version` to the view's `directory_version`, as the final
/// state of each node that changed: present with its current entry (`joined`: it joined or
/// re-joined, its entry replaces any old one) or absent (`left`). Applying it to a directory at
/// any version from `from_version` up to the view's version gives the directory at the view's
/// version (a node that changed in between is listed with its final state), so a heartbeat
/// answered after an earlier one already moved the scheduler on still applies cleanly.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DirectoryDelta {
    pub from_version: u64,
    pub joined: Vec<NodeDirectoryEntry>,
    pub left: Vec<NodeId>,
}

/// What [`DistributedScheduler::update_view`] did to the directory, for the caller to do the
/// same to the QUEUEABLE keys that go with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirectoryUpdate {
    /// Same version, nothing sent.
    Unchanged,
    /// A whole directory replaced the old one: the keys sent replace the old ones.
    Replaced,
    /// A delta was applied: the keys sent are for its joined nodes, and the left nodes' keys go.
    Patched { left: Vec<NodeId> },
    /// A delta from a version after the scheduler's, or to one before it (cannot happen on one
    /// ordered stream from one coordinator): ignored with its keys; the next heartbeat reports
    /// the scheduler's version and gets a delta or the whole directory from there.
    Ignored,
}

/// Distributed scheduler settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistributedSchedulerConfig {
    /// k of top-k. Mercury §7.2.2 found k = 50 best on 256 nodes.
    pub top_k: usize,
    /// Validity of a grant's token (YARN uses the 600 s allocation expiry).
    pub token_ttl_ms: u64,
}

/// Candidates the coordinator puts in a view per unit of k: the scheduler chooses among the k of
/// least estimated R, and as its own placements raise the estimates of those, the next ones in
/// the view take their place.
pub const VIEW_CANDIDATES_PER_K: usize = 4;

/// Runtime assumed for a QUEUEABLE container without an estimate, when accounting for the work
/// a placement adds to a node (the node runtime's default, `NodeRuntimeConfig`).
pub const DEFAULT_RUNTIME_ESTIMATE_MS: u64 = 10_000;

/// How many nodes the coordinator should send in a view for schedulers that choose among `k`.
pub fn view_size(k: usize) -> usize {
    k.max(1).saturating_mul(VIEW_CANDIDATES_PER_K)
}

/// How long a QUEUEABLE container returned by `this_node` should expect to wait at most once
/// placed again, for [`crate::node::NodeRuntime::shed_held_by_guaranteed`]: the R of the `k`-th
/// least-loaded *other* node of the round's view (`top_k`, ascending; a distributed scheduler
/// places among the first `k`, and not on the node that returned the work), plus one round
/// interval, the most the view's figures can be out of date. None when the view names no other
/// node: there is nowhere else to go, so nothing is returned.
pub fn replacement_wait_bound_ms(
    top_k: &[NodeLoad],
    this_node: &NodeId,
    k: usize,
    round_interval_ms: u64,
) -> Option<f64> {
    kth_other_bound_ms(
        top_k
            .iter()
            .filter(|l| &l.node_id != this_node)
            .map(|l| l.queue_delay_ms),
        k,
        round_interval_ms,
    )
}

/// [`replacement_wait_bound_ms`] over the list as it arrives on the wire, before a scheduler
/// resolves its slots: `this_slot` is the returning node's own slot (its directory entry's;
/// `None` if unknown, then every entry counts as another node).
pub fn replacement_wait_bound_ms_by_slot(
    top_k: &[SlotLoad],
    this_slot: Option<u32>,
    k: usize,
    round_interval_ms: u64,
) -> Option<f64> {
    kth_other_bound_ms(
        top_k
            .iter()
            .filter(|l| Some(l.slot) != this_slot)
            .map(|l| l.queue_delay_ms),
        k,
        round_interval_ms,
    )
}

/// The `k`-th of the other nodes' R (ascending), plus one round interval.
fn kth_other_bound_ms(
    others_ms: impl Iterator<Item = f64>,
    k: usize,
    round_interval_ms: u64,
) -> Option<f64> {
    let kth = others_ms.take(k.max(1)).last()?;
    Some(kth.max(0.0) + round_interval_ms as f64)
}

impl Default for DistributedSchedulerConfig {
    fn default() -> Self {
        DistributedSchedulerConfig {
            top_k: 50,
            token_ttl_ms: 600_000,
        }
    }
}

/// A QUEUEABLE ask as the distributed scheduler sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueableAsk {
    pub app_id: AppId,
    pub resources: Resources,
    pub count: u32,
    pub priority: u32,
    pub locality: Option<Locality>,
    pub runtime_estimate_ms: Option<u64>,
    pub job_id: JobId,
    pub job_submit_time_ms: u64,
    /// The containers of `count` that re-place containers nodes shed or returned (the app
    /// named them in `allocate.replaces_shed`), each as the number of times its work has now
    /// been returned (at least 1): the first this many placed carry it in
    /// [`TokenBody::times_returned`].
    #[serde(default)]
    pub replacements: Vec<u8>,
}

/// One placed container, with the token body to sign.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacedContainer {
    pub container_id: ContainerId,
    pub node_id: NodeId,
    pub node_endpoint: String,
    pub token_body: TokenBody,
}

/// Result of placing one ask.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PlacementOutcome {
    pub placed: Vec<PlacedContainer>,
    pub unplaced: u32,
    pub unplaced_reason: Option<String>,
}

/// Refusals of a whole ask.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("no cluster view yet: this worker has not heard from the coordinator")]
    NoView,
    #[error("ask of {asked} is larger than every node of the cluster (largest: {largest})")]
    LargerThanAnyNode {
        asked: Resources,
        largest: Resources,
    },
    #[error("ask has zero resources or zero count")]
    Empty,
    #[error("QUEUEABLE quota of app {app} reached ({outstanding} outstanding)")]
    QuotaExceeded { app: String, outstanding: u32 },
}

impl PlacementError {
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            PlacementError::NoView | PlacementError::QuotaExceeded { .. }
        )
    }
}

/// The per-worker distributed scheduler state.
#[derive(Clone, Debug)]
pub struct DistributedScheduler {
    config: DistributedSchedulerConfig,
    minter: ContainerIdMinter,
    view: ClusterView,
    directory_index: HashMap<NodeId, usize, NameBuildHasher>,
    /// Directory position by node slot, to read a top-k that names nodes by slot.
    slot_index: HashMap<u32, usize>,
    /// Directory index of each top-k entry (`None` if not in the directory), so placement does
    /// not hash node names per candidate.
    top_k_index: Vec<Option<usize>>,
    /// This scheduler's estimate of each view entry's R (ms): the coordinator's value plus the
    /// expected work of the containers placed there since the view arrived.
    estimated_ms: Vec<f64>,
    /// View entries to avoid until the next view (the node shed QUEUEABLE work).
    avoided: Vec<bool>,
    /// View positions ordered by (estimated R, position): the k least loaded candidates are the
    /// first k that pass in this order. Kept sorted as placements raise estimates, so a choice
    /// costs O(k) rather than a selection over the whole view.
    order: Vec<usize>,
    /// Where each view position is in `order`.
    rank: Vec<usize>,
    /// (directory index, view position) of every resolved view entry, sorted: the entries of a
    /// node are one binary search away when a placement raises its estimate.
    view_positions_by_node: Vec<(usize, usize)>,
    /// Scratch for the k view positions drawn from, empty between choices.
    drawn: Vec<usize>,
    /// Scratch: the directory entries an ask already got an off-locality container on.
    used_off_locality: UsedNodes,
    /// The distinct node capacities of the directory, or the summary's largest ones, for the
    /// "fits on some node" check; `None`: not known (a summary with too many), not checked.
    capacities: Option<Vec<Resources>>,
    /// The cluster in sum when the directory is partial (the last one sent).
    summary: Option<ClusterSummary>,
    quotas: QuotaTracker,
}

impl DistributedScheduler {
    /// `issuer` is this worker's container-id prefix, assigned by the coordinator at join.
    pub fn new(config: DistributedSchedulerConfig, issuer: u32) -> DistributedScheduler {
        DistributedScheduler {
            config,
            minter: ContainerIdMinter::new(issuer),
            view: ClusterView::default(),
            directory_index: HashMap::default(),
            slot_index: HashMap::new(),
            top_k_index: Vec::new(),
            estimated_ms: Vec::new(),
            avoided: Vec::new(),
            order: Vec::new(),
            rank: Vec::new(),
            view_positions_by_node: Vec::new(),
            drawn: Vec::new(),
            used_off_locality: UsedNodes::default(),
            capacities: Some(Vec::new()),
            summary: None,
            quotas: QuotaTracker::new(),
        }
    }

    pub fn config(&self) -> &DistributedSchedulerConfig {
        &self.config
    }

    pub fn set_top_k(&mut self, k: usize) {
        self.config.top_k = k.max(1);
    }

    pub fn issuer(&self) -> u32 {
        self.minter.issuer()
    }

    /// Re-key after a (re-)join assigned a new issuer prefix.
    pub fn set_issuer(&mut self, issuer: u32) {
        if issuer != self.minter.issuer() {
            self.minter = ContainerIdMinter::new(issuer);
        }
    }

    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    pub fn quotas(&self) -> &QuotaTracker {
        &self.quotas
    }

    pub fn quotas_mut(&mut self) -> &mut QuotaTracker {
        &mut self.quotas
    }

    /// Install a new view: its whole directory, or its delta applied to this scheduler's, or
    /// (neither sent, same version) the old directory kept. See [`ClusterView`].
    pub fn update_view(&mut self, view: ClusterView) -> DirectoryUpdate {
        let ClusterView {
            directory_version,
            directory,
            delta,
            cluster,
            top_k,
            top_k_slots,
            entries,
        } = view;
        let update = match delta {
            Some(delta) => {
                let mine = self.view.directory_version;
                if delta.from_version <= mine && mine <= directory_version {
                    self.apply_delta(delta.joined, &delta.left);
                    self.view.directory_version = directory_version;
                    DirectoryUpdate::Patched { left: delta.left }
                } else {
                    DirectoryUpdate::Ignored
                }
            }
            None if directory_version != self.view.directory_version || !directory.is_empty() => {
                self.view.directory = Self::in_name_order_last_wins(directory);
                self.view.directory_version = directory_version;
                self.reindex_directory();
                DirectoryUpdate::Replaced
            }
            None => DirectoryUpdate::Unchanged,
        };
        match &update {
            DirectoryUpdate::Replaced | DirectoryUpdate::Patched { .. } => {
                // A whole directory without a sum is whole (in-process views).
                if cluster.is_some() || matches!(update, DirectoryUpdate::Replaced) {
                    self.summary = cluster;
                }
                if entries.is_empty() {
                    self.reindex_capacities();
                }
            }
            DirectoryUpdate::Unchanged | DirectoryUpdate::Ignored => {}
        }
        if !entries.is_empty() {
            // Current entries, counted as held by the coordinator: kept even with an ignored
            // delta (each replaces its node's or slot's older entry).
            self.add_entries(entries);
        }
        if top_k_slots.is_empty() {
            self.update_top_k(top_k);
        } else if self.view.directory_version == directory_version {
            let named = self.named_top_k(&top_k_slots);
            self.update_top_k(named);
        }
        // Else the slots are of a directory version this scheduler does not hold (a delta it
        // ignored): resolved in its own directory they could name a node that left, whose slot
        // another node took since. The previous list stays until a view it can read.
        update
    }

    /// The top-k by name: each slot's node in this scheduler's directory, which is at the view's
    /// version. A slot no entry holds is left out: the coordinator puts a node in the top-k as
    /// soon as it joins, before the next version's delta brings its entry. (Not a node that
    /// left: the coordinator gives a slot again only after the version announcing its previous
    /// node's departure, [`crate::coordinator::CoordinatorState::remove_node`].)
    fn named_top_k(&self, top_k: &[SlotLoad]) -> Vec<NodeLoad> {
        top_k
            .iter()
            .filter_map(|l| {
                let &i = self.slot_index.get(&l.slot)?;
                Some(NodeLoad {
                    node_id: self.view.directory[i].node_id.clone(),
                    queue_delay_ms: l.queue_delay_ms,
                })
            })
            .collect()
    }

    /// A whole directory in name order, one entry per node: the last one sent (a join answer
    /// appends the joining node's current entry to a directory shared by the version's joins,
    /// which may hold an older entry of it).
    fn in_name_order_last_wins(mut directory: Vec<NodeDirectoryEntry>) -> Vec<NodeDirectoryEntry> {
        let sorted = directory.windows(2).all(|w| w[0].node_id < w[1].node_id);
        if !sorted {
            // Stable: of equal names, the last sent stays last, and is the one kept.
            directory.sort_by(|a, b| a.node_id.cmp(&b.node_id));
            let mut kept: Vec<NodeDirectoryEntry> = Vec::with_capacity(directory.len());
            for entry in directory {
                match kept.last_mut() {
                    Some(last) if last.node_id == entry.node_id => *last = entry,
                    _ => kept.push(entry),
                }
            }
            directory = kept;
        }
        directory
    }

    /// Joined entries replace or extend, left nodes go, and the directory stays in name order as
    /// the coordinator sends it whole; O(directory log directory), once per membership version.
    fn apply_delta(&mut self, joined: Vec<NodeDirectoryEntry>, left: &[NodeId]) {
        {
            let replaced: std::collections::HashSet<&NodeId> = left
                .iter()
                .chain(joined.iter().map(|n| &n.node_id))
                .collect();
            self.view
                .directory
                .retain(|n| !replaced.contains(&n.node_id));
        }
        self.view.directory.extend(joined);
        self.view
            .directory
            .sort_unstable_by(|a, b| a.node_id.cmp(&b.node_id));
        self.reindex_directory();
    }

    fn reindex_directory(&mut self) {
        self.directory_index = self
            .view
            .directory
            .iter()
            .enumerate()
            .map(|(i, n)| (n.node_id.clone(), i))
            .collect();
        self.slot_index = self
            .view
            .directory
            .iter()
            .enumerate()
            .map(|(i, n)| (n.slot, i))
            .collect();
        self.reindex_capacities();
    }

    fn reindex_capacities(&mut self) {
        if let Some(summary) = &self.summary {
            self.capacities = (!summary.largest_capacities.is_empty())
                .then(|| summary.largest_capacities.clone());
            return;
        }
        let mut capacities = Vec::new();
        for n in &self.view.directory {
            if !capacities.contains(&n.capacity) {
                capacities.push(n.capacity);
            }
        }
        self.capacities = Some(capacities);
    }

    /// Add or replace directory entries (protocol 9's `entries`): an entry replaces the one of
    /// the same node and any other holding its slot (whose node left or re-joined under another
    /// slot: the coordinator gives a slot again only after announcing its previous node's
    /// departure, and re-sends a re-joined node's entry). The directory stays in name order.
    fn add_entries(&mut self, entries: Vec<NodeDirectoryEntry>) {
        {
            let names: std::collections::HashSet<&NodeId> =
                entries.iter().map(|n| &n.node_id).collect();
            let slots: std::collections::HashSet<u32> = entries.iter().map(|n| n.slot).collect();
            self.view
                .directory
                .retain(|n| !names.contains(&n.node_id) && !slots.contains(&n.slot));
        }
        self.view.directory.extend(entries);
        self.view.directory =
            Self::in_name_order_last_wins(std::mem::take(&mut self.view.directory));
        self.reindex_directory();
    }

    /// Whether `resources` fit on some node: in one of `capacities` (the directory's, or the
    /// sum's largest), or, with a partial directory, on a node it holds (the sum is the one of
    /// its version, built when first sent in that version, so it may lack a node joined since:
    /// the receiving node's own entry, for one, comes with its join answer).
    fn fits_some_node(&self, resources: &Resources, capacities: &[Resources]) -> bool {
        capacities.iter().any(|c| resources.fits_in(c))
            || (self.directory_is_partial()
                && self
                    .view
                    .directory
                    .iter()
                    .any(|n| resources.fits_in(&n.capacity)))
    }

    /// Whether the directory holds only some of the cluster's nodes (cluster protocol 9: those
    /// this scheduler's views named, and its own).
    pub fn directory_is_partial(&self) -> bool {
        self.summary.is_some()
    }

    /// How many nodes the cluster has: the summary's count, or the whole directory's length.
    pub fn cluster_nodes(&self) -> usize {
        match &self.summary {
            Some(s) => s.nodes as usize,
            None => self.view.directory.len(),
        }
    }

    /// Update only the top-k list. Resets the estimates of own placements and the avoided nodes.
    pub fn update_top_k(&mut self, top_k: Vec<NodeLoad>) {
        // Buffers are refilled in place: a view arrives with every heartbeat acknowledgement.
        self.top_k_index.clear();
        self.top_k_index.extend(
            top_k
                .iter()
                .map(|l| self.directory_index.get(&l.node_id).copied()),
        );
        self.estimated_ms.clear();
        self.estimated_ms
            .extend(top_k.iter().map(|l| l.queue_delay_ms));
        self.avoided.clear();
        self.avoided.resize(top_k.len(), false);
        let estimated = &self.estimated_ms;
        self.order.clear();
        self.order.extend(0..top_k.len());
        self.order
            .sort_unstable_by(|&a, &b| Self::load_order(estimated, a, b));
        self.rank.clear();
        self.rank.resize(top_k.len(), 0);
        for (r, &pos) in self.order.iter().enumerate() {
            self.rank[pos] = r;
        }
        self.view_positions_by_node.clear();
        self.view_positions_by_node.extend(
            self.top_k_index
                .iter()
                .enumerate()
                .filter_map(|(pos, index)| index.map(|i| (i, pos))),
        );
        self.view_positions_by_node.sort_unstable();
        self.view.top_k = top_k;
    }

    /// The order of view positions by estimated R, ties by position (a total order).
    fn load_order(estimated: &[f64], a: usize, b: usize) -> std::cmp::Ordering {
        estimated[a].total_cmp(&estimated[b]).then(a.cmp(&b))
    }

    /// Restore `order` after the estimate of view position `pos` changed.
    fn reposition(&mut self, pos: usize) {
        let (order, rank, estimated) = (&mut self.order, &mut self.rank, &self.estimated_ms);
        let less = |a: usize, b: usize| Self::load_order(estimated, a, b).is_lt();
        let mut r = rank[pos];
        while r + 1 < order.len() && less(order[r + 1], pos) {
            order[r] = order[r + 1];
            rank[order[r]] = r;
            r += 1;
        }
        while r > 0 && less(pos, order[r - 1]) {
            order[r] = order[r - 1];
            rank[order[r]] = r;
            r -= 1;
        }
        order[r] = pos;
        rank[pos] = r;
    }

    /// This scheduler's current estimate of a node's R: the view's value plus its own placements
    /// since; `None` if the node is not in the view.
    pub fn estimated_queue_delay_ms(&self, node_id: &NodeId) -> Option<f64> {
        self.view
            .top_k
            .iter()
            .position(|l| &l.node_id == node_id)
            .map(|pos| self.estimated_ms[pos])
    }

    /// The node shed (or otherwise turned away) QUEUEABLE work this scheduler placed: its R is
    /// above the cluster's threshold whatever the view says, so off-locality placements skip it
    /// until the next view arrives (unless no other candidate fits). Returns whether the node is
    /// in the current view.
    pub fn avoid_until_next_view(&mut self, node_id: &NodeId) -> bool {
        match self.view.top_k.iter().position(|l| &l.node_id == node_id) {
            Some(pos) => {
                self.avoided[pos] = true;
                true
            }
            None => false,
        }
    }

    /// Whether a node is avoided until the next view.
    pub fn is_avoided(&self, node_id: &NodeId) -> bool {
        self.view
            .top_k
            .iter()
            .position(|l| &l.node_id == node_id)
            .is_some_and(|pos| self.avoided[pos])
    }

    /// Place a QUEUEABLE ask. `now_ms` is the wall clock (token expiry); `rng` is seeded by the
    /// caller. Containers that cannot be placed this round are reported as `unplaced`.
    pub fn place<R: Rng + ?Sized>(
        &mut self,
        now_ms: u64,
        ask: &QueueableAsk,
        quota: &QueueableQuota,
        rng: &mut R,
    ) -> Result<PlacementOutcome, PlacementError> {
        if ask.count == 0 || ask.resources.is_zero() {
            return Err(PlacementError::Empty);
        }
        if self.view.directory.is_empty() {
            return Err(PlacementError::NoView);
        }
        if let Some(capacities) = &self.capacities
            && !self.fits_some_node(&ask.resources, capacities)
        {
            let largest = capacities
                .iter()
                .copied()
                .max_by_key(|c| (c.memory_mib, c.cpu_millis))
                .unwrap_or_default();
            return Err(PlacementError::LargerThanAnyNode {
                asked: ask.resources,
                largest,
            });
        }
        let admissible = self.quotas.admissible(&ask.app_id, quota, ask.count);
        if admissible == 0 {
            return Err(PlacementError::QuotaExceeded {
                app: ask.app_id.to_string(),
                outstanding: self
                    .quotas
                    .outstanding(&ask.app_id, ContainerType::Queueable),
            });
        }
        let mut out = PlacementOutcome::default();
        let mut used_off_locality = std::mem::take(&mut self.used_off_locality);
        used_off_locality.reset(self.view.directory.len());
        let expires_at_ms = now_ms.saturating_add(self.config.token_ttl_ms);
        // A claimed submit time far in the past or in the future would let an app jump every queue.
        let job_submit_time_ms =
            crate::time::clamp_job_submit_time_ms(ask.job_submit_time_ms, now_ms);
        let mut drawn = std::mem::take(&mut self.drawn);
        for placed_so_far in 0..admissible {
            let Some((node_index, off_locality)) =
                self.choose_node(ask, &used_off_locality, &mut drawn, rng)
            else {
                break;
            };
            if off_locality {
                used_off_locality.insert(node_index);
            }
            self.account_placement(node_index, ask);
            let entry = &self.view.directory[node_index];
            let (node_id, endpoint) = (entry.node_id.clone(), entry.app_endpoint.clone());
            let container_id = self.minter.next_id();
            self.quotas.on_granted(
                container_id,
                &ask.app_id,
                ContainerType::Queueable,
                expires_at_ms,
            );
            out.placed.push(PlacedContainer {
                container_id,
                node_id: node_id.clone(),
                node_endpoint: endpoint,
                token_body: TokenBody {
                    container_id,
                    node_id,
                    app_id: ask.app_id.clone(),
                    resources: ask.resources,
                    container_type: ContainerType::Queueable,
                    version: 0,
                    job_id: ask.job_id.clone(),
                    job_submit_time_ms,
                    priority: ask.priority,
                    runtime_estimate_ms: ask.runtime_estimate_ms,
                    expires_at_ms,
                    key_id: 0,
                    node_epoch: 0,
                    booking: None,
                    times_returned: ask
                        .replacements
                        .get(placed_so_far as usize)
                        .copied()
                        .unwrap_or(0),
                },
            });
        }
        self.drawn = drawn;
        self.used_off_locality = used_off_locality;
        out.unplaced = ask.count - out.placed.len() as u32;
        if out.unplaced > 0 {
            out.unplaced_reason = Some(
                if admissible < ask.count && out.placed.len() as u32 == admissible {
                    format!("QUEUEABLE quota allows {admissible} more containers now")
                } else if let Some(loc) = ask.locality.as_ref().filter(|l| !l.relax) {
                    if self.locality_outside_view(loc) {
                        format!(
                            "none of the preferred nodes or racks is among the {} least-loaded nodes this scheduler may place QUEUEABLE work on this round (relax is false; a GUARANTEED ask may name any node)",
                            self.view.top_k.len()
                        )
                    } else {
                        "no more preferred nodes or racks can take a container in this round (relax is false)".to_string()
                    }
                } else {
                    "fewer eligible top-k nodes than containers in this round: at most one off-locality container of an ask per node per round".to_string()
                },
            );
        }
        Ok(out)
    }

    /// Add a placed container's expected work (estimate × dominant share, the node runtime's
    /// "whole-node milliseconds" of [`crate::queue_delay::QueueDelay`]) to every view entry of
    /// the node, once for each scheduler that holds the same view (see the module
    /// documentation: peers choose like this one, so this is the work expected to land there).
    fn account_placement(&mut self, node_index: usize, ask: &QueueableAsk) {
        let capacity = self.view.directory[node_index].capacity;
        let peers = self.cluster_nodes().max(1) as f64;
        let work_ms = ask
            .runtime_estimate_ms
            .unwrap_or(DEFAULT_RUNTIME_ESTIMATE_MS) as f64
            * ask.resources.dominant_share(&capacity)
            * peers;
        let first = self
            .view_positions_by_node
            .partition_point(|&(i, _)| i < node_index);
        let mut at = first;
        while let Some(&(i, pos)) = self.view_positions_by_node.get(at) {
            if i != node_index {
                break;
            }
            self.estimated_ms[pos] += work_ms;
            self.reposition(pos);
            at += 1;
        }
    }

    /// Mercury §4.2's pseudo-random choice among the k view entries of least queue delay, by
    /// this scheduler's updated estimate, of the nodes passing `keep`; avoided entries are
    /// skipped unless only they pass. The k (ties by view position; the coordinator already
    /// broke them at random) are drawn from in view order. Returns a directory index.
    fn choose_among_least_loaded<R: Rng + ?Sized>(
        &self,
        keep: impl Fn(usize) -> bool,
        drawn: &mut Vec<usize>,
        rng: &mut R,
    ) -> Option<usize> {
        let k = self.config.top_k.max(1);
        let passes = |pos: usize| self.top_k_index[pos].is_some_and(&keep);
        drawn.clear();
        drawn.extend(
            self.order
                .iter()
                .copied()
                .filter(|&pos| !self.avoided[pos] && passes(pos))
                .take(k),
        );
        if drawn.is_empty() {
            // Every passing entry is avoided (or none passes): choose among them all.
            drawn.extend(
                self.order
                    .iter()
                    .copied()
                    .filter(|&pos| passes(pos))
                    .take(k),
            );
        }
        if drawn.is_empty() {
            return None;
        }
        // Draw in view order (the n-th smallest position), so the choice does not depend on how
        // estimates tie in `order`.
        let nth = rng.random_range(0..drawn.len());
        let (_, &mut pos, _) = drawn.select_nth_unstable(nth);
        self.top_k_index[pos]
    }

    /// Pick a node for one container: preferred nodes (may stack), then preferred racks, then,
    /// if relaxed or unconstrained, a random node among the k of least estimated R. The bool
    /// says whether the choice was off node-locality (and so must not repeat within the ask).
    /// Nodes are directory indices.
    ///
    /// Every pass chooses among the view's nodes only (Mercury §4.2: "choosing amongst the
    /// top-k nodes … while respecting locality constraints"; YARN's distributed allocator
    /// likewise tries node-local, rack-local and off-switch among the nodes the RM sent): those
    /// are the nodes this scheduler holds QUEUEABLE keys for (cluster protocol 6), so a node
    /// outside the view could be chosen but never signed for. A preferred node or rack outside
    /// the view is unavailable this round.
    fn choose_node<R: Rng + ?Sized>(
        &self,
        ask: &QueueableAsk,
        used: &UsedNodes,
        drawn: &mut Vec<usize>,
        rng: &mut R,
    ) -> Option<(usize, bool)> {
        let directory = &self.view.directory;
        let fits = |n: &NodeDirectoryEntry| ask.resources.fits_in(&n.capacity);
        if let Some(loc) = &ask.locality {
            // Node-local: the preferred view node of least estimated queue delay.
            let mut best: Option<(f64, usize)> = None;
            for name in &loc.nodes {
                let Some(&i) = self.directory_index.get(name.as_str()) else {
                    continue;
                };
                let Some(r) = self.view_estimate_of(i) else {
                    continue;
                };
                if fits(&directory[i]) && best.is_none_or(|(b, _)| r < b) {
                    best = Some((r, i));
                }
            }
            if let Some((_, i)) = best {
                return Some((i, false));
            }
            // Rack-local: the k of least estimated R among the view's nodes in those racks; one
            // per node.
            if !loc.racks.is_empty() {
                let in_racks = |n: &NodeDirectoryEntry| loc.racks.iter().any(|r| r == &n.rack);
                if let Some(i) = self.choose_among_least_loaded(
                    |i| in_racks(&directory[i]) && fits(&directory[i]) && !used.contains(i),
                    drawn,
                    rng,
                ) {
                    return Some((i, true));
                }
            }
            if !loc.relax && (!loc.nodes.is_empty() || !loc.racks.is_empty()) {
                return None;
            }
        }
        self.choose_among_least_loaded(|i| fits(&directory[i]) && !used.contains(i), drawn, rng)
            .map(|i| (i, true))
    }

    /// The least estimated R of directory entry `i` among its view positions (a node is
    /// normally in a view once); `None` if it is not in the view.
    fn view_estimate_of(&self, i: usize) -> Option<f64> {
        let first = self.view_positions_by_node.partition_point(|&(j, _)| j < i);
        self.view_positions_by_node[first..]
            .iter()
            .take_while(|&&(j, _)| j == i)
            .map(|&(_, pos)| self.estimated_ms[pos])
            .min_by(f64::total_cmp)
    }

    /// Whether a strict locality names no node and no rack that is in the view (for the
    /// unplaced reason).
    fn locality_outside_view(&self, loc: &Locality) -> bool {
        let directory = &self.view.directory;
        let node_in_view = loc.nodes.iter().any(|name| {
            self.directory_index
                .get(name.as_str())
                .is_some_and(|&i| self.view_estimate_of(i).is_some())
        });
        let rack_in_view = self
            .view_positions_by_node
            .iter()
            .any(|&(i, _)| loc.racks.iter().any(|r| r == &directory[i].rack));
        !node_in_view && !rack_in_view
    }
}

/// A set of directory indices, as marks over the directory plus the list of marked entries, so
/// that membership is one load and clearing costs only what was marked.
#[derive(Clone, Debug, Default)]
struct UsedNodes {
    marks: Vec<bool>,
    marked: Vec<usize>,
}

impl UsedNodes {
    /// Empty the set and size it for a directory of `len` entries.
    fn reset(&mut self, len: usize) {
        for &i in &self.marked {
            self.marks[i] = false;
        }
        self.marked.clear();
        self.marks.resize(len, false);
    }

    fn insert(&mut self, index: usize) {
        if !self.marks[index] {
            self.marks[index] = true;
            self.marked.push(index);
        }
    }

    fn contains(&self, index: usize) -> bool {
        self.marks.get(index).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The summary's capacities are exactly the distinct capacities no other one holds in both
    /// dimensions (checked against the definition on random clusters), so "fits in one of
    /// them" is "fits on some node"; past the cap, none is listed.
    #[test]
    fn a_summary_lists_the_capacities_no_other_node_exceeds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        for round in 0..300 {
            let nodes = 1 + rng.random_range(0..40);
            let capacities: Vec<Resources> = (0..nodes)
                .map(|_| {
                    Resources::new(
                        1000 * rng.random_range(1..8u64),
                        1024 * rng.random_range(1..8u64),
                    )
                })
                .collect();
            let summary = ClusterSummary::of(capacities.iter().copied());
            assert_eq!(summary.nodes as usize, nodes, "round {round}");
            let mut expected: Vec<Resources> = capacities
                .iter()
                .copied()
                .filter(|c| !capacities.iter().any(|o| o != c && c.fits_in(o)))
                .collect();
            expected.sort_unstable_by_key(|c| (c.cpu_millis, c.memory_mib));
            expected.dedup();
            let mut listed = summary.largest_capacities.clone();
            listed.sort_unstable_by_key(|c| (c.cpu_millis, c.memory_mib));
            assert_eq!(listed, expected, "round {round}");
            for _ in 0..20 {
                let ask = Resources::new(rng.random_range(0..9000), rng.random_range(0..9000));
                assert_eq!(
                    listed.iter().any(|c| ask.fits_in(c)),
                    capacities.iter().any(|c| ask.fits_in(c)),
                    "round {round}: {ask}"
                );
            }
        }
        // Anti-correlated capacities: every one is on the front; past the cap none is listed.
        let many =
            (0..=SUMMARY_MAX_CAPACITIES as u64).map(|i| Resources::new(1000 + i, 100_000 - i));
        assert!(ClusterSummary::of(many).largest_capacities.is_empty());
        let enough =
            (0..SUMMARY_MAX_CAPACITIES as u64).map(|i| Resources::new(1000 + i, 100_000 - i));
        assert_eq!(
            ClusterSummary::of(enough).largest_capacities.len(),
            SUMMARY_MAX_CAPACITIES
        );
    }

    fn entry(name: &str, slot: u32, capacity: Resources) -> NodeDirectoryEntry {
        NodeDirectoryEntry {
            node_id: NodeId::new(name.to_string()),
            rack: "r0".to_string(),
            capacity,
            app_endpoint: format!("{name}:7000"),
            slot,
        }
    }

    /// With a partial directory the scheduler takes the cluster's size and largest capacities
    /// from the sum, not from the entries it holds: an ask larger than every node it was sent
    /// but not than some other node is placed as usual (here: unplaced, no view node fits), one
    /// larger than every node of the cluster is refused; entries replace the entry of the same
    /// node or slot.
    #[test]
    fn a_partial_directory_checks_asks_against_the_clusters_sum() {
        let small = Resources::new(1000, 1024);
        let big = Resources::new(8000, 8192);
        let mut ds = DistributedScheduler::new(DistributedSchedulerConfig::default(), 1);
        let update = ds.update_view(ClusterView {
            directory_version: 3,
            directory: vec![entry("own", 0, small)],
            cluster: Some(ClusterSummary::of([small, small, big].into_iter())),
            top_k_slots: vec![SlotLoad {
                slot: 1,
                queue_delay_ms: 0.0,
            }],
            entries: vec![entry("other", 1, small)],
            ..ClusterView::default()
        });
        assert_eq!(update, DirectoryUpdate::Replaced);
        assert!(ds.directory_is_partial());
        assert_eq!(ds.cluster_nodes(), 3);
        assert_eq!(ds.view().directory.len(), 2);
        assert_eq!(ds.view().top_k.len(), 1, "the slot resolves to its entry");
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let ask = |resources| QueueableAsk {
            app_id: "a".into(),
            job_id: "j".into(),
            count: 1,
            resources,
            locality: None,
            priority: 0,
            runtime_estimate_ms: None,
            job_submit_time_ms: 0,
            replacements: Vec::new(),
        };
        let quota = QueueableQuota::default();
        let placed = ds
            .place(0, &ask(Resources::new(4000, 4096)), &quota, &mut rng)
            .expect("fits on the big node elsewhere");
        assert_eq!(placed.unplaced, 1);
        assert!(matches!(
            ds.place(0, &ask(Resources::new(9000, 4096)), &quota, &mut rng),
            Err(PlacementError::LargerThanAnyNode { .. })
        ));
        // The node at slot 1 left and another took the slot; "own" re-joined elsewhere.
        ds.update_view(ClusterView {
            directory_version: 4,
            entries: vec![entry("newcomer", 1, big), entry("own", 5, small)],
            ..ClusterView::default()
        });
        let names: Vec<&str> = ds
            .view()
            .directory
            .iter()
            .map(|e| e.node_id.as_str())
            .collect();
        assert_eq!(names, ["newcomer", "own"]);
        assert_eq!(ds.view().directory[1].slot, 5);
    }
}

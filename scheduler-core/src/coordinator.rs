//! The Mercury coordinator's policies (§4.2, §4.3, §6.3): membership and liveness, aggregation of
//! the nodes' queue-delay estimates into the top-k list, the load-shedding threshold
//! (mean + n·σ), and routing of container notices back to the scheduler that issued them.

use crate::distributed::{
    ClusterSummary, ClusterView, DirectoryDelta, NodeDirectoryEntry, NodeLoad,
};
use crate::liveness::JOIN_ANSWER_LIMIT;
use crate::loss_guard::{LossGuard, LossGuardConfig, Silence};
use crate::node::ContainerStatus;
use crate::queue_delay::QueueDelay;
use crate::quota::AppOutstanding;
use crate::token::{IssuerKeyDeriver, IssuerNodeKey, NodeSessionSecret, TokenKey};
use crate::{ContainerId, NodeId, Time};
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;

/// How the shedding threshold is computed (Mercury §7.2.3 compares none, avg+σ, avg+2σ).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum SheddingPolicy {
    Off,
    /// threshold = mean + n·σ of the nodes' R.
    MeanPlusSigma {
        n: f64,
    },
}

impl std::str::FromStr for SheddingPolicy {
    type Err = String;
    /// `off`/`none`, `avg+sigma`, `avg+2sigma`, or `mean+N*sigma`.
    fn from_str(s: &str) -> Result<Self, String> {
        let l = s.trim().to_ascii_lowercase().replace(['σ'], "sigma");
        match l.as_str() {
            "off" | "none" => Ok(SheddingPolicy::Off),
            "avg+sigma" | "mean+sigma" => Ok(SheddingPolicy::MeanPlusSigma { n: 1.0 }),
            "avg+2sigma" | "mean+2sigma" => Ok(SheddingPolicy::MeanPlusSigma { n: 2.0 }),
            other => other
                .strip_prefix("mean+")
                .or_else(|| other.strip_prefix("avg+"))
                .and_then(|r| r.strip_suffix("*sigma"))
                .and_then(|n| n.parse::<f64>().ok())
                .filter(|n| *n >= 0.0)
                .map(|n| SheddingPolicy::MeanPlusSigma { n })
                .ok_or_else(|| format!("unknown shedding policy {s:?}: expected off, avg+sigma, avg+2sigma or mean+N*sigma")),
        }
    }
}

/// Directory versions the coordinator keeps the changes of (issue 17): a worker whose version is
/// among them is sent the changes since, an older one the whole directory. A live worker
/// heartbeats every round and versions advance at most once per round, so a worker is normally
/// one version behind; 16 rounds covers a worker silent for longer than the default node timeout
/// (10 heartbeats of 1 s), past which it is declared lost and re-joins anyway.
pub const DIRECTORY_LOG_VERSIONS: usize = 16;

/// Coordinator settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorConfig {
    /// Length of the top-k list sent to distributed schedulers (Mercury's best: 50).
    pub top_k: usize,
    pub shedding: SheddingPolicy,
    /// A threshold below this is raised to it, so tiny queues on an idle cluster are not shed
    /// (YARN clamps its queue-wait threshold for the same reason).
    pub min_shedding_threshold_ms: f64,
    /// A node silent for this long is declared lost.
    pub node_timeout: Duration,
    /// At most this many nodes new to a scheduler (their directory entries and QUEUEABLE keys)
    /// in one heartbeat answer, the least loaded first ([`CoordinatorState::node_view`]; a join
    /// answer is not capped). Set to the schedulers' k: the view's k least-loaded nodes, the
    /// ones a scheduler chooses among, are then always held after an answer, and only the
    /// view's further candidates may come in later answers. Without it an answer carries up
    /// to the whole view (4k) of new nodes whenever the list turns over (issue 17: ~97 per
    /// answer at 10,000 nodes, most of an answer's bytes).
    #[serde(default = "default_new_nodes_per_answer")]
    pub new_nodes_per_answer: usize,
    /// When a node's silence is not held against it: the coordinator's own pauses and mass
    /// silence ([`crate::loss_guard`]).
    #[serde(default)]
    pub loss_guard: LossGuardConfig,
}

fn default_new_nodes_per_answer() -> usize {
    50
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            top_k: 50,
            shedding: SheddingPolicy::MeanPlusSigma { n: 1.0 },
            min_shedding_threshold_ms: 100.0,
            node_timeout: Duration::from_secs(10),
            new_nodes_per_answer: default_new_nodes_per_answer(),
            loss_guard: LossGuardConfig::default(),
        }
    }
}

/// A container notice routed to the scheduler that issued the container.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerNotice {
    pub container_id: ContainerId,
    pub node_id: NodeId,
    pub kind: NoticeKind,
}

/// What happened, for the issuer's accounting and the application's events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NoticeKind {
    /// The node accepted it (queued or running).
    Started,
    /// It ended on the node (completed, killed, released, failed).
    Finished,
    /// Its node was lost.
    Lost,
}

#[derive(Clone, Debug)]
struct NodeEntry {
    dir: NodeDirectoryEntry,
    issuer: u32,
    load: QueueDelay,
    last_seen: Time,
    /// Containers the node last reported holding.
    containers: Vec<ContainerId>,
    /// What its scheduler last reported having issued, per app (for cluster-wide quotas).
    issued: Vec<AppOutstanding>,
    /// Containers its join listed that had been reported lost: the node kills them, and until
    /// its reports stop listing them they are not taken as running.
    killing_lost: HashSet<ContainerId>,
    /// The session's secret for QUEUEABLE tokens (`None` without a token master key).
    secret: Option<NodeSessionSecret>,
    /// The same secret keyed once for deriving issuers' keys (a node's scheduler is sent one
    /// for this session when this node enters the top-k it is sent, see
    /// [`CoordinatorState::node_view`]).
    issuer_keys: Option<IssuerKeyDeriver>,
    /// The node slots ([`NodeEntry::slot`]) whose node's current session's QUEUEABLE key (with
    /// a token master key) and directory entry (cluster protocol 9) this node's scheduler has
    /// been sent in this session: a subset of the keys and entries it holds (a slot's
    /// mark is cleared in every node's set when the slot gets a new session, so the key is
    /// sent again). One bit per slot, so a scheduler is sent each node's key once however
    /// often that node enters and leaves the top-k, for O(nodes) bits per node.
    keys_held: SlotSet,
    /// The [`CoordinatorState::top_k_generation`] this node's scheduler was last sent the keys
    /// of every top-k node at: until the list changes, nothing is checked again. Not set by an
    /// answer that [`CoordinatorConfig::new_nodes_per_answer`] cut short.
    keys_at_generation: Option<u64>,
    /// Joined, no heartbeat yet, and its session still open: the node is still receiving its
    /// join answer (O(nodes) bytes, slow during a join storm) and cannot heartbeat before it has
    /// it, so its silence is measured against [`JOIN_ANSWER_LIMIT`] rather than the node
    /// timeout ([`CoordinatorState::silent_nodes`]).
    receiving_join_answer: bool,
}

/// A set of node slots as bits.
#[derive(Clone, Debug, Default)]
struct SlotSet(Vec<u64>);

impl SlotSet {
    fn contains(&self, slot: u32) -> bool {
        self.0
            .get(slot as usize / 64)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }

    fn insert(&mut self, slot: u32) {
        let i = slot as usize / 64;
        if i >= self.0.len() {
            self.0.resize(i + 1, 0);
        }
        self.0[i] |= 1 << (slot % 64);
    }

    fn remove(&mut self, slot: u32) {
        if let Some(w) = self.0.get_mut(slot as usize / 64) {
            *w &= !(1 << (slot % 64));
        }
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// What the coordinator aggregates once per round (Mercury §4.2: the top-k list, §4.3: the
/// shedding threshold) from the nodes' latest estimates, and sends with every heartbeat answer
/// until the next round. A round lasts one heartbeat interval, so each heartbeat costs O(k), not
/// O(nodes) (the simulator runs the same aggregation once per round).
///
/// Staleness is bounded by one round, as in Mercury §4.2, where the coordinator propagates the
/// aggregated queue-delay view to the schedulers periodically and they place against a view up
/// to one period old (YARN's opportunistic containers do the same: the top-k list is refreshed
/// on a timer, `../shared/notes/yarn-opportunistic-reference.md`). Membership changes do not
/// force a recomputation (issue 17: during a join storm of 10,000 nodes that made every
/// heartbeat O(nodes)); they patch the cached list in O(k) instead: a joining node, which has
/// no queue yet, is put first (it must not wait a round to be offered work), and a removed node
/// is taken out at once. The threshold and the per-app totals wait for the next round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AggregateRound {
    pub top_k: Vec<NodeLoad>,
    pub shedding_threshold_ms: Option<f64>,
    /// The round's outliers and the target each is sent
    /// ([`AggregateRound::shedding_target_for`], [`CoordinatorState::shedding_round`]).
    pub shedding_targets: HashMap<NodeId, f64>,
    /// Outstanding containers per app summed over every issuer (Mercury §4.1 quotas held
    /// cluster-wide): each issuer is sent these minus its own.
    pub outstanding_totals: BTreeMap<crate::AppId, (u32, u32)>,
    /// The slot of each `top_k` entry's node, in the same order: which keys a scheduler needs
    /// for this list, without a directory lookup per entry, and how the list goes on the wire
    /// ([`AggregateRound::top_k_on_wire`]).
    top_k_slots: Vec<u32>,
    /// The key deriver of each `top_k` entry's node session, in the same order: the keys a
    /// scheduler is sent for this list are derived without a directory lookup per entry per
    /// heartbeat (issue 17: those lookups, string comparisons down the node map, were the
    /// largest single cost of a heartbeat answer while schedulers were still being sent keys).
    /// Kept in step with membership by [`CoordinatorState::patch_round_top_k`].
    top_k_derivers: Vec<RoundDeriver>,
    /// The directory entry of each `top_k` entry's node, in the same order, for the schedulers
    /// that lack it (cluster protocol 9), without a lookup in the node map per entry per answer.
    /// Kept in step with membership as the derivers are.
    top_k_entries: Vec<std::sync::Arc<NodeDirectoryEntry>>,
    /// When it was computed.
    at: Option<Time>,
}

/// A round's copy of a top-k node's key deriver (`None` without a token master key). Equal when
/// they are for the same node session (the deriver's secret is not comparable).
#[derive(Clone, Debug, Default)]
struct RoundDeriver(Option<IssuerKeyDeriver>);

impl PartialEq for RoundDeriver {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => a.session() == b.session(),
            (None, None) => true,
            _ => false,
        }
    }
}

/// How long `n` may be silent before it is lost ([`CoordinatorState::silent_nodes`]).
fn silence_limit(config: &CoordinatorConfig, n: &NodeEntry) -> Duration {
    if n.receiving_join_answer {
        config.node_timeout.max(JOIN_ANSWER_LIMIT)
    } else {
        config.node_timeout
    }
}

/// The coordinator's aggregate view.
#[derive(Clone, Debug)]
pub struct CoordinatorState {
    config: CoordinatorConfig,
    nodes: BTreeMap<NodeId, NodeEntry>,
    /// The published membership version: bumped at most once per round (see
    /// [`CoordinatorState::round`]), when nodes joined or left since the last one. Starts at 1;
    /// a worker reporting 0 knows no directory.
    directory_version: u64,
    /// Nodes that joined, re-joined or left since the last published version.
    directory_pending: BTreeSet<NodeId>,
    /// Bumped at every membership change, published or not: the membership an answer carries
    /// (made of the nodes' current entries) is the same for equal (version, changes).
    membership_changes: u64,
    /// The nodes changed in each of the last [`DIRECTORY_LOG_VERSIONS`] published versions,
    /// oldest first: what a delta since a recent version is made of.
    directory_log: VecDeque<(u64, Vec<NodeId>)>,
    next_issuer: u32,
    /// Notices waiting for their issuer's next heartbeat, by issuer. Only issuers of joined
    /// nodes have a queue, and each is drained on its node's every heartbeat; a node silent past
    /// the node timeout is removed with its queue, so the outbox is bounded by the notice rate
    /// times the node timeout.
    outbox: HashMap<u32, Vec<ContainerNotice>>,
    /// Issuer prefixes of the joined nodes' current sessions.
    live_issuers: HashSet<u32>,
    round: AggregateRound,
    /// Bumped whenever the round's top-k may have changed (recomputed or patched), so a caller
    /// can encode the list once and share it until it changes ([`CoordinatorState::top_k_generation`]).
    top_k_generation: u64,
    /// Nodes declared lost (their containers reported `lost`) that have not re-joined and
    /// reported without those containers since. Persisted by the caller
    /// ([`CoordinatorState::take_lost_nodes_if_changed`]) so a restart does not forget them.
    lost_nodes: BTreeSet<NodeId>,
    lost_nodes_changed: bool,
    /// Losses declared while the caller could not store the lost-node set, with why each node
    /// was lost ([`CoordinatorState::hold_losses`]): announced only once stored. Bounded by the
    /// nodes of the cluster.
    held_losses: Vec<(NodeId, String)>,
    /// Their `lost` notices, taken back from the issuers' queues until then (one per container
    /// of those nodes).
    held_loss_notices: Vec<ContainerNotice>,
    /// The master key node session secrets are derived from at each join (issue 11: per-issuer
    /// QUEUEABLE keys, see [`crate::token`]). The simulator runs without one.
    token_master: Option<TokenKey>,
    /// Nodes an operator is draining: left out of top-k, so no scheduler sends them new
    /// QUEUEABLE work (the guarantor keeps GUARANTEED work off them).
    draining: BTreeSet<NodeId>,
    /// Slots of nodes that left, to be taken by the next new nodes ([`NodeDirectoryEntry::slot`]).
    free_slots: Vec<u32>,
    /// Slots of nodes that left since the last published version: free at the next one.
    slots_leaving: Vec<u32>,
    /// The slots in use or freed are below this.
    next_slot: u32,
    /// Whether silent nodes are declared lost now ([`CoordinatorState::losses_due`]).
    loss_guard: LossGuard,
    /// Nodes silent past the timeout whose declaration the guard holds (bounded by the nodes).
    losses_guarded: BTreeSet<NodeId>,
}

/// What a silence check decided ([`CoordinatorState::losses_due`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LossesDue {
    /// Declare these lost now (longest silent first).
    pub declare: Vec<NodeId>,
    /// Silent past the timeout, their declaration held by the guard from this check on: keep
    /// new GUARANTEED work off them.
    pub newly_held: Vec<NodeId>,
    /// Held at the previous check and heard from again since: open them to new work again.
    pub heard_again: Vec<NodeId>,
    /// All nodes whose declaration the guard holds now.
    pub held: usize,
    /// How the cluster's silence looked.
    pub silence: Silence,
    /// How long the coordinator was not listening before this check (taken off every node's
    /// silence).
    pub deaf_for: Duration,
}

/// A view for one node's scheduler, with the QUEUEABLE keys it needs for the view's top-k.
///
/// A scheduler places QUEUEABLE containers only on nodes of the top-k it is sent (Mercury §4.2),
/// so it needs keys for those nodes only (cluster protocol 6, issue 17): each answer carries the
/// keys of the top-k nodes whose current session's key the scheduler was not sent yet, so a key
/// arrives with (or before) the first list naming its node. Before, every node got a key for
/// every node (O(nodes) HMACs per join, and one per joined node in every delta), which made a
/// join storm O(nodes²) keys.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    /// With `entries`: the directory entries of the same top-k nodes as the keys (sent once
    /// each per session, as the keys are, with or without a token master key).
    pub view: ClusterView,
    /// With the whole directory: the scheduler's keys for the round's top-k nodes, replacing
    /// its old ones. With a delta: keys to add or replace (a re-joined node's new session
    /// replaces the old key), while the delta's left nodes' keys are dropped by the scheduler.
    /// Without membership: keys to add or replace, `None` when there are none.
    pub issuer_keys: Option<Vec<IssuerNodeKey>>,
}

/// What membership a scheduler at some directory version is sent
/// ([`CoordinatorState::node_view_parts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MembershipSent {
    /// None: its directory is current.
    Nothing,
    /// The whole directory.
    Whole,
    /// The changes since `from_version`.
    DeltaFrom(u64),
}

/// What a scheduler at some directory version needs to reach the published one.
enum DirectorySince<'a> {
    Current,
    Whole,
    /// The nodes changed since, sorted and distinct.
    Changed(Vec<&'a NodeId>),
}

/// A join's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joined {
    /// The id prefix of the node's new session (fresh at every join).
    pub issuer: u32,
    /// Containers the join listed that the node must kill: it had been declared lost, so they
    /// were reported `lost` to their apps (lost means gone). Sorted.
    pub lost_containers: Vec<ContainerId>,
    /// The new session's secret for checking QUEUEABLE tokens (only with a token master key).
    pub node_secret: Option<NodeSessionSecret>,
}

impl CoordinatorState {
    /// `first_issuer` lets a restarted coordinator continue after ids it handed out before.
    pub fn new(config: CoordinatorConfig, first_issuer: u32) -> CoordinatorState {
        CoordinatorState {
            config,
            nodes: BTreeMap::new(),
            directory_version: 1,
            directory_pending: BTreeSet::new(),
            membership_changes: 0,
            directory_log: VecDeque::new(),
            next_issuer: first_issuer.max(1),
            outbox: HashMap::new(),
            live_issuers: HashSet::new(),
            round: AggregateRound::default(),
            top_k_generation: 0,
            lost_nodes: BTreeSet::new(),
            lost_nodes_changed: false,
            held_losses: Vec::new(),
            held_loss_notices: Vec::new(),
            token_master: None,
            draining: BTreeSet::new(),
            free_slots: Vec::new(),
            slots_leaving: Vec::new(),
            next_slot: 0,
            loss_guard: LossGuard::new(),
            losses_guarded: BTreeSet::new(),
        }
    }

    /// Sessions joining from now on derive their QUEUEABLE secrets from `master` (at start, and
    /// after each rotation; sessions already joined keep theirs until they re-join).
    /// Malformed key material is refused (and the previous master kept).
    pub fn set_token_master(&mut self, master: TokenKey) -> Result<(), crate::token::TokenError> {
        NodeSessionSecret::derive(&master, &NodeId::from("probe"), 0)?;
        self.token_master = Some(master);
        Ok(())
    }

    /// Resume with the nodes a previous incarnation declared lost (from the caller's store).
    pub fn with_lost_nodes(mut self, lost: BTreeSet<NodeId>) -> CoordinatorState {
        self.lost_nodes = lost;
        self
    }

    /// Whether `node` was declared lost and has not come back whole since.
    pub fn is_lost(&self, node: &NodeId) -> bool {
        self.lost_nodes.contains(node)
    }

    /// The lost-node set, if it changed since the last call (for the caller to persist).
    pub fn take_lost_nodes_if_changed(&mut self) -> Option<&BTreeSet<NodeId>> {
        std::mem::take(&mut self.lost_nodes_changed).then_some(&self.lost_nodes)
    }

    /// Whether the lost-node set changed since it was last taken (the caller has a write due).
    pub fn lost_nodes_changed(&self) -> bool {
        self.lost_nodes_changed
    }

    /// The caller could not save the set taken last: it is offered again at the next call.
    pub fn lost_nodes_not_saved(&mut self) {
        self.lost_nodes_changed = true;
    }

    /// A node joins with the containers it still holds. A node that had been declared lost must
    /// kill all of them ([`Joined::lost_containers`]) and they are not adopted; otherwise they
    /// are its containers as of now. Returns the session's issuer as [`CoordinatorState::join`].
    pub fn join_with(
        &mut self,
        now: Time,
        dir: NodeDirectoryEntry,
        containers: &[ContainerStatus],
    ) -> Joined {
        let node = dir.node_id.clone();
        let was_lost = self.lost_nodes.contains(&node);
        let issuer = self.join(now, dir);
        let entry = self.nodes.get_mut(&node).expect("just joined");
        let mut lost_containers = Vec::new();
        if was_lost {
            lost_containers = containers.iter().map(|c| c.id).collect();
            lost_containers.sort_unstable();
            entry.killing_lost = lost_containers.iter().copied().collect();
        } else {
            entry.containers = containers.iter().map(|c| c.id).collect();
        }
        Joined {
            issuer,
            lost_containers,
            node_secret: entry.secret.clone(),
        }
    }

    /// Take out of a heartbeat's report the containers its node was told to kill at its join (a
    /// heartbeat sent before the worker acted may still list them). Once a report lists none of
    /// them the node is whole again and no longer counts as lost.
    pub fn screen_report(
        &mut self,
        node: &NodeId,
        containers: &mut Vec<ContainerStatus>,
        started: &mut Vec<ContainerId>,
    ) {
        let Some(entry) = self.nodes.get_mut(node) else {
            return;
        };
        if entry.killing_lost.is_empty() {
            return;
        }
        let killing = &entry.killing_lost;
        let before = containers.len();
        containers.retain(|c| !killing.contains(&c.id));
        started.retain(|id| !killing.contains(id));
        if containers.len() == before {
            entry.killing_lost.clear();
            if self.lost_nodes.remove(node) {
                self.lost_nodes_changed = true;
            }
        }
    }

    /// A silent node is lost: removed, its containers reported `Lost` to their issuers, and
    /// remembered as lost until it re-joins and reports without them.
    pub fn declare_lost(&mut self, node: &NodeId) -> Vec<ContainerId> {
        if self.lost_nodes.insert(node.clone()) {
            self.lost_nodes_changed = true;
        }
        self.remove_node(node)
    }

    /// The current round's aggregate: recomputed (O(nodes)) when the last one is `interval`
    /// old, otherwise the cached one (patched by joins and removals, see [`AggregateRound`]).
    pub fn round<R: Rng + ?Sized>(
        &mut self,
        now: Time,
        interval: Duration,
        rng: &mut R,
    ) -> &AggregateRound {
        let fresh = self
            .round
            .at
            .is_some_and(|at| now.saturating_since(at) < interval);
        if !fresh {
            self.publish_directory();
            let mut outstanding_totals: BTreeMap<crate::AppId, (u32, u32)> = BTreeMap::new();
            for a in self.nodes.values().flat_map(|n| &n.issued) {
                let t = outstanding_totals.entry(a.app_id.clone()).or_default();
                t.0 = t.0.saturating_add(a.queueable);
                t.1 = t.1.saturating_add(a.guaranteed);
            }
            let shedding = self.shedding_round();
            // The list is made of joined nodes, so every entry has a slot; pairing them here
            // keeps the two lists in step without a placeholder slot.
            let listed = self.top_k(now, rng);
            let mut top_k = Vec::with_capacity(listed.len());
            let mut top_k_slots = Vec::with_capacity(listed.len());
            let mut top_k_derivers = Vec::with_capacity(listed.len());
            let mut top_k_entries = Vec::with_capacity(listed.len());
            for l in listed {
                if let Some(n) = self.nodes.get(&l.node_id) {
                    top_k_slots.push(n.dir.slot);
                    top_k_derivers.push(RoundDeriver(n.issuer_keys.clone()));
                    top_k_entries.push(std::sync::Arc::new(n.dir.clone()));
                    top_k.push(l);
                }
            }
            self.round = AggregateRound {
                top_k,
                shedding_threshold_ms: shedding.threshold_ms,
                shedding_targets: shedding.targets,
                outstanding_totals,
                top_k_slots,
                top_k_derivers,
                top_k_entries,
                at: Some(now),
            };
            self.top_k_generation += 1;
        }
        &self.round
    }

    /// Changes whenever the round's top-k may have (a new round, or a join or removal patching
    /// it): the live coordinator encodes the list once per generation and shares the bytes among
    /// the round's heartbeat answers (issue 17).
    pub fn top_k_generation(&self) -> u64 {
        self.top_k_generation
    }

    /// The aggregate last computed by [`CoordinatorState::round`] (call that first in each
    /// heartbeat). Borrow it rather than clone it per heartbeat: its shedding targets hold one
    /// entry per outlier node, so a clone per heartbeat is O(nodes) work per node per round.
    pub fn aggregate_round(&self) -> &AggregateRound {
        &self.round
    }

    /// Publish the membership changes since the last version as one new version (at most once
    /// per round: a join storm of N nodes in a round is one version, not N; Mercury §4.2 bounds
    /// the staleness of the cluster view by one round). Keeps the last
    /// [`DIRECTORY_LOG_VERSIONS`] versions' changes.
    fn publish_directory(&mut self) {
        // This version announces the departures of the nodes these slots were of.
        self.free_slots.append(&mut self.slots_leaving);
        if self.directory_pending.is_empty() {
            return;
        }
        self.directory_version += 1;
        let changed = std::mem::take(&mut self.directory_pending);
        self.directory_log
            .push_back((self.directory_version, changed.into_iter().collect()));
        while self.directory_log.len() > DIRECTORY_LOG_VERSIONS {
            self.directory_log.pop_front();
        }
    }

    /// Versions whose changes are kept, oldest first (observability and tests).
    pub fn directory_log_versions(&self) -> impl Iterator<Item = u64> + '_ {
        self.directory_log.iter().map(|(v, _)| *v)
    }

    /// Membership changes not yet published (they are at the next round).
    pub fn directory_changes_pending(&self) -> usize {
        self.directory_pending.len()
    }

    fn directory_since(&self, known_version: u64) -> DirectorySince<'_> {
        match self.membership_sent(known_version) {
            MembershipSent::Nothing => return DirectorySince::Current,
            MembershipSent::Whole => return DirectorySince::Whole,
            MembershipSent::DeltaFrom(_) => {}
        }
        let mut changed: Vec<&NodeId> = self
            .directory_log
            .iter()
            .filter(|(v, _)| *v > known_version)
            .flat_map(|(_, nodes)| nodes)
            .collect();
        changed.sort_unstable();
        changed.dedup();
        DirectorySince::Changed(changed)
    }

    /// The view for a scheduler whose directory is at `known_version`, with this round's top-k:
    /// nothing about membership when it is current, the changes since when the version is among
    /// the kept ones, else the whole directory. Entries are the nodes' current ones, so changes
    /// not yet published may show early; the next version's delta lists them again (see
    /// [`DirectoryDelta`]: a delta applies to any version between its ends).
    pub fn view_with(&self, known_version: u64, top_k: Vec<NodeLoad>) -> ClusterView {
        let mut view = ClusterView {
            directory_version: self.directory_version,
            directory: Vec::new(),
            delta: None,
            top_k,
            ..ClusterView::default()
        };
        match self.directory_since(known_version) {
            DirectorySince::Current => {}
            DirectorySince::Whole => {
                view.directory = self.nodes.values().map(|n| n.dir.clone()).collect();
            }
            DirectorySince::Changed(changed) => {
                let mut delta = DirectoryDelta {
                    from_version: known_version,
                    joined: Vec::new(),
                    left: Vec::new(),
                };
                for node in changed {
                    match self.nodes.get(node) {
                        Some(n) => delta.joined.push(n.dir.clone()),
                        None => delta.left.push(node.clone()),
                    }
                }
                view.delta = Some(delta);
            }
        }
        view
    }

    /// [`CoordinatorState::view_with`] for `node`'s scheduler, with the QUEUEABLE keys it lacks
    /// for the round's top-k (see [`NodeView`]; issuer `I` = `node`'s session, for each top-k
    /// node `N` whose current session's key it was not sent: `HMAC(K_N, I)`). O(k) when the
    /// top-k changed since the node's last answer, O(1) otherwise, plus one HMAC per key sent.
    /// Without a token master key, or for a node that is not joined, no keys are sent. Every
    /// answer computed must reach the scheduler in order (one stream per session; a re-join
    /// starts over), since the coordinator counts the keys it sent as held.
    pub fn node_view(
        &mut self,
        node: &NodeId,
        known_version: u64,
        top_k: Vec<NodeLoad>,
    ) -> NodeView {
        let (mut parts, sent) = self.node_view_parts(node, known_version, top_k);
        if sent != MembershipSent::Nothing {
            let membership = self.wire_membership(known_version);
            parts.view.directory = membership.directory;
            parts.view.delta = membership.delta;
            parts.view.cluster = membership.cluster;
            if sent == MembershipSent::Whole
                && let Some(own) = self.nodes.get(node)
            {
                parts.view.directory.push(own.dir.clone());
            }
        }
        parts
    }

    /// The membership part of a view as cluster protocol 9 sends it to a scheduler whose
    /// directory is at `known_version` (see [`ClusterView`]: partial directories): nothing when
    /// it is current; else the cluster's sum, with the nodes that left since
    /// `known_version` as a delta when that version is among the kept ones (a re-joined node's
    /// entry is replaced when its new session's key is sent), or, for a whole
    /// directory, no entry (the caller adds the receiving node's own). The entries of a
    /// scheduler's view nodes go with their keys ([`CoordinatorState::node_view_parts`]).
    /// The same for every scheduler at that version while
    /// [`CoordinatorState::membership_identity`] is unchanged. O(nodes) for the sum.
    pub fn wire_membership(&self, known_version: u64) -> ClusterView {
        let mut view = ClusterView {
            directory_version: self.directory_version,
            ..ClusterView::default()
        };
        let changed = match self.directory_since(known_version) {
            DirectorySince::Current => return view,
            DirectorySince::Whole => None,
            DirectorySince::Changed(changed) => Some(changed),
        };
        if let Some(changed) = changed {
            // Only departures: a node that joined or re-joined since gets its (new) entry to
            // each scheduler with its key, in the first answer whose view names it, perhaps
            // before this version; naming it here would have the scheduler drop that entry.
            view.delta = Some(DirectoryDelta {
                from_version: known_version,
                joined: Vec::new(),
                left: changed
                    .into_iter()
                    .filter(|node| !self.nodes.contains_key(*node))
                    .cloned()
                    .collect(),
            });
        }
        view.cluster = Some(ClusterSummary::of(
            self.nodes.values().map(|n| n.dir.capacity),
        ));
        view
    }

    /// What membership a scheduler whose directory is at `known_version` is sent: nothing when
    /// it is current, the changes since when the version is among the kept ones, else the whole
    /// directory. O(1): what is sent is the same for every scheduler at that version while
    /// [`CoordinatorState::membership_identity`] is unchanged, so the caller can build and
    /// encode it once ([`crate::protocol::cluster::EncodedMembership`]).
    pub fn membership_sent(&self, known_version: u64) -> MembershipSent {
        if known_version == self.directory_version {
            return MembershipSent::Nothing;
        }
        let covered = self
            .directory_log
            .front()
            .is_some_and(|(oldest, _)| known_version + 1 >= *oldest);
        if known_version == 0 || known_version > self.directory_version || !covered {
            MembershipSent::Whole
        } else {
            MembershipSent::DeltaFrom(known_version)
        }
    }

    /// [`CoordinatorState::node_view`] without the membership itself: the view's directory
    /// and delta are left empty, and what they would hold is returned instead (the caller takes
    /// it from [`CoordinatorState::view_with`], or shares one encoding of it among the answers
    /// at the same version). The keys are as `node_view` sends them.
    pub fn node_view_parts(
        &mut self,
        node: &NodeId,
        known_version: u64,
        top_k: Vec<NodeLoad>,
    ) -> (NodeView, MembershipSent) {
        let sent = self.membership_sent(known_version);
        let view = ClusterView {
            directory_version: self.directory_version,
            directory: Vec::new(),
            delta: None,
            top_k,
            ..ClusterView::default()
        };
        (self.node_view_keys(node, view, sent), sent)
    }

    fn node_view_keys(
        &mut self,
        node: &NodeId,
        mut view: ClusterView,
        sent: MembershipSent,
    ) -> NodeView {
        let whole = sent == MembershipSent::Whole;
        let signing = self.token_master.is_some();
        let Some(me) = self.nodes.get_mut(node) else {
            return NodeView {
                view,
                issuer_keys: None,
            };
        };
        let generation = self.top_k_generation;
        let check = whole || me.keys_at_generation != Some(generation);
        if whole {
            // The scheduler replaces its keys, and its directory but for its own entry, with
            // these.
            me.keys_held.clear();
        }
        let issuer = me.issuer;
        // Taken out while other nodes' entries are read.
        let mut held = std::mem::take(&mut me.keys_held);
        let mut keys = Vec::new();
        // A whole directory (a join answer or a reset) starts the scheduler's view: uncapped.
        let cap = if whole {
            usize::MAX
        } else {
            self.config.new_nodes_per_answer
        };
        let mut complete = true;
        if check {
            let round = &self.round;
            for ((&slot, deriver), entry) in round
                .top_k_slots
                .iter()
                .zip(&round.top_k_derivers)
                .zip(&round.top_k_entries)
            {
                if held.contains(slot) {
                    continue;
                }
                if view.entries.len() >= cap {
                    // The rest of the list (more loaded) comes with the next answers while it
                    // is still in the list: check again at the same generation.
                    complete = false;
                    break;
                }
                if signing {
                    // A node without a deriver (its secret could not be derived) is never
                    // signed for: its entry would be of no use either.
                    let Some(deriver) = &deriver.0 else {
                        continue;
                    };
                    keys.push(deriver.issuer_key(issuer));
                }
                view.entries.push(NodeDirectoryEntry::clone(entry));
                held.insert(slot);
            }
        }
        if let Some(me) = self.nodes.get_mut(node) {
            me.keys_held = held;
            if complete {
                me.keys_at_generation = Some(generation);
            }
        }
        let issuer_keys =
            (signing && (sent != MembershipSent::Nothing || !keys.is_empty())).then_some(keys);
        NodeView { view, issuer_keys }
    }

    /// The QUEUEABLE key `issuer`'s scheduler uses for `node`'s current session (what
    /// [`CoordinatorState::node_view`] sends; tests and tools). `None` without a token master
    /// key or for a node that is not joined.
    pub fn issuer_key_for(&self, issuer: u32, node: &NodeId) -> Option<IssuerNodeKey> {
        self.token_master.as_ref()?;
        Some(
            self.nodes
                .get(node)?
                .issuer_keys
                .as_ref()?
                .issuer_key(issuer),
        )
    }

    /// What `node`'s scheduler has issued per app, as it reports with its heartbeats (the
    /// caller bounds the list: one entry per registered app at most).
    pub fn report_issued(&mut self, node: &NodeId, issued: Vec<AppOutstanding>) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.issued = issued;
        }
    }

    /// What every other issuer holds per app, as of `round` (cluster-wide quotas): the round's
    /// totals minus `node`'s own report. Only apps with something outstanding elsewhere.
    pub fn outstanding_elsewhere(
        &self,
        node: &NodeId,
        round: &AggregateRound,
    ) -> Vec<AppOutstanding> {
        let own = self
            .nodes
            .get(node)
            .map(|n| n.issued.as_slice())
            .unwrap_or(&[]);
        round
            .outstanding_totals
            .iter()
            .filter_map(|(app, &(q, g))| {
                let mine = own.iter().find(|a| &a.app_id == app);
                let queueable = q.saturating_sub(mine.map_or(0, |a| a.queueable));
                let guaranteed = g.saturating_sub(mine.map_or(0, |a| a.guaranteed));
                (queueable > 0 || guaranteed > 0).then(|| AppOutstanding {
                    app_id: app.clone(),
                    queueable,
                    guaranteed,
                })
            })
            .collect()
    }

    /// A joined node's directory entry (capacity, endpoint), by name in O(log n).
    pub fn node(&self, node: &NodeId) -> Option<&NodeDirectoryEntry> {
        self.nodes.get(node).map(|n| &n.dir)
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    pub fn config_mut(&mut self) -> &mut CoordinatorConfig {
        &mut self.config
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeDirectoryEntry> {
        self.nodes.values().map(|n| &n.dir)
    }

    /// Each joined node with its queue-delay estimate and when it was last heard from, in name
    /// order (for operators' views: the dashboard).
    pub fn node_loads(&self) -> impl Iterator<Item = (&NodeDirectoryEntry, QueueDelay, Time)> {
        self.nodes.values().map(|n| (&n.dir, n.load, n.last_seen))
    }

    /// Start or end draining `node` (see the field); the next round recomputes top-k. Returns
    /// whether anything changed.
    pub fn set_draining(&mut self, node: &NodeId, draining: bool) -> bool {
        let changed = if draining {
            self.draining.insert(node.clone())
        } else {
            self.draining.remove(node)
        };
        if changed {
            self.round.at = None;
        }
        changed
    }

    /// The next [`CoordinatorState::round`] recomputes (after a settings change).
    pub fn invalidate_round(&mut self) {
        self.round.at = None;
    }

    pub fn is_draining(&self, node: &NodeId) -> bool {
        self.draining.contains(node)
    }

    /// Nodes an operator is draining (joined or not).
    pub fn draining_nodes(&self) -> &BTreeSet<NodeId> {
        &self.draining
    }

    /// Nodes declared lost that have not re-joined since.
    pub fn lost_nodes(&self) -> &BTreeSet<NodeId> {
        &self.lost_nodes
    }

    pub fn next_issuer(&self) -> u32 {
        self.next_issuer
    }

    pub fn directory_version(&self) -> u64 {
        self.directory_version
    }

    /// The membership's identity: answers computed while it is unchanged carry the same
    /// directory or delta for the same reported version (what [`CoordinatorState::view_with`]
    /// builds depends on nothing else), so the caller may encode it once and share it.
    pub fn membership_identity(&self) -> (u64, u64) {
        (self.directory_version, self.membership_changes)
    }

    pub fn issuer_of(&self, node: &NodeId) -> Option<u32> {
        self.nodes.get(node).map(|n| n.issuer)
    }

    /// A node joins (or re-joins after a restart of either side). Returns the issuer prefix its
    /// distributed scheduler must mint container ids with: always fresh, so ids never repeat.
    pub fn join(&mut self, now: Time, mut dir: NodeDirectoryEntry) -> u32 {
        let node_id = dir.node_id.clone();
        let issuer = self.next_issuer;
        self.next_issuer += 1;
        let secret = self
            .token_master
            .as_ref()
            .and_then(|m| NodeSessionSecret::derive(m, &dir.node_id, issuer).ok());
        // Keying a 32-byte secret the coordinator made cannot fail.
        let issuer_keys = secret
            .as_ref()
            .and_then(|s| s.issuer_keys_for(&dir.node_id).ok());
        // A node's slot ([`NodeDirectoryEntry::slot`]) is a small dense number: what
        // [`NodeEntry::keys_held`] marks and how the top-k names the node on the wire. A re-join
        // keeps its slot; a new node takes a freed one or the next. Either way the slot's
        // session is new: no scheduler holds its key yet.
        let (slot, reused) = match self.nodes.get(&dir.node_id) {
            Some(n) => (n.dir.slot, true),
            None => match self.free_slots.pop() {
                Some(slot) => (slot, true),
                None => {
                    self.next_slot += 1;
                    (self.next_slot - 1, false)
                }
            },
        };
        if reused {
            for n in self.nodes.values_mut() {
                n.keys_held.remove(slot);
            }
        }
        dir.slot = slot;
        // A node the coordinator knew comes back: within a grace of the loss guard (after a
        // pause of the coordinator's own or a mass silence) the recovery is in progress, and
        // the nodes still on their way back are not declared lost while it lasts.
        if self.nodes.contains_key(&node_id) || self.lost_nodes.contains(&node_id) {
            self.loss_guard.node_returned(now, self.config.node_timeout);
        }
        let previous = self.nodes.insert(
            dir.node_id.clone(),
            NodeEntry {
                dir,
                issuer,
                load: QueueDelay::default(),
                last_seen: now,
                containers: Vec::new(),
                issued: Vec::new(),
                killing_lost: HashSet::new(),
                secret,
                issuer_keys,
                keys_held: SlotSet::default(),
                keys_at_generation: None,
                receiving_join_answer: true,
            },
        );
        if let Some(prev) = previous {
            self.outbox.remove(&prev.issuer);
            self.live_issuers.remove(&prev.issuer);
        }
        self.live_issuers.insert(issuer);
        self.directory_pending.insert(node_id.clone());
        self.membership_changes += 1;
        self.patch_round_top_k(&node_id, Some(slot));
        issuer
    }

    /// Keep the cached round's top-k consistent with membership in O(k): `node` taken out, and
    /// put first when it joined (`Some` of its slot: no queue yet) unless it is draining.
    fn patch_round_top_k(&mut self, node: &NodeId, joined: Option<u32>) {
        if self.round.at.is_none() {
            return;
        }
        self.top_k_generation += 1;
        // A joined node's deriver is its new session's (a re-join derives new keys).
        let joined_node = joined.and_then(|_| self.nodes.get(node));
        let deriver = RoundDeriver(joined_node.and_then(|n| n.issuer_keys.clone()));
        let entry = joined_node.map(|n| std::sync::Arc::new(n.dir.clone()));
        let round = &mut self.round;
        if let Some(i) = round.top_k.iter().position(|l| &l.node_id == node) {
            round.top_k.remove(i);
            round.top_k_slots.remove(i);
            round.top_k_derivers.remove(i);
            round.top_k_entries.remove(i);
        }
        if let Some(slot) = joined
            && let Some(entry) = entry
            && !self.draining.contains(node)
            && self.config.top_k > 0
        {
            round.top_k.insert(
                0,
                NodeLoad {
                    node_id: node.clone(),
                    queue_delay_ms: 0.0,
                },
            );
            round.top_k_slots.insert(0, slot);
            round.top_k_derivers.insert(0, deriver);
            round.top_k_entries.insert(0, entry);
            round.top_k.truncate(self.config.top_k);
            round.top_k_slots.truncate(self.config.top_k);
            round.top_k_derivers.truncate(self.config.top_k);
            round.top_k_entries.truncate(self.config.top_k);
        }
    }

    /// A heartbeat: the node's queue-delay estimate and the containers it holds.
    pub fn heartbeat(
        &mut self,
        now: Time,
        node: &NodeId,
        load: QueueDelay,
        containers: Vec<ContainerId>,
    ) -> bool {
        match self.nodes.get_mut(node) {
            Some(n) => {
                n.load = load;
                n.last_seen = now;
                n.containers = containers;
                n.receiving_join_answer = false;
                true
            }
            None => false,
        }
    }

    /// Queue a notice for the scheduler that issued the container (by id prefix). A notice for
    /// an issuer that is no longer joined (its node was lost, re-joined under a new issuer, or
    /// belonged to a previous coordinator) has no one to collect it and is dropped: `false`.
    pub fn route_notice(&mut self, notice: ContainerNotice) -> bool {
        let issuer = notice.container_id.issuer();
        if !self.live_issuers.contains(&issuer) {
            return false;
        }
        self.outbox.entry(issuer).or_default().push(notice);
        true
    }

    /// Take back the `lost` notices queued for the containers of `nodes` (the caller could not
    /// store their loss yet, and nothing of a loss may leave before it is stored); the caller
    /// routes them again ([`CoordinatorState::route_notice`]) once the loss is stored.
    pub fn take_loss_notices_of(&mut self, nodes: &BTreeSet<NodeId>) -> Vec<ContainerNotice> {
        let mut taken = Vec::new();
        for queued in self.outbox.values_mut() {
            queued.retain(|notice| {
                let held = notice.kind == NoticeKind::Lost && nodes.contains(&notice.node_id);
                if held {
                    taken.push(notice.clone());
                }
                !held
            });
        }
        self.outbox.retain(|_, queued| !queued.is_empty());
        taken.sort_by_key(|notice| notice.container_id);
        taken
    }

    /// Hold back the losses of `nodes` (each with why it was lost): the caller declared them
    /// ([`CoordinatorState::declare_lost`]) but could not store the lost-node set, and nothing
    /// of a loss may leave before it is stored. Their `lost` notices are taken back from the
    /// issuers' queues, a re-join of such a node is to be refused, and so is any new work its
    /// old session asks for ([`CoordinatorState::refusal_of_new_work`]), until
    /// [`CoordinatorState::release_held_losses`].
    pub fn hold_losses(&mut self, nodes: Vec<(NodeId, String)>) {
        let names: BTreeSet<NodeId> = nodes.iter().map(|(n, _)| n.clone()).collect();
        let notices = self.take_loss_notices_of(&names);
        self.held_loss_notices.extend(notices);
        for (node, why) in nodes {
            match self.held_losses.iter_mut().find(|(n, _)| *n == node) {
                Some(held) => held.1 = why,
                None => self.held_losses.push((node, why)),
            }
        }
    }

    /// Why `node`'s loss is held back, if it is.
    pub fn held_loss(&self, node: &NodeId) -> Option<&str> {
        self.held_losses
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, why)| why.as_str())
    }

    /// How many losses are held back.
    pub fn held_loss_count(&self) -> usize {
        self.held_losses.len()
    }

    /// The held losses are stored now: their notices go back to the issuers' queues, and the
    /// losses are returned, in the order they were held, for the caller to announce.
    pub fn release_held_losses(&mut self) -> Vec<(NodeId, String)> {
        for notice in std::mem::take(&mut self.held_loss_notices) {
            self.route_notice(notice);
        }
        std::mem::take(&mut self.held_losses)
    }

    /// A node whose loss is held keeps its session until the loss is stored, but gets nothing
    /// new through it: for a frame asking for new work (a GUARANTEED ask, a promotion, a
    /// reservation call) from such a node, the correlation id to refuse and the reason. Frees,
    /// releases and exits go through (`None`).
    pub fn refusal_of_new_work(
        &self,
        node: &NodeId,
        frame: &crate::protocol::cluster::WorkerToCoordinator,
    ) -> Option<(u64, String)> {
        let (correlation_id, what) = frame.new_work_asked()?;
        let why = self.held_loss(node)?;
        Some((
            correlation_id,
            format!(
                "{what} refused: node {node} is being declared lost ({why}); ask through another worker"
            ),
        ))
    }

    /// Notices queued for all issuers (observability and leak tests).
    pub fn pending_notices(&self) -> usize {
        self.outbox.values().map(Vec::len).sum()
    }

    /// Notices for the scheduler of `node` (taken).
    pub fn take_notices_for(&mut self, node: &NodeId) -> Vec<ContainerNotice> {
        match self.nodes.get(node) {
            Some(n) => self.outbox.remove(&n.issuer).unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// Remove a node (lost or left). Its containers are reported `Lost` to their issuers, and
    /// returned so the guarantor can free their GUARANTEED capacity.
    pub fn remove_node(&mut self, node: &NodeId) -> Vec<ContainerId> {
        let Some(entry) = self.nodes.remove(node) else {
            return Vec::new();
        };
        // Marks of it in other nodes' key sets are cleared when the slot is taken again. Not
        // before the version announcing this departure is published: a scheduler reads the
        // top-k's slots in its directory at the view's version, which until then still gives
        // this slot to this node.
        self.slots_leaving.push(entry.dir.slot);
        self.outbox.remove(&entry.issuer);
        self.live_issuers.remove(&entry.issuer);
        self.directory_pending.insert(node.clone());
        self.membership_changes += 1;
        self.patch_round_top_k(node, None);
        for &id in &entry.containers {
            self.route_notice(ContainerNotice {
                container_id: id,
                node_id: node.clone(),
                kind: NoticeKind::Lost,
            });
        }
        entry.containers
    }

    /// Nodes silent for longer than the timeout. A node still receiving its join answer (joined,
    /// no heartbeat yet, session open) is silent only past [`JOIN_ANSWER_LIMIT`], the time its
    /// worker waits for that answer while it keeps arriving: declaring it lost sooner would
    /// cut the answer off and have the worker join again, sending the whole answer once more.
    /// Which of them to declare lost is [`CoordinatorState::losses_due`]'s decision.
    pub fn silent_nodes(&self, now: Time) -> Vec<NodeId> {
        self.silent_since(now)
            .into_iter()
            .map(|(_, node)| node)
            .collect()
    }

    /// The silent nodes with when each was last heard, longest silent first (ties by id).
    fn silent_since(&self, now: Time) -> Vec<(Time, NodeId)> {
        let mut silent: Vec<(Time, NodeId)> = self
            .nodes
            .values()
            .filter(|n| now.saturating_since(n.last_seen) > silence_limit(&self.config, n))
            .map(|n| (n.last_seen, n.dir.node_id.clone()))
            .collect();
        silent.sort_unstable();
        silent
    }

    /// The silence check (the coordinator's tick): which silent nodes to declare lost now,
    /// through the [`crate::loss_guard`]. Time the coordinator itself was not listening (a
    /// gap between checks of more than two check intervals) is first taken off every node's
    /// silence; then, if most of the cluster is silent at once, declarations are held or slowed.
    /// O(nodes).
    pub fn losses_due(&mut self, now: Time) -> LossesDue {
        let previous = self.loss_guard.last_check();
        let deaf_for =
            self.loss_guard
                .deaf_for(&self.config.loss_guard, now, self.config.node_timeout);
        if !deaf_for.is_zero() {
            for n in self.nodes.values_mut() {
                n.last_seen = n.last_seen.saturating_add(deaf_for).min(now);
            }
        }
        let elapsed = previous
            .map_or(Duration::ZERO, |p| now.saturating_since(p))
            .saturating_sub(deaf_for);
        let suspected = self
            .nodes
            .values()
            .filter(|n| now.saturating_since(n.last_seen) > silence_limit(&self.config, n) / 2)
            .count();
        let silent = self.silent_since(now);
        let admitted = self.loss_guard.admit(
            &self.config.loss_guard,
            now,
            self.config.node_timeout,
            silent.len(),
            suspected,
            self.nodes.len(),
            elapsed,
        );
        let mut silent: Vec<NodeId> = silent.into_iter().map(|(_, n)| n).collect();
        let held: BTreeSet<NodeId> = silent.drain(admitted..).collect();
        let declare = silent;
        let newly_held = held.difference(&self.losses_guarded).cloned().collect();
        // Held before, not held now, and neither declared now nor gone: heard from again.
        let heard_again = if self.losses_guarded.is_empty() {
            Vec::new()
        } else {
            let declared: HashSet<&NodeId> = declare.iter().collect();
            self.losses_guarded
                .difference(&held)
                .filter(|n| self.nodes.contains_key(*n) && !declared.contains(n))
                .cloned()
                .collect()
        };
        self.losses_guarded = held;
        LossesDue {
            declare,
            newly_held,
            heard_again,
            held: self.losses_guarded.len(),
            silence: self.loss_guard.silence(),
            deaf_for,
        }
    }

    /// The coordinator starts listening at `now`: the first [`CoordinatorState::losses_due`]
    /// measures a pause of its own from here (without it, from its first check only).
    pub fn start_silence_checks(&mut self, now: Time) {
        self.loss_guard.start(now);
    }

    /// Checks that found the coordinator had not been listening ([`CoordinatorState::losses_due`]).
    pub fn own_stalls(&self) -> u64 {
        self.loss_guard.stalls()
    }

    /// Graces of the loss guard extended by a node coming back
    /// ([`crate::loss_guard::LossGuard::node_returned`]).
    pub fn loss_grace_extensions(&self) -> u64 {
        self.loss_guard.grace_extensions()
    }

    /// The node's session closed before its first heartbeat: it is no longer receiving its
    /// join answer, and its silence counts against the node timeout from its join.
    pub fn join_answer_abandoned(&mut self, node: &NodeId) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.receiving_join_answer = false;
        }
    }

    /// The k nodes of least R at `now`, ascending; ties broken at random so an idle cluster
    /// spreads work over all nodes rather than the first k by name.
    ///
    /// Left out: draining nodes, nodes the loss guard holds, and nodes silent for more than half
    /// their silence limit (the guard's "suspected", as Kubernetes' node lifecycle controller
    /// counts them). Mercury §4.2 ranks nodes by the R they last reported; a node that stopped
    /// reporting keeps its last R, and one that died idle (R ≈ 0) would head every scheduler's
    /// list for a whole node timeout — or indefinitely while a mass silence holds it — drawing
    /// QUEUEABLE work it can never start. A node is listed again from the first round after it
    /// is heard (a held one from the first round after the next silence check). While a
    /// silence check is overdue (the coordinator itself was not listening,
    /// [`crate::loss_guard::LossGuard::overdue`]), or while the guard finds most of the cluster
    /// silent at once, silence is not held against any node here either (only held nodes stay
    /// out): after a pause of its own, or when it falls behind on heartbeats, the coordinator
    /// would otherwise list only the few nodes it heard last and pile QUEUEABLE work on them.
    pub fn top_k<R: Rng + ?Sized>(&self, now: Time, rng: &mut R) -> Vec<NodeLoad> {
        let silence_counts = !self.loss_guard.overdue(&self.config.loss_guard, now)
            && self.loss_guard.silence() == crate::loss_guard::Silence::Normal;
        let mut ranked: Vec<(f64, u64, &NodeEntry)> = self
            .nodes
            .values()
            .filter(|n| !self.draining.contains(&n.dir.node_id))
            .filter(|n| {
                !silence_counts
                    || now.saturating_since(n.last_seen) <= silence_limit(&self.config, n) / 2
            })
            .filter(|n| !self.losses_guarded.contains(&n.dir.node_id))
            .map(|n| (n.load.total_ms(), rng.random::<u64>(), n))
            .collect();
        let order = |a: &(f64, u64, &NodeEntry), b: &(f64, u64, &NodeEntry)| {
            a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
        };
        // Select the k smallest in linear time, then sort only those: the coordinator recomputes
        // this every heartbeat round, and a full sort is O(n log n) at 10,000+ nodes.
        let k = self.config.top_k.min(ranked.len());
        if k < ranked.len() {
            ranked.select_nth_unstable_by(k, order);
            ranked.truncate(k);
        }
        ranked.sort_unstable_by(order);
        ranked
            .into_iter()
            .map(|(r, _, n)| NodeLoad {
                node_id: n.dir.node_id.clone(),
                queue_delay_ms: r,
            })
            .collect()
    }

    /// The view for a distributed scheduler whose directory is at `known_version`, with a
    /// freshly computed top-k (O(nodes); the coordinator uses [`CoordinatorState::round`]).
    pub fn view_for<R: Rng + ?Sized>(
        &self,
        known_version: u64,
        now: Time,
        rng: &mut R,
    ) -> ClusterView {
        self.view_with(known_version, self.top_k(now, rng))
    }

    /// Mercury §4.3: the targeted maximal queue delay, mean + n·σ of the nodes' R (population σ),
    /// floored at the configured minimum. `None` when shedding is off or no node reports.
    pub fn shedding_threshold_ms(&self) -> Option<f64> {
        let SheddingPolicy::MeanPlusSigma { n } = self.config.shedding else {
            return None;
        };
        if self.nodes.is_empty() {
            return None;
        }
        let values: Vec<f64> = self.nodes.values().map(|e| e.load.total_ms()).collect();
        Some(shedding_threshold(&values, n).max(self.config.min_shedding_threshold_ms))
    }
}

/// One round's load-shedding decision (Mercury §4.3, §6.3): the targeted maximal queue delay over
/// the whole cluster (reported) and, for each outlier node, the target it is sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SheddingRound {
    /// mean + n·σ of every node's R, floored at the configured minimum (metrics, dashboard).
    pub threshold_ms: Option<f64>,
    /// The outliers of the round and each one's target: mean + n·σ of the *other* nodes' R.
    pub targets: HashMap<NodeId, f64>,
}

impl SheddingRound {
    /// The target to send `node` with its heartbeat answer: its target if it was an outlier of
    /// the round, else none.
    pub fn target_for(&self, node: &NodeId) -> Option<f64> {
        self.targets.get(node).copied()
    }
}

impl AggregateRound {
    /// The round's top-k as it is sent ([`ClusterView::top_k_slots`]): each node by its slot.
    pub fn top_k_on_wire(&self) -> Vec<crate::distributed::SlotLoad> {
        self.top_k
            .iter()
            .zip(&self.top_k_slots)
            .map(|(l, &slot)| crate::distributed::SlotLoad {
                slot,
                queue_delay_ms: l.queue_delay_ms,
            })
            .collect()
    }

    /// See [`SheddingRound::target_for`].
    pub fn shedding_target_for(&self, node: &NodeId) -> Option<f64> {
        self.shedding_targets.get(node).copied()
    }
}

impl CoordinatorState {
    /// The round's outliers and their targets, from the nodes' latest R (O(nodes), once a round).
    ///
    /// Mercury §6.3: the coordinator computes "outliers (i.e., nodes whose queuing delays are
    /// significantly higher than average)" and disseminates the target; "the Mercury Runtime on
    /// an outlier node" then sheds to fit it. The target goes to the outliers only: a node that
    /// was not one when the round was computed is not shed against it. Sending the threshold to
    /// every node compared each node's *current* R with a threshold up to a round old; when a
    /// closed loop admits a wave of jobs, every node's R rises within the round above the old
    /// target and every node sheds, and the shed containers are re-asked onto nodes that shed
    /// them again (§7.3 20-s tasks: 50,000 sheds in 3 s, 0.9 per completed task;
    /// docs/experiments/mercury/diagnosis.md).
    ///
    /// A node is compared with the *other* nodes (mean + n·σ of their R, §4.3's threshold with
    /// the node left out) and, if above, sent that as its target. Including the node itself
    /// hides it on small clusters: the largest z-score n samples can hold is (n − 1)/√n, so with
    /// mean + σ no node of two, and with mean + 2σ no node of five or fewer, is ever above the
    /// threshold, and a full node with a queue keeps it while its peer idles. On a large
    /// cluster the two thresholds differ by O(1/n).
    pub fn shedding_round(&self) -> SheddingRound {
        let SheddingPolicy::MeanPlusSigma { n: sigmas } = self.config.shedding else {
            return SheddingRound::default();
        };
        let Some(threshold_ms) = self.shedding_threshold_ms() else {
            return SheddingRound::default();
        };
        let floor = self.config.min_shedding_threshold_ms;
        let loads: Vec<(&NodeId, f64)> = self
            .nodes
            .values()
            .map(|e| (&e.dir.node_id, e.load.total_ms()))
            .collect();
        let targets = leave_one_out_thresholds(loads.iter().map(|(_, r)| *r), sigmas)
            .zip(&loads)
            .filter_map(|(others, (id, r))| {
                let target = others?.max(floor);
                (*r > target).then(|| ((*id).clone(), target))
            })
            .collect();
        SheddingRound {
            threshold_ms: Some(threshold_ms),
            targets,
        }
    }
}

/// For each value, mean + n·σ (population σ) of all the *other* values; `None` for a single
/// value (no others). O(len): the global mean and sum of squared deviations, each value then
/// taken out with the exact downdate M2₋ᵢ = M2 − (xᵢ − μ)²·len/(len − 1), which stays accurate
/// where sums of squares would cancel.
pub fn leave_one_out_thresholds(
    values: impl Iterator<Item = f64> + Clone,
    n: f64,
) -> impl Iterator<Item = Option<f64>> {
    let (count, sum) = values
        .clone()
        .fold((0usize, 0.0), |(c, s), v| (c + 1, s + v));
    let mean = if count > 0 { sum / count as f64 } else { 0.0 };
    let m2: f64 = values.clone().map(|v| (v - mean) * (v - mean)).sum();
    values.map(move |v| {
        if count < 2 {
            return None;
        }
        let others = (count - 1) as f64;
        let others_mean = (sum - v) / others;
        let others_m2 = (m2 - (v - mean) * (v - mean) * count as f64 / others).max(0.0);
        Some(others_mean + n * (others_m2 / others).sqrt())
    })
}

/// mean + n·σ (population standard deviation) of `values`; 0 for no values.
pub fn shedding_threshold(values: &[f64], n: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let count = values.len() as f64;
    let mean = values.iter().sum::<f64>() / count;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / count;
    mean + n * var.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resources;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn dir(name: &str) -> NodeDirectoryEntry {
        NodeDirectoryEntry {
            node_id: NodeId::from(name),
            rack: "r0".into(),
            capacity: Resources::new(4000, 8192),
            app_endpoint: format!("{name}:1"),
            slot: 0,
        }
    }

    fn delay(r_s: f64) -> QueueDelay {
        QueueDelay {
            tq_ms: r_s * 1000.0,
            tr_ms: 0.0,
            tl_ms: 0.0,
        }
    }

    #[test]
    fn threshold_matches_hand_computation() {
        // Same numbers as YARN's worked example {0,2,4,10}: mean 4, σ = sqrt(14) ≈ 3.742.
        let t = shedding_threshold(&[0.0, 2.0, 4.0, 10.0], 1.0);
        assert!((t - (4.0 + 14f64.sqrt())).abs() < 1e-9);
        let t2 = shedding_threshold(&[0.0, 2.0, 4.0, 10.0], 2.0);
        assert!((t2 - (4.0 + 2.0 * 14f64.sqrt())).abs() < 1e-9);
        assert!("avg+2sigma".parse::<SheddingPolicy>().is_ok());
        assert!("avg+xsigma".parse::<SheddingPolicy>().is_err());
    }

    /// Mercury §6.3: the target goes to the round's outliers only, each compared with the other
    /// nodes. A node that was below its threshold when the round was computed is not asked to
    /// shed, however much its R grew since (a wave of admissions raises every node's R within a
    /// round).
    #[test]
    fn the_shedding_target_goes_only_to_the_rounds_outliers() {
        let mut c = CoordinatorState::new(
            CoordinatorConfig {
                shedding: SheddingPolicy::MeanPlusSigma { n: 1.0 },
                ..Default::default()
            },
            1,
        );
        let mut rng = StdRng::seed_from_u64(3);
        // R = 0, 2, 4, 10 s: the cluster's threshold is 4 + sqrt(14) ≈ 7.74 s. "d" against the
        // others {0, 2, 4}: 2 + sqrt(8/3) ≈ 3.63 s, an outlier with that target; "c" against
        // {0, 2, 10}: 4 + sqrt(56/3) ≈ 8.32 s, not one.
        for (name, r_s) in [("a", 0.0), ("b", 2.0), ("c", 4.0), ("d", 10.0)] {
            c.join(Time::ZERO, dir(name));
            assert!(c.heartbeat(Time::ZERO, &NodeId::from(name), delay(r_s), vec![]));
        }
        let round = c
            .round(Time::ZERO, Duration::from_secs(3), &mut rng)
            .clone();
        let threshold = round.shedding_threshold_ms.expect("shedding is on");
        assert!((threshold - (4.0 + 14f64.sqrt()) * 1000.0).abs() < 1e-6);
        let d = round
            .shedding_target_for(&NodeId::from("d"))
            .expect("d is an outlier");
        assert!(
            (d - (2.0 + (8.0f64 / 3.0).sqrt()) * 1000.0).abs() < 1e-6,
            "{d}"
        );
        for name in ["a", "b", "c"] {
            assert_eq!(
                round.shedding_target_for(&NodeId::from(name)),
                None,
                "{name}"
            );
        }
        // "a" now reports far above the threshold; within the round it still is not sent it.
        assert!(c.heartbeat(
            Time::from_millis(1_000),
            &NodeId::from("a"),
            delay(50.0),
            vec![]
        ));
        let same = c.round(Time::from_millis(1_000), Duration::from_secs(3), &mut rng);
        assert_eq!(same.shedding_target_for(&NodeId::from("a")), None);
        // Shedding off: no target for anyone.
        let off = CoordinatorState::new(
            CoordinatorConfig {
                shedding: SheddingPolicy::Off,
                ..Default::default()
            },
            1,
        );
        assert_eq!(off.shedding_round(), SheddingRound::default());
    }

    /// On two nodes mean + σ of both is the larger R exactly, so a full node with a queue was
    /// never an outlier while its peer idled (the live dashboard test's 2-node cluster). Against
    /// the other node it is, and its target is the other node's R (floored at the minimum).
    #[test]
    fn on_two_nodes_the_loaded_one_is_an_outlier_against_the_other() {
        for sigmas in [1.0, 2.0] {
            let mut c = CoordinatorState::new(
                CoordinatorConfig {
                    shedding: SheddingPolicy::MeanPlusSigma { n: sigmas },
                    ..Default::default()
                },
                1,
            );
            for (name, r_s) in [("full", 150.0), ("idle", 30.0)] {
                c.join(Time::ZERO, dir(name));
                assert!(c.heartbeat(Time::ZERO, &NodeId::from(name), delay(r_s), vec![]));
            }
            let round = c.shedding_round();
            assert_eq!(round.threshold_ms, Some(90_000.0 + sigmas * 60_000.0));
            assert_eq!(round.target_for(&NodeId::from("full")), Some(30_000.0));
            assert_eq!(round.target_for(&NodeId::from("idle")), None);
            // One node alone has nobody to shed to.
            c.remove_node(&NodeId::from("idle"));
            assert_eq!(c.shedding_round().targets, HashMap::new());
        }
    }

    #[test]
    fn leave_one_out_thresholds_match_direct_computation() {
        let values = [0.0, 2.0, 4.0, 10.0, 1e9, 1e9 + 3.0, 7.5];
        let fast: Vec<f64> = leave_one_out_thresholds(values.iter().copied(), 2.0)
            .map(|t| t.expect("several values"))
            .collect();
        for (i, t) in fast.iter().enumerate() {
            let others: Vec<f64> = values
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, v)| *v)
                .collect();
            let direct = shedding_threshold(&others, 2.0);
            assert!(
                (t - direct).abs() <= 1e-6 * direct.abs().max(1.0),
                "{i}: {t} vs {direct}"
            );
        }
        assert_eq!(
            leave_one_out_thresholds([5.0].into_iter(), 1.0).collect::<Vec<_>>(),
            vec![None]
        );
    }

    /// A joined node cannot heartbeat before it has its join answer, which a coordinator in a
    /// join storm may take longer than the node timeout to deliver: until its first heartbeat,
    /// and while its session is open, it is silent only past the worker's own limit.
    #[test]
    fn a_node_still_receiving_its_join_answer_is_not_lost_at_the_node_timeout() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        for name in ["beating", "receiving", "closed", "late"] {
            c.join(Time::ZERO, dir(name));
        }
        let node = NodeId::from;
        assert!(c.heartbeat(Time::from_secs(1), &node("beating"), delay(0.0), vec![]));
        c.join_answer_abandoned(&node("closed"));
        let silent = |c: &CoordinatorState, s: u64| {
            let mut v: Vec<String> = c
                .silent_nodes(Time::from_secs(s))
                .iter()
                .map(|n| n.to_string())
                .collect();
            v.sort();
            v
        };
        assert_eq!(silent(&c, 10), Vec::<String>::new());
        // The node timeout (10 s) for a node that heartbeats and for one whose session closed
        // before its first heartbeat; not for the two still receiving.
        assert_eq!(silent(&c, 12), vec!["beating", "closed"]);
        // Its first heartbeat ends the grace: silence from then on counts as for any node.
        assert!(c.heartbeat(Time::from_secs(30), &node("late"), delay(0.0), vec![]));
        assert_eq!(silent(&c, 40), vec!["beating", "closed"]);
        assert_eq!(silent(&c, 41), vec!["beating", "closed", "late"]);
        // The grace is bounded by the time the worker itself waits for the answer.
        let limit = JOIN_ANSWER_LIMIT.as_secs();
        assert!(!silent(&c, limit).contains(&"receiving".to_string()));
        assert!(silent(&c, limit + 1).contains(&"receiving".to_string()));
        // A re-join is a new session receiving a new answer.
        c.join(Time::from_secs(100), dir("beating"));
        assert!(!silent(&c, 112).contains(&"beating".to_string()));
    }

    #[test]
    fn top_k_is_sorted_and_bounded_and_lost_nodes_notify_issuers() {
        let mut c = CoordinatorState::new(
            CoordinatorConfig {
                top_k: 2,
                ..Default::default()
            },
            1,
        );
        let mut rng = StdRng::seed_from_u64(3);
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            c.join(Time::ZERO, dir(name));
            let load = QueueDelay {
                tq_ms: (3 - i) as f64 * 100.0,
                tr_ms: 0.0,
                tl_ms: 0.0,
            };
            assert!(c.heartbeat(Time::ZERO, &NodeId::from(*name), load, vec![]));
        }
        let top = c.top_k(Time::ZERO, &mut rng);
        assert_eq!(
            top.iter().map(|l| l.node_id.as_str()).collect::<Vec<_>>(),
            vec!["c", "b"]
        );
        let issuer_a = c.issuer_of(&NodeId::from("a")).unwrap();
        let id = ContainerId::new(issuer_a, 5);
        c.heartbeat(
            Time::from_secs(1),
            &NodeId::from("b"),
            QueueDelay::default(),
            vec![id],
        );
        assert_eq!(c.silent_nodes(Time::from_secs(11)).len(), 2);
        let lost = c.remove_node(&NodeId::from("b"));
        assert_eq!(lost, vec![id]);
        let notices = c.take_notices_for(&NodeId::from("a"));
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].kind, NoticeKind::Lost);
        let v = c.view_for(0, Time::ZERO, &mut rng);
        assert_eq!(v.directory.len(), 2);
        assert!(
            c.view_for(v.directory_version, Time::ZERO, &mut rng)
                .directory
                .is_empty()
        );
    }

    #[test]
    fn loss_notices_taken_back_are_only_the_lost_nodes_and_route_again() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        c.join(Time::ZERO, dir("a"));
        c.join(Time::ZERO, dir("b"));
        c.join(Time::ZERO, dir("c"));
        let a = c.issuer_of(&NodeId::from("a")).unwrap();
        let on_b = ContainerId::new(a, 1);
        let on_c = ContainerId::new(a, 2);
        let finished = ContainerId::new(a, 3);
        c.heartbeat(
            Time::ZERO,
            &NodeId::from("b"),
            QueueDelay::default(),
            vec![on_b],
        );
        c.heartbeat(
            Time::ZERO,
            &NodeId::from("c"),
            QueueDelay::default(),
            vec![on_c],
        );
        assert!(c.route_notice(ContainerNotice {
            container_id: finished,
            node_id: NodeId::from("b"),
            kind: NoticeKind::Finished,
        }));
        c.declare_lost(&NodeId::from("b"));
        c.declare_lost(&NodeId::from("c"));
        let held = c.take_loss_notices_of(&BTreeSet::from([NodeId::from("b")]));
        assert_eq!(
            held.iter()
                .map(|n| (n.container_id, n.kind.clone()))
                .collect::<Vec<_>>(),
            vec![(on_b, NoticeKind::Lost)],
            "only the lost notices of the named node"
        );
        let left = c.take_notices_for(&NodeId::from("a"));
        assert_eq!(
            left.iter().map(|n| n.container_id).collect::<Vec<_>>(),
            vec![finished, on_c],
            "the rest stays queued, in order"
        );
        for notice in held {
            assert!(c.route_notice(notice));
        }
        assert_eq!(
            c.take_notices_for(&NodeId::from("a"))
                .iter()
                .map(|n| n.container_id)
                .collect::<Vec<_>>(),
            vec![on_b]
        );
    }

    /// A held loss keeps its notices back, names the node as held (a re-join is to be refused),
    /// refuses the node's asks for new work but not its other frames, and once released routes
    /// the notices again and hands the losses back to be announced, in order.
    #[test]
    fn a_held_loss_refuses_new_work_and_releases_its_notices_once_stored() {
        use crate::protocol::cluster::{
            ReleaseContainer, ReservationCall, ReservationOp, WorkerToCoordinator,
        };
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        for n in ["a", "b", "c"] {
            c.join(Time::ZERO, dir(n));
        }
        let (a, b, c_node) = (NodeId::from("a"), NodeId::from("b"), NodeId::from("c"));
        let issuer = c.issuer_of(&a).unwrap();
        let on_b = ContainerId::new(issuer, 1);
        c.heartbeat(Time::ZERO, &b, QueueDelay::default(), vec![on_b]);
        c.declare_lost(&b);
        c.hold_losses(vec![(b.clone(), "silent".into())]);
        assert_eq!(c.pending_notices(), 0, "nothing of the loss leaves");
        assert_eq!(c.held_loss(&b), Some("silent"));
        assert_eq!(c.held_loss(&c_node), None);
        assert_eq!(c.held_loss_count(), 1);
        let reservation = WorkerToCoordinator::Reservation(ReservationCall {
            correlation_id: 9,
            app_id: "app".into(),
            op: ReservationOp::List,
        });
        let (id, why) = c.refusal_of_new_work(&b, &reservation).expect("refused");
        assert_eq!(id, 9);
        assert!(why.contains("a reservation call refused: node b") && why.contains("silent"));
        assert_eq!(c.refusal_of_new_work(&c_node, &reservation), None);
        let release = WorkerToCoordinator::Release(ReleaseContainer {
            correlation_id: 10,
            app_id: "app".into(),
            container_id: on_b,
        });
        assert_eq!(
            c.refusal_of_new_work(&b, &release),
            None,
            "frees go through"
        );
        // Declared again while held: one hold, the latest reason.
        c.hold_losses(vec![(b.clone(), "silent again".into())]);
        assert_eq!(c.held_loss_count(), 1);
        assert_eq!(
            c.release_held_losses(),
            vec![(b.clone(), "silent again".to_string())]
        );
        assert_eq!(c.held_loss(&b), None);
        assert_eq!(c.refusal_of_new_work(&b, &reservation), None);
        let told: Vec<(ContainerId, NoticeKind)> = c
            .take_notices_for(&a)
            .into_iter()
            .map(|n| (n.container_id, n.kind))
            .collect();
        assert_eq!(told, vec![(on_b, NoticeKind::Lost)]);
    }

    #[test]
    fn notices_for_issuers_that_are_gone_are_dropped_not_queued() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        c.join(Time::ZERO, dir("a"));
        c.join(Time::ZERO, dir("b"));
        let first_a = c.issuer_of(&NodeId::from("a")).unwrap();
        let notice = |issuer| ContainerNotice {
            container_id: ContainerId::new(issuer, 1),
            node_id: NodeId::from("b"),
            kind: NoticeKind::Finished,
        };
        assert!(c.route_notice(notice(first_a)));
        // `a` re-joins under a new issuer: its old queue goes, and so does anything for the old one.
        c.join(Time::from_secs(1), dir("a"));
        let second_a = c.issuer_of(&NodeId::from("a")).unwrap();
        assert_ne!(first_a, second_a);
        assert_eq!(c.pending_notices(), 0);
        for _ in 0..1000 {
            assert!(!c.route_notice(notice(first_a)));
        }
        // An issuer that never existed (a previous coordinator's) is no different.
        assert!(!c.route_notice(notice(9_999)));
        assert_eq!(c.pending_notices(), 0);
        assert!(c.route_notice(notice(second_a)));
        // A removed node's issuer is gone too.
        c.remove_node(&NodeId::from("a"));
        assert!(!c.route_notice(notice(second_a)));
        assert_eq!(c.pending_notices(), 0);
    }

    #[test]
    fn linear_top_k_selection_equals_a_full_sort() {
        let mut c = CoordinatorState::new(
            CoordinatorConfig {
                top_k: 7,
                ..Default::default()
            },
            1,
        );
        for i in 0..60u64 {
            let name = format!("n{i}");
            c.join(Time::ZERO, dir(&name));
            // Repeated values exercise the random tie-break.
            let load = QueueDelay {
                tq_ms: ((i * 37) % 11) as f64 * 10.0,
                tr_ms: 0.0,
                tl_ms: 0.0,
            };
            c.heartbeat(Time::ZERO, &NodeId::from(name.as_str()), load, vec![]);
        }
        let top = c.top_k(Time::ZERO, &mut StdRng::seed_from_u64(9));
        // Reference: draw the same tie-break numbers in the same order, sort everything.
        let mut rng = StdRng::seed_from_u64(9);
        let mut all: Vec<(f64, u64, String)> = c
            .nodes
            .values()
            .map(|n| {
                (
                    n.load.total_ms(),
                    rng.random::<u64>(),
                    n.dir.node_id.to_string(),
                )
            })
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let expected: Vec<String> = all.into_iter().take(7).map(|x| x.2).collect();
        let got: Vec<String> = top.iter().map(|l| l.node_id.to_string()).collect();
        assert_eq!(got, expected);
        c.config_mut().top_k = 100;
        assert_eq!(c.top_k(Time::ZERO, &mut StdRng::seed_from_u64(1)).len(), 60);
    }

    fn listed(c: &CoordinatorState, now_ms: u64) -> Vec<String> {
        let mut rng = StdRng::seed_from_u64(1);
        c.top_k(Time::from_millis(now_ms), &mut rng)
            .into_iter()
            .map(|l| l.node_id.to_string())
            .collect()
    }

    fn listed_by_name(c: &CoordinatorState, now_ms: u64) -> Vec<String> {
        let mut names = listed(c, now_ms);
        names.sort();
        names
    }

    /// A node that stopped reporting keeps its last R: one that died idle would head every
    /// scheduler's list for a whole node timeout. It leaves the top-k once silent for more than
    /// half its timeout and is listed again from its next report.
    #[test]
    fn a_silent_node_leaves_the_top_k_until_heard_again() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        for (name, r_s) in [("died-idle", 0.0), ("busy-1", 5.0), ("busy-2", 9.0)] {
            c.join(Time::ZERO, dir(name));
            assert!(c.heartbeat(Time::ZERO, &NodeId::from(name), delay(r_s), vec![]));
        }
        assert_eq!(listed(&c, 5_000), vec!["died-idle", "busy-1", "busy-2"]);
        for s in 1..=6 {
            for name in ["busy-1", "busy-2"] {
                c.heartbeat(Time::from_secs(s), &NodeId::from(name), delay(5.0), vec![]);
            }
        }
        // Half of the 10-s node timeout has passed for died-idle: out.
        assert_eq!(listed_by_name(&c, 5_001), vec!["busy-1", "busy-2"]);
        let round = c.round(
            Time::from_secs(6),
            Duration::from_secs(1),
            &mut StdRng::seed_from_u64(2),
        );
        assert!(
            round
                .top_k
                .iter()
                .all(|l| l.node_id.as_str() != "died-idle")
        );
        // Heard again: listed from the next round.
        assert!(c.heartbeat(
            Time::from_secs(7),
            &NodeId::from("died-idle"),
            delay(0.0),
            vec![]
        ));
        assert_eq!(listed(&c, 7_000)[0], "died-idle");
        let round = c.round(
            Time::from_secs(7),
            Duration::from_secs(1),
            &mut StdRng::seed_from_u64(2),
        );
        assert_eq!(round.top_k[0].node_id.as_str(), "died-idle");
    }

    /// What a recovery's silence checks did: (ms, node declared lost) and (ms, silence found).
    type Recovery = (Vec<(u64, String)>, Vec<(u64, Silence)>);

    /// A recovery after a pause: 20 nodes heard at 0 s, the coordinator paused from 0.5 s to
    /// 16 s (the workers gave their sessions up meanwhile), node `i` of the first 19 re-joining
    /// at `due_at(i)` ms and heartbeating every second from then, n19 dead. Silence checks every
    /// `step_ms` from 16 s to `until_ms`; what each check declared is declared lost. Returns the
    /// declarations and each check's silence, with their times in ms.
    fn recovery_after_a_pause(
        due_at: impl Fn(usize) -> u64,
        step_ms: u64,
        until_ms: u64,
    ) -> Recovery {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        let names: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
        for name in &names {
            c.join(Time::ZERO, dir(name));
            c.heartbeat(Time::ZERO, &NodeId::from(name.as_str()), delay(1.0), vec![]);
        }
        c.start_silence_checks(Time::ZERO);
        assert!(c.losses_due(Time::from_millis(500)).declare.is_empty());
        let mut back: Vec<&str> = Vec::new();
        let mut declared = Vec::new();
        let mut silences = Vec::new();
        let mut at = 16_000;
        while at <= until_ms {
            for (i, name) in names.iter().enumerate().take(19) {
                if due_at(i) + step_ms > at && due_at(i) <= at {
                    c.join(Time::from_millis(at), dir(name));
                    back.push(name);
                }
            }
            if at % 1_000 == 0 {
                for name in &back {
                    c.heartbeat(
                        Time::from_millis(at),
                        &NodeId::from(*name),
                        delay(1.0),
                        vec![],
                    );
                }
            }
            let due = c.losses_due(Time::from_millis(at));
            silences.push((at, due.silence));
            for node in due.declare {
                declared.push((at, node.as_str().to_string()));
                c.declare_lost(&node);
            }
            at += step_ms;
        }
        (declared, silences)
    }

    /// After a pause of the coordinator's own long enough for every worker to give its session
    /// up, the nodes re-join one by one over longer than a node timeout (the coordinator
    /// answers re-joins only so fast): none of them is declared lost while they keep coming
    /// back, and the one that never comes back is declared a node timeout after the last one
    /// did. Before the loss guard extended its grace by returning nodes, the four nodes due
    /// back after the grace of the mass silence's end (a node timeout after half of them were
    /// back: 44 s) were declared lost with the dead one while they waited to be answered.
    #[test]
    fn nodes_still_coming_back_after_a_pause_are_not_declared_lost() {
        // n00..n18 come back one every 2 s from 16 s (the last at 52 s).
        let (declared, _) = recovery_after_a_pause(|i| 16_000 + 2_000 * i as u64, 500, 80_000);
        // Only the dead node, a node timeout after the last one came back (52 s).
        assert_eq!(declared, vec![(62_000, "n19".to_string())]);
    }

    /// The same pause, but most nodes are back before the rest are even suspected, so the
    /// share never reaches a mass silence: the pause's own grace, extended by each node that
    /// comes back, keeps the slow ones. Before, every node not back within a node timeout of
    /// the resume (here the last four) was declared lost.
    #[test]
    fn nodes_slow_to_come_back_after_a_pause_without_a_mass_silence_are_not_declared_lost() {
        // n00..n11 are back by 18.75 s; n12..n18 one every 2 s from 20 s (the last at 32 s).
        let due_at = |i: usize| {
            if i < 12 {
                16_000 + 250 * i as u64
            } else {
                20_000 + 2_000 * (i as u64 - 12)
            }
        };
        let (declared, silences) = recovery_after_a_pause(due_at, 250, 60_000);
        for (at, silence) in silences {
            assert_eq!(silence, Silence::Normal, "at {at} ms");
        }
        assert_eq!(declared, vec![(42_000, "n19".to_string())]);
    }

    /// After a pause of the coordinator's own, every node looks silent until the overdue check
    /// takes the pause off their silence; the top-k does not drop them meanwhile. Nodes held by
    /// the loss guard in a mass silence stay out.
    #[test]
    fn the_top_k_does_not_blame_the_coordinators_pause_and_leaves_held_nodes_out() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        let names = ["a", "b", "c", "d", "e"];
        for name in names {
            c.join(Time::ZERO, dir(name));
            c.heartbeat(Time::ZERO, &NodeId::from(name), delay(1.0), vec![]);
        }
        c.start_silence_checks(Time::ZERO);
        assert!(c.losses_due(Time::from_millis(500)).declare.is_empty());
        // The coordinator stops for 8 s; the first round after it still lists every node.
        assert_eq!(listed(&c, 8_500).len(), 5);
        let due = c.losses_due(Time::from_millis(8_500));
        assert!(due.deaf_for > Duration::ZERO);
        assert_eq!(listed(&c, 8_500).len(), 5);
        // Only a and b are heard from then on: c, d and e (3 of 5, past the 55 % share) are
        // held, not lost, and not listed.
        let mut at = 8_500;
        while at < 20_000 {
            at += 500;
            for name in ["a", "b"] {
                c.heartbeat(
                    Time::from_millis(at),
                    &NodeId::from(name),
                    delay(1.0),
                    vec![],
                );
            }
            assert!(
                c.losses_due(Time::from_millis(at)).declare.is_empty(),
                "at {at} ms"
            );
        }
        assert_eq!(c.losses_guarded.len(), 3);
        assert_eq!(listed_by_name(&c, at), vec!["a", "b"]);
    }

    #[test]
    fn the_aggregate_is_computed_once_per_round_and_patched_by_membership_changes() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        let mut rng = StdRng::seed_from_u64(5);
        let second = Duration::from_secs(1);
        c.join(Time::ZERO, dir("a"));
        let load = |ms| QueueDelay {
            tq_ms: ms,
            tr_ms: 0.0,
            tl_ms: 0.0,
        };
        c.heartbeat(Time::ZERO, &NodeId::from("a"), load(500.0), vec![]);
        let first = c.round(Time::ZERO, second, &mut rng).clone();
        assert_eq!(first.top_k.len(), 1);
        assert_eq!(first.top_k[0].queue_delay_ms, 500.0);
        // Heartbeats within the round change the estimates but not the round's aggregate.
        c.heartbeat(
            Time::from_millis(300),
            &NodeId::from("a"),
            load(900.0),
            vec![],
        );
        assert_eq!(c.round(Time::from_millis(999), second, &mut rng), &first);
        // The next round sees them.
        let next = c.round(Time::from_millis(1000), second, &mut rng).clone();
        assert_eq!(next.top_k[0].queue_delay_ms, 900.0);
        // A join is seen at once, without recomputing the round: a new node must not wait a
        // round to be offered work.
        c.heartbeat(
            Time::from_millis(1050),
            &NodeId::from("a"),
            load(100.0),
            vec![],
        );
        c.join(Time::from_millis(1100), dir("b"));
        let joined = c.round(Time::from_millis(1100), second, &mut rng).clone();
        assert_eq!(joined.top_k.len(), 2);
        assert_eq!(joined.top_k[0].node_id.as_str(), "b");
        assert_eq!(
            joined.top_k[1].queue_delay_ms, 900.0,
            "a's estimate waits for the round"
        );
        assert_eq!(joined.at, next.at);
        // A removed node leaves the list at once.
        c.remove_node(&NodeId::from("a"));
        let removed = c.round(Time::from_millis(1200), second, &mut rng).clone();
        assert_eq!(removed.top_k.len(), 1);
        assert_eq!(removed.top_k[0].node_id.as_str(), "b");
        c.join(Time::from_millis(1300), dir("a"));
        let view = c.view_with(0, joined.top_k.clone());
        assert_eq!(view.directory.len(), 2);
        assert!(
            c.view_with(view.directory_version, vec![])
                .directory
                .is_empty()
        );
        assert_eq!(c.node(&NodeId::from("b")).unwrap().app_endpoint, "b:1");
    }

    /// The live coordinator encodes the top-k once per generation and shares the bytes: every
    /// change of the list (a new round, a join or a removal patching it, a drain) must move the
    /// generation, and a heartbeat within the round must not.
    #[test]
    fn the_top_k_generation_moves_whenever_the_list_may_change() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        let mut rng = StdRng::seed_from_u64(5);
        let second = Duration::from_secs(1);
        c.join(Time::ZERO, dir("a"));
        c.round(Time::ZERO, second, &mut rng);
        let mut seen = vec![(c.top_k_generation(), c.aggregate_round().top_k.clone())];
        let mut check = |c: &CoordinatorState, moved: bool| {
            let (last, list) = seen.last().cloned().expect("one seen");
            let now = (c.top_k_generation(), c.aggregate_round().top_k.clone());
            if moved {
                assert_ne!(now.0, last, "the generation moves");
            } else {
                assert_eq!(now.0, last, "the generation stays");
                assert_eq!(now.1, list, "so does the list");
            }
            seen.push(now);
        };
        c.heartbeat(
            Time::from_millis(10),
            &NodeId::from("a"),
            QueueDelay::default(),
            vec![],
        );
        c.round(Time::from_millis(10), second, &mut rng);
        check(&c, false);
        c.join(Time::from_millis(20), dir("b"));
        check(&c, true);
        c.round(Time::from_millis(30), second, &mut rng);
        check(&c, false);
        c.remove_node(&NodeId::from("a"));
        check(&c, true);
        c.round(Time::from_millis(1000), second, &mut rng);
        check(&c, true);
        c.set_draining(&NodeId::from("b"), true);
        c.round(Time::from_millis(1001), second, &mut rng);
        check(&c, true);
        assert!(c.aggregate_round().top_k.is_empty(), "b is draining");
    }

    fn status(id: ContainerId) -> ContainerStatus {
        ContainerStatus {
            usage: None,
            id,
            app_id: crate::AppId::from("app"),
            container_type: crate::ContainerType::Guaranteed,
            resources: Resources::new(100, 100),
            placement: crate::node::Placement::Running,
            version: 0,
            job: None,
            grant_token: None,
        }
    }

    #[test]
    fn a_node_declared_lost_must_kill_what_it_rejoins_with_until_it_reports_without_it() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        let (x, y) = (ContainerId::new(0, 1), ContainerId::new(0, 2));
        // A node that was never lost re-adopts what it reports.
        let first = c.join_with(Time::ZERO, dir("a"), &[status(x)]);
        assert!(first.lost_containers.is_empty());
        assert!(c.take_lost_nodes_if_changed().is_none());
        assert_eq!(c.declare_lost(&NodeId::from("a")), vec![x]);
        assert_eq!(
            c.take_lost_nodes_if_changed().cloned(),
            Some([NodeId::from("a")].into())
        );
        // A failed save is offered again.
        assert!(c.take_lost_nodes_if_changed().is_none());
        c.lost_nodes_not_saved();
        assert_eq!(
            c.take_lost_nodes_if_changed().cloned(),
            Some([NodeId::from("a")].into())
        );
        // It comes back with x and y: both were reported lost (y started while it was cut off:
        // nobody knew of it either), so both must go.
        let back = c.join_with(Time::from_secs(20), dir("a"), &[status(y), status(x)]);
        assert_eq!(back.lost_containers, vec![x, y]);
        assert_ne!(back.issuer, first.issuer);
        // A report queued before the worker acted still lists them: not taken as running.
        let mut report = vec![status(x), status(y)];
        let mut started = vec![y];
        c.screen_report(&NodeId::from("a"), &mut report, &mut started);
        assert!(report.is_empty() && started.is_empty());
        assert!(c.is_lost(&NodeId::from("a")));
        // Once it reports without them, it is whole again.
        let z = ContainerId::new(back.issuer, 1);
        let mut report = vec![status(z)];
        c.screen_report(&NodeId::from("a"), &mut report, &mut vec![]);
        assert_eq!(report.len(), 1);
        assert!(!c.is_lost(&NodeId::from("a")));
        assert_eq!(
            c.take_lost_nodes_if_changed().cloned(),
            Some(BTreeSet::new())
        );
        // A later re-join (a network blip) re-adopts again.
        assert!(
            c.join_with(Time::from_secs(30), dir("a"), &[status(z)])
                .lost_containers
                .is_empty()
        );
        // The lost set survives a restart through the caller's store.
        c.declare_lost(&NodeId::from("a"));
        let lost = c.take_lost_nodes_if_changed().cloned().unwrap();
        let mut restarted =
            CoordinatorState::new(CoordinatorConfig::default(), 99).with_lost_nodes(lost);
        assert_eq!(
            restarted
                .join_with(Time::ZERO, dir("a"), &[status(z)])
                .lost_containers,
            vec![z]
        );
    }

    #[test]
    fn each_issuer_learns_what_the_others_hold_per_app_once_per_round() {
        let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
        let mut rng = StdRng::seed_from_u64(1);
        let second = Duration::from_secs(1);
        for n in ["a", "b", "c"] {
            c.join(Time::ZERO, dir(n));
        }
        let counts = |app: &str, q, g| AppOutstanding {
            app_id: crate::AppId::from(app),
            queueable: q,
            guaranteed: g,
        };
        c.report_issued(&NodeId::from("a"), vec![counts("x", 2, 1)]);
        c.report_issued(
            &NodeId::from("b"),
            vec![counts("x", 3, 0), counts("y", 1, 0)],
        );
        let round = c.round(Time::from_secs(1), second, &mut rng).clone();
        assert_eq!(
            c.outstanding_elsewhere(&NodeId::from("a"), &round),
            vec![counts("x", 3, 0), counts("y", 1, 0)]
        );
        assert_eq!(
            c.outstanding_elsewhere(&NodeId::from("b"), &round),
            vec![counts("x", 2, 1)]
        );
        assert_eq!(
            c.outstanding_elsewhere(&NodeId::from("c"), &round),
            vec![counts("x", 5, 1), counts("y", 1, 0)]
        );
        // A lost issuer's containers no longer count at the next round (within the round they
        // still do: over-counting another issuer's work only makes quotas stricter).
        c.remove_node(&NodeId::from("b"));
        let round = c.round(Time::from_secs(2), second, &mut rng).clone();
        assert_eq!(
            c.outstanding_elsewhere(&NodeId::from("c"), &round),
            vec![counts("x", 2, 1)]
        );
    }
}

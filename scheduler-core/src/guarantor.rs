//! The central scheduler for GUARANTEED containers (Mercury §4.2 "Placement of GUARANTEED
//! containers"): it allocates a GUARANTEED container on a node if and only if that node has
//! sufficient resources, tracking allocations and releases per node, and delays asks until
//! resources become available. It never over-commits a node with GUARANTEED work.
//!
//! Which node an ask goes to is a [`GuaranteedPlacer`]; [`BestFit`] is the default here, and the
//! 3Sigma/Morpheus placement plugs in behind the same trait.

use crate::ids::ContainerIdMinter;
use crate::protocol::app::Locality;
use crate::token::TokenBody;
use crate::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// A node as the guarantor sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GuarantorNode {
    pub node_id: NodeId,
    pub rack: String,
    pub capacity: Resources,
    /// Sum of GUARANTEED grants on the node (granted-but-unstarted included).
    pub guaranteed: Resources,
}

impl GuarantorNode {
    pub fn free(&self) -> Resources {
        self.capacity.saturating_sub(&self.guaranteed)
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
}

/// Chooses the node for one GUARANTEED container among those that fit.
pub trait GuaranteedPlacer: Send {
    fn name(&self) -> &'static str;
    /// Index into `nodes` of the chosen node; every candidate passed has room for the ask.
    fn choose(&mut self, ask: &GuaranteedAsk, candidates: &[&GuarantorNode]) -> Option<usize>;
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
}

impl GuarantorError {
    pub fn retryable(&self) -> bool {
        matches!(self, GuarantorError::NoCapacityForPromotion { .. })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Grant {
    node: NodeId,
    app: AppId,
    resources: Resources,
    /// Expiry of the unstarted grant (ms); `None` once the node reported it.
    pending_until_ms: Option<u64>,
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

/// The guarantor's state: nodes, GUARANTEED grants and the pending asks.
pub struct Guarantor {
    config: GuarantorConfig,
    placer: Box<dyn GuaranteedPlacer>,
    nodes: BTreeMap<NodeId, GuarantorNode>,
    grants: HashMap<ContainerId, Grant>,
    pending: VecDeque<GuaranteedAsk>,
    minter: ContainerIdMinter,
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
            nodes: BTreeMap::new(),
            grants: HashMap::new(),
            pending: VecDeque::new(),
            minter: ContainerIdMinter::resume(0, last_seq),
        }
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
        self.pending.iter().map(|a| a.count as u64).sum()
    }

    pub fn node(&self, id: &NodeId) -> Option<&GuarantorNode> {
        self.nodes.get(id)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &GuarantorNode> {
        self.nodes.values()
    }

    /// Add or re-add a node. GUARANTEED grants known on it are kept (a re-join after a network
    /// blip must not double-book); the node's capacity is updated.
    pub fn add_node(&mut self, node_id: NodeId, rack: String, capacity: Resources) {
        let guaranteed = self
            .grants
            .values()
            .filter(|g| g.node == node_id)
            .fold(Resources::ZERO, |acc, g| acc.saturating_add(&g.resources));
        self.nodes.insert(
            node_id.clone(),
            GuarantorNode {
                node_id,
                rack,
                capacity,
                guaranteed,
            },
        );
    }

    /// A node is gone: its grants are dropped. Returns (container, app) of each.
    pub fn remove_node(&mut self, node_id: &NodeId) -> Vec<(ContainerId, AppId)> {
        self.nodes.remove(node_id);
        let lost: Vec<ContainerId> = self
            .grants
            .iter()
            .filter(|(_, g)| &g.node == node_id)
            .map(|(id, _)| *id)
            .collect();
        lost.into_iter()
            .filter_map(|id| self.grants.remove(&id).map(|g| (id, g.app)))
            .collect()
    }

    /// Queue an ask. Refused at once if no node could ever hold one container of it.
    pub fn submit(&mut self, ask: GuaranteedAsk) -> Result<(), GuarantorError> {
        if ask.count == 0 || ask.resources.is_zero() {
            return Err(GuarantorError::Empty);
        }
        if !self
            .nodes
            .values()
            .any(|n| ask.resources.fits_in(&n.capacity))
        {
            let largest = self
                .nodes
                .values()
                .map(|n| n.capacity)
                .max_by_key(|c| (c.memory_mib, c.cpu_millis))
                .unwrap_or_default();
            return Err(GuarantorError::LargerThanAnyNode {
                asked: ask.resources,
                largest,
            });
        }
        self.pending.push_back(ask);
        Ok(())
    }

    /// Drop the pending containers of an ask (the application went away).
    pub fn cancel(&mut self, ask_key: u64) -> u32 {
        let mut n = 0;
        self.pending.retain(|a| {
            if a.ask_key == ask_key {
                n += a.count;
                false
            } else {
                true
            }
        });
        n
    }

    fn candidates<'a>(
        nodes: &'a BTreeMap<NodeId, GuarantorNode>,
        ask: &GuaranteedAsk,
    ) -> Vec<&'a GuarantorNode> {
        let fits: Vec<&GuarantorNode> = nodes
            .values()
            .filter(|n| ask.resources.fits_in(&n.free()))
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

    /// Place whatever pending containers fit now, in arrival order; an ask that does not fit
    /// does not block later ones. `now_ms` is the wall clock for token expiry.
    pub fn schedule(&mut self, now_ms: u64) -> Vec<GuaranteedPlacement> {
        let mut out = Vec::new();
        let mut still_pending = VecDeque::with_capacity(self.pending.len());
        while let Some(mut ask) = self.pending.pop_front() {
            while ask.count > 0 {
                let chosen = {
                    let cands = Self::candidates(&self.nodes, &ask);
                    self.placer
                        .choose(&ask, &cands)
                        .map(|i| cands[i].node_id.clone())
                };
                let Some(node_id) = chosen else { break };
                ask.count -= 1;
                out.push(self.grant(now_ms, &ask, node_id, ask.count));
            }
            if ask.count > 0 {
                still_pending.push_back(ask);
            }
        }
        self.pending = still_pending;
        out
    }

    /// Place pending containers on one node only, in ask arrival order, while they fit: the
    /// heartbeat-driven allocation of a YARN-like central scheduler (Mercury §7.1 baseline, and
    /// YARN's `nodeUpdate`), where a node's free capacity is considered only when that node
    /// heartbeats. An ask that does not fit does not block later ones; the scan stops as soon as
    /// the node has no capacity left. The placer is not consulted: the node is
    /// given. Locality is honoured as in [`Guarantor::schedule`]: an ask with a non-relaxed
    /// preference for other nodes or racks is skipped.
    pub fn schedule_on_node(&mut self, now_ms: u64, node_id: &NodeId) -> Vec<GuaranteedPlacement> {
        let mut out = Vec::new();
        let Some(node) = self.nodes.get(node_id) else {
            return out;
        };
        let (rack, capacity) = (node.rack.clone(), node.capacity);
        let mut free = node.free();
        let mut index = 0;
        while index < self.pending.len() {
            if free.is_zero() {
                break;
            }
            let ask = &self.pending[index];
            if !ask.resources.fits_in(&capacity)
                || !ask.resources.fits_in(&free)
                || !Self::locality_allows(ask, node_id, &rack)
            {
                index += 1;
                continue;
            }
            let mut ask = self.pending[index].clone();
            while ask.count > 0 && ask.resources.fits_in(&free) {
                ask.count -= 1;
                free = free.saturating_sub(&ask.resources);
                out.push(self.grant(now_ms, &ask, node_id.clone(), ask.count));
            }
            if ask.count == 0 {
                self.pending.remove(index);
            } else {
                self.pending[index].count = ask.count;
                index += 1;
            }
        }
        out
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
    ) -> GuaranteedPlacement {
        let node = self.nodes.get_mut(&node_id).expect("candidate node exists");
        node.guaranteed = node.guaranteed.saturating_add(&ask.resources);
        let container_id = self.minter.next_id();
        let expires_at_ms = now_ms.saturating_add(self.config.token_ttl_ms);
        self.grants.insert(
            container_id,
            Grant {
                node: node_id.clone(),
                app: ask.app_id.clone(),
                resources: ask.resources,
                pending_until_ms: Some(expires_at_ms),
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
                job_submit_time_ms: ask.job_submit_time_ms.min(now_ms),
                priority: ask.priority,
                runtime_estimate_ms: ask.runtime_estimate_ms,
                expires_at_ms,
                key_id: 0,
            },
        }
    }

    /// The node accepted a GUARANTEED container: it no longer expires.
    pub fn on_started(&mut self, id: ContainerId) {
        if let Some(g) = self.grants.get_mut(&id) {
            g.pending_until_ms = None;
        }
    }

    /// A GUARANTEED container ended or was released: free its capacity. Idempotent.
    pub fn on_finished(&mut self, id: ContainerId) -> bool {
        let Some(g) = self.grants.remove(&id) else {
            return false;
        };
        if let Some(n) = self.nodes.get_mut(&g.node) {
            n.guaranteed = n.guaranteed.saturating_sub(&g.resources);
        }
        true
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

    /// The application a GUARANTEED grant (started or not) belongs to.
    pub fn grant_owner(&self, id: ContainerId) -> Option<&AppId> {
        self.grants.get(&id).map(|g| &g.app)
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
    /// GUARANTEED capacity for it; then the capacity is booked.
    pub fn promote(
        &mut self,
        id: ContainerId,
        node_id: &NodeId,
        app: &AppId,
        resources: Resources,
    ) -> Result<(), GuarantorError> {
        if self.grants.contains_key(&id) {
            return Err(GuarantorError::AlreadyGuaranteed(id));
        }
        let node = self
            .nodes
            .get_mut(node_id)
            .ok_or_else(|| GuarantorError::UnknownNode(node_id.0.clone()))?;
        if !resources.fits_in(&node.free()) {
            return Err(GuarantorError::NoCapacityForPromotion {
                node: node_id.0.clone(),
                free: node.free(),
                needed: resources,
            });
        }
        node.guaranteed = node.guaranteed.saturating_add(&resources);
        self.grants.insert(
            id,
            Grant {
                node: node_id.clone(),
                app: app.clone(),
                resources,
                pending_until_ms: None,
            },
        );
        Ok(())
    }

    /// Mercury §4.3 resource policing, first form: what a node may give QUEUEABLE work is what
    /// GUARANTEED work does not hold there.
    pub fn queueable_limit(&self, node_id: &NodeId) -> Option<Resources> {
        self.nodes.get(node_id).map(|n| n.free())
    }

    /// No node over-committed with GUARANTEED work, and books equal grants.
    pub fn check_invariants(&self) -> Result<(), String> {
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
        Ok(())
    }
}

//! The guarantor's nodes ordered by free GUARANTEED capacity, so that a best-fit placement looks
//! at O(log n) entries plus the few groups of nodes near the answer instead of scoring every node
//! (issue 17: on 10,000 nodes the event-driven guarantor spent 72 % of a simulated day scoring
//! nodes).
//!
//! Best fit (Mercury §4.2 places GUARANTEED work centrally; our placers take the node left with
//! the least free dominant share) needs, for an ask `r`, the node minimising
//! `L(n) = dominant_share(free(n) − r)` among the nodes where `r` fits. No single key orders `L`
//! for every `r`, but the node's free dominant share `f(n)` bounds it on both sides:
//! `f(n) − a(n) ≤ L(n) ≤ f(n)` with `a(n) = dominant_share(r)` against the node's capacity, and a
//! node where `r` fits has `f(n) ≥ a(n)`. So nodes are kept in `f` order; a search starts at the
//! least `f` any node could fit `r` with and stops once `f − max a` exceeds the best `L` found.
//! Nodes with equal free and capacity vectors leave the same share after any ask, so they form
//! one group, scored once, whose members are kept in name order (the placers break ties by name).

use crate::ids::NodeId;
use crate::resources::Resources;
use std::collections::{BTreeMap, BTreeSet};

/// Rounding slack of the stopping bound: `f − a` and `L` are computed by different float
/// operations from the same integers, so they may differ from the exact values by an ulp or two.
const BOUND_SLACK: f64 = 1e-9;

/// Where a node sits in the index: its free dominant share first (the search order), then the
/// vectors that decide its score for any ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FitKey {
    /// `f64::to_bits` of the free dominant share: shares are finite and non-negative, and such
    /// floats order as their bits do.
    free_share_bits: u64,
    free: (u64, u64),
    capacity: (u64, u64),
}

impl FitKey {
    pub(crate) fn of(free: Resources, capacity: Resources) -> FitKey {
        FitKey {
            free_share_bits: free.dominant_share(&capacity).to_bits(),
            free: (free.cpu_millis, free.memory_mib),
            capacity: (capacity.cpu_millis, capacity.memory_mib),
        }
    }

    fn free_share(&self) -> f64 {
        f64::from_bits(self.free_share_bits)
    }

    fn free(&self) -> Resources {
        Resources::new(self.free.0, self.free.1)
    }

    fn capacity(&self) -> Resources {
        Resources::new(self.capacity.0, self.capacity.1)
    }

    /// The least key with a free share of at least `share`.
    fn first_with_share(share: f64) -> FitKey {
        FitKey {
            free_share_bits: share.to_bits(),
            free: (0, 0),
            capacity: (0, 0),
        }
    }
}

/// Nodes grouped by [`FitKey`], with the multiset of node capacities per resource (the search's
/// bounds need the smallest and largest).
#[derive(Debug, Default)]
pub(crate) struct FitIndex {
    groups: BTreeMap<FitKey, BTreeSet<NodeId>>,
    cpu_capacities: BTreeMap<u64, usize>,
    memory_capacities: BTreeMap<u64, usize>,
    len: usize,
}

impl FitIndex {
    pub(crate) fn insert(&mut self, key: FitKey, node: NodeId) {
        if self.groups.entry(key).or_default().insert(node) {
            *self.cpu_capacities.entry(key.capacity.0).or_default() += 1;
            *self.memory_capacities.entry(key.capacity.1).or_default() += 1;
            self.len += 1;
        }
    }

    pub(crate) fn remove(&mut self, key: FitKey, node: &NodeId) {
        let Some(group) = self.groups.get_mut(&key) else {
            return;
        };
        if !group.remove(node) {
            return;
        }
        if group.is_empty() {
            self.groups.remove(&key);
        }
        for (capacities, capacity) in [
            (&mut self.cpu_capacities, key.capacity.0),
            (&mut self.memory_capacities, key.capacity.1),
        ] {
            if let Some(count) = capacities.get_mut(&capacity) {
                *count -= 1;
                if *count == 0 {
                    capacities.remove(&capacity);
                }
            }
        }
        self.len -= 1;
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `node` is indexed under `key`.
    pub(crate) fn holds(&self, key: &FitKey, node: &NodeId) -> bool {
        self.groups.get(key).is_some_and(|g| g.contains(node))
    }

    /// The best fit for `ask` among the indexed nodes where it fits and `eligible` holds: the
    /// least dominant share left free after placing it, ties to the first name. Exactly what
    /// scoring every node in name order with `min_by` gives.
    pub(crate) fn best_fit(
        &self,
        ask: &Resources,
        mut eligible: impl FnMut(&NodeId) -> bool,
    ) -> Option<NodeId> {
        let (Some(least_share), Some(most_share)) = (
            self.ask_share_bound(ask, Bound::Largest),
            self.ask_share_bound(ask, Bound::Smallest),
        ) else {
            return None; // no node is large enough
        };
        let mut best: Option<(f64, &NodeId)> = None;
        for (key, names) in self.groups.range(FitKey::first_with_share(least_share)..) {
            if let Some((best_left, _)) = best
                && key.free_share() - most_share > best_left + BOUND_SLACK
            {
                break; // every later node leaves at least this much more
            }
            let free = key.free();
            if !ask.fits_in(&free) {
                continue;
            }
            let left = free.saturating_sub(ask).dominant_share(&key.capacity());
            for name in names {
                match best {
                    Some((best_left, _)) if left.total_cmp(&best_left).is_gt() => break,
                    Some((best_left, best_name))
                        if left.total_cmp(&best_left).is_eq() && name >= best_name =>
                    {
                        break;
                    }
                    _ => {}
                }
                if eligible(name) {
                    best = Some((left, name));
                    break; // later names of the group leave the same share
                }
            }
        }
        best.map(|(_, name)| name.clone())
    }

    /// `dominant_share(ask)` against the largest (or smallest) node capacity of each resource: a
    /// lower (or upper) bound of the ask's share on any node where it fits. `None` when some
    /// resource is asked that no node has.
    fn ask_share_bound(&self, ask: &Resources, bound: Bound) -> Option<f64> {
        let mut share = 0.0_f64;
        for (asked, capacities) in [
            (ask.cpu_millis, &self.cpu_capacities),
            (ask.memory_mib, &self.memory_capacities),
        ] {
            if asked == 0 {
                continue;
            }
            // Nodes without any of this resource cannot take the ask: only positive capacities.
            let mut positive = capacities.range(1..).map(|(c, _)| *c);
            let capacity = match bound {
                Bound::Largest => positive.next_back()?,
                Bound::Smallest => positive.next()?,
            };
            share = share.max(asked as f64 / capacity as f64);
        }
        Some(share.min(1.0))
    }
}

#[derive(Clone, Copy)]
enum Bound {
    Largest,
    Smallest,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    /// Every node scored, in name order, as the placers do without the index.
    fn best_fit_by_scan(
        nodes: &[(NodeId, Resources, Resources)],
        ask: &Resources,
        eligible: impl Fn(&NodeId) -> bool,
    ) -> Option<NodeId> {
        let mut sorted: Vec<_> = nodes.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        sorted
            .iter()
            .filter(|(name, free, _)| ask.fits_in(free) && eligible(name))
            .enumerate()
            .map(|(i, (name, free, capacity))| {
                (free.saturating_sub(ask).dominant_share(capacity), i, name)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(.., name)| name.clone())
    }

    #[test]
    fn the_index_finds_what_scoring_every_node_finds() {
        let mut rng = StdRng::seed_from_u64(17);
        for round in 0..300 {
            let node_count = rng.random_range(0..60);
            let heterogeneous = round % 3 == 0;
            let mut nodes = Vec::new();
            let mut index = FitIndex::default();
            for i in 0..node_count {
                let capacity = if heterogeneous {
                    Resources::new(
                        1000 * rng.random_range(0..5_u64),
                        1024 * rng.random_range(0..5_u64),
                    )
                } else {
                    Resources::new(4000, 8192)
                };
                // Free in coarse steps so that many nodes share a group.
                let free = Resources::new(
                    capacity.cpu_millis / 4 * rng.random_range(0..5_u64),
                    capacity.memory_mib / 4 * rng.random_range(0..5_u64),
                );
                let name = NodeId::new(format!("node-{:03}", (i * 37) % 101));
                index.insert(FitKey::of(free, capacity), name.clone());
                nodes.push((name, free, capacity));
            }
            assert_eq!(index.len(), nodes.len());
            let banned: Vec<bool> = (0..101).map(|_| rng.random_bool(0.2)).collect();
            let eligible = |n: &NodeId| {
                let number: usize = n.as_str()[5..].parse().unwrap();
                !banned[number]
            };
            for _ in 0..20 {
                let ask = Resources::new(
                    250 * rng.random_range(0..12_u64),
                    512 * rng.random_range(0..12_u64),
                );
                assert_eq!(
                    index.best_fit(&ask, eligible),
                    best_fit_by_scan(&nodes, &ask, eligible),
                    "round {round}, ask {ask}"
                );
            }
        }
    }

    #[test]
    fn removed_nodes_are_not_chosen_and_capacities_follow_membership() {
        let mut index = FitIndex::default();
        let small = Resources::new(1000, 1024);
        let large = Resources::new(8000, 16384);
        let (a, b) = (NodeId::new("a"), NodeId::new("b"));
        index.insert(FitKey::of(small, small), a.clone());
        index.insert(FitKey::of(large, large), b.clone());
        let ask = Resources::new(500, 512);
        assert_eq!(index.best_fit(&ask, |_| true), Some(a.clone()));
        index.remove(FitKey::of(small, small), &a);
        assert_eq!(index.best_fit(&ask, |_| true), Some(b.clone()));
        assert!(!index.holds(&FitKey::of(small, small), &a));
        index.remove(FitKey::of(large, large), &b);
        assert_eq!(index.len(), 0);
        assert!(index.cpu_capacities.is_empty() && index.memory_capacities.is_empty());
        assert_eq!(index.best_fit(&ask, |_| true), None);
    }

    #[test]
    fn an_idle_homogeneous_cluster_is_one_group_and_the_first_name_wins() {
        let mut index = FitIndex::default();
        let capacity = Resources::new(4000, 8192);
        for i in (0..1000).rev() {
            index.insert(
                FitKey::of(capacity, capacity),
                NodeId::new(format!("n{i:04}")),
            );
        }
        assert_eq!(index.groups.len(), 1);
        let ask = Resources::new(1000, 1024);
        assert_eq!(
            index.best_fit(&ask, |n| n.as_str() != "n0000"),
            Some(NodeId::new("n0001"))
        );
    }
}

//! The guarantor finds nodes by name through a hash index while placers see them in name
//! order. A random sequence of joins, re-joins, removals, load reports, asks, placements and
//! finishes is checked after every step against a brute-force model: the nodes and their order,
//! every lookup, the books (grants) and the chosen node: best fit against the model, and the
//! QUEUEABLE-aware placer's own scoring of every candidate against the guarantor's fit index.

mod common;

use common::guaranteed_ask as ask;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::guarantor::{
    BestFit, GuaranteedPlacement, GuaranteedPlacer, Guarantor, GuarantorConfig, GuarantorNode,
    QueueableAware, QueueableLoad,
};
use scheduler_core::{ContainerId, NodeId, Resources};
use std::collections::BTreeMap;

/// What the guarantor should hold: per node name, (rack, capacity, queueable load), and the
/// live grants (container → (node, resources)).
#[derive(Default)]
struct Model {
    nodes: BTreeMap<NodeId, (String, Resources, QueueableLoad)>,
    grants: BTreeMap<ContainerId, (NodeId, Resources)>,
}

impl Model {
    fn booked(&self, node: &NodeId) -> Resources {
        self.grants
            .values()
            .filter(|(n, _)| n == node)
            .fold(Resources::ZERO, |acc, (_, r)| acc.saturating_add(r))
    }

    fn check(&self, g: &Guarantor, names: &[NodeId]) {
        g.check_invariants().unwrap();
        let seen: Vec<&GuarantorNode> = g.nodes().collect();
        let expected: Vec<&NodeId> = self.nodes.keys().collect();
        assert_eq!(
            seen.iter().map(|n| &n.node_id).collect::<Vec<_>>(),
            expected,
            "nodes in name order"
        );
        for name in names {
            match (g.node(name), self.nodes.get(name)) {
                (None, None) => {}
                (Some(n), Some((rack, capacity, load))) => {
                    assert_eq!(&n.node_id, name);
                    assert_eq!(&n.rack, rack);
                    assert_eq!(n.capacity, *capacity);
                    assert_eq!(n.queueable, *load);
                    assert_eq!(n.guaranteed, self.booked(name), "{name}");
                    assert_eq!(g.queueable_limit(name), Some(n.free()));
                }
                (found, wanted) => panic!("{name}: found {found:?}, wanted {wanted:?}"),
            }
        }
    }

    /// The node best fit would choose for one container of `r` (least free dominant share
    /// left, then name order) among the nodes `g` is not draining.
    fn best_fit(&self, g: &Guarantor, r: &Resources) -> Option<NodeId> {
        self.nodes
            .iter()
            .filter(|(name, _)| !g.is_draining(name))
            .filter_map(|(name, (_, capacity, _))| {
                let free = capacity.saturating_sub(&self.booked(name));
                r.fits_in(&free)
                    .then(|| (free.saturating_sub(r).dominant_share(capacity), name))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, name)| name.clone())
    }

    fn record(&mut self, placements: &[GuaranteedPlacement]) {
        for p in placements {
            let b = &p.token_body;
            self.grants
                .insert(b.container_id, (b.node_id.clone(), b.resources));
        }
    }
}

fn run(seed: u64, queueable_aware: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let names: Vec<NodeId> = (0..40).map(|i| NodeId::new(format!("n{i}"))).collect();
    let placer: Box<dyn scheduler_core::guarantor::GuaranteedPlacer> = if queueable_aware {
        Box::new(QueueableAware::default())
    } else {
        Box::new(BestFit)
    };
    let mut g = Guarantor::new(GuarantorConfig::default(), placer, 0);
    let mut model = Model::default();
    let mut key = 0;
    for step in 0..3_000 {
        let name = names[rng.random_range(0..names.len())].clone();
        match rng.random_range(0..13) {
            // Join or re-join (bookings on the node are kept; each name has its own capacity,
            // so a re-join does not over-commit).
            0..=2 => {
                let i = names.iter().position(|n| n == &name).unwrap() as u64;
                let capacity = Resources::new(1_000 * (1 + i % 8), 1_024 * (1 + i * 5 % 7));
                let rack = format!("r{}", rng.random_range(0..3));
                g.add_node(name.clone(), rack.clone(), capacity);
                model
                    .nodes
                    .insert(name, (rack, capacity, QueueableLoad::default()));
            }
            3 => {
                let mut lost: Vec<ContainerId> =
                    g.remove_node(&name).into_iter().map(|(c, _)| c).collect();
                lost.sort();
                let expected: Vec<ContainerId> = model
                    .grants
                    .iter()
                    .filter(|(_, (n, _))| n == &name)
                    .map(|(c, _)| *c)
                    .collect();
                assert_eq!(lost, expected, "step {step}");
                model.grants.retain(|_, (n, _)| n != &name);
                model.nodes.remove(&name);
            }
            4 => {
                let load = QueueableLoad {
                    running: Resources::new(500 * rng.random_range(0..8u64), 512),
                    queued_count: rng.random_range(0..3),
                };
                let known = g.report_queueable_load(&name, load);
                assert_eq!(known, model.nodes.contains_key(&name));
                if let Some(n) = model.nodes.get_mut(&name) {
                    n.2 = load;
                }
            }
            // One container, placed at once: best fit must pick what the model picks.
            5..=6 => {
                let r = Resources::new(
                    500 * rng.random_range(1..6u64),
                    512 * rng.random_range(1..6u64),
                );
                key += 1;
                let alone = g.pending_asks() == 0;
                if g.submit(ask(key, r, 1)).is_err() {
                    continue;
                }
                // QUEUEABLE-aware: what its `choose` makes of every candidate, which the
                // guarantor's fit index must reproduce without scoring them all.
                let expected = if queueable_aware {
                    let candidates: Vec<&GuarantorNode> = g
                        .nodes()
                        .filter(|n| r.fits_in(&n.free()) && !g.is_draining(&n.node_id))
                        .collect();
                    QueueableAware::default()
                        .choose(&ask(key, r, 1), &candidates)
                        .map(|i| candidates[i].node_id.clone())
                } else {
                    model.best_fit(&g, &r)
                };
                let placed = g.schedule(0);
                if alone {
                    assert_eq!(
                        placed
                            .iter()
                            .map(|p| p.token_body.node_id.clone())
                            .next_back(),
                        expected,
                        "step {step}"
                    );
                }
                model.record(&placed);
            }
            7..=8 => {
                let placed = g.schedule_on_node(rng.random_range(0..10_000), &name);
                for p in &placed {
                    assert_eq!(p.token_body.node_id, name);
                }
                model.record(&placed);
            }
            // Drain or undrain (placements must skip draining nodes, indexed or not).
            9 => {
                let draining = !g.is_draining(&name);
                g.set_draining(&name, draining);
            }
            _ => {
                let live: Vec<ContainerId> = model.grants.keys().copied().collect();
                if let Some(&c) = live.get(rng.random_range(0..live.len().max(1))) {
                    assert!(g.on_finished(c));
                    model.grants.remove(&c);
                }
            }
        }
        model.check(&g, &names);
    }
}

#[test]
fn node_index_agrees_with_a_brute_force_model_best_fit() {
    for seed in 0..4 {
        run(seed, false);
    }
}

#[test]
fn node_index_agrees_with_a_brute_force_model_queueable_aware() {
    for seed in 10..14 {
        run(seed, true);
    }
}

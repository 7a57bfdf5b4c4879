//! Scenario tests of the distributed scheduler accounting for its own placements between views
//! (no herding onto the view's first k nodes) and avoiding a node that shed work until the next
//! view. Quota invariants are checked after every step.

use rand::SeedableRng;
use rand::rngs::StdRng;
use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState};
use scheduler_core::distributed::{
    DistributedScheduler, DistributedSchedulerConfig, NodeDirectoryEntry, QueueableAsk, view_size,
};
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::{AppId, JobId, NodeId, Resources, Time};
use std::collections::{HashMap, HashSet};

const NODE_CAPACITY: Resources = Resources {
    cpu_millis: 4000,
    memory_mib: 8192,
};

fn entry(i: usize) -> NodeDirectoryEntry {
    NodeDirectoryEntry {
        node_id: NodeId::new(format!("n{i}")),
        rack: format!("r{}", i / 4),
        capacity: NODE_CAPACITY,
        app_endpoint: format!("10.0.0.{i}:7000"),
        slot: i as u32,
    }
}

/// A coordinator with `n` nodes reporting R = `r_of(i)` ms, sending views of `view` nodes, and a
/// distributed scheduler choosing among `k`, holding the coordinator's view.
struct Cluster {
    coordinator: CoordinatorState,
    scheduler: DistributedScheduler,
    rng: StdRng,
}

impl Cluster {
    fn new(n: usize, k: usize, view: usize, r_of: impl Fn(usize) -> f64) -> Cluster {
        let mut coordinator = CoordinatorState::new(
            CoordinatorConfig {
                top_k: view,
                ..Default::default()
            },
            1,
        );
        let mut issuer = 0;
        for i in 0..n {
            issuer = coordinator.join(Time::ZERO, entry(i));
            let load = QueueDelay {
                tq_ms: r_of(i),
                tr_ms: 0.0,
                tl_ms: 0.0,
            };
            coordinator.heartbeat(Time::ZERO, &entry(i).node_id, load, vec![]);
        }
        let mut rng = StdRng::seed_from_u64(11);
        let mut scheduler = DistributedScheduler::new(
            DistributedSchedulerConfig {
                top_k: k,
                token_ttl_ms: 60_000,
            },
            issuer,
        );
        scheduler.update_view(coordinator.view_for(0, Time::ZERO, &mut rng));
        Cluster {
            coordinator,
            scheduler,
            rng,
        }
    }

    /// Place one container of `estimate_ms` (a quarter of a node); returns its node.
    fn place_one(&mut self, estimate_ms: u64) -> String {
        let ask = QueueableAsk {
            app_id: AppId::from("app"),
            resources: Resources::new(1000, 1024),
            count: 1,
            priority: 0,
            locality: None,
            runtime_estimate_ms: Some(estimate_ms),
            job_id: JobId::from("j"),
            job_submit_time_ms: 0,
            replacements: Vec::new(),
        };
        let out = self
            .scheduler
            .place(0, &ask, &QueueableQuota::default(), &mut self.rng)
            .expect("placement");
        self.scheduler.quotas().check_invariants().unwrap();
        assert_eq!(out.placed.len(), 1, "{out:?}");
        out.placed[0].node_id.to_string()
    }

    fn fresh_view(&mut self) {
        let view = self.coordinator.view_for(1, Time::ZERO, &mut self.rng);
        self.scheduler.update_view(view);
    }
}

#[test]
fn view_carries_more_candidates_than_k() {
    assert_eq!(view_size(50), 200);
    assert_eq!(view_size(0), view_size(1));
    let c = Cluster::new(300, 10, view_size(10), |_| 0.0);
    assert_eq!(c.scheduler.view().top_k.len(), 40);
}

/// Herding: one view, many single-container asks. Without accounting every container goes to
/// the same k nodes; with it, each placement raises its node's estimate and the next ones go to
/// the view's other idle nodes.
#[test]
fn own_placements_spread_over_the_view_instead_of_herding_on_k_nodes() {
    let mut c = Cluster::new(60, 5, 40, |_| 0.0);
    let mut per_node: HashMap<String, u32> = HashMap::new();
    // While at least k = 5 nodes of the view are still untouched, the k least-loaded are
    // untouched ones: the first 36 containers go to 36 different nodes.
    let first: Vec<String> = (0..36).map(|_| c.place_one(2000)).collect();
    let distinct: HashSet<&String> = first.iter().collect();
    assert_eq!(distinct.len(), 36, "{first:?}");
    for node in first {
        *per_node.entry(node).or_default() += 1;
    }
    for _ in 0..84 {
        *per_node.entry(c.place_one(2000)).or_default() += 1;
    }
    // 120 containers over the 40 nodes of the view: 3 each, give or take one.
    assert_eq!(per_node.len(), 40, "{per_node:?}");
    assert!(
        per_node.values().all(|&n| (2..=4).contains(&n)),
        "{per_node:?}"
    );
}

#[test]
fn placement_raises_the_local_estimate_by_the_containers_share_of_work() {
    let mut c = Cluster::new(8, 1, 8, |i| i as f64 * 100.0);
    let node = c.place_one(2000);
    assert_eq!(node, "n0", "k = 1: the least-loaded node");
    // 2000 ms × dominant share 1/4 = 500 ms, once per peer scheduler (8 nodes, 8 peers).
    let est = c
        .scheduler
        .estimated_queue_delay_ms(&NodeId::new("n0"))
        .unwrap();
    assert!((est - 4000.0).abs() < 1e-9, "{est}");
    // n0 is now at 4 s, n1..n4 are below: the next four go there, one each.
    let next: Vec<String> = (0..4).map(|_| c.place_one(2000)).collect();
    assert_eq!(next, ["n1", "n2", "n3", "n4"]);
    // A fresh view resets the estimates to the coordinator's figures.
    c.fresh_view();
    let est = c
        .scheduler
        .estimated_queue_delay_ms(&NodeId::new("n0"))
        .unwrap();
    assert_eq!(est, 0.0);
    assert_eq!(c.place_one(2000), "n0");
}

#[test]
fn choice_stays_pseudo_random_among_the_k_least_loaded() {
    // 10 nodes at R = 0 and 30 at R = 10 s: with k = 10 and tiny containers, the choice is
    // uniform among the 10 idle ones, each of them used.
    let mut c = Cluster::new(40, 10, 40, |i| if i < 10 { 0.0 } else { 10_000.0 });
    let mut seen: HashSet<String> = HashSet::new();
    for _ in 0..200 {
        let node = c.place_one(1);
        let i: usize = node[1..].parse().unwrap();
        assert!(i < 10, "a loaded node was chosen: {node}");
        seen.insert(node);
    }
    assert_eq!(seen.len(), 10);
}

#[test]
fn a_node_that_shed_is_avoided_until_the_next_view() {
    let mut c = Cluster::new(6, 6, 6, |_| 0.0);
    let shedding = NodeId::new("n3");
    assert!(c.scheduler.avoid_until_next_view(&shedding));
    assert!(c.scheduler.is_avoided(&shedding));
    for _ in 0..60 {
        assert_ne!(c.place_one(100), "n3");
    }
    // The next view forgets it.
    c.fresh_view();
    assert!(!c.scheduler.is_avoided(&shedding));
    let used: HashSet<String> = (0..60).map(|_| c.place_one(100)).collect();
    assert!(used.contains("n3"), "{used:?}");
    // A node outside the view is not tracked.
    assert!(!c.scheduler.avoid_until_next_view(&NodeId::new("elsewhere")));
}

#[test]
fn an_avoided_node_is_still_used_when_it_is_the_only_candidate() {
    let mut c = Cluster::new(1, 5, 5, |_| 0.0);
    assert!(c.scheduler.avoid_until_next_view(&NodeId::new("n0")));
    assert_eq!(c.place_one(100), "n0");
}

/// Herding between schedulers: every scheduler holds the same round's view, so a burst that
/// one of them piles on the view's least-loaded nodes is piled there by its peers too (the
/// simulator's only-Q runs left 31% of the cores idle on nodes no view pointed at while others
/// queued 190 containers; docs/experiments/mercury/diagnosis.md). A scheduler therefore counts
/// each of its placements as if every peer made it: a burst of as many containers as the view
/// has nodes goes one per node, in order of R, even where R differs by far more than one
/// container's work.
#[test]
fn a_burst_spreads_over_the_whole_view_as_if_every_peer_placed_it_too() {
    // 40 nodes (so 40 peer schedulers), R = 0, 1, …, 39 s; a view of 20, k = 5; each container
    // adds 500 ms of whole-node work (2 s on a quarter of a node).
    let mut c = Cluster::new(40, 5, 20, |i| i as f64 * 1000.0);
    let burst: Vec<String> = (0..20).map(|_| c.place_one(2000)).collect();
    // While k = 5 untouched nodes remain, the k least loaded are untouched: the first 16 go to
    // 16 different nodes; no node gets a third.
    let distinct: HashSet<&String> = burst[..16].iter().collect();
    assert_eq!(distinct.len(), 16, "{burst:?}");
    let mut per_node: HashMap<&String, u32> = HashMap::new();
    for node in &burst {
        *per_node.entry(node).or_default() += 1;
    }
    assert!(per_node.values().all(|&n| n <= 2), "{burst:?}");
    // The estimate of a used node is its R plus 40 × 500 ms.
    let est = c
        .scheduler
        .estimated_queue_delay_ms(&NodeId::new("n0"))
        .unwrap();
    assert!((est - 20_000.0).abs() < 1e-9, "{est}");
    // Over a longer burst every node of the view takes its share.
    let again: HashSet<String> = (0..40).map(|_| c.place_one(2000)).collect();
    assert_eq!(again.len(), 20, "{again:?}");
}

/// The live path of a return (issue 15): a node returns a queued QUEUEABLE container that long
/// GUARANTEED work holds back (`NodeRuntime::shed_held_by_guaranteed`), the app asks again
/// naming it (`allocate.replaces_shed`), and the scheduler that granted it (on another worker,
/// which has not heard of the shed) avoids that node until its next view, as the simulator's
/// schedulers do when the node sheds. Naming someone else's container, or one whose end the
/// scheduler already heard of (with a newer view), avoids nothing.
#[test]
fn a_re_ask_naming_a_returned_container_avoids_its_node_until_the_next_view() {
    use scheduler_core::coordinator::{ContainerNotice, NoticeKind};
    use scheduler_core::distributed::replacement_wait_bound_ms;
    use scheduler_core::issued::IssuedContainers;
    use scheduler_core::node::{ContainerSpec, NodeEvent, NodeRuntime, NodeRuntimeConfig};
    use scheduler_core::protocol::app::ShedContainer;
    use scheduler_core::{ContainerId, ContainerType, KillReason};

    let mut c = Cluster::new(6, 6, 6, |_| 0.0);
    let mut issued = IssuedContainers::default();
    let app = AppId::from("app");
    let ask = QueueableAsk {
        app_id: app.clone(),
        resources: Resources::new(1000, 1024),
        count: 1,
        priority: 0,
        locality: None,
        runtime_estimate_ms: Some(2_000),
        job_id: JobId::from("j"),
        job_submit_time_ms: 0,
        replacements: Vec::new(),
    };
    let out = c
        .scheduler
        .place(0, &ask, &QueueableQuota::default(), &mut c.rng)
        .expect("placement");
    let placed = out.placed[0].clone();
    issued.issued(&placed.node_id, placed.container_id, 0);

    // On its node, GUARANTEED work fills every core for 60 s before the grant arrives: the 2-s
    // container would wait 60 s where any other node of the view starts it at once.
    let now = Time::ZERO;
    let mut node = NodeRuntime::new(NodeRuntimeConfig::new(NODE_CAPACITY), now);
    for seq in 0..4 {
        node.submit(
            now,
            ContainerSpec {
                id: ContainerId::new(0, seq),
                app_id: AppId::from("batch"),
                job_id: JobId::from("long"),
                job_submit_time: now,
                priority: 0,
                container_type: ContainerType::Guaranteed,
                resources: Resources::new(1000, 1024),
                runtime_estimate_ms: Some(60_000),
                version: 0,
                times_returned: 0,
            },
        )
        .expect("GUARANTEED container accepted");
    }
    node.submit(now, ContainerSpec::granted_by(&placed.token_body))
        .expect("QUEUEABLE container queued");
    node.drain_events();
    let bound = replacement_wait_bound_ms(&c.scheduler.view().top_k, &placed.node_id, 6, 1_000)
        .expect("the view names other nodes");
    assert_eq!(
        node.shed_held_by_guaranteed(now, bound),
        vec![placed.container_id]
    );
    assert!(node.drain_events().iter().any(|e| matches!(
        e,
        NodeEvent::Killed { id, reason: KillReason::Shed, .. } if *id == placed.container_id
    )));

    let shed = [ShedContainer {
        container_id: placed.container_id,
        node_id: placed.node_id.clone(),
    }];
    // Another app naming it changes nothing.
    assert_eq!(
        issued.avoid_nodes_that_shed(&mut c.scheduler, &AppId::from("other"), &shed),
        0
    );
    assert!(!c.scheduler.is_avoided(&placed.node_id));
    // A container this scheduler did not grant there changes nothing either.
    let elsewhere = [ShedContainer {
        container_id: placed.container_id,
        node_id: NodeId::new(if placed.node_id.as_str() == "n0" {
            "n1"
        } else {
            "n0"
        }),
    }];
    assert_eq!(
        issued.avoid_nodes_that_shed(&mut c.scheduler, &app, &elsewhere),
        0
    );
    // The owner's re-ask: the re-placement and every other one this view goes elsewhere.
    assert_eq!(
        issued.avoid_nodes_that_shed(&mut c.scheduler, &app, &shed),
        1
    );
    for _ in 0..30 {
        assert_ne!(c.place_one(2_000), placed.node_id.as_str());
    }
    // The next view ends it.
    c.fresh_view();
    assert!(!c.scheduler.is_avoided(&placed.node_id));
    // Once the scheduler heard the container ended (its notice comes with a view newer than the
    // shed), naming it avoids nothing.
    let notice = ContainerNotice {
        container_id: placed.container_id,
        node_id: placed.node_id.clone(),
        kind: NoticeKind::Finished,
    };
    issued.on_notice(c.scheduler.quotas_mut(), &notice);
    assert_eq!(
        issued.avoid_nodes_that_shed(&mut c.scheduler, &app, &shed),
        0
    );
    assert!(!c.scheduler.is_avoided(&placed.node_id));
    c.scheduler.quotas().check_invariants().unwrap();
}

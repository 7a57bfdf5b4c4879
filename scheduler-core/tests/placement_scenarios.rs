//! Scenario tests of QUEUEABLE distributed placement (Mercury §4.1, §4.2) and GUARANTEED central
//! placement (§4.2), with invariants checked after every step.

mod common;

use rand::SeedableRng;
use rand::rngs::StdRng;
use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState};
use scheduler_core::distributed::{
    DistributedScheduler, DistributedSchedulerConfig, NodeDirectoryEntry, PlacementError,
    QueueableAsk,
};
use scheduler_core::guarantor::{
    BestFit, GuaranteedAsk, Guarantor, GuarantorConfig, GuarantorError,
};
use scheduler_core::protocol::app::Locality;
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources, Time};
use std::collections::{HashMap, HashSet};

fn node(i: usize, rack: usize) -> NodeDirectoryEntry {
    NodeDirectoryEntry {
        node_id: NodeId::new(format!("n{i}")),
        rack: format!("r{rack}"),
        capacity: Resources::new(4000, 8192),
        app_endpoint: format!("10.0.0.{i}:7000"),
        slot: i as u32,
    }
}

/// A coordinator with `n` nodes (4 per rack) whose R grows with the node index, and a
/// distributed scheduler holding its view.
fn cluster(n: usize, k: usize) -> (CoordinatorState, DistributedScheduler, StdRng) {
    let mut rng = StdRng::seed_from_u64(7);
    let mut coord = CoordinatorState::new(
        CoordinatorConfig {
            top_k: k,
            ..Default::default()
        },
        1,
    );
    for i in 0..n {
        coord.join(Time::ZERO, node(i, i / 4));
        let load = QueueDelay {
            tq_ms: i as f64 * 10.0,
            tr_ms: 0.0,
            tl_ms: 0.0,
        };
        coord.heartbeat(Time::ZERO, &NodeId::new(format!("n{i}")), load, vec![]);
    }
    let issuer = coord.join(Time::ZERO, node(999, 99));
    let mut ds = DistributedScheduler::new(
        DistributedSchedulerConfig {
            top_k: k,
            token_ttl_ms: 60_000,
        },
        issuer,
    );
    ds.update_view(coord.view_for(0, Time::ZERO, &mut rng));
    (coord, ds, rng)
}

fn ask(count: u32, locality: Option<Locality>) -> QueueableAsk {
    QueueableAsk {
        app_id: AppId::from("app"),
        resources: Resources::new(1000, 1024),
        count,
        priority: 0,
        locality,
        runtime_estimate_ms: Some(2000),
        job_id: JobId::from("j"),
        job_submit_time_ms: 5,
        replacements: Vec::new(),
    }
}

#[test]
fn places_only_on_top_k_and_never_twice_per_node_in_a_round() {
    let (_, mut ds, mut rng) = cluster(40, 5);
    let out = ds
        .place(1_000, &ask(8, None), &QueueableQuota::default(), &mut rng)
        .unwrap();
    ds.quotas().check_invariants().unwrap();
    // n999 joined with R = 0 too, so the least-loaded five are n999 and n0..n3.
    let allowed: HashSet<&str> = ["n999", "n0", "n1", "n2", "n3"].into_iter().collect();
    let nodes: Vec<&str> = out.placed.iter().map(|p| p.node_id.as_str()).collect();
    assert_eq!(nodes.len(), 5, "one per top-k node per round");
    assert!(nodes.iter().all(|n| allowed.contains(n)), "{nodes:?}");
    assert_eq!(nodes.iter().collect::<HashSet<_>>().len(), 5);
    assert_eq!(out.unplaced, 3);
    assert!(
        out.unplaced_reason
            .unwrap()
            .contains("one off-locality container")
    );
    // Tokens bind what was granted, with expiry from the scheduler's TTL.
    let p = &out.placed[0];
    assert_eq!(p.token_body.container_type, ContainerType::Queueable);
    assert_eq!(p.token_body.expires_at_ms, 61_000);
    assert_eq!(p.token_body.container_id.issuer(), ds.issuer());
    assert_eq!(
        p.node_endpoint,
        format!("10.0.0.{}:7000", &p.node_id.as_str()[1..])
    );
}

#[test]
fn random_choice_spreads_over_all_top_k_nodes() {
    let (_, mut ds, mut rng) = cluster(40, 10);
    let mut seen: HashMap<String, u32> = HashMap::new();
    for _ in 0..500 {
        let out = ds
            .place(1_000, &ask(1, None), &QueueableQuota::default(), &mut rng)
            .unwrap();
        *seen.entry(out.placed[0].node_id.to_string()).or_default() += 1;
    }
    assert_eq!(seen.len(), 10, "{seen:?}");
    assert!(seen.values().all(|&c| c > 20), "roughly uniform: {seen:?}");
}

#[test]
fn locality_node_then_rack_then_relax() {
    // The view holds the five least loaded: n999 and n0..n3 (rack r0).
    let (_, mut ds, mut rng) = cluster(40, 5);
    let q = QueueableQuota::default();
    // Node-local may stack on one node of the view.
    let loc = Locality {
        nodes: vec!["n2".into()],
        racks: vec![],
        relax: false,
    };
    let out = ds.place(0, &ask(3, Some(loc)), &q, &mut rng).unwrap();
    assert!(out.placed.iter().all(|p| p.node_id.as_str() == "n2"));
    assert_eq!(out.placed.len(), 3);
    // Rack-local: rack r0 holds n0..n3; at most one per node per round -> 4 placed.
    let loc = Locality {
        nodes: vec![],
        racks: vec!["r0".into()],
        relax: false,
    };
    let out = ds.place(0, &ask(6, Some(loc)), &q, &mut rng).unwrap();
    let nodes: HashSet<&str> = out.placed.iter().map(|p| p.node_id.as_str()).collect();
    assert_eq!(nodes, ["n0", "n1", "n2", "n3"].into_iter().collect());
    assert_eq!(out.unplaced, 2);
    assert!(out.unplaced_reason.unwrap().contains("relax is false"));
    // Unknown node, relaxed: falls back to the top-k.
    let loc = Locality {
        nodes: vec!["nope".into()],
        racks: vec![],
        relax: true,
    };
    let out = ds.place(0, &ask(1, Some(loc)), &q, &mut rng).unwrap();
    assert_eq!(out.placed.len(), 1);
    // Unknown node, strict: nothing.
    let loc = Locality {
        nodes: vec!["nope".into()],
        racks: vec![],
        relax: false,
    };
    let out = ds.place(0, &ask(1, Some(loc)), &q, &mut rng).unwrap();
    assert_eq!(out.placed.len(), 0);
    ds.quotas().check_invariants().unwrap();
}

/// A scheduler holds QUEUEABLE keys only for its view's nodes (cluster protocol 6), so a
/// preferred node or rack outside the view is not chosen (it could not be signed for): strict,
/// nothing is placed and the reason says why; relaxed, the view's nodes are used.
#[test]
fn locality_outside_the_view_is_unavailable_this_round() {
    let (_, mut ds, mut rng) = cluster(40, 5);
    let q = QueueableQuota::default();
    let view: HashSet<&str> = ["n999", "n0", "n1", "n2", "n3"].into_iter().collect();
    for loc in [
        Locality {
            nodes: vec!["n30".into()],
            racks: vec![],
            relax: false,
        },
        Locality {
            nodes: vec![],
            racks: vec!["r7".into()],
            relax: false,
        },
    ] {
        let out = ds
            .place(0, &ask(2, Some(loc.clone())), &q, &mut rng)
            .unwrap();
        assert!(out.placed.is_empty(), "{loc:?}: {:?}", out.placed);
        let reason = out.unplaced_reason.unwrap();
        assert!(
            reason.contains("none of the preferred nodes or racks is among the 5 least-loaded"),
            "{reason}"
        );
        let relaxed = Locality { relax: true, ..loc };
        let out = ds.place(0, &ask(2, Some(relaxed)), &q, &mut rng).unwrap();
        assert_eq!(out.placed.len(), 2);
        assert!(out.placed.iter().all(|p| view.contains(p.node_id.as_str())));
    }
    // A preferred node in the view wins over one outside it.
    let loc = Locality {
        nodes: vec!["n30".into(), "n3".into()],
        racks: vec![],
        relax: false,
    };
    let out = ds.place(0, &ask(2, Some(loc)), &q, &mut rng).unwrap();
    assert!(out.placed.iter().all(|p| p.node_id.as_str() == "n3"));
    assert_eq!(out.placed.len(), 2);
    ds.quotas().check_invariants().unwrap();
}

#[test]
fn quotas_are_enforced_and_refilled_by_finish_notices() {
    let (_, mut ds, mut rng) = cluster(40, 50);
    let quota = QueueableQuota {
        max_queueable: Some(10),
        max_queueable_per_guaranteed: None,
    };
    let first = ds.place(0, &ask(8, None), &quota, &mut rng).unwrap();
    assert_eq!(first.placed.len(), 8);
    let second = ds.place(0, &ask(8, None), &quota, &mut rng).unwrap();
    assert_eq!(second.placed.len(), 2);
    assert!(second.unplaced_reason.unwrap().contains("quota"));
    let err = ds.place(0, &ask(1, None), &quota, &mut rng).unwrap_err();
    assert!(matches!(
        err,
        PlacementError::QuotaExceeded {
            outstanding: 10,
            ..
        }
    ));
    assert!(err.retryable());
    for p in &first.placed[..3] {
        ds.quotas_mut().on_finished(p.container_id);
    }
    ds.quotas().check_invariants().unwrap();
    assert_eq!(
        ds.place(0, &ask(8, None), &quota, &mut rng)
            .unwrap()
            .placed
            .len(),
        3
    );
}

#[test]
fn asks_larger_than_any_node_or_before_any_view_are_refused() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut empty = DistributedScheduler::new(DistributedSchedulerConfig::default(), 1);
    assert_eq!(
        empty.place(0, &ask(1, None), &QueueableQuota::default(), &mut rng),
        Err(PlacementError::NoView)
    );
    let (_, mut ds, mut rng) = cluster(4, 5);
    let mut big = ask(1, None);
    big.resources = Resources::new(64_000, 1);
    assert!(matches!(
        ds.place(0, &big, &QueueableQuota::default(), &mut rng),
        Err(PlacementError::LargerThanAnyNode { .. })
    ));
    let mut future = ask(1, None);
    future.job_submit_time_ms = u64::MAX;
    let out = ds
        .place(77, &future, &QueueableQuota::default(), &mut rng)
        .unwrap();
    assert_eq!(
        out.placed[0].token_body.job_submit_time_ms, 77,
        "future submit times are clamped"
    );
    // A claim of 0 (the epoch) a week into the clock's life is raised to one day ago.
    let week_ms = 7 * 24 * 3_600_000;
    let mut ancient = ask(1, None);
    ancient.job_submit_time_ms = 0;
    let out = ds
        .place(week_ms, &ancient, &QueueableQuota::default(), &mut rng)
        .unwrap();
    assert_eq!(
        out.placed[0].token_body.job_submit_time_ms,
        week_ms - scheduler_core::time::MAX_JOB_SUBMIT_AGE_MS,
        "submit times older than a day are clamped"
    );
}

fn g_ask(key: u64, cpu: u64, count: u32) -> GuaranteedAsk {
    common::guaranteed_ask(key, Resources::new(cpu, cpu), count)
}

#[test]
fn guarantor_never_overcommits_and_waits_for_capacity() {
    let mut g = Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0);
    g.add_node(NodeId::from("a"), "r".into(), Resources::new(1000, 1000));
    g.add_node(NodeId::from("b"), "r".into(), Resources::new(2000, 2000));
    g.submit(g_ask(1, 800, 4)).unwrap();
    let first = g.schedule(0);
    g.check_invariants().unwrap();
    // b takes two (1600 of 2000), a takes one; the fourth waits.
    assert_eq!(first.len(), 3);
    assert_eq!(first.last().unwrap().remaining, 1);
    assert_eq!(g.pending_containers(), 1);
    // The operator's view says what waits and why: no node has 800 free.
    let waiting = g.waiting_asks(0, 10);
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (waiting[0].containers, waiting[0].resources.cpu_millis),
        (1, 800)
    );
    assert!(waiting[0].reason.contains("no node has"), "{waiting:?}");
    assert!(g.waiting_asks(0, 0).is_empty(), "bounded by the caller");
    // Best fit: the first goes to a (leaves 200/1000 = 0.2 share) over b (1200/2000 = 0.6).
    assert_eq!(first[0].token_body.node_id.as_str(), "a");
    // A small ask behind it is not blocked by it.
    g.submit(g_ask(2, 200, 1)).unwrap();
    let second = g.schedule(0);
    g.check_invariants().unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].ask_key, 2);
    // Finishing one frees capacity for the waiting one; only its own node can report that.
    let other = if first[0].token_body.node_id.as_str() == "a" {
        "b"
    } else {
        "a"
    };
    assert!(!g.on_finished_on(&NodeId::from(other), first[0].token_body.container_id));
    g.check_invariants().unwrap();
    assert!(g.on_finished(first[0].token_body.container_id));
    assert!(
        !g.on_finished(first[0].token_body.container_id),
        "idempotent"
    );
    let waiting = g.waiting_asks(0, 10);
    assert!(
        waiting[0].reason.contains("1 node(s) have room"),
        "{waiting:?}"
    );
    let third = g.schedule(0);
    g.check_invariants().unwrap();
    assert_eq!((third.len(), third[0].remaining), (1, 0));
    assert!(g.waiting_asks(0, 10).is_empty());
    assert!(matches!(
        g.submit(g_ask(3, 5000, 1)),
        Err(GuarantorError::LargerThanAnyNode { .. })
    ));
}

#[test]
fn guarantor_expiry_promotion_node_loss_and_policing_limit() {
    let mut g = Guarantor::new(GuarantorConfig { token_ttl_ms: 100 }, Box::new(BestFit), 41);
    let a = NodeId::from("a");
    g.add_node(a.clone(), "r".into(), Resources::new(1000, 1000));
    g.submit(g_ask(1, 600, 1)).unwrap();
    let p = g.schedule(0);
    assert_eq!(
        p[0].token_body.container_id,
        ContainerId::new(0, 42),
        "resumes after last_seq"
    );
    assert_eq!(g.queueable_limit(&a), Some(Resources::new(400, 400)));
    // Unstarted grants expire and free their capacity; started ones do not.
    assert_eq!(g.expire_unstarted(100), vec![p[0].token_body.container_id]);
    g.check_invariants().unwrap();
    g.submit(g_ask(2, 600, 1)).unwrap();
    let p = g.schedule(200);
    let started = p[0].token_body.container_id;
    assert!(g.is_unstarted(started));
    assert_eq!(g.grant_owner(started), Some(&AppId::from("app")));
    g.on_started(started);
    assert!(!g.is_unstarted(started));
    assert!(g.expire_unstarted(10_000).is_empty());
    assert_eq!(g.grant_owner(ContainerId::new(0, 9999)), None);
    // Promotion: only if the node has GUARANTEED room.
    let q = ContainerId::new(5, 1);
    let err = g
        .promote(q, &a, &AppId::from("app"), Resources::new(500, 500))
        .unwrap_err();
    assert!(err.retryable());
    g.promote(q, &a, &AppId::from("app"), Resources::new(400, 400))
        .unwrap();
    g.check_invariants().unwrap();
    assert_eq!(g.queueable_limit(&a), Some(Resources::ZERO));
    // Re-adding a node keeps its bookings (no double booking after a re-join).
    g.add_node(a.clone(), "r".into(), Resources::new(1000, 1000));
    g.check_invariants().unwrap();
    assert_eq!(g.node(&a).unwrap().guaranteed, Resources::new(1000, 1000));
    let lost = g.remove_node(&a);
    assert_eq!(lost.len(), 2);
    g.check_invariants().unwrap();
}

#[test]
fn heartbeat_driven_allocation_uses_only_the_heartbeating_node() {
    let mut g = Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0);
    let (a, b) = (NodeId::from("a"), NodeId::from("b"));
    g.add_node(a.clone(), "r1".into(), Resources::new(1000, 1000));
    g.add_node(b.clone(), "r2".into(), Resources::new(1000, 1000));
    g.submit(g_ask(1, 400, 3)).unwrap();
    g.submit(g_ask(2, 100, 1)).unwrap();
    // Node a heartbeats: two of ask 1 fit (800), the third does not, the small ask behind does.
    let on_a = g.schedule_on_node(0, &a);
    g.check_invariants().unwrap();
    assert_eq!(on_a.len(), 3);
    assert!(on_a.iter().all(|p| p.token_body.node_id == a));
    assert_eq!(
        on_a.iter().map(|p| p.ask_key).collect::<Vec<_>>(),
        vec![1, 1, 2]
    );
    assert_eq!(g.pending_containers(), 1);
    // A full node gets nothing; the other node takes the rest.
    assert!(g.schedule_on_node(0, &a).is_empty());
    let on_b = g.schedule_on_node(0, &b);
    g.check_invariants().unwrap();
    assert_eq!((on_b.len(), on_b[0].remaining), (1, 0));
    assert_eq!(g.pending_asks(), 0);
    // A non-relaxed locality preference for rack r1 is not served by a heartbeat of b.
    let mut local = g_ask(3, 100, 1);
    local.locality = Some(Locality {
        nodes: vec![],
        racks: vec!["r1".into()],
        relax: false,
    });
    g.submit(local).unwrap();
    assert!(g.schedule_on_node(0, &b).is_empty());
    assert!(g.schedule_on_node(0, &NodeId::from("unknown")).is_empty());
    assert_eq!(g.schedule_on_node(0, &a).len(), 1);
    g.check_invariants().unwrap();
}

/// The guarantor reports the policing limits (Mercury §4.3) of exactly the nodes whose
/// GUARANTEED bookings changed, so the coordinator forwards O(changes) per event.
#[test]
fn only_changed_policing_limits_are_reported() {
    let mut g = Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0);
    g.add_node(NodeId::from("a"), "r".into(), Resources::new(1000, 1000));
    g.add_node(NodeId::from("b"), "r".into(), Resources::new(2000, 2000));
    let joined = g.take_changed_limits();
    assert_eq!(
        joined,
        vec![
            (NodeId::from("a"), Resources::new(1000, 1000)),
            (NodeId::from("b"), Resources::new(2000, 2000))
        ]
    );
    assert!(g.take_changed_limits().is_empty(), "taken once");
    g.submit(g_ask(1, 600, 1)).unwrap();
    let placed = g.schedule(0);
    let on = placed[0].token_body.node_id.clone();
    assert_eq!(
        g.take_changed_limits(),
        vec![(on.clone(), g.queueable_limit(&on).unwrap())]
    );
    g.on_finished(placed[0].token_body.container_id);
    let freed = g.take_changed_limits();
    assert_eq!(freed.len(), 1);
    assert_eq!(freed[0].1, g.node(&on).unwrap().capacity);
    // A removed node's change is not reported.
    g.submit(g_ask(2, 600, 1)).unwrap();
    let placed = g.schedule(0);
    g.remove_node(&placed[0].token_body.node_id);
    assert!(g.take_changed_limits().is_empty());
    g.check_invariants().unwrap();
}

/// A best-fit guarantor with a small node a (1,000) and a big node b (2,000), a grant of 900 on a:
/// (guarantor, a, b, that grant).
fn small_a_holding_900_and_big_b() -> (
    Guarantor,
    NodeId,
    NodeId,
    Vec<scheduler_core::guarantor::GuaranteedPlacement>,
) {
    let mut g = Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0);
    let (a, b) = (NodeId::from("a"), NodeId::from("b"));
    g.add_node(a.clone(), "r".into(), Resources::new(1000, 1000));
    g.add_node(b.clone(), "r".into(), Resources::new(2000, 2000));
    g.submit(g_ask(1, 900, 1)).unwrap();
    let first = g.schedule(0);
    assert_eq!(first[0].token_body.node_id, a, "best fit");
    (g, a, b, first)
}

/// An operator's drain: the node gets no new GUARANTEED containers and leaves top-k, what runs
/// there stays booked until it finishes, and an undrain brings it back.
#[test]
fn a_draining_node_gets_no_new_work_and_comes_back_when_undrained() {
    let (mut g, a, b, first) = small_a_holding_900_and_big_b();
    assert!(g.set_draining(&a, true));
    assert!(!g.set_draining(&a, true), "idempotent");
    assert!(g.is_draining(&a));
    // a keeps its running container; new work goes to b only, even where a would fit best.
    assert_eq!(g.node(&a).unwrap().guaranteed.cpu_millis, 900);
    g.submit(g_ask(2, 100, 1)).unwrap();
    let placed = g.schedule(0);
    g.check_invariants().unwrap();
    assert_eq!(placed[0].token_body.node_id, b);
    assert!(g.schedule_on_node(0, &a).is_empty());
    // Asks b cannot hold wait, and say so (a is not counted as room).
    assert!(g.on_finished(first[0].token_body.container_id));
    g.submit(g_ask(3, 1000, 2)).unwrap();
    let placed = g.schedule(0);
    assert_eq!(placed.len(), 1);
    assert!(placed.iter().all(|p| p.token_body.node_id == b));
    assert!(g.schedule_on_node(0, &a).is_empty());
    let waiting = g.waiting_asks(0, 10);
    assert!(waiting[0].reason.contains("no node has"), "{waiting:?}");
    // Undrained: the waiting container goes to a.
    assert!(g.set_draining(&a, false));
    let placed = g.schedule(0);
    g.check_invariants().unwrap();
    assert_eq!(placed[0].token_body.node_id, a);

    // The coordinator leaves a draining node out of top-k until it is undrained.
    let (mut coord, _, mut rng) = cluster(6, 6);
    let n0 = NodeId::new("n0");
    assert!(
        coord
            .top_k(Time::ZERO, &mut rng)
            .iter()
            .any(|l| l.node_id == n0)
    );
    assert!(coord.set_draining(&n0, true));
    assert!(
        coord
            .top_k(Time::ZERO, &mut rng)
            .iter()
            .all(|l| l.node_id != n0)
    );
    let round = coord.round(Time::ZERO, std::time::Duration::from_secs(3600), &mut rng);
    assert!(
        round.top_k.iter().all(|l| l.node_id != n0),
        "the round recomputes"
    );
    assert!(coord.set_draining(&n0, false));
    assert!(
        coord
            .top_k(Time::ZERO, &mut rng)
            .iter()
            .any(|l| l.node_id == n0)
    );
}

/// A node declared lost whose loss the coordinator's store has not taken yet (the loss is held,
/// the node not removed): it gets no new GUARANTEED work, its bookings stay, and neither a drain
/// nor an undrain meanwhile opens it; the removal (or a join) ends the mark.
#[test]
fn an_unreachable_node_gets_no_new_work_until_it_is_removed_or_joins() {
    let (mut g, a, b, first) = small_a_holding_900_and_big_b();
    assert!(
        !g.set_unreachable(&NodeId::from("nowhere"), true),
        "only known nodes"
    );
    assert!(g.set_unreachable(&a, true));
    assert!(!g.set_unreachable(&a, true), "idempotent");
    g.check_invariants().unwrap();
    // a keeps its booking; a small ask that fits a best goes to b.
    assert_eq!(g.node(&a).unwrap().guaranteed.cpu_millis, 900);
    g.submit(g_ask(2, 100, 1)).unwrap();
    let placed = g.schedule(0);
    assert_eq!(placed[0].token_body.node_id, b);
    assert!(g.schedule_on_node(0, &a).is_empty());
    // An undrain does not open it.
    assert!(g.set_draining(&a, true));
    assert!(g.set_draining(&a, false));
    g.check_invariants().unwrap();
    g.submit(g_ask(3, 100, 1)).unwrap();
    assert_eq!(g.schedule(0)[0].token_body.node_id, b);
    // Asks only a could hold wait.
    assert!(g.on_finished(first[0].token_body.container_id));
    g.submit(g_ask(4, 1000, 2)).unwrap();
    let placed = g.schedule(0);
    assert!(
        placed.iter().all(|p| p.token_body.node_id == b),
        "{placed:?}"
    );
    // The loss is stored: the node is removed, and the mark goes with it.
    g.remove_node(&a);
    assert!(!g.is_unreachable(&a));
    g.check_invariants().unwrap();
    // The node joins again: new work goes there.
    g.add_node(a.clone(), "r".into(), Resources::new(1000, 1000));
    let placed = g.schedule(0);
    g.check_invariants().unwrap();
    assert!(
        placed.iter().any(|p| p.token_body.node_id == a),
        "{placed:?}"
    );
    // A join ends a mark too (a node marked, then joining again before any removal).
    assert!(g.set_unreachable(&b, true));
    g.add_node(b.clone(), "r".into(), Resources::new(2000, 2000));
    assert!(!g.is_unreachable(&b));
    g.check_invariants().unwrap();
}

/// A join answer may carry the joining node twice (the version's shared directory with its old
/// entry, then its current one appended): the scheduler keeps the last, in name order.
#[test]
fn a_whole_directory_naming_a_node_twice_keeps_the_last_entry_in_name_order() {
    use scheduler_core::distributed::{ClusterView, DirectoryUpdate, SlotLoad};
    let mut ds = DistributedScheduler::new(DistributedSchedulerConfig::default(), 5);
    let mut current = node(1, 0);
    current.app_endpoint = "10.9.9.9:7000".into();
    // As it comes off the wire: the top-k names n1 by its slot.
    let update = ds.update_view(ClusterView {
        directory_version: 3,
        directory: vec![node(1, 0), node(2, 0), node(3, 0), current.clone()],
        delta: None,
        top_k: Vec::new(),
        top_k_slots: vec![SlotLoad {
            slot: current.slot,
            queue_delay_ms: 0.0,
        }],
        ..ClusterView::default()
    });
    assert_eq!(update, DirectoryUpdate::Replaced);
    assert_eq!(
        ds.view().directory,
        vec![current.clone(), node(2, 0), node(3, 0)]
    );
    let mut rng = StdRng::seed_from_u64(3);
    let out = ds
        .place(0, &ask(1, None), &QueueableQuota::default(), &mut rng)
        .unwrap();
    assert_eq!(out.placed[0].node_endpoint, "10.9.9.9:7000");
}

/// A top-k off the wire names nodes by slot: the scheduler reads each slot in its directory
/// once that is at the view's version, leaves out a slot no entry holds (a node that joined this
/// round, its entry not sent yet), and keeps its previous list when it ignored the view's delta
/// (its directory is then at another version, where a slot may have been another node's).
#[test]
fn a_top_k_by_slot_is_read_in_the_directory_at_the_views_version() {
    use scheduler_core::distributed::{ClusterView, DirectoryDelta, DirectoryUpdate, SlotLoad};
    let by_slot = |pairs: &[(u32, f64)]| -> Vec<SlotLoad> {
        pairs
            .iter()
            .map(|&(slot, queue_delay_ms)| SlotLoad {
                slot,
                queue_delay_ms,
            })
            .collect()
    };
    let names = |ds: &DistributedScheduler| -> Vec<(String, f64)> {
        ds.view()
            .top_k
            .iter()
            .map(|l| (l.node_id.to_string(), l.queue_delay_ms))
            .collect()
    };
    let mut ds = DistributedScheduler::new(DistributedSchedulerConfig::default(), 5);
    let update = ds.update_view(ClusterView {
        directory_version: 4,
        directory: vec![node(1, 0), node(2, 0), node(3, 0)],
        delta: None,
        top_k: Vec::new(),
        top_k_slots: by_slot(&[(3, 0.0), (9, 1.0), (1, 2.5)]),
        ..ClusterView::default()
    });
    assert_eq!(update, DirectoryUpdate::Replaced);
    assert_eq!(
        names(&ds),
        [("n3".to_string(), 0.0), ("n1".to_string(), 2.5)],
        "slot 9 has no entry yet"
    );
    // A delta from a version after this scheduler's is ignored, and so is its list: in the
    // delta's version slot 3 could be a new node's.
    let update = ds.update_view(ClusterView {
        directory_version: 7,
        directory: Vec::new(),
        delta: Some(DirectoryDelta {
            from_version: 6,
            joined: vec![node(9, 1)],
            left: vec![NodeId::new("n3")],
        }),
        top_k: Vec::new(),
        top_k_slots: by_slot(&[(9, 0.0), (3, 1.0)]),
        ..ClusterView::default()
    });
    assert_eq!(update, DirectoryUpdate::Ignored);
    assert_eq!(
        names(&ds),
        [("n3".to_string(), 0.0), ("n1".to_string(), 2.5)],
        "the previous list stays"
    );
    // The delta from its own version: n9 joined with slot 9, n3 left; the list follows.
    let update = ds.update_view(ClusterView {
        directory_version: 5,
        directory: Vec::new(),
        delta: Some(DirectoryDelta {
            from_version: 4,
            joined: vec![node(9, 1)],
            left: vec![NodeId::new("n3")],
        }),
        top_k: Vec::new(),
        top_k_slots: by_slot(&[(9, 0.0), (3, 1.0), (2, 4.0)]),
        ..ClusterView::default()
    });
    assert!(matches!(update, DirectoryUpdate::Patched { .. }));
    assert_eq!(
        names(&ds),
        [("n9".to_string(), 0.0), ("n2".to_string(), 4.0)],
        "slot 3 left with n3"
    );
    // Placement uses the resolved list.
    let mut rng = StdRng::seed_from_u64(1);
    let out = ds
        .place(0, &ask(2, None), &QueueableQuota::default(), &mut rng)
        .expect("nodes in the view");
    assert!(!out.placed.is_empty());
    assert!(
        out.placed
            .iter()
            .all(|p| ["n2", "n9"].contains(&p.node_id.as_str())),
        "{:?}",
        out.placed
    );
}

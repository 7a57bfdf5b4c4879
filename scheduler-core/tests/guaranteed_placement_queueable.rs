//! Scenario tests of the QUEUEABLE-aware GUARANTEED placer: it avoids nodes whose QUEUEABLE work
//! a GUARANTEED container would preempt (event-driven and heartbeat-driven allocation), waits at
//! most its patience for a better node, and never over-commits a node with GUARANTEED work.
//! Guarantor invariants are checked after every step.

mod common;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::guarantor::{
    BestFit, GuaranteedAsk, GuaranteedPlacer, Guarantor, GuarantorConfig, QueueableAware,
    QueueableLoad,
};
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::{AppId, ContainerId, ContainerType, NodeId, Resources};

const CORE: Resources = Resources {
    cpu_millis: 1000,
    memory_mib: 1000,
};

fn cores(n: u64) -> Resources {
    CORE.scale(n)
}

fn ask(key: u64, count: u32) -> GuaranteedAsk {
    common::guaranteed_ask(key, CORE, count)
}

/// A guarantor with 4-core nodes `names`, using `placer`.
fn guarantor(placer: Box<dyn GuaranteedPlacer>, names: &[&str]) -> Guarantor {
    let mut g = Guarantor::new(GuarantorConfig::default(), placer, 0);
    for n in names {
        g.add_node(NodeId::from(*n), "r".into(), cores(4));
    }
    g
}

fn running_q(n: u64) -> QueueableLoad {
    QueueableLoad {
        running: cores(n),
        queued_count: 0,
    }
}

fn nodes_of(p: &[scheduler_core::guarantor::GuaranteedPlacement]) -> Vec<&str> {
    p.iter().map(|p| p.token_body.node_id.as_str()).collect()
}

#[test]
fn event_driven_placement_prefers_the_node_without_queueable_work() {
    for (placer, expected) in [
        (
            Box::new(QueueableAware::default()) as Box<dyn GuaranteedPlacer>,
            "b",
        ),
        // Best fit ignores QUEUEABLE work: equal G books, so the first node.
        (Box::new(BestFit), "a"),
    ] {
        let mut g = guarantor(placer, &["a", "b"]);
        assert!(g.report_queueable_load(&NodeId::from("a"), running_q(4)));
        assert!(g.report_queueable_load(&NodeId::from("b"), QueueableLoad::default()));
        g.submit(ask(1, 1)).unwrap();
        let p = g.schedule(0);
        g.check_invariants().unwrap();
        assert_eq!(nodes_of(&p), [expected], "{}", g.placer_name());
    }
}

#[test]
fn least_preempted_work_then_fewest_queued_then_best_fit() {
    let mut g = guarantor(Box::new(QueueableAware::default()), &["a", "b", "c", "d"]);
    // a: full of QUEUEABLE work (one core would be preempted); b: 3 cores of it (fits without
    // preemption, queue of 5); c: 3 cores, empty queue; d: full too.
    g.report_queueable_load(&NodeId::from("a"), running_q(4));
    g.report_queueable_load(
        &NodeId::from("b"),
        QueueableLoad {
            running: cores(3),
            queued_count: 5,
        },
    );
    g.report_queueable_load(&NodeId::from("c"), running_q(3));
    g.report_queueable_load(&NodeId::from("d"), running_q(4));
    g.submit(ask(1, 1)).unwrap();
    assert_eq!(nodes_of(&g.schedule(0)), ["c"]);
    g.check_invariants().unwrap();
    // c now holds one GUARANTEED core on top of 3 QUEUEABLE ones: the next would preempt there.
    // b preempts nothing but delays its queue: half the cost of a preemption, so b next.
    g.submit(ask(2, 1)).unwrap();
    assert_eq!(nodes_of(&g.schedule(0)), ["b"]);
    g.check_invariants().unwrap();
    // Now one core would be preempted anywhere; among the nodes without a queue (a, c, d),
    // best fit: c already holds a GUARANTEED core.
    g.submit(ask(3, 1)).unwrap();
    assert_eq!(nodes_of(&g.schedule(0)), ["c"]);
    g.check_invariants().unwrap();
}

#[test]
fn heartbeat_driven_allocation_waits_for_a_node_without_queueable_work() {
    let (a, b) = (NodeId::from("a"), NodeId::from("b"));
    let mut g = guarantor(Box::new(QueueableAware { patience_ms: 3000 }), &["a", "b"]);
    g.report_queueable_load(&a, running_q(4));
    g.report_queueable_load(&b, running_q(1));
    g.submit(ask(1, 4)).unwrap();
    // a heartbeats first: b could take containers without preemption, so a is passed over.
    assert!(g.schedule_on_node(0, &a).is_empty());
    g.check_invariants().unwrap();
    // b heartbeats: three fit without preemption; the fourth would preempt on b as on a, so it
    // is no worse here and goes too.
    let on_b = g.schedule_on_node(1000, &b);
    g.check_invariants().unwrap();
    assert_eq!(nodes_of(&on_b), ["b", "b", "b", "b"]);
    assert_eq!(g.pending_containers(), 0);

    // Best fit does not wait.
    let mut g = guarantor(Box::new(BestFit), &["a", "b"]);
    g.report_queueable_load(&a, running_q(4));
    g.submit(ask(1, 1)).unwrap();
    assert_eq!(nodes_of(&g.schedule_on_node(0, &a)), ["a"]);
    g.check_invariants().unwrap();
}

#[test]
fn a_passed_over_ask_preempts_once_its_patience_is_spent() {
    let (a, b) = (NodeId::from("a"), NodeId::from("b"));
    let mut g = guarantor(Box::new(QueueableAware { patience_ms: 3000 }), &["a", "b"]);
    g.report_queueable_load(&a, running_q(4));
    g.submit(ask(1, 2)).unwrap();
    // b (idle) never heartbeats, as if its reports were stale.
    assert!(g.schedule_on_node(0, &a).is_empty());
    assert!(g.schedule_on_node(2999, &a).is_empty());
    let late = g.schedule_on_node(3000, &a);
    g.check_invariants().unwrap();
    assert_eq!(
        nodes_of(&late),
        ["a", "a"],
        "both containers after the patience"
    );
    let _ = b;
}

#[test]
fn no_wait_when_every_node_would_preempt_as_much() {
    let a = NodeId::from("a");
    let mut g = guarantor(Box::new(QueueableAware::default()), &["a", "b", "c"]);
    for n in ["a", "b", "c"] {
        g.report_queueable_load(&NodeId::from(n), running_q(4));
    }
    g.submit(ask(1, 2)).unwrap();
    assert_eq!(nodes_of(&g.schedule_on_node(0, &a)), ["a", "a"]);
    g.check_invariants().unwrap();
    assert!(!g.report_queueable_load(&NodeId::from("unknown"), running_q(1)));
}

/// Random asks, finishes, QUEUEABLE reports and node updates: GUARANTEED books never exceed a
/// node's capacity, whatever the QUEUEABLE load, in both allocation modes.
#[test]
fn queueable_aware_placement_never_overcommits_guaranteed_work() {
    let names = ["n0", "n1", "n2", "n3", "n4", "n5"];
    let mut g = guarantor(Box::new(QueueableAware { patience_ms: 500 }), &names);
    let mut rng = StdRng::seed_from_u64(5);
    let mut granted: Vec<ContainerId> = Vec::new();
    let mut placed = 0;
    let mut now = 0;
    for step in 0..3000u64 {
        now += rng.random_range(0..200);
        match rng.random_range(0..5) {
            0 => {
                let mut a = ask(step, rng.random_range(1..6));
                a.resources = cores(rng.random_range(1..4));
                g.submit(a).unwrap();
            }
            1 if !granted.is_empty() => {
                let i = rng.random_range(0..granted.len());
                assert!(g.on_finished(granted.swap_remove(i)));
            }
            2 => {
                let n = NodeId::from(names[rng.random_range(0..names.len())]);
                let load = QueueableLoad {
                    running: cores(rng.random_range(0..5)),
                    queued_count: rng.random_range(0..3),
                };
                g.report_queueable_load(&n, load);
            }
            3 => {
                let n = NodeId::from(names[rng.random_range(0..names.len())]);
                let p = g.schedule_on_node(now, &n);
                placed += p.len();
                granted.extend(p.iter().map(|p| p.token_body.container_id));
            }
            _ => {
                let p = g.schedule(now);
                placed += p.len();
                granted.extend(p.iter().map(|p| p.token_body.container_id));
            }
        }
        g.check_invariants()
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
    }
    assert!(placed > 300, "the scenario placed work: {placed}");
}

#[test]
fn queueable_load_is_read_from_a_heartbeats_container_list() {
    let status = |id: u64, t: ContainerType, placement: Placement, n: u64| ContainerStatus {
        usage: None,
        id: ContainerId::new(3, id),
        app_id: AppId::from("app"),
        container_type: t,
        resources: cores(n),
        placement,
        version: 0,
        job: None,
        grant_token: None,
    };
    let load = QueueableLoad::from_statuses(&[
        status(1, ContainerType::Queueable, Placement::Running, 2),
        status(2, ContainerType::Queueable, Placement::Running, 1),
        status(3, ContainerType::Queueable, Placement::Queued, 1),
        status(4, ContainerType::Guaranteed, Placement::Running, 4),
        status(
            5,
            ContainerType::Guaranteed,
            Placement::WaitingGuaranteed,
            1,
        ),
    ]);
    assert_eq!(
        load,
        QueueableLoad {
            running: cores(3),
            queued_count: 1,
        }
    );
}

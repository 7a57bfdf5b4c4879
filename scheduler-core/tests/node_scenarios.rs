//! Scenario tests of the node runtime policy (Mercury §3.4, §4.2, §4.3) on a virtual clock, with
//! every invariant checked after every step.

use scheduler_core::node::{
    self, ContainerSpec, NodeError, NodeEvent, NodeRuntime, NodeRuntimeConfig, Placement,
};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, KillReason, Resources, Time};
use std::time::Duration;

/// A node plus a clock; every step checks invariants and returns the events it produced.
struct Scenario {
    node: NodeRuntime,
    now: Time,
    next: u64,
}

impl Scenario {
    fn new(cpu: u64, mem: u64) -> Scenario {
        Scenario::with(NodeRuntimeConfig::new(Resources::new(cpu, mem)))
    }

    fn with(config: NodeRuntimeConfig) -> Scenario {
        Scenario {
            node: NodeRuntime::new(config, Time::ZERO),
            now: Time::ZERO,
            next: 1,
        }
    }

    fn at(&mut self, secs: u64) -> &mut Self {
        self.now = Time::from_secs(secs);
        self
    }

    fn check(&mut self) -> Vec<NodeEvent> {
        self.node
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariant broken at {}: {e}", self.now));
        self.node.drain_events()
    }

    fn container(&mut self, t: ContainerType, cpu: u64, job_submit_secs: u64) -> ContainerSpec {
        let id = ContainerId::new(1, self.next);
        self.next += 1;
        ContainerSpec {
            id,
            app_id: AppId::from("app"),
            job_id: JobId::new(format!("job-{job_submit_secs}")),
            job_submit_time: Time::from_secs(job_submit_secs),
            priority: 0,
            container_type: t,
            resources: Resources::new(cpu, cpu),
            runtime_estimate_ms: Some(10_000),
            version: 0,
            times_returned: 0,
        }
    }

    fn submit(
        &mut self,
        t: ContainerType,
        cpu: u64,
        job_submit_secs: u64,
    ) -> (ContainerId, Vec<NodeEvent>) {
        let spec = self.container(t, cpu, job_submit_secs);
        let id = spec.id;
        self.node.submit(self.now, spec).expect("submit accepted");
        (id, self.check())
    }

    fn exit_first_running(&mut self) -> Vec<NodeEvent> {
        let id = self
            .node
            .statuses()
            .into_iter()
            .find(|c| c.placement == Placement::Running)
            .expect("a running container")
            .id;
        self.exit(id)
    }

    fn exit(&mut self, id: ContainerId) -> Vec<NodeEvent> {
        self.node.on_exit(self.now, id, 0).expect("known container");
        self.check()
    }
}

fn started(events: &[NodeEvent]) -> Vec<ContainerId> {
    events
        .iter()
        .filter_map(|e| {
            if let NodeEvent::Start { id } = e {
                Some(*id)
            } else {
                None
            }
        })
        .collect()
}

fn killed(events: &[NodeEvent], why: KillReason) -> Vec<ContainerId> {
    events
        .iter()
        .filter_map(|e| match e {
            NodeEvent::Killed { id, reason, .. } if *reason == why => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn guaranteed_starts_at_once_and_preempts_most_recent_queueable_first() {
    let mut s = Scenario::new(1000, 1000);
    let (q1, ev) = s.at(1).submit(ContainerType::Queueable, 400, 1);
    assert_eq!(started(&ev), vec![q1]);
    let (q2, _) = s.at(2).submit(ContainerType::Queueable, 400, 1);
    let (q3, ev) = s.at(3).submit(ContainerType::Queueable, 200, 1);
    assert_eq!(started(&ev), vec![q3]);
    assert_eq!(s.node.allocated(), Resources::new(1000, 1000));
    // Needs 500: killing q3 (200, newest) is not enough, q2 (400) goes too; q1 survives.
    let (g, ev) = s.at(4).submit(ContainerType::Guaranteed, 500, 0);
    assert_eq!(killed(&ev, KillReason::PreemptedByGuaranteed), vec![q3, q2]);
    assert_eq!(started(&ev), vec![g]);
    assert_eq!(s.node.placement(q1), Some(Placement::Running));
    assert!(
        ev.iter()
            .all(|e| !matches!(e, NodeEvent::Killed { id, .. } if *id == g))
    );
}

/// The node is the last word on its GUARANTEED capacity (issue 11): a GUARANTEED container that
/// would take GUARANTEED work past the capacity is refused, whatever its (stale) grant says, and
/// the node is left as it was.
#[test]
fn guaranteed_work_beyond_capacity_is_refused_not_queued() {
    let mut s = Scenario::new(1000, 1000);
    let (g1, _) = s.at(0).submit(ContainerType::Guaranteed, 800, 0);
    let (q, _) = s.at(1).submit(ContainerType::Queueable, 200, 0);
    let over = s.container(ContainerType::Guaranteed, 500, 0);
    let over_id = over.id;
    assert_eq!(
        s.node.submit(s.now, over),
        Err(NodeError::GuaranteedCapacityExceeded {
            id: over_id,
            asked: Resources::new(500, 500),
            guaranteed: Resources::new(800, 800),
            capacity: Resources::new(1000, 1000),
        })
    );
    assert!(s.check().is_empty(), "a refusal changes nothing");
    assert_eq!(s.node.placement(q), Some(Placement::Running));
    // A promotion that would over-commit is refused the same way.
    assert!(matches!(
        s.node.promote(s.now, q, 1),
        Ok(()) // 800 + 200 fits exactly
    ));
    s.check();
    let (q2, _) = s.at(2).submit(ContainerType::Queueable, 100, 0);
    assert_eq!(s.node.placement(q2), Some(Placement::Queued));
    assert!(matches!(
        s.node.promote(s.now, q2, 1),
        Err(NodeError::GuaranteedCapacityExceeded { .. })
    ));
    assert!(s.check().is_empty());
    // Once GUARANTEED work ends, the capacity is there again.
    s.at(3).exit(g1);
    let (g2, ev) = s.at(4).submit(ContainerType::Guaranteed, 500, 0);
    assert_eq!(started(&ev), vec![g2]);
    assert_eq!(s.node.guaranteed_committed(), Resources::new(700, 700));
}

#[test]
fn queue_is_reordered_by_job_submit_time_and_has_no_head_of_line_blocking() {
    let mut s = Scenario::new(1000, 1000);
    let (g, _) = s.at(0).submit(ContainerType::Guaranteed, 900, 0);
    let (late_big, _) = s.at(1).submit(ContainerType::Queueable, 600, 50);
    let (early_small, _) = s.at(2).submit(ContainerType::Queueable, 100, 10);
    let (mid_small, ev) = s.at(3).submit(ContainerType::Queueable, 100, 20);
    // early_small fits into the 100 left beside g and starts despite late_big arriving first;
    // mid_small and late_big wait.
    assert!(started(&ev).is_empty());
    assert_eq!(s.node.placement(early_small), Some(Placement::Running));
    assert_eq!(s.node.placement(mid_small), Some(Placement::Queued));
    let ev = s.at(4).exit(g);
    // Queue order by job submit time: mid_small (20) before late_big (50).
    assert_eq!(started(&ev), vec![mid_small, late_big]);
}

#[test]
fn fifo_when_reordering_is_off() {
    let mut cfg = NodeRuntimeConfig::new(Resources::new(1000, 1000));
    cfg.reorder_by_job_submit_time = false;
    let mut s = Scenario::with(cfg);
    let (g, _) = s.at(0).submit(ContainerType::Guaranteed, 1000, 0);
    let (a, _) = s.at(1).submit(ContainerType::Queueable, 500, 50);
    let (b, _) = s.at(2).submit(ContainerType::Queueable, 500, 10);
    assert_eq!(started(&s.at(3).exit(g)), vec![a, b]);
}

#[test]
fn shedding_discards_newest_queued_while_its_wait_exceeds_threshold() {
    let mut s = Scenario::new(1000, 1000);
    s.at(0).submit(ContainerType::Guaranteed, 1000, 0);
    let mut queued = vec![];
    for job in 1..=5 {
        queued.push(s.at(1).submit(ContainerType::Queueable, 1000, job).0);
    }
    // Each queued container is 10 s of whole-node time: Tq = 50 s; Tr = 10 s (the G).
    let r = s.node.queue_delay(s.now);
    assert!((r.tq_ms - 50_000.0).abs() < 1e-6, "{r:?}");
    let shed = s.node.shed_to_threshold(s.now, 35_000.0);
    let ev = s.check();
    // The newest waits R − 10 s: 50 s (job 5) and 40 s (job 4) exceed 35 s and are shed; job 3
    // then waits 30 s, within the target, and stays (R = 40 s).
    assert_eq!(shed, vec![queued[4], queued[3]]);
    assert_eq!(killed(&ev, KillReason::Shed), shed);
    assert!((s.node.queue_delay(s.now).total_ms() - 40_000.0).abs() < 1e-6);
    assert!(s.node.shed_to_threshold(s.now, 35_000.0).is_empty());
}

/// Mercury §4.3/§6.3: only containers that would wait longer than the target are discarded. A
/// node whose R is above the threshold by less than its newest container's own work keeps it:
/// that container starts within the target here, and shedding it would only move it to a node
/// as loaded (the churn of §7.3's 20-s tasks, docs/experiments/mercury/diagnosis.md).
#[test]
fn a_node_less_than_one_container_above_the_threshold_sheds_nothing() {
    let mut s = Scenario::new(1000, 1000);
    s.at(0).submit(ContainerType::Guaranteed, 1000, 0);
    let a = s.at(1).submit(ContainerType::Queueable, 1000, 1).0;
    let b = s.at(1).submit(ContainerType::Queueable, 1000, 2).0;
    // R = 10 s (G) + 20 s queued = 30 s; b starts after 20 s.
    assert!((s.node.queue_delay(s.now).total_ms() - 30_000.0).abs() < 1e-6);
    assert!(s.node.shed_to_threshold(s.now, 25_000.0).is_empty());
    s.check();
    assert_eq!(s.node.placement(a), Some(Placement::Queued));
    assert_eq!(s.node.placement(b), Some(Placement::Queued));
    // b would wait 20 s, more than a 15-s target: it goes.
    assert_eq!(s.node.shed_to_threshold(s.now, 15_000.0), vec![b]);
    s.check();
}

/// Submits a container with its own runtime estimate.
fn submit_lasting(
    s: &mut Scenario,
    t: ContainerType,
    cpu: u64,
    job_submit_secs: u64,
    estimate_secs: u64,
) -> ContainerId {
    let mut spec = s.container(t, cpu, job_submit_secs);
    spec.runtime_estimate_ms = Some(estimate_secs * 1000);
    let id = spec.id;
    s.node.submit(s.now, spec).expect("submit accepted");
    s.check();
    id
}

/// Queued QUEUEABLE work that long GUARANTEED work holds back past the re-placement bound goes
/// back to its job manager; what starts within the bound stays (docs/experiments/mercury/
/// diagnosis.md: 2-s tasks queued behind 50-s GUARANTEED work held whole jobs back).
#[test]
fn queued_work_held_back_by_long_guaranteed_work_past_the_bound_goes_back() {
    let mut s = Scenario::new(2000, 2000);
    s.at(0);
    let g = submit_lasting(&mut s, ContainerType::Guaranteed, 1000, 0, 60);
    let a = submit_lasting(&mut s, ContainerType::Queueable, 1000, 1, 10);
    let b = submit_lasting(&mut s, ContainerType::Queueable, 1000, 2, 10);
    let c = submit_lasting(&mut s, ContainerType::Queueable, 1000, 3, 10);
    let d = submit_lasting(&mut s, ContainerType::Queueable, 1000, 4, 10);
    assert_eq!(s.node.placement(g), Some(Placement::Running));
    assert_eq!(s.node.placement(a), Some(Placement::Running));
    // One core is the GUARANTEED container's for 60 s: b starts at 10 s, c at 20 s, d at 30 s.
    let shed = s.node.shed_held_by_guaranteed(s.now, 15_000.0);
    let ev = s.check();
    assert_eq!(shed, vec![d, c], "newest first");
    assert_eq!(killed(&ev, KillReason::Shed), shed);
    assert_eq!(s.node.placement(b), Some(Placement::Queued));
    // Time passes as expected: b still starts within the bound, nothing more goes.
    s.at(5);
    assert!(s.node.shed_held_by_guaranteed(s.now, 15_000.0).is_empty());
    // A bound past every expected start keeps everything.
    let e = submit_lasting(&mut s, ContainerType::Queueable, 1000, 5, 10);
    assert!(s.node.shed_held_by_guaranteed(s.now, 60_000.0).is_empty());
    assert_eq!(s.node.placement(e), Some(Placement::Queued));
}

/// Submits a QUEUEABLE container of 10 s whose work was returned `times_returned` times.
fn submit_returned(s: &mut Scenario, job: u64, times_returned: u8) -> ContainerId {
    let mut spec = s.container(ContainerType::Queueable, 1000, job);
    spec.times_returned = times_returned;
    let id = spec.id;
    s.node.submit(s.now, spec).expect("submit accepted");
    s.check();
    id
}

/// Returned work goes back again only past the bound doubled per return (truncated binary
/// exponential backoff, docs/experiments/mercury/parameters.md), yet takes its place in the
/// replay (what starts after it is judged with it started).
#[test]
fn returned_work_goes_back_again_only_past_a_bound_doubled_per_return() {
    let mut s = Scenario::new(2000, 2000);
    s.at(0);
    submit_lasting(&mut s, ContainerType::Guaranteed, 1000, 0, 60);
    submit_lasting(&mut s, ContainerType::Queueable, 1000, 1, 10);
    // Queue: b (returned once, starts at 10 s), c (starts at 20 s), d (returned once, 30 s),
    // e (40 s).
    let b = submit_returned(&mut s, 2, 1);
    let c = submit_lasting(&mut s, ContainerType::Queueable, 1000, 3, 10);
    let d = submit_returned(&mut s, 4, 1);
    let e = submit_lasting(&mut s, ContainerType::Queueable, 1000, 5, 10);
    // Bound 15 s: c and e go; b and d, returned once, go only past 30 s (d starts at 30 s).
    let shed = s.node.shed_held_by_guaranteed(s.now, 15_000.0);
    let ev = s.check();
    assert_eq!(
        shed,
        vec![e, c],
        "newest first; returned work judged by its own bound"
    );
    assert_eq!(killed(&ev, KillReason::Shed), shed);
    assert_eq!(s.node.placement(b), Some(Placement::Queued));
    assert_eq!(s.node.placement(d), Some(Placement::Queued));
    // d now starts at 20 s: within 2 × 12 s it stays, past 2 × 8 s it goes; b (10 s) stays.
    assert!(s.node.shed_held_by_guaranteed(s.now, 12_000.0).is_empty());
    assert_eq!(s.node.shed_held_by_guaranteed(s.now, 8_000.0), vec![d]);
    s.check();
    // A new container queued behind b starts at 20 s: past a 15-s bound it goes back (b, kept,
    // holds the node in the replay).
    let f = submit_lasting(&mut s, ContainerType::Queueable, 1000, 6, 10);
    assert_eq!(s.node.shed_held_by_guaranteed(s.now, 15_000.0), vec![f]);
    s.check();
}

/// The backoff stops doubling at 2^10 and a container returned 16 times stays (IEEE 802.3's
/// truncation and attempt limit); a queue holding only such work is left alone (the node counts
/// returnable work, checked by `check_invariants` at every step). A container whose own bound
/// is past what GUARANTEED work holds stays too, however late it starts.
#[test]
fn work_returned_sixteen_times_stays_and_the_backoff_is_truncated() {
    assert_eq!(
        node::return_bound(Duration::from_millis(10), 15),
        Some(Duration::from_millis(10_240))
    );
    assert_eq!(node::return_bound(Duration::from_millis(10), 16), None);
    let mut s = Scenario::new(2000, 2000);
    s.at(0);
    submit_lasting(&mut s, ContainerType::Guaranteed, 1000, 0, 60);
    submit_lasting(&mut s, ContainerType::Queueable, 1000, 1, 10);
    // f (16 returns) starts at 10 s, g (15 returns) at 20 s, h (3 returns) at 30 s.
    let f = submit_returned(&mut s, 2, 16);
    let g = submit_returned(&mut s, 3, 15);
    let h = submit_returned(&mut s, 4, 3);
    // Bound 10 ms: g's own bound is 10.24 s (truncated), h's 80 ms: both go, f stays.
    assert_eq!(s.node.shed_held_by_guaranteed(s.now, 10.0), vec![h, g]);
    s.check();
    assert_eq!(s.node.placement(f), Some(Placement::Queued));
    assert!(s.node.shed_held_by_guaranteed(s.now, 0.0).is_empty());
}

/// A container whose own bound is not below what GUARANTEED work holds stays however late it
/// starts: past the hold, what delays it is QUEUEABLE work, R's and §4.3's business.
#[test]
fn work_whose_bound_reaches_the_guaranteed_hold_stays_however_late_it_starts() {
    let mut s = Scenario::new(2000, 2000);
    s.at(0);
    submit_lasting(&mut s, ContainerType::Guaranteed, 1000, 0, 60);
    submit_lasting(&mut s, ContainerType::Queueable, 1000, 1, 10);
    // j (never returned) first, then eleven containers of 10 s that stay (16 returns), then h
    // (3 returns). One core until the GUARANTEED container ends at 60 s, two after: j starts at
    // 10 s, h at 90 s.
    let j = submit_returned(&mut s, 2, 0);
    for job in 3..14 {
        submit_returned(&mut s, job, 16);
    }
    let h = submit_returned(&mut s, 14, 3);
    // Bound 7.5 s: j's own is 7.5 s (it goes: it starts at 10 s); h's is 60 s, exactly what the
    // GUARANTEED container holds, so h stays although it starts at 90 s.
    assert_eq!(s.node.shed_held_by_guaranteed(s.now, 7_500.0), vec![j]);
    s.check();
    assert_eq!(s.node.placement(h), Some(Placement::Queued));
    // A bound a little shorter puts h's below the hold: it goes.
    assert_eq!(s.node.shed_held_by_guaranteed(s.now, 7_000.0), vec![h]);
    s.check();
}

/// Without GUARANTEED work holding the node past the bound, nothing goes back however long the
/// queue: a queue of QUEUEABLE work is R's and §4.3's shedding's business (only-Q runs are
/// unchanged), and short GUARANTEED work frees the node soon enough.
#[test]
fn queued_work_behind_queueable_or_short_guaranteed_work_stays() {
    let mut s = Scenario::new(2000, 2000);
    s.at(0);
    submit_lasting(&mut s, ContainerType::Queueable, 1000, 0, 60);
    submit_lasting(&mut s, ContainerType::Queueable, 1000, 0, 60);
    let queued: Vec<_> = (1..=4)
        .map(|job| submit_lasting(&mut s, ContainerType::Queueable, 1000, job, 10))
        .collect();
    assert!(s.node.shed_held_by_guaranteed(s.now, 1_000.0).is_empty());
    s.check();
    for id in &queued {
        assert_eq!(s.node.placement(*id), Some(Placement::Queued));
    }

    let mut s = Scenario::new(1000, 1000);
    s.at(0);
    submit_lasting(&mut s, ContainerType::Guaranteed, 1000, 0, 4);
    let q = submit_lasting(&mut s, ContainerType::Queueable, 1000, 1, 60);
    let r = submit_lasting(&mut s, ContainerType::Queueable, 1000, 2, 10);
    // The GUARANTEED container ends at 4 s, inside a 5-s bound: r waits 64 s behind q (QUEUEABLE
    // work), which is not GUARANTEED work holding it.
    assert!(s.node.shed_held_by_guaranteed(s.now, 5_000.0).is_empty());
    s.check();
    assert_eq!(s.node.placement(q), Some(Placement::Queued));
    assert_eq!(s.node.placement(r), Some(Placement::Queued));
}

/// The bound a node gets: R of the k-th least-loaded *other* node of the view plus a round; none
/// when the view names no other node (a one-node cluster keeps its queue).
#[test]
fn the_replacement_bound_is_the_kth_other_view_entry_plus_a_round() {
    use scheduler_core::NodeId;
    use scheduler_core::distributed::{NodeLoad, replacement_wait_bound_ms};
    let view: Vec<NodeLoad> = [1_000.0, 3_000.0, 9_000.0]
        .iter()
        .enumerate()
        .map(|(i, r)| NodeLoad {
            node_id: NodeId::from(format!("n{i}").as_str()),
            queue_delay_ms: *r,
        })
        .collect();
    let elsewhere = NodeId::from("elsewhere");
    assert_eq!(
        replacement_wait_bound_ms(&view, &elsewhere, 2, 3_000),
        Some(6_000.0)
    );
    assert_eq!(
        replacement_wait_bound_ms(&view, &elsewhere, 50, 1_000),
        Some(10_000.0)
    );
    assert_eq!(
        replacement_wait_bound_ms(&view, &elsewhere, 0, 1_000),
        Some(2_000.0)
    );
    // The node itself is skipped: n0 asking with k = 2 gets n2's R.
    let n0 = NodeId::from("n0");
    assert_eq!(
        replacement_wait_bound_ms(&view, &n0, 2, 1_000),
        Some(10_000.0)
    );
    assert_eq!(replacement_wait_bound_ms(&view[..1], &n0, 50, 1_000), None);
    assert_eq!(replacement_wait_bound_ms(&[], &n0, 50, 1_000), None);
}

/// The worker's link computes the same bound from the list as it arrives (by slot), skipping
/// its own slot; without a slot of its own every entry counts as another node.
#[test]
fn the_replacement_bound_by_slot_is_the_bound_by_name() {
    use scheduler_core::distributed::{SlotLoad, replacement_wait_bound_ms_by_slot};
    let view: Vec<SlotLoad> = [(7, 1_000.0), (3, 3_000.0), (12, 9_000.0)]
        .iter()
        .map(|&(slot, queue_delay_ms)| SlotLoad {
            slot,
            queue_delay_ms,
        })
        .collect();
    assert_eq!(
        replacement_wait_bound_ms_by_slot(&view, None, 2, 3_000),
        Some(6_000.0)
    );
    assert_eq!(
        replacement_wait_bound_ms_by_slot(&view, Some(99), 50, 1_000),
        Some(10_000.0)
    );
    // Slot 7 (the first entry) asking with k = 2 gets slot 12's R.
    assert_eq!(
        replacement_wait_bound_ms_by_slot(&view, Some(7), 2, 1_000),
        Some(10_000.0)
    );
    assert_eq!(
        replacement_wait_bound_ms_by_slot(&view[..1], Some(7), 50, 1_000),
        None
    );
}

#[test]
fn policing_limit_caps_opportunistic_use_without_killing() {
    let mut s = Scenario::new(1000, 1000);
    let (q1, _) = s.at(0).submit(ContainerType::Queueable, 300, 1);
    s.node.set_queueable_limit(s.now, Resources::new(300, 300));
    s.check();
    let (q2, ev) = s.at(1).submit(ContainerType::Queueable, 300, 1);
    assert!(started(&ev).is_empty(), "limit reached, q2 waits");
    assert_eq!(s.node.placement(q1), Some(Placement::Running));
    s.node.set_queueable_limit(s.now, Resources::new(200, 200));
    let ev = s.check();
    assert!(
        killed(&ev, KillReason::PreemptedByGuaranteed).is_empty(),
        "lowering the limit kills nothing"
    );
    s.node
        .set_queueable_limit(s.now, Resources::new(1000, 1000));
    assert_eq!(started(&s.check()), vec![q2]);
}

#[test]
fn promotion_of_queued_and_running_containers() {
    let mut s = Scenario::new(1000, 1000);
    let (running_q, _) = s.at(0).submit(ContainerType::Queueable, 600, 1);
    let (queued_q, _) = s.at(1).submit(ContainerType::Queueable, 600, 1);
    // Promoting the queued one preempts the running QUEUEABLE one (it is GUARANTEED now).
    s.node.promote(s.now, queued_q, 1).unwrap();
    let ev = s.check();
    assert!(ev.contains(&NodeEvent::Promoted {
        id: queued_q,
        version: 1
    }));
    assert_eq!(
        killed(&ev, KillReason::PreemptedByGuaranteed),
        vec![running_q]
    );
    assert_eq!(started(&ev), vec![queued_q]);
    assert_eq!(s.node.guaranteed_allocated(), Resources::new(600, 600));
    // Status rows carry the token's job fields (the coordinator re-issues tokens from them).
    let row = s
        .node
        .statuses()
        .into_iter()
        .find(|c| c.id == queued_q)
        .unwrap();
    let job = row.job.expect("statuses fill the job fields");
    assert_eq!(job.job_id, JobId::from("job-1"));
    assert_eq!(job.job_submit_time_ms, 1000);
    assert_eq!(job.runtime_estimate_ms, Some(10_000));
    assert_eq!(row.container_type, ContainerType::Guaranteed);
    // A running QUEUEABLE container changes class in place.
    let (q3, _) = s.at(2).submit(ContainerType::Queueable, 400, 2);
    s.node.promote(s.now, q3, 1).unwrap();
    s.check();
    assert_eq!(s.node.queueable_allocated(), Resources::ZERO);
    assert_eq!(
        s.node.promote(s.now, q3, 2),
        Err(NodeError::AlreadyGuaranteed { id: q3 })
    );
    // The node's GUARANTEED capacity is now taken (600 + 400): a GUARANTEED arrival is refused,
    // it neither preempts a promoted container nor waits for one.
    let g = s.at(3).container(ContainerType::Guaranteed, 500, 0);
    assert!(matches!(
        s.node.submit(s.now, g),
        Err(NodeError::GuaranteedCapacityExceeded { .. })
    ));
}

#[test]
fn stale_promotion_and_bad_submissions_are_refused_without_state_change() {
    let mut s = Scenario::new(1000, 1000);
    let (q, _) = s.at(0).submit(ContainerType::Queueable, 100, 1);
    assert!(matches!(
        s.node.promote(s.now, q, 0),
        Err(NodeError::StaleVersion { .. })
    ));
    let mut dup = s.container(ContainerType::Queueable, 100, 1);
    dup.id = q;
    assert_eq!(s.node.submit(s.now, dup), Err(NodeError::Duplicate(q)));
    let huge = s.container(ContainerType::Guaranteed, 5000, 1);
    assert!(matches!(
        s.node.submit(s.now, huge),
        Err(NodeError::LargerThanNode { .. })
    ));
    assert!(matches!(
        s.node.stop(s.now, q, &AppId::from("other")),
        Err(NodeError::NotOwner { .. })
    ));
    assert!(s.check().is_empty());
    assert_eq!(s.node.placement(q), Some(Placement::Running));
}

#[test]
fn queue_delay_components() {
    let mut s = Scenario::new(1000, 1000);
    assert_eq!(s.node.queue_delay(s.now).total_ms(), 0.0);
    s.at(0).submit(ContainerType::Guaranteed, 1000, 0);
    // Runs 10 s estimate on the whole node; after 4 s, 6 s remain.
    s.at(4);
    let r = s.node.queue_delay(s.now);
    assert!((r.tr_ms - 6_000.0).abs() < 1e-6, "{r:?}");
    // The node has been unable to take QUEUEABLE work since the GUARANTEED container filled it.
    assert_eq!(r.tl_ms, 4_000.0);
    s.submit(ContainerType::Queueable, 500, 1);
    s.at(7);
    let r = s.node.queue_delay(s.now);
    assert!((r.tq_ms - 5_000.0).abs() < 1e-6, "{r:?}");
    assert_eq!(r.tl_ms, 7_000.0);
    let ev = s.exit_first_running();
    assert_eq!(started(&ev).len(), 1, "the queued container starts");
    assert_eq!(
        s.node.queue_delay(s.now).tl_ms,
        0.0,
        "half the node is free again"
    );
    s.at(20);
    // Past its estimate, a running container keeps 10% of it as remaining time (x 0.5 share).
    assert!((s.node.queue_delay(s.now).tr_ms - 500.0).abs() < 1e-6);
}

#[test]
fn release_and_kill_all_free_everything() {
    let mut s = Scenario::new(1000, 1000);
    let (a, _) = s.at(0).submit(ContainerType::Guaranteed, 700, 0);
    let (b, _) = s.submit(ContainerType::Queueable, 700, 1);
    s.node.stop(s.now, a, &AppId::from("app")).unwrap();
    let ev = s.check();
    assert_eq!(killed(&ev, KillReason::Released), vec![a]);
    assert_eq!(started(&ev), vec![b]);
    s.node.kill_all(s.now, KillReason::Lost, "node drained");
    let ev = s.check();
    assert_eq!(killed(&ev, KillReason::Lost), vec![b]);
    assert_eq!(s.node.allocated(), Resources::ZERO);
}

/// Killing everything (the worker stops, or the node is lost) starts nothing: before, the
/// running containers went first and each removal let a queued container start, which a worker
/// then launched only to kill it a moment later (the user's command ran after the stop began).
#[test]
fn kill_all_starts_none_of_the_work_it_kills() {
    let mut s = Scenario::new(1000, 1000);
    let (running, _) = s.at(0).submit(ContainerType::Guaranteed, 600, 0);
    let (queued, _) = s.submit(ContainerType::Queueable, 600, 1);
    let (also_queued, _) = s.submit(ContainerType::Queueable, 300, 2);
    assert_eq!(s.node.placement(running), Some(Placement::Running));
    assert_eq!(s.node.placement(queued), Some(Placement::Queued));
    assert_eq!(s.node.placement(also_queued), Some(Placement::Running));
    s.node
        .kill_all(s.now, KillReason::Lost, "the worker is shutting down");
    let ev = s.check();
    assert_eq!(started(&ev), Vec::<ContainerId>::new(), "{ev:?}");
    let mut all_killed = killed(&ev, KillReason::Lost);
    all_killed.sort();
    let mut expected = vec![running, queued, also_queued];
    expected.sort();
    assert_eq!(all_killed, expected);
    assert_eq!(s.node.allocated(), Resources::ZERO);
}

/// A long pseudo-random run: the invariants hold after every single step.
#[test]
fn random_walk_keeps_invariants() {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};
    let mut rng = StdRng::seed_from_u64(42);
    let mut s = Scenario::new(4000, 4000);
    let mut live: Vec<ContainerId> = vec![];
    for step in 0..5_000u64 {
        s.now = Time::from_millis(step * 100);
        match rng.random_range(0..10) {
            0..=1 => {
                let spec = s.container(
                    ContainerType::Guaranteed,
                    rng.random_range(1..=20) * 100,
                    rng.random_range(0..100),
                );
                let id = spec.id;
                let fits = s
                    .node
                    .guaranteed_committed()
                    .saturating_add(&spec.resources)
                    .fits_in(&s.node.capacity());
                match s.node.submit(s.now, spec) {
                    Ok(()) => live.push(id),
                    Err(NodeError::GuaranteedCapacityExceeded { .. }) if !fits => {}
                    Err(e) => panic!("refused although it fits: {e}"),
                }
                s.check();
            }
            2..=4 => {
                let (id, _) = s.submit(
                    ContainerType::Queueable,
                    rng.random_range(1..=20) * 100,
                    rng.random_range(0..100),
                );
                live.push(id);
            }
            5..=7 => {
                // A random running container finishes.
                let running: Vec<ContainerId> = live
                    .iter()
                    .copied()
                    .filter(|id| s.node.placement(*id) == Some(Placement::Running))
                    .collect();
                if !running.is_empty() {
                    s.exit(running[rng.random_range(0..running.len())]);
                }
            }
            8 => {
                let t = rng.random_range(0..100_000) as f64;
                s.node.shed_to_threshold(s.now, t);
                s.check();
            }
            _ => {
                if let Some(&id) = live.get(rng.random_range(0..live.len().max(1))) {
                    let v = s.node.spec(id).map(|c| c.version + 1).unwrap_or(1);
                    let _ = s.node.promote(s.now, id, v);
                    s.check();
                }
            }
        }
        live.retain(|id| s.node.placement(*id).is_some());
    }
}

/// Pace §3.2 resizing: a shrunk GUARANTEED container frees room for waiting QUEUEABLE work; its
/// growth back takes free room and preempts QUEUEABLE work (most recent first), and a growth
/// beyond the node's GUARANTEED capacity is refused without changing anything.
#[test]
fn resizing_a_guaranteed_container_moves_the_nodes_accounting() {
    let mut s = Scenario::new(4000, 4000);
    let (g, _) = s.submit(ContainerType::Guaranteed, 3000, 0);
    let (g2, _) = s.submit(ContainerType::Guaranteed, 1000, 0);
    let (q, _) = s.submit(ContainerType::Queueable, 1000, 1);
    assert_eq!(s.node.placement(q), Some(Placement::Queued));
    // Shrink g to 2000: the queued QUEUEABLE container starts in the freed room.
    s.node
        .resize(s.now, g, Resources::new(2000, 2000))
        .expect("shrink");
    let events = s.check();
    assert!(events.contains(&NodeEvent::Start { id: q }), "{events:?}");
    assert_eq!(s.node.allocated(), Resources::new(4000, 4000));
    // Growing g2 by 1000 preempts the QUEUEABLE container.
    s.node
        .resize(s.now, g2, Resources::new(2000, 2000))
        .expect("growth");
    let events = s.check();
    assert!(
        events.iter().any(|e| matches!(
            e,
            NodeEvent::Killed { id, reason: KillReason::PreemptedByGuaranteed, .. } if *id == q
        )),
        "{events:?}"
    );
    // GUARANTEED work holds 4000 now: a growth is refused and nothing changes.
    let err = s
        .node
        .resize(s.now, g, Resources::new(2500, 2000))
        .unwrap_err();
    assert!(
        matches!(err, NodeError::GuaranteedCapacityExceeded { .. }),
        "{err}"
    );
    assert_eq!(
        s.node.spec(g).map(|c| c.resources),
        Some(Resources::new(2000, 2000))
    );
    s.check();
    // Only running GUARANTEED containers are resized.
    assert!(s.node.resize(s.now, q, Resources::new(1, 1)).is_err());
}

/// A worker upgraded in place books the containers it took over as running since they started,
/// without asking to launch them, and refuses one that would over-commit the node.
#[test]
fn an_adopted_running_container_is_booked_without_a_start_and_never_over_commits() {
    let mut s = Scenario::new(1000, 1000);
    s.at(100);
    let g = s.container(ContainerType::Guaranteed, 600, 0);
    let q = s.container(ContainerType::Queueable, 300, 0);
    s.node
        .adopt_running(Time::from_secs(40), g.clone())
        .expect("fits");
    s.node
        .adopt_running(Time::from_secs(90), q.clone())
        .expect("fits");
    assert!(s.check().is_empty(), "no Start for a running container");
    assert_eq!(s.node.placement(g.id), Some(Placement::Running));
    assert_eq!(s.node.allocated(), Resources::new(900, 900));
    assert_eq!(s.node.guaranteed_allocated(), Resources::new(600, 600));
    assert_eq!(
        s.node.elapsed(s.now, g.id),
        Some(std::time::Duration::from_secs(60))
    );
    // Already known, or more than the free room: refused, nothing changes.
    assert_eq!(
        s.node.adopt_running(s.now, g.clone()),
        Err(NodeError::Duplicate(g.id))
    );
    let too_big = s.container(ContainerType::Queueable, 200, 0);
    assert!(matches!(
        s.node.adopt_running(s.now, too_big),
        Err(NodeError::NoRoomToAdopt { .. })
    ));
    assert!(s.check().is_empty());
    assert_eq!(s.node.allocated(), Resources::new(900, 900));
    // Adopted containers end like any other, and queued work starts in their room.
    let (waiting, events) = s.submit(ContainerType::Queueable, 400, 0);
    assert!(started(&events).is_empty());
    s.node.on_exit(s.now, q.id, 3).expect("known");
    let events = s.check();
    assert!(events.contains(&NodeEvent::Finished {
        id: q.id,
        exit_code: 3
    }));
    assert_eq!(started(&events), vec![waiting]);
}

//! Scenario tests of the guarantor holding Morpheus reservations (DESIGN.md "The guarantor: one
//! loop", layer 1; Morpheus §4, §6, §7): asks naming a reservation are granted up to its
//! allocation at that moment and wait beyond it; plain GUARANTEED asks never take reserved
//! capacity; reserved capacity its owner does not use is offered to QUEUEABLE work through the
//! policing limit and taken back when the owner asks; DRA stretches a late job; losing a node
//! replans and cancels the newest reservation. After every step: the plan never exceeds its
//! capacity, no node holds more GUARANTEED work than its capacity, books equal grants, grants made
//! against a reservation never take it beyond its allocation at that moment, and plain grants
//! never take capacity the reservations hold.

mod common;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::guarantor::{
    BestFit, GuaranteedAsk, GuaranteedPlacement, GuaranteedPlacer, Guarantor, GuarantorConfig,
    GuarantorError, QueueableAware, QueueableLoad,
};
use scheduler_core::reservation::book::{
    ReprovisionCause, ReservationBook, ReservationEvent, StoredReservations,
};
use scheduler_core::reservation::dra::Dra;
use scheduler_core::reservation::{
    Algorithm, Interpreter, PlanConfig, Rejection, ReservationDefinition, Stage,
};
use scheduler_core::{AppId, ContainerId, NodeId, Resources};
use std::collections::BTreeMap;

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;
/// A wall-clock day boundary (agenda time 0), far from the epoch like a real clock.
const DAY0: u64 = 20_000 * 24 * HOUR;

const CORE: Resources = Resources {
    cpu_millis: 1000,
    memory_mib: 1024,
};

fn cores(n: u64) -> Resources {
    CORE.scale(n)
}

fn plan_config() -> PlanConfig {
    PlanConfig {
        step_ms: MIN,
        horizon_ms: 24 * HOUR,
        algorithm: Algorithm::LowCost,
        allocate_left: false,
        smoothness: 10,
    }
}

/// `n` cores in one gang for exactly `[from_min, to_min)` of every day.
fn daily(n: u32, from_min: u64, to_min: u64) -> ReservationDefinition {
    ReservationDefinition {
        arrival_ms: from_min * MIN,
        deadline_ms: to_min * MIN,
        interpreter: Interpreter::All,
        stages: vec![Stage {
            containers: n,
            gang: n,
            duration_ms: (to_min - from_min) * MIN,
            size: CORE,
        }],
        recurrence_ms: Some(24 * HOUR),
        alignment_penalty: 0.0,
    }
}

fn ask(app: &str, key: u64, count: u32, runtime_ms: Option<u64>) -> GuaranteedAsk {
    let mut a = common::guaranteed_ask(key, CORE, count);
    a.app_id = AppId::from(app);
    a.runtime_estimate_ms = runtime_ms;
    a
}

/// The guarantor and the per-step invariant checks.
struct Harness {
    g: Guarantor,
    now: u64,
    /// Grants made, by container, with their reservation.
    granted: BTreeMap<ContainerId, Option<String>>,
    /// Steps in which reservation-backed use grew, and plain use grew.
    reserved_growth_steps: usize,
    plain_growth_steps: usize,
}

impl Harness {
    fn new(placer: Box<dyn GuaranteedPlacer>, nodes: &[(&str, u64)]) -> Harness {
        let book = ReservationBook::new(plan_config(), Dra::default()).unwrap();
        let mut g = Guarantor::new(GuarantorConfig::default(), placer, 0).with_reservations(book);
        for (n, c) in nodes {
            g.add_node(NodeId::from(*n), "r".into(), cores(*c));
        }
        let h = Harness {
            g,
            now: DAY0,
            granted: BTreeMap::new(),
            reserved_growth_steps: 0,
            plain_growth_steps: 0,
        };
        h.check(&Snapshot::of(&h), "setup");
        h
    }

    fn at(&mut self, minute: u64) {
        assert!(DAY0 + minute * MIN >= self.now, "time goes forward");
        self.now = DAY0 + minute * MIN;
    }

    /// Run one step and check the invariants after it.
    fn step<T>(&mut self, what: &str, f: impl FnOnce(&mut Guarantor, u64) -> T) -> T {
        let before = Snapshot::of(self);
        let out = f(&mut self.g, self.now);
        self.check(&before, what);
        let after = Snapshot::of(self);
        if after
            .used
            .iter()
            .any(|(id, u)| before.used.get(id).is_none_or(|b| b != u && !u.fits_in(b)))
        {
            self.reserved_growth_steps += 1;
        }
        if after.plain != before.plain && !after.plain.fits_in(&before.plain) {
            self.plain_growth_steps += 1;
        }
        out
    }

    fn schedule(&mut self) -> Vec<GuaranteedPlacement> {
        let p = self.step("schedule", |g, now| g.schedule(now));
        self.record(&p);
        p
    }

    fn record(&mut self, placements: &[GuaranteedPlacement]) {
        for p in placements {
            self.granted.insert(p.token_body.container_id, None);
        }
    }

    fn check(&self, before: &Snapshot, what: &str) {
        let g = &self.g;
        g.check_invariants()
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
        let book = g.reservations();
        for id in book.ids() {
            let used = book.used(id);
            let was = before.used.get(id).copied().unwrap_or_default();
            if used != was && !used.fits_in(&was) {
                let allocated = book.allocated_now(id, self.now).unwrap();
                assert!(
                    used.fits_in(&allocated),
                    "after {what}: reservation {id} grew to {used} beyond its allocation {allocated}"
                );
            }
        }
        // Containers of a reservation that is gone count as plain work from then on; only plain
        // grants must stay outside what the reservations hold.
        let moved = before
            .used
            .iter()
            .filter(|(id, _)| !book.contains(id))
            .fold(Resources::ZERO, |a, (_, u)| a.saturating_add(u));
        let plain = book.plain_used();
        let was = before.plain.saturating_add(&moved);
        if plain != was && !plain.fits_in(&was) {
            let held = book.held(self.now, None);
            assert!(
                plain
                    .saturating_add(&held)
                    .fits_in(&book.cluster_capacity()),
                "after {what}: plain work {plain} took reserved capacity ({held} held of {})",
                book.cluster_capacity()
            );
        }
    }
}

struct Snapshot {
    used: BTreeMap<String, Resources>,
    plain: Resources,
}

impl Snapshot {
    fn of(h: &Harness) -> Snapshot {
        let book = h.g.reservations();
        Snapshot {
            used: book.ids().map(|id| (id.clone(), book.used(id))).collect(),
            plain: book.plain_used(),
        }
    }
}

fn count(p: &[GuaranteedPlacement]) -> usize {
    p.len()
}

#[test]
fn reserved_asks_get_up_to_the_allocation_and_wait_beyond() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 4), ("b", 4), ("c", 4), ("d", 4)]);
    let alloc = h
        .step("reserve", |g, now| {
            g.reserve(now, "etl", AppId::from("etl-app"), daily(8, 600, 660))
        })
        .unwrap();
    assert_eq!(alloc.len(), 1);
    assert_eq!((alloc[0].start_ms, alloc[0].end_ms), (600 * MIN, 660 * MIN));
    assert_eq!(alloc[0].cpu_millis, 8000);

    // Before the window the reservation allocates nothing: the job's asks wait.
    h.at(590);
    h.step("submit", |g, _| {
        g.submit_reserved(ask("etl-app", 1, 12, None), "etl")
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 0);
    assert_eq!(h.g.pending_containers(), 12);

    // Inside it: up to the allocation (8 cores), the rest waits.
    h.at(600);
    assert_eq!(count(&h.schedule()), 8);
    assert_eq!(h.g.pending_containers(), 4);
    assert_eq!(h.g.reservations().used("etl"), cores(8));
    assert_eq!(count(&h.schedule()), 0);

    // One finishes: one more fits the allocation again.
    let first = *h.granted.keys().next().unwrap();
    assert!(h.step("finish", |g, _| g.on_finished(first)));
    h.at(610);
    assert_eq!(count(&h.schedule()), 1);

    // Heartbeat-driven allocation obeys the same rule.
    let second = *h.granted.keys().nth(1).unwrap();
    h.step("finish", |g, _| g.on_finished(second));
    let on_a = h.step("node update", |g, now| {
        let mut all = Vec::new();
        for n in ["a", "b", "c", "d"] {
            all.extend(g.schedule_on_node(now, &NodeId::from(n)));
        }
        all
    });
    h.record(&on_a);
    assert_eq!(on_a.len(), 1);
    assert_eq!(h.g.pending_containers(), 2);

    // The next day's instance allocates the same again (recurring, §6.1).
    let list = h.g.list_reservations(h.now, None);
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].allocated_now, cores(8));
    assert_eq!(
        h.g.reservations()
            .allocated_now("etl", DAY0 + 24 * HOUR + 630 * MIN),
        Some(cores(8))
    );
    assert_eq!(
        h.g.reservations()
            .allocated_now("etl", DAY0 + 24 * HOUR + 700 * MIN),
        Some(Resources::ZERO)
    );
}

#[test]
fn plain_asks_never_take_reserved_capacity() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 8), ("b", 8)]);
    h.step("reserve", |g, now| {
        g.reserve(now, "r", AppId::from("owner"), daily(10, 600, 660))
    })
    .unwrap();

    // In the window: plain work gets the 6 cores outside the reservation, no more.
    h.at(610);
    h.step("submit", |g, _| g.submit(ask("other", 1, 16, None)))
        .unwrap();
    assert_eq!(count(&h.schedule()), 6);
    // The owner still gets its whole allocation.
    h.step("submit", |g, _| {
        g.submit_reserved(ask("owner", 2, 10, None), "r")
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 10);
    assert_eq!(h.g.pending_containers(), 10);

    // A plain ask with a runtime estimate does not start into a window about to begin.
    let mut h = Harness::new(Box::new(BestFit), &[("a", 8), ("b", 8)]);
    h.step("reserve", |g, now| {
        g.reserve(now, "r", AppId::from("owner"), daily(10, 600, 660))
    })
    .unwrap();
    h.at(590);
    h.step("submit", |g, _| {
        g.submit(ask("other", 1, 16, Some(20 * MIN)))
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 6);
    // Short work that ends before the window may use the whole cluster.
    h.step("submit", |g, _| {
        g.submit(ask("other", 2, 16, Some(5 * MIN)))
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 10);
    // Promotions are plain GUARANTEED work too: refused once only reserved capacity is left.
    let all_full = h.step("promote", |g, _| {
        g.promote(
            ContainerId::new(9, 1),
            &NodeId::from("a"),
            &AppId::from("q"),
            CORE,
        )
    });
    assert!(matches!(
        all_full,
        Err(GuarantorError::NoCapacityForPromotion { .. })
    ));
}

#[test]
fn promotion_is_refused_on_reserved_capacity() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 4), ("b", 4)]);
    h.step("reserve", |g, now| {
        g.reserve(now, "r", AppId::from("owner"), daily(6, 600, 660))
    })
    .unwrap();
    h.at(600);
    h.step("tick", |g, now| g.schedule(now));
    // 2 cores are outside the reservation.
    for seq in 1..=2 {
        h.step("promote", |g, _| {
            g.promote(
                ContainerId::new(9, seq),
                &NodeId::from("a"),
                &AppId::from("q"),
                CORE,
            )
        })
        .unwrap();
    }
    let third = h.step("promote", |g, _| {
        g.promote(
            ContainerId::new(9, 3),
            &NodeId::from("b"),
            &AppId::from("q"),
            CORE,
        )
    });
    assert_eq!(third, Err(GuarantorError::ReservedCapacity));
    assert!(third.unwrap_err().retryable());
}

#[test]
fn unused_reserved_capacity_goes_to_queueable_work_and_is_taken_back() {
    let a = NodeId::from("a");
    let mut h = Harness::new(Box::new(QueueableAware::default()), &[("a", 8)]);
    h.step("limits", |g, _| g.take_changed_limits());
    h.step("reserve", |g, now| {
        g.reserve(now, "r", AppId::from("owner"), daily(4, 600, 660))
    })
    .unwrap();
    h.at(610);
    h.schedule();
    // The owner runs nothing yet: the whole node is offered to QUEUEABLE work.
    assert_eq!(h.g.queueable_limit(&a), Some(cores(8)));
    h.step("heartbeat", |g, _| {
        g.report_queueable_load(
            &a,
            QueueableLoad {
                running: cores(8),
                queued_count: 0,
            },
        )
    });
    // The owner asks: granted at once, preempting QUEUEABLE work on the node.
    assert_eq!(
        h.g.node(&a).unwrap().queueable_preempted_by(&cores(4)),
        cores(4)
    );
    h.step("submit", |g, _| {
        g.submit_reserved(ask("owner", 1, 4, None), "r")
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 4);
    // The policing limit follows: the node now offers QUEUEABLE work only what is left.
    let limits = h.step("limits", |g, _| g.take_changed_limits());
    assert_eq!(limits, vec![(a.clone(), cores(4))]);
    // The owner finishes: its capacity returns to QUEUEABLE work.
    let ids: Vec<ContainerId> = h.granted.keys().copied().collect();
    for id in ids {
        h.step("finish", |g, _| g.on_finished(id));
    }
    let limits = h.step("limits", |g, _| g.take_changed_limits());
    assert_eq!(limits, vec![(a, cores(8))]);
}

#[test]
fn dra_stretches_a_late_job_then_the_stretch_ends() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 8), ("b", 8)]);
    h.step("reserve", |g, now| {
        g.reserve(now, "r", AppId::from("owner"), daily(4, 600, 620))
    })
    .unwrap();
    h.at(600);
    h.step("submit", |g, _| {
        g.submit_reserved(ask("owner", 1, 4, None), "r")
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 4);
    // The job runs late: at minute 619 it asks for 3 more; it waits.
    h.at(619);
    h.step("submit", |g, _| {
        g.submit_reserved(ask("owner", 2, 3, None), "r")
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 0);
    // DRA (§7): demand 7 above the allocation of 4, capped at ρ · recent max (2 × 4 = 8).
    assert_eq!(h.step("dra", |g, now| g.reprovision(now)), 1);
    let events = h.step("events", |g, _| g.take_reservation_events());
    match &events[..] {
        [
            ReservationEvent::Reprovisioned {
                id,
                owner,
                cause: ReprovisionCause::Stretched { extra, until_ms },
                ..
            },
        ] => {
            assert_eq!((id.as_str(), owner.as_str()), ("r", "owner"));
            assert_eq!(*extra, cores(3));
            assert_eq!(*until_ms, DAY0 + 620 * MIN);
        }
        other => panic!("unexpected events {other:?}"),
    }
    assert_eq!(count(&h.schedule()), 3);
    // A second pass within T does not stack another stretch.
    assert_eq!(h.step("dra", |g, now| g.reprovision(now)), 0);
    // After T the stretch is gone, and so is the window: new asks wait.
    h.at(621);
    h.step("submit", |g, _| {
        g.submit_reserved(ask("owner", 3, 1, None), "r")
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 0);
    assert_eq!(
        h.g.reservations().allocated_now("r", h.now),
        Some(Resources::ZERO)
    );
    assert_eq!(h.g.reservations().plan().reservations().count(), 1);
}

#[test]
fn losing_a_node_cancels_the_newest_reservation_and_tells_its_owner() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 4), ("b", 4)]);
    h.step("reserve", |g, now| {
        g.reserve(now, "old", AppId::from("o1"), daily(4, 600, 660))
    })
    .unwrap();
    h.step("reserve", |g, now| {
        g.reserve(now, "new", AppId::from("o2"), daily(4, 600, 660))
    })
    .unwrap();
    // Full: a third is rejected with a reason.
    let third = h.step("reserve", |g, now| {
        g.reserve(now, "third", AppId::from("o3"), daily(1, 600, 660))
    });
    assert!(matches!(third, Err(Rejection::NoPlacement(_))), "{third:?}");
    h.at(600);
    h.step("submit", |g, _| {
        g.submit_reserved(ask("o2", 7, 8, None), "new")
    })
    .unwrap();
    h.schedule();
    h.step("submit", |g, _| {
        g.submit_reserved(ask("o1", 8, 4, None), "old")
    })
    .unwrap();
    h.schedule();
    assert_eq!(h.g.pending_containers(), 4);
    let lost = h.step("remove node", |g, _| g.remove_node(&NodeId::from("b")));
    assert_eq!(lost.len(), 4);
    let events = h.step("events", |g, _| g.take_reservation_events());
    assert_eq!(
        events,
        vec![ReservationEvent::Cancelled {
            id: "new".into(),
            owner: AppId::from("o2"),
            reason: "the cluster lost node b and the reservation no longer fits".into(),
            dropped_asks: vec![7],
        }]
    );
    assert!(h.g.reservations().contains("old"));
    assert!(!h.g.reservations().contains("new"));
    assert_eq!(h.g.reservations().plan_capacity(), cores(4));
    // The cancelled reservation's running containers are plain GUARANTEED work now.
    assert_eq!(h.g.pending_containers(), 0);
}

/// Draining a node takes its capacity out of the plan like a loss (replanning cancels what no
/// longer fits), without touching what runs there; undraining gives it back.
#[test]
fn draining_a_node_replans_without_it_and_undraining_restores_it() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 4), ("b", 4)]);
    for (id, owner) in [("old", "o1"), ("new", "o2")] {
        h.step("reserve", |g, now| {
            g.reserve(now, id, AppId::from(owner), daily(4, 600, 660))
        })
        .unwrap();
    }
    let b = NodeId::from("b");
    assert!(h.step("drain", |g, _| g.set_draining(&b, true)));
    let events = h.step("events", |g, _| g.take_reservation_events());
    assert_eq!(
        events,
        vec![ReservationEvent::Cancelled {
            id: "new".into(),
            owner: AppId::from("o2"),
            reason: "node b is being drained and the reservation no longer fits".into(),
            dropped_asks: vec![],
        }]
    );
    assert_eq!(h.g.reservations().plan_capacity(), cores(4));
    // Losing the draining node does not shrink the plan twice.
    h.step("remove node", |g, _| g.remove_node(&b));
    assert_eq!(h.g.reservations().plan_capacity(), cores(4));
    // It re-joins while still draining: still out of the plan; undrained: back in.
    h.step("re-join", |g, _| {
        g.add_node(b.clone(), "r".into(), cores(4))
    });
    assert_eq!(h.g.reservations().plan_capacity(), cores(4));
    assert!(h.step("undrain", |g, _| g.set_draining(&b, false)));
    assert_eq!(h.g.reservations().plan_capacity(), cores(8));
    h.step("reserve", |g, now| {
        g.reserve(now, "again", AppId::from("o2"), daily(4, 600, 660))
    })
    .unwrap();
}

#[test]
fn asks_and_changes_are_checked() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 4)]);
    let bad = h.step("reserve", |g, now| {
        g.reserve(now, "no/slash", AppId::from("o"), daily(2, 600, 660))
    });
    assert!(
        matches!(&bad, Err(Rejection::Invalid(m)) if m.starts_with("reservation_id")),
        "{bad:?}"
    );
    h.step("reserve", |g, now| {
        g.reserve(now, "r", AppId::from("o"), daily(2, 600, 660))
    })
    .unwrap();
    assert_eq!(
        h.step("reserve", |g, now| g.reserve(
            now,
            "r",
            AppId::from("o"),
            daily(1, 0, 10)
        )),
        Err(Rejection::Duplicate("r".into()))
    );
    assert_eq!(
        h.step("submit", |g, _| g
            .submit_reserved(ask("o", 1, 1, None), "nope")),
        Err(GuarantorError::UnknownReservation("nope".into()))
    );
    assert_eq!(
        h.step("submit", |g, _| g
            .submit_reserved(ask("x", 1, 1, None), "r")),
        Err(GuarantorError::NotReservationOwner("r".into()))
    );
    let mut big = ask("o", 1, 1, None);
    big.resources = cores(3);
    assert!(matches!(
        h.step("submit", |g, _| g.submit_reserved(big, "r")),
        Err(GuarantorError::LargerThanReservation { .. })
    ));
    assert_eq!(
        h.step("update", |g, now| g.update_reservation(
            now,
            "r",
            Some(&AppId::from("x")),
            daily(1, 0, 10)
        )),
        Err(Rejection::NotOwner("r".into()))
    );
    // The owner moves it; an update that cannot fit keeps the old allocation.
    let moved = h
        .step("update", |g, now| {
            g.update_reservation(now, "r", Some(&AppId::from("o")), daily(3, 60, 120))
        })
        .unwrap();
    assert_eq!(moved[0].start_ms, 60 * MIN);
    let too_big = h.step("update", |g, now| {
        g.update_reservation(now, "r", None, daily(5, 60, 120))
    });
    assert!(too_big.is_err());
    assert_eq!(h.g.reservations().plan().allocation("r").unwrap(), moved);

    // Deleting drops waiting asks and turns running containers into plain work.
    h.at(60);
    h.step("submit", |g, _| {
        g.submit_reserved(ask("o", 5, 4, None), "r")
    })
    .unwrap();
    assert_eq!(count(&h.schedule()), 3);
    assert_eq!(
        h.step("delete", |g, _| g
            .delete_reservation("r", Some(&AppId::from("x")))),
        Err(Rejection::NotOwner("r".into()))
    );
    let dropped = h
        .step("delete", |g, _| {
            g.delete_reservation("r", Some(&AppId::from("o")))
        })
        .unwrap();
    assert_eq!(dropped, vec![5]);
    assert_eq!(h.g.reservations().plain_used(), cores(3));
    assert_eq!(h.g.pending_containers(), 0);
    assert_eq!(
        h.step("delete", |g, _| g.delete_reservation("r", None)),
        Err(Rejection::Unknown("r".into()))
    );
}

#[test]
fn stored_reservations_are_restored_with_their_allocation() {
    let mut h = Harness::new(Box::new(BestFit), &[("a", 4), ("b", 4)]);
    h.step("reserve", |g, now| {
        g.reserve(now, "r", AppId::from("o"), daily(6, 600, 660))
    })
    .unwrap();
    h.at(600);
    h.step("submit", |g, _| {
        g.submit_reserved(ask("o", 1, 8, None), "r")
    })
    .unwrap();
    h.schedule();
    h.step("dra", |g, now| g.reprovision(now));
    let stored = h.g.reservations().stored();
    let bytes = serde_json::to_vec(&stored).unwrap();
    let back: StoredReservations = serde_json::from_slice(&bytes).unwrap();
    let book = ReservationBook::restore(back, Dra::default()).unwrap();
    // A restarted guarantor: nodes re-join one by one; the plan keeps its capacity meanwhile.
    let mut g =
        Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0).with_reservations(book);
    assert_eq!(g.reservations().plan_capacity(), cores(8));
    g.add_node(NodeId::from("a"), "r".into(), cores(4));
    assert_eq!(g.reservations().plan_capacity(), cores(8));
    assert_eq!(
        g.reservations().allocated_now("r", DAY0 + 610 * MIN),
        Some(cores(6))
    );
    // No stretch survives a restart.
    assert_eq!(g.reservations().plan().reservations().count(), 1);
    g.check_invariants().unwrap();
    // A damaged record is refused, not loaded.
    let mut bad = g.reservations().stored();
    bad.owners.insert("ghost".into(), AppId::from("o"));
    assert!(ReservationBook::restore(bad, Dra::default()).is_err());
    let mut bad = g.reservations().stored();
    bad.owners.clear();
    let e = ReservationBook::restore(bad, Dra::default()).unwrap_err();
    assert!(e.contains("no owner"), "{e}");
}

/// Random operations on a small cluster, invariants after every step.
#[test]
fn random_operations_keep_the_invariants() {
    for seed in 0..8u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let placer: Box<dyn GuaranteedPlacer> = if seed % 2 == 0 {
            Box::new(BestFit)
        } else {
            Box::new(QueueableAware::default())
        };
        let names = ["a", "b", "c", "d", "e"];
        let mut h = Harness::new(placer, &[("a", 8), ("b", 8), ("c", 4), ("d", 4)]);
        let apps = ["p", "q", "r"];
        let mut next_key = 0u64;
        let mut next_res = 0u32;
        let mut minute = 0u64;
        for _ in 0..400 {
            match rng.random_range(0..100u32) {
                0..12 => {
                    let from = rng.random_range(0..1400u64);
                    let len = rng.random_range(1..40u64);
                    let n = rng.random_range(1..10u32);
                    let app = apps[rng.random_range(0..apps.len())];
                    next_res += 1;
                    let id = format!("res-{next_res}");
                    let mut def = daily(n, from, (from + len).min(1440));
                    def.deadline_ms = ((from + len + rng.random_range(0..30u64)).min(1440)) * MIN;
                    let _ = h.step("reserve", |g, now| {
                        g.reserve(now, &id, AppId::from(app), def)
                    });
                }
                12..40 => {
                    next_key += 1;
                    let key = next_key;
                    let count = rng.random_range(1..6u32);
                    let runtime = rng.random_bool(0.5).then(|| rng.random_range(1..90) * MIN);
                    let ids: Vec<(String, AppId)> =
                        h.g.list_reservations(h.now, None)
                            .into_iter()
                            .map(|r| (r.id, r.owner))
                            .collect();
                    if !ids.is_empty() && rng.random_bool(0.6) {
                        let (id, owner) = &ids[rng.random_range(0..ids.len())];
                        let a = ask(owner.as_str(), key, count, runtime);
                        let _ = h.step("submit reserved", |g, _| g.submit_reserved(a, id));
                    } else {
                        let a = ask("plain", key, count, runtime);
                        let _ = h.step("submit", |g, _| g.submit(a));
                    }
                }
                40..60 => {
                    minute = (minute + rng.random_range(0..20u64)).min(3 * 1440);
                    h.at(minute);
                    h.schedule();
                }
                60..66 => {
                    let n = NodeId::from(names[rng.random_range(0..names.len())]);
                    let p = h.step("node update", |g, now| g.schedule_on_node(now, &n));
                    h.record(&p);
                }
                66..80 => {
                    if !h.granted.is_empty() {
                        let i = rng.random_range(0..h.granted.len());
                        let id = *h.granted.keys().nth(i).unwrap();
                        h.granted.remove(&id);
                        h.step("finish", |g, _| g.on_finished(id));
                    }
                }
                80..86 => {
                    h.step("dra", |g, now| g.reprovision(now));
                }
                86..89 => {
                    let n = names[rng.random_range(0..names.len())];
                    h.step("remove node", |g, _| g.remove_node(&NodeId::from(n)));
                }
                89..93 => {
                    let n = names[rng.random_range(0..names.len())];
                    // A node keeps its capacity across re-joins.
                    let c = if n == "a" || n == "b" { 8 } else { 4 };
                    h.step("add node", |g, _| {
                        g.add_node(NodeId::from(n), "r".into(), cores(c))
                    });
                }
                93..96 => {
                    let ids: Vec<String> = h.g.reservations().ids().cloned().collect();
                    if !ids.is_empty() {
                        let id = &ids[rng.random_range(0..ids.len())];
                        let _ = h.step("delete", |g, _| g.delete_reservation(id, None));
                    }
                }
                96..98 => {
                    let _ = h.step("expire", |g, now| g.expire_unstarted(now));
                }
                _ => {
                    let n = NodeId::from(names[rng.random_range(0..names.len())]);
                    let seq = rng.random_range(1..1000u64);
                    let _ = h.step("promote", |g, _| {
                        g.promote(ContainerId::new(77, seq), &n, &AppId::from("q"), CORE)
                    });
                }
            }
            let _ = h.g.take_reservation_events();
        }
        assert!(
            h.reserved_growth_steps > 5 && h.plain_growth_steps > 5,
            "seed {seed}: the run exercised too little ({} reserved, {} plain growth steps)",
            h.reserved_growth_steps,
            h.plain_growth_steps
        );
    }
}

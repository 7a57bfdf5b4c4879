//! Issue 11, "GUARANTEED capacity is never granted twice" and "lost means gone", at the
//! coordinator over real QUIC on loopback with a hand-written worker client and a manual clock:
//! a node declared lost is told to kill what it still runs when it re-joins (also after a
//! coordinator restart), and a node's re-join voids the unstarted grants of its earlier session.

mod common;

use common::*;
use coordinator::coordinator_actor::Tick;
use coordinator::guarantor_actor::InspectGuarantor;
use scheduler_core::liveness::JOIN_ANSWER_LIMIT;
use scheduler_core::protocol::cluster::{CoordinatorToWorker, JoinAccepted, WorkerToCoordinator};
use scheduler_core::{ContainerId, ContainerType, NodeId, Resources};
use std::time::Duration;

fn rejoin_msg(
    h: &Harness,
    node: &str,
    containers: Vec<scheduler_core::node::ContainerStatus>,
) -> WorkerToCoordinator {
    let mut join = join_msg(&h.join_token(), node, 2000, 2048);
    if let WorkerToCoordinator::Join(j) = &mut join {
        j.containers = containers;
    }
    join
}

async fn rejoin(
    h: &Harness,
    node: &str,
    containers: Vec<scheduler_core::node::ContainerStatus>,
) -> (TestWorker, JoinAccepted) {
    let mut w = h.connect().await;
    w.send(&rejoin_msg(h, node, containers)).await;
    match w.next().await {
        Ok(CoordinatorToWorker::JoinAccepted(a)) => (w, a),
        other => panic!("re-join of {node} not accepted: {other:?}"),
    }
}

async fn booked(h: &Harness, node: &str) -> Resources {
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    stats.invariants.clone().unwrap();
    stats
        .booked
        .get(&NodeId::from(node))
        .copied()
        .unwrap_or_default()
}

/// Node b runs a GUARANTEED and a QUEUEABLE container, goes silent past the node timeout and is
/// declared lost (its containers reported lost). When it comes back with them still running it
/// must kill them, not have them re-adopted.
async fn lose_node_b(h: &Harness) -> (TestWorker, Vec<ContainerId>) {
    let (mut a, accepted_a) = h.join("node-a", 2000, 2048).await;
    let (mut b, _) = h.join("node-b", 2000, 2048).await;
    b.send(&allocate_guaranteed(1, "demo", 2000, 2048, 2)).await;
    let mut on_b = None;
    while on_b.is_none() {
        if let CoordinatorToWorker::GuaranteedAllocated(g) = b
            .expect("grants", |m| {
                matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
            })
            .await
        {
            on_b = g
                .containers
                .iter()
                .find(|c| c.node_id.as_str() == "node-b")
                .map(|c| c.container_id);
        }
    }
    let on_b = on_b.unwrap();
    let from_a = ContainerId::new(accepted_a.issuer, 1);
    b.send(&heartbeat(
        "node-b",
        0,
        0.0,
        vec![
            running(from_a, ContainerType::Queueable, 100, 100),
            running(on_b, ContainerType::Guaranteed, 2000, 2048),
        ],
        vec![from_a, on_b],
        vec![],
    ))
    .await;
    b.expect_ack().await;
    h.clock.advance(Duration::from_secs(11));
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    h.server.coordinator.send(Tick).await.unwrap();
    let closed = b.expect_closed().await;
    assert!(closed.contains("code 4"), "{closed}");
    let mut ids = vec![from_a, on_b];
    ids.sort_unstable();
    (a, ids)
}

#[actix_rt::test]
async fn a_node_declared_lost_kills_what_it_still_runs_when_it_rejoins() {
    let h = Harness::start().await;
    let (_a, lost) = lose_node_b(&h).await;
    let statuses: Vec<_> = lost
        .iter()
        .map(|&id| match id.issuer() {
            0 => running(id, ContainerType::Guaranteed, 2000, 2048),
            _ => running(id, ContainerType::Queueable, 100, 100),
        })
        .collect();
    let (mut b, accepted) = rejoin(&h, "node-b", statuses.clone()).await;
    assert_eq!(
        accepted.lost_containers, lost,
        "told to kill what was reported lost"
    );
    // Not re-adopted: the guarantor books nothing for the lost GUARANTEED container.
    assert_eq!(booked(&h, "node-b").await, Resources::ZERO);
    // A heartbeat queued before the worker acted still lists them: still not adopted.
    b.send(&heartbeat("node-b", 0, 0.0, statuses, vec![], vec![]))
        .await;
    b.expect_ack().await;
    assert_eq!(booked(&h, "node-b").await, Resources::ZERO);
    // The worker killed them; its capacity is whole again, for new GUARANTEED work too.
    b.send(&heartbeat("node-b", 0, 0.0, vec![], vec![], lost.clone()))
        .await;
    b.expect_ack().await;
    b.send(&allocate_guaranteed(9, "demo", 2000, 2048, 1)).await;
    b.expect(
        "a grant on the whole node",
        |m| matches!(m, CoordinatorToWorker::GuaranteedAllocated(g) if g.correlation_id == 9),
    )
    .await;
    // Once it has reported without them, a later re-join (a network blip) re-adopts again.
    drop(b);
    let kept = ContainerId::new(0, 4242);
    let (_b, accepted) = rejoin(
        &h,
        "node-b",
        vec![running(kept, ContainerType::Guaranteed, 500, 500)],
    )
    .await;
    assert!(accepted.lost_containers.is_empty(), "{accepted:?}");
}

#[test]
fn a_lost_node_is_still_told_to_kill_after_a_coordinator_restart() {
    let dir = initialised_data_dir();
    let (dir, lost) = actix_rt::System::new().block_on(async {
        let h = Harness::start_in(dir).await;
        let (_a, lost) = lose_node_b(&h).await;
        h.server.shutdown();
        (h.dir, lost)
    });
    actix_rt::System::new().block_on(async {
        let h = Harness::start_in(dir).await;
        let statuses = lost
            .iter()
            .map(|&id| running(id, ContainerType::Queueable, 100, 100))
            .collect();
        let (_b, accepted) = rejoin(&h, "node-b", statuses).await;
        assert_eq!(accepted.lost_containers, lost);
        h.server.shutdown();
    });
}

#[actix_rt::test]
async fn a_rejoin_voids_the_unstarted_grants_of_the_nodes_earlier_session() {
    let h = Harness::start().await;
    let (mut a, first) = h.join("node-a", 2000, 2048).await;
    a.send(&allocate_guaranteed(1, "demo", 1500, 1500, 1)).await;
    let grant = match a
        .expect("grant", |m| {
            matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
        })
        .await
    {
        CoordinatorToWorker::GuaranteedAllocated(g) => g.containers[0].clone(),
        _ => unreachable!(),
    };
    assert_eq!(
        grant.token.body.node_epoch, first.issuer,
        "bound to the session"
    );
    assert_eq!(booked(&h, "node-a").await, Resources::new(1500, 1500));
    // The node re-joins (a new session replaces the old one) before the grant started: the
    // node will refuse the old session's grant, so the guarantor must not keep booking it.
    let (mut a2, second) = rejoin(&h, "node-a", vec![]).await;
    assert_ne!(second.issuer, first.issuer);
    a2.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    a2.expect_ack().await;
    assert_eq!(booked(&h, "node-a").await, Resources::ZERO);
    // New grants are for the new session.
    a2.send(&allocate_guaranteed(2, "demo", 2000, 2048, 1))
        .await;
    match a2
        .expect(
            "grant",
            |m| matches!(m, CoordinatorToWorker::GuaranteedAllocated(g) if g.correlation_id == 2),
        )
        .await
    {
        CoordinatorToWorker::GuaranteedAllocated(g) => {
            assert_eq!(g.containers[0].token.body.node_epoch, second.issuer)
        }
        _ => unreachable!(),
    }
    drop(a);
}

/// A worker that crashed and restarted (its predecessor's containers killed at start) re-joins
/// before it was declared lost, holding nothing: the guarantor must not keep booking the
/// GUARANTEED containers it no longer runs; one that re-joins still holding them keeps them.
#[actix_rt::test]
async fn a_rejoin_frees_the_bookings_of_guaranteed_containers_the_node_no_longer_holds() {
    let h = Harness::start().await;
    let (mut a, _) = h.join("node-a", 2000, 2048).await;
    a.send(&allocate_guaranteed(1, "demo", 1500, 1500, 1)).await;
    let id = match a
        .expect("grant", |m| {
            matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
        })
        .await
    {
        CoordinatorToWorker::GuaranteedAllocated(g) => g.containers[0].container_id,
        _ => unreachable!(),
    };
    let held = vec![running(id, ContainerType::Guaranteed, 1500, 1500)];
    a.send(&heartbeat("node-a", 0, 0.0, held.clone(), vec![id], vec![]))
        .await;
    a.expect_ack().await;
    // A network blip: the same worker re-joins still running it; the booking stays.
    let (mut a2, _) = rejoin(&h, "node-a", held).await;
    a2.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    a2.expect_ack().await;
    assert_eq!(booked(&h, "node-a").await, Resources::new(1500, 1500));
    // The worker crashed and restarted with nothing: the booking goes.
    let (mut a3, _) = rejoin(&h, "node-a", vec![]).await;
    a3.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    a3.expect_ack().await;
    assert_eq!(booked(&h, "node-a").await, Resources::ZERO);
    drop((a, a2));
}

/// A GUARANTEED container the guarantor does not book (a grant of the node's previous session
/// started in the window of its re-join) is booked as soon as a heartbeat reports it started, so
/// the books never under-count what the node runs.
#[actix_rt::test]
async fn a_reported_guaranteed_container_the_books_do_not_hold_is_booked() {
    let h = Harness::start().await;
    let (mut a, _) = h.join("node-a", 2000, 2048).await;
    let unknown = ContainerId::new(0, 4_000_000);
    let held = vec![running(unknown, ContainerType::Guaranteed, 1200, 1200)];
    a.send(&heartbeat("node-a", 0, 0.0, held, vec![unknown], vec![]))
        .await;
    a.expect_ack().await;
    assert_eq!(booked(&h, "node-a").await, Resources::new(1200, 1200));
    // It finishes: the booking goes.
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![unknown]))
        .await;
    a.expect_ack().await;
    assert_eq!(booked(&h, "node-a").await, Resources::ZERO);
}

/// Joins `count` nodes `storm-N` straight into the coordinator actor (no QUIC: the storm is
/// about the actor's store writes), each reporting one running QUEUEABLE container; returns the
/// sessions' queues (kept open) and each node's container.
/// A join sent to the coordinator actor directly (no QUIC session): its outcome and the
/// session's queue.
async fn join_in_process(
    h: &Harness,
    session_id: u64,
    node: &str,
    containers: Vec<scheduler_core::node::ContainerStatus>,
) -> (
    coordinator::coordinator_actor::JoinOutcome,
    tokio::sync::mpsc::Receiver<coordinator::session::ToWorker>,
) {
    let WorkerToCoordinator::Join(join) = rejoin_msg(h, node, containers) else {
        unreachable!()
    };
    let (tx, rx) = coordinator::session::WorkerTx::bounded(64, None);
    let outcome = h
        .server
        .coordinator
        .send(coordinator::coordinator_actor::WorkerJoined {
            session_id,
            join,
            tx,
            connection: None,
        })
        .await
        .unwrap();
    (outcome, rx)
}

async fn join_storm(
    h: &Harness,
    count: u32,
) -> (
    Vec<tokio::sync::mpsc::Receiver<coordinator::session::ToWorker>>,
    Vec<ContainerId>,
) {
    use coordinator::coordinator_actor::JoinOutcome;
    let (mut queues, mut containers) = (Vec::new(), Vec::new());
    for i in 0..count {
        let id = ContainerId::new(7, u64::from(i) + 1);
        let (outcome, rx) = join_in_process(
            h,
            1_000_000 + u64::from(i),
            &format!("storm-{i}"),
            vec![running(id, ContainerType::Queueable, 100, 100)],
        )
        .await;
        assert!(
            matches!(outcome, JoinOutcome::Accepted { .. }),
            "{outcome:?}"
        );
        queues.push(rx);
        containers.push(id);
    }
    (queues, containers)
}

/// Issue 17: 1,000 nodes lost in one tick are stored as lost in ONE store write (before, one
/// synced commit each on the coordinator's thread), and the write happens before anything of
/// the losses leaves the actor, so a restarted coordinator still has every one of them kill
/// what it re-joins with.
#[test]
fn a_storm_of_losses_in_one_tick_is_stored_in_one_write() {
    const NODES: u32 = 1000;
    let dir = initialised_data_dir();
    let (dir, containers) = actix_rt::System::new().block_on(async {
        // Every node silent at once is a mass silence the loss guard would hold; this test is
        // about storing a batch of losses, so the guard's share rule is off.
        let h = Harness::start_in_with(dir, |s| s.mass_silence_share = 2.0).await;
        let (_queues, containers) = join_storm(&h, NODES).await;
        let writes = h.server.metrics.lost_node_writes.get();
        // Joined and never heard from: still receiving their join answers until the limit.
        h.clock.advance(JOIN_ANSWER_LIMIT + Duration::from_secs(1));
        h.server.coordinator.send(Tick).await.unwrap();
        assert_eq!(h.server.metrics.nodes_lost.get(), u64::from(NODES));
        assert_eq!(
            h.server.metrics.lost_node_writes.get() - writes,
            1,
            "one store write for the whole batch of losses"
        );
        // Nothing changed since: the next tick writes nothing.
        h.server.coordinator.send(Tick).await.unwrap();
        assert_eq!(h.server.metrics.lost_node_writes.get() - writes, 1);
        h.server.shutdown();
        (h.dir, containers)
    });
    actix_rt::System::new().block_on(async {
        let h = Harness::start_in(dir).await;
        for i in [0, NODES / 2, NODES - 1] {
            let id = containers[i as usize];
            let (_w, accepted) = rejoin(
                &h,
                &format!("storm-{i}"),
                vec![running(id, ContainerType::Queueable, 100, 100)],
            )
            .await;
            assert_eq!(accepted.lost_containers, vec![id], "storm-{i}");
        }
        h.server.shutdown();
    });
}

/// Issue 17: nodes that come back whole after being declared lost leave the stored lost set in
/// one write per tick, not one per node: the first at once (as before: an isolated re-join is
/// stored at its first heartbeat without the killed containers), the others at the next tick;
/// after it, a restarted coordinator re-adopts what they run (no stale entry).
#[test]
fn a_storm_of_rejoins_leaves_the_lost_set_in_one_write_per_tick() {
    use coordinator::coordinator_actor::FromWorker;
    const NODES: u32 = 200;
    let dir = initialised_data_dir();
    let dir = actix_rt::System::new().block_on(async {
        // As above: the guard's share rule is off, so the storm is lost in one tick.
        let h = Harness::start_in_with(dir, |s| s.mass_silence_share = 2.0).await;
        let (_lost_queues, containers) = join_storm(&h, NODES).await;
        // Joined and never heard from: still receiving their join answers until the limit.
        h.clock.advance(JOIN_ANSWER_LIMIT + Duration::from_secs(1));
        h.server.coordinator.send(Tick).await.unwrap();
        assert_eq!(h.server.metrics.nodes_lost.get(), u64::from(NODES));
        // They re-join with their containers (told to kill them), then report without them.
        let (_queues, _) = join_storm(&h, NODES).await;
        let writes = h.server.metrics.lost_node_writes.get();
        let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(NODES as usize));
        for i in 0..NODES {
            h.server
                .coordinator
                .send(FromWorker {
                    session_id: 1_000_000 + u64::from(i),
                    msg: heartbeat(
                        &format!("storm-{i}"),
                        0,
                        0.0,
                        vec![],
                        vec![],
                        vec![containers[i as usize]],
                    ),
                    in_flight: permits.clone().try_acquire_owned().unwrap(),
                    received: std::time::Instant::now(),
                })
                .await
                .unwrap();
        }
        assert_eq!(
            h.server.metrics.lost_node_writes.get() - writes,
            1,
            "the first node back whole is stored at once, the others wait for the tick"
        );
        h.server.coordinator.send(Tick).await.unwrap();
        assert_eq!(h.server.metrics.lost_node_writes.get() - writes, 2);
        h.server.shutdown();
        h.dir
    });
    actix_rt::System::new().block_on(async {
        let h = Harness::start_in(dir).await;
        for i in [0, NODES / 2, NODES - 1] {
            let started_since = ContainerId::new(9, u64::from(i) + 1);
            let (_w, accepted) = rejoin(
                &h,
                &format!("storm-{i}"),
                vec![running(started_since, ContainerType::Queueable, 100, 100)],
            )
            .await;
            assert!(
                accepted.lost_containers.is_empty(),
                "storm-{i}: {accepted:?}"
            );
        }
        h.server.shutdown();
    });
}

/// "Lost means gone" needs the loss stored before anyone hears of it: a coordinator that told
/// the apps and then restarted without the record would re-adopt what they were told is gone.
/// While the store refuses the lost-node set, the loss is announced to nobody (no `lost` notice
/// to the issuer, the node's session open, its bookings kept); the next tick's write that
/// succeeds lets it all out. Before, a failed write was logged and the loss announced anyway.
#[actix_rt::test]
async fn a_loss_the_store_refused_is_announced_only_once_it_is_stored() {
    use scheduler_core::coordinator::NoticeKind;
    let h = Harness::start().await;
    let (mut a, accepted_a) = h.join("node-a", 2000, 2048).await;
    let (mut b, _) = h.join("node-b", 2000, 2048).await;
    let from_a = ContainerId::new(accepted_a.issuer, 1);
    b.send(&heartbeat(
        "node-b",
        0,
        0.0,
        vec![running(from_a, ContainerType::Queueable, 100, 100)],
        vec![from_a],
        vec![],
    ))
    .await;
    b.expect_ack().await;
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    assert!(
        ack.notices.iter().all(|n| n.kind != NoticeKind::Lost),
        "{ack:?}"
    );

    // One grant before the outage, so that the guarantor's block of container ids is stored and
    // grants during it need no write.
    a.send(&allocate_guaranteed(6, "demo", 100, 100, 1)).await;
    a.expect("grant", |m| {
        matches!(m, CoordinatorToWorker::GuaranteedAllocated(g) if g.correlation_id == 6 && g.remaining == 0)
    })
    .await;

    h.server.store.refuse_writes(true);
    h.clock.advance(Duration::from_secs(11));
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    h.server.coordinator.send(Tick).await.unwrap();
    assert_eq!(
        h.server.metrics.nodes_lost.get(),
        0,
        "a loss that is not stored is not announced"
    );
    assert_eq!(h.server.metrics.losses_not_stored.get(), 1);
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    assert!(
        ack.notices.iter().all(|n| n.kind != NoticeKind::Lost),
        "the issuer heard of a loss the store does not hold: {ack:?}"
    );
    // The silent node gets no new GUARANTEED work while its loss is held: of two containers
    // that fit one per node, one is granted on node-a and the other waits.
    a.send(&allocate_guaranteed(7, "demo", 1500, 1500, 2)).await;
    let CoordinatorToWorker::GuaranteedAllocated(granted) = a
        .expect(
            "grant",
            |m| matches!(m, CoordinatorToWorker::GuaranteedAllocated(g) if g.correlation_id == 7),
        )
        .await
    else {
        unreachable!()
    };
    assert_eq!(granted.remaining, 1, "{granted:?}");
    assert!(
        granted
            .containers
            .iter()
            .all(|c| c.node_id.as_str() == "node-a"),
        "granted on a node whose loss is held: {granted:?}"
    );
    // Nor does the held node's own session get new work: its ask is refused, naming why.
    b.send(&allocate_guaranteed(8, "demo", 100, 100, 1)).await;
    let CoordinatorToWorker::RequestFailed(refused) = b
        .expect(
            "refusal",
            |m| matches!(m, CoordinatorToWorker::RequestFailed(f) if f.correlation_id == 8),
        )
        .await
    else {
        unreachable!()
    };
    assert_eq!(
        refused.code,
        scheduler_core::protocol::app::ErrorCode::CoordinatorUnavailable
    );
    assert!(
        refused
            .message
            .contains("node node-b is being declared lost"),
        "{refused:?}"
    );
    // Still refused at the next tick: still held.
    h.server.coordinator.send(Tick).await.unwrap();
    assert_eq!(h.server.metrics.nodes_lost.get(), 0);
    // Nor is a re-join of the lost node answered before its loss is stored.
    let mut early = h.connect().await;
    early
        .send(&rejoin_msg(
            &h,
            "node-b",
            vec![running(from_a, ContainerType::Queueable, 100, 100)],
        ))
        .await;
    let closed = loop {
        match early.next().await {
            // A `join_rejected` frame would end a restarted worker's start (its first join's
            // rejection is final); a bare close makes it join again after its backoff.
            Ok(CoordinatorToWorker::JoinRejected(r)) => {
                panic!("a held loss must refuse the re-join without a join_rejected frame: {r:?}")
            }
            Ok(CoordinatorToWorker::JoinAccepted(a)) => {
                panic!("a re-join was answered before the loss was stored: {a:?}")
            }
            Ok(_) => continue,
            Err(closed) => break closed,
        }
    };
    assert!(closed.contains("code 1"), "{closed}");

    h.server.store.refuse_writes(false);
    h.server.coordinator.send(Tick).await.unwrap();
    assert_eq!(
        h.server.metrics.nodes_lost.get(),
        1,
        "stored, then announced"
    );
    assert_eq!(h.server.metrics.losses_not_stored.get(), 0);
    let closed = b.expect_closed().await;
    assert!(closed.contains("code 4"), "{closed}");
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    assert!(
        ack.notices
            .iter()
            .any(|n| n.kind == NoticeKind::Lost && n.container_id == from_a),
        "the issuer is told once the loss is stored: {ack:?}"
    );
    let (_b, accepted) = rejoin(
        &h,
        "node-b",
        vec![running(from_a, ContainerType::Queueable, 100, 100)],
    )
    .await;
    assert_eq!(accepted.lost_containers, vec![from_a], "told to kill it");
    h.server.shutdown();
}

/// Three of four nodes fall silent past the node timeout at once (the coordinator cut off from
/// most of the cluster): presumed the coordinator's or the network's fault, they are held, not
/// declared lost (`scheduler_core::loss_guard`), and get no new GUARANTEED work while held; one
/// heard again is open to work at the next tick, and a waiting ask is placed there.
#[actix_rt::test]
async fn most_nodes_silent_at_once_are_held_not_lost_and_closed_to_new_work_until_heard_again() {
    let h = Harness::start().await;
    let mut workers = Vec::new();
    for name in ["node-a", "node-b", "node-c", "node-d"] {
        let (mut w, _) = h.join(name, 1000, 1024).await;
        w.send(&heartbeat(name, 0, 0.0, vec![], vec![], vec![]))
            .await;
        w.expect_ack().await;
        workers.push(w);
    }
    let mut b = workers.remove(1);
    let mut a = workers.remove(0);
    h.clock.advance(Duration::from_secs(11));
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    // The silent nodes are out of the top-k sent to schedulers: QUEUEABLE work is not sent
    // to nodes that stopped reporting.
    assert_eq!(ack.view.top_k_slots.len(), 1, "{:?}", ack.view.top_k_slots);
    h.server.coordinator.send(Tick).await.unwrap();
    assert_eq!(h.server.metrics.nodes_lost.get(), 0, "nobody declared lost");
    assert_eq!(h.server.metrics.losses_held_by_guard.get(), 3);

    // Two containers of a whole node each: one fits on node-a, the other must not go to a held
    // node, so it waits.
    a.send(&allocate_guaranteed(1, "demo", 1000, 1024, 2)).await;
    let first = a
        .expect(
            "a grant on node-a",
            |m| matches!(m, CoordinatorToWorker::GuaranteedAllocated(g) if g.correlation_id == 1),
        )
        .await;
    let CoordinatorToWorker::GuaranteedAllocated(first) = first else {
        unreachable!()
    };
    assert_eq!(first.containers.len(), 1);
    assert_eq!(first.containers[0].node_id.as_str(), "node-a");
    assert_eq!(first.remaining, 1);
    for held in ["node-b", "node-c", "node-d"] {
        assert_eq!(booked(&h, held).await, Resources::ZERO, "{held} got work");
    }

    // node-b is heard again: two of four silent is no mass silence, the episode ends (the two
    // still silent get a fresh node timeout), and the waiting container goes to node-b.
    b.send(&heartbeat("node-b", 0, 0.0, vec![], vec![], vec![]))
        .await;
    b.expect_ack().await;
    h.server.coordinator.send(Tick).await.unwrap();
    // Listed again from the next round.
    h.clock.advance(Duration::from_secs(2));
    b.send(&heartbeat("node-b", 0, 0.0, vec![], vec![], vec![]))
        .await;
    assert_eq!(b.expect_ack().await.view.top_k_slots.len(), 2);
    let second = a
        .expect(
            "the waiting container on node-b",
            |m| matches!(m, CoordinatorToWorker::GuaranteedAllocated(g) if g.correlation_id == 1),
        )
        .await;
    let CoordinatorToWorker::GuaranteedAllocated(second) = second else {
        unreachable!()
    };
    assert_eq!(second.containers[0].node_id.as_str(), "node-b");
    assert_eq!(second.remaining, 0);
    assert_eq!(h.server.metrics.nodes_lost.get(), 0);
    // node-c and node-d stay closed to new work until heard again or declared lost.
    assert_eq!(h.server.metrics.losses_held_by_guard.get(), 2);
    // Still silent a whole node timeout after that: node-c and node-d are lost then.
    h.clock.advance(Duration::from_secs(11));
    for (w, name) in [(&mut a, "node-a"), (&mut b, "node-b")] {
        w.send(&heartbeat(name, 0, 0.0, vec![], vec![], vec![]))
            .await;
        w.expect_ack().await;
    }
    h.server.coordinator.send(Tick).await.unwrap();
    assert_eq!(h.server.metrics.nodes_lost.get(), 2);
}

/// A re-join whose issuer id the store cannot reserve is refused before anything of it happens:
/// the node keeps its session, its containers and its GUARANTEED booking, and it is not lost.
/// Before, the node was removed after the fact: its old session was closed as replaced, its
/// containers were reported lost without the node being declared lost (so a later re-join
/// re-adopted them), and the guarantor went on booking it.
#[actix_rt::test]
async fn a_rejoin_the_store_cannot_record_leaves_the_node_as_it_was() {
    use coordinator::coordinator_actor::JoinOutcome;
    use scheduler_core::coordinator::NoticeKind;
    let h = Harness::start().await;
    let g = ContainerId::new(0, 77);
    let (mut a, _) = rejoin(
        &h,
        "node-a",
        vec![running(g, ContainerType::Guaranteed, 1000, 1024)],
    )
    .await;
    assert_eq!(booked(&h, "node-a").await, Resources::new(1000, 1024));
    // Use up the issuer ids reserved with node-a's join (a block of 1,024): the next join must
    // store a new reservation.
    let (_queues, _) =
        join_storm(&h, coordinator::coordinator_actor::ISSUER_RESERVATION_BLOCK).await;
    h.server.store.refuse_writes(true);
    let (outcome, _rx) = join_in_process(
        &h,
        9_999_999,
        "node-a",
        vec![running(g, ContainerType::Guaranteed, 1000, 1024)],
    )
    .await;
    assert!(
        matches!(&outcome, JoinOutcome::Rejected { reason } if reason.contains("store failure")),
        "{outcome:?}"
    );
    // The old session still works, the node is not lost, the booking stands.
    a.send(&heartbeat(
        "node-a",
        0,
        0.0,
        vec![running(g, ContainerType::Guaranteed, 1000, 1024)],
        vec![],
        vec![],
    ))
    .await;
    let ack = a.expect_ack().await;
    assert!(
        ack.notices.iter().all(|n| n.kind != NoticeKind::Lost),
        "{ack:?}"
    );
    assert_eq!(h.server.metrics.nodes_lost.get(), 0);
    assert_eq!(booked(&h, "node-a").await, Resources::new(1000, 1024));
}

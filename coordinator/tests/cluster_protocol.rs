//! The coordinator over real QUIC on loopback, driven by a hand-written worker client. Time is
//! a manual clock moved by the tests; periodic work runs when a test sends `Tick`.

mod common;

use common::*;
use coordinator::coordinator_actor::{Inspect, Tick};
use coordinator::guarantor_actor::InspectGuarantor;
use scheduler_core::coordinator::NoticeKind;
use scheduler_core::protocol::app::{ErrorCode, GrantedContainer};
use scheduler_core::protocol::cluster::{
    CLUSTER_PROTOCOL_VERSION, CoordinatorToWorker, PromoteContainer, PromotionApplied,
    ReleaseContainer, WorkerToCoordinator,
};
use scheduler_core::token::{IssuerNodeKey, QueueableSigner, TokenBody, TokenError, TokenVerifier};
use scheduler_core::{ContainerId, ContainerType, NodeId, Resources};
use std::time::Duration;

fn is_grant(corr: u64) -> impl Fn(&CoordinatorToWorker) -> bool {
    move |m| matches!(m, CoordinatorToWorker::GuaranteedAllocated(g) if g.correlation_id == corr)
}

fn is_failure(corr: u64) -> impl Fn(&CoordinatorToWorker) -> bool {
    move |m| matches!(m, CoordinatorToWorker::RequestFailed(f) if f.correlation_id == corr)
}

/// Collect grant frames for `corr` until `remaining == 0` or `want` containers arrived.
async fn grants(w: &mut TestWorker, corr: u64, want: usize) -> (Vec<GrantedContainer>, u32) {
    let mut got = Vec::new();
    let mut remaining = u32::MAX;
    while got.len() < want && remaining != 0 {
        match w.expect("guaranteed_allocated", is_grant(corr)).await {
            CoordinatorToWorker::GuaranteedAllocated(g) => {
                got.extend(g.containers);
                remaining = g.remaining;
            }
            _ => unreachable!(),
        }
    }
    (got, remaining)
}

#[actix_rt::test]
async fn join_is_accepted_or_rejected_with_a_reason() {
    let h = Harness::start().await;
    let (_a, accepted) = h.join("node-a", 4000, 8192).await;
    assert_eq!(accepted.protocol_version, CLUSTER_PROTOCOL_VERSION);
    assert_eq!(accepted.issuer, 1);
    assert_eq!(accepted.apps.len(), 1);
    assert_eq!(accepted.apps[0].app_id, "demo");
    assert_eq!(accepted.apps[0].secret_sha256.len(), 64);
    assert_eq!(accepted.settings.top_k, 50);
    assert_eq!(accepted.settings.heartbeat_interval_ms, 1000);
    assert_eq!(accepted.view.directory.len(), 1);

    let mut bad = h.connect().await;
    bad.send(&join_msg("not-the-token", "node-b", 4000, 8192))
        .await;
    match bad.next().await {
        Ok(CoordinatorToWorker::JoinRejected(r)) => {
            assert!(r.reason.contains("join token"), "{}", r.reason)
        }
        other => panic!("expected join_rejected, got {other:?}"),
    }
    let closed = bad.expect_closed().await;
    assert!(!closed.is_empty());

    // The store keeps the token's SHA-256: the hash itself is no credential.
    let mut hashed = h.connect().await;
    let hash = coordinator::store::join_token_hash(&h.join_token());
    hashed.send(&join_msg(&hash, "node-b", 4000, 8192)).await;
    match hashed.next().await {
        Ok(CoordinatorToWorker::JoinRejected(r)) => {
            assert!(r.reason.contains("join token"), "{}", r.reason)
        }
        other => panic!("expected join_rejected for the hash, got {other:?}"),
    }

    let mut old = h.connect().await;
    let mut join = join_msg(&h.join_token(), "node-c", 4000, 8192);
    if let WorkerToCoordinator::Join(j) = &mut join {
        j.protocol_version = 99;
    }
    old.send(&join).await;
    match old.next().await {
        Ok(CoordinatorToWorker::JoinRejected(r)) => {
            assert!(r.reason.contains("version 99"), "{}", r.reason)
        }
        other => panic!("expected join_rejected, got {other:?}"),
    }

    let mut rude = h.connect().await;
    rude.send(&heartbeat("node-d", 0, 0.0, vec![], vec![], vec![]))
        .await;
    match rude.next().await {
        Ok(CoordinatorToWorker::JoinRejected(r)) => {
            assert!(r.reason.contains("first frame"), "{}", r.reason)
        }
        other => panic!("expected join_rejected, got {other:?}"),
    }
    let stats = h.server.coordinator.send(Inspect).await.unwrap();
    assert_eq!(stats.nodes, vec![NodeId::from("node-a")]);
    // A second join of a node replaces its session and gets a fresh issuer.
    let (_a2, again) = h.join("node-a", 4000, 8192).await;
    assert_eq!(again.issuer, 2);
    assert_eq!(
        h.server
            .coordinator
            .send(Inspect)
            .await
            .unwrap()
            .next_issuer,
        3
    );
}

#[actix_rt::test]
async fn heartbeat_ack_has_top_k_threshold_limit_and_directory_only_when_stale() {
    let h = Harness::start().await;
    let (mut a, _) = h.join("node-a", 2000, 2048).await;
    let (mut b, _) = h.join("node-b", 4000, 4096).await;
    a.send(&heartbeat("node-a", 0, 1000.0, vec![], vec![], vec![]))
        .await;
    let first = a.expect_ack().await;
    // A worker reporting no version gets a whole directory: its own entry (cluster protocol 9:
    // partial directories), the cluster's sum, and the entries of its view's nodes with their
    // keys (node-b's among them, before its join is published with the next round).
    // The sum is the one built when this version's whole directory was first sent (node-a's
    // join), as any membership of a version (changes later in the round come with the next).
    let summary = first.view.cluster.as_ref().expect("the cluster's sum");
    assert_eq!(summary.nodes, 1);
    assert_eq!(summary.largest_capacities, vec![Resources::new(2000, 2048)]);
    let mut sent: Vec<&str> = first
        .view
        .entries
        .iter()
        .map(|e| e.node_id.as_str())
        .collect();
    sent.sort_unstable();
    assert_eq!(sent, vec!["node-a", "node-b"], "the view's nodes' entries");
    let names: Vec<&str> = first
        .view
        .directory
        .iter()
        .map(|d| d.node_id.as_str())
        .collect();
    assert_eq!(
        names,
        vec!["node-a"],
        "own entry: a stale directory is reset"
    );
    assert!(
        first.guaranteed_keys.is_none() && first.apps.is_none(),
        "known at join"
    );
    assert_eq!(
        first.issuer_keys.as_ref().map(Vec::len),
        Some(2),
        "keys go with the directory"
    );
    b.send(&heartbeat(
        "node-b",
        first.view.directory_version,
        3000.0,
        vec![],
        vec![],
        vec![],
    ))
    .await;
    let ack_b = b.expect_ack().await;
    assert!(
        ack_b.view.directory.is_empty(),
        "current directory is not resent"
    );
    assert_eq!(ack_b.queueable_limit, Resources::new(4000, 4096));
    // Top-k and the threshold are aggregated once per round (one heartbeat interval, 1 s here),
    // not per heartbeat: within the round of b's join the new estimates are not in yet.
    assert!(
        ack_b
            .view
            .top_k_slots
            .iter()
            .all(|l| l.queue_delay_ms == 0.0),
        "{:?}",
        ack_b.view.top_k_slots
    );
    h.clock.advance(Duration::from_secs(1));
    a.send(&heartbeat(
        "node-a",
        first.view.directory_version,
        1000.0,
        vec![],
        vec![],
        vec![],
    ))
    .await;
    let ack = a.expect_ack().await;
    let delta = ack.view.delta.as_ref().expect("the next round's delta");
    assert_eq!(delta.from_version, first.view.directory_version);
    // Departures only: node-b's entry came with its key already; the sum is current.
    assert!(
        delta.joined.is_empty() && delta.left.is_empty(),
        "{delta:?}"
    );
    let summary = ack
        .view
        .cluster
        .as_ref()
        .expect("the cluster's sum with the delta");
    assert_eq!(summary.nodes, 2);
    assert_eq!(summary.largest_capacities, vec![Resources::new(4000, 4096)]);
    assert!(ack.view.directory.is_empty() && ack.view.entries.is_empty());
    // The top-k names nodes by their slots in the directory (cluster protocol 8).
    let names_by_slot: std::collections::HashMap<u32, &str> = first
        .view
        .directory
        .iter()
        .chain(&first.view.entries)
        .map(|d| (d.slot, d.node_id.as_str()))
        .collect();
    assert_eq!(names_by_slot.len(), 2, "one slot per node");
    let top: Vec<(&str, f64)> = ack
        .view
        .top_k_slots
        .iter()
        .map(|l| (names_by_slot[&l.slot], l.queue_delay_ms))
        .collect();
    assert_eq!(top, vec![("node-a", 1000.0), ("node-b", 3000.0)]);
    // The threshold is mean 2000 + 1·σ (1000) = 3000 over the two nodes (Mercury §4.3), and it
    // goes only to the round's outliers (§6.3): node-a at 1000 is not one.
    assert_eq!(ack.shedding_threshold_ms, None);
    assert_eq!(ack.queueable_limit, Resources::new(2000, 2048));
    assert!(ack.notices.is_empty());
}

#[actix_rt::test]
async fn guaranteed_grants_never_overcommit_and_wait_for_finished_containers() {
    let h = Harness::start().await;
    let (mut a, accepted) = h.join("node-a", 2000, 2048).await;
    a.send(&allocate_guaranteed(7, "demo", 1000, 1024, 3)).await;
    let (first, remaining) = grants(&mut a, 7, 2).await;
    assert_eq!((first.len(), remaining), (2, 1), "two fit, the third waits");
    for g in &first {
        accepted
            .guaranteed_keys
            .verify_signature(&g.token)
            .expect("grant token verifies with the coordinator's public key");
        assert_eq!(g.container_id.issuer(), 0);
        assert_eq!(g.token.body.container_type, ContainerType::Guaranteed);
        assert_eq!(g.node_id.as_str(), "node-a");
        assert_eq!(g.node_endpoint, "node-a.example:7500");
        assert_eq!(g.token.body.job_id.as_str(), "job-1");
    }
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    stats.invariants.clone().unwrap();
    assert_eq!(
        stats.booked[&NodeId::from("node-a")],
        Resources::new(2000, 2048)
    );
    assert_eq!(stats.pending_containers, 1);

    // Policing: nothing is left for QUEUEABLE work on the node.
    let running: Vec<_> = first
        .iter()
        .map(|g| running(g.container_id, ContainerType::Guaranteed, 1000, 1024))
        .collect();
    let ids: Vec<ContainerId> = first.iter().map(|g| g.container_id).collect();
    a.send(&heartbeat(
        "node-a",
        1,
        0.0,
        running.clone(),
        ids.clone(),
        vec![],
    ))
    .await;
    assert_eq!(a.expect_ack().await.queueable_limit, Resources::ZERO);
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(stats.pending_containers, 1, "still no room");

    // Another worker cannot free node-a's bookings by reporting its containers finished.
    let (mut b, _) = h.join("node-b", 500, 512).await;
    b.send(&heartbeat("node-b", 0, 0.0, vec![], vec![], ids.clone()))
        .await;
    b.expect_ack().await;
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(
        stats.booked[&NodeId::from("node-a")],
        Resources::new(2000, 2048)
    );
    assert_eq!(stats.pending_containers, 1, "still no room on node-a");

    // One finishes: the third is granted, on the same node, with its own id.
    a.send(&heartbeat(
        "node-a",
        1,
        0.0,
        running[1..].to_vec(),
        vec![],
        vec![ids[0]],
    ))
    .await;
    let (third, remaining) = grants(&mut a, 7, 1).await;
    assert_eq!((third.len(), remaining), (1, 0));
    assert!(!ids.contains(&third[0].container_id));
    accepted
        .guaranteed_keys
        .verify_signature(&third[0].token)
        .unwrap();
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    stats.invariants.unwrap();
    assert_eq!(
        stats.booked[&NodeId::from("node-a")],
        Resources::new(2000, 2048)
    );
    assert_eq!(stats.pending_containers, 0);

    // Larger than any node, and unknown apps, are refused at once.
    a.send(&allocate_guaranteed(8, "demo", 4000, 1024, 1)).await;
    match a.expect("request_failed", is_failure(8)).await {
        CoordinatorToWorker::RequestFailed(f) => {
            assert_eq!(f.code, ErrorCode::AskTooLarge);
            assert!(
                f.message.contains("larger than every node"),
                "{}",
                f.message
            );
        }
        _ => unreachable!(),
    }
    a.send(&allocate_guaranteed(9, "mallory", 100, 100, 1))
        .await;
    match a.expect("request_failed", is_failure(9)).await {
        CoordinatorToWorker::RequestFailed(f) => assert_eq!(f.code, ErrorCode::BadCredentials),
        _ => unreachable!(),
    }
}

#[actix_rt::test]
async fn silent_node_is_lost_and_its_containers_reported_to_their_issuer() {
    let h = Harness::start().await;
    let (mut a, accepted_a) = h.join("node-a", 2000, 2048).await;
    let (mut b, _) = h.join("node-b", 2000, 2048).await;
    // b runs a QUEUEABLE container that a's distributed scheduler issued, and a GUARANTEED one.
    b.send(&allocate_guaranteed(1, "demo", 2000, 2048, 2)).await;
    let (gs, _) = grants(&mut b, 1, 2).await;
    let on_b = gs
        .iter()
        .find(|g| g.node_id.as_str() == "node-b")
        .unwrap()
        .container_id;
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
    // a is told its container started on b.
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    assert_eq!(ack.notices.len(), 1);
    assert_eq!(
        (ack.notices[0].container_id, &ack.notices[0].kind),
        (from_a, &NoticeKind::Started)
    );

    // 11 s later a has reported and b has not: b is lost at the next sweep.
    h.clock.advance(Duration::from_secs(11));
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    h.server.coordinator.send(Tick).await.unwrap();
    let closed = b.expect_closed().await;
    assert!(
        closed.contains("code 4: silent for more than 10000 ms"),
        "{closed}"
    );
    // The loss is published with the next round.
    h.clock.advance(Duration::from_secs(1));
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    assert_eq!(ack.notices.len(), 1, "{:?}", ack.notices);
    assert_eq!(ack.notices[0].container_id, from_a);
    assert_eq!(ack.notices[0].node_id.as_str(), "node-b");
    assert_eq!(ack.notices[0].kind, NoticeKind::Lost);
    assert_eq!(
        ack.view.directory.len(),
        1,
        "membership changed: directory resent"
    );
    assert_eq!(
        h.server.coordinator.send(Inspect).await.unwrap().nodes,
        vec![NodeId::from("node-a")]
    );
    // The guarantor dropped b's bookings.
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(stats.nodes, 1);
    assert!(!stats.booked.contains_key(&NodeId::from("node-b")));
    stats.invariants.unwrap();
}

#[actix_rt::test]
async fn malformed_oversized_and_unknown_frames_close_only_that_worker() {
    let h = Harness::start().await;
    let (mut a, accepted_a) = h.join("node-a", 2000, 2048).await;
    let slot_a = accepted_a
        .view
        .directory
        .iter()
        .find(|d| d.node_id.as_str() == "node-a")
        .expect("its own entry")
        .slot;

    let (mut b, _) = h.join("node-b", 2000, 2048).await;
    b.send_raw(&[0, 0, 0, 2, 0xc1, 0xc1]).await;
    let closed = b.expect_closed().await;
    assert!(closed.contains("code 2: malformed msgpack"), "{closed}");

    let (mut c, _) = h.join("node-c", 2000, 2048).await;
    c.send_raw(&(u32::MAX).to_be_bytes()).await;
    let closed = c.expect_closed().await;
    assert!(closed.contains("exceeds the limit"), "{closed}");

    let (mut d, _) = h.join("node-d", 2000, 2048).await;
    let unknown = scheduler_core::codec::encode_frame(
        &serde_json::json!({"type": "launch_missiles", "count": 1}),
        1024,
    )
    .unwrap();
    d.send_raw(&unknown).await;
    let closed = d.expect_closed().await;
    assert!(
        closed.contains("unknown message type \"launch_missiles\""),
        "{closed}"
    );

    // node-a is still served.
    a.send(&heartbeat("node-a", 0, 5.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    assert!(ack.view.top_k_slots.iter().any(|l| l.slot == slot_a));
}

/// A worker that keeps sending but stops reading must not grow the coordinator's queue of
/// frames to it without bound: once the stream's credit and the bounded queue are full, the
/// coordinator closes that connection and says why.
#[actix_rt::test]
async fn a_worker_that_stops_reading_its_answers_is_closed_not_buffered() {
    let h = Harness::start().await;
    let (mut a, _) = h.join("node-a", 2000, 2048).await;
    let mut w = h.connect_with_receive_window(4096).await;
    w.send(&join_msg(&h.join_token(), "node-b", 2000, 2048))
        .await;
    let frame = scheduler_core::codec::encode_frame(
        &heartbeat("node-b", 0, 5.0, vec![], vec![], vec![]),
        scheduler_core::codec::CLUSTER_MAX_FRAME,
    )
    .unwrap();
    let batch: Vec<u8> = frame.repeat(64);
    // The queue holds WORKER_QUEUE_FRAMES answers; the cap only guards against a coordinator
    // that never closes (a failure of this test, not a wait).
    let mut sent = 0usize;
    while w.connection.close_reason().is_none() {
        if w.send_raw_checked(&batch).await.is_err() {
            break;
        }
        sent += 64;
        assert!(
            sent < 50 * coordinator::session::WORKER_QUEUE_FRAMES,
            "still open after {sent} heartbeats that were never read"
        );
    }
    let closed = w.expect_closed().await;
    assert!(
        closed.contains("code 2: the worker does not read its answers"),
        "{closed}"
    );
    // node-a is still served.
    a.send(&heartbeat("node-a", 0, 5.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
}

#[actix_rt::test]
async fn promotion_is_booked_applied_by_the_host_and_answered_to_the_requester() {
    let h = Harness::start().await;
    let (mut host, accepted_host) = h.join("node-a", 2000, 2048).await;
    let (mut requester, accepted_req) = h.join("node-b", 2000, 2048).await;
    let q = ContainerId::new(accepted_req.issuer, 1);
    let big = ContainerId::new(accepted_req.issuer, 2);
    host.send(&heartbeat(
        "node-a",
        0,
        0.0,
        vec![
            running(q, ContainerType::Queueable, 500, 512),
            running(big, ContainerType::Queueable, 1600, 1600),
        ],
        vec![q, big],
        vec![],
    ))
    .await;
    host.expect_ack().await;

    requester
        .send(&WorkerToCoordinator::Promote(PromoteContainer {
            correlation_id: 31,
            app_id: "demo".into(),
            container_id: q,
            local_status: None,
        }))
        .await;
    let apply = match host
        .expect("apply_promotion", |m| {
            matches!(m, CoordinatorToWorker::ApplyPromotion(_))
        })
        .await
    {
        CoordinatorToWorker::ApplyPromotion(p) => p,
        _ => unreachable!(),
    };
    accepted_host
        .guaranteed_keys
        .verify_signature(&apply.token)
        .unwrap();
    assert_eq!(apply.token.body.version, 1);
    assert_eq!(apply.token.body.container_type, ContainerType::Guaranteed);
    assert_eq!(apply.token.body.node_id.as_str(), "node-a");
    host.send(&WorkerToCoordinator::PromotionApplied(PromotionApplied {
        correlation_id: apply.correlation_id,
        error: None,
    }))
    .await;
    match requester
        .expect("promote_result", |m| {
            matches!(m, CoordinatorToWorker::PromoteResult(_))
        })
        .await
    {
        CoordinatorToWorker::PromoteResult(r) => {
            assert_eq!(r.correlation_id, 31);
            assert_eq!(r.token, apply.token);
        }
        _ => unreachable!(),
    }
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(
        stats.booked[&NodeId::from("node-a")],
        Resources::new(500, 512)
    );

    // The second does not fit next to the first: refused, retryable, nothing booked.
    requester
        .send(&WorkerToCoordinator::Promote(PromoteContainer {
            correlation_id: 32,
            app_id: "demo".into(),
            container_id: big,
            local_status: None,
        }))
        .await;
    match requester.expect("request_failed", is_failure(32)).await {
        CoordinatorToWorker::RequestFailed(f) => {
            assert_eq!(f.code, ErrorCode::PromotionRefused);
            assert!(f.code.retryable());
        }
        _ => unreachable!(),
    }
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(
        stats.booked[&NodeId::from("node-a")],
        Resources::new(500, 512)
    );

    // Release of a container on another node: the host is told to stop it.
    requester
        .send(&WorkerToCoordinator::Release(ReleaseContainer {
            correlation_id: 33,
            app_id: "demo".into(),
            container_id: big,
        }))
        .await;
    requester
        .expect(
            "released",
            |m| matches!(m, CoordinatorToWorker::Released(r) if r.correlation_id == 33),
        )
        .await;
    match host
        .expect("stop_container", |m| {
            matches!(m, CoordinatorToWorker::StopContainer(_))
        })
        .await
    {
        CoordinatorToWorker::StopContainer(s) => assert_eq!(s.container_id, big),
        _ => unreachable!(),
    }
    // Finishing the promoted container frees its GUARANTEED booking.
    host.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![q, big]))
        .await;
    host.expect_ack().await;
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(stats.booked[&NodeId::from("node-a")], Resources::ZERO);
}

#[actix_rt::test]
async fn the_hosting_worker_can_promote_a_container_no_heartbeat_has_reported_yet() {
    let h = Harness::start().await;
    let (mut host, accepted) = h.join("node-a", 2000, 2048).await;
    let (mut other, _) = h.join("node-b", 2000, 2048).await;
    let fresh = ContainerId::new(accepted.issuer, 1);
    let status = running(fresh, ContainerType::Queueable, 500, 512);

    // Another worker's claim that it hosts the container does not count for node-a's container
    // (its report names a different id), and without a heartbeat nobody knows it yet.
    let mut elsewhere = status.clone();
    elsewhere.id = ContainerId::new(accepted.issuer, 2);
    other
        .send(&WorkerToCoordinator::Promote(PromoteContainer {
            correlation_id: 40,
            app_id: "demo".into(),
            container_id: fresh,
            local_status: Some(elsewhere),
        }))
        .await;
    match other.expect("request_failed", is_failure(40)).await {
        CoordinatorToWorker::RequestFailed(f) => {
            assert_eq!(f.code, ErrorCode::UnknownContainer, "{f:?}")
        }
        _ => unreachable!(),
    }

    // The hosting worker reports it with the request: booked and applied at once.
    host.send(&WorkerToCoordinator::Promote(PromoteContainer {
        correlation_id: 41,
        app_id: "demo".into(),
        container_id: fresh,
        local_status: Some(status),
    }))
    .await;
    let apply = match host
        .expect("apply_promotion", |m| {
            matches!(m, CoordinatorToWorker::ApplyPromotion(_))
        })
        .await
    {
        CoordinatorToWorker::ApplyPromotion(p) => p,
        _ => unreachable!(),
    };
    assert_eq!(apply.token.body.container_id, fresh);
    assert_eq!(apply.token.body.node_id.as_str(), "node-a");
    assert_eq!(apply.token.body.container_type, ContainerType::Guaranteed);
    host.send(&WorkerToCoordinator::PromotionApplied(PromotionApplied {
        correlation_id: apply.correlation_id,
        error: None,
    }))
    .await;
    match host
        .expect("promote_result", |m| {
            matches!(m, CoordinatorToWorker::PromoteResult(_))
        })
        .await
    {
        CoordinatorToWorker::PromoteResult(r) => assert_eq!(r.correlation_id, 41),
        _ => unreachable!(),
    }
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(
        stats.booked[&NodeId::from("node-a")],
        Resources::new(500, 512)
    );
}

#[actix_rt::test]
async fn keys_rotate_on_schedule_and_the_ring_keeps_the_previous_key() {
    let h = Harness::start().await;
    let (mut a, accepted) = h.join("node-a", 2000, 2048).await;
    a.send(&allocate_guaranteed(1, "demo", 100, 100, 1)).await;
    let (old_grant, _) = grants(&mut a, 1, 1).await;
    h.server.coordinator.send(Tick).await.unwrap();
    assert_eq!(
        h.server.coordinator.send(Inspect).await.unwrap().key_ids,
        (1, None)
    );
    h.clock.advance(Duration::from_secs(3600));
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    assert!(
        a.expect_ack().await.guaranteed_keys.is_none(),
        "not rotated yet"
    );
    h.server.coordinator.send(Tick).await.unwrap();
    assert_eq!(
        h.server.coordinator.send(Inspect).await.unwrap().key_ids,
        (2, Some(1))
    );
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    let ring = ack
        .guaranteed_keys
        .expect("new GUARANTEED public keys with it");
    assert_eq!(
        ring.previous.as_ref(),
        Some(&accepted.guaranteed_keys.current)
    );
    ring.verify_signature(&old_grant[0].token)
        .expect("old grants stay valid");
    a.send(&allocate_guaranteed(2, "demo", 100, 100, 1)).await;
    let (new_grant, _) = grants(&mut a, 2, 1).await;
    assert_eq!(new_grant[0].token.body.key_id, 2);
    ring.verify_signature(&new_grant[0].token).unwrap();
    assert!(
        accepted
            .guaranteed_keys
            .verify_signature(&new_grant[0].token)
            .is_err()
    );
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    assert!(a.expect_ack().await.guaranteed_keys.is_none(), "sent once");
    // A session joining after the rotation derives its QUEUEABLE secret from the new master.
    let (_b, b_accepted) = h.join("node-b", 2000, 2048).await;
    assert_eq!(b_accepted.guaranteed_keys, ring);
    assert_eq!(b_accepted.node_secret.node_epoch, b_accepted.issuer);
}

/// Issue 11: each scheduler holds its own QUEUEABLE key per directory node, the node checks them
/// with its session secret, and a node's re-join gives everyone new keys for it.
#[actix_rt::test]
async fn each_scheduler_gets_its_own_key_for_every_node_and_a_rejoin_renews_them() {
    let h = Harness::start().await;
    let (mut a, a_accepted) = h.join("node-a", 2000, 2048).await;
    let (b, b_accepted) = h.join("node-b", 2000, 2048).await;
    assert_ne!(a_accepted.node_secret, b_accepted.node_secret);
    let keys_of = |keys: &[IssuerNodeKey], node: &str| -> IssuerNodeKey {
        keys.iter()
            .find(|k| k.node_id.as_str() == node)
            .unwrap_or_else(|| panic!("a key for {node}"))
            .clone()
    };
    assert_eq!(
        b_accepted.issuer_keys.len(),
        2,
        "b's join sees both nodes: {:?}",
        b_accepted.issuer_keys
    );
    a.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let a_ack = a.expect_ack().await;
    let a_keys = a_ack.issuer_keys.expect("keys with the directory");
    let a_signer = QueueableSigner::new(a_accepted.issuer, &a_keys);
    let b_signer = QueueableSigner::new(b_accepted.issuer, &b_accepted.issuer_keys);
    assert_ne!(
        keys_of(&a_keys, "node-b").secret,
        keys_of(&b_accepted.issuer_keys, "node-b").secret,
        "keys differ per issuer"
    );
    let body = |issuer: u32, node: &str| TokenBody {
        container_id: ContainerId::new(issuer, 1),
        node_id: NodeId::from(node),
        app_id: "demo".into(),
        resources: Resources::new(100, 64),
        container_type: ContainerType::Queueable,
        version: 0,
        job_id: "job-1".into(),
        job_submit_time_ms: 1,
        priority: 0,
        runtime_estimate_ms: None,
        expires_at_ms: u64::MAX / 2,
        key_id: 0,
        node_epoch: 0,
        booking: None,
        times_returned: 0,
    };
    let mut node_b = TokenVerifier::new(NodeId::from("node-b"));
    node_b.set_node_session(&b_accepted.node_secret).unwrap();
    let from_a = a_signer.sign(body(a_accepted.issuer, "node-b")).unwrap();
    node_b
        .verify_signature(&from_a)
        .expect("a's grant for node-b");
    node_b
        .verify_signature(&b_signer.sign(body(b_accepted.issuer, "node-b")).unwrap())
        .expect("b's grant for its own node");
    // b cannot use its keys to grant in a's name on node-a.
    let mut node_a = TokenVerifier::new(NodeId::from("node-a"));
    node_a.set_node_session(&a_accepted.node_secret).unwrap();
    let posing = QueueableSigner::new(a_accepted.issuer, &b_accepted.issuer_keys);
    assert!(
        node_a
            .verify_signature(&posing.sign(body(a_accepted.issuer, "node-a")).unwrap())
            .is_err()
    );
    // Up to date: no keys resent.
    let known_directory = heartbeat(
        "node-a",
        a_ack.view.directory_version,
        0.0,
        vec![],
        vec![],
        vec![],
    );
    a.send(&known_directory).await;
    assert!(a.expect_ack().await.issuer_keys.is_none());
    // node-b re-joins: a new session, new secret; a's answer in the next round (membership
    // changes are published once per round) carries the change as a delta with a new key for
    // node-b only, and grants under the old key are stale at the new session.
    drop(b);
    let (_b2, b2_accepted) = h.join("node-b", 2000, 2048).await;
    let mut node_b2 = TokenVerifier::new(NodeId::from("node-b"));
    node_b2.set_node_session(&b2_accepted.node_secret).unwrap();
    assert!(matches!(
        node_b2.verify_signature(&from_a),
        Err(TokenError::StaleGrant { .. })
    ));
    h.clock.advance(Duration::from_secs(1));
    a.send(&known_directory).await;
    let ack = a.expect_ack().await;
    assert!(
        ack.view.directory.is_empty(),
        "a delta, not the whole directory"
    );
    let delta = ack.view.delta.expect("the re-join's version as a delta");
    assert_eq!(delta.from_version, a_ack.view.directory_version);
    // No departure; the re-joined node's new entry goes with its new key (protocol 9).
    assert!(
        delta.joined.is_empty() && delta.left.is_empty(),
        "{delta:?}"
    );
    assert_eq!(
        ack.view
            .entries
            .iter()
            .map(|n| n.node_id.as_str())
            .collect::<Vec<_>>(),
        vec!["node-b"]
    );
    let renewed = ack.issuer_keys.expect("new session, new key");
    assert_eq!(renewed.len(), 1, "only the re-joined node's key");
    assert_eq!(keys_of(&renewed, "node-b").node_epoch, b2_accepted.issuer);
    let a_signer = QueueableSigner::new(a_accepted.issuer, &renewed);
    node_b2
        .verify_signature(&a_signer.sign(body(a_accepted.issuer, "node-b")).unwrap())
        .expect("the renewed key works at the new session");
}

#[actix_rt::test]
async fn a_rejoining_node_gets_its_running_guaranteed_containers_rebooked() {
    let h = Harness::start().await;
    let mut w = h.connect().await;
    let mut join = join_msg(&h.join_token(), "node-a", 2000, 2048);
    let kept = ContainerId::new(0, 77);
    if let WorkerToCoordinator::Join(j) = &mut join {
        j.containers = vec![
            running(kept, ContainerType::Guaranteed, 1500, 1500),
            running(ContainerId::new(9, 1), ContainerType::Queueable, 300, 300),
        ];
    }
    w.send(&join).await;
    assert!(matches!(
        w.next().await,
        Ok(CoordinatorToWorker::JoinAccepted(_))
    ));
    // Only the GUARANTEED one is booked; an ask that no longer fits beside it waits.
    w.send(&allocate_guaranteed(1, "demo", 1000, 1000, 1)).await;
    // The ack proves the ask reached the guarantor's mailbox before the inspection does.
    w.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]))
        .await;
    w.expect_ack().await;
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(
        stats.booked[&NodeId::from("node-a")],
        Resources::new(1500, 1500)
    );
    assert_eq!(stats.pending_containers, 1);
    // When it finishes, the waiting ask is granted.
    w.send(&heartbeat("node-a", 0, 0.0, vec![], vec![], vec![kept]))
        .await;
    let (g, remaining) = grants(&mut w, 1, 1).await;
    assert_eq!((g.len(), remaining), (1, 0));
    h.server
        .guarantor
        .send(InspectGuarantor)
        .await
        .unwrap()
        .invariants
        .unwrap();
}

/// Quotas hold cluster-wide (Mercury §4.1): each worker reports what its scheduler has
/// outstanding per app, and each learns, once per round, what all the others hold.
#[actix_rt::test]
async fn each_worker_learns_what_the_others_hold_per_app() {
    let h = Harness::start().await;
    let (mut a, _) = h.join("node-a", 2000, 2048).await;
    let (mut b, _) = h.join("node-b", 2000, 2048).await;
    let mut hb = heartbeat("node-a", 0, 0.0, vec![], vec![], vec![]);
    if let WorkerToCoordinator::Heartbeat(x) = &mut hb {
        x.issued = vec![scheduler_core::quota::AppOutstanding {
            app_id: scheduler_core::AppId::from("demo"),
            queueable: 2,
            guaranteed: 1,
        }];
    }
    a.send(&hb).await;
    assert!(
        a.expect_ack().await.outstanding_elsewhere.is_empty(),
        "nothing elsewhere"
    );
    // The next round sums the reports.
    h.clock.advance(Duration::from_secs(1));
    b.send(&heartbeat("node-b", 0, 0.0, vec![], vec![], vec![]))
        .await;
    let ack = b.expect_ack().await;
    assert_eq!(
        ack.outstanding_elsewhere,
        vec![scheduler_core::quota::AppOutstanding {
            app_id: scheduler_core::AppId::from("demo"),
            queueable: 2,
            guaranteed: 1,
        }]
    );
    // A worker's own counts are not counted against it.
    a.send(&hb).await;
    assert!(a.expect_ack().await.outstanding_elsewhere.is_empty());
}

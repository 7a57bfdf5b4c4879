//! GUARANTEED capacity is never granted twice (issue 11), at a real worker joined to a real
//! coordinator over QUIC on loopback: the node refuses GUARANTEED work beyond its capacity
//! whatever a grant says, refuses grants of an earlier session of itself, and refuses a grant
//! its app released before starting it, even when released through another worker.

mod common;

use common::*;
use scheduler_core::protocol::app::{AppResponse, ErrorCode};
use scheduler_core::{ContainerId, ContainerType, Resources};

/// A container id no issuer of the cluster uses (for tokens the tests sign themselves).
fn test_issued(seq: u64) -> ContainerId {
    ContainerId::new(ContainerId::MAX_ISSUER, seq)
}

#[actix_rt::test]
async fn a_guaranteed_grant_beyond_the_nodes_guaranteed_capacity_is_refused() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let mut app = c.client("node-a").await;
    // A genuine GUARANTEED container takes 1,500 of the node's 2,000 millicores.
    let token = app
        .grant(ask_on(ContainerType::Guaranteed, 1500, 256, "node-a"))
        .await;
    app.start(&token, sh("exec sleep 30"))
        .await
        .expect("genuine grant starts");
    // A grant signed with the cluster key for the node's current session, as a coordinator with
    // a stale view (say, restarted and not yet told about that container) could make: it is
    // genuine in every respect, but the node has no GUARANTEED room for it.
    let epoch = c
        .inspect("node-a")
        .await
        .session_epoch
        .expect("joined: a session");
    let mut body = token_body(
        "node-a",
        "demo",
        test_issued(1),
        ContainerType::Guaranteed,
        Resources::new(1000, 256),
        wall_ms() + 600_000,
    );
    body.node_epoch = epoch;
    let stale_view = c.sign(body);
    let e = app.start(&stale_view, sh("exit 0")).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::GuaranteedCapacityExceeded, "{e:?}");
    assert!(e.retryable, "{e:?}");
    assert!(
        e.message
            .contains("GUARANTEED work on this node already holds"),
        "{e:?}"
    );
    let snap = c.inspect("node-a").await;
    assert_eq!(snap.guaranteed_committed, Resources::new(1500, 256));
    assert_eq!(snap.running, 1, "{snap:?}");
    snap.invariants.expect("node runtime invariants hold");
    c.stop().await;
}

#[actix_rt::test]
async fn a_guaranteed_grant_of_an_earlier_session_of_the_node_is_void() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let mut app = c.client("node-a").await;
    let epoch = c
        .inspect("node-a")
        .await
        .session_epoch
        .expect("joined: a session");
    // What a coordinator that has since restarted (or that saw this node re-join) granted: the
    // guarantor no longer books it, so the node must not start it.
    let mut body = token_body(
        "node-a",
        "demo",
        test_issued(2),
        ContainerType::Guaranteed,
        Resources::new(500, 256),
        wall_ms() + 600_000,
    );
    body.node_epoch = epoch - 1;
    let e = app
        .start(&c.sign(body.clone()), sh("exit 0"))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidToken, "{e:?}");
    assert!(
        e.message
            .contains("was made for another session of this node"),
        "{e:?}"
    );
    // The same grant for the current session starts: only the session was wrong.
    body.node_epoch = epoch;
    app.start(&c.sign(body), sh("exit 0"))
        .await
        .expect("current session's grant starts");
    c.stop().await;
}

/// Two nodes; an app on node-b obtains a GUARANTEED grant of 1,000 millicores on node-a.
async fn grant_on_a_through_b() -> (Cluster, AppClient, scheduler_core::token::ContainerToken) {
    let c = Cluster::start(
        &["demo"],
        &[node("node-a", 2000, 2048), node("node-b", 2000, 2048)],
    )
    .await;
    let mut via_b = c.client("node-b").await;
    let token = via_b
        .grant(ask_on(ContainerType::Guaranteed, 1000, 256, "node-a"))
        .await;
    (c, via_b, token)
}

/// The app releases an unstarted GUARANTEED grant through a worker that is not the grant's node
/// (the coordinator frees the booking); the token must not start the container afterwards.
#[actix_rt::test]
async fn a_released_guaranteed_grant_cannot_be_started_afterwards() {
    let (c, mut via_b, token) = grant_on_a_through_b().await;
    let id = token.body.container_id;
    assert!(
        matches!(via_b.release(id).await, AppResponse::Ack(_)),
        "release acknowledged"
    );
    // The revocation reaches node-a on the coordinator's stream (no heartbeat needed).
    c.wait_for_node("node-a", "the grant revoked", |s| s.revoked_grants == 1)
        .await;
    let mut on_a = c.client("node-a").await;
    let e = on_a.start(&token, sh("exec sleep 30")).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidToken, "{e:?}");
    assert!(e.message.contains("was revoked"), "{e:?}");
    let snap = c.inspect("node-a").await;
    assert_eq!(snap.running, 0, "{snap:?}");
    assert_eq!(snap.guaranteed_committed, Resources::ZERO);
    c.stop().await;
}

/// The app starts a GUARANTEED container on node-a and at once releases it through node-b,
/// whatever the coordinator has heard from node-a's heartbeats: it must stop running.
#[actix_rt::test]
async fn a_guaranteed_container_released_through_another_worker_right_after_it_starts_stops() {
    let (c, mut via_b, token) = grant_on_a_through_b().await;
    let id = token.body.container_id;
    let mut on_a = c.client("node-a").await;
    on_a.start(&token, sh("exec sleep 30"))
        .await
        .expect("grant starts");
    assert!(
        matches!(via_b.release(id).await, AppResponse::Ack(_)),
        "release acknowledged"
    );
    c.wait_for_node("node-a", "the released container stopped", |s| {
        s.running == 0 && s.processes == 0
    })
    .await
    .invariants
    .expect("node runtime invariants hold");
    c.stop().await;
}

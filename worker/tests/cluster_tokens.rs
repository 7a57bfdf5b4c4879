//! Container tokens at a real worker joined to a real coordinator over QUIC on loopback: forged,
//! expired, replayed, wrong-node, wrong-app and other-session tokens are refused with
//! `invalid_token` naming the problem; the connection stays usable, the genuine token still
//! works afterwards, and a running container is untouched.

mod common;

use common::*;
use scheduler_core::protocol::app::{
    AcceptedState, AppRequest, ContainerEventKind, ErrorCode, ErrorFrame, Release, StopContainer,
};
use scheduler_core::token::{ContainerToken, NodeSessionSecret, QueueableSigner};
use scheduler_core::{ContainerId, ContainerType, NodeId, Resources};

fn assert_invalid_token(e: &ErrorFrame, needle: &str) {
    assert_eq!(e.code, ErrorCode::InvalidToken, "{e:?}");
    assert!(!e.retryable, "{e:?}");
    assert!(e.request_id.is_some(), "{e:?}");
    assert!(
        e.message
            .starts_with("start_container refused: container token"),
        "{e:?}"
    );
    assert!(
        e.message.contains(needle),
        "error message {:?} should contain {needle:?}",
        e.message
    );
}

/// A container id no issuer of the cluster uses (for tokens the tests sign themselves).
fn test_issued(seq: u64) -> ContainerId {
    ContainerId::new(ContainerId::MAX_ISSUER, seq)
}

#[actix_rt::test]
async fn forged_tokens_are_refused_and_the_genuine_one_still_works() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let (mut good, running) = start_sleeper(&c, "node-a").await;
    let genuine = good.grant(ask(ContainerType::Queueable, 100, 64)).await;

    type Tamper = fn(&mut ContainerToken);
    let tampers: [(&str, Tamper); 8] = [
        ("more cpu", |t| t.body.resources.cpu_millis += 1000),
        ("more memory", |t| t.body.resources.memory_mib *= 4),
        (
            "QUEUEABLE made GUARANTEED (under the GUARANTEED key's id)",
            |t| {
                t.body.container_type = ContainerType::Guaranteed;
                t.body.key_id = 1;
            },
        ),
        ("later expiry", |t| t.body.expires_at_ms += 3_600_000),
        ("earlier job submit time", |t| t.body.job_submit_time_ms = 0),
        ("higher version", |t| t.body.version += 1),
        ("one signature digit changed", |t| {
            let flipped = if t.signature.starts_with('0') {
                "1"
            } else {
                "0"
            };
            t.signature.replace_range(0..1, flipped);
        }),
        ("signature not hex", |t| t.signature = "not-hex".into()),
    ];
    for (what, tamper) in tampers {
        let mut forged = genuine.clone();
        tamper(&mut forged);
        assert_ne!(forged, genuine, "{what}");
        let e = good
            .start(&forged, sh("exec sleep 30"))
            .await
            .expect_err(what);
        assert_invalid_token(&e, "signature does not verify (forged or corrupted)");
        assert_still_serving(&c, &mut good, "node-a", running, 1).await;
    }
    // Signed for the right session and issuer, with other material (not the coordinator's).
    let session = c.worker("node-a").shared.session.get();
    let impostor = NodeSessionSecret::from_bytes(session, [7; 32])
        .issuer_key(&NodeId::from("node-a"), genuine.body.container_id.issuer())
        .unwrap();
    let forged = QueueableSigner::new(genuine.body.container_id.issuer(), &[impostor])
        .sign(genuine.body.clone())
        .unwrap();
    let e = good.start(&forged, sh("exit 0")).await.unwrap_err();
    assert_invalid_token(&e, "signature does not verify");

    let accepted = good
        .start(&genuine, sh("exec sleep 30"))
        .await
        .expect("the genuine token is accepted after the forgeries");
    assert_eq!(accepted.container_id, genuine.body.container_id);
    assert_eq!(accepted.state, AcceptedState::Running);
    assert_still_serving(&c, &mut good, "node-a", running, 2).await;
    c.stop().await;
}

#[actix_rt::test]
async fn expired_and_other_session_tokens_are_refused() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let (mut good, running) = start_sleeper(&c, "node-a").await;
    let shape = Resources::new(100, 64);

    let expired_at = wall_ms() - 1_000;
    let expired = c.sign(token_body(
        "node-a",
        "demo",
        test_issued(1),
        ContainerType::Queueable,
        shape,
        expired_at,
    ));
    let e = good.start(&expired, sh("exit 0")).await.unwrap_err();
    assert_invalid_token(&e, &format!("expired at {expired_at} ms, now is "));
    assert_still_serving(&c, &mut good, "node-a", running, 1).await;

    // A grant made for another session of the node (as after a re-join), under that
    // session's genuine key: stale.
    let session = c.worker("node-a").shared.session.get();
    let node_a = NodeId::from("node-a");
    let old_session_key = NodeSessionSecret::derive(&c.keys.current, &node_a, session + 50)
        .unwrap()
        .issuer_key(&node_a, test_issued(2).issuer())
        .unwrap();
    let stale = QueueableSigner::new(test_issued(2).issuer(), &[old_session_key])
        .sign(token_body(
            "node-a",
            "demo",
            test_issued(2),
            ContainerType::Queueable,
            shape,
            wall_ms() + 600_000,
        ))
        .unwrap();
    let e = good.start(&stale, sh("exit 0")).await.unwrap_err();
    assert_invalid_token(
        &e,
        &format!(
            "was made for another session of this node (grant session {}, current session {session})",
            session + 50
        ),
    );
    assert_still_serving(&c, &mut good, "node-a", running, 1).await;

    // The same body with a future expiry, signed with the cluster key, is accepted: the
    // refusals above were about expiry and key alone.
    let mut body = expired.body.clone();
    body.expires_at_ms = wall_ms() + 600_000;
    let fresh = c.sign(body);
    let accepted = good.start(&fresh, sh("exit 0")).await.expect("fresh token");
    assert_eq!(accepted.container_id, test_issued(1));
    let done = good
        .event("completion of the fresh container", |e| {
            e.container_id == test_issued(1)
                && matches!(e.event, ContainerEventKind::Completed { .. })
        })
        .await;
    assert_eq!(done.event, ContainerEventKind::Completed { exit_code: 0 });
    assert_still_serving(&c, &mut good, "node-a", running, 1).await;
    c.stop().await;
}

#[actix_rt::test]
async fn a_token_is_used_once() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let (mut good, running) = start_sleeper(&c, "node-a").await;
    let token = good.grant(ask(ContainerType::Queueable, 100, 64)).await;
    let id = token.body.container_id;
    good.start(&token, sh("exec sleep 30"))
        .await
        .expect("first use");
    let e = good.start(&token, sh("exec sleep 30")).await.unwrap_err();
    assert_invalid_token(&e, &format!("for {id} version 0 was already used"));
    // From another connection, too.
    let mut other = c.client("node-a").await;
    let e = other.start(&token, sh("exec sleep 30")).await.unwrap_err();
    assert_invalid_token(&e, "was already used");
    assert_still_serving(&c, &mut good, "node-a", running, 2).await;

    // Still refused once the container has ended.
    good.send(&scheduler_core::protocol::app::AppRequest::StopContainer(
        scheduler_core::protocol::app::StopContainer {
            request_id: 900,
            container_id: id,
        },
    ))
    .await;
    assert!(matches!(
        good.answer(900).await,
        scheduler_core::protocol::app::AppResponse::Ack(_)
    ));
    let killed = good
        .event("the stopped container's event", |e| {
            e.container_id == id && matches!(e.event, ContainerEventKind::Killed { .. })
        })
        .await;
    assert!(
        matches!(
            killed.event,
            ContainerEventKind::Killed {
                reason: scheduler_core::KillReason::Released,
                ..
            }
        ),
        "{killed:?}"
    );
    c.wait_for_node("node-a", "the stopped container's process reaped", |s| {
        s.processes == 1
    })
    .await;
    let e = good.start(&token, sh("exec sleep 30")).await.unwrap_err();
    assert_invalid_token(&e, "was already used");
    assert_still_serving(&c, &mut good, "node-a", running, 1).await;
    c.stop().await;
}

#[actix_rt::test]
async fn a_token_for_another_node_is_refused() {
    let c = Cluster::start(
        &["demo"],
        &[node("node-a", 2000, 2048), node("node-b", 2000, 2048)],
    )
    .await;
    let (mut good_b, running_b) = start_sleeper(&c, "node-b").await;
    // node-b joined last, so its view already lists node-a.
    let for_a = good_b
        .grant(ask_on(ContainerType::Queueable, 100, 64, "node-a"))
        .await;
    assert_eq!(for_a.body.node_id.as_str(), "node-a");
    let e = good_b.start(&for_a, sh("exec sleep 30")).await.unwrap_err();
    assert_invalid_token(&e, "is for node node-a, this is node node-b");
    assert_still_serving(&c, &mut good_b, "node-b", running_b, 1).await;

    // A GUARANTEED grant on node-a, presented to node-b.
    let g_for_a = good_b
        .grant(ask_on(ContainerType::Guaranteed, 100, 64, "node-a"))
        .await;
    assert_eq!(g_for_a.body.node_id.as_str(), "node-a");
    let e = good_b.start(&g_for_a, sh("exit 0")).await.unwrap_err();
    assert_invalid_token(&e, "is for node node-a, this is node node-b");

    // At the right node both tokens work.
    let mut at_a = c.client("node-a").await;
    for token in [&for_a, &g_for_a] {
        let accepted = at_a
            .start(token, sh("exec sleep 30"))
            .await
            .expect("accepted at its own node");
        assert_eq!(accepted.state, AcceptedState::Running);
    }
    assert_eq!(c.inspect("node-a").await.running, 2);
    assert_still_serving(&c, &mut good_b, "node-b", running_b, 1).await;
    c.stop().await;
}

#[actix_rt::test]
async fn a_token_of_another_app_is_refused() {
    let c = Cluster::start(&["demo", "other"], &[node("node-a", 2000, 2048)]).await;
    let (mut good, running) = start_sleeper(&c, "node-a").await;
    let token = good.grant(ask(ContainerType::Queueable, 100, 64)).await;
    let mut other = c.client_as("node-a", "other").await;
    let e = other.start(&token, sh("exec sleep 30")).await.unwrap_err();
    assert_invalid_token(&e, "belongs to app demo, not to the requesting app other");
    // The other app's connection stays usable, but it cannot stop or release demo's container.
    other.subscribe().await;
    for (request_id, request) in [
        (
            801,
            AppRequest::StopContainer(StopContainer {
                request_id: 801,
                container_id: running,
            }),
        ),
        (
            802,
            AppRequest::Release(Release {
                request_id: 802,
                container_id: running,
            }),
        ),
    ] {
        other.send(&request).await;
        let e = other.error_for(request_id).await;
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
        assert!(e.message.contains("demo"), "{e:?}");
    }
    assert_still_serving(&c, &mut good, "node-a", running, 1).await;
    good.start(&token, sh("exec sleep 30"))
        .await
        .expect("the owner may use it");
    assert_still_serving(&c, &mut good, "node-a", running, 2).await;
    c.stop().await;
}

#[actix_rt::test]
async fn a_genuine_token_for_more_than_the_node_has_is_refused() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let (mut good, running) = start_sleeper(&c, "node-a").await;
    let mut body = token_body(
        "node-a",
        "demo",
        test_issued(1),
        ContainerType::Guaranteed,
        Resources::new(4000, 64),
        wall_ms() + 600_000,
    );
    body.node_epoch = c.inspect("node-a").await.session_epoch.expect("joined");
    let huge = c.sign(body);
    let e = good.start(&huge, sh("exit 0")).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::AskTooLarge, "{e:?}");
    assert!(e.message.starts_with("start_container refused:"), "{e:?}");
    assert!(
        e.message.contains("{cpu_millis: 4000, memory_mib: 64}"),
        "{e:?}"
    );
    assert_still_serving(&c, &mut good, "node-a", running, 1).await;
    c.stop().await;
}

/// The worker's clock is injected (as the coordinator's): a token is accepted until the worker's
/// own clock passes its expiry, tested by moving a manual clock rather than waiting ten minutes.
#[actix_rt::test]
async fn a_token_expires_on_the_workers_own_clock() {
    let clock = scheduler_core::time::Clock::manual(scheduler_core::Time::from_millis(wall_ms()));
    let c = Cluster::start_with_clock(
        &["demo"],
        &[node("node-a", 2000, 2048)],
        |_| {},
        Some(clock.clone()),
    )
    .await;
    let mut app = c.client("node-a").await;
    let early = app
        .grant(ask_on(ContainerType::Queueable, 100, 64, "node-a"))
        .await;
    let late = app
        .grant(ask_on(ContainerType::Queueable, 100, 64, "node-a"))
        .await;
    // Issued by the worker's scheduler on the same clock: ten minutes of validity.
    let ttl_ms = late.body.expires_at_ms - clock.now_ms();
    assert!((1..=600_000).contains(&ttl_ms), "{ttl_ms}");
    app.start(&early, sh("exit 0"))
        .await
        .expect("valid before its expiry");
    clock.advance(std::time::Duration::from_millis(ttl_ms));
    let e = app.start(&late, sh("exit 0")).await.unwrap_err();
    assert_invalid_token(&e, "expired at");
    c.stop().await;
}

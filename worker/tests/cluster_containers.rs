//! Real container processes through a real worker joined to a real coordinator over QUIC on
//! loopback: exit codes reach the application, GUARANTEED containers preempt running
//! QUEUEABLE ones (most recently started first, Mercury §3.4), and promotion re-issues the token
//! as GUARANTEED with a higher version, after which the container is no longer preemptible.

mod common;

use common::*;
use scheduler_core::protocol::app::{AcceptedState, ContainerEvent, ContainerEventKind, ErrorCode};
use scheduler_core::token::ContainerToken;
use scheduler_core::{ContainerId, ContainerType, KillReason, Resources};

fn is(id: ContainerId, kind: ContainerEventKind) -> impl Fn(&ContainerEvent) -> bool {
    move |e| e.container_id == id && e.event == kind
}

fn ended(id: ContainerId) -> impl Fn(&ContainerEvent) -> bool {
    move |e| {
        e.container_id == id
            && matches!(
                e.event,
                ContainerEventKind::Completed { .. } | ContainerEventKind::Killed { .. }
            )
    }
}

/// Start `token` with `launch` and wait for its `running` event.
async fn start_running(
    client: &mut AppClient,
    token: &ContainerToken,
    launch: scheduler_core::protocol::app::LaunchSpec,
) -> ContainerId {
    let id = token.body.container_id;
    let accepted = client.start(token, launch).await.expect("start accepted");
    assert_eq!(accepted.container_id, id);
    assert_eq!(accepted.state, AcceptedState::Running);
    client
        .event("running event", is(id, ContainerEventKind::Running))
        .await;
    id
}

#[actix_rt::test]
async fn exit_codes_and_launch_failures_reach_the_application() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;

    let q = app.grant(ask(ContainerType::Queueable, 200, 64)).await;
    let q = start_running(&mut app, &q, sh("exit 3")).await;
    let done = app.event("the QUEUEABLE container's end", ended(q)).await;
    assert_eq!(done.event, ContainerEventKind::Completed { exit_code: 3 });
    assert_eq!(done.node_id.as_str(), "node-a");

    let g = app.grant(ask(ContainerType::Guaranteed, 200, 64)).await;
    assert_eq!(g.body.container_type, ContainerType::Guaranteed);
    let g = start_running(&mut app, &g, sh("exit 7")).await;
    let done = app.event("the GUARANTEED container's end", ended(g)).await;
    assert_eq!(done.event, ContainerEventKind::Completed { exit_code: 7 });

    // A program that does not exist: the container fails, with the reason.
    let bad = app.grant(ask(ContainerType::Queueable, 200, 64)).await;
    let mut launch = sh("");
    launch.command = "/nonexistent/program".into();
    launch.args.clear();
    let bad = start_running(&mut app, &bad, launch).await;
    let done = app.event("the failed container's end", ended(bad)).await;
    match &done.event {
        ContainerEventKind::Killed { reason, message } => {
            assert_eq!(*reason, KillReason::Failed, "{done:?}");
            assert!(message.contains("launch failed"), "{done:?}");
        }
        other => panic!("expected killed/failed, got {other:?}"),
    }

    // Each end was observed after the worker forgot the process: nothing is left behind.
    let snap = c.inspect("node-a").await;
    assert_eq!((snap.running, snap.processes, snap.queued), (0, 0, 0));
    assert_eq!(snap.allocated, Resources::ZERO);
    snap.invariants.expect("node runtime invariants hold");
    c.stop().await;
}

#[actix_rt::test]
async fn guaranteed_preempts_the_most_recently_started_queueable_container() {
    let c = Cluster::start(&["demo"], &[node("node-a", 1000, 1024)]).await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;

    // Two QUEUEABLE sleepers fill the node.
    let older = app.grant(ask(ContainerType::Queueable, 500, 512)).await;
    let older = start_running(&mut app, &older, sh("exec sleep 30")).await;
    let newer = app.grant(ask(ContainerType::Queueable, 500, 512)).await;
    let newer = start_running(&mut app, &newer, sh("exec sleep 30")).await;
    assert_eq!(
        c.inspect("node-a").await.allocated,
        Resources::new(1000, 1024)
    );

    // The guarantor books only GUARANTEED work, so it grants on the full node.
    let g = app.grant(ask(ContainerType::Guaranteed, 400, 400)).await;
    assert_eq!(g.body.node_id.as_str(), "node-a");
    let g_id = g.body.container_id;
    let accepted = app.start(&g, sh("exec sleep 30")).await.expect("G start");
    assert_eq!(accepted.state, AcceptedState::Running, "G starts at once");
    let killed = app.event("the preempted container", ended(newer)).await;
    assert_eq!(
        killed.event,
        ContainerEventKind::Killed {
            reason: KillReason::PreemptedByGuaranteed,
            message: format!("killed to make room for GUARANTEED container {g_id}"),
        }
    );
    app.event("G running", is(g_id, ContainerEventKind::Running))
        .await;
    // Only one victim was needed: the older QUEUEABLE container keeps running.
    let snap = c
        .wait_for_node("node-a", "the preempted process tree reaped", |s| {
            s.processes == 2
        })
        .await;
    assert_eq!(snap.running, 2, "{snap:?}");
    assert_eq!(snap.allocated, Resources::new(900, 912));
    snap.invariants.expect("node runtime invariants hold");
    assert!(
        !app.unread().iter().any(
            |r| matches!(r, scheduler_core::protocol::app::AppResponse::Event(e) if ended(older)(e))
        ),
        "{:?}",
        app.unread()
    );

    // A second GUARANTEED container needs the older one's room too.
    let g2 = app.grant(ask(ContainerType::Guaranteed, 600, 600)).await;
    let g2_id = g2.body.container_id;
    let accepted = app.start(&g2, sh("exec sleep 30")).await.expect("G2 start");
    assert_eq!(accepted.state, AcceptedState::Running);
    let killed = app.event("the second victim", ended(older)).await;
    assert!(
        matches!(
            killed.event,
            ContainerEventKind::Killed {
                reason: KillReason::PreemptedByGuaranteed,
                ..
            }
        ),
        "{killed:?}"
    );
    app.event("G2 running", is(g2_id, ContainerEventKind::Running))
        .await;
    let snap = c
        .wait_for_node("node-a", "the second victim reaped", |s| s.processes == 2)
        .await;
    assert_eq!(snap.running, 2);
    assert_eq!(snap.allocated, Resources::new(1000, 1000));
    // Both preemptions are counted (docs/operations.md), and nothing was shed.
    let metrics = &c.worker("node-a").shared.metrics;
    assert_eq!(metrics.preemptions.get(), 2);
    assert_eq!(
        metrics
            .kills
            .get_or_create(&vec![("reason", "preempted_by_guaranteed")])
            .get(),
        2
    );
    assert_eq!(metrics.sheds.get(), 0);
    c.stop().await;
}

#[actix_rt::test]
async fn promoting_a_running_queueable_container_makes_it_guaranteed() {
    let c = Cluster::start(&["demo"], &[node("node-a", 1000, 1024)]).await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;

    let e = app
        .promote(ContainerId::new(ContainerId::MAX_ISSUER, 5))
        .await
        .expect_err("nothing to promote");
    assert_eq!(e.code, ErrorCode::UnknownContainer, "{e:?}");

    let first = app.grant(ask(ContainerType::Queueable, 400, 400)).await;
    let first = start_running(&mut app, &first, sh("exec sleep 30")).await;
    let token = app.grant(ask(ContainerType::Queueable, 600, 600)).await;
    let promoted_id = start_running(&mut app, &token, sh("exec sleep 30")).await;

    // At once, before any heartbeat could have reported the container to the coordinator: the
    // hosting worker tells it what it runs.
    let promoted = app
        .promote(promoted_id)
        .await
        .unwrap_or_else(|e| panic!("promotion right after start refused: {e:?}"));
    assert_eq!(promoted.container_id, promoted_id);
    let (old, new) = (&token.body, &promoted.token.body);
    assert_eq!(new.container_type, ContainerType::Guaranteed);
    assert!(new.version > old.version, "{new:?} vs {old:?}");
    assert_eq!(new.version, old.version + 1);
    assert_eq!(
        (
            new.container_id,
            &new.node_id,
            &new.app_id,
            new.resources,
            &new.job_id,
            new.job_submit_time_ms,
            new.priority
        ),
        (
            old.container_id,
            &old.node_id,
            &old.app_id,
            old.resources,
            &old.job_id,
            old.job_submit_time_ms,
            old.priority
        )
    );
    c.guaranteed_public_keys()
        .verify_signature(&promoted.token)
        .expect("signed with the coordinator's GUARANTEED key");
    app.event(
        "promoted event",
        is(
            promoted_id,
            ContainerEventKind::Promoted {
                version: new.version,
            },
        ),
    )
    .await;
    let snap = c.inspect("node-a").await;
    assert_eq!((snap.running, snap.processes), (2, 2));
    snap.invariants.expect("node runtime invariants hold");

    // Now GUARANTEED, the promoted container is no longer a preemption victim although it
    // started last: a GUARANTEED ask of the remaining room kills the other one instead.
    let g = app.grant(ask(ContainerType::Guaranteed, 400, 400)).await;
    let g_id = g.body.container_id;
    let accepted = app.start(&g, sh("exec sleep 30")).await.expect("G start");
    assert_eq!(accepted.state, AcceptedState::Running);
    let killed = app.event("the QUEUEABLE victim", ended(first)).await;
    assert_eq!(
        killed.event,
        ContainerEventKind::Killed {
            reason: KillReason::PreemptedByGuaranteed,
            message: format!("killed to make room for GUARANTEED container {g_id}"),
        }
    );
    app.event("G running", is(g_id, ContainerEventKind::Running))
        .await;
    let snap = c
        .wait_for_node("node-a", "the victim reaped", |s| s.processes == 2)
        .await;
    assert_eq!(snap.running, 2);
    assert!(
        !app.unread().iter().any(
            |r| matches!(r, scheduler_core::protocol::app::AppResponse::Event(e) if ended(promoted_id)(e))
        ),
        "{:?}",
        app.unread()
    );
    c.stop().await;
}

/// Poll the guarantor (once per heartbeat period) until `done` holds for its statistics.
async fn wait_for_guarantor(
    c: &Cluster,
    what: &str,
    done: impl Fn(&coordinator::guarantor_actor::GuarantorStats) -> bool,
) -> coordinator::guarantor_actor::GuarantorStats {
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    loop {
        let stats = c
            .server
            .guarantor
            .send(coordinator::guarantor_actor::InspectGuarantor)
            .await
            .expect("guarantor alive");
        stats.invariants.clone().expect("guarantor invariants hold");
        if done(&stats) {
            return stats;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {stats:?}"
        );
        tokio::time::sleep(HEARTBEAT).await;
    }
}

#[actix_rt::test]
async fn a_waiting_guaranteed_ask_is_cancelled_when_its_connection_closes() {
    let c = Cluster::start(&["demo"], &[node("node-a", 1000, 1024)]).await;
    let mut holder = c.client("node-a").await;
    // The guarantor's books are full with one unstarted grant.
    let full = holder
        .grant(ask(ContainerType::Guaranteed, 1000, 1024))
        .await;

    // Another connection asks for more GUARANTEED room: it must wait.
    let mut leaver = c.client("node-a").await;
    let request_id = leaver.new_request_id();
    let mut waiting = ask(ContainerType::Guaranteed, 600, 600);
    waiting.request_id = request_id;
    leaver
        .send(&scheduler_core::protocol::app::AppRequest::Allocate(
            waiting,
        ))
        .await;
    wait_for_guarantor(&c, "the second ask to wait", |s| s.pending_containers == 1).await;

    // The asking connection goes away: nobody could receive the grant, so the ask is dropped.
    drop(leaver);
    let stats =
        wait_for_guarantor(&c, "the ask to be cancelled", |s| s.pending_containers == 0).await;
    assert_eq!(
        stats.booked.values().copied().collect::<Vec<_>>(),
        vec![Resources::new(1000, 1024)],
        "only the holder's grant is booked"
    );

    // Once the holder gives its grant back, the whole node is free for a new ask: the
    // cancelled ask took nothing.
    let release_id = holder.new_request_id();
    holder
        .send(&scheduler_core::protocol::app::AppRequest::Release(
            scheduler_core::protocol::app::Release {
                request_id: release_id,
                container_id: full.body.container_id,
            },
        ))
        .await;
    assert!(
        matches!(
            holder.answer(release_id).await,
            scheduler_core::protocol::app::AppResponse::Ack(_)
        ),
        "release acknowledged"
    );
    let again = holder
        .grant(ask(ContainerType::Guaranteed, 1000, 1024))
        .await;
    assert_eq!(again.body.node_id.as_str(), "node-a");
    let stats = wait_for_guarantor(&c, "the books", |_| true).await;
    assert_eq!(stats.pending_containers, 0);
    assert_eq!(
        stats.booked.values().copied().collect::<Vec<_>>(),
        vec![Resources::new(1000, 1024)]
    );
    c.stop().await;
}

/// One node of 1,000 millicores and 1 GiB whose heartbeats are an hour apart: within a test,
/// only what the worker sends at once (not a periodic report) can move anything.
async fn one_node_with_hourly_heartbeats() -> Cluster {
    Cluster::start_with_heartbeat(
        &["demo"],
        &[node("node-a", 1000, 1024)],
        |_| {},
        None,
        std::time::Duration::from_secs(3600),
    )
    .await
}

/// A finished GUARANTEED container's capacity is granted again without waiting for a heartbeat
/// (issue 17): with heartbeats an hour apart, a second ask that needs the node's whole capacity
/// is granted as soon as the first container exits, because the worker tells the coordinator at
/// once.
#[actix_rt::test]
async fn a_finished_guaranteed_container_frees_its_capacity_before_the_next_heartbeat() {
    let c = one_node_with_hourly_heartbeats().await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    let first = app.grant(ask(ContainerType::Guaranteed, 1000, 1024)).await;
    let id = start_running(&mut app, &first, sh("exec sleep 0.2")).await;
    // The node is full: a second ask waits at the guarantor.
    let request_id = app.new_request_id();
    let mut second = ask(ContainerType::Guaranteed, 1000, 1024);
    second.request_id = request_id;
    app.send(&scheduler_core::protocol::app::AppRequest::Allocate(second))
        .await;
    wait_for_guarantor(&c, "the second ask to wait", |s| s.pending_containers == 1).await;
    app.event("the first container's end", ended(id)).await;
    // Granted long before any heartbeat could have reported the end.
    let answer = tokio::time::timeout(FAILURE_TIMEOUT, app.answer(request_id))
        .await
        .expect("granted without a heartbeat");
    match answer {
        scheduler_core::protocol::app::AppResponse::Allocated(a) => {
            assert_eq!(a.containers.len(), 1)
        }
        other => panic!("expected a grant, got {other:?}"),
    }
    c.stop().await;
}

/// A container's exit reaches its application, and the QUEUEABLE container queued behind it
/// starts, without waiting for any timer (issue 17: one no-op task's submit → complete): with
/// heartbeats an hour apart, only the event-driven path (pidfd readable → node runtime → app
/// connection) can deliver them within the test's patience.
#[actix_rt::test]
async fn an_exit_is_delivered_and_the_next_queued_container_starts_without_a_heartbeat() {
    let c = one_node_with_hourly_heartbeats().await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    // The first container holds the node until the test lets it end (a file appears), so the
    // second is queued behind it whatever the machine's speed.
    let gate = tempfile::tempdir().expect("tempdir");
    // Searchable by the container's (unprivileged) user.
    std::fs::set_permissions(
        gate.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let open = gate.path().join("open");
    let first = app.grant(ask(ContainerType::Queueable, 1000, 1024)).await;
    let wait_for_gate = format!("while [ ! -e {} ]; do sleep 0.01; done", open.display());
    let first = start_running(&mut app, &first, sh(&wait_for_gate)).await;
    let second = app.grant(ask(ContainerType::Queueable, 1000, 1024)).await;
    let accepted = app
        .start(&second, sh("exit 0"))
        .await
        .expect("start accepted");
    assert_eq!(accepted.state, AcceptedState::Queued);
    let second = second.body.container_id;
    std::fs::write(&open, b"").expect("open the gate");
    app.event(
        "the first container's exit",
        is(first, ContainerEventKind::Completed { exit_code: 0 }),
    )
    .await;
    app.event(
        "the second container's start",
        is(second, ContainerEventKind::Running),
    )
    .await;
    app.event(
        "the second container's exit",
        is(second, ContainerEventKind::Completed { exit_code: 0 }),
    )
    .await;
    c.stop().await;
}

/// On node-a of `c`: a 600-s GUARANTEED container fills the node, a 1-s QUEUEABLE container
/// queues behind it, and node-a returns it. The app (subscribed), the returned container and
/// the event that ended it.
async fn queued_behind_long_guaranteed_work_until_returned(
    c: &Cluster,
) -> (AppClient, ContainerId, ContainerEvent) {
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    let mut long = ask_on(ContainerType::Guaranteed, 1000, 1024, "node-a");
    long.runtime_estimate_ms = Some(600_000);
    let long = app.grant(long).await;
    start_running(&mut app, &long, sh("exec sleep 600")).await;

    let mut short = ask_on(ContainerType::Queueable, 500, 256, "node-a");
    short.runtime_estimate_ms = Some(1_000);
    let short = app.grant(short).await;
    let id = short.body.container_id;
    let accepted = app
        .start(&short, sh("exit 0"))
        .await
        .expect("start accepted");
    assert_eq!(accepted.state, AcceptedState::Queued);
    let returned = app
        .event("the held-back container's return", ended(id))
        .await;
    (app, id, returned)
}

/// A queued QUEUEABLE container that long GUARANTEED work holds back is returned to its
/// application (shed) at the next heartbeat answer when another node of the view would start it
/// sooner (`NodeRuntime::shed_held_by_guaranteed`, docs/experiments/mercury/diagnosis.md): the
/// application can ask again and run it there instead of waiting out the GUARANTEED work.
#[actix_rt::test]
async fn a_queueable_container_held_back_by_long_guaranteed_work_is_returned() {
    let c = Cluster::start_configured(
        &["demo"],
        &[node("node-a", 1000, 1024), node("node-b", 1000, 1024)],
        |_| {},
        None,
        // The schedulers place among the least-loaded node only: idle node-b, once node-a
        // reports its GUARANTEED work (before that, both report R = 0 and either may lead; the
        // bound is then one round, and the container is returned all the same).
        // §4.3's outlier shedding is off so that only the re-placement rule can act.
        |s| {
            s.top_k = 1;
            s.shedding = scheduler_core::coordinator::SheddingPolicy::Off;
        },
    )
    .await;
    let (_app, _, returned) = queued_behind_long_guaranteed_work_until_returned(&c).await;
    match &returned.event {
        ContainerEventKind::Killed { reason, message } => {
            assert_eq!(*reason, KillReason::Shed, "{returned:?}");
            assert!(message.contains("GUARANTEED work holds"), "{returned:?}");
        }
        other => panic!("expected the container shed, got {other:?}"),
    }
    let snap = c.inspect("node-a").await;
    assert_eq!((snap.running, snap.queued), (1, 0), "{snap:?}");
    snap.invariants.expect("node runtime invariants hold");
    c.stop().await;
}

/// The application's re-ask of a returned container names it (`allocate.replaces_shed`): the
/// local worker's scheduler, which granted it, avoids the node that returned it until its next
/// view, as the simulator's schedulers do (docs/experiments/mercury/diagnosis.md). Its view was
/// taken with the heartbeat whose answer returned the container, so without the hint the
/// scheduler would draw node-a again for about half of the re-asks (k = 2 of two nodes).
#[actix_rt::test]
async fn a_re_ask_naming_a_returned_container_avoids_the_returning_node_until_the_next_view() {
    let c = Cluster::start_configured(
        &["demo"],
        &[node("node-a", 1000, 1024), node("node-b", 1000, 1024)],
        |_| {},
        None,
        // Views every 3 s, so that the re-asks below all fall within one (they take
        // milliseconds); outlier shedding off so that only the re-placement rule returns work.
        |s| {
            s.heartbeat_interval = std::time::Duration::from_secs(3);
            s.top_k = 2;
            s.shedding = scheduler_core::coordinator::SheddingPolicy::Off;
        },
    )
    .await;
    let (mut app, id, returned) = queued_behind_long_guaranteed_work_until_returned(&c).await;
    assert!(
        matches!(
            returned.event,
            ContainerEventKind::Killed {
                reason: KillReason::Shed,
                ..
            }
        ),
        "{returned:?}"
    );

    // The re-ask names it: it, and the asks after it until the next view (the job manager's
    // other tasks), go elsewhere.
    let mut nodes = Vec::new();
    for i in 0..6 {
        let mut again = ask(ContainerType::Queueable, 500, 256);
        again.runtime_estimate_ms = Some(1_000);
        if i == 0 {
            again.replaces_shed = vec![scheduler_core::protocol::app::ShedContainer {
                container_id: id,
                node_id: returned.node_id.clone(),
            }];
        }
        let granted = app.grant(again).await.body;
        nodes.push(granted.node_id.to_string());
        // The re-placement's signed token counts the return (its node backs off from returning
        // it again); the other grants are first placements.
        assert_eq!(granted.times_returned, u8::from(i == 0), "grant {i}");
    }
    assert!(nodes.iter().all(|n| n == "node-b"), "{nodes:?}");
    c.stop().await;
}

/// An orderly stop returns only once every container it killed has ended, and no container
/// starts after the stop began: a start then is refused (it would outlive the worker).
#[actix_rt::test]
async fn a_stopping_worker_waits_for_its_containers_and_starts_no_more() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;

    let running = app.grant(ask(ContainerType::Queueable, 500, 64)).await;
    let running = start_running(&mut app, &running, sh("exec sleep 1000")).await;
    // Granted before the stop, started after it.
    let late = app.grant(ask(ContainerType::Queueable, 500, 64)).await;

    c.worker("node-a").shutdown().await;
    let snap = c.inspect("node-a").await;
    assert_eq!(
        (snap.running, snap.processes),
        (0, 0),
        "the stop returned before its killed container had ended"
    );
    let lost = app
        .event("the killed container's end", ended(running))
        .await;
    assert!(
        matches!(
            lost.event,
            ContainerEventKind::Killed {
                reason: KillReason::Lost,
                ..
            }
        ),
        "{lost:?}"
    );

    let refused = app
        .start(&late, sh("exec sleep 1000"))
        .await
        .expect_err("a start on a stopping worker is refused");
    assert_eq!(
        refused.code,
        ErrorCode::CoordinatorUnavailable,
        "{refused:?}"
    );
    assert!(refused.message.contains("stopping"), "{refused:?}");
    let snap = c.inspect("node-a").await;
    assert_eq!((snap.running, snap.processes), (0, 0));
    c.stop().await;
}

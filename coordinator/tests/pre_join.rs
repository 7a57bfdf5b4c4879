//! What a QUIC connection may cost the coordinator before its `join` is accepted (issue 11:
//! 24 outsider connections without the CA or the token took it from 7 to 295 MiB): a join
//! deadline, caps on not-yet-joined connections in all and per source address, and at most
//! 4 KiB of a first frame buffered until the join token in it has been checked. And the join
//! pacing: join answers in delivery at once, capped by their bytes.

mod common;

use common::*;
use scheduler_core::codec::{CLUSTER_MAX_FRAME, encode_frame};
use scheduler_core::join_pacing::MIN_JOINS_IN_PROGRESS;
use scheduler_core::protocol::cluster::{CoordinatorToWorker, WorkerToCoordinator};
use scheduler_core::protocol::limits::JOIN_PREFIX_BYTES;
use scheduler_core::{ContainerId, ContainerType};
use std::net::IpAddr;
use std::time::Duration;

/// Wait (paced; the timeout guards against a hang) until `read` gives `expected`; `what` names
/// the value in the failure.
async fn wait_until<T: PartialEq + std::fmt::Debug>(what: &str, read: impl Fn() -> T, expected: T) {
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    let mut pace = tokio::time::interval(Duration::from_millis(5));
    loop {
        let now = read();
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} = {now:?}, expected {expected:?}"
        );
        pace.tick().await;
    }
}

/// Wait until `n` connections are not joined.
async fn wait_for_unjoined(h: &Harness, n: usize) {
    wait_until(
        "connections not joined",
        || h.server.join_gate.unjoined(),
        n,
    )
    .await;
}

/// A join listing `n` containers (a re-joining worker), as frame bytes.
fn big_join(token: &str, node: &str, n: u64) -> Vec<u8> {
    let WorkerToCoordinator::Join(mut join) = join_msg(token, node, 2000, 2048) else {
        unreachable!()
    };
    join.containers = (1..=n)
        .map(|i| running(ContainerId::new(5, i), ContainerType::Queueable, 1, 1))
        .collect();
    encode_frame(&WorkerToCoordinator::Join(join), CLUSTER_MAX_FRAME).unwrap()
}

#[actix_rt::test]
async fn a_connection_that_does_not_join_is_closed_at_the_join_deadline() {
    let h = Harness::start_with(|s| s.join_timeout = Duration::from_millis(300)).await;

    // Handshake done, nothing sent.
    let mut silent = h.connect().await;
    let closed = silent.expect_closed().await;
    assert!(
        closed.contains("code 2: no join within 300ms of connecting"),
        "{closed}"
    );

    // Two bytes of a length prefix and nothing more: a join_rejected names it, then the close.
    let mut slow = h.connect().await;
    slow.send_raw(&[0, 0]).await;
    match slow.next().await {
        Ok(CoordinatorToWorker::JoinRejected(r)) => {
            assert!(r.reason.contains("no join within 300ms"), "{r:?}")
        }
        other => panic!("expected join_rejected, got {other:?}"),
    }
    let closed = slow.expect_closed().await;
    assert!(closed.contains("code 2"), "{closed}");
    wait_for_unjoined(&h, 0).await;

    // A prompt join is unaffected, and the deadline does not apply after it.
    let (mut w, _) = h.join("node-a", 2000, 2048).await;
    w.send(&heartbeat("node-a", 0, 5.0, vec![], vec![], vec![]))
        .await;
    w.expect_ack().await;
}

#[actix_rt::test]
async fn a_large_first_frame_is_read_only_after_its_join_token_checks() {
    let h = Harness::start().await;
    let token = h.join_token();

    // A re-joining worker's large join (≈ 100 kB) with the right token is accepted.
    let frame = big_join(&token, "node-a", 2000);
    assert!(frame.len() > 10 * JOIN_PREFIX_BYTES, "{}", frame.len());
    let mut good = h.connect().await;
    good.send_raw(&frame).await;
    match good.next().await {
        Ok(CoordinatorToWorker::JoinAccepted(_)) => {}
        other => panic!("large join with the right token: {other:?}"),
    }

    // The same with a wrong token: refused once its first 4 KiB are in, before the rest is
    // sent (it never is).
    let frame = big_join("not-the-token", "node-b", 2000);
    let mut bad = h.connect().await;
    bad.send_raw(&frame[..4 + JOIN_PREFIX_BYTES + 100]).await;
    match bad.next().await {
        Ok(CoordinatorToWorker::JoinRejected(r)) => {
            assert!(r.reason.contains("bad join token"), "{r:?}")
        }
        other => panic!("expected join_rejected, got {other:?}"),
    }
    assert!(bad.expect_closed().await.contains("code 2"));

    // 16 MiB announced, then junk: refused after 4 KiB.
    let mut junk = h.connect().await;
    junk.send_raw(&(CLUSTER_MAX_FRAME as u32).to_be_bytes())
        .await;
    junk.send_raw(&vec![0x90; JOIN_PREFIX_BYTES + 10]).await;
    match junk.next().await {
        Ok(CoordinatorToWorker::JoinRejected(r)) => assert!(
            r.reason
                .contains("must be a join carrying the join token within its first 4096 bytes"),
            "{r:?}"
        ),
        other => panic!("expected join_rejected, got {other:?}"),
    }
    wait_for_unjoined(&h, 0).await;
}

#[actix_rt::test]
async fn unjoined_connections_are_capped_per_source_and_in_all() {
    let h = Harness::start_with(|s| {
        s.max_unjoined_connections = 3;
        s.max_unjoined_per_source = 2;
    })
    .await;
    let one: IpAddr = "127.0.0.1".parse().unwrap();
    let two: IpAddr = "127.0.0.2".parse().unwrap();
    let ca = h.ca();
    let connect = |ip| TestWorker::try_connect_from(h.server.quic_addr, &ca, ip);

    let a1 = connect(one).await.expect("first from .1");
    let _a2 = connect(one).await.expect("second from .1");
    wait_for_unjoined(&h, 2).await;
    let refused = connect(one).await;
    assert!(
        matches!(refused, Err(quinn::ConnectionError::ConnectionClosed(_))),
        "a third connection from 127.0.0.1 is refused: {:?}",
        refused.as_ref().err()
    );
    let _b1 = connect(two).await.expect("first from .2");
    wait_for_unjoined(&h, 3).await;
    let refused = connect("127.0.0.3".parse().unwrap()).await;
    assert!(
        refused.is_err(),
        "the fourth unjoined connection is refused"
    );

    // Joining frees the place: a1 joins, a new connection from .1 is admitted and joins.
    let mut a1 = a1;
    a1.send(&join_msg(&h.join_token(), "node-a", 2000, 2048))
        .await;
    assert!(matches!(
        a1.next().await,
        Ok(CoordinatorToWorker::JoinAccepted(_))
    ));
    wait_for_unjoined(&h, 2).await;
    let mut a3 = connect(one).await.expect("admitted after a1 joined");
    a3.send(&join_msg(&h.join_token(), "node-c", 2000, 2048))
        .await;
    assert!(matches!(
        a3.next().await,
        Ok(CoordinatorToWorker::JoinAccepted(_))
    ));
    // Joined connections do not count.
    wait_for_unjoined(&h, 2).await;
}

/// Wait until the join answers in delivery and the joins waiting for their turn are
/// `(in_progress, waiting)`.
async fn wait_for_answers(h: &Harness, expected: (usize, usize)) {
    wait_until(
        "(answers in delivery, joins waiting)",
        || h.server.join_gate.answers(),
        expected,
    )
    .await;
}

#[actix_rt::test]
async fn join_answers_in_delivery_are_capped_by_their_bytes() {
    // A budget of one byte of join answers: the pacing's floor, this many answers in delivery
    // at once (the caps on connections not joined yet, 256 and 32 per source, are far off).
    let h = Harness::start_with(|s| s.join_answer_bytes_in_flight = 1).await;
    let mut joined = Vec::new();
    for n in 0..MIN_JOINS_IN_PROGRESS {
        let (w, accepted) = h.join(&format!("node-{n}"), 2000, 2048).await;
        assert!(!accepted.view.directory.is_empty());
        joined.push(w);
    }
    // All answered, none has sent a frame since: their answers count as in delivery.
    wait_for_answers(&h, (MIN_JOINS_IN_PROGRESS, 0)).await;
    assert_eq!(h.server.metrics.joins_paced.get(), 0);

    // A fifth join is connected and read, but waits for its turn.
    let mut fifth = h.connect().await;
    fifth
        .send(&join_msg(&h.join_token(), "node-late", 2000, 2048))
        .await;
    wait_for_answers(&h, (MIN_JOINS_IN_PROGRESS, 1)).await;
    assert_eq!(h.server.metrics.joins_paced.get(), 1);
    assert_eq!(h.server.metrics.joins_waiting.get(), 1);
    assert_eq!(h.server.join_gate.unjoined(), 1, "waiting, not joined yet");

    // node-0 has read its answer (it heartbeats): its turn ends and the fifth is answered.
    joined[0]
        .send(&heartbeat("node-0", 0, 5.0, vec![], vec![], vec![]))
        .await;
    joined[0].expect_ack().await;
    match fifth.next().await {
        Ok(CoordinatorToWorker::JoinAccepted(a)) => {
            assert!(
                a.view
                    .directory
                    .iter()
                    .any(|d| d.node_id.as_str() == "node-late")
            )
        }
        other => panic!("the waiting join is answered once a turn is free: {other:?}"),
    }
    wait_for_answers(&h, (MIN_JOINS_IN_PROGRESS, 0)).await;
    assert_eq!(h.server.metrics.joins_waiting.get(), 0);

    // A joined worker that goes away before reading its answer frees its turn as well, and a
    // waiting join that goes away stops waiting.
    let mut sixth = h.connect().await;
    sixth
        .send(&join_msg(&h.join_token(), "node-sixth", 2000, 2048))
        .await;
    wait_for_answers(&h, (MIN_JOINS_IN_PROGRESS, 1)).await;
    drop(sixth);
    wait_for_answers(&h, (MIN_JOINS_IN_PROGRESS, 0)).await;
    drop(joined.pop());
    wait_for_answers(&h, (MIN_JOINS_IN_PROGRESS - 1, 0)).await;
    assert_eq!(h.server.join_gate.unjoined(), 0);
}

/// Measurement, not a check (`cargo test -p coordinator --test pre_join -- --ignored
/// --nocapture`): 24 connections that never join each announce a 16 MiB first frame and send
/// junk; prints the coordinator binary's peak RSS. `MEASURE_COORDINATOR_BIN` picks another
/// build (e.g. one from before the pre-join limits).
#[actix_rt::test]
#[ignore]
async fn measure_outsider_connections_memory() {
    let bin = std::env::var("MEASURE_COORDINATOR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_coordinator").to_string());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_string();
    let mut child = std::process::Command::new(&bin)
        .args(["run", "--data-dir", &data, "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr: std::net::SocketAddr = v["quic_addr"].as_str().unwrap().parse().unwrap();
    let ca = coordinator::datadir::DataDir::new(dir.path()).ca_cert();
    let rss = |key: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .unwrap()
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    let before = rss("VmRSS:");
    let mut tasks = Vec::new();
    for _ in 0..24 {
        let ca = ca.clone();
        tasks.push(actix_rt::spawn(async move {
            let Ok(mut w) =
                TestWorker::try_connect_from(addr, &ca, "127.0.0.1".parse().unwrap()).await
            else {
                return 0usize;
            };
            let mut sent = 0;
            let chunk = vec![0x90u8; 1 << 20];
            if tokio::time::timeout(Duration::from_secs(10), async {
                let _ = w
                    .send_raw_checked(&(CLUSTER_MAX_FRAME as u32).to_be_bytes())
                    .await;
                for _ in 0..16 {
                    if w.send_raw_checked(&chunk).await.is_err() {
                        break;
                    }
                    sent += chunk.len();
                }
            })
            .await
            .is_err()
            {
                // Flow control held the rest back.
            }
            sent
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let peak = rss("VmHWM:");
    println!(
        "{bin}: 24 unjoined connections sent {} MiB in all; coordinator RSS {} MiB before, peak {} MiB",
        total >> 20,
        before / 1024,
        peak / 1024
    );
    let _ = child.kill();
    let _ = child.wait();
}

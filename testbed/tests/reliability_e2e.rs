//! Fault tests on loopback with the real `coordinator` and `worker` binaries as separate
//! processes (built by `cargo test --workspace`). docs/reliability.md lists the promises checked
//! here. Timeouts only guard against hangs; every wait is for an event.

use scheduler_core::protocol::app::{Allocate, ErrorCode};
use scheduler_core::{ContainerType, Resources};
use std::path::PathBuf;
use std::time::Duration;
use testbed::client::ClientPool;
use testbed::local::{LocalArgs, LocalCluster};

const GUARD: Duration = Duration::from_secs(60);

fn guaranteed_ask() -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(200, 32),
        count: 1,
        priority: 0,
        container_type: ContainerType::Guaranteed,
        locality: None,
        runtime_estimate_ms: Some(60_000),
        job_id: "reliability".into(),
        job_submit_time_ms: 1,
    }
}

/// A worker notices a paused coordinator within a few heartbeats (its link's silence limit:
/// three 100 ms heartbeats, floored at 1 s), answers GUARANTEED asks with the retryable
/// `coordinator_unavailable` instead of leaving them hanging until the QUIC idle timeout, and
/// re-joins once the coordinator resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_coordinator_is_noticed_within_a_few_heartbeats_and_rejoined_after() {
    let mut c = LocalCluster::start(&LocalArgs {
        workers: 1,
        cpu_millis: 2000,
        memory_mib: 2048,
        heartbeat_interval_ms: 100,
        node_timeout_ms: 1500,
        data_dir: std::env::var_os("E2E_DATA_DIR").map(|d| PathBuf::from(d).join("pause")),
        ..LocalArgs::default()
    })
    .expect("local cluster starts (are the coordinator and worker binaries built? cargo test --workspace builds them)");
    let (pool, _events) = ClientPool::new(&c.app_id, &c.app_secret);
    let client = pool.get(&c.workers[0].app_endpoint).await.unwrap();

    let granted = tokio::time::timeout(GUARD, client.allocate(guaranteed_ask()))
        .await
        .expect("answered")
        .expect("a healthy cluster grants a GUARANTEED ask");
    assert_eq!(granted.containers.len(), 1);
    client
        .release(granted.containers[0].container_id)
        .await
        .unwrap();

    c.signal("coordinator", libc::SIGSTOP).unwrap();
    // Before the link's liveness rule this ask hung until the QUIC idle timeout (30 s).
    let refused = match tokio::time::timeout(
        Duration::from_secs(10),
        client.allocate(guaranteed_ask()),
    )
    .await
    {
        Ok(answer) => answer.expect_err("no coordinator, no GUARANTEED grant"),
        Err(_) => panic!(
            "a GUARANTEED ask is answered within a few heartbeats of the coordinator's pause; the worker's log:\n{}",
            c.log_tail("worker-1")
        ),
    };
    assert_eq!(
        refused.code(),
        Some(ErrorCode::CoordinatorUnavailable),
        "{refused:?}"
    );
    assert!(refused.is_retryable(), "{refused:?}");

    c.signal("coordinator", libc::SIGCONT).unwrap();
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        match client.allocate(guaranteed_ask()).await {
            Ok(a) if a.containers.len() == 1 => break,
            Ok(a) => panic!("unexpected answer after resume: {a:?}"),
            Err(e) if e.code() == Some(ErrorCode::CoordinatorUnavailable) => {}
            Err(e) => panic!("unexpected error after resume: {e:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never re-joined; its log:\n{}",
            c.log_tail("worker-1")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = c.log_tail("worker-1");
    assert!(
        log.contains("nothing heard from the coordinator")
            || log.contains("did not complete within"),
        "the worker names why it dropped the link:\n{log}"
    );
    c.stop();
}

//! Fault tests on loopback with the real `coordinator` and `worker` binaries as separate
//! processes (built by `cargo test --workspace`). docs/reliability.md lists the promises checked
//! here. Timeouts only guard against hangs; every wait is for an event.

use scheduler_core::protocol::app::{
    Allocate, ContainerEventKind, ErrorCode, LaunchSpec, Locality,
};
use scheduler_core::{ContainerType, KillReason, Resources};
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
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    }
}

/// A worker notices a paused coordinator within a few heartbeats (its link's unresponsive
/// limit: three 100 ms heartbeats, floored at 1 s), answers GUARANTEED asks with the retryable
/// `coordinator_unavailable` instead of leaving them hanging until the QUIC idle timeout, and
/// forwards them again once the coordinator resumes (on the same session: a pause shorter than
/// the give-up limit ends none, `scheduler_core::liveness`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_coordinator_is_noticed_within_a_few_heartbeats_and_served_again_after() {
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
    let (pool, _events) =
        ClientPool::with_options(&c.app_id, &c.app_secret, c.client_options().unwrap());
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
            "the worker never forwarded asks again; its log:\n{}",
            c.log_tail("worker-1")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = c.log_tail("worker-1");
    assert!(
        log.contains("nothing heard from the coordinator"),
        "the worker names why it refuses asks:\n{log}"
    );
    assert!(
        log.contains("the coordinator answers again"),
        "the worker says when it forwards asks again:\n{log}"
    );
    c.stop();
}

fn guaranteed_ask_of(cpu_millis: u64, node: Option<&str>) -> Allocate {
    let mut ask = guaranteed_ask();
    ask.resources = Resources::new(cpu_millis, 32);
    ask.locality = node.map(|n| Locality {
        nodes: vec![n.to_string()],
        racks: vec![],
        relax: false,
    });
    ask
}

/// A container that sleeps, with a marker in its shell's command line to find it by (the shell
/// stays: no `exec`).
fn marked_sleeper(marker: &str) -> LaunchSpec {
    LaunchSpec {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), format!("sleep 300; echo {marker}")],
        env: Default::default(),
        working_dir: None,
    }
}

/// Live processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            out.push(pid);
        }
    }
    out
}

/// Wait (paced, bounded) until `count` processes carry `marker`.
async fn wait_for_processes(marker: &str, count: usize, c: &LocalCluster, log: &str) {
    let deadline = tokio::time::Instant::now() + GUARD;
    while processes_with(marker).len() != count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {count} processes marked {marker}, found {}; {log}'s log:\n{}",
            processes_with(marker).len(),
            c.log_tail(log)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Retry a GUARANTEED ask while the worker has no coordinator (paced, bounded by GUARD).
async fn allocate_when_joined(
    client: &testbed::client::AppClient,
    ask: Allocate,
    c: &LocalCluster,
) -> scheduler_core::protocol::app::Allocated {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        match client.allocate(ask.clone()).await {
            Ok(a) if !a.containers.is_empty() => return a,
            Ok(a) => panic!("unexpected answer: {a:?}"),
            Err(e) if e.code() == Some(ErrorCode::CoordinatorUnavailable) => {}
            Err(e) => panic!("unexpected error: {e:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never (re-)joined; its log:\n{}",
            c.log_tail("worker-1")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two workers (100 ms heartbeats, node timeout 1 s) and a GUARANTEED container running on
/// worker-2, granted through worker-1: a long sleeper whose command line carries a marker.
struct SleeperOnWorker2 {
    c: LocalCluster,
    pool: ClientPool,
    events: tokio::sync::mpsc::UnboundedReceiver<scheduler_core::protocol::app::ContainerEvent>,
    home: std::sync::Arc<testbed::client::AppClient>,
    target: String,
    grant: scheduler_core::protocol::app::GrantedContainer,
    marker: String,
}

async fn sleeper_on_worker_2(data_dir_name: &str, marker_prefix: &str) -> SleeperOnWorker2 {
    let c = LocalCluster::start(&LocalArgs {
        workers: 2,
        cpu_millis: 2000,
        memory_mib: 2048,
        heartbeat_interval_ms: 100,
        node_timeout_ms: 1000,
        data_dir: std::env::var_os("E2E_DATA_DIR").map(|d| PathBuf::from(d).join(data_dir_name)),
        ..LocalArgs::default()
    })
    .expect("local cluster starts");
    let (pool, events) =
        ClientPool::with_options(&c.app_id, &c.app_secret, c.client_options().unwrap());
    let home = pool.get(&c.workers[0].app_endpoint).await.unwrap();
    let target = c.workers[1].node_id.clone();
    let granted = tokio::time::timeout(GUARD, home.allocate(guaranteed_ask_of(500, Some(&target))))
        .await
        .expect("answered")
        .expect("granted");
    let grant = granted.containers[0].clone();
    let marker = format!("{marker_prefix}-{}", grant.container_id);
    pool.start(&grant, marked_sleeper(&marker))
        .await
        .expect("started");
    wait_for_processes(&marker, 1, &c, "worker-2").await;
    SleeperOnWorker2 {
        c,
        pool,
        events,
        home,
        target,
        grant,
        marker,
    }
}

/// A coordinator paused past the node timeout (SIGSTOP for three node timeouts) blames no node
/// when it resumes: the time it was not listening is not counted against the nodes' silence
/// (`scheduler_core::loss_guard`). Before, its first tick after the pause declared every node
/// lost, every app was told its containers were lost, and every worker killed them on
/// re-joining: a pause of the coordinator cost the whole cluster's work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_paused_past_the_node_timeout_declares_no_node_lost() {
    let SleeperOnWorker2 {
        mut c,
        pool: _pool,
        mut events,
        home,
        target,
        grant: _,
        marker,
    } = sleeper_on_worker_2("deaf", "deaf-coordinator").await;
    let metrics_addr = c.coordinator_http.clone().expect("coordinator metrics");

    c.signal("coordinator", libc::SIGSTOP).unwrap();
    // The fault: three node timeouts without the coordinator (a duration, not a wait for an
    // event).
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    c.signal("coordinator", libc::SIGCONT).unwrap();
    // Its first tick after the pause sees that it was not listening.
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let text = testbed::fleet::scrape(&metrics_addr).expect("metrics");
        if testbed::fleet::metric(&text, "coordinator_own_stalls_total").unwrap_or(0) >= 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the coordinator never counted its pause; its log:\n{}",
            c.log_tail("coordinator")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The worker is served again and whole: the rest of its capacity is granted beside the
    // running container, which it still holds.
    let again = allocate_when_joined(&home, guaranteed_ask_of(1500, Some(&target)), &c).await;
    assert_eq!(again.containers[0].node_id.as_str(), target);
    assert_eq!(
        processes_with(&marker).len(),
        1,
        "the container must run on; worker-2's log:\n{}",
        c.log_tail("worker-2")
    );
    let text = testbed::fleet::scrape(&metrics_addr).expect("metrics");
    assert_eq!(
        testbed::fleet::metric(&text, "coordinator_nodes_lost_total"),
        Some(0),
        "no node may be declared lost; the coordinator's log:\n{}",
        c.log_tail("coordinator")
    );
    while let Ok(e) = events.try_recv() {
        assert!(
            !matches!(
                e.event,
                ContainerEventKind::Killed {
                    reason: KillReason::Lost,
                    ..
                }
            ),
            "an app was told a container is lost: {e:?}"
        );
    }
    c.stop();
}

/// Lost means gone: a worker paused (SIGSTOP) past the node timeout is declared lost and its
/// containers are reported `lost` to their app; when it resumes and re-joins, it must kill them
/// instead of running on (and reporting them running) as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_the_node_timeout_kills_its_containers_when_it_resumes() {
    let SleeperOnWorker2 {
        mut c,
        pool: _pool,
        mut events,
        home,
        target,
        grant,
        marker,
    } = sleeper_on_worker_2("lost", "lost-means-gone").await;

    c.signal("worker-2", libc::SIGSTOP).unwrap();
    // The app is told its container is lost (through the worker that obtained the grant).
    let lost = tokio::time::timeout(GUARD, async {
        while let Some(e) = events.recv().await {
            if e.container_id == grant.container_id
                && matches!(
                    e.event,
                    ContainerEventKind::Killed {
                        reason: KillReason::Lost,
                        ..
                    }
                )
            {
                return e;
            }
        }
        panic!("event channel closed");
    })
    .await
    .expect("the app hears that its container is lost");
    assert_eq!(lost.node_id.as_str(), target);
    // Paused, the process still exists; once the worker resumes and re-joins it must go.
    assert_eq!(processes_with(&marker).len(), 1);
    c.signal("worker-2", libc::SIGCONT).unwrap();
    // A container reported lost must not run on after its worker re-joined.
    wait_for_processes(&marker, 0, &c, "worker-2").await;
    assert!(
        c.log_tail("worker-2")
            .contains("killed a container the coordinator reported lost"),
        "{}",
        c.log_tail("worker-2")
    );
    // The node is whole again: its full GUARANTEED capacity can be granted.
    let again = allocate_when_joined(&home, guaranteed_ask_of(2000, Some(&target)), &c).await;
    assert_eq!(again.containers[0].node_id.as_str(), target);
    c.stop();
}

/// A coordinator killed with SIGKILL while a GUARANTEED grant is outstanding (granted, not
/// started) and restarted on the same data dir must not let that capacity be granted twice: the
/// old grant is void (the node re-joined under a new session), the capacity is granted anew, and
/// only the new grant starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_restart_voids_outstanding_grants_instead_of_granting_their_capacity_twice() {
    let args = LocalArgs {
        workers: 1,
        cpu_millis: 2000,
        memory_mib: 2048,
        heartbeat_interval_ms: 100,
        node_timeout_ms: 1500,
        data_dir: std::env::var_os("E2E_DATA_DIR").map(|d| PathBuf::from(d).join("restart")),
        ..LocalArgs::default()
    };
    let mut c = LocalCluster::start(&args).expect("local cluster starts");
    let (pool, _events) =
        ClientPool::with_options(&c.app_id, &c.app_secret, c.client_options().unwrap());
    let client = pool.get(&c.workers[0].app_endpoint).await.unwrap();
    let allocate = |ask: Allocate| {
        let client = client.clone();
        async move {
            tokio::time::timeout(GUARD, client.allocate(ask))
                .await
                .expect("answered")
                .expect("granted")
        }
    };
    // Running when the coordinator dies: a GUARANTEED container of 400 and a QUEUEABLE one.
    let g_running = allocate(guaranteed_ask_of(400, None)).await;
    pool.start(
        &g_running.containers[0],
        marked_sleeper("restart-g-running"),
    )
    .await
    .expect("GUARANTEED container starts");
    let mut queueable = guaranteed_ask_of(100, None);
    queueable.container_type = ContainerType::Queueable;
    let q_running = allocate(queueable.clone()).await;
    pool.start(
        &q_running.containers[0],
        marked_sleeper("restart-q-running"),
    )
    .await
    .expect("QUEUEABLE container starts");
    wait_for_processes("restart-g-running", 1, &c, "worker-1").await;
    wait_for_processes("restart-q-running", 1, &c, "worker-1").await;
    // Outstanding when it dies: a QUEUEABLE grant and 1,500 GUARANTEED, neither started.
    let q_outstanding = allocate(queueable.clone()).await;
    let before = allocate(guaranteed_ask_of(1500, None)).await;

    c.restart_coordinator(&args).expect("coordinator restarts");
    // The restarted coordinator re-books the running 400 from the worker's re-join and never
    // heard of the unstarted grant: 1,600 of 2,000 are free to it.
    let after = allocate_when_joined(&client, guaranteed_ask_of(1500, None), &c).await;
    let (old_id, new_id) = (
        before.containers[0].container_id,
        after.containers[0].container_id,
    );
    assert!(
        old_id.issuer() == 0 && new_id.issuer() == 0 && new_id.seq() > old_id.seq(),
        "GUARANTEED ids continue after the restart, never reused: {old_id} then {new_id}"
    );
    for (grant, what) in [(&before, "GUARANTEED"), (&q_outstanding, "QUEUEABLE")] {
        let old = pool
            .start(&grant.containers[0], marked_sleeper("restart-old"))
            .await
            .expect_err("a grant from before the restart must not start");
        assert_eq!(old.code(), Some(ErrorCode::InvalidToken), "{what}: {old:?}");
        assert!(
            format!("{old:?}").contains("another session"),
            "{what}: {old:?}"
        );
    }
    pool.start(&after.containers[0], marked_sleeper("restart-new"))
        .await
        .expect("the new grant starts");
    wait_for_processes("restart-new", 1, &c, "worker-1").await;
    assert_eq!(processes_with("restart-old").len(), 0);
    // What ran across the restart still runs: 400 + 1,500 GUARANTEED and 100 QUEUEABLE fit the
    // 2,000 exactly, so nothing was preempted or granted twice.
    assert_eq!(processes_with("restart-g-running").len(), 1);
    assert_eq!(processes_with("restart-q-running").len(), 1);
    // A QUEUEABLE grant of the new session has an id of a new issuer: no id is reused.
    let q_after = allocate(queueable).await;
    let (q_old, q_new) = (
        q_running.containers[0].container_id,
        q_after.containers[0].container_id,
    );
    assert!(
        q_new.issuer() > q_old.issuer(),
        "a new session issues under a new prefix: {q_old} then {q_new}"
    );
    c.stop();
}

//! End-to-end tests that spawn the real `coordinator` and `worker` binaries as separate processes
//! on loopback (built by `cargo test --workspace`) and drive them with the real client and load
//! generator. Timeouts only guard against hangs; every wait is for an event.

use scheduler_core::protocol::app::{
    AcceptedState, Allocate, ContainerEvent, ContainerEventKind, ErrorCode, LaunchSpec,
};
use scheduler_core::{ContainerType, KillReason, Resources};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;
use testbed::client::ClientPool;
use testbed::load::{LoadArgs, LoadType, run_load};
use testbed::local::{LocalArgs, LocalCluster};
use tokio::sync::mpsc;

const GUARD: Duration = Duration::from_secs(60);

fn task_program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_testbed"))
}

fn cluster(workers: usize) -> LocalCluster {
    LocalCluster::start(&LocalArgs {
        workers,
        cpu_millis: 2000,
        memory_mib: 2048,
        heartbeat_interval_ms: 100,
        node_timeout_ms: 1500,
        data_dir: std::env::var_os("E2E_DATA_DIR").map(|d| PathBuf::from(d).join(format!("{workers}"))),
        ..LocalArgs::default()
    })
    .expect("local cluster starts (are the coordinator and worker binaries built? cargo test --workspace builds them)")
}

fn load_args(c: &LocalCluster, load_type: LoadType, containers: usize) -> LoadArgs {
    LoadArgs {
        endpoint: c.workers[0].app_endpoint.clone(),
        ca_cert: Some(c.ca_cert.clone()),
        app_id: Some(c.app_id.clone()),
        app_secret: Some(c.app_secret.clone()),
        credentials_file: None,
        containers,
        load_type,
        policy: "<10sec-70%-Q".into(),
        concurrency: 6,
        task_duration_ms: 50,
        long_task_duration_ms: 0,
        long_fraction: 0.0,
        task_memory_mib: 1,
        task_cpu_fraction: 0.0,
        cpu_millis: 250,
        memory_mib: 32,
        max_retries: 50,
        seed: 3,
        allocate_only: false,
        task_program: Some(task_program()),
        json: false,
        measure_floor: false,
        floor_round_trips: 0,
    }
}

fn ask(t: ContainerType, count: u32) -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(200, 32),
        count,
        priority: 0,
        container_type: t,
        locality: None,
        runtime_estimate_ms: Some(60_000),
        job_id: "e2e".into(),
        job_submit_time_ms: 1,
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    }
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<ContainerEvent>) -> ContainerEvent {
    tokio::time::timeout(GUARD, events.recv())
        .await
        .expect("an event within the guard time")
        .expect("event stream open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_container_type_runs_to_completion_on_a_three_process_cluster() {
    let c = cluster(3);
    for t in [LoadType::Queueable, LoadType::Guaranteed, LoadType::Hybrid] {
        let report = tokio::time::timeout(GUARD, run_load(&load_args(&c, t, 24)))
            .await
            .expect("load finishes")
            .unwrap();
        assert_eq!(report.completed, 24, "{t:?}: {report:?}");
        assert_eq!(report.failed, 0, "{t:?}: {report:?}");
        assert!(report.started >= 24);
        let nodes: HashSet<&String> = report.granted_by_node.keys().collect();
        assert!(!nodes.is_empty());
        if t == LoadType::Queueable {
            assert_eq!(report.allocate_guaranteed.count, 0);
            assert!(report.allocate_queueable.count >= 24);
            assert!(
                nodes.len() >= 2,
                "top-k placement spreads over nodes: {nodes:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_node_is_reported_to_the_app_and_new_asks_avoid_it() {
    let mut c = cluster(3);
    let (pool, mut events) =
        ClientPool::with_options(&c.app_id, &c.app_secret, c.client_options().unwrap());
    let local = pool.get(&c.workers[0].app_endpoint).await.unwrap();
    let long = LaunchSpec {
        command: task_program().display().to_string(),
        args: vec!["task".into(), "--duration-ms".into(), "120000".into()],
        ..Default::default()
    };
    // One container per node: at most one off-locality container of an ask per node per round.
    // The first worker may not have heard of the last one yet (views travel with heartbeats):
    // poll until its view holds all three nodes.
    let deadline = tokio::time::Instant::now() + GUARD;
    let grants = loop {
        let a = local
            .allocate(ask(ContainerType::Queueable, 3))
            .await
            .unwrap();
        if a.containers.len() == 3 {
            break a;
        }
        assert_eq!(a.unplaced, 3 - a.containers.len() as u32);
        for g in &a.containers {
            local.release(g.container_id).await.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the view never held three nodes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let nodes: HashSet<&str> = grants
        .containers
        .iter()
        .map(|g| g.node_id.as_str())
        .collect();
    assert_eq!(nodes.len(), 3);
    for g in &grants.containers {
        assert_eq!(
            pool.start(g, long.clone()).await.unwrap().state,
            AcceptedState::Running
        );
    }
    let victim = grants
        .containers
        .iter()
        .find(|g| g.node_id.as_str() == "worker-3")
        .unwrap()
        .container_id;
    c.kill("worker-3").unwrap();
    loop {
        let ev = next_event(&mut events).await;
        if ev.container_id == victim {
            match ev.event {
                ContainerEventKind::Killed {
                    reason: KillReason::Lost,
                    ..
                } => break,
                ContainerEventKind::Running => continue,
                other => panic!("unexpected event for the victim: {other:?}"),
            }
        }
    }
    for t in [ContainerType::Queueable, ContainerType::Guaranteed] {
        let a = local.allocate(ask(t, 2)).await.unwrap();
        assert!(!a.containers.is_empty());
        for g in &a.containers {
            assert_ne!(
                g.node_id.as_str(),
                "worker-3",
                "{t:?} granted on the lost node"
            );
            local.release(g.container_id).await.unwrap();
        }
    }
    // The survivors kept running through the loss.
    for g in grants
        .containers
        .iter()
        .filter(|g| g.container_id != victim)
    {
        local.release(g.container_id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_get_clear_errors_and_others_keep_being_served() {
    let c = cluster(1);
    let (pool, _events) =
        ClientPool::with_options(&c.app_id, &c.app_secret, c.client_options().unwrap());
    let good = pool.get(&c.workers[0].app_endpoint).await.unwrap();
    // Wrong secret.
    let (tx, _rx) = mpsc::unbounded_channel();
    let err = testbed::client::AppClient::connect_with(
        &c.workers[0].app_endpoint,
        &c.client_options().unwrap(),
        &c.app_id,
        "wrong",
        tx,
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(
        err.server().map(|e| e.code),
        Some(ErrorCode::BadCredentials)
    );
    // An ask larger than any node.
    let mut huge = ask(ContainerType::Queueable, 1);
    huge.resources = Resources::new(64_000, 1);
    let err = good.allocate(huge.clone()).await.unwrap_err();
    assert_eq!(err.server().map(|e| e.code), Some(ErrorCode::AskTooLarge));
    huge.container_type = ContainerType::Guaranteed;
    let err = good.allocate(huge).await.unwrap_err();
    assert_eq!(err.server().map(|e| e.code), Some(ErrorCode::AskTooLarge));
    // A replayed token.
    let g = good
        .allocate(ask(ContainerType::Queueable, 1))
        .await
        .unwrap()
        .containers
        .remove(0);
    let quick = LaunchSpec {
        command: "true".into(),
        ..Default::default()
    };
    good.start_container(g.token.clone(), quick.clone())
        .await
        .unwrap();
    let err = good
        .start_container(g.token.clone(), quick)
        .await
        .unwrap_err();
    assert_eq!(err.server().map(|e| e.code), Some(ErrorCode::InvalidToken));
    assert!(
        err.server().unwrap().message.contains("already used"),
        "{err}"
    );
    // An ask whose answer could not fit one frame.
    let mut many = ask(ContainerType::Queueable, 1001);
    many.resources = Resources::new(1, 1);
    let err = good.allocate(many).await.unwrap_err();
    assert_eq!(
        err.server().map(|e| e.code),
        Some(ErrorCode::InvalidRequest)
    );
    assert!(err.server().unwrap().message.contains("1000"), "{err}");
    // Still served.
    assert_eq!(
        good.allocate(ask(ContainerType::Queueable, 1))
            .await
            .unwrap()
            .containers
            .len(),
        1
    );
}

/// The reservation loop through a real worker and coordinator (Morpheus §4, §6): the app reserves
/// capacity for now, its job's GUARANTEED ask naming the reservation is granted up to the
/// allocation, plain GUARANTEED work gets only what is left, and bad input is answered naming the
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_are_made_and_used_through_the_worker() {
    use scheduler_core::reservation::{Interpreter, ReservationDefinition, Stage};
    const MIN: u64 = 60_000;
    let c = cluster(1);
    let (pool, _events) =
        ClientPool::with_options(&c.app_id, &c.app_secret, c.client_options().unwrap());
    let client = pool.get(&c.workers[0].app_endpoint).await.unwrap();
    // Agenda time is UTC time of day; the window starts at the current minute.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let minute = (now_ms % (24 * 60 * MIN)) / MIN;
    let end = (minute + 10).min(24 * 60);
    let definition = ReservationDefinition {
        arrival_ms: minute * MIN,
        deadline_ms: end * MIN,
        interpreter: Interpreter::All,
        stages: vec![Stage {
            containers: 2,
            gang: 2,
            duration_ms: (end - minute) * MIN,
            size: Resources::new(500, 256),
        }],
        recurrence_ms: Some(24 * 60 * MIN),
        alignment_penalty: 0.0,
    };
    let bad = client.reserve("no/slash", definition.clone()).await;
    match bad {
        Err(testbed::client::ClientError::Server(e)) => {
            assert_eq!(e.code, ErrorCode::InvalidRequest);
            assert!(e.message.contains("reservation_id"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // The worker may not have joined yet: coordinator_unavailable is retryable.
    let deadline = tokio::time::Instant::now() + GUARD;
    let accepted = loop {
        match client.reserve("etl", definition.clone()).await {
            Ok(a) => break a,
            Err(testbed::client::ClientError::Server(e))
                if e.retryable && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("reserve: {e}"),
        }
    };
    assert_eq!(accepted.allocation.len(), 1);
    assert_eq!(accepted.allocation[0].cpu_millis, 1000);
    // Plain GUARANTEED work gets the node's 2000 millicores less the 1000 reserved, although
    // the reservation's owner runs nothing yet.
    let mut plain = ask(ContainerType::Guaranteed, 4);
    plain.resources = Resources::new(500, 256);
    let mut frames = client.allocate_frames(plain).unwrap();
    let first = tokio::time::timeout(GUARD, frames.next())
        .await
        .expect("a first frame")
        .unwrap()
        .unwrap();
    assert_eq!((first.containers.len(), first.remaining), (2, 2));
    // The owner's job gets its whole allocation.
    let mut reserved = ask(ContainerType::Guaranteed, 2);
    reserved.resources = Resources::new(500, 256);
    reserved.reservation_id = Some("etl".into());
    let granted = tokio::time::timeout(GUARD, client.allocate(reserved))
        .await
        .expect("the reserved ask is answered")
        .unwrap();
    assert_eq!(granted.containers.len(), 2);
    let list = client.list_reservations().await.unwrap();
    assert_eq!(list.reservations.len(), 1);
    assert_eq!(list.reservations[0].used, Resources::new(1000, 512));
    assert!(!list.free.is_empty());
    drop(frames);
    client.delete_reservation("etl").await.unwrap();
    match client.delete_reservation("etl").await {
        Err(testbed::client::ClientError::Server(e)) => {
            assert_eq!(e.code, ErrorCode::UnknownReservation)
        }
        other => panic!("{other:?}"),
    }
}

/// `explain` on the app protocol, through the worker to the coordinator's guarantor and back:
/// a 3Sigma job waiting behind plain GUARANTEED work that fills the node is explained to its
/// app (distribution, options, reason); an id with no waiting job gives an empty answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_asks_why_its_3sigma_job_waits() {
    use scheduler_core::protocol::app::{JobSpec, JobUtility};
    let c = cluster(1);
    let (pool, _events) =
        ClientPool::with_options(&c.app_id, &c.app_secret, c.client_options().unwrap());
    let client = pool.get(&c.workers[0].app_endpoint).await.unwrap();
    // Plain GUARANTEED grants fill the node (the worker may not have joined yet: retry).
    let mut blocker = ask(ContainerType::Guaranteed, 1);
    blocker.resources = Resources::new(2000, 1024);
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        match client.allocate(blocker.clone()).await {
            Ok(_) => break,
            Err(testbed::client::ClientError::Server(e))
                if e.retryable && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("blocker: {e}"),
        }
    }
    let mut job = ask(ContainerType::Guaranteed, 1);
    job.job_id = "nightly".into();
    job.job = Some(JobSpec {
        utility: JobUtility::BestEffort {
            value: 1.0,
            zero_after_ms: 600_000,
        },
        features: Default::default(),
        required: vec![],
        preferred: vec![],
        non_preferred_slowdown: None,
    });
    let _waiting = client.allocate_frames(job).unwrap();
    // Bounded polling: the answer appears once a cycle (every second) has planned the job.
    let explained = loop {
        let e = client.explain("nightly").await.expect("explain answered");
        if e.jobs.first().is_some_and(|j| j.cycle_at_ms.is_some()) {
            break e;
        }
        assert!(
            tokio::time::Instant::now() < deadline + GUARD,
            "no cycle explained the job: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let j = &explained.jobs[0];
    assert_eq!(
        (j.app_id.as_str(), j.job_id.as_str()),
        (c.app_id.as_str(), "nightly")
    );
    assert!(j.reason.contains("capacity"), "{}", j.reason);
    assert!(j.belief.p50_s > 0.0, "{:?}", j.belief);
    let none = client.explain("no-such-job").await.unwrap();
    assert!(none.jobs.is_empty(), "{none:?}");
}

/// The operator's end of the Morpheus loop with the real binaries: signed-off SLO contracts
/// (inference's JSON) become recurring reservations through `testbed reservations submit`
/// (again: updated), and `testbed reservations list` shows them with the plan's free capacity.
#[test]
fn reservations_submit_and_list_commands_drive_a_running_coordinator() {
    use inference::slo::{ContractStatus, SloContract, SloRule};
    let c = cluster(1);
    let contract = |job: &str, status| SloContract {
        job: job.into(),
        period: 86_400.0,
        earliest_start: 3_600.0,
        deadline: 7_200.0,
        skyline: Some(vec![1, 2, 2, 1]),
        status,
        start_rule: SloRule::SubmitPercentile,
        deadline_rule: SloRule::EndPercentileFallback,
        overridden: vec![],
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("contracts.json");
    let contracts = vec![
        contract("nightly etl", ContractStatus::SignedOff),
        contract("hourly report", ContractStatus::Proposed),
    ];
    std::fs::write(&file, serde_json::to_string(&contracts).unwrap()).unwrap();
    let endpoint_args = |cmd: &str| {
        let mut a = vec![
            "reservations".to_string(),
            cmd.to_string(),
            "--endpoint".into(),
            c.workers[0].app_endpoint.clone(),
            "--ca-cert".into(),
            c.ca_cert.display().to_string(),
            "--app-id".into(),
            c.app_id.clone(),
            "--app-secret".into(),
            c.app_secret.clone(),
            "--json".into(),
        ];
        if cmd == "submit" {
            a.push(file.display().to_string());
        }
        a
    };
    let run = |cmd: &str| {
        // The worker may not have joined the coordinator yet: its answer is then retryable.
        let deadline = std::time::Instant::now() + GUARD;
        loop {
            let out = std::process::Command::new(task_program())
                .args(endpoint_args(cmd))
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            if out.status.success() || std::time::Instant::now() > deadline {
                assert!(
                    out.status.success(),
                    "{cmd}: {stdout} {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return serde_json::from_str::<serde_json::Value>(&stdout).unwrap();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    for op in ["reserve", "update_reservation"] {
        let v = run("submit");
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["reservation_id"], "nightly-etl");
        assert_eq!(results[0]["accepted"], true, "{v}");
        assert_eq!(results[0]["op"], op);
        assert_eq!(results[0]["allocation"].as_array().unwrap().len(), 3);
        assert_eq!(results[1]["accepted"], false);
        assert!(
            results[1]["reason"]
                .as_str()
                .unwrap()
                .contains("not signed off")
        );
    }
    let v = run("list");
    let reservations = v["reservations"].as_array().unwrap();
    assert_eq!(reservations.len(), 1);
    assert_eq!(reservations[0]["reservation_id"], "nightly-etl");
    assert!(!v["free"].as_array().unwrap().is_empty());
}

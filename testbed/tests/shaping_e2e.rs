//! End to end, Pace's resource shaper on a real local cluster (the coordinator and a worker in
//! process, real container processes running `testbed task` with memory profiles, the real
//! client over TCP): running GUARANTEED containers that allow shaping are shrunk to their
//! forecast, a GUARANTEED ask that did not fit is admitted into the freed capacity, and a burst
//! of the elastic components makes the pessimistic policy preempt the youngest one (event reason
//! `shaped_preemption`) instead of anything being killed for memory.
//!
//! Deterministic: the shaping interval is an hour, so passes run only when the test asks
//! (`ShapeNow`), each after every shaped container reported its use since the previous pass;
//! the burst starts when the test creates the tasks' start file. Waits are for events and
//! states, bounded by a guard that only catches hangs.

use coordinator::config::ShapingSettings;
use coordinator::datadir::DataDir;
use coordinator::guarantor_actor::{InspectShaping, ShapeNow, ShapingStatus};
use coordinator::{CoordinatorServer, CoordinatorSettings};
use inference::forecast::shaping::ForecasterKind;
use scheduler_core::protocol::app::{
    Allocate, Allocated, ContainerEvent, ContainerEventKind, GrantedContainer, LaunchSpec,
};
use scheduler_core::shaper::ComponentRole;
use scheduler_core::shaping::{ShapingConfig, ShapingOutcome};
use scheduler_core::{ContainerId, ContainerType, KillReason, Resources};
use std::path::Path;
use std::time::Duration;
use testbed::client::AppClient;
use tokio::sync::mpsc;
use worker::config::{AppLimits, AppTcp, WorkerConfig};

const GUARD: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(20);
/// Passes allowed for each phase (the GP needs 12 observations before it forecasts).
const MAX_PASSES: usize = 60;

fn task(args: &[String]) -> LaunchSpec {
    LaunchSpec {
        command: env!("CARGO_BIN_EXE_testbed").to_string(),
        args: std::iter::once("task".to_string())
            .chain(args.iter().cloned())
            .collect(),
        ..Default::default()
    }
}

fn ask(memory_mib: u64, role: ComponentRole, allow_shaping: bool) -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(1000, memory_mib),
        count: 1,
        priority: 0,
        container_type: ContainerType::Guaranteed,
        locality: None,
        runtime_estimate_ms: Some(600_000),
        job_id: "shaping-e2e".into(),
        job_submit_time_ms: 1,
        reservation_id: None,
        role,
        allow_shaping,
        job: None,
        replaces_shed: Vec::new(),
    }
}

async fn start_cluster(
    dir: &Path,
    node_memory_mib: u64,
) -> (CoordinatorServer, worker::WorkerHandle, String) {
    let data = DataDir::new(dir);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64;
    let report =
        coordinator::datadir::init(&data, &[("demo".to_string(), Default::default())], now_ms)
            .expect("init data dir");
    let secret = report.apps[0].app_secret.clone();
    let mut settings = CoordinatorSettings::new(dir);
    settings.listen = "127.0.0.1:0".parse().expect("literal");
    settings.seed = Some(7);
    settings.heartbeat_interval = Duration::from_millis(100);
    settings.shaping = Some(ShapingSettings {
        config: ShapingConfig {
            interval_ms: 3_600_000,
            ..ShapingConfig::default()
        },
        forecaster: ForecasterKind::Gp,
        refit_every: 1,
    });
    let server = coordinator::start(settings, coordinator::clock::system())
        .await
        .expect("coordinator starts");
    let config = WorkerConfig {
        coordinator: server.quic_addr.to_string(),
        ca_cert: data.ca_cert(),
        join_token: std::fs::read_to_string(data.join_token()).expect("join token"),
        join_token_file: Some(data.join_token()),
        node_id: "n1".to_string(),
        rack: "rack-a".to_string(),
        attributes: Default::default(),
        cpu_millis: 4000,
        memory_mib: node_memory_mib,
        app_tcp: Some(AppTcp::plaintext("127.0.0.1:0".parse().expect("literal"))),
        app_advertise: None,
        app_socket: None,
        container_log_dir: None,
        container_log_max_bytes: 1 << 20,
        container_user: worker::exec::user::resolve_container_user(None)
            .expect("default container user"),
        allow_root_containers: false,
        state_dir: dir.join("worker-state"),
        default_runtime_estimate_ms: 10_000,
        fifo_queue: false,
        max_queue_length: 1000,
        seed: Some(11),
        app_limits: AppLimits::default(),
        metrics_listen: None,
    };
    let worker = worker::start(config)
        .await
        .expect("worker starts and joins");
    (server, worker, secret)
}

async fn shaping_status(server: &CoordinatorServer) -> ShapingStatus {
    server
        .guarantor
        .send(InspectShaping)
        .await
        .expect("guarantor running")
        .expect("shaping is on")
}

/// One pass once every shaped container has reported its use since the previous one.
async fn pass_after_fresh_use(server: &CoordinatorServer) -> ShapingOutcome {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let s = shaping_status(server).await;
        if s.tracked > 0 && s.observed_since_pass == s.tracked {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no fresh use reported: {s:?}"
        );
        actix_rt::time::sleep(POLL).await;
    }
    server
        .guarantor
        .send(ShapeNow)
        .await
        .expect("guarantor running")
}

async fn event(
    events: &mut mpsc::UnboundedReceiver<ContainerEvent>,
    what: &str,
    mut matches: impl FnMut(&ContainerEvent) -> bool,
) -> ContainerEvent {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let e = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no {what} event within the guard"))
            .expect("event stream open");
        assert!(
            !matches!(
                e.event,
                ContainerEventKind::Killed {
                    reason: KillReason::Failed,
                    ..
                }
            ),
            "a container failed (killed for memory?): {e:?}"
        );
        if matches(&e) {
            return e;
        }
    }
}

async fn start(
    client: &AppClient,
    events: &mut mpsc::UnboundedReceiver<ContainerEvent>,
    grant: &GrantedContainer,
    args: &[String],
) {
    client
        .start_container(grant.token.clone(), task(args))
        .await
        .expect("start accepted");
    let id = grant.container_id;
    event(events, "running", |e| {
        e.container_id == id && e.event == ContainerEventKind::Running
    })
    .await;
}

fn one(a: Allocated) -> GrantedContainer {
    assert_eq!(a.containers.len(), 1, "{a:?}");
    a.containers.into_iter().next().expect("one grant")
}

#[actix_rt::test]
async fn shaping_frees_capacity_admits_a_waiting_container_and_a_burst_preempts_an_elastic_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, worker, secret) = start_cluster(dir.path(), 800).await;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let client = AppClient::connect(&worker.app_endpoint, "demo", &secret, events_tx)
        .await
        .expect("connect");
    client.subscribe().await.expect("subscribe");
    // The containers run as another user: the trigger's directory must be searchable by it.
    let trigger_dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        trigger_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let burst_file = trigger_dir.path().join("burst");
    let plateau: Vec<String> = ["--duration-ms", "600000", "--memory-profile", "0:30"]
        .map(String::from)
        .to_vec();
    // Elastic components: 30 MiB until the burst file exists, then up to 180 MiB in 3 s (within
    // their 256-MiB request: only the node's capacity is at stake, not their own limit).
    let bursting: Vec<String> = vec![
        "--duration-ms".into(),
        "600000".into(),
        "--memory-profile".into(),
        "0:30,3000:180".into(),
        "--profile-start-file".into(),
        burst_file.display().to_string(),
    ];
    // 3 × 256 MiB of an 800-MiB node: a core and two elastic components, shaped.
    let core = one(client
        .allocate(ask(256, ComponentRole::Core, true))
        .await
        .unwrap());
    start(&client, &mut events, &core, &plateau).await;
    let old = one(client
        .allocate(ask(256, ComponentRole::Elastic, true))
        .await
        .unwrap());
    start(&client, &mut events, &old, &bursting).await;
    let young = one(client
        .allocate(ask(256, ComponentRole::Elastic, true))
        .await
        .unwrap());
    start(&client, &mut events, &young, &bursting).await;

    // A 400-MiB unshaped GUARANTEED ask does not fit (32 MiB free): it waits.
    let (waiting_tx, mut waiting_events) = mpsc::unbounded_channel();
    let waiting_client = AppClient::connect(&worker.app_endpoint, "demo", &secret, waiting_tx)
        .await
        .expect("connect");
    let waiting = actix_rt::spawn(async move {
        let grant = waiting_client
            .allocate(ask(400, ComponentRole::Core, false))
            .await;
        (waiting_client, grant)
    });

    // Passes until the shaper has shrunk the three and the waiting ask is granted.
    let mut passes = 0;
    while !waiting.is_finished() {
        passes += 1;
        assert!(passes <= MAX_PASSES, "the waiting ask was never admitted");
        let out = pass_after_fresh_use(&server).await;
        assert!(out.preempted.is_empty(), "pass {passes}: {out:?}");
    }
    assert!(
        passes > 12,
        "shaped after {passes} passes: before the GP had its history"
    );
    let status = shaping_status(&server).await;
    let shaped: u64 = status.allocations.iter().map(|a| a.1.memory_mib).sum();
    assert!(shaped <= 800 - 400, "shaped allocations {status:?}");
    let (waiting_client, grant) = waiting.await.expect("task");
    let admitted = one(grant.expect("granted"));
    waiting_client.subscribe().await.expect("subscribe");
    let small: Vec<String> = ["--duration-ms", "600000", "--memory-mib", "8"]
        .map(String::from)
        .to_vec();
    start(&waiting_client, &mut waiting_events, &admitted, &small).await;

    // Burst: both elastic components grow to 180 MiB. The shaped allocations no longer fit
    // beside the admitted 400 MiB: Algorithm 1 keeps the core and the older elastic component
    // and preempts the younger one.
    std::fs::write(&burst_file, b"go").expect("burst file");
    let mut preempted = None;
    for pass in 1..=MAX_PASSES {
        let out = pass_after_fresh_use(&server).await;
        if let Some(p) = out.preempted.first() {
            assert_eq!(out.preempted.len(), 1, "pass {pass}: {out:?}");
            preempted = Some(p.1);
            break;
        }
    }
    assert_eq!(
        preempted,
        Some(young.container_id),
        "the youngest elastic component"
    );
    let killed = event(&mut events, "shaped preemption", |e| {
        matches!(e.event, ContainerEventKind::Killed { .. })
    })
    .await;
    assert_eq!(killed.container_id, young.container_id);
    let ContainerEventKind::Killed { reason, message } = &killed.event else {
        unreachable!()
    };
    assert_eq!(*reason, KillReason::ShapedPreemption);
    assert!(message.contains("elastic"), "{message}");
    // The others keep running, and the node is not over-committed by the books.
    let status = shaping_status(&server).await;
    let ids: Vec<ContainerId> = status.allocations.iter().map(|a| a.0).collect();
    assert_eq!(ids, vec![core.container_id, old.container_id]);
    let node = worker
        .node
        .send(worker::node_actor::Inspect)
        .await
        .expect("node actor");
    node.invariants.clone().expect("node invariants");
    assert!(node.guaranteed_committed.memory_mib <= 800, "{node:?}");
    assert_eq!(node.running, 3, "{node:?}");
    let metrics = server.metrics.encode();
    assert!(
        metrics.contains("coordinator_shaping_preemptions_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("coordinator_shaped_containers 2"),
        "{metrics}"
    );
    // The 10-minute containers die with the test rather than outlive it as orphans.
    worker.shutdown().await;
}

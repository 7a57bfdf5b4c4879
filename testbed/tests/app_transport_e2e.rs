//! The app endpoint's transports end to end (issue 11, docs/protocol.md §1): `testbed local`
//! starts real `coordinator` and `worker` processes with TLS (the default), Unix sockets or
//! explicit plaintext TCP, and the real client and load generator connect over each.
//! Timeouts only guard against hangs; every wait is for an event.

use std::path::PathBuf;
use std::time::Duration;
use testbed::client::{AppClient, ClientError, ClientPool, ConnectOptions, Endpoint};
use testbed::load::{LoadArgs, LoadType, run_load};
use testbed::local::{AppTransport, LocalArgs, LocalCluster};
use tokio::sync::mpsc;

const GUARD: Duration = Duration::from_secs(60);

fn cluster(workers: usize, app_transport: AppTransport) -> LocalCluster {
    LocalCluster::start(&LocalArgs {
        workers,
        cpu_millis: 2000,
        memory_mib: 2048,
        heartbeat_interval_ms: 100,
        app_transport,
        ..LocalArgs::default()
    })
    .expect("local cluster starts (cargo test --workspace builds the coordinator and worker)")
}

fn load_args(c: &LocalCluster, containers: usize) -> LoadArgs {
    LoadArgs {
        endpoint: c.workers[0].app_endpoint.clone(),
        ca_cert: Some(c.ca_cert.clone()),
        app_id: Some(c.app_id.clone()),
        app_secret: Some(c.app_secret.clone()),
        credentials_file: None,
        containers,
        load_type: LoadType::Queueable,
        policy: "<10sec-70%-Q".into(),
        concurrency: 4,
        task_duration_ms: 20,
        long_task_duration_ms: 0,
        long_fraction: 0.0,
        task_memory_mib: 1,
        task_cpu_fraction: 0.0,
        cpu_millis: 250,
        memory_mib: 32,
        max_retries: 50,
        seed: 5,
        allocate_only: false,
        task_program: Some(PathBuf::from(env!("CARGO_BIN_EXE_testbed"))),
        json: false,
        measure_floor: false,
        floor_round_trips: 0,
    }
}

async fn connect(
    endpoint: &str,
    options: &ConnectOptions,
    c: &LocalCluster,
) -> Result<AppClient, ClientError> {
    let (tx, _rx) = mpsc::unbounded_channel();
    tokio::time::timeout(
        GUARD,
        AppClient::connect_with(endpoint, options, &c.app_id, &c.app_secret, tx),
    )
    .await
    .expect("connect ends in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_local_cluster_runs_load_and_only_clients_trusting_its_ca_get_in() {
    let c = cluster(2, AppTransport::Tls);
    for w in &c.workers {
        assert!(
            w.app_endpoint.starts_with("tls://127.0.0.1:"),
            "{}",
            w.app_endpoint
        );
    }
    assert_eq!(c.summary_json()["ca_cert"], c.ca_cert.display().to_string());
    // Containers granted on either worker start through the pool, over TLS.
    let report = tokio::time::timeout(GUARD, run_load(&load_args(&c, 12)))
        .await
        .expect("load finishes")
        .unwrap();
    assert_eq!(report.completed, 12, "{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");

    let endpoint = &c.workers[0].app_endpoint;
    let trusted = connect(endpoint, &c.client_options().unwrap(), &c)
        .await
        .expect("a client trusting the cluster CA is welcomed");
    assert_eq!(trusted.welcome().node_id, c.workers[0].node_id);

    // No CA given: refused before connecting, and told why.
    let e = connect(endpoint, &ConnectOptions::default(), &c)
        .await
        .err()
        .expect("no CA, no connection");
    assert!(e.to_string().contains("cluster CA"), "{e}");

    // Another cluster's CA: the handshake fails on the worker's certificate.
    let other = tempfile::tempdir().unwrap();
    let other_dir = coordinator::datadir::DataDir::new(other.path().join("data"));
    coordinator::datadir::init(&other_dir, &[], 1).unwrap();
    let e = connect(
        endpoint,
        &ConnectOptions::with_ca_cert(&other_dir.ca_cert()).unwrap(),
        &c,
    )
    .await
    .err()
    .expect("an untrusted worker certificate is refused");
    assert!(
        matches!(e, ClientError::Connect { .. }) && e.to_string().contains("TLS handshake"),
        "{e}"
    );

    // Plaintext to the TLS port: a transport failure, not a welcome (and no panic).
    let Endpoint::Tls(addr) = Endpoint::parse(endpoint) else {
        panic!("{endpoint} is TLS")
    };
    let e = connect(&format!("tcp://{addr}"), &ConnectOptions::default(), &c)
        .await
        .err()
        .expect("plaintext to a TLS endpoint fails");
    // The worker's TLS alert is recognised and named (a reset, if the alert is lost to it).
    assert!(
        matches!(e, ClientError::Closed { .. })
            && (e.to_string().contains("speaks TLS") || e.to_string().contains("reset")),
        "{e:?}"
    );

    // The worker still serves.
    let again = connect(endpoint, &c.client_options().unwrap(), &c)
        .await
        .expect("still serving after the refusals");
    assert!(!again.is_closed());
    drop((trusted, again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_local_cluster_runs_load_across_workers() {
    let c = cluster(2, AppTransport::Unix);
    for w in &c.workers {
        assert!(w.app_endpoint.starts_with("unix:///"), "{}", w.app_endpoint);
    }
    let report = tokio::time::timeout(GUARD, run_load(&load_args(&c, 12)))
        .await
        .expect("load finishes")
        .unwrap();
    assert_eq!(report.completed, 12, "{report:?}");
    assert_eq!(report.failed, 0, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_local_cluster_is_named_tcp_and_serves_plain_clients() {
    let c = cluster(1, AppTransport::PlaintextTcp);
    let endpoint = &c.workers[0].app_endpoint;
    assert!(endpoint.starts_with("tcp://127.0.0.1:"), "{endpoint}");
    let (pool, _events) = ClientPool::new(&c.app_id, &c.app_secret);
    let client = tokio::time::timeout(GUARD, pool.get(endpoint))
        .await
        .expect("in time")
        .expect("welcomed over plaintext");
    assert_eq!(client.welcome().node_id, c.workers[0].node_id);
    // The bare HOST:PORT form still means plaintext.
    let bare = endpoint.strip_prefix("tcp://").unwrap();
    connect(bare, &ConnectOptions::default(), &c)
        .await
        .expect("bare HOST:PORT is plaintext TCP");
}

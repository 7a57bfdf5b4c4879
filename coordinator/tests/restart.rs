//! The store survives a restart: same CA, same keys, issuer counter and guarantor container ids
//! continue. Each phase runs in its own actix system so everything (and the store lock) is
//! dropped between them.

mod common;

use common::*;
use scheduler_core::ContainerId;
use scheduler_core::protocol::cluster::{CoordinatorToWorker, JoinAccepted};

async fn phase(dir: tempfile::TempDir) -> (tempfile::TempDir, JoinAccepted, ContainerId, Vec<u8>) {
    let h = Harness::start_in(dir).await;
    let (mut w, accepted) = h.join("node-a", 2000, 2048).await;
    w.send(&allocate_guaranteed(1, "demo", 100, 100, 1)).await;
    let grant = match w
        .expect("grant", |m| {
            matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
        })
        .await
    {
        CoordinatorToWorker::GuaranteedAllocated(g) => g.containers[0].container_id,
        _ => unreachable!(),
    };
    let ca = std::fs::read(h.ca()).unwrap();
    h.server.shutdown();
    (h.dir, accepted, grant, ca)
}

#[test]
fn store_survives_restart() {
    let dir = initialised_data_dir();
    let (dir, first, id1, ca1) = actix_rt::System::new().block_on(phase(dir));
    let (_dir, second, id2, ca2) = actix_rt::System::new().block_on(phase(dir));
    assert_eq!(ca1, ca2, "same cluster CA");
    assert_eq!(
        first.guaranteed_keys, second.guaranteed_keys,
        "same GUARANTEED keys"
    );
    // Each session has its own QUEUEABLE secret, and the scheduler its key for its own node.
    assert_ne!(first.node_secret, second.node_secret);
    assert_eq!(first.node_secret.node_epoch, first.issuer);
    assert_eq!(second.node_secret.node_epoch, second.issuer);
    assert_eq!(second.issuer_keys.len(), 1);
    assert_eq!(second.issuer_keys[0].node_epoch, second.issuer);
    assert_eq!(first.apps, second.apps);
    assert!(
        second.issuer > first.issuer,
        "issuers never repeat: {} then {}",
        first.issuer,
        second.issuer
    );
    assert_eq!((id1.issuer(), id2.issuer()), (0, 0));
    assert!(
        id2.seq() > id1.seq(),
        "guarantor ids continue: {id1} then {id2}"
    );
}

#[test]
fn a_second_coordinator_on_the_same_data_dir_is_refused_clearly() {
    actix_rt::System::new().block_on(async {
        let h = Harness::start().await;
        let err = match coordinator::start(test_settings(h.dir.path()), h.clock.clone()).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("second coordinator started on a locked store"),
        };
        assert!(err.contains("cannot open store"), "{err}");
    });
}

/// A data dir as an older coordinator (or a careless copy) left it: loose modes and the join
/// token in clear in the store. `coordinator::start` tightens the modes, migrates the record to
/// its hash, and the workers' join token still joins.
#[test]
fn a_restart_tightens_loose_modes_and_migrates_a_clear_join_token() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = coordinator::datadir::DataDir::new(dir.path());
    coordinator::datadir::init(&data, &[("demo".to_string(), Default::default())], 1).unwrap();
    let token = std::fs::read_to_string(data.join_token()).unwrap();
    {
        const META: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("meta");
        let db = redb::Database::open(data.store()).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.remove("join_token_sha256").unwrap();
            let sealed = coordinator::store::seal("meta", "join_token", token.as_bytes());
            meta.insert("join_token", sealed.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    std::fs::set_permissions(&data.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    for path in data.secret_files() {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    let (dir, accepted, _, _) = actix_rt::System::new().block_on(phase(dir));
    assert!(accepted.issuer > 0, "the join token still joins");
    let data = coordinator::datadir::DataDir::new(dir.path());
    assert_eq!(mode(&data.root), 0o700);
    for path in data.secret_files() {
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    let store = coordinator::store::Store::open(&data.store()).unwrap();
    assert_eq!(
        store.join_token_sha256().unwrap(),
        coordinator::store::join_token_hash(&token)
    );
    drop(store);
    let bytes = std::fs::read(data.store()).unwrap();
    assert!(
        !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
        "the clear token is gone from the store file"
    );
}

/// An operator's drain is saved in the store: the restarted coordinator still treats the node as
/// draining when it re-joins (`nodes` shows it, GUARANTEED work waits instead of going there),
/// until `undrain`.
#[test]
fn a_drain_outlives_a_coordinator_restart() {
    use coordinator::admin::{self, AdminRequest};
    async fn call(socket: std::path::PathBuf, request: AdminRequest) -> serde_json::Value {
        tokio::task::spawn_blocking(move || admin::call(&socket, &request))
            .await
            .unwrap()
            .unwrap()
    }
    let dir = initialised_data_dir();
    let dir = actix_rt::System::new().block_on(async move {
        let h = Harness::start_in(dir).await;
        let (_w, _) = h.join("node-a", 2000, 2048).await;
        let drained = call(
            h.server.admin_socket.clone(),
            AdminRequest::Drain {
                node: "node-a".into(),
            },
        )
        .await;
        assert_eq!(drained["changed"], true);
        h.server.shutdown();
        h.dir
    });
    let _dir = actix_rt::System::new().block_on(async move {
        let h = Harness::start_in(dir).await;
        let (mut w, _) = h.join("node-a", 2000, 2048).await;
        let nodes = call(h.server.admin_socket.clone(), AdminRequest::Nodes).await;
        assert_eq!(nodes[0]["node_id"], "node-a", "{nodes}");
        assert_eq!(nodes[0]["draining"], true, "{nodes}");
        // No GUARANTEED work goes to the drained node: the ask waits.
        w.send(&allocate_guaranteed(1, "demo", 100, 100, 1)).await;
        w.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
            .await;
        w.expect_ack().await;
        let waiting = call(h.server.admin_socket.clone(), AdminRequest::Waiting).await;
        assert_eq!(waiting["pending_containers"], 1, "{waiting}");
        // Undrained: it goes there, and the undrain is saved too.
        call(
            h.server.admin_socket.clone(),
            AdminRequest::Undrain {
                node: "node-a".into(),
            },
        )
        .await;
        assert!(matches!(
            w.expect("grant", |m| matches!(
                m,
                CoordinatorToWorker::GuaranteedAllocated(_)
            ))
            .await,
            CoordinatorToWorker::GuaranteedAllocated(_)
        ));
        h.server.shutdown();
        h.dir
    });
    let store = coordinator::datadir::DataDir::new(_dir.path()).store();
    let s = coordinator::store::Store::open(&store).unwrap();
    assert!(s.draining_nodes().unwrap().is_empty());
}

/// A coordinator restarted on the same data dir and address resets, at the worker's next
/// packet, a connection of its previous life (its stateless reset key is derived from the data
/// dir, `datadir::quic_endpoint_config`): the worker learns at once that its session is gone and
/// re-joins, instead of waiting out QUIC's idle timeout. The first life runs on a runtime of
/// its own that is dropped, as a crash would end it: its tasks are never polled again, so no
/// close frame reaches the worker. With quinn's defaults (random keys per endpoint) the second
/// life drops the worker's packet as one with an invalid connection id, and the worker hears
/// nothing until its idle timeout (this test then fails at its failure timeout).
#[test]
fn a_restarted_coordinator_resets_the_connections_of_its_previous_life() {
    use coordinator::datadir::{DataDir, quic_endpoint_config, quic_server_config};
    let dir = initialised_data_dir();
    let data = DataDir::new(dir.path());
    let endpoint_on = |socket: std::net::UdpSocket| {
        quinn::Endpoint::new(
            quic_endpoint_config(&data).unwrap(),
            Some(quic_server_config(&data).unwrap()),
            socket,
            quinn::default_runtime().unwrap(),
        )
        .unwrap()
    };
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first_life = runtime();
    let client = runtime();
    let first = first_life
        .block_on(async { endpoint_on(std::net::UdpSocket::bind("127.0.0.1:0").unwrap()) });
    let addr = first.local_addr().unwrap();
    let (got, mut got_rx) = tokio::sync::mpsc::unbounded_channel();
    first_life.spawn(async move {
        let connection = first.accept().await.unwrap().await.unwrap();
        let (_send, mut recv) = connection.accept_bi().await.unwrap();
        let mut buf = [0u8; 64];
        while let Ok(Some(n)) = recv.read(&mut buf).await {
            let _ = got.send(n);
        }
    });
    let mut w = client.block_on(async {
        let mut w = TestWorker::connect(addr, &data.ca_cert()).await;
        w.send_raw(&[0u8; 48]).await;
        w
    });
    assert!(
        got_rx.blocking_recv().is_some(),
        "the first life hears the worker"
    );
    // The crash: the first life's tasks and socket are dropped without another packet.
    drop(first_life);
    let second_life = runtime();
    let _second = second_life.block_on(async {
        endpoint_on(std::net::UdpSocket::bind(addr).expect("the first life's address is free"))
    });
    let ended = client.block_on(async {
        // The worker may already have heard the reset (its acknowledgement or a retransmission
        // can reach the second life before this write); then the write fails with it, which is
        // the outcome this test checks below.
        let _ = w.send_raw_checked(&[0u8; 48]).await;
        tokio::time::timeout(FAILURE_TIMEOUT, w.connection.closed())
            .await
            .expect("the connection ends well before the failure timeout")
    });
    assert!(matches!(ended, quinn::ConnectionError::Reset), "{ended:?}");
}

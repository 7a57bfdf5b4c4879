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
    let dir = tempfile::tempdir().unwrap();
    coordinator::datadir::init(
        &coordinator::datadir::DataDir::new(dir.path()),
        &[("demo".to_string(), Default::default())],
        1_700_000_000_000,
    )
    .unwrap();
    let (dir, first, id1, ca1) = actix_rt::System::new().block_on(phase(dir));
    let (_dir, second, id2, ca2) = actix_rt::System::new().block_on(phase(dir));
    assert_eq!(ca1, ca2, "same cluster CA");
    assert_eq!(first.keys, second.keys, "same token keys");
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

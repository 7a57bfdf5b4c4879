//! The operator's admin socket on a running coordinator: drain keeps new work off a node (top-k
//! and GUARANTEED placement), apps are added, re-quota'd and removed live (workers get the new
//! registry with their next ack), top-k and the shedding policy change live, and bad requests get a clear
//! error. Requests go through the same blocking client the `coordinator` commands use.

mod common;

use common::*;
use coordinator::admin::{self, AdminError, AdminRequest, MAX_LINE};
use scheduler_core::protocol::cluster::CoordinatorToWorker;
use scheduler_core::quota::QueueableQuota;
use serde_json::Value;
use std::path::Path;

/// One admin request, off the actors' thread (the client blocks).
async fn admin(socket: &Path, request: AdminRequest) -> Result<Value, AdminError> {
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || admin::call(&socket, &request))
        .await
        .unwrap()
}

async fn granted_on(w: &mut TestWorker) -> String {
    match w
        .expect("grant", |m| {
            matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
        })
        .await
    {
        CoordinatorToWorker::GuaranteedAllocated(g) => g.containers[0].node_id.to_string(),
        _ => unreachable!(),
    }
}

#[actix_rt::test]
async fn drain_apps_and_shedding_change_live_over_the_admin_socket() {
    let h = Harness::start().await;
    let socket = h.server.admin_socket.clone();
    assert_eq!(socket, h.dir.path().join("admin.sock"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "owner only");

    // Two nodes of room for one 1000m container each.
    let (mut a, _) = h.join("node-a", 1000, 8192).await;
    let (mut b, _) = h.join("node-b", 1000, 8192).await;
    for (w, name) in [(&mut a, "node-a"), (&mut b, "node-b")] {
        w.send(&heartbeat(name, 0, 10.0, vec![], vec![], vec![]))
            .await;
        w.expect_ack().await;
    }
    let status = admin(&socket, AdminRequest::Status).await.unwrap();
    assert_eq!(status["nodes"], 2, "{status}");
    assert_eq!(status["capacity"]["cpu_millis"], 2000, "{status}");

    // Drain b: GUARANTEED work goes to a only (a second container waits), b leaves the top-k
    // views.
    let drained = admin(
        &socket,
        AdminRequest::Drain {
            node: "node-b".into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(drained["changed"], true);
    a.send(&allocate_guaranteed(1, "demo", 1000, 1024, 1)).await;
    assert_eq!(granted_on(&mut a).await, "node-a");
    a.send(&allocate_guaranteed(2, "demo", 1000, 1024, 1)).await;
    // A heartbeat's ack comes after the coordinator has handed the ask to the guarantor.
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    let waiting = admin(&socket, AdminRequest::Waiting).await.unwrap();
    assert_eq!(waiting["pending_containers"], 1, "{waiting}");
    h.clock.advance(std::time::Duration::from_secs(5));
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    let ack = a.expect_ack().await;
    // The top-k names nodes by slot; a heartbeat at version 0 gets the whole directory.
    let top: Vec<String> = ack
        .view
        .top_k_slots
        .iter()
        .map(|l| {
            ack.view
                .directory
                .iter()
                .find(|d| d.slot == l.slot)
                .map_or(format!("slot {}", l.slot), |d| d.node_id.to_string())
        })
        .collect();
    assert_eq!(top, vec!["node-a".to_string()], "{top:?}");
    let nodes = admin(&socket, AdminRequest::Nodes).await.unwrap();
    let b_row = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "node-b")
        .unwrap();
    assert_eq!(
        (b_row["draining"].clone(), b_row["drained"].clone()),
        (true.into(), true.into())
    );
    // Undrained: the waiting container goes to b at once.
    admin(
        &socket,
        AdminRequest::Undrain {
            node: "node-b".into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(granted_on(&mut a).await, "node-b");
    let err = admin(
        &socket,
        AdminRequest::Drain {
            node: "node-z".into(),
        },
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("no joined node named \"node-z\""),
        "{err}"
    );

    // Apps live: add, quota, list, remove; workers get each new registry with their next ack.
    let added = admin(
        &socket,
        AdminRequest::AppAdd {
            app_id: "etl".into(),
            quota: QueueableQuota::default(),
        },
    )
    .await
    .unwrap();
    assert_eq!(added["app_id"], "etl");
    assert_eq!(added["app_secret"].as_str().unwrap().len(), 64);
    let quota = QueueableQuota {
        max_queueable: Some(7),
        max_queueable_per_guaranteed: None,
    };
    admin(
        &socket,
        AdminRequest::AppQuota {
            app_id: "etl".into(),
            quota,
        },
    )
    .await
    .unwrap();
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    let registry = a.expect_ack().await.apps.expect("a new registry");
    let etl = registry.iter().find(|r| r.app_id == "etl").unwrap();
    assert_eq!(etl.quota, quota);
    let apps = admin(&socket, AdminRequest::Apps).await.unwrap();
    assert_eq!(apps.as_array().unwrap().len(), 2, "{apps}");
    admin(
        &socket,
        AdminRequest::AppRemove {
            app_id: "etl".into(),
        },
    )
    .await
    .unwrap();
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    let registry = a.expect_ack().await.apps.expect("a new registry");
    assert!(registry.iter().all(|r| r.app_id != "etl"));
    let err = admin(
        &socket,
        AdminRequest::AppRemove {
            app_id: "etl".into(),
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("no app named"), "{err}");

    // Shedding off, live: the next round has no threshold.
    admin(
        &socket,
        AdminRequest::Shedding {
            policy: "off".into(),
        },
    )
    .await
    .unwrap();
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    assert_eq!(a.expect_ack().await.shedding_threshold_ms, None);
    let err = admin(
        &socket,
        AdminRequest::Shedding {
            policy: "sometimes".into(),
        },
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("bad shedding policy"), "{err}");

    // Top-k live: every worker's next ack carries the new k once; the views follow it.
    let ack = {
        admin(&socket, AdminRequest::TopK { k: 1 }).await.unwrap();
        a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
            .await;
        a.expect_ack().await
    };
    assert_eq!(ack.top_k, Some(1));
    assert!(ack.view.top_k_slots.len() <= scheduler_core::distributed::view_size(1));
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    assert_eq!(a.expect_ack().await.top_k, None, "sent once");
    b.send(&heartbeat("node-b", 0, 10.0, vec![], vec![], vec![]))
        .await;
    assert_eq!(b.expect_ack().await.top_k, Some(1), "to every worker");
    let err = admin(&socket, AdminRequest::TopK { k: 0 })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("between 1 and 10000"), "{err}");

    // A waiting ask explains itself.
    a.send(&allocate_guaranteed(3, "demo", 1000, 1024, 1)).await;
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    let waiting = admin(&socket, AdminRequest::Waiting).await.unwrap();
    assert_eq!(waiting["pending_containers"], 1, "{waiting}");
    let job = waiting["waiting"][0]["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    let explained = admin(&socket, AdminRequest::Explain { job }).await.unwrap();
    assert!(
        explained["waiting"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("no node has"),
        "{explained}"
    );
}

#[actix_rt::test]
async fn bad_admin_requests_get_a_clear_error_and_long_lines_are_cut() {
    use std::io::{BufRead, BufReader, Write};
    let h = Harness::start().await;
    let socket = h.server.admin_socket.clone();
    let replies = tokio::task::spawn_blocking(move || {
        let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let mut lines = BufReader::new(s.try_clone().unwrap());
        let mut ask = |bytes: &[u8]| {
            s.write_all(bytes).unwrap();
            let mut reply = String::new();
            lines.read_line(&mut reply).unwrap();
            reply
        };
        let unknown = ask(b"{\"cmd\":\"reboot\"}\n");
        let not_json = ask(b"status please\n");
        let missing = ask(b"{\"cmd\":\"drain\"}\n");
        let ok = ask(b"{\"cmd\":\"status\"}\n");
        let mut long = vec![b'x'; MAX_LINE + 10];
        long.push(b'\n');
        let too_long = ask(&long);
        (unknown, not_json, missing, ok, too_long)
    })
    .await
    .unwrap();
    let (unknown, not_json, missing, ok, too_long) = replies;
    assert!(unknown.contains("unknown variant `reboot`"), "{unknown}");
    assert!(not_json.contains("bad request"), "{not_json}");
    assert!(missing.contains("missing field `node`"), "{missing}");
    assert!(ok.contains("\"ok\":true"), "{ok}");
    assert!(too_long.contains("request longer than"), "{too_long}");
}

/// `coordinator reservations submit`: signed-off contracts become recurring reservations of a
/// registered app (a second submit updates them), contracts without sign-off or for an unknown
/// app are not reserved, each with its reason.
#[actix_rt::test]
async fn the_operator_submits_signed_off_contracts_as_reservations_of_an_app() {
    use coordinator::operator_cli::{self, AdminArgs, OperatorCommand, ReservationsCommand};
    use inference::slo::{ContractStatus, SloContract, SloRule};

    let h = Harness::start().await;
    let socket = h.server.admin_socket.clone();
    let (mut a, _) = h.join("node-a", 8000, 8192).await;
    a.send(&heartbeat("node-a", 0, 10.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    admin(
        &socket,
        AdminRequest::AppAdd {
            app_id: "etl".into(),
            quota: QueueableQuota::default(),
        },
    )
    .await
    .unwrap();

    let contract = |job: &str, status| SloContract {
        job: job.into(),
        period: 86_400.0,
        earliest_start: 3_600.0,
        deadline: 7_200.0,
        skyline: Some(vec![2, 2, 4, 4, 1]),
        status,
        start_rule: SloRule::SubmitPercentile,
        deadline_rule: SloRule::EndPercentileFallback,
        overridden: vec![],
    };
    let file = h.dir.path().join("contracts.json");
    std::fs::write(
        &file,
        serde_json::to_string(&vec![
            contract("nightly etl", ContractStatus::SignedOff),
            contract("hourly report", ContractStatus::Proposed),
        ])
        .unwrap(),
    )
    .unwrap();
    let submit = |app: &str| {
        let (socket, file, app) = (socket.clone(), file.clone(), app.to_string());
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            operator_cli::run(
                OperatorCommand::Reservations {
                    command: ReservationsCommand::Submit {
                        contracts: file,
                        app,
                        container_cpu_millis: 1000,
                        container_memory_mib: 1024,
                        skyline_step_ms: 60_000,
                        admin: AdminArgs {
                            data_dir: None,
                            admin_socket: Some(socket),
                            json: true,
                        },
                    },
                },
                &mut out,
            )
            .unwrap();
            serde_json::from_slice::<Value>(&out).unwrap()
        })
    };

    let first = submit("etl").await.unwrap();
    let results = first["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{first}");
    assert_eq!(results[0]["accepted"], true, "{first}");
    assert_eq!(results[0]["op"], "reserve", "{first}");
    assert_eq!(results[0]["reservation_id"], "nightly-etl", "{first}");
    assert!(!results[0]["allocation"].as_array().unwrap().is_empty());
    assert_eq!(results[1]["accepted"], false, "{first}");
    assert!(
        results[1]["reason"]
            .as_str()
            .unwrap()
            .contains("not signed off"),
        "{first}"
    );

    let listed = admin(&socket, AdminRequest::Reservations).await.unwrap();
    assert_eq!(listed["reservations_total"], 1, "{listed}");
    assert!(listed.to_string().contains("nightly-etl"), "{listed}");

    let again = submit("etl").await.unwrap();
    assert_eq!(again["results"][0]["op"], "update_reservation", "{again}");
    let listed = admin(&socket, AdminRequest::Reservations).await.unwrap();
    assert_eq!(listed["reservations_total"], 1, "{listed}");

    let unknown = submit("nobody").await.unwrap();
    assert_eq!(unknown["results"][0]["accepted"], false, "{unknown}");
    assert!(
        unknown["results"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("not a registered app"),
        "{unknown}"
    );
}

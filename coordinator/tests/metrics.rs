//! `GET /metrics` over a real TCP socket: a coordinator with two workers (one booked, one lost)
//! exports the counts and per-node gauges its actors keep.

mod common;

use common::*;
use coordinator::coordinator_actor::{Inspect, Tick};
use coordinator::guarantor_actor::InspectGuarantor;
use scheduler_core::node::Placement;
use scheduler_core::protocol::cluster::CoordinatorToWorker;
use scheduler_core::{ContainerId, ContainerType};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request (`method path`, no body); the whole response.
async fn request(addr: SocketAddr, method: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    raw
}

/// `GET path`; the status line and the body.
async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let raw = request(addr, "GET", path).await;
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// One GUARANTEED container of 1000 millicores / 1024 MiB granted through `w`.
async fn book_one_guaranteed(w: &mut TestWorker) {
    w.send(&allocate_guaranteed(7, "demo", 1000, 1024, 1)).await;
    w.expect("grant", |m| {
        matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
    })
    .await;
}

/// The value of the sample `series` (name with its labels, exactly as exposed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[actix_rt::test]
async fn metrics_count_joins_heartbeats_losses_and_bookings() {
    let h = Harness::start_with(|s| s.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let addr = h.server.metrics_addr.expect("metrics are listening");

    let (mut a, _) = h.join("node-a", 4000, 8192).await;
    a.send(&heartbeat("node-a", 0, 250.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    // One GUARANTEED container booked on node-a (the only node yet).
    book_one_guaranteed(&mut a).await;
    h.server.guarantor.send(InspectGuarantor).await.unwrap();

    // node-b joins, heartbeats once, then falls silent and is lost at the next sweep past the
    // node timeout (before its first heartbeat it would still be receiving its join answer).
    let (mut b, _) = h.join("node-b", 2000, 2048).await;
    b.send(&heartbeat("node-b", 0, 0.0, vec![], vec![], vec![]))
        .await;
    b.expect_ack().await;
    h.clock.advance(Duration::from_secs(11));
    a.send(&heartbeat("node-a", 0, 250.0, vec![], vec![], vec![]))
        .await;
    a.expect_ack().await;
    h.server.coordinator.send(Tick).await.unwrap();
    b.expect_closed().await;
    h.server.coordinator.send(Inspect).await.unwrap();
    h.server.guarantor.send(InspectGuarantor).await.unwrap();

    let (status, text) = get(addr, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    let v = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("{series} in\n{text}"));
    assert_eq!(v("coordinator_nodes_joined_total"), 2.0);
    assert_eq!(v("coordinator_nodes_lost_total"), 1.0);
    assert_eq!(v("coordinator_heartbeats_total"), 3.0);
    assert_eq!(v("coordinator_promotions_total"), 0.0);
    assert!(v("coordinator_shedding_threshold_ms") >= 0.0);
    assert_eq!(
        v(r#"coordinator_node_queue_delay_ms{node="node-a"}"#),
        250.0
    );
    // The test heartbeats report no containers.
    assert_eq!(v(r#"coordinator_node_queued{node="node-a"}"#), 0.0);
    assert_eq!(v(r#"coordinator_node_running{node="node-a"}"#), 0.0);
    let a_cpu = r#"{node="node-a",resource="cpu_millis"}"#;
    let a_mem = r#"{node="node-a",resource="memory_mib"}"#;
    assert_eq!(v(&format!("coordinator_node_capacity{a_cpu}")), 4000.0);
    assert_eq!(v(&format!("coordinator_node_capacity{a_mem}")), 8192.0);
    assert_eq!(v(&format!("coordinator_guaranteed_booked{a_cpu}")), 1000.0);
    assert_eq!(v(&format!("coordinator_guaranteed_booked{a_mem}")), 1024.0);
    assert_eq!(v(&format!("coordinator_policing_limit{a_cpu}")), 3000.0);
    assert_eq!(v(&format!("coordinator_policing_limit{a_mem}")), 7168.0);
    // The one GUARANTEED ask's time in the coordinator, decoded to granted.
    assert_eq!(v("coordinator_guaranteed_grant_seconds_count"), 1.0);
    assert!(v("coordinator_guaranteed_grant_seconds_sum") > 0.0);
    assert_eq!(
        v(r#"coordinator_guaranteed_grant_seconds_bucket{le="+Inf"}"#),
        1.0
    );
    // The reservation plan follows the nodes; nothing is reserved.
    assert_eq!(v("coordinator_reservations"), 0.0);
    assert_eq!(
        v(r#"coordinator_plan_capacity{resource="cpu_millis"}"#),
        4000.0
    );
    assert_eq!(
        v(r#"coordinator_plan_reserved{resource="cpu_millis"}"#),
        0.0
    );
    assert!(
        !text.contains("node-b"),
        "a lost node's series are dropped:\n{text}"
    );
    assert!(
        text.contains("# TYPE coordinator_heartbeats counter"),
        "{text}"
    );

    let (status, _) = get(addr, "/nothing-here").await;
    assert!(status.contains("404"), "{status}");
}

/// The dashboard on the same port: the page and its assets come from the binary, and
/// `/api/state` carries what the actors published at their tick (only once someone watched).
#[actix_rt::test]
async fn dashboard_state_shows_nodes_containers_bookings_and_waiting_asks() {
    let h = Harness::start_with(|s| s.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let addr = h.server.metrics_addr.expect("metrics are listening");
    for (path, kind) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/style.css", "text/css"),
    ] {
        let raw = request(addr, "GET", path).await;
        assert!(raw.starts_with("HTTP/1.1 200"), "{path}: {raw}");
        assert!(
            raw.to_lowercase()
                .contains(&format!("content-type: {kind}")),
            "{path}: {raw}"
        );
        assert!(
            raw.to_lowercase()
                .contains("content-security-policy: default-src 'self'"),
            "{raw}"
        );
    }

    let (mut a, accepted) = h.join("node-a", 4000, 8192).await;
    let q = ContainerId::new(accepted.issuer, 1);
    let mut queued = running(
        ContainerId::new(accepted.issuer, 2),
        ContainerType::Queueable,
        500,
        512,
    );
    queued.placement = Placement::Queued;
    a.send(&heartbeat(
        "node-a",
        0,
        120.0,
        vec![running(q, ContainerType::Queueable, 1000, 1024), queued],
        vec![q],
        vec![],
    ))
    .await;
    a.expect_ack().await;
    // One GUARANTEED container booked, and an ask no node can hold waits.
    book_one_guaranteed(&mut a).await;
    a.send(&allocate_guaranteed(8, "demo", 3500, 1024, 2)).await;

    // Nobody has watched yet: the tick publishes nothing.
    h.server.coordinator.send(Tick).await.unwrap();
    h.server.guarantor.send(InspectGuarantor).await.unwrap();
    let (_, body) = get(addr, "/api/state").await;
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        state["cluster"]["nodes"].as_array().unwrap().len(),
        0,
        "{state}"
    );
    // Now someone has: the next tick publishes both parts.
    h.server.coordinator.send(Tick).await.unwrap();
    h.server.guarantor.send(InspectGuarantor).await.unwrap();
    let (status, body) = get(addr, "/api/state").await;
    assert!(status.contains("200"), "{status}");
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    let node = &state["cluster"]["nodes"][0];
    assert_eq!(node["node_id"], "node-a", "{state}");
    assert_eq!(node["capacity"]["cpu_millis"], 4000);
    assert_eq!(node["queue_delay_ms"], 120.0);
    assert_eq!(node["running_queueable"], 1);
    assert_eq!(node["queued"], 1);
    assert_eq!(node["containers_total"], 2);
    assert_eq!(node["containers"][0]["state"], "running");
    assert_eq!(node["containers"][1]["state"], "queued");
    assert_eq!(state["cluster"]["apps"][0]["app_id"], "demo");
    assert_eq!(state["cluster"]["apps"][0]["running_queueable"], 1);
    let g = &state["guarantor"];
    assert_eq!(
        g["bookings"][0]["guaranteed_booked"]["cpu_millis"], 1000,
        "{g}"
    );
    assert_eq!(
        g["bookings"][0]["queueable_limit"]["cpu_millis"], 3000,
        "{g}"
    );
    assert_eq!(g["pending_containers"], 2, "{g}");
    let why = g["waiting"][0]["reason"].as_str().unwrap();
    assert!(why.contains("no node has"), "{why}");
    assert_eq!(g["agenda_horizon_ms"], 86_400_000u64);

    // Only GET.
    let raw = request(addr, "POST", "/api/state").await;
    assert!(raw.starts_with("HTTP/1.1 405"), "{raw}");
}

#[actix_rt::test]
async fn metrics_are_off_by_default_and_a_taken_port_is_named() {
    let h = Harness::start().await;
    assert_eq!(h.server.metrics_addr, None);

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings(dir.path());
    settings.metrics_listen = Some(port);
    let err = match coordinator::start(settings, h.clock.clone()).await {
        Ok(_) => panic!("started on a taken metrics port"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("metrics_listen"), "{err}");
}

/// Idle connections cannot pile up on the metrics port: past MAX_METRICS_CONNECTIONS the next
/// one is closed unanswered, and scrapes work again once the idle ones go.
#[actix_rt::test]
async fn metrics_connections_are_bounded() {
    use coordinator::metrics::MAX_METRICS_CONNECTIONS;
    let h = Harness::start_with(|s| s.metrics_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let addr = h.server.metrics_addr.expect("metrics are listening");
    let mut idle = Vec::new();
    for _ in 0..MAX_METRICS_CONNECTIONS {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Accepted in order after the idle ones: refused, so the server closes it without a word.
    let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = extra
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), extra.read_to_end(&mut raw))
        .await
        .expect("the refused connection is closed, not left hanging");
    assert!(raw.is_empty(), "{}", String::from_utf8_lossy(&raw));
    drop(idle);
    // The server sees the idle ones close and frees their places (bounded, paced retries).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            .await;
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw).await;
        if raw.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "scrapes never resumed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

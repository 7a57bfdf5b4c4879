//! `GET /metrics` of a real worker over a real TCP socket: allocations by type with their
//! latency, token refusals by reason, kills by reason and the node's containers by type and
//! state, after a little work on a one-node cluster.

mod common;

use common::*;
use scheduler_core::protocol::app::{AppResponse, ContainerEventKind};
use scheduler_core::{ContainerType, KillReason, Resources};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request; the status line and the body.
async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `series` (name with its labels, exactly as exposed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[actix_rt::test]
async fn worker_metrics_count_allocations_refusals_kills_and_containers() {
    let c = Cluster::start(&["demo"], &[node("node-a", 2000, 2048)]).await;
    let addr = c.worker("node-a").metrics_addr.expect("metrics listening");

    // Two QUEUEABLE containers running, one of them started after two refused starts.
    let (mut app, first) = start_sleeper(&c, "node-a").await;
    let token = app
        .grant(ask_on(ContainerType::Queueable, 500, 256, "node-a"))
        .await;
    let mut forged = token.clone();
    forged.body.resources = Resources::new(1999, 256);
    app.start(&forged, sh("exec sleep 30"))
        .await
        .expect_err("a forged token is refused");
    app.start(&token, sh("exec sleep 30"))
        .await
        .expect("the genuine token starts");
    app.start(&token, sh("exec sleep 30"))
        .await
        .expect_err("a used token is refused");
    // One GUARANTEED grant (not started).
    app.grant(ask(ContainerType::Guaranteed, 500, 256)).await;
    // The first container released: killed for that reason.
    assert!(matches!(app.release(first).await, AppResponse::Ack(_)));
    app.event("killed event", |e| {
        e.container_id == first
            && matches!(
                e.event,
                ContainerEventKind::Killed {
                    reason: KillReason::Released,
                    ..
                }
            )
    })
    .await;

    // The container gauges follow the heartbeats: wait (bounded, paced) for the state.
    let running = r#"worker_containers{type="queueable",state="running"}"#;
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    let text = loop {
        let (status, text) = get(addr, "/metrics").await;
        assert!(status.contains("200"), "{status}");
        if sample(&text, running) == Some(1.0)
            && sample(&text, r#"worker_kills_total{reason="released"}"#) == Some(1.0)
        {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed the state:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let v = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("{series} in\n{text}"));
    assert_eq!(v(r#"worker_allocations_total{type="queueable"}"#), 2.0);
    assert_eq!(v(r#"worker_allocations_total{type="guaranteed"}"#), 1.0);
    assert_eq!(
        v(r#"worker_allocation_latency_seconds_count{type="queueable"}"#),
        2.0
    );
    assert_eq!(
        v(r#"worker_allocation_latency_seconds_count{type="guaranteed"}"#),
        1.0
    );
    assert_eq!(v(r#"worker_token_refusals_total{reason="forged"}"#), 1.0);
    assert_eq!(v(r#"worker_token_refusals_total{reason="replayed"}"#), 1.0);
    assert_eq!(
        v(r#"worker_containers{type="guaranteed",state="running"}"#),
        0.0
    );
    assert_eq!(
        v(r#"worker_containers{type="queueable",state="queued"}"#),
        0.0
    );
    assert_eq!(v("worker_queue_length"), 0.0);
    assert!(v("worker_queue_delay_ms") >= 0.0);
    assert_eq!(v(r#"worker_token_refusals_total{reason="expired"}"#), 0.0);
    assert_eq!(v(r#"worker_kills_total{reason="shed"}"#), 0.0);
    assert_eq!(v("worker_sheds_total"), 0.0);
    assert_eq!(v("worker_preemptions_total"), 0.0);
    assert!(
        text.contains("# TYPE worker_allocation_latency_seconds histogram"),
        "{text}"
    );

    let (status, _) = get(addr, "/nope").await;
    assert!(status.contains("404"), "{status}");
    c.stop().await;
}

#[test]
fn metrics_listen_is_off_by_default_and_read_from_flags_or_the_toml_file() {
    use worker::config::RunArgs;
    let args = || RunArgs {
        coordinator: Some("127.0.0.1:9".into()),
        ca_cert: Some("/nonexistent/ca.pem".into()),
        join_token: Some("t".into()),
        node_id: Some("n".into()),
        state_dir: Some("/srv/worker-state".into()),
        ..Default::default()
    };
    assert_eq!(args().resolve().unwrap().metrics_listen, None);
    let flag: SocketAddr = "127.0.0.1:9401".parse().unwrap();
    let c = RunArgs {
        metrics_listen: Some(flag),
        ..args()
    };
    assert_eq!(c.resolve().unwrap().metrics_listen, Some(flag));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker.toml");
    std::fs::write(&file, "metrics_listen = \"0.0.0.0:9402\"\n").unwrap();
    let c = RunArgs {
        config: Some(file.clone()),
        ..args()
    }
    .resolve()
    .unwrap();
    assert_eq!(c.metrics_listen, Some("0.0.0.0:9402".parse().unwrap()));

    std::fs::write(&file, "metrics_listen = \"localhost\"\n").unwrap();
    let e = RunArgs {
        config: Some(file),
        ..args()
    }
    .resolve()
    .expect_err("not an address");
    let e = format!("{e:#}");
    assert!(e.contains("metrics_listen"), "the error names the key: {e}");
}

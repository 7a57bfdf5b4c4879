//! Backpressure on application connections (issue 11): a client that sends without reading is
//! slowed (the worker stops reading it) and, if it does not read its answers for long,
//! disconnected; it is never buffered without limit. Real worker and coordinator over loopback.

mod common;

use common::*;
use scheduler_core::codec::{APP_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, AppRequest, AppResponse, Hello, Locality, Subscribe,
};
use scheduler_core::{ContainerType, Resources};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use worker::config::AppLimits;
use worker::shared::ConnStats;

const NODE_A: NodeSpec = node("node-a", 2000, 2048);

/// A raw connection that said hello and got its welcome.
async fn logged_in(addr: SocketAddr, secret: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let hello = AppRequest::Hello(Hello {
        protocol_version: APP_PROTOCOL_VERSION,
        app_id: "demo".into(),
        app_secret: secret.into(),
        client_name: Some("flood".into()),
    });
    s.write_all(&encode_frame(&hello, APP_MAX_FRAME).unwrap())
        .await
        .unwrap();
    let mut d = FrameDecoder::new(APP_MAX_FRAME);
    let mut buf = vec![0u8; 4096];
    loop {
        if let Some(r) = d.next_message::<AppResponse>().unwrap() {
            assert!(matches!(r, AppResponse::Welcome(_)), "{r:?}");
            return s;
        }
        let n = tokio::time::timeout(FAILURE_TIMEOUT, s.read(&mut buf))
            .await
            .expect("welcome in time")
            .unwrap();
        assert!(n > 0, "closed before the welcome");
        d.push(&buf[..n]);
    }
}

/// Poll the worker's connection counters (paced; the timeout only guards against a hang)
/// until one connection satisfies `cond`.
async fn wait_for_conn(c: &Cluster, what: &str, cond: impl Fn(&ConnStats) -> bool) -> ConnStats {
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    let mut pace = tokio::time::interval(Duration::from_millis(5));
    loop {
        let stats = c.worker("node-a").shared.connection_stats();
        if let Some(s) = stats.iter().find(|s| cond(s)) {
            return *s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {FAILURE_TIMEOUT:?}; connections: {stats:?}"
        );
        pace.tick().await;
    }
}

/// 64 MB of small requests, as one buffer.
fn flood_bytes() -> Vec<u8> {
    let frame = encode_frame(
        &AppRequest::Subscribe(Subscribe { request_id: 1 }),
        APP_MAX_FRAME,
    )
    .unwrap();
    frame.repeat((64 << 20) / frame.len())
}

/// Issue 11: 3 M small requests sent without reading took a worker from 6 to 598 MiB. Now the
/// worker stops reading a connection while 1 MiB of answers waits for its client, so a client
/// writing 64 MB of requests and reading nothing gets stuck in its own write, and what the
/// worker holds for it stays bounded. Others are served meanwhile.
#[actix_rt::test]
async fn a_client_that_sends_without_reading_is_slowed() {
    let limits = AppLimits::default();
    let c = Cluster::start_with_limits(&["demo"], &[NODE_A], limits).await;
    let addr = c.worker("node-a").tcp_addr();
    let mut good = c.client("node-a").await;
    let flood = logged_in(addr, c.secret("demo")).await;
    let (flood_read, mut flood_write) = flood.into_split();
    let requests = flood_bytes();
    let total = requests.len();
    let mut writer = actix_rt::spawn(async move { flood_write.write_all(&requests).await });

    // The worker must stop reading long before 64 MB are read.
    let held = tokio::select! {
        r = &mut writer => panic!(
            "the flooding write ended ({r:?}) while the client read no answer: the worker read all {total} bytes or dropped the connection"
        ),
        s = wait_for_conn(&c, "backpressure on the flooding connection", |s| s.paused) => s,
    };
    assert!(
        held.high_water_bytes <= limits.pause_queued_bytes + 64 * 1024,
        "answers queued for a client that does not read: {held:?}"
    );
    assert!(held.in_flight <= limits.max_in_flight, "{held:?}");
    assert!(!held.closing, "{held:?}");

    // Others are served meanwhile.
    let granted = good
        .allocate(ask(ContainerType::Queueable, 100, 64))
        .await
        .expect("a good client is served while another floods");
    assert_eq!(granted.containers.len(), 1);
    writer.abort();
    drop(flood_read);
    c.stop().await;
}

/// A client that does not take a single byte for `write_stall_timeout` (500 ms here, 30 s by
/// default) is disconnected, and the worker forgets the connection.
#[actix_rt::test]
async fn a_client_that_does_not_read_for_long_is_disconnected() {
    let limits = AppLimits {
        write_stall_timeout: Duration::from_millis(500),
        ..AppLimits::default()
    };
    let c = Cluster::start_with_limits(&["demo"], &[NODE_A], limits).await;
    let addr = c.worker("node-a").tcp_addr();
    let mut good = c.client("node-a").await;
    let flood = logged_in(addr, c.secret("demo")).await;
    let (flood_read, mut flood_write) = flood.into_split();
    let requests = flood_bytes();
    let writer = actix_rt::spawn(async move { flood_write.write_all(&requests).await });
    // The write ends only because the worker closed the connection.
    let written = tokio::time::timeout(FAILURE_TIMEOUT, writer)
        .await
        .expect("the worker disconnects a client that does not read")
        .expect("writer task");
    assert!(
        written.is_err(),
        "the worker read all 64 MB from a client that read nothing"
    );
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    let mut pace = tokio::time::interval(Duration::from_millis(5));
    while c.worker("node-a").shared.connection_stats().len() > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker still holds the connection: {:?}",
            c.worker("node-a").shared.connection_stats()
        );
        pace.tick().await;
    }
    drop(flood_read);
    good.subscribe().await;
    c.stop().await;
}

/// Issue 11: pipelined large allocates (1 000 grants, ≈ 430 kB per answer) were all read and
/// answered into an unbounded queue (1.3 GB), starving heartbeats. Now a request in flight
/// counts with the expected size of its answer (1 KiB per container asked) and reading pauses
/// while queued plus expected answers reach `pause_queued_bytes`, so what waits stays under
/// twice that; a client that reads late still gets every answer, and is not disconnected.
#[actix_rt::test]
async fn pipelined_large_allocates_are_bounded_by_the_in_flight_window() {
    let limits = AppLimits::default();
    let c = Cluster::start_with_limits(&["demo"], &[NODE_A], limits).await;
    let addr = c.worker("node-a").tcp_addr();
    let flood = logged_in(addr, c.secret("demo")).await;
    let (mut rd, mut wr) = flood.into_split();
    let asks = 100u64;
    let mut bytes = Vec::new();
    for id in 1..=asks {
        let mut a = ask(ContainerType::Queueable, 1, 1);
        a.request_id = id;
        a.count = 1000;
        a.locality = Some(Locality {
            nodes: vec!["node-a".into()],
            racks: vec![],
            relax: false,
        });
        bytes.extend(encode_frame(&AppRequest::Allocate(a), APP_MAX_FRAME).unwrap());
    }
    wr.write_all(&bytes).await.unwrap();

    let held = wait_for_conn(&c, "the worker pausing the pipelining connection", |s| {
        s.paused
    })
    .await;
    let bound = 2 * limits.pause_queued_bytes + 64 * 1024;
    assert!(held.high_water_bytes <= bound, "{held:?} (bound {bound})");
    assert!(held.in_flight <= limits.max_in_flight, "{held:?}");

    // Reading late: every ask is answered in full.
    let mut d = FrameDecoder::new(APP_MAX_FRAME);
    let mut buf = vec![0u8; 1 << 20];
    let mut answered = 0u64;
    while answered < asks {
        while let Some(r) = d.next_message::<AppResponse>().unwrap() {
            match r {
                AppResponse::Allocated(a) => {
                    assert_eq!(a.containers.len(), 1000);
                    answered += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if answered == asks {
            break;
        }
        let n = tokio::time::timeout(FAILURE_TIMEOUT, rd.read(&mut buf))
            .await
            .expect("answers keep coming")
            .unwrap();
        assert!(n > 0, "closed after {answered} answers");
        d.push(&buf[..n]);
    }
    let after = c.worker("node-a").shared.connection_stats();
    let s = after
        .iter()
        .find(|s| s.conn == held.conn)
        .expect("still open");
    assert!(s.high_water_bytes <= bound, "{s:?} (bound {bound})");
    assert!(!s.closing, "{s:?}");
    assert_eq!(
        c.inspect("node-a").await.allocated,
        Resources::ZERO,
        "nothing was started"
    );
    drop((rd, wr));
    c.stop().await;
}

/// GUARANTEED asks wait at the coordinator until capacity frees, with state at the worker and
/// the guarantor for each: one app may have at most `MAX_WAITING_GUARANTEED_ASKS_PER_APP`
/// (1 024) waiting through one worker; the next is `quota_exceeded` (retryable). Closing the
/// connection cancels its asks and frees the count.
#[actix_rt::test]
async fn waiting_guaranteed_asks_are_capped_per_app() {
    use scheduler_core::protocol::app::{ErrorCode, Release};
    use scheduler_core::protocol::limits::MAX_WAITING_GUARANTEED_ASKS_PER_APP;
    let c = Cluster::start(&["demo"], &[node("node-a", 1000, 1024)]).await;
    let mut holder = c.client("node-a").await;
    let held = holder
        .grant(ask(ContainerType::Guaranteed, 1000, 1024))
        .await;

    let mut waiter = c.client("node-a").await;
    for _ in 0..MAX_WAITING_GUARANTEED_ASKS_PER_APP {
        let mut a = ask(ContainerType::Guaranteed, 1000, 1024);
        a.request_id = waiter.new_request_id();
        waiter.send(&AppRequest::Allocate(a)).await;
    }
    let e = waiter
        .allocate(ask(ContainerType::Guaranteed, 1000, 1024))
        .await
        .expect_err("one ask over the cap");
    assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e:?}");
    assert!(e.retryable);
    assert!(
        e.message
            .contains("has 1024 GUARANTEED asks waiting for capacity on this worker"),
        "{e:?}"
    );
    let quota_refusals = &c.worker("node-a").shared.metrics.quota_refusals;
    assert_eq!(
        quota_refusals
            .get_or_create(&vec![("type", "guaranteed")])
            .get(),
        1
    );
    assert!(
        waiter
            .unread()
            .iter()
            .all(|r| !matches!(r, AppResponse::Allocated(_))),
        "nothing was granted meanwhile"
    );

    // Closing the connection cancels its asks; the app may ask again, and is granted once
    // the held capacity is released.
    drop(waiter);
    // Once the worker has forgotten the connection its cancels are on the cluster link, ahead
    // of the next ask.
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    let mut pace = tokio::time::interval(Duration::from_millis(5));
    while c.worker("node-a").shared.connection_stats().len() > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed connection lingers"
        );
        pace.tick().await;
    }
    let mut again = c.client("node-a").await;
    let mut a = ask(ContainerType::Guaranteed, 1000, 1024);
    a.request_id = again.new_request_id();
    let id = a.request_id;
    again.send(&AppRequest::Allocate(a)).await;
    let rid = holder.new_request_id();
    holder
        .send(&AppRequest::Release(Release {
            request_id: rid,
            container_id: held.body.container_id,
        }))
        .await;
    assert!(matches!(holder.answer(rid).await, AppResponse::Ack(_)));
    match again.answer(id).await {
        AppResponse::Allocated(a) => assert_eq!(a.containers.len(), 1),
        other => panic!("expected a grant after the release, got {other:?}"),
    }
    c.stop().await;
}

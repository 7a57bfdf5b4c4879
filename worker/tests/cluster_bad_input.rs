//! Bad application input against a real worker joined to a real coordinator over QUIC on
//! loopback: every bad frame gets a clear error (and a close where the protocol says so), and
//! afterwards a good client is still served and a running container is untouched.

mod common;

use common::*;
use scheduler_core::codec::{APP_MAX_FRAME, encode_frame, to_payload};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, AppRequest, AppResponse, ErrorCode, ErrorFrame, Hello, Locality,
    Subscribe,
};
use scheduler_core::{ContainerId, ContainerType, Resources};
use serde::Serialize;

const NODE_A: NodeSpec = node("node-a", 2000, 2048);

/// A cluster of one node running one QUEUEABLE `sleep 30`, and a subscribed good client.
async fn serving_cluster() -> (Cluster, AppClient, ContainerId) {
    let c = Cluster::start(&["demo"], &[NODE_A]).await;
    let (good, id) = start_sleeper(&c, "node-a").await;
    (c, good, id)
}

/// [`common::assert_still_serving`] for the one-container setup above.
async fn assert_still_serving(c: &Cluster, good: &mut AppClient, running: ContainerId) {
    common::assert_still_serving(c, good, "node-a", running, 1).await;
    assert_eq!(
        c.inspect("node-a").await.allocated,
        Resources::new(500, 256)
    );
}

fn assert_error(e: &ErrorFrame, code: ErrorCode, request_id: Option<u64>, needle: &str) {
    assert_eq!(e.code, code, "{e:?}");
    assert_eq!(e.request_id, request_id, "{e:?}");
    assert_eq!(e.retryable, code.retryable(), "{e:?}");
    assert!(
        e.message.contains(needle),
        "error message {:?} should contain {needle:?}",
        e.message
    );
}

fn hello(version: u32, app: &str, secret: &str) -> AppRequest {
    AppRequest::Hello(Hello {
        protocol_version: version,
        app_id: app.into(),
        app_secret: secret.into(),
        client_name: None,
    })
}

/// A frame of a type the protocol does not have.
#[derive(Serialize)]
struct Frobnicate {
    #[serde(rename = "type")]
    kind: &'static str,
    request_id: u64,
}

#[actix_rt::test]
async fn hello_errors_are_named_then_the_connection_closes() {
    let (c, mut good, running) = serving_cluster().await;
    let addr = c.worker("node-a").tcp_addr();
    let secret = c.secret("demo").to_string();

    let mut conn = AppClient::connect(addr).await;
    conn.send(&hello(APP_PROTOCOL_VERSION + 98, "demo", &secret))
        .await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::VersionMismatch,
        None,
        &format!(
            "protocol version {} is not supported; this worker speaks version {APP_PROTOCOL_VERSION}",
            APP_PROTOCOL_VERSION + 98
        ),
    );
    assert_still_serving(&c, &mut good, running).await;

    let mut conn = AppClient::connect(addr).await;
    conn.send(&hello(APP_PROTOCOL_VERSION, "demo", "not-the-secret"))
        .await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::BadCredentials,
        None,
        "unknown app \"demo\" or wrong secret",
    );
    assert_still_serving(&c, &mut good, running).await;

    // An unknown app is refused the same way (no hint which part was wrong).
    let mut conn = AppClient::connect(addr).await;
    conn.send(&hello(APP_PROTOCOL_VERSION, "nobody", &secret))
        .await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::BadCredentials,
        None,
        "unknown app \"nobody\" or wrong secret",
    );

    // A known request before the hello.
    let mut conn = AppClient::connect(addr).await;
    conn.send(&AppRequest::Subscribe(Subscribe { request_id: 7 }))
        .await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::HelloRequired,
        Some(7),
        "the first frame must be a hello",
    );
    assert_still_serving(&c, &mut good, running).await;

    // A hello with a field missing.
    #[derive(Serialize)]
    struct HelloWithoutSecret {
        #[serde(rename = "type")]
        kind: &'static str,
        protocol_version: u32,
        app_id: &'static str,
    }
    let mut conn = AppClient::connect(addr).await;
    conn.send_value(&HelloWithoutSecret {
        kind: "hello",
        protocol_version: APP_PROTOCOL_VERSION,
        app_id: "demo",
    })
    .await;
    let e = conn.error_then_close().await;
    assert_error(&e, ErrorCode::InvalidRequest, None, "bad `hello` frame");
    assert!(e.message.contains("app_secret"), "{e:?}");

    // An unknown type before the hello: named, and the connection closes (no hello yet).
    let mut conn = AppClient::connect(addr).await;
    conn.send_value(&Frobnicate {
        kind: "frobnicate",
        request_id: 3,
    })
    .await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::UnknownMessage,
        Some(3),
        "unknown message type \"frobnicate\"",
    );

    // A second hello on a welcomed connection is refused but the session goes on.
    good.send(&hello(APP_PROTOCOL_VERSION, "demo", &secret))
        .await;
    let e = match good
        .wait_for(
            "the error for the second hello",
            |r| matches!(r, AppResponse::Error(e) if e.request_id.is_none()),
        )
        .await
    {
        AppResponse::Error(e) => e,
        _ => unreachable!(),
    };
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        None,
        "hello was already accepted on this connection",
    );
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

#[actix_rt::test]
async fn malformed_msgpack_gets_malformed_frame_then_close() {
    let (c, mut good, running) = serving_cluster().await;
    let addr = c.worker("node-a").tcp_addr();

    // 0xc1 is never valid msgpack.
    let mut conn = c.client("node-a").await;
    conn.send_bytes(&raw_frame(&[0xc1])).await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::MalformedFrame,
        None,
        "frame is not a msgpack map with a string `type`",
    );
    assert_still_serving(&c, &mut good, running).await;

    // Valid msgpack that is not a map (the integer 5), as the very first frame.
    let mut conn = AppClient::connect(addr).await;
    conn.send_bytes(&raw_frame(&[0x05])).await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::MalformedFrame,
        None,
        "frame is not a msgpack map with a string `type`",
    );

    // A map whose `type` is not a string.
    #[derive(Serialize)]
    struct NumericType {
        #[serde(rename = "type")]
        kind: u32,
        request_id: u64,
    }
    let mut conn = c.client("node-a").await;
    conn.send_value(&NumericType {
        kind: 4,
        request_id: 9,
    })
    .await;
    let e = conn.error_then_close().await;
    assert_eq!(e.code, ErrorCode::MalformedFrame, "{e:?}");

    // A map cut short inside (declares 3 entries, holds 1).
    let mut payload = vec![0x83];
    payload.extend(to_payload(&"type").unwrap());
    payload.extend(to_payload(&"subscribe").unwrap());
    let mut conn = c.client("node-a").await;
    conn.send_bytes(&raw_frame(&payload)).await;
    let e = conn.error_then_close().await;
    assert_eq!(e.code, ErrorCode::MalformedFrame, "{e:?}");

    // A well-formed hello followed by one more byte in the same frame.
    let mut payload = to_payload(&hello(APP_PROTOCOL_VERSION, "demo", "secret-demo")).unwrap();
    payload.push(0xc0);
    let mut conn = AppClient::connect(addr).await;
    conn.send_bytes(&raw_frame(&payload)).await;
    let e = conn.error_then_close().await;
    assert_error(&e, ErrorCode::MalformedFrame, None, "1 trailing bytes");

    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

#[actix_rt::test]
async fn frames_up_to_the_limit_are_read_and_larger_ones_refused_before_their_body() {
    let (c, mut good, running) = serving_cluster().await;

    // A subscribe padded to exactly the limit is an ordinary frame (unknown fields are ignored).
    #[derive(Serialize)]
    struct PaddedSubscribe {
        #[serde(rename = "type")]
        kind: &'static str,
        request_id: u64,
        pad: String,
    }
    let mut frame = PaddedSubscribe {
        kind: "subscribe",
        request_id: 77,
        pad: "x".repeat(100_000),
    };
    let size = to_payload(&frame).unwrap().len();
    frame.pad = "x".repeat(100_000 + APP_MAX_FRAME - size);
    assert_eq!(to_payload(&frame).unwrap().len(), APP_MAX_FRAME);
    let mut conn = c.client("node-a").await;
    conn.send_value(&frame).await;
    match conn.answer(77).await {
        AppResponse::Ack(a) => assert_eq!(a.request_id, 77),
        other => panic!("a frame of exactly the limit should be served, got {other:?}"),
    }

    // One byte over: refused as soon as the length prefix arrives (no body is sent at all).
    conn.send_bytes(&((APP_MAX_FRAME as u32 + 1).to_be_bytes()))
        .await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::FrameTooLarge,
        None,
        &format!(
            "frame of {} bytes exceeds the limit of {APP_MAX_FRAME} bytes",
            APP_MAX_FRAME + 1
        ),
    );
    assert_still_serving(&c, &mut good, running).await;

    // The largest length a prefix can announce, before any hello.
    let mut conn = AppClient::connect(c.worker("node-a").tcp_addr()).await;
    conn.send_bytes(&u32::MAX.to_be_bytes()).await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::FrameTooLarge,
        None,
        &format!("frame of {} bytes exceeds the limit", u32::MAX),
    );
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

#[actix_rt::test]
async fn truncated_frames_end_only_their_own_connection() {
    let (c, mut good, running) = serving_cluster().await;
    let addr = c.worker("node-a").tcp_addr();

    // A frame announced as 50 bytes, 10 sent, then end of stream: nothing to answer.
    let mut conn = c.client("node-a").await;
    let mut partial = 50u32.to_be_bytes().to_vec();
    partial.extend_from_slice(&[0x85; 10]);
    conn.send_bytes(&partial).await;
    conn.shutdown_write().await;
    conn.expect_closed().await;
    assert_still_serving(&c, &mut good, running).await;

    // Cut inside the length prefix, before any hello.
    let mut conn = AppClient::connect(addr).await;
    conn.send_bytes(&[0, 0]).await;
    conn.shutdown_write().await;
    conn.expect_closed().await;

    // A connection stuck in the middle of a frame (no end of stream) blocks nobody else.
    let mut stuck = c.client("node-a").await;
    stuck.send_bytes(&partial).await;
    assert_still_serving(&c, &mut good, running).await;
    let mut other = c.client("node-a").await;
    other.subscribe().await;
    drop(stuck);
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

#[actix_rt::test]
async fn unknown_message_is_named_and_the_connection_stays_usable() {
    let (c, mut good, running) = serving_cluster().await;
    let mut conn = c.client("node-a").await;
    conn.send_value(&Frobnicate {
        kind: "frobnicate",
        request_id: 41,
    })
    .await;
    let e = conn.error_for(41).await;
    assert_error(
        &e,
        ErrorCode::UnknownMessage,
        Some(41),
        "unknown message type \"frobnicate\"; known types: hello, allocate, release, promote, start_container, stop_container, subscribe",
    );
    // Same connection, next request.
    conn.subscribe().await;
    let granted = conn
        .allocate(ask(ContainerType::Queueable, 100, 64))
        .await
        .expect("allocate after an unknown message");
    assert_eq!(granted.containers.len(), 1);
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

#[actix_rt::test]
async fn bad_fields_of_a_known_type_get_invalid_request() {
    let (c, mut good, running) = serving_cluster().await;
    let mut conn = c.client("node-a").await;

    #[derive(Serialize)]
    struct AllocateWithoutCount {
        #[serde(rename = "type")]
        kind: &'static str,
        request_id: u64,
        resources: Resources,
        container_type: &'static str,
        job_id: &'static str,
        job_submit_time_ms: u64,
    }
    conn.send_value(&AllocateWithoutCount {
        kind: "allocate",
        request_id: 51,
        resources: Resources::new(100, 64),
        container_type: "QUEUEABLE",
        job_id: "j",
        job_submit_time_ms: SUBMIT_MS,
    })
    .await;
    let e = conn.error_for(51).await;
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        Some(51),
        "bad `allocate` frame",
    );
    assert!(e.message.contains("count"), "{e:?}");

    #[derive(Serialize)]
    struct AllocateBadType {
        #[serde(rename = "type")]
        kind: &'static str,
        request_id: u64,
        resources: Resources,
        count: u32,
        container_type: &'static str,
        job_id: &'static str,
        job_submit_time_ms: u64,
    }
    conn.send_value(&AllocateBadType {
        kind: "allocate",
        request_id: 52,
        resources: Resources::new(100, 64),
        count: 1,
        container_type: "SOMETIMES",
        job_id: "j",
        job_submit_time_ms: SUBMIT_MS,
    })
    .await;
    let e = conn.error_for(52).await;
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        Some(52),
        "bad `allocate` frame",
    );
    assert!(e.message.contains("SOMETIMES"), "{e:?}");

    // Well-formed but empty asks, of both types.
    for t in [ContainerType::Queueable, ContainerType::Guaranteed] {
        let mut zero = ask(t, 100, 64);
        zero.count = 0;
        let e = conn.allocate(zero).await.expect_err("zero count refused");
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{t:?}: {e:?}");
        assert!(e.message.contains("zero resources or zero count"), "{e:?}");
        let e = conn
            .allocate(ask(t, 0, 0))
            .await
            .expect_err("zero resources refused");
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{t:?}: {e:?}");
        assert!(e.message.contains("zero resources or zero count"), "{e:?}");
    }

    // A valid token with an empty command: refused, and the token is still good afterwards.
    let token = conn.grant(ask(ContainerType::Queueable, 100, 64)).await;
    let mut empty = sh("");
    empty.command.clear();
    empty.args.clear();
    let e = conn.start(&token, empty).await.expect_err("empty command");
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert!(
        e.message.contains("launch.command must not be empty"),
        "{e:?}"
    );
    assert_eq!(c.inspect("node-a").await.running, 1);
    let accepted = conn
        .start(&token, sh("exit 0"))
        .await
        .expect("the token was not consumed by the refused start");
    assert_eq!(accepted.container_id, token.body.container_id);
    c.wait_for_node("node-a", "the exit-0 container finished", |s| {
        s.running == 1 && s.processes == 1
    })
    .await;

    // Stopping a container the node does not have.
    let id = conn.new_request_id();
    conn.send(&AppRequest::StopContainer(
        scheduler_core::protocol::app::StopContainer {
            request_id: id,
            container_id: ContainerId::new(ContainerId::MAX_ISSUER, 1),
        },
    ))
    .await;
    let e = conn.error_for(id).await;
    assert_eq!(e.code, ErrorCode::UnknownContainer, "{e:?}");

    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

#[actix_rt::test]
async fn asks_larger_than_any_node_get_ask_too_large() {
    // Two node shapes: an ask below the maximum of each dimension may still fit no single node.
    let c = Cluster::start(
        &["demo"],
        &[node("node-a", 2000, 1024), node("node-b", 1000, 4096)],
    )
    .await;
    let mut conn = c.client("node-b").await;
    for t in [ContainerType::Queueable, ContainerType::Guaranteed] {
        for (cpu, mem) in [(4000, 64), (100, 8192), (1500, 2048)] {
            let e = conn
                .allocate(ask(t, cpu, mem))
                .await
                .expect_err("too large for every node");
            assert_eq!(e.code, ErrorCode::AskTooLarge, "{t:?} {cpu}/{mem}: {e:?}");
            assert!(!e.retryable);
        }
    }
    let e = conn
        .allocate(ask(ContainerType::Queueable, 1500, 2048))
        .await
        .unwrap_err();
    assert!(
        e.message.contains(
            "ask of {cpu_millis: 1500, memory_mib: 2048} is larger than every node of the cluster"
        ),
        "{e:?}"
    );
    // Locality does not rescue a too-large ask.
    let mut local = ask(ContainerType::Queueable, 4000, 64);
    local.locality = Some(Locality {
        nodes: vec!["node-a".into()],
        racks: vec![],
        relax: true,
    });
    assert_eq!(
        conn.allocate(local).await.unwrap_err().code,
        ErrorCode::AskTooLarge
    );
    // Asks that fit one node exactly are granted, on that node.
    for (cpu, mem, node) in [(2000, 1024, "node-a"), (1000, 4096, "node-b")] {
        for t in [ContainerType::Queueable, ContainerType::Guaranteed] {
            let granted = conn.allocate(ask(t, cpu, mem)).await.expect("fits");
            assert_eq!(granted.containers.len(), 1);
            assert_eq!(granted.containers[0].node_id.as_str(), node);
        }
    }
    // The connection is still fine.
    conn.subscribe().await;
    c.stop().await;
}

/// An allocate with a fixed request id.
fn allocate_frame(request_id: u64) -> Vec<u8> {
    let mut a = ask(ContainerType::Queueable, 100, 64);
    a.request_id = request_id;
    encode_frame(&AppRequest::Allocate(a), APP_MAX_FRAME).unwrap()
}

#[actix_rt::test]
async fn requests_before_a_closing_error_or_end_of_stream_are_answered_first() {
    let (c, mut good, running) = serving_cluster().await;

    // Two asks and malformed msgpack in one write: both answers, then the error, then close.
    let mut conn = c.client("node-a").await;
    let mut bytes = allocate_frame(61);
    bytes.extend(allocate_frame(62));
    bytes.extend(raw_frame(&[0xc1]));
    conn.send_bytes(&bytes).await;
    for id in [61, 62] {
        match conn.next().await {
            Some(AppResponse::Allocated(a)) => assert_eq!(a.request_id, id),
            other => panic!("expected the answer to {id} first, got {other:?}"),
        }
    }
    let e = conn.error_then_close().await;
    assert_eq!(e.code, ErrorCode::MalformedFrame, "{e:?}");

    // The same with an oversized length prefix.
    let mut conn = c.client("node-a").await;
    let mut bytes = allocate_frame(63);
    bytes.extend((APP_MAX_FRAME as u32 + 1).to_be_bytes());
    conn.send_bytes(&bytes).await;
    match conn.next().await {
        Some(AppResponse::Allocated(a)) => assert_eq!(a.request_id, 63),
        other => panic!("expected the answer to 63 first, got {other:?}"),
    }
    assert_eq!(conn.error_then_close().await.code, ErrorCode::FrameTooLarge);

    // Requests, then end of stream (half-close): every answer arrives before the close.
    let mut conn = c.client("node-a").await;
    let mut bytes = allocate_frame(64);
    bytes.extend(allocate_frame(65));
    conn.send_bytes(&bytes).await;
    conn.shutdown_write().await;
    for id in [64, 65] {
        match conn.next().await {
            Some(AppResponse::Allocated(a)) => assert_eq!(a.request_id, id),
            other => panic!("expected the answer to {id} before the close, got {other:?}"),
        }
    }
    conn.expect_closed().await;
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

#[actix_rt::test]
async fn a_request_id_that_is_not_an_unsigned_integer_is_an_invalid_request() {
    let (c, mut good, running) = serving_cluster().await;
    #[derive(Serialize)]
    struct TextId {
        #[serde(rename = "type")]
        kind: &'static str,
        request_id: &'static str,
    }
    #[derive(Serialize)]
    struct NegativeId {
        #[serde(rename = "type")]
        kind: &'static str,
        request_id: i64,
    }
    let mut conn = c.client("node-a").await;
    conn.send_value(&TextId {
        kind: "subscribe",
        request_id: "abc",
    })
    .await;
    let e = match conn.next().await {
        Some(AppResponse::Error(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        None,
        "bad `subscribe` frame: `request_id` must be an unsigned integer",
    );
    conn.send_value(&NegativeId {
        kind: "allocate",
        request_id: -4,
    })
    .await;
    let e = match conn.next().await {
        Some(AppResponse::Error(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    };
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        None,
        "bad `allocate` frame: `request_id` must be an unsigned integer",
    );
    // The session goes on.
    conn.subscribe().await;

    // Before the hello, it still ends the connection.
    let mut conn = AppClient::connect(c.worker("node-a").tcp_addr()).await;
    conn.send_value(&TextId {
        kind: "hello",
        request_id: "abc",
    })
    .await;
    let e = conn.error_then_close().await;
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

/// Issue 11: a 900 kB job id was granted, signed into the token and reported in every
/// heartbeat (19 such containers outgrew the cluster frame and the node was lost for good).
/// Every field has a bound now; a field over it is `invalid_request` naming the field and the
/// bound, and the connection stays usable.
#[actix_rt::test]
async fn fields_over_their_bound_get_invalid_request_naming_field_and_bound() {
    use scheduler_core::protocol::limits::{MAX_JOB_ID_BYTES, MAX_PATH_BYTES};
    let (c, mut good, running) = serving_cluster().await;
    let mut conn = c.client("node-a").await;

    let mut huge = ask(ContainerType::Queueable, 100, 64);
    huge.job_id = "j".repeat(900_000);
    let e = conn
        .allocate(huge)
        .await
        .expect_err("900 kB job id refused");
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        e.request_id,
        &format!("`job_id` is 900000 bytes; the limit is {MAX_JOB_ID_BYTES} bytes"),
    );
    for t in [ContainerType::Queueable, ContainerType::Guaranteed] {
        let mut long = ask(t, 100, 64);
        long.job_id = "j".repeat(MAX_JOB_ID_BYTES + 1);
        let e = conn
            .allocate(long)
            .await
            .expect_err("job id over the bound");
        assert!(e.message.contains("`job_id`"), "{t:?}: {e:?}");
    }
    let mut at_bound = ask(ContainerType::Queueable, 100, 64);
    at_bound.job_id = "j".repeat(MAX_JOB_ID_BYTES);
    let token = conn.grant(at_bound).await;

    // Launch specs: an over-long command, a NUL in an argument.
    let mut long_command = sh("exit 0");
    long_command.command = "x".repeat(MAX_PATH_BYTES + 1);
    let e = conn
        .start(&token, long_command)
        .await
        .expect_err("long command");
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        e.request_id,
        &format!("`launch.command` is 4097 bytes; the limit is {MAX_PATH_BYTES} bytes"),
    );
    let e = conn
        .start(&token, sh("exit 0\0"))
        .await
        .expect_err("NUL in an argument");
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        e.request_id,
        "`launch.args[]` contains a NUL byte",
    );
    // The token was not consumed by the refusals.
    conn.start(&token, sh("exit 0"))
        .await
        .expect("the refused starts left the token usable");

    // Before the hello, a hello with an over-long field is refused and closes.
    let mut pre = AppClient::connect(c.worker("node-a").tcp_addr()).await;
    pre.send(&hello(APP_PROTOCOL_VERSION, &"a".repeat(200), "s"))
        .await;
    let e = pre.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::InvalidRequest,
        None,
        "`app_id` is 200 bytes; the limit is 128 bytes",
    );

    c.wait_for_node("node-a", "the exit-0 container finished", |s| {
        s.running == 1 && s.processes == 1
    })
    .await;
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

/// Before the hello is accepted a frame may be at most `HELLO_MAX_FRAME` (4 KiB): an
/// unauthenticated client cannot make the worker buffer a 1 MiB frame per connection. The same
/// frame is fine after the hello.
#[actix_rt::test]
async fn frames_before_the_hello_are_capped_small() {
    use scheduler_core::protocol::limits::HELLO_MAX_FRAME;
    let (c, mut good, running) = serving_cluster().await;
    let addr = c.worker("node-a").tcp_addr();

    // A hello padded to exactly the cap is welcomed (unknown fields are ignored).
    #[derive(Serialize)]
    struct PaddedHello {
        #[serde(rename = "type")]
        kind: &'static str,
        protocol_version: u32,
        app_id: &'static str,
        app_secret: String,
        pad: String,
    }
    let mut hello = PaddedHello {
        kind: "hello",
        protocol_version: APP_PROTOCOL_VERSION,
        app_id: "demo",
        app_secret: c.secret("demo").to_string(),
        pad: String::new(),
    };
    let size = to_payload(&hello).unwrap().len();
    hello.pad = "x".repeat(HELLO_MAX_FRAME - size - 2);
    assert_eq!(to_payload(&hello).unwrap().len(), HELLO_MAX_FRAME);
    let mut conn = AppClient::connect(addr).await;
    conn.send_value(&hello).await;
    assert!(matches!(conn.next().await, Some(AppResponse::Welcome(_))));
    // After the welcome the normal cap applies.
    conn.send(&AppRequest::Subscribe(Subscribe { request_id: 5 }))
        .await;
    assert!(matches!(conn.answer(5).await, AppResponse::Ack(_)));

    // One byte more before the hello: refused on the length prefix alone.
    let mut conn = AppClient::connect(addr).await;
    conn.send_bytes(&((HELLO_MAX_FRAME as u32 + 1).to_be_bytes()))
        .await;
    let e = conn.error_then_close().await;
    assert_error(
        &e,
        ErrorCode::FrameTooLarge,
        None,
        &format!(
            "frame of {} bytes exceeds the limit of {HELLO_MAX_FRAME} bytes before the hello is accepted",
            HELLO_MAX_FRAME + 1
        ),
    );
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

/// Valid frames with a few bytes changed (a fixed pseudo-random sequence): every one gets an
/// answer or a closing error, the worker never stops serving, and the running container is
/// untouched (issue 11: "a bad input always gets a clear error; no panic").
#[actix_rt::test]
async fn mutated_frames_are_answered_and_never_hurt_the_worker() {
    use scheduler_core::protocol::app::{LaunchSpec, Release, StartContainer};
    let (c, mut good, running) = serving_cluster().await;
    let addr = c.worker("node-a").tcp_addr();
    let secret = c.secret("demo").to_string();
    let token = good.grant(ask(ContainerType::Queueable, 100, 64)).await;
    let templates: Vec<Vec<u8>> = vec![
        to_payload(&AppRequest::Allocate(ask(
            ContainerType::Queueable,
            100,
            64,
        )))
        .unwrap(),
        to_payload(&AppRequest::StartContainer(StartContainer {
            request_id: 3,
            token,
            launch: LaunchSpec {
                command: "/bin/true".into(),
                args: vec!["x".into()],
                env: [("K".to_string(), "V".to_string())].into(),
                working_dir: None,
            },
        }))
        .unwrap(),
        to_payload(&AppRequest::Release(Release {
            request_id: 4,
            container_id: ContainerId::new(1, 1),
        }))
        .unwrap(),
    ];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    let mut conn = AppClient::login(addr, "demo", &secret).await;
    let mut closed = 0;
    for i in 0..300u64 {
        let mut payload = templates[(i % 3) as usize].clone();
        for _ in 0..(1 + next() % 4) {
            let at = next() as usize % payload.len();
            payload[at] = next() as u8;
        }
        let mut frame = (payload.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&payload);
        conn.send_bytes(&frame).await;
        // A sentinel behind it: its ack means the mutated frame was dealt with.
        let sentinel = u64::MAX - i;
        conn.send(&AppRequest::Subscribe(Subscribe {
            request_id: sentinel,
        }))
        .await;
        loop {
            match conn.next().await {
                Some(AppResponse::Ack(a)) if a.request_id == sentinel => break,
                Some(_) => continue,
                None => {
                    // A closing error (malformed_frame, ...) ended the connection: start over.
                    closed += 1;
                    conn = AppClient::login(addr, "demo", &secret).await;
                    break;
                }
            }
        }
    }
    assert!(closed < 300, "not every mutation closes the connection");
    // A mutation that left the token intact may have started `/bin/true` (or a mangled
    // command that fails to launch): let it end.
    c.wait_for_node("node-a", "only the sleeper runs", |s| {
        s.running == 1 && s.processes == 1
    })
    .await;
    assert_still_serving(&c, &mut good, running).await;
    c.stop().await;
}

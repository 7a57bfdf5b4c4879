//! The app-protocol client against an in-process fake worker: a tokio listener written here
//! that speaks the frames with the real codec, so each test controls exactly which bytes arrive
//! when (answers out of order, split frames, errors, closes). Timeouts only guard against hangs.

use scheduler_core::codec::{APP_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, AcceptedState, Ack, Allocate, Allocated, AppRequest, AppResponse,
    ContainerAccepted, ContainerEvent, ContainerEventKind, ErrorCode, ErrorFrame, GrantedContainer,
    Hello, LaunchSpec, Promoted, Welcome,
};
use scheduler_core::token::{ContainerToken, GuaranteedSigner, KeyRing, TokenBody, TokenKey};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};
use std::future::Future;
use std::time::Duration;
use testbed::client::{AppClient, ClientError, ClientPool, Endpoint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const GUARD: Duration = Duration::from_secs(20);

async fn guarded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f)
        .await
        .expect("test step finished within the guard time")
}

/// The server side of one connection.
struct FakeConn<S> {
    stream: S,
    decoder: FrameDecoder,
}

impl<S: AsyncRead + AsyncWrite + Unpin> FakeConn<S> {
    fn new(stream: S) -> Self {
        FakeConn {
            stream,
            decoder: FrameDecoder::new(APP_MAX_FRAME),
        }
    }

    /// The next request, or `None` at end of stream.
    async fn recv(&mut self) -> Option<AppRequest> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(r) = self.decoder.next_message::<AppRequest>().unwrap() {
                return Some(r);
            }
            let n = self.stream.read(&mut buf).await.unwrap();
            if n == 0 {
                self.decoder.finish().unwrap();
                return None;
            }
            self.decoder.push(&buf[..n]);
        }
    }

    async fn expect(&mut self) -> AppRequest {
        self.recv().await.expect("a request, not end of stream")
    }

    async fn send(&mut self, r: &AppResponse) {
        let frame = encode_frame(r, APP_MAX_FRAME).unwrap();
        self.stream.write_all(&frame).await.unwrap();
    }

    /// Send one byte per write (the client must reassemble frames).
    async fn send_byte_by_byte(&mut self, r: &AppResponse) {
        for b in encode_frame(r, APP_MAX_FRAME).unwrap() {
            self.stream.write_all(&[b]).await.unwrap();
            self.stream.flush().await.unwrap();
        }
    }

    /// Read the hello and welcome the client.
    async fn accept_hello(&mut self, node: &str) -> Hello {
        let AppRequest::Hello(h) = self.expect().await else {
            panic!("first frame is not a hello")
        };
        self.send(&welcome(node)).await;
        h
    }
}

fn welcome(node: &str) -> AppResponse {
    AppResponse::Welcome(Welcome {
        protocol_version: APP_PROTOCOL_VERSION,
        node_id: node.into(),
        max_frame_bytes: APP_MAX_FRAME as u64,
    })
}

async fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

async fn accept(l: &TcpListener) -> FakeConn<tokio::net::TcpStream> {
    FakeConn::new(l.accept().await.unwrap().0)
}

/// Connect a client to a fresh fake worker; returns both ends and the client's event channel.
async fn connected() -> (
    AppClient,
    FakeConn<tokio::net::TcpStream>,
    mpsc::UnboundedReceiver<ContainerEvent>,
) {
    let (l, addr) = listener().await;
    let (tx, rx) = mpsc::unbounded_channel();
    let server = async {
        let mut c = accept(&l).await;
        let hello = c.accept_hello("node-1").await;
        assert_eq!(hello.protocol_version, APP_PROTOCOL_VERSION);
        assert_eq!(hello.app_id, "app");
        assert_eq!(hello.app_secret, "s3cret");
        c
    };
    let (client, server) =
        guarded(async { tokio::join!(AppClient::connect(&addr, "app", "s3cret", tx), server) })
            .await;
    let client = client.unwrap();
    assert_eq!(client.welcome().node_id, "node-1");
    (client, server, rx)
}

fn token(id: ContainerId, node: &str) -> ContainerToken {
    GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [7; 32])))
        .unwrap()
        .sign(TokenBody {
            container_id: id,
            node_id: NodeId::from(node),
            app_id: AppId::from("app"),
            resources: Resources::new(500, 256),
            container_type: ContainerType::Guaranteed,
            version: 0,
            job_id: JobId::from("job-1"),
            job_submit_time_ms: 1,
            priority: 0,
            runtime_estimate_ms: None,
            expires_at_ms: 2_000_000_000_000,
            key_id: 0,
            node_epoch: 0,
            booking: None,
            times_returned: 0,
        })
        .unwrap()
}

fn grant(id: ContainerId, node: &str, endpoint: &str) -> GrantedContainer {
    GrantedContainer {
        container_id: id,
        node_id: NodeId::from(node),
        node_endpoint: endpoint.into(),
        container_type: ContainerType::Guaranteed,
        resources: Resources::new(500, 256),
        token: token(id, node),
    }
}

fn ask(t: ContainerType, count: u32) -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(500, 256),
        count,
        priority: 0,
        container_type: t,
        locality: None,
        runtime_estimate_ms: Some(1000),
        job_id: "job-1".into(),
        job_submit_time_ms: 1,
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    }
}

fn event(id: ContainerId, kind: ContainerEventKind) -> AppResponse {
    AppResponse::Event(ContainerEvent {
        container_id: id,
        node_id: NodeId::from("node-1"),
        event: kind,
        at_ms: 5,
    })
}

#[tokio::test]
async fn answers_in_reverse_order_reach_their_own_requests() {
    let (client, mut server, mut events) = connected().await;
    let (c1, c2, c3) = (ContainerId(11), ContainerId(12), ContainerId(13));
    let server_side = async {
        let mut ids = vec![];
        for _ in 0..3 {
            let r = server.expect().await;
            ids.push((r.request_id().unwrap(), r));
        }
        // Every request got its own id.
        let mut distinct: Vec<u64> = ids.iter().map(|(i, _)| *i).collect();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        for (id, r) in ids.into_iter().rev() {
            let answer = match r {
                AppRequest::Release(r) => {
                    assert_eq!(r.container_id, c1);
                    AppResponse::Ack(Ack { request_id: id })
                }
                AppRequest::Promote(p) => AppResponse::Promoted(Promoted {
                    request_id: id,
                    container_id: p.container_id,
                    token: token(p.container_id, "node-1"),
                }),
                AppRequest::StartContainer(s) => {
                    // An event between answers goes to the event channel, not to a request.
                    server
                        .send(&event(
                            s.token.body.container_id,
                            ContainerEventKind::Running,
                        ))
                        .await;
                    AppResponse::ContainerAccepted(ContainerAccepted {
                        request_id: id,
                        container_id: s.token.body.container_id,
                        state: AcceptedState::Running,
                    })
                }
                other => panic!("unexpected request {other:?}"),
            };
            server.send(&answer).await;
        }
    };
    let launch = LaunchSpec {
        command: "/bin/true".into(),
        ..Default::default()
    };
    let (released, promoted, accepted, ()) = guarded(async {
        tokio::join!(
            client.release(c1),
            client.promote(c2),
            client.start_container(token(c3, "node-1"), launch),
            server_side
        )
    })
    .await;
    released.unwrap();
    assert_eq!(promoted.unwrap().container_id, c2);
    let accepted = accepted.unwrap();
    assert_eq!(accepted.container_id, c3);
    assert_eq!(accepted.state, AcceptedState::Running);
    let ev = events.try_recv().expect("the event was delivered");
    assert_eq!(ev.container_id, c3);
    assert_eq!(ev.event, ContainerEventKind::Running);
}

#[tokio::test]
async fn a_guaranteed_ask_answered_over_several_frames_is_collected() {
    let (client, mut server, _events) = connected().await;
    let server_side = async {
        let AppRequest::Allocate(a) = server.expect().await else {
            panic!("allocate expected")
        };
        assert_eq!(a.count, 3);
        assert_eq!(a.container_type, ContainerType::Guaranteed);
        let subscribe = server.expect().await;
        let frame = |ids: &[u64], remaining| {
            AppResponse::Allocated(Allocated {
                request_id: a.request_id,
                containers: ids
                    .iter()
                    .map(|i| grant(ContainerId(*i), "node-1", "127.0.0.1:1"))
                    .collect(),
                remaining,
                unplaced: 0,
                unplaced_reason: None,
            })
        };
        server.send(&frame(&[1, 2], 1)).await;
        // Another request's answer arrives between the two frames of the ask.
        server
            .send(&AppResponse::Ack(Ack {
                request_id: subscribe.request_id().unwrap(),
            }))
            .await;
        server.send(&frame(&[3], 0)).await;
    };
    let (allocated, subscribed, ()) = guarded(async {
        tokio::join!(
            client.allocate(ask(ContainerType::Guaranteed, 3)),
            client.subscribe(),
            server_side
        )
    })
    .await;
    subscribed.unwrap();
    let allocated = allocated.unwrap();
    assert_eq!(allocated.remaining, 0);
    let ids: Vec<u64> = allocated
        .containers
        .iter()
        .map(|c| c.container_id.0)
        .collect();
    assert_eq!(ids, vec![1, 2, 3]);
}

#[tokio::test]
async fn allocation_frames_arrive_one_by_one() {
    let (client, mut server, _events) = connected().await;
    let mut frames = client
        .allocate_frames(ask(ContainerType::Guaranteed, 2))
        .unwrap();
    let AppRequest::Allocate(a) = guarded(server.expect()).await else {
        panic!("allocate expected")
    };
    for (i, remaining) in [(1u64, 1u32), (2, 0)] {
        server
            .send(&AppResponse::Allocated(Allocated {
                request_id: a.request_id,
                containers: vec![grant(ContainerId(i), "node-1", "127.0.0.1:1")],
                remaining,
                unplaced: 0,
                unplaced_reason: None,
            }))
            .await;
        let f = guarded(frames.next()).await.unwrap().unwrap();
        assert_eq!(f.remaining, remaining);
        assert_eq!(f.containers[0].container_id, ContainerId(i));
    }
    assert!(
        frames.next().await.is_none(),
        "nothing after remaining == 0"
    );
}

#[tokio::test]
async fn queueable_unplaced_count_and_reason_are_returned() {
    let (client, mut server, _events) = connected().await;
    let server_side = async {
        let AppRequest::Allocate(a) = server.expect().await else {
            panic!("allocate expected")
        };
        server
            .send(&AppResponse::Allocated(Allocated {
                request_id: a.request_id,
                containers: vec![grant(ContainerId(1), "node-1", "127.0.0.1:1")],
                remaining: 0,
                unplaced: 4,
                unplaced_reason: Some("quota".into()),
            }))
            .await;
    };
    let (allocated, ()) = guarded(async {
        tokio::join!(
            client.allocate(ask(ContainerType::Queueable, 5)),
            server_side
        )
    })
    .await;
    let allocated = allocated.unwrap();
    assert_eq!(allocated.containers.len(), 1);
    assert_eq!(allocated.unplaced, 4);
    assert_eq!(allocated.unplaced_reason.as_deref(), Some("quota"));
}

#[tokio::test]
async fn error_frames_become_typed_errors_and_the_connection_stays_usable() {
    let (client, mut server, _events) = connected().await;
    let server_side = async {
        let r = server.expect().await;
        server
            .send(&AppResponse::Error(ErrorFrame::new(
                r.request_id(),
                ErrorCode::UnknownContainer,
                "container c0-9 is not on this node",
            )))
            .await;
        let r = server.expect().await;
        server
            .send(&AppResponse::Error(ErrorFrame::new(
                r.request_id(),
                ErrorCode::QuotaExceeded,
                "QUEUEABLE quota reached",
            )))
            .await;
        let r = server.expect().await;
        server
            .send(&AppResponse::Ack(Ack {
                request_id: r.request_id().unwrap(),
            }))
            .await;
    };
    let client_side = async {
        let e = client.stop_container(ContainerId(9)).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnknownContainer));
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("not on this node"), "{e}");
        let e = client
            .allocate(ask(ContainerType::Queueable, 1))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::QuotaExceeded));
        assert!(e.is_retryable());
        client.subscribe().await.unwrap();
    };
    guarded(async { tokio::join!(client_side, server_side) }).await;
}

#[tokio::test]
async fn a_refused_hello_is_a_server_error_at_connect() {
    let (l, addr) = listener().await;
    let server = async {
        let mut c = accept(&l).await;
        let AppRequest::Hello(_) = c.expect().await else {
            panic!("hello expected")
        };
        c.send(&AppResponse::Error(ErrorFrame::new(
            None,
            ErrorCode::BadCredentials,
            "unknown app \"app\" or wrong secret",
        )))
        .await;
        // The worker closes after a refused hello.
        drop(c);
    };
    let (tx, _rx) = mpsc::unbounded_channel();
    let (client, ()) =
        guarded(async { tokio::join!(AppClient::connect(&addr, "app", "wrong", tx), server) })
            .await;
    let e = client.err().expect("connect was refused");
    assert_eq!(e.code(), Some(ErrorCode::BadCredentials));
}

#[tokio::test]
async fn a_lost_connection_fails_waiting_and_later_requests() {
    let (client, mut server, _events) = connected().await;
    let server_side = async {
        server.expect().await;
        drop(server);
    };
    let (answer, ()) = guarded(async { tokio::join!(client.subscribe(), server_side) }).await;
    assert!(
        matches!(answer, Err(ClientError::Closed { .. })),
        "{answer:?}"
    );
    assert!(client.is_closed());
    guarded(client.closed()).await;
    assert!(matches!(
        client.release(ContainerId(1)).await,
        Err(ClientError::Closed { .. })
    ));
}

#[tokio::test]
async fn a_connection_ending_error_frame_is_the_reason_waiting_requests_get() {
    let (client, mut server, _events) = connected().await;
    let server_side = async {
        server.expect().await;
        // An error naming no request, of a kind after which the worker closes.
        server
            .send(&AppResponse::Error(ErrorFrame::new(
                None,
                ErrorCode::MalformedFrame,
                "malformed msgpack message",
            )))
            .await;
        drop(server);
    };
    let (answer, ()) =
        guarded(async { tokio::join!(client.release(ContainerId(3)), server_side) }).await;
    assert_eq!(
        answer.unwrap_err().code(),
        Some(ErrorCode::MalformedFrame),
        "the waiting request learns why the connection ended"
    );
}

#[tokio::test]
async fn frames_split_into_single_bytes_are_reassembled() {
    let (l, addr) = listener().await;
    let (tx, mut events) = mpsc::unbounded_channel();
    let server = async {
        let mut c = accept(&l).await;
        let AppRequest::Hello(_) = c.expect().await else {
            panic!("hello expected")
        };
        c.send_byte_by_byte(&welcome("node-7")).await;
        let r = c.expect().await;
        c.send_byte_by_byte(&event(ContainerId(4), ContainerEventKind::Queued))
            .await;
        c.send_byte_by_byte(&AppResponse::Ack(Ack {
            request_id: r.request_id().unwrap(),
        }))
        .await;
        c
    };
    let client_side = async {
        let client = AppClient::connect(&addr, "app", "s3cret", tx)
            .await
            .unwrap();
        assert_eq!(client.welcome().node_id, "node-7");
        client.subscribe().await.unwrap();
        client
    };
    let (_client, _server) = guarded(async { tokio::join!(client_side, server) }).await;
    let ev = events.try_recv().expect("event reassembled");
    assert_eq!(ev.event, ContainerEventKind::Queued);
}

#[tokio::test]
async fn a_cancelled_request_does_not_disturb_later_ones() {
    let (client, mut server, _events) = connected().await;
    // Poll the release once (it is sent), then drop it.
    tokio::select! {
        biased;
        _ = client.release(ContainerId(1)) => panic!("answered before the server saw it"),
        () = std::future::ready(()) => {}
    }
    let first = guarded(server.expect()).await;
    // The late answer to the cancelled request is ignored; the next request gets its own.
    server
        .send(&AppResponse::Ack(Ack {
            request_id: first.request_id().unwrap(),
        }))
        .await;
    let server_side = async {
        let r = server.expect().await;
        server
            .send(&AppResponse::Ack(Ack {
                request_id: r.request_id().unwrap(),
            }))
            .await;
    };
    let (answer, ()) = guarded(async { tokio::join!(client.subscribe(), server_side) }).await;
    answer.unwrap();
}

#[tokio::test]
async fn dropping_the_client_ends_the_connection() {
    let (client, mut server, _events) = connected().await;
    drop(client);
    assert!(
        guarded(server.recv()).await.is_none(),
        "the worker sees end of stream"
    );
}

#[tokio::test]
async fn unix_socket_endpoints_work() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.sock");
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    let endpoint = path.display().to_string();
    assert_eq!(Endpoint::parse(&endpoint), Endpoint::Unix(path.clone()));
    assert_eq!(
        Endpoint::parse(&format!("unix:{endpoint}")),
        Endpoint::Unix(path.clone())
    );
    assert_eq!(
        Endpoint::parse("127.0.0.1:7500"),
        Endpoint::Tcp("127.0.0.1:7500".into())
    );
    // The schemes workers advertise (docs/protocol.md §1).
    assert_eq!(
        Endpoint::parse(&format!("unix://{endpoint}")),
        Endpoint::Unix(path.clone())
    );
    assert_eq!(
        Endpoint::parse("tcp://127.0.0.1:7500"),
        Endpoint::Tcp("127.0.0.1:7500".into())
    );
    assert_eq!(
        Endpoint::parse("tls://w1.example:7500"),
        Endpoint::Tls("w1.example:7500".into())
    );
    let server = async {
        let mut c = FakeConn::new(l.accept().await.unwrap().0);
        c.accept_hello("node-u").await;
        let r = c.expect().await;
        c.send(&AppResponse::Ack(Ack {
            request_id: r.request_id().unwrap(),
        }))
        .await;
        c
    };
    let (tx, _rx) = mpsc::unbounded_channel();
    let client_side = async {
        let client = AppClient::connect(&format!("unix:{endpoint}"), "app", "s3cret", tx)
            .await
            .unwrap();
        client.subscribe().await.unwrap();
        client
    };
    let (client, _server) = guarded(async { tokio::join!(client_side, server) }).await;
    assert_eq!(client.welcome().node_id, "node-u");
}

/// Serve pool connections: welcome, ack `subscribe`, accept `start_container` and then send a
/// `completed` event for it. Returns how many connections were accepted when told to stop.
async fn pool_worker(l: TcpListener, node: &'static str, mut stop: mpsc::Receiver<()>) -> usize {
    let mut accepted = 0;
    loop {
        let (stream, _) = tokio::select! {
            r = l.accept() => r.unwrap(),
            _ = stop.recv() => return accepted,
        };
        accepted += 1;
        tokio::spawn(async move {
            let mut c = FakeConn::new(stream);
            c.accept_hello(node).await;
            while let Some(r) = c.recv().await {
                match r {
                    AppRequest::Subscribe(s) => {
                        c.send(&AppResponse::Ack(Ack {
                            request_id: s.request_id,
                        }))
                        .await
                    }
                    AppRequest::StartContainer(s) => {
                        let id = s.token.body.container_id;
                        assert_eq!(s.token.body.node_id.as_str(), node, "started on its node");
                        c.send(&AppResponse::ContainerAccepted(ContainerAccepted {
                            request_id: s.request_id,
                            container_id: id,
                            state: AcceptedState::Running,
                        }))
                        .await;
                        c.send(&AppResponse::Event(ContainerEvent {
                            container_id: id,
                            node_id: NodeId::from(node),
                            event: ContainerEventKind::Completed { exit_code: 0 },
                            at_ms: 9,
                        }))
                        .await;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        });
    }
}

#[tokio::test]
async fn the_pool_keeps_one_subscribed_connection_per_endpoint() {
    let (la, a) = listener().await;
    let (lb, b) = listener().await;
    let (stop_a, rx_a) = mpsc::channel(1);
    let (stop_b, rx_b) = mpsc::channel(1);
    let server_a = tokio::spawn(pool_worker(la, "node-a", rx_a));
    let server_b = tokio::spawn(pool_worker(lb, "node-b", rx_b));
    let (pool, mut events) = ClientPool::new("app", "s3cret");
    guarded(async {
        let first = pool.get(&a).await.unwrap();
        let again = pool.get(&a).await.unwrap();
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        let launch = LaunchSpec {
            command: "/bin/true".into(),
            ..Default::default()
        };
        for (i, (node, endpoint)) in [("node-a", &a), ("node-b", &b), ("node-b", &b)]
            .into_iter()
            .enumerate()
        {
            let g = grant(ContainerId(100 + i as u64), node, endpoint);
            let accepted = pool.start(&g, launch.clone()).await.unwrap();
            assert_eq!(accepted.container_id, g.container_id);
        }
        // Each worker's `completed` event reaches the pool's one channel.
        let mut done = vec![];
        for _ in 0..3 {
            let e = events.recv().await.unwrap();
            assert_eq!(e.event, ContainerEventKind::Completed { exit_code: 0 });
            done.push((String::from(e.node_id), e.container_id.0));
        }
        done.sort();
        assert_eq!(
            done,
            vec![
                ("node-a".to_string(), 100),
                ("node-b".to_string(), 101),
                ("node-b".to_string(), 102)
            ]
        );
        let mut expected = vec![a.clone(), b.clone()];
        expected.sort();
        assert_eq!(pool.connected_endpoints(), expected);
        stop_a.send(()).await.unwrap();
        stop_b.send(()).await.unwrap();
        assert_eq!(server_a.await.unwrap(), 1, "one connection to node-a");
        assert_eq!(server_b.await.unwrap(), 1, "one connection to node-b");
    })
    .await;
}

#[tokio::test]
async fn the_pool_reconnects_after_a_connection_closed() {
    let (l, addr) = listener().await;
    let (pool, _events) = ClientPool::new("app", "s3cret");
    let serve_one = |close: bool| {
        let l = &l;
        async move {
            let mut c = accept(l).await;
            c.accept_hello("node-r").await;
            let r = c.expect().await;
            c.send(&AppResponse::Ack(Ack {
                request_id: r.request_id().unwrap(),
            }))
            .await;
            if close {
                drop(c);
                None
            } else {
                Some(c)
            }
        }
    };
    let (first, _) = guarded(async { tokio::join!(pool.get(&addr), serve_one(true)) }).await;
    let first = first.unwrap();
    // Wait until the client has seen the close.
    guarded(first.closed()).await;
    assert!(first.is_closed());
    let (second, _kept) = guarded(async { tokio::join!(pool.get(&addr), serve_one(false)) }).await;
    let second = second.unwrap();
    assert!(!std::sync::Arc::ptr_eq(&first, &second));
    assert!(!second.is_closed());
}

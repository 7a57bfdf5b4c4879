//! The application endpoint: a Unix socket, TLS over TCP and/or (explicitly) plaintext TCP,
//! each speaking the app protocol (`docs/protocol.md`, §1 for the transports). Each connection
//! is a task on the actors' arbiter: it decodes frames, checks the hello, hands requests to the
//! actors with the connection's outbound channel, and a writer task sends answers and events in
//! order. A bad client gets a clear error frame (and is disconnected where the protocol says so);
//! nothing it sends affects other connections or running containers.

use crate::config::AppLimits;
use crate::node_actor::{NodeActor, StartMsg, StatusOf, StopLocal, error};
use crate::scheduler_actor::{
    AllocateMsg, ConnectionClosed, ExplainMsg, PromoteMsg, ReleaseRemote, ReservationMsg,
    SchedulerActor,
};
use crate::shared::{
    AuthError, ConnState, ConnTx, GRANT_ANSWER_BYTES, InFlight, OTHER_ANSWER_BYTES, OutboundLimits,
    Settle, Shared,
};
use actix::Addr;
use scheduler_core::codec::{
    APP_MAX_FRAME, CodecError, FrameDecoder, LENGTH_PREFIX, encode_frame, from_payload,
};
use scheduler_core::node::NodeError;
use scheduler_core::protocol::Envelope;
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, Ack, AppRequest, AppResponse, ErrorCode, ErrorFrame, Welcome,
};
use scheduler_core::protocol::cluster::ReservationOp;
use scheduler_core::protocol::limits::{HELLO_MAX_FRAME, validate_request};
use scheduler_core::{AppId, NodeId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::{debug, info};

/// Just the `type` of a frame (to tell a bad `request_id` from a frame that is no request).
#[derive(serde::Deserialize)]
struct TypeTag {
    #[serde(rename = "type")]
    kind: String,
}

/// What every connection needs.
#[derive(Clone)]
pub struct Endpoint {
    pub node_id: NodeId,
    pub shared: Arc<Shared>,
    pub scheduler: Addr<SchedulerActor>,
    pub node: Addr<NodeActor>,
    pub limits: AppLimits,
    pub connections: Rc<ConnectionCount>,
    pub refuse_log: Rc<RefuseLog>,
    /// Failed TLS handshakes, logged like refusals (a scan must not flood the log).
    pub handshake_log: Rc<RefuseLog>,
}

/// Open application connections, in all and per source address (TCP peers' IP; Unix-socket
/// peers count in all only).
#[derive(Default)]
pub struct ConnectionCount {
    total: Cell<usize>,
    per_source: RefCell<HashMap<IpAddr, usize>>,
}

/// One admitted connection; releases its count when dropped.
pub struct Admitted {
    count: Rc<ConnectionCount>,
    source: Option<IpAddr>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.count.total.set(self.count.total.get() - 1);
        if let Some(ip) = self.source {
            let mut map = self.count.per_source.borrow_mut();
            if let Some(n) = map.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&ip);
                }
            }
        }
    }
}

impl ConnectionCount {
    /// Admit a connection from `source` under `limits`, or say which cap it hits.
    pub fn admit(
        self: &Rc<Self>,
        source: Option<IpAddr>,
        limits: &AppLimits,
    ) -> Result<Admitted, String> {
        if self.total.get() >= limits.max_connections {
            return Err(format!(
                "this worker serves its maximum of {} application connections; retry later",
                limits.max_connections
            ));
        }
        if let Some(ip) = source {
            let mut map = self.per_source.borrow_mut();
            let n = map.entry(ip).or_default();
            if *n >= limits.max_connections_per_source {
                return Err(format!(
                    "{ip} already has the maximum of {} application connections to this worker; retry later",
                    limits.max_connections_per_source
                ));
            }
            *n += 1;
        }
        self.total.set(self.total.get() + 1);
        Ok(Admitted {
            count: self.clone(),
            source,
        })
    }

    pub fn total(&self) -> usize {
        self.total.get()
    }
}

/// Accept-loop failures (EMFILE, ENFILE, ENOMEM, ...) are retried with a backoff, and logged
/// at most once per `LOG_EVERY` with a count of what was not logged.
struct AcceptBackoff {
    delay: Duration,
    failures_since_log: u64,
    last_log: Option<std::time::Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);
    const LOG_EVERY: Duration = Duration::from_secs(10);

    fn new() -> AcceptBackoff {
        AcceptBackoff {
            delay: Duration::ZERO,
            failures_since_log: 0,
            last_log: None,
        }
    }

    /// An accept succeeded: the next failure starts from the first delay again.
    fn succeeded(&mut self) {
        self.delay = Duration::ZERO;
    }

    /// An accept failed: log (rate-limited) and return how long to wait before the next.
    fn failed(&mut self, e: &std::io::Error, what: &str) -> Duration {
        self.failures_since_log += 1;
        let now = std::time::Instant::now();
        if self
            .last_log
            .is_none_or(|at| now.duration_since(at) >= Self::LOG_EVERY)
        {
            let out_of_fds = matches!(e.raw_os_error(), Some(24) | Some(23));
            tracing::warn!(
                "accepting {what} failed {} time(s) since the last report: {e}{}; retrying with backoff (up to {:?})",
                self.failures_since_log,
                if out_of_fds {
                    " (out of file descriptors: raise `ulimit -n` or lower the connection caps)"
                } else {
                    ""
                },
                Self::MAX
            );
            self.failures_since_log = 0;
            self.last_log = Some(now);
        }
        self.delay = (self.delay * 2).clamp(Self::FIRST, Self::MAX);
        self.delay
    }
}

impl Endpoint {
    /// Accept TCP connections forever.
    pub async fn serve_tcp(self, listener: tokio::net::TcpListener) {
        let mut backoff = AcceptBackoff::new();
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    backoff.succeeded();
                    let _ = stream.set_nodelay(true);
                    debug!(%peer, "app connection");
                    match self.connections.admit(Some(peer.ip()), &self.limits) {
                        Ok(admitted) => {
                            actix_rt::spawn(self.clone().serve(stream, admitted));
                        }
                        Err(why) => {
                            self.refuse_log.refused(&why);
                            actix_rt::spawn(refuse(stream, why));
                        }
                    }
                }
                Err(e) => {
                    let wait = backoff.failed(&e, "an app connection (TCP)");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Accept TLS-over-TCP connections forever. The connection is counted from the TCP accept;
    /// an admitted one must finish its handshake within the hello timeout, a refused one gets
    /// its `too_many_connections` over TLS within a second, or is just closed. A failed
    /// handshake (a plaintext client, an untrusting client, garbage) closes that connection
    /// only.
    pub async fn serve_tls(
        self,
        listener: tokio::net::TcpListener,
        acceptor: tokio_rustls::TlsAcceptor,
    ) {
        let mut backoff = AcceptBackoff::new();
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    backoff.succeeded();
                    let _ = stream.set_nodelay(true);
                    debug!(%peer, "app connection (TLS)");
                    let admitted = self.connections.admit(Some(peer.ip()), &self.limits);
                    if let Err(why) = &admitted {
                        self.refuse_log.refused(why);
                    }
                    let handshake_limit = match admitted {
                        Ok(_) => self.limits.hello_timeout,
                        Err(_) => Duration::from_secs(1),
                    };
                    let ep = self.clone();
                    let acceptor = acceptor.clone();
                    actix_rt::spawn(async move {
                        let tls = match tokio::time::timeout(
                            handshake_limit,
                            acceptor.accept(stream),
                        )
                        .await
                        {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                debug!(%peer, "app connection: TLS handshake failed: {e}");
                                ep.handshake_log.handshake_failed(&format!("{peer}: {e}"));
                                return;
                            }
                            Err(_) => {
                                debug!(%peer, "app connection: no TLS handshake within {handshake_limit:?}");
                                ep.handshake_log.handshake_failed(&format!(
                                    "{peer}: no handshake within {handshake_limit:?}"
                                ));
                                return;
                            }
                        };
                        match admitted {
                            Ok(admitted) => ep.serve(tls, admitted).await,
                            Err(why) => refuse(tls, why).await,
                        }
                    });
                }
                Err(e) => {
                    let wait = backoff.failed(&e, "an app connection (TLS)");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Accept Unix-socket connections forever.
    pub async fn serve_unix(self, listener: tokio::net::UnixListener) {
        let mut backoff = AcceptBackoff::new();
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    match self.connections.admit(None, &self.limits) {
                        Ok(admitted) => {
                            actix_rt::spawn(self.clone().serve(stream, admitted));
                        }
                        Err(why) => {
                            self.refuse_log.refused(&why);
                            actix_rt::spawn(refuse(stream, why));
                        }
                    }
                }
                Err(e) => {
                    let wait = backoff.failed(&e, "an app connection (Unix socket)");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Wait until the actors have handled every request this connection handed them, so their
    /// answers are queued before anything sent after this (a closing error, the close itself).
    /// Answers the actors wait for from the coordinator (GUARANTEED asks, promotions) are not
    /// waited for.
    async fn settle(&self) {
        let _ = self.scheduler.send(Settle).await;
        let _ = self.node.send(Settle).await;
    }

    /// Serve one connection until it ends, in a span carrying the node, the connection and
    /// (once it said hello) the app, so every event of the connection names them.
    pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + 'static>(
        self,
        stream: S,
        admitted: Admitted,
    ) {
        let span = tracing::info_span!(
            "app_connection",
            node = %self.node_id,
            conn = tracing::field::Empty,
            app = tracing::field::Empty
        );
        tracing::Instrument::instrument(self.serve_in_span(stream, admitted), span).await
    }

    async fn serve_in_span<S: AsyncRead + AsyncWrite + Unpin + 'static>(
        self,
        stream: S,
        admitted: Admitted,
    ) {
        let (mut reader, writer) = tokio::io::split(stream);
        let conn = self.shared.new_connection_id();
        tracing::Span::current().record("conn", conn);
        let state = ConnState::new(
            conn,
            OutboundLimits {
                max_in_flight: self.limits.max_in_flight,
                pause_queued_bytes: self.limits.pause_queued_bytes,
                max_queued_bytes: self.limits.max_queued_bytes,
            },
        );
        self.shared.register_connection(state.clone());
        let (tx, rx) = ConnTx::new(state.clone());
        let (close_tx, close_rx) = tokio::sync::oneshot::channel();
        let writer_task = actix_rt::spawn(write_frames(
            writer,
            rx,
            close_rx,
            state.clone(),
            self.limits.write_stall_timeout,
        ));
        let mut session = Session {
            ep: &self,
            tx: tx.clone(),
            app: None,
            conn,
            state: state.clone(),
        };
        // A hello is small: until it is accepted, a frame may be at most HELLO_MAX_FRAME.
        let mut decoder = FrameDecoder::new(HELLO_MAX_FRAME);
        // Small until the hello is accepted: thousands of idle connections cost little.
        let mut buf = vec![0u8; HELLO_MAX_FRAME + LENGTH_PREFIX];
        let hello_deadline = tokio::time::Instant::now() + self.limits.hello_timeout;
        'read: loop {
            let read = tokio::select! {
                r = reader.read(&mut buf) => r,
                _ = state.wait_for_closing() => break 'read,
                _ = tokio::time::sleep_until(hello_deadline), if session.app.is_none() => {
                    info!(conn, "app connection sent no hello within {:?}; closing", self.limits.hello_timeout);
                    session.send_error(
                        None,
                        ErrorCode::HelloRequired,
                        format!("no hello within {:?} of connecting", self.limits.hello_timeout),
                    );
                    break 'read;
                }
            };
            match read {
                Ok(0) => {
                    if let Err(e) = decoder.finish() {
                        info!(conn, "app connection ended mid-frame: {e}");
                    }
                    break;
                }
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) => {
                    debug!(conn, "app connection read error: {e}");
                    break;
                }
            }
            loop {
                match decoder.next_payload() {
                    Ok(None) => break,
                    Ok(Some(payload)) => {
                        // Backpressure: no more than `max_in_flight` requests at the actors and
                        // no more answers queued than `pause_queued_bytes` before reading on.
                        if !state.has_room() && !state.wait_for_room().await {
                            break 'read;
                        }
                        if session.handle_payload(&payload).await.is_break() {
                            break 'read;
                        }
                        if session.app.is_some() && decoder.limit() != APP_MAX_FRAME {
                            decoder.set_limit(APP_MAX_FRAME);
                            buf.resize(64 * 1024, 0);
                        }
                    }
                    Err(e @ CodecError::Oversized { .. }) => {
                        self.settle().await;
                        let message = if session.app.is_none() {
                            format!("{e} before the hello is accepted (a hello is small)")
                        } else {
                            e.to_string()
                        };
                        session.send_error(None, ErrorCode::FrameTooLarge, message);
                        break 'read;
                    }
                    Err(e) => {
                        self.settle().await;
                        session.send_error(None, ErrorCode::MalformedFrame, e.to_string());
                        break 'read;
                    }
                }
            }
        }
        // Answer what was asked before the end of stream (a client may half-close after its
        // last request) before closing.
        self.settle().await;
        self.shared.unsubscribe_connection(conn);
        // Before the writer closes: grants processed until now are still written out.
        let _ = self
            .scheduler
            .send(ConnectionClosed { reply: tx.clone() })
            .await;
        drop(session);
        drop(tx);
        if state.is_closing() {
            // The client does not read: nothing more can be delivered.
            writer_task.abort();
        } else {
            // Actors may still hold this connection's sender (a pending GUARANTEED ask): close
            // the writer explicitly once what is queued now has been sent.
            let _ = close_tx.send(());
        }
        let _ = writer_task.await;
        if !state.is_closing() {
            drain_before_close(&mut reader, &mut buf).await;
        }
        self.shared.unregister_connection(conn);
        drop(admitted);
    }
}

/// After the answers are written and the write side shut down, read and discard what the client
/// still sends, for a bounded time and amount: closing a socket with unread input makes the
/// kernel reset the connection, and the reset can destroy answers (the error frame that explains
/// the close included) that the client has not read yet. Found by `testbed fuzz --target
/// app-endpoint` (1–6 resets per million hostile connections before).
async fn drain_before_close<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) {
    const DRAIN_TIME: Duration = Duration::from_millis(500);
    const DRAIN_BYTES: usize = 1 << 20;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut drained = 0;
        while drained < DRAIN_BYTES {
            match reader.read(buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// Refusals of connections over a cap, logged at most once per 10 s with a count.
#[derive(Default)]
pub struct RefuseLog {
    since_log: Cell<u64>,
    last_log: Cell<Option<std::time::Instant>>,
}

impl RefuseLog {
    fn refused(&self, why: &str) {
        if let Some(n) = self.count() {
            tracing::warn!("refused {n} app connection(s) since the last report: {why}");
        }
    }

    /// A TLS handshake on the app endpoint failed (untrusting or plaintext client, scan).
    fn handshake_failed(&self, last: &str) {
        if let Some(n) = self.count() {
            tracing::info!(
                "{n} app connection(s) failed their TLS handshake since the last report; the last: {last}"
            );
        }
    }

    /// Count one; the count to report if a report is due (at most once per 10 s).
    fn count(&self) -> Option<u64> {
        self.since_log.set(self.since_log.get() + 1);
        let now = std::time::Instant::now();
        if self
            .last_log
            .get()
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(10))
        {
            let n = self.since_log.get();
            self.since_log.set(0);
            self.last_log.set(Some(now));
            Some(n)
        } else {
            None
        }
    }
}

/// Tell a connection over a cap why, without reading from it, and close it. The write is one
/// small frame into an empty socket buffer; it is not waited for longer than a second.
async fn refuse<S: AsyncWrite + Unpin>(mut stream: S, why: String) {
    let frame = encode_answer(
        &AppResponse::Error(ErrorFrame::new(None, ErrorCode::TooManyConnections, why)),
        HELLO_MAX_FRAME,
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(&frame).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

struct Session<'a> {
    ep: &'a Endpoint,
    tx: ConnTx,
    app: Option<AppId>,
    conn: u64,
    state: Arc<ConnState>,
}

use std::ops::ControlFlow;

/// Estimated bytes of a `reservation` or `reservations` answer (an allocation of up to a day of
/// one-minute steps, or a list of up to 64 definitions).
const RESERVATION_ANSWER_BYTES: usize = 128 * 1024;
/// What an `explained` answer may take in the connection's outbound budget (16 jobs of 8
/// options each, a few KiB per job).
const EXPLAIN_ANSWER_BYTES: usize = 64 * 1024;

impl Session<'_> {
    fn send(&self, r: AppResponse) {
        let _ = self.tx.send(r);
    }

    /// Forward a reservation request to the coordinator.
    fn reservation(&self, app: AppId, request_id: u64, op: ReservationOp, answer_bytes: usize) {
        self.ep.scheduler.do_send(ReservationMsg {
            app,
            request_id,
            op,
            reply: self.tx.clone(),
            in_flight: InFlight::new(&self.state, answer_bytes),
        });
    }

    fn send_error(&self, request_id: Option<u64>, code: ErrorCode, message: impl Into<String>) {
        self.send(AppResponse::Error(ErrorFrame::new(
            request_id, code, message,
        )));
    }

    /// Handle one frame. `Break` closes the connection (after the answer is flushed).
    async fn handle_payload(&mut self, payload: &[u8]) -> ControlFlow<()> {
        let envelope: Envelope = match from_payload(payload) {
            Ok(e) => e,
            Err(e) => {
                // A map with a string `type` whose `request_id` is not a u64 is a bad request,
                // not a malformed frame.
                if let Ok(tag) = from_payload::<TypeTag>(payload) {
                    self.send_error(
                        None,
                        ErrorCode::InvalidRequest,
                        format!(
                            "bad `{}` frame: `request_id` must be an unsigned integer: {e}",
                            tag.kind
                        ),
                    );
                    return if self.app.is_none() {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    };
                }
                self.ep.settle().await;
                self.send_error(
                    None,
                    ErrorCode::MalformedFrame,
                    format!("frame is not a msgpack map with a string `type`: {e}"),
                );
                return ControlFlow::Break(());
            }
        };
        let request: AppRequest = match from_payload(payload) {
            Ok(r) => r,
            Err(e) => {
                if scheduler_core::protocol::app::REQUEST_TYPES.contains(&envelope.kind.as_str()) {
                    self.send_error(
                        envelope.request_id,
                        ErrorCode::InvalidRequest,
                        format!("bad `{}` frame: {e}", envelope.kind),
                    );
                    // Before the hello nothing else is acceptable.
                    return if self.app.is_none() {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    };
                }
                self.send_error(
                    envelope.request_id,
                    ErrorCode::UnknownMessage,
                    format!(
                        "unknown message type {:?}; known types: {}",
                        envelope.kind,
                        scheduler_core::protocol::app::REQUEST_TYPES.join(", ")
                    ),
                );
                return if self.app.is_none() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                };
            }
        };
        // Every field's size bound (docs/protocol.md §10), before anything is stored or sent on.
        if let Err(refusal) = validate_request(&request) {
            let before_hello = self.app.is_none();
            if before_hello && !matches!(request, AppRequest::Hello(_)) {
                self.send_error(
                    request.request_id(),
                    ErrorCode::HelloRequired,
                    "the first frame must be a hello",
                );
                return ControlFlow::Break(());
            }
            self.send(AppResponse::Error(refusal));
            return if before_hello {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            };
        }
        let Some(app) = self.app.clone() else {
            let AppRequest::Hello(hello) = request else {
                self.send_error(
                    request.request_id(),
                    ErrorCode::HelloRequired,
                    "the first frame must be a hello",
                );
                return ControlFlow::Break(());
            };
            if hello.protocol_version != APP_PROTOCOL_VERSION {
                self.send_error(
                    None,
                    ErrorCode::VersionMismatch,
                    format!(
                        "protocol version {} is not supported; this worker speaks version {APP_PROTOCOL_VERSION}",
                        hello.protocol_version
                    ),
                );
                return ControlFlow::Break(());
            }
            return match self
                .ep
                .shared
                .authenticate(&hello.app_id, &hello.app_secret)
            {
                Ok(()) => {
                    tracing::Span::current().record("app", hello.app_id.as_str());
                    info!(app = %hello.app_id, client = ?hello.client_name, conn = self.conn, "app connected");
                    self.app = Some(AppId::new(hello.app_id));
                    self.send(AppResponse::Welcome(Welcome {
                        protocol_version: APP_PROTOCOL_VERSION,
                        node_id: self.ep.node_id.to_string(),
                        max_frame_bytes: APP_MAX_FRAME as u64,
                    }));
                    ControlFlow::Continue(())
                }
                Err(AuthError::NotJoined) => {
                    self.send_error(
                        None,
                        ErrorCode::CoordinatorUnavailable,
                        "this worker has not joined the cluster yet; retry shortly",
                    );
                    ControlFlow::Break(())
                }
                Err(AuthError::BadCredentials) => {
                    self.send_error(
                        None,
                        ErrorCode::BadCredentials,
                        format!("unknown app {:?} or wrong secret", hello.app_id),
                    );
                    ControlFlow::Break(())
                }
            };
        };
        match request {
            AppRequest::Hello(_) => {
                self.send_error(
                    None,
                    ErrorCode::InvalidRequest,
                    "hello was already accepted on this connection",
                );
            }
            AppRequest::Allocate(req) => {
                let answer_bytes = OTHER_ANSWER_BYTES + req.count as usize * GRANT_ANSWER_BYTES;
                self.ep.scheduler.do_send(AllocateMsg {
                    app,
                    req,
                    reply: self.tx.clone(),
                    in_flight: InFlight::new(&self.state, answer_bytes),
                    received_at: std::time::Instant::now(),
                });
            }
            AppRequest::Promote(req) => {
                // Our own view of the container, if it is here: the coordinator learns of a
                // start only from the next heartbeat.
                let local_status = self
                    .ep
                    .node
                    .send(StatusOf(req.container_id))
                    .await
                    .ok()
                    .flatten();
                self.ep.scheduler.do_send(PromoteMsg {
                    app,
                    req,
                    reply: self.tx.clone(),
                    local_status,
                    in_flight: InFlight::new(&self.state, OTHER_ANSWER_BYTES),
                });
            }
            AppRequest::StartContainer(req) => {
                self.ep.node.do_send(StartMsg {
                    app,
                    req,
                    reply: self.tx.clone(),
                    in_flight: InFlight::new(&self.state, OTHER_ANSWER_BYTES),
                });
            }
            AppRequest::Release(req) => {
                match self
                    .ep
                    .node
                    .send(StopLocal {
                        app: app.clone(),
                        container_id: req.container_id,
                    })
                    .await
                {
                    Ok(Ok(())) => self.send(AppResponse::Ack(Ack {
                        request_id: req.request_id,
                    })),
                    Ok(Err(NodeError::Unknown(_))) => self.ep.scheduler.do_send(ReleaseRemote {
                        app,
                        req,
                        reply: self.tx.clone(),
                        in_flight: InFlight::new(&self.state, OTHER_ANSWER_BYTES),
                    }),
                    Ok(Err(e)) => self.send(error(
                        req.request_id,
                        ErrorCode::InvalidRequest,
                        e.to_string(),
                    )),
                    Err(e) => self.send(error(req.request_id, ErrorCode::Internal, e.to_string())),
                }
            }
            AppRequest::StopContainer(req) => {
                match self
                    .ep
                    .node
                    .send(StopLocal {
                        app,
                        container_id: req.container_id,
                    })
                    .await
                {
                    Ok(Ok(())) => self.send(AppResponse::Ack(Ack {
                        request_id: req.request_id,
                    })),
                    Ok(Err(e @ NodeError::Unknown(_))) => self.send(error(
                        req.request_id,
                        ErrorCode::UnknownContainer,
                        e.to_string(),
                    )),
                    Ok(Err(e)) => self.send(error(
                        req.request_id,
                        ErrorCode::InvalidRequest,
                        e.to_string(),
                    )),
                    Err(e) => self.send(error(req.request_id, ErrorCode::Internal, e.to_string())),
                }
            }
            AppRequest::Reserve(req) => self.reservation(
                app,
                req.request_id,
                ReservationOp::Reserve {
                    reservation_id: req.reservation_id,
                    definition: req.definition,
                },
                RESERVATION_ANSWER_BYTES,
            ),
            AppRequest::UpdateReservation(req) => self.reservation(
                app,
                req.request_id,
                ReservationOp::Update {
                    reservation_id: req.reservation_id,
                    definition: req.definition,
                },
                RESERVATION_ANSWER_BYTES,
            ),
            AppRequest::DeleteReservation(req) => self.reservation(
                app,
                req.request_id,
                ReservationOp::Delete {
                    reservation_id: req.reservation_id,
                },
                OTHER_ANSWER_BYTES,
            ),
            AppRequest::ListReservations(req) => self.reservation(
                app,
                req.request_id,
                ReservationOp::List,
                RESERVATION_ANSWER_BYTES,
            ),
            AppRequest::Explain(req) => self.ep.scheduler.do_send(ExplainMsg {
                app,
                request_id: req.request_id,
                job_id: req.job_id,
                reply: self.tx.clone(),
                in_flight: InFlight::new(&self.state, EXPLAIN_ANSWER_BYTES),
            }),
            AppRequest::Subscribe(req) => {
                self.ep.shared.subscribe(app, self.conn, self.tx.clone());
                self.send(AppResponse::Ack(Ack {
                    request_id: req.request_id,
                }));
            }
        }
        ControlFlow::Continue(())
    }
}

/// One answer as a frame. An answer that cannot be sent (over the frame cap, e.g. an `allocated`
/// with thousands of grants) becomes an `internal` error frame for the same request: the app is
/// told, never left waiting for an answer that was silently dropped.
pub fn encode_answer(msg: &AppResponse, limit: usize) -> Vec<u8> {
    match encode_frame(msg, limit) {
        Ok(frame) => frame,
        Err(e) => {
            tracing::error!("answer replaced by an error frame: {e}");
            let error = AppResponse::Error(ErrorFrame::new(
                msg.request_id(),
                ErrorCode::Internal,
                format!("the answer could not be sent ({e}); ask for fewer containers per request"),
            ));
            encode_frame(&error, limit).unwrap_or_default()
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
    mut close: tokio::sync::oneshot::Receiver<()>,
    state: Arc<ConnState>,
    stall_timeout: Duration,
) {
    let mut out = Vec::with_capacity(4096);
    let mut closing = false;
    while !closing {
        let first = tokio::select! {
            msg = rx.recv() => msg,
            _ = &mut close => {
                closing = true;
                rx.try_recv().ok()
            }
        };
        let Some(first) = first else { break };
        // Batch whatever is already queued into one write.
        out.clear();
        out.extend_from_slice(&first);
        // (When closing, everything: the loop ends after this write.)
        while closing || out.len() < 256 * 1024 {
            let Ok(next) = rx.try_recv() else { break };
            out.extend_from_slice(&next);
        }
        match tokio::time::timeout(stall_timeout, async {
            writer.write_all(&out).await?;
            writer.flush().await
        })
        .await
        {
            Ok(Ok(())) => state.written(out.len()),
            Ok(Err(e)) => {
                debug!(conn = state.conn, "app connection write error: {e}");
                state.close();
                return;
            }
            Err(_) => {
                tracing::warn!(
                    conn = state.conn,
                    "closing app connection {}: the client has not read its answers for {stall_timeout:?} ({} bytes waiting)",
                    state.conn,
                    state.queued_bytes()
                );
                state.close();
                return;
            }
        }
    }
    let _ = writer.shutdown().await;
}

/// The TLS acceptor of the app endpoint from a PEM certificate chain and key (TLS 1.2 and 1.3,
/// ring). Warns when the key file can be read by group or others.
pub fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::os::unix::fs::PermissionsExt;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .with_context(|| format!("reading the app TLS certificate {}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!(
            "the app TLS certificate file {} holds no certificate",
            cert.display()
        );
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the app TLS key {}", key.display()))?;
    if let Ok(meta) = std::fs::metadata(key)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            file = %key.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the app TLS key is readable by group or others: make it 0600"
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .with_context(|| {
            format!(
                "the app TLS key {} does not fit the certificate {}",
                key.display(),
                cert.display()
            )
        })?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::codec::{FrameDecoder, LENGTH_PREFIX};
    use scheduler_core::protocol::app::Ack;

    #[test]
    fn an_answer_over_the_frame_cap_becomes_an_error_for_its_request() {
        let big = AppResponse::Error(ErrorFrame::new(
            Some(42),
            ErrorCode::InvalidRequest,
            "x".repeat(4096),
        ));
        let frame = encode_answer(&big, 1024);
        assert!(frame.len() <= LENGTH_PREFIX + 1024);
        let mut decoder = FrameDecoder::new(1024);
        decoder.push(&frame);
        let AppResponse::Error(e) = decoder.next_message::<AppResponse>().unwrap().unwrap() else {
            panic!("an error frame");
        };
        assert_eq!(e.request_id, Some(42));
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(e.message.contains("exceeds the limit"), "{}", e.message);
        // Answers that fit go out unchanged.
        let ack = AppResponse::Ack(Ack { request_id: 7 });
        assert_eq!(encode_answer(&ack, 1024), encode_frame(&ack, 1024).unwrap());
    }
}

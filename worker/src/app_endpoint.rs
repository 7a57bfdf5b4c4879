//! The application endpoint: TCP and (optionally) a Unix socket speaking the app protocol
//! (`docs/protocol.md`). Each connection is a task on the actors' arbiter: it decodes frames,
//! checks the hello, hands requests to the actors with the connection's outbound channel, and a
//! writer task sends answers and events in order. A bad client gets a clear error frame (and
//! is disconnected where the protocol says so); nothing it sends affects other connections or
//! running containers.

use crate::node_actor::{NodeActor, StartMsg, StatusOf, StopLocal, error};
use crate::scheduler_actor::{
    AllocateMsg, ConnectionClosed, PromoteMsg, ReleaseRemote, SchedulerActor,
};
use crate::shared::{AuthError, ConnTx, Settle, Shared};
use actix::Addr;
use scheduler_core::codec::{APP_MAX_FRAME, CodecError, FrameDecoder, encode_frame, from_payload};
use scheduler_core::node::NodeError;
use scheduler_core::protocol::Envelope;
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, Ack, AppRequest, AppResponse, ErrorCode, ErrorFrame, Welcome,
};
use scheduler_core::protocol::limits::{HELLO_MAX_FRAME, validate_request};
use scheduler_core::{AppId, NodeId};
use std::rc::Rc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::{debug, info};

/// Frame types of the app protocol (to tell "unknown type" from "bad fields of a known type").
const KNOWN_TYPES: &[&str] = &[
    "hello",
    "allocate",
    "release",
    "promote",
    "start_container",
    "stop_container",
    "subscribe",
];

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
    pub shared: Rc<Shared>,
    pub scheduler: Addr<SchedulerActor>,
    pub node: Addr<NodeActor>,
}

impl Endpoint {
    /// Accept TCP connections forever.
    pub async fn serve_tcp(self, listener: tokio::net::TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    debug!(%peer, "app connection");
                    actix_rt::spawn(self.clone().serve(stream));
                }
                Err(e) => {
                    tracing::warn!("accepting an app connection failed: {e}");
                    tokio::task::yield_now().await;
                }
            }
        }
    }

    /// Accept Unix-socket connections forever.
    pub async fn serve_unix(self, listener: tokio::net::UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    actix_rt::spawn(self.clone().serve(stream));
                }
                Err(e) => {
                    tracing::warn!("accepting an app connection failed: {e}");
                    tokio::task::yield_now().await;
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

    /// Serve one connection until it ends.
    pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + 'static>(self, stream: S) {
        let (mut reader, writer) = tokio::io::split(stream);
        let (tx, rx) = mpsc::unbounded_channel();
        let (close_tx, close_rx) = tokio::sync::oneshot::channel();
        let writer_task = actix_rt::spawn(write_frames(writer, rx, close_rx));
        let conn = self.shared.new_connection_id();
        let mut session = Session {
            ep: &self,
            tx: tx.clone(),
            app: None,
            conn,
        };
        // A hello is small: until it is accepted, a frame may be at most HELLO_MAX_FRAME.
        let mut decoder = FrameDecoder::new(HELLO_MAX_FRAME);
        let mut buf = vec![0u8; 64 * 1024];
        'read: loop {
            match reader.read(&mut buf).await {
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
                        if session.handle_payload(&payload).await.is_break() {
                            break 'read;
                        }
                        if session.app.is_some() {
                            decoder.set_limit(APP_MAX_FRAME);
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
        // Actors may still hold this connection's sender (a pending GUARANTEED ask): close the
        // writer explicitly once what is queued now has been sent.
        let _ = close_tx.send(());
        let _ = writer_task.await;
    }
}

struct Session<'a> {
    ep: &'a Endpoint,
    tx: ConnTx,
    app: Option<AppId>,
    conn: u64,
}

use std::ops::ControlFlow;

impl Session<'_> {
    fn send(&self, r: AppResponse) {
        let _ = self.tx.send(r);
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
                if KNOWN_TYPES.contains(&envelope.kind.as_str()) {
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
                        KNOWN_TYPES.join(", ")
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
                self.ep.scheduler.do_send(AllocateMsg {
                    app,
                    req,
                    reply: self.tx.clone(),
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
                });
            }
            AppRequest::StartContainer(req) => {
                self.ep.node.do_send(StartMsg {
                    app,
                    req,
                    reply: self.tx.clone(),
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
fn encode_answer(msg: &AppResponse, limit: usize) -> Vec<u8> {
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
    mut rx: mpsc::UnboundedReceiver<AppResponse>,
    mut close: tokio::sync::oneshot::Receiver<()>,
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
        out.clear();
        // Batch whatever is already queued into one write.
        let mut next = Some(first);
        while let Some(msg) = next {
            out.extend_from_slice(&encode_answer(&msg, APP_MAX_FRAME));
            next = rx.try_recv().ok();
        }
        if writer.write_all(&out).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
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

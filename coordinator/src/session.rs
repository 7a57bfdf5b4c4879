//! One worker connection: the worker opens ONE bidirectional stream; a reader task decodes
//! length-prefixed msgpack frames with [`FrameDecoder`] and sends them to the coordinator actor,
//! a writer task encodes the actor's answers onto the send side. A malformed, oversized or
//! unknown frame closes that worker's connection with a log line and a QUIC close reason; the
//! process and every other session carry on.

use crate::coordinator_actor::{
    CoordinatorActor, FromWorker, JoinOutcome, SessionClosed, WorkerJoined,
};
use actix::Addr;
use scheduler_core::codec::{
    CLUSTER_MAX_FRAME, CodecError, FrameDecoder, encode_frame, from_payload,
};
use scheduler_core::protocol::Envelope;
use scheduler_core::protocol::cluster::{CoordinatorToWorker, JoinRejected, WorkerToCoordinator};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

pub type SessionId = u64;

/// Frames to one worker, in order.
pub type WorkerTx = mpsc::UnboundedSender<CoordinatorToWorker>;

/// QUIC application close codes the coordinator uses (documented in docs/design.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseCode {
    /// Orderly end (coordinator shutdown, stream finished).
    Normal = 0,
    /// The join was rejected (the `join_rejected` frame says why).
    JoinRejected = 1,
    /// Malformed, oversized or unexpected frame.
    ProtocolError = 2,
    /// A newer join of the same node id replaced this session.
    Replaced = 3,
    /// The node was declared lost (silent past the node timeout).
    NodeLost = 4,
}

impl CloseCode {
    pub fn close(self, connection: &quinn::Connection, reason: &str) {
        connection.close(quinn::VarInt::from_u32(self as u32), reason.as_bytes());
    }
}

/// How long a finished stream may take to be read by the worker before the connection is
/// closed anyway (so a `join_rejected` frame is delivered before the close).
const FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// Serve one incoming connection until it ends.
pub async fn serve_connection(
    incoming: quinn::Incoming,
    coordinator: Addr<CoordinatorActor>,
    session_id: SessionId,
) {
    let connection = match incoming.await {
        Ok(c) => c,
        Err(e) => {
            debug!("QUIC handshake failed: {e}");
            return;
        }
    };
    let peer = connection.remote_address();
    let (send, mut recv) = match connection.accept_bi().await {
        Ok(s) => s,
        Err(e) => {
            debug!(%peer, "connection ended before opening a stream: {e}");
            return;
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = actix_rt::spawn(write_frames(send, rx, peer));
    let mut decoder = FrameDecoder::new(CLUSTER_MAX_FRAME);
    let mut buf = vec![0u8; 64 * 1024];
    let mut joined: Option<String> = None;
    let mut close: Option<(CloseCode, String)> = None;
    'read: loop {
        match recv.read(&mut buf).await {
            Ok(Some(n)) => decoder.push(&buf[..n]),
            Ok(None) => {
                if let Err(e) = decoder.finish() {
                    warn!(%peer, node = ?joined, "worker stream ended: {e}");
                }
                break;
            }
            Err(e) => {
                debug!(%peer, node = ?joined, "worker stream ended: {e}");
                break;
            }
        }
        loop {
            let msg = match decoder.next_payload() {
                Ok(None) => break,
                Ok(Some(payload)) => match from_payload::<WorkerToCoordinator>(&payload) {
                    Ok(m) => m,
                    Err(e) => {
                        close = Some((CloseCode::ProtocolError, describe_bad_frame(&e, &payload)));
                        break 'read;
                    }
                },
                Err(e) => {
                    close = Some((CloseCode::ProtocolError, e.to_string()));
                    break 'read;
                }
            };
            if joined.is_none() {
                let WorkerToCoordinator::Join(join) = msg else {
                    close = Some((
                        CloseCode::ProtocolError,
                        "the first frame must be a join".into(),
                    ));
                    break 'read;
                };
                let outcome = coordinator
                    .send(WorkerJoined {
                        session_id,
                        join,
                        tx: tx.clone(),
                        connection: Some(connection.clone()),
                    })
                    .await;
                match outcome {
                    Ok(JoinOutcome::Accepted { node_id, .. }) => {
                        joined = Some(String::from(node_id))
                    }
                    Ok(JoinOutcome::Rejected { reason }) => {
                        info!(%peer, "join rejected: {reason}");
                        close = Some((CloseCode::JoinRejected, reason));
                        break 'read;
                    }
                    Err(e) => {
                        close = Some((CloseCode::Normal, format!("coordinator stopping: {e}")));
                        break 'read;
                    }
                }
            } else {
                coordinator.do_send(FromWorker { session_id, msg });
            }
        }
    }
    if joined.is_some() {
        coordinator.do_send(SessionClosed { session_id });
    }
    if let Some((CloseCode::ProtocolError, reason)) = &close {
        warn!(%peer, node = ?joined, "closing worker connection: {reason}");
        if joined.is_some() {
            // Nothing more to deliver: the close reason tells the worker what was wrong.
            CloseCode::ProtocolError.close(&connection, reason);
            return;
        }
        // Before a join the worker gets a join_rejected frame first.
        let _ = tx.send(CoordinatorToWorker::JoinRejected(JoinRejected {
            reason: reason.clone(),
        }));
    }
    drop(tx);
    // The writer ends once the actor's copy of the sender is gone too (SessionClosed).
    let _ = tokio::time::timeout(FLUSH_LIMIT, writer).await;
    let (code, reason) = close.unwrap_or((CloseCode::Normal, "stream finished".into()));
    code.close(&connection, &reason);
}

/// Name what was wrong with a frame that does not decode: an unknown type, or bad msgpack.
fn describe_bad_frame(e: &CodecError, payload: &[u8]) -> String {
    match from_payload::<Envelope>(payload) {
        Ok(env) if !KNOWN_TYPES.contains(&env.kind.as_str()) => {
            format!("unknown message type {:?}", env.kind)
        }
        Ok(env) => format!("malformed {} frame: {e}", env.kind),
        Err(_) => e.to_string(),
    }
}

const KNOWN_TYPES: [&str; 6] = [
    "join",
    "heartbeat",
    "allocate_guaranteed",
    "promote",
    "release",
    "promotion_applied",
];

async fn write_frames(
    mut send: quinn::SendStream,
    mut rx: mpsc::UnboundedReceiver<CoordinatorToWorker>,
    peer: SocketAddr,
) {
    let mut out = Vec::new();
    while let Some(first) = rx.recv().await {
        out.clear();
        let mut next = Some(first);
        // Batch what is queued into one write.
        while let Some(msg) = next {
            match encode_frame(&msg, CLUSTER_MAX_FRAME) {
                Ok(bytes) => out.extend_from_slice(&bytes),
                Err(e) => warn!(%peer, "frame to worker dropped: {e}"),
            }
            next = rx.try_recv().ok();
        }
        if let Err(e) = send.write_all(&out).await {
            debug!(%peer, "cannot write to worker: {e}");
            return;
        }
    }
    let _ = send.finish();
    let _ = send.stopped().await;
}

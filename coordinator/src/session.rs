//! One worker connection: the worker opens ONE bidirectional stream; a reader task decodes
//! length-prefixed msgpack frames with [`FrameDecoder`] and sends them to the coordinator actor,
//! a writer task encodes the actor's answers onto the send side. A malformed, oversized or
//! unknown frame closes that worker's connection with a log line and a QUIC close reason; the
//! process and every other session carry on.

use crate::coordinator_actor::{
    CoordinatorActor, FromWorker, JoinOutcome, SessionClosed, WorkerJoined,
};
use crate::metrics::CoordinatorMetrics;
use actix::Addr;
use scheduler_core::codec::{
    CLUSTER_MAX_FRAME, CodecError, FrameDecoder, LENGTH_PREFIX, encode_frame_into, from_payload,
};
use scheduler_core::join_pacing::JoinPacing;
use scheduler_core::protocol::Envelope;
use scheduler_core::protocol::cluster::{
    CoordinatorToWorker, EncodedMembership, EncodedTopK, HeartbeatAck, JoinAccepted, JoinRejected,
    WorkerToCoordinator, encode_heartbeat_ack_frame_into, encode_join_accepted_frame_into,
};
use scheduler_core::protocol::limits::{JOIN_PREFIX_BYTES, join_token_in_prefix};
use std::collections::HashMap;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

pub type SessionId = u64;

/// Frames queued to one worker at most. A worker sends one heartbeat per interval and gets one
/// answer; grants and notices add a few frames each. A worker that stops reading (paused, or
/// hostile) while its requests keep coming would otherwise grow this queue without bound.
pub const WORKER_QUEUE_FRAMES: usize = 4096;

/// Frames of one worker handed to the coordinator actor and not yet handled, at most. Its
/// heartbeats come one per interval; a worker forwarding many apps' asks pipelines more, and a
/// worker flooding frames waits here (then on QUIC flow control) instead of filling the actor's
/// mailbox, which has no bound of its own for `do_send`.
pub const WORKER_FRAMES_IN_FLIGHT: usize = 256;

/// Frames to one worker, in order, through a bounded queue. When the queue is full the worker
/// is not reading: its connection is closed (close code 2, the reason says so) and the frame
/// is dropped; the session then ends as any lost connection does.
#[derive(Clone, Debug)]
pub struct WorkerTx {
    tx: mpsc::Sender<ToWorker>,
    connection: Option<quinn::Connection>,
    /// Set by the first send that found the queue full (shared by the clones): the warning and
    /// the close happen once, not for every frame sent until the session ends.
    overflowed: Arc<AtomicBool>,
}

/// A frame queued for a worker's writer.
#[derive(Debug)]
pub enum ToWorker {
    Frame(CoordinatorToWorker),
    /// A heartbeat answer whose view's top-k is the round's list, encoded once and shared by
    /// every answer of the round ([`encode_heartbeat_ack_frame_into`]; `ack.view.top_k` is
    /// left empty and not read).
    ///
    /// With `membership`, the view's directory and delta are likewise shared bytes, the same for
    /// every answer that brings a worker from the same version to the current one.
    HeartbeatAck {
        ack: HeartbeatAck,
        top_k: EncodedTopK,
        membership: Option<EncodedMembership>,
    },
    /// A join answer whose view's directory is the shared whole directory
    /// ([`encode_join_accepted_frame_into`]; `accepted.view.directory` is left empty and not
    /// read).
    JoinAccepted {
        accepted: Box<JoinAccepted>,
        membership: EncodedMembership,
    },
}

/// The worker's session has ended (or was closed for not reading): the frame was not queued.
#[derive(Debug, PartialEq, Eq)]
pub struct WorkerGone;

impl WorkerTx {
    /// A queue of `capacity` frames; `connection` is closed when it overflows.
    pub fn bounded(
        capacity: usize,
        connection: Option<quinn::Connection>,
    ) -> (WorkerTx, mpsc::Receiver<ToWorker>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            WorkerTx {
                tx,
                connection,
                overflowed: Arc::new(AtomicBool::new(false)),
            },
            rx,
        )
    }

    /// Queue a frame for the worker without waiting.
    pub fn send(&self, msg: CoordinatorToWorker) -> Result<(), WorkerGone> {
        self.queue(ToWorker::Frame(msg))
    }

    /// Queue a heartbeat answer whose view carries the round's shared, encoded top-k.
    pub fn send_heartbeat_ack(
        &self,
        ack: HeartbeatAck,
        top_k: EncodedTopK,
        membership: Option<EncodedMembership>,
    ) -> Result<(), WorkerGone> {
        self.queue(ToWorker::HeartbeatAck {
            ack,
            top_k,
            membership,
        })
    }

    /// Queue a join answer whose view's directory is `membership`'s whole directory.
    pub fn send_join_accepted(
        &self,
        accepted: JoinAccepted,
        membership: EncodedMembership,
    ) -> Result<(), WorkerGone> {
        self.queue(ToWorker::JoinAccepted {
            accepted: Box::new(accepted),
            membership,
        })
    }

    fn queue(&self, msg: ToWorker) -> Result<(), WorkerGone> {
        match self.tx.try_send(msg) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                if self.overflowed.swap(true, Ordering::Relaxed) {
                    return Err(WorkerGone);
                }
                let reason = format!(
                    "the worker does not read its answers: {} frames queued",
                    self.tx.max_capacity()
                );
                warn!("closing worker connection: {reason}");
                if let Some(connection) = &self.connection {
                    CloseCode::ProtocolError.close(connection, &reason);
                }
                Err(WorkerGone)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(WorkerGone),
        }
    }
}

/// QUIC application close codes the coordinator uses (documented in docs/design.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseCode {
    /// Orderly end (coordinator shutdown, stream finished).
    Normal = 0,
    /// The join was rejected (the `join_rejected` frame says why; no frame when the node's loss
    /// is not stored yet, so the worker joins again later).
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

/// What a connection may cost before its `join` is accepted: a deadline, caps on such
/// connections in all and per source address, and (with [`JOIN_PREFIX_BYTES`]) how much of a
/// frame is buffered before the join token in it has been checked. And the join answers in
/// delivery at once, by their bytes ([`scheduler_core::join_pacing`],
/// [`JoinGate::answer_permit`]).
pub struct JoinGate {
    /// SHA-256 (hex) of the join token, as the store keeps it.
    join_token_sha256: String,
    timeout: Duration,
    max_total: usize,
    max_per_source: usize,
    pacing: JoinPacing,
    /// Bytes of the last join answer's directory (most of an answer): the next answers' size,
    /// near enough (the directory grows by one entry per join).
    last_answer_bytes: AtomicU64,
    metrics: Arc<CoordinatorMetrics>,
    state: Mutex<GateState>,
    /// Joins answered and not yet done (answer not yet delivered), and joins waiting for
    /// their turn to be answered.
    answers: Mutex<AnswerState>,
    /// Woken, one waiter at a time in arrival order, when an answer is done.
    answer_done: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct AnswerState {
    in_progress: usize,
    waiting: usize,
}

#[derive(Default)]
struct GateState {
    total: usize,
    per_source: HashMap<IpAddr, usize>,
    refused_since_log: u64,
    last_log: Option<std::time::Instant>,
}

/// A connection counted as not joined until dropped or [`Unjoined::joined`].
pub struct Unjoined {
    gate: Arc<JoinGate>,
    source: IpAddr,
    counted: bool,
}

impl Unjoined {
    /// The join was accepted: the connection no longer counts against the pre-join caps.
    pub fn joined(&mut self) {
        if std::mem::take(&mut self.counted) {
            let mut st = self.gate.state.lock().unwrap_or_else(|e| e.into_inner());
            st.total -= 1;
            if let Some(n) = st.per_source.get_mut(&self.source) {
                *n -= 1;
                if *n == 0 {
                    st.per_source.remove(&self.source);
                }
            }
        }
    }
}

impl Drop for Unjoined {
    fn drop(&mut self) {
        self.joined();
    }
}

/// A join counted as waiting for its turn until this is dropped (its turn came, or the session
/// gave up waiting).
struct WaitingForAnswer<'a> {
    gate: &'a JoinGate,
}

impl Drop for WaitingForAnswer<'_> {
    fn drop(&mut self) {
        let mut answers = self.gate.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers.waiting -= 1;
        self.gate.metrics.joins_waiting.dec();
    }
}

/// One join's turn to be answered, held until its answer is delivered (the worker's first
/// frame after the join, which it sends only once it has read the whole answer) or the session
/// ends.
pub struct AnswerPermit {
    gate: Arc<JoinGate>,
}

impl Drop for AnswerPermit {
    fn drop(&mut self) {
        let mut answers = self.gate.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers.in_progress -= 1;
        drop(answers);
        self.gate.answer_done.notify_one();
    }
}

impl JoinGate {
    pub fn new(
        join_token_sha256: String,
        timeout: Duration,
        max_total: usize,
        max_per_source: usize,
        pacing: JoinPacing,
        metrics: Arc<CoordinatorMetrics>,
    ) -> Arc<JoinGate> {
        Arc::new(JoinGate {
            join_token_sha256,
            timeout,
            max_total,
            max_per_source,
            pacing,
            last_answer_bytes: AtomicU64::new(0),
            metrics,
            state: Mutex::default(),
            answers: Mutex::default(),
            answer_done: tokio::sync::Notify::new(),
        })
    }

    /// Count a new connection from `source`, or refuse it (logged at most every 10 s).
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Unjoined> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let from_source = st.per_source.get(&source).copied().unwrap_or(0);
        let refusal = if st.total >= self.max_total {
            Some(format!(
                "{} connections are not joined yet, the maximum (max_unjoined_connections)",
                st.total
            ))
        } else if from_source >= self.max_per_source {
            Some(format!(
                "{source} has {from_source} connections not joined yet, the maximum (max_unjoined_per_source)"
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            st.refused_since_log += 1;
            let now = std::time::Instant::now();
            if st
                .last_log
                .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(10))
            {
                warn!(
                    "refused {} QUIC connection(s) before the handshake since the last report: {why}",
                    st.refused_since_log
                );
                st.refused_since_log = 0;
                st.last_log = Some(now);
            }
            return None;
        }
        st.total += 1;
        *st.per_source.entry(source).or_default() += 1;
        Some(Unjoined {
            gate: self.clone(),
            source,
            counted: true,
        })
    }

    /// Connections not joined yet (tests, diagnostics).
    pub fn unjoined(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Join answers in delivery, and joins waiting for their turn (tests, diagnostics).
    pub fn answers(&self) -> (usize, usize) {
        let a = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        (a.in_progress, a.waiting)
    }

    /// Wait for this join's turn to be answered: while as many answers are in delivery as
    /// [`JoinPacing::admits`], joins wait here in arrival order (the connection stays counted as
    /// not joined, so the caps above bound the waiting).
    pub async fn answer_permit(self: &Arc<Self>) -> AnswerPermit {
        let mut waiting: Option<WaitingForAnswer<'_>> = None;
        loop {
            // Registered before the check, so a place freed in between is not missed.
            let notified = self.answer_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
                let answer_bytes = self.last_answer_bytes.load(Ordering::Relaxed);
                if self.pacing.admits(answers.in_progress, answer_bytes) {
                    answers.in_progress += 1;
                    drop(answers);
                    drop(waiting);
                    return AnswerPermit { gate: self.clone() };
                }
                if waiting.is_none() {
                    answers.waiting += 1;
                    self.metrics.joins_paced.inc();
                    self.metrics.joins_waiting.inc();
                    waiting = Some(WaitingForAnswer { gate: self });
                }
            }
            // Woken for a freed place; if the limit fell meanwhile (bigger answers) and this
            // join does not get it, the next answer done wakes a waiter again.
            notified.await;
        }
    }

    fn token_matches(&self, token: &str) -> bool {
        // Hashes of equal length, compared in constant time.
        let offered = crate::store::join_token_hash(token);
        let (a, b) = (offered.as_bytes(), self.join_token_sha256.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

/// Before the join: is the frame being received acceptable so far? `Ok(true)` once a frame
/// larger than [`JOIN_PREFIX_BYTES`] has shown the right join token in its first bytes (the
/// rest may then be read), `Ok(false)` to keep reading, `Err` to reject.
fn check_join_prefix(gate: &JoinGate, buffered: &[u8]) -> Result<bool, String> {
    if buffered.len() < LENGTH_PREFIX {
        return Ok(false);
    }
    let announced =
        u32::from_be_bytes([buffered[0], buffered[1], buffered[2], buffered[3]]) as usize;
    if announced <= JOIN_PREFIX_BYTES {
        // Small: it is decoded whole and the coordinator checks it.
        return Ok(false);
    }
    let body = &buffered[LENGTH_PREFIX..];
    if body.len() < JOIN_PREFIX_BYTES {
        return Ok(false);
    }
    match join_token_in_prefix(&body[..JOIN_PREFIX_BYTES]) {
        Some(token) if gate.token_matches(&token) => Ok(true),
        Some(_) => Err("bad join token: it does not match the cluster's join-token".into()),
        None => Err(format!(
            "a first frame of {announced} bytes must be a join carrying the join token within its first {JOIN_PREFIX_BYTES} bytes"
        )),
    }
}

/// Serve one incoming connection until it ends. `unjoined` counts it against the pre-join caps
/// until its join is accepted; the join waits for its turn to be answered
/// ([`JoinGate::answer_permit`]) and holds it until the answer is delivered.
pub async fn serve_connection(
    incoming: quinn::Incoming,
    coordinator: Addr<CoordinatorActor>,
    session_id: SessionId,
    gate: Arc<JoinGate>,
    mut unjoined: Unjoined,
) {
    let deadline = tokio::time::Instant::now() + gate.timeout;
    let connection = match tokio::time::timeout_at(deadline, incoming).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            debug!("QUIC handshake failed: {e}");
            return;
        }
        Err(_) => {
            debug!("QUIC handshake not done within the join timeout");
            return;
        }
    };
    let peer = connection.remote_address();
    let (send, mut recv) = match tokio::time::timeout_at(deadline, connection.accept_bi()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            debug!(%peer, "connection ended before opening a stream: {e}");
            return;
        }
        Err(_) => {
            info!(%peer, "no stream within the join timeout; closing");
            CloseCode::ProtocolError.close(
                &connection,
                &format!("no join within {:?} of connecting", gate.timeout),
            );
            return;
        }
    };
    let (tx, rx) = WorkerTx::bounded(WORKER_QUEUE_FRAMES, Some(connection.clone()));
    let writer = actix_rt::spawn(write_frames(send, rx, peer));
    let mut decoder = FrameDecoder::new(CLUSTER_MAX_FRAME);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(WORKER_FRAMES_IN_FLIGHT));
    let mut joined: Option<String> = None;
    // Before the join, a frame over JOIN_PREFIX_BYTES is read on only once its first bytes
    // carried the join token.
    let mut token_seen = false;
    let mut answer_permit: Option<AnswerPermit> = None;
    let mut close: Option<(CloseCode, String)> = None;
    'read: loop {
        // Before the join token is known, buffer at most the length prefix + JOIN_PREFIX_BYTES.
        let room = if joined.is_none() && !token_seen {
            (LENGTH_PREFIX + JOIN_PREFIX_BYTES)
                .saturating_sub(decoder.buffered().len())
                .clamp(1, READ_CHUNK_BYTES)
        } else {
            READ_CHUNK_BYTES
        };
        // Chunks are taken from QUIC's own buffers (no per-session read buffer: a coordinator
        // holds one session per node).
        let read = if joined.is_none() {
            tokio::select! {
                r = recv.read_chunk(room, true) => r,
                _ = tokio::time::sleep_until(deadline) => {
                    close = Some((
                        CloseCode::ProtocolError,
                        format!("no join within {:?} of connecting", gate.timeout),
                    ));
                    break 'read;
                }
            }
        } else {
            recv.read_chunk(READ_CHUNK_BYTES, true).await
        };
        match read {
            Ok(Some(chunk)) => {
                decoder.push(&chunk.bytes);
                if joined.is_none() && !token_seen {
                    match check_join_prefix(&gate, decoder.buffered()) {
                        Ok(seen) => token_seen = seen,
                        Err(reason) => {
                            close = Some((CloseCode::ProtocolError, reason));
                            break 'read;
                        }
                    }
                }
            }
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
            // Decoded where it lies in the decoder (no copy of the payload per frame).
            let decoded = decoder.with_next_payload(|payload| {
                from_payload::<WorkerToCoordinator>(payload)
                    .map_err(|e| describe_bad_frame(&e, payload))
            });
            let msg = match decoded {
                Ok(None) => break,
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(why))) => {
                    close = Some((CloseCode::ProtocolError, why));
                    break 'read;
                }
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
                // The answer (the whole directory) is most of a join's cost: joins are
                // answered in turns, as many at once as the bytes of answers in delivery allow.
                // A join without the cluster's token is refused by the actor at once: it never
                // waits for, or holds, a turn.
                if gate.token_matches(&join.join_token) {
                    let permit = tokio::select! {
                        p = gate.answer_permit() => p,
                        _ = tokio::time::sleep_until(deadline) => {
                            // Not the worker's fault: no join_rejected (that would be final for a
                            // starting worker), the close says why and the worker re-joins.
                            close = Some((
                                CloseCode::Normal,
                                format!(
                                    "join not answered within {:?} of connecting: it waited for its turn (join pacing)",
                                    gate.timeout
                                ),
                            ));
                            break 'read;
                        }
                        _ = connection.closed() => break 'read,
                    };
                    answer_permit = Some(permit);
                }
                let outcome = coordinator
                    .send(WorkerJoined {
                        session_id,
                        join,
                        tx: tx.clone(),
                        connection: Some(connection.clone()),
                    })
                    .await;
                match outcome {
                    Ok(JoinOutcome::Accepted {
                        node_id,
                        answer_bytes,
                        ..
                    }) => {
                        tracing::Span::current().record("node", node_id.as_str());
                        joined = Some(String::from(node_id));
                        unjoined.joined();
                        gate.last_answer_bytes
                            .store(answer_bytes, Ordering::Relaxed);
                    }
                    Ok(JoinOutcome::Rejected { reason }) => {
                        // The turn is the next join's now, not after this session's flush.
                        answer_permit.take();
                        info!(%peer, "join rejected: {reason}");
                        close = Some((CloseCode::JoinRejected, reason));
                        break 'read;
                    }
                    Err(e) => {
                        answer_permit.take();
                        close = Some((CloseCode::Normal, format!("coordinator stopping: {e}")));
                        break 'read;
                    }
                }
            } else {
                // The worker reads its whole join answer before it sends anything more: the
                // answer is delivered, the next join's turn.
                answer_permit.take();
                // Wait for a place before handing the frame on: the actor's mailbox does not
                // bound what one session queues, this does (and QUIC flow control then slows
                // the worker down).
                let Ok(in_flight) = in_flight.clone().acquire_owned().await else {
                    break 'read;
                };
                coordinator.do_send(FromWorker {
                    session_id,
                    msg,
                    in_flight,
                    received: std::time::Instant::now(),
                });
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

const KNOWN_TYPES: [&str; 7] = [
    "join",
    "heartbeat",
    "allocate_guaranteed",
    "promote",
    "release",
    "promotion_applied",
    "cancel_allocate",
];

/// Most bytes taken from the stream per read.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Capacity the writer keeps between batches: one whole-directory answer must not stay
/// allocated for the session's life (one writer per node).
const WRITER_RETAINED_CAPACITY: usize = 16 * 1024;

/// Frames queued for a worker are batched into one write until the batch reaches this many
/// bytes (the frame that passes it is the batch's last).
const WRITER_BATCH_BYTES: usize = 64 * 1024;

async fn write_frames(
    mut send: quinn::SendStream,
    mut rx: mpsc::Receiver<ToWorker>,
    peer: SocketAddr,
) {
    let mut out = Vec::new();
    while let Some(first) = rx.recv().await {
        out.clear();
        let mut next = Some(first);
        // Batch what is queued into one write, up to `WRITER_BATCH_BYTES`: while the worker
        // lags, its queue can hold thousands of answers, and batching them all made one buffer
        // of all of them per session (issue 17: most of the coordinator's 9.8 GB in a
        // 5,000-node join storm was these buffers, by page-fault profile).
        while let Some(msg) = next {
            let encoded = match &msg {
                ToWorker::Frame(frame) => encode_frame_into(frame, CLUSTER_MAX_FRAME, &mut out),
                ToWorker::HeartbeatAck {
                    ack,
                    top_k,
                    membership,
                } => encode_heartbeat_ack_frame_into(
                    ack,
                    top_k,
                    membership.as_ref(),
                    CLUSTER_MAX_FRAME,
                    &mut out,
                ),
                ToWorker::JoinAccepted {
                    accepted,
                    membership,
                } => encode_join_accepted_frame_into(
                    accepted,
                    membership,
                    CLUSTER_MAX_FRAME,
                    &mut out,
                ),
            };
            if let Err(e) = encoded {
                warn!(%peer, "frame to worker dropped: {e}");
            }
            next = if out.len() < WRITER_BATCH_BYTES {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        if let Err(e) = send.write_all(&out).await {
            debug!(%peer, "cannot write to worker: {e}");
            return;
        }
        if out.capacity() > WRITER_RETAINED_CAPACITY {
            out = Vec::new();
        }
    }
    let _ = send.finish();
    let _ = send.stopped().await;
}

#[cfg(test)]
mod worker_tx_tests {
    use super::*;

    fn frame() -> CoordinatorToWorker {
        CoordinatorToWorker::JoinRejected(JoinRejected {
            reason: "test".into(),
        })
    }

    #[test]
    fn a_full_queue_refuses_frames_and_marks_every_clone_overflowed_once() {
        let (tx, mut rx) = WorkerTx::bounded(1, None);
        let clone = tx.clone();
        assert_eq!(tx.send(frame()), Ok(()));
        assert_eq!(tx.send(frame()), Err(WorkerGone));
        assert!(clone.overflowed.load(Ordering::Relaxed), "shared by clones");
        assert_eq!(clone.send(frame()), Err(WorkerGone));
        assert!(
            rx.try_recv().is_ok(),
            "the frame queued before the overflow stays"
        );
        assert!(rx.try_recv().is_err(), "nothing past the bound was queued");
    }
}

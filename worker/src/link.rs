//! The worker's link to the coordinator: QUIC (quinn + rustls with ring) trusting only the
//! cluster CA (pinned), server name `hybrid-coordinator`, ONE bidirectional stream carrying
//! length-prefixed msgpack frames. Joins, dispatches the coordinator's frames to the actors,
//! writes what the actors queue, and re-joins with backoff when the coordinator goes away
//! (containers keep running meanwhile).

use crate::link_queues::{NodeInbox, Outbox, Outgoing};
use crate::node_actor::{
    ApplyPromotionMsg, CoordinatorCommand, FromCoordinator, HintsReady, NodeActor, NodeHints,
    NodeJoined, ResizeMsg, Statuses, StopOnBehalf,
};
use crate::scheduler_actor::{
    CoordinatorAnswer, CoordinatorUnresponsive, LinkDown, SchedulerActor, SchedulerJoined,
    ViewUpdate,
};
use crate::shared::Shared;
use actix::Addr;
use anyhow::{Context, bail};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use scheduler_core::codec::{CLUSTER_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::distributed::replacement_wait_bound_ms_by_slot;
use scheduler_core::liveness::{
    JoinAnswerWait, LinkLiveness, REJOIN_BACKOFF_START, jittered_rejoin_delay, next_rejoin_backoff,
};
use scheduler_core::protocol::cluster::{
    CLUSTER_PROTOCOL_VERSION, CoordinatorToWorker, Join, JoinAccepted, WorkerToCoordinator,
};
use scheduler_core::{AppId, NodeId, Resources, Time};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::lookup_host;
use tracing::{info, warn};

/// The DNS name in the coordinator's certificate; always used as the TLS server name.
pub const SERVER_NAME: &str = "hybrid-coordinator";

/// What the worker tells the coordinator about itself.
#[derive(Clone, Debug)]
pub struct Identity {
    pub node_id: NodeId,
    pub rack: String,
    /// `--attribute KEY=VALUE` (3Sigma's node constraints), sent with every join.
    pub attributes: std::collections::BTreeMap<String, String>,
    pub capacity: Resources,
    pub app_endpoint: String,
    pub join_token: String,
    pub coordinator: String,
}

/// A quinn client config that trusts only `ca_pem`.
pub fn client_config(ca_pem: &Path) -> anyhow::Result<quinn::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_pem)
        .with_context(|| format!("reading cluster CA {}", ca_pem.display()))?;
    for cert in certs {
        let cert = cert.with_context(|| format!("parsing cluster CA {}", ca_pem.display()))?;
        roots.add(cert).with_context(|| {
            format!(
                "cluster CA {} is not a usable certificate",
                ca_pem.display()
            )
        })?;
    }
    if roots.is_empty() {
        bail!("cluster CA file {} holds no certificate", ca_pem.display());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let crypto = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(crypto)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    // Keep-alives every second and a 15 s idle timeout, a backstop behind the link's own
    // give-up limit (ten heartbeats of silence, floor 6 s, scheduler_core::liveness): a
    // coordinator that stopped answering ends the session by that limit, a restarted one by a
    // stateless reset (`coordinator::datadir::quic_endpoint_config`). With a 6 s idle timeout
    // (until 2026-11-29) a 5-s coordinator pause at 5,000 fleet nodes ended 3,250 sessions:
    // the coordinator's catching up after the pause took the silence past 6 s. Negotiated: the
    // minimum of both ends applies to the coordinator too, and the keep-alives keep a live
    // worker in.
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    transport.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(Duration::from_secs(15))
            .expect("15 s is a valid idle timeout"),
    ));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// How often the session checks the coordinator's silence against the liveness limit.
const LIVENESS_CHECK_PERIOD: Duration = Duration::from_millis(100);

pub struct Link {
    pub identity: Identity,
    pub client: quinn::ClientConfig,
    pub shared: Arc<Shared>,
    pub scheduler: Addr<SchedulerActor>,
    pub node: Addr<NodeActor>,
    /// Frames the actors queued for the coordinator ([`crate::link_queues`]).
    pub outbox: Arc<Outbox>,
    /// The coordinator's hints and commands on their way to the node thread
    /// ([`crate::link_queues`]): at its bound the session stops reading the coordinator.
    pub inbox: Arc<NodeInbox>,
    /// The k this worker's scheduler places among, the coordinator's round interval and this
    /// node's slot, as of the session's join and the answers since: what the node's
    /// re-placement bound is made of
    /// ([`scheduler_core::distributed::replacement_wait_bound_ms_by_slot`]).
    pub placement_settings: PlacementSettings,
}

/// See [`Link::placement_settings`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PlacementSettings {
    pub top_k: usize,
    pub round_interval_ms: u64,
    /// This node's slot in the session's directory (the top-k names nodes by slot); kept for
    /// the session, since a node keeps its slot while it is joined.
    pub own_slot: Option<u32>,
}

/// Why a session ended.
enum SessionEnd {
    /// Rejected at join: retrying with the same settings cannot help.
    Rejected(String),
    /// Lost after (or while) joining: retry.
    Lost(String),
}

impl Link {
    /// Run forever: join, serve, re-join. `on_first_join` fires once.
    pub async fn run(
        mut self,
        mut on_first_join: Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    ) {
        let mut endpoint = match quinn::Endpoint::client("0.0.0.0:0".parse().expect("literal")) {
            Ok(e) => e,
            Err(e) => {
                if let Some(tx) = on_first_join.take() {
                    let _ = tx.send(Err(format!("cannot open a UDP socket for QUIC: {e}")));
                }
                return;
            }
        };
        endpoint.set_default_client_config(self.client.clone());
        let mut backoff = REJOIN_BACKOFF_START;
        // Each worker its own jitter: workers that lost the coordinator together re-join apart.
        let mut jitter = StdRng::seed_from_u64(rand::random());
        loop {
            let end = self.session(&endpoint, &mut on_first_join).await;
            let session_joined = self.shared.connected.get();
            self.shared.connected.set(false);
            self.scheduler.do_send(LinkDown);
            match &end {
                SessionEnd::Rejected(reason) => {
                    warn!("the coordinator rejected the join: {reason}");
                    if let Some(tx) = on_first_join.take() {
                        let _ = tx.send(Err(format!("join rejected: {reason}")));
                        return;
                    }
                }
                SessionEnd::Lost(_) => {}
            }
            if session_joined {
                backoff = REJOIN_BACKOFF_START;
            }
            let delay = jittered_rejoin_delay(backoff, &mut jitter);
            if let SessionEnd::Lost(reason) = &end {
                warn!("cluster link down: {reason}; re-joining in {delay:?}");
            }
            tokio::time::sleep(delay).await;
            backoff = next_rejoin_backoff(backoff, false);
        }
    }

    async fn session(
        &mut self,
        endpoint: &quinn::Endpoint,
        on_first_join: &mut Option<tokio::sync::oneshot::Sender<Result<(), String>>>,
    ) -> SessionEnd {
        // Anything queued while disconnected is stale (old heartbeats; forwarded requests were
        // failed), and so is what an overflowed outbox held: the join's report replaces it.
        self.outbox.clear();
        let containers = self.node.send(Statuses).await.unwrap_or_default();
        let joined_session = match join_cluster(endpoint, &self.identity, containers).await {
            Ok(s) => s,
            Err(JoinError::Rejected(reason)) => return SessionEnd::Rejected(reason),
            Err(JoinError::Lost(reason)) => return SessionEnd::Lost(reason),
        };
        let JoinedSession {
            connection: _connection,
            mut send,
            mut recv,
            mut decoder,
            accepted,
            answer_bytes,
            answer_wait,
        } = joined_session;
        info!(answer_bytes, answer_wait = ?answer_wait, "join answered");
        // A monotonic clock for the liveness rule (never the wall clock: it can jump).
        let epoch = tokio::time::Instant::now();
        let mono = || Time::from_micros(epoch.elapsed().as_micros() as u64);
        let mut liveness = LinkLiveness::after_join(
            mono(),
            Duration::from_millis(accepted.settings.heartbeat_interval_ms),
        );
        self.on_joined(accepted);
        if let Some(tx) = on_first_join.take() {
            let _ = tx.send(Ok(()));
        }
        let mut liveness_tick = tokio::time::interval(LIVENESS_CHECK_PERIOD);
        liveness_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let inbox = self.inbox.clone();
        loop {
            // Frames already buffered first, while the node thread has room for commands.
            let dispatched = dispatch_buffered(&mut decoder, &inbox, |frame| {
                liveness.heard(mono());
                self.dispatch(frame);
            });
            if let Err(e) = dispatched {
                return SessionEnd::Lost(e);
            }
            if !self.shared.coordinator_responsive.get() && liveness.responsive(mono()).is_ok() {
                self.shared.coordinator_responsive.set(true);
                info!("the coordinator answers again; GUARANTEED asks are forwarded again");
            }
            // At the bound, nothing more is read (QUIC flow control then holds the
            // coordinator) until the node thread has handled a command.
            let reading = inbox.has_room();
            tokio::select! {
                read = recv.read_chunk(READ_CHUNK_BYTES, true), if reading => match read {
                    Ok(Some(chunk)) => decoder.push(&chunk.bytes),
                    Ok(None) => return SessionEnd::Lost("the coordinator closed the stream".into()),
                    Err(e) => return SessionEnd::Lost(format!("reading from the coordinator: {e}")),
                },
                _ = inbox.wait_for_room(), if !reading => {}
                out = self.outbox.next() => match out {
                    Outgoing::Frame(msg) => {
                        // A paused coordinator stops granting flow-control credit: bound the
                        // write by the same silence limit instead of blocking the session.
                        match tokio::time::timeout(liveness.give_up_after(), write_frame(&mut send, &msg)).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => return SessionEnd::Lost(e),
                            Err(_) => {
                                return SessionEnd::Lost(format!(
                                    "a write to the coordinator did not complete within {:?}",
                                    liveness.give_up_after()
                                ));
                            }
                        }
                    }
                    Outgoing::Overflowed => {
                        return SessionEnd::Lost(format!(
                            "the outbox to the coordinator overflowed ({} frames): re-joining so the coordinator re-learns this node from the join",
                            crate::link_queues::OUTBOX_FRAMES
                        ));
                    }
                    Outgoing::Closed => return SessionEnd::Lost("worker shutting down".into()),
                },
                _ = liveness_tick.tick() => {
                    if let Err(dead) = liveness.check(mono()) {
                        if !inbox.has_room() {
                            return SessionEnd::Lost(format!(
                                "{dead}, while the link held back for the node thread ({} commands from the coordinator not handled)",
                                inbox.pending()
                            ));
                        }
                        return SessionEnd::Lost(dead.to_string());
                    }
                    // Unresponsive is not dead (scheduler_core::liveness): asks are refused
                    // at once, the session and its heartbeats go on.
                    if self.shared.coordinator_responsive.get()
                        && let Err(silent) = liveness.responsive(mono())
                    {
                        self.shared.coordinator_responsive.set(false);
                        warn!(
                            "{silent}: GUARANTEED asks are answered coordinator_unavailable until it answers again; the session is kept (given up after {:?})",
                            liveness.give_up_after()
                        );
                        self.scheduler.do_send(CoordinatorUnresponsive);
                    }
                }
            }
        }
    }

    fn on_joined(&mut self, acc: JoinAccepted) {
        // The join answer's directory holds this node's entry (protocol 9: only it, the
        // entries of its view's nodes come in `entries`).
        let own_slot = acc
            .view
            .directory
            .iter()
            .rev()
            .find(|e| e.node_id == self.identity.node_id)
            .map(|e| e.slot);
        self.placement_settings = PlacementSettings {
            top_k: acc.settings.top_k,
            round_interval_ms: acc.settings.heartbeat_interval_ms,
            own_slot,
        };
        info!(
            issuer = acc.issuer,
            nodes = acc.view.cluster.as_ref().map(|c| c.nodes),
            entries = acc.view.entries.len(),
            "joined the cluster"
        );
        self.shared.coordinator_responsive.set(true);
        self.shared.connected.set(true);
        self.shared.session.set(acc.issuer);
        self.scheduler.do_send(SchedulerJoined {
            issuer: acc.issuer,
            issuer_keys: acc.issuer_keys,
            apps: acc.apps,
            top_k: acc.settings.top_k,
            token_ttl_ms: acc.settings.token_ttl_ms,
            view: acc.view,
        });
        self.node.do_send(NodeJoined {
            node_secret: acc.node_secret,
            guaranteed_keys: acc.guaranteed_keys,
            heartbeat_interval: Duration::from_millis(acc.settings.heartbeat_interval_ms),
            lost_containers: acc.lost_containers,
        });
    }

    fn dispatch(&mut self, frame: CoordinatorToWorker) {
        match frame {
            CoordinatorToWorker::HeartbeatAck(ack) => {
                if let Some(k) = ack.top_k {
                    self.placement_settings.top_k = k;
                }
                let replacement_bound_ms = replacement_wait_bound_ms_by_slot(
                    &ack.view.top_k_slots,
                    self.placement_settings.own_slot,
                    self.placement_settings.top_k,
                    self.placement_settings.round_interval_ms,
                );
                // Coalesced: only the newest hints matter, at most one wake-up is queued.
                if self.inbox.put_hints(NodeHints {
                    shedding_threshold_ms: ack.shedding_threshold_ms,
                    replacement_bound_ms,
                    queueable_limit: ack.queueable_limit,
                    guaranteed_keys: ack.guaranteed_keys,
                }) {
                    self.node.do_send(HintsReady);
                }
                self.scheduler.do_send(ViewUpdate {
                    view: ack.view,
                    notices: ack.notices,
                    issuer_keys: ack.issuer_keys,
                    apps: ack.apps,
                    top_k: ack.top_k,
                    outstanding_elsewhere: ack.outstanding_elsewhere,
                });
            }
            CoordinatorToWorker::ApplyPromotion(p) => {
                self.command(CoordinatorCommand::Promote(ApplyPromotionMsg(p)))
            }
            CoordinatorToWorker::StopContainer(s) => {
                self.command(CoordinatorCommand::Stop(StopOnBehalf {
                    app: AppId::new(s.app_id),
                    container_id: s.container_id,
                    revoke_until_ms: s.revoke_until_ms,
                    shaped_preemption: s.shaped_preemption,
                }))
            }
            CoordinatorToWorker::ResizeContainer(r) => {
                self.command(CoordinatorCommand::Resize(ResizeMsg(r)))
            }
            other @ (CoordinatorToWorker::GuaranteedAllocated(_)
            | CoordinatorToWorker::PromoteResult(_)
            | CoordinatorToWorker::Released(_)
            | CoordinatorToWorker::RequestFailed(_)
            | CoordinatorToWorker::ReservationDone(_)
            | CoordinatorToWorker::ReservationNotice(_)
            | CoordinatorToWorker::Explained(_)) => {
                self.scheduler.do_send(CoordinatorAnswer(other))
            }
            CoordinatorToWorker::JoinAccepted(_) | CoordinatorToWorker::JoinRejected(_) => {
                warn!("unexpected join answer on an established session")
            }
        }
    }

    /// Hand a command to the node thread, counted in the inbox until handled.
    fn command(&mut self, command: CoordinatorCommand) {
        self.node.do_send(FromCoordinator {
            command,
            queued: self.inbox.admit(),
        });
    }
}

/// Dispatch the frames already buffered in `decoder`, in order, while `inbox` has room for
/// commands to the node thread; the rest stay buffered. Returns how many were dispatched.
pub fn dispatch_buffered(
    decoder: &mut FrameDecoder,
    inbox: &NodeInbox,
    mut dispatch: impl FnMut(CoordinatorToWorker),
) -> Result<usize, String> {
    let mut dispatched = 0;
    while inbox.has_room() {
        match decoder.next_message::<CoordinatorToWorker>() {
            Ok(Some(frame)) => {
                dispatch(frame);
                dispatched += 1;
            }
            Ok(None) => break,
            Err(e) => return Err(format!("bad frame from the coordinator: {e}")),
        }
    }
    Ok(dispatched)
}

/// A session that has joined: the QUIC connection, its one bidirectional stream, the frames
/// already read past the join answer, and the answer itself.
pub struct JoinedSession {
    /// Kept so the connection lives as long as the session.
    pub connection: quinn::Connection,
    pub send: quinn::SendStream,
    pub recv: quinn::RecvStream,
    pub decoder: FrameDecoder,
    pub accepted: JoinAccepted,
    /// Bytes read from the stream until the answer was whole (its frame, O(nodes) with the
    /// directory it carries).
    pub answer_bytes: u64,
    /// From the join written to its answer whole.
    pub answer_wait: Duration,
}

/// Why a join did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// The coordinator answered `join_rejected`: retrying with the same settings cannot help.
    Rejected(String),
    /// Connection, handshake or stream failure, or no answer within the join timeout: retryable.
    Lost(String),
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::Rejected(r) => write!(f, "join rejected: {r}"),
            JoinError::Lost(r) => write!(f, "join failed: {r}"),
        }
    }
}

/// The cluster side of a worker's session, without the node runtime: resolve the coordinator,
/// connect over `endpoint` (one endpoint can carry many sessions: `testbed fleet` runs thousands
/// of them on a few UDP sockets), open the stream, send `join` with `containers` and wait for
/// the answer while it keeps arriving ([`scheduler_core::liveness::JoinAnswerWait`]).
pub async fn join_cluster(
    endpoint: &quinn::Endpoint,
    identity: &Identity,
    containers: Vec<scheduler_core::node::ContainerStatus>,
) -> Result<JoinedSession, JoinError> {
    let addr = match lookup_host(&identity.coordinator)
        .await
        .map(|mut a| a.next())
    {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Err(JoinError::Lost(format!(
                "{} resolves to no address",
                identity.coordinator
            )));
        }
        Err(e) => {
            return Err(JoinError::Lost(format!(
                "cannot resolve {}: {e}",
                identity.coordinator
            )));
        }
    };
    let connecting = endpoint
        .connect(addr, SERVER_NAME)
        .map_err(|e| JoinError::Lost(format!("connect to {addr}: {e}")))?;
    let connection = connecting
        .await
        .map_err(|e| JoinError::Lost(format!("QUIC handshake with {addr}: {e}")))?;
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(|e| JoinError::Lost(format!("opening the stream: {e}")))?;
    let join = WorkerToCoordinator::Join(Join {
        protocol_version: CLUSTER_PROTOCOL_VERSION,
        join_token: identity.join_token.clone(),
        node_id: identity.node_id.clone(),
        rack: identity.rack.clone(),
        capacity: identity.capacity,
        app_endpoint: identity.app_endpoint.clone(),
        containers,
        attributes: identity.attributes.clone(),
    });
    write_frame(&mut send, &join)
        .await
        .map_err(JoinError::Lost)?;
    let mut decoder = FrameDecoder::new(CLUSTER_MAX_FRAME);
    // A monotonic clock for the wait (never the wall clock: it can jump).
    let epoch = tokio::time::Instant::now();
    let mono = || Time::from_micros(epoch.elapsed().as_micros() as u64);
    let mut wait = JoinAnswerWait::new(mono());
    let mut answer_bytes = 0u64;
    let answer = loop {
        if let Some(f) = buffered_frame(&mut decoder).map_err(JoinError::Lost)? {
            break f;
        }
        let left = wait
            .time_left(mono())
            .map_err(|e| JoinError::Lost(e.to_string()))?;
        // A timeout is checked against the limits at the top of the loop.
        if let Ok(read) = tokio::time::timeout(left, read_chunk_into(&mut recv, &mut decoder)).await
        {
            answer_bytes += read.map_err(JoinError::Lost)? as u64;
            wait.progress(mono());
        }
    };
    match answer {
        CoordinatorToWorker::JoinAccepted(accepted) => Ok(JoinedSession {
            connection,
            send,
            recv,
            decoder,
            accepted,
            answer_bytes,
            answer_wait: epoch.elapsed(),
        }),
        CoordinatorToWorker::JoinRejected(r) => Err(JoinError::Rejected(r.reason)),
        other => Err(JoinError::Lost(format!(
            "expected join_accepted, got {other:?}"
        ))),
    }
}

/// Most bytes taken from the stream per read (QUIC's own buffers are read in place, so a
/// session holds no read buffer of its own).
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// The next frame from the coordinator: one already buffered in `decoder`, else read chunks
/// until one is complete. Cancel-safe (a chunk read is taken whole or not at all).
pub async fn read_frame(
    recv: &mut quinn::RecvStream,
    decoder: &mut FrameDecoder,
) -> Result<CoordinatorToWorker, String> {
    loop {
        if let Some(f) = buffered_frame(decoder)? {
            return Ok(f);
        }
        read_chunk_into(recv, decoder).await?;
    }
}

/// A whole frame already buffered in `decoder`, if any.
fn buffered_frame(decoder: &mut FrameDecoder) -> Result<Option<CoordinatorToWorker>, String> {
    decoder
        .next_message::<CoordinatorToWorker>()
        .map_err(|e| format!("bad frame from the coordinator: {e}"))
}

/// Read one chunk of the stream into `decoder`; its length. Cancel-safe, as `read_chunk` is.
async fn read_chunk_into(
    recv: &mut quinn::RecvStream,
    decoder: &mut FrameDecoder,
) -> Result<usize, String> {
    match recv.read_chunk(READ_CHUNK_BYTES, true).await {
        Ok(Some(chunk)) => {
            decoder.push(&chunk.bytes);
            Ok(chunk.bytes.len())
        }
        Ok(None) => Err("the coordinator closed the stream".into()),
        Err(e) => Err(format!("reading from the coordinator: {e}")),
    }
}

/// Write one frame to the coordinator.
pub async fn write_frame(
    send: &mut quinn::SendStream,
    msg: &WorkerToCoordinator,
) -> Result<(), String> {
    let frame =
        encode_frame(msg, CLUSTER_MAX_FRAME).map_err(|e| format!("encoding a frame: {e}"))?;
    send.write_all(&frame)
        .await
        .map_err(|e| format!("writing to the coordinator: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link_queues::NODE_INBOX_COMMANDS;
    use scheduler_core::ContainerId;
    use scheduler_core::protocol::cluster::StopContainerOnNode;

    fn stop(i: u64) -> Vec<u8> {
        encode_frame(
            &CoordinatorToWorker::StopContainer(StopContainerOnNode {
                container_id: ContainerId(i),
                app_id: "demo".into(),
                revoke_until_ms: None,
                shaped_preemption: None,
            }),
            CLUSTER_MAX_FRAME,
        )
        .unwrap()
    }

    /// Issue 17: the link hands the node thread at most `NODE_INBOX_COMMANDS` coordinator
    /// commands it has not handled; the frames past that stay buffered (and the session reads
    /// no more) until the node thread handles some, and none is dropped or reordered.
    #[test]
    fn commands_past_the_node_inbox_bound_wait_in_order_and_none_is_dropped() {
        let metrics = Arc::new(crate::metrics::WorkerMetrics::default());
        let inbox = NodeInbox::new(NODE_INBOX_COMMANDS, metrics.clone());
        let mut decoder = FrameDecoder::new(CLUSTER_MAX_FRAME);
        let total = 3 * NODE_INBOX_COMMANDS as u64;
        for i in 0..total {
            decoder.push(&stop(i));
        }
        // The node thread handles nothing: each dispatched command keeps its permit.
        let mut at_node = Vec::new();
        let mut seen = Vec::new();
        let step = |decoder: &mut FrameDecoder, at_node: &mut Vec<_>, seen: &mut Vec<u64>| {
            dispatch_buffered(decoder, &inbox, |frame| {
                let CoordinatorToWorker::StopContainer(s) = frame else {
                    panic!("{frame:?}")
                };
                seen.push(s.container_id.0);
                at_node.push(inbox.admit());
            })
            .unwrap()
        };
        assert_eq!(
            step(&mut decoder, &mut at_node, &mut seen),
            NODE_INBOX_COMMANDS
        );
        assert!(!inbox.has_room());
        assert_eq!(metrics.link_queue_event_count("node_backpressure"), 1);
        // Still held back: nothing more is dispatched.
        assert_eq!(step(&mut decoder, &mut at_node, &mut seen), 0);
        // The node thread handles 10: 10 more go.
        at_node.drain(..10);
        assert_eq!(step(&mut decoder, &mut at_node, &mut seen), 10);
        // It catches up: everything goes, in order.
        let mut rounds = 0;
        while seen.len() < total as usize {
            at_node.clear();
            step(&mut decoder, &mut at_node, &mut seen);
            rounds += 1;
            assert!(rounds < 10);
        }
        assert_eq!(seen, (0..total).collect::<Vec<_>>());
        assert!(
            decoder
                .next_message::<CoordinatorToWorker>()
                .unwrap()
                .is_none()
        );
    }
}

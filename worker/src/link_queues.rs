//! The two queues between the cluster link (allocation thread) and the actors, each bounded by
//! count (issue 17; docs/design.md, "The worker's two threads"):
//!
//! - [`NodeInbox`], link → node thread: the coordinator's hints from each heartbeat answer are
//!   coalesced in one slot (only the newest matter), and its commands to the node (stops,
//!   resizes, promotions), which must not be lost, are counted until the node actor has handled
//!   them: at [`NODE_INBOX_COMMANDS`] the link stops reading the coordinator's stream (QUIC flow
//!   control then holds the coordinator, whose own per-worker queue is bounded) until the node
//!   thread catches up. Frames already read wait in the link's decoder meanwhile; if the
//!   session ends they are lost with it, as with any dropped connection.
//! - [`Outbox`], node thread and scheduler → link: at most one heartbeat is pending (a newer
//!   one takes its place in the queue and carries its started/finished reports), app requests
//!   and what apps cause in bulk (cancels of a closed connection's asks, releases of orphaned
//!   grants) are refused (`coordinator_unavailable`, retryable; best effort for the latter)
//!   past [`OUTBOX_REQUEST_FRAMES`], and anything else (`guaranteed_finished`, resize and
//!   promotion results) past [`OUTBOX_FRAMES`] overflows: the frame is not queued, and the link
//!   drops the session and re-joins, so the coordinator re-learns the node from the join's
//!   report (the containers it runs; a finished GUARANTEED container is not in it and its
//!   booking is freed) as after any lost connection. The outbox fills while writes to the
//!   coordinator are blocked (flow control; a write blocked past the link's silence limit ends
//!   the session anyway) or slower than what is queued.
//!
//! Every time a bound acts it is counted in `worker_link_queue_events_total`; the back-pressure
//! and the overflow are also logged, once per episode.

use crate::metrics::WorkerMetrics;
use crate::node_actor::NodeHints;
use scheduler_core::protocol::cluster::{Heartbeat, WorkerToCoordinator};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tracing::warn;

/// Coordinator commands (stops, resizes, promotions) handed to the node thread and not yet
/// handled, past which the link stops reading the coordinator's stream.
pub const NODE_INBOX_COMMANDS: usize = 1024;

/// Frames (besides the one pending heartbeat) the link may have queued for the coordinator;
/// one more overflows the outbox and drops the session.
pub const OUTBOX_FRAMES: usize = 4096;

/// Queued frames at which requests forwarded for apps (`allocate_guaranteed`, `promote`,
/// `release`, `reservation`) are refused instead, so apps cannot fill the outbox and make the
/// worker drop its session.
pub const OUTBOX_REQUEST_FRAMES: usize = OUTBOX_FRAMES / 2;

/// Lock a mutex of these queues: every update under one is a single push, pop or replace, so a
/// poisoned lock still holds consistent data.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Link → node thread. See the module doc.
pub struct NodeInbox {
    bound: usize,
    /// Commands handed to the node actor and not yet handled ([`InboxPermit`]s alive).
    pending: AtomicUsize,
    /// The link waits here for room.
    room: tokio::sync::Notify,
    /// The newest hints the node thread has not taken yet.
    hints: Mutex<Option<NodeHints>>,
    /// The link is holding back (logged once per episode).
    holding: AtomicBool,
    metrics: Arc<WorkerMetrics>,
}

/// One command counted in the [`NodeInbox`] until dropped (after the node actor handled it, or
/// with the actor's mailbox).
pub struct InboxPermit(Arc<NodeInbox>);

impl Drop for InboxPermit {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
        self.0.room.notify_one();
    }
}

impl NodeInbox {
    pub fn new(bound: usize, metrics: Arc<WorkerMetrics>) -> Arc<NodeInbox> {
        Arc::new(NodeInbox {
            bound: bound.max(1),
            pending: AtomicUsize::new(0),
            room: tokio::sync::Notify::new(),
            hints: Mutex::new(None),
            holding: AtomicBool::new(false),
            metrics,
        })
    }

    /// Commands handed over and not yet handled.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Whether one more command may be handed over now. The first time it may not (per
    /// episode) is logged and counted.
    pub fn has_room(&self) -> bool {
        let room = self.pending() < self.bound;
        if room {
            self.holding.store(false, Ordering::Relaxed);
        } else if !self.holding.swap(true, Ordering::Relaxed) {
            self.metrics.link_queue_event("node_backpressure");
            warn!(
                pending = self.pending(),
                bound = self.bound,
                "the node thread has not handled {} commands from the coordinator: the link stops reading the coordinator's stream until it does",
                self.bound
            );
        }
        room
    }

    /// Count one command handed to the node actor (the permit goes inside the message). The
    /// link checks [`NodeInbox::has_room`] first; it is the only one that admits.
    pub fn admit(self: &Arc<Self>) -> InboxPermit {
        self.pending.fetch_add(1, Ordering::AcqRel);
        InboxPermit(self.clone())
    }

    /// Wait until [`NodeInbox::has_room`] (cancel-safe).
    pub async fn wait_for_room(&self) {
        loop {
            let notified = self.room.notified();
            if self.pending() < self.bound {
                return;
            }
            notified.await;
        }
    }

    /// Keep `hints` for the node thread, replacing (and merging into) any it has not taken:
    /// true if the slot was empty, so the caller must wake the node actor
    /// ([`crate::node_actor::HintsReady`]); otherwise a wake-up is already queued.
    pub fn put_hints(&self, mut hints: NodeHints) -> bool {
        let mut slot = lock(&self.hints);
        match slot.take() {
            Some(older) => {
                // Keys come only when they changed: a replaced answer's keys are kept.
                if hints.guaranteed_keys.is_none() {
                    hints.guaranteed_keys = older.guaranteed_keys;
                }
                *slot = Some(hints);
                self.metrics.link_queue_event("hints_coalesced");
                false
            }
            None => {
                *slot = Some(hints);
                true
            }
        }
    }

    /// The newest hints, if any (node thread).
    pub fn take_hints(&self) -> Option<NodeHints> {
        lock(&self.hints).take()
    }
}

/// A frame the [`Outbox`] refused.
#[derive(Debug, PartialEq, Eq)]
pub enum OutboxFull {
    /// An app request past [`OUTBOX_REQUEST_FRAMES`]: answer the app `coordinator_unavailable`.
    Busy,
    /// Past [`OUTBOX_FRAMES`]: the session is being dropped.
    Overflowed,
}

/// What the link takes from the [`Outbox`].
#[derive(Debug)]
pub enum Outgoing {
    Frame(Box<WorkerToCoordinator>),
    /// The outbox overflowed: drop the session (and re-join).
    Overflowed,
    /// Every producer is gone (the worker is shutting down).
    Closed,
}

#[derive(Debug)]
enum Item {
    Frame(Box<WorkerToCoordinator>),
    /// The pending heartbeat's place in the order ([`OutboxState::heartbeat`]).
    Heartbeat,
}

#[derive(Debug, Default)]
struct OutboxState {
    /// In order; at most one [`Item::Heartbeat`], the pending heartbeat's place: present
    /// whenever `heartbeat` is, and also while a withdrawn heartbeat's replacement is being built
    /// (the replacement takes the same place; a place with no heartbeat is skipped).
    items: VecDeque<Item>,
    heartbeat: Option<Heartbeat>,
    /// Frames (not the heartbeat) in `items`.
    frames: usize,
    overflowed: bool,
}

/// Node thread and scheduler → link. See the module doc.
pub struct Outbox {
    bound: usize,
    request_bound: usize,
    state: Mutex<OutboxState>,
    /// The link (the only consumer) waits here.
    ready: tokio::sync::Notify,
    producers: AtomicUsize,
    metrics: Arc<WorkerMetrics>,
}

/// A producer's handle on the [`Outbox`]; when every handle is dropped the link's
/// [`Outbox::next`] returns [`Outgoing::Closed`].
pub struct OutboxTx(Arc<Outbox>);

impl Clone for OutboxTx {
    fn clone(&self) -> Self {
        self.0.producers.fetch_add(1, Ordering::AcqRel);
        OutboxTx(self.0.clone())
    }
}

impl Drop for OutboxTx {
    fn drop(&mut self) {
        if self.0.producers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.ready.notify_one();
        }
    }
}

impl std::ops::Deref for OutboxTx {
    type Target = Outbox;
    fn deref(&self) -> &Outbox {
        &self.0
    }
}

impl Outbox {
    /// An outbox of `bound` frames refusing app requests from `request_bound`, with its first
    /// producer handle.
    pub fn new(
        bound: usize,
        request_bound: usize,
        metrics: Arc<WorkerMetrics>,
    ) -> (Arc<Outbox>, OutboxTx) {
        let outbox = Arc::new(Outbox {
            bound: bound.max(1),
            request_bound: request_bound.clamp(1, bound.max(1)),
            state: Mutex::new(OutboxState::default()),
            ready: tokio::sync::Notify::new(),
            producers: AtomicUsize::new(1),
            metrics,
        });
        (outbox.clone(), OutboxTx(outbox))
    }

    /// Frames queued (the pending heartbeat not counted).
    pub fn frames(&self) -> usize {
        lock(&self.state).frames
    }

    /// Whether a heartbeat waits to be written.
    pub fn heartbeat_pending(&self) -> bool {
        lock(&self.state).heartbeat.is_some()
    }

    /// Queue a frame that must reach the coordinator in this session (or be re-learnt from the
    /// next join): past the bound the outbox overflows and the link drops the session.
    pub fn push(&self, frame: WorkerToCoordinator) -> Result<(), OutboxFull> {
        self.push_bounded(frame, self.bound)
    }

    /// Queue an app's request, refused past the request bound ([`OutboxFull::Busy`]).
    pub fn push_request(&self, frame: WorkerToCoordinator) -> Result<(), OutboxFull> {
        self.push_bounded(frame, self.request_bound)
    }

    fn push_bounded(&self, frame: WorkerToCoordinator, bound: usize) -> Result<(), OutboxFull> {
        let mut state = lock(&self.state);
        if state.overflowed {
            return Err(OutboxFull::Overflowed);
        }
        if state.frames >= bound {
            if bound < self.bound {
                drop(state);
                self.metrics.link_queue_event("request_refused");
                return Err(OutboxFull::Busy);
            }
            state.overflowed = true;
            let frames = state.frames;
            drop(state);
            self.metrics.link_queue_event("outbox_overflow");
            warn!(
                frames,
                "{frames} frames are queued for the coordinator, the outbox's bound: the worker drops its session and re-joins (the coordinator re-learns this node from the join)"
            );
            self.ready.notify_one();
            return Err(OutboxFull::Overflowed);
        }
        state.items.push_back(Item::Frame(Box::new(frame)));
        state.frames += 1;
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// Take back the heartbeat the link has not written yet, if any (the node thread puts its
    /// started/finished reports back before it builds the next one,
    /// [`scheduler_core::protocol::limits::ReportLog::give_back`]).
    ///
    /// The heartbeat's place in the queue is kept for the next [`Outbox::push_heartbeat`]: were
    /// the newer heartbeat queued behind frames queued since, a steady stream of frames could
    /// keep every heartbeat from being written and the coordinator would declare a working
    /// node lost.
    pub fn withdraw_heartbeat(&self) -> Option<Heartbeat> {
        let mut state = lock(&self.state);
        let hb = state.heartbeat.take()?;
        drop(state);
        self.metrics.link_queue_event("heartbeat_coalesced");
        Some(hb)
    }

    /// Queue a heartbeat: in the place of one still pending or just withdrawn (replacing its
    /// content: withdraw it first to keep its reports), else after everything queued so far.
    pub fn push_heartbeat(&self, hb: Heartbeat) {
        let mut state = lock(&self.state);
        let has_place = state.items.iter().any(|i| matches!(i, Item::Heartbeat));
        if !has_place {
            state.items.push_back(Item::Heartbeat);
        }
        state.heartbeat = Some(hb);
        drop(state);
        self.ready.notify_one();
    }

    /// The next frame to write, without waiting.
    pub fn try_next(&self) -> Option<Outgoing> {
        let mut state = lock(&self.state);
        if state.overflowed {
            return Some(Outgoing::Overflowed);
        }
        loop {
            match state.items.pop_front() {
                Some(Item::Frame(f)) => {
                    state.frames -= 1;
                    return Some(Outgoing::Frame(f));
                }
                Some(Item::Heartbeat) => match state.heartbeat.take() {
                    Some(hb) => {
                        return Some(Outgoing::Frame(Box::new(WorkerToCoordinator::Heartbeat(
                            hb,
                        ))));
                    }
                    // A withdrawn heartbeat's place reached before its replacement was queued:
                    // the replacement goes at the back.
                    None => continue,
                },
                None if self.producers.load(Ordering::Acquire) == 0 => {
                    return Some(Outgoing::Closed);
                }
                None => return None,
            }
        }
    }

    /// The next frame to write (link only; cancel-safe).
    pub async fn next(&self) -> Outgoing {
        loop {
            let notified = self.ready.notified();
            if let Some(out) = self.try_next() {
                return out;
            }
            notified.await;
        }
    }

    /// Drop everything queued and the overflow (a new session starts: what was queued belongs
    /// to the old one). Returns how many frames were dropped.
    pub fn clear(&self) -> usize {
        let mut state = lock(&self.state);
        let dropped = state.items.len();
        *state = OutboxState::default();
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::protocol::cluster::{GuaranteedFinished, PromotionApplied};
    use scheduler_core::queue_delay::QueueDelay;
    use scheduler_core::{ContainerId, NodeId, Resources};

    fn metrics() -> Arc<WorkerMetrics> {
        Arc::new(WorkerMetrics::default())
    }

    fn finished(i: u64) -> WorkerToCoordinator {
        WorkerToCoordinator::GuaranteedFinished(GuaranteedFinished {
            finished: vec![ContainerId(i)],
        })
    }

    fn heartbeat(running: u32, finished: Vec<ContainerId>) -> Heartbeat {
        Heartbeat {
            node_id: NodeId::from("n"),
            directory_version: 0,
            queue_delay: QueueDelay::default(),
            running,
            queued: 0,
            allocated: Resources::ZERO,
            usage: None,
            containers: vec![],
            started: vec![],
            finished,
            issued: vec![],
        }
    }

    fn drain(outbox: &Outbox) -> Vec<WorkerToCoordinator> {
        let mut out = Vec::new();
        while let Some(Outgoing::Frame(f)) = outbox.try_next() {
            out.push(*f);
        }
        out
    }

    fn hints(limit: u64, keys: Option<scheduler_core::token::PublicKeyRing>) -> NodeHints {
        NodeHints {
            shedding_threshold_ms: None,
            replacement_bound_ms: None,
            queueable_limit: Resources::new(limit, limit),
            guaranteed_keys: keys,
        }
    }

    /// Heartbeats the link has not written are replaced, so at most one is ever queued (past
    /// any number of intervals); the newest takes the place of the first one still unwritten,
    /// so frames queued after it cannot keep heartbeats from being written (a steady stream of
    /// frames would otherwise starve them and the coordinator would declare the node lost), and
    /// the replaced one is handed back (its reports go with the newer one).
    #[test]
    fn at_most_one_heartbeat_is_pending_and_the_newest_keeps_its_place() {
        let m = metrics();
        let (outbox, tx) = Outbox::new(8, 4, m.clone());
        tx.push(finished(1)).unwrap();
        tx.push_heartbeat(heartbeat(1, vec![ContainerId(10)]));
        tx.push(finished(2)).unwrap();
        for i in 2..1000 {
            let old = tx
                .withdraw_heartbeat()
                .expect("the previous one is still pending");
            assert_eq!(old.running, i - 1);
            tx.push_heartbeat(heartbeat(i, old.finished));
        }
        assert_eq!(m.link_queue_event_count("heartbeat_coalesced"), 998);
        assert_eq!(
            outbox.frames(),
            2,
            "the heartbeats take no frame of the bound"
        );
        let out = drain(&outbox);
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(
            matches!(&out[0], WorkerToCoordinator::GuaranteedFinished(g) if g.finished == vec![ContainerId(1)])
        );
        match &out[1] {
            WorkerToCoordinator::Heartbeat(hb) => {
                assert_eq!(hb.running, 999, "the newest, in the first one's place");
                assert_eq!(
                    hb.finished,
                    vec![ContainerId(10)],
                    "the first one's report kept"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&out[2], WorkerToCoordinator::GuaranteedFinished(g) if g.finished == vec![ContainerId(2)])
        );
        assert!(!outbox.heartbeat_pending());
        assert!(
            tx.withdraw_heartbeat().is_none(),
            "written: nothing to withdraw"
        );
    }

    /// Producers keep the outbox at its request bound (20 frames) while the link writes two
    /// frames per heartbeat interval: a heartbeat is still written every ten intervals or so
    /// (the backlog over the write rate, as in a plain queue). Queued behind the backlog anew at
    /// every interval, none would ever be written.
    #[test]
    fn a_steady_stream_of_frames_does_not_starve_heartbeats() {
        let (outbox, tx) = Outbox::new(40, 20, metrics());
        let mut heartbeats_written = 0;
        let mut frame = 0;
        for interval in 0..200u32 {
            for _ in 0..3 {
                frame += 1;
                let _ = tx.push_request(finished(frame));
            }
            if let Some(old) = tx.withdraw_heartbeat() {
                assert!(old.finished.is_empty());
            }
            tx.push_heartbeat(heartbeat(interval, vec![]));
            for _ in 0..2 {
                if let Some(Outgoing::Frame(f)) = outbox.try_next()
                    && matches!(*f, WorkerToCoordinator::Heartbeat(_))
                {
                    heartbeats_written += 1;
                }
            }
        }
        assert!(
            heartbeats_written >= 15,
            "only {heartbeats_written} heartbeats written in 200 intervals"
        );
    }

    /// The link can reach a withdrawn heartbeat's place before its replacement is queued: the
    /// place is skipped (the next frame is written) and the replacement goes at the back.
    #[test]
    fn a_withdrawn_heartbeats_place_reached_early_is_skipped() {
        let (outbox, tx) = Outbox::new(8, 4, metrics());
        tx.push_heartbeat(heartbeat(1, vec![]));
        tx.push(finished(1)).unwrap();
        let old = tx.withdraw_heartbeat().unwrap();
        assert!(matches!(
            outbox.try_next(),
            Some(Outgoing::Frame(f)) if matches!(*f, WorkerToCoordinator::GuaranteedFinished(_))
        ));
        tx.push(finished(2)).unwrap();
        tx.push_heartbeat(heartbeat(2, old.finished));
        let out = drain(&outbox);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(matches!(
            &out[0],
            WorkerToCoordinator::GuaranteedFinished(_)
        ));
        assert!(matches!(&out[1], WorkerToCoordinator::Heartbeat(hb) if hb.running == 2));
        assert!(outbox.try_next().is_none());
    }

    #[test]
    fn a_full_outbox_overflows_and_the_link_drops_the_session() {
        let m = metrics();
        let (outbox, tx) = Outbox::new(OUTBOX_FRAMES, OUTBOX_REQUEST_FRAMES, m.clone());
        for i in 0..OUTBOX_FRAMES as u64 {
            tx.push(finished(i)).unwrap();
        }
        tx.push_heartbeat(heartbeat(1, vec![]));
        assert_eq!(outbox.frames(), OUTBOX_FRAMES);
        let promotion = WorkerToCoordinator::PromotionApplied(PromotionApplied {
            correlation_id: 1,
            error: None,
        });
        assert_eq!(tx.push(promotion.clone()), Err(OutboxFull::Overflowed));
        assert_eq!(m.link_queue_event_count("outbox_overflow"), 1);
        // Refused from then on (not queued, not counted again) until the session is dropped.
        assert_eq!(tx.push(finished(0)), Err(OutboxFull::Overflowed));
        assert_eq!(m.link_queue_event_count("outbox_overflow"), 1);
        assert!(matches!(outbox.try_next(), Some(Outgoing::Overflowed)));
        assert_eq!(outbox.clear(), OUTBOX_FRAMES + 1);
        assert!(outbox.try_next().is_none());
        assert_eq!(tx.push(promotion), Ok(()));
        assert_eq!(drain(&outbox).len(), 1);
    }

    /// App requests are refused (the scheduler answers `coordinator_unavailable`) from the
    /// request bound on, leaving the rest of the outbox to what must be delivered.
    #[test]
    fn app_requests_are_refused_before_the_outbox_can_overflow() {
        let m = metrics();
        let (outbox, tx) = Outbox::new(8, 4, m.clone());
        for i in 0..4 {
            tx.push_request(finished(i)).unwrap();
        }
        assert_eq!(tx.push_request(finished(9)), Err(OutboxFull::Busy));
        assert_eq!(m.link_queue_event_count("request_refused"), 1);
        for i in 0..4 {
            tx.push(finished(10 + i)).unwrap();
        }
        assert_eq!(outbox.frames(), 8);
        assert!(!matches!(outbox.try_next(), Some(Outgoing::Overflowed)));
        assert_eq!(m.link_queue_event_count("outbox_overflow"), 0);
    }

    #[test]
    fn the_link_is_told_when_every_producer_is_gone() {
        let (outbox, tx) = Outbox::new(8, 4, metrics());
        let other = tx.clone();
        tx.push(finished(1)).unwrap();
        drop(tx);
        assert!(matches!(outbox.try_next(), Some(Outgoing::Frame(_))));
        assert!(outbox.try_next().is_none(), "one producer left");
        drop(other);
        assert!(matches!(outbox.try_next(), Some(Outgoing::Closed)));
    }

    /// The link's view of the node thread: commands are counted until handled, the link has
    /// no room at the bound (counted once per episode) and is woken when a command is handled.
    #[test]
    fn the_node_inbox_holds_the_link_back_at_its_bound_until_commands_are_handled() {
        let m = metrics();
        let inbox = NodeInbox::new(NODE_INBOX_COMMANDS, m.clone());
        let mut permits = Vec::new();
        while inbox.has_room() {
            permits.push(inbox.admit());
        }
        assert_eq!(permits.len(), NODE_INBOX_COMMANDS);
        assert!(!inbox.has_room());
        assert_eq!(m.link_queue_event_count("node_backpressure"), 1);
        let waiting = inbox.wait_for_room();
        let mut waiting = std::pin::pin!(waiting);
        assert!(
            futures_poll_once(waiting.as_mut()).is_pending(),
            "no room while the node thread has the bound"
        );
        permits.pop();
        assert!(futures_poll_once(waiting.as_mut()).is_ready());
        assert!(inbox.has_room());
        assert_eq!(inbox.pending(), NODE_INBOX_COMMANDS - 1);
        permits.push(inbox.admit());
        assert!(!inbox.has_room());
        assert_eq!(m.link_queue_event_count("node_backpressure"), 2);
        permits.clear();
        assert_eq!(inbox.pending(), 0);
    }

    fn futures_poll_once<F: std::future::Future>(
        f: std::pin::Pin<&mut F>,
    ) -> std::task::Poll<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.poll(&mut cx)
    }

    /// Hints the node thread has not taken are replaced by newer ones (one wake-up queued at a
    /// time), keeping the newest GUARANTEED keys any of them carried.
    #[test]
    fn hints_coalesce_into_the_newest_keeping_keys() {
        let m = metrics();
        let inbox = NodeInbox::new(4, m.clone());
        let ring = scheduler_core::token::PublicKeyRing {
            current: scheduler_core::token::PublicTokenKey {
                key_id: 3,
                public_hex: "00".repeat(32),
            },
            previous: None,
        };
        assert!(
            inbox.put_hints(hints(1, Some(ring.clone()))),
            "wake the node"
        );
        for i in 2..=1000 {
            assert!(
                !inbox.put_hints(hints(i, None)),
                "a wake-up is queued already"
            );
        }
        assert_eq!(m.link_queue_event_count("hints_coalesced"), 999);
        let newest = inbox.take_hints().unwrap();
        assert_eq!(newest.queueable_limit, Resources::new(1000, 1000));
        assert_eq!(newest.guaranteed_keys, Some(ring), "keys kept");
        assert!(inbox.take_hints().is_none());
        assert!(
            inbox.put_hints(hints(1, None)),
            "taken: the next one wakes again"
        );
        assert_eq!(inbox.pending(), 0, "hints are not counted as commands");
    }
}

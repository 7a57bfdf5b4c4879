//! State shared by the worker's actors and connection tasks: the app registry and the event
//! subscriptions of application connections. Two threads use it (see `crate::start_adopting`):
//! the allocation thread (app endpoint, distributed-scheduler actor, cluster link) and the node
//! thread (node-runtime actor and its process tasks), so it is `Sync`: atomics for single
//! values, and `std` mutexes held only inside one method call here, never across an `.await`.

use scheduler_core::codec::APP_MAX_FRAME;
use scheduler_core::protocol::app::{AppResponse, ContainerEvent};
use scheduler_core::protocol::cluster::AppRecord;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::{AppId, Time};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

/// Bounds on what one application connection may hold in the worker (see `AppLimits`).
#[derive(Clone, Copy, Debug)]
pub struct OutboundLimits {
    /// Requests handed to the actors and not yet handled; the connection is not read further
    /// while this many are in flight.
    pub max_in_flight: usize,
    /// Encoded answers and events waiting for the client to read them: reading pauses above
    /// `pause_queued_bytes`, and the connection is closed above `max_queued_bytes`.
    pub pause_queued_bytes: usize,
    pub max_queued_bytes: usize,
}

/// Per-connection counters shared by the connection's reader, its writer, the actors holding
/// its [`ConnTx`] and its [`InFlight`] guards. Only the reader task waits on `wake`.
#[derive(Debug)]
pub struct ConnState {
    pub conn: u64,
    pub limits: OutboundLimits,
    queued_bytes: AtomicUsize,
    /// The most `queued_bytes` has been.
    high_water: AtomicUsize,
    in_flight: AtomicUsize,
    /// Estimated bytes of the answers of the requests in flight (see [`InFlight::new`]).
    in_flight_bytes: AtomicUsize,
    /// The reader is waiting for room (backpressure) right now.
    paused: AtomicBool,
    /// Set once: the connection must end (outbound overflow, or its writer gave up).
    closing: AtomicBool,
    wake: tokio::sync::Notify,
}

impl ConnState {
    pub fn new(conn: u64, limits: OutboundLimits) -> Arc<ConnState> {
        Arc::new(ConnState {
            conn,
            limits,
            queued_bytes: AtomicUsize::new(0),
            high_water: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            in_flight_bytes: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        })
    }

    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Mark the connection for closing; true the first time.
    pub fn close(&self) -> bool {
        let first = !self.closing.swap(true, Ordering::Relaxed);
        self.wake.notify_one();
        first
    }

    /// The writer sent `bytes` to the client.
    pub fn written(&self, bytes: usize) {
        self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Whether the reader may hand over one more request now: fewer than `max_in_flight` are
    /// at the actors, and the answers queued plus those expected from the requests in flight
    /// stay under `pause_queued_bytes`.
    pub fn has_room(&self) -> bool {
        self.in_flight() < self.limits.max_in_flight
            && self.queued_bytes() + self.in_flight_bytes.load(Ordering::Relaxed)
                < self.limits.pause_queued_bytes
    }

    /// Wait (reader task only) until one more request may be handed over; false if the
    /// connection is closing instead.
    pub async fn wait_for_room(&self) -> bool {
        self.paused.store(true, Ordering::Relaxed);
        let room = loop {
            if self.is_closing() {
                break false;
            }
            if self.has_room() {
                break true;
            }
            self.wake.notified().await;
        };
        self.paused.store(false, Ordering::Relaxed);
        room
    }

    pub fn stats(&self) -> ConnStats {
        ConnStats {
            conn: self.conn,
            queued_bytes: self.queued_bytes(),
            high_water_bytes: self.high_water.load(Ordering::Relaxed),
            in_flight: self.in_flight(),
            paused: self.paused.load(Ordering::Relaxed),
            closing: self.is_closing(),
        }
    }

    /// Wait (reader task only) until the connection must close.
    pub async fn wait_for_closing(&self) {
        while !self.is_closing() {
            self.wake.notified().await;
        }
    }
}

/// What a connection holds in the worker (tests, diagnostics).
#[derive(Clone, Copy, Debug)]
pub struct ConnStats {
    pub conn: u64,
    pub queued_bytes: usize,
    pub high_water_bytes: usize,
    pub in_flight: usize,
    pub paused: bool,
    pub closing: bool,
}

/// A request handed to an actor: counted in its connection's in-flight requests, with the
/// estimated size of its answer, until the actor has handled it (drops the message; its
/// answer is then queued and counted there).
#[derive(Debug)]
pub struct InFlight {
    state: Arc<ConnState>,
    answer_bytes: usize,
}

/// Estimated bytes of one grant in an `allocated` answer (token, node, endpoint; ids at their
/// bounds take a little more), and of any other answer.
pub const GRANT_ANSWER_BYTES: usize = 1024;
pub const OTHER_ANSWER_BYTES: usize = 256;

impl InFlight {
    /// `answer_bytes`: the expected size of the request's answer, so that one large allocate
    /// holds back the requests behind it as its answer would.
    pub fn new(state: &Arc<ConnState>, answer_bytes: usize) -> InFlight {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        state
            .in_flight_bytes
            .fetch_add(answer_bytes, Ordering::Relaxed);
        InFlight {
            state: state.clone(),
            answer_bytes,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.state
            .in_flight_bytes
            .fetch_sub(self.answer_bytes, Ordering::Relaxed);
        self.state.wake.notify_one();
    }
}

/// The connection is gone or was closed for not reading its answers.
#[derive(Debug)]
pub struct Disconnected;

/// Frames to one application connection, in order: encoded here (so the queue is counted in
/// bytes), written by the connection's writer task.
#[derive(Clone, Debug)]
pub struct ConnTx {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    state: Arc<ConnState>,
}

impl ConnTx {
    pub fn new(state: Arc<ConnState>) -> (ConnTx, mpsc::UnboundedReceiver<Vec<u8>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ConnTx { tx, state }, rx)
    }

    pub fn state(&self) -> &Arc<ConnState> {
        &self.state
    }

    /// Queue one frame. A connection whose queue would exceed `max_queued_bytes` is closed
    /// (with one log line) instead: its client has not read its answers for long. (Both worker
    /// threads may queue to one connection at once; the check and the count are not one atomic
    /// step, so the queue may pass the limit by at most one frame per thread.)
    pub fn send(&self, msg: AppResponse) -> Result<(), Disconnected> {
        if self.state.is_closing() {
            return Err(Disconnected);
        }
        let frame = crate::app_endpoint::encode_answer(&msg, APP_MAX_FRAME);
        let queued = self.state.queued_bytes() + frame.len();
        if queued > self.state.limits.max_queued_bytes {
            if self.state.close() {
                tracing::warn!(
                    conn = self.state.conn,
                    "closing app connection {}: {queued} bytes of answers and events would be queued for it, over the limit of {} bytes (the client does not read its answers)",
                    self.state.conn,
                    self.state.limits.max_queued_bytes
                );
            }
            return Err(Disconnected);
        }
        let now = self
            .state
            .queued_bytes
            .fetch_add(frame.len(), Ordering::Relaxed)
            + frame.len();
        self.state.high_water.fetch_max(now, Ordering::Relaxed);
        self.tx.send(frame).map_err(|_| Disconnected)
    }

    /// Whether both send to the same connection.
    pub fn same_channel(&self, other: &ConnTx) -> bool {
        self.tx.same_channel(&other.tx)
    }
}

/// The worker's time source (token expiry, event times, the node runtime's `now`): the wall
/// clock, unless a test injects a manual one ([`crate::start_with_clock`]).
#[derive(Clone, Debug)]
pub struct WorkerClock(pub scheduler_core::time::Clock);

impl Default for WorkerClock {
    fn default() -> Self {
        WorkerClock(scheduler_core::time::Clock::Wall(wall_now))
    }
}

impl WorkerClock {
    pub fn now(&self) -> Time {
        self.0.now()
    }
}

/// Wall-clock time as the core wants it (the production clock's reading).
pub fn wall_now() -> Time {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Time::from_micros(d.as_micros() as u64)
}

/// Most container events held for apps that have not re-subscribed after an upgrade.
pub const MAX_HELD_EVENTS: usize = 10_000;

/// A flag read and written whole from either worker thread (`Cell`'s `get`/`set` on an atomic).
#[derive(Debug, Default)]
pub struct SyncFlag(AtomicBool);

impl SyncFlag {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    pub fn set(&self, value: bool) {
        self.0.store(value, Ordering::Release)
    }
}

/// A number read and written whole from either worker thread.
#[derive(Debug, Default)]
pub struct SyncU64(AtomicU64);

impl SyncU64 {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
    pub fn set(&self, value: u64) {
        self.0.store(value, Ordering::Release)
    }
}

/// A number read and written whole from either worker thread.
#[derive(Debug, Default)]
pub struct SyncU32(AtomicU32);

impl SyncU32 {
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Acquire)
    }
    pub fn set(&self, value: u32) {
        self.0.store(value, Ordering::Release)
    }
}

/// Lock a mutex of [`Shared`]. Nothing here panics while holding one, and every update under
/// one is a single insert, remove or replace, so a poisoned lock still holds consistent data.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
pub struct Shared {
    /// The time source of this worker's actors.
    pub clock: WorkerClock,
    apps: Mutex<HashMap<String, AppRecord>>,
    subscribers: Mutex<HashMap<AppId, Vec<(u64, ConnTx)>>>,
    /// Membership version of this worker's cluster view (sent in heartbeats).
    pub directory_version: SyncU64,
    /// Whether the cluster link is joined right now.
    pub connected: SyncFlag,
    /// Whether the coordinator of the joined session has answered within the link's
    /// unresponsive limit (`scheduler_core::liveness`): while not, requests that need it are
    /// refused at once, though the session and its heartbeats go on.
    pub coordinator_responsive: SyncFlag,
    /// Events of adopted containers held for apps with no subscription yet ([`Shared::notify_or_hold`]).
    held_events: Mutex<HashMap<AppId, Vec<ContainerEvent>>>,
    /// The node's session (its issuer number at the last join; 0 before the first), for
    /// diagnostics and tests.
    pub session: SyncU32,
    next_conn: AtomicU64,
    /// Open application connections.
    connections: Mutex<HashMap<u64, Arc<ConnState>>>,
    /// What this worker's scheduler has outstanding per app, published by the scheduler actor
    /// and reported with every heartbeat (quotas hold cluster-wide).
    issued_counts: Mutex<Vec<scheduler_core::quota::AppOutstanding>>,
    /// Counters and gauges exported at `/metrics` (atomics: the HTTP task only reads them).
    pub metrics: Arc<crate::metrics::WorkerMetrics>,
}

/// A no-op message: once an actor has answered it, every message queued to that actor before
/// it has been handled (actix mailboxes are FIFO), so their answers are in their channels.
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct Settle;

/// Why a hello was refused.
pub enum AuthError {
    NotJoined,
    BadCredentials,
}

impl Shared {
    /// Shared state whose actors take their time from `clock`.
    pub fn with_clock(clock: scheduler_core::time::Clock) -> Shared {
        Shared {
            clock: WorkerClock(clock),
            ..Shared::default()
        }
    }

    pub fn set_apps(&self, apps: Vec<AppRecord>) {
        let apps = apps.into_iter().map(|a| (a.app_id.clone(), a)).collect();
        *lock(&self.apps) = apps;
    }

    pub fn has_registry(&self) -> bool {
        !lock(&self.apps).is_empty()
    }

    /// Check an app's credentials against the registry (sha256 of the secret).
    pub fn authenticate(&self, app_id: &str, secret: &str) -> Result<(), AuthError> {
        let expected = {
            let apps = lock(&self.apps);
            if apps.is_empty() {
                return Err(AuthError::NotJoined);
            }
            let Some(record) = apps.get(app_id) else {
                return Err(AuthError::BadCredentials);
            };
            record.secret_sha256.clone()
        };
        let given = hex::encode(Sha256::digest(secret.as_bytes()));
        // Compare without an early exit.
        let same = given.len() == expected.len()
            && given
                .bytes()
                .zip(expected.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(AuthError::BadCredentials)
        }
    }

    pub fn quota(&self, app_id: &AppId) -> QueueableQuota {
        lock(&self.apps)
            .get(app_id.as_str())
            .map(|a| a.quota)
            .unwrap_or_default()
    }

    /// Publish the scheduler's per-app outstanding counts (read by the next heartbeat).
    pub fn set_issued_counts(&self, counts: Vec<scheduler_core::quota::AppOutstanding>) {
        *lock(&self.issued_counts) = counts;
    }

    /// The counts last published by [`Shared::set_issued_counts`].
    pub fn issued_counts(&self) -> Vec<scheduler_core::quota::AppOutstanding> {
        lock(&self.issued_counts).clone()
    }

    pub fn new_connection_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn register_connection(&self, state: Arc<ConnState>) {
        lock(&self.connections).insert(state.conn, state);
    }

    pub fn unregister_connection(&self, conn: u64) {
        lock(&self.connections).remove(&conn);
    }

    /// Every open application connection's counters, by connection id.
    pub fn connection_stats(&self) -> Vec<ConnStats> {
        let mut all: Vec<ConnStats> = lock(&self.connections)
            .values()
            .map(|c| c.stats())
            .collect();
        all.sort_by_key(|c| c.conn);
        all
    }

    pub fn subscribe(&self, app: AppId, conn: u64, tx: ConnTx) {
        // The subscriptions' lock is taken first and held while the held events are queued, so
        // an event the node thread pushes meanwhile either finds this subscription (after the
        // held ones) or is held and queued here: none is lost or reordered.
        let mut subs = lock(&self.subscribers);
        // Events of containers adopted across an upgrade that no connection heard yet.
        let held = lock(&self.held_events).remove(&app);
        for event in held.into_iter().flatten() {
            let _ = tx.send(AppResponse::Event(event));
        }
        let list = subs.entry(app).or_default();
        if !list.iter().any(|(c, _)| *c == conn) {
            list.push((conn, tx));
        }
    }

    /// Push `event` to `app`'s subscribed connections; with none (its connections dropped
    /// when the worker upgraded in place), keep it for the app's next `subscribe` on this
    /// worker, up to [`MAX_HELD_EVENTS`] in all.
    pub fn notify_or_hold(&self, app: &AppId, event: ContainerEvent) {
        let mut subs = lock(&self.subscribers);
        if subs.contains_key(app) {
            Self::push(&mut subs, app, AppResponse::Event(event));
            return;
        }
        // Under the subscriptions' lock (taken in the same order as `subscribe`).
        let mut held = lock(&self.held_events);
        if held.values().map(Vec::len).sum::<usize>() < MAX_HELD_EVENTS {
            held.entry(app.clone()).or_default().push(event);
        }
    }

    pub fn unsubscribe_connection(&self, conn: u64) {
        let mut subs = lock(&self.subscribers);
        for list in subs.values_mut() {
            list.retain(|(c, _)| *c != conn);
        }
        subs.retain(|_, l| !l.is_empty());
    }

    /// Push an event to every subscribed connection of `app` on this worker.
    pub fn notify(&self, app: &AppId, event: ContainerEvent) {
        self.notify_frame(app, AppResponse::Event(event));
    }

    /// Push a pushed frame (an `event`, a reservation event) to every subscribed connection of
    /// `app` on this worker.
    pub fn notify_frame(&self, app: &AppId, frame: AppResponse) {
        Self::push(&mut lock(&self.subscribers), app, frame);
    }

    fn push(subs: &mut HashMap<AppId, Vec<(u64, ConnTx)>>, app: &AppId, frame: AppResponse) {
        if let Some(list) = subs.get_mut(app) {
            // A connection that is gone, or closed for not reading, loses its subscription.
            list.retain(|(_, tx)| tx.send(frame.clone()).is_ok());
            if list.is_empty() {
                subs.remove(app);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::protocol::app::{ContainerEvent, ContainerEventKind};
    use scheduler_core::{ContainerId, NodeId};

    fn event(i: u64) -> AppResponse {
        AppResponse::Event(ContainerEvent {
            container_id: ContainerId(i),
            node_id: NodeId::from("n"),
            event: ContainerEventKind::Running,
            at_ms: i,
        })
    }

    /// Events for a subscriber that does not read are bounded like answers: once the queue
    /// would pass `max_queued_bytes` the connection is marked closing, nothing more is queued,
    /// and `Shared::notify` drops the subscription.
    #[test]
    fn events_for_a_subscriber_that_does_not_read_are_bounded() {
        let limits = OutboundLimits {
            max_in_flight: 8,
            pause_queued_bytes: 1024,
            max_queued_bytes: 4096,
        };
        let state = ConnState::new(1, limits);
        let (tx, _rx) = ConnTx::new(state.clone());
        let shared = Shared::default();
        let app = AppId::from("demo");
        shared.subscribe(app.clone(), 1, tx.clone());
        let mut sent = 0u64;
        for i in 0..10_000 {
            if let AppResponse::Event(e) = event(i) {
                shared.notify(&app, e);
            }
            if state.is_closing() {
                break;
            }
            sent += 1;
        }
        assert!(state.is_closing(), "the queue limit closes the connection");
        assert!(state.queued_bytes() <= 4096, "{:?}", state.stats());
        assert!(sent < 200, "{sent} events queued");
        assert!(!state.has_room());
        assert!(tx.send(event(0)).is_err(), "nothing more is queued");
        assert!(
            lock(&shared.subscribers).is_empty(),
            "the subscription of the closed connection is dropped"
        );
    }

    #[test]
    fn in_flight_guards_count_until_dropped() {
        let state = ConnState::new(
            1,
            OutboundLimits {
                max_in_flight: 2,
                pause_queued_bytes: 1 << 20,
                max_queued_bytes: 4 << 20,
            },
        );
        let a = InFlight::new(&state, 10);
        assert!(state.has_room());
        let b = InFlight::new(&state, 10);
        assert!(!state.has_room(), "two requests in flight is the limit");
        drop(a);
        assert!(state.has_room());
        drop(b);
        assert_eq!(state.in_flight(), 0);
        // One request whose answer is expected to fill the pause level holds back the next.
        let big = InFlight::new(&state, 1 << 20);
        assert!(!state.has_room());
        drop(big);
        assert!(state.has_room());
    }
}

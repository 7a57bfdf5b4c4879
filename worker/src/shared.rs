//! State shared by the worker's actors and connection tasks, all on one actix arbiter thread
//! (so `Rc`/`RefCell`, never borrowed across an `.await`): the app registry and the event
//! subscriptions of application connections.

use scheduler_core::protocol::app::{AppResponse, ContainerEvent};
use scheduler_core::protocol::cluster::AppRecord;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::{AppId, Time};
use sha2::{Digest, Sha256};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use tokio::sync::mpsc;

/// Frames to one application connection, in order.
pub type ConnTx = mpsc::UnboundedSender<AppResponse>;

/// Wall-clock time as the core wants it.
pub fn wall_now() -> Time {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Time::from_micros(d.as_micros() as u64)
}

#[derive(Default)]
pub struct Shared {
    apps: RefCell<HashMap<String, AppRecord>>,
    subscribers: RefCell<HashMap<AppId, Vec<(u64, ConnTx)>>>,
    /// Membership version of this worker's cluster view (sent in heartbeats).
    pub directory_version: Cell<u64>,
    /// Whether the cluster link is joined right now.
    pub connected: Cell<bool>,
    next_conn: Cell<u64>,
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
    pub fn set_apps(&self, apps: Vec<AppRecord>) {
        *self.apps.borrow_mut() = apps.into_iter().map(|a| (a.app_id.clone(), a)).collect();
    }

    pub fn has_registry(&self) -> bool {
        !self.apps.borrow().is_empty()
    }

    /// Check an app's credentials against the registry (sha256 of the secret).
    pub fn authenticate(&self, app_id: &str, secret: &str) -> Result<(), AuthError> {
        let apps = self.apps.borrow();
        if apps.is_empty() {
            return Err(AuthError::NotJoined);
        }
        let Some(record) = apps.get(app_id) else {
            return Err(AuthError::BadCredentials);
        };
        let given = hex::encode(Sha256::digest(secret.as_bytes()));
        // Compare without an early exit.
        let same = given.len() == record.secret_sha256.len()
            && given
                .bytes()
                .zip(record.secret_sha256.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(AuthError::BadCredentials)
        }
    }

    pub fn quota(&self, app_id: &AppId) -> QueueableQuota {
        self.apps
            .borrow()
            .get(app_id.as_str())
            .map(|a| a.quota)
            .unwrap_or_default()
    }

    pub fn new_connection_id(&self) -> u64 {
        let id = self.next_conn.get() + 1;
        self.next_conn.set(id);
        id
    }

    pub fn subscribe(&self, app: AppId, conn: u64, tx: ConnTx) {
        let mut subs = self.subscribers.borrow_mut();
        let list = subs.entry(app).or_default();
        if !list.iter().any(|(c, _)| *c == conn) {
            list.push((conn, tx));
        }
    }

    pub fn unsubscribe_connection(&self, conn: u64) {
        let mut subs = self.subscribers.borrow_mut();
        for list in subs.values_mut() {
            list.retain(|(c, _)| *c != conn);
        }
        subs.retain(|_, l| !l.is_empty());
    }

    /// Push an event to every subscribed connection of `app` on this worker.
    pub fn notify(&self, app: &AppId, event: ContainerEvent) {
        let mut subs = self.subscribers.borrow_mut();
        if let Some(list) = subs.get_mut(app) {
            list.retain(|(_, tx)| tx.send(AppResponse::Event(event.clone())).is_ok());
        }
    }
}

//! One subscribed connection per worker endpoint.

use super::{AppClient, ClientError, ConnectOptions};
use scheduler_core::protocol::app::{
    ContainerAccepted, ContainerEvent, GrantedContainer, LaunchSpec,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// One connection slot; its own lock serialises connecting to one endpoint without blocking
/// requests to the others.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<AppClient>>>>;

/// Connections to the workers an application talks to, keyed by endpoint. Containers must be
/// started on the worker named in their grant (`node_endpoint`); their events come from that
/// worker, so every pooled connection is subscribed and all deliver to one channel.
pub struct ClientPool {
    app_id: String,
    app_secret: String,
    options: ConnectOptions,
    events: mpsc::UnboundedSender<ContainerEvent>,
    slots: Mutex<HashMap<String, Slot>>,
}

impl ClientPool {
    /// A pool for one application with no TLS trust (`tls://` endpoints fail; see
    /// [`ClientPool::with_options`]), and the channel all its connections' events arrive on.
    pub fn new(
        app_id: &str,
        app_secret: &str,
    ) -> (ClientPool, mpsc::UnboundedReceiver<ContainerEvent>) {
        Self::with_options(app_id, app_secret, ConnectOptions::default())
    }

    /// A pool whose connections use `options` (the cluster CA for `tls://` endpoints).
    pub fn with_options(
        app_id: &str,
        app_secret: &str,
        options: ConnectOptions,
    ) -> (ClientPool, mpsc::UnboundedReceiver<ContainerEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let pool = ClientPool {
            app_id: app_id.to_string(),
            app_secret: app_secret.to_string(),
            options,
            events,
            slots: Mutex::default(),
        };
        (pool, rx)
    }

    /// The subscribed connection to `endpoint`: connects (hello + subscribe) on first use, and
    /// again if the previous connection has closed.
    pub async fn get(&self, endpoint: &str) -> Result<Arc<AppClient>, ClientError> {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(endpoint.to_string())
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        let client = Arc::new(
            AppClient::connect_with(
                endpoint,
                &self.options,
                &self.app_id,
                &self.app_secret,
                self.events.clone(),
            )
            .await?,
        );
        client.subscribe().await?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Start a granted container on the worker named in its grant.
    pub async fn start(
        &self,
        grant: &GrantedContainer,
        launch: LaunchSpec,
    ) -> Result<ContainerAccepted, ClientError> {
        self.get(&grant.node_endpoint)
            .await?
            .start_container(grant.token.clone(), launch)
            .await
    }

    /// Endpoints with an open connection.
    pub fn connected_endpoints(&self) -> Vec<String> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<String> = slots
            .iter()
            .filter(|(_, slot)| {
                slot.try_lock()
                    .map(|c| c.as_ref().is_some_and(|c| !c.is_closed()))
                    .unwrap_or(true)
            })
            .map(|(e, _)| e.clone())
            .collect();
        out.sort();
        out
    }
}

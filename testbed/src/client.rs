//! An async client of the application protocol (`docs/protocol.md`): one connection per worker
//! endpoint, many requests in flight (answers are matched to requests by `request_id`), events
//! delivered to a channel the caller owns. [`ClientPool`] keeps one connection per node endpoint
//! for starting containers where they were granted.

use scheduler_core::ContainerId;
use scheduler_core::codec::{APP_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, Ack, Allocate, Allocated, AppRequest, AppResponse, ContainerAccepted,
    ContainerEvent, ErrorFrame, GrantedContainer, Hello, LaunchSpec, Promote, Promoted, Release,
    StartContainer, StopContainer, Subscribe, Welcome,
};
use scheduler_core::token::ContainerToken;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Client failures.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("connection closed")]
    Closed,
    #[error("the worker answered with an error: {} ({:?})", .0.message, .0.code)]
    Server(ErrorFrame),
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    #[error("codec: {0}")]
    Codec(#[from] scheduler_core::codec::CodecError),
}

impl ClientError {
    /// The server's error frame, if that is what this is.
    pub fn server(&self) -> Option<&ErrorFrame> {
        match self {
            ClientError::Server(e) => Some(e),
            _ => None,
        }
    }
}

type Waiters = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<AppResponse>>>>;

/// One authenticated connection to a worker.
pub struct AppClient {
    endpoint: String,
    out: mpsc::UnboundedSender<Vec<u8>>,
    waiters: Waiters,
    next_id: AtomicU64,
    welcome: Welcome,
}

impl AppClient {
    /// Connect to `endpoint` (`host:port`, or a Unix socket path starting with `/` or `unix:`),
    /// say hello, and deliver this connection's events to `events`.
    pub async fn connect(
        endpoint: &str,
        app_id: &str,
        app_secret: &str,
        events: mpsc::UnboundedSender<ContainerEvent>,
    ) -> Result<AppClient, ClientError> {
        let err = |source| ClientError::Connect {
            endpoint: endpoint.to_string(),
            source,
        };
        if let Some(path) = endpoint
            .strip_prefix("unix:")
            .or(endpoint.starts_with('/').then_some(endpoint))
        {
            let s = tokio::net::UnixStream::connect(path).await.map_err(err)?;
            Self::handshake(endpoint, s, app_id, app_secret, events).await
        } else {
            let s = tokio::net::TcpStream::connect(endpoint)
                .await
                .map_err(err)?;
            let _ = s.set_nodelay(true);
            Self::handshake(endpoint, s, app_id, app_secret, events).await
        }
    }

    async fn handshake<S: AsyncRead + AsyncWrite + Send + 'static>(
        endpoint: &str,
        stream: S,
        app_id: &str,
        app_secret: &str,
        events: mpsc::UnboundedSender<ContainerEvent>,
    ) -> Result<AppClient, ClientError> {
        let (mut reader, mut writer) = tokio::io::split(stream);
        let hello = AppRequest::Hello(Hello {
            protocol_version: APP_PROTOCOL_VERSION,
            app_id: app_id.to_string(),
            app_secret: app_secret.to_string(),
            client_name: Some(format!("testbed/{}", env!("CARGO_PKG_VERSION"))),
        });
        writer
            .write_all(&encode_frame(&hello, APP_MAX_FRAME)?)
            .await
            .map_err(|_| ClientError::Closed)?;
        let mut decoder = FrameDecoder::new(APP_MAX_FRAME);
        let mut buf = vec![0u8; 64 * 1024];
        let welcome = loop {
            if let Some(msg) = decoder.next_message::<AppResponse>()? {
                match msg {
                    AppResponse::Welcome(w) => break w,
                    AppResponse::Error(e) => return Err(ClientError::Server(e)),
                    other => {
                        return Err(ClientError::Unexpected(format!("{other:?} before welcome")));
                    }
                }
            }
            let n = reader
                .read(&mut buf)
                .await
                .map_err(|_| ClientError::Closed)?;
            if n == 0 {
                return Err(ClientError::Closed);
            }
            decoder.push(&buf[..n]);
        };
        let waiters: Waiters = Arc::default();
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(mut frame) = out_rx.recv().await {
                while let Ok(more) = out_rx.try_recv() {
                    frame.extend_from_slice(&more);
                }
                if writer.write_all(&frame).await.is_err() {
                    return;
                }
            }
        });
        let w = waiters.clone();
        tokio::spawn(async move {
            loop {
                loop {
                    match decoder.next_message::<AppResponse>() {
                        Ok(Some(AppResponse::Event(e))) => {
                            let _ = events.send(e);
                        }
                        Ok(Some(msg)) => {
                            let id = response_id(&msg);
                            let waiter =
                                id.and_then(|id| w.lock().expect("waiters lock").get(&id).cloned());
                            match waiter {
                                Some(tx) => {
                                    let _ = tx.send(msg);
                                }
                                None => tracing::debug!("answer nobody waits for: {msg:?}"),
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!("bad frame from the worker: {e}");
                            w.lock().expect("waiters lock").clear();
                            return;
                        }
                    }
                }
                match reader.read(&mut buf).await {
                    Ok(n) if n > 0 => decoder.push(&buf[..n]),
                    _ => {
                        // Dropping the senders wakes every waiter with `Closed`.
                        w.lock().expect("waiters lock").clear();
                        return;
                    }
                }
            }
        });
        Ok(AppClient {
            endpoint: endpoint.to_string(),
            out: out_tx,
            waiters,
            next_id: AtomicU64::new(1),
            welcome,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Send a request and get the channel its answers arrive on.
    fn request(
        &self,
        make: impl FnOnce(u64) -> AppRequest,
    ) -> Result<(u64, mpsc::UnboundedReceiver<AppResponse>), ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.waiters.lock().expect("waiters lock").insert(id, tx);
        let frame = encode_frame(&make(id), APP_MAX_FRAME)?;
        self.out.send(frame).map_err(|_| ClientError::Closed)?;
        Ok((id, rx))
    }

    fn done(&self, id: u64) {
        self.waiters.lock().expect("waiters lock").remove(&id);
    }

    async fn single(
        &self,
        make: impl FnOnce(u64) -> AppRequest,
    ) -> Result<AppResponse, ClientError> {
        let (id, mut rx) = self.request(make)?;
        let answer = rx.recv().await;
        self.done(id);
        match answer {
            Some(AppResponse::Error(e)) => Err(ClientError::Server(e)),
            Some(a) => Ok(a),
            None => Err(ClientError::Closed),
        }
    }

    /// Allocate; waits for every frame of the answer (GUARANTEED asks may take several).
    pub async fn allocate(&self, mut ask: Allocate) -> Result<Allocated, ClientError> {
        let (id, mut rx) = self.request(|id| {
            ask.request_id = id;
            AppRequest::Allocate(ask)
        })?;
        let mut all: Option<Allocated> = None;
        let result = loop {
            match rx.recv().await {
                Some(AppResponse::Allocated(a)) => {
                    let remaining = a.remaining;
                    match all.as_mut() {
                        None => all = Some(a),
                        Some(acc) => {
                            acc.containers.extend(a.containers);
                            acc.remaining = a.remaining;
                        }
                    }
                    if remaining == 0 {
                        break Ok(all.take().expect("set above"));
                    }
                }
                Some(AppResponse::Error(e)) => break Err(ClientError::Server(e)),
                Some(other) => break Err(ClientError::Unexpected(format!("{other:?}"))),
                None => break Err(ClientError::Closed),
            }
        };
        self.done(id);
        result
    }

    pub async fn start_container(
        &self,
        token: ContainerToken,
        launch: LaunchSpec,
    ) -> Result<ContainerAccepted, ClientError> {
        match self
            .single(|request_id| {
                AppRequest::StartContainer(StartContainer {
                    request_id,
                    token,
                    launch,
                })
            })
            .await?
        {
            AppResponse::ContainerAccepted(a) => Ok(a),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    pub async fn release(&self, container_id: ContainerId) -> Result<Ack, ClientError> {
        expect_ack(
            self.single(|request_id| {
                AppRequest::Release(Release {
                    request_id,
                    container_id,
                })
            })
            .await?,
        )
    }

    pub async fn stop_container(&self, container_id: ContainerId) -> Result<Ack, ClientError> {
        expect_ack(
            self.single(|request_id| {
                AppRequest::StopContainer(StopContainer {
                    request_id,
                    container_id,
                })
            })
            .await?,
        )
    }

    pub async fn promote(&self, container_id: ContainerId) -> Result<Promoted, ClientError> {
        match self
            .single(|request_id| {
                AppRequest::Promote(Promote {
                    request_id,
                    container_id,
                })
            })
            .await?
        {
            AppResponse::Promoted(p) => Ok(p),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    pub async fn subscribe(&self) -> Result<Ack, ClientError> {
        expect_ack(
            self.single(|request_id| AppRequest::Subscribe(Subscribe { request_id }))
                .await?,
        )
    }
}

fn expect_ack(a: AppResponse) -> Result<Ack, ClientError> {
    match a {
        AppResponse::Ack(a) => Ok(a),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

fn response_id(msg: &AppResponse) -> Option<u64> {
    match msg {
        AppResponse::Welcome(_) | AppResponse::Event(_) => None,
        AppResponse::Allocated(a) => Some(a.request_id),
        AppResponse::Promoted(p) => Some(p.request_id),
        AppResponse::ContainerAccepted(c) => Some(c.request_id),
        AppResponse::Ack(a) => Some(a.request_id),
        AppResponse::Error(e) => e.request_id,
    }
}

/// One subscribed connection per worker endpoint, all delivering events to one channel.
pub struct ClientPool {
    app_id: String,
    app_secret: String,
    events: mpsc::UnboundedSender<ContainerEvent>,
    clients: tokio::sync::Mutex<HashMap<String, Arc<AppClient>>>,
}

impl ClientPool {
    pub fn new(
        app_id: &str,
        app_secret: &str,
    ) -> (ClientPool, mpsc::UnboundedReceiver<ContainerEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let pool = ClientPool {
            app_id: app_id.to_string(),
            app_secret: app_secret.to_string(),
            events: tx,
            clients: Default::default(),
        };
        (pool, rx)
    }

    /// The (subscribed) connection to `endpoint`, connecting on first use.
    pub async fn get(&self, endpoint: &str) -> Result<Arc<AppClient>, ClientError> {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(endpoint) {
            return Ok(c.clone());
        }
        let c = Arc::new(
            AppClient::connect(
                endpoint,
                &self.app_id,
                &self.app_secret,
                self.events.clone(),
            )
            .await?,
        );
        c.subscribe().await?;
        clients.insert(endpoint.to_string(), c.clone());
        Ok(c)
    }

    /// Start a granted container on the node named in its grant.
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
}

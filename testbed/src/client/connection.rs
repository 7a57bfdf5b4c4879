//! One authenticated app-protocol connection with many requests in flight.

use super::ClientError;
use scheduler_core::ContainerId;
use scheduler_core::codec::{APP_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, Ack, Allocate, Allocated, AppRequest, AppResponse, ContainerAccepted,
    ContainerEvent, Hello, LaunchSpec, Promote, Promoted, Release, StartContainer, StopContainer,
    Subscribe, Welcome,
};
use scheduler_core::protocol::app::{
    DeleteReservation, Explain, Explained, ListReservations, ReservationAccepted, ReservationList,
    Reserve, UpdateReservation,
};
use scheduler_core::reservation::ReservationDefinition;
use scheduler_core::token::ContainerToken;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};

/// Where a worker's app endpoint is, and over which transport (docs/protocol.md §1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Plaintext TCP, `host:port` (`tcp://host:port`, or a bare `host:port`).
    Tcp(String),
    /// TLS over TCP, `host:port` (`tls://host:port`); the worker's certificate must chain to
    /// the cluster CA of [`ConnectOptions`] and name `host`.
    Tls(String),
    /// A Unix socket path (`unix:///path`, `unix:PATH`, or a path starting with `/` or `.`).
    Unix(PathBuf),
}

impl Endpoint {
    /// `tls://HOST:PORT`, `tcp://HOST:PORT`, `unix:///PATH` (also `unix:PATH`, or anything
    /// starting with `/` or `.`) as advertised by workers; a bare `HOST:PORT` is plaintext TCP
    /// (what workers advertised before transports had schemes).
    pub fn parse(endpoint: &str) -> Endpoint {
        if let Some(addr) = endpoint.strip_prefix("tls://") {
            Endpoint::Tls(addr.to_string())
        } else if let Some(addr) = endpoint.strip_prefix("tcp://") {
            Endpoint::Tcp(addr.to_string())
        } else if let Some(path) = endpoint.strip_prefix("unix://") {
            Endpoint::Unix(PathBuf::from(path))
        } else if let Some(path) = endpoint.strip_prefix("unix:") {
            Endpoint::Unix(PathBuf::from(path))
        } else if endpoint.starts_with('/') || endpoint.starts_with('.') {
            Endpoint::Unix(PathBuf::from(endpoint))
        } else {
            Endpoint::Tcp(endpoint.to_string())
        }
    }
}

/// How to connect: the trust for `tls://` endpoints. The default has none, so a `tls://`
/// endpoint fails to connect with an error that asks for the cluster CA.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ConnectOptions {
    /// Trust only the CA certificate(s) in the PEM file `ca_pem` (the cluster `ca.pem`) for
    /// `tls://` endpoints.
    pub fn with_ca_cert(ca_pem: &std::path::Path) -> Result<ConnectOptions, ClientError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let bad = |message: String| ClientError::Connect {
            endpoint: format!("(CA file {})", ca_pem.display()),
            message,
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_pem)
            .map_err(|e| bad(format!("reading the CA certificate: {e}")))?
        {
            let cert = cert.map_err(|e| bad(format!("parsing the CA certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| bad(format!("the CA certificate is not usable: {e}")))?;
        }
        if roots.is_empty() {
            return Err(bad("the file holds no certificate".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ConnectOptions {
            tls: Some(Arc::new(config)),
        })
    }

    /// [`ConnectOptions::with_ca_cert`] when a CA file is given, else the default.
    pub fn from_ca_cert(ca_pem: Option<&std::path::Path>) -> Result<ConnectOptions, ClientError> {
        match ca_pem {
            Some(p) => ConnectOptions::with_ca_cert(p),
            None => Ok(ConnectOptions::default()),
        }
    }
}

/// The host of `host:port` or `[v6]:port`, as a TLS server name.
fn server_name(addr: &str) -> Option<rustls::pki_types::ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => addr,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    rustls::pki_types::ServerName::try_from(host.to_string()).ok()
}

/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 * 1024;

type Answer = Result<AppResponse, ClientError>;

/// Who waits for the answers to one request.
enum Waiter {
    /// Requests answered by exactly one frame.
    Once(oneshot::Sender<Answer>),
    /// `allocate`: one or more `allocated` frames, the last with `remaining == 0`.
    Stream(mpsc::UnboundedSender<Answer>),
}

#[derive(Default)]
struct Waiters {
    pending: HashMap<u64, Waiter>,
    /// Set once the connection is gone; every later request fails with it at once.
    closed: Option<ClientError>,
}

/// State shared by the client handle, its reader task and its writer task.
struct Shared {
    endpoint: String,
    waiters: Mutex<Waiters>,
    /// Becomes `true` when the connection ends (see [`AppClient::closed`]).
    closed: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiters> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts and
        // removes), so a poisoned lock is still usable.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection is gone: fail every waiting request with `why` and remember it.
    fn close(&self, why: ClientError) {
        let drained: Vec<Waiter> = {
            let mut w = self.lock();
            if w.closed.is_none() {
                w.closed = Some(why.clone());
            }
            w.pending.drain().map(|(_, waiter)| waiter).collect()
        };
        self.closed.send_replace(true);
        for waiter in drained {
            match waiter {
                Waiter::Once(tx) => {
                    let _ = tx.send(Err(why.clone()));
                }
                Waiter::Stream(tx) => {
                    let _ = tx.send(Err(why.clone()));
                }
            }
        }
    }

    /// Deliver one answer to its waiter.
    fn dispatch(&self, request_id: u64, answer: AppResponse) {
        let last = match &answer {
            AppResponse::Allocated(a) => a.remaining == 0,
            _ => true,
        };
        let waiter = {
            let mut w = self.lock();
            if last {
                w.pending.remove(&request_id)
            } else {
                // More frames follow: keep the waiter registered.
                match w.pending.get(&request_id) {
                    Some(Waiter::Stream(tx)) => {
                        let _ = tx.send(Ok(answer));
                        return;
                    }
                    Some(Waiter::Once(_)) => w.pending.remove(&request_id),
                    None => None,
                }
            }
        };
        match waiter {
            Some(Waiter::Once(tx)) => {
                let _ = tx.send(Ok(answer));
            }
            Some(Waiter::Stream(tx)) => {
                let _ = tx.send(Ok(answer));
            }
            None => tracing::debug!(
                endpoint = %self.endpoint,
                request_id,
                "answer to a request nobody waits for (cancelled?): {answer:?}"
            ),
        }
    }
}

/// Removes a request's waiter if the caller stops waiting (its future is dropped), so
/// cancelled requests do not pile up.
struct PendingGuard<'a> {
    shared: &'a Shared,
    request_id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.request_id);
    }
}

/// One authenticated connection to a worker's app endpoint. Cheap to share behind an `Arc`;
/// all methods take `&self` and may run concurrently. Dropping the last handle closes the
/// connection (after what was already sent).
pub struct AppClient {
    shared: Arc<Shared>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    next_id: AtomicU64,
    welcome: Welcome,
}

impl AppClient {
    /// Connect to `endpoint` (see [`Endpoint::parse`]) with no TLS trust: `tls://`
    /// endpoints need [`AppClient::connect_with`]. Says `hello`, waits for `welcome`, and from
    /// then on delivers this connection's `event` frames to `events` (events arrive only after
    /// [`AppClient::subscribe`]).
    pub async fn connect(
        endpoint: &str,
        app_id: &str,
        app_secret: &str,
        events: mpsc::UnboundedSender<ContainerEvent>,
    ) -> Result<AppClient, ClientError> {
        Self::connect_with(
            endpoint,
            &ConnectOptions::default(),
            app_id,
            app_secret,
            events,
        )
        .await
    }

    /// [`AppClient::connect`] with `options` (the cluster CA for `tls://` endpoints).
    pub async fn connect_with(
        endpoint: &str,
        options: &ConnectOptions,
        app_id: &str,
        app_secret: &str,
        events: mpsc::UnboundedSender<ContainerEvent>,
    ) -> Result<AppClient, ClientError> {
        let fail = |e: std::io::Error| ClientError::Connect {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        };
        match Endpoint::parse(endpoint) {
            Endpoint::Unix(path) => {
                let s = tokio::net::UnixStream::connect(&path).await.map_err(fail)?;
                Self::over(s, endpoint, app_id, app_secret, events).await
            }
            Endpoint::Tcp(addr) => {
                let s = tokio::net::TcpStream::connect(&addr).await.map_err(fail)?;
                // Requests are small and latency-sensitive.
                s.set_nodelay(true).map_err(fail)?;
                Self::over(s, endpoint, app_id, app_secret, events).await
            }
            Endpoint::Tls(addr) => {
                let Some(config) = &options.tls else {
                    return Err(ClientError::Connect {
                        endpoint: endpoint.to_string(),
                        message: "a tls:// endpoint needs the cluster CA certificate to verify \
                                  the worker (--ca-cert / ConnectOptions::with_ca_cert)"
                            .into(),
                    });
                };
                let Some(name) = server_name(&addr) else {
                    return Err(ClientError::Connect {
                        endpoint: endpoint.to_string(),
                        message: format!("{addr:?} is not HOST:PORT"),
                    });
                };
                let s = tokio::net::TcpStream::connect(&addr).await.map_err(fail)?;
                s.set_nodelay(true).map_err(fail)?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, s)
                    .await
                    .map_err(|e| ClientError::Connect {
                        endpoint: endpoint.to_string(),
                        message: format!("TLS handshake: {e}"),
                    })?;
                Self::over(tls, endpoint, app_id, app_secret, events).await
            }
        }
    }

    /// Speak the protocol over an already connected byte stream (`endpoint` only names it in
    /// errors and logs).
    pub async fn over<S>(
        stream: S,
        endpoint: &str,
        app_id: &str,
        app_secret: &str,
        events: mpsc::UnboundedSender<ContainerEvent>,
    ) -> Result<AppClient, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut reader, mut writer) = tokio::io::split(stream);
        let closed = |reason: String| ClientError::Closed {
            endpoint: endpoint.to_string(),
            reason: Some(reason),
        };
        let hello = AppRequest::Hello(Hello {
            protocol_version: APP_PROTOCOL_VERSION,
            app_id: app_id.to_string(),
            app_secret: app_secret.to_string(),
            client_name: Some(format!("testbed/{}", env!("CARGO_PKG_VERSION"))),
        });
        writer
            .write_all(&encode_frame(&hello, APP_MAX_FRAME)?)
            .await
            .map_err(|e| closed(format!("sending hello: {e}")))?;
        let mut decoder = FrameDecoder::new(APP_MAX_FRAME);
        let mut buf = vec![0u8; READ_CHUNK];
        let mut seen_bytes = false;
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
                .map_err(|e| closed(format!("waiting for welcome: {e}")))?;
            if n == 0 {
                return Err(closed(
                    "the worker closed the connection before welcome".into(),
                ));
            }
            // A TLS record (handshake 0x16 or alert 0x15, version 3.x) where a frame's length
            // should be: no frame starts so (its length would be over the cap).
            if !seen_bytes && n >= 2 && matches!(buf[0], 0x15 | 0x16) && buf[1] == 0x03 {
                return Err(closed(
                    "the endpoint speaks TLS: connect with tls://HOST:PORT and the cluster CA"
                        .into(),
                ));
            }
            seen_bytes = true;
            decoder.push(&buf[..n]);
        };
        let shared = Arc::new(Shared {
            endpoint: endpoint.to_string(),
            waiters: Mutex::default(),
            closed: tokio::sync::watch::Sender::new(false),
        });
        let (out, out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(write_frames(writer, out_rx, shared.clone()));
        tokio::spawn(read_frames(reader, decoder, buf, shared.clone(), events));
        Ok(AppClient {
            shared,
            out,
            next_id: AtomicU64::new(1),
            welcome,
        })
    }

    /// The endpoint this client connected to.
    pub fn endpoint(&self) -> &str {
        &self.shared.endpoint
    }

    /// The worker's `welcome` (its node id and frame limit).
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Whether the connection has ended (every request would fail at once).
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some() || self.out.is_closed()
    }

    /// Resolves when the connection has ended (at once if it already has). Events of
    /// containers on this worker cannot arrive after that.
    pub async fn closed(&self) {
        let mut rx = self.shared.closed.subscribe();
        // The sender lives in `shared`, which `self` keeps alive: `wait_for` cannot fail.
        let _ = rx.wait_for(|closed| *closed).await;
    }

    /// Register a waiter for a fresh request id, then send the request.
    fn send(
        &self,
        make: impl FnOnce(u64) -> AppRequest,
        waiter: impl FnOnce() -> Waiter,
    ) -> Result<PendingGuard<'_>, ClientError> {
        let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_frame(&make(request_id), self.welcome_limit())?;
        {
            let mut w = self.shared.lock();
            if let Some(why) = &w.closed {
                return Err(why.clone());
            }
            w.pending.insert(request_id, waiter());
        }
        let guard = PendingGuard {
            shared: &self.shared,
            request_id,
        };
        self.out.send(frame).map_err(|_| ClientError::Closed {
            endpoint: self.shared.endpoint.clone(),
            reason: None,
        })?;
        Ok(guard)
    }

    /// The frame cap the worker announced (never above the protocol's 1 MiB).
    fn welcome_limit(&self) -> usize {
        (self.welcome.max_frame_bytes as usize).clamp(1, APP_MAX_FRAME)
    }

    /// A request answered by exactly one frame (an error frame becomes `Err`).
    async fn call(&self, make: impl FnOnce(u64) -> AppRequest) -> Result<AppResponse, ClientError> {
        let (tx, rx) = oneshot::channel();
        let _guard = self.send(make, || Waiter::Once(tx))?;
        match rx.await {
            Ok(Ok(AppResponse::Error(e))) => Err(ClientError::Server(e)),
            Ok(answer) => answer,
            Err(_) => Err(ClientError::Closed {
                endpoint: self.shared.endpoint.clone(),
                reason: None,
            }),
        }
    }

    /// Send an `allocate` and receive its `allocated` frames one by one as they arrive
    /// (GUARANTEED asks may be answered over time). `ask.request_id` is overwritten.
    pub fn allocate_frames(&self, mut ask: Allocate) -> Result<AllocationFrames<'_>, ClientError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let guard = self.send(
            |id| {
                ask.request_id = id;
                AppRequest::Allocate(ask)
            },
            || Waiter::Stream(tx),
        )?;
        Ok(AllocationFrames {
            _guard: guard,
            rx,
            endpoint: &self.shared.endpoint,
            done: false,
        })
    }

    /// Allocate, waiting for every frame of the answer; returns all grants in one
    /// [`Allocated`] (`remaining == 0`; `unplaced` and its reason as the worker said).
    pub async fn allocate(&self, ask: Allocate) -> Result<Allocated, ClientError> {
        let mut frames = self.allocate_frames(ask)?;
        let mut all: Option<Allocated> = None;
        while let Some(frame) = frames.next().await {
            let frame = frame?;
            match all.as_mut() {
                None => all = Some(frame),
                Some(acc) => {
                    acc.containers.extend(frame.containers);
                    acc.remaining = frame.remaining;
                    acc.unplaced += frame.unplaced;
                    if frame.unplaced_reason.is_some() {
                        acc.unplaced_reason = frame.unplaced_reason;
                    }
                }
            }
        }
        all.ok_or_else(|| ClientError::Unexpected("allocate answered by no frame".into()))
    }

    /// Start a granted container; send this to the worker named in the grant's
    /// `node_endpoint` (see [`super::ClientPool::start`]).
    pub async fn start_container(
        &self,
        token: ContainerToken,
        launch: LaunchSpec,
    ) -> Result<ContainerAccepted, ClientError> {
        match self
            .call(|request_id| {
                AppRequest::StartContainer(StartContainer {
                    request_id,
                    token,
                    launch,
                })
            })
            .await?
        {
            AppResponse::ContainerAccepted(a) => Ok(a),
            other => Err(unexpected("start_container", other)),
        }
    }

    /// Give a container back: stops it if it runs or is queued, frees it if it was granted
    /// but not started.
    pub async fn release(&self, container_id: ContainerId) -> Result<Ack, ClientError> {
        let answer = self
            .call(|request_id| {
                AppRequest::Release(Release {
                    request_id,
                    container_id,
                })
            })
            .await?;
        expect_ack("release", answer)
    }

    /// Stop a container on this worker's node.
    pub async fn stop_container(&self, container_id: ContainerId) -> Result<Ack, ClientError> {
        let answer = self
            .call(|request_id| {
                AppRequest::StopContainer(StopContainer {
                    request_id,
                    container_id,
                })
            })
            .await?;
        expect_ack("stop_container", answer)
    }

    /// Turn a QUEUEABLE container into a GUARANTEED one; returns its new token.
    pub async fn promote(&self, container_id: ContainerId) -> Result<Promoted, ClientError> {
        match self
            .call(|request_id| {
                AppRequest::Promote(Promote {
                    request_id,
                    container_id,
                })
            })
            .await?
        {
            AppResponse::Promoted(p) => Ok(p),
            other => Err(unexpected("promote", other)),
        }
    }

    /// Ask for `event` frames of this app's containers on this worker.
    pub async fn subscribe(&self) -> Result<Ack, ClientError> {
        let answer = self
            .call(|request_id| AppRequest::Subscribe(Subscribe { request_id }))
            .await?;
        expect_ack("subscribe", answer)
    }

    /// Ask for a reservation (Morpheus §6.1); its allocation over the agenda when accepted.
    pub async fn reserve(
        &self,
        reservation_id: &str,
        definition: ReservationDefinition,
    ) -> Result<ReservationAccepted, ClientError> {
        let reservation_id = reservation_id.to_string();
        self.reservation_call("reserve", |request_id| {
            AppRequest::Reserve(Reserve {
                request_id,
                reservation_id,
                definition,
            })
        })
        .await
    }

    /// A request answered by a reservation's allocation.
    async fn reservation_call(
        &self,
        what: &str,
        request: impl FnOnce(u64) -> AppRequest,
    ) -> Result<ReservationAccepted, ClientError> {
        match self.call(request).await? {
            AppResponse::Reservation(r) => Ok(r),
            other => Err(unexpected(what, other)),
        }
    }

    /// Replace one of the app's reservations' definition.
    pub async fn update_reservation(
        &self,
        reservation_id: &str,
        definition: ReservationDefinition,
    ) -> Result<ReservationAccepted, ClientError> {
        let reservation_id = reservation_id.to_string();
        self.reservation_call("update_reservation", |request_id| {
            AppRequest::UpdateReservation(UpdateReservation {
                request_id,
                reservation_id,
                definition,
            })
        })
        .await
    }

    /// Delete one of the app's reservations.
    pub async fn delete_reservation(&self, reservation_id: &str) -> Result<Ack, ClientError> {
        let reservation_id = reservation_id.to_string();
        let answer = self
            .call(|request_id| {
                AppRequest::DeleteReservation(DeleteReservation {
                    request_id,
                    reservation_id,
                })
            })
            .await?;
        expect_ack("delete_reservation", answer)
    }

    /// The app's reservations, and the plan's free capacity over the agenda.
    pub async fn list_reservations(&self) -> Result<ReservationList, ClientError> {
        match self
            .call(|request_id| AppRequest::ListReservations(ListReservations { request_id }))
            .await?
        {
            AppResponse::Reservations(r) => Ok(r),
            other => Err(unexpected("list_reservations", other)),
        }
    }

    /// Why the app's waiting 3Sigma job `job_id` has not started (empty when none waits).
    pub async fn explain(&self, job_id: &str) -> Result<Explained, ClientError> {
        let job_id = job_id.to_string();
        match self
            .call(|request_id| AppRequest::Explain(Explain { request_id, job_id }))
            .await?
        {
            AppResponse::Explained(e) => Ok(e),
            other => Err(unexpected("explain", other)),
        }
    }
}

/// The `allocated` frames of one `allocate`, as they arrive.
pub struct AllocationFrames<'a> {
    _guard: PendingGuard<'a>,
    rx: mpsc::UnboundedReceiver<Answer>,
    endpoint: &'a str,
    done: bool,
}

impl AllocationFrames<'_> {
    /// The next frame; `None` after the one with `remaining == 0` (or after an error).
    pub async fn next(&mut self) -> Option<Result<Allocated, ClientError>> {
        if self.done {
            return None;
        }
        let item = match self.rx.recv().await {
            Some(Ok(AppResponse::Allocated(a))) => {
                self.done = a.remaining == 0;
                Ok(a)
            }
            Some(Ok(AppResponse::Error(e))) => Err(ClientError::Server(e)),
            Some(Ok(other)) => Err(unexpected("allocate", other)),
            Some(Err(e)) => Err(e),
            None => Err(ClientError::Closed {
                endpoint: self.endpoint.to_string(),
                reason: None,
            }),
        };
        if item.is_err() {
            self.done = true;
        }
        Some(item)
    }
}

fn unexpected(request: &str, answer: AppResponse) -> ClientError {
    ClientError::Unexpected(format!("{answer:?} in answer to {request}"))
}

fn expect_ack(request: &str, answer: AppResponse) -> Result<Ack, ClientError> {
    match answer {
        AppResponse::Ack(a) => Ok(a),
        other => Err(unexpected(request, other)),
    }
}

/// Send queued frames, batching whatever is already queued into one write. Ends when every
/// client handle is gone (then half-closes, so the worker ends the connection) or on a write
/// error (then fails every waiting request).
async fn write_frames<S: AsyncWrite>(
    mut writer: WriteHalf<S>,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    shared: Arc<Shared>,
) {
    while let Some(mut batch) = frames.recv().await {
        while let Ok(more) = frames.try_recv() {
            batch.extend_from_slice(&more);
        }
        if let Err(e) = writer.write_all(&batch).await {
            shared.close(ClientError::Closed {
                endpoint: shared.endpoint.clone(),
                reason: Some(format!("write failed: {e}")),
            });
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// Read frames until the connection ends, dispatching answers and events.
async fn read_frames<S: AsyncRead>(
    mut reader: ReadHalf<S>,
    mut decoder: FrameDecoder,
    mut buf: Vec<u8>,
    shared: Arc<Shared>,
    events: mpsc::UnboundedSender<ContainerEvent>,
) {
    // An error frame naming no request that announces the end of the connection (bad frame,
    // ...): the reason every waiting request gets when the worker closes.
    let mut closing: Option<ClientError> = None;
    loop {
        loop {
            match decoder.next_message::<AppResponse>() {
                Ok(Some(AppResponse::Event(e))) => {
                    // The caller may have stopped listening; events are then dropped.
                    let _ = events.send(e);
                }
                Ok(Some(
                    msg @ (AppResponse::ReservationReprovisioned(_)
                    | AppResponse::ReservationCancelled(_)),
                )) => {
                    tracing::info!(endpoint = %shared.endpoint, "reservation event: {msg:?}");
                }
                Ok(Some(AppResponse::Error(e))) if e.request_id.is_none() => {
                    tracing::warn!(endpoint = %shared.endpoint, "worker error: {} ({:?})", e.message, e.code);
                    if e.code.closes_connection() {
                        closing = Some(ClientError::Server(e));
                    }
                }
                Ok(Some(msg)) => match AppResponse::request_id(&msg) {
                    Some(id) => shared.dispatch(id, msg),
                    None => {
                        tracing::warn!(endpoint = %shared.endpoint, "unexpected frame: {msg:?}")
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    shared.close(ClientError::Codec(e));
                    return;
                }
            }
        }
        let why = match reader.read(&mut buf).await {
            Ok(n) if n > 0 => {
                decoder.push(&buf[..n]);
                continue;
            }
            Ok(_) => match decoder.finish() {
                Ok(()) => "the worker closed the connection".to_string(),
                Err(e) => e.to_string(),
            },
            Err(e) => format!("read failed: {e}"),
        };
        shared.close(closing.unwrap_or(ClientError::Closed {
            endpoint: shared.endpoint.clone(),
            reason: Some(why),
        }));
        return;
    }
}

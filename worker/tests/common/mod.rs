//! An in-process cluster over real QUIC on loopback: a real coordinator (`coordinator::start`
//! on 127.0.0.1:0, data dir in a tempdir) and real workers (`worker::start`), all on the test's
//! actix System, plus a minimal application-protocol client (tokio `TcpStream` + the frame
//! codec). Timeouts only guard against hangs: every wait is for a frame, an event or a state.

#![allow(dead_code)]

use coordinator::datadir::DataDir;
use coordinator::store::Store;
use coordinator::{Clock, CoordinatorServer, CoordinatorSettings};
use scheduler_core::codec::{APP_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, AcceptedState, Allocate, Allocated, AppRequest, AppResponse,
    ContainerAccepted, ContainerEvent, ContainerEventKind, ErrorFrame, Hello, LaunchSpec, Locality,
    Promote, Promoted, Release, StartContainer, Subscribe, Welcome,
};
use scheduler_core::token::{
    ContainerToken, GuaranteedSigner, IssuerNodeKey, KeyRing, NodeSessionSecret, PublicKeyRing,
    QueueableSigner, TokenBody,
};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use worker::WorkerHandle;
use worker::config::{AppLimits, WorkerConfig};
use worker::node_actor::{Inspect, NodeSnapshot};

/// Guard against a hung test; reaching it is a failure, never a way to wait for something.
pub const FAILURE_TIMEOUT: Duration = Duration::from_secs(20);
/// Heartbeat period the coordinator hands to the workers (short, so the coordinator learns of
/// started containers quickly).
pub const HEARTBEAT: Duration = Duration::from_millis(50);
/// Job submit time used by the tests' asks (any past time works).
pub const SUBMIT_MS: u64 = 1_700_000_000_000;

/// A node of the test cluster.
#[derive(Clone, Copy, Debug)]
pub struct NodeSpec {
    pub name: &'static str,
    pub cpu_millis: u64,
    pub memory_mib: u64,
}

pub const fn node(name: &'static str, cpu_millis: u64, memory_mib: u64) -> NodeSpec {
    NodeSpec {
        name,
        cpu_millis,
        memory_mib,
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub server: CoordinatorServer,
    /// The coordinator's master keys as initialised (no rotation happens within a test): the
    /// tests derive the QUEUEABLE key of any issuer for any node from them, as it does.
    pub keys: KeyRing,
    /// The coordinator's GUARANTEED signing seeds as initialised (tests mint GUARANTEED tokens
    /// with them, as only the coordinator can).
    pub guaranteed_seeds: KeyRing,
    /// app id -> secret.
    pub secrets: HashMap<String, String>,
    pub workers: Vec<WorkerHandle>,
}

impl Cluster {
    /// A coordinator with the given apps and one worker per node, started in order (each has
    /// joined when this returns).
    pub async fn start(apps: &[&str], nodes: &[NodeSpec]) -> Cluster {
        Cluster::start_with(apps, nodes, |_| {}).await
    }

    /// [`Cluster::start`] with the workers' app-connection limits set.
    pub async fn start_with_limits(
        apps: &[&str],
        nodes: &[NodeSpec],
        limits: AppLimits,
    ) -> Cluster {
        Cluster::start_with(apps, nodes, move |c| c.app_limits = limits).await
    }

    /// Like [`Cluster::start`], with each worker's configuration adjusted by `adjust` first.
    pub async fn start_with(
        apps: &[&str],
        nodes: &[NodeSpec],
        adjust: impl Fn(&mut WorkerConfig),
    ) -> Cluster {
        Cluster::start_with_clock(apps, nodes, adjust, None).await
    }

    /// Like [`Cluster::start_with`], the workers taking their time from `worker_clock` (the
    /// coordinator keeps the wall clock, so its node timeouts do not move with it).
    pub async fn start_with_clock(
        apps: &[&str],
        nodes: &[NodeSpec],
        adjust: impl Fn(&mut WorkerConfig),
        worker_clock: Option<Clock>,
    ) -> Cluster {
        Cluster::start_with_heartbeat(apps, nodes, adjust, worker_clock, HEARTBEAT).await
    }

    /// Like [`Cluster::start_with_clock`], with the heartbeat interval the coordinator gives
    /// its workers.
    pub async fn start_with_heartbeat(
        apps: &[&str],
        nodes: &[NodeSpec],
        adjust: impl Fn(&mut WorkerConfig),
        worker_clock: Option<Clock>,
        heartbeat: Duration,
    ) -> Cluster {
        Cluster::start_configured(apps, nodes, adjust, worker_clock, move |s| {
            s.heartbeat_interval = heartbeat
        })
        .await
    }

    /// The most general start: workers adjusted by `adjust`, the coordinator's settings by
    /// `adjust_coordinator` (after the harness's own: loopback, seed, [`HEARTBEAT`]).
    pub async fn start_configured(
        apps: &[&str],
        nodes: &[NodeSpec],
        adjust: impl Fn(&mut WorkerConfig),
        worker_clock: Option<Clock>,
        adjust_coordinator: impl FnOnce(&mut CoordinatorSettings),
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = DataDir::new(dir.path());
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as u64;
        let apps: Vec<(String, _)> = apps
            .iter()
            .map(|a| (a.to_string(), Default::default()))
            .collect();
        let report = coordinator::datadir::init(&data, &apps, now_ms).expect("init data dir");
        let secrets = report
            .apps
            .into_iter()
            .map(|a| (a.app_id, a.app_secret))
            .collect();
        // Read the key ring before the coordinator locks the store.
        let key_state = Store::open(&data.store())
            .expect("open store")
            .key_state()
            .expect("key state");
        let keys = key_state.ring;
        let guaranteed_seeds = key_state.guaranteed.expect("init creates GUARANTEED keys");

        let mut settings = CoordinatorSettings::new(dir.path());
        settings.listen = "127.0.0.1:0".parse().expect("literal");
        settings.seed = Some(7);
        settings.heartbeat_interval = HEARTBEAT;
        adjust_coordinator(&mut settings);
        // Tokens are checked against the workers' wall clock, so the coordinator uses it too.
        let server = coordinator::start(settings, coordinator::clock::system())
            .await
            .expect("coordinator starts");
        let join_token = std::fs::read_to_string(data.join_token()).expect("join token");

        let mut workers = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let mut config = WorkerConfig {
                coordinator: server.quic_addr.to_string(),
                ca_cert: data.ca_cert(),
                join_token: join_token.clone(),
                join_token_file: Some(data.join_token()),
                node_id: n.name.to_string(),
                rack: "rack-a".to_string(),
                attributes: Default::default(),
                cpu_millis: n.cpu_millis,
                memory_mib: n.memory_mib,
                // Plaintext: these tests write raw (and malformed) frames.
                app_tcp: Some(worker::config::AppTcp::plaintext(
                    "127.0.0.1:0".parse().expect("literal"),
                )),
                app_advertise: None,
                app_socket: None,
                container_log_dir: None,
                container_log_max_bytes: 64 << 20,
                container_user: worker::exec::user::resolve_container_user(None)
                    .expect("default container user"),
                allow_root_containers: false,
                state_dir: dir.path().join(format!("worker-state-{}", n.name)),
                default_runtime_estimate_ms: 10_000,
                fifo_queue: false,
                max_queue_length: 10_000,
                seed: Some(11 + i as u64),
                app_limits: AppLimits::default(),
                // Every test's workers serve /metrics (port 0), so the endpoint runs everywhere.
                metrics_listen: Some("127.0.0.1:0".parse().expect("literal")),
            };
            adjust(&mut config);
            let handle = match &worker_clock {
                Some(clock) => worker::start_with_clock(config, clock.clone()).await,
                None => worker::start(config).await,
            }
            .unwrap_or_else(|e| panic!("worker {} starts and joins: {e:#}", n.name));
            workers.push(handle);
        }
        Cluster {
            dir,
            server,
            keys,
            guaranteed_seeds,
            secrets,
            workers,
        }
    }

    /// Sign as the coordinator (GUARANTEED tokens, Ed25519) and the workers (QUEUEABLE tokens,
    /// HMAC under the key of the container id's issuer for the node's current session) do.
    pub fn sign(&self, body: TokenBody) -> ContainerToken {
        match body.container_type {
            ContainerType::Guaranteed => GuaranteedSigner::new(&self.guaranteed_seeds)
                .expect("GUARANTEED seeds")
                .sign(body)
                .expect("signing"),
            ContainerType::Queueable => {
                let issuer = body.container_id.issuer();
                QueueableSigner::new(issuer, &[self.issuer_key(&body.node_id, issuer)])
                    .sign(body)
                    .expect("signing")
            }
        }
    }

    /// The key `issuer` signs QUEUEABLE tokens for `node`'s current session with.
    pub fn issuer_key(&self, node: &NodeId, issuer: u32) -> IssuerNodeKey {
        // A node outside the cluster has no session: any key for it is refused anyway.
        let session = self
            .workers
            .iter()
            .find(|w| &w.node_id == node)
            .map_or(0, |w| w.shared.session.get());
        NodeSessionSecret::derive(&self.keys.current, node, session)
            .expect("master key")
            .issuer_key(node, issuer)
            .expect("derivation")
    }

    /// What nodes verify GUARANTEED tokens with.
    pub fn guaranteed_public_keys(&self) -> PublicKeyRing {
        GuaranteedSigner::new(&self.guaranteed_seeds)
            .expect("GUARANTEED seeds")
            .public_ring()
    }

    pub fn worker(&self, name: &str) -> &WorkerHandle {
        self.workers
            .iter()
            .find(|w| w.node_id.as_str() == name)
            .unwrap_or_else(|| panic!("no worker {name}"))
    }

    pub fn secret(&self, app: &str) -> &str {
        self.secrets
            .get(app)
            .unwrap_or_else(|| panic!("no app {app}"))
    }

    /// A client of `node` logged in as `app`.
    pub async fn client_as(&self, node: &str, app: &str) -> AppClient {
        AppClient::login(self.worker(node).tcp_addr(), app, self.secret(app)).await
    }

    /// A client of `node` logged in as `demo`.
    pub async fn client(&self, node: &str) -> AppClient {
        self.client_as(node, "demo").await
    }

    pub async fn inspect(&self, node: &str) -> NodeSnapshot {
        self.worker(node)
            .node
            .send(Inspect)
            .await
            .expect("node actor is running")
    }

    /// Poll the node runtime (paced, bounded) until `cond` holds; for effects that no frame
    /// announces (a killed process tree being reaped).
    pub async fn wait_for_node(
        &self,
        node: &str,
        what: &str,
        cond: impl Fn(&NodeSnapshot) -> bool,
    ) -> NodeSnapshot {
        let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
        let mut pace = tokio::time::interval(Duration::from_millis(10));
        loop {
            let snap = self.inspect(node).await;
            if cond(&snap) {
                return snap;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{node}: {what} did not happen within {FAILURE_TIMEOUT:?}; last state {snap:?}"
                );
            }
            pace.tick().await;
        }
    }

    /// Kill every container, wait until their processes are gone, close the coordinator.
    pub async fn stop(self) {
        for w in &self.workers {
            w.shutdown().await;
        }
        for w in &self.workers {
            self.wait_for_node(w.node_id.as_str(), "all processes reaped", |s| {
                s.processes == 0
            })
            .await;
        }
        self.server.shutdown();
    }
}

/// The plaintext TCP address of a worker started by [`Cluster::start`].
pub trait TcpAddr {
    fn tcp_addr(&self) -> SocketAddr;
}

impl TcpAddr for WorkerHandle {
    fn tcp_addr(&self) -> SocketAddr {
        self.app_addr.expect("the test workers serve plaintext TCP")
    }
}

/// Start the real `worker` binary as node `node_id` of `c` (in `cwd` if given); returns it and
/// its app endpoint once it printed its joined line.
pub async fn start_worker_binary(
    c: &Cluster,
    node_id: &str,
    state_dir: &std::path::Path,
    log: &std::path::Path,
    cwd: Option<&std::path::Path>,
) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_worker"));
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let mut child = command
        .arg("run")
        .args(["--coordinator", &c.server.quic_addr.to_string()])
        .arg("--ca-cert")
        .arg(c.dir.path().join("ca.pem"))
        .arg("--join-token-file")
        .arg(c.dir.path().join("join-token"))
        .args([
            "--node-id",
            node_id,
            "--cpu-millis",
            "2000",
            "--memory-mib",
            "2048",
        ])
        .args(["--app-listen", "127.0.0.1:0", "--app-plaintext-tcp"])
        .arg("--state-dir")
        .arg(state_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the worker binary");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(FAILURE_TIMEOUT, lines.next_line())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the worker did not join within {FAILURE_TIMEOUT:?}; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })
        .expect("read the worker's stdout")
        .unwrap_or_else(|| {
            panic!(
                "the worker exited before joining; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    let joined: serde_json::Value = serde_json::from_str(&line).expect("a JSON ready line");
    assert_eq!(joined["event"], "joined", "{line}");
    let endpoint = joined["app_endpoint"].as_str().expect("app_endpoint");
    // The advertised endpoint names its transport.
    let endpoint = endpoint
        .strip_prefix("tcp://")
        .unwrap_or_else(|| panic!("a plaintext endpoint is advertised as tcp://, got {endpoint}"))
        .to_string();
    (child, endpoint)
}

/// Wall-clock milliseconds since the Unix epoch (the clock workers check token expiry with).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// A token body as an issuer would write it (the tests sign it with the cluster's real key).
pub fn token_body(
    node: &str,
    app: &str,
    container_id: ContainerId,
    container_type: ContainerType,
    resources: Resources,
    expires_at_ms: u64,
) -> TokenBody {
    TokenBody {
        container_id,
        node_id: NodeId::from(node),
        app_id: AppId::from(app),
        resources,
        container_type,
        version: 0,
        job_id: JobId::new("job-1"),
        job_submit_time_ms: SUBMIT_MS,
        priority: 0,
        runtime_estimate_ms: Some(30_000),
        expires_at_ms,
        key_id: 0,
        node_epoch: 0,
        booking: None,
        times_returned: 0,
    }
}

/// An ask for one container (the client fills in the request id).
pub fn ask(container_type: ContainerType, cpu_millis: u64, memory_mib: u64) -> Allocate {
    Allocate {
        request_id: 0,
        resources: Resources::new(cpu_millis, memory_mib),
        count: 1,
        priority: 0,
        container_type,
        locality: None,
        runtime_estimate_ms: Some(30_000),
        job_id: "job-1".into(),
        job_submit_time_ms: SUBMIT_MS,
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    }
}

/// An ask for one container on `node` only.
pub fn ask_on(
    container_type: ContainerType,
    cpu_millis: u64,
    memory_mib: u64,
    node: &str,
) -> Allocate {
    let mut a = ask(container_type, cpu_millis, memory_mib);
    a.locality = Some(Locality {
        nodes: vec![node.to_string()],
        racks: vec![],
        relax: false,
    });
    a
}

/// A subscribed client of `node` (app `demo`) that started one QUEUEABLE `sleep 30` of
/// 500 millicores / 256 MiB there; returns it with the container id once it runs.
pub async fn start_sleeper(c: &Cluster, node: &str) -> (AppClient, ContainerId) {
    let mut good = c.client(node).await;
    good.subscribe().await;
    let token = good
        .grant(ask_on(ContainerType::Queueable, 500, 256, node))
        .await;
    let id = token.body.container_id;
    let accepted = good
        .start(&token, sh("exec sleep 30"))
        .await
        .expect("start accepted");
    assert_eq!(accepted.container_id, id);
    assert_eq!(accepted.state, AcceptedState::Running);
    good.event("running event", |e| {
        e.container_id == id && e.event == ContainerEventKind::Running
    })
    .await;
    (good, id)
}

/// After a bad input: the good client's session and new sessions are served, `node` still
/// runs `expected_running` containers with as many live processes, and no event says the
/// `running` container ended.
pub async fn assert_still_serving(
    c: &Cluster,
    good: &mut AppClient,
    node: &str,
    running: ContainerId,
    expected_running: usize,
) {
    let granted = good
        .allocate(ask(ContainerType::Queueable, 100, 64))
        .await
        .expect("the good client's allocate is answered");
    assert_eq!(granted.containers.len(), 1);
    let mut fresh = c.client(node).await;
    fresh.subscribe().await;
    let snap = c.inspect(node).await;
    assert_eq!(snap.running, expected_running, "{snap:?}");
    assert_eq!(snap.processes, expected_running, "{snap:?}");
    snap.invariants.expect("node runtime invariants hold");
    let ended = good.unread().iter().any(|r| {
        matches!(r, AppResponse::Event(e) if e.container_id == running
            && e.event != ContainerEventKind::Running)
    });
    assert!(
        !ended,
        "the running container was disturbed: {:?}",
        good.unread()
    );
}

/// `sh -c SCRIPT`.
pub fn sh(script: &str) -> LaunchSpec {
    LaunchSpec {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: Default::default(),
        working_dir: None,
    }
}

/// Raw bytes of one frame whose payload is `payload` (no checks).
pub fn raw_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// A minimal application-protocol client over TCP.
pub struct AppClient {
    stream: TcpStream,
    decoder: FrameDecoder,
    backlog: VecDeque<AppResponse>,
    next_request: u64,
    eof: bool,
}

impl AppClient {
    pub async fn connect(addr: SocketAddr) -> AppClient {
        let stream = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect to the app endpoint {addr}: {e}"));
        stream.set_nodelay(true).expect("nodelay");
        AppClient {
            stream,
            decoder: FrameDecoder::new(APP_MAX_FRAME),
            backlog: VecDeque::new(),
            next_request: 1,
            eof: false,
        }
    }

    /// Connect from the loopback address `local` (127.0.0.0/8 all works on Linux), to look
    /// like another source host.
    pub async fn connect_from(addr: SocketAddr, local: std::net::Ipv4Addr) -> AppClient {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(local.into(), 0))
            .unwrap_or_else(|e| panic!("bind {local}: {e}"));
        let stream = socket
            .connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect from {local} to {addr}: {e}"));
        stream.set_nodelay(true).expect("nodelay");
        AppClient {
            stream,
            decoder: FrameDecoder::new(APP_MAX_FRAME),
            backlog: VecDeque::new(),
            next_request: 1,
            eof: false,
        }
    }

    /// Connect and say hello; panics unless welcomed.
    pub async fn login(addr: SocketAddr, app: &str, secret: &str) -> AppClient {
        let mut c = AppClient::connect(addr).await;
        let welcome = c.hello(APP_PROTOCOL_VERSION, app, secret).await;
        assert_eq!(welcome.protocol_version, APP_PROTOCOL_VERSION);
        assert_eq!(welcome.max_frame_bytes, APP_MAX_FRAME as u64);
        c
    }

    pub async fn hello(&mut self, version: u32, app: &str, secret: &str) -> Welcome {
        self.send(&AppRequest::Hello(Hello {
            protocol_version: version,
            app_id: app.into(),
            app_secret: secret.into(),
            client_name: Some("worker-cluster-test".into()),
        }))
        .await;
        match self.next().await {
            Some(AppResponse::Welcome(w)) => w,
            other => panic!("expected welcome, got {other:?}"),
        }
    }

    pub fn new_request_id(&mut self) -> u64 {
        let id = self.next_request;
        self.next_request += 1;
        id
    }

    pub async fn send(&mut self, req: &AppRequest) {
        self.send_value(req).await
    }

    /// Send any serialisable value as one frame (for frames the typed enum cannot express).
    pub async fn send_value<T: Serialize>(&mut self, value: &T) {
        let frame = encode_frame(value, APP_MAX_FRAME).expect("encodable test frame");
        self.send_bytes(&frame).await;
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .await
            .expect("write to the worker");
    }

    /// Half-close: the worker sees end of stream.
    pub async fn shutdown_write(&mut self) {
        self.stream.shutdown().await.expect("shutdown write half");
    }

    /// The next frame (backlog first), or `None` once the worker closed the connection.
    pub async fn next(&mut self) -> Option<AppResponse> {
        if let Some(r) = self.backlog.pop_front() {
            return Some(r);
        }
        self.read_frame().await
    }

    async fn read_frame(&mut self) -> Option<AppResponse> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.decoder.next_message::<AppResponse>() {
                Ok(Some(r)) => return Some(r),
                Ok(None) => {}
                Err(e) => panic!("the worker sent an undecodable frame: {e}"),
            }
            if self.eof {
                return None;
            }
            let read = tokio::time::timeout(FAILURE_TIMEOUT, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no frame from the worker within {FAILURE_TIMEOUT:?}"))
                .unwrap_or_else(|e| {
                    panic!(
                        "reading from the worker failed (reset instead of an orderly close?): {e}"
                    )
                });
            if read == 0 {
                self.eof = true;
                self.decoder
                    .finish()
                    .expect("the worker closed between frames");
            } else {
                self.decoder.push(&buf[..read]);
            }
        }
    }

    /// The first frame matching `pred`; earlier non-matching frames stay queued for later.
    pub async fn wait_for(
        &mut self,
        what: &str,
        pred: impl Fn(&AppResponse) -> bool,
    ) -> AppResponse {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return self.backlog.remove(i).expect("index in range");
        }
        loop {
            match self.read_frame().await {
                Some(r) if pred(&r) => return r,
                Some(r) => self.backlog.push_back(r),
                None => panic!(
                    "the worker closed the connection while we waited for {what}; unmatched frames: {:?}",
                    self.backlog
                ),
            }
        }
    }

    /// The answer to request `id` (any frame naming it, errors included).
    pub async fn answer(&mut self, id: u64) -> AppResponse {
        self.wait_for(&format!("the answer to request {id}"), |r| {
            answer_id(r) == Some(id)
        })
        .await
    }

    /// The error answering request `id`; panics on any other answer.
    pub async fn error_for(&mut self, id: u64) -> ErrorFrame {
        match self.answer(id).await {
            AppResponse::Error(e) => e,
            other => panic!("expected an error for request {id}, got {other:?}"),
        }
    }

    /// Frames received but not consumed yet.
    pub fn unread(&self) -> &VecDeque<AppResponse> {
        &self.backlog
    }

    /// The next event matching `pred` (other frames stay queued).
    pub async fn event(
        &mut self,
        what: &str,
        pred: impl Fn(&ContainerEvent) -> bool,
    ) -> ContainerEvent {
        match self
            .wait_for(what, |r| matches!(r, AppResponse::Event(e) if pred(e)))
            .await
        {
            AppResponse::Event(e) => e,
            _ => unreachable!("matched an event"),
        }
    }

    /// The next frame must be an error, then the worker must close the connection.
    pub async fn error_then_close(&mut self) -> ErrorFrame {
        let err = match self.next().await {
            Some(AppResponse::Error(e)) => e,
            other => panic!("expected an error frame, got {other:?}"),
        };
        self.expect_closed().await;
        err
    }

    /// The worker closes the connection with nothing more to say.
    pub async fn expect_closed(&mut self) {
        if let Some(r) = self.next().await {
            panic!("expected the worker to close the connection, got {r:?}");
        }
    }

    pub async fn subscribe(&mut self) {
        let id = self.new_request_id();
        self.send(&AppRequest::Subscribe(Subscribe { request_id: id }))
            .await;
        match self.answer(id).await {
            AppResponse::Ack(_) => {}
            other => panic!("subscribe not acknowledged: {other:?}"),
        }
    }

    /// Send an allocate; the first answer (GUARANTEED asks of count 1 come in one frame).
    pub async fn allocate(&mut self, mut req: Allocate) -> Result<Allocated, ErrorFrame> {
        req.request_id = self.new_request_id();
        let id = req.request_id;
        self.send(&AppRequest::Allocate(req)).await;
        match self.answer(id).await {
            AppResponse::Allocated(a) => Ok(a),
            AppResponse::Error(e) => Err(e),
            other => panic!("unexpected answer to allocate: {other:?}"),
        }
    }

    /// Allocate one container and return its token; panics unless granted.
    pub async fn grant(&mut self, req: Allocate) -> ContainerToken {
        let a = self
            .allocate(req)
            .await
            .unwrap_or_else(|e| panic!("allocate refused: {e:?}"));
        assert_eq!(a.remaining, 0, "{a:?}");
        assert_eq!(a.containers.len(), 1, "{a:?}");
        a.containers.into_iter().next().expect("one").token
    }

    pub async fn start(
        &mut self,
        token: &ContainerToken,
        launch: LaunchSpec,
    ) -> Result<ContainerAccepted, ErrorFrame> {
        let id = self.new_request_id();
        self.send(&AppRequest::StartContainer(StartContainer {
            request_id: id,
            token: token.clone(),
            launch,
        }))
        .await;
        match self.answer(id).await {
            AppResponse::ContainerAccepted(a) => Ok(a),
            AppResponse::Error(e) => Err(e),
            other => panic!("unexpected answer to start_container: {other:?}"),
        }
    }

    /// Release a container (any node's); the answer (`ack` or an error).
    pub async fn release(&mut self, container_id: ContainerId) -> AppResponse {
        let id = self.new_request_id();
        self.send(&AppRequest::Release(Release {
            request_id: id,
            container_id,
        }))
        .await;
        self.answer(id).await
    }

    pub async fn promote(&mut self, container_id: ContainerId) -> Result<Promoted, ErrorFrame> {
        let id = self.new_request_id();
        self.send(&AppRequest::Promote(Promote {
            request_id: id,
            container_id,
        }))
        .await;
        match self.answer(id).await {
            AppResponse::Promoted(p) => Ok(p),
            AppResponse::Error(e) => Err(e),
            other => panic!("unexpected answer to promote: {other:?}"),
        }
    }
}

/// The request id a frame answers, if any.
pub fn answer_id(r: &AppResponse) -> Option<u64> {
    r.request_id()
}

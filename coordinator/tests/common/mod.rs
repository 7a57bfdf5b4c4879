//! A hand-written worker-side client of the cluster protocol over real QUIC (trusting only the
//! generated CA, server name `hybrid-coordinator`), and an in-process coordinator on 127.0.0.1:0
//! driven by a manual clock.

#![allow(dead_code)]

use coordinator::clock::Clock;
use coordinator::config::CoordinatorSettings;
use coordinator::datadir::{DataDir, SERVER_NAME};
use coordinator::{CoordinatorServer, start};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use scheduler_core::codec::{CLUSTER_MAX_FRAME, FrameDecoder, encode_frame};
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::protocol::app::Allocate;
use scheduler_core::protocol::cluster::{
    AllocateGuaranteed, CLUSTER_PROTOCOL_VERSION, CoordinatorToWorker, Heartbeat, Join,
    JoinAccepted, WorkerToCoordinator,
};
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::{AppId, ContainerId, ContainerType, NodeId, Resources, Time};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Guard against a hung test; never used to wait for something to happen.
pub const FAILURE_TIMEOUT: Duration = Duration::from_secs(20);

/// Settings for tests: loopback, a fixed seed, and a tick so long it never fires by itself
/// (tests send `Tick` after moving the manual clock).
/// A fresh data dir initialised with the app `demo` (for tests that restart a coordinator on it).
pub fn initialised_data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    coordinator::datadir::init(
        &coordinator::datadir::DataDir::new(dir.path()),
        &[("demo".to_string(), Default::default())],
        1_700_000_000_000,
    )
    .unwrap();
    dir
}

pub fn test_settings(data_dir: &Path) -> CoordinatorSettings {
    let mut s = CoordinatorSettings::new(data_dir);
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.seed = Some(7);
    s.tick_interval = Duration::from_secs(24 * 3600);
    s
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub clock: Clock,
    pub server: CoordinatorServer,
}

impl Harness {
    /// A coordinator on a fresh data dir with app `demo`.
    pub async fn start() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        coordinator::datadir::init(
            &DataDir::new(dir.path()),
            &[("demo".to_string(), Default::default())],
            1_700_000_000_000,
        )
        .unwrap();
        Harness::start_in(dir).await
    }

    pub async fn start_in(dir: tempfile::TempDir) -> Harness {
        Harness::start_in_with(dir, |_| {}).await
    }

    /// [`Harness::start`] with settings changed by `change`.
    pub async fn start_with(change: impl FnOnce(&mut CoordinatorSettings)) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        coordinator::datadir::init(
            &DataDir::new(dir.path()),
            &[("demo".to_string(), Default::default())],
            1_700_000_000_000,
        )
        .unwrap();
        Harness::start_in_with(dir, change).await
    }

    pub async fn start_in_with(
        dir: tempfile::TempDir,
        change: impl FnOnce(&mut CoordinatorSettings),
    ) -> Harness {
        let clock = Clock::manual(Time::from_millis(1_700_000_000_000));
        let mut settings = test_settings(dir.path());
        change(&mut settings);
        let server = start(settings, clock.clone()).await.unwrap();
        Harness { dir, clock, server }
    }

    pub fn join_token(&self) -> String {
        std::fs::read_to_string(DataDir::new(self.dir.path()).join_token()).unwrap()
    }

    pub fn ca(&self) -> std::path::PathBuf {
        DataDir::new(self.dir.path()).ca_cert()
    }

    pub async fn connect(&self) -> TestWorker {
        TestWorker::connect(self.server.quic_addr, &self.ca()).await
    }

    /// Connect granting the coordinator only `bytes` of stream credit (a worker that reads
    /// nothing then blocks the coordinator's writes after that much).
    #[allow(dead_code)]
    pub async fn connect_with_receive_window(&self, bytes: u32) -> TestWorker {
        let mut transport = quinn::TransportConfig::default();
        transport.stream_receive_window(quinn::VarInt::from_u32(bytes));
        TestWorker::try_connect_with(
            self.server.quic_addr,
            &self.ca(),
            "127.0.0.1".parse().unwrap(),
            Some(transport),
        )
        .await
        .expect("TLS handshake with the pinned CA")
    }

    /// Connect and join as `node` with the given capacity; panics unless accepted.
    pub async fn join(&self, node: &str, cpu: u64, mem: u64) -> (TestWorker, JoinAccepted) {
        let mut w = self.connect().await;
        w.send(&join_msg(&self.join_token(), node, cpu, mem)).await;
        match w.next().await {
            Ok(CoordinatorToWorker::JoinAccepted(a)) => (w, a),
            other => panic!("join of {node} not accepted: {other:?}"),
        }
    }
}

pub fn join_msg(token: &str, node: &str, cpu: u64, mem: u64) -> WorkerToCoordinator {
    WorkerToCoordinator::Join(Join {
        protocol_version: CLUSTER_PROTOCOL_VERSION,
        join_token: token.to_string(),
        node_id: NodeId::from(node),
        rack: "rack-a".into(),
        capacity: Resources::new(cpu, mem),
        app_endpoint: format!("{node}.example:7500"),
        containers: vec![],
        attributes: Default::default(),
    })
}

pub fn running(id: ContainerId, t: ContainerType, cpu: u64, mem: u64) -> ContainerStatus {
    ContainerStatus {
        usage: None,
        id,
        app_id: AppId::from("demo"),
        container_type: t,
        resources: Resources::new(cpu, mem),
        placement: Placement::Running,
        version: 0,
        job: None,
        grant_token: None,
    }
}

pub fn heartbeat(
    node: &str,
    directory_version: u64,
    r_ms: f64,
    containers: Vec<ContainerStatus>,
    started: Vec<ContainerId>,
    finished: Vec<ContainerId>,
) -> WorkerToCoordinator {
    WorkerToCoordinator::Heartbeat(Heartbeat {
        node_id: NodeId::from(node),
        directory_version,
        queue_delay: QueueDelay {
            tq_ms: r_ms,
            tr_ms: 0.0,
            tl_ms: 0.0,
        },
        running: containers.len() as u32,
        queued: 0,
        allocated: Resources::ZERO,
        usage: None,
        containers,
        started,
        finished,
        issued: vec![],
    })
}

pub fn allocate_guaranteed(
    correlation_id: u64,
    app: &str,
    cpu: u64,
    mem: u64,
    count: u32,
) -> WorkerToCoordinator {
    WorkerToCoordinator::AllocateGuaranteed(AllocateGuaranteed {
        correlation_id,
        app_id: app.into(),
        allocate: Allocate {
            request_id: correlation_id,
            resources: Resources::new(cpu, mem),
            count,
            priority: 0,
            container_type: ContainerType::Guaranteed,
            locality: None,
            runtime_estimate_ms: Some(1000),
            job_id: "job-1".into(),
            job_submit_time_ms: 1_600_000_000_000,
            reservation_id: None,
            role: Default::default(),
            allow_shaping: false,
            job: None,
            replaces_shed: Vec::new(),
        },
    })
}

fn describe(e: &quinn::ConnectionError) -> String {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => format!(
            "closed by the coordinator with code {}: {}",
            c.error_code,
            String::from_utf8_lossy(&c.reason)
        ),
        other => other.to_string(),
    }
}

/// One worker connection with its single bidirectional stream.
pub struct TestWorker {
    pub connection: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    backlog: VecDeque<CoordinatorToWorker>,
    _endpoint: quinn::Endpoint,
}

impl TestWorker {
    pub async fn connect(addr: SocketAddr, ca_pem: &Path) -> TestWorker {
        TestWorker::try_connect_from(addr, ca_pem, "127.0.0.1".parse().unwrap())
            .await
            .expect("TLS handshake with the pinned CA")
    }

    /// Connect from the loopback address `local`; the handshake's error if it fails.
    pub async fn try_connect_from(
        addr: SocketAddr,
        ca_pem: &Path,
        local: std::net::IpAddr,
    ) -> Result<TestWorker, quinn::ConnectionError> {
        TestWorker::try_connect_with(addr, ca_pem, local, None).await
    }

    /// [`TestWorker::try_connect_from`] with a transport configuration of the test's own.
    pub async fn try_connect_with(
        addr: SocketAddr,
        ca_pem: &Path,
        local: std::net::IpAddr,
        transport: Option<quinn::TransportConfig>,
    ) -> Result<TestWorker, quinn::ConnectionError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_pem).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
        let mut endpoint = quinn::Endpoint::client(SocketAddr::new(local, 0)).unwrap();
        let mut client = quinn::ClientConfig::new(Arc::new(quic));
        if let Some(transport) = transport {
            client.transport_config(Arc::new(transport));
        }
        endpoint.set_default_client_config(client);
        let connection = tokio::time::timeout(
            FAILURE_TIMEOUT,
            endpoint.connect(addr, SERVER_NAME).unwrap(),
        )
        .await
        .expect("handshake ends within the failure timeout")?;
        let (send, recv) = connection.open_bi().await.unwrap();
        Ok(TestWorker {
            connection,
            send,
            recv,
            decoder: FrameDecoder::new(CLUSTER_MAX_FRAME),
            backlog: VecDeque::new(),
            _endpoint: endpoint,
        })
    }

    /// The DER of the certificate the coordinator presented.
    #[allow(dead_code)]
    pub fn peer_certificate(&self) -> Vec<u8> {
        let identity = self.connection.peer_identity().expect("TLS peer identity");
        let chain = identity
            .downcast::<Vec<CertificateDer<'static>>>()
            .expect("rustls certificate chain");
        chain[0].to_vec()
    }

    pub async fn send(&mut self, msg: &WorkerToCoordinator) {
        let bytes = encode_frame(msg, CLUSTER_MAX_FRAME).unwrap();
        self.send.write_all(&bytes).await.unwrap();
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.send.write_all(bytes).await.unwrap();
    }

    /// Like [`TestWorker::send_raw`], but a closed stream is an error, not a panic.
    pub async fn send_raw_checked(&mut self, bytes: &[u8]) -> Result<(), quinn::WriteError> {
        self.send.write_all(bytes).await
    }

    /// The next frame, or `Err(description)` once the stream or connection ended.
    pub async fn next(&mut self) -> Result<CoordinatorToWorker, String> {
        if let Some(m) = self.backlog.pop_front() {
            return Ok(m);
        }
        self.read_frame().await
    }

    async fn read_frame(&mut self) -> Result<CoordinatorToWorker, String> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(m) = self
                .decoder
                .next_message::<CoordinatorToWorker>()
                .map_err(|e| format!("undecodable frame from coordinator: {e}"))?
            {
                return Ok(m);
            }
            let read = tokio::time::timeout(FAILURE_TIMEOUT, self.recv.read(&mut buf))
                .await
                .expect("coordinator answered within the failure timeout");
            match read {
                Ok(Some(n)) => self.decoder.push(&buf[..n]),
                Ok(None) => {
                    // The coordinator finished its side; report how the connection then ends.
                    let closed = tokio::time::timeout(FAILURE_TIMEOUT, self.connection.closed())
                        .await
                        .expect("connection closed within the failure timeout");
                    return Err(format!("stream finished, then {}", describe(&closed)));
                }
                Err(quinn::ReadError::ConnectionLost(e)) => return Err(describe(&e)),
                Err(e) => return Err(format!("stream closed: {e}")),
            }
        }
    }

    /// The first frame matching `pred`; others are kept for later `next` calls, in order.
    pub async fn expect(
        &mut self,
        what: &str,
        pred: impl Fn(&CoordinatorToWorker) -> bool,
    ) -> CoordinatorToWorker {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return self.backlog.remove(i).unwrap();
        }
        loop {
            match self.read_frame().await {
                Ok(m) if pred(&m) => return m,
                Ok(m) => self.backlog.push_back(m),
                Err(e) => panic!("waiting for {what}: {e}"),
            }
        }
    }

    pub async fn expect_ack(&mut self) -> scheduler_core::protocol::cluster::HeartbeatAck {
        match self
            .expect("heartbeat_ack", |m| {
                matches!(m, CoordinatorToWorker::HeartbeatAck(_))
            })
            .await
        {
            CoordinatorToWorker::HeartbeatAck(a) => a,
            _ => unreachable!(),
        }
    }

    /// Read until the connection ends; returns its description (skipping frames).
    pub async fn expect_closed(&mut self) -> String {
        loop {
            match self.read_frame().await {
                Ok(m) => self.backlog.push_back(m),
                Err(e) => return e,
            }
        }
    }
}

//! Start a coordinator inside a running actix system: data dir (initialised if empty), store,
//! actors, QUIC endpoint and accept loop.

use crate::clock::Clock;
use crate::config::CoordinatorSettings;
use crate::coordinator_actor::{CoordinatorActor, SetGuarantor};
use crate::datadir::{self, DataDir, InitError, InitReport};
use crate::guarantor_actor::GuarantorActor;
use crate::metrics::{self, CoordinatorMetrics};
use crate::session::{JoinGate, serve_connection};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use scheduler_core::join_pacing::JoinPacing;
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::info;

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Init(#[from] InitError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the GUARANTEED token keys in the store are unusable: {0}")]
    Keys(String),
    #[error("cannot listen on {addr} (metrics_listen): {source}")]
    MetricsBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot create the admin socket {path}: {source}")]
    AdminBind {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("3Sigma: {0}")]
    ThreeSigma(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running coordinator.
pub struct CoordinatorServer {
    pub quic_addr: SocketAddr,
    pub coordinator: Addr<CoordinatorActor>,
    pub guarantor: Addr<GuarantorActor>,
    /// What initialisation printed, if this start initialised the data dir.
    pub initialised: Option<InitReport>,
    pub seed: u64,
    /// Pre-join limits of the QUIC server (tests, diagnostics).
    pub join_gate: Arc<JoinGate>,
    /// Bound address of `GET /metrics`, when `metrics_listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    /// The counters and gauges the actors update (also readable in-process).
    pub metrics: Arc<CoordinatorMetrics>,
    /// The operator's admin socket (`DATA_DIR/admin.sock`, see [`crate::admin`]).
    pub admin_socket: std::path::PathBuf,
    /// The store the actors write (tests inject write faults through it).
    pub store: Arc<Store>,
    endpoint: quinn::Endpoint,
}

impl CoordinatorServer {
    /// Stop accepting and close every worker connection.
    pub fn shutdown(&self) {
        self.endpoint
            .close(quinn::VarInt::from_u32(0), b"coordinator shutting down");
    }

    /// [`CoordinatorServer::shutdown`], then wait, at most `grace`, until every connection has
    /// sent its close and drained. `close` only queues the CONNECTION_CLOSE frames: a process
    /// that exits right after it sends none, and its workers learn of the stop only at their
    /// idle timeout instead of at once (they then re-join a restarted coordinator sooner).
    /// Whether everything drained within `grace`.
    pub async fn shutdown_and_drain(&self, grace: std::time::Duration) -> bool {
        self.shutdown();
        tokio::time::timeout(grace, self.endpoint.wait_idle())
            .await
            .is_ok()
    }
}

/// Must be called inside an actix system (`#[actix::main]`, `System::new().block_on`).
pub async fn start(
    settings: CoordinatorSettings,
    clock: Clock,
) -> Result<CoordinatorServer, StartError> {
    datadir::install_crypto_provider();
    let dir = DataDir::new(&settings.data_dir);
    let initialised = if datadir::is_initialised(&dir) {
        None
    } else {
        info!(data_dir = %dir.root.display(), "initialising empty data dir");
        Some(datadir::init(&dir, &[], clock.now_ms())?)
    };
    datadir::secure(&dir)?;
    let store = Arc::new(Store::open(&dir.store())?);
    // Bound first, so a taken port fails start-up before any worker is accepted.
    let metrics_listener = match settings.metrics_listen {
        Some(addr) => Some(
            metrics::bind(addr)
                .await
                .map_err(|source| StartError::MetricsBind { addr, source })?,
        ),
        None => None,
    };
    let admin_socket = crate::admin::socket_path(&dir.root);
    let admin_listener =
        crate::admin::bind(&admin_socket).map_err(|source| StartError::AdminBind {
            path: admin_socket.clone(),
            source,
        })?;
    let metrics = Arc::new(CoordinatorMetrics::default());
    // The dashboard is served on the metrics port; without one its snapshots are never built.
    let dashboard = metrics_listener
        .as_ref()
        .map(|_| Arc::new(crate::dashboard::Dashboard::default()));
    let server_config = datadir::quic_server_config(&dir)?;
    let seed = match settings.seed {
        Some(s) => s,
        None => u64::from_le_bytes(datadir::os_random::<8>()?),
    };
    info!(seed, "top-k tie-break RNG seeded");
    // Stores written before GUARANTEED tokens had their own keys get them now.
    let (_, guaranteed_seeds) = datadir::key_state_with_guaranteed_keys(&store)?;
    let signer = scheduler_core::token::GuaranteedSigner::new(&guaranteed_seeds)
        .map_err(|e| StartError::Keys(e.to_string()))?;
    let join_token_sha256 = store.join_token_sha256()?;
    let token_ttl_ms = settings.token_ttl.as_millis() as u64;
    let mut coordinator =
        CoordinatorActor::new(settings.clone(), store.clone(), clock.clone(), seed)?;
    coordinator.metrics = metrics.clone();
    coordinator.dashboard = dashboard.clone();
    let coordinator = coordinator.start();
    let mut guarantor = GuarantorActor::new(
        store.clone(),
        signer,
        token_ttl_ms,
        clock,
        coordinator.clone(),
        &crate::guarantor_actor::PlanSettings {
            plan: settings.plan.clone(),
            dra: settings.dra,
        },
    )?;
    guarantor.metrics = metrics.clone();
    guarantor.dashboard = dashboard.clone();
    if let Some(shaping) = &settings.shaping {
        guarantor = guarantor.with_shaping(shaping);
    }
    if let Some(threesigma) = &settings.threesigma {
        guarantor = guarantor
            .with_threesigma(threesigma)
            .map_err(StartError::ThreeSigma)?;
    }
    let guarantor = guarantor.start();
    coordinator
        .send(SetGuarantor(guarantor.clone()))
        .await
        .expect("coordinator actor is running");
    let bind_error = |source| StartError::Bind {
        addr: settings.listen,
        source,
    };
    let socket = std::net::UdpSocket::bind(settings.listen).map_err(bind_error)?;
    widen_receive_buffer(&socket);
    let runtime = quinn::default_runtime()
        .ok_or_else(|| bind_error(std::io::Error::other("no async runtime for QUIC")))?;
    let endpoint = quinn::Endpoint::new(
        datadir::quic_endpoint_config(&dir)?,
        Some(server_config),
        socket,
        runtime,
    )
    .map_err(bind_error)?;
    let quic_addr = endpoint.local_addr().map_err(|source| StartError::Bind {
        addr: settings.listen,
        source,
    })?;
    let accept = endpoint.clone();
    let coord = coordinator.clone();
    let gate = JoinGate::new(
        join_token_sha256,
        settings.join_timeout,
        settings.max_unjoined_connections,
        settings.max_unjoined_per_source,
        JoinPacing {
            answer_bytes_in_flight: settings.join_answer_bytes_in_flight,
        },
        metrics.clone(),
    );
    let join_gate = gate.clone();
    actix_rt::spawn(async move {
        let mut next_session = 1u64;
        while let Some(incoming) = accept.accept().await {
            // The source address must be proven (a QUIC retry round trip) before it counts, so
            // spoofed packets cannot use up another host's per-source allowance.
            if !incoming.remote_address_validated() {
                let _ = incoming.retry();
                continue;
            }
            // Counted (and capped) from before the handshake until the join is accepted.
            let Some(unjoined) = gate.admit(incoming.remote_address().ip()) else {
                incoming.refuse();
                continue;
            };
            // Events of the session name it, its peer and (once joined) its node.
            let span = tracing::info_span!(
                "worker_session",
                session = next_session,
                peer = %incoming.remote_address(),
                node = tracing::field::Empty
            );
            actix_rt::spawn(tracing::Instrument::instrument(
                serve_connection(
                    incoming,
                    coord.clone(),
                    next_session,
                    gate.clone(),
                    unjoined,
                ),
                span,
            ));
            next_session += 1;
        }
    });
    let metrics_addr = match (metrics_listener, dashboard) {
        (Some(listener), Some(dashboard)) => {
            let addr = listener.local_addr().ok();
            metrics::spawn_server(listener, metrics.clone(), dashboard);
            addr
        }
        _ => None,
    };
    crate::admin::spawn_server(admin_listener, coordinator.clone(), guarantor.clone());
    info!(%quic_addr, "coordinator listening");
    Ok(CoordinatorServer {
        quic_addr,
        coordinator,
        guarantor,
        initialised,
        seed,
        join_gate,
        metrics_addr,
        metrics,
        admin_socket,
        store,
        endpoint,
    })
}

/// Receive buffer asked for the cluster's UDP socket (the kernel caps it at `net.core.rmem_max`).
/// Every worker's datagrams arrive on this one socket, and the coordinator drains it from the
/// same thread as its actors: with the default buffer (208 KiB here) a pause of tens of
/// milliseconds under thousands of datagrams per second overflowed it (issue 17: 131,000
/// datagrams dropped during a 5,000-node join storm, `RcvbufErrors` in /proc/net/snmp), and each
/// drop is a QUIC retransmission, a late heartbeat or a handshake retried.
pub const CLUSTER_SOCKET_RECEIVE_BUFFER: usize = 8 << 20;

/// Best effort: a smaller buffer is not an error, only logged.
fn widen_receive_buffer(socket: &std::net::UdpSocket) {
    use std::os::fd::AsRawFd;
    let size = libc::c_int::try_from(CLUSTER_SOCKET_RECEIVE_BUFFER).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket descriptor and a c_int option value of the right length.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let mut got: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: as above, with room for the c_int the kernel writes back.
    let read = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if set != 0 || read != 0 {
        tracing::warn!(
            "cannot size the cluster socket's receive buffer: {}",
            std::io::Error::last_os_error()
        );
    } else {
        tracing::info!(
            asked = CLUSTER_SOCKET_RECEIVE_BUFFER,
            got,
            "cluster socket receive buffer (raise net.core.rmem_max for more)"
        );
    }
}

//! The worker: one per node. Runs the distributed-scheduler actor and the node-runtime actor
//! (Mercury §3–§4), the application endpoint (Unix socket, TLS or plaintext TCP), and the QUIC
//! link to the coordinator. All policy lives in `scheduler-core`.
//!
//! Two threads, so that an allocation never waits for process work (issue 17):
//! - the **allocation thread** (the caller's arbiter): the app endpoint's connection tasks, the
//!   distributed-scheduler actor (a QUEUEABLE `allocate` is answered here in one actor turn) and
//!   the cluster link;
//! - the **node thread** (an arbiter of its own, [`NodeThread`]): the node-runtime actor, its
//!   heartbeats, and every container's process task (launch, exit, clean-up, logs, usage), whose
//!   blocking parts run on that thread's blocking pool.
//!
//! They share [`shared::Shared`] (atomics and short-held mutexes) and talk only by messages;
//! docs/design.md ("The worker's two threads") lists the queues between them and their bounds
//! (every one is count- or byte-bounded; the link's two are in [`link_queues`]).

pub mod app_endpoint;
pub mod config;
pub mod exec;
pub mod link;
pub mod link_queues;
pub mod metrics;
pub mod node_actor;
pub mod scheduler_actor;
pub mod shared;
pub mod upgrade;

use actix::{Actor, Addr};
use anyhow::Context;
use config::WorkerConfig;
use scheduler_core::node::{NodeRuntime, NodeRuntimeConfig};
use scheduler_core::{NodeId, Resources};
use shared::Shared;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

/// The node thread: an actix arbiter running the node-runtime actor and its process tasks,
/// stopped (its actor and tasks dropped) when this is dropped.
pub struct NodeThread(actix::Arbiter);

impl NodeThread {
    /// Must run inside an actix System (the thread registers with it, and stops with it).
    fn spawn() -> std::io::Result<NodeThread> {
        actix::Arbiter::try_with_tokio_rt(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("worker-node-blocking")
                .build()
        })
        .map(NodeThread)
    }
}

impl Drop for NodeThread {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// A running worker (inside an actix System).
pub struct WorkerHandle {
    pub node_id: NodeId,
    /// Bound TCP address of the app endpoint (TLS or plaintext), if it has one.
    pub app_addr: Option<SocketAddr>,
    /// The Unix socket of the app endpoint, if it has one.
    pub app_socket: Option<std::path::PathBuf>,
    /// The endpoint advertised in grants, with its scheme (`tls://`, `tcp://`, `unix://`).
    pub app_endpoint: String,
    pub node: Addr<node_actor::NodeActor>,
    pub scheduler: Addr<scheduler_actor::SchedulerActor>,
    /// State shared by the actors and connection tasks (tests, diagnostics).
    pub shared: Arc<shared::Shared>,
    /// Bound address of `GET /metrics`, when `metrics_listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    /// Running containers taken back from the previous image (in-place upgrade), if any.
    pub adopted: usize,
    /// What an in-place upgrade hands on besides the containers.
    upgrade: UpgradeContext,
    /// Runs the node-runtime actor; dropping the handle stops it.
    _node_thread: NodeThread,
}

/// The listeners (close-on-exec duplicates, kept open for the hand-over), the state dir and
/// the executor's cgroup name: what [`WorkerHandle::upgrade`] passes to the next image.
struct UpgradeContext {
    node_id: String,
    state_dir: std::path::PathBuf,
    /// The open (locked) state dir, to kill what its records name when an upgrade fails after
    /// the hand-over.
    state: Arc<exec::state::StateDir>,
    cgroup_name: String,
    app_tcp: Option<std::os::fd::OwnedFd>,
    app_unix: Option<std::os::fd::OwnedFd>,
    metrics: Option<std::os::fd::OwnedFd>,
}

/// A close-on-exec duplicate of a listener's descriptor.
fn dup_listener(fd: std::os::fd::BorrowedFd<'_>) -> anyhow::Result<std::os::fd::OwnedFd> {
    fd.try_clone_to_owned()
        .context("duplicating a listener for in-place upgrades")
}

/// How long an orderly stop waits for the killed containers to be reaped and their cgroups
/// emptied: under `docker stop`'s default of 10 s before it sends SIGKILL.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(8);

impl WorkerHandle {
    /// Kill every container (orderly shutdown) and wait, at most [`SHUTDOWN_GRACE`], until
    /// every one is reaped and its cgroup emptied; then remove the executor's cgroups. The
    /// apps are told their containers are lost, so none may outlive the worker's exit (the
    /// process exits right after this returns, and the node thread with it). What is still
    /// running past the grace is logged; the next start on the same state dir kills it.
    pub async fn shutdown(&self) {
        let Ok(all_ended) = self.node.send(node_actor::KillAll).await else {
            return; // the node thread is gone already
        };
        if tokio::time::timeout(SHUTDOWN_GRACE, all_ended)
            .await
            .is_err()
        {
            tracing::warn!(
                grace_ms = SHUTDOWN_GRACE.as_millis() as u64,
                "some containers were still being killed when the stop's grace ran out; \
                 the next start on this state dir kills what is left"
            );
            return;
        }
        match self.node.send(node_actor::RemoveCgroups).await {
            Ok(left) if !left.is_empty() => {
                tracing::warn!(roots = ?left, "cgroup roots could not be removed at stop");
            }
            _ => {}
        }
    }

    /// After an [`WorkerHandle::upgrade`] that failed once the containers were handed over:
    /// this image no longer serves them, so kill every container the state dir records, as the
    /// next start would, before the process exits. Otherwise they would run on unwatched, and
    /// the coordinator, declaring the node lost, would tell their apps `lost` while they still
    /// run ("a container told lost is gone").
    pub async fn reap_after_failed_hand_over(&self) {
        let state = Arc::clone(&self.upgrade.state);
        let keep = std::collections::HashSet::new();
        match tokio::task::spawn_blocking(move || state.reap_leftovers_except(&keep)).await {
            Ok(Ok(report)) => tracing::warn!(
                records = report.records,
                containers_killed = report.containers_killed,
                processes_killed = report.processes_killed,
                cgroups_removed = report.cgroups_removed,
                cgroups_left = report.cgroups_left,
                "killed the handed-over containers"
            ),
            Ok(Err(e)) => tracing::error!("killing the handed-over containers: {e}"),
            Err(e) => tracing::error!("killing the handed-over containers: {e}"),
        }
    }

    /// Upgrade in place: hand the containers over, write the upgrade state (0600) into the
    /// state dir and `execve` `binary` with this process's arguments plus `--adopt-state`
    /// (module [`upgrade`]). Returns only on failure, saying whether the containers had been
    /// handed over already (then this image can no longer serve them and should exit: the
    /// next start kills them from the state dir's records).
    pub async fn upgrade(&self, binary: &std::path::Path) -> (anyhow::Error, bool) {
        use std::os::fd::AsRawFd;
        if !upgrade::is_executable(binary) {
            return (
                anyhow::anyhow!(
                    "the worker binary {} is not an executable file: nothing changed",
                    binary.display()
                ),
                false,
            );
        }
        let node = match self.node.send(node_actor::HandOverAll).await {
            Ok(node) => node,
            Err(e) => return (anyhow::anyhow!("the node runtime is gone: {e}"), true),
        };
        let ctx = &self.upgrade;
        let state = upgrade::UpgradeState {
            format: upgrade::STATE_FORMAT,
            node_id: ctx.node_id.clone(),
            pid: std::process::id(),
            written_at_ms: shared::wall_now().as_millis(),
            session: self.shared.session.get(),
            cgroup_name: ctx.cgroup_name.clone(),
            listeners: upgrade::HandedListeners {
                app_tcp: ctx.app_tcp.as_ref().map(AsRawFd::as_raw_fd),
                app_unix: ctx.app_unix.as_ref().map(AsRawFd::as_raw_fd),
                metrics: ctx.metrics.as_ref().map(AsRawFd::as_raw_fd),
            },
            node,
        };
        for fd in state.descriptors() {
            if let Err(e) = upgrade::keep_across_exec(fd) {
                return (
                    anyhow::anyhow!("keeping descriptor {fd} across the exec: {e}"),
                    true,
                );
            }
        }
        let path = ctx.state_dir.join(upgrade::STATE_FILE);
        if let Err(e) = upgrade::write(&path, &state) {
            return (
                anyhow::anyhow!("writing the upgrade state {}: {e}", path.display()),
                true,
            );
        }
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        let args = upgrade::next_args(&args, &path);
        tracing::info!(
            binary = %binary.display(),
            running = state.node.running.len(),
            pending = state.node.pending.len(),
            "executing the new worker image"
        );
        let error = upgrade::exec(binary, &args);
        tracing::error!(binary = %binary.display(), %error, "exec of the new worker binary failed: re-executing this image");
        let again = upgrade::exec(std::path::Path::new("/proc/self/exe"), &args);
        (
            anyhow::anyhow!(
                "exec of {} failed ({error}), and of this image too ({again})",
                binary.display()
            ),
            true,
        )
    }
}

/// Start a worker and wait until it has joined the cluster. Must run inside an actix System.
pub async fn start(config: WorkerConfig) -> anyhow::Result<WorkerHandle> {
    start_with_clock(config, shared::WorkerClock::default().0).await
}

/// [`start`] with the worker's time source given (tests drive token expiry and the node runtime's
/// clock by hand with [`scheduler_core::time::Clock::manual`]).
pub async fn start_with_clock(
    config: WorkerConfig,
    clock: scheduler_core::time::Clock,
) -> anyhow::Result<WorkerHandle> {
    start_adopting(config, clock, None).await
}

/// [`start_with_clock`], taking over the containers and listeners an earlier image of this
/// process handed over (`worker run --adopt-state FILE`, after [`WorkerHandle::upgrade`]). A
/// state file that fails its checks is reported and nothing in it is trusted: the containers
/// the state dir records are then killed as after a crash.
pub async fn start_adopting(
    config: WorkerConfig,
    clock: scheduler_core::time::Clock,
    adopt_state: Option<&std::path::Path>,
) -> anyhow::Result<WorkerHandle> {
    let (handle, joining) = start_joining(config, clock, adopt_state).await?;
    joining.wait().await?;
    Ok(handle)
}

/// The first join of a worker started by [`start_joining`], still under way.
pub struct Joining(tokio::sync::oneshot::Receiver<Result<(), String>>);

impl Joining {
    /// Until the worker has joined the cluster; an error when its first join was refused.
    pub async fn wait(self) -> anyhow::Result<()> {
        match self.0.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => anyhow::bail!(e),
            Err(_) => anyhow::bail!("the cluster link stopped before joining"),
        }
    }
}

/// [`start_adopting`] without waiting for the join: the worker runs (its containers adopted,
/// its endpoints open, its link joining) and can be shut down before it has joined, e.g. when
/// `worker run` is stopped while the coordinator is unreachable. Before, a SIGTERM in that
/// window was the default action: the process died and what it had adopted ran on unwatched.
pub async fn start_joining(
    config: WorkerConfig,
    clock: scheduler_core::time::Clock,
    adopt_state: Option<&std::path::Path>,
) -> anyhow::Result<(WorkerHandle, Joining)> {
    use std::os::fd::AsFd;
    let handover = adopt_state.and_then(|path| match upgrade::load(path, &config.node_id) {
        Ok(state) => {
            tracing::info!(
                file = %path.display(),
                written_at_ms = state.written_at_ms,
                previous_session = state.session,
                running = state.node.running.len(),
                pending = state.node.pending.len(),
                "taking over from the previous worker image"
            );
            Some(state)
        }
        Err(e) => {
            tracing::error!(
                "{e}: adopting nothing; the containers recorded in the state dir are killed"
            );
            None
        }
    });
    if adopt_state.is_some() && handover.is_none() {
        // The refused hand-over's listeners and pipes must not leak into containers.
        let closed = upgrade::close_stray_inherited(&[]);
        if closed > 0 {
            tracing::warn!(
                closed,
                "closed the inherited descriptors of the refused hand-over"
            );
        }
    }
    let identity = exec::user::decide(
        config.container_user.clone(),
        config.allow_root_containers,
        exec::user::effective_uid(),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    match &identity {
        exec::user::Identity::Switch(run_as) => tracing::info!(
            user = %run_as.name,
            uid = run_as.uid,
            gid = run_as.gid,
            "containers run as this user"
        ),
        exec::user::Identity::SameAsWorker { uid, wanted } => tracing::warn!(
            uid,
            container_user = %wanted.name,
            "the worker is not root and cannot switch users: containers run as the worker's own uid, \
             so they can read whatever the worker can (run the worker as root to isolate them)"
        ),
    }
    warn_if_readable_by_others(&config);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = link::client_config(&config.ca_cert)?;
    // Before anything is offered: kill what a crashed previous incarnation left running.
    let state = Arc::new(
        exec::state::StateDir::open(&config.state_dir)
            .with_context(|| "opening the worker state dir (--state-dir)".to_string())?,
    );
    let reaping = Arc::clone(&state);
    let keep: std::collections::HashSet<u64> = handover
        .as_ref()
        .map(|h| h.node.processes().map(|p| p.container_id).collect())
        .unwrap_or_default();
    let report = tokio::task::spawn_blocking(move || reaping.reap_leftovers_except(&keep))
        .await
        .context("reaping leftover containers")??;
    if report != exec::state::ReapReport::default() {
        tracing::warn!(
            records = report.records,
            containers_killed = report.containers_killed,
            processes_killed = report.processes_killed,
            cgroups_removed = report.cgroups_removed,
            cgroups_left = report.cgroups_left,
            state_dir = %config.state_dir.display(),
            "reaped what a previous worker left behind"
        );
    }
    // The app endpoints: TCP (TLS, or plaintext chosen explicitly) and/or the Unix socket.
    let handed = handover.as_ref().map(|h| h.listeners).unwrap_or_default();
    let tcp = match &config.app_tcp {
        Some(tcp) => {
            let acceptor = match &tcp.tls {
                Some(tls) => Some(app_endpoint::tls_acceptor(&tls.cert, &tls.key)?),
                None => None,
            };
            let listener = match handed.app_tcp.and_then(|fd| inherited_tcp(fd, "app")) {
                Some(listener) => listener,
                None => tokio::net::TcpListener::bind(tcp.listen)
                    .await
                    .with_context(|| format!("binding the app endpoint on {}", tcp.listen))?,
            };
            Some((listener, acceptor))
        }
        None => None,
    };
    let app_addr = match &tcp {
        Some((listener, _)) => Some(listener.local_addr()?),
        None => None,
    };
    let unix = match &config.app_socket {
        Some(socket) => match handed
            .app_unix
            .and_then(|fd| inherited_unix(fd, &socket.path))
        {
            Some(listener) => Some(listener),
            None => Some(bind_app_socket(socket)?),
        },
        None => None,
    };
    let app_endpoint = advertised_endpoint(
        config.app_advertise.as_deref(),
        config.app_tcp.as_ref(),
        app_addr,
        config.app_socket.as_ref(),
    )?;
    match &config.app_tcp {
        Some(tcp) if tcp.tls.is_none() => tracing::warn!(
            addr = ?app_addr,
            "the app endpoint serves plaintext TCP (--app-plaintext-tcp): app secrets and tokens cross the network in clear text"
        ),
        _ => {}
    }
    tracing::info!(advertised = %app_endpoint, socket = ?config.app_socket.as_ref().map(|s| &s.path), "app endpoint ready");
    let seed = config.seed.unwrap_or_else(rand::random);
    tracing::info!(seed, "placement RNG seeded");

    let node_id = NodeId::new(config.node_id.as_str());
    let capacity = Resources::new(config.cpu_millis, config.memory_mib);
    let mut node_config = NodeRuntimeConfig::new(capacity);
    node_config.reorder_by_job_submit_time = !config.fifo_queue;
    node_config.default_runtime_estimate_ms = config.default_runtime_estimate_ms;
    node_config.max_queue_length = config.max_queue_length;
    let mut executor_config = exec::ExecutorConfig {
        log_dir: config.container_log_dir.clone(),
        log_max_bytes: config.container_log_max_bytes,
        run_as: identity.run_as(),
        state: Some(Arc::clone(&state)),
        ..Default::default()
    };
    if let Some(h) = &handover {
        // Adopted containers' cgroups are below the previous image's root.
        executor_config.cgroup_name = h.cgroup_name.clone();
    }
    let cgroup_name = executor_config.cgroup_name.clone();
    let executor = exec::Executor::detect(executor_config);
    tracing::info!(
        enforcement = executor.enforcement().name(),
        "container executor ready"
    );

    // Bound before the actors start, so a taken port fails start-up naming the setting.
    let metrics_listener = match config.metrics_listen {
        Some(addr) => match handed.metrics.and_then(|fd| inherited_tcp(fd, "metrics")) {
            Some(listener) => Some(listener),
            None => Some(
                metrics::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (--metrics-listen)"))?,
            ),
        },
        None => None,
    };
    let upgrade_context = UpgradeContext {
        node_id: config.node_id.clone(),
        state_dir: config.state_dir.clone(),
        state,
        cgroup_name,
        app_tcp: tcp
            .as_ref()
            .map(|(l, _)| dup_listener(l.as_fd()))
            .transpose()?,
        app_unix: unix.as_ref().map(|l| dup_listener(l.as_fd())).transpose()?,
        metrics: metrics_listener
            .as_ref()
            .map(|l| dup_listener(l.as_fd()))
            .transpose()?,
    };
    let shared = Arc::new(Shared::with_clock(clock));
    let metrics_addr = match metrics_listener {
        Some(listener) => {
            let addr = listener.local_addr().ok();
            metrics::spawn_server(listener, shared.metrics.clone());
            addr
        }
        None => None,
    };
    let (outbox, link_tx) = link_queues::Outbox::new(
        link_queues::OUTBOX_FRAMES,
        link_queues::OUTBOX_REQUEST_FRAMES,
        shared.metrics.clone(),
    );
    let inbox =
        link_queues::NodeInbox::new(link_queues::NODE_INBOX_COMMANDS, shared.metrics.clone());
    let node_thread = NodeThread::spawn().context("starting the node thread")?;
    let node = {
        let (node_id, shared, link_tx, inbox) = (
            node_id.clone(),
            shared.clone(),
            link_tx.clone(),
            inbox.clone(),
        );
        node_actor::NodeActor::start_in_arbiter(&node_thread.0.handle(), move |_| {
            node_actor::NodeActor::new(
                node_id,
                NodeRuntime::new(node_config, shared.clock.now()),
                Rc::new(executor),
                shared,
                link_tx,
                inbox,
            )
        })
    };
    let scheduler = scheduler_actor::SchedulerActor::new(shared.clone(), link_tx, seed).start();
    // Before the join, so the join reports the adopted containers running.
    let adopted = match handover {
        Some(h) => node
            .send(node_actor::Restore(h.node))
            .await
            .context("restoring the handed-over containers")?,
        None => 0,
    };

    let endpoint = app_endpoint::Endpoint {
        node_id: node_id.clone(),
        shared: shared.clone(),
        scheduler: scheduler.clone(),
        node: node.clone(),
        limits: config.app_limits,
        connections: Default::default(),
        refuse_log: Default::default(),
        handshake_log: Default::default(),
    };
    match tcp {
        Some((listener, Some(acceptor))) => {
            actix_rt::spawn(endpoint.clone().serve_tls(listener, acceptor));
        }
        Some((listener, None)) => {
            actix_rt::spawn(endpoint.clone().serve_tcp(listener));
        }
        None => {}
    }
    if let Some(unix) = unix {
        actix_rt::spawn(endpoint.serve_unix(unix));
    }

    let identity = link::Identity {
        node_id: node_id.clone(),
        rack: config.rack.clone(),
        attributes: config.attributes.clone(),
        capacity,
        app_endpoint: app_endpoint.clone(),
        join_token: config.join_token.clone(),
        coordinator: config.coordinator.clone(),
    };
    let (joined_tx, joined_rx) = tokio::sync::oneshot::channel();
    let link = link::Link {
        identity,
        client,
        shared: shared.clone(),
        scheduler: scheduler.clone(),
        node: node.clone(),
        outbox,
        inbox,
        placement_settings: link::PlacementSettings::default(),
    };
    actix_rt::spawn(link.run(Some(joined_tx)));
    let handle = WorkerHandle {
        node_id,
        metrics_addr,
        app_addr,
        app_socket: config.app_socket.as_ref().map(|s| s.path.clone()),
        app_endpoint,
        node,
        scheduler,
        shared,
        adopted,
        upgrade: upgrade_context,
        _node_thread: node_thread,
    };
    Ok((handle, Joining(joined_rx)))
}

/// An app or metrics TCP listener inherited across an upgrade, if `fd` is one (else logged and
/// `None`: the caller binds afresh).
fn inherited_tcp(fd: std::os::fd::RawFd, what: &str) -> Option<tokio::net::TcpListener> {
    use std::os::fd::FromRawFd;
    // SAFETY: the descriptor was handed over for this listener alone (checked by the state
    // file's validation to be named once); it is owned from here on.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    fn ready(
        fd: std::os::fd::RawFd,
        listener: std::net::TcpListener,
    ) -> std::io::Result<tokio::net::TcpListener> {
        listener.local_addr()?; // a socket, of the IP family
        listener.set_nonblocking(true)?;
        set_cloexec(fd)?;
        tokio::net::TcpListener::from_std(listener)
    }
    match ready(fd, listener) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(fd, error = %e, "the handed-over {what} listener is unusable: binding afresh");
            None
        }
    }
}

/// The app Unix-socket listener inherited across an upgrade, if `fd` is one bound to `path`.
fn inherited_unix(
    fd: std::os::fd::RawFd,
    path: &std::path::Path,
) -> Option<tokio::net::UnixListener> {
    use std::os::fd::FromRawFd;
    // SAFETY: as in `inherited_tcp`.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    fn ready(
        fd: std::os::fd::RawFd,
        listener: std::os::unix::net::UnixListener,
        path: &std::path::Path,
    ) -> std::io::Result<tokio::net::UnixListener> {
        let addr = listener.local_addr()?;
        if addr.as_pathname() != Some(path) {
            return Err(std::io::Error::other(format!(
                "it is bound to {addr:?}, not {}",
                path.display()
            )));
        }
        listener.set_nonblocking(true)?;
        set_cloexec(fd)?;
        tokio::net::UnixListener::from_std(listener)
    }
    match ready(fd, listener, path) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(fd, error = %e, "the handed-over app socket is unusable: binding afresh");
            None
        }
    }
}

fn set_cloexec(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor this image owns.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The endpoint grants name for this node (docs/protocol.md §1): `--app-advertise` verbatim if
/// it has a scheme, else with the TCP endpoint's scheme; without it the bound TCP address
/// (`tls://` or `tcp://`), or `unix://` and the socket's absolute path when there is no TCP.
pub fn advertised_endpoint(
    advertise: Option<&str>,
    tcp: Option<&config::AppTcp>,
    bound: Option<SocketAddr>,
    socket: Option<&config::AppSocket>,
) -> anyhow::Result<String> {
    match (advertise, tcp, bound) {
        (Some(a), _, _) if a.contains("://") => Ok(a.to_string()),
        (Some(a), Some(tcp), _) => Ok(format!("{}://{a}", tcp.scheme())),
        (None, Some(tcp), Some(addr)) => Ok(format!("{}://{addr}", tcp.scheme())),
        (Some(a), None, _) => anyhow::bail!(
            "--app-advertise {a:?} names no scheme and there is no TCP endpoint (--app-listen) to take it from: write it as SCHEME://..."
        ),
        (None, _, _) => {
            let socket = socket.context("the worker has no app endpoint")?;
            let path = std::path::absolute(&socket.path)
                .with_context(|| format!("resolving {}", socket.path.display()))?;
            let path = path
                .to_str()
                .with_context(|| format!("the app socket path {} is not UTF-8", path.display()))?;
            Ok(format!("unix://{path}"))
        }
    }
}

/// Bind the app Unix socket: a stale socket at the path is replaced (a live one, or any other
/// file, is an error and left alone); then its mode and group are set.
fn bind_app_socket(socket: &config::AppSocket) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let path = &socket.path;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            // A socket someone still accepts on is another worker's, not a stale one.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                anyhow::bail!(
                    "--app-socket {} is served by another process (another worker?): refusing to take it over",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing the stale app socket {}", path.display()))?;
        }
        Ok(_) => anyhow::bail!(
            "--app-socket {} exists and is not a socket: refusing to replace it",
            path.display()
        ),
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding the app Unix socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(socket.mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    if let Some(gid) = socket.gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("setting the group of {} to {gid}", path.display()))?;
    }
    Ok(listener)
}

/// Containers must not read the worker's secrets: warn when the join token file could be read
/// by users other than the worker's (the file is the operator's, so it is not changed here).
fn warn_if_readable_by_others(config: &WorkerConfig) {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = &config.join_token_file else {
        return;
    };
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o044 != 0
    {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the join token file is readable by group or others: make it 0600 so containers cannot read it"
        );
    }
}

//! The worker's typed configuration: command-line flags (with `env`), an optional TOML file with
//! the same keys (flags win), and defaults.

use crate::exec::user::{RunAs, resolve_container_user};
use anyhow::{Context, bail};
use scheduler_core::protocol::limits::MAX_CONTAINERS_PER_NODE;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `worker run` flags. Every field is optional here so the TOML file can supply it.
#[derive(Debug, Default, Clone, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// Coordinator QUIC address (host:port).
    #[arg(long, env = "WORKER_COORDINATOR")]
    pub coordinator: Option<String>,
    /// The cluster CA certificate (PEM) the coordinator's certificate must chain to (pinned).
    #[arg(long, env = "WORKER_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// File holding the cluster's join token.
    #[arg(long, env = "WORKER_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
    /// The join token itself (instead of --join-token-file). A command-line value is visible to
    /// every local user, containers included, in the process list: prefer the file (0600) or
    /// the environment variable.
    #[arg(long, env = "WORKER_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// This node's name, unique in the cluster [default: the host name].
    #[arg(long, env = "WORKER_NODE_ID")]
    pub node_id: Option<String>,
    /// Rack name (locality) [default: default-rack].
    #[arg(long, env = "WORKER_RACK")]
    pub rack: Option<String>,
    /// CPU given to containers, in millicores [default: 1000 per core of this machine].
    #[arg(long, env = "WORKER_CPU_MILLIS")]
    pub cpu_millis: Option<u64>,
    /// Memory given to containers, in MiB [default: 80% of this machine's memory].
    #[arg(long, env = "WORKER_MEMORY_MIB")]
    pub memory_mib: Option<u64>,
    /// Address of the application endpoint (TCP) [default: 127.0.0.1:7500].
    #[arg(long, env = "WORKER_APP_LISTEN")]
    pub app_listen: Option<SocketAddr>,
    /// Endpoint other workers' grants name for this node [default: the bound listen address].
    #[arg(long, env = "WORKER_APP_ADVERTISE")]
    pub app_advertise: Option<String>,
    /// Also serve the application protocol on this Unix socket.
    #[arg(long, env = "WORKER_APP_SOCKET")]
    pub app_socket: Option<PathBuf>,
    /// Where container stdout/stderr files go (created 0700, files 0600) [default: discarded].
    #[arg(long, env = "WORKER_LOG_DIR")]
    pub container_log_dir: Option<PathBuf>,
    /// User containers run as: a user name, a uid, or uid:gid [default: the `nobody` user, or
    /// 65534:65534 when there is none]. Only a worker running as root can switch users; any
    /// other worker runs containers as its own uid (and logs that once at start).
    #[arg(long, env = "WORKER_CONTAINER_USER")]
    pub container_user: Option<String>,
    /// Allow containers to run as root (uid 0). Without it the worker refuses to start when
    /// they would (container_user root or 0).
    #[arg(long, env = "WORKER_ALLOW_ROOT_CONTAINERS", num_args = 0..=1, default_missing_value = "true")]
    #[serde(default)]
    pub allow_root_containers: Option<bool>,
    /// Where the worker records its running containers (dir 0700, locked: one worker per dir),
    /// so that after a crash the restarted worker kills what its previous incarnation left
    /// running [default: /var/lib/hybrid-worker/NODE_ID as root, else
    /// $XDG_STATE_HOME/hybrid-worker/NODE_ID or ~/.local/state/hybrid-worker/NODE_ID].
    #[arg(long, env = "WORKER_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Runtime assumed for containers without an estimate, for the queue-delay estimate [default: 10000].
    #[arg(long, env = "WORKER_DEFAULT_RUNTIME_ESTIMATE_MS")]
    pub default_runtime_estimate_ms: Option<u64>,
    /// Queue QUEUEABLE containers in arrival order instead of by job submit time (Mercury §4.3).
    #[arg(long, env = "WORKER_FIFO_QUEUE")]
    #[serde(default)]
    pub fifo_queue: Option<bool>,
    /// Bound on queued QUEUEABLE containers [default: 10000].
    #[arg(long, env = "WORKER_MAX_QUEUE_LENGTH")]
    pub max_queue_length: Option<usize>,
    /// Close an app connection that sends no hello within this many ms [default: 10000].
    #[arg(long, env = "WORKER_APP_HELLO_TIMEOUT_MS")]
    pub app_hello_timeout_ms: Option<u64>,
    /// Most application connections served at once [default: 4096].
    #[arg(long, env = "WORKER_MAX_APP_CONNECTIONS")]
    pub max_app_connections: Option<usize>,
    /// Most application connections from one IP address at once [default: 1024].
    #[arg(long, env = "WORKER_MAX_APP_CONNECTIONS_PER_SOURCE")]
    pub max_app_connections_per_source: Option<usize>,
    /// Requests of one connection handed to the scheduler and node before it is read on [default: 128].
    #[arg(long, env = "WORKER_APP_MAX_IN_FLIGHT")]
    pub app_max_in_flight: Option<usize>,
    /// Bytes of answers and events queued for one connection above which it is closed [default: 16777216].
    #[arg(long, env = "WORKER_APP_MAX_QUEUED_BYTES")]
    pub app_max_queued_bytes: Option<usize>,
    /// Close a connection whose client has not read its answers for this many ms [default: 30000].
    #[arg(long, env = "WORKER_APP_WRITE_STALL_TIMEOUT_MS")]
    pub app_write_stall_timeout_ms: Option<u64>,
    /// Seed of the placement RNG [default: drawn from the OS and logged].
    #[arg(long, env = "WORKER_SEED")]
    pub seed: Option<u64>,
    /// TOML file with the same keys as these flags (snake_case); flags win.
    #[arg(long, env = "WORKER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub coordinator: String,
    pub ca_cert: PathBuf,
    pub join_token: String,
    /// Where the join token was read from, if from a file (its mode is checked at start).
    pub join_token_file: Option<PathBuf>,
    pub node_id: String,
    pub rack: String,
    pub cpu_millis: u64,
    pub memory_mib: u64,
    pub app_listen: SocketAddr,
    pub app_advertise: Option<String>,
    pub app_socket: Option<PathBuf>,
    pub container_log_dir: Option<PathBuf>,
    /// The identity containers should run as (see [`crate::exec::user`]).
    pub container_user: RunAs,
    pub allow_root_containers: bool,
    /// The state dir (see `--state-dir`).
    pub state_dir: PathBuf,
    pub default_runtime_estimate_ms: u64,
    pub fifo_queue: bool,
    pub max_queue_length: usize,
    pub seed: Option<u64>,
    pub app_limits: AppLimits,
}

/// Bounds on application connections (docs/protocol.md §10, docs/reliability.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppLimits {
    /// A connection that has not sent its hello by then gets `hello_required` and is closed.
    pub hello_timeout: Duration,
    /// Connections served at once; more get `too_many_connections` and are closed.
    pub max_connections: usize,
    /// Connections from one IP address at once (TCP; the Unix socket counts in the total only).
    pub max_connections_per_source: usize,
    /// Requests of one connection at the actors at once: the connection is not read further
    /// until one is handled.
    pub max_in_flight: usize,
    /// Queued answer/event bytes above which the connection is not read further.
    pub pause_queued_bytes: usize,
    /// Queued answer/event bytes above which the connection is closed (the client does not read).
    pub max_queued_bytes: usize,
    /// A write the client does not take within this long closes the connection.
    pub write_stall_timeout: Duration,
}

impl Default for AppLimits {
    fn default() -> Self {
        AppLimits {
            hello_timeout: Duration::from_secs(10),
            max_connections: 4096,
            max_connections_per_source: 1024,
            max_in_flight: 128,
            pause_queued_bytes: 1 << 20,
            max_queued_bytes: 16 << 20,
            write_stall_timeout: Duration::from_secs(30),
        }
    }
}

macro_rules! merge {
    ($flags:ident, $file:ident, $($f:ident),*) => {
        $( if $flags.$f.is_none() { $flags.$f = $file.$f.clone(); } )*
    };
}

impl RunArgs {
    /// Merge with the TOML file (if any) and apply defaults.
    pub fn resolve(mut self) -> anyhow::Result<WorkerConfig> {
        if let Some(path) = self.config.clone() {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            let file: RunArgs = toml::from_str(&text)
                .with_context(|| format!("parsing config file {}", path.display()))?;
            merge!(
                self,
                file,
                coordinator,
                ca_cert,
                join_token_file,
                join_token,
                node_id,
                rack,
                cpu_millis,
                memory_mib,
                app_listen,
                app_advertise,
                app_socket,
                container_log_dir,
                container_user,
                allow_root_containers,
                state_dir,
                default_runtime_estimate_ms,
                fifo_queue,
                max_queue_length,
                app_hello_timeout_ms,
                max_app_connections,
                max_app_connections_per_source,
                app_max_in_flight,
                app_max_queued_bytes,
                app_write_stall_timeout_ms,
                seed
            );
        }
        let Some(coordinator) = self.coordinator else {
            bail!("--coordinator HOST:PORT is required")
        };
        let Some(ca_cert) = self.ca_cert else {
            bail!("--ca-cert PATH (the cluster CA) is required")
        };
        let join_token_file = self.join_token_file.filter(|_| self.join_token.is_none());
        let join_token = match (self.join_token, &join_token_file) {
            (Some(t), _) => t,
            (None, Some(path)) => read_token(path)?,
            (None, None) => {
                bail!("a join token is required: --join-token-file PATH or --join-token")
            }
        };
        let node_id = match self.node_id {
            Some(n) => n,
            None => hostname().context("no --node-id given and the host name is unreadable")?,
        };
        if node_id.is_empty() || node_id.len() > 253 {
            bail!("--node-id must be 1 to 253 characters, got {node_id:?}");
        }
        let cpu_millis = self.cpu_millis.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u64 * 1000)
                .unwrap_or(1000)
        });
        let memory_mib = match self.memory_mib {
            Some(m) => m,
            None => machine_memory_mib().map(|m| m * 8 / 10).unwrap_or(1024),
        };
        if cpu_millis == 0 || memory_mib == 0 {
            bail!(
                "--cpu-millis and --memory-mib must be positive (got {cpu_millis} and {memory_mib})"
            );
        }
        let container_user = resolve_container_user(self.container_user.as_deref())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let state_dir = self
            .state_dir
            .unwrap_or_else(|| default_state_dir(&node_id));
        let max_queue_length = self.max_queue_length.unwrap_or(10_000);
        if max_queue_length > MAX_CONTAINERS_PER_NODE {
            bail!(
                "--max-queue-length {max_queue_length} is above the most containers a node may hold ({MAX_CONTAINERS_PER_NODE})"
            );
        }
        let defaults = AppLimits::default();
        let app_limits = AppLimits {
            hello_timeout: self
                .app_hello_timeout_ms
                .map_or(defaults.hello_timeout, Duration::from_millis),
            max_connections: self.max_app_connections.unwrap_or(defaults.max_connections),
            max_connections_per_source: self
                .max_app_connections_per_source
                .unwrap_or(defaults.max_connections_per_source),
            max_in_flight: self.app_max_in_flight.unwrap_or(defaults.max_in_flight),
            pause_queued_bytes: defaults.pause_queued_bytes,
            max_queued_bytes: self
                .app_max_queued_bytes
                .unwrap_or(defaults.max_queued_bytes),
            write_stall_timeout: self
                .app_write_stall_timeout_ms
                .map_or(defaults.write_stall_timeout, Duration::from_millis),
        };
        if app_limits.max_connections == 0
            || app_limits.max_connections_per_source == 0
            || app_limits.max_in_flight == 0
            || app_limits.hello_timeout.is_zero()
            || app_limits.write_stall_timeout.is_zero()
        {
            bail!("app connection limits and timeouts must be positive: {app_limits:?}");
        }
        // An answer is at most one frame: the queue must hold at least a few.
        let min_queued = 4 * scheduler_core::codec::APP_MAX_FRAME;
        if app_limits.max_queued_bytes < min_queued {
            bail!("--app-max-queued-bytes must be at least {min_queued} (four frames)");
        }
        let app_limits = AppLimits {
            pause_queued_bytes: app_limits
                .pause_queued_bytes
                .min(app_limits.max_queued_bytes / 4),
            ..app_limits
        };
        Ok(WorkerConfig {
            coordinator,
            ca_cert,
            join_token,
            join_token_file,
            node_id,
            rack: self.rack.unwrap_or_else(|| "default-rack".to_string()),
            cpu_millis,
            memory_mib,
            app_listen: self
                .app_listen
                .unwrap_or_else(|| "127.0.0.1:7500".parse().expect("valid literal")),
            app_advertise: self.app_advertise,
            app_socket: self.app_socket,
            container_log_dir: self.container_log_dir,
            container_user,
            allow_root_containers: self.allow_root_containers.unwrap_or(false),
            state_dir,
            default_runtime_estimate_ms: self.default_runtime_estimate_ms.unwrap_or(10_000),
            fifo_queue: self.fifo_queue.unwrap_or(false),
            max_queue_length,
            seed: self.seed,
            app_limits,
        })
    }
}

/// The default state dir of node `node_id` (see `--state-dir`); the node id is reduced to
/// `[A-Za-z0-9._-]` so it is one path component.
pub fn default_state_dir(node_id: &str) -> PathBuf {
    let mut name: String = node_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with('.') {
        name.insert(0, '_');
    }
    let env_dir = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = if crate::exec::user::effective_uid() == 0 {
        PathBuf::from("/var/lib/hybrid-worker")
    } else if let Some(state) = env_dir("XDG_STATE_HOME") {
        state.join("hybrid-worker")
    } else if let Some(home) = env_dir("HOME") {
        home.join(".local/state/hybrid-worker")
    } else {
        std::env::temp_dir().join(format!(
            "hybrid-worker-{}",
            crate::exec::user::effective_uid()
        ))
    };
    base.join(name)
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let t = std::fs::read_to_string(path)
        .with_context(|| format!("reading join token file {}", path.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() {
        bail!("join token file {} is empty", path.display());
    }
    Ok(t)
}

fn hostname() -> anyhow::Result<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    Ok(h.trim().to_string())
}

fn machine_memory_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

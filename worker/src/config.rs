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
    /// A node attribute KEY=VALUE (repeatable), e.g. `--attribute gpu=yes`: 3Sigma job
    /// descriptions name them in their constraints (equivalence sets). In the TOML file: a
    /// list of "KEY=VALUE" strings.
    #[arg(long = "attribute", value_name = "KEY=VALUE")]
    #[serde(default)]
    pub attribute: Vec<String>,
    /// CPU given to containers, in millicores [default: 1000 per core of this machine].
    #[arg(long, env = "WORKER_CPU_MILLIS")]
    pub cpu_millis: Option<u64>,
    /// Memory given to containers, in MiB [default: 80% of this machine's memory].
    #[arg(long, env = "WORKER_MEMORY_MIB")]
    pub memory_mib: Option<u64>,
    /// Serve applications over TCP on this address. Needs TLS (--app-tls-cert FILE
    /// --app-tls-key FILE) or an explicit --app-plaintext-tcp [default: no TCP listener; only
    /// the Unix socket, see --app-socket].
    #[arg(long, env = "WORKER_APP_LISTEN", value_name = "ADDR")]
    pub app_listen: Option<SocketAddr>,
    /// TLS certificate (PEM chain) of the TCP app endpoint, issued under the cluster CA
    /// (`coordinator issue-app-cert`); applications verify it with the cluster ca.pem.
    #[arg(long, env = "WORKER_APP_TLS_CERT", value_name = "FILE")]
    pub app_tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --app-tls-cert.
    #[arg(long, env = "WORKER_APP_TLS_KEY", value_name = "FILE")]
    pub app_tls_key: Option<PathBuf>,
    /// Serve --app-listen in plaintext (no TLS): app secrets and tokens cross the network in
    /// clear text. Only for loopback or a trusted network; never the default.
    #[arg(long, env = "WORKER_APP_PLAINTEXT_TCP", num_args = 0..=1, default_missing_value = "true")]
    #[serde(default)]
    pub app_plaintext_tcp: Option<bool>,
    /// Endpoint other workers' grants name for this node, `HOST:PORT` (the worker adds its
    /// scheme, tls:// or tcp://) or a full `SCHEME://...` [default: the bound TCP address, or
    /// the Unix socket when there is no TCP listener].
    #[arg(long, env = "WORKER_APP_ADVERTISE")]
    pub app_advertise: Option<String>,
    /// Serve applications on this Unix socket [default: STATE_DIR/app.sock when --app-listen
    /// is not given; none otherwise].
    #[arg(long, env = "WORKER_APP_SOCKET", value_name = "PATH")]
    pub app_socket: Option<PathBuf>,
    /// Permissions of the Unix socket, octal [default: 660]: the worker's user and group may
    /// connect.
    #[arg(long, env = "WORKER_APP_SOCKET_MODE", value_name = "OCTAL")]
    pub app_socket_mode: Option<String>,
    /// Group owning the Unix socket (a name or a gid) [default: the worker's group].
    #[arg(long, env = "WORKER_APP_SOCKET_GROUP", value_name = "GROUP")]
    pub app_socket_group: Option<String>,
    /// Where container stdout/stderr files go (created 0700, files 0600) [default: discarded].
    #[arg(long, env = "WORKER_LOG_DIR")]
    pub container_log_dir: Option<PathBuf>,
    /// Most bytes kept of each container's stdout and of its stderr; the rest is read and
    /// discarded, so a container cannot fill the worker's disk [default: 64].
    #[arg(long, env = "WORKER_CONTAINER_LOG_MAX_MIB", value_name = "MIB")]
    pub container_log_max_mib: Option<u64>,
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
    /// HTTP address serving Prometheus metrics at GET /metrics (e.g. 127.0.0.1:9401; port 0
    /// picks one) [default: off].
    #[arg(long, env = "WORKER_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
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
    /// `--attribute KEY=VALUE` (3Sigma's node constraints).
    pub attributes: std::collections::BTreeMap<String, String>,
    pub cpu_millis: u64,
    pub memory_mib: u64,
    /// The TCP app endpoint, if any.
    pub app_tcp: Option<AppTcp>,
    pub app_advertise: Option<String>,
    /// The Unix-socket app endpoint, if any (at least one of the two is set).
    pub app_socket: Option<AppSocket>,
    pub container_log_dir: Option<PathBuf>,
    /// Most bytes kept of each container's stdout and of its stderr.
    pub container_log_max_bytes: u64,
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
    /// Address of `GET /metrics`; off when absent.
    pub metrics_listen: Option<SocketAddr>,
}

/// The TCP app endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppTcp {
    pub listen: SocketAddr,
    /// `None`: plaintext, chosen explicitly with `--app-plaintext-tcp`.
    pub tls: Option<AppTls>,
}

impl AppTcp {
    /// TLS with the given files.
    pub fn tls(listen: SocketAddr, cert: PathBuf, key: PathBuf) -> AppTcp {
        AppTcp {
            listen,
            tls: Some(AppTls { cert, key }),
        }
    }
    /// Plaintext (the explicit choice).
    pub fn plaintext(listen: SocketAddr) -> AppTcp {
        AppTcp { listen, tls: None }
    }
    /// The scheme of the advertised endpoint (docs/protocol.md §1).
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "tls" } else { "tcp" }
    }
}

/// Certificate chain and key of the TLS app endpoint (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The Unix-socket app endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSocket {
    pub path: PathBuf,
    /// Permission bits set on the socket after binding.
    pub mode: u32,
    /// Group set on the socket after binding (`None`: the worker's).
    pub gid: Option<u32>,
}

impl AppSocket {
    /// A socket at `path` with the default mode 0660 and the worker's group.
    pub fn new(path: impl Into<PathBuf>) -> AppSocket {
        AppSocket {
            path: path.into(),
            mode: 0o660,
            gid: None,
        }
    }
}

/// The flags that choose the app transport, checked together: TCP needs TLS or the explicit
/// plaintext flag; with no TCP the Unix socket is the default (`default_socket`).
pub fn resolve_app_transport(
    listen: Option<SocketAddr>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    plaintext: bool,
    socket: Option<PathBuf>,
    default_socket: PathBuf,
) -> anyhow::Result<(Option<AppTcp>, PathBuf, bool)> {
    let tcp = match (listen, tls_cert, tls_key) {
        (None, None, None) => {
            if plaintext {
                bail!("--app-plaintext-tcp needs --app-listen ADDR (the TCP address to serve)");
            }
            None
        }
        (None, _, _) => bail!(
            "--app-tls-cert and --app-tls-key need --app-listen ADDR (the TCP address to serve with TLS)"
        ),
        (Some(addr), Some(cert), Some(key)) => {
            if plaintext {
                bail!(
                    "--app-plaintext-tcp contradicts --app-tls-cert/--app-tls-key: choose TLS or plaintext for --app-listen {addr}"
                );
            }
            Some(AppTcp::tls(addr, cert, key))
        }
        (Some(addr), Some(_), None) | (Some(addr), None, Some(_)) => bail!(
            "--app-listen {addr} with TLS needs both --app-tls-cert FILE and --app-tls-key FILE"
        ),
        (Some(addr), None, None) => {
            if !plaintext {
                bail!(
                    "--app-listen {addr} would serve applications in plaintext: give --app-tls-cert FILE --app-tls-key FILE \
                     (a certificate from `coordinator issue-app-cert`), or --app-plaintext-tcp to choose plaintext explicitly, \
                     or drop --app-listen and use the Unix socket (--app-socket PATH)"
                );
            }
            Some(AppTcp::plaintext(addr))
        }
    };
    let explicit_socket = socket.is_some();
    let socket = socket.unwrap_or(default_socket);
    Ok((tcp, socket, explicit_socket))
}

/// A group name or numeric gid.
fn resolve_group(group: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).context("--app-socket-group has a NUL byte")?;
    // SAFETY: `libc::group` is plain data (integers and pointers); all zeros is a valid value.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives the use of `grp`'s strings,
    // and only `gr_gid` (a plain integer) is read.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        )
    };
    if rc != 0 || out.is_null() {
        bail!("--app-socket-group {group:?}: no such group");
    }
    Ok(grp.gr_gid)
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

/// Most attributes a node may carry, and bytes of each key and value.
pub const MAX_NODE_ATTRIBUTES: usize = 32;
pub const MAX_ATTRIBUTE_BYTES: usize = 128;

/// `KEY=VALUE` strings into a map; a bad one is named.
pub fn parse_attributes(
    given: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    if given.len() > MAX_NODE_ATTRIBUTES {
        bail!("--attribute: at most {MAX_NODE_ATTRIBUTES} attributes");
    }
    let mut out = std::collections::BTreeMap::new();
    for a in given {
        let Some((k, v)) = a.split_once('=') else {
            bail!("--attribute {a:?}: expected KEY=VALUE");
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() || k.len() > MAX_ATTRIBUTE_BYTES || v.len() > MAX_ATTRIBUTE_BYTES {
            bail!(
                "--attribute {a:?}: the key must be non-empty and key and value at most {MAX_ATTRIBUTE_BYTES} bytes"
            );
        }
        if out.insert(k.to_string(), v.to_string()).is_some() {
            bail!("--attribute {k:?} is given twice");
        }
    }
    Ok(out)
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
            if self.attribute.is_empty() {
                self.attribute = file.attribute.clone();
            }
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
                app_tls_cert,
                app_tls_key,
                app_plaintext_tcp,
                app_advertise,
                app_socket,
                app_socket_mode,
                app_socket_group,
                container_log_dir,
                container_log_max_mib,
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
                seed,
                metrics_listen
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
        let (app_tcp, socket_path, explicit_socket) = resolve_app_transport(
            self.app_listen,
            self.app_tls_cert,
            self.app_tls_key,
            self.app_plaintext_tcp.unwrap_or(false),
            self.app_socket,
            state_dir.join("app.sock"),
        )?;
        let app_socket = if explicit_socket || app_tcp.is_none() {
            let mode = match &self.app_socket_mode {
                Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
                    .ok()
                    .filter(|m| *m <= 0o777)
                    .with_context(|| {
                        format!("--app-socket-mode {m:?} is not octal permission bits like 660")
                    })?,
                None => 0o660,
            };
            let gid = match &self.app_socket_group {
                Some(g) => Some(resolve_group(g)?),
                None => None,
            };
            Some(AppSocket {
                path: socket_path,
                mode,
                gid,
            })
        } else {
            if self.app_socket_mode.is_some() || self.app_socket_group.is_some() {
                bail!("--app-socket-mode and --app-socket-group need --app-socket PATH");
            }
            None
        };
        let container_log_max_mib = self.container_log_max_mib.unwrap_or(64);
        if container_log_max_mib == 0 || container_log_max_mib > 1 << 20 {
            bail!(
                "--container-log-max-mib {container_log_max_mib} must be between 1 and {} (1 TiB)",
                1u64 << 20
            );
        }
        let container_log_max_bytes = container_log_max_mib << 20;
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
        let attributes = parse_attributes(&self.attribute)?;
        Ok(WorkerConfig {
            attributes,
            coordinator,
            ca_cert,
            join_token,
            join_token_file,
            node_id,
            rack: self.rack.unwrap_or_else(|| "default-rack".to_string()),
            cpu_millis,
            memory_mib,
            app_tcp,
            app_advertise: self.app_advertise,
            app_socket,
            container_log_dir: self.container_log_dir,
            container_log_max_bytes,
            container_user,
            allow_root_containers: self.allow_root_containers.unwrap_or(false),
            state_dir,
            default_runtime_estimate_ms: self.default_runtime_estimate_ms.unwrap_or(10_000),
            fifo_queue: self.fifo_queue.unwrap_or(false),
            max_queue_length,
            seed: self.seed,
            app_limits,
            metrics_listen: self.metrics_listen,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The example shipped for bare-metal installs (deploy/config) parses: every key is one
    /// `worker run` knows (unknown keys are refused).
    #[test]
    fn the_example_config_in_deploy_parses() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/worker.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let file: RunArgs = toml::from_str(&text).unwrap();
        assert_eq!(file.node_id.as_deref(), Some("node-17"));
        assert_eq!(file.cpu_millis, Some(30_000));
        assert_eq!(file.metrics_listen, Some("127.0.0.1:9401".parse().unwrap()));
    }
}

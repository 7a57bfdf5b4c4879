//! `testbed local`: a coordinator and N workers as separate OS processes on loopback, started
//! from the binaries that sit next to this one, for demos, tests and benchmarks.

use anyhow::{Context, bail};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How the workers of `testbed local` serve applications (docs/protocol.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AppTransport {
    /// TLS on loopback TCP, with a certificate per worker issued under the cluster CA at start
    /// (`coordinator issue-app-cert`); clients verify with the cluster ca.pem.
    #[default]
    Tls,
    /// Plaintext on loopback TCP (`worker run --app-plaintext-tcp`).
    PlaintextTcp,
    /// A Unix socket per worker in the data dir (no TCP listener).
    Unix,
}

/// Options of `testbed local`.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalArgs {
    /// Number of workers.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// CPU per worker in millicores.
    #[arg(long, default_value_t = 4000)]
    pub cpu_millis: u64,
    /// Memory per worker in MiB.
    #[arg(long, default_value_t = 4096)]
    pub memory_mib: u64,
    /// Data dir for the coordinator and logs [default: a fresh temporary dir].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Heartbeat period the coordinator asks workers to use.
    #[arg(long, default_value_t = 250)]
    pub heartbeat_interval_ms: u64,
    /// A worker silent this long is declared lost.
    #[arg(long, default_value_t = 3000)]
    pub node_timeout_ms: u64,
    /// Shedding policy (off, avg+sigma, avg+2sigma).
    #[arg(long, default_value = "avg+sigma")]
    pub shedding: String,
    /// Give up if a process has not printed its ready line after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub ready_timeout_s: u64,
    /// How workers serve applications.
    #[arg(long, value_enum, default_value_t = AppTransport::Tls)]
    pub app_transport: AppTransport,
    /// Run the coordinator's resource shaper (Pace) with passes this often [default: off].
    #[arg(long)]
    pub shaping_interval_ms: Option<u64>,
}

impl Default for LocalArgs {
    fn default() -> Self {
        LocalArgs {
            workers: 3,
            cpu_millis: 4000,
            memory_mib: 4096,
            data_dir: None,
            heartbeat_interval_ms: 250,
            node_timeout_ms: 3000,
            shedding: "avg+sigma".into(),
            ready_timeout_s: 60,
            app_transport: AppTransport::Tls,
            shaping_interval_ms: None,
        }
    }
}

/// A worker of the local cluster.
#[derive(Debug, Clone, Serialize)]
pub struct LocalWorker {
    pub node_id: String,
    /// As the worker advertises it: `tls://127.0.0.1:PORT`, `tcp://...` or `unix:///...`.
    pub app_endpoint: String,
    /// `HOST:PORT` of the worker's HTTP server (`GET /metrics`).
    pub http: Option<String>,
}

/// The running processes. Dropping it stops them all.
pub struct LocalCluster {
    pub coordinator: String,
    /// `HOST:PORT` of the coordinator's HTTP server (`GET /metrics`).
    pub coordinator_http: Option<String>,
    pub workers: Vec<LocalWorker>,
    pub app_id: String,
    pub app_secret: String,
    pub data_dir: PathBuf,
    /// The cluster CA (`tls://` workers' certificates chain to it).
    pub ca_cert: PathBuf,
    children: Vec<(String, Child, PathBuf)>,
    temp_dir: Option<tempfile::TempDir>,
}

/// Where the `coordinator` and `worker` binaries are: next to this executable (cargo puts all
/// of a workspace's binaries in one directory; test executables live one level below).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the testbed executable")?;
    let mut dirs = vec![];
    if let Some(d) = exe.parent() {
        dirs.push(d.to_path_buf());
        if let Some(up) = d.parent() {
            dirs.push(up.to_path_buf());
        }
    }
    for d in &dirs {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "the `{name}` binary is not next to {}; build it first with `cargo build --release -p coordinator -p worker` \
         (or `cargo build -p coordinator -p worker` for a debug testbed, or run everything through `cargo run`)",
        exe.display()
    )
}

/// The first stdout line of a child, delivered by a thread that then keeps draining the pipe
/// (a child writing to a closed pipe would get EPIPE).
pub(crate) type ReadyLine = mpsc::Receiver<std::io::Result<Option<String>>>;

pub(crate) fn read_ready_line(stdout: ChildStdout) -> ReadyLine {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().transpose());
        for _ in lines.by_ref() {}
    });
    rx
}

/// Wait for a child's JSON ready line until `deadline`.
pub(crate) fn ready_json(
    rx: &ReadyLine,
    what: &str,
    deadline: Instant,
) -> anyhow::Result<serde_json::Value> {
    let line = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Ok(Some(line))) => line,
        Ok(Ok(None)) => bail!("{what} exited (or closed its stdout) before it was ready"),
        Ok(Err(e)) => bail!("reading the ready line of {what}: {e}"),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            bail!("{what} printed no ready line in time (see --ready-timeout-s)")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => bail!("{what}'s stdout reader stopped"),
    };
    serde_json::from_str(line.trim())
        .with_context(|| format!("{what} printed {line:?}, not its JSON ready line"))
}

/// A command for a child that dies with us: SIGTERM when the thread that spawned it exits
/// (the launcher's main thread; the whole process if it is killed with SIGKILL), so a crashed
/// launcher leaves no orphans (Linux `PR_SET_PDEATHSIG`).
pub(crate) fn child_command(program: &Path) -> Command {
    let launcher = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(program);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2) and
    // getppid(2), both async-signal-safe; it allocates nothing on the success path.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died between fork and prctl: then do not start at all.
            if libc::getppid() != launcher {
                return Err(std::io::Error::other("the launcher exited"));
            }
            Ok(())
        });
    }
    cmd
}

impl LocalCluster {
    /// Start everything and wait until every worker has joined.
    pub fn start(args: &LocalArgs) -> anyhow::Result<LocalCluster> {
        if args.workers == 0 {
            bail!("--workers must be at least 1");
        }
        let worker_bin = sibling_binary("worker")?;
        let mut cluster = LocalCluster::start_coordinator(args)?;
        let data_dir = cluster.data_dir.clone();
        let coord_dir = data_dir.join("coordinator");
        let coordinator_bin = sibling_binary("coordinator")?;
        let deadline = Instant::now() + Duration::from_secs(args.ready_timeout_s);
        let mut pending = vec![];
        for i in 1..=args.workers {
            let name = format!("worker-{i}");
            let log = data_dir.join(format!("{name}.log"));
            let mut command = child_command(&worker_bin);
            command
                .arg("run")
                .args(["--coordinator", &cluster.coordinator])
                .arg("--ca-cert")
                .arg(coord_dir.join("ca.pem"))
                .arg("--join-token-file")
                .arg(coord_dir.join("join-token"))
                .args([
                    "--node-id",
                    &name,
                    "--rack",
                    &format!("rack-{}", (i - 1) % 2),
                ])
                .args([
                    "--cpu-millis",
                    &args.cpu_millis.to_string(),
                    "--memory-mib",
                    &args.memory_mib.to_string(),
                ]);
            match args.app_transport {
                AppTransport::Tls => {
                    let (cert, key) =
                        issue_app_cert(&coordinator_bin, &coord_dir, &data_dir, &name)?;
                    command
                        .args(["--app-listen", "127.0.0.1:0", "--app-tls-cert"])
                        .arg(cert)
                        .arg("--app-tls-key")
                        .arg(key);
                }
                AppTransport::PlaintextTcp => {
                    command.args(["--app-listen", "127.0.0.1:0", "--app-plaintext-tcp"]);
                }
                AppTransport::Unix => {
                    command
                        .arg("--app-socket")
                        .arg(data_dir.join(format!("{name}.sock")));
                }
            }
            let mut child = command
                // Each worker its own state dir (the default is per node id under
                // /var/lib/hybrid-worker, shared by every local cluster on the machine, and a
                // worker kills the containers recorded in its state dir at start).
                .arg("--state-dir")
                .arg(data_dir.join(format!("{name}-state")))
                .args(["--metrics-listen", "127.0.0.1:0"])
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log)?)
                .spawn()
                .with_context(|| format!("starting {name}"))?;
            pending.push((
                name.clone(),
                read_ready_line(child.stdout.take().expect("stdout is piped")),
            ));
            cluster.children.push((name, child, log));
        }
        for (name, stdout) in pending {
            let ready = cluster.ready_or_report(&stdout, &name, deadline)?;
            cluster.workers.push(LocalWorker {
                node_id: ready["node_id"].as_str().unwrap_or(&name).to_string(),
                app_endpoint: ready["app_endpoint"]
                    .as_str()
                    .context("worker ready line has no app_endpoint")?
                    .to_string(),
                http: ready["metrics_addr"].as_str().map(str::to_string),
            });
        }
        Ok(cluster)
    }

    /// The coordinator alone (initialised in the data dir, running, ready), without workers:
    /// `testbed fleet` brings its own nodes. `args.workers` is not used.
    pub fn start_coordinator(args: &LocalArgs) -> anyhow::Result<LocalCluster> {
        let coordinator_bin = sibling_binary("coordinator")?;
        let (temp, data_dir) = match &args.data_dir {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                (None, d.clone())
            }
            None => {
                let t = tempfile::tempdir().context("creating a temporary data dir")?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let coord_dir = data_dir.join("coordinator");
        let cluster_json = coord_dir.join("cluster.json");
        if !cluster_json.exists() {
            let out = Command::new(&coordinator_bin)
                .args(["init", "--data-dir"])
                .arg(&coord_dir)
                .args(["--app", "demo"])
                .output()
                .context("running coordinator init")?;
            if !out.status.success() {
                bail!(
                    "coordinator init failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let creds: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&cluster_json)
                .with_context(|| format!("reading {}", cluster_json.display()))?,
        )?;
        let app = &creds["apps"][0];
        let (app_id, app_secret) = match (app["app_id"].as_str(), app["app_secret"].as_str()) {
            (Some(i), Some(s)) => (i.to_string(), s.to_string()),
            _ => bail!("{} names no app with a secret", cluster_json.display()),
        };
        let mut cluster = LocalCluster {
            coordinator: String::new(),
            coordinator_http: None,
            workers: vec![],
            app_id,
            app_secret,
            data_dir: data_dir.clone(),
            ca_cert: coord_dir.join("ca.pem"),
            children: vec![],
            temp_dir: temp,
        };
        let deadline = Instant::now() + Duration::from_secs(args.ready_timeout_s);
        cluster.coordinator = cluster.spawn_coordinator(args, "127.0.0.1:0", deadline)?;
        Ok(cluster)
    }

    /// Start the coordinator on `listen` and wait for its ready line; returns its QUIC address.
    fn spawn_coordinator(
        &mut self,
        args: &LocalArgs,
        listen: &str,
        deadline: Instant,
    ) -> anyhow::Result<String> {
        let coordinator_bin = sibling_binary("coordinator")?;
        let coord_dir = self.data_dir.join("coordinator");
        let log = self.data_dir.join("coordinator.log");
        // Appended to, so a restart keeps the previous incarnation's log.
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut child = child_command(&coordinator_bin)
            .args(["run", "--data-dir"])
            .arg(&coord_dir)
            .args(["--listen", listen])
            .args([
                "--heartbeat-interval-ms",
                &args.heartbeat_interval_ms.to_string(),
            ])
            .args(["--node-timeout-ms", &args.node_timeout_ms.to_string()])
            .args(["--shedding", &args.shedding])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(match args.shaping_interval_ms {
                Some(ms) => vec![
                    "--shaping".to_string(),
                    "true".to_string(),
                    "--shaping-interval-ms".to_string(),
                    ms.to_string(),
                ],
                None => vec![],
            })
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .context("starting the coordinator")?;
        let stdout = read_ready_line(child.stdout.take().expect("stdout is piped"));
        self.children.retain(|(n, _, _)| n != "coordinator");
        self.children.push(("coordinator".into(), child, log));
        let ready = self.ready_or_report(&stdout, "coordinator", deadline)?;
        // A restart picks a new metrics port.
        self.coordinator_http = ready["metrics_addr"].as_str().map(str::to_string);
        Ok(ready["quic_addr"]
            .as_str()
            .context("coordinator ready line has no quic_addr")?
            .to_string())
    }

    /// Kill the coordinator with SIGKILL and start it again on the same address and data dir
    /// (crash-recovery tests); the workers re-join it by themselves.
    pub fn restart_coordinator(&mut self, args: &LocalArgs) -> anyhow::Result<()> {
        self.kill("coordinator")?;
        let deadline = Instant::now() + Duration::from_secs(args.ready_timeout_s);
        let listen = self.coordinator.clone();
        let addr = self.spawn_coordinator(args, &listen, deadline)?;
        if addr != listen {
            bail!("the restarted coordinator listens on {addr}, not {listen}");
        }
        Ok(())
    }

    fn ready_or_report(
        &mut self,
        stdout: &ReadyLine,
        name: &str,
        deadline: Instant,
    ) -> anyhow::Result<serde_json::Value> {
        match ready_json(stdout, name, deadline) {
            Ok(v) => Ok(v),
            Err(e) => {
                let tail = self.log_tail(name);
                let log = self.log_path(name);
                Err(e.context(format!(
                    "{name} failed to start; the last lines of its stderr ({log}):\n{tail}"
                )))
            }
        }
    }

    /// The last lines of a child's log.
    pub fn log_tail(&self, name: &str) -> String {
        let Some((_, _, log)) = self.children.iter().find(|(n, _, _)| n == name) else {
            return String::new();
        };
        tail(log, 20)
    }

    /// Where a child's stderr goes.
    fn log_path(&self, name: &str) -> String {
        self.children
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, log)| log.display().to_string())
            .unwrap_or_default()
    }

    /// Client options that trust the cluster CA (for `tls://` workers).
    pub fn client_options(
        &self,
    ) -> Result<crate::client::ConnectOptions, crate::client::ClientError> {
        crate::client::ConnectOptions::with_ca_cert(&self.ca_cert)
    }

    /// The JSON line `testbed local` prints.
    pub fn summary_json(&self) -> serde_json::Value {
        serde_json::json!({
            "coordinator": self.coordinator,
            "coordinator_http": self.coordinator_http,
            "ca_cert": self.ca_cert,
            "workers": self.workers,
            "app_id": self.app_id,
            "app_secret": self.app_secret,
        })
    }

    /// Stop one child by name with SIGKILL (node-loss tests).
    pub fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let (_, child, _) = self
            .children
            .iter_mut()
            .find(|(n, _, _)| n == name)
            .context("no such process")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// The process id of one child by name (to read its `/proc/PID/status`).
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, child, _)| child.id())
    }

    /// Send a signal to one child by name (fault tests: SIGSTOP/SIGCONT pause and resume it).
    pub fn signal(&mut self, name: &str, signal: libc::c_int) -> anyhow::Result<()> {
        let (_, child, _) = self
            .children
            .iter_mut()
            .find(|(n, _, _)| n == name)
            .context("no such process")?;
        // SAFETY: sending a signal to our own child's pid has no memory-safety implications.
        let rc = unsafe { libc::kill(child.id() as i32, signal) };
        if rc != 0 {
            anyhow::bail!(
                "signal {signal} to {name}: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// The first child that exited on its own, with its log tail.
    pub fn exited_child(&mut self) -> Option<(String, String)> {
        let mut dead = None;
        for (name, child, _) in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                dead = Some((name.clone(), status.to_string()));
                break;
            }
        }
        dead.map(|(name, status)| {
            let t = self.log_tail(&name);
            let log = self.log_path(&name);
            (
                name,
                format!("{status}; the last lines of its stderr ({log}):\n{t}"),
            )
        })
    }

    /// Stop every process: SIGTERM (workers kill their containers), then SIGKILL stragglers.
    pub fn stop(&mut self) {
        for (_, child, _) in self.children.iter_mut().rev() {
            // SAFETY: sending a signal to our own child's pid has no memory-safety implications.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
        }
        for (_, child, _) in self.children.iter_mut().rev() {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The TLS certificate and key of worker `name`'s app endpoint (for 127.0.0.1 and localhost),
/// issued with `coordinator issue-app-cert` into `DATA_DIR/NAME-tls/` unless already there (a
/// reused data dir).
fn issue_app_cert(
    coordinator_bin: &Path,
    coord_dir: &Path,
    data_dir: &Path,
    name: &str,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let out_dir = data_dir.join(format!("{name}-tls"));
    let (cert, key) = (out_dir.join("app-cert.pem"), out_dir.join("app-key.pem"));
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let out = Command::new(coordinator_bin)
        .args(["issue-app-cert", "--data-dir"])
        .arg(coord_dir)
        .args(["--node-id", name, "--ip", "127.0.0.1", "--dns", "localhost"])
        .arg("--out-dir")
        .arg(&out_dir)
        .output()
        .context("running coordinator issue-app-cert")?;
    if !out.status.success() {
        bail!(
            "coordinator issue-app-cert for {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((cert, key))
}

fn tail(path: &Path, lines: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Route SIGINT and SIGTERM to a flag polled by [`stop_requested`].
pub fn install_stop_signals() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_stop_signal as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_stop_signal as *const () as libc::sighandler_t,
        );
    }
}

pub fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}

/// `testbed local`: start, print one JSON line, run until SIGINT/SIGTERM or a child dies.
pub fn run(args: &LocalArgs) -> anyhow::Result<()> {
    install_stop_signals();
    let mut cluster = LocalCluster::start(args)?;
    println!("{}", cluster.summary_json());
    loop {
        if stop_requested() {
            eprintln!("testbed local: stopping");
            cluster.stop();
            return Ok(());
        }
        if let Some((name, why)) = cluster.exited_child() {
            cluster.stop();
            // Keep the logs for the post-mortem.
            if let Some(t) = cluster.temp_dir.take() {
                eprintln!("testbed local: logs kept in {}", t.keep().display());
            }
            bail!("{name} exited unexpectedly: {why}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

//! The container executor: runs each container as a real process tree with its command,
//! environment and resource limits, samples its CPU and memory from the OS, and kills it as a
//! tree (DESIGN.md "Containers are real").
//!
//! - Every container is its own session and process group (`setsid` before exec), so
//!   [`ContainerProcess::kill_tree`] reaches children and grandchildren; with cgroups it also
//!   kills every pid in the container's cgroup, which catches processes that left the session.
//! - Limits: cgroup v2 `memory.max` + `cpu.max`, or cgroup v1 `memory.limit_in_bytes` +
//!   `cpu.cfs_quota_us`, in a cgroup created below the worker's own. Without usable cgroups
//!   ([`Enforcement::RlimitAndMonitor`]) a monitor task sums the RSS of the tree every
//!   [`ExecutorConfig::monitor_interval`] and kills the tree when it is over the limit; CPU is
//!   then sampled but not limited.
//! - In every mode, hitting the memory limit kills the whole container and
//!   [`ContainerProcess::wait`] reports [`ExitOutcome::KilledForMemory`]. When the leader exits,
//!   any processes it left behind are killed too: a container ends with its main process.
//! - The container's environment is only the spec's variables plus `PATH` (defaulted to
//!   [`DEFAULT_PATH`] when absent) and `CONTAINER_ID`; stdin is `/dev/null`, stdout and stderr
//!   go to `container-<id>.stdout/.stderr` in [`ExecutorConfig::log_dir`] (created 0700, files
//!   0600, opened by the worker so the container needs no access to them) or to `/dev/null`.
//!   With a log dir they are pipes the worker copies into the files up to
//!   [`ExecutorConfig::log_max_bytes`] each and drains past it: a container cannot fill the
//!   worker's disk, and a full pipe never blocks it.
//! - Identity: with [`ExecutorConfig::run_as`] the child drops to that uid/gid/groups before
//!   exec (after joining its cgroups and starting its session, which need the worker's
//!   privileges), then enters its working directory as that user ([`user`]).
//! - Starting: the leader is created with `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)` on the
//!   blocking pool (the child borrows the worker's memory until it execs, so a launch never
//!   copies the worker's page tables the way `fork` does), and its exit is watched through the
//!   pidfd and reaped with `waitpid` for that pid only. Container cgroups come from a pool of
//!   empty ones ([`cgroup::CgroupPool`]): created once, limits rewritten only when they change,
//!   given back when the container's last process is gone, removed with the executor.

pub mod adopt;
mod cgroup;
mod error;
mod procfs;
mod spawn;
pub mod state;
pub mod user;

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

pub use cgroup::Enforcement;
pub use error::ExecError;
pub use spawn::{CONTAINER_ID_VAR, DEFAULT_PATH, container_env};

use cgroup::ContainerCgroup;
use procfs::ProcStat;

const MIB: u64 = 1 << 20;
/// Passes of "list members, signal the new ones" in a kill: a member forking during the kill
/// adds a process that the next pass finds.
const KILL_PASSES: usize = 10;
/// Attempts (10 ms apart) to remove a container cgroup while its killed processes finish exiting.
const CGROUP_REMOVE_ATTEMPTS: usize = 200;

/// What to run in a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// Program name (looked up in the container's PATH) or path (relative to `working_dir`).
    pub command: String,
    pub args: Vec<String>,
    /// The container's whole environment besides the defaults described in the module docs.
    pub env: BTreeMap<String, String>,
    /// Must exist; `None` runs in the worker's current directory.
    pub working_dir: Option<PathBuf>,
}

/// Resources a container may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerLimits {
    /// CPU in millicores (1000 = one core).
    pub cpu_millis: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
}

/// How a container ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitOutcome {
    /// The main process exited with this code.
    Exited { code: i32 },
    /// The main process was killed by this signal (including by [`ContainerProcess::kill_tree`]).
    Signaled { signal: i32 },
    /// The container went over its memory limit and was killed. `used_mib` is the usage that
    /// triggered the kill (the cgroup's peak in cgroup modes), rounded up.
    KilledForMemory { used_mib: u64, limit_mib: u64 },
    /// Waiting for the main process failed with this errno (it was reaped by someone else).
    WaitFailed { errno: i32 },
}

/// Resource use of a container at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSample {
    /// Average CPU over the interval since the previous sample (or since launch), in millicores.
    pub cpu_millis: u64,
    /// Memory of the whole tree in MiB, rounded up: the cgroup's charge in cgroup modes (what
    /// the limit applies to), else the sum of the members' resident set sizes.
    pub memory_mib: u64,
    /// Live processes in the container.
    pub processes: u32,
}

/// Settings of an [`Executor`].
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Name of the directory created below the worker's own cgroup to hold container cgroups.
    pub cgroup_name: String,
    /// How often the memory monitor checks each container.
    pub monitor_interval: Duration,
    /// Where container stdout/stderr files go; `None` discards them.
    pub log_dir: Option<PathBuf>,
    /// Most bytes kept of each of a container's stdout and stderr (the rest is discarded).
    pub log_max_bytes: u64,
    /// The identity containers switch to before exec; `None` keeps the worker's own.
    pub run_as: Option<user::RunAs>,
    /// Where running containers are recorded (so a restarted worker can kill what a crashed
    /// one left running, [`state`]); `None` records nothing.
    pub state: Option<Arc<state::StateDir>>,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        // Unique per executor so several workers (or test executors) on one machine never share
        // or remove each other's cgroup roots.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let serial = NEXT.fetch_add(1, Ordering::Relaxed);
        ExecutorConfig {
            cgroup_name: format!("hybrid-worker-{}-{serial}", std::process::id()),
            monitor_interval: Duration::from_millis(100),
            log_dir: None,
            log_max_bytes: DEFAULT_LOG_MAX_BYTES,
            run_as: None,
            state: None,
        }
    }
}

/// Launches containers with one [`Enforcement`].
#[derive(Debug)]
pub struct Executor {
    roots: Arc<CgroupRoots>,
    config: ExecutorConfig,
}

/// The cgroup roots of an executor, shared with its containers so the roots are removed only
/// after the executor and the last container cgroup below them are gone.
#[derive(Debug)]
struct CgroupRoots {
    enforcement: Enforcement,
    /// Empty container cgroups kept for reuse.
    pool: cgroup::CgroupPool,
}

impl CgroupRoots {
    fn new(enforcement: Enforcement) -> Arc<CgroupRoots> {
        Arc::new(CgroupRoots {
            enforcement,
            pool: cgroup::CgroupPool::default(),
        })
    }
}

impl Drop for CgroupRoots {
    fn drop(&mut self) {
        self.pool.drain();
        // Fails harmlessly (EBUSY) if a container cgroup could not be removed.
        cgroup::remove_root(&self.enforcement);
    }
}

impl Executor {
    /// Uses cgroups (v2, else v1) when a writable hierarchy with memory and cpu controllers can
    /// be delegated below the worker's own cgroup, else rlimits + monitoring; the reasons for
    /// falling back are logged. Never fails. Does a few quick sysfs reads and writes, so call it
    /// at start-up rather than on a latency-sensitive path.
    pub fn detect(config: ExecutorConfig) -> Executor {
        let enforcement = match cgroup::detect(&config.cgroup_name) {
            Ok(enforcement) => {
                tracing::info!(
                    mode = enforcement.name(),
                    ?enforcement,
                    "container limits enforced with cgroups"
                );
                enforcement
            }
            Err(reasons) => {
                tracing::warn!(
                    reasons = %reasons.join("; "),
                    "no usable cgroups: container memory is enforced by RSS monitoring and CPU is not limited"
                );
                Enforcement::RlimitAndMonitor
            }
        };
        record_roots(&config, &enforcement);
        Executor {
            roots: CgroupRoots::new(enforcement),
            config,
        }
    }

    /// Uses the given enforcement, failing if it cannot work here (cgroup roots are created and
    /// probed with a real limit write).
    pub fn with_enforcement(
        enforcement: Enforcement,
        config: ExecutorConfig,
    ) -> Result<Executor, ExecError> {
        cgroup::prepare_root(&enforcement)?;
        record_roots(&config, &enforcement);
        Ok(Executor {
            roots: CgroupRoots::new(enforcement),
            config,
        })
    }

    pub fn enforcement(&self) -> &Enforcement {
        &self.roots.enforcement
    }

    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// Before an in-place upgrade: removes the idle cgroups and keeps no more (the next image
    /// starts its own pool; the cgroups of handed-over containers are theirs).
    pub fn close_cgroup_pool(&self) {
        self.roots.pool.close();
    }

    /// When the worker stops, after every container has ended: removes the idle cgroups and
    /// the roots (the process exits before this executor would be dropped, so its `Drop`
    /// cannot be relied on for it). Keeps no more cgroups afterwards. Returns the roots that
    /// could not be removed (a container cgroup below them is still populated).
    pub fn remove_cgroups(&self) -> Vec<PathBuf> {
        self.roots.pool.close();
        cgroup::remove_root(&self.roots.enforcement);
        self.cgroup_roots()
            .into_iter()
            .filter(|root| root.exists())
            .collect()
    }

    /// Empty container cgroups kept for reuse.
    pub fn idle_cgroups(&self) -> usize {
        self.roots.pool.idle_count()
    }

    /// The directories container cgroups are created below (none without cgroups); removed
    /// when the executor and its last container are gone.
    pub fn cgroup_roots(&self) -> Vec<PathBuf> {
        cgroup::roots(&self.roots.enforcement)
    }

    /// Starts `spec` as container `container_id` under `limits`. The returned process has
    /// already exec'd (a failed exec is an error here, not an exit code).
    pub async fn launch(
        &self,
        container_id: u64,
        spec: &LaunchSpec,
        limits: ContainerLimits,
    ) -> Result<ContainerProcess, ExecError> {
        for (value, name) in [
            (limits.cpu_millis, "cpu_millis"),
            (limits.memory_mib, "memory_mib"),
        ] {
            if value == 0 {
                return Err(ExecError::InvalidLimits {
                    container_id,
                    reason: format!("{name} must be positive"),
                });
            }
        }
        let env = container_env(container_id, &spec.env);
        let search_path = env.get("PATH").cloned().unwrap_or_default();
        // Bad strings are refused before anything is created.
        let image = |program: &Path| {
            spawn::ExecImage::new(program, &spec.command, &spec.args, &env).map_err(|source| {
                ExecError::Spawn {
                    command: spec.command.clone(),
                    source,
                }
            })
        };
        image(Path::new("/"))?;
        let job = StartJob {
            roots: Arc::clone(&self.roots),
            container_id,
            command: spec.command.clone(),
            args: spec.args.clone(),
            env,
            search_path,
            requested_dir: spec.working_dir.clone(),
            log_dir: self.config.log_dir.clone(),
            limits,
            identity: self.config.run_as.as_ref().map(user::ChildIdentity::from),
            state: self.config.state.clone(),
        };
        // Resolving, the cgroup, the spawn and the state record (a file write) are blocking
        // work: done on the blocking pool, never on the caller's (the node actor's) thread.
        let started = tokio::task::spawn_blocking(move || start_blocking(job))
            .await
            .map_err(|e| ExecError::Task(e.to_string()))??;
        let Started {
            child,
            cgroup,
            logs,
            record_error,
        } = started;
        let pid = child.pid;
        let leader = match adopt::AdoptedLeader::watch(pid, child.pidfd) {
            Ok(leader) => leader,
            Err(e) => {
                // Cannot watch it: kill and reap it rather than leak it.
                let _ = signal(-i32::try_from(pid).unwrap_or(i32::MAX), pid);
                let mut raw = 0;
                // SAFETY: waitpid on our own child (killed above), writing into a live local.
                unsafe { libc::waitpid(pid as libc::pid_t, &mut raw, 0) };
                if let Some(cgroup) = &cgroup {
                    let _ = cgroup.remove();
                }
                return Err(ExecError::Task(format!("container {container_id}: {e}")));
            }
        };
        let mut log_copiers = Vec::new();
        if let Some(logs) = logs {
            let max = self.config.log_max_bytes;
            for (stream, read_end, file) in [
                (adopt::LogStream::Stdout, logs.stdout_read, logs.stdout_file),
                (adopt::LogStream::Stderr, logs.stderr_read, logs.stderr_file),
            ] {
                match tokio::net::unix::pipe::Receiver::from_owned_fd(read_end) {
                    Ok(pipe) => {
                        let fd = pipe.as_raw_fd();
                        log_copiers.push(LogCopier {
                            stream,
                            fd,
                            task: tokio::spawn(copy_capped_log(pipe, file, max, 0)),
                        });
                    }
                    Err(e) => tracing::warn!(
                        container_id,
                        error = %e,
                        "cannot read a container log pipe: that output is lost"
                    ),
                }
            }
        }
        let process = ContainerProcess::new(
            adopt::Leader::Adopted(leader),
            container_id,
            pid,
            cgroup,
            limits,
            self,
            // Unrecorded, the process has no record to forget.
            record_error
                .is_none()
                .then(|| self.config.state.clone())
                .flatten(),
            log_copiers,
        );
        if let Some(e) = record_error {
            // A container a crash could leak is not started: dropping its handle kills it now.
            drop(process);
            return Err(ExecError::State(e.to_string()));
        }
        Ok(process)
    }
}

/// What a launch hands to the blocking pool.
struct StartJob {
    roots: Arc<CgroupRoots>,
    container_id: u64,
    command: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    search_path: String,
    requested_dir: Option<PathBuf>,
    log_dir: Option<PathBuf>,
    limits: ContainerLimits,
    identity: Option<user::ChildIdentity>,
    state: Option<Arc<state::StateDir>>,
}

/// The read ends of a container's output pipes and the files they are copied into.
struct LogPipes {
    stdout_read: std::os::fd::OwnedFd,
    stdout_file: File,
    stderr_read: std::os::fd::OwnedFd,
    stderr_file: File,
}

/// A started leader, back from the blocking pool.
struct Started {
    child: spawn::SpawnedChild,
    cgroup: Option<ContainerCgroup>,
    logs: Option<LogPipes>,
    /// Why the container could not be recorded in the state dir (it is then killed).
    record_error: Option<state::StateError>,
}

/// `/dev/null`, opened once (close-on-exec) and shared by every container's stdin (and its
/// stdout/stderr when there is no log dir).
fn dev_null() -> io::Result<RawFd> {
    static DEV_NULL: std::sync::OnceLock<File> = std::sync::OnceLock::new();
    if let Some(file) = DEV_NULL.get() {
        return Ok(file.as_raw_fd());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    Ok(DEV_NULL.get_or_init(|| file).as_raw_fd())
}

/// A pipe (both ends close-on-exec): (read, write).
fn pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nothing else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Prepares and starts one container on the blocking pool: resolve, cgroup, pipes, spawn,
/// record. On a spawn failure the cgroup is given back.
fn start_blocking(job: StartJob) -> Result<Started, ExecError> {
    let Prepared {
        program,
        working_dir,
        cgroup,
        cgroup_procs,
        logs,
    } = prepare(
        &job.roots,
        job.container_id,
        &job.command,
        &job.search_path,
        job.requested_dir.as_deref(),
        job.log_dir.as_deref(),
        job.limits,
    )?;
    let give_back = |cgroup: &Option<ContainerCgroup>| {
        if let Some(cgroup) = cgroup
            && job.roots.pool.release(cgroup).is_err()
        {
            let _ = cgroup.remove();
        }
    };
    let spawn_err = |source: io::Error| ExecError::Spawn {
        command: job.command.clone(),
        source,
    };
    let result = (|| {
        let image = spawn::ExecImage::new(&program, &job.command, &job.args, &job.env)
            .map_err(spawn_err)?;
        let Some(working_dir_c) = user::c_path(&working_dir) else {
            return Err(ExecError::WorkingDirMissing { path: working_dir });
        };
        let mut cgroup_procs_fds = [-1; spawn::MAX_CGROUP_FDS];
        for (slot, file) in cgroup_procs_fds.iter_mut().zip(&cgroup_procs) {
            *slot = file.as_raw_fd();
        }
        let plan = spawn::ChildPlan {
            cgroup_procs_fds,
            identity: job.identity.clone(),
            working_dir: working_dir_c,
            working_dir_fallback: job.requested_dir.is_none() && job.identity.is_some(),
        };
        let null = dev_null().map_err(spawn_err)?;
        let child_and_pipes = match logs {
            Some((stdout_file, stderr_file)) => {
                let (stdout_read, stdout_write) = pipe().map_err(spawn_err)?;
                let (stderr_read, stderr_write) = pipe().map_err(spawn_err)?;
                let child = spawn::spawn_child(
                    &image,
                    [null, stdout_write.as_raw_fd(), stderr_write.as_raw_fd()],
                    &plan,
                )
                .map_err(spawn_err)?;
                // The write ends are closed here (dropped): only the container holds them now.
                (
                    child,
                    Some(LogPipes {
                        stdout_read,
                        stdout_file,
                        stderr_read,
                        stderr_file,
                    }),
                )
            }
            None => (
                spawn::spawn_child(&image, [null, null, null], &plan).map_err(spawn_err)?,
                None,
            ),
        };
        Ok((child_and_pipes.0, child_and_pipes.1))
    })();
    drop(cgroup_procs);
    let (child, logs) = match result {
        Ok(started) => started,
        Err(e) => {
            give_back(&cgroup);
            return Err(e);
        }
    };
    let record_error = job.state.as_ref().and_then(|state| {
        let record = state::ContainerRecord {
            container_id: job.container_id,
            pgid: child.pid,
            // The start time is set at fork and kept across exec; a leader that already died
            // leaves nothing to find by pid anyway.
            start_time: state::start_time(child.pid).unwrap_or(0),
            cgroups: cgroup
                .as_ref()
                .map(|c| c.dirs().into_iter().map(Path::to_path_buf).collect())
                .unwrap_or_default(),
        };
        state.record(&record).err()
    });
    Ok(Started {
        child,
        cgroup,
        logs,
        record_error,
    })
}

/// Writes the executor's cgroup roots into the state dir (if any).
fn record_roots(config: &ExecutorConfig, enforcement: &Enforcement) {
    if let Some(state) = &config.state
        && let Err(e) = state.set_cgroup_roots(&cgroup::roots(enforcement))
    {
        tracing::warn!(error = %e, "recording the cgroup roots in the state dir failed");
    }
}

impl ContainerProcess {
    #[allow(clippy::too_many_arguments)]
    fn new(
        leader: adopt::Leader,
        container_id: u64,
        pid: u32,
        cgroup: Option<ContainerCgroup>,
        limits: ContainerLimits,
        executor: &Executor,
        state: Option<Arc<state::StateDir>>,
        log_copiers: Vec<LogCopier>,
    ) -> ContainerProcess {
        ContainerProcess::with_tree(
            leader,
            ContainerTree {
                container_id,
                leader: pid,
                cgroup,
                limits,
                shaped: Mutex::new(None),
                state,
                memory_kill: Mutex::new(None),
                leader_reaped: AtomicBool::new(false),
                cgroup_removed: AtomicBool::new(false),
                _roots: Arc::clone(&executor.roots),
            },
            executor,
            log_copiers,
        )
    }

    fn with_tree(
        leader: adopt::Leader,
        tree: ContainerTree,
        executor: &Executor,
        log_copiers: Vec<LogCopier>,
    ) -> ContainerProcess {
        let container_id = tree.container_id;
        let pid = tree.leader;
        let tree = Arc::new(tree);
        let monitor = tokio::spawn(monitor_memory(
            Arc::clone(&tree),
            executor.config.monitor_interval,
        ));
        tracing::debug!(
            container_id,
            pid,
            mode = executor.roots.enforcement.name(),
            "container started"
        );
        ContainerProcess {
            child: Some(leader),
            tree,
            monitor: Some(monitor),
            log_copiers,
            last_sample_at: Instant::now(),
            last_cpu_us: 0,
            outcome: None,
            handed_over: false,
        }
    }
}

/// A task copying one of a container's output pipes into its log file.
#[derive(Debug)]
struct LogCopier {
    stream: adopt::LogStream,
    /// The pipe's read end (owned by the task), so an upgrade can hand it on.
    fd: std::os::unix::io::RawFd,
    task: JoinHandle<u64>,
}

/// How long [`ContainerProcess::wait`] waits for a container's log copies (both streams
/// together) after it ended.
const LOG_DRAIN_BOUND: Duration = Duration::from_secs(5);

/// Default of [`ExecutorConfig::log_max_bytes`]: 64 MiB per stream.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 64 << 20;

/// Everything a launch needs that involves blocking filesystem work.
struct Prepared {
    program: PathBuf,
    working_dir: PathBuf,
    cgroup: Option<ContainerCgroup>,
    /// Open cgroup membership files (close-on-exec) the child writes itself into
    /// ([`ContainerCgroup::join_files`]).
    cgroup_procs: Vec<File>,
    /// The stdout and stderr log files, if there is a log dir.
    logs: Option<(File, File)>,
}

/// Copy a container's output from its pipe into its log file, up to `max_bytes`; past it, note
/// the cut once and keep draining so the container never blocks on a full pipe. Ends when every
/// process of the container has closed the pipe. A write error (disk full) stops the copying,
/// not the draining.
async fn copy_capped_log(
    mut pipe: impl tokio::io::AsyncRead + Unpin,
    file: File,
    max_bytes: u64,
    already_kept: u64,
) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut file = tokio::fs::File::from_std(file);
    let mut buf = vec![0u8; 64 * 1024];
    let mut kept = already_kept;
    let mut discarded = 0u64;
    let mut writable = true;
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let room = max_bytes.saturating_sub(kept).min(n as u64) as usize;
        if writable && room > 0 {
            if file.write_all(&buf[..room]).await.is_err() {
                writable = false;
            } else {
                kept += room as u64;
            }
        }
        let beyond = (n - room) as u64;
        if beyond > 0 && discarded == 0 && writable {
            let note = format!("\n[worker: output beyond {max_bytes} bytes is discarded]\n");
            let _ = file.write_all(note.as_bytes()).await;
        }
        discarded += beyond;
    }
    let _ = file.flush().await;
    discarded
}

fn prepare(
    roots: &CgroupRoots,
    container_id: u64,
    command: &str,
    search_path: &str,
    working_dir: Option<&Path>,
    log_dir: Option<&Path>,
    limits: ContainerLimits,
) -> Result<Prepared, ExecError> {
    let working_dir = spawn::resolve_working_dir(working_dir)?;
    let program = spawn::resolve_command(command, search_path, &working_dir)?;
    let logs = match log_dir {
        Some(dir) => {
            // Logs may hold other containers' output: readable by the worker's user only.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| ExecError::Log {
                    path: dir.to_path_buf(),
                    source,
                })?;
            let open = |suffix: &str| -> Result<File, ExecError> {
                let path = dir.join(format!("container-{container_id}.{suffix}"));
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(|source| ExecError::Log { path, source })
            };
            Some((open("stdout")?, open("stderr")?))
        }
        None => None,
    };
    let cgroup = roots.pool.acquire(&roots.enforcement, limits)?;
    let mut cgroup_procs = Vec::new();
    if let Some(cgroup) = &cgroup {
        for path in cgroup.join_files() {
            match std::fs::OpenOptions::new().write(true).open(&path) {
                Ok(file) => cgroup_procs.push(file),
                Err(source) => {
                    let _ = cgroup.remove();
                    return Err(ExecError::Cgroup { path, source });
                }
            }
        }
    }
    Ok(Prepared {
        program,
        working_dir,
        cgroup,
        cgroup_procs,
        logs,
    })
}

/// State shared by a container's handle and its memory monitor.
#[derive(Debug)]
struct ContainerTree {
    container_id: u64,
    /// Pid of the main process, which is also the session and process-group id of the tree.
    leader: u32,
    cgroup: Option<ContainerCgroup>,
    /// The hard limits it was started with (memory: the kill limit).
    limits: ContainerLimits,
    /// The resource shaper's allocation, when it resized the container (soft limits).
    shaped: Mutex<Option<ContainerLimits>>,
    /// (used_mib, limit_mib) once the container has been killed for memory.
    memory_kill: Mutex<Option<(u64, u64)>>,
    /// Set once the leader has been reaped: its pid may then be reused, so it is no longer
    /// signalled as a process group.
    leader_reaped: AtomicBool,
    cgroup_removed: AtomicBool,
    /// Where the container is recorded; the record is removed once the container is reaped.
    state: Option<Arc<state::StateDir>>,
    /// Keeps the roots alive until this container's cgroup has been removed.
    _roots: Arc<CgroupRoots>,
}

enum MemoryCheck {
    Within,
    Exceeded,
    Gone,
}

impl ContainerTree {
    /// Live members: the session/process-group tree plus, with cgroups, the cgroup's pids.
    fn live_members(&self) -> Result<Vec<ProcStat>, ExecError> {
        let all = procfs::scan_all().map_err(|source| ExecError::Proc {
            path: PathBuf::from("/proc"),
            source,
        })?;
        let mut members = procfs::container_members(&all, self.leader);
        if let Some(cgroup) = &self.cgroup {
            let known: HashSet<u32> = members.iter().map(|m| m.pid).collect();
            for pid in cgroup.pids() {
                if !known.contains(&pid) {
                    members.extend(
                        all.iter()
                            .find(|s| s.pid == pid)
                            .copied()
                            .or_else(|| procfs::read_stat(pid)),
                    );
                }
            }
        }
        members.retain(ProcStat::is_live);
        Ok(members)
    }

    fn kill_tree(&self) -> Result<(), ExecError> {
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
        // Members are listed before anything is signalled: once a parent dies its children are
        // reparented, and a child that left the session could then no longer be found.
        let mut killed = HashSet::new();
        for pass in 0..KILL_PASSES {
            let fresh: Vec<u32> = self
                .live_members()?
                .iter()
                .map(|m| m.pid)
                .filter(|pid| !killed.contains(pid))
                .collect();
            for &pid in &fresh {
                signal(i32::try_from(pid).unwrap_or(i32::MAX), pid)?;
                killed.insert(pid);
            }
            if pass == 0 && !self.leader_reaped.load(Ordering::SeqCst) {
                // The negative pid addresses the whole process group, including members being
                // forked right now that the scan could not see yet.
                let group = -i32::try_from(self.leader).unwrap_or(i32::MAX);
                signal(group, self.leader)?;
            }
            if fresh.is_empty() {
                break;
            }
        }
        Ok(())
    }

    fn record_memory_kill(&self, used_bytes: u64) {
        let mut verdict = self
            .memory_kill
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        verdict.get_or_insert((used_bytes.div_ceil(MIB), self.limits.memory_mib));
    }

    fn memory_verdict(&self) -> Option<(u64, u64)> {
        *self
            .memory_kill
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One check of the memory monitor; kills the tree when it is over its limit.
    fn check_memory(&self) -> Result<MemoryCheck, ExecError> {
        match &self.cgroup {
            Some(cgroup) => {
                // The kernel enforces the limit; an OOM kill of any member ends the container.
                if cgroup.oom_kills() > 0 {
                    self.record_cgroup_oom(cgroup);
                    self.kill_tree()?;
                    return Ok(MemoryCheck::Exceeded);
                }
                Ok(if cgroup.pids().is_empty() {
                    MemoryCheck::Gone
                } else {
                    MemoryCheck::Within
                })
            }
            None => {
                let members = self.live_members()?;
                if members.is_empty() {
                    return Ok(MemoryCheck::Gone);
                }
                let rss_bytes =
                    members.iter().map(|m| m.rss_pages).sum::<u64>() * procfs::page_size();
                let limit_mib = self.limits.memory_mib;
                if rss_bytes > limit_mib.saturating_mul(MIB) {
                    tracing::info!(
                        container_id = self.container_id,
                        rss_mib = rss_bytes.div_ceil(MIB),
                        limit_mib,
                        "container over its memory limit: killing its process tree"
                    );
                    self.record_memory_kill(rss_bytes);
                    self.kill_tree()?;
                    return Ok(MemoryCheck::Exceeded);
                }
                Ok(MemoryCheck::Within)
            }
        }
    }

    fn record_cgroup_oom(&self, cgroup: &ContainerCgroup) {
        let limit_bytes = self.limits.memory_mib.saturating_mul(MIB);
        let used = cgroup
            .peak_memory_bytes()
            .or_else(|| cgroup.memory_bytes())
            .unwrap_or(limit_bytes);
        self.record_memory_kill(used);
    }

    /// After the leader has been reaped: notice a kernel OOM kill the monitor has not seen yet
    /// and kill whatever the leader left behind.
    fn settle_after_exit(&self) {
        if let Some(cgroup) = &self.cgroup {
            if cgroup.oom_kills() > 0 {
                self.record_cgroup_oom(cgroup);
            }
            // Nothing is left when the cgroup is empty and so is the process group: what the
            // scan below could still find would have had to leave both the cgroup and the
            // group, and a process that left the group after its leader died is found by
            // neither (it is no longer a descendant). Skipping the /proc scan saves a read of
            // every process's stat per container.
            // SAFETY: kill with signal 0 only checks for the group's existence.
            let group_gone = unsafe {
                libc::kill(-i32::try_from(self.leader).unwrap_or(i32::MAX), 0) == -1
                    && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            };
            if group_gone && cgroup.pids().is_empty() {
                return;
            }
        }
        if let Err(e) = self.kill_tree() {
            tracing::warn!(container_id = self.container_id, error = %e, "killing leftover container processes failed");
        }
    }

    /// Gives the container's cgroup back to the pool if it is empty now; true when it is gone
    /// from this container (or it has none).
    fn try_release_cgroup(&self) -> bool {
        let Some(cgroup) = &self.cgroup else {
            return true;
        };
        if self.cgroup_removed.load(Ordering::SeqCst) {
            return true;
        }
        if self._roots.pool.release(cgroup).is_ok() {
            self.cgroup_removed.store(true, Ordering::SeqCst);
            return true;
        }
        false
    }

    /// After the leader was reaped and leftovers killed: the container no longer needs to be
    /// found by a restarted worker.
    fn forget(&self) {
        if let Some(state) = &self.state {
            state.forget(self.container_id);
        }
    }

    /// Removes the container's cgroup once its processes have finished exiting.
    async fn remove_cgroup(&self) {
        let Some(cgroup) = &self.cgroup else { return };
        if self.cgroup_removed.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut last_error = None;
        for _ in 0..CGROUP_REMOVE_ATTEMPTS {
            // Back to the pool once empty (removed if the pool is full).
            match self._roots.pool.release(cgroup) {
                Ok(()) => return,
                Err(e) => last_error = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(e) = last_error {
            tracing::warn!(
                container_id = self.container_id,
                cgroup = %cgroup.primary_dir().display(),
                error = %e,
                "container cgroup could not be removed"
            );
        }
    }
}

/// Sends SIGKILL to `target` (a pid, or a negated process-group id); a target that is already
/// gone is not an error, which makes kills idempotent.
fn signal(target: i32, pid: u32) -> Result<(), ExecError> {
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(target, libc::SIGKILL) } == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(ExecError::Signal { pid, source: error })
}

async fn monitor_memory(tree: Arc<ContainerTree>, interval: Duration) {
    // The first check is one interval after the start, not at once: a container that ends
    // sooner (most short tasks) costs no check at all.
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let checked = Arc::clone(&tree);
        match tokio::task::spawn_blocking(move || checked.check_memory()).await {
            Ok(Ok(MemoryCheck::Within)) => {}
            Ok(Ok(MemoryCheck::Exceeded | MemoryCheck::Gone)) => return,
            Ok(Err(e)) => {
                tracing::warn!(container_id = tree.container_id, error = %e, "memory check failed");
            }
            Err(e) => {
                tracing::warn!(container_id = tree.container_id, error = %e, "memory monitor stopped");
                return;
            }
        }
    }
}

fn outcome_of(status: io::Result<ExitStatus>) -> ExitOutcome {
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => ExitOutcome::Exited { code },
            (None, Some(signal)) => ExitOutcome::Signaled { signal },
            (None, None) => ExitOutcome::WaitFailed { errno: 0 },
        },
        Err(e) => ExitOutcome::WaitFailed {
            errno: e.raw_os_error().unwrap_or(0),
        },
    }
}

/// A running (or finished) container. Dropping it before [`ContainerProcess::wait`] has
/// returned kills its tree, so a lost handle never leaks processes.
#[derive(Debug)]
pub struct ContainerProcess {
    /// `None` only while being dropped.
    child: Option<adopt::Leader>,
    tree: Arc<ContainerTree>,
    monitor: Option<JoinHandle<()>>,
    /// The tasks copying its stdout/stderr into the log files (none without a log dir).
    log_copiers: Vec<LogCopier>,
    last_sample_at: Instant,
    last_cpu_us: u64,
    outcome: Option<ExitOutcome>,
    /// Handed over to the next worker image ([`ContainerProcess::hand_over`]): never killed,
    /// reaped or waited for by this one.
    handed_over: bool,
}

impl ContainerProcess {
    /// Pid of the container's main process (also its session and process-group id).
    pub fn pid(&self) -> u32 {
        self.tree.leader
    }

    pub fn container_id(&self) -> u64 {
        self.tree.container_id
    }

    /// The directory of the container's (memory) cgroup, if it has one.
    pub fn cgroup_dir(&self) -> Option<PathBuf> {
        self.tree.cgroup.as_ref().map(ContainerCgroup::primary_dir)
    }

    /// The hard limits the container was started with.
    pub fn limits(&self) -> ContainerLimits {
        self.tree.limits
    }

    /// The resource shaper's allocation, if it resized the container.
    pub fn shaped_limits(&self) -> Option<ContainerLimits> {
        *self
            .tree
            .shaped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Apply the resource shaper's allocation to the running container without restarting it
    /// (Pace §3.2, resizing a component), as soft limits: with cgroups the CPU quota and the
    /// memory reclaim level (`memory.high`; see [`cgroup::ContainerCgroup`]); the hard memory
    /// limit (and the RSS monitor's kill limit without cgroups) stays at the request, so a burst
    /// above the forecast is left to the shaper's preemption policy instead of an OOM kill.
    /// Without cgroups nothing in the OS changes (no CPU cap exists there) and the node's
    /// accounting alone follows the shaped size. Says which: `cgroup` or `accounting`.
    pub fn resize(&self, shaped: ContainerLimits) -> Result<&'static str, ExecError> {
        if shaped.cpu_millis == 0 || shaped.memory_mib == 0 {
            return Err(ExecError::InvalidLimits {
                container_id: self.tree.container_id,
                reason: "cpu_millis and memory_mib must be positive".to_owned(),
            });
        }
        // Never above the hard limits it was started with.
        let shaped = ContainerLimits {
            cpu_millis: shaped.cpu_millis.min(self.tree.limits.cpu_millis),
            memory_mib: shaped.memory_mib.min(self.tree.limits.memory_mib),
        };
        let enforced_by = match &self.tree.cgroup {
            Some(cgroup) => {
                cgroup.write_shaped_limits(shaped)?;
                "cgroup"
            }
            None => "accounting",
        };
        *self
            .tree
            .shaped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(shaped);
        Ok(enforced_by)
    }

    /// Waits for the main process, kills anything it left behind, removes the cgroup, and says
    /// how the container ended. Cancel-safe; after it has returned once it returns the same
    /// outcome again immediately.
    pub async fn wait(&mut self) -> ExitOutcome {
        if let Some(outcome) = self.outcome {
            return outcome;
        }
        if self.handed_over {
            // The next worker image waits for it; this one parks (never reaps it).
            return std::future::pending().await;
        }
        let Some(child) = self.child.as_mut() else {
            return ExitOutcome::WaitFailed {
                errno: libc::ECHILD,
            };
        };
        let status = child.wait().await;
        self.tree.leader_reaped.store(true, Ordering::SeqCst);
        if let Some(monitor) = self.monitor.take() {
            monitor.abort();
        }
        let tree = Arc::clone(&self.tree);
        // One trip to the blocking pool: leftovers, the cgroup back to the pool, the record.
        let settled = tokio::task::spawn_blocking(move || {
            tree.settle_after_exit();
            let released = tree.try_release_cgroup();
            if released {
                tree.forget();
            }
            released
        })
        .await;
        let released = settled.unwrap_or_else(|e| {
            tracing::warn!(container_id = self.tree.container_id, error = %e, "post-exit clean-up failed");
            false
        });
        let outcome = match self.tree.memory_verdict() {
            Some((used_mib, limit_mib)) => ExitOutcome::KilledForMemory {
                used_mib,
                limit_mib,
            },
            None => outcome_of(status),
        };
        if !released {
            self.tree.remove_cgroup().await;
            self.tree.forget();
        }
        // One deadline for both streams (not one bound each), so a stopping worker's wait for
        // its containers stays within its grace.
        let logs_deadline = tokio::time::Instant::now() + LOG_DRAIN_BOUND;
        for copier in self.log_copiers.drain(..).map(|c| c.task) {
            // Every process of the container is gone, so its pipes are closed and the copy ends
            // with the last bytes written: the logs are whole when the end is reported. The bound
            // only guards against a pipe held open by a process that escaped the container.
            match tokio::time::timeout_at(logs_deadline, copier).await {
                Ok(Ok(discarded)) if discarded > 0 => tracing::info!(
                    container_id = self.tree.container_id,
                    discarded_bytes = discarded,
                    "container output beyond the log cap was discarded"
                ),
                Ok(_) => {}
                Err(_) => tracing::warn!(
                    container_id = self.tree.container_id,
                    "a log pipe is still open after the container ended (held by an escaped process?)"
                ),
            }
        }
        self.outcome = Some(outcome);
        tracing::debug!(
            container_id = self.tree.container_id,
            ?outcome,
            "container ended"
        );
        outcome
    }

    /// Kills the whole tree (process group, session members, descendants and, with cgroups,
    /// every pid in the cgroup) with SIGKILL. Idempotent; [`ContainerProcess::wait`] then
    /// reports how the main process ended.
    pub fn kill_tree(&self) -> Result<(), ExecError> {
        self.tree.kill_tree()
    }

    /// CPU (average since the previous sample, in millicores) and memory of the whole tree.
    /// CPU comes from the cgroup's counter on cgroup v2, otherwise from the members'
    /// `/proc/<pid>/stat` times (own plus reaped children), so time of processes reaped outside
    /// the tree between samples is not counted.
    pub fn sample_usage(&mut self) -> Result<UsageSample, ExecError> {
        let now = Instant::now();
        let members = self.tree.live_members()?;
        let cgroup = self.tree.cgroup.as_ref();
        let cpu_us = match cgroup.and_then(ContainerCgroup::cpu_usage_us) {
            Some(us) => us,
            None => {
                members.iter().map(|m| m.cpu_ticks).sum::<u64>() * 1_000_000
                    / procfs::clock_ticks_per_second()
            }
        };
        let memory_bytes = match cgroup.and_then(ContainerCgroup::memory_bytes) {
            Some(bytes) => bytes,
            None => members.iter().map(|m| m.rss_pages).sum::<u64>() * procfs::page_size(),
        };
        let elapsed_us =
            u64::try_from(now.duration_since(self.last_sample_at).as_micros()).unwrap_or(u64::MAX);
        let cpu_millis = match elapsed_us {
            0 => 0,
            elapsed => cpu_us.saturating_sub(self.last_cpu_us).saturating_mul(1000) / elapsed,
        };
        self.last_sample_at = now;
        self.last_cpu_us = cpu_us;
        Ok(UsageSample {
            cpu_millis,
            memory_mib: memory_bytes.div_ceil(MIB),
            processes: u32::try_from(members.len()).unwrap_or(u32::MAX),
        })
    }
}

impl Drop for ContainerProcess {
    fn drop(&mut self) {
        if let Some(monitor) = self.monitor.take() {
            monitor.abort();
        }
        if self.handed_over {
            // Neither killed nor reaped (tokio would reap a dropped child): the next image owns it.
            if let Some(child) = self.child.take() {
                std::mem::forget(child);
            }
            return;
        }
        if self.outcome.is_some() {
            return;
        }
        if let Err(e) = self.tree.kill_tree() {
            tracing::warn!(container_id = self.tree.container_id, error = %e, "killing a dropped container failed");
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Reap the leader and remove the cgroup in the background (a cgroup with an unreaped
        // member cannot be removed).
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let tree = Arc::clone(&self.tree);
                runtime.spawn(async move {
                    let _ = child.wait().await;
                    tree.leader_reaped.store(true, Ordering::SeqCst);
                    tree.remove_cgroup().await;
                    tree.forget();
                });
            }
            Err(_) => {
                if let Some(cgroup) = &self.tree.cgroup {
                    let _ = cgroup.remove();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_map_to_outcomes() {
        assert_eq!(
            outcome_of(Ok(ExitStatus::from_raw(3 << 8))),
            ExitOutcome::Exited { code: 3 }
        );
        assert_eq!(
            outcome_of(Ok(ExitStatus::from_raw(9))),
            ExitOutcome::Signaled { signal: 9 }
        );
        assert_eq!(
            outcome_of(Err(io::Error::from_raw_os_error(libc::ECHILD))),
            ExitOutcome::WaitFailed {
                errno: libc::ECHILD
            }
        );
    }

    #[test]
    fn default_configs_have_distinct_cgroup_names() {
        assert_ne!(
            ExecutorConfig::default().cgroup_name,
            ExecutorConfig::default().cgroup_name
        );
    }

    #[tokio::test]
    async fn zero_limits_are_rejected_by_name() {
        let executor =
            Executor::with_enforcement(Enforcement::RlimitAndMonitor, ExecutorConfig::default())
                .expect("fallback always works");
        let spec = LaunchSpec {
            command: "true".to_owned(),
            ..LaunchSpec::default()
        };
        let err = executor
            .launch(
                1,
                &spec,
                ContainerLimits {
                    cpu_millis: 0,
                    memory_mib: 10,
                },
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cpu_millis"), "{err}");
    }
}

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
use std::os::unix::io::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
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
}

impl Drop for CgroupRoots {
    fn drop(&mut self) {
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
            roots: Arc::new(CgroupRoots { enforcement }),
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
            roots: Arc::new(CgroupRoots { enforcement }),
            config,
        })
    }

    pub fn enforcement(&self) -> &Enforcement {
        &self.roots.enforcement
    }

    pub fn config(&self) -> &ExecutorConfig {
        &self.config
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
        let prepared = {
            let enforcement = self.roots.enforcement.clone();
            let log_dir = self.config.log_dir.clone();
            let command = spec.command.clone();
            let working_dir = spec.working_dir.clone();
            let search_path = env.get("PATH").cloned().unwrap_or_default();
            tokio::task::spawn_blocking(move || {
                prepare(
                    &enforcement,
                    container_id,
                    &command,
                    &search_path,
                    working_dir.as_deref(),
                    log_dir.as_deref(),
                    limits,
                )
            })
            .await
            .map_err(|e| ExecError::Task(e.to_string()))??
        };
        let Prepared {
            program,
            working_dir,
            cgroup,
            cgroup_procs,
            logs,
        } = prepared;
        let output = || {
            if logs.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            }
        };

        let mut cgroup_procs_fds = [-1; spawn::MAX_CGROUP_FDS];
        for (slot, file) in cgroup_procs_fds.iter_mut().zip(&cgroup_procs) {
            *slot = file.as_raw_fd();
        }
        let Some(working_dir_c) = user::c_path(&working_dir) else {
            if let Some(cgroup) = &cgroup {
                let _ = cgroup.remove();
            }
            return Err(ExecError::WorkingDirMissing { path: working_dir });
        };
        let plan = spawn::ChildPlan {
            cgroup_procs_fds,
            identity: self.config.run_as.as_ref().map(user::ChildIdentity::from),
            working_dir: working_dir_c,
            working_dir_fallback: spec.working_dir.is_none() && self.config.run_as.is_some(),
        };
        let mut command = tokio::process::Command::new(&program);
        command
            .arg0(&spec.command)
            .args(&spec.args)
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(output())
            .stderr(output())
            .kill_on_drop(false);
        // SAFETY: child_setup only makes async-signal-safe calls (write, setsid, setrlimit,
        // setgroups, setgid, setuid, chdir) on values prepared before the fork and moved into
        // the closure, and does not allocate.
        unsafe {
            command.pre_exec(move || spawn::child_setup(&plan));
        }
        let spawned = command.spawn();
        drop(cgroup_procs);
        let mut child = match spawned {
            Ok(child) => child,
            Err(source) => {
                if let Some(cgroup) = &cgroup {
                    let _ = cgroup.remove();
                }
                return Err(ExecError::Spawn {
                    command: spec.command.clone(),
                    source,
                });
            }
        };
        let Some(pid) = child.id() else {
            return Err(ExecError::Task(format!(
                "container {container_id}: spawned child has no pid"
            )));
        };
        let mut log_copiers = Vec::new();
        if let Some((stdout_file, stderr_file)) = logs {
            let max = self.config.log_max_bytes;
            if let Some(pipe) = child.stdout.take() {
                let fd = pipe.as_raw_fd();
                log_copiers.push(LogCopier {
                    stream: adopt::LogStream::Stdout,
                    fd,
                    task: tokio::spawn(copy_capped_log(pipe, stdout_file, max, 0)),
                });
            }
            if let Some(pipe) = child.stderr.take() {
                let fd = pipe.as_raw_fd();
                log_copiers.push(LogCopier {
                    stream: adopt::LogStream::Stderr,
                    fd,
                    task: tokio::spawn(copy_capped_log(pipe, stderr_file, max, 0)),
                });
            }
        }
        let record_error = self.config.state.as_ref().and_then(|state| {
            let record = state::ContainerRecord {
                container_id,
                pgid: pid,
                // The start time is set at fork and kept across exec; a leader that already
                // died leaves nothing to find by pid anyway.
                start_time: state::start_time(pid).unwrap_or(0),
                cgroups: cgroup
                    .as_ref()
                    .map(|c| c.dirs().into_iter().map(Path::to_path_buf).collect())
                    .unwrap_or_default(),
            };
            state.record(&record).err()
        });
        let process = ContainerProcess::new(
            adopt::Leader::Spawned(child),
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

/// How long [`ContainerProcess::wait`] waits for a container's log copies after it ended.
const LOG_DRAIN_BOUND: Duration = Duration::from_secs(5);

/// Default of [`ExecutorConfig::log_max_bytes`]: 64 MiB per stream.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 64 << 20;

/// Everything a launch needs that involves blocking filesystem work.
struct Prepared {
    program: PathBuf,
    working_dir: PathBuf,
    cgroup: Option<ContainerCgroup>,
    /// Open `cgroup.procs` files (close-on-exec) the child writes itself into.
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
    enforcement: &Enforcement,
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
    let cgroup = ContainerCgroup::create(enforcement, container_id, limits)?;
    let mut cgroup_procs = Vec::new();
    if let Some(cgroup) = &cgroup {
        for path in cgroup.procs_files() {
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
        if let Some(cgroup) = &self.cgroup
            && cgroup.oom_kills() > 0
        {
            self.record_cgroup_oom(cgroup);
        }
        if let Err(e) = self.kill_tree() {
            tracing::warn!(container_id = self.container_id, error = %e, "killing leftover container processes failed");
        }
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
            match cgroup.remove() {
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
    let mut ticker = tokio::time::interval(interval);
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
        if let Err(e) = tokio::task::spawn_blocking(move || tree.settle_after_exit()).await {
            tracing::warn!(container_id = self.tree.container_id, error = %e, "post-exit clean-up failed");
        }
        let outcome = match self.tree.memory_verdict() {
            Some((used_mib, limit_mib)) => ExitOutcome::KilledForMemory {
                used_mib,
                limit_mib,
            },
            None => outcome_of(status),
        };
        self.tree.remove_cgroup().await;
        self.tree.forget();
        for copier in self.log_copiers.drain(..).map(|c| c.task) {
            // Every process of the container is gone, so its pipes are closed and the copy ends
            // with the last bytes written: the logs are whole when the end is reported. The bound
            // only guards against a pipe held open by a process that escaped the container.
            match tokio::time::timeout(LOG_DRAIN_BOUND, copier).await {
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

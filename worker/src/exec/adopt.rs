//! Handing running containers over to the next worker image (in-place upgrade,
//! docs/bare-metal.md "Upgrading a worker").
//!
//! The worker upgrades with `execve`, which keeps its pid, so every container leader stays its
//! child: [`ContainerProcess::hand_over`] stops this image from waiting for, monitoring or
//! killing a container and describes it ([`ProcessHandover`]); the next image checks the
//! description against the OS and takes the container back with [`Executor::adopt`]. An adopted
//! leader is waited for through a pidfd (`pidfd_open`, readable once the process has exited)
//! and reaped with `waitpid`: a container that exited during the gap is a zombie whose exit
//! status is still there to collect. The log pipes' read ends cross the exec as inherited file
//! descriptors and their copying resumes, appending to the same files.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;

use super::cgroup::{ContainerCgroup, Enforcement};
use super::{
    ContainerLimits, ContainerProcess, ContainerTree, ExecError, Executor, LogCopier,
    copy_capped_log, procfs,
};

/// Which output stream a log pipe carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStream {
    Stdout,
    Stderr,
}

impl LogStream {
    fn suffix(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

/// A log pipe's read end handed across the exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedPipe {
    pub stream: LogStream,
    /// The descriptor number in the worker process (inherited across `execve`).
    pub fd: RawFd,
}

/// What the next worker image needs to take a running container back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessHandover {
    pub container_id: u64,
    /// The leader (= process group and session id).
    pub pid: u32,
    /// The leader's start time (`/proc/PID/stat` field 22): tells a reused pid apart.
    pub start_time: u64,
    /// The container's cgroup directories (empty without cgroups).
    pub cgroups: Vec<PathBuf>,
    pub limits: ContainerLimits,
    /// The resource shaper's soft limits, if it resized the container.
    pub shaped: Option<ContainerLimits>,
    /// (used_mib, limit_mib) if the memory monitor had already killed it.
    pub memory_kill: Option<(u64, u64)>,
    /// Log pipes still being copied.
    pub pipes: Vec<HandedPipe>,
}

/// Why a handed-over container cannot be taken back (it is then killed and reported).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdoptError {
    #[error("its leader pid {pid} no longer exists")]
    Gone { pid: u32 },
    #[error("pid {pid} is not a child of this worker (its parent is {parent})")]
    NotOurChild { pid: u32, parent: u32 },
    #[error("pid {pid} started at tick {actual}, not {recorded}: it is another process")]
    StartTimeDiffers {
        pid: u32,
        recorded: u64,
        actual: u64,
    },
    #[error("its cgroup {} {problem}", path.display())]
    Cgroup { path: PathBuf, problem: String },
    #[error("its limits are invalid: {0}")]
    Limits(String),
    #[error("its {stream:?} pipe (fd {fd}) is unusable: {problem}")]
    Pipe {
        stream: LogStream,
        fd: RawFd,
        problem: String,
    },
    #[error("cannot watch pid {pid} for its exit: {problem}")]
    Watch { pid: u32, problem: String },
}

/// How a container's leader is waited for.
#[derive(Debug)]
pub(crate) enum Leader {
    /// Spawned by this image or by an earlier image of this process and taken over after an
    /// `execve`; either way watched by a pidfd.
    Adopted(AdoptedLeader),
}

impl Leader {
    /// Waits for the leader's exit and reaps it. Cancel-safe (the status is kept once reaped).
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Leader::Adopted(adopted) => adopted.wait().await,
        }
    }
}

/// A child of this process not spawned through tokio: watched by a pidfd, reaped by `waitpid`.
#[derive(Debug)]
pub(crate) struct AdoptedLeader {
    pid: libc::pid_t,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

impl AdoptedLeader {
    fn new(pid: u32) -> Result<AdoptedLeader, AdoptError> {
        let watch_err = |problem: String| AdoptError::Watch { pid, problem };
        let pid_t = libc::pid_t::try_from(pid).map_err(|_| watch_err("pid out of range".into()))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid_t, 0) };
        if fd < 0 {
            return Err(watch_err(format!(
                "pidfd_open: {}",
                io::Error::last_os_error()
            )));
        }
        let fd = RawFd::try_from(fd).map_err(|_| watch_err("pidfd out of range".into()))?;
        // SAFETY: the syscall returned a fresh descriptor that nothing else owns (close-on-exec
        // is set by pidfd_open).
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the AsyncFd takes the OwnedFd, which stays open and returns the same
        // descriptor until the AsyncFd is dropped.
        let pidfd =
            unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) }
                .map_err(|e| watch_err(format!("registering the pidfd: {e}")))?;
        Ok(AdoptedLeader {
            pid: pid_t,
            pidfd,
            status: None,
        })
    }

    /// Watches a child this image just spawned, through the pidfd `clone` returned.
    pub(crate) fn watch(pid: u32, pidfd: OwnedFd) -> Result<AdoptedLeader, AdoptError> {
        let watch_err = |problem: String| AdoptError::Watch { pid, problem };
        let pid_t = libc::pid_t::try_from(pid).map_err(|_| watch_err("pid out of range".into()))?;
        // SAFETY: the AsyncFd takes the OwnedFd, which stays open and returns the same
        // descriptor until the AsyncFd is dropped.
        let pidfd =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
                .map_err(|e| watch_err(format!("registering the pidfd: {e}")))?;
        Ok(AdoptedLeader {
            pid: pid_t,
            pidfd,
            status: None,
        })
    }

    async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let mut raw = 0;
            // SAFETY: waitpid writes the status into a live local.
            let reaped = unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) };
            if reaped == self.pid {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                return Ok(status);
            }
            if reaped < 0 {
                return Err(io::Error::last_os_error());
            }
            // Still running: the pidfd becomes readable when it exits.
            let mut ready = self.pidfd.readable().await?;
            ready.clear_ready();
        }
    }
}

impl ContainerProcess {
    /// Stops this image from waiting for, monitoring or killing the container and describes it
    /// for the next image. The pipes' read ends are duplicated (close-on-exec still set: the
    /// upgrade clears it right before `execve`) and this image's copying stops. Afterwards
    /// [`ContainerProcess::wait`] never returns and dropping the handle leaves the container
    /// alone. Fails if the leader has been reaped already (finish [`ContainerProcess::wait`]
    /// then: the outcome is known here, not in the next image).
    pub fn hand_over(&mut self) -> Result<ProcessHandover, ExecError> {
        if self.outcome.is_some()
            || self.handed_over
            || self
                .tree
                .leader_reaped
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(ExecError::Task(format!(
                "container {} has ended or was handed over already",
                self.tree.container_id
            )));
        }
        if let Some(monitor) = self.monitor.take() {
            monitor.abort();
        }
        let mut pipes = Vec::new();
        for copier in self.log_copiers.drain(..) {
            // SAFETY: fcntl on a descriptor the copier owns (it is still running, so open).
            let dup = unsafe { libc::fcntl(copier.fd, libc::F_DUPFD_CLOEXEC, 3) };
            copier.task.abort();
            if dup < 0 {
                tracing::warn!(
                    container_id = self.tree.container_id,
                    error = %io::Error::last_os_error(),
                    "cannot keep a log pipe across the upgrade: its further output is lost"
                );
                continue;
            }
            pipes.push(HandedPipe {
                stream: copier.stream,
                fd: dup,
            });
        }
        self.handed_over = true;
        Ok(ProcessHandover {
            container_id: self.tree.container_id,
            pid: self.tree.leader,
            start_time: procfs::read_stat(self.tree.leader)
                .map(|s| s.start_time)
                .unwrap_or(0),
            cgroups: self
                .tree
                .cgroup
                .as_ref()
                .map(|c| c.dirs().into_iter().map(PathBuf::from).collect())
                .unwrap_or_default(),
            limits: self.tree.limits,
            shaped: self.shaped_limits(),
            memory_kill: self.tree.memory_verdict(),
            pipes,
        })
    }
}

impl Executor {
    /// Takes back a container an earlier image of this process handed over: checks that its
    /// leader is still this process's child with the recorded start time (a zombie is fine: its
    /// exit status is collected), that its cgroup is the one this executor would have made for
    /// it and exists, then watches it and resumes copying its logs. On error nothing was taken:
    /// the caller kills the container ([`kill_unadoptable`]) and reports it.
    pub fn adopt(&self, handover: &ProcessHandover) -> Result<ContainerProcess, AdoptError> {
        let pid = handover.pid;
        if handover.limits.cpu_millis == 0 || handover.limits.memory_mib == 0 {
            return Err(AdoptError::Limits(format!("{:?}", handover.limits)));
        }
        let stat = procfs::read_stat(pid).ok_or(AdoptError::Gone { pid })?;
        if stat.ppid != std::process::id() {
            return Err(AdoptError::NotOurChild {
                pid,
                parent: stat.ppid,
            });
        }
        if stat.start_time != handover.start_time {
            return Err(AdoptError::StartTimeDiffers {
                pid,
                recorded: handover.start_time,
                actual: stat.start_time,
            });
        }
        let cgroup = self.adopt_cgroup(handover)?;
        let mut pipes = Vec::new();
        for pipe in &handover.pipes {
            pipes.push((pipe.stream, pipe_receiver(pipe)?));
        }
        let leader = AdoptedLeader::new(pid)?;
        let mut log_copiers = Vec::new();
        if let Some(dir) = &self.config.log_dir {
            for (stream, receiver) in pipes {
                let path = dir.join(format!(
                    "container-{}.{}",
                    handover.container_id,
                    stream.suffix()
                ));
                let file = match std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .open(&path)
                {
                    Ok(file) => file,
                    Err(e) => {
                        // The pipe is still drained (to /dev/null in effect) so it never fills.
                        tracing::warn!(file = %path.display(), error = %e, "cannot reopen a container log after the upgrade");
                        match std::fs::OpenOptions::new().write(true).open("/dev/null") {
                            Ok(null) => null,
                            Err(_) => continue,
                        }
                    }
                };
                let kept = file.metadata().map(|m| m.len()).unwrap_or(0);
                let fd = receiver.as_raw_fd();
                log_copiers.push(LogCopier {
                    stream,
                    fd,
                    task: tokio::spawn(copy_capped_log(
                        receiver,
                        file,
                        self.config.log_max_bytes,
                        kept.min(self.config.log_max_bytes),
                    )),
                });
            }
        }
        let process = ContainerProcess::with_tree(
            Leader::Adopted(leader),
            ContainerTree {
                container_id: handover.container_id,
                leader: pid,
                cgroup,
                limits: handover.limits,
                shaped: Mutex::new(handover.shaped),
                memory_kill: Mutex::new(handover.memory_kill),
                leader_reaped: AtomicBool::new(false),
                cgroup_removed: AtomicBool::new(false),
                state: self.config.state.clone(),
                _roots: Arc::clone(&self.roots),
            },
            self,
            log_copiers,
        );
        tracing::info!(
            container_id = handover.container_id,
            pid,
            "container re-adopted after the upgrade"
        );
        Ok(process)
    }

    /// The container's cgroup, which must be one cgroup directly below this executor's roots
    /// (in every hierarchy it uses) and exist.
    fn adopt_cgroup(
        &self,
        handover: &ProcessHandover,
    ) -> Result<Option<ContainerCgroup>, AdoptError> {
        if *self.enforcement() == Enforcement::RlimitAndMonitor && handover.cgroups.is_empty() {
            return Ok(None);
        }
        let Some(cgroup) = ContainerCgroup::at_dirs(self.enforcement(), &handover.cgroups) else {
            let path = handover.cgroups.first().cloned().unwrap_or_default();
            return Err(AdoptError::Cgroup {
                path,
                problem: format!(
                    "is not where this worker keeps container cgroups ({})",
                    match self.enforcement() {
                        Enforcement::RlimitAndMonitor => "it uses none now".to_string(),
                        other => format!("{:?}", super::cgroup::roots(other)),
                    }
                ),
            });
        };
        for dir in cgroup.dirs() {
            if !dir.is_dir() {
                return Err(AdoptError::Cgroup {
                    path: dir.to_path_buf(),
                    problem: "does not exist".into(),
                });
            }
        }
        Ok(Some(cgroup))
    }
}

/// Wraps an inherited pipe read end, after checking it is one; close-on-exec is set again so
/// containers started later never inherit it.
fn pipe_receiver(pipe: &HandedPipe) -> Result<tokio::net::unix::pipe::Receiver, AdoptError> {
    let err = |problem: String| AdoptError::Pipe {
        stream: pipe.stream,
        fd: pipe.fd,
        problem,
    };
    if pipe.fd < 3 {
        return Err(err("a standard descriptor cannot be a log pipe".into()));
    }
    // SAFETY: fcntl on an integer descriptor; an invalid one fails with EBADF.
    if unsafe { libc::fcntl(pipe.fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(err(format!("{}", io::Error::last_os_error())));
    }
    // SAFETY: the descriptor was handed over by the previous image for this container only and
    // is validated (a FIFO open for reading) by from_owned_fd before use.
    let owned = unsafe { OwnedFd::from_raw_fd(pipe.fd) };
    tokio::net::unix::pipe::Receiver::from_owned_fd(owned).map_err(|e| err(e.to_string()))
}

/// Kills a handed-over container that could not be adopted, if its pid still names the
/// recorded process, and reaps its leader when it is this process's child. Blocking (bounded:
/// SIGKILL cannot be ignored).
pub fn kill_unadoptable(handover: &ProcessHandover) {
    let Some(stat) = procfs::read_stat(handover.pid) else {
        return;
    };
    if stat.start_time != handover.start_time {
        return; // another process has the pid now
    }
    let record = super::state::ContainerRecord {
        container_id: handover.container_id,
        pgid: handover.pid,
        start_time: handover.start_time,
        cgroups: handover.cgroups.clone(),
    };
    super::state::kill_container(&record);
    if stat.ppid == std::process::id()
        && let Ok(pid) = libc::pid_t::try_from(handover.pid)
    {
        let mut raw = 0;
        // SAFETY: waitpid on our own child; writes into a live local.
        unsafe { libc::waitpid(pid, &mut raw, 0) };
    }
    for pipe in &handover.pipes {
        if pipe.fd >= 3 {
            // SAFETY: closing a descriptor handed over for this container only.
            unsafe { libc::close(pipe.fd) };
        }
    }
}

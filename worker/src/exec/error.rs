//! Errors of the container executor. Each variant names the thing that was wrong (the command,
//! the path, the process) so an operator can act on the message alone.

use std::io;
use std::path::PathBuf;

/// Why a container could not be launched, signalled or inspected.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command is not an executable file in any directory of the container's PATH.
    #[error("command not found: {command} (searched PATH={search_path})")]
    CommandNotFound {
        command: String,
        search_path: String,
    },
    /// The command names a file that exists but cannot be executed.
    #[error("command is not an executable file: {}", path.display())]
    NotExecutable { path: PathBuf },
    /// The launch spec's working directory does not exist or is not a directory.
    #[error("working directory does not exist or is not a directory: {}", path.display())]
    WorkingDirMissing { path: PathBuf },
    /// The resource limits cannot be enforced as given.
    #[error("invalid limits for container {container_id}: {reason}")]
    InvalidLimits { container_id: u64, reason: String },
    /// fork/exec (or the in-child set-up before exec) failed.
    #[error("failed to start {command}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    /// A cgroup file or directory could not be created, written or removed.
    #[error("cgroup operation on {} failed: {source}", path.display())]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A forced cgroup enforcement mode cannot be used on this machine.
    #[error("cgroup enforcement unusable: {reason}")]
    CgroupUnavailable { reason: String },
    /// A container log file could not be created.
    #[error("container log file {}: {source}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Sending a signal to a container process failed for a reason other than it being gone.
    #[error("failed to signal process {pid}: {source}")]
    Signal {
        pid: u32,
        #[source]
        source: io::Error,
    },
    /// `/proc` could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Proc {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The container could not be recorded in the worker's state dir (it was killed: a crash
    /// would have leaked it).
    #[error("recording the container in the state dir failed: {0}")]
    State(String),
    /// A blocking helper task of the executor panicked or was cancelled.
    #[error("executor background task failed: {0}")]
    Task(String),
}

//! The worker's state dir: what a crashed worker left running, so its next incarnation can
//! kill it before handing out capacity again.
//!
//! Layout (dir 0700, files 0600, owned by the worker's user):
//! - `lock`: held (`flock`) for the worker's lifetime, so two workers never share a state dir
//!   (one would kill the other's containers).
//! - `containers/<id>.json`: one record per running container, written right after its spawn and
//!   removed once it has been reaped: the leader pid (= process group and session id, `setsid`),
//!   the leader's start time (field 22 of `/proc/PID/stat`, clock ticks since boot: it tells a
//!   reused pid apart), and its cgroup directories.
//! - `cgroup-roots`: the executor's cgroup roots (one path a line), so cgroups of containers
//!   whose record was never written (a crash between creating the cgroup and the record) are
//!   found too.
//!
//! [`StateDir::reap_leftovers`] runs at start, before the executor exists: for every record whose
//! leader is still the same process (pid and start time), the whole container (process group,
//! session, descendants) is killed; every recorded container cgroup and every cgroup below a
//! recorded root is emptied (`cgroup.kill`, else pid by pid) and removed. A record whose leader
//! is gone or is another process is dropped without killing by pid.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::procfs;

/// Passes of "list, kill" over a leftover container.
const KILL_PASSES: usize = 10;
/// Attempts (10 ms apart) to remove a leftover cgroup while its killed processes exit.
const CGROUP_REMOVE_ATTEMPTS: usize = 300;

/// State-dir failures.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("worker state dir {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "worker state dir {} is in use by another worker (its lock is held): give each worker its own --state-dir",
        path.display()
    )]
    Locked { path: PathBuf },
    #[error(
        "worker state dir {} belongs to uid {owner}, not to this worker's uid {uid}",
        path.display()
    )]
    NotOwned { path: PathBuf, owner: u32, uid: u32 },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What is recorded about one running container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub container_id: u64,
    /// Pid of the leader, which is also the container's process-group and session id.
    pub pgid: u32,
    /// The leader's start time (`/proc/PID/stat` field 22).
    pub start_time: u64,
    /// The container's cgroup directories (empty without cgroups).
    pub cgroups: Vec<PathBuf>,
}

/// What [`StateDir::reap_leftovers`] found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReapReport {
    /// Container records found.
    pub records: usize,
    /// Containers whose leader was still alive (same start time) and was killed with its tree.
    pub containers_killed: usize,
    /// Processes signalled (by group/session/descendant scan or from cgroups).
    pub processes_killed: usize,
    /// Leftover cgroup directories removed.
    pub cgroups_removed: usize,
    /// Leftover cgroup directories that could not be removed (named in the log).
    pub cgroups_left: usize,
}

/// An open, locked state dir.
#[derive(Debug)]
pub struct StateDir {
    root: PathBuf,
    /// Holds the `flock` for as long as the state dir is open.
    _lock: File,
}

impl StateDir {
    /// Creates (0700) or opens `root`, tightening a looser mode (logged), and takes its lock.
    pub fn open(root: &Path) -> Result<StateDir, StateError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(io_err(root))?;
        let meta = fs::metadata(root).map_err(io_err(root))?;
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if meta.uid() != uid {
            return Err(StateError::NotOwned {
                path: root.to_path_buf(),
                owner: meta.uid(),
                uid,
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            fs::set_permissions(root, fs::Permissions::from_mode(0o700)).map_err(io_err(root))?;
            tracing::warn!(
                dir = %root.display(),
                was = format!("{mode:o}"),
                "tightened the worker state dir to 0700"
            );
        }
        let lock_path = root.join("lock");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(StateError::Locked {
                    path: root.to_path_buf(),
                });
            }
            return Err(io_err(&lock_path)(error));
        }
        let containers = root.join("containers");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&containers)
            .map_err(io_err(&containers))?;
        Ok(StateDir {
            root: root.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn containers_dir(&self) -> PathBuf {
        self.root.join("containers")
    }

    fn record_path(&self, container_id: u64) -> PathBuf {
        self.containers_dir().join(format!("{container_id}.json"))
    }

    fn roots_path(&self) -> PathBuf {
        self.root.join("cgroup-roots")
    }

    /// Writes `contents` to `path` atomically (temporary file, fsync when `durable`, rename),
    /// 0600.
    fn write_atomically(path: &Path, contents: &[u8], durable: bool) -> Result<(), StateError> {
        let tmp = path.with_extension("tmp");
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        file.write_all(contents).map_err(io_err(&tmp))?;
        if durable {
            file.sync_data().map_err(io_err(&tmp))?;
        }
        fs::rename(&tmp, path).map_err(io_err(path))
    }

    /// Records a running container. Not fsynced: a record only matters to a worker restarted
    /// after its own process died (the page cache survives that, and the rename keeps the file
    /// whole); after a machine crash no container is left running to find. The fsync was a
    /// disk flush on every launch (0.6 ms median, 8 ms p90 on this VM's disk).
    pub fn record(&self, record: &ContainerRecord) -> Result<(), StateError> {
        let json = serde_json::to_vec(record).expect("JSON of integers and paths");
        Self::write_atomically(&self.record_path(record.container_id), &json, false)
    }

    /// Forgets a container that has been reaped.
    pub fn forget(&self, container_id: u64) {
        let path = self.record_path(container_id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "removing a container record failed")
            }
        }
    }

    /// The container records present (unreadable ones are logged and removed).
    pub fn records(&self) -> Result<Vec<ContainerRecord>, StateError> {
        let dir = self.containers_dir();
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let path = entry.map_err(io_err(&dir))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                let _ = fs::remove_file(&path); // an interrupted write
                continue;
            }
            match fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<ContainerRecord>(&b).ok())
            {
                Some(record) => out.push(record),
                None => {
                    tracing::warn!(file = %path.display(), "unreadable container record: removed");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        out.sort_by_key(|r| r.container_id);
        Ok(out)
    }

    /// Records the executor's cgroup roots (replacing the previous incarnation's).
    pub fn set_cgroup_roots(&self, roots: &[PathBuf]) -> Result<(), StateError> {
        let mut text = String::new();
        for root in roots {
            text.push_str(&root.display().to_string());
            text.push('\n');
        }
        Self::write_atomically(&self.roots_path(), text.as_bytes(), true)
    }

    fn cgroup_roots(&self) -> Vec<PathBuf> {
        fs::read_to_string(self.roots_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(PathBuf::from)
            .collect()
    }

    /// Kills what a previous incarnation left running and removes its cgroups (see the module
    /// docs). Blocking: it waits (bounded) for killed cgroup members to exit.
    pub fn reap_leftovers(&self) -> Result<ReapReport, StateError> {
        self.reap_leftovers_except(&HashSet::new())
    }

    /// [`StateDir::reap_leftovers`], sparing the containers in `keep` (adopted across an
    /// upgrade: their records and cgroups stay).
    pub fn reap_leftovers_except(&self, keep: &HashSet<u64>) -> Result<ReapReport, StateError> {
        let all = self.records()?;
        let kept_cgroups: HashSet<PathBuf> = all
            .iter()
            .filter(|r| keep.contains(&r.container_id))
            .flat_map(|r| r.cgroups.iter().cloned())
            .collect();
        let records: Vec<ContainerRecord> = all
            .into_iter()
            .filter(|r| !keep.contains(&r.container_id))
            .collect();
        let mut report = ReapReport {
            records: records.len(),
            ..ReapReport::default()
        };
        for record in &records {
            let killed = kill_recorded_container(record);
            if killed > 0 {
                report.containers_killed += 1;
                report.processes_killed += killed;
                tracing::warn!(
                    container_id = record.container_id,
                    pgid = record.pgid,
                    processes = killed,
                    "killed a container left running by a previous worker"
                );
            }
            for dir in &record.cgroups {
                reap_cgroup(dir, &mut report);
            }
        }
        for root in self.cgroup_roots() {
            if let Ok(entries) = fs::read_dir(&root) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir())
                        && !kept_cgroups.contains(&entry.path())
                    {
                        reap_cgroup(&entry.path(), &mut report);
                    }
                }
            }
            if kept_cgroups.iter().any(|c| c.starts_with(&root)) {
                continue; // still holds adopted containers; the executor reuses it
            }
            match fs::remove_dir(&root) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(cgroup = %root.display(), error = %e, "a previous worker's cgroup root could not be removed");
                }
            }
        }
        for record in &records {
            self.forget(record.container_id);
        }
        self.set_cgroup_roots(&[])?;
        Ok(report)
    }
}

/// Kills the container of `record` (process tree, and its cgroups emptied and removed) if its
/// leader is still the recorded process. Blocking (bounded).
pub(crate) fn kill_container(record: &ContainerRecord) {
    kill_recorded_container(record);
    let mut report = ReapReport::default();
    for dir in &record.cgroups {
        reap_cgroup(dir, &mut report);
    }
}

/// Kills the container of `record` if its leader is still the recorded process; returns how
/// many processes were signalled.
fn kill_recorded_container(record: &ContainerRecord) -> usize {
    let Some(leader) = procfs::read_stat(record.pgid) else {
        return 0;
    };
    if leader.start_time != record.start_time || !leader.is_live() {
        return 0; // the pid now belongs to another process (or is a zombie about to go)
    }
    let Ok(group) = i32::try_from(record.pgid) else {
        return 0;
    };
    // SAFETY: kill has no memory-safety preconditions. The negative pid is the process group.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let mut killed = HashSet::new();
    killed.insert(record.pgid);
    if leader.ppid == std::process::id() {
        // Our own child (handed over by an earlier image of this process across an upgrade):
        // reap it, or it stays a zombie of this worker.
        let mut status = 0;
        // SAFETY: waitpid on our child after SIGKILL (it exits promptly); writes a live local.
        unsafe { libc::waitpid(group, &mut status, 0) };
    }
    for _ in 0..KILL_PASSES {
        let Ok(all) = procfs::scan_all() else { break };
        let fresh: Vec<u32> = procfs::container_members(&all, record.pgid)
            .into_iter()
            .filter(|m| m.is_live() && !killed.contains(&m.pid))
            .map(|m| m.pid)
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            if let Ok(pid_i) = i32::try_from(pid) {
                // SAFETY: as above.
                unsafe { libc::kill(pid_i, libc::SIGKILL) };
            }
            killed.insert(pid);
        }
    }
    killed.len()
}

/// Kills every process in a leftover cgroup directory and removes it (bounded wait).
fn reap_cgroup(dir: &Path, report: &mut ReapReport) {
    if !dir.is_dir() {
        return;
    }
    let kill_file = dir.join("cgroup.kill");
    if kill_file.exists() {
        let _ = fs::write(&kill_file, "1");
    }
    let mut last_error = None;
    for _ in 0..CGROUP_REMOVE_ATTEMPTS {
        for pid in fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
        {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            report.processes_killed += 1;
        }
        match fs::remove_dir(dir) {
            Ok(()) => {
                report.cgroups_removed += 1;
                tracing::info!(cgroup = %dir.display(), "removed a previous worker's container cgroup");
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => last_error = Some(e),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    report.cgroups_left += 1;
    if let Some(e) = last_error {
        tracing::warn!(cgroup = %dir.display(), error = %e, "a previous worker's container cgroup could not be removed");
    }
}

/// The start time of a live process (`/proc/PID/stat` field 22), if it exists.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    procfs::read_stat(pid).map(|s| s.start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_the_dir_is_private_and_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        let state = StateDir::open(&root).unwrap();
        assert_eq!(
            fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let record = ContainerRecord {
            container_id: 42,
            pgid: 4242,
            start_time: 17,
            cgroups: vec![PathBuf::from("/sys/fs/cgroup/x/c42")],
        };
        state.record(&record).unwrap();
        let file = root.join("containers/42.json");
        assert_eq!(
            fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(state.records().unwrap(), vec![record]);
        // A second worker on the same dir is refused while the first holds it.
        let err = StateDir::open(&root).unwrap_err();
        assert!(matches!(err, StateError::Locked { .. }), "{err}");
        assert!(err.to_string().contains("--state-dir"), "{err}");
        state.forget(42);
        assert!(state.records().unwrap().is_empty());
        drop(state);
        // Released with the first; a looser mode is tightened.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        let _again = StateDir::open(&root).unwrap();
        assert_eq!(
            fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn a_record_whose_pid_now_belongs_to_another_process_kills_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::open(tmp.path()).unwrap();
        let me = std::process::id();
        let mine = start_time(me).expect("own start time");
        // Our own pid with another start time: a reused pid. (Were the guard missing, this
        // test process would be killed.)
        state
            .record(&ContainerRecord {
                container_id: 1,
                pgid: me,
                start_time: mine + 1,
                cgroups: vec![],
            })
            .unwrap();
        fs::write(tmp.path().join("containers/2.json"), b"{not json").unwrap();
        let report = state.reap_leftovers().unwrap();
        assert_eq!(report.records, 1);
        assert_eq!(report.containers_killed, 0);
        assert_eq!(report.processes_killed, 0);
        assert!(state.records().unwrap().is_empty(), "records are dropped");
        assert!(procfs::read_stat(me).is_some());
    }
}

//! In-place upgrade of a worker without losing its running containers (docs/bare-metal.md
//! "Upgrading a worker", docs/reliability.md).
//!
//! On SIGUSR2 (`systemctl reload`) the worker hands its containers over
//! ([`crate::node_actor::HandOverAll`]), writes an [`UpgradeState`] file (0600) into its state
//! dir and `execve`s the worker binary at its configured path with `--adopt-state FILE`. `execve`
//! keeps the pid, so the containers stay its children; the new image loads the file
//! ([`load`]), takes the containers back ([`crate::node_actor::Restore`]) and re-joins the
//! coordinator reporting them running. The app listeners cross the exec as inherited
//! descriptors, so the app endpoint keeps its address and connection attempts queue in the
//! backlog meanwhile; established app connections and the QUIC link drop.
//!
//! The file is checked before anything in it is trusted: a regular file owned by the worker's
//! uid, mode 0600, at most [`MAX_STATE_BYTES`], a SHA-256 of the body on its first line, the
//! format version, the node id, and the pid that wrote it (= this process: a file left from an
//! earlier upgrade is refused). A refused file is an error naming what was wrong; the worker
//! then adopts nothing and its start-up reaping kills every container its state dir records.

use std::ffi::{CString, OsString};
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::node_actor::NodeHandover;

/// Version of the upgrade state file this worker writes and reads.
pub const STATE_FORMAT: u32 = 1;
/// Largest upgrade state file read (a node holds at most tens of thousands of containers).
pub const MAX_STATE_BYTES: u64 = 64 << 20;
/// The file's name in the state dir.
pub const STATE_FILE: &str = "upgrade-state";
/// The flag that makes `worker run` adopt a handed-over state.
pub const ADOPT_FLAG: &str = "--adopt-state";

/// Listening sockets handed across the exec (descriptor numbers in this process).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedListeners {
    pub app_tcp: Option<RawFd>,
    pub app_unix: Option<RawFd>,
    pub metrics: Option<RawFd>,
}

/// What one worker image hands the next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpgradeState {
    pub format: u32,
    pub node_id: String,
    /// The worker's pid when it wrote the file; the next image must have the same one.
    pub pid: u32,
    /// When it was written (ms since the Unix epoch), for the log.
    pub written_at_ms: u64,
    /// The node's session at the hand-over (the re-join gets a new one).
    pub session: u32,
    /// The executor's cgroup directory name, reused so adopted cgroups stay below it.
    pub cgroup_name: String,
    pub listeners: HandedListeners,
    pub node: NodeHandover,
}

impl UpgradeState {
    /// Every descriptor the file names (they must survive the exec).
    pub fn descriptors(&self) -> Vec<RawFd> {
        let l = &self.listeners;
        [l.app_tcp, l.app_unix, l.metrics]
            .into_iter()
            .flatten()
            .chain(
                self.node
                    .processes()
                    .flat_map(|p| p.pipes.iter().map(|pipe| pipe.fd)),
            )
            .collect()
    }
}

/// Why an upgrade state file was refused.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("upgrade state {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("upgrade state {} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("upgrade state {} belongs to uid {owner}, not to this worker's uid {uid}", path.display())]
    NotOwned { path: PathBuf, owner: u32, uid: u32 },
    #[error("upgrade state {} has mode {mode:o}: it must be 0600", path.display())]
    Mode { path: PathBuf, mode: u32 },
    #[error("upgrade state {} is {size} bytes, more than the {max} allowed", path.display())]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("upgrade state {} is damaged: {what}", path.display())]
    Damaged { path: PathBuf, what: String },
    #[error("upgrade state {} has format {found}, this worker reads format {STATE_FORMAT}", path.display())]
    Format { path: PathBuf, found: u32 },
    #[error("upgrade state {} is for node {found:?}, this worker is {expected:?}", path.display())]
    OtherNode {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error(
        "upgrade state {} was written by pid {found}, this worker is pid {current}: it is not this process's hand-over (a stale file?)",
        path.display()
    )]
    OtherProcess {
        path: PathBuf,
        found: u32,
        current: u32,
    },
    #[error("upgrade state {} names descriptor {fd} twice or a standard one", path.display())]
    BadDescriptor { path: PathBuf, fd: RawFd },
}

/// The upgrade state file's text: the SHA-256 of the body (hex) on the first line, then the body
/// (JSON).
pub fn encode(state: &UpgradeState) -> Vec<u8> {
    let body = serde_json::to_vec(state).expect("JSON of plain data");
    let mut out = hex::encode(Sha256::digest(&body)).into_bytes();
    out.push(b'\n');
    out.extend_from_slice(&body);
    out
}

/// Parses and checks a file's text (everything [`load`] checks except the file's metadata).
pub fn decode(
    path: &Path,
    bytes: &[u8],
    node_id: &str,
    pid: u32,
) -> Result<UpgradeState, StateFileError> {
    let damaged = |what: String| StateFileError::Damaged {
        path: path.to_path_buf(),
        what,
    };
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| damaged("no checksum line".into()))?;
    let (sum, body) = (&bytes[..newline], &bytes[newline + 1..]);
    let expected = hex::encode(Sha256::digest(body));
    if sum != expected.as_bytes() {
        return Err(damaged(
            "its SHA-256 does not match its content (truncated or edited)".into(),
        ));
    }
    let state: UpgradeState =
        serde_json::from_slice(body).map_err(|e| damaged(format!("unreadable JSON: {e}")))?;
    if state.format != STATE_FORMAT {
        return Err(StateFileError::Format {
            path: path.to_path_buf(),
            found: state.format,
        });
    }
    if state.node_id != node_id {
        return Err(StateFileError::OtherNode {
            path: path.to_path_buf(),
            found: state.node_id,
            expected: node_id.to_string(),
        });
    }
    if state.pid != pid {
        return Err(StateFileError::OtherProcess {
            path: path.to_path_buf(),
            found: state.pid,
            current: pid,
        });
    }
    let mut seen = std::collections::HashSet::new();
    for fd in state.descriptors() {
        if fd < 3 || !seen.insert(fd) {
            return Err(StateFileError::BadDescriptor {
                path: path.to_path_buf(),
                fd,
            });
        }
    }
    let mut ids = std::collections::HashSet::new();
    let all_ids = state
        .node
        .running
        .iter()
        .map(|r| r.spec.id.0)
        .chain(state.node.pending.iter().map(|p| p.spec.id.0));
    for id in all_ids {
        if !ids.insert(id) {
            return Err(damaged(format!("container {id} is listed twice")));
        }
    }
    Ok(state)
}

/// Reads and checks the upgrade state at `path` for node `node_id` (see the module docs), then
/// removes the file: a hand-over is taken once.
pub fn load(path: &Path, node_id: &str) -> Result<UpgradeState, StateFileError> {
    let io_err = |source| StateFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::symlink_metadata(path).map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(StateFileError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if meta.uid() != uid {
        return Err(StateFileError::NotOwned {
            path: path.to_path_buf(),
            owner: meta.uid(),
            uid,
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode != 0o600 {
        return Err(StateFileError::Mode {
            path: path.to_path_buf(),
            mode,
        });
    }
    if meta.len() > MAX_STATE_BYTES {
        return Err(StateFileError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            max: MAX_STATE_BYTES,
        });
    }
    let bytes = std::fs::read(path).map_err(io_err)?;
    let _ = std::fs::remove_file(path);
    decode(path, &bytes, node_id, std::process::id())
}

/// Writes the state atomically (temporary file, fsync, rename), 0600.
pub fn write(path: &Path, state: &UpgradeState) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&encode(state))?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Clears close-on-exec on `fd` so it survives `execve`.
pub fn keep_across_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an integer descriptor; an invalid one fails with EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes every descriptor above the standard three that lacks close-on-exec and is not in
/// `keep`: everything this process opens itself is close-on-exec, so such a descriptor was
/// inherited (across a refused upgrade: its listeners and pipes, which would otherwise leak
/// into containers; or from the worker's own parent, which gives a worker nothing it needs
/// beyond the standard three). Returns how many were closed.
pub fn close_stray_inherited(keep: &[RawFd]) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let fds: Vec<RawFd> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut closed = 0;
    for fd in fds {
        if fd < 3 || keep.contains(&fd) {
            continue;
        }
        // SAFETY: fcntl on an integer descriptor (the read_dir's own one is gone or cloexec).
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
            // SAFETY: closing a descriptor nothing in this image owns (it was inherited).
            unsafe { libc::close(fd) };
            closed += 1;
        }
    }
    closed
}

/// The command line of the next image: this one's arguments with any earlier `--adopt-state`
/// replaced by `state`.
pub fn next_args(current: &[OsString], state: &Path) -> Vec<OsString> {
    let mut out = Vec::with_capacity(current.len() + 2);
    let mut skip_next = false;
    for arg in current {
        if skip_next {
            skip_next = false;
            continue;
        }
        if arg == ADOPT_FLAG {
            skip_next = true;
            continue;
        }
        if arg
            .as_bytes()
            .starts_with(format!("{ADOPT_FLAG}=").as_bytes())
        {
            continue;
        }
        out.push(arg.clone());
    }
    out.push(ADOPT_FLAG.into());
    out.push(state.as_os_str().to_owned());
    out
}

/// Replaces this process's image with `binary` run with `args` (argv[0] is `binary`) and the
/// current environment. Returns only on failure.
pub fn exec(binary: &Path, args: &[OsString]) -> io::Error {
    let to_c = |s: &[u8]| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let build = || -> io::Result<(CString, Vec<CString>)> {
        let path = to_c(binary.as_os_str().as_bytes())?;
        let mut argv = vec![path.clone()];
        for a in args {
            argv.push(to_c(a.as_bytes())?);
        }
        Ok((path, argv))
    };
    let (path, argv) = match build() {
        Ok(built) => built,
        Err(e) => return e,
    };
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let env: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    // SAFETY: every pointer refers to a NUL-terminated string kept alive by `argv`/`env` for
    // the call, and both arrays end with a null pointer.
    unsafe { libc::execve(path.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr()) };
    io::Error::last_os_error()
}

/// Whether `path` is a file this process may execute.
pub fn is_executable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access reads a NUL-terminated path.
    path.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::ContainerLimits;
    use crate::exec::adopt::{HandedPipe, LogStream, ProcessHandover};
    use crate::node_actor::{HandedProcess, PendingHandover, ProcessEnd, RunningHandover};
    use scheduler_core::node::ContainerSpec;
    use scheduler_core::{AppId, ContainerId, ContainerType, JobId, Resources, Time};

    fn spec(id: u64, container_type: ContainerType) -> ContainerSpec {
        ContainerSpec {
            id: ContainerId(id),
            app_id: AppId::from("app"),
            job_id: JobId::from("job"),
            job_submit_time: Time::from_millis(5),
            priority: 1,
            container_type,
            resources: Resources::new(500, 256),
            runtime_estimate_ms: Some(1000),
            version: 0,
            times_returned: 0,
        }
    }

    fn sample() -> UpgradeState {
        UpgradeState {
            format: STATE_FORMAT,
            node_id: "node-1".into(),
            pid: 4242,
            written_at_ms: 1_700_000_000_000,
            session: 7,
            cgroup_name: "hybrid-worker-4242-0".into(),
            listeners: HandedListeners {
                app_tcp: Some(10),
                app_unix: None,
                metrics: Some(11),
            },
            node: NodeHandover {
                running: vec![
                    RunningHandover {
                        spec: spec(1, ContainerType::Guaranteed),
                        started_at_ms: 1_699_999_999_000,
                        process: HandedProcess::Alive(ProcessHandover {
                            container_id: 1,
                            pid: 5000,
                            start_time: 123,
                            cgroups: vec![PathBuf::from("/sys/fs/cgroup/w/c1")],
                            limits: ContainerLimits {
                                cpu_millis: 500,
                                memory_mib: 256,
                            },
                            shaped: None,
                            memory_kill: None,
                            pipes: vec![HandedPipe {
                                stream: LogStream::Stdout,
                                fd: 12,
                            }],
                        }),
                    },
                    RunningHandover {
                        spec: spec(2, ContainerType::Queueable),
                        started_at_ms: 1_699_999_999_500,
                        process: HandedProcess::Ended(ProcessEnd::Exited(
                            crate::exec::ExitOutcome::Exited { code: 3 },
                        )),
                    },
                ],
                pending: vec![PendingHandover {
                    spec: spec(3, ContainerType::Queueable),
                    launch: crate::exec::LaunchSpec {
                        command: "sleep".into(),
                        args: vec!["5".into()],
                        ..Default::default()
                    },
                }],
                draining: vec![],
            },
        }
    }

    #[test]
    fn the_state_file_round_trips_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let mut state = sample();
        state.pid = std::process::id();
        write(&path, &state).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let loaded = load(&path, "node-1").unwrap();
        assert_eq!(loaded, state);
        assert_eq!(loaded.descriptors(), vec![10, 11, 12]);
        assert!(!path.exists(), "a hand-over is taken once");
    }

    #[test]
    fn damaged_or_foreign_state_is_refused_by_name() {
        let path = Path::new("/x/upgrade-state");
        let state = sample();
        let good = encode(&state);
        let check = |bytes: &[u8], node: &str, pid: u32, needle: &str| {
            let err = decode(path, bytes, node, pid).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
            assert!(err.contains("/x/upgrade-state"), "{err}");
        };
        // Truncated, flipped byte, no checksum line, garbage.
        check(&good[..good.len() - 3], "node-1", 4242, "SHA-256");
        let mut flipped = good.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 1;
        check(&flipped, "node-1", 4242, "SHA-256");
        check(b"no newline here", "node-1", 4242, "no checksum line");
        check(&[0xff; 100], "node-1", 4242, "no checksum line");
        // A consistent checksum over a hostile body is still parsed strictly.
        let hostile = b"{\"format\":1,\"node_id\":\"node-1\",\"pid\":-1}";
        let mut forged = hex::encode(Sha256::digest(hostile)).into_bytes();
        forged.push(b'\n');
        forged.extend_from_slice(hostile);
        check(&forged, "node-1", 4242, "unreadable JSON");
        // Another node, another process, another format.
        check(&good, "node-2", 4242, "is for node \"node-1\"");
        check(&good, "node-1", 1, "written by pid 4242");
        let mut other = sample();
        other.format = 99;
        check(&encode(&other), "node-1", 4242, "format 99");
        // Standard or repeated descriptors, repeated containers.
        let mut fds = sample();
        fds.listeners.app_unix = Some(1);
        check(&encode(&fds), "node-1", 4242, "descriptor 1");
        let mut twice = sample();
        twice.listeners.app_unix = Some(12);
        check(&encode(&twice), "node-1", 4242, "descriptor 12");
        let mut dup = sample();
        dup.node.pending[0].spec.id = ContainerId(1);
        check(&encode(&dup), "node-1", 4242, "container 1 is listed twice");
        assert_eq!(decode(path, &good, "node-1", 4242).unwrap(), state);
    }

    #[test]
    fn a_loose_foreign_or_odd_file_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        let mut state = sample();
        state.pid = std::process::id();
        write(&path, &state).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = load(&path, "node-1").unwrap_err().to_string();
        assert!(err.contains("mode 644"), "{err}");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let err = load(&path, "node-1").unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        let err = load(&dir.path().join("missing"), "node-1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing"), "{err}");
    }

    #[test]
    fn the_next_command_line_replaces_an_earlier_adopt_flag() {
        let args: Vec<OsString> = ["run", "--config", "w.toml", ADOPT_FLAG, "/old", "--x=1"]
            .iter()
            .map(OsString::from)
            .collect();
        let next = next_args(&args, Path::new("/state/upgrade-state"));
        let next: Vec<&str> = next.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            next,
            vec![
                "run",
                "--config",
                "w.toml",
                "--x=1",
                ADOPT_FLAG,
                "/state/upgrade-state"
            ]
        );
    }
}

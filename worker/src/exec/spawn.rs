//! Preparing a launch: the container's environment, resolving its command, checking its working
//! directory, and the set-up the child performs between fork and exec.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::RawFd;
use std::path::{Path, PathBuf};

use super::error::ExecError;
use super::user::{ChildIdentity, ROOT_DIR};
use std::ffi::CString;

/// PATH given to a container whose spec does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Variable carrying the container id; always set, overriding any value in the spec.
pub const CONTAINER_ID_VAR: &str = "CONTAINER_ID";

/// The complete environment of a container: the spec's variables, PATH defaulted to
/// [`DEFAULT_PATH`] when absent, and [`CONTAINER_ID_VAR`]. Nothing is inherited from the worker.
pub fn container_env(
    container_id: u64,
    spec_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = spec_env.clone();
    env.entry("PATH".to_owned())
        .or_insert_with(|| DEFAULT_PATH.to_owned());
    env.insert(CONTAINER_ID_VAR.to_owned(), container_id.to_string());
    env
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Resolves `command` the way exec would in the child (which has `working_dir` as its cwd and
/// `search_path` as its PATH), so a missing command is reported by name before forking.
pub(crate) fn resolve_command(
    command: &str,
    search_path: &str,
    working_dir: &Path,
) -> Result<PathBuf, ExecError> {
    if command.is_empty() {
        return Err(ExecError::CommandNotFound {
            command: String::new(),
            search_path: search_path.to_owned(),
        });
    }
    if command.contains('/') {
        let path = working_dir.join(command);
        if !path.exists() {
            return Err(ExecError::CommandNotFound {
                command: command.to_owned(),
                search_path: search_path.to_owned(),
            });
        }
        if !is_executable_file(&path) {
            return Err(ExecError::NotExecutable { path });
        }
        return Ok(path);
    }
    search_path
        .split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| working_dir.join(dir).join(command))
        .find(|candidate| is_executable_file(candidate))
        .ok_or_else(|| ExecError::CommandNotFound {
            command: command.to_owned(),
            search_path: search_path.to_owned(),
        })
}

/// The working directory the child will use, made absolute: the spec's (which must be an
/// existing directory) or the worker's own.
pub(crate) fn resolve_working_dir(requested: Option<&Path>) -> Result<PathBuf, ExecError> {
    match requested {
        Some(dir) if dir.is_dir() => {
            std::fs::canonicalize(dir).map_err(|_| ExecError::WorkingDirMissing {
                path: dir.to_path_buf(),
            })
        }
        Some(dir) => Err(ExecError::WorkingDirMissing {
            path: dir.to_path_buf(),
        }),
        None => std::env::current_dir().map_err(|_| ExecError::WorkingDirMissing {
            path: PathBuf::from("."),
        }),
    }
}

/// Most cgroup.procs files a child joins (v1 uses two hierarchies).
pub(crate) const MAX_CGROUP_FDS: usize = 2;

/// What the child does between fork and exec, prepared by the parent (the child only reads it).
#[derive(Debug)]
pub(crate) struct ChildPlan {
    /// Pre-opened `cgroup.procs` files to join (`-1` for unused slots).
    pub cgroup_procs_fds: [RawFd; MAX_CGROUP_FDS],
    /// The identity to switch to; `None` keeps the worker's.
    pub identity: Option<ChildIdentity>,
    /// The container's working directory (absolute).
    pub working_dir: CString,
    /// Whether `/` may be used when `working_dir` cannot be entered (it was not requested by
    /// the spec: it is the worker's own directory, which the container user may not reach).
    pub working_dir_fallback: bool,
}

/// Runs in the child between fork and exec: join the container's cgroups (by writing "0", the
/// calling process, into each pre-opened cgroup.procs), start a new session (so the container
/// is its own process group and session, which is how its tree is found and killed), disable
/// core dumps, drop to the container identity (supplementary groups, gid, then uid: the order
/// matters, each later call needs the privilege the earlier ones keep), and enter the working
/// directory as that identity. Only async-signal-safe calls; no allocation.
pub(crate) fn child_setup(plan: &ChildPlan) -> io::Result<()> {
    for &fd in plan.cgroup_procs_fds.iter().filter(|fd| **fd >= 0) {
        // SAFETY: fd is a file descriptor the parent opened and keeps open until spawn returns;
        // the buffer is a static byte string.
        let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if written != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: setsid has no memory-safety preconditions; it cannot fail in a fresh child that
    // is not a group leader, but its result is checked anyway.
    if unsafe { libc::setsid() } == -1 {
        return Err(io::Error::last_os_error());
    }
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: the pointer refers to a live, initialised rlimit; failure is harmless and ignored.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    if let Some(id) = &plan.identity {
        // SAFETY: the pointer and length describe the live `groups` vector, which the parent
        // built before forking; setgid/setuid take plain integers.
        unsafe {
            if libc::setgroups(id.groups.len(), id.groups.as_ptr()) == -1
                || libc::setgid(id.gid) == -1
                || libc::setuid(id.uid) == -1
            {
                return Err(io::Error::last_os_error());
            }
            // Never exec with a way back to root (setuid from root sets all three uids, so
            // this only fails as intended; checked anyway).
            if id.uid != 0 && (libc::setuid(0) != -1 || libc::geteuid() != id.uid) {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
        }
    }
    // SAFETY: both paths are NUL-terminated strings that outlive the calls.
    unsafe {
        if libc::chdir(plan.working_dir.as_ptr()) == -1 {
            let error = io::Error::last_os_error();
            if !plan.working_dir_fallback || libc::chdir(ROOT_DIR.as_ptr()) == -1 {
                return Err(error);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_has_defaults_and_container_id_only() {
        let mut spec = BTreeMap::new();
        spec.insert("A".to_owned(), "1".to_owned());
        spec.insert(CONTAINER_ID_VAR.to_owned(), "forged".to_owned());
        let env = container_env(7, &spec);
        assert_eq!(env.len(), 3);
        assert_eq!(env["A"], "1");
        assert_eq!(env["PATH"], DEFAULT_PATH);
        assert_eq!(env[CONTAINER_ID_VAR], "7");

        spec.insert("PATH".to_owned(), "/opt/bin".to_owned());
        assert_eq!(container_env(7, &spec)["PATH"], "/opt/bin");
    }

    #[test]
    fn resolves_commands_on_the_search_path() {
        let resolved = resolve_command("sh", DEFAULT_PATH, Path::new("/")).expect("sh exists");
        assert!(resolved.ends_with("sh"));
        assert!(resolved.is_absolute());
    }

    #[test]
    fn missing_command_is_named() {
        let err =
            resolve_command("no-such-command-xyz", "/bin:/usr/bin", Path::new("/")).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("no-such-command-xyz"), "{message}");
        assert!(message.contains("/bin:/usr/bin"), "{message}");
    }

    #[test]
    fn relative_command_is_resolved_against_the_working_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("run.sh");
        std::fs::write(&script, "#!/bin/sh\n").expect("write script");
        let err = resolve_command("./run.sh", "", dir.path()).unwrap_err();
        assert!(matches!(err, ExecError::NotExecutable { ref path } if path.ends_with("run.sh")));
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let resolved = resolve_command("./run.sh", "", dir.path()).expect("now executable");
        assert_eq!(resolved, dir.path().join("./run.sh"));
    }

    #[test]
    fn missing_working_dir_is_named() {
        let err = resolve_working_dir(Some(Path::new("/no/such/dir-xyz"))).unwrap_err();
        assert!(err.to_string().contains("/no/such/dir-xyz"));
    }
}

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

/// Most cgroup membership files a child writes itself into (v1 uses two hierarchies).
pub(crate) const MAX_CGROUP_FDS: usize = 2;

/// What the child does between fork and exec, prepared by the parent (the child only reads it).
#[derive(Debug)]
pub(crate) struct ChildPlan {
    /// Pre-opened cgroup membership files to join (`-1` for unused slots): see
    /// `ContainerCgroup::join_files`.
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
/// calling process, into each pre-opened membership file: v2 `cgroup.procs`, v1 `tasks`), start a new session (so the container
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
        // Raw system calls, not glibc's wrappers: in a multi-threaded process glibc's
        // setgroups/setgid/setuid broadcast the change to every thread (signals and shared
        // bookkeeping), and the child, which shares the worker's memory until exec, would
        // reach into the worker's threads. The raw calls change the calling process only.
        // SAFETY: the pointer and length describe the live `groups` vector, which the parent
        // built before the clone; setgid/setuid take plain integers.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, id.groups.len(), id.groups.as_ptr()) == -1
                || libc::syscall(libc::SYS_setgid, id.gid) == -1
                || libc::syscall(libc::SYS_setuid, id.uid) == -1
            {
                return Err(io::Error::last_os_error());
            }
            // Never exec with a way back to root (setuid from root sets all three uids, so
            // this only fails as intended; checked anyway).
            if id.uid != 0
                && (libc::syscall(libc::SYS_setuid, 0) != -1 || libc::geteuid() != id.uid)
            {
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

/// What `execve` gets: the resolved program, `argv` (with `argv[0]` as the spec wrote the
/// command) and the whole environment, as C strings built before the child exists.
#[derive(Debug)]
pub(crate) struct ExecImage {
    program: CString,
    /// Keeps the strings `argv_ptrs` points into.
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
}

// SAFETY: the raw pointers point into the CStrings owned by the same value (heap buffers that
// do not move when the value does); nothing else aliases them.
unsafe impl Send for ExecImage {}

impl ExecImage {
    /// Fails (naming the string) when the program, an argument or the environment holds a NUL
    /// byte, which no C string can carry.
    pub(crate) fn new(
        program: &Path,
        arg0: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<ExecImage, io::Error> {
        use std::os::unix::ffi::OsStrExt;
        let nul = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} contains a NUL byte"),
            )
        };
        let program = CString::new(program.as_os_str().as_bytes())
            .map_err(|_| nul(format!("program path {}", program.display())))?;
        let mut argv = Vec::with_capacity(args.len() + 1);
        for (i, arg) in std::iter::once(arg0)
            .chain(args.iter().map(String::as_str))
            .enumerate()
        {
            argv.push(CString::new(arg).map_err(|_| nul(format!("argument {i} {arg:?}")))?);
        }
        let mut envp = Vec::with_capacity(env.len());
        for (key, value) in env {
            if key.is_empty() || key.contains('=') {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("environment variable name {key:?} is empty or contains '='"),
                ));
            }
            envp.push(
                CString::new(format!("{key}={value}"))
                    .map_err(|_| nul(format!("environment variable {key}")))?,
            );
        }
        let terminated = |strings: &[CString]| {
            strings
                .iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        Ok(ExecImage {
            program,
            argv_ptrs: terminated(&argv),
            envp_ptrs: terminated(&envp),
            _argv: argv,
            _envp: envp,
        })
    }
}

/// A started container leader: its pid and a pidfd (close-on-exec) that becomes readable when
/// it exits.
#[derive(Debug)]
pub(crate) struct SpawnedChild {
    pub pid: u32,
    pub pidfd: std::os::fd::OwnedFd,
}

/// Stack of the child between clone and exec (it runs `child_main` only; the parent is
/// suspended meanwhile, so the buffer outlives every use).
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Everything the child reads, in memory it shares with the suspended parent.
struct ChildArgs<'a> {
    image: &'a ExecImage,
    /// Descriptors that become the child's 0, 1 and 2.
    stdio: [RawFd; 3],
    plan: &'a ChildPlan,
    /// errno of the step that failed before exec (0: exec succeeded). Written by the child,
    /// read by the parent once the child has exec'd or exited.
    error: std::sync::atomic::AtomicI32,
}

/// Starts the container leader without copying the worker's address space: `clone` with
/// `CLONE_VM | CLONE_VFORK` (what `posix_spawn` does inside glibc, which cannot do our set-up
/// itself: cgroup join and the user switch), so the child borrows the worker's memory and the
/// calling thread sleeps until the child has exec'd (or failed). `CLONE_PIDFD` hands back a
/// pidfd in the same call, so the exit is watched without a SIGCHLD race and without a later
/// `pidfd_open`. All signals are blocked in the calling thread across the clone, so no handler
/// of the worker ever runs on the shared memory; the child resets handled signals (and SIGPIPE,
/// which the Rust runtime ignores) to their defaults and unblocks everything before exec, as
/// `std::process::Command` would. A failed step before exec comes back as its errno.
pub(crate) fn spawn_child(
    image: &ExecImage,
    stdio: [RawFd; 3],
    plan: &ChildPlan,
) -> io::Result<SpawnedChild> {
    use std::os::fd::FromRawFd;
    use std::sync::atomic::Ordering;
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // The stack grows down from its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let args = ChildArgs {
        image,
        stdio,
        plan,
        error: std::sync::atomic::AtomicI32::new(0),
    };
    let mut pidfd: libc::c_int = -1;
    // SAFETY: sigfillset/pthread_sigmask write into live locals. clone gets a stack that stays
    // allocated until it returns (CLONE_VFORK: the child has exec'd or exited by then), an
    // entry point that only makes async-signal-safe calls on `args` (which lives in this frame
    // until clone returns), and a live int for the pidfd.
    let (pid, clone_error) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            std::ptr::from_ref(&args).cast_mut().cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        (pid, clone_error)
    };
    drop(stack);
    if pid < 0 {
        return Err(clone_error);
    }
    // SAFETY: CLONE_PIDFD stored a fresh descriptor that nothing else owns.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
    let child_errno = args.error.load(Ordering::SeqCst);
    if child_errno != 0 {
        let mut status = 0;
        // SAFETY: reaping our own child, which has exited (_exit after the failed step).
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(child_errno));
    }
    Ok(SpawnedChild {
        pid: u32::try_from(pid).unwrap_or(0),
        pidfd,
    })
}

/// The child's entry point: set-up, then exec; on failure report errno and exit 127.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the ChildArgs the parent passed; it stays alive while the parent is
    // suspended in clone.
    let args = unsafe { &*arg.cast::<ChildArgs<'_>>() };
    let errno = child_exec(args);
    args.error
        .store(errno.max(1), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: _exit ends only this child (its own thread group).
    unsafe { libc::_exit(127) }
}

/// Runs in the child: returns errno of the failed step (exec does not return on success).
fn child_exec(args: &ChildArgs<'_>) -> i32 {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    };
    // SAFETY: sigaction, dup2, fcntl, pthread_sigmask and execve are async-signal-safe and get
    // pointers to live locals or to the parent's prepared, unchanging buffers.
    unsafe {
        // The child has its own copy of the signal dispositions (no CLONE_SIGHAND): handlers of
        // the worker must not run here, so they go back to the default.
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if (old.sa_sigaction != libc::SIG_IGN && old.sa_sigaction != libc::SIG_DFL)
                || sig == libc::SIGPIPE
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &default, std::ptr::null_mut());
            }
        }
        for (target, &fd) in args.stdio.iter().enumerate() {
            let target = target as RawFd;
            let ok = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0) != -1
            } else {
                libc::dup2(fd, target) != -1
            };
            if !ok {
                return errno();
            }
        }
    }
    if let Err(e) = child_setup(args.plan) {
        return e.raw_os_error().unwrap_or(libc::EINVAL);
    }
    // SAFETY: as above; the argv/envp arrays are NUL-terminated arrays of C strings.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(
            args.image.program.as_ptr(),
            args.image.argv_ptrs.as_ptr(),
            args.image.envp_ptrs.as_ptr(),
        );
    }
    errno()
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

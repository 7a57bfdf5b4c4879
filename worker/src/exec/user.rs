//! Who containers run as (DESIGN.md "Security": a container is untrusted code, so it runs as an
//! unprivileged user and can read no cluster secret).
//!
//! The worker's `container_user` option names a user (`nobody`), a uid, or `uid:gid`; by default
//! the `nobody` user, or uid/gid 65534 when the system has no such user. A worker running as
//! root switches every container to that identity in the child, between clone and exec
//! (`setgroups`, `setgid`, `setuid`). A worker that is not root cannot switch users: its
//! containers then run as the worker's own uid, and the worker says so once at start.
//! Containers running as uid 0 are refused unless `allow_root_containers` is set.

use std::ffi::{CStr, CString};

/// The uid/gid used when the system has no `nobody` user.
pub const NOBODY_ID: u32 = 65534;

/// A resolved identity: uid, primary gid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (those of the named user in the group database; none for a
    /// numeric `uid[:gid]`).
    pub groups: Vec<u32>,
    /// What the operator wrote (or the default), for messages.
    pub name: String,
}

/// What the worker does about container identity, given who it runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The worker is root: containers switch to this identity before exec.
    Switch(RunAs),
    /// The worker is not root and cannot switch users: containers keep the worker's uid.
    SameAsWorker { uid: u32, wanted: RunAs },
}

impl Identity {
    /// The identity the executor switches to, if any.
    pub fn run_as(&self) -> Option<RunAs> {
        match self {
            Identity::Switch(r) => Some(r.clone()),
            Identity::SameAsWorker { .. } => None,
        }
    }

    /// The uid containers end up with.
    pub fn container_uid(&self) -> u32 {
        match self {
            Identity::Switch(r) => r.uid,
            Identity::SameAsWorker { uid, .. } => *uid,
        }
    }
}

/// `(uid, gid)` of a user in the password database.
fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid value for getpwnam_r to overwrite.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer refers to live memory of the stated size; the strings getpwnam_r
    // writes live in `buf`, which outlives the reads below.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    Some((pwd.pw_uid, pwd.pw_gid))
}

/// Supplementary groups of `name` (including `gid`), from the group database.
fn groups_of(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = CString::new(name) else {
        return vec![gid];
    };
    let mut count: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; usize::try_from(count).unwrap_or(64)];
        let mut n = count;
        // SAFETY: `groups` holds `n` entries; getgrouplist writes at most `n` and updates it.
        let rc = unsafe {
            libc::getgrouplist(
                cname.as_ptr(),
                gid as libc::gid_t,
                groups.as_mut_ptr(),
                &mut n,
            )
        };
        if rc >= 0 {
            groups.truncate(usize::try_from(n).unwrap_or(0));
            return groups;
        }
        if n <= count || count > 65536 {
            return vec![gid];
        }
        count = n;
    }
}

/// Parses `container_user`: a user name, `uid` or `uid:gid`. `None` is the default: the
/// `nobody` user, or uid/gid [`NOBODY_ID`] when there is no such user.
pub fn resolve_container_user(spec: Option<&str>) -> Result<RunAs, String> {
    let Some(spec) = spec.map(str::trim) else {
        return Ok(match lookup_user("nobody") {
            Some((uid, gid)) => RunAs {
                uid,
                gid,
                groups: groups_of("nobody", gid),
                name: "nobody".to_owned(),
            },
            None => RunAs {
                uid: NOBODY_ID,
                gid: NOBODY_ID,
                groups: Vec::new(),
                name: format!("{NOBODY_ID}:{NOBODY_ID}"),
            },
        });
    };
    if spec.is_empty() {
        return Err("container_user must not be empty".to_owned());
    }
    let numeric = |s: &str| -> Result<u32, String> {
        s.parse::<u32>()
            .ok()
            .filter(|id| *id != u32::MAX)
            .ok_or_else(|| format!("container_user {spec:?}: {s:?} is not a valid numeric id"))
    };
    if let Some((uid, gid)) = spec.split_once(':') {
        return Ok(RunAs {
            uid: numeric(uid)?,
            gid: numeric(gid)?,
            groups: Vec::new(),
            name: spec.to_owned(),
        });
    }
    if spec.bytes().all(|b| b.is_ascii_digit()) {
        let uid = numeric(spec)?;
        return Ok(RunAs {
            uid,
            gid: uid,
            groups: Vec::new(),
            name: spec.to_owned(),
        });
    }
    match lookup_user(spec) {
        Some((uid, gid)) => Ok(RunAs {
            uid,
            gid,
            groups: groups_of(spec, gid),
            name: spec.to_owned(),
        }),
        None => Err(format!(
            "container_user {spec:?}: no such user (give a user name, a uid or uid:gid)"
        )),
    }
}

/// Decides the containers' identity for a worker whose effective uid is `worker_uid`; refuses
/// (naming the option) when containers would run as uid 0 without `allow_root_containers`.
pub fn decide(wanted: RunAs, allow_root: bool, worker_uid: u32) -> Result<Identity, String> {
    let identity = if worker_uid == 0 {
        Identity::Switch(wanted)
    } else {
        Identity::SameAsWorker {
            uid: worker_uid,
            wanted,
        }
    };
    if identity.container_uid() == 0 && !allow_root {
        return Err(
            "containers would run as root (uid 0): set container_user (--container-user) to an \
             unprivileged user, or pass --allow-root-containers (allow_root_containers = true) \
             if containers are trusted"
                .to_owned(),
        );
    }
    Ok(identity)
}

/// The worker's effective uid.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The identity the child switches to, prepared in the parent so the child only copies
/// pointers into system calls (no allocation after fork).
#[derive(Debug, Clone)]
pub(crate) struct ChildIdentity {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
}

impl From<&RunAs> for ChildIdentity {
    fn from(r: &RunAs) -> Self {
        let mut groups: Vec<libc::gid_t> = r.groups.clone();
        if groups.is_empty() {
            groups.push(r.gid);
        }
        ChildIdentity {
            uid: r.uid,
            gid: r.gid,
            groups,
        }
    }
}

/// A path as a C string for the child's `chdir`.
pub(crate) fn c_path(path: &std::path::Path) -> Option<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).ok()
}

/// `/` as a C string.
pub(crate) const ROOT_DIR: &CStr = c"/";

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32) -> RunAs {
        RunAs {
            uid,
            gid: uid,
            groups: vec![],
            name: uid.to_string(),
        }
    }

    #[test]
    fn parses_numeric_ids_and_names() {
        assert_eq!(
            resolve_container_user(Some("1234:99")).unwrap(),
            RunAs {
                uid: 1234,
                gid: 99,
                groups: vec![],
                name: "1234:99".into()
            }
        );
        let r = resolve_container_user(Some("4321")).unwrap();
        assert_eq!((r.uid, r.gid), (4321, 4321));
        let root = resolve_container_user(Some("root")).unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        for bad in ["", "x:1", "1:", "-1", "no-such-user-4711"] {
            let err = resolve_container_user(Some(bad)).unwrap_err();
            assert!(err.contains("container_user"), "{bad}: {err}");
        }
    }

    #[test]
    fn default_is_nobody_or_65534() {
        let d = resolve_container_user(None).unwrap();
        assert_ne!(d.uid, 0);
        assert!(d.name == "nobody" || d.uid == NOBODY_ID, "{d:?}");
    }

    #[test]
    fn root_containers_need_the_flag() {
        let err = decide(user(0), false, 0).unwrap_err();
        assert!(err.contains("allow-root-containers"), "{err}");
        assert!(err.contains("container_user"), "{err}");
        assert_eq!(decide(user(0), true, 0).unwrap(), Identity::Switch(user(0)));
        assert_eq!(
            decide(user(65534), false, 0).unwrap(),
            Identity::Switch(user(65534))
        );
    }

    #[test]
    fn a_worker_that_is_not_root_keeps_its_own_uid() {
        let id = decide(user(65534), false, 1000).unwrap();
        assert_eq!(id.container_uid(), 1000);
        assert_eq!(id.run_as(), None);
        // Even "root" cannot be honoured by an unprivileged worker, so it is no root container.
        assert_eq!(decide(user(0), false, 1000).unwrap().container_uid(), 1000);
    }
}

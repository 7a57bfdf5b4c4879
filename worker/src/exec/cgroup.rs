//! cgroup discovery and per-container cgroups (v2 and v1).
//!
//! Container cgroups are created below the cgroup the worker itself runs in (the delegated
//! subtree), never at the hierarchy root, so whatever limits the worker's own supervisor set
//! still cover its containers. Detection creates a probe cgroup and writes real limits into it:
//! a hierarchy that is mounted but read-only, lacks a controller, or refuses delegation is
//! reported as unusable with the reason rather than failing a launch later.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::ContainerLimits;
use super::error::ExecError;

/// The CFS period used for CPU quotas: the kernel default, 100 ms.
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts (1 ms per period).
const MIN_CPU_QUOTA_US: u64 = 1_000;

/// How container limits are enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforcement {
    /// Unified hierarchy; `root` is the directory under which per-container cgroups are created
    /// (with the `memory` and `cpu` controllers enabled for its children).
    CgroupV2 { root: PathBuf },
    /// Legacy hierarchies; container cgroups are created under `memory_root` (memory.limit_in_bytes)
    /// and `cpu_root` (cpu.cfs_quota_us).
    CgroupV1 {
        memory_root: PathBuf,
        cpu_root: PathBuf,
    },
    /// No usable cgroups: memory is enforced by a monitor that samples the tree's RSS and kills
    /// the tree when it is over the limit; CPU is sampled but NOT limited (best effort: none).
    /// The only rlimit applied is RLIMIT_CORE = 0 (RLIMIT_AS would break runtimes that reserve
    /// large address ranges, so it is deliberately not used).
    RlimitAndMonitor,
}

impl Enforcement {
    /// Short name for logs and reports.
    pub fn name(&self) -> &'static str {
        match self {
            Enforcement::CgroupV2 { .. } => "cgroup-v2",
            Enforcement::CgroupV1 { .. } => "cgroup-v1",
            Enforcement::RlimitAndMonitor => "rlimit+monitor",
        }
    }
}

fn cgroup_err(path: &Path, source: io::Error) -> ExecError {
    ExecError::Cgroup {
        path: path.to_path_buf(),
        source,
    }
}

fn write_file(path: &Path, value: &str) -> Result<(), ExecError> {
    fs::write(path, value).map_err(|source| cgroup_err(path, source))
}

fn read_file(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// A `key value` line of a flat-keyed cgroup file (memory.events, cpu.stat, memory.oom_control).
fn keyed_value(content: &str, key: &str) -> Option<u64> {
    content.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next()? == key).then(|| parts.next()?.parse().ok())?
    })
}

/// One line of `/proc/self/mountinfo` that mounts a cgroup filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// Path inside the hierarchy that is mounted (usually `/`).
    pub root: String,
    pub mount_point: PathBuf,
    /// `cgroup2` or `cgroup`.
    pub fs_type: String,
    /// Super options (for v1 they list the controllers, e.g. `rw,cpu,cpuacct`).
    pub super_options: Vec<String>,
}

pub(crate) fn parse_mountinfo(content: &str) -> Vec<CgroupMount> {
    content
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split_whitespace().collect();
            let mut tail = after.split_whitespace();
            let fs_type = tail.next()?;
            if fs_type != "cgroup" && fs_type != "cgroup2" {
                return None;
            }
            let _source = tail.next()?;
            let super_options = tail
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::to_owned)
                .collect();
            Some(CgroupMount {
                root: unescape_mount_path(fields.get(3)?),
                mount_point: PathBuf::from(unescape_mount_path(fields.get(4)?)),
                fs_type: fs_type.to_owned(),
                super_options,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal `\NNN`.
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One line of `/proc/self/cgroup`: hierarchy id, controllers, path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMembership {
    pub hierarchy: u32,
    pub controllers: Vec<String>,
    pub path: String,
}

pub(crate) fn parse_proc_cgroup(content: &str) -> Vec<CgroupMembership> {
    content
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?.parse().ok()?;
            let controllers = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some(CgroupMembership {
                hierarchy,
                controllers,
                path: parts.next()?.to_owned(),
            })
        })
        .collect()
}

/// The directory of our own cgroup: mount point plus our path relative to the mounted root.
fn own_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let relative = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str())?
    };
    Some(mount.mount_point.join(relative.trim_start_matches('/')))
}

/// Finds a usable enforcement, trying v2 then v1; returns the reasons each one was rejected.
pub(crate) fn detect(cgroup_name: &str) -> Result<Enforcement, Vec<String>> {
    let mounts = parse_mountinfo(&read_file(Path::new("/proc/self/mountinfo")).unwrap_or_default());
    let memberships =
        parse_proc_cgroup(&read_file(Path::new("/proc/self/cgroup")).unwrap_or_default());
    let mut reasons = Vec::new();
    match detect_v2(&mounts, &memberships, cgroup_name) {
        Ok(enforcement) => return Ok(enforcement),
        Err(reason) => reasons.push(format!("cgroup v2: {reason}")),
    }
    match detect_v1(&mounts, &memberships, cgroup_name) {
        Ok(enforcement) => return Ok(enforcement),
        Err(reason) => reasons.push(format!("cgroup v1: {reason}")),
    }
    Err(reasons)
}

fn detect_v2(
    mounts: &[CgroupMount],
    memberships: &[CgroupMembership],
    cgroup_name: &str,
) -> Result<Enforcement, String> {
    let mount = mounts
        .iter()
        .find(|m| m.fs_type == "cgroup2")
        .ok_or("no cgroup2 mount")?;
    let membership = memberships
        .iter()
        .find(|m| m.hierarchy == 0)
        .ok_or("no `0::` line in /proc/self/cgroup")?;
    let own = own_dir(mount, &membership.path).ok_or("own cgroup is outside the mounted root")?;
    let available = read_file(&own.join("cgroup.controllers")).unwrap_or_default();
    for needed in ["memory", "cpu"] {
        if !available.split_whitespace().any(|c| c == needed) {
            return Err(format!(
                "controller `{needed}` not available in {} (have: `{}`)",
                own.display(),
                available.trim()
            ));
        }
    }
    let root = own.join(cgroup_name);
    let enforcement = Enforcement::CgroupV2 { root };
    prepare_root(&enforcement).map_err(|e| e.to_string())?;
    Ok(enforcement)
}

fn detect_v1(
    mounts: &[CgroupMount],
    memberships: &[CgroupMembership],
    cgroup_name: &str,
) -> Result<Enforcement, String> {
    let dir_for = |controller: &str| -> Result<PathBuf, String> {
        let mount = mounts
            .iter()
            .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == controller))
            .ok_or_else(|| format!("no v1 hierarchy with controller `{controller}`"))?;
        let membership = memberships
            .iter()
            .find(|m| m.controllers.iter().any(|c| c == controller))
            .ok_or_else(|| format!("not a member of a `{controller}` hierarchy"))?;
        let own = own_dir(mount, &membership.path)
            .ok_or_else(|| format!("own `{controller}` cgroup is outside the mounted root"))?;
        Ok(own.join(cgroup_name))
    };
    let enforcement = Enforcement::CgroupV1 {
        memory_root: dir_for("memory")?,
        cpu_root: dir_for("cpu")?,
    };
    prepare_root(&enforcement).map_err(|e| e.to_string())?;
    Ok(enforcement)
}

/// Creates the root(s) of an enforcement, enables controllers, and proves that a child cgroup
/// accepts limits by creating, configuring and removing a probe.
pub(crate) fn prepare_root(enforcement: &Enforcement) -> Result<(), ExecError> {
    const PROBE_ID: &str = "probe";
    match enforcement {
        Enforcement::RlimitAndMonitor => return Ok(()),
        Enforcement::CgroupV2 { root } => {
            let parent = root.parent().ok_or_else(|| ExecError::CgroupUnavailable {
                reason: format!("{} has no parent cgroup", root.display()),
            })?;
            ensure_dir(root)?;
            enable_v2_controllers(parent)?;
            enable_v2_controllers(root)?;
        }
        Enforcement::CgroupV1 {
            memory_root,
            cpu_root,
        } => {
            ensure_dir(memory_root)?;
            ensure_dir(cpu_root)?;
        }
    }
    let probe_limits = ContainerLimits {
        cpu_millis: 100,
        memory_mib: 64,
    };
    let probe = ContainerCgroup::create_named(enforcement, PROBE_ID, probe_limits, true)?;
    probe
        .remove()
        .map_err(|source| cgroup_err(&probe.primary_dir(), source))
}

fn ensure_dir(dir: &Path) -> Result<(), ExecError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(cgroup_err(dir, source)),
    }
}

fn enable_v2_controllers(dir: &Path) -> Result<(), ExecError> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = read_file(&control).unwrap_or_default();
    let missing: Vec<&str> = ["memory", "cpu"]
        .into_iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == *c))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let request: Vec<String> = missing.iter().map(|c| format!("+{c}")).collect();
    // EBUSY here means the cgroup holds processes (the "no internal processes" rule): the
    // worker would have to move itself into a leaf first, which we do not do behind its back.
    write_file(&control, &request.join(" "))
}

/// Where a container cgroup lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CgroupDirs {
    V2 {
        dir: PathBuf,
    },
    V1 {
        memory_dir: PathBuf,
        cpu_dir: PathBuf,
    },
}

/// The cgroup(s) of one container. It may be a reused one from the executor's
/// [`CgroupPool`]: the kernel's counters (OOM kills, CPU time) then start from the values it
/// had when it went idle, which are subtracted.
#[derive(Debug)]
pub(crate) struct ContainerCgroup {
    dirs: CgroupDirs,
    /// The hard limits last written (an unchanged reuse writes nothing).
    written: Option<ContainerLimits>,
    /// Soft limits were written by a resize: they are reset before the cgroup is reused.
    shaped: AtomicBool,
    /// Counters at the moment the container got the cgroup.
    oom_base: u64,
    cpu_base_us: u64,
    /// Held an earlier container (v2 cannot reset `memory.peak` for every reader).
    reused: bool,
}

impl ContainerCgroup {
    fn fresh(dirs: CgroupDirs, written: Option<ContainerLimits>) -> Self {
        ContainerCgroup {
            dirs,
            written,
            shaped: AtomicBool::new(false),
            oom_base: 0,
            cpu_base_us: 0,
            reused: false,
        }
    }

    /// The directories a cgroup called `name` has below the roots of `enforcement`.
    fn dirs_named(enforcement: &Enforcement, name: &str) -> Option<CgroupDirs> {
        match enforcement {
            Enforcement::RlimitAndMonitor => None,
            Enforcement::CgroupV2 { root } => Some(CgroupDirs::V2 {
                dir: root.join(name),
            }),
            Enforcement::CgroupV1 {
                memory_root,
                cpu_root,
            } => Some(CgroupDirs::V1 {
                memory_dir: memory_root.join(name),
                cpu_dir: cpu_root.join(name),
            }),
        }
    }

    /// The cgroup a container was handed over with, if `dirs` are exactly the directories of
    /// one cgroup name directly below this executor's roots (pooled cgroups are named `p<n>`,
    /// older images named them `c<container id>`).
    pub(crate) fn at_dirs(enforcement: &Enforcement, dirs: &[PathBuf]) -> Option<Self> {
        let name = dirs.first()?.file_name()?.to_str()?;
        let expected = Self::dirs_named(enforcement, name)?;
        let cgroup = Self::fresh(expected, None);
        let matches = cgroup.dirs().len() == dirs.len()
            && cgroup
                .dirs()
                .iter()
                .zip(dirs)
                .all(|(a, b)| *a == b.as_path());
        matches.then_some(cgroup)
    }

    /// Creates cgroup `name` and writes its limits. An existing cgroup of that name is an
    /// error (`AlreadyExists`), unless `replace_empty` and it is empty: it is then replaced.
    fn create_named(
        enforcement: &Enforcement,
        name: &str,
        limits: ContainerLimits,
        replace_empty: bool,
    ) -> Result<Self, ExecError> {
        let dirs =
            Self::dirs_named(enforcement, name).ok_or_else(|| ExecError::CgroupUnavailable {
                reason: "rlimit+monitor mode has no cgroups".to_owned(),
            })?;
        let mut cgroup = Self::fresh(dirs, None);
        let mut created: Vec<&Path> = Vec::new();
        for dir in cgroup.dirs() {
            if replace_empty {
                // A leftover empty cgroup with this name (e.g. after a crash) is removed first;
                // a populated one means the name is still in use and the mkdir reports it.
                let _ = fs::remove_dir(dir);
            }
            if let Err(source) = fs::create_dir(dir) {
                // Only what this call made is removed: an existing directory of that name
                // (another container's, e.g. one handed over by an earlier image) is not ours.
                for made in created {
                    let _ = fs::remove_dir(made);
                }
                return Err(cgroup_err(dir, source));
            }
            created.push(dir);
        }
        if let Err(e) = cgroup.write_limits(limits) {
            cgroup.remove_quietly();
            return Err(e);
        }
        cgroup.written = Some(limits);
        Ok(cgroup)
    }

    /// Makes an idle pooled cgroup ready for a new container with `limits`: soft limits a
    /// resize left are lifted, and hard limits are written unless they are unchanged.
    fn reuse(&mut self, limits: ContainerLimits) -> Result<(), ExecError> {
        if self.shaped.swap(false, Ordering::SeqCst) {
            match &self.dirs {
                CgroupDirs::V2 { dir } => write_file(&dir.join("memory.high"), "max")?,
                CgroupDirs::V1 { memory_dir, .. } => {
                    write_file(&memory_dir.join("memory.soft_limit_in_bytes"), "-1")?;
                }
            }
            self.written = None;
        }
        if self.written != Some(limits) {
            self.written = None;
            self.write_limits(limits)?;
            self.written = Some(limits);
        }
        self.reused = true;
        Ok(())
    }

    /// Prepares an empty cgroup for the pool: v1's peak is reset, and the counters' current
    /// values become the baselines of its next container. Fails while processes remain. Memory
    /// still charged to it (page cache the last container read) is left for the kernel to
    /// reclaim under the next container's limit: forcing it out (`memory.force_empty`) took
    /// 28 ms per container here. So the memory a reused cgroup reports can include such cache.
    fn make_idle(&self) -> Result<ContainerCgroup, ExecError> {
        if !self.pids().is_empty() {
            return Err(cgroup_err(
                &self.primary_dir(),
                io::Error::from_raw_os_error(libc::EBUSY),
            ));
        }
        if let CgroupDirs::V1 { memory_dir, .. } = &self.dirs {
            write_file(&memory_dir.join("memory.max_usage_in_bytes"), "0")?;
        }
        let idle = ContainerCgroup {
            dirs: self.dirs.clone(),
            written: self.written,
            shaped: AtomicBool::new(self.shaped.load(Ordering::SeqCst)),
            oom_base: 0,
            cpu_base_us: 0,
            reused: self.reused,
        };
        Ok(ContainerCgroup {
            oom_base: idle.oom_kills(),
            cpu_base_us: idle.cpu_usage_us().unwrap_or(0),
            ..idle
        })
    }

    /// The resource shaper's allocation (Pace §3.2) as soft limits on a running container: the
    /// CPU quota (throttling only) and the memory level above which the kernel reclaims and
    /// throttles the cgroup (v2 `memory.high`, v1 `memory.soft_limit_in_bytes`). The hard memory
    /// limit stays at the request, so a use above the forecast is throttled and preempted by the
    /// shaper's policy rather than OOM-killed at the forecast.
    pub(crate) fn write_shaped_limits(&self, shaped: ContainerLimits) -> Result<(), ExecError> {
        self.shaped.store(true, Ordering::SeqCst);
        let memory_bytes = shaped.memory_mib.saturating_mul(1 << 20);
        let quota_us =
            (shaped.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000).max(MIN_CPU_QUOTA_US);
        match &self.dirs {
            CgroupDirs::V2 { dir } => {
                write_file(&dir.join("memory.high"), &memory_bytes.to_string())?;
                write_file(&dir.join("cpu.max"), &format!("{quota_us} {CPU_PERIOD_US}"))?;
            }
            CgroupDirs::V1 {
                memory_dir,
                cpu_dir,
            } => {
                write_file(
                    &memory_dir.join("memory.soft_limit_in_bytes"),
                    &memory_bytes.to_string(),
                )?;
                write_file(&cpu_dir.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
            }
        }
        Ok(())
    }

    fn write_limits(&self, limits: ContainerLimits) -> Result<(), ExecError> {
        let memory_bytes = limits.memory_mib.saturating_mul(1 << 20);
        let quota_us =
            (limits.cpu_millis.saturating_mul(CPU_PERIOD_US) / 1000).max(MIN_CPU_QUOTA_US);
        match &self.dirs {
            CgroupDirs::V2 { dir } => {
                write_file(&dir.join("memory.max"), &memory_bytes.to_string())?;
                write_file(&dir.join("cpu.max"), &format!("{quota_us} {CPU_PERIOD_US}"))?;
                // Without swap accounting the limit could be dodged by swapping; oom.group makes
                // the kernel kill the whole container rather than one process of it.
                for (file, value) in [("memory.swap.max", "0"), ("memory.oom.group", "1")] {
                    let path = dir.join(file);
                    if path.exists() {
                        write_file(&path, value)?;
                    }
                }
            }
            CgroupDirs::V1 {
                memory_dir,
                cpu_dir,
            } => {
                let limit = memory_dir.join("memory.limit_in_bytes");
                let memsw = memory_dir.join("memory.memsw.limit_in_bytes");
                let bytes = memory_bytes.to_string();
                // The kernel keeps limit <= memsw limit: lowering writes the limit first,
                // raising (a reused cgroup) the memsw limit first.
                match write_file(&limit, &bytes) {
                    Ok(()) => {
                        if memsw.exists() {
                            write_file(&memsw, &bytes)?;
                        }
                    }
                    Err(e) => {
                        if !memsw.exists() {
                            return Err(e);
                        }
                        write_file(&memsw, &bytes)?;
                        write_file(&limit, &bytes)?;
                    }
                }
                write_file(
                    &cpu_dir.join("cpu.cfs_period_us"),
                    &CPU_PERIOD_US.to_string(),
                )?;
                write_file(&cpu_dir.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
            }
        }
        Ok(())
    }

    pub(crate) fn dirs(&self) -> Vec<&Path> {
        match &self.dirs {
            CgroupDirs::V2 { dir } => vec![dir.as_path()],
            CgroupDirs::V1 {
                memory_dir,
                cpu_dir,
            } => vec![memory_dir.as_path(), cpu_dir.as_path()],
        }
    }

    /// The directory whose membership and memory accounting describe the container.
    pub fn primary_dir(&self) -> PathBuf {
        match &self.dirs {
            CgroupDirs::V2 { dir } => dir.clone(),
            CgroupDirs::V1 { memory_dir, .. } => memory_dir.clone(),
        }
    }

    /// The files the child writes "0" (itself) into before exec to join the container's
    /// cgroups: `cgroup.procs` on v2, each hierarchy's `tasks` on v1. A v1 `cgroup.procs` write
    /// takes the machine-wide `cgroup_threadgroup_rwsem` for writing, which waits for an RCU
    /// grace period unless another attach came just before: 12–16 ms for the first container
    /// after an idle moment on this project's VMs (one no-op task took ~16 ms end to end). A
    /// `tasks` write of "0" moves only the calling thread, for which recent kernels skip that
    /// lock (measured on 6.18: 0.1 ms instead of 16 ms, docs/benchmarks.md §1); the child is a
    /// single-threaded process, so moving its thread moves the process.
    pub fn join_files(&self) -> Vec<PathBuf> {
        match &self.dirs {
            CgroupDirs::V2 { dir } => vec![dir.join("cgroup.procs")],
            CgroupDirs::V1 {
                memory_dir,
                cpu_dir,
            } => vec![memory_dir.join("tasks"), cpu_dir.join("tasks")],
        }
    }

    /// Pids currently in the container's cgroup.
    pub fn pids(&self) -> Vec<u32> {
        read_file(&self.primary_dir().join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Memory charged to the cgroup (the quantity the limit applies to).
    pub fn memory_bytes(&self) -> Option<u64> {
        let file = match &self.dirs {
            CgroupDirs::V2 { dir } => dir.join("memory.current"),
            CgroupDirs::V1 { memory_dir, .. } => memory_dir.join("memory.usage_in_bytes"),
        };
        read_file(&file)?.trim().parse().ok()
    }

    /// The highest memory charge seen, where the kernel records it.
    pub fn peak_memory_bytes(&self) -> Option<u64> {
        let file = match &self.dirs {
            // An earlier container's peak may be in it (v2 cannot reset it for every reader).
            CgroupDirs::V2 { .. } if self.reused => return None,
            CgroupDirs::V2 { dir } => dir.join("memory.peak"),
            CgroupDirs::V1 { memory_dir, .. } => memory_dir.join("memory.max_usage_in_bytes"),
        };
        read_file(&file)?.trim().parse().ok()
    }

    /// How many processes the kernel's OOM killer has killed in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let (file, key) = match &self.dirs {
            CgroupDirs::V2 { dir } => (dir.join("memory.events"), "oom_kill"),
            CgroupDirs::V1 { memory_dir, .. } => {
                (memory_dir.join("memory.oom_control"), "oom_kill")
            }
        };
        read_file(&file)
            .and_then(|c| keyed_value(&c, key))
            .unwrap_or(0)
            .saturating_sub(self.oom_base)
    }

    /// CPU time used by everything that ever ran in the cgroup, in microseconds (v2 only; v1's
    /// cpu hierarchy has no usage counter, so callers fall back to `/proc`).
    pub fn cpu_usage_us(&self) -> Option<u64> {
        match &self.dirs {
            CgroupDirs::V2 { dir } => keyed_value(&read_file(&dir.join("cpu.stat"))?, "usage_usec")
                .map(|us| us.saturating_sub(self.cpu_base_us)),
            CgroupDirs::V1 { .. } => None,
        }
    }

    /// Asks the kernel to kill every process in the cgroup (v2 `cgroup.kill`, Linux ≥ 5.14).
    /// Returns false when the kernel has no such file; callers then signal pid by pid.
    pub fn kill_all(&self) -> bool {
        match &self.dirs {
            CgroupDirs::V2 { dir } => {
                let kill = dir.join("cgroup.kill");
                kill.exists() && fs::write(&kill, "1").is_ok()
            }
            CgroupDirs::V1 { .. } => false,
        }
    }

    /// Removes the cgroup directories; fails with EBUSY while processes remain.
    pub fn remove(&self) -> io::Result<()> {
        let mut first_error = None;
        for dir in self.dirs() {
            match fs::remove_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn remove_quietly(&self) {
        let _ = self.remove();
    }
}

/// Most idle cgroups an executor keeps for reuse (the rest are removed).
const MAX_IDLE_CGROUPS: usize = 64;
/// Names tried when a new pooled cgroup's name is taken by a populated cgroup (one an earlier
/// image of the worker handed over).
const NAME_ATTEMPTS: usize = 64;

/// Container cgroups are created once and reused: creating a v1 memory+cpu pair and removing
/// it again costs about 2 ms of kernel work per container (docs/benchmarks.md, section 1),
/// several times the rest of a launch. A cgroup goes back to the pool only when it is empty
/// (every process of its container is gone); a reused one gets its limits rewritten only if
/// they differ, and its counters are baselined (see [`ContainerCgroup`]).
#[derive(Debug, Default)]
pub(crate) struct CgroupPool {
    idle: Mutex<Vec<ContainerCgroup>>,
    next: AtomicU64,
    /// Set before an in-place upgrade: cgroups given back are removed, not kept (the next
    /// image knows nothing of this pool).
    closed: AtomicBool,
}

impl CgroupPool {
    /// A cgroup with `limits` for a new container (`None` without cgroups): an idle one if
    /// there is one, else a new one.
    pub fn acquire(
        &self,
        enforcement: &Enforcement,
        limits: ContainerLimits,
    ) -> Result<Option<ContainerCgroup>, ExecError> {
        if *enforcement == Enforcement::RlimitAndMonitor {
            return Ok(None);
        }
        loop {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .pop();
            let Some(mut cgroup) = idle else { break };
            match cgroup.reuse(limits) {
                Ok(()) => return Ok(Some(cgroup)),
                // E.g. a lower v1 memory limit than the memory still charged: use a fresh one.
                Err(_) => cgroup.remove_quietly(),
            }
        }
        let mut last_error = None;
        for _ in 0..NAME_ATTEMPTS {
            let name = format!("p{}", self.next.fetch_add(1, Ordering::Relaxed));
            match ContainerCgroup::create_named(enforcement, &name, limits, false) {
                Ok(cgroup) => return Ok(Some(cgroup)),
                Err(ExecError::Cgroup { source, path })
                    if source.kind() == io::ErrorKind::AlreadyExists =>
                {
                    last_error = Some(ExecError::Cgroup { source, path });
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or(ExecError::CgroupUnavailable {
            reason: "no free cgroup name".to_owned(),
        }))
    }

    /// Takes back the cgroup of a container that has ended, or removes it when the pool is
    /// full. Fails (EBUSY) while processes remain in it, leaving it untouched.
    pub fn release(&self, cgroup: &ContainerCgroup) -> Result<(), ExecError> {
        let idle = match cgroup.make_idle() {
            Ok(idle) => idle,
            Err(e) if !cgroup.pids().is_empty() => return Err(e),
            // Empty but not resettable: not reused.
            Err(_) => {
                return cgroup
                    .remove()
                    .map_err(|source| cgroup_err(&cgroup.primary_dir(), source));
            }
        };
        let mut pool = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if pool.len() < MAX_IDLE_CGROUPS && !self.closed.load(Ordering::SeqCst) {
            pool.push(idle);
            return Ok(());
        }
        drop(pool);
        cgroup
            .remove()
            .map_err(|source| cgroup_err(&cgroup.primary_dir(), source))
    }

    /// Removes every idle cgroup and keeps none from now on (an in-place upgrade follows).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.drain();
    }

    /// Removes every idle cgroup (the executor is going away).
    pub fn drain(&self) {
        let idle = std::mem::take(
            &mut *self
                .idle
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for cgroup in idle {
            cgroup.remove_quietly();
        }
    }

    /// Idle cgroups held (for tests and metrics).
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }
}

/// The root directories of an enforcement (none without cgroups).
pub(crate) fn roots(enforcement: &Enforcement) -> Vec<PathBuf> {
    match enforcement {
        Enforcement::CgroupV2 { root } => vec![root.clone()],
        Enforcement::CgroupV1 {
            memory_root,
            cpu_root,
        } => vec![memory_root.clone(), cpu_root.clone()],
        Enforcement::RlimitAndMonitor => vec![],
    }
}

/// Removes the roots an executor created, if they are empty.
pub(crate) fn remove_root(enforcement: &Enforcement) {
    match enforcement {
        Enforcement::CgroupV2 { root } => {
            let _ = fs::remove_dir(root);
        }
        Enforcement::CgroupV1 {
            memory_root,
            cpu_root,
        } => {
            let _ = fs::remove_dir(memory_root);
            let _ = fs::remove_dir(cpu_root);
        }
        Enforcement::RlimitAndMonitor => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 /outer /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/uni\\040fied rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /proc rw - proc proc rw";

    #[test]
    fn parses_cgroup_mounts_only() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(mounts.len(), 4);
        assert_eq!(mounts[0].super_options, vec!["rw", "cpu"]);
        assert_eq!(mounts[2].root, "/outer");
        assert_eq!(mounts[3].fs_type, "cgroup2");
        assert_eq!(
            mounts[3].mount_point,
            PathBuf::from("/sys/fs/cgroup/uni fied")
        );
    }

    #[test]
    fn parses_proc_self_cgroup() {
        let lines = parse_proc_cgroup("4:memory:/outer/job\n1:cpu,cpuacct:/\n0::/user.slice\n");
        assert_eq!(lines[0].controllers, vec!["memory"]);
        assert_eq!(lines[0].path, "/outer/job");
        assert_eq!(lines[1].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(lines[2].hierarchy, 0);
        assert!(lines[2].controllers.is_empty());
    }

    #[test]
    fn own_dir_strips_the_mounted_root() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(
            own_dir(&mounts[2], "/outer/job"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/job"))
        );
        assert_eq!(own_dir(&mounts[2], "/elsewhere"), None);
        assert_eq!(
            own_dir(&mounts[0], "/"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/"))
        );
    }

    #[test]
    fn containers_join_v1_hierarchies_through_their_tasks_files() {
        let v1 = ContainerCgroup::fresh(
            CgroupDirs::V1 {
                memory_dir: PathBuf::from("/m/p1"),
                cpu_dir: PathBuf::from("/c/p1"),
            },
            None,
        );
        // Not cgroup.procs: its write waits out an RCU grace period after an idle moment.
        assert_eq!(
            v1.join_files(),
            vec![PathBuf::from("/m/p1/tasks"), PathBuf::from("/c/p1/tasks")]
        );
        let v2 = ContainerCgroup::fresh(
            CgroupDirs::V2 {
                dir: PathBuf::from("/u/p1"),
            },
            None,
        );
        assert_eq!(v2.join_files(), vec![PathBuf::from("/u/p1/cgroup.procs")]);
    }

    #[test]
    fn reads_keyed_values() {
        let content = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_value(content, "oom_kill"), Some(3));
        assert_eq!(keyed_value(content, "missing"), None);
    }

    #[test]
    fn v1_detection_without_a_cpu_hierarchy_names_the_controller() {
        let mounts = parse_mountinfo(MOUNTINFO);
        let memberships = parse_proc_cgroup("4:memory:/outer\n");
        let reason = detect_v1(&mounts, &memberships, "x").unwrap_err();
        assert!(reason.contains("`cpu`"), "{reason}");
    }
}

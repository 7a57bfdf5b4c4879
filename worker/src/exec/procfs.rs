//! Reading process trees from `/proc`: who belongs to a container, how much CPU time it has
//! used and how much memory it holds.
//!
//! A container's leader calls `setsid()` before exec, so its pid is both the session id and the
//! process-group id of everything it starts. Membership is therefore "same session or same
//! process group", plus every descendant (by parent pid) of a member, which also catches a
//! child that called `setsid()` itself for as long as its parent lives. The kernel keeps a pid
//! number reserved while it is still used as a session or group id, so matching on the leader's
//! pid stays correct after the leader has been reaped.

use std::collections::{HashMap, HashSet};
use std::fs;

/// The fields of `/proc/<pid>/stat` the executor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub pid: u32,
    pub state: char,
    pub ppid: u32,
    pub pgrp: u32,
    pub session: u32,
    /// utime + stime + cutime + cstime in clock ticks: the process's own CPU time plus that of
    /// the children it has reaped, so time of exited members is not lost while their parent lives.
    pub cpu_ticks: u64,
    /// Resident set size in pages (the same quantity `/proc/<pid>/status` reports as VmRSS).
    pub rss_pages: u64,
    /// When the process started, in clock ticks since boot (field 22): with the pid, it
    /// identifies a process across pid reuse.
    pub start_time: u64,
}

impl ProcStat {
    /// Zombies and dead tasks hold no memory and cannot be signalled into anything useful.
    pub fn is_live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses the content of `/proc/<pid>/stat`. The command name is in parentheses and may itself
/// contain spaces and parentheses, so fields are counted from the last `)`.
pub(crate) fn parse_stat(content: &str) -> Option<ProcStat> {
    let open = content.find('(')?;
    let close = content.rfind(')')?;
    let pid = content.get(..open)?.trim().parse().ok()?;
    let rest: Vec<&str> = content.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let field = |n: usize| -> Option<u64> { rest.get(n - 3)?.parse().ok() };
    let state = rest.first()?.chars().next()?;
    let cpu_ticks = field(14)? + field(15)? + field(16)? + field(17)?;
    Some(ProcStat {
        pid,
        state,
        ppid: u32::try_from(field(4)?).ok()?,
        pgrp: u32::try_from(field(5)?).ok()?,
        session: u32::try_from(field(6)?).ok()?,
        cpu_ticks,
        rss_pages: field(24)?,
        start_time: field(22)?,
    })
}

/// Reads one process's stat; `None` when it has gone (a normal race while scanning).
pub(crate) fn read_stat(pid: u32) -> Option<ProcStat> {
    let content = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&content)
}

/// Reads the stat of every process visible in `/proc`; processes that exit during the scan are
/// skipped.
pub(crate) fn scan_all() -> std::io::Result<Vec<ProcStat>> {
    Ok(fs::read_dir("/proc")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read_stat)
        .collect())
}

/// The members of the container led by `leader` among `all`: same session or process group,
/// plus all descendants of those. (The leader's pid alone is not a criterion: after it has been
/// reaped the number may belong to an unrelated process.)
pub(crate) fn container_members(all: &[ProcStat], leader: u32) -> Vec<ProcStat> {
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    for (index, stat) in all.iter().enumerate() {
        children.entry(stat.ppid).or_default().push(index);
    }
    let mut member: HashSet<usize> = HashSet::new();
    let mut frontier: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, s)| s.session == leader || s.pgrp == leader)
        .map(|(i, _)| i)
        .collect();
    while let Some(index) = frontier.pop() {
        if !member.insert(index) {
            continue;
        }
        if let Some(kids) = children.get(&all[index].pid) {
            frontier.extend(kids.iter().copied());
        }
    }
    let mut members: Vec<ProcStat> = member.into_iter().map(|i| all[i]).collect();
    members.sort_by_key(|s| s.pid);
    members
}

/// Clock ticks per second for the tick fields of `/proc/<pid>/stat`.
pub(crate) fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0).unwrap_or(100)
}

/// Bytes per page for the rss field of `/proc/<pid>/stat`.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|s| *s > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, ppid: u32, pgrp: u32, session: u32) -> ProcStat {
        ProcStat {
            pid,
            state: 'S',
            ppid,
            pgrp,
            session,
            cpu_ticks: 0,
            rss_pages: 0,
            start_time: 0,
        }
    }

    #[test]
    fn parses_stat_with_parentheses_and_spaces_in_the_name() {
        let line = "4242 (we ird) (name)) R 17 4242 4242 0 -1 4194560 100 0 0 0 \
                    7 3 2 1 20 0 1 0 12345 10000000 256 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let parsed = parse_stat(line).expect("valid stat line");
        assert_eq!(parsed.pid, 4242);
        assert_eq!(parsed.state, 'R');
        assert_eq!(parsed.ppid, 17);
        assert_eq!(parsed.pgrp, 4242);
        assert_eq!(parsed.session, 4242);
        assert_eq!(parsed.cpu_ticks, 7 + 3 + 2 + 1);
        assert_eq!(parsed.rss_pages, 256);
        assert_eq!(parsed.start_time, 12345);
    }

    #[test]
    fn rejects_truncated_stat() {
        assert_eq!(parse_stat("12 (sh) S 1 12"), None);
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("x (sh) S 1 2 3 4"), None);
    }

    #[test]
    fn reads_own_process() {
        let me = read_stat(std::process::id()).expect("own stat is readable");
        assert_eq!(me.pid, std::process::id());
        assert!(me.is_live());
        assert!(me.rss_pages > 0);
    }

    #[test]
    fn members_include_session_group_and_escaped_descendants() {
        let all = vec![
            stat(1, 0, 1, 1),
            stat(100, 1, 100, 100),   // leader
            stat(101, 100, 100, 100), // child
            stat(102, 101, 102, 100), // own group, same session
            stat(103, 102, 103, 103), // called setsid, parent 102 is a member
            stat(104, 103, 103, 103), // its child
            stat(105, 1, 100, 100),   // orphan reparented to init, still in the session
            stat(200, 1, 200, 200),   // unrelated
            stat(201, 200, 200, 200), // unrelated child
        ];
        let pids: Vec<u32> = container_members(&all, 100).iter().map(|s| s.pid).collect();
        assert_eq!(pids, vec![100, 101, 102, 103, 104, 105]);
    }
}

//! A worker that crashes and restarts does not hand out capacity its previous incarnation's
//! containers still use: the real `worker` binary starts a long container (two processes), is
//! killed with SIGKILL (its containers survive it: they are their own sessions), and a new
//! `worker` on the same state dir kills them and removes their cgroups before it joins.
//!
//! The coordinator is in-process (`coordinator::start`); the container processes are found
//! independently of the worker's records, by a marker in their environment.

mod common;

use common::*;
use scheduler_core::protocol::app::{AcceptedState, ContainerEventKind};
use scheduler_core::{ContainerId, ContainerType};
use std::path::PathBuf;
use std::time::Duration;

/// Live (not zombie) processes whose environment holds `marker`.
fn marked_processes(marker: &str) -> Vec<u32> {
    let needle = marker.as_bytes();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle))
        })
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                let state = stat
                    .rfind(')')
                    .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_owned));
                !matches!(state.as_deref(), Some("Z" | "X"))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The cgroup directories of `pid` that a worker created (below a `hybrid-worker-*` root).
fn worker_cgroups(pid: u32) -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounts: Vec<(String, PathBuf, String, Vec<String>)> = mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split_whitespace().collect();
            let mut tail = after.split_whitespace();
            let fs = tail.next()?.to_string();
            let opts = tail
                .nth(1)
                .unwrap_or("")
                .split(',')
                .map(str::to_owned)
                .collect();
            Some((
                fields.get(3)?.to_string(),
                PathBuf::from(fields.get(4)?),
                fs,
                opts,
            ))
        })
        .collect();
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("/hybrid-worker-"))
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let hierarchy = parts.next()?;
            let controllers: Vec<&str> = parts.next()?.split(',').collect();
            let path = parts.next()?;
            let (root, mount_point, _, _) = mounts.iter().find(|(_, _, fs, opts)| {
                if hierarchy == "0" {
                    fs == "cgroup2"
                } else {
                    fs == "cgroup" && controllers.iter().any(|c| opts.iter().any(|o| o == c))
                }
            })?;
            let relative = path.strip_prefix(root.as_str()).unwrap_or(path);
            Some(mount_point.join(relative.trim_start_matches('/')))
        })
        .filter(|dir| dir.is_dir())
        .collect()
}

/// Subscribe, and start a QUEUEABLE container of two processes (`sleep 1000 & exec sleep
/// 1000`) whose environment holds a marker naming it; returns its id and the `KEY=value` marker
/// (see [`marked_processes`]).
async fn start_marked_container(app: &mut AppClient, marker_key: &str) -> (ContainerId, String) {
    app.subscribe().await;
    let token = app.grant(ask(ContainerType::Queueable, 500, 256)).await;
    let id = token.body.container_id;
    let marker = format!("{marker_key}={}-{}", std::process::id(), id.0);
    let mut launch = sh("sleep 1000 & exec sleep 1000");
    let (key, value) = marker.split_once('=').expect("k=v");
    launch.env.insert(key.into(), value.into());
    let accepted = app.start(&token, launch).await.expect("start accepted");
    assert_eq!(accepted.state, AcceptedState::Running);
    (id, marker)
}

async fn poll(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not happen within {FAILURE_TIMEOUT:?}"
        );
        pace.tick().await;
    }
}

#[actix_rt::test]
async fn a_restarted_worker_kills_the_containers_its_crashed_predecessor_left_running() {
    let c = Cluster::start(&["demo"], &[]).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let state_dir = tmp.path().join("state");
    let (mut first, endpoint) = start_worker_binary(
        &c,
        "phoenix",
        &state_dir,
        &tmp.path().join("first.log"),
        None,
    )
    .await;

    let mut app = AppClient::login(endpoint.parse().expect("addr"), "demo", c.secret("demo")).await;
    let (id, marker) = start_marked_container(&mut app, "REAP_TEST_MARKER").await;
    app.event("running", |e| {
        e.container_id == id && e.event == ContainerEventKind::Running
    })
    .await;
    poll("both container processes run", || {
        marked_processes(&marker).len() == 2
    })
    .await;
    let leaked = marked_processes(&marker);
    let cgroups = worker_cgroups(leaked[0]);
    eprintln!("container processes {leaked:?}, cgroups {cgroups:?}");
    // `Running` is told when the launch begins; the record is written right after the spawn,
    // on the blocking pool, so the processes can be seen a moment before it.
    let records = state_dir.join("containers");
    poll("the running container is recorded", || {
        std::fs::read_dir(&records).expect("records dir").count() == 1
    })
    .await;

    // The worker crashes: its container outlives it.
    first.kill().await.expect("SIGKILL the first worker");
    drop(app);
    assert_eq!(
        marked_processes(&marker),
        leaked,
        "a crashed worker's container keeps running (the case to handle)"
    );

    // Its successor on the same state dir kills it before joining.
    let (mut second, _) = start_worker_binary(
        &c,
        "phoenix",
        &state_dir,
        &tmp.path().join("second.log"),
        None,
    )
    .await;
    poll("the leftover container processes are gone", || {
        marked_processes(&marker).is_empty()
    })
    .await;
    for dir in &cgroups {
        assert!(
            !dir.exists(),
            "leftover cgroup {} was removed",
            dir.display()
        );
    }
    assert_eq!(
        std::fs::read_dir(&records).expect("records dir").count(),
        0,
        "the reaped container's record is gone"
    );
    let log = std::fs::read_to_string(tmp.path().join("second.log")).unwrap_or_default();
    assert!(
        log.contains("reaped what a previous worker left behind"),
        "{log}"
    );

    second.kill().await.expect("stop the second worker");
    c.server.shutdown();
}

/// A worker stopped with SIGTERM tells its apps their containers are lost, so those containers
/// must be gone by the time it exits: it kills them, waits (bounded) until every process task
/// has reaped its container and emptied its cgroup, and removes its cgroup roots. Before, the
/// process exited as soon as the kills were queued, leaving every container running and every
/// cgroup in place.
#[actix_rt::test]
async fn a_worker_stopped_with_sigterm_kills_its_containers_and_removes_its_cgroups_before_it_exits()
 {
    let c = Cluster::start(&["demo"], &[]).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let state_dir = tmp.path().join("state");
    let log = tmp.path().join("worker.log");
    let (mut worker, endpoint) = start_worker_binary(&c, "stopped", &state_dir, &log, None).await;

    let mut app = AppClient::login(endpoint.parse().expect("addr"), "demo", c.secret("demo")).await;
    let (_, marker) = start_marked_container(&mut app, "STOP_TEST_MARKER").await;
    poll("both container processes run", || {
        marked_processes(&marker).len() == 2
    })
    .await;
    let container = marked_processes(&marker);
    let cgroups = worker_cgroups(container[0]);
    // The executor's roots: the parents of the container's cgroups (cgroup hosts only).
    let roots: Vec<PathBuf> = cgroups
        .iter()
        .filter_map(|dir| dir.parent().map(PathBuf::from))
        .collect();
    eprintln!("container processes {container:?}, cgroups {cgroups:?}, roots {roots:?}");

    let pid = i32::try_from(worker.id().expect("worker pid")).expect("pid");
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(FAILURE_TIMEOUT, worker.wait())
        .await
        .expect("the worker exits after SIGTERM")
        .expect("wait for the worker");
    eprintln!("worker exited: {status}");

    // Checked at once, not polled: the worker's exit is the moment the promise must hold.
    assert_eq!(
        marked_processes(&marker),
        Vec::<u32>::new(),
        "a container outlived the worker that told its app it was lost; the worker's log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    for dir in cgroups.iter().chain(&roots) {
        assert!(
            !dir.exists(),
            "cgroup {} outlived the worker that made it",
            dir.display()
        );
    }
    drop(app);
    c.server.shutdown();
}

//! Upgrading a worker in place keeps its running containers (issue 18): the real `worker` binary
//! runs GUARANTEED and QUEUEABLE containers (and one queued), gets SIGUSR2, and re-executes
//! itself keeping its pid. The same container processes keep running, the coordinator books the
//! GUARANTEED one exactly once, the app reconnects and stops them, exits after the upgrade are
//! reported (one container exits in the gap between the images, as a zombie the new image
//! collects), the queued container starts when room frees, and new containers start.
//!
//! A second test corrupts the hand-over between the images (through `--upgrade-binary`, a
//! script that damages the state file and then executes the worker): the new image names the
//! damage and kills the containers rather than trusting the file.
//!
//! The coordinator is in-process (`coordinator::start`); its bookings are read through its admin
//! socket, as `coordinator nodes --json` does.

mod common;

use common::*;
use coordinator::admin::{AdminRequest, call};
use scheduler_core::protocol::app::{AcceptedState, AppResponse, ContainerEventKind};
use scheduler_core::{ContainerId, ContainerType};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

/// A `worker` binary with its stdout lines.
struct WorkerProcess {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    log: PathBuf,
}

impl WorkerProcess {
    async fn spawn(c: &Cluster, node: &str, dir: &Path, extra: &[&str]) -> WorkerProcess {
        let log = dir.join("worker.log");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_worker"))
            .arg("run")
            .args(["--coordinator", &c.server.quic_addr.to_string()])
            .arg("--ca-cert")
            .arg(c.dir.path().join("ca.pem"))
            .arg("--join-token-file")
            .arg(c.dir.path().join("join-token"))
            .args([
                "--node-id",
                node,
                "--cpu-millis",
                "2000",
                "--memory-mib",
                "2048",
            ])
            .args(["--app-listen", "127.0.0.1:0", "--app-plaintext-tcp"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--container-log-dir")
            .arg(dir.join("logs"))
            .args(extra)
            .env("RUST_LOG", "worker=debug,info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the worker binary");
        let stdout = child.stdout.take().expect("piped stdout");
        WorkerProcess {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process's exit status (it must exit within the failure timeout) and its log.
    async fn exited(&mut self, after: &str) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(FAILURE_TIMEOUT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("no exit after {after}; log:\n{}", self.log_text()))
            .expect("wait");
        (status, self.log_text())
    }

    /// The next `joined` line (the first image's, or an upgraded image's).
    async fn joined(&mut self) -> serde_json::Value {
        let line = tokio::time::timeout(FAILURE_TIMEOUT, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no joined line; log:\n{}", self.log_text()))
            .expect("read stdout")
            .unwrap_or_else(|| panic!("the worker exited; log:\n{}", self.log_text()));
        let joined: serde_json::Value = serde_json::from_str(&line).expect("JSON line");
        assert_eq!(joined["event"], "joined", "{line}");
        joined
    }

    fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0);
    }
}

fn endpoint(joined: &serde_json::Value) -> std::net::SocketAddr {
    joined["app_endpoint"]
        .as_str()
        .and_then(|e| e.strip_prefix("tcp://"))
        .expect("tcp:// endpoint")
        .parse()
        .expect("address")
}

/// (pid, start time) of the live processes whose environment holds `marker`.
fn marked(marker: &str) -> Vec<(u32, u64)> {
    let needle = marker.as_bytes();
    let mut out: Vec<(u32, u64)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle))
        })
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
            if matches!(rest.first(), Some(&"Z" | &"X")) {
                return None;
            }
            Some((pid, rest.get(19)?.parse().ok()?))
        })
        .collect();
    out.sort_unstable();
    out
}

/// (pid, start time) of the container leaders (session leaders) among the processes marked
/// `marker`: what must survive the upgrade unchanged (children such as a polling loop's
/// `sleep` come and go).
fn leaders(marker: &str) -> Vec<(u32, u64)> {
    marked(marker)
        .into_iter()
        .filter(|(pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                let rest: Vec<&str> = stat[stat.rfind(')').unwrap_or(0) + 1..]
                    .split_whitespace()
                    .collect();
                rest.get(3) == Some(&pid.to_string().as_str())
            })
        })
        .collect()
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

/// The coordinator's row for `node` in `coordinator nodes --json`.
async fn node_row(c: &Cluster, node: &str) -> serde_json::Value {
    let socket = c.server.admin_socket.clone();
    let nodes = tokio::task::spawn_blocking(move || call(&socket, &AdminRequest::Nodes))
        .await
        .expect("admin call")
        .expect("nodes");
    nodes
        .as_array()
        .expect("array")
        .iter()
        .find(|n| n["node_id"] == node)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

async fn wait_for_row(
    c: &Cluster,
    node: &str,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + FAILURE_TIMEOUT;
    loop {
        let row = node_row(c, node).await;
        if cond(&row) {
            return row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: last row {row}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn marker_env(launch: &mut scheduler_core::protocol::app::LaunchSpec, marker: &str) {
    let (k, v) = marker.split_once('=').expect("k=v");
    launch.env.insert(k.into(), v.into());
}

async fn start(
    app: &mut AppClient,
    container_type: ContainerType,
    cpu: u64,
    mut launch: scheduler_core::protocol::app::LaunchSpec,
    marker: &str,
) -> (ContainerId, AcceptedState) {
    let token = app.grant(ask(container_type, cpu, 256)).await;
    marker_env(&mut launch, marker);
    let accepted = app.start(&token, launch).await.expect("start accepted");
    (token.body.container_id, accepted.state)
}

/// A container of two processes (`sleep` and its child), started and seen running.
async fn start_two_process_container(
    app: &mut AppClient,
    container_type: ContainerType,
    mark: &str,
) {
    let (_, state) = start(
        app,
        container_type,
        500,
        sh("sleep 1000 & exec sleep 1000"),
        mark,
    )
    .await;
    assert_eq!(state, AcceptedState::Running);
    poll("both processes run", || marked(mark).len() == 2).await;
}

/// An executable `--upgrade-binary` in `dir`: `script` (shell, run with the worker's arguments),
/// then the worker binary with the arguments as they are then. The flag to pass.
fn upgrade_binary_script(dir: &Path, script: &str) -> String {
    let path = dir.join("upgrade-binary");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n{script}exec {} \"$@\"\n",
            env!("CARGO_BIN_EXE_worker")
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("--upgrade-binary={}", path.display())
}

#[actix_rt::test]
async fn an_upgraded_worker_keeps_its_running_containers() {
    let c = Cluster::start(&["demo"], &[]).await;
    // The queued container must wait for room, not be shed to another node (there is none).
    let socket = c.server.admin_socket.clone();
    tokio::task::spawn_blocking(move || {
        call(
            &socket,
            &AdminRequest::Shedding {
                policy: "off".into(),
            },
        )
    })
    .await
    .expect("admin call")
    .expect("shedding off");
    let tmp = tempfile::tempdir().expect("tempdir");
    // Containers run as an unprivileged user: the release file's dir must be reachable.
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let release = shared.join("release");
    let mut w = WorkerProcess::spawn(&c, "phoenix", tmp.path(), &[]).await;
    let first = w.joined().await;
    let addr = endpoint(&first);
    let tag = std::process::id();

    let mut app = AppClient::login(addr, "demo", c.secret("demo")).await;
    app.subscribe().await;
    // GUARANTEED, running for good.
    let g_mark = format!("UPGRADE_G={tag}");
    let (g, state) = start(
        &mut app,
        ContainerType::Guaranteed,
        500,
        sh("echo g-started; exec sleep 1000"),
        &g_mark,
    )
    .await;
    assert_eq!(state, AcceptedState::Running);
    // QUEUEABLE, exits with 3 once the test creates the release file (after the upgrade).
    let q_mark = format!("UPGRADE_Q={tag}");
    let script = format!(
        "echo q-started; while [ ! -e {} ]; do sleep 0.02; done; echo q-released; exit 3",
        release.display()
    );
    let (q, state) = start(
        &mut app,
        ContainerType::Queueable,
        300,
        sh(&script),
        &q_mark,
    )
    .await;
    assert_eq!(state, AcceptedState::Running);
    // QUEUEABLE, exits with 7 as soon as its worker runs the next image (its parent's command
    // line names the hand-over): in the gap, as a zombie the new image must collect.
    let gap_mark = format!("UPGRADE_GAP={tag}");
    let (gap, state) = start(
        &mut app,
        ContainerType::Queueable,
        300,
        sh("while ! tr '\\0' ' ' < /proc/$PPID/cmdline | grep -q -- --adopt-state; do sleep 0.005; done; exit 7"),
        &gap_mark,
    )
    .await;
    assert_eq!(state, AcceptedState::Running);
    // QUEUEABLE that does not fit (2000 - 1100 free): queued until the gap container's room frees.
    let queued_mark = format!("UPGRADE_QUEUED={tag}");
    let (queued, state) = start(
        &mut app,
        ContainerType::Queueable,
        1100,
        sh("exec sleep 1000"),
        &queued_mark,
    )
    .await;
    assert_eq!(state, AcceptedState::Queued);
    for id in [g, q, gap] {
        app.event("running", |e| {
            e.container_id == id && e.event == ContainerEventKind::Running
        })
        .await;
    }
    poll("the containers' processes run", || {
        !marked(&g_mark).is_empty() && !marked(&q_mark).is_empty() && !marked(&gap_mark).is_empty()
    })
    .await;
    let g_procs = leaders(&g_mark);
    let q_procs = leaders(&q_mark);
    assert_eq!((g_procs.len(), q_procs.len()), (1, 1));
    let row = wait_for_row(&c, "phoenix", "the G container is booked", |r| {
        r["running_guaranteed"] == 1
    })
    .await;
    assert_eq!(row["guaranteed_booked"]["cpu_millis"], 500, "{row}");

    // Upgrade: `systemctl reload` sends SIGUSR2.
    w.signal(libc::SIGUSR2);
    let second = w.joined().await;
    assert_eq!(second["app_endpoint"], first["app_endpoint"], "{second}");
    assert_eq!(second["metrics_addr"], first["metrics_addr"], "{second}");
    assert_eq!(second["adopted"], 3, "{second}");
    let log = w.log_text();
    assert!(
        log.contains("containers handed over for the upgrade"),
        "{log}"
    );
    assert!(
        log.contains("container re-adopted after the upgrade"),
        "{log}"
    );

    // The same processes (pid and start time) run on.
    assert_eq!(leaders(&g_mark), g_procs);
    assert_eq!(leaders(&q_mark), q_procs);

    // The app's old connection dropped with the old image; it reconnects to the same address
    // and, on subscribing, hears what happened meanwhile.
    let mut app = AppClient::login(addr, "demo", c.secret("demo")).await;
    app.subscribe().await;
    app.event("the gap container's exit", |e| {
        e.container_id == gap && e.event == ContainerEventKind::Completed { exit_code: 7 }
    })
    .await;
    app.event("the queued container starts once room frees", |e| {
        e.container_id == queued && e.event == ContainerEventKind::Running
    })
    .await;
    poll("the queued container's process runs", || {
        !marked(&queued_mark).is_empty()
    })
    .await;

    // The coordinator books the GUARANTEED container exactly once (re-adopted from the join).
    let row = wait_for_row(&c, "phoenix", "the re-join is reported", |r| {
        r["running_guaranteed"] == 1 && r["running_queueable"] == 2
    })
    .await;
    assert_eq!(row["guaranteed_booked"]["cpu_millis"], 500, "{row}");
    assert_eq!(row["guaranteed_booked"]["memory_mib"], 256, "{row}");

    // An exit after the upgrade is reported, and the adopted log copy went on.
    std::fs::write(&release, b"").unwrap();
    app.event("the QUEUEABLE container's exit", |e| {
        e.container_id == q && e.event == ContainerEventKind::Completed { exit_code: 3 }
    })
    .await;
    let q_log = std::fs::read_to_string(tmp.path().join(format!("logs/container-{}.stdout", q.0)))
        .expect("q log");
    assert_eq!(q_log, "q-started\nq-released\n");

    // New containers start.
    let token = app.grant(ask(ContainerType::Queueable, 100, 64)).await;
    let fresh = token.body.container_id;
    let accepted = app.start(&token, sh("exit 0")).await.expect("start");
    assert_eq!(accepted.state, AcceptedState::Running);
    app.event("the new container completes", |e| {
        e.container_id == fresh && e.event == ContainerEventKind::Completed { exit_code: 0 }
    })
    .await;

    // The app stops the adopted GUARANTEED container; its booking is freed.
    match app.release(g).await {
        AppResponse::Ack(_) => {}
        other => panic!("release of the adopted container: {other:?}"),
    }
    app.event("the G container is killed", |e| {
        e.container_id == g && matches!(e.event, ContainerEventKind::Killed { .. })
    })
    .await;
    poll("the G container's processes are gone", || {
        marked(&g_mark).is_empty()
    })
    .await;
    wait_for_row(&c, "phoenix", "the G booking is freed", |r| {
        r["guaranteed_booked"]["cpu_millis"] == 0
    })
    .await;
    match app.release(queued).await {
        AppResponse::Ack(_) => {}
        other => panic!("release of the queued container: {other:?}"),
    }
    poll("every container process is gone", || {
        marked(&queued_mark).is_empty() && marked(&gap_mark).is_empty()
    })
    .await;

    w.signal(libc::SIGTERM);
    let _ = tokio::time::timeout(FAILURE_TIMEOUT, w.child.wait()).await;
    c.server.shutdown();
}

#[actix_rt::test]
async fn a_damaged_hand_over_is_refused_and_its_containers_are_killed() {
    let c = Cluster::start(&["demo"], &[]).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // The "new binary" damages the hand-over (one byte appended) and runs the worker.
    let wrapper_arg = upgrade_binary_script(
        tmp.path(),
        "for a in \"$@\"; do state=\"$a\"; done\nprintf x >> \"$state\"\n",
    );
    let mut w = WorkerProcess::spawn(&c, "damaged", tmp.path(), &[&wrapper_arg]).await;
    let first = w.joined().await;
    let mut app = AppClient::login(endpoint(&first), "demo", c.secret("demo")).await;
    app.subscribe().await;
    let mark = format!("UPGRADE_DAMAGED={}", std::process::id());
    start_two_process_container(&mut app, ContainerType::Guaranteed, &mark).await;

    w.signal(libc::SIGUSR2);
    let second = w.joined().await;
    assert_eq!(second["adopted"], 0, "{second}");
    let log = w.log_text();
    assert!(
        log.contains("is damaged: its SHA-256 does not match its content"),
        "{log}"
    );
    assert!(
        log.contains("adopting nothing; the containers recorded in the state dir are killed"),
        "{log}"
    );
    poll("the untrusted containers are killed", || {
        marked(&mark).is_empty()
    })
    .await;
    wait_for_row(&c, "damaged", "the re-join frees the booking", |r| {
        r["guaranteed_booked"]["cpu_millis"] == 0 && r["running_guaranteed"] == 0
    })
    .await;

    w.signal(libc::SIGTERM);
    let _ = tokio::time::timeout(FAILURE_TIMEOUT, w.child.wait()).await;
    c.server.shutdown();
}

/// A worker stopped while it is still joining kills what it runs. The new image of an upgrade
/// cannot reach the coordinator (its `--upgrade-binary` is a script that points it at a port
/// where nothing listens), so it adopts the running containers and keeps trying to join; a
/// SIGTERM then must kill them and end the process cleanly. Before, the worker listened for
/// SIGTERM only once it had joined: the signal's default action ended the process and the
/// adopted containers ran on, watched by nobody, until a next start reaped them.
#[actix_rt::test]
async fn a_worker_stopped_before_it_joins_kills_what_it_adopted() {
    let c = Cluster::start(&["demo"], &[]).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // The same arguments, but the coordinator's address replaced by one where nothing listens.
    let wrapper_arg = upgrade_binary_script(
        tmp.path(),
        "next_is_address=\n\
         for a in \"$@\"; do\n  shift\n  \
           if [ -n \"$next_is_address\" ]; then set -- \"$@\" 127.0.0.1:9; next_is_address=; continue; fi\n  \
           [ \"$a\" = --coordinator ] && next_is_address=1\n  \
           set -- \"$@\" \"$a\"\n\
         done\n",
    );
    let mut w = WorkerProcess::spawn(&c, "unjoinable", tmp.path(), &[&wrapper_arg]).await;
    let first = w.joined().await;
    let mut app = AppClient::login(endpoint(&first), "demo", c.secret("demo")).await;
    let mark = format!("UPGRADE_UNJOINED={}", std::process::id());
    start_two_process_container(&mut app, ContainerType::Queueable, &mark).await;

    w.signal(libc::SIGUSR2);
    // The new image has taken the containers over (it listens for SIGTERM before it does).
    poll("the new image adopts", || {
        w.log_text()
            .contains("taking over from the previous worker image")
    })
    .await;
    assert_eq!(marked(&mark).len(), 2, "adopted, still running");
    w.signal(libc::SIGTERM);
    let (status, log) = w.exited("SIGTERM").await;
    assert!(status.success(), "{status:?}; log:\n{log}");
    assert!(
        log.contains("stopped (SIGTERM) before joining: killing containers"),
        "{log}"
    );
    assert!(
        marked(&mark).is_empty(),
        "the adopted containers outlived the worker: {:?}",
        marked(&mark)
    );
    c.server.shutdown();
}

/// An upgrade that fails after the containers were handed over (here: the state file cannot be
/// written, a directory is in its place) leaves an image that no longer serves them: it kills
/// them before it exits. Before, it exited at once and they ran on unwatched until a next start,
/// while the coordinator, declaring the node lost, told their apps they were gone.
#[actix_rt::test]
async fn an_upgrade_failing_after_the_hand_over_kills_the_containers_before_exiting() {
    let c = Cluster::start(&["demo"], &[]).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut w = WorkerProcess::spawn(&c, "unwritable", tmp.path(), &[]).await;
    let first = w.joined().await;
    let mut app = AppClient::login(endpoint(&first), "demo", c.secret("demo")).await;
    let mark = format!("UPGRADE_UNWRITABLE={}", std::process::id());
    start_two_process_container(&mut app, ContainerType::Guaranteed, &mark).await;
    // The hand-over's state file cannot be renamed into place.
    let blocker = tmp.path().join("state").join("upgrade-state");
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("keep"), b"").unwrap();

    w.signal(libc::SIGUSR2);
    let (status, log) = w.exited("the failed upgrade").await;
    assert_eq!(status.code(), Some(1), "{status:?}; log:\n{log}");
    assert!(log.contains("upgrade failed after the hand-over"), "{log}");
    assert!(log.contains("killed the handed-over containers"), "{log}");
    assert!(
        marked(&mark).is_empty(),
        "the handed-over containers outlived the worker: {:?}",
        marked(&mark)
    );
    c.server.shutdown();
}

//! Containers run as an unprivileged user and cannot read the worker's secrets (DESIGN.md
//! "Security"): a real container on a real worker (joined to a real coordinator) runs as the
//! configured user, cannot `cat` the join token, still gets its stdout/stderr files and its
//! cgroup, and a worker refuses to run containers as root unless told to.
//!
//! Switching users needs root: these tests print why and pass without checking anything when
//! they do not run as root.

mod common;

use common::*;
use scheduler_core::ContainerType;
use scheduler_core::protocol::app::{AcceptedState, ContainerEventKind, LaunchSpec};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: switching container users needs a worker running as root");
    }
    root
}

/// Run `launch` on node-a as app `demo` and return its exit code once it completed.
async fn run_to_completion(c: &Cluster, launch: LaunchSpec) -> (scheduler_core::ContainerId, i32) {
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    let token = app.grant(ask(ContainerType::Queueable, 200, 64)).await;
    let id = token.body.container_id;
    let accepted = app.start(&token, launch).await.expect("start accepted");
    assert_eq!(accepted.state, AcceptedState::Running);
    let done = app
        .event("the container's end", |e| {
            e.container_id == id
                && matches!(
                    e.event,
                    ContainerEventKind::Completed { .. } | ContainerEventKind::Killed { .. }
                )
        })
        .await;
    match done.event {
        ContainerEventKind::Completed { exit_code } => (id, exit_code),
        other => panic!("container {id} did not complete: {other:?}"),
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[actix_rt::test]
async fn containers_run_as_the_unprivileged_user_and_cannot_read_the_join_token() {
    if !running_as_root() {
        return;
    }
    let logs = tempfile::tempdir().expect("tempdir");
    let log_dir = logs.path().join("containers");
    let nobody = worker::exec::user::resolve_container_user(None).expect("default user");
    assert_ne!(nobody.uid, 0);
    // The state dir sits in a directory everyone may enter: only its own mode protects it.
    std::fs::set_permissions(logs.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let state_dir = logs.path().join("state");
    let c = Cluster::start_with(&["demo"], &[node("node-a", 2000, 2048)], |w| {
        w.container_log_dir = Some(log_dir.clone());
        w.state_dir = state_dir.clone();
    })
    .await;
    let token_file = c.dir.path().join("join-token");
    assert!(token_file.exists());
    let script = format!(
        "echo \"uid=$(id -u) gid=$(id -g) groups=$(id -G)\"\n\
         if out=$(cat '{token}' 2>&1); then echo 'read the join token'; exit 10; fi\n\
         echo \"token: $out\"\n\
         if out=$(cat '{ca_key}' 2>&1); then echo 'read the CA key'; exit 11; fi\n\
         echo \"ca key: $out\"\n\
         if out=$(ls '{state}' 2>&1); then echo 'listed the state dir'; exit 12; fi\n\
         echo \"state: $out\"\n\
         echo 'to stderr' >&2\n\
         echo \"cwd=$(pwd)\"",
        token = token_file.display(),
        ca_key = c.dir.path().join("ca.key").display(),
        state = state_dir.display(),
    );
    let (id, code) = run_to_completion(&c, sh(&script)).await;
    let stdout_path = log_dir.join(format!("container-{}.stdout", id.0));
    let stdout = std::fs::read_to_string(&stdout_path).expect("stdout file");
    assert_eq!(code, 0, "container output:\n{stdout}");
    assert!(
        stdout.contains(&format!("uid={} gid={} ", nobody.uid, nobody.gid)),
        "{stdout}"
    );
    assert!(
        stdout.contains("token: cat: ") && stdout.contains("Permission denied"),
        "{stdout}"
    );
    assert!(stdout.contains("ca key: cat: "), "{stdout}");
    assert!(
        stdout.contains("state: ls: ") && stdout.matches("Permission denied").count() >= 2,
        "{stdout}"
    );
    assert_eq!(mode(&state_dir), 0o700);
    let cwd = std::env::current_dir().expect("cwd");
    assert!(
        stdout.contains(&format!("cwd={}", cwd.display())),
        "a container without working_dir runs in the worker's directory: {stdout}"
    );
    let stderr_path = log_dir.join(format!("container-{}.stderr", id.0));
    assert_eq!(
        std::fs::read_to_string(&stderr_path).expect("stderr file"),
        "to stderr\n"
    );
    // The log files belong to the worker, not to the container user.
    assert_eq!(mode(&log_dir), 0o700);
    assert_eq!(mode(&stdout_path), 0o600);
    assert_eq!(mode(&stderr_path), 0o600);

    // A working directory the container user cannot enter is a launch failure, not a container
    // quietly running as root there.
    let private = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    let token = app.grant(ask(ContainerType::Queueable, 200, 64)).await;
    let bad = token.body.container_id;
    let mut launch = sh("exit 0");
    launch.working_dir = Some(private.path().display().to_string());
    app.start(&token, launch).await.expect("start accepted");
    let done = app
        .event("the failed container's end", |e| {
            e.container_id == bad && matches!(e.event, ContainerEventKind::Killed { .. })
        })
        .await;
    match &done.event {
        ContainerEventKind::Killed { message, .. } => {
            assert!(message.contains("ermission denied"), "{done:?}")
        }
        other => panic!("expected a launch failure, got {other:?}"),
    }
    c.stop().await;
}

#[actix_rt::test]
async fn containers_can_be_given_another_user_by_uid_and_gid() {
    if !running_as_root() {
        return;
    }
    let c = Cluster::start_with(&["demo"], &[node("node-a", 2000, 2048)], |w| {
        w.container_user =
            worker::exec::user::resolve_container_user(Some("4711:4712")).expect("numeric user");
    })
    .await;
    let (_, code) = run_to_completion(
        &c,
        sh("test \"$(id -u):$(id -g):$(id -G)\" = 4711:4712:4712"),
    )
    .await;
    assert_eq!(
        code, 0,
        "the container ran as 4711:4712 with no other group"
    );
    c.stop().await;
}

#[actix_rt::test]
async fn a_root_worker_refuses_root_containers_unless_allowed() {
    if !running_as_root() {
        return;
    }
    let root = worker::exec::user::resolve_container_user(Some("root")).expect("root user");
    let mut config = worker::config::RunArgs {
        coordinator: Some("127.0.0.1:9".into()),
        ca_cert: Some("/nonexistent/ca.pem".into()),
        join_token: Some("t".into()),
        container_user: Some("0".into()),
        ..Default::default()
    }
    .resolve()
    .expect("config resolves");
    assert_eq!(config.container_user.uid, root.uid);
    let state = tempfile::tempdir().expect("tempdir");
    config.state_dir = state.path().join("state");
    let err = match worker::start(config.clone()).await {
        Ok(_) => panic!("a worker started with root containers"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("--allow-root-containers"), "{err}");
    assert!(err.contains("container_user"), "{err}");
    // With the flag, start goes on (and fails later, at the missing CA certificate).
    config.allow_root_containers = true;
    let err = match worker::start(config).await {
        Ok(_) => panic!("started without a CA certificate"),
        Err(e) => format!("{e:#}"),
    };
    assert!(!err.contains("allow-root-containers"), "{err}");
}

#[actix_rt::test]
async fn without_a_working_dir_a_container_the_worker_dir_refuses_runs_in_root() {
    if !running_as_root() {
        return;
    }
    let c = Cluster::start(&["demo"], &[]).await;
    let tmp = tempfile::tempdir().expect("tempdir");
    // The worker runs in a directory `nobody` cannot enter.
    let private = tmp.path().join("private");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let (mut worker, endpoint) = start_worker_binary(
        &c,
        "node-a",
        &tmp.path().join("state"),
        &tmp.path().join("worker.log"),
        Some(&private),
    )
    .await;
    let mut app = AppClient::login(endpoint.parse().expect("addr"), "demo", c.secret("demo")).await;
    app.subscribe().await;
    let token = app.grant(ask(ContainerType::Queueable, 200, 64)).await;
    let id = token.body.container_id;
    app.start(&token, sh("test \"$(pwd)\" = / && test \"$(id -u)\" != 0"))
        .await
        .expect("start accepted");
    let done = app
        .event("the container's end", |e| {
            e.container_id == id
                && matches!(
                    e.event,
                    ContainerEventKind::Completed { .. } | ContainerEventKind::Killed { .. }
                )
        })
        .await;
    assert_eq!(
        done.event,
        ContainerEventKind::Completed { exit_code: 0 },
        "the container ran in / as an unprivileged user"
    );
    worker.kill().await.expect("stop the worker");
    c.server.shutdown();
}

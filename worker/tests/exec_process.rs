//! Real-process tests of the container executor: exit codes, environment, errors, tree kills,
//! memory-limit kills and usage sampling, in the fallback mode and in whatever mode `detect`
//! picks on this machine. State is observed by waiting on exits or polling `/proc` with a
//! bounded number of retries, never by sleeping for an assumed time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use worker::exec::{
    ContainerLimits, DEFAULT_PATH, Enforcement, ExecError, Executor, ExecutorConfig, ExitOutcome,
    LaunchSpec,
};

/// Upper bound for anything a test waits on; reaching it is a failure, not a pass.
const PATIENCE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
const POLL_ATTEMPTS: usize = 1500;

fn config() -> ExecutorConfig {
    ExecutorConfig {
        monitor_interval: Duration::from_millis(20),
        ..ExecutorConfig::default()
    }
}

fn fallback() -> Executor {
    Executor::with_enforcement(Enforcement::RlimitAndMonitor, config())
        .expect("fallback mode always works")
}

fn detected() -> Executor {
    let executor = Executor::detect(config());
    eprintln!("detected enforcement: {:?}", executor.enforcement());
    executor
}

fn both() -> Vec<Executor> {
    vec![fallback(), detected()]
}

fn sh(script: &str) -> LaunchSpec {
    LaunchSpec {
        command: "sh".to_owned(),
        args: vec!["-c".to_owned(), script.to_owned()],
        ..LaunchSpec::default()
    }
}

fn limits(memory_mib: u64) -> ContainerLimits {
    ContainerLimits {
        cpu_millis: 1000,
        memory_mib,
    }
}

/// (state, ppid, session) of a process, or `None` when it no longer exists.
fn proc_state(pid: u32) -> Option<(char, u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some((
        fields[0].chars().next()?,
        fields[1].parse().ok()?,
        fields[3].parse().ok()?,
    ))
}

fn is_dead(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some(('Z' | 'X', _, _)))
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_owned())
        .unwrap_or_default()
}

/// Live descendants of `root` (by parent pid) plus live members of its session.
fn live_tree(root: u32) -> BTreeSet<u32> {
    let all: Vec<(u32, u32, u32)> = std::fs::read_dir("/proc")
        .expect("/proc is readable")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (state, ppid, session) = proc_state(pid)?;
            (state != 'Z').then_some((pid, ppid, session))
        })
        .collect();
    let mut tree: BTreeSet<u32> = all.iter().filter(|p| p.2 == root).map(|p| p.0).collect();
    loop {
        let grown: Vec<u32> = all
            .iter()
            .filter(|p| tree.contains(&p.1) && !tree.contains(&p.0))
            .map(|p| p.0)
            .collect();
        if grown.is_empty() {
            return tree;
        }
        tree.extend(grown);
    }
}

/// Whether the executor puts containers in cgroups.
fn uses_cgroups(executor: &Executor) -> bool {
    *executor.enforcement() != Enforcement::RlimitAndMonitor
}

/// Pids in a cgroup directory (none once it is empty).
fn cgroup_pids(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

async fn poll_until(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..POLL_ATTEMPTS {
        if condition() {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("gave up waiting for: {what}");
}

async fn wait_bounded(process: &mut worker::exec::ContainerProcess) -> ExitOutcome {
    tokio::time::timeout(PATIENCE, process.wait())
        .await
        .expect("container did not end in time")
}

#[tokio::test]
async fn exit_codes_are_reported() {
    for (index, executor) in both().into_iter().enumerate() {
        let id = 100 + index as u64;
        let mut zero = executor
            .launch(id, &sh("exit 0"), limits(64))
            .await
            .expect("launch");
        assert_eq!(
            wait_bounded(&mut zero).await,
            ExitOutcome::Exited { code: 0 }
        );
        // wait is idempotent after completion.
        assert_eq!(zero.wait().await, ExitOutcome::Exited { code: 0 });
        let mut seven = executor
            .launch(id + 10, &sh("exit 7"), limits(64))
            .await
            .expect("launch");
        assert_eq!(
            wait_bounded(&mut seven).await,
            ExitOutcome::Exited { code: 7 }
        );
        let mut signaled = executor
            .launch(id + 20, &sh("kill -TERM $$"), limits(64))
            .await
            .expect("launch");
        assert_eq!(
            wait_bounded(&mut signaled).await,
            ExitOutcome::Signaled {
                signal: libc::SIGTERM
            }
        );
    }
}

#[tokio::test]
async fn container_sees_only_its_spec_env_and_defaults() {
    let logs = tempfile::tempdir().expect("tempdir");
    let executor = Executor::with_enforcement(
        Enforcement::RlimitAndMonitor,
        ExecutorConfig {
            log_dir: Some(logs.path().to_path_buf()),
            ..config()
        },
    )
    .expect("fallback");
    let work = tempfile::tempdir().expect("tempdir");
    let spec = LaunchSpec {
        command: "env".to_owned(),
        args: vec![],
        env: BTreeMap::from([("FOO".to_owned(), "bar baz".to_owned())]),
        working_dir: Some(work.path().to_path_buf()),
    };
    let mut process = executor
        .launch(42, &spec, limits(64))
        .await
        .expect("launch env");
    assert_eq!(
        wait_bounded(&mut process).await,
        ExitOutcome::Exited { code: 0 }
    );
    let printed =
        std::fs::read_to_string(logs.path().join("container-42.stdout")).expect("stdout log");
    let lines: BTreeSet<&str> = printed.lines().collect();
    let path_line = format!("PATH={DEFAULT_PATH}");
    let expected: BTreeSet<&str> = ["CONTAINER_ID=42", "FOO=bar baz", path_line.as_str()].into();
    assert_eq!(lines, expected);

    let mut pwd = executor
        .launch(
            43,
            &LaunchSpec {
                command: "pwd".to_owned(),
                working_dir: Some(work.path().to_path_buf()),
                ..LaunchSpec::default()
            },
            limits(64),
        )
        .await
        .expect("launch pwd");
    assert_eq!(
        wait_bounded(&mut pwd).await,
        ExitOutcome::Exited { code: 0 }
    );
    let printed =
        std::fs::read_to_string(logs.path().join("container-43.stdout")).expect("stdout log");
    assert_eq!(
        PathBuf::from(printed.trim())
            .canonicalize()
            .expect("printed dir exists"),
        work.path().canonicalize().expect("work dir exists")
    );
}

#[tokio::test]
async fn launch_errors_name_the_problem() {
    for executor in both() {
        let missing = LaunchSpec {
            command: "definitely-not-a-command-4711".to_owned(),
            ..LaunchSpec::default()
        };
        let err = executor
            .launch(200, &missing, limits(64))
            .await
            .unwrap_err();
        assert!(matches!(err, ExecError::CommandNotFound { .. }), "{err:?}");
        assert!(
            err.to_string().contains("definitely-not-a-command-4711"),
            "{err}"
        );

        let no_dir = LaunchSpec {
            working_dir: Some(PathBuf::from("/nonexistent/work-dir-4711")),
            ..sh("true")
        };
        let err = executor.launch(201, &no_dir, limits(64)).await.unwrap_err();
        assert!(
            matches!(err, ExecError::WorkingDirMissing { .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("/nonexistent/work-dir-4711"),
            "{err}"
        );

        // A failed launch leaves nothing behind, so the same id can be launched afterwards.
        let mut ok = executor
            .launch(200, &sh("exit 0"), limits(64))
            .await
            .expect("relaunch");
        assert_eq!(wait_bounded(&mut ok).await, ExitOutcome::Exited { code: 0 });
    }
}

#[tokio::test]
async fn kill_tree_kills_children_grandchildren_and_setsid_escapees() {
    for (index, executor) in both().into_iter().enumerate() {
        let id = 300 + index as u64;
        // Two grandchildren under a nested shell, and a child that started its own session.
        let script = r#"sh -c "sleep 1000 & sleep 1000 & wait" & setsid sleep 1000 & wait"#;
        let mut process = executor
            .launch(id, &sh(script), limits(64))
            .await
            .expect("launch");
        let leader = process.pid();
        let mut sleepers = BTreeSet::new();
        poll_until("three sleeps in the container tree", || {
            sleepers = live_tree(leader)
                .into_iter()
                .filter(|p| comm(*p) == "sleep")
                .collect();
            sleepers.len() == 3
        })
        .await;
        let escaped = sleepers
            .iter()
            .filter(|p| proc_state(**p).is_some_and(|s| s.2 != leader))
            .count();
        assert_eq!(escaped, 1, "one sleep runs in its own session");
        let everyone = live_tree(leader);

        process.kill_tree().expect("kill_tree");
        process.kill_tree().expect("kill_tree is idempotent");
        assert_eq!(
            wait_bounded(&mut process).await,
            ExitOutcome::Signaled {
                signal: libc::SIGKILL
            }
        );
        poll_until("every process of the tree is dead", || {
            everyone.iter().all(|p| is_dead(*p))
        })
        .await;
        process
            .kill_tree()
            .expect("kill_tree after exit is a no-op");
    }
}

#[tokio::test]
async fn leader_exit_ends_the_container_and_dropping_a_handle_kills_it() {
    for (index, executor) in both().into_iter().enumerate() {
        let id = 400 + index as u64;
        // The leader exits at once, leaving a background sleep behind.
        let mut process = executor
            .launch(id, &sh("sleep 1000 & exit 3"), limits(64))
            .await
            .expect("launch");
        let leader = process.pid();
        assert_eq!(
            wait_bounded(&mut process).await,
            ExitOutcome::Exited { code: 3 }
        );
        // The orphans get SIGKILL when the leader is reaped; under load they may take a moment
        // to disappear from /proc.
        poll_until("orphans of the leader were killed", || {
            live_tree(leader).is_empty()
        })
        .await;

        let dropped = executor
            .launch(id + 10, &sh("sleep 1000"), limits(64))
            .await
            .expect("launch");
        let pid = dropped.pid();
        let dir = dropped.cgroup_dir();
        drop(dropped);
        poll_until("dropped container's process is dead", || is_dead(pid)).await;
        if let Some(dir) = dir {
            // Emptied and back in the pool (removed only with the executor).
            poll_until("dropped container's cgroup is idle again", || {
                cgroup_pids(&dir).is_empty() && executor.idle_cgroups() > 0
            })
            .await;
        }
    }
}

/// The shell keeps the output of the command substitution (100 MiB of 'x') in its own memory
/// and then sleeps, so its RSS stays above the limit until something kills it.
const HOLD_100_MIB: &str = r#"x=$(head -c 100M /dev/zero | tr "\0" x); sleep 1000"#;

#[tokio::test]
async fn memory_over_limit_kills_the_tree_in_fallback_mode() {
    let executor = fallback();
    let mut process = executor
        .launch(500, &sh(HOLD_100_MIB), limits(32))
        .await
        .expect("launch");
    match wait_bounded(&mut process).await {
        ExitOutcome::KilledForMemory {
            used_mib,
            limit_mib,
        } => {
            assert_eq!(limit_mib, 32);
            assert!(used_mib > 32, "used {used_mib} MiB");
        }
        other => panic!("expected a memory kill, got {other:?}"),
    }
}

#[tokio::test]
async fn memory_over_limit_kills_the_tree_in_detected_mode() {
    let executor = detected();
    let mut process = executor
        .launch(501, &sh(HOLD_100_MIB), limits(32))
        .await
        .expect("launch");
    let leader = process.pid();
    match wait_bounded(&mut process).await {
        ExitOutcome::KilledForMemory { limit_mib, .. } => assert_eq!(limit_mib, 32),
        other => panic!("expected a memory kill, got {other:?}"),
    }
    poll_until("the tree was killed", || live_tree(leader).is_empty()).await;
}

#[tokio::test]
async fn memory_under_limit_is_left_alone() {
    for (index, executor) in both().into_iter().enumerate() {
        let script = r#"x=$(head -c 8M /dev/zero | tr "\0" x); exit 3"#;
        let mut process = executor
            .launch(600 + index as u64, &sh(script), limits(128))
            .await
            .expect("launch");
        assert_eq!(
            wait_bounded(&mut process).await,
            ExitOutcome::Exited { code: 3 }
        );
    }
}

#[tokio::test]
async fn usage_sampling_sees_a_cpu_burner_and_its_memory() {
    for (index, executor) in both().into_iter().enumerate() {
        let id = 700 + index as u64;
        let mut process = executor
            .launch(id, &sh("while :; do :; done"), limits(64))
            .await
            .expect("launch");
        // Sample repeatedly (each sample averages over the time since the previous one) until
        // the burner shows up as at least 0.3 cores; bounded, so a broken sampler fails.
        let mut best = 0;
        let mut memory_mib = 0;
        let mut processes = 0;
        poll_until("a sample with >= 300 millicores", || {
            let sample = process.sample_usage().expect("sample");
            best = best.max(sample.cpu_millis);
            memory_mib = memory_mib.max(sample.memory_mib);
            processes = processes.max(sample.processes);
            best >= 300
        })
        .await;
        assert!(memory_mib > 0, "memory of the shell is visible");
        assert_eq!(processes, 1);
        process.kill_tree().expect("kill");
        assert_eq!(
            wait_bounded(&mut process).await,
            ExitOutcome::Signaled {
                signal: libc::SIGKILL
            }
        );
        let after = process.sample_usage().expect("sample after exit");
        assert_eq!((after.processes, after.cpu_millis), (0, 0));
    }
}

#[tokio::test]
async fn cgroup_mode_catches_double_forked_escapees_and_removes_its_cgroup() {
    let executor = detected();
    if !uses_cgroups(&executor) {
        eprintln!("no usable cgroups on this machine: escapee test not applicable");
        return;
    }
    // The subshell starts a sleep in a new session and exits, so the sleep is reparented away
    // from the container and is in neither its session nor its process group.
    let script = "(setsid sleep 1000 &); sleep 1000";
    let mut process = executor
        .launch(800, &sh(script), limits(64))
        .await
        .expect("launch");
    let container_dir = process.cgroup_dir().expect("a cgroup in cgroup mode");
    let leader = process.pid();
    let procs = container_dir.join("cgroup.procs");
    let mut escapee = None;
    poll_until("an escaped sleep in the container cgroup", || {
        let pids: Vec<u32> = std::fs::read_to_string(&procs)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        escapee = pids
            .into_iter()
            .find(|p| comm(*p) == "sleep" && proc_state(*p).is_some_and(|s| s.2 != leader));
        escapee.is_some()
    })
    .await;
    let escapee = escapee.expect("found above");
    process.kill_tree().expect("kill");
    assert_eq!(
        wait_bounded(&mut process).await,
        ExitOutcome::Signaled {
            signal: libc::SIGKILL
        }
    );
    poll_until("escapee is dead", || is_dead(escapee)).await;
    assert!(
        cgroup_pids(&container_dir).is_empty(),
        "container cgroup empty after wait"
    );
    assert_eq!(
        executor.idle_cgroups(),
        1,
        "the empty cgroup is back in the pool"
    );
    let roots = executor.cgroup_roots();
    drop(process);
    drop(executor);
    // The roots go with the last reference (an aborted monitor task lets its go when the
    // runtime drops it).
    poll_until("the cgroup roots are removed with the executor", || {
        roots.iter().all(|root| !root.exists())
    })
    .await;
}

#[tokio::test]
async fn cgroup_mode_holds_a_burner_to_its_cpu_quota() {
    let executor = detected();
    if !uses_cgroups(&executor) {
        eprintln!("no usable cgroups on this machine: CPU is not limited in fallback mode");
        return;
    }
    let quota = ContainerLimits {
        cpu_millis: 200,
        memory_mib: 64,
    };
    let mut process = executor
        .launch(900, &sh("while :; do :; done"), quota)
        .await
        .expect("launch");
    process.sample_usage().expect("baseline sample");
    // A measurement window, not synchronisation: the quota bounds usage from above whatever
    // the machine's speed or load, so only the upper bound is asserted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let sample = process.sample_usage().expect("sample");
    eprintln!("burner under a 200-millicore quota: {sample:?}");
    assert!(
        sample.cpu_millis <= 300,
        "burner used {} millicores under a 200-millicore quota",
        sample.cpu_millis
    );
    assert!(sample.cpu_millis > 0, "the burner ran at all");
    process.kill_tree().expect("kill");
    wait_bounded(&mut process).await;
}

/// The node-runtime actor calls the executor from an actix system (a current-thread tokio
/// runtime inside a LocalSet); launching, sampling, the memory monitor and waiting must all
/// work there.
#[actix_rt::test]
async fn works_inside_an_actix_system() {
    let executor = fallback();
    let mut process = executor
        .launch(1000, &sh(HOLD_100_MIB), limits(32))
        .await
        .expect("launch");
    process.sample_usage().expect("sample");
    assert!(matches!(
        wait_bounded(&mut process).await,
        ExitOutcome::KilledForMemory { limit_mib: 32, .. }
    ));
}

/// A container switched to an unprivileged user (a worker running as root) still joins its
/// cgroup, is still killed for memory as a tree, and really runs as that user.
#[tokio::test]
async fn an_unprivileged_container_keeps_its_cgroup_and_limits() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: switching container users needs root");
        return;
    }
    let nobody = worker::exec::user::resolve_container_user(None).expect("default user");
    for (index, enforcement) in [
        Enforcement::RlimitAndMonitor,
        detected().enforcement().clone(),
    ]
    .into_iter()
    .enumerate()
    {
        let executor = Executor::with_enforcement(
            enforcement,
            ExecutorConfig {
                run_as: Some(nobody.clone()),
                ..config()
            },
        )
        .expect("enforcement works here");
        let id = 700 + index as u64 * 10;
        // The leader checks its identity, then becomes `sleep` (so it stays in the cgroup).
        let script = format!(
            "test \"$(id -u):$(id -g)\" = {}:{} || exit 3; exec sleep 1000",
            nobody.uid, nobody.gid
        );
        let mut who = executor
            .launch(id, &sh(&script), limits(64))
            .await
            .expect("launch");
        let leader = who.pid();
        poll_until("the identity check passed", || {
            comm(leader) == "sleep" || is_dead(leader)
        })
        .await;
        assert_eq!(
            comm(leader),
            "sleep",
            "{:?}: not running as {nobody:?}",
            executor.enforcement()
        );
        if let Some(dir) = who.cgroup_dir() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            assert!(
                procs.lines().any(|l| l.trim() == leader.to_string()),
                "leader {leader} not in {}: {procs:?}",
                dir.display()
            );
        }
        who.kill_tree().expect("kill");
        assert_eq!(
            wait_bounded(&mut who).await,
            ExitOutcome::Signaled { signal: 9 }
        );
        let mut hog = executor
            .launch(id + 1, &sh(HOLD_100_MIB), limits(32))
            .await
            .expect("launch");
        let leader = hog.pid();
        match wait_bounded(&mut hog).await {
            ExitOutcome::KilledForMemory { limit_mib, .. } => assert_eq!(limit_mib, 32),
            other => panic!(
                "{:?}: expected a memory kill, got {other:?}",
                executor.enforcement()
            ),
        }
        poll_until("the tree was killed", || live_tree(leader).is_empty()).await;
    }
}

/// A container cannot fill the worker's disk through its output: each stream keeps at most
/// `log_max_bytes` (then a note), the rest is drained so the container never blocks, and what
/// was kept is whole when the end is reported.
#[tokio::test]
async fn container_output_beyond_the_log_cap_is_discarded_without_blocking_it() {
    let logs = tempfile::tempdir().expect("tempdir");
    let cap: u64 = 64 * 1024;
    let executor = Executor::with_enforcement(
        Enforcement::RlimitAndMonitor,
        ExecutorConfig {
            log_dir: Some(logs.path().to_path_buf()),
            log_max_bytes: cap,
            ..config()
        },
    )
    .expect("fallback");
    // 4 MiB of output: far more than the cap, and more than a pipe buffers, so a container
    // whose output were not drained would block here forever.
    let mut process = executor
        .launch(
            77,
            &sh("head -c 4194304 /dev/zero | tr '\\0' a; echo short-stderr >&2"),
            limits(64),
        )
        .await
        .expect("launch");
    assert_eq!(
        wait_bounded(&mut process).await,
        ExitOutcome::Exited { code: 0 }
    );
    let stdout = std::fs::read(logs.path().join("container-77.stdout")).expect("stdout log");
    let note = format!("\n[worker: output beyond {cap} bytes is discarded]\n");
    assert_eq!(stdout.len() as u64, cap + note.len() as u64);
    assert!(stdout[..cap as usize].iter().all(|b| *b == b'a'));
    assert_eq!(&stdout[cap as usize..], note.as_bytes());
    let stderr =
        std::fs::read_to_string(logs.path().join("container-77.stderr")).expect("stderr log");
    assert_eq!(stderr, "short-stderr\n", "a stream under the cap is whole");
}

/// The resource shaper resizes a running container in place: the shaped size is recorded (and
/// written as soft cgroup limits where cgroups exist), capped at the hard limits, the process
/// keeps running, and the hard memory limit stays the one it started with.
#[tokio::test]
async fn a_running_container_is_resized_without_a_restart() {
    for (index, executor) in both().into_iter().enumerate() {
        let id = 950 + index as u64;
        let mut p = executor
            .launch(id, &sh("exec sleep 30"), limits(128))
            .await
            .expect("launch");
        let pid = p.pid();
        let enforced_by = p
            .resize(ContainerLimits {
                cpu_millis: 250,
                memory_mib: 48,
            })
            .expect("resize");
        let expected = match executor.enforcement() {
            Enforcement::RlimitAndMonitor => "accounting",
            _ => "cgroup",
        };
        assert_eq!(enforced_by, expected);
        assert_eq!(
            p.shaped_limits(),
            Some(ContainerLimits {
                cpu_millis: 250,
                memory_mib: 48
            })
        );
        assert_eq!(p.limits(), limits(128));
        // Growth never passes the hard limits.
        p.resize(ContainerLimits {
            cpu_millis: 5000,
            memory_mib: 4096,
        })
        .expect("resize");
        assert_eq!(p.shaped_limits(), Some(limits(128)));
        assert!(
            p.resize(ContainerLimits {
                cpu_millis: 0,
                memory_mib: 1
            })
            .is_err()
        );
        assert_eq!(p.pid(), pid);
        assert!(proc_state(pid).is_some(), "still running after resizing");
        p.kill_tree().expect("kill");
        wait_bounded(&mut p).await;
    }
}

/// A failure in the child after clone and before exec (here exec itself: a file marked
/// executable that is no program) is a launch error naming the command, and the cgroup it had
/// is given back (idle, not leaked).
#[tokio::test]
async fn a_failed_exec_is_a_launch_error_naming_the_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bogus = dir.path().join("not-a-program");
    std::fs::write(&bogus, "no shebang, no ELF\n").expect("write");
    std::fs::set_permissions(
        &bogus,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .expect("chmod");
    for executor in both() {
        let spec = LaunchSpec {
            command: bogus.display().to_string(),
            ..LaunchSpec::default()
        };
        let err = executor.launch(1100, &spec, limits(64)).await.unwrap_err();
        assert!(matches!(err, ExecError::Spawn { .. }), "{err:?}");
        assert!(err.to_string().contains("not-a-program"), "{err}");
        if uses_cgroups(&executor) {
            assert_eq!(
                executor.idle_cgroups(),
                1,
                "the cgroup went back to the pool"
            );
        }
    }
}

/// Strings no C string can carry are refused by name before anything is created.
#[tokio::test]
async fn a_nul_byte_in_the_environment_is_refused_by_name() {
    for executor in both() {
        let mut spec = sh("exit 0");
        spec.env.insert("BAD_VAR".to_owned(), "a\0b".to_owned());
        let err = executor.launch(1200, &spec, limits(64)).await.unwrap_err();
        assert!(matches!(err, ExecError::Spawn { .. }), "{err:?}");
        assert!(err.to_string().contains("BAD_VAR"), "{err}");
        assert_eq!(executor.idle_cgroups(), 0, "no cgroup was created");
    }
}

/// The child starts with no blocked signal and SIGPIPE at its default (the Rust runtime of the
/// worker ignores it), as `std::process::Command` would leave it.
#[tokio::test]
async fn containers_start_with_default_signal_state() {
    for executor in both() {
        let script = "set -- $(grep -E '^Sig(Blk|Ign):' /proc/self/status); \
                      [ $((0x$2)) -eq 0 ] || exit 3; [ $((0x$4 & 0x1000)) -eq 0 ] || exit 4";
        let mut process = executor
            .launch(1300, &sh(script), limits(64))
            .await
            .expect("launch");
        assert_eq!(
            wait_bounded(&mut process).await,
            ExitOutcome::Exited { code: 0 },
            "3: signals blocked, 4: SIGPIPE ignored"
        );
    }
}

/// A pooled cgroup is reused by the next container with that container's limits, and what the
/// previous one left in the kernel's counters (here an OOM kill) is not blamed on it.
#[tokio::test]
async fn a_reused_cgroup_has_the_new_limits_and_a_clean_record() {
    let executor = detected();
    if !uses_cgroups(&executor) {
        eprintln!("no usable cgroups on this machine: nothing is pooled");
        return;
    }
    let mut hog = executor
        .launch(1400, &sh(HOLD_100_MIB), limits(32))
        .await
        .expect("launch");
    let first_dir = hog.cgroup_dir().expect("cgroup");
    assert!(matches!(
        wait_bounded(&mut hog).await,
        ExitOutcome::KilledForMemory { limit_mib: 32, .. }
    ));
    assert_eq!(executor.idle_cgroups(), 1);
    let mut next = executor
        .launch(1401, &sh("sleep 1000"), limits(96))
        .await
        .expect("launch");
    assert_eq!(next.cgroup_dir(), Some(first_dir.clone()), "reused");
    let limit_file = match executor.enforcement() {
        Enforcement::CgroupV2 { .. } => "memory.max",
        _ => "memory.limit_in_bytes",
    };
    let written = std::fs::read_to_string(first_dir.join(limit_file)).expect("limit file");
    assert_eq!(written.trim(), (96u64 << 20).to_string());
    next.kill_tree().expect("kill");
    assert_eq!(
        wait_bounded(&mut next).await,
        ExitOutcome::Signaled {
            signal: libc::SIGKILL
        },
        "the earlier OOM kill is not reported again"
    );
}

/// The path of `pid`'s cgroup in the v1 hierarchy holding `controller`, or in the v2 unified
/// hierarchy for `None` (`/proc/PID/cgroup` lines are `ID:CONTROLLERS:PATH`; v2's is `0::PATH`).
fn cgroup_path_of(pid: u32, controller: Option<&str>) -> Option<String> {
    let lines = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    lines.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let wanted = match controller {
            Some(c) => controllers.split(',').any(|have| have == c),
            None => id == "0" && controllers.is_empty(),
        };
        wanted.then(|| path.to_owned())
    })
}

/// A container joins its cgroups by moving its own (only) thread (v1 `tasks`, which spares the
/// global lock a `cgroup.procs` write takes: docs/benchmarks.md §1): its leader and the
/// processes it forks afterwards must all be in the container's memory and cpu cgroups.
#[tokio::test]
async fn a_container_and_what_it_forks_are_in_every_hierarchy_of_its_cgroup() {
    let executor = detected();
    if !uses_cgroups(&executor) {
        eprintln!("no usable cgroups on this machine: membership test not applicable");
        return;
    }
    let mut process = executor
        .launch(900, &sh("sleep 1000 & exec sleep 1000"), limits(64))
        .await
        .expect("launch");
    let leader = process.pid();
    let name = process
        .cgroup_dir()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .expect("a cgroup in cgroup mode");
    let mut forked = None;
    poll_until("the leader became sleep and forked a sleep", || {
        forked = live_tree(leader).into_iter().find(|p| *p != leader);
        comm(leader) == "sleep" && forked.is_some_and(|p| comm(p) == "sleep")
    })
    .await;
    let forked = forked.expect("found above");
    let hierarchies: &[Option<&str>] = match executor.enforcement() {
        Enforcement::CgroupV1 { .. } => &[Some("memory"), Some("cpu")],
        _ => &[None],
    };
    for pid in [leader, forked] {
        for &controller in hierarchies {
            let path = cgroup_path_of(pid, controller);
            assert!(
                path.as_deref()
                    .is_some_and(|p| p.ends_with(&format!("/{name}"))),
                "pid {pid} (leader {leader}) is not in the container's {controller:?} cgroup {name}: {path:?}"
            );
        }
    }
    process.kill_tree().expect("kill");
    wait_bounded(&mut process).await;
}

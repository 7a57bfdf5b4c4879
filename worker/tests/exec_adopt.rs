//! Taking a container process back after an in-place upgrade (`Executor::adopt`), on real
//! processes: this test process plays the worker whose image changed, so the processes it
//! spawned are its children as a worker's containers are after `execve`.

use std::process::Command;
use std::time::Duration;
use worker::exec::adopt::{AdoptError, ProcessHandover};
use worker::exec::{ContainerLimits, Enforcement, Executor, ExecutorConfig, ExitOutcome};

const LIMITS: ContainerLimits = ContainerLimits {
    cpu_millis: 500,
    memory_mib: 256,
};
const TIMEOUT: Duration = Duration::from_secs(20);

fn stat_fields(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.first()?.chars().next()?, rest.get(19)?.parse().ok()?))
}

fn handover(pid: u32, start_time: u64) -> ProcessHandover {
    ProcessHandover {
        container_id: 1,
        pid,
        start_time,
        cgroups: Vec::new(),
        limits: LIMITS,
        shaped: None,
        memory_kill: None,
        pipes: Vec::new(),
    }
}

fn executor() -> Executor {
    Executor::with_enforcement(Enforcement::RlimitAndMonitor, ExecutorConfig::default())
        .expect("the fallback enforcement always works")
}

/// Spawns `sh -c script` in its own session, as the executor's containers are.
fn spawn(script: &str) -> u32 {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new("/bin/sh");
    command.args(["-c", script]);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    // The std handle is dropped without waiting: the child stays unreaped, as after an exec.
    command.spawn().expect("spawn sh").id()
}

#[tokio::test]
async fn a_container_that_exited_during_the_gap_is_collected_with_its_exit_code() {
    let pid = spawn("exit 7");
    // Observable event: the process is a zombie (exited, not reaped).
    let deadline = std::time::Instant::now() + TIMEOUT;
    let start_time = loop {
        match stat_fields(pid) {
            Some(('Z', start)) => break start,
            Some(_) => {}
            None => panic!("the zombie was reaped by someone else"),
        }
        assert!(std::time::Instant::now() < deadline, "sh did not exit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let mut process = executor()
        .adopt(&handover(pid, start_time))
        .expect("a zombie child with its start time is adopted");
    let outcome = tokio::time::timeout(TIMEOUT, process.wait())
        .await
        .expect("the exit is collected");
    assert_eq!(outcome, ExitOutcome::Exited { code: 7 });
    assert!(stat_fields(pid).is_none(), "the zombie was reaped");
}

#[tokio::test]
async fn an_adopted_running_container_is_waited_for_and_killed_as_a_tree() {
    let pid = spawn("sleep 1000 & exec sleep 1000");
    let (_, start_time) = stat_fields(pid).expect("running");
    let mut process = executor()
        .adopt(&handover(pid, start_time))
        .expect("a running child is adopted");
    assert_eq!(process.pid(), pid);
    process.kill_tree().expect("kill");
    let outcome = tokio::time::timeout(TIMEOUT, process.wait())
        .await
        .expect("the killed leader is reaped");
    assert_eq!(outcome, ExitOutcome::Signaled { signal: 9 });
}

#[tokio::test]
async fn what_is_not_the_recorded_child_is_refused_by_name() {
    let executor = executor();
    // Not our child.
    let err = executor.adopt(&handover(1, 0)).unwrap_err();
    assert!(
        matches!(err, AdoptError::NotOurChild { pid: 1, .. }),
        "{err}"
    );
    // Our child, but the pid names another process (start time differs).
    let pid = spawn("exec sleep 1000");
    let (_, start_time) = stat_fields(pid).expect("running");
    let err = executor.adopt(&handover(pid, start_time + 1)).unwrap_err();
    assert!(err.to_string().contains("it is another process"), "{err}");
    // A cgroup this executor would not have made.
    let mut foreign = handover(pid, start_time);
    foreign.cgroups = vec!["/sys/fs/cgroup/elsewhere/c1".into()];
    let err = executor.adopt(&foreign).unwrap_err();
    assert!(
        err.to_string().contains("/sys/fs/cgroup/elsewhere/c1"),
        "{err}"
    );
    // A pipe that is a standard descriptor.
    let mut pipe = handover(pid, start_time);
    pipe.pipes = vec![worker::exec::adopt::HandedPipe {
        stream: worker::exec::adopt::LogStream::Stdout,
        fd: 1,
    }];
    assert!(matches!(
        executor.adopt(&pipe).unwrap_err(),
        AdoptError::Pipe { fd: 1, .. }
    ));
    // Refused ones are killed by the caller; so here.
    worker::exec::adopt::kill_unadoptable(&handover(pid, start_time));
    assert!(stat_fields(pid).is_none(), "killed and reaped");
    // A pid that is gone.
    let err = executor.adopt(&handover(pid, start_time)).unwrap_err();
    assert_eq!(err, AdoptError::Gone { pid });
}

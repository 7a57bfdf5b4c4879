//! Containers started per second by the executor alone (no network, no scheduler): N launches
//! of a program, C in flight, on a current-thread runtime like the node actor's, each a real
//! process in its own cgroup (when the machine has usable cgroups) switched to the container
//! user (when run as root). Prints JSON: rate, and the launch / wait latency percentiles.
//!
//! `cargo run --release -p worker --example spawn_bench -- N C [PROGRAM] [none|detect] [IDLE_MS]`
//!
//! IDLE_MS (default 0) leaves the executor idle that long before each launch, as between the
//! tasks of a client that runs one at a time: costs that only back-to-back starts amortise (a
//! v1 cgroup attach's RCU grace period, docs/benchmarks.md §1) show up in the launch latency.

use std::time::{Duration, Instant};

use worker::exec::{ContainerLimits, Enforcement, Executor, ExecutorConfig, LaunchSpec, user};

fn percentile(sorted: &[Duration], q: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index].as_micros()
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(2000);
    let c: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let program = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| "/bin/true".to_owned());
    let mode = args.get(4).cloned().unwrap_or_else(|| "detect".to_owned());
    let idle = Duration::from_millis(args.get(5).map(|s| s.parse()).transpose()?.unwrap_or(0));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let run_as = (user::effective_uid() == 0)
            .then(|| user::resolve_container_user(None).map_err(anyhow::Error::msg))
            .transpose()?;
        let config = ExecutorConfig {
            run_as,
            ..ExecutorConfig::default()
        };
        let executor = std::rc::Rc::new(match mode.as_str() {
            "none" => Executor::with_enforcement(Enforcement::RlimitAndMonitor, config)?,
            _ => Executor::detect(config),
        });
        let spec = LaunchSpec {
            command: program.clone(),
            ..LaunchSpec::default()
        };
        let limits = ContainerLimits {
            cpu_millis: 250,
            memory_mib: 64,
        };
        let next = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let began = Instant::now();
        let local = tokio::task::LocalSet::new();
        let mut runners = Vec::new();
        for _ in 0..c {
            let (executor, next, spec) = (executor.clone(), next.clone(), spec.clone());
            runners.push(local.spawn_local(async move {
                let mut launches = Vec::new();
                let mut waits = Vec::new();
                loop {
                    let id = next.get();
                    if id >= n {
                        return Ok::<_, anyhow::Error>((launches, waits));
                    }
                    next.set(id + 1);
                    if !idle.is_zero() {
                        tokio::time::sleep(idle).await;
                    }
                    let t0 = Instant::now();
                    let mut process = executor.launch(id as u64, &spec, limits).await?;
                    let t1 = Instant::now();
                    let outcome = process.wait().await;
                    let t2 = Instant::now();
                    anyhow::ensure!(
                        outcome == worker::exec::ExitOutcome::Exited { code: 0 },
                        "container {id}: {outcome:?}"
                    );
                    launches.push(t1 - t0);
                    waits.push(t2 - t1);
                }
            }));
        }
        let (mut launches, mut waits) = (Vec::new(), Vec::new());
        local
            .run_until(async {
                for runner in runners {
                    let (l, w) = runner.await??;
                    launches.extend(l);
                    waits.extend(w);
                }
                Ok::<_, anyhow::Error>(())
            })
            .await?;
        let wall = began.elapsed().as_secs_f64();
        launches.sort();
        waits.sort();
        println!(
            "{}",
            serde_json::json!({
                "n": n,
                "concurrency": c,
                "program": program,
                "idle_ms_before_each": idle.as_millis(),
                "mode": executor.enforcement().name(),
                "run_as_uid": executor.config().run_as.as_ref().map(|r| r.uid),
                "wall_s": wall,
                "containers_per_s": n as f64 / wall,
                "launch_us_p50": percentile(&launches, 0.5),
                "launch_us_p99": percentile(&launches, 0.99),
                "wait_us_p50": percentile(&waits, 0.5),
                "wait_us_p99": percentile(&waits, 0.99),
                "idle_cgroups": executor.idle_cgroups(),
            })
        );
        Ok(())
    })
}

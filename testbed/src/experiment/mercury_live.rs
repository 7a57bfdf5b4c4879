//! `testbed experiment mercury-live`: Mercury's comparison of §7.3 and §7.4.1 on the real
//! cluster instead of the simulator: a local cluster of real `coordinator` and `worker`
//! processes, tasks that are real processes (`testbed task`), and the same job manager
//! (`testbed load`) run once per policy, policies alternating within each round so that the
//! machine's load falls on all of them alike.
//!
//! Workloads (parameters fixed before any run; docs/experiments/mercury-live/report.md):
//! - `short` (§7.3): every task 2 s; only-G against only-Q.
//! - `hybrid` (§7.4.1's mix, its 50 s long tasks shortened to 12 s so a round takes minutes):
//!   80% of tasks 2 s, 20% 12 s; only-G, only-Q, `<10sec-70%-Q` (the paper's best) and `50%-Q`.
//!
//! The job manager is closed-loop: `concurrency` tasks in flight, twice the cluster's slots, so
//! every node has work queued behind what runs. Throughput is tasks completed per second of the
//! run; task latency runs from a task's first ask to its end, re-asks included.

use crate::load::{LoadArgs, LoadReport, LoadType, run_load};
use crate::local::{LocalArgs, LocalCluster};
use serde::Serialize;
use std::path::Path;

/// What one run of the experiment is made of.
#[derive(Clone, Debug, Serialize)]
pub struct LiveOptions {
    pub workers: usize,
    /// Per worker; with `task_cpu_millis` it makes the slots.
    pub worker_cpu_millis: u64,
    pub task_cpu_millis: u64,
    pub heartbeat_interval_ms: u64,
    pub short_ms: u64,
    pub long_ms: u64,
    pub long_fraction: f64,
    pub tasks_short: usize,
    pub tasks_hybrid: usize,
    pub rounds: usize,
    pub seed: u64,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            workers: 6,
            worker_cpu_millis: 1000,
            task_cpu_millis: 250,
            // The coordinator's default (docs/design.md); YARN's NM heartbeat is 1 s too.
            heartbeat_interval_ms: 1000,
            short_ms: 2_000,
            long_ms: 12_000,
            long_fraction: 0.2,
            tasks_short: 144,
            tasks_hybrid: 144,
            rounds: 3,
            seed: 1,
        }
    }
}

impl LiveOptions {
    pub fn slots(&self) -> usize {
        self.workers * (self.worker_cpu_millis / self.task_cpu_millis.max(1)) as usize
    }
}

/// One policy's run in one round.
#[derive(Clone, Debug, Serialize)]
pub struct LiveRun {
    pub workload: String,
    pub policy: String,
    pub round: usize,
    pub tasks_per_second: f64,
    pub task_p50_ms: f64,
    pub task_p99_ms: f64,
    pub report: LoadReport,
}

/// Mean and range of one figure over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

fn spread(values: impl Iterator<Item = f64>) -> Spread {
    let v: Vec<f64> = values.collect();
    let n = v.len().max(1) as f64;
    Spread {
        mean: v.iter().sum::<f64>() / n,
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }
}

/// One policy over all rounds.
#[derive(Clone, Debug, Serialize)]
pub struct PolicySummary {
    pub workload: String,
    pub policy: String,
    pub tasks_per_second: Spread,
    pub task_p50_ms: Spread,
    pub task_p99_ms: Spread,
    pub killed: u64,
    pub shed: u64,
    pub preempted: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LiveHeadline {
    pub claim: String,
    pub paper_percent: f64,
    /// From the mean throughputs over the rounds.
    pub ours_percent: f64,
    /// Per round (paired runs of the same round).
    pub by_round: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LiveReport {
    pub options: LiveOptions,
    pub slots: usize,
    pub concurrency: usize,
    pub runs: Vec<LiveRun>,
    pub summary: Vec<PolicySummary>,
    pub headline: Vec<LiveHeadline>,
    pub wall_s: f64,
}

const WORKLOADS: [(&str, &[&str]); 2] = [
    ("short", &["only-G", "only-Q"]),
    ("hybrid", &["only-G", "only-Q", "<10sec-70%-Q", "50%-Q"]),
];

/// Run every workload and policy for `options.rounds` rounds on one local cluster.
pub fn run(options: &LiveOptions, progress: bool) -> anyhow::Result<LiveReport> {
    let began = std::time::Instant::now();
    anyhow::ensure!(options.slots() > 0, "the workers have no slot for a task");
    let mut cluster = LocalCluster::start(&LocalArgs {
        workers: options.workers,
        cpu_millis: options.worker_cpu_millis,
        memory_mib: 4096,
        heartbeat_interval_ms: options.heartbeat_interval_ms,
        ..LocalArgs::default()
    })?;
    let concurrency = 2 * options.slots();
    let runtime = tokio::runtime::Runtime::new()?;
    let mut runs = Vec::new();
    for round in 1..=options.rounds {
        for (workload, policies) in WORKLOADS {
            // Alternate the order each round: no policy always runs first or last.
            let mut order: Vec<&str> = policies.to_vec();
            let shift = (round - 1) % order.len();
            order.rotate_left(shift);
            for policy in order {
                let (tasks, long_fraction) = match workload {
                    "short" => (options.tasks_short, 0.0),
                    _ => (options.tasks_hybrid, options.long_fraction),
                };
                let args = LoadArgs {
                    endpoint: cluster.workers[0].app_endpoint.clone(),
                    ca_cert: Some(cluster.ca_cert.clone()),
                    app_id: Some(cluster.app_id.clone()),
                    app_secret: Some(cluster.app_secret.clone()),
                    credentials_file: None,
                    containers: tasks,
                    load_type: LoadType::Hybrid,
                    policy: policy.to_string(),
                    concurrency,
                    task_duration_ms: options.short_ms,
                    long_task_duration_ms: options.long_ms,
                    long_fraction,
                    task_memory_mib: 1,
                    task_cpu_fraction: 0.0,
                    cpu_millis: options.task_cpu_millis,
                    memory_mib: 32,
                    max_retries: 20,
                    seed: options.seed + round as u64,
                    allocate_only: false,
                    task_program: None,
                    json: false,
                    measure_floor: false,
                    floor_round_trips: 0,
                };
                let report = runtime.block_on(run_load(&args))?;
                if let Some((name, why)) = cluster.exited_child() {
                    anyhow::bail!("{name} exited during the experiment: {why}");
                }
                let run = LiveRun {
                    workload: workload.to_string(),
                    policy: policy.to_string(),
                    round,
                    tasks_per_second: report.completed_per_second,
                    task_p50_ms: report.task.p50_us as f64 / 1000.0,
                    task_p99_ms: report.task.p99_us as f64 / 1000.0,
                    report,
                };
                if progress {
                    eprintln!(
                        "round {round} {workload:<6} {policy:<14} {:>6.2} tasks/s  task p50 {:>8.1} ms p99 {:>8.1} ms  killed {} shed {}",
                        run.tasks_per_second,
                        run.task_p50_ms,
                        run.task_p99_ms,
                        run.report.killed,
                        run.report.shed
                    );
                }
                runs.push(run);
            }
        }
    }
    cluster.stop();
    let summary = summarise(&runs);
    let headline = headline(&runs, options.rounds);
    Ok(LiveReport {
        options: options.clone(),
        slots: options.slots(),
        concurrency,
        runs,
        summary,
        headline,
        wall_s: began.elapsed().as_secs_f64(),
    })
}

fn summarise(runs: &[LiveRun]) -> Vec<PolicySummary> {
    let mut out = Vec::new();
    for (workload, policies) in WORKLOADS {
        for policy in policies {
            let of: Vec<&LiveRun> = runs
                .iter()
                .filter(|r| r.workload == workload && r.policy == *policy)
                .collect();
            if of.is_empty() {
                continue;
            }
            out.push(PolicySummary {
                workload: workload.to_string(),
                policy: policy.to_string(),
                tasks_per_second: spread(of.iter().map(|r| r.tasks_per_second)),
                task_p50_ms: spread(of.iter().map(|r| r.task_p50_ms)),
                task_p99_ms: spread(of.iter().map(|r| r.task_p99_ms)),
                killed: of.iter().map(|r| r.report.killed).sum(),
                shed: of.iter().map(|r| r.report.shed).sum(),
                preempted: of.iter().map(|r| r.report.preempted).sum(),
            });
        }
    }
    out
}

/// Throughput gain of `policy` over only-G in `workload`, per round and of the means.
fn gain(runs: &[LiveRun], rounds: usize, workload: &str, policy: &str) -> (f64, Vec<f64>) {
    let tput = |p: &str, round: Option<usize>| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|r| r.workload == workload && r.policy == p)
            .filter(|r| round.is_none_or(|n| r.round == n))
            .map(|r| r.tasks_per_second)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let percent = |ours: f64, base: f64| 100.0 * (ours / base.max(1e-9) - 1.0);
    let by_round = (1..=rounds)
        .map(|n| percent(tput(policy, Some(n)), tput("only-G", Some(n))))
        .collect();
    (percent(tput(policy, None), tput("only-G", None)), by_round)
}

fn headline(runs: &[LiveRun], rounds: usize) -> Vec<LiveHeadline> {
    [
        (
            "§7.3 only-Q vs only-G task throughput, 2 s tasks (live cluster)",
            40.0,
            "short",
            "only-Q",
        ),
        (
            "§7.4.1 <10sec-70%-Q vs only-G task throughput, hybrid mix (live cluster)",
            29.3,
            "hybrid",
            "<10sec-70%-Q",
        ),
    ]
    .into_iter()
    .map(|(claim, paper, workload, policy)| {
        let (ours, by_round) = gain(runs, rounds, workload, policy);
        LiveHeadline {
            claim: claim.to_string(),
            paper_percent: paper,
            ours_percent: ours,
            by_round,
        }
    })
    .collect()
}

/// `report.md` and `report.json` in `dir`.
pub fn write_report(report: &LiveReport, dir: &Path, command: &str) -> std::io::Result<()> {
    super::write_report_json(report, dir)?;
    let o = &report.options;
    let mut md = format!(
        "# Mercury on the live cluster\n\n\
         Command: `{command}` ({:.0} s wall).\n\n\
         A local cluster of {} real workers of {} millicores ({} slots of {} millicores), \
         heartbeats every {} ms, tasks that are real processes sleeping their duration, one job \
         manager (`testbed load`) with {} tasks in flight (twice the slots), {} rounds; policies \
         alternate within each round. Workloads: `short`, {} tasks of {} ms (§7.3); `hybrid`, {} \
         tasks, {:.0}% of {} ms and the rest {} ms (§7.4.1's mix with its 50 s tasks shortened).\n\n\
         ## Headline (throughput gain over only-G; positive = better)\n\n\
         | claim | paper | ours (mean) | per round |\n|---|---:|---:|---|\n",
        report.wall_s,
        o.workers,
        o.worker_cpu_millis,
        report.slots,
        o.task_cpu_millis,
        o.heartbeat_interval_ms,
        report.concurrency,
        o.rounds,
        o.tasks_short,
        o.short_ms,
        o.tasks_hybrid,
        100.0 * o.long_fraction,
        o.long_ms,
        o.short_ms,
    );
    for h in &report.headline {
        let rounds: Vec<String> = h.by_round.iter().map(|v| format!("{v:+.1}%")).collect();
        md.push_str(&format!(
            "| {} | {:+.1}% | {:+.1}% | {} |\n",
            h.claim,
            h.paper_percent,
            h.ours_percent,
            rounds.join(", ")
        ));
    }
    md.push_str(
        "\n## Per policy (mean [min, max] over the rounds)\n\n\
         | workload | policy | tasks/s | task p50 (ms) | task p99 (ms) | killed | shed | preempted |\n\
         |---|---|---|---|---|---:|---:|---:|\n",
    );
    let cell = |s: &Spread, digits: usize| {
        format!(
            "{:.*} [{:.*}, {:.*}]",
            digits, s.mean, digits, s.min, digits, s.max
        )
    };
    for p in &report.summary {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            p.workload,
            p.policy,
            cell(&p.tasks_per_second, 2),
            cell(&p.task_p50_ms, 0),
            cell(&p.task_p99_ms, 0),
            p.killed,
            p.shed,
            p.preempted
        ));
    }
    std::fs::write(dir.join("report.md"), md)
}

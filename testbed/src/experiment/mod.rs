//! Experiments that reproduce the papers' evaluations on the simulator.
//!
//! `mercury`: Mercury §7 on a simulated 256-node cluster — concurrent-jobs limit (§7.2.1), top-k
//! (§7.2.2), load shaping (§7.2.3), task duration (§7.3), and the hybrid workloads (§7.4) under
//! only-G, only-Q, 50%-Q, <5sec-Q and <10sec-70%-Q — with the paper's headline ratios next to ours.

pub mod cli;
mod svg;

use crate::sim::{self, GuaranteedPlacerKind, SimConfig, SimReport, Stragglers};
use crate::workload::{Arrivals, Generator};
use scheduler_core::coordinator::SheddingPolicy;
use scheduler_core::hybrid_gq::HybridGq;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Options shared by experiments.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExperimentOptions {
    pub seed: u64,
    /// Simulated seconds per configuration (Mercury: 30-minute runs).
    pub duration_s: u64,
    /// Worker threads running configurations side by side (results do not depend on it).
    pub threads: usize,
    /// Container launch overhead added to every task (0 = pure scheduling model).
    pub task_launch_overhead_ms: u64,
    pub progress: bool,
}

/// One configuration of an experiment and its outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigurationResult {
    /// Paper section / figure the configuration belongs to, e.g. "7.2.2 top-k".
    pub group: String,
    /// Configuration name as in the paper, e.g. "only-Q k=50".
    pub name: String,
    pub report: SimReport,
}

/// A headline number of the paper next to ours.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadlineRatio {
    pub claim: String,
    /// The paper's relative improvement in percent.
    pub paper_percent: f64,
    /// Ours from this run, in percent.
    pub ours_percent: f64,
}

/// The full experiment output.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExperimentReport {
    pub experiment: String,
    pub seed: u64,
    pub options: ExperimentOptions,
    pub configurations: Vec<ConfigurationResult>,
    pub headline: Vec<HeadlineRatio>,
    pub wall_s: f64,
}

struct Planned {
    group: &'static str,
    name: String,
    config: SimConfig,
    generator: Generator,
}

/// Mercury's settings after §7.2 (used for §7.3 and §7.4): k = 50, shedding at avg+2σ with
/// queue reordering.
fn tuned(mut c: SimConfig) -> SimConfig {
    c.shedding = SheddingPolicy::MeanPlusSigma { n: 2.0 };
    c.reorder_by_job_submit_time = true;
    c
}

fn plan(options: &ExperimentOptions) -> Vec<Planned> {
    let policy = |s: &str| -> HybridGq { s.parse().expect("paper policy names parse") };
    let base = |p: &str| {
        let mut c = SimConfig::mercury_cluster(options.seed, policy(p));
        c.duration_ms = Some(options.duration_s * 1000);
        c.warmup_ms = (options.duration_s * 1000 / 30).min(60_000);
        c.task_launch_overhead_ms = options.task_launch_overhead_ms;
        c.check_invariants = false;
        c
    };
    let mut out = Vec::new();
    let micro = Generator::Microbenchmark;
    // §7.2.1: concurrent-jobs limit.
    out.push(Planned {
        group: "7.2.1 concurrent jobs",
        name: "only-G".into(),
        config: base("only-G"),
        generator: micro.clone(),
    });
    for limit in [100, 150, 200] {
        let mut c = base("only-Q");
        c.max_concurrent_jobs = limit;
        c.job_manager_hosts = limit;
        out.push(Planned {
            group: "7.2.1 concurrent jobs",
            name: format!("only-Q {limit} jobs"),
            config: c,
            generator: micro.clone(),
        });
    }
    // §7.2.2: top-k.
    for k in [20, 50, 100] {
        let mut c = base("only-Q");
        c.top_k = k;
        out.push(Planned {
            group: "7.2.2 top-k",
            name: format!("only-Q k={k}"),
            config: c,
            generator: micro.clone(),
        });
    }
    // §7.2.3: load shaping with straggler nodes whose tasks run 3x longer than estimated.
    let stragglers = Some(Stragglers {
        fraction: 0.05,
        slowdown: 3.0,
    });
    let shaping: [(&str, &str, SheddingPolicy, bool); 5] = [
        ("only-G", "only-G", SheddingPolicy::Off, false),
        ("only-Q", "only-Q", SheddingPolicy::Off, false),
        (
            "only-Q/avg+σ",
            "only-Q",
            SheddingPolicy::MeanPlusSigma { n: 1.0 },
            false,
        ),
        (
            "only-Q/avg+2σ",
            "only-Q",
            SheddingPolicy::MeanPlusSigma { n: 2.0 },
            false,
        ),
        (
            "only-Q/avg+2σ/reorder",
            "only-Q",
            SheddingPolicy::MeanPlusSigma { n: 2.0 },
            true,
        ),
    ];
    for (name, p, shedding, reorder) in shaping {
        let mut c = base(p);
        c.stragglers = stragglers;
        c.shedding = shedding;
        c.reorder_by_job_submit_time = reorder;
        out.push(Planned {
            group: "7.2.3 load shaping",
            name: name.into(),
            config: c,
            generator: micro.clone(),
        });
    }
    // §7.3: task duration.
    for secs in [2u64, 10, 20] {
        for p in ["only-G", "only-Q"] {
            out.push(Planned {
                group: "7.3 task duration",
                name: format!("{p} {secs}s"),
                config: tuned(base(p)),
                generator: Generator::FixedDuration {
                    task_ms: secs * 1000,
                },
            });
        }
    }
    // §7.4: hybrid workloads.
    for (group, generator) in [
        ("7.4.1 synthetic hybrid", Generator::SyntheticHybrid),
        ("7.4.2 production-like", Generator::ProductionLike),
    ] {
        for p in ["only-G", "only-Q", "50%-Q", "<5sec-Q", "<10sec-70%-Q"] {
            out.push(Planned {
                group,
                name: p.into(),
                config: tuned(base(p)),
                generator: generator.clone(),
            });
        }
    }
    // Ablations: this design's two placement changes switched off, one at a time.
    let mut c = base("only-Q");
    c.view_candidates_per_k = 1;
    out.push(Planned {
        group: "ablation",
        name: "only-Q k=50, view = top-k only (no own-placement accounting)".into(),
        config: c,
        generator: micro.clone(),
    });
    for (name, generator) in [
        (
            "synthetic hybrid <10sec-70%-Q, best-fit GUARANTEED placer",
            Generator::SyntheticHybrid,
        ),
        (
            "production-like <10sec-70%-Q, best-fit GUARANTEED placer",
            Generator::ProductionLike,
        ),
    ] {
        let mut c = tuned(base("<10sec-70%-Q"));
        c.guaranteed_placer = GuaranteedPlacerKind::BestFit;
        out.push(Planned {
            group: "ablation",
            name: name.into(),
            config: c,
            generator,
        });
    }
    out
}

/// Run the `mercury` experiment.
pub fn mercury(options: &ExperimentOptions) -> Result<ExperimentReport, String> {
    let started = std::time::Instant::now();
    let planned = plan(options);
    let results: Mutex<Vec<Option<Result<ConfigurationResult, String>>>> =
        Mutex::new((0..planned.len()).map(|_| None).collect());
    let next = AtomicUsize::new(0);
    let bar = options.progress.then(|| {
        let bar = indicatif::ProgressBar::new(planned.len() as u64);
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "mercury {pos}/{len} configurations [{elapsed_precise}] {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    std::thread::scope(|scope| {
        for _ in 0..options.threads.max(1) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(p) = planned.get(i) else { break };
                    // The workload seed is the experiment seed: every policy sees the same jobs.
                    let stream = p.generator.stream(options.seed, Arrivals::Backlog);
                    let outcome =
                        sim::run(p.config.clone(), &p.generator.name(), stream).map(|report| {
                            ConfigurationResult {
                                group: p.group.into(),
                                name: p.name.clone(),
                                report,
                            }
                        });
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(outcome);
                    }
                    if let Some(bar) = &bar {
                        bar.inc(1);
                        bar.set_message(format!("{} / {}", p.group, p.name));
                    }
                }
            });
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let configurations = results
        .into_inner()
        .map_err(|_| "a simulation thread panicked".to_string())?
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("configuration did not run".into())))
        .collect::<Result<Vec<_>, _>>()?;
    let headline = headline_ratios(&configurations);
    Ok(ExperimentReport {
        experiment: "mercury".into(),
        seed: options.seed,
        options: options.clone(),
        configurations,
        headline,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

fn find<'a>(results: &'a [ConfigurationResult], group: &str, name: &str) -> Option<&'a SimReport> {
    results
        .iter()
        .find(|r| r.group == group && r.name == name)
        .map(|r| &r.report)
}

fn gain(ours: f64, base: f64) -> f64 {
    if base > 0.0 {
        (ours / base - 1.0) * 100.0
    } else {
        0.0
    }
}

/// Latency improvement in percent (positive = lower latency than the baseline).
fn latency_gain(ours: f64, base: f64) -> f64 {
    if base > 0.0 {
        (1.0 - ours / base) * 100.0
    } else {
        0.0
    }
}

/// The paper's headline numbers (Mercury §7) with ours from the same run.
pub fn headline_ratios(results: &[ConfigurationResult]) -> Vec<HeadlineRatio> {
    let mut out = Vec::new();
    let mut push = |claim: &str, paper: f64, ours: Option<f64>| {
        if let Some(ours) = ours {
            out.push(HeadlineRatio {
                claim: claim.into(),
                paper_percent: paper,
                ours_percent: ours,
            });
        }
    };
    let pair = |g: &str, a: &str, b: &str| Some((find(results, g, a)?, find(results, g, b)?));
    let g1 = "7.2.1 concurrent jobs";
    let p = pair(g1, "only-Q 150 jobs", "only-G");
    push(
        "§7.2.1 task throughput, only-Q (150 jobs) vs only-G",
        38.0,
        p.map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    push(
        "§7.2.1 job throughput, only-Q (150 jobs) vs only-G",
        36.0,
        p.map(|(q, g)| gain(q.job_throughput, g.job_throughput)),
    );
    push(
        "§7.2.1 mean job latency, only-Q (150 jobs) vs only-G (lower is +)",
        30.0,
        p.map(|(q, g)| latency_gain(q.job_latency_s.mean, g.job_latency_s.mean)),
    );
    let only_g = find(results, g1, "only-G");
    let k50 = find(results, "7.2.2 top-k", "only-Q k=50");
    let p = k50.zip(only_g);
    push(
        "§7.2.2 task throughput, only-Q k=50 vs only-G",
        44.5,
        p.map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    push(
        "§7.2.2 job throughput, only-Q k=50 vs only-G",
        38.7,
        p.map(|(q, g)| gain(q.job_throughput, g.job_throughput)),
    );
    push(
        "§7.2.2 mean job latency, only-Q k=50 vs only-G (lower is +)",
        15.5,
        p.map(|(q, g)| latency_gain(q.job_latency_s.mean, g.job_latency_s.mean)),
    );
    let g3 = "7.2.3 load shaping";
    push(
        "§7.2.3 task throughput, only-Q without rebalancing vs only-G (stragglers)",
        8.5,
        pair(g3, "only-Q", "only-G").map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    let p = pair(g3, "only-Q/avg+2σ/reorder", "only-G");
    push(
        "§7.2.3 task throughput, only-Q/avg+2σ/reorder vs only-G",
        39.8,
        p.map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    push(
        "§7.2.3 job throughput, only-Q/avg+2σ/reorder vs only-G",
        35.4,
        p.map(|(q, g)| gain(q.job_throughput, g.job_throughput)),
    );
    push(
        "§7.2.3 mean job latency, only-Q/avg+2σ/reorder vs only-G (lower is +)",
        28.9,
        p.map(|(q, g)| latency_gain(q.job_latency_s.mean, g.job_latency_s.mean)),
    );
    let g4 = "7.3 task duration";
    push(
        "§7.3 task throughput, only-Q vs only-G, 2 s tasks",
        40.0,
        pair(g4, "only-Q 2s", "only-G 2s").map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    push(
        "§7.3 task throughput, only-Q vs only-G, 20 s tasks",
        14.0,
        pair(g4, "only-Q 20s", "only-G 20s")
            .map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    push(
        "§7.3 mean job latency, only-Q vs only-G, 20 s tasks (lower is +; paper: 60% worse)",
        -60.0,
        pair(g4, "only-Q 20s", "only-G 20s")
            .map(|(q, g)| latency_gain(q.job_latency_s.mean, g.job_latency_s.mean)),
    );
    let g5 = "7.4.1 synthetic hybrid";
    push(
        "§7.4.1 task throughput, <10sec-70%-Q vs only-G",
        29.3,
        pair(g5, "<10sec-70%-Q", "only-G").map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    push(
        "§7.4.1 task throughput, <10sec-70%-Q vs only-Q",
        12.9,
        pair(g5, "<10sec-70%-Q", "only-Q").map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    let g6 = "7.4.2 production-like";
    push(
        "§7.4.2 task throughput, <10sec-70%-Q vs only-G",
        26.0,
        pair(g6, "<10sec-70%-Q", "only-G").map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    let best = ["only-Q", "50%-Q", "<5sec-Q", "<10sec-70%-Q"]
        .iter()
        .filter_map(|n| find(results, g6, n))
        .map(|r| r.task_throughput)
        .fold(f64::NAN, f64::max);
    push(
        "§7.4.2 task throughput, best hybrid policy vs only-G (paper: 35%, 50%-Q)",
        35.0,
        find(results, g6, "only-G").map(|g| gain(best, g.task_throughput)),
    );
    push(
        "§7.4.2 task throughput, only-Q vs only-G (paper: almost none)",
        0.0,
        pair(g6, "only-Q", "only-G").map(|(q, g)| gain(q.task_throughput, g.task_throughput)),
    );
    out
}

/// Write `report.md`, `report.json` and one SVG chart per figure group into `dir`.
pub fn write_report(report: &ExperimentReport, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report).map_err(std::io::Error::other)?,
    )?;
    let mut md = String::new();
    md.push_str(&format!(
        "# Mercury §7 reproduced on the simulator\n\nSeed {}, {} simulated seconds per configuration, task launch overhead {} ms, wall time {:.1} s.\nEvery configuration runs the same seeded workload through the production `scheduler-core` policies (see `docs/benchmarks-sim.md` for the model).\n\n",
        report.seed, report.options.duration_s, report.options.task_launch_overhead_ms, report.wall_s
    ));
    md.push_str(
        "## Headline ratios (paper vs this run)\n\n| claim | paper | ours |\n|---|---:|---:|\n",
    );
    for h in &report.headline {
        md.push_str(&format!(
            "| {} | {:+.1}% | {:+.1}% |\n",
            h.claim, h.paper_percent, h.ours_percent
        ));
    }
    let mut groups: Vec<&str> = Vec::new();
    for c in &report.configurations {
        if !groups.contains(&c.group.as_str()) {
            groups.push(&c.group);
        }
    }
    for group in groups {
        let rows: Vec<&ConfigurationResult> = report
            .configurations
            .iter()
            .filter(|c| c.group == group)
            .collect();
        let slug: String = group
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
        let charts = [
            (
                "task-throughput",
                "Task throughput (tasks/s)",
                rows.iter()
                    .map(|r| vec![r.report.task_throughput])
                    .collect::<Vec<_>>(),
                vec!["tasks/s"],
            ),
            (
                "job-throughput",
                "Job throughput (jobs/min)",
                rows.iter().map(|r| vec![r.report.job_throughput]).collect(),
                vec!["jobs/min"],
            ),
            (
                "job-latency",
                "Job latency (s)",
                rows.iter()
                    .map(|r| {
                        let l = &r.report.job_latency_s;
                        vec![l.mean, l.p50, l.p95, l.p99]
                    })
                    .collect(),
                vec!["mean", "p50", "p95", "p99"],
            ),
        ];
        md.push_str(&format!("\n## {group}\n\n"));
        for (suffix, title, values, series) in charts {
            let file = format!("{slug}-{suffix}.svg");
            std::fs::write(
                dir.join(&file),
                svg::grouped_bars(&format!("{group}: {title}"), &names, &series, &values),
            )?;
            md.push_str(&format!("![{title}]({file})\n"));
        }
        md.push_str("\n| configuration | tasks/s | jobs/min | latency mean | p50 | p95 | p99 | Q killed | Q shed | CPU util |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for r in &rows {
            let s = &r.report;
            md.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1}% |\n",
                r.name,
                s.task_throughput,
                s.job_throughput,
                s.job_latency_s.mean,
                s.job_latency_s.p50,
                s.job_latency_s.p95,
                s.job_latency_s.p99,
                s.queueable_killed,
                s.queueable_shed,
                s.cpu_utilization * 100.0
            ));
        }
        let classes: Vec<String> = rows
            .iter()
            .flat_map(|r| r.report.job_latency_by_class_s.keys().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if classes.len() > 1 {
            md.push_str("\nMean / p95 job latency (s) per job class:\n\n| configuration |");
            for c in &classes {
                md.push_str(&format!(" {c} |"));
            }
            md.push_str("\n|---|");
            md.push_str(&"---:|".repeat(classes.len()));
            md.push('\n');
            for r in &rows {
                md.push_str(&format!("| {} |", r.name));
                for c in &classes {
                    match r.report.job_latency_by_class_s.get(c) {
                        Some(l) => md.push_str(&format!(" {:.1} / {:.1} |", l.mean, l.p95)),
                        None => md.push_str(" – |"),
                    }
                }
                md.push('\n');
            }
        }
    }
    std::fs::write(dir.join("report.md"), md)
}

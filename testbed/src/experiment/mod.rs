//! Experiments that reproduce the papers' evaluations on the simulator.
//!
//! `mercury`: Mercury §7 on a simulated 256-node cluster — concurrent-jobs limit (§7.2.1), top-k
//! (§7.2.2), load shaping (§7.2.3), task duration (§7.3), and the hybrid workloads (§7.4) under
//! only-G, only-Q, 50%-Q, <5sec-Q and <10sec-70%-Q — with the paper's headline ratios next to ours.

pub mod cli;
pub mod mercury_live;
pub mod morpheus;
pub mod pace;
mod svg;
pub mod threesigma;

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
    /// The central path's delays.
    #[serde(default)]
    pub central: CentralDelays,
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

/// A change to a planned configuration (an ablation).
type ConfigChange = fn(&mut SimConfig);

fn plan(options: &ExperimentOptions) -> Vec<Planned> {
    let policy = |s: &str| -> HybridGq { s.parse().expect("paper policy names parse") };
    let base = |p: &str| {
        let mut c = SimConfig::mercury_cluster(options.seed, policy(p));
        c.duration_ms = Some(options.duration_s * 1000);
        c.warmup_ms = (options.duration_s * 1000 / 30).min(60_000);
        c.task_launch_overhead_ms = options.task_launch_overhead_ms;
        c.heartbeat_interval_ms = options.central.heartbeat_interval_ms;
        c.delays.guaranteed_grant_ms = options.central.guaranteed_grant_ms;
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
    // The GUARANTEED placer, and the return of held QUEUEABLE work (off: Mercury as published,
    // queued QUEUEABLE work waits behind GUARANTEED work however long).
    let hybrid_ablations: [(&str, ConfigChange); 2] = [
        ("best-fit GUARANTEED placer", |c| {
            c.guaranteed_placer = GuaranteedPlacerKind::BestFit
        }),
        ("held QUEUEABLE work kept (no re-placement)", |c| {
            c.return_held_queueable = false
        }),
    ];
    for (change, adjust) in hybrid_ablations {
        for (workload, generator) in [
            ("synthetic hybrid", Generator::SyntheticHybrid),
            ("production-like", Generator::ProductionLike),
        ] {
            let mut c = tuned(base("<10sec-70%-Q"));
            adjust(&mut c);
            out.push(Planned {
                group: "ablation",
                name: format!("{workload} <10sec-70%-Q, {change}"),
                config: c,
                generator,
            });
        }
    }
    out
}

/// Run the `mercury` experiment.
pub fn mercury(options: &ExperimentOptions) -> Result<ExperimentReport, String> {
    let started = std::time::Instant::now();
    let configurations = run_planned(options, plan(options))?;
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

/// Run planned configurations side by side on `options.threads` threads.
fn run_planned(
    options: &ExperimentOptions,
    planned: Vec<Planned>,
) -> Result<Vec<ConfigurationResult>, String> {
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
    Ok(configurations)
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
/// A chart of a group: file suffix, title, values per configuration, series names.
type GroupChart<'a> = (&'a str, &'a str, Vec<Vec<f64>>, Vec<&'a str>);

/// One workload group's charts: a heading, then each chart written as an SVG beside the report
/// (`{slug}-{suffix}.svg`) and linked from it.
fn write_group_charts<const N: usize>(
    md: &mut String,
    dir: &Path,
    group: &str,
    slug: &str,
    names: &[String],
    charts: [GroupChart<'_>; N],
) -> std::io::Result<()> {
    md.push_str(&format!("\n## {group}\n\n"));
    for (suffix, title, values, series) in charts {
        let file = format!("{slug}-{suffix}.svg");
        std::fs::write(
            dir.join(&file),
            svg::grouped_bars(&format!("{group}: {title}"), names, &series, &values),
        )?;
        md.push_str(&format!("![{title}]({file})\n"));
    }
    Ok(())
}

/// Create `dir` and write `report` as `dir/report.json` (every experiment's machine-readable
/// report, headline included).
pub fn write_report_json<T: Serialize>(report: &T, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report).map_err(std::io::Error::other)?,
    )
}

pub fn write_report(report: &ExperimentReport, dir: &Path) -> std::io::Result<()> {
    write_report_json(report, dir)?;
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
        write_group_charts(&mut md, dir, group, &slug, &names, charts)?;
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

/// The central path's delays of a run (docs/experiments/mercury/parameters.md: fixed before the
/// runs, and varied in the sensitivity table instead of being picked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CentralDelays {
    /// Node heartbeat interval; the YARN-like central scheduler allocates only on heartbeats
    /// (Mercury §7.1: 3 s; YARN's default: 1 s).
    pub heartbeat_interval_ms: u64,
    /// Guarantor → job manager grant delay (half a 1-s AM–RM heartbeat on average).
    pub guaranteed_grant_ms: u64,
}

impl Default for CentralDelays {
    fn default() -> Self {
        CentralDelays {
            heartbeat_interval_ms: 3_000,
            guaranteed_grant_ms: 500,
        }
    }
}

/// The settings of the sensitivity table besides the default one (parameters.md).
pub const SENSITIVITY_DELAYS: [CentralDelays; 3] = [
    CentralDelays {
        heartbeat_interval_ms: 3_000,
        guaranteed_grant_ms: 0,
    },
    CentralDelays {
        heartbeat_interval_ms: 3_000,
        guaranteed_grant_ms: 1_000,
    },
    CentralDelays {
        heartbeat_interval_ms: 1_000,
        guaranteed_grant_ms: 500,
    },
];

/// The configurations the sensitivity table runs under every setting: the ones the
/// hybrid-vs-centralized claims compare.
const SENSITIVITY_CONFIGURATIONS: [(&str, &str); 7] = [
    ("7.3 task duration", "only-G 2s"),
    ("7.3 task duration", "only-Q 2s"),
    ("7.4.1 synthetic hybrid", "only-G"),
    ("7.4.1 synthetic hybrid", "<10sec-70%-Q"),
    ("7.4.2 production-like", "only-G"),
    ("7.4.2 production-like", "50%-Q"),
    ("7.4.2 production-like", "<10sec-70%-Q"),
];

/// One headline claim over several seeds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadlineSpread {
    pub claim: String,
    pub paper_percent: f64,
    /// Ours: the mean over the seeds (the same as [`HeadlineSpread::mean`]), under the name every
    /// experiment report's headline uses, so tools read `{claim, paper_percent, ours_percent}`
    /// alike in single- and multi-seed reports.
    pub ours_percent: f64,
    /// Ours per seed, in the order of [`MultiSeedReport::seeds`].
    pub by_seed: Vec<f64>,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Sample standard deviation over the seeds.
    pub sd: f64,
}

/// A headline claim under one setting of the central path's delays.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SensitivityRow {
    pub delays: CentralDelays,
    pub duration_s: u64,
    pub spread: HeadlineSpread,
}

/// `mercury` over several seeds (the same seeds for every configuration), with the sensitivity
/// of the hybrid-vs-centralized claims to the central path's delays.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MultiSeedReport {
    pub experiment: String,
    pub seeds: Vec<u64>,
    pub options: ExperimentOptions,
    /// The command that produced it.
    pub command: String,
    /// Mean over the seeds (positive = better), as every experiment report has.
    pub headline: Vec<HeadlineRatio>,
    pub headline_spread: Vec<HeadlineSpread>,
    pub runs: Vec<ExperimentReport>,
    pub sensitivity: Vec<SensitivityRow>,
    pub wall_s: f64,
}

/// Mean, min, max and sample standard deviation.
pub fn spread(values: &[f64]) -> (f64, f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sd = if values.len() > 1 {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (mean, min, max, sd)
}

/// Combine per-seed headline lists (same claims in the same order) into spreads.
pub fn headline_spreads(per_seed: &[Vec<HeadlineRatio>]) -> Vec<HeadlineSpread> {
    let Some(first) = per_seed.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|h| {
            let by_seed: Vec<f64> = per_seed
                .iter()
                .filter_map(|hs| hs.iter().find(|x| x.claim == h.claim))
                .map(|x| x.ours_percent)
                .collect();
            let (mean, min, max, sd) = spread(&by_seed);
            HeadlineSpread {
                claim: h.claim.clone(),
                paper_percent: h.paper_percent,
                ours_percent: mean,
                by_seed,
                mean,
                min,
                max,
                sd,
            }
        })
        .collect()
}

/// Run `mercury` for every seed, then the sensitivity table (`sensitivity_duration_s` per
/// configuration; 0 skips it).
pub fn mercury_seeds(
    options: &ExperimentOptions,
    seeds: &[u64],
    sensitivity_duration_s: u64,
    command: &str,
) -> Result<MultiSeedReport, String> {
    let started = std::time::Instant::now();
    let mut runs = Vec::new();
    for &seed in seeds {
        let mut o = options.clone();
        o.seed = seed;
        runs.push(mercury(&o)?);
    }
    let headline_spread =
        headline_spreads(&runs.iter().map(|r| r.headline.clone()).collect::<Vec<_>>());
    let mut sensitivity = Vec::new();
    if sensitivity_duration_s > 0 {
        let mut settings = vec![options.central];
        settings.extend(SENSITIVITY_DELAYS.iter().filter(|d| **d != options.central));
        for delays in settings {
            let mut per_seed = Vec::new();
            for &seed in seeds {
                let mut o = options.clone();
                o.seed = seed;
                o.central = delays;
                o.duration_s = sensitivity_duration_s;
                let planned: Vec<Planned> = plan(&o)
                    .into_iter()
                    .filter(|p| {
                        SENSITIVITY_CONFIGURATIONS
                            .iter()
                            .any(|(g, n)| p.group == *g && p.name == *n)
                    })
                    .collect();
                let results = run_planned(&o, planned)?;
                per_seed.push(headline_ratios(&results));
            }
            for spread in headline_spreads(&per_seed) {
                sensitivity.push(SensitivityRow {
                    delays,
                    duration_s: sensitivity_duration_s,
                    spread,
                });
            }
        }
    }
    Ok(MultiSeedReport {
        experiment: "mercury".into(),
        seeds: seeds.to_vec(),
        options: options.clone(),
        command: command.to_string(),
        headline: headline_spread
            .iter()
            .map(|h| HeadlineRatio {
                claim: h.claim.clone(),
                paper_percent: h.paper_percent,
                ours_percent: h.mean,
            })
            .collect(),
        headline_spread,
        runs,
        sensitivity,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Write `report.md`, `report.json` and one SVG chart per figure group (seed means) into `dir`.
pub fn write_multi_report(report: &MultiSeedReport, dir: &Path) -> std::io::Result<()> {
    write_report_json(report, dir)?;
    let seeds: Vec<String> = report.seeds.iter().map(u64::to_string).collect();
    let mut md = String::new();
    md.push_str(&format!(
        "# Mercury §7 reproduced on the simulator\n\nSeeds {} (the same for every configuration), {} simulated seconds per configuration, task launch overhead {} ms, node heartbeat {} ms, GUARANTEED grant delay {} ms (sources: [parameters.md](parameters.md)); wall time {:.0} s.\nEvery configuration runs the same seeded workload through the production `scheduler-core` policies (see `docs/benchmarks-sim.md` for the model, [diagnosis.md](diagnosis.md) for what changed and why).\n\nProduced by:\n\n```sh\n{}\n```\n\n",
        seeds.join(", "),
        report.options.duration_s,
        report.options.task_launch_overhead_ms,
        report.options.central.heartbeat_interval_ms,
        report.options.central.guaranteed_grant_ms,
        report.wall_s,
        report.command
    ));
    md.push_str(&format!(
        "## Headline ratios (paper vs ours: mean over seeds, sample σ, range, per seed)\n\n| claim | paper | ours mean | σ | min … max | seeds {} |\n|---|---:|---:|---:|---:|---:|\n",
        seeds.join(" / ")
    ));
    for h in &report.headline_spread {
        let per: Vec<String> = h.by_seed.iter().map(|v| format!("{v:+.1}")).collect();
        md.push_str(&format!(
            "| {} | {:+.1}% | {:+.1}% | {:.1} | {:+.1} … {:+.1} | {} |\n",
            h.claim,
            h.paper_percent,
            h.mean,
            h.sd,
            h.min,
            h.max,
            per.join(" / ")
        ));
    }
    if !report.sensitivity.is_empty() {
        let mut settings: Vec<CentralDelays> = Vec::new();
        for r in &report.sensitivity {
            if !settings.contains(&r.delays) {
                settings.push(r.delays);
            }
        }
        md.push_str(&format!(
            "\n## Sensitivity to the central path's delays\n\nThe hybrid-vs-centralized claims under each setting of the node heartbeat (the YARN-like central scheduler allocates only on heartbeats) and the grant delay (RM → AM), {} simulated seconds per configuration, seeds {}; mean [min, max] over the seeds. The first column is the setting of the headline table.\n\n| claim | paper |",
            report.sensitivity[0].duration_s,
            seeds.join(", ")
        ));
        for s in &settings {
            md.push_str(&format!(
                " heartbeat {} s, grant {} ms |",
                s.heartbeat_interval_ms as f64 / 1000.0,
                s.guaranteed_grant_ms
            ));
        }
        md.push_str("\n|---|---:|");
        md.push_str(&"---:|".repeat(settings.len()));
        md.push('\n');
        let mut claims: Vec<&str> = Vec::new();
        for r in &report.sensitivity {
            if !claims.contains(&r.spread.claim.as_str()) {
                claims.push(&r.spread.claim);
            }
        }
        for claim in claims {
            let paper = report
                .sensitivity
                .iter()
                .find(|r| r.spread.claim == claim)
                .map_or(0.0, |r| r.spread.paper_percent);
            md.push_str(&format!("| {claim} | {paper:+.1}% |"));
            for s in &settings {
                match report
                    .sensitivity
                    .iter()
                    .find(|r| r.delays == *s && r.spread.claim == claim)
                {
                    Some(r) => md.push_str(&format!(
                        " {:+.1}% [{:+.1}, {:+.1}] |",
                        r.spread.mean, r.spread.min, r.spread.max
                    )),
                    None => md.push_str(" – |"),
                }
            }
            md.push('\n');
        }
    }
    let Some(first) = report.runs.first() else {
        return std::fs::write(dir.join("report.md"), md);
    };
    let mut groups: Vec<&str> = Vec::new();
    for c in &first.configurations {
        if !groups.contains(&c.group.as_str()) {
            groups.push(&c.group);
        }
    }
    let of = |group: &str, name: &str| -> Vec<&SimReport> {
        report
            .runs
            .iter()
            .filter_map(|r| find(&r.configurations, group, name))
            .collect()
    };
    let mean = |rs: &[&SimReport], f: &dyn Fn(&SimReport) -> f64| -> f64 {
        spread(&rs.iter().map(|r| f(r)).collect::<Vec<_>>()).0
    };
    for group in groups {
        let names: Vec<String> = first
            .configurations
            .iter()
            .filter(|c| c.group == group)
            .map(|c| c.name.clone())
            .collect();
        let rows: Vec<Vec<&SimReport>> = names.iter().map(|n| of(group, n)).collect();
        let slug: String = group
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let charts = [
            (
                "task-throughput",
                "Task throughput (tasks/s, seed mean)",
                rows.iter()
                    .map(|r| vec![mean(r, &|s| s.task_throughput)])
                    .collect::<Vec<_>>(),
                vec!["tasks/s"],
            ),
            (
                "job-throughput",
                "Job throughput (jobs/min, seed mean)",
                rows.iter()
                    .map(|r| vec![mean(r, &|s| s.job_throughput)])
                    .collect(),
                vec!["jobs/min"],
            ),
            (
                "job-latency",
                "Job latency (s, seed mean)",
                rows.iter()
                    .map(|r| {
                        vec![
                            mean(r, &|s| s.job_latency_s.mean),
                            mean(r, &|s| s.job_latency_s.p50),
                            mean(r, &|s| s.job_latency_s.p95),
                            mean(r, &|s| s.job_latency_s.p99),
                        ]
                    })
                    .collect(),
                vec!["mean", "p50", "p95", "p99"],
            ),
        ];
        write_group_charts(&mut md, dir, group, &slug, &names, charts)?;
        md.push_str("\nMeans over the seeds (tasks/s also with its sample σ):\n\n| configuration | tasks/s | σ | jobs/min | latency mean | p50 | p95 | p99 | Q killed | Q shed | CPU util |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (name, r) in names.iter().zip(&rows) {
            let tput = spread(&r.iter().map(|s| s.task_throughput).collect::<Vec<_>>());
            md.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.1}% |\n",
                name,
                tput.0,
                tput.3,
                mean(r, &|s| s.job_throughput),
                mean(r, &|s| s.job_latency_s.mean),
                mean(r, &|s| s.job_latency_s.p50),
                mean(r, &|s| s.job_latency_s.p95),
                mean(r, &|s| s.job_latency_s.p99),
                mean(r, &|s| s.queueable_killed as f64),
                mean(r, &|s| s.queueable_shed as f64),
                mean(r, &|s| s.cpu_utilization) * 100.0
            ));
        }
        let classes: Vec<String> = rows
            .iter()
            .flatten()
            .flat_map(|r| r.job_latency_by_class_s.keys().cloned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if classes.len() > 1 {
            md.push_str(
                "\nMean / p95 job latency (s) per job class (seed means):\n\n| configuration |",
            );
            for c in &classes {
                md.push_str(&format!(" {c} |"));
            }
            md.push_str("\n|---|");
            md.push_str(&"---:|".repeat(classes.len()));
            md.push('\n');
            for (name, r) in names.iter().zip(&rows) {
                md.push_str(&format!("| {name} |"));
                for c in &classes {
                    let with: Vec<&&SimReport> = r
                        .iter()
                        .filter(|s| s.job_latency_by_class_s.contains_key(c))
                        .collect();
                    if with.is_empty() {
                        md.push_str(" – |");
                    } else {
                        let m = spread(
                            &with
                                .iter()
                                .map(|s| s.job_latency_by_class_s[c].mean)
                                .collect::<Vec<_>>(),
                        )
                        .0;
                        let p = spread(
                            &with
                                .iter()
                                .map(|s| s.job_latency_by_class_s[c].p95)
                                .collect::<Vec<_>>(),
                        )
                        .0;
                        md.push_str(&format!(" {m:.1} / {p:.1} |"));
                    }
                }
                md.push('\n');
            }
        }
    }
    std::fs::write(dir.join("report.md"), md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_mean_min_max_and_sample_sigma() {
        let (mean, min, max, sd) = spread(&[1.0, 2.0, 6.0]);
        assert_eq!((mean, min, max), (3.0, 1.0, 6.0));
        // Sample variance: (4 + 1 + 9) / 2 = 7.
        assert!((sd - 7f64.sqrt()).abs() < 1e-12, "{sd}");
        assert_eq!(spread(&[5.0]), (5.0, 5.0, 5.0, 0.0));
        assert_eq!(spread(&[]), (0.0, 0.0, 0.0, 0.0));
    }

    #[test]
    fn headline_spreads_line_up_claims_across_seeds() {
        let h = |claim: &str, ours: f64| HeadlineRatio {
            claim: claim.into(),
            paper_percent: 40.0,
            ours_percent: ours,
        };
        let per_seed = vec![
            vec![h("a", 10.0), h("b", -1.0)],
            vec![h("b", -3.0), h("a", 20.0)],
            vec![h("a", 30.0), h("b", -2.0)],
        ];
        let s = headline_spreads(&per_seed);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].claim, "a");
        assert_eq!(s[0].by_seed, vec![10.0, 20.0, 30.0]);
        assert_eq!((s[0].mean, s[0].min, s[0].max), (20.0, 10.0, 30.0));
        assert_eq!(s[0].ours_percent, 20.0, "ours is the mean over the seeds");
        let json = serde_json::to_value(&s[0]).unwrap();
        assert_eq!(
            json["ours_percent"], 20.0,
            "the report's headline names it ours_percent"
        );
        assert_eq!(s[1].by_seed, vec![-1.0, -3.0, -2.0]);
        assert_eq!(s[1].paper_percent, 40.0);
    }

    #[test]
    fn the_central_delays_reach_every_planned_configuration() {
        let options = ExperimentOptions {
            seed: 3,
            duration_s: 60,
            threads: 1,
            task_launch_overhead_ms: 0,
            progress: false,
            central: CentralDelays {
                heartbeat_interval_ms: 1_000,
                guaranteed_grant_ms: 250,
            },
        };
        let planned = plan(&options);
        assert!(!planned.is_empty());
        for p in &planned {
            assert_eq!(p.config.heartbeat_interval_ms, 1_000, "{}", p.name);
            assert_eq!(p.config.delays.guaranteed_grant_ms, 250, "{}", p.name);
            assert_eq!(p.config.seed, 3);
        }
        // Every configuration of the sensitivity table exists in the plan.
        for (g, n) in SENSITIVITY_CONFIGURATIONS {
            assert!(
                planned.iter().any(|p| p.group == g && p.name == n),
                "{g} / {n}"
            );
        }
    }
}

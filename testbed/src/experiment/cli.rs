//! `testbed experiment NAME`.

use super::{
    CentralDelays, ExperimentOptions, mercury, mercury_seeds, write_multi_report, write_report,
};
use std::path::PathBuf;

/// Arguments of `testbed experiment`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExperimentArgs {
    /// Experiment name: mercury (simulator), mercury-live (real local cluster), morpheus, 3sigma
    /// or pace.
    pub name: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run every configuration with each of these seeds (comma-separated) and report the mean
    /// and spread; overrides --seed.
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<u64>,
    /// Print the full JSON report on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write report.md, report.json and SVG charts into this directory.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Simulated seconds per configuration (the paper's runs are 30 minutes).
    #[arg(long, default_value_t = 1800)]
    pub duration_s: u64,
    /// Configurations run side by side (the results do not depend on it).
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Launch overhead added to every task's container, in ms.
    #[arg(long, default_value_t = 0)]
    pub task_launch_overhead_ms: u64,
    /// Node heartbeat interval in ms (Mercury §7.1: 3000; docs/experiments/mercury/parameters.md).
    #[arg(long, default_value_t = 3_000)]
    pub heartbeat_ms: u64,
    /// GUARANTEED grant delay to the job manager in ms (half a 1-s AM–RM heartbeat).
    #[arg(long, default_value_t = 500)]
    pub grant_delay_ms: u64,
    /// With --seeds: also run the sensitivity table over the central path's delays, this many
    /// simulated seconds per configuration (0: skip it).
    #[arg(long, default_value_t = 0)]
    pub sensitivity_duration_s: u64,
    /// mercury-live: rounds (each runs every policy once, in alternating order).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// mercury-live: tasks per run of each workload.
    #[arg(long, default_value_t = 144)]
    pub tasks: usize,
    /// 3sigma: the Google 2011 slice (job_events/, task_events/).
    #[arg(long, default_value = "../shared/data/traces/google-2011")]
    pub trace_dir: PathBuf,
    /// 3sigma: trace (into missed-jobs.md) the first N SLO jobs per seed that 3Sigma missed and
    /// Prio met, cycle by cycle (0: none; a second, identical 3Sigma run per seed).
    #[arg(long, default_value_t = 0)]
    pub trace_missed: usize,
    /// 3sigma: simulated seconds between scheduling cycles, overriding the parameters'
    /// `cycle_interval_s` (docs/experiments/3sigma/parameters.md).
    #[arg(long)]
    pub cycle_interval_s: Option<f64>,
    /// 3sigma: 3σPredict without its online upper tail (the ablation; parameters.md).
    #[arg(long)]
    pub no_upper_tail: bool,
}

impl ExperimentArgs {
    /// `--seeds` if given, else `--seed` alone.
    pub fn seed_list(&self) -> Vec<u64> {
        if self.seeds.is_empty() {
            vec![self.seed]
        } else {
            self.seeds.clone()
        }
    }
}

/// This process's command line as a report quotes it (`testbed experiment ...`).
pub fn command_line() -> String {
    format!(
        "testbed {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    )
}

/// Run `testbed experiment`.
pub fn run(args: &ExperimentArgs) -> anyhow::Result<()> {
    if args.name == "mercury-live" {
        return mercury_live_cli(args);
    }
    if args.name == "morpheus" {
        return super::morpheus::run_cli(args);
    }
    if args.name == "3sigma" {
        return super::threesigma::run_cli(args);
    }
    if args.name == "pace" {
        return super::pace::run_cli(args);
    }
    if args.name != "mercury" {
        anyhow::bail!(
            "unknown experiment {:?}: expected mercury, mercury-live, morpheus, 3sigma or pace",
            args.name
        );
    }
    let options = ExperimentOptions {
        seed: args.seed,
        duration_s: args.duration_s,
        threads: args.threads,
        task_launch_overhead_ms: args.task_launch_overhead_ms,
        progress: true,
        central: CentralDelays {
            heartbeat_interval_ms: args.heartbeat_ms,
            guaranteed_grant_ms: args.grant_delay_ms,
        },
    };
    if !args.seeds.is_empty() {
        let command = command_line();
        let report = mercury_seeds(&options, &args.seeds, args.sensitivity_duration_s, &command)
            .map_err(|e| anyhow::anyhow!(e))?;
        return publish_report(
            &report,
            args.report.as_deref(),
            args.json,
            |r, dir| Ok(write_multi_report(r, dir)?),
            |report| {
                println!(
                    "mercury experiment, seeds {:?}, {:.1} s wall",
                    report.seeds, report.wall_s
                );
                for h in &report.headline_spread {
                    println!(
                        "  {:<90} {:>+7.1}% {:>+7.1}% [{:+.1}, {:+.1}]",
                        h.claim, h.paper_percent, h.mean, h.min, h.max
                    );
                }
                Ok(())
            },
        );
    }
    if args.sensitivity_duration_s > 0 {
        anyhow::bail!("--sensitivity-duration-s needs --seeds");
    }
    let report = mercury(&options).map_err(|e| anyhow::anyhow!(e))?;
    publish_report(
        &report,
        args.report.as_deref(),
        args.json,
        |r, dir| Ok(write_report(r, dir)?),
        |report| {
            println!(
                "mercury experiment, seed {}, {:.1} s wall",
                report.seed, report.wall_s
            );
            for c in &report.configurations {
                let s = &c.report;
                println!(
                    "  {:<24} {:<24} {:>8.1} tasks/s {:>7.2} jobs/min  latency mean {:>7.1} s p99 {:>7.1} s  killed {:>6} shed {:>6}",
                    c.group,
                    c.name,
                    s.task_throughput,
                    s.job_throughput,
                    s.job_latency_s.mean,
                    s.job_latency_s.p99,
                    s.queueable_killed,
                    s.queueable_shed
                );
            }
            println!("headline (paper vs ours):");
            for h in &report.headline {
                println!(
                    "  {:<90} {:>+7.1}% {:>+7.1}%",
                    h.claim, h.paper_percent, h.ours_percent
                );
            }
            Ok(())
        },
    )
}

/// `testbed experiment mercury-live`: the comparison on a real local cluster.
fn mercury_live_cli(args: &ExperimentArgs) -> anyhow::Result<()> {
    use super::mercury_live;
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    anyhow::ensure!(args.tasks > 0, "--tasks must be at least 1");
    let options = mercury_live::LiveOptions {
        rounds: args.rounds,
        tasks_short: args.tasks,
        tasks_hybrid: args.tasks,
        seed: args.seed,
        ..Default::default()
    };
    let report = mercury_live::run(&options, true)?;
    publish_report(
        &report,
        args.report.as_deref(),
        args.json,
        |r, dir| Ok(mercury_live::write_report(r, dir, &command_line())?),
        |report| {
            println!(
                "mercury-live, {} rounds, {:.0} s wall",
                options.rounds, report.wall_s
            );
            for h in &report.headline {
                println!(
                    "  {:<80} {:>+7.1}% {:>+7.1}%",
                    h.claim, h.paper_percent, h.ours_percent
                );
            }
            Ok(())
        },
    )
}

/// The end of every experiment command: the report is written to `--report DIR` by `write`
/// (naming its report.md on stderr), then printed: JSON with `--json`, else by `text`.
pub fn publish_report<R: serde::Serialize>(
    report: &R,
    dir: Option<&std::path::Path>,
    json: bool,
    write: impl FnOnce(&R, &std::path::Path) -> anyhow::Result<()>,
    text: impl FnOnce(&R) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Some(dir) = dir {
        write(report, dir)?;
        eprintln!("report written to {}", dir.join("report.md").display());
    }
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        Ok(())
    } else {
        text(report)
    }
}

//! `testbed sim`: replay a trace (or a generated workload) under one policy.

use super::{EstimateModel, GuaranteedAllocation, SimConfig};
use crate::traces::{TraceFormat, read_trace};
use crate::workload::{Arrivals, Generator, from_jobs};
use scheduler_core::Resources;
use scheduler_core::coordinator::SheddingPolicy;
use scheduler_core::hybrid_gq::HybridGq;
use std::path::PathBuf;

/// Arguments of `testbed sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Trace file (or directory for google-2011) to replay.
    #[arg(long, conflicts_with = "workload")]
    pub trace: Option<PathBuf>,
    /// Trace format: hawk-eagle, google-2011, swf, alibaba-2017, swim.
    #[arg(long, requires = "trace")]
    pub format: Option<TraceFormat>,
    /// Generated workload instead of a trace: microbenchmark, fixed-Ns, synthetic-hybrid,
    /// production-like.
    #[arg(long)]
    pub workload: Option<String>,
    /// Poisson job arrivals per second for a generated workload (default: a backlog).
    #[arg(long)]
    pub jobs_per_s: Option<f64>,
    #[arg(long, default_value_t = 256)]
    pub nodes: usize,
    /// Application policy: only-G, only-Q, 50%-Q, <5sec-Q, <10sec-70%-Q, hybrid:td_ms=N,pq=F.
    #[arg(long, default_value = "only-G")]
    pub policy: HybridGq,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 32_000)]
    pub node_cpu_millis: u64,
    #[arg(long, default_value_t = 131_072)]
    pub node_memory_mib: u64,
    #[arg(long, default_value_t = 50)]
    pub top_k: usize,
    /// Load shedding: off, avg+sigma, avg+2sigma, mean+N*sigma.
    #[arg(long, default_value = "off")]
    pub shedding: SheddingPolicy,
    /// Order node queues by job submit time.
    #[arg(long)]
    pub reorder: bool,
    #[arg(long, default_value_t = 3_000)]
    pub heartbeat_ms: u64,
    /// GUARANTEED allocation: heartbeat (YARN-like) or event.
    #[arg(long, default_value = "heartbeat")]
    pub guaranteed_allocation: String,
    /// GUARANTEED placer: queueable-aware (least QUEUEABLE work preempted) or best-fit.
    #[arg(long, default_value = "queueable-aware")]
    pub guaranteed_placer: super::GuaranteedPlacerKind,
    /// Disable the QUEUEABLE limit (capacity − GUARANTEED booked) sent to nodes.
    #[arg(long)]
    pub no_policing: bool,
    /// Nodes keep queued QUEUEABLE containers behind GUARANTEED work however long it holds them
    /// (Mercury as published) instead of returning them for placement elsewhere.
    #[arg(long)]
    pub keep_held_queueable: bool,
    /// Runtime estimate noise σ of a log-normal factor (0 = exact).
    #[arg(long, default_value_t = 0.0)]
    pub estimate_sigma: f64,
    /// Job managers estimate task runtimes with 3σPredict (`inference`) from the jobs finished
    /// so far, over the job's features (trace attributes such as user and job name, or the
    /// generator's recurring template), instead of knowing them.
    #[arg(long, conflicts_with = "estimate_sigma")]
    pub predict_estimates: bool,
    #[arg(long, default_value_t = 150)]
    pub max_concurrent_jobs: usize,
    #[arg(long)]
    pub job_manager_hosts: Option<usize>,
    /// Simulated seconds to stop at (default: until the trace is drained; 1800 for a backlog).
    #[arg(long)]
    pub duration_s: Option<u64>,
    #[arg(long, default_value_t = 0)]
    pub warmup_s: u64,
    #[arg(long, default_value_t = 0)]
    pub task_launch_overhead_ms: u64,
    /// Check invariants after every step (slow).
    #[arg(long)]
    pub check_invariants: bool,
    /// Skip heartbeats of idle nodes that change nothing (faster on large idle clusters; same
    /// outcome up to the order of events at the same microsecond).
    #[arg(long)]
    pub elide_idle_heartbeats: bool,
    /// Print the JSON report (otherwise a summary).
    #[arg(long)]
    pub json: bool,
    /// Also record where capacity and task time go (`sim::diagnose`) and write the report and
    /// the diagnostics as JSON to this file.
    #[arg(long)]
    pub diagnose: Option<PathBuf>,
    /// Guarantor → job manager grant delay in ms (half an AM–RM heartbeat; see
    /// docs/experiments/mercury/parameters.md).
    #[arg(long, default_value_t = 500)]
    pub grant_delay_ms: u64,
}

/// Nodes whose queues the diagnostics trace one by one (`--diagnose`): a few spread over the
/// cluster, including job-manager hosts and not.
const TRACED_NODES: [u32; 4] = [0, 1, 100, 201];

fn parse_generator(name: &str) -> anyhow::Result<Generator> {
    Ok(match name {
        "microbenchmark" => Generator::Microbenchmark,
        "synthetic-hybrid" => Generator::SyntheticHybrid,
        "production-like" => Generator::ProductionLike,
        other => {
            let secs = other
                .strip_prefix("fixed-")
                .and_then(|s| s.strip_suffix('s'))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown workload {other:?}: expected microbenchmark, fixed-Ns, synthetic-hybrid or production-like"
                    )
                })?;
            Generator::FixedDuration {
                task_ms: secs * 1000,
            }
        }
    })
}

/// Run `testbed sim`.
pub fn run(args: &SimArgs) -> anyhow::Result<()> {
    let mut config = SimConfig::mercury_cluster(args.seed, args.policy);
    config.nodes = args.nodes;
    config.node_capacity = Resources::new(args.node_cpu_millis, args.node_memory_mib);
    config.top_k = args.top_k;
    config.shedding = args.shedding;
    config.reorder_by_job_submit_time = args.reorder;
    config.heartbeat_interval_ms = args.heartbeat_ms;
    config.guaranteed_allocation = match args.guaranteed_allocation.as_str() {
        "heartbeat" => GuaranteedAllocation::OnHeartbeat,
        "event" => GuaranteedAllocation::EventDriven,
        other => {
            anyhow::bail!("unknown --guaranteed-allocation {other:?}: expected heartbeat or event")
        }
    };
    config.guaranteed_placer = args.guaranteed_placer;
    config.policing = !args.no_policing;
    config.return_held_queueable = !args.keep_held_queueable;
    if !args.estimate_sigma.is_finite() || args.estimate_sigma < 0.0 {
        anyhow::bail!(
            "--estimate-sigma must be a finite number ≥ 0, got {}",
            args.estimate_sigma
        );
    }
    config.estimate = if args.predict_estimates {
        EstimateModel::Predicted
    } else if args.estimate_sigma > 0.0 {
        EstimateModel::Noisy {
            sigma: args.estimate_sigma,
        }
    } else {
        EstimateModel::Exact
    };
    config.max_concurrent_jobs = args.max_concurrent_jobs;
    config.job_manager_hosts = args
        .job_manager_hosts
        .unwrap_or(args.max_concurrent_jobs.min(256));
    config.warmup_ms = args.warmup_s * 1000;
    config.task_launch_overhead_ms = args.task_launch_overhead_ms;
    config.delays.guaranteed_grant_ms = args.grant_delay_ms;
    config.check_invariants = args.check_invariants;
    config.elide_idle_heartbeats = args.elide_idle_heartbeats;
    config.progress = true;
    let (name, stream) = match (&args.trace, &args.workload) {
        (Some(path), _) => {
            let format = args
                .format
                .ok_or_else(|| anyhow::anyhow!("--trace needs --format"))?;
            let jobs = read_trace(path, format)?;
            config.duration_ms = args.duration_s.map(|s| s * 1000);
            (path.display().to_string(), from_jobs(jobs))
        }
        (None, Some(w)) => {
            let generator = parse_generator(w)?;
            let arrivals = match args.jobs_per_s {
                Some(r) => Arrivals::Poisson { jobs_per_s: r },
                None => Arrivals::Backlog,
            };
            config.duration_ms = Some(args.duration_s.unwrap_or(1800) * 1000);
            (generator.name(), generator.stream(args.seed, arrivals))
        }
        (None, None) => anyhow::bail!("give --trace FILE --format FMT, or --workload NAME"),
    };
    let mut sim = super::Simulation::new(config, stream).map_err(|e| anyhow::anyhow!(e))?;
    if args.diagnose.is_some() {
        sim.enable_diagnostics(&TRACED_NODES);
    }
    sim.run();
    let report = sim.report(&name);
    if let (Some(path), Some(diagnostics)) = (&args.diagnose, sim.diagnostics()) {
        let out = serde_json::json!({ "report": &report, "diagnostics": diagnostics });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {} under {} on {} nodes: {:.1} tasks/s, {:.2} jobs/min, job latency mean {:.1} s (p50 {:.1}, p95 {:.1}, p99 {:.1}); {} tasks, {} jobs; Q killed {}, shed {}; {} events in {:.2} s ({:.2} M events/s); coordinator core {:.2} µs per heartbeat",
            report.workload,
            report.simulated_s,
            report.config.policy_label,
            report.config.nodes,
            report.task_throughput,
            report.job_throughput,
            report.job_latency_s.mean,
            report.job_latency_s.p50,
            report.job_latency_s.p95,
            report.job_latency_s.p99,
            report.tasks_completed,
            report.jobs_completed,
            report.queueable_killed,
            report.queueable_shed,
            report.events,
            report.wall_s,
            report.events_per_s / 1e6,
            report.coordinator_cost.ns_per_heartbeat / 1e3
        );
    }
    Ok(())
}

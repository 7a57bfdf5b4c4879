//! `inference`: offline analysis of scheduling history (runtime prediction, SLO inference,
//! skyline LP, usage forecasting) on real traces. JSON on stdout with `--json`, tables otherwise.

mod cli;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use inference::forecast::Kernel;
use inference::skyline::{Beta, LpFormulation, RunSkyline, SkylineLpConfig, fit_skyline};
use inference::slo::{
    InferredSlo, PeriodicConfig, ProvenanceEvent, ProvenanceKind, SloConfig, SloRule, infer_slos,
};
use inference::traces::{self, SkylineRecord, YarnSkylineSource};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "inference",
    version,
    about = "Learn from cluster history: 3σPredict runtime distributions, Morpheus SLOs and skylines, Pace usage forecasts"
)]
struct Arguments {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fit the Morpheus §5 job resource model (skyline LP) to the runs of one recurring job.
    Skyline {
        #[arg(long)]
        input: PathBuf,
        /// yarn-native (Hadoop resource estimator) or jsonl ({"run": …, "skyline": [...]}).
        #[arg(long)]
        format: String,
        /// Weight of over-allocation in [0, 1].
        #[arg(long, default_value_t = 0.1)]
        alpha: f64,
        /// Weight of ε: a number, or "auto" (0.1 × optimum of a first solve without it).
        #[arg(long, default_value = "auto")]
        beta: String,
        /// yarn-native: which field gives containers: "containers" (8th field, as Hadoop reads
        /// it) or "memory" (7th field divided by --container-mb).
        #[arg(long, default_value = "containers")]
        yarn_field: String,
        #[arg(long, default_value_t = 8192.0)]
        container_mb: f64,
        /// yarn-native: time step of the skyline in seconds.
        #[arg(long, default_value_t = 5)]
        step_seconds: u64,
        /// Solver tolerance (duality gap and feasibility).
        #[arg(long, default_value_t = 1e-8)]
        tolerance: f64,
        /// Print the LP solver's iteration log.
        #[arg(long)]
        verbose_solver: bool,
        /// LP formulation: compact (default; solved by row generation), compact-all-rows (the
        /// same LP in one solve) or debt-chain (the direct transcription); all reach the same
        /// optimum.
        #[arg(long, default_value = "compact")]
        formulation: String,
        #[arg(long)]
        json: bool,
    },
    /// Replay jobs in time order, predicting each runtime from history only, then learning it.
    PredictEval {
        #[arg(long)]
        trace: PathBuf,
        /// swf, google2011 (job_events file or directory) or alibaba2017.
        #[arg(long)]
        format: String,
        /// Only the first N jobs by submit time.
        #[arg(long)]
        limit: Option<usize>,
        /// Predict without the online upper tail (distributions end at their history's
        /// widened maximum, as 3Sigma §4.1's histograms do): the ablation.
        #[arg(long)]
        no_upper_tail: bool,
        #[arg(long)]
        json: bool,
    },
    /// Find periodic jobs and infer their SLO windows.
    Slo {
        #[arg(long)]
        trace: PathBuf,
        /// google2011 (job_events file or directory) or jsonl (provenance events).
        #[arg(long)]
        format: String,
        #[arg(long, default_value_t = 5)]
        min_runs: usize,
        /// Largest MAD/median of inter-arrival times for a periodic job.
        #[arg(long, default_value_t = 0.1)]
        max_interarrival_cv: f64,
        /// Jobs listed in the human table (JSON lists all).
        #[arg(long, default_value_t = 20)]
        show: usize,
        #[arg(long)]
        json: bool,
    },
    /// The Morpheus loop's offline half: infer periodic jobs and SLO windows from provenance
    /// (JSON lines), fit each job's skyline to its past runs, apply the operator's review
    /// (sign_off / reject / override per job) and write the contracts as a JSON array for
    /// `testbed reservations submit`.
    Contracts {
        /// Provenance events, JSON lines ({"job", "instance", "event", "time"}).
        #[arg(long)]
        provenance: PathBuf,
        /// Past runs' skylines, JSON lines ({"job", "run", "skyline": [...]}), one step per
        /// plan step (the reservation's step, `--step-ms` of `testbed reservations submit`).
        #[arg(long)]
        skylines: PathBuf,
        /// The operator's review: a JSON object {"job": "sign_off" | "reject" |
        /// {"override": {"period"?, "earliest_start"?, "deadline"?, "skyline"?}}}. Jobs it does
        /// not name stay proposed (and are not reserved).
        #[arg(long)]
        review: Option<PathBuf>,
        /// Where to write the contracts.
        #[arg(long, default_value = "contracts.json")]
        out: PathBuf,
        /// Skyline LP α (weight of over-allocation).
        #[arg(long, default_value_t = 0.1)]
        alpha: f64,
        #[arg(long, default_value_t = 5)]
        min_runs: usize,
        #[arg(long, default_value_t = 0.1)]
        max_interarrival_cv: f64,
        #[arg(long)]
        json: bool,
    },
    /// Rolling-origin evaluation of a usage forecaster.
    ForecastEval {
        /// A file or a directory of per-VM files (searched recursively).
        #[arg(long)]
        input: PathBuf,
        /// bitbrains or planetlab.
        #[arg(long)]
        format: String,
        /// gp or arima.
        #[arg(long)]
        model: String,
        /// memory (default), cpu, or memory-share / cpu-share: use as a fraction of the provisioned
        /// capacity (the shaper's unit; planetlab CPU percent / 100), with the Eq. 9 coverage.
        #[arg(long, default_value = "memory")]
        metric: String,
        /// GP kernel: exponential or rbf.
        #[arg(long, default_value = "exponential")]
        kernel: String,
        /// GP history window h.
        #[arg(long, default_value_t = 10)]
        window: usize,
        /// GP number N of recent patterns.
        #[arg(long, default_value_t = 10)]
        patterns: usize,
        /// Steps ahead k.
        #[arg(long, default_value_t = 5)]
        horizon: usize,
        /// Observations per forecast call (default N + h + k, for both models).
        #[arg(long)]
        history: Option<usize>,
        /// Forecast at every `stride`-th origin.
        #[arg(long, default_value_t = 1)]
        stride: usize,
        #[arg(long)]
        max_series: Option<usize>,
        #[arg(long)]
        max_origins: Option<usize>,
        /// Re-select hyperparameters / ARIMA order every this many calls.
        #[arg(long, default_value_t = 1)]
        refit_every: usize,
        /// GP evidence maximisation: `warm` climbs the grid from the previous fit's length scale
        /// (the default, `GpConfig::warm_start`), `full` searches every grid point on every refit.
        #[arg(long, default_value = "warm")]
        gp_search: String,
        #[arg(long)]
        json: bool,
    },
}

fn print_json(value: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[derive(Serialize)]
struct SkylineOutput {
    input: String,
    format: String,
    alpha: f64,
    #[serde(flatten)]
    solution: inference::skyline::SkylineSolution,
    solve_seconds: f64,
}

fn load_skylines(
    input: &Path,
    format: &str,
    yarn_field: &str,
    container_mb: f64,
    step_seconds: u64,
) -> Result<Vec<RunSkyline>> {
    Ok(match format {
        "yarn-native" => {
            let source = match yarn_field {
                "containers" => YarnSkylineSource::Containers,
                "memory" => YarnSkylineSource::MemoryAsContainers { container_mb },
                other => bail!("unknown --yarn-field {other:?} (expected containers or memory)"),
            };
            traces::read_yarn_native_file(input)?
                .iter()
                .map(|run| run.skyline(source, step_seconds))
                .collect()
        }
        "jsonl" => traces::read_json_lines_file::<SkylineRecord>(input)?
            .into_iter()
            .map(|record| RunSkyline {
                run: record.run,
                values: record.skyline,
            })
            .collect(),
        other => bail!("unknown skyline format {other:?} (expected yarn-native or jsonl)"),
    })
}

#[derive(Serialize)]
struct SloOutput {
    trace: String,
    format: String,
    /// Distinct job templates (or logical names) in the trace.
    templates: usize,
    /// Templates with at least `min_runs` runs.
    templates_with_min_runs: usize,
    periodic_jobs: usize,
    actionable: usize,
    deadline_rules: Vec<(SloRule, usize)>,
    start_rules: Vec<(SloRule, usize)>,
    periods: Vec<(String, usize)>,
    jobs: Vec<InferredSlo>,
}

#[allow(clippy::too_many_arguments)]
fn contracts_command(
    provenance: &Path,
    skylines: &Path,
    review: Option<&Path>,
    out: &Path,
    alpha: f64,
    min_runs: usize,
    max_cv: f64,
    json: bool,
) -> Result<()> {
    let events = traces::read_json_lines_file::<ProvenanceEvent>(provenance)?;
    let runs = traces::read_json_lines_file::<SkylineRecord>(skylines)?;
    let review: std::collections::BTreeMap<String, cli::contracts::Decision> = match review {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| {
                format!(
                    "{}: expected {{\"job\": \"sign_off\" | \"reject\" | {{\"override\": {{...}}}}}}",
                    path.display()
                )
            })?
        }
        None => Default::default(),
    };
    let slo_config = SloConfig {
        periodic: PeriodicConfig {
            min_runs,
            max_interarrival_cv: max_cv,
            ..PeriodicConfig::default()
        },
        ..SloConfig::default()
    };
    let lp = SkylineLpConfig {
        alpha,
        ..SkylineLpConfig::default()
    };
    let output = cli::contracts::build(&events, &runs, &review, &slo_config, &lp)?;
    std::fs::write(out, serde_json::to_string_pretty(&output.contracts)?)
        .with_context(|| format!("writing {}", out.display()))?;
    if json {
        return print_json(&output);
    }
    println!(
        "{:<28} {:>9} {:>8} {:>9} {:>6} {:>7}  status",
        "job", "period s", "start s", "deadline", "steps", "peak"
    );
    for c in &output.contracts {
        let skyline = c.skyline.as_deref().unwrap_or(&[]);
        println!(
            "{:<28} {:>9.0} {:>8.0} {:>9.0} {:>6} {:>7}  {:?}{}",
            c.job.chars().take(28).collect::<String>(),
            c.period,
            c.earliest_start,
            c.deadline,
            skyline.len(),
            skyline.iter().max().copied().unwrap_or(0),
            c.status,
            if c.overridden.is_empty() {
                String::new()
            } else {
                format!(" (overridden: {})", c.overridden.join(", "))
            }
        );
    }
    for s in &output.skipped {
        println!("{:<28} skipped: {}", s.job, s.reason);
    }
    eprintln!(
        "{} contracts written to {}",
        output.contracts.len(),
        out.display()
    );
    Ok(())
}

fn slo_command(
    trace: &Path,
    format: &str,
    min_runs: usize,
    max_cv: f64,
    show: usize,
    json: bool,
) -> Result<()> {
    let (events, templatize) = match format {
        "google2011" => {
            let job_events = traces::read_google_job_events_path(trace)?;
            let jobs = traces::google_jobs(&job_events, false);
            let mut events = Vec::with_capacity(jobs.len() * 3);
            for job in jobs {
                let instance = job.job_id.to_string();
                for (event, time) in [
                    (ProvenanceKind::Submit, job.submit),
                    (ProvenanceKind::Start, job.schedule),
                    (ProvenanceKind::End, job.end),
                ] {
                    events.push(ProvenanceEvent {
                        job: job.logical_job_name.clone(),
                        instance: instance.clone(),
                        event,
                        time,
                    });
                }
            }
            // Google's logical job names are already templates (hashed).
            (events, false)
        }
        "jsonl" => (
            traces::read_json_lines_file::<ProvenanceEvent>(trace)?,
            true,
        ),
        other => bail!("unknown SLO trace format {other:?} (expected google2011 or jsonl)"),
    };
    let config = SloConfig {
        periodic: PeriodicConfig {
            min_runs,
            max_interarrival_cv: max_cv,
            templatize,
            ..PeriodicConfig::default()
        },
        ..SloConfig::default()
    };
    let mut runs_per_template: std::collections::HashMap<String, std::collections::HashSet<&str>> =
        std::collections::HashMap::new();
    for event in &events {
        let key = if templatize {
            inference::slo::template_name(&event.job)
        } else {
            event.job.clone()
        };
        runs_per_template
            .entry(key)
            .or_default()
            .insert(&event.instance);
    }
    let mut slos = infer_slos(&events, &config);
    slos.sort_by(|a, b| b.instances.cmp(&a.instances).then(a.job.cmp(&b.job)));
    let count_rules = |rule_of: &dyn Fn(&InferredSlo) -> SloRule| {
        let mut counts: Vec<(SloRule, usize)> = Vec::new();
        for slo in &slos {
            let rule = rule_of(slo);
            match counts.iter_mut().find(|(r, _)| *r == rule) {
                Some((_, count)) => *count += 1,
                None => counts.push((rule, 1)),
            }
        }
        counts
    };
    let mut periods: Vec<(String, usize)> = Vec::new();
    for slo in &slos {
        let label = slo
            .snapped_to
            .clone()
            .unwrap_or_else(|| "other".to_string());
        match periods.iter_mut().find(|(p, _)| *p == label) {
            Some((_, count)) => *count += 1,
            None => periods.push((label, 1)),
        }
    }
    periods.sort_by_key(|period| std::cmp::Reverse(period.1));
    let output = SloOutput {
        trace: trace.display().to_string(),
        format: format.to_string(),
        templates: runs_per_template.len(),
        templates_with_min_runs: runs_per_template
            .values()
            .filter(|runs| runs.len() >= min_runs)
            .count(),
        periodic_jobs: slos.len(),
        actionable: slos.iter().filter(|slo| slo.actionable).count(),
        deadline_rules: count_rules(&|slo| slo.deadline_rule),
        start_rules: count_rules(&|slo| slo.start_rule),
        periods,
        jobs: slos,
    };
    if json {
        return print_json(&output);
    }
    println!(
        "trace                    {} ({})",
        output.trace, output.format
    );
    println!("job templates            {}", output.templates);
    println!(
        "with >= {min_runs} runs            {}",
        output.templates_with_min_runs
    );
    println!("periodic jobs            {}", output.periodic_jobs);
    println!("actionable deadlines     {}", output.actionable);
    println!("deadline rules           {:?}", output.deadline_rules);
    println!("start rules              {:?}", output.start_rules);
    println!("periods                  {:?}", output.periods);
    println!(
        "\n{:<24} {:>5} {:>9} {:>6} {:>11} {:>11} {:>8} {:>10}",
        "job", "runs", "period_s", "snap", "start_s", "deadline_s", "cv", "actionable"
    );
    for slo in output.jobs.iter().take(show) {
        let name: String = slo.job.chars().take(24).collect();
        println!(
            "{:<24} {:>5} {:>9.0} {:>6} {:>11.1} {:>11.1} {:>8} {:>10}",
            name,
            slo.instances,
            slo.period,
            slo.snapped_to.as_deref().unwrap_or("-"),
            slo.earliest_start,
            slo.deadline,
            slo.deadline_cv
                .map_or("-".to_string(), |cv| format!("{cv:.3}")),
            slo.actionable
        );
    }
    Ok(())
}

fn main() {
    if let Err(error) = run(Arguments::parse()) {
        // `{:#}` prints the whole context chain on one line, without a backtrace.
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

fn run(arguments: Arguments) -> Result<()> {
    match arguments.command {
        Command::Skyline {
            input,
            format,
            alpha,
            beta,
            yarn_field,
            container_mb,
            step_seconds,
            tolerance,
            verbose_solver,
            formulation,
            json,
        } => {
            let formulation = match formulation.as_str() {
                "compact" => LpFormulation::Compact,
                "compact-all-rows" => LpFormulation::CompactAllRows,
                "debt-chain" => LpFormulation::DebtChain,
                other => {
                    bail!(
                        "unknown --formulation {other:?} (expected compact, compact-all-rows or debt-chain)"
                    )
                }
            };
            let beta = if beta == "auto" {
                Beta::Auto
            } else {
                Beta::Constant(beta.parse().with_context(|| {
                    format!("--beta must be a number or \"auto\", got {beta:?}")
                })?)
            };
            let runs = load_skylines(&input, &format, &yarn_field, container_mb, step_seconds)?;
            let config = SkylineLpConfig {
                alpha,
                beta,
                tolerance,
                verbose: verbose_solver,
                formulation,
            };
            let clock = Instant::now();
            let solution = fit_skyline(&runs, &config)
                .with_context(|| format!("fitting skyline to {}", input.display()))?;
            let output = SkylineOutput {
                input: input.display().to_string(),
                format,
                alpha,
                solution,
                solve_seconds: clock.elapsed().as_secs_f64(),
            };
            if json {
                return print_json(&output);
            }
            let solution = &output.solution;
            println!("input            {} ({})", output.input, output.format);
            println!("runs x steps     {} x {}", solution.runs, solution.steps);
            println!(
                "LP size          {} variables, {} constraints",
                solution.variables, solution.constraints
            );
            println!("alpha / beta     {} / {:.6}", alpha, solution.beta);
            println!(
                "objective        {:.6} (integer skyline: {:.6})",
                solution.objective, solution.objective_integer
            );
            println!("epsilon          {:.6}", solution.epsilon);
            println!(
                "over / under     {:.3} / {:.3} (integer skyline)",
                solution.penalties_integer.over_allocation,
                solution.penalties_integer.under_allocation
            );
            println!("solve time       {:.3} s", output.solve_seconds);
            println!("skyline          {:?}", solution.skyline);
        }
        Command::PredictEval {
            trace,
            format,
            limit,
            no_upper_tail,
            json,
        } => {
            let config = inference::predictor::PredictorConfig {
                upper_tail: !no_upper_tail,
                ..Default::default()
            };
            let report = cli::predict_eval::run(&trace, &format, limit, config)?;
            if json {
                return print_json(&report);
            }
            cli::predict_eval::print_table(&report);
        }
        Command::Slo {
            trace,
            format,
            min_runs,
            max_interarrival_cv,
            show,
            json,
        } => slo_command(&trace, &format, min_runs, max_interarrival_cv, show, json)?,
        Command::Contracts {
            provenance,
            skylines,
            review,
            out,
            alpha,
            min_runs,
            max_interarrival_cv,
            json,
        } => contracts_command(
            &provenance,
            &skylines,
            review.as_deref(),
            &out,
            alpha,
            min_runs,
            max_interarrival_cv,
            json,
        )?,
        Command::ForecastEval {
            input,
            format,
            model,
            metric,
            kernel,
            window,
            patterns,
            horizon,
            history,
            stride,
            max_series,
            max_origins,
            refit_every,
            gp_search,
            json,
        } => {
            let warm_start = match gp_search.as_str() {
                "warm" => true,
                "full" => false,
                other => bail!("unknown --gp-search {other:?} (expected warm or full)"),
            };
            let kernel = match kernel.as_str() {
                "exponential" => Kernel::Exponential,
                "rbf" => Kernel::Rbf,
                other => bail!("unknown --kernel {other:?} (expected exponential or rbf)"),
            };
            let options = cli::forecast_eval::ForecastOptions {
                format,
                model,
                metric,
                kernel,
                window,
                patterns,
                horizon,
                history,
                stride,
                max_series,
                max_origins,
                refit_every,
                warm_start,
            };
            let report = cli::forecast_eval::run(&input, &options)?;
            if json {
                return print_json(&report);
            }
            cli::forecast_eval::print_table(&report);
        }
    }
    Ok(())
}

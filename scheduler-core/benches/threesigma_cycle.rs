//! One 3σSched cycle (3Sigma §4.3) at 300, 1,000 and 3,000 pending jobs, each with 4
//! equivalence sets (partitions) × 16 start times, on a 256-slot cluster half full of running
//! jobs. Default config: 1 s cycle, solver limit 0.2 s (LP 85 %, MILP improvement 15 %).
//! `cargo bench -p scheduler-core --bench threesigma_cycle`; prints, per size, the cycle time
//! p50 / p99 / max (model build + LP + rounding + improvement + checks) in wall-clock time and in
//! the thread's CPU time (the machine is shared: CPU time says what the cycle costs, wall time
//! what it took), the model's size, the
//! decision / LP bound ratio (mean and min) and how decisions were reached.
//!
//! Each size runs twice on the same instances: with the LP relaxation solved by HiGHS over all
//! columns at once (`full LP`, how cycles were solved before sifting) and with
//! [`HighsSolver`]'s default (sifting for wide models). A decision's bound is the LP optimum, or
//! for a cycle whose LP its time limit stopped early (counted as "(LP stopped early)") the
//! Lagrangian bound it reports, which is larger. A second table runs consecutive cycles of a
//! live-like sequence (most jobs shared from cycle to cycle) with cold and warm-started sifting
//! (§4.3.6); a third splits the 300-job cycle into its phases.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::threesigma::{
    CycleInput, HighsSolver, LpSolution, MilpModel, MilpSolver, MipSolution, PartitionChoice,
    PartitionState, PendingJob, RunningJob, RuntimeBelief, SolveLimit, SolverError,
    ThreeSigmaConfig, ThreeSigmaScheduler, Utility, build_model, greedy, round_lp,
};
use std::collections::BTreeMap;
use std::time::Instant;

const PARTITIONS: usize = 4;
const SLOTS_PER_PARTITION: f64 = 64.0;

fn belief(rng: &mut StdRng) -> RuntimeBelief {
    // 20 quantiles of a log-normal around a median of 1–30 minutes.
    let median = rng.random_range(60.0..1800.0f64);
    let sigma = rng.random_range(0.2..1.0f64);
    let z = [
        -1.96, -1.44, -1.15, -0.93, -0.76, -0.6, -0.45, -0.32, -0.19, -0.06, 0.06, 0.19, 0.32,
        0.45, 0.6, 0.76, 0.93, 1.15, 1.44, 1.96,
    ];
    RuntimeBelief::from_runtimes(z.iter().map(|z| median * (sigma * z).exp()).collect())
        .expect("positive runtimes")
}

fn instance(seed: u64, pending: usize) -> (Vec<PartitionState>, Vec<PendingJob>, Vec<RunningJob>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let partitions = vec![
        PartitionState {
            capacity: SLOTS_PER_PARTITION,
            reserved: Vec::new(),
        };
        PARTITIONS
    ];
    let now = 10_000.0;
    let jobs = (0..pending)
        .map(|id| pending_job(&mut rng, id as u64, now))
        .collect();
    let mut running = Vec::new();
    for p in 0..PARTITIONS {
        let mut used = 0;
        while used < 32 {
            let gang = rng.random_range(1..=4);
            running.push(RunningJob {
                id: 1_000_000 + running.len() as u64,
                partition: p,
                gang,
                started: now - rng.random_range(0.0..900.0),
                belief: belief(&mut rng),
                utility: Utility::BestEffort {
                    submit: now - 1000.0,
                    value: 1.0,
                    zero_at: now + 7200.0,
                },
                preemptible: rng.random_bool(0.5),
            });
            used += gang;
        }
    }
    (partitions, jobs, running)
}

/// One pending job submitted in the 10 minutes before `now`.
fn pending_job(rng: &mut StdRng, id: u64, now: f64) -> PendingJob {
    let slo = rng.random_bool(0.5);
    let belief = belief(rng);
    let submit = now - rng.random_range(0.0..600.0);
    let utility = if slo {
        let slack = [0.2, 0.4, 0.6, 0.8][rng.random_range(0..4)];
        Utility::Slo {
            deadline: submit + belief.quantile(0.525) * (1.0 + slack),
            value: 10.0,
        }
    } else {
        Utility::BestEffort {
            submit,
            value: 1.0,
            zero_at: submit + 7200.0,
        }
    };
    let preferred = rng.random_range(0..PARTITIONS);
    PendingJob {
        id,
        submit,
        utility,
        gang: rng.random_range(1..=4),
        belief,
        choices: (0..PARTITIONS)
            .map(|p| PartitionChoice {
                partition: p,
                runtime_factor: if !slo || p != preferred { 1.0 } else { 1.5 },
            })
            .collect(),
    }
}

/// CPU time of this thread (Linux: `/proc/thread-self/schedstat`, nanoseconds on a CPU); NaN
/// elsewhere.
fn thread_cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e6)
}

/// [`HighsSolver`] with its LP relaxation answered another way (the bench's earlier behaviours);
/// the MILP improvement is HiGHS's. The warm start is not overridden, so these ignore it.
struct LpVariant {
    name: &'static str,
    relax: fn(&MilpModel, SolveLimit) -> Result<LpSolution, SolverError>,
}

impl MilpSolver for LpVariant {
    fn name(&self) -> &'static str {
        self.name
    }
    fn solve_relaxation(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        (self.relax)(model, limit)
    }
    fn improve(
        &mut self,
        model: &MilpModel,
        start: &[bool],
        limit: SolveLimit,
    ) -> Result<Option<MipSolution>, SolverError> {
        HighsSolver.improve(model, start, limit)
    }
}

/// HiGHS with the LP relaxation over every column at once (the cycle before sifting).
const FULL_LP: LpVariant = LpVariant {
    name: "highs-full-lp",
    relax: |model, limit| HighsSolver.solve_relaxation_full(model, limit),
};

/// [`HighsSolver`] as before stopped-early answers: an LP its time limit stopped is no answer
/// (the cycle falls back to the greedy).
const NO_EARLY_ANSWER: LpVariant = LpVariant {
    name: "highs-no-early-answer",
    relax: |model, limit| {
        HighsSolver.solve_relaxation(model, limit).and_then(|lp| {
            if lp.optimal {
                Ok(lp)
            } else {
                Err(SolverError::NoSolution(
                    "LP relaxation ReachedTimeLimit".into(),
                ))
            }
        })
    },
};

/// [`HighsSolver`] without the warm start: every LP sifts from the cold working set (how
/// cycles were solved before it).
const COLD_SIFTING: LpVariant = LpVariant {
    name: "highs-cold-sifting",
    relax: |model, limit| HighsSolver.solve_relaxation(model, limit),
};

fn ms_since(began: Instant) -> f64 {
    began.elapsed().as_secs_f64() * 1000.0
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load.trim());
    println!(
        "| LP | pending | cycles | p50 ms | p99 ms | max ms | CPU p50 ms | CPU p99 ms | columns | rows | nonzeros | decision / LP optimum mean (min) | methods |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    for (pending, cycles) in [(300, 100), (1000, 20), (3000, 5)] {
        timed_cycles(pending, cycles);
    }
    consecutive_cycles();
    phases();
    // Quality without the time limit: how long the LP needs, and what LP rounding and the
    // greedy fallback reach against its bound.
    println!();
    println!(
        "| pending | cycles | cycle ms (LP + rounding, 30 s limit) | LP bound | rounded / bound | greedy / bound |"
    );
    println!("|---:|---:|---|---:|---:|---:|");
    let untimed = ThreeSigmaConfig {
        cycle_s: 30.0,
        time_limit_fraction: 1.0,
        lp_share: 1.0,
        mip_improvement: false,
        ..ThreeSigmaConfig::default()
    };
    for (pending, cycles) in [(300, 3), (1000, 2)] {
        let mut times = Vec::new();
        let mut rows = Vec::new();
        for seed in 0..cycles {
            let (partitions, jobs, running) = instance(1000 + seed, pending);
            let input = CycleInput {
                now: 10_000.0,
                partitions: &partitions,
                pending: &jobs,
                running: &running,
            };
            let mut scheduler = ThreeSigmaScheduler::new("3Sigma", untimed.clone(), HighsSolver)
                .expect("valid config");
            let began = Instant::now();
            let (decision, cycle) = scheduler.cycle_with_model(&input);
            times.push(began.elapsed().as_secs_f64() * 1000.0);
            let r = &decision.record;
            let bound = r.lp_bound.unwrap_or(f64::NAN);
            let greedy_objective = cycle.model.objective(&greedy(&cycle.model, jobs.len()));
            rows.push((
                bound,
                r.rounded_objective.unwrap_or(f64::NAN) / bound,
                greedy_objective / bound,
            ));
        }
        for ((bound, rounded, greedy), ms) in rows.iter().zip(&times) {
            println!(
                "| {pending} | {cycles} | {ms:.0} | {bound:.1} | {rounded:.3} | {greedy:.3} |"
            );
        }
    }
}

/// `cycles` independent cycles of `pending` jobs under the default (wall-clock) config with
/// the full LP, sifting as before stopped-early answers (a stop at the time limit is no
/// answer) and sifting now (cold: these instances share no jobs), interleaved instance by
/// instance; one table row each.
fn timed_cycles(pending: usize, cycles: u64) {
    let config = ThreeSigmaConfig::default();
    let mut full = ThreeSigmaScheduler::new("3Sigma", config.clone(), FULL_LP).expect("valid");
    let mut before =
        ThreeSigmaScheduler::new("3Sigma", config.clone(), NO_EARLY_ANSWER).expect("valid");
    let mut now = ThreeSigmaScheduler::new("3Sigma", config, COLD_SIFTING).expect("valid");
    let mut stats: [CycleStats; 3] = Default::default();
    for seed in 0..cycles {
        let (partitions, jobs, running) = instance(seed, pending);
        let input = CycleInput {
            now: 10_000.0,
            partitions: &partitions,
            pending: &jobs,
            running: &running,
        };
        let optimum = lp_optimum(&input);
        // Independent instances (job ids repeat across seeds, the jobs do not): the LP is
        // solved cold; the warm start is measured on consecutive cycles below.
        stats[0].cycle(&mut full, &input, optimum);
        stats[1].cycle(&mut before, &input, optimum);
        stats[2].cycle(&mut now, &input, optimum);
    }
    for (label, s) in [
        "full LP",
        "sifting, stop = no answer",
        "sifting, stop = best point",
    ]
    .iter()
    .zip(&mut stats)
    {
        s.print_by_pending(label, pending);
    }
}

/// Where a 300-job cycle's time goes: model build, the LP relaxation (all columns / sifting,
/// no time limit), LP rounding and the row check, medians over 20 instances.
fn phases() {
    let unlimited = SolveLimit {
        time_s: None,
        simplex_iterations: None,
        mip_nodes: None,
    };
    let config = ThreeSigmaConfig::default();
    let mut build = Vec::new();
    let mut full = Vec::new();
    let mut full_iterations = Vec::new();
    let mut sifting = Vec::new();
    let mut sifting_iterations = Vec::new();
    let mut rounding = Vec::new();
    let mut check = Vec::new();
    let mut improvement = Vec::new();
    let mut improved = 0;
    let mut bound_gap: f64 = 0.0;
    for seed in 0..20 {
        let (partitions, jobs, running) = instance(5000 + seed, 300);
        let input = CycleInput {
            now: 10_000.0,
            partitions: &partitions,
            pending: &jobs,
            running: &running,
        };
        let began = Instant::now();
        let model = build_model(&config, &input).model;
        build.push(ms_since(began));
        let began = Instant::now();
        let all = HighsSolver
            .solve_relaxation_full(&model, unlimited)
            .expect("LP solves");
        full.push(ms_since(began));
        full_iterations.push(all.iterations as f64);
        let began = Instant::now();
        let sifted = HighsSolver
            .solve_relaxation_sifting(&model, unlimited)
            .expect("LP solves");
        sifting.push(ms_since(began));
        sifting_iterations.push(sifted.iterations as f64);
        bound_gap = bound_gap.max((all.bound - sifted.bound).abs() / all.bound.abs().max(1.0));
        let began = Instant::now();
        let chosen = round_lp(&model, jobs.len(), &sifted.values);
        rounding.push(ms_since(began));
        let began = Instant::now();
        assert!(model.violated_row(&chosen).is_none());
        check.push(ms_since(began));
        // The default config's MILP improvement (its 15 % of the 0.2-s solver time) from the
        // rounded point.
        let began = Instant::now();
        let better = HighsSolver
            .improve(&model, &chosen, SolveLimit::time(0.2 * 0.15))
            .expect("HiGHS takes the MILP");
        improvement.push(ms_since(began));
        if better.is_some_and(|b| b.objective > model.objective(&chosen) + 1e-9) {
            improved += 1;
        }
    }
    println!();
    println!(
        "| phase (300 pending, 20 instances, no time limit) | median ms | max ms | simplex iterations (median) |"
    );
    println!("|---|---:|---:|---:|");
    for (name, times, iterations) in [
        ("model build", &mut build, None),
        (
            "LP relaxation, all columns",
            &mut full,
            Some(&mut full_iterations),
        ),
        (
            "LP relaxation, sifting",
            &mut sifting,
            Some(&mut sifting_iterations),
        ),
        ("LP rounding + greedy fill", &mut rounding, None),
        ("row check", &mut check, None),
        ("MILP improvement (0.03 s limit)", &mut improvement, None),
    ] {
        times.sort_by(f64::total_cmp);
        let iterations = iterations.map_or(String::new(), |it| {
            it.sort_by(f64::total_cmp);
            format!("{:.0}", quantile(it, 0.5))
        });
        println!(
            "| {name} | {:.1} | {:.1} | {iterations} |",
            quantile(times, 0.5),
            times[times.len() - 1]
        );
    }
    println!("largest relative difference between the two LP bounds: {bound_gap:.1e}");
    println!("MILP improvement found a better point in {improved} of 20 instances");
}

/// The LP relaxation's optimum of a cycle (no limit; outside the timed cycles).
fn lp_optimum(input: &CycleInput<'_>) -> f64 {
    let unlimited = SolveLimit {
        time_s: None,
        simplex_iterations: None,
        mip_nodes: None,
    };
    let model = build_model(&ThreeSigmaConfig::default(), input).model;
    HighsSolver
        .solve_relaxation_sifting(&model, unlimited)
        .expect("LP solves")
        .bound
}

type Instance = (Vec<PartitionState>, Vec<PendingJob>, Vec<RunningJob>);

/// A live-like run: `cycles` consecutive 1-s cycles of 300 pending jobs, where each cycle
/// `churn` pending jobs (at random) leave and as many new ones arrive, and the clock moves on by
/// the cycle (running jobs' beliefs are conditioned on the later time, SLO deadlines come
/// closer). The sequence does not depend on decisions, so every solver sees the same inputs.
fn trajectory(seed: u64, cycles: usize, churn: usize) -> Vec<(f64, Instance)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut current = instance(seed, 300);
    let mut next_id = 300u64;
    let mut out = Vec::with_capacity(cycles);
    for t in 0..cycles {
        let now = 10_000.0 + t as f64;
        if t > 0 {
            for _ in 0..churn {
                let gone = rng.random_range(0..current.1.len());
                current.1.swap_remove(gone);
            }
            for _ in 0..churn {
                current.1.push(pending_job(&mut rng, next_id, now));
                next_id += 1;
            }
        }
        out.push((now, current.clone()));
    }
    out
}

/// Consecutive cycles (§4.3.6: consecutive cycles share most jobs) under the default
/// wall-clock config, cold sifting and warm-started sifting interleaved cycle by cycle on the
/// same inputs. Quality is against the LP optimum of each input, solved without a limit
/// outside the timed cycles.
fn consecutive_cycles() {
    println!();
    println!(
        "| consecutive 300-job cycles | churn / cycle | cycles | p50 ms | p99 ms | max ms | CPU p50 ms | CPU p99 ms | LP iterations p50 (p99) | decision / LP optimum mean (min) | LP stopped early | methods |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|");
    let config = ThreeSigmaConfig::default();
    for churn in [10, 30] {
        let inputs = trajectory(77 + churn as u64, 100, churn);
        let optima: Vec<f64> = inputs
            .iter()
            .map(|(now, (partitions, jobs, running))| {
                let input = CycleInput {
                    now: *now,
                    partitions,
                    pending: jobs,
                    running,
                };
                lp_optimum(&input)
            })
            .collect();
        let mut cold = CycleStats::default();
        let mut warm = CycleStats::default();
        let mut cold_scheduler =
            ThreeSigmaScheduler::new("3Sigma", config.clone(), COLD_SIFTING).expect("valid");
        let mut warm_scheduler =
            ThreeSigmaScheduler::new("3Sigma", config.clone(), HighsSolver).expect("valid");
        for ((now, (partitions, jobs, running)), optimum) in inputs.iter().zip(&optima) {
            let input = CycleInput {
                now: *now,
                partitions,
                pending: jobs,
                running,
            };
            cold.cycle(&mut cold_scheduler, &input, *optimum);
            warm.cycle(&mut warm_scheduler, &input, *optimum);
        }
        cold.print_by_churn("cold sifting", churn);
        warm.print_by_churn("warm-started sifting", churn);
    }
}

/// One configuration's cycles: wall and CPU times, LP iterations, decisions against the LP
/// optimum, methods (both tables of this bench print from it).
#[derive(Default)]
struct CycleStats {
    times: Vec<f64>,
    cpu: Vec<f64>,
    iterations: Vec<f64>,
    ratios: Vec<f64>,
    stopped_early: usize,
    methods: BTreeMap<String, usize>,
    /// Columns, rows and nonzeros of the last cycle's model.
    size: (usize, usize, usize),
}

impl CycleStats {
    fn cycle<S: MilpSolver>(
        &mut self,
        scheduler: &mut ThreeSigmaScheduler<S>,
        input: &CycleInput<'_>,
        optimum: f64,
    ) {
        let began = Instant::now();
        let cpu_began = thread_cpu_ms();
        let (decision, _) = scheduler.cycle_with_model(input);
        self.times.push(ms_since(began));
        self.cpu.push(thread_cpu_ms() - cpu_began);
        let r = &decision.record;
        if let Some(iterations) = r.lp_iterations {
            self.iterations.push(iterations as f64);
        }
        self.size = (r.columns, r.rows, r.nonzeros);
        self.ratios.push(r.objective / optimum);
        self.stopped_early += usize::from(r.lp_stopped_early);
        *self.methods.entry(format!("{:?}", r.method)).or_default() += 1;
    }

    /// Sorts the samples; the decision quality as "mean (min)".
    fn sorted_quality(&mut self) -> String {
        for v in [&mut self.times, &mut self.cpu, &mut self.iterations] {
            v.sort_by(f64::total_cmp);
        }
        let mean = self.ratios.iter().sum::<f64>() / self.ratios.len() as f64;
        let min = self.ratios.iter().copied().fold(f64::INFINITY, f64::min);
        format!("{mean:.3} ({min:.3})")
    }

    /// A row of the independent-instances table (stopped-early LPs among the methods).
    fn print_by_pending(&mut self, label: &str, pending: usize) {
        let quality = self.sorted_quality();
        let mut methods = self.methods.clone();
        if self.stopped_early > 0 {
            methods.insert("(LP stopped early)".into(), self.stopped_early);
        }
        println!(
            "| {label} | {pending} | {} | {} | {} | {} | {quality} | {methods:?} |",
            self.timing_columns(),
            self.size.0,
            self.size.1,
            self.size.2,
        );
    }

    /// Cycles, wall p50 / p99 / max and CPU p50 / p99 (ms): the columns both tables share.
    fn timing_columns(&self) -> String {
        format!(
            "{} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}",
            self.times.len(),
            quantile(&self.times, 0.5),
            quantile(&self.times, 0.99),
            self.times[self.times.len() - 1],
            quantile(&self.cpu, 0.5),
            quantile(&self.cpu, 0.99),
        )
    }

    /// A row of the consecutive-cycles table.
    fn print_by_churn(&mut self, label: &str, churn: usize) {
        let quality = self.sorted_quality();
        let iterations = if self.iterations.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.0} ({:.0})",
                quantile(&self.iterations, 0.5),
                quantile(&self.iterations, 0.99)
            )
        };
        println!(
            "| {label} | {churn} | {} | {iterations} | {quality} | {} | {:?} |",
            self.timing_columns(),
            self.stopped_early,
            self.methods
        );
    }
}

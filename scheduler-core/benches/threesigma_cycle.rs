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
//! [`HighsSolver`]'s default (sifting for wide models). A third table splits the 300-job cycle
//! into its phases.

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
        .map(|id| {
            let slo = rng.random_bool(0.5);
            let belief = belief(&mut rng);
            let submit = now - rng.random_range(0.0..600.0);
            let utility = if slo {
                let slack = [0.2, 0.4, 0.6, 0.8][rng.random_range(0..4)];
                Utility::Slo {
                    deadline: submit + belief.runtimes()[10] * (1.0 + slack),
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
                id: id as u64,
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
        })
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

/// CPU time of this thread (Linux: `/proc/thread-self/schedstat`, nanoseconds on a CPU); NaN
/// elsewhere.
fn thread_cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e6)
}

/// HiGHS with the LP relaxation over every column at once (the cycle before sifting).
struct FullLp;

impl MilpSolver for FullLp {
    fn name(&self) -> &'static str {
        "highs-full-lp"
    }
    fn solve_relaxation(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        HighsSolver.solve_relaxation_full(model, limit)
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
        "| LP | pending | cycles | p50 ms | p99 ms | max ms | CPU p50 ms | CPU p99 ms | columns | rows | nonzeros | decision / LP bound mean (min) | methods |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    for (pending, cycles) in [(300, 100), (1000, 20), (3000, 5)] {
        timed_cycles("full LP", FullLp, pending, cycles);
        timed_cycles("sifting", HighsSolver, pending, cycles);
    }
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

/// `cycles` cycles of `pending` jobs under the default (wall-clock) config, one table row.
fn timed_cycles<S: MilpSolver>(label: &str, solver: S, pending: usize, cycles: u64) {
    let mut scheduler = ThreeSigmaScheduler::new("3Sigma", ThreeSigmaConfig::default(), solver)
        .expect("default config is valid");
    let mut times = Vec::new();
    let mut cpu_times = Vec::new();
    let mut ratios = Vec::new();
    let mut methods: BTreeMap<String, usize> = BTreeMap::new();
    let mut size = (0, 0, 0);
    for seed in 0..cycles {
        let (partitions, jobs, running) = instance(seed, pending);
        let input = CycleInput {
            now: 10_000.0,
            partitions: &partitions,
            pending: &jobs,
            running: &running,
        };
        let began = Instant::now();
        let cpu_began = thread_cpu_ms();
        let (decision, _) = scheduler.cycle_with_model(&input);
        times.push(ms_since(began));
        cpu_times.push(thread_cpu_ms() - cpu_began);
        let r = &decision.record;
        size = (r.columns, r.rows, r.nonzeros);
        if let Some(bound) = r.lp_bound.filter(|b| *b > 0.0) {
            ratios.push(r.objective / bound);
        }
        *methods.entry(format!("{:?}", r.method)).or_default() += 1;
    }
    times.sort_by(f64::total_cmp);
    cpu_times.sort_by(f64::total_cmp);
    let quality = if ratios.is_empty() {
        "no LP in time".to_string()
    } else {
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        format!("{mean:.3} ({min:.3}; {} cycles)", ratios.len())
    };
    println!(
        "| {label} | {pending} | {cycles} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {quality} | {methods:?} |",
        quantile(&times, 0.5),
        quantile(&times, 0.99),
        times[times.len() - 1],
        quantile(&cpu_times, 0.5),
        quantile(&cpu_times, 0.99),
        size.0,
        size.1,
        size.2
    );
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
}

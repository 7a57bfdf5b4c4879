//! Workloads for the simulator: jobs made of tasks, and the generators of Mercury §7's
//! workloads (microbenchmark, task-duration sweep, synthetic hybrid mix, production-like mix).
//!
//! A workload is a stream of [`JobSpec`]s in arrival order. Mercury's GridMix runs keep a backlog
//! of jobs and admit them under a concurrent-jobs limit (§7.2.1), so the generators produce an
//! unbounded backlog (every job "arrives" at time zero) unless Poisson arrivals are asked for;
//! the simulator admits jobs only while fewer than the limit are running.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::{Resources, Time};
use serde::{Deserialize, Serialize};

/// The container shape of one task when the workload does not say: one core and 4 GiB, i.e.
/// 32 tasks on one of Mercury §7.1's 32-vcore, 128 GB machines.
pub const DEFAULT_TASK_RESOURCES: Resources = Resources::new(1000, 4096);

/// One task: how long it runs once started and what it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    pub runtime_ms: u64,
    pub resources: Resources,
}

/// One job: its arrival, a class label for per-class latency figures, what its job manager
/// knows of it at submission, and its tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub arrival: Time,
    pub class: String,
    /// Attributes known at submission (user, job name, recurring template, …) as (feature,
    /// value) pairs: the runtime predictor's features (3Sigma §4.1). Never derived from the
    /// job's runtimes.
    #[serde(default)]
    pub features: Vec<(String, String)>,
    pub tasks: Vec<TaskSpec>,
}

fn name_feature(name: impl Into<String>) -> Vec<(String, String)> {
    vec![("name".to_string(), name.into())]
}

/// A stream of jobs in non-decreasing arrival order.
pub type JobStream = Box<dyn Iterator<Item = JobSpec> + Send>;

/// How jobs arrive.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrivals {
    /// An unbounded backlog at time zero; the concurrent-jobs limit paces admission (GridMix).
    Backlog,
    /// Poisson arrivals at this mean rate.
    Poisson { jobs_per_s: f64 },
}

/// The generated workloads of Mercury §7.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Generator {
    /// §7.2: 200 tasks per job, task durations uniform in [0.6 s, 1.8 s] (mean 1.2 s).
    Microbenchmark,
    /// §7.3: 200 tasks per job, every task runs exactly `task_ms`.
    FixedDuration { task_ms: u64 },
    /// §7.4.1: 80% of jobs with 2 s tasks, 20% with 50 s tasks, 200 tasks per job.
    SyntheticHybrid,
    /// §7.4.2: job task durations following [`PRODUCTION_TASK_DURATION_CDF`] (our reading of
    /// Mercury Fig. 1), tasks per job log-uniform in [10, 400], ±20% spread within a job.
    ProductionLike,
}

impl Generator {
    /// Short name used on command lines and in reports.
    pub fn name(&self) -> String {
        match self {
            Generator::Microbenchmark => "microbenchmark".into(),
            Generator::FixedDuration { task_ms } => format!("fixed-{}s", task_ms / 1000),
            Generator::SyntheticHybrid => "synthetic-hybrid".into(),
            Generator::ProductionLike => "production-like".into(),
        }
    }

    /// An endless stream of jobs from this generator, seeded.
    pub fn stream(&self, seed: u64, arrivals: Arrivals) -> JobStream {
        Box::new(GeneratedJobs {
            generator: self.clone(),
            arrivals,
            rng: StdRng::seed_from_u64(seed),
            clock_us: 0.0,
        })
    }

    fn job(&self, rng: &mut StdRng, arrival: Time) -> JobSpec {
        let tasks_of = |n: usize, ms: &mut dyn FnMut() -> u64| -> Vec<TaskSpec> {
            (0..n)
                .map(|_| TaskSpec {
                    runtime_ms: ms().max(1),
                    resources: DEFAULT_TASK_RESOURCES,
                })
                .collect()
        };
        match self {
            Generator::Microbenchmark => JobSpec {
                arrival,
                class: "1.2s".into(),
                features: name_feature("microbenchmark"),
                tasks: tasks_of(200, &mut || rng.random_range(600..=1800)),
            },
            Generator::FixedDuration { task_ms } => JobSpec {
                arrival,
                class: format!("{}s", task_ms / 1000),
                features: name_feature(self.name()),
                tasks: tasks_of(200, &mut || *task_ms),
            },
            Generator::SyntheticHybrid => {
                let (class, ms) = if rng.random_range(0.0..1.0) < 0.8 {
                    ("2s", 2_000)
                } else {
                    ("50s", 50_000)
                };
                // Two different programs (Mercury §7.4.1): the job manager knows which it runs.
                JobSpec {
                    arrival,
                    class: class.into(),
                    features: name_feature(format!("synthetic-{class}")),
                    tasks: tasks_of(200, &mut || ms),
                }
            }
            Generator::ProductionLike => {
                let (quantile, nominal_ms) =
                    sample_piecewise_log_cdf(PRODUCTION_TASK_DURATION_CDF, rng);
                let tasks = (10f64 * 40f64.powf(rng.random_range(0.0..1.0))).round() as usize;
                // Production clusters run mostly recurring jobs (3Sigma §2, Morpheus §3): the
                // mix is made of 100 recurring templates, one per percentile band of the task
                // duration CDF, and a job manager knows its job's template.
                let template = ((quantile * 100.0) as u32).min(99);
                JobSpec {
                    arrival,
                    class: production_class(nominal_ms).into(),
                    features: vec![("template".into(), format!("t{template:02}"))],
                    tasks: tasks_of(tasks, &mut || {
                        (nominal_ms as f64 * rng.random_range(0.8..1.2)).round() as u64
                    }),
                }
            }
        }
    }
}

/// Task-duration CDF (seconds, cumulative fraction) approximating Mercury Fig. 1. The paper
/// states only that "almost 60% of the tasks complete execution under 10 seconds"; the other
/// points are our reading of the figure's shape (a heavy tail of minutes-long tasks) and are an
/// assumption. Between points the CDF is linear in log(duration).
pub const PRODUCTION_TASK_DURATION_CDF: &[(f64, f64)] = &[
    (0.5, 0.0),
    (1.0, 0.04),
    (2.0, 0.15),
    (3.0, 0.27),
    (5.0, 0.42),
    (10.0, 0.59),
    (20.0, 0.70),
    (60.0, 0.82),
    (180.0, 0.91),
    (600.0, 0.97),
    (1800.0, 1.0),
];

/// Class label of a production-like job by its nominal task duration (Mercury Fig. 11 reports
/// latency per task-duration group).
pub fn production_class(nominal_ms: u64) -> &'static str {
    match nominal_ms {
        0..5_000 => "<5s",
        5_000..15_000 => "5-15s",
        15_000..60_000 => "15-60s",
        _ => ">=60s",
    }
}

/// Inverse-transform sample from a piecewise log-linear CDF: (the uniform quantile drawn, ms).
fn sample_piecewise_log_cdf(cdf: &[(f64, f64)], rng: &mut StdRng) -> (f64, u64) {
    let u: f64 = rng.random_range(0.0..1.0);
    for w in cdf.windows(2) {
        let ((x0, p0), (x1, p1)) = (w[0], w[1]);
        if u <= p1 {
            let f = if p1 > p0 { (u - p0) / (p1 - p0) } else { 0.0 };
            let secs = (x0.ln() + f * (x1.ln() - x0.ln())).exp();
            return (u, (secs * 1000.0).round() as u64);
        }
    }
    (u, (cdf.last().map_or(1.0, |p| p.0) * 1000.0) as u64)
}

struct GeneratedJobs {
    generator: Generator,
    arrivals: Arrivals,
    rng: StdRng,
    clock_us: f64,
}

impl Iterator for GeneratedJobs {
    type Item = JobSpec;

    fn next(&mut self) -> Option<JobSpec> {
        if let Arrivals::Poisson { jobs_per_s } = self.arrivals {
            let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
            self.clock_us += -u.ln() / jobs_per_s.max(1e-9) * 1e6;
        }
        let arrival = Time::from_micros(self.clock_us as u64);
        Some(self.generator.job(&mut self.rng, arrival))
    }
}

/// A finite list of jobs (e.g. from a trace) as a stream, sorted by arrival (stable).
pub fn from_jobs(mut jobs: Vec<JobSpec>) -> JobStream {
    jobs.sort_by_key(|j| j.arrival);
    Box::new(jobs.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_match_their_definitions() {
        let jobs: Vec<JobSpec> = Generator::Microbenchmark
            .stream(1, Arrivals::Backlog)
            .take(20)
            .collect();
        let tasks: Vec<u64> = jobs
            .iter()
            .flat_map(|j| j.tasks.iter().map(|t| t.runtime_ms))
            .collect();
        assert!(
            jobs.iter()
                .all(|j| j.tasks.len() == 200 && j.arrival == Time::ZERO)
        );
        let mean = tasks.iter().sum::<u64>() as f64 / tasks.len() as f64;
        assert!((mean - 1200.0).abs() < 30.0, "{mean}");

        let hybrid: Vec<JobSpec> = Generator::SyntheticHybrid
            .stream(2, Arrivals::Backlog)
            .take(2000)
            .collect();
        let short = hybrid.iter().filter(|j| j.class == "2s").count() as f64 / 2000.0;
        assert!((short - 0.8).abs() < 0.03, "{short}");

        let prod: Vec<JobSpec> = Generator::ProductionLike
            .stream(3, Arrivals::Poisson { jobs_per_s: 2.0 })
            .take(4000)
            .collect();
        let all: Vec<u64> = prod
            .iter()
            .flat_map(|j| j.tasks.iter().map(|t| t.runtime_ms))
            .collect();
        let under_10s = all.iter().filter(|&&ms| ms < 10_000).count() as f64 / all.len() as f64;
        assert!((under_10s - 0.59).abs() < 0.05, "{under_10s}");
        assert!(prod.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        let span_s = prod.last().unwrap().arrival.as_micros() as f64 / 1e6;
        assert!((span_s / 4000.0 - 0.5).abs() < 0.05, "{span_s}");
    }
}

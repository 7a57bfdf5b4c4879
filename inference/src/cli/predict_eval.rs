//! `inference predict-eval`: replay a trace in time order, predicting each job's runtime at
//! submission from the history of jobs finished before it, then learning it when it finishes.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use inference::predictor::{
    Estimator, JobFeatures, PredictorConfig, RuntimePredictor, Selection, SubmittedEstimates,
};
use inference::traces;
use serde::Serialize;

/// One job of the replay.
#[derive(Debug, Clone)]
pub struct EvalJob {
    pub submit: f64,
    pub end: f64,
    pub runtime: f64,
    pub features: JobFeatures,
    /// The simple baseline's keys: (user, requested resources), and the user to fall back on.
    pub baseline_key: String,
    pub baseline_user: String,
}

/// The simple baseline 3σPredict must beat (issue 16): the median of the last
/// [`BASELINE_WINDOW`] finished jobs of the same (user, requested resources), falling back to
/// the median of the user's last ones.
pub const BASELINE_WINDOW: usize = 20;

#[derive(Debug, Default)]
struct RecentMedianBaseline {
    by_key: std::collections::HashMap<String, std::collections::VecDeque<f64>>,
    by_user: std::collections::HashMap<String, std::collections::VecDeque<f64>>,
}

impl RecentMedianBaseline {
    fn median(values: &std::collections::VecDeque<f64>) -> Option<f64> {
        if values.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = values.iter().copied().collect();
        sorted.sort_unstable_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        Some(if sorted.len() % 2 == 1 {
            sorted[middle]
        } else {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        })
    }

    fn predict(&self, job: &EvalJob) -> Option<f64> {
        self.by_key
            .get(&job.baseline_key)
            .and_then(Self::median)
            .or_else(|| self.by_user.get(&job.baseline_user).and_then(Self::median))
    }

    fn observe(&mut self, job: &EvalJob) {
        for (map, key) in [
            (&mut self.by_key, &job.baseline_key),
            (&mut self.by_user, &job.baseline_user),
        ] {
            let ring = map.entry(key.clone()).or_default();
            if ring.len() == BASELINE_WINDOW {
                ring.pop_front();
            }
            ring.push_back(job.runtime);
        }
    }
}

fn hour_of_day(seconds: f64) -> String {
    ((seconds / 3600.0).floor().rem_euclid(24.0) as u32).to_string()
}

fn number(value: Option<f64>) -> String {
    value.map(|v| format!("{v}")).unwrap_or_default()
}

fn id(value: Option<i64>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

/// SWF: runtime = run time field; finish = submit + wait + run. Features: user, group,
/// executable, queue, partition, requested processors, requested time, user combinations, and
/// the share of the requested time run per user and per (user, processors, memory) (scaled
/// features); requested memory where the log has it.
/// The hour of day counts from the log start (the header's UnixStartTime is not applied).
pub fn jobs_from_swf(jobs: &[traces::SwfJob]) -> Vec<EvalJob> {
    jobs.iter()
        .filter_map(|job| {
            let runtime = job.run_time.filter(|r| *r > 0.0)?;
            let processors = job.requested_processors.or(job.allocated_processors);
            let user = id(job.user);
            let executable = id(job.executable);
            // Most specific first: the most-specific selection rule takes the first with history.
            let mut features = JobFeatures::new();
            // The requested memory, where the log has it (HPC2N), is a requested resource too.
            let memory = number(job.requested_memory);
            if !user.is_empty() && !memory.is_empty() {
                features.push(
                    "user+processors+requested_time+requested_memory",
                    format!(
                        "{user}/{}/{}/{memory}",
                        number(processors),
                        number(job.requested_time)
                    ),
                );
            }
            if !user.is_empty() {
                features.push(
                    "user+processors+requested_time",
                    format!(
                        "{user}/{}/{}",
                        number(processors),
                        number(job.requested_time)
                    ),
                );
            }
            features.push("user", user.clone());
            if let Some(requested) = job.requested_time
                && !user.is_empty()
            {
                // Requested times are upper bounds (the job is killed at its limit); a user
                // tends to over-request by a habitual factor: the share of the request the
                // user's jobs ran, times this job's request. (Also per (user, processors):
                // within ±0.05 points once the rules vote, so not kept; see
                // docs/benchmarks-inference.md §1.)
                features.push_scaled("user/requested_time", user.clone(), requested);
                if !memory.is_empty() {
                    features.push_scaled(
                        "user+processors+requested_memory/requested_time",
                        format!("{user}/{}/{memory}", number(processors)),
                        requested,
                    );
                }
            }
            if !user.is_empty() && !executable.is_empty() {
                // Job name × size (3Sigma §4.1's combined features).
                features.push(
                    "user+executable+processors",
                    format!("{user}/{executable}/{}", number(processors)),
                );
            }
            features.push("group", id(job.group));
            features.push("executable", executable.clone());
            features.push("queue", id(job.queue));
            features.push("partition", id(job.partition));
            features.push("processors", number(processors));
            features.push("requested_time", number(job.requested_time));
            if !user.is_empty() {
                if !executable.is_empty() {
                    features.push("user+executable", format!("{user}/{executable}"));
                }
                features.push("user+processors", format!("{user}/{}", number(processors)));
                features.push(
                    "user+requested_time",
                    format!("{user}/{}", number(job.requested_time)),
                );
                features.push(
                    "user+submit_hour",
                    format!("{user}/{}", hour_of_day(job.submit)),
                );
            }
            features.push("submit_hour", hour_of_day(job.submit));
            Some(EvalJob {
                submit: job.submit,
                end: job.submit + job.wait.unwrap_or(0.0) + runtime,
                runtime,
                features,
                baseline_key: format!(
                    "{user}/{}/{}",
                    number(processors),
                    number(job.requested_time)
                ),
                baseline_user: user,
            })
        })
        .collect()
}

/// Google 2011: runtime = end − schedule of jobs that finished, failed or were killed in the
/// slice. Features: user, job name, logical job name, scheduling class and combinations.
pub fn jobs_from_google(jobs: &[traces::GoogleJob]) -> Vec<EvalJob> {
    jobs.iter()
        .filter(|job| job.runtime() > 0.0)
        .map(|job| {
            let class = job
                .scheduling_class
                .map(|c| c.to_string())
                .unwrap_or_default();
            // Most specific first: the most-specific selection rule takes the first with history.
            let features = JobFeatures::new()
                .with(
                    "user+logical_name",
                    format!("{}/{}", job.user, job.logical_job_name),
                )
                .with("user", job.user.clone())
                .with("job_name", job.job_name.clone())
                .with("logical_name", job.logical_job_name.clone())
                .with("scheduling_class", class.clone())
                .with("user+class", format!("{}/{class}", job.user))
                .with(
                    "user+submit_hour",
                    format!("{}/{}", job.user, hour_of_day(job.submit)),
                )
                .with("submit_hour", hour_of_day(job.submit));
            // Job events carry no resource request: the job's logical name stands for it.
            EvalJob {
                submit: job.submit,
                end: job.end,
                runtime: job.runtime(),
                features,
                baseline_key: format!("{}/{}", job.user, job.logical_job_name),
                baseline_user: job.user.clone(),
            }
        })
        .collect()
}

/// Alibaba 2017 batch tasks: runtime = end − create of Terminated tasks (the table has no
/// start time, so queueing is included). Features: job id, instance count (exact and in powers
/// of two), per-instance CPU and memory requests and combinations.
pub fn jobs_from_alibaba(tasks: &[traces::AlibabaTask]) -> Vec<EvalJob> {
    tasks
        .iter()
        .filter(|task| task.status == "Terminated" && task.end_time > task.create_time)
        .map(|task| {
            let cpu = number(task.cpus_per_instance);
            let memory = number(task.memory_per_instance);
            let instances = task.instances.to_string();
            // Most specific first: the most-specific selection rule takes the first with history.
            let features = JobFeatures::new()
                .with(
                    "instances+cpu+memory",
                    format!("{instances}/{cpu}/{memory}"),
                )
                .with(
                    // Instance count in powers of two: a request of similar width and the
                    // same per-instance resources when the exact count has no history.
                    "instances_log2+cpu+memory",
                    format!("{}/{cpu}/{memory}", task.instances.max(1).ilog2()),
                )
                .with("cpu+memory", format!("{cpu}/{memory}"))
                .with("job", task.job_id.to_string())
                .with("instances", instances.clone())
                .with("cpu", cpu.clone())
                .with("memory", memory.clone())
                .with("job+instances", format!("{}/{instances}", task.job_id))
                .with("submit_hour", hour_of_day(task.create_time));
            // No user in the table, and a job's tasks are created together (none has finished
            // when the next is created): the baseline keys on the requested resources alone
            // (instances, CPU, memory), falling back to the per-instance request (CPU, memory).
            EvalJob {
                submit: task.create_time,
                end: task.end_time,
                runtime: task.end_time - task.create_time,
                features,
                baseline_key: format!("{instances}/{cpu}/{memory}"),
                baseline_user: format!("{cpu}/{memory}"),
            }
        })
        .collect()
}

pub fn load_jobs(path: &Path, format: &str) -> Result<Vec<EvalJob>> {
    Ok(match format {
        "swf" => jobs_from_swf(&traces::read_swf_file(path)?),
        "google2011" => {
            let events = traces::read_google_job_events_path(path)?;
            jobs_from_google(&traces::google_jobs(&events, false))
        }
        "alibaba2017" => jobs_from_alibaba(&traces::read_alibaba_tasks_file(path)?),
        other => anyhow::bail!(
            "unknown trace format {other:?} (expected swf, google2011 or alibaba2017)"
        ),
    })
}

/// Accuracy of one kind of estimate.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Accuracy {
    pub predicted: u64,
    pub within_2x: f64,
    pub nmae: f64,
    #[serde(skip)]
    within: u64,
    #[serde(skip)]
    absolute_error: f64,
    #[serde(skip)]
    actual: f64,
}

impl Accuracy {
    fn record(&mut self, estimate: f64, actual: f64) {
        self.predicted += 1;
        if estimate >= actual / 2.0 && estimate <= actual * 2.0 {
            self.within += 1;
        }
        self.absolute_error += (estimate - actual).abs();
        self.actual += actual;
    }

    fn finish(&mut self) {
        self.within_2x = self.within as f64 / self.predicted.max(1) as f64;
        self.nmae = self.absolute_error / self.actual.max(f64::MIN_POSITIVE);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ErrorBucket {
    /// Bucket label: the decile of percent error (estimate − actual)/actual·100 it is within
    /// ±5 % of, or "tail" for errors > 95 %.
    pub bucket: String,
    pub fraction: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SinglePointEstimator {
    pub estimator: &'static str,
    #[serde(flatten)]
    pub accuracy: Accuracy,
}

#[derive(Debug, Clone, Serialize)]
pub struct SelectionRuleAccuracy {
    pub rule: String,
    #[serde(flatten)]
    pub accuracy: Accuracy,
}

#[derive(Debug, Clone, Serialize)]
pub struct PredictReport {
    pub trace: String,
    pub format: String,
    pub jobs: u64,
    pub predicted: u64,
    /// Median of the predicted distribution within a factor of two of the actual runtime.
    pub within_2x: f64,
    /// Actual runtime inside the predicted 10th–90th percentile.
    pub coverage_80: f64,
    /// Actual runtime above the support maximum of the predicted distribution's body (the
    /// longest runtime its history suggests, before the upper tail of
    /// `RuntimePredictor::upper_tail`; without that tail the distribution gives it probability
    /// 0): what a scheduler deferring a job until "deadline − longest runtime" (3Sigma §4.3) is
    /// exposed to.
    pub above_support_max: f64,
    /// Geometric mean of actual runtime / that maximum over those jobs (1 when there are
    /// none), and their median.
    pub above_support_max_ratio_geomean: f64,
    pub above_support_max_ratio_median: f64,
    /// Actual runtime above the predicted 95th and 99th percentiles (calibrated: 0.05, 0.01).
    pub above_p95: f64,
    pub above_p99: f64,
    /// NMAE of the distribution median.
    pub nmae: f64,
    /// The chosen expert's own point estimate (what PointRealEst would use).
    pub expert_point_estimate: Accuracy,
    /// Each estimator used alone (expert choice restricted to that estimator).
    pub single_point_estimators: Vec<SinglePointEstimator>,
    pub best_single_point_estimator: String,
    /// Each expert-selection rule alone (their estimates at submission, same replay).
    pub selection_rules: Vec<SelectionRuleAccuracy>,
    /// The simple baseline in the same replay: median of the last 20 finished jobs of the same
    /// (user, requested resources), else of the user's.
    pub baseline_within_2x: f64,
    pub baseline_nmae: f64,
    pub baseline_predicted: u64,
    /// On the jobs both predicted (the baseline has no estimate for a user's first job):
    /// 3σPredict's distribution median, then the baseline.
    pub same_jobs: u64,
    pub same_jobs_within_2x: f64,
    pub same_jobs_baseline_within_2x: f64,
    /// 3Sigma Fig. 2(d) histogram of the median's percent error.
    pub error_histogram: Vec<ErrorBucket>,
    pub predictions_per_second: f64,
    /// The calibrated spread multiplier at the end of the replay.
    pub spread: f64,
    /// The selection rule in use at the end of the replay.
    pub selection: String,
    pub feature_values: usize,
    pub state_bytes_per_feature_value_mean: f64,
    pub state_bytes_per_feature_value_max: usize,
    pub replay_seconds: f64,
}

fn error_bucket(percent: f64) -> usize {
    // Buckets −100, −90, …, 90 (index 0..=19) and tail (20).
    if percent > 95.0 {
        20
    } else {
        (((percent + 100.0) / 10.0).round().clamp(0.0, 19.0)) as usize
    }
}

/// Replays `path` through a predictor configured by `config`.
pub fn run(
    path: &Path,
    format: &str,
    limit: Option<usize>,
    config: PredictorConfig,
) -> Result<PredictReport> {
    let mut jobs =
        load_jobs(path, format).with_context(|| format!("reading {}", path.display()))?;
    jobs.sort_by(|a, b| a.submit.total_cmp(&b.submit));
    if let Some(limit) = limit {
        jobs.truncate(limit);
    }
    anyhow::ensure!(
        !jobs.is_empty(),
        "{}: no jobs with a positive runtime",
        path.display()
    );
    // Finishes sort before submissions at the same instant: a job that ended at t is history
    // for a job submitted at t.
    let mut timeline: Vec<(f64, bool, usize)> = Vec::with_capacity(jobs.len() * 2);
    for (index, job) in jobs.iter().enumerate() {
        timeline.push((job.submit, true, index));
        timeline.push((job.end.max(job.submit), false, index));
    }
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));

    let started = Instant::now();
    let mut predictor = RuntimePredictor::new(config);
    let mut median = Accuracy::default();
    let mut point = Accuracy::default();
    let mut singles: Vec<Accuracy> = vec![Accuracy::default(); Estimator::ALL.len()];
    let mut covered = 0u64;
    let mut above_support = 0u64;
    let mut above_support_ratios: Vec<f64> = Vec::new();
    let mut above_p95 = 0u64;
    let mut above_p99 = 0u64;
    let mut rules: Vec<Accuracy> = vec![Accuracy::default(); Selection::ALL.len()];
    let mut baseline = RecentMedianBaseline::default();
    let mut baseline_accuracy = Accuracy::default();
    // The same jobs for both: those the baseline and 3σPredict both had history for.
    let mut both_median = Accuracy::default();
    let mut both_baseline = Accuracy::default();
    let mut histogram = [0u64; 21];
    let mut predict_time = 0.0;
    let mut submitted: Vec<Option<SubmittedEstimates>> = vec![None; jobs.len()];
    for (_, is_submit, index) in timeline {
        let job = &jobs[index];
        if !is_submit {
            baseline.observe(job);
            match submitted[index].take() {
                Some(estimates) => {
                    predictor.observe_submitted(&job.features, job.runtime, &estimates)
                }
                None => predictor.observe(&job.features, job.runtime),
            }
            continue;
        }
        let baseline_estimate = baseline.predict(job);
        if let Some(estimate) = baseline_estimate {
            baseline_accuracy.record(estimate, job.runtime);
        }
        // Experts are scored on what they estimated at submission (3Sigma §4.1), and the
        // spread is calibrated on the interval the prediction gave then.
        let clock = Instant::now();
        let (prediction, estimates) = predictor.predict_with_submitted(&job.features);
        predict_time += clock.elapsed().as_secs_f64();
        for (slot, estimate) in rules.iter_mut().zip(estimates.selections()) {
            if let Some(estimate) = estimate {
                slot.record(*estimate, job.runtime);
            }
        }
        submitted[index] = Some(estimates);
        let candidates = predictor.candidates(&job.features);
        let Some(prediction) = prediction else {
            continue;
        };
        let distribution = &prediction.distribution;
        let estimate = distribution.median();
        median.record(estimate, job.runtime);
        if let Some(baseline_estimate) = baseline_estimate {
            both_median.record(estimate, job.runtime);
            both_baseline.record(baseline_estimate, job.runtime);
        }
        point.record(prediction.point_estimate, job.runtime);
        if distribution.quantile(0.1) <= job.runtime && job.runtime <= distribution.quantile(0.9) {
            covered += 1;
        }
        let support_max = prediction.body_support_max;
        if job.runtime > support_max {
            above_support += 1;
            above_support_ratios.push(job.runtime / support_max);
        }
        let mut upper = [0.0; 2];
        distribution.quantiles_into(&[0.95, 0.99], &mut upper);
        above_p95 += u64::from(job.runtime > upper[0]);
        above_p99 += u64::from(job.runtime > upper[1]);
        histogram[error_bucket((estimate - job.runtime) / job.runtime * 100.0)] += 1;
        for (slot, estimator) in singles.iter_mut().zip(Estimator::ALL) {
            if let Some(chosen) = predictor.choose_with_estimator(&candidates, estimator) {
                slot.record(chosen.estimate, job.runtime);
            }
        }
    }
    median.finish();
    point.finish();
    baseline_accuracy.finish();
    both_median.finish();
    both_baseline.finish();
    let mut single_point_estimators: Vec<SinglePointEstimator> = singles
        .into_iter()
        .zip(Estimator::ALL)
        .map(|(mut accuracy, estimator)| {
            accuracy.finish();
            SinglePointEstimator {
                estimator: estimator.name(),
                accuracy,
            }
        })
        .collect();
    single_point_estimators.sort_by(|a, b| b.accuracy.within_2x.total_cmp(&a.accuracy.within_2x));
    let selection_rules = rules
        .into_iter()
        .zip(Selection::ALL)
        .map(|(mut accuracy, rule)| {
            accuracy.finish();
            SelectionRuleAccuracy {
                rule: format!("{rule:?}"),
                accuracy,
            }
        })
        .collect();
    let predicted = median.predicted;
    let error_histogram = histogram
        .iter()
        .enumerate()
        .map(|(index, count)| ErrorBucket {
            bucket: if index == 20 {
                "tail".to_string()
            } else {
                format!("{}", index as i64 * 10 - 100)
            },
            fraction: *count as f64 / predicted.max(1) as f64,
        })
        .collect();
    let feature_values = predictor.feature_values();
    Ok(PredictReport {
        trace: path.display().to_string(),
        format: format.to_string(),
        jobs: jobs.len() as u64,
        predicted,
        within_2x: median.within_2x,
        coverage_80: covered as f64 / predicted.max(1) as f64,
        above_support_max: above_support as f64 / predicted.max(1) as f64,
        above_support_max_ratio_geomean: if above_support_ratios.is_empty() {
            1.0
        } else {
            (above_support_ratios.iter().map(|r| r.ln()).sum::<f64>()
                / above_support_ratios.len() as f64)
                .exp()
        },
        above_support_max_ratio_median: {
            above_support_ratios.sort_by(f64::total_cmp);
            above_support_ratios
                .get(above_support_ratios.len() / 2)
                .copied()
                .unwrap_or(1.0)
        },
        above_p95: above_p95 as f64 / predicted.max(1) as f64,
        above_p99: above_p99 as f64 / predicted.max(1) as f64,
        nmae: median.nmae,
        expert_point_estimate: point,
        best_single_point_estimator: single_point_estimators
            .first()
            .map(|s| s.estimator.to_string())
            .unwrap_or_default(),
        single_point_estimators,
        selection_rules,
        baseline_within_2x: baseline_accuracy.within_2x,
        baseline_nmae: baseline_accuracy.nmae,
        baseline_predicted: baseline_accuracy.predicted,
        same_jobs: both_median.predicted,
        same_jobs_within_2x: both_median.within_2x,
        same_jobs_baseline_within_2x: both_baseline.within_2x,
        error_histogram,
        predictions_per_second: jobs.len() as f64 / predict_time.max(1e-9),
        spread: predictor.spread(),
        selection: format!("{:?}", predictor.selection()),
        feature_values,
        state_bytes_per_feature_value_mean: predictor.state_bytes() as f64
            / feature_values.max(1) as f64,
        state_bytes_per_feature_value_max: predictor.max_state_bytes_per_value(),
        replay_seconds: started.elapsed().as_secs_f64(),
    })
}

pub fn print_table(report: &PredictReport) {
    println!("trace                 {} ({})", report.trace, report.format);
    println!("jobs                  {}", report.jobs);
    println!("predicted             {}", report.predicted);
    println!("within_2x (median)    {:.4}", report.within_2x);
    println!("coverage_80 (p10-p90) {:.4}", report.coverage_80);
    println!(
        "above support max     {:.4} (ratio geometric mean {:.2}, median {:.2})",
        report.above_support_max,
        report.above_support_max_ratio_geomean,
        report.above_support_max_ratio_median
    );
    println!(
        "above p95 / p99       {:.4} / {:.4}",
        report.above_p95, report.above_p99
    );
    println!("nmae (median)         {:.4}", report.nmae);
    println!(
        "expert point estimate within_2x {:.4}  nmae {:.4}",
        report.expert_point_estimate.within_2x, report.expert_point_estimate.nmae
    );
    println!("single point estimators:");
    for single in &report.single_point_estimators {
        println!(
            "  {:<14} within_2x {:.4}  nmae {:.4}",
            single.estimator, single.accuracy.within_2x, single.accuracy.nmae
        );
    }
    println!("selection rules alone:");
    for rule in &report.selection_rules {
        println!(
            "  {:<14} within_2x {:.4}  nmae {:.4}",
            rule.rule, rule.accuracy.within_2x, rule.accuracy.nmae
        );
    }
    println!(
        "baseline (median of the last {BASELINE_WINDOW} of user+resources, else user) within_2x {:.4}  nmae {:.4}  ({} predicted)",
        report.baseline_within_2x, report.baseline_nmae, report.baseline_predicted
    );
    println!(
        "same {} jobs: 3σPredict within_2x {:.4}, baseline {:.4}",
        report.same_jobs, report.same_jobs_within_2x, report.same_jobs_baseline_within_2x
    );
    println!("error histogram (percent error of the median, fraction of predicted jobs):");
    for bucket in &report.error_histogram {
        println!("  {:>5}  {:.4}", bucket.bucket, bucket.fraction);
    }
    println!("predictions/s         {:.0}", report.predictions_per_second);
    println!(
        "feature values        {}  (state bytes/value: mean {:.0}, max {})",
        report.feature_values,
        report.state_bytes_per_feature_value_mean,
        report.state_bytes_per_feature_value_max
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval_job(key: &str, user: &str, runtime: f64) -> EvalJob {
        EvalJob {
            submit: 0.0,
            end: runtime,
            runtime,
            features: JobFeatures::new(),
            baseline_key: key.into(),
            baseline_user: user.into(),
        }
    }

    fn swf_job(user: i64, processors: f64) -> traces::SwfJob {
        traces::SwfJob {
            job: 1,
            submit: 0.0,
            wait: Some(0.0),
            run_time: Some(100.0),
            allocated_processors: Some(processors),
            requested_processors: Some(processors),
            requested_time: None,
            requested_memory: None,
            status: Some(1),
            user: Some(user),
            group: None,
            executable: None,
            queue: None,
            partition: None,
        }
    }

    #[test]
    fn the_baseline_is_the_recent_median_of_the_key_then_of_the_user() {
        let mut baseline = RecentMedianBaseline::default();
        assert_eq!(baseline.predict(&eval_job("u/4/60", "u", 1.0)), None);
        for runtime in [10.0, 30.0, 20.0] {
            baseline.observe(&eval_job("u/4/60", "u", runtime));
        }
        assert_eq!(baseline.predict(&eval_job("u/4/60", "u", 1.0)), Some(20.0));
        // Another request of the same user: the user's median.
        baseline.observe(&eval_job("u/8/60", "u", 100.0));
        assert_eq!(baseline.predict(&eval_job("u/16/60", "u", 1.0)), Some(25.0));
        // Only the last BASELINE_WINDOW count.
        for _ in 0..BASELINE_WINDOW {
            baseline.observe(&eval_job("u/4/60", "u", 7.0));
        }
        assert_eq!(baseline.predict(&eval_job("u/4/60", "u", 1.0)), Some(7.0));
    }

    #[test]
    fn swf_jobs_get_the_share_of_their_request_and_alibaba_tasks_their_width_class() {
        let swf = traces::SwfJob {
            requested_time: Some(3600.0),
            ..swf_job(7, 16.0)
        };
        let job = &jobs_from_swf(&[swf])[0];
        let scaled: Vec<(&str, &str, Option<f64>)> = job
            .features
            .features
            .iter()
            .filter(|f| f.scale.is_some())
            .map(|f| (f.name.as_str(), f.value.as_str(), f.scale))
            .collect();
        assert_eq!(scaled, [("user/requested_time", "7", Some(3600.0))]);
        // The requested memory joins the request where the log has it.
        let with_memory = traces::SwfJob {
            requested_time: Some(600.0),
            requested_memory: Some(2048.0),
            ..swf_job(7, 16.0)
        };
        let features = &jobs_from_swf(&[with_memory])[0].features.features;
        assert_eq!(features[0].value, "7/16/600/2048");
        assert!(features.iter().any(|f| f.name
            == "user+processors+requested_memory/requested_time"
            && f.value == "7/16/2048"
            && f.scale == Some(600.0)));
        // Without a request there is nothing to scale by.
        let unrequested = &jobs_from_swf(&[swf_job(7, 16.0)])[0];
        assert!(
            unrequested
                .features
                .features
                .iter()
                .all(|f| f.scale.is_none())
        );
        let task = traces::AlibabaTask {
            create_time: 10.0,
            end_time: 70.0,
            job_id: 3,
            task_id: 4,
            instances: 300,
            status: "Terminated".into(),
            cpus_per_instance: Some(50.0),
            memory_per_instance: Some(0.01),
        };
        let features = &jobs_from_alibaba(&[task])[0].features.features;
        assert_eq!(features[0].value, "300/50/0.01");
        assert_eq!(
            (features[1].name.as_str(), features[1].value.as_str()),
            ("instances_log2+cpu+memory", "8/50/0.01")
        );
    }

    #[test]
    fn error_buckets_follow_fig_2d() {
        assert_eq!(error_bucket(-100.0), 0);
        assert_eq!(error_bucket(-4.0), 10);
        assert_eq!(error_bucket(4.9), 10);
        assert_eq!(error_bucket(12.0), 11);
        assert_eq!(error_bucket(94.0), 19);
        assert_eq!(error_bucket(300.0), 20);
    }

    #[test]
    fn replay_predicts_only_from_finished_jobs() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("t.swf");
        // Jobs of user 1: the second is submitted before the first finishes (no history yet);
        // the third comes after both finished.
        let lines = [
            "1 0 0 100 1 -1 -1 1 -1 -1 1 1 1 1 1 1 -1 -1",
            "2 50 0 100 1 -1 -1 1 -1 -1 1 1 1 1 1 1 -1 -1",
            "3 500 0 100 1 -1 -1 1 -1 -1 1 1 1 1 1 1 -1 -1",
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let report = run(&path, "swf", None, PredictorConfig::default()).unwrap();
        assert_eq!(report.jobs, 3);
        assert_eq!(report.predicted, 1);
        assert_eq!(report.within_2x, 1.0);
        assert!(run(&path, "nope", None, PredictorConfig::default()).is_err());
    }
}

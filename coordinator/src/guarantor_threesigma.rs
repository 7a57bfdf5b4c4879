//! The guarantor actor's 3Sigma part (issue 13, live): beliefs from 3σPredict for asks that
//! describe their job, the periodic cycle solved off the actor's thread, and the history of
//! finished jobs persisted in the store so predictions survive a restart.

use super::GuarantorActor;
use crate::store::JobHistoryRecord;
use actix::prelude::*;
use inference::predictor::{JobFeatures, RuntimePredictor, SubmittedEstimates};
use scheduler_core::threesigma::{
    BeliefPiece, CompletedJob, JobDescription, LiveThreeSigma, LiveThreeSigmaConfig, RuntimeBelief,
};
use std::collections::{HashMap, HashSet};
use tracing::{debug, error, info, warn};

/// Uniform pieces each sloped piece of a 3σPredict distribution (its falling upper tail, or a
/// histogram's trapezoid) is handed to 3σSched as (`RuntimeDistribution::uniform_pieces`).
pub const SLOPED_PIECE_SPLIT: usize = 8;

/// 3σPredict's distribution as 3σSched's belief, with runtimes of at least `min_runtime`:
/// its own pieces (the whole support, so no tail is cut: Eq. 1 and §3.2 integrate over the
/// whole distribution), exact for its calibrated body of uniform pieces, the upper tail as
/// [`SLOPED_PIECE_SPLIT`] uniform pieces of equal mass. `None` for a distribution without
/// mass. The live guarantor and the simulator's 3Sigma both build beliefs with it.
pub fn belief_of(
    distribution: &inference::distribution::RuntimeDistribution,
    min_runtime: f64,
) -> Option<RuntimeBelief> {
    let pieces = distribution
        .uniform_pieces(SLOPED_PIECE_SPLIT)
        .into_iter()
        .map(|p| BeliefPiece {
            lo: p.lo.max(min_runtime),
            hi: p.hi.max(min_runtime),
            mass: p.mass,
        })
        .collect();
    RuntimeBelief::from_pieces(pieces).ok()
}

/// The 3Sigma state the actor keeps beside the core: the predictor and finished jobs not yet
/// written to the store.
pub(super) struct ActorThreeSigma {
    pub(super) predictor: RuntimePredictor,
    /// What 3σPredict estimated for each waiting or running job when it was submitted, by ask
    /// key: its outcome is scored against these (3Sigma §4.1 ranks experts by their past
    /// estimates), and the interval it was given calibrates the spread. Learning with
    /// `observe` alone would never calibrate nor score the selection rules. At most one entry
    /// per job the core holds (pruned with [`ActorThreeSigma::forget_jobs_not_in`]).
    submitted: HashMap<u64, SubmittedEstimates>,
    pub(super) unsaved: Vec<JobHistoryRecord>,
    pub(super) cycle_ms: u64,
    pub(super) default_runtime_s: f64,
}

fn job_features(features: &[(String, String)]) -> JobFeatures {
    let mut f = JobFeatures::new();
    for (k, v) in features {
        f.push(k.clone(), v.clone());
    }
    f
}

/// 3σPredict trained on the stored history, oldest first. Each job is predicted from the jobs
/// stored before it and then learned with that prediction's estimates, as it was live, so the
/// spread calibration and the selection rules' records are rebuilt too (they would stay at
/// their initial values with `observe`).
fn predictor_from_history(history: &[JobHistoryRecord]) -> RuntimePredictor {
    let mut predictor = RuntimePredictor::default();
    for r in history {
        let features = job_features(&r.features);
        let (_, submitted) = predictor.predict_with_submitted(&features);
        predictor.observe_submitted(&features, r.runtime_s, &submitted);
    }
    predictor
}

impl ActorThreeSigma {
    fn new(history: &[JobHistoryRecord], cycle_ms: u64, default_runtime_s: f64) -> Self {
        ActorThreeSigma {
            predictor: predictor_from_history(history),
            submitted: HashMap::new(),
            unsaved: Vec::new(),
            cycle_ms,
            default_runtime_s,
        }
    }

    /// Keep what 3σPredict estimated for the job the core accepted under `ask_key`.
    pub(super) fn remember_submission(&mut self, ask_key: u64, estimates: SubmittedEstimates) {
        self.submitted.insert(ask_key, estimates);
    }

    /// Drop the submissions of jobs the core no longer holds and that will never complete
    /// (withdrawn, expired, their app gone).
    fn forget_jobs_not_in(&mut self, held: &HashSet<u64>) {
        self.submitted.retain(|key, _| held.contains(key));
    }

    /// Learn a finished job's runtime against what was estimated at its submission.
    fn learn(&mut self, job: &CompletedJob) {
        let features = job_features(&job.features);
        match self.submitted.remove(&job.ask_key) {
            Some(submitted) => {
                self.predictor
                    .observe_submitted(&features, job.runtime_s, &submitted)
            }
            // Submitted before a restart: its estimates were not kept.
            None => self.predictor.observe(&features, job.runtime_s),
        }
    }

    /// The belief 3σSched plans `description` with, where it came from, and what 3σPredict
    /// estimated (to keep with the job if the core accepts it).
    pub(super) fn belief(
        &self,
        description: &JobDescription,
        runtime_estimate_ms: Option<u64>,
    ) -> (RuntimeBelief, String, SubmittedEstimates) {
        let features = job_features(&description.features);
        let (prediction, submitted) = self.predictor.predict_with_submitted(&features);
        if let Some(p) = prediction
            && let Some(b) = belief_of(&p.distribution, 0.1)
        {
            return (
                b,
                format!(
                    "3σPredict: {}={} ({} runs, {})",
                    p.expert.feature,
                    p.expert.value,
                    p.expert.observations,
                    p.expert.estimator.name()
                ),
                submitted,
            );
        }
        if let Some(ms) = runtime_estimate_ms.filter(|ms| *ms > 0)
            && let Ok(b) = RuntimeBelief::point(ms as f64 / 1000.0)
        {
            return (
                b,
                "runtime_estimate_ms of the ask (no history yet)".into(),
                submitted,
            );
        }
        (
            RuntimeBelief::point(self.default_runtime_s).expect("validated positive"),
            "the default runtime (no history, no runtime_estimate_ms)".into(),
            submitted,
        )
    }
}

impl GuarantorActor {
    /// Plan asks with a job description with 3σSched (before nodes join); 3σPredict starts
    /// from the job history in the store.
    pub fn with_threesigma(
        mut self,
        config: &LiveThreeSigmaConfig,
    ) -> Result<GuarantorActor, String> {
        let live = LiveThreeSigma::new(config.clone())?;
        let history = self
            .store
            .job_history()
            .map_err(|e| format!("reading the 3Sigma job history: {e}"))?;
        let threesigma = ActorThreeSigma::new(&history, config.cycle_ms, config.default_runtime_s);
        info!(
            cycle_ms = config.cycle_ms,
            history = history.len(),
            spread = threesigma.predictor.spread(),
            "3Sigma scheduling on; 3σPredict loaded the job history"
        );
        self.threesigma = Some(threesigma);
        let core = std::mem::replace(
            &mut self.core,
            scheduler_core::guarantor::Guarantor::new(
                Default::default(),
                Box::new(scheduler_core::guarantor::QueueableAware::default()),
                0,
            ),
        );
        self.core = core.with_threesigma(live);
        Ok(self)
    }

    /// Start the periodic cycle (from `Actor::started`).
    pub(super) fn start_threesigma_timer(&self, ctx: &mut Context<Self>) {
        if let Some(t) = &self.threesigma {
            let every = std::time::Duration::from_millis(t.cycle_ms.max(1));
            ctx.run_interval(every, |act, ctx| act.threesigma_tick(ctx));
        }
    }

    /// Learn from and persist the 3Sigma jobs that finished (once per cycle: one store write).
    pub(super) fn flush_completed_jobs(&mut self) {
        let completed = self.core.take_completed_jobs();
        let Some(t) = &mut self.threesigma else {
            return;
        };
        for job in completed {
            if job.aborted {
                t.submitted.remove(&job.ask_key);
                debug!(job = %job.job_id, "3Sigma job ended without all containers started: not learned from");
                continue;
            }
            match job.slo_met {
                Some(true) => self.metrics.threesigma_slo_met.inc(),
                Some(false) => self.metrics.threesigma_slo_missed.inc(),
                None => 0,
            };
            t.learn(&job);
            t.unsaved.push(JobHistoryRecord {
                features: job.features,
                runtime_s: job.runtime_s,
                finish_ms: job.finish_ms,
                app_id: job.app_id.to_string(),
                slo_met: job.slo_met,
            });
        }
        // Jobs that ended without completing leave their submission behind: prune when the
        // map holds more than the core's jobs (rare: a withdrawn or abandoned job).
        if t.submitted.len() > self.core.threesigma_jobs() {
            t.forget_jobs_not_in(&self.core.threesigma_job_keys());
        }
        if !t.unsaved.is_empty() {
            match self.store.append_job_history(&t.unsaved) {
                Ok(()) => t.unsaved.clear(),
                Err(e) => {
                    // Kept and retried next cycle (bounded: the oldest unsaved are dropped).
                    warn!("cannot store the 3Sigma job history, retrying next cycle: {e}");
                    let max = crate::store::MAX_JOB_HISTORY;
                    if t.unsaved.len() > max {
                        let drop = t.unsaved.len() - max;
                        t.unsaved.drain(..drop);
                    }
                }
            }
        }
    }

    /// One cycle if due: snapshot here, solve on a blocking thread (the actor keeps handling
    /// messages), enact on return against the books as they are then.
    fn threesigma_tick(&mut self, ctx: &mut Context<Self>) {
        self.flush_completed_jobs();
        let now_ms = self.clock.now_ms();
        self.metrics
            .threesigma_pending_jobs
            .set(self.core.threesigma_pending() as i64);
        if !self.core.threesigma_due(now_ms) {
            return;
        }
        if !self.reserve(self.core.threesigma_pending_containers()) {
            return;
        }
        let Some(cycle) = self.core.prepare_threesigma_cycle(now_ms) else {
            return;
        };
        let started = std::time::Instant::now();
        let solve = tokio::task::spawn_blocking(move || cycle.solve());
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(solve).map(move |solved, act, _| {
                act.metrics
                    .threesigma_cycle_seconds
                    .observe(started.elapsed().as_secs_f64());
                let solved = match solved {
                    Ok(s) => s,
                    Err(e) => {
                        error!("3Sigma solve failed, a new solver takes over: {e}");
                        act.core.reset_threesigma_solver();
                        return;
                    }
                };
                let (placements, report) =
                    act.core.apply_threesigma_cycle(solved, act.clock.now_ms());
                let r = &report.record;
                act.metrics.threesigma_columns.set(r.columns as i64);
                act.metrics.threesigma_rows.set(r.rows as i64);
                act.metrics
                    .threesigma_pending_jobs
                    .set(report.pending_jobs as i64);
                if let Some(bound) = r.lp_bound.filter(|b| *b > 0.0) {
                    act.metrics
                        .threesigma_solution_over_bound
                        .set(r.objective / bound);
                }
                if report.started_jobs > 0 || report.not_enacted > 0 {
                    info!(
                        started = report.started_jobs,
                        deferred = report.deferred_jobs,
                        not_enacted = report.not_enacted,
                        pending = report.pending_jobs,
                        method = ?r.method,
                        columns = r.columns,
                        "3Sigma cycle"
                    );
                }
                act.deliver(placements);
                act.report_limits();
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::threesigma::Utility;
    use scheduler_core::{AppId, JobId, Resources};

    fn features(name: &str) -> Vec<(String, String)> {
        vec![
            ("user".to_string(), "alice".to_string()),
            ("name".to_string(), name.to_string()),
        ]
    }

    /// Runtimes that spread well beyond one feature value's history, so the intervals given at
    /// submission miss often and the calibration must widen them.
    fn history(jobs: usize) -> Vec<JobHistoryRecord> {
        (0..jobs)
            .map(|i| JobHistoryRecord {
                features: features("etl"),
                runtime_s: if i % 3 == 0 { 5.0 } else { 40.0 + i as f64 },
                finish_ms: i as u64 * 1000,
                app_id: "app".into(),
                slo_met: None,
            })
            .collect()
    }

    fn description() -> JobDescription {
        JobDescription {
            utility: Utility::Slo {
                deadline: 100.0,
                value: 1.0,
            },
            features: features("etl"),
            gang: 1,
            container: Resources::new(1000, 256),
            required: Vec::new(),
            preferred: Vec::new(),
            non_preferred_slowdown: 1.5,
        }
    }

    fn completed(ask_key: u64, runtime_s: f64) -> CompletedJob {
        CompletedJob {
            app_id: AppId::new("app"),
            job_id: JobId::new("j"),
            ask_key,
            features: features("etl"),
            submit_ms: 0,
            start_ms: 0,
            finish_ms: (runtime_s * 1000.0) as u64,
            runtime_s,
            slo_met: Some(true),
            utility_earned: 1.0,
            aborted: false,
        }
    }

    #[test]
    fn the_stored_history_rebuilds_the_spread_calibration_not_only_the_histories() {
        let records = history(60);
        let replayed = predictor_from_history(&records);
        let mut observed_only = RuntimePredictor::default();
        for r in &records {
            observed_only.observe(&job_features(&r.features), r.runtime_s);
        }
        assert_eq!(observed_only.spread(), 1.0, "observe never calibrates");
        assert!(
            replayed.spread() > 1.0,
            "intervals that missed a third of outcomes must widen: spread {}",
            replayed.spread()
        );
    }

    #[test]
    fn a_finished_job_is_learned_against_the_estimates_of_its_submission() {
        let mut t = ActorThreeSigma::new(&history(30), 1000, 60.0);
        let (_, source, estimates) = t.belief(&description(), None);
        assert!(source.starts_with("3σPredict"), "{source}");
        t.remember_submission(7, estimates);
        let before = t.predictor.spread();
        // Far outside any interval the history gives: the spread must grow.
        t.learn(&completed(7, 5000.0));
        assert!(t.submitted.is_empty(), "the submission is consumed");
        assert!(
            t.predictor.spread() > before,
            "{} -> {}",
            before,
            t.predictor.spread()
        );
    }

    #[test]
    fn the_live_belief_keeps_both_tails_of_the_predicted_distribution() {
        let t = ActorThreeSigma::new(&history(30), 1000, 60.0);
        let (belief, source, _) = t.belief(&description(), None);
        assert!(source.starts_with("3σPredict"), "{source}");
        let predicted = t
            .predictor
            .predict(&job_features(&features("etl")))
            .expect("history gives a prediction")
            .distribution;
        let (lo, hi) = (predicted.quantile(0.0), predicted.quantile(1.0));
        // Mid-bin quantiles stop at the 2.5th and 97.5th percentiles.
        assert!(
            (belief.max() - hi).abs() <= 1e-9 * hi,
            "{} vs {hi}",
            belief.max()
        );
        assert!(
            (belief.min() - lo.max(0.1)).abs() <= 1e-9 * hi,
            "{} vs {lo}",
            belief.min()
        );
        assert!(belief.survival(predicted.quantile(0.99)) > 0.0);
    }

    #[test]
    fn submissions_of_jobs_the_core_no_longer_holds_are_forgotten() {
        let mut t = ActorThreeSigma::new(&[], 1000, 60.0);
        for key in 0..10 {
            let (_, _, estimates) = t.belief(&description(), Some(1000));
            t.remember_submission(key, estimates);
        }
        t.forget_jobs_not_in(&HashSet::from([3, 4]));
        let mut kept: Vec<u64> = t.submitted.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![3, 4]);
        // A job finished after a restart (no kept submission) is still learned from.
        let seen = t.predictor.feature_values();
        t.learn(&completed(99, 12.0));
        assert!(t.predictor.feature_values() > seen);
    }
}

//! The guarantor actor's 3Sigma part (issue 13, live): beliefs from 3σPredict for asks that
//! describe their job, the periodic cycle solved off the actor's thread, and the history of
//! finished jobs persisted in the store so predictions survive a restart.

use super::GuarantorActor;
use crate::store::JobHistoryRecord;
use actix::prelude::*;
use inference::predictor::{JobFeatures, RuntimePredictor};
use scheduler_core::threesigma::{
    JobDescription, LiveThreeSigma, LiveThreeSigmaConfig, RuntimeBelief,
};
use tracing::{debug, error, info, warn};

/// Equally likely runtimes a 3σPredict distribution is handed to 3σSched as (3Sigma §4.1's
/// piecewise distribution at the midpoints of this many bins).
pub const BELIEF_QUANTILES: usize = 20;

/// The 3Sigma state the actor keeps beside the core: the predictor and finished jobs not yet
/// written to the store.
pub(super) struct ActorThreeSigma {
    pub(super) predictor: RuntimePredictor,
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

impl ActorThreeSigma {
    /// The belief 3σSched plans `description` with, and where it came from.
    pub(super) fn belief(
        &self,
        description: &JobDescription,
        runtime_estimate_ms: Option<u64>,
    ) -> (RuntimeBelief, String) {
        let features = job_features(&description.features);
        if let Some(p) = self.predictor.predict(&features) {
            let levels: Vec<f64> = (0..BELIEF_QUANTILES)
                .map(|i| (i as f64 + 0.5) / BELIEF_QUANTILES as f64)
                .collect();
            let mut q = vec![0.0; BELIEF_QUANTILES];
            p.distribution.quantiles_into(&levels, &mut q);
            let runtimes: Vec<f64> = q.into_iter().map(|r| r.max(0.1)).collect();
            if let Ok(b) = RuntimeBelief::from_runtimes(runtimes) {
                return (
                    b,
                    format!(
                        "3σPredict: {}={} ({} runs, {})",
                        p.expert.feature,
                        p.expert.value,
                        p.expert.observations,
                        p.expert.estimator.name()
                    ),
                );
            }
        }
        if let Some(ms) = runtime_estimate_ms.filter(|ms| *ms > 0)
            && let Ok(b) = RuntimeBelief::point(ms as f64 / 1000.0)
        {
            return (b, "runtime_estimate_ms of the ask (no history yet)".into());
        }
        (
            RuntimeBelief::point(self.default_runtime_s).expect("validated positive"),
            "the default runtime (no history, no runtime_estimate_ms)".into(),
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
        let mut predictor = RuntimePredictor::default();
        for r in &history {
            predictor.observe(&job_features(&r.features), r.runtime_s);
        }
        info!(
            cycle_ms = config.cycle_ms,
            history = history.len(),
            "3Sigma scheduling on; 3σPredict loaded the job history"
        );
        self.threesigma = Some(ActorThreeSigma {
            predictor,
            unsaved: Vec::new(),
            cycle_ms: config.cycle_ms,
            default_runtime_s: config.default_runtime_s,
        });
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
                debug!(job = %job.job_id, "3Sigma job ended without all containers started: not learned from");
                continue;
            }
            match job.slo_met {
                Some(true) => self.metrics.threesigma_slo_met.inc(),
                Some(false) => self.metrics.threesigma_slo_missed.inc(),
                None => 0,
            };
            t.predictor
                .observe(&job_features(&job.features), job.runtime_s);
            t.unsaved.push(JobHistoryRecord {
                features: job.features,
                runtime_s: job.runtime_s,
                finish_ms: job.finish_ms,
                app_id: job.app_id.to_string(),
                slo_met: job.slo_met,
            });
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

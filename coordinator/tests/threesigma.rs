//! 3Sigma in the live coordinator: a GUARANTEED ask with a job description is planned by the
//! guarantor's cycle and granted as a gang; its runtime goes into the store's job history, and
//! after a restart 3σPredict predicts the next job of the same features from it (`explain`
//! shows the distribution, the options and why the job waits).

mod common;

use common::*;
use coordinator::guarantor_actor::AdminGuarantor;
use scheduler_core::ContainerType;
use scheduler_core::protocol::app::{JobSpec, JobUtility};
use scheduler_core::protocol::cluster::{CoordinatorToWorker, WorkerToCoordinator};
use std::collections::BTreeMap;
use std::time::Duration;

const CYCLE_MS: u64 = 20;

fn job_ask(correlation_id: u64, deadline_ms: u64) -> WorkerToCoordinator {
    let mut msg = allocate_guaranteed(correlation_id, "demo", 1000, 1024, 2);
    if let WorkerToCoordinator::AllocateGuaranteed(a) = &mut msg {
        a.allocate.runtime_estimate_ms = None;
        a.allocate.job = Some(JobSpec {
            utility: JobUtility::Slo {
                deadline_ms,
                value: 1.0,
            },
            features: BTreeMap::from([("name".to_string(), "etl".to_string())]),
            required: vec![],
            preferred: vec![],
            non_preferred_slowdown: None,
        });
    }
    msg
}

/// Wait (bounded) until `done` holds, letting the actors run in between.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..500 {
        if done().await {
            return;
        }
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn first_run(dir: tempfile::TempDir) -> tempfile::TempDir {
    let h = Harness::start_in_with(dir, |s| {
        s.threesigma.as_mut().expect("on by default").cycle_ms = CYCLE_MS;
    })
    .await;
    let (mut w, _) = h.join("node-a", 2000, 2048).await;
    let now = h.clock.now_ms();
    w.send(&job_ask(1, now + 60_000)).await;
    let grant = match w
        .expect("the job's gang", |m| {
            matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
        })
        .await
    {
        CoordinatorToWorker::GuaranteedAllocated(g) => g,
        _ => unreachable!(),
    };
    assert_eq!(grant.containers.len(), 2, "the whole gang in one frame");
    assert_eq!(grant.remaining, 0);
    let ids: Vec<_> = grant.containers.iter().map(|c| c.container_id).collect();
    let running: Vec<_> = ids
        .iter()
        .map(|id| running(*id, ContainerType::Guaranteed, 1000, 1024))
        .collect();
    w.send(&heartbeat("node-a", 0, 1.0, running, ids.clone(), vec![]))
        .await;
    w.expect_ack().await;
    h.clock.advance(Duration::from_secs(5));
    w.send(&heartbeat("node-a", 0, 1.0, vec![], vec![], ids))
        .await;
    w.expect_ack().await;
    // The finished job is learned and stored at the next cycle tick.
    let metrics = h.server.metrics.clone();
    until("the finished job to be recorded", async || {
        metrics.threesigma_slo_met.get() == 1
    })
    .await;
    let g = h.server.guarantor.send(AdminGuarantor).await.unwrap();
    let t = g.threesigma.expect("3Sigma on");
    assert_eq!(t.attainment.slo_met, 1);
    assert_eq!(t.attainment.attainment, Some(1.0));
    assert_eq!(t.attainment.recent[0].runtime_s, 5.0);
    h.server.shutdown();
    h.dir
}

/// Node `node-a` (2 slots) joins; plain GUARANTEED work of app `demo` fills it, then `demo`'s
/// job `job-1` (a 2-container SLO job) is asked and waits until a cycle has explained it.
async fn a_job_waiting_behind_plain_work(h: &Harness) -> TestWorker {
    let (mut w, _) = h.join("node-a", 2000, 2048).await;
    w.send(&allocate_guaranteed(1, "demo", 2000, 2048, 1)).await;
    w.expect("the plain grant", |m| {
        matches!(m, CoordinatorToWorker::GuaranteedAllocated(_))
    })
    .await;
    let now = h.clock.now_ms();
    w.send(&job_ask(2, now + 60_000)).await;
    let guarantor = h.server.guarantor.clone();
    let clock = h.clock.clone();
    until("a cycle to explain the waiting job", async || {
        clock.advance(Duration::from_millis(CYCLE_MS));
        let g = guarantor.send(AdminGuarantor).await.unwrap();
        g.threesigma.is_some_and(|t| {
            t.waiting_jobs
                .first()
                .is_some_and(|j| j.cycle_at_ms.is_some())
        })
    })
    .await;
    w
}

async fn second_run(dir: tempfile::TempDir) {
    let h = Harness::start_in_with(dir, |s| {
        s.threesigma.as_mut().expect("on by default").cycle_ms = CYCLE_MS;
    })
    .await;
    let _w = a_job_waiting_behind_plain_work(&h).await;
    let g = h.server.guarantor.send(AdminGuarantor).await.unwrap();
    let job = &g.threesigma.unwrap().waiting_jobs[0];
    assert!(
        job.belief.source.starts_with("3σPredict"),
        "the prediction uses the history stored before the restart: {:?}",
        job.belief
    );
    assert!(
        (job.belief.p50_s - 5.0).abs() < 1.0,
        "predicted around the 5 s it ran: {:?}",
        job.belief
    );
    assert!(job.reason.contains("capacity"), "{}", job.reason);
    assert!(!job.options.is_empty(), "options with expected utility");
    h.server.shutdown();
}

#[test]
fn a_job_is_planned_as_a_gang_and_its_runtime_feeds_predictions_after_a_restart() {
    let dir = initialised_data_dir();
    let dir = actix_rt::System::new().block_on(first_run(dir));
    actix_rt::System::new().block_on(second_run(dir));
}

/// `explain` over the cluster protocol (what a worker forwards for an app's `explain`): the
/// asking app gets its waiting job's distribution, options and reason; another app asking for
/// the same job id gets nothing (an app sees only its own jobs); an unregistered app is refused.
#[actix_rt::test]
async fn an_app_explains_its_own_waiting_job_and_no_other_apps() {
    use scheduler_core::protocol::cluster::ExplainCall;
    let dir = tempfile::tempdir().unwrap();
    coordinator::datadir::init(
        &coordinator::datadir::DataDir::new(dir.path()),
        &[
            ("demo".to_string(), Default::default()),
            ("other".to_string(), Default::default()),
        ],
        1_700_000_000_000,
    )
    .unwrap();
    let h = Harness::start_in_with(dir, |s| {
        s.threesigma.as_mut().expect("on by default").cycle_ms = CYCLE_MS;
    })
    .await;
    let mut w = a_job_waiting_behind_plain_work(&h).await;
    let explain = |correlation_id: u64, app_id: &str| {
        WorkerToCoordinator::Explain(ExplainCall {
            correlation_id,
            app_id: app_id.into(),
            job_id: "job-1".into(),
        })
    };
    let explained = async |w: &mut TestWorker, correlation_id: u64| match w
        .expect("an explain answer", |m| match m {
            CoordinatorToWorker::Explained(d) => d.correlation_id == correlation_id,
            CoordinatorToWorker::RequestFailed(f) => f.correlation_id == correlation_id,
            _ => false,
        })
        .await
    {
        CoordinatorToWorker::Explained(d) => Ok(d.jobs),
        CoordinatorToWorker::RequestFailed(f) => Err(f.code),
        _ => unreachable!(),
    };
    w.send(&explain(10, "demo")).await;
    let jobs = explained(&mut w, 10).await.expect("answered");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].app_id.as_str(), "demo");
    assert_eq!(jobs[0].job_id.as_str(), "job-1");
    assert!(jobs[0].reason.contains("capacity"), "{}", jobs[0].reason);
    assert!(!jobs[0].options.is_empty(), "options with expected utility");
    assert!(jobs[0].belief.p90_s >= jobs[0].belief.p10_s);
    w.send(&explain(11, "other")).await;
    assert_eq!(
        explained(&mut w, 11).await.expect("answered"),
        vec![],
        "another app's job is not shown"
    );
    w.send(&explain(12, "ghost")).await;
    assert_eq!(
        explained(&mut w, 12).await,
        Err(scheduler_core::protocol::app::ErrorCode::BadCredentials)
    );
    h.server.shutdown();
}

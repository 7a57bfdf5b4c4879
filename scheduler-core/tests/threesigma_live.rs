//! 3σSched in the live guarantor: asks with a job description are planned by the cycle, mapped
//! to concrete nodes (whole gang or nothing, never over-committing), explained while they wait,
//! and reported complete with their runtime when their last container ends.

mod common;

use common::guaranteed_ask;
use scheduler_core::guarantor::{
    BestFit, GuaranteedPlacer, Guarantor, GuarantorConfig, GuarantorError, QueueableAware,
    QueueableLoad,
};
use scheduler_core::threesigma::{
    JobDescription, LiveThreeSigma, LiveThreeSigmaConfig, NodeConstraint, RuntimeBelief, Utility,
};
use scheduler_core::{NodeId, Resources};
use std::collections::BTreeMap;

const NOW_MS: u64 = 1_000_000;
const NOW_S: f64 = 1_000.0;

fn slot() -> Resources {
    Resources::new(1000, 1024)
}

fn guarantor(config: LiveThreeSigmaConfig) -> Guarantor {
    Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0)
        .with_threesigma(LiveThreeSigma::new(config).expect("valid config"))
}

fn description(utility: Utility, gang: u32) -> JobDescription {
    JobDescription {
        utility,
        features: vec![("user".into(), "app".into())],
        gang,
        container: slot(),
        required: vec![],
        preferred: vec![],
        non_preferred_slowdown: 1.5,
    }
}

fn best_effort() -> Utility {
    Utility::BestEffort {
        submit: NOW_S,
        value: 1.0,
        zero_at: NOW_S + 100.0,
    }
}

fn slo(deadline_in_s: f64) -> Utility {
    Utility::Slo {
        deadline: NOW_S + deadline_in_s,
        value: 1.0,
    }
}

/// One 2-slot node; a best-effort job and an SLO job of 2 containers each, both believed to run
/// 10 s. Returns the job ids started by the first cycle.
fn first_cycle_starts(slo_deadline_in_s: f64) -> (Vec<u64>, Guarantor) {
    let mut g = guarantor(LiveThreeSigmaConfig::default());
    g.add_node(NodeId::from("n1"), "r".into(), Resources::new(2000, 2048));
    let belief = RuntimeBelief::from_runtimes(vec![9.0, 10.0]).unwrap();
    g.submit_job(
        guaranteed_ask(1, slot(), 2),
        description(best_effort(), 2),
        belief.clone(),
        "test".into(),
        NOW_MS,
    )
    .unwrap();
    g.submit_job(
        guaranteed_ask(2, slot(), 2),
        description(slo(slo_deadline_in_s), 2),
        belief,
        "test".into(),
        NOW_MS,
    )
    .unwrap();
    assert!(g.threesigma_due(NOW_MS));
    let (placements, report) = g.run_threesigma_cycle(NOW_MS).expect("a cycle ran");
    assert_eq!(report.not_enacted, 0);
    g.check_invariants().unwrap();
    let mut started: Vec<u64> = placements.iter().map(|p| p.ask_key).collect();
    started.dedup();
    (started, g)
}

#[test]
fn an_slo_job_goes_first_only_when_its_distribution_says_it_must() {
    // Loose deadline: the SLO job still meets it after the best-effort job, whose value decays.
    let (started, g) = first_cycle_starts(60.0);
    assert_eq!(
        started,
        vec![1],
        "best effort first when the deadline allows"
    );
    let waiting = g.explain_jobs(Some("2"), 10);
    assert_eq!(waiting.len(), 1);
    let e = &waiting[0];
    assert!(e.reason.contains("better-valued job"), "{}", e.reason);
    assert!(e.reason.contains("planned to start in"), "{}", e.reason);
    assert!(e.options.iter().any(|o| o.chosen && o.start_in_s > 0.0));
    assert!((e.belief.p50_s - 9.0).abs() < 1.5, "{:?}", e.belief);
    // Tight deadline: only starting now meets it.
    let (started, g) = first_cycle_starts(15.0);
    assert_eq!(started, vec![2], "the SLO job first when it must");
    let e = &g.explain_jobs(Some("1"), 10)[0];
    assert!(e.reason.contains("ask 2"), "{}", e.reason);
}

#[test]
fn a_finished_job_reports_its_runtime_and_deadline_outcome() {
    let (started, mut g) = first_cycle_starts(15.0);
    assert_eq!(started, vec![2]);
    let granted: Vec<_> = g.nodes().map(|n| n.guaranteed).collect::<Vec<_>>();
    assert_eq!(granted, vec![Resources::new(2000, 2048)]);
    // The containers are started, then end 12 s later.
    let ids: Vec<_> = (1..=2)
        .map(|seq| scheduler_core::ContainerId::new(0, seq))
        .collect();
    for id in &ids {
        assert!(g.is_guaranteed(*id));
        g.on_started(*id);
    }
    assert!(g.schedule(NOW_MS + 12_000).is_empty());
    g.on_finished(ids[0]);
    assert!(
        g.take_completed_jobs().is_empty(),
        "one container still runs"
    );
    g.on_finished(ids[1]);
    let done = g.take_completed_jobs();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].runtime_s, 12.0);
    assert_eq!(done[0].slo_met, Some(true));
    assert!(!done[0].aborted);
    let a = g.slo_attainment().unwrap();
    assert_eq!((a.slo_met, a.slo_missed, a.attainment), (1, 0, Some(1.0)));
    // The best-effort job now fits and starts at the next cycle.
    let (placements, _) = g.run_threesigma_cycle(NOW_MS + 13_000).unwrap();
    assert_eq!(placements.len(), 2);
    assert!(placements.iter().all(|p| p.ask_key == 1));
    g.check_invariants().unwrap();
}

#[test]
fn constraints_pick_the_nodes_and_a_gang_never_over_commits() {
    let mut g = guarantor(LiveThreeSigmaConfig::default());
    for (name, gpu) in [("a", false), ("b", true), ("c", true)] {
        g.add_node(NodeId::from(name), "r".into(), Resources::new(2000, 2048));
        let mut attributes = BTreeMap::new();
        attributes.insert(
            "gpu".to_string(),
            if gpu { "yes" } else { "no" }.to_string(),
        );
        g.set_node_attributes(&NodeId::from(name), attributes);
    }
    let mut d = description(slo(30.0), 3);
    d.required = vec![NodeConstraint {
        key: "gpu".into(),
        values: vec!["yes".into()],
    }];
    let belief = RuntimeBelief::point(5.0).unwrap();
    g.submit_job(
        guaranteed_ask(7, slot(), 3),
        d.clone(),
        belief.clone(),
        "t".into(),
        NOW_MS,
    )
    .unwrap();
    let (placements, report) = g.run_threesigma_cycle(NOW_MS).unwrap();
    assert_eq!(
        placements.len(),
        3,
        "{report:?} {:?}",
        g.explain_jobs(None, 5)
    );
    assert!(
        placements
            .iter()
            .all(|p| p.token_body.node_id.as_str() != "a"),
        "only gpu nodes"
    );
    g.check_invariants().unwrap();
    // A second gang of 3 on the gpu nodes does not fit now (one slot left): nothing granted.
    g.submit_job(guaranteed_ask(8, slot(), 3), d, belief, "t".into(), NOW_MS)
        .unwrap();
    let (placements, _) = g.run_threesigma_cycle(NOW_MS + 1_000).unwrap();
    assert!(placements.is_empty());
    let e = &g.explain_jobs(Some("8"), 1)[0];
    assert!(e.reason.contains("capacity"), "{}", e.reason);
    g.check_invariants().unwrap();
}

/// A job the cycle starts lands where the guarantor's placer puts a plain GUARANTEED container:
/// with the QUEUEABLE-aware placer, on the node where it preempts no running QUEUEABLE work,
/// not on the tighter fit that would kill a QUEUEABLE container for it (what plain best fit
/// over the members did before).
#[test]
fn a_started_job_goes_where_the_placer_preempts_no_queueable_work() {
    let nodes = |g: &mut Guarantor| {
        g.add_node(NodeId::from("busy"), "r".into(), Resources::new(2000, 2048));
        g.add_node(NodeId::from("idle"), "r".into(), Resources::new(3000, 3072));
        g.report_queueable_load(
            &NodeId::from("busy"),
            QueueableLoad {
                running: Resources::new(2000, 2048),
                queued_count: 0,
            },
        );
    };
    for (placer, expected) in [
        (
            Box::new(QueueableAware::default()) as Box<dyn GuaranteedPlacer>,
            "idle",
        ),
        (Box::new(BestFit), "busy"),
    ] {
        let name = placer.name();
        let mut g = Guarantor::new(GuarantorConfig::default(), placer, 0)
            .with_threesigma(LiveThreeSigma::new(LiveThreeSigmaConfig::default()).unwrap());
        nodes(&mut g);
        g.submit_job(
            guaranteed_ask(1, slot(), 1),
            description(best_effort(), 1),
            RuntimeBelief::point(5.0).unwrap(),
            "t".into(),
            NOW_MS,
        )
        .unwrap();
        let (placements, report) = g.run_threesigma_cycle(NOW_MS).unwrap();
        assert_eq!(placements.len(), 1, "{name}: {report:?}");
        assert_eq!(
            placements[0].token_body.node_id.as_str(),
            expected,
            "{name}"
        );
        g.check_invariants().unwrap();
        // A plain GUARANTEED ask goes the same way.
        let mut plain = Guarantor::new(
            GuarantorConfig::default(),
            if name == "best-fit" {
                Box::new(BestFit) as Box<dyn GuaranteedPlacer>
            } else {
                Box::new(QueueableAware::default())
            },
            0,
        );
        nodes(&mut plain);
        plain.submit(guaranteed_ask(2, slot(), 1)).unwrap();
        let granted = plain.schedule(NOW_MS);
        assert_eq!(granted.len(), 1, "{name}");
        assert_eq!(granted[0].token_body.node_id.as_str(), expected, "{name}");
    }
}

/// `explain` for an app (the app protocol's) lists only that app's jobs of the id it names, and
/// its reason counts the other jobs that took the room where the operator's names them.
#[test]
fn an_apps_explanation_shows_its_own_jobs_and_only_counts_others() {
    let (_, g) = first_cycle_starts(10.0);
    // Both jobs are app "app"'s, id "j": the SLO job (ask 2) started, the best-effort job
    // (ask 1) waits behind it.
    let operator = g.explain_jobs(Some("1"), 1);
    assert_eq!(operator.len(), 1);
    assert!(
        operator[0].reason.contains("ask 2"),
        "the operator sees which job took the room: {}",
        operator[0].reason
    );
    let own = g.explain_app_jobs("app", "j", 16);
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(own[0].ask_key, 1);
    assert!(
        own[0].reason.contains("1 other job") && !own[0].reason.contains("ask "),
        "the app is told how many, not which: {}",
        own[0].reason
    );
    assert!(g.explain_app_jobs("other-app", "j", 16).is_empty());
    assert!(
        g.explain_app_jobs("app", "1", 16).is_empty(),
        "by job id, not ask key"
    );
}

#[test]
fn bad_jobs_and_a_full_queue_are_refused_by_name() {
    let mut g = guarantor(LiveThreeSigmaConfig {
        max_pending_jobs: 1,
        ..Default::default()
    });
    g.add_node(NodeId::from("n"), "r".into(), Resources::new(1000, 1024));
    let belief = RuntimeBelief::point(5.0).unwrap();
    let e = g
        .submit_job(
            guaranteed_ask(1, slot(), 2),
            description(slo(10.0), 1),
            belief.clone(),
            "t".into(),
            NOW_MS,
        )
        .unwrap_err();
    assert!(e.to_string().contains("gang"), "{e}");
    g.submit_job(
        guaranteed_ask(1, slot(), 1),
        description(slo(10.0), 1),
        belief.clone(),
        "t".into(),
        NOW_MS,
    )
    .unwrap();
    let e = g
        .submit_job(
            guaranteed_ask(2, slot(), 1),
            description(slo(10.0), 1),
            belief,
            "t".into(),
            NOW_MS,
        )
        .unwrap_err();
    assert!(matches!(e, GuarantorError::JobQueueFull { max: 1 }), "{e}");
    assert!(e.retryable());
    // Cancelling the ask drops the waiting job.
    assert_eq!(g.cancel(1), 1);
    assert_eq!(g.threesigma_pending(), 0);
}

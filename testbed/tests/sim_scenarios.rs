//! Small simulator scenarios: determinism, invariants (checked after every step in debug
//! builds), and the basic Mercury effect that QUEUEABLE placement beats heartbeat-driven central
//! allocation on short tasks.

use scheduler_core::Resources;
use scheduler_core::coordinator::SheddingPolicy;
use scheduler_core::hybrid_gq::HybridGq;
use testbed::sim::{self, EstimateModel, GuaranteedAllocation, SimConfig, SimReport};
use testbed::workload::{Arrivals, Generator};

fn small(seed: u64, policy: HybridGq) -> SimConfig {
    let mut c = SimConfig::mercury_cluster(seed, policy);
    c.nodes = 16;
    c.node_capacity = Resources::new(4_000, 16_384);
    c.top_k = 5;
    c.max_concurrent_jobs = 6;
    c.job_manager_hosts = 4;
    c.duration_ms = Some(120_000);
    c.warmup_ms = 10_000;
    c.check_invariants = true;
    c
}

fn run(config: SimConfig, generator: Generator) -> SimReport {
    let stream = generator.stream(config.seed, Arrivals::Backlog);
    sim::run(config, &generator.name(), stream).expect("valid configuration")
}

#[test]
fn same_seed_gives_an_identical_report_and_another_seed_does_not() {
    let policy: HybridGq = "<10sec-70%-Q".parse().unwrap();
    let mut config = small(7, policy);
    config.shedding = SheddingPolicy::MeanPlusSigma { n: 1.0 };
    config.reorder_by_job_submit_time = true;
    let a = SimReport::without_timings(run(config.clone(), Generator::SyntheticHybrid));
    let b = SimReport::without_timings(run(config.clone(), Generator::SyntheticHybrid));
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    assert!(a.tasks_completed > 0 && a.guaranteed_containers > 0 && a.queueable_containers > 0);
    config.seed = 8;
    let c = SimReport::without_timings(run(config, Generator::SyntheticHybrid));
    assert_ne!(a.tasks_completed, c.tasks_completed);
    assert_eq!(a.seed, 7);
    assert_eq!(a.config.policy_label, "<10sec-70%-Q");
}

#[test]
fn the_coordinators_share_of_heartbeats_is_counted_and_sampled() {
    let policy: HybridGq = "<10sec-70%-Q".parse().unwrap();
    let config = small(3, policy);
    let (nodes, interval_ms) = (config.nodes as u64, config.heartbeat_interval_ms);
    let duration_ms = config.duration_ms.unwrap();
    let cost = run(config, Generator::SyntheticHybrid).coordinator_cost;
    // Every node heartbeats once per interval (idle heartbeats are not elided here), and the
    // coordinator computes one round per interval.
    let intervals = duration_ms / interval_ms;
    assert!(
        cost.heartbeats >= nodes * (intervals - 1) && cost.heartbeats <= nodes * (intervals + 1),
        "{} heartbeats from {nodes} nodes over {intervals} intervals",
        cost.heartbeats
    );
    assert!(cost.rounds >= intervals - 1 && cost.rounds <= intervals + 1);
    assert_eq!(
        cost.heartbeats_timed,
        cost.heartbeats / sim::CoordinatorCost::SAMPLE_EVERY
    );
    assert!(cost.heartbeat_ns > 0.0 && cost.round_ns > 0.0);
    assert!(cost.ns_per_heartbeat > cost.heartbeat_ns);
    let zeroed = SimReport::without_timings(run(small(3, policy), Generator::SyntheticHybrid));
    assert_eq!(zeroed.coordinator_cost.heartbeats, cost.heartbeats);
    assert_eq!(zeroed.coordinator_cost.ns_per_heartbeat, 0.0);
}

#[test]
fn only_queueable_beats_heartbeat_driven_only_guaranteed_on_short_tasks() {
    let g = run(small(1, HybridGq::ONLY_G), Generator::Microbenchmark);
    let q = run(small(1, HybridGq::ONLY_Q), Generator::Microbenchmark);
    assert_eq!(g.queueable_containers, 0);
    assert_eq!(q.guaranteed_containers, 0);
    assert!(
        q.task_throughput > 1.3 * g.task_throughput,
        "only-Q {} vs only-G {}",
        q.task_throughput,
        g.task_throughput
    );
    // With 3 s heartbeats and ~1.2 s tasks, the central scheduler leaves slots idle.
    assert!(g.cpu_utilization < 0.6, "{}", g.cpu_utilization);
    assert!(q.cpu_utilization > 0.8, "{}", q.cpu_utilization);
}

#[test]
fn event_driven_guarantor_beats_heartbeat_allocation_and_all_jobs_drain() {
    let mut hb = small(3, HybridGq::ONLY_G);
    hb.duration_ms = None;
    let mut ev = hb.clone();
    ev.guaranteed_allocation = GuaranteedAllocation::EventDriven;
    let jobs = || {
        Generator::Microbenchmark
            .stream(3, Arrivals::Backlog)
            .take(20)
            .collect::<Vec<_>>()
    };
    let hb = sim::run(hb, "micro-20", testbed::workload::from_jobs(jobs())).unwrap();
    let ev = sim::run(ev, "micro-20", testbed::workload::from_jobs(jobs())).unwrap();
    assert_eq!(hb.jobs_completed, 20);
    assert_eq!(ev.jobs_completed, 20);
    assert_eq!(hb.tasks_completed, 20 * 200);
    assert!(
        ev.simulated_s < hb.simulated_s,
        "{} vs {}",
        ev.simulated_s,
        hb.simulated_s
    );
}

#[test]
fn guaranteed_work_preempts_queueable_work_and_shedding_discards_queued_work() {
    // Half the tasks GUARANTEED on a busy cluster: G arrivals kill running Q containers when
    // policing is off; shedding with stragglers discards queued ones.
    let mut config = small(5, "50%-Q".parse().unwrap());
    config.policing = false;
    config.shedding = SheddingPolicy::MeanPlusSigma { n: 1.0 };
    config.stragglers = Some(sim::Stragglers {
        fraction: 0.25,
        slowdown: 3.0,
    });
    let r = run(config, Generator::SyntheticHybrid);
    assert!(r.queueable_killed > 0, "{r:?}");
    assert!(r.queueable_shed > 0, "{r:?}");
    assert!(r.tasks_completed > 0);
}

#[test]
fn eliding_idle_heartbeats_gives_the_same_outcome_on_a_light_load() {
    // Light open-loop load: nodes go idle between jobs, so many heartbeats are elided.
    for allocation in [
        GuaranteedAllocation::OnHeartbeat,
        GuaranteedAllocation::EventDriven,
    ] {
        let mut config = small(11, "<10sec-70%-Q".parse().unwrap());
        config.guaranteed_allocation = allocation;
        config.shedding = SheddingPolicy::MeanPlusSigma { n: 1.0 };
        // More job-manager hosts than concurrent jobs: hosts are first used after idle periods.
        config.job_manager_hosts = 12;
        config.duration_ms = Some(300_000);
        let stream =
            || Generator::ProductionLike.stream(11, Arrivals::Poisson { jobs_per_s: 0.05 });
        config.elide_idle_heartbeats = true;
        let mut full = config.clone();
        full.elide_idle_heartbeats = false;
        let elided = sim::run(config, "light", stream()).unwrap();
        let full = sim::run(full, "light", stream()).unwrap();
        assert!(
            elided.events < full.events,
            "{} vs {}",
            elided.events,
            full.events
        );
        let key = |r: &SimReport| {
            (
                r.tasks_completed,
                r.jobs_completed,
                r.queueable_killed,
                r.queueable_shed,
                serde_json::to_string(&r.job_latency_s).unwrap(),
            )
        };
        assert_eq!(key(&elided), key(&full), "{allocation:?}");
        assert!(
            elided.jobs_completed > 0 && elided.tasks_completed > 100,
            "{elided:?}"
        );
    }
}

#[test]
fn predicted_estimates_learn_recurring_jobs_and_steer_the_hybrid_policy() {
    // <10sec-Q with every short task QUEUEABLE: the container type follows the estimate alone.
    let policy = HybridGq::new(Some(10_000), 1.0).unwrap();
    let mut config = small(5, policy);
    config.duration_ms = Some(1_800_000);
    config.estimate = EstimateModel::Predicted;
    let predicted = run(config.clone(), Generator::SyntheticHybrid);
    let accuracy = predicted.estimates.clone().expect("accuracy is reported");
    // Jobs admitted before any job finished have no history to go on; the rest are estimated
    // from the two recurring programs' own histories.
    assert!(accuracy.jobs > 30, "{accuracy:?}");
    assert!(
        accuracy.estimated + config.max_concurrent_jobs as u64 >= accuracy.jobs,
        "{accuracy:?}"
    );
    assert!(
        accuracy.estimated > 0 && accuracy.within_2x > 0.8,
        "{accuracy:?}"
    );
    // Unestimated jobs are treated as long (GUARANTEED); estimated 2 s jobs go QUEUEABLE.
    assert!(predicted.guaranteed_containers > 0 && predicted.queueable_containers > 0);
    let again = run(config.clone(), Generator::SyntheticHybrid);
    assert_eq!(
        serde_json::to_string(&SimReport::without_timings(predicted.clone())).unwrap(),
        serde_json::to_string(&SimReport::without_timings(again)).unwrap()
    );

    config.estimate = EstimateModel::Exact;
    let exact = run(config, Generator::SyntheticHybrid);
    assert!(
        exact.estimates.is_none(),
        "only predicted runs report accuracy"
    );
    // Knowing every estimate from the start, a smaller share of the containers is GUARANTEED
    // (a share: the runs complete different numbers of jobs, so counts are not comparable).
    let guaranteed_share = |r: &SimReport| {
        r.guaranteed_containers as f64 / (r.guaranteed_containers + r.queueable_containers) as f64
    };
    assert!(
        guaranteed_share(&exact) < guaranteed_share(&predicted),
        "exact {} of {} vs predicted {} of {}",
        exact.guaranteed_containers,
        exact.guaranteed_containers + exact.queueable_containers,
        predicted.guaranteed_containers,
        predicted.guaranteed_containers + predicted.queueable_containers,
    );
}

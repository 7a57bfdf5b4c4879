use super::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// §4.3.4's example: one node, start times 0, 2.5, …, 17.5.
fn paper_config() -> ThreeSigmaConfig {
    ThreeSigmaConfig {
        step_s: 2.5,
        starts: 8,
        ..ThreeSigmaConfig::default()
    }
}

fn one_partition(capacity: f64) -> Vec<PartitionState> {
    vec![PartitionState {
        capacity,
        reserved: vec![],
    }]
}

fn job(id: u64, utility: Utility, runtimes: &[f64], gang: u32) -> PendingJob {
    PendingJob {
        id,
        submit: 0.0,
        utility,
        gang,
        belief: RuntimeBelief::from_runtimes(runtimes.to_vec()).unwrap(),
        choices: vec![PartitionChoice {
            partition: 0,
            runtime_factor: 1.0,
        }],
    }
}

fn be(id: u64, runtimes: &[f64]) -> PendingJob {
    job(
        id,
        Utility::BestEffort {
            submit: 0.0,
            value: 1.0,
            zero_at: 40.0,
        },
        runtimes,
        1,
    )
}

fn slo(id: u64, runtimes: &[f64]) -> PendingJob {
    job(
        id,
        Utility::Slo {
            deadline: 15.0,
            value: 1.0,
        },
        runtimes,
        1,
    )
}

#[test]
fn the_model_of_the_papers_example_has_the_papers_coefficients() {
    // Scenario 1: runtime U(0, 10) as four equally likely runtimes.
    let u = [2.5, 5.0, 7.5, 10.0];
    let pending = vec![slo(1, &u), be(2, &u)];
    let partitions = one_partition(1.0);
    let input = CycleInput {
        now: 0.0,
        partitions: &partitions,
        pending: &pending,
        running: &[],
    };
    let cycle = build_model(&paper_config(), &input);
    let model = &cycle.model;
    // 8 capacity rows + 2 one-option rows.
    assert_eq!(model.rows.len(), 10);
    let slo_values: Vec<f64> = model
        .columns
        .iter()
        .filter(|c| matches!(c.kind, ColumnKind::Option { job: 0, .. }))
        .map(|c| c.objective)
        .collect();
    // Starts 0..5 → 1; 7.5 → 0.75; 10 → 0.5; 12.5 → 0.25; 15, 17.5 → 0 (pruned, §4.3.6).
    assert_eq!(slo_values, vec![1.0, 1.0, 1.0, 0.75, 0.5, 0.25]);
    // The SLO option starting at 2.5 uses 1, 0.75, 0.5, 0.25 at t = 2.5, 5, 7.5, 10: the
    // paper's "0.75 I_SLO;0 + 1.0 I_SLO;2.5 + …" row at t = 2.5 reads down the columns.
    let at_2_5 = model
        .columns
        .iter()
        .find(|c| {
            c.kind
                == ColumnKind::Option {
                    job: 0,
                    partition: 0,
                    step: 1,
                }
        })
        .unwrap();
    assert_eq!(
        at_2_5.entries,
        vec![(1, 1.0), (2, 0.75), (3, 0.5), (4, 0.25), (8, 1.0)]
    );
    let at_0 = &model.columns[0];
    assert_eq!(at_0.entries[1], (1, 0.75));
    assert!(model.rows[..8].iter().all(|r| r.upper == 1.0));
}

#[test]
fn slo_job_goes_first_only_when_its_distribution_says_it_must() {
    let partitions = one_partition(1.0);
    // Scenario 1, U(0, 10): deferring the SLO job risks its deadline, so it starts now.
    let wide = [2.5, 5.0, 7.5, 10.0];
    let pending = vec![slo(1, &wide), be(2, &wide)];
    let mut scheduler = ThreeSigmaScheduler::new("3Sigma", paper_config(), HighsSolver).unwrap();
    let decision = scheduler.cycle(&CycleInput {
        now: 0.0,
        partitions: &partitions,
        pending: &pending,
        running: &[],
    });
    assert_eq!(
        decision.start_now.iter().map(|p| p.job).collect::<Vec<_>>(),
        vec![1]
    );
    assert!(decision.record.lp_bound.unwrap() >= decision.record.objective - 1e-9);
    // Scenario 2, U(2.5, 7.5): both fit before the deadline, so the best-effort job goes first
    // and the SLO job is planned for 7.5.
    let narrow = [5.0, 7.5];
    let pending = vec![slo(1, &narrow), be(2, &narrow)];
    let mut scheduler = ThreeSigmaScheduler::new("3Sigma", paper_config(), HighsSolver).unwrap();
    let decision = scheduler.cycle(&CycleInput {
        now: 0.0,
        partitions: &partitions,
        pending: &pending,
        running: &[],
    });
    assert_eq!(
        decision.start_now.iter().map(|p| p.job).collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(decision.deferred.len(), 1);
    assert_eq!(decision.deferred[0].job, 1);
    assert_eq!(decision.deferred[0].start, 7.5);
}

#[test]
fn an_slo_job_preempts_best_effort_work_when_nothing_else_meets_its_deadline() {
    let partitions = one_partition(2.0);
    let running = vec![RunningJob {
        id: 9,
        partition: 0,
        gang: 2,
        started: 0.0,
        belief: RuntimeBelief::point(100.0).unwrap(),
        utility: Utility::BestEffort {
            submit: 0.0,
            value: 0.1,
            zero_at: 400.0,
        },
        preemptible: true,
    }];
    let mut urgent = job(
        1,
        Utility::Slo {
            deadline: 15.0,
            value: 10.0,
        },
        &[10.0],
        2,
    );
    urgent.submit = 1.0;
    let pending = vec![urgent];
    let mut scheduler = ThreeSigmaScheduler::new("3Sigma", paper_config(), HighsSolver).unwrap();
    // Starting at 1 or 3.5 meets the deadline, 6 does not: the preemption may wait for the
    // last start that still meets it (equal utility), but no later.
    let mut preempted_at = None;
    for now in [1.0, 3.5] {
        let decision = scheduler.cycle(&CycleInput {
            now,
            partitions: &partitions,
            pending: &pending,
            running: &running,
        });
        if !decision.preempt.is_empty() {
            assert_eq!(decision.preempt, vec![9]);
            assert_eq!(decision.start_now.len(), 1);
            preempted_at = Some(now);
            break;
        }
        assert!(decision.start_now.is_empty());
        assert_eq!(decision.deferred.len(), 1, "the SLO job stays planned");
    }
    assert!(preempted_at.is_some(), "never preempted");
    // A cheap SLO job is not worth the running job's value: no preemption.
    let mut cheap = pending[0].clone();
    cheap.utility = Utility::Slo {
        deadline: 15.0,
        value: 0.01,
    };
    let decision = scheduler.cycle(&CycleInput {
        now: 1.0,
        partitions: &partitions,
        pending: &[cheap],
        running: &running,
    });
    assert!(decision.preempt.is_empty());
    assert!(decision.start_now.is_empty());
}

/// A solver that always fails: exercises the greedy fallback.
struct NoAnswer;

impl MilpSolver for NoAnswer {
    fn name(&self) -> &'static str {
        "no-answer"
    }
    fn solve_relaxation(
        &mut self,
        _: &MilpModel,
        _: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        Err(SolverError::NoSolution("time limit".into()))
    }
    fn improve(
        &mut self,
        _: &MilpModel,
        _: &[bool],
        _: SolveLimit,
    ) -> Result<Option<MipSolution>, SolverError> {
        Err(SolverError::NoSolution("time limit".into()))
    }
}

fn random_instance(rng: &mut StdRng) -> (Vec<PartitionState>, Vec<PendingJob>, Vec<RunningJob>) {
    let partitions: Vec<PartitionState> = (0..rng.random_range(1..4))
        .map(|_| PartitionState {
            capacity: f64::from(rng.random_range(2..12u32)),
            reserved: (0..16)
                .map(|_| f64::from(rng.random_range(0..2u32)))
                .collect(),
        })
        .collect();
    let runtimes = |rng: &mut StdRng| -> Vec<f64> {
        (0..rng.random_range(1..6))
            .map(|_| rng.random_range(5.0..400.0))
            .collect()
    };
    let pending: Vec<PendingJob> = (0..rng.random_range(1..30))
        .map(|id| {
            let utility = if rng.random_bool(0.5) {
                Utility::Slo {
                    deadline: rng.random_range(50.0..600.0),
                    value: rng.random_range(1.0..10.0),
                }
            } else {
                Utility::BestEffort {
                    submit: 0.0,
                    value: 1.0,
                    zero_at: 3600.0,
                }
            };
            PendingJob {
                id,
                submit: 0.0,
                utility,
                gang: rng.random_range(1..5),
                belief: RuntimeBelief::from_runtimes(runtimes(rng)).unwrap(),
                choices: (0..partitions.len())
                    .map(|p| PartitionChoice {
                        partition: p,
                        runtime_factor: if p == 0 { 1.0 } else { 1.5 },
                    })
                    .collect(),
            }
        })
        .collect();
    let mut used = vec![0u32; partitions.len()];
    let mut running = Vec::new();
    for id in 100..100 + rng.random_range(0..10) {
        let p = rng.random_range(0..partitions.len());
        let gang = rng.random_range(1..3);
        if f64::from(used[p] + gang) > partitions[p].capacity {
            continue;
        }
        used[p] += gang;
        running.push(RunningJob {
            id,
            partition: p,
            gang,
            started: -rng.random_range(0.0..300.0),
            belief: RuntimeBelief::from_runtimes(runtimes(rng)).unwrap(),
            utility: Utility::BestEffort {
                submit: -300.0,
                value: 1.0,
                zero_at: 3600.0,
            },
            preemptible: rng.random_bool(0.5),
        });
    }
    (partitions, pending, running)
}

/// What starting `decision` now would hold in each partition, against what is free there.
fn check_enactable(
    partitions: &[PartitionState],
    pending: &[PendingJob],
    running: &[RunningJob],
    decision: &CycleDecision,
) {
    for (p, partition) in partitions.iter().enumerate() {
        let held: u32 = running
            .iter()
            .filter(|r| r.partition == p && !decision.preempt.contains(&r.id))
            .map(|r| r.gang)
            .sum();
        let started: u32 = decision
            .start_now
            .iter()
            .filter(|s| s.partition == p)
            .map(|s| pending.iter().find(|j| j.id == s.job).unwrap().gang)
            .sum();
        let reserved = partition.reserved.first().copied().unwrap_or(0.0);
        assert!(
            f64::from(held + started) <= (partition.capacity - reserved).max(f64::from(held)),
            "partition {p}: held {held} + started {started} > {} - {reserved}: {decision:?} {running:?}",
            partition.capacity
        );
    }
    let mut ids: Vec<u64> = decision
        .start_now
        .iter()
        .chain(&decision.deferred)
        .map(|p| p.job)
        .collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "a job was chosen twice");
}

#[test]
fn every_decision_is_enactable_whatever_the_solver_did() {
    let mut rng = StdRng::seed_from_u64(7);
    let config = ThreeSigmaConfig {
        step_s: 30.0,
        ..ThreeSigmaConfig::default()
    };
    let mut with_highs = ThreeSigmaScheduler::new("3Sigma", config.clone(), HighsSolver).unwrap();
    let mut failing = ThreeSigmaScheduler::new("fallback", config, NoAnswer).unwrap();
    let mut methods = std::collections::HashSet::new();
    for round in 0..40 {
        let (partitions, pending, running) = random_instance(&mut rng);
        let input = CycleInput {
            now: 0.0,
            partitions: &partitions,
            pending: &pending,
            running: &running,
        };
        let decision = with_highs.cycle(&input);
        check_enactable(&partitions, &pending, &running, &decision);
        if let Some(bound) = decision.record.lp_bound {
            assert!(
                decision.record.objective <= bound + 1e-6,
                "round {round}: objective above the LP bound"
            );
        }
        methods.insert(decision.record.method);
        let fallback = failing.cycle(&input);
        check_enactable(&partitions, &pending, &running, &fallback);
        for id in &fallback.preempt {
            assert!(running.iter().any(|r| r.id == *id && r.preemptible));
        }
        if fallback.record.columns > 0 {
            // The repaired warm start may beat the greedy; either way the LP's failure is said.
            assert!(matches!(
                fallback.record.method,
                DecisionMethod::GreedyFallback | DecisionMethod::WarmStart
            ));
            assert!(
                fallback
                    .record
                    .note
                    .as_deref()
                    .unwrap()
                    .contains("time limit")
            );
        }
        let prio = PrioScheduler.cycle(&input);
        check_enactable(&partitions, &pending, &running, &prio);
    }
    assert!(
        methods.contains(&DecisionMethod::LpRounding)
            || methods.contains(&DecisionMethod::MilpImproved)
    );
}

#[test]
fn rounding_never_violates_a_row_whatever_the_lp_values() {
    let mut rng = StdRng::seed_from_u64(11);
    let config = ThreeSigmaConfig {
        step_s: 30.0,
        ..ThreeSigmaConfig::default()
    };
    for _ in 0..60 {
        let (partitions, pending, running) = random_instance(&mut rng);
        let cycle = build_model(
            &config,
            &CycleInput {
                now: 0.0,
                partitions: &partitions,
                pending: &pending,
                running: &running,
            },
        );
        // Adversarial "LP" points: anything in [0, 1], including every preemption at 1.
        let values: Vec<f64> = cycle
            .model
            .columns
            .iter()
            .map(|_| rng.random_range(0.0..1.0))
            .collect();
        let chosen = round_lp(&cycle.model, pending.len(), &values);
        assert_eq!(cycle.model.violated_row(&chosen), None);
        let chosen = greedy(&cycle.model, pending.len());
        assert_eq!(cycle.model.violated_row(&chosen), None);
    }
}

#[test]
fn running_jobs_use_capacity_by_their_conditioned_distribution() {
    // A running job (2 slots) believed to run 10 or 40 s has run 20 s: Eq. 2 leaves only 40,
    // so it holds its 2 slots until t = 40 and nothing after.
    let partitions = one_partition(3.0);
    let running = vec![RunningJob {
        id: 5,
        partition: 0,
        gang: 2,
        started: 0.0,
        belief: RuntimeBelief::from_runtimes(vec![10.0, 40.0]).unwrap(),
        utility: Utility::Slo {
            deadline: 100.0,
            value: 1.0,
        },
        preemptible: false,
    }];
    let config = ThreeSigmaConfig {
        step_s: 10.0,
        starts: 4,
        ..ThreeSigmaConfig::default()
    };
    let cycle = build_model(
        &config,
        &CycleInput {
            now: 20.0,
            partitions: &partitions,
            pending: &[],
            running: &running,
        },
    );
    let uppers: Vec<f64> = cycle.model.rows.iter().map(|r| r.upper).collect();
    // Rows at t = 20, 30, 40, 50.
    assert_eq!(uppers, vec![1.0, 1.0, 3.0, 3.0]);
}

#[test]
fn a_work_budget_makes_the_decision_independent_of_time() {
    // The same instance under a simplex-iteration limit: too few iterations end in the greedy
    // fallback every time (no clock involved), enough give the LP's answer and its iteration
    // count, and two runs decide the same.
    let mut rng = StdRng::seed_from_u64(21);
    let (partitions, pending, running) = loop {
        let instance = random_instance(&mut rng);
        if instance.1.len() >= 4 {
            break instance;
        }
    };
    let input = CycleInput {
        now: 0.0,
        partitions: &partitions,
        pending: &pending,
        running: &running,
    };
    let budget = |lp_simplex_iterations| ThreeSigmaConfig {
        step_s: 30.0,
        solver_budget: SolverBudget::Work {
            lp_simplex_iterations,
            mip_nodes: 0,
        },
        ..ThreeSigmaConfig::default()
    };
    let decide = |iterations| {
        ThreeSigmaScheduler::new("3Sigma", budget(iterations), HighsSolver)
            .unwrap()
            .cycle(&input)
    };
    let first = decide(1_000_000);
    assert_eq!(first.record.method, DecisionMethod::LpRounding);
    let needed = first.record.lp_iterations.unwrap();
    assert!(needed > 1, "{needed}");
    assert_eq!(first, decide(1_000_000));
    // HiGHS stops at the limit before it can confirm optimality, so half is short of it.
    let starved = decide(needed / 2);
    assert_eq!(starved.record.method, DecisionMethod::GreedyFallback);
    assert!(starved.record.lp_bound.is_none());
    assert_eq!(starved, decide(needed / 2));
    assert!(
        ThreeSigmaScheduler::new("3Sigma", budget(0), HighsSolver).is_err(),
        "no LP iterations at all is refused"
    );
}

/// A "solver" whose LP answer is given: the columns it names at the given values, the rest 0.
struct GivenLp(Vec<(ColumnKind, f64)>);

impl MilpSolver for GivenLp {
    fn name(&self) -> &'static str {
        "given"
    }
    fn solve_relaxation(
        &mut self,
        model: &MilpModel,
        _: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        let values: Vec<f64> = model
            .columns
            .iter()
            .map(|c| {
                self.0
                    .iter()
                    .find(|(kind, _)| *kind == c.kind)
                    .map_or(0.0, |(_, v)| *v)
            })
            .collect();
        let bound = model
            .columns
            .iter()
            .zip(&values)
            .map(|(c, v)| c.objective * v)
            .sum();
        Ok(LpSolution {
            values,
            bound,
            iterations: 0,
            optimal: true,
            basis: None,
        })
    }
    fn improve(
        &mut self,
        _: &MilpModel,
        _: &[bool],
        _: SolveLimit,
    ) -> Result<Option<MipSolution>, SolverError> {
        Ok(None)
    }
}

#[test]
fn a_job_planned_later_at_no_gain_starts_now_when_there_is_room() {
    // One free slot, one SLO job (100 s) whose deadline every start in the window meets: the
    // MILP is indifferent between its starts, and a later one even uses less of the window.
    // An LP that plans it at the last step must not leave the slot idle now.
    let partitions = one_partition(1.0);
    let pending = vec![job(
        1,
        Utility::Slo {
            deadline: 1_000.0,
            value: 10.0,
        },
        &[100.0],
        1,
    )];
    let config = paper_config();
    let last = ColumnKind::Option {
        job: 0,
        partition: 0,
        step: config.starts - 1,
    };
    let mut scheduler =
        ThreeSigmaScheduler::new("3Sigma", config, GivenLp(vec![(last, 1.0)])).unwrap();
    let decision = scheduler.cycle(&CycleInput {
        now: 0.0,
        partitions: &partitions,
        pending: &pending,
        running: &[],
    });
    assert_eq!(decision.record.method, DecisionMethod::LpRounding);
    assert_eq!(
        decision.start_now.iter().map(|p| p.job).collect::<Vec<_>>(),
        vec![1],
        "{decision:?}"
    );
    assert!(decision.deferred.is_empty());
    // With the slot held now (a running job believed to end at 5 s), the plan stays later.
    let running = vec![RunningJob {
        id: 7,
        partition: 0,
        gang: 1,
        started: -1.0,
        belief: RuntimeBelief::point(6.0).unwrap(),
        utility: Utility::Slo {
            deadline: 100.0,
            value: 10.0,
        },
        preemptible: false,
    }];
    let mut scheduler =
        ThreeSigmaScheduler::new("3Sigma", paper_config(), GivenLp(vec![(last, 1.0)])).unwrap();
    let decision = scheduler.cycle(&CycleInput {
        now: 0.0,
        partitions: &partitions,
        pending: &pending,
        running: &running,
    });
    assert!(decision.start_now.is_empty(), "{decision:?}");
    assert_eq!(decision.deferred.len(), 1);
}

fn full_of_cheap_best_effort() -> (Vec<PartitionState>, Vec<RunningJob>) {
    let partitions = one_partition(2.0);
    let running = vec![RunningJob {
        id: 9,
        partition: 0,
        gang: 2,
        started: 0.0,
        belief: RuntimeBelief::point(500.0).unwrap(),
        utility: Utility::BestEffort {
            submit: 0.0,
            value: 1.0,
            zero_at: 7_200.0,
        },
        preemptible: true,
    }];
    (partitions, running)
}

fn urgent_slo() -> PendingJob {
    // Only a start now meets the deadline (the next start, 2.5 s later, does not).
    let mut urgent = job(
        1,
        Utility::Slo {
            deadline: 11.0,
            value: 10.0,
        },
        &[10.0],
        2,
    );
    urgent.submit = 1.0;
    urgent
}

#[test]
fn the_greedy_fallback_preempts_cheap_work_for_an_slo_job_that_cannot_wait() {
    let (partitions, running) = full_of_cheap_best_effort();
    let pending = vec![urgent_slo()];
    let mut scheduler = ThreeSigmaScheduler::new("fallback", paper_config(), NoAnswer).unwrap();
    let decision = scheduler.cycle(&CycleInput {
        now: 1.0,
        partitions: &partitions,
        pending: &pending,
        running: &running,
    });
    assert_eq!(decision.record.method, DecisionMethod::GreedyFallback);
    assert_eq!(decision.preempt, vec![9], "{decision:?}");
    assert_eq!(
        decision.start_now.iter().map(|p| p.job).collect::<Vec<_>>(),
        vec![1]
    );
    check_enactable(&partitions, &pending, &running, &decision);
    // Not for a job worth less than the work it would kill.
    let mut cheap = urgent_slo();
    cheap.utility = Utility::Slo {
        deadline: 11.0,
        value: 0.5,
    };
    let decision = scheduler.cycle(&CycleInput {
        now: 1.0,
        partitions: &partitions,
        pending: &[cheap],
        running: &running,
    });
    assert!(decision.preempt.is_empty());
    assert!(decision.start_now.is_empty());
}

#[test]
fn lp_rounding_preempts_when_the_lp_took_the_preemption_only_fractionally() {
    let (partitions, running) = full_of_cheap_best_effort();
    let pending = vec![urgent_slo()];
    let lp = GivenLp(vec![
        (ColumnKind::Preempt { running: 0 }, 0.4),
        (
            ColumnKind::Option {
                job: 0,
                partition: 0,
                step: 0,
            },
            0.4,
        ),
    ]);
    let mut scheduler = ThreeSigmaScheduler::new("3Sigma", paper_config(), lp).unwrap();
    let decision = scheduler.cycle(&CycleInput {
        now: 1.0,
        partitions: &partitions,
        pending: &pending,
        running: &running,
    });
    assert_eq!(decision.record.method, DecisionMethod::LpRounding);
    assert_eq!(decision.preempt, vec![9], "{decision:?}");
    assert_eq!(decision.start_now.len(), 1);
}

/// A cycle shaped like the benchmark's (docs/benchmarks.md §8), smaller: `jobs` pending jobs
/// with 20-quantile log-normal beliefs over 4 partitions of 16 slots half held by running
/// work, so the model has far more option columns than rows and sifting takes several rounds.
fn wide_instance(
    rng: &mut StdRng,
    jobs: usize,
) -> (Vec<PartitionState>, Vec<PendingJob>, Vec<RunningJob>) {
    let belief = |rng: &mut StdRng| {
        let median = rng.random_range(60.0..1800.0f64);
        let sigma = rng.random_range(0.2..1.0f64);
        RuntimeBelief::from_runtimes(
            (0..20)
                .map(|i| median * (sigma * (f64::from(i) - 9.5) / 5.0).exp())
                .collect(),
        )
        .unwrap()
    };
    let partitions = vec![
        PartitionState {
            capacity: 16.0,
            reserved: Vec::new(),
        };
        4
    ];
    let pending = (0..jobs)
        .map(|id| {
            let b = belief(rng);
            let submit = -rng.random_range(0.0..600.0);
            let slo = rng.random_bool(0.5);
            let utility = if slo {
                Utility::Slo {
                    deadline: submit + b.quantile(0.525) * rng.random_range(1.2..1.8),
                    value: 10.0,
                }
            } else {
                Utility::BestEffort {
                    submit,
                    value: 1.0,
                    zero_at: submit + 7200.0,
                }
            };
            let preferred = rng.random_range(0..4);
            PendingJob {
                id: id as u64,
                submit,
                utility,
                gang: rng.random_range(1..=4),
                belief: b,
                choices: (0..4)
                    .map(|p| PartitionChoice {
                        partition: p,
                        runtime_factor: if slo && p != preferred { 1.5 } else { 1.0 },
                    })
                    .collect(),
            }
        })
        .collect();
    let mut running = Vec::new();
    for p in 0..4 {
        let mut used = 0;
        while used < 8 {
            let gang = rng.random_range(1..=2);
            running.push(RunningJob {
                id: 1000 + running.len() as u64,
                partition: p,
                gang,
                started: -rng.random_range(0.0..900.0),
                belief: belief(rng),
                utility: Utility::BestEffort {
                    submit: -1000.0,
                    value: 1.0,
                    zero_at: 7200.0,
                },
                preemptible: rng.random_bool(0.5),
            });
            used += gang;
        }
    }
    (partitions, pending, running)
}

/// Sifting solves the relaxation over a working set of columns; it must end at the optimum of
/// the relaxation over all columns, with a feasible point whose objective is that bound.
#[test]
fn sifting_reaches_the_full_relaxations_optimum() {
    let unlimited = SolveLimit {
        time_s: None,
        simplex_iterations: None,
        mip_nodes: None,
    };
    let config = ThreeSigmaConfig {
        step_s: 30.0,
        ..ThreeSigmaConfig::default()
    };
    let mut rng = StdRng::seed_from_u64(41);
    let mut instances: Vec<_> = (0..30).map(|_| random_instance(&mut rng)).collect();
    instances.extend((0..4).map(|i| wide_instance(&mut rng, 40 + 20 * i)));
    let mut wide_models = 0;
    for (partitions, pending, running) in &instances {
        let input = CycleInput {
            now: 0.0,
            partitions,
            pending,
            running,
        };
        let config = if pending.len() >= 40 {
            ThreeSigmaConfig::default()
        } else {
            config.clone()
        };
        let model = build_model(&config, &input).model;
        if model.columns.len() > 8 * model.rows.len() {
            wide_models += 1;
        }
        let full = HighsSolver
            .solve_relaxation_full(&model, unlimited)
            .unwrap();
        let sifted = HighsSolver
            .solve_relaxation_sifting(&model, unlimited)
            .unwrap();
        let chosen = HighsSolver.solve_relaxation(&model, unlimited).unwrap();
        let scale = full.bound.abs().max(1.0);
        assert!(
            (full.bound - sifted.bound).abs() <= 1e-6 * scale,
            "full {} sifted {}",
            full.bound,
            sifted.bound
        );
        assert!((full.bound - chosen.bound).abs() <= 1e-6 * scale);
        let objective: f64 = model
            .columns
            .iter()
            .zip(&sifted.values)
            .map(|(c, v)| c.objective * v)
            .sum();
        assert!((objective - sifted.bound).abs() <= 1e-6 * scale);
        let mut activity = vec![0.0; model.rows.len()];
        for (column, v) in model.columns.iter().zip(&sifted.values) {
            for (row, coef) in &column.entries {
                activity[*row] += coef * v;
            }
        }
        for (a, row) in activity.iter().zip(&model.rows) {
            assert!(*a <= row.upper + 1e-6, "{a} > {}", row.upper);
        }
    }
    assert!(wide_models >= 4, "only {wide_models} models were wide");
}

/// A simplex-iteration budget covers every sifting round together: short of what the rounds
/// need, the relaxation gives no answer; above it, the same answer as without a limit.
#[test]
fn sifting_counts_iterations_over_all_rounds() {
    let mut rng = StdRng::seed_from_u64(42);
    let (partitions, pending, running) = wide_instance(&mut rng, 80);
    let input = CycleInput {
        now: 0.0,
        partitions: &partitions,
        pending: &pending,
        running: &running,
    };
    let model = build_model(&ThreeSigmaConfig::default(), &input).model;
    let limit = |iterations| SolveLimit {
        time_s: None,
        simplex_iterations: Some(iterations),
        mip_nodes: None,
    };
    let solved = HighsSolver
        .solve_relaxation_sifting(&model, limit(1_000_000))
        .unwrap();
    assert!(solved.iterations > 1);
    assert!(
        HighsSolver
            .solve_relaxation_sifting(&model, limit(solved.iterations - 1))
            .is_err()
    );
    assert!(
        HighsSolver
            .solve_relaxation_sifting(&model, limit(solved.iterations / 2))
            .is_err()
    );
    assert_eq!(
        HighsSolver
            .solve_relaxation_sifting(&model, limit(2 * solved.iterations))
            .unwrap(),
        solved
    );
}

type Instance = (Vec<PartitionState>, Vec<PendingJob>, Vec<RunningJob>);

/// The next cycle of a [`wide_instance`]: `replaced` pending jobs (chosen at random) have left
/// and as many new ones (ids from `first_id`) have arrived; the running jobs stay.
fn next_cycle(rng: &mut StdRng, instance: &Instance, replaced: usize, first_id: u64) -> Instance {
    let (partitions, pending, running) = instance.clone();
    let mut pending = pending;
    for _ in 0..replaced.min(pending.len()) {
        let gone = rng.random_range(0..pending.len());
        pending.remove(gone);
    }
    let (_, arrivals, _) = wide_instance(rng, replaced);
    pending.extend(arrivals.into_iter().enumerate().map(|(i, mut job)| {
        job.id = first_id + i as u64;
        job
    }));
    (partitions, pending, running)
}

fn input_of(instance: &Instance, now: f64) -> CycleInput<'_> {
    CycleInput {
        now,
        partitions: &instance.0,
        pending: &instance.1,
        running: &instance.2,
    }
}

const UNLIMITED: SolveLimit = SolveLimit {
    time_s: None,
    simplex_iterations: None,
    mip_nodes: None,
};

fn assert_optimal_point(model: &MilpModel, lp: &LpSolution, optimum: f64) {
    let scale = optimum.abs().max(1.0);
    assert!(lp.optimal);
    assert!(
        (lp.bound - optimum).abs() <= 1e-6 * scale,
        "bound {} optimum {optimum}",
        lp.bound
    );
    let objective: f64 = model
        .columns
        .iter()
        .zip(&lp.values)
        .map(|(c, v)| c.objective * v)
        .sum();
    assert!((objective - optimum).abs() <= 1e-6 * scale);
    let mut activity = vec![0.0; model.rows.len()];
    for (column, v) in model.columns.iter().zip(&lp.values) {
        for (row, coef) in &column.entries {
            activity[*row] += coef * v;
        }
    }
    for (a, row) in activity.iter().zip(&model.rows) {
        assert!(*a <= row.upper + 1e-6, "{a} > {}", row.upper);
    }
}

/// §4.3.6's warm start changes where the LP starts, never where it ends: sifting from the
/// previous cycle's basis (mapped by job ids), and from arbitrary bases, reaches the optimum of
/// the LP over all columns with a feasible point at that bound.
#[test]
fn a_warm_started_sifting_reaches_the_same_optimum_as_a_cold_one() {
    let mut rng = StdRng::seed_from_u64(43);
    let config = ThreeSigmaConfig::default();
    let mut warm_models = 0;
    for round in 0..16 {
        let jobs = 40 + 10 * (round % 5);
        let first = wide_instance(&mut rng, jobs);
        let replaced = [0, 1, 4, jobs / 4, jobs][round % 5];
        let second = next_cycle(&mut rng, &first, replaced, 10_000);
        let first_input = input_of(&first, 0.0);
        let second_input = input_of(&second, 1.0);
        let first_model = build_model(&config, &first_input).model;
        let second_model = build_model(&config, &second_input).model;
        let cold_first = HighsSolver
            .solve_relaxation_sifting(&first_model, UNLIMITED)
            .unwrap();
        let basis = cold_first
            .basis
            .as_ref()
            .expect("sifting reports its basis");
        let start =
            PreviousLp::of(&first_model, &first_input, basis).on(&second_model, &second_input);
        let full = HighsSolver
            .solve_relaxation_full(&second_model, UNLIMITED)
            .unwrap();
        let warm = HighsSolver
            .solve_relaxation_from(&second_model, UNLIMITED, &start)
            .unwrap();
        assert_optimal_point(&second_model, &warm, full.bound);
        // Arbitrary statuses, too many and too few basic ones: still the optimum.
        let noise = LpBasis {
            columns: (0..second_model.columns.len())
                .map(|_| {
                    [
                        None,
                        Some(BasisStatus::Basic),
                        Some(BasisStatus::AtLower),
                        Some(BasisStatus::AtUpper),
                    ][rng.random_range(0..4)]
                })
                .collect(),
            rows: (0..second_model.rows.len())
                .map(|_| {
                    [None, Some(BasisStatus::Basic), Some(BasisStatus::AtUpper)]
                        [rng.random_range(0..3)]
                })
                .collect(),
        };
        let noisy = HighsSolver
            .solve_relaxation_from(&second_model, UNLIMITED, &noise)
            .unwrap();
        assert_optimal_point(&second_model, &noisy, full.bound);
        if second_model.columns.len() > 8 * second_model.rows.len() {
            warm_models += 1;
        }
    }
    assert!(
        warm_models >= 12,
        "only {warm_models} models were wide enough to sift"
    );
}

/// A cycle after a cycle with mostly the same jobs starts its LP from the previous basis and
/// needs fewer simplex iterations than the same cycle solved cold (§4.3.6), at the same bound.
#[test]
fn a_cycle_after_a_cycle_with_mostly_the_same_jobs_uses_fewer_simplex_iterations() {
    let mut rng = StdRng::seed_from_u64(44);
    // Wall-clock budget (the live guarantor's) with room enough never to be reached here.
    let config = ThreeSigmaConfig {
        cycle_s: 100.0,
        mip_improvement: false,
        ..ThreeSigmaConfig::default()
    };
    let (mut warm_total, mut cold_total) = (0, 0);
    for _ in 0..4 {
        let first = wide_instance(&mut rng, 120);
        let second = next_cycle(&mut rng, &first, 3, 10_000);
        let mut warm = ThreeSigmaScheduler::new("warm", config.clone(), HighsSolver).unwrap();
        warm.cycle(&input_of(&first, 0.0));
        let warm_second = warm.cycle(&input_of(&second, 1.0)).record;
        let mut cold = ThreeSigmaScheduler::new("cold", config.clone(), HighsSolver).unwrap();
        let cold_second = cold.cycle(&input_of(&second, 1.0)).record;
        let (warm_bound, cold_bound) =
            (warm_second.lp_bound.unwrap(), cold_second.lp_bound.unwrap());
        assert!((warm_bound - cold_bound).abs() <= 1e-6 * cold_bound.abs().max(1.0));
        assert!(!warm_second.lp_stopped_early && !cold_second.lp_stopped_early);
        let (w, c) = (
            warm_second.lp_iterations.unwrap(),
            cold_second.lp_iterations.unwrap(),
        );
        assert!(w < c, "warm {w} iterations, cold {c}");
        warm_total += w;
        cold_total += c;
    }
    assert!(
        2 * warm_total < cold_total,
        "warm {warm_total} iterations in all, cold {cold_total}"
    );
}

/// Under a work budget (the simulator's `SolverBudget::Work`) the LP never starts from the
/// previous cycle: a cycle decides the same after any history.
#[test]
fn a_work_budget_ignores_the_previous_cycles_lp() {
    let mut rng = StdRng::seed_from_u64(45);
    let config = ThreeSigmaConfig {
        solver_budget: SolverBudget::Work {
            lp_simplex_iterations: 1_000_000,
            mip_nodes: 0,
        },
        ..ThreeSigmaConfig::default()
    };
    let first = wide_instance(&mut rng, 120);
    let second = next_cycle(&mut rng, &first, 3, 10_000);
    let mut after = ThreeSigmaScheduler::new("after", config.clone(), HighsSolver).unwrap();
    let mut fresh = ThreeSigmaScheduler::new("fresh", config, HighsSolver).unwrap();
    after.cycle(&input_of(&first, 0.0));
    assert!(after.previous_lp.is_none());
    let a = after.cycle(&input_of(&second, 1.0)).record;
    let b = fresh.cycle(&input_of(&second, 1.0)).record;
    assert_eq!(a.lp_iterations, b.lp_iterations);
    assert_eq!(a.lp_bound, b.lp_bound);
}

/// Any non-negative row prices give an upper bound on the LP (the bound a time-limited sifting
/// reports when it stops early), and the optimal duals give the optimum itself.
#[test]
fn the_lagrangian_bound_is_an_upper_bound_and_tight_at_the_optimal_prices() {
    let mut rng = StdRng::seed_from_u64(46);
    for _ in 0..6 {
        let instance = wide_instance(&mut rng, 60);
        let model = build_model(&ThreeSigmaConfig::default(), &input_of(&instance, 0.0)).model;
        let optimum = HighsSolver
            .solve_relaxation_full(&model, UNLIMITED)
            .unwrap()
            .bound;
        for _ in 0..20 {
            let prices: Vec<f64> = (0..model.rows.len())
                .map(|_| rng.random_range(-0.5..2.0))
                .collect();
            assert!(highs_solver::lagrangian_bound(&model, &prices) >= optimum - 1e-9);
        }
        let duals = highs_solver::optimal_row_duals(&model);
        let tight = highs_solver::lagrangian_bound(&model, &duals);
        assert!(
            (tight - optimum).abs() <= 1e-6 * optimum.abs().max(1.0),
            "{tight} vs {optimum}"
        );
    }
}

/// A time limit too short for the LP gives either no answer (the greedy decides) or a feasible
/// point with an upper bound on the LP, never an infeasible point or a bound below the optimum.
#[test]
fn a_sifting_stopped_by_its_time_limit_answers_a_feasible_point_and_a_valid_bound() {
    let mut rng = StdRng::seed_from_u64(47);
    let instance = wide_instance(&mut rng, 150);
    let model = build_model(&ThreeSigmaConfig::default(), &input_of(&instance, 0.0)).model;
    let optimum = HighsSolver
        .solve_relaxation_full(&model, UNLIMITED)
        .unwrap()
        .bound;
    for time_s in [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 10.0] {
        let Ok(lp) = HighsSolver.solve_relaxation_sifting(&model, SolveLimit::time(time_s)) else {
            continue;
        };
        assert!(lp.bound >= optimum - 1e-6 * optimum.abs().max(1.0));
        assert!(fractional_fits(&model, &lp.values));
        if lp.optimal {
            assert_optimal_point(&model, &lp, optimum);
        }
    }
}

fn fractional_fits(model: &MilpModel, values: &[f64]) -> bool {
    let mut activity = vec![0.0; model.rows.len()];
    for (column, v) in model.columns.iter().zip(values) {
        assert!((0.0..=1.0).contains(v));
        for (row, coef) in &column.entries {
            activity[*row] += coef * v;
        }
    }
    activity
        .iter()
        .zip(&model.rows)
        .all(|(a, row)| *a <= row.upper + 1e-6)
}

/// An LP "stopped by its time limit" at a poor point (nothing chosen).
struct StoppedLp;

impl MilpSolver for StoppedLp {
    fn name(&self) -> &'static str {
        "stopped"
    }
    fn solve_relaxation(
        &mut self,
        model: &MilpModel,
        _: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        Ok(LpSolution {
            values: vec![0.0; model.columns.len()],
            bound: f64::MAX,
            iterations: 7,
            optimal: false,
            basis: None,
        })
    }
    fn improve(
        &mut self,
        _: &MilpModel,
        _: &[bool],
        _: SolveLimit,
    ) -> Result<Option<MipSolution>, SolverError> {
        panic!("no MILP improvement after an LP its limit stopped");
    }
}

/// A cycle whose LP its time limit stopped rounds the point it got, keeps the greedy when that
/// is worth more (never worse than the fallback it replaces), says so in its record, and skips
/// the MILP improvement.
#[test]
fn a_cycle_whose_lp_stopped_early_decides_no_worse_than_the_greedy() {
    let mut rng = StdRng::seed_from_u64(48);
    for _ in 0..10 {
        let instance = wide_instance(&mut rng, 50);
        let input = input_of(&instance, 0.0);
        let mut scheduler =
            ThreeSigmaScheduler::new("3Sigma", ThreeSigmaConfig::default(), StoppedLp).unwrap();
        let (decision, cycle) = scheduler.cycle_with_model(&input);
        let record = &decision.record;
        assert!(record.lp_stopped_early);
        assert_eq!(record.lp_iterations, Some(7));
        let greedy_objective = cycle
            .model
            .objective(&greedy(&cycle.model, instance.1.len()));
        assert!(record.objective >= greedy_objective - 1e-9);
        check_enactable(&instance.0, &instance.1, &instance.2, &decision);
    }
}

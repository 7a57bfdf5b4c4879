//! [`MilpSolver`] over HiGHS (the `highs` crate; HiGHS is compiled from source by `highs-sys`).
//!
//! Single-threaded and quiet: the guarantor's cycle owns one core, and HiGHS' time limit bounds
//! each call (measured before this was written: HiGHS alone finds no integer point in 0.2 s on a
//! 3Sigma-sized model, so the LP relaxation is what the cycle leans on).
//!
//! The LP relaxation of a cycle's model has many more columns than rows (300 jobs × 4
//! equivalence sets × 16 starts: ~16k option columns against 364 rows), and an optimal basis
//! holds at most as many columns as there are rows, so most options never enter it. Large relaxations are
//! therefore solved by *sifting* (column generation over the option columns): HiGHS solves the
//! LP over a working set of columns, every column outside it is priced with the row duals, the
//! ones with a positive reduced cost join the working set, and HiGHS continues from its last
//! basis. It stops when no column outside prices positive: the working set's optimum is then
//! the full relaxation's optimum (same bound; LP duality), found without running the simplex
//! over all 158k non-zeros each iteration. 3Sigma §4.3.6 only prunes terms with a zero
//! constant; this changes how the LP is solved, not the model or its optimum.

use super::model::{
    ColumnKind, LpSolution, MilpModel, MilpSolver, MipSolution, SolveLimit, SolverError,
};
use highs::{ColProblem, HighsModelStatus, HighsSolutionStatus, Model, Row, Sense, SolvedModel};

/// HiGHS, one thread, quiet.
#[derive(Debug, Default, Clone)]
pub struct HighsSolver;

/// Relaxations with more than this many columns per row are solved by sifting; narrower ones
/// (small cycles) go to HiGHS whole, where the rounds
/// would cost more than they save.
const SIFTING_COLUMNS_PER_ROW: usize = 8;
/// Option columns per job in the first working set (its best by expected utility).
const SIFTING_INITIAL_PER_JOB: usize = 2;
/// At most this many columns join the working set per round (the best by reduced cost). All
/// that price positive after the first small solve is nearly every column (~13k of 16k at
/// 300 jobs), which makes the second round the full LP again; 1,000 per round measured 2–3×
/// less CPU time than the full LP at 300 and 1,000 jobs (docs/benchmarks.md §8).
const SIFTING_MAX_ENTERING: usize = 1000;
/// HiGHS' `simplex_strategy` value for primal simplex.
const SIMPLEX_STRATEGY_PRIMAL: i32 = 4;
/// A column outside the working set enters when its reduced cost exceeds this (HiGHS' default
/// dual feasibility tolerance, so sifting stops where HiGHS itself would call the LP optimal).
const SIFTING_REDUCED_COST_TOLERANCE: f64 = 1e-7;

fn build(model: &MilpModel, integer: bool) -> ColProblem {
    build_columns(model, integer, 0..model.columns.len()).0
}

/// The model's rows and the given columns as a HiGHS problem, with the rows' handles (sifting
/// adds columns against them later).
fn build_columns(
    model: &MilpModel,
    integer: bool,
    columns: impl IntoIterator<Item = usize>,
) -> (ColProblem, Vec<Row>) {
    let mut problem = ColProblem::default();
    let rows: Vec<Row> = model
        .rows
        .iter()
        .map(|row| problem.add_row(..=row.upper))
        .collect();
    for c in columns {
        let column = &model.columns[c];
        let entries: Vec<_> = column
            .entries
            .iter()
            .map(|(row, coef)| (rows[*row], *coef))
            .collect();
        problem.add_column_with_integrality(column.objective, 0.0..=1.0, entries, integer);
    }
    (problem, rows)
}

/// A HiGHS instance maximising `problem`'s relaxation within `limit`.
fn relaxation_model(problem: ColProblem, limit: SolveLimit) -> Result<Model, SolverError> {
    let mut highs = Model::try_new(problem).map_err(rejected)?;
    highs.set_sense(Sense::Maximise);
    configure_relaxation(&mut highs, limit);
    Ok(highs)
}

fn configure(model: &mut Model, limit: SolveLimit) {
    model.make_quiet();
    model.set_option("threads", 1);
    if let Some(time_s) = limit.time_s {
        model.set_option("time_limit", time_s.max(1e-3));
    }
    if let Some(iterations) = limit.simplex_iterations {
        model.set_option(
            "simplex_iteration_limit",
            i32::try_from(iterations).unwrap_or(i32::MAX),
        );
    }
    if let Some(nodes) = limit.mip_nodes {
        model.set_option("mip_max_nodes", i32::try_from(nodes).unwrap_or(i32::MAX));
    }
}

/// The LP relaxation skips HiGHS' presolve: the cycle's model has nothing for it to remove (one
/// row per job, capacity rows per partition and step, every column boxed in [0, 1]), and on
/// 300 × 4 × 16 models presolve cost about 30 % of the solve (thread CPU time of dual simplex on
/// three seeds: 229–261 ms with presolve, 155–195 ms without, same optimum; docs/benchmarks.md
/// §8). The MILP improvement keeps it: there presolve's probing and cuts pay.
fn configure_relaxation(model: &mut Model, limit: SolveLimit) {
    configure(model, limit);
    model.set_option("presolve", "off");
}

fn rejected(status: impl std::fmt::Debug) -> SolverError {
    SolverError::Rejected(format!("{status:?}"))
}

fn iterations_of(solved: &SolvedModel) -> u64 {
    u64::try_from(solved.simplex_iteration_count()).unwrap_or(0)
}

impl LpSolution {
    /// The relaxation of a model without columns: nothing chosen, bound 0.
    fn empty() -> Self {
        LpSolution {
            values: Vec::new(),
            bound: 0.0,
            iterations: 0,
        }
    }
}

impl HighsSolver {
    /// The LP relaxation solved by HiGHS over every column at once (what
    /// [`MilpSolver::solve_relaxation`] does for small models; tests and the benchmark compare
    /// it with sifting).
    pub fn solve_relaxation_full(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        if model.columns.is_empty() {
            return Ok(LpSolution::empty());
        }
        let solved = relaxation_model(build(model, false), limit)?
            .try_solve()
            .map_err(rejected)?;
        match solved.status() {
            HighsModelStatus::Optimal => {
                let values: Vec<f64> = solved
                    .get_solution()
                    .columns()
                    .iter()
                    .map(|v| v.clamp(0.0, 1.0))
                    .collect();
                Ok(LpSolution {
                    values,
                    bound: solved.objective_value(),
                    iterations: iterations_of(&solved),
                })
            }
            other => Err(SolverError::NoSolution(format!("LP relaxation {other:?}"))),
        }
    }

    /// The LP relaxation by sifting (module doc). Limits are for the whole call: HiGHS' run
    /// clock accumulates over the runs of one instance, so `time_limit` bounds them together
    /// (pricing between runs is a pass over the non-zeros, ~1 ms at 300 jobs, and not on that
    /// clock); simplex iterations are counted over all runs.
    pub fn solve_relaxation_sifting(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        if model.columns.is_empty() {
            return Ok(LpSolution::empty());
        }
        let mut working = initial_working_set(model);
        let mut in_working = vec![false; model.columns.len()];
        for c in &working {
            in_working[*c] = true;
        }
        let (problem, rows) = build_columns(model, false, working.iter().copied());
        let mut highs = relaxation_model(problem, limit)?;
        let mut iterations = 0u64;
        loop {
            let solved = highs.try_solve().map_err(rejected)?;
            iterations += iterations_of(&solved);
            match solved.status() {
                HighsModelStatus::Optimal => {}
                other => {
                    return Err(SolverError::NoSolution(format!("LP relaxation {other:?}")));
                }
            }
            let solution = solved.get_solution();
            let duals = solution.dual_rows();
            // The columns outside the working set that price positive, best first.
            let mut entering: Vec<(f64, usize)> = (0..model.columns.len())
                .filter(|c| !in_working[*c])
                .map(|c| (reduced_cost(model, c, duals), c))
                .filter(|(d, _)| *d > SIFTING_REDUCED_COST_TOLERANCE)
                .collect();
            entering.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            entering.truncate(SIFTING_MAX_ENTERING);
            if entering.is_empty() {
                let mut values = vec![0.0; model.columns.len()];
                for (c, v) in working.iter().zip(solution.columns()) {
                    values[*c] = v.clamp(0.0, 1.0);
                }
                return Ok(LpSolution {
                    values,
                    bound: solved.objective_value(),
                    iterations,
                });
            }
            let mut highs_next = Model::from(solved);
            // The last basis stays primal feasible when columns join at 0: primal simplex
            // continues from it.
            highs_next.set_option("simplex_strategy", SIMPLEX_STRATEGY_PRIMAL);
            if let Some(limit) = limit.simplex_iterations {
                let left = limit.saturating_sub(iterations);
                if left == 0 {
                    return Err(SolverError::NoSolution(
                        "LP relaxation ReachedIterationLimit".into(),
                    ));
                }
                highs_next.set_option(
                    "simplex_iteration_limit",
                    i32::try_from(left).unwrap_or(i32::MAX),
                );
            }
            for (_, c) in entering {
                let column = &model.columns[c];
                highs_next
                    .try_add_column(
                        column.objective,
                        0.0..=1.0,
                        column.entries.iter().map(|(row, coef)| (rows[*row], *coef)),
                    )
                    .map_err(rejected)?;
                in_working[c] = true;
                working.push(c);
            }
            highs = highs_next;
        }
    }
}

/// `c_j − Σ_i a_ij y_i` for the row duals `y` HiGHS reports (for a maximisation: ≥ 0 on a
/// binding `≤` row). Positive: raising column `j` from 0 would raise the objective.
fn reduced_cost(model: &MilpModel, column: usize, duals: &[f64]) -> f64 {
    let column = &model.columns[column];
    column.objective
        - column
            .entries
            .iter()
            .map(|(row, coef)| coef * duals[*row])
            .sum::<f64>()
}

/// The first working set: every preemption column, and each job's
/// [`SIFTING_INITIAL_PER_JOB`] best options by expected utility (earlier starts first among
/// equals), so that every job is represented from the first solve.
fn initial_working_set(model: &MilpModel) -> Vec<usize> {
    let mut by_job: Vec<Vec<usize>> = Vec::new();
    let mut working = Vec::new();
    for (c, column) in model.columns.iter().enumerate() {
        match column.kind {
            ColumnKind::Option { job, .. } => {
                if by_job.len() <= job {
                    by_job.resize_with(job + 1, Vec::new);
                }
                by_job[job].push(c);
            }
            ColumnKind::Preempt { .. } => working.push(c),
        }
    }
    let step_of = |c: usize| match model.columns[c].kind {
        ColumnKind::Option { step, .. } => step,
        ColumnKind::Preempt { .. } => 0,
    };
    for options in &mut by_job {
        options.sort_by(|a, b| {
            model.columns[*b]
                .objective
                .total_cmp(&model.columns[*a].objective)
                .then(step_of(*a).cmp(&step_of(*b)))
                .then(a.cmp(b))
        });
        working.extend(options.iter().take(SIFTING_INITIAL_PER_JOB));
    }
    working.sort_unstable();
    working
}

impl MilpSolver for HighsSolver {
    fn name(&self) -> &'static str {
        "highs"
    }

    fn solve_relaxation(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        // A budget of simplex iterations (the simulator's `SolverBudget::Work`) was set against
        // the full LP's iteration counts, and sifting spends more iterations in all (it pays
        // them back in time per iteration): such calls keep the full LP, so a simulation makes
        // the decisions its committed reports were produced with. Time-limited (live) calls
        // sift.
        let sift = limit.simplex_iterations.is_none()
            && model.columns.len() > SIFTING_COLUMNS_PER_ROW * model.rows.len().max(1);
        if sift {
            self.solve_relaxation_sifting(model, limit)
        } else {
            self.solve_relaxation_full(model, limit)
        }
    }

    fn improve(
        &mut self,
        model: &MilpModel,
        start: &[bool],
        limit: SolveLimit,
    ) -> Result<Option<MipSolution>, SolverError> {
        if model.columns.is_empty() || limit.exhausted() {
            return Ok(None);
        }
        let mut highs = Model::try_new(build(model, true)).map_err(rejected)?;
        highs.set_sense(Sense::Maximise);
        configure(&mut highs, limit);
        let start: Vec<f64> = start.iter().map(|on| f64::from(u8::from(*on))).collect();
        highs
            .try_set_solution(Some(&start), None, None, None)
            .map_err(|status| SolverError::Rejected(format!("MIP start {status:?}")))?;
        let solved = highs.try_solve().map_err(rejected)?;
        if solved.primal_solution_status() != HighsSolutionStatus::Feasible {
            return Ok(None);
        }
        let chosen: Vec<bool> = solved
            .get_solution()
            .columns()
            .iter()
            .map(|v| *v > 0.5)
            .collect();
        let objective = model.objective(&chosen);
        Ok(Some(MipSolution { chosen, objective }))
    }
}

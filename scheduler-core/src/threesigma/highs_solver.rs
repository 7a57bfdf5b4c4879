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
//!
//! §4.3.6 warm-starts each cycle's solver from the previous cycle's decision. For the LP the
//! natural start is the previous LP's basis: consecutive cycles share most jobs, so
//! [`MilpSolver::solve_relaxation_from`] gets the previous basis mapped onto this model (by job
//! ids; [`super::ThreeSigmaScheduler`] keeps it under a wall-clock budget), sifting starts from
//! the previous optimum's support plus the cold working set, and HiGHS from that basis. Where a
//! time limit ends the LP early, the answer is the best feasible point at hand with a Lagrangian
//! upper bound, so the cycle still rounds an LP point instead of falling back to the greedy.

use super::model::{
    BasisStatus, ColumnKind, FEASIBILITY_TOLERANCE, LpBasis, LpSolution, MilpModel, MilpSolver,
    MipSolution, SolveLimit, SolverError,
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
            optimal: true,
            basis: None,
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
                    optimal: true,
                    basis: None,
                })
            }
            other => Err(SolverError::NoSolution(format!("LP relaxation {other:?}"))),
        }
    }

    /// The LP relaxation by sifting (module doc). Limits are for the whole call: HiGHS' run
    /// clock accumulates over the runs of one instance, so `time_limit` bounds them together
    /// (pricing between runs is a pass over the non-zeros, ~1 ms at 300 jobs, and not on that
    /// clock); simplex iterations are counted over all runs.
    ///
    /// When the time limit ends a run before the LP is optimal, the answer is the best feasible
    /// point at hand (the interrupted primal simplex iterate, or the last working set's
    /// optimum; both are feasible for the whole LP, its other columns being 0) with
    /// `optimal: false` and a Lagrangian bound ([`lagrangian_bound`]) instead of the optimum.
    /// The iteration limit still gives no answer (what `SolverBudget::Work` relies on).
    pub fn solve_relaxation_sifting(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        sift(model, limit, None)
    }
}

/// HiGHS' basis status codes (`kHighsBasisStatus*` in `highs_c_api.h`).
const BASIS_LOWER: highs_sys::HighsInt = 0;
const BASIS_BASIC: highs_sys::HighsInt = 1;
const BASIS_UPPER: highs_sys::HighsInt = 2;

/// Sifting from the cold working set, or from `start` (the previous cycle's basis mapped onto
/// this model): its columns join the working set and HiGHS starts from its basis.
fn sift(
    model: &MilpModel,
    limit: SolveLimit,
    start: Option<&LpBasis>,
) -> Result<LpSolution, SolverError> {
    if model.columns.is_empty() {
        return Ok(LpSolution::empty());
    }
    let mut working = initial_working_set(model);
    if let Some(start) = start {
        // The start's basic columns and those at their upper bound (the previous optimum's
        // support) join the cold working set. Its columns at 0 do not: carried over, the
        // working set would grow from cycle to cycle towards every column.
        working.extend((0..model.columns.len()).filter(|c| {
            matches!(
                start.columns.get(*c),
                Some(Some(BasisStatus::Basic | BasisStatus::AtUpper))
            )
        }));
        working.sort_unstable();
        working.dedup();
    }
    let mut in_working = vec![false; model.columns.len()];
    for c in &working {
        in_working[*c] = true;
    }
    let (problem, rows) = build_columns(model, false, working.iter().copied());
    let mut highs = relaxation_model(problem, limit)?;
    if let Some(start) = start {
        // A basis HiGHS refuses leaves the cold (slack) start: a hint, not a requirement.
        set_basis(&mut highs, model, &working, start);
    }
    let mut iterations = 0u64;
    // The best upper bound any round's row prices gave, and the last working set's optimum
    // (a feasible point of the whole LP), for a run the time limit ends.
    let mut best_bound = f64::INFINITY;
    let mut last_optimum: Option<LpSolution> = None;
    loop {
        let solved = highs.try_solve().map_err(rejected)?;
        iterations += iterations_of(&solved);
        match solved.status() {
            HighsModelStatus::Optimal => {}
            HighsModelStatus::ReachedTimeLimit => {
                return stopped_early(model, &solved, &working, best_bound, last_optimum)
                    .map(|mut lp| {
                        lp.iterations = iterations;
                        lp
                    })
                    .ok_or_else(|| {
                        SolverError::NoSolution("LP relaxation ReachedTimeLimit".into())
                    });
            }
            other => {
                return Err(SolverError::NoSolution(format!("LP relaxation {other:?}")));
            }
        }
        let solution = solved.get_solution();
        let duals = solution.dual_rows();
        let values = spread(model, &working, solution.columns());
        // The columns outside the working set that price positive, best first.
        let mut entering: Vec<(f64, usize)> = (0..model.columns.len())
            .filter(|c| !in_working[*c])
            .map(|c| (reduced_cost(model, c, duals), c))
            .filter(|(d, _)| *d > SIFTING_REDUCED_COST_TOLERANCE)
            .collect();
        if entering.is_empty() {
            return Ok(LpSolution {
                values,
                bound: solved.objective_value(),
                iterations,
                optimal: true,
                basis: basis_of(&solved, model, &working),
            });
        }
        if limit.time_s.is_some() {
            best_bound = best_bound.min(lagrangian_bound(model, duals));
            last_optimum = Some(LpSolution {
                values,
                bound: best_bound,
                iterations,
                optimal: false,
                basis: basis_of(&solved, model, &working),
            });
        }
        entering.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        entering.truncate(SIFTING_MAX_ENTERING);
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

/// The working set's values (in working-set order) as values of every model column (0
/// outside), clamped to `[0, 1]`.
fn spread(model: &MilpModel, working: &[usize], working_values: &[f64]) -> Vec<f64> {
    let mut values = vec![0.0; model.columns.len()];
    for (c, v) in working.iter().zip(working_values) {
        values[*c] = v.clamp(0.0, 1.0);
    }
    values
}

/// The answer of a sifting run the time limit ended: the interrupted iterate if it is feasible
/// (primal simplex, which every round after the first runs, keeps its iterates feasible), or
/// the last working set's optimum, whichever is worth more. `None` when neither exists (the
/// first run was interrupted by the limit and its iterate is infeasible).
fn stopped_early(
    model: &MilpModel,
    solved: &SolvedModel,
    working: &[usize],
    best_bound: f64,
    last_optimum: Option<LpSolution>,
) -> Option<LpSolution> {
    let solution = solved.get_solution();
    let bound = best_bound.min(lagrangian_bound(model, solution.dual_rows()));
    let objective = |values: &[f64]| -> f64 {
        model
            .columns
            .iter()
            .zip(values)
            .map(|(c, v)| c.objective * v)
            .sum()
    };
    let iterate = (solution.columns().len() == working.len())
        .then(|| spread(model, working, solution.columns()))
        .filter(|values| fractional_point_fits(model, values))
        .map(|values| LpSolution {
            values,
            bound,
            iterations: 0,
            optimal: false,
            basis: basis_of(solved, model, working),
        });
    let best = match (iterate, last_optimum) {
        (Some(a), Some(b)) => {
            if objective(&a.values) >= objective(&b.values) {
                a
            } else {
                b
            }
        }
        (a, b) => a.or(b)?,
    };
    Some(LpSolution { bound, ..best })
}

/// A point with every column in `[0, 1]` satisfies every row (within the solver tolerance).
fn fractional_point_fits(model: &MilpModel, values: &[f64]) -> bool {
    let mut activity = vec![0.0; model.rows.len()];
    for (column, v) in model.columns.iter().zip(values) {
        if *v != 0.0 {
            for (row, coef) in &column.entries {
                activity[*row] += coef * v;
            }
        }
    }
    activity
        .iter()
        .zip(&model.rows)
        .all(|(a, row)| *a <= row.upper + FEASIBILITY_TOLERANCE)
}

/// An upper bound on the LP relaxation from any row prices `y` (negative prices count as 0):
/// for `x ∈ [0, 1]` with `Ax ≤ b`, `cx = yAx + (c − yA)x ≤ yb + Σ_j max(0, c_j − y a_j)`
/// (Lagrangian relaxation of the rows; equal to the optimum at the optimal duals of the whole
/// LP, larger otherwise).
pub(super) fn lagrangian_bound(model: &MilpModel, duals: &[f64]) -> f64 {
    let prices: Vec<f64> = duals.iter().map(|y| y.max(0.0)).collect();
    let rows: f64 = model
        .rows
        .iter()
        .zip(&prices)
        .map(|(row, y)| row.upper * y)
        .sum();
    let columns: f64 = (0..model.columns.len())
        .map(|c| reduced_cost(model, c, &prices).max(0.0))
        .sum();
    rows + columns
}

/// The row duals of the LP over all columns at its optimum (tests).
#[cfg(test)]
pub(super) fn optimal_row_duals(model: &MilpModel) -> Vec<f64> {
    let limit = SolveLimit {
        time_s: None,
        simplex_iterations: None,
        mip_nodes: None,
    };
    let solved = relaxation_model(build(model, false), limit)
        .and_then(|m| m.try_solve().map_err(rejected))
        .expect("the relaxation solves");
    assert_eq!(solved.status(), HighsModelStatus::Optimal);
    solved.get_solution().dual_rows().to_vec()
}

/// The solved instance's basis over the model (columns outside the working set: `None`).
fn basis_of(solved: &SolvedModel, model: &MilpModel, working: &[usize]) -> Option<LpBasis> {
    let mut columns: Vec<highs_sys::HighsInt> = vec![0; working.len()];
    let mut rows: Vec<highs_sys::HighsInt> = vec![0; model.rows.len()];
    // SAFETY: reads two counts of a live instance.
    let (num_cols, num_rows) = unsafe {
        (
            highs_sys::Highs_getNumCol(solved.as_ptr()),
            highs_sys::Highs_getNumRow(solved.as_ptr()),
        )
    };
    if usize::try_from(num_cols) != Ok(working.len())
        || usize::try_from(num_rows) != Ok(model.rows.len())
    {
        return None;
    }
    // SAFETY: the instance is alive for the call (borrowed), and both arrays have the lengths
    // `Highs_getBasis` writes: the instance's column and row counts, checked above.
    let status = unsafe {
        highs_sys::Highs_getBasis(solved.as_ptr(), columns.as_mut_ptr(), rows.as_mut_ptr())
    };
    if status != highs_sys::STATUS_OK {
        return None;
    }
    let of = |code: highs_sys::HighsInt| match code {
        BASIS_BASIC => BasisStatus::Basic,
        BASIS_UPPER => BasisStatus::AtUpper,
        _ => BasisStatus::AtLower,
    };
    let mut basis = LpBasis {
        columns: vec![None; model.columns.len()],
        rows: rows.into_iter().map(|r| Some(of(r))).collect(),
    };
    for (c, code) in working.iter().zip(columns) {
        basis.columns[*c] = Some(of(code));
    }
    Some(basis)
}

/// Start `highs` (built over `working`) from `start`. A simplex basis has exactly as many
/// basic variables as rows; the mapped one may not (jobs left with their rows and basic
/// columns, new jobs' rows came in basic), so row slacks are made basic, or the last basic
/// columns non-basic, until it has. A singular result is HiGHS' to repair (it swaps in
/// slacks). Returns whether HiGHS took the basis.
fn set_basis(highs: &mut Model, model: &MilpModel, working: &[usize], start: &LpBasis) -> bool {
    let mut columns: Vec<highs_sys::HighsInt> = working
        .iter()
        .map(|c| match start.columns.get(*c).copied().flatten() {
            Some(BasisStatus::Basic) => BASIS_BASIC,
            Some(BasisStatus::AtUpper) => BASIS_UPPER,
            _ => BASIS_LOWER,
        })
        .collect();
    let mut rows: Vec<highs_sys::HighsInt> = (0..model.rows.len())
        .map(|r| match start.rows.get(r).copied().flatten() {
            Some(BasisStatus::AtLower | BasisStatus::AtUpper) => BASIS_UPPER,
            _ => BASIS_BASIC,
        })
        .collect();
    let basic = columns
        .iter()
        .chain(&rows)
        .filter(|s| **s == BASIS_BASIC)
        .count();
    let mut surplus = basic.saturating_sub(rows.len());
    let mut missing = rows.len().saturating_sub(basic);
    for status in columns.iter_mut().rev() {
        if surplus == 0 {
            break;
        }
        if *status == BASIS_BASIC {
            *status = BASIS_LOWER;
            surplus -= 1;
        }
    }
    for status in &mut rows {
        if missing == 0 {
            break;
        }
        if *status != BASIS_BASIC {
            *status = BASIS_BASIC;
            missing -= 1;
        }
    }
    // SAFETY: the instance is alive (borrowed mutably), it has `working.len()` columns and
    // `model.rows.len()` rows (built by `build_columns` from exactly those), the lengths of
    // the two arrays `Highs_setBasis` reads.
    let status =
        unsafe { highs_sys::Highs_setBasis(highs.as_mut_ptr(), columns.as_ptr(), rows.as_ptr()) };
    status == highs_sys::STATUS_OK
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

/// Whether [`MilpSolver::solve_relaxation`] sifts: time-limited (or unlimited) calls on wide
/// models.
fn sifts(model: &MilpModel, limit: SolveLimit) -> bool {
    limit.simplex_iterations.is_none()
        && model.columns.len() > SIFTING_COLUMNS_PER_ROW * model.rows.len().max(1)
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
        if sifts(model, limit) {
            self.solve_relaxation_sifting(model, limit)
        } else {
            self.solve_relaxation_full(model, limit)
        }
    }

    /// Sifting from the previous cycle's basis (§4.3.6) when the call would sift; otherwise
    /// exactly [`MilpSolver::solve_relaxation`] (the start is ignored).
    fn solve_relaxation_from(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
        start: &LpBasis,
    ) -> Result<LpSolution, SolverError> {
        if sifts(model, limit) {
            sift(model, limit, Some(start))
        } else {
            self.solve_relaxation(model, limit)
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

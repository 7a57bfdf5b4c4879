//! Morpheus job resource model (Morpheus §5): one reservation skyline `s = (s_1 … s_K)` that
//! best fits the skylines of N past runs, solved as a linear program with Clarabel (pure Rust,
//! through good_lp).
//!
//! Objective: `α·A_o(s) + (1 − α)·A_u(s) + β·ε` where
//! - `A_o = 1/N Σ_i Σ_k (s_k − s_ik)⁺` is the average over-allocation,
//! - `A_u = 1/N Σ_i D_iK` the average final under-allocation debt, with
//!   `D_ik = (D_i,k−1 + s_ik − s_k)⁺`, `D_i0 = 0` (the job may catch up later, never bank credit),
//! - and the regularisation `1/N Σ_i Σ_k (s_ik − s_k)⁺ / Σ_k s_ik ≤ ε` keeps the plan from lazily
//!   under-provisioning early and over-provisioning at the end.
//!
//! `β` is either a constant or "auto": solve once without the `β·ε` term (ε then constrains
//! nothing), take that optimum `V`, and use `β = 0.1·V` (§5 "we found that setting β as 0.1V
//! yields good results").
//!
//! Two equivalent LPs are available ([`LpFormulation`]); both have the same optimum (tested):
//! - [`LpFormulation::DebtChain`], the direct transcription: `o_ik ≥ s_k − s_ik, o_ik ≥ 0`,
//!   `D_ik ≥ D_i,k−1 + s_ik − s_k, D_ik ≥ 0` and an ε variable with the regularisation
//!   constraint: 2·N·K + K + 1 variables and ≈ 4·N·K rows. Clarabel needs ~140 iterations on
//!   30 × 1,440 (the 1,440-link debt chains), 12–15 s.
//! - [`LpFormulation::Compact`] (default), the same LP after lossless reductions:
//!   1. *Final debt by suffix sums.* The recursion `D_k = (D_k−1 + x_k)⁺`, `D_0 = 0` (Lindley's)
//!      ends at `D_K = max(0, max_j Σ_{k ≥ j} x_k)`. With suffix sums of the reservation
//!      `T_j = Σ_{k ≥ j} s_k` as the variables (`s_k = T_k − T_k+1 ≥ 0`) this is
//!      `D_i ≥ S_ij − T_j, D_i ≥ 0` with `S_ij = Σ_{k ≥ j} s_ik`: one variable per run instead of
//!      K. A suffix starting where the run uses nothing (`s_ij = 0`) is never the maximum, so
//!      those rows are left out.
//!   2. *One epigraph per step.* For `β > 0` the ε constraint is tight at the optimum, so
//!      `β·ε = β·R(s)` with `R` the regularisation sum; using `(v − s)⁺ = (s − v)⁺ − (s − v)`,
//!      the over-allocation and regularisation terms of step k add up to
//!      `Σ_i c_i (s_k − s_ik)⁺ − β Σ_i w_i (s_k − s_ik)` with `w_i = 1 / (N Σ_k s_ik)` and
//!      `c_i = α/N + β·w_i ≥ 0`. The sum of positive parts is convex piecewise linear in `s_k`
//!      with breakpoints at the sorted `s_ik`, i.e. the maximum of its N + 1 prefix pieces:
//!      one variable `h_k` and one row per distinct run value, instead of N variables and 2·N
//!      rows. ε is reported as `R(s*)`, its value at the optimum (for β = 0 any ε ≥ R(s*) is
//!      optimal; the smallest is reported).
//!   3. *Scaling.* Usage is divided by its mean positive value so the LP data are O(1)
//!      (A_o and A_u scale linearly, R not at all, so β is divided by the same factor).
//!   4. *Centring.* The variables are offsets `τ_k = T_k − R_k` from the suffix sums `R_k` of
//!      the mean skyline, so variables and right-hand sides are deviations (tens of units)
//!      rather than totals (thousands): 68 instead of 76 Clarabel iterations on 30 × 1,440.
//!
//!   On 30 × 1,440 that is 2·K + N = 2,910 variables and ≈ 2·N·K rows of two or three
//!   non-zeros each, with no chains for the interior-point method to crawl along.
//!
//!   5. *Row generation.* At the optimum only one or two pieces per step and a few suffix rows
//!      per run are tight, so the LP is solved on a working set of rows (the `s_k ≥ 0`, floor
//!      and steepest-piece rows, plus for every step and run the row that is most violated at
//!      the mean skyline), and each group's most violated left-out row is added after every
//!      solve (Kelley's cutting planes on the max-type constraints `h_k ≥ max pieces`,
//!      `D_i ≥ max suffixes`). Every round solves a relaxation of the full LP, so the first
//!      optimum that violates no left-out row (by more than 1e-7 in scaled units) is the full
//!      LP's optimum. The second solve of β = auto starts from the first one's rows plus the
//!      rows its optimum violates under the new β. On 30 × 1,440: ~11k of 77k rows, 13 rounds
//!      for one solve, 19 for β = auto, 0.8 s / 1.5 s instead of 1.6 s / 3.2 s with all rows
//!      ([`LpFormulation::CompactAllRows`]).

use std::collections::HashSet;

use good_lp::{
    Expression, ProblemVariables, Solution, SolverModel, Variable, clarabel, constraint, variable,
};
use serde::{Deserialize, Serialize};

/// One historical run: resource usage (e.g. containers) per time step, aligned at job start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSkyline {
    pub run: String,
    pub values: Vec<f64>,
}

/// How β, the weight of ε in the objective, is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Beta {
    Constant(f64),
    /// 0.1 × the optimum of a first solve without the β·ε term (Morpheus §5).
    Auto,
}

/// Which of the two equivalent LPs is handed to the solver (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LpFormulation {
    /// Suffix-sum final debts and one epigraph variable per step, solved by row generation
    /// (fast; default).
    #[default]
    Compact,
    /// The compact LP with all its rows in one solve (reference for the row generation).
    CompactAllRows,
    /// Direct transcription with per-run, per-step over-allocation and debt variables.
    DebtChain,
}

/// Parameters of the skyline LP.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SkylineLpConfig {
    /// Weight of over-allocation in [0, 1] (α = 1: reduce over-allocation as much as possible).
    pub alpha: f64,
    pub beta: Beta,
    /// Clarabel's relative/absolute duality-gap and feasibility tolerance. Measured on a
    /// 30 × 1,440 instance: 1e-6 stopped 6 % above the optimum (the primal residual converges
    /// slowly on the long debt chains), 1e-8 reaches it.
    pub tolerance: f64,
    /// Print Clarabel's iteration log to stdout.
    pub verbose: bool,
    pub formulation: LpFormulation,
}

impl Default for SkylineLpConfig {
    fn default() -> Self {
        Self {
            // α = 0.1 is the Hadoop resource estimator's default.
            alpha: 0.1,
            beta: Beta::Auto,
            tolerance: 1e-8,
            verbose: false,
            formulation: LpFormulation::Compact,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SkylineError {
    #[error("no runs to fit: the skyline LP needs at least one run with a non-empty skyline")]
    NoRuns,
    #[error("alpha must be in [0, 1], got {0}")]
    BadAlpha(f64),
    #[error("beta must be a finite non-negative number, got {0}")]
    BadBeta(f64),
    #[error("run {run:?} has an invalid value {value} at step {step} (must be finite and ≥ 0)")]
    BadValue {
        run: String,
        step: usize,
        value: f64,
    },
    #[error("LP solver failed: {0}")]
    Solver(String),
}

/// Penalty terms of a skyline against the runs it must serve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SkylinePenalties {
    /// A_o: average over-allocation (resource × steps).
    pub over_allocation: f64,
    /// A_u: average final under-allocation debt (resource × steps).
    pub under_allocation: f64,
    /// Average normalised instantaneous under-allocation (what ε bounds).
    pub regularization: f64,
}

impl SkylinePenalties {
    /// `α·A_o + (1 − α)·A_u + β·regularisation`.
    pub fn objective(&self, alpha: f64, beta: f64) -> f64 {
        alpha * self.over_allocation
            + (1.0 - alpha) * self.under_allocation
            + beta * self.regularization
    }
}

/// The fitted job resource model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkylineSolution {
    /// Reservation per time step, whole units (rounded LP optimum).
    pub skyline: Vec<u64>,
    /// The LP optimum before rounding.
    pub fractional: Vec<f64>,
    /// LP objective at the optimum (with the β·ε term).
    pub objective: f64,
    /// Objective recomputed for the integer skyline.
    pub objective_integer: f64,
    /// β used in the final solve.
    pub beta: f64,
    /// Optimum of the first solve when β is "auto".
    pub auto_beta_base: Option<f64>,
    pub epsilon: f64,
    pub penalties_fractional: SkylinePenalties,
    pub penalties_integer: SkylinePenalties,
    pub runs: usize,
    pub steps: usize,
    /// LP size: variables and constraints of the final solve.
    pub variables: usize,
    pub constraints: usize,
    /// Constraints handed to the solver in the last round of row generation (= `constraints`
    /// without row generation).
    pub rows_solved: usize,
    /// Solver calls, both solves of β = auto and all row-generation rounds together.
    pub solver_rounds: usize,
}

/// Evaluates `reservation` against `runs` (runs shorter than the reservation count as zero).
pub fn penalties(runs: &[RunSkyline], reservation: &[f64]) -> SkylinePenalties {
    let steps = reservation.len();
    let mut over = 0.0;
    let mut under = 0.0;
    let mut regularization = 0.0;
    for run in runs {
        let mut debt: f64 = 0.0;
        let mut instantaneous_under = 0.0;
        for (step, reserved) in reservation.iter().enumerate().take(steps) {
            let used = run.values.get(step).copied().unwrap_or(0.0);
            over += (reserved - used).max(0.0);
            instantaneous_under += (used - reserved).max(0.0);
            debt = (debt + used - reserved).max(0.0);
        }
        under += debt;
        let total: f64 = run.values.iter().sum();
        if total > 0.0 {
            regularization += instantaneous_under / total;
        }
    }
    let count = runs.len().max(1) as f64;
    SkylinePenalties {
        over_allocation: over / count,
        under_allocation: under / count,
        regularization: regularization / count,
    }
}

struct LpOutcome {
    reservation: Vec<f64>,
    objective: f64,
    epsilon: f64,
    variables: usize,
    constraints: usize,
    /// Rows handed to the solver in the last round, and solver rounds (row generation).
    rows_solved: usize,
    rounds: usize,
    /// Rows and optimum of the compact LP's last round (warm start of the next solve).
    working_set: WarmStart,
}

/// What one solve of the compact LP hands to the next (β = auto): the rows of its last round
/// and its optimum (same variables; only the piece slopes change with β).
#[derive(Debug, Clone, Default)]
struct WarmStart {
    rows: HashSet<RowKey>,
    values: Vec<f64>,
}

/// Builds and solves the LP once in the configured formulation. `beta = None` drops the β·ε
/// term (the first solve of β = auto). `warm` names compact-LP rows to start from.
fn solve_once(
    runs: &[RunSkyline],
    steps: usize,
    alpha: f64,
    beta: Option<f64>,
    config: &SkylineLpConfig,
    tolerance: f64,
    warm: &WarmStart,
) -> Result<LpOutcome, SkylineError> {
    match config.formulation {
        LpFormulation::Compact => {
            let lp = CompactLp::new(runs, steps, alpha, beta);
            lp.solve(runs, beta, tolerance, config.verbose, Some(warm))
        }
        LpFormulation::CompactAllRows => {
            let lp = CompactLp::new(runs, steps, alpha, beta);
            lp.solve(runs, beta, tolerance, config.verbose, None)
        }
        LpFormulation::DebtChain => {
            solve_debt_chain(runs, steps, alpha, beta, tolerance, config.verbose)
        }
    }
}

fn clarabel_error(error: impl std::fmt::Display) -> SkylineError {
    SkylineError::Solver(error.to_string())
}

/// Identity of a row of the compact LP that row generation may leave out: piece `position`
/// (in the order of run usage at that step) of the epigraph of step `step`, or the debt row of
/// run `run` for the suffix starting at `step`. Keys do not depend on α or β, so the working
/// set of one solve can seed the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RowKey {
    Piece { step: u32, position: u32 },
    Debt { run: u32, step: u32 },
}

/// `Σ coefficient·x ≥ rhs` with at most three terms.
#[derive(Debug, Clone, Copy)]
struct Row {
    terms: [(usize, f64); 3],
    len: usize,
    rhs: f64,
}

impl Row {
    fn new(terms: &[(usize, f64)], rhs: f64) -> Self {
        let mut row = Row {
            terms: [(0, 0.0); 3],
            len: terms.len(),
            rhs,
        };
        row.terms[..terms.len()].copy_from_slice(terms);
        row
    }

    /// How far `x` is from satisfying the row (≤ 0: satisfied).
    fn violation(&self, x: &[f64]) -> f64 {
        self.rhs
            - self.terms[..self.len]
                .iter()
                .map(|(index, coefficient)| coefficient * x[*index])
                .sum::<f64>()
    }
}

/// A max-type group of rows, `y ≥ max(floor, candidates…)`: the epigraph of one step or the
/// final debt of one run. The floor row and the always-kept rows are in every round.
struct RowGroup {
    candidates: std::ops::Range<usize>,
}

/// The compact LP (module documentation, reductions 1–4) as plain data, so that it can be
/// solved by row generation: variables `[τ_0 … τ_K−1, h_0 … h_K−1, D_0 … D_N−1]`.
struct CompactLp {
    steps: usize,
    scale: f64,
    cost: Vec<f64>,
    constant: f64,
    reference_suffix: Vec<f64>,
    /// Rows every round contains (`s_k ≥ 0`, `h_k ≥ 0`, `D_i ≥ 0`).
    fixed: Vec<Row>,
    candidates: Vec<Row>,
    keys: Vec<RowKey>,
    groups: Vec<RowGroup>,
}

impl CompactLp {
    fn new(runs: &[RunSkyline], steps: usize, alpha: f64, beta: Option<f64>) -> Self {
        let count = runs.len() as f64;
        let (positive_sum, positive_count) = runs
            .iter()
            .flat_map(|run| run.values.iter())
            .filter(|value| **value > 0.0)
            .fold((0.0, 0usize), |(sum, n), value| (sum + value, n + 1));
        let scale = if positive_count > 0 {
            positive_sum / positive_count as f64
        } else {
            1.0
        };
        let usage =
            |run: usize, step: usize| runs[run].values.get(step).copied().unwrap_or(0.0) / scale;
        // β·R(s) with R scale-free while the other terms scale with usage: divide β by the scale.
        let beta_scaled = beta.unwrap_or(0.0) / scale;
        // w_i = 1 / (N Σ_k s_ik) in scaled units; runs that never use anything carry no term.
        let weights: Vec<f64> = runs
            .iter()
            .map(|run| {
                let total: f64 = run.values.iter().sum::<f64>() / scale;
                if total > 0.0 {
                    1.0 / (count * total)
                } else {
                    0.0
                }
            })
            .collect();
        let weight_sum: f64 = weights.iter().sum();
        let piece_weights: Vec<f64> = weights
            .iter()
            .map(|weight| alpha / count + beta_scaled * weight)
            .collect();

        // Reference skyline r_k (mean usage): the LP variables are offsets τ_k = T_k − R_k from
        // its suffix sums R_k, so they and the right-hand sides are small (reduction 4).
        let reference: Vec<f64> = (0..steps)
            .map(|step| (0..runs.len()).map(|run| usage(run, step)).sum::<f64>() / count)
            .collect();
        let mut reference_suffix = vec![0.0; steps + 1];
        for step in (0..steps).rev() {
            reference_suffix[step] = reference_suffix[step + 1] + reference[step];
        }
        let suffix = |step: usize| step;
        let epigraph = |step: usize| steps + step;
        let debt = |run: usize| 2 * steps + run;

        let mut cost = vec![0.0; 2 * steps + runs.len()];
        for step in 0..steps {
            cost[epigraph(step)] = 1.0;
        }
        for run in 0..runs.len() {
            cost[debt(run)] = (1.0 - alpha) / count;
        }
        // −β Σ_i w_i Σ_k (s_k − s_ik) = −β W T_1 + β Σ_i w_i S_i; the constant is kept aside.
        let mut constant = 0.0;
        if beta_scaled > 0.0 {
            cost[suffix(0)] -= beta_scaled * weight_sum;
            constant -= beta_scaled * weight_sum * reference_suffix[0];
            // w_i S_i = 1/N for every run that uses anything.
            let used_runs = weights.iter().filter(|weight| **weight > 0.0).count();
            constant += beta_scaled * used_runs as f64 / count;
        }

        let mut fixed = Vec::with_capacity(3 * steps + runs.len());
        let mut candidates = Vec::new();
        let mut keys = Vec::new();
        let mut groups = Vec::with_capacity(steps + runs.len());
        // s_k = T_k − T_{k+1} ≥ 0.
        for (step, mean) in reference.iter().enumerate() {
            if step + 1 < steps {
                fixed.push(Row::new(
                    &[(suffix(step), 1.0), (suffix(step + 1), -1.0)],
                    -mean,
                ));
            } else {
                fixed.push(Row::new(&[(suffix(step), 1.0)], -mean));
            }
        }
        // h_k ≥ Σ_{i ∈ prefix} c_i (s_k − s_ik) for every prefix of the runs sorted by usage.
        let mut order: Vec<usize> = (0..runs.len()).collect();
        for (step, mean) in reference.iter().enumerate() {
            order.sort_by(|a, b| usage(*a, step).total_cmp(&usage(*b, step)));
            fixed.push(Row::new(&[(epigraph(step), 1.0)], 0.0));
            let first = candidates.len();
            let (mut slope, mut intercept) = (0.0, 0.0);
            for (position, run) in order.iter().enumerate() {
                let value = usage(*run, step);
                slope += piece_weights[*run];
                intercept += piece_weights[*run] * value;
                let group_ends = order
                    .get(position + 1)
                    .is_none_or(|next| usage(*next, step) > value);
                if !group_ends || slope <= 0.0 {
                    continue;
                }
                // h_k − slope·(T_k − T_{k+1}) ≥ −intercept
                let rhs = slope * mean - intercept;
                let row = if step + 1 < steps {
                    Row::new(
                        &[
                            (epigraph(step), 1.0),
                            (suffix(step), -slope),
                            (suffix(step + 1), slope),
                        ],
                        rhs,
                    )
                } else {
                    Row::new(&[(epigraph(step), 1.0), (suffix(step), -slope)], rhs)
                };
                candidates.push(row);
                keys.push(RowKey::Piece {
                    step: step as u32,
                    position: position as u32,
                });
            }
            groups.push(RowGroup {
                candidates: first..candidates.len(),
            });
        }
        // D_i ≥ 0 and D_i ≥ S_ij − T_j wherever run i uses something at step j.
        for run in 0..runs.len() {
            fixed.push(Row::new(&[(debt(run), 1.0)], 0.0));
            let first = candidates.len();
            let mut remaining = 0.0;
            for step in (0..steps).rev() {
                let used = usage(run, step);
                remaining += used;
                if used > 0.0 {
                    candidates.push(Row::new(
                        &[(debt(run), 1.0), (suffix(step), 1.0)],
                        remaining - reference_suffix[step],
                    ));
                    keys.push(RowKey::Debt {
                        run: run as u32,
                        step: step as u32,
                    });
                }
            }
            groups.push(RowGroup {
                candidates: first..candidates.len(),
            });
        }
        Self {
            steps,
            scale,
            cost,
            constant,
            reference_suffix,
            fixed,
            candidates,
            keys,
            groups,
        }
    }

    fn row_count(&self) -> usize {
        self.fixed.len() + self.candidates.len()
    }

    /// Solves the LP restricted to the fixed rows and the candidate rows in `working`.
    fn solve_restricted(
        &self,
        working: &[bool],
        tolerance: f64,
        verbose: bool,
    ) -> Result<(Vec<f64>, f64, usize), SkylineError> {
        let mut variables = ProblemVariables::new();
        let x: Vec<Variable> = variables.add_vector(variable(), self.cost.len());
        let mut objective = Expression::with_capacity(self.cost.len());
        for (variable, cost) in x.iter().zip(&self.cost) {
            if *cost != 0.0 {
                objective.add_mul(*cost, *variable);
            }
        }
        let mut problem = variables.minimise(objective.clone()).using(clarabel);
        problem
            .settings()
            .tol_gap_abs(tolerance)
            .tol_gap_rel(tolerance)
            .tol_feas(tolerance)
            .presolve_enable(true)
            // Refinement to 1e-10 instead of Clarabel's 1e-13: same optimum, ~20 % less time.
            .iterative_refinement_reltol(1e-10)
            .iterative_refinement_abstol(1e-10)
            .verbose(verbose);
        let mut rows = 0;
        let selected = self
            .candidates
            .iter()
            .zip(working)
            .filter(|(_, chosen)| **chosen)
            .map(|(row, _)| row);
        for row in self.fixed.iter().chain(selected) {
            let mut expression = Expression::with_capacity(row.len);
            for (index, coefficient) in &row.terms[..row.len] {
                expression.add_mul(*coefficient, x[*index]);
            }
            problem.add_constraint(expression.geq(row.rhs));
            rows += 1;
        }
        let solution = problem.solve().map_err(clarabel_error)?;
        let values: Vec<f64> = x.iter().map(|variable| solution.value(*variable)).collect();
        let value = solution.eval(&objective);
        Ok((values, value, rows))
    }

    /// Row generation (Kelley's cutting planes on the max-type groups): solve with a few rows
    /// per group, add each group's most violated row, repeat until no row is violated. Every
    /// round solves a relaxation of the full LP, so a round whose optimum satisfies all rows
    /// has the full LP's optimum. `warm = None` hands every row to the solver in one round.
    fn solve(
        &self,
        runs: &[RunSkyline],
        beta: Option<f64>,
        tolerance: f64,
        verbose: bool,
        warm: Option<&WarmStart>,
    ) -> Result<LpOutcome, SkylineError> {
        let mut working = vec![warm.is_none(); self.candidates.len()];
        if let Some(warm) = warm {
            for (chosen, key) in working.iter_mut().zip(&self.keys) {
                *chosen = warm.rows.contains(key);
            }
            // The steepest piece of a step bounds s_k from above whatever the other rows are.
            for group in &self.groups[..self.steps] {
                if let Some(last) = group.candidates.clone().last() {
                    working[last] = true;
                }
            }
            // Seed every group with its most violated row at the reference skyline (τ = 0).
            let at_reference = vec![0.0; self.cost.len()];
            self.add_most_violated(&at_reference, &mut working, f64::NEG_INFINITY);
            // … and with the rows the previous optimum violates in this LP.
            if warm.values.len() == self.cost.len() {
                self.add_most_violated(&warm.values, &mut working, 0.0);
            }
        }
        // Rows are in scaled units (usage O(1)); a row violated by less than this is satisfied
        // as well as the interior-point solver satisfies the rows it was given.
        let violation_tolerance: f64 = 1e-7;
        let mut rounds = 0;
        loop {
            rounds += 1;
            let (values, value, rows) = self.solve_restricted(&working, tolerance, verbose)?;
            if warm.is_some() && self.add_most_violated(&values, &mut working, violation_tolerance)
            {
                continue;
            }
            let totals: Vec<f64> = values[..self.steps]
                .iter()
                .zip(&self.reference_suffix)
                .map(|(offset, reference)| offset + reference)
                .collect();
            let reservation: Vec<f64> = (0..self.steps)
                .map(|step| {
                    let next = totals.get(step + 1).copied().unwrap_or(0.0);
                    ((totals[step] - next) * self.scale).max(0.0)
                })
                .collect();
            let working_set = WarmStart {
                rows: self
                    .keys
                    .iter()
                    .zip(&working)
                    .filter(|(_, chosen)| **chosen)
                    .map(|(key, _)| *key)
                    .collect(),
                values,
            };
            return Ok(LpOutcome {
                epsilon: if beta.is_some() {
                    penalties(runs, &reservation).regularization
                } else {
                    0.0
                },
                reservation,
                objective: (value + self.constant) * self.scale,
                variables: self.cost.len(),
                constraints: self.row_count(),
                rows_solved: rows,
                rounds,
                working_set,
            });
        }
    }

    /// Adds, for every group, its most violated row not yet in `working` if that violation
    /// exceeds `threshold`. Returns whether a row was added.
    fn add_most_violated(&self, x: &[f64], working: &mut [bool], threshold: f64) -> bool {
        let mut added = false;
        for group in &self.groups {
            let worst = group
                .candidates
                .clone()
                .filter(|index| !working[*index])
                .map(|index| (self.candidates[index].violation(x), index))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((violation, index)) = worst
                && violation > threshold
            {
                working[index] = true;
                added = true;
            }
        }
        added
    }
}

/// The direct transcription (reference). `beta = None` drops the ε variable and its constraint.
fn solve_debt_chain(
    runs: &[RunSkyline],
    steps: usize,
    alpha: f64,
    beta: Option<f64>,
    tolerance: f64,
    verbose: bool,
) -> Result<LpOutcome, SkylineError> {
    let count = runs.len() as f64;
    let mut variables = ProblemVariables::new();
    let reservation: Vec<Variable> = variables.add_vector(variable().min(0.0), steps);
    let over: Vec<Vec<Variable>> = runs
        .iter()
        .map(|_| variables.add_vector(variable().min(0.0), steps))
        .collect();
    let debt: Vec<Vec<Variable>> = runs
        .iter()
        .map(|_| variables.add_vector(variable().min(0.0), steps))
        .collect();
    let epsilon = beta.map(|_| variables.add(variable().min(0.0)));
    let variable_count = steps * (1 + 2 * runs.len()) + usize::from(epsilon.is_some());

    let mut objective = Expression::with_capacity(runs.len() * (steps + 1) + 1);
    for (run_over, run_debt) in over.iter().zip(&debt) {
        for variable in run_over {
            objective.add_mul(alpha / count, *variable);
        }
        if let Some(final_debt) = run_debt.last() {
            objective.add_mul((1.0 - alpha) / count, *final_debt);
        }
    }
    if let (Some(beta), Some(epsilon)) = (beta, epsilon) {
        objective.add_mul(beta, epsilon);
    }

    let mut problem = variables.minimise(objective.clone()).using(clarabel);
    problem
        .settings()
        .tol_gap_abs(tolerance)
        .tol_gap_rel(tolerance)
        .tol_feas(tolerance)
        .presolve_enable(true)
        .verbose(verbose);
    let mut constraint_count = 0;
    let mut regularization = Expression::with_capacity(runs.len() * steps * 3 + 1);
    for (index, run) in runs.iter().enumerate() {
        let total: f64 = run.values.iter().sum();
        for step in 0..steps {
            let used = run.values.get(step).copied().unwrap_or(0.0);
            // o_ik ≥ s_k − s_ik
            problem.add_constraint(constraint!(over[index][step] - reservation[step] >= -used));
            // D_ik ≥ D_i,k−1 + s_ik − s_k
            if step == 0 {
                problem.add_constraint(constraint!(debt[index][0] + reservation[0] >= used));
            } else {
                problem.add_constraint(constraint!(
                    debt[index][step] - debt[index][step - 1] + reservation[step] >= used
                ));
            }
            constraint_count += 2;
            if epsilon.is_some() && total > 0.0 {
                // u_ik = o_ik − s_k + s_ik, weighted by 1 / (N Σ_k s_ik).
                let weight = 1.0 / (count * total);
                regularization.add_mul(weight, over[index][step]);
                regularization.add_mul(-weight, reservation[step]);
                regularization += weight * used;
            }
        }
    }
    if let Some(epsilon) = epsilon {
        problem.add_constraint(constraint!(regularization <= epsilon));
        constraint_count += 1;
    }
    let solution = problem
        .solve()
        .map_err(|error| SkylineError::Solver(error.to_string()))?;
    let values: Vec<f64> = reservation
        .iter()
        .map(|variable| solution.value(*variable).max(0.0))
        .collect();
    Ok(LpOutcome {
        objective: solution.eval(&objective),
        epsilon: epsilon.map_or(0.0, |variable| solution.value(variable).max(0.0)),
        reservation: values,
        variables: variable_count,
        constraints: constraint_count,
        rows_solved: constraint_count,
        rounds: 1,
        working_set: WarmStart::default(),
    })
}

/// Fits the Morpheus §5 job resource model to `runs`.
pub fn fit_skyline(
    runs: &[RunSkyline],
    config: &SkylineLpConfig,
) -> Result<SkylineSolution, SkylineError> {
    if !(0.0..=1.0).contains(&config.alpha) {
        return Err(SkylineError::BadAlpha(config.alpha));
    }
    if let Beta::Constant(beta) = config.beta
        && !(beta.is_finite() && beta >= 0.0)
    {
        return Err(SkylineError::BadBeta(beta));
    }
    for run in runs {
        if let Some((step, value)) = run
            .values
            .iter()
            .enumerate()
            .find(|(_, value)| !(value.is_finite() && **value >= 0.0))
        {
            return Err(SkylineError::BadValue {
                run: run.run.clone(),
                step,
                value: *value,
            });
        }
    }
    let steps = runs.iter().map(|run| run.values.len()).max().unwrap_or(0);
    if runs.is_empty() || steps == 0 {
        return Err(SkylineError::NoRuns);
    }
    let tolerance = config.tolerance.clamp(1e-12, 1e-2);
    // β = auto: the rows the first solve ended with seed the second (row generation only).
    let mut warm = WarmStart::default();
    let mut rounds = 0;
    let (beta, auto_beta_base) = match config.beta {
        Beta::Constant(beta) => (beta, None),
        Beta::Auto => {
            let first = solve_once(
                runs,
                steps,
                config.alpha,
                None,
                config,
                tolerance,
                &WarmStart::default(),
            )?;
            rounds += first.rounds;
            warm = first.working_set;
            (0.1 * first.objective, Some(first.objective))
        }
    };
    let outcome = solve_once(
        runs,
        steps,
        config.alpha,
        Some(beta),
        config,
        tolerance,
        &warm,
    )?;
    rounds += outcome.rounds;
    let skyline: Vec<u64> = outcome
        .reservation
        .iter()
        .map(|value| value.round() as u64)
        .collect();
    let integer: Vec<f64> = skyline.iter().map(|value| *value as f64).collect();
    let penalties_fractional = penalties(runs, &outcome.reservation);
    let penalties_integer = penalties(runs, &integer);
    Ok(SkylineSolution {
        objective_integer: penalties_integer.objective(config.alpha, beta),
        skyline,
        fractional: outcome.reservation,
        objective: outcome.objective,
        beta,
        auto_beta_base,
        epsilon: outcome.epsilon,
        penalties_fractional,
        penalties_integer,
        runs: runs.len(),
        steps,
        variables: outcome.variables,
        constraints: outcome.constraints,
        rows_solved: outcome.rows_solved,
        solver_rounds: rounds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, values: &[f64]) -> RunSkyline {
        RunSkyline {
            run: name.to_string(),
            values: values.to_vec(),
        }
    }

    /// Exhaustive search over integer skylines with entries in 0..=max (tiny instances only).
    fn brute_force(runs: &[RunSkyline], steps: usize, max: u32, alpha: f64, beta: f64) -> f64 {
        let base = max + 1;
        let mut best = f64::INFINITY;
        for code in 0..base.pow(steps as u32) {
            let mut rest = code;
            let candidate: Vec<f64> = (0..steps)
                .map(|_| {
                    let digit = rest % base;
                    rest /= base;
                    f64::from(digit)
                })
                .collect();
            best = best.min(penalties(runs, &candidate).objective(alpha, beta));
        }
        best
    }

    #[test]
    fn hand_checked_instance_with_single_run_is_reproduced_exactly() {
        // One run: the best reservation is the run itself, objective 0.
        let runs = [run("a", &[2.0, 5.0, 1.0])];
        let config = SkylineLpConfig {
            alpha: 0.5,
            beta: Beta::Constant(1.0),
            ..SkylineLpConfig::default()
        };
        let solution = fit_skyline(&runs, &config).unwrap();
        assert_eq!(solution.skyline, vec![2, 5, 1]);
        assert!(solution.objective.abs() < 1e-5);
    }

    #[test]
    fn two_runs_hand_checked() {
        // Runs [4, 0] and [0, 4], α = 0.5, β = 0. s = (0, 4): run a over-allocates 4 at step 2
        // and its debt of 4 is repaid there; run b is served exactly. A_o = 2, A_u = 0, objective
        // 0.5·2 = 1. s = (0, 0) costs 0.5·4 = 2, s = (0, 2) costs 0.5·1 + 0.5·2 = 1.5, and the
        // brute force below confirms no integer skyline beats 1.
        let runs = [run("a", &[4.0, 0.0]), run("b", &[0.0, 4.0])];
        let config = SkylineLpConfig {
            alpha: 0.5,
            beta: Beta::Constant(0.0),
            ..SkylineLpConfig::default()
        };
        let solution = fit_skyline(&runs, &config).unwrap();
        assert!((solution.objective - 1.0).abs() < 1e-5, "{solution:?}");
        assert!((brute_force(&runs, 2, 6, 0.5, 0.0) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn lp_matches_brute_force_on_small_instances() {
        let runs = [
            run("a", &[1.0, 3.0, 2.0, 0.0]),
            run("b", &[2.0, 2.0, 3.0, 1.0]),
            run("c", &[0.0, 4.0, 1.0, 1.0]),
        ];
        for (alpha, beta) in [(0.1, 0.0), (0.5, 0.3), (0.9, 2.0)] {
            let config = SkylineLpConfig {
                alpha,
                beta: Beta::Constant(beta),
                ..SkylineLpConfig::default()
            };
            let solution = fit_skyline(&runs, &config).unwrap();
            let best_integer = brute_force(&runs, 4, 5, alpha, beta);
            // The LP relaxation can only be at least as good as the best integer skyline.
            assert!(
                solution.objective <= best_integer * (1.0 + 1e-4) + 1e-6,
                "alpha={alpha} lp={} brute={best_integer}",
                solution.objective
            );
            // The LP objective agrees with evaluating its own solution.
            let evaluated = solution.penalties_fractional.objective(alpha, beta);
            assert!(
                (evaluated - solution.objective).abs() < 1e-4,
                "{evaluated} vs {}",
                solution.objective
            );
            assert!(solution.objective_integer + 1e-9 >= best_integer);
        }
    }

    #[test]
    fn alpha_one_minimises_over_allocation_and_alpha_zero_covers_everything() {
        let runs = [run("a", &[1.0, 5.0]), run("b", &[3.0, 5.0])];
        let greedy = fit_skyline(
            &runs,
            &SkylineLpConfig {
                alpha: 0.0,
                beta: Beta::Constant(0.0),
                ..SkylineLpConfig::default()
            },
        )
        .unwrap();
        // Only under-allocation counts: the final debt must be zero for both runs.
        assert!(greedy.penalties_fractional.under_allocation < 1e-5);
        let stingy = fit_skyline(
            &runs,
            &SkylineLpConfig {
                alpha: 1.0,
                beta: Beta::Constant(0.0),
                ..SkylineLpConfig::default()
            },
        )
        .unwrap();
        assert!(stingy.penalties_fractional.over_allocation < 1e-5);
    }

    #[test]
    fn auto_beta_is_a_tenth_of_the_first_optimum() {
        let runs = [run("a", &[1.0, 3.0, 2.0]), run("b", &[2.0, 2.0, 4.0])];
        let solution = fit_skyline(&runs, &SkylineLpConfig::default()).unwrap();
        let base = solution.auto_beta_base.unwrap();
        assert!((solution.beta - 0.1 * base).abs() < 1e-12);
        assert!(solution.objective + 1e-6 >= base);
    }

    #[test]
    fn compact_and_debt_chain_formulations_reach_the_same_optimum() {
        use rand::rngs::StdRng;
        use rand::{RngExt, SeedableRng};
        let mut rng = StdRng::seed_from_u64(3);
        for instance in 0..12 {
            // Ragged runs with idle steps, ties and bursts: what the reductions must survive.
            let run_count = 1 + instance % 5;
            let steps = 3 + (instance * 7) % 20;
            let runs: Vec<RunSkyline> = (0..run_count)
                .map(|index| {
                    let length = rng.random_range(1..=steps);
                    let values: Vec<f64> = (0..length)
                        .map(|_| match rng.random_range(0..4) {
                            0 => 0.0,
                            1 => 5.0,
                            _ => f64::from(rng.random_range(0..40)),
                        })
                        .collect();
                    run(&format!("r{index}"), &values)
                })
                .collect();
            for (alpha, beta) in [
                (0.1, Beta::Auto),
                (0.5, Beta::Constant(3.0)),
                (0.9, Beta::Constant(0.0)),
                (0.0, Beta::Constant(50.0)),
                (1.0, Beta::Auto),
            ] {
                let solve = |formulation| {
                    fit_skyline(
                        &runs,
                        &SkylineLpConfig {
                            alpha,
                            beta,
                            formulation,
                            ..SkylineLpConfig::default()
                        },
                    )
                    .unwrap()
                };
                let compact = solve(LpFormulation::Compact);
                let all_rows = solve(LpFormulation::CompactAllRows);
                let chain = solve(LpFormulation::DebtChain);
                let tolerance = 1e-5 * (1.0 + chain.objective.abs());
                assert!(
                    (all_rows.objective - chain.objective).abs() < tolerance,
                    "instance {instance} alpha {alpha} beta {beta:?}: all rows {} chain {}",
                    all_rows.objective,
                    chain.objective
                );
                assert!(
                    (compact.objective - chain.objective).abs() < tolerance,
                    "instance {instance} alpha {alpha} beta {beta:?}: compact {} chain {}",
                    compact.objective,
                    chain.objective
                );
                // The compact LP's value is what its skyline really costs.
                let evaluated = compact.penalties_fractional.objective(alpha, compact.beta);
                assert!((evaluated - compact.objective).abs() < tolerance);
                assert!((compact.beta - chain.beta).abs() < 1e-5 * (1.0 + chain.beta));
                assert!(compact.variables < chain.variables);
            }
        }
    }

    #[test]
    fn row_generation_reaches_the_optimum_of_the_full_compact_lp() {
        // Larger than the brute-force instances, so that many rows are left out at first: the
        // ramp / decay / sine shape of the benchmark with noise and ragged run lengths.
        use rand::rngs::StdRng;
        use rand::{RngExt, SeedableRng};
        let mut rng = StdRng::seed_from_u64(11);
        let steps = 240;
        let runs: Vec<RunSkyline> = (0..12)
            .map(|index| {
                let scale = rng.random_range(0.8..1.2);
                let length = rng.random_range(200..=steps);
                let values: Vec<f64> = (0..length)
                    .map(|step| {
                        let x = step as f64 / length as f64;
                        let base = 200.0 * (x * 10.0).min(1.0) * (1.0 - 0.5 * x)
                            + 50.0 * (6.0 * std::f64::consts::PI * x).sin();
                        (scale * base + rng.random_range(-25.0..25.0))
                            .max(0.0)
                            .round()
                    })
                    .collect();
                run(&format!("r{index}"), &values)
            })
            .collect();
        for (alpha, beta) in [
            (0.1, Beta::Auto),
            (0.5, Beta::Constant(20.0)),
            (0.9, Beta::Auto),
        ] {
            let solve = |formulation| {
                fit_skyline(
                    &runs,
                    &SkylineLpConfig {
                        alpha,
                        beta,
                        formulation,
                        ..SkylineLpConfig::default()
                    },
                )
                .unwrap()
            };
            let generated = solve(LpFormulation::Compact);
            let full = solve(LpFormulation::CompactAllRows);
            let tolerance = 1e-6 * full.objective.abs();
            assert!(
                (generated.objective - full.objective).abs() < tolerance,
                "alpha {alpha}: row generation {} all rows {}",
                generated.objective,
                full.objective
            );
            // The reported optimum is what the skyline costs, not just the relaxation's value.
            let evaluated = generated
                .penalties_fractional
                .objective(alpha, generated.beta);
            assert!((evaluated - generated.objective).abs() < tolerance);
            // Rows were really left out, and more than one round was needed.
            assert!(
                generated.rows_solved < full.rows_solved / 2,
                "{generated:?}"
            );
            assert!(generated.solver_rounds > full.solver_rounds);
            assert_eq!(full.rows_solved, full.constraints);
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(
            fit_skyline(&[], &SkylineLpConfig::default()),
            Err(SkylineError::NoRuns)
        ));
        let runs = [run("a", &[1.0, f64::NAN])];
        assert!(matches!(
            fit_skyline(&runs, &SkylineLpConfig::default()),
            Err(SkylineError::BadValue { step: 1, .. })
        ));
        let config = SkylineLpConfig {
            alpha: 1.5,
            ..SkylineLpConfig::default()
        };
        assert!(matches!(
            fit_skyline(&[run("a", &[1.0])], &config),
            Err(SkylineError::BadAlpha(_))
        ));
    }
}

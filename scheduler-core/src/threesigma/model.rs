//! The MILP of one cycle as plain data, and the solver interface.
//!
//! Every column is a binary indicator (an option `I_jo` or a preemption `I_r`, §4.3.3/§4.3.5);
//! every row is `Σ coef · x ≤ upper`. Tests inspect this structure directly; solvers receive it
//! through [`MilpSolver`].

use serde::{Deserialize, Serialize};

/// What a column stands for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ColumnKind {
    /// Start pending job `job` (index into the cycle's pending list) in partition `partition`
    /// at start step `step` of the plan-ahead window.
    Option {
        job: usize,
        partition: usize,
        step: usize,
    },
    /// Preempt running job `running` (index into the cycle's running list).
    Preempt { running: usize },
}

/// One binary column: objective coefficient and its non-zero row entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Column {
    pub kind: ColumnKind,
    pub objective: f64,
    pub entries: Vec<(usize, f64)>,
}

/// What a row bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RowKind {
    /// `Σ_o I_jo ≤ 1` for pending job `job` (demand constraint).
    OneOption { job: usize },
    /// Capacity of `partition` at window step `step` (Eq. 3 with §4.3.5's credit).
    Capacity { partition: usize, step: usize },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub kind: RowKind,
    pub upper: f64,
}

/// A maximisation MILP over binary columns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MilpModel {
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
}

/// Slack allowed on a row when checking a solution (solver tolerances).
pub const FEASIBILITY_TOLERANCE: f64 = 1e-6;

impl MilpModel {
    pub fn nonzeros(&self) -> usize {
        self.columns.iter().map(|c| c.entries.len()).sum()
    }

    /// Objective of a 0/1 selection.
    pub fn objective(&self, chosen: &[bool]) -> f64 {
        self.columns
            .iter()
            .zip(chosen)
            .filter(|(_, on)| **on)
            .map(|(c, _)| c.objective)
            .sum()
    }

    /// Row activities of a 0/1 selection.
    pub fn activities(&self, chosen: &[bool]) -> Vec<f64> {
        let mut activity = vec![0.0; self.rows.len()];
        for (column, on) in self.columns.iter().zip(chosen) {
            if *on {
                for (row, coef) in &column.entries {
                    activity[*row] += coef;
                }
            }
        }
        activity
    }

    /// The first row a 0/1 selection violates, if any.
    pub fn violated_row(&self, chosen: &[bool]) -> Option<usize> {
        if chosen.len() != self.columns.len() {
            return Some(0);
        }
        self.activities(chosen)
            .iter()
            .zip(&self.rows)
            .position(|(a, row)| *a > row.upper + FEASIBILITY_TOLERANCE)
    }
}

/// The LP relaxation's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct LpSolution {
    /// Value of each column in `[0, 1]`: a feasible point of the relaxation.
    pub values: Vec<f64>,
    /// An upper bound on the relaxation, so on any integer solution: its optimum when
    /// `optimal`, otherwise a Lagrangian bound from the solver's last row prices.
    pub bound: f64,
    /// Simplex iterations the solver used (0 when it does not count them).
    pub iterations: u64,
    /// The solver proved `values` optimal (`bound` is their objective). `false`: the solver's
    /// limit ended the solve and `values` is the best feasible point it had.
    pub optimal: bool,
    /// The solver's last simplex basis, when it has one (a warm start for the next cycle's
    /// relaxation, [`MilpSolver::solve_relaxation_from`]).
    pub basis: Option<LpBasis>,
}

/// Where a column or row stands in a simplex basis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BasisStatus {
    Basic,
    /// Non-basic at its lower bound (a column at 0).
    AtLower,
    /// Non-basic at its upper bound (a column at 1, a `≤` row at its bound).
    AtUpper,
}

/// A simplex basis over a model's columns and rows. `None`: the solver never worked with that
/// column (sifting's columns outside the working set, at 0) or, in a warm start, a column or row
/// the previous cycle did not have.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LpBasis {
    pub columns: Vec<Option<BasisStatus>>,
    pub rows: Vec<Option<BasisStatus>>,
}

/// How much a solver call may spend: wall-clock time, work, or both (the first reached ends
/// the call). A limit of work (simplex iterations, branch-and-bound nodes) makes the answer
/// independent of machine speed and load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SolveLimit {
    pub time_s: Option<f64>,
    /// Simplex iterations of an LP relaxation.
    pub simplex_iterations: Option<u64>,
    /// Branch-and-bound nodes of a MILP.
    pub mip_nodes: Option<u64>,
}

impl SolveLimit {
    pub fn time(time_s: f64) -> Self {
        Self {
            time_s: Some(time_s),
            simplex_iterations: None,
            mip_nodes: None,
        }
    }

    /// Nothing left to spend.
    pub fn exhausted(&self) -> bool {
        self.time_s.is_some_and(|t| t <= 0.0) || self.mip_nodes == Some(0)
    }
}

/// What came back from a MILP run.
#[derive(Debug, Clone, PartialEq)]
pub struct MipSolution {
    pub chosen: Vec<bool>,
    pub objective: f64,
}

/// Why a solver gave no answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SolverError {
    #[error("solver gave no solution: {0}")]
    NoSolution(String),
    #[error("solver rejected the model: {0}")]
    Rejected(String),
}

/// A solver for [`MilpModel`]s. Limits are the solver's own (it runs on the caller's
/// thread; the core never reads a clock).
pub trait MilpSolver {
    fn name(&self) -> &'static str;
    /// Solve the LP relaxation (every column in `[0, 1]`).
    fn solve_relaxation(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError>;
    /// Solve the LP relaxation starting from `start`, the previous cycle's basis mapped onto
    /// this model (3Sigma §4.3.6: consecutive cycles share most jobs, so the previous solution
    /// is a good start). A hint only: the answer is the relaxation's, whatever the start. By
    /// default the start is ignored.
    fn solve_relaxation_from(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
        start: &LpBasis,
    ) -> Result<LpSolution, SolverError> {
        let _ = start;
        self.solve_relaxation(model, limit)
    }
    /// Improve on `start` (a feasible 0/1 selection) as a MILP within the time limit. `None`
    /// when the solver found nothing better or had no time.
    fn improve(
        &mut self,
        model: &MilpModel,
        start: &[bool],
        limit: SolveLimit,
    ) -> Result<Option<MipSolution>, SolverError>;
}

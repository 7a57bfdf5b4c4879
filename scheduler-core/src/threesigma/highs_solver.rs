//! [`MilpSolver`] over HiGHS (the `highs` crate; HiGHS is compiled from source by `highs-sys`).
//!
//! Single-threaded and quiet: the guarantor's cycle owns one core, and HiGHS' time limit bounds
//! each call (measured before this was written: HiGHS alone finds no integer point in 0.2 s on a
//! 3Sigma-sized model, so the LP relaxation is what the cycle leans on).

use super::model::{LpSolution, MilpModel, MilpSolver, MipSolution, SolveLimit, SolverError};
use highs::{ColProblem, HighsModelStatus, HighsSolutionStatus, Model, Sense};

/// HiGHS, one thread, quiet.
#[derive(Debug, Default, Clone)]
pub struct HighsSolver;

fn build(model: &MilpModel, integer: bool) -> ColProblem {
    let mut problem = ColProblem::default();
    let rows: Vec<_> = model
        .rows
        .iter()
        .map(|row| problem.add_row(..=row.upper))
        .collect();
    for column in &model.columns {
        let entries: Vec<_> = column
            .entries
            .iter()
            .map(|(row, coef)| (rows[*row], *coef))
            .collect();
        problem.add_column_with_integrality(column.objective, 0.0..=1.0, entries, integer);
    }
    problem
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

impl MilpSolver for HighsSolver {
    fn name(&self) -> &'static str {
        "highs"
    }

    fn solve_relaxation(
        &mut self,
        model: &MilpModel,
        limit: SolveLimit,
    ) -> Result<LpSolution, SolverError> {
        if model.columns.is_empty() {
            return Ok(LpSolution {
                values: Vec::new(),
                bound: 0.0,
                iterations: 0,
            });
        }
        let mut highs = Model::try_new(build(model, false))
            .map_err(|status| SolverError::Rejected(format!("{status:?}")))?;
        highs.set_sense(Sense::Maximise);
        configure_relaxation(&mut highs, limit);
        let solved = highs
            .try_solve()
            .map_err(|status| SolverError::Rejected(format!("{status:?}")))?;
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
                    iterations: u64::try_from(solved.simplex_iteration_count()).unwrap_or(0),
                })
            }
            other => Err(SolverError::NoSolution(format!("LP relaxation {other:?}"))),
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
        let mut highs = Model::try_new(build(model, true))
            .map_err(|status| SolverError::Rejected(format!("{status:?}")))?;
        highs.set_sense(Sense::Maximise);
        configure(&mut highs, limit);
        let start: Vec<f64> = start.iter().map(|on| f64::from(u8::from(*on))).collect();
        highs
            .try_set_solution(Some(&start), None, None, None)
            .map_err(|status| SolverError::Rejected(format!("MIP start {status:?}")))?;
        let solved = highs
            .try_solve()
            .map_err(|status| SolverError::Rejected(format!("{status:?}")))?;
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

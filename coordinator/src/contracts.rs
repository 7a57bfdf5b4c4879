//! SLO contracts (`inference::slo::SloContract`, Morpheus §3) as recurring reservation requests
//! (§6.1): the conversion both `coordinator reservations submit` (the operator) and
//! `testbed reservations submit` (the owning app) use.
//!
//! A contract's skyline (containers per step, Morpheus §5) becomes an `order_no_gap` request with
//! one stage per run of equal demand, each stage a gang of its containers for the run's length, in
//! the contract's window, recurring every period (§6.1). Inner steps without demand are held at
//! one container (an `order_no_gap` stage cannot be empty), leading and trailing ones are dropped,
//! and a skyline of more runs than the protocol's stage bound is coarsened by merging the
//! neighbouring runs whose merge over-provisions least (the larger demand of the two is kept, so
//! the reservation never holds less than the skyline).

use inference::slo::{ContractStatus, SloContract};
use scheduler_core::Resources;
use scheduler_core::protocol::limits::{MAX_RESERVATION_ID_BYTES, MAX_RESERVATION_STAGES};
use scheduler_core::reservation::{Interpreter, ReservationDefinition, Stage};

/// How contracts' skylines become containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// The size of one container of the skyline.
    pub container: Resources,
    /// The length of one skyline step.
    pub step_ms: u64,
}

/// The reservation id of a job: its name with every character outside `A-Z a-z 0-9 . _ -`
/// replaced by `-`, cut to the id bound.
pub fn reservation_id_of(job: &str) -> String {
    let mut id: String = job
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    id.truncate(MAX_RESERVATION_ID_BYTES);
    if id.is_empty() {
        id.push('-');
    }
    id
}

/// Runs of equal demand `(containers, steps)`, bounded by `max_runs` (see the module doc).
pub fn skyline_runs(skyline: &[u64], max_runs: usize) -> Vec<(u64, u64)> {
    let first = skyline.iter().position(|&c| c > 0);
    let last = skyline.iter().rposition(|&c| c > 0);
    let (Some(first), Some(last)) = (first, last) else {
        return Vec::new();
    };
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &c in &skyline[first..=last] {
        let c = c.max(1);
        match runs.last_mut() {
            Some((v, n)) if *v == c => *n += 1,
            _ => runs.push((c, 1)),
        }
    }
    while runs.len() > max_runs.max(1) {
        // Merge the neighbours whose merge adds the fewest container-steps.
        let i = (0..runs.len() - 1)
            .min_by_key(|&i| {
                let ((a, la), (b, lb)) = (runs[i], runs[i + 1]);
                a.max(b) * (la + lb) - (a * la + b * lb)
            })
            .expect("at least two runs");
        let (a, la) = runs[i];
        let (b, lb) = runs.remove(i + 1);
        runs[i] = (a.max(b), la + lb);
    }
    runs
}

/// The recurring reservation request of a signed-off contract, or why it has none.
pub fn definition_of(
    contract: &SloContract,
    sizing: Sizing,
) -> Result<ReservationDefinition, String> {
    match contract.status {
        ContractStatus::SignedOff => {}
        ContractStatus::Proposed => return Err("not signed off by its owner yet".into()),
        ContractStatus::Rejected => return Err("rejected by its owner".into()),
    }
    let ms = |s: f64, field: &str| -> Result<f64, String> {
        if s.is_finite() && s >= 0.0 {
            Ok(s * 1000.0)
        } else {
            Err(format!("{field}: {s} is not a time of the period"))
        }
    };
    let period_ms = ms(contract.period, "period")?.round() as u64;
    if period_ms == 0 {
        return Err("period: must be positive".into());
    }
    let arrival_ms = ms(contract.earliest_start, "earliest_start")?.floor() as u64;
    let deadline_ms = ms(contract.deadline, "deadline")?.ceil() as u64;
    let skyline = contract
        .skyline
        .as_deref()
        .ok_or("skyline: the contract has none; its reservation cannot be sized")?;
    let runs = skyline_runs(skyline, MAX_RESERVATION_STAGES);
    if runs.is_empty() {
        return Err("skyline: asks for no container at any step".into());
    }
    let stages = runs
        .into_iter()
        .map(|(containers, steps)| {
            let containers = u32::try_from(containers)
                .map_err(|_| format!("skyline: {containers} containers in one step"))?;
            Ok(Stage {
                containers,
                gang: containers,
                duration_ms: steps.saturating_mul(sizing.step_ms),
                size: sizing.container,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(ReservationDefinition {
        arrival_ms,
        deadline_ms,
        interpreter: Interpreter::OrderNoGap,
        stages,
        recurrence_ms: Some(period_ms),
        alignment_penalty: 0.0,
    })
}

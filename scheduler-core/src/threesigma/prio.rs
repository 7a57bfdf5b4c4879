//! Prio (3Sigma §5, Table 1): SLO jobs have strict priority over best-effort jobs and no runtime
//! knowledge is used, like Borg. Each cycle: SLO jobs in submission order, then best-effort
//! jobs, each started at once on the first partition with room (preferred partitions first); an
//! SLO job that finds no room preempts best-effort work (most recently started first) in the
//! partition where that frees enough.

use super::{
    CycleDecision, CycleInput, CyclePolicy, CycleRecord, DecisionMethod, PendingJob, Placement,
};

#[derive(Debug, Default, Clone)]
pub struct PrioScheduler;

impl CyclePolicy for PrioScheduler {
    fn name(&self) -> &str {
        "Prio"
    }

    fn cycle(&mut self, input: &CycleInput<'_>) -> CycleDecision {
        let mut free: Vec<f64> = input
            .partitions
            .iter()
            .map(|p| p.capacity - p.reserved.first().copied().unwrap_or(0.0))
            .collect();
        for r in input.running {
            if let Some(f) = free.get_mut(r.partition) {
                *f -= f64::from(r.gang);
            }
        }
        let mut order: Vec<&PendingJob> = input.pending.iter().collect();
        order.sort_by(|a, b| {
            b.utility
                .is_slo()
                .cmp(&a.utility.is_slo())
                .then(a.submit.total_cmp(&b.submit))
                .then(a.id.cmp(&b.id))
        });
        // Preemptible running jobs per partition, most recently started first.
        let mut victims: Vec<Vec<usize>> = vec![Vec::new(); input.partitions.len()];
        for (i, r) in input.running.iter().enumerate() {
            if r.preemptible && !r.utility.is_slo() && r.partition < victims.len() {
                victims[r.partition].push(i);
            }
        }
        for list in &mut victims {
            list.sort_by(|a, b| {
                input.running[*b]
                    .started
                    .total_cmp(&input.running[*a].started)
            });
        }
        let mut start_now = Vec::new();
        let mut preempt = Vec::new();
        for job in order {
            let gang = f64::from(job.gang);
            let mut choices = job.choices.clone();
            choices.sort_by(|a, b| a.runtime_factor.total_cmp(&b.runtime_factor));
            let fits = choices
                .iter()
                .find(|c| free.get(c.partition).is_some_and(|f| *f >= gang));
            let chosen = match fits {
                Some(c) => Some(c.partition),
                None if job.utility.is_slo() => choices.iter().find_map(|c| {
                    let f = *free.get(c.partition)?;
                    let room: f64 = victims[c.partition]
                        .iter()
                        .map(|v| f64::from(input.running[*v].gang))
                        .sum();
                    if f + room < gang {
                        return None;
                    }
                    let mut freed = f;
                    while freed < gang {
                        let v = victims[c.partition].remove(0);
                        freed += f64::from(input.running[v].gang);
                        free[c.partition] += f64::from(input.running[v].gang);
                        preempt.push(input.running[v].id);
                    }
                    Some(c.partition)
                }),
                None => None,
            };
            if let Some(partition) = chosen {
                free[partition] -= gang;
                start_now.push(Placement {
                    job: job.id,
                    partition,
                    start: input.now,
                    expected_utility: 0.0,
                });
            }
        }
        CycleDecision {
            start_now,
            deferred: Vec::new(),
            preempt,
            record: CycleRecord {
                now: input.now,
                method: DecisionMethod::Priority,
                pending: input.pending.len(),
                columns: 0,
                rows: 0,
                nonzeros: 0,
                lp_bound: None,
                rounded_objective: None,
                objective: 0.0,
                note: None,
                lp_iterations: None,
                lp_stopped_early: false,
            },
        }
    }
}

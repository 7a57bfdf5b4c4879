//! The Dynamic Reprovisioning Algorithm (Morpheus §7, DRA), sans-IO: when a job's demand (used
//! containers plus pending asks) exceeds what its reservation allocates at this moment, the
//! current instance is stretched for up to `extension_ms` (default 1 min) by the extra demand,
//! capped at `rho` (default 2) times the most the reservation allocated over the last
//! `recent_ms` (default 2 min). The stretch is committed only when the plan has room (the paper
//! invokes LowCost for it; the extra is asked for at this exact time, so that is a capacity
//! check), as a one-off piece of fixed load that belongs to the reservation's current instance
//! only; the caller re-evaluates after `extension_ms` and may delete the stretch earlier.
//!
//! Only the decision and the plan side are here; monitoring jobs in the live loop is not done.

use super::Rejection;
use super::plan::Plan;
use crate::Resources;
use serde::{Deserialize, Serialize};

/// What separates a reservation's id from the start of one of its DRA stretches in the
/// stretch's id (reservation ids never contain it).
pub const STRETCH_MARK: &str = "/dra@";

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dra {
    /// ρ: how far above its recent allocation a job may be stretched.
    pub rho: f64,
    /// T: how long one stretch lasts before DRA is evaluated again.
    pub extension_ms: u64,
    /// How far back "recent" allocation goes.
    pub recent_ms: u64,
}

impl Default for Dra {
    fn default() -> Dra {
        Dra {
            rho: 2.0,
            extension_ms: 60_000,
            recent_ms: 120_000,
        }
    }
}

impl Dra {
    /// The extra resources to grant (zero when the demand fits the allocation): the demand above
    /// the allocation, with the total capped at ρ · max(R_recent). The demand already counts
    /// only what the job asks for, so it never gets more than it requests.
    pub fn extra(
        &self,
        allocated_now: Resources,
        demand: Resources,
        recent_max: Resources,
    ) -> Resources {
        if demand.fits_in(&allocated_now) {
            return Resources::ZERO;
        }
        let scale = |v: u64| (v as f64 * self.rho).floor().min(u64::MAX as f64) as u64;
        let cap = Resources::new(scale(recent_max.cpu_millis), scale(recent_max.memory_mib));
        demand.min(&cap).saturating_sub(&allocated_now)
    }
}

impl Plan {
    /// What reservation `id` allocates at `at_ms` (agenda time), without its stretches.
    pub fn allocated_at(&self, id: &str, at_ms: u64) -> Option<Resources> {
        let r = self.get(id)?;
        let t = (at_ms / self.config().step_ms) % u64::from(self.steps());
        Some(r.at_step(t as u32))
    }

    /// What reservation `id` allocates at `at_ms` (agenda time) with the DRA stretches of its
    /// current instance: what the job may hold at that moment (Morpheus §7).
    pub fn allocated_with_stretches_at(&self, id: &str, at_ms: u64) -> Option<Resources> {
        let base = self.allocated_at(id, at_ms)?;
        let t = ((at_ms / self.config().step_ms) % u64::from(self.steps())) as u32;
        Some(
            self.stretches_of(id)
                .fold(base, |acc, s| acc.saturating_add(&s.at_step(t))),
        )
    }

    /// The DRA stretches held for reservation `id` (fixed load named `{id}/dra@{start}`).
    pub fn stretches_of<'a>(
        &'a self,
        id: &str,
    ) -> impl Iterator<Item = &'a super::plan::Reservation> + 'a {
        let prefix = format!("{id}{STRETCH_MARK}");
        self.reservations_from(&prefix)
            .take_while(move |r| r.id.starts_with(&prefix))
            .filter(|r| r.definition.is_none())
    }

    /// The most the plan commits at any step of `[from_step, from_step + steps)` (agenda steps,
    /// wrapping around the agenda's end).
    pub fn load_max(&self, from_step: u32, steps: u32) -> Resources {
        let len = self.steps();
        let steps = steps.clamp(1, len);
        let from = from_step % len;
        let max = |a: Resources, b: Resources| {
            Resources::new(
                a.cpu_millis.max(b.cpu_millis),
                a.memory_mib.max(b.memory_mib),
            )
        };
        let over = |s: u32, e: u32| {
            self.load()
                .runs()
                .filter(move |r| r.0 < e && r.1 > s)
                .fold(Resources::ZERO, |a, r| max(a, r.2))
        };
        if from + steps <= len {
            over(from, from + steps)
        } else {
            max(over(from, len), over(0, from + steps - len))
        }
    }

    /// Run DRA for reservation `id` at `now_ms` with the job's current `demand`: `Ok(None)` when
    /// no stretch is needed, `Ok(Some(stretch_id))` when one was committed (delete it by that id
    /// to end it early), or why the plan has no room.
    pub fn reprovision(
        &mut self,
        id: &str,
        now_ms: u64,
        demand: Resources,
        dra: &Dra,
    ) -> Result<Option<String>, Rejection> {
        let Some(r) = self.get(id) else {
            return Err(Rejection::Unknown(id.to_string()));
        };
        if r.definition.is_none() {
            return Err(Rejection::Invalid(
                "id: fixed load is not reprovisioned".into(),
            ));
        }
        let step = self.config().step_ms;
        let steps = u64::from(self.steps());
        let now_step = (now_ms / step) % steps;
        let dense = r.dense(self.steps());
        let back = dra.recent_ms.div_ceil(step).min(steps - 1);
        let recent_max = (0..=back)
            .map(|k| dense[((now_step + steps - k) % steps) as usize])
            .fold(Resources::ZERO, |a, b| {
                Resources::new(
                    a.cpu_millis.max(b.cpu_millis),
                    a.memory_mib.max(b.memory_mib),
                )
            });
        let extra = dra.extra(dense[now_step as usize], demand, recent_max);
        if extra.is_zero() {
            return Ok(None);
        }
        // The stretch stays inside the agenda; one that would wrap is cut at its end.
        let start = now_step * step;
        let end = (start + dra.extension_ms.max(step)).min(steps * step);
        let stretch = format!("{id}{STRETCH_MARK}{start}");
        // A second call within the same step replaces the first.
        self.delete(&stretch);
        self.add_fixed(&stretch, start, end, extra)?;
        Ok(Some(stretch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservation::{Algorithm, Interpreter, PlanConfig, ReservationDefinition, Stage};

    const MIN: u64 = 60_000;

    #[test]
    fn extra_is_the_demand_above_allocation_capped_by_rho() {
        let d = Dra::default();
        let r = |c: u64| Resources::new(c * 1000, c * 1024);
        assert_eq!(d.extra(r(10), r(8), r(10)), Resources::ZERO);
        assert_eq!(d.extra(r(10), r(14), r(10)), r(4));
        // Capped at 2 × 10 in total: 10 more at most.
        assert_eq!(d.extra(r(10), r(50), r(10)), r(10));
        // Allocation fell to 5 at the end of a stage, recent max 10: up to 20 in total.
        assert_eq!(d.extra(r(5), r(30), r(10)), r(15));
    }

    #[test]
    fn stretch_is_committed_only_with_room() {
        let mut p = Plan::new(
            PlanConfig {
                step_ms: MIN,
                horizon_ms: 60 * MIN,
                algorithm: Algorithm::LowCost,
                allocate_left: false,
                smoothness: 10,
            },
            Resources::new(20_000, 20_480),
        )
        .unwrap();
        let stage = |n: u32| Stage {
            containers: n,
            gang: n,
            duration_ms: 5 * MIN,
            size: Resources::new(1000, 1024),
        };
        let def = ReservationDefinition {
            arrival_ms: 0,
            deadline_ms: 10 * MIN,
            interpreter: Interpreter::All,
            stages: vec![stage(10)],
            recurrence_ms: Some(20 * MIN),
            alignment_penalty: 0.0,
        };
        p.reserve("job", def).unwrap();
        assert_eq!(
            p.allocated_at("job", 9 * MIN),
            Some(Resources::new(10_000, 10_240))
        );
        // At step 10 the reservation has ended but the job still wants 6 containers: a stretch
        // of 6 for one minute (recent max 10, cap 20).
        let s = p
            .reprovision("job", 10 * MIN, Resources::new(6000, 6144), &Dra::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            p.allocation(&s).unwrap(),
            vec![crate::reservation::AllocationInterval {
                start_ms: 10 * MIN,
                end_ms: 11 * MIN,
                cpu_millis: 6000,
                memory_mib: 6144
            }]
        );
        p.check_invariants().unwrap();
        // Only this instance is stretched.
        assert_eq!(p.load().at(30), Resources::ZERO);
        // Nothing needed when the demand fits.
        assert_eq!(
            p.reprovision("job", 7 * MIN, Resources::new(10_000, 1), &Dra::default()),
            Ok(None)
        );
        // No room: the stretch holds 6 of 20 at step 10, so 15 more do not fit; without it, 16
        // do, and then the stretch does not.
        p.add_fixed("other", 10 * MIN, 11 * MIN, Resources::new(15_000, 0))
            .unwrap_err();
        p.delete(&s);
        p.add_fixed("other", 10 * MIN, 11 * MIN, Resources::new(16_000, 0))
            .unwrap();
        assert!(matches!(
            p.reprovision("job", 10 * MIN, Resources::new(6000, 6144), &Dra::default()),
            Err(Rejection::NoPlacement(_))
        ));
        p.check_invariants().unwrap();
        // Deleting the reservation deletes its stretches.
        p.delete("other");
        let s = p
            .reprovision("job", 10 * MIN, Resources::new(6000, 6144), &Dra::default())
            .unwrap()
            .unwrap();
        assert!(p.get(&s).is_some());
        assert!(p.delete("job"));
        assert!(p.get(&s).is_none());
        assert!(p.load().runs().all(|r| r.2.is_zero()));
        p.check_invariants().unwrap();
    }
}

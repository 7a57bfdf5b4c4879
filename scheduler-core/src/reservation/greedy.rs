//! The greedy baseline: YARN's `GreedyReservationAgent` (its run-length stage allocator inside
//! the iterative planner, with unconstrained stage windows), right or left. Morpheus uses it as
//! the fall-back of LowCost (§8, YARN's `AlignedPlannerWithGreedy`) and the evaluation compares
//! against it (§9).
//!
//! Allocating right, a stage of duration `d` in `[a, b)` looks at `[b − d, b)`: it places there
//! as many gangs as fit at every step (up to what is left), then moves the deadline left to the
//! most constraining step in that range (the leftmost one on ties), or by `d` when that is
//! further, and repeats while `[b − d, b)` still starts at or after `a`. Allocating left mirrors
//! it from the arrival. Gangs of one stage may so overlap in time; the stage fails when the
//! window is used up with gangs left. (YARN's right-to-left loop also looks at the run of
//! capacity just left of the range; this checks exactly the range's steps.)

use super::planner::{FoldedView, JobWindow, Part, StageAllocator, StepStage, fits};

/// The greedy stage allocator.
#[derive(Clone, Copy, Debug)]
pub struct Greedy {
    pub allocate_left: bool,
}

impl StageAllocator for Greedy {
    fn by_demand(&self) -> bool {
        false
    }

    fn allocate(
        &self,
        view: &mut FoldedView<'_>,
        stage: &StepStage,
        arrival: u32,
        deadline: u32,
        _job: &JobWindow,
    ) -> Option<Vec<Part>> {
        let dur = stage.duration.max(1);
        let gang = stage.stage.gang_resources();
        let (mut lo, mut hi) = (arrival, deadline);
        let mut remaining = stage.stage.gangs();
        let mut parts: Vec<Part> = Vec::new();
        while remaining > 0 && lo + dur <= hi {
            let (s, e) = if self.allocate_left {
                (lo, lo + dur)
            } else {
                (hi - dur, hi)
            };
            let mut most = u64::from(remaining);
            let mut min_point = s;
            let steps: Box<dyn Iterator<Item = u32>> = if self.allocate_left {
                Box::new(s..e)
            } else {
                Box::new((s..e).rev())
            };
            for o in steps {
                let f = fits(&view.free_at(o as usize), &gang).min(u64::from(remaining));
                if f <= most {
                    most = f;
                    min_point = o;
                }
            }
            let n = most as u32;
            if n > 0 {
                remaining -= n;
                let part = Part {
                    start: s,
                    end: e,
                    gangs: n,
                    resources: gang.scale(u64::from(n)),
                };
                view.take(&part);
                parts.push(part);
            }
            if self.allocate_left {
                lo = (min_point + 1).min(lo + dur);
            } else {
                hi = min_point.max(hi - dur);
            }
        }
        if remaining > 0 {
            for p in &parts {
                view.give_back(p);
            }
            return None;
        }
        Some(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resources;
    use crate::reservation::Stage;

    fn stage(containers: u32, duration: u32) -> StepStage {
        StepStage {
            stage: Stage {
                containers,
                gang: 1,
                duration_ms: u64::from(duration) * 60_000,
                size: Resources::new(1000, 1000),
            },
            duration,
        }
    }

    const JOB: JobWindow = JobWindow {
        arrival: 0,
        deadline: 10,
        alignment_penalty: 0.0,
    };

    /// Free containers per step: [10,10,10,10,10,10,10,3,10,10]. Right-to-left, 2 steps: at
    /// [8,10) 10 fit → 8 asked, all placed at once.
    #[test]
    fn right_fills_the_last_steps() {
        let cap = vec![Resources::new(10_000, 10_000); 10];
        let mut load = vec![Resources::ZERO; 10];
        load[7] = Resources::new(7000, 7000);
        let mut view = FoldedView::new(10, &cap, &load);
        let g = Greedy {
            allocate_left: false,
        };
        let parts = g.allocate(&mut view, &stage(8, 2), 0, 10, &JOB).unwrap();
        assert_eq!(
            parts
                .iter()
                .map(|p| (p.start, p.end, p.gangs))
                .collect::<Vec<_>>(),
            vec![(8, 10, 8)]
        );

        // 14 more: [8,10) has 2 left → 2 placed, deadline moves to the constraining step 8 (the
        // leftmost of equal minima) — max(8, 8) — then [6,8) has 3 at step 7 → 3 placed, deadline
        // to 7 ... [5,7): 10 at 5, 7 at 6 (after the 3 at [6,8)) → 7; then [4,6)? deadline =
        // max(6, 5) = 6 → [4,6): step 5 has 3 left → 2 remaining placed.
        let parts = g.allocate(&mut view, &stage(14, 2), 0, 10, &JOB).unwrap();
        assert_eq!(
            parts
                .iter()
                .map(|p| (p.start, p.end, p.gangs))
                .collect::<Vec<_>>(),
            vec![(8, 10, 2), (6, 8, 3), (5, 7, 7), (4, 6, 2)]
        );
    }

    #[test]
    fn left_and_failure() {
        let cap = vec![Resources::new(10_000, 10_000); 10];
        let load = vec![Resources::ZERO; 10];
        let mut view = FoldedView::new(10, &cap, &load);
        let g = Greedy {
            allocate_left: true,
        };
        let parts = g.allocate(&mut view, &stage(15, 3), 1, 10, &JOB).unwrap();
        assert_eq!(
            parts
                .iter()
                .map(|p| (p.start, p.end, p.gangs))
                .collect::<Vec<_>>(),
            vec![(1, 4, 10), (4, 7, 5)]
        );
        // 16 containers for 9 steps each in a 9-step window: only 10 fit.
        let mut view = FoldedView::new(10, &cap, &load);
        assert!(g.allocate(&mut view, &stage(16, 9), 1, 10, &JOB).is_none());
        assert!(view.taken.iter().all(|t| t.is_zero()));
    }
}

//! The iterative planner that LowCost and greedy share (the structure of YARN's
//! `IterativePlanner`, which Morpheus' LowCost runs inside, §6.3 and §8): stages are taken one by
//! one, last first when allocating right (favour late, the default) and first first when
//! allocating left (favour early); each gets a window, and a stage allocator places it there
//! against the load of the plan plus what this request already took.
//!
//! Everything works on a [`FoldedView`] of one period (§6.3 "Multiple instances"): a recurring
//! request sees, at each offset of its period, the least free capacity and the highest cost over
//! all instances of that offset in the agenda, places one instance, and the plan repeats it.

use super::{Interpreter, Rejection, Stage};
use crate::Resources;

/// One piece of a stage's allocation: `gangs` gangs held over steps `[start, end)` (offsets in
/// the period for recurring reservations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Part {
    pub start: u32,
    pub end: u32,
    pub gangs: u32,
    /// The resources held at each step of `[start, end)`.
    pub resources: Resources,
}

/// A request in steps, validated.
#[derive(Clone, Debug)]
pub struct StepRequest {
    /// Window `[arrival, deadline)` in steps (arrival rounded up, deadline rounded down).
    pub arrival: u32,
    pub deadline: u32,
    pub interpreter: Interpreter,
    pub stages: Vec<StepStage>,
    /// Steps per period (the whole agenda when not recurring).
    pub period: u32,
    pub alignment_penalty: f64,
}

#[derive(Clone, Copy, Debug)]
pub struct StepStage {
    pub stage: Stage,
    /// Duration rounded up to whole steps.
    pub duration: u32,
}

impl StepStage {
    /// YARN's stage weight for dividing an ORDER window by demand: duration × memory × containers.
    fn weight(&self) -> f64 {
        self.stage.duration_ms as f64
            * self.stage.size.memory_mib as f64
            * self.stage.containers as f64
    }
}

/// One period of the agenda as a request sees it.
pub struct FoldedView<'a> {
    pub period: usize,
    pub instances: usize,
    /// Capacity and committed load over the whole agenda (the load without the request's own old
    /// allocation when updating).
    pub capacity: &'a [Resources],
    pub load: &'a [Resources],
    /// Per offset: the least free capacity over the instances (component-wise).
    pub free: Vec<Resources>,
    /// What this request has taken so far, per offset (YARN's "plan modifications").
    pub taken: Vec<Resources>,
}

/// A share of capacity as LowCost's cost: the largest of the dimensions' load / capacity (§6.3,
/// c(t) = max(load(MEM,t)/capacity(MEM,t), load(cores,t)/capacity(cores,t))).
pub fn cost_of(load: &Resources, capacity: &Resources) -> f64 {
    fn share(part: u64, whole: u64) -> f64 {
        if whole == 0 {
            if part == 0 { 0.0 } else { f64::from(u32::MAX) }
        } else {
            part as f64 / whole as f64
        }
    }
    share(load.cpu_millis, capacity.cpu_millis).max(share(load.memory_mib, capacity.memory_mib))
}

/// How many `unit`s fit in `free` (every dimension; a dimension the unit does not use is no limit).
pub fn fits(free: &Resources, unit: &Resources) -> u64 {
    let dim = |f: u64, u: u64| f.checked_div(u).unwrap_or(u64::MAX);
    dim(free.cpu_millis, unit.cpu_millis).min(dim(free.memory_mib, unit.memory_mib))
}

impl<'a> FoldedView<'a> {
    pub fn new(period: usize, capacity: &'a [Resources], load: &'a [Resources]) -> FoldedView<'a> {
        let instances = capacity.len() / period;
        let mut free = vec![Resources::new(u64::MAX, u64::MAX); period];
        for (t, (c, l)) in capacity.iter().zip(load).enumerate() {
            let f = &mut free[t % period];
            *f = f.min(&c.saturating_sub(l));
        }
        FoldedView {
            period,
            instances,
            capacity,
            load,
            free,
            taken: vec![Resources::ZERO; period],
        }
    }

    /// Free capacity at offset `o` after what the request took.
    pub fn free_at(&self, o: usize) -> Resources {
        self.free[o].saturating_sub(&self.taken[o])
    }

    /// The cost of offset `o`: the highest over its instances (§6.3 "Multiple instances").
    pub fn cost_at(&self, o: usize) -> f64 {
        let mut c: f64 = 0.0;
        let mut t = o;
        while t < self.capacity.len() {
            let load = self.load[t].saturating_add(&self.taken[o]);
            c = c.max(cost_of(&load, &self.capacity[t]));
            t += self.period;
        }
        c
    }

    pub fn take(&mut self, part: &Part) {
        for o in part.start as usize..part.end as usize {
            self.taken[o] = self.taken[o].saturating_add(&part.resources);
        }
    }

    pub fn give_back(&mut self, part: &Part) {
        for o in part.start as usize..part.end as usize {
            self.taken[o] = self.taken[o].saturating_sub(&part.resources);
        }
    }
}

/// The window-level context a stage allocator may use (the §7 alignment penalty needs the job's
/// window, not the stage's).
#[derive(Clone, Copy, Debug)]
pub struct JobWindow {
    pub arrival: u32,
    pub deadline: u32,
    pub alignment_penalty: f64,
}

/// A stage allocator: places one stage in `[arrival, deadline)` of the view, adding what it takes
/// to `view.taken`, or returns `None` and leaves the view as it was.
pub trait StageAllocator {
    fn allocate(
        &self,
        view: &mut FoldedView<'_>,
        stage: &StepStage,
        arrival: u32,
        deadline: u32,
        job: &JobWindow,
    ) -> Option<Vec<Part>>;

    /// Whether ORDER stage windows are divided by demand (LowCost's `StageExecutionIntervalByDemand`)
    /// or left as wide as the order allows (greedy's `StageExecutionIntervalUnconstrained`).
    fn by_demand(&self) -> bool;
}

/// Run the iterative planner: a per-stage allocation (`None` for the stages an ANY request did
/// not use), or why it failed. On failure the view's `taken` may hold partial work; callers
/// discard the view.
pub fn plan_request(
    view: &mut FoldedView<'_>,
    req: &StepRequest,
    allocator: &dyn StageAllocator,
    allocate_left: bool,
) -> Result<Vec<Option<Vec<Part>>>, Rejection> {
    let n = req.stages.len();
    let order: Vec<usize> = if allocate_left {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    };
    let ordered = matches!(
        req.interpreter,
        Interpreter::Order | Interpreter::OrderNoGap
    );
    let job = JobWindow {
        arrival: req.arrival,
        deadline: req.deadline,
        alignment_penalty: req.alignment_penalty,
    };
    let mut out: Vec<Option<Vec<Part>>> = vec![None; n];
    // Span of everything allocated so far.
    let mut span: Option<(u32, u32)> = None;
    let mut any_failures: Vec<String> = Vec::new();
    for &idx in &order {
        let stage = &req.stages[idx];
        // The stage's widest window: the job's, narrowed by the stages already placed for ORDER.
        let (mut lo, mut hi) = (req.arrival, req.deadline);
        if ordered && let Some((s, e)) = span {
            if allocate_left {
                lo = e;
            } else {
                hi = s;
            }
        }
        if ordered && allocator.by_demand() {
            (lo, hi) = by_demand_window(req, idx, lo, hi, allocate_left);
        }
        let Some(parts) = allocator.allocate(view, stage, lo, hi, &job) else {
            let why = format!(
                "stage {} ({} containers of {} in gangs of {} for {} ms) does not fit in [{}, {}) steps",
                idx,
                stage.stage.containers,
                stage.stage.size,
                stage.stage.gang,
                stage.stage.duration_ms,
                lo,
                hi
            );
            if req.interpreter == Interpreter::Any {
                any_failures.push(why);
                continue;
            }
            return Err(Rejection::NoPlacement(why));
        };
        let s = parts.iter().map(|p| p.start).min().unwrap_or(lo);
        let e = parts.iter().map(|p| p.end).max().unwrap_or(lo);
        if req.interpreter == Interpreter::OrderNoGap {
            let touches = match span {
                None => true,
                Some((ss, se)) => {
                    if allocate_left {
                        se >= s
                    } else {
                        e >= ss
                    }
                }
            };
            if !touches || !contiguous(&parts) {
                return Err(Rejection::NoPlacement(format!(
                    "stage {idx} cannot be placed as one block adjacent to the next (order_no_gap)"
                )));
            }
        }
        span = Some(match span {
            None => (s, e),
            Some((ss, se)) => (ss.min(s), se.max(e)),
        });
        out[idx] = Some(parts);
        if req.interpreter == Interpreter::Any {
            break;
        }
    }
    if span.is_none() {
        return Err(Rejection::NoPlacement(format!(
            "no stage of the request fits: {}",
            any_failures.join("; ")
        )));
    }
    Ok(out)
}

/// True when the parts cover one contiguous range of steps with no hole (YARN's
/// non-preemptive check for ORDER_NO_GAP).
pub fn contiguous(parts: &[Part]) -> bool {
    let mut ranges: Vec<(u32, u32)> = parts
        .iter()
        .filter(|p| !p.resources.is_zero() && p.end > p.start)
        .map(|p| (p.start, p.end))
        .collect();
    ranges.sort_unstable();
    let mut end = match ranges.first() {
        Some(r) => r.1,
        None => return true,
    };
    for r in &ranges[1..] {
        if r.0 > end {
            return false;
        }
        end = end.max(r.1);
    }
    true
}

/// The window of an ORDER stage divided by demand (YARN's `StageExecutionIntervalByDemand`, the
/// stage intervals of LowCost §6.3 and Figure 7): each stage not yet placed is first guaranteed
/// its own duration, and the rest of the window is shared in proportion to the stage's weight
/// among the stages not yet placed. Allocating right, the stage gets the right end of the window.
fn by_demand_window(
    req: &StepRequest,
    idx: usize,
    lo: u32,
    hi: u32,
    allocate_left: bool,
) -> (u32, u32) {
    let remaining: Vec<&StepStage> = if allocate_left {
        req.stages[idx..].iter().collect()
    } else {
        req.stages[..=idx].iter().collect()
    };
    let total_weight: f64 = remaining.iter().map(|s| s.weight()).sum();
    let total_duration: i64 = remaining.iter().map(|s| i64::from(s.duration)).sum();
    let me = &req.stages[idx];
    let ratio = if total_weight > 0.0 {
        me.weight() / total_weight
    } else {
        1.0 / remaining.len() as f64
    };
    let window = i64::from(hi) - i64::from(lo);
    let rest = (window - total_duration) as f64;
    let dur = i64::from(me.duration);
    if allocate_left {
        let latest_end = (i64::from(lo) + dur) as f64 + rest * ratio;
        // Rounded down to a step.
        let latest_end = latest_end.floor().max(f64::from(lo)).min(f64::from(hi)) as u32;
        (lo, latest_end)
    } else {
        let early_start = (i64::from(hi) - dur) as f64 - rest * ratio;
        // Rounded up to a step.
        let early_start = early_start.ceil().max(f64::from(lo)).min(f64::from(hi)) as u32;
        (early_start, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(containers: u32, dur: u32) -> StepStage {
        StepStage {
            stage: Stage {
                containers,
                gang: 1,
                duration_ms: u64::from(dur) * 60_000,
                size: Resources::new(1000, 1024),
            },
            duration: dur,
        }
    }

    /// Figure 7 of the paper: a four-stage job; stage 3 (16 containers) is being placed, the
    /// stages still unplaced ask 38 containers in all, 19 steps are left. The paper's text gives
    /// the stage 16/38 · 19 = 8 steps. YARN (the authors' implementation) first guarantees each
    /// unplaced stage its duration (here one step each) and shares the rest by weight:
    /// 1 + (19 − 3) · 16/38 = 7.7 steps, so the stage may start 7 steps before its deadline
    /// (rounded up to a step).
    #[test]
    fn figure_7_stage_window() {
        let req = StepRequest {
            arrival: 0,
            deadline: 30,
            interpreter: Interpreter::Order,
            stages: vec![stage(10, 1), stage(12, 1), stage(16, 1), stage(8, 1)],
            period: 30,
            alignment_penalty: 0.0,
        };
        // Stage 4 already took [19, 30); stage 3 gets its window inside [0, 19).
        assert_eq!(by_demand_window(&req, 2, 0, 19, false), (12, 19));
        // With the paper's own proportional rule it would be 19 − 8 = 11.
        assert_eq!(19 - (16.0f64 / 38.0 * 19.0).round() as u32, 11);
        // Allocating left mirrors it: stages 3 and 4 remain (16 + 8), 1 + (19 − 2) · 16/24 = 12.3.
        assert_eq!(by_demand_window(&req, 2, 0, 19, true), (0, 12));
    }

    #[test]
    fn contiguity() {
        let p = |s, e| Part {
            start: s,
            end: e,
            gangs: 1,
            resources: Resources::new(1, 1),
        };
        assert!(contiguous(&[p(0, 2), p(2, 4)]));
        assert!(contiguous(&[p(0, 3), p(2, 4)]));
        assert!(!contiguous(&[p(0, 2), p(3, 4)]));
    }
}

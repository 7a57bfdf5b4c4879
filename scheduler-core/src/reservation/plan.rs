//! The plan (agenda): GUARANTEED capacity and the reservations holding it over one agenda
//! (Morpheus §6.1: the least common multiple of the periods, one day by default), in steps.
//!
//! Capacity and the total committed load are run-length encoded over steps ([`StepFn`]); each
//! reservation keeps its definition and the parts of one instance (offsets within its period).
//! The agenda's size is bounded by its number of steps, not by the cluster's: a 1,440-step day
//! with 1,000 recurring reservations holds at most 1,440 runs of load and of capacity plus the
//! reservations' own parts (a few KiB each at most); see `footprint_is_small` in the tests.
//! Placement works on dense per-step scratch arrays built from the runs.

use super::greedy::Greedy;
use super::lowcost::{DEFAULT_SMOOTHNESS, LowCost};
use super::planner::{FoldedView, Part, StageAllocator, StepRequest, StepStage, plan_request};
use super::{Algorithm, Interpreter, Rejection, ReservationDefinition};
use crate::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A piecewise-constant function over steps `[0, len)`, stored as maximal runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFn {
    len: u32,
    /// `(start, value)` of each run, by start; the first starts at 0; neighbours differ.
    runs: Vec<(u32, Resources)>,
}

impl StepFn {
    pub fn constant(len: u32, value: Resources) -> StepFn {
        StepFn {
            len,
            runs: vec![(0, value)],
        }
    }

    pub fn from_dense(values: &[Resources]) -> StepFn {
        let mut runs: Vec<(u32, Resources)> = Vec::new();
        for (t, v) in values.iter().enumerate() {
            if runs.last().is_none_or(|r| r.1 != *v) {
                runs.push((t as u32, *v));
            }
        }
        if runs.is_empty() {
            runs.push((0, Resources::ZERO));
        }
        StepFn {
            len: values.len() as u32,
            runs,
        }
    }

    pub fn to_dense(&self) -> Vec<Resources> {
        let mut out = Vec::with_capacity(self.len as usize);
        for (s, e, v) in self.runs() {
            out.extend(std::iter::repeat_n(v, (e - s) as usize));
        }
        out
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value at step `t`.
    pub fn at(&self, t: u32) -> Resources {
        let i = self.runs.partition_point(|r| r.0 <= t);
        self.runs[i.saturating_sub(1)].1
    }

    /// `(start, end, value)` of each maximal run.
    pub fn runs(&self) -> impl Iterator<Item = (u32, u32, Resources)> + '_ {
        self.runs.iter().enumerate().map(|(i, &(s, v))| {
            let e = self.runs.get(i + 1).map_or(self.len, |r| r.0);
            (s, e, v)
        })
    }

    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    /// Bytes held (for the footprint check).
    pub fn heap_bytes(&self) -> usize {
        self.runs.capacity() * std::mem::size_of::<(u32, Resources)>()
    }
}

/// Per stage, its parts (`None` for the stages an ANY request did not use).
pub type StageParts = Vec<Option<Vec<Part>>>;

/// How a plan is laid out and which algorithm places requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanConfig {
    /// Length of a step (`plan_step`), default 60 s.
    pub step_ms: u64,
    /// Length of the agenda: the least common multiple of the periods it can hold (§6.1); every
    /// period must divide it. Default one day.
    pub horizon_ms: u64,
    pub algorithm: Algorithm,
    /// Favour early (left) instead of late (right, YARN's and Morpheus' default).
    pub allocate_left: bool,
    /// LowCost's smoothness factor (YARN's default 10).
    pub smoothness: u32,
}

impl PlanConfig {
    /// The agenda for a set of periods: their least common multiple (§6.1 "LCM
    /// representation"), or `None` when it overflows or a period is 0.
    pub fn lcm_horizon(periods_ms: &[u64]) -> Option<u64> {
        fn gcd(a: u64, b: u64) -> u64 {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        periods_ms.iter().try_fold(1u64, |acc, &p| {
            if p == 0 {
                return None;
            }
            (acc / gcd(acc, p)).checked_mul(p)
        })
    }
}

impl Default for PlanConfig {
    fn default() -> PlanConfig {
        PlanConfig {
            step_ms: 60_000,
            horizon_ms: 24 * 3600 * 1000,
            algorithm: Algorithm::LowCost,
            allocate_left: false,
            smoothness: DEFAULT_SMOOTHNESS,
        }
    }
}

/// An accepted reservation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    pub id: String,
    /// Acceptance order: replanning cancels the newest first.
    pub seq: u64,
    /// `None` for fixed load (capacity already committed outside the planner).
    pub definition: Option<ReservationDefinition>,
    /// Steps per period (the agenda's length when not recurring).
    pub period: u32,
    /// Per stage, the parts of one instance (`None` for stages an ANY request did not use).
    pub stages: Vec<Option<Vec<Part>>>,
    /// Which algorithm placed it.
    pub placed_by: Option<Algorithm>,
}

impl Reservation {
    /// The reservation's allocation at each step of the agenda (`len` steps).
    pub fn dense(&self, len: u32) -> Vec<Resources> {
        let mut out = vec![Resources::ZERO; len as usize];
        self.add_to(&mut out, true);
        out
    }

    /// The reservation's allocation at agenda step `t` (its instance repeats every period).
    pub fn at_step(&self, t: u32) -> Resources {
        let o = t % self.period.max(1);
        self.stages
            .iter()
            .flatten()
            .flatten()
            .filter(|p| p.start <= o && o < p.end)
            .fold(Resources::ZERO, |acc, p| acc.saturating_add(&p.resources))
    }

    /// The most the reservation allocates at any step.
    pub fn peak(&self) -> Resources {
        let mut starts: Vec<u32> = self
            .stages
            .iter()
            .flatten()
            .flatten()
            .map(|p| p.start)
            .collect();
        starts.sort_unstable();
        starts.dedup();
        starts
            .into_iter()
            .map(|t| self.at_step(t))
            .fold(Resources::ZERO, |a, b| {
                Resources::new(
                    a.cpu_millis.max(b.cpu_millis),
                    a.memory_mib.max(b.memory_mib),
                )
            })
    }

    fn add_to(&self, dense: &mut [Resources], add: bool) {
        let p = self.period as usize;
        for part in self.stages.iter().flatten().flatten() {
            let mut base = 0;
            while base < dense.len() {
                for d in &mut dense[base + part.start as usize..base + part.end as usize] {
                    *d = if add {
                        d.saturating_add(&part.resources)
                    } else {
                        d.saturating_sub(&part.resources)
                    };
                }
                base += p;
            }
        }
    }
}

/// One maximal run of a reservation's allocation, in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationInterval {
    pub start_ms: u64,
    pub end_ms: u64,
    pub cpu_millis: u64,
    pub memory_mib: u64,
}

/// What replanning after a capacity change did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplanReport {
    /// Reservations placed again (their owners see a new allocation).
    pub moved: Vec<String>,
    /// Reservations cancelled because they could not be placed again (newest first chosen).
    pub cancelled: Vec<String>,
}

/// The agenda. Serializable so that the coordinator can store it (check the invariants after
/// loading one).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    config: PlanConfig,
    steps: u32,
    capacity: StepFn,
    load: StepFn,
    reservations: BTreeMap<String, Reservation>,
    next_seq: u64,
}

impl Plan {
    /// An empty plan of constant `capacity`.
    pub fn new(config: PlanConfig, capacity: Resources) -> Result<Plan, String> {
        if config.step_ms == 0 {
            return Err("step_ms must be positive".into());
        }
        if config.horizon_ms == 0 || !config.horizon_ms.is_multiple_of(config.step_ms) {
            return Err("horizon_ms must be a positive multiple of step_ms".into());
        }
        let steps = config.horizon_ms / config.step_ms;
        if steps > 10_000_000 {
            return Err("the agenda may have at most 10,000,000 steps".into());
        }
        let steps = steps as u32;
        Ok(Plan {
            config,
            steps,
            capacity: StepFn::constant(steps, capacity),
            load: StepFn::constant(steps, Resources::ZERO),
            reservations: BTreeMap::new(),
            next_seq: 0,
        })
    }

    /// Change how new requests are placed (accepted allocations stay where they are).
    pub fn set_placement(&mut self, algorithm: Algorithm, allocate_left: bool, smoothness: u32) {
        self.config.algorithm = algorithm;
        self.config.allocate_left = allocate_left;
        self.config.smoothness = smoothness.max(1);
    }

    pub fn config(&self) -> &PlanConfig {
        &self.config
    }

    pub fn steps(&self) -> u32 {
        self.steps
    }

    pub fn capacity(&self) -> &StepFn {
        &self.capacity
    }

    pub fn load(&self) -> &StepFn {
        &self.load
    }

    pub fn get(&self, id: &str) -> Option<&Reservation> {
        self.reservations.get(id)
    }

    pub fn reservations(&self) -> impl Iterator<Item = &Reservation> {
        self.reservations.values()
    }

    /// Reservations (and fixed load) in id order from `id` on.
    pub fn reservations_from<'a>(
        &'a self,
        id: &str,
    ) -> impl Iterator<Item = &'a Reservation> + use<'a> {
        self.reservations.range(id.to_string()..).map(|(_, r)| r)
    }

    /// Bytes the plan holds on the heap (runs, reservations and their parts; ids and
    /// definitions included).
    pub fn heap_bytes(&self) -> usize {
        let per_res: usize = self
            .reservations
            .values()
            .map(|r| {
                std::mem::size_of::<Reservation>()
                    + r.id.capacity() * 2
                    + r.definition.as_ref().map_or(0, |d| {
                        d.stages.capacity() * std::mem::size_of::<super::Stage>()
                    })
                    + r.stages.capacity() * std::mem::size_of::<Option<Vec<Part>>>()
                    + r.stages
                        .iter()
                        .flatten()
                        .map(|v| v.capacity() * std::mem::size_of::<Part>())
                        .sum::<usize>()
                    + 64
            })
            .sum();
        self.capacity.heap_bytes() + self.load.heap_bytes() + per_res
    }

    fn step_of(&self, ms: u64, up: bool) -> u64 {
        let s = self.config.step_ms;
        if up { ms.div_ceil(s) } else { ms / s }
    }

    /// Validate a definition and express it in steps (arrival rounded up, deadline rounded down,
    /// durations rounded up, as YARN's planner does).
    pub fn to_steps(&self, def: &ReservationDefinition) -> Result<StepRequest, Rejection> {
        let bad = |m: String| Err(Rejection::Invalid(m));
        if def.stages.is_empty() {
            return bad("stages: at least one stage is needed".into());
        }
        if def.stages.len() > 1000 {
            return bad("stages: at most 1000 stages".into());
        }
        if !(def.alignment_penalty.is_finite() && def.alignment_penalty >= 0.0) {
            return bad("alignment_penalty: must be a finite number >= 0".into());
        }
        let period = match def.recurrence_ms {
            None => u64::from(self.steps),
            Some(p) => {
                if p == 0 || !p.is_multiple_of(self.config.step_ms) {
                    return bad(format!(
                        "recurrence_ms: {p} is not a positive multiple of the step ({} ms)",
                        self.config.step_ms
                    ));
                }
                if !self.config.horizon_ms.is_multiple_of(p) {
                    return bad(format!(
                        "recurrence_ms: {p} does not divide the agenda ({} ms); such periods need one reservation per instance",
                        self.config.horizon_ms
                    ));
                }
                p / self.config.step_ms
            }
        };
        let limit_ms = period * self.config.step_ms;
        if def.deadline_ms <= def.arrival_ms {
            return bad("deadline_ms: must be after arrival_ms".into());
        }
        if def.deadline_ms > limit_ms {
            return bad(format!(
                "deadline_ms: {} is past the end of the {} ({limit_ms} ms)",
                def.deadline_ms,
                if def.recurrence_ms.is_some() {
                    "period"
                } else {
                    "agenda"
                }
            ));
        }
        let max_size = self
            .capacity
            .runs()
            .map(|r| r.2)
            .fold(Resources::ZERO, |a, b| {
                Resources::new(
                    a.cpu_millis.max(b.cpu_millis),
                    a.memory_mib.max(b.memory_mib),
                )
            });
        let mut stages = Vec::with_capacity(def.stages.len());
        for (i, s) in def.stages.iter().enumerate() {
            if s.gang == 0 {
                return bad(format!("stages[{i}].gang: must be at least 1"));
            }
            if s.containers == 0 {
                return bad(format!("stages[{i}].containers: must be at least 1"));
            }
            if !s.containers.is_multiple_of(s.gang) {
                return bad(format!(
                    "stages[{i}].containers: {} is not a multiple of the gang size {}",
                    s.containers, s.gang
                ));
            }
            if s.duration_ms == 0 {
                return bad(format!("stages[{i}].duration_ms: must be positive"));
            }
            if s.size.is_zero() {
                return bad(format!("stages[{i}].size: must ask for some resource"));
            }
            if !s.size.fits_in(&max_size) {
                return bad(format!(
                    "stages[{i}].size: {} exceeds the cluster's capacity",
                    s.size
                ));
            }
            let dur = self.step_of(s.duration_ms, true);
            if dur > period {
                return bad(format!(
                    "stages[{i}].duration_ms: longer than the window can ever hold"
                ));
            }
            stages.push(StepStage {
                stage: *s,
                duration: dur as u32,
            });
        }
        Ok(StepRequest {
            arrival: self.step_of(def.arrival_ms, true) as u32,
            deadline: self.step_of(def.deadline_ms, false) as u32,
            interpreter: def.interpreter,
            stages,
            period: period as u32,
            alignment_penalty: def.alignment_penalty,
        })
    }

    /// Place `req` against `load` with the plan's algorithm (LowCost falls back to greedy, as
    /// YARN's `AlignedPlannerWithGreedy` does).
    fn place(
        &self,
        req: &StepRequest,
        capacity: &[Resources],
        load: &[Resources],
    ) -> Result<(StageParts, Algorithm), Rejection> {
        let left = self.config.allocate_left;
        if req.arrival >= req.deadline {
            return Err(Rejection::NoPlacement(
                "the window is empty once arrival is rounded up and deadline down to steps".into(),
            ));
        }
        let greedy = Greedy {
            allocate_left: left,
        };
        let lowcost = LowCost {
            allocate_left: left,
            smoothness: self.config.smoothness,
        };
        let attempts: Vec<(&dyn StageAllocator, Algorithm)> = match self.config.algorithm {
            Algorithm::Greedy => vec![(&greedy, Algorithm::Greedy)],
            Algorithm::LowCost => {
                vec![(&lowcost, Algorithm::LowCost), (&greedy, Algorithm::Greedy)]
            }
        };
        let mut first_err = None;
        for (alg, name) in attempts {
            let mut view = FoldedView::new(req.period as usize, capacity, load);
            match plan_request(&mut view, req, alg, left) {
                Ok(stages) => return Ok((stages, name)),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(first_err.unwrap_or_else(|| Rejection::NoPlacement("no algorithm".into())))
    }

    /// Accept a new reservation, or say why not. Returns its allocation.
    pub fn reserve(
        &mut self,
        id: &str,
        def: ReservationDefinition,
    ) -> Result<Vec<AllocationInterval>, Rejection> {
        if self.reservations.contains_key(id) {
            return Err(Rejection::Duplicate(id.to_string()));
        }
        let req = self.to_steps(&def)?;
        let cap = self.capacity.to_dense();
        let mut load = self.load.to_dense();
        let (stages, alg) = self.place(&req, &cap, &load)?;
        let r = Reservation {
            id: id.to_string(),
            seq: self.next_seq,
            definition: Some(def),
            period: req.period,
            stages,
            placed_by: Some(alg),
        };
        self.next_seq += 1;
        r.add_to(&mut load, true);
        self.load = StepFn::from_dense(&load);
        self.reservations.insert(id.to_string(), r);
        Ok(self.allocation(id).unwrap_or_default())
    }

    /// Commit fixed load (work already promised outside the planner) over `[start_ms, end_ms)`,
    /// rounded out to whole steps. Rejected when it does not fit.
    pub fn add_fixed(
        &mut self,
        id: &str,
        start_ms: u64,
        end_ms: u64,
        resources: Resources,
    ) -> Result<(), Rejection> {
        if self.reservations.contains_key(id) {
            return Err(Rejection::Duplicate(id.to_string()));
        }
        let (s, e) = (self.step_of(start_ms, false), self.step_of(end_ms, true));
        if e <= s || e > u64::from(self.steps) {
            return Err(Rejection::Invalid(format!(
                "end_ms: [{start_ms}, {end_ms}) is empty or past the agenda"
            )));
        }
        let r = Reservation {
            id: id.to_string(),
            seq: self.next_seq,
            definition: None,
            period: self.steps,
            stages: vec![Some(vec![Part {
                start: s as u32,
                end: e as u32,
                gangs: 1,
                resources,
            }])],
            placed_by: None,
        };
        let cap = self.capacity.to_dense();
        let mut load = self.load.to_dense();
        r.add_to(&mut load, true);
        if load.iter().zip(&cap).any(|(l, c)| !l.fits_in(c)) {
            return Err(Rejection::NoPlacement(format!(
                "fixed load {resources} over [{start_ms}, {end_ms}) exceeds the capacity"
            )));
        }
        self.next_seq += 1;
        self.load = StepFn::from_dense(&load);
        self.reservations.insert(id.to_string(), r);
        Ok(())
    }

    /// Replace a reservation's definition: it is placed anew as if its old allocation were free;
    /// when that fails the old one stays and the update is rejected. It keeps its acceptance order.
    pub fn update(
        &mut self,
        id: &str,
        def: ReservationDefinition,
    ) -> Result<Vec<AllocationInterval>, Rejection> {
        let Some(old) = self.reservations.get(id) else {
            return Err(Rejection::Unknown(id.to_string()));
        };
        let req = self.to_steps(&def)?;
        let cap = self.capacity.to_dense();
        let mut load = self.load.to_dense();
        old.add_to(&mut load, false);
        let (stages, alg) = self.place(&req, &cap, &load)?;
        let r = Reservation {
            id: id.to_string(),
            seq: old.seq,
            definition: Some(def),
            period: req.period,
            stages,
            placed_by: Some(alg),
        };
        r.add_to(&mut load, true);
        self.load = StepFn::from_dense(&load);
        self.reservations.insert(id.to_string(), r);
        Ok(self.allocation(id).unwrap_or_default())
    }

    /// Remove a reservation, and the DRA stretches of its current instance
    /// (`super::dra`); false when there was none.
    pub fn delete(&mut self, id: &str) -> bool {
        let Some(r) = self.reservations.remove(id) else {
            return false;
        };
        let mut load = self.load.to_dense();
        r.add_to(&mut load, false);
        if r.definition.is_some() {
            let prefix = format!("{id}{}", super::dra::STRETCH_MARK);
            let stretches: Vec<String> = self
                .reservations
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .filter(|(_, r)| r.definition.is_none())
                .map(|(k, _)| k.clone())
                .collect();
            for k in stretches {
                if let Some(s) = self.reservations.remove(&k) {
                    s.add_to(&mut load, false);
                }
            }
        }
        self.load = StepFn::from_dense(&load);
        true
    }

    /// A reservation's allocation over the agenda as maximal runs of equal allocation (steps with
    /// nothing are left out), in ms.
    pub fn allocation(&self, id: &str) -> Option<Vec<AllocationInterval>> {
        let r = self.reservations.get(id)?;
        let f = StepFn::from_dense(&r.dense(self.steps));
        let step = self.config.step_ms;
        Some(
            f.runs()
                .filter(|r| !r.2.is_zero())
                .map(|(s, e, v)| AllocationInterval {
                    start_ms: u64::from(s) * step,
                    end_ms: u64::from(e) * step,
                    cpu_millis: v.cpu_millis,
                    memory_mib: v.memory_mib,
                })
                .collect(),
        )
    }

    /// Take `by` off the capacity over `[start_ms, end_ms)` (a node lost or drained for that
    /// time) and replan; see [`Plan::set_capacity`].
    pub fn shrink_capacity(&mut self, start_ms: u64, end_ms: u64, by: Resources) -> ReplanReport {
        let mut cap = self.capacity.to_dense();
        let s = self.step_of(start_ms, false).min(u64::from(self.steps)) as usize;
        let e = self.step_of(end_ms, true).min(u64::from(self.steps)) as usize;
        for c in &mut cap[s..e.max(s)] {
            *c = c.saturating_sub(&by);
        }
        self.set_capacity(StepFn::from_dense(&cap))
    }

    /// Change the capacity (its length must be the agenda's) and replan when the load no longer
    /// fits: while some step is over capacity, the newest accepted reservation holding capacity
    /// at an over-full step is taken out (YARN's `SimpleCapacityReplanner` order); then the ones
    /// taken out are placed again, oldest first, with the plan's algorithm. Those that cannot be
    /// (and fixed load, which cannot move) are cancelled; their owners must be told.
    pub fn set_capacity(&mut self, capacity: StepFn) -> ReplanReport {
        assert_eq!(capacity.len(), self.steps, "capacity must cover the agenda");
        self.capacity = capacity;
        let cap = self.capacity.to_dense();
        let mut load = self.load.to_dense();
        let mut taken_out: Vec<Reservation> = Vec::new();
        loop {
            let over: Vec<usize> = (0..cap.len())
                .filter(|&t| !load[t].fits_in(&cap[t]))
                .collect();
            if over.is_empty() {
                break;
            }
            let victim = self
                .reservations
                .values()
                .filter(|r| {
                    let d = r.dense(self.steps);
                    over.iter().any(|&t| !d[t].is_zero())
                })
                .max_by_key(|r| r.seq)
                .map(|r| r.id.clone())
                .expect("load over capacity is held by some reservation");
            let r = self.reservations.remove(&victim).expect("victim exists");
            r.add_to(&mut load, false);
            taken_out.push(r);
        }
        taken_out.sort_by_key(|r| r.seq);
        let mut report = ReplanReport::default();
        for r in taken_out {
            let placed = r.definition.as_ref().and_then(|def| {
                let req = self.to_steps(def).ok()?;
                self.place(&req, &cap, &load).ok().map(|p| (req, p))
            });
            match placed {
                Some((req, (stages, alg))) => {
                    let nr = Reservation {
                        period: req.period,
                        stages,
                        placed_by: Some(alg),
                        ..r
                    };
                    nr.add_to(&mut load, true);
                    report.moved.push(nr.id.clone());
                    self.reservations.insert(nr.id.clone(), nr);
                }
                None => report.cancelled.push(r.id.clone()),
            }
        }
        self.load = StepFn::from_dense(&load);
        report
    }

    /// Check the plan's invariants: the load is the sum of the reservations (recurring ones
    /// repeating every period), never exceeds capacity, and every reservation holds exactly what
    /// its definition asks, inside its window, by its interpreter's rules.
    pub fn check_invariants(&self) -> Result<(), String> {
        let cap = self.capacity.to_dense();
        let load = self.load.to_dense();
        if cap.len() != self.steps as usize || load.len() != self.steps as usize {
            return Err("capacity or load does not cover the agenda".into());
        }
        let mut sum = vec![Resources::ZERO; self.steps as usize];
        for r in self.reservations.values() {
            if r.period == 0 || !self.steps.is_multiple_of(r.period) {
                return Err(format!(
                    "{}: period {} does not divide the agenda",
                    r.id, r.period
                ));
            }
            let d = r.dense(self.steps);
            for t in 0..d.len() {
                if d[t] != d[t % r.period as usize] {
                    return Err(format!(
                        "{}: instance at step {t} differs from the first",
                        r.id
                    ));
                }
                sum[t] = sum[t].saturating_add(&d[t]);
            }
            if let Some(def) = &r.definition {
                self.check_reservation(r, def)?;
            }
        }
        if sum != load {
            return Err("the load is not the sum of the reservations".into());
        }
        for (t, (l, c)) in load.iter().zip(&cap).enumerate() {
            if !l.fits_in(c) {
                return Err(format!("step {t}: load {l} exceeds capacity {c}"));
            }
        }
        Ok(())
    }

    fn check_reservation(
        &self,
        r: &Reservation,
        def: &ReservationDefinition,
    ) -> Result<(), String> {
        let req = self
            .to_steps(def)
            .map_err(|e| format!("{}: stored definition invalid: {e}", r.id))?;
        if req.period != r.period {
            return Err(format!("{}: period differs from its definition", r.id));
        }
        if r.stages.len() != req.stages.len() {
            return Err(format!("{}: stage count differs", r.id));
        }
        let used = r.stages.iter().filter(|s| s.is_some()).count();
        match def.interpreter {
            Interpreter::Any if used != 1 => {
                return Err(format!("{}: ANY holds {used} stages", r.id));
            }
            Interpreter::All | Interpreter::Order | Interpreter::OrderNoGap
                if used != req.stages.len() =>
            {
                return Err(format!(
                    "{}: {} stages of {} allocated",
                    r.id,
                    used,
                    req.stages.len()
                ));
            }
            _ => {}
        }
        let mut prev_end: Option<u32> = None;
        for (i, (parts, st)) in r.stages.iter().zip(&req.stages).enumerate() {
            let Some(parts) = parts else { continue };
            let gang = st.stage.gang_resources();
            let mut gangs = 0;
            for p in parts {
                if p.end - p.start != st.duration {
                    return Err(format!(
                        "{} stage {i}: a part lasts {} steps, not {}",
                        r.id,
                        p.end - p.start,
                        st.duration
                    ));
                }
                if p.start < req.arrival || p.end > req.deadline {
                    return Err(format!(
                        "{} stage {i}: part [{}, {}) outside the window",
                        r.id, p.start, p.end
                    ));
                }
                if p.gangs == 0 || p.resources != gang.scale(u64::from(p.gangs)) {
                    return Err(format!(
                        "{} stage {i}: part holds {} for {} gangs",
                        r.id, p.resources, p.gangs
                    ));
                }
                gangs += p.gangs;
            }
            if gangs != st.stage.gangs() {
                return Err(format!(
                    "{} stage {i}: {gangs} gangs held, {} asked",
                    r.id,
                    st.stage.gangs()
                ));
            }
            let s = parts.iter().map(|p| p.start).min().unwrap_or(0);
            let e = parts.iter().map(|p| p.end).max().unwrap_or(0);
            if matches!(
                def.interpreter,
                Interpreter::Order | Interpreter::OrderNoGap
            ) {
                if let Some(pe) = prev_end
                    && s < pe
                {
                    return Err(format!(
                        "{} stage {i} starts before the previous stage ends",
                        r.id
                    ));
                }
                if def.interpreter == Interpreter::OrderNoGap {
                    if let Some(pe) = prev_end
                        && s != pe
                    {
                        return Err(format!(
                            "{} stage {i} leaves a gap after the previous stage",
                            r.id
                        ));
                    }
                    if !super::planner::contiguous(parts) {
                        return Err(format!("{} stage {i} has a hole", r.id));
                    }
                }
                prev_end = Some(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservation::Stage;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    const MIN: u64 = 60_000;

    fn cfg(alg: Algorithm, horizon_steps: u64) -> PlanConfig {
        PlanConfig {
            step_ms: MIN,
            horizon_ms: horizon_steps * MIN,
            algorithm: alg,
            allocate_left: false,
            smoothness: DEFAULT_SMOOTHNESS,
        }
    }

    fn def(
        a: u64,
        d: u64,
        interp: Interpreter,
        stages: Vec<Stage>,
        rec: Option<u64>,
    ) -> ReservationDefinition {
        ReservationDefinition {
            arrival_ms: a * MIN,
            deadline_ms: d * MIN,
            interpreter: interp,
            stages,
            recurrence_ms: rec.map(|r| r * MIN),
            alignment_penalty: 0.0,
        }
    }

    fn st(containers: u32, gang: u32, dur: u64) -> Stage {
        Stage {
            containers,
            gang,
            duration_ms: dur * MIN,
            size: Resources::new(1000, 1024),
        }
    }

    fn iv(s: u64, e: u64, n: u64) -> AllocationInterval {
        AllocationInterval {
            start_ms: s * MIN,
            end_ms: e * MIN,
            cpu_millis: n * 1000,
            memory_mib: n * 1024,
        }
    }

    /// Ten containers of capacity; fixed load of 6 over steps 10..20. A 10-step job of 8
    /// containers in [0, 20) has two aligned intervals: [0, 10) costs k (10 steps × 0.1 per
    /// container), [10, 20) costs 6 + m. One container at a time goes to the cheaper: six to
    /// [0, 10), the tie at 6 to the later interval, then [0, 10) again: 7 and 1.
    #[test]
    fn lowcost_through_the_plan() {
        let mut p = Plan::new(cfg(Algorithm::LowCost, 60), Resources::new(10_000, 10_240)).unwrap();
        p.add_fixed("x", 10 * MIN, 20 * MIN, Resources::new(6000, 6144))
            .unwrap();
        let a = p
            .reserve("r1", def(0, 20, Interpreter::All, vec![st(8, 1, 10)], None))
            .unwrap();
        assert_eq!(a, vec![iv(0, 10, 7), iv(10, 20, 1)]);
        p.check_invariants().unwrap();
        // Arrival and deadline round inwards: [0.5, 20.5) minutes is [1, 20) in steps, which
        // holds one aligned 10-step interval, [10, 20), and it has room for 4 only.
        let mut d = def(0, 20, Interpreter::All, vec![st(2, 1, 10)], None);
        d.arrival_ms = MIN / 2;
        d.deadline_ms = 20 * MIN + MIN / 2;
        let a = p.reserve("r2", d).unwrap();
        assert_eq!(a, vec![iv(10, 20, 2)]);
        assert_eq!(p.get("r2").unwrap().placed_by, Some(Algorithm::LowCost));
        p.check_invariants().unwrap();
    }

    /// ORDER: the last stage first, in the right part of the window its demand earns (6 of 10
    /// containers: [13, 30)), spread one gang at a time over the cheapest aligned intervals; the
    /// first stage then in [0, 20), likewise.
    #[test]
    fn order_stages_and_fallback() {
        let mut p = Plan::new(cfg(Algorithm::LowCost, 60), Resources::new(10_000, 10_240)).unwrap();
        let a = p
            .reserve(
                "o",
                def(
                    0,
                    30,
                    Interpreter::Order,
                    vec![st(4, 2, 5), st(6, 3, 5)],
                    None,
                ),
            )
            .unwrap();
        p.check_invariants().unwrap();
        assert_eq!(a, vec![iv(10, 20, 2), iv(20, 30, 3)]);
        // ORDER_NO_GAP in [0, 12), two stages of 2 × 3 steps: stage 2 gets [6, 12) by demand;
        // [9, 12) already costs 0.4 (2 containers of `o` at 10 and 11), so both go to [6, 9);
        // stage 1 gets [0, 6): [3, 6) (tie, later) and [0, 3), one block ending at 6.
        let a = p
            .reserve(
                "ng",
                def(
                    0,
                    12,
                    Interpreter::OrderNoGap,
                    vec![st(2, 1, 3), st(2, 1, 3)],
                    None,
                ),
            )
            .unwrap();
        assert_eq!(a, vec![iv(0, 6, 1), iv(6, 9, 2)]);
        p.check_invariants().unwrap();
    }

    /// As in YARN's `AlignedPlannerWithGreedy`: LowCost places each ORDER_NO_GAP stage in its
    /// cheapest aligned interval and only then checks that it touches the next stage
    /// (`IterativePlanner.validateOrderNoGap`); when it does not, the whole request goes to the
    /// greedy agent. Two one-gang stages of 5 steps in [0, 20), 2 of 10 containers already held
    /// at [10, 15): the last stage takes [15, 20); the first stage's cheapest interval is
    /// [5, 10) (free, and later than [0, 5)), not the costlier [10, 15) next to it. So ORDER gets
    /// that from LowCost, and ORDER_NO_GAP gets one block [10, 20) from greedy.
    #[test]
    fn order_no_gap_chain_falls_back_to_greedy_when_lowcost_leaves_a_gap() {
        let mut p = Plan::new(cfg(Algorithm::LowCost, 60), Resources::new(10_000, 10_240)).unwrap();
        p.add_fixed("x", 10 * MIN, 15 * MIN, Resources::new(2000, 2048))
            .unwrap();
        let chain = |interp| def(0, 20, interp, vec![st(2, 2, 5), st(2, 2, 5)], None);
        let a = p.reserve("order", chain(Interpreter::Order)).unwrap();
        assert_eq!(a, vec![iv(5, 10, 2), iv(15, 20, 2)]);
        assert_eq!(p.get("order").unwrap().placed_by, Some(Algorithm::LowCost));
        p.delete("order");
        let a = p.reserve("no-gap", chain(Interpreter::OrderNoGap)).unwrap();
        assert_eq!(a, vec![iv(10, 20, 2)]);
        assert_eq!(p.get("no-gap").unwrap().placed_by, Some(Algorithm::Greedy));
        p.check_invariants().unwrap();
    }

    #[test]
    fn any_takes_one_stage_and_greedy_baseline() {
        let mut p = Plan::new(cfg(Algorithm::Greedy, 60), Resources::new(10_000, 10_240)).unwrap();
        // The last stage cannot fit (30 containers: 10 at [6,10), 10 at [2,6), then no room for
        // a third 4-step range), so ANY takes the first.
        let a = p
            .reserve(
                "any",
                def(
                    0,
                    10,
                    Interpreter::Any,
                    vec![st(5, 1, 4), st(30, 1, 4)],
                    None,
                ),
            )
            .unwrap();
        assert_eq!(a, vec![iv(6, 10, 5)]);
        assert!(p.get("any").unwrap().stages[1].is_none());
        // Greedy right: 8 containers; [6,10) has 5 free → 5 there; the most constraining step
        // of [6,10) is 6 (leftmost of equals), so the next range is [2,6) → 3 there.
        let a = p
            .reserve("g", def(0, 10, Interpreter::All, vec![st(8, 1, 4)], None))
            .unwrap();
        assert_eq!(a, vec![iv(2, 6, 3), iv(6, 10, 5)]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn recurring_instances_repeat_and_see_every_instance() {
        // 60-step agenda, period 20 → three instances.
        let mut p = Plan::new(cfg(Algorithm::LowCost, 60), Resources::new(10_000, 10_240)).unwrap();
        // Busy at step 45..50 (third instance's offset 5..10).
        p.add_fixed("busy", 45 * MIN, 50 * MIN, Resources::new(9000, 9216))
            .unwrap();
        let a = p
            .reserve(
                "daily",
                def(0, 10, Interpreter::All, vec![st(4, 1, 5)], Some(20)),
            )
            .unwrap();
        // Offset [5,10) is busy in one instance, so all instances use [0,5).
        assert_eq!(a, vec![iv(0, 5, 4), iv(20, 25, 4), iv(40, 45, 4)]);
        p.check_invariants().unwrap();
        // Cost, too, is the highest over the instances (§6.3): load 5 of 10 at offset [5,10) of
        // the second instance leaves room, but [5,10) then costs more than [0,5), which holds
        // the 4 of `daily` in every instance (2.5 against 2.0), so the gang of 2 goes to [0,5).
        let mut q = Plan::new(cfg(Algorithm::LowCost, 60), Resources::new(10_000, 10_240)).unwrap();
        q.add_fixed("half", 25 * MIN, 30 * MIN, Resources::new(5000, 5120))
            .unwrap();
        q.reserve(
            "daily",
            def(0, 5, Interpreter::All, vec![st(4, 4, 5)], Some(20)),
        )
        .unwrap();
        let a = q
            .reserve(
                "more",
                def(0, 10, Interpreter::All, vec![st(2, 2, 5)], Some(20)),
            )
            .unwrap();
        assert_eq!(a, vec![iv(0, 5, 2), iv(20, 25, 2), iv(40, 45, 2)]);
        q.check_invariants().unwrap();
        let e = p
            .reserve(
                "bad",
                def(0, 10, Interpreter::All, vec![st(4, 1, 5)], Some(7)),
            )
            .unwrap_err();
        assert!(e.to_string().contains("recurrence_ms"), "{e}");
        let e = p
            .reserve(
                "bad",
                def(0, 25, Interpreter::All, vec![st(4, 1, 5)], Some(20)),
            )
            .unwrap_err();
        assert!(e.to_string().contains("deadline_ms"), "{e}");
    }

    #[test]
    fn update_delete_and_reasons() {
        let mut p = Plan::new(cfg(Algorithm::LowCost, 60), Resources::new(10_000, 10_240)).unwrap();
        p.reserve("a", def(0, 10, Interpreter::All, vec![st(10, 1, 10)], None))
            .unwrap();
        let e = p
            .reserve("b", def(0, 10, Interpreter::All, vec![st(1, 1, 10)], None))
            .unwrap_err();
        assert!(matches!(e, Rejection::NoPlacement(_)), "{e}");
        assert!(e.to_string().contains("stage 0"), "{e}");
        assert!(matches!(
            p.reserve("a", def(0, 10, Interpreter::All, vec![st(1, 1, 1)], None)),
            Err(Rejection::Duplicate(_))
        ));
        let e = p
            .reserve("c", def(0, 10, Interpreter::All, vec![st(3, 2, 1)], None))
            .unwrap_err();
        assert!(e.to_string().contains("stages[0].containers"), "{e}");
        // Updating `a` may reuse its own capacity.
        let a = p
            .update("a", def(0, 10, Interpreter::All, vec![st(10, 10, 5)], None))
            .unwrap();
        assert_eq!(a, vec![iv(5, 10, 10)]);
        // A failed update keeps the old allocation.
        assert!(
            p.update("a", def(0, 10, Interpreter::All, vec![st(11, 11, 5)], None))
                .is_err()
        );
        assert_eq!(p.allocation("a").unwrap(), vec![iv(5, 10, 10)]);
        assert!(matches!(
            p.update("zz", def(0, 10, Interpreter::All, vec![st(1, 1, 1)], None)),
            Err(Rejection::Unknown(_))
        ));
        p.check_invariants().unwrap();
        assert!(p.delete("a"));
        assert!(!p.delete("a"));
        assert!(p.load().runs().all(|r| r.2.is_zero()));
        p.check_invariants().unwrap();
    }

    #[test]
    fn shrinking_capacity_moves_then_cancels_newest() {
        let mut p = Plan::new(cfg(Algorithm::LowCost, 20), Resources::new(10_000, 10_240)).unwrap();
        p.reserve(
            "old",
            def(0, 20, Interpreter::All, vec![st(6, 6, 10)], None),
        )
        .unwrap();
        p.reserve(
            "new",
            def(0, 10, Interpreter::All, vec![st(6, 6, 10)], None),
        )
        .unwrap();
        assert_eq!(p.allocation("old").unwrap(), vec![iv(10, 20, 6)]);
        assert_eq!(p.allocation("new").unwrap(), vec![iv(0, 10, 6)]);
        // Lose 5 containers over [10, 20): `old` (the only holder there) no longer fits, and
        // [0, 10) has 4 free: `old` is cancelled although older, as only it holds the
        // over-full steps.
        let r = p.shrink_capacity(10 * MIN, 20 * MIN, Resources::new(5000, 5120));
        assert_eq!(r.cancelled, vec!["old".to_string()]);
        p.check_invariants().unwrap();
        // A reservation that no longer fits is placed again where it still can.
        let mut p = Plan::new(cfg(Algorithm::LowCost, 20), Resources::new(10_000, 10_240)).unwrap();
        p.reserve(
            "old",
            def(10, 20, Interpreter::All, vec![st(4, 4, 10)], None),
        )
        .unwrap();
        p.reserve(
            "new",
            def(0, 20, Interpreter::All, vec![st(4, 4, 10)], None),
        )
        .unwrap();
        assert_eq!(p.allocation("new").unwrap(), vec![iv(0, 10, 4)]);
        let r = p.shrink_capacity(0, 10 * MIN, Resources::new(8000, 8192));
        assert_eq!(
            r,
            ReplanReport {
                moved: vec!["new".into()],
                cancelled: vec![]
            }
        );
        assert_eq!(p.allocation("new").unwrap(), vec![iv(10, 20, 4)]);
        p.check_invariants().unwrap();
        // Two holders of the over-full steps: the newest is taken out first, and once it is
        // out the older fits.
        let mut p = Plan::new(cfg(Algorithm::LowCost, 20), Resources::new(10_000, 10_240)).unwrap();
        p.reserve("a", def(10, 20, Interpreter::All, vec![st(4, 4, 10)], None))
            .unwrap();
        p.reserve("b", def(10, 20, Interpreter::All, vec![st(4, 4, 10)], None))
            .unwrap();
        let r = p.shrink_capacity(10 * MIN, 20 * MIN, Resources::new(4000, 4096));
        assert_eq!(
            r,
            ReplanReport {
                moved: vec![],
                cancelled: vec!["b".into()]
            }
        );
        assert!(p.get("a").is_some());
        p.check_invariants().unwrap();
    }

    #[test]
    fn lcm_agenda_and_serde_round_trip() {
        let h = 3_600_000;
        assert_eq!(
            PlanConfig::lcm_horizon(&[h, 4 * h, 6 * h, 24 * h]),
            Some(24 * h)
        );
        assert_eq!(PlanConfig::lcm_horizon(&[58 * 60_000, h]), Some(29 * h));
        assert_eq!(PlanConfig::lcm_horizon(&[0]), None);
        let mut p = Plan::new(cfg(Algorithm::LowCost, 60), Resources::new(10_000, 10_240)).unwrap();
        p.reserve(
            "a",
            def(
                0,
                20,
                Interpreter::Order,
                vec![st(4, 2, 5), st(2, 1, 3)],
                Some(30),
            ),
        )
        .unwrap();
        let text = serde_json::to_string(&p).unwrap();
        let back: Plan = serde_json::from_str(&text).unwrap();
        back.check_invariants().unwrap();
        assert_eq!(back.allocation("a"), p.allocation("a"));
    }

    /// A 10,000-node cluster, 1,000 recurring reservations on a 1,440-step day.
    #[test]
    fn footprint_is_small() {
        let node = Resources::new(16_000, 65_536);
        let mut p = Plan::new(PlanConfig::default(), node.scale(10_000)).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let periods = [60u64, 120, 240, 360, 720, 1440];
        let mut accepted = 0;
        for i in 0..1000 {
            let period = periods[rng.random_range(0..periods.len())];
            let a = rng.random_range(0..period / 2);
            let d = rng.random_range(a + period / 4..=period);
            let dur = rng.random_range(1..=((d - a) / 2).max(1));
            let stages = (0..rng.random_range(1..=3))
                .map(|_| Stage {
                    containers: 20 * rng.random_range(1..50u32),
                    gang: 20,
                    duration_ms: dur * MIN / 2 + MIN,
                    size: Resources::new(2000, 4096),
                })
                .collect();
            let r = def(a, d, Interpreter::Order, stages, Some(period));
            if p.reserve(&format!("job-{i}"), r).is_ok() {
                accepted += 1;
            }
        }
        assert!(accepted > 900, "{accepted}");
        p.check_invariants().unwrap();
        let bytes = p.heap_bytes();
        assert!(bytes < 4 << 20, "{bytes} bytes");
        assert!(p.load().run_count() <= 1440);
    }

    /// Random requests, updates, deletes and capacity shrinks (seeded), invariants after each.
    #[test]
    fn random_operations_keep_invariants() {
        for seed in 0..6u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let alg = if seed % 2 == 0 {
                Algorithm::LowCost
            } else {
                Algorithm::Greedy
            };
            let mut c = cfg(alg, 120);
            c.allocate_left = seed % 3 == 0;
            let mut p = Plan::new(c, Resources::new(40_000, 40_960)).unwrap();
            let interps = [
                Interpreter::All,
                Interpreter::Any,
                Interpreter::Order,
                Interpreter::OrderNoGap,
            ];
            let mut ids: Vec<String> = Vec::new();
            let mut cancelled = 0;
            for step in 0..300 {
                let op = rng.random_range(0..10);
                if op < 6 || ids.is_empty() {
                    let period =
                        [None, Some(30), Some(40), Some(60), Some(120)][rng.random_range(0..5)];
                    let len = period.unwrap_or(120);
                    let a = rng.random_range(0..len - 1);
                    let d = rng.random_range(a + 1..=len);
                    let stages = (0..rng.random_range(1..=3))
                        .map(|_| {
                            let gang = rng.random_range(1..=4);
                            Stage {
                                containers: gang * rng.random_range(1..=6),
                                gang,
                                duration_ms: rng.random_range(1..=20) * MIN
                                    - rng.random_range(0..MIN / 2),
                                size: Resources::new(
                                    1000 * rng.random_range(1..=4),
                                    1024 * rng.random_range(1..=4),
                                ),
                            }
                        })
                        .collect();
                    let mut r = def(a, d, interps[rng.random_range(0..4)], stages, period);
                    if rng.random_range(0..4) == 0 {
                        r.alignment_penalty = 0.5;
                    }
                    if op < 5 || ids.is_empty() {
                        let id = format!("r{step}");
                        if p.reserve(&id, r).is_ok() {
                            ids.push(id);
                        }
                    } else {
                        let id = ids[rng.random_range(0..ids.len())].clone();
                        let before = p.allocation(&id);
                        if p.update(&id, r).is_err() {
                            assert_eq!(p.allocation(&id), before);
                        }
                    }
                } else if op < 8 {
                    let id = ids.swap_remove(rng.random_range(0..ids.len()));
                    assert!(p.delete(&id));
                } else {
                    let s = rng.random_range(0..120u64);
                    let e = rng.random_range(s + 1..=120);
                    let report = p.shrink_capacity(s * MIN, e * MIN, Resources::new(3000, 3072));
                    for id in &report.cancelled {
                        ids.retain(|x| x != id);
                        assert!(p.get(id).is_none());
                    }
                    cancelled += report.cancelled.len();
                    // Capacity comes back now and then.
                    if rng.random_range(0..3) == 0 {
                        p.set_capacity(StepFn::constant(120, Resources::new(40_000, 40_960)));
                    }
                }
                p.check_invariants()
                    .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
                assert_eq!(p.reservations().count(), ids.len());
            }
            assert!(cancelled > 0 || seed > 0, "shrinks should cancel something");
        }
    }
}

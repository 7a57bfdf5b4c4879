//! The guarantor's reservations: the plan (Morpheus §6) in the live loop, layer 1 of the
//! guarantor's capacity sharing (DESIGN.md, "The guarantor: one loop for four papers").
//!
//! * A job running inside its reservation gets GUARANTEED containers up to the reservation's
//!   allocation at that moment, DRA stretches of its current instance included (§7); beyond it
//!   its asks wait (and DRA is asked to stretch the instance).
//! * Plain GUARANTEED work never takes reserved capacity: a plain grant (or a validated
//!   promotion) is admitted only when the plain work, plus what the reservations hold, still fits
//!   the cluster. What the reservations hold at a moment is, per reservation, the more of its
//!   allocation and what its containers use; when the plain ask gives a runtime estimate, the
//!   most the plan commits over that runtime counts instead of the allocation now, so that plain
//!   work does not start into a reservation's window that is about to begin.
//! * Reserved capacity its owner does not use is booked on no node, so the nodes' policing limits
//!   (capacity less GUARANTEED bookings, Mercury §4.3) offer it to QUEUEABLE work; when the owner
//!   asks, its grant is booked on a node, that node's limit drops, and the node preempts the
//!   QUEUEABLE work in the way (Mercury §3.4).
//!
//! Times: the agenda starts at the Unix epoch and repeats every horizon, so agenda time is
//! `now_ms % horizon_ms` (for the default one-day agenda, step 0 is 00:00 UTC). Reservation
//! windows are given in agenda time (or period time for recurring ones, §6.1).
//!
//! The plan's capacity is the cluster's GUARANTEED capacity: it grows as nodes join (to the sum
//! of their capacities) and shrinks by a node's capacity when a joined node is removed (lost or
//! drained), which replans (§6, YARN's `SimpleCapacityReplanner`): moved reservations are
//! reported reprovisioned, those that no longer fit cancelled. After a restart the stored plan
//! keeps its capacity while nodes re-join.
//!
//! The aggregate plan knows no nodes: a reservation's containers are placed on nodes by the
//! guarantor's placer like any GUARANTEED container, so fragmentation may make one wait although
//! its reservation has room in aggregate.

use super::dra::{Dra, STRETCH_MARK};
use super::plan::{AllocationInterval, Plan, PlanConfig, StepFn};
use super::{Algorithm, Rejection, ReservationDefinition};
use crate::{AppId, Resources};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Longest reservation id.
pub const MAX_RESERVATION_ID_LEN: usize = 128;

/// Why an owner is told about its reservation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReprovisionCause {
    /// The cluster's capacity shrank and the reservation was placed again.
    Replanned,
    /// DRA (§7) stretched the current instance by `extra` until `until_ms` (wall clock).
    Stretched { extra: Resources, until_ms: u64 },
}

/// What the guarantor tells reservation owners (taken with
/// [`ReservationBook::take_events`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservationEvent {
    /// The reservation's allocation changed; `allocation` is its allocation over the agenda now.
    Reprovisioned {
        id: String,
        owner: AppId,
        allocation: Vec<AllocationInterval>,
        cause: ReprovisionCause,
    },
    /// The reservation is gone (it no longer fits the cluster). Its running containers keep
    /// running as plain GUARANTEED work; its waiting asks (`dropped_asks`, by ask key) are
    /// dropped.
    Cancelled {
        id: String,
        owner: AppId,
        reason: String,
        dropped_asks: Vec<u64>,
    },
}

/// One reservation as listed for its owner or the operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationInfo {
    pub id: String,
    pub owner: AppId,
    pub definition: ReservationDefinition,
    pub allocation: Vec<AllocationInterval>,
    /// What it allocates now (stretches included).
    pub allocated_now: Resources,
    /// What its GUARANTEED containers hold now.
    pub used: Resources,
}

/// A DRA stretch of a reservation's current instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct LiveStretch {
    stretch_id: String,
    extra: Resources,
    /// Wall clock at which it ends.
    until_ms: u64,
}

/// What must survive a restart: the plan and the owners (see [`ReservationBook::stored`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredReservations {
    pub plan: Plan,
    pub owners: BTreeMap<String, AppId>,
}

/// The plan with its owners, what reservation-backed containers use, and the gates.
#[derive(Clone, Debug)]
pub struct ReservationBook {
    plan: Plan,
    owners: BTreeMap<String, AppId>,
    /// GUARANTEED resources held by each reservation's containers (granted or running).
    used: HashMap<String, Resources>,
    /// GUARANTEED resources held by containers of no reservation.
    plain_used: Resources,
    /// Sum of the joined nodes' capacities.
    cluster: Resources,
    /// Live DRA stretch of each reservation (at most one).
    stretches: BTreeMap<String, LiveStretch>,
    dra: Dra,
    events: Vec<ReservationEvent>,
    /// `(now_ms, Σ allocations now, Σ use above allocation now)` for [`ReservationBook::held`]:
    /// a plain ask is checked once per container, and these change only with time, the plan and
    /// reservation-backed use. Every `&mut self` method that changes either clears it.
    held_cache: std::cell::Cell<Option<(u64, Resources, Resources)>>,
}

impl Default for ReservationBook {
    fn default() -> ReservationBook {
        ReservationBook::new(PlanConfig::default(), Dra::default())
            .expect("the default plan configuration is valid")
    }
}

fn max_each(a: Resources, b: Resources) -> Resources {
    Resources::new(
        a.cpu_millis.max(b.cpu_millis),
        a.memory_mib.max(b.memory_mib),
    )
}

/// A reservation id: 1 to 128 characters of `A-Z a-z 0-9 . _ -`.
pub fn validate_reservation_id(id: &str) -> Result<(), Rejection> {
    if id.is_empty() || id.len() > MAX_RESERVATION_ID_LEN {
        return Err(Rejection::Invalid(format!(
            "reservation_id: must be 1 to {MAX_RESERVATION_ID_LEN} characters"
        )));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(Rejection::Invalid(
            "reservation_id: only A-Z, a-z, 0-9, '.', '_' and '-' are allowed".into(),
        ));
    }
    Ok(())
}

impl ReservationBook {
    /// An empty book (capacity 0 until nodes join).
    pub fn new(config: PlanConfig, dra: Dra) -> Result<ReservationBook, String> {
        Ok(ReservationBook {
            plan: Plan::new(config, Resources::ZERO)?,
            owners: BTreeMap::new(),
            used: HashMap::new(),
            plain_used: Resources::ZERO,
            cluster: Resources::ZERO,
            stretches: BTreeMap::new(),
            dra,
            events: Vec::new(),
            held_cache: Default::default(),
        })
    }

    /// Restore what [`ReservationBook::stored`] saved (after checking the plan's invariants,
    /// that every owner's reservation is in the plan and that the plan holds nothing else). Usage starts at zero: grants are booked
    /// again as the guarantor learns them. Stretches are not restored (they last one `T`).
    pub fn restore(stored: StoredReservations, dra: Dra) -> Result<ReservationBook, String> {
        let StoredReservations { plan, owners } = stored;
        plan.check_invariants()?;
        for id in owners.keys() {
            validate_reservation_id(id).map_err(|e| e.to_string())?;
            if plan.get(id).and_then(|r| r.definition.as_ref()).is_none() {
                return Err(format!(
                    "owner listed for {id:?}, which the plan does not hold"
                ));
            }
        }
        // What `stored` writes holds no stretch and nothing without an owner.
        if let Some(r) = plan.reservations().find(|r| !owners.contains_key(&r.id)) {
            return Err(format!("the plan holds {:?}, which has no owner", r.id));
        }
        Ok(ReservationBook {
            plan,
            owners,
            used: HashMap::new(),
            plain_used: Resources::ZERO,
            cluster: Resources::ZERO,
            stretches: BTreeMap::new(),
            dra,
            events: Vec::new(),
            held_cache: Default::default(),
        })
    }

    /// Apply configured settings to a restored book: the placement algorithm, its direction and
    /// smoothness, and DRA. The step and agenda stay the stored plan's (its reservations were
    /// placed on them).
    pub fn set_settings(
        &mut self,
        algorithm: Algorithm,
        allocate_left: bool,
        smoothness: u32,
        dra: Dra,
    ) {
        self.plan
            .set_placement(algorithm, allocate_left, smoothness);
        self.dra = dra;
    }

    /// What must be stored to survive a restart (stretches left out).
    pub fn stored(&self) -> StoredReservations {
        let mut plan = self.plan.clone();
        for s in self.stretches.values() {
            plan.delete(&s.stretch_id);
        }
        StoredReservations {
            plan,
            owners: self.owners.clone(),
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn dra(&self) -> &Dra {
        &self.dra
    }

    /// Whether any reservation is held (when none, the gates admit everything).
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    pub fn contains(&self, id: &str) -> bool {
        self.owners.contains_key(id)
    }

    pub fn owner(&self, id: &str) -> Option<&AppId> {
        self.owners.get(id)
    }

    pub fn ids(&self) -> impl Iterator<Item = &String> {
        self.owners.keys()
    }

    /// Agenda time of wall-clock `now_ms`.
    pub fn agenda_ms(&self, now_ms: u64) -> u64 {
        now_ms % self.plan.config().horizon_ms
    }

    fn step_at(&self, now_ms: u64) -> u32 {
        (self.agenda_ms(now_ms) / self.plan.config().step_ms) as u32
    }

    /// What reservation `id` allocates at `now_ms` (wall clock), stretches included.
    pub fn allocated_now(&self, id: &str, now_ms: u64) -> Option<Resources> {
        let at = self.agenda_ms(now_ms);
        if self.stretches.contains_key(id) {
            self.plan.allocated_with_stretches_at(id, at)
        } else {
            // No live stretch (the common case): no search for one in the plan.
            self.plan.allocated_at(id, at)
        }
    }

    /// What reservation `id`'s containers hold.
    pub fn used(&self, id: &str) -> Resources {
        self.used.get(id).copied().unwrap_or_default()
    }

    /// What containers of no reservation hold.
    pub fn plain_used(&self) -> Resources {
        self.plain_used
    }

    /// The sum of the joined nodes' capacities.
    pub fn cluster_capacity(&self) -> Resources {
        self.cluster
    }

    /// The plan's capacity (constant over the agenda).
    pub fn plan_capacity(&self) -> Resources {
        self.plan.capacity().at(0)
    }

    /// What the reservations hold at `now_ms`: per reservation the more of its allocation
    /// (stretches included) and its use; with `runtime_ms`, the most the plan commits over
    /// `[now, now + runtime)` stands in for the allocations.
    pub fn held(&self, now_ms: u64, runtime_ms: Option<u64>) -> Resources {
        let (allocated, over_allocation) = match self.held_cache.get() {
            Some((at, allocated, over)) if at == now_ms => (allocated, over),
            _ => {
                let mut over = Resources::ZERO;
                let mut allocated = Resources::ZERO;
                for id in self.owners.keys() {
                    let a = self.allocated_now(id, now_ms).unwrap_or_default();
                    allocated = allocated.saturating_add(&a);
                    over = over.saturating_add(&self.used(id).saturating_sub(&a));
                }
                self.held_cache.set(Some((now_ms, allocated, over)));
                (allocated, over)
            }
        };
        let committed = match runtime_ms {
            Some(ms) if ms > 0 => {
                let step = self.plan.config().step_ms;
                let from = self.step_at(now_ms);
                let offset = self.agenda_ms(now_ms) % step;
                let steps = (offset + ms).div_ceil(step).min(u64::from(u32::MAX)) as u32;
                max_each(allocated, self.plan.load_max(from, steps))
            }
            _ => allocated,
        };
        committed.saturating_add(&over_allocation)
    }

    /// Whether a plain GUARANTEED container of `resources` may be granted at `now_ms` without
    /// taking reserved capacity.
    pub fn admits_plain(
        &self,
        now_ms: u64,
        resources: &Resources,
        runtime_ms: Option<u64>,
    ) -> bool {
        if self.owners.is_empty() {
            return true;
        }
        self.plain_used
            .saturating_add(resources)
            .saturating_add(&self.held(now_ms, runtime_ms))
            .fits_in(&self.cluster)
    }

    /// Whether a container of `resources` fits reservation `id`'s allocation at `now_ms`.
    pub fn admits_reserved(&self, now_ms: u64, id: &str, resources: &Resources) -> bool {
        let Some(allocated) = self.allocated_now(id, now_ms) else {
            return false;
        };
        self.used(id).saturating_add(resources).fits_in(&allocated)
    }

    /// Book (or, with `add` false, unbook) a GUARANTEED container of `resources`.
    pub fn book(&mut self, reservation: Option<&str>, resources: &Resources, add: bool) {
        if reservation.is_some() {
            self.held_cache.set(None);
        }
        let slot = match reservation {
            Some(id) => self.used.entry(id.to_string()).or_default(),
            None => &mut self.plain_used,
        };
        *slot = if add {
            slot.saturating_add(resources)
        } else {
            slot.saturating_sub(resources)
        };
        if let Some(id) = reservation
            && self.used.get(id).is_some_and(|u| u.is_zero())
        {
            self.used.remove(id);
        }
    }

    /// Whether `owner` (None: the operator) may change reservation `id`.
    fn check_owner(&self, id: &str, owner: Option<&AppId>) -> Result<(), Rejection> {
        match (self.owners.get(id), owner) {
            (None, _) => Err(Rejection::Unknown(id.to_string())),
            (Some(o), Some(a)) if o != a => Err(Rejection::NotOwner(id.to_string())),
            _ => Ok(()),
        }
    }

    /// Accept a reservation for `owner` (§6.3, the plan's algorithm), or say why not.
    pub fn reserve(
        &mut self,
        id: &str,
        owner: AppId,
        def: ReservationDefinition,
    ) -> Result<Vec<AllocationInterval>, Rejection> {
        self.held_cache.set(None);
        validate_reservation_id(id)?;
        if self.owners.contains_key(id) {
            return Err(Rejection::Duplicate(id.to_string()));
        }
        let allocation = self.plan.reserve(id, def)?;
        self.owners.insert(id.to_string(), owner);
        Ok(allocation)
    }

    /// Replace a reservation's definition (the old allocation stays when the new one does not
    /// fit).
    pub fn update(
        &mut self,
        id: &str,
        owner: Option<&AppId>,
        def: ReservationDefinition,
    ) -> Result<Vec<AllocationInterval>, Rejection> {
        self.held_cache.set(None);
        self.check_owner(id, owner)?;
        self.plan.update(id, def)
    }

    /// Remove a reservation (and its stretch). Containers it holds become plain GUARANTEED work:
    /// the caller re-tags its grants and drops its waiting asks.
    pub fn delete(&mut self, id: &str, owner: Option<&AppId>) -> Result<(), Rejection> {
        self.check_owner(id, owner)?;
        self.forget(id);
        Ok(())
    }

    fn forget(&mut self, id: &str) {
        self.held_cache.set(None);
        self.plan.delete(id);
        self.owners.remove(id);
        self.stretches.remove(id);
        if let Some(u) = self.used.remove(id) {
            self.plain_used = self.plain_used.saturating_add(&u);
        }
    }

    /// The reservations of `owner` (all with `None`), in id order.
    pub fn list(&self, now_ms: u64, owner: Option<&AppId>) -> Vec<ReservationInfo> {
        self.owners
            .iter()
            .filter(|(_, o)| owner.is_none_or(|a| a == *o))
            .filter_map(|(id, o)| {
                let r = self.plan.get(id)?;
                Some(ReservationInfo {
                    id: id.clone(),
                    owner: o.clone(),
                    definition: r.definition.clone()?,
                    allocation: self.plan.allocation(id).unwrap_or_default(),
                    allocated_now: self.allocated_now(id, now_ms).unwrap_or_default(),
                    used: self.used(id),
                })
            })
            .collect()
    }

    /// The plan's free capacity over the agenda as maximal runs, in agenda ms.
    pub fn free_capacity(&self) -> Vec<AllocationInterval> {
        let cap = self.plan.capacity().to_dense();
        let load = self.plan.load().to_dense();
        let free: Vec<Resources> = cap
            .iter()
            .zip(&load)
            .map(|(c, l)| c.saturating_sub(l))
            .collect();
        let step = self.plan.config().step_ms;
        StepFn::from_dense(&free)
            .runs()
            .map(|(s, e, v)| AllocationInterval {
                start_ms: u64::from(s) * step,
                end_ms: u64::from(e) * step,
                cpu_millis: v.cpu_millis,
                memory_mib: v.memory_mib,
            })
            .collect()
    }

    /// A node's capacity changed: `old` before (None: it was not joined), `new` after (None: it
    /// was removed). The plan grows when the cluster outgrows it and shrinks by a removed node's
    /// capacity (replanning). Returns the reservations cancelled by replanning: the caller drops
    /// their waiting asks and reports them with [`ReservationBook::cancelled`].
    pub fn node_capacity_changed(
        &mut self,
        old: Option<Resources>,
        new: Option<Resources>,
    ) -> Vec<String> {
        self.held_cache.set(None);
        self.cluster = self
            .cluster
            .saturating_sub(&old.unwrap_or_default())
            .saturating_add(&new.unwrap_or_default());
        let plan_cap = self.plan_capacity();
        let target = match (old, new) {
            (Some(o), None) => plan_cap.saturating_sub(&o),
            _ => max_each(plan_cap, self.cluster),
        };
        if target == plan_cap {
            return Vec::new();
        }
        let report = self
            .plan
            .set_capacity(StepFn::constant(self.plan.steps(), target));
        for id in &report.moved {
            if let Some(owner) = self.owners.get(id) {
                self.events.push(ReservationEvent::Reprovisioned {
                    id: id.clone(),
                    owner: owner.clone(),
                    allocation: self.plan.allocation(id).unwrap_or_default(),
                    cause: ReprovisionCause::Replanned,
                });
            }
        }
        let mut cancelled = Vec::new();
        for id in report.cancelled {
            if let Some(base) = id.split(STRETCH_MARK).next()
                && base != id
            {
                // A DRA stretch cannot move: the instance is simply no longer stretched.
                if self.stretches.get(base).is_some_and(|s| s.stretch_id == id) {
                    self.stretches.remove(base);
                }
                continue;
            }
            if self.owners.contains_key(&id) {
                cancelled.push(id);
            }
        }
        cancelled
    }

    /// Report a reservation cancelled by replanning and forget it.
    pub fn cancelled(&mut self, id: &str, reason: &str, dropped_asks: Vec<u64>) {
        let Some(owner) = self.owners.get(id).cloned() else {
            return;
        };
        self.forget(id);
        self.events.push(ReservationEvent::Cancelled {
            id: id.to_string(),
            owner,
            reason: reason.to_string(),
            dropped_asks,
        });
    }

    /// End stretches whose time is up.
    pub fn expire_stretches(&mut self, now_ms: u64) {
        if self.stretches.is_empty() {
            return;
        }
        let ended: Vec<String> = self
            .stretches
            .iter()
            .filter(|(_, s)| s.until_ms <= now_ms)
            .map(|(id, _)| id.clone())
            .collect();
        if !ended.is_empty() {
            self.held_cache.set(None);
        }
        for id in ended {
            if let Some(s) = self.stretches.remove(&id) {
                self.plan.delete(&s.stretch_id);
            }
        }
    }

    /// DRA (§7) for reservation `id` whose job demands `demand` (used plus waiting) at `now_ms`:
    /// when that is above the allocation and no stretch is live, stretch the current instance for
    /// `T` where the plan has room. True when a stretch was committed (its owner is told).
    pub fn reprovision(&mut self, now_ms: u64, id: &str, demand: Resources) -> bool {
        self.held_cache.set(None);
        self.expire_stretches(now_ms);
        if self.stretches.contains_key(id) || !self.owners.contains_key(id) {
            return false;
        }
        let agenda_now = self.agenda_ms(now_ms);
        let Ok(Some(stretch_id)) = self.plan.reprovision(id, agenda_now, demand, &self.dra) else {
            return false;
        };
        let Some(part) = self
            .plan
            .get(&stretch_id)
            .and_then(|r| r.stages.first().cloned().flatten())
            .and_then(|parts| parts.first().copied())
        else {
            return false;
        };
        let step = self.plan.config().step_ms;
        let until_ms = (now_ms - agenda_now) + u64::from(part.end) * step;
        self.stretches.insert(
            id.to_string(),
            LiveStretch {
                stretch_id,
                extra: part.resources,
                until_ms,
            },
        );
        let owner = self.owners[id].clone();
        self.events.push(ReservationEvent::Reprovisioned {
            id: id.to_string(),
            owner,
            allocation: self.plan.allocation(id).unwrap_or_default(),
            cause: ReprovisionCause::Stretched {
                extra: part.resources,
                until_ms,
            },
        });
        true
    }

    /// The events for owners since the last call.
    pub fn take_events(&mut self) -> Vec<ReservationEvent> {
        std::mem::take(&mut self.events)
    }

    /// The plan's invariants, every owned reservation in the plan, every live stretch in the
    /// plan, and the books equal `grants` (per reservation, and plain under `None`).
    pub fn check_invariants(
        &self,
        grants: &HashMap<Option<String>, Resources>,
    ) -> Result<(), String> {
        self.plan.check_invariants()?;
        if !self
            .plan
            .load()
            .runs()
            .all(|r| r.2.fits_in(&self.plan_capacity()))
        {
            return Err("plan load exceeds its capacity".into());
        }
        for id in self.owners.keys() {
            if self.plan.get(id).is_none() {
                return Err(format!("reservation {id} owned but not in the plan"));
            }
            let in_plan = self.plan.stretches_of(id).count();
            if in_plan != usize::from(self.stretches.contains_key(id)) {
                return Err(format!(
                    "reservation {id}: {in_plan} stretches in the plan, {} live",
                    usize::from(self.stretches.contains_key(id))
                ));
            }
        }
        let owned = self.owners.len() + self.stretches.len();
        if self.plan.reservations().count() != owned {
            return Err(format!(
                "the plan holds {} entries for {owned} reservations and stretches",
                self.plan.reservations().count()
            ));
        }
        for (id, s) in &self.stretches {
            if self.plan.get(&s.stretch_id).is_none() || !self.owners.contains_key(id) {
                return Err(format!("stretch {} of {id} is stale", s.stretch_id));
            }
        }
        let plain = grants.get(&None).copied().unwrap_or_default();
        if plain != self.plain_used {
            return Err(format!(
                "plain GUARANTEED booked {} but grants sum to {plain}",
                self.plain_used
            ));
        }
        for (k, v) in grants {
            if let Some(id) = k {
                if self.used(id) != *v {
                    return Err(format!(
                        "reservation {id}: booked {} but grants sum to {v}",
                        self.used(id)
                    ));
                }
                if !self.owners.contains_key(id) {
                    return Err(format!("grants held for unknown reservation {id}"));
                }
            }
        }
        for (id, u) in &self.used {
            if !grants.contains_key(&Some(id.clone())) && !u.is_zero() {
                return Err(format!("reservation {id}: booked {u} without grants"));
            }
        }
        Ok(())
    }
}

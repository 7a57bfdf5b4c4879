//! Recurring reservations (Morpheus, OSDI'16, §6 and §7): the plan (agenda) of GUARANTEED capacity
//! promised over time, and the algorithms that place reservation requests into it.
//!
//! * [`plan::Plan`] is the agenda: the cluster's GUARANTEED capacity and the committed load over
//!   one agenda (the least common multiple of the periods, §6.1; one day by default), in steps
//!   of `step_ms`, both run-length encoded ([`plan::StepFn`]). Every reservation keeps one
//!   instance of its allocation; recurring ones repeat it every period at the same offset (§6.1).
//! * A request ([`ReservationDefinition`]) is YARN's reservation definition language as Morpheus
//!   uses it (§6.1, §6.2): a window `[arrival, deadline)`, stages of `containers` of a `size` in
//!   gangs for a `duration`, combined by an [`Interpreter`], optionally recurring.
//! * [`lowcost`] is LowCost (§6.3) as its authors built it in YARN (the aligned low-cost stage
//!   allocator driven by the iterative planner), with the §7 alignment penalty; [`greedy`] is
//!   YARN's greedy agent, the baseline and LowCost's fallback. [`planner`] is the iterative
//!   planner both share (stage order, stage windows, ANY / ORDER / ORDER_NO_GAP rules); [`dra`]
//!   stretches the current instance of a reservation whose job runs late (§7).
//! * [`book::ReservationBook`] is the guarantor's side (the live loop): who owns each
//!   reservation, what its GUARANTEED containers hold, the gates that keep plain GUARANTEED work
//!   off reserved capacity, DRA stretches and the events owners are told.
//! * When capacity shrinks, [`plan::Plan::set_capacity`] replans: reservations that no longer fit
//!   are placed again, and those that cannot be are cancelled, newest accepted first.
//!
//! All of it is sans-IO: times are plain milliseconds within the agenda, and nothing here reads a
//! clock.

pub mod book;
pub mod dra;
pub mod greedy;
pub mod lowcost;
pub mod plan;
pub mod planner;

pub use plan::{AllocationInterval, Plan, PlanConfig, ReplanReport, StepFn};

use crate::Resources;
use serde::{Deserialize, Serialize};

/// How the stages of a request combine (YARN's `ReservationRequestInterpreter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interpreter {
    /// Every stage is allocated, each anywhere in the window.
    All,
    /// Exactly one stage is allocated (the first that fits, from the favoured end).
    Any,
    /// Every stage is allocated, each ending no later than the next one starts.
    Order,
    /// As `Order`, and each stage is one contiguous block that ends where the next one starts.
    OrderNoGap,
}

impl std::fmt::Display for Interpreter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interpreter::All => "all",
            Interpreter::Any => "any",
            Interpreter::Order => "order",
            Interpreter::OrderNoGap => "order_no_gap",
        })
    }
}

/// One stage of a request: `containers` containers of `size`, in gangs of `gang` that must run
/// together, each for `duration_ms` (rounded up to whole steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    pub containers: u32,
    pub gang: u32,
    pub duration_ms: u64,
    pub size: Resources,
}

impl Stage {
    /// The resources of one gang.
    pub fn gang_resources(&self) -> Resources {
        self.size.scale(u64::from(self.gang))
    }

    /// How many gangs the stage asks for.
    pub fn gangs(&self) -> u32 {
        self.containers / self.gang.max(1)
    }
}

/// A reservation request (Morpheus §6.1 and §6.2; YARN's `ReservationDefinition`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationDefinition {
    /// Start of the window, ms from the start of the agenda (or of the period when recurring).
    /// Rounded up to a step.
    pub arrival_ms: u64,
    /// End of the window (exclusive), rounded down to a step.
    pub deadline_ms: u64,
    pub interpreter: Interpreter,
    pub stages: Vec<Stage>,
    /// The period of a recurring reservation: every instance gets the same allocation at the same
    /// offset within its period (§6.1). The window is given for the first period.
    pub recurrence_ms: Option<u64>,
    /// The §7 alignment penalty for jobs whose input arrival or output read times vary, in cost
    /// units (one fully loaded step costs 1) per step between an allocation's mid-point and the
    /// window's mid-point. 0 turns it off.
    #[serde(default)]
    pub alignment_penalty: f64,
}

/// Why a request was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The request itself is malformed (names the field).
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("a reservation with id {0:?} already exists")]
    Duplicate(String),
    #[error("no reservation with id {0:?}")]
    Unknown(String),
    /// The reservation belongs to another application.
    #[error("reservation {0:?} belongs to another application")]
    NotOwner(String),
    /// The request is well formed but does not fit the plan.
    #[error("cannot be placed: {0}")]
    NoPlacement(String),
}

/// The placement algorithm of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// LowCost (§6.3), falling back to greedy when it finds nothing (YARN's
    /// `AlignedPlannerWithGreedy`).
    #[serde(rename = "lowcost")]
    LowCost,
    /// The greedy agent alone (YARN's `GreedyReservationAgent`).
    Greedy,
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Algorithm::LowCost => "lowcost",
            Algorithm::Greedy => "greedy",
        })
    }
}

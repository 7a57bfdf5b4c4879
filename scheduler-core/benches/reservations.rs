//! LowCost placement (Morpheus §6.3) of one request into a plan that already holds 1,000
//! recurring reservations on a 1,440-step day (60 s steps) of a 10,000-node cluster.
//! `cargo bench -p scheduler-core --bench reservations`; prints p50 / p99 / max of 2,000
//! placements (each request is placed, timed, and deleted again so the plan stays the same),
//! then the time of a DRA pass (Morpheus §7) over every held reservation, once per hour of the
//! day, each job asking for 1.5 times what its reservation allocates at that moment.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::Resources;
use scheduler_core::reservation::{
    Algorithm, Interpreter, Plan, PlanConfig, ReservationDefinition, Stage, dra::Dra,
};
use std::hint::black_box;
use std::time::Instant;

const MIN: u64 = 60_000;
const PERIODS: [u64; 6] = [60, 120, 240, 360, 720, 1440];

fn request(rng: &mut StdRng, max_gangs: u32) -> ReservationDefinition {
    let period = PERIODS[rng.random_range(0..PERIODS.len())];
    let a = rng.random_range(0..period / 2);
    let d = rng.random_range(a + period / 4..=period);
    let stages = (0..rng.random_range(1..=3))
        .map(|_| Stage {
            containers: 20 * rng.random_range(1..max_gangs),
            gang: 20,
            duration_ms: rng.random_range(1..=((d - a) / 4).max(1)) * MIN,
            size: Resources::new(2000, 4096),
        })
        .collect();
    let interpreter = [
        Interpreter::All,
        Interpreter::Order,
        Interpreter::OrderNoGap,
        Interpreter::Any,
    ][rng.random_range(0..4)];
    ReservationDefinition {
        arrival_ms: a * MIN,
        deadline_ms: d * MIN,
        interpreter,
        stages,
        recurrence_ms: Some(period * MIN),
        alignment_penalty: if rng.random_range(0..4) == 0 {
            0.01
        } else {
            0.0
        },
    }
}

/// Fill a plan with 1,000 recurring reservations (or as many as 20,000 tries place) of up to `max_gangs` gangs of 20 containers
/// each, then time 2,000 placements of one more.
fn scenario(name: &str, max_gangs: u32) {
    let node = Resources::new(16_000, 65_536);
    let mut plan = Plan::new(PlanConfig::default(), node.scale(10_000)).expect("plan");
    let mut rng = StdRng::seed_from_u64(42);
    let mut held_ids: Vec<String> = Vec::new();
    let mut i = 0;
    while held_ids.len() < 1000 && i < 20_000 {
        let id = format!("job-{i}");
        if plan.reserve(&id, request(&mut rng, max_gangs)).is_ok() {
            held_ids.push(id);
        }
        i += 1;
    }
    let held = held_ids.len();
    plan.check_invariants().expect("invariants");
    let peak = plan
        .load()
        .runs()
        .map(|r| r.2.dominant_share(&node.scale(10_000)))
        .fold(0.0, f64::max);

    let mut us: Vec<f64> = Vec::new();
    let (mut accepted, mut by_lowcost) = (0, 0);
    for _ in 0..2000 {
        let req = request(&mut rng, max_gangs);
        let start = Instant::now();
        let ok = black_box(plan.reserve("probe", req)).is_ok();
        us.push(start.elapsed().as_secs_f64() * 1e6);
        if ok {
            accepted += 1;
            if plan.get("probe").and_then(|r| r.placed_by) == Some(Algorithm::LowCost) {
                by_lowcost += 1;
            }
            plan.delete("probe");
        }
    }
    us.sort_by(f64::total_cmp);
    let q = |p: f64| us[((us.len() as f64 * p) as usize).min(us.len() - 1)];
    println!(
        "{name}: {held} reservations held ({i} tried), peak load {:.0}% of capacity, plan {} KiB",
        peak * 100.0,
        plan.heap_bytes() / 1024
    );
    println!(
        "{name}: one placement ({accepted}/2000 accepted, {by_lowcost} by LowCost, the rest by the greedy fall-back): p50 {:.0} us, p99 {:.0} us, max {:.0} us",
        q(0.5),
        q(0.99),
        us[us.len() - 1]
    );

    // DRA: one pass over every held reservation at each hour of the day.
    let dra = Dra::default();
    let mut pass_ms: Vec<f64> = Vec::new();
    let mut stretched = 0;
    for hour in 0..24u64 {
        let now_ms = hour * 60 * MIN;
        let start = Instant::now();
        let mut stretches = Vec::new();
        for id in &held_ids {
            let allocated = plan.allocated_at(id, now_ms).expect("held");
            let demand = Resources::new(allocated.cpu_millis * 3 / 2, allocated.memory_mib * 3 / 2);
            if let Ok(Some(s)) = black_box(plan.reprovision(id, now_ms, demand, &dra)) {
                stretches.push(s);
            }
        }
        pass_ms.push(start.elapsed().as_secs_f64() * 1e3);
        stretched += stretches.len();
        for s in stretches {
            plan.delete(&s);
        }
    }
    plan.check_invariants().expect("invariants after DRA");
    pass_ms.sort_by(f64::total_cmp);
    println!(
        "{name}: DRA pass over {held} reservations, 24 passes (one per hour, {stretched} stretches committed in all): p50 {:.1} ms, max {:.1} ms",
        pass_ms[12], pass_ms[23]
    );
}

fn main() {
    scenario("light", 50);
    scenario("crowded", 70);
}

//! The live shaping pass (`scheduler_core::shaping::ShapingState::pass`, what the guarantor runs
//! every shaping interval) over 10,000 running containers on 500 hosts, with the `inference`
//! GP forecasters the coordinator uses (one per container and resource, forecasting the next
//! interval's peak one step ahead from a history of 20 interval peaks, evidence maximisation on
//! every call, warm-started from the previous fit by default), Eq. 9 buffer and Algorithm 1.
//! `cargo bench -p inference --bench shaping_live [-- --arima]`; prints the median and max of 5
//! passes. Usage is a seeded random walk per container.

use inference::forecast::GpConfig;
use inference::forecast::shaping::{ForecasterKind, GpFactory};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::shaper::ComponentRole;
use scheduler_core::shaping::ForecasterFactory;
use scheduler_core::shaping::{ShapingConfig, ShapingState};
use scheduler_core::{AppId, ContainerId, NodeId, Resources, Time};
use std::collections::HashMap;
use std::time::Instant;

const CONTAINERS: usize = 10_000;
const HOSTS: usize = 500;
const PER_APP: usize = 50;
const MINUTE_MS: u64 = 60_000;

fn main() {
    // `--arima` adds the ARIMA forecaster (its AIC order search on every call takes tens of
    // seconds a pass at this size: docs/benchmarks.md §7).
    bench(
        "gp (default), evidence maximisation every pass, warm-started",
        Box::new(ForecasterKind::Gp),
    );
    bench(
        "gp, evidence maximisation every pass, whole grid (warm_start: false)",
        Box::new(GpFactory::new(GpConfig {
            warm_start: false,
            ..GpConfig::default()
        })),
    );
    bench(
        "gp, evidence maximisation every 5th pass, staggered, warm-started",
        Box::new(GpFactory::new(GpConfig {
            refit_every: 5,
            ..GpConfig::default()
        })),
    );
    if std::env::args().any(|a| a == "--arima") {
        bench(
            "arima, order search every pass",
            Box::new(ForecasterKind::Arima),
        );
    }
}

fn bench(label: &str, factory: Box<dyn ForecasterFactory>) {
    let mut rng = StdRng::seed_from_u64(7);
    let request = Resources::new(1_600, 6_553);
    let hosts: HashMap<NodeId, Resources> = (0..HOSTS)
        .map(|h| {
            (
                NodeId::new(format!("h{h}")),
                Resources::new(32_000, 131_072),
            )
        })
        .collect();
    let mut state = ShapingState::new(ShapingConfig::default(), factory);
    let mut level: Vec<f64> = Vec::with_capacity(CONTAINERS);
    for i in 0..CONTAINERS {
        state.track(
            ContainerId::new(1, i as u64),
            &AppId::new(format!("app{}", i / PER_APP)),
            &NodeId::new(format!("h{}", i % HOSTS)),
            if i % PER_APP < 2 {
                ComponentRole::Core
            } else {
                ComponentRole::Elastic
            },
            request,
            request,
            Time::from_secs(i as u64),
        );
        level.push(rng.random_range(0.2..0.8));
    }
    let mut observe = |state: &mut ShapingState, rng: &mut StdRng| {
        for (i, l) in level.iter_mut().enumerate() {
            *l = (*l + rng.random_range(-0.05..0.05)).clamp(0.01, 1.0);
            let used = Resources::new(
                (request.cpu_millis as f64 * *l) as u64,
                (request.memory_mib as f64 * *l) as u64,
            );
            state.observe(ContainerId::new(1, i as u64), used);
        }
    };
    // Fill the history (20 interval peaks) without timing: passes before the forecaster has
    // its minimum history do no forecasting.
    let mut minute = 0;
    for _ in 0..20 {
        minute += 1;
        observe(&mut state, &mut rng);
        state.pass(Time::from_millis(minute * MINUTE_MS), &hosts);
    }
    let mut times: Vec<f64> = Vec::new();
    let mut resized = 0;
    let mut preempted = 0;
    for _ in 0..5 {
        minute += 1;
        observe(&mut state, &mut rng);
        let start = Instant::now();
        let out = state.pass(Time::from_millis(minute * MINUTE_MS), &hosts);
        times.push(start.elapsed().as_secs_f64() * 1e3);
        resized = out.resized.len();
        preempted += out.preempted.len();
    }
    times.sort_by(f64::total_cmp);
    println!(
        "live shaping pass, {label}, {CONTAINERS} containers on {HOSTS} hosts ({} forecasts a pass, one step ahead; {resized} resized in the last pass, {preempted} preempted in all): median {:.1} ms, max {:.1} ms",
        2 * CONTAINERS,
        times[2],
        times[4]
    );
}

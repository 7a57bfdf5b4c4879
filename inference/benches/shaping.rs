//! One shaping pass of Pace et al. (§3.2) over 10,000 running containers: a GP forecast (the
//! history kernel, Pace's window of 10, evidence maximisation every call) of each container's CPU
//! and memory use 10 steps ahead, then the pessimistic policy (Algorithm 1) over the cluster.
//! `cargo bench -p inference --bench shaping`; prints the median and max of 5 passes, split into
//! forecasting and policy. Usage series are seeded random walks as fractions of the request.

use inference::forecast::{Forecaster, GpConfig, GpForecaster};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::shaper::{
    ComponentRole, PreemptionPolicy, ShapedApp, ShapedComponent, ShaperConfig, UsageForecast, shape,
};
use scheduler_core::{AppId, ContainerId, NodeId, Resources, Time};
use std::collections::HashMap;
use std::time::Instant;

const CONTAINERS: usize = 10_000;
const HOSTS: usize = 500;
const PER_APP: usize = 50;
const HISTORY: usize = 30;
const HORIZON: usize = 10;

fn walk(rng: &mut StdRng) -> Vec<f64> {
    let mut level: f64 = rng.random_range(0.2..0.8);
    (0..HISTORY)
        .map(|_| {
            level = (level + rng.random_range(-0.05..0.05)).clamp(0.01, 1.0);
            level
        })
        .collect()
}

/// Peak mean over the horizon, with the variance at that step.
fn peak(f: &mut GpForecaster, history: &[f64]) -> UsageForecast {
    let out = f.forecast(history, HORIZON).expect("forecast");
    let best = out
        .iter()
        .max_by(|a, b| a.mean.total_cmp(&b.mean))
        .expect("horizon > 0");
    UsageForecast {
        peak_fraction: best.mean,
        variance: best.variance,
    }
}

fn main() {
    let mut rng = StdRng::seed_from_u64(7);
    let series: Vec<(Vec<f64>, Vec<f64>)> = (0..CONTAINERS)
        .map(|_| (walk(&mut rng), walk(&mut rng)))
        .collect();
    let hosts: HashMap<NodeId, Resources> = (0..HOSTS)
        .map(|h| {
            (
                NodeId::new(format!("h{h}")),
                Resources::new(32_000, 131_072),
            )
        })
        .collect();
    let config = ShaperConfig::default();
    let mut forecasters: Vec<(GpForecaster, GpForecaster)> = (0..CONTAINERS)
        .map(|_| {
            (
                GpForecaster::new(GpConfig::default()),
                GpForecaster::new(GpConfig::default()),
            )
        })
        .collect();
    let mut passes: Vec<(f64, f64)> = Vec::new();
    let mut preempted = 0;
    for _ in 0..5 {
        let start = Instant::now();
        let forecasts: Vec<(UsageForecast, UsageForecast)> = series
            .iter()
            .zip(forecasters.iter_mut())
            .map(|((cpu, mem), (fc, fm))| (peak(fc, cpu), peak(fm, mem)))
            .collect();
        let forecast_ms = start.elapsed().as_secs_f64() * 1e3;
        let apps: Vec<ShapedApp> = forecasts
            .chunks(PER_APP)
            .enumerate()
            .map(|(a, chunk)| ShapedApp {
                app_id: AppId::new(format!("app{a}")),
                order: a as u64,
                components: chunk
                    .iter()
                    .enumerate()
                    .map(|(k, (cpu, memory))| {
                        let i = a * PER_APP + k;
                        ShapedComponent {
                            id: ContainerId::new(1, i as u64),
                            host: NodeId::new(format!("h{}", i % HOSTS)),
                            role: if k < 2 {
                                ComponentRole::Core
                            } else {
                                ComponentRole::Elastic
                            },
                            started_at: Time::from_secs(i as u64),
                            request: Resources::new(1_600, 6_553),
                            current_use: Resources::ZERO,
                            cpu: *cpu,
                            memory: *memory,
                        }
                    })
                    .collect(),
            })
            .collect();
        let policy_start = Instant::now();
        let decision = shape(&config, PreemptionPolicy::Pessimistic, &hosts, &apps);
        let policy_ms = policy_start.elapsed().as_secs_f64() * 1e3;
        preempted = decision.preempt.len();
        passes.push((forecast_ms, policy_ms));
    }
    passes.sort_by(|a, b| (a.0 + a.1).total_cmp(&(b.0 + b.1)));
    let (f, p) = passes[2];
    let (fmax, pmax) = passes[4];
    println!(
        "shaping pass over {CONTAINERS} containers on {HOSTS} hosts (2 GP forecasts each, horizon {HORIZON}; {preempted} preempted): median {:.1} ms (forecasts {f:.1} ms, policy {p:.1} ms), max {:.1} ms (forecasts {fmax:.1} ms, policy {pmax:.1} ms)",
        f + p,
        fmax + pmax
    );
}

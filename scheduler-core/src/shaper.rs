//! The resource shaper of Pace et al. (§3.2): each shaping interval it resizes the allocation of
//! every running component to its forecast use plus a safe-guard buffer, and, when the shaped
//! allocations no longer fit a host, decides which components or applications are preempted
//! before the operating system runs out of memory (Algorithm 1, the *pessimistic* policy). The
//! *optimistic* policy (resize, preempt nothing, let the OS decide) is the baseline behind the
//! same interface. Sans-IO: the caller brings the forecasts (the `inference` crate's GP or ARIMA
//! forecasters) and applies the decision (resize limits, kill).
//!
//! Units. Eq. 9 adds the forecast's variance to a resource amount; Pace evaluated it on the Google
//! trace, whose usage is normalised. We keep that reading: the forecaster runs on use as a
//! fraction of the component's request, so for a request R the buffer in absolute units is
//! β = R · (K1 + K2 · V), V the variance of the normalised forecast.

use crate::{AppId, ContainerId, NodeId, Resources, Time};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Shaping settings. Defaults are Pace's best (§4.2, §5: K1 = 5%, K2 = 3 with GP).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShaperConfig {
    /// Constant part of the buffer, as a fraction of the request (Eq. 9's K1).
    pub k1: f64,
    /// Weight of the forecast's variance (Eq. 9's K2).
    pub k2: f64,
}

impl Default for ShaperConfig {
    fn default() -> Self {
        ShaperConfig { k1: 0.05, k2: 3.0 }
    }
}

/// Core components are compulsory for an application to do useful work; elastic ones only
/// speed it up (Pace §2, after [42]). Without a declaration, a component is core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComponentRole {
    #[default]
    Core,
    Elastic,
}

/// A forecast of one resource's use over the next shaping interval, as a fraction of the
/// component's request: the predicted peak and the variance of the prediction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageForecast {
    pub peak_fraction: f64,
    pub variance: f64,
}

/// One running component (container) as the shaper sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapedComponent {
    pub id: ContainerId,
    pub host: NodeId,
    pub role: ComponentRole,
    /// When it started (elastic components alive longest are kept first: Algorithm 1 line 27).
    pub started_at: Time,
    /// What the application asked for (the allocation never grows beyond it).
    pub request: Resources,
    /// What it uses now (the allocation never shrinks below it).
    pub current_use: Resources,
    pub cpu: UsageForecast,
    pub memory: UsageForecast,
}

/// A running application: its components, in the application scheduler's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapedApp {
    pub app_id: AppId,
    /// Position in the application scheduler's order (e.g. FIFO: submission time), Algorithm 1
    /// line 6: earlier applications keep their resources first.
    pub order: u64,
    pub components: Vec<ShapedComponent>,
}

/// Preemption policies (Pace §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionPolicy {
    /// Algorithm 1: core components first, elastic ones by time alive, preempt what does not fit.
    Pessimistic,
    /// Resize and preempt nothing: the OS (or priorities) decide under pressure.
    Optimistic,
}

/// Why a component is preempted (for its kill event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionReason {
    /// A core component of its application did not fit its host: the whole application goes.
    ApplicationCoreDoesNotFit,
    /// An elastic component did not fit beside the work placed before it.
    ElasticDoesNotFit,
}

impl std::fmt::Display for PreemptionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PreemptionReason::ApplicationCoreDoesNotFit => {
                "a core component of its application no longer fits its node: the application \
                 is preempted whole (Pace Algorithm 1)"
            }
            PreemptionReason::ElasticDoesNotFit => {
                "this elastic component's shaped allocation no longer fits its node beside older \
                 components (Pace Algorithm 1)"
            }
        })
    }
}

/// What the caller must do this interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShapingDecision {
    /// New allocation per component that keeps running.
    pub resize: Vec<(ContainerId, Resources)>,
    /// Components to preempt, with the reason.
    pub preempt: Vec<(ContainerId, PreemptionReason)>,
    /// Applications preempted whole (all their components are in `preempt`).
    pub failed_apps: Vec<AppId>,
}

/// Eq. 9 for one resource of one component, in absolute units: β = R · (K1 + K2 · V).
pub fn safeguard_buffer(config: &ShaperConfig, request: u64, forecast: &UsageForecast) -> f64 {
    request as f64 * (config.k1 + config.k2 * forecast.variance.max(0.0))
}

/// The shaped allocation of one component: forecast peak + β per resource, never above the
/// request nor below the current use.
pub fn shaped_allocation(config: &ShaperConfig, c: &ShapedComponent) -> Resources {
    let one = |request: u64, f: &UsageForecast, used: u64| -> u64 {
        let want = request as f64 * f.peak_fraction.max(0.0) + safeguard_buffer(config, request, f);
        (want.ceil() as u64).clamp(used.min(request), request)
    };
    Resources::new(
        one(c.request.cpu_millis, &c.cpu, c.current_use.cpu_millis),
        one(c.request.memory_mib, &c.memory, c.current_use.memory_mib),
    )
}

/// One shaping pass over every running application (Pace §3.2, Algorithm 1 for the pessimistic
/// policy). `hosts` gives each host's capacity for the shaped work.
pub fn shape(
    config: &ShaperConfig,
    policy: PreemptionPolicy,
    hosts: &HashMap<NodeId, Resources>,
    apps: &[ShapedApp],
) -> ShapingDecision {
    let mut decision = ShapingDecision::default();
    let allocation = |c: &ShapedComponent| shaped_allocation(config, c);
    if policy == PreemptionPolicy::Optimistic {
        for c in apps.iter().flat_map(|a| &a.components) {
            decision.resize.push((c.id, allocation(c)));
        }
        return decision;
    }
    // Lines 1-5: every host starts with its whole capacity free (signed: a component that does
    // not fit drives it below zero).
    let mut free: HashMap<&NodeId, (i128, i128)> = hosts
        .iter()
        .map(|(h, cap)| (h, (cap.cpu_millis as i128, cap.memory_mib as i128)))
        .collect();
    // Line 6: applications in the application scheduler's order.
    let mut order: Vec<&ShapedApp> = apps.iter().collect();
    order.sort_by(|a, b| a.order.cmp(&b.order).then(a.app_id.cmp(&b.app_id)));
    let mut kept: Vec<(ContainerId, Resources)> = Vec::new();
    for app in order {
        // Lines 8-21: the core components, all or nothing. What they would take per host is
        // tallied apart, so a pass is O(components), not O(applications × hosts).
        let mut need: HashMap<&NodeId, (i128, i128)> = HashMap::new();
        let mut fits = true;
        for c in app
            .components
            .iter()
            .filter(|c| c.role == ComponentRole::Core)
        {
            let a = allocation(c);
            let Some(&(cpu_free, mem_free)) = free.get(&c.host) else {
                fits = false;
                break;
            };
            let n = need.entry(&c.host).or_default();
            n.0 += a.cpu_millis as i128;
            n.1 += a.memory_mib as i128;
            if cpu_free - n.0 < 0 || mem_free - n.1 < 0 {
                fits = false;
                break;
            }
        }
        if !fits {
            // Lines 22-23, 38-41: the whole application is preempted.
            decision.failed_apps.push(app.app_id.clone());
            for c in &app.components {
                decision
                    .preempt
                    .push((c.id, PreemptionReason::ApplicationCoreDoesNotFit));
            }
            continue;
        }
        for (host, (cpu, mem)) in need {
            let slot = free.get_mut(host).expect("checked above");
            slot.0 -= cpu;
            slot.1 -= mem;
        }
        for c in app
            .components
            .iter()
            .filter(|c| c.role == ComponentRole::Core)
        {
            kept.push((c.id, allocation(c)));
        }
        // Lines 27-37: elastic components, alive longest first; one that does not fit is
        // preempted (it has likely done the least work).
        let mut elastic: Vec<&ShapedComponent> = app
            .components
            .iter()
            .filter(|c| c.role == ComponentRole::Elastic)
            .collect();
        elastic.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        for e in elastic {
            let a = allocation(e);
            let left = free
                .get(&e.host)
                .map(|&(cpu, mem)| (cpu - a.cpu_millis as i128, mem - a.memory_mib as i128));
            match left {
                // Line 33: an elastic component must leave something free (<= 0 preempts).
                Some((cpu, mem)) if cpu > 0 && mem > 0 => {
                    free.insert(&e.host, (cpu, mem));
                    kept.push((e.id, a));
                }
                _ => decision
                    .preempt
                    .push((e.id, PreemptionReason::ElasticDoesNotFit)),
            }
        }
    }
    // Lines 44-47: everything that keeps running is resized.
    decision.resize = kept;
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(
        seq: u64,
        host: &str,
        role: ComponentRole,
        started_s: u64,
        request: (u64, u64),
        peak: f64,
    ) -> ShapedComponent {
        ShapedComponent {
            id: ContainerId::new(0, seq),
            host: NodeId::from(host),
            role,
            started_at: Time::from_secs(started_s),
            request: Resources::new(request.0, request.1),
            current_use: Resources::ZERO,
            cpu: UsageForecast {
                peak_fraction: peak,
                variance: 0.0,
            },
            memory: UsageForecast {
                peak_fraction: peak,
                variance: 0.0,
            },
        }
    }

    fn hosts(cap: (u64, u64)) -> HashMap<NodeId, Resources> {
        [(NodeId::from("h"), Resources::new(cap.0, cap.1))].into()
    }

    #[test]
    fn the_buffer_follows_eq_9_and_the_allocation_stays_between_use_and_request() {
        let config = ShaperConfig::default();
        let f = UsageForecast {
            peak_fraction: 0.5,
            variance: 0.01,
        };
        // β = 1000 · (0.05 + 3 · 0.01) = 80.
        assert!((safeguard_buffer(&config, 1000, &f) - 80.0).abs() < 1e-9);
        let mut c = component(1, "h", ComponentRole::Core, 0, (1000, 2000), 0.5);
        c.cpu = f;
        c.memory = f;
        assert_eq!(shaped_allocation(&config, &c), Resources::new(580, 1160));
        // Never below what it uses now, never above its request.
        c.current_use = Resources::new(900, 100);
        c.memory.peak_fraction = 3.0;
        assert_eq!(shaped_allocation(&config, &c), Resources::new(900, 2000));
    }

    #[test]
    fn algorithm_1_keeps_cores_first_then_the_oldest_elastic_components() {
        let config = ShaperConfig { k1: 0.0, k2: 0.0 };
        // Host of 1000/1000. App 1 (first in order): core 400, elastic 300 (old) and 300 (young).
        // App 2: core 200. Shaped at their full request (peak 1.0).
        let a1 = ShapedApp {
            app_id: AppId::from("first"),
            order: 1,
            components: vec![
                component(1, "h", ComponentRole::Core, 0, (400, 400), 1.0),
                component(2, "h", ComponentRole::Elastic, 10, (300, 300), 1.0),
                component(3, "h", ComponentRole::Elastic, 5, (300, 300), 1.0),
            ],
        };
        let a2 = ShapedApp {
            app_id: AppId::from("second"),
            order: 2,
            components: vec![component(4, "h", ComponentRole::Core, 1, (200, 200), 1.0)],
        };
        let d = shape(
            &config,
            PreemptionPolicy::Pessimistic,
            &hosts((1000, 1000)),
            &[a2.clone(), a1.clone()],
        );
        // 400 core + 300 (the older elastic, started at 5 s) = 700; the younger elastic would
        // leave exactly 0: preempted (line 33); app 2's core fits in the 300 left.
        assert_eq!(
            d.preempt,
            vec![(ContainerId::new(0, 2), PreemptionReason::ElasticDoesNotFit)]
        );
        assert!(d.failed_apps.is_empty());
        let kept: Vec<u64> = d.resize.iter().map(|(id, _)| id.seq()).collect();
        assert_eq!(kept, vec![1, 3, 4]);
        // A host too small for app 2's core after app 1: app 2 fails whole.
        let mut a2_big = a2.clone();
        a2_big.components[0].request = Resources::new(400, 400);
        a2_big
            .components
            .push(component(5, "h", ComponentRole::Elastic, 2, (10, 10), 1.0));
        let d = shape(
            &config,
            PreemptionPolicy::Pessimistic,
            &hosts((1000, 1000)),
            &[a1.clone(), a2_big],
        );
        assert_eq!(d.failed_apps, vec![AppId::from("second")]);
        assert!(d.preempt.contains(&(
            ContainerId::new(0, 5),
            PreemptionReason::ApplicationCoreDoesNotFit
        )));
        // The optimistic policy preempts nothing (the OS would decide).
        let d = shape(
            &config,
            PreemptionPolicy::Optimistic,
            &hosts((1000, 1000)),
            &[a1, a2],
        );
        assert!(d.preempt.is_empty() && d.failed_apps.is_empty());
        assert_eq!(d.resize.len(), 4);
    }

    /// Whatever the forecasts, the pessimistic policy never leaves a host's kept allocations
    /// above its capacity, and every component is either kept or preempted, once.
    #[test]
    fn pessimistic_shaping_never_over_commits_a_host() {
        use rand::rngs::StdRng;
        use rand::{RngExt, SeedableRng};
        let mut rng = StdRng::seed_from_u64(11);
        let config = ShaperConfig::default();
        for _round in 0..300 {
            let host_names = ["h0", "h1", "h2"];
            let hosts: HashMap<NodeId, Resources> = host_names
                .iter()
                .map(|h| (NodeId::from(*h), Resources::new(4000, 8192)))
                .collect();
            let mut seq = 0;
            let apps: Vec<ShapedApp> = (0..rng.random_range(1..8u64))
                .map(|i| ShapedApp {
                    app_id: AppId::new(format!("app{i}")),
                    order: rng.random_range(0..100),
                    components: (0..rng.random_range(1..6))
                        .map(|_| {
                            seq += 1;
                            let mut c = component(
                                seq,
                                host_names[rng.random_range(0..3)],
                                if rng.random_bool(0.5) {
                                    ComponentRole::Core
                                } else {
                                    ComponentRole::Elastic
                                },
                                rng.random_range(0..1000),
                                (rng.random_range(100..3000), rng.random_range(100..6000)),
                                rng.random_range(0.0..1.2),
                            );
                            c.memory.variance = rng.random_range(0.0..0.05);
                            c
                        })
                        .collect(),
                })
                .collect();
            let d = shape(&config, PreemptionPolicy::Pessimistic, &hosts, &apps);
            let mut used: HashMap<NodeId, Resources> = HashMap::new();
            let host_of: HashMap<ContainerId, &NodeId> = apps
                .iter()
                .flat_map(|a| &a.components)
                .map(|c| (c.id, &c.host))
                .collect();
            for (id, r) in &d.resize {
                let u = used.entry(host_of[id].clone()).or_default();
                *u = u.saturating_add(r);
            }
            for (h, u) in &used {
                assert!(u.fits_in(&hosts[h]), "{h}: {u} > {}", hosts[h]);
            }
            assert_eq!(d.resize.len() + d.preempt.len(), seq as usize);
        }
    }
}

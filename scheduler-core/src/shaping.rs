//! The resource shaper's running state (Pace §3, "Resource monitor", "Utilization forecast",
//! "Resource shaper"): a bounded usage history per shaped container, fed from the workers'
//! heartbeats, and the shaping pass every `interval_ms` that forecasts each container's next
//! peak and hands the forecasts to [`crate::shaper::shape`] (Eq. 9 buffer, Algorithm 1).
//!
//! Sampling. Pace collects utilisation every minute (§5, "Monitoring frequency") and shapes at the
//! same period, so one observation per shaping interval: the *peak* use the heartbeats reported
//! during the interval (a forecast of the mean would under-provision every spike inside it). The
//! forecaster predicts the next interval's peak one step ahead.
//!
//! History bound. The GP's history kernel uses patterns of h = 10 observations and trains on the
//! N = h most recent ones (Pace §3.1, our `GpConfig` default), which takes h + N = 20
//! observations; older ones are dropped, so a container costs O(1) memory whatever its age.
//! Until a container has the forecaster's minimum history it keeps its allocation and is no
//! candidate for preemption.
//!
//! Sans-IO: the forecaster is behind [`SeriesForecaster`] (the `inference` crate implements it
//! with its GP and ARIMA forecasters), time is passed in.

use crate::shaper::{
    ComponentRole, PreemptionPolicy, PreemptionReason, ShapedApp, ShapedComponent, ShaperConfig,
    ShapingDecision, UsageForecast, shape,
};
use crate::{AppId, ContainerId, NodeId, Resources, Time};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// Settings of the live shaper.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapingConfig {
    /// Period of the shaping pass (Pace §5: one minute).
    pub interval_ms: u64,
    /// Observations kept per container and resource (h + N of the GP, see the module doc).
    pub history: usize,
    /// K1, K2 of Eq. 9.
    pub buffer: ShaperConfig,
    pub policy: PreemptionPolicy,
}

impl Default for ShapingConfig {
    fn default() -> Self {
        ShapingConfig {
            interval_ms: 60_000,
            history: 20,
            buffer: ShaperConfig::default(),
            policy: PreemptionPolicy::Pessimistic,
        }
    }
}

impl ShapingConfig {
    /// Errors name the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.interval_ms == 0 {
            return Err("shaping interval_ms must be at least 1".into());
        }
        if self.history < 2 {
            return Err(format!(
                "shaping history must keep at least 2 observations, got {}",
                self.history
            ));
        }
        for (name, v) in [("k1", self.buffer.k1), ("k2", self.buffer.k2)] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!(
                    "shaping {name} must be a finite number >= 0, got {v}"
                ));
            }
        }
        Ok(())
    }
}

/// Forecasts one usage series (one resource of one container), observations as fractions of the
/// container's request, oldest first. One instance follows one series (it may cache fitted
/// hyperparameters).
pub trait SeriesForecaster: Send {
    /// The next observation's predicted value and variance; `None` when the forecaster cannot
    /// (too short a history, a numerical failure): the container is then left at its request.
    fn forecast_next(&mut self, history: &[f64]) -> Option<UsageForecast>;
    /// Observations a forecast needs.
    fn min_history(&self) -> usize;
}

/// Makes the forecaster of each new series (GP by default, ARIMA selectable: see `inference`).
pub trait ForecasterFactory: Send {
    fn series(&self) -> Box<dyn SeriesForecaster>;
    fn name(&self) -> &'static str;
}

/// A bounded series of observations (the oldest is dropped when full).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageWindow {
    values: VecDeque<f64>,
    capacity: usize,
}

impl UsageWindow {
    pub fn new(capacity: usize) -> UsageWindow {
        UsageWindow {
            values: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
        }
    }

    pub fn push(&mut self, value: f64) {
        if self.values.len() == self.capacity {
            self.values.pop_front();
        }
        self.values.push_back(value);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Oldest first, contiguous.
    pub fn as_slice(&mut self) -> &[f64] {
        self.values.make_contiguous()
    }
}

/// A shaped container as the shaper tracks it.
struct Tracked {
    app: AppId,
    node: NodeId,
    role: ComponentRole,
    started_at: Time,
    request: Resources,
    /// Its current (shaped) allocation.
    allocation: Resources,
    /// Latest use a heartbeat reported.
    current_use: Resources,
    /// Peak use reported since the last pass, if any was.
    interval_peak: Option<Resources>,
    /// Per-interval peaks as fractions of the request: CPU, memory.
    cpu: UsageWindow,
    memory: UsageWindow,
    cpu_forecaster: Box<dyn SeriesForecaster>,
    memory_forecaster: Box<dyn SeriesForecaster>,
}

/// What one pass decided, per container (with its node and app, for the caller to act on).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShapingOutcome {
    /// Containers whose allocation changed.
    pub resized: Vec<Resize>,
    /// Containers to preempt: (node, container, app, reason). They are no longer tracked.
    pub preempted: Vec<(NodeId, ContainerId, AppId, PreemptionReason)>,
    /// Applications preempted whole.
    pub failed_apps: Vec<AppId>,
}

/// One container's allocation change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resize {
    pub node: NodeId,
    pub container: ContainerId,
    pub from: Resources,
    pub to: Resources,
}

impl Resize {
    /// It grows in some resource (a node applies growth only into room it has).
    pub fn grows(&self) -> bool {
        !self.to.fits_in(&self.from)
    }
}

/// The live shaper: histories, forecasters and allocations of the shaped containers.
pub struct ShapingState {
    config: ShapingConfig,
    factory: Box<dyn ForecasterFactory>,
    containers: HashMap<ContainerId, Tracked>,
    /// Applications in the order the scheduler first saw them (Algorithm 1 line 6: FIFO).
    app_order: HashMap<AppId, u64>,
    next_order: u64,
    last_pass: Option<Time>,
}

impl std::fmt::Debug for ShapingState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShapingState")
            .field("forecaster", &self.factory.name())
            .field("containers", &self.containers.len())
            .finish()
    }
}

impl ShapingState {
    pub fn new(config: ShapingConfig, factory: Box<dyn ForecasterFactory>) -> ShapingState {
        ShapingState {
            config,
            factory,
            containers: HashMap::new(),
            app_order: HashMap::new(),
            next_order: 0,
            last_pass: None,
        }
    }

    pub fn config(&self) -> &ShapingConfig {
        &self.config
    }

    pub fn forecaster_name(&self) -> &'static str {
        self.factory.name()
    }

    pub fn len(&self) -> usize {
        self.containers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    pub fn is_tracked(&self, id: ContainerId) -> bool {
        self.containers.contains_key(&id)
    }

    /// Shaped containers with a use report since the last pass.
    pub fn observed_since_pass(&self) -> usize {
        self.containers
            .values()
            .filter(|t| t.interval_peak.is_some())
            .count()
    }

    /// Every shaped container's current allocation, by id.
    pub fn allocations(&self) -> Vec<(ContainerId, Resources)> {
        let mut all: Vec<(ContainerId, Resources)> = self
            .containers
            .iter()
            .map(|(id, t)| (*id, t.allocation))
            .collect();
        all.sort_by_key(|a| a.0);
        all
    }

    /// What shaping frees: the sum over shaped containers of request minus current allocation
    /// (Pace's saving, the capacity new GUARANTEED work can use).
    pub fn freed(&self) -> Resources {
        self.containers
            .values()
            .fold(Resources::new(0, 0), |sum, t| {
                Resources::new(
                    sum.cpu_millis + t.request.cpu_millis.saturating_sub(t.allocation.cpu_millis),
                    sum.memory_mib + t.request.memory_mib.saturating_sub(t.allocation.memory_mib),
                )
            })
    }

    /// The current allocation of a shaped container.
    pub fn allocation(&self, id: ContainerId) -> Option<Resources> {
        self.containers.get(&id).map(|t| t.allocation)
    }

    /// Start shaping a running container, allocated its `request`. Idempotent.
    #[allow(clippy::too_many_arguments)]
    pub fn track(
        &mut self,
        id: ContainerId,
        app: &AppId,
        node: &NodeId,
        role: ComponentRole,
        request: Resources,
        allocation: Resources,
        started_at: Time,
    ) {
        if self.containers.contains_key(&id) {
            return;
        }
        if !self.app_order.contains_key(app) {
            self.app_order.insert(app.clone(), self.next_order);
            self.next_order += 1;
        }
        let history = self.config.history;
        self.containers.insert(
            id,
            Tracked {
                app: app.clone(),
                node: node.clone(),
                role,
                started_at,
                request,
                allocation,
                current_use: Resources::ZERO,
                interval_peak: None,
                cpu: UsageWindow::new(history),
                memory: UsageWindow::new(history),
                cpu_forecaster: self.factory.series(),
                memory_forecaster: self.factory.series(),
            },
        );
    }

    /// Stop shaping a container (it ended). Forgets its app once no container of it is left.
    pub fn untrack(&mut self, id: ContainerId) -> bool {
        let Some(t) = self.containers.remove(&id) else {
            return false;
        };
        if !self.containers.values().any(|o| o.app == t.app) {
            self.app_order.remove(&t.app);
        }
        true
    }

    /// A heartbeat reported the container's use.
    pub fn observe(&mut self, id: ContainerId, used: Resources) {
        if let Some(t) = self.containers.get_mut(&id) {
            t.current_use = used;
            let peak = t.interval_peak.unwrap_or(used);
            t.interval_peak = Some(Resources::new(
                peak.cpu_millis.max(used.cpu_millis),
                peak.memory_mib.max(used.memory_mib),
            ));
        }
    }

    /// A pass is due at `now`: an interval after the last one, or after the first call.
    pub fn due(&mut self, now: Time) -> bool {
        match self.last_pass {
            None => {
                self.last_pass = Some(now);
                false
            }
            Some(t) => now.as_millis() >= t.as_millis().saturating_add(self.config.interval_ms),
        }
    }

    /// One shaping pass at `now`. `hosts` is each node's capacity for the shaped containers (its
    /// capacity less what unshaped GUARANTEED work holds). Records the interval's peaks, forecasts,
    /// runs the policy, and updates the tracked allocations; preempted containers are forgotten.
    pub fn pass(&mut self, now: Time, hosts: &HashMap<NodeId, Resources>) -> ShapingOutcome {
        self.last_pass = Some(now);
        // Containers without a forecast yet keep their allocation and are no candidates for
        // preemption (never shape, nor kill, on no information): their allocation comes off
        // their host like unshaped work.
        let mut hosts = hosts.clone();
        let mut by_app: HashMap<&AppId, Vec<ShapedComponent>> = HashMap::new();
        for (id, t) in self.containers.iter_mut() {
            // An interval without a report (a container that just started, a late heartbeat)
            // adds no observation rather than a false zero.
            if let Some(peak) = t.interval_peak.take() {
                t.cpu.push(fraction(peak.cpu_millis, t.request.cpu_millis));
                t.memory
                    .push(fraction(peak.memory_mib, t.request.memory_mib));
            }
            let (Some(cpu), Some(memory)) = (
                forecast(&mut *t.cpu_forecaster, &mut t.cpu),
                forecast(&mut *t.memory_forecaster, &mut t.memory),
            ) else {
                if let Some(free) = hosts.get_mut(&t.node) {
                    *free = free.saturating_sub(&t.allocation);
                }
                continue;
            };
            by_app.entry(&t.app).or_default().push(ShapedComponent {
                id: *id,
                host: t.node.clone(),
                role: t.role,
                started_at: t.started_at,
                request: t.request,
                current_use: t.current_use,
                cpu,
                memory,
            });
        }
        let apps: Vec<ShapedApp> = by_app
            .into_iter()
            .map(|(app, mut components)| {
                components.sort_by_key(|c| c.id);
                ShapedApp {
                    app_id: app.clone(),
                    order: self.app_order.get(app).copied().unwrap_or(u64::MAX),
                    components,
                }
            })
            .collect();
        let mut decision: ShapingDecision =
            shape(&self.config.buffer, self.config.policy, &hosts, &apps);
        if self.config.policy == PreemptionPolicy::Optimistic {
            self.cap_optimistic_growth(&mut decision, &hosts);
        }
        let mut outcome = ShapingOutcome {
            failed_apps: decision.failed_apps,
            ..ShapingOutcome::default()
        };
        for (id, allocation) in decision.resize {
            if let Some(t) = self.containers.get_mut(&id)
                && t.allocation != allocation
            {
                outcome.resized.push(Resize {
                    node: t.node.clone(),
                    container: id,
                    from: std::mem::replace(&mut t.allocation, allocation),
                    to: allocation,
                });
            }
        }
        for (id, reason) in decision.preempt {
            if let Some(t) = self.containers.get(&id) {
                outcome
                    .preempted
                    .push((t.node.clone(), id, t.app.clone(), reason));
                self.untrack(id);
            }
        }
        outcome.resized.sort_by_key(|r| r.container);
        outcome.preempted.sort_by_key(|p| p.1);
        outcome
    }
}

impl ShapingState {
    /// The optimistic policy preempts nothing, so growth back is bounded by what the host has
    /// left once every shrink is applied: a container grows as far as that room allows (in
    /// application order) and the OS decides if its use goes beyond. Bookings never exceed the
    /// host's capacity.
    fn cap_optimistic_growth(
        &self,
        decision: &mut ShapingDecision,
        hosts: &HashMap<NodeId, Resources>,
    ) {
        let current = |id: &ContainerId| self.containers.get(id).map(|t| t.allocation);
        let mut left: HashMap<&NodeId, Resources> = hosts.iter().map(|(h, c)| (h, *c)).collect();
        // Everything first at min(old, new): what is certainly held after the pass.
        for (id, new) in &decision.resize {
            if let (Some(t), Some(old)) = (self.containers.get(id), current(id))
                && let Some(l) = left.get_mut(&t.node)
            {
                *l = l.saturating_sub(&old.min(new));
            }
        }
        let mut order: Vec<usize> = (0..decision.resize.len()).collect();
        order.sort_by_key(|&i| {
            let id = decision.resize[i].0;
            let app = self.containers.get(&id).map(|t| &t.app);
            (app.and_then(|a| self.app_order.get(a)).copied(), id)
        });
        for i in order {
            let (id, new) = decision.resize[i];
            let (Some(t), Some(old)) = (self.containers.get(&id), current(&id)) else {
                continue;
            };
            let floor = old.min(&new);
            let growth = new.saturating_sub(&floor);
            let Some(l) = left.get_mut(&t.node) else {
                decision.resize[i].1 = floor;
                continue;
            };
            let granted = growth.min(l);
            *l = l.saturating_sub(&granted);
            decision.resize[i].1 = floor.saturating_add(&granted);
        }
    }
}

fn fraction(used: u64, request: u64) -> f64 {
    if request == 0 {
        0.0
    } else {
        used as f64 / request as f64
    }
}

/// The forecast of the next peak; `None` while the history is too short or the forecaster
/// fails.
fn forecast(f: &mut dyn SeriesForecaster, window: &mut UsageWindow) -> Option<UsageForecast> {
    if window.len() < f.min_history() {
        return None;
    }
    f.forecast_next(window.as_slice())
        .filter(|p| p.peak_fraction.is_finite() && p.variance.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forecasts the last observation with no variance (a persistence forecast): enough to test
    /// the state machine without the `inference` crate.
    struct Persistence;
    impl SeriesForecaster for Persistence {
        fn forecast_next(&mut self, history: &[f64]) -> Option<UsageForecast> {
            history.last().map(|&v| UsageForecast {
                peak_fraction: v,
                variance: 0.0,
            })
        }
        fn min_history(&self) -> usize {
            3
        }
    }
    struct PersistenceFactory;
    impl ForecasterFactory for PersistenceFactory {
        fn series(&self) -> Box<dyn SeriesForecaster> {
            Box::new(Persistence)
        }
        fn name(&self) -> &'static str {
            "persistence"
        }
    }

    #[test]
    fn the_window_keeps_only_the_newest_observations() {
        let mut w = UsageWindow::new(3);
        for v in 0..5 {
            w.push(v as f64);
        }
        assert_eq!(w.as_slice(), &[2.0, 3.0, 4.0]);
    }

    #[test]
    fn a_container_stays_at_its_request_until_the_history_is_long_enough_then_shrinks() {
        let config = ShapingConfig {
            buffer: ShaperConfig { k1: 0.05, k2: 0.0 },
            ..ShapingConfig::default()
        };
        let mut s = ShapingState::new(config, Box::new(PersistenceFactory));
        let id = ContainerId::new(0, 1);
        let node = NodeId::from("n");
        let request = Resources::new(1000, 1000);
        s.track(
            id,
            &AppId::from("a"),
            &node,
            ComponentRole::Core,
            request,
            request,
            Time::ZERO,
        );
        let hosts: HashMap<NodeId, Resources> = [(node.clone(), Resources::new(4000, 4000))].into();
        for pass in 1..=3u64 {
            s.observe(id, Resources::new(300, 200));
            let out = s.pass(Time::from_secs(60 * pass), &hosts);
            if pass < 3 {
                assert!(out.resized.is_empty(), "pass {pass}: {out:?}");
            } else {
                // 30 % + 5 % of 1000 CPU, 20 % + 5 % of 1000 MiB.
                assert_eq!(
                    out.resized,
                    vec![Resize {
                        node: node.clone(),
                        container: id,
                        from: request,
                        to: Resources::new(350, 250)
                    }]
                );
            }
        }
        assert_eq!(s.allocation(id), Some(Resources::new(350, 250)));
        assert_eq!(s.freed(), Resources::new(650, 750));
        // The use rises: the allocation grows back with the next pass, up to the request.
        s.observe(id, Resources::new(2000, 900));
        let out = s.pass(Time::from_secs(240), &hosts);
        assert_eq!(
            out.resized,
            vec![Resize {
                node,
                container: id,
                from: Resources::new(350, 250),
                to: Resources::new(1000, 950)
            }]
        );
        assert!(out.resized[0].grows());
        assert_eq!(s.freed(), Resources::new(0, 50));
        assert!(s.untrack(id) && s.is_empty());
        assert_eq!(s.freed(), Resources::new(0, 0));
    }
}

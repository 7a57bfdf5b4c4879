//! Scenario tests of Pace's resource shaper inside the guarantor, with the real GP and ARIMA
//! forecasters: running GUARANTEED containers that allow shaping are shrunk to forecast + β, the
//! freed capacity takes a new GUARANTEED placement and raises the QUEUEABLE policing limit, a
//! burst grows the allocations back and makes Algorithm 1 preempt elastic components (never a
//! core one while cores fit), and unshaped containers keep their request. After every step: the
//! guarantor's invariants (no node over-committed, books equal grants, shaped bookings equal the
//! shaper's allocations, never above a request), and every shaped allocation at least the
//! container's current use.

use inference::forecast::shaping::ForecasterKind;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::guarantor::{BestFit, GuaranteedAsk, Guarantor, GuarantorConfig};
use scheduler_core::shaper::{ComponentRole, PreemptionPolicy, PreemptionReason};
use scheduler_core::shaping::{ShapingConfig, ShapingState};
use scheduler_core::{AppId, ContainerId, JobId, NodeId, Resources};
use std::collections::HashMap;

fn ask(
    key: u64,
    app: &str,
    resources: Resources,
    role: ComponentRole,
    shaped: bool,
) -> GuaranteedAsk {
    GuaranteedAsk {
        ask_key: key,
        app_id: AppId::from(app),
        resources,
        count: 1,
        priority: 0,
        locality: None,
        runtime_estimate_ms: None,
        job_id: JobId::from("j"),
        job_submit_time_ms: 0,
        role,
        allow_shaping: shaped,
    }
}

struct Scenario {
    g: Guarantor,
    /// Each running container's current use.
    usage: HashMap<ContainerId, Resources>,
    now_ms: u64,
    passes: u32,
}

impl Scenario {
    fn new(kind: ForecasterKind, policy: PreemptionPolicy) -> Scenario {
        let shaping = ShapingState::new(
            ShapingConfig {
                policy,
                ..ShapingConfig::default()
            },
            Box::new(kind),
        );
        let mut g =
            Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), 0).with_shaping(shaping);
        g.add_node(NodeId::from("n"), "r".into(), Resources::new(4000, 8192));
        Scenario {
            g,
            usage: HashMap::new(),
            now_ms: 0,
            passes: 0,
        }
    }

    fn check(&self) {
        self.g.check_invariants().expect("guarantor invariants");
        let shaping = self.g.shaping().expect("shaping on");
        for (id, used) in &self.usage {
            if let Some(a) = shaping.allocation(*id) {
                assert!(
                    used.fits_in(&a),
                    "{id}: shaped to {a} below its current use {used}"
                );
            }
        }
    }

    /// Place what is pending and start it.
    fn place(&mut self) -> Vec<ContainerId> {
        let placed = self.g.schedule(self.now_ms);
        let ids: Vec<ContainerId> = placed.iter().map(|p| p.token_body.container_id).collect();
        for id in &ids {
            self.g.on_started(*id);
            self.usage.insert(*id, Resources::ZERO);
        }
        self.check();
        ids
    }

    /// One minute: heartbeats every 10 s report the use `f(container)`, then the shaping pass.
    fn minute(
        &mut self,
        mut use_of: impl FnMut(ContainerId) -> Resources,
    ) -> scheduler_core::shaping::ShapingOutcome {
        for _ in 0..6 {
            self.now_ms += 10_000;
            let ids: Vec<ContainerId> = self.usage.keys().copied().collect();
            for id in ids {
                let u = use_of(id);
                self.usage.insert(id, u);
                self.g.observe_usage(id, u);
            }
        }
        // The first call only starts the shaper's interval clock.
        assert!(self.g.shaping_due(self.now_ms) || self.passes == 0);
        self.passes += 1;
        let out = self.g.shape(self.now_ms);
        for (_, id, _, _) in &out.preempted {
            self.usage.remove(id);
        }
        self.check();
        out
    }

    fn node_guaranteed(&self) -> Resources {
        self.g.node(&NodeId::from("n")).expect("node").guaranteed
    }
}

/// Use as a fraction of the request with seeded noise: `level` ± 5 %.
fn noisy(rng: &mut StdRng, request: Resources, level: f64) -> Resources {
    let f = (level + rng.random_range(-0.05..0.05)).clamp(0.0, 1.0);
    Resources::new(
        (request.cpu_millis as f64 * f) as u64,
        (request.memory_mib as f64 * f) as u64,
    )
}

#[test]
fn shaping_frees_capacity_for_a_new_placement_and_a_burst_preempts_elastic_components() {
    for kind in [ForecasterKind::Gp, ForecasterKind::Arima] {
        let mut s = Scenario::new(kind, PreemptionPolicy::Pessimistic);
        let request = Resources::new(1000, 2048);
        // App "a": two core and two elastic components that allow shaping fill the node.
        s.g.submit(ask(1, "a", request, ComponentRole::Core, true))
            .unwrap();
        s.g.submit(ask(2, "a", request, ComponentRole::Core, true))
            .unwrap();
        s.g.submit(ask(3, "a", request, ComponentRole::Elastic, true))
            .unwrap();
        let a = s.place();
        s.now_ms += 1_000; // the last elastic starts later: the youngest
        s.g.submit(ask(4, "a", request, ComponentRole::Elastic, true))
            .unwrap();
        let a4 = s.place();
        assert_eq!(a.len() + a4.len(), 4);
        let elastic_young = a4[0];
        let limit_full = s.g.queueable_limit(&NodeId::from("n")).unwrap();
        assert_eq!(limit_full, Resources::new(0, 0));
        // App "b" (not shaped) waits: no room.
        s.g.submit(ask(5, "b", request, ComponentRole::Core, false))
            .unwrap();
        assert!(s.place().is_empty());

        // Steady use around 30 % of the request: no shaping until the forecaster has its
        // history, then every container shrinks.
        let mut rng = StdRng::seed_from_u64(3);
        let mut shaped_at = None;
        for minute in 1..=25 {
            let out = s.minute(|_| noisy(&mut rng, request, 0.3));
            assert!(
                out.preempted.is_empty(),
                "{kind:?} minute {minute}: {out:?}"
            );
            if shaped_at.is_none() && !out.resized.is_empty() {
                shaped_at = Some(minute);
            }
        }
        let shaped_at = shaped_at.unwrap_or_else(|| panic!("{kind:?}: never shaped"));
        assert!(
            shaped_at >= 4,
            "{kind:?}: shaped at minute {shaped_at} on no history"
        );
        let booked = s.node_guaranteed();
        assert!(
            booked.cpu_millis <= 3000 && booked.memory_mib <= 3 * 2048,
            "{kind:?}: still booked {booked}"
        );
        // The freed capacity is policed for QUEUEABLE work and takes app "b".
        assert!(s.g.queueable_limit(&NodeId::from("n")).unwrap().cpu_millis >= 1000);
        let b = s.place();
        assert_eq!(
            b.len(),
            1,
            "{kind:?}: b not admitted into the freed capacity"
        );
        let b = b[0];
        assert!(
            s.g.shaping().unwrap().allocation(b).is_none(),
            "b is not shaped"
        );

        // Burst: every shaped container uses its whole request. Growth back fills the node
        // (b holds its request), so Algorithm 1 keeps both cores and preempts the elastic ones,
        // youngest first; no core component, and not app a as a whole.
        let out = s.minute(|_| request);
        let preempted: Vec<(ContainerId, PreemptionReason)> =
            out.preempted.iter().map(|p| (p.1, p.3)).collect();
        assert!(
            preempted.contains(&(elastic_young, PreemptionReason::ElasticDoesNotFit)),
            "{kind:?}: {out:?}"
        );
        assert!(out.failed_apps.is_empty(), "{kind:?}: {out:?}");
        for id in &a[..2] {
            assert!(
                !preempted.iter().any(|p| p.0 == *id),
                "{kind:?}: core {id} preempted"
            );
            assert_eq!(s.g.shaping().unwrap().allocation(*id), Some(request));
        }
    }
}

#[test]
fn the_optimistic_policy_resizes_and_preempts_nothing() {
    let mut s = Scenario::new(ForecasterKind::Gp, PreemptionPolicy::Optimistic);
    let request = Resources::new(1000, 2048);
    for key in 1..=4 {
        s.g.submit(ask(key, "a", request, ComponentRole::Elastic, true))
            .unwrap();
    }
    assert_eq!(s.place().len(), 4);
    let mut rng = StdRng::seed_from_u64(5);
    for _ in 0..20 {
        let out = s.minute(|_| noisy(&mut rng, request, 0.5));
        assert!(out.preempted.is_empty());
    }
    assert!(s.node_guaranteed().cpu_millis < 4000);
}

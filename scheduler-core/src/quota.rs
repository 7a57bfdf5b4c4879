//! Per-application quotas on QUEUEABLE containers (Mercury §4.1): an absolute cap on outstanding
//! QUEUEABLE containers and a cap relative to the app's GUARANTEED containers. The tracker keeps
//! exact counts from grant, start, finish and expiry notices, keyed by container id so that a
//! duplicated or late notice can never push a count below zero (cf. YARN-10760).
//!
//! Quotas hold cluster-wide: every issuer reports its own counts per app with its heartbeats
//! ([`QuotaTracker::outstanding_by_app`]), the coordinator sums them once per round and tells
//! each issuer what the others hold ([`QuotaTracker::set_elsewhere`]), and admission counts both.
//! The others' counts are at most one round old, so the cluster can exceed a quota only by what
//! other issuers grant within one heartbeat round (each issuer alone never exceeds it).

use crate::{AppId, ContainerId, ContainerType};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Operator-set limits for one application. `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueableQuota {
    /// At most this many outstanding QUEUEABLE containers (e.g. 100).
    pub max_queueable: Option<u32>,
    /// At most this many QUEUEABLE containers per GUARANTEED one the app holds (e.g. 2.0).
    pub max_queueable_per_guaranteed: Option<f64>,
}

#[derive(Clone, Debug, Default)]
struct AppCounts {
    queueable: u32,
    guaranteed: u32,
}

#[derive(Clone, Debug)]
struct Tracked {
    app: AppId,
    container_type: ContainerType,
    /// Grant expiry (ms) until the node confirms the start; `None` once started.
    pending_until_ms: Option<u64>,
}

/// One app's outstanding containers as counted by one issuer, or by all others (wire form).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppOutstanding {
    pub app_id: AppId,
    pub queueable: u32,
    pub guaranteed: u32,
}

/// Outstanding-container counts per app, as seen by one issuer.
#[derive(Clone, Debug, Default)]
pub struct QuotaTracker {
    counts: HashMap<AppId, AppCounts>,
    /// What the other issuers of the cluster hold, per app, as of the coordinator's last round.
    elsewhere: HashMap<AppId, AppCounts>,
    containers: HashMap<ContainerId, Tracked>,
    pending_by_expiry: BTreeMap<u64, Vec<ContainerId>>,
}

impl QuotaTracker {
    pub fn new() -> QuotaTracker {
        QuotaTracker::default()
    }

    /// How many of `wanted` more QUEUEABLE containers `app` may get under `quota` now.
    pub fn admissible(&self, app: &AppId, quota: &QueueableQuota, wanted: u32) -> u32 {
        let mut c = self.counts.get(app).cloned().unwrap_or_default();
        if let Some(e) = self.elsewhere.get(app) {
            c.queueable = c.queueable.saturating_add(e.queueable);
            c.guaranteed = c.guaranteed.saturating_add(e.guaranteed);
        }
        let mut allowed = wanted;
        if let Some(max) = quota.max_queueable {
            allowed = allowed.min(max.saturating_sub(c.queueable));
        }
        if let Some(ratio) = quota.max_queueable_per_guaranteed {
            let cap = (ratio.max(0.0) * c.guaranteed as f64).floor() as u32;
            allowed = allowed.min(cap.saturating_sub(c.queueable));
        }
        allowed
    }

    /// This issuer's own counts, per app with anything outstanding, in app order (reported to
    /// the coordinator with each heartbeat; bounded by the app registry).
    pub fn outstanding_by_app(&self) -> Vec<AppOutstanding> {
        let mut out: Vec<AppOutstanding> = self
            .counts
            .iter()
            .filter(|(_, c)| c.queueable > 0 || c.guaranteed > 0)
            .map(|(app, c)| AppOutstanding {
                app_id: app.clone(),
                queueable: c.queueable,
                guaranteed: c.guaranteed,
            })
            .collect();
        out.sort_by(|a, b| a.app_id.cmp(&b.app_id));
        out
    }

    /// What the other issuers hold (from the coordinator), replacing the previous report.
    pub fn set_elsewhere(&mut self, elsewhere: Vec<AppOutstanding>) {
        self.elsewhere = elsewhere
            .into_iter()
            .map(|a| {
                (
                    a.app_id,
                    AppCounts {
                        queueable: a.queueable,
                        guaranteed: a.guaranteed,
                    },
                )
            })
            .collect();
    }

    pub fn outstanding(&self, app: &AppId, container_type: ContainerType) -> u32 {
        self.counts.get(app).map_or(0, |c| match container_type {
            ContainerType::Queueable => c.queueable,
            ContainerType::Guaranteed => c.guaranteed,
        })
    }

    fn bump(&mut self, app: &AppId, t: ContainerType, up: bool) {
        let c = self.counts.entry(app.clone()).or_default();
        let slot = match t {
            ContainerType::Queueable => &mut c.queueable,
            ContainerType::Guaranteed => &mut c.guaranteed,
        };
        *slot = if up {
            *slot + 1
        } else {
            slot.saturating_sub(1)
        };
    }

    /// A container was granted; it counts until it finishes or its unstarted grant expires.
    pub fn on_granted(
        &mut self,
        id: ContainerId,
        app: &AppId,
        t: ContainerType,
        expires_at_ms: u64,
    ) {
        if self.containers.contains_key(&id) {
            return;
        }
        self.bump(app, t, true);
        self.containers.insert(
            id,
            Tracked {
                app: app.clone(),
                container_type: t,
                pending_until_ms: Some(expires_at_ms),
            },
        );
        self.pending_by_expiry
            .entry(expires_at_ms)
            .or_default()
            .push(id);
    }

    /// The hosting node accepted the container (it no longer expires).
    pub fn on_started(&mut self, id: ContainerId) {
        if let Some(t) = self.containers.get_mut(&id) {
            t.pending_until_ms = None;
        }
    }

    /// The container finished, was killed or released. Returns its app if it was tracked.
    pub fn on_finished(&mut self, id: ContainerId) -> Option<(AppId, ContainerType)> {
        let t = self.containers.remove(&id)?;
        self.bump(&t.app, t.container_type, false);
        Some((t.app, t.container_type))
    }

    /// A QUEUEABLE container became GUARANTEED.
    pub fn on_promoted(&mut self, id: ContainerId) {
        let Some(t) = self.containers.get(&id) else {
            return;
        };
        if t.container_type == ContainerType::Guaranteed {
            return;
        }
        let app = t.app.clone();
        self.bump(&app, ContainerType::Queueable, false);
        self.bump(&app, ContainerType::Guaranteed, true);
        if let Some(t) = self.containers.get_mut(&id) {
            t.container_type = ContainerType::Guaranteed;
        }
    }

    /// Drop grants never started before their token expired. Returns them.
    pub fn expire(&mut self, now_ms: u64) -> Vec<ContainerId> {
        let mut gone = Vec::new();
        while let Some(entry) = self.pending_by_expiry.first_entry() {
            if *entry.key() > now_ms {
                break;
            }
            for id in entry.remove() {
                if self
                    .containers
                    .get(&id)
                    .is_some_and(|t| t.pending_until_ms.is_some())
                {
                    self.on_finished(id);
                    gone.push(id);
                }
            }
        }
        gone
    }

    /// Whether a tracked container was granted but no node has reported it yet.
    pub fn is_unstarted(&self, id: ContainerId) -> bool {
        self.containers
            .get(&id)
            .is_some_and(|t| t.pending_until_ms.is_some())
    }

    /// The app owning a tracked container.
    pub fn owner(&self, id: ContainerId) -> Option<&AppId> {
        self.containers.get(&id).map(|t| &t.app)
    }

    pub fn tracked(&self) -> usize {
        self.containers.len()
    }

    /// Counts equal the tracked containers (test invariant).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut recount: HashMap<&AppId, (u32, u32)> = HashMap::new();
        for t in self.containers.values() {
            let e = recount.entry(&t.app).or_default();
            match t.container_type {
                ContainerType::Queueable => e.0 += 1,
                ContainerType::Guaranteed => e.1 += 1,
            }
        }
        for (app, c) in &self.counts {
            let (q, g) = recount.get(app).copied().unwrap_or_default();
            if (q, g) != (c.queueable, c.guaranteed) {
                return Err(format!(
                    "app {app}: counted ({}, {}) but tracking ({q}, {g})",
                    c.queueable, c.guaranteed
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_and_relative_limits() {
        let app = AppId::from("a");
        let mut t = QuotaTracker::new();
        let abs = QueueableQuota {
            max_queueable: Some(3),
            max_queueable_per_guaranteed: None,
        };
        assert_eq!(t.admissible(&app, &abs, 10), 3);
        for i in 0..2 {
            t.on_granted(ContainerId::new(1, i), &app, ContainerType::Queueable, 100);
        }
        assert_eq!(t.admissible(&app, &abs, 10), 1);
        let rel = QueueableQuota {
            max_queueable: None,
            max_queueable_per_guaranteed: Some(2.0),
        };
        assert_eq!(
            t.admissible(&app, &rel, 10),
            0,
            "no guaranteed containers yet"
        );
        t.on_granted(ContainerId::new(0, 1), &app, ContainerType::Guaranteed, 100);
        t.on_granted(ContainerId::new(0, 2), &app, ContainerType::Guaranteed, 100);
        assert_eq!(
            t.admissible(&app, &rel, 10),
            2,
            "2 x 2 guaranteed - 2 queueable outstanding"
        );
        t.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_and_late_notices_never_go_negative() {
        let app = AppId::from("a");
        let mut t = QuotaTracker::new();
        let id = ContainerId::new(1, 1);
        t.on_granted(id, &app, ContainerType::Queueable, 100);
        t.on_granted(id, &app, ContainerType::Queueable, 100);
        assert_eq!(t.outstanding(&app, ContainerType::Queueable), 1);
        t.on_finished(id);
        t.on_finished(id);
        assert_eq!(t.outstanding(&app, ContainerType::Queueable), 0);
        t.check_invariants().unwrap();
    }

    #[test]
    fn unstarted_grants_expire_started_ones_do_not() {
        let app = AppId::from("a");
        let mut t = QuotaTracker::new();
        t.on_granted(ContainerId::new(1, 1), &app, ContainerType::Queueable, 100);
        t.on_granted(ContainerId::new(1, 2), &app, ContainerType::Queueable, 100);
        t.on_started(ContainerId::new(1, 2));
        assert_eq!(t.expire(100), vec![ContainerId::new(1, 1)]);
        assert_eq!(t.outstanding(&app, ContainerType::Queueable), 1);
        t.on_promoted(ContainerId::new(1, 2));
        assert_eq!(t.outstanding(&app, ContainerType::Guaranteed), 1);
        assert_eq!(t.outstanding(&app, ContainerType::Queueable), 0);
        t.check_invariants().unwrap();
    }

    #[test]
    fn other_issuers_counts_take_their_share_of_the_quota() {
        let app = AppId::from("a");
        let quota = QueueableQuota {
            max_queueable: Some(5),
            max_queueable_per_guaranteed: None,
        };
        let mut here = QuotaTracker::new();
        here.on_granted(ContainerId::new(1, 1), &app, ContainerType::Queueable, 100);
        assert_eq!(here.admissible(&app, &quota, 10), 4);
        assert_eq!(
            here.outstanding_by_app(),
            vec![AppOutstanding {
                app_id: app.clone(),
                queueable: 1,
                guaranteed: 0
            }]
        );
        // Other workers hold 3 of the app's QUEUEABLE containers: one more fits here.
        here.set_elsewhere(vec![AppOutstanding {
            app_id: app.clone(),
            queueable: 3,
            guaranteed: 0,
        }]);
        assert_eq!(here.admissible(&app, &quota, 10), 1);
        // GUARANTEED containers elsewhere count for the relative cap too.
        let relative = QueueableQuota {
            max_queueable: None,
            max_queueable_per_guaranteed: Some(1.0),
        };
        assert_eq!(here.admissible(&app, &relative, 10), 0);
        here.set_elsewhere(vec![AppOutstanding {
            app_id: app.clone(),
            queueable: 0,
            guaranteed: 4,
        }]);
        assert_eq!(here.admissible(&app, &relative, 10), 3);
        // Own counts only are reported, and nothing for apps with nothing outstanding.
        here.on_finished(ContainerId::new(1, 1));
        assert!(here.outstanding_by_app().is_empty());
    }
}

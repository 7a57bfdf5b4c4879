//! Per-application quotas on QUEUEABLE containers (Mercury §4.1): an absolute cap on outstanding
//! QUEUEABLE containers and a cap relative to the app's GUARANTEED containers. The tracker keeps
//! exact counts from grant, start, finish and expiry notices, keyed by container id so that a
//! duplicated or late notice can never push a count below zero (cf. YARN-10760).

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

/// Outstanding-container counts per app, as seen by one issuer.
#[derive(Clone, Debug, Default)]
pub struct QuotaTracker {
    counts: HashMap<AppId, AppCounts>,
    containers: HashMap<ContainerId, Tracked>,
    pending_by_expiry: BTreeMap<u64, Vec<ContainerId>>,
}

impl QuotaTracker {
    pub fn new() -> QuotaTracker {
        QuotaTracker::default()
    }

    /// How many of `wanted` more QUEUEABLE containers `app` may get under `quota` now.
    pub fn admissible(&self, app: &AppId, quota: &QueueableQuota, wanted: u32) -> u32 {
        let c = self.counts.get(app).cloned().unwrap_or_default();
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
}

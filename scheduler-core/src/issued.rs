//! What a worker's scheduler knows of the containers it granted (QUEUEABLE) or obtained for its
//! apps (GUARANTEED), and the rules it applies to them as notices and views arrive. Sans-IO: the
//! scheduler actor routes the [`IssuedAction`]s (an event to the app, a release to the
//! coordinator); the simulator can run the same rules.
//!
//! Rules:
//! - Every container is tracked by the node it was granted on until a node reports it finished,
//!   its node leaves the directory, or its grant expires unstarted.
//! - When a node leaves the directory (declared lost), every container issued on it is lost, even
//!   those the node never reported before it died: the app is told once ([`IssuedAction::Lost`]).
//! - A grant the app released before any node reported it is remembered until its token
//!   expires; if a node reports it started after all (the release raced the start), it is
//!   stopped then ([`IssuedAction::Stop`]).
//! - An app that asks again for QUEUEABLE containers a node shed names them
//!   ([`crate::protocol::app::Allocate::replaces_shed`]): each node that shed a container this
//!   scheduler granted there to that app is avoided until the next view
//!   ([`IssuedContainers::avoid_nodes_that_shed`]), as the simulator's schedulers avoid a node
//!   the moment it sheds their work.

use crate::coordinator::{ContainerNotice, NoticeKind};
use crate::distributed::DistributedScheduler;
use crate::protocol::app::ShedContainer;
use crate::quota::QuotaTracker;
use crate::{AppId, ContainerId, NodeId};
use std::collections::{HashMap, HashSet};

/// What the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssuedAction {
    /// Tell `app` its container died with `node` (`killed`, reason `lost`).
    Lost {
        app: AppId,
        container_id: ContainerId,
        node: NodeId,
    },
    /// The app released this container before it started; it started after all: stop it.
    Stop {
        app: AppId,
        container_id: ContainerId,
    },
}

/// Containers this scheduler issued, by node, and releases that raced their start.
#[derive(Clone, Debug, Default)]
pub struct IssuedContainers {
    by_node: HashMap<NodeId, HashSet<ContainerId>>,
    /// Released before any node reported them: app and token expiry (ms).
    released_unstarted: HashMap<ContainerId, (AppId, u64)>,
    /// Of the containers in `by_node`, those that re-place returned work: how many times it has
    /// been returned ([`crate::token::TokenBody::times_returned`]), so that a re-ask naming one
    /// counts on from it.
    times_returned: HashMap<ContainerId, u8>,
}

impl IssuedContainers {
    /// A container was granted on `node` (its quota entry is the caller's `on_granted`);
    /// `times_returned` as in its token.
    pub fn issued(&mut self, node: &NodeId, id: ContainerId, times_returned: u8) {
        self.by_node.entry(node.clone()).or_default().insert(id);
        if times_returned > 0 {
            self.times_returned.insert(id, times_returned);
        }
    }

    /// For an ask of `count` containers by `app` naming `shed` as the containers it asks for
    /// again: how many times each one's work has now been returned, for
    /// [`crate::distributed::QueueableAsk::replacements`]. A container this scheduler granted to
    /// `app` and still tracks counts on from its own token's count; any other (granted
    /// elsewhere, or its end already heard of) counts as returned once, so an application
    /// cannot lower the count of work this scheduler knows of.
    pub fn replacement_counts(
        &self,
        quotas: &QuotaTracker,
        app: &AppId,
        shed: &[ShedContainer],
        count: u32,
    ) -> Vec<u8> {
        shed.iter()
            .take(count as usize)
            .map(|s| {
                let ours = self
                    .by_node
                    .get(&s.node_id)
                    .is_some_and(|set| set.contains(&s.container_id))
                    && quotas.owner(s.container_id) == Some(app);
                let before = if ours {
                    self.times_returned
                        .get(&s.container_id)
                        .copied()
                        .unwrap_or(0)
                } else {
                    0
                };
                before.saturating_add(1)
            })
            .collect()
    }

    /// How many containers are tracked (bounded: each leaves when it finishes, its node goes,
    /// or its grant expires).
    pub fn len(&self) -> usize {
        self.by_node.values().map(HashSet::len).sum::<usize>() + self.released_unstarted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The app released `id` before any node reported it: if it is an unstarted grant of that
    /// app, forget it (its quota frees) and remember the release until its token expires.
    /// Returns whether it was such a grant.
    pub fn release_unstarted(
        &mut self,
        quotas: &mut QuotaTracker,
        id: ContainerId,
        app: &AppId,
        expires_at_ms: u64,
    ) -> bool {
        if quotas.owner(id) != Some(app) || !quotas.is_unstarted(id) {
            return false;
        }
        quotas.on_finished(id);
        self.released_unstarted
            .insert(id, (app.clone(), expires_at_ms));
        true
    }

    /// A notice from the coordinator about a container this scheduler issued.
    pub fn on_notice(
        &mut self,
        quotas: &mut QuotaTracker,
        n: &ContainerNotice,
    ) -> Option<IssuedAction> {
        match n.kind {
            NoticeKind::Started => match self.released_unstarted.remove(&n.container_id) {
                Some((app, _)) => Some(IssuedAction::Stop {
                    app,
                    container_id: n.container_id,
                }),
                None => {
                    quotas.on_started(n.container_id);
                    None
                }
            },
            NoticeKind::Finished => {
                self.forget(quotas, n.container_id, &n.node_id);
                None
            }
            NoticeKind::Lost => self.lost(quotas, n.container_id, &n.node_id),
        }
    }

    /// Nodes that left (a delta's departures, cluster protocol 9's partial directories): what
    /// was issued on them is lost, as [`IssuedContainers::on_directory`] does for the nodes a
    /// whole directory no longer holds.
    pub fn on_nodes_left(
        &mut self,
        quotas: &mut QuotaTracker,
        left: &[NodeId],
    ) -> Vec<IssuedAction> {
        let mut out = Vec::new();
        let mut left: Vec<&NodeId> = left.iter().collect();
        left.sort();
        left.dedup();
        for node in left {
            let mut ids: Vec<ContainerId> = self
                .by_node
                .remove(node)
                .unwrap_or_default()
                .into_iter()
                .collect();
            ids.sort_unstable();
            out.extend(ids.into_iter().filter_map(|id| self.lost(quotas, id, node)));
        }
        out
    }

    /// The directory changed: containers issued on nodes no longer in it are lost.
    pub fn on_directory<'a>(
        &mut self,
        quotas: &mut QuotaTracker,
        present: impl IntoIterator<Item = &'a NodeId>,
    ) -> Vec<IssuedAction> {
        let present: HashSet<&NodeId> = present.into_iter().collect();
        let gone: Vec<NodeId> = self
            .by_node
            .keys()
            .filter(|n| !present.contains(n))
            .cloned()
            .collect();
        self.on_nodes_left(quotas, &gone)
    }

    /// `app` asks again for containers that nodes shed (Mercury §4.3: a shed returns a poorly
    /// placed QUEUEABLE container to its job manager, which asks again): each named node that
    /// holds, by this scheduler's record, a container it granted to `app` there is avoided by
    /// `scheduler` until its next view ([`DistributedScheduler::avoid_until_next_view`]), so the
    /// re-ask does not go back to it on the same stale estimate. The node's worker learns of the
    /// shed at once; this scheduler, on another worker, only with the coordinator's notice a
    /// heartbeat later, and that notice comes with a newer view. So a container no longer in the
    /// record (its `finished` notice arrived, with a view newer than the shed) avoids nothing,
    /// nor does a container of another app or scheduler. Returns how many nodes are now avoided.
    pub fn avoid_nodes_that_shed(
        &self,
        scheduler: &mut DistributedScheduler,
        app: &AppId,
        shed: &[ShedContainer],
    ) -> usize {
        let mut avoided = 0;
        for s in shed {
            let ours = self
                .by_node
                .get(&s.node_id)
                .is_some_and(|set| set.contains(&s.container_id))
                && scheduler.quotas().owner(s.container_id) == Some(app);
            if ours
                && !scheduler.is_avoided(&s.node_id)
                && scheduler.avoid_until_next_view(&s.node_id)
            {
                avoided += 1;
            }
        }
        avoided
    }

    /// Drop what expired: remembered releases past their token's expiry, and unstarted grants
    /// whose token expired (the quota tracker decides which).
    pub fn expire(&mut self, quotas: &mut QuotaTracker, now_ms: u64) {
        // A release remembered past its token's expiry is forgotten with the grant's entries:
        // no node can start it any more (its quota entry went with the release).
        let mut expired = Vec::new();
        self.released_unstarted.retain(|id, (_, expires_at_ms)| {
            let keep = *expires_at_ms > now_ms;
            if !keep {
                expired.push(*id);
            }
            keep
        });
        expired.extend(quotas.expire(now_ms));
        if !expired.is_empty() {
            for set in self.by_node.values_mut() {
                for id in &expired {
                    set.remove(id);
                }
            }
            for id in &expired {
                self.times_returned.remove(id);
            }
            self.by_node.retain(|_, set| !set.is_empty());
        }
    }

    fn forget(
        &mut self,
        quotas: &mut QuotaTracker,
        id: ContainerId,
        node: &NodeId,
    ) -> Option<AppId> {
        if let Some(set) = self.by_node.get_mut(node) {
            set.remove(&id);
            if set.is_empty() {
                self.by_node.remove(node);
            }
        }
        self.times_returned.remove(&id);
        quotas.on_finished(id).map(|(app, _)| app)
    }

    /// Tell the app (once) that its container died with its node.
    fn lost(
        &mut self,
        quotas: &mut QuotaTracker,
        id: ContainerId,
        node: &NodeId,
    ) -> Option<IssuedAction> {
        self.forget(quotas, id, node).map(|app| IssuedAction::Lost {
            app,
            container_id: id,
            node: node.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ContainerType;

    fn notice(id: ContainerId, node: &str, kind: NoticeKind) -> ContainerNotice {
        ContainerNotice {
            container_id: id,
            node_id: NodeId::from(node),
            kind,
        }
    }

    fn grant(
        issued: &mut IssuedContainers,
        quotas: &mut QuotaTracker,
        node: &str,
        seq: u64,
        expires_at_ms: u64,
    ) -> ContainerId {
        let id = ContainerId::new(3, seq);
        quotas.on_granted(
            id,
            &AppId::from("app"),
            ContainerType::Queueable,
            expires_at_ms,
        );
        issued.issued(&NodeId::from(node), id, 0);
        id
    }

    #[test]
    fn a_node_leaving_the_directory_loses_everything_issued_on_it_once() {
        let (mut issued, mut quotas) = (IssuedContainers::default(), QuotaTracker::new());
        let started = grant(&mut issued, &mut quotas, "b", 1, 10_000);
        let never_reported = grant(&mut issued, &mut quotas, "b", 2, 10_000);
        let elsewhere = grant(&mut issued, &mut quotas, "a", 3, 10_000);
        assert_eq!(
            issued.on_notice(&mut quotas, &notice(started, "b", NoticeKind::Started)),
            None
        );
        let a = NodeId::from("a");
        let lost = issued.on_directory(&mut quotas, [&a]);
        assert_eq!(
            lost,
            vec![
                IssuedAction::Lost {
                    app: AppId::from("app"),
                    container_id: started,
                    node: NodeId::from("b")
                },
                IssuedAction::Lost {
                    app: AppId::from("app"),
                    container_id: never_reported,
                    node: NodeId::from("b")
                },
            ]
        );
        // The coordinator's own `lost` notice afterwards does not tell the app twice.
        assert_eq!(
            issued.on_notice(&mut quotas, &notice(started, "b", NoticeKind::Lost)),
            None
        );
        assert_eq!(issued.len(), 1);
        assert_eq!(quotas.owner(elsewhere), Some(&AppId::from("app")));
        assert_eq!(quotas.owner(started), None, "quota freed");
        quotas.check_invariants().unwrap();
    }

    #[test]
    fn a_release_that_raced_the_start_stops_the_container_when_it_is_reported() {
        let (mut issued, mut quotas) = (IssuedContainers::default(), QuotaTracker::new());
        let id = grant(&mut issued, &mut quotas, "b", 1, 10_000);
        assert!(!issued.release_unstarted(&mut quotas, id, &AppId::from("other"), 10_000));
        assert!(issued.release_unstarted(&mut quotas, id, &AppId::from("app"), 10_000));
        assert_eq!(quotas.owner(id), None, "its quota is free at once");
        assert_eq!(
            issued.on_notice(&mut quotas, &notice(id, "b", NoticeKind::Started)),
            Some(IssuedAction::Stop {
                app: AppId::from("app"),
                container_id: id
            })
        );
        // Remembered only until its token expires.
        let late = grant(&mut issued, &mut quotas, "b", 2, 5_000);
        assert!(issued.release_unstarted(&mut quotas, late, &AppId::from("app"), 5_000));
        issued.expire(&mut quotas, 5_000);
        assert_eq!(
            issued.on_notice(&mut quotas, &notice(late, "b", NoticeKind::Started)),
            None
        );
        // The expired release left nothing behind: only the started one is still tracked.
        assert_eq!(issued.len(), 1, "{issued:?}");
        quotas.check_invariants().unwrap();
    }

    #[test]
    fn finished_and_expired_containers_are_forgotten() {
        let (mut issued, mut quotas) = (IssuedContainers::default(), QuotaTracker::new());
        let done = grant(&mut issued, &mut quotas, "a", 1, 10_000);
        let unstarted = grant(&mut issued, &mut quotas, "a", 2, 5_000);
        issued.on_notice(&mut quotas, &notice(done, "a", NoticeKind::Started));
        issued.on_notice(&mut quotas, &notice(done, "a", NoticeKind::Finished));
        issued.expire(&mut quotas, 5_000);
        assert!(issued.is_empty(), "{issued:?}");
        assert_eq!(quotas.owner(unstarted), None);
        quotas.check_invariants().unwrap();
    }

    /// A re-ask counts the returns on from the granting scheduler's own record; containers it
    /// does not hold for that app (another app's, unknown, already finished) count as returned
    /// once, and the record of a count goes with its container.
    #[test]
    fn a_re_ask_counts_returns_on_from_the_record_of_the_named_container() {
        let (mut issued, mut quotas) = (IssuedContainers::default(), QuotaTracker::new());
        let app = AppId::from("app");
        let named = |id: ContainerId, node: &str| ShedContainer {
            container_id: id,
            node_id: NodeId::from(node),
        };
        let first = grant(&mut issued, &mut quotas, "a", 1, 10_000);
        assert_eq!(
            issued.replacement_counts(&quotas, &app, &[named(first, "a")], 1),
            vec![1]
        );
        // Its re-placement, granted on b with that count, is named in turn.
        let second = ContainerId::new(3, 2);
        quotas.on_granted(second, &app, ContainerType::Queueable, 10_000);
        issued.issued(&NodeId::from("b"), second, 1);
        let unknown = ContainerId::new(9, 9);
        assert_eq!(
            issued.replacement_counts(
                &quotas,
                &app,
                &[named(second, "b"), named(second, "a"), named(unknown, "b")],
                3
            ),
            vec![2, 1, 1],
            "counted on only for the node the record holds it on"
        );
        assert_eq!(
            issued.replacement_counts(&quotas, &AppId::from("other"), &[named(second, "b")], 1),
            vec![1],
            "another app's container counts once"
        );
        assert_eq!(
            issued
                .replacement_counts(&quotas, &app, &[named(second, "b"), named(first, "a")], 1)
                .len(),
            1,
            "no more counts than containers asked for"
        );
        issued.on_notice(&mut quotas, &notice(second, "b", NoticeKind::Finished));
        assert_eq!(
            issued.replacement_counts(&quotas, &app, &[named(second, "b")], 1),
            vec![1]
        );
        assert!(issued.times_returned.is_empty(), "{issued:?}");
        // Saturates rather than wraps.
        let worn = ContainerId::new(3, 3);
        quotas.on_granted(worn, &app, ContainerType::Queueable, 10_000);
        issued.issued(&NodeId::from("b"), worn, u8::MAX);
        assert_eq!(
            issued.replacement_counts(&quotas, &app, &[named(worn, "b")], 1),
            vec![u8::MAX]
        );
    }
}

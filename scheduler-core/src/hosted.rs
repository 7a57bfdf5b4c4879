//! Where each container runs, as the nodes last reported, and where a release goes (Mercury
//! §3.4: an application may release a container through any worker; the coordinator stops it at
//! its node). Sans-IO: the coordinator actor feeds it joins and heartbeats and carries out the
//! [`ReleaseRoute`] it returns.
//!
//! Rules:
//! - A node's report replaces what it reported before; a node that leaves takes its containers
//!   with it. Finding a container's host is O(1) (an index over the reports), so a release or a
//!   promotion never scans the cluster.
//! - A release of a container a node reports goes to that node, and only for the app that owns
//!   it. A release of an id no node reports is a GUARANTEED grant not started yet if the id is
//!   the guarantor's (issuer 0): the guarantor frees it and its node revokes the token.
//!   Otherwise it is unknown: a QUEUEABLE grant not started yet is its issuer's to release.

use crate::node::ContainerStatus;
use crate::{ContainerId, ContainerType, NodeId};
use std::collections::HashMap;

/// Where a release goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseRoute {
    /// Stop it at this node.
    StopOnHost(NodeId),
    /// A node reports it, but it belongs to another app: refused.
    NotTheAppsContainer,
    /// No node reports it and the guarantor issued it: a GUARANTEED grant not started yet.
    UnstartedGuaranteedGrant,
    /// No node reports it and the guarantor did not issue it.
    Unknown,
}

/// Above this many containers in a report, [`HostedContainers::report`] hashes the report's
/// ids to find the ones gone, instead of scanning it for each.
const SCAN_LIMIT: usize = 32;

/// The containers each node last reported, with an index from container to host.
#[derive(Clone, Debug, Default)]
pub struct HostedContainers {
    by_node: HashMap<NodeId, Vec<ContainerStatus>>,
    host: HashMap<ContainerId, NodeId>,
}

impl HostedContainers {
    /// `node` holds `containers` now (its join or latest heartbeat): O(its containers).
    pub fn report(&mut self, node: &NodeId, containers: Vec<ContainerStatus>) {
        // Called for every heartbeat: only what changed since the node's last report touches
        // the index (a heartbeat mostly repeats it), so no node id is cloned per container.
        for c in &containers {
            if self.host.get(&c.id) != Some(node) {
                self.host.insert(c.id, node.clone());
            }
        }
        let Some(before) = self.by_node.get_mut(node) else {
            self.by_node.insert(node.clone(), containers);
            return;
        };
        let old = std::mem::replace(before, containers);
        let now = &*before;
        // A few containers per node: a scan beats hashing them.
        let index: Option<std::collections::HashSet<ContainerId>> =
            (now.len() > SCAN_LIMIT).then(|| now.iter().map(|c| c.id).collect());
        let still_here = |id: ContainerId| match &index {
            Some(ids) => ids.contains(&id),
            None => now.iter().any(|c| c.id == id),
        };
        for c in &old {
            if !still_here(c.id) && self.host.get(&c.id) == Some(node) {
                self.host.remove(&c.id);
            }
        }
    }

    /// `node` left (lost or replaced): its containers are no longer anywhere.
    pub fn forget_node(&mut self, node: &NodeId) {
        for c in self.by_node.remove(node).unwrap_or_default() {
            if self.host.get(&c.id) == Some(node) {
                self.host.remove(&c.id);
            }
        }
    }

    /// What `node` last reported holding (empty for an unknown node).
    pub fn on_node(&self, node: &NodeId) -> &[ContainerStatus] {
        self.by_node.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The node reporting `id`, and its status there.
    pub fn host_of(&self, id: ContainerId) -> Option<(&NodeId, &ContainerStatus)> {
        let node = self.host.get(&id)?;
        let status = self.by_node.get(node)?.iter().find(|c| c.id == id)?;
        Some((node, status))
    }

    /// A promotion succeeded: until the node's next report, the container is GUARANTEED at
    /// `version` here too.
    pub fn promoted(&mut self, node: &NodeId, id: ContainerId, version: u32) {
        if let Some(c) = self
            .by_node
            .get_mut(node)
            .and_then(|cs| cs.iter_mut().find(|c| c.id == id))
        {
            c.container_type = ContainerType::Guaranteed;
            c.version = version;
        }
    }

    /// Where `app`'s release of `id` goes.
    pub fn route_release(&self, id: ContainerId, app: &str) -> ReleaseRoute {
        match self.host_of(id) {
            Some((_, status)) if status.app_id.as_str() != app => ReleaseRoute::NotTheAppsContainer,
            Some((node, _)) => ReleaseRoute::StopOnHost(node.clone()),
            None if id.issuer() == 0 => ReleaseRoute::UnstartedGuaranteedGrant,
            None => ReleaseRoute::Unknown,
        }
    }

    /// Containers reported by all nodes.
    pub fn len(&self) -> usize {
        self.host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.host.is_empty()
    }

    /// The index matches the reports: every reported container is indexed to its node, and
    /// nothing else is.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reported = 0;
        for (node, cs) in &self.by_node {
            for c in cs {
                reported += 1;
                match self.host.get(&c.id) {
                    Some(n) if n == node => {}
                    // A container two nodes report (a promotion's race) is indexed to the
                    // later report; it still counts once.
                    Some(_) => reported -= 1,
                    None => return Err(format!("{} reported by {node} is not indexed", c.id)),
                }
            }
        }
        if reported != self.host.len() {
            return Err(format!(
                "{} containers indexed, {reported} reported",
                self.host.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Placement;
    use crate::{AppId, Resources};

    fn status(id: ContainerId, app: &str, t: ContainerType) -> ContainerStatus {
        ContainerStatus {
            usage: None,
            id,
            app_id: AppId::from(app),
            container_type: t,
            resources: Resources::new(100, 64),
            placement: Placement::Running,
            version: 0,
            job: None,
            grant_token: None,
        }
    }

    #[test]
    fn releases_go_to_the_reporting_node_for_the_owning_app_only() {
        let mut h = HostedContainers::default();
        let (a, b) = (NodeId::from("a"), NodeId::from("b"));
        let q = ContainerId::new(3, 1);
        let g = ContainerId::new(0, 9);
        h.report(&a, vec![status(q, "demo", ContainerType::Queueable)]);
        h.check_invariants().unwrap();
        assert_eq!(
            h.route_release(q, "demo"),
            ReleaseRoute::StopOnHost(a.clone())
        );
        assert_eq!(
            h.route_release(q, "mallory"),
            ReleaseRoute::NotTheAppsContainer
        );
        // Not reported anywhere: the guarantor's ids are unstarted grants, others unknown.
        assert_eq!(
            h.route_release(g, "demo"),
            ReleaseRoute::UnstartedGuaranteedGrant
        );
        assert_eq!(
            h.route_release(ContainerId::new(3, 2), "demo"),
            ReleaseRoute::Unknown
        );
        // Once b reports g started, its release stops it there.
        h.report(&b, vec![status(g, "demo", ContainerType::Guaranteed)]);
        h.check_invariants().unwrap();
        assert_eq!(
            h.route_release(g, "demo"),
            ReleaseRoute::StopOnHost(b.clone())
        );
        // A new report replaces the old; a node that leaves takes its containers.
        h.report(&a, vec![]);
        h.check_invariants().unwrap();
        assert_eq!(h.route_release(q, "demo"), ReleaseRoute::Unknown);
        h.forget_node(&b);
        h.check_invariants().unwrap();
        assert_eq!(
            h.route_release(g, "demo"),
            ReleaseRoute::UnstartedGuaranteedGrant
        );
        assert!(h.is_empty());
    }

    #[test]
    fn a_promotion_shows_until_the_next_report_and_the_index_follows_every_step() {
        let mut h = HostedContainers::default();
        let a = NodeId::from("a");
        let b = NodeId::from("b");
        let q = ContainerId::new(3, 1);
        h.report(&a, vec![status(q, "demo", ContainerType::Queueable)]);
        h.promoted(&a, q, 1);
        let (_, s) = h.host_of(q).unwrap();
        assert_eq!(
            (s.container_type, s.version),
            (ContainerType::Guaranteed, 1)
        );
        // A node that reports a container another node reported (a re-join elsewhere is not
        // possible, but reports may cross): the later report owns the index, and forgetting
        // the earlier node does not unindex it.
        h.report(&b, vec![status(q, "demo", ContainerType::Queueable)]);
        h.check_invariants().unwrap();
        h.forget_node(&a);
        h.check_invariants().unwrap();
        assert_eq!(h.host_of(q).unwrap().0, &b);
        assert_eq!(h.len(), 1);
    }

    /// Reports that keep some containers, drop some and add some (as heartbeats do), small and
    /// over the scan limit: the index follows each exactly.
    #[test]
    fn successive_reports_keep_the_index_exact() {
        for size in [4u64, 3 * SCAN_LIMIT as u64] {
            let mut h = HostedContainers::default();
            let (a, b) = (NodeId::from("a"), NodeId::from("b"));
            let report = |from: u64| -> Vec<ContainerStatus> {
                (from..from + size)
                    .map(|i| status(ContainerId::new(3, i), "demo", ContainerType::Queueable))
                    .collect()
            };
            h.report(&b, report(1000));
            for round in 0..5 {
                // Each round drops the lowest two ids and adds two new ones.
                h.report(&a, report(round * 2));
                h.check_invariants().unwrap();
                assert_eq!(h.len(), 2 * size as usize);
                for i in 0..round * 2 {
                    assert!(h.host_of(ContainerId::new(3, i)).is_none(), "{i} gone");
                }
                for i in round * 2..round * 2 + size {
                    assert_eq!(h.host_of(ContainerId::new(3, i)).unwrap().0, &a);
                }
            }
            h.report(&a, Vec::new());
            h.check_invariants().unwrap();
            assert_eq!(h.len(), size as usize, "b's containers stay");
        }
    }
}

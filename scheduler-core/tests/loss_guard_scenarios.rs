//! The coordinator's silence checks through the loss guard (scheduler_core::loss_guard): a
//! coordinator that was not listening does not blame its nodes, and most of the cluster going
//! silent at once is presumed the coordinator's or the network's fault. Each scenario drives
//! `CoordinatorState` as the coordinator actor does: heartbeats, and a check every tick.

use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState, LossesDue};
use scheduler_core::distributed::NodeDirectoryEntry;
use scheduler_core::loss_guard::Silence;
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::{NodeId, Resources, Time};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const TICK_MS: u64 = 500;
const HEARTBEAT_MS: u64 = 1_000;

fn node(i: usize) -> NodeId {
    NodeId::new(format!("n{i:02}"))
}

/// A cluster of `n` nodes joined at 0 (node timeout 10 s, checks every 500 ms), and the nodes
/// still alive, which heartbeat every second.
struct Cluster {
    state: CoordinatorState,
    alive: BTreeSet<NodeId>,
    now_ms: u64,
    declared: Vec<(u64, NodeId)>,
    /// When each node's last heartbeat was sent.
    last_heard: BTreeMap<NodeId, u64>,
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        let mut state = CoordinatorState::new(CoordinatorConfig::default(), 1);
        let mut alive = BTreeSet::new();
        for i in 0..n {
            state.join(
                Time::ZERO,
                NodeDirectoryEntry {
                    node_id: node(i),
                    rack: "r0".into(),
                    capacity: Resources::new(1000, 1024),
                    app_endpoint: format!("n{i}:1"),
                    slot: i as u32,
                },
            );
            alive.insert(node(i));
        }
        Cluster {
            state,
            alive,
            now_ms: 0,
            declared: Vec::new(),
            last_heard: BTreeMap::new(),
        }
    }

    /// The coordinator's check at the current time, its declarations applied.
    fn check(&mut self) -> LossesDue {
        let due = self.state.losses_due(Time::from_millis(self.now_ms));
        for n in &due.declare {
            self.state.declare_lost(n);
            self.declared.push((self.now_ms, n.clone()));
        }
        self.check_invariants(&due);
        due
    }

    fn check_invariants(&self, due: &LossesDue) {
        // Nothing heard within the timeout is declared or held; nothing is both.
        for n in &due.declare {
            assert!(!due.newly_held.contains(n), "{n} both declared and held");
        }
        let silent: BTreeSet<NodeId> = self
            .state
            .silent_nodes(Time::from_millis(self.now_ms))
            .into_iter()
            .collect();
        assert_eq!(
            due.held,
            silent.len(),
            "held = the silent nodes not declared"
        );
        for n in &due.newly_held {
            assert!(silent.contains(n), "{n} held but not silent");
        }
        for n in &due.heard_again {
            assert!(!silent.contains(n), "{n} heard again but silent");
        }
    }

    /// Runs the cluster to `until_ms`: live nodes heartbeat every second (each at its own
    /// phase), the coordinator checks every tick. Returns every check's outcome.
    fn run_until(&mut self, until_ms: u64) -> Vec<(u64, LossesDue)> {
        let mut checks = Vec::new();
        while self.now_ms + 100 <= until_ms {
            self.now_ms += 100;
            for n in &self.alive {
                let i: u64 = n.as_str()[1..].parse().unwrap();
                if (self.now_ms + i * 100).is_multiple_of(HEARTBEAT_MS) {
                    self.last_heard.insert(n.clone(), self.now_ms);
                    self.state.heartbeat(
                        Time::from_millis(self.now_ms),
                        n,
                        QueueDelay::default(),
                        vec![],
                    );
                }
            }
            if self.now_ms.is_multiple_of(TICK_MS) {
                let due = self.check();
                checks.push((self.now_ms, due));
            }
        }
        checks
    }

    /// The coordinator is paused from now to `until_ms`: nothing is checked or heard (the
    /// nodes' heartbeats wait in its socket), then its first check.
    fn pause_coordinator_until(&mut self, until_ms: u64) -> LossesDue {
        self.now_ms = until_ms;
        self.check()
    }
}

#[test]
fn a_coordinator_paused_past_the_node_timeout_declares_no_live_node_lost() {
    let mut c = Cluster::new(8);
    c.run_until(5_000);
    // One node dies while the coordinator is paused for 30 s.
    c.alive.remove(&node(3));
    let first = c.pause_coordinator_until(35_000);
    assert_eq!(first.deaf_for, Duration::from_millis(29_500));
    // Not a mass silence either: the pause is not counted as the nodes' silence.
    assert_eq!(first.silence, Silence::Normal);
    assert_eq!(first.held, 0);
    assert!(
        first.declare.is_empty(),
        "a paused coordinator blamed its nodes: {:?}",
        first.declare
    );
    assert_eq!(c.state.own_stalls(), 1);
    c.run_until(60_000);
    // Only the dead node is lost, a whole node timeout of listening after the pause (it was
    // last heard before the pause began; the pause's grace, which nobody here extends, ends
    // at the same time: 45 s), and nothing else.
    assert_eq!(c.declared.len(), 1, "{:?}", c.declared);
    let (at_ms, lost) = &c.declared[0];
    assert_eq!(lost, &node(3));
    assert!(
        (44_000..=45_000).contains(at_ms),
        "declared at {at_ms} ms, expected after ~10 s of listening"
    );
}

#[test]
fn without_a_pause_a_dead_node_is_declared_at_the_node_timeout() {
    let mut c = Cluster::new(8);
    c.run_until(5_000);
    c.alive.remove(&node(3));
    c.run_until(30_000);
    assert_eq!(c.state.own_stalls(), 0);
    assert_eq!(c.declared.len(), 1);
    let (at_ms, lost) = &c.declared[0];
    assert_eq!(lost, &node(3));
    assert!((15_000..=16_000).contains(at_ms), "declared at {at_ms} ms");
}

#[test]
fn two_or_fewer_silent_nodes_are_declared_whatever_their_share() {
    let mut c = Cluster::new(3);
    c.run_until(2_000);
    c.alive.remove(&node(0));
    c.alive.remove(&node(1));
    c.run_until(20_000);
    let lost: BTreeSet<NodeId> = c.declared.iter().map(|(_, n)| n.clone()).collect();
    assert_eq!(lost, [node(0), node(1)].into_iter().collect());
}

#[test]
fn most_nodes_silent_at_once_are_held_and_when_the_share_falls_the_rest_get_a_fresh_timeout() {
    let mut c = Cluster::new(10);
    c.run_until(2_000);
    // Six of ten go silent together (a partition, or the coordinator too busy to hear them).
    for i in 0..6 {
        c.alive.remove(&node(i));
    }
    let checks = c.run_until(14_000);
    assert!(c.declared.is_empty(), "{:?}", c.declared);
    let (_, last) = checks.last().unwrap();
    assert_eq!(
        last.silence,
        Silence::Mass {
            silent: 6,
            nodes: 10
        }
    );
    assert_eq!(last.held, 6);
    let held_once: usize = checks.iter().map(|(_, d)| d.newly_held.len()).sum();
    assert_eq!(held_once, 6, "each held node is reported newly held once");
    // One of them comes back: five of ten silent is under the share, the episode ends, and
    // the five still silent get a whole node timeout from then (held, closed to new work).
    c.alive.insert(node(5));
    let checks = c.run_until(20_000);
    assert!(c.declared.is_empty(), "{:?}", c.declared);
    let heard: Vec<NodeId> = checks
        .iter()
        .flat_map(|(_, d)| d.heard_again.clone())
        .collect();
    assert_eq!(heard, vec![node(5)]);
    assert_eq!(checks.last().unwrap().1.held, 5);
    let ended_at = checks
        .iter()
        .find(|(_, d)| d.silence == Silence::Normal)
        .map(|(t, _)| *t)
        .unwrap();
    // Still silent a node timeout later: declared then, all at once.
    c.run_until(40_000);
    assert_eq!(c.declared.len(), 5, "{:?}", c.declared);
    for (at, _) in &c.declared {
        assert_eq!(*at, ended_at + 10_000);
    }
}

#[test]
fn in_a_long_mass_silence_one_node_is_declared_per_hundred_seconds_longest_silent_first() {
    let mut c = Cluster::new(20);
    c.run_until(2_000);
    for i in 0..15 {
        c.alive.remove(&node(i));
    }
    c.run_until(400_000);
    // Fifteen of twenty silent: 75 %, and 12 of 17 (71 %) after three declarations, so the
    // slow rate all along: one per 100 s from the first check of the mass silence (7 s).
    assert_eq!(c.declared.len(), 3, "{:?}", c.declared);
    assert_eq!(
        c.declared.iter().map(|(at, _)| *at).collect::<Vec<_>>(),
        vec![107_000, 207_000, 307_000]
    );
    // Longest silent first (ties by id).
    let mut by_silence: Vec<(u64, NodeId)> =
        (0..15).map(|i| (c.last_heard[&node(i)], node(i))).collect();
    by_silence.sort();
    let order: Vec<NodeId> = c.declared.iter().map(|(_, n)| n.clone()).collect();
    let expected: Vec<NodeId> = by_silence.into_iter().take(3).map(|(_, n)| n).collect();
    assert_eq!(order, expected);
}

#[test]
fn every_node_silent_declares_none_until_one_is_heard_again() {
    let mut c = Cluster::new(4);
    c.run_until(2_000);
    let all: Vec<NodeId> = c.alive.iter().cloned().collect();
    c.alive.clear();
    let checks = c.run_until(600_000);
    assert!(c.declared.is_empty(), "{:?}", c.declared);
    assert_eq!(
        checks.last().unwrap().1.silence,
        Silence::Total { silent: 4 }
    );
    // One node heard again (the partition heals from one side first): the other three are 75 %
    // of the cluster, still a mass silence, so they are not all declared at once.
    c.alive.insert(all[0].clone());
    let checks = c.run_until(605_000);
    assert!(c.declared.is_empty(), "{:?}", c.declared);
    assert_eq!(
        checks.last().unwrap().1.silence,
        Silence::Mass {
            silent: 3,
            nodes: 4
        }
    );
    // All back: none was lost.
    c.alive.extend(all.iter().cloned());
    let checks = c.run_until(615_000);
    assert_eq!(checks.last().unwrap().1.silence, Silence::Normal);
    assert!(c.declared.is_empty());
}

#[test]
fn a_healed_partition_loses_no_node_though_its_nodes_come_back_over_a_heartbeat_interval() {
    let mut c = Cluster::new(10);
    c.run_until(2_000);
    let all: Vec<NodeId> = c.alive.iter().cloned().collect();
    c.alive.clear();
    c.run_until(60_000);
    assert!(c.declared.is_empty());
    // Back: their heartbeats arrive over the next second (one every 100 ms), so checks see
    // the cluster half heard, under the share, while the rest are still past the timeout.
    c.alive.extend(all.iter().cloned());
    let checks = c.run_until(90_000);
    let ended_at = checks
        .iter()
        .find(|(_, d)| d.silence == Silence::Normal)
        .map(|(t, _)| *t)
        .unwrap();
    // n00's first heartbeat is at 61 s: the episode ended with nodes still past the timeout.
    assert!(ended_at < 61_000, "ended at {ended_at} ms");
    assert!(c.last_heard[&node(0)] >= 61_000);
    assert!(c.declared.is_empty(), "{:?}", c.declared);
    assert_eq!(checks.last().unwrap().1.silence, Silence::Normal);
}

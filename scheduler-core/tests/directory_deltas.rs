//! Directory deltas (issue 17): the coordinator sends a worker's scheduler only the membership
//! changes since the version it reports, publishes at most one version per round, keeps a
//! bounded log of changes, and sends the whole directory only to a worker whose version it does
//! not know or no longer has the changes of. The keys that go with the directory (one per
//! (issuer, node session)) follow the same deltas.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState, DIRECTORY_LOG_VERSIONS};
use scheduler_core::distributed::{
    DirectoryUpdate, DistributedScheduler, DistributedSchedulerConfig, NodeDirectoryEntry,
};
use scheduler_core::token::{QueueableSigner, TokenBody, TokenKey};
use scheduler_core::{ContainerId, ContainerType, NodeId, Resources, Time};
use std::time::Duration;

const ROUND: Duration = Duration::from_secs(1);

fn entry(i: usize, generation: u64) -> NodeDirectoryEntry {
    NodeDirectoryEntry {
        node_id: NodeId::new(format!("n{i:03}")),
        rack: format!("r{}", i % 5),
        // A re-join may come back with another capacity: the delta must carry the new entry.
        capacity: Resources::new(1000 * (1 + generation % 4), 4096),
        app_endpoint: format!("10.0.0.{i}:{}", 7000 + generation),
    }
}

fn coordinator() -> CoordinatorState {
    let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
    c.set_token_master(TokenKey::from_bytes(1, [9; 32]))
        .expect("a 32-byte master key");
    c
}

fn body(issuer: u32, node: &NodeId) -> TokenBody {
    TokenBody {
        container_id: ContainerId::new(issuer, 1),
        node_id: node.clone(),
        app_id: "demo".into(),
        resources: Resources::new(100, 64),
        container_type: ContainerType::Queueable,
        version: 0,
        job_id: "job-1".into(),
        job_submit_time_ms: 1,
        priority: 0,
        runtime_estimate_ms: None,
        expires_at_ms: u64::MAX / 2,
        key_id: 0,
        node_epoch: 0,
        booking: None,
        re_placed: false,
    }
}

/// A worker's scheduler and signer, fed as the worker's scheduler actor feeds them.
struct Worker {
    node: NodeId,
    scheduler: DistributedScheduler,
    signer: QueueableSigner,
}

impl Worker {
    fn join(c: &mut CoordinatorState, now: Time, dir: NodeDirectoryEntry) -> Worker {
        let node = dir.node_id.clone();
        let issuer = c.join(now, dir);
        let view = c.node_view(&node, 0, Vec::new());
        let mut scheduler =
            DistributedScheduler::new(DistributedSchedulerConfig::default(), issuer);
        assert_eq!(scheduler.update_view(view.view), DirectoryUpdate::Replaced);
        let signer = QueueableSigner::new(issuer, &view.issuer_keys.expect("keys at join"))
            .expect("well-formed keys");
        Worker {
            node,
            scheduler,
            signer,
        }
    }

    fn version(&self) -> u64 {
        self.scheduler.view().directory_version
    }

    /// Apply one heartbeat answer; returns the membership entries it carried.
    fn apply(&mut self, answer: scheduler_core::coordinator::NodeView) -> usize {
        let carried = answer.view.directory.len()
            + answer
                .view
                .delta
                .as_ref()
                .map_or(0, |d| d.joined.len() + d.left.len());
        let keys = answer.issuer_keys;
        match self.scheduler.update_view(answer.view) {
            DirectoryUpdate::Replaced => self
                .signer
                .replace_keys(&keys.expect("keys with the directory"))
                .unwrap(),
            DirectoryUpdate::Patched { left } => self
                .signer
                .patch_keys(&keys.expect("keys with a delta"), &left)
                .unwrap(),
            DirectoryUpdate::Unchanged | DirectoryUpdate::Ignored => {}
        }
        carried
    }

    /// The worker's directory and keys are exactly the coordinator's: same entries in the same
    /// order, one key per node, each the key of the node's current session (a signature made
    /// with it equals one made with the key the coordinator would send in a whole directory).
    fn assert_matches(&self, c: &CoordinatorState) {
        let expected: Vec<NodeDirectoryEntry> = c.nodes().cloned().collect();
        assert_eq!(self.scheduler.view().directory, expected);
        let whole = c.node_view(&self.node, 0, Vec::new());
        let reference =
            QueueableSigner::new(self.signer.issuer(), &whole.issuer_keys.unwrap()).unwrap();
        assert_eq!(self.signer.nodes(), expected.len());
        for n in &expected {
            assert_eq!(self.signer.node_epoch(&n.node_id), c.issuer_of(&n.node_id));
            let b = body(self.signer.issuer(), &n.node_id);
            assert_eq!(
                self.signer.sign(b.clone()).unwrap().signature,
                reference.sign(b).unwrap().signature,
                "key for {}",
                n.node_id
            );
        }
    }
}

#[test]
fn workers_applying_deltas_reach_exactly_the_coordinators_directory_and_keys() {
    for seed in 0..8u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = coordinator();
        let mut now = Time::ZERO;
        let mut generation = vec![0u64; 60];
        for (i, g) in generation.iter().enumerate().take(20) {
            c.join(now, entry(i, *g));
        }
        let mut workers: Vec<Worker> = (100..104)
            .map(|i| Worker::join(&mut c, now, entry(i, 0)))
            .collect();
        c.round(now, ROUND, &mut rng);
        for w in &mut workers {
            let known = w.version();
            w.apply(c.node_view(&w.node, known, Vec::new()));
            w.assert_matches(&c);
        }
        for round in 0..40u64 {
            now = Time::from_millis(round * 1000 + 1000);
            // Membership changes this round: joins, re-joins (a new session), departures.
            for _ in 0..rng.random_range(0..6usize) {
                let i = rng.random_range(0..60usize);
                let node = NodeId::new(format!("n{i:03}"));
                if c.node(&node).is_some() && rng.random_bool(0.5) {
                    c.remove_node(&node);
                } else {
                    generation[i] += 1;
                    c.join(now, entry(i, generation[i]));
                }
            }
            c.round(now, ROUND, &mut rng);
            for w in &mut workers {
                // Some answers are skipped (a heartbeat lost or late), some pipelined: two
                // heartbeats sent at the same version, answered one after the other.
                match rng.random_range(0..4u32) {
                    0 => {}
                    1 => {
                        let known = w.version();
                        let first = c.node_view(&w.node, known, Vec::new());
                        let second = c.node_view(&w.node, known, Vec::new());
                        w.apply(first);
                        w.apply(second);
                    }
                    _ => {
                        let known = w.version();
                        let answer = c.node_view(&w.node, known, Vec::new());
                        let carried = w.apply(answer);
                        if known != 0 && known + 1 == c.directory_version() {
                            // One round's delta carries that round's changes only.
                            assert!(carried <= 6, "{carried} entries for one round");
                        }
                    }
                }
            }
        }
        // One more round with every worker answered: all reach the coordinator's directory.
        now = Time::from_millis(now.as_millis() + 1000);
        c.round(now, ROUND, &mut rng);
        for w in &mut workers {
            let known = w.version();
            w.apply(c.node_view(&w.node, known, Vec::new()));
            assert_eq!(w.version(), c.directory_version());
            w.assert_matches(&c);
        }
    }
}

#[test]
fn membership_changes_of_one_round_are_one_version_sent_as_one_delta() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut c = coordinator();
    let mut w = Worker::join(&mut c, Time::ZERO, entry(0, 0));
    c.round(Time::ZERO, ROUND, &mut rng);
    let v = c.directory_version();
    assert_eq!(w.apply(c.node_view(&w.node, w.version(), Vec::new())), 1);
    assert_eq!(w.version(), v);
    // A join storm within one round: nothing is published until the next round.
    for i in 1..=200 {
        c.join(Time::from_millis(100), entry(i, 0));
    }
    c.remove_node(&NodeId::new("n007".to_string()));
    c.round(Time::from_millis(500), ROUND, &mut rng);
    assert_eq!(c.directory_version(), v);
    assert_eq!(c.directory_changes_pending(), 200);
    let quiet = c.node_view(&w.node, v, Vec::new());
    assert!(quiet.view.directory.is_empty() && quiet.view.delta.is_none());
    assert!(quiet.issuer_keys.is_none());
    // The next round publishes all of it as one version and one delta.
    c.round(Time::from_millis(1000), ROUND, &mut rng);
    assert_eq!(c.directory_version(), v + 1);
    let answer = c.node_view(&w.node, v, Vec::new());
    let delta = answer.view.delta.clone().expect("a delta");
    assert!(answer.view.directory.is_empty());
    assert_eq!(delta.from_version, v);
    assert_eq!(delta.joined.len(), 199);
    assert_eq!(delta.left, vec![NodeId::new("n007".to_string())]);
    assert_eq!(answer.issuer_keys.as_ref().map(Vec::len), Some(199));
    w.apply(answer);
    w.assert_matches(&c);
    // A later round without changes publishes nothing.
    c.round(Time::from_millis(2000), ROUND, &mut rng);
    assert_eq!(c.directory_version(), v + 1);
}

#[test]
fn the_change_log_is_bounded_and_an_older_version_gets_the_whole_directory() {
    let mut rng = StdRng::seed_from_u64(2);
    let mut c = coordinator();
    let mut w = Worker::join(&mut c, Time::ZERO, entry(0, 0));
    let rounds = DIRECTORY_LOG_VERSIONS as u64 + 5;
    for round in 1..=rounds {
        c.join(Time::from_secs(round), entry(round as usize, 0));
        c.round(Time::from_secs(round), ROUND, &mut rng);
    }
    let versions: Vec<u64> = c.directory_log_versions().collect();
    assert_eq!(versions.len(), DIRECTORY_LOG_VERSIONS);
    let current = c.directory_version();
    assert_eq!(versions.last(), Some(&current));
    let oldest_covered = versions[0] - 1;
    // Within the log: the changes since.
    let recent = c.node_view(&w.node, oldest_covered, Vec::new());
    let delta = recent.view.delta.expect("a delta from a logged version");
    assert_eq!(delta.joined.len(), DIRECTORY_LOG_VERSIONS);
    assert!(recent.view.directory.is_empty());
    // Older than the log, unknown (0) or ahead of the coordinator (another incarnation's):
    // the whole directory, with a key for every node.
    for known in [oldest_covered - 1, 0, current + 1] {
        let whole = c.node_view(&w.node, known, Vec::new());
        assert!(whole.view.delta.is_none(), "version {known}");
        assert_eq!(
            whole.view.directory.len(),
            c.node_count(),
            "version {known}"
        );
        assert_eq!(whole.issuer_keys.map(|k| k.len()), Some(c.node_count()));
    }
    // The worker, still at its join version (older than the log), catches up with it.
    assert!(w.version() < oldest_covered);
    let carried = w.apply(c.node_view(&w.node, w.version(), Vec::new()));
    assert_eq!(carried, c.node_count());
    w.assert_matches(&c);
}

#[test]
fn a_delta_that_does_not_start_at_or_before_the_schedulers_version_is_ignored_with_its_keys() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut c = coordinator();
    let mut w = Worker::join(&mut c, Time::ZERO, entry(0, 0));
    c.join(Time::ZERO, entry(1, 0));
    c.round(Time::ZERO, ROUND, &mut rng);
    let v1 = c.directory_version();
    c.join(Time::from_secs(1), entry(2, 0));
    c.round(Time::from_secs(1), ROUND, &mut rng);
    // A delta from v1 to v1+1, offered to a scheduler still at its join version (before v1).
    let ahead = c.node_view(&w.node, v1, Vec::new());
    assert!(w.version() < v1);
    let before = w.scheduler.view().directory.clone();
    assert_eq!(
        w.scheduler.update_view(ahead.view),
        DirectoryUpdate::Ignored
    );
    assert_eq!(w.scheduler.view().directory, before);
    // Its own version's answer brings it up to date.
    let known = w.version();
    w.apply(c.node_view(&w.node, known, Vec::new()));
    w.assert_matches(&c);
}

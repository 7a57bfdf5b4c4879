//! Directory deltas (issue 17): the coordinator sends a worker's scheduler only the membership
//! changes since the version it reports, publishes at most one version per round, keeps a
//! bounded log of changes, and sends the whole directory only to a worker whose version it does
//! not know or no longer has the changes of. A scheduler's QUEUEABLE keys (one per (issuer,
//! node session)) are sent only for the nodes of the top-k it is sent (cluster protocol 6): each
//! answer brings the keys of top-k nodes it lacks, so it can sign for every node it may place on.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState, DIRECTORY_LOG_VERSIONS};
use scheduler_core::distributed::{
    DirectoryUpdate, DistributedScheduler, DistributedSchedulerConfig, NodeDirectoryEntry,
};
use scheduler_core::queue_delay::QueueDelay;
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
        slot: i as u32,
    }
}

fn coordinator() -> CoordinatorState {
    coordinator_with_top_k(CoordinatorConfig::default().top_k)
}

fn coordinator_with_top_k(top_k: usize) -> CoordinatorState {
    let config = CoordinatorConfig {
        top_k,
        ..CoordinatorConfig::default()
    };
    let mut c = CoordinatorState::new(config, 1);
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
        times_returned: 0,
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
        let signer = QueueableSigner::new(issuer, &view.issuer_keys.expect("keys at join"));
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
            + answer.view.entries.len()
            + answer
                .view
                .delta
                .as_ref()
                .map_or(0, |d| d.joined.len() + d.left.len());
        let keys = answer.issuer_keys;
        let update = self.scheduler.update_view(answer.view);
        if matches!(
            update,
            DirectoryUpdate::Replaced | DirectoryUpdate::Patched { .. }
        ) {
            assert!(keys.is_some(), "keys go with membership");
        }
        // As the worker's scheduler actor applies them.
        if let Some(keys) = keys {
            match update {
                DirectoryUpdate::Replaced => self.signer.replace_keys(&keys),
                DirectoryUpdate::Patched { left } => self.signer.patch_keys(&keys, &left),
                DirectoryUpdate::Unchanged | DirectoryUpdate::Ignored => {
                    self.signer.patch_keys(&keys, &[])
                }
            }
        }
        carried
    }

    /// The worker's directory is partial (cluster protocol 9) and right where it is used: it
    /// holds the coordinator's current entry of every node of the round's top-k up to the
    /// answers' cap of new nodes (the k least loaded, which its scheduler chooses among; the
    /// whole list in these tests but one), and the key of each one's current session (a signature made
    /// with it equals one made with the key the coordinator derives for that session); every
    /// other entry is of a joined node (an entry of a node that re-joined outside the top-k may
    /// be of its previous session, even at its previous slot, and is replaced when a view
    /// names the node or another node takes the slot), one entry per slot; and its sum of the
    /// cluster is the coordinator's. No more keys than directory nodes.
    fn assert_matches(&self, c: &CoordinatorState) {
        let expected: Vec<NodeDirectoryEntry> = c.nodes().cloned().collect();
        let held = &self.scheduler.view().directory;
        assert!(held.windows(2).all(|w| w[0].node_id < w[1].node_id));
        let mut slots = std::collections::HashSet::new();
        for e in held {
            assert!(c.node(&e.node_id).is_some(), "{} left", e.node_id);
            assert!(slots.insert(e.slot), "slot {} twice", e.slot);
        }
        assert!(self.scheduler.directory_is_partial());
        assert_eq!(self.scheduler.cluster_nodes(), c.node_count());
        let issuer = self.signer.issuer();
        let first = c.config().new_nodes_per_answer;
        for l in c.aggregate_round().top_k.iter().take(first) {
            let n = &l.node_id;
            assert_eq!(
                held.iter().find(|e| &e.node_id == n),
                c.node(n),
                "entry of top-k node {n}"
            );
            assert_eq!(self.signer.node_epoch(n), c.issuer_of(n), "session of {n}");
            let reference = QueueableSigner::new(issuer, &[c.issuer_key_for(issuer, n).unwrap()]);
            let b = body(issuer, n);
            assert_eq!(
                self.signer.sign(b.clone()).unwrap().signature,
                reference.sign(b).unwrap().signature,
                "key for {n}"
            );
        }
        assert!(held.len() <= expected.len());
        assert!(self.signer.nodes() <= held.len());
        for n in &expected {
            if let Some(epoch) = self.signer.node_epoch(&n.node_id) {
                assert!(epoch <= c.issuer_of(&n.node_id).unwrap());
            }
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
    // The joined nodes went to the head of the round's top-k: their keys come now, with the
    // list that names them, one per top-k node at most (not one per joined node).
    let top_k = c.aggregate_round().top_k.len();
    assert_eq!(top_k, CoordinatorConfig::default().top_k);
    assert_eq!(quiet.issuer_keys.as_ref().map(Vec::len), Some(top_k));
    assert_eq!(
        quiet.view.entries.len(),
        top_k,
        "and their entries (protocol 9)"
    );
    w.apply(quiet);
    // The next round publishes all of it as one version and one delta.
    c.round(Time::from_millis(1000), ROUND, &mut rng);
    assert_eq!(c.directory_version(), v + 1);
    let answer = c.node_view(&w.node, v, Vec::new());
    let delta = answer.view.delta.clone().expect("a delta");
    assert!(answer.view.directory.is_empty());
    assert_eq!(delta.from_version, v);
    // Departures only (protocol 9): the 199 joins reach the worker as entries with their keys
    // when its views name them.
    assert!(delta.joined.is_empty());
    assert_eq!(delta.left, vec![NodeId::new("n007".to_string())]);
    assert_eq!(answer.view.cluster.as_ref().map(|s| s.nodes), Some(200));
    // Keys and entries only for the new round's top-k nodes the worker was not sent yet: 199
    // joined, at most k of each.
    let keys = answer.issuer_keys.as_ref().map_or(0, Vec::len);
    assert!(keys <= top_k, "{keys} keys for a top-{top_k}");
    assert_eq!(answer.view.entries.len(), keys);
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
    // Joins only since: no departure to name (protocol 9).
    assert!(delta.joined.is_empty() && delta.left.is_empty());
    assert!(recent.view.directory.is_empty());
    // Older than the log, unknown (0) or ahead of the coordinator (another incarnation's):
    // a whole directory — the node's own entry (protocol 9) — with an entry and a key for
    // every node of the top-k (here all of them).
    for known in [oldest_covered - 1, 0, current + 1] {
        let whole = c.node_view(&w.node, known, Vec::new());
        assert!(whole.view.delta.is_none(), "version {known}");
        assert_eq!(whole.view.directory, vec![c.node(&w.node).unwrap().clone()]);
        assert_eq!(whole.view.entries.len(), c.node_count(), "version {known}");
        assert_eq!(
            whole.issuer_keys.map(|k| k.len()),
            Some(c.aggregate_round().top_k.len())
        );
        assert_eq!(c.aggregate_round().top_k.len(), c.node_count());
    }
    // The worker, still at its join version (older than the log), catches up with it.
    assert!(w.version() < oldest_covered);
    let carried = w.apply(c.node_view(&w.node, w.version(), Vec::new()));
    assert_eq!(carried, 1 + c.node_count());
    w.assert_matches(&c);
}

#[test]
fn a_delta_that_does_not_start_at_or_before_the_schedulers_version_is_ignored_but_its_keys_are_kept()
 {
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
    let version = w.version();
    // The directory's membership is left as it was; the answer's keys (current sessions' keys
    // for the top-k, protocol 6) and the entries that go with them (protocol 9) are kept all
    // the same, as the worker's scheduler actor does, since the coordinator counts them as sent.
    let sent: Vec<NodeId> = ahead
        .view
        .entries
        .iter()
        .map(|e| e.node_id.clone())
        .collect();
    w.apply(ahead);
    let mut expected: Vec<NodeId> = before.iter().map(|e| e.node_id.clone()).collect();
    expected.extend(sent);
    expected.sort();
    expected.dedup();
    let held: Vec<NodeId> = w
        .scheduler
        .view()
        .directory
        .iter()
        .map(|e| e.node_id.clone())
        .collect();
    assert_eq!(held, expected);
    assert_eq!(w.version(), version);
    // Its own version's answer brings it up to date.
    let known = w.version();
    w.apply(c.node_view(&w.node, known, Vec::new()));
    w.assert_matches(&c);
}

fn delay(ms: f64) -> QueueDelay {
    QueueDelay {
        tq_ms: ms,
        tr_ms: 0.0,
        tl_ms: 0.0,
    }
}

/// Issue 17: in a cluster much larger than the top-k, a join answer carries keys for the top-k's
/// nodes only (not one per node: O(nodes) HMACs per join made a join storm O(nodes²)), a join
/// storm's delta carries none for joined nodes outside the top-k, and a node entering the
/// top-k later (by its queue delay, or re-joined under a new session) brings its key with the
/// first answer that names it, so the scheduler can always sign for every node it may place on.
#[test]
fn keys_go_only_to_the_nodes_of_the_top_k_and_come_with_the_list_that_names_them() {
    const K: usize = 8;
    let mut rng = StdRng::seed_from_u64(4);
    let mut c = coordinator_with_top_k(K);
    let mut now = Time::ZERO;
    for i in 0..100 {
        c.join(now, entry(i, 0));
    }
    c.round(now, ROUND, &mut rng);
    let mut w = Worker::join(&mut c, now, entry(100, 0));
    assert_eq!(c.node_count(), 101);
    assert_eq!(w.signer.nodes(), K, "one key per top-k node at the join");
    w.assert_matches(&c);
    // Nothing changed: no keys.
    let known = w.version();
    assert!(
        c.node_view(&w.node, known, Vec::new())
            .issuer_keys
            .is_none()
    );
    let mut generation = vec![0u64; 500];
    for round in 1..=30u64 {
        now = Time::from_secs(round);
        // Every node reports; the quietest K change from round to round.
        for i in 0..100usize {
            let node = NodeId::new(format!("n{i:03}"));
            let ms = ((i as u64 * 7919 + round * 104_729) % 1000) as f64;
            c.heartbeat(now, &node, delay(ms), Vec::new());
        }
        // A join storm of 50 nodes every fifth round, and a re-join of a top-k node.
        if round % 5 == 0 {
            for i in 0..50 {
                let i = 100 + (round as usize / 5) * 50 + i;
                c.join(now, entry(i, 0));
            }
        }
        if round % 3 == 0 {
            let rejoin = c.aggregate_round().top_k[K - 1].node_id.clone();
            let i: usize = rejoin.as_str()[1..].parse().unwrap();
            generation[i] += 1;
            let before = c.issuer_of(&rejoin);
            c.join(now, entry(i, generation[i]));
            assert_ne!(c.issuer_of(&rejoin), before);
        }
        c.round(now, ROUND, &mut rng);
        let known = w.version();
        let answer = c.node_view(&w.node, known, Vec::new());
        let keys = answer.issuer_keys.as_ref().map_or(0, Vec::len);
        assert!(keys <= K, "round {round}: {keys} keys for a top-{K}");
        w.apply(answer);
        w.assert_matches(&c);
    }
    assert!(c.node_count() > 300);
}

/// The coordinator encodes the membership part of its answers once per
/// `membership_identity` and reported version, and shares it (issue 17: a join storm built it
/// per answer): that is exact only if equal identities always give equal membership. Through
/// random joins, re-joins, removals, losses and rounds, every view is compared with the one
/// computed when the identity was first seen.
#[test]
fn equal_membership_identities_give_equal_membership() {
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = coordinator();
        let mut now = Time::ZERO;
        let mut generation = vec![0u64; 40];
        let mut seen: std::collections::HashMap<
            ((u64, u64), u64),
            scheduler_core::distributed::ClusterView,
        > = std::collections::HashMap::new();
        let mut identities = std::collections::HashSet::new();
        for step in 0..600u64 {
            match rng.random_range(0..10u32) {
                0..=3 => {
                    let i = rng.random_range(0..40usize);
                    generation[i] += 1;
                    c.join(now, entry(i, generation[i]));
                }
                4 | 5 => {
                    let node = NodeId::new(format!("n{:03}", rng.random_range(0..40usize)));
                    c.remove_node(&node);
                }
                6 => {
                    let node = NodeId::new(format!("n{:03}", rng.random_range(0..40usize)));
                    c.declare_lost(&node);
                }
                _ => {
                    now = Time::from_millis(step * 250);
                    c.round(now, ROUND, &mut rng);
                }
            }
            let identity = c.membership_identity();
            identities.insert(identity);
            for known in 0..=c.directory_version() + 1 {
                let view = c.view_with(known, Vec::new());
                let first = seen
                    .entry((identity, known))
                    .or_insert_with(|| view.clone());
                assert_eq!(
                    (&first.directory, &first.delta),
                    (&view.directory, &view.delta),
                    "seed {seed}, step {step}, known {known}"
                );
            }
        }
        assert!(identities.len() > 100, "{} identities", identities.len());
    }
}

/// A scheduler is sent keys for its view's nodes only (protocol 6), so it must place only on
/// them: with 40 nodes and a view of 4, asks preferring nodes and racks outside the view, strict
/// or relaxed, place nothing it cannot sign (before, a preferred node outside the view was
/// chosen and the signature failed, an internal error for the whole ask).
#[test]
fn everything_a_scheduler_places_it_can_sign_whatever_the_locality_names() {
    use scheduler_core::distributed::QueueableAsk;
    use scheduler_core::protocol::app::Locality;
    use scheduler_core::quota::QueueableQuota;
    let mut rng = StdRng::seed_from_u64(4);
    let mut c = coordinator_with_top_k(4);
    let now = Time::ZERO;
    for i in 0..40 {
        let node = entry(i, 0);
        let id = node.node_id.clone();
        c.join(now, node);
        let load = QueueDelay {
            tq_ms: 10.0 * i as f64 + 1.0,
            tr_ms: 0.0,
            tl_ms: 0.0,
        };
        c.heartbeat(now, &id, load, vec![]);
    }
    let mut w = Worker::join(&mut c, now, entry(100, 0));
    c.heartbeat(
        now,
        &w.node.clone(),
        QueueDelay {
            tq_ms: 1000.0,
            tr_ms: 0.0,
            tl_ms: 0.0,
        },
        vec![],
    );
    c.round(Time::from_secs(1), ROUND, &mut rng);
    let top_k = c.aggregate_round().top_k.clone();
    assert_eq!(top_k.len(), 4);
    let known = w.version();
    w.apply(c.node_view(&w.node, known, top_k.clone()));
    let in_view: Vec<&NodeId> = top_k.iter().map(|l| &l.node_id).collect();
    let outside = (0..40)
        .map(|i| entry(i, 0))
        .find(|e| !in_view.contains(&&e.node_id))
        .expect("a node outside the view");
    let mut placed = 0;
    for relax in [false, true] {
        for loc in [
            Locality {
                nodes: vec![outside.node_id.to_string()],
                racks: vec![],
                relax,
            },
            Locality {
                nodes: vec![],
                racks: vec![outside.rack.clone()],
                relax,
            },
            Locality {
                nodes: vec![outside.node_id.to_string(), in_view[0].to_string()],
                racks: vec![],
                relax,
            },
        ] {
            let ask = QueueableAsk {
                app_id: "demo".into(),
                resources: Resources::new(100, 64),
                count: 3,
                priority: 0,
                locality: Some(loc),
                runtime_estimate_ms: None,
                job_id: "job-1".into(),
                job_submit_time_ms: 1,
                replacements: Vec::new(),
            };
            let out = w
                .scheduler
                .place(1, &ask, &QueueableQuota::default(), &mut rng)
                .expect("placed or unplaced, not an error");
            for p in out.placed {
                assert!(
                    in_view.contains(&&p.node_id),
                    "{} outside the view",
                    p.node_id
                );
                w.signer
                    .sign(p.token_body)
                    .unwrap_or_else(|e| panic!("cannot sign for {}: {e}", p.node_id));
                placed += 1;
            }
        }
    }
    assert!(placed >= 9, "{placed}");
}

/// The live coordinator builds an answer's membership (the whole directory, or the delta since
/// a reported version) once per published version and shares it until the next one, so it may
/// be older than the answer: changes made after it was built and not yet published are missing,
/// and a join answer appends the joining node's own entry. Through joins, re-joins and
/// departures happening between answers of the same round, with some answers skipped, every
/// worker still reaches exactly the coordinator's directory and keys after a quiet round.
#[test]
fn membership_built_once_per_version_still_brings_every_worker_to_the_directory() {
    use scheduler_core::coordinator::MembershipSent;
    use scheduler_core::distributed::ClusterView;
    use std::collections::HashMap;
    for seed in 0..8u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = coordinator();
        let mut now = Time::ZERO;
        let mut generation = vec![0u64; 60];
        for (i, g) in generation.iter().enumerate().take(20) {
            c.join(now, entry(i, *g));
        }
        c.round(now, ROUND, &mut rng);
        // (version, what is sent) -> the membership as first built in that version.
        let mut cache: HashMap<(u64, MembershipSent), ClusterView> = HashMap::new();
        let mut shared = |c: &CoordinatorState, sent: MembershipSent| {
            let from = match sent {
                MembershipSent::DeltaFrom(v) => v,
                _ => 0,
            };
            cache
                .entry((c.directory_version(), sent))
                .or_insert_with(|| c.wire_membership(from))
                .clone()
        };
        let answer = |c: &mut CoordinatorState,
                      shared: &mut dyn FnMut(&CoordinatorState, MembershipSent) -> ClusterView,
                      w: &Worker| {
            let (mut parts, sent) = c.node_view_parts(&w.node, w.version(), Vec::new());
            if sent != MembershipSent::Nothing {
                let membership = shared(c, sent);
                parts.view.directory = membership.directory;
                parts.view.delta = membership.delta;
                parts.view.cluster = membership.cluster;
                // As the live coordinator: a whole directory (protocol 9: none) gets the
                // node's own entry appended.
                if sent == MembershipSent::Whole {
                    parts.view.directory.push(c.node(&w.node).unwrap().clone());
                }
            }
            parts
        };
        // Workers join as the live coordinator answers a join: the shared whole directory,
        // then the node's own entry if that directory was built before it joined.
        let join = |c: &mut CoordinatorState,
                    shared: &mut dyn FnMut(&CoordinatorState, MembershipSent) -> ClusterView,
                    now: Time,
                    dir: NodeDirectoryEntry| {
            let node = dir.node_id.clone();
            let issuer = c.join(now, dir);
            let (mut parts, sent) = c.node_view_parts(&node, 0, Vec::new());
            assert_eq!(sent, MembershipSent::Whole);
            let membership = shared(c, sent);
            parts.view.directory = membership.directory;
            parts.view.cluster = membership.cluster;
            parts.view.directory.push(c.node(&node).unwrap().clone());
            let mut scheduler =
                DistributedScheduler::new(DistributedSchedulerConfig::default(), issuer);
            assert_eq!(scheduler.update_view(parts.view), DirectoryUpdate::Replaced);
            assert!(
                scheduler.view().directory.iter().any(|e| e.node_id == node),
                "a joined worker's directory holds its own node"
            );
            let signer = QueueableSigner::new(issuer, &parts.issuer_keys.expect("keys at join"));
            Worker {
                node,
                scheduler,
                signer,
            }
        };
        let mut workers: Vec<Worker> = Vec::new();
        for i in 100..104 {
            workers.push(join(&mut c, &mut shared, now, entry(i, 0)));
        }
        for round in 0..40u64 {
            now = Time::from_millis(round * 1000 + 1000);
            c.round(now, ROUND, &mut rng);
            for w in &mut workers {
                // Changes between the answers of a round: the shared membership was built
                // before some of them.
                if rng.random_bool(0.5) {
                    let i = rng.random_range(0..60usize);
                    let node = NodeId::new(format!("n{i:03}"));
                    if c.node(&node).is_some() && rng.random_bool(0.5) {
                        c.remove_node(&node);
                    } else {
                        generation[i] += 1;
                        c.join(now, entry(i, generation[i]));
                    }
                }
                if rng.random_range(0..4u32) > 0 {
                    let a = answer(&mut c, &mut shared, w);
                    w.apply(a);
                }
            }
            // Now and then another worker joins mid-round.
            if round % 10 == 5 {
                let i = 104 + workers.len();
                workers.push(join(&mut c, &mut shared, now, entry(i, 0)));
            }
        }
        // A quiet round with every worker answered: all reach the coordinator's directory.
        now = Time::from_millis(now.as_millis() + 1000);
        c.round(now, ROUND, &mut rng);
        for w in &mut workers {
            let a = answer(&mut c, &mut shared, w);
            w.apply(a);
            assert_eq!(w.version(), c.directory_version());
            w.assert_matches(&c);
        }
    }
}

/// One round of `a_nodes_key_goes_once_however_often_it_reenters_the_top_k`: `nodes` report
/// loads that put the two at rotation positions 2·round and 2·round + 1 (mod 12) first; the
/// worker applies the round's answer. Returns the keys the answer carried.
fn rotate_one_round(
    c: &mut CoordinatorState,
    w: &mut Worker,
    rng: &mut StdRng,
    round: u64,
    nodes: &[(usize, u64)],
) -> usize {
    let now = Time::from_secs(round + 1);
    for &(i, position) in nodes {
        let ms = ((position + 12 - (2 * round) % 12) % 12) as f64;
        let load = QueueDelay {
            tq_ms: ms,
            tr_ms: 0.0,
            tl_ms: 0.0,
        };
        c.heartbeat(now, &entry(i, 0).node_id, load, vec![]);
    }
    c.round(now, ROUND, rng);
    let top_k = c.aggregate_round().top_k.clone();
    let known = w.version();
    let answer = c.node_view(&w.node, known, top_k);
    let keys = answer.issuer_keys.as_ref().map_or(0, Vec::len);
    w.apply(answer);
    w.assert_matches(c);
    keys
}

/// The coordinator remembers the keys it sent a scheduler as one bit per node slot, not a
/// bounded list of sessions: a node's key goes to a scheduler once however often the node
/// leaves and re-enters its top-k; a re-join (new session) sends the new key again, and a slot
/// freed by a node that left and taken by a new node does not pass for the new node's key.
#[test]
fn a_nodes_key_goes_once_however_often_it_reenters_the_top_k() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut c = coordinator_with_top_k(2);
    let now = Time::ZERO;
    // Twelve nodes, more than the 4 × k sessions the coordinator used to remember.
    for i in 0..12 {
        c.join(now, entry(i, 0));
    }
    let mut w = Worker::join(&mut c, now, entry(100, 0));
    let busy = QueueDelay {
        tq_ms: 10_000.0,
        tr_ms: 0.0,
        tl_ms: 0.0,
    };
    c.heartbeat(now, &w.node.clone(), busy, vec![]);
    // The two least loaded rotate through all twelve nodes, four times over.
    let nodes: Vec<(usize, u64)> = (0..12).map(|i| (i, i as u64)).collect();
    let mut keys_per_round: Vec<usize> = (0..24u64)
        .map(|round| rotate_one_round(&mut c, &mut w, &mut rng, round, &nodes))
        .collect();
    // Every node's key once (the first rounds), then none, though the list changed every round.
    assert_eq!(
        keys_per_round.iter().sum::<usize>(),
        12,
        "{keys_per_round:?}"
    );
    assert!(
        keys_per_round[6..].iter().all(|&k| k == 0),
        "{keys_per_round:?}"
    );
    // A re-join is a new session: its key is sent again when it is next in the top-k.
    let now = Time::from_secs(24);
    c.join(now, entry(3, 1));
    // n007 leaves and a new node takes its slot, and its place in the rotation.
    c.remove_node(&entry(7, 0).node_id);
    c.join(now, entry(20, 0));
    let nodes: Vec<(usize, u64)> = (0..12)
        .map(|i| (if i == 7 { 20 } else { i }, i as u64))
        .collect();
    keys_per_round
        .extend((24..36u64).map(|round| rotate_one_round(&mut c, &mut w, &mut rng, round, &nodes)));
    // n003's new session and n020 (in n007's old slot): two keys more, no others.
    assert_eq!(
        keys_per_round[24..].iter().sum::<usize>(),
        2,
        "{keys_per_round:?}"
    );
}

/// Cluster protocol 8: the top-k crosses the wire by node slot, and a scheduler resolves the
/// slots in its directory at the view's version. Under joins, re-joins and departures between
/// any two answers (a departed node's slot taken by a new one in the same round included), every
/// node a scheduler resolves is joined and holds that slot, and the resolved list is the
/// round's top-k less the nodes whose entries the scheduler has not been sent yet, in order.
#[test]
fn a_top_k_sent_by_slot_resolves_only_to_joined_nodes_in_the_rounds_order() {
    use scheduler_core::codec::{from_payload, to_payload};
    use scheduler_core::distributed::ClusterView;
    let mut resolved_entries = 0usize;
    for seed in 0..16u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = coordinator_with_top_k(8);
        let mut now = Time::ZERO;
        let mut generation = vec![0u64; 40];
        for (i, g) in generation.iter().enumerate().take(12) {
            c.join(now, entry(i, *g));
        }
        let mut workers: Vec<Worker> = (100..103)
            .map(|i| Worker::join(&mut c, now, entry(i, 0)))
            .collect();
        c.round(now, ROUND, &mut rng);
        for step in 0..600u64 {
            match rng.random_range(0..10u32) {
                // Departures and joins land between answers, mid-round as on a live coordinator.
                0 | 1 => {
                    let i = rng.random_range(0..40usize);
                    let node = NodeId::new(format!("n{i:03}"));
                    if c.node(&node).is_some() {
                        c.remove_node(&node);
                    }
                }
                2 | 3 => {
                    let i = rng.random_range(0..40usize);
                    generation[i] += 1;
                    c.join(now, entry(i, generation[i]));
                }
                4 => {
                    now = Time::from_millis(now.as_millis() + 1000);
                    c.round(now, ROUND, &mut rng);
                }
                _ => {
                    let w = &mut workers[(step % 3) as usize];
                    let known = w.version();
                    let mut answer = c.node_view(&w.node, known, Vec::new());
                    answer.view.top_k_slots = c.aggregate_round().top_k_on_wire();
                    // Through the wire: names are not sent, slots are.
                    answer.view =
                        from_payload::<ClusterView>(&to_payload(&answer.view).unwrap()).unwrap();
                    assert!(answer.view.top_k.is_empty());
                    w.apply(answer);
                    let resolved = &w.scheduler.view().top_k;
                    for l in resolved {
                        assert!(
                            c.node(&l.node_id).is_some(),
                            "seed {seed} step {step}: {} has left",
                            l.node_id
                        );
                    }
                    // The round's entries whose node the scheduler's directory holds at that
                    // slot (a node that left and joined again mid-round has a new slot, and is
                    // left out until the next version brings its entry).
                    let round = c.aggregate_round();
                    let expected: Vec<&NodeId> = round
                        .top_k
                        .iter()
                        .zip(round.top_k_on_wire())
                        .filter(|(l, s)| {
                            w.scheduler
                                .view()
                                .directory
                                .iter()
                                .any(|e| e.node_id == l.node_id && e.slot == s.slot)
                        })
                        .map(|(l, _)| &l.node_id)
                        .collect();
                    let names: Vec<&NodeId> = resolved.iter().map(|l| &l.node_id).collect();
                    assert_eq!(names, expected, "seed {seed} step {step}");
                    resolved_entries += resolved.len();
                }
            }
        }
    }
    assert!(
        resolved_entries > 1000,
        "{resolved_entries} entries resolved"
    );
}

/// Cluster protocol 9: a join answer carries the node's own entry, the cluster's sum and the
/// entries of its view's nodes (with their keys), not the directory, so its size does not grow
/// with the cluster; a storm's deltas name no joined node; and workers that joined early and
/// follow the answers through a storm of 2,000 joins hold every top-k node's current entry
/// (checked by `assert_matches`) while each answer carried at most k entries (a joined node goes
/// to the head of the top-k, so each round's k newest reach every worker: before protocol 9,
/// every round's delta carried all of its 100 joins).
#[test]
fn join_answers_and_deltas_grow_with_the_view_not_with_the_cluster() {
    let mut rng = StdRng::seed_from_u64(9);
    let mut c = coordinator();
    let mut early: Vec<Worker> = (0..3)
        .map(|i| Worker::join(&mut c, Time::ZERO, entry(i, 0)))
        .collect();
    c.round(Time::ZERO, ROUND, &mut rng);
    let top_k = CoordinatorConfig::default().top_k;
    let mut sent_to_early = vec![0usize; early.len()];
    let mut largest_join_answer = 0;
    for round in 1..=20u64 {
        let now = Time::from_secs(round);
        for i in 0..100usize {
            let n = 3 + (round as usize - 1) * 100 + i;
            let node = NodeId::new(format!("n{n:03}"));
            let issuer = c.join(now, entry(n, 0));
            let answer = c.node_view(&node, 0, Vec::new());
            assert_eq!(answer.view.directory, vec![c.node(&node).unwrap().clone()]);
            assert!(answer.view.cluster.is_some());
            assert_eq!(
                answer.issuer_keys.as_ref().map(Vec::len),
                Some(answer.view.entries.len())
            );
            largest_join_answer = largest_join_answer.max(
                scheduler_core::codec::to_payload(&answer.view)
                    .unwrap()
                    .len(),
            );
            assert!(issuer > 0);
        }
        for (w, sent) in early.iter_mut().zip(&mut sent_to_early) {
            let answer = c.node_view(&w.node, w.version(), Vec::new());
            if let Some(delta) = &answer.view.delta {
                assert!(delta.joined.is_empty() && delta.left.is_empty());
            }
            let carried = w.apply(answer);
            assert!(carried <= top_k, "{carried} entries in one answer");
            *sent += carried;
        }
        c.round(now, ROUND, &mut rng);
    }
    let now = Time::from_secs(21);
    c.round(now, ROUND, &mut rng);
    for (w, sent) in early.iter_mut().zip(&mut sent_to_early) {
        *sent += w.apply(c.node_view(&w.node, w.version(), Vec::new()));
        w.assert_matches(&c);
        assert!(*sent <= 21 * top_k, "{sent} entries");
    }
    assert_eq!(c.node_count(), 2003);
    // The own entry and at most k entries with their sum: a few kilobytes at any cluster size
    // (the whole directory of 2,003 nodes is ~90 KB).
    let per_entry = 45;
    assert!(
        largest_join_answer < (top_k + 1) * per_entry + 200,
        "{largest_join_answer} bytes"
    );
}

/// Issue 17: when the view turns over, an answer carries at most `new_nodes_per_answer` nodes
/// new to the scheduler (entries with their keys), the least loaded first, so the scheduler
/// holds the round's k least-loaded nodes after every answer and the rest of the view follows
/// in the next answers of the same round; a join answer starts the view whole.
#[test]
fn an_answer_carries_at_most_k_new_nodes_the_least_loaded_first() {
    let mut rng = StdRng::seed_from_u64(5);
    // A view of 4k = 200 candidates for schedulers choosing among k = 50.
    let mut c = coordinator_with_top_k(200);
    let k = c.config().new_nodes_per_answer;
    assert_eq!(k, 50);
    let load = |ms: f64| QueueDelay {
        tq_ms: ms,
        tr_ms: 0.0,
        tl_ms: 0.0,
    };
    let nodes: Vec<NodeId> = (0..400).map(|i| NodeId::new(format!("n{i:03}"))).collect();
    for (i, n) in nodes.iter().enumerate() {
        c.join(Time::ZERO, entry(i, 0));
        c.heartbeat(Time::ZERO, n, load(1.0 + i as f64), Vec::new());
    }
    let worker_entry = NodeDirectoryEntry {
        node_id: NodeId::new("w".to_string()),
        ..entry(999, 0)
    };
    c.round(Time::ZERO, ROUND, &mut rng);
    let mut w = Worker::join(&mut c, Time::ZERO, worker_entry);
    c.heartbeat(Time::ZERO, &w.node, load(10_000.0), Vec::new());
    // The join answer was whole: every view node (the joined worker's own node, put first,
    // then 0..198 by load) without a cap.
    assert_eq!(w.scheduler.view().directory.len(), 200);
    // The loads turn over: the next round's view is nodes 399 down to 200, none of them held.
    for (i, n) in nodes.iter().enumerate() {
        c.heartbeat(Time::from_secs(1), n, load(400.0 - i as f64), Vec::new());
    }
    c.round(Time::from_secs(1), ROUND, &mut rng);
    let generation = c.top_k_generation();
    let view: Vec<NodeId> = c
        .aggregate_round()
        .top_k
        .iter()
        .map(|l| l.node_id.clone())
        .collect();
    assert_eq!(view.len(), 200);
    assert_eq!(view[0], nodes[399]);
    let version = w.version();
    for answer_no in 0..4 {
        let answer = c.node_view(&w.node, version, Vec::new());
        let sent: Vec<NodeId> = answer
            .view
            .entries
            .iter()
            .map(|e| e.node_id.clone())
            .collect();
        // The next k of the list, in its order (least loaded first), each with its key.
        assert_eq!(
            sent,
            view[answer_no * k..(answer_no + 1) * k],
            "answer {answer_no}"
        );
        assert_eq!(answer.issuer_keys.as_ref().map(Vec::len), Some(k));
        w.apply(answer);
        w.assert_matches(&c);
        assert_eq!(c.top_k_generation(), generation);
    }
    // The whole view is held: nothing more to send in this round.
    let quiet = c.node_view(&w.node, version, Vec::new());
    assert!(quiet.view.entries.is_empty());
    assert!(quiet.issuer_keys.as_ref().is_none_or(Vec::is_empty));
    for n in &view {
        assert!(
            w.scheduler.view().directory.iter().any(|e| &e.node_id == n),
            "{n} held"
        );
    }
}

//! The coordinator core's cost per heartbeat at 1,000, 5,000 and 10,000 nodes (issue 17): the
//! `CoordinatorState` calls the live coordinator actor makes for one heartbeat (`screen_report`,
//! `heartbeat`, `report_issued`, `round` — recomputed once per heartbeat interval —,
//! `outstanding_elsewhere`, `node_view` at the node's current directory version and
//! `take_notices_for`), with a token master key as in production, and the same core calls the
//! simulator makes. No I/O: `testbed fleet` measures the whole process around it, and the
//! difference is QUIC, TLS, framing, decoding and the actors.
//!
//! `cargo bench -p scheduler-core --bench coordinator_heartbeat`; prints, per cluster size, the
//! median of 5 rounds of 3 heartbeat intervals (every node heartbeats once per interval) of ns
//! per heartbeat, the cost of one whole-directory answer (all entries and issuer keys: what a
//! node is sent at its join, or when its version is older than the change log), and of one delta
//! answer after 1% of the nodes re-joined in a round (what every node is sent once per round
//! with membership changes, issue 17).

use rand::SeedableRng;
use rand::rngs::StdRng;
use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState};
use scheduler_core::distributed::NodeDirectoryEntry;
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::token::TokenKey;
use scheduler_core::{ContainerId, NodeId, Resources, Time};
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;
const INTERVALS: u64 = 3;

fn state(nodes: usize) -> (CoordinatorState, Vec<NodeId>) {
    let mut c = CoordinatorState::new(CoordinatorConfig::default(), 1);
    c.set_token_master(TokenKey::from_bytes(1, [7; 32]))
        .expect("a 32-byte key");
    let ids: Vec<NodeId> = (0..nodes)
        .map(|i| NodeId::new(format!("fleet-{i:05}")))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        c.join(
            Time::ZERO,
            NodeDirectoryEntry {
                node_id: id.clone(),
                rack: format!("rack-{}", i % 40),
                capacity: Resources::new(4000, 4096),
                app_endpoint: format!("tcp://127.0.0.1:{}", 20000 + i),
            },
        );
    }
    (c, ids)
}

fn main() {
    let interval = Duration::from_secs(1);
    for nodes in [1_000usize, 5_000, 10_000] {
        let (mut c, ids) = state(nodes);
        let version = c.directory_version();
        let mut rng = StdRng::seed_from_u64(1);
        let mut per_heartbeat = Vec::with_capacity(ROUNDS);
        let mut now = Time::ZERO;
        for _ in 0..ROUNDS {
            let start = Instant::now();
            for interval_no in 0..INTERVALS {
                for (i, id) in ids.iter().enumerate() {
                    // Heartbeats spread over the interval, as real nodes' phases are.
                    now = Time::from_micros(
                        now.as_micros()
                            .max((interval_no * 1_000_000) + (i as u64 * 1_000_000 / nodes as u64)),
                    );
                    let containers: Vec<ContainerId> = (0..4)
                        .map(|k| ContainerId::new(i as u32 + 1, interval_no * 4 + k))
                        .collect();
                    let mut statuses = Vec::new();
                    let mut started = Vec::new();
                    c.screen_report(id, &mut statuses, &mut started);
                    let load = QueueDelay {
                        tq_ms: ((i as u64 * 37 + interval_no * 11) % 400) as f64,
                        tr_ms: 0.0,
                        tl_ms: 0.0,
                    };
                    c.heartbeat(now, id, load, containers);
                    c.report_issued(id, Vec::new());
                    c.round(now, interval, &mut rng);
                    let round = c.aggregate_round();
                    black_box(round.shedding_target_for(id));
                    let elsewhere = c.outstanding_elsewhere(id, round);
                    let top_k = round.top_k.clone();
                    let view = c.node_view(id, version, top_k);
                    let notices = c.take_notices_for(id);
                    black_box((elsewhere, view, notices));
                }
            }
            let heartbeats = INTERVALS as f64 * nodes as f64;
            per_heartbeat.push(start.elapsed().as_nanos() as f64 / heartbeats);
            now = Time::from_micros(now.as_micros() + 1);
        }
        per_heartbeat.sort_by(f64::total_cmp);
        // One whole-directory answer: what a node is sent at its join.
        let start = Instant::now();
        let view = c.node_view(&ids[0], 0, Vec::new());
        let directory_us = start.elapsed().as_secs_f64() * 1e6;
        black_box(&view);
        // 1% of the nodes re-join in one round: one new version, one delta per node.
        let before = c.directory_version();
        let rejoining = nodes / 100;
        for (i, id) in ids.iter().enumerate().take(rejoining) {
            c.join(
                now,
                NodeDirectoryEntry {
                    node_id: id.clone(),
                    rack: format!("rack-{}", i % 40),
                    capacity: Resources::new(4000, 4096),
                    app_endpoint: format!("tcp://127.0.0.1:{}", 20000 + i),
                },
            );
        }
        now = Time::from_micros(now.as_micros() + interval.as_micros() as u64);
        c.round(now, interval, &mut rng);
        let start = Instant::now();
        let delta = c.node_view(&ids[nodes - 1], before, Vec::new());
        let delta_us = start.elapsed().as_secs_f64() * 1e6;
        let delta_entries = delta.view.delta.as_ref().map_or(0, |d| d.joined.len());
        black_box(&delta);
        println!(
            "{nodes:>6} nodes: {:>8.0} ns per heartbeat (median of {ROUNDS}); one whole-directory answer ({} entries, {} issuer keys) {:.0} µs; one delta answer ({} entries, {} keys) {:.0} µs",
            per_heartbeat[ROUNDS / 2],
            view.view.directory.len(),
            view.issuer_keys.as_ref().map_or(0, Vec::len),
            directory_us,
            delta_entries,
            delta.issuer_keys.as_ref().map_or(0, Vec::len),
            delta_us,
        );
    }
}

//! The coordinator's cost per heartbeat at 1,000, 5,000 and 10,000 nodes (issue 17), without
//! I/O, in the three parts the live coordinator spends it on between QUIC and QUIC:
//!
//! - decode: the worker's `heartbeat` frame (4 QUEUEABLE container statuses, one started and one
//!   finished, as `testbed fleet` sends) from msgpack, as the session task does;
//! - core: the `CoordinatorState` calls the coordinator actor makes for one heartbeat
//!   (`screen_report`, `heartbeat`, `report_issued`, `round` — recomputed once per heartbeat
//!   interval —, `outstanding_elsewhere`, `node_view` at the node's current directory version
//!   and `take_notices_for`), with a token master key as in production, and the same core calls
//!   the simulator makes;
//! - encode: the `heartbeat_ack` frame, as the session's writer does: the round's top-k
//!   (`view_size(50)` = 200 entries) encoded once per round and shared
//!   (`encode_heartbeat_ack_frame_into`), and for comparison per heartbeat (the list cloned into
//!   the answer and the whole answer encoded, as before issue 17's change).
//!
//! `testbed fleet` measures the whole coordinator process around it; the difference is QUIC and
//! TLS (quinn, rustls), the tokio/actix tasks and the actor hop to the guarantor.
//!
//! `cargo bench --workspace --bench coordinator_heartbeat`; prints, per cluster size, the median
//! of 5 rounds of 3 heartbeat intervals (every node heartbeats once per interval) of ns per
//! heartbeat and per part, the answer's size, the cost of one whole-directory answer (all
//! entries and the top-k's issuer keys: what a node is sent at its join, or when its version is
//! older than the change log; and, for comparison, deriving a key for every node as protocol 5
//! did), and of one delta answer after 1% of the nodes re-joined in a round (what
//! every node is sent once per round with membership changes, issue 17).

use rand::SeedableRng;
use rand::rngs::StdRng;
use scheduler_core::codec::{CLUSTER_MAX_FRAME, encode_frame_into, from_payload, to_payload};
use scheduler_core::coordinator::{CoordinatorConfig, CoordinatorState, NodeView};
use scheduler_core::distributed::{NodeDirectoryEntry, view_size};
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::protocol::cluster::{
    CoordinatorToWorker, EncodedTopK, Heartbeat, HeartbeatAck, WorkerToCoordinator,
    encode_heartbeat_ack_frame_into,
};
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::token::TokenKey;
use scheduler_core::{AppId, ContainerId, ContainerType, NodeId, Resources, Time};
use std::hint::black_box;
use std::time::{Duration, Instant};

const ROUNDS: usize = 5;
const INTERVALS: u64 = 3;

fn state(nodes: usize) -> (CoordinatorState, Vec<NodeId>) {
    // Views carry view_size(k) candidates, as the live coordinator's (k = 50).
    let config = CoordinatorConfig {
        top_k: view_size(50),
        ..CoordinatorConfig::default()
    };
    let mut c = CoordinatorState::new(config, 1);
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
                slot: 0,
            },
        );
    }
    (c, ids)
}

/// The heartbeat `testbed fleet`'s node `i` sends in interval `interval_no`, as a payload.
fn heartbeat_payload(id: &NodeId, i: usize, interval_no: u64, app: &AppId) -> Vec<u8> {
    let issuer = i as u32 + 1;
    let containers: Vec<ContainerStatus> = (0..4)
        .map(|k| ContainerStatus {
            id: ContainerId::new(issuer, interval_no * 4 + k),
            app_id: app.clone(),
            container_type: ContainerType::Queueable,
            resources: Resources::new(250, 256),
            placement: Placement::Running,
            version: 1,
            job: None,
            usage: None,
            grant_token: None,
        })
        .collect();
    let hb = WorkerToCoordinator::Heartbeat(Heartbeat {
        node_id: id.clone(),
        directory_version: 0,
        queue_delay: QueueDelay {
            tq_ms: ((i as u64 * 37 + interval_no * 11) % 400) as f64,
            tr_ms: 0.0,
            tl_ms: 0.0,
        },
        running: 4,
        queued: 0,
        allocated: Resources::new(1000, 1024),
        usage: None,
        started: vec![containers[3].id],
        finished: vec![ContainerId::new(issuer, interval_no * 4 + 100)],
        containers,
        issued: Vec::new(),
    });
    to_payload(&hb).expect("a heartbeat encodes")
}

/// Nanoseconds per heartbeat of each part, over one measured round.
#[derive(Default, Clone, Copy)]
struct Parts {
    decode: f64,
    core: f64,
    encode_shared: f64,
    encode_per_heartbeat: f64,
    answer_bytes: usize,
}

fn main() {
    let interval = Duration::from_secs(1);
    let app = AppId::new("fleet-app");
    for nodes in [1_000usize, 5_000, 10_000] {
        let (mut c, ids) = state(nodes);
        let mut rng = StdRng::seed_from_u64(1);
        let mut per_heartbeat = Vec::with_capacity(ROUNDS);
        let mut parts = Vec::with_capacity(ROUNDS);
        let mut now = Time::ZERO;
        let mut shared: Option<(u64, EncodedTopK)> = None;
        let mut out = Vec::new();
        for _ in 0..ROUNDS {
            let (mut decode, mut core, mut encode_shared, mut encode_old) = (
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
            );
            let mut answer_bytes = 0;
            for interval_no in 0..INTERVALS {
                // What the workers send is made outside the timings.
                let payloads: Vec<Vec<u8>> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, id)| heartbeat_payload(id, i, interval_no, &app))
                    .collect();
                for (i, id) in ids.iter().enumerate() {
                    // Heartbeats spread over the interval, as real nodes' phases are.
                    now = Time::from_micros(
                        now.as_micros()
                            .max((interval_no * 1_000_000) + (i as u64 * 1_000_000 / nodes as u64)),
                    );
                    let t0 = Instant::now();
                    let Ok(WorkerToCoordinator::Heartbeat(mut hb)) =
                        from_payload::<WorkerToCoordinator>(&payloads[i])
                    else {
                        panic!("a heartbeat decodes");
                    };
                    let t1 = Instant::now();
                    c.screen_report(id, &mut hb.containers, &mut hb.started);
                    let containers: Vec<ContainerId> = hb.containers.iter().map(|s| s.id).collect();
                    c.heartbeat(now, id, hb.queue_delay, containers);
                    c.report_issued(id, std::mem::take(&mut hb.issued));
                    c.round(now, interval, &mut rng);
                    let round = c.aggregate_round();
                    let shedding = round.shedding_target_for(id);
                    let elsewhere = c.outstanding_elsewhere(id, round);
                    // The node is at the published version (its joins' delta went out with its
                    // first answer), so the answer carries no membership.
                    let version = c.directory_version();
                    let NodeView { view, issuer_keys } = c.node_view(id, version, Vec::new());
                    let notices = c.take_notices_for(id);
                    let ack = HeartbeatAck {
                        view,
                        shedding_threshold_ms: shedding,
                        queueable_limit: Resources::new(4000, 4096),
                        notices,
                        issuer_keys,
                        guaranteed_keys: None,
                        apps: None,
                        top_k: None,
                        outstanding_elsewhere: elsewhere,
                    };
                    let t2 = Instant::now();
                    // As the live coordinator: the list encoded when it changed, then shared.
                    let generation = c.top_k_generation();
                    if shared.as_ref().is_none_or(|(g, _)| *g != generation) {
                        let encoded = EncodedTopK::encode(&c.aggregate_round().top_k_on_wire())
                            .expect("a top-k encodes");
                        shared = Some((generation, encoded));
                    }
                    let (_, top_k) = shared.as_ref().expect("set above");
                    out.clear();
                    encode_heartbeat_ack_frame_into(&ack, top_k, None, CLUSTER_MAX_FRAME, &mut out)
                        .expect("an answer encodes");
                    black_box(&out);
                    let t3 = Instant::now();
                    answer_bytes = out.len();
                    // Before: the list cloned into every answer and encoded with it.
                    let mut whole = ack;
                    whole.view.top_k_slots = c.aggregate_round().top_k_on_wire();
                    out.clear();
                    encode_frame_into(
                        &CoordinatorToWorker::HeartbeatAck(whole),
                        CLUSTER_MAX_FRAME,
                        &mut out,
                    )
                    .expect("an answer encodes");
                    black_box(&out);
                    let t4 = Instant::now();
                    decode += t1 - t0;
                    core += t2 - t1;
                    encode_shared += t3 - t2;
                    encode_old += t4 - t3;
                }
            }
            let heartbeats = INTERVALS as f64 * nodes as f64;
            let ns = |d: Duration| d.as_nanos() as f64 / heartbeats;
            per_heartbeat.push(ns(decode + core + encode_shared));
            parts.push(Parts {
                decode: ns(decode),
                core: ns(core),
                encode_shared: ns(encode_shared),
                encode_per_heartbeat: ns(encode_old),
                answer_bytes,
            });
            now = Time::from_micros(now.as_micros() + 1);
        }
        // The parts of the median round.
        let median_round = {
            let mut order: Vec<usize> = (0..ROUNDS).collect();
            order.sort_by(|&a, &b| per_heartbeat[a].total_cmp(&per_heartbeat[b]));
            parts[order[ROUNDS / 2]]
        };
        per_heartbeat.sort_by(f64::total_cmp);
        // One whole-directory answer: what a node is sent at its join.
        let start = Instant::now();
        let view = c.node_view(&ids[0], 0, Vec::new());
        let directory_us = start.elapsed().as_secs_f64() * 1e6;
        black_box(&view);
        // What protocol 5 added to it: a key for every node, not only the top-k's.
        let issuer = c.issuer_of(&ids[0]).expect("joined");
        let start = Instant::now();
        for id in &ids {
            black_box(c.issuer_key_for(issuer, id));
        }
        let all_keys_us = start.elapsed().as_secs_f64() * 1e6;
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
                    slot: 0,
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
            "{nodes:>6} nodes: {:>6.0} ns per heartbeat (median of {ROUNDS}) = decode {:.0} + core {:.0} + encode {:.0} (top-k shared; encoded per heartbeat instead: {:.0}); answer {} bytes",
            per_heartbeat[ROUNDS / 2],
            median_round.decode,
            median_round.core,
            median_round.encode_shared,
            median_round.encode_per_heartbeat,
            median_round.answer_bytes,
        );
        println!(
            "{nodes:>6} nodes: one whole-directory answer ({} entries, {} issuer keys) {:.0} µs (protocol 5's key per node: +{:.0} µs); one delta answer ({} entries, {} keys) {:.0} µs",
            view.view.directory.len(),
            view.issuer_keys.as_ref().map_or(0, Vec::len),
            directory_us,
            all_keys_us,
            delta_entries,
            delta.issuer_keys.as_ref().map_or(0, Vec::len),
            delta_us,
        );
    }
}

//! `testbed fleet`: one real coordinator process against N lightweight nodes in this process.
//!
//! Each node is the worker's own cluster-side session ([`worker::link::join_cluster`],
//! [`worker::link::read_frame`], [`worker::link::write_frame`]: real QUIC with TLS, the real
//! join token, the same frames) without a node runtime: it reports a few synthetic QUEUEABLE
//! containers (no processes; one of them replaced every heartbeat, so notices flow), a queue
//! delay that varies by node and round, and keeps the directory version it was last sent, as a
//! worker does. Sessions share a few QUIC client endpoints (a quinn endpoint multiplexes any
//! number of connections over its one UDP socket), so 10,000 nodes need a handful of sockets.
//!
//! What it measures (issue 17): the coordinator's CPU per heartbeat (utime + stime of its
//! process from `/proc/PID/stat` over a window in which every node heartbeats at the configured
//! period), its resident memory per node, GUARANTEED allocate latency (asks forwarded over a
//! node's session as a worker forwards an application's ask, answered by the guarantor, timed
//! here from write to answer) and the time to detect lost nodes (sessions stopped; time until
//! live nodes' heartbeat answers have listed every one of them as left, or carried a whole
//! directory without them). This process's own CPU is
//! reported separately: on a 2-core machine it competes with the coordinator.

use crate::local::{LocalArgs, LocalCluster};
use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use rand::{RngExt, SeedableRng};
use scheduler_core::codec::{CLUSTER_MAX_FRAME, FrameDecoder, encode_frame_into};
use scheduler_core::liveness::{
    LinkLiveness, REJOIN_BACKOFF_START, jittered_rejoin_delay, next_rejoin_backoff,
};
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::protocol::app::Allocate;
use scheduler_core::protocol::cluster::{
    AllocateGuaranteed, GuaranteedAllocated, Heartbeat, ReleaseContainer, RequestFailed,
    WorkerToCoordinator,
};
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::{AppId, ContainerId, ContainerType, NodeId, Resources, Time};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use worker::link::{Identity, JoinError, JoinedSession, join_cluster, write_frame};

/// Options of `testbed fleet`.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// Number of lightweight nodes.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Heartbeat period the coordinator is started with (and the nodes keep).
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// Length of the measurement window, after every node joined and the directory settled.
    #[arg(long, default_value_t = 20)]
    pub duration_s: u64,
    /// A node silent this long is declared lost by the coordinator.
    #[arg(long, default_value_t = 3000)]
    pub node_timeout_ms: u64,
    /// Nodes stopped after the window to time lost-node detection (0: skip).
    #[arg(long, default_value_t = 10)]
    pub lose: usize,
    /// GUARANTEED asks per second during the window, each from a random live node.
    #[arg(long, default_value_t = 20.0)]
    pub allocate_per_s: f64,
    /// Synthetic QUEUEABLE containers each node reports.
    #[arg(long, default_value_t = 4)]
    pub containers_per_node: usize,
    /// Sessions per QUIC client endpoint (UDP socket).
    #[arg(long, default_value_t = 1000)]
    pub sessions_per_endpoint: usize,
    /// Joins started per second (a ramp, so the handshakes do not all land at once).
    #[arg(long, default_value_t = 1000.0)]
    pub joins_per_s: f64,
    /// Worker threads of this process's runtime.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Give up if the fleet has not joined (or the directory not settled) within this.
    #[arg(long, default_value_t = 600)]
    pub ready_timeout_s: u64,
    /// After the window, stop the coordinator process (SIGSTOP) for this long and time the
    /// fleet's recovery (0: skip). Nodes give a link up as real workers do (ten heartbeat
    /// intervals without a frame, floor 6 s, or the connection closed) and re-join with the
    /// worker's backoff.
    #[arg(long, default_value_t = 0)]
    pub pause_coordinator_ms: u64,
    /// Data dir of the coordinator [default: a fresh temporary dir].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Seed of the nodes' synthetic load and of the choice of asking nodes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl Default for FleetArgs {
    fn default() -> Self {
        FleetArgs {
            nodes: 1000,
            heartbeat_ms: 1000,
            duration_s: 20,
            node_timeout_ms: 3000,
            lose: 10,
            allocate_per_s: 20.0,
            containers_per_node: 4,
            sessions_per_endpoint: 1000,
            joins_per_s: 1000.0,
            threads: 1,
            ready_timeout_s: 600,
            pause_coordinator_ms: 0,
            data_dir: None,
            seed: 1,
            json: false,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    pub nodes: usize,
    pub heartbeat_ms: u64,
    pub joined: u64,
    /// From the first join started until every node had joined.
    pub join_s: f64,
    /// From the last join until a whole heartbeat period passed without a directory being sent.
    pub settle_s: f64,
    pub window_s: f64,
    /// Heartbeat answers received by the fleet in the window (each is one heartbeat the
    /// coordinator handled).
    pub heartbeats_answered: u64,
    /// QUEUEABLE issuer keys per heartbeat answer in the window: a scheduler is sent the key of
    /// each node session the first time the top-k names it, so this is high until every node's
    /// scheduler holds the keys of the nodes the lists rotate through, then falls to ~0.
    pub issuer_keys_per_heartbeat: f64,
    pub coordinator: ProcessCost,
    pub fleet: ProcessCost,
    /// Coordinator resident memory before any node joined and at the end of the window.
    pub coordinator_rss_base_mib: f64,
    pub coordinator_rss_mib: f64,
    pub coordinator_rss_per_node_kib: f64,
    /// Heartbeat answers that carried the whole directory, and their entries, over the run
    /// (a node whose directory version is unknown or older than the coordinator's change log).
    pub directory_answers: u64,
    pub directory_entries: u64,
    /// Heartbeat answers that carried membership changes (a delta), and their joined and left
    /// entries, over the run.
    pub delta_answers: u64,
    pub delta_entries: u64,
    /// Directory entries sent with the views' keys (cluster protocol 9: a scheduler is sent the
    /// entry of each node its views name once per session), join answers included.
    pub view_entries: u64,
    /// QUIC traffic per heartbeat answered in the window, as the nodes' connections counted it
    /// (what the nodes received is what the coordinator sent).
    pub quic: QuicPerHeartbeat,
    pub allocate: AllocateFigures,
    pub lost: LostFigures,
    /// The coordinator paused and resumed (`--pause-coordinator-ms`).
    pub pause: Option<PauseFigures>,
    /// Sessions that ended and re-joined over the run (a link declared dead, or closed).
    pub rejoins: u64,
    pub join_answers: JoinAnswerFigures,
    /// The coordinator's own counters at the end (`GET /metrics`).
    pub coordinator_nodes_joined: Option<u64>,
    pub coordinator_nodes_lost: Option<u64>,
    pub coordinator_heartbeats: Option<u64>,
}

/// CPU of one process over the window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProcessCost {
    pub cpu_s: f64,
    /// Share of one core busy over the window.
    pub core_fraction: f64,
    /// CPU per heartbeat answered in the window.
    pub cpu_us_per_heartbeat: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct QuicPerHeartbeat {
    pub coordinator_datagrams_sent: f64,
    pub coordinator_bytes_sent: f64,
    pub coordinator_datagrams_received: f64,
    pub coordinator_bytes_received: f64,
    /// ACK frames the nodes sent (each in a datagram of its own unless a heartbeat or a request
    /// carried it).
    pub node_ack_frames_sent: f64,
    /// Keep-alive PING frames the nodes sent: each is a packet the coordinator must receive and
    /// acknowledge, though the heartbeats already keep the connection alive.
    pub node_ping_frames_sent: f64,
    /// PING frames the coordinator sent.
    pub coordinator_ping_frames_sent: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AllocateFigures {
    pub asked: u64,
    pub granted: u64,
    pub failed: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    /// The same asks' time inside the coordinator (decoded → first grant queued), from its
    /// `coordinator_guaranteed_grant_seconds` histogram at the end; the rest of the latency
    /// above is the transport and this driver.
    pub in_coordinator: Option<HistogramFigures>,
}

/// A Prometheus histogram of seconds, read from a text exposition: its count and mean, and for
/// p50 and p99 the upper bound of the bucket the quantile falls in.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HistogramFigures {
    pub count: u64,
    pub mean_us: f64,
    pub p50_at_most_us: f64,
    pub p99_at_most_us: f64,
}

/// The nodes' joins as they saw them: answers received whole (the first of each session that
/// joined) and attempts given up (no answer, a closed stream, a stalled answer) and retried.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JoinAnswerFigures {
    pub answered: u64,
    pub attempts_given_up: u64,
    /// Mean bytes of an answer (it carries the whole directory: O(nodes)).
    pub bytes_mean: f64,
    /// From the join written to its answer whole.
    pub wait_p50_ms: u64,
    pub wait_p99_ms: u64,
    pub wait_max_ms: u64,
    /// Answers that took longer than the 5 s after which a worker used to give the join up.
    pub slower_than_5_s: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LostFigures {
    pub stopped: usize,
    /// From stopping the sessions until a live node was sent a directory without any of them;
    /// `None` if that did not happen within three node timeouts plus the ready timeout.
    pub detect_ms: Option<u64>,
    pub node_timeout_ms: u64,
}

/// The coordinator stopped for a while and resumed: how the fleet came back.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PauseFigures {
    pub paused_ms: u64,
    /// Sessions that gave their link up (silent past the give-up limit) or saw it closed,
    /// from the pause until recovery.
    pub links_ended: u64,
    /// Of those, re-joined (a whole join each).
    pub rejoined: u64,
    /// Join attempts given up and retried meanwhile.
    pub join_attempts_given_up: u64,
    /// From the resume until every node had been answered by the resumed coordinator and
    /// was connected; `None` if that did not happen within the ready timeout.
    pub recovered_s: Option<f64>,
    /// Nodes answered after the resume, when the wait ended.
    pub answered_after_resume: u64,
    /// Nodes the coordinator declared lost from the pause until two node timeouts after
    /// recovery (`coordinator_nodes_lost_total`).
    pub nodes_lost: Option<u64>,
    /// Checks at which the coordinator found it had not been listening
    /// (`coordinator_own_stalls_total`, over the same span).
    pub own_stalls: Option<u64>,
    /// Graces of the coordinator's loss guard extended by nodes re-joining within them
    /// (`coordinator_loss_grace_extensions_total`, over the same span).
    pub loss_grace_extensions: Option<u64>,
}

/// What the sessions share with the driver.
#[derive(Default)]
struct FleetShared {
    /// Sessions that joined the first time (re-joins are counted in `rejoined`).
    joined: AtomicU64,
    rejoined: AtomicU64,
    /// Sessions joined and not ended now.
    connected: AtomicU64,
    /// Sessions that ended otherwise than by a stop: the link declared dead or closed.
    links_ended: AtomicU64,
    /// Bumped when the coordinator resumes; a node counts itself in `answered_after_resume`
    /// at its first answer after each bump.
    resume_generation: AtomicU64,
    answered_after_resume: AtomicU64,
    acks: AtomicU64,
    /// QUEUEABLE issuer keys the answers carried.
    issuer_keys: AtomicU64,
    directory_answers: AtomicU64,
    directory_entries: AtomicU64,
    delta_answers: AtomicU64,
    delta_entries: AtomicU64,
    view_entries: AtomicU64,
    last_directory_at_us: AtomicU64,
    granted: AtomicU64,
    failed: AtomicU64,
    latencies: Mutex<Option<Histogram<u64>>>,
    /// Join answers' wait in ms, their bytes in all, and join attempts given up.
    join_waits: Mutex<Option<Histogram<u64>>>,
    join_answer_bytes: AtomicU64,
    joins_given_up: AtomicU64,
    /// Stopped nodes and when, for lost-node detection; a node is taken out of the set when
    /// a delta lists it as left.
    stopped: Mutex<Option<(Instant, HashSet<NodeId>)>>,
    lost_seen_us: AtomicU64,
    lost_seen: AtomicBool,
    fatal: Mutex<Option<String>>,
    quic: [QuicTotals; 2],
}

enum Command {
    Allocate {
        correlation_id: u64,
    },
    /// Add the connection's QUIC counters to `FleetShared::quic[i]` (0: window start, 1: end).
    AddQuicStats(usize),
    Stop,
}

/// The nodes' QUIC counters summed over their connections at one moment.
#[derive(Default)]
struct QuicTotals {
    reported: AtomicU64,
    datagrams_rx: AtomicU64,
    bytes_rx: AtomicU64,
    datagrams_tx: AtomicU64,
    bytes_tx: AtomicU64,
    ack_frames_tx: AtomicU64,
    ping_frames_tx: AtomicU64,
    ping_frames_rx: AtomicU64,
}

impl QuicTotals {
    fn add(&self, s: &quinn::ConnectionStats) {
        self.datagrams_rx
            .fetch_add(s.udp_rx.datagrams, Ordering::Relaxed);
        self.bytes_rx.fetch_add(s.udp_rx.bytes, Ordering::Relaxed);
        self.datagrams_tx
            .fetch_add(s.udp_tx.datagrams, Ordering::Relaxed);
        self.bytes_tx.fetch_add(s.udp_tx.bytes, Ordering::Relaxed);
        self.ack_frames_tx
            .fetch_add(s.frame_tx.acks, Ordering::Relaxed);
        self.ping_frames_tx
            .fetch_add(s.frame_tx.ping, Ordering::Relaxed);
        self.ping_frames_rx
            .fetch_add(s.frame_rx.ping, Ordering::Relaxed);
        self.reported.fetch_add(1, Ordering::Release);
    }
}

struct SessionPlan {
    index: usize,
    identity: Identity,
    app_id: AppId,
    containers_per_node: usize,
    start_at: tokio::time::Instant,
    epoch: Instant,
}

/// How often a fleet that is still joining says how far it got.
const PROGRESS_PERIOD: Duration = Duration::from_secs(10);

/// Run `testbed fleet` and print its report.
pub fn run(args: &FleetArgs) -> anyhow::Result<()> {
    let report = measure(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(r: &FleetReport) {
    println!(
        "fleet: {} nodes, {} ms heartbeats, joined {} in {:.1} s, settled {:.1} s",
        r.nodes, r.heartbeat_ms, r.joined, r.join_s, r.settle_s
    );
    println!(
        "window {:.1} s, {} heartbeats answered, {:.1} issuer keys per answer",
        r.window_s, r.heartbeats_answered, r.issuer_keys_per_heartbeat
    );
    for (name, c) in [("coordinator", &r.coordinator), ("fleet", &r.fleet)] {
        println!(
            "{name}: {:.2} s CPU, {:.1}% of one core, {:.1} µs per heartbeat",
            c.cpu_s,
            100.0 * c.core_fraction,
            c.cpu_us_per_heartbeat
        );
    }
    println!(
        "coordinator RSS {:.1} MiB (base {:.1}), {:.1} KiB per node",
        r.coordinator_rss_mib, r.coordinator_rss_base_mib, r.coordinator_rss_per_node_kib
    );
    let j = &r.join_answers;
    println!(
        "join answers: {} whole ({:.0} bytes on average), wait p50 {} ms, p99 {} ms, max {} ms, {} over 5 s; {} attempts given up",
        j.answered,
        j.bytes_mean,
        j.wait_p50_ms,
        j.wait_p99_ms,
        j.wait_max_ms,
        j.slower_than_5_s,
        j.attempts_given_up
    );
    println!(
        "GUARANTEED allocate: {} asked, {} granted, {} failed, p50 {} µs, p99 {} µs, max {} µs",
        r.allocate.asked,
        r.allocate.granted,
        r.allocate.failed,
        r.allocate.p50_us,
        r.allocate.p99_us,
        r.allocate.max_us
    );
    if let Some(h) = &r.allocate.in_coordinator {
        println!(
            "  of which inside the coordinator: {} asks, mean {:.0} µs, p50 ≤ {:.0} µs, p99 ≤ {:.0} µs",
            h.count, h.mean_us, h.p50_at_most_us, h.p99_at_most_us
        );
    }
    println!(
        "QUIC per heartbeat: coordinator sent {:.1} datagrams ({:.0} bytes), received {:.1} ({:.0} bytes); nodes sent {:.2} ACK frames and {:.3} keep-alive PINGs, the coordinator {:.3} PINGs",
        r.quic.coordinator_datagrams_sent,
        r.quic.coordinator_bytes_sent,
        r.quic.coordinator_datagrams_received,
        r.quic.coordinator_bytes_received,
        r.quic.node_ack_frames_sent,
        r.quic.node_ping_frames_sent,
        r.quic.coordinator_ping_frames_sent
    );
    if let Some(p) = &r.pause {
        println!(
            "coordinator paused {} ms: {} links ended, {} re-joined, {} join attempts given up; every node answered again after {:?} s ({} answered); {:?} nodes declared lost, {:?} own stalls, {:?} loss-guard grace extensions",
            p.paused_ms,
            p.links_ended,
            p.rejoined,
            p.join_attempts_given_up,
            p.recovered_s,
            p.answered_after_resume,
            p.nodes_lost,
            p.own_stalls,
            p.loss_grace_extensions
        );
    }
    println!(
        "lost: {} stopped, detected after {:?} ms (node timeout {} ms)",
        r.lost.stopped, r.lost.detect_ms, r.lost.node_timeout_ms
    );
    println!(
        "whole-directory answers {} ({} entries), delta answers {} ({} entries), view entries {}; coordinator counters: joined {:?}, lost {:?}, heartbeats {:?}",
        r.directory_answers,
        r.directory_entries,
        r.delta_answers,
        r.delta_entries,
        r.view_entries,
        r.coordinator_nodes_joined,
        r.coordinator_nodes_lost,
        r.coordinator_heartbeats
    );
}

/// Start the coordinator, run the fleet against it, and measure.
pub fn measure(args: &FleetArgs) -> anyhow::Result<FleetReport> {
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if args.lose >= args.nodes {
        bail!(
            "--lose ({}) must be below --nodes ({}): a live node observes the loss",
            args.lose,
            args.nodes
        );
    }
    if args.heartbeat_ms == 0 || args.sessions_per_endpoint == 0 || args.threads == 0 {
        bail!("--heartbeat-ms, --sessions-per-endpoint and --threads must be positive");
    }
    if !(args.joins_per_s > 0.0 && args.allocate_per_s >= 0.0) {
        bail!("--joins-per-s must be positive and --allocate-per-s not negative");
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let local = LocalArgs {
        workers: 0,
        data_dir: args.data_dir.clone(),
        heartbeat_interval_ms: args.heartbeat_ms,
        node_timeout_ms: args.node_timeout_ms,
        ..LocalArgs::default()
    };
    let mut cluster = LocalCluster::start_coordinator(&local)?;
    let pid = cluster
        .pid("coordinator")
        .context("the coordinator has no pid")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;
    let result = rt.block_on(drive(args, &cluster, pid));
    rt.shutdown_timeout(Duration::from_secs(2));
    cluster.stop();
    result
}

async fn drive(args: &FleetArgs, cluster: &LocalCluster, pid: u32) -> anyhow::Result<FleetReport> {
    let rss_base = rss_mib(pid)?;
    let coord_dir = cluster.data_dir.join("coordinator");
    let join_token = std::fs::read_to_string(coord_dir.join("join-token"))
        .context("reading the join token")?
        .trim()
        .to_string();
    let client = worker::link::client_config(&cluster.ca_cert)?;
    let shared = Arc::new(FleetShared {
        latencies: Mutex::new(Some(Histogram::new(3)?)),
        join_waits: Mutex::new(Some(Histogram::new(3)?)),
        ..FleetShared::default()
    });
    let epoch = Instant::now();
    let mut endpoints = Vec::new();
    let mut commands = Vec::with_capacity(args.nodes);
    let mut tasks = Vec::with_capacity(args.nodes);
    let start = tokio::time::Instant::now();
    for index in 0..args.nodes {
        if index % args.sessions_per_endpoint == 0 {
            let mut e = quinn::Endpoint::client("127.0.0.1:0".parse().expect("literal"))
                .context("opening a QUIC client endpoint")?;
            e.set_default_client_config(client.clone());
            endpoints.push(e);
        }
        let endpoint = endpoints.last().expect("pushed above").clone();
        let (tx, rx) = mpsc::unbounded_channel();
        commands.push(tx);
        let plan = SessionPlan {
            index,
            identity: Identity {
                node_id: NodeId::new(format!("fleet-{index:05}")),
                rack: format!("rack-{}", index % 40),
                attributes: Default::default(),
                capacity: Resources::new(4000, 4096),
                app_endpoint: format!("tcp://127.0.0.1:{}", 20000 + index % 40000),
                join_token: join_token.clone(),
                coordinator: cluster.coordinator.clone(),
            },
            app_id: AppId::new(cluster.app_id.clone()),
            containers_per_node: args.containers_per_node,
            start_at: start + Duration::from_secs_f64(index as f64 / args.joins_per_s),
            epoch,
        };
        tasks.push(tokio::spawn(session(
            plan,
            endpoint,
            rx,
            shared.clone(),
            Duration::from_millis(args.heartbeat_ms),
            args.seed,
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(args.ready_timeout_s);
    let fail = |what: &str| -> anyhow::Error {
        let fatal = shared
            .fatal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        anyhow::anyhow!(
            "{what} within {} s ({} of {} joined){}",
            args.ready_timeout_s,
            shared.joined.load(Ordering::Relaxed),
            args.nodes,
            fatal
                .map(|f| format!("; a session failed: {f}"))
                .unwrap_or_default()
        )
    };
    // Progress on stderr, so a run that does not finish shows which phase it is in.
    let mut progress_at = Instant::now() + PROGRESS_PERIOD;
    while shared.joined.load(Ordering::Relaxed) < args.nodes as u64 {
        if Instant::now() > deadline {
            return Err(fail("the fleet did not join"));
        }
        if Instant::now() > progress_at {
            progress_at += PROGRESS_PERIOD;
            eprintln!(
                "fleet: {} of {} nodes joined after {:.0} s ({} links ended, {} re-joined, {} join attempts given up)",
                shared.joined.load(Ordering::Relaxed),
                args.nodes,
                start.elapsed().as_secs_f64(),
                shared.links_ended.load(Ordering::Relaxed),
                shared.rejoined.load(Ordering::Relaxed),
                shared.joins_given_up.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let join_s = start.elapsed().as_secs_f64();
    eprintln!(
        "fleet: all {} nodes joined in {join_s:.1} s; waiting for the directory to settle",
        args.nodes
    );
    // Settled: a whole heartbeat period (plus slack) without a directory answer.
    let hb = Duration::from_millis(args.heartbeat_ms);
    let quiet = hb + hb / 2;
    loop {
        let last = Duration::from_micros(shared.last_directory_at_us.load(Ordering::Relaxed));
        if epoch.elapsed().saturating_sub(last) > quiet {
            break;
        }
        if Instant::now() > deadline {
            return Err(fail("the directory did not settle"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let settle_s = start.elapsed().as_secs_f64() - join_s;
    eprintln!(
        "fleet: settled after {settle_s:.1} s; measuring for {} s",
        args.duration_s
    );

    // The window: every node heartbeats; GUARANTEED asks from random live nodes.
    quic_snapshot(&commands, &shared, 0).await;
    let acks0 = shared.acks.load(Ordering::Relaxed);
    let keys0 = shared.issuer_keys.load(Ordering::Relaxed);
    let coord0 = process_cpu_s(pid)?;
    let fleet0 = process_cpu_s(std::process::id())?;
    let t0 = Instant::now();
    let window = Duration::from_secs(args.duration_s);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed ^ 0xa110c);
    let mut asked = 0u64;
    if args.allocate_per_s > 0.0 {
        let gap = Duration::from_secs_f64(1.0 / args.allocate_per_s);
        let mut next = tokio::time::Instant::now();
        while t0.elapsed() < window {
            next += gap;
            tokio::time::sleep_until(next).await;
            // Nodes that will be stopped later ask too: all are alive now.
            let node = rng.random_range(0..args.nodes);
            asked += 1;
            let _ = commands[node].send(Command::Allocate {
                correlation_id: asked,
            });
        }
    } else {
        tokio::time::sleep(window).await;
    }
    let window_s = t0.elapsed().as_secs_f64();
    let coord1 = process_cpu_s(pid)?;
    let fleet1 = process_cpu_s(std::process::id())?;
    let acks = shared.acks.load(Ordering::Relaxed) - acks0;
    let keys = shared.issuer_keys.load(Ordering::Relaxed) - keys0;
    let rss = rss_mib(pid)?;
    quic_snapshot(&commands, &shared, 1).await;
    let quic = {
        let [a, b] = &shared.quic;
        let per = |x: &AtomicU64, y: &AtomicU64| {
            let d = y
                .load(Ordering::Relaxed)
                .saturating_sub(x.load(Ordering::Relaxed));
            if acks == 0 {
                0.0
            } else {
                d as f64 / acks as f64
            }
        };
        QuicPerHeartbeat {
            coordinator_datagrams_sent: per(&a.datagrams_rx, &b.datagrams_rx),
            coordinator_bytes_sent: per(&a.bytes_rx, &b.bytes_rx),
            coordinator_datagrams_received: per(&a.datagrams_tx, &b.datagrams_tx),
            coordinator_bytes_received: per(&a.bytes_tx, &b.bytes_tx),
            node_ack_frames_sent: per(&a.ack_frames_tx, &b.ack_frames_tx),
            node_ping_frames_sent: per(&a.ping_frames_tx, &b.ping_frames_tx),
            coordinator_ping_frames_sent: per(&a.ping_frames_rx, &b.ping_frames_rx),
        }
    };
    // Wait for the answers still on their way (bounded: a lost answer is reported as missing).
    let answers_by = Instant::now() + Duration::from_secs(10);
    while shared.granted.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed) < asked
        && Instant::now() < answers_by
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cost = |cpu: f64| ProcessCost {
        cpu_s: cpu,
        core_fraction: cpu / window_s,
        cpu_us_per_heartbeat: if acks == 0 {
            0.0
        } else {
            cpu * 1e6 / acks as f64
        },
    };

    let pause = if args.pause_coordinator_ms > 0 {
        Some(pause_and_recover(args, cluster, pid, &shared).await?)
    } else {
        None
    };

    // Lost nodes: the last `lose` sessions stop (their connections close; the coordinator
    // keeps a node until it has been silent for the node timeout).
    let mut lost = LostFigures {
        stopped: args.lose,
        detect_ms: None,
        node_timeout_ms: args.node_timeout_ms,
    };
    if args.lose > 0 {
        let stopped: HashSet<NodeId> = (args.nodes - args.lose..args.nodes)
            .map(|i| NodeId::new(format!("fleet-{i:05}")))
            .collect();
        eprintln!("fleet: window done; stopping {} nodes", args.lose);
        let at = Instant::now();
        *shared.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, stopped));
        for c in &commands[args.nodes - args.lose..] {
            let _ = c.send(Command::Stop);
        }
        let limit = Duration::from_millis(3 * args.node_timeout_ms)
            + Duration::from_secs(args.ready_timeout_s);
        while at.elapsed() < limit && !shared.lost_seen.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if shared.lost_seen.load(Ordering::Acquire) {
            let seen = Duration::from_micros(shared.lost_seen_us.load(Ordering::Relaxed));
            lost.detect_ms = Some(seen.saturating_sub(at - epoch).as_millis() as u64);
        }
    }
    let metrics = match &cluster.coordinator_http {
        Some(addr) => scrape(addr).unwrap_or_default(),
        None => String::new(),
    };
    for c in &commands {
        let _ = c.send(Command::Stop);
    }
    // One grace period for all sessions, then the rest are aborted (a session in the middle of
    // a write or a join sees the stop only afterwards).
    let grace = tokio::time::Instant::now() + Duration::from_secs(5);
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout_at(grace, t).await.is_err() {
            abort.abort();
        }
    }
    let hist = take_histogram(&shared.latencies);
    let join_waits = take_histogram(&shared.join_waits);
    let answered = join_waits.len();
    let join_answers = JoinAnswerFigures {
        answered,
        attempts_given_up: shared.joins_given_up.load(Ordering::Relaxed),
        bytes_mean: if answered == 0 {
            0.0
        } else {
            shared.join_answer_bytes.load(Ordering::Relaxed) as f64 / answered as f64
        },
        wait_p50_ms: join_waits.value_at_quantile(0.5),
        wait_p99_ms: join_waits.value_at_quantile(0.99),
        wait_max_ms: join_waits.max(),
        slower_than_5_s: join_waits.count_between(5_001, u64::MAX),
    };
    Ok(FleetReport {
        nodes: args.nodes,
        heartbeat_ms: args.heartbeat_ms,
        joined: shared.joined.load(Ordering::Relaxed),
        join_s,
        settle_s,
        window_s,
        heartbeats_answered: acks,
        issuer_keys_per_heartbeat: if acks == 0 {
            0.0
        } else {
            keys as f64 / acks as f64
        },
        coordinator: cost(coord1 - coord0),
        fleet: cost(fleet1 - fleet0),
        coordinator_rss_base_mib: rss_base,
        coordinator_rss_mib: rss,
        coordinator_rss_per_node_kib: (rss - rss_base) * 1024.0 / args.nodes as f64,
        directory_answers: shared.directory_answers.load(Ordering::Relaxed),
        directory_entries: shared.directory_entries.load(Ordering::Relaxed),
        delta_answers: shared.delta_answers.load(Ordering::Relaxed),
        delta_entries: shared.delta_entries.load(Ordering::Relaxed),
        view_entries: shared.view_entries.load(Ordering::Relaxed),
        quic,
        allocate: AllocateFigures {
            asked,
            granted: shared.granted.load(Ordering::Relaxed),
            failed: shared.failed.load(Ordering::Relaxed),
            p50_us: hist.value_at_quantile(0.5),
            p99_us: hist.value_at_quantile(0.99),
            max_us: hist.max(),
            in_coordinator: histogram(&metrics, "coordinator_guaranteed_grant_seconds"),
        },
        lost,
        pause,
        rejoins: shared.rejoined.load(Ordering::Relaxed),
        join_answers,
        coordinator_nodes_joined: metric(&metrics, "coordinator_nodes_joined_total"),
        coordinator_nodes_lost: metric(&metrics, "coordinator_nodes_lost_total"),
        coordinator_heartbeats: metric(&metrics, "coordinator_heartbeats_total"),
    })
}

/// Resumes a stopped process when dropped, so no error path leaves the coordinator stopped.
struct ResumeOnDrop(u32);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

fn signal(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with a pid this process started; no memory is shared.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// `--pause-coordinator-ms`: SIGSTOP the coordinator, SIGCONT it after the pause, and wait
/// until every node has been answered by it again and is connected; then two node timeouts
/// more, so declarations the pause caused late are counted too.
async fn pause_and_recover(
    args: &FleetArgs,
    cluster: &LocalCluster,
    pid: u32,
    shared: &FleetShared,
) -> anyhow::Result<PauseFigures> {
    let counters = || {
        let text = cluster
            .coordinator_http
            .as_deref()
            .and_then(|addr| scrape(addr).ok())
            .unwrap_or_default();
        (
            metric(&text, "coordinator_nodes_lost_total"),
            metric(&text, "coordinator_own_stalls_total"),
            metric(&text, "coordinator_loss_grace_extensions_total"),
        )
    };
    let (lost0, stalls0, extensions0) = counters();
    let ended0 = shared.links_ended.load(Ordering::Relaxed);
    let rejoined0 = shared.rejoined.load(Ordering::Relaxed);
    let given_up0 = shared.joins_given_up.load(Ordering::Relaxed);
    let paused = Duration::from_millis(args.pause_coordinator_ms);
    eprintln!("fleet: stopping the coordinator for {paused:?}");
    if !signal(pid, libc::SIGSTOP) {
        bail!("could not stop the coordinator (pid {pid})");
    }
    let resume = ResumeOnDrop(pid);
    tokio::time::sleep(paused).await;
    shared.resume_generation.fetch_add(1, Ordering::AcqRel);
    let resumed = Instant::now();
    drop(resume);
    let nodes = args.nodes as u64;
    let deadline = resumed + Duration::from_secs(args.ready_timeout_s);
    let mut progress_at = Instant::now() + PROGRESS_PERIOD;
    let recovered = loop {
        if shared.answered_after_resume.load(Ordering::Acquire) >= nodes
            && shared.connected.load(Ordering::Acquire) >= nodes
        {
            break Some(resumed.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            break None;
        }
        if Instant::now() > progress_at {
            progress_at += PROGRESS_PERIOD;
            eprintln!(
                "fleet: {} of {} nodes answered since the resume, {} connected, {} re-joined",
                shared.answered_after_resume.load(Ordering::Relaxed),
                nodes,
                shared.connected.load(Ordering::Relaxed),
                shared.rejoined.load(Ordering::Relaxed) - rejoined0
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let answered = shared.answered_after_resume.load(Ordering::Acquire);
    eprintln!(
        "fleet: recovered after {recovered:?} s; waiting two node timeouts for late declarations"
    );
    tokio::time::sleep(Duration::from_millis(2 * args.node_timeout_ms)).await;
    let (lost1, stalls1, extensions1) = counters();
    let delta = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
    Ok(PauseFigures {
        paused_ms: args.pause_coordinator_ms,
        links_ended: shared.links_ended.load(Ordering::Relaxed) - ended0,
        rejoined: shared.rejoined.load(Ordering::Relaxed) - rejoined0,
        join_attempts_given_up: shared.joins_given_up.load(Ordering::Relaxed) - given_up0,
        recovered_s: recovered,
        answered_after_resume: answered,
        nodes_lost: delta(lost0, lost1),
        own_stalls: delta(stalls0, stalls1),
        loss_grace_extensions: delta(extensions0, extensions1),
    })
}

/// Add `value` to a histogram the sessions share (saturating at its highest trackable value).
fn record(histogram: &Mutex<Option<Histogram<u64>>>, value: u64) {
    if let Some(h) = histogram.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        h.saturating_record(value);
    }
}

/// Take a shared histogram out at the end of the run (once).
fn take_histogram(histogram: &Mutex<Option<Histogram<u64>>>) -> Histogram<u64> {
    histogram
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .expect("taken once")
}

/// Every live session adds its connection's QUIC counters to `shared.quic[i]`; waits (at most
/// 5 s) until all have.
async fn quic_snapshot(
    commands: &[mpsc::UnboundedSender<Command>],
    shared: &FleetShared,
    i: usize,
) {
    let asked = commands
        .iter()
        .filter(|c| c.send(Command::AddQuicStats(i)).is_ok())
        .count() as u64;
    let by = Instant::now() + Duration::from_secs(5);
    while shared.quic[i].reported.load(Ordering::Acquire) < asked && Instant::now() < by {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How a joined session ended.
enum SessionEnd {
    /// The driver stopped the node.
    Stopped,
    /// Silent past the give-up limit, a write that did not complete within it, or the stream
    /// closed: the node re-joins, as a worker does.
    LinkEnded,
}

/// One lightweight node: join (retrying), then heartbeat every period and answer the driver's
/// commands, until stopped. A link that closes, or goes silent past the worker's give-up limit
/// (`scheduler_core::liveness`: ten heartbeat intervals, floor 6 s), is given up and the node
/// re-joins with the worker's jittered backoff.
async fn session(
    plan: SessionPlan,
    endpoint: quinn::Endpoint,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shared: Arc<FleetShared>,
    period: Duration,
    seed: u64,
) {
    tokio::time::sleep_until(plan.start_at).await;
    let mut rng =
        rand::rngs::StdRng::seed_from_u64(seed.wrapping_mul(1_000_003) ^ plan.index as u64);
    let mut node = NodeState {
        seq: 0,
        seen_generation: 0,
    };
    let mut first_join = true;
    let mut backoff = Duration::from_millis(200);
    loop {
        let joined = match join_cluster(&endpoint, &plan.identity, Vec::new()).await {
            Ok(j) => j,
            Err(JoinError::Rejected(r)) => {
                *shared.fatal.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                return;
            }
            Err(JoinError::Lost(_)) => {
                shared.joins_given_up.fetch_add(1, Ordering::Relaxed);
                let delay = if first_join {
                    backoff
                } else {
                    jittered_rejoin_delay(backoff, &mut rng)
                };
                if stopped_while_waiting(&mut commands, &shared, delay).await {
                    return;
                }
                backoff = if first_join {
                    (backoff * 2).min(Duration::from_secs(2))
                } else {
                    next_rejoin_backoff(backoff, false)
                };
                continue;
            }
        };
        if first_join {
            shared.joined.fetch_add(1, Ordering::Relaxed);
            first_join = false;
        } else {
            shared.rejoined.fetch_add(1, Ordering::Relaxed);
        }
        shared.connected.fetch_add(1, Ordering::AcqRel);
        node.answered(&shared);
        let end = joined_session(
            &plan,
            joined,
            &mut commands,
            &shared,
            period,
            &mut rng,
            &mut node,
        )
        .await;
        shared.connected.fetch_sub(1, Ordering::AcqRel);
        match end {
            SessionEnd::Stopped => return,
            SessionEnd::LinkEnded => {
                shared.links_ended.fetch_add(1, Ordering::Relaxed);
            }
        }
        // As the worker: after a session that joined, the backoff starts over.
        backoff = REJOIN_BACKOFF_START;
        if stopped_while_waiting(
            &mut commands,
            &shared,
            jittered_rejoin_delay(backoff, &mut rng),
        )
        .await
        {
            return;
        }
        backoff = next_rejoin_backoff(backoff, false);
    }
}

/// What a node keeps across its sessions.
struct NodeState {
    /// Container ids issued so far (a re-joined node reports new synthetic containers).
    seq: u64,
    /// The resume generation this node was last answered in.
    seen_generation: u64,
}

impl NodeState {
    /// The coordinator answered (a join or a heartbeat): counted once per resume.
    fn answered(&mut self, shared: &FleetShared) {
        let generation = shared.resume_generation.load(Ordering::Acquire);
        if generation > self.seen_generation {
            self.seen_generation = generation;
            shared.answered_after_resume.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Sleep `delay` unless the driver stops the node meanwhile (`true`). Other commands are
/// dropped: there is no session to carry them (a QUIC snapshot counts this node as reported).
async fn stopped_while_waiting(
    commands: &mut mpsc::UnboundedReceiver<Command>,
    shared: &FleetShared,
    delay: Duration,
) -> bool {
    let until = tokio::time::Instant::now() + delay;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return false,
            command = commands.recv() => match command {
                Some(Command::Stop) | None => return true,
                Some(Command::AddQuicStats(i)) => {
                    shared.quic[i].reported.fetch_add(1, Ordering::Release);
                }
                Some(Command::Allocate { .. }) => {}
            },
        }
    }
}

/// One joined session of a node, until it is stopped or its link ends.
async fn joined_session(
    plan: &SessionPlan,
    joined: JoinedSession,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    shared: &FleetShared,
    period: Duration,
    rng: &mut rand::rngs::StdRng,
    node: &mut NodeState,
) -> SessionEnd {
    let JoinedSession {
        connection,
        mut send,
        mut recv,
        mut decoder,
        accepted,
        answer_bytes,
        answer_wait,
    } = joined;
    shared
        .join_answer_bytes
        .fetch_add(answer_bytes, Ordering::Relaxed);
    record(&shared.join_waits, answer_wait.as_millis() as u64);
    let issuer = accepted.issuer;
    let mut known_version = accepted.view.directory_version;
    shared
        .view_entries
        .fetch_add(accepted.view.entries.len() as u64, Ordering::Relaxed);
    // The worker's liveness rule, on a monotonic clock.
    let epoch = tokio::time::Instant::now();
    let mono = || Time::from_micros(epoch.elapsed().as_micros() as u64);
    let mut liveness = LinkLiveness::after_join(
        mono(),
        Duration::from_millis(accepted.settings.heartbeat_interval_ms),
    );
    let link_timeout = liveness.give_up_after();
    // Before cluster protocol 9 the join answer held the whole directory and a key per node:
    // kept for the session's life it made the fleet's memory O(nodes²) (3.8 GB at 4,000 of
    // 5,000 nodes).
    drop(accepted);
    let mut containers: Vec<ContainerStatus> = (0..plan.containers_per_node)
        .map(|_| {
            node.seq += 1;
            synthetic(ContainerId::new(issuer, node.seq), &plan.app_id)
        })
        .collect();
    let mut pending: HashMap<u64, Instant> = HashMap::new();
    let mut release_seq = 1u64 << 40;
    let heartbeat = |known_version: u64,
                     round: u64,
                     containers: &[ContainerStatus],
                     started: Vec<ContainerId>,
                     finished: Vec<ContainerId>| {
        let tq = ((plan.index as u64 * 37 + round * 11) % 400) as f64;
        WorkerToCoordinator::Heartbeat(Heartbeat {
            node_id: plan.identity.node_id.clone(),
            directory_version: known_version,
            queue_delay: QueueDelay {
                tq_ms: tq,
                tr_ms: 0.0,
                tl_ms: 0.0,
            },
            running: containers.len() as u32,
            queued: 0,
            allocated: Resources::new(250 * containers.len() as u64, 256 * containers.len() as u64),
            usage: None,
            containers: containers.to_vec(),
            started,
            finished,
            issued: Vec::new(),
        })
    };
    // A write bounded by the link timeout: a paused coordinator stops granting flow-control
    // credit, and the worker gives the link up then rather than block.
    macro_rules! write_or_end {
        ($write:expr) => {
            match tokio::time::timeout(link_timeout, $write).await {
                Ok(Ok(_)) => {}
                _ => return SessionEnd::LinkEnded,
            }
        };
    }
    // The heartbeat's encoding, reused.
    let mut out = Vec::new();
    // As the worker's node actor does, report at once on joining: the coordinator counts the
    // join as done (its answer delivered) at this first frame (`scheduler_core::join_pacing`).
    if encode_frame_into(
        &heartbeat(known_version, 0, &containers, Vec::new(), Vec::new()),
        CLUSTER_MAX_FRAME,
        &mut out,
    )
    .is_err()
    {
        return SessionEnd::LinkEnded;
    }
    write_or_end!(send.write_all(&out));
    // Then a random phase, so heartbeats spread over the period as real nodes' do.
    let phase = Duration::from_micros(rng.random_range(0..period.as_micros() as u64));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + phase, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut round = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // Checked at each heartbeat (a worker checks every 100 ms; a timer per node
                // that often would cost the fleet's process more than the coordinator's).
                if liveness.check(mono()).is_err() {
                    return SessionEnd::LinkEnded;
                }
                round += 1;
                let mut started = Vec::new();
                let mut finished = Vec::new();
                if !containers.is_empty() {
                    // One container ends and another starts each heartbeat.
                    let slot = (round as usize) % containers.len();
                    node.seq += 1;
                    let new = synthetic(ContainerId::new(issuer, node.seq), &plan.app_id);
                    finished.push(containers[slot].id);
                    started.push(new.id);
                    containers[slot] = new;
                }
                let hb = heartbeat(known_version, round, &containers, started, finished);
                out.clear();
                if encode_frame_into(&hb, CLUSTER_MAX_FRAME, &mut out).is_err() {
                    return SessionEnd::LinkEnded;
                }
                write_or_end!(send.write_all(&out));
            }
            frame = read_fleet_frame(&mut recv, &mut decoder) => {
                let Ok(frame) = frame else { return SessionEnd::LinkEnded };
                liveness.heard(mono());
                match frame {
                    FleetFrame::HeartbeatAck(ack) => {
                        shared.acks.fetch_add(1, Ordering::Relaxed);
                        node.answered(shared);
                        if let Some(keys) = &ack.issuer_keys {
                            shared
                                .issuer_keys
                                .fetch_add(keys.node_epochs.len() as u64, Ordering::Relaxed);
                        }
                        let view = &ack.view;
                        shared
                            .view_entries
                            .fetch_add(view.entries.len() as u64, Ordering::Relaxed);
                        // As the worker's scheduler does (`DistributedScheduler::update_view`): a
                        // delta moves the version only if it applies to the one held.
                        let applies = view.delta.as_ref().is_none_or(|d| {
                            d.from_version <= known_version && known_version <= view.directory_version
                        });
                        if applies {
                            known_version = view.directory_version;
                        }
                        let whole = !view.directory.is_empty();
                        if whole || view.delta.is_some() {
                            let now_us = plan.epoch.elapsed().as_micros() as u64;
                            if let Some(d) = &view.delta {
                                shared.delta_answers.fetch_add(1, Ordering::Relaxed);
                                shared.delta_entries.fetch_add(
                                    (d.joined.len() + d.left.len()) as u64,
                                    Ordering::Relaxed,
                                );
                            } else {
                                shared.directory_answers.fetch_add(1, Ordering::Relaxed);
                                shared
                                    .directory_entries
                                    .fetch_add(view.directory.len() as u64, Ordering::Relaxed);
                            }
                            shared.last_directory_at_us.fetch_max(now_us, Ordering::Relaxed);
                            if !shared.lost_seen.load(Ordering::Relaxed) {
                                let mut stopped = shared.stopped.lock().unwrap_or_else(|e| e.into_inner());
                                if let Some((_, gone)) = stopped.as_mut() {
                                    let all_gone = match &view.delta {
                                        Some(d) => {
                                            for n in &d.left {
                                                gone.remove(n);
                                            }
                                            gone.is_empty()
                                        }
                                        // A whole directory is partial (protocol 9): it
                                        // says nothing of the others.
                                        None => false,
                                    };
                                    if all_gone && !shared.lost_seen.swap(true, Ordering::AcqRel) {
                                        shared.lost_seen_us.store(now_us, Ordering::Release);
                                    }
                                }
                            }
                        }
                    }
                    FleetFrame::GuaranteedAllocated(a) => {
                        if a.remaining == 0 && let Some(sent) = pending.remove(&a.correlation_id) {
                            let us = sent.elapsed().as_micros() as u64;
                            record(&shared.latencies, us.max(1));
                            shared.granted.fetch_add(1, Ordering::Relaxed);
                        }
                        // The app releases each grant at once (as `testbed load --allocate-only`).
                        for c in a.containers {
                            release_seq += 1;
                            let release = WorkerToCoordinator::Release(ReleaseContainer {
                                correlation_id: release_seq,
                                app_id: plan.app_id.as_str().to_string(),
                                container_id: c.container_id,
                            });
                            write_or_end!(write_frame(&mut send, &release));
                        }
                    }
                    FleetFrame::RequestFailed(f) if pending.remove(&f.correlation_id).is_some() => {
                        shared.failed.fetch_add(1, Ordering::Relaxed);
                        let mut fatal = shared.fatal.lock().unwrap_or_else(|e| e.into_inner());
                        if fatal.is_none() {
                            *fatal = Some(format!("allocate failed: {:?} {}", f.code, f.message));
                        }
                    }
                    _ => {}
                }
            }
            command = commands.recv() => match command {
                Some(Command::Allocate { correlation_id }) => {
                    let ask = Allocate::new(
                        Resources::new(100, 64),
                        1,
                        ContainerType::Guaranteed,
                        format!("fleet-job-{correlation_id}"),
                        worker::shared::wall_now().as_millis(),
                    );
                    pending.insert(correlation_id, Instant::now());
                    let msg = WorkerToCoordinator::AllocateGuaranteed(AllocateGuaranteed {
                        correlation_id,
                        app_id: plan.app_id.as_str().to_string(),
                        allocate: ask,
                    });
                    write_or_end!(write_frame(&mut send, &msg));
                }
                Some(Command::AddQuicStats(i)) => shared.quic[i].add(&connection.stats()),
                Some(Command::Stop) | None => return SessionEnd::Stopped,
            },
        }
    }
}

/// The coordinator's frames as a fleet node reads them: the parts of a heartbeat answer it
/// counts (membership: versions, the whole directory's length, a delta's sizes and left ids),
/// grants and failures; anything else is skipped. A real worker decodes the whole answer,
/// including the round's top-k list (most of its bytes); a fleet node does not use the list, and
/// decoding it per answer was a large share of the driver's CPU, which shares the machine's
/// cores with the coordinator being measured (issue 17). The bytes received, and so the QUIC and
/// TLS work on both sides, are the same.
enum FleetFrame {
    HeartbeatAck(AckSeen),
    GuaranteedAllocated(GuaranteedAllocated),
    RequestFailed(RequestFailed),
    Other,
}

/// What a fleet node reads of a `heartbeat_ack` (the fields not named here are skipped).
#[derive(serde::Deserialize)]
struct AckSeen {
    view: ViewSeen,
    #[serde(default)]
    issuer_keys: Option<KeysSeen>,
}

/// How many issuer keys an answer carries (one epoch per key; the rest is skipped).
#[derive(serde::Deserialize)]
struct KeysSeen {
    node_epochs: Vec<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct ViewSeen {
    directory_version: u64,
    directory: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    delta: Option<DeltaSeen>,
    #[serde(default)]
    entries: Vec<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct DeltaSeen {
    from_version: u64,
    joined: Vec<serde::de::IgnoredAny>,
    left: Vec<NodeId>,
}

impl<'de> serde::Deserialize<'de> for FleetFrame {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FleetFrame, D::Error> {
        d.deserialize_map(FleetFrameVisitor)
    }
}

/// The coordinator writes a frame's `type` tag first (serde's internally tagged encoding), so
/// the variant is known before its fields and they are decoded straight into it, without the
/// buffering serde's derive does for a tag that may come anywhere.
struct FleetFrameVisitor;

impl<'de> serde::de::Visitor<'de> for FleetFrameVisitor {
    type Value = FleetFrame;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a coordinator frame: a map whose first key is `type`")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<FleetFrame, A::Error> {
        use serde::Deserialize;
        use serde::de::value::MapAccessDeserializer;
        let key: Option<String> = map.next_key()?;
        if key.as_deref() != Some("type") {
            return Err(serde::de::Error::custom(
                "the frame's first key is not `type`",
            ));
        }
        let kind: String = map.next_value()?;
        let rest = MapAccessDeserializer::new(map);
        Ok(match kind.as_str() {
            "heartbeat_ack" => FleetFrame::HeartbeatAck(AckSeen::deserialize(rest)?),
            "guaranteed_allocated" => {
                FleetFrame::GuaranteedAllocated(GuaranteedAllocated::deserialize(rest)?)
            }
            "request_failed" => FleetFrame::RequestFailed(RequestFailed::deserialize(rest)?),
            _ => {
                serde::de::IgnoredAny::deserialize(rest)?;
                FleetFrame::Other
            }
        })
    }
}

/// The next coordinator frame of a fleet node's session.
async fn read_fleet_frame(
    recv: &mut quinn::RecvStream,
    decoder: &mut FrameDecoder,
) -> Result<FleetFrame, String> {
    loop {
        match decoder.next_message::<FleetFrame>() {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(format!("bad frame from the coordinator: {e}")),
        }
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(chunk)) => decoder.push(&chunk.bytes),
            Ok(None) => return Err("the coordinator closed the stream".into()),
            Err(e) => return Err(format!("reading from the coordinator: {e}")),
        }
    }
}

fn synthetic(id: ContainerId, app: &AppId) -> ContainerStatus {
    ContainerStatus {
        id,
        app_id: app.clone(),
        container_type: ContainerType::Queueable,
        resources: Resources::new(250, 256),
        placement: Placement::Running,
        version: 1,
        job: None,
        usage: None,
        grant_token: None,
    }
}

/// utime + stime of a process, in seconds (`/proc/PID/stat`, clock ticks of 1/100 s).
pub fn process_cpu_s(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let ticks = |i: usize| -> anyhow::Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .context("malformed /proc/PID/stat")
    };
    let hz = clock_ticks_per_s();
    Ok((ticks(11)? + ticks(12)?) / hz)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the running system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// Resident memory of a process (`VmRSS`), MiB.
pub fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .context("no VmRSS in /proc/PID/status")
}

/// `GET /metrics` of the coordinator's HTTP server (HTTP/1.0, read to the end).
pub fn scrape(addr: &str) -> anyhow::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The value of an unlabelled series in a text exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse::<f64>().ok())?
    })
}

/// [`sample`] of a counter or gauge, as a whole number.
pub fn metric(text: &str, name: &str) -> Option<u64> {
    sample(text, name).map(|v| v as u64)
}

/// A histogram of seconds in a text exposition (`NAME_bucket{le="…"}`, `NAME_sum`,
/// `NAME_count`), in µs; `None` when absent or empty.
fn histogram(text: &str, name: &str) -> Option<HistogramFigures> {
    let count = sample(text, &format!("{name}_count"))?;
    let sum = sample(text, &format!("{name}_sum"))?;
    if count < 1.0 {
        return None;
    }
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, tail) = rest.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, tail.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let at_most = |q: f64| {
        buckets
            .iter()
            .find(|(_, cumulative)| *cumulative >= q * count)
            .map_or(f64::INFINITY, |(le, _)| le * 1e6)
    };
    Some(HistogramFigures {
        count: count as u64,
        mean_us: sum / count * 1e6,
        p50_at_most_us: at_most(0.5),
        p99_at_most_us: at_most(0.99),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coordinator's grant histogram as the fleet reads it: count, mean, and the bucket
    /// bounds its p50 and p99 fall in (the exposition of the 10,000-node run of 2026-11-28).
    #[test]
    fn a_histogram_is_read_from_the_exposition() {
        let text = "# TYPE g histogram\ng_sum 0.21862477\ng_count 344\n\
            g_bucket{le=\"0.0001\"} 61\ng_bucket{le=\"0.00025\"} 111\n\
            g_bucket{le=\"0.0005\"} 174\ng_bucket{le=\"0.001\"} 263\n\
            g_bucket{le=\"0.0025\"} 342\ng_bucket{le=\"0.005\"} 344\n\
            g_bucket{le=\"+Inf\"} 344\n";
        let h = histogram(text, "g").unwrap();
        assert_eq!(h.count, 344);
        assert!((h.mean_us - 635.5).abs() < 0.1, "{}", h.mean_us);
        assert_eq!(h.p50_at_most_us, 500.0);
        assert_eq!(h.p99_at_most_us, 2500.0);
        assert_eq!(histogram(text, "other"), None);
        assert_eq!(histogram("g_sum 0\ng_count 0\n", "g"), None);
    }

    #[test]
    fn unlabelled_series_are_read_from_the_exposition() {
        let text = "# HELP x\ncoordinator_nodes_lost_total 3\ncoordinator_nodes_joined_total 50\n";
        assert_eq!(metric(text, "coordinator_nodes_lost_total"), Some(3));
        assert_eq!(metric(text, "coordinator_nodes_joined_total"), Some(50));
        assert_eq!(metric(text, "coordinator_heartbeats_total"), None);
    }

    /// A fleet node reads the membership of a real heartbeat answer: the whole directory's node
    /// ids, and a delta's versions and left ids (the lost-node detection counts on them).
    #[test]
    fn a_fleet_node_reads_the_membership_of_a_real_answer() {
        use scheduler_core::codec::{from_payload, to_payload};
        use scheduler_core::distributed::{ClusterView, DirectoryDelta, NodeDirectoryEntry};
        use scheduler_core::protocol::cluster::{CoordinatorToWorker, HeartbeatAck};
        let entry = |i: usize| NodeDirectoryEntry {
            node_id: NodeId::new(format!("fleet-{i}")),
            rack: "r".into(),
            capacity: Resources::new(4000, 4096),
            app_endpoint: format!("127.0.0.1:{}", 30000 + i),
            slot: i as u32,
        };
        let ack = |directory, delta| {
            CoordinatorToWorker::HeartbeatAck(HeartbeatAck {
                view: ClusterView {
                    directory_version: 9,
                    directory,
                    delta,
                    entries: vec![entry(4), entry(5), entry(6)],
                    ..ClusterView::default()
                },
                shedding_threshold_ms: None,
                queueable_limit: Resources::new(1, 1),
                notices: Vec::new(),
                issuer_keys: None,
                guaranteed_keys: None,
                apps: None,
                top_k: None,
                outstanding_elsewhere: Vec::new(),
            })
        };
        let whole = to_payload(&ack(vec![entry(1), entry(2)], None)).unwrap();
        let Ok(FleetFrame::HeartbeatAck(seen)) = from_payload::<FleetFrame>(&whole) else {
            panic!("a heartbeat answer");
        };
        assert_eq!(seen.view.directory_version, 9);
        assert_eq!(seen.view.directory.len(), 2);
        assert_eq!(seen.view.entries.len(), 3);
        let delta = DirectoryDelta {
            from_version: 7,
            joined: vec![entry(3)],
            left: vec![NodeId::new("fleet-2")],
        };
        let patched = to_payload(&ack(Vec::new(), Some(delta))).unwrap();
        let Ok(FleetFrame::HeartbeatAck(seen)) = from_payload::<FleetFrame>(&patched) else {
            panic!("a heartbeat answer");
        };
        let d = seen.view.delta.expect("a delta");
        assert_eq!((d.from_version, d.joined.len()), (7, 1));
        assert_eq!(d.left, [NodeId::new("fleet-2")]);
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let me = std::process::id();
        assert!(process_cpu_s(me).unwrap() >= 0.0);
        assert!(rss_mib(me).unwrap() > 0.0);
    }
}

//! The QUIC floor of `testbed fleet` (issue 17): what one heartbeat-sized request and its
//! answer cost a server that does nothing else, over the coordinator's own QUIC and TLS
//! configuration (`coordinator::datadir::quic_server_config`, the workers'
//! `worker::link::client_config`), one long-lived stream per connection, as many connections
//! as the fleet has nodes, each sending once per heartbeat period.
//!
//! The fleet reports the coordinator's CPU per heartbeat; this reports the echo server's CPU per
//! answered request, measured the same way (`/proc/PID/stat` of the server process over a
//! steady window). Their ratio is the coordinator's own share; what the floor costs is what no
//! change of ours above quinn can remove (quinn's per-packet work, the kernel's UDP path, the
//! task wake-ups of one connection driver per datagram). The echo server runs on one thread, as
//! the coordinator's actors and QUIC endpoint do.

use anyhow::{Context, bail};
use serde::Serialize;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fleet::process_cpu_s;
use crate::local::{child_command, read_ready_line, ready_json};

/// Largest request or answer payload (a frame's length prefix is checked against it too).
const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// Bytes of a frame's length prefix (big-endian u32).
const LENGTH_PREFIX: usize = 4;

/// Options of `testbed quic-floor`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuicFloorArgs {
    /// Connections (one per node of the fleet being compared).
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Each connection sends one request per period.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// Length of the measurement window, after every connection is up and a period has passed.
    #[arg(long, default_value_t = 20)]
    pub duration_s: u64,
    /// Payload bytes of a request (take the fleet's heartbeat size).
    #[arg(long, default_value_t = 700)]
    pub request_bytes: usize,
    /// Payload bytes of an answer (take the fleet's answer size).
    #[arg(long, default_value_t = 2400)]
    pub answer_bytes: usize,
    /// Connections opened per second (a ramp, as the fleet's joins).
    #[arg(long, default_value_t = 500.0)]
    pub connects_per_s: f64,
    /// Connections per QUIC client endpoint (UDP socket).
    #[arg(long, default_value_t = 1000)]
    pub sessions_per_endpoint: usize,
    /// Worker threads of this (the client) process's runtime.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Give up if the echo server has not started, or the connections are not all up, within
    /// this.
    #[arg(long, default_value_t = 300)]
    pub ready_timeout_s: u64,
    /// Seed of the connections' phases within the period.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Internal: run as the echo server with the coordinator data dir given (the driver starts
    /// it as a process of its own).
    #[arg(long, hide = true)]
    pub serve: Option<PathBuf>,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct QuicFloorReport {
    pub nodes: usize,
    pub heartbeat_ms: u64,
    pub request_bytes: usize,
    pub answer_bytes: usize,
    pub connected_s: f64,
    pub window_s: f64,
    /// Answers the connections received in the window.
    pub answered: u64,
    /// The echo server's CPU in the window.
    pub server_cpu_s: f64,
    pub server_core_fraction: f64,
    pub server_cpu_us_per_answer: f64,
    /// This (client) process's CPU per answer.
    pub client_cpu_us_per_answer: f64,
    /// QUIC datagrams per answer as the clients' connections counted them.
    pub server_datagrams_sent_per_answer: f64,
    pub server_datagrams_received_per_answer: f64,
}

/// Run `testbed quic-floor` (or, with `--serve`, its echo server) and print the report.
pub fn run(args: &QuicFloorArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.serve {
        return serve(dir, args.answer_bytes);
    }
    let r = measure(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "quic-floor: {} connections, {} ms period, requests of {} bytes, answers of {} bytes; connected in {:.1} s",
            r.nodes, r.heartbeat_ms, r.request_bytes, r.answer_bytes, r.connected_s
        );
        println!(
            "window {:.1} s, {} answers; echo server {:.2} s CPU, {:.1}% of one core, {:.1} µs per answer; client {:.1} µs per answer",
            r.window_s,
            r.answered,
            r.server_cpu_s,
            r.server_core_fraction * 100.0,
            r.server_cpu_us_per_answer,
            r.client_cpu_us_per_answer
        );
        println!(
            "QUIC per answer: server sent {:.2} datagrams, received {:.2}",
            r.server_datagrams_sent_per_answer, r.server_datagrams_received_per_answer
        );
    }
    Ok(())
}

fn frame(payload_bytes: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(LENGTH_PREFIX + payload_bytes);
    f.extend_from_slice(&(payload_bytes as u32).to_be_bytes());
    // Not all zeros: nothing on the way should find it cheaper than a real payload.
    f.extend((0..payload_bytes).map(|i| (i.wrapping_mul(131) >> 3) as u8));
    f
}

/// Complete frames at the front of `buffered`: how many, and the bytes they take.
fn complete_frames(buffered: &[u8]) -> anyhow::Result<(usize, usize)> {
    let (mut frames, mut at) = (0, 0);
    while buffered.len() - at >= LENGTH_PREFIX {
        let mut prefix = [0u8; LENGTH_PREFIX];
        prefix.copy_from_slice(&buffered[at..at + LENGTH_PREFIX]);
        let len = u32::from_be_bytes(prefix) as usize;
        if len > MAX_PAYLOAD_BYTES {
            bail!("frame of {len} bytes announced (at most {MAX_PAYLOAD_BYTES})");
        }
        if buffered.len() - at - LENGTH_PREFIX < len {
            break;
        }
        at += LENGTH_PREFIX + len;
        frames += 1;
    }
    Ok((frames, at))
}

/// The echo server: one thread, an answer of `answer_bytes` to every request frame.
fn serve(dir: &Path, answer_bytes: usize) -> anyhow::Result<()> {
    if answer_bytes > MAX_PAYLOAD_BYTES {
        bail!("--answer-bytes must be at most {MAX_PAYLOAD_BYTES}");
    }
    coordinator::datadir::install_crypto_provider();
    let config =
        coordinator::datadir::quic_server_config(&coordinator::datadir::DataDir::new(dir))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let endpoint = quinn::Endpoint::server(config, "127.0.0.1:0".parse().expect("literal"))
            .context("opening the QUIC server endpoint")?;
        let addr = endpoint.local_addr()?;
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{}",
            serde_json::json!({"event": "listening", "quic_addr": addr.to_string()})
        )?;
        out.flush()?;
        drop(out);
        let answer: Arc<[u8]> = frame(answer_bytes).into();
        while let Some(incoming) = endpoint.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                if let Err(e) = echo(incoming, answer).await {
                    tracing::debug!("echo connection ended: {e:#}");
                }
            });
        }
        Ok(())
    })
}

async fn echo(incoming: quinn::Incoming, answer: Arc<[u8]>) -> anyhow::Result<()> {
    let connection = incoming.await?;
    let (mut send, mut recv) = connection.accept_bi().await?;
    let mut buffered = Vec::new();
    while let Some(chunk) = recv.read_chunk(64 * 1024, true).await? {
        buffered.extend_from_slice(&chunk.bytes);
        let (frames, used) = complete_frames(&buffered)?;
        buffered.drain(..used);
        for _ in 0..frames {
            send.write_all(&answer).await?;
        }
    }
    Ok(())
}

/// The echo server process; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    /// Start it as a child that dies with this process, and wait for its address until
    /// `deadline`.
    fn start(dir: &Path, answer_bytes: usize, deadline: Instant) -> anyhow::Result<Server> {
        let exe = std::env::current_exe().context("finding this executable")?;
        let mut child = child_command(&exe)
            .arg("quic-floor")
            .arg("--serve")
            .arg(dir)
            .arg("--answer-bytes")
            .arg(answer_bytes.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the echo server")?;
        let stdout = child.stdout.take().context("the echo server's stdout")?;
        // Owned from here: an error below kills it (Drop).
        let mut server = Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let ready = ready_json(&read_ready_line(stdout), "the echo server", deadline)?;
        server.addr = ready["quic_addr"]
            .as_str()
            .context("no quic_addr in the echo server's ready line")?
            .parse()
            .context("the echo server's address")?;
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Default)]
struct Counters {
    connected: AtomicU64,
    failed: AtomicU64,
    answered: AtomicU64,
    /// Sum over connections of the datagrams they received / sent, at the window's ends.
    datagrams_rx: [AtomicU64; 2],
    datagrams_tx: [AtomicU64; 2],
    /// Connections that added their counts for the window's end (each adds the start first).
    reported_end: AtomicU64,
}

/// Start the echo server, open the connections, measure a window.
pub fn measure(args: &QuicFloorArgs) -> anyhow::Result<QuicFloorReport> {
    if args.nodes == 0
        || args.heartbeat_ms == 0
        || args.duration_s == 0
        || args.threads == 0
        || args.sessions_per_endpoint == 0
    {
        bail!(
            "--nodes, --heartbeat-ms, --duration-s, --threads and --sessions-per-endpoint must be positive"
        );
    }
    if !(args.connects_per_s > 0.0 && args.connects_per_s.is_finite()) {
        bail!("--connects-per-s must be a positive number");
    }
    if args.request_bytes > MAX_PAYLOAD_BYTES || args.answer_bytes > MAX_PAYLOAD_BYTES {
        bail!("--request-bytes and --answer-bytes must be at most {MAX_PAYLOAD_BYTES}");
    }
    coordinator::datadir::install_crypto_provider();
    let tmp = tempfile::tempdir().context("creating a temporary data dir")?;
    let dir = coordinator::datadir::DataDir::new(tmp.path().join("coordinator"));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    coordinator::datadir::init(&dir, &[], now_ms).context("creating the server certificate")?;
    let ready_by = Instant::now() + Duration::from_secs(args.ready_timeout_s);
    let server = Server::start(&dir.root, args.answer_bytes, ready_by)?;
    let client = worker::link::client_config(&dir.ca_cert())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;
    let result = rt.block_on(drive(args, client, &server));
    rt.shutdown_timeout(Duration::from_secs(2));
    drop(server);
    result
}

async fn drive(
    args: &QuicFloorArgs,
    client: quinn::ClientConfig,
    server: &Server,
) -> anyhow::Result<QuicFloorReport> {
    use rand::{RngExt, SeedableRng};
    let counters = Arc::new(Counters::default());
    let period = Duration::from_millis(args.heartbeat_ms);
    let request: Arc<[u8]> = frame(args.request_bytes).into();
    let (snapshot_tx, _) = tokio::sync::broadcast::channel::<usize>(4);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut endpoint = None;
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(args.nodes);
    for index in 0..args.nodes {
        if index % args.sessions_per_endpoint == 0 {
            let mut e = quinn::Endpoint::client("127.0.0.1:0".parse().expect("literal"))
                .context("opening a QUIC client endpoint")?;
            e.set_default_client_config(client.clone());
            endpoint = Some(e);
        }
        let endpoint = endpoint.clone().expect("set above");
        let connect_at = started + Duration::from_secs_f64(index as f64 / args.connects_per_s);
        let phase = Duration::from_micros(rng.random_range(0..period.as_micros() as u64));
        tasks.push(tokio::spawn(session(
            endpoint,
            server.addr,
            connect_at,
            phase,
            period,
            request.clone(),
            counters.clone(),
            snapshot_tx.subscribe(),
        )));
    }
    let ready_by = Instant::now() + Duration::from_secs(args.ready_timeout_s);
    while counters.connected.load(Ordering::Relaxed) < args.nodes as u64 {
        let failed = counters.failed.load(Ordering::Relaxed);
        if failed > 0 {
            bail!("{failed} connections failed");
        }
        if Instant::now() > ready_by {
            bail!(
                "only {} of {} connections up within {} s",
                counters.connected.load(Ordering::Relaxed),
                args.nodes,
                args.ready_timeout_s
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connected_s = started.elapsed().as_secs_f64();
    // One whole period for every connection to be sending.
    tokio::time::sleep(period).await;
    let pid = server.child.id();
    let mut window = Vec::new();
    for end in 0..2 {
        if end == 1 {
            tokio::time::sleep(Duration::from_secs(args.duration_s)).await;
        }
        let _ = snapshot_tx.send(end);
        window.push((
            Instant::now(),
            counters.answered.load(Ordering::Relaxed),
            process_cpu_s(pid)?,
            process_cpu_s(std::process::id())?,
        ));
    }
    // Every connection adds its datagram counts for both ends (bounded wait).
    let counted_by = Instant::now() + Duration::from_secs(10);
    while counters.reported_end.load(Ordering::Acquire) < args.nodes as u64
        && Instant::now() < counted_by
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in &tasks {
        t.abort();
    }
    let (t0, a0, s0, c0) = window[0];
    let (t1, a1, s1, c1) = window[1];
    let answered = a1 - a0;
    let window_s = (t1 - t0).as_secs_f64();
    let per = |x: f64| {
        if answered == 0 {
            0.0
        } else {
            x / answered as f64
        }
    };
    let delta = |c: &[AtomicU64; 2]| {
        c[1].load(Ordering::Relaxed)
            .saturating_sub(c[0].load(Ordering::Relaxed)) as f64
    };
    Ok(QuicFloorReport {
        nodes: args.nodes,
        heartbeat_ms: args.heartbeat_ms,
        request_bytes: args.request_bytes,
        answer_bytes: args.answer_bytes,
        connected_s,
        window_s,
        answered,
        server_cpu_s: s1 - s0,
        server_core_fraction: (s1 - s0) / window_s,
        server_cpu_us_per_answer: per((s1 - s0) * 1e6),
        client_cpu_us_per_answer: per((c1 - c0) * 1e6),
        server_datagrams_sent_per_answer: per(delta(&counters.datagrams_rx)),
        server_datagrams_received_per_answer: per(delta(&counters.datagrams_tx)),
    })
}

#[allow(clippy::too_many_arguments)]
async fn session(
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    connect_at: tokio::time::Instant,
    phase: Duration,
    period: Duration,
    request: Arc<[u8]>,
    counters: Arc<Counters>,
    mut snapshots: tokio::sync::broadcast::Receiver<usize>,
) {
    tokio::time::sleep_until(connect_at).await;
    let opened = async {
        let connection = endpoint.connect(addr, worker::link::SERVER_NAME)?.await?;
        let (send, recv) = connection.open_bi().await?;
        anyhow::Ok((connection, send, recv))
    };
    let Ok((connection, mut send, mut recv)) = opened.await else {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    counters.connected.fetch_add(1, Ordering::Relaxed);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + phase, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buffered = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if send.write_all(&request).await.is_err() {
                    return;
                }
            }
            chunk = recv.read_chunk(64 * 1024, true) => {
                let Ok(Some(chunk)) = chunk else { return };
                buffered.extend_from_slice(&chunk.bytes);
                let Ok((frames, used)) = complete_frames(&buffered) else { return };
                buffered.drain(..used);
                counters.answered.fetch_add(frames as u64, Ordering::Relaxed);
            }
            end = snapshots.recv() => {
                let Ok(end) = end else { return };
                let stats = connection.stats();
                counters.datagrams_rx[end].fetch_add(stats.udp_rx.datagrams, Ordering::Relaxed);
                counters.datagrams_tx[end].fetch_add(stats.udp_tx.datagrams, Ordering::Relaxed);
                if end == 1 {
                    counters.reported_end.fetch_add(1, Ordering::Release);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_counted_whole_and_a_huge_length_is_refused() {
        let mut bytes = frame(3);
        bytes.extend(frame(0));
        bytes.extend(&frame(5)[..6]); // a partial third frame
        assert_eq!(complete_frames(&bytes).unwrap(), (2, 7 + 4));
        assert_eq!(complete_frames(&[0, 0]).unwrap(), (0, 0));
        let huge = ((MAX_PAYLOAD_BYTES + 1) as u32).to_be_bytes();
        assert!(complete_frames(&huge).is_err());
    }

    #[test]
    fn bad_options_are_refused_by_name() {
        let args = QuicFloorArgs {
            nodes: 0,
            heartbeat_ms: 1000,
            duration_s: 1,
            request_bytes: 10,
            answer_bytes: 10,
            connects_per_s: 100.0,
            sessions_per_endpoint: 10,
            threads: 1,
            ready_timeout_s: 5,
            seed: 1,
            json: false,
            serve: None,
        };
        let e = measure(&args).unwrap_err().to_string();
        assert!(e.contains("--nodes"), "{e}");
        let e = measure(&QuicFloorArgs {
            nodes: 1,
            request_bytes: MAX_PAYLOAD_BYTES + 1,
            ..args.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--request-bytes"), "{e}");
    }
}

//! The `app-endpoint` target: generated frames over many TCP connections to a real worker.

use super::generator::{self, Protocol, Rng};
use super::{FuzzArgs, Report, empty_report, rss_kib};
use crate::client::ClientPool;
use crate::local::{LocalArgs, LocalCluster};
use anyhow::Context;
use scheduler_core::codec::{APP_MAX_FRAME, FrameDecoder, encode_frame, from_payload};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, Allocate, AppRequest, AppResponse, ErrorCode, Hello,
};
use scheduler_core::{ContainerType, Resources};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Guard against a worker that never closes a connection after the client's end of stream
/// (reaching it is a failure, not a way to wait).
const CLOSE_GUARD: Duration = Duration::from_secs(30);
/// Answers read per connection at most (an `allocated` for 1,000 containers is ~400 KiB).
const MAX_READ: usize = 8 << 20;

/// What one connection saw.
struct CaseResult {
    frames: u64,
    answers: Vec<String>,
    problem: Option<String>,
}

pub(super) fn fuzz_endpoint(args: &FuzzArgs) -> anyhow::Result<Report> {
    let cluster = LocalCluster::start(&LocalArgs {
        workers: 1,
        cpu_millis: 4000,
        memory_mib: 4096,
        heartbeat_interval_ms: 250,
        node_timeout_ms: 5000,
        data_dir: None,
        // Raw frames go to the endpoint as bytes: plaintext TCP, chosen explicitly.
        app_transport: crate::local::AppTransport::PlaintextTcp,
        ..LocalArgs::default()
    })
    .context("starting a coordinator and a worker (are their binaries built next to testbed? cargo build -p coordinator -p worker)")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(drive(args, &cluster));
    let mut cluster = cluster;
    let mut report = result?;
    if let Some((name, why)) = cluster.exited_child() {
        let msg = format!("{name} exited during the run: {why}");
        report.failure(args, args.first_case, msg);
    }
    cluster.stop();
    Ok(report)
}

async fn drive(args: &FuzzArgs, cluster: &LocalCluster) -> anyhow::Result<Report> {
    let mut report = empty_report(args);
    let endpoint = match crate::client::Endpoint::parse(&cluster.workers[0].app_endpoint) {
        crate::client::Endpoint::Tcp(addr) => addr,
        other => anyhow::bail!("the fuzzer needs a plaintext TCP endpoint, got {other:?}"),
    };
    let pid = cluster.pid("worker-1").context("the worker's pid")?;
    let creds = Arc::new((cluster.app_id.clone(), cluster.app_secret.clone()));
    let next = Arc::new(AtomicU64::new(0));
    let warmup = (args.cases / 10).clamp(1, 2_000).min(args.cases);
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, CaseResult)>();
    let mut tasks = Vec::new();
    for _ in 0..args.connections.max(1) {
        let (next, creds, endpoint, tx) =
            (next.clone(), creds.clone(), endpoint.clone(), tx.clone());
        let (seed, first, cases) = (args.seed, args.first_case, args.cases);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= cases {
                    break;
                }
                let case = first + i;
                let r = one_connection(&endpoint, &creds, Rng::for_case(seed, case)).await;
                if tx.send((i, r)).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let mut done = 0u64;
    let mut baseline_taken = false;
    while let Some((i, r)) = rx.recv().await {
        done += 1;
        report.frames += r.frames;
        for a in r.answers {
            *report.outcomes.entry(a).or_default() += 1;
        }
        if let Some(p) = r.problem {
            report.failure(args, args.first_case + i, p);
        }
        if !baseline_taken && done >= warmup {
            report.rss_baseline_kib = rss_kib(Some(pid));
            baseline_taken = true;
        } else if baseline_taken && done.is_multiple_of(256) {
            let growth = rss_kib(Some(pid)).saturating_sub(report.rss_baseline_kib);
            report.max_rss_growth_kib = report.max_rss_growth_kib.max(growth);
        }
    }
    for t in tasks {
        t.await?;
    }
    report.seconds = start.elapsed().as_secs_f64();
    report.cases = args.cases;
    report.cases_per_s = args.cases as f64 / report.seconds.max(1e-9);
    report.rss_final_kib = rss_kib(Some(pid));
    report.max_rss_growth_kib = report
        .max_rss_growth_kib
        .max(report.rss_final_kib.saturating_sub(report.rss_baseline_kib));
    if report.max_rss_growth_kib > args.max_rss_growth_mib * 1024 {
        let msg = format!(
            "the worker's resident memory grew by {} KiB after warm-up (limit {} MiB)",
            report.max_rss_growth_kib, args.max_rss_growth_mib
        );
        report.failure(args, args.first_case, msg);
    }
    match well_behaved_client(&endpoint, &creds.0, &creds.1).await {
        Ok(()) => report.served_after = Some(true),
        Err(e) => {
            report.served_after = Some(false);
            report.failure(
                args,
                args.first_case,
                format!("after the run the worker does not serve a well-behaved client: {e:#}"),
            );
        }
    }
    Ok(report)
}

/// One connection: maybe a valid hello, then generated frames, then end of stream; read every
/// answer until the worker closes.
async fn one_connection(endpoint: &str, creds: &(String, String), mut rng: Rng) -> CaseResult {
    let mut result = CaseResult {
        frames: 0,
        answers: vec![],
        problem: None,
    };
    let mut bytes = Vec::new();
    if rng.chance(3, 4) {
        let hello = AppRequest::Hello(Hello {
            protocol_version: APP_PROTOCOL_VERSION,
            app_id: creds.0.clone(),
            app_secret: creds.1.clone(),
            client_name: Some("fuzz".into()),
        });
        bytes.extend(encode_frame(&hello, APP_MAX_FRAME).expect("a hello encodes"));
        result.frames += 1;
    }
    for _ in 0..1 + rng.below(8) {
        // Half the frames are valid requests with random field values (they reach the
        // request handlers), half are damaged (they reach the decoder's error paths).
        let payload = if rng.chance(1, 2) {
            let req = generator::app_request(&mut rng, Some((&creds.0, &creds.1)));
            scheduler_core::codec::to_payload(&req).expect("a request encodes")
        } else {
            generator::payload(&mut rng, Protocol::App, Some((&creds.0, &creds.1)))
        };
        bytes.extend(generator::frame(&mut rng, &payload, APP_MAX_FRAME));
        result.frames += 1;
    }
    let stream = match TcpStream::connect(endpoint).await {
        Ok(s) => s,
        Err(e) => {
            result.problem = Some(format!("connecting to the worker failed: {e}"));
            return result;
        }
    };
    let (mut reader, mut writer) = stream.into_split();
    let split = if rng.chance(1, 2) {
        rng.index(bytes.len() + 1)
    } else {
        bytes.len()
    };
    let write = async move {
        // The worker may close first (an error that closes the connection): a failed write is
        // not a failure of the case.
        if writer.write_all(&bytes[..split]).await.is_ok() {
            tokio::task::yield_now().await;
            if writer.write_all(&bytes[split..]).await.is_ok() {
                let _ = writer.shutdown().await;
            }
        }
    };
    let read = async move {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut end = String::from("end of stream");
        let mut reset = false;
        loop {
            match reader.read(&mut buf).await {
                Ok(0) => break,
                Err(e) => {
                    reset = e.kind() == std::io::ErrorKind::ConnectionReset;
                    end = e.to_string();
                    break;
                }
                Ok(n) => {
                    if got.len() < MAX_READ {
                        got.extend_from_slice(&buf[..n]);
                    }
                }
            }
        }
        (got, end, reset)
    };
    let (got, end, reset) = match tokio::time::timeout(CLOSE_GUARD, async {
        tokio::join!(write, read).1
    })
    .await
    {
        Ok(got) => got,
        Err(_) => {
            result.problem = Some(format!(
                "the worker did not close the connection within {} s of the client's end of stream",
                CLOSE_GUARD.as_secs()
            ));
            return result;
        }
    };
    let mut decoder = FrameDecoder::new(APP_MAX_FRAME);
    decoder.push(&got);
    loop {
        match decoder.next_payload() {
            Ok(Some(p)) => match from_payload::<AppResponse>(&p) {
                Ok(AppResponse::Error(e)) => {
                    result.answers.push(format!("error: {}", code_name(e.code)))
                }
                Ok(other) => result.answers.push(response_name(&other).to_string()),
                Err(e) => {
                    result.problem = Some(format!(
                        "the worker sent a frame that is no AppResponse: {e}"
                    ));
                    break;
                }
            },
            Ok(None) => break,
            Err(e) => {
                result.problem = Some(format!(
                    "the worker's answers do not split into frames: {e}"
                ));
                break;
            }
        }
    }
    if reset {
        // The worker closed a connection whose input it had not read (it stops reading after
        // an error that closes the connection while the client is still sending): the kernel
        // resets it, and answers already sent may be lost. Counted, not a failure of the case
        // (docs/reliability.md, "Hostile frames ...").
        result.answers.push("connection reset by the worker".into());
    } else if result.problem.is_none() && got.len() < MAX_READ && decoder.finish().is_err() {
        let shown: String = got.iter().take(48).map(|b| format!("{b:02x}")).collect();
        result.problem = Some(format!(
            "the worker closed in the middle of a frame ({} bytes received, starting {shown}; the read ended with: {end})",
            got.len()
        ));
    }
    result
}

fn code_name(c: ErrorCode) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn response_name(r: &AppResponse) -> &'static str {
    match r {
        AppResponse::Welcome(_) => "welcome",
        AppResponse::Allocated(_) => "allocated",
        AppResponse::Promoted(_) => "promoted",
        AppResponse::ContainerAccepted(_) => "container_accepted",
        AppResponse::Ack(_) => "ack",
        AppResponse::Event(_) => "event",
        AppResponse::Error(_) => "error",
        AppResponse::Reservation(_) => "reservation",
        AppResponse::Reservations(_) => "reservations",
        AppResponse::ReservationReprovisioned(_) => "reservation_reprovisioned",
        AppResponse::ReservationCancelled(_) => "reservation_cancelled",
        AppResponse::Explained(_) => "explained",
    }
}

/// After the run: a fresh client says hello, subscribes, gets a QUEUEABLE container granted
/// and releases it; a malformed frame on another connection still gets `malformed_frame`.
async fn well_behaved_client(endpoint: &str, app_id: &str, secret: &str) -> anyhow::Result<()> {
    let guard = Duration::from_secs(20);
    let (pool, _events) = ClientPool::new(app_id, secret);
    let client = tokio::time::timeout(guard, pool.get(endpoint))
        .await
        .context("connect timed out")??;
    let ask = Allocate {
        request_id: 0,
        resources: Resources::new(100, 16),
        count: 1,
        priority: 0,
        container_type: ContainerType::Queueable,
        locality: None,
        runtime_estimate_ms: Some(1000),
        job_id: "fuzz-check".into(),
        job_submit_time_ms: 1,
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    };
    let granted = tokio::time::timeout(guard, client.allocate(ask))
        .await
        .context("allocate timed out")??;
    anyhow::ensure!(
        granted.containers.len() == 1,
        "a QUEUEABLE ask of 1 got {:?}",
        granted
    );
    tokio::time::timeout(guard, client.release(granted.containers[0].container_id))
        .await
        .context("release timed out")??;

    let mut s = TcpStream::connect(endpoint).await?;
    s.write_all(&[0, 0, 0, 1, 0xc1]).await?; // 0xc1 is never valid msgpack
    let mut got = Vec::new();
    tokio::time::timeout(guard, s.read_to_end(&mut got))
        .await
        .context("no close after a malformed frame")??;
    let mut d = FrameDecoder::new(APP_MAX_FRAME);
    d.push(&got);
    match d.next_message::<AppResponse>()? {
        Some(AppResponse::Error(e)) if e.code == ErrorCode::MalformedFrame => Ok(()),
        other => anyhow::bail!("a malformed frame was answered {other:?}"),
    }
}

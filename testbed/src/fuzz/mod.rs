//! `testbed fuzz`: seeded, structure-aware fuzzing of the two protocols' decoders and of a real
//! worker's app endpoint, as plain Rust (no nightly, no cargo-fuzz).
//!
//! - `app-decoder` / `cluster-decoder`: each case is a byte stream of one to three frames made by
//!   [`generator`] (valid messages mutated field by field, random bytes, truncation, trailing bytes,
//!   headers and length prefixes that lie), fed to a [`FrameDecoder`] in random chunks; every
//!   payload it yields is decoded as every message type of the protocol (both directions) and as
//!   the routing [`Envelope`]. A case fails if anything panics, if the frame splitter fails other
//!   than `Oversized`, if a decode fails other than `Malformed`, or if a decoded message does not
//!   survive encode → decode → encode unchanged.
//! - `app-endpoint`: a real coordinator and worker ([`LocalCluster`], separate processes); each
//!   case is one TCP connection (many at once) carrying an optional valid `hello` and one to
//!   eight generated frames, then end of stream. A case fails if the worker sends a frame that
//!   does not decode as an `AppResponse`, or does not close the connection in time. After the
//!   run the worker must still be alive, serve a well-behaved client, and its resident memory
//!   must not have grown past the limit.
//!
//! Every case's generator is seeded by `(seed, case index)`: a failure prints the command that
//! replays that case alone.

pub mod endpoint;
pub mod generator;

use generator::{Protocol, Rng};
use scheduler_core::codec::{
    APP_MAX_FRAME, CLUSTER_MAX_FRAME, CodecError, FrameDecoder, from_payload, to_payload,
};
use scheduler_core::protocol::Envelope;
use scheduler_core::protocol::app::{AppRequest, AppResponse};
use scheduler_core::protocol::cluster::{CoordinatorToWorker, WorkerToCoordinator};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

/// What to fuzz.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The app protocol's frame splitter and message decoders (in process).
    AppDecoder,
    /// The cluster protocol's frame splitter and message decoders (in process).
    ClusterDecoder,
    /// A real worker's app endpoint over TCP (coordinator and worker as processes).
    AppEndpoint,
}

/// Options of `testbed fuzz`.
#[derive(Debug, Clone, clap::Args)]
pub struct FuzzArgs {
    #[arg(long, value_enum)]
    pub target: Target,
    /// Number of cases (for app-endpoint: connections).
    #[arg(long, default_value_t = 100_000)]
    pub cases: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Index of the first case (replay one case: `--first-case I --cases 1`).
    #[arg(long, default_value_t = 0)]
    pub first_case: u64,
    /// app-endpoint: connections open at once.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Fail if resident memory (the fuzzer's for decoders, the worker's for app-endpoint) grows
    /// by more than this after warm-up.
    #[arg(long, default_value_t = 256)]
    pub max_rss_growth_mib: u64,
    /// Print the report as one JSON line.
    #[arg(long)]
    pub json: bool,
}

impl FuzzArgs {
    pub fn new(target: Target, cases: u64, seed: u64) -> FuzzArgs {
        FuzzArgs {
            target,
            cases,
            seed,
            first_case: 0,
            connections: 16,
            max_rss_growth_mib: 256,
            json: false,
        }
    }
}

/// One failing case.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub case: u64,
    pub message: String,
    /// The command that replays this case alone.
    pub reproduce: String,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: Target,
    pub seed: u64,
    pub first_case: u64,
    pub cases: u64,
    /// Frames sent (app-endpoint) or frames decoded (decoders).
    pub frames: u64,
    pub seconds: f64,
    pub cases_per_s: f64,
    /// Resident memory after warm-up, and the largest growth over it seen during the run
    /// (the fuzzer's own for decoders, the worker process's for app-endpoint).
    pub rss_baseline_kib: u64,
    pub max_rss_growth_kib: u64,
    pub rss_final_kib: u64,
    /// app-endpoint: the worker answered a well-behaved client after the run.
    pub served_after: Option<bool>,
    /// Outcome counts (decoded, malformed, oversized, ... or the error codes answered).
    pub outcomes: std::collections::BTreeMap<String, u64>,
    pub failures: Vec<Failure>,
    pub ok: bool,
}

impl Report {
    fn failure(&mut self, args: &FuzzArgs, case: u64, message: String) {
        if self.failures.len() < 20 {
            self.failures.push(Failure {
                case,
                reproduce: format!(
                    "testbed fuzz --target {} --seed {} --first-case {case} --cases 1",
                    target_name(args.target),
                    args.seed
                ),
                message,
            });
        }
        self.ok = false;
    }
}

fn target_name(t: Target) -> &'static str {
    match t {
        Target::AppDecoder => "app-decoder",
        Target::ClusterDecoder => "cluster-decoder",
        Target::AppEndpoint => "app-endpoint",
    }
}

/// Resident memory of a process (`/proc/PID/status` `VmRSS`, or `self`), in KiB.
pub fn rss_kib(pid: Option<u32>) -> u64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// `testbed fuzz`: run, print the report, exit non-zero on any failure.
pub fn run(args: &FuzzArgs) -> anyhow::Result<()> {
    let report = fuzz(args)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{}: {} cases ({} frames) in {:.1} s = {:.0} cases/s; RSS {} KiB after warm-up, max growth {} KiB, final {} KiB{}",
            target_name(report.target),
            report.cases,
            report.frames,
            report.seconds,
            report.cases_per_s,
            report.rss_baseline_kib,
            report.max_rss_growth_kib,
            report.rss_final_kib,
            match report.served_after {
                Some(true) => "; the worker still serves a well-behaved client",
                Some(false) => "; the worker NO LONGER serves a well-behaved client",
                None => "",
            }
        );
        println!("outcomes: {:?}", report.outcomes);
        for f in &report.failures {
            println!(
                "FAILURE case {}: {}\n  replay: {}",
                f.case, f.message, f.reproduce
            );
        }
    }
    if !report.ok {
        anyhow::bail!("fuzzing found {} failing case(s)", report.failures.len());
    }
    Ok(())
}

/// Run one target and return its report (failures included; never panics on a failing case).
pub fn fuzz(args: &FuzzArgs) -> anyhow::Result<Report> {
    match args.target {
        Target::AppDecoder => Ok(fuzz_decoder(args, Protocol::App)),
        Target::ClusterDecoder => Ok(fuzz_decoder(args, Protocol::Cluster)),
        Target::AppEndpoint => endpoint::fuzz_endpoint(args),
    }
}

fn empty_report(args: &FuzzArgs) -> Report {
    Report {
        target: args.target,
        seed: args.seed,
        first_case: args.first_case,
        cases: 0,
        frames: 0,
        seconds: 0.0,
        cases_per_s: 0.0,
        rss_baseline_kib: 0,
        max_rss_growth_kib: 0,
        rss_final_kib: 0,
        served_after: None,
        outcomes: Default::default(),
        failures: vec![],
        ok: true,
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".to_string())
}

thread_local! {
    /// Set while this thread runs a fuzz case: its panics are expected and reported per case.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A panic hook that stays silent for fuzz cases and hands every other panic to the hook that
/// was there before (installed once per process, so parallel tests keep their panic messages).
fn install_quiet_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info);
            }
        }));
    });
}

fn fuzz_decoder(args: &FuzzArgs, protocol: Protocol) -> Report {
    let mut report = empty_report(args);
    // Panics are caught and reported per case; keep the hook from printing each one.
    install_quiet_hook();
    let warmup = (args.cases / 20).min(20_000);
    let start = Instant::now();
    let mut outcomes = Outcomes::default();
    for i in 0..args.cases {
        let case = args.first_case + i;
        if i == warmup {
            report.rss_baseline_kib = rss_kib(None);
        }
        let mut rng = Rng::for_case(args.seed, case);
        QUIET.with(|q| q.set(true));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            decoder_case(&mut rng, protocol, &mut outcomes)
        }));
        QUIET.with(|q| q.set(false));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => report.failure(args, case, msg),
            Err(p) => report.failure(args, case, format!("panic: {}", panic_message(&*p))),
        }
        if i > warmup && i.is_multiple_of(4096) {
            let growth = rss_kib(None).saturating_sub(report.rss_baseline_kib);
            report.max_rss_growth_kib = report.max_rss_growth_kib.max(growth);
        }
    }
    if args.cases <= warmup || report.rss_baseline_kib == 0 {
        report.rss_baseline_kib = rss_kib(None);
    }
    report.rss_final_kib = rss_kib(None);
    report.max_rss_growth_kib = report
        .max_rss_growth_kib
        .max(report.rss_final_kib.saturating_sub(report.rss_baseline_kib));
    report.seconds = start.elapsed().as_secs_f64();
    report.cases = args.cases;
    report.frames = outcomes.frames;
    report.cases_per_s = args.cases as f64 / report.seconds.max(1e-9);
    report.outcomes = outcomes.counts;
    if report.max_rss_growth_kib > args.max_rss_growth_mib * 1024 {
        let msg = format!(
            "resident memory grew by {} KiB over the run (limit {} MiB)",
            report.max_rss_growth_kib, args.max_rss_growth_mib
        );
        report.failure(args, args.first_case, msg);
    }
    report
}

#[derive(Default)]
struct Outcomes {
    frames: u64,
    counts: std::collections::BTreeMap<String, u64>,
}

impl Outcomes {
    fn count(&mut self, what: &str) {
        *self.counts.entry(what.to_string()).or_default() += 1;
    }
}

/// One decoder case: build a stream, split it in random chunks, decode every payload.
fn decoder_case(rng: &mut Rng, protocol: Protocol, out: &mut Outcomes) -> Result<(), String> {
    let cap = match protocol {
        Protocol::App => APP_MAX_FRAME,
        Protocol::Cluster => CLUSTER_MAX_FRAME,
    };
    let mut stream = Vec::new();
    if rng.chance(1, 32) {
        let n = rng.below(256) as usize;
        stream = rng.bytes(n);
    } else {
        for _ in 0..1 + rng.below(3) {
            let p = generator::payload(rng, protocol, None);
            stream.extend(generator::frame(rng, &p, cap));
        }
    }
    let mut decoder = FrameDecoder::new(cap);
    let mut pos = 0;
    while pos < stream.len() {
        let left = stream.len() - pos;
        let n = if rng.chance(1, 2) {
            left
        } else {
            1 + rng.index(left)
        };
        decoder.push(&stream[pos..pos + n]);
        pos += n;
        loop {
            match decoder.next_payload() {
                Ok(Some(payload)) => {
                    out.frames += 1;
                    decode_payload(protocol, &payload, out).map_err(|e| {
                        let shown = &payload[..payload.len().min(160)];
                        let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
                        format!("{e}; payload of {} bytes starts {hex}", payload.len())
                    })?;
                }
                Ok(None) => break,
                Err(CodecError::Oversized { size, limit }) => {
                    if size <= limit {
                        return Err(format!(
                            "Oversized for a frame of {size} bytes under the limit {limit}"
                        ));
                    }
                    out.count("oversized");
                    // A server answers frame_too_large and closes here.
                    return Ok(());
                }
                Err(e) => {
                    return Err(format!(
                        "the frame splitter failed with {e:?}; only Oversized is expected"
                    ));
                }
            }
        }
    }
    if decoder.finish().is_err() {
        out.count("truncated");
    }
    Ok(())
}

fn decode_payload(protocol: Protocol, payload: &[u8], out: &mut Outcomes) -> Result<(), String> {
    let envelope = match from_payload::<Envelope>(payload) {
        Ok(_) => true,
        Err(CodecError::Malformed(_)) => false,
        Err(e) => {
            return Err(format!(
                "decoding the envelope failed with {e:?}; only Malformed is expected"
            ));
        }
    };
    match protocol {
        Protocol::App => {
            if check::<AppRequest>(payload, "app_request", out, true)? && !envelope {
                // serde's internally tagged enums also take a variant *index* as the tag
                // (`{"type": 0, ...}` is a hello); the endpoint routes on the string `type` of
                // the envelope first and answers such a frame `malformed_frame`, as the protocol
                // says. Anything else that decodes as a request must pass the envelope.
                #[derive(serde::Deserialize)]
                struct StringTag {
                    #[serde(rename = "type")]
                    _kind: String,
                }
                if from_payload::<StringTag>(payload).is_ok() {
                    return Err("decodes as an AppRequest but not as an Envelope (the endpoint would call it malformed)".into());
                }
                out.count("app_request: decoded with a non-string type tag");
            }
            check::<AppResponse>(payload, "app_response", out, true)?;
        }
        Protocol::Cluster => {
            check::<WorkerToCoordinator>(payload, "worker_to_coordinator", out, true)?;
            check::<CoordinatorToWorker>(payload, "coordinator_to_worker", out, true)?;
        }
    }
    Ok(())
}

/// Decode as `T`; a success must survive encode → decode → encode byte for byte. Returns
/// whether it decoded.
fn check<T: DeserializeOwned + Serialize>(
    payload: &[u8],
    what: &str,
    out: &mut Outcomes,
    round_trip: bool,
) -> Result<bool, String> {
    match from_payload::<T>(payload) {
        Ok(msg) => {
            out.count(&format!("{what}: decoded"));
            if round_trip {
                let once = to_payload(&msg)
                    .map_err(|e| format!("a decoded {what} does not encode: {e}"))?;
                let again: T = from_payload(&once).map_err(|e| {
                    format!("a decoded {what}, encoded again, does not decode: {e}")
                })?;
                let twice = to_payload(&again).map_err(|e| format!("{what}: {e}"))?;
                if once != twice {
                    return Err(format!(
                        "a decoded {what} changes on encode → decode → encode"
                    ));
                }
            }
            Ok(true)
        }
        Err(CodecError::Malformed(_)) => {
            out.count(&format!("{what}: malformed"));
            Ok(false)
        }
        Err(e) => Err(format!(
            "decoding {what} failed with {e:?}; only Malformed is expected"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_a_case_is_caught_and_the_hook_stays_quiet_only_for_cases() {
        install_quiet_hook();
        QUIET.with(|q| q.set(true));
        let r = catch_unwind(|| panic!("boom in a case"));
        QUIET.with(|q| q.set(false));
        let p = r.unwrap_err();
        assert_eq!(panic_message(&*p), "boom in a case");
    }

    #[test]
    fn a_failing_case_is_reported_with_the_command_that_replays_it() {
        let args = FuzzArgs::new(Target::AppDecoder, 10, 42);
        let mut r = empty_report(&args);
        r.failure(&args, 7, "boom".into());
        assert!(!r.ok);
        assert_eq!(
            r.failures[0].reproduce,
            "testbed fuzz --target app-decoder --seed 42 --first-case 7 --cases 1"
        );
    }
}

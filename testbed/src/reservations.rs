//! `testbed reservations submit|list`: the operator's end of the Morpheus loop (§3, §6). Accepted
//! SLO contracts from the `inference` crate (a JSON array of `inference::slo::SloContract`, as
//! the crate serializes them after the owner's sign-off, override or rejection) become recurring
//! reservations on a running coordinator, sent through a worker's app endpoint with the app
//! protocol's `reserve` (or `update_reservation` when the reservation exists already), owned by
//! the app whose credentials are given: the app that will run the jobs. `list` prints the app's
//! reservations and the plan's free capacity over the next day.
//!
//! The conversion of a contract into a request is `coordinator::contracts` (shared with the
//! operator's `coordinator reservations submit`).

use crate::client::{AppClient, ClientError, ConnectOptions};
use anyhow::{Context, bail};
use inference::slo::SloContract;
use scheduler_core::Resources;
use serde::Serialize;
use std::path::PathBuf;

pub use coordinator::contracts::{Sizing, definition_of, reservation_id_of, skyline_runs};

/// What happened to one contract.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubmitResult {
    pub job: String,
    pub reservation_id: String,
    pub accepted: bool,
    /// `reserve` or `update_reservation`; absent when nothing was sent.
    pub op: Option<&'static str>,
    pub allocation: Vec<scheduler_core::reservation::AllocationInterval>,
    pub reason: Option<String>,
}

/// Submit every signed-off contract as a recurring reservation of the client's app; a contract
/// whose reservation exists already updates it.
pub async fn submit_contracts(
    client: &AppClient,
    contracts: &[SloContract],
    sizing: Sizing,
) -> Vec<SubmitResult> {
    let mut out = Vec::with_capacity(contracts.len());
    for c in contracts {
        let reservation_id = reservation_id_of(&c.job);
        let mut result = SubmitResult {
            job: c.job.clone(),
            reservation_id: reservation_id.clone(),
            accepted: false,
            op: None,
            allocation: Vec::new(),
            reason: None,
        };
        let definition = match definition_of(c, sizing) {
            Ok(d) => d,
            Err(reason) => {
                result.reason = Some(reason);
                out.push(result);
                continue;
            }
        };
        let mut answer = client.reserve(&reservation_id, definition.clone()).await;
        result.op = Some("reserve");
        if let Err(ClientError::Server(e)) = &answer
            && e.message.contains("already exists")
        {
            answer = client.update_reservation(&reservation_id, definition).await;
            result.op = Some("update_reservation");
        }
        match answer {
            Ok(a) => {
                result.accepted = true;
                result.allocation = a.allocation;
            }
            Err(e) => result.reason = Some(e.to_string()),
        }
        out.push(result);
    }
    out
}

/// Options shared by both commands: how to reach a worker's app endpoint.
#[derive(Debug, Clone, clap::Args)]
pub struct EndpointArgs {
    /// App endpoint of a worker: tls://HOST:PORT (needs --ca-cert), unix:///PATH, or plaintext
    /// tcp://HOST:PORT.
    #[arg(long)]
    pub endpoint: String,
    /// The cluster CA certificate (ca.pem) that tls:// workers' certificates must chain to.
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
    /// The app that owns the reservations (the one that runs the jobs).
    #[arg(long, env = "TESTBED_APP_ID")]
    pub app_id: String,
    #[arg(long, env = "TESTBED_APP_SECRET")]
    pub app_secret: String,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `testbed reservations`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReservationsArgs {
    #[command(subcommand)]
    pub command: ReservationsCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ReservationsCommand {
    /// Submit the signed-off contracts of CONTRACTS (a JSON array of inference SloContract) as
    /// recurring reservations of the app; prints one result per contract. Exits 1 if any
    /// signed-off contract was not accepted.
    Submit {
        #[command(flatten)]
        endpoint: EndpointArgs,
        /// Millicores of one container of the skylines.
        #[arg(long, default_value_t = 1000)]
        container_cpu_millis: u64,
        /// MiB of one container of the skylines.
        #[arg(long, default_value_t = 1024)]
        container_memory_mib: u64,
        /// Length of one skyline step.
        #[arg(long, default_value_t = 60_000)]
        skyline_step_ms: u64,
        contracts: PathBuf,
    },
    /// The app's reservations and the plan's free capacity over the next day.
    List {
        #[command(flatten)]
        endpoint: EndpointArgs,
    },
    /// Operator-wide: every reservation (all apps) and the plan's free capacity over the next
    /// period, from the coordinator's `GET /reservations` on its metrics listener
    /// (`--metrics-listen`). The guarantor republishes it every plan step and on every change.
    Agenda {
        /// host:port of the coordinator's metrics listener.
        #[arg(long)]
        http: String,
        #[arg(long)]
        json: bool,
    },
}

/// The largest agenda answer read (a plan of 1,000 reservations is well under it).
const MAX_AGENDA_BYTES: u64 = 64 << 20;

/// `GET /reservations` from the coordinator at `addr` (plain HTTP/1.0, one request).
pub fn fetch_agenda(addr: &str) -> anyhow::Result<coordinator::metrics::AgendaView> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let timeout = std::time::Duration::from_secs(10);
    let target = addr
        .to_socket_addrs()
        .with_context(|| format!("--http {addr:?} is not host:port"))?
        .next()
        .with_context(|| format!("--http {addr:?} resolves to no address"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&target, timeout)
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(format!("GET /reservations HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut raw = Vec::new();
    stream
        .take(MAX_AGENDA_BYTES)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the answer of {addr}"))?;
    let text = String::from_utf8(raw).context("the answer is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("{addr} did not answer HTTP"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200") {
        bail!("{addr} answered {status:?} to GET /reservations");
    }
    serde_json::from_str(body).context("GET /reservations: not an agenda")
}

/// The agenda as the operator reads it: reservations, then free capacity from now over one
/// agenda (wrapping at its end).
pub fn print_agenda(view: &coordinator::metrics::AgendaView) {
    let cap = view.plan_capacity;
    println!(
        "{} reservation(s); plan capacity {} millicores, {} MiB; agenda {} h, now at {}",
        view.reservations.len(),
        cap.cpu_millis,
        cap.memory_mib,
        view.agenda_ms / 3_600_000,
        hours(view.agenda_now_ms)
    );
    for r in &view.reservations {
        let d = &r.definition;
        println!(
            "  {} (app {}): window {}-{}, every {} min, {} stage(s); now allocated {}, used {}; allocation {}",
            r.id,
            r.owner,
            hours(d.arrival_ms),
            hours(d.deadline_ms),
            d.recurrence_ms.map_or(0, |p| p / 60_000),
            d.stages.len(),
            r.allocated_now,
            r.used,
            r.allocation
                .iter()
                .map(|a| format!(
                    "{}-{} {}m",
                    hours(a.start_ms),
                    hours(a.end_ms),
                    a.cpu_millis
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!("free GUARANTEED capacity over the next period (agenda time):");
    let now = view.agenda_now_ms;
    let from_now = view
        .free
        .iter()
        .filter(|f| f.end_ms > now)
        .chain(view.free.iter().filter(|f| f.end_ms <= now));
    for f in from_now {
        println!(
            "  {}-{}  {} millicores, {} MiB",
            hours(f.start_ms.max(if f.end_ms > now { now } else { 0 })),
            hours(f.end_ms),
            f.cpu_millis,
            f.memory_mib
        );
    }
}

async fn connect(e: &EndpointArgs) -> anyhow::Result<AppClient> {
    let options = ConnectOptions::from_ca_cert(e.ca_cert.as_deref())?;
    let (events, _) = tokio::sync::mpsc::unbounded_channel();
    AppClient::connect_with(&e.endpoint, &options, &e.app_id, &e.app_secret, events)
        .await
        .with_context(|| format!("connecting to {}", e.endpoint))
}

fn hours(ms: u64) -> String {
    format!("{:02}:{:02}", ms / 3_600_000, ms / 60_000 % 60)
}

pub fn run(args: &ReservationsArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    match &args.command {
        ReservationsCommand::Submit {
            endpoint,
            container_cpu_millis,
            container_memory_mib,
            skyline_step_ms,
            contracts,
        } => {
            if *skyline_step_ms == 0 {
                bail!("--skyline-step-ms must be positive");
            }
            let text = std::fs::read_to_string(contracts)
                .with_context(|| format!("reading {}", contracts.display()))?;
            let contracts: Vec<SloContract> = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not a JSON array of SLO contracts",
                    contracts.display()
                )
            })?;
            let sizing = Sizing {
                container: Resources::new(*container_cpu_millis, *container_memory_mib),
                step_ms: *skyline_step_ms,
            };
            let results = rt.block_on(async {
                let client = connect(endpoint).await?;
                anyhow::Ok(submit_contracts(&client, &contracts, sizing).await)
            })?;
            if endpoint.json {
                println!("{}", serde_json::json!({ "results": results }));
            } else {
                for r in &results {
                    match (&r.reason, r.accepted) {
                        (_, true) => println!(
                            "{}: accepted as reservation {} ({} interval(s) of allocation)",
                            r.job,
                            r.reservation_id,
                            r.allocation.len()
                        ),
                        (Some(why), false) => println!("{}: not reserved: {why}", r.job),
                        (None, false) => println!("{}: not reserved", r.job),
                    }
                }
            }
            let failed = results.iter().any(|r| !r.accepted && r.op.is_some());
            if failed {
                std::process::exit(1);
            }
            Ok(())
        }
        ReservationsCommand::Agenda { http, json } => {
            let view = fetch_agenda(http)?;
            if *json {
                println!("{}", serde_json::to_string(&view)?);
            } else {
                print_agenda(&view);
            }
            Ok(())
        }
        ReservationsCommand::List { endpoint } => {
            let list = rt.block_on(async {
                let client = connect(endpoint).await?;
                client
                    .list_reservations()
                    .await
                    .context("list_reservations")
            })?;
            if endpoint.json {
                println!(
                    "{}",
                    serde_json::json!({ "reservations": list.reservations, "free": list.free })
                );
                return Ok(());
            }
            for r in &list.reservations {
                let d = &r.definition;
                println!(
                    "{}: window {}-{} UTC, every {} min, {} stage(s); now allocated {}, used {}",
                    r.reservation_id,
                    hours(d.arrival_ms),
                    hours(d.deadline_ms),
                    d.recurrence_ms.map_or(0, |p| p / 60_000),
                    d.stages.len(),
                    r.allocated_now,
                    r.used
                );
            }
            println!("free GUARANTEED capacity over the day (UTC):");
            for f in &list.free {
                println!(
                    "  {}-{}  {} millicores, {} MiB",
                    hours(f.start_ms),
                    hours(f.end_ms),
                    f.cpu_millis,
                    f.memory_mib
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference::slo::{ContractStatus, SloRule};
    use scheduler_core::protocol::limits::MAX_RESERVATION_STAGES;
    use scheduler_core::reservation::Interpreter;

    fn contract(skyline: Option<Vec<u64>>, status: ContractStatus) -> SloContract {
        SloContract {
            job: "nightly etl/v2".into(),
            period: 86_400.0,
            earliest_start: 3_600.0,
            deadline: 7_200.0,
            skyline,
            status,
            start_rule: SloRule::SubmitPercentile,
            deadline_rule: SloRule::EndPercentileFallback,
            overridden: vec![],
        }
    }

    const SIZING: Sizing = Sizing {
        container: Resources::new(1000, 1024),
        step_ms: 60_000,
    };

    #[test]
    fn a_signed_off_contract_becomes_a_recurring_order_no_gap_request() {
        let c = contract(
            Some(vec![0, 2, 2, 0, 3, 3, 3, 0]),
            ContractStatus::SignedOff,
        );
        let d = definition_of(&c, SIZING).unwrap();
        assert_eq!(d.recurrence_ms, Some(86_400_000));
        assert_eq!((d.arrival_ms, d.deadline_ms), (3_600_000, 7_200_000));
        assert_eq!(d.interpreter, Interpreter::OrderNoGap);
        let shape: Vec<(u32, u32, u64)> = d
            .stages
            .iter()
            .map(|s| (s.containers, s.gang, s.duration_ms))
            .collect();
        // Leading and trailing idle steps dropped; the inner one held at one container.
        assert_eq!(
            shape,
            vec![(2, 2, 120_000), (1, 1, 60_000), (3, 3, 180_000)]
        );
        assert_eq!(reservation_id_of(&c.job), "nightly-etl-v2");
    }

    #[test]
    fn contracts_without_sign_off_or_skyline_are_not_reserved() {
        for (c, why) in [
            (
                contract(Some(vec![1]), ContractStatus::Proposed),
                "not signed off",
            ),
            (
                contract(Some(vec![1]), ContractStatus::Rejected),
                "rejected",
            ),
            (contract(None, ContractStatus::SignedOff), "skyline"),
            (
                contract(Some(vec![0, 0]), ContractStatus::SignedOff),
                "skyline",
            ),
        ] {
            let e = definition_of(&c, SIZING).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn long_skylines_are_coarsened_without_holding_less() {
        let skyline: Vec<u64> = (0..200).map(|i| 1 + (i * 7 % 5)).collect();
        let runs = skyline_runs(&skyline, MAX_RESERVATION_STAGES);
        assert!(runs.len() <= MAX_RESERVATION_STAGES);
        assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), 200);
        // Every step holds at least what the skyline asks.
        let mut t = 0;
        for (c, n) in runs {
            for _ in 0..n {
                assert!(c >= skyline[t]);
                t += 1;
            }
        }
    }
}

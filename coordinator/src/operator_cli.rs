//! The operator commands of the `coordinator` binary that talk to a running coordinator over its
//! admin socket ([`crate::admin`]): `status`, `nodes`, `node drain|undrain`, `apps
//! list|add|remove|quota`, `reservations list|submit|delete`, `waiting`, `explain`, `shedding`, `top`.
//! Every command prints a table, or with `--json` the coordinator's reply as one JSON value.

use crate::admin::{self, AdminError, AdminRequest};
use scheduler_core::quota::QueueableQuota;
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Where the running coordinator is, and how to print.
#[derive(clap::Args, Clone, Debug)]
pub struct AdminArgs {
    /// The running coordinator's data dir (its admin socket is DATA_DIR/admin.sock).
    #[arg(
        long,
        env = "COORDINATOR_DATA_DIR",
        required_unless_present = "admin_socket"
    )]
    pub data_dir: Option<PathBuf>,
    /// The admin socket itself, instead of --data-dir.
    #[arg(long, env = "COORDINATOR_ADMIN_SOCKET")]
    pub admin_socket: Option<PathBuf>,
    /// Print the coordinator's reply as JSON.
    #[arg(long)]
    pub json: bool,
}

impl AdminArgs {
    fn socket(&self) -> PathBuf {
        match (&self.admin_socket, &self.data_dir) {
            (Some(s), _) => s.clone(),
            (None, Some(d)) => admin::socket_path(d),
            (None, None) => admin::socket_path(std::path::Path::new(".")),
        }
    }
}

/// QUEUEABLE quota flags (unlimited when absent).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct QuotaFlags {
    /// At most this many outstanding QUEUEABLE containers.
    #[arg(long)]
    pub max_queueable: Option<u32>,
    /// At most this many QUEUEABLE containers per GUARANTEED container the app holds.
    #[arg(long)]
    pub max_queueable_per_guaranteed: Option<f64>,
}

impl From<QuotaFlags> for QueueableQuota {
    fn from(q: QuotaFlags) -> QueueableQuota {
        QueueableQuota {
            max_queueable: q.max_queueable,
            max_queueable_per_guaranteed: q.max_queueable_per_guaranteed,
        }
    }
}

/// Commands to a running coordinator.
#[derive(clap::Subcommand, Debug)]
pub enum OperatorCommand {
    /// Cluster totals: nodes, capacity, bookings, containers, waiting work, reservations.
    Status(AdminArgs),
    /// Every joined node: capacity, GUARANTEED booked, R, containers, draining.
    Nodes(AdminArgs),
    /// Drain or undrain a node.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Registered applications, live (`coordinator app add` works with the coordinator stopped).
    Apps {
        #[command(subcommand)]
        command: AppsCommand,
    },
    /// The reservation agenda.
    Reservations {
        #[command(subcommand)]
        command: ReservationsCommand,
    },
    /// Waiting GUARANTEED asks, each with why it waits.
    Waiting(AdminArgs),
    /// Why a job's GUARANTEED asks wait.
    Explain {
        /// The job id its asks carry.
        job: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Set the shedding policy live: off, avg+sigma, avg+2sigma or mean+N*sigma.
    Shedding {
        policy: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Set k of top-k live (1 to 10,000): workers adopt it with their next heartbeat ack.
    TopK {
        k: usize,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A live terminal view of the busiest nodes and their queues (Ctrl-C to leave).
    Top {
        /// Refresh period.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes (0: until interrupted).
        #[arg(long, default_value_t = 0)]
        iterations: u64,
        /// Nodes shown.
        #[arg(long, default_value_t = 20)]
        rows: usize,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum NodeCommand {
    /// No new work goes to NAME (its capacity leaves the reservation plan); what runs there
    /// finishes. `nodes` shows it `drained` once nothing runs there: then stop its worker.
    Drain {
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// NAME takes new work again.
    Undrain {
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum AppsCommand {
    /// Apps with their quotas and what they run.
    List(AdminArgs),
    /// Register an app; prints its secret once.
    Add {
        app_id: String,
        #[command(flatten)]
        quota: QuotaFlags,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Unregister an app: new requests are refused; running containers finish.
    Remove {
        app_id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Replace an app's QUEUEABLE quota (absent flags: unlimited).
    Quota {
        app_id: String,
        #[command(flatten)]
        quota: QuotaFlags,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum ReservationsCommand {
    /// Every reservation and the plan's free capacity over the agenda.
    List(AdminArgs),
    /// Submit the signed-off SLO contracts of CONTRACTS (a JSON array of inference
    /// SloContract, as `inference contracts` writes them) as recurring reservations owned by
    /// APP; a reservation that exists already is updated. One result per contract.
    Submit {
        contracts: std::path::PathBuf,
        /// The registered app that will run the jobs and owns the reservations.
        #[arg(long)]
        app: String,
        /// Millicores of one container of the skylines.
        #[arg(long, default_value_t = 1000)]
        container_cpu_millis: u64,
        /// MiB of one container of the skylines.
        #[arg(long, default_value_t = 1024)]
        container_memory_mib: u64,
        /// Length of one skyline step.
        #[arg(long, default_value_t = 60_000)]
        skyline_step_ms: u64,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Delete a reservation, whoever owns it; its waiting asks are refused.
    Delete {
        id: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// Run one operator command, printing to `out`.
pub fn run(command: OperatorCommand, out: &mut dyn Write) -> Result<(), AdminError> {
    let (admin, request, render): (AdminArgs, AdminRequest, fn(&Value) -> String) = match command {
        OperatorCommand::Status(a) => (a, AdminRequest::Status, render_status),
        OperatorCommand::Nodes(a) => (a, AdminRequest::Nodes, render_nodes),
        OperatorCommand::Node {
            command: NodeCommand::Drain { name, admin },
        } => (admin, AdminRequest::Drain { node: name }, render_drain),
        OperatorCommand::Node {
            command: NodeCommand::Undrain { name, admin },
        } => (admin, AdminRequest::Undrain { node: name }, render_drain),
        OperatorCommand::Apps { command } => match command {
            AppsCommand::List(a) => (a, AdminRequest::Apps, render_apps),
            AppsCommand::Add {
                app_id,
                quota,
                admin,
            } => (
                admin,
                AdminRequest::AppAdd {
                    app_id,
                    quota: quota.into(),
                },
                render_json,
            ),
            AppsCommand::Remove { app_id, admin } => {
                (admin, AdminRequest::AppRemove { app_id }, render_json)
            }
            AppsCommand::Quota {
                app_id,
                quota,
                admin,
            } => (
                admin,
                AdminRequest::AppQuota {
                    app_id,
                    quota: quota.into(),
                },
                render_json,
            ),
        },
        OperatorCommand::Reservations { command } => match command {
            ReservationsCommand::List(a) => (a, AdminRequest::Reservations, render_reservations),
            ReservationsCommand::Delete { id, admin } => {
                (admin, AdminRequest::ReservationDelete { id }, render_json)
            }
            ReservationsCommand::Submit {
                contracts,
                app,
                container_cpu_millis,
                container_memory_mib,
                skyline_step_ms,
                admin,
            } => {
                let sizing = crate::contracts::Sizing {
                    container: scheduler_core::Resources::new(
                        container_cpu_millis,
                        container_memory_mib,
                    ),
                    step_ms: skyline_step_ms,
                };
                return submit_contracts(&admin, &contracts, &app, sizing, out);
            }
        },
        OperatorCommand::Waiting(a) => (a, AdminRequest::Waiting, render_waiting),
        OperatorCommand::Explain { job, admin } => {
            (admin, AdminRequest::Explain { job }, render_explain)
        }
        OperatorCommand::Shedding { policy, admin } => {
            (admin, AdminRequest::Shedding { policy }, render_json)
        }
        OperatorCommand::TopK { k, admin } => (admin, AdminRequest::TopK { k }, render_json),
        OperatorCommand::Top {
            interval_ms,
            iterations,
            rows,
            admin,
        } => return top(&admin, interval_ms, iterations, rows, out),
    };
    let reply = admin::call(&admin.socket(), &request)?;
    let text = if admin.json {
        format!("{reply}\n")
    } else {
        render(&reply)
    };
    let _ = out.write_all(text.as_bytes());
    Ok(())
}

/// `coordinator reservations submit`: each signed-off contract becomes one admin request (so no
/// request line nears the socket's line bound), and each gets a result line.
fn submit_contracts(
    admin: &AdminArgs,
    path: &std::path::Path,
    app: &str,
    sizing: crate::contracts::Sizing,
    out: &mut dyn Write,
) -> Result<(), AdminError> {
    let bad = |reason: String| AdminError::Refused(reason);
    if sizing.step_ms == 0 {
        return Err(bad("--skyline-step-ms must be positive".into()));
    }
    let file = std::fs::read_to_string(path)
        .map_err(|e| bad(format!("reading {}: {e}", path.display())))?;
    let contracts: Vec<inference::slo::SloContract> = serde_json::from_str(&file).map_err(|e| {
        bad(format!(
            "{} is not a JSON array of SLO contracts: {e}",
            path.display()
        ))
    })?;
    let mut results = Vec::with_capacity(contracts.len());
    for contract in &contracts {
        let reservation_id = crate::contracts::reservation_id_of(&contract.job);
        let result = match crate::contracts::definition_of(contract, sizing) {
            Err(reason) => serde_json::json!({
                "job": contract.job, "reservation_id": reservation_id,
                "accepted": false, "reason": reason,
            }),
            Ok(definition) => {
                let request = AdminRequest::ReservationSubmit {
                    app_id: app.to_string(),
                    reservation_id: reservation_id.clone(),
                    definition,
                };
                match admin::call(&admin.socket(), &request) {
                    Ok(mut reply) => {
                        reply["job"] = Value::from(contract.job.clone());
                        reply
                    }
                    Err(AdminError::Refused(reason)) => serde_json::json!({
                        "job": contract.job, "reservation_id": reservation_id,
                        "accepted": false, "reason": reason,
                    }),
                    Err(e) => return Err(e),
                }
            }
        };
        results.push(result);
    }
    let printed = if admin.json {
        format!("{}\n", serde_json::json!({ "results": results }))
    } else {
        results
            .iter()
            .map(|r| {
                if r["accepted"] == true {
                    format!(
                        "{}: {} as reservation {} of {app} ({} interval(s) of allocation)\n",
                        text(&r["job"]),
                        if r["op"] == "update_reservation" {
                            "updated"
                        } else {
                            "accepted"
                        },
                        text(&r["reservation_id"]),
                        r["allocation"].as_array().map_or(0, Vec::len)
                    )
                } else {
                    format!(
                        "{}: not reserved: {}\n",
                        text(&r["job"]),
                        text(&r["reason"])
                    )
                }
            })
            .collect()
    };
    let _ = out.write_all(printed.as_bytes());
    Ok(())
}

fn top(
    admin: &AdminArgs,
    interval_ms: u64,
    iterations: u64,
    rows: usize,
    out: &mut dyn Write,
) -> Result<(), AdminError> {
    let mut shown = 0u64;
    loop {
        let status = admin::call(&admin.socket(), &AdminRequest::Status)?;
        let mut nodes = admin::call(&admin.socket(), &AdminRequest::Nodes)?;
        let list = nodes.as_array_mut().map(std::mem::take).unwrap_or_default();
        let frame = if admin.json {
            let mut busiest = list;
            sort_busiest(&mut busiest);
            busiest.truncate(rows);
            format!(
                "{}\n",
                serde_json::json!({"status": status, "nodes": busiest})
            )
        } else {
            let mut busiest = list;
            sort_busiest(&mut busiest);
            let total = busiest.len();
            busiest.truncate(rows);
            // Clear the screen and home the cursor, then redraw (a terminal view, like top).
            format!(
                "\x1b[2J\x1b[H{}\nbusiest {} of {} nodes by R:\n{}",
                render_status(&status),
                busiest.len(),
                total,
                render_nodes(&Value::Array(busiest))
            )
        };
        let _ = out.write_all(frame.as_bytes());
        let _ = out.flush();
        shown += 1;
        if iterations > 0 && shown >= iterations {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(interval_ms.max(100)));
    }
}

/// Busiest first: largest R, then most queued.
fn sort_busiest(nodes: &mut [Value]) {
    nodes.sort_by(|a, b| {
        let r = |v: &Value| v["queue_delay_ms"].as_f64().unwrap_or(0.0);
        r(b).total_cmp(&r(a))
            .then(b["queued"].as_u64().cmp(&a["queued"].as_u64()))
    });
}

fn render_json(v: &Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    )
}

fn cpu(v: &Value) -> String {
    match v["cpu_millis"].as_u64() {
        Some(m) => format!("{}m", m),
        None => "-".into(),
    }
}

fn mem(v: &Value) -> String {
    match v["memory_mib"].as_u64() {
        Some(m) => format!("{m}Mi"),
        None => "-".into(),
    }
}

fn res(v: &Value) -> String {
    format!("{} {}", cpu(v), mem(v))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Columns padded to their widest cell.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(cell);
            if i + 1 < cells.len() {
                s.push_str(&" ".repeat(w.saturating_sub(cell.chars().count())));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

fn render_status(v: &Value) -> String {
    let threshold = match v["shedding_threshold_ms"].as_f64() {
        Some(ms) => format!("{ms:.0} ms"),
        None => "off".into(),
    };
    format!(
        "nodes {} ({} draining, {} lost) · apps {} · placer {}\n\
         capacity {} · GUARANTEED booked {}\n\
         containers running {} · queued {} · GUARANTEED waiting {}\n\
         shedding threshold {} · reservations {}\n",
        text(&v["nodes"]),
        text(&v["nodes_draining"]),
        text(&v["nodes_lost"]),
        text(&v["apps"]),
        text(&v["placer"]),
        res(&v["capacity"]),
        res(&v["guaranteed_booked"]),
        text(&v["containers_running"]),
        text(&v["containers_queued"]),
        text(&v["guaranteed_waiting"]),
        threshold,
        text(&v["reservations"]),
    )
}

fn render_nodes(v: &Value) -> String {
    let rows = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let state = if n["drained"] == true {
                "drained"
            } else if n["draining"] == true {
                "draining"
            } else {
                "ready"
            };
            vec![
                text(&n["node_id"]),
                text(&n["rack"]),
                res(&n["capacity"]),
                res(&n["guaranteed_booked"]),
                format!("{:.0}", n["queue_delay_ms"].as_f64().unwrap_or(0.0)),
                format!(
                    "{}G/{}Q",
                    text(&n["running_guaranteed"]),
                    text(&n["running_queueable"])
                ),
                text(&n["queued"]),
                state.into(),
            ]
        })
        .collect();
    table(
        &[
            "NODE", "RACK", "CAPACITY", "G BOOKED", "R_MS", "RUNNING", "QUEUED", "STATE",
        ],
        rows,
    )
}

fn render_drain(v: &Value) -> String {
    let node = text(&v["node_id"]);
    let what = match (v["draining"] == true, v["changed"] == true) {
        (true, true) => {
            "is draining now: no new work; `coordinator nodes` shows it drained once nothing runs there"
        }
        (true, false) => "was already draining",
        (false, true) => "takes new work again",
        (false, false) => "was not draining",
    };
    format!("{node} {what}\n")
}

fn render_apps(v: &Value) -> String {
    let rows = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let q = &a["quota"];
            let quota = match (
                q["max_queueable"].as_u64(),
                q["max_queueable_per_guaranteed"].as_f64(),
            ) {
                (None, None) => "unlimited".to_string(),
                (m, r) => [
                    m.map(|m| format!("<= {m} Q")),
                    r.map(|r| format!("<= {r} Q per G")),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", "),
            };
            vec![
                text(&a["app_id"]),
                quota,
                text(&a["running_guaranteed"]),
                text(&a["running_queueable"]),
                text(&a["queued"]),
            ]
        })
        .collect();
    table(
        &["APP", "QUEUEABLE QUOTA", "G RUNNING", "Q RUNNING", "QUEUED"],
        rows,
    )
}

fn render_reservations(v: &Value) -> String {
    let rows = v["reservations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let d = &r["definition"];
            vec![
                text(&r["id"]),
                text(&r["owner"]),
                format!("{}-{} ms", text(&d["arrival_ms"]), text(&d["deadline_ms"])),
                d["recurrence_ms"]
                    .as_u64()
                    .map(|p| format!("every {p} ms"))
                    .unwrap_or_else(|| "once".into()),
                res(&r["allocated_now"]),
                res(&r["used"]),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "ID",
            "OWNER",
            "WINDOW",
            "RECURRENCE",
            "ALLOCATED NOW",
            "USED",
        ],
        rows,
    );
    out.push_str(&format!(
        "\nplan capacity {} · agenda now at {} of {} ms · free capacity:\n",
        res(&v["plan_capacity"]),
        text(&v["agenda_now_ms"]),
        text(&v["agenda_horizon_ms"])
    ));
    let free = v["plan_free"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            vec![
                format!("{}-{} ms", text(&f["start_ms"]), text(&f["end_ms"])),
                res(f),
            ]
        })
        .collect();
    out.push_str(&table(&["AGENDA", "FREE"], free));
    out
}

/// `explain`: the job's plain waiting asks, then each 3Sigma job's runtime distribution, the
/// options the last cycle considered and why it was not placed.
fn render_explain(v: &Value) -> String {
    let mut out = String::new();
    if v["waiting"].as_array().is_some_and(|a| !a.is_empty()) {
        out.push_str(&render_waiting(v));
    }
    for j in v["threesigma"].as_array().into_iter().flatten() {
        let b = &j["belief"];
        out.push_str(&format!(
            "3Sigma job {} (ask {}, app {}): {} x {}\n  utility: {}\n  runtime distribution: p10 {:.1} s, p50 {:.1} s, p90 {:.1} s, mean {:.1} s ({})\n  why it waits: {}\n",
            text(&j["job_id"]),
            text(&j["ask_key"]),
            text(&j["app_id"]),
            text(&j["gang"]),
            res(&j["resources"]),
            j["utility"],
            b["p10_s"].as_f64().unwrap_or(0.0),
            b["p50_s"].as_f64().unwrap_or(0.0),
            b["p90_s"].as_f64().unwrap_or(0.0),
            b["mean_s"].as_f64().unwrap_or(0.0),
            text(&b["source"]),
            text(&j["reason"]),
        ));
        let rows = j["options"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| {
                vec![
                    format!(
                        "{} ({} nodes)",
                        text(&o["partition"]),
                        text(&o["node_count"])
                    ),
                    format!("+{:.0} s", o["start_in_s"].as_f64().unwrap_or(0.0)),
                    format!("{:.3}", o["expected_utility"].as_f64().unwrap_or(0.0)),
                    if o["chosen"].as_bool() == Some(true) {
                        "chosen".into()
                    } else {
                        String::new()
                    },
                ]
            })
            .collect();
        out.push_str(&table(&["SET", "START", "EXPECTED UTILITY", ""], rows));
    }
    out
}

fn render_waiting(v: &Value) -> String {
    let rows = v["waiting"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            vec![
                text(&w["app_id"]),
                text(&w["job_id"]),
                text(&w["containers"]),
                res(&w["resources"]),
                text(&w["reservation"]),
                text(&w["reason"]),
            ]
        })
        .collect();
    table(
        &[
            "APP",
            "JOB",
            "CONTAINERS",
            "EACH",
            "RESERVATION",
            "WHY IT WAITS",
        ],
        rows,
    )
}

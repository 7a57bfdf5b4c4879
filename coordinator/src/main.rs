//! `coordinator`: the cluster coordinator of the hybrid scheduler (Mercury coordinator +
//! central GUARANTEED scheduler) serving workers over QUIC.

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use coordinator::config::FileConfig;
use coordinator::datadir::{self, DataDir};
use coordinator::store::Store;
use scheduler_core::quota::QueueableQuota;
use std::net::SocketAddr;
use std::path::PathBuf;

/// How long a stopping coordinator waits for its worker connections' closes to go out.
const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Parser)]
#[command(
    name = "coordinator",
    version,
    about = "Coordinator of the hybrid cluster scheduler: membership, queue-delay aggregation and top-k views, load shedding, policing, promotion, and central GUARANTEED placement, served to workers over QUIC.",
    after_help = "Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=coordinator=debug)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a data dir: cluster CA (10 years), server certificate (1 year, DNS name
    /// hybrid-coordinator), join token, store and apps. Prints {"ca_cert", "join_token", "apps": [{"app_id", "app_secret"}]}
    /// and writes the same JSON to DIR/cluster.json (owner-readable only).
    Init {
        #[arg(long, env = "COORDINATOR_DATA_DIR")]
        data_dir: PathBuf,
        /// Register an application (repeatable); its secret is printed once.
        #[arg(long = "app", value_name = "ID")]
        apps: Vec<String>,
        #[command(flatten)]
        quota: QuotaArgs,
        #[command(flatten)]
        validity: ValidityArgs,
    },
    /// Serve the cluster protocol. Initialises DATA_DIR first if it is empty, then prints
    /// {"event":"listening","quic_addr":"IP:PORT"} on stdout.
    Run(Box<RunArgs>),
    /// Manage registered applications (with the coordinator stopped: the store is locked while
    /// it runs).
    App {
        #[command(subcommand)]
        command: AppCommand,
    },
    /// Verify a data dir without changing it; exit 1 on any problem.
    ///
    /// Checks: files present and owner-only where secret, certificates parse, chain to the CA for the name hybrid-coordinator and do not expire
    /// within 30 days (warning), private keys match, the store passes redb's integrity check and
    /// every record's checksum and decoding, the join-token file matches the store's hash.
    /// Prints one line per finding (or JSON with --json); exits 1 on any problem, 0 otherwise
    /// (warnings included). Reads the store only while the coordinator is stopped (it holds the
    /// store's lock): a locked store is reported as a problem.
    Check {
        #[arg(long, env = "COORDINATOR_DATA_DIR")]
        data_dir: PathBuf,
        /// Print the report as one JSON object: {"data_dir", "ok", "problems", "warnings",
        /// "findings": [{"subject", "severity": "ok"|"warning"|"problem", "detail"}]}.
        #[arg(long)]
        json: bool,
    },
    /// Issue a new server certificate under the same CA (picked up at the coordinator's next
    /// start).
    ///
    /// Replaces server.pem and server.key, signed by the data dir's CA. Workers pin the CA, so nothing else changes. The running coordinator keeps serving the
    /// old certificate until its next start (restart it to switch); works while it runs.
    /// Prints {"server_cert", "not_after"}.
    RotateServerCert {
        #[arg(long, env = "COORDINATOR_DATA_DIR")]
        data_dir: PathBuf,
        /// Validity of the new certificate in days.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..))]
        validity_days: u32,
    },
    /// Replace the join token (with the coordinator stopped).
    ///
    /// Writes a new random token to DIR/join-token (0600), its SHA-256 to the store and the token to cluster.json. Run it with the coordinator stopped (the
    /// store is locked while it runs; the command then refuses, naming the lock). Workers need
    /// the new token to join or re-join: give it to them before restarting the coordinator.
    /// Prints {"join_token_file", "join_token"}.
    RotateJoinToken {
        #[arg(long, env = "COORDINATOR_DATA_DIR")]
        data_dir: PathBuf,
    },
    /// Issue a TLS server certificate for a worker's app endpoint, signed by the cluster CA of
    /// DATA_DIR: writes OUT_DIR/app-cert.pem and OUT_DIR/app-key.pem (0600; give them to
    /// `worker run --app-tls-cert --app-tls-key`). Applications verify the worker with the
    /// cluster ca.pem. Prints {"cert","key","ca_cert"}.
    IssueAppCert(IssueAppCertArgs),
    #[command(flatten)]
    Operator(coordinator::operator_cli::OperatorCommand),
}

/// Validity of the certificates `init` creates.
#[derive(Args, Clone, Copy)]
struct ValidityArgs {
    /// Validity of the cluster CA in days (workers pin it; renewing it means a new data dir).
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..))]
    ca_validity_days: u32,
    /// Validity of the server certificate in days (`rotate-server-cert` renews it).
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..))]
    server_cert_validity_days: u32,
}

#[derive(Args)]
struct IssueAppCertArgs {
    #[arg(long, env = "COORDINATOR_DATA_DIR")]
    data_dir: PathBuf,
    /// The worker's node id (the certificate's common name).
    #[arg(long)]
    node_id: String,
    /// A DNS name applications connect to (repeatable; a subject alternative name).
    #[arg(long = "dns", value_name = "NAME")]
    dns: Vec<String>,
    /// An IP address applications connect to (repeatable; a subject alternative name).
    #[arg(long = "ip", value_name = "ADDR")]
    ips: Vec<std::net::IpAddr>,
    /// Where the certificate and key go (created 0700 if absent; existing files are kept).
    #[arg(long)]
    out_dir: PathBuf,
    /// Validity in days (never past the CA's expiry); issue again to renew.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..))]
    validity_days: u32,
}

#[derive(Subcommand)]
enum AppCommand {
    /// Register an application and print {"app_id", "app_secret"} (the secret is shown once).
    Add {
        #[arg(long, env = "COORDINATOR_DATA_DIR")]
        data_dir: PathBuf,
        #[arg(long)]
        app_id: String,
        #[command(flatten)]
        quota: QuotaArgs,
    },
}

/// Mercury §4.1 QUEUEABLE quota (unlimited when absent).
#[derive(Args, Clone, Copy)]
struct QuotaArgs {
    /// At most this many outstanding QUEUEABLE containers per app.
    #[arg(long)]
    max_queueable: Option<u32>,
    /// At most this many QUEUEABLE containers per GUARANTEED container the app holds.
    #[arg(long)]
    max_queueable_per_guaranteed: Option<f64>,
}

impl QuotaArgs {
    fn quota(self) -> anyhow::Result<QueueableQuota> {
        if let Some(r) = self.max_queueable_per_guaranteed {
            anyhow::ensure!(
                r.is_finite() && r >= 0.0,
                "--max-queueable-per-guaranteed must be a non-negative number, got {r}"
            );
        }
        Ok(QueueableQuota {
            max_queueable: self.max_queueable,
            max_queueable_per_guaranteed: self.max_queueable_per_guaranteed,
        })
    }
}

#[derive(Args)]
struct RunArgs {
    /// Data dir (CA, certificates, join token, store).
    #[arg(long, env = "COORDINATOR_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// QUIC listen address [default: 0.0.0.0:7400].
    #[arg(long, env = "COORDINATOR_LISTEN")]
    listen: Option<SocketAddr>,
    /// TOML file with the same keys as these flags (data_dir, listen, top_k, ...); flags win.
    #[arg(long, env = "COORDINATOR_CONFIG")]
    config: Option<PathBuf>,
    /// k of the top-k list sent to distributed schedulers [default: 50].
    #[arg(long, env = "COORDINATOR_TOP_K")]
    top_k: Option<usize>,
    /// Shedding threshold: off, avg+sigma, avg+2sigma or mean+N*sigma [default: avg+sigma].
    #[arg(long, env = "COORDINATOR_SHEDDING")]
    shedding: Option<String>,
    /// Floor of the shedding threshold in ms [default: 100].
    #[arg(long, env = "COORDINATOR_MIN_SHEDDING_THRESHOLD_MS")]
    min_shedding_threshold_ms: Option<f64>,
    /// A worker silent this long is lost [default: 10000].
    #[arg(long, env = "COORDINATOR_NODE_TIMEOUT_MS")]
    node_timeout_ms: Option<u64>,
    /// Heartbeat period workers are told to use [default: 1000].
    #[arg(long, env = "COORDINATOR_HEARTBEAT_INTERVAL_MS")]
    heartbeat_interval_ms: Option<u64>,
    /// Validity of container tokens [default: 600000].
    #[arg(long, env = "COORDINATOR_TOKEN_TTL_MS")]
    token_ttl_ms: Option<u64>,
    /// Token key rotation period [default: 3600000].
    #[arg(long, env = "COORDINATOR_KEY_ROTATION_MS")]
    key_rotation_ms: Option<u64>,
    /// Period of the timeout sweep, grant expiry and rotation check [default: 500].
    #[arg(long, env = "COORDINATOR_TICK_INTERVAL_MS")]
    tick_interval_ms: Option<u64>,
    /// Seed of the top-k tie-break RNG [default: drawn from the OS and logged].
    #[arg(long, env = "COORDINATOR_SEED")]
    seed: Option<u64>,
    /// Close a connection not joined within this many ms [default: 10000].
    #[arg(long, env = "COORDINATOR_JOIN_TIMEOUT_MS")]
    join_timeout_ms: Option<u64>,
    /// Most connections not joined yet, in all [default: 256].
    #[arg(long, env = "COORDINATOR_MAX_UNJOINED_CONNECTIONS")]
    max_unjoined_connections: Option<usize>,
    /// Most connections not joined yet from one IP address [default: 32].
    #[arg(long, env = "COORDINATOR_MAX_UNJOINED_PER_SOURCE")]
    max_unjoined_per_source: Option<usize>,
    /// Bytes of join answers (each holds the whole directory) in delivery at once; further
    /// joins wait for their turn [default: 8388608].
    #[arg(long, env = "COORDINATOR_JOIN_ANSWER_BYTES_IN_FLIGHT")]
    join_answer_bytes_in_flight: Option<u64>,
    /// Share of the nodes silent at once from which they are no longer all declared lost
    /// (the coordinator presumes the fault is its own or the network's; above 1: off)
    /// [default: 0.55].
    #[arg(long, env = "COORDINATOR_MASS_SILENCE_SHARE")]
    mass_silence_share: Option<f64>,
    /// Nodes declared lost per second while that share is silent and some nodes are still
    /// heard; with every node silent, none is [default: 0.01].
    #[arg(long, env = "COORDINATOR_DECLARATIONS_PER_S_IN_MASS_SILENCE")]
    declarations_per_s_in_mass_silence: Option<f64>,
    /// HTTP address serving Prometheus metrics at GET /metrics (e.g. 127.0.0.1:9400; port 0
    /// picks one) [default: off].
    #[arg(long, env = "COORDINATOR_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Run Pace's resource shaper on GUARANTEED containers that allow it [default: off].
    #[arg(long, env = "COORDINATOR_SHAPING")]
    shaping: Option<bool>,
    /// Shaping pass period in ms [default: 60000, Pace §5].
    #[arg(long, env = "COORDINATOR_SHAPING_INTERVAL_MS")]
    shaping_interval_ms: Option<u64>,
    /// K1 of the safeguard buffer, Pace Eq. 9 [default: 0.05].
    #[arg(long, env = "COORDINATOR_SHAPING_K1")]
    shaping_k1: Option<f64>,
    /// K2 of the safeguard buffer, Pace Eq. 9 [default: 3].
    #[arg(long, env = "COORDINATOR_SHAPING_K2")]
    shaping_k2: Option<f64>,
    /// Usage forecaster: gp or arima [default: gp].
    #[arg(long, env = "COORDINATOR_SHAPING_FORECASTER")]
    shaping_forecaster: Option<String>,
    /// Preemption policy: pessimistic (Algorithm 1) or optimistic [default: pessimistic].
    #[arg(long, env = "COORDINATOR_SHAPING_POLICY")]
    shaping_policy: Option<String>,
    /// Redo each usage series' forecaster fit every N passes [default: 1, every pass].
    #[arg(long, env = "COORDINATOR_SHAPING_REFIT_EVERY")]
    shaping_refit_every: Option<usize>,
    /// Plan GUARANTEED asks that carry a job description with 3Sigma [default: true].
    #[arg(long, env = "COORDINATOR_THREESIGMA")]
    threesigma: Option<bool>,
    /// 3Sigma scheduling interval in ms [default: 1000, 3Sigma §4.3.1].
    #[arg(long, env = "COORDINATOR_THREESIGMA_CYCLE_MS")]
    threesigma_cycle_ms: Option<u64>,
    /// Spacing of start times in 3Sigma's plan-ahead window, seconds [default: 2].
    #[arg(long, env = "COORDINATOR_THREESIGMA_STEP_S")]
    threesigma_step_s: Option<f64>,
    /// Reservation plan step in ms, Morpheus §6.1 [default: 60000].
    #[arg(long, env = "COORDINATOR_PLAN_STEP_MS")]
    plan_step_ms: Option<u64>,
    /// Reservation agenda length in ms: at least one day, a multiple of the step and of every
    /// reservation period [default: 86400000].
    #[arg(long, env = "COORDINATOR_PLAN_HORIZON_MS")]
    plan_horizon_ms: Option<u64>,
    /// Reservation placement: lowcost (Morpheus §6.3, greedy fallback) or greedy [default: lowcost].
    #[arg(long, env = "COORDINATOR_PLAN_ALGORITHM")]
    plan_algorithm: Option<String>,
    /// Place reservations early in their window instead of late [default: false].
    #[arg(long, env = "COORDINATOR_PLAN_ALLOCATE_LEFT")]
    plan_allocate_left: Option<bool>,
    /// LowCost's smoothness factor [default: 10].
    #[arg(long, env = "COORDINATOR_PLAN_SMOOTHNESS")]
    plan_smoothness: Option<u32>,
    /// DRA's T: how long one stretch lasts, ms, Morpheus §7 [default: 60000].
    #[arg(long, env = "COORDINATOR_DRA_EXTENSION_MS")]
    dra_extension_ms: Option<u64>,
    /// DRA's ρ: a stretch gives at most ρ times the recent allocation [default: 2].
    #[arg(long, env = "COORDINATOR_DRA_RHO")]
    dra_rho: Option<f64>,
    /// How far back DRA's recent allocation goes, ms [default: 120000].
    #[arg(long, env = "COORDINATOR_DRA_RECENT_MS")]
    dra_recent_ms: Option<u64>,
}

impl RunArgs {
    fn settings(self) -> anyhow::Result<coordinator::CoordinatorSettings> {
        let file = match &self.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let flags = FileConfig {
            data_dir: self.data_dir,
            listen: self.listen,
            top_k: self.top_k,
            shedding: self.shedding,
            min_shedding_threshold_ms: self.min_shedding_threshold_ms,
            node_timeout_ms: self.node_timeout_ms,
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            token_ttl_ms: self.token_ttl_ms,
            key_rotation_ms: self.key_rotation_ms,
            tick_interval_ms: self.tick_interval_ms,
            seed: self.seed,
            join_timeout_ms: self.join_timeout_ms,
            max_unjoined_connections: self.max_unjoined_connections,
            max_unjoined_per_source: self.max_unjoined_per_source,
            join_answer_bytes_in_flight: self.join_answer_bytes_in_flight,
            mass_silence_share: self.mass_silence_share,
            declarations_per_s_in_mass_silence: self.declarations_per_s_in_mass_silence,
            metrics_listen: self.metrics_listen,
            shaping: self.shaping,
            shaping_interval_ms: self.shaping_interval_ms,
            shaping_k1: self.shaping_k1,
            shaping_k2: self.shaping_k2,
            shaping_forecaster: self.shaping_forecaster,
            shaping_policy: self.shaping_policy,
            shaping_refit_every: self.shaping_refit_every,
            threesigma: self.threesigma,
            threesigma_cycle_ms: self.threesigma_cycle_ms,
            threesigma_step_s: self.threesigma_step_s,
            plan_step_ms: self.plan_step_ms,
            plan_horizon_ms: self.plan_horizon_ms,
            plan_algorithm: self.plan_algorithm,
            plan_allocate_left: self.plan_allocate_left,
            plan_smoothness: self.plan_smoothness,
            dra_extension_ms: self.dra_extension_ms,
            dra_rho: self.dra_rho,
            dra_recent_ms: self.dra_recent_ms,
        };
        Ok(flags.or(file).into_settings()?)
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().command {
        Command::Init {
            data_dir,
            apps,
            quota,
            validity,
        } => {
            let quota = quota.quota()?;
            let apps: Vec<_> = apps.into_iter().map(|a| (a, quota)).collect();
            let validity = datadir::CertValidity {
                ca_days: validity.ca_validity_days,
                server_days: validity.server_cert_validity_days,
            };
            let report = datadir::init_with(
                &DataDir::new(&data_dir),
                &apps,
                validity,
                coordinator::clock::system().now_ms(),
            )
            .with_context(|| format!("initialising {}", data_dir.display()))?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Command::App {
            command:
                AppCommand::Add {
                    data_dir,
                    app_id,
                    quota,
                },
        } => {
            let dir = DataDir::new(&data_dir);
            datadir::secure(&dir)?;
            let store = Store::open(&dir.store())?;
            let app = datadir::add_app(&store, &app_id, quota.quota()?)?;
            println!("{}", serde_json::to_string(&app)?);
            Ok(())
        }
        Command::Check { data_dir, json } => {
            let report =
                coordinator::check::check(&DataDir::new(&data_dir), std::time::SystemTime::now());
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", report.to_text());
            }
            std::process::exit(if report.ok { 0 } else { 1 });
        }
        Command::RotateServerCert {
            data_dir,
            validity_days,
        } => {
            let rotated = datadir::rotate_server_cert(
                &DataDir::new(&data_dir),
                validity_days,
                std::time::SystemTime::now(),
            )
            .with_context(|| {
                format!("rotating the server certificate in {}", data_dir.display())
            })?;
            println!("{}", serde_json::to_string(&rotated)?);
            Ok(())
        }
        Command::RotateJoinToken { data_dir } => {
            let dir = DataDir::new(&data_dir);
            datadir::secure(&dir)?;
            let rotated = datadir::rotate_join_token(&dir)
                .with_context(|| format!("rotating the join token in {}", data_dir.display()))?;
            println!("{}", serde_json::to_string(&rotated)?);
            Ok(())
        }
        Command::IssueAppCert(a) => {
            let issued = coordinator::app_cert::issue_app_cert(
                &DataDir::new(&a.data_dir),
                &a.node_id,
                &a.dns,
                &a.ips,
                &a.out_dir,
                a.validity_days,
            )?;
            println!("{}", serde_json::to_string(&issued)?);
            Ok(())
        }
        Command::Operator(command) => {
            coordinator::operator_cli::run(command, &mut std::io::stdout().lock())?;
            Ok(())
        }
        Command::Run(args) => {
            let settings = args.settings()?;
            actix::System::new().block_on(run(settings))
        }
    }
}

async fn run(settings: coordinator::CoordinatorSettings) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let server = coordinator::start(settings, coordinator::clock::system()).await?;
    if let Some(report) = &server.initialised {
        tracing::info!(
            ca_cert = %report.ca_cert.display(),
            "initialised the data dir (join token and CA are in it; cluster.json has the summary)"
        );
    }
    let mut line =
        serde_json::json!({"event": "listening", "quic_addr": server.quic_addr.to_string()});
    if let Some(addr) = server.metrics_addr {
        line["metrics_addr"] = addr.to_string().into();
    }
    println!("{line}");
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
    }
    if !server.shutdown_and_drain(SHUTDOWN_DRAIN).await {
        tracing::warn!(
            grace_ms = SHUTDOWN_DRAIN.as_millis() as u64,
            "some worker connections had not drained when the stop's grace ran out"
        );
    }
    actix::System::current().stop();
    Ok(())
}

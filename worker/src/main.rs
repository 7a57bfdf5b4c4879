//! `worker`: one per node. See `worker run --help`.

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "worker",
    version,
    about = "Hybrid scheduler worker: distributed scheduler + node runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the cluster and serve applications until SIGINT/SIGTERM (containers are killed then).
    /// Prints {"event":"joined","node_id":"...","app_endpoint":"SCHEME://..."} once joined
    /// (tls://HOST:PORT, tcp://HOST:PORT or unix:///PATH: the endpoint grants name), with
    /// "metrics_addr":"HOST:PORT" when --metrics-listen is set.
    Run(worker::config::RunArgs),
}

#[actix::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Run(args) = Cli::parse().command;
    let config = args.resolve()?;
    let handle = worker::start(config).await?;
    let mut line = serde_json::json!({"event": "joined", "node_id": handle.node_id.as_str(), "app_endpoint": handle.app_endpoint});
    if let Some(addr) = handle.metrics_addr {
        line["metrics_addr"] = addr.to_string().into();
    }
    println!("{line}");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: killing containers");
    handle.shutdown().await;
    Ok(())
}

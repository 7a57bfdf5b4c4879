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
    /// SIGUSR2 (`systemctl reload`) upgrades in place: the worker re-executes its binary (as
    /// installed now) keeping its pid, running containers and listeners; the new image prints the
    /// line again with "adopted": N.
    Run {
        #[command(flatten)]
        args: worker::config::RunArgs,
        /// The binary SIGUSR2 executes [default: this binary's path at start].
        #[arg(long, env = "WORKER_UPGRADE_BINARY")]
        upgrade_binary: Option<std::path::PathBuf>,
        /// Internal: take over from the previous image's hand-over file (set by the upgrade).
        #[arg(long = "adopt-state", hide = true)]
        adopt_state: Option<std::path::PathBuf>,
    },
}

#[actix::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Run {
        args,
        upgrade_binary,
        adopt_state,
    } = Cli::parse().command;
    // Resolved now: after a package manager replaced the file, /proc/self/exe names the
    // deleted old one.
    let upgrade_binary = match upgrade_binary {
        Some(path) => path,
        None => std::env::current_exe()?,
    };
    let config = args.resolve()?;
    // Listened for before the join, so an early reload is not the default action (exit).
    let mut upgrade =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())?;
    let handle = worker::start_adopting(
        config,
        worker::shared::WorkerClock::default().0,
        adopt_state.as_deref(),
    )
    .await?;
    let mut line = serde_json::json!({"event": "joined", "node_id": handle.node_id.as_str(), "app_endpoint": handle.app_endpoint});
    if let Some(addr) = handle.metrics_addr {
        line["metrics_addr"] = addr.to_string().into();
    }
    if adopt_state.is_some() {
        line["adopted"] = handle.adopted.into();
    }
    // Not println!: a reader of the first image's line may have gone by the time an upgraded
    // image prints, and a closed stdout must not stop the worker.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = upgrade.recv() => {
                tracing::info!(binary = %upgrade_binary.display(), "SIGUSR2: upgrading in place");
                let (error, handed_over) = handle.upgrade(&upgrade_binary).await;
                if handed_over {
                    // This image no longer serves its containers; the next start reaps them.
                    tracing::error!("upgrade failed after the hand-over: {error:#}");
                    std::process::exit(1);
                }
                tracing::error!("upgrade refused, still serving: {error:#}");
            }
        }
    }
    tracing::info!("shutting down: killing containers");
    handle.shutdown().await;
    Ok(())
}

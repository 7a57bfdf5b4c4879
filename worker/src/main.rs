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
    // Listened for before anything starts: a stop or a reload while the worker is still
    // joining (the coordinator unreachable, say) is then never the default action, an exit
    // that would leave the containers it adopted running unwatched.
    use tokio::signal::unix::{SignalKind, signal};
    let mut upgrade = signal(SignalKind::user_defined2())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let (handle, joining) = worker::start_joining(
        config,
        worker::shared::WorkerClock::default().0,
        adopt_state.as_deref(),
    )
    .await?;
    let stopped_by = tokio::select! {
        joined = joining.wait() => {
            if let Err(e) = joined {
                // Not serving: what this worker adopted across an upgrade is killed now rather
                // than left running unwatched until the next start.
                tracing::error!("{e:#}: killing containers");
                handle.shutdown().await;
                return Err(e);
            }
            None
        }
        _ = term.recv() => Some("SIGTERM"),
        _ = interrupt.recv() => Some("SIGINT"),
    };
    if let Some(signal) = stopped_by {
        tracing::info!("stopped ({signal}) before joining: killing containers");
        handle.shutdown().await;
        return Ok(());
    }
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
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = term.recv() => break,
            _ = upgrade.recv() => {
                tracing::info!(binary = %upgrade_binary.display(), "SIGUSR2: upgrading in place");
                let (error, handed_over) = handle.upgrade(&upgrade_binary).await;
                if handed_over {
                    // This image no longer serves its containers: they are killed, from the
                    // state dir's records, before it exits.
                    tracing::error!("upgrade failed after the hand-over: {error:#}");
                    handle.reap_after_failed_hand_over().await;
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

//! `testbed`: experiments and tooling around the hybrid scheduler. See `testbed --help`.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "testbed", version, about = "Local clusters, load generation, synthetic tasks and the scheduling simulator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Synthetic task program: run for D ms, hold M MiB, burn a CPU fraction, exit with a code.
    Task(testbed::task::TaskArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Task(args) => std::process::exit(testbed::task::run(&args)?),
    }
}

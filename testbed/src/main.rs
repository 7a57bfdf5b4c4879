//! `testbed`: experiments and tooling around the hybrid scheduler. See `testbed --help`.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "testbed",
    version,
    about = "Local clusters, load generation, synthetic tasks and the scheduling simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Synthetic task program: run for D ms, hold M MiB, burn a CPU fraction, exit with a code.
    Task(testbed::task::TaskArgs),
    /// Simulate a trace or generated workload under one policy (discrete-event, virtual clock).
    Sim(testbed::sim::cli::SimArgs),
    /// Reproduce a paper's experiments on the simulator (`mercury`).
    Experiment(testbed::experiment::cli::ExperimentArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Task(args) => std::process::exit(testbed::task::run(&args)?),
        Command::Sim(args) => testbed::sim::cli::run(&args),
        Command::Experiment(args) => testbed::experiment::cli::run(&args),
    }
}

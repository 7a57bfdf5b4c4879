//! `testbed`: experiments and tooling around the hybrid scheduler. See `testbed --help`.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "testbed", version, about = "Local clusters, load generation, synthetic tasks and the scheduling simulator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}

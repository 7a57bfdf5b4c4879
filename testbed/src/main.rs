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
    /// Start a coordinator and N workers as processes on loopback; print one JSON line; run until Ctrl-C.
    Local(testbed::local::LocalArgs),
    /// A job manager: allocate and start N `testbed task` containers and report counts and latencies.
    Load(testbed::load::LoadArgs),
    /// The demo: a local cluster plus a mixed GUARANTEED/QUEUEABLE workload, explained.
    Demo(testbed::demo::DemoArgs),
    /// The shaping demo: Pace's resource shaper frees reserved-but-unused capacity on a local
    /// cluster and a waiting GUARANTEED container is admitted into it.
    DemoShaping(testbed::demo_shaping::DemoShapingArgs),
    /// The 3Sigma demo: an SLO job goes ahead of best-effort work on a local cluster only when
    /// its runtime distribution says it must.
    #[command(name = "demo-3sigma")]
    Demo3Sigma(testbed::demo_3sigma::Demo3SigmaArgs),
    /// Build a reservation plan (Morpheus LowCost or greedy) and place the requests of a JSON file.
    Plan(testbed::plan::PlanArgs),
    /// Submit accepted SLO contracts (inference) as recurring reservations to a running
    /// coordinator through a worker's app endpoint, or list the app's reservations and the
    /// plan's free capacity (Morpheus §3, §6).
    Reservations(testbed::reservations::ReservationsArgs),
    /// Node-loss check (docker-compose test): start long containers on every worker, print READY,
    /// wait until the victim's containers are reported lost, and check new asks avoid it.
    NodeLossCheck(testbed::demo::NodeLossArgs),
    /// Fuzz a decoder or a worker's app endpoint with seeded structure-aware random frames;
    /// report cases/s, memory growth and any failure with the seed that reproduces it.
    Fuzz(testbed::fuzz::FuzzArgs),
    /// Network-partition check (docker-compose test): `--phase before` holds a GUARANTEED
    /// container on the victim until it is reported lost; `--phase after` checks the re-joined
    /// victim's whole capacity can be granted and started again.
    PartitionCheck(testbed::partition::PartitionArgs),
    /// One real coordinator against N lightweight nodes (real QUIC sessions, synthetic
    /// containers): its CPU per heartbeat, memory per node, GUARANTEED allocate latency and
    /// lost-node detection time.
    Fleet(testbed::fleet::FleetArgs),
    /// The QUIC floor of `fleet`: an echo server that does nothing else, over the coordinator's
    /// QUIC and TLS configuration, against as many connections sending heartbeat-sized requests;
    /// its CPU per answer.
    QuicFloor(testbed::quic_floor::QuicFloorArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Task(args) => std::process::exit(testbed::task::run(&args)?),
        Command::Sim(args) => testbed::sim::cli::run(&args),
        Command::Experiment(args) => testbed::experiment::cli::run(&args),
        Command::Local(args) => testbed::local::run(&args),
        Command::Load(args) => testbed::load::run(&args),
        Command::Demo(args) => testbed::demo::run(&args),
        Command::DemoShaping(args) => testbed::demo_shaping::run(&args),
        Command::Demo3Sigma(args) => testbed::demo_3sigma::run(&args),
        Command::Plan(args) => testbed::plan::run(&args),
        Command::Reservations(args) => testbed::reservations::run(&args),
        Command::NodeLossCheck(args) => testbed::demo::node_loss_check(&args),
        Command::Fuzz(args) => testbed::fuzz::run(&args),
        Command::PartitionCheck(args) => testbed::partition::run(&args),
        Command::Fleet(args) => testbed::fleet::run(&args),
        Command::QuicFloor(args) => testbed::quic_floor::run(&args),
    }
}

//! `kvmesh`: the command-line entry point. `kvmesh up` runs the whole mesh in one process.

mod bench;
mod bench_kserve;
mod bench_request_path;
mod bench_router_service;
mod bench_routing;
mod bench_service;
mod probe;
mod tiny_model;
mod up;

use clap::{Parser, Subcommand};

kvmesh_runtime::global_allocator!();

/// kvmesh: a KV-cache-aware serving mesh for LLM inference.
#[derive(Parser)]
#[command(name = "kvmesh", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the frontend and mock workers in one process, with in-memory discovery and events.
    Up(Box<up::UpOpts>),
    /// Benchmarks of the mesh's cores.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Health check of a kvmesh service (container and Kubernetes probes): exit 0 only when it
    /// serves.
    #[command(subcommand)]
    Probe(Box<probe::ProbeCommand>),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = up::parse_cli::<Cli>();
    match cli.command {
        Command::Up(opts) => up::run(*opts).await,
        Command::Bench(command) => bench::run(command).await,
        Command::Probe(command) => probe::run(*command).await,
    }
}

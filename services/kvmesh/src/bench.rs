//! `kvmesh bench`: load and replay benchmarks of the mesh's cores.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use kvmesh_kv::replay::{self, Assignment, ReplayConfig};

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Replay a Mooncake-format trace through the KV index: block operations per second,
    /// find_matches latency, memory per entry.
    Indexer(IndexerBench),
    /// FindMatches calls per second of one indexer replica over gRPC on loopback.
    IndexerService(IndexerServiceBench),
    /// Routing quality: simulated engines on a virtual clock, the real router in each mode, a
    /// trace or synthetic workload; prefix hit rate, TTFT, latency, throughput and imbalance.
    Routing(Box<crate::bench_routing::RoutingBench>),
    /// Route calls per second of one `kvmesh-router` replica over gRPC on loopback (each
    /// request also reported finished, as a frontend does).
    RouterService(crate::bench_router_service::RouterServiceBench),
    /// One chat request's work across the mesh in one thread, for instruction counts
    /// (callgrind): parse, template, tokenize, worker request, mock engine, KV events, index.
    RequestPath(crate::bench_request_path::RequestPathBench),
    /// A running frontend's KServe gRPC edge under load, side by side with its own
    /// `/v1/completions`; or one `ModelStreamInfer` stream with many requests in flight.
    Kserve(crate::bench_kserve::KserveBench),
}

/// Options of `kvmesh bench indexer-service`.
#[derive(Debug, Args)]
pub struct IndexerServiceBench {
    /// Workers in the index.
    #[arg(long, default_value_t = 64)]
    pub workers: u64,
    /// Blocks each worker holds (chains of 128 blocks sharing 32-block prefixes).
    #[arg(long, default_value_t = 4096)]
    pub blocks_per_worker: u64,
    /// Blocks per query.
    #[arg(long, default_value_t = 128)]
    pub query_blocks: u64,
    /// Concurrent callers (each on its own HTTP/2 connection).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// How trace requests are spread over synthetic workers.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AssignmentArg {
    /// Request i goes to worker i mod N.
    RoundRobin,
    /// By the request's first block (prefix affinity).
    Prefix,
}

/// Options of `kvmesh bench indexer`.
#[derive(Debug, Args)]
pub struct IndexerBench {
    /// Trace file (JSON lines with `hash_ids`, e.g. ../shared/traces/mooncake_fast25_conversation_trace.jsonl).
    #[arg(long)]
    pub trace: PathBuf,
    /// Synthetic workers.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Blocks each worker caches (LRU), so stores, lookups and removals interleave.
    #[arg(long, default_value_t = 16_384)]
    pub blocks_per_worker: usize,
    /// Apply threads of the concurrent index (0: single-threaded index inline).
    #[arg(long, default_value_t = 2)]
    pub lanes: usize,
    /// Blocks per trace hash id.
    #[arg(long, default_value_t = 1)]
    pub expansion: usize,
    /// Copies of the trace over disjoint block ids, interleaved.
    #[arg(long, default_value_t = 1)]
    pub copies: usize,
    /// Request-to-worker assignment.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub assignment: AssignmentArg,
    /// Replay only the first N requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs a benchmark and prints its report.
pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::IndexerService(args) => crate::bench_service::run(args).await,
        BenchCommand::Routing(args) => crate::bench_routing::run(*args).await,
        BenchCommand::RouterService(args) => crate::bench_router_service::run(args).await,
        BenchCommand::RequestPath(args) => crate::bench_request_path::run(&args),
        BenchCommand::Kserve(args) => crate::bench_kserve::run(args).await,
        BenchCommand::Indexer(args) => {
            let config = ReplayConfig {
                workers: args.workers.max(1),
                blocks_per_worker: args.blocks_per_worker.max(1),
                lanes: args.lanes,
                expansion: args.expansion.max(1),
                copies: args.copies.max(1),
                assignment: match args.assignment {
                    AssignmentArg::RoundRobin => Assignment::RoundRobin,
                    AssignmentArg::Prefix => Assignment::Prefix,
                },
                max_requests: args.max_requests,
                ..ReplayConfig::default()
            };
            let trace = args.trace.clone();
            let report =
                tokio::task::spawn_blocking(move || replay::run(&trace, &config)).await??;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("requests            {}", report.requests);
                println!("block ops           {}", report.block_ops);
                println!("block ops/s         {:.0}", report.block_ops_per_sec);
                println!(
                    "block ops/s/core    {:.0}",
                    report.block_ops_per_sec_per_core
                );
                println!("block ops/cpu-s     {:.0}", report.block_ops_per_cpu_sec);
                println!(
                    "find p50 / p99 µs   {:.2} / {:.2}",
                    report.find_p50_us, report.find_p99_us
                );
                println!(
                    "static find p50/p99 {:.2} / {:.2} µs ({:.0} blocks)",
                    report.static_find_p50_us,
                    report.static_find_p99_us,
                    report.static_query_blocks
                );
                println!("entries             {}", report.entries);
                println!("bytes per entry     {:.1}", report.bytes_per_entry);
                println!("prefix hit rate     {:.3}", report.prefix_hit_rate);
            }
            Ok(())
        }
    }
}

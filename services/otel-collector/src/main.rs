//! `kvmesh-otel-collector`: receives OTLP/gRPC traces and answers queries for them over HTTP.

use clap::Parser as _;
use kvmesh_otel_collector::CollectorOpts;

kvmesh_runtime::global_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts = CollectorOpts::parse();
    kvmesh_runtime::telemetry::init_tracing(opts.log_format);
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_otel_collector::run(opts, shutdown).await
}

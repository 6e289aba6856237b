//! `kvmesh-indexer`: one replica of one KV indexer shard.

use kvmesh_indexer::IndexerOpts;

kvmesh_runtime::global_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts: IndexerOpts = kvmesh_runtime::config::parse_args(|o: &IndexerOpts| &o.runtime);
    if let Err(message) = opts.layout() {
        kvmesh_runtime::config::exit_config_error(&message);
    }
    let _telemetry = kvmesh_runtime::telemetry::init(opts.runtime.log_format, "kvmesh-indexer");
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_indexer::run(opts, None, shutdown).await
}

//! `kvmesh-kv-bridge`: republishes an engine's ZMQ KV events as kvmesh KV events.

use kvmesh_kv_bridge::BridgeOpts;

kvmesh_runtime::global_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts: BridgeOpts = kvmesh_runtime::config::parse_args(|o: &BridgeOpts| &o.runtime);
    let _telemetry = kvmesh_runtime::telemetry::init(opts.runtime.log_format, "kvmesh-kv-bridge");
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_kv_bridge::run(opts, shutdown).await
}

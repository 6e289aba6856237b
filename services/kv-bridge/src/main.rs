//! `kvmesh-kv-bridge`: republishes an engine's ZMQ KV events as kvmesh KV events.

use kvmesh_kv_bridge::BridgeOpts;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts: BridgeOpts = kvmesh_runtime::config::parse_args(|o: &BridgeOpts| &o.runtime);
    kvmesh_runtime::telemetry::init_tracing(opts.runtime.log_format);
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_kv_bridge::run(opts, shutdown).await
}

//! `kvmesh-router`: one router replica serving `kvmesh.v1.Router`.

use kvmesh_router::server::RouterServiceOpts;

kvmesh_runtime::global_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts: RouterServiceOpts =
        kvmesh_runtime::config::parse_args(|o: &RouterServiceOpts| &o.runtime);
    if let Err(error) = opts.router.to_config() {
        kvmesh_runtime::config::exit_config_error(&error.to_string());
    }
    let _telemetry = kvmesh_runtime::telemetry::init(opts.runtime.log_format, "kvmesh-router");
    for warning in opts.router.startup_warnings(std::env::args_os()) {
        tracing::warn!("{warning}");
    }
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_router::server::run(opts, None, shutdown).await
}

//! `kvmesh-frontend`: the OpenAI-compatible HTTP edge.

use kvmesh_frontend::FrontendOpts;

kvmesh_runtime::global_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts: FrontendOpts = kvmesh_runtime::config::parse_args(|o: &FrontendOpts| &o.runtime);
    if let Err(message) = opts.frontend.validate() {
        kvmesh_runtime::config::exit_config_error(&message);
    }
    let _telemetry = kvmesh_runtime::telemetry::init(opts.runtime.log_format, "kvmesh-frontend");
    opts.frontend.log_startup_warnings();
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_frontend::run(opts, None, shutdown).await
}

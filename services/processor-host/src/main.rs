//! `kvmesh-processor-host`: runs a Python chat processor for the frontends of a namespace.

use kvmesh_frontend::opts::FrontendOpts;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (opts, config) =
        kvmesh_runtime::config::parse_args_with_values(|o: &FrontendOpts| &o.runtime);
    kvmesh_runtime::telemetry::init_tracing(opts.runtime.log_format);
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_processor_host::run(opts, config, shutdown).await
}

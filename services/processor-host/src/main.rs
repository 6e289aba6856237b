//! `kvmesh-processor-host`: runs a Python chat processor for the frontends of a namespace.

use kvmesh_frontend::opts::FrontendOpts;

kvmesh_runtime::global_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (opts, config) =
        kvmesh_runtime::config::parse_args_with_values(|o: &FrontendOpts| &o.runtime);
    let _telemetry =
        kvmesh_runtime::telemetry::init(opts.runtime.log_format, "kvmesh-processor-host");
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_processor_host::run(opts, config, shutdown).await
}

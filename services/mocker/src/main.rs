//! `kvmesh-mocker`: a mock inference engine process.

use kvmesh_mocker::MockerOpts;

kvmesh_runtime::global_allocator!();

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts: MockerOpts = kvmesh_runtime::config::parse_args(|o: &MockerOpts| &o.runtime);
    let _telemetry = kvmesh_runtime::telemetry::init(opts.runtime.log_format, "kvmesh-mocker");
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_mocker::run(opts, None, shutdown).await
}

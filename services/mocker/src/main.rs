//! `kvmesh-mocker`: a mock inference engine process.

use kvmesh_mocker::MockerOpts;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let opts: MockerOpts = kvmesh_runtime::config::parse_args(|o: &MockerOpts| &o.runtime);
    kvmesh_runtime::telemetry::init_tracing(opts.runtime.log_format);
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    kvmesh_mocker::run(opts, None, shutdown).await
}

//! `kvmesh up`: frontend plus N mock workers in one process, with in-memory discovery and an
//! in-process event plane, serving the bundled tiny model unless `--model-path` says otherwise.

use clap::Args;
use kvmesh_frontend::FrontendOpts;
use kvmesh_frontend::opts::FrontendArgs;
use kvmesh_indexer::IndexerOpts;
use kvmesh_mocker::MockerOpts;
use kvmesh_mocker::opts::{EndpointPath, EngineArgs};
use kvmesh_runtime::config::{DiscoveryBackend, RuntimeOpts};
use kvmesh_runtime::connect::Embedded;

/// Options of `kvmesh up`: the frontend's and the mocker's, with embedded defaults.
#[derive(Debug, Clone, Args)]
pub struct UpOpts {
    /// Shared runtime options; discovery defaults to `mem`.
    #[command(flatten)]
    pub runtime: RuntimeOpts,

    /// Frontend options.
    #[command(flatten)]
    pub frontend: FrontendArgs,

    /// Mock engine options; `--num-workers` defaults to 2.
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Parses the CLI with `kvmesh up`'s defaults (mem discovery, two workers) and exits with status
/// 2 and one line on invalid values.
pub fn parse_cli<T: clap::Parser>() -> T {
    let mut command = T::command();
    command = command.mut_subcommand("up", |up| {
        up.mut_arg("discovery_backend", |arg| arg.default_value("mem"))
            .mut_arg("num_workers", |arg| arg.default_value("2"))
    });
    let matches = command.clone().get_matches();
    let cli = match T::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    if let Some(("up", up_matches)) = matches.subcommand()
        && let Ok(Some(path)) = up_matches.try_get_one::<std::path::PathBuf>("dump_config_to")
        && let Some(up_command) = command.find_subcommand("up")
        && let Err(error) = kvmesh_runtime::config::dump_config(up_command, up_matches, path)
    {
        kvmesh_runtime::config::exit_config_error(&error.to_string());
    }
    cli
}

/// Runs the embedded mesh until SIGINT/SIGTERM.
pub async fn run(mut opts: UpOpts) -> anyhow::Result<()> {
    if opts.runtime.discovery_backend != DiscoveryBackend::Mem {
        kvmesh_runtime::config::exit_config_error(
            "--discovery-backend: kvmesh up runs in one process and needs mem; start kvmesh-frontend and kvmesh-mocker for other backends",
        );
    }
    if let Err(error) = opts
        .runtime
        .validate()
        .and_then(|()| opts.runtime.install_mesh_tls())
    {
        kvmesh_runtime::config::exit_config_error(&error.to_string());
    }
    if let Err(message) = opts.frontend.validate() {
        kvmesh_runtime::config::exit_config_error(&message);
    }
    let _telemetry = kvmesh_runtime::telemetry::init(opts.runtime.log_format, "kvmesh");
    opts.frontend.log_startup_warnings();
    let shutdown = kvmesh_runtime::shutdown::signal_token();
    let embedded = Embedded::new();
    // A custom chat processor and route extensions run in a host process of its own, which
    // cannot see in-memory discovery: the mesh registers in a private file store instead (events stay in-process).
    let chat = &opts.frontend.chat;
    let private_store = ((chat.custom_processor().is_some()
        || !chat.frontend_route_extensions.is_empty())
        && chat.spawn_processor_host)
        .then(|| std::env::temp_dir().join(format!("kvmesh-up-{}", std::process::id())));
    if let Some(store) = &private_store {
        opts.runtime.discovery_backend = DiscoveryBackend::File;
        opts.runtime.file_kv = Some(store.clone());
    }
    let result = run_mesh(opts, embedded, shutdown).await;
    if let Some(store) = private_store {
        let _ = std::fs::remove_dir_all(store);
    }
    result
}

async fn run_mesh(
    opts: UpOpts,
    embedded: Embedded,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let model_path = match &opts.frontend.model_path {
        Some(path) => path.clone(),
        None => crate::tiny_model::materialize()?,
    };
    let model_name =
        opts.frontend
            .model_name
            .clone()
            .unwrap_or_else(|| match &opts.frontend.model_path {
                Some(path) => path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "model".into()),
                None => "tiny".into(),
            });
    let namespace = opts
        .frontend
        .namespace
        .clone()
        .unwrap_or_else(|| "dynamo".to_string());

    let mocker = MockerOpts {
        runtime: opts.runtime.clone(),
        model_path: model_path.clone(),
        endpoint: EndpointPath {
            namespace,
            component: "backend".into(),
            endpoint: "generate".into(),
        },
        model_name: Some(model_name.clone()),
        engine: opts.engine.clone(),
        fault_file: None,
    };
    let mut frontend_args = opts.frontend.clone();
    frontend_args.model_path = Some(model_path);
    frontend_args.model_name = Some(model_name);
    // The in-process shard below serves the index; the frontend queries it like a remote one.
    frontend_args.router.use_remote_indexer = true;
    frontend_args.router.no_use_remote_indexer = false;
    frontend_args.router.serve_indexer = false;
    let frontend = FrontendOpts {
        runtime: opts.runtime.clone(),
        frontend: frontend_args,
    };

    // One in-process indexer shard owning every partition, fed by the in-process event plane;
    // it serves `kvmesh.v1.Indexer` on --tcp-rpc-host/--tcp-rpc-port.
    let indexer = IndexerOpts::whole_namespace(opts.runtime.clone(), &mocker.endpoint.namespace, 2);
    let indexer_task = tokio::spawn(kvmesh_indexer::run(
        indexer,
        Some(embedded.clone()),
        shutdown.child_token(),
    ));
    // The workers stop only after the frontend has drained its in-flight requests.
    let workers_shutdown = tokio_util::sync::CancellationToken::new();
    let mut mocker_task = tokio::spawn(kvmesh_mocker::run(
        mocker,
        Some(embedded.clone()),
        workers_shutdown.clone(),
    ));
    let frontend_shutdown = shutdown.child_token();
    let frontend = kvmesh_frontend::run(frontend, Some(embedded), frontend_shutdown.clone());
    tokio::pin!(frontend);
    let frontend_result = tokio::select! {
        result = &mut frontend => result,
        mocker_result = &mut mocker_task => {
            // The workers stopped on their own (a failure): stop the frontend too.
            frontend_shutdown.cancel();
            let frontend_result = frontend.await;
            return match mocker_result {
                Ok(Ok(())) => frontend_result.and(Err(anyhow::anyhow!("mock workers stopped"))),
                Ok(Err(error)) => Err(error),
                Err(error) => Err(anyhow::anyhow!("mock workers failed: {error}")),
            };
        }
    };
    workers_shutdown.cancel();
    let mocker_result = mocker_task.await;
    shutdown.cancel();
    match indexer_task.await {
        Ok(Err(error)) => tracing::warn!(%error, "embedded indexer stopped with an error"),
        Err(error) => tracing::warn!(%error, "embedded indexer task failed"),
        Ok(Ok(())) => {}
    }
    frontend_result?;
    match mocker_result {
        Ok(result) => result,
        Err(error) => Err(anyhow::anyhow!("mock workers failed: {error}")),
    }
}

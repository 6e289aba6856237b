//! The processor host: a Python chat processor written for Dynamo (`--dyn-chat-processor`)
//! inside an embedded CPython, serving `kvmesh.v1.ChatProcessor` to the frontends of its
//! namespace (docs/processors.md).
//!
//! It takes the frontend's own flags, so the processor's `config` holds every frontend option; it
//! builds one engine per token-input model it sees in discovery, registers as
//! `processor/process` with `processor=<name>` in its metadata once serving, and routes nothing
//! itself: every `routed_engine.generate` goes back to the frontend that sent the request.

mod convert;
mod models;
mod python;
mod service;

use anyhow::Context as _;
use kvmesh_frontend::opts::FrontendOpts;
use kvmesh_proto::v1::chat_processor_server::ChatProcessorServer;
use kvmesh_router::fleet::{NamespaceFilter, watch_fleet};
use kvmesh_runtime::connect;
use kvmesh_runtime::discovery::registry::{Registry, instance_record};
use kvmesh_runtime::lifecycle::{Drain, ServiceLifecycle};
use tokio_util::sync::CancellationToken;

pub use kvmesh_frontend::processor::{
    DEFAULT_NAMESPACE, PROCESSOR_COMPONENT, PROCESSOR_ENDPOINT, PROCESSOR_METADATA,
};

/// Runs the host until `shutdown`. `config` is every resolved option by field name (the
/// processor's `config` object).
pub async fn run(
    opts: FrontendOpts,
    config: serde_json::Value,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let chat = &opts.frontend.chat;
    let processor = chat.dyn_chat_processor.clone();
    let serves_chat = chat.custom_processor().is_some();
    if !serves_chat && chat.frontend_route_extensions.is_empty() {
        anyhow::bail!(
            "--dyn-chat-processor is `dynamo` (the built-in preprocessing) and no --frontend-route-extension is given: the processor host has nothing to serve"
        );
    }
    let routes = python::RouteSettings {
        extensions: &chat.frontend_route_extensions,
        reserved: kvmesh_frontend::http::reserved_paths(chat.anthropic_api()),
        overload_status: opts.frontend.http.http_overload_status_code,
    };
    let (python, route_paths) = python::PythonHost::start(
        &processor,
        &config.to_string(),
        &chat.dyn_chat_processor_config,
        &routes,
    )
    .unwrap_or_else(|message| kvmesh_runtime::config::exit_config_error(&message));
    tracing::info!(processor = %processor, routes = ?route_paths, "chat processor and route extensions loaded");

    let namespace = opts
        .frontend
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    if std::env::var_os(kvmesh_frontend::processor::PARENT_PIPE_ENV).is_some() {
        stop_when_parent_leaves(shutdown.clone());
    }
    let discovery = connect::discovery(&opts.runtime, None).await?;
    let mut lifecycle = ServiceLifecycle::new("processor-host")
        .with_registration_grace(opts.runtime.registration_grace());
    if serves_chat {
        lifecycle.spawn(watch_fleet(
            discovery.clone(),
            NamespaceFilter::from_flags(
                opts.frontend.namespace.as_deref(),
                opts.frontend.namespace_prefix.as_deref(),
            ),
            models::ProcessorModels::new(python.clone()),
            lifecycle.stop_token(),
        ));
    }

    if let Some(port) = chat.processor_host_metrics_port {
        let address = format!("{}:{port}", opts.runtime.tcp_rpc_host);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .with_context(|| format!("bind metrics on {address}"))?;
        // The host exports no series of its own yet: `/metrics` answers empty.
        let render = || async { String::new() };
        lifecycle.spawn(kvmesh_runtime::telemetry::serve_metrics(
            listener,
            render,
            Some(lifecycle.health()),
            lifecycle.stop_token(),
        ));
    }
    let listener = opts.runtime.bind_rpc("the processor host's").await?;
    let address = listener.local_addr()?;
    let service = service::ProcessorService::new(python, route_paths);
    let inflight = service.inflight();
    lifecycle.serve_grpc(
        listener,
        tonic::service::Routes::new(
            ChatProcessorServer::new(service)
                .max_decoding_message_size(opts.runtime.max_message_size())
                .max_encoding_message_size(opts.runtime.max_message_size()),
        ),
        &opts.runtime.grpc_server_settings(),
    );
    let mut record = instance_record(
        &namespace,
        PROCESSOR_COMPONENT,
        PROCESSOR_ENDPOINT,
        &address.to_string(),
        "grpc",
    );
    record
        .metadata
        .insert(PROCESSOR_METADATA.to_owned(), processor.clone());
    Registry::new(discovery.clone())
        .register_instance(&record)
        .await?;
    lifecycle.registered(discovery);
    tracing::info!(%address, %namespace, processor = %processor, "processor host serving");
    let drain = Drain {
        limit: std::time::Duration::from_secs(
            opts.frontend.http.http_graceful_shutdown_timeout_secs,
        ),
        inflight: &[inflight],
    };
    Ok(lifecycle.run(&shutdown, drain, || {}).await?)
}

/// A host started by a frontend stops when the frontend is gone: its end of our standard input
/// closes.
fn stop_when_parent_leaves(shutdown: CancellationToken) {
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        tracing::info!("the frontend that started this host is gone, stopping");
        shutdown.cancel();
    });
}

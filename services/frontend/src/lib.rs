//! The kvmesh frontend: the OpenAI-compatible HTTP edge in front of the workers found in
//! discovery.
//!
//! [`run`] wires configuration, discovery, the model table and the axum server; the request path
//! lives in [`http`] (parsing, validation, errors), [`pipeline`] (chat template, tokenizer,
//! detokenizer, stop strings) and [`generate`] (routing and the worker stream).

pub mod auth;
pub mod chat_output;
pub mod choices;
pub mod completion;
mod edge;
pub mod error;
pub mod fuzzing;
pub mod generate;
pub mod hints;
pub mod http;
pub mod interactive;
pub mod kserve;
pub mod logprobs;
pub mod metrics;
pub mod models;
pub mod opts;
pub mod pipeline;
pub mod preprocess;
pub mod processor;
pub mod trace_context;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use kvmesh_runtime::connect::{self, Embedded};
use kvmesh_runtime::discovery::registry::{Registry, instance_record};
use kvmesh_runtime::health::{Dependencies, DependencyMetrics};
use kvmesh_runtime::lifecycle::{Drain, ServiceLifecycle};
use kvmesh_runtime::shutdown::Inflight;
use tokio_util::sync::CancellationToken;

pub use opts::FrontendOpts;

use crate::http::{AppState, HttpSettings};
use crate::metrics::FrontendMetrics;
use crate::models::{NamespaceFilter, WatcherConfig};
use kvmesh_router::fleet::IndexSettings;

/// Runs the frontend until `shutdown`: unregisters, refuses new requests, drains in-flight ones
/// within the graceful-shutdown limit, then stops.
pub async fn run(
    opts: FrontendOpts,
    embedded: Option<Embedded>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let args = &opts.frontend;
    let router_config = args.router_config().map_err(|e| anyhow::anyhow!(e))?;
    let buckets = metrics::HistogramBuckets::from_process_env().map_err(anyhow::Error::msg)?;
    let metrics =
        FrontendMetrics::new(&args.metrics_prefix, &buckets).context("register metrics")?;
    let discovery = connect::discovery(&opts.runtime, embedded.as_ref()).await?;
    // A NATS that is down keeps connecting in the background; until it is up the routers use
    // their own tracking alone and `/health` says kv routing is degraded.
    let events = connect::event_plane(&opts.runtime, embedded.as_ref()).await?;
    let dependencies = Dependencies::new(discovery.clone(), events.clone());
    let dependency_metrics =
        DependencyMetrics::register(&metrics.registry).context("register metrics")?;
    let table = models::empty_table();
    let preprocess = Arc::new(preprocess_settings(args, &metrics)?);

    let watcher = WatcherConfig {
        namespaces: NamespaceFilter::from_flags(
            args.namespace.as_deref(),
            args.namespace_prefix.as_deref(),
        ),
        model_path: args.model_path.clone(),
        model_name: args.model_name.clone(),
        kv_cache_block_size: args.kv_cache_block_size,
        router: router_config.clone(),
        events: events.clone(),
        discovery: discovery.clone(),
        index: IndexSettings {
            // A served index is found in discovery like any other replica.
            use_remote_indexer: router_config.kv.use_remote_indexer
                || router_config.kv.serve_indexer,
            kv_partitions: opts.runtime.kv_partitions,
            remote_timeout: Duration::from_millis(args.indexer_query_timeout_ms),
            stream_max_age: Duration::from_secs(opts.runtime.nats_stream_max_age),
            lanes: router_config.kv.event_threads,
        },
        grpc: opts.runtime.grpc_settings(),
        remote_router: args.use_remote_router,
        router_addresses: args.router_addresses.clone(),
        migration_limit: args.migration_limit,
        migration_max_seq_len: args.migration_max_seq_len,
        preprocess: preprocess.clone(),
    };
    let mut lifecycle = ServiceLifecycle::new("frontend")
        .with_registration_grace(opts.runtime.registration_grace());
    if router_config.kv.serve_indexer {
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| "dynamo".to_string());
        let indexer = kvmesh_indexer::IndexerOpts::whole_namespace(
            opts.runtime.clone(),
            &namespace,
            router_config.kv.event_threads as u64,
        );
        lifecycle.spawn(kvmesh_indexer::run(
            indexer,
            embedded.clone(),
            lifecycle.stop_token(),
        ));
    }
    lifecycle.spawn(models::watch_models(
        discovery.clone(),
        table.clone(),
        metrics.clone(),
        watcher,
        lifecycle.stop_token(),
    ));

    let http = &args.http;
    let security = edge::EdgeSecurity::load(&opts.runtime, http, &mut lifecycle)?;
    let (processor, extensions) = processor::connect_hosts(
        args,
        &opts.runtime,
        &metrics,
        discovery.clone(),
        &mut lifecycle,
        &shutdown,
    )
    .await?;
    let state = Arc::new(AppState {
        models: table,
        metrics,
        preprocess,
        settings: HttpSettings {
            body_limit_mb: http.http_body_limit_mb,
            overload_status: http.http_overload_status_code,
            sse_keep_alive: http
                .http_sse_keep_alive_interval_ms
                .map(Duration::from_millis),
            backend_stream_timeout: http
                .http_backend_stream_timeout_secs
                .map(Duration::from_secs),
            pre_commit_peek: http
                .http_pre_commit_error_peek_ms
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
            disable_nvext: kvmesh_runtime::config::env_truthy("DYN_DISABLE_FRONTEND_NVEXT"),
            disable_admin_api: kvmesh_runtime::config::env_truthy("DYN_DISABLE_FRONTEND_ADMIN_API"),
            anthropic_api: args.chat.anthropic_api(),
            strip_anthropic_preamble: args.chat.strip_anthropic_preamble(),
            reasoning_field: args.chat.reasoning_field_name,
            force_include_usage: kvmesh_runtime::config::env_truthy(
                "DYN_ENABLE_FORCE_INCLUDE_USAGE",
            ),
        },
        inflight: Inflight::new(),
        draining: AtomicBool::new(false),
        processor,
        extensions,
        api_keys: security.api_keys.clone(),
        admin_keys: security.admin_keys.clone(),
        dependencies,
        dependency_metrics,
        body_budget: http.body_budget(),
        admission: http.inflight_limit().map(|limit| {
            Arc::new(tokio::sync::Semaphore::new(
                usize::try_from(limit)
                    .unwrap_or(usize::MAX)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            ))
        }),
    });
    if args.chat.interactive() {
        // The REPL replaces the edge: nothing is bound or registered, and the end of input
        // stops the process.
        tokio::spawn(interactive::repl(state.clone(), shutdown.clone()));
        let drain = Drain {
            limit: Duration::from_secs(http.http_graceful_shutdown_timeout_secs),
            inflight: std::slice::from_ref(&state.inflight),
        };
        return Ok(lifecycle.run(&shutdown, drain, || {}).await?);
    }
    let kserve = &args.kserve;
    // Every listener is bound before the frontend registers, so a port in use stops it unseen.
    let (listener, local) = edge::bind(&http.http_host, http.http_port, "--http-port").await?;
    let (side_port, side_flag) = if kserve.grpc_server() {
        (Some(kserve.grpc_metrics_port), "--grpc-metrics-port")
    } else {
        (kserve.kserve_grpc_port, "--kserve-grpc-port")
    };
    let side = match side_port {
        Some(port) => Some(edge::bind(&http.http_host, port, side_flag).await?),
        None => None,
    };
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| "dynamo".to_string());
    let record = if kserve.grpc_server() {
        instance_record(&namespace, "frontend", "kserve", &local.to_string(), "grpc")
    } else {
        instance_record(&namespace, "frontend", "http", &local.to_string(), "http")
    };
    Registry::new(discovery.clone())
        .register_instance(&record)
        .await?;
    lifecycle.registered(discovery);
    let tls = security.tls.as_ref();
    let is_tls = tls.is_some();
    if kserve.grpc_server() {
        // KServe gRPC takes the HTTP port; the side server keeps health and metrics.
        kserve::serve(
            &mut lifecycle,
            listener,
            state.clone(),
            kserve,
            tls,
            opts.runtime.grpc_server_settings(),
        );
        tracing::info!(address = %local, is_tls, "frontend KServe gRPC listening");
        if let Some((side, side_local)) = side {
            edge::serve_http(
                &mut lifecycle,
                side,
                http::side_app(state.clone()),
                tls,
                http.conn_limits(),
            );
            tracing::info!(address = %side_local, is_tls, "frontend metrics listening");
        }
    } else {
        edge::serve_http(
            &mut lifecycle,
            listener,
            http::app(state.clone()),
            tls,
            http.conn_limits(),
        );
        tracing::info!(address = %local, is_tls, "frontend listening");
        if let Some((grpc, grpc_local)) = side {
            kserve::serve(
                &mut lifecycle,
                grpc,
                state.clone(),
                kserve,
                tls,
                opts.runtime.grpc_server_settings(),
            );
            tracing::info!(address = %grpc_local, is_tls, "frontend KServe gRPC listening");
        }
    }
    let drain = Drain {
        limit: Duration::from_secs(http.http_graceful_shutdown_timeout_secs),
        inflight: std::slice::from_ref(&state.inflight),
    };
    let stopped = lifecycle
        .run(&shutdown, drain, || {
            state.draining.store(true, Ordering::Release)
        })
        .await;
    Ok(stopped?)
}

/// The process's preprocessing from the tokenizer flags.
fn preprocess_settings(
    args: &opts::FrontendArgs,
    metrics: &FrontendMetrics,
) -> anyhow::Result<preprocess::Preprocess> {
    if args.tokenizer == opts::TokenizerChoice::Basetenkenizer {
        tracing::info!("--tokenizer basetenkenizer: encoding with fastokens");
    }
    let workers = match args.dyn_preprocess_workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    let stages = preprocess::StageMetrics::new(&args.metrics_prefix, &metrics.registry)
        .context("register stage metrics")?;
    let mut preprocess = preprocess::Preprocess::new(
        args.tokenizer.engine(),
        !args.tokenizer_fallback(),
        usize::try_from(args.tokenizer_cache_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX),
        workers,
        args.debug_perf(),
        stages,
    )
    .context("start the preprocessing pool")?;
    preprocess.exclude_tools_when_tool_choice_none =
        args.chat.exclude_tools_when_tool_choice_none();
    Ok(preprocess)
}

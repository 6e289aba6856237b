//! The `kvmesh-router` process: options, wiring and lifecycle of one router replica.
//!
//! It watches discovery for the namespace's workers, serves `kvmesh.v1.Router` on
//! `DYN_TCP_RPC_HOST:DYN_TCP_RPC_PORT`, and registers as `router/route` once serving so frontends
//! find it; on SIGTERM it unregisters first, then stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use clap::Parser;
use kvmesh_proto::v1::router_server::RouterServer;
use kvmesh_runtime::config::RuntimeOpts;
use kvmesh_runtime::connect::{self, Embedded};
use kvmesh_runtime::discovery::registry::{Registry, instance_record};
use kvmesh_runtime::lifecycle::{Drain, ServiceHealth, ServiceLifecycle};
use tokio_util::sync::CancellationToken;

use crate::fleet::{IndexSettings, IndexSources, NamespaceFilter};
use crate::metrics::RouterMetrics;
use crate::remote::{ROUTER_COMPONENT, ROUTER_ENDPOINT};
use crate::routed_models::{FleetConfig, RoutedTable, watch_models};
use crate::service::RouterService;
use kvmesh_routing::args::RouterArgs;

/// Options of `kvmesh-router`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kvmesh-router",
    version,
    about = "KV-aware router replica for kvmesh"
)]
pub struct RouterServiceOpts {
    /// Discovery, event plane, gRPC bind, logging.
    #[command(flatten)]
    pub runtime: RuntimeOpts,

    /// Namespace whose workers this replica routes (and where it registers).
    #[arg(long, env = "DYN_NAMESPACE", default_value = "dynamo")]
    pub namespace: String,

    /// Tokens per KV block, overriding the workers' cards.
    #[arg(long, env = "DYN_KV_CACHE_BLOCK_SIZE", value_parser = clap::value_parser!(u32).range(1..))]
    pub kv_cache_block_size: Option<u32>,

    /// Every routing flag of the frontend.
    #[command(flatten)]
    pub router: RouterArgs,

    /// Port of the Prometheus `/metrics` endpoint and the `/health` and `/live` probes (off when
    /// unset).
    #[arg(long, env = "KVMESH_ROUTER_METRICS_PORT")]
    pub metrics_port: Option<u16>,

    /// Deadline of one indexer shard query, in milliseconds.
    #[arg(long, env = "KVMESH_INDEXER_QUERY_TIMEOUT_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub indexer_query_timeout_ms: u64,
}

/// Runs one router replica until `shutdown`.
pub async fn run(
    opts: RouterServiceOpts,
    embedded: Option<Embedded>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let router_config = opts.router.to_config().map_err(|e| anyhow::anyhow!(e))?;
    let discovery = connect::discovery(&opts.runtime, embedded.as_ref()).await?;
    let events = connect::event_plane(&opts.runtime, embedded.as_ref()).await?;
    let table: RoutedTable = Arc::new(ArcSwap::from_pointee(HashMap::new()));
    let mut lifecycle =
        ServiceLifecycle::new("router").with_registration_grace(opts.runtime.registration_grace());
    let fleet = FleetConfig {
        namespaces: NamespaceFilter::Exact(opts.namespace.clone()),
        router: router_config.clone(),
        kv_cache_block_size: opts.kv_cache_block_size,
        events: events.clone(),
        discovery: discovery.clone(),
        indexes: IndexSources::new(
            discovery.clone(),
            events.clone(),
            IndexSettings {
                use_remote_indexer: router_config.kv.use_remote_indexer
                    || router_config.kv.serve_indexer,
                kv_partitions: opts.runtime.kv_partitions,
                remote_timeout: Duration::from_millis(opts.indexer_query_timeout_ms),
                stream_max_age: Duration::from_secs(opts.runtime.nats_stream_max_age),
                lanes: router_config.kv.event_threads,
            },
        ),
        grpc: opts.runtime.grpc_settings(),
        router_id: format!("{:x}", discovery.instance_id()),
    };
    lifecycle.spawn(watch_models(table.clone(), fleet, lifecycle.stop_token()));
    if router_config.kv.serve_indexer {
        // The served replica registers itself; this replica's routers find it like any other.
        let mut runtime = opts.runtime.clone();
        runtime.tcp_rpc_port = 0;
        let indexer = kvmesh_indexer::IndexerOpts::whole_namespace(
            runtime,
            &opts.namespace,
            router_config.kv.event_threads as u64,
        );
        lifecycle.spawn(kvmesh_indexer::run(
            indexer,
            embedded.clone(),
            lifecycle.stop_token(),
        ));
    }

    let listener = opts.runtime.bind_rpc("router").await?;
    let address = listener.local_addr()?;
    let metrics = RouterMetrics::new().context("register metrics")?;
    let service = RouterService::new(table.clone(), metrics.clone());
    if let Some(port) = opts.metrics_port {
        lifecycle.spawn(serve_metrics(
            format!("{}:{port}", opts.runtime.tcp_rpc_host),
            table,
            metrics,
            lifecycle.health().with_events(events.clone()),
            lifecycle.stop_token(),
        ));
    }
    lifecycle.serve_grpc(
        listener,
        tonic::service::Routes::new(
            RouterServer::new(service)
                .max_decoding_message_size(opts.runtime.max_message_size())
                .max_encoding_message_size(opts.runtime.max_message_size()),
        ),
        &opts.runtime.grpc_server_settings(),
    );
    let record = instance_record(
        &opts.namespace,
        ROUTER_COMPONENT,
        ROUTER_ENDPOINT,
        &address.to_string(),
        "grpc",
    );
    Registry::new(discovery.clone())
        .register_instance(&record)
        .await?;
    lifecycle.registered(discovery);
    tracing::info!(%address, namespace = %opts.namespace, "router replica serving");
    Ok(lifecycle.run(&shutdown, Drain::NONE, || {}).await?)
}

async fn serve_metrics(
    address: String,
    table: RoutedTable,
    metrics: RouterMetrics,
    health: ServiceHealth,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("bind metrics on {address}"))?;
    let render = move || {
        metrics.refresh(&table);
        let text = kvmesh_runtime::telemetry::encode_metrics(&metrics.registry);
        async move { text }
    };
    kvmesh_runtime::telemetry::serve_metrics(listener, render, Some(health), shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn env_names_are_unique() {
        kvmesh_runtime::config::check_unique_env(&RouterServiceOpts::command())
            .map_err(|e| e.to_string())
            .unwrap();
    }

    #[test]
    fn routing_flags_change_the_config() {
        let opts = RouterServiceOpts::try_parse_from([
            "kvmesh-router",
            "--router-mode",
            "kv",
            "--router-replica-sync",
        ])
        .unwrap();
        let config = opts.router.to_config().unwrap();
        assert_eq!(config.mode, kvmesh_routing::RouterMode::Kv);
        assert!(config.replica_sync);
    }
}

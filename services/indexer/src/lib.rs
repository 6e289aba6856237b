//! The kvmesh KV indexer: a shard replica that consumes its partitions' KV events from the
//! durable event stream into one concurrent radix index per model, and serves `kvmesh.v1.Indexer`.
//!
//! Replicas of a shard read the same messages in the same order, so they hold the same state; a
//! new replica loads a snapshot from a serving peer and replays from its sequence ([`bootstrap`]).
//! [`client`] is the router's fan-out over shards.

pub mod bootstrap;
pub mod client;
pub mod consumer;
pub mod convert;
pub mod embedded;
pub mod fuzzing;
pub mod local;
pub mod markers;
pub mod metrics;
pub mod service;
pub mod shard;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use clap::Parser;
use futures::StreamExt;
use kvmesh_proto::v1::indexer_server::IndexerServer;
use kvmesh_proto::v1::{IndexerState, ModelRecord};
use kvmesh_runtime::config::RuntimeOpts;
use kvmesh_runtime::connect::{self, Embedded};
use kvmesh_runtime::discovery::registry::{Registry, instance_record};
use kvmesh_runtime::discovery::{Discovery, WatchEvent};
use kvmesh_runtime::event_plane::{StreamConfig, ensure_stream_eventually};
use kvmesh_runtime::lifecycle::{Drain, ServiceHealth, ServiceLifecycle};
use kvmesh_runtime::names;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bootstrap::{INDEXER_COMPONENT, INDEXER_ENDPOINT};
use crate::consumer::ConsumerConfig;
use crate::metrics::IndexerMetrics;
use crate::service::IndexerService;
use crate::shard::{ShardLayout, ShardState};

/// Options of `kvmesh-indexer`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kvmesh-indexer",
    version,
    about = "KV block indexer shard replica for kvmesh"
)]
pub struct IndexerOpts {
    /// Shared runtime options (discovery, planes, logging, `--kv-partitions`).
    #[command(flatten)]
    pub runtime: RuntimeOpts,

    /// Namespace whose KV events this replica indexes.
    #[arg(long, env = "DYN_NAMESPACE", default_value = "dynamo")]
    pub namespace: String,

    /// Shard index k: owns the partitions p with p mod S == k.
    #[arg(
        long = "indexer-shard",
        visible_alias = "shard-index",
        env = "KVMESH_INDEXER_SHARD",
        default_value_t = 0
    )]
    pub shard: u32,

    /// Number of shards S (at most --kv-partitions).
    #[arg(long = "indexer-shards", visible_alias = "shard-count", env = "KVMESH_INDEXER_SHARDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub shards: u32,

    /// Explicit comma-separated list of owned partitions (overrides the shard striping).
    #[arg(long, env = "KVMESH_INDEXER_PARTITIONS", value_delimiter = ',')]
    pub partitions: Vec<u32>,

    /// Apply lanes (threads) per model index.
    #[arg(long = "router-event-threads", env = "DYN_ROUTER_EVENT_THREADS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub event_threads: u64,

    /// Port of the Prometheus `/metrics` endpoint (unset: no HTTP server).
    #[arg(long, env = "KVMESH_INDEXER_METRICS_PORT")]
    pub metrics_port: Option<u16>,

    /// Seconds between sweeps that publish removal markers for workers gone from discovery.
    #[arg(long, env = "KVMESH_INDEXER_SWEEP_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_secs: u64,
}

impl IndexerOpts {
    /// A replica of the single shard owning every partition of `namespace`, for a process that
    /// serves its own index (`--serve-indexer`, `kvmesh up`) on `runtime`'s gRPC address.
    pub fn whole_namespace(runtime: RuntimeOpts, namespace: &str, event_threads: u64) -> Self {
        Self {
            runtime,
            namespace: namespace.to_string(),
            shard: 0,
            shards: 1,
            partitions: Vec::new(),
            event_threads: event_threads.max(1),
            metrics_port: None,
            sweep_secs: 60,
        }
    }

    /// The partitions this replica owns, or an error naming the flag.
    pub fn layout(&self) -> Result<ShardLayout, String> {
        let num_partitions = self.runtime.kv_partitions;
        if !self.partitions.is_empty() {
            let mut partitions = self.partitions.clone();
            partitions.sort_unstable();
            partitions.dedup();
            if let Some(bad) = partitions.iter().find(|p| **p >= num_partitions) {
                return Err(format!(
                    "--partitions (KVMESH_INDEXER_PARTITIONS): partition {bad} is not below --kv-partitions {num_partitions}"
                ));
            }
            return Ok(ShardLayout {
                shard: self.shard,
                shards: self.shards,
                partitions,
                num_partitions,
            });
        }
        if self.shards > num_partitions {
            return Err(format!(
                "--indexer-shards (KVMESH_INDEXER_SHARDS): {} shards need at least as many partitions, --kv-partitions is {num_partitions}",
                self.shards
            ));
        }
        if self.shard >= self.shards {
            return Err(format!(
                "--indexer-shard (KVMESH_INDEXER_SHARD): must be below --indexer-shards {}, got {}",
                self.shards, self.shard
            ));
        }
        Ok(ShardLayout::striped(
            self.shard,
            self.shards,
            num_partitions,
        ))
    }
}

/// Runs one replica until `shutdown`: bootstrap, consume, serve, register once serving.
pub async fn run(
    opts: IndexerOpts,
    embedded: Option<Embedded>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let layout = opts.layout().map_err(|e| anyhow::anyhow!(e))?;
    let namespace = opts.namespace.clone();
    let discovery = connect::discovery(&opts.runtime, embedded.as_ref()).await?;
    let events = connect::event_plane(&opts.runtime, embedded.as_ref()).await?;
    let stream_name = names::kv_stream_name(&namespace);
    let mut lifecycle =
        ServiceLifecycle::new("indexer").with_registration_grace(opts.runtime.registration_grace());
    // With NATS down the replica waits in `Loading` (unregistered) until the stream is there.
    ensure_stream_eventually(
        &events,
        &StreamConfig {
            name: stream_name.clone(),
            subjects: names::kv_stream_subjects(&namespace),
            max_age: Duration::from_secs(opts.runtime.nats_stream_max_age),
            duplicate_window: Duration::from_secs(120),
        },
        lifecycle.stop_token(),
    )
    .await?;
    let metrics = Arc::new(IndexerMetrics::new().context("register metrics")?);
    let state = Arc::new(ShardState::new(layout.clone(), opts.event_threads as usize));

    let start_seq = match bootstrap::load_from_peer(discovery.as_ref(), &namespace, &state).await? {
        Some(seq) => seq + 1,
        None => {
            tracing::info!(
                "no serving peer for this shard: starting from the stream's first retained message"
            );
            1
        }
    };

    let (control_tx, control_rx) = mpsc::channel(16);
    let consumer = consumer::consume_forever(
        state.clone(),
        events.clone(),
        ConsumerConfig {
            namespace: namespace.clone(),
            filters: layout
                .partitions
                .iter()
                .map(|p| names::kv_partition_filter(&namespace, *p))
                .collect(),
            resync: Some(consumer::Resync {
                discovery: discovery.clone(),
                namespace: namespace.clone(),
            }),
        },
        start_seq,
        control_rx,
        metrics.clone(),
        lifecycle.stop_token(),
    );
    lifecycle.spawn(consumer);
    let block_sizes = Arc::new(ArcSwap::from_pointee(HashMap::new()));
    lifecycle.spawn(watch_block_sizes(
        discovery.clone(),
        namespace.clone(),
        block_sizes.clone(),
        lifecycle.stop_token(),
    ));
    lifecycle.spawn(markers::run_markers(
        state.clone(),
        discovery.clone(),
        events.clone(),
        namespace.clone(),
        Duration::from_secs(opts.sweep_secs),
        lifecycle.stop_token(),
    ));

    let service = IndexerService::new(
        state.clone(),
        control_tx,
        metrics.clone(),
        block_sizes,
        events.clone(),
        stream_name,
    );
    let listener = opts.runtime.bind_rpc("indexer").await?;
    let address = listener.local_addr()?;
    lifecycle.serve_grpc(
        listener,
        tonic::service::Routes::new(
            IndexerServer::new(service.clone())
                .max_decoding_message_size(opts.runtime.max_message_size())
                .max_encoding_message_size(64 * 1024 * 1024),
        ),
        &opts.runtime.grpc_server_settings(),
    );
    if let Some(port) = opts.metrics_port {
        lifecycle.spawn(serve_metrics(
            format!("{}:{port}", opts.runtime.tcp_rpc_host),
            service.clone(),
            metrics.clone(),
            lifecycle.health().with_events(events.clone()),
            lifecycle.stop_token(),
        ));
    }

    // Register only once caught up, so routers only ever see serving replicas.
    if !lifecycle
        .wait_ready(&shutdown, || state.state() == IndexerState::Serving)
        .await?
    {
        return Ok(());
    }
    // Routers in this process find the replica in the local table before they see its record.
    let _local = local::register(discovery.instance_id(), service.clone());
    let mut record = instance_record(
        &opts.namespace,
        INDEXER_COMPONENT,
        INDEXER_ENDPOINT,
        &address.to_string(),
        "grpc",
    );
    record.metadata = bootstrap::layout_metadata(&layout);
    Registry::new(discovery.clone())
        .register_instance(&record)
        .await?;
    lifecycle.registered(discovery);
    tracing::info!(%address, shard = layout.shard, partitions = ?layout.partitions, "indexer replica serving");
    Ok(lifecycle
        .run(&shutdown, Drain::NONE, || {
            state.set_state(IndexerState::Draining)
        })
        .await?)
}

/// Keeps the block size of every model of `namespace` from its model cards.
async fn watch_block_sizes(
    discovery: Arc<dyn Discovery>,
    namespace: String,
    block_sizes: Arc<ArcSwap<HashMap<String, u32>>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut watch = discovery
        .watch(&names::models_prefix(Some(&namespace)))
        .await?;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            event = watch.next() => event,
        };
        match event {
            Some(WatchEvent::Put { value, .. }) => {
                if let Ok(record) = serde_json::from_slice::<ModelRecord>(&value) {
                    let size = record.card.map(|c| c.kv_cache_block_size).unwrap_or(0);
                    if size > 0 && block_sizes.load().get(&record.model) != Some(&size) {
                        let mut next = HashMap::clone(&block_sizes.load());
                        next.insert(record.model, size);
                        block_sizes.store(Arc::new(next));
                    }
                }
            }
            Some(WatchEvent::Delete { .. }) => {}
            None => anyhow::bail!("discovery watch ended"),
        }
    }
}

async fn serve_metrics(
    address: String,
    service: IndexerService,
    metrics: Arc<IndexerMetrics>,
    health: ServiceHealth,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("bind metrics on {address}"))?;
    let render = move || {
        let service = service.clone();
        let metrics = metrics.clone();
        async move {
            if let Err(status) = service.cut(false).await {
                tracing::debug!(%status, "metrics cut failed");
            }
            kvmesh_runtime::telemetry::encode_metrics(&metrics.registry)
        }
    };
    kvmesh_runtime::telemetry::serve_metrics(listener, render, Some(health), shutdown).await?;
    Ok(())
}

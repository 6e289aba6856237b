//! An index inside a routing process (frontend or `kvmesh-router` without
//! `--use-remote-indexer`): the same shard machinery as a `kvmesh-indexer` replica, owning every
//! partition of the namespace, consuming the durable KV event stream from its first retained
//! message and dropping workers that leave discovery, but answering only in-process — no gRPC
//! service, no registration.

use std::sync::Arc;
use std::time::Duration;

use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::event_plane::{EventPlane, StreamConfig, ensure_stream_eventually};
use kvmesh_runtime::names;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::consumer::{ConsumerConfig, consume_forever};
use crate::markers::run_markers;
use crate::metrics::IndexerMetrics;
use crate::shard::{ShardLayout, ShardState};

/// How often workers missing from discovery are swept out of the index.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Starts an in-process index of `namespace` and returns its state, which answers
/// [`ShardState::find_matches`] while it fills. Runs until `shutdown`; when the event stream
/// fails, the index keeps answering and resumes consuming after the last sequence it applied.
pub async fn start(
    events: Arc<dyn EventPlane>,
    discovery: Arc<dyn Discovery>,
    namespace: &str,
    kv_partitions: u32,
    stream_max_age: Duration,
    lanes: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<Arc<ShardState>> {
    let stream = StreamConfig {
        name: names::kv_stream_name(namespace),
        subjects: names::kv_stream_subjects(namespace),
        max_age: stream_max_age,
        duplicate_window: Duration::from_secs(120),
    };
    // With NATS down the index starts empty and fills once NATS is up (the consumer retries).
    ensure_stream_eventually(&events, &stream, shutdown.clone()).await?;
    let layout = ShardLayout::striped(0, 1, kv_partitions);
    let filters = layout
        .partitions
        .iter()
        .map(|p| names::kv_partition_filter(namespace, *p))
        .collect();
    let state = Arc::new(ShardState::new(layout, lanes));
    let metrics = Arc::new(IndexerMetrics::new()?);
    {
        let state = state.clone();
        let events = events.clone();
        let config = ConsumerConfig {
            namespace: namespace.to_string(),
            filters,
            // No peer to ask: a gap is counted and the index reads on.
            resync: None,
        };
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            // Nobody asks this index for cuts; the sender lives as long as the consumer so its
            // control channel stays open.
            let (_control_tx, control_rx) = mpsc::channel(1);
            let namespace = config.namespace.clone();
            if let Err(error) =
                consume_forever(state, events, config, 1, control_rx, metrics, shutdown).await
            {
                tracing::error!(%namespace, %error, "embedded index stopped indexing");
            }
        });
    }
    {
        let state = state.clone();
        let namespace = namespace.to_string();
        tokio::spawn(async move {
            if let Err(error) = run_markers(
                state,
                discovery,
                events,
                namespace.clone(),
                SWEEP_EVERY,
                shutdown,
            )
            .await
            {
                tracing::warn!(%namespace, %error, "embedded index stopped watching workers");
            }
        });
    }
    Ok(state)
}

//! An index inside a routing process (frontend or `kvmesh-router` without
//! `--use-remote-indexer`): the same shard machinery as a `kvmesh-indexer` replica, owning every
//! partition of the namespace, consuming the durable KV event stream from its first retained
//! message and dropping workers that leave discovery, but answering only in-process — no gRPC
//! service, no registration.

use std::sync::Arc;
use std::time::Duration;

use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::event_plane::{EventPlane, StreamConfig};
use kvmesh_runtime::names;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::consumer::{ConsumerConfig, run_consumer};
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
    events
        .ensure_stream(&StreamConfig {
            name: names::kv_stream_name(namespace),
            subjects: names::kv_stream_subjects(namespace),
            max_age: stream_max_age,
            duplicate_window: Duration::from_secs(120),
        })
        .await?;
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
        };
        let shutdown = shutdown.clone();
        tokio::spawn(consume_forever(state, events, config, metrics, shutdown));
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

/// Longest wait between attempts to resume a failed event stream.
const MAX_RESUME_BACKOFF: Duration = Duration::from_secs(5);

/// Consumes the namespace's KV events until `shutdown`, resuming after the last applied sequence
/// whenever the stream fails (a standalone replica exits instead and re-bootstraps; an embedded
/// index has no peer to bootstrap from and must not stop advancing).
async fn consume_forever(
    state: Arc<ShardState>,
    events: Arc<dyn EventPlane>,
    config: ConsumerConfig,
    metrics: Arc<IndexerMetrics>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // Nobody asks this index for cuts; the sender lives as long as the attempt so the
        // consumer's control channel stays open.
        let (control_tx, control_rx) = mpsc::channel(1);
        let start_seq = state.applied_seq().saturating_add(1);
        let result = run_consumer(
            state.clone(),
            events.clone(),
            config.clone(),
            start_seq,
            control_rx,
            metrics.clone(),
            shutdown.clone(),
        )
        .await;
        drop(control_tx);
        let Err(error) = result else { return };
        tracing::warn!(
            namespace = %config.namespace,
            %error,
            resume_after = state.applied_seq(),
            "embedded index lost the kv event stream; resuming"
        );
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_RESUME_BACKOFF);
    }
}

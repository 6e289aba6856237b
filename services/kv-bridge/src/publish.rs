//! The kvmesh side of the bridge: hands converted events to the shared
//! [`KvEventPublisher`], which numbers them per (worker, dp_rank) and publishes them into the
//! namespace's JetStream stream (docs/kv-events.md, "Publishing"), in order, retried until
//! stored.
//!
//! One publisher task serves every engine socket of the worker, so event ids stay gap-free per
//! dp rank whatever socket a batch came from, and a slow NATS never stalls the ZMQ readers
//! (a stalled SUB socket would make the engine's PUB drop batches).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kvmesh_proto::v1::{KvEvent, KvEventBatch};
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::kv_publish::KvEventPublisher;
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics::BridgeMetrics;

/// Converted events of one engine batch, for one dp rank, in engine order (ids not yet set).
#[derive(Debug, Clone, PartialEq)]
pub struct RankEvents {
    /// Data-parallel rank the events belong to.
    pub dp_rank: u32,
    /// The events; their `event_id` is assigned by the publisher.
    pub events: Vec<KvEvent>,
}

/// Where and as whom the bridge publishes.
#[derive(Clone)]
pub struct PublishTarget {
    /// The event plane.
    pub events: Arc<dyn EventPlane>,
    /// The worker's partition subject `kvmesh.{ns}.kv.{model}.{partition}`.
    pub subject: String,
    /// Instance id of the engine the bridge speaks for.
    pub worker_id: u64,
}

/// Publishes converted events until every sender is dropped, then returns. `abort` stops
/// retrying a batch that cannot be stored (used once shutdown has waited long enough).
pub async fn run_publisher(
    target: PublishTarget,
    next_event_id: HashMap<u32, u64>,
    mut events_rx: mpsc::Receiver<RankEvents>,
    metrics: BridgeMetrics,
    abort: CancellationToken,
) {
    let mut publisher = KvEventPublisher::new(
        target.events.clone(),
        target.subject.clone(),
        target.worker_id,
        next_event_id,
    )
    .with_first_event_id(restart_floor());
    while let Some(first) = events_rx.recv().await {
        // Coalesce whatever is already queued, per rank, keeping each rank's order.
        let mut pending: BTreeMap<u32, Vec<KvEvent>> = BTreeMap::new();
        let mut item = Some(first);
        while let Some(RankEvents { dp_rank, events }) = item.take() {
            pending.entry(dp_rank).or_default().extend(events);
            item = events_rx.try_recv().ok();
        }
        for (dp_rank, events) in pending {
            match publisher.publish(dp_rank, events, &abort).await {
                Ok(stats) => {
                    metrics.batches_published.inc_by(stats.batches);
                    metrics.events_published.inc_by(stats.events);
                    metrics.publish_retries.inc_by(stats.retries);
                }
                Err(_) => return,
            }
        }
    }
}

/// Where a dp rank starts when no earlier id of it could be read back: milliseconds since the
/// Unix epoch times 2^16, above every id of an earlier run that published fewer than 65 536
/// events per millisecond since it started. The bridge speaks for one worker id across
/// restarts, and an id at or below one the indexer already applied is skipped as a duplicate;
/// earlier ids are not always there to read (aged out of the stream, a failed scan), and the
/// jump shows in the indexer as a counted gap.
pub fn restart_floor() -> u64 {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    millis.saturating_mul(1 << 16)
}

/// Finds the next event id per dp rank from what this worker already published in the stream,
/// so a restarted bridge continues its ids instead of repeating them (the indexer would skip
/// repeated ids as duplicates). Reads the worker's partition subject up to the stream's current
/// end, within `limit`.
pub async fn resume_event_ids(
    events: &dyn EventPlane,
    stream: &str,
    subject: &str,
    worker_id: u64,
    limit: Duration,
) -> anyhow::Result<HashMap<u32, u64>> {
    let mut next = HashMap::new();
    let last = events.last_sequence(stream).await?;
    if last == 0 {
        return Ok(next);
    }
    let mut messages = events.consume(stream, &[subject.to_string()], 1).await?;
    let scan = async {
        // Messages on other subjects do not reach us, so the last one of ours may come before
        // `last`: a quiet spell means the scan is done.
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(500), messages.next()).await
        {
            let message = message?;
            if let Ok(batch) = KvEventBatch::decode(message.payload.as_ref())
                && batch.worker_id == worker_id
            {
                if batch.worker_removed {
                    // Indexers ignore every later event of a removed worker id.
                    tracing::error!(
                        worker_id,
                        "this worker was removed from the index: its events will be ignored"
                    );
                } else if let Some(event) = batch.events.last() {
                    let entry = next.entry(batch.dp_rank).or_insert(0);
                    *entry = (*entry).max(event.event_id.saturating_add(1));
                }
            }
            if message.sequence >= last {
                break;
            }
        }
        anyhow::Ok(())
    };
    match tokio::time::timeout(limit, scan).await {
        Ok(result) => result?,
        Err(_) => anyhow::bail!("scan of {stream} did not finish within {limit:?}"),
    }
    Ok(next)
}

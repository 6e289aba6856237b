//! The kvmesh side of the bridge: numbers converted events per (worker, dp_rank) and publishes
//! them as `KvEventBatch` into the namespace's JetStream stream (specs/kv-events.md §4), in order,
//! retrying each batch under its `Nats-Msg-Id` until it is stored.
//!
//! One publisher task serves every engine socket of the worker, so event ids stay gap-free per
//! dp rank whatever socket a batch came from, and a slow NATS never stalls the ZMQ readers
//! (a stalled SUB socket would make the engine's PUB drop batches).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use kvmesh_proto::v1::{KvEvent, KvEventBatch};
use kvmesh_runtime::event_plane::EventPlane;
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics::BridgeMetrics;

/// Largest KV event batch published in one message (spec: under 512 KiB).
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

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
    mut next_event_id: HashMap<u32, u64>,
    mut events_rx: mpsc::UnboundedReceiver<RankEvents>,
    metrics: BridgeMetrics,
    abort: CancellationToken,
) {
    while let Some(first) = events_rx.recv().await {
        // Coalesce whatever is already queued, per rank, keeping each rank's order.
        let mut pending: BTreeMap<u32, Vec<KvEvent>> = BTreeMap::new();
        let mut item = Some(first);
        while let Some(RankEvents { dp_rank, events }) = item.take() {
            let next = next_event_id.entry(dp_rank).or_insert(0);
            let queue = pending.entry(dp_rank).or_default();
            for mut event in events {
                event.event_id = *next;
                *next += 1;
                queue.push(event);
            }
            item = events_rx.try_recv().ok();
        }
        for (dp_rank, events) in pending {
            for batch in split_batches(target.worker_id, dp_rank, events, now_ms()) {
                if !publish_batch(&target, &batch, &metrics, &abort).await {
                    return;
                }
            }
        }
    }
}

/// Splits a rank's events into batches whose encoding stays under [`MAX_BATCH_BYTES`].
pub fn split_batches(
    worker_id: u64,
    dp_rank: u32,
    events: Vec<KvEvent>,
    published_at_ms: u64,
) -> Vec<KvEventBatch> {
    let empty = KvEventBatch {
        worker_id,
        dp_rank,
        events: Vec::new(),
        published_at_ms,
        worker_removed: false,
    };
    let mut batches = Vec::new();
    let mut batch = empty.clone();
    let mut size = batch.encoded_len();
    for event in events {
        let event_size = event.encoded_len() + 8; // field tag and length prefix, generously
        if !batch.events.is_empty() && size + event_size >= MAX_BATCH_BYTES {
            batches.push(std::mem::replace(&mut batch, empty.clone()));
            size = batch.encoded_len();
        }
        size += event_size;
        batch.events.push(event);
    }
    if !batch.events.is_empty() {
        batches.push(batch);
    }
    batches
}

/// The JetStream message id of a batch: `{worker_id:016x}-{dp_rank}-{first_event_id}`.
pub fn msg_id(batch: &KvEventBatch) -> String {
    let first_event_id = batch.events.first().map(|e| e.event_id).unwrap_or(0);
    format!(
        "{:016x}-{}-{first_event_id}",
        batch.worker_id, batch.dp_rank
    )
}

/// Publishes one batch, retrying with backoff until stored; `false` when aborted first.
async fn publish_batch(
    target: &PublishTarget,
    batch: &KvEventBatch,
    metrics: &BridgeMetrics,
    abort: &CancellationToken,
) -> bool {
    let msg_id = msg_id(batch);
    let payload = Bytes::from(batch.encode_to_vec());
    let mut backoff = Duration::from_millis(50);
    loop {
        match target
            .events
            .publish_durable(&target.subject, &msg_id, payload.clone())
            .await
        {
            Ok(_) => {
                metrics.batches_published.inc();
                metrics.events_published.inc_by(batch.events.len() as u64);
                return true;
            }
            Err(error) => {
                metrics.publish_retries.inc();
                tracing::warn!(%error, msg_id = %msg_id, "kv event publish failed, retrying");
                tokio::select! {
                    _ = abort.cancelled() => {
                        tracing::error!(msg_id = %msg_id, "kv event batch not published before shutdown");
                        return false;
                    }
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
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
                    *entry = (*entry).max(event.event_id + 1);
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use kvmesh_proto::v1::{KvRemoved, kv_event};

    use super::*;

    fn removal(hashes: usize) -> KvEvent {
        KvEvent {
            event_id: 0,
            tier: 0,
            kind: Some(kv_event::Kind::Removed(KvRemoved {
                block_hashes: (0..hashes as u64).map(|h| h | (1 << 63)).collect(),
            })),
        }
    }

    #[test]
    fn batches_stay_under_the_limit() {
        let events: Vec<KvEvent> = (0..40).map(|_| removal(4096)).collect();
        let batches = split_batches(7, 1, events, 0);
        assert!(batches.len() > 1);
        assert_eq!(batches.iter().map(|b| b.events.len()).sum::<usize>(), 40);
        for batch in &batches {
            assert!(
                batch.encoded_len() < MAX_BATCH_BYTES,
                "{}",
                batch.encoded_len()
            );
        }
        assert!(split_batches(7, 1, Vec::new(), 0).is_empty());
    }

    #[test]
    fn msg_id_names_worker_rank_and_first_event() {
        let mut event = removal(1);
        event.event_id = 42;
        let batch = KvEventBatch {
            worker_id: 0xabc,
            dp_rank: 3,
            events: vec![event],
            ..Default::default()
        };
        assert_eq!(msg_id(&batch), "0000000000000abc-3-42");
    }
}

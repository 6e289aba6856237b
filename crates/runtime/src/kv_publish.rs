//! Publishing a worker's KV events into the namespace's durable stream (docs/kv-events.md,
//! "Publishing"), shared by every producer (the mock engine, the vLLM/SGLang bridge): event ids
//! numbered per (worker, dp_rank) without gaps, batches kept under the message size limit, each
//! batch published under its `Nats-Msg-Id` and retried until stored, so a retry after a lost
//! acknowledgement is deduplicated by the stream rather than applied twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kvmesh_proto::v1::{KvEvent, KvEventBatch, KvRemoved, KvStored, kv_event};
use prost::Message;
use tokio_util::sync::CancellationToken;

use crate::event_plane::EventPlane;

/// Largest KV event batch published in one message: batches stay under 512 KiB
/// (docs/kv-events.md, "Publishing").
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

/// Largest encoding of one event: a bigger one (a stored chain of tens of thousands of blocks) is
/// split into several, so that every batch fits a message and none is refused for good.
pub const MAX_EVENT_BYTES: usize = MAX_BATCH_BYTES / 4;

/// Bytes an event's fields other than its blocks or hashes take, at most (ids, tier, parent,
/// position, tags and length prefixes).
const EVENT_OVERHEAD: usize = 64;

/// What one [`KvEventPublisher::publish`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishStats {
    /// Batches stored.
    pub batches: u64,
    /// Events stored.
    pub events: u64,
    /// Failed attempts that were retried.
    pub retries: u64,
}

/// The publish was abandoned because `abort` fired before a batch was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("kv event batch not published before shutdown")]
pub struct PublishAborted;

/// Numbers and publishes one worker's KV events on its partition subject.
pub struct KvEventPublisher {
    events: Arc<dyn EventPlane>,
    subject: String,
    worker_id: u64,
    next_event_id: HashMap<u32, u64>,
    /// Where a dp rank without an entry in `next_event_id` starts.
    first_event_id: u64,
}

impl KvEventPublisher {
    /// A publisher for `worker_id` on `subject`, continuing from `next_event_id` per dp rank
    /// (empty for a fresh worker; a restarted bridge resumes its ids).
    pub fn new(
        events: Arc<dyn EventPlane>,
        subject: impl Into<String>,
        worker_id: u64,
        next_event_id: HashMap<u32, u64>,
    ) -> Self {
        Self {
            events,
            subject: subject.into(),
            worker_id,
            next_event_id,
            first_event_id: 0,
        }
    }

    /// Starts dp ranks that `next_event_id` does not know at `first_event_id` instead of 0: a
    /// publisher that speaks for one worker across restarts (the engine bridge) takes a floor no
    /// earlier run reached, so its ids never repeat even when the earlier ones could not be read
    /// back.
    pub fn with_first_event_id(mut self, first_event_id: u64) -> Self {
        self.first_event_id = first_event_id;
        self
    }

    /// The id the next event of `dp_rank` gets.
    pub fn next_event_id(&self, dp_rank: u32) -> u64 {
        self.next_event_id
            .get(&dp_rank)
            .copied()
            .unwrap_or(self.first_event_id)
    }

    /// Numbers `events` (in order, replacing their ids) and publishes them for `dp_rank`,
    /// retrying each batch with backoff until it is stored or `abort` fires.
    pub async fn publish(
        &mut self,
        dp_rank: u32,
        events: Vec<KvEvent>,
        abort: &CancellationToken,
    ) -> Result<PublishStats, PublishAborted> {
        let mut events = split_large_events(events, MAX_EVENT_BYTES);
        let next = self
            .next_event_id
            .entry(dp_rank)
            .or_insert(self.first_event_id);
        for event in &mut events {
            event.event_id = *next;
            *next += 1;
        }
        let mut stats = PublishStats::default();
        for batch in split_batches(self.worker_id, dp_rank, events, now_ms()) {
            stats.retries += self.publish_batch(&batch, abort).await?;
            stats.batches += 1;
            stats.events += batch.events.len() as u64;
        }
        Ok(stats)
    }

    /// Publishes one batch until stored; returns the number of retries.
    async fn publish_batch(
        &self,
        batch: &KvEventBatch,
        abort: &CancellationToken,
    ) -> Result<u64, PublishAborted> {
        let msg_id = msg_id(batch);
        let payload = Bytes::from(batch.encode_to_vec());
        let mut backoff = Duration::from_millis(50);
        let mut retries = 0;
        loop {
            match self
                .events
                .publish_durable(&self.subject, &msg_id, payload.clone())
                .await
            {
                Ok(_) => return Ok(retries),
                Err(error) => {
                    retries += 1;
                    tracing::warn!(%error, msg_id = %msg_id, "kv event publish failed, retrying");
                    tokio::select! {
                        _ = abort.cancelled() => {
                            tracing::error!(msg_id = %msg_id, "kv event batch not published before shutdown");
                            return Err(PublishAborted);
                        }
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

/// Splits every event whose encoding is over `max_bytes` into consecutive events of the same
/// meaning: a stored chain into chained parts (each part's parent is the previous part's last
/// block), a removal into removals of fewer blocks. Other events pass unchanged, in order.
pub fn split_large_events(events: Vec<KvEvent>, max_bytes: usize) -> Vec<KvEvent> {
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        let size = event.encoded_len();
        if size <= max_bytes {
            out.push(event);
            continue;
        }
        let tier = event.tier;
        match event.kind {
            Some(kv_event::Kind::Stored(stored)) => {
                // The largest block with its field tag and length prefix, against the budget
                // less what the event's other fields take.
                let per_block = stored
                    .blocks
                    .iter()
                    .map(|block| block.encoded_len() + 3)
                    .max()
                    .unwrap_or(1);
                let per_part = (max_bytes.saturating_sub(EVENT_OVERHEAD) / per_block).max(1);
                let mut parent_hash = stored.parent_hash;
                let mut position = stored.start_position;
                for blocks in stored.blocks.chunks(per_part) {
                    let next_parent = blocks.last().map(|block| block.block_hash);
                    out.push(KvEvent {
                        event_id: 0,
                        tier,
                        kind: Some(kv_event::Kind::Stored(KvStored {
                            parent_hash,
                            blocks: blocks.to_vec(),
                            start_position: position,
                        })),
                    });
                    parent_hash = next_parent;
                    position = position.map(|p| p.saturating_add(blocks.len() as u32));
                }
            }
            Some(kv_event::Kind::Removed(removed)) => {
                // Packed varints: a hash takes at most 10 bytes.
                let per_part = (max_bytes.saturating_sub(EVENT_OVERHEAD) / 10).max(1);
                for hashes in removed.block_hashes.chunks(per_part) {
                    out.push(KvEvent {
                        event_id: 0,
                        tier,
                        kind: Some(kv_event::Kind::Removed(KvRemoved {
                            block_hashes: hashes.to_vec(),
                        })),
                    });
                }
            }
            kind => out.push(KvEvent {
                event_id: event.event_id,
                tier,
                kind,
            }),
        }
    }
    out
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
        worker_readmitted: false,
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

/// Wall-clock milliseconds since the Unix epoch, for `published_at_ms`.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use kvmesh_proto::v1::{KvRemoved, kv_event};

    use super::*;
    use crate::event_plane::StreamConfig;
    use crate::event_plane::mem::MemEventPlane;

    fn removal(hashes: usize) -> KvEvent {
        KvEvent {
            event_id: 0,
            tier: 0,
            kind: Some(kv_event::Kind::Removed(KvRemoved {
                block_hashes: (0..hashes as u64)
                    .map(|h| h.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                    .collect(),
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
            assert!(batch.encoded_len() < MAX_BATCH_BYTES);
        }
        assert!(split_batches(7, 1, Vec::new(), 0).is_empty());
    }

    #[test]
    fn msg_id_names_worker_rank_and_first_event() {
        let mut event = removal(1);
        event.event_id = 42;
        let batch = KvEventBatch {
            worker_id: 0xab,
            dp_rank: 3,
            events: vec![event],
            ..Default::default()
        };
        assert_eq!(msg_id(&batch), "00000000000000ab-3-42");
    }

    #[test]
    fn oversized_events_split_into_chained_parts() {
        use kvmesh_proto::v1::KvStoredBlock;
        let blocks: Vec<KvStoredBlock> = (1..=5000u64)
            .map(|b| KvStoredBlock {
                block_hash: b * 1_000_003,
                tokens_hash: b,
                mm_hashes: vec![],
            })
            .collect();
        let stored = KvEvent {
            event_id: 0,
            tier: 1,
            kind: Some(kv_event::Kind::Stored(KvStored {
                parent_hash: Some(7),
                blocks: blocks.clone(),
                start_position: Some(3),
            })),
        };
        let removed = KvEvent {
            event_id: 0,
            tier: 1,
            kind: Some(kv_event::Kind::Removed(KvRemoved {
                block_hashes: (1..=5000u64).map(|b| b << 40).collect(),
            })),
        };
        let small = KvEvent {
            event_id: 0,
            tier: 1,
            kind: Some(kv_event::Kind::Removed(KvRemoved {
                block_hashes: vec![9],
            })),
        };
        let parts = split_large_events(vec![stored, small.clone(), removed], 4096);
        assert!(parts.iter().all(|e| e.encoded_len() <= 4096));
        let mut stored_blocks = Vec::new();
        let mut expected_parent = Some(7);
        let mut expected_position = Some(3);
        let mut removed_hashes: Vec<u64> = Vec::new();
        let mut saw_small = false;
        for part in &parts {
            assert_eq!(part.tier, 1);
            match part.kind.as_ref() {
                Some(kv_event::Kind::Stored(s)) => {
                    assert!(removed_hashes.is_empty() && !saw_small, "order kept");
                    assert_eq!(s.parent_hash, expected_parent);
                    assert_eq!(s.start_position, expected_position);
                    expected_parent = s.blocks.last().map(|b| b.block_hash);
                    expected_position = expected_position.map(|p| p + s.blocks.len() as u32);
                    stored_blocks.extend(s.blocks.iter().cloned());
                }
                Some(kv_event::Kind::Removed(r)) if r.block_hashes == [9] => saw_small = true,
                Some(kv_event::Kind::Removed(r)) => removed_hashes.extend(r.block_hashes.iter()),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(saw_small);
        assert_eq!(stored_blocks, blocks);
        assert_eq!(
            removed_hashes,
            (1..=5000u64).map(|b| b << 40).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_first_event_id_starts_the_ranks_not_resumed() {
        let publisher = KvEventPublisher::new(
            Arc::new(MemEventPlane::new()),
            "kv.m.0",
            5,
            HashMap::from([(1, 10), (2, 5000)]),
        )
        .with_first_event_id(1000);
        assert_eq!(publisher.next_event_id(0), 1000, "a rank never seen");
        assert_eq!(publisher.next_event_id(1), 10, "a known rank continues");
        assert_eq!(publisher.next_event_id(2), 5000);
    }

    #[tokio::test]
    async fn ids_are_gap_free_per_rank_and_continue_across_calls() {
        let plane = Arc::new(MemEventPlane::new());
        let config = StreamConfig {
            name: "S".into(),
            subjects: vec!["kv.>".into()],
            max_age: Duration::from_secs(60),
            duplicate_window: Duration::from_secs(60),
        };
        plane.ensure_stream(&config).await.unwrap();
        let mut publisher =
            KvEventPublisher::new(plane.clone(), "kv.m.0", 5, HashMap::from([(1, 10)]));
        let abort = CancellationToken::new();
        let stats = publisher
            .publish(0, vec![removal(1), removal(1)], &abort)
            .await
            .unwrap();
        assert_eq!((stats.batches, stats.events), (1, 2));
        publisher
            .publish(1, vec![removal(1)], &abort)
            .await
            .unwrap();
        publisher
            .publish(0, vec![removal(1)], &abort)
            .await
            .unwrap();
        assert_eq!(publisher.next_event_id(0), 3);
        assert_eq!(publisher.next_event_id(1), 11);
        let mut messages = plane.consume("S", &["kv.>".into()], 1).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..3 {
            let message = messages.next().await.unwrap().unwrap();
            let batch = KvEventBatch::decode(message.payload.as_ref()).unwrap();
            seen.extend(batch.events.iter().map(|e| (batch.dp_rank, e.event_id)));
        }
        assert_eq!(seen, vec![(0, 0), (0, 1), (1, 10), (0, 2)]);
    }
}

//! Conversions between the wire events (`kvmesh.v1.KvEventBatch`) and the index's engine-neutral
//! events, field for field.

use kvmesh_kv::{KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock, Tier};
use kvmesh_proto::v1 as pb;

/// Wire batch to index batch. Events without a kind are dropped (an older or newer publisher).
pub fn batch_from_proto(batch: pb::KvEventBatch) -> KvEventBatch {
    KvEventBatch {
        worker_id: batch.worker_id,
        dp_rank: batch.dp_rank,
        events: batch
            .events
            .into_iter()
            .filter_map(event_from_proto)
            .collect(),
        published_at_ms: batch.published_at_ms,
        worker_removed: batch.worker_removed,
        worker_readmitted: batch.worker_readmitted,
    }
}

fn event_from_proto(event: pb::KvEvent) -> Option<KvEvent> {
    let kind = match event.kind? {
        pb::kv_event::Kind::Stored(stored) => KvEventKind::Stored(KvStored {
            parent_hash: stored.parent_hash,
            blocks: stored
                .blocks
                .into_iter()
                .map(|block| KvStoredBlock {
                    block_hash: block.block_hash,
                    tokens_hash: block.tokens_hash,
                    mm_hashes: block.mm_hashes,
                })
                .collect(),
            start_position: stored.start_position,
        }),
        pb::kv_event::Kind::Removed(removed) => KvEventKind::Removed(KvRemoved {
            block_hashes: removed.block_hashes,
        }),
        pb::kv_event::Kind::Cleared(_) => KvEventKind::Cleared,
    };
    Some(KvEvent {
        event_id: event.event_id,
        tier: Tier::from_u8(u8::try_from(event.tier).unwrap_or(0)),
        kind,
    })
}

/// Index batch to wire batch (snapshots).
pub fn batch_to_proto(batch: &KvEventBatch) -> pb::KvEventBatch {
    pb::KvEventBatch {
        worker_id: batch.worker_id,
        dp_rank: batch.dp_rank,
        events: batch.events.iter().map(event_to_proto).collect(),
        published_at_ms: batch.published_at_ms,
        worker_removed: batch.worker_removed,
        worker_readmitted: batch.worker_readmitted,
    }
}

fn event_to_proto(event: &KvEvent) -> pb::KvEvent {
    let kind = match &event.kind {
        KvEventKind::Stored(stored) => pb::kv_event::Kind::Stored(pb::KvStored {
            parent_hash: stored.parent_hash,
            blocks: stored
                .blocks
                .iter()
                .map(|block| pb::KvStoredBlock {
                    block_hash: block.block_hash,
                    tokens_hash: block.tokens_hash,
                    mm_hashes: block.mm_hashes.clone(),
                })
                .collect(),
            start_position: stored.start_position,
        }),
        KvEventKind::Removed(removed) => pb::kv_event::Kind::Removed(pb::KvRemoved {
            block_hashes: removed.block_hashes.clone(),
        }),
        KvEventKind::Cleared => pb::kv_event::Kind::Cleared(pb::KvCleared {}),
    };
    pb::KvEvent {
        event_id: event.event_id,
        tier: event.tier as i32,
        kind: Some(kind),
    }
}

/// Scores of the index as wire rows.
pub fn scores_to_proto(scores: &kvmesh_kv::OverlapScores) -> Vec<pb::WorkerScore> {
    scores
        .scores
        .iter()
        .map(|row| pb::WorkerScore {
            worker_id: row.worker.worker_id,
            dp_rank: row.worker.dp_rank,
            device_blocks: row.device,
            host_blocks: row.host_pinned,
            disk_blocks: row.disk,
            external_blocks: row.external,
            tree_size: row.tree_size,
        })
        .collect()
}

/// Wire rows back to index scores (the router's client).
pub fn scores_from_proto(response: &pb::FindMatchesResponse) -> kvmesh_kv::OverlapScores {
    let mut scores = kvmesh_kv::OverlapScores {
        scores: response
            .scores
            .iter()
            .map(|row| kvmesh_kv::MemberScore {
                worker: kvmesh_kv::WorkerKey::new(row.worker_id, row.dp_rank),
                device: row.device_blocks,
                host_pinned: row.host_blocks,
                disk: row.disk_blocks,
                external: row.external_blocks,
                tree_size: row.tree_size,
            })
            .collect(),
        frequencies: response.frequencies.clone(),
    };
    scores.scores.sort_by_key(|row| row.worker);
    scores
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip() {
        let batch = KvEventBatch {
            worker_id: 7,
            dp_rank: 1,
            events: vec![
                KvEvent {
                    event_id: 3,
                    tier: Tier::HostPinned,
                    kind: KvEventKind::Stored(KvStored {
                        parent_hash: Some(9),
                        blocks: vec![KvStoredBlock::new(10, 11)],
                        start_position: Some(2),
                    }),
                },
                KvEvent {
                    event_id: 4,
                    tier: Tier::Device,
                    kind: KvEventKind::Removed(KvRemoved {
                        block_hashes: vec![10],
                    }),
                },
                KvEvent {
                    event_id: 5,
                    tier: Tier::Disk,
                    kind: KvEventKind::Cleared,
                },
            ],
            published_at_ms: 12,
            worker_removed: false,
            worker_readmitted: false,
        };
        assert_eq!(batch_from_proto(batch_to_proto(&batch)), batch);
    }
}

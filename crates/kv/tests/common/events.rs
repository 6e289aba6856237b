//! Event builders shared by the integration tests.
#![allow(dead_code)]

use kvmesh_kv::{
    KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock, Tier, WorkerKey,
};

/// (worker, dp 0).
pub fn w(worker_id: u64) -> WorkerKey {
    WorkerKey::new(worker_id, 0)
}

/// A device-tier stored event of `(engine hash, tokens hash)` blocks.
pub fn store(event_id: u64, parent: Option<u64>, blocks: &[(u64, u64)]) -> KvEvent {
    store_tier(event_id, Tier::Device, parent, blocks)
}

/// A stored event in `tier`.
pub fn store_tier(
    event_id: u64,
    tier: Tier,
    parent: Option<u64>,
    blocks: &[(u64, u64)],
) -> KvEvent {
    KvEvent {
        event_id,
        tier,
        kind: KvEventKind::Stored(KvStored {
            parent_hash: parent,
            blocks: blocks
                .iter()
                .map(|&(engine, tokens)| KvStoredBlock::new(engine, tokens))
                .collect(),
            start_position: None,
        }),
    }
}

/// A device-tier removed event.
pub fn remove(event_id: u64, hashes: &[u64]) -> KvEvent {
    remove_tier(event_id, Tier::Device, hashes)
}

/// A removed event in `tier`.
pub fn remove_tier(event_id: u64, tier: Tier, hashes: &[u64]) -> KvEvent {
    KvEvent {
        event_id,
        tier,
        kind: KvEventKind::Removed(KvRemoved {
            block_hashes: hashes.to_vec(),
        }),
    }
}

/// A cleared event.
pub fn clear(event_id: u64) -> KvEvent {
    KvEvent {
        event_id,
        tier: Tier::Device,
        kind: KvEventKind::Cleared,
    }
}

/// A batch of one (worker, dp_rank).
pub fn batch(worker: WorkerKey, events: Vec<KvEvent>) -> KvEventBatch {
    KvEventBatch {
        worker_id: worker.worker_id,
        dp_rank: worker.dp_rank,
        events,
        published_at_ms: 0,
        worker_removed: false,
        worker_readmitted: false,
    }
}

//! One shard replica's state: the partitions it owns, one concurrent index per model, and how far
//! into the event stream it has applied. Read lock-free by queries; written by the consumer.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use kvmesh_kv::{ConcurrentIndex, OverlapScores, kv_partition};
use kvmesh_proto::v1::IndexerState;

/// Which partitions a shard owns (docs/indexer.md, "Sharding").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// Shard index `k`.
    pub shard: u32,
    /// Number of shards `S`.
    pub shards: u32,
    /// Partitions owned, ascending.
    pub partitions: Vec<u32>,
    /// Number of partitions `P` in the namespace.
    pub num_partitions: u32,
}

impl ShardLayout {
    /// The default layout: shard `k` of `S` owns the partitions `p` with `p mod S == k`.
    pub fn striped(shard: u32, shards: u32, num_partitions: u32) -> Self {
        let shards = shards.max(1);
        Self {
            shard,
            shards,
            partitions: (0..num_partitions)
                .filter(|p| p % shards == shard)
                .collect(),
            num_partitions,
        }
    }

    /// Whether this shard indexes `worker_id`.
    pub fn owns_worker(&self, worker_id: u64) -> bool {
        self.partitions
            .binary_search(&kv_partition(worker_id, self.num_partitions))
            .is_ok()
    }
}

/// A replica's live state.
pub struct ShardState {
    /// Partitions owned.
    pub layout: ShardLayout,
    lanes: usize,
    models: ArcSwap<HashMap<String, Arc<ConcurrentIndex>>>,
    applied_seq: AtomicU64,
    state: AtomicI32,
}

/// Most models one shard indexes; events of further models are skipped and counted.
pub const MAX_MODELS_PER_SHARD: usize = 256;

impl ShardState {
    /// An empty shard with `lanes` apply threads per model.
    pub fn new(layout: ShardLayout, lanes: usize) -> Self {
        Self {
            layout,
            lanes: lanes.max(1),
            models: ArcSwap::from_pointee(HashMap::new()),
            applied_seq: AtomicU64::new(0),
            state: AtomicI32::new(IndexerState::Loading as i32),
        }
    }

    /// The index of a model, if any event for it was seen.
    pub fn model(&self, model: &str) -> Option<Arc<ConcurrentIndex>> {
        self.models.load().get(model).cloned()
    }

    /// The index of a model, created on first use; `None` once the shard holds
    /// [`MAX_MODELS_PER_SHARD`] models (model names come from event subjects, and each index
    /// costs apply threads). Only the consumer and bootstrap call this.
    pub fn model_or_insert(&self, model: &str) -> Option<Arc<ConcurrentIndex>> {
        if let Some(index) = self.model(model) {
            return Some(index);
        }
        let current = self.models.load();
        if current.len() >= MAX_MODELS_PER_SHARD {
            return None;
        }
        let index = Arc::new(ConcurrentIndex::new(self.lanes));
        let mut next = HashMap::clone(&current);
        next.insert(model.to_string(), index.clone());
        self.models.store(Arc::new(next));
        Some(index)
    }

    /// Every model and its index, sorted by name.
    pub fn models(&self) -> Vec<(String, Arc<ConcurrentIndex>)> {
        let mut models: Vec<_> = self
            .models
            .load()
            .iter()
            .map(|(name, index)| (name.clone(), index.clone()))
            .collect();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        models
    }

    /// Matches a block sequence of `model`; an unknown model matches nothing.
    pub fn find_matches(&self, model: &str, local_hashes: &[u64]) -> OverlapScores {
        self.model(model)
            .map(|index| index.find_matches(local_hashes))
            .unwrap_or_default()
    }

    /// Forgets every model and the applied sequence, before a snapshot replaces the state.
    pub fn clear(&self) {
        self.models.store(Arc::new(HashMap::new()));
        self.set_applied_seq(0);
    }

    /// Last stream sequence applied.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq.load(Ordering::Acquire)
    }

    /// Records the last stream sequence applied.
    pub fn set_applied_seq(&self, seq: u64) {
        self.applied_seq.store(seq, Ordering::Release);
    }

    /// Readiness.
    pub fn state(&self) -> IndexerState {
        IndexerState::try_from(self.state.load(Ordering::Acquire)).unwrap_or(IndexerState::Loading)
    }

    /// Changes readiness.
    pub fn set_state(&self, state: IndexerState) {
        self.state.store(state as i32, Ordering::Release);
    }
}

/// The in-process router reads a shard's state directly (a frontend keeping its own index).
impl kvmesh_routing::OverlapSource for ShardState {
    fn find_matches(&self, model: &str, local_hashes: &[u64]) -> OverlapScores {
        ShardState::find_matches(self, model, local_hashes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_layout_covers_every_partition_once() {
        let layouts: Vec<_> = (0..3).map(|k| ShardLayout::striped(k, 3, 16)).collect();
        let mut all: Vec<u32> = layouts.iter().flat_map(|l| l.partitions.clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
        for worker in 0..200u64 {
            assert_eq!(layouts.iter().filter(|l| l.owns_worker(worker)).count(), 1);
        }
    }
}

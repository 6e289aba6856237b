//! Where cache overlap comes from: a trait between the router and the index.
//!
//! The routing core asks an [`OverlapSource`] "how many leading blocks of this prompt does each
//! (worker, dp_rank) cache?". The in-process indexes of `kvmesh_kv` and the indexer's shard state
//! (in `kvmesh-indexer`) implement it synchronously; the indexer client that fans out to shards
//! is asked before a decision and its answer passed in through
//! [`crate::RouterCore::route_prepared`], so the core does not change with where the index is.
//! The approximate and predicted side indexes are owned by the core itself because they are fed
//! by its own decisions.

use std::sync::{Arc, PoisonError, RwLock};

use kvmesh_kv::{ConcurrentIndex, OverlapScores, RadixIndex, WorkerKey};

use crate::config::KvRouterConfig;

/// An index the router can query for prompt overlap.
pub trait OverlapSource: Send + Sync {
    /// Matches `local_hashes` (the prompt's block hashes, root first) for `model`.
    fn find_matches(&self, model: &str, local_hashes: &[u64]) -> OverlapScores;

    /// Device blocks the index holds for `worker`, where the source knows (the adaptive
    /// weights read how full the workers' caches are from it); `None` by default.
    fn blocks_held(&self, _worker: WorkerKey) -> Option<u64> {
        None
    }
}

impl OverlapSource for ConcurrentIndex {
    fn find_matches(&self, _model: &str, local_hashes: &[u64]) -> OverlapScores {
        ConcurrentIndex::find_matches(self, local_hashes)
    }

    fn blocks_held(&self, worker: WorkerKey) -> Option<u64> {
        Some(self.tree_size(worker))
    }
}

impl OverlapSource for RwLock<RadixIndex> {
    fn find_matches(&self, _model: &str, local_hashes: &[u64]) -> OverlapScores {
        self.read()
            .unwrap_or_else(PoisonError::into_inner)
            .find_matches(local_hashes)
    }

    fn blocks_held(&self, worker: WorkerKey) -> Option<u64> {
        Some(
            self.read()
                .unwrap_or_else(PoisonError::into_inner)
                .tree_size(worker),
        )
    }
}

impl<S: OverlapSource + ?Sized> OverlapSource for Arc<S> {
    fn find_matches(&self, model: &str, local_hashes: &[u64]) -> OverlapScores {
        (**self).find_matches(model, local_hashes)
    }

    fn blocks_held(&self, worker: WorkerKey) -> Option<u64> {
        (**self).blocks_held(worker)
    }
}

/// A source that never matches (tests, and kv routing before an index is attached).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoIndex;

impl OverlapSource for NoIndex {
    fn find_matches(&self, _model: &str, _local_hashes: &[u64]) -> OverlapScores {
        OverlapScores::default()
    }
}

/// The in-process event-fed index of one model, with `--router-event-threads` apply lanes.
pub fn build_event_index(config: &KvRouterConfig) -> ConcurrentIndex {
    ConcurrentIndex::new(config.event_threads.max(1))
}

#[cfg(test)]
mod tests {
    use kvmesh_kv::{KvEvent, KvEventBatch, KvEventKind, KvStored, KvStoredBlock, Tier, WorkerKey};

    use super::*;

    #[test]
    fn indexes_answer_through_the_trait() {
        let config = KvRouterConfig {
            event_threads: 3,
            ..KvRouterConfig::default()
        };
        let index = build_event_index(&config);
        assert_eq!(index.num_lanes(), 3);
        let batch = KvEventBatch {
            worker_id: 7,
            dp_rank: 0,
            events: vec![KvEvent {
                event_id: 0,
                tier: Tier::Device,
                kind: KvEventKind::Stored(KvStored {
                    parent_hash: None,
                    blocks: vec![KvStoredBlock::new(100, 1), KvStoredBlock::new(101, 2)],
                    start_position: None,
                }),
            }],
            ..KvEventBatch::default()
        };
        index.apply(batch.clone()).unwrap();
        index.flush().unwrap();
        let source: Arc<dyn OverlapSource> = Arc::new(index);
        assert_eq!(
            source
                .find_matches("m", &[1, 2, 3])
                .device(WorkerKey::new(7, 0)),
            2
        );
        let mut radix = RadixIndex::new();
        radix.apply(&batch);
        let radix = RwLock::new(radix);
        assert_eq!(
            radix.find_matches("m", &[1]).device(WorkerKey::new(7, 0)),
            1
        );
        assert!(NoIndex.find_matches("m", &[1]).scores.is_empty());
        // How many blocks each holds for a worker, which the adaptive weights read.
        let worker = WorkerKey::new(7, 0);
        assert_eq!(source.blocks_held(worker), Some(2));
        assert_eq!(radix.blocks_held(worker), Some(2));
        assert_eq!(source.blocks_held(WorkerKey::new(8, 0)), Some(0));
        assert_eq!(NoIndex.blocks_held(worker), None);
    }
}

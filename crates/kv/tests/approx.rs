//! The approximate (routing-decision-fed) index and the predicted side index.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

use std::time::Duration;

use kvmesh_kv::{ApproxConfig, ApproxIndex, ApproxPolicy, WorkerKey, compute_seq_hashes};

fn w(id: u64) -> WorkerKey {
    WorkerKey::new(id, 0)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn record(index: &mut ApproxIndex, worker: WorkerKey, local: &[u64], now: Duration) {
    index.record_routing_decision(worker, local, &compute_seq_hashes(local), now);
}

#[test]
fn ttl_entries_expire_and_reinsertion_refreshes() {
    let mut index = ApproxIndex::new(ApproxConfig {
        policy: ApproxPolicy::Ttl(secs(10)),
        ..ApproxConfig::default()
    });
    record(&mut index, w(1), &[1, 2, 3], secs(0));
    record(&mut index, w(2), &[1, 2], secs(5));
    assert_eq!(index.find_matches(&[1, 2, 3]).device(w(1)), 3);
    // Refresh the first two blocks of worker 1 at t=8.
    record(&mut index, w(1), &[1, 2], secs(8));
    let scores = index.find_matches_at(&[1, 2, 3], secs(10));
    assert_eq!(scores.device(w(1)), 2, "block 3 expired at t=10");
    assert_eq!(scores.device(w(2)), 2);
    let scores = index.find_matches_at(&[1, 2, 3], secs(15));
    assert_eq!(scores.device(w(2)), 0);
    assert_eq!(scores.device(w(1)), 2);
    index.advance(secs(18));
    assert_eq!(index.num_blocks(), 0);
    assert_eq!(index.index().digest(), 0);
    index.index().validate().expect("consistent");
}

#[test]
fn over_max_tree_size_prunes_earliest_and_deepest_first() {
    let mut index = ApproxIndex::new(ApproxConfig {
        policy: ApproxPolicy::Ttl(secs(1000)),
        max_tree_size: 6,
        prune_target_ratio: 0.5,
    });
    record(&mut index, w(1), &[1, 2, 3], secs(0));
    record(&mut index, w(2), &[1, 2, 3], secs(1));
    assert_eq!(index.num_blocks(), 6);
    // One more entry: over 6, prune down to 3 — worker 1's three (oldest) go first.
    record(&mut index, w(3), &[7], secs(2));
    assert_eq!(index.num_blocks(), 3);
    let scores = index.find_matches(&[1, 2, 3]);
    assert_eq!(scores.device(w(1)), 0);
    assert_eq!(scores.device(w(2)), 2, "deeper block of the tie went first");
}

#[test]
fn lru_keeps_each_rank_within_its_capacity() {
    let mut index = ApproxIndex::new(ApproxConfig {
        policy: ApproxPolicy::Lru,
        ..ApproxConfig::default()
    });
    index.set_capacity(w(1), 4);
    record(&mut index, w(1), &[1, 2, 3], secs(0));
    record(&mut index, w(1), &[5, 6], secs(1));
    // 5 entries for capacity 4: the oldest, deepest (block 3 of the first request) leaves.
    assert_eq!(index.find_matches(&[1, 2, 3]).device(w(1)), 2);
    assert_eq!(index.find_matches(&[5, 6]).device(w(1)), 2);
    // Time never expires entries under LRU.
    index.advance(secs(1_000_000));
    assert_eq!(index.num_blocks(), 4);
    index.set_capacity(w(1), 1);
    assert_eq!(index.num_blocks(), 1);
    assert_eq!(index.find_matches(&[5]).device(w(1)), 1);
}

#[test]
fn removed_workers_leave_and_stay_out() {
    let mut index = ApproxIndex::new(ApproxConfig::default());
    record(&mut index, w(1), &[1, 2], secs(0));
    index.remove_worker(1);
    record(&mut index, w(1), &[1, 2], secs(1));
    assert_eq!(index.num_blocks(), 0);
}

#[test]
fn predicted_side_index_raises_device_overlap() {
    let mut side = ApproxIndex::new(ApproxConfig::predicted(secs(2)));
    record(&mut side, w(7), &[1, 2, 3], secs(0));
    let mut primary = kvmesh_kv::OverlapScores::default();
    primary.max_device_with(&side.find_matches_at(&[1, 2, 3, 4], secs(1)));
    assert_eq!(primary.device(w(7)), 3);
    let expired = side.find_matches_at(&[1, 2, 3], secs(2));
    assert!(expired.scores.is_empty());
}

//! The concurrent index under real concurrency: queries while lanes apply.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

#[path = "common/events.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{batch, remove, store, w};
use kvmesh_kv::{ConcurrentIndex, KvEventBatch, RadixIndex};

/// Worker `k` repeatedly stores a chain of 8 blocks and evicts its tail.
fn stream(workers: u64, rounds: u64) -> Vec<KvEventBatch> {
    let mut out = Vec::new();
    for round in 0..rounds {
        for k in 1..=workers {
            let base = k * 1_000_000 + round * 100;
            let blocks: Vec<(u64, u64)> = (0..8).map(|i| (base + i, (k + i) % 5 + i * 7)).collect();
            out.push(batch(w(k), vec![store(round * 2, None, &blocks)]));
            out.push(batch(
                w(k),
                vec![remove(round * 2 + 1, &[base + 7, base + 6])],
            ));
        }
    }
    out
}

#[test]
fn queries_run_while_lanes_apply_and_end_equal_to_the_single_threaded_index() {
    let index = Arc::new(ConcurrentIndex::with_queue_capacity(3, 16));
    let is_done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let index = Arc::clone(&index);
            let is_done = Arc::clone(&is_done);
            std::thread::spawn(move || {
                let mut queries = 0u64;
                while !is_done.load(Ordering::Relaxed) {
                    let scores = index.find_matches(&[1, 8, 15, 22, 29, 36]);
                    for row in &scores.scores {
                        assert!(row.device <= 6);
                    }
                    for pair in scores.frequencies.windows(2) {
                        assert!(pair[0] >= pair[1], "frequencies must not increase");
                    }
                    queries += 1;
                }
                queries
            })
        })
        .collect();
    let events = stream(20, 50);
    let mut reference = RadixIndex::new();
    for b in &events {
        reference.apply(b);
        index.apply(b.clone()).expect("lane alive");
    }
    index.flush().expect("lane alive");
    is_done.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().expect("reader") > 0);
    }
    assert_eq!(index.digest(), reference.digest());
    assert_eq!(index.num_blocks(), reference.num_blocks());
    assert_eq!(index.num_workers(), 20);
    for k in 1..=20u64 {
        let query: Vec<u64> = (0..8).map(|i| (k + i) % 5 + i * 7).collect();
        assert_eq!(index.find_matches(&query), reference.find_matches(&query));
        assert_eq!(index.tree_size(w(k)), reference.tree_size(w(k)));
    }
}

#[test]
fn workers_are_pinned_to_lanes_by_partition_hash() {
    let index = ConcurrentIndex::new(16);
    assert_eq!(index.num_lanes(), 16);
    // Same function as the event-plane partition (kv-events golden values).
    assert_eq!(index.lane_of(1), 14);
    assert_eq!(index.lane_of(2), 3);
    assert_eq!(index.lane_of(42), 8);
    assert_eq!(ConcurrentIndex::new(0).num_lanes(), 1);
}

#[test]
fn removed_workers_disappear_from_answers() {
    let index = ConcurrentIndex::new(2);
    for k in 1..=4 {
        index
            .apply(batch(w(k), vec![store(0, None, &[(k, 1), (k + 10, 2)])]))
            .expect("lane alive");
    }
    index
        .apply(KvEventBatch::worker_removed(3))
        .expect("lane alive");
    index.flush().expect("lane alive");
    let scores = index.find_matches(&[1, 2]);
    assert_eq!(scores.scores.len(), 3);
    assert_eq!(scores.device(w(3)), 0);
    assert_eq!(scores.frequencies, vec![3, 3]);
    assert_eq!(index.counters().workers_removed, 1);
}

#[test]
fn lock_free_queries_only_see_real_members_under_churn() {
    // Workers share a prefix and churn stores and removals of long chains, so lists grow, shrink,
    // change size class and nodes are freed and reused while queries read them.
    let index = Arc::new(ConcurrentIndex::with_queue_capacity(3, 64));
    let is_done = Arc::new(AtomicBool::new(false));
    let query: Vec<u64> = (0..40).map(|i| 10_000 + i).collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let index = Arc::clone(&index);
            let is_done = Arc::clone(&is_done);
            let query = query.clone();
            std::thread::spawn(move || {
                while !is_done.load(Ordering::Relaxed) {
                    let scores = index.find_matches(&query);
                    for row in &scores.scores {
                        assert!((1..=30).contains(&row.worker.worker_id), "{row:?}");
                        assert!(row.total() as usize <= query.len());
                        assert!(row.total() > 0);
                    }
                    assert!(scores.frequencies.len() <= query.len());
                }
            })
        })
        .collect();
    let mut next_id = [0u64; 31];
    for round in 0..300u64 {
        for k in 1..=30u64 {
            let length = 5 + (round * 7 + k) % 35;
            let blocks: Vec<(u64, u64)> = (0..length)
                .map(|i| (k * 1_000_000 + i, 10_000 + i))
                .collect();
            let id = &mut next_id[k as usize];
            let events = if round % 2 == 0 {
                vec![store(*id, None, &blocks)]
            } else {
                let hashes: Vec<u64> = blocks.iter().map(|b| b.0).collect();
                vec![remove(*id, &hashes)]
            };
            *id += 1;
            index.apply(batch(w(k), events)).expect("lane alive");
        }
    }
    index.flush().expect("lane alive");
    is_done.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().expect("reader");
    }
    index
        .fold(Ok(()), |acc, lane| acc.and(lane.validate()))
        .expect("consistent");
}

#[test]
fn try_apply_hands_a_batch_back_while_its_lane_is_full_and_loses_nothing() {
    let index = ConcurrentIndex::with_queue_capacity(1, 1);
    let mut reference = RadixIndex::new();
    // A long chain keeps the lane busy for far longer than the next sends take.
    let long: Vec<(u64, u64)> = (0..200_000).map(|i| (i + 1, i * 3 + 1)).collect();
    let mut events = vec![batch(w(1), vec![store(0, None, &long)])];
    events.extend((1..4).map(|n| batch(w(1), vec![remove(n, &[200_001 - n])])));
    let mut handed_back = 0;
    for b in &events {
        reference.apply(b);
        if let Some(back) = index.try_apply(b.clone()).expect("lane alive") {
            handed_back += 1;
            assert_eq!(&back, b);
            index.apply(back).expect("lane alive");
        }
    }
    assert!(handed_back > 0, "a queue of one never filled");
    index.flush().expect("lane alive");
    assert_eq!(index.digest(), reference.digest());
    assert_eq!(index.num_blocks(), reference.num_blocks());
}

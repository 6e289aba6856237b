//! The index rules of docs/indexer.md ("Tree semantics") and docs/kv-events.md ("Event model",
//! "Ordering rules"), one test per rule.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

#[path = "common/events.rs"]
mod common;

use common::{batch, clear, remove, remove_tier, store, store_tier, w};
use kvmesh_kv::{
    EventStatus, EventType, KvEventBatch, RadixIndex, Tier, WorkerKey, compute_block_hashes,
    seed_for,
};

fn index_with(batches: &[KvEventBatch]) -> RadixIndex {
    let mut index = RadixIndex::new();
    for b in batches {
        index.apply(b);
        index.validate().expect("consistent");
    }
    index
}

#[test]
fn stored_chain_matches_prefixes() {
    let index = index_with(&[
        batch(w(1), vec![store(0, None, &[(101, 1), (102, 2), (103, 3)])]),
        batch(w(2), vec![store(0, None, &[(201, 1), (202, 2)])]),
    ]);
    let scores = index.find_matches(&[1, 2, 3, 4]);
    assert_eq!(scores.device(w(1)), 3);
    assert_eq!(scores.device(w(2)), 2);
    assert_eq!(scores.frequencies, vec![2, 2, 1]);
    assert_eq!(scores.get(w(1)).map(|s| s.tree_size), Some(3));
    // A different first block matches nothing; the match needs the whole path.
    assert!(index.find_matches(&[2, 3]).scores.is_empty());
    assert_eq!(index.find_matches(&[1, 9, 3]).device(w(1)), 1);
    assert_eq!(index.num_blocks(), 5);
    assert_eq!(index.num_nodes(), 3);
    assert_eq!(index.counters().stored.ok, 2);
}

#[test]
fn stored_attaches_under_the_parent_named_by_engine_hash() {
    let index = index_with(&[batch(
        w(1),
        vec![
            store(0, None, &[(101, 1)]),
            store(1, Some(101), &[(102, 2), (103, 3)]),
        ],
    )]);
    assert_eq!(index.find_matches(&[1, 2, 3]).device(w(1)), 3);
}

#[test]
fn unknown_parent_drops_the_event_and_consumes_its_id() {
    let mut index = index_with(&[batch(
        w(1),
        vec![
            store(0, Some(999), &[(101, 1)]),
            // Chained on the dropped block: fails the same way.
            store(1, Some(101), &[(102, 2)]),
            // A chain from the root works again.
            store(2, None, &[(103, 1)]),
        ],
    )]);
    let counters = index.counters();
    assert_eq!(counters.stored.parent_block_not_found, 2);
    assert_eq!(counters.stored.ok, 1);
    assert_eq!(counters.gaps, 0);
    assert_eq!(index.last_event_id(w(1)), Some(2));
    // Not attached at the root either.
    assert_eq!(index.find_matches(&[1]).device(w(1)), 1);
    assert_eq!(index.tree_size(w(1)), 1);
    index.apply(&batch(w(1), vec![store(3, Some(103), &[(104, 2)])]));
    assert_eq!(index.find_matches(&[1, 2]).device(w(1)), 2);
}

#[test]
fn removed_drops_blocks_and_frees_nodes_upward() {
    let mut index = index_with(&[batch(
        w(1),
        vec![store(0, None, &[(101, 1), (102, 2), (103, 3)])],
    )]);
    index.apply(&batch(w(1), vec![remove(1, &[103, 102])]));
    index.validate().expect("consistent");
    assert_eq!(index.find_matches(&[1, 2, 3]).device(w(1)), 1);
    assert_eq!(index.num_nodes(), 1);
    assert_eq!(index.counters().removed.ok, 1);
    // Unknown hash: counted, the known ones still removed.
    index.apply(&batch(w(1), vec![remove(2, &[555, 101])]));
    assert_eq!(index.counters().removed.block_not_found, 1);
    assert_eq!(index.num_nodes(), 0);
    assert_eq!(index.num_blocks(), 0);
    assert_eq!(index.digest(), 0);
}

#[test]
fn a_missing_middle_block_stops_the_match_and_keeps_the_path() {
    let mut index = index_with(&[batch(
        w(1),
        vec![store(0, None, &[(101, 1), (102, 2), (103, 3)])],
    )]);
    index.apply(&batch(w(1), vec![remove(1, &[102])]));
    index.validate().expect("consistent");
    assert_eq!(index.find_matches(&[1, 2, 3]).device(w(1)), 1);
    // The memberless middle node stays because its child still has a member.
    assert_eq!(index.num_nodes(), 3);
    // Re-storing the middle block restores the full match.
    index.apply(&batch(w(1), vec![store(2, Some(101), &[(102, 2)])]));
    assert_eq!(index.find_matches(&[1, 2, 3]).device(w(1)), 3);
}

#[test]
fn cleared_drops_everything_of_that_rank_only() {
    let r0 = WorkerKey::new(1, 0);
    let r1 = WorkerKey::new(1, 1);
    let mut index = index_with(&[
        batch(r0, vec![store(0, None, &[(101, 1), (102, 2)])]),
        batch(r1, vec![store(0, None, &[(101, 1)])]),
    ]);
    index.apply(&batch(r0, vec![clear(1)]));
    index.validate().expect("consistent");
    let scores = index.find_matches(&[1, 2]);
    assert_eq!(scores.device(r0), 0);
    assert_eq!(scores.device(r1), 1);
    assert_eq!(index.last_event_id(r0), Some(1));
    assert_eq!(index.counters().cleared.ok, 1);
    // A clear is a barrier: later stores from the root apply normally.
    index.apply(&batch(r0, vec![store(7, None, &[(103, 1)])]));
    assert_eq!(index.find_matches(&[1]).device(r0), 1);
}

#[test]
fn worker_removed_drops_all_ranks_and_ignores_later_events() {
    let r0 = WorkerKey::new(1, 0);
    let r1 = WorkerKey::new(1, 1);
    let mut index = index_with(&[
        batch(r0, vec![store(0, None, &[(101, 1)])]),
        batch(r1, vec![store(0, None, &[(101, 1)])]),
        batch(w(2), vec![store(0, None, &[(201, 1)])]),
    ]);
    index.apply(&KvEventBatch::worker_removed(1));
    index.apply(&KvEventBatch::worker_removed(1));
    index.apply(&batch(r0, vec![store(1, None, &[(102, 1)])]));
    index.validate().expect("consistent");
    let scores = index.find_matches(&[1]);
    assert_eq!(scores.scores.len(), 1);
    assert_eq!(scores.device(w(2)), 1);
    assert!(index.is_worker_removed(1));
    assert_eq!(index.workers(), vec![w(2)]);
    let counters = index.counters();
    assert_eq!(counters.workers_removed, 1);
    assert_eq!(counters.ignored_removed_worker, 1);
}

#[test]
fn worker_readmitted_applies_its_events_again_from_an_empty_tree() {
    let mut index = index_with(&[batch(w(1), vec![store(0, None, &[(101, 1), (102, 2)])])]);
    index.apply(&KvEventBatch::worker_removed(1));
    index.apply(&batch(w(1), vec![store(1, None, &[(103, 3)])]));
    assert_eq!(
        index.find_matches(&[3]).device(w(1)),
        0,
        "ignored while removed"
    );
    index.apply(&KvEventBatch::worker_readmitted(1));
    index.apply(&KvEventBatch::worker_readmitted(1));
    assert!(!index.is_worker_removed(1));
    assert_eq!(
        index.num_readmissions(1),
        1,
        "a second marker changes nothing"
    );
    // The member starts over: its next event is a first event, whatever its id.
    index.apply(&batch(w(1), vec![store(7, None, &[(104, 4)])]));
    index.validate().expect("consistent");
    assert_eq!(index.find_matches(&[4]).device(w(1)), 1);
    assert_eq!(
        index.find_matches(&[1, 2]).device(w(1)),
        0,
        "old blocks stay gone"
    );
    assert_eq!(index.last_event_id(w(1)), Some(7));
    // Readmitting a worker never removed is a no-op.
    index.apply(&KvEventBatch::worker_readmitted(9));
    assert_eq!(index.num_readmissions(9), 0);
}

#[test]
fn duplicates_are_skipped_and_gaps_applied_and_counted() {
    let mut index = index_with(&[batch(w(1), vec![store(0, None, &[(101, 1)])])]);
    // Duplicate of id 0 (different content): skipped.
    index.apply(&batch(w(1), vec![store(0, None, &[(109, 9)])]));
    assert!(index.find_matches(&[9]).scores.is_empty());
    // Gap 0 → 5: applied, counted.
    index.apply(&batch(w(1), vec![store(5, Some(101), &[(102, 2)])]));
    // 3 is now a duplicate too.
    index.apply(&batch(w(1), vec![remove(3, &[101])]));
    let counters = index.counters();
    assert_eq!(counters.duplicates, 2);
    assert_eq!(counters.gaps, 1);
    assert_eq!(index.find_matches(&[1, 2]).device(w(1)), 2);
    assert_eq!(index.last_event_id(w(1)), Some(5));
}

#[test]
fn self_referencing_stores_are_dropped_and_consume_the_id() {
    let mut index = index_with(&[batch(
        w(1),
        vec![
            store(0, None, &[(101, 1), (101, 2)]),
            store(1, Some(102), &[(102, 2)]),
        ],
    )]);
    assert_eq!(index.counters().stored.invalid_block, 2);
    assert_eq!(index.last_event_id(w(1)), Some(1));
    assert_eq!(index.num_blocks(), 0);
    let long: Vec<(u64, u64)> = (0..40).map(|i| (1000 + i % 39, i)).collect();
    index.apply(&batch(w(1), vec![store(2, None, &long)]));
    assert_eq!(index.counters().stored.invalid_block, 3);
}

#[test]
fn restoring_a_held_block_only_refreshes() {
    let mut index = index_with(&[batch(w(1), vec![store(0, None, &[(101, 1), (102, 2)])])]);
    let digest = index.digest();
    index.apply(&batch(w(1), vec![store(1, None, &[(101, 1), (102, 2)])]));
    assert_eq!(index.digest(), digest);
    assert_eq!(index.num_blocks(), 2);
    assert_eq!(index.tree_size(w(1)), 2);
}

#[test]
fn tiers_are_reported_apart_and_continue_after_faster_tiers() {
    // Device: blocks 1-2; host: 3-4 and also 1; disk: 5; block 6 on device only.
    let index = index_with(&[batch(
        w(1),
        vec![
            store_tier(0, Tier::Device, None, &[(101, 1), (102, 2)]),
            store_tier(1, Tier::HostPinned, Some(102), &[(103, 3), (104, 4)]),
            store_tier(2, Tier::HostPinned, None, &[(101, 1)]),
            store_tier(3, Tier::Disk, Some(104), &[(105, 5)]),
            store_tier(4, Tier::Device, Some(105), &[(106, 6)]),
        ],
    )]);
    let row = *index
        .find_matches(&[1, 2, 3, 4, 5, 6, 7])
        .get(w(1))
        .expect("row");
    assert_eq!(
        (row.device, row.host_pinned, row.disk, row.external),
        (2, 2, 2, 0)
    );
    assert_eq!(row.total(), 6);
    // Host only from the first block: device 0, host run from there.
    let index = index_with(&[batch(
        w(2),
        vec![store_tier(0, Tier::HostPinned, None, &[(201, 1), (202, 2)])],
    )]);
    let row = *index.find_matches(&[1, 2]).get(w(2)).expect("row");
    assert_eq!((row.device, row.host_pinned), (0, 2));
}

#[test]
fn removing_one_tier_keeps_the_others() {
    let mut index = index_with(&[batch(
        w(1),
        vec![
            store_tier(0, Tier::Device, None, &[(101, 1)]),
            store_tier(1, Tier::HostPinned, None, &[(101, 1)]),
        ],
    )]);
    index.apply(&batch(w(1), vec![remove_tier(2, Tier::Device, &[101])]));
    index.validate().expect("consistent");
    let row = *index.find_matches(&[1]).get(w(1)).expect("row");
    assert_eq!((row.device, row.host_pinned), (0, 1));
    // Removing a tier the hash is not in: block_not_found.
    index.apply(&batch(w(1), vec![remove_tier(3, Tier::Disk, &[101])]));
    assert_eq!(index.counters().removed.block_not_found, 1);
}

#[test]
fn several_engine_hashes_for_one_block_keep_it_until_all_go() {
    let mut index = index_with(&[batch(
        w(1),
        vec![store(0, None, &[(101, 1)]), store(1, None, &[(201, 1)])],
    )]);
    assert_eq!(index.num_blocks(), 1);
    index.apply(&batch(w(1), vec![remove(2, &[101])]));
    index.validate().expect("consistent");
    assert_eq!(index.find_matches(&[1]).device(w(1)), 1);
    index.apply(&batch(w(1), vec![remove(3, &[201])]));
    assert_eq!(index.find_matches(&[1]).device(w(1)), 0);
    assert_eq!(index.digest(), 0);
}

#[test]
fn an_engine_hash_stored_elsewhere_moves() {
    let mut index = index_with(&[batch(w(1), vec![store(0, None, &[(101, 1)])])]);
    index.apply(&batch(w(1), vec![store(1, None, &[(101, 2)])]));
    index.validate().expect("consistent");
    assert_eq!(index.find_matches(&[1]).device(w(1)), 0);
    assert_eq!(index.find_matches(&[2]).device(w(1)), 1);
    assert_eq!(index.num_nodes(), 1);
}

#[test]
fn digest_is_order_independent_and_returns_to_zero() {
    let a = batch(w(1), vec![store(0, None, &[(101, 1), (102, 2)])]);
    let b = batch(w(2), vec![store(0, None, &[(201, 1), (202, 3)])]);
    let one = index_with(&[a.clone(), b.clone()]);
    let two = index_with(&[b, a]);
    assert_eq!(one.digest(), two.digest());
    assert_ne!(one.digest(), 0);
    let mut one = one;
    one.apply(&batch(w(1), vec![clear(1)]));
    one.apply(&batch(w(2), vec![clear(1)]));
    assert_eq!(one.digest(), 0);
    assert_eq!(one.num_nodes(), 0);
}

#[test]
fn lora_blocks_never_match_base_blocks() {
    let tokens: Vec<u32> = (0..32).collect();
    let base = compute_block_hashes(&tokens, 16, seed_for(None, None));
    let lora = compute_block_hashes(&tokens, 16, seed_for(Some("my-lora"), None));
    let blocks: Vec<(u64, u64)> = lora
        .iter()
        .enumerate()
        .map(|(i, &h)| (i as u64 + 1, h))
        .collect();
    let index = index_with(&[batch(w(1), vec![store(0, None, &blocks)])]);
    assert_eq!(index.find_matches(&lora).device(w(1)), 2);
    assert!(index.find_matches(&base).scores.is_empty());
}

#[test]
fn dump_rebuilds_the_same_state_including_gaps() {
    let mut index = index_with(&[
        batch(
            w(1),
            vec![
                store_tier(
                    0,
                    Tier::Device,
                    None,
                    &[(101, 1), (102, 2), (103, 3), (104, 4)],
                ),
                store_tier(1, Tier::HostPinned, Some(102), &[(103, 3)]),
                store(2, None, &[(111, 1), (112, 5)]),
                // Alias of block 1.
                store(3, None, &[(121, 1)]),
            ],
        ),
        batch(WorkerKey::new(2, 3), vec![store(0, None, &[(201, 1)])]),
    ]);
    // Evict the middle: blocks 3 and 4 stay without their parents.
    index.apply(&batch(w(1), vec![remove(4, &[102, 101])]));
    index.apply(&KvEventBatch::worker_removed(9));
    index.validate().expect("consistent");

    let dump = index.dump();
    let rebuilt = RadixIndex::from_dump(&dump);
    rebuilt.validate().expect("consistent");
    assert_eq!(rebuilt.digest(), index.digest());
    assert_eq!(rebuilt.num_blocks(), index.num_blocks());
    assert_eq!(rebuilt.num_nodes(), index.num_nodes());
    assert_eq!(rebuilt.workers(), index.workers());
    assert_eq!(rebuilt.last_event_id(w(1)), Some(4));
    assert!(rebuilt.is_worker_removed(9));
    for query in [&[1u64, 2, 3, 4][..], &[1, 5], &[1]] {
        assert_eq!(rebuilt.find_matches(query), index.find_matches(query));
    }
    // Later events apply identically (the lookups were rebuilt too).
    let next = batch(
        w(1),
        vec![remove(5, &[104]), store(6, Some(103), &[(105, 9)])],
    );
    let mut rebuilt = rebuilt;
    index.apply(&next);
    rebuilt.apply(&next);
    assert_eq!(rebuilt.digest(), index.digest());
    assert_eq!(rebuilt.counters().removed.ok, 1);
}

#[test]
fn counters_list_every_label() {
    let index = index_with(&[batch(w(1), vec![store(0, Some(5), &[(101, 1)])])]);
    let labels: Vec<(&str, &str, u64)> = index
        .counters()
        .applied()
        .map(|(t, s, n)| (t.as_str(), s.as_str(), n))
        .collect();
    assert_eq!(labels.len(), 12);
    assert!(labels.contains(&("stored", "parent_block_not_found", 1)));
    assert_eq!(
        index.counters().of(EventType::Stored).get(EventStatus::Ok),
        0
    );
}

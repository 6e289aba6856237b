//! Property: for random event streams over many workers, the sharded service (any shard count,
//! each shard a concurrent index, answers merged as the router's client merges them) answers
//! exactly what one single-threaded index answers.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use kvmesh_indexer::client::merge_answers;
use kvmesh_indexer::convert::scores_to_proto;
use kvmesh_indexer::shard::{ShardLayout, ShardState};
use kvmesh_kv::{
    KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock, RadixIndex, Tier,
};
use kvmesh_proto::v1::FindMatchesResponse;
use proptest::prelude::*;

const PARTITIONS: u32 = 8;
const MODEL: &str = "m";

#[derive(Debug, Clone)]
enum Op {
    Store {
        worker: u64,
        parent_pick: Option<usize>,
        tokens: Vec<u64>,
    },
    Remove {
        worker: u64,
        pick: usize,
    },
    Clear {
        worker: u64,
    },
    RemoveWorker {
        worker: u64,
    },
    SkipId {
        worker: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let worker = 1u64..13;
    prop_oneof![
        6 => (worker.clone(), proptest::option::of(0usize..64), proptest::collection::vec(0u64..6, 1..5))
            .prop_map(|(worker, parent_pick, tokens)| Op::Store { worker, parent_pick, tokens }),
        2 => (worker.clone(), 0usize..64).prop_map(|(worker, pick)| Op::Remove { worker, pick }),
        1 => worker.clone().prop_map(|worker| Op::Clear { worker }),
        1 => worker.clone().prop_map(|worker| Op::SkipId { worker }),
        1 => worker.prop_map(|worker| Op::RemoveWorker { worker }),
    ]
}

/// Turns ops into batches with per-worker event ids and engine hashes.
fn batches(ops: &[Op]) -> Vec<KvEventBatch> {
    let mut next_id = std::collections::HashMap::<u64, u64>::new();
    let mut stored = std::collections::HashMap::<u64, Vec<u64>>::new();
    let mut counter = 0u64;
    let mut out = Vec::new();
    for op in ops {
        let (worker, kind) = match op {
            Op::RemoveWorker { worker } => {
                out.push(KvEventBatch::worker_removed(*worker));
                continue;
            }
            Op::SkipId { worker } => {
                *next_id.entry(*worker).or_default() += 2;
                continue;
            }
            Op::Store {
                worker,
                parent_pick,
                tokens,
            } => {
                let known = stored.entry(*worker).or_default();
                let parent = parent_pick.and_then(|p| known.get(p % known.len().max(1)).copied());
                let blocks: Vec<KvStoredBlock> = tokens
                    .iter()
                    .map(|t| {
                        counter += 1;
                        KvStoredBlock::new(worker * 1_000_000 + counter, t * 7919 + 13)
                    })
                    .collect();
                known.extend(blocks.iter().map(|b| b.block_hash));
                (
                    *worker,
                    KvEventKind::Stored(KvStored {
                        parent_hash: parent,
                        blocks,
                        start_position: None,
                    }),
                )
            }
            Op::Remove { worker, pick } => {
                let known = stored.entry(*worker).or_default();
                let Some(hash) = known.get(pick % known.len().max(1)).copied() else {
                    continue;
                };
                (
                    *worker,
                    KvEventKind::Removed(KvRemoved {
                        block_hashes: vec![hash],
                    }),
                )
            }
            Op::Clear { worker } => (*worker, KvEventKind::Cleared),
        };
        let id = next_id.entry(worker).or_default();
        out.push(KvEventBatch {
            worker_id: worker,
            dp_rank: 0,
            events: vec![KvEvent {
                event_id: *id,
                tier: Tier::Device,
                kind,
            }],
            published_at_ms: 0,
            worker_removed: false,
            worker_readmitted: false,
        });
        *id += 1;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn shards_merge_to_the_single_index(ops in proptest::collection::vec(op(), 1..120), shards in 1u32..5, queries in proptest::collection::vec(proptest::collection::vec(0u64..6, 1..6), 1..8)) {
        let batches = batches(&ops);
        let mut single = RadixIndex::new();
        for batch in &batches {
            single.apply(batch);
        }
        let states: Vec<ShardState> = (0..shards)
            .map(|k| ShardState::new(ShardLayout::striped(k, shards, PARTITIONS), 2))
            .collect();
        for batch in &batches {
            for state in &states {
                if state.layout.owns_worker(batch.worker_id) {
                    state.model_or_insert(MODEL).expect("room").apply(batch.clone()).expect("lane");
                }
            }
        }
        for state in &states {
            if let Some(index) = state.model(MODEL) {
                index.flush().expect("flush");
            }
        }
        for query in queries {
            let hashes: Vec<u64> = query.iter().map(|t| t * 7919 + 13).collect();
            let expected = single.find_matches(&hashes);
            let answers = states.iter().map(|state| {
                let scores = state.find_matches(MODEL, &hashes);
                FindMatchesResponse {
                    scores: scores_to_proto(&scores),
                    frequencies: scores.frequencies,
                    applied_seq: 0,
                    partitions: state.layout.partitions.clone(),
                    missing_partitions: vec![],
                }
            });
            let merged = merge_answers(answers, PARTITIONS);
            prop_assert!(merged.missing_partitions.is_empty());
            prop_assert_eq!(merged.scores, expected);
        }
        let digest = states.iter().filter_map(|s| s.model(MODEL)).fold(0u64, |d, i| d.wrapping_add(i.digest()));
        prop_assert_eq!(digest, single.digest());
    }
}

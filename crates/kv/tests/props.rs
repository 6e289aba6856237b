//! Property tests: random event streams over many workers give the same answers, digests and
//! counts from a naive model, the single-threaded index, the concurrent index (any lane count)
//! and indexes rebuilt from dumps.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

#[path = "common/model.rs"]
mod model;

use kvmesh_kv::{
    ApplyCursor, ConcurrentIndex, KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored,
    KvStoredBlock, RadixIndex, Tier, WorkerKey,
};
use model::Model;
use proptest::prelude::*;

/// What a generated step does.
#[derive(Debug, Clone)]
enum Op {
    Store {
        parent: Option<u64>,
        blocks: Vec<(u64, u64)>,
        tier: u8,
    },
    Remove {
        hashes: Vec<u64>,
        tier: u8,
    },
    Clear,
    RemoveWorker,
}

/// How the step's event id relates to the member's previous one.
#[derive(Debug, Clone, Copy)]
enum IdShift {
    Next,
    Duplicate,
    Gap,
}

#[derive(Debug, Clone)]
struct Step {
    worker: WorkerKey,
    ops: Vec<Op>,
    shift: IdShift,
}

fn tier_strategy() -> impl Strategy<Value = u8> {
    prop_oneof![6 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)]
}

fn op_strategy(engine_hashes: u64, tokens: u64) -> impl Strategy<Value = Op> {
    let hash = 0..engine_hashes;
    prop_oneof![
        10 => (
            prop::option::weighted(0.6, hash.clone()),
            prop::collection::vec((hash.clone(), 0..tokens), 1..6),
            tier_strategy(),
        )
            .prop_map(|(parent, blocks, tier)| Op::Store { parent, blocks, tier }),
        5 => (prop::collection::vec(hash, 1..4), tier_strategy())
            .prop_map(|(hashes, tier)| Op::Remove { hashes, tier }),
        1 => Just(Op::Clear),
        1 => Just(Op::RemoveWorker),
    ]
}

fn step_strategy(workers: u64, engine_hashes: u64, tokens: u64) -> impl Strategy<Value = Step> {
    (
        1..=workers,
        0u32..2,
        prop::collection::vec(op_strategy(engine_hashes, tokens), 1..4),
        prop_oneof![12 => Just(IdShift::Next), 1 => Just(IdShift::Duplicate), 1 => Just(IdShift::Gap)],
    )
        .prop_map(|(worker_id, dp_rank, ops, shift)| Step {
            worker: WorkerKey::new(worker_id, dp_rank),
            ops,
            shift,
        })
}

/// Turns steps into batches, numbering event ids per member.
fn to_batches(steps: &[Step]) -> Vec<KvEventBatch> {
    let mut next: std::collections::HashMap<WorkerKey, u64> = Default::default();
    let mut batches = Vec::new();
    for step in steps {
        if step.ops.iter().any(|op| matches!(op, Op::RemoveWorker)) {
            batches.push(KvEventBatch::worker_removed(step.worker.worker_id));
            continue;
        }
        let counter = next.entry(step.worker).or_insert(0);
        match step.shift {
            IdShift::Next => {}
            IdShift::Duplicate => *counter = counter.saturating_sub(1),
            IdShift::Gap => *counter += 3,
        }
        let mut events = Vec::new();
        for op in &step.ops {
            let event_id = *counter;
            *counter += 1;
            let (tier, kind) = match op {
                Op::Store {
                    parent,
                    blocks,
                    tier,
                } => (
                    *tier,
                    KvEventKind::Stored(KvStored {
                        parent_hash: *parent,
                        blocks: blocks
                            .iter()
                            .map(|&(engine, tokens)| KvStoredBlock::new(engine, tokens))
                            .collect(),
                        start_position: None,
                    }),
                ),
                Op::Remove { hashes, tier } => (
                    *tier,
                    KvEventKind::Removed(KvRemoved {
                        block_hashes: hashes.clone(),
                    }),
                ),
                Op::Clear => (0, KvEventKind::Cleared),
                Op::RemoveWorker => continue,
            };
            events.push(KvEvent {
                event_id,
                tier: Tier::from_u8(tier),
                kind,
            });
        }
        batches.push(KvEventBatch {
            worker_id: step.worker.worker_id,
            dp_rank: step.worker.dp_rank,
            events,
            published_at_ms: 0,
            worker_removed: false,
            worker_readmitted: false,
        });
    }
    batches
}

/// Queries: every stored path (and one block past it) plus a few random ones.
fn queries(model: &Model, random: &[Vec<u64>]) -> Vec<Vec<u64>> {
    let mut out: Vec<Vec<u64>> = model.paths.iter().cloned().collect();
    for path in model.paths.iter().take(50) {
        let mut longer = path.clone();
        longer.push(0);
        out.push(longer);
    }
    out.extend(random.iter().cloned());
    out
}

fn check_stream(
    steps: Vec<Step>,
    tail: Vec<Step>,
    random_queries: Vec<Vec<u64>>,
    lanes: usize,
    reload_lanes: usize,
) -> Result<(), TestCaseError> {
    let batches = to_batches(&steps);
    let mut model = Model::default();
    let mut index = RadixIndex::new();
    let mut sliced = RadixIndex::new();
    let concurrent = ConcurrentIndex::with_queue_capacity(lanes, 8);
    for batch in &batches {
        model.apply(batch);
        index.apply(batch);
        // The same batch in slices of `lanes` block operations, split inside events.
        if batch.worker_removed {
            sliced.apply(batch);
        } else {
            let mut cursor = ApplyCursor::new();
            while !sliced.apply_slice(batch.worker(), &batch.events, &mut cursor, lanes) {}
        }
        concurrent
            .apply(batch.clone())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    index.validate().map_err(TestCaseError::fail)?;
    prop_assert_eq!(sliced.digest(), index.digest());
    prop_assert_eq!(sliced.counters(), index.counters());
    prop_assert_eq!(sliced.num_blocks(), index.num_blocks());
    concurrent
        .flush()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;

    prop_assert_eq!(index.digest(), model.digest());
    prop_assert_eq!(index.num_blocks(), model.num_blocks());
    prop_assert_eq!(index.counters(), model.counters);
    prop_assert_eq!(index.workers(), model.workers());
    for worker in model.workers() {
        prop_assert_eq!(index.last_event_id(worker), model.last_event_id(worker));
        prop_assert_eq!(
            concurrent.last_event_id(worker),
            model.last_event_id(worker)
        );
    }
    prop_assert_eq!(concurrent.digest(), index.digest());
    prop_assert_eq!(concurrent.num_blocks(), index.num_blocks());
    prop_assert_eq!(concurrent.counters(), index.counters());
    prop_assert_eq!(concurrent.workers(), index.workers());
    prop_assert_eq!(concurrent.num_workers(), index.num_workers());
    concurrent
        .fold(Ok(()), |acc, lane| acc.and(lane.validate()))
        .map_err(TestCaseError::fail)?;

    let queries = queries(&model, &random_queries);
    for query in &queries {
        let expected = model.find_matches(query);
        prop_assert_eq!(&index.find_matches(query), &expected, "query {:?}", query);
        prop_assert_eq!(
            &concurrent.find_matches(query),
            &expected,
            "query {:?}",
            query
        );
    }

    // Dump → rebuild, single-threaded and into a concurrent index with another lane count.
    let dump = index.dump();
    let mut rebuilt = RadixIndex::from_dump(&dump);
    rebuilt.validate().map_err(TestCaseError::fail)?;
    prop_assert_eq!(rebuilt.digest(), index.digest());
    prop_assert_eq!(rebuilt.num_blocks(), index.num_blocks());
    prop_assert_eq!(rebuilt.num_nodes(), index.num_nodes());
    let reloaded = ConcurrentIndex::new(reload_lanes);
    let concurrent_dump = concurrent
        .dump()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    reloaded
        .load_dump(&concurrent_dump)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(reloaded.digest(), index.digest());
    prop_assert_eq!(reloaded.num_blocks(), index.num_blocks());
    for query in &queries {
        prop_assert_eq!(&rebuilt.find_matches(query), &index.find_matches(query));
        prop_assert_eq!(&reloaded.find_matches(query), &index.find_matches(query));
    }

    // The stream continues identically on the rebuilt indexes (cursors and lookups survived).
    let mut all = steps;
    all.extend(tail);
    let tail_batches = to_batches(&all).split_off(batches.len());
    for batch in &tail_batches {
        model.apply(batch);
        index.apply(batch);
        rebuilt.apply(batch);
        reloaded
            .apply(batch.clone())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    reloaded
        .flush()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(index.digest(), model.digest());
    prop_assert_eq!(rebuilt.digest(), index.digest());
    prop_assert_eq!(reloaded.digest(), index.digest());
    prop_assert_eq!(rebuilt.num_blocks(), index.num_blocks());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Few workers, tiny hash domains: lots of shared paths, aliases, moves and unknown parents.
    #[test]
    fn dense_streams_agree(
        steps in prop::collection::vec(step_strategy(4, 12, 3), 1..120),
        tail in prop::collection::vec(step_strategy(4, 12, 3), 0..30),
        random_queries in prop::collection::vec(prop::collection::vec(0u64..3, 1..7), 0..10),
        lanes in 1usize..5,
        reload_lanes in 1usize..4,
    ) {
        check_stream(steps, tail, random_queries, lanes, reload_lanes)?;
    }

    /// Many workers over a wider domain.
    #[test]
    fn many_worker_streams_agree(
        steps in prop::collection::vec(step_strategy(40, 40, 6), 1..300),
        tail in prop::collection::vec(step_strategy(40, 40, 6), 0..50),
        random_queries in prop::collection::vec(prop::collection::vec(0u64..6, 1..9), 0..10),
        lanes in 1usize..7,
        reload_lanes in 1usize..4,
    ) {
        check_stream(steps, tail, random_queries, lanes, reload_lanes)?;
    }
}

//! Criterion benchmarks of applying events to and querying the index.
//!
//! The state: `WORKERS` workers each holding `BLOCKS_PER_WORKER` blocks as 128-block chains that
//! start with a 16-block prefix every worker shares (a system prompt). Throughput is in block
//! operations.

// A benchmark that cannot set up has nothing to measure: aborting is the right response.
#![allow(clippy::expect_used)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvmesh_kv::replay::{self, ReplayConfig};
use kvmesh_kv::{
    ConcurrentIndex, KvEvent, KvEventBatch, KvEventKind, KvRemoved, KvStored, KvStoredBlock,
    RadixIndex, Tier, compute_seq_hashes,
};

const WORKERS: u64 = 64;
const BLOCKS_PER_WORKER: u64 = 16_384;
const CHAIN: u64 = 128;
const SHARED: u64 = 16;

fn tokens(worker: u64, chain: u64, i: u64) -> u64 {
    if i < SHARED {
        1_000 + i
    } else {
        (worker << 40) | (chain << 16) | i
    }
}

fn chain_tokens(worker: u64, chain: u64) -> Vec<u64> {
    (0..CHAIN).map(|i| tokens(worker, chain, i)).collect()
}

fn store_batch(worker: u64, event_id: u64, chain: u64, first: u64) -> KvEventBatch {
    let local = chain_tokens(worker, chain);
    let engine = compute_seq_hashes(&local);
    KvEventBatch {
        worker_id: worker,
        dp_rank: 0,
        events: vec![KvEvent {
            event_id,
            tier: Tier::Device,
            kind: KvEventKind::Stored(KvStored {
                parent_hash: first.checked_sub(1).map(|p| engine[p as usize]),
                blocks: (first as usize..CHAIN as usize)
                    .map(|i| KvStoredBlock::new(engine[i], local[i]))
                    .collect(),
                start_position: None,
            }),
        }],
        published_at_ms: 0,
        worker_removed: false,
        worker_readmitted: false,
    }
}

fn remove_batch(worker: u64, event_id: u64, chain: u64, first: u64) -> KvEventBatch {
    let engine = compute_seq_hashes(&chain_tokens(worker, chain));
    KvEventBatch {
        worker_id: worker,
        dp_rank: 0,
        events: vec![KvEvent {
            event_id,
            tier: Tier::Device,
            kind: KvEventKind::Removed(KvRemoved {
                block_hashes: engine[first as usize..].to_vec(),
            }),
        }],
        published_at_ms: 0,
        worker_removed: false,
        worker_readmitted: false,
    }
}

/// The populated state; returns the next event id of each worker.
fn populate(index: &mut RadixIndex) -> Vec<u64> {
    let chains = BLOCKS_PER_WORKER / (CHAIN - SHARED);
    for worker in 1..=WORKERS {
        for chain in 0..chains {
            index.apply(&store_batch(worker, chain, chain, 0));
        }
    }
    vec![chains; WORKERS as usize + 1]
}

fn bench_index(c: &mut Criterion) {
    let mut index = RadixIndex::new();
    let mut next_id = populate(&mut index);
    let entries = index.num_blocks();
    eprintln!(
        "index: {entries} entries, {} nodes, {:.1} bytes/entry",
        index.num_nodes(),
        index.memory_bytes() as f64 / entries as f64
    );

    let mut group = c.benchmark_group("find");
    group.throughput(Throughput::Elements(CHAIN));
    let queries: Vec<Vec<u64>> = (1..=WORKERS).map(|w| chain_tokens(w, 3)).collect();
    group.bench_function(BenchmarkId::new("radix_128_blocks", entries), |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(index.find_matches(&queries[i]))
        });
    });
    group.finish();

    let mut group = c.benchmark_group("apply");
    // One iteration stores 112 new blocks under the shared prefix and removes them again.
    group.throughput(Throughput::Elements(2 * (CHAIN - SHARED)));
    let fresh = BLOCKS_PER_WORKER;
    group.bench_function(BenchmarkId::new("radix_store_remove_112", entries), |b| {
        let mut worker = 0u64;
        b.iter(|| {
            worker = worker % WORKERS + 1;
            let id = &mut next_id[worker as usize];
            index.apply(&store_batch(worker, *id, fresh, SHARED));
            index.apply(&remove_batch(worker, *id + 1, fresh, SHARED));
            *id += 2;
        });
    });
    group.finish();

    let concurrent = ConcurrentIndex::new(2);
    for worker in 1..=WORKERS {
        for chain in 0..BLOCKS_PER_WORKER / (CHAIN - SHARED) {
            concurrent
                .apply(store_batch(worker, chain, chain, 0))
                .expect("lane alive");
        }
    }
    concurrent.flush().expect("lane alive");
    let mut group = c.benchmark_group("find");
    group.throughput(Throughput::Elements(CHAIN));
    group.bench_function(
        BenchmarkId::new("concurrent_2_lanes_128_blocks", entries),
        |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % queries.len();
                black_box(concurrent.find_matches(&queries[i]))
            });
        },
    );
    group.finish();
}

/// `find` on the state a Mooncake replay ends in, when `KVMESH_BENCH_TRACE` names the trace:
/// 640 workers × 16 384 blocks, expansion 8, 10 copies (about 10.5 M entries), 128-block queries.
fn bench_trace_state(c: &mut Criterion) {
    let Ok(trace) = std::env::var("KVMESH_BENCH_TRACE") else {
        return;
    };
    let requests = replay::load_trace(std::path::Path::new(&trace)).expect("trace readable");
    let config = ReplayConfig {
        workers: 640,
        lanes: 1,
        expansion: 8,
        copies: 10,
        static_queries: 4096,
        ..ReplayConfig::default()
    };
    let populated = replay::populate(requests, &config).expect("populates");
    let entries = populated.index.num_blocks();
    eprintln!(
        "trace state: {entries} entries, {:.1} bytes/entry",
        populated.index.memory_bytes() as f64 / entries as f64
    );
    let mut group = c.benchmark_group("find");
    group.throughput(Throughput::Elements(config.static_query_blocks as u64));
    group.bench_function(BenchmarkId::new("trace_state_128_blocks", entries), |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % populated.queries.len();
            black_box(populated.index.find_matches(&populated.queries[i]))
        });
    });
    group.finish();
}

criterion_group!(benches, bench_index, bench_trace_state);
criterion_main!(benches);

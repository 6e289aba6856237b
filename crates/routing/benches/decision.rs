//! Time of one kv routing decision: hashing the prompt, querying a populated in-process index,
//! scoring every candidate and selecting one (and recording it in the tracker), for 2k and 100k
//! token prompts among 8, 128 and 1024 workers.
//!
//! `cargo bench -p kvmesh-routing --bench decision -- --warm-up-time 1 --measurement-time 3`

// Benchmark set-up may stop on a broken fixture.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kvmesh_kv::{
    ConcurrentIndex, KvEvent, KvEventBatch, KvEventKind, KvStored, KvStoredBlock, Tier,
};
use kvmesh_routing::{
    Rng, RouteOutcome, RouteRequest, RouterConfig, RouterCore, RouterMode, TerminalPath, WorkerInfo,
};

/// vLLM's default block size (the mocker uses 64; 16 is the harder case).
const BLOCK: usize = 16;
/// Conversation families the workers' caches are drawn from.
const FAMILIES: usize = 16;

fn family_prompt(family: usize, len: usize) -> Vec<u32> {
    let mut rng = Rng::new(family as u64 + 1);
    (0..len)
        .map(|_| (rng.next_u64() % 150_000) as u32)
        .collect()
}

fn stored(worker_id: u64, tokens: &[u32]) -> KvEventBatch {
    let local = kvmesh_kv::compute_block_hashes(tokens, BLOCK, kvmesh_kv::seed_for(None, None));
    let seq = kvmesh_kv::compute_seq_hashes(&local);
    KvEventBatch {
        worker_id,
        dp_rank: 0,
        events: vec![KvEvent {
            event_id: 0,
            tier: Tier::Device,
            kind: KvEventKind::Stored(KvStored {
                parent_hash: None,
                blocks: seq
                    .iter()
                    .zip(&local)
                    .map(|(&s, &l)| KvStoredBlock::new(s, l))
                    .collect(),
                start_position: None,
            }),
        }],
        ..KvEventBatch::default()
    }
}

/// A router over `workers` workers whose caches hold random-length prefixes of the families,
/// with two active requests per worker in the tracker.
fn setup(workers: u64, prompt_len: usize) -> (RouterCore, Vec<Vec<u32>>) {
    let families: Vec<Vec<u32>> = (0..FAMILIES)
        .map(|f| family_prompt(f, prompt_len))
        .collect();
    let index = ConcurrentIndex::new(4);
    let mut rng = Rng::new(7);
    for worker in 1..=workers {
        let family = &families[rng.below(FAMILIES)];
        let len = BLOCK * (1 + rng.below(prompt_len / BLOCK));
        index
            .apply(stored(worker, &family[..len]))
            .expect("index lane");
    }
    index.flush().expect("index lane");
    let config = RouterConfig::with_mode(RouterMode::Kv);
    let mut core = RouterCore::new(config, "bench", BLOCK as u32, 1)
        .expect("config")
        .with_overlap_source(Arc::new(index));
    for worker in 1..=workers {
        core.upsert_worker(WorkerInfo::new(worker), Duration::ZERO);
    }
    for i in 0..2 * workers {
        let family = &families[rng.below(FAMILIES)];
        let len = (BLOCK * (1 + rng.below(prompt_len / BLOCK))).min(4096);
        let mut request = RouteRequest::new(format!("bg{i}"), &family[..len]);
        request.hints.backend_instance_id = Some(1 + i % workers);
        core.route(&request, Duration::ZERO)
            .expect("background request");
    }
    (core, families)
}

fn decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("kv_decision");
    group.sample_size(20);
    for prompt_len in [2_000usize, 100_000] {
        for workers in [8u64, 128, 1024] {
            let (mut core, families) = setup(workers, prompt_len);
            // A new turn of a known conversation: the family prompt plus a fresh tail.
            let prompts: Vec<Vec<u32>> = families
                .iter()
                .map(|f| {
                    let mut p = f[..prompt_len - 200].to_vec();
                    p.extend(family_prompt(99, 200));
                    p
                })
                .collect();
            let id = BenchmarkId::new(format!("{}k_tokens", prompt_len / 1000), workers);
            let mut n = 0u64;
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        n += 1;
                        let tokens = &prompts[(n as usize) % prompts.len()];
                        let request = RouteRequest::new("r", tokens);
                        let start = Instant::now();
                        let outcome = core.route(black_box(&request), Duration::ZERO);
                        spent += start.elapsed();
                        if let Ok(RouteOutcome::Routed(d)) = outcome {
                            black_box(d.worker_id);
                        }
                        core.free("r", TerminalPath::Completed, Duration::ZERO);
                    }
                    spent
                });
            });
        }
    }
    group.finish();
}

fn components(c: &mut Criterion) {
    let mut group = c.benchmark_group("kv_decision_parts");
    group.sample_size(20);
    for prompt_len in [2_000usize, 100_000] {
        let tokens = family_prompt(3, prompt_len);
        group.bench_function(BenchmarkId::new("hash", prompt_len), |b| {
            b.iter(|| {
                let local = kvmesh_kv::compute_block_hashes(black_box(&tokens), BLOCK, 1337);
                black_box(kvmesh_kv::compute_seq_hashes(&local))
            });
        });
    }
    for (prompt_len, workers) in [(2_000usize, 128u64), (2_000, 1024), (100_000, 128)] {
        let (core, families) = setup(workers, prompt_len);
        let source = core.overlap_source().cloned().expect("index attached");
        let local = kvmesh_kv::compute_block_hashes(&families[0], BLOCK, 1337);
        let id = BenchmarkId::new(format!("find_matches_{}k", prompt_len / 1000), workers);
        group.bench_function(id, |b| {
            b.iter(|| black_box(source.find_matches("bench", black_box(&local))));
        });
    }
    group.finish();
}

criterion_group!(benches, decision, components);
criterion_main!(benches);

//! The worker's block-hash cache: what it hands the engine for requests with cut points.

use std::path::Path;

use kvmesh_core::prefix::PrefixCut;
use kvmesh_kv::{compute_block_hashes, compute_seq_hashes};

use super::*;

fn worker_with_cache(block_size: usize) -> MockWorker {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    MockWorker::new(Vec::new(), Arc::new(tokenizer), None, 0)
        .with_block_hash_cache(block_size, BLOCK_HASH_CACHE_BYTES)
}

fn request(tokens: Vec<u32>, cuts: &[PrefixCut], salt: &str) -> GenerateRequest {
    GenerateRequest {
        token_ids: tokens,
        cache_salt: salt.to_owned(),
        prefix_cuts: kvmesh_runtime::prefix_cuts::cuts_to_proto(cuts),
        ..Default::default()
    }
}

fn cut(key: u128, tokens: u32) -> PrefixCut {
    PrefixCut { key, tokens }
}

#[test]
fn a_later_turn_reuses_the_earlier_turns_hashes_and_gets_the_whole_prompts() {
    let worker = worker_with_cache(16);
    let first: Vec<u32> = (0..1000).collect();
    let mut second = first[..990].to_vec();
    second.extend(5000..6000);
    for (tokens, cuts) in [
        (&first, vec![cut(1, 100), cut(2, 990)]),
        (&second, vec![cut(1, 100), cut(2, 990), cut(3, 1990)]),
    ] {
        let hashes = worker
            .prompt_hashes(&request(tokens.clone(), &cuts, "tenant"))
            .expect("a request with cuts is hashed by the worker");
        let seed = seed_for(None, Some("tenant"));
        let local = compute_block_hashes(tokens, 16, seed);
        assert_eq!((hashes.block_size, hashes.seed), (16, seed));
        assert_eq!(hashes.seq, compute_seq_hashes(&local));
        assert_eq!(hashes.local, local);
    }
    let stats = worker.block_hash_stats().unwrap();
    assert_eq!((stats.hits, stats.misses), (1, 1));
    assert_eq!(stats.reused, 990 / 16);
}

#[test]
fn requests_without_cuts_or_workers_without_the_cache_leave_hashing_to_the_engine() {
    let worker = worker_with_cache(16);
    assert!(
        worker
            .prompt_hashes(&request((0..100).collect(), &[], ""))
            .is_none()
    );
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let plain = MockWorker::new(Vec::new(), Arc::new(tokenizer), None, 0);
    let with_cuts = request((0..100).collect(), &[cut(1, 64)], "");
    assert!(plain.prompt_hashes(&with_cuts).is_none());
    assert!(plain.block_hash_stats().is_none());
}

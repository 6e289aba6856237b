//! Prefix caching, eviction and the KV events they produce.

use kvmesh_kv::hashing::{BASE_SEED, compute_block_hashes, compute_seq_hashes, seed_for};

use super::tests::{all_events, first_output, prompt, request, run_to_idle, small_config};
use super::*;
use crate::engine::{KvCacheEvent, PromptHashes, StoredBlock, timing};

#[test]
fn prefix_reuse_reports_cached_tokens_without_a_second_store() {
    let mut engine = DpEngine::new(small_config(16, 4), 0);
    let tokens = prompt(1, 10);
    engine.add_request(request(1, tokens.clone(), 1));
    let first = run_to_idle(&mut engine);
    let local = compute_block_hashes(&tokens, 4, BASE_SEED);
    let seq = compute_seq_hashes(&local);
    assert_eq!(
        all_events(&first),
        vec![KvCacheEvent::Stored {
            parent_hash: None,
            blocks: vec![
                StoredBlock {
                    block_hash: seq[0],
                    tokens_hash: local[0],
                },
                StoredBlock {
                    block_hash: seq[1],
                    tokens_hash: local[1],
                },
            ],
        }]
    );
    assert_eq!(first_output(&first, 1).cached_tokens, 0);

    engine.add_request(request(2, tokens, 1));
    let second = run_to_idle(&mut engine);
    let output = first_output(&second, 2);
    assert!(output.is_first);
    assert_eq!(output.cached_tokens, 8);
    assert_eq!(second[0].num_prefill_tokens, 2);
    assert!(all_events(&second).is_empty(), "reuse must emit nothing");
    assert_eq!(engine.load().kv_used_blocks, 0);
}

#[test]
fn reuse_of_an_active_prefix_shares_blocks() {
    let mut engine = DpEngine::new(small_config(16, 4), 0);
    engine.add_request(request(1, prompt(1, 10), 5));
    engine.step();
    let used_alone = engine.load().kv_used_blocks;
    engine.add_request(request(2, prompt(1, 10), 5));
    let step = engine.step();
    assert_eq!(
        first_output(std::slice::from_ref(&step), 2).cached_tokens,
        8
    );
    assert!(step.kv_events.is_empty());
    // Only the second request's private partial block is new.
    assert_eq!(engine.load().kv_used_blocks, used_alone + 1);
    run_to_idle(&mut engine);
}

#[test]
fn all_cached_prompt_recomputes_its_last_block() {
    let mut engine = DpEngine::new(small_config(16, 4), 0);
    engine.add_request(request(1, prompt(1, 8), 1));
    run_to_idle(&mut engine);
    engine.add_request(request(2, prompt(1, 8), 1));
    let steps = run_to_idle(&mut engine);
    assert_eq!(first_output(&steps, 2).cached_tokens, 4);
    assert_eq!(steps[0].num_prefill_tokens, 4);
    assert_eq!(steps[0].prefill_ms, timing::prefill_ms(4));
    assert!(all_events(&steps).is_empty());
}

#[test]
fn lru_evicts_leaves_first_and_removes_before_storing() {
    let mut engine = DpEngine::new(small_config(4, 4), 0);
    let base = prompt(1, 12);
    engine.add_request(request(1, base.clone(), 1));
    run_to_idle(&mut engine);
    let seq = compute_seq_hashes(&compute_block_hashes(&base, 4, BASE_SEED));

    let other = prompt(500, 8);
    engine.add_request(request(2, other.clone(), 1));
    let steps = run_to_idle(&mut engine);
    let other_seq = compute_seq_hashes(&compute_block_hashes(&other, 4, BASE_SEED));
    let events = all_events(&steps);
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0],
        KvCacheEvent::Removed {
            block_hashes: vec![seq[2]]
        }
    );
    let KvCacheEvent::Stored {
        parent_hash: None,
        blocks,
    } = &events[1]
    else {
        panic!("expected a root store, got {:?}", events[1]);
    };
    let stored: Vec<u64> = blocks.iter().map(|block| block.block_hash).collect();
    assert_eq!(stored, other_seq);

    // The shared prefix survived: its two parents are still cached.
    let mut extended = base[..8].to_vec();
    extended.push(999);
    engine.add_request(request(3, extended, 1));
    let steps = run_to_idle(&mut engine);
    assert_eq!(first_output(&steps, 3).cached_tokens, 8);
    // Room for the private partial block came from the other chain's leaf.
    assert_eq!(
        all_events(&steps),
        vec![KvCacheEvent::Removed {
            block_hashes: vec![other_seq[1]]
        }]
    );
}

#[test]
fn prefix_caching_off_shares_nothing_and_emits_nothing() {
    let config = EngineConfig {
        enable_prefix_caching: false,
        ..small_config(16, 4)
    };
    let mut engine = DpEngine::new(config, 0);
    engine.add_request(request(1, prompt(1, 8), 5));
    engine.add_request(request(2, prompt(1, 8), 5));
    let step = engine.step();
    assert_eq!(engine.load().kv_used_blocks, 4);
    assert!(step.outputs.iter().all(|output| output.cached_tokens == 0));
    let mut steps = vec![step];
    steps.extend(run_to_idle(&mut engine));
    assert!(all_events(&steps).is_empty());
    engine.add_request(request(3, prompt(1, 8), 1));
    let steps = run_to_idle(&mut engine);
    assert_eq!(first_output(&steps, 3).cached_tokens, 0);
    assert_eq!(engine.clear_cache(), 0);
    assert!(!engine.has_work());
}

#[test]
fn clear_cache_emits_cleared_and_reannounces_active_blocks() {
    let mut engine = DpEngine::new(small_config(64, 4), 0);
    engine.add_request(request(1, prompt(0, 8), 1));
    run_to_idle(&mut engine);
    engine.add_request(request(2, prompt(100, 5), 50));
    engine.step();
    assert_eq!(engine.clear_cache(), 2);
    assert!(engine.has_work());
    let step = engine.step();
    let active = compute_seq_hashes(&compute_block_hashes(&prompt(100, 4), 4, BASE_SEED));
    assert_eq!(step.kv_events[0], KvCacheEvent::Cleared);
    let KvCacheEvent::Stored { blocks, .. } = &step.kv_events[1] else {
        panic!("expected the active block to be re-announced");
    };
    assert_eq!(blocks[0].block_hash, active[0]);
    engine.cancel(2);
    engine.add_request(request(3, prompt(0, 8), 1));
    let steps = run_to_idle(&mut engine);
    assert_eq!(first_output(&steps, 3).cached_tokens, 0);
}

#[test]
fn blocks_filled_by_decode_are_stored_one_by_one_under_their_parent() {
    let mut engine = DpEngine::new(small_config(16, 4), 0);
    engine.add_request(request(1, prompt(1, 4), 9));
    let steps = run_to_idle(&mut engine);
    let outputs: Vec<u32> = steps
        .iter()
        .flat_map(|step| &step.outputs)
        .map(|output| output.token_id)
        .collect();
    let mut tokens = prompt(1, 4);
    tokens.extend(&outputs);
    let local = compute_block_hashes(&tokens, 4, BASE_SEED);
    let seq = compute_seq_hashes(&local);
    // 13 tokens, the last never computed: blocks 0..3 are full and stored, each on its own.
    let expected: Vec<KvCacheEvent> = (0..3)
        .map(|i: usize| KvCacheEvent::Stored {
            parent_hash: i.checked_sub(1).map(|p| seq[p]),
            blocks: vec![StoredBlock {
                block_hash: seq[i],
                tokens_hash: local[i],
            }],
        })
        .collect();
    assert_eq!(all_events(&steps), expected);
    // Block 1 fills when the pass computing the 8th token runs: prefill pass + 4 decode passes.
    assert_eq!(steps[4].kv_events, vec![expected[1].clone()]);
}

#[test]
fn a_cache_salt_seeds_the_hashes_and_isolates_the_cache() {
    let mut engine = DpEngine::new(small_config(16, 4), 0);
    let tokens = prompt(1, 10);
    let salted = |key: u64, salt: Option<&str>| EngineRequest {
        cache_salt: salt.map(str::to_owned),
        ..request(key, tokens.clone(), 1)
    };
    engine.add_request(salted(1, Some("tenant-a")));
    let first = run_to_idle(&mut engine);
    let local = compute_block_hashes(&tokens, 4, seed_for(None, Some("tenant-a")));
    let KvCacheEvent::Stored { blocks, .. } = &all_events(&first)[0] else {
        panic!("expected the prompt's blocks to be stored");
    };
    let stored: Vec<u64> = blocks.iter().map(|block| block.tokens_hash).collect();
    assert_eq!(stored, local);
    assert_ne!(local, compute_block_hashes(&tokens, 4, BASE_SEED));

    for (key, salt, cached) in [
        (2, Some("tenant-a"), 8),
        (3, Some("tenant-b"), 0),
        (4, None, 0),
    ] {
        engine.add_request(salted(key, salt));
        let steps = run_to_idle(&mut engine);
        assert_eq!(first_output(&steps, key).cached_tokens, cached, "{salt:?}");
    }
}

#[test]
fn hashes_a_caller_gives_are_taken_only_when_they_are_what_hashing_here_gives() {
    let tokens = prompt(1, 10);
    let given = |block_size: usize, seed: u64, num_blocks: usize| PromptHashes {
        block_size,
        seed,
        local: (100..100 + num_blocks as u64).collect(),
        seq: (200..200 + num_blocks as u64).collect(),
    };
    let stored_local = |hashes: Option<PromptHashes>| {
        let mut engine = DpEngine::new(small_config(16, 4), 0);
        engine.add_request(EngineRequest {
            prompt_hashes: hashes,
            ..request(1, tokens.clone(), 1)
        });
        let steps = run_to_idle(&mut engine);
        let KvCacheEvent::Stored { blocks, .. } = &all_events(&steps)[0] else {
            panic!("expected the prompt's blocks to be stored");
        };
        blocks
            .iter()
            .map(|block| (block.tokens_hash, block.block_hash))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        stored_local(Some(given(4, BASE_SEED, 2))),
        vec![(100, 200), (101, 201)]
    );
    let local = compute_block_hashes(&tokens, 4, BASE_SEED);
    let seq = compute_seq_hashes(&local);
    let hashed_here: Vec<(u64, u64)> = local.into_iter().zip(seq).collect();
    for wrong in [
        given(8, BASE_SEED, 2),
        given(4, seed_for(None, Some("salt")), 2),
        given(4, BASE_SEED, 1),
    ] {
        assert_eq!(stored_local(Some(wrong.clone())), hashed_here, "{wrong:?}");
    }
    assert_eq!(stored_local(None), hashed_here);
}

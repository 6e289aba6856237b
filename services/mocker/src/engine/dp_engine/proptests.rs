//! Random request streams with random cancels, cache clears and configurations: the pool stays
//! consistent, KV events replayed into a model index always equal the pool's content, every
//! request finishes exactly once (or is cancelled), and nothing leaks.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::tests::{request, small_config};
use super::*;
use crate::engine::KvCacheEvent;

#[derive(Debug, Clone)]
enum Op {
    Add {
        family: u32,
        len: usize,
        tail: u32,
        max_tokens: u32,
        has_lora: bool,
    },
    Cancel(usize),
    Step(usize),
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 1usize..40, 0u32..3, 1u32..20, any::<bool>()).prop_map(
            |(family, len, tail, max_tokens, has_lora)| Op::Add {
                family,
                len,
                tail,
                max_tokens,
                has_lora,
            }
        ),
        1 => (0usize..64).prop_map(Op::Cancel),
        3 => (1usize..6).prop_map(Op::Step),
        1 => Just(Op::Clear),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    config: EngineConfig,
    ops: Vec<Op>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        4usize..24,
        1usize..6,
        1usize..5,
        1usize..48,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(op(), 1..60),
    )
        .prop_map(
            |(num_blocks, block_size, max_seqs, budget, caching, chunked, fifo, ops)| Setup {
                config: EngineConfig {
                    max_num_seqs: max_seqs,
                    max_num_batched_tokens: budget,
                    enable_prefix_caching: caching,
                    enable_chunked_prefill: chunked,
                    preemption_mode: if fifo {
                        PreemptionMode::Fifo
                    } else {
                        PreemptionMode::Lifo
                    },
                    ..small_config(num_blocks, block_size)
                },
                ops,
            },
        )
}

/// What the indexers would hold after applying the engine's events, checked as they arrive.
#[derive(Default)]
struct ModelIndex {
    blocks: BTreeSet<u64>,
}

impl ModelIndex {
    fn apply(&mut self, events: &[KvCacheEvent]) {
        for event in events {
            match event {
                KvCacheEvent::Cleared => self.blocks.clear(),
                KvCacheEvent::Removed { block_hashes } => {
                    for hash in block_hashes {
                        assert!(self.blocks.remove(hash), "removed an unknown block");
                    }
                }
                KvCacheEvent::Stored {
                    parent_hash,
                    blocks,
                } => {
                    if let Some(parent) = parent_hash {
                        assert!(
                            self.blocks.contains(parent),
                            "stored under an unknown parent"
                        );
                    }
                    for block in blocks {
                        assert!(self.blocks.insert(block.block_hash), "stored a block twice");
                    }
                }
            }
        }
    }
}

struct Harness {
    engine: DpEngine,
    index: ModelIndex,
    num_finishes: BTreeMap<u64, usize>,
    cancelled: BTreeSet<u64>,
    keys: Vec<u64>,
    is_caching: bool,
}

impl Harness {
    fn step(&mut self) {
        let output = self.engine.step();
        let pool = self.engine.pool();
        pool.check_invariants();
        let load = self.engine.load();
        assert!(load.kv_used_blocks <= load.kv_total_blocks);
        assert!(load.num_running <= self.engine.config().max_num_seqs);
        if self.is_caching {
            self.index.apply(&output.kv_events);
            let present: BTreeSet<u64> = pool.present_hashes().into_iter().collect();
            assert_eq!(self.index.blocks, present, "index diverged from the pool");
        } else {
            assert!(output.kv_events.is_empty());
        }
        for token in &output.outputs {
            assert!(!self.cancelled.contains(&token.key), "output after cancel");
            assert_eq!(
                self.num_finishes.get(&token.key).copied().unwrap_or(0),
                0,
                "output after finish"
            );
            if token.finish.is_some() {
                *self.num_finishes.entry(token.key).or_default() += 1;
            }
        }
    }
}

fn run(setup: Setup) {
    let is_caching = setup.config.enable_prefix_caching;
    let mut harness = Harness {
        engine: DpEngine::new(setup.config, 0),
        index: ModelIndex::default(),
        num_finishes: BTreeMap::new(),
        cancelled: BTreeSet::new(),
        keys: Vec::new(),
        is_caching,
    };
    for op in setup.ops {
        match op {
            Op::Add {
                family,
                len,
                tail,
                max_tokens,
                has_lora,
            } => {
                let key = harness.keys.len() as u64;
                // Families share prefixes; the tail makes some prompts diverge at the end.
                let mut prompt: Vec<u32> = (0..len as u32).map(|i| family * 100 + i).collect();
                if let Some(last) = prompt.last_mut() {
                    *last += tail * 1000;
                }
                let mut request = request(key, prompt, max_tokens);
                request.lora_name = has_lora.then(|| "adapter".to_owned());
                harness.engine.add_request(request);
                harness.keys.push(key);
            }
            Op::Cancel(pick) => {
                if let Some(&key) = harness.keys.get(pick % harness.keys.len().max(1)) {
                    let was_live = harness.engine.cancel(key);
                    if was_live {
                        assert!(
                            !harness.num_finishes.contains_key(&key),
                            "finished yet live"
                        );
                        assert!(harness.cancelled.insert(key), "cancelled yet live");
                    }
                }
            }
            Op::Step(num_steps) => {
                for _ in 0..num_steps {
                    harness.step();
                }
            }
            Op::Clear => {
                harness.engine.clear_cache();
            }
        }
    }
    let mut num_steps = 0;
    while harness.engine.has_work() {
        harness.step();
        num_steps += 1;
        assert!(num_steps < 50_000, "engine never went idle");
    }
    assert_eq!(harness.engine.load().kv_used_blocks, 0, "blocks leaked");
    for key in &harness.keys {
        let num_finishes = harness.num_finishes.get(key).copied().unwrap_or(0);
        if harness.cancelled.contains(key) {
            assert_eq!(num_finishes, 0);
        } else {
            assert_eq!(
                num_finishes, 1,
                "request {key} finished {num_finishes} times"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_streams_finish_once_and_leave_nothing_behind(setup in setup()) {
        run(setup);
    }
}

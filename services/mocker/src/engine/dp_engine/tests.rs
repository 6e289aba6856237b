//! Scheduling: chunking, seats, preemption, generation rules, cancellation and validation.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::engine::{EngineSampling, KvCacheEvent, ReasoningConfig, timing};

pub(super) fn small_config(num_gpu_blocks: usize, block_size: usize) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks,
        block_size,
        vocab_size: 1000,
        ..EngineConfig::default()
    }
}

pub(super) fn request(key: u64, prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        key,
        request_id: format!("req-{key}"),
        prompt,
        max_tokens: Some(max_tokens),
        ..EngineRequest::default()
    }
}

pub(super) fn run_to_idle(engine: &mut DpEngine) -> Vec<StepOutput> {
    let mut steps = Vec::new();
    while engine.has_work() {
        steps.push(engine.step());
        engine.pool().check_invariants();
        assert!(steps.len() < 100_000, "engine never went idle");
    }
    steps
}

pub(super) fn tokens_of(steps: &[StepOutput], key: u64) -> Vec<u32> {
    steps
        .iter()
        .flat_map(|step| &step.outputs)
        .filter(|output| output.key == key && !matches!(output.finish, Some(FinishKind::Error(_))))
        .map(|output| output.token_id)
        .collect()
}

pub(super) fn finishes(steps: &[StepOutput]) -> BTreeMap<u64, FinishKind> {
    let mut finishes = BTreeMap::new();
    for output in steps.iter().flat_map(|step| &step.outputs) {
        if let Some(finish) = &output.finish {
            assert!(
                finishes.insert(output.key, finish.clone()).is_none(),
                "finished twice"
            );
        }
    }
    finishes
}

pub(super) fn first_output(steps: &[StepOutput], key: u64) -> TokenOutput {
    steps
        .iter()
        .flat_map(|step| &step.outputs)
        .find(|output| output.key == key)
        .cloned()
        .expect("request produced no output")
}

pub(super) fn all_events(steps: &[StepOutput]) -> Vec<KvCacheEvent> {
    steps
        .iter()
        .flat_map(|step| step.kv_events.clone())
        .collect()
}

pub(super) fn prompt(start: u32, len: usize) -> Vec<u32> {
    (start..start + len as u32).collect()
}

#[test]
fn chunked_prefill_spreads_a_long_prompt_and_chains_its_stores() {
    let mut engine = DpEngine::new(EngineConfig::default(), 0);
    engine.add_request(request(1, prompt(0, 20_000), 3));
    let steps = run_to_idle(&mut engine);
    let prefill: Vec<usize> = steps.iter().map(|step| step.num_prefill_tokens).collect();
    assert_eq!(prefill, vec![8192, 8192, 3616, 0, 0]);
    let decode: Vec<usize> = steps.iter().map(|step| step.num_decode_seqs).collect();
    assert_eq!(decode, vec![0, 0, 0, 1, 1]);
    assert!(steps[0].outputs.is_empty() && steps[1].outputs.is_empty());
    assert!(steps[2].outputs[0].is_first);
    assert_eq!(steps[0].prefill_ms, timing::prefill_ms(8192));
    assert_eq!(steps[0].decode_ms, 0.0);
    assert_eq!(steps[3].prefill_ms, 0.0);
    assert_eq!(steps[4].outputs[0].finish, Some(FinishKind::Length));

    // 128 + 128 + 56 full blocks, each pass's run chained to the previous pass's last block.
    let mut previous_last = None;
    for (step, num_blocks) in steps.iter().zip([128, 128, 56]) {
        let [
            KvCacheEvent::Stored {
                parent_hash,
                blocks,
            },
        ] = step.kv_events.as_slice()
        else {
            panic!("expected one store, got {:?}", step.kv_events);
        };
        assert_eq!(blocks.len(), num_blocks);
        assert_eq!(*parent_hash, previous_last);
        previous_last = blocks.last().map(|block| block.block_hash);
    }
}

#[test]
fn without_chunking_a_prompt_must_fit_whole() {
    let config = EngineConfig {
        enable_chunked_prefill: false,
        max_num_batched_tokens: 100,
        ..small_config(64, 4)
    };
    let mut engine = DpEngine::new(config, 0);
    engine.add_request(request(1, prompt(0, 150), 2));
    engine.add_request(request(2, prompt(200, 60), 2));
    engine.add_request(request(3, prompt(300, 60), 2));
    let step = engine.step();
    assert!(matches!(
        first_output(std::slice::from_ref(&step), 1).finish,
        Some(FinishKind::Error(_))
    ));
    // Request 2 fits; request 3 would exceed the remaining budget and waits whole.
    assert_eq!(step.num_prefill_tokens, 60);
    assert_eq!(engine.load().num_waiting, 1);
    let mut steps = vec![step];
    steps.extend(run_to_idle(&mut engine));
    let finishes = finishes(&steps);
    assert_eq!(finishes.get(&2), Some(&FinishKind::Length));
    assert_eq!(finishes.get(&3), Some(&FinishKind::Length));
}

#[test]
fn max_num_seqs_caps_running() {
    let config = EngineConfig {
        max_num_seqs: 2,
        ..small_config(64, 4)
    };
    let mut engine = DpEngine::new(config, 0);
    for key in 0..5 {
        engine.add_request(request(key, prompt(key as u32 * 100, 5), 3));
    }
    engine.step();
    let load = engine.load();
    assert_eq!((load.num_running, load.num_waiting), (2, 3));
    assert_eq!(load.waiting_prefill_tokens, 15);
    while engine.has_work() {
        engine.step();
        assert!(engine.load().num_running <= 2);
    }
}

/// Two sequences grow until the 4-block pool is full; returns the keys that produced a token in
/// the pass that preempted, and all passes.
fn preemption_run(mode: PreemptionMode) -> (Vec<u64>, Vec<StepOutput>) {
    let config = EngineConfig {
        preemption_mode: mode,
        ..small_config(4, 4)
    };
    let mut engine = DpEngine::new(config, 0);
    engine.add_request(request(1, prompt(0, 3), 10));
    engine.add_request(request(2, prompt(100, 3), 10));
    let steps = run_to_idle(&mut engine);
    let preempting = steps
        .iter()
        .find(|step| step.num_preemptions > 0)
        .expect("the pool never ran out");
    assert_eq!(preempting.num_preemptions, 1);
    let keys = preempting.outputs.iter().map(|output| output.key).collect();
    assert_eq!(engine.load().kv_used_blocks, 0);
    (keys, steps)
}

#[test]
fn preemption_lifo_and_fifo_pick_the_right_victim_and_both_finish() {
    let mut roomy = DpEngine::new(small_config(64, 4), 0);
    roomy.add_request(request(1, prompt(0, 3), 10));
    roomy.add_request(request(2, prompt(100, 3), 10));
    let reference = run_to_idle(&mut roomy);

    // LIFO preempts the newest (2), so only 1 advances in that pass; FIFO the oldest (1).
    let (lifo_keys, lifo) = preemption_run(PreemptionMode::Lifo);
    assert_eq!(lifo_keys, vec![1]);
    let (fifo_keys, fifo) = preemption_run(PreemptionMode::Fifo);
    assert_eq!(fifo_keys, vec![2]);
    for steps in [&lifo, &fifo] {
        let finishes = finishes(steps);
        assert_eq!(finishes.get(&1), Some(&FinishKind::Length));
        assert_eq!(finishes.get(&2), Some(&FinishKind::Length));
        for key in [1, 2] {
            // Recomputation changes neither the tokens nor how many there are.
            assert_eq!(tokens_of(steps, key), tokens_of(&reference, key));
            assert_eq!(tokens_of(steps, key).len(), 10);
        }
    }
}

#[test]
fn tokens_are_deterministic_per_request_id_and_seed() {
    let run = |seed: u64, request_id: &str, start: u32| {
        let mut engine = DpEngine::new(
            EngineConfig {
                seed,
                ..small_config(64, 4)
            },
            0,
        );
        engine.add_request(EngineRequest {
            request_id: request_id.to_owned(),
            ..request(7, prompt(start, 9), 20)
        });
        tokens_of(&run_to_idle(&mut engine), 7)
    };
    assert_eq!(run(0, "a", 0), run(0, "a", 0));
    // The prompt does not matter, only the seed and the id.
    assert_eq!(run(0, "a", 0), run(0, "a", 50));
    assert_ne!(run(0, "a", 0), run(0, "b", 0));
    assert_ne!(run(0, "a", 0), run(1, "a", 0));
}

#[test]
fn greedy_and_seeded_tokens_follow_the_prompt_not_the_request_id() {
    let run = |request_id: &str, start: u32, sampling: EngineSampling| {
        let mut engine = DpEngine::new(small_config(64, 4), 0);
        engine.add_request(EngineRequest {
            request_id: request_id.to_owned(),
            sampling,
            ..request(7, prompt(start, 9), 20)
        });
        tokens_of(&run_to_idle(&mut engine), 7)
    };
    let greedy = EngineSampling {
        greedy: true,
        ..EngineSampling::default()
    };
    let seeded = |seed| EngineSampling {
        seed: Some(seed),
        ..EngineSampling::default()
    };
    assert_eq!(run("a", 0, greedy), run("b", 0, greedy));
    assert_ne!(run("a", 0, greedy), run("a", 50, greedy));
    assert_eq!(run("a", 0, seeded(3)), run("b", 0, seeded(3)));
    assert_ne!(run("a", 0, seeded(3)), run("a", 0, seeded(4)));
    // Asking for log probabilities never changes the tokens.
    let with_logprobs = EngineSampling {
        logprobs: Some(5),
        ..greedy
    };
    assert_eq!(run("a", 0, greedy), run("c", 0, with_logprobs));
}

#[test]
fn logprobs_come_with_every_token_when_asked_for() {
    let mut engine = DpEngine::new(small_config(64, 4), 0);
    engine.add_request(EngineRequest {
        sampling: EngineSampling {
            greedy: true,
            logprobs: Some(3),
            ..EngineSampling::default()
        },
        ..request(1, prompt(0, 9), 12)
    });
    engine.add_request(request(2, prompt(100, 9), 12));
    let steps = run_to_idle(&mut engine);
    let outputs: Vec<&TokenOutput> = steps.iter().flat_map(|step| &step.outputs).collect();
    for output in &outputs {
        match output.key {
            1 => {
                let logprobs = output.logprobs.as_ref().expect("asked for");
                assert_eq!(logprobs.top.len(), 3);
                assert_eq!(logprobs.top[0], (output.token_id, logprobs.logprob));
            }
            _ => assert!(output.logprobs.is_none()),
        }
    }
    assert_eq!(outputs.iter().filter(|o| o.key == 1).count(), 12);
}

#[test]
fn tokens_never_special_and_stop_rules_hold() {
    let special: Vec<u32> = (0..40).filter(|id| id % 8 != 3).collect();
    let drawable: Vec<u32> = (0..50).filter(|id| !special.contains(id)).collect();
    let config = EngineConfig {
        vocab_size: 50,
        special_token_ids: special,
        ..small_config(256, 16)
    };
    let mut engine = DpEngine::new(config.clone(), 0);
    engine.add_request(request(1, prompt(0, 4), 500));
    let steps = run_to_idle(&mut engine);
    let tokens = tokens_of(&steps, 1);
    assert_eq!(tokens.len(), 500);
    assert!(tokens.iter().all(|token| drawable.contains(token)));

    let stop = tokens[5];
    let first_stop = tokens.iter().position(|&t| t == stop).expect("present") + 1;
    let with_stop = |min_tokens: u32, ignore_eos: bool| {
        let mut engine = DpEngine::new(config.clone(), 0);
        engine.add_request(EngineRequest {
            stop_token_ids: vec![stop],
            min_tokens,
            ignore_eos,
            ..request(1, prompt(0, 4), 500)
        });
        let steps = run_to_idle(&mut engine);
        (tokens_of(&steps, 1).len(), finishes(&steps)[&1].clone())
    };
    assert_eq!(with_stop(0, false), (first_stop, FinishKind::Stop));
    let (len, finish) = with_stop(first_stop as u32 + 1, false);
    assert!(len > first_stop && finish == FinishKind::Stop);
    // As in vLLM, ignore_eos does not disable explicit stop token ids.
    assert_eq!(with_stop(0, true), (first_stop, FinishKind::Stop));
}

#[test]
fn reasoning_wraps_the_first_part_in_markers() {
    let config = EngineConfig {
        reasoning: Some(ReasoningConfig::single(1001, 1002, 0.3)),
        ..small_config(64, 4)
    };
    let mut engine = DpEngine::new(config, 0);
    engine.add_request(request(1, prompt(0, 4), 10));
    let tokens = tokens_of(&run_to_idle(&mut engine), 1);
    assert_eq!(tokens.len(), 10);
    assert_eq!((tokens[0], tokens[2]), (1001, 1002));
    assert!(tokens[3..].iter().all(|&t| t < 1000));
}

#[test]
fn multi_token_markers_and_a_budget_shape_the_thinking_and_forced_output_follows_it() {
    let config = EngineConfig {
        reasoning: Some(ReasoningConfig {
            start_thinking: Arc::from([1001, 1002]),
            end_thinking: Arc::from([1003, 1004]),
            thinking_ratio: 0.5,
        }),
        ..small_config(64, 4)
    };
    let mut engine = DpEngine::new(config.clone(), 0);
    engine.add_request(request(1, prompt(0, 4), 20));
    engine.add_request(EngineRequest {
        max_thinking_tokens: Some(1),
        ..request(2, prompt(8, 4), 20)
    });
    engine.add_request(EngineRequest {
        forced_output: vec![7, 8, 9],
        ..request(3, prompt(16, 4), 20)
    });
    let steps = run_to_idle(&mut engine);
    let free = tokens_of(&steps, 1);
    assert_eq!(&free[..2], &[1001, 1002]);
    assert_eq!(&free[8..10], &[1003, 1004]);
    assert!(free[2..8].iter().chain(&free[10..]).all(|&t| t < 1000));
    let capped = tokens_of(&steps, 2);
    assert_eq!(&capped[..2], &[1001, 1002]);
    assert_eq!(&capped[3..5], &[1003, 1004]);
    let forced = tokens_of(&steps, 3);
    assert_eq!(forced.len(), 13);
    assert_eq!(
        (&forced[..2], &forced[8..10]),
        (&[1001, 1002][..], &[1003, 1004][..])
    );
    assert_eq!(&forced[10..], &[7, 8, 9]);
    assert_eq!(finishes(&steps)[&3], FinishKind::Eos);
}

#[test]
fn cancel_frees_blocks() {
    let mut engine = DpEngine::new(small_config(64, 4), 0);
    engine.add_request(request(1, prompt(0, 10), 100));
    engine.add_request(request(2, prompt(50, 10), 100));
    engine.step();
    assert_eq!(engine.load().kv_used_blocks, 6);
    assert!(engine.cancel(1));
    assert_eq!(engine.load().kv_used_blocks, 3);
    assert!(!engine.cancel(1));
    engine.add_request(request(3, prompt(0, 10), 100));
    assert!(engine.cancel(3), "a waiting request can be cancelled");
    assert!(engine.cancel(2));
    assert_eq!(
        engine.load(),
        LoadSnapshot {
            kv_total_blocks: 64,
            ..LoadSnapshot::default()
        }
    );
    assert!(!engine.has_work());
}

#[test]
fn invalid_requests_finish_with_errors() {
    let config = EngineConfig {
        max_model_len: Some(12),
        ..small_config(4, 4)
    };
    let mut engine = DpEngine::new(config, 0);
    engine.add_request(request(1, Vec::new(), 5));
    engine.add_request(request(2, prompt(0, 12), 5));
    engine.add_request(request(3, prompt(0, 10), 0));
    engine.add_request(request(4, prompt(0, 10), 100));
    let steps = run_to_idle(&mut engine);
    let ends = finishes(&steps);
    for key in [1, 2, 3] {
        assert!(matches!(ends[&key], FinishKind::Error(_)), "key {key}");
    }
    // Capped by max_model_len: 12 - 10 = 2 tokens.
    assert_eq!(ends[&4], FinishKind::Length);
    assert_eq!(tokens_of(&steps, 4).len(), 2);

    engine.add_request(request(5, prompt(0, 3), 3));
    engine.add_request(request(5, prompt(0, 3), 1));
    let steps = run_to_idle(&mut engine);
    let kinds: Vec<_> = steps
        .iter()
        .flat_map(|step| &step.outputs)
        .filter_map(|output| output.finish.clone())
        .collect();
    assert!(matches!(
        kinds.as_slice(),
        [FinishKind::Error(_), FinishKind::Length]
    ));

    let mut tiny = DpEngine::new(small_config(2, 4), 0);
    tiny.add_request(request(1, prompt(0, 9), 5));
    // A prompt that fits the pool has its output capped to what the pool can hold.
    tiny.add_request(request(2, prompt(0, 6), 50));
    let steps = run_to_idle(&mut tiny);
    assert!(matches!(finishes(&steps)[&1], FinishKind::Error(_)));
    assert_eq!(tokens_of(&steps, 2).len(), 3);
}

#[test]
fn decode_time_follows_kv_usage_and_idle_steps_are_empty() {
    let mut engine = DpEngine::new(small_config(10, 4), 0);
    let idle = engine.step();
    assert!(idle.is_empty());
    assert_eq!((idle.prefill_ms, idle.decode_ms), (0.0, 0.0));
    engine.add_request(request(1, prompt(0, 9), 3));
    engine.step();
    let decode = engine.step();
    assert_eq!(decode.num_decode_seqs, 1);
    assert_eq!(decode.prefill_ms, 0.0);
    assert_eq!(decode.decode_ms, timing::decode_ms(3.0 / 10.0));
}

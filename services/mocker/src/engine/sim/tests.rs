use super::*;
use crate::engine::sampler::Xoshiro256;
use crate::engine::timing::{decode_ms, prefill_ms};

fn request(key: u64, prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        key,
        request_id: format!("req-{key}"),
        prompt,
        max_tokens: Some(max_tokens),
        ..EngineRequest::default()
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: 512,
        block_size: 16,
        ..EngineConfig::default()
    }
}

/// A reproducible trace: prompts from a few shared system prompts plus a private suffix.
fn trace(num_requests: usize, interval_us: u64, seed: u64) -> Vec<(u64, EngineRequest)> {
    let mut rng = Xoshiro256::from_seed(seed);
    (0..num_requests)
        .map(|index| {
            let family = rng.below(4) as u32;
            let shared = 64 + 32 * family as usize;
            let private = 16 + rng.below(200) as usize;
            let mut prompt: Vec<u32> = (0..shared as u32).map(|i| family * 10_000 + i).collect();
            prompt.extend((0..private as u32).map(|i| 50_000 + index as u32 * 1000 + i));
            let max_tokens = 1 + rng.below(40) as u32;
            (
                interval_us * index as u64,
                request(index as u64, prompt, max_tokens),
            )
        })
        .collect()
}

#[test]
fn a_single_request_takes_exactly_the_modelled_time() {
    let mut sim = Simulation::new(EngineConfig::default(), 1, SimConfig::default());
    sim.submit(1_000, 0, request(1, (0..1000).collect(), 2));
    let mut events = Vec::new();
    sim.run_until_idle(|event| events.push(event));
    let record = &sim.records()[0];
    // prefill_ms(1000) = 32.1058589 ms.
    assert_eq!(record.first_token_us, Some(1_000 + 32_106));
    let decode_us = (decode_ms(16.0 / 16384.0) * 1000.0).round() as u64;
    assert_eq!(record.finish_us, Some(1_000 + 32_106 + decode_us));
    assert_eq!(record.num_output_tokens, 2);
    assert_eq!(record.finish, Some(FinishKind::Length));
    // Per pass: token, KV events (the first pass stores 15 blocks), load.
    assert!(matches!(events[0], SimEvent::Token { at_us: 33_106, .. }));
    assert!(matches!(
        events[1],
        SimEvent::KvEvents { at_us: 33_106, .. }
    ));
    assert!(matches!(
        events[2],
        SimEvent::Load {
            at_us: 33_106,
            snapshot: LoadSnapshot {
                num_running: 1,
                kv_used_blocks: 16,
                ..
            },
            ..
        }
    ));
}

#[test]
fn arrivals_at_one_instant_share_a_pass() {
    let mut sim = Simulation::new(config(), 2, SimConfig::default());
    sim.submit(0, 1, request(1, (0..100).collect(), 1));
    sim.submit(0, 1, request(2, (200..300).collect(), 1));
    sim.submit(0, 0, request(3, (400..500).collect(), 1));
    sim.run_until_idle(|_| {});
    let mut records = sim.records().to_vec();
    // Same instant: ordered by worker index, then arrival index.
    let keys: Vec<u64> = records.iter().map(|r| r.key).collect();
    assert_eq!(keys, vec![3, 1, 2]);
    records.sort_by_key(|r| r.key);
    let firsts: Vec<_> = records.iter().map(|r| r.first_token_us).collect();
    let batched = (prefill_ms(200) * 1000.0).round() as u64;
    let alone = (prefill_ms(100) * 1000.0).round() as u64;
    assert_eq!(firsts, vec![Some(batched), Some(batched), Some(alone)]);
    assert_eq!(records[2].worker, 0);
}

#[test]
fn decode_steps_that_share_a_pass_with_prefill_are_counted() {
    let mut sim = Simulation::new(config(), 1, SimConfig::default());
    sim.submit(0, 0, request(1, (0..100).collect(), 20));
    // Arrives while request 1 decodes: its prefill shares exactly one pass with that decode.
    sim.submit(100_000, 0, request(2, (1000..1100).collect(), 3));
    sim.run_until_idle(|_| {});
    let mut records = sim.records().to_vec();
    records.sort_by_key(|r| r.key);
    assert_eq!(records[0].num_output_tokens, 20);
    assert!(records[0].first_token_us < Some(100_000));
    assert!(records[0].finish_us > records[1].first_token_us);
    assert_eq!(records[0].num_steps_beside_prefill, 1);
    // Request 2's own first token comes from its prefill pass and its decode meets no prefill.
    assert_eq!(records[1].num_steps_beside_prefill, 0);
}

/// Routes to the worker with the fewest used plus waiting blocks, as last reported; records every
/// event.
#[derive(Default)]
struct LeastLoaded {
    events: Vec<SimEvent>,
    decisions: Vec<(u64, usize)>,
}

impl SimHandler for LeastLoaded {
    fn route(&mut self, view: &SimView<'_>, _request: &EngineRequest) -> usize {
        let worker = (0..view.num_workers())
            .min_by_key(|&w| {
                let load = view.load(w).copied().unwrap_or_default();
                (load.kv_used_blocks + load.num_waiting + load.num_running, w)
            })
            .unwrap_or(0);
        self.decisions.push((view.now_us(), worker));
        worker
    }

    fn on_event(&mut self, event: SimEvent) {
        self.events.push(event);
    }
}

fn run_trace(num_workers: usize, interval_us: u64) -> (LeastLoaded, Vec<RequestRecord>) {
    let mut sim = Simulation::new(config(), num_workers, SimConfig::default());
    let mut handler = LeastLoaded::default();
    sim.run_with(trace(120, interval_us, 42), &mut handler);
    (handler, sim.records().to_vec())
}

#[test]
fn simulation_is_deterministic() {
    let (first, first_records) = run_trace(3, 7_000);
    let (second, second_records) = run_trace(3, 7_000);
    assert_eq!(first.events, second.events);
    assert_eq!(first.decisions, second.decisions);
    assert_eq!(first_records, second_records);
    // The router spread the load and every request finished.
    for worker in 0..3 {
        assert!(first_records.iter().any(|r| r.worker == worker));
    }
    assert!(
        first_records
            .iter()
            .all(|r| r.finish == Some(FinishKind::Length))
    );
    assert!(first_records.iter().any(|r| r.cached_tokens > 0));
    // Reported in time order.
    let times: Vec<u64> = first
        .events
        .iter()
        .map(|event| match event {
            SimEvent::Token { at_us, .. }
            | SimEvent::KvEvents { at_us, .. }
            | SimEvent::Load { at_us, .. } => *at_us,
        })
        .collect();
    assert!(times.windows(2).all(|pair| pair[0] <= pair[1]));
}

#[test]
fn ttft_grows_when_arrivals_get_denser() {
    let mean_ttft = |interval_us: u64| {
        let (_, records) = run_trace(1, interval_us);
        let total: u64 = records
            .iter()
            .map(|r| r.first_token_us.unwrap_or(u64::MAX) - r.arrival_us)
            .sum();
        total / records.len() as u64
    };
    let sparse = mean_ttft(200_000);
    let medium = mean_ttft(20_000);
    let dense = mean_ttft(1_000);
    assert!(
        sparse < medium && medium < dense,
        "{sparse} {medium} {dense}"
    );
}

#[test]
fn routing_sees_the_state_reported_at_arrival_time() {
    let mut sim = Simulation::new(config(), 1, SimConfig::default());
    let arrivals = vec![
        (0, request(1, (0..64).collect(), 3)),
        // During the first pass: nothing reported yet.
        (1_000, request(2, (100..164).collect(), 1)),
        // Long after everything finished.
        (10_000_000, request(3, (0..64).collect(), 1)),
    ];
    let mut seen = Vec::new();
    let mut kv_event_times = Vec::new();
    sim.run(
        arrivals,
        |view, _| {
            seen.push((view.now_us(), view.load(0).copied().unwrap_or_default()));
            0
        },
        |event| {
            if let SimEvent::KvEvents { at_us, .. } = event {
                kv_event_times.push(at_us);
            }
        },
    );
    assert_eq!(seen[0].0, 0);
    assert_eq!(
        seen[1].1.num_running, 0,
        "a pass in flight has reported nothing"
    );
    assert_eq!(seen[2].0, 10_000_000);
    assert_eq!(seen[2].1.num_running, 0);
    assert_eq!(seen[2].1.kv_used_blocks, 0);
    assert!(kv_event_times[0] < 1_000_000);
    // Request 3 reuses request 1's prefix.
    assert_eq!(sim.records()[2].cached_tokens, 48);
    assert_eq!(sim.now_us(), sim.records()[2].finish_us.unwrap_or(0));
}

#[test]
fn infinite_speedup_runs_in_zero_time() {
    let mut sim = Simulation::new(
        config(),
        2,
        SimConfig {
            speedup_ratio: 0.0,
            decode_speedup_ratio: 1.0,
        },
    );
    sim.run(trace(20, 0, 1), |_, request| request.key as usize, |_| {});
    assert!(sim.records().iter().all(|r| r.finish_us == Some(0)));
    assert!(
        sim.records()
            .iter()
            .all(|r| r.finish == Some(FinishKind::Length))
    );
}

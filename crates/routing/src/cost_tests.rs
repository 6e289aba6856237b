//! One test per term of the cost function, and the worked example of docs/routing.md
//! ("Worked example").

use super::*;

const B: u32 = 16;

fn defaults() -> CostWeights {
    EffectiveKv::new(&KvRouterConfig::default(), None).weights
}

/// Weights as the adaptive mode would have learned them.
fn learned(credit: f64, scale: f64, stall: f64) -> crate::adaptive::LearnedWeights {
    crate::adaptive::LearnedWeights {
        overlap_score_credit: credit,
        prefill_load_scale: scale,
        decode_stall_weight: stall,
        num_observations: 0,
        num_decodes: 0,
    }
}

fn shape(blocks: u64) -> RequestShape {
    RequestShape {
        isl: blocks * u64::from(B),
        block_size: B,
        min_active_prefill_tokens: 0,
    }
}

fn candidate(device: u32, decode: u64) -> CandidateLoad {
    CandidateLoad {
        device_overlap: device,
        decode_blocks: decode,
        has_load_entry: true,
        ..CandidateLoad::default()
    }
}

#[test]
fn worked_example_costs() {
    let w = defaults();
    let request = shape(10);
    let costs: Vec<f64> = [(2, 10), (5, 5), (8, 9)]
        .into_iter()
        .map(|(cached, decode)| kv_cost(&w, &request, &candidate(cached, decode)))
        .collect();
    assert_eq!(costs, vec![18.0, 10.0, 11.0]);
}

#[test]
fn raw_prefill_adds_active_prefill_and_uses_isl_without_entry() {
    let w = defaults();
    let request = shape(10);
    let mut c = candidate(0, 0);
    c.active_prefill_tokens = 2 * u64::from(B);
    assert_eq!(kv_cost_breakdown(&w, &request, &c).raw_prefill, 12.0);
    c.has_load_entry = false;
    assert_eq!(kv_cost_breakdown(&w, &request, &c).raw_prefill, 10.0);
}

#[test]
fn raw_prefill_uses_cached_when_it_exceeds_the_prompt() {
    let w = defaults();
    let c = candidate(12, 0);
    let b = kv_cost_breakdown(&w, &shape(10), &c);
    assert_eq!(b.raw_prefill, 12.0);
    assert_eq!(b.adjusted_prefill, 0.0);
}

#[test]
fn prefill_tracking_off_zeroes_prefill_and_decay() {
    let mut w = defaults();
    w.track_prefill_tokens = false;
    w.overlap_score_credit_decay = 5.0;
    let mut c = candidate(3, 7);
    c.active_prefill_tokens = 1000;
    let b = kv_cost_breakdown(&w, &shape(10), &c);
    assert_eq!((b.raw_prefill, b.decay, b.cost), (0.0, 1.0, 7.0));
}

#[test]
fn overlap_credit_scales_device_blocks() {
    let mut w = defaults();
    w.overlap_score_credit = 0.5;
    let b = kv_cost_breakdown(&w, &shape(10), &candidate(4, 0));
    assert_eq!(b.credit, 2.0);
    assert_eq!(b.cost, 8.0);
}

#[test]
fn credit_decays_with_excess_active_prefill() {
    let mut w = defaults();
    w.overlap_score_credit_decay = 1.0;
    let mut request = shape(10);
    request.min_active_prefill_tokens = 0;
    let mut c = candidate(6, 0);
    c.active_prefill_tokens = 10 * u64::from(B); // one request-equivalent of excess
    let b = kv_cost_breakdown(&w, &request, &c);
    assert_eq!(b.decay, 0.5);
    assert_eq!(b.credit, 3.0);
    // The least-loaded candidate keeps full credit.
    request.min_active_prefill_tokens = c.active_prefill_tokens;
    assert_eq!(kv_cost_breakdown(&w, &request, &c).decay, 1.0);
    // Decay 0 keeps full credit whatever the excess.
    w.overlap_score_credit_decay = 0.0;
    request.min_active_prefill_tokens = 0;
    assert_eq!(kv_cost_breakdown(&w, &request, &c).decay, 1.0);
}

#[test]
fn host_and_disk_hits_earn_their_weights() {
    let w = defaults();
    let mut c = candidate(2, 0);
    c.host_overlap = 4;
    c.disk_overlap = 4;
    let b = kv_cost_breakdown(&w, &shape(10), &c);
    assert_eq!(b.credit, 2.0 + 0.75 * 4.0 + 0.25 * 4.0);
    let mut w2 = w;
    w2.host_cache_hit_weight = 0.0;
    w2.disk_cache_hit_weight = 1.0;
    assert_eq!(kv_cost_breakdown(&w2, &shape(10), &c).credit, 2.0 + 4.0);
}

#[test]
fn prefill_load_scale_multiplies_adjusted_prefill() {
    let mut w = defaults();
    w.prefill_load_scale = 2.5;
    assert_eq!(kv_cost(&w, &shape(10), &candidate(6, 1)), 2.5 * 4.0 + 1.0);
}

#[test]
fn decode_blocks_add_one_to_one() {
    let w = defaults();
    let a = kv_cost(&w, &shape(10), &candidate(0, 3));
    let b = kv_cost(&w, &shape(10), &candidate(0, 13));
    assert_eq!(b - a, 10.0);
}

#[test]
fn active_requests_cost_their_weight() {
    let mut w = defaults();
    let mut c = candidate(0, 0);
    c.active_requests = 3;
    assert_eq!(kv_cost(&w, &shape(10), &c), 10.0);
    w.decode_active_request_weight = 2.0;
    assert_eq!(kv_cost(&w, &shape(10), &c), 16.0);
}

#[test]
fn older_formula_is_credit_one_and_scale_weight() {
    // Older releases: weight · (active_prefill + ISL − overlap·B)/B + decode.
    let config = KvRouterConfig::default();
    let over = RouterConfigOverride {
        overlap_score_weight: Some(3.0),
        ..RouterConfigOverride::default()
    };
    let eff = EffectiveKv::new(&config, Some(&over));
    let mut c = candidate(4, 5);
    c.active_prefill_tokens = 2 * u64::from(B);
    let old = 3.0 * ((2.0 * 16.0 + 160.0 - 4.0 * 16.0) / 16.0) + 5.0;
    assert_eq!(kv_cost(&eff.weights, &shape(10), &c), old);
    let zero = RouterConfigOverride {
        overlap_score_weight: Some(0.0),
        overlap_score_credit: Some(1.0),
        ..RouterConfigOverride::default()
    };
    let eff = EffectiveKv::new(&config, Some(&zero));
    assert_eq!(eff.weights.overlap_score_credit, 0.0);
    assert_eq!(eff.weights.prefill_load_scale, 0.0);
    assert!(!eff.queries_index());
}

#[test]
fn overrides_replace_config_values() {
    let config = KvRouterConfig::default();
    let over = RouterConfigOverride {
        overlap_score_credit: Some(0.25),
        prefill_load_scale: Some(4.0),
        router_temperature: Some(0.7),
        assume_kv_reuse: Some(false),
        track_prefill_tokens: Some(false),
        shared_cache_multiplier: Some(0.5),
        overlap_score_weight: None,
    };
    let eff = EffectiveKv::new(&config, Some(&over));
    assert_eq!(eff.weights.overlap_score_credit, 0.25);
    assert_eq!(eff.weights.prefill_load_scale, 4.0);
    assert_eq!(eff.temperature, 0.7);
    assert!(!eff.assume_kv_reuse);
    assert!(!eff.weights.track_prefill_tokens);
    // Invalid override values are ignored rather than poisoning the cost.
    let bad = RouterConfigOverride {
        router_temperature: Some(f64::NAN),
        ..RouterConfigOverride::default()
    };
    assert_eq!(EffectiveKv::new(&config, Some(&bad)).temperature, 0.0);
}

#[test]
fn learned_weights_let_the_adjusted_prefill_go_below_zero() {
    // Credit 4: a session's worker holds 8 blocks of a 10-block prompt, two other workers hold
    // its 4-block system prompt. Floored at zero (Dynamo's formula) all three cost the same; the
    // adaptive mode's weights keep the session's worker cheapest.
    let learned = learned(4.0, 1.0, 0.0);
    let config = KvRouterConfig::default();
    let fixed = EffectiveKv::new(&config, None).weights;
    let fixed = CostWeights {
        overlap_score_credit: 4.0,
        ..fixed
    };
    let auto = EffectiveKv::with_learned(&config, Some(&learned), None).weights;
    assert!(fixed.floor_adjusted_prefill && !auto.floor_adjusted_prefill);
    let (session, shared) = (candidate(8, 0), candidate(4, 0));
    assert_eq!(kv_cost(&fixed, &shape(10), &session), 0.0);
    assert_eq!(kv_cost(&fixed, &shape(10), &shared), 0.0);
    assert_eq!(kv_cost(&auto, &shape(10), &session), 10.0 - 32.0);
    assert_eq!(kv_cost(&auto, &shape(10), &shared), 10.0 - 16.0);
    let terms = kv_cost_breakdown(&auto, &shape(10), &session);
    assert_eq!(terms.adjusted_prefill, -22.0);
}

#[test]
fn lmetric_never_makes_a_fuller_batch_cheaper() {
    // With the adaptive mode's weights the adjusted prefill can go below zero; lmetric's product
    // with the batch size must not then favour the worker with more decode blocks.
    let learned = learned(4.0, 1.0, 0.0);
    let auto = EffectiveKv::with_learned(&KvRouterConfig::default(), Some(&learned), None).weights;
    let (light, busy) = (candidate(8, 0), candidate(8, 100));
    assert!(kv_cost_breakdown(&auto, &shape(10), &busy).adjusted_prefill < 0.0);
    assert!(lmetric_cost(&auto, &shape(10), &light) <= lmetric_cost(&auto, &shape(10), &busy));
}

#[test]
fn the_decode_stall_term_weighs_pending_prefill_by_the_requests_running() {
    let learned = learned(1.0, 2.0, 0.1);
    let config = KvRouterConfig::default();
    let auto = EffectiveKv::with_learned(&config, Some(&learned), None).weights;
    let crowded = |device: u32, queued_blocks: u64, running: u32| CandidateLoad {
        active_prefill_tokens: queued_blocks * u64::from(B),
        active_requests: running,
        ..candidate(device, 0)
    };
    // 10 pending blocks (6 queued, 4 of the request's own after 6 cached) beside 5 running
    // requests: 2 · 0.1 · 10 · 5 on top of the linear 2 · 10.
    let terms = kv_cost_breakdown(&auto, &shape(10), &crowded(6, 6, 5));
    assert_eq!(terms.adjusted_prefill, 10.0);
    assert!((terms.decode_stall - 10.0).abs() < 1e-9, "{terms:?}");
    assert!((terms.cost - 30.0).abs() < 1e-9, "{terms:?}");
    // With the same linear cost, the rank with fewer running requests is cheaper.
    assert!(kv_cost(&auto, &shape(10), &crowded(6, 6, 1)) < terms.cost);
    // A prompt its credit covers stalls nothing, and Dynamo's fixed weights have no such term.
    assert_eq!(
        kv_cost_breakdown(&auto, &shape(10), &crowded(10, 0, 5)).decode_stall,
        0.0
    );
    let fixed = EffectiveKv::new(&config, None).weights;
    assert_eq!(fixed.decode_stall_weight, 0.0);
    assert_eq!(
        kv_cost_breakdown(&fixed, &shape(10), &crowded(6, 6, 5)).decode_stall,
        0.0
    );
}

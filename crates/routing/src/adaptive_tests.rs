use std::sync::Arc;
use std::time::Duration;

use kvmesh_kv::WorkerKey;

use super::*;
use crate::rng::Rng;

fn key(id: u64) -> ReqKey {
    (Arc::from("r"), format!("req-{id}"))
}

/// Feeds `n` observations of `ttft = 5 ms + a·q + b·u + δ·d` (per block) with random features:
/// queued blocks `q` uniform in `0..64`, own uncached blocks `u` in `1..=32`.
fn feed(learner: &mut Adaptive, rng: &mut Rng, first_id: u64, n: u64, rates: (f64, f64, f64)) {
    feed_queued(learner, rng, (first_id, n), 64, rates);
}

/// [`feed`] with queued blocks uniform in `0..queued_below`.
fn feed_queued(
    learner: &mut Adaptive,
    rng: &mut Rng,
    (first_id, n): (u64, u64),
    queued_below: usize,
    (a, b, delta): (f64, f64, f64),
) {
    for id in first_id..first_id + n {
        let (q, u, d) = (
            rng.below(queued_below) as u64,
            rng.below(32) as u64 + 1,
            rng.below(4096) as u64,
        );
        let ttft = 0.005 + a * q as f64 + b * u as f64 + delta * d as f64;
        let start = Duration::from_secs(id);
        learner.on_routed(
            key(id),
            WorkerKey::new(id % 4, 0),
            start,
            16,
            (q * 16, u * 16, d, 0),
            learner_cache(learner),
        );
        learner.on_first_token(&key(id), start + Duration::from_secs_f64(ttft));
    }
}

/// The cache shares the feeding helpers report: full or empty as a test set the learner's sums
/// before (so that feeding keeps them), nothing otherwise.
fn learner_cache(learner: &Adaptive) -> CacheShares {
    CacheShares {
        held: (learner.full_count > 0.0).then(|| learner.full_share()),
        total_blocks: None,
    }
}

/// A rank whose cache the router knows `held` of.
fn held(held: Option<f64>) -> CacheShares {
    CacheShares {
        held,
        total_blocks: None,
    }
}

/// The weight grid's value nearest `x` (quarter octaves).
fn snap(x: f64) -> f64 {
    ((x.log2() * STEPS_PER_OCTAVE).round() / STEPS_PER_OCTAVE).exp2()
}

#[test]
fn the_fit_recovers_known_exchange_rates_and_follows_a_change() {
    // With q uniform in 0..64 and u in 1..=32, a request has ρ = 31.5 / 16.5 requests' worth of
    // prefill queued ahead of it, and as many will queue behind its own prefill: a cached block
    // is worth (b / a)·(1 + ρ) queued blocks.
    let queued_behind = 31.5 / 16.5;
    let mut learner = Adaptive::new(1.0, 1.0);
    let mut rng = Rng::new(3);
    feed(
        &mut learner,
        &mut rng,
        0,
        4000,
        (0.004, 0.016, 0.004 / 16.0),
    );
    let w = learner.weights();
    assert_eq!(
        (w.overlap_score_credit, w.prefill_load_scale),
        (snap(4.0 * (1.0 + queued_behind)), 16.0)
    );
    feed(
        &mut learner,
        &mut rng,
        4000,
        8000,
        (0.004, 0.004, 0.004 / 64.0),
    );
    let w = learner.weights();
    assert_eq!(w.prefill_load_scale, 64.0);
    // Coming down from above, the hysteresis may hold it one step short of the target.
    let steps_off =
        (w.overlap_score_credit.log2() - (1.0 + queued_behind).log2()) * STEPS_PER_OCTAVE;
    assert!(
        (0.0..=1.0).contains(&steps_off),
        "credit {} for a target of {}",
        w.overlap_score_credit,
        1.0 + queued_behind
    );
    assert_eq!(w.num_observations, 12_000);
}

#[test]
fn deeper_queues_make_a_cached_block_worth_more() {
    // The same exchange rate (b = a) under three times the queueing: ρ = 95.5 / 16.5.
    let mut learner = Adaptive::new(1.0, 1.0);
    let mut rng = Rng::new(7);
    feed_queued(
        &mut learner,
        &mut rng,
        (0, 6000),
        192,
        (0.004, 0.004, 0.004 / 64.0),
    );
    let credit = learner.weights().overlap_score_credit;
    assert_eq!(credit, snap(1.0 + 95.5 / 16.5));
    assert!(credit > snap(1.0 + 31.5 / 16.5));
}

/// Requests routed beside `running` others, `ttft` as in [`feed`] with `b = a`, whose decode
/// lasts 1 s plus `stall` s per block of prefill queued on the rank at routing.
fn feed_decoding(learner: &mut Adaptive, rng: &mut Rng, n: u64, running: u32, stall: f64) {
    let a = 0.004;
    for id in 0..n {
        let (q, u, d) = (
            rng.below(64) as u64,
            rng.below(32) as u64 + 1,
            rng.below(4096) as u64,
        );
        let ttft = 0.005 + a * (q + u) as f64 + a / 64.0 * d as f64;
        let start = Duration::from_secs(id * 10);
        let first = start + Duration::from_secs_f64(ttft);
        let key = key(id);
        learner.on_routed(
            key.clone(),
            WorkerKey::new(id % 4, 0),
            start,
            16,
            (q * 16, u * 16, d, running),
            CacheShares::default(),
        );
        learner.on_first_token(&key, first);
        learner.on_completed(
            &key,
            first + Duration::from_secs_f64(1.0 + stall * q as f64),
        );
    }
}

#[test]
fn a_prefill_that_stalls_decoding_requests_makes_a_cached_block_worth_more() {
    let queued_behind = 31.5 / 16.5;
    let mut alone = Adaptive::new(1.0, 1.0);
    feed_decoding(&mut alone, &mut Rng::new(5), 6000, 8, 0.0);
    assert_eq!(
        alone.weights().overlap_score_credit,
        snap(1.0 + queued_behind)
    );

    // Each queued block adds 4 ms to every decode beside it: with 8 requests decoding, a cached
    // block also spares them that, at w = E[ttft] / E[decode] first-token seconds per second.
    let (a, stall, running) = (0.004, 0.004, 8.0);
    let mut stalled = Adaptive::new(1.0, 1.0);
    feed_decoding(&mut stalled, &mut Rng::new(5), 6000, 8, stall);
    let mean_ttft = 0.005 + a * (31.5 + 16.5) + a / 64.0 * 2047.5;
    let w = mean_ttft / (1.0 + stall * 31.5);
    let queued = a + w * stall;
    let credit = (a * (1.0 + queued_behind) + running * w * stall) / queued;
    let learned = stalled.weights();
    let steps_off =
        |value: f64, target: f64| ((value.log2() - target.log2()) * STEPS_PER_OCTAVE).abs();
    assert!(
        steps_off(learned.overlap_score_credit, credit) <= 1.0,
        "credit {} for a target of {credit}",
        learned.overlap_score_credit
    );
    assert!(learned.overlap_score_credit > alone.weights().overlap_score_credit);
    // A queued block now costs `a + w·stall`, so prefill weighs more against decode blocks.
    assert!(steps_off(learned.prefill_load_scale, queued / (a / 64.0)) <= 1.0);
    assert!(learned.prefill_load_scale > alone.weights().prefill_load_scale);
}

#[test]
fn weights_stay_within_the_swept_range_and_a_zero_credit_stays_zero() {
    let mut learner = Adaptive::new(1.0, 1.0);
    let mut rng = Rng::new(5);
    // Cached blocks worth 100 queued ones, decode blocks free: both clamp.
    feed(&mut learner, &mut rng, 0, 3000, (0.001, 0.1, 0.0));
    let w = learner.weights();
    assert_eq!(
        (w.overlap_score_credit, w.prefill_load_scale),
        (MAX_CREDIT, MAX_SCALE)
    );

    let mut load_only = Adaptive::new(0.0, 1.0);
    feed(
        &mut load_only,
        &mut rng,
        0,
        3000,
        (0.004, 0.016, 0.004 / 16.0),
    );
    let w = load_only.weights();
    assert_eq!((w.overlap_score_credit, w.prefill_load_scale), (0.0, 16.0));
}

#[test]
fn too_few_observations_keep_the_starting_weights() {
    let mut learner = Adaptive::new(2.0, 8.0);
    let mut rng = Rng::new(1);
    feed(
        &mut learner,
        &mut rng,
        0,
        MIN_OBSERVATIONS - 1,
        (0.004, 0.016, 0.0001),
    );
    let w = learner.weights();
    assert_eq!((w.overlap_score_credit, w.prefill_load_scale), (2.0, 8.0));
    assert_eq!(w.decode_stall_weight, 0.0);
    // A request that never produced a first token is not an observation.
    learner.on_routed(
        key(999),
        WorkerKey::new(1, 0),
        Duration::ZERO,
        16,
        (0, 16, 0, 0),
        CacheShares::default(),
    );
    learner.forget(&key(999));
    assert!(
        learner
            .on_first_token(&key(999), Duration::from_secs(1))
            .is_none()
    );
    learner.on_routed(
        key(998),
        WorkerKey::new(1, 0),
        Duration::ZERO,
        16,
        (0, 16, 0, 0),
        CacheShares::default(),
    );
    learner.expire(Duration::from_secs(1));
    assert!(learner.pending.is_empty());
}

#[test]
fn steps_snap_to_quarter_octaves_with_hysteresis() {
    let mut w = 1.0;
    assert!(!step(&mut w, 1.1), "within the band");
    assert!(
        !step(&mut w, 2f64.powf(0.55 / STEPS_PER_OCTAVE)),
        "past the midpoint, not past the band"
    );
    assert!(step(&mut w, 4.1));
    assert_eq!(w, 4.0);
    assert!(step(&mut w, 5.0));
    assert_eq!(w, 2f64.powf(2.25));
}

#[test]
fn the_share_cap_passes_over_ranks_far_above_the_mean() {
    let mut learner = Adaptive::new(1.0, 1.0);
    let keys: Vec<WorkerKey> = (1..=4).map(|w| WorkerKey::new(w, 0)).collect();
    assert_eq!(learner.under_share_cap(&keys), vec![true; 4]);
    for _ in 0..40 {
        learner.count(keys[0]);
    }
    for &k in &keys[1..] {
        for _ in 0..10 {
            learner.count(k);
        }
    }
    assert_eq!(
        learner.under_share_cap(&keys),
        vec![false, true, true, true]
    );
    assert_eq!(learner.under_share_cap(&keys[..1]), vec![true]);
}

#[test]
fn full_caches_raise_the_credit_and_caches_with_room_leave_it() {
    // The same exchange rates, once with every chosen rank's cache full and once with room.
    let rates = (0.002, 0.004, 0.00001);
    let learned = |full: f64| {
        let mut learner = Adaptive::new(1.0, 1.0);
        learner.full_sum = full;
        learner.full_count = 1.0;
        let mut rng = Rng::new(5);
        feed(&mut learner, &mut rng, 0, 3000, rates);
        assert!((learner.full_share() - full).abs() < 1e-9);
        learner.weights().overlap_score_credit
    };
    let (with_room, full) = (learned(0.0), learned(1.0));
    let expected = snap(with_room * (1.0 + FULL_CACHE_CREDIT));
    assert!(
        (full / expected - 1.0).abs() < 0.2,
        "full {full}, with room {with_room}"
    );
    assert!(full > 2.0 * with_room);
    // A rank counts as full from FULL_CACHE_AT of its blocks; the share is over the routings
    // that knew, recent ones weighing most.
    let mut learner = Adaptive::new(1.0, 1.0);
    let worker = WorkerKey::new(0, 0);
    let fullness = [Some(0.5), None, Some(FULL_CACHE_AT), Some(0.999), Some(0.9)];
    for (id, fullness) in (0..).zip(fullness) {
        learner.on_routed(
            key(id),
            worker,
            Duration::ZERO,
            16,
            (0, 16, 0, 0),
            held(fullness),
        );
    }
    let share = learner.full_share();
    assert!((share - 0.5).abs() < 0.01, "{share}");
}

/// Feeds `n` first tokens of a load whose routed ranks held `decode_blocks` of `total_blocks`
/// (queued and uncached blocks random, times from fixed rates).
fn feed_running(
    learner: &mut Adaptive,
    rng: &mut Rng,
    decode_blocks: u64,
    total_blocks: Option<u64>,
) {
    for id in 0..2000 {
        let (q, u) = (rng.below(64) as u64, rng.below(32) as u64 + 1);
        let ttft = 0.005 + 0.002 * q as f64 + 0.004 * u as f64 + 0.00001 * decode_blocks as f64;
        let start = Duration::from_secs(id);
        let cache = CacheShares {
            held: None,
            total_blocks,
        };
        let observed = (q * 16, u * 16, decode_blocks, 4);
        learner.on_routed(
            key(id),
            WorkerKey::new(id % 4, 0),
            start,
            16,
            observed,
            cache,
        );
        learner.on_first_token(&key(id), start + Duration::from_secs_f64(ttft));
    }
}

#[test]
fn the_decode_stall_weight_fades_as_running_sequences_fill_the_caches() {
    let learned = |decode_blocks: u64, total_blocks: Option<u64>| {
        let mut learner = Adaptive::new(1.0, 1.0);
        feed_running(&mut learner, &mut Rng::new(3), decode_blocks, total_blocks);
        learner.weights().decode_stall_weight
    };
    // Running sequences hold 0 %, 15 %, 30 % and 60 % of the ranks' blocks.
    assert_eq!(learned(0, Some(1000)), DECODE_STALL_WEIGHT);
    assert!((learned(150, Some(1000)) - DECODE_STALL_WEIGHT / 2.0).abs() < 1e-9);
    assert_eq!(learned(300, Some(1000)), 0.0);
    assert_eq!(learned(600, Some(1000)), 0.0);
    // Ranks that never published their size count as having room.
    assert_eq!(learned(600, None), DECODE_STALL_WEIGHT);
}

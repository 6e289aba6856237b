use std::sync::Arc;
use std::time::Duration;

use kvmesh_kv::WorkerKey;

use super::*;
use crate::rng::Rng;

fn key(id: u64) -> ReqKey {
    (Arc::from("r"), format!("req-{id}"))
}

/// Feeds `n` observations of `ttft = 5 ms + a·q + b·u + δ·d` (per block) with random features.
fn feed(
    learner: &mut Adaptive,
    rng: &mut Rng,
    first_id: u64,
    n: u64,
    (a, b, delta): (f64, f64, f64),
) {
    for id in first_id..first_id + n {
        let (q, u, d) = (
            rng.below(64) as u64,
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
            (q * 16, u * 16, d),
        );
        learner.on_first_token(&key(id), start + Duration::from_secs_f64(ttft));
    }
}

#[test]
fn the_fit_recovers_known_exchange_rates_and_follows_a_change() {
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
    assert_eq!((w.overlap_score_credit, w.prefill_load_scale), (4.0, 16.0));
    feed(
        &mut learner,
        &mut rng,
        4000,
        8000,
        (0.004, 0.004, 0.004 / 64.0),
    );
    let w = learner.weights();
    assert_eq!((w.overlap_score_credit, w.prefill_load_scale), (1.0, 64.0));
    assert_eq!(w.num_observations, 12_000);
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
    // A request that never produced a first token is not an observation.
    learner.on_routed(
        key(999),
        WorkerKey::new(1, 0),
        Duration::ZERO,
        16,
        (0, 16, 0),
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
        (0, 16, 0),
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

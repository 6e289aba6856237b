//! Each cost-model and index flag changes routing (docs/flags.md, "Router flags").

#[path = "support/helpers.rs"]
mod helpers;

use helpers::*;
use kvmesh_kv::Tier;
use kvmesh_routing::{RouteRequest, RouterMode, TerminalPath, WorkerInfo};

fn p() -> Vec<u32> {
    prompt(0, 40) // 10 blocks
}

#[test]
fn router_mode_selects_the_policy() {
    let mut rr = core(&["--router-mode", "round-robin"], &[1, 2, 3]);
    let picks: Vec<u64> = (0..3)
        .map(|i| route(&mut rr, &format!("r{i}"), &[1], s(0)).worker_id)
        .collect();
    assert_eq!(picks, vec![1, 2, 3]);
    assert_eq!(
        config(&["--router-mode", "power-of-two"]).mode,
        RouterMode::PowerOfTwo
    );
}

#[test]
fn overlap_credit_prefers_cached_workers_and_zero_skips_the_index() {
    let index = Counting::new();
    index.store(2, Tier::Device, &p()[..24]);
    let mut kv = core_with_index(&["--router-mode", "kv"], &[1, 2, 3], &index);
    let d = route(&mut kv, "a", &p(), s(0));
    assert_eq!((d.worker_id, d.overlap_blocks), (2, 6));
    assert_eq!(index.queries(), 1);
    let mut off = core_with_index(
        &[
            "--router-mode",
            "kv",
            "--router-kv-overlap-score-credit",
            "0",
        ],
        &[1, 2, 3],
        &index,
    );
    assert_eq!(route(&mut off, "a", &p(), s(0)).overlap_blocks, 0);
    assert_eq!(index.queries(), 1, "credit 0 never queries the index");
    let mut legacy = core_with_index(
        &[
            "--router-mode",
            "kv",
            "--router-kv-overlap-score-weight",
            "0",
        ],
        &[1, 2, 3],
        &index,
    );
    route(&mut legacy, "a", &p(), s(0));
    assert_eq!(
        index.queries(),
        1,
        "the deprecated weight 0 turns credit off"
    );
}

#[test]
fn credit_decay_moves_work_off_a_cached_but_busy_worker() {
    let pick = |decay: &str| {
        let index = Counting::new();
        index.store(1, Tier::Device, &p());
        let args = [
            "--router-mode",
            "kv",
            "--no-router-track-active-blocks",
            "--router-kv-overlap-score-credit-decay",
            decay,
        ];
        let mut core = core_with_index(&args, &[1, 2, 3], &index);
        route_pinned(&mut core, "filler", &prompt(1000, 20), 1); // 20 prefill tokens on worker 1
        route(&mut core, "a", &p(), s(0)).worker_id
    };
    assert_eq!(pick("0"), 1); // (20 + 40)/4 − 10 = 5 < 10
    assert_ne!(pick("4"), 1); // credit decays to 10/3: 11.67 > 10
}

#[test]
fn prefill_load_scale_weighs_prefill_against_decode() {
    let pick = |scale: &str| {
        let index = Counting::new();
        index.store(1, Tier::Device, &p());
        let args = ["--router-mode", "kv", "--router-prefill-load-scale", scale];
        let mut core = core_with_index(&args, &[1, 2], &index);
        route_pinned(&mut core, "filler", &prompt(1000, 32), 1);
        core.mark_prefill_done("filler", s(0));
        route(&mut core, "a", &p(), s(0)).worker_id
    };
    assert_eq!(pick("1"), 1); // 0 + 18 < 10 + 10
    assert_eq!(pick("0"), 2); // 18 > 10
}

#[test]
fn host_and_disk_hits_earn_their_weights() {
    for (tier, flag) in [
        (Tier::HostPinned, "--router-host-cache-hit-weight"),
        (Tier::Disk, "--router-disk-cache-hit-weight"),
    ] {
        let pick = |weight: Option<&str>| {
            let index = Counting::new();
            index.store(1, tier, &p());
            index.store(2, Tier::Device, &p()[..4]);
            let mut args = vec!["--router-mode", "kv"];
            if let Some(weight) = weight {
                args.extend([flag, weight]);
            }
            let mut core = core_with_index(&args, &[1, 2, 3], &index);
            route(&mut core, "a", &p(), s(0)).worker_id
        };
        assert_eq!(pick(None), 1, "{flag} default credits the lower tier");
        assert_eq!(pick(Some("0")), 2, "{flag} 0 ignores the lower tier");
    }
}

#[test]
fn temperature_spreads_choices() {
    let picks = |t: &str| {
        let index = Counting::new();
        index.store(2, Tier::Device, &p());
        let mut core = core_with_index(
            &["--router-mode", "kv", "--router-temperature", t],
            &[1, 2, 3],
            &index,
        );
        (0..30)
            .map(|i| {
                let id = format!("r{i}");
                let worker = route(&mut core, &id, &p(), s(0)).worker_id;
                core.free(&id, TerminalPath::Completed, s(0));
                worker
            })
            .collect::<Vec<u64>>()
    };
    assert!(picks("0").iter().all(|&w| w == 2));
    let warm = picks("1");
    assert!(warm.iter().any(|&w| w != 2) && warm.iter().filter(|&&w| w == 2).count() > 8);
}

#[test]
fn decode_active_request_weight_counts_requests() {
    let picks = |weight: &str| {
        let mut core = core(
            &[
                "--router-mode",
                "kv",
                "--router-decode-active-request-weight",
                weight,
            ],
            &[1, 2],
        );
        route_pinned(&mut core, "x", &[7, 7], 1); // one request, no full block
        core.mark_prefill_done("x", s(0));
        (0..20)
            .map(|i| {
                let id = format!("r{i}");
                let worker = route(&mut core, &id, &prompt(0, 8), s(0)).worker_id;
                core.free(&id, TerminalPath::Completed, s(0));
                worker
            })
            .collect::<Vec<u64>>()
    };
    assert!(picks("5").iter().all(|&w| w == 2));
    assert!(picks("0").contains(&1), "without the weight the two tie");
}

#[test]
fn kv_events_off_uses_the_approximate_index_with_its_ttl() {
    let mut approx = core(
        &[
            "--router-mode",
            "kv",
            "--no-router-kv-events",
            "--router-ttl-secs",
            "5",
        ],
        &[1, 2, 3],
    );
    let first = route(&mut approx, "a", &p(), s(0));
    assert_eq!(approx.approx_blocks(), Some(10));
    approx.free("a", TerminalPath::Completed, s(0));
    let second = route(&mut approx, "b", &p(), s(3));
    assert_eq!(
        (second.worker_id, second.overlap_blocks),
        (first.worker_id, 10)
    );
    approx.free("b", TerminalPath::Completed, s(3));
    // Last insertion at 3 s: expired at 8 s.
    assert_eq!(route(&mut approx, "c", &p(), s(9)).overlap_blocks, 0);
    let mut events = core(&["--router-mode", "kv"], &[1, 2, 3]);
    route(&mut events, "a", &p(), s(0));
    assert_eq!(events.approx_blocks(), None);
}

#[test]
fn a_worker_registered_again_under_its_id_is_recorded_in_the_approximate_index_again() {
    let mut approx = core(&["--router-mode", "kv", "--no-router-kv-events"], &[1]);
    route(&mut approx, "a", &p(), s(0));
    approx.free("a", TerminalPath::Completed, s(0));
    approx.remove_worker(1, s(1));
    assert_eq!(approx.approx_blocks(), Some(0));
    // Its lease came back: the same id registers again.
    approx.upsert_worker(worker(1, None, None), s(2));
    let again = route(&mut approx, "b", &p(), s(2));
    assert_eq!(again.worker_id, 1);
    assert_eq!(approx.approx_blocks(), Some(10), "decisions recorded again");
    approx.free("b", TerminalPath::Completed, s(2));
    assert_eq!(route(&mut approx, "c", &p(), s(3)).overlap_blocks, 10);
}

#[test]
fn max_tree_size_and_prune_ratio_bound_the_approximate_index() {
    let mut small = core(
        &[
            "--router-mode",
            "kv",
            "--no-router-kv-events",
            "--router-max-tree-size",
            "8",
            "--router-prune-target-ratio",
            "0.5",
        ],
        &[1],
    );
    route(&mut small, "a", &p(), s(0));
    assert_eq!(small.approx_blocks(), Some(4));
    let mut ratio = core(
        &[
            "--router-mode",
            "kv",
            "--no-router-kv-events",
            "--router-max-tree-size",
            "8",
            "--router-prune-target-ratio",
            "1",
        ],
        &[1],
    );
    route(&mut ratio, "a", &p(), s(0));
    assert_eq!(ratio.approx_blocks(), Some(8));
}

#[test]
fn lru_policy_bounds_each_rank_by_its_capacity() {
    let blocks = |policy: &str| {
        let mut core = core(
            &[
                "--router-mode",
                "kv",
                "--no-router-kv-events",
                "--router-approximate-cache-policy",
                policy,
            ],
            &[],
        );
        core.upsert_worker(worker(1, None, Some(6)), s(0));
        route(&mut core, "a", &p(), s(0));
        core.approx_blocks()
    };
    assert_eq!(blocks("lru"), Some(6));
    assert_eq!(blocks("ttl"), Some(10));
}

#[test]
fn predicted_side_index_co_locates_a_burst_until_its_ttl() {
    let index = Counting::new(); // the engine has not reported anything yet
    let mut core = core_with_index(
        &["--router-mode", "kv", "--router-predicted-ttl-secs", "5"],
        &[1, 2, 3],
        &index,
    );
    let first = route(&mut core, "a", &p(), s(0));
    core.mark_prefill_done("a", s(0));
    let second = route(&mut core, "b", &p(), s(1));
    assert_eq!(
        (second.worker_id, second.overlap_blocks),
        (first.worker_id, 10)
    );
    assert_eq!(core.predicted_blocks(), Some(10));
    assert_eq!(
        route(&mut core, "c", &p(), s(7)).overlap_blocks,
        0,
        "expired"
    );
    let mut plain = core_with_index(&["--router-mode", "kv"], &[1, 2, 3], &index);
    route(&mut plain, "a", &p(), s(0));
    plain.mark_prefill_done("a", s(0));
    assert_eq!(route(&mut plain, "b", &p(), s(1)).overlap_blocks, 0);
    assert_eq!(plain.predicted_blocks(), None);
}

#[test]
fn load_aware_ignores_the_cache() {
    let index = Counting::new();
    index.store(2, Tier::Device, &p());
    let mut core = core_with_index(&["--load-aware"], &[1, 2, 3], &index);
    assert_eq!(core.config().mode, RouterMode::Kv);
    for i in 0..6 {
        assert_eq!(
            route(&mut core, &format!("r{i}"), &p(), s(0)).overlap_blocks,
            0
        );
    }
    assert_eq!(index.queries(), 0);
    assert_eq!(
        [core.inflight(1), core.inflight(2), core.inflight(3)],
        [2, 2, 2]
    );
}

#[test]
fn encoder_ratio_weights_device_groups() {
    let counts = |ratio: &str| {
        let mut core = core(
            &[
                "--router-mode",
                "device-aware-weighted",
                "--encoder-cuda-to-cpu-ratio",
                ratio,
            ],
            &[],
        );
        core.upsert_worker(WorkerInfo::new(1).with_device_type("cpu"), s(0));
        core.upsert_worker(WorkerInfo::new(2), s(0));
        for i in 0..10 {
            core.route(&RouteRequest::new(format!("r{i}"), &[1]), s(0))
                .unwrap();
        }
        (core.inflight(1), core.inflight(2))
    };
    assert_eq!(counts("1"), (5, 5));
    assert_eq!(counts("8"), (1, 9));
}

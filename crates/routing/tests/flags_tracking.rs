//! Each load-tracking, busy and expiry flag changes behaviour (docs/flags.md, "Router flags").

#[path = "support/helpers.rs"]
mod helpers;

use helpers::*;
use kvmesh_kv::WorkerKey;
use kvmesh_routing::{RouteError, RouteRequest, TerminalPath, WorkerLoad};

const W1: WorkerKey = WorkerKey::new(1, 0);

#[test]
fn track_active_blocks_feeds_the_decode_term() {
    let mut on = core(&["--router-mode", "kv"], &[1]);
    route(&mut on, "a", &prompt(0, 40), s(0));
    assert_eq!(on.load(W1).active_blocks, 10);
    let mut off = core(
        &["--router-mode", "kv", "--no-router-track-active-blocks"],
        &[1, 2],
    );
    route_pinned(&mut off, "a", &prompt(0, 400), 1);
    off.mark_prefill_done("a", s(0));
    assert_eq!(off.load(W1).active_blocks, 0);
    // Worker 1's hundred decode blocks are invisible: ties go either way.
    let picks: Vec<u64> = (0..20)
        .map(|i| {
            let id = format!("r{i}");
            let w = route(&mut off, &id, &prompt(9000, 8), s(0)).worker_id;
            off.free(&id, TerminalPath::Completed, s(0));
            w
        })
        .collect();
    assert!(picks.contains(&1) && picks.contains(&2));
}

#[test]
fn assume_kv_reuse_dedups_shared_prefixes() {
    let blocks = |args: &[&str]| {
        let mut core = core(args, &[1]);
        route(&mut core, "a", &prompt(0, 40), s(0));
        route(&mut core, "b", &prompt(0, 40), s(0));
        core.load(W1).active_blocks
    };
    assert_eq!(blocks(&["--router-mode", "kv"]), 10);
    assert_eq!(
        blocks(&["--router-mode", "kv", "--no-router-assume-kv-reuse"]),
        20
    );
}

#[test]
fn track_output_blocks_grows_load_with_generation() {
    let blocks = |args: &[&str]| {
        let mut core = core(args, &[1]);
        route(&mut core, "a", &prompt(0, 40), s(0));
        core.add_output_tokens("a", 9, s(0)); // ceil(49/4) − ceil(40/4) = 3
        let grown = core.load(W1).active_blocks;
        core.free("a", TerminalPath::Completed, s(0));
        assert_eq!(core.load(W1).active_blocks, 0);
        grown
    };
    assert_eq!(blocks(&["--router-mode", "kv"]), 10);
    assert_eq!(
        blocks(&["--router-mode", "kv", "--router-track-output-blocks"]),
        13
    );
}

#[test]
fn expected_output_length_decays_exclusive_blocks() {
    let mut core = core(
        &["--router-mode", "kv", "--router-track-output-blocks"],
        &[1],
    );
    let tokens = prompt(0, 40);
    let mut request = RouteRequest::new("a", &tokens);
    request.hints.expected_output_tokens = Some(8);
    core.route(&request, s(0)).unwrap();
    core.add_output_tokens("a", 4, s(0)); // one placeholder; 11 exclusive blocks at weight 0.5
    assert_eq!(core.load(W1).active_blocks, 6); // round(11 − 5.5) = 6 (half away from zero)
    core.add_output_tokens("a", 4, s(0)); // 2 placeholders, weight 0
    assert_eq!(core.load(W1).active_blocks, 0);
}

#[test]
fn track_prefill_tokens_counts_uncached_prompt_until_first_token() {
    let mut on = core(&["--router-mode", "kv"], &[1]);
    route(&mut on, "a", &prompt(0, 40), s(0));
    assert_eq!(on.load(W1).prefill_tokens, 40);
    on.mark_prefill_done("a", s(0));
    assert_eq!(on.load(W1).prefill_tokens, 0);
    let mut off = core(
        &["--router-mode", "kv", "--no-router-track-prefill-tokens"],
        &[1],
    );
    route(&mut off, "a", &prompt(0, 40), s(0));
    assert_eq!(off.load(W1).prefill_tokens, 0);
}

#[test]
fn prefill_token_threshold_marks_workers_busy() {
    let mut core = core(
        &[
            "--router-mode",
            "kv",
            "--active-prefill-tokens-threshold",
            "30",
        ],
        &[1, 2],
    );
    route_pinned(&mut core, "a", &prompt(0, 40), 1);
    assert!(core.is_worker_busy(1));
    for i in 0..3 {
        let id = format!("r{i}");
        assert_eq!(route(&mut core, &id, &prompt(100, 8), s(0)).worker_id, 2);
        core.free(&id, TerminalPath::Completed, s(0));
    }
    core.mark_prefill_done("a", s(0));
    assert!(!core.is_worker_busy(1));
    let mut none = self::core(
        &[
            "--router-mode",
            "kv",
            "--active-prefill-tokens-threshold",
            "None",
        ],
        &[1],
    );
    route(&mut none, "a", &prompt(0, 40), s(0));
    assert!(!none.is_worker_busy(1));
}

#[test]
fn prefill_fraction_threshold_uses_max_num_batched_tokens() {
    let mut core = core(
        &[
            "--router-mode",
            "kv",
            "--active-prefill-tokens-threshold-frac",
            "0.5",
        ],
        &[],
    );
    core.upsert_worker(worker(1, Some(60), None), s(0));
    core.upsert_worker(worker(2, None, None), s(0)); // no mnbt: never busy by fraction
    route_pinned(&mut core, "a", &prompt(0, 40), 1); // 40 > 30
    route_pinned(&mut core, "b", &prompt(0, 400), 2);
    assert!(core.is_worker_busy(1));
    assert!(!core.is_worker_busy(2));
}

#[test]
fn decode_threshold_uses_published_load_and_the_projection() {
    let mut core = core(
        &[
            "--router-mode",
            "kv",
            "--active-decode-blocks-threshold",
            "0.5",
        ],
        &[],
    );
    core.upsert_worker(worker(1, None, Some(20)), s(0));
    route(&mut core, "a", &prompt(0, 44), s(0)); // 11 projected blocks > 10
    assert!(core.is_worker_busy(1));
    assert_eq!(
        core.route(&RouteRequest::new("b", &[1]), s(0)),
        Err(RouteError::Overloaded)
    );
    core.free("a", TerminalPath::Cancelled, s(0));
    assert!(!core.is_worker_busy(1));
    core.update_load(
        WorkerLoad {
            worker: W1,
            kv_used_blocks: 11,
            kv_total_blocks: 20,
            ..WorkerLoad::default()
        },
        s(0),
    );
    assert!(
        core.is_worker_busy(1),
        "the engine's own count also sets the latch"
    );
    let mut off = self::core(&["--router-mode", "kv"], &[]);
    off.upsert_worker(worker(1, None, Some(20)), s(0));
    route(&mut off, "a", &prompt(0, 44), s(0));
    assert!(!off.is_worker_busy(1));
}

#[test]
fn active_request_expiry_frees_stale_requests() {
    let tracked_after = |args: &[&str]| {
        let mut core = core(args, &[1]);
        route(&mut core, "a", &prompt(0, 8), s(0));
        core.tick(s(60)); // first sweep
        core.is_tracked("a")
    };
    assert!(!tracked_after(&[
        "--router-mode",
        "kv",
        "--router-active-request-expiry-secs",
        "30"
    ]));
    assert!(tracked_after(&["--router-mode", "kv"]));
}

#[test]
fn replica_sync_publishes_tracker_changes() {
    let mut on = core(&["--router-mode", "kv", "--router-replica-sync"], &[1]);
    route(&mut on, "a", &prompt(0, 8), s(0));
    on.free("a", TerminalPath::Completed, s(0));
    assert_eq!(on.take_sync_events().len(), 2);
    let mut off = core(&["--router-mode", "kv"], &[1]);
    route(&mut off, "a", &prompt(0, 8), s(0));
    assert!(off.take_sync_events().is_empty());
}

#[test]
fn min_initial_workers_gates_readiness() {
    let mut core = core(&["--router-min-initial-workers", "2"], &[1]);
    assert_eq!(
        core.route(&RouteRequest::new("a", &[1]), s(0)),
        Err(RouteError::NotReady)
    );
    core.upsert_worker(worker(2, None, None), s(0));
    assert!(core.route(&RouteRequest::new("a", &[1]), s(0)).is_ok());
}

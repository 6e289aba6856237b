//! Tracker unit tests: reference counting, prefill, output blocks with decay, expiry.

use super::*;

fn key(id: &str) -> ReqKey {
    (Arc::from("r"), id.to_string())
}

fn add(worker: WorkerKey, hashes: Vec<u64>, prefill: u64, osl: Option<u32>, at: u64) -> TrackAdd {
    TrackAdd {
        worker,
        hashes,
        prefill_tokens: prefill,
        isl: 64,
        osl,
        started_at: Duration::from_secs(at),
        session: None,
        owner: None,
    }
}

const W: WorkerKey = WorkerKey::new(1, 0);

#[test]
fn shared_prefixes_count_once_and_free_releases_everything() {
    let mut t = Tracker::default();
    t.add(key("a"), add(W, vec![1, 2, 3], 30, None, 0));
    t.add(key("b"), add(W, vec![1, 2, 4, 5], 20, None, 0));
    assert_eq!(
        t.snapshot(W),
        RankLoadSnapshot {
            active_requests: 2,
            active_blocks: 5,
            prefill_tokens: 50
        }
    );
    assert_eq!(t.inflight(1), 2);
    assert_eq!(t.view(W, &[1, 2, 9, 9]).present, 2);
    assert!(t.free(&key("a")).is_some());
    assert!(t.free(&key("a")).is_none(), "second free is a no-op");
    assert_eq!(t.snapshot(W).active_blocks, 4);
    t.free(&key("b"));
    assert_eq!(t.snapshot(W), RankLoadSnapshot::default());
    assert_eq!(t.inflight(1), 0);
    assert!(t.view(W, &[]).has_entry, "the rank keeps its entry");
    assert_eq!(t.len(), 0);
}

#[test]
fn prefill_is_released_once_at_first_token() {
    let mut t = Tracker::default();
    t.add(key("a"), add(W, vec![1], 30, None, 0));
    assert!(t.mark_prefill_done(&key("a")));
    assert!(!t.mark_prefill_done(&key("a")));
    assert_eq!(t.prefill_tokens(W), 0);
    t.free(&key("a"));
    assert_eq!(t.prefill_tokens(W), 0);
}

#[test]
fn re_adding_a_key_replaces_the_old_entry() {
    let mut t = Tracker::default();
    t.add(key("a"), add(W, vec![1, 2], 10, None, 0));
    t.add(key("a"), add(WorkerKey::new(2, 0), vec![7], 5, None, 0));
    assert_eq!(t.snapshot(W), RankLoadSnapshot::default());
    assert_eq!(t.len(), 1);
    assert_eq!(t.inflight(2), 1);
}

#[test]
fn output_blocks_grow_with_generation() {
    let mut rng = Rng::new(1);
    let mut t = Tracker::default();
    // isl 64, block 16 → ceil 4; output blocks appear at 65, 81, ...
    t.add(key("a"), add(W, vec![1, 2, 3, 4], 0, None, 0));
    t.add_output_tokens(&key("a"), 1, 16, true, &mut rng);
    assert_eq!(t.active_blocks(W), 5);
    t.add_output_tokens(&key("a"), 15, 16, true, &mut rng);
    assert_eq!(t.active_blocks(W), 5);
    t.add_output_tokens(&key("a"), 1, 16, true, &mut rng);
    assert_eq!(t.active_blocks(W), 6);
    // Without output tracking nothing grows.
    t.add_output_tokens(&key("a"), 100, 16, false, &mut rng);
    assert_eq!(t.active_blocks(W), 6);
    t.free(&key("a"));
    assert_eq!(t.active_blocks(W), 0);
}

#[test]
fn reported_output_beyond_any_context_is_bounded() {
    let mut rng = Rng::new(1);
    let mut t = Tracker::default();
    t.add(key("a"), add(W, vec![1, 2, 3, 4], 0, None, 0));
    t.add_output_tokens(&key("a"), u64::MAX, 16, true, &mut rng);
    t.add_output_tokens(&key("a"), u64::MAX, 16, true, &mut rng);
    // 4 prompt blocks and placeholders up to the cap, in 16-token blocks.
    assert_eq!(t.active_blocks(W), MAX_TRACKED_SEQUENCE_TOKENS / 16);
    t.free(&key("a"));
    assert_eq!(t.active_blocks(W), 0);
}

#[test]
fn exclusive_blocks_decay_with_expected_output() {
    let mut rng = Rng::new(1);
    let mut t = Tracker::default();
    // "a" shares blocks 1, 2 with "b"; its exclusive suffix is 3, 4.
    t.add(key("a"), add(W, vec![1, 2, 3, 4], 0, Some(10), 0));
    t.add(key("b"), add(W, vec![1, 2, 9], 0, None, 0));
    assert_eq!(t.active_blocks(W), 5);
    // Half way through osl: a's exclusive blocks (2 prompt + 0 placeholders) weigh 0.5.
    t.add_output_tokens(&key("a"), 5, 16, true, &mut rng);
    // generated 5 → ceil(69/16)=5 → one placeholder; exclusive = 3, weight 0.5 → 6 − 1.5.
    assert_eq!(t.active_blocks(W), 5); // round(4.5) = 5 (half away from zero)
    t.add_output_tokens(&key("a"), 5, 16, true, &mut rng);
    // generated 10 ≥ osl: exclusive weigh 0; distinct = 6, exclusive = 3 → 3.
    assert_eq!(t.active_blocks(W), 3);
}

#[test]
fn expiry_frees_old_requests_only() {
    let mut t = Tracker::default();
    t.add(key("old"), add(W, vec![1], 10, None, 0));
    t.add(key("new"), add(W, vec![2], 10, None, 100));
    let expired = t.expire(Duration::from_secs(50));
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].0, key("old"));
    assert_eq!(t.snapshot(W).active_requests, 1);
    assert_eq!(t.snapshot(W).prefill_tokens, 10);
}

#[test]
fn removing_a_worker_frees_its_requests() {
    let mut t = Tracker::default();
    t.add(key("a"), add(W, vec![1], 10, None, 0));
    t.add(key("b"), add(WorkerKey::new(1, 1), vec![1], 10, None, 0));
    t.add(key("c"), add(WorkerKey::new(2, 0), vec![1], 10, None, 0));
    let freed = t.remove_worker(1);
    assert_eq!(freed.len(), 2);
    assert_eq!(t.inflight(1), 0);
    assert!(!t.view(W, &[]).has_entry);
    assert_eq!(t.len(), 1);
}

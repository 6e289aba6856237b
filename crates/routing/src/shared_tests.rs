//! The shared router: guards release on every path, queued requests resolve or cancel.

use super::*;
use crate::clock::ManualClock;
use crate::config::RouterConfig;
use crate::worker::RuntimeConfig;

fn shared(queue: bool) -> (SharedRouter, Arc<ManualClock>) {
    let mut config = RouterConfig::with_mode(RouterMode::Kv);
    if queue {
        config.queue_threshold = Some(0.5);
    }
    let mut core = RouterCore::new(config, "m", 4, 3).unwrap();
    core.upsert_worker(
        WorkerInfo::new(1).with_runtime(RuntimeConfig {
            max_num_batched_tokens: Some(100),
            ..RuntimeConfig::default()
        }),
        Duration::ZERO,
    );
    let clock = Arc::new(ManualClock::new(Duration::ZERO));
    (SharedRouter::new(core, clock.clone()), clock)
}

fn load(router: &SharedRouter) -> (usize, u32) {
    router.with_core(|core, _| (core.num_tracked(), core.inflight(1)))
}

#[tokio::test]
async fn every_guard_path_releases_load() {
    let (router, _) = shared(false);
    let tokens: Vec<u32> = (0..80).collect();
    for path in TerminalPath::ALL {
        let guard = router
            .route(&RouteRequest::new("a", &tokens))
            .await
            .unwrap();
        guard.first_token();
        guard.add_output_tokens(3);
        assert_eq!(load(&router), (1, 1));
        guard.finish(path);
        assert_eq!(load(&router), (0, 0), "{path:?}");
    }
    // Dropped without finishing (client disconnect, panic, early return).
    let guard = router
        .route(&RouteRequest::new("b", &tokens))
        .await
        .unwrap();
    drop(guard);
    assert_eq!(load(&router), (0, 0));
    // Detached: the caller releases by id.
    let decision = router
        .route(&RouteRequest::new("c", &tokens))
        .await
        .unwrap()
        .detach();
    assert_eq!(decision.request_id, "c");
    assert_eq!(load(&router), (1, 1));
    assert!(router.free("c", TerminalPath::Completed));
    assert_eq!(load(&router), (0, 0));
}

#[tokio::test]
async fn queued_requests_resolve_when_capacity_frees() {
    let (router, _) = shared(true);
    let tokens: Vec<u32> = (0..80).collect();
    let first = router
        .route(&RouteRequest::new("a", &tokens))
        .await
        .unwrap();
    let Admission::Queued(queued) = router.try_route(&RouteRequest::new("b", &tokens)).unwrap()
    else {
        panic!("expected the second request to park");
    };
    assert_eq!(router.queue_len(), 1);
    first.first_token(); // prefill done: capacity frees and "b" leaves the queue
    let second = queued.await.unwrap();
    assert_eq!(second.decision().request_id, "b");
    assert_eq!(router.queue_len(), 0);
    drop(first);
    drop(second);
    assert_eq!(load(&router), (0, 0));
}

#[tokio::test]
async fn dropping_a_queued_request_removes_it_or_frees_it() {
    let (router, _) = shared(true);
    let tokens: Vec<u32> = (0..80).collect();
    let first = router
        .route(&RouteRequest::new("a", &tokens))
        .await
        .unwrap();
    let Admission::Queued(queued) = router.try_route(&RouteRequest::new("b", &tokens)).unwrap()
    else {
        panic!("expected to park");
    };
    drop(queued); // client disconnect while parked
    assert_eq!(router.queue_len(), 0);
    // Parked, dispatched, but never received: the undelivered guard frees itself.
    let Admission::Queued(queued) = router.try_route(&RouteRequest::new("c", &tokens)).unwrap()
    else {
        panic!("expected to park");
    };
    first.first_token();
    assert_eq!(load(&router), (2, 2), "c dispatched and tracked");
    drop(queued);
    drop(first);
    assert_eq!(load(&router), (0, 0));
}

/// A router whose queue holds at most two requests for at most one second.
fn bounded() -> (SharedRouter, Arc<ManualClock>) {
    let mut config = RouterConfig::with_mode(RouterMode::Kv);
    config.queue_threshold = Some(0.5);
    config.queue_max_len = 2;
    config.queue_max_wait = Some(Duration::from_secs(1));
    let mut core = RouterCore::new(config, "m", 4, 3).unwrap();
    core.upsert_worker(
        WorkerInfo::new(1).with_runtime(RuntimeConfig {
            max_num_batched_tokens: Some(100),
            ..RuntimeConfig::default()
        }),
        Duration::ZERO,
    );
    let clock = Arc::new(ManualClock::new(Duration::ZERO));
    (SharedRouter::new(core, clock.clone()), clock)
}

fn park(router: &SharedRouter, id: &str, tokens: &[u32]) -> QueuedRoute {
    match router.try_route(&RouteRequest::new(id, tokens)) {
        Ok(Admission::Queued(queued)) => queued,
        other => panic!("expected {id} to park, got {other:?}"),
    }
}

#[tokio::test]
async fn a_full_queue_refuses_as_overloaded() {
    let (router, _) = bounded();
    let tokens: Vec<u32> = (0..80).collect();
    let first = router
        .route(&RouteRequest::new("a", &tokens))
        .await
        .unwrap();
    let b = park(&router, "b", &tokens);
    let c = park(&router, "c", &tokens);
    let refused = router.try_route(&RouteRequest::new("d", &tokens));
    assert!(
        matches!(refused, Err(RouteError::Overloaded)),
        "{refused:?}"
    );
    assert_eq!(router.queue_len(), 2);
    assert_eq!(load(&router), (1, 1), "the refused request holds no load");
    // Room again once the head leaves.
    first.first_token();
    let second = b.await.unwrap();
    let e = park(&router, "e", &tokens);
    drop((second, c, e, first));
    assert_eq!(router.queue_len(), 0);
    assert_eq!(load(&router), (0, 0));
}

#[tokio::test]
async fn a_request_parked_past_the_wait_limit_is_refused_without_leaking_load() {
    let (router, clock) = bounded();
    let tokens: Vec<u32> = (0..80).collect();
    let first = router
        .route(&RouteRequest::new("a", &tokens))
        .await
        .unwrap();
    let b = park(&router, "b", &tokens);
    clock.advance(Duration::from_millis(600));
    let c = park(&router, "c", &tokens);
    clock.advance(Duration::from_millis(500));
    router.tick();
    assert!(matches!(b.await, Err(RouteError::Overloaded)));
    assert_eq!(router.queue_len(), 1, "c has waited 0.5 s only");
    clock.advance(Duration::from_millis(600));
    router.tick();
    assert!(matches!(c.await, Err(RouteError::Overloaded)));
    assert_eq!(router.queue_len(), 0);
    assert_eq!(load(&router), (1, 1), "only the routed request is tracked");
    drop(first);
    assert_eq!(load(&router), (0, 0));
}

#[tokio::test]
async fn the_clock_drives_expiry() {
    let (router, clock) = shared(false);
    let tokens: Vec<u32> = (0..8).collect();
    let guard = router
        .route(&RouteRequest::new("a", &tokens))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(400));
    router.tick();
    assert_eq!(load(&router), (0, 0));
    guard.finish(TerminalPath::Completed); // a late release is harmless
    assert_eq!(load(&router), (0, 0));
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<SharedRouter>();
    send::<RouteGuard>();
    send::<QueuedRoute>();
    send::<RouterCore>();
}

#[test]
fn a_later_turn_reuses_the_block_hashes_of_its_known_prefix() {
    let (router, _) = shared(false);
    let first: Vec<u32> = (0..400).collect();
    let first_cuts = [kvmesh_core::prefix::PrefixCut {
        key: 11,
        tokens: 398,
    }];
    let mut request = RouteRequest::new("t1", &first);
    request.prefix_cuts = &first_cuts;
    let whole = PreparedRequest::new(&request, 4, true);
    assert_eq!(router.prepare(&request), whole);

    let mut second = first[..398].to_vec();
    second.extend(9000..9100);
    let second_cuts = [
        first_cuts[0],
        kvmesh_core::prefix::PrefixCut {
            key: 12,
            tokens: 490,
        },
    ];
    let mut request = RouteRequest::new("t2", &second);
    request.prefix_cuts = &second_cuts;
    assert_eq!(
        router.prepare(&request),
        PreparedRequest::new(&request, 4, true)
    );
    let stats = router.hash_cache_stats().unwrap();
    assert_eq!((stats.hits, stats.misses, stats.reused), (1, 1, 398 / 4));
}

#[test]
fn without_a_cache_bound_nothing_is_kept() {
    let mut config = RouterConfig::with_mode(RouterMode::Kv);
    config.kv.block_hash_cache_bytes = 0;
    let core = RouterCore::new(config, "m", 4, 3).unwrap();
    let router = SharedRouter::new(core, Arc::new(ManualClock::new(Duration::ZERO)));
    assert!(router.hash_cache_stats().is_none());
}

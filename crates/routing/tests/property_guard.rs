//! The property test through the concurrent wrapper: requests held as [`RouteGuard`]s end by
//! every terminal path — including being dropped — and parked requests are awaited or abandoned;
//! afterwards nothing is tracked, parked or in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use clap::ValueEnum;
use kvmesh_routing::{
    Admission, BusyThresholds, Clock, ManualClock, QueuedRoute, RankLoadSnapshot, Rng, RouteGuard,
    RouteRequest, RouterConfig, RouterCore, RouterMode, RoutingHints, RuntimeConfig, SharedRouter,
    TerminalPath, WorkerInfo,
};
use proptest::prelude::*;

/// Every routing mode (a new one is covered without editing this test).
fn modes() -> &'static [RouterMode] {
    RouterMode::value_variants()
}

/// The wait limit of runs that set one.
const QUEUE_MAX_WAIT: Duration = Duration::from_millis(100);

fn router(
    mode: RouterMode,
    workers: u64,
    bits: &[bool],
    seed: u64,
) -> (SharedRouter, Arc<ManualClock>) {
    let mut config = RouterConfig::with_mode(mode);
    config.queue_threshold = bits[0].then_some(0.5);
    config.session_affinity_ttl = bits[1].then(|| Duration::from_secs(5));
    config.kv.track_output_blocks = bits[2];
    config.kv.use_kv_events = !bits[3];
    if bits[5] {
        config.queue_max_len = 3;
    }
    if bits[6] {
        config.queue_max_wait = Some(QUEUE_MAX_WAIT);
    }
    if bits[4] {
        config.busy = BusyThresholds {
            active_prefill_tokens_threshold: Some(300),
            ..BusyThresholds::default()
        };
    }
    let mut core = RouterCore::new(config, "m", 4, seed).unwrap_or_else(|e| panic!("{e}"));
    for id in 1..=workers {
        let runtime = RuntimeConfig {
            max_num_batched_tokens: Some(200),
            total_kv_blocks: Some(500),
            ..RuntimeConfig::default()
        };
        core.upsert_worker(WorkerInfo::new(id).with_runtime(runtime), Duration::ZERO);
    }
    let clock = Arc::new(ManualClock::new(Duration::ZERO));
    (SharedRouter::new(core, clock.clone()), clock)
}

fn poll(queued: &mut QueuedRoute) -> Option<Option<RouteGuard>> {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(queued).poll(&mut cx) {
        Poll::Ready(result) => Some(result.ok()),
        Poll::Pending => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn guards_release_on_every_path(
        mode in 0..modes().len(),
        workers in 1u64..=4,
        bits in proptest::collection::vec(any::<bool>(), 7),
        seed in any::<u64>(),
        steps in 100usize..800,
    ) {
        let (router, clock) = router(modes()[mode], workers, &bits, seed);
        let mut rng = Rng::new(seed);
        let mut guards: Vec<RouteGuard> = Vec::new();
        let mut queued: Vec<(QueuedRoute, Duration)> = Vec::new();
        for step in 0..steps {
            clock.advance(Duration::from_millis(rng.below(20) as u64));
            match rng.below(10) {
                0..=3 => {
                    let tokens: Vec<u32> = (0..4 + rng.below(120)).map(|_| rng.next_u64() as u32).collect();
                    let mut hints = RoutingHints {
                        session_id: (rng.below(2) == 0).then(|| format!("s{}", rng.below(4))),
                        ..RoutingHints::default()
                    };
                    if modes()[mode] == RouterMode::Direct {
                        hints.backend_instance_id = Some(1 + rng.below(workers as usize) as u64);
                    }
                    let request = RouteRequest::new(format!("r{step}"), &tokens).with_hints(hints);
                    match router.try_route(&request) {
                        Ok(Admission::Routed(guard)) => guards.push(guard),
                        Ok(Admission::Queued(q)) => queued.push((q, clock.now())),
                        Err(_) => {}
                    }
                }
                4 | 5 if !guards.is_empty() => {
                    let guard = &guards[rng.below(guards.len())];
                    guard.add_output_tokens(1 + rng.below(10) as u64);
                }
                6 | 7 if !guards.is_empty() => {
                    let guard = guards.swap_remove(rng.below(guards.len()));
                    match rng.below(TerminalPath::ALL.len() + 1) {
                        i if i < TerminalPath::ALL.len() => guard.finish(TerminalPath::ALL[i]),
                        _ => drop(guard),
                    }
                }
                8 if !queued.is_empty() => {
                    let index = rng.below(queued.len());
                    if rng.below(4) == 0 {
                        drop(queued.swap_remove(index)); // client gone while parked
                    } else if let Some(result) = poll(&mut queued[index].0) {
                        queued.swap_remove(index);
                        guards.extend(result);
                    }
                }
                _ => {
                    router.tick();
                    // Past the wait limit, every waiter has its answer.
                    let now = clock.now();
                    for (q, parked_at) in &mut queued {
                        if bits[6] && now.saturating_sub(*parked_at) > QUEUE_MAX_WAIT {
                            prop_assert!(poll(q).is_some(), "parked past the wait limit");
                        }
                    }
                    queued.retain(|(_, parked_at)| !(bits[6] && now.saturating_sub(*parked_at) > QUEUE_MAX_WAIT));
                }
            }
            if bits[5] {
                prop_assert!(router.queue_len() <= 3, "queue past its length limit");
            }
        }
        // Everything still held ends now: guards dropped or finished, waiters abandoned or served.
        loop {
            if let Some(guard) = guards.pop() {
                guard.finish(TerminalPath::Completed); // may let parked requests go
                continue;
            }
            if queued.is_empty() {
                break;
            }
            for (mut q, _) in queued.drain(..) {
                if let Some(result) = poll(&mut q) {
                    guards.extend(result);
                } // a waiter still pending is dropped: it leaves the queue
            }
        }
        router.with_core(|core, _| {
            assert_eq!(core.num_tracked(), 0);
            assert_eq!(core.queue_len(), 0);
            for worker in 1..=workers {
                assert_eq!(core.inflight(worker), 0);
            }
            for key in core.tracked_ranks() {
                assert_eq!(core.load(key), RankLoadSnapshot::default());
            }
        });
    }
}

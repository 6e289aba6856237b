//! Core unit tests: modes, filters, pins, readiness, errors, sync events, expiry, departures.

use std::sync::RwLock;

use kvmesh_kv::{KvEvent, KvEventBatch, KvEventKind, KvStored, KvStoredBlock, RadixIndex, Tier};

use super::*;
use crate::config::BusyThresholds;
use crate::error::RouteError;
use crate::request::{Decision, RouteOutcome, TerminalPath};
use crate::worker::RuntimeConfig;

const B: u32 = 4;
const T0: Duration = Duration::ZERO;

fn core(mode: RouterMode, workers: &[u64]) -> RouterCore {
    let mut core = RouterCore::new(RouterConfig::with_mode(mode), "m", B, 1).unwrap();
    for &id in workers {
        core.upsert_worker(WorkerInfo::new(id), T0);
    }
    core
}

fn routed(outcome: Result<RouteOutcome, RouteError>) -> Decision {
    match outcome {
        Ok(RouteOutcome::Routed(decision)) => decision,
        other => panic!("expected a decision, got {other:?}"),
    }
}

fn route(core: &mut RouterCore, id: &str, tokens: &[u32]) -> Decision {
    routed(core.route(&RouteRequest::new(id, tokens), T0))
}

fn pinned(
    id: &str,
    tokens: &[u32],
    worker: Option<u64>,
    rank: Option<u32>,
) -> RouteRequest<'static> {
    let tokens: &'static [u32] = Vec::leak(tokens.to_vec());
    RouteRequest::new(id, tokens).with_hints(RoutingHints {
        backend_instance_id: worker,
        dp_rank: rank,
        ..RoutingHints::default()
    })
}

fn stored(worker_id: u64, tokens: &[u32]) -> KvEventBatch {
    let local =
        kvmesh_kv::compute_block_hashes(tokens, B as usize, kvmesh_kv::seed_for(None, None));
    let seq = kvmesh_kv::compute_seq_hashes(&local);
    KvEventBatch {
        worker_id,
        dp_rank: 0,
        events: vec![KvEvent {
            event_id: 0,
            tier: Tier::Device,
            kind: KvEventKind::Stored(KvStored {
                parent_hash: None,
                blocks: seq
                    .iter()
                    .zip(&local)
                    .map(|(&s, &l)| KvStoredBlock::new(s, l))
                    .collect(),
                start_position: None,
            }),
        }],
        ..KvEventBatch::default()
    }
}

#[test]
fn round_robin_cycles_over_sorted_ids() {
    let mut core = core(RouterMode::RoundRobin, &[30, 10, 20]);
    let picks: Vec<u64> = (0..6)
        .map(|i| route(&mut core, &format!("r{i}"), &[1, 2]).worker_id)
        .collect();
    assert_eq!(picks, vec![10, 20, 30, 10, 20, 30]);
    assert_eq!(core.inflight(10), 2);
}

#[test]
fn least_loaded_and_power_of_two_follow_in_flight_counts() {
    let mut core = core(RouterMode::LeastLoaded, &[1, 2, 3]);
    for i in 0..9 {
        route(&mut core, &format!("r{i}"), &[1]);
    }
    assert_eq!(
        [core.inflight(1), core.inflight(2), core.inflight(3)],
        [3, 3, 3]
    );
    core.free("r0", TerminalPath::Completed, T0);
    let freed_worker = (1..=3).find(|&w| core.inflight(w) == 2).unwrap();
    assert_eq!(route(&mut core, "x", &[1]).worker_id, freed_worker);

    let mut p2c = self::core(RouterMode::PowerOfTwo, &[1, 2]);
    route(&mut p2c, "a", &[1]);
    let first = if p2c.inflight(1) == 1 { 1 } else { 2 };
    assert_ne!(route(&mut p2c, "b", &[1]).worker_id, first);
}

#[test]
fn device_aware_prefers_accelerators_by_ratio() {
    let mut core = core(RouterMode::DeviceAwareWeighted, &[]);
    core.upsert_worker(WorkerInfo::new(1).with_device_type("cpu"), T0);
    core.upsert_worker(WorkerInfo::new(2), T0);
    // gpu load = n / 8 stays below cpu load 0 only while n == 0 ... cpu only when strictly lower.
    let picks: Vec<u64> = (0..10)
        .map(|i| route(&mut core, &format!("r{i}"), &[1]).worker_id)
        .collect();
    // 0 vs 0 → gpu; then cpu 0 < 1/8 → cpu; then cpu 1 vs gpu 1/8 → gpu ... until gpu reaches 8.
    assert_eq!(picks[0], 2);
    assert_eq!(picks[1], 1);
    assert_eq!(picks.iter().filter(|&&w| w == 2).count(), 9);
}

#[test]
fn direct_mode_needs_an_existing_target() {
    let mut core = core(RouterMode::Direct, &[5]);
    let error = core.route(&RouteRequest::new("a", &[1]), T0).unwrap_err();
    assert!(matches!(error, RouteError::BadRequest(_)));
    assert_eq!(error.http_status(529), 400);
    assert_eq!(
        core.route(&pinned("b", &[1], Some(6), None), T0),
        Err(RouteError::NoEndpoint)
    );
    assert_eq!(
        core.route(&pinned("c", &[1], Some(5), Some(3)), T0),
        Err(RouteError::NoEndpoint)
    );
    let d = routed(core.route(&pinned("d", &[1], Some(5), Some(0)), T0));
    assert_eq!((d.worker_id, d.dp_rank), (5, Some(0)));
    assert_eq!(core.inflight(5), 1);
}

#[test]
fn pins_and_allowed_ids_restrict_other_modes() {
    let mut core = core(RouterMode::RoundRobin, &[1, 2, 3]);
    for i in 0..4 {
        let d = routed(core.route(&pinned(&format!("p{i}"), &[1], Some(2), None), T0));
        assert_eq!(d.worker_id, 2);
    }
    let mut request = RouteRequest::new("a", &[1]);
    request.hints.allowed_worker_ids = Some(vec![3]);
    assert_eq!(routed(core.route(&request, T0)).worker_id, 3);
    request.request_id = "b".into();
    request.hints.backend_instance_id = Some(1);
    assert_eq!(core.route(&request, T0), Err(RouteError::NoEndpoint));
}

#[test]
fn kv_mode_expands_ranks_and_skips_workers_without_runtime_config() {
    let mut core = core(RouterMode::Kv, &[]);
    core.upsert_worker(
        WorkerInfo::new(1).with_runtime(RuntimeConfig {
            data_parallel_start_rank: 2,
            data_parallel_size: 2,
            ..RuntimeConfig::default()
        }),
        T0,
    );
    core.upsert_worker(
        WorkerInfo {
            runtime: None,
            ..WorkerInfo::new(2)
        },
        T0,
    );
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..20 {
        let d = route(&mut core, &format!("r{i}"), &[i, i + 1, i + 2, i + 3]);
        seen.insert((d.worker_id, d.dp_rank));
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        vec![(1, Some(2)), (1, Some(3))]
    );
    // Outside kv mode the worker without runtime config is a candidate.
    let mut rr = self::core(RouterMode::RoundRobin, &[]);
    rr.upsert_worker(
        WorkerInfo {
            runtime: None,
            ..WorkerInfo::new(2)
        },
        T0,
    );
    assert_eq!(route(&mut rr, "a", &[1]).worker_id, 2);
}

#[test]
fn kv_mode_follows_the_index_and_reports_overlap() {
    let prompt: Vec<u32> = (0..40).collect();
    let mut index = RadixIndex::new();
    index.apply(&stored(2, &prompt[..24]));
    let source: Arc<dyn crate::OverlapSource> = Arc::new(RwLock::new(index));
    let mut core = core(RouterMode::Kv, &[1, 2, 3]).with_overlap_source(source);
    let d = route(&mut core, "a", &prompt);
    assert_eq!(d.worker_id, 2);
    assert_eq!(d.overlap_blocks, 6);
    assert_eq!(d.cached_tokens, 24);
    assert_eq!(d.required_blocks, 10);
    // Prefill tracked is the uncached part.
    assert_eq!(core.load(WorkerKey::new(2, 0)).prefill_tokens, 16);
    assert_eq!(core.load(WorkerKey::new(2, 0)).active_blocks, 10);
}

#[test]
fn readiness_waits_for_workers_with_runtime_config() {
    let mut config = RouterConfig::with_mode(RouterMode::Random);
    config.min_initial_workers = 2;
    let mut core = RouterCore::new(config, "m", B, 1).unwrap();
    core.upsert_worker(WorkerInfo::new(1), T0);
    core.upsert_worker(
        WorkerInfo {
            runtime: None,
            ..WorkerInfo::new(2)
        },
        T0,
    );
    assert!(!core.is_ready());
    assert_eq!(
        core.route(&RouteRequest::new("a", &[1]), T0),
        Err(RouteError::NotReady)
    );
    core.upsert_worker(WorkerInfo::new(3), T0);
    assert!(core.is_ready());
    route(&mut core, "b", &[1]);
}

#[test]
fn all_busy_is_overloaded_and_a_busy_pin_is_never_rerouted() {
    let mut core = core(RouterMode::RoundRobin, &[1, 2]);
    core.set_busy_thresholds(BusyThresholds {
        active_decode_blocks_threshold: Some(0.5),
        ..BusyThresholds::default()
    });
    let load = |id, used| WorkerLoad {
        worker: WorkerKey::new(id, 0),
        kv_used_blocks: used,
        kv_total_blocks: 100,
        ..WorkerLoad::default()
    };
    core.update_load(load(1, 90), T0);
    assert!(core.is_worker_busy(1));
    assert_eq!(
        core.route(&pinned("a", &[1], Some(1), None), T0),
        Err(RouteError::Overloaded)
    );
    for i in 0..3 {
        assert_eq!(route(&mut core, &format!("r{i}"), &[1]).worker_id, 2);
    }
    core.update_load(load(2, 51), T0);
    assert_eq!(
        core.route(&RouteRequest::new("x", &[1]), T0),
        Err(RouteError::Overloaded)
    );
    core.update_load(load(1, 50), T0);
    assert_eq!(route(&mut core, "y", &[1]).worker_id, 1);
    // Thresholds off: nobody is busy.
    core.set_busy_thresholds(BusyThresholds::default());
    assert!(!core.is_worker_busy(2));
}

#[test]
fn an_old_published_load_stops_counting_for_busy_detection() {
    let mut core = core(RouterMode::RoundRobin, &[1]);
    core.set_busy_thresholds(BusyThresholds {
        active_decode_blocks_threshold: Some(0.5),
        ..BusyThresholds::default()
    });
    core.update_load(
        WorkerLoad {
            worker: WorkerKey::new(1, 0),
            kv_used_blocks: 90,
            kv_total_blocks: 100,
            ..WorkerLoad::default()
        },
        T0,
    );
    let at = |secs| T0 + Duration::from_secs(secs);
    assert_eq!(
        core.route(&RouteRequest::new("a", &[1]), at(1)),
        Err(RouteError::Overloaded)
    );
    assert_eq!(
        core.route(&RouteRequest::new("a", &[1]), at(4)),
        Err(RouteError::Overloaded),
        "within {PUBLISHED_LOAD_TTL:?}"
    );
    // No newer figure for longer than the TTL: the engine went idle after its last pass.
    assert!(matches!(
        core.route(&RouteRequest::new("b", &[1]), at(6)),
        Ok(RouteOutcome::Routed(_))
    ));
}

#[test]
fn sync_events_replay_on_a_replica() {
    let mut config = RouterConfig::with_mode(RouterMode::Kv);
    config.replica_sync = true;
    let make = |id: &str| {
        let mut core = RouterCore::new(config.clone(), "m", B, 7)
            .unwrap()
            .with_router_id(id);
        core.upsert_worker(WorkerInfo::new(1), T0);
        core
    };
    let (mut a, mut b) = (make("a"), make("b"));
    let prompt: Vec<u32> = (0..16).collect();
    route(&mut a, "r1", &prompt);
    a.mark_prefill_done("r1", T0);
    let events = a.take_sync_events();
    assert_eq!(events.len(), 2);
    for event in &events {
        b.apply_sync_event(event, T0);
        a.apply_sync_event(event, T0); // own events are ignored
    }
    let w = WorkerKey::new(1, 0);
    assert_eq!(b.load(w), a.load(w));
    assert_eq!(b.load(w).active_blocks, 4);
    a.free("r1", TerminalPath::Completed, T0);
    for event in a.take_sync_events() {
        assert_eq!(
            event.kind,
            SyncKind::Free {
                path: TerminalPath::Completed
            }
        );
        b.apply_sync_event(&event, T0);
    }
    assert_eq!(b.load(w).active_requests, 0);
    assert_eq!(b.num_tracked(), 0);
    // Unknown workers are rejected.
    let mut unknown = events[0].clone();
    unknown.worker = WorkerKey::new(99, 0);
    b.apply_sync_event(&unknown, T0);
    assert_eq!(b.num_tracked(), 0);
    // Without replica sync nothing is recorded.
    let mut plain = core(RouterMode::Kv, &[1]);
    route(&mut plain, "r", &prompt);
    assert!(plain.take_sync_events().is_empty());
}

#[test]
fn stale_requests_expire_on_the_sweep() {
    let mut core = core(RouterMode::Kv, &[1]);
    route(&mut core, "old", &[1, 2, 3, 4]);
    let s = Duration::from_secs;
    core.tick(s(299)); // a sweep runs; the request is not yet 300 s old
    assert!(core.is_tracked("old"));
    core.tick(s(358)); // older than 300 s, but the next sweep is due at 359 s
    assert!(core.is_tracked("old"));
    core.tick(s(359));
    assert!(!core.is_tracked("old"));
    assert_eq!(core.load(WorkerKey::new(1, 0)), RankLoadSnapshot::default());
    assert!(!core.free("old", TerminalPath::Completed, s(360)));
}

#[test]
fn departed_workers_release_their_load() {
    let mut core = core(RouterMode::RoundRobin, &[1, 2]);
    route(&mut core, "a", &[1]);
    route(&mut core, "b", &[1]);
    core.remove_worker(1, T0);
    assert_eq!(core.inflight(1), 0);
    assert!(!core.free("a", TerminalPath::Error, T0));
    assert!(core.free("b", TerminalPath::Completed, T0));
    assert_eq!(route(&mut core, "c", &[1]).worker_id, 2);
}

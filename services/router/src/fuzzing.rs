//! Entry points of the router's fuzz targets in `fuzz/` and of their corpus replay
//! (docs/security.md, "Fuzzing"): worker load reports and replica-sync events, as anyone who can
//! publish on `kvmesh.{ns}.load.{model}` or `kvmesh.{ns}.router.{model}` can send them.

use std::time::Duration;

use kvmesh_kv::WorkerKey;
use kvmesh_proto::v1 as pb;
use kvmesh_routing::config::{BusyThresholds, RouterConfig, RouterMode};
use kvmesh_routing::request::{RouteOutcome, RouteRequest, TerminalPath};
use kvmesh_routing::worker::{RuntimeConfig, WorkerInfo};
use kvmesh_routing::{RankLoadSnapshot, RouteError, RouterCore};
use prost::Message;

use crate::wire::{load_from_proto, sync_from_proto};

/// The workers the fuzzed router knows; inputs may name others.
const WORKERS: [u64; 3] = [1, 2, 3];

/// Time between two messages.
const STEP: Duration = Duration::from_millis(10);

/// A kv-mode router with busy thresholds (so load reports matter) over [`WORKERS`].
fn router(replica_sync: bool) -> RouterCore {
    let mut config = RouterConfig::with_mode(RouterMode::Kv);
    config.replica_sync = replica_sync;
    config.busy = BusyThresholds {
        active_decode_blocks_threshold: Some(0.9),
        active_prefill_tokens_threshold: Some(2048),
        active_prefill_tokens_threshold_frac: Some(4.0),
    };
    let core = match RouterCore::new(config, "m", 16, 1) {
        Ok(core) => core,
        Err(error) => panic!("fuzz router: {error}"),
    };
    let mut core = core.with_router_id("fuzz-self");
    for id in WORKERS {
        let info = WorkerInfo::new(id).with_runtime(RuntimeConfig {
            max_num_batched_tokens: Some(256),
            total_kv_blocks: Some(64),
            ..RuntimeConfig::default()
        });
        core.upsert_worker(info, Duration::ZERO);
    }
    core
}

/// Routes one request of this router and frees it; a router may refuse it only as overloaded.
fn route_and_free(core: &mut RouterCore, request_id: &str, now: Duration) {
    let tokens: Vec<u32> = (0..48).collect();
    match core.route(&RouteRequest::new(request_id, &tokens), now) {
        Ok(RouteOutcome::Routed(decision)) => {
            assert!(WORKERS.contains(&decision.worker_id), "{decision:?}");
            core.free(request_id, TerminalPath::Completed, now);
        }
        Ok(RouteOutcome::Queued(_)) => panic!("no queue is configured"),
        Err(RouteError::Overloaded) => {}
        Err(error) => panic!("routing failed: {error}"),
    }
}

/// Length-delimited `kvmesh.v1.WorkerLoad` messages, each applied as the load feed applies one.
/// After each, a request routes (or is refused as overloaded) and, once freed, leaves no load
/// behind: a load report steers busy detection, never the tracker.
pub fn worker_loads(mut messages: &[u8]) {
    let mut core = router(false);
    let mut now = Duration::ZERO;
    let mut num_messages = 0u32;
    while !messages.is_empty() {
        let Ok(message) = pb::WorkerLoad::decode_length_delimited(&mut messages) else {
            break;
        };
        now += STEP;
        num_messages += 1;
        core.update_load(load_from_proto(&message), now);
        route_and_free(&mut core, &format!("r{num_messages}"), now);
        assert_eq!(core.num_tracked(), 0, "after {message:?}");
    }
}

/// Length-delimited `kvmesh.v1.RouterSyncEvent` messages, each applied as replica sync applies
/// one from another replica, with this router's own requests in between. Whatever was forged,
/// every tracked request is gone once the active-request expiry has passed, and every rank's
/// load is back to zero: a forged event cannot pin load on a worker for good.
pub fn router_sync_events(mut messages: &[u8]) {
    let mut core = router(true);
    let mut now = Duration::ZERO;
    let mut num_messages = 0u32;
    while !messages.is_empty() {
        let Ok(message) = pb::RouterSyncEvent::decode_length_delimited(&mut messages) else {
            break;
        };
        now += STEP;
        num_messages += 1;
        if let Some(event) = sync_from_proto(message) {
            core.apply_sync_event(&event, now);
        }
        route_and_free(&mut core, &format!("r{num_messages}"), now);
        core.take_sync_events();
    }
    let expiry = core.config().kv.active_request_expiry;
    core.tick(now + expiry + kvmesh_routing::core::EXPIRY_SWEEP_INTERVAL * 2);
    assert_eq!(
        core.num_tracked(),
        0,
        "tracked requests outlived the expiry"
    );
    for id in WORKERS {
        assert_eq!(core.inflight(id), 0, "worker {id}");
        assert_eq!(
            core.load(WorkerKey::new(id, 0)),
            RankLoadSnapshot::default(),
            "worker {id}"
        );
    }
}

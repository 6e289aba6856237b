//! Faults the routing core rides out (docs/routing.md, "Ejection of failing workers" and "Load
//! tracking"): a fast-failing worker is ejected with back-off and readmitted by a probe, and the
//! routings of a departed caller or replica are released.

#[path = "support/helpers.rs"]
mod helpers;

use std::time::Duration;

use helpers::{core, s};
use kvmesh_kv::WorkerKey;
use kvmesh_routing::{
    RouteOutcome, RouteRequest, RouterCore, RoutingHints, SyncEvent, SyncKind, TerminalPath,
};
use proptest::prelude::*;

fn route(core: &mut RouterCore, id: &str, now: Duration) -> u64 {
    route_with(core, id, RoutingHints::default(), now)
}

fn route_with(core: &mut RouterCore, id: &str, hints: RoutingHints, now: Duration) -> u64 {
    let tokens = [1u32, 2, 3, 4, 5, 6, 7, 8];
    match core.route(&RouteRequest::new(id, &tokens).with_hints(hints), now) {
        Ok(RouteOutcome::Routed(decision)) => decision.worker_id,
        other => panic!("{other:?}"),
    }
}

/// Least-loaded routing sends everything to the idle worker, which is exactly what a worker that
/// fails at once looks like: ejection stops that.
#[test]
fn a_fast_failing_worker_is_ejected_then_readmitted_by_a_probe() {
    let args = [
        "--router-mode",
        "least-loaded",
        "--router-ejection-failures",
        "3",
        "--router-ejection-base-secs",
        "10",
    ];
    let mut core = core(&args, &[1, 2]);
    // Worker 2 is busy with a long request; worker 1 fails everything it gets.
    let long = route_with(
        &mut core,
        "long",
        RoutingHints {
            backend_instance_id: Some(2),
            ..RoutingHints::default()
        },
        s(0),
    );
    assert_eq!(long, 2);
    for i in 0..3 {
        let id = format!("f{i}");
        assert_eq!(
            route(&mut core, &id, s(1)),
            1,
            "idle-looking worker 1 attracts it"
        );
        core.free(&id, TerminalPath::WorkerFailed, s(1));
    }
    assert!(core.is_worker_ejected(1));
    assert_eq!(core.num_ejected_workers(), 1);
    for i in 0..20 {
        let id = format!("ok{i}");
        assert_eq!(
            route(&mut core, &id, s(2)),
            2,
            "ejected worker 1 gets nothing"
        );
    }
    for i in 0..20 {
        core.free(&format!("ok{i}"), TerminalPath::Completed, s(3));
    }
    // Back-off over: one probe goes to worker 1 (the least loaded) and fails: twice as long.
    assert_eq!(route(&mut core, "probe1", s(12)), 1);
    assert_eq!(route(&mut core, "other", s(12)), 2, "one probe at a time");
    core.free("probe1", TerminalPath::WorkerFailed, s(12));
    assert_eq!(core.ejection_counts(), (2, 0));
    assert_eq!(
        route(&mut core, "still-out", s(31)),
        2,
        "20 s after the failed probe"
    );
    // The worker recovered: the next probe's first token readmits it.
    assert_eq!(route(&mut core, "probe2", s(33)), 1);
    assert!(core.mark_prefill_done("probe2", s(34)));
    assert!(!core.is_worker_ejected(1));
    assert_eq!(core.ejection_counts(), (2, 1));
    assert_eq!(route(&mut core, "after", s(34)), 1);
}

#[test]
fn with_every_worker_ejected_requests_still_go_somewhere() {
    let args = [
        "--router-mode",
        "round-robin",
        "--router-ejection-failures",
        "1",
    ];
    let mut core = core(&args, &[1]);
    assert_eq!(route(&mut core, "a", s(0)), 1);
    core.free("a", TerminalPath::Migrated, s(0));
    assert!(core.is_worker_ejected(1));
    assert_eq!(route(&mut core, "b", s(0)), 1);
}

#[test]
fn errors_that_are_not_the_workers_fault_do_not_eject() {
    let args = [
        "--router-mode",
        "round-robin",
        "--router-ejection-failures",
        "1",
    ];
    let mut core = core(&args, &[1]);
    for path in [
        TerminalPath::Error,
        TerminalPath::Cancelled,
        TerminalPath::Disconnected,
    ] {
        route(&mut core, "a", s(0));
        core.free("a", path, s(0));
    }
    assert!(!core.is_worker_ejected(1));
}

#[test]
fn a_departed_callers_routings_are_released() {
    let mut core = core(&["--router-mode", "round-robin"], &[1, 2]);
    let of = |caller| RoutingHints {
        caller_instance_id: Some(caller),
        ..RoutingHints::default()
    };
    for i in 0..10 {
        route_with(&mut core, &format!("a{i}"), of(0xa), s(0));
        route_with(&mut core, &format!("b{i}"), of(0xb), s(0));
    }
    route(&mut core, "local", s(0));
    assert_eq!(core.num_tracked(), 21);
    assert_eq!(core.release_instance(0xa, s(1)), 10);
    assert_eq!(core.num_tracked(), 11);
    assert_eq!(core.release_instance(0xa, s(1)), 0);
    assert_eq!(core.release_instance(0xb, s(1)), 10);
    assert!(core.is_tracked("local"));
    assert_eq!(core.inflight(1) + core.inflight(2), 1);
}

fn synced_add(router_id: &str, request_id: &str, worker: u64) -> SyncEvent {
    SyncEvent {
        router_id: router_id.into(),
        request_id: request_id.into(),
        worker: WorkerKey::new(worker, 0),
        kind: SyncKind::Add {
            token_sequence_hashes: vec![7, 8],
            track_prefill_tokens: true,
            expected_output_tokens: None,
            initial_prefill_tokens: Some(100),
            expected_prefill_duration_ms: None,
            lora_name: None,
        },
        forwarded_by: None,
    }
}

proptest! {
    /// Whatever replicas (`{instance:x}-{model}`) sync onto this router, releasing every one of
    /// them leaves no load behind, and releasing one leaves the others' intact.
    #[test]
    fn releasing_departed_replicas_leaves_no_load(
        adds in prop::collection::vec((1u64..5, 1u64..4, any::<bool>()), 0..60)
    ) {
        let mut core = core(&["--router-mode", "kv", "--router-replica-sync"], &[1, 2, 3]);
        let mut per_replica = [0usize; 5];
        for (n, (replica, worker, prefilled)) in adds.iter().enumerate() {
            let router_id = format!("{replica:x}-m");
            let request_id = format!("r{n}");
            core.apply_sync_event(&synced_add(&router_id, &request_id, *worker), s(0));
            if *prefilled {
                let mut done = synced_add(&router_id, &request_id, *worker);
                done.kind = SyncKind::MarkPrefillCompleted;
                core.apply_sync_event(&done, s(0));
            }
            per_replica[*replica as usize] += 1;
        }
        prop_assert_eq!(core.num_tracked(), adds.len());
        let kept = per_replica[1];
        for replica in 2u64..5 {
            prop_assert_eq!(core.release_instance(replica, s(1)), per_replica[replica as usize]);
        }
        prop_assert_eq!(core.num_tracked(), kept);
        core.release_instance(1, s(1));
        for worker in 1..4 {
            prop_assert_eq!(core.inflight(worker), 0);
            let load = core.load(WorkerKey::new(worker, 0));
            prop_assert_eq!(load.active_requests, 0);
            prop_assert_eq!(load.active_blocks, 0);
            prop_assert_eq!(load.prefill_tokens, 0);
        }
    }
}

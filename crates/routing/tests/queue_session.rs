//! The queue and session affinity (docs/routing.md, "Queue" and "Session affinity").

#[path = "support/helpers.rs"]
mod helpers;

use std::time::Duration;

use helpers::*;
use kvmesh_kv::Tier;
use kvmesh_routing::{
    BusyThresholds, RouteError, RouteOutcome, RouteRequest, RouterCore, RoutingHints, TerminalPath,
    Ticket,
};

fn queued_core(args: &[&str]) -> RouterCore {
    let mut all = vec!["--router-mode", "kv", "--router-queue-threshold", "0.5"];
    all.extend_from_slice(args);
    let mut core = core(&all, &[]);
    core.upsert_worker(worker(1, Some(100), None), s(0));
    core
}

fn park(core: &mut RouterCore, id: &str, tokens: &[u32], hints: RoutingHints, at: u64) -> Ticket {
    let request = RouteRequest::new(id, tokens).with_hints(hints);
    match core.route(&request, s(at)) {
        Ok(RouteOutcome::Queued(ticket)) => ticket,
        other => panic!("{id} should park, got {other:?}"),
    }
}

fn dispatched_order(core: &mut RouterCore) -> Vec<String> {
    core.take_dispatched()
        .into_iter()
        .map(|d| {
            assert!(d.result.is_ok(), "{d:?}");
            d.request_id
        })
        .collect()
}

#[test]
fn no_threshold_never_parks() {
    let mut core = core(&["--router-mode", "kv"], &[]);
    core.upsert_worker(worker(1, Some(100), None), s(0));
    for i in 0..5 {
        route(&mut core, &format!("r{i}"), &prompt(i * 1000, 400), s(0));
    }
    assert_eq!(core.queue_len(), 0);
}

#[test]
fn parks_when_full_and_leaves_in_fcfs_order_with_priorities() {
    let mut core = queued_core(&[]);
    route(&mut core, "big", &prompt(0, 80), s(0)); // 80 > 0.5 · 100
    let short = prompt(500, 8);
    park(&mut core, "a", &short, RoutingHints::default(), 1);
    let high = RoutingHints {
        priority: 5,
        ..RoutingHints::default()
    };
    park(&mut core, "b", &short, high, 2);
    let strict = RoutingHints {
        strict_priority: 1,
        ..RoutingHints::default()
    };
    park(&mut core, "c", &short, strict, 3);
    park(&mut core, "d", &short, RoutingHints::default(), 4);
    assert_eq!(core.queue_len(), 4);
    assert!(core.take_dispatched().is_empty());
    core.mark_prefill_done("big", s(5));
    assert_eq!(dispatched_order(&mut core), vec!["c", "b", "a", "d"]);
    assert_eq!(core.queue_len(), 0);
    assert_eq!(core.num_tracked(), 5);
}

#[test]
fn arrivals_do_not_overtake_the_backlog() {
    let mut core = queued_core(&[]);
    core.upsert_worker(worker(2, Some(100), None), s(0));
    route_pinned(&mut core, "big1", &prompt(0, 80), 1);
    route_pinned(&mut core, "big2", &prompt(1000, 80), 2);
    park(&mut core, "a", &prompt(500, 80), RoutingHints::default(), 1);
    core.mark_prefill_done("big1", s(2)); // a leaves and fills worker 1 again
    assert_eq!(dispatched_order(&mut core), vec!["a"]);
    park(&mut core, "b", &prompt(600, 8), RoutingHints::default(), 3);
    // Worker 1 now has room only for an arrival that would overtake "b": it parks behind it.
    core.mark_prefill_done("a", s(4));
    assert_eq!(dispatched_order(&mut core), vec!["b"]);
}

#[test]
fn wspt_serves_the_shortest_uncached_work_first() {
    let order = |policy: &str| {
        let mut core = queued_core(&["--router-queue-policy", policy]);
        route(&mut core, "big", &prompt(0, 80), s(0));
        park(
            &mut core,
            "long",
            &prompt(500, 40),
            RoutingHints::default(),
            1,
        );
        park(
            &mut core,
            "short",
            &prompt(900, 8),
            RoutingHints::default(),
            2,
        );
        core.mark_prefill_done("big", s(3));
        dispatched_order(&mut core)
    };
    assert_eq!(order("fcfs"), vec!["long", "short"]);
    assert_eq!(order("wspt"), vec!["short", "long"]);
}

#[test]
fn cancelled_and_stranded_requests_leave_the_queue() {
    let mut core = queued_core(&[]);
    route(&mut core, "big", &prompt(0, 80), s(0));
    let ticket = park(&mut core, "a", &prompt(500, 8), RoutingHints::default(), 1);
    assert!(core.cancel_queued(ticket));
    assert!(!core.cancel_queued(ticket));
    let pinned = RoutingHints {
        backend_instance_id: Some(1),
        ..RoutingHints::default()
    };
    park(&mut core, "b", &prompt(500, 8), pinned, 2);
    core.remove_worker(1, s(3));
    let out = core.take_dispatched();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].result, Err(RouteError::NoEndpoint));
    assert_eq!(core.num_tracked(), 0);
}

#[test]
fn overlap_is_re_queried_after_a_long_wait() {
    let queries_after = |args: &[&str], wait: u64| {
        let index = Counting::new();
        index.store(1, Tier::Device, &prompt(0, 8));
        let mut all = vec!["--router-mode", "kv", "--router-queue-threshold", "0.5"];
        all.extend_from_slice(args);
        let mut core = core(&all, &[]).with_overlap_source(index.clone());
        core.upsert_worker(worker(1, Some(100), None), s(0));
        route(&mut core, "big", &prompt(5000, 80), s(0));
        park(&mut core, "a", &prompt(0, 8), RoutingHints::default(), 0);
        let before = index.queries();
        core.mark_prefill_done("big", s(wait));
        assert_eq!(core.take_dispatched().len(), 1);
        index.queries() - before
    };
    assert_eq!(queries_after(&[], 5), 0);
    assert_eq!(queries_after(&[], 11), 1);
    assert_eq!(
        queries_after(&["--router-overlap-refresh-after-secs", "0"], 1000),
        0
    );
}

fn session(id: &str) -> RoutingHints {
    RoutingHints {
        session_id: Some(id.into()),
        ..RoutingHints::default()
    }
}

fn route_session(
    core: &mut RouterCore,
    id: &str,
    session_id: &str,
    at: u64,
) -> Result<u64, RouteError> {
    let tokens = [1, 2];
    match core.route(
        &RouteRequest::new(id, &tokens).with_hints(session(session_id)),
        s(at),
    )? {
        RouteOutcome::Routed(d) => Ok(d.worker_id),
        RouteOutcome::Queued(_) => panic!("unexpected queue"),
    }
}

#[test]
fn sessions_stick_only_when_enabled_and_expire_when_idle() {
    let mut off = core(&[], &[1, 2]);
    assert_ne!(
        route_session(&mut off, "a", "s", 0),
        route_session(&mut off, "b", "s", 0)
    );
    let mut on = core(&["--router-session-affinity-ttl-secs", "10"], &[1, 2]);
    let bound = route_session(&mut on, "a", "s", 0).unwrap();
    for i in 0..4 {
        assert_eq!(
            route_session(&mut on, &format!("r{i}"), "s", 1).unwrap(),
            bound
        );
    }
    assert_eq!(on.num_sessions(), 1);
    // In-flight requests block expiry; the idle timer restarts when the last one ends.
    on.tick(s(60)); // a sweep while requests are in flight
    assert_eq!(on.num_sessions(), 1);
    on.free("a", TerminalPath::Completed, s(100));
    for i in 0..4 {
        on.free(&format!("r{i}"), TerminalPath::Completed, s(100));
    }
    assert_eq!(route_session(&mut on, "b", "s", 109).unwrap(), bound);
    on.free("b", TerminalPath::Completed, s(109));
    on.tick(s(120)); // idle since 109 with TTL 10 s: expired at 119
    assert_eq!(on.num_sessions(), 0);
}

#[test]
fn hard_binding_never_reroutes_soft_falls_back() {
    let busy = BusyThresholds {
        active_prefill_tokens_threshold: Some(0),
        ..BusyThresholds::default()
    };
    let mut hard = core(
        &[
            "--router-session-affinity-ttl-secs",
            "60",
            "--router-mode",
            "kv",
        ],
        &[1, 2],
    );
    hard.set_busy_thresholds(busy);
    let bound = route_session(&mut hard, "a", "s", 0).unwrap(); // 2 prefill tokens: bound is busy
    assert_eq!(
        route_session(&mut hard, "b", "s", 0),
        Err(RouteError::Overloaded)
    );
    // The failure dropped the binding: the next request routes freely.
    assert_ne!(route_session(&mut hard, "c", "s", 0).unwrap(), bound);

    let mut soft = core(
        &[
            "--router-session-affinity-ttl-secs",
            "60",
            "--router-session-affinity-mode",
            "soft",
            "--router-mode",
            "kv",
        ],
        &[1, 2],
    );
    let bound = route_session(&mut soft, "a", "s", 0).unwrap();
    soft.mark_prefill_done("a", s(0));
    assert_eq!(
        route_session(&mut soft, "b", "s", 0).unwrap(),
        bound,
        "preferred when eligible"
    );
    soft.set_busy_thresholds(busy);
    assert_ne!(
        route_session(&mut soft, "c", "s", 0).unwrap(),
        bound,
        "falls back when busy"
    );
}

#[test]
fn worker_failures_drop_bindings_cancellations_keep_them() {
    let mut core = core(&["--router-session-affinity-ttl-secs", "60"], &[1, 2, 3]);
    let bound = route_session(&mut core, "a", "s", 0).unwrap();
    core.free("a", TerminalPath::Cancelled, s(1));
    assert_eq!(route_session(&mut core, "b", "s", 1).unwrap(), bound);
    core.free("b", TerminalPath::Migrated, s(1));
    assert_eq!(core.num_sessions(), 0);
    let rebound = route_session(&mut core, "c", "s", 1).unwrap();
    core.remove_worker(rebound, s(2));
    assert_eq!(core.num_sessions(), 0);
}

#[test]
fn session_control_binds_without_the_flag_and_direct_mode_ignores_sessions() {
    let mut core = core(&[], &[1, 2]);
    let tokens = [1];
    let hints = RoutingHints {
        session_id: Some("s".into()),
        session_bind_ttl: Some(Duration::from_secs(300)),
        ..RoutingHints::default()
    };
    let first = routed(core.route(
        &RouteRequest::new("a", &tokens).with_hints(hints.clone()),
        s(0),
    ));
    let second = routed(core.route(&RouteRequest::new("b", &tokens).with_hints(hints), s(0)));
    assert_eq!(first.worker_id, second.worker_id);

    let mut direct = self::core(
        &[
            "--router-mode",
            "direct",
            "--router-session-affinity-ttl-secs",
            "60",
        ],
        &[1, 2],
    );
    for (i, target) in [1u64, 2, 1].into_iter().enumerate() {
        let mut hints = session("s");
        hints.backend_instance_id = Some(target);
        let d = routed(direct.route(
            &RouteRequest::new(format!("d{i}"), &tokens).with_hints(hints),
            s(0),
        ));
        assert_eq!(d.worker_id, target);
    }
    assert_eq!(direct.num_sessions(), 0);
}

#[test]
fn client_set_session_bindings_are_bounded() {
    let mut core = core(&[], &[1, 2]);
    let tokens = [1];
    // A client asking for an endless binding gets one that still expires (after a day).
    let endless = RoutingHints {
        session_id: Some("s".into()),
        session_bind_ttl: Some(Duration::from_secs(u64::MAX)),
        ..RoutingHints::default()
    };
    routed(core.route(&RouteRequest::new("a", &tokens).with_hints(endless), s(0)));
    core.free("a", TerminalPath::Completed, s(1));
    core.tick(s(1000));
    assert_eq!(core.num_sessions(), 1);
    core.tick(s(1 + 24 * 60 * 60));
    assert_eq!(core.num_sessions(), 0);

    // An oversized session id is the caller's error, not a new map entry.
    let oversized = RoutingHints {
        session_id: Some("x".repeat(257)),
        session_bind_ttl: Some(Duration::from_secs(60)),
        ..RoutingHints::default()
    };
    let outcome = core.route(&RouteRequest::new("b", &tokens).with_hints(oversized), s(2));
    assert!(
        matches!(outcome, Err(RouteError::BadRequest(_))),
        "{outcome:?}"
    );
    assert_eq!(core.num_sessions(), 0);
}

#[test]
fn a_reused_request_id_releases_the_session_of_the_request_it_replaces() {
    let mut core = core(&["--router-session-affinity-ttl-secs", "10"], &[1, 2]);
    route_session(&mut core, "a", "s", 0).unwrap();
    route_session(&mut core, "a", "s", 1).unwrap(); // a retry under the same id
    assert!(core.free("a", TerminalPath::Completed, s(2)));
    assert!(!core.free("a", TerminalPath::Completed, s(2)));
    core.tick(s(200)); // idle since 2 with TTL 10 s, and a sweep is due
    assert_eq!(core.num_sessions(), 0);
}

#[test]
fn a_removed_worker_releases_the_sessions_its_requests_held() {
    let mut core = core(
        &[
            "--router-session-affinity-ttl-secs",
            "10",
            "--router-session-affinity-mode",
            "soft",
            "--router-mode",
            "kv",
        ],
        &[1, 2],
    );
    let first = route_session(&mut core, "a", "s", 0).unwrap();
    core.mark_prefill_done("a", s(0));
    assert_eq!(route_session(&mut core, "b", "s", 0).unwrap(), first);
    core.set_busy_thresholds(BusyThresholds {
        active_prefill_tokens_threshold: Some(0),
        ..BusyThresholds::default()
    });
    // b's prefill makes the bound worker busy: c falls back and the session moves with it.
    let second = route_session(&mut core, "c", "s", 0).unwrap();
    assert_ne!(second, first);
    core.remove_worker(first, s(1)); // a and b go with their worker
    assert!(core.free("c", TerminalPath::Completed, s(2)));
    core.tick(s(200)); // idle since 2 with TTL 10 s, and a sweep is due
    assert_eq!(core.num_sessions(), 0);
}

#[test]
fn a_request_of_a_dropped_binding_does_not_release_the_next_one() {
    let mut core = core(
        &[
            "--router-session-affinity-ttl-secs",
            "10",
            "--router-mode",
            "kv",
        ],
        &[1, 2],
    );
    core.set_busy_thresholds(BusyThresholds {
        active_prefill_tokens_threshold: Some(0),
        ..BusyThresholds::default()
    });
    let first = route_session(&mut core, "a", "s", 0).unwrap(); // its prefill makes it busy
    assert_eq!(
        route_session(&mut core, "b", "s", 0),
        Err(RouteError::Overloaded),
        "hard binding to a busy worker"
    );
    // The failure dropped the binding; c binds the session anew, elsewhere.
    assert_ne!(route_session(&mut core, "c", "s", 0).unwrap(), first);
    assert!(core.free("a", TerminalPath::Completed, s(1)));
    core.tick(s(200)); // c is still running: its binding must not expire
    assert_eq!(core.num_sessions(), 1);
    assert!(core.free("c", TerminalPath::Completed, s(200)));
    core.tick(s(400));
    assert_eq!(core.num_sessions(), 0);
}

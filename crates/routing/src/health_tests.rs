use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn key(id: &str) -> ReqKey {
    (Arc::from("r"), id.to_string())
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn health() -> WorkerHealth {
    WorkerHealth::new(EjectionConfig {
        consecutive_failures: 3,
        base_backoff: secs(5),
        max_backoff: secs(20),
    })
}

#[test]
fn three_failures_in_a_row_eject_and_a_probe_readmits() {
    let mut h = health();
    assert_eq!(h.failed(1, &key("a"), secs(0)), None);
    assert_eq!(h.failed(1, &key("b"), secs(0)), None);
    assert!(h.admits(1, secs(0)));
    assert_eq!(
        h.failed(1, &key("c"), secs(1)),
        Some(HealthChange::Ejected(secs(5)))
    );
    assert!(!h.admits(1, secs(5)));
    assert!(h.admits(1, secs(6)), "back-off over: one probe may go");
    h.routed(1, &key("probe"), secs(6));
    assert!(!h.admits(1, secs(7)), "only one probe at a time");
    assert_eq!(
        h.succeeded(1, &key("probe")),
        Some(HealthChange::Readmitted)
    );
    assert!(h.admits(1, secs(7)));
    assert_eq!((h.ejections(), h.readmissions()), (1, 1));
}

#[test]
fn a_success_resets_the_count() {
    let mut h = health();
    h.failed(1, &key("a"), secs(0));
    h.failed(1, &key("b"), secs(0));
    h.succeeded(1, &key("ok"));
    h.failed(1, &key("c"), secs(0));
    h.failed(1, &key("d"), secs(0));
    assert!(h.admits(1, secs(0)));
    assert_eq!(h.ejections(), 0);
}

#[test]
fn failed_probes_double_the_back_off_up_to_the_maximum() {
    let mut h = health();
    for id in ["a", "b", "c"] {
        h.failed(1, &key(id), secs(0));
    }
    let mut now = secs(0);
    for expected in [10, 20, 20] {
        now += secs(30);
        assert!(h.admits(1, now));
        h.routed(1, &key("p"), now);
        assert_eq!(
            h.failed(1, &key("p"), now),
            Some(HealthChange::Ejected(secs(expected)))
        );
        assert!(!h.admits(1, now + secs(expected) - Duration::from_millis(1)));
    }
}

#[test]
fn a_cancelled_probe_lets_the_next_request_probe() {
    let mut h = health();
    for id in ["a", "b", "c"] {
        h.failed(1, &key(id), secs(0));
    }
    h.routed(1, &key("p"), secs(9));
    assert!(!h.admits(1, secs(9)));
    h.ended_neutral(1, &key("p"), secs(9));
    assert!(h.admits(1, secs(9)));
}

#[test]
fn late_results_of_older_requests_change_nothing_while_ejected() {
    let mut h = health();
    for id in ["a", "b", "c"] {
        h.failed(1, &key(id), secs(0));
    }
    assert_eq!(h.failed(1, &key("older"), secs(1)), None);
    assert_eq!(h.succeeded(1, &key("older2")), None);
    assert!(!h.admits(1, secs(2)));
    assert_eq!(h.ejections(), 1);
}

#[test]
fn zero_failures_turns_ejection_off() {
    let mut h = WorkerHealth::new(EjectionConfig {
        consecutive_failures: 0,
        ..EjectionConfig::default()
    });
    for i in 0..100 {
        h.failed(1, &key(&i.to_string()), secs(0));
    }
    assert!(h.admits(1, secs(0)));
}

#[derive(Debug, Clone)]
enum Step {
    Fail,
    Succeed,
    Neutral,
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Fail),
        2 => Just(Step::Succeed),
        1 => Just(Step::Neutral),
        2 => (0u64..40).prop_map(Step::Wait),
    ]
}

proptest! {
    /// Whatever happens, a worker is either routable or ejected for at most the maximum
    /// back-off; once routable, a success always readmits it; and an ejected worker never takes
    /// more than one request at a time.
    #[test]
    fn ejection_is_bounded_and_recovers(steps in prop::collection::vec(step(), 1..200)) {
        let mut h = health();
        let mut now = Duration::ZERO;
        let mut outstanding: Option<ReqKey> = None;
        for (i, step) in steps.into_iter().enumerate() {
            // Route one request whenever the worker admits one and nothing is out.
            if outstanding.is_none() && h.admits(1, now) {
                let k = key(&i.to_string());
                h.routed(1, &k, now);
                outstanding = Some(k);
            }
            if h.is_ejected(1) && outstanding.is_some() {
                prop_assert!(!h.admits(1, now), "a probe is out: nothing else goes");
            }
            match step {
                Step::Wait(s) => now += Duration::from_secs(s),
                Step::Fail => if let Some(k) = outstanding.take() { h.failed(1, &k, now); },
                Step::Succeed => if let Some(k) = outstanding.take() { h.succeeded(1, &k); },
                Step::Neutral => if let Some(k) = outstanding.take() { h.ended_neutral(1, &k, now); },
            }
            prop_assert!(h.admits(1, now + secs(20)) || outstanding.is_some());
        }
        if let Some(k) = outstanding.take() {
            h.ended_neutral(1, &k, now);
        }
        now += secs(20);
        prop_assert!(h.admits(1, now));
        let k = key("last");
        h.routed(1, &k, now);
        h.succeeded(1, &k);
        prop_assert!(!h.is_ejected(1));
    }
}

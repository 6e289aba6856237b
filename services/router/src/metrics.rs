//! Prometheus metrics of a `kvmesh-router` replica, served on `--metrics-port`: decisions by
//! outcome and their latency, and per-model state sampled when scraped (tracked requests, parked
//! requests, dropped sync events, failed index queries, the KV cost weights).

use std::time::Duration;

use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::routed_models::RoutedTable;
use kvmesh_routing::error::RouteError;
use kvmesh_routing::shared::SharedRouter;

/// The ejection series of every process that routes (docs/routing.md, "Ejection of failing
/// workers"), sampled from each model's router when scraped.
#[derive(Clone)]
pub struct EjectionSeries {
    ejected: IntGaugeVec,
    ejections: IntCounterVec,
    readmissions: IntCounterVec,
}

impl EjectionSeries {
    /// Registers the series in `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let ejected = IntGaugeVec::new(
            Opts::new(
                "kvmesh_router_ejected_workers",
                "workers ejected from routing after repeated failures (probing ones included)",
            ),
            &["model"],
        )?;
        let ejections = IntCounterVec::new(
            Opts::new(
                "kvmesh_router_worker_ejections_total",
                "ejections of failing workers (a failed probe counts again)",
            ),
            &["model"],
        )?;
        let readmissions = IntCounterVec::new(
            Opts::new(
                "kvmesh_router_worker_readmissions_total",
                "ejected workers readmitted after a successful probe",
            ),
            &["model"],
        )?;
        registry.register(Box::new(ejected.clone()))?;
        registry.register(Box::new(ejections.clone()))?;
        registry.register(Box::new(readmissions.clone()))?;
        Ok(Self {
            ejected,
            ejections,
            readmissions,
        })
    }

    /// Samples `router`'s ejection state under its model's label.
    pub fn sample(&self, model: &str, router: &SharedRouter) {
        let (ejected, (ejections, readmissions)) =
            router.with_core(|core, _| (core.num_ejected_workers(), core.ejection_counts()));
        self.ejected
            .with_label_values(&[model])
            .set(i64::try_from(ejected).unwrap_or(i64::MAX));
        for (counter, total) in [
            (&self.ejections, ejections),
            (&self.readmissions, readmissions),
        ] {
            let counter = counter.with_label_values(&[model]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
}

/// The KV cost weights each model routes with (docs/routing.md, "Adaptive weights"): the flags'
/// values, or what `--router-kv-weights auto` has learned, so a dashboard shows them move.
#[derive(Clone)]
pub struct KvWeightSeries {
    weight: GaugeVec,
}

impl KvWeightSeries {
    /// Registers `kvmesh_router_kv_weight{model, weight}` in `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let weight = GaugeVec::new(
            Opts::new(
                "kvmesh_router_kv_weight",
                "kv cost weight in force (overlap_score_credit, prefill_load_scale, \
                 decode_stall_weight); learned online with --router-kv-weights auto",
            ),
            &["model", "weight"],
        )?;
        registry.register(Box::new(weight.clone()))?;
        Ok(Self { weight })
    }

    /// Samples `router`'s weights under its model's label (nothing outside `kv` mode).
    pub fn sample(&self, model: &str, router: &SharedRouter) {
        let weights = router.with_core(|core, _| {
            let kv = &core.config().kv;
            match core.learned_weights() {
                Some(w) => Some((
                    w.overlap_score_credit,
                    w.prefill_load_scale,
                    w.decode_stall_weight,
                )),
                None if core.config().mode == kvmesh_routing::RouterMode::Kv => {
                    Some((kv.overlap_score_credit, kv.prefill_load_scale, 0.0))
                }
                None => None,
            }
        });
        let Some((credit, scale, stall)) = weights else {
            return;
        };
        self.weight
            .with_label_values(&[model, "overlap_score_credit"])
            .set(credit);
        self.weight
            .with_label_values(&[model, "prefill_load_scale"])
            .set(scale);
        self.weight
            .with_label_values(&[model, "decode_stall_weight"])
            .set(stall);
    }

    /// The sampled value of one weight (tests).
    pub fn get(&self, model: &str, weight: &str) -> f64 {
        self.weight.with_label_values(&[model, weight]).get()
    }
}

/// The replica's metrics.
#[derive(Clone)]
pub struct RouterMetrics {
    /// Where they are registered.
    pub registry: Registry,
    decisions: IntCounterVec,
    reports: IntCounterVec,
    decision_seconds: Histogram,
    tracked: IntGaugeVec,
    queued: IntGaugeVec,
    sync_dropped: IntGaugeVec,
    index_failures: IntGaugeVec,
    ejection: EjectionSeries,
    kv_weights: KvWeightSeries,
}

impl RouterMetrics {
    /// Registers every metric in a new registry.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let decisions = IntCounterVec::new(
            Opts::new(
                "kvmesh_router_decisions_total",
                "Route and Generate decisions by outcome",
            ),
            &["model", "outcome"],
        )?;
        let reports = IntCounterVec::new(
            Opts::new("kvmesh_router_reports_total", "Report calls by kind"),
            &["model", "kind"],
        )?;
        let decision_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "kvmesh_router_decision_seconds",
                "time to decide (index query, scoring, queue wait)",
            )
            .buckets(prometheus::exponential_buckets(0.000_01, 2.0, 20)?),
        )?;
        let gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["model"]);
        let tracked = gauge(
            "kvmesh_router_tracked_requests",
            "requests whose load is tracked (this replica's and synced)",
        )?;
        let queued = gauge(
            "kvmesh_router_queue_pending_requests",
            "requests parked in the queue",
        )?;
        let sync_dropped = gauge(
            "kvmesh_router_sync_events_dropped",
            "replica sync events dropped because the publisher fell behind",
        )?;
        let index_failures = gauge(
            "kvmesh_router_indexer_query_failures",
            "indexer shard queries that failed on every replica tried",
        )?;
        for collector in [
            Box::new(decisions.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reports.clone()),
            Box::new(decision_seconds.clone()),
            Box::new(tracked.clone()),
            Box::new(queued.clone()),
            Box::new(sync_dropped.clone()),
            Box::new(index_failures.clone()),
        ] {
            registry.register(collector)?;
        }
        let ejection = EjectionSeries::new(&registry)?;
        let kv_weights = KvWeightSeries::new(&registry)?;
        Ok(Self {
            registry,
            ejection,
            kv_weights,
            decisions,
            reports,
            decision_seconds,
            tracked,
            queued,
            sync_dropped,
            index_failures,
        })
    }

    /// Counts one decision (or refusal) and how long it took.
    pub fn observe_decision<T>(
        &self,
        model: &str,
        result: &Result<T, RouteError>,
        elapsed: Duration,
    ) {
        let outcome = match result {
            Ok(_) => "routed",
            Err(RouteError::Overloaded) => "overloaded",
            Err(RouteError::NoEndpoint) => "no_endpoint",
            Err(RouteError::NotReady) => "not_ready",
            Err(RouteError::BadRequest(_)) => "bad_request",
            Err(RouteError::Cancelled) => "cancelled",
            Err(RouteError::UnknownModel(_)) => "unknown_model",
            Err(RouteError::Unreachable(_)) => "unreachable",
            Err(RouteError::Worker { .. } | RouteError::WorkerTimeout(_)) => "worker_error",
        };
        self.decisions.with_label_values(&[model, outcome]).inc();
        if result.is_ok() {
            self.decision_seconds.observe(elapsed.as_secs_f64());
        }
    }

    /// Counts one report (`first_token`, `tokens`, `end`, `end_for_replica`).
    pub fn count_report(&self, model: &str, kind: &str) {
        self.reports.with_label_values(&[model, kind]).inc();
    }

    /// Routed requests of a model so far.
    pub fn decisions(&self, model: &str, outcome: &str) -> u64 {
        self.decisions.with_label_values(&[model, outcome]).get()
    }

    /// Samples per-model state into the gauges.
    pub fn refresh(&self, table: &RoutedTable) {
        for model in table.load().values() {
            let name = model.name.as_str();
            let (tracked, queued) = model
                .router
                .with_core(|core, _| (core.num_tracked(), core.queue_len()));
            let set = |gauge: &IntGaugeVec, value: u64| {
                gauge
                    .with_label_values(&[name])
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            };
            set(&self.tracked, tracked as u64);
            set(&self.queued, queued as u64);
            set(&self.sync_dropped, model.router.num_sync_dropped());
            self.ejection.sample(name, &model.router);
            self.kv_weights.sample(name, &model.router);
            set(
                &self.index_failures,
                model.indexer.as_ref().map_or(0, |i| i.num_failures()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use kvmesh_kv::WorkerKey;
    use kvmesh_routing::{
        KvWeightsMode, ManualClock, RouteOutcome, RouteRequest, RouterConfig, RouterCore,
        RouterMode, RuntimeConfig, TerminalPath, WorkerInfo,
    };

    use super::*;

    /// Routes `n` requests 5 ms apart whose first token takes 1 ms per queued and 4 ms per own
    /// prompt block (4 tokens) on the chosen worker, each ending 1 s later.
    fn drive(core: &mut RouterCore, n: u64) {
        let mut due: BTreeMap<(u64, u64), (String, bool)> = BTreeMap::new();
        for i in 0..n {
            let now_us = i * 5_000;
            while let Some(entry) = due.first_entry() {
                if entry.key().0 > now_us {
                    break;
                }
                let ((at, _), (id, is_first)) = entry.remove_entry();
                let at = Duration::from_micros(at);
                if is_first {
                    core.mark_prefill_done(&id, at);
                } else {
                    core.free(&id, TerminalPath::Completed, at);
                }
            }
            let blocks = 1 + i % 8;
            let tokens: Vec<u32> = (0..4 * blocks as u32).map(|t| t + 100 * i as u32).collect();
            let id = format!("req-{i}");
            let now = Duration::from_micros(now_us);
            let before: Vec<u64> = (1..=2)
                .map(|w| core.load(WorkerKey::new(w, 0)).prefill_tokens)
                .collect();
            let Ok(RouteOutcome::Routed(decision)) =
                core.route(&RouteRequest::new(&id, &tokens), now)
            else {
                panic!("not routed");
            };
            let queued = before[(decision.worker_id - 1) as usize] / 4;
            let ttft_us = 1_000 * queued + 4_000 * blocks;
            due.insert((now_us + ttft_us, 2 * i), (id.clone(), true));
            due.insert((now_us + ttft_us + 1_000_000, 2 * i + 1), (id, false));
        }
    }

    #[test]
    fn the_kv_weight_gauge_follows_the_learned_weights() {
        let mut config = RouterConfig::with_mode(RouterMode::Kv);
        config.kv.weights = KvWeightsMode::Auto;
        let mut core = RouterCore::new(config, "m", 4, 1).unwrap();
        for w in 1..=2 {
            let info = WorkerInfo::new(w).with_runtime(RuntimeConfig::default());
            core.upsert_worker(info, Duration::ZERO);
        }
        let router = SharedRouter::new(core, Arc::new(ManualClock::new(Duration::ZERO)));
        let series = KvWeightSeries::new(&Registry::new()).unwrap();
        series.sample("m", &router);
        assert_eq!(series.get("m", "overlap_score_credit"), 1.0);
        assert_eq!(series.get("m", "prefill_load_scale"), 1.0);
        let learned = router.with_core(|core, _| {
            drive(core, 2000);
            core.learned_weights().unwrap()
        });
        series.sample("m", &router);
        let credit = series.get("m", "overlap_score_credit");
        // A cached block saves its request 4 queued blocks' time; the learner adds the requests
        // queued behind a prefill, so the credit moves up from the starting 1, past 4.
        assert!(credit > 4.0, "credit {credit}");
        assert_eq!(credit, learned.overlap_score_credit);
        assert_eq!(
            series.get("m", "prefill_load_scale"),
            learned.prefill_load_scale
        );
        assert!(learned.prefill_load_scale > 1.0);
        // The workers publish no KV block count, so the decode-stall term keeps its full weight.
        assert_eq!(series.get("m", "decode_stall_weight"), 0.1);
        assert_eq!(learned.decode_stall_weight, 0.1);

        let fixed = RouterCore::new(RouterConfig::with_mode(RouterMode::Kv), "f", 4, 1).unwrap();
        let fixed = SharedRouter::new(fixed, Arc::new(ManualClock::new(Duration::ZERO)));
        series.sample("f", &fixed);
        assert_eq!(series.get("f", "overlap_score_credit"), 1.0);
    }
}

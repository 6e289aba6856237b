//! The indexer's Prometheus metrics (docs/indexer.md, "Metrics").

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::consumer::Cut;

/// Every indexer metric in one registry.
pub struct IndexerMetrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    events_applied: IntCounterVec,
    /// Event gaps detected (a jump in a worker's event ids).
    pub event_gaps: IntCounter,
    blocks: IntGaugeVec,
    workers: IntGaugeVec,
    /// Last stream sequence applied.
    pub applied_seq: IntGauge,
    /// Messages behind the stream tail.
    pub lag: IntGauge,
    /// Queries answered.
    pub queries: IntCounter,
    /// Queries answered over gRPC.
    pub grpc_queries: IntCounter,
    /// Queries answered by a direct call from a router in this process.
    pub in_process_queries: IntCounter,
    /// FindMatches latency.
    pub find_matches_seconds: Histogram,
    /// Messages that could not be decoded.
    pub malformed: IntCounter,
    /// Times the event stream failed and consumption resumed.
    pub stream_failures: IntCounter,
    /// Times retention deleted messages before this replica read them (and it resynced).
    pub retention_gaps: IntCounter,
    seen: Mutex<HashMap<(String, &'static str, &'static str), u64>>,
    seen_gaps: Mutex<u64>,
}

impl IndexerMetrics {
    /// Creates and registers every metric.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let events_applied = IntCounterVec::new(
            Opts::new(
                "kvmesh_indexer_events_applied_total",
                "kv events applied by outcome",
            ),
            &["model", "event_type", "status"],
        )?;
        let event_gaps = IntCounter::new(
            "kvmesh_indexer_event_gaps_total",
            "gaps in worker event ids",
        )?;
        let blocks = IntGaugeVec::new(
            Opts::new("kvmesh_indexer_blocks", "(block, worker) entries"),
            &["model"],
        )?;
        let workers = IntGaugeVec::new(
            Opts::new("kvmesh_indexer_workers", "workers indexed"),
            &["model"],
        )?;
        let applied_seq =
            IntGauge::new("kvmesh_indexer_applied_seq", "last stream sequence applied")?;
        let lag = IntGauge::new(
            "kvmesh_indexer_lag_messages",
            "messages behind the stream tail",
        )?;
        let queries = IntCounter::new("kvmesh_indexer_queries_total", "FindMatches calls")?;
        let grpc_queries = IntCounter::new(
            "kvmesh_indexer_grpc_queries_total",
            "queries answered over gRPC",
        )?;
        let in_process_queries = IntCounter::new(
            "kvmesh_indexer_in_process_queries_total",
            "queries answered by a direct call from a router in this process",
        )?;
        let find_matches_seconds = Histogram::with_opts(
            HistogramOpts::new("kvmesh_indexer_find_matches_seconds", "FindMatches latency")
                .buckets(prometheus::exponential_buckets(1e-6, 2.0, 20)?),
        )?;
        let malformed = IntCounter::new(
            "kvmesh_indexer_malformed_messages_total",
            "undecodable messages skipped",
        )?;
        let stream_failures = IntCounter::new(
            "kvmesh_indexer_stream_failures_total",
            "times the kv event stream failed and was resumed",
        )?;
        registry.register(Box::new(stream_failures.clone()))?;
        let retention_gaps = IntCounter::new(
            "kvmesh_indexer_retention_gaps_total",
            "times stream retention deleted messages this replica had not read (it then resyncs from a peer)",
        )?;
        registry.register(Box::new(retention_gaps.clone()))?;
        registry.register(Box::new(events_applied.clone()))?;
        registry.register(Box::new(event_gaps.clone()))?;
        registry.register(Box::new(blocks.clone()))?;
        registry.register(Box::new(workers.clone()))?;
        registry.register(Box::new(applied_seq.clone()))?;
        registry.register(Box::new(lag.clone()))?;
        registry.register(Box::new(queries.clone()))?;
        registry.register(Box::new(grpc_queries.clone()))?;
        registry.register(Box::new(in_process_queries.clone()))?;
        registry.register(Box::new(find_matches_seconds.clone()))?;
        registry.register(Box::new(malformed.clone()))?;
        Ok(Self {
            registry,
            events_applied,
            event_gaps,
            blocks,
            workers,
            applied_seq,
            lag,
            queries,
            grpc_queries,
            in_process_queries,
            find_matches_seconds,
            malformed,
            stream_failures,
            retention_gaps,
            seen: Mutex::new(HashMap::new()),
            seen_gaps: Mutex::new(0),
        })
    }

    /// Brings the index-derived metrics up to a cut.
    pub fn update(&self, cut: &Cut) {
        self.applied_seq
            .set(i64::try_from(cut.applied_seq).unwrap_or(i64::MAX));
        let mut total_gaps = 0;
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        for model in &cut.models {
            self.blocks
                .with_label_values(&[&model.model])
                .set(i64::try_from(model.num_blocks).unwrap_or(i64::MAX));
            self.workers
                .with_label_values(&[&model.model])
                .set(i64::try_from(model.num_workers).unwrap_or(i64::MAX));
            total_gaps += model.counters.gaps;
            for (event_type, status, count) in model.counters.applied() {
                let key = (model.model.clone(), event_type.as_str(), status.as_str());
                let previous = seen.insert(key, count).unwrap_or(0);
                if count > previous {
                    self.events_applied
                        .with_label_values(&[&model.model, event_type.as_str(), status.as_str()])
                        .inc_by(count - previous);
                }
            }
        }
        if let Ok(mut seen_gaps) = self.seen_gaps.lock() {
            if total_gaps > *seen_gaps {
                self.event_gaps.inc_by(total_gaps - *seen_gaps);
            }
            *seen_gaps = total_gaps;
        }
    }
}

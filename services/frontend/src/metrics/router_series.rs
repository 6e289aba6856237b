//! The router-side series the frontend exports under Dynamo's names: the KV router's
//! `dynamo_component_router_*` request series, the routing overhead histograms, and the
//! per-worker `worker_last_*` gauges.

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry,
};

use super::{ROUTER_COMPONENT_PREFIX, latency_buckets, ratio_buckets, token_buckets};

/// The series Dynamo's KV router exports for the requests it routes, under their Dynamo names.
#[derive(Clone)]
pub(crate) struct RouterComponentSeries {
    pub(crate) requests_total: IntCounterVec,
    pub(crate) ttft: HistogramVec,
    pub(crate) itl: HistogramVec,
    pub(crate) input_tokens: HistogramVec,
    pub(crate) output_tokens: HistogramVec,
    pub(crate) kv_hit_rate: HistogramVec,
}

impl RouterComponentSeries {
    pub(crate) fn new(registry: &Registry) -> prometheus::Result<Self> {
        let name = |suffix: &str| format!("{ROUTER_COMPONENT_PREFIX}_{suffix}");
        let histogram = |suffix: &str, help: &str, buckets: Vec<f64>| {
            let series = HistogramVec::new(
                HistogramOpts::new(name(suffix), help.to_string()).buckets(buckets),
                &["model"],
            )?;
            registry.register(Box::new(series.clone()))?;
            Ok::<_, prometheus::Error>(series)
        };
        let requests_total = IntCounterVec::new(
            Opts::new(name("requests_total"), "requests routed to a worker"),
            &["model"],
        )?;
        registry.register(Box::new(requests_total.clone()))?;
        Ok(Self {
            requests_total,
            ttft: histogram(
                "time_to_first_token_seconds",
                "time to first token of routed requests",
                latency_buckets(),
            )?,
            itl: histogram(
                "inter_token_latency_seconds",
                "time between tokens of routed requests",
                latency_buckets(),
            )?,
            input_tokens: histogram(
                "input_sequence_tokens",
                "prompt tokens of routed requests",
                token_buckets(),
            )?,
            output_tokens: histogram(
                "output_sequence_tokens",
                "output tokens of routed requests",
                token_buckets(),
            )?,
            kv_hit_rate: histogram(
                "kv_hit_rate",
                "share of the prompt found in the worker's KV cache",
                ratio_buckets(),
            )?,
        })
    }
}

/// The routing overhead histograms of Dynamo's router, `dynamo_router_overhead_*_ms`, for the
/// routers in this process (label `router_id="frontend"`). kvmesh times block hashing and the
/// decision (its overlap lookups included) as a whole, so `indexer_find_matches` and
/// `seq_hashing` are registered and stay empty.
#[derive(Clone)]
pub struct RouterOverhead {
    block_hashing: Histogram,
    scheduling: Histogram,
    total: Histogram,
}

impl RouterOverhead {
    /// Creates and registers the series.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let mut handles = Vec::new();
        for part in [
            "block_hashing",
            "indexer_find_matches",
            "seq_hashing",
            "scheduling",
            "total",
        ] {
            let series = HistogramVec::new(
                HistogramOpts::new(
                    format!("dynamo_router_overhead_{part}_ms"),
                    format!("routing overhead: {part}, milliseconds"),
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 20)?),
                &["router_id"],
            )?;
            registry.register(Box::new(series.clone()))?;
            handles.push(series.with_label_values(&["frontend"]));
        }
        let stride_mismatches = IntCounterVec::new(
            Opts::new(
                "router_active_sequence_stride_mismatches_total",
                "active-sequence updates off the stride (kvmesh tracks every token: none)",
            ),
            &["router_id"],
        )?;
        registry.register(Box::new(stride_mismatches.clone()))?;
        stride_mismatches.with_label_values(&["frontend"]);
        Ok(Self {
            block_hashing: handles[0].clone(),
            scheduling: handles[3].clone(),
            total: handles[4].clone(),
        })
    }

    /// Records one start's hashing and decision time.
    pub fn observe(&self, timings: &kvmesh_router::generation::StartTimings) {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        self.block_hashing.observe(ms(timings.hash));
        self.scheduling.observe(ms(timings.route));
        self.total.observe(ms(timings.hash + timings.route));
    }
}

/// The `worker_last_*` gauges, labelled by worker; a request resolves its worker's handles once.
#[derive(Clone)]
pub struct WorkerSeries {
    pub(crate) last_ttft: GaugeVec,
    pub(crate) last_itl: GaugeVec,
    pub(crate) last_isl: IntGaugeVec,
}

/// One worker rank's `worker_last_*` gauges.
pub struct WorkerGauges {
    /// Time to first token of its latest request.
    pub last_ttft: Gauge,
    /// Mean time between tokens of its latest finished request.
    pub last_itl: Gauge,
    /// Prompt tokens of its latest request.
    pub last_isl: IntGauge,
}

impl WorkerSeries {
    /// The gauges of `worker_id`'s rank `dp_rank` (decode workers: serving is aggregated).
    pub fn of(&self, worker_id: u64, dp_rank: u32) -> WorkerGauges {
        let id = format!("{worker_id:x}");
        let rank = dp_rank.to_string();
        let labels = [id.as_str(), rank.as_str(), "decode"];
        WorkerGauges {
            last_ttft: self.last_ttft.with_label_values(&labels),
            last_itl: self.last_itl.with_label_values(&labels),
            last_isl: self.last_isl.with_label_values(&labels),
        }
    }
}

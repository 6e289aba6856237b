//! The frontend's Prometheus metrics (docs/http-api.md, "Metrics"), with per-model handles
//! resolved once so the request path does not hash label sets.

use prometheus::{
    GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

mod buckets;
mod router_series;

pub use self::buckets::HistogramBuckets;
use self::router_series::RouterComponentSeries;
pub use self::router_series::{RouterOverhead, WorkerGauges, WorkerSeries};

/// Prefix of the series only kvmesh has (Dynamo's keep `--metrics-prefix` or Dynamo's names).
pub const KVMESH_PREFIX: &str = "kvmesh";

/// Prefix of the router series Dynamo's KV router exports (`dynamo_component_router_*`).
pub const ROUTER_COMPONENT_PREFIX: &str = "dynamo_component_router";

/// Every frontend metric, registered in one registry.
#[derive(Clone)]
pub struct FrontendMetrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    requests_total: IntCounterVec,
    inflight: IntGaugeVec,
    disconnected: IntCounterVec,
    duration: HistogramVec,
    ttft: HistogramVec,
    itl: HistogramVec,
    input_tokens: HistogramVec,
    output_tokens: HistogramVec,
    output_tokens_total: IntCounterVec,
    cached_tokens: HistogramVec,
    model_config: Vec<IntGaugeVec>,
    rejections: IntCounterVec,
    queue_pending: IntGaugeVec,
    migrations: IntCounterVec,
    migration_max_seq_len_exceeded: IntCounterVec,
    queued: IntGaugeVec,
    active: IntGaugeVec,
    kv_hit_rate: HistogramVec,
    cancellations: IntCounterVec,
    /// `kvmesh_processor_requests_total{processor_host}`: chat requests sent to each processor
    /// host, by its address.
    pub processor_requests: IntCounterVec,
    worker_last_ttft: GaugeVec,
    worker_last_itl: GaugeVec,
    worker_last_isl: IntGaugeVec,
    router: RouterComponentSeries,
    /// Ejection of failing workers, per model.
    pub ejection: kvmesh_router::metrics::EjectionSeries,
    /// The KV cost weights each model routes with (learned with `--router-kv-weights auto`).
    pub kv_weights: kvmesh_router::metrics::KvWeightSeries,
}

pub(crate) fn ratio_buckets() -> Vec<f64> {
    (0..=10).map(|tenth| f64::from(tenth) / 10.0).collect()
}

/// Gauges describing each served model's card, in [`ModelConfig`] field order.
const MODEL_CONFIG_GAUGES: [(&str, &str); 6] = [
    ("model_context_length", "maximum prompt plus output tokens"),
    (
        "model_kv_cache_block_size",
        "tokens per KV block used for hashing",
    ),
    ("model_total_kv_blocks", "KV blocks per worker rank"),
    ("model_max_num_seqs", "maximum running sequences per worker"),
    (
        "model_max_num_batched_tokens",
        "token budget of one scheduler pass",
    ),
    ("model_migration_limit", "migrations allowed per request"),
];

/// A served model's configuration as exported by the `model_*` gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelConfig {
    /// Maximum prompt plus output tokens.
    pub context_length: u64,
    /// Tokens per KV block (after `--kv-cache-block-size`).
    pub kv_cache_block_size: u64,
    /// KV blocks per worker rank.
    pub total_kv_blocks: u64,
    /// Maximum running sequences per worker.
    pub max_num_seqs: u64,
    /// Token budget of one scheduler pass.
    pub max_num_batched_tokens: u64,
    /// Migrations allowed per request.
    pub migration_limit: u64,
}

pub(crate) fn token_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(1.0, 2.0, 18).unwrap_or_default()
}

pub(crate) fn latency_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.0005, 2.0, 18).unwrap_or_default()
}

impl FrontendMetrics {
    /// Creates and registers every metric under `prefix`, the request histograms with the
    /// boundaries of `buckets`.
    pub fn new(prefix: &str, buckets: &HistogramBuckets) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let name = |suffix: &str| format!("{prefix}_{suffix}");
        let requests_total = IntCounterVec::new(
            Opts::new(name("requests_total"), "requests by outcome"),
            &["model", "endpoint", "request_type", "status", "error_type"],
        )?;
        let inflight = IntGaugeVec::new(
            Opts::new(name("inflight_requests"), "requests being served"),
            &["model"],
        )?;
        let disconnected = IntCounterVec::new(
            Opts::new(
                name("disconnected_clients"),
                "clients that left mid-request",
            ),
            &["model"],
        )?;
        let histogram = |suffix: &str, help: &str, buckets: Vec<f64>| {
            HistogramVec::new(
                HistogramOpts::new(name(suffix), help.to_string()).buckets(buckets),
                &["model"],
            )
        };
        let duration = histogram(
            "request_duration_seconds",
            "request duration",
            buckets.request_duration.clone(),
        )?;
        let ttft = histogram(
            "time_to_first_token_seconds",
            "time to first token",
            buckets.ttft.clone(),
        )?;
        let itl = histogram(
            "inter_token_latency_seconds",
            "time between tokens",
            buckets.itl.clone(),
        )?;
        let input_tokens = histogram(
            "input_sequence_tokens",
            "prompt tokens",
            buckets.input_sequence.clone(),
        )?;
        let output_tokens = histogram(
            "output_sequence_tokens",
            "output tokens",
            buckets.output_sequence.clone(),
        )?;
        let cached_tokens = histogram("cached_tokens", "prompt tokens cached", token_buckets())?;
        let output_tokens_total = IntCounterVec::new(
            Opts::new(name("output_tokens_total"), "output tokens"),
            &["model"],
        )?;
        registry.register(Box::new(requests_total.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        registry.register(Box::new(disconnected.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(ttft.clone()))?;
        registry.register(Box::new(itl.clone()))?;
        registry.register(Box::new(input_tokens.clone()))?;
        registry.register(Box::new(output_tokens.clone()))?;
        registry.register(Box::new(output_tokens_total.clone()))?;
        registry.register(Box::new(cached_tokens.clone()))?;
        let rejections = IntCounterVec::new(
            Opts::new(
                name("model_rejection_total"),
                "requests rejected because every worker was busy",
            ),
            &["model", "endpoint"],
        )?;
        let queue_pending = IntGaugeVec::new(
            Opts::new(
                name("router_queue_pending_requests"),
                "requests parked in the router queue",
            ),
            &["worker_type"],
        )?;
        let migrations = IntCounterVec::new(
            Opts::new(
                name("model_migration_total"),
                "requests moved to another worker after a failure",
            ),
            &["model", "migration_type"],
        )?;
        let migration_max_seq_len_exceeded = IntCounterVec::new(
            Opts::new(
                name("model_migration_max_seq_len_exceeded_total"),
                "requests that grew past --migration-max-seq-len and stopped being migratable",
            ),
            &["model"],
        )?;
        registry.register(Box::new(migrations.clone()))?;
        registry.register(Box::new(migration_max_seq_len_exceeded.clone()))?;
        registry.register(Box::new(rejections.clone()))?;
        registry.register(Box::new(queue_pending.clone()))?;
        let queued = IntGaugeVec::new(
            Opts::new(
                name("queued_requests"),
                "requests waiting for their first token",
            ),
            &["model"],
        )?;
        let active = IntGaugeVec::new(
            Opts::new(name("active_requests"), "requests streaming tokens"),
            &["model"],
        )?;
        let kv_hit_rate = histogram(
            "kv_hit_rate",
            "share of the prompt found in the worker's KV cache",
            ratio_buckets(),
        )?;
        let cancellations = IntCounterVec::new(
            Opts::new(
                name("model_cancellation_total"),
                "requests cancelled because their client went away",
            ),
            &["model"],
        )?;
        let worker_labels = ["worker_id", "dp_rank", "worker_type"];
        let worker_last_ttft = GaugeVec::new(
            Opts::new(
                name("worker_last_time_to_first_token_seconds"),
                "time to first token of the worker's latest request",
            ),
            &worker_labels,
        )?;
        let worker_last_itl = GaugeVec::new(
            Opts::new(
                name("worker_last_inter_token_latency_seconds"),
                "mean time between tokens of the worker's latest finished request",
            ),
            &worker_labels,
        )?;
        let worker_last_isl = IntGaugeVec::new(
            Opts::new(
                name("worker_last_input_sequence_tokens"),
                "prompt tokens of the worker's latest request",
            ),
            &worker_labels,
        )?;
        registry.register(Box::new(queued.clone()))?;
        registry.register(Box::new(active.clone()))?;
        registry.register(Box::new(kv_hit_rate.clone()))?;
        registry.register(Box::new(cancellations.clone()))?;
        let processor_requests = IntCounterVec::new(
            Opts::new(
                format!("{KVMESH_PREFIX}_processor_requests_total"),
                "chat requests sent to each processor host",
            ),
            &["processor_host"],
        )?;
        registry.register(Box::new(processor_requests.clone()))?;
        registry.register(Box::new(worker_last_ttft.clone()))?;
        registry.register(Box::new(worker_last_itl.clone()))?;
        registry.register(Box::new(worker_last_isl.clone()))?;
        let router = RouterComponentSeries::new(&registry)?;
        let mut model_config = Vec::with_capacity(MODEL_CONFIG_GAUGES.len());
        for (suffix, help) in MODEL_CONFIG_GAUGES {
            let gauge = IntGaugeVec::new(Opts::new(name(suffix), help), &["model"])?;
            registry.register(Box::new(gauge.clone()))?;
            model_config.push(gauge);
        }
        let ejection = kvmesh_router::metrics::EjectionSeries::new(&registry)?;
        let kv_weights = kvmesh_router::metrics::KvWeightSeries::new(&registry)?;
        Ok(Self {
            registry,
            requests_total,
            inflight,
            disconnected,
            duration,
            ttft,
            itl,
            input_tokens,
            output_tokens,
            output_tokens_total,
            cached_tokens,
            model_config,
            rejections,
            queue_pending,
            migrations,
            migration_max_seq_len_exceeded,
            queued,
            active,
            kv_hit_rate,
            cancellations,
            processor_requests,
            worker_last_ttft,
            worker_last_itl,
            worker_last_isl,
            router,
            ejection,
            kv_weights,
        })
    }

    /// Publishes a model's configuration gauges.
    pub fn set_model_config(&self, model: &str, config: &ModelConfig) {
        let values = [
            config.context_length,
            config.kv_cache_block_size,
            config.total_kv_blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.migration_limit,
        ];
        for (gauge, value) in self.model_config.iter().zip(values) {
            gauge
                .with_label_values(&[model])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// Counts a request rejected as overloaded (`model_rejection_total`).
    pub fn count_rejection(&self, model: &str, endpoint: &str) {
        self.rejections.with_label_values(&[model, endpoint]).inc();
    }

    /// Sets the number of parked requests (sampled when metrics are scraped).
    pub fn set_queue_pending(&self, pending: usize) {
        self.queue_pending
            .with_label_values(&["decode"])
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    /// Handles for one model, resolved once per model.
    pub fn for_model(&self, model: &str) -> ModelMetrics {
        ModelMetrics {
            inflight: self.inflight.with_label_values(&[model]),
            disconnected: self.disconnected.with_label_values(&[model]),
            duration: self.duration.with_label_values(&[model]),
            ttft: self.ttft.with_label_values(&[model]),
            itl: self.itl.with_label_values(&[model]),
            input_tokens: self.input_tokens.with_label_values(&[model]),
            output_tokens: self.output_tokens.with_label_values(&[model]),
            output_tokens_total: self.output_tokens_total.with_label_values(&[model]),
            cached_tokens: self.cached_tokens.with_label_values(&[model]),
            migrations_new: self.migrations.with_label_values(&[model, "new_request"]),
            migrations_ongoing: self
                .migrations
                .with_label_values(&[model, "ongoing_request"]),
            migration_max_seq_len_exceeded: self
                .migration_max_seq_len_exceeded
                .with_label_values(&[model]),
            queued: self.queued.with_label_values(&[model]),
            active: self.active.with_label_values(&[model]),
            kv_hit_rate: self.kv_hit_rate.with_label_values(&[model]),
            cancellations: self.cancellations.with_label_values(&[model]),
            router_requests: self.router.requests_total.with_label_values(&[model]),
            router_ttft: self.router.ttft.with_label_values(&[model]),
            router_itl: self.router.itl.with_label_values(&[model]),
            router_input_tokens: self.router.input_tokens.with_label_values(&[model]),
            router_output_tokens: self.router.output_tokens.with_label_values(&[model]),
            router_kv_hit_rate: self.router.kv_hit_rate.with_label_values(&[model]),
            workers: WorkerSeries {
                last_ttft: self.worker_last_ttft.clone(),
                last_itl: self.worker_last_itl.clone(),
                last_isl: self.worker_last_isl.clone(),
            },
        }
    }

    /// Counts one finished request.
    pub fn count_request(
        &self,
        model: &str,
        endpoint: &str,
        stream: bool,
        error_type: Option<&str>,
    ) {
        let request_type = if stream { "stream" } else { "unary" };
        let (status, error_type) = match error_type {
            None => ("success", ""),
            Some(kind) => ("error", kind),
        };
        self.requests_total
            .with_label_values(&[model, endpoint, request_type, status, error_type])
            .inc();
    }
}

/// One model's metric handles.
#[derive(Clone)]
pub struct ModelMetrics {
    /// Requests being served.
    pub inflight: IntGauge,
    /// Clients that disconnected before the end.
    pub disconnected: IntCounter,
    /// Whole-request duration.
    pub duration: Histogram,
    /// Time to first token.
    pub ttft: Histogram,
    /// Inter-token latency.
    pub itl: Histogram,
    /// Prompt length.
    pub input_tokens: Histogram,
    /// Output length.
    pub output_tokens: Histogram,
    /// Output tokens in all.
    pub output_tokens_total: IntCounter,
    /// Cached prompt tokens per request.
    pub cached_tokens: Histogram,
    /// Migrations before the first token.
    pub migrations_new: IntCounter,
    /// Migrations after tokens were streamed.
    pub migrations_ongoing: IntCounter,
    /// Requests that stopped being migratable (`--migration-max-seq-len`).
    pub migration_max_seq_len_exceeded: IntCounter,
    /// Requests waiting for their first token.
    pub queued: IntGauge,
    /// Requests streaming tokens.
    pub active: IntGauge,
    /// Cached share of each prompt.
    pub kv_hit_rate: Histogram,
    /// Requests whose client went away.
    pub cancellations: IntCounter,
    /// `dynamo_component_router_requests_total`.
    pub router_requests: IntCounter,
    /// `dynamo_component_router_time_to_first_token_seconds`.
    pub router_ttft: Histogram,
    /// `dynamo_component_router_inter_token_latency_seconds`.
    pub router_itl: Histogram,
    /// `dynamo_component_router_input_sequence_tokens`.
    pub router_input_tokens: Histogram,
    /// `dynamo_component_router_output_sequence_tokens`.
    pub router_output_tokens: Histogram,
    /// `dynamo_component_router_kv_hit_rate`.
    pub router_kv_hit_rate: Histogram,
    /// The per-worker `worker_last_*` gauges.
    pub workers: WorkerSeries,
}

impl ModelMetrics {
    /// Counts one migration of `kind` (`new_request` or `ongoing_request`).
    pub fn count_migration(&self, kind: &str) {
        match kind {
            "new_request" => self.migrations_new.inc(),
            _ => self.migrations_ongoing.inc(),
        }
    }
}

impl kvmesh_router::GenerationObserver for ModelMetrics {
    fn migrated(&self, kind: &'static str) {
        self.count_migration(kind);
    }

    fn past_max_seq_len(&self) {
        self.migration_max_seq_len_exceeded.inc();
    }
}

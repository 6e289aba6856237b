//! What every model's preprocessing shares in one process: the tokenizer engine asked for, the
//! prompt prefix cache, the low-priority pool that parses, renders and tokenizes large prompts off
//! the async I/O threads ([`pool`]), and the stage timings (docs/tokenization.md).

pub mod pool;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvmesh_core::prefix::PrefixStats;
pub use pool::{PoolStopped, PreprocessPool};

use kvmesh_llm::{PrefixCache, Tokenizer, TokenizerEngine};

use crate::error::FrontendError;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntGauge, Opts, Registry};

/// Request bodies and prompt text at and above which the work goes to the pool: below it the
/// hand-off costs more than it spares the I/O threads.
pub const POOL_MIN_BYTES: usize = 32 * 1024;

/// How prompts are preprocessed, shared by every model of the process.
pub struct Preprocess {
    /// The engine `--tokenizer` asks for.
    pub engine: TokenizerEngine,
    /// `--tokenizer-fallback false`: a model the engine cannot serve is not loaded.
    pub strict_engine: bool,
    /// The prompt prefix cache.
    pub cache: Arc<PrefixCache>,
    /// `--dyn-debug-perf`: log every request's stage timings.
    pub debug_perf: bool,
    /// `--exclude-tools-when-tool-choice-none`: a request whose `tool_choice` is `none` is
    /// rendered without its tools (unless the model card turns it off).
    pub exclude_tools_when_tool_choice_none: bool,
    /// The preprocessing pool; `None` does all work in place.
    pool: Option<PreprocessPool>,
    /// Held while the cache's counters are published.
    publishing: std::sync::Mutex<()>,
    /// Stage timings and tokenizer metrics.
    pub metrics: StageMetrics,
}

impl Preprocess {
    /// Shared state for `workers` pool threads (0 = all work in place).
    pub fn new(
        engine: TokenizerEngine,
        strict_engine: bool,
        cache_bytes: usize,
        workers: usize,
        debug_perf: bool,
        metrics: StageMetrics,
    ) -> std::io::Result<Self> {
        let pool = (workers > 0)
            .then(|| {
                PreprocessPool::new(workers, move || {
                    engine.start_helper_threads();
                })
            })
            .transpose()?;
        metrics
            .preprocess_workers
            .set(pool.as_ref().map_or(0, PreprocessPool::threads) as i64);
        Ok(Self {
            engine,
            strict_engine,
            cache: Arc::new(PrefixCache::new(cache_bytes)),
            debug_perf,
            exclude_tools_when_tool_choice_none: true,
            pool,
            publishing: std::sync::Mutex::new(()),
            metrics,
        })
    }

    /// Threads of the preprocessing pool.
    pub fn workers(&self) -> usize {
        self.pool.as_ref().map_or(0, PreprocessPool::threads)
    }

    /// Runs `work` on the pool when `len` (the bytes it handles) is at least [`POOL_MIN_BYTES`]
    /// and there is a pool, else in place.
    pub async fn offload<T, E>(
        &self,
        len: usize,
        work: impl FnOnce() -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<PoolStopped> + Send + 'static,
    {
        match &self.pool {
            Some(pool) if len >= POOL_MIN_BYTES => pool.run(work).await?,
            _ => work(),
        }
    }

    /// The ids of a raw prompt with the tokenizer's special tokens; a large one on the pool.
    pub async fn encode_text(
        &self,
        tokenizer: &Arc<Tokenizer>,
        text: &str,
    ) -> Result<Vec<u32>, FrontendError> {
        let latency = self.metrics.tokenizer_latency_tokenize.clone();
        if text.len() < POOL_MIN_BYTES || self.pool.is_none() {
            return Ok(timed(&latency, || tokenizer.encode(text, true))?);
        }
        let tokenizer = tokenizer.clone();
        let text = text.to_string();
        self.offload(text.len(), move || {
            Ok(timed(&latency, || tokenizer.encode(&text, true))?)
        })
        .await
    }

    /// Publishes the prefix cache's counters and the routers' block-hash caches' (summed over
    /// models), on every `/metrics` scrape. One scrape at a time steps the counters, so two at
    /// once cannot both add the same difference.
    pub fn publish_cache_stats(&self, block_hashes: PrefixStats) {
        let _one_at_a_time = self
            .publishing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.metrics.prefix_cache.publish(self.cache.stats());
        self.metrics.block_hash_cache.publish(block_hashes);
    }
}

/// Runs one encode, observing its time in `latency` (`tokenizer_latency_ms`).
pub fn timed<T>(latency: &Histogram, encode: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let result = encode();
    latency.observe(started.elapsed().as_secs_f64() * 1000.0);
    result
}

/// The stages a request's time is split into, as `stage_duration_seconds{stage}` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Chat template rendering.
    Template,
    /// Prompt tokenization.
    Tokenize,
    /// Everything before routing: parse checks, template, tokenize, the worker request.
    Preprocess,
    /// Block hashing of the prompt for the routing decision (in-process routing only; a
    /// router replica hashes on its side).
    Hash,
    /// The routing decision, block hashing excluded (overlap lookups included).
    Route,
    /// From the decision to the worker's first response.
    Dispatch,
    /// From the request's arrival to its first token.
    FirstToken,
}

impl Stage {
    /// The `stage` label.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Template => "template",
            Stage::Tokenize => "tokenize",
            Stage::Preprocess => "preprocess",
            Stage::Hash => "hash",
            Stage::Route => "route",
            Stage::Dispatch => "dispatch",
            Stage::FirstToken => "first_token",
        }
    }

    const ALL: [Stage; 7] = [
        Stage::Template,
        Stage::Tokenize,
        Stage::Preprocess,
        Stage::Hash,
        Stage::Route,
        Stage::Dispatch,
        Stage::FirstToken,
    ];
}

/// `stage_duration_seconds`, `tokenizer_latency_ms`, the prefix caches' series and the pool size.
#[derive(Clone)]
pub struct StageMetrics {
    stages: Vec<Histogram>,
    /// `tokenizer_latency_ms{operation="tokenize"}`.
    pub tokenizer_latency_tokenize: Histogram,
    /// `tokenizer_latency_ms{operation="detokenize"}`.
    pub tokenizer_latency_detokenize: Histogram,
    prefix_cache: PrefixSeries,
    block_hash_cache: PrefixSeries,
    preprocess_workers: IntGauge,
    overhead: crate::metrics::RouterOverhead,
}

impl StageMetrics {
    /// Creates the series Dynamo also has under `prefix` and kvmesh's own (the prefix caches,
    /// the pool size) under `kvmesh_`, and registers them in `registry`.
    pub fn new(prefix: &str, registry: &Registry) -> prometheus::Result<Self> {
        let name = |suffix: &str| format!("{prefix}_{suffix}");
        let own = |suffix: &str| format!("{}_{suffix}", crate::metrics::KVMESH_PREFIX);
        let stage = HistogramVec::new(
            HistogramOpts::new(
                name("stage_duration_seconds"),
                "time spent per request stage",
            )
            .buckets(prometheus::exponential_buckets(0.000_01, 2.0, 24)?),
            &["stage"],
        )?;
        let tokenizer = HistogramVec::new(
            HistogramOpts::new(name("tokenizer_latency_ms"), "tokenizer time per call")
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 24)?),
            &["operation"],
        )?;
        let preprocess_workers = IntGauge::with_opts(Opts::new(
            own("preprocess_workers"),
            "threads of the pool that tokenizes large prompts",
        ))?;
        registry.register(Box::new(stage.clone()))?;
        registry.register(Box::new(tokenizer.clone()))?;
        registry.register(Box::new(preprocess_workers.clone()))?;
        Ok(Self {
            stages: Stage::ALL
                .iter()
                .map(|s| stage.with_label_values(&[s.label()]))
                .collect(),
            tokenizer_latency_tokenize: tokenizer.with_label_values(&["tokenize"]),
            tokenizer_latency_detokenize: tokenizer.with_label_values(&["detokenize"]),
            prefix_cache: PrefixSeries::new(
                &own("tokenizer_prefix_cache"),
                "prompts",
                "prompt tokens taken from the prefix cache instead of encoded",
                "reused_tokens_total",
                registry,
            )?,
            block_hash_cache: PrefixSeries::new(
                &own("router_block_hash_cache"),
                "prompts",
                "prompt blocks whose hashes were reused instead of computed",
                "reused_blocks_total",
                registry,
            )?,
            preprocess_workers,
            overhead: crate::metrics::RouterOverhead::new(registry)?,
        })
    }

    /// Records `elapsed` for `stage`.
    pub fn observe(&self, stage: Stage, elapsed: Duration) {
        if let Some(histogram) = self.stages.get(stage as usize) {
            histogram.observe(elapsed.as_secs_f64());
        }
    }
}

/// The series of one [`kvmesh_core::prefix::PrefixStore`]: hits, misses, what was reused, bytes
/// and entries held.
#[derive(Clone)]
struct PrefixSeries {
    hits: IntCounter,
    misses: IntCounter,
    reused: IntCounter,
    bytes: IntGauge,
    entries: IntGauge,
}

impl PrefixSeries {
    fn new(
        prefix: &str,
        what: &str,
        reused_help: &str,
        reused_suffix: &str,
        registry: &Registry,
    ) -> prometheus::Result<Self> {
        let counter = |suffix: &str, help: String| {
            IntCounter::with_opts(Opts::new(format!("{prefix}_{suffix}"), help))
        };
        let gauge = |suffix: &str, help: String| {
            IntGauge::with_opts(Opts::new(format!("{prefix}_{suffix}"), help))
        };
        let series = Self {
            hits: counter("hits_total", format!("{what} that reused a cached prefix"))?,
            misses: counter(
                "misses_total",
                format!("{what} with cut points that found no cached prefix"),
            )?,
            reused: counter(reused_suffix, reused_help.to_string())?,
            bytes: gauge("bytes", "bytes the cache holds".to_string())?,
            entries: gauge("entries", format!("{what} the cache holds"))?,
        };
        for counter in [&series.hits, &series.misses, &series.reused] {
            registry.register(Box::new(counter.clone()))?;
        }
        for gauge in [&series.bytes, &series.entries] {
            registry.register(Box::new(gauge.clone()))?;
        }
        Ok(series)
    }

    /// Steps the counters up to `stats` and sets the gauges.
    fn publish(&self, stats: PrefixStats) {
        self.hits.inc_by(stats.hits.saturating_sub(self.hits.get()));
        self.misses
            .inc_by(stats.misses.saturating_sub(self.misses.get()));
        self.reused
            .inc_by(stats.reused.saturating_sub(self.reused.get()));
        self.bytes.set(stats.bytes as i64);
        self.entries.set(stats.entries as i64);
    }
}

/// One request's stage timings: each is observed as it ends, and with `--dyn-debug-perf` the
/// whole set is logged at the first token. A request with several choices clones it after
/// preprocessing, so each choice records its own route, dispatch and first token.
#[derive(Clone)]
pub struct RequestTimer {
    preprocess: Arc<Preprocess>,
    arrived: Instant,
    stages: [Option<Duration>; Stage::ALL.len()],
}

impl RequestTimer {
    /// Starts timing a request that arrived now.
    pub fn start(preprocess: &Arc<Preprocess>) -> Self {
        Self {
            preprocess: preprocess.clone(),
            arrived: Instant::now(),
            stages: [None; Stage::ALL.len()],
        }
    }

    /// Records `elapsed` for `stage`.
    pub fn record(&mut self, stage: Stage, elapsed: Duration) {
        self.preprocess.metrics.observe(stage, elapsed);
        self.stages[stage as usize] = Some(elapsed);
    }

    /// Records the time since arrival for `stage`.
    pub fn record_since_arrival(&mut self, stage: Stage) {
        self.record(stage, self.arrived.elapsed());
    }

    /// Records where the start of `generation` spent its time.
    pub fn record_started(&mut self, generation: &kvmesh_router::Generation) {
        let timings = generation.timings();
        self.preprocess.metrics.overhead.observe(&timings);
        if !timings.hash.is_zero() {
            self.record(Stage::Hash, timings.hash);
        }
        self.record(Stage::Route, timings.route);
        self.record(Stage::Dispatch, timings.dispatch);
    }

    /// The detokenizer's histogram, for the output path.
    pub fn detokenize_latency(&self) -> &Histogram {
        &self.preprocess.metrics.tokenizer_latency_detokenize
    }

    /// The first token arrived: records it and logs every stage with `--dyn-debug-perf`.
    pub fn first_token(&mut self, request_id: &str) {
        self.record_since_arrival(Stage::FirstToken);
        if !self.preprocess.debug_perf {
            return;
        }
        let ms =
            |stage: Stage| self.stages[stage as usize].map_or(-1.0, |d| d.as_secs_f64() * 1000.0);
        tracing::info!(
            request_id,
            template_ms = ms(Stage::Template),
            tokenize_ms = ms(Stage::Tokenize),
            preprocess_ms = ms(Stage::Preprocess),
            hash_ms = ms(Stage::Hash),
            route_ms = ms(Stage::Route),
            dispatch_ms = ms(Stage::Dispatch),
            first_token_ms = ms(Stage::FirstToken),
            "request stage timings"
        );
    }
}

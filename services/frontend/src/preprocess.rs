//! What every model's preprocessing shares in one process: the tokenizer engine asked for, the
//! prompt prefix cache, the bounded pool that tokenizes large prompts off the async I/O threads,
//! and the stage timings (docs/tokenization.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvmesh_llm::{LlmError, PrefixCache, Tokenizer, TokenizerEngine};
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntGauge, Opts, Registry};
use tokio::sync::Semaphore;

/// Prompt text at and above which tokenizing goes to the pool: below it the hand-off costs
/// more than it spares the I/O threads.
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
    /// Permits of the preprocessing pool; `None` tokenizes in place.
    pool: Option<Arc<Semaphore>>,
    workers: usize,
    /// Held while the cache's counters are published.
    publishing: std::sync::Mutex<()>,
    /// Stage timings and tokenizer metrics.
    pub metrics: StageMetrics,
}

impl Preprocess {
    /// Shared state for `workers` pool threads (0 = tokenize in place).
    pub fn new(
        engine: TokenizerEngine,
        strict_engine: bool,
        cache_bytes: usize,
        workers: usize,
        debug_perf: bool,
        metrics: StageMetrics,
    ) -> Self {
        metrics.preprocess_workers.set(workers as i64);
        Self {
            engine,
            strict_engine,
            cache: Arc::new(PrefixCache::new(cache_bytes)),
            debug_perf,
            pool: (workers > 0).then(|| Arc::new(Semaphore::new(workers))),
            workers,
            publishing: std::sync::Mutex::new(()),
            metrics,
        }
    }

    /// Threads of the preprocessing pool.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The ids of a rendered chat prompt, through the prefix cache; a large one on the pool.
    pub async fn encode_chat(
        &self,
        tokenizer: &Arc<Tokenizer>,
        text: String,
    ) -> Result<Vec<u32>, LlmError> {
        let cache = self.cache.clone();
        let tokenizer = tokenizer.clone();
        self.run(text.len(), move || cache.encode(&tokenizer, &text))
            .await
    }

    /// The ids of a raw prompt with the tokenizer's special tokens; a large one on the pool.
    pub async fn encode_text(
        &self,
        tokenizer: &Arc<Tokenizer>,
        text: &str,
    ) -> Result<Vec<u32>, LlmError> {
        if text.len() < POOL_MIN_BYTES || self.pool.is_none() {
            return self.timed(|| tokenizer.encode(text, true));
        }
        let tokenizer = tokenizer.clone();
        let text = text.to_string();
        self.run(text.len(), move || tokenizer.encode(&text, true))
            .await
    }

    async fn run(
        &self,
        len: usize,
        encode: impl FnOnce() -> Result<Vec<u32>, LlmError> + Send + 'static,
    ) -> Result<Vec<u32>, LlmError> {
        let pool = match &self.pool {
            Some(pool) if len >= POOL_MIN_BYTES => pool,
            _ => return self.timed(encode),
        };
        let _permit = pool
            .acquire()
            .await
            .map_err(|_| LlmError::Tokenizer("preprocessing pool closed".into()))?;
        let tokenize = self.metrics.tokenizer_latency_tokenize.clone();
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let ids = encode();
            tokenize.observe(started.elapsed().as_secs_f64() * 1000.0);
            ids
        })
        .await
        .map_err(|e| LlmError::Tokenizer(format!("preprocessing task failed: {e}")))?
    }

    fn timed(
        &self,
        encode: impl FnOnce() -> Result<Vec<u32>, LlmError>,
    ) -> Result<Vec<u32>, LlmError> {
        let started = Instant::now();
        let ids = encode();
        self.metrics
            .tokenizer_latency_tokenize
            .observe(started.elapsed().as_secs_f64() * 1000.0);
        ids
    }

    /// Publishes the prefix cache's counters (called on every `/metrics` scrape). One scrape at
    /// a time steps the counters, so two at once cannot both add the same difference.
    pub fn publish_cache_stats(&self) {
        let _one_at_a_time = self
            .publishing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let stats = self.cache.stats();
        let metrics = &self.metrics;
        metrics
            .cache_hits
            .inc_by(stats.hits.saturating_sub(metrics.cache_hits.get()));
        metrics
            .cache_misses
            .inc_by(stats.misses.saturating_sub(metrics.cache_misses.get()));
        metrics.cache_reused_tokens.inc_by(
            stats
                .reused_tokens
                .saturating_sub(metrics.cache_reused_tokens.get()),
        );
        metrics.cache_bytes.set(stats.bytes as i64);
        metrics.cache_entries.set(stats.entries as i64);
    }
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
    /// The routing decision (block hashing and overlap included).
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
            Stage::Route => "route",
            Stage::Dispatch => "dispatch",
            Stage::FirstToken => "first_token",
        }
    }

    const ALL: [Stage; 6] = [
        Stage::Template,
        Stage::Tokenize,
        Stage::Preprocess,
        Stage::Route,
        Stage::Dispatch,
        Stage::FirstToken,
    ];
}

/// `stage_duration_seconds`, `tokenizer_latency_ms`, the prefix cache's series and the pool size.
#[derive(Clone)]
pub struct StageMetrics {
    stages: Vec<Histogram>,
    /// `tokenizer_latency_ms{operation="tokenize"}`.
    pub tokenizer_latency_tokenize: Histogram,
    /// `tokenizer_latency_ms{operation="detokenize"}`.
    pub tokenizer_latency_detokenize: Histogram,
    cache_hits: IntCounter,
    cache_misses: IntCounter,
    cache_reused_tokens: IntCounter,
    cache_bytes: IntGauge,
    cache_entries: IntGauge,
    preprocess_workers: IntGauge,
}

impl StageMetrics {
    /// Creates the series under `prefix` and registers them in `registry`.
    pub fn new(prefix: &str, registry: &Registry) -> prometheus::Result<Self> {
        let name = |suffix: &str| format!("{prefix}_{suffix}");
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
        let counter =
            |suffix: &str, help: &str| IntCounter::with_opts(Opts::new(name(suffix), help));
        let gauge = |suffix: &str, help: &str| IntGauge::with_opts(Opts::new(name(suffix), help));
        let metrics = Self {
            stages: Stage::ALL
                .iter()
                .map(|s| stage.with_label_values(&[s.label()]))
                .collect(),
            tokenizer_latency_tokenize: tokenizer.with_label_values(&["tokenize"]),
            tokenizer_latency_detokenize: tokenizer.with_label_values(&["detokenize"]),
            cache_hits: counter(
                "tokenizer_prefix_cache_hits_total",
                "prompts that reused a cached prefix tokenization",
            )?,
            cache_misses: counter(
                "tokenizer_prefix_cache_misses_total",
                "prompts with cut points that found no cached prefix",
            )?,
            cache_reused_tokens: counter(
                "tokenizer_prefix_cache_reused_tokens_total",
                "prompt tokens taken from the prefix cache instead of encoded",
            )?,
            cache_bytes: gauge(
                "tokenizer_prefix_cache_bytes",
                "bytes the prefix cache holds",
            )?,
            cache_entries: gauge(
                "tokenizer_prefix_cache_entries",
                "prompts the prefix cache holds",
            )?,
            preprocess_workers: gauge(
                "preprocess_workers",
                "threads of the pool that tokenizes large prompts",
            )?,
        };
        registry.register(Box::new(stage))?;
        registry.register(Box::new(tokenizer))?;
        for collector in [
            &metrics.cache_hits,
            &metrics.cache_misses,
            &metrics.cache_reused_tokens,
        ] {
            registry.register(Box::new(collector.clone()))?;
        }
        for collector in [
            &metrics.cache_bytes,
            &metrics.cache_entries,
            &metrics.preprocess_workers,
        ] {
            registry.register(Box::new(collector.clone()))?;
        }
        Ok(metrics)
    }

    /// Records `elapsed` for `stage`.
    pub fn observe(&self, stage: Stage, elapsed: Duration) {
        if let Some(histogram) = self.stages.get(stage as usize) {
            histogram.observe(elapsed.as_secs_f64());
        }
    }
}

/// One request's stage timings: each is observed as it ends, and with `--dyn-debug-perf` the
/// whole set is logged at the first token.
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
            route_ms = ms(Stage::Route),
            dispatch_ms = ms(Stage::Dispatch),
            first_token_ms = ms(Stage::FirstToken),
            "request stage timings"
        );
    }
}

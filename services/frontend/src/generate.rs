//! The engine side of a request, shared by every endpoint: the model's routing seam starts the
//! generation (routing, retries, load reports and migration all live there), and this turns the
//! worker's token stream into text deltas with stop handling and the edge's latency metrics.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::BoxStream;
use kvmesh_llm::openai::{FinishReason as OpenAiFinish, ToolCallDelta};
use kvmesh_proto::v1::{FinishReason, GenerateRequest, TokenLogprob};
pub use kvmesh_router::{FirstResponseWait, GenerateOptions, Generation};

use crate::error::FrontendError;
use crate::models::ModelEntry;
use crate::pipeline::OutputProcessor;
use crate::preprocess::RequestTimer;

/// The text deltas of a started request. Boxed once where they are made: the stream holds the
/// generation and its output processor (kilobytes), and every layer above (choices, the
/// endpoint's framer, a unary fold) would otherwise move and pin a copy of it.
pub type DeltaStream = BoxStream<'static, Result<TextDelta, FrontendError>>;

/// Token accounting reported to the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens found in the worker's KV cache.
    pub cached_tokens: u32,
}

/// One step of output for a client.
#[derive(Debug, Default)]
pub struct TextDelta {
    /// The choice it belongs to (0 unless the request asked for `n > 1`).
    pub index: u32,
    /// New text (may be empty): the answer, once a reasoning parser split the thinking off.
    pub text: String,
    /// New reasoning text split off by the model's reasoning parser (may be empty).
    pub reasoning: String,
    /// Generated token ids behind this text.
    pub num_tokens: u32,
    /// OpenAI finish reason on the last delta.
    pub finish_reason: Option<OpenAiFinish>,
    /// Usage, on the last delta.
    pub usage: Option<TokenUsage>,
    /// The stop string that ended generation, on the last delta when one did.
    pub stop_sequence: Option<String>,
    /// Log probabilities of the tokens behind this delta, when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// Tool calls read from the output so far (each whole, with its id and name), when the
    /// request offered tools and the model's card names a parser.
    pub tool_calls: Vec<ToolCallDelta>,
    /// The worker serving the request, on the first delta after it became known, where it was
    /// not known when the response started (a chat processor routes its calls itself).
    pub served_by: Option<ServedBy>,
}

/// The worker (and data-parallel rank) a request was routed to: what a response's `nvext`
/// `worker_id` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedBy {
    /// The worker's instance id.
    pub worker_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
}

/// Starts `request` through the model's seam, waiting for the worker's first response as
/// `options.wait` says so that early failures become proper error statuses (`options`: hints,
/// the prompt's cut points so the router reuses a known prefix's block hashes, deadlines, and
/// the request's span).
pub async fn start(
    entry: &Arc<ModelEntry>,
    request: GenerateRequest,
    options: GenerateOptions,
) -> Result<Generation, FrontendError> {
    Ok(entry.routing.generate(request, options).await?)
}

/// Text deltas of a started generation. Ends after the delta carrying a finish reason, or with an
/// error; a cancelled generation ends without a finish reason. Dropping it cancels the worker.
/// `timer` records the start's route and dispatch time now and the first token when it comes.
pub fn text_deltas(
    generation: Generation,
    mut output: OutputProcessor,
    num_prompt_tokens: u32,
    metrics: crate::metrics::ModelMetrics,
    mut timer: RequestTimer,
    request_id: String,
) -> DeltaStream {
    let begin = Instant::now();
    timer.record_started(&generation);
    metrics.router_requests.inc();
    let worker = metrics
        .workers
        .of(generation.worker_id(), generation.dp_rank());
    worker.last_isl.set(i64::from(num_prompt_tokens));
    async_stream::stream! {
        // Dropped with the stream (client disconnect) it frees the request as disconnected.
        let mut generation = generation;
        let mut usage = TokenUsage { prompt_tokens: num_prompt_tokens, ..Default::default() };
        let mut last_token_at: Option<Instant> = None;
        let mut first_token_at: Option<Instant> = None;
        // Counted as queued until the first token, then as active until the stream ends.
        let mut phase = GaugeHold::new(metrics.queued.clone());
        while let Some(next) = generation.next().await {
            let response = match next {
                Ok(response) => response,
                Err(error) => {
                    yield Err(error.into());
                    return;
                }
            };
            if !response.token_ids.is_empty() {
                let now = Instant::now();
                match last_token_at {
                    None => {
                        let ttft = now.duration_since(begin).as_secs_f64();
                        metrics.ttft.observe(ttft);
                        metrics.router_ttft.observe(ttft);
                        worker.last_ttft.set(ttft);
                        timer.first_token(&request_id);
                        phase = GaugeHold::new(metrics.active.clone());
                        first_token_at = Some(now);
                    }
                    Some(previous) => {
                        let itl = now.duration_since(previous).as_secs_f64();
                        metrics.itl.observe(itl);
                        metrics.router_itl.observe(itl);
                    }
                }
                last_token_at = Some(now);
            }
            if let Some(reported) = &response.usage {
                usage.cached_tokens = reported.cached_tokens;
                if reported.prompt_tokens > 0 {
                    usage.prompt_tokens = reported.prompt_tokens;
                }
            }
            let num_tokens = response.token_ids.len() as u32;
            let logprobs = response.logprobs;
            usage.completion_tokens += num_tokens;
            let detokenizing = Instant::now();
            let step = output.push_tokens(&response.token_ids);
            timer.detokenize_latency().observe(detokenizing.elapsed().as_secs_f64() * 1000.0);
            let finish = FinishReason::try_from(response.finish_reason).unwrap_or(FinishReason::Unspecified);
            if step.stopped {
                generation.complete();
                let mut delta = TextDelta { text: step.text, num_tokens, logprobs, ..Default::default() };
                delta.finish_reason = Some(OpenAiFinish::Stop);
                delta.usage = Some(usage);
                delta.stop_sequence = output.matched_stop().map(str::to_string);
                record_mean_itl(&worker, first_token_at, last_token_at, usage.completion_tokens);
                drop(phase);
                yield Ok(delta);
                return;
            }
            match finish {
                FinishReason::Unspecified => {
                    if !step.text.is_empty() || num_tokens > 0 {
                        yield Ok(TextDelta { text: step.text, num_tokens, logprobs, ..Default::default() });
                    }
                }
                other => {
                    let mut text = step.text;
                    text.push_str(&output.flush());
                    let reason = match other {
                        FinishReason::Length => OpenAiFinish::Length,
                        FinishReason::ContentFilter => OpenAiFinish::ContentFilter,
                        _ => OpenAiFinish::Stop,
                    };
                    record_mean_itl(&worker, first_token_at, last_token_at, usage.completion_tokens);
                    drop(phase);
                    yield Ok(TextDelta { text, num_tokens, finish_reason: Some(reason), usage: Some(usage), logprobs, ..Default::default() });
                    return;
                }
            }
        }
    }
    .boxed()
}

/// Holds one count of a gauge (queued, active) until dropped.
struct GaugeHold(prometheus::IntGauge);

impl GaugeHold {
    fn new(gauge: prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for GaugeHold {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Sets the worker's `worker_last_inter_token_latency_seconds` to the finished request's mean
/// gap between tokens.
fn record_mean_itl(
    worker: &crate::metrics::WorkerGauges,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u32,
) {
    if let (Some(first), Some(last)) = (first, last)
        && tokens > 1
    {
        worker
            .last_itl
            .set(last.duration_since(first).as_secs_f64() / f64::from(tokens - 1));
    }
}

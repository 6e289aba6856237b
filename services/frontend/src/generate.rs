//! The engine side of a request, shared by every endpoint: pick a worker, start the generation,
//! and turn the worker's token stream into text deltas with stop handling.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kvmesh_proto::v1::{FinishReason, GenerateRequest, GenerateResponse};
use kvmesh_runtime::worker_client::ResponseStream;

use kvmesh_llm::openai::FinishReason as OpenAiFinish;

use crate::error::FrontendError;
use crate::models::{ModelEntry, WorkerRef};
use crate::pipeline::OutputProcessor;
use crate::router::RouteContext;

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
    /// New text (may be empty).
    pub text: String,
    /// Generated token ids behind this text.
    pub num_tokens: u32,
    /// OpenAI finish reason on the last delta.
    pub finish_reason: Option<OpenAiFinish>,
    /// Usage, on the last delta.
    pub usage: Option<TokenUsage>,
}

/// A started generation: the worker that serves it and its response stream.
pub struct Started {
    /// Worker instance id.
    pub worker_id: u64,
    /// Data-parallel rank, when the worker reported it.
    pub dp_rank: u32,
    /// The first response, already received (pre-commit peek).
    first: Option<GenerateResponse>,
    stream: ResponseStream,
}

/// How many workers one request tries before giving up, when the earlier ones are unreachable.
const MAX_START_ATTEMPTS: usize = 3;

/// Routes `request` and starts it, waiting for the first response so that early failures become
/// proper error statuses. A worker that cannot be reached (dead but not yet expired from
/// discovery) is skipped for the next one: nothing has reached the client yet, so retrying is safe.
pub async fn start(
    entry: &Arc<ModelEntry>,
    request: GenerateRequest,
    first_response_timeout: Option<Duration>,
) -> Result<Started, FrontendError> {
    let first_index = entry
        .router
        .select(
            &entry.worker_ids,
            &RouteContext {
                token_ids: &request.token_ids,
            },
        )
        .ok_or_else(|| FrontendError::NoWorkers(entry.name.clone()))?;
    let num_workers = entry.workers.len();
    let num_attempts = MAX_START_ATTEMPTS.min(num_workers);
    let mut request = Some(request);
    let mut last_error = None;
    for attempt in 0..num_attempts {
        let Some(worker) = entry.workers.get((first_index + attempt) % num_workers) else {
            break;
        };
        // Only a request that may be retried is copied; the last attempt takes the original.
        let this_request = if attempt + 1 == num_attempts {
            request.take()
        } else {
            request.clone()
        };
        let Some(this_request) = this_request else {
            break;
        };
        match start_on(worker, this_request, first_response_timeout).await {
            Ok(started) => return Ok(started),
            Err(error) if is_unreachable(&error) => {
                tracing::warn!(worker_id = %format!("{:x}", worker.id), %error, "worker unreachable, trying another");
                last_error = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| FrontendError::NoWorkers(entry.name.clone())))
}

fn is_unreachable(error: &FrontendError) -> bool {
    matches!(
        error,
        FrontendError::Worker {
            code: kvmesh_runtime::ErrorCode::Unavailable,
            ..
        }
    )
}

async fn start_on(
    worker: &WorkerRef,
    request: GenerateRequest,
    first_response_timeout: Option<Duration>,
) -> Result<Started, FrontendError> {
    let worker_id = worker.id;
    let endpoint = worker.endpoint.clone();
    let begin = async move {
        let mut stream = endpoint.generate(request).await?;
        let first = stream.next().await;
        Ok::<_, FrontendError>((stream, first))
    };
    let (stream, first) = match first_response_timeout {
        Some(limit) => tokio::time::timeout(limit, begin)
            .await
            .map_err(|_| FrontendError::Timeout(limit.as_secs()))??,
        None => begin.await?,
    };
    let first = match first {
        Some(Ok(response)) => response,
        Some(Err(status)) => return Err(status.into()),
        None => {
            return Err(FrontendError::Worker {
                code: kvmesh_runtime::ErrorCode::Unavailable,
                message: "worker closed the stream without a response".into(),
            });
        }
    };
    let dp_rank = first.worker.as_ref().map(|w| w.dp_rank).unwrap_or(0);
    Ok(Started {
        worker_id,
        dp_rank,
        first: Some(first),
        stream,
    })
}

/// Text deltas of a started generation. Ends after the delta carrying a finish reason, or with an
/// error; a cancelled generation ends without a finish reason. Dropping it cancels the worker.
pub fn text_deltas(
    started: Started,
    mut output: OutputProcessor,
    num_prompt_tokens: u32,
    metrics: crate::metrics::ModelMetrics,
) -> impl Stream<Item = Result<TextDelta, FrontendError>> + Send {
    let Started {
        mut first, stream, ..
    } = started;
    let begin = Instant::now();
    async_stream::stream! {
        let mut stream = stream;
        let mut usage = TokenUsage { prompt_tokens: num_prompt_tokens, ..Default::default() };
        let mut last_token_at: Option<Instant> = None;
        loop {
            let response = match first.take() {
                Some(response) => response,
                None => match stream.next().await {
                    Some(Ok(response)) => response,
                    Some(Err(status)) => {
                        yield Err(FrontendError::from(status));
                        return;
                    }
                    None => {
                        yield Err(FrontendError::Worker {
                            code: kvmesh_runtime::ErrorCode::Unavailable,
                            message: "worker stream ended without a finish reason".into(),
                        });
                        return;
                    }
                },
            };
            if !response.token_ids.is_empty() {
                let now = Instant::now();
                match last_token_at {
                    None => metrics.ttft.observe(now.duration_since(begin).as_secs_f64()),
                    Some(previous) => metrics.itl.observe(now.duration_since(previous).as_secs_f64()),
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
            usage.completion_tokens += num_tokens;
            let step = output.push_tokens(&response.token_ids);
            let finish = FinishReason::try_from(response.finish_reason).unwrap_or(FinishReason::Unspecified);
            if step.stopped {
                let mut delta = TextDelta { text: step.text, num_tokens, ..Default::default() };
                delta.finish_reason = Some(OpenAiFinish::Stop);
                delta.usage = Some(usage);
                yield Ok(delta);
                return;
            }
            match finish {
                FinishReason::Unspecified => {
                    if !step.text.is_empty() || num_tokens > 0 {
                        yield Ok(TextDelta { text: step.text, num_tokens, ..Default::default() });
                    }
                }
                FinishReason::Error => {
                    yield Err(FrontendError::Worker {
                        code: kvmesh_runtime::ErrorCode::Internal,
                        message: if response.error.is_empty() { "worker failed".into() } else { response.error },
                    });
                    return;
                }
                FinishReason::Cancelled => return,
                other => {
                    let mut text = step.text;
                    text.push_str(&output.flush());
                    let reason = match other {
                        FinishReason::Length => OpenAiFinish::Length,
                        FinishReason::ContentFilter => OpenAiFinish::ContentFilter,
                        _ => OpenAiFinish::Stop,
                    };
                    yield Ok(TextDelta { text, num_tokens, finish_reason: Some(reason), usage: Some(usage) });
                    return;
                }
            }
        }
    }
}

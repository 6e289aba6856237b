//! One KServe inference request on the completions path: decode the tensors, check, start the
//! generation through the model's routing seam, and frame its deltas as `ModelInferResponse`s.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kvmesh_llm::openai::{CompletionRequest, SamplingOptions};
use kvmesh_proto::inference::infer_parameter::ParameterChoice;
use kvmesh_proto::inference::{InferParameter, ModelInferRequest, ModelInferResponse};
use kvmesh_routing::RoutingHints;
use kvmesh_runtime::otel::Trace;

use super::tensors::{self, LlmInputs};
use crate::completion::{self, StartSettings};
use crate::error::FrontendError;
use crate::generate::{FirstResponseWait, TextDelta, TokenUsage};
use crate::http::AppState;
use crate::http::request_metrics::{EarlyRequest, RequestScope};
use crate::http::sse;
use crate::models::{ModelEntry, find_model};
use crate::preprocess::RequestTimer;

/// The endpoint label of unary `ModelInfer` requests.
pub const INFER_ENDPOINT: &str = "kserve_infer";
/// The endpoint label of requests sent on a `ModelStreamInfer` stream.
pub const STREAM_ENDPOINT: &str = "kserve_stream";

/// A decoded, checked request, ready to start.
pub struct Prepared {
    model_name: String,
    id: String,
    inputs: LlmInputs,
    entry: Arc<ModelEntry>,
    completion: CompletionRequest,
    sampling: SamplingOptions,
    hints: RoutingHints,
    timer: RequestTimer,
    parent: Trace,
}

impl Prepared {
    /// Whether the request asked for one response per delta.
    pub fn is_streaming(&self) -> bool {
        self.inputs.streaming
    }

    /// The caller's trace context, read from the call's metadata (`traceparent`, `tracestate`)
    /// with `Trace::from_metadata`: the request's span becomes its child (docs/tracing.md).
    pub fn with_parent(mut self, parent: Trace) -> Self {
        self.parent = parent;
        self
    }
}

/// Decodes and checks `request`: an unknown model first (`NOT_FOUND`, whatever the tensors
/// say), then the inputs (`streaming` only where `allow_streaming`), the parameters and the
/// routing hints. A failure is counted under `endpoint`.
pub fn prepare(
    state: &Arc<AppState>,
    request: ModelInferRequest,
    endpoint: &'static str,
    allow_streaming: bool,
) -> Result<Prepared, FrontendError> {
    let timer = RequestTimer::start(&state.preprocess);
    let mut early = EarlyRequest::default();
    let prepared = (|| {
        state.check_accepting()?;
        early.parsed(state, &request.model_name, false);
        let entry = find_model(&state.models, &request.model_name)?;
        let mut inputs = tensors::decode_inputs(&request)?;
        early.stream = inputs.streaming;
        if inputs.streaming && !allow_streaming {
            return Err(FrontendError::invalid(
                "Streaming is not supported for this endpoint; use ModelStreamInfer",
                Some("streaming"),
            ));
        }
        let text = std::mem::take(&mut inputs.text);
        let completion = tensors::completion_request(&request, text, inputs.streaming)?;
        let sampling = completion::check(&completion)?;
        let hints = tensors::routing_hints(&request, state.settings.disable_nvext)?;
        Ok((entry, inputs, completion, sampling, hints))
    })();
    match prepared {
        Ok((entry, inputs, completion, sampling, hints)) => Ok(Prepared {
            model_name: request.model_name,
            id: request.id,
            inputs,
            entry,
            completion,
            sampling,
            hints,
            timer,
            parent: Trace::off(),
        }),
        Err(error) => {
            early.count_failure(state, endpoint, &error);
            Err(error)
        }
    }
}

/// What a request's responses are built from: its model and id, its contents form and the
/// worker serving it.
struct Reply {
    model_name: String,
    id: String,
    raw: bool,
    worker_id: u64,
}

impl Reply {
    /// A response; the last one (with `usage`) also names the worker in `worker_id`, as the
    /// HTTP edge's `nvext.worker_id` does.
    fn response(
        &self,
        text: &str,
        finish_reason: &str,
        usage: Option<TokenUsage>,
    ) -> ModelInferResponse {
        let is_last = usage.is_some();
        let mut response = tensors::response(
            &self.model_name,
            &self.id,
            text,
            finish_reason,
            usage,
            self.raw,
        );
        if is_last {
            response.parameters.insert(
                "worker_id".into(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::Uint64Param(self.worker_id)),
                },
            );
        }
        response
    }
}

/// Starts `prepared` through the seam; returns its deltas, the scope that counts it and what
/// its responses are built from.
async fn start(
    state: &Arc<AppState>,
    prepared: Prepared,
    endpoint: &'static str,
) -> Result<
    (
        impl Stream<Item = Result<TextDelta, FrontendError>> + Send + use<>,
        RequestScope,
        Reply,
    ),
    FrontendError,
> {
    let Prepared {
        model_name,
        id,
        inputs,
        entry,
        completion,
        sampling,
        hints,
        timer,
        parent,
    } = prepared;
    let mut scope = RequestScope::new(state, &entry, endpoint, inputs.streaming)?;
    let trace = scope.start_trace(parent).clone();
    let settings = StartSettings {
        request_id: uuid::Uuid::new_v4().to_string(),
        hints,
        response_timeout: state.settings.backend_stream_timeout,
        wait: if inputs.streaming {
            FirstResponseWait::None
        } else {
            FirstResponseWait::Full
        },
        trace,
    };
    match completion::start(&entry, &completion, &sampling, timer, settings).await {
        Ok(started) => Ok((
            started.deltas,
            scope,
            Reply {
                model_name,
                id,
                raw: inputs.raw,
                worker_id: started.worker_id,
            },
        )),
        Err(error) => {
            scope.finish(Some(&error));
            Err(error)
        }
    }
}

/// Runs `prepared` to its end and answers with one folded response.
pub async fn unary(
    state: &Arc<AppState>,
    prepared: Prepared,
    endpoint: &'static str,
) -> Result<ModelInferResponse, FrontendError> {
    let (deltas, mut scope, reply) = start(state, prepared, endpoint).await?;
    let (answer, usage) = sse::collect_unary(deltas, &mut scope, String::new())
        .await?
        .into_single();
    let finish = answer.finish_reason.map_or("", |reason| reason.as_str());
    Ok(reply.response(&answer.text, finish, Some(usage)))
}

/// Runs a streaming `prepared`: one response per delta with text, the last one with the finish
/// reason and the usage. An error ends the responses.
pub fn streamed(
    state: Arc<AppState>,
    prepared: Prepared,
    endpoint: &'static str,
) -> impl Stream<Item = Result<ModelInferResponse, FrontendError>> + Send {
    async_stream::stream! {
        let (deltas, mut scope, reply) = match start(&state, prepared, endpoint).await {
            Ok(started) => started,
            Err(error) => {
                yield Err(error);
                return;
            }
        };
        let mut deltas = std::pin::pin!(deltas);
        while let Some(delta) = deltas.next().await {
            let delta = match delta {
                Ok(delta) => delta,
                Err(error) => {
                    scope.finish(Some(&error));
                    yield Err(error);
                    return;
                }
            };
            let Some(reason) = delta.finish_reason else {
                if !delta.text.is_empty() {
                    yield Ok(reply.response(&delta.text, "", None));
                }
                continue;
            };
            let usage = delta.usage.unwrap_or_default();
            scope.observe_tokens(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
            scope.finish(None);
            yield Ok(reply.response(&delta.text, reason.as_str(), Some(usage)));
            return;
        }
        // Cancelled by the engine: no finish reason to report.
        scope.finish(None);
        yield Ok(reply.response("", "", None));
    }
}

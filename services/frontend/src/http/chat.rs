//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use futures::future::Either;
use futures::{Stream, StreamExt};
use kvmesh_llm::EncodedPrompt;
use kvmesh_llm::openai::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionObject, ChatCompletionRequest,
    ChatCompletionResponse, ChatResponseMessage, Role, Usage,
};

use super::AppState;
use super::endpoint::{Arrival, Endpoint};
use super::openai_shared::{
    check_supported, now_secs, response_nvext, wants_worker_nvext, worker_nvext,
};
use super::request_metrics::RequestScope;
use super::sse;
use crate::chat_output::{self, OutputParsing};
use crate::choices;
use crate::error::FrontendError;
use crate::generate::{GenerateOptions, TextDelta, TokenUsage};
use crate::logprobs::LogprobText;
use crate::models::find_model;
use crate::opts::ReasoningField;
use crate::pipeline::generate_request;
use crate::preprocess::{RequestTimer, Stage};
use crate::processor::{self, ProcessorRequest};

/// `POST /v1/chat/completions`, streaming or unary.
pub(crate) struct ChatCompletions;

impl Endpoint for ChatCompletions {
    const NAME: &'static str = "chat_completions";
    type Request = ChatCompletionRequest;

    async fn handle(
        state: &Arc<AppState>,
        mut request: ChatCompletionRequest,
        arrival: Arrival<'_>,
    ) -> Result<Response, FrontendError> {
        super::drop_disabled_nvext(&state.settings, &mut request.nvext);
        arrival
            .early
            .parsed(state, &request.model, request.is_stream());
        request.adopt_legacy_functions()?;
        let request = Arc::new(request);
        let request_id = arrival.request_id;
        let started = start(state, Self::NAME, &request, arrival).await?;
        respond(state, &request, request_id, started).await
    }
}

async fn respond(
    state: &AppState,
    request: &ChatCompletionRequest,
    request_id: &str,
    started: StartedChat<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static>,
) -> Result<Response, FrontendError> {
    let StartedChat {
        deltas,
        mut scope,
        model,
        nvext,
        logprobs,
        ..
    } = started;
    let stream = request.is_stream();
    let id = format!("chatcmpl-{request_id}");
    let created = now_secs();
    // Where the worker is known only once the request runs (a chat processor), a delta names it.
    let wants_worker = nvext.is_none() && wants_worker_nvext(&state.settings, &request.nvext);

    if !stream {
        let answer = sse::collect_unary(deltas, &mut scope, String::new()).await?;
        let nvext = nvext.or_else(|| answer.served_by.filter(|_| wants_worker).map(worker_nvext));
        let usage = answer.usage;
        let choices = answer
            .choices
            .into_iter()
            .enumerate()
            .map(|(index, choice)| ChatChoice {
                index: index as u32,
                logprobs: logprobs.as_ref().map(|namer| namer.chat(&choice.logprobs)),
                message: ChatResponseMessage {
                    role: Role::Assistant,
                    // With tool calls and nothing else to say, content is null (as OpenAI).
                    content: (choice.tool_calls.is_empty() || !choice.text.trim().is_empty())
                        .then_some(choice.text),
                    tool_calls: (!choice.tool_calls.is_empty()).then_some(choice.tool_calls),
                    ..reasoning_message(state.settings.reasoning_field, choice.reasoning)
                },
                finish_reason: choice.finish_reason,
            })
            .collect();
        let response = ChatCompletionResponse {
            id,
            object: ChatCompletionObject,
            created,
            model,
            choices,
            usage: Some(Usage::new(
                usage.prompt_tokens,
                usage.completion_tokens,
                Some(usage.cached_tokens),
            )),
            system_fingerprint: None,
            nvext,
        };
        return Ok(axum::Json(response).into_response());
    }

    let include_usage = request.include_usage() || state.settings.force_include_usage;
    // One role chunk per choice opens the stream; `nvext` rides on the first.
    let mut opening = Vec::new();
    let mut nvext = nvext;
    for index in 0..request.sampling_options().n.max(1) {
        let mut role = ChatCompletionChunk::new(
            id.as_str(),
            model.as_str(),
            created,
            ChatChunkChoice::role(index),
            include_usage,
        );
        role.nvext = nvext.take();
        opening.extend_from_slice(&sse::data_event(&role));
    }
    let opening = Bytes::from(opening);
    let framer = ChatFramer {
        id,
        model,
        created,
        include_usage,
        logprobs,
        reasoning_field: state.settings.reasoning_field,
        wants_worker,
        nvext: None,
    };
    let events = sse::delta_events(scope, deltas, Some(opening), framer);
    Ok(sse::sse_response(events, state.settings.sse_keep_alive))
}

/// Chat chunks: text and finish reason go out as separate chunks, as OpenAI sends them.
struct ChatFramer {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    logprobs: Option<LogprobText>,
    reasoning_field: ReasoningField,
    /// Whether a delta naming the worker puts it in the next chunk's `nvext`.
    wants_worker: bool,
    /// The `nvext` the next chunk carries.
    nvext: Option<serde_json::Value>,
}

/// A unary message's reasoning under the configured field name (none when empty).
fn reasoning_message(field: ReasoningField, reasoning: String) -> ChatResponseMessage {
    let reasoning = (!reasoning.is_empty()).then_some(reasoning);
    match field {
        ReasoningField::ReasoningContent => ChatResponseMessage {
            reasoning_content: reasoning,
            ..Default::default()
        },
        ReasoningField::Reasoning => ChatResponseMessage {
            reasoning,
            ..Default::default()
        },
    }
}

impl ChatFramer {
    fn chunk(&mut self, choice: ChatChunkChoice<'_>) -> Bytes {
        let mut chunk = ChatCompletionChunk::new(
            self.id.as_str(),
            self.model.as_str(),
            self.created,
            choice,
            self.include_usage,
        );
        chunk.nvext = self.nvext.take();
        sse::data_event(&chunk)
    }
}

impl sse::ChunkFramer for ChatFramer {
    fn delta(&mut self, delta: &TextDelta, events: &mut Vec<Bytes>) {
        if let Some(served_by) = delta.served_by.filter(|_| self.wants_worker) {
            self.nvext = Some(worker_nvext(served_by));
        }
        // With logprobs every token's entry goes out, even while its text is held back.
        let logprobs = self
            .logprobs
            .as_ref()
            .filter(|_| !delta.logprobs.is_empty())
            .map(|namer| namer.chat(&delta.logprobs));
        if !delta.reasoning.is_empty() {
            let mut choice = ChatChunkChoice::content(delta.index, "");
            choice.delta.content = None;
            let text = Some(std::borrow::Cow::Borrowed(delta.reasoning.as_str()));
            match self.reasoning_field {
                ReasoningField::ReasoningContent => choice.delta.reasoning_content = text,
                ReasoningField::Reasoning => choice.delta.reasoning = text,
            }
            events.push(self.chunk(choice));
        }
        if !delta.text.is_empty() || logprobs.is_some() {
            let mut choice = ChatChunkChoice::content(delta.index, &delta.text);
            choice.logprobs = logprobs;
            events.push(self.chunk(choice));
        }
        if !delta.tool_calls.is_empty() {
            let mut choice = ChatChunkChoice::content(delta.index, "");
            choice.delta.content = None;
            choice.delta.tool_calls = Some(delta.tool_calls.clone());
            events.push(self.chunk(choice));
        }
        if let Some(reason) = delta.finish_reason {
            events.push(self.chunk(ChatChunkChoice::finish(delta.index, reason)));
        }
    }

    fn close(&mut self, usage: Option<TokenUsage>, events: &mut Vec<Bytes>) {
        let usage_chunk = usage.filter(|_| self.include_usage).map(|usage| {
            sse::data_event(&ChatCompletionChunk::usage_only(
                self.id.as_str(),
                self.model.as_str(),
                self.created,
                Usage::new(
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    Some(usage.cached_tokens),
                ),
            ))
        });
        sse::close_openai(usage_chunk, events);
    }
}

/// A chat request started on a worker: its deltas, its metrics scope, the served model name and
/// the response `nvext` the client asked for.
pub(crate) struct StartedChat<D> {
    /// The text deltas; dropping them cancels the worker.
    pub deltas: D,
    /// Outcome and token metrics of the request.
    pub scope: RequestScope,
    /// The served model name.
    pub model: String,
    /// The response `nvext` (only when asked for).
    pub nvext: Option<serde_json::Value>,
    /// Tokens of the rendered prompt.
    pub prompt_tokens: u32,
    /// Names the tokens of the log probabilities, when the request asked for them.
    pub logprobs: Option<LogprobText>,
}

impl<D> StartedChat<D> {
    /// The same start with its deltas wrapped (one type for the processor and built-in paths).
    fn map_deltas<E>(self, wrap: impl FnOnce(D) -> E) -> StartedChat<E> {
        StartedChat {
            deltas: wrap(self.deltas),
            scope: self.scope,
            model: self.model,
            nvext: self.nvext,
            prompt_tokens: self.prompt_tokens,
            logprobs: self.logprobs,
        }
    }
}

/// The chat path every chat-family endpoint (chat completions, Anthropic Messages, Responses)
/// shares after its own parsing: checks, the model, the chat template and tokenizer, the token
/// budget, and the start through the model's routing seam. Failures before the scope exists are
/// counted through the arrival's early record; `endpoint` labels the request metrics.
pub(crate) async fn start(
    state: &Arc<AppState>,
    endpoint: &'static str,
    request: &Arc<ChatCompletionRequest>,
    arrival: Arrival<'_>,
) -> Result<
    StartedChat<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + use<>>,
    FrontendError,
> {
    let Arrival {
        request_id,
        headers,
        body_len,
        timer,
        early,
        response_headers,
    } = arrival;
    let stream = request.is_stream();
    early.parsed(state, &request.model, stream);
    let sampling = check(request)?;
    let entry = find_model(&state.models, &request.model)?;
    early.is_scoped = true;
    let mut scope = RequestScope::new(state, &entry, endpoint, stream)?;
    let trace = scope
        .start_trace(kvmesh_runtime::otel::Trace::from_http(headers))
        .clone();
    match state.processor.as_ref().filter(|_| entry.takes_tokens) {
        Some(hosts) => {
            let processor_request = super::routing_hints(
                &state.settings,
                headers,
                request.nvext.as_ref(),
                request.cache_salt.as_deref(),
            )
            .map(|hints| ProcessorRequest {
                request,
                request_id,
                hints,
                headers: response_headers.clone(),
                headers_allowed: endpoint == ChatCompletions::NAME
                    && (!stream || state.settings.pre_commit_peek.is_some()),
                peek: state.settings.pre_commit_peek.filter(|_| stream),
                response_timeout: state.settings.backend_stream_timeout,
                trace: crate::trace_context::TraceContext::from_headers(headers, &trace),
                span: trace,
            });
            start_on_processor(hosts, &entry, scope, processor_request)
                .await
                .map(|started| started.map_deltas(Either::Left))
        }
        None => {
            let started = BuiltinStart {
                request_id,
                headers,
                body_len,
                timer,
                sampling,
            };
            start_builtin(state, request, entry, scope, started)
                .await
                .map(|started| started.map_deltas(Either::Right))
        }
    }
}

/// The checks of a chat request that need no model: its fields, then the options this release
/// cannot honour; the sampling options it asks for.
pub(crate) fn check(
    request: &ChatCompletionRequest,
) -> Result<kvmesh_llm::openai::SamplingOptions, FrontendError> {
    request.validate()?;
    let sampling = request.sampling_options();
    check_supported(&sampling)?;
    Ok(sampling)
}

/// What the built-in path takes from the arrival.
struct BuiltinStart<'a> {
    request_id: &'a str,
    headers: &'a axum::http::HeaderMap,
    body_len: usize,
    timer: RequestTimer,
    sampling: kvmesh_llm::openai::SamplingOptions,
}

/// A request for a model a custom chat processor preprocesses: the processor host renders,
/// tokenizes and builds the chunks; its generate calls go through the model's seam.
async fn start_on_processor(
    hosts: &processor::ProcessorHosts,
    entry: &Arc<crate::models::ModelEntry>,
    mut scope: RequestScope,
    processor_request: Result<ProcessorRequest<'_>, FrontendError>,
) -> Result<
    StartedChat<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + use<>>,
    FrontendError,
> {
    let started = match processor_request {
        Ok(processor_request) => processor::start(hosts, entry, processor_request).await,
        Err(error) => Err(error),
    };
    let deltas = match started {
        Ok(deltas) => deltas,
        Err(error) => {
            scope.finish(Some(&error));
            return Err(error);
        }
    };
    Ok(StartedChat {
        deltas,
        scope,
        model: entry.name.clone(),
        nvext: None,
        prompt_tokens: 0,
        logprobs: None,
    })
}

/// The built-in chat path: template, tokenizer, token budget, the seam, output parsing.
async fn start_builtin(
    state: &Arc<AppState>,
    request: &Arc<ChatCompletionRequest>,
    entry: Arc<crate::models::ModelEntry>,
    mut scope: RequestScope,
    arrival: BuiltinStart<'_>,
) -> Result<
    StartedChat<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + use<>>,
    FrontendError,
> {
    let BuiltinStart {
        request_id,
        headers,
        body_len,
        mut timer,
        sampling,
    } = arrival;
    let stream = request.is_stream();
    let trace = scope.trace().clone();
    let started = async {
        let preprocess = trace.internal("preprocess");
        let encoded = entry
            .pipeline
            .chat_prompt(request, body_len, &mut timer)
            .await;
        if let Ok(encoded) = &encoded {
            preprocess.set("kvmesh.prompt_tokens", encoded.ids.len() as i64);
        }
        preprocess.end();
        let EncodedPrompt { ids: prompt, cuts } = encoded?;
        let max_tokens =
            entry
                .pipeline
                .fit_max_tokens(prompt.len(), sampling.max_tokens, "messages")?;
        let outputs: Vec<_> = (0..sampling.n.max(1))
            .map(|_| entry.pipeline.output(&sampling, &prompt))
            .collect();
        let num_prompt_tokens = prompt.len() as u32;
        let mut worker_request = generate_request(
            request_id.to_string(),
            &entry.name,
            prompt,
            &sampling,
            max_tokens,
        );
        worker_request.tools = chat_output::tools_request(request);
        timer.record_since_arrival(Stage::Preprocess);
        let options = GenerateOptions {
            hints: super::routing_hints(
                &state.settings,
                headers,
                request.nvext.as_ref(),
                request.cache_salt.as_deref(),
            )?,
            prefix_cuts: cuts.into(),
            response_timeout: state.settings.backend_stream_timeout,
            wait: super::first_response_wait(&state.settings, stream),
            trace: trace.clone(),
        };
        let started = choices::start_all(&entry, worker_request, sampling.n, options).await?;
        Ok::<_, FrontendError>((started, outputs, num_prompt_tokens))
    }
    .await;
    let (started, outputs, num_prompt_tokens) = match started {
        Ok(parts) => parts,
        Err(error) => {
            scope.finish(Some(&error));
            return Err(error);
        }
    };
    let nvext = response_nvext(
        &state.settings,
        &request.nvext,
        started[0].worker_id(),
        started[0].dp_rank(),
    );
    let deltas = choices::text_deltas(
        started,
        outputs,
        num_prompt_tokens,
        &entry.metrics,
        timer,
        request_id,
    );
    let parsing = OutputParsing {
        reasoning: entry.pipeline.reasoning_format(),
        tools: chat_output::tool_parsing(request, entry.pipeline.tool_format()),
    };
    let deltas = if parsing.is_active() {
        chat_output::parse_output(deltas, parsing, request_id.to_owned()).left_stream()
    } else {
        deltas.right_stream()
    };
    Ok(StartedChat {
        deltas,
        scope,
        model: entry.name.clone(),
        nvext,
        prompt_tokens: num_prompt_tokens,
        logprobs: LogprobText::new(entry.pipeline.tokenizer(), &sampling),
    })
}

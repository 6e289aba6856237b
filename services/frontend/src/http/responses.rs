//! `POST /v1/responses`: the OpenAI Responses API, translated to a chat request and served by the
//! chat path, with the Responses object and its numbered stream events (docs/http-api.md,
//! "Responses API"). Stateless: nothing is stored, `previous_response_id` is refused.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use kvmesh_llm::openai::FinishReason;
use kvmesh_llm::responses::ResponsesRequest;
use kvmesh_proto::v1::TokenLogprob;
use serde_json::{Map, Value, json};

use super::AppState;
use super::chat::{self, StartedChat};
use super::endpoint::{Arrival, Endpoint};
use super::openai_shared::now_secs;
use super::sse;
use crate::error::FrontendError;
use crate::generate::{TextDelta, TokenUsage};
use crate::logprobs::LogprobText;

mod stream;

use self::stream::ResponsesFramer;

/// `POST /v1/responses`, streaming or unary.
pub(crate) struct Responses;

impl Endpoint for Responses {
    const NAME: &'static str = "responses";
    type Request = ResponsesRequest;

    async fn handle(
        state: &Arc<AppState>,
        request: ResponsesRequest,
        arrival: Arrival<'_>,
    ) -> Result<Response, FrontendError> {
        arrival
            .early
            .parsed(state, &request.model, request.is_stream());
        let mut chat = request.to_chat()?;
        super::drop_disabled_nvext(&state.settings, &mut chat.nvext);
        let chat = Arc::new(chat);
        let request_id = arrival.request_id;
        let started = chat::start(state, Self::NAME, &chat, arrival).await?;
        respond(state, &request, request_id, started).await
    }
}

async fn respond(
    state: &AppState,
    request: &ResponsesRequest,
    request_id: &str,
    started: StartedChat<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static>,
) -> Result<Response, FrontendError> {
    let StartedChat {
        deltas,
        mut scope,
        model,
        logprobs,
        ..
    } = started;
    let deltas = limit_tool_calls(deltas, request.max_tool_calls());
    let compact = request_id.replace('-', "");
    let shape = ResponseShape {
        compact_id: compact.clone(),
        id: format!("resp_{compact}"),
        message_id: format!("msg_{compact}"),
        model,
        created_at: now_secs(),
        echo: echoed_fields(request),
        logprobs,
    };

    if !request.is_stream() {
        let (answer, usage) = sse::collect_unary(deltas, &mut scope, String::new())
            .await?
            .into_single();
        let status = Status::of(answer.finish_reason);
        let mut output = Vec::new();
        if !answer.reasoning.is_empty() {
            output.push(shape.reasoning_item(&answer.reasoning, Status::Completed));
        }
        if !answer.text.trim().is_empty() || answer.tool_calls.is_empty() {
            output.push(shape.message(&answer.text, &answer.logprobs, status));
        }
        for call in &answer.tool_calls {
            output.push(shape.function_call_item(
                &call.id,
                &call.function.name,
                &call.function.arguments,
                Status::Completed,
            ));
        }
        return Ok(axum::Json(shape.response(status, output, Some(usage), None)).into_response());
    }

    let mut framer = ResponsesFramer::new(shape);
    let opening = framer.opening();
    let events = sse::delta_events(scope, deltas, Some(opening), framer);
    Ok(sse::sse_response(events, state.settings.sse_keep_alive))
}

/// `deltas` with every tool call past the first `max` dropped (`max_tool_calls`).
fn limit_tool_calls(
    deltas: impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static,
    max: Option<u32>,
) -> impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static {
    let mut num_calls = 0u32;
    deltas.map(move |delta| {
        let mut delta = delta?;
        if let Some(max) = max {
            let room = max.saturating_sub(num_calls) as usize;
            delta.tool_calls.truncate(room);
            num_calls += delta.tool_calls.len() as u32;
        }
        Ok(delta)
    })
}

/// The request fields every response object repeats, with OpenAI's defaults where the request
/// left them out.
fn echoed_fields(request: &ResponsesRequest) -> Map<String, Value> {
    let tools = request
        .tools
        .as_ref()
        .and_then(|tools| serde_json::to_value(tools).ok())
        .unwrap_or_else(|| json!([]));
    let echo = json!({
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "parallel_tool_calls": request.parallel_tool_calls.unwrap_or(true),
        "tool_choice": request.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        "tools": tools,
        "metadata": request.metadata.clone().unwrap_or_default(),
        "top_logprobs": request.top_logprobs.unwrap_or(0),
        "max_tool_calls": request.max_tool_calls,
        "truncation": request.truncation.as_deref().unwrap_or("disabled"),
        "user": request.user,
        "service_tier": request.service_tier,
        "safety_identifier": request.safety_identifier,
        "prompt_cache_key": request.prompt_cache_key,
    });
    match echo {
        Value::Object(fields) => fields,
        _ => Map::new(),
    }
}

/// How a response (or one of its items) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

impl Status {
    fn of(finish: Option<FinishReason>) -> Self {
        match finish {
            Some(FinishReason::Length) => Self::Incomplete,
            _ => Self::Completed,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Incomplete => "incomplete",
            Self::Failed => "failed",
        }
    }
}

/// What every Response object of one request repeats, and its output items.
struct ResponseShape {
    compact_id: String,
    id: String,
    message_id: String,
    model: String,
    created_at: u64,
    /// The request fields the response object repeats.
    echo: Map<String, Value>,
    /// Names the tokens of the log probabilities, when the request asked for them.
    logprobs: Option<LogprobText>,
}

impl ResponseShape {
    /// The message item; its `output_text` part carries `logprobs` when they were asked for.
    fn message(&self, text: &str, logprobs: &[TokenLogprob], status: Status) -> Value {
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status.as_str(),
            "role": "assistant",
            "content": [self.output_text(text, logprobs)],
        })
    }

    /// An `output_text` part, with the log probabilities of its tokens when asked for.
    fn output_text(&self, text: &str, logprobs: &[TokenLogprob]) -> Value {
        let mut part = json!({"type": "output_text", "text": text, "annotations": []});
        if self.logprobs.is_some() {
            part["logprobs"] = self.logprob_entries(logprobs);
        }
        part
    }

    /// Log probabilities as the Responses API lists them (`token`, `logprob`, `bytes`,
    /// `top_logprobs`); an empty list when the request did not ask for them.
    fn logprob_entries(&self, logprobs: &[TokenLogprob]) -> Value {
        self.logprobs
            .as_ref()
            .and_then(|namer| serde_json::to_value(namer.chat(logprobs).content).ok())
            .filter(|entries| !entries.is_null())
            .unwrap_or_else(|| json!([]))
    }

    fn reasoning_id(&self) -> String {
        format!("rs_{}", self.compact_id)
    }

    /// The thinking a reasoning parser split off, as a `reasoning` item.
    fn reasoning_item(&self, text: &str, status: Status) -> Value {
        json!({
            "type": "reasoning",
            "id": self.reasoning_id(),
            "status": status.as_str(),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        })
    }

    /// A tool call as a `function_call` item; its `call_id` is the chat tool-call id.
    fn function_call_item(
        &self,
        call_id: &str,
        name: &str,
        arguments: &str,
        status: Status,
    ) -> Value {
        json!({
            "type": "function_call",
            "id": format!("fc_{call_id}"),
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status.as_str(),
        })
    }

    fn response(
        &self,
        status: Status,
        output: Vec<Value>,
        usage: Option<TokenUsage>,
        error: Option<Value>,
    ) -> Value {
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status.as_str(),
            "model": self.model,
            "output": output,
            "store": false,
            "error": error,
            "incomplete_details": (status == Status::Incomplete)
                .then(|| json!({"reason": "max_output_tokens"})),
            "usage": usage.map(|usage| json!({
                "input_tokens": usage.prompt_tokens,
                "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            })),
        });
        if let Value::Object(fields) = &mut response {
            fields.extend(self.echo.clone());
        }
        response
    }
}

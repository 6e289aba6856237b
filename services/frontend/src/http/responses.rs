//! `POST /v1/responses`: the OpenAI Responses API, translated to a chat request and served by the
//! chat path, with the Responses object and its numbered stream events (docs/http-api.md,
//! "Responses API"). Stateless: nothing is stored, `previous_response_id` is refused.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use futures::Stream;
use kvmesh_llm::openai::FinishReason;
use kvmesh_llm::responses::ResponsesRequest;
use serde_json::{Value, json};

use super::AppState;
use super::chat::{self, StartedChat};
use super::endpoint::{Arrival, Endpoint};
use super::openai_shared::now_secs;
use super::sse;
use crate::error::FrontendError;
use crate::generate::{TextDelta, TokenUsage};

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
        ..
    } = started;
    let compact = request_id.replace('-', "");
    let shape = ResponseShape {
        compact_id: compact.clone(),
        id: format!("resp_{compact}"),
        message_id: format!("msg_{compact}"),
        model,
        created_at: now_secs(),
        instructions: request.instructions.clone(),
        temperature: request.temperature,
        top_p: request.top_p,
        max_output_tokens: request.max_output_tokens,
        parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
        metadata: request.metadata.clone().unwrap_or_default(),
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
            output.push(shape.message(&answer.text, status));
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
    instructions: Option<String>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_output_tokens: Option<i64>,
    parallel_tool_calls: bool,
    metadata: serde_json::Map<String, Value>,
}

impl ResponseShape {
    fn message(&self, text: &str, status: Status) -> Value {
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status.as_str(),
            "role": "assistant",
            "content": [output_text(text)],
        })
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
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status.as_str(),
            "model": self.model,
            "output": output,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "parallel_tool_calls": self.parallel_tool_calls,
            "tool_choice": "auto",
            "tools": [],
            "metadata": self.metadata,
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
        })
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

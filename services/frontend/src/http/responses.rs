//! `POST /v1/responses`: the OpenAI Responses API, translated to a chat request and served by the
//! chat path, with the Responses object and its numbered stream events (docs/http-api.md,
//! "Responses API"). Stateless: nothing is stored, `previous_response_id` is refused.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use kvmesh_llm::openai::FinishReason;
use kvmesh_llm::responses::ResponsesRequest;
use serde::Serialize;
use serde_json::{Value, json};

use super::AppState;
use super::chat::{self, StartedChat};
use super::endpoint::{Arrival, Endpoint};
use super::openai_shared::now_secs;
use super::sse;
use crate::error::FrontendError;
use crate::generate::{TextDelta, TokenUsage};

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
        let chat = Arc::new(request.to_chat()?);
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
        id: format!("resp_{compact}"),
        message_id: format!("msg_{compact}"),
        model,
        created_at: now_secs(),
        instructions: request.instructions.clone(),
        temperature: request.temperature,
        top_p: request.top_p,
        max_output_tokens: request.max_output_tokens,
    };

    if !request.is_stream() {
        let (answer, usage) = sse::collect_unary(deltas, &mut scope, String::new())
            .await?
            .into_single();
        let status = Status::of(answer.finish_reason);
        let output = vec![shape.message(&answer.text, status)];
        return Ok(axum::Json(shape.response(status, output, Some(usage), None)).into_response());
    }

    let mut framer = ResponsesFramer {
        shape,
        sequence: 0,
        text: String::new(),
        status: Status::Completed,
    };
    let opening = framer.opening();
    let events = sse::delta_events(scope, deltas, Some(opening), framer);
    Ok(sse::sse_response(events, state.settings.sse_keep_alive))
}

/// How a response ended.
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

/// What every Response object of one request repeats.
struct ResponseShape {
    id: String,
    message_id: String,
    model: String,
    created_at: u64,
    instructions: Option<String>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    max_output_tokens: Option<i64>,
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
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "metadata": {},
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

/// One `response.output_text.delta` (the only per-token event).
#[derive(Serialize)]
struct OutputTextDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    sequence_number: u64,
    item_id: &'a str,
    output_index: u32,
    content_index: u32,
    delta: &'a str,
    logprobs: [(); 0],
}

/// Responses events, each with the next `sequence_number`: created, in progress, the message item
/// and its text part opened; a text delta per delta; then the text, part and item done and
/// `response.completed` (or `response.incomplete` at `max_output_tokens`, `response.failed` on
/// an error).
struct ResponsesFramer {
    shape: ResponseShape,
    sequence: u64,
    text: String,
    status: Status,
}

impl ResponsesFramer {
    fn event(&mut self, kind: &str, mut body: Value) -> Bytes {
        body["type"] = kind.into();
        body["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        sse::named_event(kind, &body)
    }

    fn opening(&mut self) -> Bytes {
        let response = self
            .shape
            .response(Status::InProgress, Vec::new(), None, None);
        let mut opening = self
            .event("response.created", json!({"response": response}))
            .to_vec();
        opening
            .extend_from_slice(&self.event("response.in_progress", json!({"response": response})));
        let item = self.shape.message("", Status::InProgress);
        let mut item = item;
        item["content"] = json!([]);
        opening.extend_from_slice(&self.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ));
        let item_id = self.shape.message_id.clone();
        opening.extend_from_slice(&self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": output_text("")}),
        ));
        Bytes::from(opening)
    }
}

impl sse::ChunkFramer for ResponsesFramer {
    fn delta(&mut self, delta: &TextDelta, events: &mut Vec<Bytes>) {
        if !delta.text.is_empty() {
            events.push(sse::named_event(
                "response.output_text.delta",
                &OutputTextDelta {
                    kind: "response.output_text.delta",
                    sequence_number: self.sequence,
                    item_id: &self.shape.message_id,
                    output_index: 0,
                    content_index: 0,
                    delta: &delta.text,
                    logprobs: [],
                },
            ));
            self.sequence += 1;
            self.text.push_str(&delta.text);
        }
        if delta.finish_reason.is_some() {
            self.status = Status::of(delta.finish_reason);
        }
    }

    fn close(&mut self, usage: Option<TokenUsage>, events: &mut Vec<Bytes>) {
        let item_id = self.shape.message_id.clone();
        let text = std::mem::take(&mut self.text);
        events.push(self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
        ));
        events.push(self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": output_text(&text)}),
        ));
        let item = self.shape.message(&text, self.status);
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        let response = self.shape.response(self.status, vec![item], usage, None);
        let kind = match self.status {
            Status::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        events.push(self.event(kind, json!({"response": response})));
    }

    fn error(&mut self, error: &FrontendError) -> Bytes {
        if error.is_private() {
            tracing::error!(%error, "worker failure mid-stream");
        }
        let body = error.body();
        let failure = json!({
            "code": body["error"]["type"],
            "message": body["error"]["message"],
        });
        let text = std::mem::take(&mut self.text);
        let output = vec![self.shape.message(&text, Status::Incomplete)];
        let response = self
            .shape
            .response(Status::Failed, output, None, Some(failure));
        self.event("response.failed", json!({"response": response}))
    }
}

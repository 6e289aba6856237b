//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (with `--enable-anthropic-api`):
//! the Anthropic Messages API, translated to a chat request and served by the chat path, with
//! Anthropic's response, event and error shapes (docs/http-api.md, "Anthropic Messages").

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use kvmesh_llm::anthropic::{CountTokensRequest, MessagesRequest, StopReason};
use serde::Serialize;
use serde_json::{Value, json};

use super::chat::{self, StartedChat};
use super::endpoint::{Arrival, Endpoint, ErrorShape};
use super::sse;
use super::{AppState, parse_json, read_body, request_id, with_request_id};
use crate::error::FrontendError;
use crate::generate::{TextDelta, TokenUsage};
use crate::preprocess::RequestTimer;

/// `POST /v1/messages`, streaming or unary; every error has Anthropic's shape.
pub(crate) struct Messages;

impl Endpoint for Messages {
    const NAME: &'static str = "messages";
    const ERRORS: ErrorShape = ErrorShape::Anthropic;
    type Request = MessagesRequest;

    async fn handle(
        state: &Arc<AppState>,
        mut request: MessagesRequest,
        arrival: Arrival<'_>,
    ) -> Result<Response, FrontendError> {
        arrival
            .early
            .parsed(state, &request.model, request.is_stream());
        if state.settings.strip_anthropic_preamble {
            request.strip_billing_preamble();
        }
        let mut chat = request.to_chat()?;
        super::drop_disabled_nvext(&state.settings, &mut chat.nvext);
        let chat = Arc::new(chat);
        let request_id = arrival.request_id;
        let started = chat::start(state, Self::NAME, &chat, arrival).await?;
        respond(state, &request, request_id, started).await
    }
}

/// Counts the tokens of a Messages request's rendered prompt: `{"input_tokens": n}`.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let request_id = request_id(&headers);
    let counted = async {
        let body = read_body(&state, &headers, body).await?;
        let mut request: CountTokensRequest = parse_json(&body)?;
        if state.settings.strip_anthropic_preamble {
            request.strip_billing_preamble();
        }
        let chat = Arc::new(request.to_chat()?);
        let entry = state
            .models
            .load()
            .get(&chat.model)
            .cloned()
            .ok_or_else(|| FrontendError::ModelNotFound(chat.model.clone()))?;
        let mut timer = RequestTimer::start(&state.preprocess);
        let prompt = entry
            .pipeline
            .chat_prompt(&chat, body.len(), &mut timer)
            .await?;
        Ok::<_, FrontendError>(prompt.ids.len())
    }
    .await;
    let response = match counted {
        Ok(tokens) => axum::Json(json!({"input_tokens": tokens})).into_response(),
        Err(error) => error.into_anthropic_response_with(state.settings.overload_status),
    };
    with_request_id(response, &request_id)
}

async fn respond(
    state: &AppState,
    request: &MessagesRequest,
    request_id: &str,
    started: StartedChat<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static>,
) -> Result<Response, FrontendError> {
    let StartedChat {
        deltas,
        mut scope,
        model,
        prompt_tokens,
        ..
    } = started;
    let id = format!("msg_{}", request_id.replace('-', ""));

    if !request.is_stream() {
        let (answer, usage) = sse::collect_unary(deltas, &mut scope, String::new())
            .await?
            .into_single();
        let stop_reason = answer
            .finish_reason
            .map(|finish| StopReason::from_finish(finish, answer.stop_sequence.is_some()));
        return Ok(axum::Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content_blocks(&answer),
            "stop_reason": stop_reason,
            "stop_sequence": answer.stop_sequence,
            "usage": usage_json(usage),
        }))
        .into_response());
    }

    let opening = sse::named_event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }}),
    )
    .to_vec();
    let framer = MessagesFramer::default();
    let events = sse::delta_events(scope, deltas, Some(Bytes::from(opening)), framer);
    Ok(sse::sse_response(events, state.settings.sse_keep_alive))
}

fn usage_json(usage: TokenUsage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// The content blocks of a unary answer: thinking first, then the text (always, when there
/// is nothing else), then one `tool_use` block per call with its arguments as an object.
fn content_blocks(answer: &sse::UnaryChoice) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !answer.reasoning.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": answer.reasoning, "signature": ""}));
    }
    if !answer.text.trim().is_empty() || (blocks.is_empty() && answer.tool_calls.is_empty()) {
        blocks.push(json!({"type": "text", "text": answer.text}));
    }
    for call in &answer.tool_calls {
        blocks.push(json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.function.name,
            "input": tool_input(&call.function.arguments),
        }));
    }
    blocks
}

fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// One `content_block_delta` of text or thinking (the per-token events).
#[derive(Serialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    delta: BlockDeltaBody<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDeltaBody<'a> {
    TextDelta { text: &'a str },
    ThinkingDelta { thinking: &'a str },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    Thinking,
    Text,
}

/// Messages events: content blocks opened as the output needs them (a thinking block for
/// reasoning, a text block for the answer, a `tool_use` block per call, each with its own
/// index), one `content_block_delta` per delta, each block closed by `content_block_stop`, then
/// `message_delta` with the stop reason and usage, and `message_stop`; errors as
/// `event: error`.
#[derive(Default)]
struct MessagesFramer {
    stop_reason: Option<StopReason>,
    stop_sequence: Option<String>,
    /// The block being written and its index.
    open: Option<(OpenBlock, u32)>,
    /// Blocks started so far.
    num_blocks: u32,
}

impl MessagesFramer {
    /// The index of an open block of `kind`, closing any other and opening it when needed.
    fn block(&mut self, kind: OpenBlock, events: &mut Vec<Bytes>) -> u32 {
        if let Some((open, index)) = self.open
            && open == kind
        {
            return index;
        }
        self.close_block(events);
        let index = self.num_blocks;
        self.num_blocks += 1;
        let block = match kind {
            OpenBlock::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            OpenBlock::Text => json!({"type": "text", "text": ""}),
        };
        events.push(sse::named_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        self.open = Some((kind, index));
        index
    }

    fn close_block(&mut self, events: &mut Vec<Bytes>) {
        if let Some((_, index)) = self.open.take() {
            events.push(sse::named_event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }
}

impl sse::ChunkFramer for MessagesFramer {
    fn delta(&mut self, delta: &TextDelta, events: &mut Vec<Bytes>) {
        if !delta.reasoning.is_empty() {
            let index = self.block(OpenBlock::Thinking, events);
            events.push(sse::named_event(
                "content_block_delta",
                &BlockDelta {
                    kind: "content_block_delta",
                    index,
                    delta: BlockDeltaBody::ThinkingDelta {
                        thinking: &delta.reasoning,
                    },
                },
            ));
        }
        if !delta.text.is_empty() {
            let index = self.block(OpenBlock::Text, events);
            events.push(sse::named_event(
                "content_block_delta",
                &BlockDelta {
                    kind: "content_block_delta",
                    index,
                    delta: BlockDeltaBody::TextDelta { text: &delta.text },
                },
            ));
        }
        for call in &delta.tool_calls {
            self.close_block(events);
            let index = self.num_blocks;
            self.num_blocks += 1;
            let function = call.function.clone().unwrap_or_default();
            events.push(sse::named_event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": call.id, "name": function.name, "input": {},
                }}),
            ));
            events.push(sse::named_event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta",
                    "partial_json": function.arguments.unwrap_or_default(),
                }}),
            ));
            events.push(sse::named_event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
        if let Some(finish) = delta.finish_reason {
            self.stop_reason = Some(StopReason::from_finish(
                finish,
                delta.stop_sequence.is_some(),
            ));
            self.stop_sequence = delta.stop_sequence.clone();
        }
    }

    fn close(&mut self, usage: Option<TokenUsage>, events: &mut Vec<Bytes>) {
        let usage = usage.unwrap_or_default();
        if self.num_blocks == 0 {
            self.block(OpenBlock::Text, events);
        }
        self.close_block(events);
        events.push(sse::named_event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                "usage": usage_json(usage),
            }),
        ));
        events.push(sse::named_event(
            "message_stop",
            &json!({"type": "message_stop"}),
        ));
    }

    fn error(&mut self, error: &FrontendError) -> Bytes {
        if error.is_private() {
            tracing::error!(%error, "worker failure mid-stream");
        }
        sse::named_event("error", &error.anthropic_body())
    }
}

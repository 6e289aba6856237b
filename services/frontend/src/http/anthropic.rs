//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (with `--enable-anthropic-api`):
//! the Anthropic Messages API, translated to a chat request and served by the chat path, with
//! Anthropic's response, event and error shapes (docs/http-api.md, "Anthropic Messages").

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use kvmesh_llm::anthropic::{CountTokensRequest, MessagesRequest, StopReason};
use serde::Serialize;
use serde_json::{Value, json};

use super::chat::{self, StartedChat};
use super::endpoint::{Arrival, Endpoint, ErrorShape};
use super::sse;
use super::{AppState, body_bytes, parse_json, request_id, with_request_id};
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
        request: MessagesRequest,
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

/// Counts the tokens of a Messages request's rendered prompt: `{"input_tokens": n}`.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request_id = request_id(&headers);
    let counted = async {
        let body = body_bytes(&state, body)?;
        let request: CountTokensRequest = parse_json(&body)?;
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
            "content": [{"type": "text", "text": answer.text}],
            "stop_reason": stop_reason,
            "stop_sequence": answer.stop_sequence,
            "usage": usage_json(usage),
        }))
        .into_response());
    }

    let mut opening = sse::named_event(
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
    opening.extend_from_slice(&sse::named_event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
    ));
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

/// One `content_block_delta` of text (the only per-token event).
#[derive(Serialize)]
struct TextBlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: u32,
    delta: TextDeltaBody<'a>,
}

#[derive(Serialize)]
struct TextDeltaBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

/// Messages events: text block 0 opened by the opening events, one `content_block_delta` per
/// delta, then `content_block_stop`, `message_delta` with the stop reason and usage, and
/// `message_stop`; errors as `event: error`.
#[derive(Default)]
struct MessagesFramer {
    stop_reason: Option<StopReason>,
    stop_sequence: Option<String>,
}

impl sse::ChunkFramer for MessagesFramer {
    fn delta(&mut self, delta: &TextDelta, events: &mut Vec<Bytes>) {
        if !delta.text.is_empty() {
            events.push(sse::named_event(
                "content_block_delta",
                &TextBlockDelta {
                    kind: "content_block_delta",
                    index: 0,
                    delta: TextDeltaBody {
                        kind: "text_delta",
                        text: &delta.text,
                    },
                },
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
        events.push(sse::named_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ));
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

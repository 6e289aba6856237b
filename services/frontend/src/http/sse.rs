//! Server-sent events framing (one loop for every endpoint, a framer each), the unary collector,
//! and the keep-alive heartbeat.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use futures::{Stream, StreamExt};
use serde::Serialize;

use super::request_metrics::RequestScope;
use crate::error::FrontendError;
use crate::generate::{ServedBy, TextDelta, TokenUsage};

/// The terminator of chat and completions streams.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Frames one JSON event as `data: <json>\n\n`.
pub fn data_event<T: Serialize>(value: &T) -> Bytes {
    let mut buffer = Vec::with_capacity(256);
    buffer.extend_from_slice(b"data: ");
    if serde_json::to_writer(&mut buffer, value).is_err() {
        buffer.truncate(6);
        buffer.extend_from_slice(b"{}");
    }
    buffer.extend_from_slice(b"\n\n");
    Bytes::from(buffer)
}

/// Frames one named JSON event as `event: <name>\ndata: <json>\n\n` (Anthropic Messages and
/// Responses streams, whose clients dispatch on the `event:` line).
pub fn named_event<T: Serialize>(name: &str, value: &T) -> Bytes {
    let mut buffer = Vec::with_capacity(256);
    buffer.extend_from_slice(b"event: ");
    buffer.extend_from_slice(name.as_bytes());
    buffer.extend_from_slice(b"\ndata: ");
    let start = buffer.len();
    if serde_json::to_writer(&mut buffer, value).is_err() {
        buffer.truncate(start);
        buffer.extend_from_slice(b"{}");
    }
    buffer.extend_from_slice(b"\n\n");
    Bytes::from(buffer)
}

/// Frames an error after the stream has started: `data: {"error":{...}}`, no `[DONE]` follows.
pub fn error_event(error: &FrontendError) -> Bytes {
    if error.is_private() {
        tracing::error!(%error, "worker failure mid-stream");
    }
    let body = error.body();
    data_event(&serde_json::json!({"error": body["error"]}))
}

/// A streaming response from a stream of framed events, with optional keep-alive comments.
pub fn sse_response(
    events: impl Stream<Item = Bytes> + Send + 'static,
    keep_alive: Option<Duration>,
) -> Response {
    let body = match keep_alive {
        Some(interval) => Body::from_stream(
            with_keep_alive(events, interval).map(Ok::<_, std::convert::Infallible>),
        ),
        None => Body::from_stream(events.map(Ok::<_, std::convert::Infallible>)),
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn with_keep_alive(
    events: impl Stream<Item = Bytes> + Send + 'static,
    interval: Duration,
) -> impl Stream<Item = Bytes> + Send + 'static {
    async_stream::stream! {
        let mut events = std::pin::pin!(events);
        loop {
            match tokio::time::timeout(interval, events.next()).await {
                Ok(Some(event)) => yield event,
                Ok(None) => return,
                Err(_) => yield Bytes::from_static(b": keep-alive\n\n"),
            }
        }
    }
}

/// How one endpoint frames its stream: chat, completions, Anthropic Messages and Responses
/// shape their events differently, while the life of the stream (the order of deltas, the end,
/// errors, the outcome on the request scope) is the same and lives in [`delta_events`].
pub trait ChunkFramer: Send + 'static {
    /// Appends the events of one delta that carries text, log probabilities, a finish reason, or
    /// several of them; `delta.index` says which choice.
    fn delta(&mut self, delta: &TextDelta, events: &mut Vec<Bytes>);
    /// Appends the events that end the stream: after the finish delta, with its usage, or with
    /// `None` when the engine cancelled the generation without a finish.
    fn close(&mut self, usage: Option<TokenUsage>, events: &mut Vec<Bytes>);
    /// The event of an error after the stream started (the OpenAI shape unless overridden).
    fn error(&mut self, error: &FrontendError) -> Bytes {
        error_event(error)
    }
}

/// The end of an OpenAI stream (chat, completions): the usage chunk when the client asked for
/// usage and the stream finished, then `[DONE]`.
pub fn close_openai(usage_chunk: Option<Bytes>, events: &mut Vec<Bytes>) {
    events.extend(usage_chunk);
    events.push(Bytes::from_static(DONE));
}

/// Streams `deltas` as server-sent events: `opening` first, then each delta as `framer` frames
/// it, then the framer's closing events; an error ends the stream with the framer's error event.
/// Records the outcome and token counts on `scope`.
pub fn delta_events(
    mut scope: RequestScope,
    deltas: impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static,
    opening: Option<Bytes>,
    mut framer: impl ChunkFramer,
) -> impl Stream<Item = Bytes> + Send + 'static {
    async_stream::stream! {
        if let Some(event) = opening {
            yield event;
        }
        let mut deltas = std::pin::pin!(deltas);
        let mut events = Vec::with_capacity(4);
        while let Some(delta) = deltas.next().await {
            let delta = match delta {
                Ok(delta) => delta,
                Err(error) => {
                    scope.finish(Some(&error));
                    yield framer.error(&error);
                    return;
                }
            };
            if delta.text.is_empty() && delta.reasoning.is_empty() && delta.finish_reason.is_none() && delta.logprobs.is_empty() && delta.tool_calls.is_empty() {
                continue;
            }
            framer.delta(&delta, &mut events);
            // The delta with usage is the last one (of the last choice to finish).
            if let Some(usage) = delta.usage {
                scope.observe_tokens(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
                framer.close(Some(usage), &mut events);
                scope.finish(None);
                for event in events.drain(..) {
                    yield event;
                }
                return;
            }
            for event in events.drain(..) {
                yield event;
            }
        }
        // Cancelled by the engine: the stream ends without a finish.
        scope.finish(None);
        framer.close(None, &mut events);
        for event in events.drain(..) {
            yield event;
        }
    }
}

/// A whole unary answer: each choice's text, finish reason and logprobs, and the usage of the
/// request (all choices).
pub struct UnaryAnswer {
    /// The choices, by index.
    pub choices: Vec<UnaryChoice>,
    /// Token counts.
    pub usage: TokenUsage,
    /// The worker a delta named (processor requests, whose worker is known only once they run).
    pub served_by: Option<ServedBy>,
}

/// One choice of a [`UnaryAnswer`].
#[derive(Default)]
pub struct UnaryChoice {
    /// All text, after the collector's `prefix`.
    pub text: String,
    /// Why generation ended (`None` when the engine cancelled it).
    pub finish_reason: Option<kvmesh_llm::openai::FinishReason>,
    /// The stop string that ended generation, if one did.
    pub stop_sequence: Option<String>,
    /// Log probabilities of every generated token, when the request asked for them.
    pub logprobs: Vec<kvmesh_proto::v1::TokenLogprob>,
    /// The tool calls read from the output, in order.
    pub tool_calls: Vec<kvmesh_llm::openai::ToolCall>,
    /// Reasoning split off by the model's reasoning parser.
    pub reasoning: String,
}

impl UnaryAnswer {
    /// The only choice and the usage, for endpoints without `n` (Anthropic, Responses, KServe).
    pub fn into_single(self) -> (UnaryChoice, TokenUsage) {
        let choice = self.choices.into_iter().next().unwrap_or_default();
        (choice, self.usage)
    }
}

/// Reads every delta of a unary request into one answer, recording the outcome on `scope`;
/// every choice's text starts with `prefix` (the echoed prompt).
pub async fn collect_unary(
    deltas: impl Stream<Item = Result<TextDelta, FrontendError>>,
    scope: &mut RequestScope,
    prefix: String,
) -> Result<UnaryAnswer, FrontendError> {
    let mut deltas = std::pin::pin!(deltas);
    let mut choices: Vec<UnaryChoice> = Vec::with_capacity(1);
    let mut usage = None;
    let mut served_by = None;
    while let Some(delta) = deltas.next().await {
        let mut delta = match delta {
            Ok(delta) => delta,
            Err(error) => {
                scope.finish(Some(&error));
                return Err(error);
            }
        };
        let index = delta.index as usize;
        while choices.len() <= index {
            choices.push(UnaryChoice {
                text: prefix.clone(),
                ..UnaryChoice::default()
            });
        }
        let choice = &mut choices[index];
        choice.text.push_str(&delta.text);
        choice.reasoning.push_str(&delta.reasoning);
        choice.logprobs.append(&mut delta.logprobs);
        for call in delta.tool_calls.drain(..) {
            add_call(&mut choice.tool_calls, call);
        }
        if delta.finish_reason.is_some() {
            choice.finish_reason = delta.finish_reason;
            choice.stop_sequence = delta.stop_sequence.take();
        }
        usage = delta.usage.or(usage);
        served_by = served_by.or(delta.served_by);
    }
    let usage = usage.unwrap_or_default();
    scope.observe_tokens(
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.cached_tokens,
    );
    scope.finish(None);
    if choices.is_empty() {
        choices.push(UnaryChoice {
            text: prefix,
            ..UnaryChoice::default()
        });
    }
    Ok(UnaryAnswer {
        choices,
        usage,
        served_by,
    })
}

/// Adds a tool-call delta to a choice's calls: the built-in parser sends each call whole, a chat
/// processor may stream one in fragments (the first with its id or name, then pieces of the
/// arguments), so a fragment with neither continues the last call.
fn add_call(
    calls: &mut Vec<kvmesh_llm::openai::ToolCall>,
    delta: kvmesh_llm::openai::ToolCallDelta,
) {
    let starts_call = delta.id.is_some()
        || delta
            .function
            .as_ref()
            .is_some_and(|function| function.name.is_some());
    match calls.last_mut() {
        Some(last) if !starts_call => {
            let arguments = delta.function.and_then(|function| function.arguments);
            last.function
                .arguments
                .push_str(arguments.as_deref().unwrap_or_default());
        }
        _ => calls.push(whole_call(delta)),
    }
}

/// A tool-call delta as the whole call it starts.
fn whole_call(delta: kvmesh_llm::openai::ToolCallDelta) -> kvmesh_llm::openai::ToolCall {
    let function = delta.function.unwrap_or_default();
    kvmesh_llm::openai::ToolCall {
        id: delta.id.unwrap_or_default(),
        kind: delta.kind.unwrap_or_else(|| "function".into()),
        function: kvmesh_llm::openai::FunctionCall {
            name: function.name.unwrap_or_default(),
            arguments: function.arguments.unwrap_or_default(),
        },
    }
}

#[cfg(test)]
mod tests {
    use kvmesh_llm::openai::{FunctionCallDelta, ToolCallDelta};

    use super::*;

    fn fragment(id: Option<&str>, name: Option<&str>, arguments: &str) -> ToolCallDelta {
        ToolCallDelta {
            index: 0,
            id: id.map(str::to_owned),
            kind: id.map(|_| "function".to_owned()),
            function: Some(FunctionCallDelta {
                name: name.map(str::to_owned),
                arguments: Some(arguments.to_owned()),
            }),
        }
    }

    #[test]
    fn streamed_fragments_join_into_whole_calls() {
        let mut calls = Vec::new();
        for delta in [
            fragment(Some("call_a"), Some("get_weather"), ""),
            fragment(None, None, r#"{"city": "#),
            fragment(None, None, r#""Paris"}"#),
            fragment(Some("call_b"), Some("get_time"), "{}"),
        ] {
            add_call(&mut calls, delta);
        }
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "call_a");
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[0].function.arguments, r#"{"city": "Paris"}"#);
        assert_eq!(
            (
                calls[1].function.name.as_str(),
                calls[1].function.arguments.as_str()
            ),
            ("get_time", "{}")
        );
    }
}

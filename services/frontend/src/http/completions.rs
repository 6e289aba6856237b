//! `POST /v1/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use kvmesh_llm::openai::{
    CompletionChoice, CompletionChunk, CompletionChunkChoice, CompletionLogprobs,
    CompletionRequest, CompletionResponse, FinishReason, PROMPT_SHAPE, TextCompletionObject, Usage,
};
use serde_json::Value;

use crate::logprobs::LogprobText;

use super::endpoint::{Arrival, Endpoint};
use super::openai_shared::{now_secs, response_nvext};
use super::request_metrics::RequestScope;
use super::sse;
use super::{AppState, parse_json};
use crate::completion::{self, StartSettings};
use crate::error::FrontendError;
use crate::generate::{TextDelta, TokenUsage};
use crate::models::find_model;

/// `POST /v1/completions`, streaming or unary.
pub(crate) struct Completions;

impl Endpoint for Completions {
    const NAME: &'static str = "completions";
    type Request = CompletionRequest;

    fn parse(body: &[u8]) -> Result<CompletionRequest, FrontendError> {
        parse_request(body)
    }

    async fn handle(
        state: &Arc<AppState>,
        mut request: CompletionRequest,
        arrival: Arrival<'_>,
    ) -> Result<Response, FrontendError> {
        super::drop_disabled_nvext(&state.settings, &mut request.nvext);
        serve(state, request, arrival).await
    }
}

/// The typed request straight from the body, in memory proportional to it (no JSON value tree
/// in between, even for a body that does not parse). A prompt of the wrong shape, or none, is
/// named as the failing parameter.
fn parse_request(body: &[u8]) -> Result<CompletionRequest, FrontendError> {
    parse_json(body).map_err(|error| {
        if error.to_string().contains(PROMPT_SHAPE) {
            FrontendError::invalid(format!("prompt {PROMPT_SHAPE}"), Some("prompt"))
        } else if error.to_string().contains("missing field `prompt`") {
            FrontendError::invalid("missing field `prompt`", Some("prompt"))
        } else {
            error
        }
    })
}

async fn serve(
    state: &Arc<AppState>,
    request: CompletionRequest,
    arrival: Arrival<'_>,
) -> Result<Response, FrontendError> {
    let Arrival {
        request_id,
        headers,
        timer,
        early,
        ..
    } = arrival;
    early.parsed(state, &request.model, request.is_stream());
    let sampling = completion::check(&request)?;
    let entry = find_model(&state.models, &request.model)?;
    let stream = request.is_stream();
    early.is_scoped = true;
    let mut scope = RequestScope::new(state, &entry, Completions::NAME, stream)?;
    let trace = scope
        .start_trace(kvmesh_runtime::otel::Trace::from_http(headers))
        .clone();
    let settings = StartSettings {
        request_id: request_id.to_string(),
        hints: super::routing_hints(
            &state.settings,
            headers,
            request.nvext.as_ref(),
            request.cache_salt.as_deref(),
        )?,
        response_timeout: state.settings.backend_stream_timeout,
        wait: super::first_response_wait(&state.settings, stream),
        trace,
    };
    let started = match completion::start(&entry, &request, &sampling, timer, settings).await {
        Ok(started) => started,
        Err(error) => {
            scope.finish(Some(&error));
            return Err(error);
        }
    };
    let nvext = response_nvext(
        &state.settings,
        &request.nvext,
        started.worker_id,
        started.dp_rank,
    );
    let deltas = started.deltas;
    let echoed = started.echoed;
    let logprobs = started.logprobs;
    // Token offsets count from the start of the returned text, after any echoed prompt.
    let text_offset = echoed.as_deref().map_or(0, |text| {
        u32::try_from(text.chars().count()).unwrap_or(u32::MAX)
    });
    let id = format!("cmpl-{request_id}");
    let created = now_secs();
    let model = entry.name.clone();

    if !stream {
        let answer = sse::collect_unary(deltas, &mut scope, echoed.unwrap_or_default()).await?;
        let usage = answer.usage;
        let choices = answer
            .choices
            .into_iter()
            .enumerate()
            .map(|(index, choice)| CompletionChoice {
                index: index as u32,
                logprobs: logprobs.as_ref().map(|namer| {
                    let mut offset = text_offset;
                    namer.completion(&choice.logprobs, &mut offset)
                }),
                text: choice.text,
                finish_reason: choice.finish_reason,
            })
            .collect();
        let response = CompletionResponse {
            id,
            object: TextCompletionObject,
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
    let num_choices = sampling.n.max(1);
    let mut framer = CompletionFramer {
        id,
        model,
        created,
        include_usage,
        nvext,
        logprobs,
        text_offsets: vec![text_offset; num_choices as usize],
    };
    // An echoed prompt opens every choice.
    let opening = echoed.map(|echoed| {
        let chunks: Vec<Bytes> = (0..num_choices)
            .map(|index| framer.chunk(index, &echoed, None, None))
            .collect();
        Bytes::from(chunks.concat())
    });
    let events = sse::delta_events(scope, deltas, opening, framer);
    Ok(sse::sse_response(events, state.settings.sse_keep_alive))
}

/// Completion chunks: one chunk a delta, text and finish reason together; `nvext` rides on the
/// first chunk.
struct CompletionFramer {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    nvext: Option<Value>,
    logprobs: Option<LogprobText>,
    /// Character offset of the next token in each choice's text.
    text_offsets: Vec<u32>,
}

impl CompletionFramer {
    fn chunk(
        &mut self,
        index: u32,
        text: &str,
        logprobs: Option<CompletionLogprobs>,
        finish_reason: Option<FinishReason>,
    ) -> Bytes {
        let choice = CompletionChunkChoice {
            index,
            text: text.into(),
            logprobs,
            finish_reason,
        };
        let mut chunk = CompletionChunk::new(
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

impl sse::ChunkFramer for CompletionFramer {
    fn delta(&mut self, delta: &TextDelta, events: &mut Vec<Bytes>) {
        let offset = self.text_offsets.get_mut(delta.index as usize);
        let logprobs = self
            .logprobs
            .as_ref()
            .zip(offset)
            .map(|(namer, offset)| namer.completion(&delta.logprobs, offset));
        events.push(self.chunk(delta.index, &delta.text, logprobs, delta.finish_reason));
    }

    fn close(&mut self, usage: Option<TokenUsage>, events: &mut Vec<Bytes>) {
        let usage_chunk = usage.filter(|_| self.include_usage).map(|usage| {
            sse::data_event(&CompletionChunk::usage_only(
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

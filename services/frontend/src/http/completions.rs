//! `POST /v1/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvmesh_llm::openai::{
    CompletionChoice, CompletionChunk, CompletionChunkChoice, CompletionRequest,
    CompletionResponse, FinishReason, Prompt, TextCompletionObject, Usage,
};
use serde_json::Value;

use super::openai_shared::{check_supported, now_secs, response_nvext};
use super::request_metrics::{EarlyRequest, RequestScope};
use super::sse;
use super::{AppState, body_bytes, parse_json, request_id, with_request_id};
use crate::error::FrontendError;
use crate::generate;
use crate::models::find_model;
use crate::pipeline::generate_request;
use crate::preprocess::{RequestTimer, Stage};

/// Handles a text completion, streaming or unary.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request_id = request_id(&headers);
    let mut early = EarlyRequest::default();
    let response = match handle(&state, &request_id, &headers, body, &mut early).await {
        Ok(response) => response,
        Err(error) => {
            early.count_failure(&state, "completions", &error);
            state.error_response(error)
        }
    };
    with_request_id(response, &request_id)
}

fn check_prompt_shape(body: &Value) -> Result<(), FrontendError> {
    let valid = match body.get("prompt") {
        None => {
            return Err(FrontendError::invalid(
                "missing field `prompt`",
                Some("prompt"),
            ));
        }
        Some(Value::String(_)) => true,
        Some(Value::Array(items)) => {
            items.iter().all(Value::is_string)
                || items
                    .iter()
                    .all(|v| v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)))
                || items.iter().all(|v| {
                    v.as_array().is_some_and(|inner| {
                        inner
                            .iter()
                            .all(|t| t.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)))
                    })
                })
        }
        Some(_) => false,
    };
    if valid {
        Ok(())
    } else {
        Err(FrontendError::invalid(
            "prompt must be a string, a list of strings, a list of token ids, or a list of token id lists",
            Some("prompt"),
        ))
    }
}

/// The typed request straight from the body; only a body that does not parse is read again as a
/// JSON value, to say precisely what is wrong with it.
fn parse_request(body: &[u8]) -> Result<CompletionRequest, FrontendError> {
    if let Ok(request) = serde_json::from_slice::<CompletionRequest>(body) {
        return Ok(request);
    }
    let value: Value = parse_json(body)?;
    check_prompt_shape(&value)?;
    serde_json::from_value(value)
        .map_err(|e| FrontendError::invalid(format!("invalid request: {e}"), None))
}

async fn handle(
    state: &Arc<AppState>,
    request_id: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    early: &mut EarlyRequest,
) -> Result<Response, FrontendError> {
    state.check_accepting()?;
    let mut timer = RequestTimer::start(&state.preprocess);
    let body = body_bytes(state, body)?;
    let request = parse_request(&body)?;
    early.parsed(state, &request.model, request.is_stream());
    request.validate()?;
    let sampling = request.sampling_options();
    check_supported(&sampling)?;
    if request.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(FrontendError::NotImplemented(
            "suffix is not supported".into(),
        ));
    }
    match request.prompt.len() {
        1 => {}
        0 => {
            return Err(FrontendError::invalid(
                "prompt must not be empty",
                Some("prompt"),
            ));
        }
        several => {
            return Err(FrontendError::NotImplemented(format!(
                "{several} prompts in one request are not supported yet; send one prompt per request"
            )));
        }
    }
    let entry = find_model(&state.models, &request.model)?;
    let stream = request.is_stream();
    let echo = request.echo.unwrap_or(false);
    early.is_scoped = true;
    let mut scope = RequestScope::new(state, &entry, "completions", stream);
    let started = async {
        let prompt = match &request.prompt {
            Prompt::Text(text) => entry.pipeline.text_prompt(text, &mut timer).await?,
            Prompt::Texts(texts) => {
                let text = texts.first().map(String::as_str).unwrap_or("");
                entry.pipeline.text_prompt(text, &mut timer).await?
            }
            Prompt::Tokens(tokens) => tokens.clone(),
            Prompt::TokenBatches(batches) => batches.first().cloned().unwrap_or_default(),
        };
        if prompt.is_empty() {
            return Err(FrontendError::invalid(
                "prompt must not be empty",
                Some("prompt"),
            ));
        }
        let vocab_size = entry.pipeline.tokenizer().vocab_size();
        if vocab_size > 0
            && let Some(unknown) = prompt.iter().find(|id| **id as usize >= vocab_size)
        {
            return Err(FrontendError::invalid(
                format!("token id {unknown} is out of vocabulary (size {vocab_size})"),
                Some("prompt"),
            ));
        }
        let echoed = if echo {
            Some(match &request.prompt {
                Prompt::Text(text) => text.clone(),
                Prompt::Texts(texts) => texts.first().cloned().unwrap_or_default(),
                _ => entry.pipeline.decode(&prompt)?,
            })
        } else {
            None
        };
        let max_tokens =
            entry
                .pipeline
                .fit_max_tokens(prompt.len(), sampling.max_tokens, "prompt")?;
        let output = entry.pipeline.output(&sampling, &prompt);
        let num_prompt_tokens = prompt.len() as u32;
        let worker_request = generate_request(
            request_id.to_string(),
            &entry.name,
            prompt,
            &sampling,
            max_tokens,
        );
        timer.record_since_arrival(Stage::Preprocess);
        let started = generate::start(
            &entry,
            worker_request,
            super::routing_hints(&state.settings, headers, request.nvext.as_ref())?,
            Vec::new(),
            state.settings.backend_stream_timeout,
            super::first_response_wait(&state.settings, stream),
        )
        .await?;
        Ok::<_, FrontendError>((started, output, num_prompt_tokens, echoed))
    }
    .await;
    let (started, output, num_prompt_tokens, echoed) = match started {
        Ok(parts) => parts,
        Err(error) => {
            scope.finish(Some(&error));
            return Err(error);
        }
    };
    let nvext = response_nvext(
        &state.settings,
        &request.nvext,
        started.worker_id(),
        started.dp_rank(),
    );
    let deltas = generate::text_deltas(
        started,
        output,
        num_prompt_tokens,
        entry.metrics.clone(),
        timer,
        request_id.to_string(),
    );
    let id = format!("cmpl-{request_id}");
    let created = now_secs();
    let model = entry.name.clone();

    if !stream {
        let answer = sse::collect_unary(deltas, &mut scope, echoed.unwrap_or_default()).await?;
        let response = CompletionResponse {
            id,
            object: TextCompletionObject,
            created,
            model,
            choices: vec![CompletionChoice {
                index: 0,
                text: answer.text,
                logprobs: None,
                finish_reason: answer.finish_reason,
            }],
            usage: Some(Usage::new(
                answer.usage.prompt_tokens,
                answer.usage.completion_tokens,
                Some(answer.usage.cached_tokens),
            )),
            system_fingerprint: None,
            nvext,
        };
        return Ok(axum::Json(response).into_response());
    }

    let include_usage = request.include_usage();
    let mut framer = CompletionFramer {
        id,
        model,
        created,
        include_usage,
        nvext,
    };
    let opening = echoed.map(|echoed| framer.chunk(&echoed, None));
    let events = sse::delta_events(scope, deltas, opening, include_usage, framer);
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
}

impl CompletionFramer {
    fn chunk(&mut self, text: &str, finish_reason: Option<FinishReason>) -> Bytes {
        let choice = CompletionChunkChoice {
            index: 0,
            text: text.into(),
            logprobs: None,
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
    fn delta(&mut self, text: &str, finish_reason: Option<FinishReason>, events: &mut Vec<Bytes>) {
        events.push(self.chunk(text, finish_reason));
    }

    fn usage(&self, usage: Usage) -> Bytes {
        sse::data_event(&CompletionChunk::usage_only(
            self.id.as_str(),
            self.model.as_str(),
            self.created,
            usage,
        ))
    }
}

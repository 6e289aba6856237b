//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvmesh_llm::EncodedPrompt;
use kvmesh_llm::openai::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionObject, ChatCompletionRequest,
    ChatCompletionResponse, ChatResponseMessage, FinishReason, Role, Usage,
};

use super::openai_shared::{check_supported, now_secs, response_nvext};
use super::request_metrics::{EarlyRequest, RequestScope};
use super::sse;
use super::{AppState, body_bytes, parse_json, request_id, with_request_id};
use crate::error::FrontendError;
use crate::generate;
use crate::models::find_model;
use crate::pipeline::generate_request;
use crate::preprocess::{RequestTimer, Stage};

/// Handles a chat completion, streaming or unary.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let request_id = request_id(&headers);
    let mut early = EarlyRequest::default();
    let response = match handle(&state, &request_id, &headers, body, &mut early).await {
        Ok(response) => response,
        Err(error) => {
            early.count_failure(&state, "chat_completions", &error);
            state.error_response(error)
        }
    };
    with_request_id(response, &request_id)
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
    // A large body is parsed on the preprocessing pool, like its rendering and tokenizing.
    let body_len = body.len();
    let request: Arc<ChatCompletionRequest> = Arc::new(
        state
            .preprocess
            .offload(body_len, move || parse_json(&body))
            .await?,
    );
    early.parsed(state, &request.model, request.is_stream());
    request.validate()?;
    let sampling = request.sampling_options();
    check_supported(&sampling)?;
    let entry = find_model(&state.models, &request.model)?;
    let stream = request.is_stream();
    early.is_scoped = true;
    let mut scope = RequestScope::new(state, &entry, "chat_completions", stream);
    let started = async {
        let EncodedPrompt { ids: prompt, cuts } = entry
            .pipeline
            .chat_prompt(&request, body_len, &mut timer)
            .await?;
        let max_tokens =
            entry
                .pipeline
                .fit_max_tokens(prompt.len(), sampling.max_tokens, "messages")?;
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
            cuts,
            state.settings.backend_stream_timeout,
            super::first_response_wait(&state.settings, stream),
        )
        .await?;
        Ok::<_, FrontendError>((started, output, num_prompt_tokens))
    }
    .await;
    let (started, output, num_prompt_tokens) = match started {
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
    let id = format!("chatcmpl-{request_id}");
    let created = now_secs();
    let model = entry.name.clone();

    if !stream {
        let answer = sse::collect_unary(deltas, &mut scope, String::new()).await?;
        let response = ChatCompletionResponse {
            id,
            object: ChatCompletionObject,
            created,
            model,
            choices: vec![ChatChoice {
                index: 0,
                message: ChatResponseMessage {
                    role: Role::Assistant,
                    content: Some(answer.text),
                    ..Default::default()
                },
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
    let mut first = ChatCompletionChunk::new(
        id.as_str(),
        model.as_str(),
        created,
        ChatChunkChoice::role(0),
        include_usage,
    );
    first.nvext = nvext;
    let opening = sse::data_event(&first);
    let framer = ChatFramer {
        id,
        model,
        created,
        include_usage,
    };
    let events = sse::delta_events(scope, deltas, Some(opening), include_usage, framer);
    Ok(sse::sse_response(events, state.settings.sse_keep_alive))
}

/// Chat chunks: text and finish reason go out as separate chunks, as OpenAI sends them.
struct ChatFramer {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
}

impl ChatFramer {
    fn chunk(&self, choice: ChatChunkChoice<'_>) -> Bytes {
        sse::data_event(&ChatCompletionChunk::new(
            self.id.as_str(),
            self.model.as_str(),
            self.created,
            choice,
            self.include_usage,
        ))
    }
}

impl sse::ChunkFramer for ChatFramer {
    fn delta(&mut self, text: &str, finish_reason: Option<FinishReason>, events: &mut Vec<Bytes>) {
        if !text.is_empty() {
            events.push(self.chunk(ChatChunkChoice::content(0, text)));
        }
        if let Some(reason) = finish_reason {
            events.push(self.chunk(ChatChunkChoice::finish(0, reason)));
        }
    }

    fn usage(&self, usage: Usage) -> Bytes {
        sse::data_event(&ChatCompletionChunk::usage_only(
            self.id.as_str(),
            self.model.as_str(),
            self.created,
            usage,
        ))
    }
}

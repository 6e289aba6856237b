//! `POST /v1/embeddings`: tokenizes each input and embeds them on one of the model's workers
//! through the `Worker.Embed` contract (docs/http-api.md, "Embeddings").

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use kvmesh_llm::openai::{
    EmbeddingObject, EmbeddingValue, EmbeddingsRequest, EmbeddingsResponse, EmbeddingsUsage, Prompt,
};
use kvmesh_proto::v1::{EmbedInput, EmbedRequest};

use super::AppState;
use super::endpoint::{Arrival, Endpoint};
use super::request_metrics::RequestScope;
use crate::error::FrontendError;
use crate::models::{ModelEntry, find_model};
use crate::preprocess::RequestTimer;

/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// `POST /v1/embeddings`.
pub(crate) struct Embeddings;

impl Endpoint for Embeddings {
    const NAME: &'static str = "embeddings";
    type Request = EmbeddingsRequest;

    async fn handle(
        state: &Arc<AppState>,
        request: EmbeddingsRequest,
        arrival: Arrival<'_>,
    ) -> Result<Response, FrontendError> {
        serve(state, request, arrival).await
    }
}

/// How the vectors are sent back.
#[derive(Clone, Copy)]
enum Encoding {
    Float,
    Base64,
}

fn check(request: &EmbeddingsRequest) -> Result<(Encoding, u32), FrontendError> {
    let encoding = match request.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(FrontendError::invalid(
                format!("encoding_format must be float or base64, got {other:?}"),
                Some("encoding_format"),
            ));
        }
    };
    let dimensions = match request.dimensions {
        None => 0,
        Some(n) if n >= 1 => u32::try_from(n).map_err(|_| {
            FrontendError::invalid(format!("dimensions {n} is too large"), Some("dimensions"))
        })?,
        Some(n) => {
            return Err(FrontendError::invalid(
                format!("dimensions must be at least 1, got {n}"),
                Some("dimensions"),
            ));
        }
    };
    let count = match &request.input {
        Prompt::Text(_) | Prompt::Tokens(_) => 1,
        Prompt::Texts(texts) => texts.len(),
        Prompt::TokenBatches(batches) => batches.len(),
    };
    if count == 0 || count > MAX_INPUTS {
        return Err(FrontendError::invalid(
            format!("input must hold 1 to {MAX_INPUTS} items, got {count}"),
            Some("input"),
        ));
    }
    Ok((encoding, dimensions))
}

async fn serve(
    state: &Arc<AppState>,
    request: EmbeddingsRequest,
    arrival: Arrival<'_>,
) -> Result<Response, FrontendError> {
    let Arrival {
        request_id,
        headers,
        early,
        ..
    } = arrival;
    early.parsed(state, &request.model, false);
    let (encoding, dimensions) = check(&request)?;
    let pinned = super::routing_hints(&state.settings, headers, request.nvext.as_ref(), None)?
        .backend_instance_id;
    let entry = find_model(&state.models, &request.model)?;
    early.is_scoped = true;
    let mut scope = RequestScope::new(state, &entry, Embeddings::NAME, false)?;
    let embedded = async {
        let inputs = tokenize(state, &entry, &request.input).await?;
        let prompt_tokens: usize = inputs.iter().map(|input| input.token_ids.len()).sum();
        let response = entry
            .routing
            .embed(
                EmbedRequest {
                    request_id: request_id.to_string(),
                    model: entry.name.clone(),
                    inputs,
                    dimensions,
                },
                pinned,
            )
            .await?;
        Ok::<_, FrontendError>((response, prompt_tokens as u32))
    }
    .await;
    let (response, prompt_tokens) = match embedded {
        Ok(parts) => parts,
        Err(error) => {
            scope.finish(Some(&error));
            return Err(error);
        }
    };
    scope.observe_tokens(prompt_tokens, 0, 0);
    scope.finish(None);
    let data = response
        .embeddings
        .into_iter()
        .enumerate()
        .map(|(index, embedding)| EmbeddingObject {
            object: "embedding",
            index: index as u32,
            embedding: match encoding {
                Encoding::Float => EmbeddingValue::Float(embedding.values),
                Encoding::Base64 => {
                    let bytes: Vec<u8> = embedding
                        .values
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    EmbeddingValue::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            },
        })
        .collect();
    Ok(axum::Json(EmbeddingsResponse {
        object: "list",
        data,
        model: entry.name.clone(),
        usage: EmbeddingsUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    })
    .into_response())
}

/// Each input's token ids: texts tokenized without special tokens, token lists checked against
/// the vocabulary; none may be empty or longer than the model's context.
async fn tokenize(
    state: &Arc<AppState>,
    entry: &Arc<ModelEntry>,
    input: &Prompt,
) -> Result<Vec<EmbedInput>, FrontendError> {
    let mut timer = RequestTimer::start(&state.preprocess);
    let mut inputs = Vec::new();
    match input {
        Prompt::Text(text) => inputs.push(entry.pipeline.text_prompt(text, &mut timer).await?),
        Prompt::Texts(texts) => {
            for text in texts {
                inputs.push(entry.pipeline.text_prompt(text, &mut timer).await?);
            }
        }
        Prompt::Tokens(tokens) => inputs.push(tokens.clone()),
        Prompt::TokenBatches(batches) => inputs.extend(batches.iter().cloned()),
    }
    let vocab_size = entry.pipeline.tokenizer().vocab_size();
    let context = entry.pipeline.context_length() as usize;
    for (index, tokens) in inputs.iter().enumerate() {
        if tokens.is_empty() {
            return Err(FrontendError::invalid(
                format!("input[{index}] must not be empty"),
                Some("input"),
            ));
        }
        if context > 0 && tokens.len() > context {
            return Err(FrontendError::invalid(
                format!(
                    "input[{index}] has {} tokens, more than the model's context length of {context}",
                    tokens.len()
                ),
                Some("input"),
            ));
        }
        if vocab_size > 0
            && let Some(unknown) = tokens.iter().find(|id| **id as usize >= vocab_size)
        {
            return Err(FrontendError::invalid(
                format!("token id {unknown} is out of vocabulary (size {vocab_size})"),
                Some("input"),
            ));
        }
    }
    Ok(inputs
        .into_iter()
        .map(|token_ids| EmbedInput { token_ids })
        .collect())
}

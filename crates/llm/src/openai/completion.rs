//! `POST /v1/completions`: request, unary response and stream chunk.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::common::{
    FinishReason, Stop, StreamOptions, TextCompletionObject, Usage, double_option,
};
use super::logprobs::CompletionLogprobs;
pub use super::prompt::Prompt;
use super::tools::ResponseFormat;
use crate::error::LlmError;

/// A completions request. Unknown fields are ignored; integer limits are signed so that
/// validation can name a negative field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionRequest {
    /// The served model name.
    pub model: String,
    /// The prompt: text, texts, token ids or lists of token ids.
    pub prompt: Prompt,
    /// Most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    /// Sampling temperature, 0 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Choices per prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<i64>,
    /// Stream chunks as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Stop strings (and token ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Penalty for tokens already present, -2 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    /// Penalty by frequency of tokens so far, -2 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Token id → bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<Map<String, Value>>,
    /// Number of alternatives per position to return, 0 to 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the returned text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Text after the completion (insertion); not supported by the engines served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Server-side candidates per choice; only `best_of == n` is meaningful here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<i64>,
    /// End-user id, for logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// vLLM: salt of the prompt's KV block hashes, so that only requests with the same salt
    /// share cached blocks (tenant isolation); the `x-tenant-id` header wins over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// vLLM: keep generating through EOS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// vLLM: no EOS or stop before this many tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<i64>,
    /// vLLM: top-k sampling; -1 or 0 disables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// vLLM: min-p sampling, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// vLLM: repetition penalty, > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
    /// vLLM: leave special tokens out of the text (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// vLLM: send the matched stop string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM: token ids that end generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM: name logprob tokens `token_id:<id>` instead of their text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM: constrain the output to JSON (docs/http-api.md, "Structured output").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// vLLM: output validating against this JSON schema; wins over `nvext.guided_json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<Value>,
    /// vLLM: output the regular expression matches in full; wins over `nvext.guided_regex`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_regex: Option<Value>,
    /// vLLM: output that is one of these strings; wins over `nvext.guided_choice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_choice: Option<Value>,
    /// vLLM: a context-free grammar; not supported (501).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_grammar: Option<Value>,
    /// vLLM: the whitespace guided JSON may use; not supported (501).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_whitespace_pattern: Option<Value>,
    /// vLLM: the guided decoding backend; accepted, the engine picks its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_decoding_backend: Option<String>,
    /// NVIDIA extensions (docs/http-api.md, "nvext").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<Value>,
}

impl CompletionRequest {
    /// Parses a request body; malformed JSON and wrong field types are user errors.
    pub fn from_json(body: &[u8]) -> Result<Self, LlmError> {
        serde_json::from_slice(body).map_err(|err| LlmError::InvalidRequest {
            param: None,
            message: format!("invalid request body: {err}"),
        })
    }

    /// Whether the response streams.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether stream chunks carry `usage`.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .is_some_and(|options| options.include_usage)
    }
}

/// A unary completions response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionResponse {
    /// `cmpl-...`.
    pub id: String,
    /// Always `"text_completion"`.
    pub object: TextCompletionObject,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One per prompt × `n`.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Backend configuration fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// Response `nvext` (worker ids, timing), only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<Value>,
}

/// One choice of a [`CompletionResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionChoice {
    /// Position in `choices`.
    pub index: u32,
    /// The generated text (after the prompt with `echo`).
    pub text: String,
    /// Log probabilities, `null` unless asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Why generation stopped.
    pub finish_reason: Option<FinishReason>,
}

/// A streamed completions chunk. Borrows its strings so that building one per token does not
/// copy the id, the model name or the text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunk<'a> {
    /// Same on every chunk of a response.
    pub id: Cow<'a, str>,
    /// Always `"text_completion"`.
    pub object: TextCompletionObject,
    /// Same on every chunk.
    pub created: u64,
    /// Same on every chunk.
    pub model: Cow<'a, str>,
    /// Usually one choice; empty on the final usage chunk.
    pub choices: Vec<CompletionChunkChoice<'a>>,
    /// Absent (`None`) without `include_usage`; with it `Some(None)` (`"usage": null`) on every
    /// chunk except the last, which has `Some(Some(usage))`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "double_option"
    )]
    pub usage: Option<Option<Usage>>,
    /// Response `nvext`, only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<Value>,
}

/// One choice of a [`CompletionChunk`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChunkChoice<'a> {
    /// Which choice this text belongs to.
    pub index: u32,
    /// New text.
    pub text: Cow<'a, str>,
    /// Log probabilities of the new tokens, `null` unless asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `null` until the choice's last chunk.
    pub finish_reason: Option<FinishReason>,
}

impl<'a> CompletionChunk<'a> {
    /// A chunk with one choice; `include_usage` sets `"usage": null`.
    pub fn new(
        id: impl Into<Cow<'a, str>>,
        model: impl Into<Cow<'a, str>>,
        created: u64,
        choice: CompletionChunkChoice<'a>,
        include_usage: bool,
    ) -> Self {
        Self {
            id: id.into(),
            object: TextCompletionObject,
            created,
            model: model.into(),
            choices: vec![choice],
            usage: include_usage.then_some(None),
            nvext: None,
        }
    }

    /// The last chunk of an `include_usage` stream: no choices, the usage.
    pub fn usage_only(
        id: impl Into<Cow<'a, str>>,
        model: impl Into<Cow<'a, str>>,
        created: u64,
        usage: Usage,
    ) -> Self {
        Self {
            id: id.into(),
            object: TextCompletionObject,
            created,
            model: model.into(),
            choices: Vec::new(),
            usage: Some(Some(usage)),
            nvext: None,
        }
    }
}

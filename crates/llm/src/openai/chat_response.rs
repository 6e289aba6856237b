//! Chat completions responses: the unary body and the stream chunk.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{
    ChatCompletionChunkObject, ChatCompletionObject, FinishReason, Role, Usage, double_option,
};
use super::logprobs::ChatLogprobs;
use super::tools::{ToolCall, ToolCallDelta};

/// A unary chat completions response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-...`.
    pub id: String,
    /// Always `"chat.completion"`.
    pub object: ChatCompletionObject,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One per `n`.
    pub choices: Vec<ChatChoice>,
    /// Token counts, summed over choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Backend configuration fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
    /// Response `nvext`, only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<Value>,
}

/// One choice of a [`ChatCompletionResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatChoice {
    /// Position in `choices`.
    pub index: u32,
    /// The assistant message.
    pub message: ChatResponseMessage,
    /// Log probabilities, `null` unless asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation stopped.
    pub finish_reason: Option<FinishReason>,
}

/// The assistant message of a unary response. `content` is always present (null when the
/// model only called tools), as OpenAI sends it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatResponseMessage {
    /// Always `assistant`.
    pub role: Role,
    /// The text, or null.
    pub content: Option<String>,
    /// Tool calls parsed from the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Reasoning text split off by a reasoning parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same, under the name `--reasoning-field-name reasoning` picks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// A streamed chat chunk. Borrows its strings so that building one per token does not copy
/// the id, the model name or the text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk<'a> {
    /// Same on every chunk of a response.
    pub id: Cow<'a, str>,
    /// Always `"chat.completion.chunk"`.
    pub object: ChatCompletionChunkObject,
    /// Same on every chunk.
    pub created: u64,
    /// Same on every chunk.
    pub model: Cow<'a, str>,
    /// Backend configuration fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<Cow<'a, str>>,
    /// Usually one choice; empty on the final usage chunk.
    pub choices: Vec<ChatChunkChoice<'a>>,
    /// Absent (`None`) without `include_usage`; with it `Some(None)` (`"usage": null`) on every
    /// chunk except the last, which has `Some(Some(usage))` and no choices.
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

impl<'a> ChatCompletionChunk<'a> {
    /// A chunk with one choice; `include_usage` sets `"usage": null`.
    pub fn new(
        id: impl Into<Cow<'a, str>>,
        model: impl Into<Cow<'a, str>>,
        created: u64,
        choice: ChatChunkChoice<'a>,
        include_usage: bool,
    ) -> Self {
        Self {
            id: id.into(),
            object: ChatCompletionChunkObject,
            created,
            model: model.into(),
            system_fingerprint: None,
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
            object: ChatCompletionChunkObject,
            created,
            model: model.into(),
            system_fingerprint: None,
            choices: Vec::new(),
            usage: Some(Some(usage)),
            nvext: None,
        }
    }
}

/// One choice of a [`ChatCompletionChunk`]. `logprobs` and `finish_reason` are always sent,
/// as null until they have a value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice<'a> {
    /// Which choice this delta belongs to.
    pub index: u32,
    /// What is new.
    pub delta: ChatDelta<'a>,
    /// Log probabilities of the new tokens.
    pub logprobs: Option<ChatLogprobs>,
    /// `null` until the choice's last chunk.
    pub finish_reason: Option<FinishReason>,
}

impl<'a> ChatChunkChoice<'a> {
    /// The first chunk of a choice: `role: "assistant"` and empty content.
    pub fn role(index: u32) -> Self {
        Self {
            index,
            delta: ChatDelta {
                role: Some(Role::Assistant),
                content: Some(Cow::Borrowed("")),
                ..ChatDelta::default()
            },
            ..Self::default()
        }
    }

    /// A content delta.
    pub fn content(index: u32, text: impl Into<Cow<'a, str>>) -> Self {
        Self {
            index,
            delta: ChatDelta {
                content: Some(text.into()),
                ..ChatDelta::default()
            },
            ..Self::default()
        }
    }

    /// The last chunk of a choice: empty delta and the finish reason.
    pub fn finish(index: u32, reason: FinishReason) -> Self {
        Self {
            index,
            finish_reason: Some(reason),
            ..Self::default()
        }
    }
}

/// The changed fields of a streamed assistant message; absent fields are left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta<'a> {
    /// `assistant`, on the first chunk of a choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// New text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Cow<'a, str>>,
    /// New reasoning text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Cow<'a, str>>,
    /// The same, under the name `--reasoning-field-name reasoning` picks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Cow<'a, str>>,
    /// Tool call fragments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

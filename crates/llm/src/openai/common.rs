//! Pieces shared by the chat and completions types: object tags, finish reasons, usage, stop.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Defines a zero-sized type that serializes as a fixed `object` string, so a response can never
/// carry the wrong one and building it costs nothing.
macro_rules! object_tag {
    ($(#[$doc:meta])* $name:ident = $value:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name;

        impl $name {
            /// The string this tag stands for.
            pub const VALUE: &'static str = $value;
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$value]))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str($value)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
                if value == $value {
                    Ok($name)
                } else {
                    Err(serde::de::Error::invalid_value(
                        serde::de::Unexpected::Str(&value),
                        &$value,
                    ))
                }
            }
        }
    };
}

object_tag!(
    /// `"chat.completion"`, the `object` of a unary chat response.
    ChatCompletionObject = "chat.completion"
);
object_tag!(
    /// `"chat.completion.chunk"`, the `object` of a streamed chat chunk.
    ChatCompletionChunkObject = "chat.completion.chunk"
);
object_tag!(
    /// `"text_completion"`, the `object` of completions responses and chunks.
    TextCompletionObject = "text_completion"
);
object_tag!(
    /// `"list"`, the `object` of `/v1/models`.
    ListObject = "list"
);
object_tag!(
    /// `"model"`, the `object` of one entry of `/v1/models`.
    ModelObjectTag = "model"
);

/// Why a choice stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// The model called tools.
    ToolCalls,
    /// The engine filtered the content.
    ContentFilter,
}

impl FinishReason {
    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
        }
    }
}

/// The author of a response message; responses are always `assistant`, the enum exists so the
/// value is checked and costs no allocation.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// System prompt.
    System,
    /// OpenAI's newer name for a system prompt.
    Developer,
    /// The user.
    User,
    /// The model.
    #[default]
    Assistant,
    /// A tool result.
    Tool,
    /// A legacy function result.
    Function,
}

/// Token counts of a request, summed over all choices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// `prompt_tokens + completion_tokens`.
    pub total_tokens: u32,
    /// Prompt tokens served from the KV cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// Reasoning tokens among the completion tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

impl Usage {
    /// Usage with `total_tokens` computed; `cached_tokens` fills `prompt_tokens_details`.
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: Option<u32>) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
            completion_tokens_details: None,
        }
    }
}

/// Details of the prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV blocks were already cached on the worker.
    pub cached_tokens: u32,
}

/// Details of the completion tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CompletionTokensDetails {
    /// Tokens spent on reasoning.
    pub reasoning_tokens: u32,
}

/// `stream_options` of a streaming request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` and no choices; every other chunk has `"usage": null`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The `stop` field: one string or a list of strings; integers (token ids) are accepted too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Stop {
    /// `"stop": "\n"`.
    One(String),
    /// `"stop": ["\n", "User:", 128009]`.
    Many(Vec<StopEntry>),
}

/// The request field a chat request's `stop` strings came from: it sets their limit and is the
/// name errors give. Set by a translation, never parsed or serialized.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StopField {
    /// Chat's and completions' `stop`: at most OpenAI's [`super::MAX_STOP_SEQUENCES`] entries.
    #[default]
    Stop,
    /// Anthropic's `stop_sequences`: the API sets no limit of its own; kvmesh's bound is
    /// [`MAX_ANTHROPIC_STOP_SEQUENCES`].
    StopSequences,
}

/// Most Anthropic `stop_sequences`: each stop string is checked against the text of every token.
pub const MAX_ANTHROPIC_STOP_SEQUENCES: usize = 256;

impl StopField {
    /// The field's name and how many entries it may hold.
    pub fn name_and_limit(self) -> (&'static str, usize) {
        match self {
            Self::Stop => ("stop", super::MAX_STOP_SEQUENCES),
            Self::StopSequences => ("stop_sequences", MAX_ANTHROPIC_STOP_SEQUENCES),
        }
    }
}

/// One entry of a `stop` list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StopEntry {
    /// A stop string.
    Text(String),
    /// A stop token id.
    Token(u32),
}

impl Stop {
    /// Number of entries, strings and token ids together (OpenAI allows 4).
    pub fn len(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(entries) => entries.len(),
        }
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stop strings.
    pub fn strings(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            Self::One(s) => (Some(s.as_str()), None),
            Self::Many(entries) => (None, Some(entries.iter())),
        };
        one.into_iter()
            .chain(many.into_iter().flatten().filter_map(|entry| match entry {
                StopEntry::Text(s) => Some(s.as_str()),
                StopEntry::Token(_) => None,
            }))
    }

    /// The stop token ids given as integers.
    pub fn token_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let entries: &[StopEntry] = match self {
            Self::One(_) => &[],
            Self::Many(entries) => entries,
        };
        entries.iter().filter_map(|entry| match entry {
            StopEntry::Token(id) => Some(*id),
            StopEntry::Text(_) => None,
        })
    }
}

/// Deserializes a field that distinguishes "absent" (`None`, via `#[serde(default)]`) from
/// `null` (`Some(None)`), such as the `usage` of stream chunks.
pub(crate) fn double_option<'de, T, D>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

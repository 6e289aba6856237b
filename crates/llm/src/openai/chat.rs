//! `POST /v1/chat/completions` request.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::common::{Stop, StopField, StreamOptions};
use super::tools::{ChatTool, FunctionDefinition, ResponseFormat, ToolCall, ToolChoice};
use crate::error::LlmError;

/// A chat completions request: the OpenAI fields, vLLM's sampling extensions and `nvext`.
/// Unknown fields are ignored. Integer limits are signed so a negative value reaches
/// [`ChatCompletionRequest::validate`] and gets an error that names the field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatCompletionRequest {
    /// The served model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Old name of `max_completion_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    /// Most tokens to generate; wins over `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<i64>,
    /// Sampling temperature, 0 to 2; 0 is greedy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Number of choices.
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
    /// The field `stop` was translated from (Anthropic's `stop_sequences` has its own limit and
    /// name in errors); never parsed or serialized.
    #[serde(skip)]
    pub stop_field: StopField,
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
    /// Return log probabilities of the generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Alternatives per position with `logprobs`, 0 to 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<i64>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ChatTool>>,
    /// Whether and which tool to call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Whether several tool calls may come in one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Most tokens a reasoning model may think before it answers (the engine closes the
    /// thinking when the budget is spent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_thinking_tokens: Option<i64>,
    /// Constrain the output to JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// vLLM: output validating against this JSON schema (an object or its JSON text); wins over
    /// `nvext.guided_json`.
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
    /// Legacy spelling of `tools` (functions only); moved there by
    /// [`ChatCompletionRequest::adopt_legacy_functions`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<Vec<FunctionDefinition>>,
    /// Legacy spelling of `tool_choice`: `"none"`, `"auto"` or `{"name": ...}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<Value>,
    /// How hard a reasoning model thinks (`low`, `medium`, `high`, ...); the chat template reads
    /// it as the variable `reasoning_effort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Output modalities; only `["text"]` is supported (anything else is a 501).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modalities: Option<Vec<String>>,
    /// Audio output options; not supported (501).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Value>,
    /// Predicted output; not supported (501).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Value>,
    /// Web search options; not supported (501).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_options: Option<Value>,
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
    /// vLLM: repetition penalty, > 0 (1 is none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
    /// vLLM: leave special tokens out of the text (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// vLLM: send the matched stop string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM: name logprob tokens `token_id:<id>` instead of their text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM: token ids that end generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM: end the prompt with the assistant header (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
    /// vLLM: render the last (assistant) message open so the model continues it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// vLLM: extra variables for the chat template (`enable_thinking`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// vLLM: documents for retrieval templates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<Value>,
    /// NVIDIA extensions (docs/http-api.md, "nvext"), interpreted by the frontend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<Value>,
}

impl ChatCompletionRequest {
    /// Parses a request body; malformed JSON and wrong field types are user errors.
    pub fn from_json(body: &[u8]) -> Result<Self, LlmError> {
        serde_json::from_slice(body).map_err(|err| LlmError::InvalidRequest {
            param: None,
            message: format!("invalid request body: {err}"),
        })
    }

    /// `max_completion_tokens`, else `max_tokens` (the new name wins).
    pub fn effective_max_tokens(&self) -> Option<i64> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Whether the response streams.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether stream chunks carry `usage` (null, then a final usage chunk).
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .is_some_and(|options| options.include_usage)
    }

    /// Whether the template appends the assistant header (vLLM's default: yes).
    pub fn add_generation_prompt(&self) -> bool {
        self.add_generation_prompt.unwrap_or(true)
    }
}

/// One message of the conversation. `role` is kept as a string so that templates, not the
/// parser, decide which roles exist (and raise for the others).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// A string, a list of parts, or null (assistant messages with tool calls).
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Reasoning of an earlier assistant turn, for templates that replay it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with text content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            ..Self::default()
        }
    }

    /// The text of the content: a string as is, text parts joined with `\n` (as vLLM does),
    /// null as empty. Non-text parts are not supported by a text model.
    pub fn text(&self) -> Result<Cow<'_, str>, LlmError> {
        match &self.content {
            None => Ok(Cow::Borrowed("")),
            Some(content) => content.text(),
        }
    }
}

/// Message content: a string or a list of typed parts. Deserialized by looking at the JSON
/// type directly (not `untagged`, which would buffer and copy a 200 KB prompt twice).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": "..."}, ...]`.
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;

        impl<'de> serde::de::Visitor<'de> for ContentVisitor {
            type Value = MessageContent;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of content parts")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(text.to_owned()))
            }

            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Self::Value, E> {
                Ok(MessageContent::Text(text))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<Self::Value, A::Error> {
                Vec::<ContentPart>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(MessageContent::Parts)
            }
        }

        deserializer.deserialize_any(ContentVisitor)
    }
}

impl MessageContent {
    /// See [`ChatMessage::text`].
    pub fn text(&self) -> Result<Cow<'_, str>, LlmError> {
        let parts = match self {
            Self::Text(text) => return Ok(Cow::Borrowed(text)),
            Self::Parts(parts) => parts,
        };
        let mut texts = Vec::with_capacity(parts.len());
        for part in parts {
            let text = match part.kind.as_str() {
                "text" | "input_text" | "output_text" => part.text.as_deref(),
                "refusal" => part.refusal.as_deref(),
                other => {
                    return Err(LlmError::unhandled_kind(
                        other,
                        &[
                            "image_url",
                            "input_audio",
                            "input_image",
                            "input_file",
                            "file",
                            "video_url",
                            "audio_url",
                        ],
                        "messages",
                        format!("content part type '{other}' is not supported by this model"),
                    ));
                }
            };
            texts.push(text.unwrap_or_default());
        }
        match texts.as_slice() {
            [one] => Ok(Cow::Borrowed(one)),
            _ => Ok(Cow::Owned(texts.join("\n"))),
        }
    }
}

/// One part of a [`MessageContent::Parts`]. Only text parts are rendered; the other fields
/// exist so that multimodal requests parse and get a clear error.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ContentPart {
    /// `text`, `image_url`, `input_audio`, `refusal`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The refusal of a `refusal` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// The image of an `image_url` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<Value>,
    /// The audio of an `input_audio` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_audio: Option<Value>,
}

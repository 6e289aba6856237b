//! Anthropic Messages requests (`POST /v1/messages`, `/v1/messages/count_tokens`) and their
//! translation to a chat request, so that the Messages API is served by the chat path
//! (docs/http-api.md, "Anthropic Messages").
//!
//! Content blocks map onto chat messages (`content`); custom tools onto chat tools, while server
//! tools (web search, bash, ...) are refused as not implemented; `thinking` onto
//! `max_thinking_tokens` or, disabled, the template variable `enable_thinking: false`. Images and
//! documents are refused as unsupported by a text model. Claude Code's per-request billing line
//! can be stripped from the system prompt first (`--strip-anthropic-preamble`).

mod content;
mod preamble;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use self::content::chat_messages;
use crate::error::LlmError;
use crate::openai::{
    ChatCompletionRequest, ChatTool, FunctionDefinition, FunctionName, NamedToolChoice, Stop,
    StopEntry, StopField, ToolChoice, ToolChoiceMode,
};

/// A Messages request. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct MessagesRequest {
    /// The served model name.
    pub model: String,
    /// Most tokens to generate; required by the API.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// The conversation, alternating `user` and `assistant`.
    pub messages: Vec<AnthropicMessage>,
    /// The system prompt: a string or text blocks.
    #[serde(default)]
    pub system: Option<AnthropicContent>,
    /// Strings that end generation; the matched one is reported as `stop_sequence`.
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// Sampling temperature, 0 to 1.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Top-k sampling.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Option<Vec<AnthropicTool>>,
    /// Whether and which tool to call.
    #[serde(default)]
    pub tool_choice: Option<AnthropicToolChoice>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Extended thinking: `enabled` with a `budget_tokens` cap, or `disabled`.
    #[serde(default)]
    pub thinking: Option<AnthropicThinking>,
    /// Request metadata (`user_id`); accepted, no effect on generation.
    #[serde(default)]
    pub metadata: Option<Value>,
    /// Capacity tier; accepted, no effect on generation.
    #[serde(default)]
    pub service_tier: Option<String>,
    /// NVIDIA extensions, as on the OpenAI endpoints.
    #[serde(default)]
    pub nvext: Option<Value>,
}

/// `thinking`: `{type: "enabled", budget_tokens}` or `{type: "disabled"}`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct AnthropicThinking {
    /// `enabled` or `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Most tokens the model may think, with `enabled`.
    #[serde(default)]
    pub budget_tokens: Option<i64>,
}

/// A `count_tokens` request: the fields of a Messages request that shape its rendered prompt.
/// Unknown fields (a whole Messages request's `max_tokens`, `stream`, ...) are ignored.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct CountTokensRequest {
    /// The served model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<AnthropicMessage>,
    /// The system prompt.
    #[serde(default)]
    pub system: Option<AnthropicContent>,
    /// Tools, rendered into the prompt by templates that print them.
    #[serde(default)]
    pub tools: Option<Vec<AnthropicTool>>,
    /// Tool choice: `none` leaves the tools out of the prompt under
    /// `--exclude-tools-when-tool-choice-none`, as on `/v1/messages`.
    #[serde(default)]
    pub tool_choice: Option<AnthropicToolChoice>,
    /// Extended thinking: `disabled` sets the template variable `enable_thinking: false`.
    #[serde(default)]
    pub thinking: Option<AnthropicThinking>,
}

/// The prompt-shaping fields of a Messages or `count_tokens` request, converted once for both so
/// that `count_tokens` counts the prompt `usage.input_tokens` reports.
struct PromptParts<'a> {
    model: &'a str,
    system: Option<&'a AnthropicContent>,
    messages: &'a [AnthropicMessage],
    tools: Option<&'a [AnthropicTool]>,
    tool_choice: Option<&'a AnthropicToolChoice>,
    thinking: Option<&'a AnthropicThinking>,
}

impl PromptParts<'_> {
    /// A chat request with the messages, tools, tool choice and thinking set, nothing else.
    fn to_chat(&self) -> Result<ChatCompletionRequest, LlmError> {
        let mut chat = ChatCompletionRequest {
            model: self.model.to_owned(),
            messages: chat_messages(self.system, self.messages)?,
            tools: self.tools.map(chat_tools).transpose()?,
            ..Default::default()
        };
        if let Some(thinking) = self.thinking {
            apply_thinking(&mut chat, thinking)?;
        }
        if let Some(choice) = self.tool_choice {
            apply_tool_choice(&mut chat, choice)?;
        }
        Ok(chat)
    }
}

/// One message of the conversation.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or content blocks.
    pub content: AnthropicContent,
}

/// Message or system content: a string or a list of blocks.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum AnthropicContent {
    /// Plain text.
    Text(String),
    /// Typed blocks.
    Blocks(Vec<ContentBlock>),
}

/// One content block. Only the fields of the block's `type` are set.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct ContentBlock {
    /// `text`, `tool_use`, `tool_result`, `thinking`, `redacted_thinking`, `image`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Text of a `text` block.
    #[serde(default)]
    pub text: Option<String>,
    /// Id of a `tool_use` block.
    #[serde(default)]
    pub id: Option<String>,
    /// Tool name of a `tool_use` block.
    #[serde(default)]
    pub name: Option<String>,
    /// Arguments of a `tool_use` block.
    #[serde(default)]
    pub input: Option<Value>,
    /// The call a `tool_result` block answers.
    #[serde(default)]
    pub tool_use_id: Option<String>,
    /// Result of a `tool_result` block: a string or text blocks.
    #[serde(default)]
    pub content: Option<Value>,
    /// Whether a `tool_result` reports a failed call: its text reaches the model after
    /// [`TOOL_ERROR_PREFIX`].
    #[serde(default)]
    pub is_error: Option<bool>,
    /// Reasoning of a `thinking` block.
    #[serde(default)]
    pub thinking: Option<String>,
}

/// What starts the rendered text of a `tool_result` with `is_error: true`, so that the model
/// sees that the call failed (the chat `tool` message has no error flag of its own).
pub const TOOL_ERROR_PREFIX: &str = "Error: ";

/// A tool definition: `{name, description?, input_schema}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct AnthropicTool {
    /// Absent or `custom` for a client tool; a server tool's versioned type
    /// (`web_search_20250305`, `bash_20250124`, ...) is not implemented.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// The tool name.
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: Option<String>,
    /// JSON schema of its input.
    #[serde(default)]
    pub input_schema: Option<Value>,
}

/// `tool_choice`: `{type: auto|any|none}` or `{type: tool, name}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct AnthropicToolChoice {
    /// `auto`, `any`, `none` or `tool`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool of `type: tool`.
    #[serde(default)]
    pub name: Option<String>,
    /// At most one tool call per turn (chat's `parallel_tool_calls: false`).
    #[serde(default)]
    pub disable_parallel_tool_use: Option<bool>,
}

/// Why generation ended, in the Messages API's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model ended its turn (end of sequence).
    EndTurn,
    /// A stop sequence matched.
    StopSequence,
    /// `max_tokens` was reached.
    MaxTokens,
    /// The model called a tool.
    ToolUse,
    /// The engine filtered the content.
    Refusal,
}

impl StopReason {
    /// The Messages API's reason for an OpenAI finish reason; a stop that matched a stop string
    /// is `stop_sequence`, any other stop (end of sequence, a stop token) `end_turn`.
    pub fn from_finish(finish: crate::openai::FinishReason, matched_stop: bool) -> Self {
        use crate::openai::FinishReason;
        match finish {
            FinishReason::Stop if matched_stop => Self::StopSequence,
            FinishReason::Stop => Self::EndTurn,
            FinishReason::Length => Self::MaxTokens,
            FinishReason::ToolCalls => Self::ToolUse,
            FinishReason::ContentFilter => Self::Refusal,
        }
    }
}

impl MessagesRequest {
    /// Whether the response streams.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Removes Claude Code's billing attribution lines (`x-anthropic-billing-header: ...`)
    /// from `system`, so that the prompt does not change from request to request.
    pub fn strip_billing_preamble(&mut self) {
        preamble::strip_billing_lines(&mut self.system);
    }

    /// The equivalent chat request; a missing or non-positive `max_tokens` and unsupported
    /// blocks are errors naming the field.
    pub fn to_chat(&self) -> Result<ChatCompletionRequest, LlmError> {
        let max_tokens = match self.max_tokens {
            None => return Err(invalid("max_tokens", "max_tokens: field required")),
            Some(n) if n < 1 => {
                return Err(invalid(
                    "max_tokens",
                    format!("max_tokens: must be at least 1, got {n}"),
                ));
            }
            Some(n) => n,
        };
        let prompt = PromptParts {
            model: &self.model,
            system: self.system.as_ref(),
            messages: &self.messages,
            tools: self.tools.as_deref(),
            tool_choice: self.tool_choice.as_ref(),
            thinking: self.thinking.as_ref(),
        };
        let mut chat = ChatCompletionRequest {
            max_tokens: Some(max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stream: self.stream,
            nvext: self.nvext.clone(),
            ..prompt.to_chat()?
        };
        if let Some(stops) = self.stop_sequences.as_ref().filter(|s| !s.is_empty()) {
            chat.stop = Some(Stop::Many(
                stops.iter().cloned().map(StopEntry::Text).collect(),
            ));
            chat.stop_field = StopField::StopSequences;
        }
        Ok(chat)
    }
}

impl CountTokensRequest {
    /// Removes the billing attribution lines from `system`, as
    /// [`MessagesRequest::strip_billing_preamble`] does, so the count matches the request's.
    pub fn strip_billing_preamble(&mut self) {
        preamble::strip_billing_lines(&mut self.system);
    }

    /// The chat request whose rendered prompt is counted: the same conversion as
    /// [`MessagesRequest::to_chat`] of the prompt-shaping fields.
    pub fn to_chat(&self) -> Result<ChatCompletionRequest, LlmError> {
        PromptParts {
            model: &self.model,
            system: self.system.as_ref(),
            messages: &self.messages,
            tools: self.tools.as_deref(),
            tool_choice: self.tool_choice.as_ref(),
            thinking: self.thinking.as_ref(),
        }
        .to_chat()
    }
}

fn invalid(param: &'static str, message: impl Into<String>) -> LlmError {
    LlmError::InvalidRequest {
        param: Some(param),
        message: message.into(),
    }
}

/// Client tools as chat tools; a server tool is not implemented, named by its type.
fn chat_tools(tools: &[AnthropicTool]) -> Result<Vec<ChatTool>, LlmError> {
    tools
        .iter()
        .enumerate()
        .map(|(index, tool)| match tool.kind.as_deref() {
            None | Some("custom") => Ok(ChatTool {
                kind: "function".into(),
                function: FunctionDefinition {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: tool.input_schema.clone(),
                    strict: None,
                },
            }),
            Some(other) => Err(LlmError::Unsupported(format!(
                "tools.{index}: tool type '{other}' is not supported; only custom (client) tools"
            ))),
        })
        .collect()
}

/// `tool_choice` on the chat request: `auto`, `any` (required), `none`, or `tool` with a name;
/// `disable_parallel_tool_use: true` is chat's `parallel_tool_calls: false`.
fn apply_tool_choice(
    chat: &mut ChatCompletionRequest,
    choice: &AnthropicToolChoice,
) -> Result<(), LlmError> {
    chat.tool_choice = Some(match (choice.kind.as_str(), &choice.name) {
        ("auto", _) => ToolChoice::Mode(ToolChoiceMode::Auto),
        ("any", _) => ToolChoice::Mode(ToolChoiceMode::Required),
        ("none", _) => ToolChoice::Mode(ToolChoiceMode::None),
        ("tool", Some(name)) => ToolChoice::Named(NamedToolChoice {
            kind: "function".into(),
            function: FunctionName { name: name.clone() },
        }),
        (other, _) => {
            return Err(invalid(
                "tool_choice",
                format!("tool_choice: unknown type {other:?} (or a tool choice without a name)"),
            ));
        }
    });
    if choice.disable_parallel_tool_use == Some(true) {
        chat.parallel_tool_calls = Some(false);
    }
    Ok(())
}

/// `thinking` on the chat request: `enabled` caps the thinking at `budget_tokens`; `disabled`
/// sets the template variable `enable_thinking` to false (templates of hybrid reasoning models
/// read it).
fn apply_thinking(
    chat: &mut ChatCompletionRequest,
    thinking: &AnthropicThinking,
) -> Result<(), LlmError> {
    match thinking.kind.as_str() {
        "enabled" => match thinking.budget_tokens {
            Some(budget) if budget >= 1 => {
                chat.max_thinking_tokens = Some(budget);
                Ok(())
            }
            Some(budget) => Err(invalid(
                "thinking.budget_tokens",
                format!("thinking.budget_tokens: must be at least 1, got {budget}"),
            )),
            None => Err(invalid(
                "thinking.budget_tokens",
                "thinking.budget_tokens: field required",
            )),
        },
        "disabled" => {
            chat.chat_template_kwargs
                .get_or_insert_with(Default::default)
                .entry("enable_thinking")
                .or_insert(Value::Bool(false));
            Ok(())
        }
        other => Err(invalid(
            "thinking",
            format!("thinking.type: must be enabled or disabled, got {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests;

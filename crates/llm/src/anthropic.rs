//! Anthropic Messages requests (`POST /v1/messages`, `/v1/messages/count_tokens`) and their
//! translation to a chat request, so that the Messages API is served by the chat path
//! (docs/http-api.md, "Anthropic Messages").
//!
//! Content blocks map onto chat messages: `text` blocks become content, an assistant's
//! `tool_use` blocks become its `tool_calls`, a user's `tool_result` blocks become `tool`
//! messages, and `thinking` blocks become the assistant's `reasoning_content`. Images and
//! documents are refused as unsupported by a text model.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::LlmError;
use crate::openai::{
    ChatCompletionRequest, ChatMessage, ChatTool, FunctionCall, FunctionDefinition, FunctionName,
    MessageContent, NamedToolChoice, Stop, StopEntry, ToolCall, ToolChoice, ToolChoiceMode,
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
    /// NVIDIA extensions, as on the OpenAI endpoints.
    #[serde(default)]
    pub nvext: Option<Value>,
}

/// A `count_tokens` request: the prompt parts of a Messages request.
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
    /// Reasoning of a `thinking` block.
    #[serde(default)]
    pub thinking: Option<String>,
}

/// A tool definition: `{name, description?, input_schema}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct AnthropicTool {
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
        let mut chat = ChatCompletionRequest {
            model: self.model.clone(),
            messages: chat_messages(self.system.as_ref(), &self.messages)?,
            max_tokens: Some(max_tokens),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stream: self.stream,
            nvext: self.nvext.clone(),
            tools: self.tools.as_deref().map(chat_tools),
            ..Default::default()
        };
        if let Some(stops) = self.stop_sequences.as_ref().filter(|s| !s.is_empty()) {
            chat.stop = Some(Stop::Many(
                stops.iter().cloned().map(StopEntry::Text).collect(),
            ));
        }
        if let Some(choice) = &self.tool_choice {
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
                        format!(
                            "tool_choice: unknown type {other:?} (or a tool choice without a name)"
                        ),
                    ));
                }
            });
        }
        Ok(chat)
    }
}

impl CountTokensRequest {
    /// The chat request whose rendered prompt is counted.
    pub fn to_chat(&self) -> Result<ChatCompletionRequest, LlmError> {
        Ok(ChatCompletionRequest {
            model: self.model.clone(),
            messages: chat_messages(self.system.as_ref(), &self.messages)?,
            tools: self.tools.as_deref().map(chat_tools),
            ..Default::default()
        })
    }
}

fn invalid(param: &'static str, message: impl Into<String>) -> LlmError {
    LlmError::InvalidRequest {
        param: Some(param),
        message: message.into(),
    }
}

fn chat_tools(tools: &[AnthropicTool]) -> Vec<ChatTool> {
    tools
        .iter()
        .map(|tool| ChatTool {
            kind: "function".into(),
            function: FunctionDefinition {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.input_schema.clone(),
                strict: None,
            },
        })
        .collect()
}

fn chat_messages(
    system: Option<&AnthropicContent>,
    messages: &[AnthropicMessage],
) -> Result<Vec<ChatMessage>, LlmError> {
    if messages.is_empty() {
        return Err(invalid(
            "messages",
            "messages: at least one message is required",
        ));
    }
    let mut chat = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        let text = content_text(system, "system")?;
        if !text.is_empty() {
            chat.push(ChatMessage::new("system", text));
        }
    }
    for (index, message) in messages.iter().enumerate() {
        if message.role != "user" && message.role != "assistant" {
            return Err(invalid(
                "messages",
                format!(
                    "messages.{index}.role: must be user or assistant, got {:?}",
                    message.role
                ),
            ));
        }
        let blocks = match &message.content {
            AnthropicContent::Text(text) => {
                chat.push(ChatMessage::new(message.role.as_str(), text.as_str()));
                continue;
            }
            AnthropicContent::Blocks(blocks) => blocks,
        };
        let mut text = Vec::new();
        let mut calls = Vec::new();
        let mut reasoning = Vec::new();
        for block in blocks {
            match block.kind.as_str() {
                "text" => text.push(block.text.clone().unwrap_or_default()),
                "thinking" => reasoning.push(block.thinking.clone().unwrap_or_default()),
                "redacted_thinking" => {}
                "tool_use" => calls.push(ToolCall {
                    id: block.id.clone().unwrap_or_default(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: block.name.clone().unwrap_or_default(),
                        arguments: block
                            .input
                            .as_ref()
                            .map_or_else(|| "{}".to_string(), Value::to_string),
                    },
                }),
                "tool_result" => {
                    // A tool's answer is its own message, after what came before it.
                    flush_text(&mut chat, &message.role, &mut text);
                    chat.push(ChatMessage {
                        role: "tool".into(),
                        content: Some(MessageContent::Text(tool_result_text(block)?)),
                        tool_call_id: block.tool_use_id.clone(),
                        ..Default::default()
                    });
                }
                other => {
                    return Err(LlmError::unhandled_kind(
                        other,
                        &[
                            "image",
                            "document",
                            "search_result",
                            "server_tool_use",
                            "web_search_tool_result",
                            "container_upload",
                        ],
                        "messages",
                        format!(
                            "messages.{index}: content block type '{other}' is not supported by this model"
                        ),
                    ));
                }
            }
        }
        if !calls.is_empty() || !reasoning.is_empty() || !text.is_empty() {
            chat.push(ChatMessage {
                role: message.role.clone(),
                content: Some(MessageContent::Text(text.join("\n"))),
                tool_calls: (!calls.is_empty()).then_some(calls),
                reasoning_content: (!reasoning.is_empty()).then(|| reasoning.join("\n")),
                ..Default::default()
            });
        }
    }
    Ok(chat)
}

fn flush_text(chat: &mut Vec<ChatMessage>, role: &str, text: &mut Vec<String>) {
    if !text.is_empty() {
        chat.push(ChatMessage::new(role, text.join("\n")));
        text.clear();
    }
}

fn content_text(content: &AnthropicContent, field: &'static str) -> Result<String, LlmError> {
    match content {
        AnthropicContent::Text(text) => Ok(text.clone()),
        AnthropicContent::Blocks(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for block in blocks {
                if block.kind != "text" {
                    return Err(invalid(
                        field,
                        format!(
                            "{field}: only text blocks are allowed, got {:?}",
                            block.kind
                        ),
                    ));
                }
                texts.push(block.text.clone().unwrap_or_default());
            }
            Ok(texts.join("\n"))
        }
    }
}

fn tool_result_text(block: &ContentBlock) -> Result<String, LlmError> {
    match &block.content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(
                        part.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                    ),
                    other => {
                        return Err(LlmError::unhandled_kind(
                            other.unwrap_or_default(),
                            &["image", "document", "search_result"],
                            "messages",
                            format!(
                                "tool_result content of type {other:?} is not supported by this model"
                            ),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(other) => Ok(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn max_tokens_is_required_and_positive() {
        let base =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let error = request(base.clone()).to_chat().unwrap_err();
        assert_eq!(error.param(), Some("max_tokens"));
        let mut zero = base;
        zero["max_tokens"] = 0.into();
        assert!(
            request(zero)
                .to_chat()
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
    }

    #[test]
    fn blocks_become_chat_messages() {
        let chat = request(serde_json::json!({
            "model": "m", "max_tokens": 8,
            "system": [{"type": "text", "text": "be brief"}],
            "stop_sequences": ["END"],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "thanks"}]}
            ],
            "tool_choice": {"type": "any"}
        }))
        .to_chat()
        .unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let call = &chat.messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(
            chat.messages[2].reasoning_content.as_deref(),
            Some("call it")
        );
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("t1"));
        assert_eq!(chat.messages[3].text().unwrap(), "sunny");
        assert_eq!(chat.max_tokens, Some(8));
        assert_eq!(
            chat.tool_choice,
            Some(ToolChoice::Mode(ToolChoiceMode::Required))
        );
        assert!(matches!(chat.stop, Some(Stop::Many(ref s)) if s.len() == 1));
    }

    #[test]
    fn images_and_bad_roles_are_refused() {
        let image = request(
            serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {}}]}]}),
        );
        assert!(matches!(image.to_chat(), Err(LlmError::Unsupported(_))));
        let role = request(
            serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "system", "content": "x"}]}),
        );
        assert_eq!(role.to_chat().unwrap_err().param(), Some("messages"));
    }
}

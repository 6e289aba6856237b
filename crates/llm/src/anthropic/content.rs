//! Anthropic content blocks onto chat messages: `text` blocks become content, an assistant's
//! `tool_use` blocks its `tool_calls`, a user's `tool_result` blocks `tool` messages (a failed
//! call's text after [`TOOL_ERROR_PREFIX`]), and `thinking` blocks the assistant's
//! `reasoning_content`.

use serde_json::Value;

use super::{AnthropicContent, AnthropicMessage, ContentBlock, TOOL_ERROR_PREFIX, invalid};
use crate::error::LlmError;
use crate::openai::{ChatMessage, FunctionCall, MessageContent, ToolCall};

/// The chat messages of a system prompt and a conversation.
pub(super) fn chat_messages(
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
    let text = tool_result_content(block)?;
    Ok(match block.is_error {
        Some(true) => format!("{TOOL_ERROR_PREFIX}{text}"),
        _ => text,
    })
}

fn tool_result_content(block: &ContentBlock) -> Result<String, LlmError> {
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

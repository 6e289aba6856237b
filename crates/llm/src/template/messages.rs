//! The values a chat template sees: messages shaped the way vLLM hands them to Jinja.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value as JsonValue;

use crate::error::LlmError;
use crate::openai::{ChatMessage, ToolCall};

/// A message as the template sees it: text content (parts joined, null as empty) and tool call
/// arguments as JSON objects rather than strings, which is what tool-use templates expect
/// (`tool_call.arguments | tojson`).
#[derive(Debug, Serialize)]
struct TemplateMessage<'a> {
    role: &'a str,
    content: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<TemplateToolCall<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct TemplateToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    function: TemplateFunction<'a>,
}

#[derive(Debug, Serialize)]
struct TemplateFunction<'a> {
    name: &'a str,
    arguments: JsonValue,
}

/// The `messages` variable of the template.
pub(crate) fn template_messages(messages: &[ChatMessage]) -> Result<minijinja::Value, LlmError> {
    let converted = messages
        .iter()
        .map(|message| {
            Ok(TemplateMessage {
                role: &message.role,
                content: message.text()?,
                name: message.name.as_deref(),
                tool_calls: message
                    .tool_calls
                    .as_ref()
                    .map(|calls| calls.iter().map(template_tool_call).collect()),
                tool_call_id: message.tool_call_id.as_deref(),
                reasoning_content: message.reasoning_content.as_deref(),
            })
        })
        .collect::<Result<Vec<_>, LlmError>>()?;
    Ok(minijinja::Value::from_serialize(&converted))
}

fn template_tool_call(call: &ToolCall) -> TemplateToolCall<'_> {
    let arguments = serde_json::from_str(&call.function.arguments)
        .unwrap_or_else(|_| JsonValue::String(call.function.arguments.clone()));
    TemplateToolCall {
        id: &call.id,
        kind: &call.kind,
        function: TemplateFunction {
            name: &call.function.name,
            arguments,
        },
    }
}

/// Rewrites Hugging Face's `{% generation %}` / `{% endgeneration %}` (a transformers extension
/// that marks assistant tokens for training) into `{% if true %}` / `{% endif %}`, keeping the
/// whitespace-control markers, so such templates compile and render the same text.
pub(crate) fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        let (before, tag) = rest.split_at(open);
        out.push_str(before);
        let body = &tag[2..];
        let marker_len = usize::from(body.starts_with(['-', '+']));
        let after_marker = &body[marker_len..];
        let trimmed = after_marker.trim_start();
        let keyword_start = 2 + marker_len + (after_marker.len() - trimmed.len());
        let keyword = trimmed
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap_or_default();
        let replacement = match keyword {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(replacement) => {
                out.push_str(&tag[..keyword_start]);
                out.push_str(replacement);
                rest = &tag[keyword_start + keyword.len()..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_plain_blocks() {
        let source = "{%- generation -%}{{ x }}{% endgeneration %}{% if generation %}{% endif %}";
        assert_eq!(
            rewrite_generation_tags(source),
            "{%- if true -%}{{ x }}{% endif %}{% if generation %}{% endif %}"
        );
        assert!(matches!(
            rewrite_generation_tags("{{ a }}"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn tool_call_arguments_become_objects() {
        let message: ChatMessage = serde_json::from_value(serde_json::json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}}]
        }))
        .unwrap();
        let value = template_messages(&[message]).unwrap();
        let json = serde_json::to_string(&value).unwrap();
        assert_eq!(
            json,
            r#"[{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"b":1,"a":[2]}}}]}]"#
        );
    }
}

//! OpenAI Responses requests (`POST /v1/responses`) and their translation to a chat request, so
//! that the Responses API is served by the chat path (docs/http-api.md, "Responses API").
//!
//! kvmesh keeps no conversation state: `store` is accepted and ignored, and a
//! `previous_response_id` or `conversation` is refused; `background` runs and stored `prompt`
//! templates are not implemented. `instructions` become a leading system message; input
//! items map onto chat messages (`message` items by role, `function_call` items onto an assistant
//! message's `tool_calls`, `function_call_output` items onto `tool` messages).

mod options;
mod tools;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::LlmError;
use crate::openai::{
    ChatCompletionRequest, ChatMessage, FunctionCall, JsonSchemaFormat, MessageContent,
    ResponseFormat, ToolCall,
};

/// A Responses request. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    /// The served model name.
    pub model: String,
    /// A string (one user message) or a list of input items.
    pub input: ResponsesInput,
    /// System instructions, put before the input.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Most tokens to generate; reaching it makes the response `incomplete`.
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    /// Sampling temperature, 0 to 2.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Function tools: `{type: "function", name, description?, parameters}`.
    #[serde(default)]
    pub tools: Option<Vec<ResponsesTool>>,
    /// `none`, `auto`, `required` or `{type: "function", name}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Refused: kvmesh is stateless.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Refused: kvmesh is stateless.
    #[serde(default)]
    pub conversation: Option<Value>,
    /// Run in the background and poll; not implemented (501) when true.
    #[serde(default)]
    pub background: Option<bool>,
    /// A stored prompt template by id; not implemented (501).
    #[serde(default)]
    pub prompt: Option<Value>,
    /// Whether several function calls may come in one turn (default true); echoed back.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Key-value pairs echoed back in the response object.
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// Reasoning options: `effort` reaches the chat template as `reasoning_effort`.
    #[serde(default)]
    pub reasoning: Option<ResponsesReasoning>,
    /// Output options: `format` constrains the text (`text`, `json_object`, or `json_schema`
    /// with `name`, `schema`, `strict`), as `response_format` does on chat.
    #[serde(default)]
    pub text: Option<ResponsesText>,
    /// Extra output: `message.output_text.logprobs` returns log probabilities; the values for
    /// built-in tool calls, input images and `reasoning.encrypted_content` change nothing (docs/
    /// http-api.md says why); any other value is a 400.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// Alternatives per output position, 0 to 20; a positive value returns log probabilities
    /// as `include: ["message.output_text.logprobs"]` does.
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// `disabled` (the default) or `auto`, which is not implemented (501): the input is never
    /// truncated.
    #[serde(default)]
    pub truncation: Option<String>,
    /// Most `function_call` items in the response; further calls are dropped.
    #[serde(default)]
    pub max_tool_calls: Option<i64>,
    /// End-user id; accepted, no effect, echoed back.
    #[serde(default)]
    pub user: Option<String>,
    /// Processing tier; accepted, no effect, echoed back.
    #[serde(default)]
    pub service_tier: Option<String>,
    /// Stable id of the end user for abuse detection; accepted, no effect, echoed back.
    #[serde(default)]
    pub safety_identifier: Option<String>,
    /// Prompt-cache bucketing key; accepted, no effect (the router follows the prompt itself),
    /// echoed back.
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// NVIDIA extensions, as on the chat endpoint.
    #[serde(default)]
    pub nvext: Option<Value>,
}

/// The `reasoning` options of a Responses request.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct ResponsesReasoning {
    /// `minimal`, `low`, `medium` or `high`: the chat template variable `reasoning_effort`.
    #[serde(default)]
    pub effort: Option<String>,
    /// Reasoning summaries; accepted, no effect (reasoning comes back whole as
    /// `reasoning_text`).
    #[serde(default)]
    pub summary: Option<String>,
}

/// The `text` options of a Responses request.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct ResponsesText {
    /// The output format.
    #[serde(default)]
    pub format: Option<ResponsesTextFormat>,
}

/// `text.format`: the chat `response_format` with the schema's fields inline.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesTextFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON validating against `schema`.
    JsonSchema(JsonSchemaFormat),
}

impl ResponsesTextFormat {
    fn response_format(&self) -> ResponseFormat {
        match self {
            Self::Text => ResponseFormat::Text,
            Self::JsonObject => ResponseFormat::JsonObject,
            Self::JsonSchema(json_schema) => ResponseFormat::JsonSchema {
                json_schema: json_schema.clone(),
            },
        }
    }
}

/// `input`: a string or items.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ResponsesInput {
    /// One user message.
    Text(String),
    /// Messages and function-call items.
    Items(Vec<InputItem>),
}

impl Default for ResponsesInput {
    fn default() -> Self {
        Self::Text(String::new())
    }
}

/// One input item. Only the fields of its `type` are set; an item without `type` is a message.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct InputItem {
    /// `message` (the default), `function_call` or `function_call_output`.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// Role of a message: `user`, `assistant`, `system` or `developer`.
    #[serde(default)]
    pub role: Option<String>,
    /// Content of a message: a string or `input_text`/`output_text` parts.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// The call id of a function call or of its output.
    #[serde(default)]
    pub call_id: Option<String>,
    /// The function of a function call.
    #[serde(default)]
    pub name: Option<String>,
    /// The JSON arguments of a function call.
    #[serde(default)]
    pub arguments: Option<String>,
    /// The result of a function call.
    #[serde(default)]
    pub output: Option<Value>,
}

/// A function tool of the Responses API (flat, unlike chat's `{type, function: {...}}`);
/// serialized as the response object echoes it.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
pub struct ResponsesTool {
    /// `function`; other tool types are refused.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function name.
    #[serde(default)]
    pub name: Option<String>,
    /// What it does.
    #[serde(default)]
    pub description: Option<String>,
    /// JSON schema of its arguments.
    #[serde(default)]
    pub parameters: Option<Value>,
    /// Whether the arguments must follow the schema exactly.
    #[serde(default)]
    pub strict: Option<bool>,
}

impl ResponsesRequest {
    /// Whether the response streams.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The most `function_call` items the response may hold (`max_tool_calls`), if limited;
    /// call after [`Self::to_chat`], which rejects a negative one.
    pub fn max_tool_calls(&self) -> Option<u32> {
        options::max_tool_calls(self.max_tool_calls).ok().flatten()
    }

    /// The equivalent chat request.
    pub fn to_chat(&self) -> Result<ChatCompletionRequest, LlmError> {
        if self.previous_response_id.is_some() {
            return Err(invalid(
                "previous_response_id",
                "previous_response_id is not supported: this server keeps no response state; send the whole conversation as input",
            ));
        }
        if self.conversation.as_ref().is_some_and(|c| !c.is_null()) {
            return Err(invalid(
                "conversation",
                "conversation is not supported: this server keeps no conversation state; send the whole conversation as input",
            ));
        }
        if self.background == Some(true) {
            return Err(LlmError::Unsupported(
                "'background' responses are not supported: this server keeps no response state to poll".to_owned(),
            ));
        }
        if self.prompt.as_ref().is_some_and(|p| !p.is_null()) {
            return Err(LlmError::Unsupported(
                "'prompt' (a stored prompt template) is not supported; send the instructions and input themselves".to_owned(),
            ));
        }
        options::check_truncation(self.truncation.as_deref())?;
        options::max_tool_calls(self.max_tool_calls)?;
        let is_logprobs = options::wants_logprobs(self.include.as_deref(), self.top_logprobs)?;
        if let Some(n) = self.max_output_tokens.filter(|n| *n < 1) {
            return Err(invalid(
                "max_output_tokens",
                format!("max_output_tokens must be at least 1, got {n}"),
            ));
        }
        let mut messages = Vec::new();
        if let Some(instructions) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            messages.push(ChatMessage::new("system", instructions.as_str()));
        }
        match &self.input {
            ResponsesInput::Text(text) => messages.push(ChatMessage::new("user", text.as_str())),
            ResponsesInput::Items(items) => {
                for (index, item) in items.iter().enumerate() {
                    push_item(&mut messages, index, item)?;
                }
            }
        }
        if messages.iter().all(|m| m.role == "system") {
            return Err(invalid("input", "input must hold at least one message"));
        }
        let (tools, tool_choice) =
            tools::chat_tools_and_choice(self.tools.as_deref(), self.tool_choice.as_ref())?;
        Ok(ChatCompletionRequest {
            model: self.model.clone(),
            messages,
            max_tokens: self.max_output_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            stream: self.stream,
            logprobs: is_logprobs.then_some(true),
            top_logprobs: self.top_logprobs,
            user: self.user.clone(),
            nvext: self.nvext.clone(),
            tools,
            tool_choice,
            parallel_tool_calls: self.parallel_tool_calls,
            reasoning_effort: self
                .reasoning
                .as_ref()
                .and_then(|reasoning| reasoning.effort.clone()),
            response_format: self
                .text
                .as_ref()
                .and_then(|text| text.format.as_ref())
                .map(ResponsesTextFormat::response_format),
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

fn push_item(
    messages: &mut Vec<ChatMessage>,
    index: usize,
    item: &InputItem,
) -> Result<(), LlmError> {
    match item.kind.as_deref().unwrap_or("message") {
        "message" => {
            let role = item.role.as_deref().ok_or_else(|| {
                invalid("input", format!("input[{index}]: a message needs a role"))
            })?;
            if !matches!(role, "user" | "assistant" | "system" | "developer") {
                return Err(invalid(
                    "input",
                    format!("input[{index}].role: unknown role {role:?}"),
                ));
            }
            messages.push(ChatMessage {
                role: role.to_string(),
                content: item.content.clone(),
                ..Default::default()
            });
        }
        "function_call" => {
            let call = ToolCall {
                id: item.call_id.clone().unwrap_or_default(),
                kind: "function".into(),
                function: FunctionCall {
                    name: item.name.clone().unwrap_or_default(),
                    arguments: item.arguments.clone().unwrap_or_else(|| "{}".into()),
                },
            };
            // Consecutive calls belong to one assistant turn.
            match messages.last_mut() {
                Some(last) if last.role == "assistant" && last.tool_calls.is_some() => {
                    last.tool_calls.get_or_insert_with(Vec::new).push(call);
                }
                _ => messages.push(ChatMessage {
                    role: "assistant".into(),
                    tool_calls: Some(vec![call]),
                    ..Default::default()
                }),
            }
        }
        // An earlier turn's reasoning, sent back by agents that replay the whole output: not
        // rendered again, as reasoning models' chat templates drop earlier turns' thinking.
        "reasoning" => {}
        "function_call_output" => {
            let output = match &item.output {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
            };
            messages.push(ChatMessage {
                role: "tool".into(),
                content: Some(MessageContent::Text(output)),
                tool_call_id: item.call_id.clone(),
                ..Default::default()
            });
        }
        other => {
            return Err(LlmError::unhandled_kind(
                other,
                &[
                    "item_reference",
                    "file_search_call",
                    "web_search_call",
                    "computer_call",
                    "computer_call_output",
                    "image_generation_call",
                    "code_interpreter_call",
                    "local_shell_call",
                    "local_shell_call_output",
                    "mcp_list_tools",
                    "mcp_approval_request",
                    "mcp_approval_response",
                    "mcp_call",
                    "custom_tool_call",
                    "custom_tool_call_output",
                ],
                "input",
                format!("input[{index}]: item type '{other}' is not supported"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

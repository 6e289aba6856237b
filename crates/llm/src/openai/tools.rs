//! Tool definitions, tool calls and response formats of chat requests and responses.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A tool the model may call: `{"type": "function", "function": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatTool {
    /// Always `"function"` today.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The function's signature.
    pub function: FunctionDefinition,
}

/// A callable function described by a JSON schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionDefinition {
    /// The function name.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON schema of the arguments (key order preserved, templates print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Whether the arguments must follow the schema exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or a named function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    /// One of the modes.
    Mode(ToolChoiceMode),
    /// `{"type": "function", "function": {"name": ...}}`.
    Named(NamedToolChoice),
}

/// The string forms of `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoiceMode {
    /// Never call a tool.
    None,
    /// The model decides.
    Auto,
    /// The model must call at least one tool.
    Required,
}

/// A `tool_choice` that forces one function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NamedToolChoice {
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The function to call.
    pub function: FunctionName,
}

/// A function named by a [`NamedToolChoice`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionName {
    /// The function name.
    pub name: String,
}

/// A complete tool call, in an assistant message of a request or of a unary response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCall {
    /// The call id that the tool result refers to.
    #[serde(default)]
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FunctionCall {
    /// The function name.
    pub name: String,
    /// The arguments as a JSON string. Clients that send a JSON object are accepted too; it is
    /// kept as its JSON text.
    #[serde(default, deserialize_with = "string_or_json")]
    pub arguments: String,
}

/// A streamed fragment of a tool call: the first fragment of a call carries `id`, `type` and
/// `function.name`; the `arguments` fragments concatenate to the JSON arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Which tool call of the choice this fragment belongs to.
    pub index: u32,
    /// The call id, on the first fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"`, on the first fragment.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name and argument fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    /// The function name, on the first fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A fragment of the JSON arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// `response_format`: plain text, any JSON object, or JSON following a schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// No constraint.
    Text,
    /// Output must be a JSON object.
    JsonObject,
    /// Output must validate against `json_schema.schema`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// The `json_schema` of a [`ResponseFormat::JsonSchema`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JsonSchemaFormat {
    /// Schema name.
    pub name: String,
    /// What the schema is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Whether the output must follow the schema exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

fn function_type() -> String {
    "function".to_owned()
}

fn string_or_json<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::String(s) => Ok(s),
        Value::Null => Ok(String::new()),
        other => Ok(other.to_string()),
    }
}

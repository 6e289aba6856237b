//! Responses `tools` and `tool_choice` as chat tools and a chat tool choice. Only function tools
//! are served: a hosted tool type (web search, file search, MCP, ...) answers 501 naming it, as a
//! tool and as a tool choice alike. `allowed_tools` that names only function tools keeps just
//! those in the request's tools, so the prompt renders and the model may call only them.

use serde_json::{Map, Value};

use super::{ResponsesTool, invalid};
use crate::error::LlmError;
use crate::openai::{
    ChatTool, FunctionDefinition, FunctionName, NamedToolChoice, ToolChoice, ToolChoiceMode,
};

/// Tool types of the Responses API that kvmesh does not serve (501 rather than 400).
const HOSTED_TOOL_TYPES: &[&str] = &[
    "file_search",
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "computer_use",
    "computer_use_preview",
    "mcp",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "apply_patch",
    "custom",
];

/// The chat tools and tool choice of a Responses request's `tools` and `tool_choice`.
pub(super) fn chat_tools_and_choice(
    tools: Option<&[ResponsesTool]>,
    choice: Option<&Value>,
) -> Result<(Option<Vec<ChatTool>>, Option<ToolChoice>), LlmError> {
    let mut tools = tools.map(chat_tools).transpose()?;
    let choice = match choice {
        None => None,
        Some(Value::Object(object)) if kind_of(object) == Some("allowed_tools") => {
            let (mode, allowed) = allowed_tools(object)?;
            let offered = tools.get_or_insert_with(Vec::new);
            if let Some(missing) = allowed
                .iter()
                .find(|name| !offered.iter().any(|tool| &tool.function.name == *name))
            {
                return Err(invalid(
                    "tool_choice",
                    format!("tool_choice.tools: no function tool named '{missing}' in tools"),
                ));
            }
            offered.retain(|tool| allowed.contains(&tool.function.name.as_str()));
            Some(ToolChoice::Mode(mode))
        }
        Some(other) => Some(tool_choice(other)?),
    };
    Ok((tools, choice))
}

fn kind_of(object: &Map<String, Value>) -> Option<&str> {
    object.get("type").and_then(Value::as_str)
}

fn not_a_function(kind: &str, param: &'static str, at: &str) -> LlmError {
    LlmError::unhandled_kind(
        kind,
        HOSTED_TOOL_TYPES,
        param,
        format!("{at}: tool type '{kind}' is not supported; only function tools"),
    )
}

fn chat_tools(tools: &[ResponsesTool]) -> Result<Vec<ChatTool>, LlmError> {
    tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            if tool.kind != "function" {
                return Err(not_a_function(
                    &tool.kind,
                    "tools",
                    &format!("tools[{index}]"),
                ));
            }
            let name = tool
                .name
                .clone()
                .ok_or_else(|| invalid("tools", format!("tools[{index}]: name is required")))?;
            Ok(ChatTool {
                kind: "function".into(),
                function: FunctionDefinition {
                    name,
                    description: tool.description.clone(),
                    parameters: tool.parameters.clone(),
                    strict: tool.strict,
                },
            })
        })
        .collect()
}

/// `{type: "allowed_tools", mode, tools}`: the mode (`auto` by default, or `required`) and the
/// names of the function tools it allows.
fn allowed_tools(object: &Map<String, Value>) -> Result<(ToolChoiceMode, Vec<&str>), LlmError> {
    let mode = match object.get("mode") {
        None | Some(Value::Null) => ToolChoiceMode::Auto,
        Some(Value::String(mode)) if mode == "auto" => ToolChoiceMode::Auto,
        Some(Value::String(mode)) if mode == "required" => ToolChoiceMode::Required,
        Some(other) => {
            return Err(invalid(
                "tool_choice",
                format!("tool_choice.mode must be auto or required, got {other}"),
            ));
        }
    };
    let Some(Value::Array(tools)) = object.get("tools") else {
        return Err(invalid(
            "tool_choice",
            "tool_choice.tools must be a list of tools",
        ));
    };
    let names = tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            let at = format!("tool_choice.tools[{index}]");
            let tool = tool
                .as_object()
                .ok_or_else(|| invalid("tool_choice", format!("{at} must be an object")))?;
            match kind_of(tool) {
                Some("function") => tool
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("tool_choice", format!("{at}: name is required"))),
                Some(kind) => Err(not_a_function(kind, "tool_choice", &at)),
                None => Err(invalid("tool_choice", format!("{at}: type is required"))),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok((mode, names))
}

/// A mode (`none`, `auto`, `required`) or `{type: "function", name}`; a hosted tool's type is a
/// 501 naming it.
fn tool_choice(value: &Value) -> Result<ToolChoice, LlmError> {
    match value {
        Value::String(mode) => match mode.as_str() {
            "none" => Ok(ToolChoice::Mode(ToolChoiceMode::None)),
            "auto" => Ok(ToolChoice::Mode(ToolChoiceMode::Auto)),
            "required" => Ok(ToolChoice::Mode(ToolChoiceMode::Required)),
            other => Err(invalid(
                "tool_choice",
                format!("unknown tool_choice {other:?}"),
            )),
        },
        Value::Object(choice) => match kind_of(choice) {
            None | Some("function") => match choice.get("name").and_then(Value::as_str) {
                Some(name) => Ok(ToolChoice::Named(NamedToolChoice {
                    kind: "function".into(),
                    function: FunctionName {
                        name: name.to_string(),
                    },
                })),
                None => Err(invalid("tool_choice", "tool_choice object needs a name")),
            },
            Some(kind) => Err(not_a_function(kind, "tool_choice", "tool_choice")),
        },
        _ => Err(invalid(
            "tool_choice",
            "tool_choice must be a string or an object",
        )),
    }
}

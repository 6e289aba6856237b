//! Tool calls in a model's output text: the syntaxes models write them in (docs/tool-calls.md),
//! read back into calls (whole, or streamed through [`ToolCallJail`]) and written (the mock
//! engine emits calls in the syntax its model card names).
//!
//! Each syntax marks where calls begin. Text outside the calls is the message content; a region
//! that does not parse as calls stays content, so no output is lost.

mod jail;
mod pythonic;
pub(crate) mod scan;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

pub use self::jail::{JailEvent, ToolCallJail};

/// One call read from (or written into) the output: the function name and its arguments as
/// compact JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function name.
    pub name: String,
    /// The arguments, a JSON object as text.
    pub arguments: String,
}

/// The tool-call syntaxes kvmesh reads, by the parser names of the model card
/// (`tool_call_parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes, Qwen).
    Hermes,
    /// `<|python_tag|>{"name": …, "parameters": {…}}` or a bare JSON object opening the output,
    /// several separated by `;` (Llama 3.1+).
    Llama3Json,
    /// `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, or `[TOOL_CALLS]name[ARGS]{…}`
    /// (Mistral).
    Mistral,
    /// `[name(key=value, …), …]` with Python literals, opening the output (Llama 4, Llama 3.2).
    Pythonic,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name` then the JSON arguments
    /// in a json code fence, `<｜tool▁call▁end｜><｜tool▁calls▁end｜>` (DeepSeek V3).
    DeepseekV3,
}

/// Where a region of calls lies in a text: it starts at `start` and, once complete, ends at
/// `end` (exclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Region {
    pub start: usize,
    pub end: Option<usize>,
}

const HERMES_START: &str = "<tool_call>";
const HERMES_END: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_START: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const DEEPSEEK_START: &str = "<｜tool▁calls▁begin｜>";
const DEEPSEEK_END: &str = "<｜tool▁calls▁end｜>";
const DEEPSEEK_CALL_START: &str = "<｜tool▁call▁begin｜>";
const DEEPSEEK_CALL_END: &str = "<｜tool▁call▁end｜>";
const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";

impl ToolCallFormat {
    /// Every parser name, for error messages and docs.
    pub const NAMES: [&'static str; 5] = [
        "hermes",
        "llama3_json",
        "mistral",
        "pythonic",
        "deepseek_v3",
    ];

    /// The format a parser name selects.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "hermes" => Self::Hermes,
            "llama3_json" => Self::Llama3Json,
            "mistral" => Self::Mistral,
            "pythonic" => Self::Pythonic,
            "deepseek_v3" => Self::DeepseekV3,
            _ => return None,
        })
    }

    /// The parser name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::Pythonic => "pythonic",
            Self::DeepseekV3 => "deepseek_v3",
        }
    }

    /// `calls` as the model writes them.
    pub fn write(self, calls: &[ParsedCall]) -> String {
        let object = |call: &ParsedCall, key: &str| {
            let arguments: Value =
                serde_json::from_str(&call.arguments).unwrap_or(Value::Object(Map::new()));
            let mut object = Map::new();
            object.insert("name".into(), Value::String(call.name.clone()));
            object.insert(key.into(), arguments);
            Value::Object(object)
        };
        match self {
            Self::Hermes => calls
                .iter()
                .map(|call| {
                    format!(
                        "{HERMES_START}\n{}\n{HERMES_END}",
                        object(call, "arguments")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Self::Llama3Json => calls
                .iter()
                .map(|call| object(call, "parameters").to_string())
                .collect::<Vec<_>>()
                .join("; "),
            Self::Mistral => {
                let list: Vec<Value> = calls.iter().map(|call| object(call, "arguments")).collect();
                format!("{MISTRAL_START}{}", Value::Array(list))
            }
            Self::Pythonic => pythonic::write(calls),
            Self::DeepseekV3 => {
                let mut text = DEEPSEEK_START.to_owned();
                for call in calls {
                    text.push_str(&format!(
                        "{DEEPSEEK_CALL_START}function{DEEPSEEK_SEP}{}\n```json\n{}\n```{DEEPSEEK_CALL_END}",
                        call.name, call.arguments
                    ));
                }
                text.push_str(DEEPSEEK_END);
                text
            }
        }
    }

    /// The first region of calls in `text`, if one starts there. `at_output_start` says that
    /// nothing but whitespace came before `text`, where the formats without a marker (a bare
    /// JSON object, a Python list) may begin.
    pub(crate) fn find_region(self, text: &str, at_output_start: bool) -> Option<Region> {
        match self {
            Self::Hermes => {
                let start = text.find(HERMES_START)?;
                let end = text[start..]
                    .find(HERMES_END)
                    .map(|at| start + at + HERMES_END.len());
                Some(Region { start, end })
            }
            Self::DeepseekV3 => {
                let start = text.find(DEEPSEEK_START)?;
                let end = text[start..]
                    .find(DEEPSEEK_END)
                    .map(|at| start + at + DEEPSEEK_END.len());
                Some(Region { start, end })
            }
            Self::Mistral => {
                let start = text.find(MISTRAL_START)?;
                Some(Region {
                    start,
                    end: mistral_end(text, start),
                })
            }
            Self::Llama3Json => {
                let start = match text.find(PYTHON_TAG) {
                    Some(at) => at,
                    None if at_output_start => {
                        let at = scan::leading_space(text);
                        (text[at..].starts_with('{')).then_some(at)?
                    }
                    None => return None,
                };
                Some(Region {
                    start,
                    end: llama_end(text, start),
                })
            }
            Self::Pythonic => {
                if !at_output_start {
                    return None;
                }
                let start = scan::leading_space(text);
                pythonic::is_call_list_start(&text[start..]).then(|| Region {
                    start,
                    end: scan::balanced_end(text, start, true),
                })
            }
        }
    }

    /// How many bytes at the end of `text` might begin a region once more text arrives, so a
    /// stream holds them back instead of sending a half-written marker as content.
    pub(crate) fn held_suffix(self, text: &str, at_output_start: bool) -> usize {
        match self {
            Self::Hermes => scan::marker_prefix_suffix(text, &[HERMES_START]),
            Self::DeepseekV3 => scan::marker_prefix_suffix(text, &[DEEPSEEK_START]),
            Self::Mistral => scan::marker_prefix_suffix(text, &[MISTRAL_START]),
            Self::Llama3Json => {
                if at_output_start && text.trim().is_empty() {
                    text.len()
                } else {
                    scan::marker_prefix_suffix(text, &[PYTHON_TAG])
                }
            }
            Self::Pythonic => {
                let start = scan::leading_space(text);
                if at_output_start && pythonic::may_become_call_list(&text[start..]) {
                    text.len()
                } else {
                    0
                }
            }
        }
    }

    /// The calls a complete region holds, or `None` when it does not parse.
    pub(crate) fn parse_region(self, region: &str) -> Option<Vec<ParsedCall>> {
        let calls = match self {
            Self::Hermes => {
                let inner = region
                    .strip_prefix(HERMES_START)?
                    .strip_suffix(HERMES_END)?;
                vec![json_call(inner.trim())?]
            }
            Self::Llama3Json => {
                let mut rest = region.strip_prefix(PYTHON_TAG).unwrap_or(region).trim();
                let mut calls = Vec::new();
                while !rest.is_empty() {
                    let end = scan::balanced_end(rest, 0, false)?;
                    calls.push(json_call(&rest[..end])?);
                    rest = rest[end..].trim_start();
                    rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
                }
                calls
            }
            Self::Mistral => {
                let mut calls = Vec::new();
                for part in region.split(MISTRAL_START).filter(|p| !p.trim().is_empty()) {
                    let part = part.trim();
                    if part.starts_with('[') {
                        let Value::Array(items) = serde_json::from_str(part).ok()? else {
                            return None;
                        };
                        for item in items {
                            calls.push(call_from_value(item)?);
                        }
                    } else {
                        let (name, arguments) = part.split_once(MISTRAL_ARGS)?;
                        let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
                        calls.push(ParsedCall {
                            name: name.trim().to_owned(),
                            arguments: arguments_text(arguments)?,
                        });
                    }
                }
                calls
            }
            Self::Pythonic => pythonic::parse(region)?,
            Self::DeepseekV3 => {
                let inner = region
                    .strip_prefix(DEEPSEEK_START)?
                    .strip_suffix(DEEPSEEK_END)?;
                let mut calls = Vec::new();
                for part in inner.split(DEEPSEEK_CALL_START).skip(1) {
                    let part = part.trim_end().strip_suffix(DEEPSEEK_CALL_END)?;
                    let (head, tail) = part.split_once(DEEPSEEK_SEP)?;
                    let (name, arguments) = if head.trim() == "function" {
                        let (name, fenced) = tail.split_once('\n')?;
                        let body = fenced.trim().strip_prefix("```json")?.strip_suffix("```")?;
                        (name.trim(), body.trim())
                    } else {
                        (head.trim(), tail.trim())
                    };
                    let arguments: Value = serde_json::from_str(arguments).ok()?;
                    calls.push(ParsedCall {
                        name: name.to_owned(),
                        arguments: arguments_text(arguments)?,
                    });
                }
                calls
            }
        };
        (!calls.is_empty() && calls.iter().all(|call| !call.name.is_empty())).then_some(calls)
    }
}

/// Reads a whole output: its content (the text outside the calls) and its calls.
pub fn parse_complete(format: ToolCallFormat, text: &str) -> (String, Vec<ParsedCall>) {
    let mut jail = ToolCallJail::new(format);
    let mut events = jail.push(text);
    events.extend(jail.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for event in events {
        match event {
            JailEvent::Content(text) => content.push_str(&text),
            JailEvent::Call(call) => calls.push(call),
        }
    }
    (content, calls)
}

fn json_call(text: &str) -> Option<ParsedCall> {
    call_from_value(serde_json::from_str(text).ok()?)
}

fn call_from_value(value: Value) -> Option<ParsedCall> {
    let Value::Object(mut object) = value else {
        return None;
    };
    let Some(Value::String(name)) = object.remove("name") else {
        return None;
    };
    let arguments = object
        .remove("arguments")
        .or_else(|| object.remove("parameters"))
        .unwrap_or(Value::Object(Map::new()));
    Some(ParsedCall {
        name,
        arguments: arguments_text(arguments)?,
    })
}

/// Arguments as compact JSON object text; a string holding a JSON object is read as one.
fn arguments_text(arguments: Value) -> Option<String> {
    match arguments {
        Value::Object(_) => Some(arguments.to_string()),
        Value::String(text) => match serde_json::from_str::<Value>(&text).ok()? {
            object @ Value::Object(_) => Some(object.to_string()),
            _ => None,
        },
        _ => None,
    }
}

fn mistral_end(text: &str, start: usize) -> Option<usize> {
    let mut at = start;
    let mut end = None;
    // One or more `[TOOL_CALLS]` sections, each a JSON list or `name[ARGS]{…}`.
    while text[at..].starts_with(MISTRAL_START) {
        let body = at + MISTRAL_START.len();
        let open = body + scan::leading_space(&text[body..]);
        let close = if text[open..].starts_with('[') {
            scan::balanced_end(text, open, false)?
        } else {
            let args = open + text[open..].find(MISTRAL_ARGS)?;
            let object = args + MISTRAL_ARGS.len();
            let object = object + scan::leading_space(&text[object..]);
            scan::balanced_end(text, object, false)?
        };
        end = Some(close);
        at = close + scan::leading_space(&text[close..]);
        if at == text.len() || MISTRAL_START.starts_with(&text[at..]) {
            // More sections may follow once more text arrives.
            return None;
        }
    }
    end
}

fn llama_end(text: &str, start: usize) -> Option<usize> {
    let mut at = start;
    if text[at..].starts_with(PYTHON_TAG) {
        at += PYTHON_TAG.len();
    }
    loop {
        at += scan::leading_space(&text[at..]);
        if at == text.len() {
            return None;
        }
        let end = scan::balanced_end(text, at, false)?;
        let next = end + scan::leading_space(&text[end..]);
        match text[next..].chars().next() {
            None => return None,
            Some(';') => at = next + 1,
            Some(_) => return Some(end),
        }
    }
}

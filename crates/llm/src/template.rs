//! Chat templates: Hugging Face Jinja templates rendered with minijinja, compiled once per model.
//!
//! The environment mirrors transformers' `apply_chat_template`: `trim_blocks` and
//! `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, a `tojson` that writes
//! what Python's `json.dumps` writes, Python string/dict/list methods (`.strip()`, `.items()`,
//! ...), and values printed the way Python prints them (`None`, `True`).

mod messages;
mod pyfmt;
mod strftime;

use std::fmt;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State, Value};
use serde_json::{Map, Value as JsonValue};

use crate::error::LlmError;
use crate::openai::{ChatCompletionRequest, ChatMessage, ChatTool, ToolChoice, ToolChoiceMode};
use pyfmt::JsonStyle;

/// Name of the template used when no other applies.
const DEFAULT_TEMPLATE: &str = "default";
/// Name of the template transformers picks when the request has tools.
const TOOL_USE_TEMPLATE: &str = "tool_use";

/// The special tokens a template may print, from `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token`.
    pub bos_token: Option<String>,
    /// `eos_token`.
    pub eos_token: Option<String>,
    /// `unk_token`.
    pub unk_token: Option<String>,
    /// `pad_token`.
    pub pad_token: Option<String>,
}

/// What one render needs besides the template.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatRenderInput<'a> {
    /// The conversation.
    pub messages: &'a [ChatMessage],
    /// Tool definitions (`tools` is `none` in the template when absent).
    pub tools: Option<&'a [ChatTool]>,
    /// Append the assistant header.
    pub add_generation_prompt: bool,
    /// Leave the last message open so the model continues it.
    pub continue_final_message: bool,
    /// `documents` for retrieval templates.
    pub documents: Option<&'a JsonValue>,
    /// The request's `reasoning_effort`, the template variable of that name (gpt-oss templates
    /// read it); a `reasoning_effort` in `template_kwargs` wins.
    pub reasoning_effort: Option<&'a str>,
    /// Extra template variables (`chat_template_kwargs`); they can override special tokens but
    /// not `messages`, `tools`, `documents` or `add_generation_prompt`.
    pub template_kwargs: Option<&'a Map<String, JsonValue>>,
}

/// A model's chat template(s), compiled once at load and shared by every request.
pub struct ChatTemplate {
    env: Environment<'static>,
    has_tool_use: bool,
    special_tokens: Vec<(&'static str, String)>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("has_tool_use", &self.has_tool_use)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles a single template.
    pub fn new(source: &str, special_tokens: SpecialTokens) -> Result<Self, LlmError> {
        Self::with_named(
            [(DEFAULT_TEMPLATE.to_owned(), source.to_owned())],
            special_tokens,
        )
    }

    /// Compiles named templates (`tokenizer_config.json`'s list form). `default` is used unless
    /// the request has tools and a `tool_use` template exists; without `default` the first one
    /// is the default.
    pub fn with_named<I>(templates: I, special_tokens: SpecialTokens) -> Result<Self, LlmError>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let templates: Vec<(String, String)> = templates.into_iter().collect();
        let Some(first) = templates.first() else {
            return Err(LlmError::TemplateSyntax(
                "no chat template given".to_owned(),
            ));
        };
        let has_default = templates.iter().any(|(name, _)| name == DEFAULT_TEMPLATE);
        let first_name = first.0.clone();
        let mut env = new_environment();
        let mut has_tool_use = false;
        for (name, source) in templates {
            let source = messages::rewrite_generation_tags(&source).into_owned();
            let registered = if !has_default && name == first_name {
                DEFAULT_TEMPLATE.to_owned()
            } else {
                name
            };
            has_tool_use |= registered == TOOL_USE_TEMPLATE;
            env.add_template_owned(registered.clone(), source)
                .map_err(|err| LlmError::TemplateSyntax(format!("{registered}: {err:#}")))?;
        }
        let SpecialTokens {
            bos_token,
            eos_token,
            unk_token,
            pad_token,
        } = special_tokens;
        let special_tokens = [
            ("bos_token", bos_token),
            ("eos_token", eos_token),
            ("unk_token", unk_token),
            ("pad_token", pad_token),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.map(|value| (name, value)))
        .collect();
        Ok(Self {
            env,
            has_tool_use,
            special_tokens,
        })
    }

    /// Renders the prompt text of a chat request, tools included.
    pub fn render_request(&self, request: &ChatCompletionRequest) -> Result<String, LlmError> {
        self.render_request_with(request, false)
    }

    /// Renders the prompt text of a chat request; with `exclude_tools_when_none` a request whose
    /// `tool_choice` is `none` is rendered without its tools, so the model is not prompted to
    /// write calls nobody will read.
    pub fn render_request_with(
        &self,
        request: &ChatCompletionRequest,
        exclude_tools_when_none: bool,
    ) -> Result<String, LlmError> {
        let continue_final_message = request.continue_final_message.unwrap_or(false);
        let choice_is_none = matches!(
            request.tool_choice,
            Some(ToolChoice::Mode(ToolChoiceMode::None))
        );
        self.render(&ChatRenderInput {
            messages: &request.messages,
            tools: request
                .tools
                .as_deref()
                .filter(|_| !(exclude_tools_when_none && choice_is_none)),
            add_generation_prompt: request.add_generation_prompt() && !continue_final_message,
            continue_final_message,
            documents: request.documents.as_ref(),
            reasoning_effort: request.reasoning_effort.as_deref(),
            template_kwargs: request.chat_template_kwargs.as_ref(),
        })
    }

    /// Renders a prompt. `raise_exception` in the template becomes
    /// [`LlmError::TemplateException`] with the template's message; other failures on these
    /// messages are [`LlmError::TemplateRender`]; both are client errors.
    pub fn render(&self, input: &ChatRenderInput<'_>) -> Result<String, LlmError> {
        let has_tools = input.tools.is_some_and(|tools| !tools.is_empty());
        let name = if has_tools && self.has_tool_use {
            TOOL_USE_TEMPLATE
        } else {
            DEFAULT_TEMPLATE
        };
        let template = self
            .env
            .get_template(name)
            .map_err(|err| LlmError::TemplateSyntax(err.to_string()))?;

        let mut context: Vec<(&str, Value)> = Vec::with_capacity(8);
        for (name, value) in &self.special_tokens {
            context.push((name, Value::from(value.as_str())));
        }
        if let Some(effort) = input.reasoning_effort {
            context.push(("reasoning_effort", Value::from(effort)));
        }
        if let Some(kwargs) = input.template_kwargs {
            for (name, value) in kwargs {
                context.push((name, Value::from_serialize(value)));
            }
        }
        context.push(("messages", messages::template_messages(input.messages)?));
        context.push((
            "tools",
            input.tools.map_or(Value::from(()), Value::from_serialize),
        ));
        context.push((
            "documents",
            input
                .documents
                .map_or(Value::from(()), Value::from_serialize),
        ));
        context.push((
            "add_generation_prompt",
            Value::from(input.add_generation_prompt),
        ));
        let context: Value = context.into_iter().collect();

        let rendered = template.render(context).map_err(render_error)?;
        if !input.continue_final_message {
            return Ok(rendered);
        }
        let last = input
            .messages
            .last()
            .ok_or_else(|| LlmError::invalid("messages", "'messages' must not be empty"))?;
        cut_after_final_message(rendered, &last.text()?)
    }
}

fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: String| {
        strftime::strftime_now(&format)
    });
    env.add_filter("tojson", tojson);
    env
}

/// Marks an error raised by the template itself, so it can be told apart from engine errors.
#[derive(Debug)]
struct RaisedException(String);

impl fmt::Display for RaisedException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

fn render_error(err: Error) -> LlmError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(current) = source {
        if let Some(raised) = current.downcast_ref::<RaisedException>() {
            return LlmError::TemplateException(raised.0.clone());
        }
        source = current.source();
    }
    LlmError::TemplateRender(err.to_string())
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.kind() {
            ValueKind::Number => {
                let width = usize::try_from(v.as_i64().unwrap_or(0)).unwrap_or(0);
                Some(" ".repeat(width))
            }
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        },
    };
    let mut style = JsonStyle::new(indent);
    if let Some(ensure_ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        style.ensure_ascii = ensure_ascii;
    }
    if let Some(sort_keys) = kwargs.get::<Option<bool>>("sort_keys")? {
        style.sort_keys = sort_keys;
    }
    let separators = kwargs.get::<Option<Value>>("separators")?;
    if let Some(separators) = separators.filter(|s| !s.is_none()) {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        let [item, key] = parts.as_slice() else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ));
        };
        style.item_separator = item.as_str().unwrap_or(",").to_owned();
        style.key_separator = key.as_str().unwrap_or(":").to_owned();
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(pyfmt::json_dumps(value, &style)?))
}

fn python_formatter(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    let written = if let Some(s) = value.as_str() {
        out.write_str(s)
    } else {
        let mut text = String::new();
        pyfmt::write_py_str(&mut text, value);
        out.write_str(&text)
    };
    written.map_err(|_| Error::new(ErrorKind::WriteFailure, "formatting failed"))
}

/// transformers' `continue_final_message`: cut the rendered prompt right after the final
/// message's content, so the end-of-turn marker the template added is dropped.
fn cut_after_final_message(mut rendered: String, content: &str) -> Result<String, LlmError> {
    let stripped = content.trim();
    let Some(start) = rendered.rfind(stripped) else {
        return Err(LlmError::invalid(
            "continue_final_message",
            "the final message does not appear in the rendered chat",
        ));
    };
    let lstripped = content.trim_start();
    let end = if rendered[start..].starts_with(lstripped) {
        start + lstripped.len()
    } else {
        start + stripped.len()
    };
    rendered.truncate(end);
    Ok(rendered)
}

#[cfg(test)]
mod tests;

//! The chat output parsers, one stage over each choice's text: the model's reasoning parser
//! splits its thinking off into `reasoning` (docs/reasoning.md), then, when the request offers
//! tools and the model's card names a tool-call parser, the answer runs through a
//! [`ToolCallJail`] (docs/tool-calls.md), so text before a call streams at once, a half-written
//! marker never goes out as content, and each call goes out whole as a `tool_calls` delta. A
//! choice that called a tool finishes with `tool_calls`.

use std::collections::HashMap;

use futures::{Stream, StreamExt};
use kvmesh_llm::openai::{
    ChatCompletionRequest, ChatTool, FinishReason, FunctionCallDelta, ToolCallDelta, ToolChoice,
    ToolChoiceMode,
};
use kvmesh_llm::reasoning::{ReasoningFormat, ReasoningSplitter};
use kvmesh_llm::tool_calls::{JailEvent, ToolCallFormat, ToolCallJail};
use kvmesh_proto::v1::{ToolSpec, ToolsRequest};

use crate::error::FrontendError;
use crate::generate::TextDelta;

/// How a request's output is read for tool calls.
#[derive(Debug, Clone, Copy)]
pub struct ToolParsing {
    /// The syntax the model writes calls in.
    pub format: ToolCallFormat,
    /// Whether a choice may make several calls (`parallel_tool_calls`, default true); without it
    /// only the first call of a choice is kept.
    pub parallel: bool,
}

/// The request's tools for the worker contract, unless it offers none or `tool_choice` is
/// `none`.
pub fn tools_request(request: &ChatCompletionRequest) -> Option<ToolsRequest> {
    offered_tools_request(
        request.tools.as_deref().unwrap_or_default(),
        request.tool_choice.as_ref(),
        request.parallel_tool_calls,
    )
}

/// The worker contract's view of offered `tools` under `choice`, from a chat request or from a
/// processor's preprocessed request alike: none when no tool is offered or `choice` is `none`.
pub fn offered_tools_request(
    tools: &[ChatTool],
    choice: Option<&ToolChoice>,
    parallel_tool_calls: Option<bool>,
) -> Option<ToolsRequest> {
    if tools.is_empty() {
        return None;
    }
    let (choice, named_function) = match choice {
        None | Some(ToolChoice::Mode(ToolChoiceMode::Auto)) => ("auto", String::new()),
        Some(ToolChoice::Mode(ToolChoiceMode::None)) => return None,
        Some(ToolChoice::Mode(ToolChoiceMode::Required)) => ("required", String::new()),
        Some(ToolChoice::Named(named)) => ("named", named.function.name.clone()),
    };
    Some(ToolsRequest {
        tools: tools
            .iter()
            .map(|tool| ToolSpec {
                name: tool.function.name.clone(),
                parameters_json: tool
                    .function
                    .parameters
                    .as_ref()
                    .map(|schema| schema.to_string())
                    .unwrap_or_default(),
            })
            .collect(),
        choice: choice.to_owned(),
        named_function,
        parallel: parallel_tool_calls.unwrap_or(true),
    })
}

/// How to read the output for tool calls: only when the request offers tools (and
/// `tool_choice` is not `none`) and the model has a parser.
pub fn tool_parsing(
    request: &ChatCompletionRequest,
    format: Option<ToolCallFormat>,
) -> Option<ToolParsing> {
    tools_request(request)?;
    Some(ToolParsing {
        format: format?,
        parallel: request.parallel_tool_calls.unwrap_or(true),
    })
}

/// What the output stage reads out of a request's text.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutputParsing {
    /// The model's reasoning syntax.
    pub reasoning: Option<ReasoningFormat>,
    /// Tool calls, when the request offers tools and the model has a parser.
    pub tools: Option<ToolParsing>,
}

impl OutputParsing {
    /// Whether there is anything to read.
    pub fn is_active(&self) -> bool {
        self.reasoning.is_some() || self.tools.is_some()
    }
}

/// `deltas` with each choice's reasoning split off and its tool calls read out of its answer.
pub fn parse_output(
    deltas: impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static,
    parsing: OutputParsing,
    request_id: String,
) -> impl Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static {
    let mut choices: HashMap<u32, ChoiceOutput> = HashMap::new();
    deltas.map(move |delta| {
        let mut delta = delta?;
        let choice = choices
            .entry(delta.index)
            .or_insert_with(|| ChoiceOutput::new(&parsing));
        let finished = delta.finish_reason.is_some();
        if let Some(splitter) = &mut choice.reasoning {
            let mut split = splitter.push(&delta.text);
            if finished {
                let rest = splitter.finish();
                split.reasoning.push_str(&rest.reasoning);
                split.content.push_str(&rest.content);
            }
            delta.reasoning = split.reasoning;
            delta.text = split.content;
        }
        if let (Some(jail), Some(tools)) = (&mut choice.jail, parsing.tools) {
            let mut events = jail.push(&delta.text);
            if finished {
                events.extend(jail.finish());
            }
            delta.text.clear();
            for event in events {
                match event {
                    JailEvent::Content(text) => delta.text.push_str(&text),
                    JailEvent::Call(call) => {
                        if !tools.parallel && choice.num_calls > 0 {
                            continue;
                        }
                        delta.tool_calls.push(ToolCallDelta {
                            index: choice.num_calls,
                            id: Some(format!(
                                "call_{}_{}_{}",
                                request_id, delta.index, choice.num_calls
                            )),
                            kind: Some("function".into()),
                            function: Some(FunctionCallDelta {
                                name: Some(call.name),
                                arguments: Some(call.arguments),
                            }),
                        });
                        choice.num_calls += 1;
                    }
                }
            }
        }
        if choice.num_calls > 0 && delta.finish_reason == Some(FinishReason::Stop) {
            delta.finish_reason = Some(FinishReason::ToolCalls);
        }
        Ok(delta)
    })
}

struct ChoiceOutput {
    reasoning: Option<ReasoningSplitter>,
    jail: Option<ToolCallJail>,
    num_calls: u32,
}

impl ChoiceOutput {
    fn new(parsing: &OutputParsing) -> Self {
        Self {
            reasoning: parsing.reasoning.map(ReasoningSplitter::new),
            jail: parsing.tools.map(|tools| ToolCallJail::new(tools.format)),
            num_calls: 0,
        }
    }
}

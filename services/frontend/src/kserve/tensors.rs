//! The LLM mapping of the KServe edge (docs/kserve.md): a `ModelInferRequest`'s tensors and
//! parameters become a completions request, and text, finish reason and usage become output
//! tensors and response parameters, in the form the request used (raw contents for raw inputs,
//! typed contents for typed inputs).

use kvmesh_llm::openai::{CompletionRequest, Prompt, Stop};
use kvmesh_proto::inference::infer_parameter::ParameterChoice;
use kvmesh_proto::inference::model_infer_request::InferInputTensor;
use kvmesh_proto::inference::model_infer_response::InferOutputTensor;
use kvmesh_proto::inference::{
    InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse,
};

use kvmesh_routing::RoutingHints;

use crate::error::FrontendError;
use crate::generate::TokenUsage;

/// The prompt input.
pub const TEXT_INPUT: &str = "text_input";
/// The generated text output.
pub const TEXT_OUTPUT: &str = "text_output";
/// The finish reason output.
pub const FINISH_REASON: &str = "finish_reason";

/// What the inputs of one request say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmInputs {
    /// The prompt.
    pub text: String,
    /// `streaming` / `stream`: answer with one response per delta.
    pub streaming: bool,
    /// The inputs came as raw contents, so the outputs go out raw too.
    pub raw: bool,
}

/// Reads `text_input` and the optional `streaming` (or `stream`) from typed or raw contents.
pub fn decode_inputs(request: &ModelInferRequest) -> Result<LlmInputs, FrontendError> {
    let raw = !request.raw_input_contents.is_empty();
    if raw && request.raw_input_contents.len() != request.inputs.len() {
        return Err(invalid(format!(
            "raw_input_contents has {} entries for {} inputs; every input must be raw when any is",
            request.raw_input_contents.len(),
            request.inputs.len()
        )));
    }
    let mut text = None;
    let mut streaming = false;
    for (index, input) in request.inputs.iter().enumerate() {
        let typed = input.contents.as_ref().filter(|c| !is_empty(c));
        if raw && typed.is_some() {
            return Err(invalid(format!(
                "input '{}' has typed contents while the request sends raw contents; use one form",
                input.name
            )));
        }
        let raw_bytes = raw.then(|| request.raw_input_contents[index].as_slice());
        match input.name.as_str() {
            TEXT_INPUT => text = Some(text_value(input, typed, raw_bytes)?),
            "streaming" | "stream" => streaming = bool_value(input, typed, raw_bytes)?,
            other => {
                return Err(invalid(format!(
                    "Invalid input name '{other}': expected '{TEXT_INPUT}' and optionally 'streaming'"
                )));
            }
        }
    }
    let text = text.ok_or_else(|| invalid(format!("missing required input '{TEXT_INPUT}'")))?;
    Ok(LlmInputs {
        text,
        streaming,
        raw,
    })
}

fn text_value(
    input: &InferInputTensor,
    typed: Option<&InferTensorContents>,
    raw: Option<&[u8]>,
) -> Result<String, FrontendError> {
    check_datatype(input, "BYTES")?;
    check_single_element(input)?;
    let bytes = match (typed, raw) {
        (_, Some(raw)) => first_raw_bytes(raw)
            .ok_or_else(|| invalid(format!("input '{}': malformed raw BYTES", input.name)))?,
        (Some(typed), None) => typed
            .bytes_contents
            .first()
            .map(Vec::as_slice)
            .ok_or_else(|| invalid(format!("input '{}' has no bytes_contents", input.name)))?,
        (None, None) => return Err(invalid(format!("input '{}' has no contents", input.name))),
    };
    String::from_utf8(bytes.to_vec())
        .map_err(|_| invalid(format!("input '{}' is not valid UTF-8", input.name)))
}

fn bool_value(
    input: &InferInputTensor,
    typed: Option<&InferTensorContents>,
    raw: Option<&[u8]>,
) -> Result<bool, FrontendError> {
    check_datatype(input, "BOOL")?;
    check_single_element(input)?;
    match (typed, raw) {
        (_, Some(raw)) => raw
            .first()
            .map(|byte| *byte != 0)
            .ok_or_else(|| invalid(format!("input '{}': empty raw BOOL", input.name))),
        (Some(typed), None) => typed
            .bool_contents
            .first()
            .copied()
            .ok_or_else(|| invalid(format!("input '{}' has no bool_contents", input.name))),
        (None, None) => Err(invalid(format!("input '{}' has no contents", input.name))),
    }
}

fn check_datatype(input: &InferInputTensor, expected: &str) -> Result<(), FrontendError> {
    if input.datatype == expected {
        return Ok(());
    }
    Err(invalid(format!(
        "input '{}' has datatype '{}', expected '{expected}'",
        input.name, input.datatype
    )))
}

/// One element: shape `[1]` or `[1, 1]` (an empty shape is taken as one element too).
fn check_single_element(input: &InferInputTensor) -> Result<(), FrontendError> {
    if input.shape.iter().all(|dim| *dim == 1) && input.shape.len() <= 2 {
        return Ok(());
    }
    Err(invalid(format!(
        "input '{}' has shape {:?}, expected [1] or [1, 1]",
        input.name, input.shape
    )))
}

/// The first element of raw BYTES: a 4-byte little-endian length, then that many bytes.
fn first_raw_bytes(raw: &[u8]) -> Option<&[u8]> {
    let (length, rest) = raw.split_first_chunk::<4>()?;
    rest.get(..u32::from_le_bytes(*length) as usize)
}

fn is_empty(contents: &InferTensorContents) -> bool {
    contents.bool_contents.is_empty()
        && contents.int_contents.is_empty()
        && contents.int64_contents.is_empty()
        && contents.uint_contents.is_empty()
        && contents.uint64_contents.is_empty()
        && contents.fp32_contents.is_empty()
        && contents.fp64_contents.is_empty()
        && contents.bytes_contents.is_empty()
}

/// The completions request a KServe request with prompt `text` stands for: `{model, prompt, stream, user: id}` and
/// the sampling parameters kvmesh maps (other parameter keys are ignored, as KServe allows).
pub fn completion_request(
    request: &ModelInferRequest,
    text: String,
    streaming: bool,
) -> Result<CompletionRequest, FrontendError> {
    let mut completion = CompletionRequest {
        model: request.model_name.clone(),
        prompt: Prompt::Text(text),
        stream: Some(streaming),
        user: (!request.id.is_empty()).then(|| request.id.clone()),
        ..CompletionRequest::default()
    };
    for (key, value) in &request.parameters {
        let Some(value) = value.parameter_choice.as_ref() else {
            continue;
        };
        match key.as_str() {
            "max_tokens" => completion.max_tokens = Some(integer(key, value)?),
            "min_tokens" => completion.min_tokens = Some(integer(key, value)?),
            "top_k" => completion.top_k = Some(integer(key, value)?),
            "seed" => completion.seed = Some(integer(key, value)?),
            "temperature" => completion.temperature = Some(number(key, value)?),
            "top_p" => completion.top_p = Some(number(key, value)?),
            "frequency_penalty" => completion.frequency_penalty = Some(number(key, value)?),
            "presence_penalty" => completion.presence_penalty = Some(number(key, value)?),
            "ignore_eos" => match value {
                ParameterChoice::BoolParam(flag) => completion.ignore_eos = Some(*flag),
                _ => return Err(wrong_parameter(key, "a bool")),
            },
            "stop" => match value {
                ParameterChoice::StringParam(stop) => {
                    completion.stop = Some(Stop::One(stop.clone()))
                }
                _ => return Err(wrong_parameter(key, "a string")),
            },
            _ => {}
        }
    }
    Ok(completion)
}

/// Routing pins, priority and session from request parameters named like the HTTP edge's
/// headers (`x-dynamo-worker-instance-id`, `x-dynamo-request-priority`, …); integer and string
/// values are both accepted.
/// With `is_nvext_disabled` the pins and priority are ignored, as the headers are.
pub fn routing_hints(
    request: &ModelInferRequest,
    is_nvext_disabled: bool,
) -> Result<RoutingHints, FrontendError> {
    let values: Vec<(&str, String)> = request
        .parameters
        .iter()
        .filter(|(key, _)| key.starts_with("x-"))
        .filter_map(|(key, value)| {
            let text = match value.parameter_choice.as_ref()? {
                ParameterChoice::StringParam(text) => text.clone(),
                ParameterChoice::Int64Param(n) => n.to_string(),
                ParameterChoice::Uint64Param(n) => n.to_string(),
                ParameterChoice::BoolParam(_) | ParameterChoice::DoubleParam(_) => return None,
            };
            Some((key.as_str(), text))
        })
        .collect();
    let mut hints = RoutingHints::default();
    crate::hints::apply_headers(
        &mut hints,
        values.iter().map(|(key, text)| (*key, text.as_str())),
        is_nvext_disabled,
    )?;
    Ok(hints)
}

fn integer(key: &str, value: &ParameterChoice) -> Result<i64, FrontendError> {
    match value {
        ParameterChoice::Int64Param(n) => Ok(*n),
        ParameterChoice::Uint64Param(n) => {
            i64::try_from(*n).map_err(|_| wrong_parameter(key, "an integer in range"))
        }
        _ => Err(wrong_parameter(key, "an integer")),
    }
}

fn number(key: &str, value: &ParameterChoice) -> Result<f64, FrontendError> {
    match value {
        ParameterChoice::DoubleParam(x) => Ok(*x),
        ParameterChoice::Int64Param(n) => Ok(*n as f64),
        ParameterChoice::Uint64Param(n) => Ok(*n as f64),
        _ => Err(wrong_parameter(key, "a number")),
    }
}

fn wrong_parameter(key: &str, expected: &str) -> FrontendError {
    FrontendError::invalid(format!("parameter '{key}' must be {expected}"), Some(key))
}

fn invalid(message: String) -> FrontendError {
    FrontendError::invalid(message, None)
}

/// One response to request `id` of `model_name`: `text_output` and `finish_reason` (empty while streaming), usage parameters
/// when given, raw or typed contents as `raw` says.
pub fn response(
    model_name: &str,
    id: &str,
    text: &str,
    finish_reason: &str,
    usage: Option<TokenUsage>,
    raw: bool,
) -> ModelInferResponse {
    let mut response = ModelInferResponse {
        model_name: model_name.into(),
        model_version: "1".into(),
        id: id.into(),
        ..ModelInferResponse::default()
    };
    for (name, value) in [(TEXT_OUTPUT, text), (FINISH_REASON, finish_reason)] {
        let mut tensor = InferOutputTensor {
            name: name.into(),
            datatype: "BYTES".into(),
            shape: vec![1],
            ..InferOutputTensor::default()
        };
        if raw {
            let mut bytes = Vec::with_capacity(4 + value.len());
            bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
            bytes.extend_from_slice(value.as_bytes());
            response.raw_output_contents.push(bytes);
        } else {
            tensor.contents = Some(InferTensorContents {
                bytes_contents: vec![value.as_bytes().to_vec()],
                ..InferTensorContents::default()
            });
        }
        response.outputs.push(tensor);
    }
    if let Some(usage) = usage {
        for (key, count) in [
            ("prompt_tokens", usage.prompt_tokens),
            ("completion_tokens", usage.completion_tokens),
            ("cached_tokens", usage.cached_tokens),
        ] {
            response.parameters.insert(
                key.into(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::Int64Param(i64::from(count))),
                },
            );
        }
    }
    response
}

#[cfg(test)]
mod tests;

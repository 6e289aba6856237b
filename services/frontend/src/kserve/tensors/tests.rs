//! The LLM mapping: inputs in both forms, parameters, errors that name the input, outputs in the
//! request's form.

use std::collections::HashMap;

use super::*;
use kvmesh_core::ErrorCode;

fn raw_bytes(value: &str) -> Vec<u8> {
    let mut bytes = (value.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(value.as_bytes());
    bytes
}

fn input(name: &str, datatype: &str, contents: Option<InferTensorContents>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: vec![1],
        contents,
        ..InferInputTensor::default()
    }
}

fn raw_request(text: &str, streaming: Option<bool>) -> ModelInferRequest {
    let mut request = ModelInferRequest {
        model_name: "m".into(),
        id: "req-1".into(),
        inputs: vec![input(TEXT_INPUT, "BYTES", None)],
        raw_input_contents: vec![raw_bytes(text)],
        ..ModelInferRequest::default()
    };
    if let Some(flag) = streaming {
        request.inputs.push(input("streaming", "BOOL", None));
        request.raw_input_contents.push(vec![u8::from(flag)]);
    }
    request
}

fn typed_request(text: &str) -> ModelInferRequest {
    ModelInferRequest {
        model_name: "m".into(),
        inputs: vec![input(
            TEXT_INPUT,
            "BYTES",
            Some(InferTensorContents {
                bytes_contents: vec![text.as_bytes().to_vec()],
                ..InferTensorContents::default()
            }),
        )],
        ..ModelInferRequest::default()
    }
}

fn error_message(request: &ModelInferRequest) -> String {
    let error = decode_inputs(request).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
    error.to_string()
}

#[test]
fn raw_and_typed_inputs_decode_alike() {
    let raw = decode_inputs(&raw_request("héllo", Some(true))).unwrap();
    assert_eq!(
        raw,
        LlmInputs {
            text: "héllo".into(),
            streaming: true,
            raw: true
        }
    );
    let typed = decode_inputs(&typed_request("héllo")).unwrap();
    assert_eq!(
        (typed.text.as_str(), typed.streaming, typed.raw),
        ("héllo", false, false)
    );
}

#[test]
fn bad_inputs_are_invalid_arguments_that_name_the_input() {
    let mut request = raw_request("x", None);
    request.inputs[0].name = "prompt".into();
    assert!(error_message(&request).contains("Invalid input name 'prompt'"));

    let mut request = raw_request("x", None);
    request.inputs[0].datatype = "INT32".into();
    assert!(error_message(&request).contains("'text_input' has datatype 'INT32'"));

    let mut request = raw_request("x", Some(false));
    request.inputs[1].contents = Some(InferTensorContents {
        bool_contents: vec![true],
        ..InferTensorContents::default()
    });
    assert!(error_message(&request).contains("use one form"));

    let mut request = raw_request("x", None);
    request.raw_input_contents[0] = vec![9, 0, 0, 0, b'x'];
    assert!(error_message(&request).contains("malformed raw BYTES"));

    let mut request = raw_request("x", None);
    request.inputs[0].shape = vec![2];
    assert!(error_message(&request).contains("shape"));

    let request = ModelInferRequest::default();
    assert!(error_message(&request).contains("missing required input 'text_input'"));
}

#[test]
fn parameters_map_to_the_completions_request() {
    let mut request = raw_request("hi", None);
    let parameter = |choice| InferParameter {
        parameter_choice: Some(choice),
    };
    request.parameters = HashMap::from([
        (
            "max_tokens".into(),
            parameter(ParameterChoice::Int64Param(7)),
        ),
        (
            "temperature".into(),
            parameter(ParameterChoice::DoubleParam(0.5)),
        ),
        ("top_k".into(), parameter(ParameterChoice::Uint64Param(3))),
        (
            "ignore_eos".into(),
            parameter(ParameterChoice::BoolParam(true)),
        ),
        (
            "stop".into(),
            parameter(ParameterChoice::StringParam("\n".into())),
        ),
        ("top_p".into(), parameter(ParameterChoice::DoubleParam(0.9))),
        ("seed".into(), parameter(ParameterChoice::Int64Param(42))),
        (
            "min_tokens".into(),
            parameter(ParameterChoice::Int64Param(2)),
        ),
        (
            "frequency_penalty".into(),
            parameter(ParameterChoice::DoubleParam(0.25)),
        ),
        (
            "presence_penalty".into(),
            parameter(ParameterChoice::DoubleParam(-0.5)),
        ),
        (
            "unrelated".into(),
            parameter(ParameterChoice::BoolParam(true)),
        ),
    ]);
    let inputs = decode_inputs(&request).unwrap();
    let completion = completion_request(&request, inputs.text.clone(), inputs.streaming).unwrap();
    assert_eq!(completion.model, "m");
    assert_eq!(completion.prompt, Prompt::Text("hi".into()));
    assert_eq!(completion.max_tokens, Some(7));
    assert_eq!(completion.temperature, Some(0.5));
    assert_eq!(completion.top_k, Some(3));
    assert_eq!(completion.ignore_eos, Some(true));
    assert_eq!(completion.stop, Some(Stop::One("\n".into())));
    assert_eq!(completion.top_p, Some(0.9));
    assert_eq!(completion.seed, Some(42));
    assert_eq!(completion.min_tokens, Some(2));
    assert_eq!(completion.frequency_penalty, Some(0.25));
    assert_eq!(completion.presence_penalty, Some(-0.5));
    assert_eq!(completion.user.as_deref(), Some("req-1"));

    request.parameters = HashMap::from([(
        "max_tokens".into(),
        parameter(ParameterChoice::StringParam("7".into())),
    )]);
    let error = completion_request(&request, inputs.text.clone(), inputs.streaming).unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
    assert!(
        error
            .to_string()
            .contains("'max_tokens' must be an integer")
    );
}

#[test]
fn outputs_take_the_form_of_the_inputs() {
    let request = raw_request("hi", None);
    let usage = TokenUsage {
        prompt_tokens: 3,
        completion_tokens: 2,
        cached_tokens: 1,
    };
    let raw = response(
        &request.model_name,
        &request.id,
        "ok",
        "stop",
        Some(usage),
        true,
    );
    assert_eq!(
        (raw.id.as_str(), raw.model_version.as_str()),
        ("req-1", "1")
    );
    assert_eq!(
        raw.raw_output_contents,
        vec![raw_bytes("ok"), raw_bytes("stop")]
    );
    assert!(raw.outputs.iter().all(|output| output.contents.is_none()));
    assert_eq!(
        raw.parameters["completion_tokens"].parameter_choice,
        Some(ParameterChoice::Int64Param(2))
    );
    assert_eq!(
        raw.parameters["prompt_tokens"].parameter_choice,
        Some(ParameterChoice::Int64Param(3))
    );
    assert_eq!(
        raw.parameters["cached_tokens"].parameter_choice,
        Some(ParameterChoice::Int64Param(1))
    );
    let typed = response(&request.model_name, &request.id, "ok", "", None, false);
    assert!(typed.raw_output_contents.is_empty());
    let texts: Vec<_> = typed
        .outputs
        .iter()
        .map(|output| output.contents.as_ref().unwrap().bytes_contents[0].clone())
        .collect();
    assert_eq!(texts, vec![b"ok".to_vec(), b"".to_vec()]);
    assert!(typed.parameters.is_empty());
}

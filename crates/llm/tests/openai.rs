//! OpenAI wire shapes: parsing, validation and exact serialization.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::borrow::Cow;

use kvmesh_llm::openai::*;
use kvmesh_llm::{LlmError, LlmErrorCode, TokenStop};
use serde_json::json;

fn chat(body: serde_json::Value) -> ChatCompletionRequest {
    ChatCompletionRequest::from_json(body.to_string().as_bytes()).unwrap()
}

fn completion(body: serde_json::Value) -> CompletionRequest {
    CompletionRequest::from_json(body.to_string().as_bytes()).unwrap()
}

#[test]
fn chat_request_parses_every_field_and_ignores_unknown_ones() {
    let request = chat(json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi", "name": "bob"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
            {"role": "tool", "content": [{"type": "text", "text": "r"}], "tool_call_id": "c"}
        ],
        "max_tokens": 10, "max_completion_tokens": 20, "temperature": 0.5, "top_p": 0.9, "n": 2,
        "stream": true, "stream_options": {"include_usage": true}, "stop": ["a", 7],
        "seed": 3, "presence_penalty": 0.1, "frequency_penalty": -0.1, "logprobs": true,
        "top_logprobs": 5, "tool_choice": {"type": "function", "function": {"name": "f"}},
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
        "user": "u", "ignore_eos": true, "min_tokens": 2, "top_k": 40, "min_p": 0.05,
        "repetition_penalty": 1.1, "skip_special_tokens": false, "include_stop_str_in_output": true,
        "stop_token_ids": [9], "nvext": {"greed_sampling": true}, "some_future_field": {"x": 1}
    }));
    request.validate().unwrap();
    assert_eq!(request.effective_max_tokens(), Some(20));
    assert!(request.is_stream() && request.include_usage());
    assert_eq!(
        request.messages[1].tool_calls.as_ref().unwrap()[0]
            .function
            .arguments,
        r#"{"x":1}"#
    );
    assert_eq!(request.messages[2].text().unwrap(), "r");
    assert!(matches!(request.tool_choice, Some(ToolChoice::Named(_))));
    assert!(matches!(
        request.response_format,
        Some(ResponseFormat::JsonSchema { .. })
    ));
    assert_eq!(request.nvext, Some(json!({"greed_sampling": true})));

    let options = request.sampling_options();
    assert_eq!(options.max_tokens, Some(20));
    assert_eq!(options.n, 2);
    assert_eq!(options.stop, ["a"]);
    assert_eq!(options.stop_token_ids, [7, 9]);
    assert_eq!(options.top_k, Some(40));
    assert_eq!(options.logprobs, Some(5));
    assert!(
        options.ignore_eos && !options.skip_special_tokens && options.include_stop_str_in_output
    );
    let conditions = options.token_stop_conditions(&[2]);
    assert_eq!(conditions.check(2, 5), None, "ignore_eos");
    assert_eq!(conditions.check(7, 5), Some(TokenStop::StopToken(7)));
    assert_eq!(conditions.check(1, 20), Some(TokenStop::Length));
}

#[test]
fn defaults_are_openai_defaults() {
    let request =
        chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": "\n"}));
    let options = request.sampling_options();
    assert_eq!(options.n, 1);
    assert!(options.skip_special_tokens);
    assert_eq!(options.logprobs, None);
    assert_eq!(options.stop, ["\n"]);
    assert!(request.add_generation_prompt());
    assert!(!request.include_usage());
    let top_k_off =
        chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_k": -1}));
    assert_eq!(top_k_off.sampling_options().top_k, None);
}

#[test]
fn malformed_bodies_are_user_errors() {
    for body in [
        r#"{"model": "m", "messages": "hi"}"#,
        r#"{"model": "m"}"#,
        r#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#,
        "not json",
    ] {
        let err = ChatCompletionRequest::from_json(body.as_bytes()).unwrap_err();
        assert_eq!(err.code(), LlmErrorCode::InvalidArgument, "{body}");
    }
    let err = CompletionRequest::from_json(br#"{"model": "m", "prompt": {"a": 1}}"#).unwrap_err();
    assert!(err.is_user_error());
    let err = ChatCompletionRequest::from_json(
        br#"{"model": "m", "messages": [{"role": "user", "content": {"text": "x"}}]}"#,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("a string or a list of content parts"),
        "{err}"
    );
}

#[test]
fn escaped_and_plain_string_content_parse_alike() {
    let body = br#"{"model": "m", "messages": [{"role": "user", "content": "a\nb \u00e9"},
        {"role": "user", "content": "plain"}]}"#;
    let request = ChatCompletionRequest::from_json(body).unwrap();
    assert_eq!(request.messages[0].text().unwrap(), "a\nb \u{e9}");
    assert_eq!(request.messages[1].text().unwrap(), "plain");
}

#[test]
fn validation_names_the_field() {
    let base = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let cases = [
        (json!({"messages": []}), "messages"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (
            json!({"max_completion_tokens": -1}),
            "max_completion_tokens",
        ),
        (json!({"n": 0}), "n"),
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"temperature": -0.1}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"stop": "x".repeat(1025)}), "stop"),
        (
            json!({"stop_token_ids": (0..257).collect::<Vec<u32>>()}),
            "stop_token_ids",
        ),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"min_tokens": 5, "max_tokens": 2}), "min_tokens"),
        (json!({"top_k": -2}), "top_k"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (
            json!({"continue_final_message": true, "add_generation_prompt": true}),
            "continue_final_message",
        ),
    ];
    for (patch, param) in cases {
        let mut body = base.clone();
        body.as_object_mut()
            .unwrap()
            .extend(patch.as_object().unwrap().clone());
        let err = chat(body.clone()).validate().unwrap_err();
        assert_eq!(err.param(), Some(param), "{body}");
        assert!(err.is_user_error());
    }
    let ok = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "temperature": 0, "top_p": 1, "stop": ["a", "b", "c", "x".repeat(1024)], "logprobs": true,
        "top_logprobs": 20, "stop_token_ids": (0..256).collect::<Vec<u32>>()});
    chat(ok).validate().unwrap();
}

#[test]
fn completion_prompts_and_validation() {
    let shapes = [
        (json!("text"), 1),
        (json!(["a", "b"]), 2),
        (json!([1, 2, 3]), 1),
        (json!([[1, 2], [3]]), 2),
    ];
    for (prompt, len) in shapes {
        let request =
            completion(json!({"model": "m", "prompt": prompt, "logprobs": 2, "echo": false}));
        request.validate().unwrap();
        assert_eq!(request.prompt.len(), len);
        assert_eq!(request.sampling_options().logprobs, Some(2));
    }
    for (prompt, param) in [
        (json!(""), "prompt"),
        (json!([]), "prompt"),
        (json!([[1], []]), "prompt"),
    ] {
        let err = completion(json!({"model": "m", "prompt": prompt}))
            .validate()
            .unwrap_err();
        assert_eq!(err.param(), Some(param));
    }
    let err = completion(json!({"model": "m", "prompt": "x", "logprobs": 30}))
        .validate()
        .unwrap_err();
    assert_eq!(err.param(), Some("logprobs"));
    let err = completion(json!({"model": "m", "prompt": "x", "suffix": "y"}))
        .validate()
        .unwrap_err();
    assert_eq!(err.code(), LlmErrorCode::NotImplemented);
}

#[test]
fn chat_chunks_serialize_exactly() {
    let id = String::from("chatcmpl-1");
    let model = String::from("tiny");
    let first = ChatCompletionChunk::new(
        id.as_str(),
        model.as_str(),
        7,
        ChatChunkChoice::role(0),
        true,
    );
    assert_eq!(
        serde_json::to_string(&first).unwrap(),
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#
    );
    let text = String::from("Hel");
    let content = ChatCompletionChunk::new(
        id.as_str(),
        model.as_str(),
        7,
        ChatChunkChoice::content(0, text.as_str()),
        false,
    );
    assert!(matches!(
        content.choices[0].delta.content,
        Some(Cow::Borrowed(_))
    ));
    assert_eq!(
        serde_json::to_string(&content).unwrap(),
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"tiny","choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}]}"#
    );
    let last = ChatCompletionChunk::new(
        id.as_str(),
        model.as_str(),
        7,
        ChatChunkChoice::finish(0, FinishReason::Stop),
        true,
    );
    assert_eq!(
        serde_json::to_string(&last).unwrap(),
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"tiny","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}"#
    );
    let usage =
        ChatCompletionChunk::usage_only(id.as_str(), model.as_str(), 7, Usage::new(5, 3, Some(4)));
    assert_eq!(
        serde_json::to_string(&usage).unwrap(),
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"tiny","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4}}}"#
    );
    // Round trip keeps "usage": null apart from an absent usage.
    let parsed: ChatCompletionChunk<'static> =
        serde_json::from_str(&serde_json::to_string(&last).unwrap()).unwrap();
    assert_eq!(parsed.usage, Some(None));
    let parsed: ChatCompletionChunk<'static> =
        serde_json::from_str(&serde_json::to_string(&content).unwrap()).unwrap();
    assert_eq!(parsed.usage, None);
}

#[test]
fn tool_call_deltas_serialize() {
    let mut choice = ChatChunkChoice::default();
    choice.delta.tool_calls = Some(vec![ToolCallDelta {
        index: 0,
        id: Some("call_1".into()),
        kind: Some("function".into()),
        function: Some(FunctionCallDelta {
            name: Some("f".into()),
            arguments: Some("{\"a\":".into()),
        }),
    }]);
    let chunk = ChatCompletionChunk::new("id", "m", 1, choice, false);
    assert_eq!(
        serde_json::to_value(&chunk).unwrap()["choices"][0]["delta"],
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":"}}]})
    );
}

#[test]
fn unary_chat_response_shape() {
    let response = ChatCompletionResponse {
        id: "chatcmpl-1".into(),
        object: ChatCompletionObject,
        created: 7,
        model: "tiny".into(),
        choices: vec![ChatChoice {
            index: 0,
            message: ChatResponseMessage {
                role: Role::Assistant,
                content: None,
                tool_calls: Some(vec![ToolCall {
                    id: "call_1".into(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: "f".into(),
                        arguments: "{}".into(),
                    },
                }]),
                reasoning_content: None,
                reasoning: None,
            },
            logprobs: None,
            finish_reason: Some(FinishReason::ToolCalls),
        }],
        usage: Some(Usage::new(3, 2, None)),
        system_fingerprint: None,
        nvext: None,
    };
    assert_eq!(
        serde_json::to_value(&response).unwrap(),
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "tiny",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                "logprobs": null, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        })
    );
    let back: ChatCompletionResponse =
        serde_json::from_value(serde_json::to_value(&response).unwrap()).unwrap();
    assert_eq!(back, response);
    assert!(
        serde_json::from_value::<ChatCompletionResponse>(json!({
            "id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": []
        }))
        .is_err()
    );
}

#[test]
fn completion_shapes() {
    let chunk = CompletionChunk::new(
        "cmpl-1",
        "tiny",
        9,
        CompletionChunkChoice {
            index: 0,
            text: Cow::Borrowed(" world"),
            logprobs: None,
            finish_reason: None,
        },
        true,
    );
    assert_eq!(
        serde_json::to_string(&chunk).unwrap(),
        r#"{"id":"cmpl-1","object":"text_completion","created":9,"model":"tiny","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":null}],"usage":null}"#
    );
    let response = CompletionResponse {
        id: "cmpl-1".into(),
        object: TextCompletionObject,
        created: 9,
        model: "tiny".into(),
        choices: vec![CompletionChoice {
            index: 0,
            text: "hi".into(),
            logprobs: Some(CompletionLogprobs {
                tokens: vec!["hi".into()],
                token_logprobs: vec![Some(-0.5)],
                top_logprobs: vec![Some(TopLogprobMap(vec![
                    ("hi".into(), -0.5),
                    ("ho".into(), -1.5),
                ]))],
                text_offset: vec![0],
            }),
            finish_reason: Some(FinishReason::Length),
        }],
        usage: Some(Usage::new(1, 1, None)),
        system_fingerprint: None,
        nvext: None,
    };
    let text = serde_json::to_string(&response).unwrap();
    assert!(text.contains(r#""logprobs":{"tokens":["hi"],"token_logprobs":[-0.5],"top_logprobs":[{"hi":-0.5,"ho":-1.5}],"text_offset":[0]}"#), "{text}");
    let back: CompletionResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(back, response);
}

#[test]
fn model_list_shape() {
    let list = ModelList::new(vec![ModelObject::new("tiny", 1, "kvmesh")]);
    assert_eq!(
        serde_json::to_string(&list).unwrap(),
        r#"{"object":"list","data":[{"id":"tiny","object":"model","created":1,"owned_by":"kvmesh"}]}"#
    );
}

#[test]
fn context_length_fitting() {
    assert_eq!(fit_max_tokens(100, None, 8192, "messages").unwrap(), 8092);
    assert_eq!(fit_max_tokens(100, Some(50), 8192, "messages").unwrap(), 50);
    let err = fit_max_tokens(8000, Some(500), 8192, "messages").unwrap_err();
    assert_eq!(err.param(), Some("max_tokens"));
    assert!(err.to_string().contains("8192"));
    let err = fit_max_tokens(9000, None, 8192, "prompt").unwrap_err();
    assert!(matches!(
        err,
        LlmError::InvalidRequest {
            param: Some("prompt"),
            ..
        }
    ));
}

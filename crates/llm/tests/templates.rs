//! Real chat templates rendered through the request path; the expected strings are what
//! transformers' Jinja2 environment renders for the same conversation.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use kvmesh_llm::openai::ChatCompletionRequest;
use kvmesh_llm::{ChatTemplate, LlmError, SpecialTokens};
use serde_json::json;

const QWEN: &str = include_str!("fixtures/qwen2_5.jinja");
const LLAMA3: &str = include_str!("fixtures/llama3.jinja");
const MISTRAL: &str = include_str!("fixtures/mistral.jinja");

fn tokens(bos: &str, eos: &str) -> SpecialTokens {
    SpecialTokens {
        bos_token: Some(bos.to_owned()),
        eos_token: Some(eos.to_owned()),
        ..SpecialTokens::default()
    }
}

fn request(body: serde_json::Value) -> ChatCompletionRequest {
    let request = ChatCompletionRequest::from_json(body.to_string().as_bytes()).unwrap();
    request.validate().unwrap();
    request
}

#[test]
fn qwen_without_tools() {
    let template = ChatTemplate::new(QWEN, tokens("", "<|im_end|>")).unwrap();
    let out = template
        .render_request(&request(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": [{"type": "text", "text": "Hello!"}]}
            ]
        })))
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    );

    let out = template
        .render_request(&request(json!({
            "model": "m",
            "add_generation_prompt": false,
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}
            ]
        })))
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    );
}

#[test]
fn qwen_with_tools_and_tool_results() {
    let template = ChatTemplate::new(QWEN, tokens("", "<|im_end|>")).unwrap();
    let out = template
        .render_request(&request(json!({
            "model": "m",
            "tools": [
                {"type": "function", "function": {
                    "name": "get_weather",
                    "description": "Current weather in a city, e.g. Zürich",
                    "parameters": {"type": "object", "properties": {
                        "location": {"type": "string", "description": "City name"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                    }, "required": ["location"]}
                }},
                {"type": "function", "function": {
                    "name": "get_time", "description": "Current time",
                    "parameters": {"type": "object", "properties": {}}
                }}
            ],
            "tool_choice": "auto",
            "messages": [
                {"role": "system", "content": "You are a weather bot."},
                {"role": "user", "content": "Weather in Zürich?"},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"location\": \"Zürich\", \"unit\": \"celsius\"}"}
                }]},
                {"role": "tool", "content": "{\"temperature\": 22}", "tool_call_id": "call_1"},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_2"}
            ]
        })))
        .unwrap();
    let expected = "<|im_start|>system\nYou are a weather bot.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current weather in a city, e.g. Zürich\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"City name\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, \"required\": [\"location\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"description\": \"Current time\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Zürich?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temperature\": 22}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(out, expected);
}

#[test]
fn llama3_with_bos_trim_and_date() {
    let template = ChatTemplate::new(LLAMA3, tokens("<|begin_of_text|>", "<|eot_id|>")).unwrap();
    let out = template
        .render_request(&request(json!({
            "model": "m",
            "chat_template_kwargs": {"date_string": "26 Jul 2024"},
            "messages": [
                {"role": "system", "content": "  Be brief.  "},
                {"role": "user", "content": "What is 2+2?\n"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3?"}
            ]
        })))
        .unwrap();
    assert_eq!(
        out,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn llama3_uses_todays_date_without_date_string() {
    let template = ChatTemplate::new(LLAMA3, tokens("<|begin_of_text|>", "<|eot_id|>")).unwrap();
    let out = template
        .render_request(&request(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}]
        })))
        .unwrap();
    let date = out
        .split("Today Date: ")
        .nth(1)
        .and_then(|rest| rest.split('\n').next())
        .unwrap();
    let parts: Vec<&str> = date.split(' ').collect();
    assert_eq!(parts.len(), 3, "{date}");
    assert_eq!(parts[0].len(), 2);
    assert!(parts[2].parse::<u32>().unwrap() >= 2024);
}

#[test]
fn llama3_rejects_a_bad_role_with_the_templates_message() {
    let template = ChatTemplate::new(LLAMA3, tokens("<|begin_of_text|>", "<|eot_id|>")).unwrap();
    let err = template
        .render_request(&request(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}, {"role": "narrator", "content": "x"}]
        })))
        .unwrap_err();
    assert!(err.is_user_error());
    assert_eq!(
        err.to_string(),
        "Unsupported role 'narrator': only user, assistant and tool messages may follow the system message"
    );
}

#[test]
fn mistral_alternating_roles() {
    let template = ChatTemplate::new(MISTRAL, tokens("<s>", "</s>")).unwrap();
    let out = template
        .render_request(&request(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Bonjour"},
                {"role": "user", "content": "Thanks"}
            ]
        })))
        .unwrap();
    assert_eq!(
        out,
        "<s> [INST] Answer in French.\n\nHello [/INST] Bonjour</s> [INST] Thanks [/INST]"
    );
}

#[test]
fn mistral_raises_when_roles_do_not_alternate() {
    let template = ChatTemplate::new(MISTRAL, tokens("<s>", "</s>")).unwrap();
    let err = template
        .render_request(&request(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        })))
        .unwrap_err();
    assert!(matches!(&err, LlmError::TemplateException(_)));
    assert_eq!(
        err.to_string(),
        "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
    );

    let err = template
        .render_request(&request(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]
        })))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Only user and assistant roles are supported, with the exception of an initial optional system message!"
    );
}

#[test]
fn rendering_does_not_reload_and_is_thread_safe() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
    let template = std::sync::Arc::new(ChatTemplate::new(QWEN, tokens("", "<|im_end|>")).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let template = template.clone();
            std::thread::spawn(move || {
                let req = request(json!({"model": "m", "messages": [{"role": "user", "content": format!("n{i}")}]}));
                template.render_request(&req).unwrap()
            })
        })
        .collect();
    for (i, handle) in handles.into_iter().enumerate() {
        assert!(
            handle
                .join()
                .unwrap()
                .contains(&format!("user\nn{i}<|im_end|>"))
        );
    }
}

use super::*;
use crate::openai::{ToolChoice, ToolChoiceMode};

fn request(body: Value) -> ResponsesRequest {
    serde_json::from_value(body).unwrap()
}

#[test]
fn instructions_and_items_become_chat_messages() {
    let chat = request(serde_json::json!({
        "model": "m", "instructions": "be brief", "max_output_tokens": 5,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
        "tool_choice": "auto"
    }))
    .to_chat()
    .unwrap();
    let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert_eq!(chat.messages[1].text().unwrap(), "weather?");
    assert_eq!(chat.messages[2].tool_calls.as_ref().unwrap().len(), 2);
    assert_eq!(chat.max_tokens, Some(5));
    assert_eq!(chat.tools.unwrap()[0].function.name, "weather");
}

#[test]
fn state_and_other_tools_are_refused() {
    let stateful =
        request(serde_json::json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}));
    assert_eq!(
        stateful.to_chat().unwrap_err().param(),
        Some("previous_response_id")
    );
    let search =
        request(serde_json::json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}));
    assert!(matches!(search.to_chat(), Err(LlmError::Unsupported(_))));
    let empty = request(serde_json::json!({"model": "m", "input": [], "instructions": "x"}));
    assert_eq!(empty.to_chat().unwrap_err().param(), Some("input"));
}

#[test]
fn conversation_is_a_400_and_background_or_a_stored_prompt_a_501() {
    let conversation =
        request(serde_json::json!({"model": "m", "input": "x", "conversation": "conv_1"}));
    assert_eq!(
        conversation.to_chat().unwrap_err().param(),
        Some("conversation")
    );
    for (patch, field) in [
        (serde_json::json!({"background": true}), "'background'"),
        (
            serde_json::json!({"prompt": {"id": "pmpt_1", "version": "2"}}),
            "'prompt'",
        ),
    ] {
        let mut body = serde_json::json!({"model": "m", "input": "x"});
        body.as_object_mut()
            .unwrap()
            .extend(patch.as_object().unwrap().clone());
        match request(body).to_chat() {
            Err(LlmError::Unsupported(message)) => assert!(message.starts_with(field), "{message}"),
            other => panic!("expected a 501 naming {field}, got {other:?}"),
        }
    }
    request(serde_json::json!({"model": "m", "input": "x", "background": false}))
        .to_chat()
        .unwrap();
}

#[test]
fn parallel_tool_calls_and_reasoning_effort_reach_the_chat_request() {
    let chat = request(serde_json::json!({
        "model": "m", "input": "x", "parallel_tool_calls": false,
        "reasoning": {"effort": "low", "summary": "auto"}, "metadata": {"k": "v"}
    }))
    .to_chat()
    .unwrap();
    assert_eq!(chat.parallel_tool_calls, Some(false));
    assert_eq!(chat.reasoning_effort.as_deref(), Some("low"));
    let plain = request(serde_json::json!({"model": "m", "input": "x"}))
        .to_chat()
        .unwrap();
    assert_eq!(
        (plain.parallel_tool_calls, plain.reasoning_effort),
        (None, None)
    );
}

#[test]
fn include_logprobs_top_logprobs_and_user_reach_the_chat_request() {
    let chat = request(serde_json::json!({
        "model": "m", "input": "x", "include": ["message.output_text.logprobs"],
        "top_logprobs": 2, "user": "u", "service_tier": "auto", "safety_identifier": "s",
        "prompt_cache_key": "k", "truncation": "disabled", "max_tool_calls": 1
    }))
    .to_chat()
    .unwrap();
    assert_eq!((chat.logprobs, chat.top_logprobs), (Some(true), Some(2)));
    assert_eq!(chat.user.as_deref(), Some("u"));
    chat.validate().unwrap();
    let plain = request(serde_json::json!({"model": "m", "input": "x"}))
        .to_chat()
        .unwrap();
    assert_eq!(plain.logprobs, None);
}

#[test]
fn output_options_refuse_what_they_cannot_honour() {
    for (patch, param) in [
        (serde_json::json!({"truncation": "both"}), "truncation"),
        (serde_json::json!({"include": ["no.such.value"]}), "include"),
        (serde_json::json!({"max_tool_calls": -1}), "max_tool_calls"),
    ] {
        let mut body = serde_json::json!({"model": "m", "input": "x"});
        body.as_object_mut()
            .unwrap()
            .extend(patch.as_object().unwrap().clone());
        assert_eq!(request(body).to_chat().unwrap_err().param(), Some(param));
    }
    match request(serde_json::json!({"model": "m", "input": "x", "truncation": "auto"})).to_chat() {
        Err(LlmError::Unsupported(message)) => {
            assert!(message.starts_with("'truncation'"), "{message}")
        }
        other => panic!("expected a 501 naming truncation, got {other:?}"),
    }
    let chat = request(serde_json::json!({"model": "m", "input": "x", "top_logprobs": 21}))
        .to_chat()
        .unwrap();
    assert_eq!(chat.validate().unwrap_err().param(), Some("top_logprobs"));
}

#[test]
fn encrypted_reasoning_and_replayed_reasoning_items_are_accepted() {
    let chat = request(serde_json::json!({
        "model": "m",
        "include": ["reasoning.encrypted_content"],
        "input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "message", "role": "assistant", "content": "hello"},
            {"type": "message", "role": "user", "content": "again"}
        ]
    }))
    .to_chat()
    .unwrap();
    let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
}

#[test]
fn hosted_tool_choices_are_501s_naming_their_type() {
    let with_choice = |choice: Value| {
        request(serde_json::json!({"model": "m", "input": "x", "tool_choice": choice})).to_chat()
    };
    for choice in [
        serde_json::json!({"type": "web_search_preview"}),
        serde_json::json!({"type": "file_search"}),
        serde_json::json!({"type": "mcp", "server_label": "deepwiki", "name": "ask"}),
        serde_json::json!({"type": "allowed_tools", "mode": "auto",
                           "tools": [{"type": "mcp", "server_label": "deepwiki"}]}),
    ] {
        match with_choice(choice.clone()) {
            Err(LlmError::Unsupported(message)) => {
                let kind = choice["tools"][0]["type"]
                    .as_str()
                    .or(choice["type"].as_str());
                assert!(
                    message.contains(&format!("'{}'", kind.unwrap())),
                    "{message}"
                );
            }
            other => panic!("{choice}: {other:?}"),
        }
    }
    let unknown = with_choice(serde_json::json!({"type": "telepathy"})).unwrap_err();
    assert_eq!(unknown.param(), Some("tool_choice"));
    let nameless = with_choice(serde_json::json!({"type": "function"})).unwrap_err();
    assert!(nameless.to_string().contains("needs a name"), "{nameless}");
}

#[test]
fn allowed_function_tools_filter_the_tools() {
    let tool = |name: &str| serde_json::json!({"type": "function", "name": name});
    let with_allowed = |allowed: Value| {
        request(serde_json::json!({
            "model": "m", "input": "x",
            "tools": [tool("weather"), tool("time"), tool("news")],
            "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": allowed},
        }))
        .to_chat()
    };
    let chat = with_allowed(serde_json::json!([tool("news"), tool("weather")])).unwrap();
    let names: Vec<String> = chat
        .tools
        .unwrap()
        .into_iter()
        .map(|t| t.function.name)
        .collect();
    assert_eq!(names, ["weather", "news"]);
    assert_eq!(
        chat.tool_choice,
        Some(ToolChoice::Mode(ToolChoiceMode::Required))
    );
    let missing = with_allowed(serde_json::json!([tool("stocks")])).unwrap_err();
    assert!(missing.to_string().contains("'stocks'"), "{missing}");
    assert_eq!(missing.param(), Some("tool_choice"));
}

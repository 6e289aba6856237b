use serde_json::json;

use super::*;
use crate::openai::ToolChoiceMode;

fn request(body: Value) -> MessagesRequest {
    serde_json::from_value(body).unwrap()
}

#[test]
fn max_tokens_is_required_and_positive() {
    let base = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let error = request(base.clone()).to_chat().unwrap_err();
    assert_eq!(error.param(), Some("max_tokens"));
    let mut zero = base;
    zero["max_tokens"] = 0.into();
    assert!(
        request(zero)
            .to_chat()
            .unwrap_err()
            .to_string()
            .contains("at least 1")
    );
}

#[test]
fn blocks_become_chat_messages() {
    let chat = request(serde_json::json!({
        "model": "m", "max_tokens": 8,
        "system": [{"type": "text", "text": "be brief"}],
        "stop_sequences": ["END"],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "call it", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "thanks"}]}
        ],
        "tool_choice": {"type": "any"}
    }))
    .to_chat()
    .unwrap();
    let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    let call = &chat.messages[2].tool_calls.as_ref().unwrap()[0];
    assert_eq!(call.function.arguments, r#"{"city":"Oslo"}"#);
    assert_eq!(
        chat.messages[2].reasoning_content.as_deref(),
        Some("call it")
    );
    assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("t1"));
    assert_eq!(chat.messages[3].text().unwrap(), "sunny");
    assert_eq!(chat.max_tokens, Some(8));
    assert_eq!(
        chat.tool_choice,
        Some(ToolChoice::Mode(ToolChoiceMode::Required))
    );
    assert!(matches!(chat.stop, Some(Stop::Many(ref s)) if s.len() == 1));
}

#[test]
fn images_and_bad_roles_are_refused() {
    let image = request(
        serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {}}]}]}),
    );
    assert!(matches!(image.to_chat(), Err(LlmError::Unsupported(_))));
    let role = request(
        serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "system", "content": "x"}]}),
    );
    assert_eq!(role.to_chat().unwrap_err().param(), Some("messages"));
}

#[test]
fn thinking_maps_to_the_thinking_cap_or_the_template_switch() {
    let base =
        json!({"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]});
    let with = |thinking: Value| {
        let mut body = base.clone();
        body["thinking"] = thinking;
        request(body).to_chat()
    };
    let enabled = with(json!({"type": "enabled", "budget_tokens": 16})).unwrap();
    assert_eq!(enabled.max_thinking_tokens, Some(16));
    assert_eq!(enabled.chat_template_kwargs, None);
    let disabled = with(json!({"type": "disabled"})).unwrap();
    assert_eq!(disabled.max_thinking_tokens, None);
    assert_eq!(
        disabled
            .chat_template_kwargs
            .unwrap()
            .get("enable_thinking"),
        Some(&Value::Bool(false))
    );
    for (thinking, param) in [
        (json!({"type": "enabled"}), "thinking.budget_tokens"),
        (
            json!({"type": "enabled", "budget_tokens": 0}),
            "thinking.budget_tokens",
        ),
        (json!({"type": "sometimes"}), "thinking"),
    ] {
        assert_eq!(
            with(thinking.clone()).unwrap_err().param(),
            Some(param),
            "{thinking}"
        );
    }
}

#[test]
fn server_tools_are_501s_naming_their_type_and_custom_tools_are_served() {
    let body = |tools: Value| {
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
               "tools": tools, "metadata": {"user_id": "u"}, "service_tier": "auto"})
    };
    for server in [
        json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 2}),
        json!({"type": "bash_20250124", "name": "bash"}),
    ] {
        let kind = server["type"].as_str().unwrap().to_owned();
        match request(body(json!([server]))).to_chat() {
            Err(LlmError::Unsupported(message)) => assert!(message.contains(&kind), "{message}"),
            other => panic!("expected a 501 for {kind}, got {other:?}"),
        }
    }
    let custom = request(body(json!([
        {"name": "a", "input_schema": {"type": "object"}},
        {"type": "custom", "name": "b", "input_schema": {"type": "object"}}
    ])))
    .to_chat()
    .unwrap();
    let names: Vec<&str> = custom
        .tools
        .iter()
        .flatten()
        .map(|t| t.function.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn disable_parallel_tool_use_turns_parallel_tool_calls_off() {
    let body = |choice: Value| {
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
               "tools": [{"name": "a", "input_schema": {"type": "object"}}], "tool_choice": choice})
    };
    let single = request(body(
        json!({"type": "any", "disable_parallel_tool_use": true}),
    ))
    .to_chat()
    .unwrap();
    assert_eq!(single.parallel_tool_calls, Some(false));
    assert_eq!(
        single.tool_choice,
        Some(ToolChoice::Mode(ToolChoiceMode::Required))
    );
    let free = request(body(json!({"type": "auto"}))).to_chat().unwrap();
    assert_eq!(free.parallel_tool_calls, None);
}

#[test]
fn count_tokens_converts_the_prompt_fields_as_messages_does() {
    let body = json!({
        "model": "m", "max_tokens": 8,
        "system": "be brief",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "none"},
        "thinking": {"type": "disabled"},
    });
    let messages = request(body.clone()).to_chat().unwrap();
    let counted: CountTokensRequest = serde_json::from_value(body).unwrap();
    let counted = counted.to_chat().unwrap();
    assert_eq!(
        counted.tool_choice,
        Some(ToolChoice::Mode(ToolChoiceMode::None))
    );
    assert_eq!(
        counted.chat_template_kwargs.as_ref().unwrap()["enable_thinking"],
        false
    );
    let prompt_fields = |chat: &ChatCompletionRequest| {
        (
            chat.model.clone(),
            chat.messages.clone(),
            chat.tools.clone(),
            chat.tool_choice.clone(),
            chat.parallel_tool_calls,
            chat.chat_template_kwargs.clone(),
        )
    };
    assert_eq!(prompt_fields(&counted), prompt_fields(&messages));
    let bad: CountTokensRequest = serde_json::from_value(json!({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled"},
    }))
    .unwrap();
    assert_eq!(
        bad.to_chat().unwrap_err().param(),
        Some("thinking.budget_tokens")
    );
}

#[test]
fn stop_sequences_are_not_held_to_the_openai_limit_of_stop() {
    let with_stops = |num: usize| {
        let stops: Vec<String> = (0..num).map(|i| format!("END{i}")).collect();
        request(json!({
            "model": "m", "max_tokens": 8, "stop_sequences": stops,
            "messages": [{"role": "user", "content": "hi"}],
        }))
        .to_chat()
        .unwrap()
    };
    with_stops(5).validate().unwrap();
    let error = with_stops(crate::openai::MAX_ANTHROPIC_STOP_SEQUENCES + 1)
        .validate()
        .unwrap_err();
    assert_eq!(error.param(), Some("stop_sequences"));
    assert!(error.to_string().contains("'stop_sequences'"), "{error}");
    let mut chat = with_stops(5);
    chat.stop_field = StopField::Stop;
    assert_eq!(chat.validate().unwrap_err().param(), Some("stop"));
}

#[test]
fn a_failed_tool_result_reaches_the_model_as_an_error() {
    let chat = request(json!({
        "model": "m", "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "weather", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "is_error": true,
                 "content": [{"type": "text", "text": "city not found"}]},
                {"type": "tool_result", "tool_use_id": "t2", "is_error": false, "content": "sunny"}]}
        ],
    }))
    .to_chat()
    .unwrap();
    let tool_texts: Vec<String> = chat
        .messages
        .iter()
        .filter(|message| message.role == "tool")
        .map(|message| message.text().unwrap().into_owned())
        .collect();
    assert_eq!(tool_texts, ["Error: city not found", "sunny"]);
}

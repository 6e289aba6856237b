use serde_json::json;

use super::*;

fn chat(patch: serde_json::Value) -> ChatCompletionRequest {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    body.as_object_mut()
        .unwrap()
        .extend(patch.as_object().unwrap().clone());
    serde_json::from_value(body).unwrap()
}

fn completion_with(patch: serde_json::Value) -> CompletionRequest {
    completion(patch)
}

fn completion(patch: serde_json::Value) -> CompletionRequest {
    let mut body = json!({"model": "m", "prompt": "x"});
    body.as_object_mut()
        .unwrap()
        .extend(patch.as_object().unwrap().clone());
    serde_json::from_value(body).unwrap()
}

#[test]
fn nvext_max_thinking_tokens_caps_like_the_root_field_which_wins() {
    let nvext = chat(json!({"nvext": {"max_thinking_tokens": 7}}));
    nvext.validate().unwrap();
    assert_eq!(nvext.sampling_options().max_thinking_tokens, Some(7));
    let both = chat(json!({"max_thinking_tokens": 3, "nvext": {"max_thinking_tokens": 7}}));
    assert_eq!(both.sampling_options().max_thinking_tokens, Some(3));
    assert_eq!(chat(json!({})).sampling_options().max_thinking_tokens, None);
    for bad in [json!(-1), json!("many"), json!(1.5)] {
        let error = chat(json!({"nvext": {"max_thinking_tokens": bad}}))
            .validate()
            .unwrap_err();
        assert_eq!(error.param(), Some("nvext.max_thinking_tokens"), "{bad}");
    }
}

#[test]
fn root_guided_fields_reach_the_sampling_options_on_both_endpoints() {
    let chat = chat(json!({
        "guided_choice": ["yes", "no"],
        "guided_decoding_backend": "xgrammar",
        "nvext": {"guided_choice": ["maybe"]},
    }));
    chat.validate().unwrap();
    assert_eq!(
        chat.sampling_options().guided,
        Some(Guided::Choice(vec!["yes".into(), "no".into()]))
    );
    let completion = completion(json!({"guided_regex": "[0-9]{3}"}));
    completion.validate().unwrap();
    assert_eq!(
        completion.sampling_options().guided,
        Some(Guided::Regex("[0-9]{3}".into()))
    );
    let grammar = CompletionRequest {
        guided_grammar: Some(json!("root ::= x")),
        ..completion
    };
    assert!(
        matches!(grammar.validate(), Err(LlmError::Unsupported(m)) if m.contains("'guided_grammar'"))
    );
}

#[test]
fn nvext_greed_sampling_forces_greedy_on_both_endpoints() {
    let chat = chat(json!({"temperature": 1.2, "nvext": {"greed_sampling": true}}));
    chat.validate().unwrap();
    assert_eq!(chat.sampling_options().temperature, Some(0.0));
    let completion = completion(json!({"nvext": {"greed_sampling": true}}));
    assert_eq!(completion.sampling_options().temperature, Some(0.0));
    let off = completion_with(json!({"temperature": 0.5, "nvext": {"greed_sampling": false}}));
    assert_eq!(off.sampling_options().temperature, Some(0.5));
    let error = completion_with(json!({"nvext": {"token_data": [1]}}))
        .validate()
        .unwrap_err();
    assert!(matches!(error, LlmError::Unsupported(_)));
}

#[test]
fn nvext_legacy_sampling_fields_apply_unless_the_top_level_field_is_set() {
    let legacy = json!({"ignore_eos": true, "top_k": 5, "min_p": 0.25, "repetition_penalty": 1.5});
    let chat_nvext = chat(json!({"nvext": legacy}));
    chat_nvext.validate().unwrap();
    let completion_nvext = completion(json!({"nvext": legacy}));
    completion_nvext.validate().unwrap();
    for options in [
        chat_nvext.sampling_options(),
        completion_nvext.sampling_options(),
    ] {
        assert!(options.ignore_eos);
        assert_eq!(options.top_k, Some(5));
        assert_eq!(options.min_p, Some(0.25));
        assert_eq!(options.repetition_penalty, Some(1.5));
    }
    let root = chat(json!({
        "ignore_eos": false, "top_k": 3, "min_p": 0.5, "repetition_penalty": 1.1, "nvext": legacy
    }))
    .sampling_options();
    assert!(!root.ignore_eos);
    assert_eq!(root.top_k, Some(3));
    assert_eq!(root.min_p, Some(0.5));
    assert_eq!(root.repetition_penalty, Some(1.1));
    let disabled = chat(json!({"nvext": {"top_k": -1}})).sampling_options();
    assert_eq!(disabled.top_k, None);
    for (nvext, param) in [
        (json!({"top_k": "five"}), "nvext.top_k"),
        (
            json!({"repetition_penalty": -1}),
            "nvext.repetition_penalty",
        ),
        (json!({"ignore_eos": 1}), "nvext.ignore_eos"),
        (json!({"min_p": 2}), "nvext.min_p"),
    ] {
        let error = completion(json!({"nvext": nvext})).validate().unwrap_err();
        assert_eq!(error.param(), Some(param), "{nvext}");
    }
}

use super::*;

fn render(source: &str, messages: &[ChatMessage]) -> Result<String, LlmError> {
    let template = ChatTemplate::new(source, SpecialTokens::default())?;
    template.render(&ChatRenderInput {
        messages,
        add_generation_prompt: true,
        ..ChatRenderInput::default()
    })
}

fn user(text: &str) -> ChatMessage {
    ChatMessage::new("user", text)
}

#[test]
fn raise_exception_is_a_user_error_with_the_templates_message() {
    let err = render(
        "{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}",
        &[user("hi")],
    )
    .unwrap_err();
    assert!(matches!(&err, LlmError::TemplateException(m) if m == "System first!"));
    assert!(err.is_user_error());
}

#[test]
fn raise_exception_inside_a_macro_is_still_recognised() {
    let source = "{% macro check(m) %}{% if m.role == 'bad' %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}";
    let err = render(source, &[ChatMessage::new("bad", "x")]).unwrap_err();
    assert_eq!(err.to_string(), "bad role bad");
}

#[test]
fn other_render_failures_are_user_errors_too() {
    let err = render("{{ messages[0].content.nope.deeper }}", &[user("hi")]).unwrap_err();
    assert!(matches!(err, LlmError::TemplateRender(_)), "{err:?}");
    assert!(err.is_user_error());
}

#[test]
fn syntax_errors_fail_at_load() {
    let err = ChatTemplate::new("{% for %}", SpecialTokens::default()).unwrap_err();
    assert!(matches!(err, LlmError::TemplateSyntax(_)));
    assert!(!err.is_user_error());
}

#[test]
fn pycompat_methods_and_python_printing() {
    let source = "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith('  he') }}|{{ messages[0].content.split()|length }}|{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}|{{ none }}|{{ [1, 'x', none, true] }}|{{ {'k': 2.0} }}|{{ {'a': 1}.get('b', 'dflt') }}";
    let out = render(source, &[user("  hello world  ")]).unwrap();
    assert_eq!(
        out,
        "HELLO WORLD|True|2|a=1|None|[1, 'x', None, True]|{'k': 2.0}|dflt"
    );
}

#[test]
fn tojson_matches_python_json_dumps() {
    let source = "{{ {'name': 'f', 'args': [1, 2], 'text': 'é'} | tojson }}\n{{ {'a': {'b': []}} | tojson(indent=2) }}\n{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}";
    let out = render(source, &[user("x")]).unwrap();
    assert_eq!(
        out,
        "{\"name\": \"f\", \"args\": [1, 2], \"text\": \"é\"}\n{\n  \"a\": {\n    \"b\": []\n  }\n}\n{\"a\":2,\"b\":1}"
    );
}

#[test]
fn trim_and_lstrip_blocks_like_transformers() {
    let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}";
    let out = render(source, &[user("a"), user("b")]).unwrap();
    assert_eq!(out, "[a]\n[b]\n");
}

#[test]
fn loop_controls_and_namespace() {
    let source = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}:{{ ns.n }}";
    let messages = [
        user("a"),
        ChatMessage::new("skip", "s"),
        user("b"),
        user("c"),
    ];
    assert_eq!(render(source, &messages).unwrap(), "ab:2");
}

#[test]
fn strftime_now_is_available() {
    let out = render("{{ strftime_now('%Y') }}", &[user("x")]).unwrap();
    assert!(out.parse::<i32>().unwrap() >= 2024);
}

#[test]
fn content_parts_are_joined_and_images_rejected() {
    let message: ChatMessage = serde_json::from_value(serde_json::json!({
        "role": "user",
        "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    }))
    .unwrap();
    assert_eq!(
        render("{{ messages[0].content }}", &[message]).unwrap(),
        "one\ntwo"
    );

    let image: ChatMessage = serde_json::from_value(serde_json::json!({
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]
    }))
    .unwrap();
    let err = render("{{ messages[0].content }}", &[image]).unwrap_err();
    assert!(matches!(err, LlmError::Unsupported(_)));
}

#[test]
fn named_templates_pick_tool_use_when_tools_are_given() {
    let template = ChatTemplate::with_named(
        [
            ("default".to_owned(), "plain".to_owned()),
            ("tool_use".to_owned(), "tools:{{ tools|length }}".to_owned()),
        ],
        SpecialTokens::default(),
    )
    .unwrap();
    let tool: ChatTool = serde_json::from_value(serde_json::json!({
        "type": "function", "function": {"name": "f"}
    }))
    .unwrap();
    let messages = [user("x")];
    let mut input = ChatRenderInput {
        messages: &messages,
        ..ChatRenderInput::default()
    };
    assert_eq!(template.render(&input).unwrap(), "plain");
    let tools = [tool];
    input.tools = Some(&tools);
    assert_eq!(template.render(&input).unwrap(), "tools:1");
}

#[test]
fn kwargs_and_special_tokens_reach_the_template() {
    let template = ChatTemplate::new(
        "{{ bos_token }}{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}{{ eos_token }}",
        SpecialTokens {
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            ..SpecialTokens::default()
        },
    )
    .unwrap();
    let kwargs: Map<String, JsonValue> =
        serde_json::from_value(serde_json::json!({"enable_thinking": false})).unwrap();
    let messages = [user("x")];
    let out = template
        .render(&ChatRenderInput {
            messages: &messages,
            template_kwargs: Some(&kwargs),
            ..ChatRenderInput::default()
        })
        .unwrap();
    assert_eq!(out, "<s><nothink></s>");
}

#[test]
fn reasoning_effort_is_a_template_variable_that_kwargs_override() {
    let template = ChatTemplate::new(
        "effort={{ reasoning_effort | default('unset') }}",
        SpecialTokens::default(),
    )
    .unwrap();
    let request = |body: JsonValue| -> ChatCompletionRequest {
        let mut base =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        base.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    };
    let render = |body| template.render_request(&request(body)).unwrap();
    assert_eq!(render(serde_json::json!({})), "effort=unset");
    assert_eq!(
        render(serde_json::json!({"reasoning_effort": "high"})),
        "effort=high"
    );
    assert_eq!(
        render(serde_json::json!({"reasoning_effort": "high",
            "chat_template_kwargs": {"reasoning_effort": "low"}})),
        "effort=low"
    );
}

#[test]
fn continue_final_message_cuts_after_the_last_content() {
    let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</end>\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    let template = ChatTemplate::new(source, SpecialTokens::default()).unwrap();
    let request = ChatCompletionRequest {
        messages: vec![user("Hi"), ChatMessage::new("assistant", "Once upon a ")],
        continue_final_message: Some(true),
        ..ChatCompletionRequest::default()
    };
    assert_eq!(
        template.render_request(&request).unwrap(),
        "<user>Hi</end>\n<assistant>Once upon a "
    );
}

#[test]
fn generation_blocks_render_their_content() {
    let out = render(
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
        &[user("a")],
    )
    .unwrap();
    assert_eq!(out, "a");
}

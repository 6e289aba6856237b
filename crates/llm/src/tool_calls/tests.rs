//! Each format on outputs in its documented syntax, whole and streamed split at every character
//! boundary, plus the writer round trip.

use super::*;

fn call(name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// (format, output, content, calls)
fn fixtures() -> Vec<(ToolCallFormat, &'static str, &'static str, Vec<ParsedCall>)> {
    let weather = || call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#);
    let time = || call("get_time", r#"{"zone":"CET"}"#);
    vec![
        (
            ToolCallFormat::Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>",
            "Let me check.\n\n",
            vec![weather(), time()],
        ),
        (
            ToolCallFormat::Hermes,
            "No tools needed: 1 < 2 and <b>bold</b>.",
            "No tools needed: 1 < 2 and <b>bold</b>.",
            vec![],
        ),
        (
            ToolCallFormat::Llama3Json,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}; {\"name\": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}",
            "",
            vec![weather(), time()],
        ),
        (
            ToolCallFormat::Llama3Json,
            " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
            " ",
            vec![weather()],
        ),
        (
            ToolCallFormat::Llama3Json,
            "The answer is {\"a\": 1}.",
            "The answer is {\"a\": 1}.",
            vec![],
        ),
        (
            ToolCallFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}, {\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}]",
            "",
            vec![weather(), time()],
        ),
        (
            ToolCallFormat::Mistral,
            "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}[TOOL_CALLS]get_time[ARGS]{\"zone\": \"CET\"}",
            "Sure.",
            vec![weather(), time()],
        ),
        (
            ToolCallFormat::Pythonic,
            "[get_weather(city='Paris', unit=\"celsius\"), get_time(zone='CET')]",
            "",
            vec![weather(), time()],
        ),
        (
            ToolCallFormat::Pythonic,
            "[1, 2, 3] are numbers",
            "[1, 2, 3] are numbers",
            vec![],
        ),
        (
            ToolCallFormat::DeepseekV3,
            "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"CET\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Checking.",
            vec![weather(), time()],
        ),
    ]
}

fn collect(events: Vec<JailEvent>) -> (String, Vec<ParsedCall>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    for event in events {
        match event {
            JailEvent::Content(text) => content.push_str(&text),
            JailEvent::Call(call) => calls.push(call),
        }
    }
    (content, calls)
}

#[test]
fn whole_outputs_parse_into_content_and_calls() {
    for (format, output, content, calls) in fixtures() {
        assert_eq!(
            parse_complete(format, output),
            (content.to_owned(), calls),
            "{format:?} on {output:?}"
        );
    }
}

#[test]
fn streamed_outputs_give_the_same_result_wherever_they_are_split() {
    for (format, output, content, calls) in fixtures() {
        let boundaries: Vec<usize> = output.char_indices().map(|(at, _)| at).skip(1).collect();
        for &cut in &boundaries {
            let mut jail = ToolCallJail::new(format);
            let mut events = jail.push(&output[..cut]);
            events.extend(jail.push(&output[cut..]));
            events.extend(jail.finish());
            assert_eq!(
                collect(events),
                (content.to_owned(), calls.clone()),
                "{format:?} split at {cut}"
            );
        }
        let mut jail = ToolCallJail::new(format);
        let mut events = Vec::new();
        for c in output.chars() {
            events.extend(jail.push(&c.to_string()));
        }
        events.extend(jail.finish());
        assert_eq!(
            collect(events),
            (content.to_owned(), calls),
            "{format:?} char by char"
        );
    }
}

#[test]
fn a_call_goes_out_once_its_region_closes_and_text_before_it_at_once() {
    let mut jail = ToolCallJail::new(ToolCallFormat::Hermes);
    assert_eq!(
        jail.push("Hi <tool"),
        vec![JailEvent::Content("Hi ".into())]
    );
    assert_eq!(
        jail.push("_call>{\"name\": \"f\", \"arguments\": {}}"),
        vec![]
    );
    assert_eq!(
        jail.push("</tool_call> bye"),
        vec![
            JailEvent::Call(call("f", "{}")),
            JailEvent::Content(" bye".into())
        ]
    );
    assert_eq!(jail.finish(), vec![]);
}

#[test]
fn an_unfinished_call_is_returned_as_content() {
    let text = "<tool_call>{\"name\": \"f\", \"argu";
    assert_eq!(
        parse_complete(ToolCallFormat::Hermes, text),
        (text.to_owned(), vec![])
    );
}

#[test]
fn every_format_reads_back_what_it_writes() {
    let calls = vec![
        call(
            "search",
            r#"{"query":"kv \"cache\"","limit":3,"exact":true,"tags":["a","b"],"extra":null,"range":{"low":1.5}}"#,
        ),
        call("ping", "{}"),
    ];
    for name in ToolCallFormat::NAMES {
        let format = ToolCallFormat::from_name(name).unwrap();
        assert_eq!(format.name(), name);
        let written = format.write(&calls);
        let (content, parsed) = parse_complete(format, &written);
        assert_eq!(parsed, calls, "{name}: {written}");
        assert!(content.trim().is_empty(), "{name}: {content:?}");
    }
    assert_eq!(ToolCallFormat::from_name("nope"), None);
}

//! The mock engine's tool calls (docs/mocker.md, "Tool calls"): which tools a request's turn
//! calls, with arguments valid for each tool's schema, written in the model's syntax.

use kvmesh_llm::tool_calls::ParsedCall;
use kvmesh_proto::v1::{ToolSpec, ToolsRequest};
use serde_json::Value;

use crate::engine::Xoshiro256;

/// The calls of this turn, empty when the model answers in text. `named` forces its tool;
/// `required` calls the tools the conversation's latest text names (or the first tool);
/// `auto` calls the named tools only. Without `parallel`, at most one call.
pub fn calls_for(tools: &ToolsRequest, prompt_text: &str, rng: &mut Xoshiro256) -> Vec<ParsedCall> {
    let chosen: Vec<&ToolSpec> = match tools.choice.as_str() {
        "named" => tools
            .tools
            .iter()
            .filter(|tool| tool.name == tools.named_function)
            .take(1)
            .collect(),
        "required" => {
            let mentioned = mentioned(&tools.tools, prompt_text);
            if mentioned.is_empty() {
                tools.tools.iter().take(1).collect()
            } else {
                mentioned
            }
        }
        _ => mentioned(&tools.tools, prompt_text),
    };
    let limit = if tools.parallel { chosen.len() } else { 1 };
    chosen
        .into_iter()
        .take(limit)
        .map(|tool| {
            let schema: Value = serde_json::from_str(&tool.parameters_json)
                .unwrap_or_else(|_| serde_json::json!({"type": "object"}));
            ParsedCall {
                name: tool.name.clone(),
                arguments: crate::guided::json_for_schema(&schema, rng),
            }
        })
        .collect()
}

/// The tools named as a word in the prompt after the last place any tool's name appears in
/// quotes (the tool definitions, or an earlier call), in the order they are named there: what
/// the latest turns ask for.
fn mentioned<'a>(tools: &'a [ToolSpec], prompt_text: &str) -> Vec<&'a ToolSpec> {
    let after = tools
        .iter()
        .filter_map(|tool| {
            let quoted = format!("\"{}\"", tool.name);
            prompt_text.rfind(&quoted).map(|at| at + quoted.len())
        })
        .max()
        .unwrap_or(0);
    let tail = &prompt_text[after..];
    let mut found: Vec<(usize, &ToolSpec)> = tools
        .iter()
        .filter(|tool| !tool.name.is_empty())
        .filter_map(|tool| word_position(tail, &tool.name).map(|at| (at, tool)))
        .collect();
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, tool)| tool).collect()
}

fn word_position(text: &str, word: &str) -> Option<usize> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        let before = text[..at].chars().next_back().is_none_or(|c| !is_word(c));
        let after = text[at + word.len()..]
            .chars()
            .next()
            .is_none_or(|c| !is_word(c));
        before && after
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(choice: &str, named: &str, parallel: bool) -> ToolsRequest {
        let spec = |name: &str, schema: &str| ToolSpec {
            name: name.into(),
            parameters_json: schema.into(),
        };
        ToolsRequest {
            tools: vec![
                spec(
                    "get_weather",
                    r#"{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}"#,
                ),
                spec("get_time", ""),
            ],
            choice: choice.into(),
            named_function: named.into(),
            parallel,
        }
    }

    const DEFINITIONS: &str = r#"<tools>{"name": "get_weather"} {"name": "get_time"}</tools>"#;

    fn names(calls: &[ParsedCall]) -> Vec<&str> {
        calls.iter().map(|call| call.name.as_str()).collect()
    }

    #[test]
    fn the_choice_and_the_latest_text_decide_the_calls() {
        let mut rng = Xoshiro256::from_seed(1);
        let asks_both = format!("{DEFINITIONS} user: use get_time, then get_weather");
        let asks_none = format!("{DEFINITIONS} user: hello");
        assert_eq!(
            names(&calls_for(&tools("auto", "", true), &asks_both, &mut rng)),
            ["get_time", "get_weather"]
        );
        assert_eq!(
            names(&calls_for(&tools("auto", "", false), &asks_both, &mut rng)),
            ["get_time"]
        );
        assert!(calls_for(&tools("auto", "", true), &asks_none, &mut rng).is_empty());
        assert_eq!(
            names(&calls_for(
                &tools("required", "", true),
                &asks_none,
                &mut rng
            )),
            ["get_weather"]
        );
        assert_eq!(
            names(&calls_for(
                &tools("named", "get_time", true),
                &asks_both,
                &mut rng
            )),
            ["get_time"]
        );
        // A name inside a longer word is not a mention; an answered call is not asked again.
        let answered =
            format!(r#"{DEFINITIONS} user: get_weather {{"name": "get_weather"}} tool: sunny"#);
        assert!(calls_for(&tools("auto", "", true), &answered, &mut rng).is_empty());
        let inside = format!("{DEFINITIONS} user: my_get_weather_x");
        assert!(calls_for(&tools("auto", "", true), &inside, &mut rng).is_empty());
    }

    #[test]
    fn arguments_follow_the_tool_schema() {
        let mut rng = Xoshiro256::from_seed(2);
        let calls = calls_for(&tools("named", "get_weather", true), "", &mut rng);
        let arguments: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert!(arguments["city"].is_string());
        assert!((1..=7).contains(&arguments["days"].as_i64().unwrap()));
        let calls = calls_for(&tools("named", "get_time", true), "", &mut rng);
        assert_eq!(calls[0].arguments, "{}");
    }
}

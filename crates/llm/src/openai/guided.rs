//! Guided decoding: the constraint a request puts on the shape of its output, from the OpenAI
//! `response_format` or the `nvext` guided fields (docs/http-api.md, "Structured output"). The
//! frontend sends it to the engine, which enforces it while sampling.

use serde_json::Value;

use super::tools::ResponseFormat;
use crate::LlmError;

/// Most strings `nvext.guided_choice` may list.
pub const MAX_GUIDED_CHOICES: usize = 256;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Guided {
    /// JSON validating against this schema (JSON text); `json_object` is `{"type":"object"}`.
    JsonSchema(String),
    /// Text matching this regular expression in full.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// The guided constraint of a request, or `None` when its output is free. At most one source may
/// set it: `response_format` (other than `text`), `nvext.guided_json`, `nvext.guided_regex` or
/// `nvext.guided_choice`; `nvext.guided_grammar` is not supported.
pub fn guided_decoding(
    response_format: Option<&ResponseFormat>,
    nvext: Option<&Value>,
) -> Result<Option<Guided>, LlmError> {
    let mut found: Vec<(&'static str, Guided)> = Vec::new();
    match response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => found.push((
            "response_format",
            Guided::JsonSchema(r#"{"type":"object"}"#.to_owned()),
        )),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = match &json_schema.schema {
                Some(schema @ Value::Object(_)) => schema.to_string(),
                None => r#"{"type":"object"}"#.to_owned(),
                Some(_) => {
                    return Err(LlmError::invalid(
                        "response_format",
                        "'response_format.json_schema.schema' must be a JSON object",
                    ));
                }
            };
            found.push(("response_format", Guided::JsonSchema(schema)));
        }
    }
    if let Some(nvext) = nvext.and_then(Value::as_object) {
        if nvext.get("guided_grammar").is_some_and(|g| !g.is_null()) {
            return Err(LlmError::Unsupported(
                "'nvext.guided_grammar' is not supported; use guided_json, guided_regex or guided_choice"
                    .to_owned(),
            ));
        }
        match nvext.get("guided_json") {
            None | Some(Value::Null) => {}
            Some(Value::Object(schema)) => found.push((
                "nvext.guided_json",
                Guided::JsonSchema(Value::Object(schema.clone()).to_string()),
            )),
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(_)) => {
                    found.push(("nvext.guided_json", Guided::JsonSchema(text.clone())))
                }
                _ => return Err(not_a_schema()),
            },
            Some(_) => return Err(not_a_schema()),
        }
        match nvext.get("guided_regex") {
            None | Some(Value::Null) => {}
            Some(Value::String(pattern)) if !pattern.is_empty() => {
                regex_syntax::Parser::new()
                    .parse(pattern)
                    .map_err(|error| {
                        LlmError::invalid(
                            "nvext.guided_regex",
                            format!(
                                "'nvext.guided_regex' is not a valid regular expression: {error}"
                            ),
                        )
                    })?;
                found.push(("nvext.guided_regex", Guided::Regex(pattern.clone())))
            }
            Some(_) => {
                return Err(LlmError::invalid(
                    "nvext.guided_regex",
                    "'nvext.guided_regex' must be a non-empty string",
                ));
            }
        }
        match nvext.get("guided_choice") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => found.push(("nvext.guided_choice", choice(items)?)),
            Some(_) => return Err(choice_error()),
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop().map(|(_, guided)| guided)),
        _ => Err(LlmError::invalid(
            found[1].0,
            format!(
                "only one guided decoding constraint may be set, got {}",
                found
                    .iter()
                    .map(|(name, _)| format!("'{name}'"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        )),
    }
}

fn choice(items: &[Value]) -> Result<Guided, LlmError> {
    if items.is_empty() || items.len() > MAX_GUIDED_CHOICES {
        return Err(choice_error());
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(text) if !text.is_empty() => Ok(text.clone()),
            _ => Err(choice_error()),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Guided::Choice)
}

fn choice_error() -> LlmError {
    LlmError::invalid(
        "nvext.guided_choice",
        format!(
            "'nvext.guided_choice' must be a list of 1 to {MAX_GUIDED_CHOICES} non-empty strings"
        ),
    )
}

fn not_a_schema() -> LlmError {
    LlmError::invalid(
        "nvext.guided_json",
        "'nvext.guided_json' must be a JSON schema object (or its JSON text)",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::openai::tools::JsonSchemaFormat;

    #[test]
    fn response_format_and_nvext_map_to_one_constraint() {
        assert_eq!(guided_decoding(None, None).unwrap(), None);
        assert_eq!(
            guided_decoding(Some(&ResponseFormat::Text), Some(&json!({}))).unwrap(),
            None
        );
        assert_eq!(
            guided_decoding(Some(&ResponseFormat::JsonObject), None).unwrap(),
            Some(Guided::JsonSchema(r#"{"type":"object"}"#.into()))
        );
        let format = ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: "n".into(),
                description: None,
                schema: Some(json!({"type": "integer"})),
                strict: None,
            },
        };
        assert_eq!(
            guided_decoding(Some(&format), None).unwrap(),
            Some(Guided::JsonSchema(r#"{"type":"integer"}"#.into()))
        );
        assert_eq!(
            guided_decoding(None, Some(&json!({"guided_regex": "[a-z]+"}))).unwrap(),
            Some(Guided::Regex("[a-z]+".into()))
        );
        assert_eq!(
            guided_decoding(None, Some(&json!({"guided_choice": ["yes", "no"]}))).unwrap(),
            Some(Guided::Choice(vec!["yes".into(), "no".into()]))
        );
        assert_eq!(
            guided_decoding(None, Some(&json!({"guided_json": "{\"type\":\"string\"}"}))).unwrap(),
            Some(Guided::JsonSchema(r#"{"type":"string"}"#.into()))
        );
    }

    #[test]
    fn bad_or_conflicting_constraints_name_the_field() {
        let param = |result: Result<Option<Guided>, LlmError>| match result {
            Err(LlmError::InvalidRequest { param, .. }) => param,
            other => panic!("expected an invalid request, got {other:?}"),
        };
        assert_eq!(
            param(guided_decoding(
                Some(&ResponseFormat::JsonObject),
                Some(&json!({"guided_regex": "a"}))
            )),
            Some("nvext.guided_regex")
        );
        assert_eq!(
            param(guided_decoding(None, Some(&json!({"guided_regex": "(a"})))),
            Some("nvext.guided_regex")
        );
        assert_eq!(
            param(guided_decoding(None, Some(&json!({"guided_choice": []})))),
            Some("nvext.guided_choice")
        );
        assert_eq!(
            param(guided_decoding(None, Some(&json!({"guided_json": "[1]"})))),
            Some("nvext.guided_json")
        );
        assert!(matches!(
            guided_decoding(None, Some(&json!({"guided_grammar": "root ::= x"}))),
            Err(LlmError::Unsupported(_))
        ));
    }
}

//! Guided decoding: the constraint a request puts on the shape of its output, from the OpenAI
//! `response_format`, the root-level guided fields (vLLM's and Dynamo's spelling) or their
//! deprecated `nvext` copies (docs/http-api.md, "Structured output"). The frontend sends it to
//! the engine, which enforces it while sampling.

use serde_json::Value;

use super::tools::ResponseFormat;
use crate::LlmError;

/// Most strings `guided_choice` may list.
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

/// The root-level guided fields of a chat or completions request, borrowed. Each one set wins over
/// its `nvext` copy.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuidedFields<'a> {
    /// `guided_json`: a schema object or its JSON text.
    pub json: Option<&'a Value>,
    /// `guided_regex`: the whole output matches it.
    pub regex: Option<&'a Value>,
    /// `guided_choice`: the output is one of these strings.
    pub choice: Option<&'a Value>,
    /// `guided_grammar`: not supported (501).
    pub grammar: Option<&'a Value>,
    /// `guided_whitespace_pattern`: not supported (501); the engine picks the whitespace of
    /// guided JSON.
    pub whitespace_pattern: Option<&'a Value>,
}

/// One guided field and the name it was given under (`guided_json` or `nvext.guided_json`).
type Sourced<'a> = Option<(&'static str, &'a Value)>;

/// The field `name` from the root if set there, else from `nvext`, with the name to report.
fn sourced<'a>(
    root: Option<&'a Value>,
    nvext: Option<&'a serde_json::Map<String, Value>>,
    names: (&'static str, &'static str),
) -> Sourced<'a> {
    let set = |value: &&Value| !value.is_null();
    match root.filter(set) {
        Some(value) => Some((names.0, value)),
        None => nvext
            .and_then(|nvext| nvext.get(names.0))
            .filter(set)
            .map(|value| (names.1, value)),
    }
}

/// The guided constraint of a request, or `None` when its output is free. At most one source may
/// set it: `response_format` (other than `text`), `guided_json`, `guided_regex` or
/// `guided_choice` (each at the root, or in `nvext` when the root does not set it);
/// `guided_grammar` is not supported.
pub fn guided_decoding(
    response_format: Option<&ResponseFormat>,
    root: GuidedFields<'_>,
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
    let nvext = nvext.and_then(Value::as_object);
    if root
        .whitespace_pattern
        .is_some_and(|value| !value.is_null())
    {
        return Err(LlmError::Unsupported(
            "'guided_whitespace_pattern' is not supported; the engine picks the whitespace of guided JSON".to_owned(),
        ));
    }
    if let Some((name, _)) = sourced(
        root.grammar,
        nvext,
        ("guided_grammar", "nvext.guided_grammar"),
    ) {
        return Err(LlmError::Unsupported(format!(
            "'{name}' is not supported; use guided_json, guided_regex or guided_choice"
        )));
    }
    match sourced(root.json, nvext, ("guided_json", "nvext.guided_json")) {
        None => {}
        Some((name, Value::Object(schema))) => found.push((
            name,
            Guided::JsonSchema(Value::Object(schema.clone()).to_string()),
        )),
        Some((name, Value::String(text))) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(_)) => found.push((name, Guided::JsonSchema(text.clone()))),
            _ => return Err(not_a_schema(name)),
        },
        Some((name, _)) => return Err(not_a_schema(name)),
    }
    match sourced(root.regex, nvext, ("guided_regex", "nvext.guided_regex")) {
        None => {}
        Some((name, Value::String(pattern))) if !pattern.is_empty() => {
            regex_syntax::Parser::new()
                .parse(pattern)
                .map_err(|error| {
                    LlmError::invalid(
                        name,
                        format!("'{name}' is not a valid regular expression: {error}"),
                    )
                })?;
            found.push((name, Guided::Regex(pattern.clone())))
        }
        Some((name, _)) => {
            return Err(LlmError::invalid(
                name,
                format!("'{name}' must be a non-empty string"),
            ));
        }
    }
    match sourced(root.choice, nvext, ("guided_choice", "nvext.guided_choice")) {
        None => {}
        Some((name, Value::Array(items))) => found.push((name, choice(name, items)?)),
        Some((name, _)) => return Err(choice_error(name)),
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

fn choice(name: &'static str, items: &[Value]) -> Result<Guided, LlmError> {
    if items.is_empty() || items.len() > MAX_GUIDED_CHOICES {
        return Err(choice_error(name));
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(text) if !text.is_empty() => Ok(text.clone()),
            _ => Err(choice_error(name)),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Guided::Choice)
}

fn choice_error(name: &'static str) -> LlmError {
    LlmError::invalid(
        name,
        format!("'{name}' must be a list of 1 to {MAX_GUIDED_CHOICES} non-empty strings"),
    )
}

fn not_a_schema(name: &'static str) -> LlmError {
    LlmError::invalid(
        name,
        format!("'{name}' must be a JSON schema object (or its JSON text)"),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::openai::tools::JsonSchemaFormat;

    fn nvext_only(nvext: &Value) -> Result<Option<Guided>, LlmError> {
        guided_decoding(None, GuidedFields::default(), Some(nvext))
    }

    #[test]
    fn response_format_and_nvext_map_to_one_constraint() {
        let none = GuidedFields::default();
        assert_eq!(guided_decoding(None, none, None).unwrap(), None);
        assert_eq!(
            guided_decoding(Some(&ResponseFormat::Text), none, Some(&json!({}))).unwrap(),
            None
        );
        assert_eq!(
            guided_decoding(Some(&ResponseFormat::JsonObject), none, None).unwrap(),
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
            guided_decoding(Some(&format), none, None).unwrap(),
            Some(Guided::JsonSchema(r#"{"type":"integer"}"#.into()))
        );
        assert_eq!(
            nvext_only(&json!({"guided_regex": "[a-z]+"})).unwrap(),
            Some(Guided::Regex("[a-z]+".into()))
        );
        assert_eq!(
            nvext_only(&json!({"guided_choice": ["yes", "no"]})).unwrap(),
            Some(Guided::Choice(vec!["yes".into(), "no".into()]))
        );
        assert_eq!(
            nvext_only(&json!({"guided_json": "{\"type\":\"string\"}"})).unwrap(),
            Some(Guided::JsonSchema(r#"{"type":"string"}"#.into()))
        );
    }

    #[test]
    fn root_fields_constrain_and_win_over_nvext() {
        let regex = json!("[0-9]+");
        let choice = json!(["a", "b"]);
        let schema = json!({"type": "boolean"});
        let root = |json, regex, choice| GuidedFields {
            json,
            regex,
            choice,
            grammar: None,
            whitespace_pattern: None,
        };
        assert_eq!(
            guided_decoding(None, root(None, Some(&regex), None), None).unwrap(),
            Some(Guided::Regex("[0-9]+".into()))
        );
        assert_eq!(
            guided_decoding(None, root(Some(&schema), None, None), None).unwrap(),
            Some(Guided::JsonSchema(r#"{"type":"boolean"}"#.into()))
        );
        // The root choice replaces the nvext one rather than conflicting with it.
        assert_eq!(
            guided_decoding(
                None,
                root(None, None, Some(&choice)),
                Some(&json!({"guided_choice": ["x"]}))
            )
            .unwrap(),
            Some(Guided::Choice(vec!["a".into(), "b".into()]))
        );
        let null = Value::Null;
        assert_eq!(
            guided_decoding(
                None,
                root(None, Some(&null), None),
                Some(&json!({"guided_regex": "z"}))
            )
            .unwrap(),
            Some(Guided::Regex("z".into()))
        );
    }

    #[test]
    fn bad_or_conflicting_constraints_name_the_field() {
        let param = |result: Result<Option<Guided>, LlmError>| match result {
            Err(LlmError::InvalidRequest { param, .. }) => param,
            other => panic!("expected an invalid request, got {other:?}"),
        };
        let none = GuidedFields::default();
        assert_eq!(
            param(guided_decoding(
                Some(&ResponseFormat::JsonObject),
                none,
                Some(&json!({"guided_regex": "a"}))
            )),
            Some("nvext.guided_regex")
        );
        assert_eq!(
            param(nvext_only(&json!({"guided_regex": "(a"}))),
            Some("nvext.guided_regex")
        );
        assert_eq!(
            param(nvext_only(&json!({"guided_choice": []}))),
            Some("nvext.guided_choice")
        );
        assert_eq!(
            param(nvext_only(&json!({"guided_json": "[1]"}))),
            Some("nvext.guided_json")
        );
        let bad_regex = json!(7);
        let root_regex = GuidedFields {
            regex: Some(&bad_regex),
            ..GuidedFields::default()
        };
        assert_eq!(
            param(guided_decoding(None, root_regex, None)),
            Some("guided_regex")
        );
        let choice = json!(["a"]);
        let root_choice = GuidedFields {
            choice: Some(&choice),
            ..GuidedFields::default()
        };
        assert_eq!(
            param(guided_decoding(
                None,
                root_choice,
                Some(&json!({"guided_regex": "a"}))
            )),
            Some("guided_choice")
        );
    }

    #[test]
    fn a_grammar_is_not_implemented_and_named_where_it_was_given() {
        let message = |result: Result<Option<Guided>, LlmError>| match result {
            Err(LlmError::Unsupported(message)) => message,
            other => panic!("expected not implemented, got {other:?}"),
        };
        assert!(
            message(nvext_only(&json!({"guided_grammar": "root ::= x"})))
                .starts_with("'nvext.guided_grammar'")
        );
        let grammar = json!("root ::= x");
        let root = GuidedFields {
            grammar: Some(&grammar),
            ..GuidedFields::default()
        };
        assert!(message(guided_decoding(None, root, None)).starts_with("'guided_grammar'"));
        let pattern = json!("[ ]?");
        let root = GuidedFields {
            whitespace_pattern: Some(&pattern),
            ..GuidedFields::default()
        };
        assert!(
            message(guided_decoding(None, root, None)).starts_with("'guided_whitespace_pattern'")
        );
    }
}

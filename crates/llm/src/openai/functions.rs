//! Chat's legacy `functions` and `function_call`, the spelling of tools before `tools` existed.
//! They are read as `tools` and `tool_choice`; the response answers with `tool_calls` as it does
//! for tools (docs/http-api.md, "Tools").

use serde_json::Value;

use super::chat::ChatCompletionRequest;
use super::tools::{ChatTool, FunctionName, NamedToolChoice, ToolChoice, ToolChoiceMode};
use crate::error::LlmError;

impl ChatCompletionRequest {
    /// Moves `functions` into `tools` and `function_call` into `tool_choice`, leaving the legacy
    /// fields empty. Both spellings of one field at once is a 400 naming the legacy one.
    pub fn adopt_legacy_functions(&mut self) -> Result<(), LlmError> {
        if let Some(functions) = self.functions.take() {
            if self.tools.is_some() {
                return Err(LlmError::invalid(
                    "functions",
                    "'functions' and 'tools' cannot both be given; 'functions' is the deprecated \
                     spelling of 'tools'",
                ));
            }
            self.tools = Some(
                functions
                    .into_iter()
                    .map(|function| ChatTool {
                        kind: "function".to_owned(),
                        function,
                    })
                    .collect(),
            );
        }
        if let Some(call) = self.function_call.take() {
            if self.tool_choice.is_some() {
                return Err(LlmError::invalid(
                    "function_call",
                    "'function_call' and 'tool_choice' cannot both be given; 'function_call' is \
                     the deprecated spelling of 'tool_choice'",
                ));
            }
            self.tool_choice = Some(tool_choice(&call)?);
        }
        Ok(())
    }
}

fn tool_choice(call: &Value) -> Result<ToolChoice, LlmError> {
    match call {
        Value::String(mode) if mode == "none" => Ok(ToolChoice::Mode(ToolChoiceMode::None)),
        Value::String(mode) if mode == "auto" => Ok(ToolChoice::Mode(ToolChoiceMode::Auto)),
        Value::Object(named) => match named.get("name").and_then(Value::as_str) {
            Some(name) => Ok(ToolChoice::Named(NamedToolChoice {
                kind: "function".to_owned(),
                function: FunctionName {
                    name: name.to_owned(),
                },
            })),
            None => Err(bad_function_call()),
        },
        _ => Err(bad_function_call()),
    }
}

fn bad_function_call() -> LlmError {
    LlmError::invalid(
        "function_call",
        "'function_call' must be \"none\", \"auto\" or {\"name\": \"<function>\"}",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn adopted(body: Value) -> Result<ChatCompletionRequest, LlmError> {
        let mut request: ChatCompletionRequest = serde_json::from_value(body).unwrap();
        request.adopt_legacy_functions().map(|()| request)
    }

    fn base() -> Value {
        json!({
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "functions": [{"name": "weather", "parameters": {"type": "object"}}],
        })
    }

    #[test]
    fn functions_become_tools_and_function_call_the_tool_choice() {
        let mut body = base();
        body["function_call"] = json!({"name": "weather"});
        let request = adopted(body).unwrap();
        let tools = request.tools.as_deref().unwrap();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].kind, "function");
        assert_eq!(tools[0].function.name, "weather");
        assert!(matches!(
            &request.tool_choice,
            Some(ToolChoice::Named(named)) if named.function.name == "weather"
        ));
        assert_eq!(request.functions, None);
        assert_eq!(request.function_call, None);
        request.validate().unwrap();
        for (mode, expected) in [
            ("none", ToolChoiceMode::None),
            ("auto", ToolChoiceMode::Auto),
        ] {
            let mut body = base();
            body["function_call"] = json!(mode);
            assert_eq!(
                adopted(body).unwrap().tool_choice,
                Some(ToolChoice::Mode(expected))
            );
        }
        assert_eq!(adopted(base()).unwrap().tool_choice, None);
    }

    #[test]
    fn both_spellings_or_a_bad_function_call_are_400s_naming_the_legacy_field() {
        let mut both = base();
        both["tools"] = json!([{"type": "function", "function": {"name": "t"}}]);
        assert_eq!(adopted(both).unwrap_err().param(), Some("functions"));
        let mut both = base();
        both["function_call"] = json!("auto");
        both["tool_choice"] = json!("none");
        assert_eq!(adopted(both).unwrap_err().param(), Some("function_call"));
        for bad in [json!("required"), json!({"function": "x"}), json!(3)] {
            let mut body = base();
            body["function_call"] = bad;
            assert_eq!(adopted(body).unwrap_err().param(), Some("function_call"));
        }
        // A named function that is not among them fails validation like a named tool choice.
        let mut body = base();
        body["function_call"] = json!({"name": "time"});
        let error = adopted(body).unwrap().validate().unwrap_err();
        assert_eq!(error.param(), Some("tool_choice"));
    }
}

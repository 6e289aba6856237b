//! The Responses options that shape the output rather than the prompt: `include`, `truncation`,
//! `top_logprobs` and `max_tool_calls` (docs/http-api.md, "Responses API").

use crate::error::LlmError;

/// The `include` value that puts the log probabilities of the output text on its
/// `output_text` parts.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// `include` values that change nothing here: they ask for parts of items this server never
/// produces (built-in tool calls, input images, encrypted reasoning: reasoning comes back as plain
/// `reasoning_text`, and a reasoning item sent back as input is not rendered again), so the
/// output is the same with or without them. Agents such as Codex always ask for
/// `reasoning.encrypted_content`.
const INCLUDE_NO_EFFECT: &[&str] = &[
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
];

/// Whether the output text carries log probabilities: asked for by `include` or implied by a
/// positive `top_logprobs`. An unknown `include` value is a 400 naming `include`.
pub(super) fn wants_logprobs(
    include: Option<&[String]>,
    top_logprobs: Option<i64>,
) -> Result<bool, LlmError> {
    let mut is_logprobs = top_logprobs.is_some_and(|top| top > 0);
    for value in include.unwrap_or_default() {
        if value == INCLUDE_LOGPROBS {
            is_logprobs = true;
        } else if !INCLUDE_NO_EFFECT.contains(&value.as_str()) {
            return Err(LlmError::invalid(
                "include",
                format!("'include' value '{value}' is not a known include value"),
            ));
        }
    }
    Ok(is_logprobs)
}

/// `truncation`: `disabled` (the default) is what this server does; `auto` would drop input
/// items to fit the context, which it never does (a 501); anything else is a 400.
pub(super) fn check_truncation(truncation: Option<&str>) -> Result<(), LlmError> {
    match truncation {
        None | Some("disabled") => Ok(()),
        Some("auto") => Err(LlmError::Unsupported(
            "'truncation' \"auto\" is not supported: the input is never truncated; an input over the context length is a 400".to_owned(),
        )),
        Some(other) => Err(LlmError::invalid(
            "truncation",
            format!("'truncation' must be \"auto\" or \"disabled\", got {other:?}"),
        )),
    }
}

/// `max_tool_calls`: the most `function_call` items of a response, at least 0.
pub(super) fn max_tool_calls(value: Option<i64>) -> Result<Option<u32>, LlmError> {
    match value {
        None => Ok(None),
        Some(max) => u32::try_from(max).map(Some).map_err(|_| {
            LlmError::invalid(
                "max_tool_calls",
                format!("'max_tool_calls' must be an integer >= 0, got {max}"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LlmErrorCode;

    fn include(values: &[&str]) -> Vec<String> {
        values.iter().map(|value| (*value).to_owned()).collect()
    }

    #[test]
    fn logprobs_come_from_include_or_a_positive_top_logprobs() {
        assert!(!wants_logprobs(None, None).unwrap());
        assert!(!wants_logprobs(None, Some(0)).unwrap());
        assert!(wants_logprobs(None, Some(3)).unwrap());
        assert!(wants_logprobs(Some(&include(&[INCLUDE_LOGPROBS])), None).unwrap());
        assert!(!wants_logprobs(Some(&include(INCLUDE_NO_EFFECT)), None).unwrap());
    }

    #[test]
    fn encrypted_reasoning_is_accepted_and_an_unknown_include_is_a_400() {
        assert!(!wants_logprobs(Some(&include(&["reasoning.encrypted_content"])), None).unwrap());
        let error = wants_logprobs(Some(&include(&["message.nonsense"])), None).unwrap_err();
        assert_eq!(error.param(), Some("include"));
    }

    #[test]
    fn truncation_auto_is_a_501_and_a_bad_value_a_400() {
        check_truncation(None).unwrap();
        check_truncation(Some("disabled")).unwrap();
        let error = check_truncation(Some("auto")).unwrap_err();
        assert_eq!(error.code(), LlmErrorCode::NotImplemented);
        assert!(error.to_string().starts_with("'truncation'"), "{error}");
        assert_eq!(
            check_truncation(Some("sometimes")).unwrap_err().param(),
            Some("truncation")
        );
    }

    #[test]
    fn max_tool_calls_is_a_count() {
        assert_eq!(max_tool_calls(None).unwrap(), None);
        assert_eq!(max_tool_calls(Some(0)).unwrap(), Some(0));
        assert_eq!(max_tool_calls(Some(2)).unwrap(), Some(2));
        assert_eq!(
            max_tool_calls(Some(-1)).unwrap_err().param(),
            Some("max_tool_calls")
        );
    }
}

//! The request fields this release recognises but cannot honour: each is answered 501 with a
//! message naming it rather than being ignored (docs/http-api.md, "Fields answered 501").

use serde_json::{Map, Value};

use super::chat::ChatCompletionRequest;
use super::completion::CompletionRequest;
use crate::error::LlmError;

/// `logit_bias` is not in the worker contract yet: a non-empty one is refused.
pub(super) fn refuse_logit_bias(bias: Option<&Map<String, Value>>) -> Result<(), LlmError> {
    match bias {
        Some(bias) if !bias.is_empty() => Err(unsupported("'logit_bias' is not supported")),
        _ => Ok(()),
    }
}

/// Chat's output options for modalities, audio, predicted outputs and web search.
pub(super) fn refuse_chat_fields(request: &ChatCompletionRequest) -> Result<(), LlmError> {
    if let Some(modality) = request
        .modalities
        .iter()
        .flatten()
        .find(|modality| modality.as_str() != "text")
    {
        return Err(unsupported(format!(
            "'modalities' other than [\"text\"] are not supported (got {modality:?})"
        )));
    }
    for (name, value) in [
        ("audio", &request.audio),
        ("prediction", &request.prediction),
        ("web_search_options", &request.web_search_options),
    ] {
        if value.as_ref().is_some_and(|value| !value.is_null()) {
            return Err(unsupported(format!("'{name}' is not supported")));
        }
    }
    Ok(())
}

/// Completions' prompt log probabilities, `suffix` and server-side `best_of` candidates.
pub(super) fn refuse_completion_fields(request: &CompletionRequest) -> Result<(), LlmError> {
    if request.logprobs.is_some() && request.echo == Some(true) {
        return Err(unsupported(
            "'echo' with 'logprobs' (prompt log probabilities) is not supported",
        ));
    }
    if request
        .suffix
        .as_deref()
        .is_some_and(|suffix| !suffix.is_empty())
    {
        return Err(unsupported("'suffix' is not supported"));
    }
    if request
        .best_of
        .is_some_and(|best_of| best_of > request.n.unwrap_or(1))
    {
        return Err(unsupported("'best_of' greater than 'n' is not supported"));
    }
    Ok(())
}

fn unsupported(message: impl Into<String>) -> LlmError {
    LlmError::Unsupported(message.into())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::LlmErrorCode;

    fn chat(patch: Value) -> ChatCompletionRequest {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        body.as_object_mut()
            .unwrap()
            .extend(patch.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    fn completion(patch: Value) -> CompletionRequest {
        let mut body = json!({"model": "m", "prompt": "x"});
        body.as_object_mut()
            .unwrap()
            .extend(patch.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    fn not_implemented(result: Result<(), LlmError>) -> String {
        match result {
            Err(error) if error.code() == LlmErrorCode::NotImplemented => error.to_string(),
            other => panic!("expected a 501, got {other:?}"),
        }
    }

    #[test]
    fn chat_output_options_beyond_text_are_501s_naming_the_field() {
        for (patch, field) in [
            (json!({"modalities": ["text", "audio"]}), "'modalities'"),
            (
                json!({"audio": {"voice": "alloy", "format": "wav"}}),
                "'audio'",
            ),
            (
                json!({"prediction": {"type": "content", "content": "x"}}),
                "'prediction'",
            ),
            (json!({"web_search_options": {}}), "'web_search_options'"),
        ] {
            let message = not_implemented(chat(patch.clone()).validate());
            assert!(message.starts_with(field), "{patch}: {message}");
        }
        for accepted in [
            json!({"modalities": ["text"]}),
            json!({"audio": null, "prediction": null}),
            json!({"store": true, "metadata": {"k": "v"}, "service_tier": "auto",
                   "prompt_cache_key": "p", "safety_identifier": "s", "user": "u",
                   "verbosity": "low"}),
        ] {
            chat(accepted).validate().unwrap();
        }
    }

    #[test]
    fn best_of_below_n_is_a_400_and_above_n_a_501() {
        let error = completion(json!({"n": 2, "best_of": 1}))
            .validate()
            .unwrap_err();
        assert_eq!(error.param(), Some("best_of"));
        assert_eq!(error.code(), LlmErrorCode::InvalidArgument);
        let error = completion(json!({"best_of": 0})).validate().unwrap_err();
        assert_eq!(error.param(), Some("best_of"));
        let message = not_implemented(completion(json!({"n": 1, "best_of": 2})).validate());
        assert!(message.contains("'best_of'"), "{message}");
        completion(json!({"n": 2, "best_of": 2}))
            .validate()
            .unwrap();
    }

    #[test]
    fn logit_bias_suffix_and_prompt_logprobs_are_501s() {
        for patch in [
            json!({"logit_bias": {"42": 5}}),
            json!({"suffix": "end"}),
            json!({"echo": true, "logprobs": 1}),
        ] {
            not_implemented(completion(patch).validate());
        }
        not_implemented(chat(json!({"logit_bias": {"42": 5}})).validate());
        completion(json!({"logit_bias": {}, "suffix": ""}))
            .validate()
            .unwrap();
    }
}

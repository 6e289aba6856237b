//! The `nvext` fields that shape generation (docs/http-api.md, "nvext"): Dynamo's
//! `max_thinking_tokens` and `greed_sampling` are honoured; `use_raw_prompt`, `token_data` and
//! `annotations`, which would change the prompt or the stream, are answered 501. Routing fields are
//! read by the frontend's routing hints, guided fields by guided decoding.

use serde_json::{Map, Value};

use crate::error::LlmError;

/// What a request's `nvext` asks of sampling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct NvextSampling {
    /// `nvext.max_thinking_tokens`.
    pub max_thinking_tokens: Option<i64>,
    /// `nvext.greed_sampling`: sample greedily whatever the temperature.
    pub is_greedy: bool,
}

/// Reads and checks the sampling fields of `nvext`; a wrong type or a negative cap is a 400
/// naming the field, a field this release cannot honour a 501.
pub(super) fn nvext_sampling(nvext: Option<&Value>) -> Result<NvextSampling, LlmError> {
    let Some(nvext) = nvext.and_then(Value::as_object) else {
        return Ok(NvextSampling::default());
    };
    refuse_unsupported(nvext)?;
    let max_thinking_tokens = match set(nvext, "max_thinking_tokens") {
        None => None,
        Some(value) => match value.as_i64() {
            Some(tokens) if tokens >= 0 => Some(tokens),
            _ => {
                return Err(LlmError::invalid(
                    "nvext.max_thinking_tokens",
                    format!("'nvext.max_thinking_tokens' must be an integer >= 0, got {value}"),
                ));
            }
        },
    };
    let is_greedy = match set(nvext, "greed_sampling") {
        None => false,
        Some(Value::Bool(greedy)) => *greedy,
        Some(value) => {
            return Err(LlmError::invalid(
                "nvext.greed_sampling",
                format!("'nvext.greed_sampling' must be a boolean, got {value}"),
            ));
        }
    };
    Ok(NvextSampling {
        max_thinking_tokens,
        is_greedy,
    })
}

/// A raw prompt, a pre-tokenized prompt and out-of-band annotation events are not served.
fn refuse_unsupported(nvext: &Map<String, Value>) -> Result<(), LlmError> {
    let asked = |name: &str| match set(nvext, name) {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    };
    for name in ["use_raw_prompt", "token_data", "annotations"] {
        if asked(name) {
            return Err(LlmError::Unsupported(format!(
                "'nvext.{name}' is not supported"
            )));
        }
    }
    Ok(())
}

fn set<'a>(nvext: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    nvext.get(name).filter(|value| !value.is_null())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::LlmErrorCode;

    #[test]
    fn the_thinking_cap_and_greedy_sampling_are_read() {
        assert_eq!(nvext_sampling(None).unwrap(), NvextSampling::default());
        assert_eq!(
            nvext_sampling(Some(
                &json!({"max_thinking_tokens": 7, "greed_sampling": true})
            ))
            .unwrap(),
            NvextSampling {
                max_thinking_tokens: Some(7),
                is_greedy: true
            }
        );
        for (nvext, param) in [
            (
                json!({"max_thinking_tokens": -1}),
                "nvext.max_thinking_tokens",
            ),
            (
                json!({"max_thinking_tokens": "x"}),
                "nvext.max_thinking_tokens",
            ),
            (json!({"greed_sampling": 1}), "nvext.greed_sampling"),
        ] {
            let error = nvext_sampling(Some(&nvext)).unwrap_err();
            assert_eq!(error.param(), Some(param), "{nvext}");
        }
    }

    #[test]
    fn a_raw_or_pretokenized_prompt_and_annotations_are_501s_naming_them() {
        for (nvext, name) in [
            (json!({"use_raw_prompt": true}), "'nvext.use_raw_prompt'"),
            (json!({"token_data": [1, 2]}), "'nvext.token_data'"),
            (
                json!({"annotations": ["query_instance_id:1"]}),
                "'nvext.annotations'",
            ),
        ] {
            let error = nvext_sampling(Some(&nvext)).unwrap_err();
            assert_eq!(error.code(), LlmErrorCode::NotImplemented);
            assert!(error.to_string().starts_with(name), "{error}");
        }
        nvext_sampling(Some(
            &json!({"use_raw_prompt": false, "token_data": [], "annotations": []}),
        ))
        .unwrap();
    }
}

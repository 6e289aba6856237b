//! The `nvext` fields that shape generation (docs/http-api.md, "nvext"): Dynamo's
//! `max_thinking_tokens` and `greed_sampling` are honoured, and so are the legacy sampling
//! spellings `ignore_eos`, `top_k`, `min_p` and `repetition_penalty` (the top-level field wins);
//! `use_raw_prompt`, `token_data`, `annotations` and `guided_whitespace_pattern`, which would
//! change the prompt, the stream or the guided output, are answered 501. Routing fields are read
//! by the frontend's routing hints, guided fields by guided decoding.

use serde_json::{Map, Value};

use crate::error::LlmError;

/// What a request's `nvext` asks of sampling.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct NvextSampling {
    /// `nvext.max_thinking_tokens`.
    pub max_thinking_tokens: Option<i64>,
    /// `nvext.greed_sampling`: sample greedily whatever the temperature.
    pub is_greedy: bool,
    /// `nvext.ignore_eos`, unless the top-level `ignore_eos` is set.
    pub ignore_eos: Option<bool>,
    /// `nvext.top_k` (-1 or 0 disables), unless the top-level `top_k` is set.
    pub top_k: Option<i64>,
    /// `nvext.min_p`, 0 to 1, unless the top-level `min_p` is set.
    pub min_p: Option<f64>,
    /// `nvext.repetition_penalty`, > 0, unless the top-level `repetition_penalty` is set.
    pub repetition_penalty: Option<f64>,
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
    let ignore_eos = match set(nvext, "ignore_eos") {
        None => None,
        Some(Value::Bool(ignore)) => Some(*ignore),
        Some(value) => return Err(wrong("nvext.ignore_eos", "a boolean", value)),
    };
    let top_k = match set(nvext, "top_k") {
        None => None,
        Some(value) => match value.as_i64() {
            Some(k) if k >= -1 => Some(k),
            _ => return Err(wrong("nvext.top_k", "an integer >= -1", value)),
        },
    };
    let min_p = match set(nvext, "min_p") {
        None => None,
        Some(value) => match value.as_f64() {
            Some(p) if (0.0..=1.0).contains(&p) => Some(p),
            _ => return Err(wrong("nvext.min_p", "a number in [0, 1]", value)),
        },
    };
    let repetition_penalty = match set(nvext, "repetition_penalty") {
        None => None,
        Some(value) => match value.as_f64() {
            Some(penalty) if penalty > 0.0 && penalty.is_finite() => Some(penalty),
            _ => return Err(wrong("nvext.repetition_penalty", "a number > 0", value)),
        },
    };
    Ok(NvextSampling {
        max_thinking_tokens,
        is_greedy,
        ignore_eos,
        top_k,
        min_p,
        repetition_penalty,
    })
}

/// The 400 for a legacy sampling field (`param`, `nvext.<name>`) of the wrong type or out of
/// range.
fn wrong(param: &'static str, expected: &str, value: &Value) -> LlmError {
    LlmError::invalid(param, format!("'{param}' must be {expected}, got {value}"))
}

/// A raw prompt, a pre-tokenized prompt, out-of-band annotation events and a whitespace pattern
/// for guided JSON are not served.
fn refuse_unsupported(nvext: &Map<String, Value>) -> Result<(), LlmError> {
    let asked = |name: &str| match set(nvext, name) {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(Value::String(text)) => !text.is_empty(),
        Some(_) => true,
    };
    for name in [
        "use_raw_prompt",
        "token_data",
        "annotations",
        "guided_whitespace_pattern",
    ] {
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
                is_greedy: true,
                ..NvextSampling::default()
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
            (json!({"ignore_eos": "yes"}), "nvext.ignore_eos"),
            (json!({"top_k": -2}), "nvext.top_k"),
            (json!({"top_k": 1.5}), "nvext.top_k"),
            (json!({"min_p": 1.5}), "nvext.min_p"),
            (json!({"repetition_penalty": 0}), "nvext.repetition_penalty"),
            (
                json!({"repetition_penalty": "x"}),
                "nvext.repetition_penalty",
            ),
        ] {
            let error = nvext_sampling(Some(&nvext)).unwrap_err();
            assert_eq!(error.param(), Some(param), "{nvext}");
        }
    }

    #[test]
    fn the_legacy_sampling_spellings_are_read() {
        let nvext =
            json!({"ignore_eos": true, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2});
        assert_eq!(
            nvext_sampling(Some(&nvext)).unwrap(),
            NvextSampling {
                ignore_eos: Some(true),
                top_k: Some(5),
                min_p: Some(0.1),
                repetition_penalty: Some(1.2),
                ..NvextSampling::default()
            }
        );
        let nulls =
            json!({"ignore_eos": null, "top_k": null, "min_p": null, "repetition_penalty": null});
        assert_eq!(
            nvext_sampling(Some(&nulls)).unwrap(),
            NvextSampling::default()
        );
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
            (
                json!({"guided_whitespace_pattern": "[ ]?"}),
                "'nvext.guided_whitespace_pattern'",
            ),
        ] {
            let error = nvext_sampling(Some(&nvext)).unwrap_err();
            assert_eq!(error.code(), LlmErrorCode::NotImplemented);
            assert!(error.to_string().starts_with(name), "{error}");
        }
        nvext_sampling(Some(
            &json!({"use_raw_prompt": false, "token_data": [], "annotations": [],
                    "guided_whitespace_pattern": ""}),
        ))
        .unwrap();
    }
}

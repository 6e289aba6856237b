//! Request validation (docs/http-api.md, "Validation") and the normalized sampling options both
//! endpoints share.

use super::chat::ChatCompletionRequest;
use super::common::{Stop, StopField};
use super::completion::CompletionRequest;
use super::guided::{Guided, GuidedFields, guided_decoding};
use super::nvext::nvext_sampling;
use super::tools::{ResponseFormat, ToolChoice, ToolChoiceMode};
use super::unsupported::{refuse_chat_fields, refuse_completion_fields, refuse_logit_bias};
use crate::error::LlmError;
use crate::stop::{StopMatcher, TokenStopConditions};

/// OpenAI's limit on `stop` entries.
pub const MAX_STOP_SEQUENCES: usize = 4;

/// Longest stop string, in bytes: the stop matcher holds back and rescans up to this much text
/// on every token.
pub const MAX_STOP_STRING_BYTES: usize = 1024;

/// Most entries of `stop_token_ids`: every generated token is checked against them.
pub const MAX_STOP_TOKEN_IDS: usize = 256;
/// OpenAI's limit on `top_logprobs` (and vLLM's on completions `logprobs`).
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// The sampling and stop options of a chat or completions request, validated and in the units
/// an engine request uses, so the frontend builds the worker request from one shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOptions {
    /// Most tokens to generate (`max_completion_tokens` over `max_tokens`).
    pub max_tokens: Option<u32>,
    /// No EOS or stop before this many tokens.
    pub min_tokens: u32,
    /// Choices per prompt.
    pub n: u32,
    /// Temperature; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub top_p: Option<f32>,
    /// Top-k; `None` when unset or disabled (-1, 0).
    pub top_k: Option<u32>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stop token ids: integers in `stop` plus `stop_token_ids`.
    pub stop_token_ids: Vec<u32>,
    /// Generate through EOS.
    pub ignore_eos: bool,
    /// Leave special tokens out of the text (default true).
    pub skip_special_tokens: bool,
    /// Send the matched stop string.
    pub include_stop_str_in_output: bool,
    /// Alternatives per position when log probabilities are wanted, else `None`.
    pub logprobs: Option<u32>,
    /// Logprob tokens are named `token_id:<id>` instead of their text.
    pub return_tokens_as_token_ids: bool,
    /// The shape the output is constrained to, if any.
    pub guided: Option<Guided>,
    /// Most thinking tokens of a reasoning model (chat only).
    pub max_thinking_tokens: Option<u32>,
}

impl SamplingOptions {
    /// A stop-string matcher for one choice.
    pub fn stop_matcher(&self) -> StopMatcher {
        StopMatcher::new(self.stop.iter().cloned(), self.include_stop_str_in_output)
    }

    /// The token-level stop conditions, given the model's EOS ids.
    pub fn token_stop_conditions(&self, eos_token_ids: &[u32]) -> TokenStopConditions {
        TokenStopConditions {
            eos_token_ids: eos_token_ids.to_vec(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            min_tokens: self.min_tokens,
            max_tokens: self.max_tokens,
        }
    }
}

/// The fields both request types share, borrowed for validation and normalization.
struct Common<'a> {
    max_tokens: Option<i64>,
    n: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    stop: Option<&'a Stop>,
    stop_field: StopField,
    seed: Option<i64>,
    ignore_eos: Option<bool>,
    min_tokens: Option<i64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    repetition_penalty: Option<f64>,
    skip_special_tokens: Option<bool>,
    include_stop_str_in_output: Option<bool>,
    stop_token_ids: Option<&'a [u32]>,
    return_tokens_as_token_ids: Option<bool>,
    nvext: Option<&'a serde_json::Value>,
    response_format: Option<&'a ResponseFormat>,
    guided: GuidedFields<'a>,
}

impl Common<'_> {
    /// The guided constraint: `response_format`, the root guided fields, their `nvext` copies.
    fn guided(&self) -> Result<Option<Guided>, LlmError> {
        guided_decoding(self.response_format, self.guided, self.nvext)
    }
}

impl ChatCompletionRequest {
    fn common(&self) -> Common<'_> {
        Common {
            max_tokens: self.effective_max_tokens(),
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            stop: self.stop.as_ref(),
            stop_field: self.stop_field,
            seed: self.seed,
            ignore_eos: self.ignore_eos,
            min_tokens: self.min_tokens,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            skip_special_tokens: self.skip_special_tokens,
            include_stop_str_in_output: self.include_stop_str_in_output,
            stop_token_ids: self.stop_token_ids.as_deref(),
            return_tokens_as_token_ids: self.return_tokens_as_token_ids,
            nvext: self.nvext.as_ref(),
            response_format: self.response_format.as_ref(),
            guided: GuidedFields {
                json: self.guided_json.as_ref(),
                regex: self.guided_regex.as_ref(),
                choice: self.guided_choice.as_ref(),
                grammar: self.guided_grammar.as_ref(),
                whitespace_pattern: self.guided_whitespace_pattern.as_ref(),
            },
        }
    }

    /// Checks the request (docs/http-api.md, "Validation"); the error names the offending field.
    pub fn validate(&self) -> Result<(), LlmError> {
        if self.messages.is_empty() {
            return Err(LlmError::invalid(
                "messages",
                "'messages' must contain at least one message",
            ));
        }
        at_least("max_tokens", self.max_tokens, 1)?;
        at_least("max_completion_tokens", self.max_completion_tokens, 1)?;
        if let Some(top_logprobs) = self.top_logprobs {
            in_int_range("top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS)?;
            if top_logprobs > 0 && self.logprobs != Some(true) {
                return Err(LlmError::invalid(
                    "top_logprobs",
                    "'logprobs' must be true when 'top_logprobs' is used",
                ));
            }
        }
        if self.continue_final_message == Some(true) && self.add_generation_prompt == Some(true) {
            return Err(LlmError::invalid(
                "continue_final_message",
                "'continue_final_message' and 'add_generation_prompt' cannot both be true",
            ));
        }
        self.common().guided()?;
        refuse_logit_bias(self.logit_bias.as_ref())?;
        refuse_chat_fields(self)?;
        self.validate_tool_choice()?;
        at_least("max_thinking_tokens", self.max_thinking_tokens, 0)?;
        validate_common(&self.common())
    }

    /// A forcing `tool_choice` needs tools, and a named one a tool of that name.
    fn validate_tool_choice(&self) -> Result<(), LlmError> {
        let tools = self.tools.as_deref().unwrap_or_default();
        match &self.tool_choice {
            Some(ToolChoice::Mode(ToolChoiceMode::Required)) if tools.is_empty() => {
                Err(LlmError::invalid(
                    "tool_choice",
                    "'tool_choice' is 'required' but no 'tools' were given",
                ))
            }
            Some(ToolChoice::Named(named))
                if !tools
                    .iter()
                    .any(|tool| tool.function.name == named.function.name) =>
            {
                Err(LlmError::invalid(
                    "tool_choice",
                    format!(
                        "'tool_choice' names the function '{}', which is not in 'tools'",
                        named.function.name
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// The normalized sampling options; call after [`Self::validate`].
    pub fn sampling_options(&self) -> SamplingOptions {
        let logprobs =
            (self.logprobs == Some(true)).then(|| to_u32(self.top_logprobs.unwrap_or(0)));
        let guided = self.common().guided().ok().flatten();
        let max_thinking_tokens = self.max_thinking_tokens.or_else(|| {
            nvext_sampling(self.nvext.as_ref())
                .ok()
                .and_then(|nvext| nvext.max_thinking_tokens)
        });
        SamplingOptions {
            max_thinking_tokens: max_thinking_tokens.map(to_u32),
            ..normalize(&self.common(), logprobs, guided)
        }
    }
}

impl CompletionRequest {
    fn common(&self) -> Common<'_> {
        Common {
            max_tokens: self.max_tokens,
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            stop: self.stop.as_ref(),
            stop_field: StopField::Stop,
            seed: self.seed,
            ignore_eos: self.ignore_eos,
            min_tokens: self.min_tokens,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            skip_special_tokens: self.skip_special_tokens,
            include_stop_str_in_output: self.include_stop_str_in_output,
            stop_token_ids: self.stop_token_ids.as_deref(),
            return_tokens_as_token_ids: self.return_tokens_as_token_ids,
            nvext: self.nvext.as_ref(),
            response_format: self.response_format.as_ref(),
            guided: GuidedFields {
                json: self.guided_json.as_ref(),
                regex: self.guided_regex.as_ref(),
                choice: self.guided_choice.as_ref(),
                grammar: self.guided_grammar.as_ref(),
                whitespace_pattern: self.guided_whitespace_pattern.as_ref(),
            },
        }
    }

    /// Checks the request (docs/http-api.md, "Validation"); the error names the offending field.
    pub fn validate(&self) -> Result<(), LlmError> {
        if self.prompt.is_empty() || self.prompt.has_empty_prompt() {
            return Err(LlmError::invalid("prompt", "'prompt' must not be empty"));
        }
        at_least("max_tokens", self.max_tokens, 1)?;
        if let Some(logprobs) = self.logprobs {
            in_int_range("logprobs", logprobs, 0, MAX_TOP_LOGPROBS)?;
        }
        let n = self.n.unwrap_or(1);
        if let Some(best_of) = self.best_of.filter(|best_of| *best_of < n) {
            return Err(LlmError::invalid(
                "best_of",
                format!("'best_of' must be at least 'n' ({n}), got {best_of}"),
            ));
        }
        refuse_completion_fields(self)?;
        self.common().guided()?;
        refuse_logit_bias(self.logit_bias.as_ref())?;
        validate_common(&self.common())
    }

    /// The normalized sampling options; call after [`Self::validate`].
    pub fn sampling_options(&self) -> SamplingOptions {
        let guided = self.common().guided().ok().flatten();
        normalize(&self.common(), self.logprobs.map(to_u32), guided)
    }
}

fn validate_common(c: &Common<'_>) -> Result<(), LlmError> {
    nvext_sampling(c.nvext)?;
    at_least("n", c.n, 1)?;
    float_range("temperature", c.temperature, 0.0, 2.0, true)?;
    float_range("top_p", c.top_p, 0.0, 1.0, false)?;
    float_range("presence_penalty", c.presence_penalty, -2.0, 2.0, true)?;
    float_range("frequency_penalty", c.frequency_penalty, -2.0, 2.0, true)?;
    float_range("min_p", c.min_p, 0.0, 1.0, true)?;
    let (stop_field, max_stops) = c.stop_field.name_and_limit();
    let num_stops = c.stop.map_or(0, Stop::len);
    if num_stops > max_stops {
        return Err(LlmError::invalid(
            stop_field,
            format!("'{stop_field}' may hold at most {max_stops} sequences, got {num_stops}"),
        ));
    }
    if let Some(longest) = c.stop.and_then(|stop| stop.strings().map(str::len).max())
        && longest > MAX_STOP_STRING_BYTES
    {
        return Err(LlmError::invalid(
            stop_field,
            format!("a stop sequence may be at most {MAX_STOP_STRING_BYTES} bytes, got {longest}"),
        ));
    }
    let num_stop_ids = c.stop_token_ids.map_or(0, <[u32]>::len);
    if num_stop_ids > MAX_STOP_TOKEN_IDS {
        return Err(LlmError::invalid(
            "stop_token_ids",
            format!(
                "'stop_token_ids' may hold at most {MAX_STOP_TOKEN_IDS} ids, got {num_stop_ids}"
            ),
        ));
    }
    at_least("min_tokens", c.min_tokens, 0)?;
    match (c.min_tokens, c.max_tokens) {
        (Some(min), Some(max)) if min > max => {
            return Err(LlmError::invalid(
                "min_tokens",
                format!("'min_tokens' ({min}) must not exceed 'max_tokens' ({max})"),
            ));
        }
        _ => {}
    }
    at_least("top_k", c.top_k, -1)?;
    match c.repetition_penalty {
        Some(penalty) if !(penalty > 0.0 && penalty.is_finite()) => Err(LlmError::invalid(
            "repetition_penalty",
            format!("'repetition_penalty' must be greater than 0, got {penalty}"),
        )),
        _ => Ok(()),
    }
}

fn normalize(c: &Common<'_>, logprobs: Option<u32>, guided: Option<Guided>) -> SamplingOptions {
    let mut stop_token_ids: Vec<u32> = c.stop.map(|s| s.token_ids().collect()).unwrap_or_default();
    stop_token_ids.extend(c.stop_token_ids.unwrap_or_default());
    let nvext = nvext_sampling(c.nvext).unwrap_or_default();
    let is_greedy = nvext.is_greedy;
    let top_k = c.top_k.or(nvext.top_k);
    let min_p = c.min_p.or(nvext.min_p);
    let repetition_penalty = c.repetition_penalty.or(nvext.repetition_penalty);
    SamplingOptions {
        max_tokens: c.max_tokens.map(to_u32),
        min_tokens: c.min_tokens.map(to_u32).unwrap_or(0),
        n: c.n.map(to_u32).unwrap_or(1),
        temperature: if is_greedy {
            Some(0.0)
        } else {
            c.temperature.map(|v| v as f32)
        },
        top_p: c.top_p.map(|v| v as f32),
        top_k: top_k.filter(|k| *k > 0).map(to_u32),
        min_p: min_p.map(|v| v as f32),
        presence_penalty: c.presence_penalty.map(|v| v as f32),
        frequency_penalty: c.frequency_penalty.map(|v| v as f32),
        repetition_penalty: repetition_penalty.map(|v| v as f32),
        seed: c.seed,
        stop: c
            .stop
            .map(|s| s.strings().map(str::to_owned).collect())
            .unwrap_or_default(),
        stop_token_ids,
        ignore_eos: c.ignore_eos.or(nvext.ignore_eos).unwrap_or(false),
        skip_special_tokens: c.skip_special_tokens.unwrap_or(true),
        include_stop_str_in_output: c.include_stop_str_in_output.unwrap_or(false),
        logprobs,
        return_tokens_as_token_ids: c.return_tokens_as_token_ids.unwrap_or(false),
        guided,
        max_thinking_tokens: None,
    }
}

/// The `max_tokens` to send to the engine: the request's, or what is left of the context.
/// Errors when the prompt alone or the prompt plus `max_tokens` exceed `context_length`;
/// `prompt_param` is `"messages"` or `"prompt"`.
pub fn fit_max_tokens(
    prompt_tokens: usize,
    max_tokens: Option<u32>,
    context_length: u32,
    prompt_param: &'static str,
) -> Result<u32, LlmError> {
    let prompt = u64::try_from(prompt_tokens).unwrap_or(u64::MAX);
    let context = u64::from(context_length);
    match max_tokens {
        Some(max) if prompt + u64::from(max) > context => Err(LlmError::invalid(
            "max_tokens",
            format!(
                "This model's maximum context length is {context} tokens. However, you requested \
                 {} tokens ({prompt} in the {prompt_param}, {max} in the completion). Please \
                 reduce the length of the {prompt_param} or completion.",
                prompt + u64::from(max)
            ),
        )),
        Some(max) => Ok(max),
        None if prompt >= context => Err(LlmError::invalid(
            prompt_param,
            format!(
                "This model's maximum context length is {context} tokens. However, your \
                 {prompt_param} resulted in {prompt} tokens. Please reduce the length of the \
                 {prompt_param}."
            ),
        )),
        None => Ok(u32::try_from(context - prompt).unwrap_or(u32::MAX)),
    }
}

fn to_u32(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

fn at_least(param: &'static str, value: Option<i64>, min: i64) -> Result<(), LlmError> {
    match value {
        Some(v) if v < min => Err(LlmError::invalid(
            param,
            format!(
                "Invalid '{param}': integer below minimum value. Expected a value >= {min}, but \
                 got {v} instead."
            ),
        )),
        _ => Ok(()),
    }
}

fn in_int_range(param: &'static str, value: i64, min: i64, max: i64) -> Result<(), LlmError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(LlmError::invalid(
        param,
        format!("Invalid '{param}': expected a value between {min} and {max}, but got {value}."),
    ))
}

fn float_range(
    param: &'static str,
    value: Option<f64>,
    min: f64,
    max: f64,
    is_min_inclusive: bool,
) -> Result<(), LlmError> {
    let Some(v) = value else {
        return Ok(());
    };
    let above_min = if is_min_inclusive { v >= min } else { v > min };
    if above_min && v <= max {
        return Ok(());
    }
    let open = if is_min_inclusive { '[' } else { '(' };
    Err(LlmError::invalid(
        param,
        format!("Invalid '{param}': expected a value in {open}{min}, {max}], but got {v}."),
    ))
}

#[cfg(test)]
mod tests;

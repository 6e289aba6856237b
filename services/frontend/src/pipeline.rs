//! Per-model preprocessing and postprocessing: chat template, tokenizer, and the per-choice output
//! processor (incremental detokenization plus stop strings). Loaded once per model; nothing here
//! reloads per request.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kvmesh_llm::openai::{ChatCompletionRequest, Guided, SamplingOptions};
use kvmesh_llm::reasoning::ReasoningFormat;
use kvmesh_llm::tool_calls::ToolCallFormat;
use kvmesh_llm::{Detokenizer, EncodedPrompt, LlmError, ModelDir, StopMatcher, Tokenizer};
use kvmesh_proto::v1::ModelCard;
use kvmesh_proto::v1::{
    GenerateRequest, OutputOptions as WireOutput, SamplingOptions as WireSampling, StopConditions,
};

use crate::error::FrontendError;
use crate::preprocess::{Preprocess, RequestTimer, Stage, timed};

/// A model's tokenizer, template and limits.
pub struct Pipeline {
    model: ModelDir,
    context_length: u32,
    preprocess: Arc<Preprocess>,
    tool_format: Option<ToolCallFormat>,
    reasoning_format: Option<ReasoningFormat>,
    /// The frontend flag, unless the card turns it off.
    exclude_tools_when_tool_choice_none: bool,
}

impl Pipeline {
    /// Loads the model directory with the process's tokenizer engine; the card's context length
    /// wins over the directory's config. With `--tokenizer-fallback false` a model the engine
    /// cannot serve fails to load.
    pub fn load(
        path: &Path,
        card: &ModelCard,
        preprocess: &Arc<Preprocess>,
    ) -> Result<Self, LlmError> {
        let model = ModelDir::load_with(path, preprocess.engine)?;
        if let Some(reason) = model.tokenizer_fallback()
            && preprocess.strict_engine
        {
            return Err(LlmError::Tokenizer(format!(
                "--tokenizer {} cannot serve {} (--tokenizer-fallback is off): {reason}",
                preprocess.engine,
                path.display()
            )));
        }
        let context_length = if card.context_length > 0 {
            card.context_length
        } else {
            model.context_length().unwrap_or(u32::MAX)
        };
        let runtime = card.runtime_config.clone().unwrap_or_default();
        let tool_format = card_parser(
            runtime.tool_call_parser.as_deref(),
            "tool-call",
            &ToolCallFormat::NAMES,
            ToolCallFormat::from_name,
        );
        let reasoning_format = card_parser(
            runtime.reasoning_parser.as_deref(),
            "reasoning",
            &ReasoningFormat::NAMES,
            ReasoningFormat::from_name,
        );
        Ok(Self {
            model,
            context_length,
            preprocess: preprocess.clone(),
            tool_format,
            reasoning_format,
            exclude_tools_when_tool_choice_none: preprocess.exclude_tools_when_tool_choice_none
                && runtime.exclude_tools_when_tool_choice_none.unwrap_or(true),
        })
    }

    /// The syntax the model marks its thinking with, from its card's `reasoning_parser`.
    pub fn reasoning_format(&self) -> Option<ReasoningFormat> {
        self.reasoning_format
    }

    /// The syntax the model writes tool calls in, from its card's `tool_call_parser`.
    pub fn tool_format(&self) -> Option<ToolCallFormat> {
        self.tool_format
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        self.model.tokenizer()
    }

    /// Maximum prompt plus output tokens.
    pub fn context_length(&self) -> u32 {
        self.context_length
    }

    /// The process's preprocessing (engine, prefix cache, pool, stage metrics).
    pub fn preprocess(&self) -> &Arc<Preprocess> {
        &self.preprocess
    }

    /// Renders the chat template for a request and tokenizes the prompt through the prefix
    /// cache (ids and cut points); on the preprocessing pool when the request's body had
    /// `body_len` bytes at or above its threshold.
    pub async fn chat_prompt(
        &self,
        request: &Arc<ChatCompletionRequest>,
        body_len: usize,
        timer: &mut RequestTimer,
    ) -> Result<EncodedPrompt, FrontendError> {
        let template = self.model.require_chat_template()?.clone();
        let tokenizer = self.tokenizer().clone();
        let cache = self.preprocess.cache.clone();
        let latency = self.preprocess.metrics.tokenizer_latency_tokenize.clone();
        let request = request.clone();
        let exclude_tools = self.exclude_tools_when_tool_choice_none;
        let (prompt, render_time, tokenize_time) = self
            .preprocess
            .offload(body_len, move || {
                let rendering = Instant::now();
                let text = template.render_request_with(&request, exclude_tools)?;
                let render_time = rendering.elapsed();
                let tokenizing = Instant::now();
                let prompt = timed(&latency, || cache.encode_with_cuts(&tokenizer, text))?;
                Ok::<_, FrontendError>((prompt, render_time, tokenizing.elapsed()))
            })
            .await?;
        timer.record(Stage::Template, render_time);
        timer.record(Stage::Tokenize, tokenize_time);
        Ok(prompt)
    }

    /// Tokenizes a raw text prompt (completions), adding the tokenizer's special tokens.
    pub async fn text_prompt(
        &self,
        text: &str,
        timer: &mut RequestTimer,
    ) -> Result<Vec<u32>, FrontendError> {
        let tokenizing = Instant::now();
        let ids = self.preprocess.encode_text(self.tokenizer(), text).await?;
        timer.record(Stage::Tokenize, tokenizing.elapsed());
        Ok(ids)
    }

    /// Decodes prompt tokens back to text (completions `echo`).
    pub fn decode(&self, ids: &[u32]) -> Result<String, FrontendError> {
        Ok(self.tokenizer().decode(ids, false)?)
    }

    /// The output processor of one choice.
    pub fn output(&self, sampling: &SamplingOptions, prompt: &[u32]) -> OutputProcessor {
        OutputProcessor {
            detokenizer: Detokenizer::with_prompt(
                self.tokenizer().clone(),
                prompt,
                sampling.skip_special_tokens,
            ),
            stop: sampling.stop_matcher(),
            min_tokens: sampling.min_tokens,
            generated: 0,
        }
    }

    /// Checks the prompt against the context length and returns the engine's max_tokens.
    pub fn fit_max_tokens(
        &self,
        num_prompt_tokens: usize,
        max_tokens: Option<u32>,
        prompt_param: &'static str,
    ) -> Result<u32, FrontendError> {
        Ok(kvmesh_llm::openai::fit_max_tokens(
            num_prompt_tokens,
            max_tokens,
            self.context_length,
            prompt_param,
        )?)
    }
}

/// The output parser a model card names; an unknown name is logged and no parser is used, so
/// the output stays text.
fn card_parser<T>(
    name: Option<&str>,
    kind: &str,
    known: &[&str],
    from_name: fn(&str) -> Option<T>,
) -> Option<T> {
    let name = name.filter(|name| !name.is_empty())?;
    let parser = from_name(name);
    if parser.is_none() {
        tracing::warn!(
            parser = name,
            ?known,
            "the model card names an unknown {kind} parser; its output stays in the text"
        );
    }
    parser
}

/// Builds the worker request from validated sampling options.
pub fn generate_request(
    request_id: String,
    model: &str,
    token_ids: Vec<u32>,
    sampling: &SamplingOptions,
    max_tokens: u32,
) -> GenerateRequest {
    GenerateRequest {
        request_id,
        model: model.to_string(),
        token_ids,
        sampling: Some(WireSampling {
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k.map(|k| k.min(i32::MAX as u32) as i32),
            min_p: sampling.min_p,
            repetition_penalty: sampling.repetition_penalty,
            presence_penalty: sampling.presence_penalty,
            frequency_penalty: sampling.frequency_penalty,
            seed: sampling.seed.map(|seed| seed as u64),
            greedy: sampling.temperature == Some(0.0),
            guided_json_schema: match &sampling.guided {
                Some(Guided::JsonSchema(schema)) => Some(schema.clone()),
                _ => None,
            },
            guided_regex: match &sampling.guided {
                Some(Guided::Regex(pattern)) => Some(pattern.clone()),
                _ => None,
            },
            guided_choice: match &sampling.guided {
                Some(Guided::Choice(choices)) => choices.clone(),
                _ => Vec::new(),
            },
        }),
        stop: Some(StopConditions {
            max_tokens: Some(max_tokens),
            min_tokens: (sampling.min_tokens > 0).then_some(sampling.min_tokens),
            stop_token_ids: sampling.stop_token_ids.clone(),
            ignore_eos: sampling.ignore_eos,
            stop: sampling.stop.clone(),
            max_thinking_tokens: sampling.max_thinking_tokens,
        }),
        output: Some(WireOutput {
            logprobs: sampling.logprobs,
            prompt_logprobs: None,
            skip_special_tokens: sampling.skip_special_tokens,
        }),
        ..Default::default()
    }
}

/// Turns one choice's token ids into client text: detokenizes incrementally and applies stop
/// strings (the matched string is not returned).
pub struct OutputProcessor {
    detokenizer: Detokenizer,
    stop: StopMatcher,
    /// Stop strings are not looked for until this many tokens were generated (as in vLLM).
    min_tokens: u32,
    generated: u32,
}

/// Text released by one push.
#[derive(Debug, Default)]
pub struct OutputStep {
    /// Text safe to send now.
    pub text: String,
    /// A stop string matched: generation for this choice is over.
    pub stopped: bool,
}

impl OutputProcessor {
    /// Feeds generated token ids.
    pub fn push_tokens(&mut self, ids: &[u32]) -> OutputStep {
        if ids.is_empty() || self.stop.is_stopped() {
            return OutputStep::default();
        }
        let piece = match self.detokenizer.push_all(ids) {
            Ok(piece) => piece,
            Err(error) => {
                tracing::warn!(%error, "detokenization failed");
                return OutputStep::default();
            }
        };
        self.generated = self
            .generated
            .saturating_add(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        if self.generated < self.min_tokens {
            return OutputStep {
                text: piece,
                stopped: false,
            };
        }
        let step = self.stop.push(&piece);
        OutputStep {
            text: step.text.into_owned(),
            stopped: step.matched.is_some(),
        }
    }

    /// The stop string that ended the choice, if one did.
    pub fn matched_stop(&self) -> Option<&str> {
        self.stop.matched_stop()
    }

    /// Ends the choice: returns pending and held-back text.
    pub fn flush(&mut self) -> String {
        if self.stop.is_stopped() {
            return String::new();
        }
        let pending = self.detokenizer.finish().unwrap_or_default();
        let mut text = self.stop.push(&pending).text.into_owned();
        if !self.stop.is_stopped() {
            text.push_str(&self.stop.finish());
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(stop: &str, min_tokens: u32) -> (OutputProcessor, Arc<Tokenizer>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
        let tokenizer = Arc::new(Tokenizer::from_file(dir.join("tokenizer.json")).unwrap());
        let processor = OutputProcessor {
            detokenizer: Detokenizer::new(tokenizer.clone(), true),
            stop: StopMatcher::new([stop.to_string()], false),
            min_tokens,
            generated: 0,
        };
        (processor, tokenizer)
    }

    fn run(processor: &mut OutputProcessor, ids: &[u32]) -> (String, bool) {
        let mut text = String::new();
        for id in ids {
            let step = processor.push_tokens(&[*id]);
            text += &step.text;
            if step.stopped {
                return (text, true);
            }
        }
        text += &processor.flush();
        (text, false)
    }

    #[test]
    fn stop_strings_wait_for_min_tokens() {
        let (_, tokenizer) = processor(".", 0);
        let ids = tokenizer.encode("One. Two. Three.", false).unwrap();
        let (mut eager, _) = processor(".", 0);
        assert_eq!(run(&mut eager, &ids), ("One".to_string(), true));
        // The first period comes before min_tokens tokens: it is text, the next one stops.
        let first_period = (1..=ids.len())
            .find(|&n| tokenizer.decode(&ids[..n], true).unwrap().contains('.'))
            .unwrap();
        let (mut patient, _) = processor(".", first_period as u32 + 1);
        let (text, stopped) = run(&mut patient, &ids);
        assert!(stopped);
        assert_eq!(text, "One. Two");
    }
}

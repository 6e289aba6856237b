//! The text-completion request path, shared by `POST /v1/completions` and the KServe edge (whose
//! requests are completions): checks, tokenizing, the token budget, and the start of the
//! generation through the model's routing seam. Each edge parses its own protocol before this and
//! frames the resulting deltas after it.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use kvmesh_llm::openai::{CompletionRequest, Prompt, SamplingOptions};
use kvmesh_routing::RoutingHints;

use crate::choices;
use crate::error::FrontendError;
use crate::generate::{FirstResponseWait, TextDelta};
use crate::http::openai_shared::check_supported;
use crate::logprobs::LogprobText;
use crate::models::ModelEntry;
use crate::pipeline::generate_request;
use crate::preprocess::{RequestTimer, Stage};

/// Validates a parsed completion request and returns its sampling options: invalid values are
/// the client's mistake, options this release cannot honour are not implemented.
pub fn check(request: &CompletionRequest) -> Result<SamplingOptions, FrontendError> {
    request.validate()?;
    let sampling = request.sampling_options();
    check_supported(&sampling)?;
    if request.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(FrontendError::NotImplemented(
            "suffix is not supported".into(),
        ));
    }
    match request.prompt.len() {
        1 => Ok(sampling),
        0 => Err(FrontendError::invalid(
            "prompt must not be empty",
            Some("prompt"),
        )),
        several => Err(FrontendError::NotImplemented(format!(
            "{several} prompts in one request are not supported yet; send one prompt per request"
        ))),
    }
}

/// How the edge wants the generation started.
pub struct StartSettings {
    /// The request id the worker and the logs see.
    pub request_id: String,
    /// Pins, priorities and session.
    pub hints: RoutingHints,
    /// Deadline for the worker's first response.
    pub response_timeout: Option<Duration>,
    /// How long to wait for the first response before the edge commits.
    pub wait: FirstResponseWait,
    /// The edge's span of the request (docs/tracing.md).
    pub trace: kvmesh_runtime::otel::Trace,
}

/// A started completion: its text deltas, the worker it runs on, and the echoed prompt.
pub struct StartedCompletion<D> {
    /// The deltas; dropping them cancels the worker.
    pub deltas: D,
    /// The worker serving the request.
    pub worker_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// The prompt text when the request asked for `echo`.
    pub echoed: Option<String>,
    /// Names the tokens of the log probabilities, when the request asked for them.
    pub logprobs: Option<LogprobText>,
}

/// Tokenizes the checked `request`'s prompt, fits its token budget to the model and starts it
/// through `entry`'s routing seam.
pub async fn start(
    entry: &Arc<ModelEntry>,
    request: &CompletionRequest,
    sampling: &SamplingOptions,
    mut timer: RequestTimer,
    settings: StartSettings,
) -> Result<
    StartedCompletion<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + use<>>,
    FrontendError,
> {
    // A pre-tokenized prompt past the model's context is refused before it is copied.
    let num_given_tokens = match &request.prompt {
        Prompt::Tokens(tokens) => Some(tokens.len()),
        Prompt::TokenBatches(batches) => batches.first().map(Vec::len),
        Prompt::Text(_) | Prompt::Texts(_) => None,
    };
    if let Some(num_tokens) = num_given_tokens {
        entry
            .pipeline
            .fit_max_tokens(num_tokens, sampling.max_tokens, "prompt")?;
    }
    let prompt = match &request.prompt {
        Prompt::Text(text) => entry.pipeline.text_prompt(text, &mut timer).await?,
        Prompt::Texts(texts) => {
            let text = texts.first().map(String::as_str).unwrap_or("");
            entry.pipeline.text_prompt(text, &mut timer).await?
        }
        Prompt::Tokens(tokens) => tokens.clone(),
        Prompt::TokenBatches(batches) => batches.first().cloned().unwrap_or_default(),
    };
    if prompt.is_empty() {
        return Err(FrontendError::invalid(
            "prompt must not be empty",
            Some("prompt"),
        ));
    }
    let vocab_size = entry.pipeline.tokenizer().vocab_size();
    if vocab_size > 0
        && let Some(unknown) = prompt.iter().find(|id| **id as usize >= vocab_size)
    {
        return Err(FrontendError::invalid(
            format!("token id {unknown} is out of vocabulary (size {vocab_size})"),
            Some("prompt"),
        ));
    }
    let echoed = if request.echo.unwrap_or(false) {
        Some(match &request.prompt {
            Prompt::Text(text) => text.clone(),
            Prompt::Texts(texts) => texts.first().cloned().unwrap_or_default(),
            _ => entry.pipeline.decode(&prompt)?,
        })
    } else {
        None
    };
    let max_tokens = entry
        .pipeline
        .fit_max_tokens(prompt.len(), sampling.max_tokens, "prompt")?;
    let outputs: Vec<_> = (0..sampling.n.max(1))
        .map(|_| entry.pipeline.output(sampling, &prompt))
        .collect();
    let num_prompt_tokens = prompt.len() as u32;
    let worker_request = generate_request(
        settings.request_id.clone(),
        &entry.name,
        prompt,
        sampling,
        max_tokens,
    );
    timer.record_since_arrival(Stage::Preprocess);
    let options = crate::generate::GenerateOptions {
        hints: settings.hints,
        prefix_cuts: Vec::new().into(),
        response_timeout: settings.response_timeout,
        wait: settings.wait,
        trace: settings.trace,
    };
    let generations = choices::start_all(entry, worker_request, sampling.n, options).await?;
    let worker_id = generations[0].worker_id();
    let dp_rank = generations[0].dp_rank();
    let deltas = choices::text_deltas(
        generations,
        outputs,
        num_prompt_tokens,
        &entry.metrics,
        timer,
        &settings.request_id,
    );
    Ok(StartedCompletion {
        deltas,
        worker_id,
        dp_rank,
        echoed,
        logprobs: LogprobText::new(entry.pipeline.tokenizer(), sampling),
    })
}

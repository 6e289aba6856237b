//! Requests with `n > 1` choices: each choice is its own worker request, routed and generated on
//! its own, and their deltas merge into one stream tagged by choice index (docs/http-api.md,
//! "Several choices").

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kvmesh_proto::v1::GenerateRequest;
use kvmesh_router::Generation;

use crate::error::FrontendError;
use crate::generate::{self, DeltaStream, GenerateOptions, TextDelta, TokenUsage};
use crate::metrics::ModelMetrics;
use crate::models::ModelEntry;
use crate::pipeline::OutputProcessor;
use crate::preprocess::RequestTimer;

/// The worker request of choice `index`: choice 0 is `request` itself; a later one gets the
/// request id `<id>-<index>` and, when the request is seeded, the seed plus `index`, so sampled
/// choices differ while each stays reproducible (greedy choices are alike, as on a real engine).
pub fn choice_request(request: &GenerateRequest, index: u32) -> GenerateRequest {
    let mut choice = request.clone();
    if index > 0 {
        choice.request_id = format!("{}-{index}", request.request_id);
        if let Some(sampling) = choice.sampling.as_mut()
            && let Some(seed) = sampling.seed.as_mut()
        {
            *seed = seed.wrapping_add(u64::from(index));
        }
    }
    choice
}

/// Starts the `n` choices of a request together; fails (cancelling any started) when one fails.
pub async fn start_all(
    entry: &Arc<ModelEntry>,
    request: GenerateRequest,
    n: u32,
    options: GenerateOptions,
) -> Result<Vec<Generation>, FrontendError> {
    // The first choice takes the request itself: a long prompt is not copied for n = 1.
    let others: Vec<GenerateRequest> = (1..n.max(1))
        .map(|index| choice_request(&request, index))
        .collect();
    let starts = std::iter::once(request)
        .chain(others)
        .map(|request| generate::start(entry, request, options.clone()));
    futures::future::try_join_all(starts).await
}

/// The text deltas of started choices, one output processor each: the one stream of a single
/// choice as it is, several merged by [`merge`].
pub fn text_deltas(
    generations: Vec<Generation>,
    outputs: Vec<OutputProcessor>,
    num_prompt_tokens: u32,
    metrics: &ModelMetrics,
    timer: RequestTimer,
    request_id: &str,
) -> DeltaStream {
    let mut choices: Vec<_> = generations
        .into_iter()
        .zip(outputs)
        .enumerate()
        .map(|(index, (generation, output))| {
            let id = match index {
                0 => request_id.to_string(),
                index => format!("{request_id}-{index}"),
            };
            generate::text_deltas(
                generation,
                output,
                num_prompt_tokens,
                metrics.clone(),
                timer.clone(),
                id,
            )
        })
        .collect();
    if choices.len() == 1
        && let Some(only) = choices.pop()
    {
        return only;
    }
    merge(choices).boxed()
}

/// Merges the deltas of a request's choices, tagging each with its choice index. A finishing
/// choice's own usage is taken off its delta; the last choice to finish carries the request's:
/// prompt tokens once, completion tokens summed. So, as with one choice, the delta that carries
/// usage is the last one. An error of any choice ends the stream (and cancels the others).
pub fn merge<S>(choices: Vec<S>) -> impl Stream<Item = Result<TextDelta, FrontendError>> + Send
where
    S: Stream<Item = Result<TextDelta, FrontendError>> + Send + 'static,
{
    let mut unfinished = choices.len();
    let tagged = choices
        .into_iter()
        .enumerate()
        .map(|(index, deltas)| deltas.map(move |delta| (index as u32, delta)).boxed());
    let mut all = futures::stream::select_all(tagged);
    let mut total: Option<TokenUsage> = None;
    async_stream::stream! {
        while let Some((index, delta)) = all.next().await {
            let mut delta = match delta {
                Ok(delta) => delta,
                Err(error) => {
                    yield Err(error);
                    return;
                }
            };
            delta.index = index;
            if let Some(usage) = delta.usage.take() {
                unfinished -= 1;
                let sum = total.get_or_insert(TokenUsage {
                    completion_tokens: 0,
                    ..usage
                });
                sum.completion_tokens += usage.completion_tokens;
                if unfinished == 0 {
                    delta.usage = total;
                }
            }
            yield Ok(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use kvmesh_proto::v1::SamplingOptions;

    use super::*;

    fn delta(text: &str, usage: Option<u32>) -> Result<TextDelta, FrontendError> {
        Ok(TextDelta {
            text: text.into(),
            usage: usage.map(|completion_tokens| TokenUsage {
                prompt_tokens: 5,
                completion_tokens,
                cached_tokens: 2,
            }),
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn choices_are_tagged_and_only_the_last_finish_carries_the_summed_usage() {
        let a = futures::stream::iter(vec![delta("a", None), delta("b", Some(3))]);
        let b = futures::stream::iter(vec![delta("c", Some(4))]);
        let merged: Vec<TextDelta> = merge(vec![a, b]).map(Result::unwrap).collect().await;
        assert_eq!(merged.len(), 3);
        let (with_usage, without): (Vec<_>, Vec<_>) =
            merged.iter().partition(|delta| delta.usage.is_some());
        assert_eq!(without.len(), 2);
        let usage = with_usage[0].usage.unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (5, 7));
        assert!(merged.last().unwrap().usage.is_some());
        let mut texts: Vec<(u32, &str)> =
            merged.iter().map(|d| (d.index, d.text.as_str())).collect();
        texts.sort();
        assert_eq!(texts, vec![(0, "a"), (0, "b"), (1, "c")]);
    }

    #[tokio::test]
    async fn an_error_of_one_choice_ends_the_stream() {
        let a = futures::stream::iter(vec![Err(FrontendError::invalid("boom", None))]);
        let b = futures::stream::iter(vec![delta("c", Some(4))]);
        let merged: Vec<_> = merge(vec![a.boxed(), b.boxed()]).collect().await;
        assert!(merged.iter().any(Result::is_err));
        assert!(merged.last().unwrap().is_err());
    }

    #[test]
    fn later_choices_get_their_own_id_and_seed() {
        let request = GenerateRequest {
            request_id: "r".into(),
            sampling: Some(SamplingOptions {
                seed: Some(10),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(choice_request(&request, 0), request);
        let second = choice_request(&request, 2);
        assert_eq!(second.request_id, "r-2");
        assert_eq!(second.sampling.unwrap().seed, Some(12));
    }
}

//! A started generation as its caller reads it: the worker's responses with the request's life
//! reported to its decider, and migration to another worker when the worker fails mid-stream.

use std::time::Duration;

use futures::StreamExt;
use kvmesh_proto::v1::{FinishReason, GenerateRequest, GenerateResponse};
use kvmesh_runtime::ErrorCode;
use kvmesh_runtime::otel::{KeyValue, Trace};
use kvmesh_runtime::worker_client::ResponseStream;

use super::{
    DEFAULT_INTER_RESPONSE_TIMEOUT, GenerateOptions, ModelRouter, StartTimings, Started,
    is_migratable, terminal_path_of, worker_error, worker_failure, worker_outcome,
};
use crate::decider::RouteLease;
use crate::fleet::untried_workers;
use kvmesh_routing::error::RouteError;
use kvmesh_routing::request::TerminalPath;

/// A request's original form and what is left of its migration budget.
pub(super) struct Resume {
    pub(super) model: ModelRouter,
    pub(super) request: GenerateRequest,
    /// The options of a restart: mid-stream the caller has its answer committed already, so a
    /// restart waits for the new worker's first response (a worker that fails at once is then
    /// tried again here, within the budget).
    pub(super) options: GenerateOptions,
    pub(super) remaining: u32,
}

/// A generation in progress. [`Generation::next`] yields the worker's responses (one may carry
/// several tokens) until the one with a finish reason, or a failure that could not be migrated.
/// The worker's load is released once, on the path the request ends by: completed, failed,
/// migrated away, or, when dropped unfinished, disconnected (the worker is cancelled then too).
pub struct Generation {
    worker_id: u64,
    dp_rank: u32,
    first: Option<GenerateResponse>,
    stream: ResponseStream,
    lease: Option<Box<dyn RouteLease>>,
    resume: Option<Resume>,
    /// When the current worker's first response is overdue, until it arrives.
    first_deadline: Option<tokio::time::Instant>,
    /// The longest silence between two responses once the first arrived.
    silence_limit: Duration,
    prompt_len: usize,
    /// Tokens streamed so far, kept only while the request may migrate.
    generated: Vec<u32>,
    is_first_token_reported: bool,
    has_migrated: bool,
    is_done: bool,
    timings: StartTimings,
    /// The span of the current worker attempt (off when tracing is).
    span: Trace,
}

impl Generation {
    pub(super) fn new(
        started: Started,
        resume: Option<Resume>,
        prompt_len: usize,
        timeout_override: Option<Duration>,
    ) -> Self {
        Self {
            worker_id: started.worker_id,
            dp_rank: started.dp_rank,
            first_deadline: started.first.is_none().then_some(started.first_deadline),
            first: started.first,
            stream: started.stream,
            lease: started.lease,
            timings: started.timings,
            span: started.span,
            resume,
            silence_limit: timeout_override.unwrap_or(DEFAULT_INTER_RESPONSE_TIMEOUT),
            prompt_len,
            generated: Vec::new(),
            is_first_token_reported: false,
            has_migrated: false,
            is_done: false,
        }
    }

    /// The worker serving the request now.
    pub fn worker_id(&self) -> u64 {
        self.worker_id
    }

    /// Its data-parallel rank.
    pub fn dp_rank(&self) -> u32 {
        self.dp_rank
    }

    /// Where the first start spent its time.
    pub fn timings(&self) -> StartTimings {
        self.timings
    }

    /// The next response; `None` after the last one. A response after a migration reports the
    /// original prompt's length in its usage, not the prompt plus the tokens already streamed.
    pub async fn next(&mut self) -> Option<Result<GenerateResponse, RouteError>> {
        if self.is_done {
            return None;
        }
        loop {
            let next = match self.first.take() {
                Some(response) => Ok(response),
                None => {
                    match next_response(&mut self.stream, self.first_deadline, self.silence_limit)
                        .await
                    {
                        Some(Ok(response)) => {
                            self.first_deadline = None;
                            worker_outcome(response)
                        }
                        Some(Err(error)) => Err(error),
                        None => Err(worker_error(
                            ErrorCode::Unavailable,
                            "worker stream ended without a finish reason",
                        )),
                    }
                }
            };
            match next {
                Ok(response) => return Some(Ok(self.account(response))),
                Err(error) => {
                    self.span.fail(&error);
                    // Boxed: a migration holds a whole route-and-start, which would otherwise
                    // size every call's future (one per token) for a path rarely taken.
                    if Box::pin(self.migrate(&error)).await {
                        continue;
                    }
                    self.end(terminal_path_of(&error));
                    return Some(Err(error));
                }
            }
        }
    }

    /// The caller ended the request itself (a stop string matched): it completed, and the worker
    /// is cancelled.
    pub fn complete(&mut self) {
        self.end(TerminalPath::Completed);
        self.stream = futures::stream::empty().boxed();
    }

    /// Reports `response`'s tokens to the decider and tracks them for migration.
    fn account(&mut self, mut response: GenerateResponse) -> GenerateResponse {
        let num_tokens = response.token_ids.len() as u64;
        if self.resume.is_some() && num_tokens > 0 {
            self.generated.extend_from_slice(&response.token_ids);
            let total = self.prompt_len + self.generated.len();
            let max_seq_len = self
                .resume
                .as_ref()
                .and_then(|r| r.model.inner.migration.max_seq_len);
            if let (Some(limit), Some(resume)) = (max_seq_len, &self.resume)
                && total as u64 > u64::from(limit)
            {
                resume.model.inner.observer.past_max_seq_len();
                self.resume = None;
                self.generated = Vec::new();
            }
        }
        if num_tokens > 0
            && let Some(lease) = &self.lease
        {
            // The first token ends prefill; later ones matter only when the decider tracks
            // output blocks, so the common case takes no router lock per token.
            if lease.tracks_output_tokens() {
                lease.add_output_tokens(num_tokens, !self.is_first_token_reported);
            } else if !self.is_first_token_reported {
                lease.first_token();
            }
            if !self.is_first_token_reported {
                self.span.event("first_token");
            }
            self.is_first_token_reported = true;
        }
        if self.has_migrated
            && let Some(usage) = response.usage.as_mut()
        {
            usage.prompt_tokens = u32::try_from(self.prompt_len).unwrap_or(u32::MAX);
        }
        let finish = FinishReason::try_from(response.finish_reason).unwrap_or_default();
        if finish != FinishReason::Unspecified {
            self.end(TerminalPath::Completed);
        }
        response
    }

    /// Releases the request's load by `path` (once) and ends the generation.
    fn end(&mut self, path: TerminalPath) {
        self.is_done = true;
        self.resume = None;
        self.span.end();
        if let Some(lease) = self.lease.take() {
            lease.finish(path);
        }
    }

    /// Moves the request to another worker after `error`: its prompt plus the tokens already
    /// streamed, `max_tokens` reduced by their count. Returns whether it moved; `false` when the
    /// budget is spent, the error is not migratable, or no worker takes it.
    async fn migrate(&mut self, error: &RouteError) -> bool {
        let Some(state) = self.resume.as_mut() else {
            return false;
        };
        if state.remaining == 0 || !is_migratable(error) {
            return false;
        }
        state.remaining -= 1;
        let model = state.model.clone();
        let mut request = state.request.clone();
        let generated = &self.generated;
        request.token_ids.extend_from_slice(generated);
        let generated_len = u32::try_from(generated.len()).unwrap_or(u32::MAX);
        if let Some(stop) = request.stop.as_mut() {
            if let Some(max_tokens) = stop.max_tokens.as_mut() {
                *max_tokens = max_tokens.saturating_sub(generated_len);
                if *max_tokens == 0 {
                    return false;
                }
            }
            stop.min_tokens = stop.min_tokens.map(|min| min.saturating_sub(generated_len));
        }
        let migration = request.migration.get_or_insert_default();
        migration.num_migrations += 1;
        migration.generated_token_ids = generated.clone();
        let mut options = state.options.clone();
        // The failed worker is still listed until its lease expires: route around it.
        let allowed = untried_workers(
            model.workers().iter().map(|w| w.id),
            &[self.worker_id],
            options.hints.allowed_worker_ids.as_ref(),
        );
        if allowed.is_empty() {
            return false;
        }
        options.hints.allowed_worker_ids = Some(allowed);
        let kind = if generated.is_empty() {
            "new_request"
        } else {
            "ongoing_request"
        };
        // One span per migration: the new decision and worker attempt are its children.
        options.trace = state.options.trace.internal("migration");
        let span = options.trace.clone();
        span.set_with(|| {
            vec![
                KeyValue::new("kvmesh.migration", i64::from(migration.num_migrations)),
                KeyValue::new("kvmesh.from_worker_id", format!("{:x}", self.worker_id)),
                KeyValue::new("kvmesh.generated_tokens", i64::from(generated_len)),
                KeyValue::new("kvmesh.reason", error.to_string()),
            ]
        });
        self.span.end();
        let moved = model.start(request, &options, &mut state.remaining).await;
        if let Err(next_error) = &moved {
            span.fail(next_error);
        }
        span.end();
        match moved {
            Ok(moved) => {
                model.inner.observer.migrated(kind);
                tracing::info!(%error, from = %format!("{:x}", self.worker_id), to = %format!("{:x}", moved.worker_id), kind, "request migrated");
                if let Some(lease) = self.lease.take() {
                    lease.finish(TerminalPath::Migrated);
                }
                self.worker_id = moved.worker_id;
                self.dp_rank = moved.dp_rank;
                self.first_deadline = moved.first.is_none().then_some(moved.first_deadline);
                self.first = moved.first;
                self.stream = moved.stream;
                self.lease = moved.lease;
                self.span = moved.span;
                self.is_first_token_reported = false;
                self.has_migrated = true;
                true
            }
            Err(next_error) => {
                tracing::warn!(%error, %next_error, "migration failed");
                false
            }
        }
    }
}

/// The worker's next response. Missing `first_deadline` (while the first response is awaited)
/// or a silence longer than `limit` after it is a timeout failure (migratable: a stalled worker
/// whose connection still answers keepalives looks exactly like this).
async fn next_response(
    stream: &mut ResponseStream,
    first_deadline: Option<tokio::time::Instant>,
    limit: Duration,
) -> Option<Result<GenerateResponse, RouteError>> {
    let deadline = first_deadline.unwrap_or_else(|| tokio::time::Instant::now() + limit);
    match tokio::time::timeout_at(deadline, stream.next()).await {
        Ok(next) => next.map(|response| response.map_err(worker_failure)),
        Err(_) if first_deadline.is_some() => Some(Err(worker_error(
            ErrorCode::Timeout,
            "worker sent no first response within its deadline",
        ))),
        Err(_) => Some(Err(worker_error(
            ErrorCode::Timeout,
            format!("worker silent for {} s", limit.as_secs()),
        ))),
    }
}

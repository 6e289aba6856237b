//! The engine side of a request, shared by every endpoint: pick a worker, start the generation,
//! and turn the worker's token stream into text deltas with stop handling.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kvmesh_proto::v1::{FinishReason, GenerateRequest, GenerateResponse};
use kvmesh_runtime::worker_client::ResponseStream;

use kvmesh_llm::openai::FinishReason as OpenAiFinish;
use kvmesh_router::fleet::untried_workers;
use kvmesh_router::{
    Decision, RemoteLease, RouteError, RouteGuard, RouteRequest, RoutingHints, TerminalPath,
    route_with_index,
};

use crate::error::FrontendError;
use crate::models::{ModelEntry, WorkerRef};
use crate::opts::RemoteRouterMode;
use crate::pipeline::OutputProcessor;

/// Token accounting reported to the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens found in the worker's KV cache.
    pub cached_tokens: u32,
}

/// One step of output for a client.
#[derive(Debug, Default)]
pub struct TextDelta {
    /// New text (may be empty).
    pub text: String,
    /// Generated token ids behind this text.
    pub num_tokens: u32,
    /// OpenAI finish reason on the last delta.
    pub finish_reason: Option<OpenAiFinish>,
    /// Usage, on the last delta.
    pub usage: Option<TokenUsage>,
}

/// A started generation: the worker that serves it and its response stream.
pub struct Started {
    /// Worker instance id.
    pub worker_id: u64,
    /// Data-parallel rank, when the worker reported it.
    pub dp_rank: u32,
    /// The first response, already received (pre-commit peek).
    first: Option<GenerateResponse>,
    stream: ResponseStream,
    /// The worker's load held for this request; released when the stream ends or is dropped.
    guard: Option<Lease>,
    /// What migrating the request needs (`--migration-limit` above 0).
    resume: Option<Resume>,
    /// Longest silence allowed between the worker's responses
    /// (`DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS`); `None` waits as long as the connection lives.
    silence_limit: Option<Duration>,
}

/// A request's original form and what is left of its migration budget (docs/routing.md,
/// "Migration").
struct Resume {
    entry: Arc<ModelEntry>,
    request: GenerateRequest,
    hints: RoutingHints,
    first_response_timeout: Option<Duration>,
    remaining: u32,
}

/// How long [`start`] waits for the worker's first response before handing the stream back
/// (docs/http-api.md, "Pre-commit peek"): an error that arrives within the wait becomes the
/// response's own status, one after it an error inside the committed stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstResponseWait {
    /// Until it arrives (unary responses are read whole before anything is sent).
    Full,
    /// At most this long (`DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS`).
    UpTo(Duration),
    /// Not at all: the stream commits once the worker accepted the request.
    None,
}

/// How many workers one request tries before giving up, when the earlier ones are unreachable.
const MAX_START_ATTEMPTS: usize = 3;

/// Routes `request` and starts it, waiting for the first response so that early failures become
/// proper error statuses. The route guard travels with the returned stream and releases the
/// worker's load when the stream ends or is dropped. A worker that cannot be reached (dead but not
/// yet expired from discovery) is freed as an error and the request is routed again among the
/// workers not tried yet: nothing has reached the client, so retrying is safe.
pub async fn start(
    entry: &Arc<ModelEntry>,
    request: GenerateRequest,
    hints: RoutingHints,
    first_response_timeout: Option<Duration>,
    wait: FirstResponseWait,
) -> Result<Started, FrontendError> {
    let resume = (entry.migration_limit > 0).then(|| Resume {
        entry: entry.clone(),
        request: request.clone(),
        hints: hints.clone(),
        first_response_timeout,
        remaining: entry.migration_limit,
    });
    let mut started = start_routed(entry, request, hints, first_response_timeout, wait).await?;
    started.resume = resume;
    Ok(started)
}

/// [`start`] without the migration state.
async fn start_routed(
    entry: &Arc<ModelEntry>,
    request: GenerateRequest,
    hints: RoutingHints,
    first_response_timeout: Option<Duration>,
    wait: FirstResponseWait,
) -> Result<Started, FrontendError> {
    let num_attempts = MAX_START_ATTEMPTS.min(entry.workers.len()).max(1);
    let mut hints = hints;
    let mut tried: Vec<u64> = Vec::new();
    let mut request = Some(request);
    let mut last_error = None;
    for attempt in 0..num_attempts {
        if !tried.is_empty() {
            let allowed = untried_workers(
                entry.workers.iter().map(|w| w.id),
                &tried,
                hints.allowed_worker_ids.as_ref(),
            );
            if allowed.is_empty() {
                break;
            }
            hints.allowed_worker_ids = Some(allowed);
        }
        // Only a request that may be retried is copied; the last attempt takes the original.
        let this_request = if attempt + 1 == num_attempts {
            request.take()
        } else {
            request.clone()
        };
        let Some(mut this_request) = this_request else {
            break;
        };
        let guard = route(entry, &this_request, hints.clone()).await?;
        let decision = guard.decision();
        let worker_id = decision.worker_id;
        if let Some(rank) = decision.dp_rank {
            this_request.routing.get_or_insert_default().dp_rank = Some(rank);
        }
        let Some(worker) = entry.workers.iter().find(|w| w.id == worker_id) else {
            // Routed to a worker this table version does not list (a race with discovery).
            guard.finish(TerminalPath::Error);
            tried.push(worker_id);
            last_error = Some(FrontendError::NoWorkers(entry.name.clone()));
            continue;
        };
        match start_on(worker, this_request, first_response_timeout, wait).await {
            Ok(mut started) => {
                started.guard = Some(guard);
                return Ok(started);
            }
            Err(error) if is_unreachable(&error) => {
                guard.finish(TerminalPath::Error);
                tracing::warn!(worker_id = %format!("{:x}", worker.id), %error, "worker unreachable, trying another");
                tried.push(worker_id);
                last_error = Some(error);
            }
            Err(error) => {
                guard.finish(TerminalPath::Error);
                return Err(error);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| FrontendError::NoWorkers(entry.name.clone())))
}

/// A routed request's hold on its worker's load, from the in-process router or a remote
/// replica. Both release the request on every terminal path, drop included.
#[derive(Debug)]
pub enum Lease {
    /// Decided by this process's router.
    Local(RouteGuard),
    /// Decided by a `kvmesh-router` replica; its life is reported back to it.
    Remote(RemoteLease),
}

impl Lease {
    /// Where the request goes.
    pub fn decision(&self) -> &Decision {
        match self {
            Lease::Local(guard) => guard.decision(),
            Lease::Remote(lease) => lease.decision(),
        }
    }

    /// Whether tokens after the first change the router's state (`--router-track-output-blocks`
    /// on the in-process router or on the replica that decided).
    fn tracks_output_tokens(&self) -> bool {
        match self {
            Lease::Local(guard) => guard.tracks_output_tokens(),
            Lease::Remote(lease) => lease.tracks_output_tokens(),
        }
    }

    fn first_token(&self) {
        match self {
            Lease::Local(guard) => guard.first_token(),
            Lease::Remote(lease) => lease.first_token(),
        }
    }

    fn add_output_tokens(&self, num_tokens: u64, is_first: bool) {
        match self {
            Lease::Local(guard) => guard.add_output_tokens(num_tokens),
            Lease::Remote(lease) => lease.add_output_tokens(num_tokens, is_first),
        }
    }

    fn finish(self, path: TerminalPath) {
        match self {
            Lease::Local(guard) => guard.finish(path),
            Lease::Remote(lease) => lease.finish(path),
        }
    }
}

/// Asks the model's router for a worker: a remote replica when `--use-remote-router` says so,
/// else the in-process router (reading the prompt's overlap from the indexer shards first when
/// the decision needs it).
async fn route(
    entry: &ModelEntry,
    request: &GenerateRequest,
    hints: RoutingHints,
) -> Result<Lease, FrontendError> {
    let route_request = RouteRequest {
        request_id: kvmesh_router::unique_route_id(&request.request_id),
        token_ids: &request.token_ids,
        lora_name: (!request.lora_name.is_empty()).then_some(request.lora_name.as_str()),
        cache_salt: None,
        hints,
    };
    if entry.remote_mode == RemoteRouterMode::On && entry.remote.is_none() {
        return Err(RouteError::Unreachable("router replicas cannot be watched".into()).into());
    }
    if let Some(remote) = entry.active_remote() {
        let mut lease = remote.route(&entry.name, &route_request).await?;
        lease.set_report_every(entry.kv_cache_block_size);
        return Ok(Lease::Remote(lease));
    }
    let guard = route_with_index(&entry.router, entry.indexer.as_ref(), &route_request).await?;
    Ok(Lease::Local(guard))
}

fn is_unreachable(error: &FrontendError) -> bool {
    matches!(
        error,
        FrontendError::Worker {
            code: kvmesh_runtime::ErrorCode::Unavailable,
            ..
        }
    )
}

async fn start_on(
    worker: &WorkerRef,
    request: GenerateRequest,
    first_response_timeout: Option<Duration>,
    wait: FirstResponseWait,
) -> Result<Started, FrontendError> {
    let worker_id = worker.id;
    let routed_rank = request.routing.as_ref().and_then(|r| r.dp_rank);
    // One deadline for opening the stream and, when waited for, its first response.
    let deadline = first_response_timeout.map(|limit| (limit, tokio::time::Instant::now() + limit));
    let mut stream = by_deadline(deadline, worker.endpoint.generate(request)).await??;
    let first = match wait {
        FirstResponseWait::Full => Some(by_deadline(deadline, stream.next()).await?),
        FirstResponseWait::UpTo(peek) => tokio::time::timeout(peek, stream.next()).await.ok(),
        FirstResponseWait::None => None,
    };
    let first = match first {
        None => None,
        Some(Some(Ok(response))) => Some(worker_outcome(response)?),
        Some(Some(Err(status))) => return Err(status.into()),
        Some(None) => {
            return Err(FrontendError::Worker {
                code: kvmesh_runtime::ErrorCode::Unavailable,
                message: "worker closed the stream without a response".into(),
            });
        }
    };
    let dp_rank = first
        .as_ref()
        .and_then(|first| first.worker.as_ref().map(|w| w.dp_rank))
        .or(routed_rank)
        .unwrap_or(0);
    Ok(Started {
        worker_id,
        dp_rank,
        first,
        stream,
        guard: None,
        resume: None,
        silence_limit: first_response_timeout,
    })
}

/// `work`, unless `deadline` (the limit and when it runs out) passes first.
async fn by_deadline<T>(
    deadline: Option<(Duration, tokio::time::Instant)>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, FrontendError> {
    match deadline {
        Some((limit, at)) => tokio::time::timeout_at(at, work)
            .await
            .map_err(|_| FrontendError::Timeout(limit.as_secs())),
        None => Ok(work.await),
    }
}

/// The worker's next response; a silence longer than `limit` is a timeout failure (migratable:
/// a stalled worker whose connection still answers keepalives looks exactly like this).
async fn next_response(
    stream: &mut ResponseStream,
    limit: Option<Duration>,
) -> Option<Result<GenerateResponse, FrontendError>> {
    let next = match limit {
        Some(limit) => match tokio::time::timeout(limit, stream.next()).await {
            Ok(next) => next,
            Err(_) => {
                return Some(Err(FrontendError::Worker {
                    code: kvmesh_runtime::ErrorCode::Timeout,
                    message: format!("worker silent for {} s", limit.as_secs()),
                }));
            }
        },
        None => stream.next().await,
    };
    next.map(|response| response.map_err(FrontendError::from))
}

/// A worker's response, or the failure it reports: an `ERROR` finish, or a `CANCELLED` one (the
/// frontend cancels only by dropping the stream, so a cancellation from the worker means it gave
/// the request up, e.g. when shutting down). Both then take the failure path: another worker at
/// the start, migration mid-stream, an error for the client otherwise — never a quiet end.
fn worker_outcome(response: GenerateResponse) -> Result<GenerateResponse, FrontendError> {
    match FinishReason::try_from(response.finish_reason) {
        Ok(FinishReason::Error) => Err(FrontendError::Worker {
            code: kvmesh_runtime::ErrorCode::Internal,
            message: if response.error.is_empty() {
                "worker failed".into()
            } else {
                response.error
            },
        }),
        Ok(FinishReason::Cancelled) => Err(FrontendError::Worker {
            code: kvmesh_runtime::ErrorCode::Unavailable,
            message: "worker gave up the request (shutting down?)".into(),
        }),
        _ => Ok(response),
    }
}

/// Whether a worker failure lets the request continue elsewhere (docs/routing.md, "Migration"):
/// the worker could not be reached, went away or shut down; never a cancellation, an overload or
/// a rejected request.
fn is_migratable(error: &FrontendError) -> bool {
    matches!(
        error,
        FrontendError::Worker {
            code: kvmesh_runtime::ErrorCode::Unavailable
                | kvmesh_runtime::ErrorCode::Internal
                | kvmesh_runtime::ErrorCode::Timeout,
            ..
        }
    )
}

/// Moves a request that failed mid-stream to another worker: its prompt plus the tokens already
/// streamed, `max_tokens` reduced by their count. Returns the new generation, or `None` when the
/// budget is spent, the error is not migratable, or no worker takes it.
async fn migrate(
    resume: &mut Option<Resume>,
    generated: &[u32],
    failed_worker: u64,
    error: &FrontendError,
) -> Option<Started> {
    let state = resume.as_mut()?;
    if state.remaining == 0 || !is_migratable(error) {
        return None;
    }
    state.remaining -= 1;
    let entry = state.entry.clone();
    let mut request = state.request.clone();
    request.token_ids.extend_from_slice(generated);
    let generated_len = u32::try_from(generated.len()).unwrap_or(u32::MAX);
    if let Some(stop) = request.stop.as_mut()
        && let Some(max_tokens) = stop.max_tokens.as_mut()
    {
        *max_tokens = max_tokens.saturating_sub(generated_len);
        if *max_tokens == 0 {
            return None;
        }
    }
    if let Some(stop) = request.stop.as_mut() {
        stop.min_tokens = stop.min_tokens.map(|min| min.saturating_sub(generated_len));
    }
    let migration = request.migration.get_or_insert_default();
    migration.num_migrations += 1;
    migration.generated_token_ids = generated.to_vec();
    let mut hints = state.hints.clone();
    // The failed worker is still listed until its lease expires: route around it.
    let allowed = untried_workers(
        entry.workers.iter().map(|w| w.id),
        &[failed_worker],
        hints.allowed_worker_ids.as_ref(),
    );
    if allowed.is_empty() {
        return None;
    }
    hints.allowed_worker_ids = Some(allowed);
    let kind = if generated.is_empty() {
        "new_request"
    } else {
        "ongoing_request"
    };
    // Mid-stream the response is committed already: wait for the new worker's first answer so a
    // worker that fails at once is tried again here, within the migration budget.
    match start_routed(
        &entry,
        request,
        hints,
        state.first_response_timeout,
        FirstResponseWait::Full,
    )
    .await
    {
        Ok(started) => {
            entry.metrics.count_migration(kind);
            tracing::info!(%error, from = %format!("{failed_worker:x}"), to = %format!("{:x}", started.worker_id), kind, "request migrated");
            Some(started)
        }
        Err(next_error) => {
            tracing::warn!(%error, %next_error, "migration failed");
            None
        }
    }
}

/// Text deltas of a started generation. Ends after the delta carrying a finish reason, or with an
/// error; a cancelled generation ends without a finish reason. Dropping it cancels the worker.
pub fn text_deltas(
    started: Started,
    mut output: OutputProcessor,
    num_prompt_tokens: u32,
    metrics: crate::metrics::ModelMetrics,
) -> impl Stream<Item = Result<TextDelta, FrontendError>> + Send {
    let Started {
        mut first,
        stream,
        guard,
        mut resume,
        mut worker_id,
        silence_limit,
        ..
    } = started;
    let begin = Instant::now();
    let max_seq_len = resume.as_ref().and_then(|r| r.entry.migration_max_seq_len);
    async_stream::stream! {
        let mut stream = stream;
        // Dropped with the stream (client disconnect) it frees the request as disconnected.
        let mut guard = guard;
        let mut is_first_token_reported = false;
        let mut usage = TokenUsage { prompt_tokens: num_prompt_tokens, ..Default::default() };
        let mut last_token_at: Option<Instant> = None;
        // Tokens streamed so far, kept only while the request may migrate.
        let mut generated: Vec<u32> = Vec::new();
        let mut has_migrated = false;
        loop {
            let next = match first.take() {
                Some(response) => Ok(response),
                None => match next_response(&mut stream, silence_limit).await {
                    Some(Ok(response)) => worker_outcome(response),
                    Some(Err(error)) => Err(error),
                    None => Err(FrontendError::Worker {
                        code: kvmesh_runtime::ErrorCode::Unavailable,
                        message: "worker stream ended without a finish reason".into(),
                    }),
                },
            };
            let response = match next {
                Ok(response) => response,
                Err(error) => {
                    if let Some(moved) = migrate(&mut resume, &generated, worker_id, &error).await {
                        release(&mut guard, TerminalPath::Migrated);
                        let Started { first: moved_first, stream: moved_stream, guard: moved_guard, worker_id: moved_worker, .. } = moved;
                        first = moved_first;
                        stream = moved_stream;
                        guard = moved_guard;
                        worker_id = moved_worker;
                        is_first_token_reported = false;
                        has_migrated = true;
                        continue;
                    }
                    release(&mut guard, TerminalPath::Error);
                    yield Err(error);
                    return;
                }
            };
            if resume.is_some() && !response.token_ids.is_empty() {
                generated.extend_from_slice(&response.token_ids);
                let total = u64::from(num_prompt_tokens) + generated.len() as u64;
                if max_seq_len.is_some_and(|limit| total > u64::from(limit)) {
                    // Past --migration-max-seq-len the request is no longer tracked for migration.
                    metrics.migration_max_seq_len_exceeded.inc();
                    resume = None;
                    generated = Vec::new();
                }
            }
            if !response.token_ids.is_empty() {
                let now = Instant::now();
                match last_token_at {
                    None => metrics.ttft.observe(now.duration_since(begin).as_secs_f64()),
                    Some(previous) => metrics.itl.observe(now.duration_since(previous).as_secs_f64()),
                }
                last_token_at = Some(now);
            }
            if let Some(reported) = &response.usage {
                usage.cached_tokens = reported.cached_tokens;
                // After a migration the worker's prompt includes the tokens already streamed.
                if reported.prompt_tokens > 0 && !has_migrated {
                    usage.prompt_tokens = reported.prompt_tokens;
                }
            }
            let num_tokens = response.token_ids.len() as u32;
            usage.completion_tokens += num_tokens;
            if num_tokens > 0
                && let Some(guard) = &guard
            {
                // The first token ends prefill; later ones matter only when the router tracks
                // output blocks, so the common case takes no router lock per token.
                if guard.tracks_output_tokens() {
                    guard.add_output_tokens(u64::from(num_tokens), !is_first_token_reported);
                } else if !is_first_token_reported {
                    guard.first_token();
                }
                is_first_token_reported = true;
            }
            let step = output.push_tokens(&response.token_ids);
            let finish = FinishReason::try_from(response.finish_reason).unwrap_or(FinishReason::Unspecified);
            if step.stopped {
                let mut delta = TextDelta { text: step.text, num_tokens, ..Default::default() };
                delta.finish_reason = Some(OpenAiFinish::Stop);
                delta.usage = Some(usage);
                release(&mut guard, TerminalPath::Completed);
                yield Ok(delta);
                return;
            }
            match finish {
                FinishReason::Unspecified => {
                    if !step.text.is_empty() || num_tokens > 0 {
                        yield Ok(TextDelta { text: step.text, num_tokens, ..Default::default() });
                    }
                }
                other => {
                    let mut text = step.text;
                    text.push_str(&output.flush());
                    let reason = match other {
                        FinishReason::Length => OpenAiFinish::Length,
                        FinishReason::ContentFilter => OpenAiFinish::ContentFilter,
                        _ => OpenAiFinish::Stop,
                    };
                    release(&mut guard, TerminalPath::Completed);
                    yield Ok(TextDelta { text, num_tokens, finish_reason: Some(reason), usage: Some(usage) });
                    return;
                }
            }
        }
    }
}

/// Releases the request's load by `path` (once).
fn release(guard: &mut Option<Lease>, path: TerminalPath) {
    if let Some(guard) = guard.take() {
        guard.finish(path);
    }
}

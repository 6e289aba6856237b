//! The one path from a preprocessed request to a worker's token stream, for every caller (the
//! HTTP handlers, `Router.Generate`, and every edge to come): decide a worker, call it, try
//! another when it cannot be reached, report the request's life to whoever decided, and move the
//! request to another worker when its worker fails mid-stream (docs/routing.md, "Migration").
//! Whether the decision was made in this process or by router replicas is the [`RouteDecider`]'s
//! business alone.

mod deadline;
mod embed;
mod stream;
pub(crate) mod trace;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kvmesh_core::prefix::PrefixCut;
use kvmesh_proto::v1::{FinishReason, GenerateRequest, GenerateResponse};
use kvmesh_runtime::ErrorCode;
use kvmesh_runtime::otel::{SpanKind, Trace};
use kvmesh_runtime::worker_client::{ResponseStream, WorkerEndpoint};

pub use self::deadline::{
    DEADLINE_PREFILL_TOKENS, DEFAULT_INTER_RESPONSE_TIMEOUT, DEFAULT_PREFILL_TOKENS_PER_SECOND,
    MIN_FIRST_RESPONSE_TIMEOUT, first_response_timeout,
};
pub use self::stream::Generation;
use crate::decider::{RouteDecider, RouteLease};
use crate::fleet::untried_workers;
use kvmesh_routing::error::RouteError;
use kvmesh_routing::request::{RouteRequest, RoutingHints, TerminalPath};
use kvmesh_runtime::GrpcErrorCode as _;

/// How many workers one request tries before giving up, when the earlier ones are unreachable.
const MAX_START_ATTEMPTS: usize = 3;

/// A worker that can serve a model.
#[derive(Clone)]
pub struct WorkerRef {
    /// Discovery instance id.
    pub id: u64,
    /// How to reach it.
    pub endpoint: Arc<dyn WorkerEndpoint>,
    /// Its default first-response deadline ([`first_response_timeout`] of its card).
    pub first_response_timeout: Duration,
}

impl WorkerRef {
    /// A worker with the first-response deadline of a card that publishes no prefill speed.
    pub fn new(id: u64, endpoint: Arc<dyn WorkerEndpoint>) -> Self {
        Self {
            id,
            endpoint,
            first_response_timeout: first_response_timeout(None),
        }
    }
}

/// How long [`ModelRouter::generate`] waits for the worker's first response before handing the
/// stream back (the pre-commit peek, docs/http-api.md, "Pre-commit peek"): a failure within the
/// wait is the call's error, one after it an error inside the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstResponseWait {
    /// Until it arrives (unary responses are read whole before anything is sent).
    Full,
    /// At most this long (`DYN_HTTP_PRE_COMMIT_ERROR_PEEK_MS`).
    UpTo(Duration),
    /// Not at all: the stream is handed back once the worker accepted the request.
    None,
}

/// What one generation asks of the seam besides the request itself.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Pins, priorities, session, cost-model overrides and the cache salt.
    pub hints: RoutingHints,
    /// The prompt's cut points from tokenizing (block hashes of a known prefix are reused).
    pub prefix_cuts: Arc<[PrefixCut]>,
    /// `DYN_HTTP_BACKEND_STREAM_TIMEOUT_SECS`: replaces both default deadlines, the wait for
    /// the worker's first response and the longest silence between two of its responses
    /// (docs/routing.md, "Deadlines"); `None` keeps the defaults.
    pub response_timeout: Option<Duration>,
    /// How long the call waits for the first response.
    pub wait: FirstResponseWait,
    /// The caller's span of the request: each routing decision, worker attempt and migration
    /// is a child span of it (docs/tracing.md); off when tracing is.
    pub trace: Trace,
}

/// How far a failed request may move (`--migration-limit`, `--migration-max-seq-len`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrationPolicy {
    /// Migrations allowed per request; 0 turns migration off.
    pub limit: u32,
    /// Past this many prompt plus generated tokens a request is no longer migrated.
    pub max_seq_len: Option<u32>,
}

/// Who counts what the seam does on a request's behalf (the frontend's Prometheus series).
pub trait GenerationObserver: Send + Sync {
    /// A request moved to another worker: `new_request` before any token, else `ongoing_request`.
    fn migrated(&self, _kind: &'static str) {}

    /// A request grew past `--migration-max-seq-len` and will not be migrated.
    fn past_max_seq_len(&self) {}
}

/// Counts nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl GenerationObserver for NoObserver {}

/// One model's seam: its decider, the workers of one table version, and its migration policy.
/// Cheap to clone; a new table version makes a new one around the same decider.
#[derive(Clone)]
pub struct ModelRouter {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    decider: Arc<dyn RouteDecider>,
    workers: Vec<WorkerRef>,
    migration: MigrationPolicy,
    observer: Arc<dyn GenerationObserver>,
}

impl ModelRouter {
    /// The seam of model `name`, deciding with `decider` among `workers`.
    pub fn new(
        name: impl Into<String>,
        decider: Arc<dyn RouteDecider>,
        workers: Vec<WorkerRef>,
        migration: MigrationPolicy,
        observer: Arc<dyn GenerationObserver>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.into(),
                decider,
                workers,
                migration,
                observer,
            }),
        }
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The workers requests may go to.
    pub fn workers(&self) -> &[WorkerRef] {
        &self.inner.workers
    }

    /// Who decides (busy thresholds are read and set through it).
    pub fn decider(&self) -> &Arc<dyn RouteDecider> {
        &self.inner.decider
    }

    /// Routes `request`, starts it on the chosen worker and waits for its first response as
    /// `options.wait` says. A worker that cannot be reached (dead but still listed) is released
    /// as an error and the request routed again among the workers not tried yet: nothing has
    /// reached the caller, so that is safe. The returned [`Generation`] holds the worker's load
    /// until it ends; dropping it frees the request as disconnected and cancels the worker.
    /// The hints' cache salt goes into a request that carries none, so that the worker seeds
    /// its block hashes with the salt the router routed on; so do the prompt's cut points, so
    /// that an engine hashing blocks itself reuses an earlier turn's hashes as the router does.
    pub async fn generate(
        &self,
        mut request: GenerateRequest,
        options: GenerateOptions,
    ) -> Result<Generation, RouteError> {
        if request.cache_salt.is_empty()
            && let Some(salt) = &options.hints.cache_salt
        {
            request.cache_salt.clone_from(salt);
        }
        if request.prefix_cuts.is_empty() {
            request.prefix_cuts = kvmesh_runtime::prefix_cuts::cuts_to_proto(&options.prefix_cuts);
        }
        let migration = self.inner.migration;
        let mut remaining = migration.limit;
        let original = (migration.limit > 0).then(|| request.clone());
        let prompt_len = request.token_ids.len();
        let started = self.start(request, &options, &mut remaining).await?;
        let resume = original.map(|request| stream::Resume {
            model: self.clone(),
            request,
            options: GenerateOptions {
                wait: FirstResponseWait::Full,
                ..options.clone()
            },
            remaining,
        });
        Ok(Generation::new(
            started,
            resume,
            prompt_len,
            options.response_timeout,
        ))
    }

    /// One routed start with retries on unreachable workers; a worker that fails before its
    /// first response (an internal error, silence past its deadline) moves the request to
    /// another worker while `migrations` lasts, each move taken from it.
    async fn start(
        &self,
        request: GenerateRequest,
        options: &GenerateOptions,
        migrations: &mut u32,
    ) -> Result<Started, RouteError> {
        let workers = &self.inner.workers;
        let num_attempts = MAX_START_ATTEMPTS.min(workers.len()).max(1);
        let mut hints = options.hints.clone();
        let mut tried: Vec<u64> = Vec::new();
        let mut request = Some(request);
        let mut last_error = None;
        let mut timings = StartTimings::default();
        let mut attempt = 0;
        let mut missed_table = false;
        while attempt < num_attempts {
            if !tried.is_empty() {
                let allowed = untried_workers(
                    workers.iter().map(|w| w.id),
                    &tried,
                    hints.allowed_worker_ids.as_ref(),
                );
                if allowed.is_empty() {
                    break;
                }
                hints.allowed_worker_ids = Some(allowed);
            }
            // Only a request that may be retried is copied; the last attempt takes the original.
            let this_request = if attempt + 1 == num_attempts && *migrations == 0 {
                request.take()
            } else {
                request.clone()
            };
            let Some(mut this_request) = this_request else {
                break;
            };
            let route_request = RouteRequest {
                request_id: kvmesh_routing::unique_route_id(&this_request.request_id),
                token_ids: &this_request.token_ids,
                lora_name: (!this_request.lora_name.is_empty())
                    .then_some(this_request.lora_name.as_str()),
                cache_salt: (!this_request.cache_salt.is_empty())
                    .then_some(this_request.cache_salt.as_str()),
                hints: hints.clone(),
                prefix_cuts: &options.prefix_cuts,
            };
            let deciding = Instant::now();
            let route_span = options.trace.internal("route");
            let lease = self.inner.decider.decide(&route_request, &route_span).await;
            let lease = trace::decided(&route_span, lease)?;
            let hashing = lease.hash_time();
            timings.hash += hashing;
            timings.route += deciding.elapsed().saturating_sub(hashing);
            let decision = lease.decision();
            let (worker_id, dp_rank) = (decision.worker_id, decision.dp_rank);
            let Some(worker) = workers.iter().find(|w| w.id == worker_id) else {
                // Decided for a worker this table version does not list (a race with discovery:
                // the decider already knows a worker that joined after this version). The next
                // decision is held to this version's workers; only a repeat costs an attempt.
                lease.finish(TerminalPath::Error);
                tried.push(worker_id);
                last_error = Some(RouteError::NoEndpoint);
                if request.is_none() {
                    request = Some(this_request);
                }
                if std::mem::replace(&mut missed_table, true) {
                    attempt += 1;
                }
                continue;
            };
            if let Some(rank) = dp_rank {
                this_request.routing.get_or_insert_default().dp_rank = Some(rank);
            }
            let dispatching = Instant::now();
            let span = options.trace.child("worker_generate", SpanKind::Client);
            trace::attempt(&span, worker_id, attempt);
            let outcome = start_on(worker, this_request, options, &span).await;
            timings.dispatch += dispatching.elapsed();
            if let Err(error) = &outcome {
                span.fail(error);
                span.end();
            }
            match outcome {
                Ok(mut started) => {
                    started.span = span;
                    started.lease = Some(lease);
                    started.timings = timings;
                    return Ok(started);
                }
                Err(error) if is_unreachable(&error) => {
                    lease.finish(TerminalPath::WorkerFailed);
                    tracing::warn!(worker_id = %format!("{worker_id:x}"), %error, "worker unreachable, trying another");
                    tried.push(worker_id);
                    last_error = Some(error);
                    attempt += 1;
                }
                Err(error) if is_migratable(&error) && *migrations > 0 => {
                    *migrations -= 1;
                    lease.finish(TerminalPath::Migrated);
                    self.inner.observer.migrated("new_request");
                    tracing::warn!(worker_id = %format!("{worker_id:x}"), %error, "worker failed before its first response, migrating");
                    tried.push(worker_id);
                    last_error = Some(error);
                }
                Err(error) => {
                    lease.finish(terminal_path_of(&error));
                    return Err(error);
                }
            }
        }
        Err(last_error.unwrap_or(RouteError::NoEndpoint))
    }
}

/// A generation started on one worker, before the seam's bookkeeping wraps it.
pub(crate) struct Started {
    pub(crate) worker_id: u64,
    pub(crate) dp_rank: u32,
    /// When the worker's first response is overdue (docs/routing.md, "Deadlines").
    pub(crate) first_deadline: tokio::time::Instant,
    /// The first response, already received (pre-commit peek).
    pub(crate) first: Option<GenerateResponse>,
    pub(crate) stream: ResponseStream,
    pub(crate) lease: Option<Box<dyn RouteLease>>,
    pub(crate) timings: StartTimings,
    /// The client span of this worker attempt, ended with the generation.
    pub(crate) span: Trace,
}

/// Where the start of a generation spent its time, every attempt included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartTimings {
    /// Block hashing for the decisions, where this process hashed (zero with router replicas).
    pub hash: Duration,
    /// Routing decisions, block hashing excluded (overlap lookups included).
    pub route: Duration,
    /// From a decision to the worker's answer (its first response when the start waits).
    pub dispatch: Duration,
}

fn is_unreachable(error: &RouteError) -> bool {
    matches!(
        error,
        RouteError::Worker {
            code: ErrorCode::Unavailable,
            ..
        }
    )
}

/// A worker's failure as the seam reports it.
fn worker_error(code: ErrorCode, message: impl Into<String>) -> RouteError {
    RouteError::Worker {
        code,
        message: message.into(),
    }
}

/// A worker's gRPC failure, its code read from the status (never from its text).
fn worker_failure(status: tonic::Status) -> RouteError {
    worker_error(ErrorCode::of_status(&status), status.message())
}

async fn start_on(
    worker: &WorkerRef,
    request: GenerateRequest,
    options: &GenerateOptions,
    span: &Trace,
) -> Result<Started, RouteError> {
    let worker_id = worker.id;
    let routed_rank = request.routing.as_ref().and_then(|r| r.dp_rank);
    // One deadline for opening the stream and its first response, whether waited for here or
    // read from the stream later.
    let limit = options
        .response_timeout
        .unwrap_or(worker.first_response_timeout);
    let first_deadline = tokio::time::Instant::now() + limit;
    let deadline = Some((limit, first_deadline));
    let mut stream = by_deadline(deadline, worker.endpoint.generate_traced(request, span))
        .await?
        .map_err(worker_failure)?;
    let first = match options.wait {
        FirstResponseWait::Full => Some(by_deadline(deadline, stream.next()).await?),
        FirstResponseWait::UpTo(peek) => tokio::time::timeout(peek, stream.next()).await.ok(),
        FirstResponseWait::None => None,
    };
    let first = match first {
        None => None,
        Some(Some(Ok(response))) => Some(worker_outcome(response)?),
        Some(Some(Err(status))) => return Err(worker_failure(status)),
        Some(None) => {
            return Err(worker_error(
                ErrorCode::Unavailable,
                "worker closed the stream without a response",
            ));
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
        first_deadline,
        first,
        stream,
        lease: None,
        timings: StartTimings::default(),
        span: Trace::off(),
    })
}

/// `work`, unless `deadline` (the limit and when it runs out) passes first.
async fn by_deadline<T>(
    deadline: Option<(Duration, tokio::time::Instant)>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, RouteError> {
    match deadline {
        Some((limit, at)) => tokio::time::timeout_at(at, work)
            .await
            .map_err(|_| RouteError::WorkerTimeout(limit.as_secs())),
        None => Ok(work.await),
    }
}

/// A worker's response, or the failure it reports: an `ERROR` finish, or a `CANCELLED` one (the
/// seam cancels only by dropping the stream, so a cancellation from the worker means it gave the
/// request up, e.g. when shutting down). Both then take the failure path: another worker at the
/// start, migration mid-stream, an error for the caller otherwise — never a quiet end.
fn worker_outcome(response: GenerateResponse) -> Result<GenerateResponse, RouteError> {
    match FinishReason::try_from(response.finish_reason) {
        Ok(FinishReason::Error) => Err(worker_error(
            ErrorCode::Internal,
            if response.error.is_empty() {
                "worker failed".to_string()
            } else {
                response.error
            },
        )),
        Ok(FinishReason::Cancelled) => Err(worker_error(
            ErrorCode::Unavailable,
            "worker gave up the request (shutting down?)",
        )),
        _ => Ok(response),
    }
}

/// Whether a worker failure lets the request continue elsewhere: the worker could not be
/// reached, went away, failed or fell silent; never a cancellation, an overload or a rejected
/// request.
fn is_migratable(error: &RouteError) -> bool {
    matches!(
        error,
        RouteError::Worker {
            code: ErrorCode::Unavailable | ErrorCode::Internal | ErrorCode::Timeout,
            ..
        } | RouteError::WorkerTimeout(_)
    )
}

/// How a request that ends with `error` is released: as the worker's failure (counted towards
/// its ejection) when the worker is to blame, as a plain error otherwise.
fn terminal_path_of(error: &RouteError) -> TerminalPath {
    if is_migratable(error) {
        TerminalPath::WorkerFailed
    } else {
        TerminalPath::Error
    }
}

#[cfg(test)]
#[path = "generation/seam_tests.rs"]
mod seam_tests;

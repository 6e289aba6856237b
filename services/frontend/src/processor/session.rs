//! One chat request on a processor host: the `Process` stream, the generate calls it asks for
//! (each run through the model's routing seam, its worker output relayed back), and the
//! processor's chunks read as text deltas.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::Stream;
use kvmesh_core::ErrorCode;
use kvmesh_llm::openai::{ChatCompletionChunk, ChatCompletionRequest};
use kvmesh_proto::v1::{
    ChunkMetrics, GenerateCall, ProcessDown, ProcessError, ProcessStart, ProcessUp, process_down,
    process_up,
};
use kvmesh_routing::RoutingHints;
use kvmesh_runtime::GrpcErrorCode as _;
use kvmesh_runtime::otel::Trace;
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::call::{Totals, pump_call};
use super::clock::TokenClock;
use super::{Host, ProcessorHosts, is_unreachable};
use crate::error::FrontendError;
use crate::generate::{TextDelta, TokenUsage};
use crate::http::ResponseHeaders;
use crate::models::ModelEntry;

/// Messages to the host waiting to be sent; worker output waits here when the host is slow.
const UP_QUEUE: usize = 256;

/// What one processor request needs besides the model.
pub(crate) struct ProcessorRequest<'a> {
    /// The chat request (Responses and Messages requests translated to it).
    pub request: &'a ChatCompletionRequest,
    /// The frontend's request id.
    pub request_id: &'a str,
    /// Routing hints from the request's headers and `nvext`; the processor's own win.
    pub hints: RoutingHints,
    /// Where the response headers the processor sets go (complete once the first chunk was
    /// read; for a unary request, once the deltas ended).
    pub headers: ResponseHeaders,
    /// Whether response headers the processor sets can still be sent (chat completions, unary or
    /// with a pre-commit peek).
    pub headers_allowed: bool,
    /// How long to read the processor's stream before committing: until the first chunk (or
    /// error) at most this long; `None` commits at once.
    pub peek: Option<Duration>,
    /// The worker silence limit of each generate call.
    pub response_timeout: Option<Duration>,
    /// The caller's trace, handed to the processor's `Context`.
    pub trace: crate::trace_context::TraceContext,
    /// The frontend's span of the request: the host's span and the generate calls' spans are
    /// its children (docs/tracing.md).
    pub span: Trace,
}

/// The request's state on this side of the stream.
struct Session {
    entry: Arc<ModelEntry>,
    up: mpsc::Sender<ProcessUp>,
    hints: RoutingHints,
    response_timeout: Option<Duration>,
    span: Trace,
    calls: JoinSet<()>,
    by_id: HashMap<u64, AbortHandle>,
    totals: Arc<Totals>,
    metrics: ChunkMetrics,
    headers: ResponseHeaders,
    headers_allowed: bool,
    chunk_usage: Option<TokenUsage>,
}

/// What one message from the host means for the client.
enum Step {
    /// A chunk to read deltas from.
    Chunk(Vec<u8>),
    /// Nothing for the client.
    Quiet,
    /// The processor failed.
    Failed(FrontendError),
}

fn host_failure(status: &tonic::Status) -> FrontendError {
    let code = ErrorCode::of_status(status);
    FrontendError::Worker {
        code: if code == ErrorCode::Internal {
            ErrorCode::Unavailable
        } else {
            code
        },
        message: format!("chat processor host: {}", status.message()),
    }
}

/// The client-facing error of a processor's failure (docs/processors.md, "Errors").
fn processor_error(error: ProcessError) -> FrontendError {
    if error.http_status != 0 {
        return FrontendError::ProcessorStatus {
            status: u16::try_from(error.http_status).unwrap_or(500),
            detail: error.message,
        };
    }
    match ErrorCode::from_name(&error.error_code).unwrap_or(ErrorCode::Internal) {
        ErrorCode::InvalidArgument => FrontendError::invalid(error.message, None),
        ErrorCode::Internal => FrontendError::Internal(error.message),
        code => FrontendError::Worker {
            code,
            message: error.message,
        },
    }
}

impl Session {
    fn on_message(&mut self, message: ProcessDown) -> Step {
        match message.kind {
            Some(process_down::Kind::ChunkJson(json)) => return Step::Chunk(json),
            Some(process_down::Kind::Generate(call)) => self.start_call(call),
            Some(process_down::Kind::CancelCall(call_id)) => {
                if let Some(call) = self.by_id.remove(&call_id) {
                    call.abort();
                }
            }
            Some(process_down::Kind::Header(header)) if self.headers_allowed => {
                self.headers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((header.name, header.value));
            }
            Some(process_down::Kind::Header(_)) => {}
            Some(process_down::Kind::Metrics(metrics)) => {
                let merge = |new: Option<u32>, old: Option<u32>| new.or(old);
                self.metrics = ChunkMetrics {
                    input_tokens: merge(metrics.input_tokens, self.metrics.input_tokens),
                    output_tokens: merge(metrics.output_tokens, self.metrics.output_tokens),
                    chunk_tokens: metrics.chunk_tokens,
                    cached_tokens: merge(metrics.cached_tokens, self.metrics.cached_tokens),
                };
            }
            Some(process_down::Kind::Error(error)) => return Step::Failed(processor_error(error)),
            None => {}
        }
        Step::Quiet
    }

    fn start_call(&mut self, call: GenerateCall) {
        let call_id = call.call_id;
        let mut hints = self.hints.clone();
        let wire = call.request.as_ref().and_then(|r| r.routing.as_ref());
        let own = kvmesh_router::wire::hints_from_proto(
            wire,
            &call.allowed_worker_ids,
            call.session_bind_ttl_secs,
            None,
        );
        hints.backend_instance_id = own.backend_instance_id.or(hints.backend_instance_id);
        hints.dp_rank = own.dp_rank.or(hints.dp_rank);
        hints.allowed_worker_ids = own.allowed_worker_ids.or(hints.allowed_worker_ids);
        if own.priority != 0 {
            hints.priority = own.priority;
        }
        hints.expected_output_tokens = own.expected_output_tokens.or(hints.expected_output_tokens);
        hints.session_id = own.session_id.or(hints.session_id);
        hints.session_bind_ttl = own.session_bind_ttl.or(hints.session_bind_ttl);
        let pump = pump_call(
            self.entry.clone(),
            call,
            hints,
            self.response_timeout,
            self.span.clone(),
            self.up.clone(),
            self.totals.clone(),
        );
        let handle = self.calls.spawn(pump);
        self.by_id.insert(call_id, handle);
    }

    /// Deltas of one chunk; a chunk that is not a chat-completion chunk fails the request.
    fn deltas(&mut self, json: &[u8]) -> Result<Vec<TextDelta>, FrontendError> {
        let chunk: ChatCompletionChunk<'_> = serde_json::from_slice(json).map_err(|error| {
            FrontendError::Internal(format!(
                "the chat processor yielded something that is not a chat-completion chunk: {error}"
            ))
        })?;
        if let Some(Some(usage)) = chunk.usage {
            self.chunk_usage = Some(TokenUsage {
                prompt_tokens: usage.prompt_tokens,
                completion_tokens: usage.completion_tokens,
                cached_tokens: usage
                    .prompt_tokens_details
                    .map(|details| details.cached_tokens)
                    .unwrap_or(0),
            });
        }
        Ok(chunk
            .choices
            .into_iter()
            .map(|choice| {
                let delta = choice.delta;
                TextDelta {
                    index: choice.index,
                    text: delta.content.map(|c| c.into_owned()).unwrap_or_default(),
                    reasoning: delta
                        .reasoning_content
                        .or(delta.reasoning)
                        .map(|r| r.into_owned())
                        .unwrap_or_default(),
                    finish_reason: choice.finish_reason,
                    tool_calls: delta.tool_calls.unwrap_or_default(),
                    ..TextDelta::default()
                }
            })
            .collect())
    }

    fn usage(&self) -> TokenUsage {
        self.totals.usage(&self.metrics, self.chunk_usage)
    }
}

/// Opens a `Process` stream with `start` on a live host. A host that cannot be reached (it died
/// and discovery has not dropped it yet) has received nothing, so the next host in turn is tried,
/// each live host at most once.
async fn open(
    hosts: &ProcessorHosts,
    start: ProcessStart,
    span: &Trace,
) -> Result<(Host, mpsc::Sender<ProcessUp>, Streaming<ProcessDown>), FrontendError> {
    let no_host = || FrontendError::Worker {
        code: ErrorCode::Unavailable,
        message: format!("no live chat processor host for {:?}", hosts.processor()),
    };
    let mut last_failure = None;
    for host in hosts.in_turn() {
        let (up, up_rx) = mpsc::channel(UP_QUEUE);
        up.send(ProcessUp {
            kind: Some(process_up::Kind::Start(start.clone())),
        })
        .await
        .map_err(|_| FrontendError::Internal("processor stream closed".into()))?;
        let mut client = host.client.clone();
        let mut request = tonic::Request::new(ReceiverStream::new(up_rx));
        span.inject_metadata(request.metadata_mut());
        match client.process(request).await {
            Ok(response) => {
                host.served.inc();
                return Ok((host, up, response.into_inner()));
            }
            Err(status) if is_unreachable(&status) => {
                tracing::debug!(host = %format!("{:x}", host.instance_id), %status, "processor host unreachable; trying the next");
                last_failure = Some(status);
            }
            Err(status) => return Err(host_failure(&status)),
        }
    }
    Err(last_failure.map_or_else(no_host, |status| host_failure(&status)))
}

/// Starts `processor_request` for `entry` on one of `hosts`. With a peek (or for a request
/// whose headers count) the processor's stream is read up to its first chunk before this
/// returns, so an early failure is an error status and the headers are known.
pub(crate) async fn start(
    hosts: &ProcessorHosts,
    entry: &Arc<ModelEntry>,
    processor_request: ProcessorRequest<'_>,
) -> Result<impl Stream<Item = Result<TextDelta, FrontendError>> + Send + use<>, FrontendError> {
    let started = std::time::Instant::now();
    let request_json = serde_json::to_vec(processor_request.request)
        .map_err(|e| FrontendError::Internal(format!("chat request to JSON: {e}")))?;
    let start = ProcessStart {
        request_id: processor_request.request_id.to_owned(),
        model: entry.name.clone(),
        request_json,
        headers_allowed: processor_request.headers_allowed,
        trace_id: processor_request.trace.trace_id.clone(),
        span_id: processor_request.trace.span_id.clone(),
        parent_span_id: processor_request.trace.parent_span_id.clone(),
    };
    let (host, up, mut down) = open(hosts, start, &processor_request.span).await?;
    tracing::debug!(host = %format!("{:x}", host.instance_id), "processor request started");
    let mut session = Session {
        entry: entry.clone(),
        up,
        hints: processor_request.hints,
        response_timeout: processor_request.response_timeout,
        span: processor_request.span,
        calls: JoinSet::new(),
        by_id: HashMap::new(),
        totals: Arc::new(Totals::default()),
        metrics: ChunkMetrics::default(),
        headers: processor_request.headers,
        headers_allowed: processor_request.headers_allowed,
        chunk_usage: None,
    };
    let mut early = VecDeque::new();
    let mut is_ended = false;
    if let Some(peek) = processor_request.peek {
        let deadline = tokio::time::Instant::now() + peek;
        loop {
            let message = match tokio::time::timeout_at(deadline, down.message()).await {
                Err(_) => break,
                Ok(Ok(Some(message))) => message,
                Ok(Ok(None)) => {
                    is_ended = true;
                    break;
                }
                Ok(Err(status)) => return Err(host_failure(&status)),
            };
            match session.on_message(message) {
                Step::Chunk(json) => {
                    early.push_back(json);
                    break;
                }
                Step::Quiet => {}
                Step::Failed(error) => return Err(error),
            }
        }
    }
    let mut clock = TokenClock {
        begin: started,
        last: None,
        metrics: entry.metrics.clone(),
    };
    let deltas = async_stream::stream! {
        // The last delta that finished a choice is held back: the usage rides on the last one.
        let mut held: Option<TextDelta> = None;
        let mut failure = None;
        // The first call's worker rides on the first delta read once it is known.
        let mut is_worker_told = false;
        loop {
            let json = if let Some(json) = early.pop_front() {
                json
            } else if is_ended {
                break;
            } else {
                match down.message().await {
                    Ok(Some(message)) => match session.on_message(message) {
                        Step::Chunk(json) => json,
                        Step::Quiet => continue,
                        Step::Failed(error) => {
                            failure = Some(error);
                            break;
                        }
                    },
                    Ok(None) => break,
                    Err(status) => {
                        failure = Some(host_failure(&status));
                        break;
                    }
                }
            };
            match session.deltas(&json) {
                Ok(deltas) => {
                    if deltas.iter().any(TokenClock::carries_output) {
                        clock.output();
                    }
                    for mut delta in deltas {
                        if !is_worker_told {
                            delta.served_by = session.totals.first_worker.get().copied();
                            is_worker_told = delta.served_by.is_some();
                        }
                        if let Some(previous) = held.take() {
                            yield Ok(previous);
                        }
                        if delta.finish_reason.is_some() {
                            held = Some(delta);
                        } else {
                            yield Ok(delta);
                        }
                    }
                }
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        if let Some(mut last) = held.take() {
            if failure.is_none() {
                last.usage = Some(session.usage());
            }
            yield Ok(last);
        }
        if let Some(error) = failure {
            yield Err(error);
        }
        drop(session);
    };
    Ok(deltas)
}

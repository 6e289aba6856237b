//! The `kvmesh.v1.Router` gRPC service of a `kvmesh-router` replica over the models of
//! [`crate::routed_models`]: answering `Route` (unary and on a `RouteStream`), running `Generate`
//! through the seam, and taking `Report`s of requests whose callers talk to the worker themselves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kvmesh_proto::v1 as pb;
use kvmesh_proto::v1::router_server::Router;
use kvmesh_routing::error::RouteError;
use kvmesh_routing::request::RouteRequest;
use kvmesh_routing::sync::{SyncEvent, SyncKind};
use kvmesh_runtime::otel::{SpanKind, Trace};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::generation::{FirstResponseWait, GenerateOptions, Generation};
use crate::metrics::RouterMetrics;
use crate::routed_models::{RoutedModel, RoutedTable};
use crate::routing::route_with_index;
use crate::wire;
use crate::wire::RouteErrorStatus as _;

/// The gRPC service.
#[derive(Clone)]
pub struct RouterService {
    table: RoutedTable,
    metrics: RouterMetrics,
}

impl RouterService {
    /// Serves the models of `table`, counting into `metrics`.
    pub fn new(table: RoutedTable, metrics: RouterMetrics) -> Self {
        Self { table, metrics }
    }

    /// Counts a decision under its model's name, or `unknown` for a name this replica does not
    /// serve: names come from requests, and only served models may become metric series.
    fn observe_decision<T>(&self, model: &str, result: &Result<T, RouteError>, elapsed: Duration) {
        let label = if self.table.load().contains_key(model) {
            model
        } else {
            "unknown"
        };
        self.metrics.observe_decision(label, result, elapsed);
    }

    fn model(&self, name: &str) -> Result<Arc<RoutedModel>, RouteError> {
        self.table
            .load()
            .get(name)
            .cloned()
            .ok_or_else(|| RouteError::UnknownModel(name.to_string()))
    }
}

/// Rejects what the router cannot route, before any lock is taken.
fn validate(model: &str, request_id: &str, token_ids: &[u32]) -> Result<(), RouteError> {
    if model.is_empty() {
        return Err(RouteError::BadRequest("model is required".into()));
    }
    if request_id.is_empty() {
        return Err(RouteError::BadRequest("request_id is required".into()));
    }
    if token_ids.is_empty() {
        return Err(RouteError::BadRequest("token_ids must not be empty".into()));
    }
    Ok(())
}

/// Answers of one `RouteStream` that may wait for the caller to read them.
const ROUTE_STREAM_QUEUE: usize = 1024;

#[tonic::async_trait]
impl Router for RouterService {
    async fn route(
        &self,
        request: Request<pb::RouteRequest>,
    ) -> Result<Response<pb::RouteResponse>, Status> {
        self.decide(request.into_inner())
            .await
            .map(Response::new)
            .map_err(|error| error.to_status())
    }

    type RouteStreamStream =
        futures::stream::BoxStream<'static, Result<pb::RouteStreamResponse, Status>>;

    async fn route_stream(
        &self,
        request: Request<tonic::Streaming<pb::RouteStreamRequest>>,
    ) -> Result<Response<Self::RouteStreamStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(ROUTE_STREAM_QUEUE);
        let service = self.clone();
        tokio::spawn(async move {
            // Decisions run concurrently (one may wait in the queue); each answer goes out as
            // soon as it is made. When the caller goes away (its answer stream is dropped),
            // decisions still waiting in the queue leave it; one already made is left to expiry,
            // like a lost unary answer. A terminal report for a request still being decided
            // (its client gave up while it queued) takes it out of the queue, or frees it if the
            // decision lands meanwhile.
            let deciding: Arc<Mutex<HashMap<String, (u64, CancellationToken)>>> = Arc::default();
            let mut next_route = 0u64;
            while let Some(message) = incoming.next().await {
                let Ok(message) = message else { break };
                match message.kind {
                    Some(pb::route_stream_request::Kind::Route(route)) => {
                        let service = service.clone();
                        let tx = tx.clone();
                        let abandoned = CancellationToken::new();
                        let seq = next_route;
                        next_route += 1;
                        lock(&deciding).insert(route.request_id.clone(), (seq, abandoned.clone()));
                        let deciding = deciding.clone();
                        tokio::spawn(async move {
                            let request_id = route.request_id.clone();
                            let model = route.model.clone();
                            // The answer stream closes when the caller goes away (not when it
                            // merely stops sending).
                            let decided = tokio::select! {
                                _ = tx.closed() => None,
                                _ = abandoned.cancelled() => None,
                                decided = service.decide(route) => Some(decided),
                            };
                            {
                                let mut deciding = lock(&deciding);
                                if deciding.get(&request_id).is_some_and(|(s, _)| *s == seq) {
                                    deciding.remove(&request_id);
                                }
                            }
                            let Some(decided) = decided else { return };
                            if abandoned.is_cancelled() && decided.is_ok() {
                                let _ = service.apply_report(pb::ReportRequest {
                                    model,
                                    request_id,
                                    terminal: pb::TerminalPath::Disconnected as i32,
                                    ..Default::default()
                                });
                                return;
                            }
                            let is_decision = decided.is_ok();
                            let result = match decided {
                                Ok(decision) => {
                                    pb::route_stream_response::Result::Decision(decision)
                                }
                                Err(error) => pb::route_stream_response::Result::Failure(
                                    wire::failure_to_proto(&error.to_status()),
                                ),
                            };
                            let answer = pb::RouteStreamResponse {
                                request_id: request_id.clone(),
                                result: Some(result),
                            };
                            // A decision the caller never receives would stay tracked until expiry.
                            if tx.send(Ok(answer)).await.is_err() && is_decision {
                                let _ = service.apply_report(pb::ReportRequest {
                                    model,
                                    request_id,
                                    terminal: pb::TerminalPath::Disconnected as i32,
                                    ..Default::default()
                                });
                            }
                        });
                    }
                    Some(pb::route_stream_request::Kind::Report(report)) => {
                        if report.terminal != 0
                            && let Some((_, abandoned)) = lock(&deciding).get(&report.request_id)
                        {
                            abandoned.cancel();
                        }
                        if let Err(status) = service.apply_report(report) {
                            tracing::debug!(%status, "streamed report refused");
                        }
                    }
                    None => {}
                }
            }
        });
        Ok(Response::new(
            tokio_stream::wrappers::ReceiverStream::new(rx).boxed(),
        ))
    }

    type GenerateStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::GenerateResponse, Status>> + Send + 'static>,
    >;

    async fn generate(
        &self,
        request: Request<pb::RoutedGenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let trace =
            Trace::from_metadata(request.metadata()).child("router_generate", SpanKind::Server);
        let mut routed = request.into_inner();
        let Some(generate) = routed.request.take() else {
            return Err(RouteError::BadRequest("request is required".into()).to_status());
        };
        let model = generate.model.clone();
        let begin = Instant::now();
        let started = self.start_generate(generate, routed, trace.clone()).await;
        self.observe_decision(&model, &started, begin.elapsed());
        let generation = started.map_err(|error| {
            trace.fail(&error);
            error.to_status()
        })?;
        Ok(Response::new(proxy(generation, trace).boxed()))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        let tracked = self.apply_report(request.into_inner())?;
        Ok(Response::new(pb::ReportResponse { tracked }))
    }

    async fn get_busy_thresholds(
        &self,
        request: Request<pb::GetBusyThresholdsRequest>,
    ) -> Result<Response<pb::GetBusyThresholdsResponse>, Status> {
        let wanted = request.into_inner().model;
        let table = self.table.load();
        if !wanted.is_empty() && !table.contains_key(&wanted) {
            return Err(RouteError::UnknownModel(wanted).to_status());
        }
        let mut thresholds: Vec<pb::BusyThresholds> = table
            .values()
            .filter(|model| wanted.is_empty() || model.name == wanted)
            .map(|model| wire::thresholds_to_proto(&model.name, &model.router.busy_thresholds()))
            .collect();
        thresholds.sort_by(|a, b| a.model.cmp(&b.model));
        Ok(Response::new(pb::GetBusyThresholdsResponse { thresholds }))
    }

    async fn set_busy_thresholds(
        &self,
        request: Request<pb::SetBusyThresholdsRequest>,
    ) -> Result<Response<pb::SetBusyThresholdsResponse>, Status> {
        let Some(thresholds) = request.into_inner().thresholds else {
            return Err(RouteError::BadRequest("thresholds are required".into()).to_status());
        };
        let model = self.model(&thresholds.model).map_err(|e| e.to_status())?;
        let value = wire::thresholds_from_proto(&thresholds);
        value
            .validate()
            .map_err(|error| RouteError::BadRequest(error.to_string()).to_status())?;
        model.router.set_busy_thresholds(value);
        Ok(Response::new(pb::SetBusyThresholdsResponse {
            thresholds: Some(wire::thresholds_to_proto(&model.name, &value)),
        }))
    }
}

impl RouterService {
    /// Decides one `Route` request (also each route of a `RouteStream`) and counts it; the
    /// request stays tracked until reported finished or expired.
    async fn decide(&self, request: pb::RouteRequest) -> Result<pb::RouteResponse, RouteError> {
        let started = Instant::now();
        let span = Trace::from_fields(&request.traceparent, &request.tracestate)
            .child("route", SpanKind::Server);
        let result = async {
            validate(&request.model, &request.request_id, &request.token_ids)?;
            let model = self.model(&request.model)?;
            let mut hints = wire::hints_from_proto(
                request.hints.as_ref(),
                &request.allowed_worker_ids,
                request.session_bind_ttl_secs,
                request.config_override.as_ref(),
            );
            hints.caller_instance_id =
                (request.caller_instance_id != 0).then_some(request.caller_instance_id);
            let prefix_cuts = kvmesh_runtime::prefix_cuts::cuts_from_proto(&request.prefix_cuts);
            let route_request = RouteRequest {
                request_id: request.request_id.clone(),
                token_ids: &request.token_ids,
                lora_name: (!request.lora_name.is_empty()).then_some(request.lora_name.as_str()),
                cache_salt: (!request.cache_salt.is_empty()).then_some(request.cache_salt.as_str()),
                hints,
                prefix_cuts: &prefix_cuts,
            };
            let guard =
                route_with_index(&model.router, model.indexer.as_ref(), &route_request).await?;
            // From here the caller reports the request's life (or expiry frees it).
            let decision = guard.detach();
            span.set_with(|| crate::generation::trace::decision_attributes(&decision));
            Ok(wire::decision_to_proto(
                &decision,
                &model.router.router_id(),
                model.router.tracks_output_tokens(),
            ))
        }
        .await;
        if let Err(error) = &result {
            span.fail(error);
        }
        span.end();
        self.observe_decision(&request.model, &result, started.elapsed());
        result
    }

    /// Applies one report (unary or streamed); returns whether the request was still tracked.
    fn apply_report(&self, report: pb::ReportRequest) -> Result<bool, Status> {
        let model = self.model(&report.model).map_err(|e| e.to_status())?;
        let kind = if report.terminal != 0 {
            "end"
        } else if report.first_token {
            "first_token"
        } else {
            "tokens"
        };
        self.metrics.count_report(&model.name, kind);
        let router = &model.router;
        let own_id = router.router_id();
        let terminal = wire::terminal_from_proto(report.terminal);
        if report.router_id.is_empty() || report.router_id == own_id {
            if report.first_token {
                router.mark_prefill_done(&report.request_id);
            }
            if report.output_tokens > 0 && router.tracks_output_tokens() {
                router.add_output_tokens(&report.request_id, u64::from(report.output_tokens));
            }
            let tracked = match terminal {
                Some(path) => router.free(&report.request_id, path),
                None => true,
            };
            return Ok(tracked);
        }
        // Routed by another replica that the caller could not reach: apply the change to the
        // copy replica sync gave this one, and pass it on to the rest.
        let kind = match (terminal, report.first_token) {
            (Some(path), _) => SyncKind::Free { path },
            (None, true) => SyncKind::MarkPrefillCompleted,
            (None, false) => return Ok(true),
        };
        let Some(worker) = router
            .with_core(|core, _| core.tracked_worker_of(&report.router_id, &report.request_id))
        else {
            return Ok(false);
        };
        let event = SyncEvent {
            router_id: report.router_id,
            request_id: report.request_id,
            worker,
            kind,
            forwarded_by: Some(own_id.to_string()),
        };
        router.apply_sync_event(&event);
        router.publish_sync(event);
        Ok(true)
    }

    /// Routes a generation and starts it through the model's seam (which retries on another
    /// worker when the chosen one cannot be reached: nothing has been streamed yet).
    async fn start_generate(
        &self,
        generate: pb::GenerateRequest,
        routed: pb::RoutedGenerateRequest,
        trace: Trace,
    ) -> Result<Generation, RouteError> {
        validate(&generate.model, &generate.request_id, &generate.token_ids)?;
        let model = self.model(&generate.model)?;
        let mut hints = wire::hints_from_proto(
            generate.routing.as_ref(),
            &routed.allowed_worker_ids,
            0,
            routed.config_override.as_ref(),
        );
        hints.cache_salt = (!routed.cache_salt.is_empty()).then_some(routed.cache_salt);
        let options = GenerateOptions {
            hints,
            prefix_cuts: kvmesh_runtime::prefix_cuts::cuts_from_proto(&routed.prefix_cuts).into(),
            response_timeout: None,
            wait: FirstResponseWait::None,
            trace,
        };
        model.seam.generate(generate, options).await
    }
}

/// The seam's responses as the caller sees them; a failure ends the stream with its status.
/// Dropping the stream (caller gone) frees the request as disconnected; `trace`, the replica's
/// span of the request, ends with the stream.
fn proxy(
    mut generation: Generation,
    trace: Trace,
) -> impl futures::Stream<Item = Result<pb::GenerateResponse, Status>> + Send + 'static {
    async_stream::stream! {
        while let Some(item) = generation.next().await {
            match item {
                Ok(response) => yield Ok(response),
                Err(error) => {
                    trace.fail(&error);
                    yield Err(error.to_status());
                    return;
                }
            }
        }
        trace.end();
    }
}

/// Locks a map that only plain inserts and removes touch: a panic elsewhere cannot leave it
/// half-updated, so a poisoned lock is still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

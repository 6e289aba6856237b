//! `kvmesh.v1.ChatProcessor`: one `Process` stream per chat request, relayed between the frontend
//! and the request's Python engine.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;
use kvmesh_core::ErrorCode;
use kvmesh_proto::v1::chat_processor_server::ChatProcessor;
use kvmesh_proto::v1::{
    CallRouteRequest, CallRouteResponse, ChunkMetrics, ListRoutesRequest, ListRoutesResponse,
    ProcessDown, ProcessError, ProcessUp, ResponseHeader, call_output, process_down, process_up,
};
use kvmesh_runtime::error::GrpcErrorCode;
use kvmesh_runtime::otel::{KeyValue, SpanKind, Trace};
use kvmesh_runtime::shutdown::{Inflight, InflightGuard};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::python::{HostEvent, PythonHost, ToPython};

/// The service: hands each stream and each route call to the interpreter.
pub struct ProcessorService {
    python: PythonHost,
    next_key: AtomicU64,
    inflight: Inflight,
    route_paths: Vec<String>,
}

impl ProcessorService {
    /// Serves the processor and the route extensions (at `route_paths`) loaded in `python`.
    pub fn new(python: PythonHost, route_paths: Vec<String>) -> Self {
        Self {
            python,
            next_key: AtomicU64::new(1),
            inflight: Inflight::new(),
            route_paths,
        }
    }

    /// Requests being served now (for the drain at shutdown).
    pub fn inflight(&self) -> Inflight {
        self.inflight.clone()
    }
}

/// Tells the engine its client is gone when the response stream is dropped before the end.
struct RequestGuard {
    python: PythonHost,
    key: u64,
    is_finished: bool,
    _inflight: InflightGuard,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if !self.is_finished {
            self.python.send(ToPython::Cancel { key: self.key });
        }
    }
}

type ProcessStream = Pin<Box<dyn Stream<Item = Result<ProcessDown, Status>> + Send>>;

fn down(kind: process_down::Kind) -> ProcessDown {
    ProcessDown { kind: Some(kind) }
}

fn metrics_of(json: &str) -> ChunkMetrics {
    let value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let field = |name: &str| {
        value
            .get(name)
            .and_then(serde_json::Value::as_u64)
            .map(|n| n.min(u64::from(u32::MAX)) as u32)
    };
    ChunkMetrics {
        input_tokens: field("input_tokens"),
        output_tokens: field("output_tokens"),
        chunk_tokens: field("chunk_tokens"),
        cached_tokens: field("cached_tokens"),
    }
}

/// Relays the frontend's worker output for `key` to the engine until the frontend's side ends.
async fn relay_outputs(python: PythonHost, key: u64, mut inbound: Streaming<ProcessUp>) {
    while let Ok(Some(message)) = inbound.message().await {
        let Some(process_up::Kind::Output(output)) = message.kind else {
            continue;
        };
        let call_id = output.call_id;
        let sent = match output.kind {
            Some(call_output::Kind::Response(response)) => python.send(ToPython::Output {
                key,
                call_id,
                json: convert::output_json(&response),
            }),
            Some(call_output::Kind::Error(error)) => python.send(ToPython::CallError {
                key,
                call_id,
                code: error.error_code,
                message: error.message,
            }),
            Some(call_output::Kind::End(_)) | None => {
                python.send(ToPython::CallEnd { key, call_id })
            }
        };
        if !sent {
            return;
        }
    }
}

#[tonic::async_trait]
impl ChatProcessor for ProcessorService {
    type ProcessStream = ProcessStream;

    async fn list_routes(
        &self,
        _request: Request<ListRoutesRequest>,
    ) -> Result<Response<ListRoutesResponse>, Status> {
        Ok(Response::new(ListRoutesResponse {
            paths: self.route_paths.clone(),
        }))
    }

    async fn call_route(
        &self,
        request: Request<CallRouteRequest>,
    ) -> Result<Response<CallRouteResponse>, Status> {
        let request = request.into_inner();
        let state = request.state.unwrap_or_default();
        let state_json = serde_json::json!({
            "ready": state.ready,
            "cancelled": state.cancelled,
            "models": state.models,
            "serving": state.serving,
        })
        .to_string();
        let (reply, answer) = tokio::sync::oneshot::channel();
        let _inflight = self.inflight.enter();
        if !self.python.send(ToPython::CallRoute {
            path: request.path,
            state_json,
            reply,
        }) {
            return Err(ErrorCode::Unavailable.to_status("the Python interpreter stopped"));
        }
        let (status, body) = answer
            .await
            .map_err(|_| ErrorCode::Internal.to_status("the route extension gave no answer"))?;
        Ok(Response::new(CallRouteResponse {
            status: u32::from(status),
            body_json: body.into(),
        }))
    }

    async fn process(
        &self,
        request: Request<Streaming<ProcessUp>>,
    ) -> Result<Response<ProcessStream>, Status> {
        // The host's hop of the request's trace: from the start to the Python engine's end,
        // each generate call it makes an event on it (docs/tracing.md).
        let span =
            Trace::from_metadata(request.metadata()).child("processor_process", SpanKind::Server);
        let mut inbound = request.into_inner();
        let start = match inbound.message().await? {
            Some(ProcessUp {
                kind: Some(process_up::Kind::Start(start)),
            }) => start,
            _ => {
                return Err(ErrorCode::InvalidArgument
                    .to_status("a Process stream starts with a ProcessStart message"));
            }
        };
        span.set_with(|| {
            vec![
                KeyValue::new("kvmesh.request_id", start.request_id.clone()),
                KeyValue::new("kvmesh.model", start.model.clone()),
            ]
        });
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let request_id = start.request_id.clone();
        let model = start.model.clone();
        if !self.python.send(ToPython::Submit {
            key,
            start,
            events: events_tx,
        }) {
            return Err(ErrorCode::Unavailable.to_status("the Python interpreter stopped"));
        }
        let mut guard = RequestGuard {
            python: self.python.clone(),
            key,
            is_finished: false,
            _inflight: self.inflight.enter(),
        };
        tokio::spawn(relay_outputs(self.python.clone(), key, inbound));
        let python = self.python.clone();
        let stream = async_stream::stream! {
            while let Some(event) = events.recv().await {
                let message = match event {
                    HostEvent::Chunk(json) => down(process_down::Kind::ChunkJson(json.into())),
                    HostEvent::Generate { call_id, json } => {
                        match convert::generate_call(call_id, &request_id, &model, &json) {
                            Ok(call) => {
                                span.event("generate_call");
                                down(process_down::Kind::Generate(call))
                            }
                            Err(message) => {
                                python.send(ToPython::CallError {
                                    key,
                                    call_id,
                                    code: ErrorCode::InvalidArgument.name().to_owned(),
                                    message,
                                });
                                continue;
                            }
                        }
                    }
                    HostEvent::Header { name, value } => {
                        down(process_down::Kind::Header(ResponseHeader { name, value }))
                    }
                    HostEvent::Metrics(json) => down(process_down::Kind::Metrics(metrics_of(&json))),
                    HostEvent::CancelCall(call_id) => down(process_down::Kind::CancelCall(call_id)),
                    HostEvent::Error { code, status, message } => {
                        guard.is_finished = true;
                        span.fail(&message);
                        yield Ok(down(process_down::Kind::Error(ProcessError {
                            error_code: code,
                            http_status: status,
                            message,
                        })));
                        break;
                    }
                    HostEvent::Done => {
                        guard.is_finished = true;
                        break;
                    }
                };
                yield Ok(message);
            }
            span.end();
            drop(guard);
        };
        Ok(Response::new(Box::pin(stream)))
    }
}

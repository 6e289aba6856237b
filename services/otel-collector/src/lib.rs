//! `kvmesh-otel-collector`: the repository's own OTLP trace receiver (docs/tracing.md). It takes
//! OTLP/gRPC `TraceService/Export` on `--otlp-port`, keeps the spans in memory (bounded by
//! `--max-spans`, oldest dropped first) and answers `GET /v1/traces/{trace_id}` and `GET /health`
//! on `--http-port`, so that tests and the compose mesh can check one request's trace without a
//! packaged collector.

pub mod store;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kvmesh_runtime::lifecycle::{Drain, GrpcServerSettings, ServiceLifecycle};
use kvmesh_runtime::telemetry::LogFormat;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tokio_util::sync::CancellationToken;

use crate::store::SpanStore;

/// The collector's flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "kvmesh-otel-collector", version, about)]
pub struct CollectorOpts {
    /// Address both servers bind.
    #[arg(long, env = "KVMESH_OTEL_COLLECTOR_HOST", default_value = "0.0.0.0")]
    pub host: IpAddr,
    /// Port of the OTLP/gRPC receiver (0: any free port).
    #[arg(long, env = "KVMESH_OTEL_COLLECTOR_OTLP_PORT", default_value_t = 4317)]
    pub otlp_port: u16,
    /// Port of the HTTP query API (`/v1/traces/{trace_id}`, `/health`; 0: any free port).
    #[arg(long, env = "KVMESH_OTEL_COLLECTOR_HTTP_PORT", default_value_t = 4318)]
    pub http_port: u16,
    /// Spans kept; the oldest are dropped past it.
    #[arg(
        long,
        env = "KVMESH_OTEL_COLLECTOR_MAX_SPANS",
        default_value_t = 100_000
    )]
    pub max_spans: usize,
    /// How log lines are written.
    #[arg(long, env = "KVMESH_LOG_FORMAT", value_enum, default_value = "human")]
    pub log_format: LogFormat,
}

/// Largest OTLP export accepted (the SDK's batches are far smaller).
const MAX_EXPORT_BYTES: usize = 16 * 1024 * 1024;

/// Serves the receiver and the query API until `shutdown`.
pub async fn run(opts: CollectorOpts, shutdown: CancellationToken) -> anyhow::Result<()> {
    let store = Arc::new(SpanStore::new(opts.max_spans));
    let otlp = tokio::net::TcpListener::bind(SocketAddr::new(opts.host, opts.otlp_port))
        .await
        .with_context(|| format!("--otlp-port {}", opts.otlp_port))?;
    let http = tokio::net::TcpListener::bind(SocketAddr::new(opts.host, opts.http_port))
        .await
        .with_context(|| format!("--http-port {}", opts.http_port))?;
    tracing::info!(
        otlp = %otlp.local_addr()?,
        http = %http.local_addr()?,
        "collector listening"
    );
    let mut lifecycle = ServiceLifecycle::new("otel-collector");
    let receiver = TraceServiceServer::new(Receiver {
        store: Arc::clone(&store),
    })
    .max_decoding_message_size(MAX_EXPORT_BYTES);
    let routes = tonic::service::Routes::new(receiver);
    lifecycle.serve_grpc_with(otlp, routes, &GrpcServerSettings::default());
    let app = axum::Router::new()
        .route("/v1/traces/{trace_id}", axum::routing::get(get_trace))
        .route("/health", axum::routing::get(health))
        .with_state(store);
    let stop = lifecycle.stop_token();
    lifecycle.spawn(async move {
        axum::serve(http, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    lifecycle.run(&shutdown, Drain::NONE, || {}).await?;
    Ok(())
}

struct Receiver {
    store: Arc<SpanStore>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.store.add(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn get_trace(State(store): State<Arc<SpanStore>>, Path(trace_id): Path<String>) -> Response {
    let trace_id = trace_id.to_ascii_lowercase();
    if trace_id.len() != 32 || !trace_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        let body = serde_json::json!({
            "error": format!("trace id {trace_id:?} is not 32 hex digits"),
        });
        return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
    }
    axum::Json(serde_json::json!({ "spans": store.trace(&trace_id) })).into_response()
}

async fn health(State(store): State<Arc<SpanStore>>) -> Response {
    axum::Json(serde_json::json!({
        "status": "ok",
        "spans_received": store.num_received(),
    }))
    .into_response()
}

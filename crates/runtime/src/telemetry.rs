//! Logging and metrics set-up shared by every binary.

use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the global tracing subscriber once. The level comes from `DYN_LOG`, else `RUST_LOG`,
/// else `info`. `DYN_LOGGING_JSONL` truthy forces JSON lines, as in Dynamo.
pub fn init_tracing(format: LogFormat) {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let filter = std::env::var("DYN_LOG")
            .ok()
            .or_else(|| std::env::var("RUST_LOG").ok())
            .and_then(|spec| EnvFilter::try_new(spec).ok())
            .unwrap_or_else(|| EnvFilter::new("info"));
        let json = format == LogFormat::Json
            || std::env::var("DYN_LOGGING_JSONL")
                .map(|v| crate::config::is_truthy(&v))
                .unwrap_or(false);
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_span_events(FmtSpan::NONE)
            .with_writer(std::io::stderr);
        let result = if json {
            builder.json().flatten_event(true).try_init()
        } else {
            builder
                .with_ansi(std::env::var_os("NO_COLOR").is_none())
                .try_init()
        };
        if let Err(error) = result {
            eprintln!("tracing already installed: {error}");
        }
    });
}

/// Sets up a process's telemetry once: log lines ([`init_tracing`]) and, when the `OTEL_*`
/// environment turns it on, span export as `service` ([`crate::otel::init`]). Must run inside
/// the Tokio runtime. Keep the returned guard until the process ends: dropping it flushes the
/// spans not exported yet. A tracing setting this build cannot honour exits at start.
pub fn init(format: LogFormat, service: &str) -> Option<crate::otel::OtelGuard> {
    init_tracing(format);
    match crate::otel::init(service) {
        Ok(guard) => guard,
        Err(message) => crate::config::exit_config_error(&message),
    }
}

/// Renders a Prometheus registry in the text exposition format.
pub fn encode_metrics(registry: &prometheus::Registry) -> String {
    use prometheus::Encoder;
    let mut buffer = Vec::with_capacity(8 * 1024);
    let encoder = prometheus::TextEncoder::new();
    if let Err(error) = encoder.encode(&registry.gather(), &mut buffer) {
        tracing::warn!(%error, "metrics encoding failed");
    }
    String::from_utf8(buffer).unwrap_or_default()
}

/// Serves Prometheus `GET /metrics` on `listener` until `shutdown`, answering with what `render`
/// returns (it may refresh gauges first), and with `health` also `GET /health` (200 only while
/// the service serves: [`crate::lifecycle::health_response`]) and `GET /live` (200 while the
/// process runs). The one metrics server of every kvmesh process that has no HTTP edge of its
/// own (the frontend serves these beside its API); container and Kubernetes probes use it.
pub async fn serve_metrics<F, Fut>(
    listener: tokio::net::TcpListener,
    render: F,
    health: Option<crate::lifecycle::ServiceHealth>,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()>
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = String> + Send + 'static,
{
    let mut app = axum::Router::new().route("/metrics", axum::routing::get(render));
    if let Some(health) = health {
        app = app
            .route(
                "/health",
                axum::routing::get(move || crate::lifecycle::health_response(health.clone())),
            )
            .route(
                "/live",
                axum::routing::get(|| async { axum::Json(serde_json::json!({"status": "live"})) }),
            );
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

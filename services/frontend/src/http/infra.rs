//! Infrastructure routes: models list, health, liveness, metrics, and the 404 fallback.

use std::sync::Arc;

use axum::extract::{OriginalUri, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kvmesh_core::prefix::PrefixStats;
use serde_json::json;

use super::AppState;
use crate::error::FrontendError;

/// `GET /v1/models`: ready models only.
pub async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    let table = state.models.load();
    let mut names: Vec<_> = table.values().filter(|entry| entry.is_ready()).collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let data: Vec<_> = names
        .iter()
        .map(|entry| {
            json!({"id": entry.name, "object": "model", "created": entry.created, "owned_by": "kvmesh"})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /health`: 200 when at least one model is ready; `degraded` (still 200) with its reasons
/// while the discovery registration is lost or unreachable or the event plane is down.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let report = state.dependencies.report();
    let degraded = report.reasons();
    let table = state.models.load();
    let ready: Vec<&str> = table
        .values()
        .filter(|entry| entry.is_ready())
        .map(|entry| entry.name.as_str())
        .collect();
    let instances: usize = table
        .values()
        .map(|entry| entry.routing.workers().len())
        .sum();
    if ready.is_empty() || state.draining.load(std::sync::atomic::Ordering::Acquire) {
        let mut body = json!({"status": "unhealthy", "models": ready});
        if !degraded.is_empty() {
            body["degraded"] = json!(degraded);
        }
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
    } else if !degraded.is_empty() {
        axum::Json(json!({"status": "degraded", "models": ready, "num_instances": instances, "degraded": degraded}))
            .into_response()
    } else {
        axum::Json(json!({"status": "healthy", "models": ready, "num_instances": instances}))
            .into_response()
    }
}

/// `GET /live`: 200 while the process runs.
pub async fn live() -> Response {
    axum::Json(json!({"status": "live"})).into_response()
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let models = state.models.load();
    let pending = models.values().map(|entry| entry.router.queue_len()).sum();
    state.metrics.set_queue_pending(pending);
    for (name, entry) in models.iter() {
        state.metrics.ejection.sample(name, &entry.router);
        state.metrics.kv_weights.sample(name, &entry.router);
    }
    let block_hashes = models
        .values()
        .filter_map(|entry| entry.router.hash_cache_stats())
        .fold(PrefixStats::default(), |sum, stats| sum + stats);
    state.preprocess.publish_cache_stats(block_hashes);
    state
        .dependency_metrics
        .observe(&state.dependencies.report());
    let text = kvmesh_runtime::telemetry::encode_metrics(&state.metrics.registry);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Any other path: 404 with the OpenAI error body.
pub async fn not_found(State(state): State<Arc<AppState>>, uri: OriginalUri) -> Response {
    state.error_response(FrontendError::RouteNotFound(uri.path().to_string()))
}

/// 405 as an OpenAI error, for a route called with a method it does not take (axum adds the
/// `Allow` header).
pub async fn method_not_allowed(
    State(state): State<Arc<AppState>>,
    method: axum::http::Method,
    uri: OriginalUri,
) -> Response {
    state.error_response(FrontendError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    })
}

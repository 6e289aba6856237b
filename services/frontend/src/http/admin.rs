//! `GET`/`POST /busy_threshold` (docs/routing.md, "Busy detection and overload"): read and
//! change each model's busy thresholds at run time. With remote router replicas in use the change
//! goes to every replica as well.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use kvmesh_routing::BusyThresholds;
use serde_json::{Map, Value, json};

use super::{AppState, body_bytes, parse_json};
use crate::error::FrontendError;
use crate::models::ModelEntry;

/// `GET /busy_threshold`: `{"thresholds": [{model, …three thresholds}]}`, sorted by model.
pub async fn get_busy_thresholds(State(state): State<Arc<AppState>>) -> Response {
    let table = state.models.load();
    let mut entries: Vec<&Arc<ModelEntry>> = table.values().collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut thresholds = Vec::with_capacity(entries.len());
    for entry in entries {
        let value = entry.routing.decider().busy_thresholds().await;
        thresholds.push(entry_json(&entry.name, &value));
    }
    Json(json!({ "thresholds": thresholds })).into_response()
}

/// `POST /busy_threshold`: `{"model", …any of the three}`; a number turns that check on, `null`
/// turns it off, an absent field keeps its value. 404 for a model not discovered; 415 for a body
/// not sent as `application/json`, which a cross-site HTML form cannot send.
pub async fn set_busy_threshold(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if !is_json(&headers) {
        return state.error_response(FrontendError::UnsupportedMediaType(
            "POST /busy_threshold takes a body with content-type application/json".into(),
        ));
    }
    match set(&state, body).await {
        Ok(value) => Json(value).into_response(),
        Err(error) => state.error_response(error),
    }
}

async fn set(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Value, FrontendError> {
    let body = body_bytes(state, body)?;
    let request: Map<String, Value> = parse_json(&body)?;
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| FrontendError::invalid("model is required", Some("model")))?;
    let entry = state
        .models
        .load()
        .get(model)
        .cloned()
        .ok_or_else(|| FrontendError::ModelNotFound(model.to_string()))?;
    let mut value = entry.router.busy_thresholds();
    if let Some(update) = fraction(&request, "active_decode_blocks_threshold")? {
        value.active_decode_blocks_threshold = update;
    }
    if let Some(update) = tokens(&request, "active_prefill_tokens_threshold")? {
        value.active_prefill_tokens_threshold = update;
    }
    if let Some(update) = fraction(&request, "active_prefill_tokens_threshold_frac")? {
        value.active_prefill_tokens_threshold_frac = update;
    }
    value
        .validate()
        .map_err(|error| FrontendError::invalid(error.to_string(), None))?;
    entry.routing.decider().set_busy_thresholds(value).await;
    tracing::info!(model = %entry.name, thresholds = ?value, "busy thresholds changed");
    Ok(entry_json(&entry.name, &value))
}

/// Whether the request's `content-type` is `application/json` (parameters such as `charset`
/// allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

fn entry_json(model: &str, value: &BusyThresholds) -> Value {
    json!({
        "model": model,
        "active_decode_blocks_threshold": value.active_decode_blocks_threshold,
        "active_prefill_tokens_threshold": value.active_prefill_tokens_threshold,
        "active_prefill_tokens_threshold_frac": value.active_prefill_tokens_threshold_frac,
    })
}

/// `None`: absent (keep); `Some(None)`: null (off); `Some(Some(x))`: a non-negative number.
fn fraction(
    request: &Map<String, Value>,
    name: &str,
) -> Result<Option<Option<f64>>, FrontendError> {
    match request.get(name) {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(value) => value
            .as_f64()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .map(|x| Some(Some(x)))
            .ok_or_else(|| {
                FrontendError::invalid(
                    format!("{name} must be a non-negative number or null"),
                    Some(name),
                )
            }),
    }
}

fn tokens(request: &Map<String, Value>, name: &str) -> Result<Option<Option<u64>>, FrontendError> {
    match request.get(name) {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(value) => value.as_u64().map(|x| Some(Some(x))).ok_or_else(|| {
            FrontendError::invalid(
                format!("{name} must be a non-negative integer or null"),
                Some(name),
            )
        }),
    }
}

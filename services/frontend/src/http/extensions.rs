//! `GET` of a route extension's path: the handler runs on a processor host
//! ([`crate::processor::RouteExtensions`]) with this frontend's serving state, and its status and
//! JSON body are the answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{OriginalUri, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kvmesh_proto::v1::FrontendState;

use super::AppState;

/// What a handler's `FrontendExtensionContext` answers from: the ready models, every model and
/// whether the frontend is shutting down.
fn frontend_state(state: &AppState) -> FrontendState {
    let table = state.models.load();
    let models: Vec<String> = table.values().map(|entry| entry.name.clone()).collect();
    let serving: Vec<String> = table
        .values()
        .filter(|entry| entry.is_ready())
        .map(|entry| entry.name.clone())
        .collect();
    let cancelled = state.draining.load(Ordering::Acquire);
    FrontendState {
        ready: !serving.is_empty() && !cancelled,
        cancelled,
        models,
        serving,
    }
}

/// Answers one route extension call.
pub(crate) async fn serve(State(state): State<Arc<AppState>>, uri: OriginalUri) -> Response {
    let Some(extensions) = &state.extensions else {
        return super::infra::not_found(State(state.clone()), uri).await;
    };
    match extensions.call(uri.path(), frontend_state(&state)).await {
        Ok(answer) => {
            let status = u16::try_from(answer.status)
                .ok()
                .and_then(|status| StatusCode::from_u16(status).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                answer.body_json,
            )
                .into_response()
        }
        Err(error) => state.error_response(error),
    }
}

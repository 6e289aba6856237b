//! The axum application: routes, shared state, body limits and error mapping.

mod admin;
mod anthropic;
mod body;
pub(crate) mod chat;
mod completions;
mod embeddings;
pub(crate) mod endpoint;
mod extensions;
pub mod fuzzing;
pub use body::BodyBudget;
pub(crate) use body::read_body;
pub(crate) use endpoint::ResponseHeaders;
mod infra;
pub(crate) mod openai_shared;
mod openapi;
pub mod request_metrics;
mod responses;
pub mod sse;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router as AxumRouter;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use kvmesh_runtime::shutdown::Inflight;

use crate::error::FrontendError;
use crate::generate::FirstResponseWait;
use crate::metrics::FrontendMetrics;
use crate::models::ModelTable;

/// Request-independent settings of the HTTP edge.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Body limit in MiB.
    pub body_limit_mb: u64,
    /// Status for "every worker busy".
    pub overload_status: u16,
    /// SSE keep-alive comment interval.
    pub sse_keep_alive: Option<Duration>,
    /// Deadline for the worker's first response.
    pub backend_stream_timeout: Option<Duration>,
    /// How long a stream waits for the worker's first response before committing (`None`:
    /// commits once the worker accepted the request).
    pub pre_commit_peek: Option<Duration>,
    /// `DYN_DISABLE_FRONTEND_NVEXT`: request `nvext`, routing and priority headers are ignored.
    pub disable_nvext: bool,
    /// `DYN_DISABLE_FRONTEND_ADMIN_API`: `/busy_threshold` is not served (404).
    pub disable_admin_api: bool,
    /// `--enable-anthropic-api`: `/v1/messages` and `/v1/messages/count_tokens` are served.
    pub anthropic_api: bool,
    /// `--strip-anthropic-preamble`: Claude Code's billing line leaves the Messages system
    /// prompt before it is rendered.
    pub strip_anthropic_preamble: bool,
    /// `--reasoning-field-name`: the chat field that carries parsed reasoning.
    pub reasoning_field: crate::opts::ReasoningField,
    /// `DYN_ENABLE_FORCE_INCLUDE_USAGE`: streamed chat and completions end with a usage chunk
    /// whether or not the request asked for one (`stream_options.include_usage`).
    pub force_include_usage: bool,
}

/// State shared by every handler.
pub struct AppState {
    /// The models and their workers.
    pub models: ModelTable,
    /// Metrics.
    pub metrics: FrontendMetrics,
    /// Tokenizer engine, prefix cache, preprocessing pool and stage timings.
    pub preprocess: Arc<crate::preprocess::Preprocess>,
    /// Settings.
    pub settings: HttpSettings,
    /// In-flight request counter, drained on shutdown.
    pub inflight: Inflight,
    /// Set once shutdown begins: new inference requests get 503.
    pub draining: AtomicBool,
    /// Slots for inference requests in flight (`--rejection-frontend-*`; `None`: no limit).
    pub admission: Option<Arc<tokio::sync::Semaphore>>,
    /// Bytes of request bodies held at once (`--http-body-budget-mb`).
    pub body_budget: BodyBudget,
    /// The hosts of the custom chat processor (`--dyn-chat-processor`), when one is configured.
    pub processor: Option<crate::processor::ProcessorHosts>,
    /// The route extensions (`--frontend-route-extension`), when some are configured.
    pub extensions: Option<crate::processor::RouteExtensions>,
    /// The keys inference needs (`--http-api-keys-file`); `None`: inference is open.
    pub api_keys: Option<Arc<crate::auth::Keys>>,
    /// The keys `/busy_threshold` needs (`--http-admin-keys-file`); `None`: it is open.
    pub admin_keys: Option<Arc<crate::auth::Keys>>,
    /// Discovery and the event plane, for `/health` and their metrics.
    pub dependencies: kvmesh_runtime::health::Dependencies,
    /// `kvmesh_discovery_*` and `kvmesh_event_plane_*` gauges.
    pub dependency_metrics: kvmesh_runtime::health::DependencyMetrics,
}

impl AppState {
    /// Rejects new work while draining.
    pub fn check_accepting(&self) -> Result<(), FrontendError> {
        if self.draining.load(Ordering::Acquire) {
            Err(FrontendError::Draining)
        } else {
            Ok(())
        }
    }

    /// Maps an error to its response with this frontend's overload status.
    pub fn error_response(&self, error: FrontendError) -> Response {
        error.into_response_with(self.settings.overload_status)
    }
}

/// Builds the application with every route of this release, `/openapi.json` describing them
/// at the paths they are served at, and Swagger UI at `/docs`.
pub fn app(state: Arc<AppState>) -> AxumRouter {
    let body_limit = usize::try_from(state.settings.body_limit_mb.saturating_mul(1024 * 1024))
        .unwrap_or(usize::MAX);
    let paths = route_paths(&state.settings);
    let inference = AxumRouter::new()
        .route(&paths.chat, post(endpoint::serve::<chat::ChatCompletions>))
        .route(
            &paths.completions,
            post(endpoint::serve::<completions::Completions>),
        )
        .route(
            &paths.embeddings,
            post(endpoint::serve::<embeddings::Embeddings>),
        )
        .route(
            &paths.responses,
            post(endpoint::serve::<responses::Responses>),
        );
    let inference = guarded(
        inference,
        &state,
        state.api_keys.is_some(),
        crate::auth::require_api_key,
    );
    let routes = inference
        .merge(anthropic_routes(paths.messages.as_deref(), &state))
        .merge(admin_routes(&state))
        .merge(extension_routes(&state))
        .layer(DefaultBodyLimit::max(body_limit));
    let docs =
        utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", openapi::document(&paths));
    with_fallbacks(routes.merge(infra_routes(&paths)).merge(docs), state)
}

/// Where each route is served: Dynamo's defaults unless a `DYN_HTTP_SVC_*_PATH` override says
/// otherwise.
fn route_paths(settings: &HttpSettings) -> openapi::RoutePaths {
    paths_for(settings.anthropic_api, !settings.disable_admin_api)
}

/// Every path the frontend serves itself, which a route extension may not take: the routes
/// (after their overrides), the OpenAPI document, its UI and the admin API.
pub fn reserved_paths(anthropic_api: bool) -> Vec<String> {
    let paths = paths_for(anthropic_api, true);
    let mut reserved = vec![
        paths.chat,
        paths.completions,
        paths.embeddings,
        paths.responses,
        paths.models,
        paths.health,
        paths.live,
        paths.metrics,
        "/openapi.json".into(),
        "/docs".into(),
        "/docs/".into(),
        "/busy_threshold".into(),
    ];
    if let Some(messages) = paths.messages {
        reserved.push(format!("{}/count_tokens", messages.trim_end_matches('/')));
        reserved.push(messages);
    }
    reserved
}

fn paths_for(anthropic_api: bool, admin: bool) -> openapi::RoutePaths {
    openapi::RoutePaths {
        chat: route_path("DYN_HTTP_SVC_CHAT_PATH", "/v1/chat/completions"),
        completions: route_path("DYN_HTTP_SVC_CMP_PATH", "/v1/completions"),
        embeddings: route_path("DYN_HTTP_SVC_EMB_PATH", "/v1/embeddings"),
        responses: route_path("DYN_HTTP_SVC_RESPONSES_PATH", "/v1/responses"),
        messages: anthropic_api.then(|| route_path("DYN_HTTP_SVC_ANTHROPIC_PATH", "/v1/messages")),
        models: route_path("DYN_HTTP_SVC_MODELS_PATH", "/v1/models"),
        health: route_path("DYN_HTTP_SVC_HEALTH_PATH", "/health"),
        live: route_path("DYN_HTTP_SVC_LIVE_PATH", "/live"),
        metrics: route_path("DYN_HTTP_SVC_METRICS_PATH", "/metrics"),
        admin,
    }
}

/// The side HTTP server of `--kserve-grpc-server` mode: `/metrics`, `/health`, `/live` and
/// `/v1/models`, no inference routes.
pub fn side_app(state: Arc<AppState>) -> AxumRouter {
    let paths = route_paths(&state.settings);
    with_fallbacks(infra_routes(&paths), state)
}

/// `/v1/models`, `/health`, `/live` and `/metrics`, on every HTTP server the frontend runs.
fn infra_routes(paths: &openapi::RoutePaths) -> AxumRouter<Arc<AppState>> {
    AxumRouter::new()
        .route(&paths.models, get(infra::list_models))
        .route(&paths.health, get(infra::health))
        .route(&paths.live, get(infra::live))
        .route(&paths.metrics, get(infra::metrics))
}

/// The OpenAI-shaped 404 and 405 answers, then the state.
fn with_fallbacks(routes: AxumRouter<Arc<AppState>>, state: Arc<AppState>) -> AxumRouter {
    routes
        .fallback(infra::not_found)
        .method_not_allowed_fallback(infra::method_not_allowed)
        .with_state(state)
}

/// `/v1/messages` and its `count_tokens`, with `--enable-anthropic-api`.
fn anthropic_routes(messages: Option<&str>, state: &Arc<AppState>) -> AxumRouter<Arc<AppState>> {
    let Some(messages) = messages else {
        return AxumRouter::new();
    };
    let routes = AxumRouter::new()
        .route(messages, post(endpoint::serve::<anthropic::Messages>))
        .route(
            &format!("{}/count_tokens", messages.trim_end_matches('/')),
            post(anthropic::count_tokens),
        );
    guarded(
        routes,
        state,
        state.api_keys.is_some(),
        crate::auth::require_anthropic_key,
    )
}

/// A key check in front of `routes` (matched routes only, so a 404 stays a 404), when `is_on`.
fn guarded<F, Fut>(
    routes: AxumRouter<Arc<AppState>>,
    state: &Arc<AppState>,
    is_on: bool,
    check: F,
) -> AxumRouter<Arc<AppState>>
where
    F: Fn(
            axum::extract::State<Arc<AppState>>,
            axum::extract::Request,
            axum::middleware::Next,
        ) -> Fut
        + Clone
        + Send
        + Sync
        + 'static,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    if is_on {
        routes.route_layer(axum::middleware::from_fn_with_state(state.clone(), check))
    } else {
        routes
    }
}

/// The route extensions' paths (checked against [`reserved_paths`] when they were loaded).
fn extension_routes(state: &AppState) -> AxumRouter<Arc<AppState>> {
    let Some(extensions) = &state.extensions else {
        return AxumRouter::new();
    };
    extensions
        .paths()
        .iter()
        .fold(AxumRouter::new(), |routes, path| {
            routes.route(path, get(extensions::serve))
        })
}

/// `GET`/`POST /busy_threshold`, unless the admin API is disabled; with admin keys, behind them.
fn admin_routes(state: &Arc<AppState>) -> AxumRouter<Arc<AppState>> {
    if state.settings.disable_admin_api {
        return AxumRouter::new();
    }
    let routes = AxumRouter::new().route(
        "/busy_threshold",
        get(admin::get_busy_thresholds).post(admin::set_busy_threshold),
    );
    guarded(
        routes,
        state,
        state.admin_keys.is_some(),
        crate::auth::require_admin_key,
    )
}

/// A route path from `{name}_ENV` or `{name}`, else the default (Dynamo's route overrides).
fn route_path(name: &str, default: &str) -> String {
    std::env::var(format!("{name}_ENV"))
        .or_else(|_| std::env::var(name))
        .ok()
        .filter(|path| path.starts_with('/'))
        .unwrap_or_else(|| default.to_string())
}

/// Turns the raw body into bytes, mapping an over-limit body to 413.
pub(crate) fn body_bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, FrontendError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            FrontendError::PayloadTooLarge {
                limit_mb: state.settings.body_limit_mb,
            }
        } else {
            FrontendError::invalid(format!("cannot read request body: {rejection}"), None)
        }
    })
}

/// Parses a JSON body into `T`, with a 400 that says what is wrong.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, FrontendError> {
    serde_json::from_slice(body).map_err(|error| {
        let message = match error.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("request body is not valid JSON: {error}")
            }
            _ => format!("invalid request: {error}"),
        };
        FrontendError::invalid(message, None)
    })
}

/// The request id: a valid client `x-request-id`, else a new UUID.
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// How long a request waits for the worker's first response before its response commits:
/// unary responses are read whole; streams wait the pre-commit peek, if any.
pub(crate) fn first_response_wait(settings: &HttpSettings, stream: bool) -> FirstResponseWait {
    match (stream, settings.pre_commit_peek) {
        (false, _) => FirstResponseWait::Full,
        (true, Some(peek)) => FirstResponseWait::UpTo(peek),
        (true, None) => FirstResponseWait::None,
    }
}

/// Routing pins, priorities, the session and the cache salt from the request's `nvext` and body
/// `cache_salt`, then its headers, which win (docs/routing.md, "Pins and routing headers"); with
/// `DYN_DISABLE_FRONTEND_NVEXT` only the session and tenant headers and the body salt count. A
/// malformed value is a 400 naming the field or header.
pub(crate) fn routing_hints(
    settings: &HttpSettings,
    headers: &HeaderMap,
    nvext: Option<&serde_json::Value>,
    cache_salt: Option<&str>,
) -> Result<kvmesh_routing::RoutingHints, FrontendError> {
    let mut hints = kvmesh_routing::RoutingHints {
        cache_salt: cache_salt
            .filter(|salt| !salt.is_empty())
            .map(str::to_string),
        ..Default::default()
    };
    if let Some(nvext) = nvext.filter(|_| !settings.disable_nvext) {
        crate::hints::apply_nvext(&mut hints, nvext)?;
    }
    crate::hints::apply_headers(
        &mut hints,
        headers
            .iter()
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?))),
        settings.disable_nvext,
    )?;
    Ok(hints)
}

/// Drops a request's `nvext` under `DYN_DISABLE_FRONTEND_NVEXT`, so every field in it (routing,
/// guided decoding, the thinking cap, response fields) is ignored alike.
pub(crate) fn drop_disabled_nvext(settings: &HttpSettings, nvext: &mut Option<serde_json::Value>) {
    if settings.disable_nvext {
        *nvext = None;
    }
}

/// Adds `x-request-id` to a response.
pub(crate) fn with_request_id(mut response: Response, request_id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        response
            .headers_mut()
            .insert(HeaderName::from_static("x-request-id"), value);
    }
    response
}

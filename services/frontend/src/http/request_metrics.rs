//! What the edge counts of each request: its outcome, duration, tokens and time in flight, from
//! admission (or from the failure before it) to its end.

use std::sync::Arc;
use std::time::Instant;

use kvmesh_runtime::otel::{KeyValue, SpanKind, Trace};
use kvmesh_runtime::shutdown::InflightGuard;

use super::AppState;
use crate::error::FrontendError;
use crate::models::ModelEntry;

/// The `model` label of requests that fail before they name a served model: client-chosen names
/// must not become label values.
pub const UNKNOWN_MODEL_LABEL: &str = "unknown";

/// What an endpoint knows of a request before its [`RequestScope`] exists, so that failures
/// before it (bad JSON, an unknown model, an unsupported option) are counted too.
#[derive(Debug, Default)]
pub struct EarlyRequest {
    /// The requested model, once the body parsed and the model is served.
    pub model: Option<String>,
    /// Whether the body asked for a stream.
    pub stream: bool,
    /// Set once a scope took over the counting.
    pub is_scoped: bool,
}

impl EarlyRequest {
    /// Notes the parsed request's model (when served) and stream flag.
    pub fn parsed(&mut self, state: &AppState, model: &str, stream: bool) {
        self.stream = stream;
        self.model = state
            .models
            .load()
            .get(model)
            .map(|entry| entry.name.clone());
    }

    /// Counts a failure that happened before the request's scope existed.
    pub fn count_failure(&self, state: &AppState, endpoint: &'static str, error: &FrontendError) {
        if self.is_scoped {
            return;
        }
        state.metrics.count_request(
            self.model.as_deref().unwrap_or(UNKNOWN_MODEL_LABEL),
            endpoint,
            self.stream,
            Some(error.code().metric_label()),
        );
    }
}

/// Tracks one request from admission to its end: in-flight counts, duration, outcome metrics,
/// and a client that went away before the end (the guard dropped unfinished).
pub struct RequestScope {
    state: Arc<AppState>,
    model: Arc<ModelEntry>,
    endpoint: &'static str,
    stream: bool,
    started: Instant,
    finished: bool,
    /// The frontend's span of the request (docs/tracing.md); it ends with the request.
    trace: Trace,
    _inflight: InflightGuard,
    _admitted: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl RequestScope {
    /// Admits a request for `model` and starts tracking it; past the frontend's limit of
    /// requests in flight (the `--rejection-frontend-*` flags) it is refused as overloaded and
    /// counted as a rejection.
    pub fn new(
        state: &Arc<AppState>,
        model: &Arc<ModelEntry>,
        endpoint: &'static str,
        stream: bool,
    ) -> Result<Self, FrontendError> {
        let admitted = match &state.admission {
            None => None,
            Some(slots) => match slots.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let error = FrontendError::Route(kvmesh_routing::RouteError::Overloaded);
                    state.metrics.count_request(
                        &model.name,
                        endpoint,
                        stream,
                        Some(error.code().metric_label()),
                    );
                    state.metrics.count_rejection(&model.name, endpoint);
                    return Err(error);
                }
            },
        };
        model.metrics.inflight.inc();
        Ok(Self {
            _admitted: admitted,
            _inflight: state.inflight.enter(),
            state: state.clone(),
            model: model.clone(),
            endpoint,
            stream,
            started: Instant::now(),
            finished: false,
            trace: Trace::off(),
        })
    }

    /// Starts the request's span under `parent` (the client's `traceparent`, from
    /// [`Trace::from_http`] or [`Trace::from_metadata`]). Off (and free) while tracing is off.
    pub fn start_trace(&mut self, parent: Trace) -> &Trace {
        self.trace = parent.child(self.endpoint, SpanKind::Server);
        self.trace
            .set_with(|| vec![KeyValue::new("kvmesh.model", self.model.name.clone())]);
        &self.trace
    }

    /// The request's span, as [`RequestScope::start_trace`] made it.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Records the end of the request.
    pub fn finish(&mut self, error: Option<&FrontendError>) {
        if self.finished {
            return;
        }
        self.finished = true;
        if let Some(error) = error {
            self.trace.fail(error);
        }
        self.trace.end();
        self.state.metrics.count_request(
            &self.model.name,
            self.endpoint,
            self.stream,
            error.map(|e| e.code().metric_label()),
        );
        if matches!(
            error,
            Some(FrontendError::Route(kvmesh_routing::RouteError::Overloaded))
        ) {
            self.state
                .metrics
                .count_rejection(&self.model.name, self.endpoint);
        }
        self.model
            .metrics
            .duration
            .observe(self.started.elapsed().as_secs_f64());
    }

    /// Records the token counts of a finished request.
    pub fn observe_tokens(&self, prompt: u32, completion: u32, cached: u32) {
        let metrics = &self.model.metrics;
        metrics.input_tokens.observe(f64::from(prompt));
        metrics.output_tokens.observe(f64::from(completion));
        metrics.output_tokens_total.inc_by(u64::from(completion));
        metrics.cached_tokens.observe(f64::from(cached));
        metrics.router_input_tokens.observe(f64::from(prompt));
        metrics.router_output_tokens.observe(f64::from(completion));
        if prompt > 0 {
            let hit_rate = f64::from(cached.min(prompt)) / f64::from(prompt);
            metrics.kv_hit_rate.observe(hit_rate);
            metrics.router_kv_hit_rate.observe(hit_rate);
        }
    }
}

impl Drop for RequestScope {
    fn drop(&mut self) {
        self.model.metrics.inflight.dec();
        if !self.finished {
            self.model.metrics.disconnected.inc();
            self.model.metrics.cancellations.inc();
            self.finished = true;
            self.state.metrics.count_request(
                &self.model.name,
                self.endpoint,
                self.stream,
                Some(kvmesh_runtime::ErrorCode::Cancelled.metric_label()),
            );
        }
    }
}
